"""sweep -> CSV -> crossover -> plots -> W&B (offline), end to end on tiny CPU sizes; failures recorded; resume."""

import glob
import json
import os
import time

import pytest
import torch

from eval import sweep as sw
from eval.crossover import run as crossover_run

TINY = {
    "name": "tiny",
    "device": "cpu",
    "dtype": "float32",
    "n_heads": 2,
    "tokens": 64,
    "seq_lens": [16, 32, 64],
    "head_dims": [8],
    "causal": [True],
    "kv_heads": [None],
    "modes": ["fwd", "bwd", "fwd_bwd"],
    "warmup": 0,
    "rep": 1,
    "variants": {"flash": {"kind": "flash"}, "linear": {"kind": "linear", "chunk_size": 8},
                 "sliding_window": {"kind": "sliding_window", "window_size": [7, 0]}},
    "backends": ["torch", "naive"],
    "exclude": [{"variant": "sliding_window", "backend": "naive"}],
    "baseline": {"variant": "flash", "backend": "torch"},
    "naive": {"variant": "flash", "backend": "naive"},
}

CALLS = {"count": 0}


@sw.register_bench_backend("test_oom")
def _oom_backend(spec, q, k, v):
    def fn(q, k, v):
        if q.shape[2] >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB (simulated)")
        return attn_torch(q, k, v, spec)

    return fn


@sw.register_bench_backend("test_broken")
def _broken_backend(spec, q, k, v):
    raise RuntimeError("backend exploded (simulated)")


@sw.register_bench_backend("test_counting")
def _counting_backend(spec, q, k, v):
    CALLS["count"] += 1
    return lambda q, k, v: attn_torch(q, k, v, spec)


def attn_torch(q, k, v, spec):
    from attn_zoo import attention

    return attention(q, k, v, spec, backend="torch")


@pytest.fixture(autouse=True)
def _wandb_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))


def test_failures_are_rows_and_the_sweep_continues(tmp_path):
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_oom", "test_broken", "torch"],
               seq_lens=[16, 32, 64])
    rows = sw.run_sweep(cfg, str(tmp_path / "k.csv"), progress=False)
    by = {(r["backend"], int(r["seq_len"])): r for r in rows}
    assert by[("test_oom", 16)]["status"] == "ok"
    assert by[("test_oom", 32)]["status"] == "oom" and "out of memory" in by[("test_oom", 32)]["error"]
    assert by[("test_oom", 64)]["status"] == "skipped"  # the series stops growing after an OOM
    assert all(by[("test_broken", n)]["status"] in ("error", "skipped") for n in (16, 32, 64))
    assert "exploded" in by[("test_broken", 16)]["error"]
    assert all(by[("torch", n)]["status"] == "ok" for n in (16, 32, 64))  # later backends still ran
    assert float(by[("torch", 64)]["fwd_bwd_ms"]) > 0


@pytest.mark.parametrize("change,want", [
    (dict(seq_lens=[0]), r"seq_lens=\[0\].*integers >= 1"), (dict(seq_lens=[]), r"seq_lens=\[\]"),
    (dict(head_dims=[0]), r"head_dims=\[0\]"), (dict(n_heads=3, kv_heads=[2]), r"kv_heads=\[2\].*divides n_heads=3"),
    (dict(dtype="float8"), r"dtype='float8'.*allowed values: float32, float16, bfloat16, float64"),
    (dict(device="tpu"), r"device='tpu'.*allowed values: cpu, cuda"),
    (dict(modes=["fwdd"]), r"modes=\['fwdd'\].*allowed values: fwd, bwd, fwd_bwd"),
    (dict(causal=["maybe"]), r"causal=\['maybe'\].*true / false"), (dict(rep=0), r"rep=0.*>= 1"),
    (dict(warmup=-1), r"warmup=-1.*>= 0"), (dict(tokens=-5), r"tokens=-5.*>= 1"), (dict(batch=1.5), r"batch=1.5"),
])
def test_bad_sweep_settings_are_refused_naming_the_key(tmp_path, change, want):
    """Bad axis values failed deep inside the run (ZeroDivisionError for seq_lens=[0], KeyError 'float8', a plot's
    'cannot be log-scaled' after measuring nothing for rep=0 / head_dims=[0] / modes=[fwdd] / causal=[maybe]):
    now refused before anything runs or is written."""
    out = tmp_path / "k.csv"
    with pytest.raises(ValueError, match=want):
        sw.run_sweep(dict(TINY, **change), str(out), progress=False)
    assert not out.exists()


