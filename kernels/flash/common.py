"""Constants and the ``@triton.jit`` mask helpers shared by the forward and backward kernels."""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MAX_HEAD_DIM = 256


def _cfg(bm, bn, w, s):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)


@triton.jit
def _allowed(i2, j2, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, dilation,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, DILATED: tl.constexpr,
             SINK: tl.constexpr):
    """Element rule of MaskInfo.allowed on broadcastable row / column index tensors. ``SPARSE``: 0 no layout; 1
    the layout byte of every element (gathered); 2 the tile lies inside one layout block, whose bit the block
    table's visit already implies (the launcher checks the alignment): no gather. ``DILATED``: also
    ``(i' - j) % dilation == 0``. ``SINK``: attention sinks (StreamingLLM), the first ``SINK`` keys pass the
    window's left edge (``j >= i' - left or j < SINK``; every other term still holds); 0: none (only with
    ``HAS_LEFT``: without a left edge the launchers pass 0)."""
    ia = i2 + offset
    ok = (j2 < Nk) & (i2 < Nq)
    if HAS_RIGHT:
        ok = ok & (j2 <= ia + win_right)
    if HAS_LEFT:
        if SINK > 0:
            ok = ok & ((j2 >= ia - win_left) | (j2 < SINK))
        else:
            ok = ok & (j2 >= ia - win_left)
    if DILATED:
        ok = ok & ((ia - j2) % dilation == 0)
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
def _tile_schedule(SECTION, LPT: tl.constexpr):
    """``(rank, bh)`` of this program in a grid ``(n_tiles, n_bh)`` whose tile rank 0 is each head's heaviest tile.

    ``LPT`` off: ``(program_id(0), program_id(1))``, so the launch order (x fastest) runs one (batch, head) after
    another, heaviest tile first within each. ``LPT`` on: longest-processing-time first within sections of
    ``SECTION`` (batch, head) pairs (the last section may be narrower): the launch runs rank 0 of every head of the
    section, then rank 1, ..., so the lightest tiles end the grid (no heavy tile starts last), while a section's
    K / V stay few enough for L2 (FlashAttention-3's causal scheduler does the same; ``SECTION >= n_bh`` is one
    section). A bijection of the grid for any ``SECTION >= 1``."""
    n_tiles = tl.num_programs(0)
    if LPT:
        n_bh = tl.num_programs(1)
        pid = tl.program_id(1) * n_tiles + tl.program_id(0)  # the launch order
        per = n_tiles * SECTION
        sec = pid // per
        r = pid - sec * per
        width = tl.minimum(SECTION, n_bh - sec * SECTION)
        rank = r // width
        bh = sec * SECTION + (r - rank * width)
    else:
        rank = tl.program_id(0)
        bh = tl.program_id(1)
    return rank, bh


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
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
             SINK: tl.constexpr):
    """Query tiles [lo, hi) that see key tile ``start_n`` and the full sub-range [flo, fhi). ``SINK`` > 0 (attention
    sinks, the keys ``j < SINK``): a key tile that holds sink keys is seen by every query tile from its causal start
    (the right edge's) to the end; one of sink keys only is full wherever the right edge and the bounds allow."""
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
        fhi_band = tl.minimum(fhi, tl.maximum(start_n + win_left - offset + 1, 0) // BLOCK_M)
        if SINK > 0:  # sink keys pass the left edge: the rows to the end see them
            hi_row = tl.where(start_n < SINK, Nq - 1, hi_row)
            fhi_band = tl.where(c1 < SINK, fhi, fhi_band)
        fhi = fhi_band
    lo = lo_row // BLOCK_M
    hi = tl.where(hi_row >= lo_row, tl.maximum(hi_row, 0) // BLOCK_M + 1, lo)
    fhi = tl.where(c1 - start_n + 1 == BLOCK_N, fhi, 0)
    flo = tl.minimum(tl.maximum(flo, lo), hi)
    fhi = tl.minimum(tl.maximum(fhi, flo), hi)
    return lo, hi, flo, fhi



# ------------------------------------------------------------------------------------------- packed documents
# The document part of the mask description: one int32 tensor per call, (B, 3 * Nq + 3 * Nk), per batch row
# [doc_q (Nq) | q_lo (Nq) | q_hi (Nq) | doc_k (Nk) | k_lo (Nk) | k_hi (Nk)] (kernels.flash.documents builds it):
# the document of each query row (-1: none) and the key span [q_lo, q_hi) of its document; the document of each key
# and the query rows [k_lo, k_hi) of its document. Documents are contiguous runs, so these spans are nondecreasing
# along the rows and a tile's span is [lo of its first row, hi of its last row).
@triton.jit
def _doc_ptrs(DOC, b, Nq, Nk):
    """Pointers to this batch row's ``doc_q``, ``q_lo``, ``q_hi``, ``doc_k``, ``k_lo``, ``k_hi``."""
    base = DOC + b.to(tl.int64) * (3 * (Nq + Nk))
    return base, base + Nq, base + 2 * Nq, base + 3 * Nq, base + 3 * Nq + Nk, base + 3 * Nq + 2 * Nk


@triton.jit
def _doc_ok(ok, DocQb, DocKb, i2, j2, Nq, Nk):
    """The element rule AND one document, on broadcastable row / column indices (rows / keys out of range: none)."""
    dq = tl.load(DocQb + i2, mask=i2 < Nq, other=-2)
    dk = tl.load(DocKb + j2, mask=j2 < Nk, other=-3)
    return ok & (dq == dk)


@triton.jit
def _doc_clip(lo, hi, flo, fhi, DocB, LoB, HiB, first, last, BLOCK: tl.constexpr):
    """The document clamp of :func:`_doc_kv_range` and :func:`_doc_q_range`: the tiles ``[lo, hi)`` / full
    ``[flo, fhi)`` (of ``BLOCK`` indices) visited by one tile whose first / last index is ``first`` / ``last``,
    intersected with its documents. ``DocB``, ``LoB``, ``HiB``: the visiting side's columns of the document table
    (``doc_q``, ``q_lo``, ``q_hi`` for a query tile visiting key tiles of ``BLOCK_N``; ``doc_k``, ``k_lo``, ``k_hi``
    for a key tile visiting query tiles of ``BLOCK_M``). Only the tiles of ``[LoB[first], HiB[last])`` are visited; a
    tile stays full only when ``first`` and ``last`` are in one document and the tile lies inside that document
    (else the element rule runs)."""
    slo = tl.load(LoB + first)
    shi = tl.load(HiB + last)
    uniform = tl.load(DocB + first) == tl.load(DocB + last)
    lo2 = tl.maximum(lo, slo // BLOCK)
    hi2 = tl.maximum(tl.minimum(hi, (shi + BLOCK - 1) // BLOCK), lo2)
    flo2 = tl.maximum(flo, (slo + BLOCK - 1) // BLOCK)
    fhi2 = tl.where(uniform, tl.minimum(fhi, shi // BLOCK), flo2)
    flo2 = tl.minimum(tl.maximum(flo2, lo2), hi2)
    fhi2 = tl.minimum(tl.maximum(fhi2, flo2), hi2)
    return lo2, hi2, flo2, fhi2


@triton.jit
def _doc_kv_range(lo, hi, flo, fhi, start_m, Nq, DocQb, QLob, QHib, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles ``[lo, hi)`` / full ``[flo, fhi)`` of query tile ``start_m`` intersected with its documents: only
    tiles of keys in ``[q_lo(first row), q_hi(last row))`` are visited; a tile stays full only when every row of the
    query tile is in one document and the key tile lies inside that document (else the element rule runs)."""
    r1 = tl.minimum(start_m + BLOCK_M, Nq) - 1
    lo2, hi2, flo2, fhi2 = _doc_clip(lo, hi, flo, fhi, DocQb, QLob, QHib, start_m, r1, BLOCK_N)
    return lo2, hi2, flo2, fhi2


@triton.jit
def _doc_q_range(lo, hi, flo, fhi, start_n, Nk, DocKb, KLob, KHib, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query tiles ``[lo, hi)`` / full ``[flo, fhi)`` of key tile ``start_n`` intersected with its documents (the
    transpose of :func:`_doc_kv_range`)."""
    c1 = tl.minimum(start_n + BLOCK_N, Nk) - 1
    lo2, hi2, flo2, fhi2 = _doc_clip(lo, hi, flo, fhi, DocKb, KLob, KHib, start_n, c1, BLOCK_M)
    return lo2, hi2, flo2, fhi2
