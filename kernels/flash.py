"""Fused exact softmax attention in Triton: one kernel family for full, causal, sliding-window and
block-sparse masks, with native GQA / MQA. FlashAttention-2 algorithm (Dao 2023, Alg. 1 forward, Alg. 2
backward) on top of FlashAttention (Dao et al. 2022).

Shapes: ``q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)`` with ``Hq % Hkv == 0`` (query head ``h`` reads K/V head
``h // (Hq // Hkv)``); any strides (each tensor is read through its own strides, no copies). Output
``(B, Hq, Nq, D)`` in ``q.dtype``, stored as ``(B, Nq, Hq, D)``; ``lse`` fp32 ``(B, Hq, Nq)``, natural log, ``-inf`` on rows that see no key
(those rows output 0 and get zero gradients).

Mask (bottom-right aligned: query row ``i`` sits at ``i' = i + Nk - Nq``), the conjunction of
  * ``window_size = (left, right)``: ``i' - left <= j <= i' + right`` (``None`` = unbounded side); causal is
    ``right = 0`` (``causal=True`` clips ``right`` to ``min(right, 0)``);
  * block-sparse: ``layout[i' // block_size, j // block_size]`` and ``i' >= 0``, with the visited key
    blocks of every query tile given by a block table (``kv_idx``, ``kv_cnt``, ``kv_nfull`` per query tile,
    each row listing its ``kv_nfull`` full tiles first, and the transposed table per key tile for the dK/dV
    pass), so the kernels run two branch-free loops (full tiles unmasked, then partial tiles masked).
Causal / window tiles are enumerated analytically in-kernel (same rule as ``MaskInfo.block_table``). Tiles
are split into *full* tiles (no element mask, no bounds checks) and *partial* tiles (element rule
applied); fully-masked tiles are never visited, so a causal window of ``w`` costs ``O(N * w)``.

Loads: on Hopper (compute capability >= 9) the operands each loop streams (forward and dQ: K / V tiles; dK/dV:
Q / dO tiles) are read with TMA descriptors over the whole ``(B, H, N, D)`` tensors (rows past the sequence end
arrive as zeros) for large dense / causal / window problems; otherwise, and for block-sparse masks, head dims
that are not powers of two or strides TMA cannot express, by pointer loads (see ``_tma_ok``; same results).

Forward: online softmax in base 2 (``log2(e)`` folded into the scale), output normalised once, lse saved.
Backward: ``delta = rowsum(dO * O)`` (minus ``dlse`` when the lse is differentiated), then one kernel per key
tile for dK/dV that loops over the query heads of its GQA group (dK/dV summed in registers, K/V never
repeated; when that grid is small the group is split over ``n_split`` programs whose fp32 partial dK/dV are
summed after) and one kernel per query tile for dQ (no atomics, deterministic). Optional FA2 variant
(``dq_mode="atomic"`` / env ``ATTN_ZOO_FLASH_DQ=atomic``): dQ accumulated in the dK/dV kernel with fp32
atomics (5 matmuls per tile pair instead of 7; not bitwise deterministic).

Public API: :func:`flash_attn` (autograd-aware: an ``autograd.Function`` in eager mode, ``torch.library`` custom
ops under ``torch.compile`` so it traces through them), :func:`flash_attn_fwd`, :func:`flash_attn_bwd`, :func:`sparse_tiles`, :func:`build_sparse_tables`.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older triton: pointer loads only
    TensorDescriptor = None

from ._host import CompiledLaunch, cdiv, next_pow2

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


# ============================================================================================ configs
def _cfg(bm, bn, w, s):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)


if INTERPRET:
    # the interpreter runs every program in numpy: one small config, BLOCK_M != BLOCK_N to exercise both paths
    _FWD_CONFIGS = [_cfg(32, 16, 4, 1)]
    _DQ_CONFIGS = [_cfg(32, 16, 4, 1)]
    _DKDV_CONFIGS = [_cfg(16, 32, 4, 1)]
else:
    _FWD_CONFIGS = [
        _cfg(128, 128, 8, 2), _cfg(128, 64, 8, 3), _cfg(128, 64, 4, 3), _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 2),
    ]
    _DQ_CONFIGS = [_cfg(128, 64, 8, 2), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 2)]
    _DKDV_CONFIGS = [_cfg(64, 128, 8, 2), _cfg(32, 128, 4, 3), _cfg(64, 64, 4, 3), _cfg(32, 64, 4, 2)]

_SMEM_BUDGET = 220 * 1024


def sparse_tiles(head_dim: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Fixed tiles of the block-sparse mode: ``((BLOCK_M, BLOCK_N) of forward and dQ, (BLOCK_M, BLOCK_N) of dK/dV)``.

    The caller builds the block tables at these tiles (a table depends on the tile, so the sparse mode autotunes
    warps / stages only).
    """
    if INTERPRET:
        f, b = (32, 16), (16, 32)
    elif head_dim <= 128:  # H200 BigBird sweep (eval/probe_flash.py --sparse-sweep): 64x64 everywhere beat
        f, b = (64, 64), (64, 64)  # 128x64 / 64x128 by 23-26% fwd+bwd (short table rows: 2+ programs per SM)
    else:
        f, b = (64, 32), (32, 64)
    if "fwd" in _SPARSE_OVERRIDE:
        f = (_SPARSE_OVERRIDE["fwd"]["BLOCK_M"], _SPARSE_OVERRIDE["fwd"]["BLOCK_N"])
    if "dkdv" in _SPARSE_OVERRIDE:
        b = (_SPARSE_OVERRIDE["dkdv"]["BLOCK_M"], _SPARSE_OVERRIDE["dkdv"]["BLOCK_N"])
    return f, b


_SPARSE_OVERRIDE = {}


def set_sparse_override(kind: str, cfg: Optional[dict] = None) -> None:
    """Force ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` for kernel ``kind`` of the block-sparse mode
    (``None`` clears it). ``fwd`` and ``dq`` share one block table, so their tiles must agree; tables built
    with :func:`build_sparse_tables` after the call use the forced tiles. For tuning scripts (no checks of
    shared memory / registers)."""
    if kind not in ("fwd", "dq", "dkdv"):
        raise ValueError(f"kind={kind!r} is not supported; allowed values: fwd, dq, dkdv")
    clear_plans()
    if cfg is None:  # fwd and dq share one table: clearing either clears both
        for kk in (("fwd", "dq") if kind in ("fwd", "dq") else (kind,)):
            _SPARSE_OVERRIDE.pop(kk, None)
        return
    for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"):
        val = cfg.get(key)
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"sparse override {kind}: {key}={val!r} must be a positive integer "
                             "(cfg needs BLOCK_M, BLOCK_N, num_warps, num_stages)")
    for key in ("BLOCK_M", "BLOCK_N"):
        if cfg[key] < 16 or cfg[key] & (cfg[key] - 1):
            raise ValueError(f"sparse override {kind}: {key}={cfg[key]} must be a power of two >= 16")
    other = {"fwd": "dq", "dq": "fwd"}.get(kind)
    if other in _SPARSE_OVERRIDE and (_SPARSE_OVERRIDE[other]["BLOCK_M"], _SPARSE_OVERRIDE[other]["BLOCK_N"]) != \
            (cfg["BLOCK_M"], cfg["BLOCK_N"]):
        raise ValueError(f"sparse {kind} tiles {cfg['BLOCK_M']}x{cfg['BLOCK_N']} must equal the {other} tiles")
    _SPARSE_OVERRIDE[kind] = dict(cfg)
    if kind == "dq" and "fwd" not in _SPARSE_OVERRIDE:  # the table is keyed by the forward's tiles
        _SPARSE_OVERRIDE["fwd"] = dict(cfg)


def _smem_bytes(cfg, block_d, elt, kind):
    bm, bn, s = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], max(cfg.num_stages, 1)
    if kind == "fwd":  # q resident, k and v pipelined
        return elt * block_d * (bm + 2 * bn * s)
    if kind == "dq":  # q, do resident; k, v pipelined
        return elt * block_d * (2 * bm + 2 * bn * s)
    return elt * block_d * (2 * bn + 2 * bm * s)  # dkdv: k, v resident; q, do pipelined


def _make_prune(kind: str):
    def prune(configs, named_args, **kwargs):
        args = dict(named_args)
        args.update(kwargs)
        block_d = int(args.get("BLOCK_D", 64))
        sparse = bool(args.get("SPARSE", False))
        elt = 4 if args.get("DOT_PREC", "tf32") == "ieee" else 2
        out = []
        for c in configs:
            if sparse:
                f, b = sparse_tiles(block_d)
                want = b if kind == "dkdv" else f
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) != want:
                    continue
            if not INTERPRET and _smem_bytes(c, block_d, elt, kind) > _SMEM_BUDGET:
                continue
            out.append(c)
        if not out:  # never empty: smallest tile, fewest stages
            if sparse:
                f, b = sparse_tiles(block_d)
                bm, bn = b if kind == "dkdv" else f
                out = [_cfg(bm, bn, 4, 1)]
            else:
                out = [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages))]
                out = [_cfg(out[0].kwargs["BLOCK_M"], out[0].kwargs["BLOCK_N"], 4, 1)]
        return out

    return prune


