"""Benchmark: our chunked Triton SSD kernel (Mamba-2) vs fla's chunked op, mamba_ssm and our exact flash kernel.

Plain Python (no Hydra), from the repo root: ``python -m eval.bench_ssd --out results/h200/ssd``. Needs CUDA.

All timings come from one run: median of CUDA events (:func:`eval.bench_common.time_cuda`), forward and
forward+backward, reported also as ns per token (time / (B * N)), and the peak extra CUDA memory of one
forward+backward (``fwd_bwd_peak_mib``: saved tensors, states, gradients; :func:`eval.bench_common.peak_memory`);
the flat-time-per-token check is the ratio
``ns/token at the largest N / at 2k``. Workload: bf16, ``H = --heads`` (16), head dim ``P = 64``, ``d_state
N_s = 128`` (one group), chunk 64, ``B * N = --tokens`` (32k; ``B = 1`` once ``N`` exceeds it), ``N = 512 .. 32k``.

Methods (same tensors for every SSD method; the scan only: ``x * dt`` and ``dt * A`` are precomputed)
* ``ours``: :func:`kernels.ssd.ssd_scan` with ``state_pass="parallel"`` (chunk-parallel: chunk states, a state pass
  over chunks, chunk outputs; the backward reversed; state snapshots in bf16, the carry fp32). ``--check`` (default on) adds ``max_rel_err``:
  ours (bf16) against :func:`attn_zoo.families.ssd.ssd_scan_chunked` in fp32 on the same values, output and the
  gradients of x, a, B, C (max abs error / (1 + max abs reference), the worst of them), at every ``N <= 8192``.
* ``ours_seq`` (``--state-pass parallel,sequential``): the same with ``state_pass="sequential"`` (the chunk states
  and the pass fused: one program per (b*h, N-block, P-block) walks the chunks); ``--seq-blocks 64x64,32x32``
  times each ``(N-block, P-block)``: ``ours_seq`` for 64x64, ``ours_seq_32x32`` etc. for the others. Checked as
  ``ours``. ``--state-pass auto``: row ``ours_auto`` (``ssd_scan``'s default choice). The ratio lines below are
  printed for every ``ours*`` row.
* ``ours_legacy`` (``--legacy``): the parallel pass in the former layout (``state_dtype=torch.float32``: fp32
  snapshots, twice the bytes; ``out_block_n=256``: the output kernel in one d_state step; backward unpipelined),
  the before of an A/B in the same process (the layout only: the ``dB``/``dC`` kernel's head sum and its split
  rule are the current ones).
* ``ours_group`` / ``ours_seq_group`` (``--out-group``): ``ours`` / ``ours_seq`` with ``out_mode="group"`` (the
  output kernel per group of heads: ``B``, ``C``, ``C B^T`` once for the heads sharing them).
* ``torch``: :func:`attn_zoo.families.ssd.ssd_scan_chunked` (plain PyTorch chunked form), up to 8k.
* ``fla_simple_gla``: ``fla.ops.simple_gla.chunk_simple_gla(q=C, k=B, v=x, g=a, scale=1)``: the same scan
  (a scalar log-decay per head and position) in fla's chunked kernels, B / C expanded to every head.
  Skipped (column empty, note printed) when fla does not import.
* ``fla_simple_gla_noguard`` (``--fla-noguard``): the same fla call with fla's triton-version guard lifted for
  the call (``fla.ops.common.chunk_o.IS_NVIDIA_HOPPER = False``). fla refuses its gated backward on Hopper with
  triton >= 3.4, < 3.7.1 (fla #640: that compiler gives wrong gradients there); this row is a *time* anchor only
  (its gradients are not used or checked), for stacks where that guard stops ``fla_simple_gla``'s backward.
* ``mamba_ssm``: ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` (dt, A, D=None inside its
  kernel; the SSD paper's own Triton kernels) when mamba_ssm imports, or, with ``--mamba-ssm-src DIR`` (which
  then wins over an installed mamba_ssm; the notes name the file used), from a mamba_ssm source tree (its
  pure-Triton SSD modules only: the package's ``__init__`` imports compiled CUDA extensions, which are not needed
  here and are skipped); skipped with a note otherwise.
* ``flash``: our exact causal attention kernel (:func:`kernels.flash.flash_attn`, ``H`` heads, ``D = 64``).

Writes ``ssd_bench.csv`` and ``ssd_bench.json`` under ``--out`` and prints the table and ratios.
``--time-budget-s`` (default 300): no new (length, method) case starts after it (the skipped ones get an error).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

from eval.bench_common import (POSITIVE_INT, add_time_budget, budget_spent, env_info, format_table, int_list,
                               name_list, peak_memory, require_cuda, time_cuda, try_call, write_results)


class _FlaNoGuard:
    """Lift fla's Hopper / triton-version guard of its gated backward (fla #640) for the duration of a call."""

    @staticmethod
    def available() -> bool:
        """fla's guard is where this class lifts it (another fla version: nothing to lift, the row is skipped)."""
        import importlib

        try:
            co = importlib.import_module("fla.ops.common.chunk_o")
        except Exception:  # noqa: BLE001
            return False
        return hasattr(co, "IS_NVIDIA_HOPPER")

    def __enter__(self):
        import fla.ops.common.chunk_o as co

        self.mod, self.old = co, co.IS_NVIDIA_HOPPER
        co.IS_NVIDIA_HOPPER = False

    def __exit__(self, *exc):
        self.mod.IS_NVIDIA_HOPPER = self.old


