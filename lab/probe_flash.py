"""GPU probe of the fused Triton attention kernel's backward options (kernels/flash/), with anchors.

One process, one run (target < 4 minutes including compiles). bf16, D = 128, H = 16, 16k tokens per batch
(B = 16384 // N), N in {4096, 16384}. Variants (masks from the repo's specs, as in eval/bench_flash.py):
non-causal, causal, causal window (1023, 0), causal BigBird (block 128, 2 local + 1 global + 2 random) and
MQA (Hkv = 1, causal). For each: forward, backward and forward + backward time (median of
``triton.testing.do_bench``) of ours with ``dq_mode`` = separate / atomic (MQA also with the dK/dV group split
forced off, ``dkdv_split=1``), and in the same process SDPA-flash (FA2) and SDPA-cuDNN on the dense causal /
non-causal problem (SDPA cannot skip window / sparse tiles), plus compiled FlexAttention for BigBird and window
at N = 4096 (last, within ``--time-budget-s``). TF/s by the FlashAttention formula (``4 B H N^2 D`` times the
kept fraction; backward 2.5x); ``x_<anchor>`` = anchor_ms / ours_ms (> 1: ours faster; ``x_ours_sep`` on the
atomic / split-1 rows: > 1 means that option beats the default). Max |error| vs an fp32
SDPA reference (out, dq, dk, dv; both dQ modes) for one case per variant at the smallest N.

``--autotune`` also sweeps dK/dV configs (BLOCK_M x BLOCK_N in {64x128, 128x128, 32x128, 64x64}, 4 / 8 warps,
2 / 3 / 4 stages; separate dQ, then the 6 best with atomic dQ) and dQ configs at causal N = 16384 and prints the
best (timing the whole backward: the other kernel is fixed). ``--skip-main`` runs only that sweep (give it
``--time-budget-s 400``; after the main part it gets what is left of the budget, at least 30 s).

Usage (GPU, from the repo root): ``python -m lab.probe_flash --out $OUT [--autotune] [--skip-main] [--no-flex]``
Writes ``probe_flash.csv`` / ``probe_flash.json`` (rows + environment) and ``probe_flash_autotune.csv``;
``--fwd-sweep`` / ``--sparse-sweep`` time forced forward configs (causal, window) and BigBird tile configs;
``--tma-sweep N`` per-kernel configs with TMA-streamed operands vs pointer loads (non-causal, causal).
"""

from __future__ import annotations

import argparse
import os
import time
import traceback

import torch
import torch.nn.functional as F

from attn_zoo import AttentionSpec, mask_info
from eval.bench_common import env_info, flash_flops, format_table, int_list, tflops, time_cuda, write_csv, write_json
from eval.bench_flash import VARIANTS, flex_block_mask, flex_fn, visited_fraction
from kernels import FlashConfig

D, H, TOKENS = 128, 16, 16384
PROBE_VARIANTS = ("noncausal", "causal", "win1024", "bigbird", "mqa")
FLEX_CASES = {("bigbird", 4096), ("win1024", 4096)}
AUTOTUNE_N = 16384
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def ours_fn(name, N, dq_mode, dkdv_split=None, config=None):
    """Our kernel on variant ``name`` with ``config`` (default ``FlashConfig()``) and the call arguments
    ``dq_mode`` / ``dkdv_split`` (``None``: the config's)."""
    from attn_zoo.backends.triton_flash import sparse_tables
    from kernels import flash_attn

    config = config if config is not None else FlashConfig()
    spec = AttentionSpec(**VARIANTS[name])
    mi = mask_info(spec, N, N)
    window = None
    if mi.window_left is not None or mi.window_right is not None:
        window = (mi.window_left, mi.window_right)
    kw = {}
    if mi.layout is not None:  # cached device layout and tables at the config's sparse tiles (no host copy per call)
        layout, tables = sparse_tables(spec, N, N, D, torch.device("cuda"), config)
        kw = dict(block_layout=layout, block_size=mi.block_size, block_tables=tables)
    return lambda q, k, v: flash_attn(q, k, v, causal=mi.causal, window_size=window, dq_mode=dq_mode,
                                      dkdv_split=dkdv_split, config=config, **kw)


