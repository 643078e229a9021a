"""Read-bandwidth ceiling by size (lab: not installed): how close a plain streaming read of X bytes gets to the copy
bandwidth, the denominator of the decode targets (issue "Best against best", item 3).

    python -m lab.read_ceiling --out results/h200/<date>/read_ceiling.json

A decode step at batch 1 and 16k context (32 heads, D 128, bf16) reads 268 MB of K and V; at 64k, 1.07 GB. Per
size (``--sizes-mb``), one bf16 buffer is read by a Triton kernel that only loads and sums (each program a
contiguous slice, one fp32 partial sum stored per program: the bytes written are negligible), timed as a CUDA-graph
replay with 1 call per graph (the graph's launch included, as ``lab.decode_probe`` times one decode call) and with
``--calls`` calls back to back in one graph (the steady state of a step's layers). Prints and writes the read
bandwidth as a fraction of the copy bandwidth of the same run (:func:`eval.bench_decode.copy_bandwidth`).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from eval.bench_common import env_info, int_list, time_cuda_graph


@triton.jit
def _read_sum(x_ptr, out_ptr, n, PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``p`` sums ``x[p * PER_PROG : (p + 1) * PER_PROG]`` (bounded by ``n``) in BLOCK-wide loads."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * PER_PROG
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.range(0, PER_PROG, BLOCK, num_stages=3):
        offs = base + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_sum(x: torch.Tensor, out: torch.Tensor, per_prog: int, block: int = 2048) -> torch.Tensor:
    """Sum of ``x`` (1-D) in ``cdiv(numel, per_prog)`` partial sums written to ``out``."""
    grid = (triton.cdiv(x.numel(), per_prog),)
    _read_sum[grid](x, out, x.numel(), PER_PROG=per_prog, BLOCK=block, num_warps=8)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file")
    p.add_argument("--sizes-mb", default="67,134,268,536,1074,2147")
    p.add_argument("--calls", type=int, default=10, help="calls per graph of the steady-state row (>= 2)")
    p.add_argument("--per-prog-kib", default="64,256,1024", help="bytes read per program, KiB (comma list)")
    a = p.parse_args(argv)
    if a.calls < 2:
        p.error(f"--calls must be >= 2, got {a.calls}")
    sizes_mb = int_list(a.sizes_mb, "--sizes-mb", "sizes in MB")  # before the CUDA check: fails on CPU too
    per_prog_kib = int_list(a.per_prog_kib, "--per-prog-kib", "KiB per program")
    if not torch.cuda.is_available():
        raise SystemExit("lab.read_ceiling needs a CUDA device")
    from eval.bench_decode import copy_bandwidth

    copy_gbps = copy_bandwidth()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s")
    rows = []
    for mb in sizes_mb:
        n = mb * 10**6 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for kib in per_prog_kib:
            per = kib * 1024 // 2
            out = torch.empty(triton.cdiv(n, per), device="cuda", dtype=torch.float32)
            ref = x.float().sum()
            got = read_sum(x, out, per).sum()
            ok = bool(torch.allclose(got, ref, rtol=1e-3, atol=1e-1 * n ** 0.5))
            row = dict(mb=mb, per_prog_kib=kib, programs=out.numel(), sum_ok=ok)
            for calls in (1, a.calls):
                ms = time_cuda_graph(lambda: read_sum(x, out, per), calls=calls)
                row[f"frac_calls{calls}"] = 2 * n / (ms * 1e-3) / 1e9 / copy_gbps
                row[f"us_calls{calls}"] = ms * 1e3
            rows.append(row)
            print(f"{mb:6d} MB  {kib:5d} KiB/program  {row['programs']:7d} programs  read / copy bandwidth: "
                  f"1 call {row['frac_calls1']:.3f} ({row['us_calls1']:.1f} us), {a.calls} calls "
                  f"{row[f'frac_calls{a.calls}']:.3f} ({row[f'us_calls{a.calls}']:.1f} us)  sum_ok {ok}", flush=True)
        del x
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(env=dict(env_info(), copy_gbps=copy_gbps), rows=rows), f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