def _sparse_configs(kind):
    if INTERPRET:
        return _DKDV_CONFIGS if kind == "dkdv" else _FWD_CONFIGS
    res = []
    for d in (64, 256):
        f, b = sparse_tiles(d)
        bm, bn = b if kind == "dkdv" else f
        # warps / stages in preference order (H200 sparse sweep: 4 warps, fwd 3 stages, dq / dkdv 2)
        ws = {"fwd": ((4, 3), (4, 2), (8, 3), (8, 2)), "dq": ((4, 2), (4, 3), (8, 3), (8, 2))}.get(
            kind, ((4, 2), (4, 3), (8, 3), (8, 2)))
        res += [_cfg(bm, bn, w, st) for w, st in ws]
    return res


_KEY = ["N_BUCKET", "BLOCK_D", "HAS_LEFT", "HAS_RIGHT", "SPARSE", "DOT_PREC"]
_KEY_DKDV = _KEY + ["ATOMIC_DQ"]


# ============================================================================================ jit helpers
@triton.jit
def _allowed(i2, j2, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr):
    """Element rule of MaskInfo.allowed on broadcastable row / column index tensors. ``SPARSE``: 0 no layout; 1
    the layout byte of every element (gathered); 2 the tile lies inside one layout block, whose bit the block
    table's visit already implies (the launcher checks the alignment): no gather."""
    ia = i2 + offset
    ok = (j2 < Nk) & (i2 < Nq)
    if HAS_RIGHT:
        ok = ok & (j2 <= ia + win_right)
    if HAS_LEFT:
        ok = ok & (j2 >= ia - win_left)
    if SPARSE == 2:
        ok = ok & (ia >= 0)
    elif SPARSE:
        qb = tl.minimum(tl.maximum(ia, 0) // lay_bs, lay_nb - 1)
        kb = tl.minimum(j2 // lay_bs, lay_nb - 1)
        ok = ok & (ia >= 0)
        lay = tl.load(LAYOUT + qb * lay_nb + kb, mask=ok, other=0)
        ok = ok & (lay != 0)
    return ok


@triton.jit
def _table_row(IDX, CNT, NFULL, stride_tbl):
    """This program's block-table row: visited tile count, full tile count (listed first) and a pointer to the
    tile indices (column 0 of the row holds the program's own tile)."""
    row = tl.program_id(0)
    return tl.load(CNT + row), tl.load(NFULL + row), IDX + row * stride_tbl + 1


@triton.jit
def _kv_range(start_m, Nq, Nk, offset, win_left, win_right,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key tiles [lo, hi) visited by query tile ``start_m`` and the full sub-range [flo, fhi)."""
    r1 = tl.minimum(start_m + BLOCK_M, Nq) - 1
    a0 = start_m + offset
    a1 = r1 + offset
    lo_key = a0 * 0
    hi_key = lo_key + Nk - 1
    flo = lo_key
    fhi = lo_key + Nk // BLOCK_N
    if HAS_LEFT:
        lo_key = tl.maximum(a0 - win_left, 0)
        flo = (tl.maximum(a1 - win_left, 0) + BLOCK_N - 1) // BLOCK_N
    if HAS_RIGHT:
        hi_key = tl.minimum(a1 + win_right, Nk - 1)
        fhi = tl.minimum(fhi, tl.maximum(a0 + win_right + 1, 0) // BLOCK_N)
    lo = lo_key // BLOCK_N
    hi = tl.where(hi_key >= lo_key, tl.maximum(hi_key, 0) // BLOCK_N + 1, lo)
    fhi = tl.where(r1 - start_m + 1 == BLOCK_M, fhi, 0)
    flo = tl.minimum(tl.maximum(flo, lo), hi)
    fhi = tl.minimum(tl.maximum(fhi, flo), hi)
    return lo, hi, flo, fhi


@triton.jit
def _q_range(start_n, Nq, Nk, offset, win_left, win_right,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query tiles [lo, hi) that see key tile ``start_n`` and the full sub-range [flo, fhi)."""
    c1 = tl.minimum(start_n + BLOCK_N, Nk) - 1
    lo_row = start_n * 0
    hi_row = lo_row + Nq - 1
    flo = lo_row
    fhi = lo_row + Nq // BLOCK_M
    if HAS_RIGHT:  # j <= i' + right  ->  i >= j - right - offset
        lo_row = tl.maximum(start_n - win_right - offset, 0)
        flo = (tl.maximum(c1 - win_right - offset, 0) + BLOCK_M - 1) // BLOCK_M
    if HAS_LEFT:  # j >= i' - left  ->  i <= j + left - offset
        hi_row = tl.minimum(c1 + win_left - offset, Nq - 1)
        fhi = tl.minimum(fhi, tl.maximum(start_n + win_left - offset + 1, 0) // BLOCK_M)
    lo = lo_row // BLOCK_M
    hi = tl.where(hi_row >= lo_row, tl.maximum(hi_row, 0) // BLOCK_M + 1, lo)
    fhi = tl.where(c1 - start_n + 1 == BLOCK_N, fhi, 0)
    flo = tl.minimum(tl.maximum(flo, lo), hi)
    fhi = tl.minimum(tl.maximum(fhi, flo), hi)
    return lo, hi, flo, fhi


# ============================================================================================ forward
@triton.jit
def _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd, start_n,
              offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
              Kd, Vd, b, hk, TMA: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ptrs = Kb + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    v_ptrs = Vb + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd  # (BLOCK_N, BLOCK_D)
    if TMA:  # tensor-memory-accelerator copies (Hopper); rows past Nk arrive as zeros
        k = tl.trans(Kd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        v = Vd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    elif MASKED:
        k = tl.load(k_ptrs, mask=(offs_n[None, :] < Nk) & (offs_d[:, None] < HEAD_D), other=0.0)
        v = tl.load(v_ptrs, mask=(offs_n[:, None] < Nk) & (offs_d[None, :] < HEAD_D), other=0.0)
    elif BLOCK_D != HEAD_D:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_D, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_D, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    qk = tl.dot(q, k, input_precision=DOT_PREC)
    if MASKED:
        ok = _allowed(offs_m[:, None], offs_n[None, :], Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                      HAS_LEFT, HAS_RIGHT, SPARSE)
        qk = tl.where(ok, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
    return acc, l_i, m_new


@triton.jit
def _fwd_kernel(Q, K, V, Out, Lse,
                stride_qb, stride_qh, stride_qn, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_on, stride_od,
                Hq, Nq, Nk, offset, group, qk_scale, win_left, win_right,
                KV_IDX, KV_CNT, KV_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, N_BUCKET, Kd, Vd,
                HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                SPARSE: tl.constexpr, DOT_PREC: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    n_mblocks = tl.cdiv(Nq, BLOCK_M)
    if SPARSE:  # table rows are in schedule order (heaviest first); column 0 holds the query tile
        mblk = tl.load(KV_IDX + tl.program_id(0) * stride_tbl)
    else:
        mblk = n_mblocks - 1 - tl.program_id(0)  # heaviest (causal) tiles first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hk = h // group
    start_m = mblk * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    Qb = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    Kb = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    Vb = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    q = tl.load(Qb + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D), other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        for t in range(0, nfull):
            nblk = tl.load(tbl + t)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                      win_right, LAYOUT, lay_nb, lay_bs, False, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA)
        for t in range(nfull, cnt):
            nblk = tl.load(tbl + t)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                      win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA)
    else:
        lo, hi, flo, fhi = _kv_range(start_m, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                     HAS_LEFT, HAS_RIGHT)
        if HAS_LEFT:  # partial tiles left of the full band (none without a left window edge)
            for nblk in range(lo, flo):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                          win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                          BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA)
        for nblk in range(flo, fhi):  # full tiles: no element mask, no bounds checks
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                                      LAYOUT, lay_nb, lay_bs, False, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA)
        for nblk in range(fhi, hi):  # partial tiles right of the band (causal diagonal, ragged tail)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                                      LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    Ob = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(Ob + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D))
    tl.store(Lse + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)


# ============================================================================================ backward
@triton.jit
def _bwd_preprocess(O, DO, DLSE, Lse, Delta, Lse2, Hq, Nq,
                    stride_ob, stride_oh, stride_on, stride_od,
                    stride_db, stride_dh, stride_dn, stride_dd,
                    HAS_DLSE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O) - dlse; lse2 = lse * log2(e) with -inf (empty rows) mapped to +inf (p = 0)."""
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    msk = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D)
    o = tl.load(O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_on
                + offs_d[None, :] * stride_od, mask=msk, other=0.0).to(tl.float32)
    do = tl.load(DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh + offs_m[:, None] * stride_dn
                 + offs_d[None, :] * stride_dd, mask=msk, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    row = bh.to(tl.int64) * Nq + offs_m
    if HAS_DLSE:
        delta = delta - tl.load(DLSE + row, mask=offs_m < Nq, other=0.0)
    lse = tl.load(Lse + row, mask=offs_m < Nq, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(Delta + row, delta, mask=offs_m < Nq)
    tl.store(Lse2 + row, lse2, mask=offs_m < Nq)


@triton.jit
def _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2b, Deltab, DQAb, stride_qn, stride_qd, stride_dn, stride_dd, start_m,
               offs_n, offs_d, qk_scale, sm_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
               ATOMIC_DQ: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
               DOT_PREC: tl.constexpr, Qd, DOd, b, h, TMA: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_ptrs = Qb + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    do_ptrs = DOb + offs_m[:, None] * stride_dn + offs_d[None, :] * stride_dd
    if TMA:  # rows past Nq arrive as zeros
        q = Qd.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        do = DOd.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    elif MASKED:
        mq = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D)
        q = tl.load(q_ptrs, mask=mq, other=0.0)
        do = tl.load(do_ptrs, mask=mq, other=0.0)
    elif BLOCK_D != HEAD_D:
        q = tl.load(q_ptrs, mask=offs_d[None, :] < HEAD_D, other=0.0)
        do = tl.load(do_ptrs, mask=offs_d[None, :] < HEAD_D, other=0.0)
    else:
        q = tl.load(q_ptrs)
        do = tl.load(do_ptrs)
    if MASKED:
        lse2 = tl.load(Lse2b + offs_m, mask=offs_m < Nq, other=float("inf"))
        delta = tl.load(Deltab + offs_m, mask=offs_m < Nq, other=0.0)
    else:
        lse2 = tl.load(Lse2b + offs_m)
        delta = tl.load(Deltab + offs_m)
    qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # (BLOCK_N, BLOCK_M)
    pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
    if MASKED:
        ok = _allowed(offs_m[None, :], offs_n[:, None], Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                      HAS_LEFT, HAS_RIGHT, SPARSE)
        pT = tl.where(ok, pT, 0.0)
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PREC)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
    dk = tl.dot(dsT, q, dk, input_precision=DOT_PREC)
    if ATOMIC_DQ:  # FA2's fused dQ: fp32 atomics into the (B, Hq, Nq, D) accumulator, 5 matmuls per tile pair
        dq = tl.dot(tl.trans(dsT), k, input_precision=DOT_PREC) * sm_scale  # (BLOCK_M, BLOCK_D)
        dq_ptrs = DQAb + offs_m[:, None] * HEAD_D + offs_d[None, :]
        if MASKED:
            tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D), sem="relaxed")
        elif BLOCK_D != HEAD_D:
            tl.atomic_add(dq_ptrs, dq, mask=offs_d[None, :] < HEAD_D, sem="relaxed")
        else:
            tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, Lse2, Delta, DK, DV, DQA,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_db, stride_dh, stride_dn, stride_dd,
                     stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                     stride_dvs, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                     Hq, Hkv, Nq, Nk, offset, group, n_split, qk_scale, sm_scale, win_left, win_right,
                     Q_IDX, Q_CNT, Q_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, N_BUCKET, Qd, DOd,
                     HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                     SPARSE: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PREC: tl.constexpr, TMA: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (key tile, batch, K/V head, split): the ``group // n_split`` query heads of split ``s``.

    With ``n_split > 1`` DK / DV point at fp32 partial buffers ``(n_split, B, Hkv, Nk, D)`` (split stride
    ``stride_dks``), summed on the host; with ``n_split == 1`` they are the outputs (split stride 0).
    """
    if SPARSE:  # table rows are in schedule order (heaviest first); column 0 holds the key tile
        nblk = tl.load(Q_IDX + tl.program_id(0) * stride_tbl)
    else:
        nblk = tl.program_id(0)
    pid = tl.program_id(1)
    s = pid % n_split
    bh = pid // n_split
    b = bh // Hkv
    hk = bh % Hkv
    heads = group // n_split
    start_n = nblk * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mk = (offs_n[:, None] < Nk) & (offs_d[None, :] < HEAD_D)
    k = tl.load(K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=mk, other=0.0)
    v = tl.load(V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=mk, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(Q_IDX, Q_CNT, Q_NFULL, stride_tbl)
    else:
        lo, hi, flo, fhi = _q_range(start_n, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                    HAS_LEFT, HAS_RIGHT)
    for g in range(0, heads):  # query heads sharing this K/V head: dK/dV summed in registers
        h = hk * group + s * heads + g
        Qb = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        DOb = DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
        row0 = (b * Hq + h).to(tl.int64) * Nq
        DQAb = DQA + row0 * HEAD_D
        if SPARSE:
            for t in range(0, nfull):
                mblk = tl.load(tbl + t)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, False, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA)
            for t in range(nfull, cnt):
                mblk = tl.load(tbl + t)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA)
        else:
            for mblk in range(lo, flo):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA)
            for mblk in range(flo, fhi):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, False, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA)
            for mblk in range(fhi, hi):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA)
    dk = dk * sm_scale
    tl.store(DK + s.to(tl.int64) * stride_dks + b.to(tl.int64) * stride_dkb + hk.to(tl.int64) * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), mask=mk)
    tl.store(DV + s.to(tl.int64) * stride_dvs + b.to(tl.int64) * stride_dvb + hk.to(tl.int64) * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), mask=mk)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd, start_n,
             offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
             MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
             BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
             Kd, Vd, b, hk, TMA: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kT_ptrs = Kb + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    vT_ptrs = Vb + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd
    if TMA:  # rows past Nk arrive as zeros
        kT = tl.trans(Kd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        vT = tl.trans(Vd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
    elif MASKED:
        mkT = (offs_n[None, :] < Nk) & (offs_d[:, None] < HEAD_D)
        kT = tl.load(kT_ptrs, mask=mkT, other=0.0)
        vT = tl.load(vT_ptrs, mask=mkT, other=0.0)
    elif BLOCK_D != HEAD_D:
        kT = tl.load(kT_ptrs, mask=offs_d[:, None] < HEAD_D, other=0.0)
        vT = tl.load(vT_ptrs, mask=offs_d[:, None] < HEAD_D, other=0.0)
    else:
        kT = tl.load(kT_ptrs)
        vT = tl.load(vT_ptrs)
    qk = tl.dot(q, kT, input_precision=DOT_PREC)
    p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    if MASKED:
        ok = _allowed(offs_m[:, None], offs_n[None, :], Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                      HAS_LEFT, HAS_RIGHT, SPARSE)
        p = tl.where(ok, p, 0.0)
    dp = tl.dot(do, vT, input_precision=DOT_PREC)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, Lse2, Delta, DQ,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_db, stride_dh, stride_dn, stride_dd,
                   stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                   Hq, Nq, Nk, offset, group, qk_scale, sm_scale, win_left, win_right,
                   KV_IDX, KV_CNT, KV_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, N_BUCKET, Kd, Vd,
                   HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   SPARSE: tl.constexpr, DOT_PREC: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    n_mblocks = tl.cdiv(Nq, BLOCK_M)
    if SPARSE:  # table rows are in schedule order (heaviest first); column 0 holds the query tile
        mblk = tl.load(KV_IDX + tl.program_id(0) * stride_tbl)
    else:
        mblk = n_mblocks - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hk = h // group
    start_m = mblk * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mq = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qn
                + offs_d[None, :] * stride_qd, mask=mq, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh + offs_m[:, None] * stride_dn
                 + offs_d[None, :] * stride_dd, mask=mq, other=0.0)
    row = bh.to(tl.int64) * Nq + offs_m
    lse2 = tl.load(Lse2 + row, mask=offs_m < Nq, other=float("inf"))
    delta = tl.load(Delta + row, mask=offs_m < Nq, other=0.0)
    Kb = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    Vb = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        for t in range(0, nfull):
            nblk = tl.load(tbl + t)
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, False, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA)
        for t in range(nfull, cnt):
            nblk = tl.load(tbl + t)
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA)
    else:
        lo, hi, flo, fhi = _kv_range(start_m, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                     HAS_LEFT, HAS_RIGHT)
        if HAS_LEFT:  # partial tiles left of the full band (none without a left window edge)
            for nblk in range(lo, flo):
                dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                              nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                              LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                              DOT_PREC, Kd, Vd, b, hk, TMA)
        for nblk in range(flo, fhi):
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, False, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA)
        for nblk in range(fhi, hi):
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA)
    dq = dq * sm_scale
    tl.store(DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh + offs_m[:, None] * stride_dqn
             + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty), mask=mq)


