"""Lab (no GPU needed): compile the decode kernel for sm_90a on this machine and report what the software pipeliner
made of the K/V loads, per cache layout / ``page_gather`` / merge / tile: bf16, D 128, BM 16, num_warps 4, 16-divisible
strides and pointers as the JIT specialises them. Columns: ``async_copies`` (ttgir async copies into shared
memory: the loads the pipeliner prefetched), ``cp_async`` (PTX cp.async instructions), ``shared`` (static shared
memory, bytes: a 64-key K/V tile pair buffered twice, i.e. pipelined 3 stages deep, takes ~72 KB; one buffer
~39 KB), ``registers`` and ``stack`` (from the cubin: a stack above 0 means spilled registers).

    PYTHONPATH=$PWD python -m lab.decode_pipeline_check               # triton here (3.9)
    PYTHONPATH=$PWD /tmp/tidy_t36/bin/python -m lab.decode_pipeline_check   # triton 3.6, the H200's
"""

import inspect
import os
import re
import subprocess
import tempfile
import warnings

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.decode import _decode_fwd

PTRS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SEQ": "*i32", "KFIRST": "*i32", "BT": "*i32", "LAY": "*i8",
        "TIDX": "*i32", "TCNT": "*i32", "O": "*bf16", "LSE": "*fp32", "OP": "*fp32", "LP": "*fp32", "CNT": "*i32"}
DIV16 = ("sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "sbt_b", "D", "DV")


def _cubin_usage(cubin: bytes) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    out = {}
    for key, pat in (("registers", r"REG:(\d+)"), ("stack", r"STACK:(\d+)")):
        m = re.search(pat, res)
        out[key] = int(m.group(1)) if m else None
    return out


def compile_stats(paged: bool, multi_page: bool, prefetch: bool, num_stages: int = 3, fused: bool = True,
                  page_size: int = 16, block_n: int = 64, block_m: int = 16, merge_sc: int = 64,
                  merge_rows: bool = False, merge_rp: int = 0, maxnreg=None) -> dict:
    merge_rp = merge_rp or block_m  # the rows path's row slots per split (block_m: no padding shared)
    const = dict(PAGED=paged, PAGE_SIZE=page_size if paged else 1, PAGE_TILE=paged and page_size % block_n == 0,
                 MULTI_PAGE=multi_page, CAUSAL=True, HAS_LEFT=False, HAS_RIGHT=False, SPARSE=False, LEFTPAD=False,
                 PREFETCH=prefetch, SPLIT=True, FUSED_MERGE=fused, MERGE_ROWS=merge_rows, MERGE_RP=merge_rp,
                 MERGE_NU=block_m // merge_rp, MERGE_SC=merge_sc, STORE_LSE=False,
                 BM=block_m, BN=block_n, BD=128, BDV=128, DOT_PREC="tf32")
    names = list(inspect.signature(_decode_fwd.fn).parameters)
    sig = {n: PTRS.get(n) or ("constexpr" if n in const else "fp32" if n == "qk_scale" else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in PTRS or n in DIV16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = triton.compile(ASTSource(_decode_fwd, sig, constexprs=const, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": num_stages,
                                    **({"maxnreg": maxnreg} if maxnreg else {})})
    g, p = k.asm["ttgir"], k.asm["ptx"]
    return dict(async_copies=g.count("async_copy_global_to_local"), cp_async=len(re.findall(r"cp\.async\.c[ag]", p)),
                shared=k.metadata.shared, **_cubin_usage(k.asm["cubin"]))


CASES = (  # name, compile_stats kwargs
    ("contiguous fused", dict(paged=False, multi_page=False, prefetch=False)),
    ("contiguous fused, 16 splits", dict(paged=False, multi_page=False, prefetch=False, merge_sc=16)),
    ("contiguous kernel-merge", dict(paged=False, multi_page=False, prefetch=False, fused=False)),
    ("contiguous fused bn128 st2", dict(paged=False, multi_page=False, prefetch=False, block_n=128, num_stages=2)),
    ("contiguous fused bn128 st3", dict(paged=False, multi_page=False, prefetch=False, block_n=128)),
    ("contiguous fused st4", dict(paged=False, multi_page=False, prefetch=False, num_stages=4)),
    ("contiguous fused BM64 (GQA 8 x Nq 8)", dict(paged=False, multi_page=False, prefetch=False, block_m=64)),
    ("contiguous kernel-merge BM64", dict(paged=False, multi_page=False, prefetch=False, block_m=64, fused=False)),
    # merge="fused" for programs of several rows (merge_rows): what decode_plan makes for GQA 32:8 (4 rows: 4 slots
    # per split, 4 splits per block, 2 blocks per round), Nq 4 x GQA 4 (16 rows), GQA 8 x Nq 8 (64 rows), capped at
    # 168 registers (max_registers="auto") or not
    ("contiguous fused rows G4 (rp 4, sc 2)", dict(paged=False, multi_page=False, prefetch=False, merge_rows=True,
                                                   merge_rp=4, merge_sc=2)),
    ("contiguous fused rows G4, maxnreg 168", dict(paged=False, multi_page=False, prefetch=False, merge_rows=True,
                                                   merge_rp=4, merge_sc=2, maxnreg=168)),
    ("contiguous fused rows 16, maxnreg 168", dict(paged=False, multi_page=False, prefetch=False, merge_rows=True,
                                                   merge_sc=2, maxnreg=168)),
    ("contiguous fused rows BM64 (sc 1)", dict(paged=False, multi_page=False, prefetch=False, merge_rows=True,
                                               merge_sc=1, block_m=64)),
    ("paged16 prefetch fused rows G4", dict(paged=True, multi_page=False, prefetch=True, merge_rows=True,
                                            merge_rp=4, merge_sc=2)),
    ("paged16 prefetch fused rows G4, maxnreg 168", dict(paged=True, multi_page=False, prefetch=True,
                                                         merge_rows=True, merge_rp=4, merge_sc=2, maxnreg=168)),
    ("paged32 prefetch fused rows 16, maxnreg 168", dict(paged=True, multi_page=False, prefetch=True, page_size=32,
                                                         merge_rows=True, merge_sc=2, maxnreg=168)),
    ("paged16 key", dict(paged=True, multi_page=False, prefetch=False)),
    ("paged16 page", dict(paged=True, multi_page=True, prefetch=False)),
    ("paged16 prefetch (per key)", dict(paged=True, multi_page=False, prefetch=True)),
    ("paged32 prefetch (per key)", dict(paged=True, multi_page=False, prefetch=True, page_size=32)),
    ("paged16 prefetch bn128 st2", dict(paged=True, multi_page=False, prefetch=True, block_n=128, num_stages=2)),
)

if __name__ == "__main__":
    print("triton", triton.__version__)
    for name, kw in CASES:
        print(f"{name:38s}", compile_stats(**kw), flush=True)
