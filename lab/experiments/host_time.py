"""GPU: host time to enqueue one fwd+bwd with TMA descriptors vs pointer loads (``kernels.FlashConfig(tma=...)``),
and the fwd+bwd time of each, interleaved over 3 rounds (BigBird N = 4096 / 16384, causal N = 1024; bf16, D = 128,
H = 16, 16k tokens). Usage (GPU, from the repo root): ``python -m lab.experiments.host_time``.

Read the "host enqueue" column with care: it is the wall time of 50 calls without a sync, which is the host's time only
while the GPU keeps up. On an H100 (35th session, ``results/h100/2026-12-07f/13/host_time.log``) it tracked the
fwd+bwd time within a few per cent in every row (0.78-1.27 ms), while ``lab.where_time`` found the causal 1k step
GPU-bound (busy 0.99): there it measured the GPU, not the host."""
from kernels import FlashConfig
from lab.probe_flash import ours_fn, inputs
from eval.bench_common import host_us, time_cuda

for name, N in (("bigbird", 4096), ("causal", 1024), ("bigbird", 16384)):
    q, k, v, do = inputs(N, 16)
    for rnd in range(3):
        for tma in ("auto", False):
            f = ours_fn(name, N, None, config=FlashConfig(tma=tma))
            fb = lambda: f(q, k, v).backward(do)
            ms = time_cuda(fb, grad_to_none=[q, k, v])
            us = host_us(fb, 50, warmup=10)
            print(f"{name} N={N} round {rnd} tma={tma}: fwd+bwd {ms:.4f} ms, host enqueue {us:.0f} us/call", flush=True)