def sdpa_fn(backend_name, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.FLASH_ATTENTION if backend_name == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION

    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return f


def flex_impl(name, N):
    bm = flex_block_mask(name, N, "cuda")
    fl = flex_fn()
    return lambda q, k, v: fl(q, k, v, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])


def inputs(N, Hkv, seed=0):
    B = max(TOKENS // N, 1)
    g = torch.Generator(device="cuda").manual_seed(seed + N)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, do = mk(H), mk(Hkv), mk(Hkv), mk(H)
    return [t.requires_grad_(True) for t in (q, k, v)] + [do]


def time_impl(f, q, k, v, do):
    """(fwd_ms, bwd_ms, fwd_bwd_ms, first-call seconds incl. compile)."""
    t = time.time()
    f(q, k, v).backward(do)
    torch.cuda.synchronize()
    first = time.time() - t
    ms_f = time_cuda(lambda: f(q, k, v))
    out = f(q, k, v)
    ms_b = time_cuda(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, v])
    out = None  # noqa: F841  (the fwd+bwd timing runs without the retained graph)
    ms_fb = time_cuda(lambda: f(q, k, v).backward(do), grad_to_none=[q, k, v])
    q.grad = k.grad = v.grad = None
    return ms_f, ms_b, ms_fb, first


def add_times(row, times, B, frac):
    ms_f, ms_b, ms_fb, first = times
    row["first_call_s"] = round(first, 1)
    for mode, ms in (("fwd", ms_f), ("bwd", ms_b), ("fwd_bwd", ms_fb)):
        row[f"{mode}_ms"] = round(ms, 4)
        row[f"{mode}_tflops"] = round(tflops(flash_flops(B, H, row["N"], D, visited_fraction=frac, mode=mode),
                                             ms), 1)


def error_check(name, N, impls):
    """Max |ours - fp32 SDPA| of out, dq, dk, dv on one batch element, for each (label, fn)."""
    q, k, v, do = inputs(N, 1 if name == "mqa" else H, seed=7)
    q, k, v, do = (t.detach()[:1] for t in (q, k, v, do))
    spec = AttentionSpec(**VARIANTS[name])
    mi = mask_info(spec, N, N)
    q32, k32, v32 = (t.float().requires_grad_(True) for t in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    if VARIANTS[name]["kind"] == "flash":
        ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=mi.causal, enable_gqa=gqa)
    else:
        ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mi.dense("cuda"), enable_gqa=gqa)
    r = (ref.detach(),) + torch.autograd.grad(ref, (q32, k32, v32), do.float())
    del ref
    res = {}
    for label, f in impls:
        try:
            x = [t.clone().requires_grad_(True) for t in (q, k, v)]
            o = f(*x)
            got = (o.detach(),) + torch.autograd.grad(o, x, do)
            res[label] = {n: float(f"{(a.float() - b).abs().max().item():.3g}")
                          for n, a, b in zip(("out", "dq", "dk", "dv"), got, r)}
        except Exception as e:  # noqa: BLE001
            res[label] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    return res


