"""Opt-in Gluon forward for Hopper (``FlashConfig(fwd_impl="gluon" | "gluon_ws" | "gluon_ws2" | "gluon_ws3a" |
"gluon_ws3b" | "gluon_ws3")``): host side.

The kernels live in :mod:`kernels.flash._gluon_kernels` and are imported on first use only, so that importing
``kernels`` never needs ``triton.experimental.gluon`` (CI runs another triton whose Gluon API differs; the GPU
machine runs triton 3.6, the version they are written for). :func:`check_gluon_fwd` refuses what they do not
cover, with a ``ValueError`` naming ``fwd_impl`` and its allowed use: masks other than dense / causal (sliding
window, block-sparse, dilation, documents), head dims other than 64 / 128 (or ``Dv != D``), dtypes other than
fp16 / bf16, devices other than a CUDA GPU of compute capability 9.x (Hopper, sm_90a), and a triton whose Gluon
lacks the Hopper API used here. The outputs are those of :func:`kernels.flash.fwd.flash_attn_fwd` (``out`` stored
``(B, Nq, Hq, D)``, ``lse`` fp32 natural log ``(B, Hq, Nq)``), so the Triton backward consumes them unchanged.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .config import FWD_IMPLS
GLUON_HEAD_DIMS = (64, 128)
_LOG2E = 1.4426950408889634


# the gluon_ws3 family (one kernel, _gl_fwd_ws3_kernel): FA3's intra-warpgroup overlap and split K / V barriers in
# all three; ping-pong of the two consumers in "b" and the full one; conditional rescaling (log2 threshold 8, FA4)
# in the full one only
WS3_FLAGS = {"gluon_ws3a": dict(PINGPONG=False, RESCALE_THR=0.0), "gluon_ws3b": dict(PINGPONG=True, RESCALE_THR=0.0),
             "gluon_ws3": dict(PINGPONG=True, RESCALE_THR=8.0)}
TWO_CONSUMERS = ("gluon_ws2", ) + tuple(WS3_FLAGS)


def gluon_tiles(impl: str, D: int) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, STAGES, num_warps)`` of ``impl`` at head dim ``D``. Shared memory: Q tile + STAGES K
    and V tiles, bf16 at D = 128: 32 + 3 * 64 = 224 KiB, under the H200's 227 KiB; the gluon_ws3 kernels take 3
    stages there (224.5 KiB compiled), the older three keep the 2 they were measured with (3 also compile: gluon
    224.1, gluon_ws2 224.4 KiB). ``num_warps`` is the kernel's (default partition's): the two-consumer kernels
    (``gluon_ws2``, ``gluon_ws3*``) run a second 4-warp consumer as a worker partition."""
    warps = 4 if impl in TWO_CONSUMERS else 8
    if D == 128:
        return 128, 128, 3 if impl in WS3_FLAGS else 2, warps
    return 128, 128, 3, warps


def gluon_kernel(impl: str, GK):
    """``(kernel, extra constexpr kwargs)`` that run ``impl`` (``GK``: the kernels module)."""
    if impl in WS3_FLAGS:
        return GK._gl_fwd_ws3_kernel, dict(WS3_FLAGS[impl])
    if impl.startswith("gluon_ws"):
        return GK._gl_fwd_ws_kernel, {"N_CONSUMERS": 2 if impl == "gluon_ws2" else 1}
    return GK._gl_fwd_kernel, {}


@functools.lru_cache(maxsize=None)
def _gluon_modules():
    """``(kernels module, TensorDescriptor, gluon.language)`` or raises ``ValueError`` when this triton's Gluon
    lacks the Hopper API the kernels use."""
    try:
        import triton.experimental.gluon.language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from . import _gluon_kernels as GK
    except Exception as e:  # ImportError, or an API renamed between triton versions
        import triton

        raise ValueError(f"fwd_impl='gluon' / 'gluon_ws*' needs triton.experimental.gluon with the "
                         f"Hopper API of triton 3.6 (warpgroup_mma, tma, mbarrier, warp_specialize); this triton "
                         f"{triton.__version__} failed with {type(e).__name__}: {e}; use fwd_impl='triton'") from e
    return GK, TensorDescriptor, gl


