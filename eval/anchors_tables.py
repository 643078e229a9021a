"""The best-against-best tables of ``lab/h200_anchors.sh`` for docs/results.md (markdown on stdout).

Reads ``RESULTS_DIR/<family>/kernel.csv`` (one per family process; ``eval.sweep`` rows of
``eval/conf/sweep/anchors_h200.yaml``), joins them into ``RESULTS_DIR/combined/kernel.csv`` and writes, from the
measured rows only:

1. forward+backward TFLOP/s per case and N for ours and every anchor (FlashAttention's FLOP convention; median of
   the repeats), the fastest correct implementation in bold and named in a ``best`` column; a failed correctness
   check is marked, an anchor that errored says ``err``, one that cannot express the case ``n/a``;
2. the ratio ours / anchor (TFLOP/s, i.e. the anchor's time over ours: below 1 = ours slower) per case and N;
3. forward-only TFLOP/s at the largest N;
4. n* ours vs ours and best vs best, each with its bootstrap interval and the implementation on each side
   (:mod:`eval.best`; ``best.csv``, ``crossover_best.csv``, ``nstar_compare.csv`` and ``best_time_vs_n.png`` go to
   ``RESULTS_DIR/combined``), and how far the conclusion moves;
5. every anchor failure (status, message), so a missing or failing anchor is visible, not silently absent.

    python -m eval.anchors_tables RESULTS_DIR [--config eval/conf/sweep/anchors_h200.yaml] [--n-boot 1000]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

from eval.bench_common import POSITIVE_INT
from eval.best import OURS, analyse_best, check_bootstrap, check_state, eligible, format_nstar_markdown, impl_summary
from eval.best import _short as _n  # N as 1k, 16k, 640
from eval.crossover import _f

LABELS = {"causal": "causal, D 128", "full": "full, D 128", "gqa": "GQA 4:1, D 128", "d64": "causal, D 64",
          "window": "window 1024", "bigbird": "BigBird", "linear": "linear (elu1), D 128",
          "linear_taylor": "Taylor (Based), D 16"}
BACKEND_LABELS = {"triton": "ours (triton)", "parallel": "ours (parallel)",
                  "taylor_chunk": "ours (taylor_chunk)", "torch": "ours (torch)", "fa4": "FA4",
                  "flex_fa4": "Flex+FA4", "sdpa_cudnn": "cuDNN", "sdpa_flash": "FA2 (SDPA)", "flex": "Flex (Triton)",
                  "fla": "fla", "fa2": "FA2", "fa3": "FA3"}
# the variants of each family process of lab/h200_anchors.sh (its run_family lines; a test keeps the two in step), in
# the tables' order (the script runs them in its own)
FAMILIES = {"softmax": ("causal", "full", "gqa", "d64", "window", "bigbird"), "linear": ("linear", "linear_taylor")}
ORDER = ("triton", "parallel", "taylor_chunk", "torch", "fa4", "flex_fa4", "sdpa_cudnn", "sdpa_flash", "flex", "fla",
         "fa2", "fa3")


def load(results_dir: str) -> List[dict]:
    """The latest row of every point of every ``<family>/kernel.csv`` under ``results_dir`` (``combined/`` left
    out), and, for a family whose folder kept no ``kernel.csv`` (committed runs keep ``combined/kernel.csv`` alone,
    the same rows with a ``family`` column), ``combined/kernel.csv``'s rows of that family: a run's tables can be
    rebuilt, and rewriting ``combined/kernel.csv`` never drops a family. Raises ``FileNotFoundError`` naming the
    folder when there is neither, ``ValueError`` when they hold no row."""
    from eval.sweep import latest_rows, read_rows

    fam_of = lambda p: os.path.basename(os.path.dirname(p))  # noqa: E731
    order = lambda f: (f != "softmax", f)  # noqa: E731  (softmax first, then the others)
    paths = sorted((p for p in glob.glob(os.path.join(results_dir, "*", "kernel.csv")) if fam_of(p) != "combined"),
                   key=lambda p: order(fam_of(p)))
    combined = os.path.join(results_dir, "combined", "kernel.csv")
    if not paths and not os.path.isfile(combined):
        raise FileNotFoundError(f"no <family>/kernel.csv under {results_dir} (written by lab/h200_anchors.sh), and no "
                                f"combined/kernel.csv")
    by_family = {fam_of(p): [dict(r, family=fam_of(p)) for r in latest_rows(read_rows(p))] for p in paths}
    if os.path.isfile(combined):
        kept = read_rows(combined)
        if kept and not all(r.get("family") for r in kept):
            raise ValueError(f"{combined}: rows without a family column (not written by eval.anchors_tables)")
        for f in {r["family"] for r in kept} - {f for f, rs in by_family.items() if rs}:
            by_family[f] = latest_rows([r for r in kept if r["family"] == f])
    rows = [r for f in sorted(by_family, key=order) for r in by_family[f]]
    if not rows:  # every table empty (a family process that died before its first row): nothing to tabulate
        raise ValueError(f"no rows in {', '.join(paths + [combined] * os.path.isfile(combined))}: every "
                         f"<family>/kernel.csv under {results_dir} is empty")
    return rows
    if not paths:
        raise FileNotFoundError(f"no <family>/kernel.csv under {results_dir} (written by lab/h200_anchors.sh), and no "
                                f"combined/kernel.csv")
    rows = []
    for p in paths:
        fam = os.path.basename(os.path.dirname(p))
        rows += [dict(r, family=fam) for r in latest_rows(read_rows(p))]
    if not rows:  # every kernel.csv empty (a family process that died before its first row): nothing to tabulate
        raise ValueError(f"no rows in {', '.join(paths)}: every <family>/kernel.csv under {results_dir} is empty")
    return rows


def _cases(rows: Sequence[dict]) -> List[str]:
    seen = list(dict.fromkeys(r["variant"] for r in rows))
    return [v for v in LABELS if v in seen] + [v for v in seen if v not in LABELS]


def _backends(rows: Sequence[dict]) -> List[str]:
    seen = set(r["backend"] for r in rows)
    return [b for b in ORDER if b in seen] + sorted(seen - set(ORDER))


def _cell(r: Optional[dict], col: str) -> str:
    if r is None:
        return ""
    st = r.get("status")
    if st == "unsupported":
        return "n/a"
    if st in ("error", "oom"):
        return st if st == "oom" else "err"
    if st == "skipped":
        return "skip"
    v = _f(r.get(col))
    if not math.isfinite(v):
        return "-"
    s = f"{v:.0f}"
    return s + " ✗" if check_state(r) == "failed" else s


def tflops_table(rows: Sequence[dict], mode: str = "fwd_bwd") -> str:
    """Markdown: TFLOP/s of ``mode`` per (case, N) and backend; best correct one bold and named."""
    col, ms = f"{mode}_tflops", f"{mode}_ms"
    cases = _cases(rows)
    out = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        frows = [r for r in rows if r["family"] == fam]
        backs = _backends(frows)
        out.append(f"| case | N | {' | '.join(BACKEND_LABELS.get(b, b) for b in backs)} | best |")
        out.append("|---|---|" + "---|" * (len(backs) + 1))
        for case in [c for c in cases if any(r["variant"] == c for r in frows)]:
            for n in sorted({int(_f(r["seq_len"])) for r in frows if r["variant"] == case}):
                at = {r["backend"]: r for r in frows if r["variant"] == case and int(_f(r["seq_len"])) == n}
                ok = [r for r in at.values() if eligible(r, ms)]
                win = min(ok, key=lambda r: _f(r[ms]))["backend"] if ok else None
                cells = []
                for b in backs:
                    c = _cell(at.get(b), col)
                    cells.append(f"**{c}**" if b == win and c else c)
                out.append(f"| {LABELS.get(case, case)} | {_n(n)} | {' | '.join(cells)} | "
                           f"{BACKEND_LABELS.get(win, win) if win else '-'} |")
        out.append("")
    return "\n".join(out)


def ratio_table(rows: Sequence[dict], ours: Sequence[str] = OURS, mode: str = "fwd_bwd") -> str:
    """Markdown: ours / anchor TFLOP/s (= t_anchor / t_ours) per (case, N) for every anchor measured; ``ours`` = the
    fastest correct of ``ours`` (named when it is not triton)."""
    ms = f"{mode}_ms"
    anchors = [b for b in _backends(rows) if b not in ours and b != "torch"]
    out = [f"| case | N | ours | {' | '.join('vs ' + BACKEND_LABELS.get(b, b) for b in anchors)} |",
           "|---|---|---|" + "---|" * len(anchors)]
    for case in _cases(rows):
        for n in sorted({int(_f(r["seq_len"])) for r in rows if r["variant"] == case}):
            at = {r["backend"]: r for r in rows if r["variant"] == case and int(_f(r["seq_len"])) == n}
            mine = [at[b] for b in ours if b in at and eligible(at[b], ms)]
            if not mine:
                continue
            o = min(mine, key=lambda r: _f(r[ms]))
            cells = []
            for b in anchors:
                a = at.get(b)
                cells.append(f"{_f(a[ms]) / _f(o[ms]):.2f}" + (" ✗" if check_state(a) == "failed" else "")
                             if a is not None and a.get("status") == "ok" and _f(a.get(ms)) > 0 else "-")
            if any(c != "-" for c in cells):
                out.append(f"| {LABELS.get(case, case)} | {_n(n)} | {o['backend']} | {' | '.join(cells)} |")
    return "\n".join(out)


def failures_table(rows: Sequence[dict], unreached: Sequence[dict] = ()) -> str:
    """Markdown: every (backend, status, message) that is not ``ok`` / ``unsupported``-by-design, with its cases,
    then the config's points that have no row (``unreached``: :func:`unreached_points`), one line per series."""
    groups: Dict[tuple, List[str]] = {}
    for r in rows:
        bad_check = r.get("status") == "ok" and check_state(r) == "failed"
        if r.get("status") in ("ok", "skipped") and not bad_check:
            continue
        msg = (r.get("error") or "").replace("|", "/")[:160] or "-"
        if bad_check:
            msg = f"check_err={_f(r.get('check_err')):.3g} > tolerance"
        key = (r["backend"], "check failed" if bad_check else r["status"], msg)
        groups.setdefault(key, []).append(f"{r['variant']}@{_n(r['seq_len'])}")
    missing = unreached_lines(unreached)
    if not groups and not missing:
        return "(none: every point ok, skipped after a slower point, or excluded by the config)"
    out = []
    if groups:
        out += ["| backend | status | message | points |", "|---|---|---|---|"]
    for (b, st, msg), pts in sorted(groups.items()):
        shown = ", ".join(pts[:6]) + (f", ... ({len(pts)})" if len(pts) > 6 else "")
        out.append(f"| {BACKEND_LABELS.get(b, b)} | {st} | {msg} | {shown} |")
    if missing:
        out += ([""] if groups else []) + [f"{len(unreached)} points of the config have no row:"] + missing
    return "\n".join(out)


