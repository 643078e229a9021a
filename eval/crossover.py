"""Crossover detection: at which sequence length does a variant start to beat the exact baseline?

For each variant / backend curve against the baseline curve (``baseline:`` in the sweep config, e.g. our exact
kernel) and against naive standard attention (``naive:``), on time (per mode) and on peak memory:

* ``n*`` (interpolated): the length where ``log t_variant - log t_baseline`` changes sign, linearly
  interpolated in ``(log n, log t)`` between the two bracketing measured lengths. The crossing after which the
  variant stays faster is reported; if there is none: ``"variant faster in whole range"``,
  ``"no crossover in range (baseline faster)"``, ``"equal in whole range"``, ``"insufficient data"`` or, for a
  variant that is ahead somewhere but behind again at the longest lengths, ``"ahead then behind (baseline faster
  at the end of the range)"`` with the lengths it is ahead between (``ahead_from``, ``ahead_until``: the text says
  "ahead only in [a, b]", no n*), stated explicitly. Equal lengths (exact ties, common for modelled memory) are not
  crossings by themselves: equal then ahead crosses at the last equal length, behind then equal does not cross.
* ``n*`` (constants): per-token time of the exact baseline grows like ``c2 * n`` (quadratic total time at
  fixed tokens), a linear / windowed variant's per-token time is a constant ``c_lin``. We fit
  ``t/token = c0 + c2 n`` to the baseline (least squares on relative error, over ``fit_min_seq_len`` and up)
  and ``c_lin`` = the median per-token time of the variant over the upper half of its lengths, and report
  ``n*_const = c_lin / c2`` (the idealised crossing, no overhead) and ``n*_fit = (c_lin - c0) / c2``, for
  the sub-quadratic kinds (linear, sliding window, block-sparse: constant per-token work).

Hydra entry (runs the sweep first, resumable; then detection, plots, W&B)::

    python -m eval.crossover sweep=speed_h200
    python -m eval.crossover sweep=cpu_tiny run_sweep=false      # re-analyse an existing CSV
    python -m eval.crossover sweep=anchors_h200 compare=best     # + n* best vs best (eval.best)

Writes ``<out_dir>/{kernel.csv, model.csv, crossover.csv, crossover.json, fits.csv}`` and the figures.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

STATUS_CROSS = "crossover"
STATUS_ALWAYS = "variant faster in whole range"
STATUS_NEVER = "no crossover in range (baseline faster)"
STATUS_NODATA = "insufficient data"
STATUS_TIE = "equal in whole range"
STATUS_AHEAD_THEN_BEHIND = "ahead then behind (baseline faster at the end of the range)"
#: Every status :func:`find_crossover` gives (what a crossover row's ``status`` may hold).
STATUSES = (STATUS_CROSS, STATUS_ALWAYS, STATUS_NEVER, STATUS_TIE, STATUS_AHEAD_THEN_BEHIND, STATUS_NODATA)


def _is_subquadratic(kind: str) -> bool:
    """Kinds with ~constant per-token time (c_lin is defined): the variant registry's ``subquadratic`` entry
    (linear, sliding window, block-sparse, dilated window, and any plugin that says so)."""
    from attn_zoo.variants import is_subquadratic

    return is_subquadratic(kind)


# --------------------------------------------------------------------------------------------- detection
def _clean(n: Sequence[float], t: Sequence[float]) -> Dict[float, float]:
    out = {}
    for a, b in zip(n, t):
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            continue
        if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b):
            out[a] = b
    return out


def find_crossover(n_a: Sequence[float], t_a: Sequence[float], n_b: Sequence[float], t_b: Sequence[float]) -> dict:
    """Where curve ``a`` (a variant) crosses curve ``b`` (the baseline), interpolated in log-log space.

    Args:
        n_a, t_a: lengths and values (time or memory; positive) of the variant; NaN / non-positive dropped.
        n_b, t_b: the same for the baseline. Only lengths present in both are compared.

    Returns a dict: ``status`` (one of :data:`STATUS_CROSS` (behind or equal, then ahead to the end of the
    range), :data:`STATUS_ALWAYS` (never behind, equal lengths allowed), :data:`STATUS_NEVER` (never ahead),
    :data:`STATUS_TIE` (equal at every common length), :data:`STATUS_AHEAD_THEN_BEHIND` (ahead at some length,
    behind again at the largest lengths: no n*), :data:`STATUS_NODATA`), ``n_star`` (the length above which the
    variant stays faster, NaN unless ``status == "crossover"``), ``ahead_from`` / ``ahead_until`` (with
    :data:`STATUS_AHEAD_THEN_BEHIND`: the first length where the variant is ahead, the smallest common length when
    it starts ahead, and the crossing from which the baseline stays faster; else NaN), ``crossings`` (every sign
    change: ``(n, "variant_wins" | "baseline_wins")``), ``n_min`` / ``n_max`` (common range), ``ratio_at_max``
    (``t_a / t_b`` at the largest common length).
    """
    a, b = _clean(n_a, t_a), _clean(n_b, t_b)
    common = sorted(set(a) & set(b))
    res = {"status": STATUS_NODATA, "n_star": float("nan"), "ahead_from": float("nan"), "ahead_until": float("nan"),
           "crossings": [], "n_min": float("nan"), "n_max": float("nan"), "ratio_at_max": float("nan"),
           "points": len(common)}
    if not common:
        return res
    res["n_min"], res["n_max"] = common[0], common[-1]
    r = [math.log(a[n]) - math.log(b[n]) for n in common]
    res["ratio_at_max"] = math.exp(r[-1])
    if len(common) < 2:
        res["status"] = STATUS_ALWAYS if r[0] < 0 else (STATUS_NEVER if r[0] > 0 else STATUS_TIE)
        return res
    sign = [(x > 0) - (x < 0) for x in r]  # +1 baseline faster, -1 variant faster, 0 equal (a tie)
    nz = [i for i, x in enumerate(sign) if x]
    if not nz:
        res["status"] = STATUS_TIE
        return res
    crossings = []
    if sign[0] == 0 and sign[nz[0]] < 0:  # equal, then the variant ahead: it wins from the last equal length on
        crossings.append((common[nz[0] - 1], "variant_wins"))
    for i, j in zip(nz, nz[1:]):  # consecutive lengths where one is ahead (equal ones between them skipped)
        if sign[i] == sign[j]:
            continue
        if j == i + 1:  # interpolated in log-log space
            x0, x1 = math.log(common[i]), math.log(common[j])
            ns = math.exp(x0 + r[i] / (r[i] - r[j]) * (x1 - x0))
        else:  # across equal lengths: from the last of them (variant ahead after) or the first (baseline after)
            ns = common[j - 1] if sign[j] < 0 else common[i + 1]
        crossings.append((ns, "variant_wins" if sign[j] < 0 else "baseline_wins"))
    res["crossings"] = crossings
    wins = [c for c in crossings if c[1] == "variant_wins"]
    last = sign[nz[-1]]
    if sign[0] < 0 and all(x <= 0 for x in sign):  # never behind (equal lengths allowed)
        res["status"] = STATUS_ALWAYS
    elif last < 0 and wins:
        # the crossing after which the variant stays faster: the last "variant_wins" one
        res["status"], res["n_star"] = STATUS_CROSS, wins[-1][0]
    elif any(x < 0 for x in sign):  # ahead somewhere, behind at the end: no n*, the lengths it is ahead between
        res["status"] = STATUS_AHEAD_THEN_BEHIND
        res["ahead_from"] = common[0] if sign[0] < 0 else wins[0][0]
        res["ahead_until"] = [c for c in crossings if c[1] == "baseline_wins"][-1][0]
    else:
        res["status"] = STATUS_NEVER
    return res


def _fmt_len(x) -> str:
    return f"{x:.0f}"


def status_note(row: dict, prefix: str = "") -> str:
    """The status of a crossover result or table row (``row[prefix + "status"]``) as text: the status string, and
    for :data:`STATUS_AHEAD_THEN_BEHIND` where the variant is ahead (``"...: ahead only in [1200, 4096], baseline
    faster from 4096"``, from ``ahead_from`` / ``ahead_until``; a CSV row's strings are read as numbers)."""
    status = str(row.get(prefix + "status") or "")
    if status != STATUS_AHEAD_THEN_BEHIND:
        return status
    a, b = _f(row.get(prefix + "ahead_from")), _f(row.get(prefix + "ahead_until"))
    if not (math.isfinite(a) and math.isfinite(b)):
        return status
    return f"{status}: ahead only in [{_fmt_len(a)}, {_fmt_len(b)}], baseline faster from {_fmt_len(b)}"


def fit_quadratic_per_token(n: Sequence[float], t_per_token: Sequence[float]) -> Tuple[float, float]:
    """Fit ``t/token = c0 + c2 * n`` (least squares on relative error); returns ``(c0, c2)``.

    Relative weights make every length count alike (otherwise the largest ``n`` dominates). Raises
    ``ValueError`` with fewer than two points.
    """
    d = _clean(n, t_per_token)
    if len(d) < 2:
        raise ValueError(f"need at least two (n, t) points to fit c2, got {len(d)}")
    # The 2 x 2 normal equations of min sum_i ((c0 + c2 x_i) / y_i - 1)^2, x scaled to (0, 1] for conditioning,
    # summed exactly (math.fsum): the same bits on every CPU (a LAPACK lstsq moved the last digits of the committed
    # fits with the BLAS kernel the machine picked).
    xs = sorted(d)
    top = xs[-1]
    # the weights 1 / t scaled by a power of two near the median t: the same bits as unscaled (a power of two scales
    # exactly), but no overflow / underflow of the products of 1 / t^4 for times far from 1 (1e-78 s, 1e77 ns)
    s = math.ldexp(1.0, math.frexp(sorted(d.values())[len(d) // 2])[1])
    a = [s / d[v] for v in xs]  # column of c0, relative weights
    b = [((v / top) * s) / d[v] for v in xs]  # column of c2 * top
    saa, sab, sbb = math.fsum(u * u for u in a), math.fsum(u * w for u, w in zip(a, b)), math.fsum(w * w for w in b)
    sa, sb = math.fsum(a), math.fsum(b)
    det = saa * sbb - sab * sab
    if not det > 0:  # every point at one length (not reached: at least two distinct lengths are kept)
        raise ValueError(f"need two distinct lengths to fit c2 (lengths too close to tell apart count as one), got {xs}")
    c0 = (sbb * sa - sab * sb) / det * s
    c2 = (saa * sb - sab * sa) / det / top * s
    return float(c0), float(c2)


def fit_constant_per_token(n: Sequence[float], t_per_token: Sequence[float], upper_fraction: float = 0.5) -> float:
    """``c_lin``: the median per-token time over the upper ``upper_fraction`` of the lengths (at least one)."""
    d = _clean(n, t_per_token)
    if not d:
        raise ValueError("need at least one (n, t) point to fit c_lin")
    xs = sorted(d)
    k = max(1, int(math.ceil(len(xs) * upper_fraction)))
    return float(np.median([d[v] for v in xs[-k:]]))


def constants_crossover(n_b, tpt_b, n_v, tpt_v, fit_min_seq_len: float = 0) -> dict:
    """``c2``, ``c0`` of the baseline, ``c_lin`` of the variant, ``n*_const = c_lin / c2`` and
    ``n*_fit = (c_lin - c0) / c2`` (NaN where undefined: fewer than two baseline points or ``c2 <= 0``)."""
    out = {"c0": float("nan"), "c2": float("nan"), "c_lin": float("nan"), "n_star_const": float("nan"),
           "n_star_fit": float("nan")}
    nb = [a for a in n_b if float(a) >= fit_min_seq_len]
    tb = [t for a, t in zip(n_b, tpt_b) if float(a) >= fit_min_seq_len]
    try:
        c0, c2 = fit_quadratic_per_token(nb, tb)
        c_lin = fit_constant_per_token(n_v, tpt_v)
    except ValueError:
        return out
    out.update(c0=c0, c2=c2, c_lin=c_lin)
    if c2 > 0:
        out["n_star_const"] = c_lin / c2
        out["n_star_fit"] = (c_lin - c0) / c2 if c_lin > c0 else float("nan")
    return out


# --------------------------------------------------------------------------------------------- tables
def _f(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _b(x) -> bool:
    return x if isinstance(x, bool) else str(x).lower() in ("true", "1")


def series(rows: Iterable[dict]) -> Dict[tuple, List[dict]]:
    """Group ok rows by ``(variant, backend, head_dim, causal, n_kv_heads)``, sorted by ``seq_len``."""
    out: Dict[tuple, List[dict]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        key = (r["variant"], r["backend"], int(_f(r["head_dim"])), _b(r["causal"]), int(_f(r["n_kv_heads"])))
        out.setdefault(key, []).append(r)
    for v in out.values():
        v.sort(key=lambda r: _f(r["seq_len"]))
    return out


def memory_metric(rows: Sequence[dict]) -> str:
    """``peak_mem_bytes`` when measured (CUDA), else the cost model's ``model_footprint_bytes``."""
    if any(math.isfinite(_f(r.get("peak_mem_bytes"))) and _f(r.get("peak_mem_bytes")) > 0 for r in rows):
        return "peak_mem_bytes"
    return "model_footprint_bytes"


def _pick_baseline(ser: Dict[tuple, List[dict]], ref: dict, D: int, causal: bool, hkv: int) -> Optional[tuple]:
    cands = [k for k in ser if k[0] == ref["variant"] and k[1] == ref["backend"] and k[2] == D and k[3] == causal]
    if not cands:
        return None
    same = [k for k in cands if k[4] == hkv]
    return same[0] if same else max(cands, key=lambda k: k[4])  # else the MHA baseline


def detect_crossovers(rows: Sequence[dict], baselines: Dict[str, dict],
                      modes: Sequence[str] = ("fwd", "bwd", "fwd_bwd"), fit_min_seq_len: float = 0) -> List[dict]:
    """Crossover table: one row per (reference, variant curve, metric).

    ``baselines``: ``{"exact": {"variant": "flash", "backend": "triton"}, "naive": {...}, ...}`` (the sweep
    config's ``baseline``, ``naive`` and ``extra_baselines``); a curve is compared
    with each reference at the same head dim and causality (same ``n_kv_heads`` when the reference has it,
    else the reference's MHA curve). Metrics: ``<mode>_ms`` for each mode (with the ``c2`` / ``c_lin`` fit on
    per-token times) and the memory metric (:func:`memory_metric`).
    """
    ser = series(rows)
    mem = memory_metric(rows)
    out = []
    for ref_name, ref in baselines.items():
        if not ref:
            continue
        for key, pts in sorted(ser.items()):
            if key[0] == ref["variant"] and key[1] == ref["backend"]:
                continue
            bkey = _pick_baseline(ser, ref, key[2], key[3], key[4])
            if bkey is None:
                continue
            bpts = ser[bkey]
            base = {"reference": ref_name, "baseline": f"{bkey[0]}/{bkey[1]}", "variant": key[0], "backend": key[1],
                    "head_dim": key[2], "causal": key[3], "n_kv_heads": key[4], "baseline_n_kv_heads": bkey[4]}
            for metric in [f"{m}_ms" for m in modes] + [mem]:
                na = [_f(r["seq_len"]) for r in pts]
                ta = [_f(r.get(metric)) for r in pts]
                nb = [_f(r["seq_len"]) for r in bpts]
                tb = [_f(r.get(metric)) for r in bpts]
                res = find_crossover(na, ta, nb, tb)
                row = dict(base, metric=metric, status=res["status"], n_star=res["n_star"],
                           ahead_from=res["ahead_from"], ahead_until=res["ahead_until"], n_min=res["n_min"],
                           n_max=res["n_max"], ratio_at_max=res["ratio_at_max"], points=res["points"],
                           crossings=";".join(f"{n:.0f}:{d}" for n, d in res["crossings"]))
                if metric.endswith("_ms") and _is_subquadratic(pts[0].get("kind", "linear")):
                    tok_a = [_f(r["tokens"]) for r in pts]
                    tok_b = [_f(r["tokens"]) for r in bpts]
                    fit = constants_crossover(nb, [t / k for t, k in zip(tb, tok_b)], na,
                                              [t / k for t, k in zip(ta, tok_a)], fit_min_seq_len)
                    row.update({k: (v * 1e3 if k in ("c0", "c2", "c_lin") else v) for k, v in fit.items()})
                    # c0, c_lin in us/token; c2 in us/token per token of context
                out.append(row)
    return out


CROSSOVER_COLUMNS = ("reference", "baseline", "variant", "backend", "head_dim", "causal", "n_kv_heads",
                     "baseline_n_kv_heads", "metric", "status", "n_star", "ahead_from", "ahead_until", "n_star_const",
                     "n_star_fit", "c0", "c2", "c_lin", "n_min", "n_max", "ratio_at_max", "points", "crossings")


def format_crossovers(rows: Sequence[dict], metric: str = "fwd_bwd_ms", reference: str = "exact") -> str:
    """Short text table of the crossovers for one metric and reference."""
    sel = [r for r in rows if r["metric"] == metric and r["reference"] == reference]
    lines = [f"crossovers vs {reference} ({metric}):",
             f"{'variant/backend':32s} {'D':>4s} {'Hkv':>4s} {'n* (interp)':>12s} {'n*=c_lin/c2':>12s}  status"]
    for r in sel:
        ns = "-" if not math.isfinite(r["n_star"]) else f"{r['n_star']:.0f}"
        nc = r.get("n_star_const", float("nan"))
        nc = "-" if not (isinstance(nc, float) and math.isfinite(nc)) else f"{nc:.0f}"
        lines.append(f"{r['variant'] + '/' + r['backend']:32s} {r['head_dim']:>4d} {r['n_kv_heads']:>4d} {ns:>12s} "
                     f"{nc:>12s}  {status_note(r)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- pipeline
def analyse(out_dir: str, sweep_cfg: dict, env: Optional[dict] = None) -> Dict[str, object]:
    """Crossover detection on ``<out_dir>/kernel.csv``; writes ``crossover.csv`` and ``crossover.json``."""
    from eval.bench_common import write_csv, write_json
    from eval.sweep import latest_rows, read_rows

    rows = latest_rows(read_rows(os.path.join(out_dir, "kernel.csv")))
    baselines = {"exact": dict(sweep_cfg.get("baseline") or {}), "naive": dict(sweep_cfg.get("naive") or {})}
    for name, ref in (sweep_cfg.get("extra_baselines") or {}).items():  # e.g. {fa2: {variant: flash, ...}}
        baselines[str(name)] = dict(ref)
    modes = [m for m in (sweep_cfg.get("modes") or ("fwd", "bwd", "fwd_bwd"))]
    cross = detect_crossovers(rows, baselines, modes, float(sweep_cfg.get("fit_min_seq_len") or 0))
    write_csv(cross, os.path.join(out_dir, "crossover.csv"), columns=CROSSOVER_COLUMNS)
    counts = dict(Counter(r.get("status") for r in rows))
    write_json(cross, os.path.join(out_dir, "crossover.json"),
               env=dict(env or {}, sweep=sweep_cfg.get("name"), status_counts=counts, baselines=baselines))
    return {"rows": rows, "crossovers": cross, "status_counts": counts}


COMPARE = ("ours", "best")
REFERENCE_KEYS = ("variant", "backend")
ANALYSIS_KEYS = ("name", "baseline", "naive", "extra_baselines", "modes", "fit_min_seq_len", "ours", "best_metric",
                 "n_boot", "level", "plugins")
"""The sweep keys a re-analysis (``run_sweep=false``) reads: every other one only shapes what is measured."""
MEASURE_ONLY = ("resume", "retry_failed")
"""Top-level keys that only change how a sweep is measured (ignored by ``run_sweep=false``; ``model_sweep=false``
asks for nothing a re-analysis would do, so it may stay)."""


def references(sweep_cfg: dict) -> Dict[str, object]:
    """``{"exact": baseline, "naive": naive, <name>: ref of extra_baselines, ...}`` of a sweep config, as given (a
    ``null`` reference is left out; :func:`check_references` checks the rest)."""
    refs = {"exact": sweep_cfg.get("baseline"), "naive": sweep_cfg.get("naive")}
    extra = sweep_cfg.get("extra_baselines") or {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra_baselines={extra!r}: must be a mapping name: {{variant: ..., backend: ...}}, e.g. "
                         f"{{fa2: {{variant: flash, backend: sdpa_flash}}}}")
    refs.update({str(k): v for k, v in extra.items()})
    return {k: v for k, v in refs.items() if v is not None}


def _ref_key(name: str) -> str:
    return {"exact": "baseline", "naive": "naive"}.get(name, f"extra_baselines.{name}")


def check_references(sweep_cfg: dict, pairs: Iterable[tuple], where: str,
                     registered: Sequence[str] = ()) -> List[str]:
    """The crossover references of a sweep config (``baseline``, ``naive``, ``extra_baselines``) against the
    ``(variant, backend)`` pairs there are to analyse (``where`` says whose: the sweep's grid or a kernel.csv).

    ``baseline`` (the exact reference) must be set and name a measured pair; ``naive`` / ``extra_baselines``
    entries a variant there and a backend there or registered (``registered``), a pair not measured being only a
    note (returned) — a sweep may leave out the naive backend. Each is a mapping of exactly ``variant`` and
    ``backend``. Raises ``ValueError`` naming the key and the allowed values: a misspelt baseline detected no
    crossover at all and exited 0 (the whole sweep measured for nothing)."""
    pairs = sorted({(str(v), str(b)) for v, b in pairs})
    variants = list(dict.fromkeys(v for v, _ in pairs))
    backends = list(dict.fromkeys(b for _, b in pairs))
    refs = references(sweep_cfg)
    if "exact" not in refs:
        raise ValueError(f"baseline is not set: the exact reference every curve is compared with; allowed values: "
                         f"{{variant: <one of {', '.join(variants) or '-'}>, backend: <one of "
                         f"{', '.join(backends) or '-'}>}}")
    notes = []
    for name, ref in refs.items():
        key = _ref_key(name)
        if not isinstance(ref, Mapping) or set(ref) != set(REFERENCE_KEYS) or \
                not all(isinstance(ref[k], str) for k in REFERENCE_KEYS):
            raise ValueError(f"{key}={ref!r}: must be a mapping of exactly variant and backend (names), e.g. "
                             f"{{variant: {variants[0] if variants else 'flash'}, backend: "
                             f"{backends[0] if backends else 'torch'}}}" + (" or null" if name != "exact" else ""))
        v, b = ref["variant"], ref["backend"]
        shown = f"{key}={{variant: {v}, backend: {b}}}"
        if v not in variants:
            raise ValueError(f"{shown}: variant {v!r} is not one of {where} variants; allowed values: "
                             f"{', '.join(variants) or '(none)'}")
        allowed_b = backends if name == "exact" else list(dict.fromkeys(backends + list(registered)))
        if b not in allowed_b:
            raise ValueError(f"{shown}: backend {b!r} is not one of {where} backends"
                             f"{'' if name == 'exact' else ' or the registered ones'}; allowed values: "
                             f"{', '.join(allowed_b) or '(none)'}")
        if (v, b) not in pairs:
            if name == "exact":
                raise ValueError(f"{shown}: {where} points have no {v}/{b} (the exclude rules drop it); allowed "
                                 f"values: {', '.join(f'{x}/{y}' for x, y in pairs)}")
            notes.append(f"{shown}: {where} points have no {v}/{b}, so no crossovers against it")
    return notes


def check_overrides(cfg: dict, overrides: Sequence[str]) -> None:
    """The command line's overrides (Hydra's ``overrides.task``) against ``run_sweep``: with ``run_sweep=false``
    nothing is measured, so an override of a key that only shapes the measurement (``sweep.seq_lens=[...]``,
    ``'~sweep.variants.gqa'``, ``resume=false``: :data:`ANALYSIS_KEYS`, :data:`MEASURE_ONLY`) would be ignored and
    the run exit 0 having done nothing it asked for: ``ValueError`` naming them."""
    if cfg.get("run_sweep", True):
        return
    unused = []
    for o in overrides:
        key = str(o).lstrip("~+").split("=", 1)[0].strip()
        part = key.split(".")
        if (part[0] == "sweep" and len(part) > 1 and part[1] not in ANALYSIS_KEYS) or key in MEASURE_ONLY:
            unused.append(str(o))
    if unused:
        raise ValueError(f"run_sweep=false measures nothing, so {', '.join(unused)} would be ignored; a re-analysis "
                         f"reads only sweep.{{{', '.join(ANALYSIS_KEYS)}}} (and the sweep=<name> that chose them): "
                         f"drop {'it' if len(unused) == 1 else 'them'}, or run_sweep=true to measure")


def check_config(cfg: dict) -> None:
    """The settings of :func:`run`, before anything is measured or written: ``compare`` (:data:`COMPARE`),
    ``machine`` (null or a roofline preset of :mod:`attn_zoo.cost_model`), ``formats``, and with ``run_sweep`` the
    sweep itself (:func:`eval.sweep.check_sweep_config`: axes, dtype, device, registered backends, variants;
    :func:`eval.sweep.check_sweep_device`: a visible GPU for device=cuda), its model sweep's backends and its
    crossover references (:func:`check_references`: against the grid's points and, resumed, kernel.csv's), and with
    ``compare=best`` ``sweep.n_boot`` / ``sweep.level`` (:func:`eval.best.check_bootstrap`). Raises ``ValueError``
    naming the key and the allowed values."""
    from attn_zoo import cost_model as cm
    from eval.bench_common import check_out_dir
    from eval.plots import check_formats
    from eval.sweep import check_model_sweep_config, check_sweep_config, check_sweep_device

    compare = str(cfg.get("compare") or "ours")
    if compare not in COMPARE:
        raise ValueError(f"compare={compare!r} is not supported; allowed values: {', '.join(COMPARE)}")
    if cfg.get("machine") is not None:
        cm.get_machine(str(cfg["machine"]))  # raises naming machine= and the presets
    check_formats(cfg.get("formats"))
    check_out_dir(cfg.get("out_dir"), "out_dir")
    check_out_dir(cfg.get("figures_dir"), "figures_dir")
    if cfg.get("run_sweep", True):
        sw = dict(cfg["sweep"])
        try:
            check_sweep_config(sw)
            check_sweep_device(sw)
            ms = sw.get("model_sweep") or {}
            if cfg.get("model_sweep", True) and ms and ms.get("enabled", True):
                try:
                    check_model_sweep_config(ms)
                except ValueError as e:
                    raise ValueError(f"model_sweep.{e}") from None
        except ValueError as e:
            raise ValueError(f"sweep.{e}") from None
        # the crossover references against the grid (a re-analysis: against kernel.csv, in run())
        from eval.sweep import BENCH_BACKENDS, expand_points, read_rows

        pairs = [(p["variant"], p["backend"]) for p in expand_points(sw)]
        kcsv = os.path.join(cfg.get("out_dir") or os.path.join("results", sw.get("name", "sweep")), "kernel.csv")
        if cfg.get("resume", True) and os.path.isfile(kcsv):  # its rows are analysed too (a sweep that adds to them)
            pairs += [(r.get("variant"), r.get("backend")) for r in read_rows(kcsv)]
        try:
            notes = check_references(sw, pairs, "the sweep's", list(BENCH_BACKENDS))  # (and kernel.csv's)
        except ValueError as e:
            raise ValueError(f"sweep.{e}") from None
        for note in notes:
            print(f"note: sweep.{note}")
    if compare == "best":  # n_boot=0 was taken as 1000, a negative n_boot gave NaN intervals
        from eval.best import check_bootstrap

        try:
            check_bootstrap(dict(cfg["sweep"]).get("n_boot"), dict(cfg["sweep"]).get("level"))
        except ValueError as e:
            raise ValueError(f"sweep.{e}") from None


def run(cfg: dict) -> Dict[str, object]:
    """The whole pipeline from a plain config dict (what the Hydra ``main`` passes; usable without Hydra).

    Keys: ``sweep`` (the sweep config), ``out_dir``, ``compare`` (``ours``: the baselines of the sweep config;
    ``best``: also every n* on the fastest correct implementation of each side, ours vs ours and best vs best with
    bootstrap intervals: :mod:`eval.best`), ``resume``, ``retry_failed``, ``progress``, ``run_sweep``,
    ``model_sweep``, ``plots``, ``figures_dir``, ``figures_prefix``, ``formats``, ``machine``, ``wandb``
    (``enabled``, ``project``, ``group``, ``mode``).
    """
    from eval import config_errors
    from eval.bench_common import env_info, write_json
    from eval.sweep import run_model_sweep, run_sweep

    with config_errors():  # a bad value: its message alone, before anything is measured or written
        check_config(cfg)
    sw = dict(cfg["sweep"])
    out_dir = cfg.get("out_dir") or os.path.join("results", sw.get("name", "sweep"))
    if not cfg.get("run_sweep", True) and not any(os.path.isfile(os.path.join(out_dir, f))
                                                  for f in ("kernel.csv", "model.csv")):
        with config_errors():  # re-analysis of nothing: it wrote empty tables and 0 figures, and exited 0
            raise ValueError(f"run_sweep=false: out_dir={out_dir} holds no kernel.csv or model.csv to analyse; pass "
                             f"the out_dir of a finished sweep, or run_sweep=true to measure")
    kcsv = os.path.join(out_dir, "kernel.csv")
    if not cfg.get("run_sweep", True) and os.path.isfile(kcsv):  # the references against what is there to analyse
        from eval.sweep import BENCH_BACKENDS, load_plugins, read_rows

        with config_errors():
            load_plugins(sw.get("plugins"))
            try:
                notes = check_references(sw, [(r.get("variant"), r.get("backend")) for r in read_rows(kcsv)],
                                         f"{kcsv}'s", list(BENCH_BACKENDS))
            except ValueError as e:  # e.g. sweep=taylor_h200 over cpu_tiny's out_dir: no crossover, exit 0
                raise ValueError(f"sweep.{e} (run_sweep=false analyses out_dir={out_dir}: pass the sweep=<name> "
                                 f"it was measured with)") from None
        for note in notes:
            print(f"note: sweep.{note}")
    os.makedirs(out_dir, exist_ok=True)
    env = env_info(date=cfg.get("date"))
    env_path = os.path.join(out_dir, "env.json")
    measured_sweep = sw
    if not cfg.get("run_sweep", True) and os.path.exists(env_path):  # re-analysis: keep where and how it was measured
        with open(env_path) as f:
            stored = json.load(f).get("env") or {}
        env = {k: v for k, v in stored.items() if k != "sweep"}
        measured_sweep = stored.get("sweep") or sw
    mcsv = os.path.join(out_dir, "model.csv")
    if cfg.get("run_sweep", True):
        with config_errors():  # settings the sweep refuses (resume over rows measured with other settings)
            run_sweep(sw, kcsv, resume=cfg.get("resume", True), progress=cfg.get("progress", True),
                      retry_failed=cfg.get("retry_failed", False))
        ms = sw.get("model_sweep") or {}
        if cfg.get("model_sweep", True) and ms and ms.get("enabled", True):
            mc = dict(ms)
            mc.setdefault("name", sw.get("name", "sweep") + "_model")
            mc.setdefault("device", sw.get("device"))
            with config_errors():
                run_model_sweep(mc, mcsv, resume=cfg.get("resume", True), progress=cfg.get("progress", True))
    write_json([], os.path.join(out_dir, "env.json"), env=dict(env, sweep=measured_sweep))
    compare = str(cfg.get("compare") or "ours")
    res = analyse(out_dir, sw, env)
    if compare == "best":  # n* on the fastest correct implementation of each side, beside ours vs ours
        from eval.best import analyse_best, format_nstar_markdown

        res["best"] = analyse_best(out_dir, sw, plots=cfg.get("plots", True),
                                   formats=tuple(cfg.get("formats") or ("png",)), prefix=cfg.get("figures_prefix") or "")
        print(f"n* ours vs ours and best vs best ({res['best']['metric']}; intervals: bootstrap over repeats):")
        print(format_nstar_markdown(res["best"]["nstar"]))
    print(format_crossovers(res["crossovers"], "fwd_bwd_ms" if "fwd_bwd" in (sw.get("modes") or ["fwd_bwd"]) else
                            f"{(sw.get('modes') or ['fwd'])[0]}_ms"))
    figs: Dict[str, List[str]] = {}
    if cfg.get("plots", True):
        from eval import plots

        figs = plots.sweep_figures(out_dir, cfg.get("figures_dir") or out_dir, machine=cfg.get("machine"),
                                   title=sw.get("name"), prefix=cfg.get("figures_prefix") or "",
                                   formats=cfg.get("formats") or ("png", "svg"))
    res["figures"] = figs
    wb = cfg.get("wandb") or {}
    if wb.get("enabled", False):
        from eval.sweep import read_rows
        from eval.wandb_log import log_results

        tables = {"kernel": res["rows"], "crossover": res["crossovers"]}
        if os.path.exists(mcsv):
            tables["model"] = read_rows(mcsv)
        res["wandb_dir"] = log_results(
            name=sw.get("name", "sweep"), group=wb.get("group", "crossover"), project=wb.get("project", "attn-zoo"),
            tables=tables, images={k: v[0] for k, v in figs.items() if v}, config=dict(sweep=sw, env=env),
            mode=wb.get("mode", "auto"), dir=wb.get("dir") or out_dir, job_type="sweep")
    n_figs = sum(len(v) for v in figs.values())
    print(f"results: {os.path.abspath(out_dir)} (kernel.csv{', model.csv' if os.path.exists(mcsv) else ''}, "
          f"crossover.csv, crossover.json, env.json); {n_figs} figure files in "
          f"{os.path.abspath(cfg.get('figures_dir') or out_dir)}"
          + (f"; W&B run in {res['wandb_dir']}" if res.get("wandb_dir") else ""))
    return res


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    from eval import hydra_cli

    hydra_cli("crossover", run, check_overrides=check_overrides)
