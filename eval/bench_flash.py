"""Benchmark of the fused Triton exact-attention kernel against the anchors a user would pick instead.

In ONE process and run: ours (``kernels.flash_attn``), PyTorch SDPA with the flash backend (FlashAttention-2),
SDPA with the cuDNN backend, and compiled FlexAttention (``torch.compile(flex_attention)`` with dynamo's
recompile limit raised, else it falls back to eager and materialises N x N). Variants: non-causal, causal,
causal sliding window w = 1024 / 4096, causal BigBird block-sparse, GQA Hkv = Hq/4 and MQA Hkv = 1 (causal).
bf16, 16k tokens per batch (B = 16384 // N), hidden 2048 (H = 2048 // D). FLOPs by the FlashAttention formula
(4 B H N^2 D times the visited fraction; causal 1/2; backward 2.5x). SDPA cannot skip window / sparse tiles:
for those variants its anchor runs dense causal attention (what SDPA's fast paths can run), marked in the row.

Usage (GPU, from the repo root): ``python -m eval.bench_flash --out results/h200 [--quick] [--variants
causal,win1024] [--N 4096] [--D 128] [--impls ours,sdpa_flash,sdpa_cudnn,flex] [--flex-max-cases 12] [--check]
[--tune]``. Our kernel runs with ``kernels.FlashConfig()`` (``--tune``: ``FlashConfig(autotune=True)``).
"""

from __future__ import annotations

import argparse
import os
import time
import traceback

import torch
import torch.nn.functional as F

from attn_zoo import AttentionSpec, mask_info
from eval.bench_common import env_info, flash_flops, format_table, peak_memory, tflops, time_cuda
from eval.bench_common import write_csv, write_json

VARIANTS = {
    "noncausal": dict(kind="flash", causal=False),
    "causal": dict(kind="flash", causal=True),
    "win1024": dict(kind="sliding_window", causal=True, window_size=(1023, 0)),
    "win4096": dict(kind="sliding_window", causal=True, window_size=(4095, 0)),
    "bigbird": dict(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=128, num_local_blocks=2,
                    num_global_blocks=1, num_random_blocks=2),
    "gqa4": dict(kind="flash", causal=True),
    "mqa": dict(kind="flash", causal=True),
}
IMPLS = ("ours", "sdpa_flash", "sdpa_cudnn", "flex")


def visited_fraction(name: str, N: int) -> float:
    """Fraction of (query, key) pairs the mask keeps (causal counted as 1/2, the FlashAttention convention)."""
    v = VARIANTS[name]
    if v["kind"] == "flash":
        return 0.5 if v["causal"] else 1.0
    if v["kind"] == "sliding_window":
        W = v["window_size"][0] + 1
        W = min(W, N)
        allowed = W * (W + 1) / 2 + (N - W) * W
        return allowed / (N * N)
    mi = mask_info(AttentionSpec(**v), N, N)
    bs, lay = mi.block_size, mi.layout
    nb = lay.shape[0]
    off = int(lay.sum()) - int(lay.diagonal().sum())
    allowed = off * bs * bs + nb * bs * (bs + 1) / 2  # N is a multiple of bs here
    return allowed / (N * N)


def heads(name: str, D: int):
    H = 2048 // D
    if name == "gqa4":
        return H, H // 4
    if name == "mqa":
        return H, 1
    return H, H


def flex_fn():
    """The process-wide compiled FlexAttention (recompile limits raised; backward re-runnable for timing)."""
    from attn_zoo.flex import allow_retain_graph, compiled_flex_attention

    allow_retain_graph()
    return compiled_flex_attention("cuda")


def flex_block_mask(name: str, N: int, device):
    """FlexAttention ``BlockMask`` of a variant (:func:`attn_zoo.flex.flex_block_mask`); ``None`` for full attention."""
    from attn_zoo.flex import flex_block_mask as _bm

    return _bm(AttentionSpec(**VARIANTS[name]), N, N, str(device))


