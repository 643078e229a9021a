"""One figure definition, two renderers: a figure is built once from a results table as a :class:`Figure` (panels
of traces) and drawn either as a static image by matplotlib (:func:`to_png`, the PNGs in ``docs/``) or as a Plotly
figure (:func:`to_plotly`, the interactive report of :mod:`eval.report`, hover and filters included).

Every figure of ``eval/`` is a :class:`Figure`: the shared definitions here (:func:`lines`, :func:`quality_vs_n`,
:func:`bubble`, :func:`fig2`, :func:`crossover`), the sweep figures of :mod:`eval.plots` (``*_spec``: time vs N with
its n* table panel, memory vs N, roofline, GPT speed), the recall reports of :mod:`eval.recall` (cliff, hybrids,
ablation bars, learning curves) and :mod:`eval.bench_decode`'s: one figure code path (no figure is drawn
outside :func:`to_matplotlib` / :func:`to_plotly` / :func:`to_wandb`). A trace's ``meta`` (e.g.
``{"variant": ..., "backend": ...}``) travels into the Plotly JSON so the report can filter traces; ``hover`` holds
one text per point (the run and its command in the MQAR grid). Pure data: no renderer is imported until used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from eval.crossover import _f


def _i(x) -> int:
    """An int of a table cell; -1 when missing."""
    v = _f(x)
    return int(v) if math.isfinite(v) else -1


@dataclass
class Trace:
    """One series: points ``x``, ``y``; ``style`` from :func:`eval.plots.variant_style` (color, marker, ls; also
    lw, ms, mec, mfc, zorder, alpha: see :data:`MPL_KEYS`); a ``name`` starting with ``_`` stays out of legends;
    ``sizes``: marker areas in points^2 (a bubble chart), ``hollow``: per point, draw the marker unfilled;
    ``hover``: one text per point; ``meta``: what the report filters on; ``lines``: join the points."""

    name: str
    x: List[float]
    y: List[float]
    style: dict
    lines: bool = True
    sizes: Optional[List[float]] = None
    hollow: Optional[List[bool]] = None
    hover: Optional[List[str]] = None
    meta: Dict[str, object] = field(default_factory=dict)
    bars: bool = False  # horizontal bars of length x at y (hollow: white and hatched)
    bar_height: float = 0.65  # in y units (two traces side by side at y -/+ 0.18: 0.34)
    text: Optional[List[str]] = None  # a label beside each point or bar


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    traces: List[Trace] = field(default_factory=list)
    xlog: int = 0  # 0: linear axis, else the log base
    ylog: object = False  # True, False or "auto" (log when the values span more than 8x)
    xticks: Optional[List[float]] = None
    ylim: Optional[Sequence[float]] = None
    xlim: Optional[Sequence[float]] = None
    ylabels: Optional[List[str]] = None  # category names at y = 0, 1, ... (top down)
    y_reversed: bool = False
    hlines: List = field(default_factory=list)  # y (a dashed grey line: chance) or (y, style)
    vlines: List = field(default_factory=list)  # x or (x, style), as hlines
    legend: bool = False  # a legend of this panel's traces (matplotlib)
    note: str = ""  # said in the panel when it has no trace
    table: Optional[tuple] = None  # (column labels, rows of cells, colour of each row's column 1[, column widths])


@dataclass
class Figure:
    """``legend``: (label, style) of the shared legend, in order; ``size_key``: (area, label) of a bubble-size key
    titled ``size_title``; ``sharex`` / ``sharey``: one axis range for every panel."""

    title: str
    panels: List[Panel]
    legend: List[tuple] = field(default_factory=list)
    size_key: List[tuple] = field(default_factory=list)
    size_title: str = ""
    ncols: int = 3
    panel_w: float = 4.6
    panel_h: float = 3.6
    sharex: bool = False
    sharey: bool = False
    legend_ncol: Optional[int] = None  # entries per row of the shared legend (default: what fits the width)


def _vstyle(v: str) -> dict:
    from eval.plots import variant_style

    return variant_style(v)


def _run_hover(r: dict) -> str:
    """The hover lines of a row's ``run`` folder and ``command``, where the row has them."""
    return (f"<br>run: {r['run']}" if r.get("run") else "") + (f"<br>{r['command']}" if r.get("command") else "")


# legend entries of the MQAR figures (eval.recall draws them too)
CHANCE = ("chance: 1 / kv pairs", {"color": "gray", "ls": "--"})
CUT_OFF = ("hollow: run cut off before max_steps", {"color": "gray", "ls": "none", "marker": "o", "hollow": True})


def _better(metric: str) -> str:
    return "lower is better" if metric in ("val_bpb", "val_loss") else "higher is better"


