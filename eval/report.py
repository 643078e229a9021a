"""The interactive report: one self-contained HTML file (Plotly, plotly.js inline; no server, no network).

    python -m eval.report                         # writes results/report.html
    python -m eval.report --out /tmp/report.html
    python -m eval.report --root <a checkout> --out /tmp/report.html   # another checkout's results

Sections (each a ``<section id="sec-...">``):

* ``crossover``: speed and memory vs N per variant and backend from every committed kernel sweep
  (``results/**/kernel.csv`` + its ``crossover.csv``), n* starred, filters for head dim, GPU and implementation;
  quality vs N per variant (``results/cpu/crossover_quality/quality.csv``); n*_doc by document length
  (``results/doclen``, :func:`eval.figspec.doclen`).
* ``bill``: the cost bill of standard (S, P in HBM) vs flash attention for a chosen model: FLOPs, HBM bytes and the
  roofline time bound (:mod:`attn_zoo.cost_model`, ported to JavaScript formula for formula).
* ``sliders``: ``n* = c_lin / c2`` (and ``(c_lin - c0) / c2``) moving with the constants of
  :func:`eval.crossover.constants_crossover`, started at a measured crossover.
* ``kv``: KV-cache / state bytes per variant vs context and batch against a memory budget
  (:mod:`attn_zoo.decode.memory`: per-layer descriptors of :func:`~attn_zoo.decode.memory.variant_presets` are
  exported, the bytes and the longest context that fits are computed in the page by the same formulas).
* ``bubble``: quality x speed x memory (:func:`eval.figspec.bubble` of the committed joins).
* ``fig2``: the MQAR Zoology Fig. 2 grid (:func:`eval.figspec.fig2`), hover naming the run and its command.

The charts of the crossover, bubble and fig2 sections are the same :mod:`eval.figspec` definitions that draw the
PNGs of ``docs/``, rendered by :func:`eval.figspec.to_plotly`. The page exposes its cost functions as
``window.attnZoo`` (``costBill``, ``cacheBytes``, ``maxContext``, ``nStar``); ``tests/test_report_browser.py``
checks them against the Python models in headless Chromium.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from collections import Counter
from typing import Dict, List, Optional, Sequence

from attn_zoo import cost_model as cm
from attn_zoo.decode import memory as dm
from attn_zoo.feature_maps import feature_dim

from eval import figspec
from eval.bench_common import json_safe, read_rows
from eval.crossover import _f

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUALITY_CSV = "results/cpu/crossover_quality/quality.csv"
JOINS = "results/h200/quality/join_*/quality_speed_memory.csv"
FIG2 = "results/h200/quality/mqar_fig2/fig2.csv"
DOCLEN = "results/doclen"  # eval.doclen's model tables (the n*_doc chart of the crossover section)
DOCLEN_MEASURED = "results/h200/doclen/doclen_measured.csv"
# eval.bench_flash tables (another schema: N, D, Hkv, impl) joined to the explorer: the head dims 64 and 128
BENCH_FLASH = ("results/h200/bench_flash_d64.csv", "results/h200/bench_flash_d128.csv")
FIG2_RUNS = ("results/h200/quality/runs/mqar_fig2", "results/h200/quality/runs/mqar_fig2_based")
# KV-cache explainer models: (name, n_layer, n_head, head_dim)
KV_MODELS = [("GPT-2 medium", 24, 16, 64), ("7B (Llama-2-like)", 32, 32, 128), ("70B-like", 80, 64, 128)]
KV_WINDOW = 4096
# cost-bill presets: name -> (B, H, N, D)
BILL_MODELS = {"GPT-2 medium (FA1 Fig. 2)": (64, 16, 1024, 64), "7B, 8k context": (1, 32, 8192, 128),
               "small model of our sweeps": (1, 16, 16384, 128)}
SECTIONS = ("crossover", "bill", "sliders", "kv", "bubble", "fig2")


# --------------------------------------------------------------------------------------------- Python references
def cost_bill(B: int, H: int, N: int, D: int, mode: str = "fwd_bwd", causal: bool = True, dtype_bytes: int = 2,
              machine: str = "h200", loop_order: str = "fa2", blocks: str = "128x64") -> Dict[str, dict]:
    """The bill the page computes: ``{"standard": {...}, "flash": {...}}`` with ``flops``, ``hbm_bytes``,
    ``footprint_bytes`` and ``time_s`` (the roofline bound :meth:`attn_zoo.cost_model.Machine.bound_time`).
    ``blocks``: ``"128x64"`` (our kernel's tiles) or ``"sram"`` (FA1's rule from the machine's SRAM)."""
    if blocks not in ("128x64", "sram"):
        raise ValueError(f"blocks={blocks!r} is not supported; allowed values: 128x64, sram")
    m = cm.get_machine(machine)
    std = cm.standard_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode=mode, causal=causal)
    fl = cm.flash_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode=mode, causal=causal, loop_order=loop_order,
                                 sram_bytes=m.sram_bytes if blocks == "sram" else None)
    return {k: {"flops": c.flops, "hbm_bytes": c.hbm_bytes, "footprint_bytes": c.footprint_bytes,
                "time_s": m.bound_time(c)} for k, c in (("standard", std), ("flash", fl))}