# Launch policy. Default: one heuristic config per (kernel, head dim, mode, dtype) -- the first of a preference
# list that fits shared memory (ordered by the H200 autotune results in docs/kernels.md), so a new shape costs one
# compile. ATTN_ZOO_AUTOTUNE=1 autotunes over the whole list instead (the sparse mode fixes the tile and tunes
# warps / stages only, because its block table depends on the tile).
AUTOTUNE = os.environ.get("ATTN_ZOO_AUTOTUNE", "0") == "1" and not INTERPRET
_KERNELS = {"fwd": _fwd_kernel, "dq": _bwd_dq_kernel, "dkdv": _bwd_dkdv_kernel}
_CONFIGS = {"fwd": _FWD_CONFIGS, "dq": _DQ_CONFIGS, "dkdv": _DKDV_CONFIGS}
_TUNED = {}


def _tuned(kind: str, sparse: bool):
    key = (kind, sparse)
    if key not in _TUNED:
        configs = _sparse_configs(kind) if sparse else _CONFIGS[kind]
        # dK/dV with the atomic dQ accumulates into DQA: restore it after every benchmarked run
        extra = dict(key=_KEY_DKDV, restore_value=["DQA"]) if kind == "dkdv" else dict(key=_KEY)
        _TUNED[key] = triton.autotune(configs, prune_configs_by={"early_config_prune": _make_prune(kind)},
                                      **extra)(_KERNELS[kind])
    return _TUNED[key]