def import_mamba_chunk_scan(src=None):
    """``mamba_chunk_scan_combined`` from the source tree ``src`` when given (the folder holding ``mamba_ssm/``; the
    package's ``__init__``, which imports compiled extensions, is skipped; it wins over an installed mamba_ssm:
    the tree asked for is the one timed), else from the installed mamba_ssm. Raises ImportError."""
    if not src:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        return mamba_chunk_scan_combined
    import types

    pkg_dir = os.path.join(src, "mamba_ssm")
    if not os.path.isdir(pkg_dir):
        raise ImportError(f"--mamba-ssm-src {src!r} holds no mamba_ssm/ folder")
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        del sys.modules[name]
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [pkg_dir]
    sys.modules["mamba_ssm"] = pkg
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined


STATE_PASSES = ("parallel", "sequential", "auto")


def ours_variants(state_passes, seq_blocks, legacy=False, out_group=False):
    """``{row name: ssd_scan keywords}`` of our kernel: ``ours`` (parallel), ``ours_seq`` (sequential, 64x64 blocks),
    ``ours_seq_<n>x<p>`` (other blocks), ``ours_auto`` (the default choice), in the order given; with ``legacy``
    then ``ours_legacy`` (parallel, fp32 snapshots, the output kernel in one d_state step); with ``out_group``
    then ``ours_group`` / ``ours_seq_group`` (``ours`` / ``ours_seq`` with ``out_mode="group"``, for those timed)."""
    out = {}
    for sp in state_passes:
        if sp == "parallel":
            out["ours"] = dict(state_pass="parallel")
        elif sp == "auto":
            out["ours_auto"] = dict(state_pass="auto")
        else:
            for bn, bp in seq_blocks:
                name = "ours_seq" if (bn, bp) == (64, 64) else f"ours_seq_{bn}x{bp}"
                out[name] = dict(state_pass="sequential", seq_block=(bn, bp))
    if legacy:
        out["ours_legacy"] = dict(state_pass="parallel", state_dtype=torch.float32, out_block_n=256)
    if out_group:
        for name in ("ours", "ours_seq"):
            if name in out:
                out[name + "_group"] = dict(out[name], out_mode="group")
    return out


def parse_state_passes(text):
    """``--state-pass``: a comma list of :data:`STATE_PASSES` (:func:`eval.bench_common.name_list`: an empty item, as
    in ``parallel,,auto``, is refused too); raises SystemExit naming the flag otherwise."""
    return name_list(text, "--state-pass", "state passes", STATE_PASSES)