# --------------------------------------------------------------------------------------------- definitions
def lines(rows: Sequence[dict], panel: str, x: str, y: str, title: str, xlabel: str, ylabel, series: str = "variant",
          label=None, ncols: int = 3, panel_w: float = 5.0, panel_h: float = 3.6) -> Figure:
    """Small multiples of lines: one panel per value of ``rows[panel]`` (a column name, or a function of a row), one
    line per ``series`` value (variant styles) of ``y`` vs ``x`` (log2 axis, ticks at the data). ``ylabel``: a text
    or a function of the panel value; ``label``: legend label of a series value (default: itself)."""
    key = panel if callable(panel) else (lambda r: r[panel])
    names = sorted({r[series] for r in rows})
    panels = []
    for pv in sorted({key(r) for r in rows}):
        sel = [r for r in rows if key(r) == pv]
        p = Panel(pv if isinstance(pv, str) else ": ".join(map(str, pv)), xlabel,
                  ylabel(pv) if callable(ylabel) else ylabel, xlog=2, xticks=sorted({int(_f(r[x])) for r in sel}))
        for v in names:
            pts = sorted([r for r in sel if r[series] == v], key=lambda r: _f(r[x]))
            if pts:
                p.traces.append(Trace(v, [_f(r[x]) for r in pts], [_f(r[y]) for r in pts], _vstyle(v),
                                      meta={series: v, "panel": str(pv)}))
        panels.append(p)
    return Figure(title, panels, legend=[(label(v) if label else v, _vstyle(v)) for v in names],
                  ncols=ncols if len(panels) not in (2, 4) else 2, panel_w=panel_w, panel_h=panel_h)


def quality_vs_n(rows: Sequence[dict], title: Optional[str] = None) -> Figure:
    """Quality vs context length per variant, one panel per (dataset, metric) of the long table of
    :func:`eval.quality.long_form` (``dataset``, ``variant``, ``seq_len``, ``metric``, ``value``)."""
    return lines(rows, lambda r: (r["dataset"], r["metric"]), "seq_len", "value",
                 "What does each variant cost in quality as the context grows?" + (f"\n{title}" if title else ""),
                 "seq_len", lambda pv: f"{pv[1]} ({_better(pv[1])})")


BUBBLE_MAX_AREA = 900.0  # points^2 of the largest memory


def _nice(x: float) -> float:
    """``x`` rounded to 2 significant digits (values of the bubble-size key)."""
    if not (x > 0):
        return x
    p = 10 ** (math.floor(math.log10(x)) - 1)
    return round(x / p) * p


def bubble(rows: Sequence[dict], quality: str, speed: str = "tokens_per_s", memory: str = "peak_mem_mb",
           title: Optional[str] = None, caption: Optional[str] = None, impl: Optional[str] = None) -> Figure:
    """Long Range Arena Fig. 3 style: one panel per seq_len, y quality, x speed (log), bubble area proportional to
    memory (hollow when memory is unknown), one colour and marker per variant, a key of bubble sizes in MiB.
    ``rows``: the joined table of :func:`eval.quality.join_speed` (``variant``, ``seq_len`` and the named columns;
    ``run`` / ``command``, when present, go into the hover text). ``impl``: a column naming the implementation
    behind each point's speed (``compare=best``: ``bench_backend``), a label beside the point and in its hover."""
    pts = [r for r in rows if math.isfinite(_f(r.get(quality))) and _f(r.get(speed)) > 0]
    lens = sorted({int(_f(r["seq_len"])) for r in pts}) or [0]
    vs = sorted({r["variant"] for r in pts})
    mems = [_f(r.get(memory)) for r in pts if _f(r.get(memory)) > 0]
    mmax = max(mems) if mems else 1.0
    lower = quality in ("val_bpb", "val_loss")
    panels = []
    for n in lens:
        p = Panel(f"seq_len {n}", f"training speed ({speed.replace('_', ' ')})", f"{quality} ({_better(quality)})",
                  xlog=10, y_reversed=lower)
        for v in vs:
            sel = [r for r in pts if r["variant"] == v and int(_f(r["seq_len"])) == n]
            if not sel:
                continue
            m = [_f(r.get(memory)) for r in sel]
            p.traces.append(Trace(
                v, [_f(r[speed]) for r in sel], [_f(r[quality]) for r in sel], _vstyle(v), lines=False,
                sizes=[max(BUBBLE_MAX_AREA * x / mmax, 12) if x > 0 else 40 for x in m],
                hollow=[not (x > 0) for x in m],
                hover=[f"{v}, seq_len {n}<br>{quality} {_f(r[quality]):.4g}, {speed} {_f(r[speed]):,.0f}, "
                       f"{memory} {_f(r.get(memory)):,.1f}" + (f", implementation {r.get(impl)}" if impl else "")
                       + _run_hover(r) for r in sel],
                text=[str(r.get(impl)) for r in sel] if impl else None,
                meta={"variant": v, "seq_len": n}))
        panels.append(p)
    key = []
    if mems:
        for frac in (0.25, 0.5, 1.0):
            val = _nice(mmax * frac)
            key.append((max(BUBBLE_MAX_AREA * val / mmax, 12), f"{val:,.0f} MiB" if val >= 10 else f"{val:.2g} MiB"))
    if any(not (_f(r.get(memory)) > 0) for r in pts):
        key.append((None, "memory not measured"))
    head = f"Which variant gives the best {quality} for its speed and memory? (one panel per seq_len)"
    return Figure(head + (f"\n{title}" if title else "") + (f"\n{caption}" if caption else ""), panels,
                  legend=[(v, dict(_vstyle(v), ls="none")) for v in vs], size_key=key,
                  size_title="bubble area =\npeak memory", ncols=4, panel_w=4.0, sharex=True, sharey=True)