def _candidates(kind: str, block_d: int, sparse: bool, dot_prec: str, masked: bool, tma: bool = False):
    """Heuristic configs in preference order, pruned to those that fit shared memory (first is used)."""
    if sparse:
        prefs = _sparse_configs(kind)
    elif block_d <= 64 and kind in _HEURISTIC_SMALL_D:
        prefs = _HEURISTIC_SMALL_D[kind]
    else:
        table = _HEURISTIC_TMA if tma else _HEURISTIC
        prefs = table.get((kind, masked), table.get((kind, False)))
    return _make_prune(kind)(prefs, {"BLOCK_D": block_d, "SPARSE": sparse, "DOT_PREC": dot_prec})


def pick_config(kind: str, block_d: int, sparse: bool, dot_prec: str, masked: bool = False, tma: bool = False):
    """The heuristic config ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` used without autotuning."""
    c = _candidates(kind, block_d, sparse, dot_prec, masked, tma)[0]
    return dict(BLOCK_M=c.kwargs["BLOCK_M"], BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps,
                num_stages=c.num_stages)


if INTERPRET:
    _HEURISTIC = {(k, False): _CONFIGS[k] for k in _CONFIGS}
    _HEURISTIC_TMA = _HEURISTIC
else:
    # (kind, masked-mode) -> preference list; H200 autotune at D=128: fwd at N=8192, dq / dkdv at causal N=16384
    # (eval/probe_flash.py --autotune, 2026-11-29; docs/kernels.md)
    _HEURISTIC = {
        ("fwd", False): [_cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 2),
                         _cfg(32, 32, 4, 1)],
        ("fwd", True): [_cfg(64, 64, 4, 3), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        ("dq", False): [_cfg(128, 64, 8, 4), _cfg(128, 64, 8, 3), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 2),
                        _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        # 64x64 / 4 warps / 2 stages: 3-4% over 64x128 / 8 / 3 in the TMA sweep at N = 8192 (a tie at causal
        # N = 16384 in the autotune before)
        ("dkdv", False): [_cfg(64, 64, 4, 2), _cfg(64, 128, 8, 3), _cfg(64, 128, 8, 2), _cfg(32, 64, 4, 2),
                          _cfg(32, 32, 4, 1)],
    }
    # with TMA-streamed operands (fewer registers per program: the 4-warp 128 x 64 forward no longer spills much);
    # H200 sweep at N = 8192, D = 128 (eval/probe_flash.py --tma-sweep, 2026-11-29; docs/kernels.md)
    _HEURISTIC_TMA = dict(_HEURISTIC)
    _HEURISTIC_TMA.update({
        ("fwd", False): [_cfg(128, 64, 4, 2), _cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(64, 64, 4, 2),
                         _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        ("dq", False): [_cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 2),
                        _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
    })

# head dims <= 64 (the small models' D = 32 / 64): dQ on 64 x 64 tiles, 4 warps, 3 stages -- 5-10% faster than the
# D = 128 choice (128 x 64, 8 warps) at causal N = 1024 / 4096, 16k tokens, H = 4 (H200 2026-12-01,
# eval/experiments/tile_sweep.py, results/h200/2026-12-01/tile_sweep.csv); the forward's and dK/dV's D = 128 choices were
# within 2-5% of the best there and stay.
_HEURISTIC_SMALL_D = {} if INTERPRET else {
    "dq": [_cfg(64, 64, 4, 3), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 3), _cfg(32, 32, 4, 1)],
}

_CHOSEN = {}
# Fixed config per kernel kind, set by set_config_override() (probes / tuning scripts); not used by the sparse mode
_OVERRIDE = {}


def set_config_override(kind: str, cfg: Optional[dict] = None) -> None:
    """Force ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` for kernel ``kind`` ("fwd", "dq", "dkdv") in
    the causal / window / full modes (``None`` clears it). For tuning scripts; no shared-memory check."""
    if kind not in _KERNELS:
        raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(_KERNELS)}")
    clear_plans()
    if cfg is None:
        _OVERRIDE.pop(kind, None)
    else:
        _OVERRIDE[kind] = dict(cfg)


def _launch_key(kind, meta, dtype):
    """Key of a remembered config: the sparse mode's tiles are part of it (a tuning override changes them, and a
    config of other tiles would not match the block table)."""
    tiles = sparse_tiles(meta["BLOCK_D"]) if meta["SPARSE"] else None
    return (kind, dtype, tiles) + tuple(sorted(meta.items()))


def _block_n_dkdv(meta, dtype) -> int:
    """BLOCK_N the dK/dV launch will use (exact unless autotuning, where 128 is the estimate)."""
    if meta["SPARSE"]:
        return sparse_tiles(meta["BLOCK_D"])[1][1]
    if "dkdv" in _OVERRIDE:
        return int(_OVERRIDE["dkdv"]["BLOCK_N"])
    if AUTOTUNE:
        return 128
    key = _launch_key("dkdv", meta, dtype)
    if key in _CHOSEN:
        if _CHOSEN[key] is None:  # its TMA build failed: the launch will use pointer loads
            return _block_n_dkdv(dict(meta, TMA=False), dtype)
        return _CHOSEN[key]["BLOCK_N"]
    masked = bool(meta["HAS_LEFT"] or meta["HAS_RIGHT"])
    return _candidates("dkdv", meta["BLOCK_D"], False, meta["DOT_PREC"], masked, meta["TMA"])[0].kwargs["BLOCK_N"]


def _descs(kind: str, tensors, meta, cfg):
    """The kernel's two streamed operands: TMA descriptors over the whole ``(B, H, N, D)`` tensors with a
    ``(1, 1, rows, D)`` box (rows = the tile streamed by the loop) when ``meta["TMA"]``, else the tensors
    themselves (unused placeholders of the pointer-load build)."""
    if not meta["TMA"]:
        return tuple(tensors)
    rows = cfg["BLOCK_M"] if kind == "dkdv" else cfg["BLOCK_N"]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, meta["BLOCK_D"]]) for t in tensors)


def _is_build_error(e: Exception) -> bool:
    """A compiler failure (Triton front end, an MLIR pass, ptxas), as opposed to a launch / runtime error."""
    msg = str(e).lower()
    return type(e).__name__ in ("CompilationError", "PTXASError") or "ptxas" in msg or "passmanager" in msg


def _tma_build_failed(kind: str, key, e: Exception) -> None:
    """Warn that the TMA build of ``kind`` failed and remember to use pointer loads for ``key``."""
    warnings.warn(f"attn_zoo flash: the TMA build of the {kind!r} kernel failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''}); using pointer loads", RuntimeWarning)
    _CHOSEN[key] = None


def _launch(kind: str, grid_axis1: int, n_rows: int, args, meta, streamed=()):
    """Launch kernel ``kind`` over ``(cdiv(n_rows, tile), grid_axis1)`` programs (tile = BLOCK_N for dkdv).

    ``streamed``: the two tensors the kernel's loop streams (fwd / dq: k, v; dkdv: q, do), passed after ``args``
    as TMA descriptors when ``meta["TMA"]`` (see :func:`_descs`). Without autotuning the first heuristic
    candidate is used; a candidate the compiler rejects for lack of shared memory / registers
    (``OutOfResources``) is dropped and the next one is tried, once per key.
    """
    tile = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
    grid = lambda m: (cdiv(n_rows, m[tile]), grid_axis1)  # noqa: E731
    if kind in _OVERRIDE and not meta["SPARSE"]:
        _KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, _OVERRIDE[kind]), **meta, **_OVERRIDE[kind])
        return None
    if meta["SPARSE"] and kind in _SPARSE_OVERRIDE:
        cfg = _SPARSE_OVERRIDE[kind]
        _KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        return None
    if AUTOTUNE:  # the launcher makes TMA off under autotuning (descriptor boxes depend on the config)
        _tuned(kind, meta["SPARSE"])[grid](*args, *streamed, **meta)
        return None
    masked = bool(meta["HAS_LEFT"] or meta["HAS_RIGHT"])
    key = _launch_key(kind, meta, args[0].dtype)
    if key in _CHOSEN:
        cfg = _CHOSEN[key]
        if cfg is None:  # the TMA build of this key failed: pointer loads
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed)
        try:  # a new specialisation (alignment / unit-stride properties of the arguments) compiles again
            compiled = _KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        except Exception as e:
            if not (meta["TMA"] and _is_build_error(e)):
                raise
            _tma_build_failed(kind, key, e)
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed)
        return compiled, cfg, meta
    err = None
    for c in _candidates(kind, meta["BLOCK_D"], meta["SPARSE"], meta["DOT_PREC"], masked, meta["TMA"]):
        cfg = dict(BLOCK_M=c.kwargs["BLOCK_M"], BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps,
                   num_stages=c.num_stages)
        try:
            compiled = _KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        except Exception as e:  # OutOfResources (shared memory / registers): try a smaller config
            if "out of resource" in str(e).lower() or type(e).__name__ == "OutOfResources":
                err = e
                continue
            if not (meta["TMA"] and _is_build_error(e)):
                raise
            _tma_build_failed(kind, key, e)
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed)
        _CHOSEN[key] = cfg
        return compiled, cfg, meta
    raise err


