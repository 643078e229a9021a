"""Gluon forward for Hopper (``FlashConfig(fwd_impl="gluon_ws3a" | "gluon_ws3b")``, and what ``"auto"`` picks):
host side.

The kernel lives in :mod:`kernels.flash._gluon_kernels` and is imported on first use only, so that importing
``kernels`` never needs ``triton.experimental.gluon`` (CI runs another triton whose Gluon API differs; the GPU
machine runs triton 3.6, the version it is written for). The kernel takes band masks: dense, causal, sliding
windows (left and / or right edge) and packed documents (the document table of :mod:`kernels.flash.documents`), alone
or together. :func:`check_gluon_fwd` refuses what it does not cover, with a ``ValueError`` naming ``fwd_impl`` and its
allowed use: a block-sparse layout or dilation, head dims other than 64 / 128 (or ``Dv != D``), dtypes other than
fp16 / bf16, devices other than a CUDA GPU of compute capability 9.x (Hopper, sm_90a), and a triton whose Gluon
lacks the Hopper API used here. :func:`choose_fwd_impl` turns ``fwd_impl="auto"`` into the kernel a call runs (never
raises). The outputs are those of :func:`kernels.flash.fwd.flash_attn_fwd` (``out`` stored ``(B, Nq, Hq, D)``,
``lse`` fp32 natural log ``(B, Hq, Nq)``), so the Triton backward consumes them unchanged.

Removed (issue 30): ``"gluon"``, ``"gluon_ws"``, ``"gluon_ws2"`` and ``"gluon_ws3"`` (conditional rescaling), slower
than ``gluon_ws3a`` in every measured case (docs/results.md, docs/kernels.md).
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .common import INTERPRET
from .config import BWD_IMPLS, FWD_IMPLS, GLUON_BWD_CONSUMERS, GLUON_FWD_IMPLS, FlashConfig
from .._host import heads_per_section, launch
from .launch import visited_pairs
from .sparse import layout_tables, tiles_whole

GLUON_HEAD_DIMS = (64, 128)  # what the Gluon kernel runs when asked by name
# what fwd_impl="auto" gives the Gluon kernel: head dim -> the fewest visited pairs (beside config.tma_min_pairs)
# where it was measured ahead of the Triton forward on the H200 (results/h200/2026-12-04f/flash_fwd/, forward alone,
# 16k tokens per call): D 128 from 2^28 pairs (2k-16k: 1.04-1.20x; at 1k causal it is 0.81x and stays below
# 2^28; on an H100 with TMA in the Triton forward, 2026-12-06, causal 512 / 1k ran the Gluon forward 0.70x / 0.96x
# the Triton one, separate processes: results/h100/2026-12-06i/NOTES.md, c4's console rows); D 64 from 2^31 (full 4k: 1.15x, 16k: 1.09-1.13x; causal / GQA
# 4k, 1.07e9 pairs: 0.97-0.99x; 1k: 0.76x)
GLUON_AUTO_HEAD_DIMS = {128: 1 << 28, 64: 1 << 31}
AUTO_GLUON_IMPL = "gluon_ws3a"  # "auto"'s Gluon kernel for layouts and documents (ahead of gluon_ws3b in 5 of 6 cases; AUTO_PERSISTENT)
GLUON_AUTO_BANDS = True
"""Whether ``fwd_impl="auto"`` (:func:`choose_fwd_impl`) also takes the Gluon forward for sliding windows (a left edge,
a right edge > 0) and packed documents, at the head dims of :data:`GLUON_AUTO_BAND_HEAD_DIMS`, as for dense / causal
masks (never for a block-sparse layout or dilation); ``False`` keeps those masks on the Triton forward. A
module-level knob read at every call; not part of :class:`~kernels.flash.FlashConfig`."""
GLUON_AUTO_BAND_HEAD_DIMS = (128,)
"""Head dims where ``"auto"`` takes the Gluon forward for band masks. H200, 2026-12-05 (``results/h200/2026-12-05b/
a1/gluon_band_bench.csv``, ``python -m lab.gluon_band_bench --dq``, forward alone, bf16, 16k tokens per call, one
process): D 128 ``gluon_ws3a`` against the Triton forward: window 1024 at 4k 1.07x, at 16k 1.01x; documents of 1024
at 16k 1.02x, of 4096 1.15x. D 64: 0.85x / 0.87x (window 4k / 16k), 0.83x (documents 1024), 1.02x (4096): Triton."""
GLUON_AUTO_SPARSE = True
"""Whether ``fwd_impl="auto"`` takes the Gluon forward for a block-sparse layout whose blocks are whole Gluon tiles
(:func:`~kernels.flash.sparse.tiles_whole` at :func:`gluon_tiles`: ``block_size`` a multiple of 128, ``Nk - Nq`` a
multiple of 128; no documents, no dilation; causal while :data:`GLUON_AUTO_SPARSE_CAUSAL_ONLY`) at the head dims of
:data:`GLUON_AUTO_BAND_HEAD_DIMS`, at any size (no pair threshold). H100 80GB (no H200 was lent), 2026-12-06,
``results/h100/2026-12-06b/sparse/`` (``python -m eval.bench_flash --variants bigbird,strided --N 1024,4096,16384 --D 128 --impls ours,ours_gluon_ws3a,flex_fa4
--rounds 3``, causal, 128-token blocks, bf16, 16k tokens per call, one process, two calls): forward 1.19-1.32x the
Triton sparse forward at every N (1k included), forward+backward 1.00-1.07x. A module-level knob read at every call, as
:data:`GLUON_AUTO_BANDS`."""
GLUON_AUTO_SPARSE_CAUSAL_ONLY = False
"""Whether ``"auto"`` (:data:`GLUON_AUTO_SPARSE` forward, :data:`GLUON_AUTO_BWD_SPARSE` backward) takes the Gluon
kernels for a block-sparse layout only when the call is causal without a window (``win_left < 0``,
``win_right == 0``). ``False`` (the default since 2026-12-06): every mask on a whole-tile layout. H100 80GB (no H200
was lent), 2026-12-06, ``results/h100/2026-12-06d/``: ``pytest -m gpu -k block_sparse`` passed its non-causal,
windowed, GQA, ragged and empty-row cases (D 64 / 128); non-causal BigBird / strided with 128-token blocks, D 128,
bf16, 16k tokens per call (``noncausal/``, ``auto/``): the Gluon forward 1.35-1.53x the Triton sparse forward at
1k / 4k / 16k, the Gluon backward 1.09-1.19x the Triton one. Windowed layouts: tested, not timed."""


def _sparse_auto_mask_ok(win_left: int, win_right: int) -> bool:
    """The mask condition :data:`GLUON_AUTO_SPARSE_CAUSAL_ONLY` sets for ``"auto"`` on a block-sparse layout."""
    return not GLUON_AUTO_SPARSE_CAUSAL_ONLY or (win_left < 0 and win_right == 0)


_LOG2E = 1.4426950408889634

# one kernel (_gl_fwd_ws3_kernel): FA3's intra-warpgroup overlap and split K / V barriers in both; ping-pong of the
# two consumers in "b"
WS3_FLAGS = {"gluon_ws3a": dict(PINGPONG=False), "gluon_ws3b": dict(PINGPONG=True)}


PERSISTENT_IMPL = "gluon_ws3p"
"""The persistent Gluon forward (``_gl_fwd_ws3p_kernel``): ``gluon_ws3a``'s per-tile schedule, at most one program
per SM (:func:`persistent_grid`) walking a work list of (query tile, head) items, longest first within sections of
heads (:func:`persistent_section`), shared out by :data:`PERSISTENT_SCHEDULE`, its K / V rings running on across
items (band masks and documents; no block-sparse layout). ``"auto"`` takes it where :data:`AUTO_PERSISTENT` says.
On an H200 (34th session, ``results/h200/2026-12-07/ws3p``) the dynamic schedule with 16 MiB sections ran the
forward 1.02-1.13x ws3a's on causal and full MHA at 1k / 4k / 16k and GQA 4:1 causal at 4k / 16k (causal 16k: 613
against 581 TFLOP/s), bit for bit equal. On an H100 (35th, ``results/h100/2026-12-07f/13/ws3p_ab.log``, forward
alone, bf16, 16k tokens per call): D 128 causal 1.04 / 1.08 / 1.14x at 1k / 4k / 16k, full 1.01 / 1.00 / 1.00x,
window 1024 1.06 / 1.06 / 1.06x; D 64 causal 1.06 / 1.05 / 0.99x, full 1.06 / 1.05 / 1.01x, window 1.11 / 1.08 /
1.06x; bit for bit equal everywhere. The static schedule (the 33rd session's, on an H100,
``results/h100/2026-12-07e``) ran 0.69-0.89x ws3a on causal MHA."""
AUTO_PERSISTENT = True
"""Whether ``fwd_impl="auto"`` (:func:`choose_fwd_impl`), where it takes the Gluon forward, runs the persistent one
(:data:`PERSISTENT_IMPL`) for dense, causal and sliding-window masks (no block-sparse layout, which it cannot run; no
``documents``, not timed with it): ``AUTO_GLUON_IMPL`` (``gluon_ws3a``) otherwise. Since the 35th session (2026-12-07):
the timings in :data:`PERSISTENT_IMPL`'s note, forward alone 0.99-1.14x ws3a, bit for bit equal; at this setting on an
H100 (``results/h100/2026-12-07f/14``) the "auto" / persistent / kept-launch GPU tests passed (121), ``train.py
trainer=gpu`` learned, and fwd+bwd read 0.98-1.02x ws3a forced (causal / full / window 1024 at 4k / 16k, D 128; within
that bench's noise). A module-level knob read at every call; not part of :class:`~kernels.flash.FlashConfig`."""


def gluon_tiles(impl: str, D: int) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, STAGES, num_warps)`` of ``impl`` (``"gluon_ws3a"`` / ``"gluon_ws3b"``) at head dim
    ``D`` (64 or 128). Shared memory: Q tile + STAGES K and V tiles, bf16 at D = 128: 32 + 3 * 64 = 224 KiB (224.5
    compiled), under the H200's 227 KiB. ``num_warps`` is the default partition's: the kernel runs a second 4-warp
    consumer as a worker partition (and a 1-warp producer). Raises ``ValueError`` for another ``impl``."""
    if impl not in GLUON_FWD_IMPLS:
        raise ValueError(f"impl={impl!r} is not a Gluon forward; allowed values: "
                         f"{', '.join(map(repr, GLUON_FWD_IMPLS))}")
    return 128, 128, 3, 4


GLUON_BWD_HEAD_DIMS = (64, 128)  # what the Gluon backward (bwd_impl="gluon") runs


def gluon_bwd_tiles(D: int, consumers: int = 1) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, STAGES, num_warps)`` of the Gluon backward at head dim ``D`` (64 or 128): key tiles of
    ``BLOCK_N = 128`` rows, query tiles of ``BLOCK_M = 64`` streamed through a ``STAGES``-deep ring.
    ``consumers=1`` (``_gl_bwd_kernel``): the key tile held by one 8-warp consumer partition (two warpgroups of 64
    key rows); shared memory, bf16 at D = 128: K + V 64 KiB, STAGES x (Q + dO) 32 KiB, dS^T 16 KiB.
    ``consumers=2`` (``_gl_bwd_dkdv2_kernel``, dK / dV only): two 1-warpgroup consumer partitions of 64 key rows
    each (``num_warps = 4`` is the default partition's; the kernel adds a 4-warp worker and the 1-warp producer), no
    dS^T buffer. ``lab/inspect_gluon.py --impls gluon_bwd,gluon_bwd_dkdv,gluon_bwd_dkdv2`` prints the compiled
    figures. Raises ``ValueError`` for another ``D`` or ``consumers``."""
    if D not in GLUON_BWD_HEAD_DIMS:
        raise ValueError(f"D={D} is not supported by the Gluon backward; allowed values: {GLUON_BWD_HEAD_DIMS}")
    if consumers not in GLUON_BWD_CONSUMERS:
        raise ValueError(f"consumers={consumers!r} is not supported by the Gluon backward; allowed values: "
                         f"{GLUON_BWD_CONSUMERS}")
    return (64, 128, 2, 8) if consumers == 1 else (64, 128, 2, 4)


