"""``compare=best``: every crossover measured on the fastest correct implementation of each side.

Per variant and sequence length (and head dim, causality, K/V heads), the *best* implementation is the fastest
backend of the same sweep run (:mod:`eval.sweep`) whose point is ``ok`` and passed the correctness check
(``check_ok``; rows of a sweep run without ``check: true`` count as unchecked and are taken, and say so). Its name
travels with every number: ``impl`` on each picked row, ``impl_variant`` / ``impl_baseline`` (per-N summaries such
as ``fa4 (1k-16k)`` or ``flex_fa4 @1k; fa4 @2k-16k``) on every n*.

n* is reported both ways -- ours vs ours (the best of ``ours``, default our kernels ``triton`` / ``parallel``, on
both sides) and best vs best -- each with a bootstrap interval: every point's repeated timings (``<metric>_reps``,
the sweep's ``repeats``) are resampled with replacement, the median taken, the best implementation picked again
(the pick may change between resamples), and the crossover (:func:`eval.crossover.find_crossover`) recomputed.
The interval is the central ``level`` quantile range of the resampled n* that cross; ``p_cross`` is the fraction
of resamples with a crossover. ``shift`` = n*(best) / n*(ours): how far the conclusion moves.

Entry: ``python -m eval.crossover sweep=<sweep> compare=best`` (writes ``best.csv``, ``crossover_best.csv``,
``nstar_compare.csv`` and the ``best_time_vs_n`` figure next to ``crossover.csv``), or :func:`analyse_best`.
"""

from __future__ import annotations

import math
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from eval.crossover import STATUS_CROSS, _b, _f, find_crossover, status_note

OURS = ("triton", "parallel", "taylor_chunk")
SERIES = ("variant", "head_dim", "causal", "n_kv_heads")


def _key(r: dict) -> tuple:
    return (str(r["variant"]), int(_f(r["head_dim"])), _b(r["causal"]), int(_f(r["n_kv_heads"])))


def check_state(r: dict) -> str:
    """``"passed"``, ``"failed"`` or ``"unchecked"`` (no ``check_ok`` cell: a run without ``check: true``)."""
    c = r.get("check_ok")
    if c is None or (isinstance(c, float) and math.isnan(c)) or str(c).strip() in ("", "nan", "None"):
        return "unchecked"
    return "passed" if _b(c) else "failed"


def eligible(r: dict, metric: str = "fwd_bwd_ms") -> bool:
    """An ``ok`` row with a positive finite ``metric`` that did not fail the correctness check."""
    t = _f(r.get(metric))
    return r.get("status") == "ok" and t > 0 and math.isfinite(t) and check_state(r) != "failed"


def repeats(r: dict, metric: str = "fwd_bwd_ms") -> np.ndarray:
    """The repeated timings of ``metric`` (``<metric>_reps``, ';'-joined), else the single value."""
    cell = r.get(f"{metric}_reps")
    vals = []
    if isinstance(cell, str) and cell.strip():
        for x in cell.split(";"):
            v = _f(x)
            if v > 0 and math.isfinite(v):
                vals.append(v)
    return np.array(vals if vals else [_f(r.get(metric))], dtype=np.float64)


def _short(n) -> str:
    """N for a label: ``1k``, ``16k`` (multiples of 1024), else the integer (``640``); ``n`` a number or a CSV cell."""
    n = int(round(_f(n)))
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def impl_summary(picks: Sequence[Tuple[float, str]]) -> str:
    """``[(N, impl), ...]`` -> ``"fa4 (1k-16k)"`` when one implementation wins at every N, else runs joined by
    ``"; "``: ``"flex_fa4 @1k; fa4 @2k-16k"``."""
    picks = sorted(picks)
    if not picks:
        return "-"
    runs: List[List] = []
    for n, impl in picks:
        if runs and runs[-1][0] == impl:
            runs[-1][2] = n
        else:
            runs.append([impl, n, n])
    if len(runs) == 1:
        impl, a, b = runs[0]
        return f"{impl} ({_short(a)}-{_short(b)})" if a != b else f"{impl} ({_short(a)})"
    return "; ".join(f"{i} @{_short(a)}" + (f"-{_short(b)}" if a != b else "") for i, a, b in runs)


