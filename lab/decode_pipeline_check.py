"""Lab (no GPU needed): compile the decode kernel for sm_90 on this machine and count what the software pipeliner
made of the K/V loads, per cache layout / ``page_gather`` (bf16, D 128, BN 64, BM 16, page 16, num_stages 3,
16-divisible strides and pointers as the JIT specialises them). ``shared`` is the static shared memory: a K/V tile
pair multi-buffered (pipelined) takes ~72 KB, one buffer ~39 KB.

    PYTHONPATH=$PWD python lab/decode_pipeline_check.py
"""

import inspect
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.decode import _decode_fwd

PTRS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SEQ": "*i32", "KFIRST": "*i32", "BT": "*i32", "LAY": "*i8",
        "TIDX": "*i32", "TCNT": "*i32", "O": "*bf16", "LSE": "*fp32", "OP": "*fp32", "LP": "*fp32"}
DIV16 = ("sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "sbt_b", "D", "DV")


def compile_stats(paged: bool, multi_page: bool, prefetch: bool, num_stages: int = 3) -> dict:
    const = dict(PAGED=paged, PAGE_SIZE=16 if paged else 1, PAGE_TILE=False, MULTI_PAGE=multi_page, CAUSAL=True,
                 HAS_LEFT=False, HAS_RIGHT=False, SPARSE=False, LEFTPAD=False, PREFETCH=prefetch, SPLIT=True,
                 STORE_LSE=False, BM=16, BN=64, BD=128, BDV=128, DOT_PREC="tf32")
    names = list(inspect.signature(_decode_fwd.fn).parameters)
    sig = {n: PTRS.get(n) or ("constexpr" if n in const else "fp32" if n == "qk_scale" else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in PTRS or n in DIV16}
    k = triton.compile(ASTSource(_decode_fwd, sig, constexprs=const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": num_stages})
    g, p = k.asm["ttgir"], k.asm["ptx"]
    return dict(async_copies=g.count("async_copy_global_to_local"), cp_async=len(re.findall(r"cp\.async\.c[ag]", p)),
                shared=k.metadata.shared)


if __name__ == "__main__":
    print("triton", triton.__version__)
    for name, args in (("contiguous", (False, False, False)), ("paged16 key", (True, False, False)),
                       ("paged16 page", (True, True, False)), ("paged16 prefetch", (True, True, True)),
                       ("paged16 prefetch per-key", (True, False, True))):
        print(f"{name:26s}", compile_stats(*args), flush=True)
