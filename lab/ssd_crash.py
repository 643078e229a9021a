"""Bisect a CUDA fault of kernels.ssd.ssd_scan (lab: not installed): each case in its own process.

    python3 -m lab.ssd_crash            # the grid
    python3 -m lab.ssd_crash one B T H P N G view dtype stage
"""
import itertools
import subprocess
import sys

import torch


def one(B, T, H, P, N, G, view, dtype, stage, variant="none"):
    import kernels.ssd as K
    from kernels.ssd import ssd_scan
    if "w8" in variant:
        K._warps = lambda L, BN: 8
    if "bp64" in variant:
        K._blocks = lambda N, P, block_p=None: (K._pow2(N), 64)
    dev = "cuda"
    dt = getattr(torch, dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    d_inner = H * P
    xBC = torch.randn(B, T, d_inner + 2 * G * N, device=dev, dtype=dt, generator=g)
    xs, Bm, Cm = torch.split(xBC, [d_inner, G * N, G * N], -1)
    xs, Bm, Cm = xs.reshape(B, T, H, P), Bm.reshape(B, T, G, N), Cm.reshape(B, T, G, N)
    if not view:
        Bm, Cm = Bm.contiguous(), Cm.contiguous()
    a = -torch.rand(B, T, H, device=dev, generator=g) * 0.5
    x = (xs * 1.0).contiguous().requires_grad_()
    Bm = Bm.detach().requires_grad_()
    Cm = Cm.detach().requires_grad_()
    a.requires_grad_()
    y, S = ssd_scan(x, a, Bm, Cm, None, 64)
    torch.cuda.synchronize()
    if stage == "bwd":
        y.float().square().sum().backward()
        torch.cuda.synchronize()
    print("ok", float(y.float().abs().max()))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        B, T, H, P, N, G, view = (int(v) for v in sys.argv[2:9])
        one(B, T, H, P, N, G, view, sys.argv[9], sys.argv[10], *sys.argv[11:])
        sys.exit(0)
    cases = [(32, 2048, 8, 32, 64, 1, 1, "bfloat16", "bwd"), (32, 2048, 8, 32, 64, 1, 0, "bfloat16", "bwd"),
             (1, 2048, 8, 32, 64, 1, 1, "bfloat16", "bwd"), (32, 256, 8, 32, 64, 1, 1, "bfloat16", "bwd"),
             (1, 256, 8, 32, 64, 1, 0, "bfloat16", "fwd"), (1, 256, 1, 32, 64, 1, 0, "bfloat16", "fwd"),
             (1, 256, 8, 64, 64, 1, 0, "bfloat16", "fwd"), (1, 256, 8, 32, 128, 1, 0, "bfloat16", "fwd"),
             (1, 256, 8, 64, 128, 1, 0, "bfloat16", "fwd"), (1, 256, 8, 32, 64, 1, 0, "float32", "fwd"),
             (1, 256, 8, 32, 32, 1, 0, "bfloat16", "fwd"), (1, 256, 8, 16, 64, 1, 0, "bfloat16", "fwd")]
    if len(sys.argv) > 1 and sys.argv[1] == "fix":
        cases = [(1, 256, 8, P, N, 1, 0, "bfloat16", "bwd", v) for v in sys.argv[2].split(",")
                 for P, N in ((32, 64), (16, 64), (16, 32), (32, 16), (64, 16), (16, 128))]
    for c in cases:
        r = subprocess.run([sys.executable, "-m", "lab.ssd_crash", "one", *map(str, c)], capture_output=True,
                           text=True, timeout=120, env={**__import__("os").environ, "CUDA_LAUNCH_BLOCKING": "1"})
        tail = (r.stdout + r.stderr).strip().splitlines()
        err = [l for l in tail if "Error" in l or "error" in l][-1:] or tail[-1:]
        where = [l.strip() for l in tail if "kernels/ssd.py" in l][-1:]
        print(c, "rc", r.returncode, err, where, flush=True)
