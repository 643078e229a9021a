"""A / B of the Triton forward's tile order (lab: not installed): ``kernels.flash.fwd.FWD_LPT`` off (one (batch, head)
after another, heaviest tile first within each) against on (longest-processing-time first within L2-sized sections
of heads, and one section for the whole grid), with cuDNN's forward in the same process.

    python -m lab.lpt_ab --out DIR [--rounds 5] [--cases causal1k,...]

bf16, H 16, 16k tokens per call, ``fwd_impl="triton"`` (the kernel under test; at N >= 4k ``"auto"`` runs the Gluon
forward instead). Rounds rotate the order of the implementations; each time is ``triton.testing.do_bench``'s median.
Writes ``lpt_ab.csv`` (one row per case and implementation: median ms over rounds, spread, TFLOP/s, ratio to the
head-major order, whether the output equals the head-major one bitwise)."""

from __future__ import annotations

import argparse
import csv
import os
import statistics

import torch

CASES = {  # name: (causal, N, D, Hkv)
    "causal1k": (True, 1024, 128, 16), "causal2k": (True, 2048, 128, 16), "causal4k": (True, 4096, 128, 16),
    "causal16k": (True, 16384, 128, 16), "full1k": (False, 1024, 128, 16), "d64causal1k": (True, 1024, 64, 16),
    "d64causal4k": (True, 4096, 64, 16), "gqa4causal4k": (True, 4096, 128, 4),
}
IMPLS = ("head_major", "lpt", "lpt_one_section", "sdpa_cudnn")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad or len(set(cases)) != len(cases):
        raise SystemExit(f"--cases {args.cases!r}: {'unknown ' + repr(bad) if bad else 'a case twice'}; allowed: a "
                         f"comma list of distinct names of {', '.join(CASES)}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: allowed values: an integer >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("lab.lpt_ab needs a CUDA GPU")
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import FlashConfig, flash_attn
    from kernels.flash import fwd as F

    os.makedirs(args.out, exist_ok=True)
    cfg = FlashConfig(fwd_impl="triton")
    rows = []
    for name in cases:
        causal, N, D, Hkv = CASES[name]
        H, B = 16, max(1, 16384 // N)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, H, N, D, generator=g).to("cuda", torch.bfloat16)
        k = torch.randn(B, Hkv, N, D, generator=g).to("cuda", torch.bfloat16)
        v = torch.randn(B, Hkv, N, D, generator=g).to("cuda", torch.bfloat16)
        kr, vr = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        section = F.LPT_SECTION_BYTES

        def ours(lpt, one_section):
            def fn():
                F.FWD_LPT, F.LPT_SECTION_BYTES = lpt, (1 << 62) if one_section else section
                try:
                    return flash_attn(q, k, v, causal=causal, config=cfg)
                finally:
                    F.FWD_LPT, F.LPT_SECTION_BYTES = False, section
            return fn

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=causal)

        fns = {"head_major": ours(False, False), "lpt": ours(True, False), "lpt_one_section": ours(True, True),
               "sdpa_cudnn": cudnn}
        base = fns["head_major"]()
        same = {i: bool(torch.equal(fns[i](), base)) for i in IMPLS if i != "sdpa_cudnn"}
        times = {i: [] for i in IMPLS}
        for r in range(args.rounds):
            order = IMPLS[r % len(IMPLS):] + IMPLS[:r % len(IMPLS)]
            for i in order:
                times[i].append(triton.testing.do_bench(fns[i], warmup=25, rep=100))
        flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        hm = statistics.median(times["head_major"])
        for i in IMPLS:
            ms = statistics.median(times[i])
            rows.append(dict(case=name, impl=i, B=B, H=H, Hkv=Hkv, N=N, D=D, causal=causal, fwd_ms=round(ms, 5),
                             spread=round((max(times[i]) - min(times[i])) / ms, 3),
                             tflops=round(flops / ms / 1e9, 1), vs_head_major=round(hm / ms, 3),
                             bitwise_head_major=same.get(i, ""),
                             section=F.lpt_section(B * H, N, D, D, 2, H // Hkv) if i == "lpt" else ""))
            print(f"{name:14s} {i:16s} {ms:8.4f} ms {rows[-1]['tflops']:7.1f} TF/s x{rows[-1]['vs_head_major']:.3f} "
                  f"spread {rows[-1]['spread']:.3f} same={same.get(i, '-')}", flush=True)
    with open(os.path.join(args.out, "lpt_ab.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
