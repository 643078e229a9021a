"""Benchmark: the delta rule's backends (``attn_zoo.families.deltanet``) forward and forward+backward on CUDA.

Plain Python (no Hydra), from the repo root: ``python -m eval.bench_delta --out results/h200/delta``. Needs CUDA.

Methods, on the same bf16 tensors (``q, k`` L2-normalized, ``beta`` in (0, 1), ``g`` a log-decay for the gated
rule; what the mixers pass under bf16-mixed), for ``--kinds`` ``deltanet`` and ``gated_deltanet``:

* ``naive``: :func:`~attn_zoo.families.deltanet.delta_rule_naive` (a Python loop over positions), up to
  ``--naive-max-t`` (default 1024; it is the slow one);
* ``chunk``: :func:`~attn_zoo.families.deltanet.delta_rule_chunk` (chunked PyTorch, WY / UT transform,
  ``--chunk-size`` 64);
* ``fla``: fla's ``chunk_delta_rule`` / ``chunk_gated_delta_rule`` when fla imports (skipped with a note
  otherwise). On Hopper with triton in [3.4.0, 3.7.1) fla refuses the gated backward (fla issue #640): that
  row gets the error text and ``fwd_bwd_ms`` NaN.

Also ``auto`` (the backend ``backend="auto"`` picks here) in each row, and ``max_rel_err`` for ``chunk`` and
``fla`` at ``T <= --check-max-t`` (1024): output and the gradients of q, k, v, beta (and g) against the fp32 naive
loop on the same bf16-rounded values (max abs error / (1 + max abs reference), the worst of them).

Workload: ``B * T = --tokens`` (16384; ``B = 1`` past it), ``H = --heads`` (4), ``D = --head-dim`` (64),
``T = --lengths`` (256 .. 4096). Times: median of CUDA events (:func:`eval.bench_common.time_cuda`), ms and
tokens/s (fwd+bwd); on CUDA also ``fwd_bwd_peak_mib``, the peak extra memory of one forward+backward (saved tensors,
states, gradients; :func:`eval.bench_common.peak_memory`). Writes ``delta_bench.csv`` and ``delta_bench.json`` under ``--out`` and prints the table.
``--time-budget-s`` (default 240): no new (kind, length, method) case starts after it (those rows get
``error = skipped (time budget)``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from eval.bench_common import (NONNEG_INT, POSITIVE_INT, add_time_budget, budget_spent, env_info, format_table,
                               int_list, peak_memory, time_cpu, time_cuda, try_call, write_csv, write_json)


def make_inputs(B, T, H, D, gated, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed + T)
    bf = torch.bfloat16
    q = F.normalize(torch.randn(B, T, H, D, device=dev, generator=g), dim=-1).to(bf)
    k = F.normalize(torch.randn(B, T, H, D, device=dev, generator=g), dim=-1).to(bf)
    v = torch.randn(B, T, H, D, device=dev, generator=g).to(bf)
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev, generator=g)).to(bf)
    lg = -F.softplus(torch.randn(B, T, H, device=dev, generator=g)) * 0.5 if gated else None  # fp32, as the mixer
    return [q, k, v, beta] + ([lg] if gated else [])


def methods(gated, chunk_size, notes, dev):
    from attn_zoo.families import deltanet as dn

    M = {"naive": lambda q, k, v, b, lg=None: dn.delta_rule_naive(q, k, v, b, lg),
         "chunk": lambda q, k, v, b, lg=None: dn.delta_rule_chunk(q, k, v, b, lg, chunk_size=chunk_size)}
    try:
        dn._fla(gated)
        if dev != "cuda":
            raise ImportError("fla runs on CUDA only")
        M["fla"] = lambda q, k, v, b, lg=None: dn.delta_rule(q, k, v, b, lg, backend="fla")
    except ImportError as e:
        notes.add(f"fla skipped: {e}")
    return M


def rel_err(fn, ins):
    """Worst of output and input gradients: fn on bf16 inputs against the fp32 naive loop on the same values."""
    from attn_zoo.families.deltanet import delta_rule_naive

    a = [t.detach().clone().requires_grad_() for t in ins]
    r = [t.detach().float().requires_grad_() for t in ins]
    o = fn(*a)[0]
    orf = delta_rule_naive(*r)[0]
    do = torch.randn_like(orf)
    ga = torch.autograd.grad((o.float() * do).sum(), a)
    gr = torch.autograd.grad((orf * do).sum(), r)
    return max(((x.float() - y).abs().max() / (1 + y.abs().max())).item() for x, y in zip([o, *ga], [orf, *gr]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (delta_bench.csv / .json)")
    ap.add_argument("--kinds", default="deltanet,gated_deltanet")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--tokens", type=POSITIVE_INT, default=16384, help="B * T per shape")
    ap.add_argument("--heads", type=POSITIVE_INT, default=4)
    ap.add_argument("--head-dim", type=POSITIVE_INT, default=64)
    ap.add_argument("--chunk-size", type=POSITIVE_INT, default=64)
    ap.add_argument("--naive-max-t", type=NONNEG_INT, default=1024, help="time the naive loop up to this T (0: off)")
    ap.add_argument("--check-max-t", type=NONNEG_INT, default=1024,
                    help="max_rel_err of chunk / fla up to this T (0: off)")
    add_time_budget(ap, 240.0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run only (wall-clock median of 3 calls, no fla)")
    args = ap.parse_args(argv)
    from attn_zoo.families.deltanet import MIXER_GATED, pick_backend

    lengths = int_list(args.lengths, "--lengths", "sequence lengths")  # before the CUDA check: fails on CPU too
    kinds = args.kinds.split(",")
    for kind in kinds:
        if kind not in MIXER_GATED:
            raise SystemExit(f"--kinds: {kind!r} is not supported; allowed values: {', '.join(MIXER_GATED)}")
    t_start = time.time()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_delta needs a CUDA device (or --device cpu for a smoke run)")

    timer = time_cuda if dev == "cuda" else time_cpu
    rows, notes = [], set()
    for kind in kinds:
        gated = MIXER_GATED[kind]
        M = methods(gated, args.chunk_size, notes, dev)
        for T in lengths:
            B = max(1, args.tokens // T)
            ins = make_inputs(B, T, args.heads, args.head_dim, gated, dev)
            auto = pick_backend(ins[0], gated)
            for name, fn in M.items():
                row = {"kind": kind, "method": name, "auto": auto, "B": B, "T": T, "H": args.heads,
                       "D": args.head_dim}
                if name == "naive" and T > args.naive_max_t:
                    continue
                if budget_spent(t_start, args.time_budget_s, f"{kind} {name} T={T}"):
                    rows.append(dict(row, error="skipped (time budget)"))
                    continue
                if name != "naive" and T <= args.check_max_t:
                    err = try_call(lambda: rel_err(fn, ins))
                    row["max_rel_err"] = err
                    if isinstance(err, str) or err > 5e-2:
                        notes.add(f"{kind} {name} check at T={T}: {err}")
                leaves = [t.detach().clone().requires_grad_() for t in ins]
                ms_f = try_call(lambda: timer(lambda: fn(*leaves)))
                if isinstance(ms_f, str):
                    rows.append(dict(row, error=ms_f))
                    continue
                do = torch.randn_like(fn(*leaves)[0])

                def fb():
                    fn(*leaves)[0].backward(do)

                ms_fb = try_call(lambda: timer(fb, grad_to_none=leaves))
                ok = not isinstance(ms_fb, str)
                row.update(fwd_ms=ms_f, fwd_bwd_ms=ms_fb if ok else float("nan"),
                           fwd_bwd_ktok_s=(B * T / ms_fb) if ok else float("nan"))
                if ok and dev == "cuda":  # the peak counts the gradients' allocation too
                    for t in leaves:
                        t.grad = None
                    mem = try_call(lambda: peak_memory(fb))
                    if isinstance(mem, int):
                        row["fwd_bwd_peak_mib"] = mem / 2 ** 20
                if not ok:
                    row["error"] = ms_fb
                rows.append(row)
                print(row, flush=True)
            del ins
            if dev == "cuda":
                torch.cuda.empty_cache()
    cols = ["kind", "method", "auto", "B", "T", "fwd_ms", "fwd_bwd_ms", "fwd_bwd_ktok_s", "fwd_bwd_peak_mib",
            "max_rel_err", "error"]
    print(format_table(rows, cols))
    by = {(r["kind"], r["method"], r["T"]): r for r in rows if r.get("fwd_bwd_ms") == r.get("fwd_bwd_ms")
          and "fwd_bwd_ms" in r}
    for (kind, m, T), r in sorted(by.items()):
        if m == "chunk" and (kind, "naive", T) in by:
            sp = by[(kind, "naive", T)]["fwd_bwd_ms"] / r["fwd_bwd_ms"]
            print(f"{kind} T={T}: chunk fwd+bwd speedup over naive: {sp:.1f}x")
    for n in sorted(notes):
        print("note:", n)
    env = dict(env_info(), notes=sorted(notes))
    os.makedirs(args.out, exist_ok=True)
    write_csv(rows, os.path.join(args.out, "delta_bench.csv"), cols[:5] + ["H", "D"] + cols[5:])
    write_json(rows, os.path.join(args.out, "delta_bench.json"), env)
    print("wrote", os.path.join(args.out, "delta_bench.csv"))


if __name__ == "__main__":
    main()
