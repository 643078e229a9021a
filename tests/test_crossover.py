"""Crossover detection on synthetic curves with known n*, and the c2 / c_lin fit."""

import math

import numpy as np
import pytest

from eval.crossover import (STATUS_AHEAD_THEN_BEHIND, STATUS_ALWAYS, STATUS_CROSS, STATUS_NEVER, STATUS_NODATA,
                            STATUSES, constants_crossover, detect_crossovers, find_crossover, fit_constant_per_token,
                            fit_quadratic_per_token)

NS = [2**i for i in range(8, 16)]  # 256 .. 32768


def _power(ns, c, p):
    return [c * n**p for n in ns]


@pytest.mark.parametrize("n_star", [300.0, 1200.0, 5000.0, 20000.0])
def test_power_laws_cross_exactly_in_log_log(n_star):
    # baseline ~ n^2, variant ~ n: straight lines in log-log, so log-log interpolation is exact
    base = _power(NS, 1.0, 2)
    var = _power(NS, n_star, 1)  # equal at n = n_star
    res = find_crossover(NS, var, NS, base)
    assert res["status"] == STATUS_CROSS
    assert res["n_star"] == pytest.approx(n_star, rel=1e-9)
    assert res["crossings"][-1][1] == "variant_wins"


def test_no_crossover_cases_are_explicit():
    base = _power(NS, 1.0, 2)
    slower = [2 * b for b in base]
    res = find_crossover(NS, slower, NS, base)
    assert res["status"] == STATUS_NEVER and math.isnan(res["n_star"])
    assert res["ratio_at_max"] == pytest.approx(2.0)
    faster = [0.5 * b for b in base]
    res = find_crossover(NS, faster, NS, base)
    assert res["status"] == STATUS_ALWAYS and math.isnan(res["n_star"])
    assert find_crossover([], [], NS, base)["status"] == STATUS_NODATA
    # disjoint lengths -> nothing to compare
    assert find_crossover([3, 5], [1, 1], [2, 4], [1, 1])["status"] == STATUS_NODATA


def test_nan_and_failed_points_are_dropped():
    base = _power(NS, 1.0, 2)
    var = _power(NS, 1200.0, 1)
    var[-1] = float("nan")  # e.g. an OOM at the largest N
    var[0] = -1.0
    res = find_crossover(NS, var, NS, base)
    assert res["status"] == STATUS_CROSS and res["n_star"] == pytest.approx(1200.0, rel=1e-9)
    assert res["points"] == len(NS) - 2


def test_crossing_and_crossing_back():
    # variant wins only in the middle of the range: no n* (it does not stay ahead), the status says it ends behind,
    # the lengths it is ahead between are given, both crossings are listed (was: "crossover" with n* ~ 362)
    ns = [256, 512, 1024, 2048, 4096]
    base = [1.0, 1.0, 1.0, 1.0, 1.0]
    var = [2.0, 0.5, 0.5, 0.5, 2.0]
    res = find_crossover(ns, var, ns, base)
    assert res["status"] == STATUS_AHEAD_THEN_BEHIND
    assert math.isnan(res["n_star"])
    assert [d for _, d in res["crossings"]] == ["variant_wins", "baseline_wins"]
    assert res["ahead_from"] == pytest.approx(math.exp(math.log(256) + 0.5 * math.log(2)), rel=1e-9)
    assert res["ahead_until"] == pytest.approx(math.exp(math.log(2048) + 0.5 * math.log(2)), rel=1e-9)


@pytest.mark.parametrize("t_a,ahead_from,ahead_until", [
    ([0.5, 0.5, 2, 2, 2], 256, None),  # ahead from the first length, behind from ~724 (was: "baseline faster")
    ([0.5, 2, 1, 1, 1], 256, None),  # ahead, behind, then equal: ends behind (was: "baseline faster")
    ([1, 0.5, 2, 2, 2], 256, None),  # equal, ahead, behind: ahead from the last equal length
    ([2, 0.5, 2, 0.5, 2], None, None),  # wins and loses twice, ends behind (was: "crossover" at the first win)
    ([2, 0.5, 1, 1, 2], None, 1024),  # equal lengths, then behind: not ahead from the first equal length on
])
def test_ahead_then_behind_is_its_own_status(t_a, ahead_from, ahead_until):
    """A variant ahead somewhere but behind at the largest lengths has no n* and says so, with where it is ahead;
    before, a win then a loss read "crossover" with the first winning length as n*, and one ahead from the first
    length then behind read "no crossover in range (baseline faster)" (never ahead)."""
    N = [256, 512, 1024, 2048, 4096]
    r = find_crossover(N, t_a, N, [1] * 5)
    assert r["status"] == STATUS_AHEAD_THEN_BEHIND, r
    assert math.isnan(r["n_star"])
    assert r["crossings"][-1][1] == "baseline_wins" and r["ahead_until"] == r["crossings"][-1][0]
    assert N[0] <= r["ahead_from"] < r["ahead_until"] <= N[-1]
    if ahead_from is not None:
        assert r["ahead_from"] == ahead_from
    if ahead_until is not None:
        assert r["ahead_until"] == ahead_until
    assert STATUS_AHEAD_THEN_BEHIND in STATUSES


