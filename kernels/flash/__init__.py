"""Fused exact softmax attention in Triton: one kernel family for full, causal, sliding-window (optionally dilated)
and block-sparse masks, with native GQA / MQA. FlashAttention-2 algorithm (Dao 2023, Alg. 1 forward, Alg. 2
backward) on top of FlashAttention (Dao et al. 2022).

Shapes: ``q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)`` with ``Hq % Hkv == 0`` (query head ``h`` reads K/V head
``h // (Hq // Hkv)``); any strides (each tensor is read through its own strides, no copies). Output
``(B, Hq, Nq, D)`` in ``q.dtype``, stored as ``(B, Nq, Hq, D)``; ``lse`` fp32 ``(B, Hq, Nq)``, natural log, ``-inf``
on rows that see no key (those rows output 0 and get zero gradients).

Mask (bottom-right aligned: query row ``i`` sits at ``i' = i + Nk - Nq``), the conjunction of
  * ``window_size = (left, right)``: ``i' - left <= j <= i' + right`` (``None`` = unbounded side); causal is
    ``right = 0`` (``causal=True`` clips ``right`` to ``min(right, 0)``);
  * ``sink_size``: attention sinks (StreamingLLM): keys ``j < sink_size`` pass the window's left edge, the left term
    becoming ``j >= i' - left or j < sink_size`` (default 0: none; a compile-time ``SINK`` of its own);
  * ``dilation``: ``(i' - j) % dilation == 0`` (default 1: no condition);
  * block-sparse: ``layout[i' // block_size, j // block_size]`` and ``i' >= 0``, with the visited key
    blocks of every query tile given by a block table (``kv_idx``, ``kv_cnt``, ``kv_nfull`` per query tile,
    each row listing its ``kv_nfull`` full tiles first, and the transposed table per key tile for the dK/dV
    pass), so the kernels run two branch-free loops (full tiles unmasked, then partial tiles masked).
Causal / window tiles are enumerated analytically in-kernel (same rule as ``MaskInfo.block_table``). Tiles
are split into *full* tiles (no element mask, no bounds checks) and *partial* tiles (element rule
applied); fully-masked tiles are never visited, so a causal window of ``w`` costs ``O(N * w)``. With
``dilation > 1`` every visited tile is partial (a compile of its own: ``DILATED`` constexpr).

Loads: on Hopper (compute capability >= 9) the operands each loop streams (forward and dQ: K / V tiles; dK/dV:
Q / dO tiles) are read with TMA descriptors over the whole ``(B, H, N, D)`` tensors (rows past the sequence end
arrive as zeros) for large dense / causal / window problems; otherwise, and for block-sparse masks, head dims
that are not powers of two or strides TMA cannot express, by pointer loads (see :func:`launch.tma_ok`; same
results).

Forward: online softmax in base 2 (``log2(e)`` folded into the scale), output normalised once, lse saved.
Backward: ``delta = rowsum(dO * O)`` (minus ``dlse`` when the lse is differentiated), then one kernel per key
tile for dK/dV that loops over the query heads of its GQA group (dK/dV summed in registers, K/V never
repeated; when that grid is small the group is split over ``n_split`` programs whose fp32 partial dK/dV are
summed after) and one kernel per query tile for dQ (no atomics, deterministic). Optional FA2 variant
(``dq_mode="atomic"``): dQ accumulated in the dK/dV kernel with fp32 atomics (5 matmuls per tile pair instead of
7; not bitwise deterministic).

Settings are passed explicitly: :class:`FlashConfig` (``config=``, or FlashAttention-style ``dq_mode=`` /
``dkdv_split=`` / ``deterministic=`` arguments), or :func:`flash_settings` for a block of calls.

Modules: ``config`` (settings), ``fwd`` / ``bwd`` (kernels and their launches), ``launch`` (tile tables, config
choice, launch plans, TMA policy), ``sparse`` (block tables), ``autograd`` (autograd.Function and custom ops),
``api`` (:func:`flash_attn`), ``gluon`` (the Gluon forward and backward for Hopper, host side, and the
``fwd_impl="auto"`` choice;
its kernel module ``_gluon_kernels`` is imported on first use only).

Public API: :func:`flash_attn`, :func:`resolve_fwd_impl`, :func:`resolve_bwd_impl`, :func:`resolve_fwd_tma`,
:func:`resolve_bwd_tma`, :class:`FlashConfig`, :class:`TileConfig`, :func:`flash_settings`,
:func:`current_flash_config`, :func:`flash_attn_fwd`, :func:`flash_attn_bwd`, :func:`sparse_tiles`,
:func:`build_sparse_tables`, :func:`choose_dkdv_split`, :func:`resolve_dkdv_split`, :func:`pick_config`,
:func:`clear_plans`, :func:`clear_caches`, :func:`launch_plans`, :func:`autotune_results`, ``KERNELS``.
"""

from .api import flash_attn, resolve_bwd_impl, resolve_bwd_tma, resolve_fwd_impl, resolve_fwd_tma
from .bwd import choose_dkdv_split, flash_attn_bwd, resolve_dkdv_split
from .common import MAX_HEAD_DIM
from .config import BWD_IMPLS, DQ_MODES, FWD_IMPLS, GLUON_BWD_CONSUMERS, GLUON_BWD_DQ, FlashConfig, TileConfig, \
    current_flash_config, flash_settings
from .fwd import flash_attn_fwd
from .launch import KERNELS, autotune_results, clear_caches, clear_plans, launch_plans, pick_config, tma_ok, \
    visited_pairs
from .sparse import build_sparse_tables, sparse_mode, sparse_tiles

__all__ = ["flash_attn", "resolve_fwd_impl", "resolve_bwd_impl", "resolve_fwd_tma", "resolve_bwd_tma", "FWD_IMPLS",
           "BWD_IMPLS", "FlashConfig", "TileConfig",
           "flash_settings", "current_flash_config", "flash_attn_fwd", "flash_attn_bwd", "sparse_tiles",
           "build_sparse_tables", "sparse_mode", "choose_dkdv_split", "resolve_dkdv_split", "pick_config",
           "clear_plans", "clear_caches", "launch_plans", "autotune_results", "tma_ok", "visited_pairs", "KERNELS",
           "MAX_HEAD_DIM", "DQ_MODES", "GLUON_BWD_DQ", "GLUON_BWD_CONSUMERS"]
