"""Backward-only timing of the Gluon backward's ring depth against the Triton backward (lab: not installed; Hopper).

``python -m lab.gluon_bwd_sweep [--D 128,64] [--N 4096,16384] [--stages 2,3,4] [--causal 1,0] [--out F.csv]``

bf16, 16k tokens per call (B = 16384 // N), hidden 2048 (H = 2048 // D). For each case: the forward once
(``FlashConfig()``), then ``torch.autograd.grad`` of the output timed with ``triton.testing.do_bench`` (median ms),
for the Triton backward and for ``bwd_impl="gluon"`` with ``kernels.flash.gluon.gluon_bwd_tiles`` patched to each
``STAGES``. Every Gluon gradient is compared with the Triton one (max abs error printed; > 2e-2 marks the row
``BAD``). TFLOP/s by the FlashAttention convention (backward = 2.5x the forward's 4 B H N^2 D, causal halved).
One row per (case, impl) on stdout and in ``--out``.
"""

from __future__ import annotations

import argparse
import csv

import torch
import triton

import kernels.flash.gluon as G
from kernels import FlashConfig, flash_attn


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--D", type=_ints, default=[128, 64])
    ap.add_argument("--N", type=_ints, default=[4096, 16384])
    ap.add_argument("--stages", type=_ints, default=[2, 3, 4])
    ap.add_argument("--causal", type=_ints, default=[1, 0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    orig = G.gluon_bwd_tiles
    rows = []
    for D in a.D:
        for N in a.N:
            for causal in a.causal:
                B, H = max(1, 16384 // N), 2048 // D
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                           for _ in range(3))
                do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
                flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                o_t = flash_attn(q, k, v, causal=bool(causal), config=FlashConfig())
                ref = torch.autograd.grad(o_t, (q, k, v), do, retain_graph=True)
                ms = triton.testing.do_bench(lambda: torch.autograd.grad(o_t, (q, k, v), do, retain_graph=True))
                rows.append(dict(D=D, N=N, causal=causal, impl="triton", stages="", ms=ms,
                                 tflops=flops / ms / 1e9, max_err=0.0))
                for st in a.stages:
                    G.gluon_bwd_tiles = lambda d, st=st: orig(d)[:2] + (st,) + orig(d)[3:]
                    try:
                        o_g = flash_attn(q, k, v, causal=bool(causal), config=FlashConfig(bwd_impl="gluon"))
                        got = torch.autograd.grad(o_g, (q, k, v), do, retain_graph=True)
                        err = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
                        ms = triton.testing.do_bench(
                            lambda: torch.autograd.grad(o_g, (q, k, v), do, retain_graph=True))
                        rows.append(dict(D=D, N=N, causal=causal, impl="gluon", stages=st, ms=ms,
                                         tflops=flops / ms / 1e9, max_err=err))
                    except Exception as e:  # noqa: BLE001 -- a depth that does not fit is a row, not the end
                        rows.append(dict(D=D, N=N, causal=causal, impl="gluon", stages=st, ms=float("nan"),
                                         tflops=float("nan"), max_err=float("nan"), error=f"{type(e).__name__}: {e}"[:200]))
                    finally:
                        G.gluon_bwd_tiles = orig
                for r in rows[-1 - len(a.stages):]:
                    bad = " BAD" if r["max_err"] > 2e-2 else ""
                    print(f"D={D:3d} N={N:6d} causal={causal} {r['impl']:6s} stages={r['stages']!s:2s} "
                          f"{r['ms']:8.3f} ms {r['tflops']:7.1f} TF/s err {r['max_err']:.2e}{bad} {r.get('error', '')}",
                          flush=True)
    if a.out:
        keys = ["D", "N", "causal", "impl", "stages", "ms", "tflops", "max_err", "error"]
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({kk: r.get(kk, "") for kk in keys})


if __name__ == "__main__":
    main()