def make_impl(impl: str, name: str, N: int, D: int, spec: AttentionSpec, config=None):
    """A callable ``f(q, k, v) -> out`` for one implementation, or raise if it cannot run the case. ``config``: the
    :class:`kernels.FlashConfig` of ours (default ``FlashConfig()``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    v = VARIANTS[name]
    if impl == "ours":
        from attn_zoo.backends.triton_flash import sparse_tables
        from kernels import FlashConfig, flash_attn

        config = config if config is not None else FlashConfig()
        mi = mask_info(spec, N, N)
        window = (mi.window_left, mi.window_right) if (mi.window_left is not None or mi.window_right is not None) \
            else None
        kw = {}
        if mi.layout is not None:  # the adapter's cached device layout and tables (no host copy per call)
            layout, tables = sparse_tables(spec, N, N, D, torch.device("cuda"), config)
            kw = dict(block_layout=layout, block_size=mi.block_size, block_tables=tables)
        return lambda q, k, vv: flash_attn(q, k, vv, causal=mi.causal, window_size=window, config=config, **kw)
    if impl in ("sdpa_flash", "sdpa_cudnn"):
        backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
        causal = v["causal"]

        def f(q, k, vv):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, vv, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return f
    if impl == "flex":
        bm = flex_block_mask(name, N, "cuda")
        fl = flex_fn()
        return lambda q, k, vv: fl(q, k, vv, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])
    raise ValueError(f"impl={impl!r}; allowed values: {', '.join(IMPLS)}")


def bench_case(name, N, D, impls, tokens, check, rows, flex_budget, config=None):
    B = max(tokens // N, 1)
    Hq, Hkv = heads(name, D)
    spec = AttentionSpec(**VARIANTS[name])
    frac = visited_fraction(name, N)
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    vv = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    do = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    res = {}
    for impl in impls:
        row = dict(variant=name, N=N, D=D, B=B, Hq=Hq, Hkv=Hkv, impl=impl, visited_fraction=round(frac, 5))
        if impl.startswith("sdpa") and VARIANTS[name]["kind"] != "flash":
            row["note"] = "dense causal (SDPA cannot skip masked tiles)"
        if impl == "flex":
            if flex_budget[0] <= 0:
                row["error"] = "skipped (flex compile budget)"
                rows.append(row)
                continue
            flex_budget[0] -= 1
        t0 = time.time()
        try:
            f = make_impl(impl, name, N, D, spec, config)
            out = f(q, k, vv)
            out.backward(do)
            torch.cuda.synchronize()
            row["compile_s"] = round(time.time() - t0, 1)
            if check and impl == "ours":
                row["max_err_vs_sdpa"] = _check_err(f, q, k, vv, name)
            ms_f = time_cuda(lambda: f(q, k, vv))
            out = f(q, k, vv)
            ms_b = time_cuda(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, vv])
            del out  # the fwd+bwd timing runs without the retained graph
            ms_fb = time_cuda(lambda: f(q, k, vv).backward(do), grad_to_none=[q, k, vv])
            q.grad = k.grad = vv.grad = None
            mem = peak_memory(lambda: f(q, k, vv).backward(do))
            q.grad = k.grad = vv.grad = None
            for mode, ms in (("fwd", ms_f), ("bwd", ms_b), ("fwd_bwd", ms_fb)):
                fl = flash_flops(B, Hq, N, D, visited_fraction=frac, mode=mode)
                row[f"{mode}_ms"] = round(ms, 4)
                row[f"{mode}_tflops"] = round(tflops(fl, ms), 1)
            row["peak_mem_mib"] = round(mem / 2**20, 1)
            res[impl] = row
        except Exception as e:  # an anchor that cannot run this case is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if os.environ.get("BENCH_TRACE"):
                traceback.print_exc()
        rows.append(row)
        torch.cuda.empty_cache()
    ours = res.get("ours")
    if ours:
        for impl, r in res.items():
            if impl == "ours":
                continue
            for mode in ("fwd", "bwd", "fwd_bwd"):
                ours[f"x_{impl}_{mode}"] = round(r[f"{mode}_ms"] / ours[f"{mode}_ms"], 3)
    return res


def _check_err(f, q, k, vv, name):
    """Max |ours - SDPA(math, fp32 upcast)| on a short slice of the batch (plain sanity check in the bench)."""
    if VARIANTS[name]["kind"] != "flash":
        return None
    with torch.no_grad():
        o = f(q[:1], k[:1], vv[:1]).float()
        r = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), vv[:1].float(),
                                           is_causal=VARIANTS[name]["causal"], enable_gqa=q.shape[1] != k.shape[1])
    return round((o - r).abs().max().item(), 5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/h200")
    ap.add_argument("--tag", default="bench_flash")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--N", default="512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--quick", action="store_true", help="D=128, N in {4096, 16384}, causal/noncausal/win1024/bigbird")
    ap.add_argument("--flex-max-cases", type=int, default=1000, help="compile FlexAttention for at most this many cases")
    ap.add_argument("--flex-min-n", type=int, default=0, help="run Flex only for N >= this")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--tune", action="store_true", help="ours with FlashConfig(autotune=True); print the winning configs")
    ap.add_argument("--date", default=None)
    ap.add_argument("--time-budget-s", type=float, default=1e9, help="stop starting new cases after this many seconds")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_flash needs a CUDA device")
    from kernels import FlashConfig

    config = FlashConfig(autotune=a.tune)
    variants = a.variants.split(",")
    Ns = [int(x) for x in a.N.split(",")]
    Ds = [int(x) for x in a.D.split(",")]
    if a.quick:
        variants, Ns, Ds = ["noncausal", "causal", "win1024", "bigbird"], [4096, 16384], [128]
    impls = a.impls.split(",")
    env = env_info(a.date)
    print({k: env[k] for k in ("date", "gpu", "torch", "triton", "cuda")}, flush=True)
    rows, t_start = [], time.time()
    flex_budget = [a.flex_max_cases]
    for D in Ds:
        for name in variants:
            for N in Ns:
                if time.time() - t_start > a.time_budget_s:
                    print(f"time budget reached, skipping {name} N={N} D={D}", flush=True)
                    continue
                case_impls = [i for i in impls if not (i == "flex" and N < a.flex_min_n)]
                t0 = time.time()
                res = bench_case(name, N, D, case_impls, a.tokens, a.check, rows, flex_budget, config)
                o = res.get("ours", {})
                print(f"{name:9s} N={N:6d} D={D:3d} ours fwd+bwd {o.get('fwd_bwd_tflops', float('nan')):7.1f} TF/s "
                      + " ".join(f"{i}={r.get('fwd_bwd_tflops', float('nan')):.1f}" for i, r in res.items() if i != "ours")
                      + f"  ({time.time() - t0:.0f}s)", flush=True)
                os.makedirs(a.out, exist_ok=True)  # rewritten after every case: a killed run keeps what it measured
                write_csv(rows, os.path.join(a.out, f"{a.tag}.csv"))
                write_json(rows, os.path.join(a.out, f"{a.tag}.json"), env=env)
    ours = [r for r in rows if r["impl"] == "ours" and "fwd_ms" in r]
    cols = ["variant", "N", "D", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "peak_mem_mib"]
    cols += [c for c in ("x_sdpa_flash_fwd_bwd", "x_sdpa_cudnn_fwd_bwd", "x_flex_fwd_bwd", "x_sdpa_flash_fwd",
                         "x_flex_fwd") if any(c in r for r in ours)]
    print(format_table(ours, cols))
    if a.tune:
        from kernels.flash import autotune_results

        for key, cache in autotune_results().items():
            for k, cfg in cache.items():
                print("tuned", key, k, cfg)
    errs = [r for r in rows if "error" in r]
    if errs:
        print("not run / failed:")
        for r in errs:
            print(f"  {r['impl']} {r['variant']} N={r['N']} D={r['D']}: {r['error']}")


if __name__ == "__main__":
    main()