def test_resume_skips_finished_points(tmp_path):
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_counting"], seq_lens=[16, 32])
    path = str(tmp_path / "k.csv")
    CALLS["count"] = 0
    sw.run_sweep(cfg, path, progress=False)
    assert CALLS["count"] == 2
    rows1 = sw.read_rows(path)
    cfg2 = dict(cfg, seq_lens=[16, 32, 64])  # extend the sweep: only the new point runs
    rows2 = sw.run_sweep(cfg2, path, progress=False)
    assert CALLS["count"] == 3
    assert len(rows2) == len(rows1) + 1
    sw.run_sweep(cfg2, path, progress=False, resume=False)  # start over: everything runs again
    assert CALLS["count"] == 6 and len(sw.read_rows(path)) == 3
    # retry_failed re-runs error / oom / skipped points only; readers keep the last row of a point
    broken = dict(cfg2, backends=["test_broken"])
    sw.run_sweep(broken, path, progress=False)
    assert sum(r["backend"] == "test_broken" for r in sw.read_rows(path)) == 3
    rows = sw.run_sweep(broken, path, progress=False, retry_failed=True)
    assert sum(r["backend"] == "test_broken" for r in sw.read_rows(path)) == 6
    assert len([r for r in rows if r["backend"] == "test_broken"]) == 3 and CALLS["count"] == 6


@pytest.mark.parametrize("change,want", [
    (dict(dtype="float64"), r"dtype: float32 in the CSV, float64 now \(2 points\)"),
    (dict(tokens=128), r"batch \(tokens // seq_len, or batch\): 4 in the CSV, 8 now \(1 point\)"),
    (dict(batch=3), r"batch .*: 2 in the CSV, 3 now"),
    (dict(modes=["fwd"]), r"modes: \[\"fwd\",\"bwd\",\"fwd_bwd\"\] in the CSV, \[\"fwd\"\] now"),
    (dict(rep=3), r"rep: 1 in the CSV, 3 now"), (dict(warmup=2), r"warmup: 0 in the CSV, 2 now"),
    (dict(repeats=2), r"repeats: 1 in the CSV, 2 now"), (dict(n_heads=4), r"n_heads: 2 in the CSV, 4 now"),
    (dict(check=True), r"check: False in the CSV, True now"),
    (dict(variants={"flash": {"kind": "flash", "softmax_scale": 0.5}}), r"variants.flash: .* in the CSV, .*0.5.* now"),
])
def test_resume_reuses_a_point_only_measured_with_the_same_settings(tmp_path, change, want, capsys):
    """A resumed sweep matched points on their key alone (variant, backend, N, D, causal, Hkv): with another dtype,
    tokens (batch), modes, warmup / rep, ... nothing was measured and the old rows were reported as the new sweep's.
    Now resume refuses, naming each differing setting, before anything runs or is written; the same settings reuse
    the points and say how many."""
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_counting"], seq_lens=[16, 32])
    path = str(tmp_path / "k.csv")
    CALLS["count"] = 0
    sw.run_sweep(cfg, path, progress=False)
    assert CALLS["count"] == 2
    before = open(path).read()
    sw.run_sweep(cfg, path, progress=False)  # the same settings: reused, and said so
    assert CALLS["count"] == 2 and "resume: 2 of 2 points reused" in capsys.readouterr().out
    with pytest.raises(sw.SweepSettingsChanged, match=want) as e:
        sw.run_sweep(dict(cfg, **change), path, progress=False)
    assert "another output folder" in str(e.value) and "resume=false" in str(e.value)
    assert CALLS["count"] == 2 and open(path).read() == before  # nothing measured, nothing written
    sw.run_sweep(dict(cfg, **change), path, progress=False, resume=False)  # start over: measured again
    assert CALLS["count"] == 4