GLUON_BWD_DQ_TILES = {64: (128, 128, 2, 4), 128: (128, 64, 3, 4)}
"""Head dim -> ``(BLOCK_M, BLOCK_N, STAGES, num_warps)`` of the Gluon dQ kernel (``gluon_bwd_dq="gluon"``,
``_gl_bwd_dq_kernel``): query tiles of ``BLOCK_M = 128`` rows (two 1-warpgroup consumers of 64; ``num_warps`` is the
default partition's), key tiles of ``BLOCK_N`` rows through ``STAGES``-deep K and V rings. Registers per consumer
thread: dQ ``64 * D / 128`` fp32, S and dP ``64 * BLOCK_N / 128`` fp32 each, dS ``BLOCK_N / 4`` packed pairs, so D 128
takes key tiles of 64 (D 64: 128). Shared memory, bf16: Q + dO ``2 * 128 * D * 2`` B, plus ``STAGES`` K + V tiles
(D 128: 64 + 3 x 32 = 160 KiB; D 64: 32 + 2 x 32 = 96 KiB). Untimed choice (``lab/gluon_bwd_sweep.py`` patches it:
``--dq-block-n``, ``--dq-stages``); ``lab/inspect_gluon.py --impls gluon_bwd_dq`` prints the compiled figures."""


def gluon_bwd_dq_tiles(D: int) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, STAGES, num_warps)`` of the Gluon dQ kernel at head dim ``D`` (:data:`GLUON_BWD_DQ_TILES`).
    Raises ``ValueError`` for a ``D`` outside :data:`GLUON_BWD_HEAD_DIMS`."""
    if D not in GLUON_BWD_HEAD_DIMS:
        raise ValueError(f"D={D} is not supported by the Gluon backward; allowed values: {GLUON_BWD_HEAD_DIMS}")
    return GLUON_BWD_DQ_TILES[D]


def gluon_kernel(impl: str, GK):
    """``(kernel, extra constexpr kwargs)`` that run ``impl`` (``GK``: the kernels module)."""
    if impl == PERSISTENT_IMPL:
        return GK._gl_fwd_ws3p_kernel, {}
    if impl not in WS3_FLAGS:
        raise ValueError(f"impl={impl!r} is not a Gluon forward; allowed values: "
                         f"{', '.join(map(repr, GLUON_FWD_IMPLS))}")
    return GK._gl_fwd_ws3_kernel, dict(WS3_FLAGS[impl])


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The number of SMs of CUDA ``device`` (cached): the persistent forward's largest grid."""
    return torch.cuda.get_device_properties(device).multi_processor_count


PERSISTENT_PROGRAMS: Optional[int] = None
"""The persistent forward's grid: ``None`` (default) one program per SM (:func:`sm_count`), capped at the number of
work items; an int ``P >= 1`` caps it at ``P`` instead (the GPU tests run a few programs that each walk many work
items). A module-level knob read at every call."""


PERSISTENT_SECTION_BYTES = 16 << 20
"""The share of L2 one section of the persistent forward's work list may fill with K / V (bytes): a section holds as
many (batch, query head) pairs as fit (:func:`persistent_section`), its query tiles listed longest first across its
heads. 16 MiB: a third of the H100's / H200's 50 MiB L2."""


def persistent_section(Hq: int, Hkv: int, Nk: int, D: int, esz: int, n_bh: int) -> int:
    """Query heads per section of the persistent forward's work list: ``PERSISTENT_SECTION_BYTES`` over the K / V
    bytes one query head adds (``2 * Nk * D * esz`` per K / V head, shared by its ``Hq / Hkv`` query heads), at least
    1, at most ``n_bh`` (all heads)."""
    return heads_per_section(PERSISTENT_SECTION_BYTES, n_bh, Nk, D, D, esz, Hq // Hkv)


PERSISTENT_SCHEDULES = ("static", "dynamic")
PERSISTENT_SCHEDULE = "dynamic"
"""How the persistent forward's programs share the work list: ``"dynamic"`` (the default): each program claims its
next item from a global counter when it starts it (FA3's tile scheduler: the longest-first list then runs greedily,
as the hardware hands out ws3a's tiles), the index handed from the producer to the consumers through global memory;
``"static"``: the snake over the list, fixed at the launch. Forward TFLOP/s against ws3a on an H200 (34th session,
``results/h200/2026-12-07/ws3p``, 16 MiB sections, D 128): dynamic 1.08 / 1.13 / 1.06x on causal 1k / 4k / 16k and
1.04 / 1.05 / 1.02x on full; static 0.89 / 0.78 / 0.71x on causal, 1.11 / 1.08 / 1.02x on full (items of one cost
suit a fixed order). A module-level knob read at every call."""


def persistent_dynamic() -> bool:
    """Whether :data:`PERSISTENT_SCHEDULE` is ``"dynamic"``; raises ``ValueError`` naming the knob and the allowed
    values for anything but ``"static"`` / ``"dynamic"``."""
    if PERSISTENT_SCHEDULE not in PERSISTENT_SCHEDULES:
        raise ValueError(f"kernels.flash.gluon.PERSISTENT_SCHEDULE={PERSISTENT_SCHEDULE!r} is not supported; "
                         f"allowed values: {', '.join(map(repr, PERSISTENT_SCHEDULES))}")
    return PERSISTENT_SCHEDULE == "dynamic"


@functools.lru_cache(maxsize=None)
def _schedule_buffers(device: torch.device, programs: int, stream: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The dynamic schedule's int32 work counter (one element, zeroed before every launch) and its hand-over slots
    ``(programs,)``, one pair per (device, grid size, stream handle): launches on one stream reuse them in order, and
    launches on two streams, which may run at once, never share a counter."""
    return (torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(programs, dtype=torch.int32, device=device))


def persistent_grid(n_work: int, device: torch.device) -> int:
    """The persistent forward's number of programs for ``n_work`` work items (query tiles x heads x batch) on
    ``device``: ``min(n_work, PERSISTENT_PROGRAMS or SMs)``, at least 1. Raises ``ValueError`` for a
    :data:`PERSISTENT_PROGRAMS` that is not ``None`` or an int >= 1."""
    cap = PERSISTENT_PROGRAMS
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ValueError(f"kernels.flash.gluon.PERSISTENT_PROGRAMS={cap!r} is not supported; allowed values: None "
                         f"(one program per SM) or an int >= 1")
    return max(1, min(n_work, cap if cap is not None else sm_count(device)))


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

        raise ValueError(f"fwd_impl='gluon_ws3a' / 'gluon_ws3b' needs triton.experimental.gluon with the "
                         f"Hopper API of triton 3.6 (warpgroup_mma, tma, mbarrier, warp_specialize); this triton "
                         f"{triton.__version__} failed with {type(e).__name__}: {e}; use fwd_impl='triton'") from e
    return GK, TensorDescriptor, gl


GLUON_AUTO_TRITON = ((3, 6), (3, 9))
"""The triton versions (major, minor) ``"auto"`` takes the Gluon forward on: those the GPU tests passed on and the
forward was measured faster than the Triton one. Gluon is experimental and its API moves between versions (3.9
renamed two calls the kernels make: ``_gluon_kernels._cta_barrier`` / ``_tma_load`` pick either name), so on any
other version ``"auto"`` keeps the Triton forward; an explicit ``fwd_impl="gluon_ws3a"`` still tries. H100,
2026-12-06 (``results/h100/2026-12-06e``, torch 2.11): on triton 3.9 the Gluon GPU tests 593 of 595 passed (the two
others asserted 3.6's ``"auto"``), the Gluon forward D 128 1.13-1.18x the Triton forward (3.6: 1.11-1.23x)."""

GLUON_AUTO_BWD_TRITON = {(3, 6): (64, 128), (3, 9): (128,)}
"""The triton versions ``"auto"`` takes the Gluon backward on (keys: a subset of :data:`GLUON_AUTO_TRITON`), each with
the head dims it takes it at. H100 80GB (no H200 was lent), torch 2.11, forward+backward, bf16, 16k tokens per call,
one process:

* 3.9, D 128: the Gluon backward (two consumers, Gluon dQ: what 3.6 runs) against the Triton backward, causal 4k /
  16k, full 4k / 16k: 0.99 / 1.03 / 1.04 / 1.05x (backward alone 1.02 / 1.03 / 1.05 / 1.09x; 5 rounds,
  ``results/h100/2026-12-06g/12``); kernel by kernel 1.03 / 1.07x (causal 16k / full 4k, ``results/h100/
  2026-12-06f/9``).
* 3.9, D 64: the Gluon backward (Triton dQ) 0.98 / 0.98 / 1.02 / 1.00x the Triton one (same run): no lead, so the
  Triton backward. 3.9 builds the Gluon backward ~8 % slower than 3.6 does (``results/h100/2026-12-06e``, calls 6
  and 8; docs/kernels.md: what differs in the compiled code); on 3.6 it leads at both head dims.

Timed on 3.9 for dense and causal masks, and at N 16k for window 1024 (0.99x) and BigBird (1.01x;
``results/h100/2026-12-06h/masks39``): documents, other layouts and GQA that :func:`auto_bwd_shape_ok` sends to the
Gluon backward at D 128 follow untimed there."""


def _triton_version() -> tuple:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


@functools.lru_cache(maxsize=None)
def gluon_available() -> bool:
    """Whether ``"auto"`` may take the Gluon forward: a triton version in :data:`GLUON_AUTO_TRITON` and
    :func:`_gluon_modules` succeeds (cached, failure too: ``"auto"`` then means ``"triton"``)."""
    try:
        if _triton_version() not in GLUON_AUTO_TRITON:
            return False
        _gluon_modules()
    except Exception:
        return False
    return True


def gluon_bwd_available(D: Optional[int] = None) -> bool:
    """Whether ``"auto"`` may take the Gluon backward (at head dim ``D``; ``None``: at any): :func:`gluon_available`
    (cached) and a triton version in :data:`GLUON_AUTO_BWD_TRITON` (read at every call) whose head dims hold ``D``."""
    try:
        dims = GLUON_AUTO_BWD_TRITON.get(_triton_version())
        return dims is not None and (D is None or D in dims) and gluon_available()
    except Exception:
        return False


def nvmma_layout(block_shape, gl_dtype):
    """The shared layout of a TMA tile ``block_shape`` (128-byte swizzle at 64 / 128 half-precision columns)."""
    import triton.experimental.gluon.language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


@functools.lru_cache(maxsize=64)
def _kept_nvmma_layout(block_shape: tuple, gl_dtype):
    """:func:`nvmma_layout`, one object per (block shape, dtype) (a frozen dataclass), for :data:`GLUON_KEPT_LAUNCH`:
    building it costs ~20 us of host time, and a forward+backward makes 11."""
    return nvmma_layout(block_shape, gl_dtype)


@functools.lru_cache(maxsize=None)
def lse_layout():
    """The shared layout of the backward's lse2 / delta boxes (1-D fp32, ``BLOCK_M`` values): unswizzled; one object
    (a frozen dataclass, built once: two per backward cost ~20 us of host time each)."""
    import triton.experimental.gluon.language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)


def gluon_tma_reduce_ok() -> bool:
    """Whether this triton's Gluon has the TMA bulk reduce-add (``tma.async_atomic_add``: triton 3.7+; not 3.6) that
    ``gluon_bwd_dq="tma"`` needs."""
    try:
        GK = _gluon_modules()[0]
    except ValueError:
        return False
    return GK._tma_reduce_add is not None


def check_tma_reduce() -> None:
    """Raise ``ValueError`` naming ``gluon_bwd_dq`` when :func:`gluon_tma_reduce_ok` does not hold."""
    if not gluon_tma_reduce_ok():
        import triton

        raise ValueError(f"gluon_bwd_dq='tma' needs the TMA reduce-add of triton's Gluon (tma.async_atomic_add, "
                         f"triton 3.7 or later); this triton is {triton.__version__}; allowed values here: 'atomic', "
                         f"'triton', 'gluon'")


@functools.lru_cache(maxsize=None)
def dq_tma_layout():
    """The shared layout of the fused dQ's tile (``gluon_bwd_dq="tma"``: fp32 ``[1, 1, BLOCK_M, D]``, the box of the
    TMA reduce-add into the ``(B, Hq, Nq, D)`` buffer): a 128-byte swizzle, so the tile is D / 32 column blocks of
    ``BLOCK_M`` x 128 bytes, one reduce-add message each (issued by as many warps, triton 3.9). Unswizzled, the
    registers' stores hit 8-way bank conflicts (every row 512 bytes: the 8 rows a warp writes share their banks)."""
    import triton.experimental.gluon.language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=4)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device):
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