def pick_best(rows: Iterable[dict], metric: str = "fwd_bwd_ms", backends: Optional[Sequence[str]] = None,
              label: str = "best") -> List[dict]:
    """One row per (variant, N, D, causal, Hkv): a copy of the fastest eligible row (:func:`eligible`) among
    ``backends`` (``None`` = all), with ``backend=label``, ``impl`` = the winner, ``impl_check`` = its check state and
    ``candidates`` = ``"impl:ms"`` of every eligible one, fastest first. Groups without an eligible row are left out."""
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        if backends is not None and r.get("backend") not in backends:
            continue
        if not eligible(r, metric):
            continue
        groups.setdefault(_key(r) + (int(_f(r["seq_len"])),), []).append(r)
    out = []
    for g, cands in sorted(groups.items()):
        cands = sorted(cands, key=lambda r: _f(r[metric]))
        w = dict(cands[0])
        w.update(backend=label, impl=cands[0]["backend"], impl_check=check_state(cands[0]),
                 candidates=";".join(f"{c['backend']}:{_f(c[metric]):.4g}" for c in cands))
        out.append(w)
    return out


def _series_points(rows: Sequence[dict], key: tuple, backends: Optional[Sequence[str]], metric: str):
    """``{N: [(impl, reps), ...]}`` of the eligible rows of one series among ``backends``."""
    pts: Dict[int, List[Tuple[str, np.ndarray]]] = {}
    for r in rows:
        if _key(r) != key or (backends is not None and r.get("backend") not in backends) or not eligible(r, metric):
            continue
        pts.setdefault(int(_f(r["seq_len"])), []).append((str(r["backend"]), repeats(r, metric)))
    return pts


def _best_curve(pts, rng=None):
    """``(ns, times, impls)`` of the best implementation per N (medians; resampled when ``rng`` is given)."""
    ns, ts, impls = [], [], []
    for n in sorted(pts):
        best = None
        for impl, reps in pts[n]:
            sample = reps if rng is None else rng.choice(reps, size=len(reps), replace=True)
            t = float(np.median(sample))
            if best is None or t < best[0]:
                best = (t, impl)
        ns.append(float(n))
        ts.append(best[0])
        impls.append(best[1])
    return ns, ts, impls


def nstar_interval(rows: Sequence[dict], variant_key: tuple, baseline_key: tuple, metric: str = "fwd_bwd_ms",
                   variant_backends: Optional[Sequence[str]] = None,
                   baseline_backends: Optional[Sequence[str]] = None, n_boot: int = 1000, level: float = 0.95,
                   seed: int = 0) -> dict:
    """n* of the variant series ``variant_key`` (variant, D, causal, Hkv) against the baseline series, each side
    the best of its backends per N, with a bootstrap interval over the repeated timings (module docstring).

    Returns ``status``, ``n_star`` (from the medians), ``ahead_from`` / ``ahead_until`` (ahead then behind again:
    where the variant is ahead, :func:`eval.crossover.find_crossover`), ``lo`` / ``hi`` (NaN when fewer than 2 resamples cross),
    ``p_cross``, ``impl_variant`` / ``impl_baseline`` (:func:`impl_summary`), ``ratio_at_max``, ``points``, ``reps``
    (the fewest repeats behind any point: 1 = no interval from repeats)."""
    pv = _series_points(rows, variant_key, variant_backends, metric)
    pb = _series_points(rows, baseline_key, baseline_backends, metric)
    nv, tv, iv = _best_curve(pv)
    nb, tb, ib = _best_curve(pb)
    res = find_crossover(nv, tv, nb, tb)
    common = set(nv) & set(nb)
    out = {"status": res["status"], "n_star": res["n_star"], "ahead_from": res["ahead_from"],
           "ahead_until": res["ahead_until"], "ratio_at_max": res["ratio_at_max"],
           "points": res["points"],
           "impl_variant": impl_summary([(n, i) for n, i in zip(nv, iv) if n in common]),
           "impl_baseline": impl_summary([(n, i) for n, i in zip(nb, ib) if n in common]),
           "lo": float("nan"), "hi": float("nan"), "p_cross": float("nan"), "reps": 0}
    all_reps = [len(r) for p in (pv, pb) for n in p if n in common for _, r in p[n]]
    out["reps"] = min(all_reps) if all_reps else 0
    if not common:
        return out
    rng = np.random.default_rng(seed)
    stars = []
    for _ in range(int(n_boot)):
        a = _best_curve(pv, rng)
        b = _best_curve(pb, rng)
        r = find_crossover(a[0], a[1], b[0], b[1])
        stars.append(r["n_star"] if r["status"] == STATUS_CROSS else float("nan"))
    stars = np.array(stars, dtype=np.float64)
    ok = stars[np.isfinite(stars)]
    out["p_cross"] = float(len(ok) / len(stars)) if len(stars) else float("nan")
    if len(ok) >= 2:
        q = (1 - level) / 2
        out["lo"], out["hi"] = (float(x) for x in np.quantile(ok, [q, 1 - q]))
    return out


