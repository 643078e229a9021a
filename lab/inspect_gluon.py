"""Compile the Gluon forward and backward kernels (``kernels/flash/_gluon_kernels.py``) for Hopper (sm_90a) without a GPU and print
registers, spills (stack bytes), shared memory and the wgmma / TMA / barrier counts of the PTX.

Gluon's API is triton-version specific: run it with the GPU machine's triton (3.6), e.g.::

    pip install --no-deps --target /tmp/t36 triton-3.6.0-*.whl
    PYTHONPATH=/tmp/t36:$PWD python -m lab.inspect_gluon [--impls gluon_ws3a,gluon_ws3b,gluon_bwd,gluon_bwd_dkdv,
        gluon_bwd_dkdv2,gluon_bwd_dkdv2pp,gluon_bwd_dq] [--D 64,128] [--dtypes bf16,fp16] [--stages N] [--lse tma,load]
        [--bwd-block-m M] [--bwd-block-n N] [--masks full,causal,window,window_full,right,docs,docs_full,window_docs]
        [--ptx DIR]

Every (impl, mask, D, dtype) the launcher can pick is compiled at the launcher's tiles
(:func:`kernels.flash.gluon.gluon_tiles`, :func:`~kernels.flash.gluon.gluon_bwd_tiles` for the backward kernel of
``FlashConfig(bwd_impl="gluon")``: ``gluon_bwd`` with the atomic dQ (``WRITE_DQ=True``, ``gluon_bwd_dq="atomic"``),
``gluon_bwd_dkdv`` without (``WRITE_DQ=False``, ``gluon_bwd_dq="triton"``: dK / dV only), ``gluon_bwd_dkdv2`` the
two-consumer dK / dV kernel (``gluon_bwd_consumers=2``; ``gluon_bwd_dkdv2pp`` with ping-pong), each once per ``--lse``
way of reading lse2 / delta: ``tma`` (through the ring into shared memory, ``LSE_TMA=True``) and ``load``
(``gl.load`` into registers, the first version)); ``gluon_bwd_dq`` the Gluon dQ kernel (``gluon_bwd_dq="gluon"``,
:func:`~kernels.flash.gluon.gluon_bwd_dq_tiles`; ``--lse`` does not apply: it loads lse2 / delta per row); an impl that fails to compile prints its error and the rest go on.

``--masks`` (default ``full,causal``): the mask variants (:data:`MASKS`: the ``HAS_LEFT`` / ``HAS_RIGHT`` / ``DOCS``
constexprs) of the band-mask kernels (the forward, ``gluon_bwd_dq``, ``gluon_bwd_dkdv2`` / ``gluon_bwd_dkdv2pp``); the
one-consumer dK / dV kernels (``CAUSAL`` constexpr) take ``full`` and ``causal`` only (others are skipped).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import traceback
import warnings

import triton
from triton.backends.compiler import GPUTarget

from eval.bench_common import int_list
from lab.inspect_kernels import resource_usage, signature

BAND_INTS = ("win_left", "win_right")


def mask_flags(mask) -> dict:
    """The band constexprs of ``mask`` (a :data:`MASKS` name, defined below; a bool means ``"causal"`` /
    ``"full"``). Raises ``ValueError`` for an unknown name."""
    if isinstance(mask, bool):
        mask = "causal" if mask else "full"
    if mask not in MASKS:
        raise ValueError(f"mask={mask!r}; allowed values: {', '.join(MASKS)}")
    left, right, docs = MASKS[mask]
    return dict(HAS_LEFT=left, HAS_RIGHT=right, DOCS=docs)


def compile_case(impl: str, mask, D: int, dtype: str = "bf16", ptx: bool = False,
                 stages_override: int = 0, dynamic: bool = False) -> dict:
    """Compile the Gluon forward ``impl`` with ``mask`` (a :data:`MASKS` name, or a bool: causal) for sm_90a
    (``dynamic``: the persistent forward's ``DYNAMIC`` tile scheduler)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from kernels.flash import _gluon_kernels as GK
    from kernels.flash.gluon import gluon_kernel, gluon_tiles, nvmma_layout

    block_m, block_n, stages, warps = gluon_tiles(impl, D)
    if stages_override:
        stages = stages_override
    fn, extra = gluon_kernel(impl, GK)
    import triton.experimental.gluon.language as gl

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    types = {}
    for name, rows in (("q_desc", block_m), ("k_desc", block_n), ("v_desc", block_n)):
        lay = nvmma_layout([1, 1, rows, D], gdt)
        types[name] = f"tensordesc<{dtype}[1, 1, {rows}, {D}],{lay!r}>"
    types.update(Out=f"*{dtype}", Lse="*fp32", Doc="*i32", stride_ob="i32", stride_oh="i32", stride_on="i32",
                 Hq="i32", Nq="i32", Nk="i32", offset="i32", group="i32", qk_scale="fp32", KvIdx="*i32",
                 KvCnt="*i32", KvNfull="*i32", stride_tbl="i32", n_m="i32", n_work="i32", sec="i32",
                 Counter="*i32", Sched="*i32",
                 **{n: "i32" for n in BAND_INTS})
    const = dict(**mask_flags(mask), BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, num_warps=warps,
                 **extra)
    if "SPARSE" in fn.arg_names:  # (the persistent forward takes no block-sparse table)
        const["SPARSE"] = mask in SPARSE_MASKS
    if "PREFETCH" in fn.arg_names:
        const.update(PREFETCH=2, DYNAMIC=dynamic)
    sig, attrs = signature(fn, types, const,
                           lambda name, t: t.startswith("*") or name in ("stride_ob", "stride_oh", "stride_on"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    return _report(ck, f"{block_m}x{block_n}x{stages}st/{warps}w", ptx)


def _report(ck, tile: str, ptx: bool) -> dict:
    """Shared memory, wgmma / TMA / barrier counts of the PTX, registers and stack of the cubin, ptxas warnings."""
    text = ck.asm["ptx"]
    out = {"tile": tile, "shared_kib": round(ck.metadata.shared / 1024, 1),
           "wgmma": len(re.findall(r"wgmma\.mma_async", text)),
           "tma": len(re.findall(r"cp\.(?:reduce\.)?async\.bulk\.tensor", text)),  # loads, stores, reduce-adds
           "bar_sync": len(re.findall(r"\bbar\.sync|barrier\.sync", text)),
           "mbar_arrive": len(re.findall(r"mbarrier\.arrive", text)), "setmaxnreg": len(re.findall("setmaxnreg", text))}
    out.update(resource_usage(ck.asm["cubin"])[0])
    out["setmaxnreg_to"] = sorted(set(int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", text)))
    # ptxas's own warnings (e.g. "wgmma.mma_async instructions are serialized": the overlap would be lost)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(text)
        r = subprocess.run([ptxas, "--gpu-name", "sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                           capture_output=True, text=True)
        nvdisasm = os.path.join(os.path.dirname(ptxas), "nvdisasm")
        if r.returncode == 0 and os.path.exists(nvdisasm):
            sass = subprocess.run([nvdisasm, "-c", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
            out["partition_regs"] = partition_registers(sass.stdout)
    # ptxas's warnings, and its "info" notes of lost performance (C7512: "wgmma.mma_async instructions are
    # serialized due to insufficient register resources": the overlap is lost; ptxas prints it as info, not warning)
    warn = [ln.strip() for ln in (r.stdout + r.stderr).splitlines()
            if "warning" in ln.lower() or "performance loss" in ln.lower()]
    out["ptxas_warnings"] = len(warn)
    if warn:
        out["first_warning"] = warn[0][:160]
    if ptx:
        out["ptx"] = text
    return out


def partition_registers(sass: str) -> str:
    """The SASS cut at each ``USETMAXREG`` (setmaxnreg): ``"N:R"`` per section of more than 20 instructions, ``N`` the
    register count the section runs under (the setmaxnreg it starts with) and ``R`` the highest register index it
    names + 1 (so ``R <= N`` means it fits; a rough per-partition figure: the partitions' code lies in those sections,
    in order: the default partition, then the workers)."""
    parts, cur, limit = [], [], None
    for ln in sass.splitlines():
        m = re.search(r"USETMAXREG\.\w+\.CTAPOOL (?:\w+, )?(0x[0-9a-fA-F]+|\d+)", ln)
        if m:
            parts.append((limit, cur))
            cur, limit = [], int(m.group(1), 0)
        cur.append(ln)
    parts.append((limit, cur))
    out = []
    for limit, lines in parts:
        regs = [int(x) for ln in lines for x in re.findall(r"\bR(\d+)\b", ln)]
        if limit is not None and len(lines) > 20 and regs:
            out.append(f"{limit}:{max(regs) + 1}")
    return "/".join(out)


MASKS = {"full": (False, False, False), "causal": (False, True, False), "window": (True, True, False),
         "window_full": (True, False, False), "right": (False, True, False), "docs": (False, True, True),
         "docs_full": (False, False, True), "window_docs": (True, True, True), "sparse": (False, True, False),
         "sparse_full": (False, False, False)}
"""``--masks`` name -> the band constexprs ``(HAS_LEFT, HAS_RIGHT, DOCS)`` of the kernels taking band masks:
``window`` a sliding window with a causal right edge, ``window_full`` a left edge only, ``right`` a right edge only
(compiles as ``causal``: the edge is a runtime value), ``docs`` causal packed documents, ``docs_full`` documents
alone, ``window_docs`` both; ``sparse`` / ``sparse_full`` a block-sparse table (``SPARSE``), causal / not (the
forward, the two-consumer dK / dV and the dQ kernels). Kernels with a ``CAUSAL`` constexpr take ``full`` / ``causal``
only."""
SPARSE_MASKS = ("sparse", "sparse_full")


def parse_masks(text: str) -> list:
    """The ``--masks`` list (comma separated names of :data:`MASKS`); ``ValueError`` naming the allowed values."""
    masks = [m for m in text.split(",") if m]
    bad = [m for m in masks if m not in MASKS]
    if bad or not masks:
        raise ValueError(f"--masks {text!r}: allowed values: {', '.join(MASKS)} (comma separated)")
    return masks


def compile_bwd_case(mask, D: int, dtype: str = "bf16", ptx: bool = False, stages_override: int = 0,
                     write_dq: bool = True, lse_tma: bool = True, consumers: int = 1, pingpong: bool = False,
                     block_m_override: int = 0, block_n_override: int = 0, dq_tma: bool = False,
                     overlap: bool = False) -> dict:
    """Compile the Gluon backward (``bwd_impl="gluon"``) at the launcher's tiles
    (:func:`kernels.flash.gluon.gluon_bwd_tiles`) for sm_90a: ``consumers=1``: ``_gl_bwd_kernel`` with
    ``WRITE_DQ=write_dq`` (the atomic dQ, by TMA reduce-add with ``dq_tma``: triton 3.7+; ``mask`` ``"full"`` /
    ``"causal"`` only); ``consumers=2``:
    ``_gl_bwd_dkdv2_kernel`` (dK / dV only, ``write_dq`` must be False) with ``PINGPONG=pingpong`` and the band
    constexprs of ``mask`` (a name of :data:`MASKS`; ``False`` / ``True`` mean ``"full"`` / ``"causal"``);
    ``LSE_TMA=lse_tma`` (lse2 / delta through the ring) either way; ``overlap``: ``OVERLAP`` (two consumers, no
    ``dq_tma``: :data:`kernels.flash.gluon.GLUON_BWD_OVERLAP`). ``block_m_override`` / ``block_n_override`` (0:
    the launcher's): other tiles, to see what they would cost (the program's key rows: with two consumers each gets
    half). The same report as :func:`compile_case`."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from kernels.flash import _gluon_kernels as GK
    from kernels.flash.gluon import dq_tma_layout, gluon_bwd_tiles, lse_layout, nvmma_layout

    if consumers != 1 and write_dq and not dq_tma:
        raise ValueError("consumers=2 computes dK / dV only (or dQ with dq_tma): write_dq must be False")
    if dq_tma and not write_dq:
        raise ValueError("dq_tma is the TMA reduce-add of the fused dQ: it needs write_dq")
    if dq_tma and GK._tma_reduce_add is None:
        raise ValueError(f"dq_tma needs Gluon's TMA reduce-add (tma.async_atomic_add, triton 3.7+); this triton is "
                         f"{triton.__version__}")
    mask = {False: "full", True: "causal"}.get(mask, mask) if isinstance(mask, bool) else mask
    if mask not in MASKS or (consumers == 1 and mask not in ("full", "causal")):
        allowed = ", ".join(MASKS) if consumers != 1 else "full, causal"
        raise ValueError(f"mask={mask!r} with consumers={consumers}: allowed values: {allowed}")
    has_left, has_right, docs = MASKS[mask]
    block_m, block_n, stages, warps = gluon_bwd_tiles(D, consumers)
    if stages_override:
        stages = stages_override
    block_m, block_n = block_m_override or block_m, block_n_override or block_n
    fn = GK._gl_bwd_kernel if consumers == 1 else GK._gl_bwd_dkdv2_kernel
    import triton.experimental.gluon.language as gl

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    types = {}
    for name, rows in (("q_desc", block_m), ("do_desc", block_m), ("k_desc", block_n), ("v_desc", block_n)):
        lay = nvmma_layout([1, 1, rows, D], gdt)
        types[name] = f"tensordesc<{dtype}[1, 1, {rows}, {D}],{lay!r}>"
    for name in ("lse_desc", "delta_desc"):
        types[name] = f"tensordesc<fp32[{block_m}],{lse_layout()!r}>"
    ints = ("stride_kb", "stride_kh", "stride_kn", "stride_vb", "stride_vh", "stride_vn", "Hq", "Hkv", "Nq", "Nk",
            "offset", "group", "lse_stride")
    dqa = f"tensordesc<fp32[1, 1, {block_m}, {D}],{dq_tma_layout()!r}>" if dq_tma else "*fp32"
    types.update(DQA=dqa, Lse2="*fp32", Delta="*fp32", DK=f"*{dtype}", DV=f"*{dtype}", qk_scale="fp32",
                 sm_scale="fp32", Doc="*i32", win_left="i32", win_right="i32", QIdx="*i32", QCnt="*i32",
                 QNfull="*i32", stride_tbl="i32", **{n: "i32" for n in ints})
    const = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, LSE_TMA=lse_tma, num_warps=warps)
    if consumers == 1:
        const.update(CAUSAL=mask == "causal", WRITE_DQ=write_dq, DQ_TMA=dq_tma)
    else:
        const.update(HAS_LEFT=has_left, HAS_RIGHT=has_right, DOCS=docs, PINGPONG=pingpong,
                     SPARSE=mask in SPARSE_MASKS, DQ_TMA=dq_tma, OVERLAP=overlap)
    sig, attrs = signature(fn, types, const, lambda name, ty: ty.startswith("*") or name.startswith("stride_"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    warps_tag = f"{warps}w" if consumers == 1 else f"2x{warps}w"
    return _report(ck, f"{block_m}x{block_n}x{stages}st/{warps_tag}", ptx)


def compile_dq_case(mask, D: int, dtype: str = "bf16", ptx: bool = False, stages_override: int = 0,
                    block_n_override: int = 0) -> dict:
    """Compile the Gluon dQ kernel (``gluon_bwd_dq="gluon"``, ``_gl_bwd_dq_kernel``) with ``mask`` (a :data:`MASKS`
    name, or a bool: causal) at the launcher's tiles (:func:`kernels.flash.gluon.gluon_bwd_dq_tiles`;
    ``stages_override`` / ``block_n_override``, 0: the launcher's) for sm_90a. The same report as
    :func:`compile_case`."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from kernels.flash import _gluon_kernels as GK
    from kernels.flash.gluon import gluon_bwd_dq_tiles, nvmma_layout

    block_m, block_n, stages, warps = gluon_bwd_dq_tiles(D)
    stages, block_n = stages_override or stages, block_n_override or block_n
    fn = GK._gl_bwd_dq_kernel
    import triton.experimental.gluon.language as gl

    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    types = {}
    for name, rows in (("q_desc", block_m), ("do_desc", block_m), ("k_desc", block_n), ("v_desc", block_n)):
        lay = nvmma_layout([1, 1, rows, D], gdt)
        types[name] = f"tensordesc<{dtype}[1, 1, {rows}, {D}],{lay!r}>"
    types.update(Lse2="*fp32", Delta="*fp32", DQ=f"*{dtype}", Doc="*i32", qk_scale="fp32", sm_scale="fp32",
                 KvIdx="*i32", KvCnt="*i32", KvNfull="*i32", stride_tbl="i32",
                 **{n: "i32" for n in ("stride_qb", "stride_qh", "stride_qn", "Hq", "Nq", "Nk", "offset", "group")
                    + BAND_INTS})
    const = dict(**mask_flags(mask), BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, num_warps=warps,
                 SPARSE=mask in SPARSE_MASKS)
    sig, attrs = signature(fn, types, const, lambda name, ty: ty.startswith("*") or name.startswith("stride_"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    return _report(ck, f"{block_m}x{block_n}x{stages}st/2x{warps}w", ptx)


# inspect name -> compile_bwd_case's (write_dq, consumers, pingpong, dq_tma, overlap)
BWD_IMPLS = {"gluon_bwd": (True, 1, False, False, False), "gluon_bwd_dkdv": (False, 1, False, False, False),
             "gluon_bwd_dkdv2": (False, 2, False, False, False), "gluon_bwd_dkdv2pp": (False, 2, True, False, False),
             "gluon_bwd_dkdv2ov": (False, 2, False, False, True),
             "gluon_bwd_tmadq": (True, 1, False, True, False), "gluon_bwd_dkdv2tma": (True, 2, False, True, False)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", default="gluon_ws3a,gluon_ws3b,gluon_bwd,gluon_bwd_dkdv",
                    help="forward impls and / or the backward kernel (bwd_impl='gluon'): gluon_bwd (atomic dQ), "
                         "gluon_bwd_tmadq (the fused dQ by TMA reduce-add: gluon_bwd_dq='tma', triton 3.7+), gluon_bwd_dkdv2tma "
                         "(the same in the two-consumer kernel: gluon_bwd_consumers=2), "
                         "gluon_bwd_dkdv (dK / dV only: gluon_bwd_dq='triton'), gluon_bwd_dkdv2 (the same with "
                         "gluon_bwd_consumers=2), gluon_bwd_dkdv2pp (and GLUON_BWD_PINGPONG), gluon_bwd_dkdv2ov (and "
                         "GLUON_BWD_OVERLAP), gluon_bwd_dq (the Gluon "
                         "dQ kernel, gluon_bwd_dq='gluon'; --stages / --bwd-block-n apply)")
    ap.add_argument("--lse", default="tma,load",
                    help="backward only: how lse2 / delta are read: tma (ring, shared memory), load (gl.load)")
    ap.add_argument("--stages", type=int, default=0, help="override the ring depth (0: the launcher's)")
    ap.add_argument("--bwd-block-m", type=int, default=0, help="backward only: override BLOCK_M (0: the launcher's)")
    ap.add_argument("--bwd-block-n", type=int, default=0,
                    help="backward only: override BLOCK_N, the program's key rows (gluon_bwd_dq: its key tile; 0: the "
                         "launcher's)")
    ap.add_argument("--masks", default="full,causal",
                    help="comma separated: " + ", ".join(MASKS) + " (band masks: the forward impls, gluon_bwd_dq, "
                         "gluon_bwd_dkdv2 / gluon_bwd_dkdv2pp; the others take full / causal and skip the rest)")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--ptx", default="", help="write each case's PTX into this folder")
    args = ap.parse_args(argv)
    masks = parse_masks(args.masks)
    Ds = int_list(args.D, "--D", "head dims")
    print(f"triton {triton.__version__}, target sm_90a")
    for impl in args.impls.split(","):
        lses = args.lse.split(",") if impl in BWD_IMPLS else [""]
        for D in Ds:
            for dtype in args.dtypes.split(","):
                for lse in lses:
                    for mask in masks:
                        tag = f"{impl}{'/' + lse if lse else ''}"
                        name = f"{tag:19s} D={D:3d} {dtype} {mask:6s}"
                        band = impl not in BWD_IMPLS or BWD_IMPLS[impl][1] == 2  # (forward, dQ, two-consumer dK / dV)
                        if mask not in ("full", "causal") and not band:
                            continue  # (a kernel with the CAUSAL constexpr: no band masks)
                        if mask in SPARSE_MASKS and impl in BWD_IMPLS and BWD_IMPLS[impl][1] != 2:
                            continue  # (block-sparse tables: the forward, the two-consumer dK / dV and the dQ kernels)
                        try:
                            if impl == "gluon_bwd_dq":
                                r = compile_dq_case(mask, D, dtype, ptx=bool(args.ptx), stages_override=args.stages,
                                                    block_n_override=args.bwd_block_n)
                            elif impl in BWD_IMPLS:
                                if lse not in ("tma", "load"):
                                    raise ValueError(f"--lse {lse!r}: allowed values: tma, load")
                                wdq, cons, pp, dqt, ov = BWD_IMPLS[impl]
                                r = compile_bwd_case(mask, D, dtype, ptx=bool(args.ptx), stages_override=args.stages,
                                                     write_dq=wdq, lse_tma=lse == "tma", consumers=cons, pingpong=pp,
                                                     dq_tma=dqt, overlap=ov,
                                                     block_m_override=args.bwd_block_m,
                                                     block_n_override=args.bwd_block_n)
                            else:
                                r = compile_case(impl, mask, D, dtype, ptx=bool(args.ptx),
                                                 stages_override=args.stages)
                        except Exception as e:  # one failing case must not hide the others
                            print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                            traceback.print_exc(limit=3)
                            continue
                        text = r.pop("ptx", None)
                        if text is not None:
                            os.makedirs(args.ptx, exist_ok=True)
                            fname = f"{impl}{'_' + lse if lse else ''}_D{D}_{dtype}_{mask}.ptx"
                            with open(os.path.join(args.ptx, fname), "w") as f:
                                f.write(text)
                        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in r.items()), flush=True)

if __name__ == "__main__":
    main()