@functools.lru_cache(maxsize=None)
def _hopper(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA GPU of compute capability 9.x (cached; ``False`` when the query fails)."""
    try:
        cap = _capability(device)
    except Exception:
        return False
    return cap is not None and cap[0] == 9


def _beyond_causal(win_left: int, win_right: int, documents) -> bool:
    """Whether a band mask is more than dense / causal: a window's left edge, a right edge > 0, or documents."""
    return documents is not None or win_left >= 0 or win_right > 0


def choose_fwd_impl(config: FlashConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int = -1,
                    win_right: int = -1, layout: Optional[torch.Tensor] = None, dilation: int = 1,
                    documents: Optional[torch.Tensor] = None, layout_bs: int = 0, *, sink_size: int = 0) -> str:
    """The forward kernel a call with ``config`` runs: ``config.fwd_impl`` unless it is ``"auto"``, which gives
    a Gluon forward when all of these hold, else ``"triton"``: :data:`PERSISTENT_IMPL` (``"gluon_ws3p"``) without a
    layout or ``documents`` while :data:`AUTO_PERSISTENT`, else ``AUTO_GLUON_IMPL`` (``"gluon_ws3a"``):

    * ``q`` on a CUDA device of compute capability 9.x (Hopper), not under ``TRITON_INTERPRET=1``, and Gluon
      importable with the Hopper API on a triton of :data:`GLUON_AUTO_TRITON` (:func:`gluon_available`; both checks
      cached);
    * no attention sinks (``sink_size == 0``: the Gluon kernels have none);
    * a band mask: ``dilation == 1``; no block-sparse ``layout`` unless :data:`GLUON_AUTO_SPARSE` is on, ``D`` in
      :data:`GLUON_AUTO_BAND_HEAD_DIMS`, no ``documents``, the layout's blocks (``layout_bs`` tokens) are whole
      Gluon tiles (:func:`~kernels.flash.sparse.tiles_whole`) and, while :data:`GLUON_AUTO_SPARSE_CAUSAL_ONLY`, the
      call is causal without a window; and, unless :data:`GLUON_AUTO_BANDS` and ``D`` in
      :data:`GLUON_AUTO_BAND_HEAD_DIMS`, a dense or causal one (``win_left < 0``, ``win_right`` -1 (dense) or 0
      (causal), no ``documents`` table);
    * ``D = q.shape[3]`` a key of ``GLUON_AUTO_HEAD_DIMS`` and ``v.shape[3] == D``; q, k, v float16 / bfloat16;
    * ``config``: no forced ``fwd`` tile, ``autotune`` off, ``tma`` not ``False`` (the Gluon kernel reads by TMA);
    * without a layout, at least ``max(config.tma_min_pairs, GLUON_AUTO_HEAD_DIMS[D])`` visited query-key pairs
      (:func:`~kernels.flash.visited_pairs`, the count
      of the Triton forward's TMA ``"auto"``).

    ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)``; the mask arguments as
    :func:`~kernels.flash.flash_attn_fwd` takes them (``win_right = 0`` is causal, ``documents`` only tested for
    ``None``; the pair count ignores documents); :func:`kernels.flash.resolve_fwd_impl` takes
    :func:`~kernels.flash.flash_attn`'s instead. Never
    raises for ``"auto"`` (an explicit Gluon name is checked at the call, :func:`check_gluon_fwd`)."""
    impl = config.fwd_impl
    if impl != "auto":
        return impl
    if INTERPRET or q.device.type != "cuda" or sink_size:
        return "triton"
    D = q.shape[3]
    if dilation != 1 or (layout is not None and not (
            GLUON_AUTO_SPARSE and D in GLUON_AUTO_BAND_HEAD_DIMS and documents is None
            and _sparse_auto_mask_ok(win_left, win_right)
            and tiles_whole(layout_bs, q.shape[2], k.shape[2], *gluon_tiles(AUTO_GLUON_IMPL, D)[:2]))):
        return "triton"
    if _beyond_causal(win_left, win_right, documents) and not (
            GLUON_AUTO_BANDS and D in GLUON_AUTO_BAND_HEAD_DIMS):
        return "triton"
    if D not in GLUON_AUTO_HEAD_DIMS or v.shape[3] != D:
        return "triton"
    min_pairs = max(config.tma_min_pairs, GLUON_AUTO_HEAD_DIMS[D])
    if q.dtype not in (torch.float16, torch.bfloat16) or not (k.dtype == v.dtype == q.dtype):
        return "triton"
    if config.fwd is not None or config.autotune or config.tma is False:
        return "triton"
    B, Hq, Nq = q.shape[:3]
    if layout is None and visited_pairs(B, Hq, Nq, k.shape[2], win_left, win_right) < min_pairs:
        return "triton"
    if not _hopper(q.device) or not gluon_available():
        return "triton"
    if AUTO_PERSISTENT and layout is None and documents is None:
        return PERSISTENT_IMPL
    return AUTO_GLUON_IMPL


GLUON_BWD_AUTO_MIN_PAIRS = {64: 1 << 22, 128: 1 << 19}
"""Visited query-key pairs per (batch, head) from which ``bwd_impl="auto"`` takes the Gluon backward, by head dim.
D 64: 2^22 (dense N >= 2048, causal N >= 2896). H200, 2026-12-04 (``results/h200/2026-12-04i``, ``python -m
lab.gluon_bwd_sweep``, backward alone, bf16, 16k tokens per call): two consumers + Triton dQ against the Triton
backward 1.01-1.05x at N 4k / 16k (D 64 / 128, dense and causal), 1.00-1.04x at 2k, but 0.78 / 0.87x at causal 1k
(D 128 / 64). D 128: 2^19 since 2026-12-07 (causal N >= 1024, dense N >= 725), after the Gluon dQ became its
default: on an H100 (same process, 16k tokens per call, H 16, fwd+bwd / backward alone against ``"auto"``'s Triton
backward, ``results/h100/2026-12-07c/short/``, ``5/``) causal 1k 1.06 / 1.07x (the 26th: 0.96x fwd+bwd), full 1k
1.05-1.07 / 1.07-1.12x (the 26th too: 1.05 / 1.09x), GQA 4:1 causal 1k / 2k 1.11 / 1.07x (backward 1.15 / 1.10x),
window 1024 at 1k (the causal mask there) 1.01 / 1.14x, at 2k 1.07 / 1.08x, causal 2k 1.05x once (the 26th); at N
512 0.60 / 0.81x, below the threshold. Those settings were forced (``eval.bench_flash``'s ``ours_gluon_dq``: what
``"auto"`` runs at D 128); run as ``"auto"`` (H100, ``results/h100/2026-12-07d/short/bwd_min_pairs.csv``) ours equals
them at every 1k / 2k row (causal 1k 291.6 / 291.3 TFLOP/s, 0.95x cuDNN)."""
AUTO_GLUON_BWD = dict(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2)
"""The settings ``bwd_impl="auto"`` runs where it picks the Gluon backward (the dQ: see :data:`AUTO_GLUON_DQ_HEAD_DIMS`)."""
AUTO_GLUON_DQ_HEAD_DIMS = (128,)
"""Head dims where that backward takes the Gluon dQ kernel (``gluon_bwd_dq="gluon"``) instead of the Triton one: the
backward alone ran 1.04-1.09x faster with it at D 128 and 0.997-1.02x at D 64 (H200, N 4k / 16k, causal and not,
one process, 2026-12-05: ``results/h200/2026-12-05/b/gdq_sweep.csv``)."""

GLUON_AUTO_BWD_GQA_HEAD_DIMS = (128,)
"""Head dims where ``bwd_impl="auto"`` takes the Gluon backward for GQA / MQA (``Hq != Hkv``; one program per K/V
head and key tile loops over the group's query heads) where :func:`gqa_bwd_measured` holds; elsewhere GQA keeps the
Triton backward. H100 80GB (no H200 was lent), 2026-12-05 (``results/h100/2026-12-05b/c1/gqa_bwd_d128.csv``, ``python -m
eval.bench_flash --variants gqa4 --D 128 --impls ours,ours_gluon_dq,sdpa_cudnn --rounds 3``, GQA 4:1, causal, bf16,
16k tokens per call, forward+backward): the Gluon backward (two consumers, Gluon dQ) 405.6 against the Triton
backward's 388.6 TFLOP/s at N 4k (1.04x), 506.4 against 468.5 at 16k (1.08x; the backward alone 1.11x / 1.03x);
512 dK / dV programs in both. D 64, larger groups (MQA), smaller grids and band masks were not measured."""
GLUON_AUTO_BWD_GQA_MAX_GROUP = 4
"""The largest ``Hq / Hkv`` the Gluon backward takes GQA at under ``"auto"`` (the measured 4:1): its dK / dV program
loops over the whole group, where the Triton backward splits a group over programs (``dkdv_split``)."""
GLUON_AUTO_BWD_GQA_MIN_PROGRAMS = 512
"""The fewest dK / dV programs (``cdiv(Nk, 128) * B * Hkv``) at which ``"auto"`` takes the Gluon backward for GQA:
both measured cases had 512 (132 SMs on an H100 / H200)."""


def gqa_bwd_measured(B: int, Hq: int, Hkv: int, Nk: int, D: int, band: bool) -> bool:
    """Whether a GQA call (``Hq != Hkv``) is the case the Gluon backward was measured faster on, so that ``"auto"``
    takes it: ``D`` in :data:`GLUON_AUTO_BWD_GQA_HEAD_DIMS`, a dense or causal mask (not ``band``: windows and
    documents with GQA are untimed), a group ``Hq / Hkv`` of at most :data:`GLUON_AUTO_BWD_GQA_MAX_GROUP` and at
    least :data:`GLUON_AUTO_BWD_GQA_MIN_PROGRAMS` dK / dV programs."""
    return (D in GLUON_AUTO_BWD_GQA_HEAD_DIMS and not band and Hq // Hkv <= GLUON_AUTO_BWD_GQA_MAX_GROUP
            and -(-Nk // 128) * B * Hkv >= GLUON_AUTO_BWD_GQA_MIN_PROGRAMS)


@functools.lru_cache(maxsize=64)
def auto_gluon_bwd_config(config: FlashConfig, D: int) -> FlashConfig:
    """``config`` with :data:`AUTO_GLUON_BWD`, and the Gluon dQ where ``D`` (the head dim) is in
    :data:`AUTO_GLUON_DQ_HEAD_DIMS` (cached: one validated copy per config and D)."""
    return config.replace(**{**AUTO_GLUON_BWD, "gluon_bwd_dq": "gluon" if D in AUTO_GLUON_DQ_HEAD_DIMS else "triton"})


GLUON_AUTO_BWD_BANDS = True
"""Whether ``bwd_impl="auto"`` takes the Gluon backward (two consumers) for band masks too: sliding windows (either
edge) and packed documents, with the same pairs threshold (:func:`~kernels.flash.visited_pairs`, which counts a
window's band; documents are not counted) as dense / causal, MHA only (:func:`gqa_bwd_measured`); never a block-sparse
layout or dilation. ``False`` keeps the Triton backward for every band mask. H200, 2026-12-05
(``results/h200/2026-12-05b/a1/gluon_band_bwd.csv``, ``python -m lab.gluon_band_bwd_bench``, backward alone, bf16,
16k tokens per call): what ``"auto"`` runs against the Triton backward, D 128 (Gluon dQ): window 1024 at 4k 1.08x, at
16k 1.05x; documents of 1024 / 4096 at 16k 1.15x / 1.14x; D 64 (Triton dQ): 0.995-1.01x."""


GLUON_AUTO_BWD_SPARSE = True
"""Whether ``bwd_impl="auto"`` takes the Gluon backward (two consumers, Gluon dQ) for a block-sparse layout whose
blocks are whole 128 x 128 tiles (:func:`~kernels.flash.sparse.tiles_whole`, as :data:`GLUON_AUTO_SPARSE` for the
forward) at the head dims of :data:`AUTO_GLUON_DQ_HEAD_DIMS`, MHA, no documents, from
:data:`GLUON_AUTO_BWD_SPARSE_MIN_N` queries. H100 80GB (no H200 was lent), 2026-12-06, ``results/h100/2026-12-06c/``
(``eval.bench_flash --variants bigbird,strided --impls ours,ours_gluon_dq,flex_fa4``, causal, 128-token blocks, D 128,
bf16, 16k tokens per call, one process; four calls): forward+backward against the Triton sparse backward at N 16k,
strided 1.08-1.10x in all four, BigBird 1.04x in three and 0.95x in one; at 1k / 4k 1.02-1.06x in two calls and in
the kernel-by-kernel profile (``lab.where_time``), but 0.64-1.00x in three others (some rounds' spread up to 0.42,
the Triton rows' <= 0.13). Twenty-third session (H100, ``results/h100/2026-12-06d/``: ``4/``, ``sparse_bwd2/``,
``auto/``, ``noncausal/``, 5 rounds each), the Gluon backward against the Triton one at 1k / 4k / 16k, causal (three
calls): the backward alone BigBird 1.01-1.06x, strided 1.04-1.15x, the forward+backward step 1.02-1.04x / 1.03-1.10x;
non-causal (two calls): the backward 1.09-1.19x, the step 1.07-1.10x; no reading below 1. So ``"auto"`` took it from
1k queries (the shortest measured) until 2026-12-07; see :data:`GLUON_AUTO_BWD_SPARSE_MIN_N` for why 4k now. A
module-level knob read at every call."""
GLUON_AUTO_BWD_SPARSE_MIN_N = 4096
"""Queries (``Nq``) from which :data:`GLUON_AUTO_BWD_SPARSE` applies: 16,384 until 2026-12-06, then 1,024, 4,096 since
2026-12-07. Thirty-first and thirty-second sessions (H100, ``results/h100/2026-12-07c/call4_tail.log``,
``results/h100/2026-12-07d/``: ``sparse_bwd.log``, ``sp/``, ``sp2/``; causal BigBird / strided, 128-token blocks, D
128, bf16, 16k tokens per call, 5 rounds), the Gluon backward (Gluon dQ) against the Triton one, forward+backward: at
N 1k 0.64-1.02x (ten readings, eight below 0.92), at 2k 0.70-1.03x (six, four below 0.8; its rounds' spread up to
0.46 against the Triton rows' <= 0.04); at 4k 0.89-1.06x (twelve, eight >= 1.03), at 8k 1.02-1.07x (four), at 16k
1.04-1.11x (four)."""


def auto_bwd_shape_ok(config: FlashConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int,
                      win_right: int, layout, dilation: int, documents, layout_bs: int = 0, *,
                      sink_size: int = 0) -> bool:
    """The device-independent part of :func:`choose_bwd_impl`: the mask (dense, causal and, while
    :data:`GLUON_AUTO_BWD_BANDS`, sliding windows and documents; a block-sparse layout of ``layout_bs``-token blocks
    only while :data:`GLUON_AUTO_BWD_SPARSE`, see there, and causal while :data:`GLUON_AUTO_SPARSE_CAUSAL_ONLY`;
    never dilation, never attention sinks: ``sink_size > 0``), ``D`` in :data:`GLUON_BWD_HEAD_DIMS` with
    ``Dv == D``, ``Hq == Hkv`` or GQA where :func:`gqa_bwd_measured` holds, one fp16 / bf16 dtype, the Triton
    backward's settings at their defaults (``dq_mode="separate"``, ``dkdv_split=None``, no forced ``dq`` / ``dkdv``
    tile, ``autotune`` off) and, without a layout, at least :data:`GLUON_BWD_AUTO_MIN_PAIRS` (by ``D``) visited pairs
    per (batch, head)."""
    if dilation != 1 or sink_size:
        return False
    if layout is not None and not (
            GLUON_AUTO_BWD_SPARSE and q.shape[2] >= GLUON_AUTO_BWD_SPARSE_MIN_N
            and _sparse_auto_mask_ok(win_left, win_right)
            and q.shape[3] in AUTO_GLUON_DQ_HEAD_DIMS and documents is None and q.shape[1] == k.shape[1]
            and tiles_whole(layout_bs, q.shape[2], k.shape[2], 128, 128)):
        return False
    if not GLUON_AUTO_BWD_BANDS and _beyond_causal(win_left, win_right, documents):
        return False
    D = q.shape[3]
    if D not in GLUON_BWD_HEAD_DIMS or v.shape[3] != D:
        return False
    if q.shape[1] != k.shape[1] and not gqa_bwd_measured(q.shape[0], q.shape[1], k.shape[1], k.shape[2], D,
                                                          _beyond_causal(win_left, win_right, documents)):
        return False  # GQA / MQA outside the measured case: the Triton backward
    if q.dtype not in (torch.float16, torch.bfloat16) or not (k.dtype == v.dtype == q.dtype):
        return False
    if (config.dq_mode != "separate" or config.dkdv_split is not None or config.dq is not None
            or config.dkdv is not None or config.autotune):
        return False
    return layout is not None or (visited_pairs(1, 1, q.shape[2], k.shape[2], win_left, win_right)
                                  >= GLUON_BWD_AUTO_MIN_PAIRS[D])


def choose_bwd_impl(config: FlashConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int = -1,
                    win_right: int = -1, layout: Optional[torch.Tensor] = None, dilation: int = 1,
                    documents: Optional[torch.Tensor] = None, layout_bs: int = 0, *, sink_size: int = 0) -> str:
    """The backward kernel a call with ``config`` runs: ``config.bwd_impl`` unless it is ``"auto"``, which gives
    ``"gluon"`` (run with :data:`AUTO_GLUON_BWD`) when :func:`auto_bwd_shape_ok` holds, ``q`` is on a Hopper CUDA
    device, not under ``TRITON_INTERPRET=1``, and Gluon imports with the Hopper API on a triton that ``"auto"`` runs
    the Gluon backward on at this head dim (:func:`gluon_bwd_available`), else ``"triton"``. Arguments as
    :func:`choose_fwd_impl`'s. Never raises for ``"auto"``."""
    impl = config.bwd_impl
    if impl != "auto":
        return impl
    if INTERPRET or q.device.type != "cuda":
        return "triton"
    if not auto_bwd_shape_ok(config, q, k, v, win_left, win_right, layout, dilation, documents, layout_bs,
                             sink_size=sink_size):
        return "triton"
    if not _hopper(q.device) or not gluon_bwd_available(q.shape[3]):
        return "triton"
    return "gluon"


def _check_gluon(arg: str, head_dims, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int,
                 win_right: int, layout, dilation: int, documents, fix: str, bands: bool = False,
                 masks: Optional[str] = None) -> bool:
    """The checks the Gluon kernels share: raise ``ValueError`` naming ``arg`` (e.g. ``"fwd_impl='gluon'"``) when the
    mask, head dims (``D`` in ``head_dims``, ``Dv == D``), dtypes (fp16 / bf16, one for q, k, v) or device (Hopper)
    rule it out, or Gluon does not import; returns whether the call is causal. ``bands``: the kernel takes band
    masks (sliding windows, ``doc_ids``; see ``_gluon_kernels``); a block-sparse layout and dilation are refused
    either way (the forward checks its layouts first). ``masks``: the masks the message says are allowed (default:
    those of ``bands``)."""
    if bands:
        masks = masks or "dense, causal, sliding-window and document masks (no block-sparse layout or dilation)"
        refused = layout is not None or dilation != 1
    else:
        masks = "dense or causal masks (no window_size left edge, block-sparse layout, dilation or doc_ids)"
        refused = layout is not None or dilation != 1 or _beyond_causal(win_left, win_right, documents)
    allowed = f"{masks}, head dim D in {head_dims} with Dv == D, float16 / bfloat16, a Hopper (sm_90) CUDA device"
    if refused:
        what = (f"dilation={dilation}" if dilation != 1 else "a block-sparse layout" if layout is not None else
                "doc_ids" if documents is not None else f"window (left={win_left}, right={win_right})")
        raise ValueError(f"{arg} supports only {allowed}; got {what}; {fix}")
    D, Dv = q.shape[3], v.shape[3]
    if D not in head_dims or Dv != D:
        raise ValueError(f"{arg} supports only {allowed}; got D={D}, Dv={Dv}; {fix}")
    if q.dtype not in (torch.float16, torch.bfloat16) or not (k.dtype == v.dtype == q.dtype):
        raise ValueError(f"{arg} supports only {allowed}; got dtype {q.dtype}; {fix}")
    cap = _capability(q.device)
    if cap is None or cap[0] != 9:
        dev = q.device if cap is None else f"{q.device} (sm_{cap[0]}{cap[1]})"
        raise ValueError(f"{arg} supports only {allowed}; got device {dev}; {fix}")
    _gluon_modules()
    return win_right == 0


def _refuse_sinks(arg: str, sink_size: int, fix: str) -> None:
    """Raise ``ValueError`` naming ``arg`` and ``sink_size`` when ``sink_size > 0``: the Gluon kernels have no
    attention sinks (the Triton ones do)."""
    if sink_size:
        raise ValueError(f"{arg} has no attention sinks; got sink_size={sink_size!r} (allowed there: sink_size=0); "
                         f"{fix}")


GLUON_FWD_MASKS = ("dense, causal, sliding-window and document masks, and block-sparse layouts of whole 128 x 128 "
                   "tiles (no dilation)")


def check_gluon_fwd(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int, win_right: int,
                    layout, dilation: int, documents, layout_bs: int = 0, *, sink_size: int = 0) -> bool:
    """Raise ``ValueError`` when ``fwd_impl=impl`` cannot run this call (band masks pass: windows, documents; a
    block-sparse ``layout`` of ``layout_bs``-token blocks passes when each Gluon tile lies inside one block
    (:func:`~kernels.flash.sparse.tiles_whole`: ``layout_bs`` and ``Nk - Nq`` multiples of 128) and there are no
    ``documents``; dilation does not, nor attention sinks, ``sink_size > 0``); returns whether it is causal
    (``win_right == 0``)."""
    if impl not in GLUON_FWD_IMPLS:
        raise ValueError(f"fwd_impl={impl!r} is not a Gluon forward; allowed values: "
                         f"{', '.join(map(repr, GLUON_FWD_IMPLS))} (FlashConfig takes "
                         f"{', '.join(map(repr, FWD_IMPLS))})")
    _refuse_sinks(f"fwd_impl={impl!r}", sink_size, "use fwd_impl='triton' (or 'auto')")
    if layout is not None and dilation == 1 and impl == PERSISTENT_IMPL:
        raise ValueError(f"fwd_impl={impl!r} takes no block-sparse layout (band masks and doc_ids only); use "
                         f"fwd_impl='gluon_ws3a' or 'triton'")
    if layout is not None and dilation == 1:
        bm, bn = gluon_tiles(impl, 128)[:2]
        Nq, Nk = q.shape[2], k.shape[2]
        if documents is not None or not tiles_whole(layout_bs, Nq, Nk, bm, bn):
            got = ("a block-sparse layout with doc_ids" if documents is not None else
                   f"block_size={layout_bs}, Nk - Nq = {Nk - Nq}")
            raise ValueError(f"fwd_impl={impl!r} takes a block-sparse layout only when every {bm} x {bn} tile lies "
                             f"inside one layout block (block_size a multiple of {bm}, Nk - Nq a multiple of {bm}) "
                             f"and without doc_ids; got {got}; use fwd_impl='triton'")
        layout = None  # the rest as for its band
    return _check_gluon(f"fwd_impl={impl!r}", GLUON_HEAD_DIMS, q, k, v, win_left, win_right, layout, dilation,
                        documents, "use fwd_impl='triton'", bands=True,
                        masks=None if impl == PERSISTENT_IMPL else GLUON_FWD_MASKS)


def _tma_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` if a TMA descriptor can read it as is (unit last stride, 16-byte aligned base and strides; strides
    of size-1 dims do not matter), else a contiguous copy."""
    esz = t.element_size()
    ok = t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all(
        (s * esz) % 16 == 0 for s, n in zip(t.stride()[:3], t.shape[:3]) if n > 1)
    return t if ok else t.contiguous()


def _descriptor(t: torch.Tensor, rows: int, TD, gl_dtype):
    """The 4-D host TMA descriptor of ``t (B, H, N, D)`` (as :func:`_tma_view` returns it) with ``[1, 1, rows, D]``
    boxes, through :func:`_td`."""
    strides = list(t.stride())
    for i in range(3):  # a size-1 dim's stride is never used: give it a legal (16-byte aligned) value
        if t.shape[i] == 1:
            strides[i] = t.shape[3] * t.shape[2] if i < 2 else t.shape[3]
    block = [1, 1, rows, t.shape[3]]
    layout = _kept_nvmma_layout(tuple(block), gl_dtype) if GLUON_KEPT_LAUNCH else nvmma_layout(block, gl_dtype)
    return _td(TD, t, list(t.shape), strides, block, layout)


_TD_TEMPLATES: dict = {}
"""The fields (all but ``base``) of validated host TMA descriptors by (class, dtype, device type, shape, strides, block,
layout): :func:`_td` copies them for another base tensor of the same key. No tensor is held. Bounded by
:data:`_TD_TEMPLATES_KEPT` (emptied when full)."""
_TD_TEMPLATES_KEPT = 256


def _td(TD, base: torch.Tensor, shape: list, strides: list, block: list, layout):
    """``TD(base, shape, strides, block, layout)``, Gluon's host TMA descriptor. While :data:`GLUON_KEPT_LAUNCH`, a
    repeated key (dtype, device type, shape, strides, block and layout; ``base`` 16-byte aligned, as every tensor
    :func:`_tma_view` passes is) copies the fields of the descriptor built and validated at the key's first call and
    sets ``base`` (~0.5 us of host time instead of ~5 us: Triton's checks read only the base's alignment and dtype
    besides the fields, and keep nothing derived from it); otherwise, or for an unaligned base, the constructor and
    its checks run (and raise what they raise)."""
    if not GLUON_KEPT_LAUNCH or base.data_ptr() % 16:
        return TD(base, shape, strides, block, layout)
    key = (TD, base.dtype, base.device.type, tuple(shape), tuple(strides), tuple(block), layout)
    fields = _TD_TEMPLATES.get(key)
    if fields is None:
        d = TD(base, shape, strides, block, layout)
        if hasattr(d, "__dict__"):  # (a descriptor class with __slots__: no copy of that kind)
            if len(_TD_TEMPLATES) >= _TD_TEMPLATES_KEPT:
                _TD_TEMPLATES.clear()
            _TD_TEMPLATES[key] = {k: v for k, v in d.__dict__.items() if k != "base"}  # never the tensor itself
        return d
    d = object.__new__(TD)
    d.__dict__.update(fields)
    d.base = base
    return d


GLUON_KEPT_LAUNCH = True
"""Whether the Gluon forward / backward / dQ kernels (and the backward's Triton preprocess) launch through
:func:`kernels._host.launch`, which keeps each compiled kernel and calls its launcher directly on a repeated call
(the key covers every argument Triton specialises on, a TMA descriptor's shape, strides, block and layout included),
with the Q / K / V / dO tiles' shared layouts built once. **On** by default since 2026-12-05 (sixteenth session,
H100 80GB, ``results/h100/2026-12-05c/``, ``python -m lab.where_time``): through Triton's own launcher every call, a
causal window of 1024 at 16k tokens, D 128, forward+backward, took 1.596 ms of wall time for 1.288 ms of kernels
(GPU busy 81 %); kept, in another call on the same machine, 1.292 ms for 1.290 ms (busy 100 %), ahead of the
Triton-only path (1.355 ms, same call). ``eval.bench_flash`` in one call: 271.1 -> 339.7 TFLOP/s (1.25x). GPU test:
``tests/test_kernel_flash_gluon_bwd.py::test_gpu_kept_gluon_launches_match`` (outputs, lse and every gradient bit
for bit against Triton's launch path, causal / window / GQA with documents). Like every switch of ``kernels/``, it
is no environment variable (``tests/test_kernel_config.py``): set ``kernels.flash.gluon.GLUON_KEPT_LAUNCH = False``
to time Triton's own launch path."""


def _gl_launch(kernel, grid, args, num_warps: Optional[int] = None, **constexprs):
    """``kernel[grid](*args, num_warps=num_warps, **constexprs)`` (``None``: Triton's default, 4), through
    :func:`kernels._host.launch` with :data:`GLUON_KEPT_LAUNCH`."""
    if GLUON_KEPT_LAUNCH:
        return launch(kernel, grid, args, num_warps=4 if num_warps is None else num_warps, **constexprs)
    if num_warps is None:
        return kernel[grid](*args, **constexprs)
    return kernel[grid](*args, num_warps=num_warps, **constexprs)


@functools.lru_cache(maxsize=None)
def _doc_placeholder(device: torch.device) -> torch.Tensor:
    """The ``Doc`` argument of a launch without documents (int32, one element, never read), one per device."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _band_args(win_left: int, win_right: int, documents: Optional[torch.Tensor], B: int, Nq: int, Nk: int,
               device: torch.device):
    """The band-mask arguments of the Gluon kernels: ``(Doc, win_left, win_right, constexprs)`` with ``Doc`` the
    document table (or a cached int32 placeholder, never read) and the windows clipped at 0 (``HAS_LEFT`` /
    ``HAS_RIGHT`` say whether an edge exists). Raises ``ValueError`` for a table of another shape / dtype /
    device."""
    if documents is not None:
        if documents.dtype != torch.int32 or documents.shape != (B, 3 * (Nq + Nk)) or documents.device != device \
                or not documents.is_contiguous():
            raise ValueError(f"documents must be the contiguous int32 (B, 3 * Nq + 3 * Nk) = ({B}, {3 * (Nq + Nk)}) "
                             f"table of kernels.flash.documents.document_table on {device}, got "
                             f"{documents.dtype} {tuple(documents.shape)} on {documents.device}")
        doc = documents
    else:
        doc = _doc_placeholder(device)
    flags = dict(HAS_LEFT=win_left >= 0, HAS_RIGHT=win_right >= 0, DOCS=documents is not None)
    return doc, max(win_left, 0), max(win_right, 0), flags


def gluon_flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, win_left: int,
                    win_right: int, impl: str = "gluon_ws3a", out: Optional[torch.Tensor] = None,
                    lse: Optional[torch.Tensor] = None, documents: Optional[torch.Tensor] = None,
                    layout: Optional[torch.Tensor] = None, layout_bs: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward of band-masked attention (bottom-right aligned: query ``i`` sits at key position ``i + Nk - Nq``)
    with the Gluon kernel ``impl``: key ``j`` visible to query ``i`` iff ``j <= i + Nk - Nq + win_right`` (when
    ``win_right >= 0``), ``j >= i + Nk - Nq - win_left`` (when ``win_left >= 0``) and, with ``documents`` (the int32
    ``(B, 3 * Nq + 3 * Nk)`` table of :func:`kernels.flash.documents.document_table`), both in one document. Dense
    is ``win_left = win_right = -1``, causal ``win_left = -1, win_right = 0``. ``q (B, Hq, Nq, D)``, ``k, v (B, Hkv,
    Nk, D)`` fp16 / bf16 on a Hopper GPU, ``D`` in {64, 128} (call :func:`check_gluon_fwd` first). ``layout``: a
    block-sparse layout ``(nb, nb)`` at ``layout_bs`` tokens (``MaskInfo``'s rule) whose blocks are whole tiles
    (:func:`~kernels.flash.sparse.tiles_whole`), run from the block table of :func:`gluon_layout_tables` (built on
    the host at the first call with this layout, then cached); not with ``documents``. Returns ``out
    (B, Hq, Nq, D)`` in q.dtype (``out`` if given, any strides, else stored as ``(B, Nq, Hq, D)``) and ``lse (B,
    Hq, Nq)`` fp32, natural log (``-inf`` and a zero output row on rows that see no key). Raises ``ValueError`` for a
    malformed ``documents`` table."""
    from .launch import _bnhd_empty

    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if impl == PERSISTENT_IMPL:  # the knobs first: a bad value fails before any GPU work
        dynamic = persistent_dynamic()
        n_m = triton_cdiv(Nq, gluon_tiles(impl, D)[0])
        n_work = n_m * B * Hq
        programs = persistent_grid(n_work, q.device)
    GK, TD, gl = _gluon_modules()
    doc, wl, wr, flags = _band_args(win_left, win_right, documents, B, Nq, Nk, q.device)
    block_m, block_n, stages, warps = gluon_tiles(impl, D)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q, k, v = _tma_view(q), _tma_view(k), _tma_view(v)
    if out is None:
        out = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device)
    if lse is None:
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    kernel, extra = gluon_kernel(impl, GK)
    descs = (_descriptor(q, block_m, TD, gdt), _descriptor(k, block_n, TD, gdt), _descriptor(v, block_n, TD, gdt))
    common = (out, lse, out.stride(0), out.stride(1), out.stride(2), Hq, Nq, Nk, Nk - Nq, Hq // Hkv,
              softmax_scale * _LOG2E, wl, wr, doc)
    if impl == PERSISTENT_IMPL:
        if layout is not None:
            raise ValueError(f"fwd_impl={impl!r} takes no block-sparse layout; use fwd_impl='gluon_ws3a'")
        sec = persistent_section(Hq, Hkv, Nk, D, q.element_size(), B * Hq)
        stream = torch.cuda.current_stream(q.device).cuda_stream if dynamic and q.is_cuda else 0
        counter, sched = _schedule_buffers(q.device, programs, stream) if dynamic else (doc, doc)
        if dynamic:
            counter.zero_()
        _gl_launch(kernel, (programs,), (*descs, *common, n_m, n_work, sec, counter, sched),
                   num_warps=warps, **flags, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, PREFETCH=2,
                   DYNAMIC=dynamic)
        return out, lse
    grid = (triton_cdiv(Nq, block_m), B * Hq)
    tbl = (doc, doc, doc, 0)  # (never read without SPARSE)
    if layout is not None:
        idx, cnt, nfull = gluon_layout_tables(layout, layout_bs, Nq, Nk, win_left, win_right, block_m, block_n)
        tbl = (idx, cnt, nfull, idx.stride(0))
    # every constexpr by name: a kept launch (kernels._host.launch) needs the whole constexpr tail
    extra = dict(extra, SPARSE=layout is not None)
    _gl_launch(kernel, grid, (*descs, *common, *tbl), num_warps=warps, **flags, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, **extra)
    return out, lse


_LAYOUT_TABLES: dict = {}
"""Cache of :func:`gluon_layout_tables`: key -> ``(layout, tables)``; the layout is held so that its ``id`` is not
reused while cached."""
LAYOUT_TABLES_KEPT = 32


def gluon_layout_tables(layout: torch.Tensor, layout_bs: int, Nq: int, Nk: int, win_left: int, win_right: int,
                        block_m: int, block_n: int,
                        keys: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~kernels.flash.sparse.layout_tables` of ``layout`` (the same arguments), cached per layout object
    (and its in-place version) and call shape: the table is read on the host once per layout, not per call (the
    backends pass the same cached layout tensor at every step). Keeps the newest :data:`LAYOUT_TABLES_KEPT`."""
    key = (id(layout), layout._version, tuple(layout.shape), layout_bs, Nq, Nk, win_left, win_right, block_m,
           block_n, keys)
    hit = _LAYOUT_TABLES.get(key)
    if hit is not None and hit[0] is layout:
        return hit[1]
    tables = layout_tables(layout, layout_bs, Nq, Nk, win_left, win_right, block_m, block_n, keys=keys)
    while len(_LAYOUT_TABLES) >= LAYOUT_TABLES_KEPT:
        _LAYOUT_TABLES.pop(next(iter(_LAYOUT_TABLES)))
    _LAYOUT_TABLES[key] = (layout, tables)
    return tables


GLUON_BWD_DQ_BY_TMA = ("gluon", "tma")
"""The ``gluon_bwd_dq`` paths whose dQ goes through TMA: the Gluon dQ kernel (K / V streamed by TMA) and the TMA
reduce-add of the dK / dV kernel (``"atomic"`` adds by pointer atomics; ``"triton"`` follows the Triton dQ kernel's
rule, :func:`kernels.flash.bwd.dq_tma`). Read by :func:`kernels.flash.bwd.bwd_tma`."""
GLUON_BWD_DQ_LAYOUT = ("gluon", "tma")
"""The dQ paths of ``bwd_impl="gluon"`` (with two consumers) that take a block-sparse layout: the Gluon dQ kernel on
the layout's query-tile table, and the TMA reduce-add from the dK / dV kernel walking its key-tile table."""


def check_gluon_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, win_left: int, win_right: int, layout,
                    dilation: int, documents, config: Optional[FlashConfig] = None, layout_bs: int = 0, *,
                    sink_size: int = 0) -> bool:
    """Raise ``ValueError`` naming ``bwd_impl='gluon'`` when the Gluon backward cannot run this call; returns whether
    it is causal. The mask: with ``config.gluon_bwd_consumers == 2`` (``_gl_bwd_dkdv2_kernel``, dQ ``"triton"``,
    ``"gluon"`` or ``"tma"``) dense, causal, sliding windows (``win_left`` / ``win_right``, either edge) and packed
    ``documents`` (the document table); with ``gluon_bwd_consumers=1`` (``config`` ``None``: ``FlashConfig()``'s)
    dense or causal only (the error names ``gluon_bwd_consumers`` and its allowed values); a block-sparse ``layout`` of
    ``layout_bs``-token blocks only with two consumers and ``gluon_bwd_dq="gluon"`` or ``"tma"``
    (:data:`GLUON_BWD_DQ_LAYOUT`), no ``documents`` and blocks of
    whole 128 x 128 tiles (:func:`~kernels.flash.sparse.tiles_whole`, as the forward's); never ``dilation > 1``.
    Then ``D`` in :data:`GLUON_BWD_HEAD_DIMS`, ``Dv == D``; fp16 / bf16; a Hopper device; Gluon importable. ``q (B,
    Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)``. Never attention sinks (``sink_size > 0``: ``ValueError`` naming it)."""
    _refuse_sinks("bwd_impl='gluon'", sink_size, "use bwd_impl='triton' (or 'auto')")
    consumers = getattr(config, "gluon_bwd_consumers", 1) if config is not None else 1
    bands = consumers == 2
    if layout is not None and dilation == 1:
        dq_path = getattr(config, "gluon_bwd_dq", None) if config is not None else None
        Nq, Nk = q.shape[2], k.shape[2]
        dq_ok = consumers == 2 and dq_path in GLUON_BWD_DQ_LAYOUT
        if not dq_ok or documents is not None or not tiles_whole(layout_bs, Nq, Nk, 128, 128):
            got = (f"gluon_bwd_consumers={consumers!r}, gluon_bwd_dq={dq_path!r}" if not dq_ok else
                   "a block-sparse layout with doc_ids" if documents is not None else
                   f"block_size={layout_bs}, Nk - Nq = {Nk - Nq}")
            raise ValueError(f"bwd_impl='gluon' takes a block-sparse layout only with gluon_bwd_consumers=2 and "
                             f"gluon_bwd_dq='gluon' or 'tma', when every 128 x 128 tile lies inside one layout block "
                             f"(block_size a multiple of 128, Nk - Nq a multiple of 128) and without doc_ids; got "
                             f"{got}; use bwd_impl='triton'")
        layout = None  # the rest as for its band
    if not bands and layout is None and dilation == 1 and _beyond_causal(win_left, win_right, documents):
        what = "doc_ids" if documents is not None else f"window (left={win_left}, right={win_right})"
        raise ValueError(f"bwd_impl='gluon' with gluon_bwd_consumers={consumers!r} supports only dense or causal "
                         f"masks; got {what}; sliding windows and doc_ids need gluon_bwd_consumers=2 (allowed values: "
                         f"{', '.join(map(str, GLUON_BWD_CONSUMERS))}; 2 with gluon_bwd_dq='triton', 'gluon' or "
                         f"'tma'), or use bwd_impl='triton'")
    causal = _check_gluon("bwd_impl='gluon'", GLUON_BWD_HEAD_DIMS, q, k, v, win_left, win_right, layout, dilation,
                          documents, "use bwd_impl='triton'", bands=bands)
    if getattr(config, "gluon_bwd_dq", None) == "tma":
        check_tma_reduce()
    return causal


LSE_TMA_ALIGN = 4
"""fp32 values per 16 bytes. A TMA copy's innermost coordinate must address a 16-byte aligned element of global
memory (Hopper raises ``cudaErrorIllegalInstruction`` otherwise; the driver cannot check it when the descriptor is
made because the coordinate is the kernel's), so the Gluon backward's 1-D lse2 / delta coordinates
``(b * Hq + h) * lse_stride + start_m`` must be multiples of 4: ``lse_stride`` is ``Nq`` rounded up to a multiple of
this (:func:`lse_tma_rows`)."""


def lse_tma_rows(lse2: torch.Tensor, delta: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """The flat fp32 buffers the Gluon backward's lse2 / delta TMA descriptors read and their row stride:
    ``(lse2_flat, delta_flat, lse_stride)`` with ``lse_stride = Nq`` rounded up to a multiple of
    :data:`LSE_TMA_ALIGN`, so that every query tile's coordinate ``(b * Hq + h) * lse_stride + start_m`` (``start_m``
    a multiple of ``BLOCK_M``) is 16-byte aligned. ``lse2``, ``delta``: fp32 ``(B, Hq, Nq)`` contiguous (the
    preprocess's). ``Nq % 4 == 0``: flat views of the inputs (no copy); else new ``(B * Hq * lse_stride)`` buffers,
    each row the input's ``Nq`` values then zeros (finite: the kernel multiplies delta by ``P = 0`` there)."""
    B, Hq, Nq = lse2.shape
    stride = -(-Nq // LSE_TMA_ALIGN) * LSE_TMA_ALIGN
    if stride == Nq:
        return lse2.view(-1), delta.view(-1), Nq
    lse_p, delta_p = (torch.nn.functional.pad(t.view(B * Hq, Nq), (0, stride - Nq)) for t in (lse2, delta))
    return lse_p.view(-1), delta_p.view(-1), stride


GLUON_BWD_LSE_TMA = True
"""How the Gluon backward's consumer reads the query tile's lse2 / delta rows (the kernel's ``LSE_TMA`` constexpr):
``True`` (default): the producer copies them by TMA into the ring with the tile's Q / dO and the consumer reads them
from shared memory just before use (0 B of stack at D 64 / 128, full and causal, with either dQ; triton 3.6,
sm_90a); ``False``: ``gl.load`` from global memory into registers (the first version: 16 / 56 B of stack at D 128,
full / causal, with the atomic dQ). A module-level knob read at every call, for timing the two apart
(``lab/gluon_bwd_sweep.py --lse``); not part of :class:`~kernels.flash.FlashConfig`."""

GLUON_BWD_PINGPONG = False
"""``gluon_bwd_consumers=2`` only (``_gl_bwd_dkdv2_kernel``'s ``PINGPONG`` constexpr): whether the two consumer
warpgroups take turns to issue each query tile's S^T / dP^T wgmmas (FA3's ping-pong; ``False``: they run
independently and drift apart on their own). A module-level knob read at every call, untimed so far
(``lab/gluon_bwd_sweep.py --pingpong``); not part of :class:`~kernels.flash.FlashConfig`."""

GLUON_BWD_OVERLAP = False
"""``gluon_bwd_consumers=2`` without the TMA dQ (``_gl_bwd_dkdv2_kernel``'s ``OVERLAP`` constexpr): FA3's
intra-warpgroup overlap in each consumer (FlashAttention-3, sec. 3.2): a query tile's ``dK += dS^T Q`` stays in
flight while the next tile's ``S^T`` / ``dP^T`` are issued, and ``dV += P^T dO`` while ``dS^T`` is formed
(``False``: each tile waits for its own dV and dK before the next). Outputs are bit for bit the same either way (the
same products, summed in the same order). Off: on an H200 (36th session, ``results/h200/2026-12-07b/16/``) the
backward alone ran 0.92-0.94x the plain schedule at D 128 and 0.88-0.94x at D 64 (N 4k / 16k). A module-level knob
read at every call (``lab/gluon_bwd_sweep.py --overlap``); not part of :class:`~kernels.flash.FlashConfig`."""


def gluon_flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, softmax_scale: float, win_left: int, win_right: int,
                    dlse: Optional[torch.Tensor] = None, grads_like_inputs: bool = True,
                    config: Optional[FlashConfig] = None, documents: Optional[torch.Tensor] = None,
                    layout: Optional[torch.Tensor] = None,
                    layout_bs: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of attention with the Gluon kernel (``bwd_impl="gluon"``; call :func:`check_gluon_bwd` first).
    ``do, out (B, Hq, Nq, D)``, ``q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)`` fp16 / bf16 on a Hopper GPU, ``lse
    (B, Hq, Nq)`` fp32 natural log from the forward, ``dlse`` its gradient or ``None``; ``config`` (default
    ``FlashConfig()``): its ``gluon_bwd_dq`` picks the dQ path (and its tiles / TMA settings apply to the Triton dQ
    kernel). The mask, bottom-right aligned as :func:`~kernels.flash.flash_attn_fwd` takes it: ``win_left`` /
    ``win_right`` (-1: no such edge; causal is ``(-1, 0)``, dense ``(-1, -1)``) and ``documents`` (the int32
    document table ``(B, 3 * Nq + 3 * Nk)`` of :func:`kernels.flash.documents.document_table`, or ``None``); with
    ``config.gluon_bwd_consumers=1`` dense / causal only. ``layout`` (``layout_bs``-token blocks of whole 128 x 128
    tiles; two consumers and ``gluon_bwd_dq="gluon"`` only): the dK / dV and dQ kernels walk the layout's own block
    tables (:func:`gluon_layout_tables`, per key tile and per query tile) as the forward does.

    Steps: the Triton preprocess of bwd.py (``delta = rowsum(dO * O) - dlse``, ``lse2 = lse * log2(e)``, ``+inf`` on
    empty rows); ``_gl_bwd_kernel`` over ``(cdiv(Nk, 128), B * Hkv)`` (GQA: the group's query heads summed in
    registers) writing dK / dV, lse2 / delta read as :data:`GLUON_BWD_LSE_TMA` says; then dQ:

    * ``gluon_bwd_dq="atomic"``: the kernel also adds ``dS K`` into a zeroed fp32 ``(B, Hq, Nq, D)`` buffer by
      atomics (``WRITE_DQ=True``), then ``dq = buffer * softmax_scale`` cast to q's dtype; not bitwise
      deterministic;
    * ``gluon_bwd_dq="tma"``: as ``"atomic"``, each query tile's ``dS K`` stored to shared memory and added into the
      buffer by one TMA bulk reduce-add (``DQ_TMA=True``; :func:`check_tma_reduce`: triton 3.7+); with
      ``gluon_bwd_consumers=2`` in ``_gl_bwd_dkdv2_kernel``, each consumer adding its 64 keys' part (band masks and
      documents and block-sparse layouts too: the dK / dV kernel walks the layout's key-tile table, so no dQ
      kernel and no query-tile table run);
    * ``gluon_bwd_dq="triton"``: the kernel computes dK / dV only (``WRITE_DQ=False``: no ``dS K`` product, no
      atomics, no buffer) and the Triton dQ kernel of bwd.py runs as the Triton backward launches it for this mask
      (:func:`kernels.flash.bwd.triton_dq`); deterministic.
    * ``gluon_bwd_dq="gluon"``: dK / dV as with ``"triton"``, then the Gluon dQ kernel (:func:`gluon_dq`, one program
      per query tile, K / V streamed by TMA); deterministic. With ``config.gluon_bwd_consumers=2`` the dK / dV
      kernel is ``_gl_bwd_dkdv2_kernel`` (two 1-warpgroup consumer partitions of 64 key rows each, dS^T in
      registers; :data:`GLUON_BWD_PINGPONG` says whether they ping-pong).

    Returns ``(dq, dk, dv)`` in the layouts of q / k / v (``grads_like_inputs``) or stored ``(B, N, H, D)``
    (``False``: the custom op). Raises ``ValueError`` for an unknown ``config.gluon_bwd_dq``,
    ``config.gluon_bwd_consumers`` not in (1, 2) or 2 with the atomic dQ (FlashConfig checks both first), a window or
    ``documents`` with ``gluon_bwd_consumers=1``, ``win_left`` / ``win_right`` not integers >= -1, or ``documents``
    not an int32 ``(B, 3 * Nq + 3 * Nk)`` contiguous tensor on q's device."""
    from .bwd import _bwd_preprocess, triton_dq
    from .config import GLUON_BWD_DQ, GLUON_BWD_DQ_ATOMIC
    from .launch import _bnhd_empty

    config = FlashConfig() if config is None else config
    if config.gluon_bwd_dq not in GLUON_BWD_DQ:
        raise ValueError(f"gluon_bwd_dq={config.gluon_bwd_dq!r} is not supported; allowed values: "
                         f"{', '.join(map(repr, GLUON_BWD_DQ))}")
    write_dq = config.gluon_bwd_dq in GLUON_BWD_DQ_ATOMIC
    dq_tma = config.gluon_bwd_dq == "tma"
    if dq_tma:
        check_tma_reduce()
    consumers = getattr(config, "gluon_bwd_consumers", 1)
    if consumers not in GLUON_BWD_CONSUMERS or (consumers != 1 and config.gluon_bwd_dq == "atomic"):
        raise ValueError(f"gluon_bwd_consumers={consumers!r} is not supported with gluon_bwd_dq="
                         f"{config.gluon_bwd_dq!r}; allowed values: {GLUON_BWD_CONSUMERS} (2 only with "
                         f"gluon_bwd_dq='triton', 'gluon' or 'tma')")
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    for name, w in (("win_left", win_left), ("win_right", win_right)):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"{name}={w!r} is not supported; allowed values: an integer >= 0, or -1 (no such edge)")
    doc, wl, wr, band_flags = _band_args(win_left, win_right, documents, B, Nq, Nk, q.device)  # (checks the table)
    bands = _beyond_causal(win_left, win_right, documents)
    if bands and consumers != 2:
        raise ValueError(f"bwd_impl='gluon' with gluon_bwd_consumers={consumers!r} supports only dense or causal "
                         f"masks; sliding windows and documents need gluon_bwd_consumers=2 (allowed values: "
                         f"{', '.join(map(str, GLUON_BWD_CONSUMERS))})")
    GK, TD, gl = _gluon_modules()
    block_m, block_n, stages, warps = gluon_bwd_tiles(D, consumers)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    dl = dlse.contiguous().float() if dlse is not None else delta
    _gl_launch(_bwd_preprocess, (triton_cdiv(Nq, 64), B * Hq),
               (out, do, dl, lse, delta, lse2, Hq, Nq, *out.stride(), *do.stride()),
               HAS_DLSE=dlse is not None, HEAD_D=D, BLOCK_D=D, BLOCK_M=64)
    if grads_like_inputs:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:
        dq, dk, dv = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device), \
            _bnhd_empty(B, Hkv, Nk, D, v.dtype, v.device)
    if dk.stride(3) != 1 or dv.stride(3) != 1:  # (empty_like of a tensor with a non-unit last stride)
        dk, dv = _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device), _bnhd_empty(B, Hkv, Nk, D, v.dtype, v.device)
    dqa = torch.zeros((B, Hq, Nq, D), dtype=torch.float32, device=q.device) if write_dq else delta
    dqa_arg = _td(TD, dqa, list(dqa.shape), list(dqa.stride()), [1, 1, block_m, D], dq_tma_layout()) if dq_tma else dqa
    # 1-D descriptors over flat lse2 / delta buffers whose (batch, head) rows start every lse_stride values, a box of
    # block_m values (read with LSE_TMA only; its coordinates are int32): lse_tma_rows says why lse_stride is Nq
    # rounded up to a multiple of 4
    lse_tma = bool(GLUON_BWD_LSE_TMA)
    if lse_tma:
        lse_buf, delta_buf, lse_stride = lse_tma_rows(lse2, delta)
        lse_tma = lse_buf.numel() < 2 ** 31
    if not lse_tma:  # (the descriptors are still encoded at launch: keep their extent within TMA's 2^32 limit)
        n = min(lse2.numel(), 2 ** 31 - 1)
        lse_buf, delta_buf, lse_stride = lse2.view(-1)[:n], delta.view(-1)[:n], Nq
    lse_desc = _td(TD, lse_buf, [lse_buf.numel()], [1], [block_m], lse_layout())
    delta_desc = _td(TD, delta_buf, [delta_buf.numel()], [1], [block_m], lse_layout())
    q_, k_, v_, do_ = _tma_view(q), _tma_view(k), _tma_view(v), _tma_view(do)
    descs = (_descriptor(q_, block_m, TD, gdt), _descriptor(k_, block_n, TD, gdt), _descriptor(v_, block_n, TD, gdt),
             _descriptor(do_, block_m, TD, gdt), lse_desc, delta_desc, dqa_arg, lse2, delta, dk, dv)
    strides = (dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2))
    sizes = (Hq, Hkv, Nq, Nk, Nk - Nq, Hq // Hkv, lse_stride, softmax_scale * _LOG2E, softmax_scale)
    tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages, LSE_TMA=lse_tma)
    grid = (triton_cdiv(Nk, block_n), B * Hkv)
    if layout is not None and (consumers != 2 or config.gluon_bwd_dq not in GLUON_BWD_DQ_LAYOUT):
        raise ValueError("bwd_impl='gluon' takes a block-sparse layout only with gluon_bwd_consumers=2 and "
                         f"gluon_bwd_dq='gluon' or 'tma'; got {consumers!r}, {config.gluon_bwd_dq!r}")
    if consumers == 1:  # dense / causal (checked above)
        _gl_launch(GK._gl_bwd_kernel, grid, (*descs, *strides, *sizes), num_warps=warps, CAUSAL=win_right == 0,
                   WRITE_DQ=write_dq, DQ_TMA=dq_tma, **tiles)
    else:  # dK / dV (and with dq_tma dQ by TMA reduce-add), any band mask, or a block-sparse layout's key-tile table
        tbl = (doc, doc, doc, 0)  # (never read without SPARSE)
        if layout is not None:
            idx, cnt, nfull = gluon_layout_tables(layout, layout_bs, Nq, Nk, win_left, win_right, block_m, block_n,
                                                  keys=True)
            tbl = (idx, cnt, nfull, idx.stride(0))
        _gl_launch(GK._gl_bwd_dkdv2_kernel, grid, (*descs, doc, *strides, *sizes, wl, wr, *tbl), num_warps=warps,
                   **band_flags, PINGPONG=bool(GLUON_BWD_PINGPONG), SPARSE=layout is not None, DQ_TMA=dq_tma,
                   OVERLAP=bool(GLUON_BWD_OVERLAP) and not dq_tma, **tiles)
    if write_dq:
        dq.copy_(dqa.mul_(softmax_scale))
    elif config.gluon_bwd_dq == "gluon":
        gluon_dq(do_, q_, k_, v_, lse2, delta, dq, softmax_scale, win_left, win_right, documents, layout, layout_bs)
    else:
        triton_dq(do, q, k, v, lse2, delta, dq, softmax_scale, win_left, win_right, config, documents)
    return dq, dk, dv