def test_resume_checks_the_settings_an_older_csv_recorded(tmp_path):
    """A CSV written before the ``settings`` column: its dtype / device / n_heads / batch columns are compared."""
    import pandas as pd

    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_counting"], seq_lens=[16, 32])
    path = tmp_path / "k.csv"
    sw.run_sweep(cfg, str(path), progress=False)
    df = pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=["settings"])
    df.to_csv(path, index=False)
    with pytest.raises(sw.SweepSettingsChanged, match=r"dtype: float32 in the CSV, float16 now"):
        sw.run_sweep(dict(cfg, dtype="float16"), str(path), progress=False)
    with pytest.raises(sw.SweepSettingsChanged, match=r"batch .*: 2 in the CSV, 16 now"):
        sw.run_sweep(dict(cfg, tokens=512), str(path), progress=False)
    CALLS["count"] = 0
    sw.run_sweep(dict(cfg, rep=5), str(path), progress=False)  # not recorded there: not compared
    assert CALLS["count"] == 0


def test_model_sweep_resume_needs_the_same_settings(tmp_path):
    mcfg = {"name": "m", "device": "cpu", "variants": {"flash": {"kind": "flash"}}, "backends": ["torch"],
            "seq_lens": [16], "tokens": 32, "d_model": 16, "n_layer": 1, "n_heads": 2, "vocab_size": 32,
            "warmup": 0, "rep": 1}
    path = str(tmp_path / "m.csv")
    sw.run_model_sweep(mcfg, path, progress=False)
    with pytest.raises(sw.SweepSettingsChanged, match=r"d_model: 16 in the CSV, 32 now"):
        sw.run_model_sweep(dict(mcfg, d_model=32), path, progress=False)
    with pytest.raises(ValueError, match=r"backends=\['trition'\]: 'trition' is not registered; allowed values: auto"):
        sw.run_model_sweep(dict(mcfg, backends=["trition"]), path, progress=False)


def test_crossover_refuses_to_report_old_rows_as_a_new_sweep(tmp_path):
    from harness.config import ConfigError

    out = tmp_path / "res"
    base = {"out_dir": str(out), "progress": False, "model_sweep": False, "plots": False, "wandb": {"enabled": False}}
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}, "linear": {"kind": "linear", "chunk_size": 8}},
               backends=["torch"], seq_lens=[16, 32])
    crossover_run(dict(base, sweep=cfg))
    with pytest.raises(ConfigError, match=r"(?s)resume: 4 of the 4 points .* dtype: float32 in the CSV, float64 now"):
        crossover_run(dict(base, sweep=dict(cfg, dtype="float64")))
    # points outside this sweep's grid count too: a re-analysis reads every row of the CSV as one sweep
    with pytest.raises(ConfigError, match=r"dtype: float32 in the CSV, float64 now"):
        crossover_run(dict(base, sweep=dict(cfg, dtype="float64", seq_lens=[64])))


