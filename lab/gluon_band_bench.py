"""Forward-alone (and dQ-alone) timing of the Gluon kernels under band masks against the Triton ones (lab: Hopper).

``python -m lab.gluon_band_bench [--D 128,64] [--cases win1024@4096,win1024@16384,docs1024@16384,docs4096@16384]
[--impls gluon_ws3a,gluon_ws3b,triton] [--dq] [--rounds 5] [--check] [--out DIR]``

Every case is causal, bf16, 16k tokens per call (B = 16384 // N), Hq = Hkv = 16: ``winW@N`` a sliding window of W
keys (``window_size=(W - 1, 0)``), ``docsL@N`` packed documents of exactly L tokens (the document table built once,
outside the timed region). Forward: ``kernels.flash.fwd.flash_attn_fwd`` with ``FlashConfig(fwd_impl=impl)`` (the
launcher as ``flash_attn`` runs it, descriptors included). ``--dq``: the dQ kernel alone on the forward's lse2 /
delta: the Gluon one (:func:`kernels.flash.gluon.gluon_dq`) against the Triton one (bwd.py's ``_bwd_dq_kernel``
launched as ``flash_attn_bwd`` launches it for the mask). Each impl is timed ``--rounds`` times
(``triton.testing.do_bench`` medians) in rotating order (:func:`eval.bench_common.interleaved_rounds`); rows give the
median, the spread ((max - min) / median) and TFLOP/s over the pairs the mask keeps (exact count, ``4 * D * B * Hq``
FLOPs per visited pair forward, ``3 * 2 * D`` per pair for dQ: S, dP and dS K), and the speedup over Triton.
``--check``: max |Gluon - Triton| of out (and dq) printed per case. ``--out DIR`` (or ``$OUT``): ``DIR/
gluon_band_bench.csv``.
"""

from __future__ import annotations

import argparse
import math
import os

import torch

from eval.bench_common import (int_list, interleaved_rounds, median_spread, require_cuda, tflops, time_cuda,
                               write_csv)

TOKENS = 16384
HEADS = 16
DEFAULT_CASES = "win1024@4096,win1024@16384,docs1024@16384,docs4096@16384"


def parse_case(text: str):
    """``"win1024@4096"`` -> ``("win", 1024, 4096)``; ``"docs1024@16384"`` -> ``("docs", 1024, 16384)``. Raises
    ``ValueError`` for another form."""
    try:
        kind_len, n = text.split("@")
        kind = "docs" if kind_len.startswith("docs") else "win" if kind_len.startswith("win") else None
        length = int(kind_len[len(kind):]) if kind else 0
        N = int(n)
    except (ValueError, TypeError):
        kind = None
    if kind is None or length < 1 or N < 1:
        raise ValueError(f"case {text!r}: allowed forms: winW@N, docsL@N (W, L, N >= 1)")
    return kind, length, N


