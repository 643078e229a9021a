"""Benchmark: decode attention over a KV cache (our fused split-K kernel vs SDPA / FlexAttention), cache memory
per variant, and decode tokens/s of exact vs GQA / MQA vs window vs linear attention.

Plain Python (no Hydra), runs on a bare GPU image (torch, triton, numpy, matplotlib)::

    python -m eval.bench_decode --quick --out results/decode_quick     # < 3 minutes
    python -m eval.bench_decode --out results/decode                   # full grid (< 10 minutes on an H200)
    python -m eval.bench_decode --memory-only --out /tmp/dec           # CPU: the cache-memory table and plot

Sections (all timings in one run, median of CUDA events with the L2 flushed between calls,
:func:`eval.bench_common.time_cuda`; bf16, ``D = 128``, one new token per sequence, ``Hq = 32``):

1. **kernel**: one decode step of one layer, contexts 1k .. 128k, batch 1 .. 64, MHA (``Hkv = 32``) and GQA 8:1
   (``Hkv = 4``), contiguous and paged (``--page-size`` tokens, pages in shuffled order) caches. Methods:
   ``ours`` (:func:`attn_zoo.decode_attention`, backend ``triton``: :func:`kernels.decode.decode_attn`),
   ``sdpa`` (``F.scaled_dot_product_attention`` with the contiguous cache as keys, ``enable_gqa``),
   ``sdpa_gather`` (paged: gather the pages, then SDPA) and ``flex`` (compiled FlexAttention, a few points,
   while its compile budget lasts). Each method is timed eagerly (``ms``: host launch overhead included, what a
   Python decode loop pays) and as one CUDA-graph replay (``ms_graph``: the GPU time, what a graph-captured
   decode loop pays). Achieved bandwidth = K/V bytes of the step / time, beside the device copy bandwidth
   measured in the same run (``copy_gbps``: read + write of a 2 x 1 GiB ``copy_``).
2. **memory** (pure Python, :mod:`attn_zoo.decode.memory`): per variant (MHA, GQA, MQA, window ``W``, linear
   state, hybrids with one GQA layer in four) of a ``--model-layers`` x ``--model-heads`` x ``--head-dim`` model:
   KV bytes per token, cache bytes at 1k / 32k / 128k, the longest context that fits in the GPU memory left
   after the weights (``--weights-gb``) for ``--mem-batch`` sequences, and the cache-memory-vs-context plot.
3. **variants**: decode step time of one layer at ``--variant-batch`` sequences vs context for exact MHA, GQA 8:1,
   MQA, a causal window of ``--window`` tokens (our kernel visits only the window's tiles) and linear attention
   (:func:`attn_zoo.decode.linear_decode`, the recurrent O(1) step in PyTorch: launch-bound), attention-only
   tokens/s of a ``--model-layers`` model (hybrids derived from the per-layer times), and the context from
   which each variant beats exact MHA / GQA (``crossover``: faster there and at every longer context). Step
   times are CUDA-graph replays (``ms_eager`` beside them).

Writes to ``--out`` (six files): ``decode_kernel.csv``, ``decode_variants.csv``, ``cache_memory.csv``,
``bench_decode.json`` (env, copy bandwidth, crossovers, summary), ``bench_decode.png`` (bandwidth, tokens/s),
``cache_memory.png``.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from attn_zoo.decode.memory import cache_bytes, memory_table, variant_presets
from attn_zoo.variants import get_variant
from eval.bench_common import (NONNEG, POSITIVE, POSITIVE_INT, check_out_dirs_or_exit, env_info, format_table,
                               time_cuda, time_cuda_graph, try_call, write_csv, write_json)

QUICK = dict(contexts=[1024, 8192, 32768, 131072], batches=[1, 16], variant_contexts=[1024, 4096, 16384, 65536, 131072],
             flex_points=2, flex_budget_s=60.0)
FULL = dict(contexts=[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072], batches=[1, 4, 16, 64],
            variant_contexts=[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072], flex_points=6, flex_budget_s=150.0)


# --------------------------------------------------------------------------------------------- pure python
def kv_bytes_per_step(batch: int, n_kv_heads: int, context: int, head_dim: int, elt_bytes: int = 2,
                      window: Optional[int] = None) -> int:
    """K and V bytes one decode step must read: ``2 * B * Hkv * min(N, W) * D * elt`` (the compulsory traffic)."""
    n = context if window is None else min(context, window)
    return 2 * batch * n_kv_heads * n * head_dim * elt_bytes


def linear_state_bytes_per_step(batch: int, n_kv_heads: int, feature_dim: int, head_dim: int) -> int:
    """fp32 state read + written by one recurrent step: ``2 * B * Hkv * (F * D + F) * 4``."""
    return 2 * batch * n_kv_heads * (feature_dim * head_dim + feature_dim) * 4


def crossover(rows: Sequence[dict], variant: str, baseline: str, metric: str = "ms",
              key: str = "context") -> Optional[int]:
    """Smallest ``key`` value from which ``variant`` is faster (lower ``metric``) than ``baseline`` at that value and
    at every larger one measured by both; ``None`` if it never is (or nothing to compare)."""
    a = {r[key]: r[metric] for r in rows if r.get("variant") == variant and _num(r.get(metric))}
    b = {r[key]: r[metric] for r in rows if r.get("variant") == baseline and _num(r.get(metric))}
    common = sorted(set(a) & set(b))
    if not common:
        return None
    win = None
    for c in reversed(common):
        if a[c] < b[c]:
            win = c
        else:
            break
    return win


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def memory_curve(presets: Dict[str, list], n_head: int, head_dim: int, contexts: Sequence[int], batch: int = 1,
                 dtype_bytes: int = 2) -> List[dict]:
    """Cache bytes per variant at each context (for the memory-vs-context plot)."""
    return [{"variant": name, "context": n, "batch": batch,
             "cache_bytes": cache_bytes(layers, n_head, head_dim, n, batch, dtype_bytes)}
            for name, layers in presets.items() for n in contexts]


def model_rows(layer_rows: Sequence[dict], presets: Dict[str, list], head_map: Dict[str, str]) -> List[dict]:
    """Attention-only time of a whole model per preset and context, from per-layer times: each layer of a preset
    costs the measured time of the variant ``head_map[layer label]`` (e.g. a GQA flash layer -> ``gqa8``)."""
    t = {(r["variant"], r["context"]): r["ms"] for r in layer_rows if _num(r.get("ms"))}
    contexts = sorted({r["context"] for r in layer_rows})
    batch = layer_rows[0]["batch"] if layer_rows else 1
    out = []
    for name, layers in presets.items():
        for c in contexts:
            try:
                ms = sum(t[(head_map[_layer_key(s)], c)] for s in layers)
            except KeyError:
                continue
            out.append({"variant": f"model_{name}", "context": c, "batch": batch, "ms": ms,
                        "tokens_per_s": batch / (ms * 1e-3), "derived": True})
    return out


def _layer_key(spec) -> str:
    """A layer's row in the timing table: a full KV cache is timed per K/V head count (``flash_kv0_g1`` = MHA), any
    other cache policy (window, state) by kind."""
    from attn_zoo.variants import get_variant

    if get_variant(spec.kind).cache_policy(spec).full_kv:
        return f"{spec.kind}_kv{spec.n_kv_heads or 0}_g{spec.kv_group_size or 1}"
    return spec.kind


# --------------------------------------------------------------------------------------------- GPU helpers
def copy_bandwidth(gib: float = 1.0) -> float:
    """Device copy bandwidth in GB/s (read + write bytes of ``dst.copy_(src)`` / time)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))
    del src, dst
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def make_cache(B: int, Hkv: int, N: int, D: int, dtype, paged: bool, page_size: int, gen: torch.Generator):
    """``(k, v, block_table, seqlens)``: every sequence holds ``N`` tokens; paged pages in shuffled order."""
    seqlens = torch.full((B,), N, dtype=torch.int32, device="cuda")
    if not paged:
        k = torch.empty(B, Hkv, N, D, device="cuda", dtype=dtype).normal_(generator=gen)
        v = torch.empty_like(k).normal_(generator=gen)
        return k, v, None, seqlens
    per = -(-N // page_size)
    P = B * per
    k = torch.empty(P, Hkv, page_size, D, device="cuda", dtype=dtype).normal_(generator=gen)
    v = torch.empty_like(k).normal_(generator=gen)
    bt = torch.randperm(P, device="cuda", generator=gen).view(B, per).to(torch.int32)
    return k, v, bt, seqlens


def _free_bytes() -> int:
    free, _ = torch.cuda.mem_get_info()
    return int(free)


def _try(fn):  # a failing method is recorded, the run goes on
    return try_call(fn, max_chars=160, short_oom=True)


# --------------------------------------------------------------------------------------------- section 1
def bench_kernel(args, cfg, copy_gbps: float) -> List[dict]:
    from attn_zoo import AttentionSpec, decode_attention
    from attn_zoo.decode import gather_kv

    spec = AttentionSpec(kind="flash")
    dtype = torch.bfloat16
    D, Hq = args.head_dim, args.heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: List[dict] = []
    flex_left = cfg["flex_points"]
    flex_spent = 0.0
    flex_fn = None
    for layout in ("contiguous", "paged"):
        for hname, Hkv in (("mha", Hq), (f"gqa{Hq // args.gqa_group}", Hq // args.gqa_group)):
            for B in cfg["batches"]:
                for N in cfg["contexts"]:
                    kvb = kv_bytes_per_step(B, Hkv, N, D, 2)
                    base = dict(layout=layout, heads=hname, Hq=Hq, Hkv=Hkv, batch=B, context=N, D=D,
                                dtype="bf16", kv_bytes=kvb)
                    if kvb * 1.2 > 0.8 * _free_bytes():
                        rows.append(dict(base, method="ours", ms=None, note="skipped: cache does not fit"))
                        continue
                    k, v, bt, sl = make_cache(B, Hkv, N, D, dtype, layout == "paged", args.page_size, gen)
                    q = torch.empty(B, Hq, 1, D, device="cuda", dtype=dtype).normal_(generator=gen)

                    def ours():
                        return decode_attention(q, k, v, spec, sl, bt, backend="triton", check_values=False)

                    methods = {"ours": ours}
                    if layout == "contiguous":
                        methods["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hkv != Hq)
                    elif kvb * 3.2 < 0.8 * _free_bytes():  # the gathered copy, eager and in the graph pool
                        def sdpa_gather():
                            kk, vv = gather_kv(k, v, bt, N)
                            return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=Hkv != Hq)
                        methods["sdpa_gather"] = sdpa_gather
                    if layout == "contiguous" and flex_left > 0 and flex_spent < cfg["flex_budget_s"] and \
                            N in (cfg["contexts"][1], cfg["contexts"][-1]) and not args.no_flex:
                        if flex_fn is None:
                            flex_fn = _try(lambda: __import__("attn_zoo.flex", fromlist=["x"]).compiled_flex_attention("cuda"))
                        from attn_zoo.flex import flex_decoding_unsupported

                        why_not_flex = flex_decoding_unsupported()  # one query: Flex's decoding kernel
                        if why_not_flex is not None:  # e.g. torch 2.11 on triton 3.9: the row names the pair
                            methods["flex"] = lambda: (_ for _ in ()).throw(RuntimeError(why_not_flex))
                        elif callable(flex_fn):
                            methods["flex"] = lambda: flex_fn(q, k, v, enable_gqa=Hkv != Hq)
                    ref = None
                    for name, fn in methods.items():
                        t0 = time.time()
                        out = _try(fn)
                        if isinstance(out, str):
                            rows.append(dict(base, method=name, ms=None, note=out))
                            continue
                        if ref is None:
                            ref = out.float()
                            err = 0.0
                        else:
                            err = float((out.float() - ref).abs().max())
                        ms = _try(lambda: time_cuda(fn))
                        msg = _try(lambda: time_cuda_graph(fn)) if name != "flex" or args.flex_graph else "off"
                        if name == "flex":
                            flex_left -= 1
                            flex_spent += time.time() - t0
                        if isinstance(ms, str):
                            rows.append(dict(base, method=name, ms=None, note=ms))
                            continue
                        row = dict(base, method=name, ms=ms, gbps=kvb / (ms * 1e-3) / 1e9, max_diff_vs_ours=err,
                                   note="" if not isinstance(msg, str) else f"graph: {msg}")
                        row["frac_copy_bw"] = row["gbps"] / copy_gbps
                        if not isinstance(msg, str):
                            row.update(ms_graph=msg, gbps_graph=kvb / (msg * 1e-3) / 1e9)
                            row["frac_copy_bw_graph"] = row["gbps_graph"] / copy_gbps
                        rows.append(row)
                        print(f"  {layout:10s} {hname:5s} B={B:3d} N={N:6d} {name:12s} eager {ms * 1e3:8.1f} us "
                              f"{row['gbps']:6.0f} GB/s | graph {row.get('ms_graph', math.nan) * 1e3:8.1f} us "
                              f"{row.get('gbps_graph', math.nan):6.0f} GB/s "
                              f"({row.get('frac_copy_bw_graph', math.nan):4.0%} of copy)", flush=True)
                    del k, v, bt, q, ref
                    torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------- section 3
def bench_variants(args, cfg) -> List[dict]:
    from attn_zoo import AttentionSpec, decode_attention
    from attn_zoo.decode import LinearState, linear_decode
    from attn_zoo.feature_maps import feature_dim

    dtype = torch.bfloat16
    D, Hq, B = args.head_dim, args.heads, args.variant_batch
    gen = torch.Generator(device="cuda").manual_seed(1)
    W = args.window
    g8 = Hq // args.gqa_group
    variants = [("mha", Hq, AttentionSpec(kind="flash")), (f"gqa{g8}", g8, AttentionSpec(kind="flash")),
                ("mqa", 1, AttentionSpec(kind="flash")),
                (f"window{W}", Hq, AttentionSpec(kind="sliding_window", window_size=(W - 1, 0)))]
    rows: List[dict] = []
    for N in cfg["variant_contexts"]:
        for name, Hkv, spec in variants:
            win = get_variant(spec.kind).cache_policy(spec).window  # None: every token is read
            base = dict(variant=name, Hq=Hq, Hkv=Hkv, batch=B, context=N, D=D,
                        bytes_per_step=kv_bytes_per_step(B, Hkv, N, D, 2, win))
            if kv_bytes_per_step(B, Hkv, N, D, 2) * 1.2 > 0.8 * _free_bytes():
                rows.append(dict(base, ms=None, note="skipped: cache does not fit"))
                continue
            k, v, bt, sl = make_cache(B, Hkv, N, D, dtype, False, 0, gen)
            q = torch.empty(B, Hq, 1, D, device="cuda", dtype=dtype).normal_(generator=gen)
            fn = lambda: decode_attention(q, k, v, spec, sl, backend="triton", check_values=False)  # noqa: E731
            rows.append(_variant_row(base, _try(lambda: time_cuda(fn)), _try(lambda: time_cuda_graph(fn))))
            del k, v, q
            torch.cuda.empty_cache()
        # linear: O(1) state, same cost at every context (measured at each to show it)
        lin = AttentionSpec(kind="linear", feature_map=args.feature_map)
        fdim = feature_dim(lin.feature_map, D, lin.num_features)
        st = LinearState.for_spec(lin, B, Hq, D, "cuda")
        q = torch.empty(B, Hq, 1, D, device="cuda", dtype=dtype).normal_(generator=gen)
        kk = torch.empty(B, Hq, 1, D, device="cuda", dtype=dtype).normal_(generator=gen)
        fn = lambda: linear_decode(q, kk, kk, st, lin)  # noqa: E731
        rows.append(_variant_row(dict(variant="linear", Hq=Hq, Hkv=Hq, batch=B, context=N, D=D,
                                      bytes_per_step=linear_state_bytes_per_step(B, Hq, fdim, D)),
                                 _try(lambda: time_cuda(fn)), _try(lambda: time_cuda_graph(fn))))
    for r in rows:
        print(f"  {r['variant']:12s} N={r['context']:6d} step {(r['ms'] or math.nan) * 1e3:9.1f} us "
              f"(eager {(r.get('ms_eager') or math.nan) * 1e3:9.1f} us) {r.get('tokens_per_s', math.nan):10.0f} tok/s",
              flush=True)
    return rows


def _variant_row(base: dict, ms_eager, ms_graph) -> dict:
    """``ms`` is the CUDA-graph time when capture worked (the GPU cost of the step), else the eager time."""
    ms = ms_graph if _num(ms_graph) else ms_eager
    row = dict(base, ms_eager=ms_eager if _num(ms_eager) else None, ms_graph=ms_graph if _num(ms_graph) else None)
    if not _num(ms):
        return dict(row, ms=None, note=f"{ms_eager} / {ms_graph}")
    return dict(row, ms=ms, tokens_per_s=base["batch"] / (ms * 1e-3), gbps=base["bytes_per_step"] / (ms * 1e-3) / 1e9,
                note="" if _num(ms_graph) else f"eager (graph: {ms_graph})")


# --------------------------------------------------------------------------------------------- plots
def _png(panels: list, title: str, path: str, **kw) -> Optional[str]:
    """``panels`` (:class:`eval.figspec.Panel`) drawn into ``path`` (a PNG only), or None without matplotlib."""
    try:
        from eval import figspec
    except ImportError:
        return None
    return figspec.to_png(figspec.Figure(title, panels, **kw), path[:-len(".png")], formats=["png"])[0]


def plot_memory(curve: List[dict], path: str, title: str) -> Optional[str]:
    """KV cache / state bytes vs context, one line per variant (log-log)."""
    from eval.figspec import Panel, Trace

    p = Panel("", "context (tokens)", "KV cache / state (GiB)", xlog=2, ylog=True, legend=True)
    for i, name in enumerate(dict.fromkeys(r["variant"] for r in curve)):
        pts = [(r["context"], r["cache_bytes"] / 2**30) for r in curve if r["variant"] == name]
        p.traces.append(Trace(name, *map(list, zip(*pts)), {"color": f"C{i % 10}", "marker": "o", "ms": 3}))
    return _png([p], title, path, ncols=1, panel_w=6.5, panel_h=4.5)


def plot_bench(kernel_rows: List[dict], variant_rows: List[dict], copy_gbps: float, path: str) -> Optional[str]:
    """Decode bandwidth vs context per head layout (ours / SDPA / flex, contiguous / paged, smallest and largest
    batch; the device copy dashed) and decode tokens/s per variant (one layer; a model dashed)."""
    from eval.figspec import Panel, Trace

    ok = [dict(r, gbps=r["gbps_graph"] if _num(r.get("gbps_graph")) else r["gbps"]) for r in kernel_rows
          if _num(r.get("gbps"))]
    panels = []
    for heads in dict.fromkeys(r["heads"] for r in ok):
        p = Panel(f"decode bandwidth (CUDA-graph step time), {heads}", "context (tokens)",
                  "K/V bytes / step time (GB/s)", xlog=2, legend=True, hlines=[(copy_gbps, {"color": "k", "lw": 0.8})])
        batches = sorted({r["batch"] for r in ok if r["heads"] == heads})
        for b in sorted({min(r["batch"] for r in ok), batches[-1]} & set(batches)):
            for layout, method, ls, mk in (("contiguous", "ours", "-", "o"), ("paged", "ours", "--", "o"),
                                           ("contiguous", "sdpa", "-", "s"), ("paged", "sdpa_gather", ":", "s"),
                                           ("contiguous", "flex", "-", "^")):
                pts = sorted((r["context"], r["gbps"]) for r in ok if r["heads"] == heads and r["batch"] == b
                             and r["layout"] == layout and r["method"] == method)
                if pts:
                    p.traces.append(Trace(f"{method} {layout[:6]} B={b}", *map(list, zip(*pts)),
                                          {"color": f"C{len(p.traces) % 10}", "ls": ls, "marker": mk, "ms": 3}))
        panels.append(p)
    p = Panel("decode tokens/s: one layer, and a model (dashed)", "context (tokens)", "tokens/s (attention only)",
              xlog=2, ylog=True, legend=True)
    for name in dict.fromkeys(r["variant"] for r in variant_rows):
        pts = sorted((r["context"], r["tokens_per_s"]) for r in variant_rows
                     if r["variant"] == name and _num(r.get("tokens_per_s")))
        if pts:
            p.traces.append(Trace(name, *map(list, zip(*pts)), {"color": f"C{len(p.traces) % 10}", "ms": 3, **(
                {"ls": "--", "marker": None} if name.startswith("model_") else {"marker": "o"})}))
    return _png(panels[:2] + [p], f"decode kernels and variants; device copy {copy_gbps:.0f} GB/s (dashed black)",
                path, ncols=3, panel_w=5.6, panel_h=4.4)


# --------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    """The command line, every value checked here, before any file or GPU work (:func:`check_args`)."""
    from attn_zoo.spec import FEATURE_MAPS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/decode")
    p.add_argument("--quick", action="store_true", help="a small grid (< 3 minutes)")
    p.add_argument("--memory-only", action="store_true", help="only the cache-memory table and plot (no GPU needed)")
    p.add_argument("--no-flex", action="store_true", help="skip the FlexAttention anchor")
    p.add_argument("--flex-graph", action="store_true",
                   help="also time FlexAttention as a CUDA graph (off by default: a failed capture can poison the stream)")
    p.add_argument("--heads", type=POSITIVE_INT, default=32, help="query heads of the timed layer (a multiple of "
                                                                 "--gqa-group)")
    p.add_argument("--head-dim", type=POSITIVE_INT, default=128,
                   help="head dim D (at most the decode kernel's kernels.decode.MAX_HEAD_DIM_QK unless --memory-only)")
    p.add_argument("--gqa-group", type=POSITIVE_INT, default=8,
                   help="query heads per K/V head of the GQA rows (divides --heads and --model-heads)")
    p.add_argument("--page-size", type=POSITIVE_INT, default=64, help="tokens per page of the paged cache")
    p.add_argument("--window", type=POSITIVE_INT, default=4096, help="tokens of the causal window variant")
    p.add_argument("--feature-map", default="elu1", choices=FEATURE_MAPS, help="feature map of the linear variant")
    p.add_argument("--variant-batch", type=POSITIVE_INT, default=8)
    p.add_argument("--model-layers", type=POSITIVE_INT, default=32)
    p.add_argument("--model-heads", type=POSITIVE_INT, default=32)
    p.add_argument("--weights-gb", type=NONNEG, default=14.0, help="model weights kept beside the cache (7B in bf16)")
    p.add_argument("--memory-gb", type=POSITIVE, default=None,
                   help="device memory (default: the GPU's, else 141); more than --weights-gb")
    p.add_argument("--mem-batch", type=POSITIVE_INT, default=1)
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        p.error(str(e))
    check_out_dirs_or_exit(p, ("--out", args.out))
    return args


def check_args(args) -> None:
    """What argparse's types cannot check alone (each size is an integer >= 1 there): ``--gqa-group`` divides
    ``--model-heads`` and, for the GPU sections, ``--heads``; ``--head-dim`` at most the decode kernel's
    ``kernels.decode.MAX_HEAD_DIM_QK`` when the GPU sections run; ``--memory-gb`` above ``--weights-gb`` (else the
    memory left for the cache was <= 0 and every "longest context that fits" came out 0 or negative). Raises
    ``ValueError`` naming the flags. (A 0 / negative size, an unknown feature map: a traceback from deep in the
    memory model or the kernel section, after ``--out`` was made; ``--heads 0``, ``--page-size 0``, ``--weights-gb
    -1``: accepted, exit 0.)"""
    timed = [] if args.memory_only else [("--heads", args.heads)]  # the timed layer's heads (GPU sections only)
    for flag, heads in timed + [("--model-heads", args.model_heads)]:
        if heads % args.gqa_group:
            raise ValueError(f"--gqa-group {args.gqa_group} does not divide {flag} {heads}; allowed values: a "
                             f"divisor of {flag} ({', '.join(str(g) for g in range(1, heads + 1) if heads % g == 0)})")
    if not args.memory_only:
        from kernels.decode import MAX_HEAD_DIM_QK

        if args.head_dim > MAX_HEAD_DIM_QK:
            raise ValueError(f"--head-dim {args.head_dim} is not supported by the decode kernel; allowed values: 1 to "
                             f"{MAX_HEAD_DIM_QK} (any >= 1 with --memory-only)")
    if args.memory_gb is not None and args.memory_gb <= args.weights_gb:
        raise ValueError(f"--memory-gb {args.memory_gb:g} leaves no memory for the cache beside --weights-gb "
                         f"{args.weights_gb:g}; allowed values: --memory-gb > --weights-gb")


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    t_start = time.time()
    cuda = torch.cuda.is_available()
    if args.memory_gb is not None:
        mem = args.memory_gb * 1e9
    elif cuda:
        mem = torch.cuda.get_device_properties(0).total_memory
    else:
        mem = 141e9
    budget = mem - args.weights_gb * 1e9
    if budget <= 0:  # the GPU's memory (--memory-gb checked in parse_args): no room for any cache
        raise SystemExit(f"--weights-gb {args.weights_gb:g} fills the device's {mem / 1e9:.0f} GB; allowed values: "
                         f"less than the device memory (or give --memory-gb)")
    os.makedirs(args.out, exist_ok=True)
    env = env_info()
    L, H, D = args.model_layers, args.model_heads, args.head_dim
    preset_kw = dict(window=args.window, gqa_groups=(args.gqa_group,), feature_map=args.feature_map)
    # + an MLA row at DeepSeek-V2's ratios (kv_lora_rank = 4 D, qk_rope_dim = D / 2; attn_zoo/mla.py)
    mem_rows = memory_table(L, H, D, budget, batch=args.mem_batch, mla_dims=(4 * D, max(D // 2, 1)), **preset_kw)
    presets = variant_presets(L, H, **preset_kw)
    curve = memory_curve(presets, H, D, [2**i for i in range(10, 21)], batch=args.mem_batch)
    write_csv(mem_rows + curve, os.path.join(args.out, "cache_memory.csv"))
    plot_memory(curve, os.path.join(args.out, "cache_memory.png"),
                f"cache memory, {L} layers x {H} heads x D={D}, bf16 cache / fp32 state, batch {args.mem_batch}")
    print(format_table(mem_rows, ["variant", "bytes_per_token", "bytes_at_32768", "max_context"], "{:.0f}"))
    summary = {"memory_budget_bytes": budget, "memory": mem_rows}
    kernel_rows: List[dict] = []
    var_rows: List[dict] = []
    if not args.memory_only and cuda:
        copy_gbps = copy_bandwidth()
        print(f"device copy bandwidth: {copy_gbps:.0f} GB/s", flush=True)
        summary["copy_gbps"] = copy_gbps
        print("[1] decode kernel", flush=True)
        kernel_rows = bench_kernel(args, cfg, copy_gbps)
        write_csv(kernel_rows, os.path.join(args.out, "decode_kernel.csv"))
        print("[3] variants", flush=True)
        var_rows = bench_variants(args, cfg)
        g8 = f"gqa{H // args.gqa_group}"
        head_map = {"flash_kv0_g1": "mha", f"flash_kv0_g{args.gqa_group}": g8, "flash_kv1_g1": "mqa",
                    "sliding_window": f"window{args.window}", "linear": "linear"}
        var_rows = var_rows + model_rows(var_rows, presets, head_map)
        write_csv(var_rows, os.path.join(args.out, "decode_variants.csv"))
        names = list(dict.fromkeys(r["variant"] for r in var_rows))
        summary["crossover_vs_mha"] = {n: crossover(var_rows, n, "mha") for n in names if not n.startswith("model_")}
        summary["crossover_vs_" + g8] = {n: crossover(var_rows, n, g8) for n in names if not n.startswith("model_")}
        summary["crossover_model_vs_mha"] = {n: crossover(var_rows, n, "model_mha") for n in names if n.startswith("model_")}
        ours = [r for r in kernel_rows if r["method"] == "ours" and _num(r.get("gbps"))]
        for key in ("gbps", "gbps_graph"):
            have = [r for r in ours if _num(r.get(key))]
            if have:
                best = max(have, key=lambda r: r[key])
                summary[f"ours_best_{key}"] = {k: best.get(k) for k in ("layout", "heads", "batch", "context", key)}
                summary[f"ours_best_{key}"]["frac_copy_bw"] = best[key] / copy_gbps
        for ms_key in ("ms", "ms_graph"):
            vs = {}
            for r in kernel_rows:
                if r["method"] in ("sdpa", "sdpa_gather", "flex") and _num(r.get(ms_key)):
                    o = next((x for x in ours if all(x[k] == r[k] for k in ("layout", "heads", "batch", "context"))), None)
                    if o is not None and _num(o.get(ms_key)):
                        vs.setdefault(r["method"], []).append(r[ms_key] / o[ms_key])
            summary[f"speedup_vs_anchor_geomean_{ms_key}"] = {m: math.exp(sum(map(math.log, x)) / len(x))
                                                              for m, x in vs.items()}
        plot_bench(kernel_rows, var_rows, copy_gbps, os.path.join(args.out, "bench_decode.png"))
        print(format_table([r for r in var_rows if r["variant"].startswith("model_")],
                           ["variant", "context", "ms", "tokens_per_s"]))
        print("crossovers:", summary.get("crossover_vs_mha"), summary.get("crossover_vs_" + g8))
    elif not cuda and not args.memory_only:
        print("no CUDA device: wrote only the cache-memory table and plot (sections 1 and 3 need a GPU)")
    summary["wall_s"] = time.time() - t_start
    summary["args"] = vars(args)
    write_json([summary], os.path.join(args.out, "bench_decode.json"), env)
    print(f"done in {summary['wall_s']:.0f} s -> {args.out}")
    return summary


if __name__ == "__main__":
    main()
