"""eval.bench_model's correctness check (:func:`eval.bench_model.check_case`, the ``check_ok`` / ``check_err``
columns) on CPU with the torch / reference backends on the small model's layers: correct backends pass, a wrong one
fails by the speed sweep's own rule, and the CLI checks every case once, outside the timed steps."""

import math

import pandas as pd
import pytest
import torch

from attn_zoo import attention
from attn_zoo.registry import register_backend, unregister_backend
from eval import bench_model as bm
from eval import sweep

KINDS = ("flash", "sliding_window", "linear")


@pytest.fixture
def wrong_backends():
    """``wide_window``: the window one key too wide (a plausible bug; right wherever the window covers every key);
    ``off_linear``: linear attention without its normaliser; ``raises``: fails on every call."""

    def wide(q, k, v, spec, return_lse=False):
        s = spec.replace(window_size=(spec.window_size[0] + 1, 0)) if spec.window_size else spec
        return attention(q, k, v, s, backend="reference")

    def off(q, k, v, spec, return_lse=False):
        out = attention(q, k, v, spec, backend="reference")
        return out * 1.5 if spec.family == "linear" else out

    def boom(q, k, v, spec, return_lse=False):
        raise RuntimeError("kernel launch failed")

    register_backend(KINDS, "wide_window", fn=wide, priority=None)
    register_backend(KINDS, "off_linear", fn=off, priority=None)
    register_backend(KINDS, "raises", fn=boom, priority=None)
    yield
    for name in ("wide_window", "off_linear", "raises"):
        unregister_backend(KINDS, name)


@pytest.mark.parametrize("variant,specs", [("flash", "bench"), ("gqa", "bench"), ("mqa", "bench"),
                                           ("sliding_window", "conf"), ("linear", "bench"),
                                           ("linear+linear+sliding_window+flash", "bench")])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_correct_backends_pass_the_check(variant, specs, backend):
    res = bm.check_case("small", variant, 128, backend, specs, device="cpu")
    assert res["check_ok"] is True, res
    assert 0 <= res["check_err"] < sweep.CHECK_TOL["bfloat16"] and "check_error" not in res
    f32 = bm.check_case("small", variant, 128, backend, specs, device="cpu", dtype=torch.float32)
    assert f32["check_ok"] and f32["check_err"] < 1e-4 < res["check_err"]  # bf16 inputs: a bf16-sized error


def test_wrong_backends_fail_and_the_check_is_the_sweeps(wrong_backends, monkeypatch):
    # the conf window (32 tokens) at N = 128: one key too wide is wrong; the bench window (1,024) covers every key
    bad = bm.check_case("small", "sliding_window", 128, "wide_window", "conf", device="cpu", dtype=torch.float32)
    assert bad["check_ok"] is False and bad["check_err"] > sweep.CHECK_TOL["float32"]
    assert bm.check_case("small", "sliding_window", 128, "wide_window", "bench", device="cpu")["check_ok"] is True
    lin = bm.check_case("small", "linear", 64, "off_linear", device="cpu")
    assert lin["check_ok"] is False and lin["check_err"] > 0.3
    # a hybrid fails when any of its attention layers does, with the largest error
    hyb = bm.check_case("small", "flash+linear+flash+flash", 64, "off_linear", device="cpu")
    assert hyb["check_ok"] is False and hyb["check_err"] == pytest.approx(lin["check_err"], rel=0.2)
    err = bm.check_case("small", "flash", 64, "raises", device="cpu")
    assert err["check_ok"] is False and math.isnan(err["check_err"])
    assert "RuntimeError: kernel launch failed" in err["check_error"]
    # only mixers (no attention layer through the backend): unchecked, no cells
    assert bm.check_case("small", "deltanet", 64, "torch", "conf", device="cpu") == {}
    # the tolerance is the sweep's (eval.sweep.CHECK_TOL by dtype, or --check-tol), not a copy of it
    ok = bm.check_case("small", "flash", 64, "torch", device="cpu")
    assert ok["check_ok"] and ok["check_err"] > 1e-6
    monkeypatch.setitem(sweep.CHECK_TOL, "bfloat16", 1e-6)
    assert bm.check_case("small", "flash", 64, "torch", device="cpu")["check_ok"] is False
    assert bm.check_case("small", "flash", 64, "torch", device="cpu", check_tol=0.05)["check_ok"] is True


