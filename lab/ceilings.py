"""The H200's two ceilings of the roofline figure, measured (lab: not installed; needs CUDA).

* ``matmul_tflops``: bf16 ``(M, K) @ (K, N)`` at 8192^3 through ``torch.matmul`` (cuBLAS), median of CUDA events,
  2 M N K FLOPs: the compute roof the attention kernels are drawn against (FlashAttention's FLOP convention counts
  only the matmuls, so this is the roof of that count).
* ``copy_gbps``: device-to-device copy of 1 GiB (read + write bytes / time, :func:`eval.bench_decode.copy_bandwidth`):
  the bandwidth roof of decode.

    python -m lab.ceilings OUT.json
"""

import json
import sys

import torch

from eval.bench_common import env_info, time_cuda
from eval.bench_decode import copy_bandwidth


def main(path: str) -> None:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_cuda(lambda: a @ b, warmup=10, rep=50)
    out = dict(env_info(), matmul_tflops=2 * n ** 3 / (ms * 1e-3) / 1e12, matmul_shape=[n, n, n],
               copy_gbps=copy_bandwidth())
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"ceilings: bf16 matmul {out['matmul_tflops']:.0f} TFLOP/s, copy {out['copy_gbps']:.0f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1])