def case_mask(kind: str, length: int, N: int, B: int, device):
    """``(win_left, win_right, doc_ids or None, visited pairs per (batch, head))`` of a causal case."""
    i = torch.arange(N, device=device, dtype=torch.int64)
    if kind == "win":
        first = (i - (length - 1)).clamp(min=0)
        return length - 1, 0, None, int((i - first + 1).sum())
    doc_ids = (i // length).to(torch.int32).expand(B, N).contiguous()
    first = (i // length) * length
    return -1, 0, doc_ids, int((i - first + 1).sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--D", default="128,64")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--impls", default="gluon_ws3a,gluon_ws3b,triton")
    ap.add_argument("--dq", action="store_true", help="also time the dQ kernels alone (Gluon vs Triton)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--tokens", type=int, default=TOKENS, help="tokens per call (B = tokens // N)")
    ap.add_argument("--device", default="cuda", help="(smoke tests only: 'cpu' under TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    cases = [parse_case(c) for c in args.cases.split(",")]
    impls = args.impls.split(",")
    from kernels.flash.config import FWD_IMPLS

    for impl in impls:
        if impl not in FWD_IMPLS or impl == "auto":
            raise SystemExit(f"--impls {impl!r}: allowed values: {', '.join(i for i in FWD_IMPLS if i != 'auto')}")
    Ds = int_list(args.D, "--D", "head dims")  # before the CUDA check: fails on CPU too
    if args.device == "cuda":
        require_cuda("lab.gluon_band_bench")
    import triton

    from kernels import FlashConfig
    from kernels.flash import gluon as G
    from kernels.flash.bwd import _dq_meta, _launch_dq
    from kernels.flash.documents import document_table
    from kernels.flash.fwd import flash_attn_fwd
    from kernels.flash.launch import _PLANS, _get_plan, _mode_args

    dev = torch.device(args.device)
    rows = []
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"triton {triton.__version__}, {gpu}; {args.tokens} tokens per call, Hq = {HEADS}, bf16, "
          f"causal; {args.rounds} rounds")
    for D in Ds:
        for ci, (kind, length, N) in enumerate(cases):
            B = max(1, args.tokens // N)
            wl, wr, doc_ids, pairs = case_mask(kind, length, N, B, dev)
            table = None if doc_ids is None else document_table(doc_ids, N)
            g = torch.Generator(device="cpu").manual_seed(0)
            q, k, v, do = (torch.randn(B, N, HEADS, D, generator=g).to(dev, torch.bfloat16).transpose(1, 2)
                           for _ in range(4))
            scale = D ** -0.5
            name = f"{kind}{length}@{N}"
            fwd = {impl: (lambda c=FlashConfig(fwd_impl=impl): flash_attn_fwd(q, k, v, scale, wl, wr, config=c,
                                                                                documents=table)) for impl in impls}
            for f in fwd.values():  # compile / warm up outside the timed rounds
                f()
            timers = {impl: (lambda f=f: time_cuda(f)) for impl, f in fwd.items()}
            flops = 4.0 * D * B * HEADS * pairs
            errs = {}
            if args.check and "triton" in fwd:
                ref = fwd["triton"]()[0].float()
                errs = {impl: (f()[0].float() - ref).abs().max().item() for impl, f in fwd.items() if impl != "triton"}
            if args.dq:
                out, lse = fwd["triton"]() if "triton" in fwd else flash_attn_fwd(
                    q, k, v, scale, wl, wr, config=FlashConfig(fwd_impl="triton"), documents=table)
                lse2 = torch.where(torch.isfinite(lse), lse * 1.4426950408889634,
                                   torch.full_like(lse, math.inf)).contiguous()
                delta = (do.float() * out.float()).sum(-1).contiguous()
                dq_g, dq_t = torch.empty_like(q), torch.empty_like(q)
                cfg = FlashConfig()
                key = ("lab_band_dq", q.shape, q.stride(), wl, wr, table is not None, cfg)
                plan = _PLANS.get(key) or _get_plan(key, lambda: {"dq": _dq_meta(q, k, v, wl, wr, None, 0, 1, cfg,
                                                                                   table is not None)})
                mk = _mode_args(q, None, (None,) * 3, table)
                dqf = {"gluon_dq": lambda: G.gluon_dq(do, q, k, v, lse2, delta, dq_g, scale, wl, wr, documents=table),
                       "triton_dq": lambda: _launch_dq(plan, q, k, v, do, lse2, delta, dq_t, scale, wl, wr, 1, mk, 0,
                                                       cfg)}
                for f in dqf.values():
                    f()
                if args.check:
                    errs["gluon_dq"] = (dq_g.float() - dq_t.float()).abs().max().item()
                timers.update({n: (lambda f=f: time_cuda(f)) for n, f in dqf.items()})
            times = interleaved_rounds(timers, args.rounds, start=ci)
            med = {n: median_spread(t) for n, t in times.items()}
            for n, (ms, spread) in med.items():
                is_dq = n.endswith("_dq")
                base = med["triton_dq" if is_dq else "triton"][0] if ("triton_dq" if is_dq else "triton") in med \
                    else float("nan")
                fl = 1.5 * flops if is_dq else flops  # dQ: three GEMMs of 2 D per pair
                row = dict(case=name, D=D, B=B, Hq=HEADS, N=N, impl=n, pass_="dq" if is_dq else "fwd", ms=ms,
                           spread=spread, tflops=tflops(fl, ms), speedup_vs_triton=base / ms,
                           visited_pairs=pairs * B * HEADS, max_err=errs.get(n, float("nan")))
                rows.append(row)
                print(f"{name:16s} D={D:3d} {n:11s} {ms:8.3f} ms (spread {spread:5.3f}) {row['tflops']:7.1f} TFLOP/s "
                      f"x{row['speedup_vs_triton']:.3f} vs Triton" + (f"  err {errs[n]:.2e}" if n in errs else ""),
                      flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    if args.out:
        path = write_csv([{("pass" if k == "pass_" else k): v for k, v in r.items()} for r in rows],
                         os.path.join(args.out, "gluon_band_bench.csv"))
        print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
