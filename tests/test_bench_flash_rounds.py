"""eval.bench_flash --rounds: each impl's forward and forward+backward timed again in rotating order across the impls
(eval.bench_common.interleaved_rounds), the median and its spread reported, so that a drift of the shared GPU is not
charged to whichever impl ran last. On the CPU with fake timers (the registry's torch and reference backends run
the cases)."""

import itertools

import pytest
import torch

from eval import bench_common as bc
from eval import bench_flash as bf


def test_interleaved_rounds_rotates_the_order_and_refuses_bad_rounds():
    calls = []
    timers = {n: (lambda n=n: (calls.append(n), float(len(calls)))[1]) for n in ("a", "b", "c")}
    out = bc.interleaved_rounds(timers, 3, start=1)
    assert calls == ["b", "c", "a", "c", "a", "b", "a", "b", "c"]  # each name at each position once
    assert out == {"a": [3.0, 5.0, 7.0], "b": [1.0, 6.0, 8.0], "c": [2.0, 4.0, 9.0]}
    assert bc.interleaved_rounds(timers, 0) == {"a": [], "b": [], "c": []}
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"rounds=.*allowed values: an integer >= 0"):
            bc.interleaved_rounds(timers, bad)


def test_median_spread():
    assert bc.median_spread([3.0, 1.0, 2.0]) == (2.0, 1.0)
    assert bc.median_spread([1.0, 2.0, 3.0, 4.0]) == (2.5, 3.0 / 2.5)
    assert bc.median_spread([2.0]) == (2.0, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        bc.median_spread([])


def _run_case(monkeypatch, rounds, impls=("torch", "reference")):
    """bench_case on the CPU for causal N 64, D 64, where every call to the timer returns the next of 1, 2, 3, ...
    ms (a GPU that slows down steadily); returns impl -> row."""
    clock = itertools.count(1)
    ran = []

    def fake_time(fn, grad_to_none=None, **_):
        fn()  # the timed call runs (its errors would surface)
        ran.append(1)
        return float(next(clock))

    monkeypatch.setattr(bf, "DEVICE", "cpu")
    monkeypatch.setattr(bf, "time_cuda", fake_time)
    monkeypatch.setattr(bf, "peak_memory", lambda fn: (fn(), 2**20)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    rows = []
    res = bf.bench_case("causal", 64, 64, list(impls), 128, False, rows, [0], rounds=rounds)
    assert len(rows) == len(impls) and all("error" not in r for r in rows), rows
    per_impl = 3 + 2 * (rounds - 1)  # fwd, bwd, fwd+bwd, then fwd and fwd+bwd again each round
    assert len(ran) == per_impl * len(impls)
    return res


def test_bench_case_rounds_share_a_drift_between_impls(monkeypatch):
    once = _run_case(monkeypatch, rounds=1)
    # back to back, the later impl pays the drift: fwd+bwd at 3 ms against 6 ms
    assert (once["torch"]["fwd_bwd_ms"], once["reference"]["fwd_bwd_ms"]) == (3.0, 6.0)
    assert "fwd_bwd_spread" not in once["torch"] and "rounds" not in once["torch"]
    three = _run_case(monkeypatch, rounds=3)
    # rounds 2 and 3 in rotated order: fwd at times 7 (reference), 8 (torch), then 9 (torch), 10 (reference);
    # fwd+bwd at 11 (reference), 12 (torch), 13 (torch), 14 (reference)
    t, r = three["torch"], three["reference"]
    assert (t["fwd_ms"], r["fwd_ms"]) == (8.0, 7.0)
    assert (t["fwd_bwd_ms"], r["fwd_bwd_ms"]) == (12.0, 11.0)
    assert t["rounds"] == r["rounds"] == 3
    assert t["fwd_bwd_spread"] == pytest.approx((13 - 3) / 12, abs=1e-4)
    assert t["fwd_bwd_rounds_ms"] == "3.0000;12.0000;13.0000" and r["fwd_rounds_ms"] == "4.0000;7.0000;10.0000"
    assert "fwd_bwd_rounds_ms" not in once["torch"]
    assert r["fwd_spread"] == pytest.approx((10 - 4) / 7, abs=1e-4)
    assert t["bwd_ms"] == 2.0  # the backward alone is timed once
    ratio_once = once["reference"]["fwd_bwd_ms"] / once["torch"]["fwd_bwd_ms"]
    ratio_three = r["fwd_bwd_ms"] / t["fwd_bwd_ms"]
    assert abs(ratio_three - 1) < abs(ratio_once - 1) / 5


def test_bench_flash_refuses_rounds_below_one():
    with pytest.raises(SystemExit, match=r"--rounds 0 is not supported; allowed values: an integer >= 1"):
        bf.main(["--rounds", "0"])


def test_bench_case_reports_each_impl_as_it_finishes(monkeypatch):
    """after_impl sees each impl's row as it is appended, in order and before the rounds (its first-round times, or
    its error), so main can write the files then: a run cut while a later anchor compiles keeps the earlier rows."""
    clock = itertools.count(1)
    monkeypatch.setattr(bf, "DEVICE", "cpu")
    monkeypatch.setattr(bf, "time_cuda", lambda fn, grad_to_none=None, **_: (fn(), float(next(clock)))[1])
    monkeypatch.setattr(bf, "peak_memory", lambda fn: (fn(), 2**20)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    rows, seen = [], []

    def after(row):
        assert rows[-1] is row  # appended first
        seen.append((row["impl"], row.get("fwd_bwd_ms"), "rounds" in row, "error" in row))

    res = bf.bench_case("causal", 64, 64, ["torch", "no_such_impl", "reference"], 128, False, rows, [0], rounds=2,
                        after_impl=after)
    assert [s[0] for s in seen] == ["torch", "no_such_impl", "reference"]
    assert seen[0] == ("torch", 3.0, False, False) and seen[2] == ("reference", 6.0, False, False)  # first round only
    assert seen[1][3] and "fwd_bwd_ms" not in rows[1]  # an impl that cannot run is reported as its error
    assert res["torch"]["rounds"] == 2  # the rounds still ran after the reports


def test_main_writes_the_files_as_each_impl_finishes(monkeypatch, capsys):
    """main hands bench_case a callback that prints a line and writes the CSV / JSON per impl (not only per case)."""
    writes = []

    def fake_case(*a, after_impl=None, **kw):
        rows = a[6]
        for impl in ("ours", "sdpa_cudnn"):
            rows.append(dict(variant="causal", N=512, D=64, impl=impl, fwd_bwd_tflops=1.5, compile_s=0.1))
            after_impl(rows[-1])
        return {}

    monkeypatch.setattr(bf, "require_cuda", lambda name: None)
    monkeypatch.setattr(bf, "bench_case", fake_case)
    monkeypatch.setattr(bf, "write_results", lambda rows, *a, **kw: writes.append(len(rows)))
    bf.main(["--D", "64", "--N", "512", "--variants", "causal", "--impls", "ours,sdpa_cudnn"])
    assert writes[:2] == [1, 2]  # after each impl, then after the case
    out = capsys.readouterr().out
    assert "  ours: causal  N=512 D=64: 1.5 TF/s fwd_bwd (first round)" in out and "  sdpa_cudnn: causal" in out
