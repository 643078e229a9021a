"""Figures of the sweep, crossover, quality and cost-model results, defined once as :class:`eval.figspec.Figure`
(``*_spec``) and drawn by :func:`eval.figspec.to_png` (PNG + SVG) or :func:`eval.figspec.to_plotly`; the styles,
captions and grid helpers the definitions and the renderer share live here.

Every figure answers one question, named in its title, with the setup (GPU, dtype, heads, head dim, tokens per
step, date) on the second title line. Small multiples: one panel per attention variant holding its backends; a
backend keeps one colour and marker in every panel (:data:`BACKEND_STYLE`), a variant one colour, marker and line
style in the quality figures (:data:`VARIANT_STYLE`); the exact baseline is the thick black curve of every panel.

* ``time_vs_n_<mode>``: "where does each variant become faster than exact attention?" Time vs N, log-log.
  ``n*`` against the exact baseline: a star on the curve, a dotted vertical line, the value in the series'
  legend label (no text on the plot), and a table panel of every ``n*``; star and dotted line in the legend.
* ``memory_vs_n``: peak memory per sequence vs N (measured on CUDA; the cost model's footprint otherwise), with
  the cost model's ``n^2`` (S and P materialised) and ``n d`` (flash) curves; curves equal within 2 % are drawn
  once and labelled ``a = b``.
* ``roofline``: the machine's roof in each panel and every kernel point at its modelled arithmetic intensity and
  measured TFLOP/s.
* ``model_tokens_per_s``: the GPT's training / inference tokens/s and peak memory vs context length, a panel each.
* ``quality_vs_n`` and ``bubble`` (Long Range Arena Fig. 3 style: y quality, x speed, bubble area memory, one
  panel per seq_len, a key of bubble sizes).

One command per figure set::

    python -m eval.plots results_dir=results/h200/crossover_speed_h200 figures_dir=docs/figures prefix=h200_
    python -m eval.plots quality_csv=results/cpu/quality/quality.csv figures_dir=docs/figures
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attn_zoo import cost_model as cm  # noqa: E402

from eval import figspec  # noqa: E402
from eval.crossover import (STATUS_AHEAD_THEN_BEHIND, STATUS_ALWAYS, STATUS_NEVER, STATUS_NODATA,  # noqa: E402
                            STATUS_TIE, _b, _f, series)

_MATERIALISING = ("naive", "reference", "sdpa_math")

FORMATS = ["png", "svg"]  # set by the drivers' ``formats`` option

# One colour and one marker per backend, the same in every panel of every figure.
BACKEND_STYLE = {
    "triton": ("tab:blue", "o", "ours (Triton)"),
    "sdpa_flash": ("tab:orange", "s", "SDPA FlashAttention-2"),
    "sdpa_cudnn": ("tab:green", "D", "SDPA cuDNN"),
    "flex": ("tab:purple", "^", "FlexAttention (compiled)"),
    "torch": ("tab:brown", "v", "torch backend"),
    "naive": ("tab:red", "X", "naive (S, P materialised)"),
    "reference": ("tab:gray", "P", "reference (fp32)"),
    "sdpa_math": ("tab:pink", "h", "SDPA math"),
    "sdpa_efficient": ("tab:olive", "<", "SDPA memory-efficient"),
    "fa2": ("goldenrod", ">", "flash-attn 2"),
    "fa3": ("darkkhaki", "p", "flash-attn 3"),
    "fla": ("teal", "d", "flash-linear-attention"),
    "auto": ("tab:cyan", "o", "auto"),
}
# One colour, marker and line style per attention variant (quality / recall figures); the line style says the family
# (solid: exact softmax, dashed: sparse / windowed softmax, dotted: linear; dash-dot: the recurrent / latent mixers
# below and any name outside the table).
VARIANT_STYLE = {
    "flash": ("black", "o", "-"),
    "gqa": ("tab:blue", "s", "-"),
    "mqa": ("tab:cyan", "D", "-"),
    "sliding_window": ("tab:orange", "^", "--"),
    "dilated_window": ("tab:brown", "<", "--"),
    "streaming": ("dimgray", "+", "--"),
    "sparse": ("tab:green", "v", "--"),
    "linear": ("tab:red", "X", ":"),
    "linear_taylor": ("tab:purple", "P", ":"),
    "linear_favor": ("tab:pink", "h", ":"),
    "linear_relu": ("tab:olive", "p", ":"),
    # the recurrent / latent mixers: the colour, marker and dash-dot line the first four extra styles gave them in
    # ``python -m eval.figures`` (met in this order by its mqar_fig2 job), now fixed so that a process drawing only some
    # of them (``python -m eval.recall hybrid ...``: mamba2 alone) draws them as the committed figures do
    "deltanet": ("#17becf", "*", "-."),
    "gated_deltanet": ("#bcbd22", "8", "-."),
    "mamba2": ("#8c564b", "H", "-."),
    "mla": ("#e377c2", "d", "-."),
}
_EXTRA = [("#17becf", "*"), ("#bcbd22", "8"), ("#8c564b", "H"), ("#e377c2", "d"), ("#7f7f7f", ">"),
          ("#1f77b4", "<"), ("#ff7f0e", "p"), ("#2ca02c", "h"), ("#d62728", "P"), ("#9467bd", "X")]
_ASSIGNED: Dict[str, tuple] = {}  # names outside the tables get the next extra style, stable within a process
STATUS_SHORT = {STATUS_ALWAYS: "faster at every N", STATUS_NEVER: "slower at every N", STATUS_NODATA: "no common N",
                STATUS_TIE: "equal at every N", STATUS_AHEAD_THEN_BEHIND: "faster only in part, slower at the end"}


def _extra(name: str) -> tuple:
    if name not in _ASSIGNED:
        _ASSIGNED[name] = _EXTRA[len(_ASSIGNED) % len(_EXTRA)]
    return _ASSIGNED[name]


def backend_style(backend: str) -> dict:
    """Colour, marker and display label of a backend (fixed for the known ones, assigned in order otherwise)."""
    base = str(backend).split("+", 1)[0]
    if base in BACKEND_STYLE:
        c, m, label = BACKEND_STYLE[base]
        return {"color": c, "marker": m, "label": label + (backend[len(base):] if backend != base else "")}
    c, m = _extra("backend:" + str(backend))
    return {"color": c, "marker": m, "label": str(backend)}


def variant_style(name: str) -> dict:
    """Colour, marker and line style of a variant name (``linear (taylor)`` and ``linear_taylor`` share one)."""
    n = str(name)
    key = n.split(" ", 1)[0]
    if n.startswith("linear"):
        for fm in ("taylor", "favor", "relu"):
            if fm in n:
                key = f"linear_{fm}"
    if key in VARIANT_STYLE:
        c, m, ls = VARIANT_STYLE[key]
        return {"color": c, "marker": m, "ls": ls}
    c, m = _extra("variant:" + n)
    return {"color": c, "marker": m, "ls": "-."}


ALLOWED_FORMATS = ("png", "svg", "pdf")


def check_formats(formats) -> List[str]:
    """The figure formats of ``formats`` (a list, or one name), lower case; ``ValueError`` naming ``formats`` and
    the allowed values for any other entry."""
    fm = [str(f).lower() for f in ([formats] if isinstance(formats, str) else (formats or ["png", "svg"]))]
    bad = [f for f in fm if f not in ALLOWED_FORMATS]
    if bad:
        raise ValueError(f"formats={fm!r}: {', '.join(map(repr, bad))} is not supported; allowed values: "
                         f"{', '.join(ALLOWED_FORMATS)}")
    return fm


def set_formats(formats) -> None:
    """Output formats of the figures, e.g. ``["png", "svg"]`` (PNG is always written first)."""
    fm = check_formats(formats)
    FORMATS[:] = ["png"] + [f for f in fm if f != "png"]


def fmt_n(n: float) -> str:
    """A length for a label: ``3.7k``, ``860``."""
    n = _f(n)
    if not math.isfinite(n):
        return "-"
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


MIN_FIG_W = 8.0  # inches: room for the title lines and the shared legend of a one-panel figure


def suptitle(fig, text: str, fontsize: float = 9) -> None:
    """The figure title, each line wrapped to the figure's width."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 72 / (fontsize * 0.55)))
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in str(text).split("\n")), fontsize=fontsize)


