"""GPU: the host time of one exact-attention fwd+bwd step alone, against the GPU's: the step enqueued 50 times
behind a 2-second ``torch.cuda._sleep`` kernel (the GPU cannot run ahead, so the loop's wall time is host work
only), beside the step's throughput (a loop with one sync at the end) and the same for cuDNN (SDPA). Causal bf16,
H 16, D 128, 16k tokens per step at N 1024 (and N 256, B 1: kernels of a few microseconds, so the throughput is
host-bound there). Then a cProfile of our step by cumulative time. Usage (GPU, repo root):
``python -m lab.experiments.host_sleep``.

Why (36th session, H200 machine): ``lab.where_time`` read our causal 1k step at busy 0.73 (wall 1.074 ms for
0.789 ms of kernels; CUDA-graph replay 0.775 ms), cuDNN at 0.98; ``lab.experiments.host_time``'s "host enqueue"
column cannot tell (it tracks the GPU while the GPU is the limit)."""
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import flash_attn


def _loop_us(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(n: int = 50):
    for N, B in ((256, 1), (1024, 16)):
        q, k, v = (torch.randn(B, 16, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)

        def ours():
            flash_attn(q, k, v, causal=True).backward(do)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

        for name, fn in (("ours", ours), ("sdpa_cudnn", cudnn)):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e9))  # ~1 s of GPU time: every step below is enqueued while it runs
            host = _loop_us(fn, n)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            step = (time.perf_counter() - t) / n * 1e6
            print(f"causal N={N} B={B} {name}: host {host:.0f} us per fwd+bwd step, throughput {step:.0f} us per step",
                  flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(100):
        ours()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    print(s.getvalue())


if __name__ == "__main__":
    main()