def baseline_key_for(rows: Sequence[dict], baseline_variant: str, key: tuple) -> Optional[tuple]:
    """The baseline series for a variant series: same D and causality, same Hkv when measured, else its MHA one."""
    cands = {_key(r) for r in rows if str(r["variant"]) == baseline_variant}
    cands = [c for c in cands if c[1] == key[1] and c[2] == key[2]]
    if not cands:
        return None
    same = [c for c in cands if c[3] == key[3]]
    return same[0] if same else max(cands, key=lambda c: c[3])


def compare_nstar(rows: Sequence[dict], baseline_variant: str = "flash", ours: Sequence[str] = OURS,
                  metric: str = "fwd_bwd_ms", n_boot: int = 1000, level: float = 0.95, seed: int = 0,
                  variants: Optional[Sequence[str]] = None) -> List[dict]:
    """n* of every variant series against ``baseline_variant``, ours vs ours and best vs best (each with its
    interval and the implementations on each side), and ``shift`` = n*(best) / n*(ours)."""
    keys = sorted({_key(r) for r in rows if r.get("status") == "ok"})
    out = []
    for key in keys:
        if key[0] == baseline_variant or (variants is not None and key[0] not in variants):
            continue
        bkey = baseline_key_for(rows, baseline_variant, key)
        if bkey is None:
            continue
        row = dict(zip(SERIES, key), baseline=baseline_variant, baseline_n_kv_heads=bkey[3], metric=metric,
                   level=level)
        for tag, backs in (("ours", list(ours)), ("best", None)):
            r = nstar_interval(rows, key, bkey, metric, backs, backs, n_boot, level, seed)
            row.update({f"{tag}_{k}": v for k, v in r.items()})
        a, b = _f(row["ours_n_star"]), _f(row["best_n_star"])
        row["shift"] = b / a if a > 0 and b > 0 else float("nan")
        row["conclusion"] = conclusion(row)
        out.append(row)
    return out


def _fmt_n(x) -> str:
    x = _f(x)
    return "-" if not math.isfinite(x) else f"{x:,.0f}"


def fmt_interval(n, lo, hi) -> str:
    """``"1,234 [1,100-1,400]"``, ``"1,234"`` without an interval, ``"-"`` without n*."""
    if not math.isfinite(_f(n)):
        return "-"
    if math.isfinite(_f(lo)) and math.isfinite(_f(hi)):
        return f"{_fmt_n(n)} [{_fmt_n(lo)}-{_fmt_n(hi)}]"
    return _fmt_n(n)


def conclusion(row: dict) -> str:
    """One line: how far n* moves from ours vs ours to best vs best, and whether the intervals overlap."""
    a, b = _f(row.get("ours_n_star")), _f(row.get("best_n_star"))
    if not (math.isfinite(a) and math.isfinite(b)):
        return f"ours vs ours: {status_note(row, 'ours_')}; best vs best: {status_note(row, 'best_')}"
    move = f"n* moves {b / a:.2f}x ({_fmt_n(a)} -> {_fmt_n(b)})"
    lo_a, hi_a, lo_b, hi_b = (_f(row.get(k)) for k in ("ours_lo", "ours_hi", "best_lo", "best_hi"))
    if all(math.isfinite(x) for x in (lo_a, hi_a, lo_b, hi_b)):
        move += "; intervals " + ("overlap" if lo_b <= hi_a and lo_a <= hi_b else "separate")
    return move