def test_the_cli_checks_each_case_once_before_timing_and_writes_the_columns(tmp_path, monkeypatch):
    import eval.bench_common as common
    from eval.quality import read_bench

    calls = []

    def fake_check(size, variant, n, backend, specs="bench", **kw):
        calls.append(("check", variant, n, backend, kw.get("check_tol")))
        return {} if variant == "linear" else {"check_ok": backend != "sdpa_cudnn", "check_err": 0.5 if backend ==
                                               "sdpa_cudnn" else 0.01}

    def fake_bench(size, variant, seq_len, backend, tokens, steps, warmup, *a, **k):
        calls.append(("bench", variant, seq_len, backend, None))
        return dict(size=size, variant=variant, seq_len=seq_len, backend=backend, batch=1, tokens_per_step=tokens,
                    step_ms=10.0, tokens_per_s=tokens * 100.0, peak_mem_mib=1.0, n_params=1,
                    step_ms_reps="10.1;9.9;10.0")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "env_info", lambda: {"gpu": "fake"})
    monkeypatch.setattr(bm, "bench_one", fake_bench)
    monkeypatch.setattr(bm, "check_case", fake_check)
    monkeypatch.setattr(bm, "runs_variant",
                        lambda backend, variant, *a, **k: variant != "linear" or backend == "triton")
    argv = ["--sizes", "small", "--seq-lens", "256,512", "--backends", "triton,sdpa_cudnn",
            "--variants", "flash,linear", "--check-tol", "0.02"]
    bm.main(["--out", str(tmp_path / "a"), "--rounds", "1"] + argv)
    assert [c for c in calls if c[0] == "check"] == [("check", v, n, b, 0.02) for v, n, b in
                                                     (("flash", 256, "triton"), ("flash", 256, "sdpa_cudnn"),
                                                      ("flash", 512, "triton"), ("flash", 512, "sdpa_cudnn"),
                                                      ("linear", 256, "triton"), ("linear", 512, "triton"))]
    # each case: its checks, then its timings (one round: once each, in the backends' order)
    assert [c[0] + ":" + c[3] for c in calls[:4]] == ["check:triton", "check:sdpa_cudnn", "bench:triton",
                                                      "bench:sdpa_cudnn"]
    assert [c[0] for c in calls[8:10]] == ["check", "bench"] and calls[8][1:4] == calls[9][1:4] == ("linear", 256,
                                                                                                     "triton")
    df = read_bench(str(tmp_path / "a" / "model_speed.csv"))
    got = {(v, n, b): c for v, n, b, c in zip(df["variant"], df["seq_len"], df["backend"], df["check"])}
    assert got[("flash", 256, "triton")] == "passed" and got[("flash", 512, "sdpa_cudnn")] == "failed"
    assert got[("linear", 256, "triton")] == "unchecked" and set(df["step_reps"]) == {3}
    calls.clear()
    bm.main(["--out", str(tmp_path / "b"), "--no-check"] + argv)  # the default: 3 rounds in rotating order
    assert [c[3] for c in calls[:6]] == ["triton", "sdpa_cudnn", "sdpa_cudnn", "triton", "triton", "sdpa_cudnn"]
    assert calls and all(c[0] == "bench" for c in calls)
    raw = pd.read_csv(tmp_path / "b" / "model_speed.csv")
    assert "check_ok" not in raw.columns
    assert set(read_bench(str(tmp_path / "b" / "model_speed.csv"))["check"]) == {"unchecked"}
    assert set(raw["rounds"]) == {3} and set(raw["step_ms_reps"].str.count(";")) == {8}  # 3 rounds x 3 steps


def test_merge_rounds_takes_the_median_over_every_round():
    """--rounds: the row of a backend is the median step over all rounds, with the rounds' spread; a failed round
    makes the row that failure."""
    def r(reps, mem, **kw):
        t = [float(x) for x in reps.split(";")]
        return dict(backend="triton", tokens_per_step=1000, step_ms=sorted(t)[len(t) // 2], step_ms_min=min(t),
                    tokens_per_s=0, peak_mem_mib=mem, step_ms_reps=reps, **kw)

    row = bm.merge_rounds([r("10;11;12", 5.0), r("20;21;22", 7.0), r("12;13;14", 6.0)])
    assert row["step_ms"] == 13.0 and row["step_ms_min"] == 10.0 and row["tokens_per_s"] == round(1000 / 13.0 * 1e3)
    assert row["peak_mem_mib"] == 7.0 and row["rounds"] == 3 and row["step_ms_reps"].count(";") == 8
    assert row["step_ms_spread"] == pytest.approx((21 - 11) / 13.0, abs=1e-4)
    one = r("10;11;12", 5.0)
    assert bm.merge_rounds([one]) == one and "rounds" not in bm.merge_rounds([one])
    bad = bm.merge_rounds([r("10;11;12", 5.0), dict(backend="triton", error="OutOfMemoryError: x")])
    assert bad["error"].startswith("OutOfMemoryError") and bad["rounds"] == 1


@pytest.mark.parametrize("tol", ["0", "-0.1", "nan", "inf"])
def test_cli_refuses_a_check_tol_that_cannot_work(tol, monkeypatch):
    """--check-tol 0 fell back to the default in silence (``or``), a negative or nan one failed every case, inf
    passed every case: each is refused before any GPU work, naming the option."""
    monkeypatch.setattr(bm, "check_case", lambda *a, **k: pytest.fail("checked despite a bad --check-tol"))
    with pytest.raises(SystemExit, match=r"--check-tol must be a finite number > 0"):
        bm.main(["--out", "unused", "--sizes", "small", "--variants", "flash", "--check-tol", tol])
