"""Backward-only timing of the Gluon backward's variants against the Triton backward (lab: not installed; Hopper).

``python -m lab.gluon_bwd_sweep [--D 128,64] [--N 4096,16384] [--causal 1,0] [--dq atomic,triton,gluon]
[--lse tma,load] [--stages 2] [--consumers 1,2] [--pingpong 0,1] [--overlap 0,1] [--dq-block-n 64,128] [--dq-stages 2,3]
[--auto]
[--out F.csv]``

bf16, 16k tokens per call (B = 16384 // N), hidden 2048 (H = 2048 // D). For each case: the forward once
(``FlashConfig(bwd_impl="triton")``), then ``torch.autograd.grad`` of the output timed with ``triton.testing.do_bench`` (median ms),
for the Triton backward, with ``--auto`` for the default config (``FlashConfig()``: ``bwd_impl="auto"``, row ``impl=auto``),
and for ``bwd_impl="gluon"`` at every combination of

* ``--dq``: ``FlashConfig.gluon_bwd_dq``: ``atomic`` (dQ by fp32 atomics in the Gluon kernel), ``triton`` (the
  Gluon kernel computes dK / dV only, then bwd.py's Triton dQ kernel) or ``gluon`` (dK / dV likewise, then the Gluon
  dQ kernel ``_gl_bwd_dq_kernel``);
* ``--dq-block-n`` / ``--dq-stages`` (``--dq gluon`` only; 0: the launcher's): the Gluon dQ kernel's key tile and ring
  depth (``kernels.flash.gluon.gluon_bwd_dq_tiles`` patched; D 128 at 128 keys compiles with serialized wgmmas and
  fits shared memory only with ``--dq-stages 2``: 64 + 3 x 64 KiB is over 227 KiB, recorded as an error row);
* ``--lse``: ``kernels.flash.gluon.GLUON_BWD_LSE_TMA``: ``tma`` (lse2 / delta through the TMA ring into shared
  memory) or ``load`` (``gl.load`` into registers, the first version);
* ``--consumers``: ``FlashConfig.gluon_bwd_consumers``: 1 (one 8-warp consumer partition) or 2 (two 1-warpgroup
  partitions, ``_gl_bwd_dkdv2_kernel``; only with ``--dq triton`` / ``gluon``: the combinations with ``atomic`` are
  skipped);
* ``--pingpong``: ``kernels.flash.gluon.GLUON_BWD_PINGPONG`` (0 / 1; two consumers only: 1 is skipped with one);
* ``--overlap``: ``kernels.flash.gluon.GLUON_BWD_OVERLAP`` (0 / 1; two consumers without ping-pong only: 1 is skipped
  otherwise);
* ``--stages``: the ring depth (``kernels.flash.gluon.gluon_bwd_tiles`` patched; 2, 3 and 4 were within 3 % of each
  other on the H200 with the first version, so the default is the launcher's 2 only).

Every Gluon gradient is compared with the Triton one (max abs error printed; > 2e-2 marks the row ``BAD``). TFLOP/s
by the FlashAttention convention (backward = 2.5x the forward's 4 B H N^2 D, causal halved). One row per (case,
impl, dq, lse, consumers, pingpong, overlap, stages, dq_bn, dq_st) on stdout and in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import itertools

import torch
import triton

import kernels.flash.gluon as G
from eval.bench_common import int_list
from kernels import FlashConfig, flash_attn
from kernels.flash import GLUON_BWD_CONSUMERS, GLUON_BWD_DQ

LSE_MODES = {"tma": True, "load": False}  # --lse value -> GLUON_BWD_LSE_TMA


def _ints(flag, what, minimum=1, maximum=None):
    """An argparse ``type``: ``flag``'s comma list of integers (:func:`eval.bench_common.int_list`: a bad one stops
    with a message naming ``flag`` and the allowed values)."""
    return lambda s: int_list(s, flag, what, minimum, maximum)


def _choices(allowed):
    def parse(s):
        vals = [x for x in s.split(",") if x]
        bad = [x for x in vals if x not in allowed]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"{s!r}: allowed values: {', '.join(allowed)}")
        return vals
    return parse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--D", type=_ints("--D", "head dims"), default=[128, 64])
    ap.add_argument("--N", type=_ints("--N", "sequence lengths"), default=[4096, 16384])
    ap.add_argument("--causal", type=_ints("--causal", "causal flags", 0, 1), default=[1, 0])
    ap.add_argument("--dq", type=_choices(GLUON_BWD_DQ), default=["atomic", "triton", "gluon"],
                    help="FlashConfig.gluon_bwd_dq values: atomic, triton, gluon, tma (triton 3.7+)")
    ap.add_argument("--lse", type=_choices(tuple(LSE_MODES)), default=list(LSE_MODES),
                    help="how the kernel reads lse2 / delta: tma (shared memory), load (registers)")
    ap.add_argument("--consumers", type=_choices(tuple(str(c) for c in GLUON_BWD_CONSUMERS)), default=["1"],
                    help="FlashConfig.gluon_bwd_consumers values: 1, 2 (2 only with --dq triton / gluon)")
    ap.add_argument("--pingpong", type=_choices(("0", "1")), default=["0"],
                    help="GLUON_BWD_PINGPONG values (two consumers only): 0, 1")
    ap.add_argument("--overlap", type=_choices(("0", "1")), default=["0"],
                    help="GLUON_BWD_OVERLAP values (two consumers without ping-pong only): 0, 1")
    ap.add_argument("--stages", type=_ints("--stages", "ring depths"), default=[2])
    ap.add_argument("--dq-block-n", type=_ints("--dq-block-n", "key tiles", 0), default=[0],
                    help="--dq gluon: the dQ kernel's key tile (64 / 128; 0: the launcher's)")
    ap.add_argument("--dq-stages", type=_ints("--dq-stages", "ring depths", 0), default=[0],
                    help="--dq gluon: the dQ kernel's K / V ring depth (0: the launcher's)")
    ap.add_argument("--auto", action="store_true", help="also time the default config (bwd_impl='auto')")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    bad = [x for x in a.dq_block_n if x not in (0, 64, 128)] + [x for x in a.dq_stages if x < 0 or x == 1]
    if bad:
        ap.error(f"--dq-block-n: allowed values: 0, 64, 128; --dq-stages: 0 or >= 2 (got {bad})")
    orig_tiles, orig_lse, orig_pp = G.gluon_bwd_tiles, G.GLUON_BWD_LSE_TMA, G.GLUON_BWD_PINGPONG
    orig_ov = G.GLUON_BWD_OVERLAP
    orig_dq_tiles = G.gluon_bwd_dq_tiles
    combos = [(dq, lse, int(c), int(pp), int(ov), st, bn, dst) for dq, lse, c, pp, ov, st, bn, dst in
              itertools.product(a.dq, a.lse, a.consumers, a.pingpong, a.overlap, a.stages, a.dq_block_n, a.dq_stages)
              if not (c == "2" and dq == "atomic") and not (c == "1" and pp == "1")
              and not (ov == "1" and (c == "1" or pp == "1" or dq == "tma"))
              and (dq == "gluon" or (bn, dst) == (a.dq_block_n[0], a.dq_stages[0]))]
    if not combos:
        ap.error("no combination to time: --consumers 2 needs --dq triton or gluon, --pingpong 1 needs --consumers 2, "
                 "--overlap 1 needs --consumers 2 without --pingpong 1")
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
                o_t = flash_attn(q, k, v, causal=bool(causal), config=FlashConfig(bwd_impl="triton"))
                ref = torch.autograd.grad(o_t, (q, k, v), do, retain_graph=True)
                ms = triton.testing.do_bench(lambda: torch.autograd.grad(o_t, (q, k, v), do, retain_graph=True))
                empty = dict(dq="", lse="", consumers="", pingpong="", overlap="", stages="", dq_bn="", dq_st="")
                rows.append(dict(D=D, N=N, causal=causal, impl="triton", **empty, ms=ms, tflops=flops / ms / 1e9,
                                 max_err=0.0))
                n_before = len(rows)
                if a.auto:  # the default config: what a training run gets today
                    o_a = flash_attn(q, k, v, causal=bool(causal), config=FlashConfig())
                    got = torch.autograd.grad(o_a, (q, k, v), do, retain_graph=True)
                    err = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
                    ms = triton.testing.do_bench(lambda: torch.autograd.grad(o_a, (q, k, v), do, retain_graph=True))
                    rows.append(dict(D=D, N=N, causal=causal, impl="auto", **empty, ms=ms, tflops=flops / ms / 1e9,
                                     max_err=err))
                for dq, lse, cons, pp, ov, st, bn, dst in combos:
                    G.gluon_bwd_tiles = lambda d, c=1, st=st: orig_tiles(d, c)[:2] + (st,) + orig_tiles(d, c)[3:]
                    G.gluon_bwd_dq_tiles = lambda d, bn=bn, dst=dst: (orig_dq_tiles(d)[0], bn or orig_dq_tiles(d)[1],
                                                                      dst or orig_dq_tiles(d)[2], orig_dq_tiles(d)[3])
                    G.GLUON_BWD_LSE_TMA = LSE_MODES[lse]
                    G.GLUON_BWD_PINGPONG = bool(pp)
                    G.GLUON_BWD_OVERLAP = bool(ov)
                    row = dict(D=D, N=N, causal=causal, impl="gluon", dq=dq, lse=lse, consumers=cons, pingpong=pp,
                               overlap=ov, stages=st, dq_bn=G.gluon_bwd_dq_tiles(D)[1] if dq == "gluon" else "",
                               dq_st=G.gluon_bwd_dq_tiles(D)[2] if dq == "gluon" else "")
                    try:
                        o_g = flash_attn(q, k, v, causal=bool(causal),
                                         config=FlashConfig(bwd_impl="gluon", gluon_bwd_dq=dq,
                                                            gluon_bwd_consumers=cons))
                        got = torch.autograd.grad(o_g, (q, k, v), do, retain_graph=True)
                        err = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
                        ms = triton.testing.do_bench(
                            lambda: torch.autograd.grad(o_g, (q, k, v), do, retain_graph=True))
                        rows.append(dict(row, ms=ms, tflops=flops / ms / 1e9, max_err=err))
                    except Exception as e:  # noqa: BLE001 -- a variant that does not build is a row, not the end
                        rows.append(dict(row, ms=float("nan"), tflops=float("nan"), max_err=float("nan"),
                                         error=f"{type(e).__name__}: {e}"[:200]))
                    finally:
                        G.gluon_bwd_tiles, G.GLUON_BWD_LSE_TMA, G.GLUON_BWD_PINGPONG = orig_tiles, orig_lse, orig_pp
                        G.GLUON_BWD_OVERLAP = orig_ov
                        G.gluon_bwd_dq_tiles = orig_dq_tiles
                for r in rows[n_before - 1:]:
                    bad = " BAD" if r["max_err"] > 2e-2 else ""
                    print(f"D={D:3d} N={N:6d} causal={causal} {r['impl']:6s} dq={r['dq']:6s} lse={r['lse']:4s} "
                          f"cons={r['consumers']!s:1s} pp={r['pingpong']!s:1s} ov={r['overlap']!s:1s} "
                          f"stages={r['stages']!s:2s} dqt={r['dq_bn']!s:3s}/{r['dq_st']!s:1s} {r['ms']:8.3f} ms "
                          f"{r['tflops']:7.1f} TF/s err {r['max_err']:.2e}{bad} {r.get('error', '')}", flush=True)
    if a.out:
        keys = ["D", "N", "causal", "impl", "dq", "lse", "consumers", "pingpong", "overlap", "stages", "dq_bn", "dq_st",
                "ms",
                "tflops", "max_err", "error"]
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({kk: r.get(kk, "") for kk in keys})


if __name__ == "__main__":
    main()