def test_ahead_then_behind_reaches_every_text():
    """The status and where the variant is ahead reach the crossover table, its text, the plot legend / n* table,
    the best-vs-best markdown and the quality n* cells; no n* star anywhere."""
    from eval.best import conclusion, format_nstar_markdown
    from eval.crossover import CROSSOVER_COLUMNS, format_crossovers, status_note
    from eval.plots import STATUS_SHORT, crossover_note
    from eval.quality import NSTAR_COLUMNS as Q_COLUMNS
    from eval.quality import _nstar_cell

    ns = [512, 1024, 2048, 4096, 8192]
    # the variant is 2x faster from 1k to 2k, 2x slower at 512 and from 4k on
    rows = (_rows("flash", "triton", ns, [1.0] * 5)
            + _rows("mid", "triton", ns, [2.0, 0.5, 0.5, 2.0, 2.0]))
    out = detect_crossovers(rows, {"exact": {"variant": "flash", "backend": "triton"}}, modes=("fwd",))
    r = [x for x in out if x["variant"] == "mid" and x["metric"] == "fwd_ms"][0]
    assert r["status"] == STATUS_AHEAD_THEN_BEHIND and math.isnan(r["n_star"])
    assert 512 < r["ahead_from"] < 1024 and 2048 < r["ahead_until"] < 4096
    assert {"ahead_from", "ahead_until"} <= set(CROSSOVER_COLUMNS)
    text = format_crossovers(out, "fwd_ms")
    line = [x for x in text.splitlines() if x.startswith("mid/")][0]
    assert "ahead then behind" in line and f"ahead only in [{r['ahead_from']:.0f}, {r['ahead_until']:.0f}]" in line
    assert status_note(r) in line
    # a row read back from crossover.csv (strings) says the same
    assert status_note({k: str(v) for k, v in r.items()}) == status_note(r)
    note = crossover_note(r, 8192)
    assert note.startswith("faster only at N≈") and note.endswith("slower after") and "n*" not in note
    assert STATUS_SHORT[STATUS_AHEAD_THEN_BEHIND]  # every status has its short label
    assert set(STATUS_SHORT) == set(STATUSES) - {STATUS_CROSS}
    start = dict(r, ahead_from=512.0)  # ahead from the first compared length
    assert crossover_note(start, 8192).startswith("faster only up to N≈")
    cmp = {"variant": "mid", "head_dim": 64, "n_kv_heads": 2, "shift": float("nan"),
           "ours_impl_variant": "triton", "ours_impl_baseline": "triton", "best_impl_variant": "triton",
           "best_impl_baseline": "triton", "ours_check": "-", "best_check": "-"}
    for tag in ("ours", "best"):
        cmp.update({f"{tag}_{k}": r[k] for k in ("status", "n_star", "ahead_from", "ahead_until")},
                   **{f"{tag}_{k}": float("nan") for k in ("lo", "hi")})
        assert {f"{tag}_ahead_from", f"{tag}_ahead_until"} <= set(Q_COLUMNS)
    md = format_nstar_markdown([cmp])
    assert md.count("ahead only in [") == 2
    assert "ahead only in [" in conclusion(cmp)
    assert _nstar_cell(cmp, "ours", short=True) == f"ahead only in [{r['ahead_from']:.0f}, {r['ahead_until']:.0f}]"
    assert _nstar_cell(cmp, "ours") == status_note(r)


