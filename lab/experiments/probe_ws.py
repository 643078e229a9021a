"""GPU probe: do TMA descriptors + Triton's Hopper warp specialisation beat our pointer-load kernels?

Non-causal, bf16, D=128, H=16, 16k tokens. Times mini single-loop kernels (lab/experiments/ws_mini.py) with WS on/off
against ours and SDPA flash/cuDNN in one process; checks the mini kernels' outputs. Per-kernel split of our
backward from torch.profiler.

Usage (GPU, from the repo root): ``python -m lab.experiments.probe_ws $OUT/ws`` (~3 minutes).
"""
import json, os, sys, time, traceback
import torch, triton
import torch.nn.functional as F
from eval.bench_common import time_cuda, env_info
from kernels import flash as FL
from lab.experiments import ws_mini as M

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
rows = []
LOG2E = 1.4426950408889634


def rec(**r):
    rows.append(r)
    print(json.dumps(r), flush=True)


def tf(ms, B, H, N, D, mult):
    return round(4 * B * H * N * N * D * mult / ms / 1e9, 1)


for N in (4096, 16384):
    B, H, D = 16384 // N, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = D ** -0.5
    # anchors + ours
    for name, ctx in (("sdpa_flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
                      ("sdpa_cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION)):
        with torch.nn.attention.sdpa_kernel(ctx):
            ms = time_cuda(lambda: F.scaled_dot_product_attention(q, k, v))
            qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qq, kk, vv)
            msb = time_cuda(lambda: o.backward(do, retain_graph=True), grad_to_none=[qq, kk, vv])
        rec(N=N, impl=name, fwd_ms=ms, fwd_tf=tf(ms, B, H, N, D, 1), bwd_ms=msb, bwd_tf=tf(msb, B, H, N, D, 2.5))
    ms = time_cuda(lambda: FL.flash_attn_fwd(q, k, v, scale))
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = FL.flash_attn(qq, kk, vv)
    msb = time_cuda(lambda: o.backward(do, retain_graph=True), grad_to_none=[qq, kk, vv])
    rec(N=N, impl="ours", fwd_ms=ms, fwd_tf=tf(ms, B, H, N, D, 1), bwd_ms=msb, bwd_tf=tf(msb, B, H, N, D, 2.5))
    try:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                o.backward(do, retain_graph=True)
            torch.cuda.synchronize()
        split = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
                split[e.key[:40]] = round(getattr(e, "self_device_time_total", 0) / 5 / 1000, 4)
        rec(N=N, impl="ours_bwd_split_ms", split=split)
    except Exception as ex:
        rec(N=N, impl="ours_bwd_split_ms", error=repr(ex)[:200])
    ref, lse = FL.flash_attn_fwd(q, k, v, scale)
    lse2 = (lse * LOG2E).contiguous()
    delta = (ref.float() * do.float()).sum(-1).contiguous()
    # reference grads (ours, already tested against fp32)
    qq.grad = kk.grad = vv.grad = None
    o.backward(do, retain_graph=True)
    dk_ref, dv_ref = kk.grad.clone(), vv.grad.clone()
    qf, kf, vf = (t.reshape(B * H, N, D) for t in (q, k, v))
    for ws in (False, True):
        for cfg in ((128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 4, 2), (128, 64, 8, 3)):
            tag = f"mini_fwd ws={int(ws)} {cfg}"
            try:
                out = torch.empty_like(q)
                lo = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                grid = (N // cfg[0], B * H)
                fn = lambda: M.mini_fwd[grid](q, k, v, out, lo, N * D, D, N * D, D, N * D, D, N * D, D, N,
                                              scale * LOG2E, HEAD_D=D, BLOCK_M=cfg[0], BLOCK_N=cfg[1], WS=ws,
                                              CAUSAL=False, num_warps=cfg[2], num_stages=cfg[3])
                fn(); torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                ms = time_cuda(fn)
                rec(N=N, impl=tag, fwd_ms=ms, fwd_tf=tf(ms, B, H, N, D, 1), err=err)
            except Exception as ex:
                rec(N=N, impl=tag, error=repr(ex)[:300])
        for cfg in ((64, 128, 4, 2), (64, 128, 4, 3), (64, 64, 4, 2), (32, 128, 4, 2), (64, 128, 8, 2)):
            tag = f"mini_dkdv ws={int(ws)} {cfg}"
            try:
                dk = torch.empty_like(k); dv = torch.empty_like(v)
                grid = (N // cfg[1], B * H)
                fn = lambda: M.mini_dkdv[grid](q, k, v, do, lse2, delta, dk, dv, N * D, D, N, scale * LOG2E, scale,
                                               HEAD_D=D, BLOCK_M=cfg[0], BLOCK_N=cfg[1], WS=ws,
                                               num_warps=cfg[2], num_stages=cfg[3])
                fn(); torch.cuda.synchronize()
                err = max((dk.float() - dk_ref.float()).abs().max().item(), (dv.float() - dv_ref.float()).abs().max().item())
                ms = time_cuda(fn)
                rec(N=N, impl=tag, dkdv_ms=ms, err=err)
            except Exception as ex:
                rec(N=N, impl=tag, error=repr(ex)[:300])
json.dump({"env": env_info(), "rows": rows}, open(os.path.join(out_dir, "probe_ws.json"), "w"), indent=1)
