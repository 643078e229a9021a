"""Compile attn-zoo's Triton kernels for Hopper (sm_90a) without a GPU and print what the compiler made of them.

Runs on a CPU-only machine (Triton compiles for a named target; its wheel carries ``ptxas`` / ``cuobjdump``).
For each kernel and tile configuration: the loads the software pipeliner prefetched (``cp.async`` copies into
shared memory in the loop), the wgmma (Hopper tensor-core) products, the shared memory per program, and the
registers and stack bytes (spills) from the cubin. One program per SM at 8 warps x 255 registers; a stack
above 0 means spilled registers. Use it to check a kernel change or a tile choice before spending GPU time
(the numbers depend on the Triton version: the GPU machine runs triton 3.6, install it in a venv to match).

Usage::

    python eval/inspect_kernels.py                       # linear kernels at their bf16 default tiles, flash fwd
    python eval/inspect_kernels.py --kernels seg_dkdv --tile 64,64,8,3,0
    python eval/inspect_kernels.py --kernels flash_fwd --sparse --tile 64,64,4,2
    python eval/inspect_kernels.py --kernels flash_fwd --sparse --aligned --sass   # no per-element layout gather
    python eval/inspect_kernels.py --kernels flash_fwd --tma --tile 128,64,4,2   # TMA-streamed K / V
    python eval/inspect_kernels.py --sass                # + instruction mix of each kernel's main loop

Shapes are the benchmark's: F = Dv = D = 128, bf16, chunk 64; ``G`` (query heads per K/V head) 1.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.flash as FL  # noqa: E402
import kernels.linear as LN  # noqa: E402

D = 128
LINEAR = ("seg_state", "seg_fwd", "seg_dstate", "seg_dq", "seg_dkdv")
KERNELS = LINEAR + ("flash_fwd",)


SASS_OPS = ("HGMMA", "BAR", "SHFL", "LDS", "STS", "LDL", "STL", "MUFU", "F2F")


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


def compile_sm90(fn, types: dict, const: dict, num_warps: int, num_stages: int, sass: bool = False) -> dict:
    """Compile ``fn`` for sm_90a. ``types``: arg name -> Triton type ("*bf16", "i32", ...); pointers and i32
    arguments are marked 16-divisible (as the launcher specialises aligned tensors and sizes); ``const``: the
    constexpr values. Returns the counts printed by this script (with ``sass``: also the instruction mix of the
    largest loop, see ``_sass_loop``)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
        else:
            sig[name] = types[name]
            if types[name].startswith("*") or types[name] == "i32":
                attrs[(i,)] = [["tt.divisibility", 16]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    ttgir = ck.asm["ttgir"]
    out = {"prefetched_loads": len(re.findall(r"async_copy_global_to_local", ttgir)),
           "wgmma": len(re.findall(r"warp_group_dot ", ttgir)), "shared_kib": round(ck.metadata.shared / 1024, 1)}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(ck.asm["cubin"])
        res = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True)
        if sass:
            dump = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True).stdout
    for key, pat in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)")):
        m = re.search(pat, res.stdout)
        out[key] = int(m.group(1)) if m else None
    if sass:
        out.update(_sass_loop(dump))
    return out


def _linear(kind: str, cfg, fm: int = 1, in_loop: bool = False):
    """Types and constexprs of one linear kernel at a tile config (BK, BV, warps, stages, chunk)."""
    BK, BV = LN._blocks(cfg, D, D)
    C = min(64, cfg[4]) if len(cfg) > 4 and cfg[4] else 64
    ints = {"NQ", "NK", "F", "DV", "L", "HQ", "G", "NSS", "NS", "NROWS"}
    fp32 = {"SS", "ZS", "S0", "Z0", "DEN", "ST", "ZT", "CD", "DSS", "DZS", "DT0", "DZT0", "DS0", "DZ0"}
    fn = getattr(LN, "_" + kind)
    types = {n: ("i32" if n in ints else "*fp32" if n in fp32 else "fp32" if n == "eps" else "*bf16")
             for n in fn.arg_names}
    base = dict(C=C, FM=fm if in_loop else 0, DFM=0 if in_loop else fm, PREC="tf32", SPREC="tf32", UP=False, STG=cfg[3])
    extra = {
        "seg_state": dict(BK=BK, BV=BV),
        "seg_fwd": dict(FP=D, BV=BV, CAUSAL=True, HAS_SS=True, HAS_0=False, STORE_T=False, S16=True),
        "seg_dstate": dict(BK=BK, BV=BV, LOWP=True, G=1),
        "seg_dq": dict(BK=BK, DVP=D, CAUSAL=True, HAS_SS=True, HAS_0=False, LOWP=True),
        "seg_dkdv": dict(BK=BK, BV=BV, FP=D, DVP=D, CAUSAL=True, HAS_SS=True, HAS_0=False, STORE_0=False, LOWP=True,
                         G=1),
    }[kind]
    const = {k: v for k, v in {**base, **extra}.items() if k in fn.arg_names}
    return fn, types, const