def kv_layers(n_layer: int, n_head: int, head_dim: int, window: int = KV_WINDOW) -> Dict[str, List[dict]]:
    """Per preset of :func:`attn_zoo.decode.memory.variant_presets`, its layers as the page computes them:
    ``{"hkv", "window" (kept tokens or None), "state" (linear: F*D + F elements per KV head, else None)}``."""
    out = {}
    for name, specs in dm.variant_presets(n_layer, n_head, window=window).items():
        layers = []
        for s in specs:
            kept = dm.kept_tokens(s, 1 << 62)
            st = None
            if kept is None:
                fd = feature_dim(s.feature_map, head_dim, s.num_features)
                st = fd * head_dim + fd
            layers.append({"hkv": s.resolve_kv_heads(n_head), "state": st,
                           "window": None if kept in (None, 1 << 62) else kept})
        out[name] = layers
    return out


# --------------------------------------------------------------------------------------------- data
def crossover_figure(root: str = REPO) -> Optional[figspec.Figure]:
    """Speed (fwd+bwd ms) and memory vs N of every committed kernel sweep; n* of each crossover starred."""
    from eval.plots import read_env

    rows, cross = [], []
    for k in sorted(glob.glob(os.path.join(root, "results", "**", "kernel.csv"), recursive=True)):
        d = os.path.dirname(k)
        gpu = read_env(d).get("gpu") or "?"
        rows += [dict(r, gpu=gpu) for r in read_rows(k) if r.get("status") == "ok"]
        if os.path.exists(os.path.join(d, "crossover.csv")):
            cross += [dict(c, gpu=gpu) for c in read_rows(os.path.join(d, "crossover.csv"))]
    for path in BENCH_FLASH:
        rows += bench_flash_rows(os.path.join(root, path))
    if not rows:
        return None
    return figspec.crossover(rows, cross)


def bench_flash_rows(path: str) -> List[dict]:
    """An :mod:`eval.bench_flash` table in the kernel-sweep schema of :func:`eval.figspec.crossover`: ``variant``
    ``flash <its variant>`` (causal, noncausal, win1024, ...), ``backend`` its ``impl`` (``ours`` -> ``triton``),
    ``seq_len`` = N, ``head_dim`` = D, ``n_kv_heads`` = Hkv, ``peak_mem_bytes`` from MiB, ``gpu`` from its JSON."""
    if not os.path.exists(path):
        return []
    gpu = "?"
    if os.path.exists(path[:-4] + ".json"):
        with open(path[:-4] + ".json") as f:
            gpu = (json.load(f).get("env") or {}).get("gpu", "?")
    return [{"variant": f"flash {r['variant']}", "backend": {"ours": "triton"}.get(r["impl"], r["impl"]),
             "seq_len": r["N"], "head_dim": r["D"], "n_kv_heads": r["Hkv"], "fwd_ms": r["fwd_ms"],
             "fwd_bwd_ms": r["fwd_bwd_ms"], "peak_mem_bytes": _f(r.get("peak_mem_mib")) * 2 ** 20, "gpu": gpu}
            for r in read_rows(path)]


def _overrides(run_dir: str) -> List[str]:
    from eval.recall import hydra_yaml

    return [str(o) for o in (hydra_yaml(run_dir, "overrides.yaml") or []) if not str(o).startswith("stop_at=")]