# Launch plans. A call's plan holds everything that follows from its signature -- shapes, strides, dtype, device,
# scale, window, sparse table shapes, pointer alignment and the tuning switches -- namely the kernels' constexpr
# options, the dK/dV split and, once the first call has compiled them, the kernels themselves as
# ``CompiledLaunch`` objects. A repeated call (a training step, a benchmark loop) then allocates its outputs and
# launches, and nothing else: no checks, no config choice, no Triton argument binding (H200 machine, triton 3.6:
# host time of a causal bf16 fwd+bwd at N = 512 went from 702 us through Triton's launcher to 271 us, the
# forward's launch function from 81 to 23 us; results/h200/2026-12-01/host_profile.txt).
class _Plan:
    __slots__ = ("meta", "fast")

    def __init__(self, meta):
        self.meta = meta  # kind -> constexpr options (fwd / dkdv / dq) and the plan's own values
        self.fast = {}  # kind -> CompiledLaunch, or None where the normal path must run (override, interpreter)


_PLANS = {}
_MAX_PLANS = 512


def _aligned(*tensors) -> tuple:
    """Triton specialises pointers on 16-byte alignment: part of a plan's key."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _get_plan(key, build) -> _Plan:
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(build())
    return plan


def clear_plans() -> None:
    """Forget every launch plan (tuning switches, overrides and remembered configs are read again)."""
    _PLANS.clear()


def _plan_launch(plan: _Plan, kind: str, grid_axis1: int, n_rows: int, args, meta, streamed, device):
    """Launch ``kind`` through the plan's compiled kernel, or through :func:`_launch` (first call, overrides,
    autotuning, interpreter, launch hooks), keeping what it compiled for the next call."""
    fast = plan.fast.get(kind)
    if fast is not None and fast[0].ready():
        launch, cfg, used = fast
        launch(*args, *(_descs(kind, streamed, used, cfg) if used.get("TMA") else streamed))
        return
    if kind == "pre":  # the backward's preprocess: one fixed config
        res = (_bwd_preprocess[(cdiv(n_rows, meta["BLOCK_M"]), grid_axis1)](*args, **meta), {}, meta)
    else:
        res = _launch(kind, grid_axis1, n_rows, args, meta, streamed)
    if kind in plan.fast or INTERPRET or res is None or device.type != "cuda":
        plan.fast.setdefault(kind, None)
        return
    compiled, cfg, used = res
    values = dict(used, **cfg)
    tile = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
    fn = _bwd_preprocess if kind == "pre" else _KERNELS[kind]
    launch = CompiledLaunch.capture(fn, compiled, len(args) + len(streamed), values,
                                    (cdiv(n_rows, values[tile]), grid_axis1), device.index or 0)
    plan.fast[kind] = None if launch is None else (launch, cfg, used)


# ============================================================================================ host side
def _bucket(n: int) -> int:
    return 1 << max(int(n - 1).bit_length(), 4)


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)} in (B, Hkv, Nk)")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"head dims must agree (q D={D}, k D={k.shape[3]}, v Dv={v.shape[3]}); Dv != D is not supported")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported; allowed values: 1..{MAX_HEAD_DIM}")
    Hkv = k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (k.shape[1]) for grouped-query attention")
    if Nq < 1 or k.shape[2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Nq={Nq}, Nk={k.shape[2]}")


# Tuning switches (read at launch).
# sparse_aligned_no_gather (default on): when the layout's block size is a multiple of a kernel's tiles (and
# Nk - Nq of its query tile), partial tiles skip the per-element layout gather (SPARSE = 2 in _allowed). Offline
# (sm_90a, causal) the sparse forward's partial-tile loop drops from 1397 instructions with 33 global gathers and
# 31 barriers per warp and tile to 641 with 2; on the H200 BigBird fwd+bwd +24% / +23% at N = 4k / 16k
# (forward 177 -> 305 TF/s). It trusts the block table: a tile marked visited must lie in a layout block that is
# on (true for tables from MaskInfo.block_table at aligned tiles, which the triton backend builds; a hand-made
# table that visits extra tiles would let their masked blocks through).
# tma / tma_min_pairs: TMA descriptors for the streamed operands, see _tma_ok.
_OPTS = {"sparse_aligned_no_gather": True, "tma": "auto", "tma_min_pairs": 1 << 28}
_DUMMIES = {}
_CAPABILITY = {}


def _tma_ok(D: int, block_d: int, pairs: int, sparse: bool, *tensors) -> bool:
    """Whether the kernels stream ``tensors`` with TMA descriptors (``TMA`` constexpr). ``_OPTS["tma"]``:
    ``"auto"`` (default) on a CUDA device of compute capability >= 9 (Hopper) for dense / causal / window masks
    whose visited query-key ``pairs`` (an estimate) reach ``_OPTS["tma_min_pairs"]``; ``True`` always (also
    under the interpreter, for tests); ``False`` never. Descriptors cost host time at every launch (~0.1 ms per
    kernel on the H200 machine, ``eval/experiments/host_time.py``): below that size and for the short block-sparse
    kernels they cost more than they save. Either way only when the head dim is a power of two >= 16
    (``D == block_d``), not autotuning, and every tensor meets TMA's layout rules: unit last stride, 16-byte
    aligned base and other strides. Otherwise the kernels use pointer loads (same results)."""
    mode = _OPTS["tma"]
    if mode is False or TensorDescriptor is None or AUTOTUNE or D != block_d:
        return False
    dev = tensors[0].device
    if mode == "auto":
        if INTERPRET or dev.type != "cuda" or sparse or pairs < _OPTS["tma_min_pairs"]:
            return False
        if dev not in _CAPABILITY:
            _CAPABILITY[dev] = torch.cuda.get_device_capability(dev)[0]
        if _CAPABILITY[dev] < 9:
            return False
    for t in tensors:
        el = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(st <= 0 or (st * el) % 16 for st in t.stride()[:-1]):
            return False
    return True


def _pairs(B: int, Hq: int, Nq: int, Nk: int, win_left: int, win_right: int) -> int:
    """Visited query-key pairs of a dense / causal / window problem, estimated (for :func:`_tma_ok`): rows see
    ``left + right + 1`` keys with both window edges, on average ``Nk - Nq / 2 + right`` with only a right edge
    (causal: ``right = 0``), ``Nq / 2 + left`` with only a left edge, each clipped to ``[1, Nk]``."""
    if win_left >= 0 and win_right >= 0:
        width = win_left + win_right + 1
    elif win_right >= 0:
        width = Nk - Nq // 2 + win_right
    elif win_left >= 0:
        width = Nq // 2 + win_left
    else:
        width = Nk
    return B * Hq * Nq * max(1, min(Nk, width))


def _sparse_mode(layout, layout_bs: int, tile, Nq: int, Nk: int) -> int:
    """The ``SPARSE`` constexpr of a kernel with tiles ``tile = (BLOCK_M, BLOCK_N)``: 0 without a layout, 2 when
    every tile lies inside one layout block and the switch is on, else 1."""
    if layout is None:
        return 0
    bm, bn = tile
    if _OPTS["sparse_aligned_no_gather"] and layout_bs % bm == 0 and layout_bs % bn == 0 and (Nk - Nq) % bm == 0:
        return 2
    return 1


def _mode_args(q, layout, tables):
    if q.device not in _DUMMIES:  # placeholder pointers of the dense modes (never read), one pair per device
        _DUMMIES[q.device] = (torch.zeros(1, dtype=torch.int32, device=q.device),
                              torch.zeros(1, dtype=torch.int8, device=q.device))
    dummy_i32, dummy_i8 = _DUMMIES[q.device]
    if layout is not None:
        idx, cnt, nfull = tables
        lay = layout.to(device=q.device, dtype=torch.int8).contiguous()
        return dict(sparse=True, idx=idx, cnt=cnt, nfull=nfull, stride_tbl=idx.stride(0), lay=lay,
                    lay_nb=lay.shape[0])
    return dict(sparse=False, idx=dummy_i32, cnt=dummy_i32, nfull=dummy_i32, stride_tbl=0, lay=dummy_i8, lay_nb=1)


def _opts_key() -> tuple:
    return tuple(_OPTS.values())


def _fwd_meta(q, k, v, win_left, win_right, layout, layout_bs):
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    block_d = max(16, next_pow2(D))
    pairs = _pairs(B, Hq, Nq, Nk, win_left, win_right)
    return dict(HEAD_D=D, BLOCK_D=block_d, HAS_LEFT=win_left >= 0, HAS_RIGHT=win_right >= 0,
                SPARSE=_sparse_mode(layout, layout_bs, sparse_tiles(D)[0], Nq, Nk),
                DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
                TMA=_tma_ok(D, block_d, pairs, layout is not None, k, v))


def _bnhd_empty(B: int, H: int, N: int, D: int, dtype, device) -> torch.Tensor:
    """An uninitialised ``(B, H, N, D)`` tensor stored as ``(B, N, H, D)``: the layout of the model's projections,
    so the attention output turns into ``(B, N, H * D)`` without a copy (the layout FlashAttention and SDPA return
    too). The forward's output always uses it, the gradients on the custom-op path too (see ``flash_attn_bwd``)."""
    return torch.empty_strided((B, H, N, D), (N * H * D, D, H * D, 1), dtype=dtype, device=device)


