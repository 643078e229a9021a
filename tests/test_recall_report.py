"""eval.recall (fig2 / cliff / hybrid / lm / ablation) and eval.quality's speed= join, on synthetic train.py run
folders.

The folders are laid out as train.py writes them: ``.hydra/config.yaml`` (Hydra's composed config, interpolations
unresolved), ``csv/metrics.csv`` (Lightning's CSVLogger: training rows, validation rows) and ``final_metrics.json``
(``harness.runs.write_final_metrics``); a multirun job also has ``.hydra/overrides.yaml`` (its overrides) and
``.hydra/hydra.yaml`` (``hydra.runtime.choices``: the option picked in each config group).
"""

import csv
import math
import os
import shutil

import pytest
import yaml

from harness.runs import write_final_metrics
from eval import recall

COLUMNS = ["epoch", "model/n_params", "perf/peak_mem_mb", "perf/step_time_s", "perf/tokens_per_s", "step",
           "train/loss", "val/acc", "val/acc_far", "val/acc_near", "val/frac_far", "val/bpb", "val/loss"]


def write_run(root, name, *, data="mqar", seq_len=64, d_model=64, lr=1e-3, attention="flash", kind=None,
              feature_map=None, window=None, layers=None, n_layer=2, vals=(), final=None, batch_size=32,
              max_steps=100, n_params=1000, seed=0, path="data/tinyshakespeare/input.txt", hparams=False,
              vocab_size=128, overrides=None, choices=None):
    """One run folder; ``vals``: [(step, {metric: value})] validation rows (metric names without ``val/``) after
    ``step`` optimizer steps, logged as Lightning logs them: at its 0-based logging step ``step - 1``, beside the
    training row of that step;
    ``overrides`` (a list) / ``choices`` (a dict) written to ``.hydra/overrides.yaml`` / ``.hydra/hydra.yaml``."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / "csv").mkdir()
    att = {"_target_": "attn_zoo.make_spec", "kind": kind or ("flash" if attention in ("flash", "gqa", "mqa")
                                                              else attention), "name": attention, "causal": True}
    if feature_map:
        att["feature_map"] = feature_map
    if window is not None:
        att["window_size"] = [window, 0]
    if data == "mqar":
        d = {"_target_": "harness.data.MQARDataModule", "vocab_size": vocab_size, "seq_len": seq_len,
             "num_kv_pairs": "${attn_zoo.div:${data.seq_len},16}", "power_a": 0.01, "random_non_queries": False,
             "batch_size": batch_size, "seed": "${seed}"}
    else:
        d = {"_target_": "harness.data.TextDataModule", "path": path, "hub_name": None, "seq_len": seq_len,
             "vocab_size": 256, "batch_size": batch_size, "seed": "${seed}"}
    cfg = {"seed": seed, "experiment_name": "t", "paths": {"output_dir": "${hydra:runtime.output_dir}"},
           "optim": {"lr": lr, "weight_decay": 0.0}, "data": d,
           "model": {"vocab_size": "${data.vocab_size}", "max_seq_len": "${data.seq_len}", "n_layer": n_layer,
                     "n_head": 4, "d_model": d_model, "layers": layers},
           "attention": att, "trainer": {"max_steps": max_steps, "val_check_interval": 10}}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if overrides is not None:
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if choices is not None:
        (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
            {"hydra": {"run": {"dir": "outputs/${now:%Y-%m-%d}"}, "runtime": {"choices": dict(choices)}}}))
    if hparams:  # train.py's logged config is resolved
        res = yaml.safe_load(yaml.safe_dump(cfg))
        res["data"]["num_kv_pairs"] = seq_len // 16
        res["data"]["seed"] = seed
        res["paths"]["output_dir"] = str(run)
        (run / "csv" / "hparams.yaml").write_text(yaml.safe_dump({"config": res, "n_params": n_params}))
    with open(run / "csv" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerow({"model/n_params": n_params, "step": 0})
        for step, m in vals:
            w.writerow({"epoch": 0, "perf/peak_mem_mb": 100, "perf/step_time_s": 0.01, "perf/tokens_per_s": 1e5,
                        "step": step - 1, "train/loss": 1.0})
            w.writerow({"epoch": 0, "step": step - 1, **{f"val/{k}": v for k, v in m.items()}})
    if final is not None:
        write_final_metrics(run, {"job": {"num": 0, "overrides": [], "override_dirname": ""}, "variant": attention,
                                  "n_params": n_params, "steps": max_steps,
                                  "metrics": {f"val/{k}": v for k, v in final.items()}, "wall_s": 1.0,
                                  "output_dir": str(run), "resumed_from": None})
    return run


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------------------------- fig2
def test_fig2_best_over_lr_variants_and_chance(tmp_path, capsys):
    root = tmp_path / "multirun"
    # flash, seq 64, d 64: lr 1e-3 peaks at 0.6 (last 0.5); lr 3e-3 peaks at 0.9 (last 0.8) -> best 0.9 at 3e-3
    write_run(root, "a", lr=1e-3, vals=[(10, {"acc": 0.3}), (20, {"acc": 0.6}), (30, {"acc": 0.5})])
    write_run(root, "b", lr=3e-3, vals=[(10, {"acc": 0.9}), (20, {"acc": 0.8})])
    # two seeds of one lr are averaged before the best lr is taken: (0.2 + 0.4) / 2 = 0.3 < 0.35
    write_run(root, "c", lr=1e-3, d_model=128, seed=0, vals=[(10, {"acc": 0.2})])
    write_run(root, "d", lr=1e-3, d_model=128, seed=1, vals=[(10, {"acc": 0.4})])
    write_run(root, "e", lr=3e-3, d_model=128, vals=[(10, {"acc": 0.35})])
    # linear kinds carry their feature map; a name that already says it keeps it; final_metrics.json counts
    write_run(root, "f", attention="linear", feature_map="taylor", seq_len=128, vals=[(10, {"acc": 0.1})],
              final={"acc": 0.15, "loss": 2.0})
    write_run(root, "g", attention="linear_taylor", kind="linear", feature_map="taylor", seq_len=128,
              vals=[(10, {"acc": 0.2})])
    write_run(root, "h", attention="gqa", seq_len=128, vals=[(10, {"acc": 0.7})])
    write_run(root, "i", data="text", vals=[(10, {"bpb": 2.0})])  # not MQAR: left out
    res = recall.run({"kind": "fig2", "runs": [str(root)], "out_dir": str(tmp_path / "out")})
    assert res["csv"] == str(tmp_path / "out" / "fig2.csv") and os.path.getsize(res["png"]) > 5000
    assert "fig2: wrote" in capsys.readouterr().out
    rows = {(r["variant"], int(r["seq_len"]), int(r["d_model"])): r for r in _csv(res["csv"])}
    assert set(rows) == {("flash", 64, 64), ("flash", 64, 128), ("linear (taylor)", 128, 64),
                         ("linear_taylor", 128, 64), ("gqa", 128, 64)}
    r = rows[("flash", 64, 64)]
    assert float(r["acc"]) == pytest.approx(0.9) and float(r["best_lr"]) == pytest.approx(3e-3)
    assert r["lrs"] == "0.001;0.003" and r["acc_from"] == "max over validations"
    assert float(r["chance"]) == pytest.approx(1 / 4)  # num_kv_pairs = ${attn_zoo.div:${data.seq_len},16} = 4
    r = rows[("flash", 64, 128)]
    assert float(r["acc"]) == pytest.approx(0.35) and float(r["best_lr"]) == pytest.approx(3e-3)
    assert float(rows[("linear (taylor)", 128, 64)]["acc"]) == pytest.approx(0.15)  # final_metrics.json's
    assert float(rows[("gqa", 128, 64)]["chance"]) == pytest.approx(1 / 8)
    # select=last: the last validation of each run
    res = recall.run({"kind": "fig2", "runs": [str(root)], "out_dir": str(tmp_path / "last"), "select": "last"})
    r = {(x["variant"], x["seq_len"], x["d_model"]): x for x in res["rows"]}[("flash", 64, 64)]
    assert r["acc"] == pytest.approx(0.8) and r["acc_from"] == "last validation"


def test_resolved_config_from_hparams(tmp_path):
    root = tmp_path / "r"
    run = write_run(root, "a", seq_len=256, vals=[(10, {"acc": 0.5})], hparams=True)
    cfg = recall.read_config(str(run))
    assert cfg["data"]["num_kv_pairs"] == 16 and cfg["paths"]["output_dir"] == str(run)
    (run / "csv" / "hparams.yaml").unlink()
    cfg = recall.read_config(str(run))  # .hydra/config.yaml: each interpolation resolved where it can be
    assert cfg["data"]["num_kv_pairs"] == 16 and cfg["model"]["max_seq_len"] == 256
    assert cfg["paths"]["output_dir"] is None  # ${hydra:...} only resolves inside Hydra


def test_steps_are_optimizer_steps_as_final_metrics_counts(tmp_path):
    """A finished 6-step run (validations after steps 3 and 6, logged by Lightning at its 0-based steps 2 and 5):
    fig2.csv said steps_run=5 and, for the best validation, step=2, where final_metrics.json says 6 and the
    validation came after 3 optimizer steps. A run cut off (no final_metrics.json) counts the same way; a final
    validation that train.py logged itself (at global_step, as every run before the final validation was logged
    once did: rows at 5 and 6) is not moved."""
    root = tmp_path / "runs"
    write_run(root, "done", max_steps=6, vals=[(3, {"acc": 0.9}), (6, {"acc": 0.8})], final={"acc": 0.8})
    write_run(root, "cut", d_model=128, max_steps=6, vals=[(3, {"acc": 0.7}), (4, {"acc": 0.6})])
    old = write_run(root, "old", d_model=256, max_steps=6, vals=[(3, {"acc": 0.5}), (6, {"acc": 0.4})],
                    final={"acc": 0.4})
    with open(old / "csv" / "metrics.csv", "a", newline="") as f:  # the final validation logged again, at step 6
        csv.DictWriter(f, fieldnames=COLUMNS).writerow({"epoch": 0, "step": 6, "val/acc": 0.4})
    rows = {r["d_model"]: r for r in recall.run({"kind": "fig2", "runs": [str(root)],
                                                  "out_dir": str(tmp_path / "o")})["rows"]}
    assert (rows[64]["step"], rows[64]["steps_run"]) == (3, 6)
    assert (rows[128]["step"], rows[128]["steps_run"]) == (3, 4)
    assert (rows[256]["step"], rows[256]["steps_run"]) == (3, 6)
    pts = recall.val_points(recall.read_metrics(str(old)), {"steps": 6})
    assert [p["step"] for p in pts] == [3.0, 6.0]  # in-fit 5 -> 6 and train.py's own 6: one validation
    assert recall.optimizer_steps(7.0, {"steps": 6}) == 6  # nothing past the last optimizer step


def test_val_points_merge_rows_of_one_step_and_final():
    # metrics.csv's step is Lightning's 0-based logging step: the validation after 10 optimizer steps is at step 9
    rows = [{"step": "9", "val/acc": "0.5", "val/loss": ""}, {"step": "9", "val/acc_far": "0.1"},
            {"step": "10", "train/loss": "1"}, {"step": "19", "val/acc": "0.7"}]
    pts = recall.val_points(rows, {"steps": 30, "metrics": {"val/acc": 0.75, "train/loss": 0.1}})
    assert pts == [{"val/acc": 0.5, "val/acc_far": 0.1, "step": 10.0}, {"val/acc": 0.7, "step": 20.0},
                   {"val/acc": 0.75, "step": 30.0}]
    assert recall.pick(pts, "val/acc", "best")["step"] == 30.0
    assert recall.pick(pts, "val/acc_far", "last")["val/acc_far"] == 0.1
    assert recall.pick([], "val/acc") == {}
    with pytest.raises(ValueError, match="select="):
        recall.pick(pts, "val/acc", "median")


# --------------------------------------------------------------------------------------------- cliff
def test_cliff_uses_the_best_validation_and_marks_the_key_distance(tmp_path):
    root = tmp_path / "m"
    frac = {8: 0.9, 16: 0.7, 32: 0.3, 64: 0.0}
    for w in (8, 16, 32, 64):
        far = 0.1 if w < 32 else 0.8
        # the best val/acc is the second validation: its acc_far / acc_near are reported, not the max acc_far
        write_run(root, f"w{w}", attention="sliding_window", window=w,
                  vals=[(10, {"acc": 0.3, "acc_far": 0.95, "acc_near": 0.2, "frac_far": frac[w]}),
                        (20, {"acc": 0.6, "acc_far": far, "acc_near": 0.9, "frac_far": frac[w]})])
    write_run(root, "w16_lr", attention="sliding_window", window=16, lr=3e-3,
              vals=[(20, {"acc": 0.5, "acc_far": 0.5, "acc_near": 0.5, "frac_far": 0.7})])
    write_run(root, "full", attention="flash", vals=[(20, {"acc": 0.97})])
    write_run(root, "other_len", attention="sliding_window", window=8, seq_len=128, vals=[(20, {"acc": 0.2})])
    res = recall.run({"kind": "cliff", "runs": [str(root)], "out_dir": str(tmp_path / "o"), "seq_len": 64})
    rows = {r["window"]: r for r in res["rows"]}
    assert set(rows) == {-1, 8, 16, 32, 64}  # -1: full attention reference; seq_len 128 left out
    assert rows[8]["acc_far"] == pytest.approx(0.1) and rows[8]["acc_near"] == pytest.approx(0.9)
    assert rows[16]["best_lr"] == pytest.approx(1e-3) and rows[16]["acc"] == pytest.approx(0.6)
    assert rows[64]["acc_far"] == pytest.approx(0.8) and rows[-1]["acc"] == pytest.approx(0.97)
    # frac_far crosses 1/2 between w = 16 (0.7) and 32 (0.3): median key distance 24
    assert rows[8]["median_key_distance"] == pytest.approx(24.0)
    assert float(_csv(res["csv"])[0]["median_key_distance"]) == pytest.approx(24.0)
    assert os.path.getsize(res["png"]) > 5000


def test_cliff_key_distance_from_the_generator(tmp_path):
    root = tmp_path / "m"
    for w in (4, 16):
        write_run(root, f"w{w}", attention="sliding_window", window=w, seq_len=64,
                  vals=[(20, {"acc": 0.5, "acc_near": 0.6})])  # no frac_far, no acc_far
    res = recall.run({"kind": "cliff", "runs": [str(root)], "out_dir": str(tmp_path / "o")})
    md = res["rows"][0]["median_key_distance"]
    assert math.isfinite(md) and 1 <= md < 64
    assert any("val/acc_far" in n for n in res["notes"])


# --------------------------------------------------------------------------------------------- hybrid
def test_hybrid_counts_full_layers_and_shares_the_all_flash_end(tmp_path):
    root = tmp_path / "h"
    write_run(root, "k0", attention="linear", layers=["linear", "linear", "linear", "linear"], n_layer=4,
              vals=[(10, {"acc": 0.2})])
    write_run(root, "k1", layers=["linear", "linear", "linear", "flash"], n_layer=4, vals=[(10, {"acc": 0.5})])
    write_run(root, "k2a", layers=["linear", "linear", "flash", "flash"], n_layer=4, vals=[(10, {"acc": 0.8})])
    write_run(root, "k2b", layers=["flash", "linear", "flash", "linear"], n_layer=4, vals=[(10, {"acc": 0.7})])
    write_run(root, "k2c", layers=["linear", "linear", "flash", "flash"], n_layer=4, lr=3e-3,
              vals=[(10, {"acc": 0.6})])
    write_run(root, "w1", layers=[{"name": "sliding_window", "kind": "sliding_window", "window_size": [7, 0]},
                                  "linear", "flash", "linear"], n_layer=4, vals=[(10, {"acc": 0.4})])
    write_run(root, "w0", attention="sliding_window", window=7, n_layer=4, vals=[(10, {"acc": 0.3})])
    write_run(root, "k4", attention="flash", n_layer=4, vals=[(10, {"acc": 0.99})])  # no model.layers: all flash
    speed = tmp_path / "model_speed.csv"
    speed.write_text("size,variant,seq_len,backend,batch,tokens_per_step,step_ms,tokens_per_s,peak_mem_mib,n_params\n"
                     "small,flash,64,triton,256,16384,10,1638400,500,800000\n"
                     "small,linear,64,triton,256,16384,8,2048000,450,800000\n"
                     "small,linear,64,torch,256,16384,9,1820444,700,800000\n")
    res = recall.run({"kind": "hybrid", "runs": [str(root)], "out_dir": str(tmp_path / "o"),
                      "speed": str(speed)})
    rows = res["rows"]
    lin = {(r["k"], r["layers"]): r for r in rows if r["base"] == "linear"}
    assert lin[(0, "linear,linear,linear,linear")]["acc"] == pytest.approx(0.2)
    assert lin[(1, "linear,linear,linear,flash")]["acc"] == pytest.approx(0.5)
    assert lin[(2, "linear,linear,flash,flash")]["acc"] == pytest.approx(0.8)  # best over lr (0.8 vs 0.6)
    assert lin[(2, "flash,linear,flash,linear")]["acc"] == pytest.approx(0.7)
    assert lin[(4, "flash,flash,flash,flash")]["shared_endpoint"] is True
    mixed = [r for r in rows if r["base"] == "linear+sliding_window"]
    assert [(r["k"], r["acc"]) for r in mixed if not r["shared_endpoint"]] == [(1, pytest.approx(0.4))]
    sw = {r["k"]: r for r in rows if r["base"] == "sliding_window"}
    assert set(sw) == {0, 4} and sw[4]["acc"] == pytest.approx(0.99)  # the all-flash end of every line
    # speed: only the pure models have rows (triton): k = 0 linear, k = L flash; hybrids get none, and say so
    assert lin[(0, "linear,linear,linear,linear")]["tokens_per_s"] == pytest.approx(2048000)
    assert lin[(4, "flash,flash,flash,flash")]["tokens_per_s"] == pytest.approx(1638400)
    assert math.isnan(lin[(1, "linear,linear,linear,flash")]["tokens_per_s"])
    assert any("no hybrid rows" in n for n in res["notes"])
    assert os.path.getsize(res["png"]) > 5000


def test_hybrid_layout_rules():
    base = {"layers": None, "attention": "flash", "n_layer": 3}
    assert recall.hybrid_layout(base) == {"k": 3, "L": 3, "base": None, "layers": "flash,flash,flash"}
    assert recall.hybrid_layout(dict(base, attention="linear"))["k"] == 0
    lay = recall.hybrid_layout(dict(base, layers=["linear", "flash", "sliding_window", "flash"]))
    assert lay["k"] == 2 and lay["L"] == 4 and lay["base"] == "linear+sliding_window"


# --------------------------------------------------------------------------------------------- lm
def test_lm_token_budget_params_and_best_bpb(tmp_path, capsys):
    root = tmp_path / "lm"
    for n, b in ((256, 32), (512, 16), (1024, 8)):  # equal budget: 100 * 8192 tokens
        write_run(root, f"flash{n}", data="text", attention="flash", seq_len=n, batch_size=b, n_params=824448,
                  vals=[(10, {"bpb": 3.0}), (20, {"bpb": 2.0 + 256 / n}), (30, {"bpb": 2.9})])
        write_run(root, f"gqa{n}", data="text", attention="gqa", seq_len=n, batch_size=b, n_params=758912,
                  vals=[(20, {"bpb": 2.2})], final={"bpb": 2.1, "loss": 1.5})
    write_run(root, "flash256_lr", data="text", attention="flash", seq_len=256, batch_size=32, lr=3e-3,
              n_params=824448, vals=[(20, {"bpb": 2.5})])
    res = recall.run({"kind": "lm", "runs": [str(root)], "out_dir": str(tmp_path / "o")})
    rows = {(r["variant"], r["seq_len"]): r for r in res["rows"]}
    assert rows[("flash", 256)]["bpb"] == pytest.approx(2.5) and rows[("flash", 256)]["best_lr"] == pytest.approx(3e-3)
    assert rows[("flash", 1024)]["bpb"] == pytest.approx(2.25)  # lowest over validations
    assert rows[("gqa", 512)]["bpb"] == pytest.approx(2.1)  # final_metrics.json's validation
    assert rows[("gqa", 512)]["n_params"] == 758912 and rows[("flash", 512)]["n_params"] == 824448
    assert {r["data"] for r in res["rows"]} == {"tinyshakespeare"}
    assert res["notes"][0] == "equal token budget 0.8M tokens per run"
    assert "unfinished" in " ".join(res["notes"][1:])  # runs without final_metrics.json are counted
    assert recall._params_label("flash", [824448]) == "flash (MHA, 824,448 params)"
    assert recall._params_label("gqa", [758912]) == "gqa (758,912 params)"
    capsys.readouterr()
    write_run(root, "odd", data="text", attention="mqa", seq_len=256, batch_size=64, vals=[(10, {"bpb": 2.4})])
    with pytest.warns(UserWarning, match="token budget differs"):
        res = recall.run({"kind": "lm", "runs": [str(root)], "out_dir": str(tmp_path / "o2")})
    assert "UNEQUAL" in res["notes"][0] and "warning" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------- ablation
def _ablation_runs(root, with_old=True):
    """experiment=mqar_old_recipe in small: the old recipe (4 layers, vocab 128, lr 1e-3) and three one-change runs,
    the option named in hydra.yaml and overrides.yaml, hydra.yaml only, overrides.yaml only (with and without +);
    ``lr`` was cut off at step 200 (no final_metrics.json); a run of another experiment lies beside them."""
    old = dict(n_layer=4, lr=1e-3, vocab_size=128, max_steps=300)
    if with_old:
        write_run(root, "mqar_change=old", **old, overrides=["+mqar_change=old"],
                  choices={"mqar_change": "old", "data": "mqar"},
                  vals=[(100, {"acc": 0.26}), (200, {"acc": 0.27}), (300, {"acc": 0.25})], final={"acc": 0.25})
    write_run(root, "mqar_change=n_layer", **dict(old, n_layer=2), choices={"mqar_change": "n_layer"},
              vals=[(100, {"acc": 0.5}), (200, {"acc": 0.995})], final={"acc": 0.995})  # early stop at 0.99
    write_run(root, "mqar_change=vocab_size", **dict(old, vocab_size=8192), overrides=["+mqar_change=vocab_size"],
              vals=[(100, {"acc": 0.4}), (200, {"acc": 0.6}), (300, {"acc": 0.55})], final={"acc": 0.55})
    write_run(root, "mqar_change=lr", **dict(old, lr=3e-3), overrides=["mqar_change=lr", "trainer.max_steps=300"],
              vals=[(100, {"acc": 0.3}), (200, {"acc": 0.45})])
    write_run(root, "other", attention="linear", overrides=["attention=linear"], choices={"attention": "linear"},
              vals=[(100, {"acc": 0.9})], final={"acc": 0.9})  # not part of the ablation


def test_ablation_rows_changes_deltas_and_order(tmp_path, capsys):
    root = tmp_path / "multirun" / "mqar_old_recipe"
    _ablation_runs(root)
    res = recall.run({"kind": "ablation", "runs": [str(root)], "out_dir": str(tmp_path / "out")})
    assert res["csv"] == str(tmp_path / "out" / "ablation.csv") and res["png"] == str(tmp_path / "out" / "ablation.png")
    assert os.path.getsize(res["png"]) > 5000
    assert f"ablation: wrote {res['csv']} and {res['png']}" in capsys.readouterr().out
    rows = _csv(res["csv"])
    assert [r["option"] for r in rows] == ["old", "n_layer", "vocab_size", "lr"]  # control first, then acc desc
    by = {r["option"]: r for r in rows}
    assert by["old"]["change"] == "none (control: the old recipe)" and by["old"]["label"] == "old (control)"
    assert by["n_layer"]["change"] == "model.n_layer: 4 -> 2" and by["n_layer"]["label"] == "n_layer 4 -> 2"
    assert (by["n_layer"]["setting"], by["n_layer"]["old_value"], by["n_layer"]["value"]) == ("model.n_layer", "4",
                                                                                            "2")
    # model.vocab_size = ${data.vocab_size} changes with it: both keys in the CSV, one label
    assert by["vocab_size"]["change"] == "data.vocab_size: 128 -> 8192; model.vocab_size: 128 -> 8192"
    assert by["vocab_size"]["label"] == "vocab_size 128 -> 8192"
    assert by["lr"]["change"] == "optim.lr: 0.001 -> 0.003" and by["lr"]["label"] == "lr 0.001 -> 0.003"
    acc = {o: float(r["acc"]) for o, r in by.items()}
    assert acc == pytest.approx({"old": 0.27, "n_layer": 0.995, "vocab_size": 0.6, "lr": 0.45})  # max over vals
    assert {o: float(r["step"]) for o, r in by.items()} == {"old": 200, "n_layer": 200, "vocab_size": 200, "lr": 200}
    delta = {o: float(r["delta_vs_old"]) for o, r in by.items()}
    assert delta == pytest.approx({"old": 0.0, "n_layer": 0.725, "vocab_size": 0.33, "lr": 0.18})
    assert {o: r["finished"] for o, r in by.items()} == {"old": "1.0", "n_layer": "1.0", "vocab_size": "1.0",
                                                          "lr": "0.0"}
    assert float(by["lr"]["steps_run"]) == 200 and float(by["old"]["steps_run"]) == 300
    assert all(float(r["chance"]) == pytest.approx(0.25) for r in rows)  # 1 / (64 // 16) kv pairs
    assert any("1 run(s) without a mqar_change option left out" in n for n in res["notes"])
    assert any("1 of 4 runs unfinished" in n for n in res["notes"])
    # select=last: the last validation of each run
    res = recall.run({"kind": "ablation", "runs": [str(root)], "out_dir": str(tmp_path / "last"), "select": "last"})
    last = {r["option"]: r for r in res["rows"]}
    assert last["old"]["acc"] == pytest.approx(0.25) and last["vocab_size"]["acc"] == pytest.approx(0.55)
    assert last["n_layer"]["delta_vs_old"] == pytest.approx(0.745) and last["old"]["acc_from"] == "last validation"


def test_ablation_without_the_control_names_the_change_from_its_yaml(tmp_path):
    root = tmp_path / "m"
    _ablation_runs(root, with_old=False)
    res = recall.run({"kind": "ablation", "runs": [str(root)], "out_dir": str(tmp_path / "o")})
    rows = res["rows"]
    assert [r["option"] for r in rows] == ["n_layer", "vocab_size", "lr"]
    by = {r["option"]: r for r in rows}
    # conf/mqar_change/<option>.yaml names the key, the run gives the value; nothing to subtract
    assert by["n_layer"]["change"] == "model.n_layer = 2" and by["n_layer"]["old_value"] == ""
    assert by["vocab_size"]["change"] == "data.vocab_size = 8192" and by["lr"]["label"] == "lr = 0.003"
    assert all(math.isnan(r["delta_vs_old"]) for r in rows)
    assert any("no 'old' (control) run" in n for n in res["notes"])


def test_ablation_plot_bars_control_unfinished_chance_and_target(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: seen.append(self))
    _ablation_runs(tmp_path / "m")
    recall.run({"kind": "ablation", "runs": [str(tmp_path / "m")], "out_dir": str(tmp_path / "o")})
    ax = seen[-1].axes[0]
    bars = ax.patches
    assert [t.get_text() for t in ax.get_yticklabels()] == ["old (control)", "n_layer 4 -> 2",
                                                           "vocab_size 128 -> 8192", "lr 0.001 -> 0.003"]
    assert [b.get_width() for b in bars] == pytest.approx([0.27, 0.995, 0.6, 0.45])
    assert bars[0].get_facecolor() != bars[1].get_facecolor()  # the control stands apart
    assert bars[1].get_facecolor() == bars[2].get_facecolor()
    assert [b.get_hatch() for b in bars] == [None, None, None, "//"]  # lr: cut off, hatched and hollow
    assert bars[3].get_facecolor()[:3] == (1.0, 1.0, 1.0)
    vlines = sorted((ln.get_xdata()[0], ln.get_linestyle()) for ln in ax.lines)
    assert vlines == [(pytest.approx(0.25), "--"), (pytest.approx(0.99), "-")]  # chance, target
    legend = [t.get_text() for lg in seen[-1].legends for t in lg.get_texts()]
    assert any("cut off" in t for t in legend) and any("chance" in t for t in legend)
    caption = seen[-1]._suptitle.get_text()
    assert "vocab 128-8192" in caption and "layers 2-4" in caption and "4 runs" in caption  # the _setup() line


def test_setting_changes_ignore_run_folders_and_result_free_keys():
    ref = {"seed": 0, "paths": {"output_dir": "/m/old"}, "stop_at": 1, "model": {"n_layer": 4},
           "callbacks": {"checkpoint": {"dirpath": "/m/old/checkpoints"}}, "data": {"random_non_queries": True}}
    cfg = {"seed": 0, "paths": {"output_dir": "/m/x"}, "stop_at": 2, "model": {"n_layer": 4},
           "callbacks": {"checkpoint": {"dirpath": "/m/x/checkpoints"}}, "data": {"random_non_queries": False}}
    assert recall.setting_changes(cfg, ref) == [("data.random_non_queries", True, False)]
    rec = {"option": "random_non_queries", "cfg": cfg}
    assert recall.describe_change(rec, ref)["label"] == "random_non_queries true -> false"
    assert recall.setting_changes(dict(cfg, seed=1), ref, ignore={"seed"}) == [("data.random_non_queries", True,
                                                                                 False)]


def test_ablation_without_mqar_change_runs_raises(tmp_path):
    root = tmp_path / "fig2"
    write_run(root, "a", overrides=["attention=flash"], choices={"attention": "flash"}, vals=[(10, {"acc": 0.5})])
    write_run(root, "b", vals=[(10, {"acc": 0.5})])  # no .hydra/overrides.yaml, no hydra.yaml
    with pytest.raises(ValueError, match=r"ablation: no mqar_change run under runs=\[.*fig2"):
        recall.run({"kind": "ablation", "runs": [str(root)], "out_dir": str(tmp_path / "o")})
    assert not (tmp_path / "o").exists()
    write_run(root, "c", overrides=["+mqar_change=old"])  # an option, but no validation
    with pytest.raises(ValueError, match=r"ablation: no mqar_change run .* logged val/acc"):
        recall.run({"kind": "ablation", "runs": [str(root)], "out_dir": str(tmp_path / "o")})


# --------------------------------------------------------------------------------------------- errors / CLI
def test_no_matching_runs_raise_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match="runs"):
        recall.run({"kind": "fig2", "runs": [], "out_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="not a directory"):
        recall.run({"kind": "fig2", "runs": [str(tmp_path / "nope")], "out_dir": str(tmp_path)})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"runs=.*no train.py run folder"):
        recall.run({"kind": "fig2", "runs": [str(tmp_path / "empty")], "out_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="kind="):
        recall.run({"kind": "fig3", "runs": [str(tmp_path)], "out_dir": str(tmp_path)})
    text = tmp_path / "text"
    write_run(text, "a", data="text", vals=[(10, {"bpb": 2.0})])
    with pytest.raises(ValueError, match=r"fig2: no MQAR run .*runs="):
        recall.run({"kind": "fig2", "runs": [str(text)], "out_dir": str(tmp_path / "o")})
    mq = tmp_path / "mq"
    write_run(mq, "a", vals=[(10, {"acc": 0.5})])
    with pytest.raises(ValueError, match=r"lm: no language-modelling run"):
        recall.run({"kind": "lm", "runs": [str(mq)], "out_dir": str(tmp_path / "o")})
    with pytest.raises(ValueError, match=r"cliff: no MQAR run with a sliding window"):
        recall.run({"kind": "cliff", "runs": [str(mq)], "out_dir": str(tmp_path / "o")})
    with pytest.raises(ValueError, match=r"hybrid: no MQAR run with a non-flash layer"):
        recall.run({"kind": "hybrid", "runs": [str(mq)], "out_dir": str(tmp_path / "o")})
    with pytest.raises(ValueError, match=r"seq_len=999"):
        recall.run({"kind": "cliff", "runs": [str(mq)], "out_dir": str(tmp_path / "o"), "seq_len": 999})
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.png"))  # no silent empty plot


def test_cli_kind_argument_and_config():
    assert recall.argv_with_kind(["eval/recall.py", "fig2", "runs=[a]"]) == ["eval/recall.py", "kind=fig2",
                                                                              "runs=[a]"]
    assert recall.argv_with_kind(["x", "kind=lm"]) == ["x", "kind=lm"]
    from hydra import compose, initialize_config_dir

    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eval", "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="recall", overrides=["kind=cliff", "runs=[multirun/a,multirun/b]", "out_dir=o",
                                                       "seq_len=256"])
        assert cfg.kind == "cliff" and list(cfg.runs) == ["multirun/a", "multirun/b"] and cfg.select == "best"
        q = compose(config_name="quality", overrides=["speed=x.csv", "speed_size=small"])
        assert q.speed == "x.csv" and q.speed_backend == "triton" and q.speed_size == "small"


# --------------------------------------------------------------------------------------------- quality speed=
def _quality_runs(root):
    for n in (64, 128, 256):
        write_run(root, f"flash{n}", seq_len=n, vals=[(10, {"acc": 0.9})])
        write_run(root, f"linear{n}", attention="linear", seq_len=n, vals=[(10, {"acc": 0.3})])
    write_run(root, "taylor64", attention="linear_taylor", kind="linear", seq_len=64, vals=[(10, {"acc": 0.5})])


def test_quality_speed_from_bench_model(tmp_path, capsys):
    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    _quality_runs(root)
    speed = tmp_path / "model_speed.csv"
    # bench_model's own layout; flash gets slower with n, linear is flat; sdpa rows and the large size ignored
    lines = ["size,variant,seq_len,backend,batch,tokens_per_step,step_ms,step_ms_min,tokens_per_s,peak_mem_mib,"
             "n_params,ratio_vs_torch"]
    for n in (64, 128, 256, 4096):
        lines.append(f"small,flash,{n},triton,1,16384,{n / 4},1,{16384 / (n / 4e3):.0f},{100 + n},800000,1.0")
        lines.append(f"small,flash,{n},sdpa_cudnn,1,16384,1,1,9999999,1,800000,1.0")
        lines.append(f"large,flash,{n},triton,1,16384,1,1,123,9000,100000000,1.0")
        if n != 256:
            lines.append(f"small,linear,{n},triton,1,16384,8,1,2048000,300,800000,1.0")
    lines.append("small,linear,256,triton,,,,,,,,")  # a failed row (error): dropped
    speed.write_text("\n".join(lines) + "\n")
    out = tmp_path / "q"
    res = quality_run({"runs": [str(root)], "out_dir": str(out), "speed": str(speed), "speed_size": "small",
                       "wandb": {"enabled": False}})
    printed = capsys.readouterr().out
    j = {(r["variant"], r["seq_len"]): r for r in res["joined"]}
    assert j[("flash", 128)]["tokens_per_s"] == pytest.approx(16384 / 0.032, rel=1e-6)
    assert j[("flash", 128)]["peak_mem_mb"] == pytest.approx(228)
    assert j[("flash", 128)]["step_time_s"] == pytest.approx(0.032)
    assert j[("flash", 128)]["run_tokens_per_s"] == pytest.approx(1e5)  # the run's own, kept aside
    assert j[("flash", 128)]["speed_source"] == "bench_model:triton/small"
    assert math.isnan(j[("linear", 256)]["tokens_per_s"]) and j[("linear", 256)]["speed_source"] == "unmatched"
    assert sorted(res["unmatched"]) == [("mqar", "linear", 256), ("mqar", "linear_taylor", 64)]
    assert "linear_taylor@64" in printed and "flash@4096" in printed  # both sides of the join reported
    assert (out / "quality_speed_memory.csv").exists() and (out / "bubble_mqar.png").stat().st_size > 5000
    # leaders use the benchmark's step time: flash 0.9 / (n / 4000) vs linear 0.3 / 0.008 -> flash leads at 64,
    # linear at 128 (256: linear has no speed, flash leads alone); with the runs' own (equal) speed flash leads
    lead = [r["leader"] for r in res["leaders"] if r["kind"] == "leader"]
    assert lead == ["flash", "linear", "flash"]
    # without speed=: the old behaviour (runs' own throughput)
    res = quality_run({"runs": [str(root)], "out_dir": str(tmp_path / "q0"), "wandb": {"enabled": False}})
    assert [r["leader"] for r in res["leaders"] if r["kind"] == "leader"] == ["flash", "flash", "flash"]
    assert res["joined"] is None and not (tmp_path / "q0" / "quality_speed_memory.csv").exists()


def test_quality_speed_errors_name_the_option(tmp_path):
    from eval.quality import load_bench_speed

    with pytest.raises(FileNotFoundError, match="speed="):
        load_bench_speed(str(tmp_path / "nope.csv"))
    bad = tmp_path / "model.csv"
    bad.write_text("sweep,variant,backend,seq_len,train_tokens_per_s\nx,flash,auto,64,1\n")
    with pytest.raises(ValueError, match="not an eval.bench_model CSV"):
        load_bench_speed(str(bad))
    two = tmp_path / "two.csv"
    two.write_text("size,variant,seq_len,backend,tokens_per_s,peak_mem_mib\nsmall,flash,64,triton,1,1\n"
                   "large,flash,64,triton,1,1\n")
    with pytest.raises(ValueError, match="speed_size"):
        load_bench_speed(str(two))
    with pytest.raises(ValueError, match="speed_backend='flex'"):
        load_bench_speed(str(two), backend="flex", size="small")
    df = load_bench_speed(str(two), size="large")
    assert list(df["bench_size"]) == ["large"] and list(df["variant"]) == ["flash"]


def test_unfinished_runs_are_flagged_and_budgets_not_averaged(tmp_path):
    """A run cut off before max_steps (no final_metrics.json) is flagged in the CSV and the caption, and runs of
    another step budget are their own row, not averaged in as if they were seeds."""
    from eval import recall

    root = tmp_path / "runs"
    write_run(root, "a", seq_len=64, d_model=64, lr=3e-3, max_steps=1500, vals=[(500, {"acc": 0.9})],
              final={"acc": 0.9})
    write_run(root, "b", seq_len=64, d_model=64, lr=3e-3, max_steps=6000, vals=[(500, {"acc": 0.5})])
    res = recall.run({"kind": "fig2", "runs": [str(root)], "out_dir": str(tmp_path / "o")})
    rows = {r["max_steps"]: r for r in res["rows"]}
    assert set(rows) == {1500, 6000} and rows[1500]["n_runs"] == rows[6000]["n_runs"] == 1
    assert rows[1500]["finished"] == 1.0 and rows[6000]["finished"] == 0.0
    assert rows[1500]["acc"] == pytest.approx(0.9) and rows[6000]["acc"] == pytest.approx(0.5)
    assert any("1 of 2 runs unfinished" in n for n in res["notes"])


def test_fig2_plot_marks_cut_off_runs_hollow(tmp_path, monkeypatch):
    """A cell whose run stopped before max_steps is drawn with a hollow marker over its line, with a legend entry;
    a grid of finished runs has neither."""
    from matplotlib.figure import Figure

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: seen.append(self))
    root = tmp_path / "multirun"
    write_run(root, "done", d_model=64, vals=[(100, {"acc": 0.9})], final={"acc": 0.9})
    write_run(root, "cut", d_model=128, vals=[(40, {"acc": 0.5})])  # no final_metrics.json: cut off
    recall.run({"kind": "fig2", "runs": [str(root)], "out_dir": str(tmp_path / "out")})
    fig = seen[-1]
    hollow = [ln for ax in fig.axes for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert [list(ln.get_xdata()) for ln in hollow] == [[128]]
    assert any("cut off" in t.get_text() for lg in fig.legends for t in lg.get_texts())
    seen.clear()
    shutil.rmtree(root / "cut")
    recall.run({"kind": "fig2", "runs": [str(root)], "out_dir": str(tmp_path / "out2")})
    fig = seen[-1]
    assert not [ln for ax in fig.axes for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert not any("cut off" in t.get_text() for lg in fig.legends for t in lg.get_texts())


def test_bench_setup_caption_names_what_the_speed_csv_measured(tmp_path):
    """The hybrid figure's speed caption states the benchmark's backend, size, vocabulary and tokens per step (of
    that backend's rows), so a reader can compare them with the trained model."""
    p = tmp_path / "model_speed.csv"
    p.write_text("size,variant,seq_len,backend,vocab,tokens_per_step,tokens_per_s\n"
                 "small,flash,256,triton,8192,262144,1\nsmall,flash,2048,triton,8192,262144,1\n"
                 "large,flash,256,torch,256,16384,1\n")
    assert recall.bench_setup(str(p), "triton") == "backend triton, size small, vocab 8192, tokens/step 262144"
    assert recall.bench_setup(str(p), "torch") == "backend torch, size large, vocab 256, tokens/step 16384"


def test_an_empty_metrics_csv_reads_as_no_rows(tmp_path):
    """A job killed before its first log flush leaves an empty csv/metrics.csv: eval.recall / eval.quality failed on
    it with pandas' EmptyDataError, naming neither the file nor the run."""
    from eval.quality import read_metrics

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("")
    assert len(read_metrics(str(tmp_path))) == 0


# --------------------------------------------------------------------------------------------- curves
def test_curves_keep_runs_of_two_sweeps_apart_and_filter_cells(tmp_path, monkeypatch):
    """Two sweeps with the same job folder name (mqar_fig2 and mqar_fig2_long) give two curves, one per run, each
    with every validation in order; the budgets get their own line styles (the longest solid), lrs their colours,
    a cut-off run a hollow end marker; seq_len / d_model / variant narrow the cells, and bad values or too many
    cells raise naming the argument."""
    from matplotlib.figure import Figure

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: seen.append(self))
    job = "attention=flash,model.d_model=512,data.seq_len=512,optim.lr=0.001"
    write_run(tmp_path / "mqar_fig2", job, seq_len=512, d_model=512, max_steps=1500,
              vals=[(250, {"acc": 0.03}), (500, {"acc": 0.04})], final={"acc": 0.04})
    write_run(tmp_path / "mqar_fig2_long", job, seq_len=512, d_model=512, max_steps=6000,
              vals=[(250, {"acc": 0.03}), (500, {"acc": 0.5}), (750, {"acc": 0.995})])  # no final: cut off
    write_run(tmp_path / "mqar_fig2", "other", attention="mqa", seq_len=512, d_model=512, lr=3e-3, max_steps=1500,
              vals=[(250, {"acc": 0.2})], final={"acc": 0.2})
    roots = [str(tmp_path / "mqar_fig2_long"), str(tmp_path / "mqar_fig2")]
    res = recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o"), "variant": "flash"})
    rows = _csv(res["csv"])
    assert {r["run"] for r in rows} == {f"mqar_fig2/{job}", f"mqar_fig2_long/{job}"}
    long_ = [(float(r["step"]), float(r["acc"])) for r in rows if r["run"].startswith("mqar_fig2_long")]
    assert long_ == [(250, 0.03), (500, 0.5), (750, 0.995)]
    assert {float(r["finished"]) for r in rows if r["run"].startswith("mqar_fig2_long")} == {0.0}
    fig = seen[-1]
    drawn = [ln for ax in fig.axes for ln in ax.lines if ln.get_marker() == "o" and len(ln.get_xdata()) > 1]
    # the 1,500-step run: its 2 validations and final_metrics.json's at step 1,500
    assert sorted((ln.get_linestyle(), list(ln.get_xdata())) for ln in drawn) == [
        ("-", [250, 500, 750]), (":", [250, 500, 1500])]
    hollow = [ln for ax in fig.axes for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert [list(ln.get_xdata()) for ln in hollow] == [[750]]
    assert len(fig.axes) == 1  # only the flash cell
    res = recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o2")})
    assert {r["variant"] for r in res["rows"]} == {"flash", "mqa"} and len(seen[-1].axes) == 2
    with pytest.raises(ValueError, match=r"d_model=64 matches no run .*\[512\]"):
        recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o3"), "d_model": 64})
    with pytest.raises(ValueError, match=r"variant=gqa matches no run .*'flash', 'mqa'"):
        recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o3"), "variant": "gqa"})
    # a run config without optim.lr still draws (its lr shown as "?")
    write_run(tmp_path / "mqar_fig2", "no_lr", seq_len=512, d_model=512, lr=None, vals=[(250, {"acc": 0.1})])
    res = recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o4"), "variant": "flash"})
    assert len({r["run"] for r in res["rows"]}) == 3
    assert any(t.get_text() == "lr ?" for lg in seen[-1].legends for t in lg.get_texts())
    monkeypatch.setattr(recall, "MAX_CURVE_PANELS", 1)
    with pytest.raises(ValueError, match=r"2 \(variant, seq_len, d_model\) cells .*seq_len=, d_model= or variant="):
        recall.run({"kind": "curves", "runs": roots, "out_dir": str(tmp_path / "o3")})


def test_report_arguments_are_checked_before_any_run_is_read(tmp_path):
    """A filter of another kind, or a non-integer length / width, is refused naming the argument (no silent full
    report); ``variant=`` takes the config's attention name as well as the line label."""
    root = tmp_path / "runs"
    write_run(root, "a", attention="linear", kind="linear", feature_map="elu1", seq_len=64, d_model=64,
              vals=[(10, {"acc": 0.3})])
    write_run(root, "b", seq_len=64, d_model=64, vals=[(10, {"acc": 0.9})])
    out = str(tmp_path / "o")
    for kind, key, value in (("fig2", "d_model", 64), ("fig2", "variant", "flash"), ("fig2", "seq_len", 64),
                             ("cliff", "variant", "flash"), ("lm", "speed", "x.csv")):
        with pytest.raises(ValueError, match=rf"{key}=.* applies to kind .* not kind={kind}"):
            recall.run({"kind": kind, "runs": [str(root)], "out_dir": out, key: value})
    for key, value in (("seq_len", "abc"), ("d_model", 64.5), ("d_model", True)):
        with pytest.raises(ValueError, match=rf"{key}=.*: must be an integer"):
            recall.run({"kind": "curves", "runs": [str(root)], "out_dir": out, key: value})
    assert not os.path.exists(out)
    res = recall.run({"kind": "curves", "runs": [str(root)], "out_dir": out, "seq_len": "64", "variant": "linear"})
    assert {r["variant"] for r in res["rows"]} == {"linear (elu1)"}
    res = recall.run({"kind": "curves", "runs": [str(root)], "out_dir": out, "variant": "linear (elu1)"})
    assert {r["variant"] for r in res["rows"]} == {"linear (elu1)"}


def test_run_date_comes_from_what_the_run_wrote_not_from_file_times(tmp_path):
    """A clone sets every file's time to its own day: the caption's dates come from final_metrics.json's ``date``,
    else the last dated line of train.log, else nothing."""
    import json
    import os

    from eval.recall import _run_date

    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "final_metrics.json").write_text(json.dumps({"date": "2026-11-30", "metrics": {}}))
    (a / "train.log").write_text("[2026-11-29 23:59:00,001][x][INFO] - start\n")
    (b / "final_metrics.json").write_text(json.dumps({"metrics": {}}))
    (b / "train.log").write_text("[2026-11-28 10:00:00,000][x][INFO] - start\nno date\n[2026-11-29 01:00:00,000][x]"
                                 "[INFO] - end\n")
    (c / "final_metrics.json").write_text(json.dumps({"metrics": {}}))
    for d in (a, b, c):
        for f in d.iterdir():
            os.utime(f, (0, 0))  # 1970: a file time must not show up
    assert (_run_date(str(a)), _run_date(str(b)), _run_date(str(c))) == ("2026-11-30", "2026-11-29", "")
