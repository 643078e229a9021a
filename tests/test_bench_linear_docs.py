"""eval/bench_linear.py --docs glue on the CPU (the timing replaced, the kernels under the Triton interpreter): every
method runs, the check compares each method with documents against the fp32 reference, and the rows and files come
out. fla is made absent (its row is missing and the run goes on)."""

import json
import os
import time
import types

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import eval.bench_linear as bl  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_docs_checks_every_method_and_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "time_cuda", lambda fn, grad_to_none=None, **k: (fn(), 2.0)[1])
    monkeypatch.setattr(bl, "peak_memory", lambda fn: 0)

    def no_fla(cu):
        raise ImportError("fla made absent by the test")

    monkeypatch.setattr(bl, "_fla_varlen", no_fla)
    args = types.SimpleNamespace(docs="fixed:24,geometric:20", docs_tokens=[72], docs_torch=True,
                                 docs_variants=False, no_check=False, time_budget_s=1e9, out=str(tmp_path),
                                 prefix="linear", rounds=3)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = bl.bench_docs(args, dev, torch.float32, 2, 16, time.time(), {"gpu": None})
    ours = [r for r in rows if r["method"] == "ours_docs"]
    assert [r["docs"] for r in ours] == ["fixed:24", "geometric:20"]
    assert ours[0]["n_docs"] == 3 and ours[0]["x_ours_nodocs_fwd_bwd"] == 1.0
    assert all(r["rounds"] == 3 and r["fwd_bwd_spread"] == 0.0 for r in rows)  # every method timed 3 times
    for r in rows:
        if r["method"] == "ours_nodocs":
            assert "rel_err_out" not in r
        else:  # with documents: checked against the reference, forward and every gradient
            for what in ("out", "dq", "dk", "dv"):
                assert r[f"rel_err_{what}"] < 1e-5, (r["method"], what)
    data = json.load(open(tmp_path / "linear_docs_bench.json"))
    assert len(data["rows"]) == len(rows) and len(data["env"]["checks"]) == 4
    assert (tmp_path / "linear_docs_bench.csv").exists()


def test_bench_docs_refuses_a_bad_distribution_before_running(tmp_path):
    args = types.SimpleNamespace(docs="fixed:24,poisson:3", docs_tokens=[72], docs_torch=False, docs_variants=False,
                                 no_check=True, time_budget_s=1e9, out=str(tmp_path), prefix="linear",
                                 rounds=1)
    with pytest.raises(ValueError, match="poisson:3"):
        bl.bench_docs(args, "cpu", torch.float32, 1, 16, time.time(), {})


def test_bench_taylor_checks_every_method_and_writes_its_files(tmp_path, monkeypatch, capsys):
    """--taylor: ours parallel / chunked / fused chunked (taylor_chunk) / auto / torch each checked against the fp32 reference (output and every
    gradient) and timed; fla absent (no rows, the run goes on); the speedup columns and files come out."""
    times = {"ours_parallel": 3.0, "ours_chunked": 2.0}
    current = {}

    def fake_bench_one(name, fn, leaves, B, H, N, D):
        current["name"] = name
        return real_bench_one(name, fn, leaves, B, H, N, D)

    real_bench_one = bl.bench_one
    monkeypatch.setattr(bl, "bench_one", fake_bench_one)
    monkeypatch.setattr(bl, "time_cuda", lambda fn, grad_to_none=None, **k: (fn(), times.get(current["name"], 4.0))[1])
    monkeypatch.setattr(bl, "peak_memory", lambda fn: 0)
    import importlib

    real_im = importlib.import_module

    def no_fla(name, *a):
        if name == "fla" or name.startswith("fla."):
            raise ImportError("fla made absent by the test")
        return real_im(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_fla)
    args = types.SimpleNamespace(heads=2, taylor_dim=16, taylor_dv=24, taylor_ns=[32, 48], tokens=64, methods="all",
                                 no_check=False, time_budget_s=1e9, out=str(tmp_path), prefix="linear", rounds=1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = bl.bench_taylor(args, dev, torch.float32, time.time(), {"gpu": None})
    assert sorted({(r["N"], r["B"]) for r in rows}) == [(32, 2), (48, 1)]
    names = {r["method"] for r in rows}
    assert names == {"ours_parallel", "ours_chunked", "ours_taylor_chunk", "ours_auto", "torch"}, names
    for r in rows:
        for what in ("out", "dq", "dk", "dv"):
            assert r[f"rel_err_{what}"] < 1e-4, (r["method"], what, r[f"rel_err_{what}"])
        assert r["Dv"] == 24 and r["D"] == 16 and "fwd_bwd_tflops" not in r
    chunked = [r for r in rows if r["method"] == "ours_chunked"]
    assert all(r["x_parallel_over_chunked_fwd_bwd"] == 1.5 for r in chunked)
    auto = [r for r in rows if r["method"] == "ours_auto"]
    assert all(r["auto_backend"] == ("torch" if dev == "cpu" else "parallel") for r in auto)
    data = json.load(open(tmp_path / "linear_taylor_bench.json"))
    assert len(data["rows"]) == len(rows) and len(data["env"]["checks"]) == 10
    assert data["env"]["taylor_chunked_min_n"] > 48
    assert "fla_parallel_based unavailable" in capsys.readouterr().out


def test_more_rounds_shares_a_drift_between_methods(monkeypatch):
    """--rounds: after one back-to-back pass (a at 1 ms, b at 2 ms on a GPU that slows by 1 ms per timing), the
    rounds in rotated order give both the same median: the drift is no longer charged to the later method."""
    clock = iter(range(3, 100))
    monkeypatch.setattr(bl, "time_cuda", lambda fn, grad_to_none=None, **k: (fn(), float(next(clock)))[1])
    x = torch.randn(2, 3, requires_grad=True)
    methods = {"a": (lambda: x * 2, [x]), "b": (lambda: x * 3, [x], True), "c": (lambda: x * 4, [x])}
    case = [dict(method="a", B=1, H=1, N=8, D=4, fwd_ms=1.0, fwd_bwd_ms=1.0, fwd_bwd_tflops=0.0),
            dict(method="b", B=1, H=1, N=8, D=4, fwd_ms=2.0, fwd_bwd_ms=2.0),
            dict(method="c", error="OutOfMemoryError", fwd_ms=float("nan"))]
    bl.more_rounds(case, methods, 1)
    assert case[0]["fwd_ms"] == 1.0 and "rounds" not in case[0]  # one round: unchanged
    bl.more_rounds(case, methods, 3)
    a, b, c = case
    # fwd: b 3, a 4 (rotated), then a 5, b 6; fwd+bwd: b 7, a 8, then a 9, b 10
    assert (a["fwd_ms"], b["fwd_ms"]) == (4.0, 3.0) and (a["fwd_bwd_ms"], b["fwd_bwd_ms"]) == (8.0, 7.0)
    assert a["rounds"] == b["rounds"] == 3 and "rounds" not in c  # a method that failed is not timed again
    assert a["fwd_bwd_spread"] == pytest.approx((9 - 1) / 8)
    assert a["fwd_bwd_tflops"] > 0 and "fwd_bwd_tflops" not in b
    assert x.grad is None