def parse_seq_blocks(text):
    """``--seq-blocks``: a comma list of ``<N-block>x<P-block>`` (each in ``kernels.ssd.SEQ_BLOCKS``)."""
    from kernels.ssd import SEQ_BLOCKS

    out = []
    for item in (v.strip() for v in text.split(",")):
        if not item and text.strip():  # 64x64,,32x32: an empty item, dropped in silence
            raise SystemExit(f"--seq-blocks {text!r}: give comma-separated <N-block>x<P-block> (an empty item), "
                             f"each one of {', '.join(map(str, SEQ_BLOCKS))}")
        if not item:
            continue
        try:
            bn, bp = (int(u) for u in item.split("x"))
        except ValueError:
            bn = bp = None
        if bn not in SEQ_BLOCKS or bp not in SEQ_BLOCKS:
            raise SystemExit(f"--seq-blocks {text!r}: each entry <N-block>x<P-block>, each one of "
                             f"{', '.join(map(str, SEQ_BLOCKS))}")
        out.append((bn, bp))
    if not out:
        raise SystemExit(f"--seq-blocks {text!r}: give comma-separated <N-block>x<P-block> (an empty list), each "
                         f"one of {', '.join(map(str, SEQ_BLOCKS))}")
    return list(dict.fromkeys(out))


def make_methods(B, H, N, P, NS, dtype, dev, notes, fla_noguard=False, mamba_src=None, ours=None):
    g = torch.Generator(device=dev).manual_seed(N)
    x = torch.randn(B, N, H, P, device=dev, dtype=dtype, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H, device=dev, generator=g) - 2)
    A = -torch.rand(H, device=dev, generator=g) * 4 - 0.5
    a = (dt * A).contiguous()
    Bm = (torch.randn(B, N, 1, NS, device=dev, dtype=dtype, generator=g) / NS ** 0.5)
    Cm = torch.randn(B, N, 1, NS, device=dev, dtype=dtype, generator=g)
    xdt = (x * dt[..., None].to(dtype)).contiguous()

    def leaf(*ts):
        return [t.detach().clone().requires_grad_() for t in ts]

    M = {}
    from kernels.ssd import ssd_scan

    for name, kw in (ours if ours is not None else {"ours": dict(state_pass="parallel")}).items():
        ins = leaf(xdt, a, Bm, Cm)
        M[name] = (lambda i=ins, kw=kw: ssd_scan(i[0], i[1], i[2], i[3], chunk_size=64, **kw)[0], ins)
    if N <= 8192:
        from attn_zoo.families.ssd import ssd_scan_chunked

        ins = leaf(xdt, a, Bm, Cm)
        M["torch"] = (lambda i=ins: ssd_scan_chunked(i[0], i[1], i[2], i[3], chunk_size=64)[0], ins)
    try:
        from fla.ops.simple_gla import chunk_simple_gla

        q, k = Cm.expand(B, N, H, NS).contiguous(), Bm.expand(B, N, H, NS).contiguous()
        ins = leaf(q, k, xdt)
        M["fla_simple_gla"] = (lambda i=ins: chunk_simple_gla(i[0], i[1], i[2], g=a, scale=1.0)[0], ins)
        if fla_noguard and not _FlaNoGuard.available():
            notes.add("fla_simple_gla_noguard skipped: this fla has no fla.ops.common.chunk_o.IS_NVIDIA_HOPPER guard "
                      "to lift")
        elif fla_noguard:
            ins = leaf(q, k, xdt)  # timed inside _FlaNoGuard (main)
            M["fla_simple_gla_noguard"] = (lambda i=ins: chunk_simple_gla(i[0], i[1], i[2], g=a, scale=1.0)[0], ins)
    except Exception as e:  # noqa: BLE001
        notes.add(f"fla_simple_gla skipped: fla does not import ({type(e).__name__}: {e})")
    try:
        mamba_chunk_scan_combined = import_mamba_chunk_scan(mamba_src)
        notes.add(f"mamba_ssm from {getattr(sys.modules.get('mamba_ssm.ops.triton.ssd_combined'), '__file__', '?')}")
        ins = leaf(x, dt, A, Bm, Cm)
        M["mamba_ssm"] = (lambda i=ins: mamba_chunk_scan_combined(i[0], i[1], i[2], i[3], i[4], chunk_size=64), ins)
    except Exception as e:  # noqa: BLE001
        notes.add(f"mamba_ssm skipped: mamba_ssm does not import ({type(e).__name__}: {e})")
    try:
        from kernels.flash import flash_attn

        q, k, v = (torch.randn(B, H, N, P, device=dev, dtype=dtype, generator=g) for _ in range(3))
        ins = leaf(q, k, v)
        M["flash"] = (lambda i=ins: flash_attn(i[0], i[1], i[2], causal=True), ins)
    except Exception as e:  # noqa: BLE001
        notes.add(f"flash skipped: {type(e).__name__}: {e}")
    return M