def config_points(rows: Sequence[dict], cfg: dict) -> List[dict]:
    """The points of the sweep config ``cfg`` (:func:`eval.sweep.expand_points`, in run order) of the families in
    ``rows`` (their variants: :data:`FAMILIES`; a family not named there: the variants it has rows of). Variants the
    config does not have are left out."""
    from eval.sweep import expand_points

    fams = dict.fromkeys(r["family"] for r in rows)
    want = [v for f in fams for v in FAMILIES.get(f, [r["variant"] for r in rows if r["family"] == f])]
    conf = cfg.get("variants") or {}
    variants = {v: conf[v] for v in dict.fromkeys(want) if v in conf}
    if not variants:
        return []
    return expand_points(dict(cfg, variants=variants))


def unreached_points(rows: Sequence[dict], points: Sequence[dict]) -> List[dict]:
    """The ``points`` (:func:`config_points`) that have no row in ``rows``: never reached before the deadline."""
    from eval.sweep import point_key

    have = {point_key(r) for r in rows}
    return [p for p in points if point_key(p) not in have]


def unreached_lines(points: Sequence[dict]) -> List[str]:
    """``not reached (deadline): variant / backend / N list`` per series of :func:`unreached_points`."""
    groups: Dict[tuple, List[int]] = {}
    for p in points:
        groups.setdefault((p["variant"], p["backend"]), []).append(int(p["seq_len"]))
    return [f"- not reached (deadline): {v} / {BACKEND_LABELS.get(b, b)} / {', '.join(_n(n) for n in sorted(ns))}"
            for (v, b), ns in groups.items()]


