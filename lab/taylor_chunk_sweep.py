"""Time the fused chunked Taylor kernel (``kernels.taylor_chunk``) over its launch settings on a GPU (lab: not
installed). One process; per ``N`` (``B = tokens / N``): each config's forward and forward+backward (median ms,
``eval.bench_common.time_cuda``) and its errors against the fp32 chunked PyTorch form (first 2 heads); the parallel
form (``kernels.taylor.taylor_parallel``) timed beside it. bf16, causal, D 16, Dv 64, H 16 by default.

    python -m lab.taylor_chunk_sweep [--ns 1024,4096,16384] [--chunks 32,64] [--block-vs 16,32] \\
        [--warps 4,8] [--stages 1] [--fused 1] [--segments 1,auto,2,4,8] [--out results/h200/taylor_chunk_sweep.json]

``--segments``: ``TaylorChunkConfig.segments`` values (``auto``: ``None``, the automatic rule; the row's name
carries ``_ns<NS resolved>`` when that is above 1, ``auto`` appended for ``None``); each config is timed once per
resolved ``(NS, L)``, so values that resolve alike at an ``N`` (e.g. ``auto`` and 1 at 1k) run once.

A config that fails to compile or run prints its error's last line and the sweep goes on. Prints the best config
per ``N`` (fwd+bwd); writes every row to ``--out`` (JSON) when given.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os


def _segs(s: str):
    return [None if x.strip() == "auto" else int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ns", default="1024,4096,16384")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--dv", type=int, default=64)
    p.add_argument("--chunks", default="32,64")
    p.add_argument("--block-vs", default="16,32")
    p.add_argument("--warps", default="4,8")
    p.add_argument("--stages", default="1")
    p.add_argument("--fused", default="1")
    p.add_argument("--segments", default="1,auto", help="comma list of ints and/or 'auto' (TaylorChunkConfig.segments)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    from attn_zoo import AttentionSpec, attention
    from eval.bench_common import int_list, time_cuda
    from kernels.taylor import taylor_parallel
    from kernels.taylor_chunk import TaylorChunkConfig, taylor_chunk

    # the integer lists before the CUDA check: a bad one fails naming its flag on any machine
    Ns = int_list(args.ns, "--ns", "sequence lengths")
    lists = (int_list(args.chunks, "--chunks", "chunk sizes"), int_list(args.block_vs, "--block-vs", "value tiles"),
             int_list(args.warps, "--warps", "warp counts"), int_list(args.stages, "--stages", "stage counts"),
             int_list(args.fused, "--fused", "fused-backward flags", minimum=0, maximum=1))
    if not torch.cuda.is_available():
        raise SystemExit("lab.taylor_chunk_sweep needs a CUDA GPU")
    spec = AttentionSpec(kind="linear", causal=True, feature_map="taylor")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    H, D, Dv = args.heads, args.dim, args.dv
    rows = []
    for N in Ns:
        B = max(1, args.tokens // N)
        g = torch.Generator(device="cuda").manual_seed(N)
        q, k = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        v, do = (torch.randn(B, H, N, Dv, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        h2 = [t[:, :2].float().detach().clone().requires_grad_() for t in (q, k, v)]
        ref_o = attention(*h2, spec, backend="torch")
        ref = [ref_o, *torch.autograd.grad(ref_o, h2, do[:, :2].float())]

        def errs(fn):
            o = fn(*leaves)
            gr = torch.autograd.grad(o, leaves, do)
            got = [o[:, :2], *(x[:, :2] for x in gr)]
            return {n: ((x.float() - r).norm() / r.norm()).item()
                    for n, x, r in zip(("out", "dq", "dk", "dv"), got, ref)}

        def timed(fn):
            fwd = time_cuda(lambda: fn(*leaves), grad_to_none=leaves)
            fb = time_cuda(lambda: fn(*leaves).backward(do), grad_to_none=leaves)
            return fwd, fb

        cands = [("parallel", None, lambda a, b, c: taylor_parallel(a, b, c, eps=spec.eps))]
        seen = set()
        for C, bv, nw, ns, fu, sg in itertools.product(*lists, _segs(args.segments)):
            cfg = TaylorChunkConfig(chunk=C, block_v=bv, num_warps=nw, num_stages=ns, bwd_fused=bool(fu), segments=sg)
            nseg, L = cfg.resolve_segments(B * H, Dv, N, sms)
            key = (C, bv, nw, ns, fu, nseg, L)
            if key in seen:
                continue
            seen.add(key)
            tag = "" if nseg == 1 else f"_ns{nseg}{'auto' if sg is None else ''}"
            cands.append((f"chunk{C}_bv{bv}_w{nw}_s{ns}_{'fused' if fu else 'split'}{tag}", cfg,
                          lambda a, b, c, cfg=cfg: taylor_chunk(a, b, c, eps=spec.eps, config=cfg)))
        for name, cfg, fn in cands:
            try:
                e = errs(fn)
                fwd, fb = timed(fn)
                r = dict(N=N, B=B, H=H, D=D, Dv=Dv, method=name, fwd_ms=fwd, fwd_bwd_ms=fb,
                         **({} if cfg is None else dict(segments=cfg.segments,
                                                        ns=cfg.resolve_segments(B * H, Dv, N, sms)[0])),
                         **{f"rel_err_{x}": y for x, y in e.items()})
                print(f"N={N:6d} {name:42s} fwd {fwd:7.3f}  fwd+bwd {fb:7.3f} ms  err " +
                      " ".join(f"{x} {y:.1e}" for x, y in e.items()), flush=True)
            except Exception as ex:  # noqa: BLE001 - one failing config must not stop the sweep
                msg = (str(ex).strip().splitlines() or [""])[-1][:200]
                r = dict(N=N, B=B, method=name, error=f"{type(ex).__name__}: {msg}")
                print(f"N={N:6d} {name:42s} FAILED {r['error']}", flush=True)
            rows.append(r)
            torch.cuda.empty_cache()
        ok = [r for r in rows if r["N"] == N and "fwd_bwd_ms" in r and r["method"] != "parallel"]
        if ok:
            best = min(ok, key=lambda r: r["fwd_bwd_ms"])
            print(f"best at N={N}: {best['method']} fwd+bwd {best['fwd_bwd_ms']:.3f} ms", flush=True)
        if args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