def fig2(rows: Sequence[dict], caption: str, select: str = "best") -> Figure:
    """Zoology Fig. 2: MQAR accuracy vs d_model (log2), one panel per seq_len, one line per variant, chance dashed,
    runs cut off before max_steps hollow. ``rows``: :func:`eval.recall.fig2_table` (``run`` / ``command``, when
    present, go into the hover text)."""
    lens = sorted({int(r["seq_len"]) for r in rows})
    variants = sorted({r["variant"] for r in rows})
    panels = []
    for n in lens:
        sel = [r for r in rows if int(r["seq_len"]) == n]
        pairs = sorted({int(_f(r["num_kv_pairs"])) for r in sel if math.isfinite(_f(r["num_kv_pairs"]))})
        p = Panel(f"seq_len {n}" + (f", {'/'.join(map(str, pairs))} kv pairs" if pairs else ""),
                  "model dimension (d_model)", "MQAR accuracy", xlog=2,
                  xticks=sorted({r["d_model"] for r in sel}), ylim=(0, 1.03),
                  hlines=sorted({_f(r["chance"]) for r in sel if math.isfinite(_f(r["chance"]))}))
        for v in variants:
            pts = sorted([r for r in sel if r["variant"] == v], key=lambda r: r["d_model"])
            if pts:
                p.traces.append(Trace(
                    v, [r["d_model"] for r in pts], [r["acc"] for r in pts], _vstyle(v),
                    hollow=[_f(r.get("finished", 1)) < 1 for r in pts],
                    hover=[f"{v}, seq_len {n}, d_model {r['d_model']}: acc {r['acc']:.3f} (lr {r.get('best_lr')})"
                           + _run_hover(r) for r in pts],
                    meta={"variant": v, "seq_len": n}))
        panels.append(p)
    legend = [(v, _vstyle(v)) for v in variants] + [CHANCE]
    if any(_f(r.get("finished", 1)) < 1 for r in rows):
        legend.append(CUT_OFF)
    acc = "best validation (max, as Zoology)" if select == "best" else "last validation"
    return Figure("Which variants solve associative recall, and at what model width? (Zoology Fig. 2)\n"
                  f"accuracy: {acc}, best over optim.lr · " + caption, panels, legend=legend, ncols=4,
                  panel_w=3.9, panel_h=3.4, sharey=True)


CROSSOVER_METRICS = (("fwd_bwd_ms", "time fwd+bwd (ms)"), ("fwd_ms", "time fwd (ms)"),
                     ("peak_mem_bytes", "peak memory (MiB)"))


def crossover(rows: Sequence[dict], crossovers: Sequence[dict] = (), metrics=CROSSOVER_METRICS) -> Figure:
    """Speed and memory vs N (log-log), one panel per metric, one trace per (variant, backend, head dim, KV heads,
    GPU) of the kernel sweep table (``kernel.csv`` rows with a ``gpu`` column); the n* of each crossover row of that
    metric (:func:`eval.crossover.detect_crossovers`) a star on its curve. ``meta``: variant, backend, head_dim,
    gpu (the report's filters)."""
    from eval.plots import _loglog_y, backend_style

    keys = sorted({(r["variant"], r.get("backend", "?"), _i(r.get("head_dim")), _i(r.get("n_kv_heads")),
                    r.get("gpu", "?")) for r in rows})
    panels = []
    for metric, label in metrics:
        scale = 1 / 2 ** 20 if metric.endswith("bytes") else 1.0
        p = Panel(label, "sequence length N", label, xlog=2, ylog=True)
        p.xticks = sorted({_i(r["seq_len"]) for r in rows if _f(r.get(metric)) > 0})
        for v, b, d, hkv, gpu in keys:
            sel = sorted([r for r in rows if (r["variant"], r.get("backend", "?"), _i(r.get("head_dim")),
                                              _i(r.get("n_kv_heads")), r.get("gpu", "?")) == (v, b, d, hkv, gpu)
                          and _f(r.get(metric)) > 0], key=lambda r: _f(r["seq_len"]))
            if not sel:
                continue
            bs = backend_style(b)
            st = {"color": bs["color"], "marker": bs["marker"], "ls": _vstyle(v)["ls"]}
            name = f"{v} / {b}" + (f" (Hkv {hkv})" if v in ("gqa", "mqa") else "")
            meta = {"variant": v, "backend": b, "head_dim": d, "gpu": gpu}
            xs, ys = [_f(r["seq_len"]) for r in sel], [_f(r[metric]) * scale for r in sel]
            p.traces.append(Trace(name, xs, ys, st, meta=meta, hover=[
                f"{name}, d={d}, {gpu}<br>N {int(x):,}: {y:.4g} {label}" for x, y in zip(xs, ys)]))
            for c in crossovers:
                if (c.get("variant"), c.get("backend"), _i(c.get("head_dim")), c.get("metric"),
                        c.get("gpu", "?")) == (v, b, d, metric, gpu) and _f(c.get("n_star")) > 0:
                    n = _f(c["n_star"])
                    p.traces.append(Trace("n* (crossover)", [n], [_loglog_y(xs, ys, n)],
                                          {"color": st["color"], "marker": "*", "ls": "none"}, lines=False,
                                          sizes=[180.0], meta=dict(meta, n_star=n), hover=[
                                              f"{name}: n* = {n:,.0f} vs {c.get('baseline')}"]))
        panels.append(p)
    return Figure("Where does each variant become faster than exact attention? (n* starred)", panels,
                  ncols=len(panels), panel_w=4.6)


