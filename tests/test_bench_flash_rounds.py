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