def gluon_dq(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse2: torch.Tensor,
             delta: torch.Tensor, dq: torch.Tensor, softmax_scale: float, win_left: int, win_right: int,
             documents: Optional[torch.Tensor] = None, layout: Optional[torch.Tensor] = None,
             layout_bs: int = 0) -> None:
    """dQ of band-masked (bottom-right) attention by the Gluon dQ kernel ``_gl_bwd_dq_kernel``
    (``gluon_bwd_dq="gluon"``: FA3's forward layout, a TMA producer warp streaming K / V through a ring and two
    1-warpgroup consumers of 64 query rows each, dQ in fp32 registers, no atomics: deterministic).
    ``do, q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)`` fp16 / bf16 on a Hopper GPU (``D`` in
    :data:`GLUON_BWD_HEAD_DIMS`; :func:`check_gluon_bwd` first), ``lse2`` / ``delta`` fp32 ``(B, Hq, Nq)``
    contiguous from ``_bwd_preprocess`` (``lse2 = lse * log2(e)``, ``+inf`` on rows that see no key); writes ``dq
    (B, Hq, Nq, D)`` (any strides) in place. The mask as :func:`gluon_flash_fwd` takes it (``win_left`` /
    ``win_right``, -1: unbounded; ``documents`` the document table or ``None``; ``layout``: a block-sparse layout of
    whole tiles, run from its query-tile table at this kernel's tiles, :func:`gluon_layout_tables`). Grid
    ``(cdiv(Nq, BLOCK_M), B * Hq)`` at :func:`gluon_bwd_dq_tiles`. Raises ``ValueError`` for a malformed
    ``documents`` table."""
    from .launch import _bnhd_empty

    GK, TD, gl = _gluon_modules()
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    doc, wl, wr, flags = _band_args(win_left, win_right, documents, B, Nq, Nk, q.device)
    block_m, block_n, stages, warps = gluon_bwd_dq_tiles(D)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q, k, v, do = _tma_view(q), _tma_view(k), _tma_view(v), _tma_view(do)
    out = dq if dq.stride(3) == 1 else _bnhd_empty(B, Hq, Nq, D, dq.dtype, dq.device)
    tbl = (doc, doc, doc, 0)  # (never read without SPARSE)
    if layout is not None:
        idx, cnt, nfull = gluon_layout_tables(layout, layout_bs, Nq, Nk, win_left, win_right, block_m, block_n)
        tbl = (idx, cnt, nfull, idx.stride(0))
    _gl_launch(GK._gl_bwd_dq_kernel, (triton_cdiv(Nq, block_m), B * Hq),
               (_descriptor(q, block_m, TD, gdt), _descriptor(k, block_n, TD, gdt), _descriptor(v, block_n, TD, gdt),
                _descriptor(do, block_m, TD, gdt), lse2, delta, out, out.stride(0), out.stride(1), out.stride(2), Hq,
                Nq, Nk, Nk - Nq, Hq // Hkv, softmax_scale * _LOG2E, softmax_scale, wl, wr, doc, *tbl),
               num_warps=warps, **flags, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, STAGES=stages,
               SPARSE=layout is not None)
    if out is not dq:
        dq.copy_(out)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
