"""eval.bench_model hybrids (``--variants linear+linear+linear+flash``) and ``--vocab``, on CPU: the model is the
one the MQAR hybrid runs trained, bad specs fail with the option named, and the CSV joins in eval.recall's hybrid
report."""

import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

import train as train_mod  # the repo root is on sys.path (conftest.py there)
from attn_zoo.registry import Backend
from eval import bench_model as bm
from eval import recall
from test_recall_report import write_run

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def mqar_hybrid_layer_lists():
    """The ``model.layers`` lists swept by ``conf/experiment/mqar_hybrid.yaml`` (``choice([a,b,..],[..],...)``)."""
    exp = yaml.safe_load((CONF / "experiment" / "mqar_hybrid.yaml").read_text())
    choice = exp["hydra"]["sweeper"]["params"]["model.layers"]
    return [s.split(",") for s in re.findall(r"\[([^\]]+)\]", choice)]


def attention_conf(name):
    return yaml.safe_load((CONF / "attention" / f"{name}.yaml").read_text())


# --------------------------------------------------------------------------------------------- specs
def test_hybrid_layers_are_those_the_mqar_runs_trained():
    lists = mqar_hybrid_layer_lists()
    assert len(lists) == 9 and ["linear", "linear", "linear", "flash"] in lists
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for layers in lists:
            cfg = compose(config_name="train", overrides=["experiment=mqar_hybrid",
                                                          f"model.layers=[{','.join(layers)}]"])
            assert bm.variant_specs("small", "+".join(layers)) == train_mod.layer_specs(cfg), layers
    # the rest of the trained model is bench_model's small size at --vocab 8192
    small = bm.SIZES["small"]
    assert {k: cfg.model[k] for k in small} == small
    assert cfg.data.vocab_size == 8192 and cfg.data.seq_len == 256 and cfg.data.batch_size == 256

    lin, win, full = bm.variant_specs("small", "linear+sliding_window+flash+flash")[:3]
    assert win.kind == "sliding_window" and win.window_size == tuple(attention_conf("sliding_window")["window_size"])
    assert win.window_size[0] == 31  # conf: a 32-token causal window, not the plain variant's 1024
    assert lin.kind == "linear" and lin.feature_map == "elu1" == attention_conf("linear")["feature_map"]
    assert full.kind == "flash" and full.window_size is None
    # a plain name keeps the benchmark's own spec in every layer
    assert bm.variant_specs("small", "sliding_window") == [bm.make_spec(**bm.VARIANTS["sliding_window"])] * 4
    assert bm.variant_specs("small", "sliding_window")[0].window_size == (1023, 0)


def test_docstring_command_covers_the_mqar_hybrid_set():
    doc = bm.__doc__
    names = dict(re.findall(r"(\w)=(\w+)", re.search(r"L=linear; .*", doc).group(0)))
    v = re.search(r"V=(\S+)", doc).group(1)
    variants = [re.sub(r"\$(\w)", lambda m: names[m.group(1)], x) for x in v.split(",")]
    assert variants == ["+".join(layers) for layers in mqar_hybrid_layer_lists()]
    assert "--sizes small --vocab 8192 --tokens 65536" in doc and "--variants $V" in doc


def test_make_model_builds_the_hybrid_on_cpu_with_its_vocab():
    model = bm.make_model("small", "linear+linear+sliding_window+flash", 64, "torch", vocab=8192, device="cpu")
    assert [b.attn.spec.kind for b in model.blocks] == ["linear", "linear", "sliding_window", "flash"]
    assert model.specs == bm.variant_specs("small", "linear+linear+sliding_window+flash")
    assert model.config.vocab_size == 8192 and tuple(model.lm_head.weight.shape) == (8192, 128)
    x = torch.randint(0, 8192, (2, 64))
    logits, loss = model(x, x)
    loss.backward()
    assert logits.shape == (2, 64, 8192) and math.isfinite(loss.item())
    default = bm.make_model("small", "linear+linear+sliding_window+flash", 64, "torch", device="cpu")
    assert default.config.vocab_size == 256  # today's default
    assert model.num_params() - default.num_params() == (8192 - 256) * 128  # tied embedding / LM head