DOCLEN_STYLE = {"fixed": ("tab:blue", "o"), "geometric": ("tab:orange", "s"), "lognormal": ("tab:green", "^"),
                "pareto": ("tab:red", "v"), "wikitext-2": ("black", "D")}


def doclen(curves: Sequence[dict], nstars: Sequence[dict], wiki: Sequence[dict], fit: dict,
           measured: Optional[Sequence[dict]] = None, tile_label: str = "128 x 128 tiles") -> Figure:
    """Crossovers by document length (:mod:`eval.doclen`): one panel per sequence length N, x the mean document
    length (log2), y the time per token (log); one line per family of the modelled document-masked exact attention
    (``doclen_curves.csv``; dashed: its tile model, ``exact_us_per_token_tiles``, when the table has it), linear
    attention's flat line (black), n*_doc of each family a star on that line
    (``doclen.csv``), the real WikiText-2 articles a black diamond (``doclen_wikitext.csv``), n* by N (the dense
    crossover) a dotted vertical line; ``measured`` (``doclen_measured.csv``), when given: the timed points hollow
    and linear's measured time a dashed line. ``fit``: the constants (``c0``, ``c2``, ``c_lin``, ``source``)."""
    Ns = sorted({_i(r["N"]) for r in curves})
    fams = [f for f in DOCLEN_STYLE if any(r["family"] == f for r in curves)]
    fams += sorted({r["family"] for r in curves} - set(fams))
    st = lambda f: dict(zip(("color", "marker"), DOCLEN_STYLE.get(f, ("gray", "x"))), ls="-")  # noqa: E731
    lin = {"color": "black", "ls": "-", "lw": 2.2}
    nstar_n = _f(fit.get("n_star_fit"))
    panels = []
    for N in Ns:
        p = Panel(f"N = {N:,}", "mean document length (tokens)", "fwd+bwd time per token (us)", xlog=2, ylog=True,
                  vlines=[(nstar_n, {"color": "gray", "ls": ":", "lw": 1.2})] if nstar_n > 0 else [])
        xs_all = []
        for f in fams:
            sel = sorted([r for r in curves if _i(r["N"]) == N and r["family"] == f], key=lambda r: _f(r["mean"]))
            if not sel:
                continue
            xs = [_f(r["mean"]) for r in sel]
            xs_all += xs
            p.traces.append(Trace(f"{f} (model)" if f != "wikitext-2" else "wikitext-2 rescaled (model)", xs,
                                  [_f(r["exact_us_per_token"]) for r in sel], dict(st(f), ms=3), meta={"family": f},
                                  hover=[f"{f}, N {N}: mean {x:,.0f}, E[l^2]/E[l] of pieces "
                                         f"{_f(r['piece_size_biased']):,.0f}" for x, r in zip(xs, sel)]))
            yt = [_f(r.get("exact_us_per_token_tiles")) for r in sel]
            if any(y > 0 for y in yt):
                p.traces.append(Trace(f"_{f} (tile model)", xs, yt, {"color": st(f)["color"], "ls": "--", "lw": 1.0},
                                      meta={"family": f, "model": "tiles"}))
        x0, x1 = (min(xs_all), max(xs_all)) if xs_all else (1.0, 2.0 * N)
        p.traces.append(Trace("linear (model: c_lin)", [x0, x1], [_f(fit["c_lin"])] * 2, lin,
                              meta={"family": "linear"}))
        for r in nstars:
            n = _f(r.get("n_star_mean"))
            if _i(r["N"]) == N and math.isfinite(n) and n > 0:
                f = r["family"]
                p.traces.append(Trace("_n*", [n], [_f(fit["c_lin"])], {"color": st(f)["color"], "marker": "*",
                                                                        "ls": "none", "ms": 15, "mec": "k",
                                                                        "zorder": 5},
                                      lines=False, meta={"family": f, "n_star": n},
                                      hover=[f"{f}: n*_doc = {n:,.0f} (mean document length), N {N}"]))
        for r in wiki:
            if _i(r["N"]) == N:
                x, y = _f(r["mean"]), _f(r["exact_us_per_token"])
                p.traces.append(Trace("WikiText-2 articles (model)", [x], [y], {"color": "black", "marker": "D",
                                                                               "ls": "none", "ms": 9, "zorder": 6},
                                      lines=False, meta={"family": "wikitext-2 real"},
                                      hover=[f"WikiText-2 articles: mean {x:,.0f} bytes, p90 {_f(r['p90']):,.0f}; "
                                             f"exact / linear = {_f(r['exact_over_linear']):.2f}"]))
        if measured:
            mrows = [r for r in measured if _i(r["N"]) == N and _f(r.get("us_per_token")) > 0]
            for f in fams:
                sel = sorted([r for r in mrows if r["family"] == f and r["impl"] == "exact"],
                             key=lambda r: _f(r["target_mean"]))
                if sel:
                    p.traces.append(Trace(f"{f} (measured)", [_f(r["target_mean"]) for r in sel],
                                          [_f(r["us_per_token"]) for r in sel], dict(st(f), ls="none", ms=7),
                                          lines=False, hollow=[True] * len(sel), meta={"family": f, "measured": True}))
            for r in mrows:
                if r["impl"] == "linear":
                    p.hlines.append((_f(r["us_per_token"]), {"color": "black", "ls": "--", "lw": 1.4}))
        panels.append(p)
    legend = [(f"{f} (model)" if f != "wikitext-2" else "WikiText-2 lengths rescaled (model)", st(f)) for f in fams]
    if any(_f(r.get("exact_us_per_token_tiles")) > 0 for r in curves):
        legend.append((f"dashed: tile model ({tile_label})", {"color": "gray", "ls": "--", "lw": 1.0}))
    legend += [("linear attention (model)", lin),
               ("n*_doc: exact = linear", {"color": "gray", "marker": "*", "ls": "none", "ms": 12}),
               ("WikiText-2 real articles", {"color": "black", "marker": "D", "ls": "none"}),
               (f"n* by N (dense sweep) = {nstar_n:,.0f}", {"color": "gray", "ls": ":"})]
    if measured:
        legend += [("measured (H200): hollow", {"color": "gray", "marker": "o", "ls": "none", "hollow": True}),
                   ("linear measured", {"color": "black", "ls": "--"})]
    src = str(fit.get("source", "")).split(":")[0]
    return Figure("When does document-masked exact attention cost more than linear attention? n*_doc by document "
                  f"length at fixed N\nmodel: c0 + c2 E[sum l^2] / N vs c_lin (c0 {_f(fit['c0']):.3g}, c2 "
                  f"{_f(fit['c2']):.3g}, c_lin {_f(fit['c_lin']):.3g} us/token, fitted on {src})"
                  + (" · hollow: measured" if measured else ""), panels, legend=legend, ncols=len(panels) or 1,
                  panel_w=4.8, panel_h=3.8)