def grid(n_panels: int, ncols: int = 3, panel_w: float = 4.6, panel_h: float = 3.6, sharex: bool = False,
         sharey: bool = False):
    """A figure (constrained layout) with ``n_panels`` axes in rows of ``ncols``; returns ``(fig, [axes])``, the
    unused cells removed."""
    n = max(int(n_panels), 1)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = plt.figure(figsize=(max(panel_w * ncols + 0.4, MIN_FIG_W), panel_h * nrows + 1.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex, sharey=sharey).ravel().tolist()
    for ax in axes[n:]:
        ax.remove()
    for ax in axes[:n]:  # shared axes: every panel keeps its tick labels (a panel may sit above a table or nothing)
        if sharex:
            ax.xaxis.set_tick_params(labelbottom=True)
        if sharey:
            ax.yaxis.set_tick_params(labelleft=True)
    return fig, axes[:n]


def setup_caption(rows: Sequence[dict], env: Optional[dict] = None, title: Optional[str] = None) -> str:
    """The measurement setup in one line: GPU / device, dtype, causal, heads, head dim, tokens per step, date,
    versions (from the result rows and the sweep's ``env``)."""
    env = env or {}
    r0 = rows[0] if rows else {}

    def uniq(col, fmt=str):
        vals = sorted({fmt(r[col]) for r in rows if r.get(col) not in (None, "")}, key=str)
        return "/".join(vals) if vals else None

    parts = []
    dev = env.get("gpu") or (r0.get("device") or "").upper() or None
    if dev:
        parts.append(str(dev))
    for col, fmt in (("dtype", str),):
        u = uniq(col, fmt)
        if u:
            parts.append(u)
    c = uniq("causal", lambda x: "causal" if _b(x) else "non-causal")
    if c:
        parts.append(c)
    h = uniq("n_heads", lambda x: str(int(_f(x))))
    d = uniq("head_dim", lambda x: str(int(_f(x))))
    if h or d:
        parts.append(", ".join(p for p in (f"H = {h}" if h else None, f"D = {d}" if d else None) if p))
    toks: Dict[int, set] = {}
    for r in rows:
        if math.isfinite(_f(r.get("tokens"))):
            toks.setdefault(int(_f(r["tokens"])), set()).add(int(_f(r.get("seq_len"))))
    if toks:
        main_t = max(toks, key=lambda t: len(toks[t]))
        other = "; ".join(f"N = {', '.join(f'{n:,}' for n in sorted(ns))}: {t:,}" for t, ns in sorted(toks.items())
                          if t != main_t)
        parts.append(f"{main_t:,} tokens per step (batch = tokens / N" + (f"; {other})" if other else ")"))
    date = env.get("date") or uniq("timestamp", lambda x: str(x)[:10])
    if date:
        parts.append(str(date))
    if env.get("torch"):
        parts.append(f"torch {env['torch']}" + (f", triton {env['triton']}" if env.get("triton") else ""))
    line = " · ".join(parts)
    return f"{title} — {line}" if title else line


def _key_of(r: dict) -> tuple:
    return (r["variant"], r["backend"], int(_f(r["head_dim"])), _b(r["causal"]), int(_f(r["n_kv_heads"])))


def _failures(rows: Sequence[dict]) -> Dict[tuple, tuple]:
    """First ``oom`` / ``error`` of each series: key -> (status, N)."""
    failed: Dict[tuple, tuple] = {}
    for r in sorted(rows, key=lambda r: _f(r.get("seq_len"))):
        if r.get("status") in ("oom", "error"):
            try:
                failed.setdefault(_key_of(r), (r["status"], int(_f(r["seq_len"]))))
            except (KeyError, ValueError):
                continue
    return failed


def _baseline_key(keys: Sequence[tuple], baseline: Optional[Sequence[str]], D: int, causal: bool) -> Optional[tuple]:
    if baseline is None:
        return None
    cands = [k for k in keys if (k[0], k[1]) == tuple(baseline) and k[2] == D and k[3] == causal]
    return max(cands, key=lambda k: k[4]) if cands else None  # the MHA curve when there are several


def family_panels(keys: Sequence[tuple], baseline: Optional[Sequence[str]] = None,
                  max_series: int = 5) -> List[dict]:
    """Small multiples: one panel per variant (and per head dim / causality when there are several), holding that
    variant's backends; the baseline's variant comes first. A variant with more than ``max_series`` backends is
    split over several panels. Returns dicts ``{variant, D, causal, keys, title}``."""
    combos = sorted({(k[2], k[3]) for k in keys})
    variants = sorted({k[0] for k in keys}, key=lambda v: (baseline is None or v != baseline[0], v))
    out = []
    for D, causal in combos:
        for v in variants:
            ks = sorted([k for k in keys if k[0] == v and k[2] == D and k[3] == causal],
                        key=lambda k: (baseline is None or (k[0], k[1]) != tuple(baseline), k[1] != "triton", k[1],
                                       k[4]))
            for i in range(0, len(ks), max_series):
                title = v + (f" (D={D}, {'causal' if causal else 'non-causal'})" if len(combos) > 1 else "")
                if len(ks) > max_series:
                    title += f" [{i // max_series + 1}]"
                out.append({"variant": v, "D": D, "causal": causal, "keys": ks[i:i + max_series], "title": title})
    return out


def _series_label(k: tuple, multi_hkv: bool) -> str:
    return backend_style(k[1])["label"] + (f" (Hkv={k[4]})" if multi_hkv else "")


def _crossover_of(crossovers: Sequence[dict], k: tuple, metric: str, reference: str) -> Optional[dict]:
    for c in crossovers:
        if (c.get("metric") == metric and c.get("reference") == reference and c.get("variant") == k[0]
                and c.get("backend") == k[1] and int(_f(c.get("head_dim"))) == k[2] and _b(c.get("causal")) == k[3]
                and int(_f(c.get("n_kv_heads"))) == k[4]):
            return c
    return None


def crossover_note(c: Optional[dict], full_n_max: float = float("nan")) -> str:
    """What a crossover row says, short, for a legend or table: ``n*≈1.2k``, ``faster at every N``, ``slower at
    every N``, ``faster only at N≈1.2k–4.1k, slower after`` / ``faster only up to N≈4.1k, slower after`` (ahead then
    behind again: no n*); with the compared range when it is shorter than the baseline's (``N = 512 only``,
    ``N <= 2.0k``), and how much faster the variant is at the largest length when a crossing wins by less than 5 %
    (``1 % faster at 32.8k``: a crossing of two nearly equal curves is not a win)."""
    if not c:
        return ""
    ns, n_min, n_max = _f(c.get("n_star")), _f(c.get("n_min")), _f(c.get("n_max"))
    a, b = _f(c.get("ahead_from")), _f(c.get("ahead_until"))
    if c.get("status") == STATUS_AHEAD_THEN_BEHIND and math.isfinite(a) and math.isfinite(b):
        text = (f"faster only up to N≈{fmt_n(b)}" if a == n_min else f"faster only at N≈{fmt_n(a)}–{fmt_n(b)}") \
            + ", slower after"
    elif math.isfinite(ns):
        text = f"n*≈{fmt_n(ns)}"
    else:
        text = STATUS_SHORT.get(c.get("status"), str(c.get("status") or ""))
    ratio = _f(c.get("ratio_at_max"))
    if math.isfinite(ns) and math.isfinite(ratio) and 0.95 < ratio < 1:
        text += f" (only {100 * (1 - ratio):.0f} % faster at {fmt_n(n_max)})"
    if math.isfinite(n_min) and n_min == n_max:
        text += f" (N = {fmt_n(n_min)} only)"
    elif math.isfinite(n_max) and math.isfinite(full_n_max) and n_max < full_n_max:
        text += f" (N ≤ {fmt_n(n_max)})"
    return text


def _loglog_y(xs, ys, x) -> float:
    import numpy as np

    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


def _proxy(**kw):
    from matplotlib.lines import Line2D

    return Line2D([], [], **kw)


def _baseline_name(baseline) -> str:
    return "/".join(baseline) if baseline else "baseline"


def time_vs_n_spec(rows: Sequence[dict], crossovers: Sequence[dict], mode: str = "fwd_bwd",
                   reference: str = "exact", title: Optional[str] = None,
                   baseline: Optional[Sequence[str]] = None, env: Optional[dict] = None):
    """Time vs N (log-log, an :class:`eval.figspec.Figure`): one panel per variant with its backends (colour and
    marker per backend, the same in every panel), the exact ``baseline`` (``(variant, backend)``, default: the
    crossovers' exact baseline) thick black in every panel, ``n*`` against it as a star on the curve, a dotted
    vertical line and the value in the series' legend label, and a table panel of all ``n*``; setup in the title."""
    if baseline is None:
        bl = [c["baseline"] for c in crossovers if c.get("reference") == reference]
        baseline = tuple(bl[0].split("/", 1)) if bl else None
    metric = f"{mode}_ms"
    ser = {k: [r for r in v if math.isfinite(_f(r.get(metric)))] for k, v in series(rows).items()}
    ser = {k: v for k, v in ser.items() if v}
    failed = _failures(rows)
    cross_rows = [c for c in crossovers if c.get("metric") == metric and c.get("reference") == reference]
    full_n_max = max((_f(r["seq_len"]) for v in ser.values() for r in v), default=float("nan"))
    panels, any_star = [], False
    black = {"color": "k", "lw": 2.6, "zorder": 3, "marker": None}
    for fp in family_panels(sorted(set(ser) | set(failed)), baseline):
        p = figspec.Panel(fp["title"], "sequence length N", f"{mode.replace('_', '+')} time (ms)", xlog=2, ylog=True,
                          legend=True)
        bkey = _baseline_key(list(ser), baseline, fp["D"], fp["causal"])
        multi_hkv = len({k[4] for k in fp["keys"]}) > 1
        if bkey is not None and bkey not in fp["keys"]:
            p.traces.append(figspec.Trace("_baseline", [_f(r["seq_len"]) for r in ser[bkey]],
                                          [_f(r[metric]) for r in ser[bkey]], black))
        for k in fp["keys"]:
            st = backend_style(k[1])
            label = _series_label(k, multi_hkv)
            if k not in ser:  # failed before any point was measured
                p.traces.append(figspec.Trace(f"{label}: {failed[k][0].upper()} at N={failed[k][1]} (no points)", [],
                                              [], dict(st, mfc="none"), lines=False))
                continue
            xs, ys = [_f(r["seq_len"]) for r in ser[k]], [_f(r[metric]) for r in ser[k]]
            if k in failed:
                label += f" ({failed[k][0].upper()} at N={failed[k][1]})"
            if k == bkey:
                p.traces.append(figspec.Trace(f"{label}: exact baseline", xs, ys,
                                              dict(black, marker=st["marker"], ms=4)))
                continue
            c = _crossover_of(cross_rows, k, metric, reference)
            ns, note = (_f(c.get("n_star")) if c else float("nan")), crossover_note(c, full_n_max)
            p.traces.append(figspec.Trace(label + (f": {note}" if note else ""), xs, ys, dict(st, lw=1.5, ms=4)))
            if math.isfinite(ns) and len(xs) > 1:
                any_star = True
                p.vlines.append((ns, {"color": st["color"], "ls": ":", "lw": 1.2}))
                p.traces.append(figspec.Trace("_n*", [ns], [_loglog_y(xs, ys, ns)], {
                    "color": st["color"], "marker": "*", "ms": 14, "mec": "k", "zorder": 5}, lines=False))
        panels.append(p)
    if cross_rows:
        cells = sorted(([c["variant"] + _kv_heads_note(c),
                         backend_style(c["backend"])["label"], crossover_note(c, full_n_max).replace("n*≈", ""),
                         backend_style(c["backend"])["color"], _f(c.get("n_star"))] for c in cross_rows
                        if baseline is None or (c["variant"], c["backend"]) != tuple(baseline)),
                       key=lambda c: (c[4] if math.isfinite(c[4]) else 1e18, c[0], c[1]))
        panels.append(figspec.Panel(f"n* vs {_baseline_name(baseline)} ({metric})", "", "", note="no crossover rows",
                                    table=(["variant", "backend", "n*"], [c[:3] for c in cells],
                                           [c[3] for c in cells])))
    legend = [(f"{_baseline_name(baseline)}: exact baseline (thick black, every panel)", black)]
    if any_star:
        legend += [("n*: length above which the variant is faster than the baseline",
                    {"color": "lightgray", "marker": "*", "ls": "none", "ms": 13, "alpha": 1}),
                   ("dotted line: at n*", {"color": "gray", "ls": ":", "lw": 1.2})]
    what = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}.get(mode, mode)
    return figspec.Figure(f"Where does each variant become faster than exact attention? ({what} time vs N, log-log)\n"
                          + setup_caption(rows, env, title), panels, legend=legend, sharex=True, legend_ncol=3)


