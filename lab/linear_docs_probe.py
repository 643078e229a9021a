"""GPU probe (lab: not installed): the linear kernel's packed-documents path (issue 27) over segment size, chunk
size and tile configs, against fla's varlen kernel, budget-bounded and safe against a poisoned CUDA context.

    python -m lab.linear_docs_probe --out DIR [--budget-s 100]     # on the H200, from the repo root
    python -m lab.linear_docs_probe --dry-run                      # print the grid (CPU)

Workload (as ``python -m eval.bench_linear --docs``, whose document sampling and inputs it reuses:
:func:`eval.bench_linear.docs_case`): one packed row (B = 1) of ``--tokens`` (65536, 16384) per ``--docs``
distribution (fixed:2048, geometric:256), H 16, F = Dv = 128, bf16, causal, elu1 features computed once.

Grid (:func:`build_grid`, in this order: the default points first, fla last):

1. ``default``: :func:`kernels.linear.linear_attention` with ``doc_ids``, chunk 64, the heuristic segment length;
2. ``nodocs``: our kernel without documents, per N (the same tensors for every distribution);
3. ``ppsK``: an explicit ``segment_size`` giving ~K forward programs per SM (``--pps``; forward programs are
   ``n_seg * H * Dv / BV``), those equal to the heuristic's left out;
4. ``C128``: another chunk size (``--chunks``), heuristic segments;
5. ``<kind>=BK,BV,warps,stages,chunk``: one kernel's alternative tile config from the kernel's own list
   (:func:`kernels.linear.tile_configs`, the entries after the default; ``--tile-alts``), as a one-entry list (a
   config that does not fit fails, it does not fall back), heuristic segments (for the forward's BV), at
   ``--tile-tokens`` only;
6. ``fla_linear_varlen``: fla's ``chunk_linear_attn(..., cu_seqlens=)`` (optional import; the anchor). Last,
   because with a cold Triton cache its autotuning takes minutes: it gets what the budget leaves.

Each point: one fwd+bwd checked against the fp32 chunked reference with documents
(:func:`attn_zoo.backends.torch_linear.chunked_linear_attention`, first ``--check-heads`` heads; ``rel_err_*`` =
``||x - ref|| / ||ref||`` of out, dq, dk, dv; ``ok`` = all below ``--tol``), then fwd and fwd+bwd timed
(:func:`eval.bench_common.time_cuda`, median, ``--warmup-ms`` / ``--rep-ms``). ``x_fla``: fla's fwd+bwd over the
point's (same N and documents, this run); ``x_fla_rec``: the same with fla's time recorded on the H200 on 2026-12-04
(``--anchor-csv``, same shapes and inputs); ``x_default``: the default point's over the point's (> 1: faster).

Segment length: ``segment_size=None`` takes the kernel's heuristic (``kernels.linear._seg_len`` through
:func:`kernels.linear.query_segment_len`; ``doc_ids`` does not enter it, so the document path and the plain one
get the same ``L``): ``L`` starts at ``next_pow2(N)`` and is halved while ``L > 4 C`` and the forward has fewer than
``progs_per_sm`` (1) x #SMs programs (``n_seg * B * H * Dv / BV``, BV 128 for bf16). On 132 SMs at B 1, H 16:
16 segments at both lengths (``L`` 1024 at 16k, 4096 at 64k), 256 forward programs (1.94 per SM).

Processes: this one (the supervisor) writes ``grid.json``, then (``--warm-jobs`` > 0) compiles in parallel until
``--warm-share`` of the budget: one process per group of points sharing their kernels (a config and segment count;
fla's first), each running its points once (fwd+bwd, ``CUDA_LAUNCH_BLOCKING=1``; fla with ``FLA_CACHE_RESULTS=0``
so that no autotune choice made on a busy GPU is kept). This fills Triton's cache and pre-screens every point: a
point that fails or kills its process there is recorded as an error (``where`` warm) and not run again. Then one
worker process runs the points in order, appending each result to ``points.jsonl``; a CUDA error that poisons the
context (illegal address, ...) ends it with exit code 3, a crash with another code: the supervisor records the
point it was on (``current.json``) as an error and starts a new worker, which resumes after it. Points not reached
within ``--budget-s`` are recorded as ``skipped``. Writes ``linear_docs_probe.{csv,json}`` (and ``grid.json``,
``points.jsonl``, ``warm.log``) under ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Dict, List, Optional, Sequence

_T0 = time.time()  # the budget counts from the process start (imports included)
PHASES = ("default", "nodocs", "segment", "chunk", "tile", "fla")
# fla's varlen anchor measured on the H200 on 2026-12-04 (bench_linear --docs, same shapes, inputs and versions:
# triton 3.6, fla-core 0.6.0): x_fla_rec = its fwd+bwd over the point's, when the live anchor is missing
ANCHOR_CSV = "results/h200/2026-12-04/linear_docs/linear_docs_bench.csv"
# alternative tile configs per kernel: how many entries after the default of the kernel's own list
TILE_ALTS = {"seg_fwd": 1, "seg_dkdv": 2, "seg_dq": 1, "seg_dstate": 1, "seg_state": 1}
CSV_COLS = ["id", "phase", "N", "docs", "kind", "variant", "impl", "chunk", "segment_size", "seg_len", "n_seg",
            "fwd_progs_per_sm", "status", "fwd_ms", "fwd_bwd_ms", "x_fla", "x_fla_rec", "x_default", "rel_err_out",
            "rel_err_dq", "rel_err_dk", "rel_err_dv", "ok", "tiles_used", "skipped_tiles", "error", "where", "t_s"]
_DTYPES = ("bfloat16", "float16", "float32")


# --------------------------------------------------------------------------------------------- arguments / grid
def _ints(text: str, name: str) -> List[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise ValueError(f"{name}={text!r} must be a comma list of positive integers")
    return vals


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (:func:`check_args`); raises ValueError naming the argument and its allowed
    values."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/h200/linear_docs_probe")
    p.add_argument("--tokens", default="65536,16384", help="N of the packed row (B = 1), comma list")
    p.add_argument("--docs", default="fixed:2048,geometric:256", help="document distributions (bench_linear --docs)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128, help="F = Dv")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16, float32")
    p.add_argument("--chunks", default="64,128", help="chunk sizes; the first is the default points' chunk")
    p.add_argument("--pps", default="1,2,4,8", help="forward programs per SM of the explicit segment sizes")
    p.add_argument("--tile-tokens", default="65536", help="the N (of --tokens) at which tile configs are varied")
    p.add_argument("--tile-alts", default=",".join(f"{k}:{n}" for k, n in TILE_ALTS.items()),
                   help="kernel:count of alternative tile configs (after the default of the kernel's list); '' none")
    p.add_argument("--no-fla", action="store_true", help="no fla anchor points")
    p.add_argument("--no-nodocs", action="store_true", help="no points without documents")
    p.add_argument("--anchor-csv", default=ANCHOR_CSV, help="recorded bench_linear --docs rows (x_fla_rec); '' none")
    p.add_argument("--check-heads", type=int, default=2, help="heads checked against the fp32 reference")
    p.add_argument("--tol", type=float, default=3e-2, help="rel. error above which a point is not ok")
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=60.0)
    p.add_argument("--budget-s", type=float, default=100.0,
                   help="seconds for the whole run from this process's start (warm-up included)")
    p.add_argument("--warm-jobs", type=int, default=12, help="parallel compile / pre-screen processes (0: none)")
    p.add_argument("--warm-share", type=float, default=0.45, help="fraction of --budget-s the warm phase may take")
    p.add_argument("--max-restarts", type=int, default=6, help="new worker processes after a crash")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit (no GPU needed)")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("--warm", nargs=2, metavar=("OUT", "GROUP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not (args.worker or args.warm):
        check_args(args)
    return args


def check_args(args) -> None:
    """Raises ValueError naming the first bad argument and its allowed values; normalises the list arguments
    (``args.tokens`` etc. become lists)."""
    from eval.bench_flash import document_dists
    from kernels.linear import CHUNK_SIZES, KERNELS

    args.tokens = _ints(args.tokens, "--tokens")
    args.chunks = _ints(args.chunks, "--chunks")
    if any(c not in CHUNK_SIZES for c in args.chunks):
        raise ValueError(f"--chunks={args.chunks} must be in {', '.join(map(str, CHUNK_SIZES))}")
    args.tile_tokens = _ints(args.tile_tokens, "--tile-tokens") if str(args.tile_tokens).strip() else []
    if any(n not in args.tokens for n in args.tile_tokens):
        raise ValueError(f"--tile-tokens={args.tile_tokens} must be among --tokens {args.tokens}")
    try:
        args.pps = [float(x) for x in str(args.pps).split(",") if x.strip()]
    except ValueError:
        args.pps = [-1.0]
    if any(not (x > 0) for x in args.pps):
        raise ValueError(f"--pps={args.pps} must be a comma list of positive numbers")
    args.docs = document_dists(args.docs)  # ValueError naming a bad entry and the allowed ones
    alts = {}
    for item in (x for x in str(args.tile_alts).split(",") if x.strip()):
        kind, _, n = item.partition(":")
        if kind not in KERNELS or not n.isdigit():
            raise ValueError(f"--tile-alts entry {item!r}: expected kernel:count with kernel in "
                             f"{', '.join(KERNELS)}")
        alts[kind] = int(n)
    args.tile_alts = alts
    if args.dtype not in _DTYPES:
        raise ValueError(f"--dtype={args.dtype!r}; allowed values: {', '.join(_DTYPES)}")
    for name in ("heads", "dim", "check_heads", "warm_jobs", "max_restarts"):
        v = getattr(args, name)
        if v < (0 if name in ("warm_jobs", "max_restarts") else 1):
            raise ValueError(f"--{name.replace('_', '-')}={v} is out of range")
    if args.dim > 256:
        raise ValueError(f"--dim={args.dim} must be <= 256 (the kernel's limit)")
    if args.check_heads > args.heads:
        raise ValueError(f"--check-heads={args.check_heads} must be <= --heads={args.heads}")
    for name in ("budget_s", "rep_ms", "tol"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be > 0")
    if not 0 < args.warm_share < 1:
        raise ValueError(f"--warm-share={args.warm_share} must be in (0, 1)")


def _sms(device) -> int:
    import torch

    dev = torch.device(device)
    # the kernel's own count (kernels.linear sizes segments for 132 SMs off the GPU too)
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132


def build_grid(tokens: Sequence[int], dists: Sequence[str], heads: int, dim: int, dtype="bfloat16",
               chunks: Sequence[int] = (64, 128), pps: Sequence[float] = (1, 2, 4, 8),
               tile_tokens: Sequence[int] = (65536,), tile_alts: Optional[Dict[str, int]] = None, fla: bool = True,
               nodocs: bool = True, device="cpu") -> List[dict]:
    """The probe's points, in run order (:data:`PHASES`; longest N first within a phase). Each point: ``id``,
    ``phase``, ``N``, ``docs`` (``"none"`` without documents), ``kind`` (``ours`` / ``ours_nodocs`` / ``fla``),
    ``variant``, ``chunk``, ``segment_size`` (None: the kernel's heuristic), ``tiles`` ({kernel: [config]}),
    ``seg_len`` / ``n_seg`` (what :func:`kernels.linear.query_segment_len` gives on ``device``),
    ``fwd_progs_per_sm`` and ``group`` (points sharing compiled kernels). Raises ValueError for an empty grid."""
    import torch

    from kernels._host import cdiv
    from kernels.linear import LinearConfig, query_segment_len, tile_blocks, tile_configs

    dt = getattr(torch, dtype)
    sms = _sms(device)
    tile_alts = TILE_ALTS if tile_alts is None else tile_alts
    cases = [(N, d) for N in sorted(set(tokens), reverse=True) for d in dists]
    c0 = chunks[0]
    pts: List[dict] = []

    def seg_info(N, chunk, seg, tiles):
        cfg = LinearConfig(tiles=tiles)
        L = query_segment_len(1, heads, N, dim, dim, chunk, dt, torch.device(device), cfg, seg)
        lowp = dt == torch.bfloat16 and cfg.lowp_bf16
        bv = tile_blocks(tile_configs("seg_fwd", dt, lowp or cfg.state_16bit, dim, dim, cfg)[0], dim, dim)[1]
        per_seg = heads * cdiv(dim, bv)  # forward programs per segment (B = 1)
        return L, cdiv(N, L), per_seg

    def add(phase, N, dist, kind, variant, chunk=c0, seg=None, tiles=None):
        tiles = {k: [list(c) for c in v] for k, v in (tiles or {}).items()}
        p = dict(id=f"{N}/{dist}/{variant}", phase=phase, N=N, docs=dist, kind=kind, variant=variant, chunk=chunk,
                 segment_size=seg, tiles=tiles, seg_len=None, n_seg=None, fwd_progs_per_sm=None)
        if kind == "fla":
            p.update(group="fla", chunk=None)
        else:
            L, ns, per_seg = seg_info(N, chunk, seg, tiles)
            p.update(seg_len=L, n_seg=ns, fwd_progs_per_sm=round(ns * per_seg / sms, 3))
            tk = ";".join(f"{k}={','.join(map(str, v[0]))}" for k, v in sorted(tiles.items())) or "default"
            p["group"] = f"{kind}|C{chunk}|{tk}|NS{ns}"
        pts.append(p)
        return p

    for N, d in cases:
        add("default", N, d, "ours", "default")
    if nodocs:
        for N in sorted(set(tokens), reverse=True):
            add("nodocs", N, "none", "ours_nodocs", "nodocs")
    for N, d in cases:
        L0, _, per_seg = seg_info(N, c0, None, {})
        seen = {L0}
        for k in pps:
            ns = max(1, int(k * sms // per_seg))
            L = cdiv(cdiv(N, ns), c0) * c0
            if L not in seen:
                seen.add(L)
                add("segment", N, d, "ours", f"pps{k:g}", seg=L)
    for N, d in cases:
        for C in chunks[1:]:
            add("chunk", N, d, "ours", f"C{C}", chunk=C)
    lowp = dt == torch.bfloat16
    for N, d in cases:
        if N not in tile_tokens:
            continue
        for kind, n in tile_alts.items():
            for cfg in list(tile_configs(kind, dt, lowp, dim, dim, LinearConfig()))[1:1 + n]:
                add("tile", N, d, "ours", f"{kind}=" + ",".join(map(str, cfg)), tiles={kind: [cfg]})
    if fla:  # last: a cold Triton cache makes fla's first call (autotuning) take minutes
        for N, d in cases:
            add("fla", N, d, "fla", "fla_linear_varlen")
    if not pts:
        raise ValueError("the grid is empty: give --tokens and --docs")
    ids = [p["id"] for p in pts]
    assert len(set(ids)) == len(ids), "duplicate point ids"
    return pts


def warm_groups(grid: Sequence[dict], skip=()) -> Dict[str, List[str]]:
    """{group: [point ids in run order]} of the points not in ``skip``; groups in order of their first point."""
    out: Dict[str, List[str]] = {}
    for p in grid:
        if p["id"] not in skip:
            out.setdefault(p["group"], []).append(p["id"])
    return out


# --------------------------------------------------------------------------------------------- results files
def read_points(path: str) -> Dict[str, dict]:
    """{id: row} of ``points.jsonl`` (the last row of an id wins; a torn last line is ignored)."""
    rows: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rows[r["id"]] = r
    return rows


def append_point(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _is_sticky(msg: str) -> bool:
    from eval.sweep import is_sticky_cuda_error

    return is_sticky_cuda_error(msg)


# --------------------------------------------------------------------------------------------- one point
class Cases:
    """Inputs, ``do`` and the fp32 references of each (N, documents), built on first use."""

    def __init__(self, heads: int, dim: int, dtype, device, check_heads: int):
        self.H, self.D, self.dtype, self.dev, self.ch = heads, dim, dtype, device, check_heads
        self._c: Dict[tuple, dict] = {}

    def get(self, N: int, dist: str) -> dict:
        import torch

        from eval.bench_linear import docs_case

        key = (N, dist)
        if key not in self._c:
            # "none" (no documents): the same tensors as every distribution of this N (seeded by N)
            lens, cu, doc, fq, fk, v = docs_case(N, "fixed:%d" % N if dist == "none" else dist, self.H, self.D,
                                                 self.dtype, self.dev)
            g = torch.Generator(device=self.dev).manual_seed(7)
            do = torch.randn(1, self.H, N, self.D, device=self.dev, dtype=self.dtype, generator=g)
            self._c[key] = dict(lens=lens, cu=cu, doc=None if dist == "none" else doc, fq=fq, fk=fk, v=v, do=do)
        return self._c[key]

    def ref(self, c: dict) -> List:
        """fp32 out, dq, dk, dv of the first ``check_heads`` heads (with ``c['doc']``'s documents, if any)."""
        if "ref" not in c:
            from attn_zoo.backends.torch_linear import chunked_linear_attention

            h = self.ch
            leaves = [t[:, :h].float().detach().requires_grad_() for t in (c["fq"], c["fk"], c["v"])]
            o = chunked_linear_attention(*leaves, True, 1e-6, 64, c["doc"])
            o.backward(c["do"][:, :h].float())
            c["ref"] = [o.detach()] + [t.grad for t in leaves]
        return c["ref"]


def make_fn(p: dict, c: dict):
    """``(fn, leaves, layout_bthd, name, checkable)`` of point ``p`` on case ``c``: ``fn()`` -> output;
    ``checkable``: comparable with the reference (fla's fallback without ``cu_seqlens`` is unnormalised)."""
    if p["kind"] == "fla":
        from eval.bench_linear import _fla_varlen

        name, f, normalised = _fla_varlen(c["cu"])
        a = [t.transpose(1, 2).contiguous().detach().requires_grad_() for t in (c["fq"], c["fk"], c["v"])]
        return (lambda: f(a[0], a[1], a[2])), a, True, name, normalised
    from kernels.linear import LinearConfig, linear_attention

    cfg = LinearConfig(tiles={k: [tuple(x) for x in v] for k, v in p["tiles"].items()}) if p["tiles"] else None
    a = [t.detach().clone().requires_grad_() for t in (c["fq"], c["fk"], c["v"])]
    doc = c["doc"] if p["kind"] == "ours" else None
    C, S = p["chunk"], p["segment_size"]
    return (lambda: linear_attention(a[0], a[1], a[2], causal=True, chunk_size=C, segment_size=S, config=cfg,
                                     doc_ids=doc)), a, False, "ours", True


def run_point(p: dict, cases: Cases, timer, tol: float = 3e-2, check: bool = True) -> dict:
    """Check (one fwd+bwd against the reference) and time one point; returns its result row (``status`` ok /
    error). Exceptions propagate (the caller records them)."""
    import torch

    from eval.bench_linear import _rel
    from kernels.linear import query_segment_len, record_launches, tile_blocks

    c = cases.get(p["N"], p["docs"])
    fn, leaves, bthd, impl, checkable = make_fn(p, c)
    do = c["do"].transpose(1, 2).contiguous() if bthd else c["do"]
    row = {"id": p["id"], "status": "ok", "impl": impl}
    with record_launches() as rec:
        o = fn()
        o.backward(do)
    if check and checkable:
        h = cases.ch
        got = [o.transpose(1, 2) if bthd else o] + [t.grad.transpose(1, 2) if bthd else t.grad for t in leaves]
        for name, x, r in zip(("out", "dq", "dk", "dv"), got, cases.ref(c)):
            row[f"rel_err_{name}"] = _rel(x[:, :h], r)
        errs = [row[f"rel_err_{n}"] for n in ("out", "dq", "dk", "dv")]
        row["ok"] = all(math.isfinite(e) and e < tol for e in errs)
    del o
    if rec.kernels:  # tile config, registers / spill bytes (GPU) of each kernel launched
        row["tiles_used"] = " ".join(f"{k[4:]}{list(cfg)}:r{nr}/s{ns}"
                                     for k, (cfg, nr, ns) in sorted(rec.kernels.items()))
    if rec.skipped:
        row["skipped_tiles"] = "; ".join(f"{k[4:]}{list(cfg)}: {why}" for k, v in sorted(rec.skipped.items())
                                         for cfg, why in v)
    if p["kind"] != "fla":  # the segment length actually used (after any tile fallback)
        H, D = c["fq"].shape[1], c["fq"].shape[3]
        from kernels.linear import LinearConfig

        cfg = LinearConfig(tiles={k: [tuple(x) for x in v] for k, v in p["tiles"].items()})
        L = query_segment_len(1, H, p["N"], D, D, p["chunk"], c["fq"].dtype, c["fq"].device, cfg, p["segment_size"])
        row["seg_len"], row["n_seg"] = L, -(-p["N"] // L)
        if "seg_fwd" in rec.kernels:
            bv = tile_blocks(rec.kernels["seg_fwd"][0], D, D)[1]
            row["fwd_progs_per_sm"] = round(row["n_seg"] * H * -(-D // bv) / _sms(c["fq"].device), 3)

    def fwd():
        with torch.no_grad():
            return fn()

    def fwd_bwd():
        fn().backward(do)

    row["fwd_ms"] = timer(fwd, None)
    row["fwd_bwd_ms"] = timer(fwd_bwd, leaves)
    for t in leaves:
        t.grad = None
    return row


# --------------------------------------------------------------------------------------------- worker / warm
def _load(out: str):
    with open(os.path.join(out, "grid.json")) as f:
        meta = json.load(f)
    return meta, meta["grid"]


def _setup(meta):
    import torch

    a = meta["args"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return Cases(a["heads"], a["dim"], getattr(torch, a["dtype"]), dev, a["check_heads"]), dev


def worker(out: str) -> int:
    """Run the points of ``out/grid.json`` not yet in ``out/points.jsonl``, in order, until its deadline; returns
    the exit code (3: a CUDA error that poisons the context, after recording the point)."""
    import torch

    from eval.bench_common import time_cpu, time_cuda

    meta, grid = _load(out)
    a = meta["args"]
    cases, dev = _setup(meta)
    if dev == "cuda":
        timer = lambda fn, g: time_cuda(fn, a["warmup_ms"], a["rep_ms"], grad_to_none=g, at_least=False)  # noqa: E731
    else:  # the CPU smoke test
        timer = lambda fn, g: time_cpu(fn, grad_to_none=g, rep=1)  # noqa: E731
    pf = os.path.join(out, "points.jsonl")
    done = read_points(pf)
    t0 = meta["t_start"]
    longest = 1.0  # s: the longest point so far; none starts unless that much is left before the deadline
    for p in grid:
        if p["id"] in done:
            continue
        if time.time() + longest > meta["deadline"]:
            print(f"worker: deadline reached before {p['id']}", flush=True)
            return 0
        with open(os.path.join(out, "current.json"), "w") as f:
            json.dump({"id": p["id"]}, f)
        t = time.time()
        try:
            row = run_point(p, cases, timer, a["tol"])
            if dev == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=3)
            msg = f"{type(e).__name__}: {str(e)[:300]}"
            row = {"id": p["id"], "status": "error", "error": msg, "where": "worker"}
            if _is_sticky(msg):
                row["t_s"] = round(time.time() - t, 2)
                append_point(pf, row)
                print(f"worker: CUDA context lost at {p['id']}: {msg}", flush=True)
                return 3
        row["t_s"] = round(time.time() - t, 2)
        longest = max(longest, row["t_s"])
        append_point(pf, row)
        print(f"[{time.time() - t0:6.1f}s] {p['id']:44s} " + "  ".join(
            f"{k} {row[k]:.4g}" if isinstance(row.get(k), float) else f"{k} {row[k]}"
            for k in ("fwd_ms", "fwd_bwd_ms", "rel_err_out", "rel_err_dq", "ok", "error") if k in row), flush=True)
        if dev == "cuda":
            torch.cuda.empty_cache()
    return 0


def warm(out: str, group: str) -> int:
    """One fwd+bwd of each point of ``group`` (compiles its kernels into Triton's cache; pre-screens the point).
    Prints ``start ID`` / ``ok ID`` / ``fail ID message``; returns 3 after a CUDA error that poisons the context."""
    import torch

    meta, grid = _load(out)
    cases, dev = _setup(meta)
    for p in (q for q in grid if q["group"] == group):
        print(f"start {p['id']}", flush=True)
        try:
            c = cases.get(p["N"], p["docs"])
            fn, leaves, bthd, _, _ = make_fn(p, c)
            fn().backward(c["do"].transpose(1, 2).contiguous() if bthd else c["do"])
            if dev == "cuda":
                torch.cuda.synchronize()
            print(f"ok {p['id']}", flush=True)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:300]}".replace("\n", " ")
            print(f"fail {p['id']} {msg}", flush=True)
            if _is_sticky(msg):
                return 3
    return 0


# --------------------------------------------------------------------------------------------- supervisor
def _me() -> List[str]:
    return [sys.executable, "-m", "lab.linear_docs_probe"]


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def parse_warm_output(text: str, rc: Optional[int]) -> Dict[str, str]:
    """{point id: error} of one warm process's output: ``fail`` lines, and the point it was on when it died
    (``rc`` not 0 or None; None: killed at the time limit, which records nothing)."""
    errs: Dict[str, str] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("start "):
            cur = line[6:].strip()
        elif line.startswith("ok "):
            cur = None
        elif line.startswith("fail "):
            pid, _, msg = line[5:].partition(" ")
            errs[pid] = msg
            cur = None
    if cur is not None and rc not in (0, None):
        tail = [ln for ln in text.splitlines() if "rror" in ln][-1:] or text.strip().splitlines()[-1:]
        errs[cur] = f"process died (rc {rc}): {tail[0][:300] if tail else ''}"
    return errs


def warm_phase(out: str, grid: List[dict], jobs: int, until: float, log) -> None:
    """Run :func:`warm` for every group in ``jobs`` parallel processes until ``until`` (epoch s); records the
    points that failed there in ``points.jsonl`` (``where`` warm)."""
    pf = os.path.join(out, "points.jsonl")
    todo = sorted(warm_groups(grid, skip=read_points(pf)).items(), key=lambda kv: kv[0] != "fla")  # fla: longest
    running = []  # (group, its ids, process, start time, output file)
    t_first = time.time()
    env = _env(CUDA_LAUNCH_BLOCKING="1", FLA_CACHE_RESULTS="0")
    with open(os.path.join(out, "warm.log"), "a") as wl:
        while todo or running:
            while todo and len(running) < jobs and time.time() < until:
                g, ids = todo.pop(0)
                buf = tempfile.TemporaryFile("w+")  # not a pipe: a chatty process must not block on it
                proc = subprocess.Popen(_me() + ["--warm", out, g], stdout=buf, stderr=subprocess.STDOUT, text=True,
                                        env=env)
                running.append((g, ids, proc, time.time(), buf))
            if not running:
                break
            time.sleep(0.2)
            for item in list(running):
                g, ids, proc, t0, buf = item
                rc = proc.poll()
                killed = False
                if rc is None and time.time() > until:
                    proc.kill()
                    killed = True
                    rc = proc.wait()
                if rc is None:
                    continue
                buf.seek(0)
                text = buf.read()
                buf.close()
                running.remove(item)
                errs = parse_warm_output(text, None if killed else rc)
                wl.write(f"==== group {g} rc {rc}{' (killed at the warm deadline)' if killed else ''} "
                         f"{time.time() - t0:.1f}s\n{text}\n")
                wl.flush()
                for pid, msg in errs.items():
                    append_point(pf, {"id": pid, "status": "error", "error": msg, "where": "warm"})
                n_ok = text.count("\nok ") + text.startswith("ok ")
                log(f"warm {g}: {n_ok}/{len(ids)} ok, {len(errs)} failed, rc {rc}"
                    f"{' (killed)' if killed else ''}, {time.time() - t0:.1f}s")
            if not todo and not running:
                break
    log(f"warm phase: {time.time() - t_first:.1f}s")


def supervise(out: str, grid: List[dict], deadline: float, max_restarts: int, log, cmd=None) -> None:
    """Run the worker (``cmd``, default this module's ``--worker out``) until every point of ``grid`` has a row or
    the deadline passes; a worker that dies leaves its current point recorded as an error and a new one resumes."""
    pf = os.path.join(out, "points.jsonl")
    cmd = cmd or _me() + ["--worker", out]
    for attempt in range(max_restarts + 1):
        done = read_points(pf)
        if all(p["id"] in done for p in grid):
            return
        left = deadline - time.time()
        if left < 3:
            log("supervisor: out of time")
            return
        cur_f = os.path.join(out, "current.json")
        if os.path.exists(cur_f):
            os.remove(cur_f)
        log(f"worker attempt {attempt + 1}: {sum(p['id'] not in done for p in grid)} points left, {left:.0f}s")
        try:
            rc = subprocess.run(cmd, env=_env(), timeout=left + 3).returncode
        except subprocess.TimeoutExpired:
            rc = None
        cur = None
        if os.path.exists(cur_f):
            with open(cur_f) as f:
                cur = json.load(f).get("id")
        done = read_points(pf)
        if rc == 0:
            continue  # finished or reached the deadline: the loop's checks decide
        if cur is not None and cur not in done:
            why = "killed at the deadline (budget spent, or a hang)" if rc is None else f"worker died (rc {rc})"
            append_point(pf, {"id": cur, "status": "error", "error": why, "where": "worker"})
        log(f"worker attempt {attempt + 1}: rc {rc} at {cur}")
        if rc is None:
            return


def recorded_anchor(path: str) -> Dict[tuple, float]:
    """{(N, docs): fla varlen fwd+bwd ms} of a ``bench_linear --docs`` CSV (empty without the file)."""
    from eval.bench_common import read_rows

    out = {}
    for r in read_rows(path) if path else []:
        if r.get("method", "").startswith("fla_") and r.get("fwd_bwd_ms"):
            try:
                out[(int(r["N"]), r["docs"])] = float(r["fwd_bwd_ms"])
            except ValueError:
                pass
    return out


def finish(out: str, grid: List[dict], meta: dict) -> List[dict]:
    """Merge the grid with ``points.jsonl``: the rows (one per point, ``skipped`` where none), the ratios; writes
    ``linear_docs_probe.{csv,json}``; returns the rows."""
    from eval.bench_common import write_csv, write_json

    rec = recorded_anchor(meta.get("args", {}).get("anchor_csv", ""))

    res = read_points(os.path.join(out, "points.jsonl"))
    rows = []
    for p in grid:
        r = {k: v for k, v in p.items() if k not in ("tiles", "group")}
        r.update(res.get(p["id"], {"status": "skipped", "error": "not reached (budget)"}))
        rows.append(r)
    by = {(r["N"], r["docs"], r["kind"], r["variant"]): r for r in rows}
    for r in rows:
        t = r.get("fwd_bwd_ms")
        if not (isinstance(t, float) and t > 0) or r["kind"] == "fla":
            continue
        f = next((x for (n, d, k, _), x in by.items() if n == r["N"] and d == r["docs"] and k == "fla"), None)
        if f and isinstance(f.get("fwd_bwd_ms"), float):
            r["x_fla"] = f["fwd_bwd_ms"] / t
        if (r["N"], r["docs"]) in rec:
            r["x_fla_rec"] = rec[(r["N"], r["docs"])] / t
        base = by.get((r["N"], r["docs"], "ours", "default"))
        if base and isinstance(base.get("fwd_bwd_ms"), float):
            r["x_default"] = base["fwd_bwd_ms"] / t
    write_csv(rows, os.path.join(out, "linear_docs_probe.csv"),
              columns=CSV_COLS + sorted({k for r in rows for k in r} - set(CSV_COLS)))
    write_json(rows, os.path.join(out, "linear_docs_probe.json"), env=meta.get("env"))
    return rows


def print_table(rows: List[dict]) -> None:
    from eval.bench_common import format_table

    for r in rows:
        errs = [r.get(f"rel_err_{n}") for n in ("out", "dq", "dk", "dv")]
        errs = [e for e in errs if isinstance(e, float)]
        r["max_rel_err"] = f"{max(errs):.1e}" if errs else None
        r["err"] = (r.get("error") or "")[:50]
    cols = ["N", "docs", "variant", "chunk", "seg_len", "n_seg", "fwd_progs_per_sm", "fwd_ms", "fwd_bwd_ms", "x_fla",
            "x_fla_rec", "x_default", "max_rel_err", "ok", "err"]
    print("\nlinear attention, packed documents (B = 1): fwd+bwd ms; x_fla = fla varlen / ours (target >= 1.5; "
          "_rec: fla's time recorded 2026-12-04); x_default = default / this")
    print(format_table(rows, cols, "{:.3f}"))
    for r in rows:
        r.pop("err", None)
        r.pop("max_rel_err", None)


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        raise SystemExit(f"linear_docs_probe: {e}")
    if args.worker:
        return worker(args.worker)
    if args.warm:
        return warm(*args.warm)
    t_start = _T0
    import torch

    from eval.bench_common import env_info

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    grid = build_grid(args.tokens, args.docs, args.heads, args.dim, args.dtype, args.chunks, args.pps,
                      args.tile_tokens, args.tile_alts, fla=not args.no_fla, nodocs=not args.no_nodocs, device=dev)
    if args.dry_run:
        for p in grid:
            print(f"{p['phase']:8s} {p['id']:44s} C {p['chunk'] or '-':>4} L {p['seg_len'] or '-':>6} "
                  f"NS {p['n_seg'] or '-':>4} fwd progs/SM {p['fwd_progs_per_sm'] or '-':>6}  group {p['group']}")
        print(f"{len(grid)} points, {len(warm_groups(grid))} compile groups")
        return 0
    if dev != "cuda":
        raise SystemExit("linear_docs_probe needs a CUDA device (--dry-run prints the grid)")

    def log(msg):
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    for f in ("points.jsonl", "current.json", "warm.log"):  # a fresh run (no resume across runs)
        if os.path.exists(os.path.join(args.out, f)):
            os.remove(os.path.join(args.out, f))
    env = env_info()
    try:
        import fla

        env["fla_core"] = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        env["fla_core"] = None
        log(f"fla not importable ({type(e).__name__}: {e}): its points will record the error")
    deadline = t_start + args.budget_s
    meta = dict(args=vars(args), env=env, t_start=t_start, deadline=deadline, grid=grid)
    with open(os.path.join(args.out, "grid.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    log(f"{len(grid)} points, {len(warm_groups(grid))} compile groups, env {env}")
    if args.warm_jobs > 0:
        warm_phase(args.out, grid, args.warm_jobs, t_start + args.warm_share * args.budget_s, log)
    supervise(args.out, grid, deadline, args.max_restarts, log)
    rows = finish(args.out, grid, meta)
    print_table(rows)
    bad = [r["id"] for r in rows if r.get("ok") is False]
    if bad:
        print(f"WRONG RESULTS (rel err >= {args.tol}): {', '.join(bad)}")
    log(f"done; {sum(r['status'] == 'ok' for r in rows)}/{len(rows)} points ran; files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