MPL_KEYS = ("color", "marker", "ls", "lw", "ms", "mec", "mfc", "zorder", "alpha")


def _mpl(st: dict) -> dict:
    return {k: v for k, v in st.items() if k in MPL_KEYS}


def _hline(h) -> tuple:
    """``(y, {"color", "ls", "lw"})`` of a panel's horizontal line (a bare y: grey dashed)."""
    y, st = h if isinstance(h, tuple) else (h, {})
    return y, {"color": "gray", "ls": "--", "lw": 1, **st}


# --------------------------------------------------------------------------------------------- matplotlib
def to_matplotlib(fig: Figure):
    """The figure drawn by matplotlib (constrained layout, one shared legend below, the size key at the right)."""
    from eval.plots import _log_ticks, _proxy, auto_scale, grid, suptitle

    mfig, axes = grid(len(fig.panels), ncols=fig.ncols, panel_w=fig.panel_w, panel_h=fig.panel_h,
                      sharex=fig.sharex, sharey=fig.sharey)
    for ax, p in zip(axes, fig.panels):
        if p.table is not None:
            _table(ax, p)
            continue
        for t in p.traces:
            st = t.style
            hollow = t.hollow or [False] * len(t.x)
            if t.bars:
                for x, y, h, tx in zip(t.x, t.y, hollow, t.text or [""] * len(t.x)):
                    ax.barh(y, x, height=t.bar_height, color="white" if h else st["color"], edgecolor=st["color"], lw=1.4,
                            hatch="//" if h else None)
                    ax.text(x + 0.01, y, tx, va="center", fontsize=8)
                continue
            if t.sizes is not None:  # bubbles: the filled ones (one legend entry), then the hollow ones
                for want, kw in ((False, dict(color=st["color"], alpha=st.get("alpha", 0.55), edgecolors="k",
                                              linewidths=0.6, label=t.name)),
                                 (True, dict(facecolors="none", edgecolors=st["color"], linewidths=1.2))):
                    sel = [(x, y, s) for x, y, s, h in zip(t.x, t.y, t.sizes, hollow) if h == want]
                    if sel:
                        ax.scatter(*zip(*sel), marker=st["marker"], **kw)
                continue
            ln, = ax.plot(t.x, t.y, label=t.name, **{"lw": 1.6, "ms": 5, **_mpl(st),
                                                     "ls": st.get("ls", "-") if t.lines else "none"})
            for x, y, tx in zip(t.x, t.y, t.text or []):  # a label at each point
                ax.annotate(tx, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
            cut = [(x, y) for x, y, h in zip(t.x, t.y, hollow) if h]
            if cut:
                ax.plot([c[0] for c in cut], [c[1] for c in cut], ls="none", ms=8, mew=1.4, marker=st["marker"],
                        mfc="white", mec=st["color"], zorder=ln.get_zorder() + 1)
        for y, st in map(_hline, p.hlines):
            ax.axhline(y, **st)
        for x, st in map(_hline, p.vlines):
            ax.axvline(x, **st)
        if p.xlog:
            ax.set_xscale("log", base=p.xlog)
        if p.xticks:
            ax.set_xticks(p.xticks, [f"{int(v):,}" if p.xlog == 2 else f"{v:g}" for v in p.xticks])
        elif p.xlog == 10:
            _log_ticks(ax.xaxis, [x for t in p.traces for x in t.x])
        if p.traces and p.traces[0].sizes is not None:
            ax.margins(0.15)  # room for the largest bubbles
        ys = [y for t in p.traces for y in t.y if y == y]
        if p.ylog == "auto":
            auto_scale(ax, ys)
        elif p.ylog:
            ax.set_yscale("log")
            _log_ticks(ax.yaxis, ys)
        if p.ylim:
            ax.set_ylim(*p.ylim)
        if p.xlim:
            ax.set_xlim(*p.xlim)
        if p.ylabels:
            ax.set_yticks(range(len(p.ylabels)), p.ylabels, fontsize=9)
            ax.invert_yaxis()
        ax.set_title(p.title, fontsize=10, loc="left", fontweight="bold")
        ax.set_xlabel(p.xlabel, fontsize=8 if fig.size_key else 10)
        ax.set_ylabel(p.ylabel, fontsize=8 if fig.size_key else 10)
        ax.grid(True, which="both", alpha=0.25)
        if p.legend and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        if p.note and not p.traces:
            ax.text(0.5, 0.5, p.note, ha="center", transform=ax.transAxes)
    if fig.panels and fig.panels[0].y_reversed and axes:
        axes[0].invert_yaxis()  # quality up (shared y: once)
    if not any(p.traces for p in fig.panels):
        axes[0].text(0.5, 0.5, "no rows to draw", ha="center", transform=axes[0].transAxes)

    def handle(label, st):
        kw = dict(color=st.get("color", "gray"), ls=st.get("ls", "-"), marker=st.get("marker"), label=label)
        if st.get("hollow"):
            kw.update(mfc="white", mec=kw["color"], ms=7)
        elif kw["ls"] == "none":
            kw.update(mec="k", ms=9, alpha=0.7)
        else:
            kw.update(lw=1.6)
        return _proxy(**{**kw, **_mpl(st)})

    handles = [handle(lb, st) for lb, st in fig.legend]
    per_row = max(1, min(6, int(mfig.get_figwidth() / 2.6)))  # legend entries per row that fit the width
    mfig.legend(handles=handles, loc="outside lower center", fontsize=8, frameon=False,
                ncol=fig.legend_ncol or min(per_row, max(len(handles), 1)))
    if fig.size_key:
        sk = [_proxy(ls="none", marker="o", color="lightgray", mec="k", ms=math.sqrt(a), label=lb) if a else
              _proxy(ls="none", marker="o", mfc="none", mec="gray", ms=6, label=lb) for a, lb in fig.size_key]
        mfig.legend(handles=sk, title=fig.size_title, loc="outside right lower", fontsize=8, title_fontsize=8,
                    labelspacing=2.4, borderpad=1.2, handlelength=3.2, handletextpad=1.2)
    suptitle(mfig, fig.title, fontsize=9)
    return mfig


def _table(ax, p: Panel) -> None:
    """A table panel: ``p.table`` = (column labels, rows, colour of column 1 per row[, column widths as fractions of
    the panel, default 0.22 / 0.34 / 0.44]); ``p.note`` when empty."""
    ax.axis("off")
    ax.set_title(p.title, fontsize=10, loc="left", fontweight="bold")
    cols, cells, colours = p.table[:3]
    widths = list(p.table[3]) if len(p.table) > 3 else [0.22, 0.34, 0.44]
    if not cells:
        ax.text(0.5, 0.5, p.note, ha="center", va="center")
        return
    tab = ax.table(cellText=cells, colLabels=cols, loc="upper center", cellLoc="left", colWidths=widths)
    tab.auto_set_font_size(False)
    tab.set_fontsize(7)
    for i, col in enumerate(colours):
        tab[i + 1, 1].get_text().set_color(col)


def to_png(fig: Figure, base: str, formats: Optional[Sequence[str]] = None) -> List[str]:
    """Draw with :func:`to_matplotlib` and save ``base.<ext>`` for each of ``formats`` (default
    :data:`eval.plots.FORMATS`, PNG first); returns the paths. The same figure gives the same bytes on one machine:
    PNG at a fixed dpi (matplotlib writes no date in it), SVG / PDF without their creation date and with fixed
    SVG ids (matplotlib stamped the date and drew random ids). Across machines the PNG pixels may differ (the note
    below this function)."""
    import os

    import matplotlib
    import matplotlib.pyplot as plt

    from eval.plots import FORMATS

    mfig = to_matplotlib(fig)
    os.makedirs(os.path.dirname(os.path.abspath(base)) or ".", exist_ok=True)
    paths = [f"{base}.{ext}" for ext in formats or FORMATS]
    no_date = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}
    with matplotlib.rc_context({"svg.hashsalt": "attn-zoo"}):
        for path in paths:
            ext = path.rsplit(".", 1)[-1]
            mfig.savefig(path, dpi=110 if ext == "png" else None, metadata=no_date.get(ext))
    plt.close(mfig)
    return paths