def _kv_heads_note(c: dict) -> str:
    """`` Hkv=<n>`` for a crossover row whose variant shares K / V heads (fewer K / V heads than its baseline has:
    GQA / MQA, whatever the variant is called), else ``""``."""
    kv, base_kv = _f(c.get("n_kv_heads")), _f(c.get("baseline_n_kv_heads"))
    return f" Hkv={int(kv)}" if math.isfinite(kv) and math.isfinite(base_kv) and kv < base_kv else ""


def group_identical(curves: Dict[tuple, Dict[float, float]], rtol: float = 0.02,
                    first: Optional[tuple] = None) -> List[List[tuple]]:
    """Curves (key -> {x: y}) that agree within ``rtol`` at every common x, grouped; ``first`` (e.g. the baseline)
    leads its group, otherwise the curve with the most points does."""
    order = sorted(curves, key=lambda k: (k != first, -len(curves[k]), str(k)))
    groups: List[List[tuple]] = []
    for k in order:
        for g in groups:
            ref = curves[g[0]]
            common = set(ref) & set(curves[k])
            if common and all(abs(curves[k][n] - ref[n]) <= rtol * max(abs(ref[n]), abs(curves[k][n]))
                              for n in common):
                g.append(k)
                break
        else:
            groups.append([k])
    return groups


