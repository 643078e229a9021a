"""Where decode's time goes against SDPA's (lab: not installed): an Nsight Compute profile of the split-K decode
kernels and of the kernels SDPA picks on the same contiguous cache (issue 29: decode at >= 0.9 of copy bandwidth and
ahead of SDPA, "or a profile saying why and what would close it"). bf16, D 128; one GPU call::

    python -m lab.decode_profile --out results/h200/<date>/decode_profile [--calls 2] [--budget-s 140]

Cases (names of :data:`lab.decode_probe.FINAL_CASES`, contiguous only): ``mha_b1_16k``, ``gqa32:8_b1_64k``,
``gqa32:8_b1_64k_nq8`` (``--cases`` to choose). Per case one process runs under ``ncu`` (``--worker``); it times
every method first (CUDA graph of ``--graph-calls`` calls, the steady state of ``lab.decode_probe --compare
--calls-per-graph 10``), then runs ``--calls`` calls of each method on its own CUDA stream between
``cudaProfilerStart`` / ``cudaProfilerStop`` -- ncu runs with ``--profile-from-start off``, as
:mod:`lab.hbm_probe` does, so warm-up, compilation and the timing are not profiled. The methods, in this order:

- ``sdpa``: ``F.scaled_dot_product_attention`` as SDPA chooses by default (``Nq > 1``: the bottom-right causal bool
  mask of ``lab.decode_probe``); the backend it picks (``torch._fused_sdp_choice``) and the kernels it launched are
  recorded;
- ``ours``: :func:`kernels.decode.decode_run` of the default :func:`kernels.decode.decode_plan` (``_decode_fwd``,
  and ``_decode_merge`` where the plan has a merge kernel);
- ``ours_deep`` (not with ``--no-deep``): half the default split count, 4 stages (``lab.decode_probe``'s ``deep``);
- ``sdpa_nomask`` (``Nq > 1`` only): SDPA without the mask (a flash kernel; another result, a speed reference).

Profiled rows are matched to methods by their CUDA stream (one per method), else by order (each method's kernels
follow the previous method's; ours launch a known number of kernels). Metrics (``--csv --page raw --print-units
base``): :data:`METRICS`; where ncu does not know one of them, the run is repeated with :data:`MIN_METRICS`. Written to
``--out``: ``decode_profile_kernels.csv`` (every profiled launch), ``decode_profile.csv`` (per case, method and
kernel: time per call, share of the method's kernel time, DRAM bytes and throughput, grid, registers, occupancy,
waves), ``decode_profile_methods.csv`` (per case and method: the split kernel alone, the merge's share, kernels end
to end, the CUDA-graph time, as fractions of the copy bandwidth of the same process), ``summary.md``; and per case
``case_<name>.json`` (the worker's record), ``ncu_<name>.csv`` (ncu's report), ``run_<name>.log``.

Without ``ncu`` on PATH (or when it profiles nothing, e.g. no permission for the GPU counters) each case runs under
``torch.profiler`` instead, with a message saying so: kernel durations, grids, registers and the estimated occupancy
(CUPTI activity records), no DRAM counters. ``--parse`` rebuilds the CSVs and summary from the files in ``--out`` (no
GPU). Under ncu the kernels run one at a time with the L2 flushed before each (``--cache-control all``; ``none`` to
keep it): the merge kernel then reads the split partials from DRAM, where in the timed graph they come from L2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from lab.ncu import raw_rows

DEFAULT_CASES = ("mha_b1_16k", "gqa32:8_b1_64k", "gqa32:8_b1_64k_nq8")
OURS_KERNELS = ("_decode_fwd", "_decode_merge")  # the Triton kernels of kernels/decode.py as ncu names them
SPLIT_KERNEL, MERGE_KERNEL = OURS_KERNELS
# metric -> (column, factor from the SI base unit ncu reports with --print-units base)
METRICS = {
    "gpu__time_duration.sum": ("duration_us", 1e6),
    "dram__bytes_read.sum": ("dram_read_bytes", 1.0),
    "dram__bytes_write.sum": ("dram_write_bytes", 1.0),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("dram_pct_peak", 1.0),
    "launch__grid_size": ("grid_size", 1.0),
    "launch__block_size": ("block_size", 1.0),
    "launch__registers_per_thread": ("registers", 1.0),
    "launch__shared_mem_per_block_dynamic": ("smem_dynamic_bytes", 1.0),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved_occupancy_pct", 1.0),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical_occupancy_pct", 1.0),
    "launch__waves_per_multiprocessor": ("waves_per_sm", 1.0),
    "launch__occupancy_limit_registers": ("occ_limit_registers", 1.0),
    "launch__occupancy_limit_shared_mem": ("occ_limit_smem", 1.0),
}
MIN_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "launch__grid_size", "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
               "launch__waves_per_multiprocessor")
KERNEL_COLUMNS = ["case", "method", "call", "kernel", "duration_us", "dram_read_bytes", "dram_write_bytes",
                  "dram_read_gbps", "dram_pct_peak", "grid_size", "block_size", "registers", "smem_dynamic_bytes",
                  "achieved_occupancy_pct", "theoretical_occupancy_pct", "waves_per_sm", "occ_limit_registers",
                  "occ_limit_smem", "stream", "tracer", "kernel_full"]
MIN_CASE_S = 20.0  # a case is not started with less budget left
_DEVICE, _DTYPE = "cuda", "bfloat16"  # (a CPU dry run of the worker patches them)


def safe_name(case: str) -> str:
    """A case name as a file name part (``gqa32:8_b1_64k`` -> ``gqa32-8_b1_64k``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", case)


def short_kernel(name: str) -> str:
    """A kernel's name without its parameter list, return type or template arguments (``void
    pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<...>>(Flash_fwd_params)`` ->
    ``pytorch_flash::flash_fwd_splitkv_kernel``); Triton's names (``_decode_fwd``) are already short."""
    s = name.strip()
    depth, cut = 0, []
    for ch in s:  # drop <...> and (...) at any depth
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            cut.append(ch)
    s = "".join(cut).strip()
    s = s.split()[-1] if s else name.strip()
    return s or name.strip()


def is_ours(kernel: str) -> bool:
    return short_kernel(kernel) in OURS_KERNELS


def known_cases() -> Dict[str, tuple]:
    """Case name -> ``(name, B, Hq, Hkv, context, page_size or None, Nq)``, the contiguous ones of
    :data:`lab.decode_probe.FINAL_CASES`."""
    from lab.decode_probe import FINAL_CASES

    return {c[0]: c for c in FINAL_CASES if c[5] is None}


# ------------------------------------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.decode_profile",
                                description="Nsight Compute profile of the decode kernels against SDPA's (issue 29)")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help="case names, comma-separated (contiguous cases of lab.decode_probe.FINAL_CASES)")
    p.add_argument("--calls", type=int, default=2, help="profiled calls per method (1-20)")
    p.add_argument("--graph-calls", type=int, default=10,
                   help="calls per CUDA graph for the end-to-end time (1-100; 10 as decode_probe --compare)")
    p.add_argument("--budget-s", type=float, default=140.0,
                   help=f"wall-clock budget of the whole run; a case is not started with < {MIN_CASE_S:.0f} s left")
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute command (name on PATH or a path)")
    p.add_argument("--tracer", default="auto", choices=("auto", "ncu", "torch"),
                   help="auto: ncu where found, else torch.profiler (no DRAM counters)")
    p.add_argument("--cache-control", default="all", choices=("all", "none"),
                   help="ncu --cache-control: all flushes the L2 before each profiled kernel")
    p.add_argument("--no-deep", action="store_true", help="leave out ours_deep (half the splits, 4 stages)")
    p.add_argument("--parse", action="store_true", help="rebuild the CSVs and summary.md from the files in --out")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one case, run under the tracer
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked: exits with status 2 and a message naming the argument and its allowed values for
    ``--calls`` outside 1-20, ``--graph-calls`` outside 1-100, ``--budget-s`` below ``MIN_CASE_S``, an unknown or
    paged case, an empty ``--cases``, ``--worker`` without one ``--case``, ``--parse`` of an ``--out`` that is no
    folder."""
    p = build_parser()
    a = p.parse_args(argv)
    if not 1 <= a.calls <= 20:
        p.error(f"--calls must be in 1-20, got {a.calls}")
    if not 1 <= a.graph_calls <= 100:
        p.error(f"--graph-calls must be in 1-100, got {a.graph_calls}")
    if a.parse and not os.path.isdir(a.out):
        p.error(f"--parse reads an earlier run's --out folder; {a.out!r} is not a folder")
    if not a.parse and not a.budget_s >= MIN_CASE_S:
        p.error(f"--budget-s must be >= {MIN_CASE_S:.0f}, got {a.budget_s}")
    known = known_cases()
    a.case_list = [c for c in a.cases.split(",") if c]
    if a.worker:
        if not a.case:
            p.error("--worker needs --case NAME")
        a.case_list = [a.case]
    if not a.case_list:
        p.error(f"--cases is empty; allowed values: {', '.join(known)}")
    bad = [c for c in a.case_list if c not in known]
    if bad:
        p.error(f"--cases: unknown or paged case(s) {', '.join(bad)}; allowed values: {', '.join(known)}")
    if len(set(a.case_list)) != len(a.case_list):
        p.error(f"--cases lists a case twice: {a.cases}")
    return a


# ------------------------------------------------------------------------------------------------ GPU worker
def _sdpa_backend(q, k, v, mask, gqa: bool) -> str:
    import torch

    try:
        from torch.nn.attention import SDPBackend

        c = torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=None,
                                    enable_gqa=gqa)
        return SDPBackend(c).name
    except Exception as e:  # noqa: BLE001 - a private API: record why it is unknown
        return f"unknown ({type(e).__name__})"


def _torch_kernels(fn, calls: int) -> List[dict]:
    """``calls`` calls of ``fn`` under torch.profiler: its CUDA kernels (CUPTI activity records) in launch order."""
    import tempfile

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    out = []
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0)):
        a = e.get("args", {})
        grid, block = a.get("grid") or [], a.get("block") or []
        prod = (lambda xs: int(xs[0]) * int(xs[1]) * int(xs[2]) if len(xs) == 3 else None)
        out.append(dict(kernel_full=e.get("name", ""), duration_us=float(e.get("dur", 0.0)), grid_size=prod(grid),
                        block_size=prod(block), registers=a.get("registers per thread"),
                        smem_dynamic_bytes=a.get("shared memory"),
                        achieved_occupancy_pct=a.get("est. achieved occupancy %"), stream=str(a.get("stream", ""))))
    return out


def run_worker(out: str, case_name: str, calls: int, graph_calls: int, tracer: str, deep: bool) -> dict:
    """One case on the GPU (module docstring): times, then profiles every method; writes ``case_<name>.json``
    (segments in launch order; under ``tracer="torch"`` also their kernels) and returns it."""
    import torch
    import torch.nn.functional as F

    from eval.bench_common import env_info, time_cuda_graph
    from eval.bench_decode import copy_bandwidth, kv_bytes_per_step, make_cache
    from kernels.decode import _sm_count, decode_plan, decode_run
    from lab.decode_probe import FINAL_VARIANTS, variant_opts

    name, B, Hq, Hkv, ctx, _, Nq = known_cases()[case_name]
    D, dt = 128, getattr(torch, _DTYPE)
    log = (lambda *m: print(*m, file=sys.stderr, flush=True))  # stdout stays free for ncu
    os.makedirs(out, exist_ok=True)
    dev = _DEVICE
    copy_gbps = copy_bandwidth()
    sms = _sm_count(torch.device(dev))
    gen = torch.Generator(device=dev).manual_seed(0)
    k, v, _, seq = make_cache(B, Hkv, ctx, D, dt, False, 0, gen)
    q = torch.randn(B, Hq, Nq, D, device=dev, dtype=dt, generator=gen)
    mask = None
    if Nq > 1:  # the bottom-right causal mask of lab.decode_probe
        i = torch.arange(Nq, device=dev).view(-1, 1) + ctx - Nq
        mask = torch.arange(ctx, device=dev).view(1, -1) <= i
    gqa = Hq != Hkv
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    nbytes = kv_bytes_per_step(B, Hkv, ctx, D)
    plan = decode_plan(q, k, v)
    methods = [("sdpa", "sdpa", (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)),
                dict(sdpa_backend=_sdpa_backend(q, k, v, mask, gqa), sdpa_mask="bool bottom-right causal" if Nq > 1
                     else "none"))]
    plans = [("ours", plan)]
    if deep:  # lab.decode_probe's "deep": half the default split count, 4 stages
        plans.append(("ours_deep", decode_plan(q, k, v, **variant_opts(dict(FINAL_VARIANTS)["deep"], plan.num_splits))))
    for m, pl in plans:
        info = dict(num_splits=pl.num_splits, block_n=pl.block_n, block_m=pl.block_m, num_stages=pl.num_stages,
                    num_warps=pl.num_warps, merge=pl.merge, max_registers=pl.max_registers, grid=list(pl.grid),
                    kernels_per_call=2 if pl.num_splits > 1 and pl.merge == "kernel" else 1)
        methods.append((m, "ours", (lambda pl=pl: decode_run(pl, q, k, v, seq)), info))
    if Nq > 1:
        methods.append(("sdpa_nomask", "sdpa", (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)),
                        dict(sdpa_backend=_sdpa_backend(q, k, v, None, gqa),
                             sdpa_mask="none (not causal: speed only)")))
    rec = dict(case=name, B=B, Hq=Hq, Hkv=Hkv, context=ctx, Nq=Nq, D=D, dtype=_DTYPE, kv_bytes=nbytes,
               copy_gbps=copy_gbps, sm_count=sms, tracer=tracer, calls=calls, graph_calls=graph_calls,
               env=env_info(), segments=[], kernels=[], errors=[])
    ok = []
    for m, kind, fn, info in methods:  # compile, check, time (not profiled); a failing method is left out
        try:
            o = fn()
            err = None if m == "sdpa_nomask" else float((o.float() - ref.float()).abs().max())
            us = time_cuda_graph(fn, calls=graph_calls) * 1e3
        except Exception as e:  # noqa: BLE001 - record and go on
            rec["errors"].append(f"{m}: {type(e).__name__}: {str(e)[:160]}")
            log(f"{name} {m}: {rec['errors'][-1]}")
            torch.cuda.empty_cache()
            continue
        frac = nbytes / (us * 1e-6) / 1e9 / copy_gbps
        rec["segments"].append(dict(method=m, kind=kind, calls=calls, graph_us=us, graph_frac=frac, err=err, **info))
        ok.append((m, kind, fn, info))
        log(f"{name} {m:12s} {us:8.1f} us per call in a graph of {graph_calls}: {frac:.3f} of copy bandwidth "
            f"({copy_gbps:.0f} GB/s)  err {err}  {info}")
    streams = []
    for idx, (m, kind, fn, info) in enumerate(ok):  # the profiled calls: one stream per method
        s = torch.cuda.Stream()
        streams.append(s)  # kept alive: a stream of the pool is not handed out again while held
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            if tracer == "torch":
                for kr in _torch_kernels(fn, calls):
                    rec["kernels"].append(dict(kr, segment=idx))
            else:
                torch.cuda.profiler.start()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    path = os.path.join(out, f"case_{safe_name(name)}.json")
    with open(path, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    log(f"wrote {path}")
    return rec


# ------------------------------------------------------------------------------------------------ ncu rows -> methods
def assign_rows(rows: Sequence[dict], segments: Sequence[dict]) -> List[List[dict]]:
    """Split the profiled kernels of one case (ncu raw rows, in report order) into the case's segments (methods in
    launch order). First by CUDA stream (one per method): used when the runs of equal ``Stream`` match the segments
    one to one. Else by order: an ``ours`` segment takes the next ``calls * kernels_per_call`` rows (all must be
    ours), any other segment the rows up to the next of ours (the last one: all that is left). ``ValueError`` when
    neither accounts for every row."""
    rows = sorted(rows, key=lambda r: int(str(r.get("ID", "0")).replace(",", "") or 0))
    runs: List[List[dict]] = []
    prev = object()
    for r in rows:
        key = r.get("Stream")
        if not runs or key != prev:
            runs.append([])
            prev = key
        runs[-1].append(r)
    if all(r.get("Stream") not in (None, "") for r in rows) and len(runs) == len(segments):
        return runs
    out, i = [], 0
    for j, seg in enumerate(segments):
        if seg.get("kind") == "ours":
            n = seg["calls"] * seg.get("kernels_per_call", 1)
            take = rows[i:i + n]
            if len(take) != n or not all(is_ours(r.get("Kernel Name", "")) for r in take):
                raise ValueError(f"segment {seg['method']}: expected {n} kernels of ours at row {i}, found "
                                 f"{[short_kernel(r.get('Kernel Name', '')) for r in take]}")
        else:
            n = 0
            while i + n < len(rows) and (j == len(segments) - 1 or not is_ours(rows[i + n].get("Kernel Name", ""))):
                n += 1
            take = rows[i:i + n]
        out.append(take)
        i += n
    if i != len(rows):
        raise ValueError(f"{len(rows)} profiled kernels, {i} assigned to the {len(segments)} methods")
    return out


def _kernel_record(case: dict, seg: dict, pos: int, n_in_seg: int, fields: dict, tracer: str) -> dict:
    calls = seg["calls"]
    per_call = n_in_seg // calls if n_in_seg % calls == 0 and n_in_seg else None
    r = dict.fromkeys(KERNEL_COLUMNS)
    r.update(fields)
    r.update(case=case["case"], method=seg["method"], call=(pos // per_call) if per_call else None,
             kernel=short_kernel(fields.get("kernel_full", "")), tracer=tracer)
    dur, rd = r.get("duration_us"), r.get("dram_read_bytes")
    r["dram_read_gbps"] = rd / (dur * 1e-6) / 1e9 if dur and rd is not None else None
    return r


def case_records(case: dict, ncu_text: Optional[str] = None) -> List[dict]:
    """Every profiled launch of one case as a flat record (:data:`KERNEL_COLUMNS`): from ncu's raw report
    ``ncu_text`` (``case["tracer"] == "ncu"``) or from the worker's torch.profiler kernels."""
    segs = case["segments"]
    out = []
    if case.get("tracer") == "torch":
        for idx, seg in enumerate(segs):
            ks = [k for k in case.get("kernels", []) if k.get("segment") == idx]
            for pos, k in enumerate(ks):
                out.append(_kernel_record(case, seg, pos, len(ks), {c: v for c, v in k.items() if c != "segment"},
                                          "torch"))
        return out
    if ncu_text is None:
        raise ValueError(f"case {case['case']}: profiled under ncu, but no ncu report was given")
    rows = raw_rows(ncu_text)
    for seg, run in zip(segs, assign_rows(rows, segs)):
        for pos, r in enumerate(run):
            fields = dict(kernel_full=r.get("Kernel Name") or r.get("Function Name") or "", stream=r.get("Stream"))
            for metric, (col, factor) in METRICS.items():
                val = r.get(metric)
                fields[col] = val * factor if val is not None else None
            out.append(_kernel_record(case, seg, pos, len(run), fields, "ncu"))
    return out