def nvmma_layout(block_shape, gl_dtype):
    """The shared layout of a TMA tile ``block_shape`` (128-byte swizzle at 64 / 128 half-precision columns)."""
    import triton.experimental.gluon.language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device):
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def check_gluon_fwd(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int, win_right: int,
                    layout, dilation: int, documents) -> bool:
    """Raise ``ValueError`` when ``fwd_impl=impl`` cannot run this call; returns whether it is causal."""
    allowed = "dense or causal masks (no window_size left edge, block-sparse layout, dilation or doc_ids), " \
              f"head dim D in {GLUON_HEAD_DIMS} with Dv == D, float16 / bfloat16, a Hopper (sm_90) CUDA device"
    if impl not in FWD_IMPLS[1:]:
        raise ValueError(f"fwd_impl={impl!r} is not supported; allowed values: {', '.join(map(repr, FWD_IMPLS))}")
    if layout is not None or dilation != 1 or documents is not None or win_left >= 0 or win_right > 0:
        what = ("a block-sparse layout" if layout is not None else f"dilation={dilation}" if dilation != 1 else
                "doc_ids" if documents is not None else f"window (left={win_left}, right={win_right})")
        raise ValueError(f"fwd_impl={impl!r} supports only {allowed}; got {what}; use fwd_impl='triton'")
    D, Dv = q.shape[3], v.shape[3]
    if D not in GLUON_HEAD_DIMS or Dv != D:
        raise ValueError(f"fwd_impl={impl!r} supports only {allowed}; got D={D}, Dv={Dv}; use fwd_impl='triton'")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fwd_impl={impl!r} supports only {allowed}; got dtype {q.dtype}; use fwd_impl='triton'")
    cap = _capability(q.device)
    if cap is None or cap[0] != 9:
        dev = q.device if cap is None else f"{q.device} (sm_{cap[0]}{cap[1]})"
        raise ValueError(f"fwd_impl={impl!r} supports only {allowed}; got device {dev}; use fwd_impl='triton'")
    _gluon_modules()
    return win_right == 0


def _tma_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` if a TMA descriptor can read it as is (unit last stride, 16-byte aligned base and strides; strides
    of size-1 dims do not matter), else a contiguous copy."""
    esz = t.element_size()
    ok = t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all(
        (s * esz) % 16 == 0 for s, n in zip(t.stride()[:3], t.shape[:3]) if n > 1)
    return t if ok else t.contiguous()


def _descriptor(t: torch.Tensor, rows: int, TD, gl_dtype):
    strides = list(t.stride())
    for i in range(3):  # a size-1 dim's stride is never used: give it a legal (16-byte aligned) value
        if t.shape[i] == 1:
            strides[i] = t.shape[3] * t.shape[2] if i < 2 else t.shape[3]
    block = [1, 1, rows, t.shape[3]]
    return TD(t, list(t.shape), strides, block, nvmma_layout(block, gl_dtype))


def gluon_flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool,
                    impl: str = "gluon", out: Optional[torch.Tensor] = None,
                    lse: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward of dense (``causal=False``) or causal (bottom-right aligned) attention with the Gluon kernel
    ``impl``. ``q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)`` fp16 / bf16 on a Hopper GPU, ``D`` in {64, 128} (call
    :func:`check_gluon_fwd` first). Returns ``out (B, Hq, Nq, D)`` in q.dtype (``out`` if given, any strides, else
    stored as ``(B, Nq, Hq, D)``) and ``lse (B, Hq, Nq)`` fp32, natural log (``-inf`` on rows that see no key)."""
    from .launch import _bnhd_empty

    GK, TD, gl = _gluon_modules()
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_m, block_n, stages, warps = gluon_tiles(impl, D)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q, k, v = _tma_view(q), _tma_view(k), _tma_view(v)
    if out is None:
        out = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device)
    if lse is None:
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    kernel, extra = gluon_kernel(impl, GK)
    grid = (triton_cdiv(Nq, block_m), B * Hq)
    kernel[grid](_descriptor(q, block_m, TD, gdt), _descriptor(k, block_n, TD, gdt), _descriptor(v, block_n, TD, gdt),
                 out, lse, out.stride(0), out.stride(1), out.stride(2), Hq, Nq, Nk, Nk - Nq, Hq // Hkv,
                 softmax_scale * _LOG2E, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages,
                 num_warps=warps, **extra)
    return out, lse


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