def _mem_label(k: tuple, bkey, multi_hkv: bool, panel_variant: str) -> str:
    name = _series_label(k, multi_hkv)
    if k[0] != panel_variant:
        name = f"{k[0]}/{k[1]}"
    return name + (" (exact baseline)" if k == bkey else "")


def memory_vs_n_spec(rows: Sequence[dict], title: Optional[str] = None, env: Optional[dict] = None,
                     baseline: Optional[Sequence[str]] = None, rtol: float = 0.02):
    """Peak memory per sequence vs N (an :class:`eval.figspec.Figure`), one panel per variant
    (its backends plus the exact baseline), curves equal within ``rtol`` drawn once and labelled ``a = b``, the cost
    model's ``n^2`` and ``n d`` curves in every panel."""
    from eval.crossover import memory_metric

    metric = memory_metric(rows)
    ser = series(rows)
    curves: Dict[tuple, Dict[float, float]] = {}
    for k, pts in ser.items():  # per sequence (the sweep holds B * N fixed): n^2 vs n*d shows directly
        c = {_f(r["seq_len"]): _f(r[metric]) / max(_f(r.get("batch")), 1) / 2**20 for r in pts if _f(r.get(metric)) > 0}
        if c:
            curves[k] = c
    ylabel = ("peak memory" if metric == "peak_mem_bytes" else "modelled footprint") + " per sequence (MiB)"
    std, flash = {"color": "gray", "ls": "--", "lw": 1.2, "zorder": 5, "marker": None}, {
        "color": "0.6", "ls": ":", "lw": 1.6, "zorder": 5, "marker": None}
    panels, any_group = [], False
    for fp in family_panels(sorted(curves), baseline, max_series=5):
        p = figspec.Panel(fp["title"], "sequence length N", ylabel, xlog=2, ylog=True, legend=True)
        bkey = _baseline_key(list(curves), baseline, fp["D"], fp["causal"])
        keys = list(fp["keys"]) + ([bkey] if bkey is not None and bkey not in fp["keys"] else [])
        multi_hkv = len({k[4] for k in fp["keys"]}) > 1
        for g in group_identical({k: curves[k] for k in keys}, rtol, first=bkey):
            lead = max(g, key=lambda k: len(curves[k]))
            label = "\n= ".join(_mem_label(k, bkey, multi_hkv, fp["variant"]) for k in g)  # one name a line
            if len(g) > 1:
                any_group = True
                label += f"\n(equal within {rtol:.0%})"
            st = backend_style(g[0][1])
            st = dict(color="k", lw=2.6, marker=st["marker"], ms=4, zorder=3) if bkey in g else dict(st, lw=1.5, ms=4)
            xs = sorted(curves[lead])
            p.traces.append(figspec.Trace(label, xs, [curves[lead][x] for x in xs], st))
        ns = sorted({x for k in keys for x in curves[k]})
        r0 = ser[keys[0]][0]
        H, e = int(_f(r0.get("n_heads")) or 1), {"float32": 4, "float64": 8}.get(r0.get("dtype"), 2)
        for name, cost, st in (("_standard", cm.standard_attention_cost, std),
                               ("_flash", cm.flash_attention_cost, flash)):
            p.traces.append(figspec.Trace(name, ns, [cost(1, H, int(n), fp["D"], dtype_bytes=e, mode="fwd_bwd")
                                                     .footprint_bytes / 2**20 for n in ns], st))
        panels.append(p)
    legend = [(f"{_baseline_name(baseline)}: exact baseline", {"color": "k", "lw": 2.6}),
              ("cost model: standard attention (S, P: ∝ n²)", dict(std, lw=1)),
              ("cost model: flash (∝ n·d)", flash)]
    if any_group:
        legend.append((f"a = b: curves equal within {rtol:.0%}, drawn once", {"ls": "none"}))
    src = "measured peak (CUDA)" if metric == "peak_mem_bytes" else "cost-model footprint (not measured off CUDA)"
    return figspec.Figure(f"How does attention memory grow with N? ({src}, forward + backward, per sequence)\n"
                          + setup_caption(rows, env, title), panels, legend=legend, sharex=True, sharey=True,
                          legend_ncol=2)