def run_index(roots: Sequence[str]) -> List[dict]:
    """Every run under ``roots`` by its Hydra overrides (``attention``, ``seq_len``, ``d_model``, ``lr``), with
    ``run`` (its folder) and ``command`` (``python train.py <overrides>``); reads only ``overrides.yaml``."""
    out = []
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, "*", ""))):
            ov = _overrides(d)
            if not ov:
                continue
            kv = dict(o.split("=", 1) for o in ov if "=" in o)
            out.append({"attention": kv.get("attention", ""), "seq_len": _f(kv.get("data.seq_len")),
                        "d_model": _f(kv.get("model.d_model")), "lr": _f(kv.get("optim.lr")),
                        "run": os.path.relpath(d.rstrip("/"), REPO),
                        "command": "python train.py " + " ".join(ov)})
    return out


def _attach_runs(rows: List[dict], index: Sequence[dict], keys: Sequence[str]) -> List[dict]:
    """Each row with ``run`` / ``command`` of the run it came from (variant label starts with the attention name;
    the other ``keys`` (row key, index key) equal); rows with no match are left as they are."""
    out = []
    for r in rows:
        hits = [x for x in index if (str(r["variant"]) == x["attention"] or
                                     str(r["variant"]).startswith(x["attention"] + " "))
                and all(_f(r.get(a)) == _f(x.get(b)) for a, b in keys)]
        if hits:
            r = dict(r, run=hits[0]["run"] + (f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""),
                     command=hits[0]["command"])
        out.append(r)
    return out


def _fig2_rows(root: str) -> List[dict]:
    rows = []
    for r in read_rows(os.path.join(root, FIG2)):
        rows.append(dict(r, seq_len=int(_f(r["seq_len"])), d_model=int(_f(r["d_model"])), acc=_f(r["acc"])))
    return _attach_runs(rows, run_index([os.path.join(root, p) for p in FIG2_RUNS]),
                        [("seq_len", "seq_len"), ("d_model", "d_model"), ("best_lr", "lr")])


def _bubble_figures(root: str) -> List[figspec.Figure]:
    figs = []
    for p in sorted(glob.glob(os.path.join(root, JOINS))):
        name = os.path.basename(os.path.dirname(p)).replace("join_", "")
        best = name.endswith("_best")  # compare=best: the speed of the fastest correct implementation per length
        runs = os.path.join(root, "results", "h200", "quality", "runs", name[:-len("_best")] if best else name)
        rows = _attach_runs(read_rows(p), run_index([runs]), [("seq_len", "seq_len")])
        quality = "val_bpb" if any(math.isfinite(_f(r.get("val_bpb"))) for r in rows) else "val_acc"
        impl = "the fastest correct implementation per length (ours, cuDNN, FA4)" if best else "our kernels"
        figs.append(figspec.bubble(rows, quality, title=f"{name} (H200 quality runs; speed and memory: "
                                                         f"bench_model, small model, {impl})"))
    return figs


def doclen_figure(root: str = REPO) -> Optional[figspec.Figure]:
    """n*_doc by document length (:func:`eval.figspec.doclen` of ``results/doclen``, with the H200 measured points
    of ``results/h200/doclen`` when committed); None without the tables."""
    d = os.path.join(root, DOCLEN)
    if not os.path.exists(os.path.join(d, "doclen_curves.csv")):
        return None
    m, w = os.path.join(root, DOCLEN_MEASURED), os.path.join(d, "doclen_wikitext.csv")
    with open(os.path.join(d, "fit.json")) as f:
        fit = json.load(f)
    return figspec.doclen(read_rows(os.path.join(d, "doclen_curves.csv")), read_rows(os.path.join(d, "doclen.csv")),
                          read_rows(w) if os.path.exists(w) else [], fit,
                          measured=read_rows(m) if os.path.exists(m) else None)


def slider_rows(root: str = REPO) -> List[dict]:
    """The crossovers the sliders start from (every ``results/**/crossover.csv`` row with ``c2`` and ``c_lin``):
    ``{label, c0, c2, c_lin, n_star}``, each label unique. It names the pair (``linear/fla vs flash/sdpa_cudnn``),
    the metric and head dim; where that is not enough, the causality and KV heads, then the sweep's folder, then a
    count. (The label was ``variant/backend metric (d=...)``: the rows against the five baselines of a sweep had
    one label, five options in the list that read the same.)"""
    cross = []
    for p in sorted(glob.glob(os.path.join(root, "results", "**", "crossover.csv"), recursive=True)):
        where = os.path.relpath(os.path.dirname(p), os.path.join(root, "results"))
        for c in read_rows(p):
            if _f(c.get("c2")) > 0 and _f(c.get("c_lin")) > 0:
                cross.append({"label": f"{c['variant']}/{c['backend']} vs {c.get('baseline') or '?'} {c['metric']} "
                                       f"(d={c['head_dim']})",
                              "more": [f"{'causal' if str(c.get('causal')).lower() in ('true', '1') else 'non-causal'}"
                                       f", Hkv={c.get('n_kv_heads')}", where],
                              "c0": _f(c.get("c0")), "c2": _f(c.get("c2")), "c_lin": _f(c.get("c_lin")),
                              "n_star": _f(c.get("n_star"))})
    for level in range(2):  # add what tells equal labels apart, only to those
        count = Counter(c["label"] for c in cross)
        for c in cross:
            if count[c["label"]] > 1:
                c["label"] = f"{c['label'][:-1]}, {c['more'][level]})"
    seen: Counter = Counter()
    for c in cross:
        seen[c["label"]] += 1
        if seen[c["label"]] > 1:  # the same crossover twice (copies of a sweep): numbered
            c["label"] += f" #{seen[c['label']]}"
        del c["more"]
    return cross


