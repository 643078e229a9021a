"""Probe (lab: not installed): what the ``fa4`` backend's packed-document wrapper costs around FA4's varlen kernel,
without FA4. ``attn_zoo.backends.torch_anchors._fa4_varlen`` turns the padded ``(B, H, N, D)`` form into FA4's
packed ``(B * N, H, D)`` one on every call: :func:`packed_cu_seqlens` (one host sync), three input copies, and the
output's copy back (and, in backward, the gradients' copies). A user who keeps the packed layout and builds
``cu_seqlens`` once per batch pays none of it, so ``x_fa4`` of ``eval.bench_flash --docs`` overstates our lead by
about ``wrapper_ms / fa4_ms``. Times, for the shapes of ``bench_flash --docs`` (16,384 tokens per call, H 16, D 128,
bf16): ``cu_seqlens_ms`` and ``layout_fwd_bwd_ms`` (the copies forward and backward), medians with CUDA events.

    python -m lab.fa4_wrapper_cost --out results/h200/<date>
"""

from __future__ import annotations

import argparse
import os

import torch

from attn_zoo.backends.torch_anchors import packed_cu_seqlens
from eval.bench_common import env_info, int_list, time_cuda, write_csv, write_json
from eval.bench_flash import packed_doc_ids


def wrapper_cost(N: int, dist: str, tokens: int = 16384, H: int = 16, D: int = 128) -> dict:
    B = max(1, tokens // N)
    doc_ids = packed_doc_ids(B, N, dist)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    cu_ms = time_cuda(lambda: packed_cu_seqlens(doc_ids, N), use_do_bench=False, warmup=5, rep=30)

    def layout():  # the wrapper's copies; the kernel's output stands in as the packed q
        qf, kf, vf = (t.transpose(1, 2).reshape(B * N, H, D) for t in (q, k, v))
        out = (qf + kf + vf).view(B, N, H, D).transpose(1, 2)  # one elementwise op: the kernel's stand-in
        out.backward(torch.ones_like(out))

    add_ms = time_cuda(lambda: (q + k + v).backward(torch.ones_like(q)), grad_to_none=(q, k, v))
    lay_ms = time_cuda(layout, grad_to_none=(q, k, v))
    return dict(N=N, docs=dist, B=B, cu_seqlens_ms=cu_ms, layout_fwd_bwd_ms=max(lay_ms - add_ms, 0.0),
                stand_in_ms=add_ms)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", default="4096,16384")
    ap.add_argument("--docs", default="fixed:256,fixed:1024,geometric:256,geometric:1024")
    a = ap.parse_args(argv)
    Ns = int_list(a.N, "--N", "sequence lengths")  # before any GPU work
    rows = [wrapper_cost(n, d) for n in Ns for d in a.docs.split(",")]
    for r in rows:
        print(f"N={r['N']:>6} {r['docs']:<15} cu_seqlens {r['cu_seqlens_ms']:.3f} ms  layout fwd+bwd "
              f"{r['layout_fwd_bwd_ms']:.3f} ms", flush=True)
    os.makedirs(a.out, exist_ok=True)
    write_csv(rows, os.path.join(a.out, "fa4_wrapper_cost.csv"))
    write_json(rows, os.path.join(a.out, "fa4_wrapper_cost.json"), env=env_info())


if __name__ == "__main__":
    main()
