"""n* by document length (issue 27 item 4): where document-masked exact attention and linear attention cost the
same, as a function of the mean (and tail) document length at a fixed sequence length N.

    python -m eval.doclen [--wikitext ../shared/data/wikitext-2] [--out results/doclen] [--N 4096 16384 65536]
    python -m eval.doclen --measure --time-budget-s 60 --N 16384 --out results/h200/doclen   # GPU: measured too

Model (CPU; about 75-85 s with the WikiText rows on a 2-core machine, ``OMP_NUM_THREADS=1``). The constants come from a committed H200 sweep (default :data:`DEFAULT_KERNEL_CSV`, the
2026-12-01 crossover sweep: bf16, causal, H = 16, D = 128, 16k tokens a step, fwd+bwd): ``t/token = c0 + c2 n``
fitted on our exact kernel (``flash`` / ``triton``) from ``--fit-min-seq-len`` up and ``c_lin`` = the linear
kernel's per-token time (``linear`` / ``triton``), with :func:`eval.crossover.constants_crossover` (the sweep's own
fit). ``--c0 / --c2 / --c-lin`` override them (us per token; c2 per token of context). A packed sequence of N tokens
whose pieces have lengths l costs ``c0 + c2 sum l^2 / N`` per token with the document mask
(:func:`attn_zoo.doclen.exact_time_per_token`), linear ``c_lin``. For each N and family (fixed, geometric,
lognormal sigma = 1, pareto alpha = 1.5; and ``wikitext-2``: the real article lengths rescaled to each mean) it
reports n*_doc, the mean document length where the two are equal, with the tail statistics of the distribution
there (p90, E[l^2]/E[l] of the documents and of the pieces after packing; ``*_tiles``: the tile model, where the
kernel pays whole ``--block`` x ``--block`` tiles, :func:`attn_zoo.doclen.n_star_mean_tiles`), and the real
WikiText-2 articles (byte-level, split rule ``wikitext``, :func:`harness.data.split_documents`) at their own lengths. ``--wikitext``
takes the corpus folder (every ``*.txt``) or a CSV of lengths (column ``length``, as written here); without it the
WikiText rows are left out.

Measured (``--measure``, needs CUDA, else skipped with a message): in one process, forward+backward of our
document-masked exact kernel (the registry's ``triton`` backend bound as in :mod:`eval.bench_flash`, ``doc_ids`` from
:func:`attn_zoo.doclen.packed_doc_ids`) over a grid of mean document lengths per family at each N, and our linear
kernel (``triton``; with ``doc_ids`` when the backend takes them) at the same N; the points nearest the model's
n*_doc first, new points stop after ``--time-budget-s``. The measured n*_doc is interpolated in log-log space.

Writes under ``--out``: ``fit.json``, ``doclen.csv`` / ``doclen.md`` (n*_doc per N and family), ``doclen_curves.csv``
(modelled cost vs mean length), ``doclen_wikitext.csv`` (the real articles), ``wikitext2_article_lengths.csv``;
measured: ``doclen_measured.csv`` (every point), ``doclen_measured_nstar.csv`` / ``.json``; and the figure
``doclen_crossover.png`` (``--figures-dir``; :func:`eval.figspec.doclen`, drawn with the measured points of
``--measured``, else of ``--out``'s ``doclen_measured.csv``, else, with the default constants, of the committed H200
run :data:`DEFAULT_MEASURED`; ``--measured none``: the model only). Rebuild the committed figure:
``python -m eval.plots doclen_dir=results/doclen doclen_measured=results/h200/doclen/doclen_measured.csv
figures_dir=docs/figures 'formats=[png]'`` (job ``doclen_crossover`` of ``python -m eval.figures``).
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import time
from typing import List, Optional, Sequence

import numpy as np

from attn_zoo import doclen as dl
from eval.bench_common import NONNEG, NONNEG_INT, POSITIVE, POSITIVE_INT  # argparse types: the option and its range

DEFAULT_KERNEL_CSV = "results/h200/crossover_speed_h200/kernel.csv"
# the committed H200 measured points (``--measure --out results/h200/doclen``, fitted on DEFAULT_KERNEL_CSV): drawn on
# the figure of a model with the default constants when ``--out`` holds no measured table of its own
DEFAULT_MEASURED = "results/h200/doclen/doclen_measured.csv"
FAMILY_KW = {"lognormal": {"sigma": 1.0}, "pareto": {"alpha": 1.5}}
WIKI = "wikitext-2"
NSTAR_COLUMNS = ("N", "family", "n_star_mean", "p90_at_n_star", "size_biased_at_n_star", "piece_size_biased_at_n_star",
                 "n_star_by_N", "n_star_mean_tiles")
CURVE_COLUMNS = ("N", "family", "mean", "p90", "size_biased", "piece_size_biased", "exact_us_per_token",
                 "linear_us_per_token", "tiles", "exact_us_per_token_tiles")
WIKI_COLUMNS = ("N", "articles", "mean", "p50", "p90", "size_biased", "piece_size_biased", "exact_us_per_token",
                "linear_us_per_token", "exact_over_linear", "n_star_mean_scaled", "scale_at_n_star",
                "exact_over_linear_tiles", "n_star_mean_scaled_tiles")


# --------------------------------------------------------------------------------------------- the fit
def _truthy(x) -> bool:
    return str(x).strip().lower() in ("true", "1", "yes")


def fit_costs(kernel_csv: str = DEFAULT_KERNEL_CSV, *, exact=("flash", "triton"), linear=("linear", "triton"),
              head_dim: int = 128, causal: bool = True, metric: str = "fwd_bwd_ms",
              fit_min_seq_len: float = 1024) -> dict:
    """``c0``, ``c2`` (exact: ``t/token = c0 + c2 n``) and ``c_lin`` (linear), in us per token, fitted on a sweep's
    ``kernel.csv`` (:mod:`eval.sweep`: columns variant, backend, seq_len, head_dim, causal, n_kv_heads, n_heads,
    status, tokens, ``metric``) with :func:`eval.crossover.constants_crossover`, the sweep's own fit. Rows: status
    ``ok``, the given head dim and causality, MHA. Returns the constants, ``n_star_const`` / ``n_star_fit``, the
    lengths used and ``source`` (file, series, metric). Errors: ValueError naming the series that has too few
    points (fewer than two exact lengths from ``fit_min_seq_len`` up, or no linear point)."""
    from eval.crossover import constants_crossover

    with open(kernel_csv, newline="") as f:
        rows = list(csv.DictReader(f))

    def pts(variant, backend):
        out = {}
        for r in rows:
            if (r.get("variant"), r.get("backend")) != (variant, backend) or r.get("status", "ok") != "ok":
                continue
            if int(float(r["head_dim"])) != head_dim or _truthy(r["causal"]) != causal:
                continue
            if r.get("n_kv_heads") and r.get("n_heads") and r["n_kv_heads"] != r["n_heads"]:
                continue
            t = float(r.get(metric) or "nan")
            if math.isfinite(t) and t > 0:
                out[float(r["seq_len"])] = t / float(r["tokens"])  # ms per token
        return out

    pe, pl = pts(*exact), pts(*linear)
    if len([n for n in pe if n >= fit_min_seq_len]) < 2:
        raise ValueError(f"exact={exact!r}: fewer than two {metric} points from fit_min_seq_len={fit_min_seq_len} "
                         f"up in {kernel_csv}")
    if not pl:
        raise ValueError(f"linear={linear!r}: no {metric} point in {kernel_csv}")
    fit = constants_crossover(list(pe), list(pe.values()), list(pl), list(pl.values()), fit_min_seq_len)
    out = {k: (v * 1e3 if k in ("c0", "c2", "c_lin") else v) for k, v in fit.items()}  # us per token
    out.update(exact_lengths=sorted(n for n in pe if n >= fit_min_seq_len), linear_lengths=sorted(pl),
               source=f"{kernel_csv}: exact {exact[0]}/{exact[1]}, linear {linear[0]}/{linear[1]}, D={head_dim}, "
                      f"causal={causal}, {metric}, exact fit from N={fit_min_seq_len:g}")
    return out


# --------------------------------------------------------------------------------------------- lengths
def wikitext_lengths(path: str) -> List[int]:
    """WikiText article lengths in UTF-8 bytes: ``path`` a folder (every ``*.txt``, split with the ``wikitext``
    rule of :func:`harness.data.split_documents`) or a CSV with a ``length`` column. Errors: ValueError when the
    folder has no ``.txt`` file or nothing is read."""
    if os.path.isdir(path):
        from harness.data import split_documents

        files = sorted(glob.glob(os.path.join(path, "*.txt")))
        if not files:
            raise ValueError(f"wikitext={path!r}: no *.txt file in the folder")
        out = []
        for fn in files:
            with open(fn, encoding="utf-8") as f:
                out += [len(d.encode("utf-8")) for d in split_documents(f.read(), "wikitext")]
    else:
        with open(path, newline="") as f:
            out = [int(r["length"]) for r in csv.DictReader(f)]
    if not out:
        raise ValueError(f"wikitext={path!r}: no documents read")
    return out


# --------------------------------------------------------------------------------------------- the model
def _family_sampler(family: str, mean: float, pool=None):
    if family == WIKI:
        return dl.sampler("empirical", mean, pool=pool)
    return dl.sampler(family, mean, **FAMILY_KW.get(family, {}))


def _stats_at(family: str, mean: float, N: int, pool, tokens: int, seed: int = 0, block: int = 0) -> dict:
    """Tail statistics of the document lengths of ``family`` at ``mean`` (:func:`attn_zoo.doclen.distribution_stats`)
    and the size-biased mean piece length after packing into N (E[sum l^2] / N,
    :func:`attn_zoo.doclen.piece_size_biased`)."""
    fam, kw = ("empirical", dict(pool=pool)) if family == WIKI else (family, FAMILY_KW.get(family, {}))
    st = dl.distribution_stats(fam, mean, **kw)
    sb = dl.piece_size_biased(fam, mean, N, tokens=tokens, seed=seed, **kw)
    out = dict(mean=mean, p90=st["p90"], size_biased=st["size_biased"], piece_size_biased=sb)
    if block:
        out["tiles"] = dl.tiles_expected(fam, mean, N, block, tokens=tokens, seed=seed, **kw)
    return out


def model(fit: dict, Ns: Sequence[int], families: Sequence[str], pool: Optional[Sequence[int]] = None,
          tokens: int = 1 << 21, points_per_octave: int = 2, seed: int = 0, block: int = 128):
    """The model tables: (n*_doc rows, curve rows, WikiText rows); see the module docstring for the columns.
    ``block``: square tile of the tile model (``*_tiles`` columns; 0: pair model only)."""
    c0, c2, cl = fit["c0"], fit["c2"], fit["c_lin"]
    fams = list(families) + ([WIKI] if pool is not None else [])
    nst, curves, wiki = [], [], []
    for N in Ns:
        for fam in fams:
            kw = dict(pool=pool) if fam == WIKI else FAMILY_KW.get(fam, {})
            m = dl.n_star_mean("empirical" if fam == WIKI else fam, N, c2, cl, c0=c0, seed=seed, tokens=tokens, **kw)
            row = dict(N=N, family=fam, n_star_mean=m, n_star_by_N=fit.get("n_star_fit", float("nan")))
            if block:
                row["n_star_mean_tiles"] = dl.n_star_mean_tiles("empirical" if fam == WIKI else fam, N, c2, cl, block,
                                                                c0=c0, seed=seed, tokens=tokens, **kw)
            if math.isfinite(m):
                st = _stats_at(fam, m, N, pool, tokens, seed)
                row.update(p90_at_n_star=st["p90"], size_biased_at_n_star=st["size_biased"],
                           piece_size_biased_at_n_star=st["piece_size_biased"])
            nst.append(row)
            hi = max(2 * N, 2 * float(np.mean(pool))) if pool is not None else 2 * N
            k = np.arange(int(math.floor(points_per_octave * math.log2(hi / 8))) + 1)
            for mean in 8 * 2.0 ** (k / points_per_octave):
                st = _stats_at(fam, float(mean), N, pool, tokens, seed, block)
                if block:
                    st["exact_us_per_token_tiles"] = dl.exact_time_per_token_tiles(st["tiles"], N, block, c2, c0)
                curves.append(dict(N=N, family=fam, **st,
                                   exact_us_per_token=c0 + c2 * st["piece_size_biased"], linear_us_per_token=cl))
        if pool is not None:
            st = dl.length_stats(pool)
            sb = dl.piece_size_biased("empirical", st["mean"], N, pool=pool)  # scale 1: the real lengths
            ex = c0 + c2 * sb
            m = next(r["n_star_mean"] for r in nst if r["N"] == N and r["family"] == WIKI)
            wiki.append(dict(N=N, articles=len(pool), mean=st["mean"], p50=st["p50"], p90=st["p90"],
                             size_biased=st["size_biased"], piece_size_biased=sb, exact_us_per_token=ex,
                             linear_us_per_token=cl, exact_over_linear=ex / cl, n_star_mean_scaled=m,
                             scale_at_n_star=m / st["mean"]))
            if block:
                t = dl.tiles_expected("empirical", st["mean"], N, block, pool=pool)
                wiki[-1].update(exact_over_linear_tiles=dl.exact_time_per_token_tiles(t, N, block, c2, c0) / cl,
                                n_star_mean_scaled_tiles=next(r["n_star_mean_tiles"] for r in nst
                                                              if r["N"] == N and r["family"] == WIKI))
    return nst, curves, wiki


# --------------------------------------------------------------------------------------------- measured
MEASURED_COLUMNS = ("N", "family", "target_mean", "impl", "doc_ids", "B", "H", "D", "mean_doc_len",
                    "piece_size_biased", "fwd_bwd_ms", "us_per_token", "model_us_per_token",
                    "model_tiles_us_per_token", "error")
MEASURED_NSTAR_COLUMNS = ("N", "family", "n_star_measured", "n_star_model", "n_star_model_tiles", "status", "points")


def measured_n_star(xs: Sequence[float], t_exact: Sequence[float], t_lin: float):
    """First mean length where the exact per-token time rises above ``t_lin`` (linear interpolation of
    log t over log x between the two grid points around it); ``(n*, status)``: ``"crossing"``, ``"linear slower
    in whole range"`` (n* = nan), ``"linear faster in whole range"`` (nan) or ``"no points"``."""
    pts = sorted((x, t) for x, t in zip(xs, t_exact) if x > 0 and t > 0 and math.isfinite(t))
    if not pts or not (t_lin > 0):
        return float("nan"), "no points"
    if pts[0][1] >= t_lin:
        return float("nan"), "linear faster in whole range"
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y0 < t_lin <= y1:
            f = (math.log(t_lin) - math.log(y0)) / (math.log(y1) - math.log(y0))
            return math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0))), "crossing"
    return float("nan"), "linear slower in whole range"