def test_best_interval_does_not_count_ahead_then_behind_as_crossing():
    """eval.best's bootstrap counts a resample as crossing only when the variant stays ahead (was: a win then a
    loss counted, with its first winning length as n*)."""
    from eval.best import nstar_interval

    ns = [512, 1024, 2048, 4096]
    rows = [{"variant": v, "backend": "triton", "seq_len": str(n), "head_dim": "64", "causal": "True",
             "n_kv_heads": "2", "status": "ok", "fwd_bwd_ms": repr(t)}
            for v, ts in (("flash", [1.0] * 4), ("mid", [2.0, 0.5, 0.5, 2.0])) for n, t in zip(ns, ts)]
    r = nstar_interval(rows, ("mid", 64, True, 2), ("flash", 64, True, 2), n_boot=5)
    assert r["status"] == STATUS_AHEAD_THEN_BEHIND and math.isnan(r["n_star"]) and r["p_cross"] == 0
    assert 512 < r["ahead_from"] < 1024 and 2048 < r["ahead_until"] < 4096


def test_fit_c2_c_lin_recovers_constants():
    c0, c2, c_lin = 3e-3, 2e-6, 7e-3  # per-token: exact c0 + c2 n, linear c_lin
    ns = [512, 1024, 2048, 4096, 8192]
    tb = [c0 + c2 * n for n in ns]
    a0, a2 = fit_quadratic_per_token(ns, tb)
    assert a0 == pytest.approx(c0, rel=1e-9) and a2 == pytest.approx(c2, rel=1e-9)
    tl = [c_lin * (1 + 0.3 / (n / 512)) for n in ns]  # overhead that decays with n
    assert fit_constant_per_token(ns, tl) == pytest.approx(c_lin * (1 + 0.3 / 8), rel=1e-9)  # median of upper half
    fit = constants_crossover(ns, tb, ns, [c_lin] * len(ns))
    assert fit["n_star_const"] == pytest.approx(c_lin / c2)
    assert fit["n_star_fit"] == pytest.approx((c_lin - c0) / c2)
    # the interpolated crossing of the total times agrees with the fitted one
    res = find_crossover(ns, [c_lin] * len(ns), ns, tb)
    assert res["status"] == STATUS_CROSS
    assert res["n_star"] == pytest.approx((c_lin - c0) / c2, rel=0.05)
    with pytest.raises(ValueError, match="two"):
        fit_quadratic_per_token([1024], [1.0])


def test_noisy_fit_is_close():
    rng = np.random.default_rng(0)
    ns = np.array([256, 512, 1024, 2048, 4096, 8192, 16384])
    c2 = 1e-6
    tb = c2 * ns * (1 + 0.03 * rng.standard_normal(len(ns)))
    _, a2 = fit_quadratic_per_token(ns, tb)
    assert a2 == pytest.approx(c2, rel=0.1)