def test_bad_hybrids_name_the_option():
    with pytest.raises(ValueError, match=r"--variants: hybrid 'linear\+flash' has 2 layers but --sizes small has "
                                         r"n_layer=4"):
        bm.variant_specs("small", "linear+flash")
    with pytest.raises(ValueError, match=r"--variants: hybrid 'linear\+linear\+linear\+flash' has 4 layers but "
                                         r"--sizes large has n_layer=8"):
        bm.variant_specs("large", "linear+linear+linear+flash")
    with pytest.raises(ValueError, match=r"--variants: hybrid 'linear\+nope\+linear\+flash': model.layers\[1\]="
                                         r"'nope' .*allowed values: .*flash, .*linear, .*sliding_window"):
        bm.variant_specs("small", "linear+nope+linear+flash")
    with pytest.raises(ValueError, match=r"--variants: 'nope' not supported; allowed values: flash, sliding_window"):
        bm.variant_specs("small", "nope")
    # the CLI checks every variant at every size before it needs a GPU
    with pytest.raises(SystemExit, match=r"--variants: hybrid 'linear\+linear\+linear\+flash' has 4 layers but "
                                         r"--sizes large has n_layer=8"):
        bm.main(["--out", "unused", "--sizes", "small,large", "--variants", "flash,linear+linear+linear+flash"])


def test_backend_filter_runs_a_hybrid_only_where_every_layer_is_supported(monkeypatch):
    import attn_zoo.registry as registry

    real = registry.get_backends

    def exact_only(q, k, v, spec, return_lse=False):  # an SDPA-like anchor: softmax kinds, no window
        return None if spec.window_size is None else "no window"

    def get_backends(kind):  # the anchor is registered for the softmax kinds only, as SDPA is
        regs = dict(real(kind))
        if kind in ("flash", "sliding_window"):
            regs["exact"] = Backend(kind, "exact", fn=None, supports=exact_only)
        return regs

    monkeypatch.setattr(registry, "get_backends", get_backends)
    ok = lambda b, v: bm.runs_variant(b, v, "small", 256, 65536, device="cpu")  # noqa: E731
    assert ok("exact", "flash+flash+flash+flash") and ok("exact", "flash")
    assert not ok("exact", "linear+linear+linear+flash")  # no such backend for the linear layers
    assert not ok("exact", "sliding_window+sliding_window+sliding_window+flash")  # refused: the window layers
    assert not ok("exact", "flash+flash+flash+linear") and not ok("exact", "flash+sliding_window+flash+flash")
    assert not ok("exact", "linear")  # plain non-exact variants as before
    for v in ("linear+linear+linear+flash", "sliding_window+flash+flash+flash", "linear+linear+linear+linear"):
        assert ok("torch", v), v
    assert not ok("nope", "linear+linear+linear+flash")


# --------------------------------------------------------------------------------------------- CSV -> eval.recall
SPEED = {"linear+linear+linear+linear": (4.0e6, 900.0), "linear+linear+linear+flash": (3.0e6, 1100.0),
         "flash+flash+flash+flash": (1.5e6, 2000.0), "linear": (9.9e6, 1.0)}  # tokens/s, MiB (plain: a decoy)