def measure(fit: dict, Ns: Sequence[int], families: Sequence[str], means: Sequence[float], nstar_rows: List[dict],
            pool=None, time_budget_s: float = 60.0, tokens: int = 16384, H: int = 16, D: int = 128,
            seed: int = 0, device: str = "cuda", timer=None, dtype=None) -> Optional[tuple]:
    """Times the grid on the GPU (see the module docstring); ``(rows, n* rows)`` or None without CUDA.
    ``device`` / ``timer`` (``timer(fn, grad_to_none=...) -> ms``, default :func:`eval.bench_common.time_cuda`) /
    ``dtype`` (default bf16): for the CPU test of this path under the Triton interpreter."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("--measure: no CUDA device here, the measured mode is skipped (the model tables are written)")
        return None
    from attn_zoo import AttentionSpec
    from attn_zoo.registry import Unsupported, get_backends
    from eval.bench_common import error_line

    if timer is None:
        from eval.bench_common import time_cuda as timer
    dtype = torch.bfloat16 if dtype is None else dtype

    t_start = time.time()
    exact = AttentionSpec(kind="flash", causal=True)
    lin = AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=64)  # the sweep's linear
    rows, nrows = [], []
    model_star = {(r["N"], r["family"]): r["n_star_mean"] for r in nstar_rows}
    model_tiles = {(r["N"], r["family"]): r.get("n_star_mean_tiles") for r in nstar_rows}
    fams = list(families) + ([WIKI] if pool is not None else [])
    for N in Ns:
        B = max(tokens // N, 1)
        g = torch.Generator(device=device).manual_seed(N)
        mk = lambda: torch.randn(B, H, N, D, device=device, dtype=dtype, generator=g)  # noqa: E731
        q, k, v = (mk().requires_grad_(True) for _ in range(3))
        do = mk()

        def time_one(spec, doc_ids):
            # the registry's binding, as eval.bench_flash times ours: the kernel itself, no dispatch
            fn = get_backends(spec.kind)["triton"].bind(spec, q, k, v, doc_ids=doc_ids)
            f = lambda: fn(q, k, v).backward(do)  # noqa: E731
            f()
            if device == "cuda":
                torch.cuda.synchronize()
            return timer(f, grad_to_none=[q, k, v])

        # linear first: the flat line every exact point is compared with (with doc_ids if the backend takes them)
        ids = torch.as_tensor(dl.packed_doc_ids(_family_sampler("geometric", 512), N, B, seed), device=device,
                              dtype=torch.int32)
        row = dict(N=N, family="-", target_mean=float("nan"), impl="linear", B=B, H=H, D=D)
        try:
            try:
                ms, row["doc_ids"] = time_one(lin, ids), True
            except Unsupported:  # the backend does not take doc_ids: a reset changes no work, time it without
                ms, row["doc_ids"] = time_one(lin, None), False
            row.update(fwd_bwd_ms=ms, us_per_token=ms * 1e3 / (B * N), model_us_per_token=fit["c_lin"])
        except Exception as e:  # noqa: BLE001 - recorded
            row["error"] = error_line(e)
        rows.append(row)
        t_lin = row.get("us_per_token", float("nan"))
        print(f"N={N} linear: {t_lin:.4g} us/token (model {fit['c_lin']:.4g})", flush=True)
        grid = []
        for fam in fams:
            ref = model_star.get((N, fam), float("nan"))
            ref = ref if math.isfinite(ref) else N / 4
            grid += [(abs(math.log(m / ref)), fam, m) for m in means if m <= 2 * N]
            if fam == WIKI:
                grid.append((-1.0, fam, float(np.mean(pool))))  # the real articles first
        for _, fam, m in sorted(grid):
            if time.time() - t_start > time_budget_s:
                print(f"--time-budget-s {time_budget_s:g} reached: {len(grid)} points planned for N={N}, stopping")
                break
            idn = dl.packed_doc_ids(_family_sampler(fam, m, pool), N, B, seed)  # wikitext at its mean: the real
            lens = np.concatenate([np.bincount(r) for r in idn]).astype(np.float64)
            row = dict(N=N, family=fam, target_mean=m, impl="exact", doc_ids=True, B=B, H=H, D=D,
                       mean_doc_len=float(lens.mean()), piece_size_biased=float((lens ** 2).sum() / (B * N)))
            row["model_us_per_token"] = fit["c0"] + fit["c2"] * row["piece_size_biased"]
            if N % 128 == 0:  # the tile model at 128 x 128 for the same documents
                t = float(np.mean([dl.tiles_per_window(np.bincount(r), N, 128)[0] for r in idn]))
                row["model_tiles_us_per_token"] = dl.exact_time_per_token_tiles(t, N, 128, fit["c2"], fit["c0"])
            try:
                ms = time_one(exact, torch.as_tensor(idn, device=device, dtype=torch.int32))
                row.update(fwd_bwd_ms=ms, us_per_token=ms * 1e3 / (B * N))
            except Exception as e:  # noqa: BLE001 - recorded
                row["error"] = error_line(e)
            rows.append(row)
            print(f"N={N} {fam:10s} mean {m:8.0f}: {row.get('us_per_token', float('nan')):.4g} us/token "
                  f"(model {row['model_us_per_token']:.4g})", flush=True)
        for fam in fams:
            sel = [r for r in rows if r["N"] == N and r["family"] == fam and r["impl"] == "exact"
                   and "us_per_token" in r]
            n, status = measured_n_star([r["target_mean"] for r in sel], [r["us_per_token"] for r in sel], t_lin)
            nrows.append(dict(N=N, family=fam, n_star_measured=n, n_star_model=model_star.get((N, fam)),
                              n_star_model_tiles=model_tiles.get((N, fam)), status=status, points=len(sel)))
        del q, k, v, do
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows, nrows


# --------------------------------------------------------------------------------------------- output
def _fmt(v) -> str:
    if isinstance(v, float):
        return "inf" if v == float("inf") else ("" if v != v else f"{v:.4g}")
    return "" if v is None else str(v)


def write_csv(path: str, rows: Sequence[dict], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in columns})


def md_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    out = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    for r in rows:
        out += "| " + " | ".join(_fmt(r.get(k)) for k in columns) + " |\n"
    return out


def read_csv(path: str) -> List[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# what :func:`figure` (:func:`eval.figspec.doclen`) reads of each table: file -> (required columns / keys, optional)
FIGURE_INPUTS = {"fit.json": (("c_lin",), False),
                 "doclen_curves.csv": (("N", "family", "mean", "piece_size_biased", "exact_us_per_token"), False),
                 "doclen.csv": (("N", "family", "n_star_mean"), False),
                 "doclen_wikitext.csv": (("N", "mean", "p90", "exact_us_per_token", "exact_over_linear"), True)}
MEASURED_REQUIRED = ("N", "family", "impl", "target_mean", "us_per_token")


def check_figure_inputs(doclen_dir: str, where: str, measured: Optional[str] = None,
                        measured_where: str = "--measured") -> None:
    """The tables :func:`figure` draws from ``doclen_dir`` (``where`` names the argument in messages) and the
    measured table ``measured`` (``none``: no table; ``measured_where`` names its argument), checked before drawing: ``FileNotFoundError`` for a missing
    one, ``ValueError`` for an empty, unreadable or truncated one or one that lacks a column / key it needs."""
    from eval.bench_common import checked_json, checked_rows

    exp = "the tables eval.doclen --out writes"
    for name, (need, optional) in FIGURE_INPUTS.items():
        path = os.path.join(doclen_dir, name)
        if not os.path.isfile(path):
            if optional:
                continue
            raise FileNotFoundError(f"{where}: no {name} there ({exp}: fit.json, doclen.csv, doclen_curves.csv)")
        if name.endswith(".json"):
            checked_json(path, f"{where}: {name}", exp, need)
        else:
            checked_rows(path, f"{where}: {name}", need, exp)
    if measured and str(measured).lower() != "none":
        label = f"{measured_where}={measured}" if measured_where else f"measured table {measured}"
        if not os.path.isfile(measured):
            raise FileNotFoundError(f"{label}: no such file (eval.doclen --measure writes doclen_measured.csv; "
                                    f"'none': the model only)")
        checked_rows(measured, label, MEASURED_REQUIRED, "the doclen_measured.csv eval.doclen --measure writes")


def figure(doclen_dir: str, figures_dir: Optional[str] = None, measured: Optional[str] = None,
           formats: Sequence[str] = ("png",)) -> List[str]:
    """Draw ``doclen_crossover`` from the tables in ``doclen_dir`` (and the measured points of ``measured``, or of
    ``doclen_dir/doclen_measured.csv`` when that file exists; ``measured="none"``: the model only) with
    :func:`eval.figspec.doclen`; returns the paths written. A ``measured`` file that is not there: ``FileNotFoundError``
    naming it (it drew the model alone, the H200 points silently gone)."""
    from eval import figspec

    fit = json.load(open(os.path.join(doclen_dir, "fit.json")))
    wpath = os.path.join(doclen_dir, "doclen_wikitext.csv")
    if measured and str(measured).lower() == "none":
        meas = None
    elif measured:
        if not os.path.isfile(measured):
            raise FileNotFoundError(f"doclen measured table {measured}: no such file (eval.doclen --measure writes "
                                    f"doclen_measured.csv; 'none': the model only)")
        meas = read_csv(measured)
    else:
        mpath = os.path.join(doclen_dir, "doclen_measured.csv")
        meas = read_csv(mpath) if os.path.exists(mpath) else None
    fig = figspec.doclen(read_csv(os.path.join(doclen_dir, "doclen_curves.csv")),
                         read_csv(os.path.join(doclen_dir, "doclen.csv")),
                         read_csv(wpath) if os.path.exists(wpath) else [], fit, measured=meas)
    return figspec.to_png(fig, os.path.join(figures_dir or doclen_dir, "doclen_crossover"), formats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-csv", default=DEFAULT_KERNEL_CSV, help="committed sweep the constants are fitted on")
    ap.add_argument("--fit-min-seq-len", type=NONNEG, default=1024)
    ap.add_argument("--c0", type=NONNEG, default=None, help="override: exact us/token at n -> 0 (>= 0)")
    ap.add_argument("--c2", type=POSITIVE, default=None, help="override: exact us/token per token of context (> 0)")
    ap.add_argument("--c-lin", type=POSITIVE, default=None, help="override: linear us/token (> 0)")
    ap.add_argument("--N", type=POSITIVE_INT, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--families", nargs="+", default=list(dl.FAMILIES))
    ap.add_argument("--wikitext", default=None, help="WikiText-2 folder (*.txt) or a lengths CSV; optional")
    ap.add_argument("--tokens", type=POSITIVE_INT, default=1 << 21, help="Monte-Carlo tokens per expectation")
    ap.add_argument("--points-per-octave", type=POSITIVE_INT, default=2)
    ap.add_argument("--block", type=NONNEG_INT, default=128, help="square tile of the tile model (0: pair model only)")
    ap.add_argument("--out", default="results/doclen")
    ap.add_argument("--figures-dir", default=None, help="where doclen_crossover.png goes (default --out)")
    ap.add_argument("--measured", default=None,
                    help="measured table for the figure; 'none': the model only (default: --out's doclen_measured.csv, "
                         f"else {DEFAULT_MEASURED} when the constants are the default fit of {DEFAULT_KERNEL_CSV})")
    ap.add_argument("--no-figure", action="store_true")
    ap.add_argument("--measure", action="store_true", help="time the kernels on the GPU too")
    ap.add_argument("--time-budget-s", type=POSITIVE, default=60.0)
    ap.add_argument("--means", type=POSITIVE, nargs="+", default=[2.0 ** k for k in range(5, 17)],
                    help="measured grid of mean document lengths (those <= 2N are run)")
    ap.add_argument("--bench-tokens", type=POSITIVE_INT, default=16384, help="measured: B = max(1, bench_tokens // N)")
    a = ap.parse_args(argv)
    from eval.bench_common import check_out_dirs_or_exit

    check_out_dirs_or_exit(ap, ("--out", a.out), ("--figures-dir", a.figures_dir))
    for fam in a.families:
        if fam not in dl.FAMILIES:
            ap.error(f"--families entry {fam!r} is not supported; allowed values: {', '.join(dl.FAMILIES)}")
    if a.measured and a.measured.lower() != "none" and not os.path.isfile(a.measured):
        ap.error(f"--measured {a.measured}: no such file (a doclen_measured.csv of eval.doclen --measure, or 'none')")
    if a.wikitext and not os.path.exists(a.wikitext):
        ap.error(f"--wikitext {a.wikitext}: no such file or folder (the WikiText-2 folder of *.txt, or a CSV of lengths)")
    if a.block:
        bad = [n for n in a.N if n % a.block]
        if bad:
            ap.error(f"--block {a.block} must divide every --N (not {', '.join(map(str, bad))}); or --block 0 (pair "
                     f"model only)")
    if (a.c0 is None or a.c2 is None or a.c_lin is None) and not os.path.exists(a.kernel_csv):
        ap.error(f"--kernel-csv {a.kernel_csv} does not exist (or pass --c0, --c2 and --c-lin)")
    over = {k: v for k, v in (("c0", a.c0), ("c2", a.c2), ("c_lin", a.c_lin)) if v is not None}
    fit = {}
    if os.path.exists(a.kernel_csv):
        try:
            fit = fit_costs(a.kernel_csv, fit_min_seq_len=a.fit_min_seq_len)
        except ValueError as e:  # not a GPU sweep of our kernels (a CPU sweep has no triton rows), or too few points
            if len(over) < 3:
                ap.error(f"--kernel-csv {a.kernel_csv}: {e}; pass an eval.sweep kernel.csv with flash/triton and "
                         f"linear/triton rows (head_dim 128, causal), a smaller --fit-min-seq-len, or --c0, --c2 "
                         f"and --c-lin")
    if over:
        fit.update(over)
        fit["source"] = (f"{fit['source']}; overridden on the command line: {over}" if fit.get("source") else
                         f"the command line: {over}")
        fit["n_star_const"] = fit["c_lin"] / fit["c2"]
        fit["n_star_fit"] = (fit["c_lin"] - fit["c0"]) / fit["c2"]
    print(f"constants (us/token): c0 = {fit['c0']:.4g}, c2 = {fit['c2']:.4g} per token of context, "
          f"c_lin = {fit['c_lin']:.4g}; n* by N = (c_lin - c0) / c2 = {fit['n_star_fit']:.0f}\n  from {fit['source']}")
    pool = wikitext_lengths(a.wikitext) if a.wikitext else None
    if pool is None:
        print("no --wikitext: the WikiText-2 rows are left out")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "fit.json"), "w") as f:
        json.dump(fit, f, indent=1)
    if pool is not None:
        write_csv(os.path.join(a.out, "wikitext2_article_lengths.csv"), [dict(length=x) for x in pool], ["length"])
    nst, curves, wiki = model(fit, a.N, a.families, pool, a.tokens, a.points_per_octave, block=a.block)
    write_csv(os.path.join(a.out, "doclen.csv"), nst, NSTAR_COLUMNS)
    write_csv(os.path.join(a.out, "doclen_curves.csv"), curves, CURVE_COLUMNS)
    if wiki:
        write_csv(os.path.join(a.out, "doclen_wikitext.csv"), wiki, WIKI_COLUMNS)
    md = md_table(nst, NSTAR_COLUMNS) + ("\n" + md_table(wiki, WIKI_COLUMNS) if wiki else "")
    if a.measure:
        res = measure(fit, a.N, a.families, a.means, nst, pool, a.time_budget_s, a.bench_tokens)
        if res is not None:
            rows, nrows = res
            write_csv(os.path.join(a.out, "doclen_measured.csv"), rows, MEASURED_COLUMNS)
            write_csv(os.path.join(a.out, "doclen_measured_nstar.csv"), nrows, MEASURED_NSTAR_COLUMNS)
            from eval.bench_common import env_info

            with open(os.path.join(a.out, "doclen_measured.json"), "w") as f:
                json.dump(dict(env=env_info(), fit=fit, rows=rows, n_star=nrows), f, indent=1, default=str)
            md += "\nmeasured\n\n" + md_table(nrows, MEASURED_NSTAR_COLUMNS)
    with open(os.path.join(a.out, "doclen.md"), "w") as f:
        f.write(md)
    print(md)
    if not a.no_figure:
        default_fit = (os.path.abspath(a.kernel_csv) == os.path.abspath(DEFAULT_KERNEL_CSV) and not over
                       and a.fit_min_seq_len == ap.get_default("fit_min_seq_len"))
        print("figure:", ", ".join(figure(a.out, a.figures_dir, figure_measured(a.measured, a.out, default_fit))))
    return 0


def figure_measured(measured: Optional[str], out: str, default_fit: bool) -> str:
    """The measured table the figure of ``main`` draws, said on stdout: ``measured`` as given (``none``: no table),
    else ``out``'s ``doclen_measured.csv``, else :data:`DEFAULT_MEASURED` (the committed H200 points; only with the
    default constants ``default_fit``, which they were measured beside), else ``none``. The committed
    ``docs/figures`` figure has them: ``--out results/doclen --figures-dir docs/figures`` dropped them when only
    ``--out`` was looked at."""
    if measured is not None:
        if measured.lower() == "none":
            print("doclen figure: --measured none: the model only")
        return measured
    own = os.path.join(out, "doclen_measured.csv")
    if os.path.exists(own):
        return own
    if default_fit and os.path.exists(DEFAULT_MEASURED):
        print(f"doclen figure: the measured points of {DEFAULT_MEASURED} (the committed H200 run; --measured none: "
              f"the model only)")
        return DEFAULT_MEASURED
    print(f"doclen figure: no measured table ({own} is not there; --measured names one): the model only")
    return "none"


if __name__ == "__main__":
    main()