def test_end_to_end_pipeline(tmp_path):
    out = tmp_path / "res"
    res = crossover_run({"sweep": TINY, "out_dir": str(out), "progress": False, "machine": "a100",
                         "model_sweep": False, "wandb": {"enabled": True, "mode": "offline", "group": "test"}})
    # CSV / JSON results
    rows = sw.read_rows(str(out / "kernel.csv"))
    assert len(rows) == 3 * 2 * 3 - 3  # variants x backends x N minus the excluded points
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"]
    assert all(float(r["fwd_ms"]) > 0 and float(r["bwd_ms"]) > 0 and float(r["fwd_bwd_ms"]) > 0 for r in rows)
    assert all(float(r["fwd_bwd_tflops"]) > 0 and float(r["model_footprint_bytes"]) > 0 for r in rows)
    cross = json.load(open(out / "crossover.json"))
    assert cross["env"]["torch"] == torch.__version__
    metrics = {(c["reference"], c["variant"], c["backend"], c["metric"]) for c in cross["rows"]}
    assert ("exact", "linear", "torch", "fwd_bwd_ms") in metrics
    assert ("naive", "flash", "torch", "fwd_ms") in metrics
    assert ("exact", "sliding_window", "torch", "model_footprint_bytes") in metrics  # CPU: modelled memory
    from eval.crossover import STATUS_NODATA, STATUSES

    for c in cross["rows"]:  # any status but "insufficient data" (CPU timings may also win, then lose)
        assert c["status"] in STATUSES and c["status"] != STATUS_NODATA, c["status"]
    assert (out / "crossover.csv").stat().st_size > 0
    # figures: PNG + SVG, non-empty
    for name in ("time_vs_n_fwd_bwd", "time_vs_n_fwd", "memory_vs_n", "roofline"):
        for ext in ("png", "svg"):
            p = out / f"{name}.{ext}"
            assert p.exists() and p.stat().st_size > 2000, p
    # W&B offline run holds the tables and the images
    wdir = res["wandb_dir"]
    assert wdir and os.path.basename(wdir).startswith("offline-run-")
    tables = glob.glob(os.path.join(wdir, "files", "media", "table", "*.table.json"))
    kt = [t for t in tables if os.path.basename(t).startswith("kernel_table")]
    assert kt and any(os.path.basename(t).startswith("crossover_table") for t in tables)
    tab = json.load(open(kt[0]))
    assert "fwd_bwd_ms" in tab["columns"] and len(tab["data"]) == len(rows)
    assert glob.glob(os.path.join(wdir, "files", "media", "images", "**", "*.png"), recursive=True)


def test_hydra_config_composes():
    from hydra import compose, initialize_config_dir

    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eval", "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        for name in ("cpu_tiny", "speed_h200"):
            cfg = compose(config_name="crossover", overrides=[f"sweep={name}"])
            assert cfg.sweep.name == name and cfg.out_dir == f"results/{name}"
            pts = sw.expand_points(dict(cfg.sweep))
            assert pts and all(p["seq_len"] in list(cfg.sweep.seq_lens) for p in pts)
        pc = compose(config_name="plots", overrides=["results_dir=x"])
        assert pc.results_dir == "x"
        qc = compose(config_name="quality")
        assert qc.wandb.mode == "auto"


def _compose_sweep(overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eval", "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="crossover", overrides=overrides)
    return cfg.sweep, OmegaConf.to_container(cfg.sweep, resolve=True)


def test_exclude_rules_count_and_hydra_config_objects_give_the_same_points():
    # list values inside an OmegaConf node (ListConfig) mean "any of" too: dict(cfg.sweep) == to_container
    for name, n in (("cpu_tiny", 5 * 3 * 3 - 3 * 3), ("speed_h200", 108)):
        node, plain = _compose_sweep([f"sweep={name}"])
        assert sw.expand_points(dict(node)) == sw.expand_points(plain) and len(sw.expand_points(plain)) == n
    assert len(sw.expand_points(dict(plain, exclude=[]))) == 5 * 7 * 7  # speed_h200 without its rules