def flash_attn_fwd(q, k, v, softmax_scale: float, win_left: int = -1, win_right: int = -1,
                   layout: Optional[torch.Tensor] = None, layout_bs: int = 0,
                   kv_idx: Optional[torch.Tensor] = None, kv_cnt: Optional[torch.Tensor] = None,
                   kv_nfull: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launch. ``win_left`` / ``win_right`` < 0 mean unbounded (causal is ``win_right = 0``).

    Block-sparse: ``layout`` bool/int ``(nb, nb)`` at ``layout_bs`` tokens and the query-tile block table
    built by :func:`build_sparse_tables` at ``sparse_tiles(D)[0]``: ``kv_idx`` int32 ``(n_q_tiles, max_visits)``
    (each row full tiles first), ``kv_cnt`` int32 ``(n_q_tiles,)`` visited tiles, ``kv_nfull`` int32
    ``(n_q_tiles,)`` full tiles. Returns ``(out (B, Hq, Nq, D) q.dtype, stored as (B, Nq, Hq, D), lse (B, Hq, Nq)
    fp32)``.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    sparse_key = None if layout is None else (layout.shape, layout_bs, kv_idx.shape)
    key = ("fwd", q.shape, k.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, softmax_scale, win_left,
           win_right, sparse_key, _aligned(q, k, v), _opts_key())
    plan = _PLANS.get(key) or _get_plan(key, lambda: {"fwd": _fwd_meta(q, k, v, win_left, win_right, layout,
                                                                        layout_bs)})
    out = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    m = _mode_args(q, layout, (kv_idx, kv_cnt, kv_nfull))
    _plan_launch(plan, "fwd", B * Hq, Nq, (
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        Hq, Nq, Nk, Nk - Nq, Hq // Hkv, softmax_scale * LOG2E, max(win_left, 0), max(win_right, 0),
        m["idx"], m["cnt"], m["nfull"], m["stride_tbl"], m["lay"], m["lay_nb"], max(layout_bs, 1), _bucket(Nq)),
        plan.meta["fwd"], (k, v), q.device)
    return out, lse


DQ_MODES = ("separate", "atomic")


def resolve_dq_mode(dq_mode: Optional[str] = None) -> str:
    """``dq_mode`` if given, else env ``ATTN_ZOO_FLASH_DQ`` (read at call time), else ``"separate"``.

    ``"separate"``: dQ in its own kernel per query tile (deterministic, 7 matmuls per tile pair in the backward);
    ``"atomic"``: dQ fused into the dK/dV kernel with fp32 atomics (FA2; 5 matmuls, not deterministic).
    """
    mode = dq_mode or os.environ.get("ATTN_ZOO_FLASH_DQ", "") or "separate"
    if mode not in DQ_MODES:
        src = "dq_mode" if dq_mode else "ATTN_ZOO_FLASH_DQ"
        raise ValueError(f"{src}={mode!r} is not supported; allowed values: {', '.join(DQ_MODES)}")
    return mode


@functools.lru_cache(maxsize=16)
def _sm_count(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def choose_dkdv_split(group: int, n_programs: int, target: int) -> int:
    """Heads of a GQA group split over ``s`` dK/dV programs: the smallest power of two ``s`` dividing ``group``
    with ``n_programs * s >= target`` (or the largest such power of two if none reaches it); 1 when ``group``
    is odd or the grid is already large enough."""
    s = 1
    while group % (2 * s) == 0 and n_programs * s < target:
        s *= 2
    return s


def _resolve_split(dkdv_split: Optional[int], group: int, n_programs: int, device) -> int:
    n, src = dkdv_split, "dkdv_split"
    if not n:
        env = os.environ.get("ATTN_ZOO_FLASH_DKDV_SPLIT", "").strip().lower()
        src = "ATTN_ZOO_FLASH_DKDV_SPLIT (the dkdv_split default)"
        if env not in ("", "0", "auto"):
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"ATTN_ZOO_FLASH_DKDV_SPLIT={env!r} must be an integer or 'auto'") from None
    if not n:  # target programs: 2 per SM; 8 per SM for groups of >= 8 heads (MQA-like: each program's group
        # loop is long, so finer programs even out the waves; H200, MQA N = 4096: split 8 vs 2 -10% backward,
        # N = 16384 equal; GQA-4 lost 2-4% with more splits, eval/experiments/diag.py)
        return choose_dkdv_split(group, n_programs, (8 if group >= 8 else 2) * _sm_count(device))
    if n < 1 or group % n:
        name, _, why = src.partition(" ")
        raise ValueError(f"{name}={n} {why + ' ' if why else ''}must be >= 1 and divide the GQA group size "
                         f"Hq // Hkv = {group}")
    return int(n)


def flash_attn_bwd(do, q, k, v, out, lse, softmax_scale: float, win_left: int = -1, win_right: int = -1,
                   layout: Optional[torch.Tensor] = None, layout_bs: int = 0,
                   kv_idx=None, kv_cnt=None, kv_nfull=None, q_idx=None, q_cnt=None, q_nfull=None,
                   dlse: Optional[torch.Tensor] = None, dq_mode: Optional[str] = None,
                   dkdv_split: Optional[int] = None, grads_like_inputs: bool = True
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launches: preprocess (delta, lse2), dK/dV (per key tile, GQA group summed), dQ (per query tile).

    Block-sparse needs the query-tile table (``kv_*`` at ``sparse_tiles(D)[0]``) and the key-tile table
    (``q_*``: for each key tile the visited query tiles, full ones first, at ``sparse_tiles(D)[1]``), both from
    :func:`build_sparse_tables`. ``dq_mode``: see :func:`resolve_dq_mode` (``"atomic"`` skips the dQ kernel).
    ``dkdv_split``: number of programs a GQA group's query heads are split over in the dK/dV pass (must divide
    ``Hq // Hkv``; partial fp32 dK/dV summed after); ``None`` / 0: env ``ATTN_ZOO_FLASH_DKDV_SPLIT``, else
    :func:`choose_dkdv_split` with a target of 2 programs per SM (8 for groups of >= 8 heads).
    ``grads_like_inputs``: ``dq`` / ``dk`` / ``dv`` take the layouts of ``q`` / ``k`` / ``v`` (a leaf tensor's
    gradient of another layout would be copied by autograd); ``False``: stored as ``(B, N, H, D)`` (the custom
    op, whose fake kernel cannot see the runtime strides). Returns ``(dq, dk, dv)``.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    mode = resolve_dq_mode(dq_mode)
    has_dlse = dlse is not None
    sparse_key = None if layout is None else (layout.shape, layout_bs, kv_idx.shape, q_idx.shape)
    key = ("bwd", q.shape, k.shape, q.stride(), k.stride(), v.stride(), do.stride(), out.stride(), q.dtype, q.device,
           softmax_scale, win_left, win_right, sparse_key, _aligned(q, k, v, do, out), mode,
           dkdv_split or os.environ.get("ATTN_ZOO_FLASH_DKDV_SPLIT"), has_dlse, grads_like_inputs, _opts_key())
    plan = _PLANS.get(key) or _get_plan(key, lambda: _bwd_meta(q, k, v, do, win_left, win_right, layout, layout_bs,
                                                                mode, dkdv_split, has_dlse))
    pm = plan.meta
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    dl = dlse.contiguous().float() if has_dlse else delta
    _plan_launch(plan, "pre", B * Hq, Nq, (out, do, dl, lse, delta, lse2, Hq, Nq, *out.stride(), *do.stride()),
                 pm["pre"], (), q.device)
    if grads_like_inputs:  # eager: the layout of q / k / v (autograd copies a leaf's gradient of another layout)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # dense inputs keep their strides
    else:  # custom op: one fixed layout, whatever strides Inductor hands it (its fake kernel must agree)
        dq, dk, dv = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device), \
            _bnhd_empty(B, Hkv, Nk, D, v.dtype, v.device)
    mk = _mode_args(q, layout, (kv_idx, kv_cnt, kv_nfull))
    mq = _mode_args(q, layout, (q_idx, q_cnt, q_nfull))
    n_split, atomic = pm["n_split"], pm["atomic"]
    if n_split > 1:  # fp32 partial dK / dV per split, summed below
        dk_t = torch.empty((n_split, B, Hkv, Nk, D), dtype=torch.float32, device=q.device)
        dv_t = torch.empty_like(dk_t)
        dk_strides, dv_strides = dk_t.stride(), dv_t.stride()
    else:
        dk_t, dv_t = dk, dv
        dk_strides, dv_strides = (0, *dk.stride()), (0, *dv.stride())
    dqa = torch.zeros((B, Hq, Nq, D), dtype=torch.float32, device=q.device) if atomic else delta
    wl, wr = max(win_left, 0), max(win_right, 0)
    group = Hq // Hkv
    _plan_launch(plan, "dkdv", B * Hkv * n_split, Nk, (
        q, k, v, do, lse2, delta, dk_t, dv_t, dqa, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dk_strides, *dv_strides, Hq, Hkv, Nq, Nk, Nk - Nq, group, n_split, softmax_scale * LOG2E, softmax_scale,
        wl, wr, mq["idx"], mq["cnt"], mq["nfull"], mq["stride_tbl"], mq["lay"], mq["lay_nb"], max(layout_bs, 1),
        _bucket(Nk)), pm["dkdv"], (q, do), q.device)
    if n_split > 1:
        dk.copy_(dk_t.sum(0))
        dv.copy_(dv_t.sum(0))
    if atomic:
        dq.copy_(dqa)
        return dq, dk, dv
    _plan_launch(plan, "dq", B * Hq, Nq, (
        q, k, v, do, lse2, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        Hq, Nq, Nk, Nk - Nq, group, softmax_scale * LOG2E, softmax_scale, wl, wr,
        mk["idx"], mk["cnt"], mk["nfull"], mk["stride_tbl"], mk["lay"], mk["lay_nb"], max(layout_bs, 1),
        _bucket(Nq)), pm["dq"], (k, v), q.device)
    return dq, dk, dv


def _bwd_meta(q, k, v, do, win_left, win_right, layout, layout_bs, mode, dkdv_split, has_dlse):
    """The backward's launch options (a plan's ``meta``): preprocess, dK/dV and dQ constexprs, the split."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    block_d = max(16, next_pow2(D))
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    pairs = _pairs(B, Hq, Nq, Nk, win_left, win_right)
    f_tile, b_tile = sparse_tiles(D) if layout is not None else ((1, 1), (1, 1))
    common = dict(HEAD_D=D, BLOCK_D=block_d, HAS_LEFT=win_left >= 0, HAS_RIGHT=win_right >= 0,
                  SPARSE=_sparse_mode(layout, layout_bs, f_tile, Nq, Nk), DOT_PREC=prec)
    atomic = mode == "atomic"
    meta_dkdv = dict(common, ATOMIC_DQ=atomic, SPARSE=_sparse_mode(layout, layout_bs, b_tile, Nq, Nk),
                     TMA=_tma_ok(D, block_d, pairs, layout is not None, q, do))
    n_tiles = cdiv(Nk, _block_n_dkdv(meta_dkdv, q.dtype))
    n_split = _resolve_split(dkdv_split, group, n_tiles * B * Hkv, q.device)
    return {"pre": dict(HAS_DLSE=has_dlse, HEAD_D=D, BLOCK_D=block_d, BLOCK_M=64 if not INTERPRET else 32),
            "dkdv": meta_dkdv, "dq": dict(common, TMA=_tma_ok(D, block_d, pairs, layout is not None, k, v)),
            "n_split": n_split, "atomic": atomic}
    _launch("dq", B * Hq, Nq, (
        q, k, v, do, lse2, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        Hq, Nq, Nk, Nk - Nq, group, softmax_scale * LOG2E, softmax_scale, wl, wr,
        mk["idx"], mk["cnt"], mk["nfull"], mk["stride_tbl"], mk["lay"], mk["lay_nb"], max(layout_bs, 1),
        _bucket(Nq)), dict(common, TMA=_tma_ok(D, block_d, pairs, layout is not None, k, v)), streamed=(k, v))
    return dq, dk, dv


# ============================================================================================ custom op + autograd
# dq_mode "" and dkdv_split 0 mean "decide at backward time" (env, then default / heuristic).
@torch.library.custom_op("attn_zoo_kernels::flash_fwd", mutates_args=())
def _flash_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, win_left: int,
                  win_right: int, layout: Optional[torch.Tensor], layout_bs: int, kv_idx: Optional[torch.Tensor],
                  kv_cnt: Optional[torch.Tensor], kv_nfull: Optional[torch.Tensor], q_idx: Optional[torch.Tensor],
                  q_cnt: Optional[torch.Tensor], q_nfull: Optional[torch.Tensor], dq_mode: str,
                  dkdv_split: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return flash_attn_fwd(q, k, v, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull)


@_flash_fwd_op.register_fake
def _(q, k, v, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt,
      q_nfull, dq_mode, dkdv_split):
    B, Hq, Nq, D = q.shape
    return _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("attn_zoo_kernels::flash_bwd", mutates_args=())
def _flash_bwd_op(do: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, softmax_scale: float, win_left: int, win_right: int,
                  layout: Optional[torch.Tensor], layout_bs: int, kv_idx: Optional[torch.Tensor],
                  kv_cnt: Optional[torch.Tensor], kv_nfull: Optional[torch.Tensor], q_idx: Optional[torch.Tensor],
                  q_cnt: Optional[torch.Tensor], q_nfull: Optional[torch.Tensor], dq_mode: str, dkdv_split: int
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _flash_bwd_impl(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs,
                           kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dq_mode, dkdv_split)


def _flash_bwd_impl(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx,
                    kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dq_mode, dkdv_split, grads_like_inputs=False):
    """The backward in the custom op's argument order (the eager ``_FlashFn`` calls it with
    ``grads_like_inputs=True``)."""
    return flash_attn_bwd(do, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs,
                          kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dlse=dlse, dq_mode=dq_mode or None,
                          dkdv_split=dkdv_split or None, grads_like_inputs=grads_like_inputs)


def _flash_bwd_eager(*args):
    return _flash_bwd_impl(*args, grads_like_inputs=True)


@_flash_bwd_op.register_fake
def _(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull,
      q_idx, q_cnt, q_nfull, dq_mode, dkdv_split):
    (B, Hq, Nq, D), (Hkv, Nk) = q.shape, k.shape[1:3]
    return (_bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device),
            _bnhd_empty(B, Hkv, Nk, D, v.dtype, v.device))


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.cfg = tuple(inputs[3:])  # scale, wl, wr, layout, bs, 6 tables, dq_mode, dkdv_split


def _run_backward(ctx, dout, dlse, bwd):
    """Gradients of both autograd paths: ``bwd`` is the custom op (compile) or its implementation (eager)."""
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    return bwd(dout, dlse, q, k, v, out, lse, *ctx.cfg)  # (dq, dk, dv)


def _backward(ctx, dout, dlse):
    return _run_backward(ctx, dout, dlse, _flash_bwd_op) + (None,) * len(ctx.cfg)


_flash_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _FlashFn(torch.autograd.Function):
    """Eager path of :func:`flash_attn`: the same forward / backward as the custom ops, without the dispatcher
    (the custom-op call costs ~0.1-0.2 ms of host time per call, as much as a short sparse forward on the GPU).
    ``torch.compile`` traces the custom ops instead."""

    @staticmethod
    def forward(ctx, q, k, v, cfg):  # cfg: the custom op's other arguments, one tuple (apply checks each argument)
        out, lse = flash_attn_fwd(q, k, v, *cfg[:8])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # double backward raises (as through the custom op)
    def backward(ctx, dout, dlse):
        return _run_backward(ctx, dout, dlse, _flash_bwd_eager) + (None,)


# ============================================================================================ public entry
def _full_first_table(visited: torch.Tensor, full: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(idx, cnt, nfull)`` of a bool ``(rows, cols)`` visited / full matrix, in schedule order.

    Rows (one per program) are sorted by decreasing visit count (stable), so the heaviest tiles start first
    (BigBird's global rows visit every tile; launched last they would run alone at the end). Row ``r``:
    ``idx[r, 0]`` is the tile it computes, ``idx[r, 1:1 + cnt[r]]`` its visited tiles, the ``nfull[r]`` full ones
    first, then the partial ones (each group in increasing order), padded with 0 to the longest row."""
    visited = visited.cpu().bool()
    full = full.cpu().bool() & visited
    rank = torch.where(full, 0, torch.where(visited, 1, 2)).to(torch.int8)
    cnt = visited.sum(1).to(torch.int32)
    nfull = full.sum(1).to(torch.int32)
    mv = max(int(cnt.max()) if cnt.numel() else 0, 1)
    order = torch.sort(rank, dim=1, stable=True).indices[:, :mv]
    valid = torch.arange(mv).view(1, -1) < cnt.view(-1, 1)
    idx = torch.where(valid, order, 0).to(torch.int32)
    sched = torch.sort(-cnt.to(torch.int64), stable=True).indices
    idx = torch.cat([sched.view(-1, 1).to(torch.int32), idx[sched]], 1)
    return idx, cnt[sched], nfull[sched]