NSTAR_COLUMNS = ("variant", "head_dim", "causal", "n_kv_heads", "baseline", "baseline_n_kv_heads", "metric",
                 "ours_status", "ours_n_star", "ours_ahead_from", "ours_ahead_until", "ours_lo", "ours_hi",
                 "ours_p_cross", "ours_impl_variant", "ours_impl_baseline", "best_status", "best_n_star",
                 "best_ahead_from", "best_ahead_until", "best_lo", "best_hi", "best_p_cross",
                 "best_impl_variant", "best_impl_baseline", "shift", "ours_reps", "best_reps", "level", "conclusion")


def format_nstar_markdown(table: Sequence[dict]) -> str:
    """Markdown: one line per variant series with n* both ways, the intervals and the implementations named."""
    lines = ["| variant | D | Hkv | n* ours vs ours | ours (variant / exact) | n* best vs best | best (variant / exact) "
             "| shift |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(
            f"| {r['variant']} | {r['head_dim']} | {r['n_kv_heads']} | "
            f"{fmt_interval(r['ours_n_star'], r['ours_lo'], r['ours_hi']) if r['ours_status'] == STATUS_CROSS else status_note(r, 'ours_')} | "
            f"{r['ours_impl_variant']} / {r['ours_impl_baseline']} | "
            f"{fmt_interval(r['best_n_star'], r['best_lo'], r['best_hi']) if r['best_status'] == STATUS_CROSS else status_note(r, 'best_')} | "
            f"{r['best_impl_variant']} / {r['best_impl_baseline']} | "
            f"{'-' if not math.isfinite(_f(r['shift'])) else format(_f(r['shift']), '.2f') + 'x'} |")
    return "\n".join(lines)


def plot_best(best_rows: Sequence[dict], path: str, metric: str = "fwd_bwd_ms", title: Optional[str] = None,
              formats: Sequence[str] = ("png",)) -> List[str]:
    """Time vs N of the best implementation of each variant series (log-log), each point labelled with the
    implementation that stood there (:mod:`eval.figspec`). Returns the files written."""
    from eval import figspec

    ser: Dict[tuple, List[dict]] = {}
    for r in best_rows:
        ser.setdefault(_key(r), []).append(r)
    p = figspec.Panel("", "sequence length N", f"{metric} (best correct implementation)", xlog=2, ylog=True,
                      legend=True)
    for i, (key, pts) in enumerate(sorted(ser.items())):
        pts = sorted(pts, key=lambda r: _f(r["seq_len"]))
        xs, ys = [_f(r["seq_len"]) for r in pts], [_f(r[metric]) for r in pts]
        label = f"{key[0]} (D {key[1]}, Hkv {key[3]}): {impl_summary([(x, r['impl']) for x, r in zip(xs, pts)])}"
        p.traces.append(figspec.Trace(label, xs, ys, {"color": f"C{i % 10}", "marker": "o"},
                                      text=[r["impl"] for r in pts], meta={"variant": key[0]}))
    return figspec.to_png(figspec.Figure(title or "best implementation per variant and N", [p], ncols=1,
                                         panel_w=8, panel_h=5), path, formats=formats)


def _default(value, default):
    """``value``, or ``default`` where it is None (not where it is 0: ``n_boot=0`` is refused, never 1000)."""
    return default if value is None else value


