"""GPU: the linear family's kernels launched through Triton's launcher against the kept compiled kernels
(``kernels._host.launch``, ``FAST_LAUNCH``), with fla in the same process (lab: not installed).

For each case it times one forward+backward: ``host_us`` (enqueue time, no sync inside the loop), ``bench_ms``
(``do_bench`` median: what the benchmarks report; host-bound when the host is slower than the GPU) and, for ours,
``graph_ms`` (the call replayed from a CUDA graph: GPU time alone). Cases, bf16, H 16, 16k tokens per call:
elu1 on precomputed features (D = Dv = 128, as ``eval.bench_linear``'s ``ours`` / ``fla_linear``) at N 512 / 4k /
16k, and the Taylor map (D 16, Dv 64) through ``attention(backend="auto")`` at 1k / 4k / 16k against fla's
``parallel_based``. Usage: ``python -m lab.launch_ab --out DIR`` (``--no-fla`` skips fla, whose first call on each
shape autotunes for about a minute).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as Fn

from eval.bench_common import env_info, host_us, time_cuda, time_cuda_graph


def _leaf(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def cases(with_fla: bool, families=("elu1", "taylor")):
    """(name, N, B, {impl: (fwd callable, leaves)}) per case."""
    import attn_zoo
    from kernels.linear import linear_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    H = 16
    for N in (512, 4096, 16384) if "elu1" in families else ():
        B = 16384 // N
        q, k, v = (torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fq, fk = Fn.elu(q) + 1, Fn.elu(k) + 1
        a = _leaf(fq, fk, v)
        impls = {"ours": (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True), a)}
        if with_fla:
            from fla.ops.linear_attn import chunk_linear_attn

            b = _leaf(*(t.transpose(1, 2).contiguous() for t in (fq, fk, v)))
            impls["fla"] = (lambda b=b: chunk_linear_attn(b[0], b[1], b[2], scale=1.0, normalize=True)[0], b)
        yield "elu1", N, B, impls
    spec = attn_zoo.AttentionSpec(kind="linear", causal=True, feature_map="taylor")
    for N in (1024, 4096, 16384) if "taylor" in families else ():
        B = 16384 // N
        q, k = (torch.randn(B, H, N, 16, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        v = torch.randn(B, H, N, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        a = _leaf(q, k, v)
        impls = {"ours": (lambda a=a: attn_zoo.attention(a[0], a[1], a[2], spec), a)}
        if with_fla:
            from fla.ops.based import parallel_based

            b = _leaf(*(t.transpose(1, 2).contiguous() for t in (q, k, v)))
            impls["fla"] = (lambda b=b: parallel_based(b[0], b[1], b[2], scale=16 ** -0.5, use_norm=True), b)
        yield "taylor", N, B, impls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--families", default="elu1,taylor", help="comma list of elu1, taylor")
    args = p.parse_args(argv)
    fams = tuple(args.families.split(","))
    if not fams or any(f not in ("elu1", "taylor") for f in fams):
        p.error(f"--families: {args.families!r}; allowed values: elu1, taylor (comma list)")
    from kernels import _host

    os.makedirs(args.out, exist_ok=True)
    rows = []
    for fam, N, B, impls in cases(not args.no_fla, fams):
        for name, (fn, leaves) in impls.items():
            do = torch.randn_like(fn())

            def fb(fn=fn, leaves=leaves, do=do):
                for t in leaves:
                    t.grad = None
                fn().backward(do)

            modes = (False, True) if name == "ours" else (None,)
            for fast in modes:
                if fast is not None:
                    _host.FAST_LAUNCH = fast
                fb()  # compile / keep the launchers
                r = dict(family=fam, N=N, B=B, impl=name if fast is None else f"ours_{'kept' if fast else 'triton'}",
                         host_us=host_us(fb, 50), bench_ms=time_cuda(fb, grad_to_none=leaves))
                if fast:
                    try:
                        r["graph_ms"] = time_cuda_graph(fb)
                    except Exception as e:  # noqa: BLE001  (a capture that fails is reported, the rest still runs)
                        r["graph_ms"], r["graph_error"] = float("nan"), f"{type(e).__name__}: {e}"[:200]
                rows.append(r)
                print(r, flush=True)
            _host.FAST_LAUNCH = True
    by = {(r["family"], r["N"], r["impl"]): r for r in rows}
    print(f"{'family':8} {'N':>6} {'host us triton':>15} {'host us kept':>13} {'ms triton':>10} {'ms kept':>8} "
          f"{'graph ms':>9} {'fla ms':>7} {'fla/kept':>9}")
    for (fam, N, impl), r in by.items():
        if impl != "ours_kept":
            continue
        t, f = by[fam, N, "ours_triton"], by.get((fam, N, "fla"))
        ratio = f"{f['bench_ms'] / r['bench_ms']:.2f}x" if f else "-"
        print(f"{fam:8} {N:>6} {t['host_us']:>15.0f} {r['host_us']:>13.0f} {t['bench_ms']:>10.3f} "
              f"{r['bench_ms']:>8.3f} {r['graph_ms']:>9.3f} {f['bench_ms'] if f else float('nan'):>7.3f} {ratio:>9}")
    with open(os.path.join(args.out, "launch_ab.json"), "w") as fh:
        json.dump(dict(env=env_info(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