def roofline_spec(rows: Sequence[dict], machine: "cm.Machine", mode: str = "fwd_bwd", title: Optional[str] = None,
                  env: Optional[dict] = None, baseline: Optional[Sequence[str]] = None):
    """Roofline of ``machine`` (an :class:`eval.figspec.Figure`): the roof in every panel, one panel per variant,
    each measured kernel point at (modelled intensity, achieved TFLOP/s), colour / marker per backend, marker size
    growing with log N.

    Intensity = cost-model FLOPs over HBM bytes: the modelled S / P traffic for materialising backends
    (``naive``, ``reference``, ``sdpa_math``), the compulsory traffic (inputs read once, outputs written once)
    for fused kernels, whose measured traffic is close to it (``lab/hbm_probe.py``: 1.8x compulsory for our
    flash kernel at N = 2048, against 10.7x for the L2-free tiling model)."""
    pts_of: Dict[tuple, tuple] = {}
    for k, pts in series(rows).items():
        x, y, s = [], [], []
        for r in pts:
            fl = _f(r.get("flops_fwd_bwd" if mode == "fwd_bwd" else "flops_fwd"))
            # materialising backends: their modelled S / P traffic (ncu agrees within ~20 %); fused kernels:
            # compulsory traffic (the no-cache tiling model overstates it: K / V re-reads hit L2)
            by = _f(r.get("model_hbm_bytes" if r["backend"] in _MATERIALISING else "model_min_bytes"))
            t = _f(r.get(f"{mode}_tflops"))
            if fl > 0 and by > 0 and t > 0:
                x.append(fl / by)
                y.append(t)
                s.append(8 + 4 * math.log2(max(_f(r["seq_len"]), 2)))
        if x:
            pts_of[k] = (x, y, s)
    xs = [10 ** (i / 20) for i in range(-20, 101)]
    roof = figspec.Trace("_roof", xs, [machine.attainable(x) / 1e12 for x in xs], {"color": "k", "marker": None})
    multi_d = len({k[2] for k in pts_of}) > 1
    panels = []
    for fp in family_panels(sorted(pts_of), baseline):
        p = figspec.Panel(fp["title"], "FLOP per HBM byte (modelled)", f"achieved TFLOP/s ({mode.replace('_', '+')})",
                          xlog=10, ylog=True, legend=True, traces=[roof],
                          vlines=[(machine.ridge, {"color": "gray", "ls": ":"})])
        multi_hkv = len({k[4] for k in fp["keys"]}) > 1
        for k in fp["keys"]:
            x, y, s = pts_of[k]
            p.traces.append(figspec.Trace(_series_label(k, multi_hkv) + (f" D={k[2]}" if multi_d else ""), x, y,
                                          dict(backend_style(k[1]), alpha=0.85), lines=False, sizes=s))
        panels.append(p)
    legend = [(f"{machine.name} roof: min(peak FLOP/s, intensity × bandwidth)", {"color": "k"}),
              (f"ridge {machine.ridge:.0f} FLOP/byte", {"color": "gray", "ls": ":", "lw": 1}),
              ("marker size grows with log N; intensity: compulsory traffic for fused kernels, S/P traffic for naive",
               {"color": "lightgray", "marker": "o", "ls": "none", "ms": 6, "alpha": 1})]
    return figspec.Figure("How close does each kernel get to the hardware limit? (roofline)\n"
                          + setup_caption(rows, env, title), panels, legend=legend, sharex=True, sharey=True,
                          legend_ncol=2)


