"""Which Taylor-map path faults on this GPU, and at which shapes (lab: not installed; one subprocess per point, so an
illegal address in one cannot poison the next).

    python -m lab.taylor_fault [--points parallel:16:16:1024:16:64,...]

A point is ``path:B:H:N:D:Dv`` with ``path`` in ``parallel`` (``kernels.taylor.taylor_parallel``), ``chunked``
(``attention(backend="triton")``: the symmetric features into ``kernels.linear``), ``torch``; bf16, causal,
forward + backward, synchronised. Prints one line per point: ``ok`` or the error's last line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

DEFAULT = ("parallel:16:16:1024:16:64,parallel:1:16:1024:16:64,parallel:16:16:1024:16:32,parallel:4:16:4096:16:64,"
           "parallel:2:2:1024:16:64,chunked:16:16:1024:16:64,chunked:4:16:4096:16:64,chunked:1:16:16384:16:64,"
           "torch:2:16:1024:16:64")
PATHS = ("parallel", "chunked", "torch")


def _one(path: str, B: int, H: int, N: int, D: int, Dv: int) -> None:
    import torch

    import attn_zoo
    from kernels.taylor import taylor_parallel

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    v = torch.randn(B, H, N, Dv, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    spec = attn_zoo.AttentionSpec(kind="linear", causal=True, feature_map="taylor", chunk_size=64)
    if path == "parallel":
        o = taylor_parallel(q, k, v, causal=True, eps=spec.eps)
    else:
        o = attn_zoo.attention(q, k, v, spec, backend="triton" if path == "chunked" else "torch")
    torch.cuda.synchronize()
    o.float().sum().backward()
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=DEFAULT)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    a = ap.parse_args(argv)
    if a.one:
        p = a.one.split(":")
        _one(p[0], *map(int, p[1:]))
        return 0
    if not a.timeout_s > 0:
        ap.error(f"--timeout-s must be > 0, got {a.timeout_s}")
    points = a.points.split(",")
    for point in points:  # all of them before the first runs: a bad one last was found after the GPU time was spent
        parts = point.split(":")
        if len(parts) != 6 or parts[0] not in PATHS or not all(x.isdigit() and int(x) >= 1 for x in parts[1:]):
            ap.error(f"--points: {point!r} must be path:B:H:N:D:Dv (integers >= 1) with path in {', '.join(PATHS)}")
    for point in points:
        try:
            r = subprocess.run([sys.executable, "-m", "lab.taylor_fault", "--one", point], capture_output=True,
                               text=True, timeout=a.timeout_s)
            msg = "ok" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["rc %d" % r.returncode])[-1]
        except subprocess.TimeoutExpired:
            msg = "timeout"
        print(f"{point:32s} {msg}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
