"""Compile attn-zoo's Triton kernels for Hopper (sm_90a) without a GPU and print what the compiler made of them.

Runs on a CPU-only machine (Triton compiles for a named target; its wheel carries ``ptxas`` / ``cuobjdump``).
For each kernel and tile configuration: the loads the software pipeliner prefetched (``cp.async`` copies into
shared memory in the loop), the wgmma (Hopper tensor-core) products, the shared memory per program, and the
registers and stack bytes (spills) from the cubin, and a hash of the SASS (``sass``: same hash, same machine
code). One program per SM at 8 warps x 255 registers; a stack above 0 means spilled registers. Use it to check a
kernel change or a tile choice before spending GPU time (the numbers depend on the Triton version: the GPU
machine runs triton 3.6, install it in a venv to match).

Usage (from the repo root)::

    python -m lab.inspect_kernels                       # linear kernels at their bf16 default tiles, flash fwd
    python -m lab.inspect_kernels --flash-cases         # every exact-attention kernel in 14 modes (A/B checks)
    python -m lab.inspect_kernels --kernels seg_dkdv --tile 64,64,8,3,0
    python -m lab.inspect_kernels --kernels flash_fwd --sparse --tile 64,64,4,2
    python -m lab.inspect_kernels --kernels flash_fwd --sparse --aligned --sass   # no per-element layout gather
    python -m lab.inspect_kernels --kernels flash_fwd --tma --tile 128,64,4,2   # TMA-streamed K / V
    python -m lab.inspect_kernels --kernels flash_dkdv,flash_dq --window --dilated  # dilated window build
    python -m lab.inspect_kernels --sass                # + instruction mix of each kernel's main loop
    python -m lab.inspect_kernels --docs --paths        # + each path through the main loops (run-time branches)
    python -m lab.inspect_kernels --ssd-cases           # Mamba-2 SSD kernels (kernels/ssd.py) at the bench shape

Shapes are the benchmark's: F = Dv = D = 128, bf16, chunk 64; ``G`` (query heads per K/V head) 1. Integer
arguments are compiled as the launcher specialises them: 16-divisible, unit strides and ``dilation = 1`` as
constants. The script also runs against a checkout from before the kernel split (``kernels/flash.py``): copy it
there and run it from that root to compare registers, spills and SASS hashes of the same kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import tempfile
import warnings

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import kernels.flash as FL
import kernels.linear as LN
from eval.bench_common import int_list

try:
    import kernels.ssd as SSD
except ImportError:  # a checkout without the SSD kernels
    SSD = None

D = 128
LINEAR = ("seg_state", "seg_fwd", "seg_dstate", "seg_dq", "seg_dkdv", "seg_dkv")
FLASH = ("flash_fwd", "flash_dq", "flash_dkdv", "flash_pre")
KERNELS = LINEAR + FLASH

# the kernel objects; the fallbacks read a checkout from before the split (private names of that version)
FLASH_KERNELS = getattr(FL, "KERNELS", None) or dict(getattr(FL, "_KERNELS"), pre=getattr(FL, "_bwd_preprocess"))
LINEAR_KERNELS = getattr(LN, "KERNELS", None) or {k: getattr(LN, "_" + k) for k in LINEAR}
tile_blocks = getattr(LN, "tile_blocks", None) or getattr(LN, "_blocks")
tile_configs = getattr(LN, "tile_configs", None) or getattr(LN, "_tiles")

SASS_OPS = ("HGMMA", "BAR", "SHFL", "LDS", "STS", "LDL", "STL", "MUFU", "F2F")

# (kind, tile, sparse mode, TMA, HAS_LEFT, HAS_RIGHT, ATOMIC_DQ): the modes the launcher compiles at D = 128 with
# its heuristic tiles (non-TMA dense / causal / window / sparse 1 and 2, TMA dense and causal, atomic dQ)
FLASH_CASES = {
    "fwd_causal": ("flash_fwd", (128, 64, 8, 3), 0, False, False, True, False),
    "fwd_full": ("flash_fwd", (128, 64, 8, 3), 0, False, False, False, False),
    "fwd_window": ("flash_fwd", (64, 64, 4, 3), 0, False, True, True, False),
    "fwd_sparse1": ("flash_fwd", (64, 64, 4, 3), 1, False, False, True, False),
    "fwd_sparse2": ("flash_fwd", (64, 64, 4, 3), 2, False, False, True, False),
    "fwd_tma": ("flash_fwd", (128, 64, 4, 2), 0, True, False, False, False),
    "dq_causal": ("flash_dq", (128, 64, 8, 4), 0, False, False, True, False),
    "dq_sparse2": ("flash_dq", (64, 64, 4, 2), 2, False, False, True, False),
    "dq_tma": ("flash_dq", (128, 64, 8, 3), 0, True, False, False, False),
    "dkdv_causal": ("flash_dkdv", (64, 64, 4, 2), 0, False, False, True, False),
    "dkdv_window_atomic": ("flash_dkdv", (64, 64, 4, 2), 0, False, True, True, True),
    "dkdv_sparse2": ("flash_dkdv", (64, 64, 4, 2), 2, False, False, True, False),
    "dkdv_tma": ("flash_dkdv", (64, 64, 4, 2), 0, True, False, True, False),
    "pre": ("flash_pre", (64, 0, 4, 3), 0, False, False, False, False),
}


def _sass_loop(sass: str) -> dict:
    """Instruction counts of the largest loop (backward branch) in a SASS dump: its length per warp and per
    iteration, and the ops in ``SASS_OPS`` (tensor-core products, barriers, warp shuffles, shared-memory and
    spill traffic, special functions, conversions)."""
    rows = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2)))
    best = None
    for addr, ins in rows:
        if "BRA" in ins:
            t = re.search(r"0x([0-9a-f]+)", ins.split("BRA", 1)[1])
            if t and int(t.group(1), 16) < addr and (best is None or addr - int(t.group(1), 16) > best[1] - best[0]):
                best = (int(t.group(1), 16), addr)
    if best is None:
        return {"loop_instr": 0}
    body = [re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for a, ins in rows if best[0] <= a <= best[1]]
    out = {"loop_instr": len(body)}
    for op in SASS_OPS:
        out[op] = sum(1 for o in body if o.split(".")[0] == op)
    return out


def _sass_rows(sass: str) -> list:
    """``[(address, instruction)]`` of a SASS dump."""
    rows = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2)))
    return rows


def _sass_paths(sass: str, n_loops: int = 2, top: int = 4) -> dict:
    """The paths through the ``n_loops`` largest loops (backward branches, not nested in each other) of a SASS
    dump: each path from the loop's head to its back edge following the forward branches inside the loop (a
    run-time ``if`` in the kernel, e.g. the document kernels' per-chunk test, gives several), as ``length/HGMMA/LDL``
    (instructions per warp and iteration), the ``top`` shortest distinct ones and the longest."""
    rows = _sass_rows(sass)
    idx = {a: i for i, (a, _) in enumerate(rows)}
    op = lambda ins: re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]  # noqa: E731
    target = lambda ins: int(re.search(r"0x([0-9a-f]+)", ins.split("BRA", 1)[1]).group(1), 16)  # noqa: E731
    loops = sorted(((target(ins), a) for a, ins in rows if op(ins) == "BRA" and re.search(r"0x[0-9a-f]+", ins.split(
        "BRA", 1)[1]) and target(ins) < a), key=lambda lp: lp[0] - lp[1])
    chosen = []
    for lo, hi in loops:
        if len(chosen) < n_loops and all(hi < c[0] or lo > c[1] for c in chosen):
            chosen.append((lo, hi))
    out = {}
    for n, (lo_a, hi_a) in enumerate(chosen, 1):
        lo, hi = idx[lo_a], idx[hi_a]
        paths, stack = [], [(lo, [])]
        while stack and len(paths) < 4096:
            i, path = stack.pop()
            while True:
                path.append(i)
                if i == hi:
                    paths.append(path)
                    break
                ins = rows[i][1]
                nxt = [i + 1]
                if op(ins) == "BRA":
                    t = idx.get(target(ins))
                    nxt = ([t] if t is not None and i < t <= hi else []) + ([i + 1] if ins.startswith("@") else [])
                if not nxt:
                    break
                for j in nxt[1:]:
                    stack.append((j, list(path)))
                i = nxt[0]
        kinds = sorted({(len(p), sum(op(rows[i][1]) == "HGMMA" for i in p), sum(op(rows[i][1]) == "LDL" for i in p))
                        for p in paths})
        shown = kinds[:top] + (kinds[-1:] if len(kinds) > top else [])
        out[f"loop{n}_paths"] = ",".join("/".join(map(str, k)) for k in shown)
    return out


def signature(fn, types: dict, const: dict, divisible) -> tuple:
    """``(signature, attrs)`` of a compile of ``fn`` for ``triton.compile``: constexpr for the names in ``const``,
    ``types[name]`` for the others, and ``tt.divisibility`` 16 where ``divisible(name, type)`` says (as the launcher
    specialises aligned pointers and sizes)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
        else:
            sig[name] = types[name]
            if divisible(name, types[name]):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def resource_usage(cubin: bytes, sass: bool = False) -> tuple:
    """``({"registers", "stack_bytes"}, sass text or None)`` of a compiled kernel's cubin, from triton's cuobjdump."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        dump = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True).stdout if sass else None
    out = {}
    for key, pat in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)")):
        m = re.search(pat, res)
        out[key] = int(m.group(1)) if m else None
    return out, dump


def compile_sm90(fn, types: dict, const: dict, num_warps: int, num_stages: int, sass: bool = False,
                 paths: bool = False) -> dict:
    """Compile ``fn`` for sm_90a. ``types``: arg name -> Triton type ("*bf16", "i32", ...); pointers and i32
    arguments are marked 16-divisible (as the launcher specialises aligned tensors and sizes); ``const``: the
    constexpr values. Returns the counts printed by this script (with ``sass``: also the instruction mix of the
    largest loop, see ``_sass_loop``)."""
    sig, attrs = signature(fn, types, const, lambda name, t: t.startswith("*") or t == "i32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    ttgir = ck.asm["ttgir"]
    out = {"prefetched_loads": len(re.findall(r"async_copy_global_to_local", ttgir)),
           "wgmma": len(re.findall(r"warp_group_dot ", ttgir)), "shared_kib": round(ck.metadata.shared / 1024, 1)}
    usage, dump = resource_usage(ck.asm["cubin"], sass=True)
    out.update(usage)
    code = [line for line in dump.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    out["sass"] = hashlib.sha256("\n".join(code).encode()).hexdigest()[:12]
    if sass:
        out.update(_sass_loop(dump))
    if paths:
        out.update(_sass_paths(dump))
    return out


def _linear(kind: str, cfg, fm: int = 1, in_loop: bool = False, docs: bool = False):
    """Types and constexprs of one linear kernel at a tile config (BK, BV, warps, stages, chunk); ``docs``: the
    packed-document build (``DOCS``, an int32 document index)."""
    BK, BV = tile_blocks(cfg, D, D)
    C = min(64, cfg[4]) if len(cfg) > 4 and cfg[4] else 64
    ints = {"NQ", "NK", "F", "DV", "L", "HQ", "G", "NSS", "NS", "NROWS", "HKV"}
    fp32 = {"SS", "ZS", "S0", "Z0", "DEN", "ST", "ZT", "CD", "DSS", "DZS", "DT0", "DZT0", "DS0", "DZ0", "RDEN"}
    fn = LINEAR_KERNELS[kind]
    types = {n: ("i32" if n in ints else "*fp32" if n in fp32 else "fp32" if n == "eps" else
                 "*i32" if n == "DOC" else "*bf16") for n in fn.arg_names}
    base = dict(C=C, FM=fm if in_loop else 0, DFM=0 if in_loop else fm, PREC="tf32", SPREC="tf32", UP=False, STG=cfg[3],
                DOCS=docs)
    extra = {
        "seg_state": dict(BK=BK, BV=BV),
        "seg_fwd": dict(FP=D, BV=BV, CAUSAL=True, HAS_SS=True, HAS_0=False, STORE_T=False, S16=True),
        "seg_dstate": dict(BK=BK, BV=BV, LOWP=True, G=1),
        "seg_dq": dict(BK=BK, DVP=D, CAUSAL=True, HAS_SS=True, HAS_0=False, LOWP=True),
        "seg_dkdv": dict(BK=BK, BV=BV, FP=D, DVP=D, CAUSAL=True, HAS_SS=True, HAS_0=False, STORE_0=False, LOWP=True,
                         G=1),
        "seg_dkv": dict(FP=D, DVP=D, HAS_SS=True, HAS_0=False, STORE_0=False, LOWP=True, G=1),
    }[kind]
    const = {k: v for k, v in {**base, **extra}.items() if k in fn.arg_names}
    return fn, types, const


_FP32_ARGS = {"Lse", "Lse2", "Delta", "DQA", "DLSE"}
_I32_ARGS = {"KV_IDX", "KV_CNT", "KV_NFULL", "Q_IDX", "Q_CNT", "Q_NFULL"}
_BF16_ARGS = {"Q", "K", "V", "Out", "O", "DO", "DK", "DV", "DQ"}


def _flash(kind: str, cfg, sparse: int, tma: bool = False, left: bool = False, right: bool = True,
           atomic: bool = False, dilated: bool = False):
    """Types and constexprs of an exact-attention kernel (``kind`` one of ``FLASH``) at (BLOCK_M, BLOCK_N, warps,
    stages); ``tma``: the streamed operands (K / V, or Q / dO for dK/dV) through TMA descriptors, else pointer
    loads; ``left`` / ``right``: window edges (causal: right); ``dilated``: the ``DILATED`` build (dilation 2)."""
    fn = FLASH_KERNELS[kind[len("flash_"):]]
    rows = cfg[0] if kind == "flash_dkdv" else cfg[1]
    types = {}
    for n in fn.arg_names:
        if n in ("Kd", "Vd", "Qd", "DOd"):
            types[n] = f"tensordesc<bf16[1, 1, {rows}, {D}]>" if tma else "*bf16"
        elif n in _FP32_ARGS:
            types[n] = "*fp32"
        elif n in _I32_ARGS:
            types[n] = "*i32"
        elif n == "LAYOUT":
            types[n] = "*i8"
        elif n == "DOC":
            types[n] = "*i32"
        elif n in _BF16_ARGS:
            types[n] = "*bf16"
        elif n in ("qk_scale", "sm_scale"):
            types[n] = "fp32"
        else:
            types[n] = "i32"
    const = {n: 1 for n in fn.arg_names if re.fullmatch(r"stride_\w*d", n)}  # unit strides specialise to 1
    if not dilated:
        const["dilation"] = 1  # an int argument equal to 1 is a constant of the compile
    if kind == "flash_pre":
        const.update(HAS_DLSE=True, HEAD_D=D, BLOCK_D=D, BLOCK_M=cfg[0])
    else:
        const.update(HEAD_D=D, BLOCK_D=D, HEAD_DV=D, BLOCK_DV=D, DOCS=False, HAS_LEFT=left, HAS_RIGHT=right, SPARSE=sparse, DOT_PREC="tf32", TMA=tma,
                     ATOMIC_DQ=atomic, DILATED=dilated, BLOCK_M=cfg[0], BLOCK_N=cfg[1])
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    return fn, types, const


def ssd_cases(L: int = 64, NS: int = 128, PD: int = 64, sdt: str = "bf16", docs: bool = False):
    """``{name: (kernel, types, constexprs, warps, stages)}`` of kernels/ssd.py as ``ssd_scan`` launches them on
    bf16 inputs at chunk ``L``, d_state ``NS``, head dim ``PD`` (the bench's 64 / 128 / 64), the state snapshots in
    ``sdt`` ("bf16", or "fp32": the former layout); plus the triton-3.6 fault's shape (d_state 64, P-block 32)."""
    ints = {"T", "H", "HPG", "NS", "PD", "NC", "NBH", "NE", "NB", "G", "HPP"}
    fp32 = {"A", "EL", "E", "INIT", "FIN", "DA"}
    state = {"ST", "DST", "OUT", "X"}  # X: the pass kernel's buffer (the chunk kernels' X is overridden below)

    def types_of(fn, overrides=None):
        t = {}
        for n in fn.arg_names:
            t[n] = ("i32" if n in ints or n.startswith("s") and n[1:] in ("xb", "xt", "xh", "ab", "at", "ah", "bb",
                                                                            "bt", "bg", "cb", "ct", "cg", "yb", "yt",
                                                                            "yh", "zb", "zt", "zg", "vb", "vt", "vh")
                    else "*fp32" if n in fp32 else "*i32" if n == "SEG" else f"*{sdt}" if n in state else "*bf16")
        t.update(overrides or {})
        return t

    BN = SSD._pow2(NS)
    BP = min(SSD._pow2(PD), 64)
    w = SSD._warps(L, BN)
    bwd_bp = min(BP, SSD._BWD_BLOCK_P)
    bwd_st = SSD._bwd_stages(L, BN, 2 if sdt == "bf16" else 4) if hasattr(SSD, "_bwd_stages") else 1
    obk = min(SSD._OUT_BLOCK_N, BN)
    sb = SSD._seq_blocks(NS, PD, None)
    out = {
        "ssd_chunk_state": (SSD._chunk_state_kernel, types_of(SSD._chunk_state_kernel),
                            dict(L=L, BN=BN, BP=BP, WRITE=True, DOCS=docs), w, 3),
        "ssd_state_pass": (SSD._state_pass_kernel, types_of(SSD._state_pass_kernel),
                           dict(HAS_INIT=True, REVERSE=False, UNR=SSD._PASS_UNROLL, BLK=SSD._PASS_BLOCK), 4, 3),
        "ssd_state_seq": (SSD._state_seq_kernel, types_of(SSD._state_seq_kernel),
                          dict(L=L, SBN=sb[0], SBP=sb[1], REVERSE=False, HAS_INIT=True, DOCS=docs),
                          4 if sb[0] * sb[1] <= 4096 else 8, 3),
        "ssd_chunk_out": (SSD._chunk_out_kernel, types_of(SSD._chunk_out_kernel, {"X": "*bf16"}),
                          dict(L=L, BN=BN, BK=obk, BP=BP, DOCS=docs), w, SSD._OUT_STAGES[2]),
        "ssd_chunk_out_group": (SSD._chunk_out_group_kernel, types_of(SSD._chunk_out_group_kernel, {"X": "*bf16"}),
                                dict(L=L, BN=BN, BP=BP, DOCS=docs), w, SSD._OUT_STAGES[2]),
        "ssd_bwd_dx": (SSD._chunk_bwd_dx_kernel, types_of(SSD._chunk_bwd_dx_kernel, {"X": "*bf16", "DX": "*bf16"}),
                       dict(L=L, BN=BN, BP=bwd_bp, DOCS=docs), w, bwd_st),
        "ssd_bwd_dbc": (SSD._chunk_bwd_dbc_kernel, types_of(SSD._chunk_bwd_dbc_kernel, {"X": "*bf16"}),
                        dict(L=L, BN=BN, BP=bwd_bp, DOCS=docs), w, bwd_st),
        # the shape triton 3.6 faulted on at 4 warps (d_state 64, head dim 32: Mamba-2's model config)
        "ssd_chunk_out_ns64_p32": (SSD._chunk_out_kernel, types_of(SSD._chunk_out_kernel, {"X": "*bf16"}),
                                   dict(L=L, BN=64, BK=min(SSD._OUT_BLOCK_N, 64), BP=32, DOCS=docs),
                                   SSD._warps(L, 64), SSD._OUT_STAGES[2]),
    }
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default=",".join(LINEAR + ("flash_fwd",)), help=f"comma list of {', '.join(KERNELS)}")
    p.add_argument("--flash-cases", action="store_true",
                   help=f"every exact-attention kernel in the launcher's modes ({', '.join(FLASH_CASES)})")
    p.add_argument("--tile", default="", help="linear: BK,BV,warps,stages[,chunk]; flash_*: BLOCK_M,BLOCK_N,"
                                               "warps,stages (default: the kernel's default)")
    p.add_argument("--sparse", action="store_true", help="flash_*: the block-sparse variant (table loops)")
    p.add_argument("--aligned", action="store_true", help="flash_* --sparse: tiles inside one layout block (no "
                                                          "per-element layout gather, FlashConfig.sparse_aligned_no_gather)")
    p.add_argument("--window", action="store_true", help="flash_*: a left window edge too (sliding window)")
    p.add_argument("--noncausal", action="store_true", help="flash_*: no right window edge")
    p.add_argument("--atomic", action="store_true", help="flash_dkdv: the fused atomic dQ (dq_mode='atomic')")
    p.add_argument("--dilated", action="store_true", help="flash_*: the dilated build (DILATED, dilation 2)")
    p.add_argument("--fm", type=int, default=1, choices=(0, 1, 2),
                   help="linear: feature map (0 none, 1 elu1, 2 relu; default 1): its chain rule in dq / dk")
    p.add_argument("--phi-in-loop", action="store_true",
                   help="linear: the map applied in every chunk loop (LinearConfig.phi_in_loop) instead of a pre-pass")
    p.add_argument("--docs", action="store_true", help="linear: the packed-document build (DOCS)")
    p.add_argument("--tma", action="store_true", help="flash_*: streamed operands through TMA descriptors")
    p.add_argument("--ssd-cases", action="store_true",
                   help="the Mamba-2 SSD kernels (kernels/ssd.py) as ssd_scan launches them at chunk 64, d_state 128, "
                        "head dim 64 (bf16 inputs), and the output kernel at d_state 64 / P-block 32")
    p.add_argument("--ssd-state", default="bf16", choices=("bf16", "fp32"),
                   help="--ssd-cases: the dtype of the stored state snapshots (ssd_scan's state_dtype)")
    p.add_argument("--sass", action="store_true", help="also the instruction mix of the largest loop (per warp and "
                                                        "iteration: HGMMA, barriers, shuffles, shared / spill traffic)")
    p.add_argument("--paths", action="store_true", help="also the paths through the two largest loops (length/HGMMA/"
                                                         "LDL per path: a run-time branch in the loop gives several)")
    args = p.parse_args(argv)
    print(f"triton {triton.__version__}, target sm_90a, D = F = Dv = {D}, bf16")
    if args.ssd_cases:
        if SSD is None:
            raise SystemExit("--ssd-cases: this checkout has no kernels/ssd.py")
        for docs in (False, True):
            for name, (fn, types, const, warps, stages) in ssd_cases(sdt=args.ssd_state, docs=docs).items():
                r = compile_sm90(fn, types, const, warps, stages, sass=args.sass, paths=args.paths)
                tiles = {k: v for k, v in const.items() if k != "DOCS"}
                print(f"{name + (' docs' if docs else ''):27s} {tiles} warps={warps} stages={stages}: "
                      + "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        return
    if args.flash_cases:
        for name, (kind, cfg, sparse, tma, left, right, atomic) in FLASH_CASES.items():
            fn, types, const = _flash(kind, cfg, sparse, tma, left, right, atomic)
            r = compile_sm90(fn, types, const, cfg[2], cfg[3], sass=args.sass)
            print(f"{name:19s} {kind:10s} tile={cfg}: " + "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        return
    names = [k for k in args.kernels.split(",") if k]
    bad = [k for k in names if k not in KERNELS]
    if bad:
        raise SystemExit(f"--kernels: unknown {bad}; allowed values: {', '.join(KERNELS)}")
    # minimum 0: flash_pre's tiles have BLOCK_N 0
    tile = tuple(int_list(args.tile, "--tile", "tile sizes", minimum=0)) if args.tile else None
    if tile is not None and len(tile) < 4:
        raise SystemExit(f"--tile={args.tile!r}: expected at least 4 comma-separated integers")
    for name in names:
        if name in FLASH:
            default = {"flash_fwd": (64, 64, 4, 3) if args.sparse else (128, 64, 8, 3),
                       "flash_dq": (64, 64, 4, 2) if args.sparse else (128, 64, 8, 4),
                       "flash_dkdv": (64, 64, 4, 2), "flash_pre": (64, 0, 4, 3)}[name]
            cfg = tile or default
            sparse = (2 if args.aligned else 1) if args.sparse else 0
            fn, types, const = _flash(name, cfg, sparse, args.tma, args.window, not args.noncausal, args.atomic,
                                      args.dilated)
        else:
            cfg = tile or tile_configs(name, torch.bfloat16, name != "seg_state", D, D)[0]
            fn, types, const = _linear(name, cfg, args.fm, args.phi_in_loop, args.docs)
        r = compile_sm90(fn, types, const, cfg[2], cfg[3], sass=args.sass, paths=args.paths)
        print(f"{name:10s} tile={cfg}: " + "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