def model_setup_caption(rows: Sequence[dict], env: Optional[dict] = None, title: Optional[str] = None) -> str:
    """Setup line of a GPT-level sweep (``model.csv``): device, dtype, model size, tokens per step, date."""
    env = env or {}
    r0 = rows[0] if rows else {}
    parts = [str(env.get("gpu") or (r0.get("device") or "").upper() or "")]
    if r0.get("dtype"):
        parts.append(str(r0["dtype"]))
    size = [f"{lab} {int(_f(r0[c]))}" for c, lab in (("d_model", "d_model"), ("n_layer", "layers"),
                                                      ("n_heads", "heads")) if math.isfinite(_f(r0.get(c)))]
    if size:
        parts.append("GPT " + ", ".join(size))
    backends = sorted({str(r.get("backend")) for r in rows if r.get("backend")})
    if len(backends) == 1:
        parts.append(f"backend {backends[0]}")
    params = sorted({int(_f(r["params"])) for r in rows if math.isfinite(_f(r.get("params")))})
    if params:
        parts.append(f"{params[0] / 1e6:.1f}M params" if len(params) == 1 else
                     f"{params[0] / 1e6:.1f}-{params[-1] / 1e6:.1f}M params")
    toks = sorted({int(_f(r["batch"]) * _f(r["seq_len"])) for r in rows
                   if math.isfinite(_f(r.get("batch")) * _f(r.get("seq_len")))})
    if toks:
        parts.append("/".join(f"{t:,}" for t in toks) + " tokens per step")
    date = env.get("date") or next((str(r["timestamp"])[:10] for r in rows if r.get("timestamp")), None)
    if date:
        parts.append(str(date))
    line = " · ".join(p for p in parts if p)
    return f"{title} — {line}" if title else line


def _si(x: float, _pos=None) -> str:
    """Tick label: 950k, 1.2M, 2,350."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    return f"{x:,.4g}"


def _log_ticks(axis, values: Sequence[float]) -> None:
    """Plain tick labels (950k, 1.2M) on a log axis; minor ticks labelled only when the values span < 1 decade."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    vals = [float(v) for v in values if math.isfinite(float(v)) and float(v) > 0]
    axis.set_major_formatter(FuncFormatter(_si))
    small = bool(vals) and max(vals) / min(vals) < 10
    axis.set_minor_formatter(FuncFormatter(_si) if small else NullFormatter())


def auto_scale(ax, values: Sequence[float], log_ratio: float = 8.0) -> None:
    """Log y axis when the values span more than ``log_ratio``, else linear; readable tick labels either way."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if vals and max(vals) / min(vals) > log_ratio:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(_si))


def model_sweep_spec(rows: Sequence[dict], title: Optional[str] = None, env: Optional[dict] = None,
                     rtol: float = 0.02):
    """GPT speed and memory (an :class:`eval.figspec.Figure`): training tokens/s, inference tokens/s and
    training peak memory vs context length, one panel each, one line per variant (colour per variant; the line style
    per backend when there are several); equal memory curves drawn once."""
    groups: Dict[tuple, List[dict]] = {}
    for r in sorted(rows, key=lambda r: _f(r["seq_len"])):
        if r.get("status", "ok") == "ok":
            groups.setdefault((r["variant"], r["backend"]), []).append(r)
    backends = sorted({k[1] for k in groups})
    ls_of = {b: ls for b, ls in zip(backends, ["-", "--", "-.", ":"] * 4)}

    def label(k):
        return k[0] if len(backends) == 1 else f"{k[0]}/{k[1]}"

    def style(k):
        return dict(variant_style(k[0]), ls=ls_of[k[1]] if len(backends) > 1 else "-")

    panels = []
    for col, ylabel, scale in (("train_tokens_per_s", "training step: tokens / s", 1.0),
                               ("infer_tokens_per_s", "inference (forward): tokens / s", 1.0),
                               ("train_peak_mem_bytes", "training peak memory (MiB)", 2.0 ** -20)):
        p = figspec.Panel("", "context length", ylabel, xlog=2, ylog="auto", legend=True,
                          note="not measured" + (" (CUDA only)" if "mem" in col else ""))
        curves = {k: c for k, pts in sorted(groups.items())
                  if (c := {_f(r["seq_len"]): _f(r.get(col)) * scale for r in pts if _f(r.get(col)) > 0})}
        for g in group_identical(curves, rtol) if "mem" in col else [[k] for k in curves]:
            xs = sorted(curves[g[0]])
            p.traces.append(figspec.Trace(" = ".join(label(k) for k in g) + (
                f" (equal within {rtol:.0%})" if len(g) > 1 else ""), xs, [curves[g[0]][x] for x in xs], style(g[0])))
        panels.append(p)
    return figspec.Figure("How fast does the whole GPT train and infer with each attention variant?\n"
                          + model_setup_caption(rows, env, title), panels, sharex=True)


def plot_quality_vs_n(rows: Sequence[dict], base: str, title: Optional[str] = None) -> List[str]:
    """Quality vs context length per variant, one panel per (dataset, metric) (see :mod:`eval.quality`); the
    figure of :func:`eval.figspec.quality_vs_n`."""
    return figspec.to_png(figspec.quality_vs_n(rows, title), base)


def plot_bubble(rows: Sequence[dict], base: str, quality: str, speed: str = "tokens_per_s",
                memory: str = "peak_mem_mb", title: Optional[str] = None, caption: Optional[str] = None,
                impl: Optional[str] = None) -> List[str]:
    """LRA Fig. 3 style: y quality, x speed, bubble area memory; one colour and marker per variant, one panel
    per seq_len, a key of bubble sizes (:func:`eval.figspec.bubble`).

    ``rows``: the joined table of :func:`eval.quality.join_speed` / :func:`eval.quality.join_bench_speed`
    (``variant``, ``seq_len``, ``dataset`` and the named columns). Points without memory are drawn hollow.
    ``impl``: a column naming the implementation behind each point's speed (``bench_backend`` with
    ``compare=best``), written beside the point and in its hover text.
    """
    return figspec.to_png(figspec.bubble(rows, quality, speed, memory, title, caption, impl=impl), base)


def _drawn(spec):
    """A function of ``spec``'s arguments that returns its figure drawn by :func:`eval.figspec.to_matplotlib`."""

    def draw(*args, **kw):
        return figspec.to_matplotlib(spec(*args, **kw))

    draw.__doc__ = f"The matplotlib figure of :func:`{spec.__module__}.{spec.__name__}` (same arguments)."
    return draw