def _flash_fwd(cfg, sparse: int, tma: bool = False):
    """Types and constexprs of the exact forward kernel at (BLOCK_M, BLOCK_N, warps, stages); ``tma``: K / V
    streamed through TMA descriptors (Kd, Vd), else pointer loads."""
    fn = FL._fwd_kernel
    types = {}
    for n in fn.arg_names:
        if n in ("Kd", "Vd"):
            types[n] = f"tensordesc<bf16[1, 1, {cfg[1]}, {D}]>" if tma else "*bf16"
        elif n in ("Q", "K", "V", "Out"):
            types[n] = "*bf16"
        elif n == "Lse":
            types[n] = "*fp32"
        elif n in ("KV_IDX", "KV_CNT", "KV_NFULL"):
            types[n] = "*i32"
        elif n == "LAYOUT":
            types[n] = "*i8"
        elif n == "qk_scale":
            types[n] = "fp32"
        else:
            types[n] = "i32"
    const = {n: 1 for n in fn.arg_names if re.fullmatch(r"stride_[qkvo]d", n)}  # unit strides specialise to 1
    const.update(HEAD_D=D, BLOCK_D=D, HAS_LEFT=False, HAS_RIGHT=True, SPARSE=sparse, DOT_PREC="tf32", TMA=tma,
                 BLOCK_M=cfg[0], BLOCK_N=cfg[1])
    return fn, types, const


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {', '.join(KERNELS)}")
    p.add_argument("--tile", default="", help="linear: BK,BV,warps,stages[,chunk]; flash_fwd: BLOCK_M,BLOCK_N,"
                                               "warps,stages (default: the kernel's default)")
    p.add_argument("--sparse", action="store_true", help="flash_fwd: the block-sparse variant (table loops)")
    p.add_argument("--aligned", action="store_true", help="flash_fwd --sparse: tiles inside one layout block (no "
                                                          "per-element layout gather, kernels.flash._OPTS)")
    p.add_argument("--fm", type=int, default=1, choices=(0, 1, 2),
                   help="linear: feature map (0 none, 1 elu1, 2 relu; default 1): its chain rule in dq / dk")
    p.add_argument("--phi-in-loop", action="store_true",
                   help="linear: the map applied in every chunk loop (_OPTS['phi_in_loop']) instead of a pre-pass")
    p.add_argument("--tma", action="store_true", help="flash_fwd: K / V streamed through TMA descriptors")
    p.add_argument("--sass", action="store_true", help="also the instruction mix of the largest loop (per warp and "
                                                        "iteration: HGMMA, barriers, shuffles, shared / spill traffic)")
    args = p.parse_args(argv)
    names = [k for k in args.kernels.split(",") if k]
    bad = [k for k in names if k not in KERNELS]
    if bad:
        raise SystemExit(f"--kernels: unknown {bad}; allowed values: {', '.join(KERNELS)}")
    tile = tuple(int(x) for x in args.tile.split(",")) if args.tile else None
    if tile is not None and len(tile) < 4:
        raise SystemExit(f"--tile={args.tile!r}: expected at least 4 comma-separated integers")
    print(f"triton {triton.__version__}, target sm_90a, D = F = Dv = {D}, bf16")
    for name in names:
        if name == "flash_fwd":
            cfg = tile or ((64, 64, 4, 3) if args.sparse else (128, 64, 8, 3))
            fn, types, const = _flash_fwd(cfg, (2 if args.aligned else 1) if args.sparse else 0, args.tma)
        else:
            cfg = tile or LN._tiles(name, torch.bfloat16, name != "seg_state", D, D)[0]
            fn, types, const = _linear(name, cfg, args.fm, args.phi_in_loop)
        r = compile_sm90(fn, types, const, cfg[2], cfg[3], sass=args.sass)
        print(f"{name:10s} tile={cfg}: " + "  ".join(f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