def test_exclude_rule_semantics():
    p = {"variant": "flash", "backend": "flex", "seq_len": 1024, "head_dim": 64, "causal": True, "n_kv_heads": 4}
    m = sw.rule_matches
    assert m({}, p)  # an empty rule matches every point
    assert m({"backend": "flex"}, p) and not m({"backend": "naive"}, p)
    assert m({"backend": "flex", "head_dim": 64}, p) and not m({"backend": "flex", "head_dim": 128}, p)  # every key
    assert m({"backend": ["naive", "flex"], "variant": ["flash"]}, p)  # list = any of
    assert not m({"backend": ["naive", "flex"], "variant": ["linear", "sparse"]}, p)
    assert m({"backend": ("flex",)}, p) and not m({"variant": "flash_x"}, p)  # a tuple is a list, a str is not
    assert m({"min_seq_len": 1024, "max_seq_len": 1024}, p)  # inclusive bounds
    assert not m({"min_seq_len": 1025}, p) and not m({"max_seq_len": 1023}, p)
    assert m({"causal": True, "n_kv_heads": [1, 4]}, p) and not m({"causal": False}, p)
    cfg = dict(TINY, backends=["torch", "naive"], exclude=[{"backend": "naive", "min_seq_len": 32},
                                                          {"variant": ["linear", "sliding_window"], "seq_len": 16}])
    got = {(q["variant"], q["backend"], q["seq_len"]) for q in sw.expand_points(cfg)}
    assert ("flash", "naive", 16) in got and ("flash", "naive", 32) not in got
    assert ("linear", "torch", 16) not in got and ("linear", "torch", 32) in got
    assert len(got) == 3 * 2 * 3 - 3 * 2 - 2 * 2
    with pytest.raises(ValueError, match="unknown key.*'seqlen'"):  # a misspelt key is an error, not a no-op
        sw.expand_points(dict(TINY, exclude=[{"backend": "naive", "seqlen": 16}]))


def test_run_last_moves_backends_to_the_end_in_order():
    cfg = dict(TINY, exclude=[], backends=["naive", "torch"], seq_lens=[16, 32])
    order = [q["backend"] for q in sw.expand_points(dict(cfg, run_last=["naive"]))]
    assert order == ["torch"] * 6 + ["naive"] * 6
    assert [q["backend"] for q in sw.expand_points(cfg)][:2] == ["naive", "naive"]  # without: config order


def test_hydra_overrides_edit_the_grid():
    # what docs/crossover.md shows: grid edits from the command line, exclude rules replaced
    _, cfg = _compose_sweep(["sweep=cpu_tiny", "sweep.seq_lens=[32,64]", "sweep.backends=[torch,naive]",
                             "~sweep.variants.gqa", "~sweep.variants.sparse",
                             "sweep.exclude=[{backend:naive,variant:[linear,sliding_window]}]"])
    pts = [(q["variant"], q["backend"], q["seq_len"]) for q in sw.expand_points(cfg)]
    assert len(pts) == 3 * 2 * 2 - 2 * 2 and ("flash", "naive", 64) in pts and ("linear", "naive", 32) not in pts