def build_sparse_tables(table_fn: Callable, D: int, device) -> Tuple[torch.Tensor, ...]:
    """Block tables of the sparse mode at :func:`sparse_tiles`: ``(kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt,
    q_nfull)``, int32 on ``device``.

    ``table_fn(block_m, block_n)`` returns ``(kv_idx, kv_count, kv_full, visited, full)`` per query tile (e.g.
    ``MaskInfo.block_table``; only ``visited`` / ``full`` bool ``(n_q_tiles, n_k_tiles)`` are read). Per query
    tile (forward, dQ): row ``r`` of ``kv_idx`` ``(n_q_tiles, 1 + max_visits)`` is run by program ``r``; its column 0
    is the query tile, then the visited key tiles, the ``kv_nfull[r]`` full ones first (no element mask
    needed), then the partial ones (``kv_cnt[r]`` in all). Rows are sorted by decreasing ``kv_cnt`` (heaviest
    tiles start first: load balance for global rows). Per key tile (dK/dV): the same for the transposed
    matrices at the dK/dV tiles. Full-first rows let the kernels run two branch-free loops. Cache the result when the same mask is used many times (the adapter does).
    """
    (fm, fn), (bm, bn) = sparse_tiles(D)
    t = table_fn(fm, fn)
    kv = _full_first_table(t[3], t[4])
    tb = table_fn(bm, bn)
    qt = _full_first_table(tb[3].t(), tb[4].t())  # (n_k_tiles, n_q_tiles)
    return tuple(x.to(device).contiguous() for x in kv + qt)