def check_ours(B, H, N, P, NS, dev, **kw):
    """Worst relative error of ours (bf16; ``kw``: ``ssd_scan``'s ``state_pass`` / ``seq_block``) against the fp32
    chunked PyTorch form on the same values."""
    from attn_zoo.families.ssd import ssd_scan_chunked
    from kernels.ssd import ssd_scan

    g = torch.Generator(device=dev).manual_seed(N + 1)
    x = torch.randn(B, N, H, P, device=dev, generator=g).bfloat16()
    a = -torch.nn.functional.softplus(torch.randn(B, N, H, device=dev, generator=g) - 2) * 2
    Bm = (torch.randn(B, N, 1, NS, device=dev, generator=g) / NS ** 0.5).bfloat16()
    Cm = torch.randn(B, N, 1, NS, device=dev, generator=g).bfloat16()
    dy = torch.randn(B, N, H, P, device=dev, generator=g)
    ins = [t.detach().clone().requires_grad_() for t in (x, a, Bm, Cm)]
    ref = [t.detach().float().requires_grad_() for t in (x, a, Bm, Cm)]
    y = ssd_scan(*ins, chunk_size=64, **kw)[0]
    yr = ssd_scan_chunked(*ref, chunk_size=64)[0]
    gs = torch.autograd.grad((y.float() * dy).sum(), ins)
    gr = torch.autograd.grad((yr * dy).sum(), ref)
    return max(((o.float() - r).abs().max() / (1 + r.abs().max())).item() for o, r in zip([y, *gs], [yr, *gr]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (ssd_bench.csv / .json)")
    ap.add_argument("--heads", type=POSITIVE_INT, default=16)
    ap.add_argument("--tokens", type=POSITIVE_INT, default=32768, help="B * N per shape")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--d-state", type=POSITIVE_INT, default=128)
    ap.add_argument("--head-dim", type=POSITIVE_INT, default=64)
    add_time_budget(ap, 300.0)
    ap.add_argument("--state-pass", default="parallel",
                    help="comma list of our kernel's state passes to time: parallel (row ours), sequential "
                         "(rows ours_seq*), auto (row ours_auto)")
    ap.add_argument("--legacy", action="store_true",
                    help="also row ours_legacy: the parallel pass with fp32 state snapshots and the one-step output "
                         "kernel (the former layout, an A/B in the same run)")
    ap.add_argument("--out-group", action="store_true",
                    help="also rows ours_group / ours_seq_group: the output kernel per group of heads "
                         "(ssd_scan out_mode='group')")
    ap.add_argument("--seq-blocks", default="64x64",
                    help="comma list of <N-block>x<P-block> of the sequential pass (64x64: row ours_seq, others "
                         "ours_seq_<n>x<p>)")
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="ours against the fp32 chunked PyTorch form at N <= 8192 (max_rel_err column)")
    ap.add_argument("--fla-noguard", action="store_true",
                    help="also time fla with its triton-version guard lifted (fla #640; a time anchor only)")
    ap.add_argument("--mamba-ssm-src", default=None,
                    help="a mamba_ssm source tree (the folder holding mamba_ssm/) to import its Triton SSD from")
    args = ap.parse_args(argv)
    lengths = int_list(args.lengths, "--lengths", "sequence lengths")
    if args.mamba_ssm_src and not os.path.isdir(os.path.join(args.mamba_ssm_src, "mamba_ssm")):
        raise SystemExit(f"--mamba-ssm-src {args.mamba_ssm_src!r}: no mamba_ssm/ folder there")
    ours = ours_variants(parse_state_passes(args.state_pass), parse_seq_blocks(args.seq_blocks), args.legacy,
                         args.out_group)
    t_start = time.time()
    require_cuda("bench_ssd")
    dev, dtype = "cuda", torch.bfloat16
    rows, notes = [], set()
    for N in lengths:
        B = max(1, args.tokens // N)
        methods = make_methods(B, args.heads, N, args.head_dim, args.d_state, dtype, dev, notes,
                               fla_noguard=args.fla_noguard, mamba_src=args.mamba_ssm_src, ours=ours)
        for name, (fwd, ins) in methods.items():
            row = {"method": name, "B": B, "N": N, "H": args.heads, "P": args.head_dim, "d_state": args.d_state}
            if budget_spent(t_start, args.time_budget_s, f"{name} N={N}"):
                rows.append(dict(row, error="skipped (time budget)"))
                continue
            if name in ours and args.check and N <= 8192:
                err = try_call(lambda: check_ours(B, args.heads, N, args.head_dim, args.d_state, dev, **ours[name]))
                row["max_rel_err"] = err
                if isinstance(err, str) or err > 6e-2:
                    notes.add(f"{name} CHECK FAILED at N={N}: {err}")
            with (_FlaNoGuard() if name.endswith("_noguard") else contextlib.nullcontext()):
                ms_f = try_call(lambda: time_cuda(lambda: fwd()))
                if isinstance(ms_f, str):
                    rows.append(dict(row, error=ms_f))
                    continue
                do = torch.randn_like(fwd())

                def fb():
                    fwd().backward(do)

                ms_fb = try_call(lambda: time_cuda(fb, grad_to_none=ins))
                for t in ins:  # the peak counts the gradients' allocation too
                    t.grad = None
                mem = try_call(lambda: peak_memory(fb)) if not isinstance(ms_fb, str) else None
                for t in ins:
                    t.grad = None
            if isinstance(mem, int):
                row["fwd_bwd_peak_mib"] = mem / 2 ** 20
            row.update(fwd_ms=ms_f, fwd_bwd_ms=ms_fb if not isinstance(ms_fb, str) else float("nan"),
                       fwd_ns_per_token=ms_f * 1e6 / (B * N),
                       fwd_bwd_ns_per_token=(ms_fb * 1e6 / (B * N)) if not isinstance(ms_fb, str) else float("nan"))
            if isinstance(ms_fb, str):
                row["error"] = ms_fb
            rows.append(row)
            print(row, flush=True)
        del methods
        torch.cuda.empty_cache()
    cols = ["method", "B", "N", "fwd_ms", "fwd_bwd_ms", "fwd_ns_per_token", "fwd_bwd_ns_per_token", "fwd_bwd_peak_mib",
            "max_rel_err", "error"]
    print(format_table(rows, cols))
    by = {(r["method"], r["N"]): r for r in rows if "fwd_bwd_ms" in r}
    for me in ours:
        for ref in ("fla_simple_gla", "fla_simple_gla_noguard", "mamba_ssm"):
            for N in sorted({n for (_, n) in by}):
                if (me, N) in by and (ref, N) in by:
                    print(f"N={N}: {me} fwd+bwd speedup over {ref}: "
                          f"{by[(ref, N)]['fwd_bwd_ms'] / by[(me, N)]['fwd_bwd_ms']:.2f}x")
        if me != "ours":
            for N in sorted({n for (_, n) in by}):
                if (me, N) in by and ("ours", N) in by:
                    print(f"N={N}: {me} vs ours (parallel): fwd {by[('ours', N)]['fwd_ms'] / by[(me, N)]['fwd_ms']:.2f}x"
                          f", fwd+bwd {by[('ours', N)]['fwd_bwd_ms'] / by[(me, N)]['fwd_bwd_ms']:.2f}x")
        ns = sorted(n for (m, n) in by if m == me)
        if ns and (me, 2048) in by:
            print(f"{me} flatness (fwd+bwd ns/token, N={ns[-1]} / N=2048): "
                  f"{by[(me, ns[-1])]['fwd_bwd_ns_per_token'] / by[(me, 2048)]['fwd_bwd_ns_per_token']:.2f}")
    for n in sorted(notes):
        print("note:", n)
    print("wrote", write_results(rows, args.out, "ssd_bench", dict(env_info(), notes=sorted(notes))))


if __name__ == "__main__":
    main()
