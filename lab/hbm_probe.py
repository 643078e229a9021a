"""Measured vs modelled HBM traffic of standard and flash attention (run under Nsight Compute).

One forward + backward of one method between ``cudaProfilerStart`` / ``cudaProfilerStop`` (and in an NVTX
range ``measure``), so that ``ncu --profile-from-start off`` sums the DRAM bytes of exactly those kernels::

    ncu --clock-control none --profile-from-start off \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv \\
        python -m lab.hbm_probe --method naive --B 4 --H 16 --N 2048 --D 64 > ncu_naive.csv
    python -m lab.hbm_probe --parse ncu_naive.csv ncu_triton.csv --B 4 --H 16 --N 2048 --D 64

``--parse`` sums each file's DRAM bytes and prints them beside the cost model
(:func:`attn_zoo.cost_model.standard_attention_cost` for ``naive``: S and P materialised, the causal mask as
its own ``masked_fill`` pass; :func:`attn_zoo.cost_model.flash_attention_cost` for ``triton``, FA2 loop order
at the kernel's tiles), as ``measured / model``. Plain Python: no Hydra.
"""

from __future__ import annotations

import argparse
import json
import sys

from lab.ncu import details_rows, to_number


def run_method(method: str, B: int, H: int, N: int, D: int, causal: bool = True) -> None:
    import torch

    from attn_zoo import AttentionSpec
    from eval.sweep import BENCH_BACKENDS

    spec = AttentionSpec(kind="flash", causal=causal)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    fn = BENCH_BACKENDS[method].build(spec, q, k, v)
    for _ in range(2):  # compile / autotune outside the measured range
        fn(q, k, v).backward(do)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push("measure")
    fn(q, k, v).backward(do)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()


def parse_ncu_csv(text: str) -> dict:
    """Sum ``dram__bytes_read.sum`` / ``dram__bytes_write.sum`` over all kernels of an ``ncu --csv`` report (the
    details page: one row per kernel and metric; :func:`lab.ncu.details_rows`). ``ValueError`` without a table."""
    tot = {"read": 0.0, "write": 0.0, "kernels": 0}
    names = set()
    for r in details_rows(text):
        name = r.get("Metric Name", "")
        if name not in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            continue
        val = to_number(r.get("Metric Value", "0"), r.get("Metric Unit", "byte")) or 0.0
        tot["read" if name.endswith("read.sum") else "write"] += val
        names.add(r.get("ID"))
    tot["kernels"] = len(names)
    tot["total"] = tot["read"] + tot["write"]
    return tot


def compare(paths, B, H, N, D, causal=True) -> list:
    from attn_zoo import cost_model as cm

    out = []
    for p in paths:
        method = "naive" if "naive" in p else "triton"
        with open(p) as f:
            meas = parse_ncu_csv(f.read())
        if method == "naive":
            model = cm.standard_attention_cost(B, H, N, D, dtype_bytes=2, mode="fwd_bwd", causal=causal,
                                               mask_pass=causal)
        else:
            model = cm.flash_attention_cost(B, H, N, D, dtype_bytes=2, mode="fwd_bwd", causal=causal)
        out.append({"method": method, "kernels": meas["kernels"], "measured_gb": meas["total"] / 1e9,
                    "model_gb": model.hbm_bytes / 1e9, "model_compulsory_gb": model.compulsory_bytes / 1e9,
                    "measured_over_model": meas["total"] / model.hbm_bytes})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="HBM bytes of standard vs flash attention (under ncu)")
    ap.add_argument("--method", choices=("naive", "triton", "sdpa_flash"), default=None)
    ap.add_argument("--parse", nargs="*", default=None, help="ncu CSV files to compare with the model")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--N", type=int, default=2048)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--non-causal", action="store_true")
    a = ap.parse_args(argv)
    if a.parse:
        rows = compare(a.parse, a.B, a.H, a.N, a.D, not a.non_causal)
        print(json.dumps(rows, indent=1))
        return 0
    if a.method is None:
        ap.error("give --method (to run under ncu) or --parse")
    run_method(a.method, a.B, a.H, a.N, a.D, not a.non_causal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
