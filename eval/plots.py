"""Figures (matplotlib, PNG + SVG) of the sweep, crossover, quality and cost-model results.

* ``time_vs_n_<mode>``: time vs N, log-log, one line per variant / backend, ``n*`` against the exact baseline
  marked (dotted vertical line + label).
* ``memory_vs_n``: peak memory vs N (measured on CUDA; the cost model's footprint otherwise), with the
  cost model's ``n^2`` (S and P materialised) and ``n d`` (flash) curves dashed.
* ``roofline``: the machine's roofs (peak FLOP/s, bandwidth, ridge) and every kernel point placed at its
  modelled arithmetic intensity and measured TFLOP/s.
* ``model_tokens_per_s``: the GPT's training / inference tokens/s vs context length.
* ``quality_vs_n`` and ``bubble`` (Long Range Arena Fig. 3 style: y quality, x speed, bubble area memory).

One command per figure set::

    python -m eval.plots results_dir=results/h200/crossover_speed_h200 figures_dir=docs/figures
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

from eval.crossover import _b, _f, series  # noqa: E402

_MARKERS = "osD^v<>phX*"
_MATERIALISING = ("naive", "reference", "sdpa_math")


FORMATS = ["png", "svg"]  # set by the drivers' ``formats`` option


def _save(fig, base: str, dpi: int = 110) -> List[str]:
    """Save ``fig`` as ``base.<ext>`` for each of :data:`FORMATS` (PNG first); returns the paths."""
    os.makedirs(os.path.dirname(os.path.abspath(base)) or ".", exist_ok=True)
    fig.tight_layout()
    paths = []
    for ext in FORMATS:
        paths.append(f"{base}.{ext}")
        fig.savefig(paths[-1], dpi=dpi if ext == "png" else None)
    plt.close(fig)
    return paths


def set_formats(formats) -> None:
    """Output formats of the figures, e.g. ``["png", "svg"]`` (PNG is always written first)."""
    fm = [str(f).lower() for f in (formats or ["png", "svg"])]
    for f in fm:
        if f not in ("png", "svg", "pdf"):
            raise ValueError(f"formats entry {f!r} is not supported; allowed values: png, svg, pdf")
    FORMATS[:] = ["png"] + [f for f in fm if f != "png"]


def _style(i: int):
    cmap = plt.get_cmap("tab20" if i >= 10 else "tab10")
    return {"color": cmap((2 * (i - 10) + 1) % 20) if i >= 10 else cmap(i), "marker": _MARKERS[i % len(_MARKERS)],
            "ls": "-" if i < 10 else "--"}


def _panels(keys) -> List[tuple]:
    return sorted({(k[2], k[3]) for k in keys})


def plot_time_vs_n(rows: Sequence[dict], crossovers: Sequence[dict], base: str, mode: str = "fwd_bwd",
                   reference: str = "exact", title: Optional[str] = None,
                   baseline: Optional[Sequence[str]] = None) -> List[str]:
    """Time vs N (log-log) per variant / backend, one panel per (head_dim, causal), ``n*`` marked; the
    ``baseline`` curve (``(variant, backend)``, default: the crossovers' exact baseline) drawn thick black."""
    if baseline is None:
        bl = [c["baseline"] for c in crossovers if c.get("reference") == reference]
        baseline = tuple(bl[0].split("/", 1)) if bl else None
    ser = series(rows)
    metric = f"{mode}_ms"
    panels = _panels(ser) or [(0, True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    failed = {}
    for r in rows:
        if r.get("status") in ("oom", "error"):
            key = (r["variant"], r["backend"], int(_f(r["head_dim"])), _b(r["causal"]), int(_f(r["n_kv_heads"])))
            failed.setdefault(key, (r["status"], int(_f(r["seq_len"]))))
    for ax, (D, causal) in zip(axes[0], panels):
        keys = [k for k in sorted(ser) if k[2] == D and k[3] == causal]
        multi_hkv = {v for v in {k[0] for k in keys} if len({k[4] for k in keys if k[0] == v}) > 1}
        for i, k in enumerate(keys):
            xs = [_f(r["seq_len"]) for r in ser[k] if math.isfinite(_f(r.get(metric)))]
            ys = [_f(r[metric]) for r in ser[k] if math.isfinite(_f(r.get(metric)))]
            if not xs:
                continue
            st = _style(i)
            label = f"{k[0]}/{k[1]}" + (f" Hkv={k[4]}" if k[0] in multi_hkv else "")
            if k in failed:
                label += f" ({failed[k][0].upper()} at {failed[k][1]})"
            if baseline is not None and (k[0], k[1]) == tuple(baseline):
                st = dict(st, color="k", ls="-")
                ax.plot(xs, ys, label=label + " (baseline)", lw=3, ms=5, zorder=4, **st)
            else:
                ax.plot(xs, ys, label=label, lw=1.4, ms=4, **st)
            for c in crossovers:
                if (c["metric"] == metric and c["reference"] == reference and c["variant"] == k[0]
                        and c["backend"] == k[1] and c["head_dim"] == D and c["causal"] == causal
                        and c["n_kv_heads"] == k[4] and math.isfinite(_f(c["n_star"]))):
                    ns = _f(c["n_star"])
                    ax.axvline(ns, color=st["color"], ls=":", lw=1)
                    # y on the line: interpolate in log space
                    import numpy as np

                    y = float(np.exp(np.interp(np.log(ns), np.log(xs), np.log(ys))))
                    ax.plot([ns], [y], marker="*", ms=12, color=st["color"], mec="k", zorder=5)
                    ax.annotate(f"n*≈{ns:.0f}", (ns, y), textcoords="offset points", xytext=(4, -12), fontsize=8,
                                color=st["color"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(f"{mode} time (ms)")
        ax.set_title(f"D={D}, {'causal' if causal else 'non-causal'}" + (f" — {title}" if title else ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    return _save(fig, base)


def plot_memory_vs_n(rows: Sequence[dict], base: str, title: Optional[str] = None) -> List[str]:
    """Peak memory vs N per variant / backend with the model's n^2 (standard) and n*d (flash) curves."""
    from eval.crossover import memory_metric

    ser = series(rows)
    metric = memory_metric(rows)
    panels = _panels(ser) or [(0, True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, (D, causal) in zip(axes[0], panels):
        keys = [k for k in sorted(ser) if k[2] == D and k[3] == causal]
        ns_all = set()
        any_row = None
        for i, k in enumerate(keys):  # per sequence (the sweep holds B * N fixed): n^2 vs n*d shows directly
            xs = [_f(r["seq_len"]) for r in ser[k] if _f(r.get(metric)) > 0]
            ys = [_f(r[metric]) / max(_f(r.get("batch")), 1) / 2**20 for r in ser[k] if _f(r.get(metric)) > 0]
            if xs:
                ax.plot(xs, ys, label=f"{k[0]}/{k[1]}", lw=1.5, ms=4, **_style(i))
                ns_all.update(xs)
                any_row = ser[k][0]
        if ns_all and any_row is not None:
            ns = sorted(ns_all)
            H = int(_f(any_row["n_heads"]))
            e = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(any_row.get("dtype"), 2)
            std = [cm.standard_attention_cost(1, H, int(n), D, dtype_bytes=e, mode="fwd_bwd").footprint_bytes / 2**20
                   for n in ns]
            fl = [cm.flash_attention_cost(1, H, int(n), D, dtype_bytes=e, mode="fwd_bwd").footprint_bytes / 2**20
                  for n in ns]
            ax.plot(ns, std, "k--", lw=1, label="model: standard (S, P: ∝ n²)")
            ax.plot(ns, fl, "k:", lw=1, label="model: flash (∝ n·d)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(("peak memory" if metric == "peak_mem_bytes" else "modelled footprint") + " per sequence (MiB)")
        ax.set_title(f"D={D}, {'causal' if causal else 'non-causal'}" + (f" — {title}" if title else ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    return _save(fig, base)


def plot_roofline(rows: Sequence[dict], base: str, machine: "cm.Machine", mode: str = "fwd_bwd",
                  title: Optional[str] = None) -> List[str]:
    """Roofline of ``machine`` with each measured kernel point at (modelled intensity, achieved TFLOP/s).

    Intensity = cost-model FLOPs over HBM bytes: the modelled S / P traffic for materialising backends
    (``naive``, ``reference``, ``sdpa_math``), the compulsory traffic (inputs read once, outputs written once)
    for fused kernels, whose measured traffic is close to it (``eval/hbm_probe.py``: 1.8x compulsory for our
    flash kernel at N = 2048, against 10.7x for the L2-free tiling model)."""
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    xs = [10 ** (i / 20) for i in range(-20, 101)]
    ax.plot(xs, [machine.attainable(x) / 1e12 for x in xs], "k-", lw=2, label=f"{machine.name} roof")
    ax.axvline(machine.ridge, color="gray", ls=":", lw=1)
    ax.annotate(f"ridge {machine.ridge:.0f} FLOP/B", (machine.ridge, machine.peak_flops / 1e12 / 3), fontsize=8)
    ser = series(rows)
    for i, (k, pts) in enumerate(sorted(ser.items())):
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
            st = _style(i)
            ax.scatter(x, y, s=s, color=st["color"], marker=st["marker"], alpha=0.8,
                       label=f"{k[0]}/{k[1]} D={k[2]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte: compulsory for fused kernels, S/P traffic for naive)",
                  fontsize=8)
    ax.set_ylabel(f"achieved TFLOP/s ({mode})")
    ax.set_title("Roofline" + (f" — {title}" if title else "") + " (marker size ∝ log N)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right", ncol=2)
    return _save(fig, base)


def plot_model_sweep(rows: Sequence[dict], base: str, title: Optional[str] = None) -> List[str]:
    """GPT tokens/s (train step, inference) and peak memory vs context length per variant."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["variant"], r["backend"]), []).append(r)
    for i, (k, pts) in enumerate(sorted(groups.items())):
        pts.sort(key=lambda r: _f(r["seq_len"]))
        st = _style(i)
        n = [_f(r["seq_len"]) for r in pts]
        axes[0].plot(n, [_f(r["train_tokens_per_s"]) for r in pts], label=f"{k[0]}/{k[1]} train", **st)
        axes[0].plot(n, [_f(r["infer_tokens_per_s"]) for r in pts], ls="--", color=st["color"], marker=st["marker"],
                     label=f"{k[0]}/{k[1]} infer", alpha=0.6)
        mem = [_f(r.get("train_peak_mem_bytes")) / 2**20 for r in pts]
        if any(math.isfinite(m) for m in mem):
            axes[1].plot(n, mem, label=f"{k[0]}/{k[1]}", **st)
    for ax, yl in zip(axes, ("tokens / s", "train peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if not axes[1].lines:
        axes[1].text(0.5, 0.5, "peak memory measured on CUDA only", ha="center", transform=axes[1].transAxes)
    fig.suptitle("GPT with each attention variant" + (f" — {title}" if title else ""), fontsize=10)
    return _save(fig, base)


def plot_quality_vs_n(rows: Sequence[dict], base: str, title: Optional[str] = None) -> List[str]:
    """Quality vs context length per variant, one panel per (dataset, metric) (see :mod:`eval.quality`)."""
    panels = sorted({(r["dataset"], r["metric"]) for r in rows})
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 4.2), squeeze=False)
    for ax, (ds, met) in zip(axes[0], panels):
        vs = sorted({r["variant"] for r in rows if r["dataset"] == ds and r["metric"] == met})
        for i, v in enumerate(vs):
            pts = sorted([r for r in rows if r["dataset"] == ds and r["metric"] == met and r["variant"] == v],
                         key=lambda r: _f(r["seq_len"]))
            ax.plot([_f(r["seq_len"]) for r in pts], [_f(r["value"]) for r in pts], label=v, **_style(i))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seq_len")
        ax.set_ylabel(met)
        ax.set_title(f"{ds}" + (f" — {title}" if title else ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    return _save(fig, base)


def plot_bubble(rows: Sequence[dict], base: str, quality: str, speed: str = "tokens_per_s",
                memory: str = "peak_mem_mb", title: Optional[str] = None) -> List[str]:
    """LRA Fig. 3 style: y quality, x speed, bubble area memory; one colour per variant, labels = seq_len.

    ``rows``: the joined table of :func:`eval.quality.join_speed` (``variant``, ``seq_len``, ``dataset`` and the
    named columns). Points without memory get a fixed size.
    """
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    vs = sorted({r["variant"] for r in rows})
    mems = [_f(r.get(memory)) for r in rows if _f(r.get(memory)) > 0]
    mmax = max(mems) if mems else 1.0
    for i, v in enumerate(vs):
        pts = [r for r in rows if r["variant"] == v and math.isfinite(_f(r.get(quality))) and _f(r.get(speed)) > 0]
        if not pts:
            continue
        st = _style(i)
        size = [60 + 1200 * (_f(r.get(memory)) / mmax if _f(r.get(memory)) > 0 else 0.05) for r in pts]
        ax.scatter([_f(r[speed]) for r in pts], [_f(r[quality]) for r in pts], s=size, color=st["color"], alpha=0.45,
                   edgecolors="k", label=v)
        for r in pts:
            ax.annotate(str(int(_f(r["seq_len"]))), (_f(r[speed]), _f(r[quality])), fontsize=7, ha="center",
                        va="center")
    ax.set_xscale("log")
    ax.set_xlabel(f"speed ({speed})")
    ax.set_ylabel(quality)
    if quality in ("val_bpb", "val_loss"):  # quality up, as in LRA Fig. 3
        ax.invert_yaxis()
        ax.set_ylabel(f"{quality} (lower is better; axis inverted)")
    ax.set_title("quality × speed × memory (bubble area ∝ memory; labels = seq_len)"
                 + (f" — {title}" if title else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if ax.collections:
        ax.legend(fontsize=7, markerscale=0.4)
    return _save(fig, base)


# --------------------------------------------------------------------------------------------- drivers
def _machine(machine, env: dict) -> Optional["cm.Machine"]:
    if isinstance(machine, cm.Machine):
        return machine
    name = machine or (env or {}).get("gpu")
    if not name:
        return None
    try:
        return cm.get_machine(str(name))
    except ValueError:
        return None


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
    env = {}
    if os.path.exists(cross_path):
        with open(cross_path) as f:
            d = json.load(f)
        cross = [dict(c, n_star=_f(c.get("n_star"))) for c in d.get("rows", [])]
        env = d.get("env") or {}
    out: Dict[str, List[str]] = {}
    modes = [m for m in ("fwd_bwd", "fwd", "bwd") if any(math.isfinite(_f(r.get(f"{m}_ms"))) for r in rows)]
    for m in modes[:2]:
        out[f"time_vs_n_{m}"] = plot_time_vs_n(rows, cross, os.path.join(figures_dir, f"{prefix}time_vs_n_{m}"), m,
                                               title=title)
    if rows:
        out["memory_vs_n"] = plot_memory_vs_n(rows, os.path.join(figures_dir, f"{prefix}memory_vs_n"), title=title)
    mach = _machine(machine, env)
    if mach is not None and rows:
        out["roofline"] = plot_roofline(rows, os.path.join(figures_dir, f"{prefix}roofline"), mach,
                                        mode=modes[0] if modes else "fwd_bwd", title=title)
    mrows = read_rows(os.path.join(results_dir, "model.csv"))
    if mrows:
        out["model_tokens_per_s"] = plot_model_sweep(mrows, os.path.join(figures_dir, f"{prefix}model_tokens_per_s"),
                                                     title=title)
    return out


def main_from_cfg(cfg: dict) -> Dict[str, List[str]]:
    """``eval.plots`` entry: ``results_dir`` (sweep figures) and / or ``quality_csv`` (quality figures)."""
    figs: Dict[str, List[str]] = {}
    fd = cfg.get("figures_dir")
    set_formats(cfg.get("formats"))
    if cfg.get("results_dir"):
        figs.update(sweep_figures(cfg["results_dir"], fd or cfg["results_dir"], machine=cfg.get("machine"),
                                  title=cfg.get("title"), prefix=cfg.get("prefix") or "",
                                  formats=cfg.get("formats") or ("png", "svg")))
    if cfg.get("quality_csv"):
        from eval.quality import quality_figures

        figs.update(quality_figures(cfg["quality_csv"], fd or os.path.dirname(cfg["quality_csv"]),
                                    speed_csv=cfg.get("speed_csv"), prefix=cfg.get("prefix") or "",
                                    title=cfg.get("title")))
    for k, v in figs.items():
        print(f"{k}: {v[0]}")
    return figs


def _hydra_main():  # pragma: no cover - exercised through the CLI
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(config_path="conf", config_name="plots", version_base="1.3")
    def main(cfg):
        main_from_cfg(OmegaConf.to_container(cfg, resolve=True))

    main()


if __name__ == "__main__":
    _hydra_main()