# Why a rebuilt PNG can differ from the committed one on another machine (docs/results.md says it beside the rebuild
# command): matplotlib's log axes go through numpy's log10, whose AVX-512 code path (numpy's X86_V4 / AVX512_ICL
# dispatch) rounds some values one ulp apart from the AVX2 one; where a line's end sits on a sub-pixel boundary,
# its anti-aliasing moves (41 grey levels of docs/figures/h200_roofline.png, each by 1). Same matplotlib, freetype and
# numpy versions and the same dispatch give the same bytes: on an AVX-512 CPU, NPY_DISABLE_CPU_FEATURES="X86_V4
# AVX512_ICL AVX512_SPR" draws what an AVX2 one does (the committed figures are drawn that way).


# --------------------------------------------------------------------------------------------- plotly
_MARKERS = {"o": "circle", "s": "square", "D": "diamond", "d": "diamond-tall", "^": "triangle-up",
            "v": "triangle-down", "<": "triangle-left", ">": "triangle-right", "X": "x", "P": "cross",
            "h": "hexagon", "H": "hexagon2", "p": "pentagon", "*": "star", "8": "octagon"}
_DASH = {"-": "solid", "--": "dash", ":": "dot", "-.": "dashdot"}


def _hex(color: str) -> str:
    from matplotlib.colors import to_hex

    return to_hex(color)