def test_the_fit_is_the_least_squares_solution_in_the_same_bits_whatever_the_order():
    """The fit is the weighted least-squares solution (against numpy's lstsq, 1e-11 relative) and its bits do not
    depend on the order of the points or on a BLAS (exact sums): the committed crossover tables are rebuilt the same
    on every CPU (np.linalg.lstsq moved their last digits with the machine's OpenBLAS kernels)."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        ns = np.sort(rng.choice([2.0 ** i for i in range(7, 16)], int(rng.integers(2, 8)), replace=False))
        tb = np.abs((rng.uniform(1e-4, 1e-2) + rng.uniform(1e-8, 1e-6) * ns) * (1 + 0.1 * rng.standard_normal(len(ns))))
        A = np.stack([np.ones_like(ns), ns], 1) / tb[:, None]
        want = np.linalg.lstsq(A, np.ones_like(tb), rcond=None)[0]
        got = fit_quadratic_per_token(ns, tb)
        assert got == pytest.approx(tuple(want), rel=1e-11)
        perm = rng.permutation(len(ns))
        assert fit_quadratic_per_token(ns[perm], tb[perm]) == got  # the same bits


def _rows(variant, backend, ns, times, mem=None, hkv=2, status="ok"):
    kind = "linear" if variant == "linear" else "flash"
    return [{"variant": variant, "kind": kind, "backend": backend, "seq_len": str(n), "head_dim": "64",
             "causal": "True", "n_kv_heads": str(hkv), "status": status, "fwd_ms": repr(t), "bwd_ms": repr(2 * t),
             "fwd_bwd_ms": repr(3 * t), "tokens": "16384",
             "peak_mem_bytes": repr(m) if m is not None else "", "model_footprint_bytes": "1"}
            for n, t, m in zip(ns, times, mem or [None] * len(ns))]


def test_detect_crossovers_table():
    # fixed tokens per step (B * N = const, as in the sweep): exact time ~ n, linear time constant
    ns = [512, 1024, 2048, 4096, 8192]
    rows = (_rows("flash", "triton", ns, [n * 1e-3 for n in ns], [n * 1.0 for n in ns])
            + _rows("linear", "triton", ns, [1.5 for n in ns], [n * 0.5 for n in ns])
            + _rows("flash", "naive", ns, [2 * n * 1e-3 for n in ns], [n * n * 1.0 for n in ns])
            + _rows("gqa", "triton", ns, [0.9 * n * 1e-3 for n in ns], hkv=1)
            + _rows("linear", "torch", ns[:2], [1.0, 1.0], status="oom"))
    out = detect_crossovers(rows, {"exact": {"variant": "flash", "backend": "triton"},
                                   "naive": {"variant": "flash", "backend": "naive"}})
    get = {(r["reference"], r["variant"], r["backend"], r["metric"]): r for r in out}
    lin = get[("exact", "linear", "triton", "fwd_bwd_ms")]
    assert lin["status"] == STATUS_CROSS and lin["n_star"] == pytest.approx(1500, rel=1e-6)
    assert lin["n_star_const"] == pytest.approx(1500, rel=0.05)  # per-token constants give the same n*
    assert get[("exact", "linear", "triton", "peak_mem_bytes")]["status"] == STATUS_ALWAYS
    assert get[("exact", "flash", "naive", "fwd_ms")]["status"] == STATUS_NEVER
    assert "n_star_const" not in get[("exact", "flash", "naive", "fwd_ms")]  # c_lin only for sub-quadratic kinds
    assert get[("naive", "flash", "triton", "fwd_ms")]["status"] == STATUS_ALWAYS
    g = get[("exact", "gqa", "triton", "fwd_ms")]
    assert g["status"] == STATUS_ALWAYS and g["baseline_n_kv_heads"] == 2  # GQA compared with the MHA curve
    assert not any(r["backend"] == "torch" for r in out)  # failed series have no ok points


@pytest.mark.parametrize("t_a,status,n_star", [
    ([1, 1, 1, 1, 1], "equal in whole range", None),  # was "no crossover in range (baseline faster)"
    ([1, 1, 0.5, 0.5, 0.5], "crossover", 512),  # equal, then ahead: n* at the last equal length (was: never)
    ([2, 2, 2, 2, 1], "no crossover in range (baseline faster)", None),  # behind, then equal (was: n* ~4.1k)
    ([0.5, 0.5, 1, 0.5, 0.5], "variant faster in whole range", None),  # never behind (was: never)
    ([2, 1, 1, 0.5, 0.5], "crossover", 1024),  # behind, equal, ahead: from the last equal length
    ([4, 2, 1.5, 0.5, 0.25], "crossover", None),  # an interpolated crossing between 1k and 2k, as before
])
def test_find_crossover_with_equal_lengths(t_a, status, n_star):
    """Exact ties (common for modelled memory) counted as crossings only when they were sign changes away from
    zero: an all-equal pair read "baseline faster" and a variant behind then equal got an n*."""
    from eval.crossover import find_crossover

    N = [256, 512, 1024, 2048, 4096]
    r = find_crossover(N, t_a, N, [1] * 5)
    assert r["status"] == status, r
    if n_star is not None:
        assert r["n_star"] == n_star
    elif status == "crossover":
        assert 1024 < r["n_star"] < 2048
    else:
        assert r["n_star"] != r["n_star"]  # NaN


@pytest.mark.parametrize("scale", [1e-200, 1e-80, 1e80, 1e200])
def test_fit_quadratic_per_token_any_time_scale(scale):
    """The normal equations multiply four weights 1 / t: times below ~1e-77 or above ~1e77 (in whatever unit) gave
    det = inf or 0 and a ValueError claiming two distinct lengths were missing; lstsq fitted them."""
    n = [1024, 2048, 4096]
    c0, c2 = fit_quadratic_per_token(n, [scale * (1 + x / 1000) for x in n])
    assert c0 == pytest.approx(scale, rel=1e-9) and c2 == pytest.approx(scale / 1000, rel=1e-9)