time_vs_n_figure, memory_vs_n_figure = _drawn(time_vs_n_spec), _drawn(memory_vs_n_spec)
roofline_figure, model_sweep_figure = _drawn(roofline_spec), _drawn(model_sweep_spec)
bubble_figure = _drawn(figspec.bubble)


def _machine(machine, env: dict) -> Optional["cm.Machine"]:
    """The roofline's machine: ``machine`` (a preset name: an unknown one raises ``ValueError`` naming ``machine=``
    and the presets), else the preset of the results' GPU name; ``None`` (no roofline) on a CPU or a GPU without a
    preset, which is said."""
    if isinstance(machine, cm.Machine):
        return machine
    if machine:
        return cm.get_machine(str(machine))
    name = (env or {}).get("gpu")
    if not name:
        return None
    try:
        return cm.get_machine(str(name))
    except ValueError:
        print(f"roofline left out: no roofline preset for the results' GPU {name!r}; give machine=one of "
              f"{', '.join(cm.MACHINES)} to draw it against one")
        return None


def read_env(results_dir: str) -> dict:
    """The sweep's environment (date, GPU, versions): ``crossover.json``'s ``env``, else ``env.json``'s."""
    import json

    for name in ("crossover.json", "env.json"):
        path = os.path.join(results_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                env = json.load(f).get("env") or {}
            if env:
                return {k: v for k, v in env.items() if k != "sweep"}
    return {}


def sweep_figures(results_dir: str, figures_dir: Optional[str] = None, machine=None, title: Optional[str] = None,
                  prefix: str = "", formats=("png", "svg")) -> Dict[str, List[str]]:
    """All sweep figures from ``<results_dir>/{kernel,crossover,model}.csv``; returns name -> [png, svg]."""
    import json

    set_formats(formats)
    from eval.sweep import latest_rows, read_rows

    figures_dir = figures_dir or results_dir
    rows = latest_rows(read_rows(os.path.join(results_dir, "kernel.csv")))
    cross_path = os.path.join(results_dir, "crossover.json")
    cross = []
    if os.path.exists(cross_path):
        with open(cross_path) as f:
            d = json.load(f)
        cross = [dict(c, n_star=_f(c.get("n_star"))) for c in d.get("rows", [])]
    env = read_env(results_dir)
    bl = [c["baseline"] for c in cross if c.get("reference") == "exact"]
    baseline = tuple(bl[0].split("/", 1)) if bl else None
    out: Dict[str, List[str]] = {}

    def draw(name: str, fig: "figspec.Figure") -> None:  # <figures_dir>/<prefix><name>.<format>
        out[name] = figspec.to_png(fig, os.path.join(figures_dir, prefix + name))

    modes = [m for m in ("fwd_bwd", "fwd", "bwd") if any(math.isfinite(_f(r.get(f"{m}_ms"))) for r in rows)]
    for m in modes[:2]:
        draw(f"time_vs_n_{m}", time_vs_n_spec(rows, cross, m, title=title, baseline=baseline, env=env))
    if rows:
        draw("memory_vs_n", memory_vs_n_spec(rows, title, env, baseline))
    mach = _machine(machine, env)
    if mach is not None and rows:
        draw("roofline", roofline_spec(rows, mach, (modes or ["fwd_bwd"])[0], title, env, baseline))
    mrows = read_rows(os.path.join(results_dir, "model.csv"))
    if mrows:
        draw("model_tokens_per_s", model_sweep_spec(mrows, title, env))
    return out


def main_from_cfg(cfg: dict) -> Dict[str, List[str]]:
    """``eval.plots`` entry: ``results_dir`` (sweep figures) and / or ``quality_csv`` (quality figures) and / or
    ``doclen_dir`` (the n*_doc figure). Refuses (``ValueError`` / ``FileNotFoundError`` naming the argument, printed
    by Hydra as the message alone) when none is given, a path given is not there, ``formats`` / ``machine`` is not
    an allowed value, or nothing could be drawn from what was given."""
    from eval import config_errors

    with config_errors():
        check_plots_config(cfg)
    figs: Dict[str, List[str]] = {}
    fd = cfg.get("figures_dir")
    set_formats(cfg.get("formats"))
    if cfg.get("results_dir"):
        figs.update(sweep_figures(cfg["results_dir"], fd or cfg["results_dir"], machine=cfg.get("machine"),
                                  title=cfg.get("title"), prefix=cfg.get("prefix") or "",
                                  formats=cfg.get("formats") or ("png", "svg")))
    if cfg.get("doclen_dir"):
        from eval.doclen import figure as doclen_figure

        figs["doclen_crossover"] = doclen_figure(cfg["doclen_dir"], fd or cfg["doclen_dir"],
                                                 measured=cfg.get("doclen_measured"),
                                                 formats=cfg.get("formats") or ("png", "svg"))
    if cfg.get("quality_csv"):
        from eval.quality import quality_figures

        figs.update(quality_figures(cfg["quality_csv"], fd or os.path.dirname(cfg["quality_csv"]),
                                    speed_csv=cfg.get("speed_csv"), prefix=cfg.get("prefix") or "",
                                    title=cfg.get("title"), speed=cfg.get("speed"),
                                    speed_backend=cfg.get("speed_backend") or "triton",
                                    speed_size=cfg.get("speed_size")))
    if not figs:
        with config_errors():
            raise ValueError(f"nothing to plot: results_dir={cfg.get('results_dir')} holds no measured rows (kernel.csv "
                             f"/ model.csv); no figure written")
    for k, v in figs.items():
        print(f"{k}: {v[0]}")
    return figs


PLOT_INPUTS = ("results_dir", "quality_csv", "doclen_dir")
QUALITY_REQUIRED = ("dataset", "variant", "seq_len", "metric", "value")


def check_results_dir(rd: str, where: str) -> None:
    """The sweep tables of ``rd`` that the figures read, checked (``where`` names the argument): ``kernel.csv`` /
    ``model.csv`` with the columns eval.sweep writes, ``crossover.json`` / ``env.json`` valid JSON objects; else
    ``ValueError`` naming the file and what was expected (it was a pandas / JSON traceback, a KeyError, or figures
    silently missing)."""
    from eval.bench_common import checked_json, checked_rows
    from eval.sweep import COLUMNS, MODEL_COLUMNS

    for name, cols in (("kernel.csv", COLUMNS), ("model.csv", MODEL_COLUMNS)):
        need = cols[:cols.index("timestamp") + 1]  # what every version of eval.sweep wrote (later ones add more)
        if os.path.exists(os.path.join(rd, name)):
            checked_rows(os.path.join(rd, name), f"{where}: results CSV {name}", need,
                         "the columns written by eval.sweep (a sweep's out_dir)")
    for name in ("crossover.json", "env.json"):
        if os.path.exists(os.path.join(rd, name)):
            checked_json(os.path.join(rd, name), f"{where}: {name}",
                         f"the {name} eval.crossover writes (or remove it: the figures are drawn without it)")


def check_plots_config(cfg: dict) -> None:
    """``eval.plots``' arguments before anything is drawn: at least one of :data:`PLOT_INPUTS`; each path given
    exists (``results_dir`` with a ``kernel.csv`` or ``model.csv``, ``doclen_dir`` with ``fit.json``; ``speed_csv``
    / ``speed`` / ``doclen_measured`` files) and is readable with the columns the figures need (empty, truncated or
    corrupt CSV / JSON files refused: :func:`check_results_dir`); ``formats`` and ``machine`` allowed values. Raises
    ``ValueError`` / ``FileNotFoundError`` naming the argument and the file."""
    from eval.bench_common import check_out_dir

    check_formats(cfg.get("formats"))
    check_out_dir(cfg.get("figures_dir"), "figures_dir")
    if cfg.get("machine"):
        cm.get_machine(str(cfg["machine"]))
    if not any(cfg.get(k) for k in PLOT_INPUTS):
        raise ValueError("nothing to plot: give results_dir=<a sweep's out_dir> (eval.crossover), quality_csv=<eval."
                         "quality's quality.csv> or doclen_dir=<eval.doclen's --out>")
    rd = cfg.get("results_dir")
    if rd:
        if not os.path.isdir(rd):
            raise FileNotFoundError(f"results_dir={rd}: no such directory (a sweep's out_dir: kernel.csv, crossover.json)")
        if not any(os.path.exists(os.path.join(rd, f)) for f in ("kernel.csv", "model.csv")):
            raise FileNotFoundError(f"results_dir={rd}: holds neither kernel.csv nor model.csv (is it a sweep's out_dir?)")
        check_results_dir(rd, f"results_dir={rd}")
    for key in ("quality_csv", "speed_csv", "speed"):
        path = cfg.get(key)
        if path and not os.path.isfile(path):
            raise FileNotFoundError(f"{key}={path}: no such file")
    from eval.bench_common import checked_rows

    q = cfg.get("quality_csv")
    if q:
        if not checked_rows(q, f"quality_csv={q}", QUALITY_REQUIRED, "the quality.csv eval.quality writes"):
            raise ValueError(f"quality_csv={q}: the table has no rows; nothing to plot")
        agg = os.path.join(os.path.dirname(q), "runs_agg.csv")  # the bubble charts' table, beside it
        if os.path.exists(agg):
            checked_rows(agg, f"quality_csv={q}: runs_agg.csv beside it", ("dataset", "variant", "seq_len"),
                         "the runs_agg.csv eval.quality writes")
    if cfg.get("speed_csv"):
        checked_rows(cfg["speed_csv"], f"speed_csv={cfg['speed_csv']}",
                     ("variant", "seq_len", "train_tokens_per_s", "train_peak_mem_bytes"),
                     "a model.csv of eval.sweep (an eval.bench_model CSV goes to speed=)")
    if cfg.get("speed"):
        from eval.quality import BENCH_COLUMNS

        checked_rows(cfg["speed"], f"speed={cfg['speed']}", BENCH_COLUMNS, "an eval.bench_model CSV")
    dd = cfg.get("doclen_dir")
    if dd:
        if not os.path.isfile(os.path.join(dd, "fit.json")):
            raise FileNotFoundError(f"doclen_dir={dd}: no fit.json there (eval.doclen --out writes it)")
        from eval.doclen import check_figure_inputs

        check_figure_inputs(dd, f"doclen_dir={dd}", cfg.get("doclen_measured"), "doclen_measured")


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    import sys

    from eval import hydra_cli

    # one module: eval.figspec.to_png and eval.quality import eval.plots (FORMATS, set by set_formats), which would
    # otherwise be a second copy of this file, with the default formats
    sys.modules.setdefault("eval.plots", sys.modules[__name__])
    hydra_cli("plots", main_from_cfg)