def _finite(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def to_plotly(fig: Figure) -> dict:
    """The figure as Plotly JSON ``{"data": [...], "layout": {...}}`` (subplots in a grid, one legend entry per
    variant shared by the panels, hover texts, ``meta`` on every trace) for ``Plotly.newPlot`` in the page."""
    n = max(len(fig.panels), 1)
    ncols = max(1, min(fig.ncols, n))
    nrows = math.ceil(n / ncols)
    gap_x, gap_y = 0.06, 0.3 / nrows
    w, h = (1 - gap_x * (ncols - 1)) / ncols, (1 - gap_y * (nrows - 1)) / nrows
    layout = {"title": {"text": fig.title.replace("\n", "<br>"), "font": {"size": 13}}, "hovermode": "closest",
              "height": int(340 * nrows + 160), "margin": {"t": 90 + 16 * fig.title.count("\n")},
              "legend": {"orientation": "h"}, "annotations": [], "shapes": []}
    data, shown = [], set()
    for i, p in enumerate(fig.panels):
        r, c = divmod(i, ncols)
        ax = "" if i == 0 else str(i + 1)
        x0, y1 = c * (w + gap_x), 1 - r * (h + gap_y)
        xa = {"domain": [x0, x0 + w], "anchor": f"y{ax}", "title": {"text": p.xlabel, "font": {"size": 11}}}
        ya = {"domain": [y1 - h, y1], "anchor": f"x{ax}", "title": {"text": p.ylabel, "font": {"size": 11}}}
        if p.xlog:
            xa["type"] = "log"
        if p.xticks:
            xa.update(tickmode="array", tickvals=list(p.xticks), ticktext=[f"{v:g}" for v in p.xticks])
        if p.ylog:
            ya["type"] = "log"
        if p.ylim:
            ya["range"] = list(p.ylim)
        if p.xlim:
            xa["range"] = list(p.xlim)
        if p.ylabels:
            ya.update(tickmode="array", tickvals=list(range(len(p.ylabels))), ticktext=p.ylabels, autorange="reversed")
        if p.y_reversed:
            ya["autorange"] = "reversed"
        if fig.sharey and i:
            ya["matches"] = "y"
        layout[f"xaxis{ax}"], layout[f"yaxis{ax}"] = xa, ya
        layout["annotations"].append({"text": f"<b>{p.title}</b>", "xref": "paper", "yref": "paper", "x": x0,
                                      "y": y1 + 0.01, "xanchor": "left", "yanchor": "bottom", "showarrow": False})
        for y, st in map(_hline, p.hlines):
            layout["shapes"].append({"type": "line", "xref": f"x{ax} domain", "yref": f"y{ax}", "x0": 0, "x1": 1,
                                     "y0": y, "y1": y, "line": {"color": _hex(st["color"]), "width": st["lw"],
                                                                "dash": _DASH.get(st["ls"], "solid")}})
        for x, st in map(_hline, p.vlines):
            layout["shapes"].append({"type": "line", "xref": f"x{ax}", "yref": f"y{ax} domain", "x0": x, "x1": x,
                                     "y0": 0, "y1": 1, "line": {"color": _hex(st["color"]), "width": st["lw"],
                                                                "dash": _DASH.get(st["ls"], "solid")}})
        for t in p.traces:
            st, col = t.style, _hex(t.style["color"])
            hollow = t.hollow or [False] * len(t.x)
            marker = {"color": col, "symbol": [_MARKERS.get(st.get("marker"), "circle") + ("-open" if hh else "")
                                               for hh in hollow], "size": 8, "line": {"color": col, "width": 1}}
            if t.sizes is not None:
                marker.update(size=[math.sqrt(s) for s in t.sizes], opacity=0.6, line={"color": "black", "width": 1})
            data.append({"type": "scatter", "name": t.name, "legendgroup": t.name,
                         "showlegend": t.name not in shown and not t.name.startswith("_"),
                         "x": [_finite(v) for v in t.x], "y": [_finite(v) for v in t.y],
                         "mode": "lines+markers" if t.lines else "markers", "xaxis": f"x{ax}", "yaxis": f"y{ax}",
                         "line": {"color": col, "dash": _DASH.get(st.get("ls", "-"), "solid"), "width": 1.6},
                         "marker": marker, "text": t.hover, "hoverinfo": "text" if t.hover else "x+y+name",
                         "meta": dict(t.meta, panel=p.title)})
            if t.bars:
                data[-1].update(type="bar", orientation="h", text=t.text, mode=None, line=None, width=t.bar_height,
                                marker={"color": ["white" if h else col for h in hollow],
                                        "line": {"color": col, "width": 1.4},
                                        "pattern": {"shape": ["/" if h else "" for h in hollow]}})
            shown.add(t.name)
    legend_rows = math.ceil(len(shown) / 5)  # a long legend below the panels: room for it, not at their cost
    layout["height"] += 24 * legend_rows
    layout["legend"].update(y=-0.1 - 0.1 / nrows - 0.02 * legend_rows / nrows, yanchor="top")
    return {"data": data, "layout": layout}


# --------------------------------------------------------------------------------------------- W&B
def to_wandb(fig: Figure, prefix: str) -> dict:
    """The figure as native W&B charts, one per panel, keyed ``<prefix>/<panel title>``: a panel of lines is a
    ``wandb.plot.line_series`` (x = the panel's x, e.g. N; one line per trace, e.g. per variant); a panel of points
    (bubbles) a ``wandb.plot.scatter`` over a ``wandb.Table`` (``series``, x, y). Marker-only traces beside lines
    (the n* stars) are left out. Needs ``wandb``."""
    import wandb

    out = {}
    for p in fig.panels:
        lines = [t for t in p.traces if t.lines]
        key = f"{prefix}/{p.title}"
        if lines:
            out[key] = wandb.plot.line_series(xs=[list(t.x) for t in lines], ys=[list(t.y) for t in lines],
                                              keys=[t.name for t in lines], title=f"{fig.title.split(chr(10))[0]}: "
                                              f"{p.title}", xname=p.xlabel)
        elif p.traces:
            rows = [[t.name, x, y] for t in p.traces for x, y in zip(t.x, t.y)]
            table = wandb.Table(columns=["series", p.xlabel, p.ylabel], data=rows)
            out[key] = wandb.plot.scatter(table, p.xlabel, p.ylabel, title=f"{p.title}: {p.ylabel} vs {p.xlabel}")
    return out


def as_dict(fig: Figure) -> dict:
    """The definition itself as plain data (for tests and debugging)."""
    return asdict(fig)


if __name__ == "__main__":  # a library module: running it would do nothing, so say what to run instead
    raise SystemExit("eval.figspec is a library module, not a command; run python -m eval.figures (every figure) "
                     "or python -m eval.report")