BENCH_FLASH_REQUIRED = ("variant", "impl", "N", "D", "Hkv", "fwd_ms", "fwd_bwd_ms")
JOIN_REQUIRED = ("dataset", "variant", "seq_len", "tokens_per_s", "peak_mem_mb")
FIG2_REQUIRED = ("variant", "seq_len", "d_model", "acc", "best_lr")


def check_inputs(root: str = REPO) -> int:
    """Every table the page is built from under ``root`` checked before it is built; returns how many there are.
    ``FileNotFoundError`` when ``root`` is not a folder; ``ValueError`` naming the file and what was expected when
    one is empty, not a readable CSV, truncated JSON, or lacks a column the page reads (they were a pandas / JSON
    traceback or a KeyError), and when there is no table at all (the page had no chart and the command exited 0)."""
    from eval.bench_common import checked_json, checked_rows
    from eval.crossover import CROSSOVER_COLUMNS
    from eval.doclen import check_figure_inputs
    from eval.plots import QUALITY_REQUIRED, check_results_dir

    if not os.path.isdir(root):
        raise FileNotFoundError(f"--root {root}: no such directory (the repository root: its results/ are reported)")
    rel = lambda p: os.path.relpath(p, root)  # noqa: E731
    n = 0
    for k in sorted(glob.glob(os.path.join(root, "results", "**", "kernel.csv"), recursive=True)):
        check_results_dir(os.path.dirname(k), f"--root {root}: {rel(os.path.dirname(k))}")
        n += 1
    for p in sorted(glob.glob(os.path.join(root, "results", "**", "crossover.csv"), recursive=True)):
        checked_rows(p, f"--root {root}: crossover CSV {rel(p)}", CROSSOVER_COLUMNS,
                     "the crossover.csv eval.crossover writes")
        n += 1
    for p in BENCH_FLASH:
        path = os.path.join(root, p)
        if os.path.exists(path):
            checked_rows(path, f"--root {root}: {p}", BENCH_FLASH_REQUIRED, "an eval.bench_flash table")
            if os.path.exists(path[:-4] + ".json"):
                checked_json(path[:-4] + ".json", f"--root {root}: {p[:-4]}.json", "the JSON eval.bench_flash writes")
            n += 1
    checks = [(QUALITY_CSV, QUALITY_REQUIRED, "the quality.csv eval.quality writes"),
              (FIG2, FIG2_REQUIRED, "the fig2.csv eval.recall kind=fig2 writes")]
    checks += [(rel(p), JOIN_REQUIRED, "the quality_speed_memory.csv eval.quality writes")
               for p in sorted(glob.glob(os.path.join(root, JOINS)))]
    for p, need, what in checks:
        if os.path.exists(os.path.join(root, p)):
            checked_rows(os.path.join(root, p), f"--root {root}: {p}", need, what)
            n += 1
    if os.path.exists(os.path.join(root, DOCLEN, "doclen_curves.csv")):
        m = os.path.join(root, DOCLEN_MEASURED)
        check_figure_inputs(os.path.join(root, DOCLEN), f"--root {root}: {DOCLEN}", m if os.path.exists(m) else None,
                            "")
        n += 1
    if not n:
        raise ValueError(f"--root {root}: nothing to report: no results/**/kernel.csv, {QUALITY_CSV}, {DOCLEN}/, "
                         f"{JOINS} or {FIG2} under it (the repository root, whose committed results the page shows)")
    return n


