"""GPU: forced tile configs of the exact kernel at small head dims (D = 32 / 64, the ``model=small`` case), causal
bf16, 16k tokens, H = 4 (the small model's heads) -- the heuristic tables were tuned at D = 128.

Each kernel is timed alone through a CUDA graph of the call that contains it (forward: ``flash_attn_fwd``; dQ /
dK/dV: ``flash_attn_bwd`` with the other kernel at its default), so host time is out of the numbers. Prints the
best configs per (kernel, D, N) and writes ``tile_sweep.csv`` to ``--out``.
Usage (GPU, from the repo root): ``python -m lab.experiments.tile_sweep --out $OUT [--D 32,64] [--N 1024,4096]``
"""
import argparse
import csv
import os

import torch

import kernels.flash as kf
from eval.bench_common import int_list, time_cuda_graph

FWD = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 4, 3), (128, 64, 4, 2),
       (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 2),
       (64, 32, 4, 3), (128, 32, 4, 3)]
DQ = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 2), (128, 64, 4, 3),
      (64, 128, 4, 2), (128, 128, 8, 2), (64, 32, 4, 3), (128, 32, 4, 3)]
DKDV = [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 2), (64, 128, 8, 3),
        (32, 128, 4, 2), (32, 128, 4, 3), (128, 128, 8, 2), (64, 128, 4, 2), (128, 64, 8, 2)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--D", default="32,64")
    ap.add_argument("--N", default="1024,4096")
    ap.add_argument("--H", type=int, default=4)
    a = ap.parse_args(argv)
    Ds, Ns = int_list(a.D, "--D", "head dims"), int_list(a.N, "--N", "sequence lengths")  # before any GPU work
    rows = []
    for D in Ds:
        for N in Ns:
            B = 16384 // N
            q, k, v, do = (torch.randn(B, a.H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = D ** -0.5
            out, lse = kf.flash_attn_fwd(q, k, v, scale, -1, 0)
            calls = {"fwd": lambda cfg: (lambda: kf.flash_attn_fwd(q, k, v, scale, -1, 0, config=cfg)),
                     "dq": lambda cfg: (lambda: kf.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, 0, config=cfg)),
                     "dkdv": lambda cfg: (lambda: kf.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, 0, config=cfg))}
            for kind, cfgs in (("fwd", FWD), ("dq", DQ), ("dkdv", DKDV)):
                base = time_cuda_graph(calls[kind](kf.FlashConfig()))
                default = kf.pick_config(kind, max(16, D), False, "tf32", masked=True)
                for bm, bn, w, s in cfgs:
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
                    try:
                        ms = time_cuda_graph(calls[kind](kf.FlashConfig(**{kind: cfg})))
                        err = ""
                    except Exception as e:  # out of resources, compile failures
                        ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:80]}"
                    rows.append(dict(D=D, N=N, kind=kind, cfg=f"{bm}x{bn}/{w}w/{s}s", ms=ms, default_ms=base,
                                     default=f"{default['BLOCK_M']}x{default['BLOCK_N']}/{default['num_warps']}w/"
                                             f"{default['num_stages']}s", err=err))
                    print(rows[-1], flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tile_sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("best per (kind, D, N):")
    for key in sorted({(r["kind"], r["D"], r["N"]) for r in rows}):
        rs = sorted((r for r in rows if (r["kind"], r["D"], r["N"]) == key and r["ms"] == r["ms"]), key=lambda r: r["ms"])
        if rs:
            print(key, "default", rs[0]["default"], f"{rs[0]['default_ms']:.4f} ms;", " | ".join(
                f"{r['cfg']} {r['ms']:.4f}" for r in rs[:4]))


if __name__ == "__main__":
    main()