def run_case(name, N, rows, anchor_cache, errs):
    B = max(TOKENS // N, 1)
    Hkv = 1 if name == "mqa" else H
    causal = VARIANTS[name]["causal"]
    frac = visited_fraction(name, N)
    q, k, v, do = inputs(N, Hkv)
    impls = [("ours_sep", lambda: ours_fn(name, N, "separate")), ("ours_atomic", lambda: ours_fn(name, N, "atomic"))]
    if name == "mqa":
        impls += [("ours_sep_split1", lambda: ours_fn(name, N, "separate", 1)),
                  ("ours_atomic_split1", lambda: ours_fn(name, N, "atomic", 1))]
    for anchor in ("sdpa_flash", "sdpa_cudnn"):
        impls.append((anchor, (lambda a=anchor: sdpa_fn(a, causal))))
    case = {}
    for impl, make in impls:
        row = dict(variant=name, N=N, B=B, Hq=H, Hkv=Hkv, D=D, impl=impl, visited_fraction=round(frac, 5))
        if impl.startswith("sdpa") and VARIANTS[name]["kind"] != "flash":
            row["note"] = "dense causal"
        t = time.time()
        akey = (impl, N, causal, Hkv)
        try:
            if impl.startswith("sdpa") and akey in anchor_cache:
                times = anchor_cache[akey]
                row["note"] = (row.get("note", "") + " (cached anchor)").strip()
            else:
                times = time_impl(make(), q, k, v, do)
                if impl.startswith("sdpa"):
                    anchor_cache[akey] = times
            add_times(row, times, B, frac)
        except Exception as e:  # noqa: BLE001 -- a case that cannot run is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if os.environ.get("PROBE_TRACE"):
                traceback.print_exc()
        q.grad = k.grad = v.grad = None
        torch.cuda.empty_cache()
        case[impl] = row
        rows.append(row)
        log(f"{name:9s} N={N:5d} {impl:18s} " + (
            f"fwd {row['fwd_tflops']:6.1f} bwd {row['bwd_tflops']:6.1f} fwd+bwd {row['fwd_bwd_tflops']:6.1f} TF/s "
            f"(first call {row['first_call_s']}s)" if "fwd_ms" in row else f"ERROR {row.get('error')}")
            + f"  [{time.time() - t:.1f}s]")
    for impl, r in case.items():
        if not impl.startswith("ours") or "fwd_ms" not in r:
            continue
        for anchor in ("sdpa_flash", "sdpa_cudnn", "ours_sep"):
            a = case.get(anchor)
            if a is None or "fwd_ms" not in a or anchor == impl:
                continue
            for mode in ("fwd", "bwd", "fwd_bwd"):
                r[f"x_{anchor}_{mode}"] = round(a[f"{mode}_ms"] / r[f"{mode}_ms"], 3)
    if errs is not None:
        t = time.time()
        try:
            label_fns = [("ours_sep", ours_fn(name, N, "separate")), ("ours_atomic", ours_fn(name, N, "atomic"))]
            e = error_check(name, N, label_fns)
            errs.append(dict(variant=name, N=N, **{f"{lbl}_{k}": v for lbl, d in e.items() for k, v in d.items()}))
            log(f"{name:9s} N={N:5d} max|err| vs fp32 SDPA: {e}  [{time.time() - t:.1f}s]")
        except Exception as ex:  # noqa: BLE001
            errs.append(dict(variant=name, N=N, error=f"{type(ex).__name__}: {str(ex)[:160]}"))
            log(f"{name:9s} N={N:5d} error check failed: {type(ex).__name__}: {str(ex)[:160]}")


def autotune_sweep(out_dir, budget_s):
    """Whole-backward time at causal N=16384 per forced dK/dV (and dQ) config."""
    import kernels.flash as kf

    N = AUTOTUNE_N
    B = max(TOKENS // N, 1)
    q, k, v, do = (t.detach() for t in inputs(N, H))
    out, lse = kf.flash_attn_fwd(q, k, v, D ** -0.5, -1, 0)
    frac = 0.5
    fl = flash_flops(B, H, N, D, visited_fraction=frac, mode="bwd")
    rows = []

    def bench(kind, cfg, dq_mode):
        forced = FlashConfig(dq_mode=dq_mode, **{kind: cfg})
        try:
            f = lambda: kf.flash_attn_bwd(do, q, k, v, out, lse, D ** -0.5, -1, 0, config=forced)  # noqa: E731
            f()
            torch.cuda.synchronize()
            ms = time_cuda(f)
            row = dict(kind=kind, dq_mode=dq_mode, **cfg, bwd_ms=round(ms, 4), bwd_tflops=round(tflops(fl, ms), 1))
        except Exception as e:  # noqa: BLE001 (OutOfResources, compile errors)
            row = dict(kind=kind, dq_mode=dq_mode, **cfg, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        rows.append(row)
        log(f"autotune {kind:4s} {dq_mode:8s} {cfg} -> {row.get('bwd_tflops', row.get('error'))}")
        return row

    t_start = time.time()
    mk = lambda bm, bn, w, s: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)  # noqa: E731
    dkdv = [mk(bm, bn, w, s) for bm, bn in ((64, 128), (128, 128), (32, 128), (64, 64)) for w in (8, 4) for s in (2, 3, 4)]
    dq = [mk(bm, bn, w, s) for bm, bn in ((128, 32), (128, 64), (64, 64), (64, 32)) for w in (4, 8) for s in (2, 3, 4)]
    for cfg in dkdv:
        if time.time() - t_start < budget_s:
            bench("dkdv", cfg, "separate")
    ok = sorted([r for r in rows if "bwd_ms" in r], key=lambda r: r["bwd_ms"])[:6]
    for r in ok:
        if time.time() - t_start < budget_s:
            bench("dkdv", {c: r[c] for c in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}, "atomic")
    for cfg in dq:
        if time.time() - t_start < budget_s:
            bench("dq", cfg, "separate")
    write_csv(rows, os.path.join(out_dir, "probe_flash_autotune.csv"))
    print("autotune (causal N=16384, whole backward TF/s):")
    for kind, mode in (("dkdv", "separate"), ("dkdv", "atomic"), ("dq", "separate")):
        good = sorted([r for r in rows if r["kind"] == kind and r["dq_mode"] == mode and "bwd_ms" in r],
                      key=lambda r: r["bwd_ms"])
        print(f"  {kind} dq={mode}: " + ("; ".join(
            f"{r['BLOCK_M']}x{r['BLOCK_N']}/w{r['num_warps']}/s{r['num_stages']} {r['bwd_tflops']}" for r in good[:4])
            or "none ran"))


def fwd_sweep(out_dir, budget_s):
    """Forward TF/s per forced forward config for the masked modes (causal N=4096, causal window 1024 N=16384)."""
    import kernels.flash as kf

    mk = lambda bm, bn, w, s: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)  # noqa: E731
    cfgs = [mk(64, 64, 4, 3), mk(64, 64, 4, 4), mk(128, 64, 8, 3), mk(128, 64, 4, 3), mk(128, 128, 8, 2),
            mk(64, 128, 4, 3), mk(128, 32, 4, 3)]
    rows, t_start = [], time.time()
    for name, N, wl in (("causal", 4096, -1), ("win1024", 16384, 1023)):
        B = max(TOKENS // N, 1)
        q, k, v, _ = (t.detach() for t in inputs(N, H))
        fl = flash_flops(B, H, N, D, visited_fraction=visited_fraction(name, N), mode="fwd")
        for cfg in cfgs:
            if time.time() - t_start > budget_s:
                break
            forced = FlashConfig(fwd=cfg)
            try:
                f = lambda: kf.flash_attn_fwd(q, k, v, D ** -0.5, wl, 0, config=forced)  # noqa: E731
                f()
                torch.cuda.synchronize()
                ms = time_cuda(f)
                row = dict(variant=name, N=N, **cfg, fwd_ms=round(ms, 4), fwd_tflops=round(tflops(fl, ms), 1))
            except Exception as e:  # noqa: BLE001
                row = dict(variant=name, N=N, **cfg, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            rows.append(row)
            log(f"fwd-sweep {name} N={N} {cfg} -> {row.get('fwd_tflops', row.get('error'))}")
    write_csv(rows, os.path.join(out_dir, "probe_flash_fwd_sweep.csv"))


def tma_sweep(out_dir, N, budget_s):
    """Per-kernel configs with TMA-streamed operands vs pointer loads (``FlashConfig.tma``), non-causal
    and causal at one N. Forward: forward time per forced forward config. Backward: whole-backward time with
    the dK/dV config forced (dQ at its default) and with the dQ config forced (dK/dV at its default). Every row
    also has the max |difference| of its outputs from the pointer-load default (same inputs) and the SDPA-cuDNN
    time of the same pass (``x_cudnn`` = cuDNN ms / ours ms)."""
    import kernels.flash as kf

    mk = lambda bm, bn, w, s: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)  # noqa: E731
    cfgs = {
        "fwd": [None, mk(128, 64, 8, 3), mk(128, 64, 8, 2), mk(128, 64, 4, 2), mk(128, 128, 8, 2), mk(64, 64, 4, 3),
                mk(64, 64, 4, 2), mk(128, 64, 4, 3)],
        "dkdv": [None, mk(64, 128, 8, 3), mk(64, 128, 8, 2), mk(64, 64, 4, 2), mk(64, 64, 4, 3), mk(32, 128, 4, 2),
                 mk(128, 128, 8, 2)],
        "dq": [None, mk(128, 64, 8, 4), mk(128, 64, 8, 3), mk(128, 64, 8, 2), mk(64, 64, 4, 2), mk(128, 128, 8, 2),
               mk(64, 64, 4, 3)],
    }
    rows, t_start = [], time.time()
    B = max(TOKENS // N, 1)
    scale = D ** -0.5
    for name in ("noncausal", "causal"):
        causal = name == "causal"
        wr = 0 if causal else -1
        frac = visited_fraction(name, N)
        q, k, v, do = (t.detach() for t in inputs(N, H))
        cud = sdpa_fn("sdpa_cudnn", causal)
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o = cud(qq, kk, vv)
        anchor = {"fwd": time_cuda(lambda: cud(q, k, v)),
                  "bwd": time_cuda(lambda: o.backward(do, retain_graph=True), grad_to_none=[qq, kk, vv])}
        del o, qq, kk, vv
        pointer = FlashConfig(tma=False)
        out, lse = kf.flash_attn_fwd(q, k, v, scale, -1, wr, config=pointer)
        ref = [out.float()] + [t.float() for t in kf.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, wr,
                                                                      config=pointer)]
        for kind, lst in cfgs.items():
            for tma in (False, "auto"):
                for cfg in lst:
                    if time.time() - t_start > budget_s:
                        break
                    forced = FlashConfig(tma=tma, **({} if cfg is None else {kind: cfg}))
                    row = dict(variant=name, N=N, B=B, kernel=kind, tma=bool(tma),
                               config="default" if cfg is None else
                               f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}/w{cfg['num_warps']}/s{cfg['num_stages']}")
                    try:
                        if kind == "fwd":
                            f = lambda: kf.flash_attn_fwd(q, k, v, scale, -1, wr, config=forced)  # noqa: E731
                            got = [f()[0].float()]
                            mode = "fwd"
                        else:
                            f = lambda: kf.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, wr,  # noqa: E731
                                                          config=forced)
                            got = [None] + [t.float() for t in f()]
                            mode = "bwd"
                        torch.cuda.synchronize()
                        row["max_diff"] = max(float((a - b).abs().max()) for a, b in zip(got, ref) if a is not None)
                        ms = time_cuda(f)
                        row[f"{mode}_ms"] = round(ms, 4)
                        row["tflops"] = round(tflops(flash_flops(B, H, N, D, visited_fraction=frac, mode=mode), ms), 1)
                        row["x_cudnn"] = round(anchor[mode] / ms, 3)
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    rows.append(row)
                    log(f"tma-sweep {name} N={N} {kind} tma={int(bool(tma))} {row['config']:14s} "
                        f"{row.get('tflops', row.get('error'))} TF/s x_cudnn {row.get('x_cudnn')} "
                        f"diff {row.get('max_diff')}")
    write_csv(rows, os.path.join(out_dir, "probe_flash_tma_sweep.csv"))


def sparse_sweep(out_dir, Ns, budget_s, rounds=1, variants=("bigbird",), only=None):
    """Block-sparse (``variants``: BigBird, strided; causal) forward / backward / fwd+bwd TF/s per forced sparse tile
    config (``only``: these names of the candidates), with a max-error
    check of out / dq / dk / dv against the default config (same inputs). ``rounds`` > 1 times every config
    that many times, round-robin (a drifting clock hits all configs alike), and adds a row per config with
    the median time of each kind (``round = "median"``)."""
    mk = lambda bm, bn, w, s: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)  # noqa: E731
    # name -> ((fwd, dq, dkdv) tiles or None for the defaults, FlashConfig changes). Dropped after losing
    # in every H200 sweep (results/h200/probe/): 64x64 fwd with 64x128 dk/dv, 128x64 / 8 warps, 64x128 forward,
    # 64x32 tiles (-5% vs 64x64 at 2 stages), partial tiles with the per-element layout gather (-20-25%).
    s2 = (mk(64, 64, 4, 2), mk(64, 64, 4, 2), mk(64, 64, 4, 2))
    cands = {
        "default": (None, {}),
        # forward shared memory (lab/inspect_kernels.py, triton 3.6): 64x64 / 3 stages 114 KiB (one 4-warp
        # program per SM), 2 stages 82 KiB (two)
        "f64x64w4s2_kv64": (s2, {}),
        "tma": (None, {"tma": True}),  # TMA descriptors forced (the default keeps pointer loads for sparse)
        "f64x64w4s2_kv64_tma": (s2, {"tma": True}),
        "gather": (None, {"sparse_aligned_no_gather": False}),  # partial tiles gather the layout per element
        # 128-row forward / dQ tiles, measured again now that aligned tiles skip the gather (the 64x64 choice was
        # made with the gather, against BigBird); dK / dV keeps 64x64
        "f128x64w8s3": ((mk(128, 64, 8, 3), mk(128, 64, 8, 3), mk(64, 64, 4, 2)), {}),
        "f128x64w8s2": ((mk(128, 64, 8, 2), mk(128, 64, 8, 2), mk(64, 64, 4, 2)), {}),
        "f128x128w8s2": ((mk(128, 128, 8, 2), mk(128, 128, 8, 2), mk(64, 64, 4, 2)), {}),
        "f128x64w4s3": ((mk(128, 64, 4, 3), mk(128, 64, 4, 3), mk(64, 64, 4, 2)), {}),
    }
    cands = {k: c for k, c in cands.items() if only is None or k in only}
    rows, t_start = [], time.time()
    for name, N in ((n, N) for n in variants for N in Ns):
        B = max(TOKENS // N, 1)
        frac = visited_fraction(name, N)
        q, k, v, do = inputs(N, H)
        ref = None
        for rnd, (cname, cfg) in ((r, c) for r in range(rounds) for c in cands.items()):
            if time.time() - t_start > budget_s:
                log(f"sparse-sweep budget spent: {cname} N={N} round {rnd} skipped")
                continue
            tiles, opts = cfg
            if tiles is not None:
                opts = dict(opts, **{f"sparse_{kind}": c for kind, c in zip(("fwd", "dq", "dkdv"), tiles)})
            row = dict(variant=name, N=N, B=B, config=cname, round=rnd)
            try:
                f = ours_fn(name, N, None, config=FlashConfig(**opts))
                q.grad = k.grad = v.grad = None
                out = f(q, k, v)
                out.backward(do)
                got = [t.detach().float() for t in (out, q.grad, k.grad, v.grad)]
                if ref is None:
                    ref = got
                row["max_diff_vs_default"] = max(float((a - b).abs().max()) for a, b in zip(got, ref))
                add_times(row, time_impl(f, q, k, v, do), B, frac)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            rows.append(row)
            log(f"sparse-sweep {name} N={N} {cname:14s} fwd {row.get('fwd_tflops')} bwd {row.get('bwd_tflops')} "
                f"fwd+bwd {row.get('fwd_bwd_tflops')} TF/s diff {row.get('max_diff_vs_default')} {row.get('error', '')}")
    if rounds > 1:
        for name, N in ((n, N) for n in variants for N in Ns):
            for cname in cands:
                got = [r for r in rows if r["variant"] == name and r["N"] == N and r["config"] == cname and "fwd_ms" in r]
                if not got:
                    continue
                med = dict(variant=name, N=N, B=got[0]["B"], config=cname, round="median")
                for key in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
                    vals = sorted(r[key] for r in got)
                    med[key] = vals[len(vals) // 2]
                add_times(med, (med["fwd_ms"], med["bwd_ms"], med["fwd_bwd_ms"], 0.0), got[0]["B"],
                          visited_fraction(name, N))
                rows.append(med)
                log(f"sparse-sweep median of {len(got)} {name} N={N} {cname:14s} fwd {med.get('fwd_tflops')} bwd "
                    f"{med.get('bwd_tflops')} fwd+bwd {med.get('fwd_bwd_tflops')} TF/s")
    write_csv(rows, os.path.join(out_dir, "probe_flash_sparse_sweep.csv"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", default="4096,16384")
    ap.add_argument("--variants", default=",".join(PROBE_VARIANTS))
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="skip the error check vs fp32 SDPA")
    ap.add_argument("--autotune", action="store_true", help="also sweep dK/dV and dQ configs at causal N=16384")
    ap.add_argument("--skip-main", action="store_true", help="only the --autotune / --fwd-sweep sweeps")
    ap.add_argument("--fwd-sweep", action="store_true", help="forward configs for causal / window (masked modes)")
    ap.add_argument("--tma-sweep", type=int, default=0, metavar="N",
                    help="per-kernel configs with TMA vs pointer loads, non-causal and causal at this N")
    ap.add_argument("--sparse-sweep", action="store_true", help="BigBird tile / warp configs (forced, all kernels)")
    ap.add_argument("--sparse-variants", default="bigbird", help="--sparse-sweep: bigbird, strided (comma-separated)")
    ap.add_argument("--sparse-configs", default=None, help="--sparse-sweep: only these candidates (comma-separated)")
    ap.add_argument("--rounds", type=int, default=1, help="--sparse-sweep: time every config this many times, "
                                                           "round-robin, and report the medians")
    ap.add_argument("--time-budget-s", type=float, default=200.0,
                    help="do not start Flex cases / further sweep configs after this many seconds")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit(f"--rounds={a.rounds}: must be >= 1")
    Ns = int_list(a.N, "--N", "sequence lengths")  # before the CUDA check: fails on CPU too
    if not torch.cuda.is_available():
        raise SystemExit("probe_flash needs a CUDA device")
    os.makedirs(a.out, exist_ok=True)
    env = env_info()
    log({k: env.get(k) for k in ("date", "gpu", "torch", "triton", "cuda")})
    rows, errs, anchor_cache = [], [], {}

    def save():
        write_csv(rows, os.path.join(a.out, "probe_flash.csv"))
        write_json(rows + [dict(error_check=e) for e in errs], os.path.join(a.out, "probe_flash.json"), env=env)

    if not a.skip_main:
        # Flex compiles last so a slow compile cannot cost the main numbers
        for N in Ns:
            for name in a.variants.split(","):
                check = None if (a.no_check or N != Ns[0]) else errs
                try:
                    run_case(name, N, rows, anchor_cache, check)
                except Exception as e:  # noqa: BLE001
                    log(f"{name} N={N} failed: {type(e).__name__}: {str(e)[:200]}")
                save()
        if not a.no_flex:
            for name, N in sorted(FLEX_CASES):
                if name not in a.variants.split(",") or N not in Ns:
                    continue
                if time.time() - T0 > a.time_budget_s:
                    log(f"time budget reached: Flex {name} N={N} skipped")
                    continue
                B = max(TOKENS // N, 1)
                frac = visited_fraction(name, N)
                q, k, v, do = inputs(N, H)
                row = dict(variant=name, N=N, B=B, Hq=H, Hkv=H, D=D, impl="flex", visited_fraction=round(frac, 5))
                t = time.time()
                try:
                    add_times(row, time_impl(flex_impl(name, N), q, k, v, do), B, frac)
                    for r in rows:
                        if r["variant"] == name and r["N"] == N and r["impl"].startswith("ours") and "fwd_ms" in r:
                            for mode in ("fwd", "bwd", "fwd_bwd"):
                                r[f"x_flex_{mode}"] = round(row[f"{mode}_ms"] / r[f"{mode}_ms"], 3)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                rows.append(row)
                log(f"{name:9s} N={N:5d} flex               " + (f"fwd+bwd {row['fwd_bwd_tflops']:6.1f} TF/s "
                    f"(first call {row['first_call_s']}s)" if "fwd_ms" in row else f"ERROR {row.get('error')}")
                    + f"  [{time.time() - t:.1f}s]")
                save()
                del q, k, v, do
                torch.cuda.empty_cache()
    if a.fwd_sweep:
        fwd_sweep(a.out, 60.0)
    if a.tma_sweep:
        tma_sweep(a.out, a.tma_sweep, a.time_budget_s)
    if a.sparse_sweep:
        sparse_sweep(a.out, Ns, a.time_budget_s, a.rounds, a.sparse_variants.split(","),
                     a.sparse_configs.split(",") if a.sparse_configs else None)
    if a.autotune:
        autotune_sweep(a.out, max(a.time_budget_s - (time.time() - T0), 30.0) if not a.skip_main else a.time_budget_s)
    save()
    if errs:
        print("max |error| vs fp32 SDPA (bf16 inputs, one batch element):")
        for e in errs:
            print("  " + ", ".join(f"{k}={v}" for k, v in e.items()))
    cols = ["variant", "N", "impl", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "fwd_bwd_ms", "x_sdpa_flash_fwd_bwd",
            "x_sdpa_cudnn_fwd_bwd", "x_flex_fwd_bwd", "x_ours_sep_bwd", "x_ours_sep_fwd_bwd"]
    print(format_table([r for r in rows if "fwd_ms" in r and "cached" not in r.get("note", "")], cols))
    bad = [r for r in rows if "error" in r]
    for r in bad:
        print(f"  not run: {r['variant']} N={r['N']} {r['impl']}: {r['error']}")
    log("done")


if __name__ == "__main__":
    main()
