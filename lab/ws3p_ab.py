"""The persistent Gluon forward's work order, A/B on a GPU (lab: not installed): forward alone, bf16, 16k tokens per
call, H 16, D 128 (``--D``), ``gluon_ws3a`` (one query tile per program; the hardware hands out tiles greedily) against
``gluon_ws3p`` at several ``kernels.flash.gluon.PERSISTENT_SECTION_BYTES`` (``0`` in ``--sections`` means one
section of every head: the whole list longest-first, the snake balances it, L2 reuse left to chance), each with the
static schedule and, with ``--dynamic``, the dynamic one too (``kernels.flash.gluon.PERSISTENT_SCHEDULE``)::

    python -m lab.ws3p_ab [--N 4096,16384] [--masks causal,full,win1024] [--D 128,64] [--sections 16777216,0]
        [--dynamic] [--hkv 16] [--rounds 3]

``win<W>``: a causal sliding window of ``W`` keys (``W - 1`` before the query and itself).

Prints one line per (D, mask, N): TFLOP/s of each, and ws3p over ws3a; outputs checked bit for bit against ws3a.
A bad argument stops with a message naming its flag (exit 2; a bad integer list exits 1, as in every lab script);
exits 1 without a Hopper GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch

from eval.bench_common import int_list, time_cuda


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", default="4096,16384", help="sequence lengths (B = 16384 // N)")
    ap.add_argument("--masks", default="causal,full", help="causal, full or win<W> (a causal window of W keys)")
    ap.add_argument("--D", default="128", help="head dims (64, 128)")
    ap.add_argument("--sections", default=f"{16 << 20},0", help="section sizes in bytes (0: one section)")
    ap.add_argument("--hkv", type=int, default=16, help="K / V heads (16: MHA; 4: GQA 4:1)")
    ap.add_argument("--dynamic", action="store_true", help="also time the dynamic schedule at each section size")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, in rotating order (the median is kept)")
    a = ap.parse_args(argv)
    a.N = int_list(a.N, "--N", "sequence lengths")  # (SystemExit naming the flag for a bad list)
    a.sections = int_list(a.sections, "--sections", "section sizes in bytes", minimum=0)
    a.D = int_list(a.D, "--D", "head dims")
    masks = a.masks.split(",")
    bad = [m for m in masks if _window(m) is None]
    if bad:
        ap.error(f"--masks {a.masks!r}: {', '.join(bad)} unknown; allowed values: causal, full, win<W> with W >= 1")
    if set(a.D) - {64, 128}:
        ap.error(f"--D {a.D}: allowed values 64, 128")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: must be >= 1")
    if a.hkv < 1 or 16 % a.hkv:
        ap.error(f"--hkv {a.hkv}: must divide the 16 query heads (1, 2, 4, 8, 16)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("ws3p_ab: needs a Hopper GPU")
        return 1
    from kernels.flash import gluon as G

    H = 16
    print(f"# {torch.cuda.get_device_name()}; sections (bytes): {a.sections}")
    for D in a.D:
        for mask in masks:
            wl, wr = _window(mask)
            for N in a.N:
                B = max(1, 16384 // N)
                q, k, v = (torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16) for h in (H, a.hkv, a.hkv))
                flops = 4 * B * H * N * N * D * _fraction(mask, N)
                ref = G.gluon_flash_fwd(q, k, v, D ** -0.5, wl, wr, "gluon_ws3a")[0]
                runs = {"ws3a": lambda: G.gluon_flash_fwd(q, k, v, D ** -0.5, wl, wr, "gluon_ws3a")}
                for sb in a.sections:
                    for sched in ("static", "dynamic") if a.dynamic else ("static",):
                        runs[f"ws3p_{sched}@{sb}"] = (lambda sb=sb, sched=sched: _with(G, sb, sched, lambda: (
                            G.gluon_flash_fwd(q, k, v, D ** -0.5, wl, wr, "gluon_ws3p"))))
                same = all(torch.equal(f()[0], ref) for name, f in runs.items() if name != "ws3a")
                ms = {name: [] for name in runs}
                names = list(runs)
                for r in range(a.rounds):  # rotating order, median of the rounds
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        ms[name].append(time_cuda(runs[name], warmup=10, rep=50, at_least=False))
                tf = {name: flops / (sorted(v)[len(v) // 2] * 1e-3) / 1e12 for name, v in ms.items()}
                row = "  ".join(f"{n} {t:.1f} ({t / tf['ws3a']:.3f}x)" for n, t in tf.items())
                print(f"{mask:6s} D {D:3d} N {N:5d} B {B:2d} Hkv {a.hkv:2d}: {row}  bitwise={same}")
    return 0


def _window(mask: str):
    """``(win_left, win_right)`` of a ``--masks`` entry (-1: unbounded), or ``None`` for an unknown one."""
    if mask in ("causal", "full"):
        return (-1, 0) if mask == "causal" else (-1, -1)
    w = mask[3:] if mask.startswith("win") else ""
    return (int(w) - 1, 0) if w.isdigit() and int(w) >= 1 else None


def _fraction(mask: str, N: int) -> float:
    """The fraction of the N x N pairs the FLOP count takes, as ``eval.bench_flash`` counts them: causal 1/2 (the
    FlashAttention convention), full 1, a window the variant's own cost entry (``attn_zoo.variants.element_fraction``)."""
    if mask in ("causal", "full"):
        return 0.5 if mask == "causal" else 1.0
    from attn_zoo import AttentionSpec
    from attn_zoo.variants import element_fraction

    return element_fraction(AttentionSpec(kind="sliding_window", causal=True, window_size=_window(mask)), N)


def _with(G, section_bytes: int, schedule: str, fn):
    """``fn()`` with ``PERSISTENT_SECTION_BYTES`` (0: one section of every head) and ``PERSISTENT_SCHEDULE`` set,
    restored after."""
    old = G.PERSISTENT_SECTION_BYTES, G.PERSISTENT_SCHEDULE
    G.PERSISTENT_SECTION_BYTES = section_bytes if section_bytes > 0 else 1 << 60
    G.PERSISTENT_SCHEDULE = schedule
    try:
        return fn()
    finally:
        G.PERSISTENT_SECTION_BYTES, G.PERSISTENT_SCHEDULE = old


if __name__ == "__main__":
    sys.exit(main())