ROOF_CASES = ("causal", "full", "gqa", "d64")


def decode_matrix_rows(rows: Sequence[dict], Nq: int = 1, pages=("", "0", "16", "256")) -> list:
    """Rows of ``lab/decode_probe.py --matrix`` (``B, Hq, Hkv, context, page_size, Nq, frac, sdpa_frac``) as the
    roofline's decode rows (``case``, ``method`` = ``ours_default`` / ``sdpa``, ``frac``): one case per batch, heads,
    context and page size (``-`` = contiguous) at ``Nq`` new queries, for the page sizes in ``pages`` (rows of another
    ``page_gather`` than the default ``key`` are left out)."""
    out = []
    for r in rows:
        page = str(r.get("page_size", "")).strip()
        if int(_f(r["Nq"])) != Nq or page not in pages or str(r.get("page_gather") or "key") != "key":
            continue
        ctx = int(_f(r["context"]))
        case = (f"B{int(_f(r['B']))} {ctx // 1024}k {int(_f(r['Hq']))}:{int(_f(r['Hkv']))} "
                f"{'contig' if page in ('', '0') else 'page ' + page}")
        out.append({"case": case, "method": "ours_default", "frac": r["frac"]})
        out.append({"case": case, "method": "sdpa", "frac": r["sdpa_frac"]})
    return out