def test_bench_model_csv_joins_the_hybrid_report(tmp_path, monkeypatch):
    import eval.bench_common as common

    calls = []

    def fake_bench_one(size, variant, seq_len, backend, tokens, steps, warmup, profile_dir=None, compile=False,
                       vocab=256, specs="bench"):  # bench_one's row, numbers made up
        calls.append(dict(variant=variant, seq_len=seq_len, backend=backend, vocab=vocab))
        tps, mem = SPEED[variant]
        B = tokens // seq_len
        return dict(size=size, variant=variant, seq_len=seq_len, backend=backend, batch=B, tokens_per_step=B * seq_len,
                    vocab=vocab, step_ms=B * seq_len / tps * 1e3, step_ms_min=1.0, tokens_per_s=tps,
                    peak_mem_mib=mem, n_params=2_000_000)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "env_info", lambda: {"gpu": "fake"})
    monkeypatch.setattr(bm, "bench_one", fake_bench_one)
    monkeypatch.setattr(bm, "check_case", lambda *a, **k: {"check_ok": True, "check_err": 0.0})  # no CUDA here
    monkeypatch.setattr(bm, "runs_variant", lambda backend, *a, **k: backend == "triton")
    rows = bm.main(["--out", str(tmp_path / "speed"), "--sizes", "small", "--vocab", "8192", "--tokens", "65536",
                    "--seq-lens", "256", "--backends", "triton,torch", "--variants", ",".join(SPEED), "--rounds", "1"])
    assert [c["vocab"] for c in calls] == [8192] * 4 and {c["backend"] for c in calls} == {"triton"}
    assert [r["variant"] for r in rows] == list(SPEED)
    csv_path = tmp_path / "speed" / "model_speed.csv"
    assert "linear+linear+linear+flash" in csv_path.read_text()

    root = tmp_path / "runs"
    for name, layers, acc in (("k0", ["linear"] * 4, 0.2), ("k1", ["linear"] * 3 + ["flash"], 0.5),
                              ("k2", ["linear"] * 2 + ["flash"] * 2, 0.8), ("k4", ["flash"] * 4, 0.99)):
        write_run(root, name, layers=layers, n_layer=4, seq_len=256, vals=[(10, {"acc": acc})])
    res = recall.run({"kind": "hybrid", "runs": [str(root)], "out_dir": str(tmp_path / "o"),
                      "speed": str(csv_path)})
    by_k = {r["k"]: r for r in res["rows"] if r["base"] == "linear"}
    for k, variant in ((0, "linear+linear+linear+linear"), (1, "linear+linear+linear+flash"),
                       (4, "flash+flash+flash+flash")):
        assert by_k[k]["tokens_per_s"] == pytest.approx(SPEED[variant][0]), k  # k = 0: the hybrid row, not "linear"
        assert by_k[k]["peak_mem_mb"] == pytest.approx(SPEED[variant][1]), k
        assert by_k[k]["speed_source"] == "bench_model"
    assert math.isnan(by_k[2]["tokens_per_s"]) and by_k[2]["speed_source"] == "none"  # no row: nothing made up
    assert not any("no hybrid rows" in n for n in res["notes"])


def test_plain_names_from_conf_match_what_train_py_trains():
    """``--specs conf``: a plain name takes ``conf/attention/<name>.yaml`` in every layer (the 32-token window the
    LM runs trained, not the speed sweep's 1,024), so its speed joins the training runs of that name; names outside
    VARIANTS (conf-only ones) are allowed; a bad ``specs`` value names the option."""
    win = bm.variant_specs("small", "sliding_window", "conf")
    assert len(win) == 4 and win[0].window_size == (31, 0) and win[0] != bm.make_spec(**bm.VARIANTS["sliding_window"])
    assert bm.variant_specs("small", "sliding_window", "conf") == bm.variant_specs(
        "small", "+".join(["sliding_window"] * 4))
    assert bm.variant_specs("small", "linear_taylor", "conf")[0].feature_map == "taylor"
    with pytest.raises(ValueError, match=r"--specs: 'yaml' not supported; allowed values: bench, conf"):
        bm.variant_specs("small", "flash", "yaml")
    with pytest.raises(ValueError, match=r"--variants: 'nope'"):
        bm.variant_specs("small", "nope", "conf")
