"""Backward-only timing of the Gluon backward with two consumers on band masks against the Triton backward (lab: not
installed; Hopper, issues 27 / 30).

``python -m lab.gluon_band_bwd_bench [--D 128,64] [--cases win1024_4k,win1024_16k,doc1024_16k,doc4096_16k]
[--impls triton,gluon_tdq,gluon_gdq,auto] [--rounds 5] [--out F.csv]`` (CSV also into ``$OUT/gluon_band_bwd.csv``
when ``$OUT`` is set).

Cases, bf16, 16k tokens per call (``B = 16384 // N``), ``Hq = Hkv = 16``: ``win1024_<N>`` a causal sliding window of
1024 keys (``window_size=(1023, 0)``) at N 4k / 16k; ``doc<L>_16k`` causal packed documents of fixed length ``L``
(1024, 4096) at N 16k. For each (case, D): one Triton forward (``out``, ``lse``), then
:func:`kernels.flash.flash_attn_bwd` alone timed (``eval.bench_common.time_cuda``: ``triton.testing.do_bench``
median) for each impl:

* ``triton``: ``FlashConfig(bwd_impl="triton")`` (bwd.py, the baseline);
* ``gluon_tdq``: ``bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="triton"`` (``_gl_bwd_dkdv2_kernel`` with
  the band constexprs, then the Triton dQ kernel);
* ``gluon_gdq``: the same with ``gluon_bwd_dq="gluon"`` (the Gluon dQ kernel; an error, e.g. before its band masks
  are merged, is reported in the row's ``error`` and the case goes on);
* ``auto``: ``FlashConfig()`` (what ``bwd_impl="auto"`` picks: ``kernels.flash.gluon.GLUON_AUTO_BWD_BANDS``).

Every impl's gradients are compared with the Triton backward's (max abs error relative to the largest gradient:
``rel_err``; > 2e-2 marks the row ``BAD``). Timing: ``--rounds`` rounds over the impls in rotating order
(``eval.bench_common.interleaved_rounds``), median and spread ((max - min) / median) per impl. TFLOP/s by the
FlashAttention convention (backward = 2.5 x the forward's ``4 * pairs * D`` per head) over the exact visited pairs of
the mask; ``speedup`` = Triton's median / the impl's.
"""

from __future__ import annotations

import argparse
import csv
import os

import torch

from eval.bench_common import flash_flops, int_list, interleaved_rounds, median_spread, tflops, time_cuda
from kernels import FlashConfig
from kernels.flash import flash_attn_bwd, flash_attn_fwd
from kernels.flash.documents import document_table

TOKENS, HEADS = 16384, 16
CASES = {  # name -> (N, window left edge or -1, document length or 0); all causal
    "win1024_4k": (4096, 1023, 0),
    "win1024_16k": (16384, 1023, 0),
    "doc1024_16k": (16384, -1, 1024),
    "doc4096_16k": (16384, -1, 4096),
}
IMPLS = {
    "triton": FlashConfig(bwd_impl="triton"),
    "gluon_tdq": FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="triton"),
    "gluon_gdq": FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="gluon"),
    "auto": FlashConfig(),
}


def _choices(allowed):
    def parse(s):
        vals = [x for x in s.split(",") if x]
        bad = [x for x in vals if x not in allowed]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"{s!r}: allowed values: {', '.join(allowed)}")
        return vals
    return parse


def visited_pairs_exact(N: int, win_left: int, doc_len: int) -> int:
    """Query-key pairs per (batch, head) of a causal mask with a left window edge (-1: none) and documents of fixed
    length ``doc_len`` (0: none), Nq = Nk = N."""
    i = torch.arange(N, dtype=torch.long)
    first = torch.zeros_like(i)
    if win_left >= 0:
        first = torch.maximum(first, i - win_left)
    if doc_len:
        first = torch.maximum(first, (i // doc_len) * doc_len)
    return int((i - first + 1).sum())


def bench_case(name: str, D: int, impls, rounds: int):
    N, wl, doc_len = CASES[name]
    B = TOKENS // N
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, HEADS, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    docs = None
    if doc_len:
        ids = (torch.arange(N, device="cuda") // doc_len).expand(B, N).contiguous()
        docs = document_table(ids, N)
    scale = D ** -0.5
    out, lse = flash_attn_fwd(q, k, v, scale, wl, 0, documents=docs, config=FlashConfig(fwd_impl="triton"))
    pairs = visited_pairs_exact(N, wl, doc_len)
    frac = pairs / (N * N)

    def run(cfg):
        return flash_attn_bwd(do, q, k, v, out, lse, scale, wl, 0, config=cfg, documents=docs)

    rows, timers, ref = {}, {}, None
    for impl in ["triton"] + [i for i in impls if i != "triton"]:
        row = dict(case=name, N=N, B=B, H=HEADS, D=D, window=wl, doc_len=doc_len, impl=impl, pairs_per_head=pairs)
        rows[impl] = row
        try:
            grads = run(IMPLS[impl])
            torch.cuda.synchronize()
        except Exception as e:  # e.g. the Gluon dQ before its band masks: report, go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            continue
        if ref is None:
            ref = grads
        else:
            rel = max((a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-6)
                      for a, b in zip(grads, ref))
            row["rel_err"] = f"{rel:.2e}"
            if rel > 2e-2:
                row["error"] = "BAD"
        timers[impl] = (lambda c=IMPLS[impl]: time_cuda(lambda: run(c)))
    if "triton" not in impls:
        rows.pop("triton")
        timers.pop("triton", None)
    times = interleaved_rounds(timers, rounds) if timers else {}
    base = None
    if "triton" in times:
        base = median_spread(times["triton"])[0]
    for impl, t in times.items():
        ms, spread = median_spread(t)
        r = rows[impl]
        r.update(bwd_ms=round(ms, 3), spread=round(spread, 3), rounds=len(t),
                 bwd_tflops=round(tflops(flash_flops(B, HEADS, N, D, visited_fraction=frac, mode="bwd"), ms), 1))
        if base is not None:
            r["speedup"] = round(base / ms, 3)
    return list(rows.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--D", default="128,64")
    ap.add_argument("--cases", type=_choices(CASES), default=list(CASES))
    ap.add_argument("--impls", type=_choices(IMPLS), default=list(IMPLS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    Ds = int_list(a.D, "--D", "head dims")  # before the CUDA check: fails on CPU too
    if not torch.cuda.is_available():
        raise SystemExit("lab.gluon_band_bwd_bench needs a CUDA device")
    if a.rounds < 1:
        raise SystemExit(f"--rounds {a.rounds} is not supported; allowed values: an integer >= 1")
    cols = ["case", "N", "B", "H", "D", "window", "doc_len", "impl", "pairs_per_head", "bwd_ms", "spread", "rounds",
            "bwd_tflops", "speedup", "rel_err", "error"]
    rows = []
    for D in Ds:
        for name in a.cases:
            for r in bench_case(name, D, a.impls, a.rounds):
                rows.append(r)
                print("  ".join(f"{c}={r[c]}" for c in cols if c in r), flush=True)
    outs = [a.out] if a.out else []
    if os.environ.get("OUT"):
        outs.append(os.path.join(os.environ["OUT"], "gluon_band_bwd.csv"))
    for path in outs:
        if os.path.isdir(path):  # (a folder, as lab/gluon_band_bench.py takes: the file goes inside)
            path = os.path.join(path, "gluon_band_bwd.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