def roofline_figure(rows: Sequence[dict], ceilings: dict, decode_rows: Sequence[dict] = ()):
    """The anchors run against the machine's two roofs (an :class:`eval.figspec.Figure`): one panel per softmax case
    of :data:`ROOF_CASES`, forward+backward TFLOP/s vs N per implementation under the measured bf16 matmul roof
    (``ceilings["matmul_tflops"]``, :mod:`lab.ceilings`), and one panel of decode bytes/s as a fraction of the
    measured copy bandwidth (rows of ``lab/decode_probe.py``: ``case``, ``method``, ``frac``; ours at its defaults
    against SDPA), the roof at 1. Raises ``KeyError`` naming ``matmul_tflops`` when ``ceilings`` lacks it."""
    from eval import figspec
    from eval.plots import variant_style

    roof = float(ceilings["matmul_tflops"])
    panels = []
    names = {}
    for case in [c for c in ROOF_CASES if any(r["variant"] == c for r in rows)]:
        p = figspec.Panel(LABELS.get(case, case), "N (tokens)", "fwd+bwd TFLOP/s", xlog=2,
                          hlines=[(roof, {"color": "black", "ls": "--"})], ylim=(0, roof * 1.08))
        sel = [r for r in rows if r["variant"] == case and r.get("status") == "ok" and check_state(r) != "failed"]
        p.xticks = sorted({int(_f(r["seq_len"])) for r in sel})
        for b in _backends(sel):
            pts = sorted((r for r in sel if r["backend"] == b), key=lambda r: _f(r["seq_len"]))
            lab = BACKEND_LABELS.get(b, b)
            names[lab] = variant_style("impl:" + b)
            p.traces.append(figspec.Trace(lab, [_f(r["seq_len"]) for r in pts],
                                          [_f(r["fwd_bwd_tflops"]) for r in pts], names[lab],
                                          meta={"backend": b, "case": case}))
        panels.append(p)
    if decode_rows and "case" not in decode_rows[0]:
        decode_rows = decode_matrix_rows(decode_rows)
    # ``lab/decode_probe.py --compare`` rows name the current default plan "new"
    decode_rows = [dict(r, method="ours_default") if r.get("method") == "new" else r for r in decode_rows]
    if decode_rows:
        cases = list(dict.fromkeys(r["case"] for r in decode_rows))
        p = figspec.Panel(f"decode (copy {_f(ceilings.get('copy_gbps')) / 1e3:.2f} TB/s = 1)",
                          "fraction of copy bandwidth", "", ylabels=cases, vlines=[(1.0, {"color": "black", "ls": "--"})])
        for method, lab, dy in (("ours_default", "ours (triton)", -0.18), ("sdpa", "cuDNN", 0.18)):
            pts = [(i, _f(r["frac"])) for i, c in enumerate(cases) for r in decode_rows
                   if r["case"] == c and r["method"] == method]
            if pts:
                st = names.setdefault(lab, variant_style("impl:" + ("triton" if method == "ours_default" else "sdpa_cudnn")))
                p.traces.append(figspec.Trace(lab, [x for _, x in pts], [i + dy for i, _ in pts], st, lines=False,
                                              bars=True, bar_height=0.34, meta={"method": method}))
        panels.append(p)
    return figspec.Figure(f"How close to the H200's roofs? bf16 matmul {roof:.0f} TFLOP/s (dashed), measured",
                          panels, legend=list(names.items()), ncols=3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--config", default="eval/conf/sweep/anchors_h200.yaml", help="the sweep config of the run")
    ap.add_argument("--n-boot", type=POSITIVE_INT, default=None,
                    help="bootstrap resamples, an integer >= 1 (default: the config's n_boot)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--ceilings", default=None, help="lab/ceilings.py JSON: draw RESULTS_DIR/combined/roofline.png")
    ap.add_argument("--decode", default=None, help="lab/decode_probe.py CSV: the decode panel of the roofline")
    a = ap.parse_args(argv)
    from eval.bench_common import write_csv
    from eval.sweep import columns_of, load_config

    if not os.path.isfile(a.config):
        ap.error(f"--config {a.config}: no such file (the sweep config of the run, e.g. "
                 f"eval/conf/sweep/anchors_h200.yaml from the repository root)")
    cfg = load_config(a.config)
    if a.n_boot is not None:
        cfg["n_boot"] = a.n_boot
    try:
        check_bootstrap(cfg.get("n_boot"), cfg.get("level"))
    except ValueError as e:  # the config's own n_boot: 0 was taken as 1000, a negative count gave NaN intervals
        ap.error(f"--config {a.config}: {e} (or pass --n-boot)")
    try:
        rows = load(a.results_dir)
    except (FileNotFoundError, ValueError) as e:  # not a run directory of lab/h200_anchors.sh: the message alone
        ap.error(f"results_dir {a.results_dir}: {e}")
    comb = os.path.join(a.results_dir, "combined")
    write_csv(rows, os.path.join(comb, "kernel.csv"), columns=columns_of(rows) + ["family"])
    res = analyse_best(comb, cfg, plots=not a.no_plots)
    ours = list(cfg.get("ours") or OURS)
    ok = sum(r.get("status") == "ok" for r in rows)
    checked = sum(check_state(r) != "unchecked" for r in rows if r.get("status") == "ok")
    conf_pts = config_points(rows, cfg)
    unreached = unreached_points(rows, conf_pts)
    env = {}
    vpath = os.path.join(a.results_dir, "versions.json")
    if os.path.exists(vpath):
        import json

        with open(vpath) as f:
            env = json.load(f)
    print(f"<!-- eval/anchors_tables.py {a.results_dir}: {len(conf_pts)} points in the config, "
          f"{len(rows)} measured, {ok} ok, {checked} of them checked -->")
    if env:
        pk = ", ".join(f"{k[4:]} {v}" for k, v in env.items() if k.startswith("pkg:") and v)
        print(f"Measured {env.get('date')} on {env.get('gpu')} ({pk}).\n")
    print(f"### Forward+backward TFLOP/s ({cfg.get('dtype')}, H {cfg.get('n_heads')}, {cfg.get('tokens')} tokens per call; median "
          f"of {cfg.get('repeats', 1)} repeats; bold: the fastest implementation that passed its check)\n")
    print(tflops_table(rows, "fwd_bwd"))
    print("### Ours / anchor (forward+backward TFLOP/s ratio; below 1: the anchor is faster)\n")
    print(ratio_table(rows, ours))
    nmax = max(int(_f(r["seq_len"])) for r in rows)
    print(f"\n### Forward only at N = {_n(nmax)} (TFLOP/s)\n")
    print(tflops_table([r for r in rows if int(_f(r["seq_len"])) == nmax], "fwd"))
    lvl = float(cfg.get("level") or 0.95)
    print(f"### n*: ours vs ours and best vs best ({res['metric']}, against {cfg['baseline']['variant']}; "
          f"[{lvl:.0%} bootstrap interval over the repeats]; implementations per N on each side)\n")
    print(format_nstar_markdown(res["nstar"]))
    print()
    for r in res["nstar"]:
        print(f"- {r['variant']}: {r['conclusion']} (p_cross ours {_f(r['ours_p_cross']):.2f}, best "
              f"{_f(r['best_p_cross']):.2f}; {r['best_reps']} repeats per point)")
    print("\n### Failures (recorded rows, then the config's points never reached; every other anchor ran)\n")
    print(failures_table(rows, unreached))
    picks = {}
    for r in res["best"]:
        picks.setdefault(r["variant"], []).append((_f(r["seq_len"]), r["impl"]))
    print("\nBest implementation per case: " + "; ".join(f"{LABELS.get(v, v)}: {impl_summary(p)}"
                                                         for v, p in picks.items()))
    if a.ceilings and not a.no_plots:
        import json

        from eval import figspec
        from eval.sweep import read_rows

        with open(a.ceilings) as f:
            ceil = json.load(f)
        drows = read_rows(a.decode) if a.decode else []
        figspec.to_png(roofline_figure(rows, ceil, drows), os.path.join(comb, "roofline"), ["png"])
    print(f"\n(files: {comb}/best.csv, crossover_best.csv, nstar_compare.csv"
          + (", best_time_vs_n.png" if res["figures"] else "") + ")", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