def _fake_run(root, i, data, variant, seq_len, acc, bpb, step_time):
    run = root / f"{i}_{data}_{variant}_{seq_len}"
    (run / ".hydra").mkdir(parents=True)
    (run / "csv").mkdir()
    target = "harness.data.MQARDataModule" if data == "mqar" else "harness.data.TextDataModule"
    (run / ".hydra" / "config.yaml").write_text(
        f"data:\n  _target_: {target}\n  seq_len: {seq_len}\n  vocab_size: {128 if data == 'mqar' else 256}\n"
        f"attention:\n  name: {variant}\n  kind: flash\nmodel:\n  layers: null\nexperiment_name: cq\nseed: 0\n")
    lines = ["epoch,perf/peak_mem_mb,perf/step_time_s,perf/tokens_per_s,step,val/acc,val/bpb,val/loss"]
    for s in range(1, 6):
        lines.append(f"0,{100 + seq_len},{step_time},{seq_len * 16 / step_time},{s},,,")
    lines.append(f"0,,,,5,{acc},{'' if data == 'mqar' else bpb},{bpb * 0.69}")
    (run / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_quality_join_leaders_and_figures(tmp_path):
    from eval.quality import run as quality_run

    root = tmp_path / "multirun"
    i = 0
    # MQAR: exact is accurate but slow (time ~ n); linear is fast and mediocre: the leader per second changes
    for n in (64, 128, 256, 512):
        _fake_run(root, i, "mqar", "flash", n, 0.9, 1.0, 0.001 * n); i += 1
        _fake_run(root, i, "mqar", "linear", n, 0.3, 1.0, 0.08); i += 1
        _fake_run(root, i, "text", "flash", n, 0.5, 2.0, 0.001 * n); i += 1
        _fake_run(root, i, "text", "linear", n, 0.5, 2.5, 0.2); i += 1
    res = quality_run({"runs": [str(root)], "out_dir": str(tmp_path / "q"),
                       "wandb": {"enabled": True, "mode": "offline"}})
    assert len(res["runs"]) == 16 and len(res["agg"]) == 16
    mqar = [r for r in res["leaders"] if r["dataset"] == "mqar"]
    assert [r["leader"] for r in mqar if r["kind"] == "leader"] == ["flash", "flash", "linear", "linear"]
    cross = [r for r in mqar if r["kind"] == "crossover"]
    # flash: 0.9 / (0.001 n) = linear: 0.3 / 0.08 at n = 240
    assert len(cross) == 1 and cross[0]["leader"] == "flash -> linear"
    assert cross[0]["n_star"] == pytest.approx(240, rel=1e-6)
    text = [r for r in res["leaders"] if r["dataset"] == "text" and r["kind"] == "crossover"]
    # text quality per second: flash (8 - 2) / (0.001 n) = linear (8 - 2.5) / 0.2 at n = 218.2
    assert len(text) == 1 and text[0]["status"] == "crossover"
    assert text[0]["n_star"] == pytest.approx(6.0 / 0.001 / 27.5, rel=1e-6)
    for name in ("quality_vs_n", "bubble_mqar", "bubble_text"):
        png = tmp_path / "q" / f"{name}.png"
        assert png.exists() and png.stat().st_size > 2000
    assert res["wandb_dir"] and glob.glob(os.path.join(res["wandb_dir"], "files", "media", "table", "leaders*.json"))


@pytest.mark.parametrize("variant", [{"kind": "flash"}, {"kind": "sliding_window", "window_size": (5, 0)},
                                     {"kind": "sparse", "block_size": 8}, {"kind": "linear"},
                                     {"kind": "flash", "causal": False}])
def test_bench_backends_compute_the_variant(variant):
    """The sweep's own baselines (naive, SDPA) compute the same function as the reference."""
    from attn_zoo import attention, make_spec

    spec = make_spec(**variant)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 32, 8, generator=g)
    k = torch.randn(2, 2, 32, 8, generator=g)  # GQA, Hkv = 2
    v = torch.randn(2, 2, 32, 8, generator=g)
    ref = attention(q, k, v, spec, backend="reference")
    for name in ("naive", "sdpa_math"):
        try:
            fn = sw.BENCH_BACKENDS[name].build(spec, q, k, v)
        except sw.Unsupported:
            assert name.startswith("sdpa") and spec.kind != "flash"
            continue
        torch.testing.assert_close(fn(q, k, v), ref, atol=1e-5, rtol=1e-5)


def test_reanalysis_keeps_the_measured_sweep_settings(tmp_path):
    """``run_sweep=false`` re-analyses what ``out_dir`` holds: ``env.json`` keeps where (GPU, versions, date) and how
    (the sweep config, e.g. its ``deadline_s``) the points were measured, not the settings of the re-analysis."""
    out = tmp_path / "res"
    small = dict(TINY, variants={"flash": {"kind": "flash"}, "linear": {"kind": "linear", "chunk_size": 8}},
                 backends=["torch"], seq_lens=[16, 32])  # what a crossover needs (test_end_to_end_pipeline: all)
    crossover_run({"sweep": dict(small, deadline_s=175), "out_dir": str(out), "progress": False,
                   "model_sweep": False, "plots": False, "wandb": {"enabled": False}, "date": "2026-12-01"})
    crossover_run({"sweep": dict(small, deadline_s=None), "out_dir": str(out), "progress": False, "plots": False,
                   "run_sweep": False, "wandb": {"enabled": False}, "date": "2030-01-01"})
    env = json.load(open(out / "env.json"))["env"]
    assert env["sweep"]["deadline_s"] == 175 and env["date"] == "2026-12-01"