def build_data(root: str = REPO) -> dict:
    """Everything the page needs, JSON-ready: the figures (Plotly JSON) and the cost-model constants and tables."""
    charts = {}
    cf = crossover_figure(root)
    if cf is not None:
        charts["crossover"] = figspec.to_plotly(cf)
    q = os.path.join(root, QUALITY_CSV)
    if os.path.exists(q):
        charts["quality"] = figspec.to_plotly(figspec.quality_vs_n(read_rows(q), "CPU, committed quality sweep"))
    df = doclen_figure(root)
    if df is not None:
        charts["doclen"] = figspec.to_plotly(df)
    for i, f in enumerate(_bubble_figures(root)):
        charts[f"bubble{i}"] = figspec.to_plotly(f)
    if os.path.exists(os.path.join(root, FIG2)):
        charts["fig2"] = figspec.to_plotly(figspec.fig2(_fig2_rows(root), "H200 runs of experiment=mqar_fig2"))
    cross = slider_rows(root)
    constants = {k: getattr(cm, k) for k in ("STAT_BYTES", "SOFTMAX_STABLE_FLOPS", "SOFTMAX_BWD_FLOPS",
                                             "FLASH_RECOMPUTE_FLOPS", "FLASH_BWD_DS_FLOPS", "DROPOUT_FLOPS")}
    machines = {k: {"name": m.name, "peak_flops": m.peak_flops, "bandwidth": m.bandwidth,
                    "sram_bytes": m.sram_bytes} for k, m in cm.MACHINES.items()}
    kv = {name: {"n_layer": L, "n_head": H, "head_dim": D, "presets": kv_layers(L, H, D)}
          for name, L, H, D in KV_MODELS}
    return json_safe({"charts": charts, "cost": {"constants": constants, "machines": machines, "models": BILL_MODELS},
                   "crossovers": cross, "kv": kv, "kv_window": KV_WINDOW})


def build_html(root: str = REPO) -> str:
    """The page as one string (plotly.js inline)."""
    from plotly.offline import get_plotlyjs

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.js")) as f:
        js = f.read()
    data = json.dumps(build_data(root), allow_nan=False).replace("</", "<\\/")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.html")) as f:
        page = f.read()
    return (page.replace("/*PLOTLY*/", get_plotlyjs().replace("</script", "<\\/script"))
            .replace("/*DATA*/", f"const DATA = {data};").replace("/*APP*/", js))


def write(out: str = os.path.join(REPO, "results", "report.html"), root: str = REPO) -> str:
    """Write the page to ``out``; returns the path."""
    html = build_html(root)
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(html)
    return out


def screenshots(html: str, out_dir: str, chromium: str = "/usr/bin/chromium") -> List[str]:
    """``report_<section>.png`` of each section of the page ``html`` (headless Chromium through playwright, a
    256-colour palette to keep them small); returns the paths."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1250, "height": 900})
        pg.goto("file://" + os.path.abspath(html))
        pg.wait_for_function("window.attnZoo && Object.keys(window.attnZoo.rendered).length >= 8", timeout=120_000)
        for sec in SECTIONS:
            paths.append(os.path.join(out_dir, f"report_{sec}.png"))
            pg.locator(f"#sec-{sec}").screenshot(path=paths[-1])
            Image.open(paths[-1]).convert("RGB").quantize(256).save(paths[-1], optimize=True)
        browser.close()
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "results", "report.html"),
                   help="the HTML file to write (a file path, not a directory; missing parent directories are created)")
    p.add_argument("--root", default=REPO, help="the repository root whose results/ the page shows (default: this "
                   "checkout); its tables are checked before the page is built")
    p.add_argument("--screenshots", metavar="DIR", help="also save report_<section>.png of each section in DIR "
                   "(needs playwright and chromium)")
    args = p.parse_args(argv)
    if os.path.isdir(args.out) or args.out.endswith(("/", os.sep)):
        p.error(f"--out {args.out}: is a directory; give the HTML file to write, e.g. "
                f"--out {os.path.join(args.out, 'report.html')}")
    if args.screenshots and os.path.exists(args.screenshots) and not os.path.isdir(args.screenshots):
        p.error(f"--screenshots {args.screenshots}: is a file, not a directory")
    try:
        check_inputs(args.root)
    except (ValueError, FileNotFoundError) as e:  # a bad or missing table: the message alone, nothing written
        p.error(str(e))
    path = write(args.out, args.root)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB); open it in a browser (no server needed)")
    if args.screenshots:
        for s in screenshots(path, args.screenshots):
            print(f"wrote {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
