"""GPU: where the host time of one exact-attention fwd+bwd goes, and what the GPU alone takes.

For causal bf16 attention (16k tokens, H = 16, D = 128) at N = 512 / 1024 / 4096 it reports, for our kernel and
SDPA's flash and cuDNN backends, in one process:
  * ``host_us``: host time to enqueue one fwd+bwd (loop of calls, no sync inside);
  * ``bench_ms``: ``do_bench`` median (what the benchmarks report: host-bound when host > GPU);
  * ``graph_ms``: the same fwd+bwd captured in a CUDA graph and replayed (GPU time alone).
Then the pieces of one Triton launch (binder, direct CompiledKernel launch, TMA descriptors) and a cProfile of
our fwd+bwd. Usage (GPU, from the repo root): ``python -m lab.experiments.host_profile``.
"""
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels.flash as kf
import kernels.flash.fwd as kf_fwd
import kernels.flash.launch as kf_launch
from eval.bench_common import host_us, time_cuda_graph
from kernels._host import CompiledLaunch


def main():
    H, D = 16, 128
    rows = []
    for N in (512, 1024, 4096):
        B = 16384 // N
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        impls = {
            "ours": lambda: kf.flash_attn(q, k, v, causal=True),
            "sdpa_flash": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "sdpa_cudnn": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        }
        ctx = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
        for name, fn in impls.items():
            def fb(fn=fn):
                q.grad = k.grad = v.grad = None
                fn().backward(do)
            if name in ctx:
                with sdpa_kernel(ctx[name]):
                    r = dict(impl=name, N=N, host_us=host_us(fb), bench_ms=triton.testing.do_bench(fb, return_mode="median"),
                             graph_ms=time_cuda_graph(fb))
            else:
                r = dict(impl=name, N=N, host_us=host_us(fb), bench_ms=triton.testing.do_bench(fb, return_mode="median"),
                         graph_ms=time_cuda_graph(fb))
            r["fwd_host_us"] = host_us(lambda fn=fn: fn().detach() if name == "ours" else fn())
            rows.append(r)
            print(r, flush=True)

    # the same fwd+bwd at N = 512 without the plans' compiled launches (every launch through Triton's binder)
    N = 512
    B = 16384 // N
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    CL = CompiledLaunch
    ready = CL.__dict__["ready"]
    CL.ready = staticmethod(lambda: False)
    slow = host_us(lambda: kf.flash_attn(q, k, v, causal=True).backward(do), 200)
    CL.ready = ready
    fast = host_us(lambda: kf.flash_attn(q, k, v, causal=True).backward(do), 200)
    import kernels.flash.bwd as kf_bwd

    orig = kf_launch._plan_launch  # the host work of a call without its launches (fwd.py / bwd.py call it)
    kf_fwd._plan_launch = kf_bwd._plan_launch = lambda *a, **kw: None
    py = host_us(lambda: kf.flash_attn(q, k, v, causal=True).backward(do), 200)
    py_fwd = host_us(lambda: kf.flash_attn(q, k, v, causal=True), 200)
    kf_fwd._plan_launch = kf_bwd._plan_launch = orig
    print(dict(N=N, host_us_triton_launch=slow, host_us_compiled_launch=fast, host_us_no_launch=py,
               fwd_host_us_no_launch=py_fwd), flush=True)

    # pieces, each alone
    class Ident(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    x = q.detach().requires_grad_(True)
    pieces = dict(
        trivial_function_fwd_bwd=lambda: Ident.apply(x).backward(do),
        cuda_empty=lambda: torch.empty(B, N, H, D, device="cuda", dtype=torch.bfloat16),
        fwd_impl=lambda: kf.flash_attn_fwd(q, k, v, D ** -0.5, -1, 0),
        tensor_descriptor=lambda: kf_launch.TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, 64, D]),
    )
    plan = next(p for key, p in kf.launch_plans().items() if key[0] == "fwd" and key[1] == q.shape)
    launch, cfg, used = plan.fast["fwd"]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device="cuda")
    m = kf_launch._mode_args(q, None, (None, None, None))
    args = (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), H, N, N, 0, 1, 0.1, 0, 0, 1,
            m["idx"], m["cnt"], m["nfull"], m["stride_tbl"], m["lay"], m["lay_nb"], 1, 512, k, v)
    pieces["compiled_launch_alone"] = lambda: launch(*args)
    print({name: round(host_us(f, 300), 1) for name, f in pieces.items()}, flush=True)
    pr = cProfile.Profile()
    fb = lambda: kf.flash_attn(q, k, v, causal=True).backward(do)  # noqa: E731
    q.requires_grad_(True)
    for _ in range(5):
        fb()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(100):
        fb()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[-6000:])
    print(f"{'impl':12s} {'N':>6s} {'host_us':>8s} {'bench_ms':>9s} {'graph_ms':>9s} {'fwd_host':>9s}")
    for r in rows:
        print(f"{r['impl']:12s} {r['N']:6d} {r['host_us']:8.0f} {r['bench_ms']:9.3f} {r['graph_ms']:9.3f} {r['fwd_host_us']:9.0f}")


if __name__ == "__main__":
    main()