FIRST_CALLS = {}


@sw.register_bench_backend("test_slow_first_call")
def _slow_first_call(spec, q, k, v):
    """A backend whose first call on each shape is slow (as compilation / autotuning is), then fast."""

    def fn(q, k, v):
        key = tuple(q.shape)
        if key not in FIRST_CALLS:
            FIRST_CALLS[key] = True
            time.sleep(2.0)  # well over max_point_s below, which itself leaves room for a loaded CI machine
        return attn_torch(q, k, v, spec)

    return fn


def test_max_point_s_does_not_count_the_first_call(tmp_path):
    """A series whose first call per N is slow (fla's autotuning took 149 s on the H200) keeps growing N when its
    timed calls are fast; a series whose timed calls are slow still stops."""
    FIRST_CALLS.clear()
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_slow_first_call"], seq_lens=[16, 32, 64],
               max_point_s=1.5)
    rows = sw.run_sweep(cfg, str(tmp_path / "k.csv"), progress=False)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"], [r["error"] for r in rows]
    rows = sw.run_sweep(dict(cfg, backends=["torch"], max_point_s=1e-6), str(tmp_path / "t.csv"), progress=False)
    assert [r["status"] for r in rows] == ["ok", "skipped", "skipped"]
    assert "first calls" in rows[1]["error"] and "max_point_s" in rows[1]["error"]


def test_max_point_s_does_not_count_the_untimed_check(tmp_path):
    """With ``check: true`` the correctness check is the backend's first call on a point's inputs (fla autotuned
    there on the H200 and its series stopped at N = 1k): it is untimed work and does not count against max_point_s."""
    FIRST_CALLS.clear()
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_slow_first_call"], seq_lens=[16, 32],
               max_point_s=1.5, check=True, modes=["fwd", "bwd", "fwd_bwd"])
    rows = sw.run_sweep(cfg, str(tmp_path / "k.csv"), progress=False)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert [int(r["seq_len"]) for r in rows] == [16, 32]
    assert all(str(r["check_ok"]) == "True" for r in rows)  # the check ran (it was the slow first call)
    assert len(FIRST_CALLS) == 2  # one slow first call per N


BWD_FIRST_CALLS = {}


class _SlowFirstBackward(torch.autograd.Function):
    """Identity whose first backward per shape is slow (a backward kernel's compile / autotune)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if tuple(g.shape) not in BWD_FIRST_CALLS:
            BWD_FIRST_CALLS[tuple(g.shape)] = True
            time.sleep(2.0)
        return g


@sw.register_bench_backend("test_slow_first_backward")
def _slow_first_backward(spec, q, k, v):
    return lambda q, k, v: _SlowFirstBackward.apply(attn_torch(q, k, v, spec))


def test_max_point_s_does_not_count_the_first_backward_in_bwd_only_mode(tmp_path):
    """``modes: [bwd]`` has no fwd_bwd first call to pay the backward's compile: its first backward is untimed too,
    so a slow first backward does not stop the series (and the backward is still timed)."""
    BWD_FIRST_CALLS.clear()
    cfg = dict(TINY, variants={"flash": {"kind": "flash"}}, backends=["test_slow_first_backward"], seq_lens=[16, 32],
               max_point_s=1.5, modes=["bwd"])
    rows = sw.run_sweep(cfg, str(tmp_path / "b.csv"), progress=False)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert all(float(r["bwd_ms"]) < 1500 for r in rows)  # the slow first backward is not in the timing either
    assert len(BWD_FIRST_CALLS) == 2