# ------------------------------------------------------------------------------------------------ tables
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _sum(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def aggregate(case: dict, records: Sequence[dict]) -> Tuple[List[dict], List[dict]]:
    """Per (method, kernel) rows and per method rows of one case (module docstring). Per kernel: launches per
    call, time per call (sum over launches / calls) and its share of the method's kernel time, medians of the
    per-launch metrics, DRAM bytes per call and read throughput (bytes read / time). Per method: the kernels' time per
    call, the CUDA-graph time per call, for ours the split kernel alone and the merge (its share of the kernel
    time), the K/V bytes over each time as a fraction of the copy bandwidth, DRAM bytes read per call over the K/V
    bytes."""
    kv, copy = case["kv_bytes"], case["copy_gbps"]
    frac = (lambda us: kv / (us * 1e-6) / 1e9 / copy if us else None)
    krows, mrows = [], []
    for seg in case["segments"]:
        m, calls = seg["method"], seg["calls"]
        mine = [r for r in records if r["method"] == m]
        names = list(dict.fromkeys(r["kernel"] for r in mine))
        total = _sum(r.get("duration_us") for r in mine)
        per_kernel = {}
        for name in names:
            rs = [r for r in mine if r["kernel"] == name]
            us = _sum(r.get("duration_us") for r in rs)
            rd = _sum(r.get("dram_read_bytes") for r in rs)
            row = dict(case=case["case"], method=m, kernel=name, launches_per_call=len(rs) / calls,
                       us_per_call=us / calls if us is not None else None,
                       share_of_method=us / total if us is not None and total else None,
                       median_us=_med(r.get("duration_us") for r in rs),
                       dram_read_mb_per_call=rd / calls / 1e6 if rd is not None else None,
                       dram_write_mb_per_call=(lambda w: w / calls / 1e6 if w is not None else None)(
                           _sum(r.get("dram_write_bytes") for r in rs)),
                       dram_read_gbps=rd / (us * 1e-6) / 1e9 if rd is not None and us else None)
            for col in ("dram_pct_peak", "grid_size", "block_size", "registers", "smem_dynamic_bytes",
                        "achieved_occupancy_pct", "theoretical_occupancy_pct", "waves_per_sm", "occ_limit_registers",
                        "occ_limit_smem"):
                row[col] = _med(r.get(col) for r in rs)
            row["kernel_full"] = rs[0].get("kernel_full", "")
            per_kernel[name] = row
            krows.append(row)
        k_us = total / calls if total is not None else None
        rd = _sum(r.get("dram_read_bytes") for r in mine)
        mr = dict(case=case["case"], method=m, B=case["B"], Hq=case["Hq"], Hkv=case["Hkv"], context=case["context"],
                  Nq=case["Nq"], kv_mb=kv / 1e6, copy_gbps=copy, kernels=" + ".join(names),
                  kernel_us_per_call=k_us, graph_us_per_call=seg.get("graph_us"), frac_kernels=frac(k_us),
                  frac_graph=frac(seg.get("graph_us")),
                  dram_read_over_kv=rd / calls / kv if rd is not None else None,
                  sdpa_backend=seg.get("sdpa_backend", ""), num_splits=seg.get("num_splits"),
                  block_m=seg.get("block_m"), block_n=seg.get("block_n"), num_stages=seg.get("num_stages"),
                  merge=seg.get("merge", ""), err=seg.get("err"))
        if seg.get("kind") == "ours":
            sp, mg = per_kernel.get(SPLIT_KERNEL), per_kernel.get(MERGE_KERNEL)
            mr["split_us_per_call"] = sp["us_per_call"] if sp else None
            mr["frac_split_alone"] = frac(mr["split_us_per_call"])
            mr["merge_us_per_call"] = mg["us_per_call"] if mg else 0.0
            mr["merge_share"] = mg["share_of_method"] if mg else 0.0
        mrows.append(mr)
    return krows, mrows


def _f(x, fmt="{:.3f}", none="-"):
    return none if x is None else fmt.format(x)


def summary_markdown(cases: Sequence[dict], krows: Sequence[dict], mrows: Sequence[dict], notes=()) -> str:
    """The run's ``summary.md``: settings, then per case a table of kernels and one line per method (the split
    kernel alone against end to end; the merge's share), ours against SDPA."""
    c0 = cases[0] if cases else {}
    env = c0.get("env", {})
    tracers = sorted({c.get("tracer", "") for c in cases})
    lines = ["# Decode profile: our split-K kernels against SDPA's", "",
             f"{env.get('gpu', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
             f"{env.get('date', '?')}; tracer {', '.join(tracers)}; {c0.get('calls', '?')} profiled calls per "
             f"method; CUDA-graph times: {c0.get('graph_calls', '?')} calls per graph. Fractions are K/V bytes per "
             f"step over a time, over the copy bandwidth of the same process.", ""]
    if "torch" in tracers:
        lines += ["**No Nsight Compute counters** for cases under torch.profiler: durations, grids, registers and "
                  "CUPTI's *estimated* occupancy only; DRAM columns are empty.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for c in cases:
        name = c["case"]
        lines += [f"## {name}: batch {c['B']}, {c['Hq']}:{c['Hkv']} heads, {c['context'] // 1024}k context, "
                  f"Nq {c['Nq']} (K/V {c['kv_bytes'] / 1e6:.1f} MB per step; copy {c['copy_gbps']:.0f} GB/s)", "",
                  "| method | kernel | per call | us per call | share | DRAM read MB per call | read GB/s | DRAM % "
                  "of peak | grid | regs | occupancy % achieved / theor. | waves per SM |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in krows if r["case"] == name):
            lines.append(f"| {r['method']} | `{r['kernel'][:60]}` | {_f(r['launches_per_call'], '{:g}')} | "
                         f"{_f(r['us_per_call'], '{:.1f}')} | {_f(r['share_of_method'], '{:.1%}')} | "
                         f"{_f(r['dram_read_mb_per_call'], '{:.1f}')} | {_f(r['dram_read_gbps'], '{:.0f}')} | "
                         f"{_f(r['dram_pct_peak'], '{:.1f}')} | {_f(r['grid_size'], '{:.0f}')} | "
                         f"{_f(r['registers'], '{:.0f}')} | {_f(r['achieved_occupancy_pct'], '{:.1f}')} / "
                         f"{_f(r['theoretical_occupancy_pct'], '{:.1f}')} | {_f(r['waves_per_sm'], '{:.2f}')} |")
        lines.append("")
        ms = {r["method"]: r for r in mrows if r["case"] == name}
        for m, r in ms.items():
            if r.get("split_us_per_call") is not None or m.startswith("ours"):
                lines.append(
                    f"- **{m}** (S {r['num_splits']}, tile {r['block_m']} x {r['block_n']}, {r['num_stages']} stages, "
                    f"merge {r['merge']}): split kernel alone {_f(r.get('split_us_per_call'), '{:.1f}')} us = "
                    f"{_f(r.get('frac_split_alone'))} of copy; merge {_f(r.get('merge_us_per_call'), '{:.1f}')} us "
                    f"({_f(r.get('merge_share'), '{:.1%}')} of kernel time); kernels end to end "
                    f"{_f(r['kernel_us_per_call'], '{:.1f}')} us = {_f(r['frac_kernels'])}; CUDA graph "
                    f"{_f(r['graph_us_per_call'], '{:.1f}')} us = {_f(r['frac_graph'])}; DRAM read / K/V "
                    f"{_f(r['dram_read_over_kv'])}.")
            else:
                lines.append(
                    f"- **{m}** (backend {r['sdpa_backend']}; kernels: {r['kernels']}): kernels "
                    f"{_f(r['kernel_us_per_call'], '{:.1f}')} us = {_f(r['frac_kernels'])} of copy; CUDA graph "
                    f"{_f(r['graph_us_per_call'], '{:.1f}')} us = {_f(r['frac_graph'])}; DRAM read / K/V "
                    f"{_f(r['dram_read_over_kv'])}.")
        o = ms.get("ours")
        for sm in ("sdpa", "sdpa_nomask"):  # ours against each of SDPA's forms: where the difference sits
            s = ms.get(sm)
            if not (o and s and o.get("kernel_us_per_call") and s.get("kernel_us_per_call")):
                continue
            sk = [r for r in krows if r["case"] == name and r["method"] == sm and r["us_per_call"] is not None]
            main = max(sk, key=lambda r: r["us_per_call"])
            rest = s["kernel_us_per_call"] - main["us_per_call"]
            parts = (f"our split kernel {(o.get('split_us_per_call') or 0.0) - main['us_per_call']:+.1f} us against "
                     f"its main kernel `{main['kernel'][:50]}`, our merge {o.get('merge_us_per_call') or 0.0:.1f} "
                     f"us against its other kernels {rest:.1f} us")
            g = (o["graph_us_per_call"] or 0.0) - (s["graph_us_per_call"] or 0.0)
            lines.append(f"- ours - {sm}: kernels {o['kernel_us_per_call'] - s['kernel_us_per_call']:+.1f} us per "
                         f"call ({parts}); CUDA graph {g:+.1f} us ({_f(o['frac_graph'])} vs {_f(s['frac_graph'])} "
                         f"of copy).")
        d = ms.get("ours_deep")
        if o and d and o.get("split_us_per_call") and d.get("split_us_per_call"):
            lines.append(f"- ours_deep - ours: split kernel {d['split_us_per_call'] - o['split_us_per_call']:+.1f} "
                         f"us, merge {(d.get('merge_us_per_call') or 0.0) - (o.get('merge_us_per_call') or 0.0):+.1f} "
                         f"us, CUDA graph {(d['graph_us_per_call'] or 0.0) - (o['graph_us_per_call'] or 0.0):+.1f} us "
                         f"(S {d['num_splits']} vs {o['num_splits']}).")
        for e in c.get("errors", []):
            lines.append(f"- failed, left out: {e}")
        lines.append("")
    lines += ["Under ncu every kernel runs alone (no overlap of one launch's tail with the next launch) and, with "
              "`--cache-control all`, after an L2 flush: the merge kernel reads the partials from DRAM here and "
              "from L2 in the timed graph, so its share is an upper bound; the graph time includes launch gaps.", ""]
    return "\n".join(lines)


def build_outputs(out: str, case_names: Optional[Sequence[str]] = None, notes=()) -> dict:
    """Read ``case_<name>.json`` (and ``ncu_<name>.csv`` for cases profiled under ncu) in ``out`` -- every case
    found, or ``case_names`` -- and write the three CSVs and ``summary.md``. A case whose files are missing or do
    not parse is named in the summary's notes. Returns ``{"kernels": [...], "per_kernel": [...], "methods": [...],
    "notes": [...]}``. ``ValueError`` when no case could be read."""
    from eval.bench_common import write_csv

    notes = list(notes)
    if case_names is None:
        files = sorted(f for f in os.listdir(out) if f.startswith("case_") and f.endswith(".json"))
        if not files:
            notes.append("no case_<name>.json in it (the records a profiling run writes)")
    else:
        files = [f"case_{safe_name(c)}.json" for c in case_names]
    cases, recs, krows, mrows = [], [], [], []
    for fn in files:
        path = os.path.join(out, fn)
        if not os.path.exists(path):
            notes.append(f"{fn[5:-5]}: no record ({fn} missing: the case did not run or its process failed)")
            continue
        with open(path) as f:
            case = json.load(f)
        ncu_text = None
        if case.get("tracer") == "ncu":
            npath = os.path.join(out, f"ncu_{safe_name(case['case'])}.csv")
            if os.path.exists(npath):
                with open(npath, errors="replace") as f:
                    ncu_text = f.read()
        try:
            rs = case_records(case, ncu_text)
        except ValueError as e:
            notes.append(f"{case['case']}: ncu report not usable: {e}")
            continue
        kr, mr = aggregate(case, rs)
        cases.append(case)
        recs += rs
        krows += kr
        mrows += mr
    if not cases:
        raise ValueError(f"no case could be read in {out}: " + "; ".join(notes))
    write_csv(recs, os.path.join(out, "decode_profile_kernels.csv"), columns=KERNEL_COLUMNS)
    write_csv(krows, os.path.join(out, "decode_profile.csv"))
    write_csv(mrows, os.path.join(out, "decode_profile_methods.csv"))
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary_markdown(cases, krows, mrows, notes))
    return dict(kernels=recs, per_kernel=krows, methods=mrows, notes=notes)


# ------------------------------------------------------------------------------------------------ driver
def choose_tracer(requested: str, ncu: str):
    """``(tracer, ncu path or None, message or None)``: ``"ncu"`` where ``ncu`` is found on PATH (or is a file),
    else ``"torch"`` with a message saying why -- for ``requested="ncu"`` too (the profile falls back, it does not
    stop)."""
    if requested == "torch":
        return "torch", None, None
    path = shutil.which(ncu)
    if path:
        return "ncu", path, None
    return "torch", None, (f"Nsight Compute ({ncu!r}) not found on PATH: falling back to torch.profiler (kernel "
                           f"durations, grids, registers, estimated occupancy; no DRAM counters)")


def ncu_argv(ncu: str, metrics: Sequence[str], log_file: str, cache_control: str, target: Sequence[str]) -> List[str]:
    """The ncu command line of one case: raw page as CSV in base units to ``log_file``, only the ranges between
    ``cudaProfilerStart`` / ``Stop``, clocks as they are, ``metrics``."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base", "--profile-from-start", "off",
            "--clock-control", "none", "--cache-control", cache_control, "--metrics", ",".join(metrics),
            "--log-file", log_file, *target]


def _run(argv: Sequence[str], timeout: float, log_path: str, cwd: str) -> Tuple[int, str]:
    """``argv`` in its own process group, stdout and stderr to ``log_path``; killed (the group) at ``timeout``.
    Returns ``(returncode, log text)``; 124 on timeout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = cwd + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    with open(log_path, errors="replace") as f:
        return rc, f.read()


def run_driver(a: argparse.Namespace) -> int:
    """The profile run (module docstring): one process per case under ncu (or torch.profiler), then the tables."""
    t_end = time.time() + a.budget_s
    a.out = os.path.abspath(a.out)  # the case processes run from the repo root
    os.makedirs(a.out, exist_ok=True)
    tracer, ncu, msg = choose_tracer(a.tracer, a.ncu)
    notes = []
    if msg:
        print(msg, flush=True)
        notes.append(msg)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    metrics = list(METRICS)
    for name in a.case_list:
        left = t_end - time.time()
        if left < MIN_CASE_S:
            notes.append(f"{name}: not run ({left:.0f} s of the budget left)")
            print(notes[-1], flush=True)
            continue
        sn = safe_name(name)
        worker = [sys.executable, "-m", "lab.decode_profile", "--worker", "--case", name, "--out", a.out,
                  "--calls", str(a.calls), "--graph-calls", str(a.graph_calls)] + (["--no-deep"] if a.no_deep else [])
        case_json = os.path.join(a.out, f"case_{sn}.json")
        done = False
        if tracer == "ncu":
            for attempt in range(2):
                if os.path.exists(case_json):
                    os.remove(case_json)
                csv_path = os.path.join(a.out, f"ncu_{sn}.csv")
                t0 = time.time()
                rc, text = _run(ncu_argv(ncu, metrics, csv_path, a.cache_control, worker + ["--tracer", "ncu"]),
                                t_end - time.time(), os.path.join(a.out, f"run_{sn}.log"), repo)
                report = ""
                if os.path.exists(csv_path):
                    with open(csv_path, errors="replace") as f:
                        report = f.read()
                print(f"{name}: ncu rc {rc}, {time.time() - t0:.0f} s", flush=True)
                try:
                    n = len(raw_rows(report))
                except ValueError:
                    n = 0
                if n and os.path.exists(case_json):
                    done = True
                    break
                errs = [ln for ln in (report + "\n" + text).splitlines() if "==ERROR==" in ln or "rror" in ln][-6:]
                print(f"{name}: ncu gave no usable report:\n  " + "\n  ".join(errs or text.splitlines()[-6:]),
                      flush=True)
                if attempt == 0 and metrics != list(MIN_METRICS) and any("metric" in e.lower() for e in errs):
                    metrics = list(MIN_METRICS)
                    notes.append(f"ncu rejected a metric of the full set; ran with {', '.join(MIN_METRICS)}")
                    print(notes[-1], flush=True)
                    continue
                break
            if not done:
                notes.append(f"{name}: ncu gave no usable report (see run_{sn}.log); torch.profiler instead")
        if not done and t_end - time.time() >= MIN_CASE_S:
            t0 = time.time()
            rc, text = _run(worker + ["--tracer", "torch"], t_end - time.time(),
                            os.path.join(a.out, f"run_{sn}{'_torch' if tracer == 'ncu' else ''}.log"), repo)
            print(f"{name}: torch.profiler rc {rc}, {time.time() - t0:.0f} s", flush=True)
            if rc != 0:
                print("\n".join(text.splitlines()[-8:]), flush=True)
    try:
        res = build_outputs(a.out, a.case_list, notes)
    except ValueError as e:
        print(f"no profile written: {e}", flush=True)
        return 1
    with open(os.path.join(a.out, "summary.md")) as f:
        print(f.read(), flush=True)
    return 0 if not any("not run" in n or "no record" in n for n in res["notes"]) else 3


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.parse:
        try:
            build_outputs(a.out, None)
        except ValueError as e:
            print(f"no profile written: {e}", file=sys.stderr, flush=True)
            return 1
        with open(os.path.join(a.out, "summary.md")) as f:
            print(f.read())
        return 0
    if a.worker:
        tracer = a.tracer if a.tracer != "auto" else "ncu"
        run_worker(a.out, a.case, a.calls, a.graph_calls, tracer, not a.no_deep)
        return 0
    return run_driver(a)


if __name__ == "__main__":
    sys.exit(main())