def _check_tables(tables, Nq: int, Nk: int, D: int):
    """Types and shapes of user-given tables against the current sparse tiles (shape-only: no device sync)."""
    if len(tables) != 6:
        raise ValueError(f"block_tables must be the 6 tensors of build_sparse_tables, got {len(tables)}")
    for name, t in zip(("kv_idx", "kv_cnt", "kv_nfull", "q_idx", "q_cnt", "q_nfull"), tables):
        want = 2 if name.endswith("idx") else 1
        if not isinstance(t, torch.Tensor) or t.dim() != want or t.dtype != torch.int32:
            raise ValueError(f"block_tables {name} must be an int32 {want}-D tensor (see build_sparse_tables), got "
                             f"{getattr(t, 'dtype', type(t))} of shape {tuple(getattr(t, 'shape', ()))}")
    (fm, _), (_, bn) = sparse_tiles(D)
    for side, (idx, cnt, nfull), rows in (("query", tables[:3], cdiv(Nq, fm)),
                                          ("key", tables[3:], cdiv(Nk, bn))):
        if idx.shape[0] != rows or cnt.numel() != rows or nfull.numel() != rows or idx.shape[1] < 2:
            raise ValueError(f"block_tables do not fit this call: {rows} {side} tiles at the sparse tiles "
                             f"{sparse_tiles(D)} (Nq={Nq}, Nk={Nk}, D={D}) need {rows} rows of >= 2 columns, got "
                             f"{tuple(idx.shape)}; rebuild them with build_sparse_tables")


_CHECKED = set()  # (shapes, dtypes) that passed _check


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               window_size: Optional[Sequence[Optional[int]]] = None, softmax_scale: Optional[float] = None,
               block_layout: Optional[torch.Tensor] = None, block_size: int = 0,
               block_table_fn: Optional[Callable] = None, return_lse: bool = False,
               block_tables: Optional[Sequence[torch.Tensor]] = None, dq_mode: Optional[str] = None,
               dkdv_split: Optional[int] = None):
    """Exact attention ``softmax(scale * q k^T + mask) v`` (FlashAttention-2, Dao 2023), differentiable.

    Args:
        q: ``(B, Hq, Nq, D)`` float16 / bfloat16 / float32 (any strides), ``1 <= D <= 256``.
        k, v: ``(B, Hkv, Nk, D)``, ``Hq % Hkv == 0`` (GQA / MQA: query head ``h`` uses K/V head ``h // (Hq // Hkv)``).
        causal: key ``j`` visible to query row ``i`` only if ``j <= i + Nk - Nq`` (bottom-right alignment).
        window_size: ``(left, right)`` inclusive, ``None`` entries unbounded; causal clips ``right`` to 0.
        softmax_scale: default ``D ** -0.5``.
        block_layout: bool ``(nb, nb)`` block-sparse layout over absolute positions at ``block_size`` tokens
            (rows with ``i + Nk - Nq < 0`` see nothing); pass it as int8 on ``q``'s device when calling in a loop
            (a CPU layout is copied to the device on every call, a copy that waits for the GPU). Needs ``block_table_fn(block_m, block_n)`` returning
            ``(kv_idx, kv_count, kv_full, visited, full)`` (e.g. ``MaskInfo.block_table``) for the visited tiles.
        block_tables: precomputed :func:`build_sparse_tables` output (skips ``block_table_fn``). With the tuning
            switch ``_OPTS["sparse_aligned_no_gather"]`` on, a tile the table visits must lie in a layout block that
            is on (tables from ``MaskInfo.block_table`` do; see the switch's comment).
        return_lse: also return ``lse`` fp32 ``(B, Hq, Nq)`` (natural log, ``-inf`` on empty rows); it is
            differentiable.
        dq_mode: backward dQ algorithm, ``"separate"`` (deterministic dQ kernel) or ``"atomic"`` (fused into the
            dK/dV kernel with fp32 atomics); ``None``: env ``ATTN_ZOO_FLASH_DQ`` at backward time, default
            ``"separate"``.
        dkdv_split: programs per GQA group in the dK/dV pass (divides ``Hq // Hkv``); ``None``: env
            ``ATTN_ZOO_FLASH_DKDV_SPLIT`` or the grid-size heuristic (:func:`choose_dkdv_split`).

    Returns:
        ``out (B, Hq, Nq, D)`` in ``q.dtype`` (rows that see no key are 0), and ``lse`` if asked.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, ``Hq % Hkv != 0``, ``D > 256``, ``Dv != D``, a layout without
        ``block_table_fn``, malformed ``block_tables``, unknown ``dq_mode``, ``dkdv_split`` not dividing the group.
    """
    sig = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype)
    if sig not in _CHECKED:
        _check(q, k, v)
        _CHECKED.add(sig)
    D = q.shape[-1]
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    left = right = None
    if window_size is not None:
        if len(window_size) != 2:
            raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
        left, right = window_size
        for side, w in (("left", left), ("right", right)):
            if w is not None and (not isinstance(w, int) or w < 0):
                raise ValueError(f"window_size {side}={w!r} must be an integer >= 0 or None")
    if causal:
        right = 0 if right is None else min(right, 0)
    wl = -1 if left is None else int(left)
    wr = -1 if right is None else int(right)
    if dq_mode is not None:
        resolve_dq_mode(dq_mode)
    group = q.shape[1] // k.shape[1]
    if dkdv_split is not None and (not isinstance(dkdv_split, int) or isinstance(dkdv_split, bool)
                                   or dkdv_split < 1 or group % dkdv_split):
        raise ValueError(f"dkdv_split={dkdv_split!r} must be an integer >= 1 dividing the GQA group size "
                         f"Hq // Hkv = {group}")
    tables = (None,) * 6
    layout = None
    if block_layout is not None:
        if block_table_fn is None and block_tables is None:
            raise ValueError("block_layout needs block_table_fn(block_m, block_n) (e.g. MaskInfo.block_table)")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 with a block_layout, got {block_size!r}")
        layout = block_layout.to(device=q.device, dtype=torch.int8).contiguous()
        if block_tables is not None:
            _check_tables(block_tables, q.shape[2], k.shape[2], D)
            tables = tuple(block_tables)
        else:
            tables = build_sparse_tables(block_table_fn, D, q.device)
    args = (q, k, v, scale, wl, wr, layout, int(block_size), *tables, dq_mode or "", int(dkdv_split or 0))
    out, lse = _flash_fwd_op(*args) if torch.compiler.is_compiling() else _FlashFn.apply(q, k, v, args[3:])
    return (out, lse) if return_lse else out