def check_bootstrap(n_boot, level=None, n_boot_key: str = "n_boot", level_key: str = "level") -> None:
    """The bootstrap settings of the n* intervals (:func:`nstar_interval`): ``n_boot`` null (the default, 1000) or an
    integer >= 1 (resamples; 0 was taken as the default and a negative count made no resample, an interval of NaN),
    ``level`` null (0.95) or a number in (0, 1). Raises ``ValueError`` naming the key (``n_boot_key``, e.g.
    ``--n-boot``) and the allowed values."""
    sep = " " if n_boot_key.startswith("-") else "="
    if n_boot is not None and not (isinstance(n_boot, int) and not isinstance(n_boot, bool) and n_boot >= 1):
        raise ValueError(f"{n_boot_key}{sep}{n_boot!r}: must be an integer >= 1 (bootstrap resamples)")
    if level is not None and not (isinstance(level, (int, float)) and not isinstance(level, bool) and 0 < level < 1):
        raise ValueError(f"{level_key}={level!r}: must be a number in (0, 1), e.g. 0.95")


def analyse_best(out_dir: str, sweep_cfg: dict, plots: bool = True, formats: Sequence[str] = ("png",),
                 prefix: str = "") -> dict:
    """``compare=best`` on ``<out_dir>/kernel.csv``: ``best.csv`` (the picked rows, ``impl`` named),
    ``crossover_best.csv`` (:func:`eval.crossover.detect_crossovers` on them against the best exact baseline),
    ``nstar_compare.csv`` (:func:`compare_nstar`) and the ``best_time_vs_n`` figure. Sweep config keys: ``baseline``
    (its ``variant``), ``ours`` (default ``[triton, parallel]``), ``best_metric`` (default ``fwd_bwd_ms``, else the
    first mode's), ``n_boot`` (1000), ``level`` (0.95); a bad ``n_boot`` / ``level`` raises ``ValueError``
    (:func:`check_bootstrap`) before anything is written."""
    from eval.bench_common import write_csv
    from eval.crossover import CROSSOVER_COLUMNS, detect_crossovers
    from eval.sweep import columns_of, latest_rows, read_rows

    check_bootstrap(sweep_cfg.get("n_boot"), sweep_cfg.get("level"))  # before anything is written
    rows = latest_rows(read_rows(os.path.join(out_dir, "kernel.csv")))
    modes = list(sweep_cfg.get("modes") or ["fwd", "bwd", "fwd_bwd"])
    metric = sweep_cfg.get("best_metric") or ("fwd_bwd_ms" if "fwd_bwd" in modes else f"{modes[0]}_ms")
    base_variant = (sweep_cfg.get("baseline") or {}).get("variant", "flash")
    ours = list(sweep_cfg.get("ours") or OURS)
    best = pick_best(rows, metric)
    write_csv(best, os.path.join(out_dir, "best.csv"), columns=columns_of(rows) + ["impl", "impl_check", "candidates"])
    cross = detect_crossovers(best, {"best": {"variant": base_variant, "backend": "best"}}, [metric[:-3]])
    impl = {(_key(r), int(_f(r["seq_len"]))): r["impl"] for r in best}
    for c in cross:  # name the implementations on both sides of every crossover row
        vk = (c["variant"], c["head_dim"], c["causal"], c["n_kv_heads"])
        bk = (base_variant, c["head_dim"], c["causal"], c["baseline_n_kv_heads"])
        c["impl_variant"] = impl_summary([(n, i) for (k, n), i in impl.items() if k == vk])
        c["impl_baseline"] = impl_summary([(n, i) for (k, n), i in impl.items() if k == bk])
    write_csv(cross, os.path.join(out_dir, "crossover_best.csv"),
              columns=list(CROSSOVER_COLUMNS) + ["impl_variant", "impl_baseline"])
    table = compare_nstar(rows, base_variant, ours, metric, int(_default(sweep_cfg.get("n_boot"), 1000)),
                          float(_default(sweep_cfg.get("level"), 0.95)))
    write_csv(table, os.path.join(out_dir, "nstar_compare.csv"), columns=NSTAR_COLUMNS)
    figs = plot_best(best, os.path.join(out_dir, f"{prefix}best_time_vs_n"), metric, sweep_cfg.get("name"),
                     formats) if plots and best else []
    return {"best": best, "crossover_best": cross, "nstar": table, "figures": figs, "metric": metric}


if __name__ == "__main__":  # a library module: running it would do nothing, so say what to run instead
    raise SystemExit("eval.best is a library module, not a command; run python -m eval.crossover sweep=<sweep> compare=best")
