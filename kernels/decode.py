"""Fused Triton decode attention over a KV cache (contiguous or paged), split-K with a log-sum-exp merge.

Algorithm: FlashDecoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference"): the keys
of the cache are split over ``S`` programs per (sequence, K/V head); each runs the FlashAttention online softmax
over its share and writes a normalised partial output and its log-sum-exp; the ``S`` partials are then merged
(``out = sum_s exp(lse_s - lse) o_s``, ``lse = logsumexp_s lse_s``), in the last split of each (sequence, K/V
head) to finish (``merge="fused"``: an arrival counter that the merging program resets, one launch per step, the
default where a program holds one query row, which it merges alone; a program of several -- GQA heads, several new
tokens -- merges its whole row block at once) or in a second small kernel (``merge="kernel"``, the default for
multi-row programs; see :func:`decode_plan`). With ``S == 1`` the first
kernel writes the output directly. The key tiles of a (sequence,
K/V head) are spread evenly over its splits (shares differ by at most one tile) and ``S`` fills the SMs' resident
program slots a whole number of times (:func:`decode_num_splits`). Conventions follow ``flash_attn_with_kvcache``
(FlashAttention 2.x) in the ``(B, H, N, D)`` layout; the paged layout and the per-tile page-table lookup follow vLLM's
PagedAttention (Kwon et al. 2023).

Shapes (every tensor is read through its own strides; the last dim must be contiguous):

* ``q (B, Hq, Nq, D)``: ``Nq >= 1`` new tokens per sequence (already written to the cache).
* contiguous cache: ``k_cache, v_cache (B, Hkv, N_max, D)``;
  paged cache: ``k_cache, v_cache (num_pages, Hkv, page_size, D)`` and ``block_table (B, max_pages)`` int32
  (logical page ``p`` of sequence ``b`` is physical page ``block_table[b, p]``; pages may be in any order).
* ``cache_seqlens (B,)`` int32: valid tokens of each sequence (ragged), the ``Nq`` new tokens included.
  Query ``i`` of sequence ``b`` sits at absolute position ``cache_seqlens[b] - Nq + i``.

GQA / MQA: the ``G = Hq / Hkv`` query heads of a K/V group and the ``Nq`` queries are packed as the ``M``
dimension of one tile (row ``r = hh * Nq + i``), so every K/V tile is read from memory once per group.

Mask (the rule of ``attn_zoo.masks.MaskInfo.allowed`` with ``Nk = cache_seqlens[b]``), the conjunction of
``j < seqlen``, causal ``j <= i'``, window ``i' - left <= j <= i' + right`` and the block layout
``layout[i' // bs, j // bs]``; with ``sink_size`` (attention sinks, StreamingLLM) the window's left term is
``j >= i' - left or j < sink_size``. Tiles outside ``[i'_first - left, i'_last + right]``, sink tiles aside, are
never visited (window block skipping); block-sparse visits only the key tiles listed for the query's layout row
(:func:`decode_sparse_tables`; a query span that crosses a layout-block boundary makes one pass per layout
row, each pass restricted to that row's queries, so every (query, key) pair is counted once).

Precision: products in the input dtype with fp32 accumulation (fp32 inputs: ``ieee``), online softmax in
base 2 (``log2 e`` folded into the scale), partials and lse in fp32. Rows that see no key output 0 and have
``lse = -inf``.

Public API: :func:`decode_attn` (forward only, no autograd), :func:`decode_sparse_tables`, :func:`decode_block_n`,
:func:`decode_num_splits`, and the plain-PyTorch references :func:`decode_attn_reference` and
:func:`merge_partials_reference` beside the kernels.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._host import _interpreting, cdiv, check_bool, check_scale, check_sink_size, check_window_size, is_int, \
    next_pow2

NUM_WARPS = (1, 2, 4, 8, 16, 32)  # decode_plan's num_warps: Triton launches powers of two

__all__ = ["decode_attn", "decode_attn_reference", "decode_sparse_tables", "decode_block_n", "decode_num_splits",
           "merge_partials_reference", "DecodeSparse", "DecodePlan", "decode_plan", "decode_run", "MAX_HEAD_DIM"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MAX_HEAD_DIM = 256
MAX_HEAD_DIM_QK = 1024  # q.k head dim D and value head dim Dv of decode_attn (MLA latents: 576 / 512)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile_rows(BT, start, b, seqlen, sbt_b, skb, skn, svb, svn,
               PAGE_SIZE: tl.constexpr, PAGE_TILE: tl.constexpr, MULTI_PAGE: tl.constexpr, BN: tl.constexpr):
    """Row offsets ``(k_row, v_row)`` (int64, (BN,)) of the paged key tile ``[start, start + BN)`` of sequence ``b``
    (page-table entries at or past ``seqlen`` are not read: their rows are page 0's, masked by the K/V loads)."""
    offs_n = tl.arange(0, BN)
    if PAGE_TILE:  # the tile lies inside one page: one page-table lookup per tile
        page = tl.load(BT + b * sbt_b + start // PAGE_SIZE, mask=start < seqlen, other=0).to(tl.int64)
        slot = (start % PAGE_SIZE + offs_n).to(tl.int64)
        k_row = page * skb + slot * skn
        v_row = page * svb + slot * svn
    elif MULTI_PAGE:  # the tile covers BN / PAGE_SIZE whole pages: one page-table lookup per page
        pidx = start // PAGE_SIZE + tl.arange(0, BN // PAGE_SIZE)
        pg = tl.load(BT + b * sbt_b + pidx, mask=pidx * PAGE_SIZE < seqlen, other=0).to(tl.int64)
        slot = tl.arange(0, PAGE_SIZE).to(tl.int64)
        k_row = tl.reshape(pg[:, None] * skb + slot[None, :] * skn, [BN])  # key start + p * PAGE_SIZE + s
        v_row = tl.reshape(pg[:, None] * svb + slot[None, :] * svn, [BN])
    else:  # page sizes that neither divide the tile nor are a multiple of it: one lookup per key
        j = start + offs_n
        pages = tl.load(BT + b * sbt_b + j // PAGE_SIZE, mask=j < seqlen, other=0).to(tl.int64)
        slot = (j % PAGE_SIZE).to(tl.int64)
        k_row = pages * skb + slot * skn
        v_row = pages * svb + slot * svn
    return k_row, v_row


@triton.jit
def _attend_tile(acc, m_i, l_i, q, K, V, BT, LAY, k_row_in, v_row_in, start, b, g, seqlen, kfirst, pos, row_ok, qb_pass,
                 skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, qk_scale, window_left, window_right,
                 sparse_bs, D, DV,
                 PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_TILE: tl.constexpr, MULTI_PAGE: tl.constexpr,
                 CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
                 LEFTPAD: tl.constexpr, ROWS_GIVEN: tl.constexpr,
                 BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, DOT_PREC: tl.constexpr, SINK: tl.constexpr):
    """Online-softmax update of (acc, m_i, l_i) with the key tile ``[start, start + BN)`` of sequence ``b``.
    ``ROWS_GIVEN``: the tile's K/V row offsets are ``k_row_in`` / ``v_row_in`` (looked up one tile ahead). ``SINK``
    > 0 (with ``HAS_LEFT``): attention sinks, keys ``j < SINK`` pass the window's left edge."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    j = start + offs_n  # absolute key positions (BN,)
    kv_ok = j < seqlen
    if LEFTPAD:  # keys before the first key of the current document (cache_leftpad) are not seen
        kv_ok = kv_ok & (j >= kfirst)
    if ROWS_GIVEN:
        k_row = k_row_in
        v_row = v_row_in
    elif PAGED:  # the page-table lookups of this tile, in this iteration
        k_row, v_row = _tile_rows(BT, start, b, seqlen, sbt_b, skb, skn, svb, svn, PAGE_SIZE, PAGE_TILE, MULTI_PAGE, BN)
    else:
        k_row = b.to(tl.int64) * skb + j.to(tl.int64) * skn
        v_row = b.to(tl.int64) * svb + j.to(tl.int64) * svn
    dmask = offs_d < D
    kvm = kv_ok[:, None] & dmask[None, :]
    k = tl.load(K + (k_row + g * skh)[:, None] + offs_d[None, :], mask=kvm, other=0.0)  # (BN, BD)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # (BM, BN), log2 units
    ok = row_ok[:, None] & kv_ok[None, :]
    if CAUSAL:
        ok = ok & (j[None, :] <= pos[:, None])
    if HAS_LEFT:
        if SINK > 0:
            ok = ok & ((j[None, :] >= pos[:, None] - window_left) | (j[None, :] < SINK))
        else:
            ok = ok & (j[None, :] >= pos[:, None] - window_left)
    if HAS_RIGHT:
        ok = ok & (j[None, :] <= pos[:, None] + window_right)
    if SPARSE:
        qbr = pos // sparse_bs
        lay = tl.load(LAY + b * slay_b + qbr[:, None] * slay_q + (j // sparse_bs)[None, :], mask=ok, other=0)
        ok = ok & (lay != 0) & (qbr == qb_pass)[:, None]
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    # keys no row of this tile sees (outside the window / layout, past the sequence) are not loaded: a NaN / inf
    # there would reach acc as 0 * NaN through the p @ v product (K needs nothing: their scores are set to -inf)
    seen = tl.max(ok.to(tl.int32), 0) > 0  # (BN,)
    v = tl.load(V + (v_row + g * svh)[:, None] + offs_dv[None, :], mask=seen[:, None] & (offs_dv < DV)[None, :],
                other=0.0)  # (BN, BDV)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _decode_fwd(
    Q, K, V, SEQ, KFIRST, BT, LAY, TIDX, TCNT, O, LSE, OP, LP, CNT,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, stab_b, stab_q, scnt_b,
    Hq, Hkv, Nq, D, DV, G, R, n_splits, qk_scale, window_left, window_right, sparse_bs,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_TILE: tl.constexpr, MULTI_PAGE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, LEFTPAD: tl.constexpr,
    PREFETCH: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr,
    MERGE_RP: tl.constexpr, MERGE_NU: tl.constexpr, MERGE_SC: tl.constexpr,
    STORE_LSE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    DOT_PREC: tl.constexpr, PDL: tl.constexpr = False, SINK: tl.constexpr = 0,
):
    """Grid ``(S, B * Hkv, cdiv(G * Nq, BM))``: split ``s`` of the visited key tiles of one K/V head of one
    sequence, for ``BM`` packed (query head, query) rows. Writes the output (``S == 1``) or fp32 partials
    ``OP (S, R, D)`` normalised by their own sum and ``LP (S, R)`` their lse in log2 units, ``R = B*Hq*Nq``.
    ``SINK`` > 0 (attention sinks, only with ``HAS_LEFT`` and without ``SPARSE``): the key tiles of ``j < SINK`` left
    of the visited range are spread over the splits too (each split its share of them, then its share of the
    range)."""
    if PDL:  # the merge kernel (launched with programmatic dependent launch) may start; it waits for this grid
        gdc_launch_dependents()
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = pid_bh // Hkv
    g = pid_bh % Hkv
    seqlen = tl.load(SEQ + b)
    kfirst = 0
    if LEFTPAD:
        kfirst = tl.load(KFIRST + b)
    r = pid_m * BM + tl.arange(0, BM)
    row_ok = r < G * Nq
    hh = r // Nq
    qi = r % Nq
    h = g * G + hh
    pos = seqlen - Nq + qi  # absolute position of each row's query
    offs_d = tl.arange(0, BD)
    qmask = row_ok[:, None] & (offs_d[None, :] < D)
    q_ptr = Q + b.to(tl.int64) * sqb + (h * sqh + qi * sqn)[:, None] + offs_d[None, :]
    q = tl.load(q_ptr, mask=qmask, other=0.0)  # (BM, BD)

    offs_dv = tl.arange(0, BDV)
    omask = row_ok[:, None] & (offs_dv[None, :] < DV)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    first = seqlen - Nq  # position of the first query
    hi = seqlen  # (a right window never ends before the last query's position, seqlen - 1)
    if SPARSE:
        qb0 = first // sparse_bs
        qb1 = (seqlen - 1) // sparse_bs
        for qb in range(qb0, qb1 + 1):
            cnt = tl.load(TCNT + b * scnt_b + qb)
            e0 = (cnt * pid_s) // n_splits  # balanced: the splits' shares differ by at most one tile
            e1 = (cnt * (pid_s + 1)) // n_splits
            for e in range(e0, e1):
                t = tl.load(TIDX + b * stab_b + qb * stab_q + e)
                if t * BN < hi:
                    acc, m_i, l_i = _attend_tile(
                        acc, m_i, l_i, q, K, V, BT, LAY, 0, 0, t * BN, b, g, seqlen, kfirst, pos, row_ok, qb,
                        skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, qk_scale, window_left, window_right,
                        sparse_bs, D, DV, PAGED, PAGE_SIZE, PAGE_TILE, MULTI_PAGE, CAUSAL, HAS_LEFT, HAS_RIGHT, SPARSE,
                        LEFTPAD, False, BN, BD, BDV,
                        DOT_PREC, SINK)
    else:
        lo = kfirst
        if HAS_LEFT:  # the FIRST query's window starts the visited range (the last query's starts later)
            lo = tl.maximum(first - window_left, lo)
        t0 = lo // BN
        t1 = tl.cdiv(hi, BN)
        nt = tl.maximum(t1 - t0, 0)
        if SINK > 0:  # the sink tiles [kfirst // BN, cdiv(SINK, BN)) left of t0, split as evenly (looked up per tile)
            s0 = kfirst // BN
            ns = tl.maximum(tl.minimum((SINK + BN - 1) // BN, t0) - s0, 0)
            for t in range(s0 + (ns * pid_s) // n_splits, s0 + (ns * (pid_s + 1)) // n_splits):
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, q, K, V, BT, LAY, 0, 0, t * BN, b, g, seqlen, kfirst, pos, row_ok, 0,
                    skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, qk_scale, window_left, window_right,
                    sparse_bs, D, DV, PAGED, PAGE_SIZE, PAGE_TILE, MULTI_PAGE, CAUSAL, HAS_LEFT, HAS_RIGHT, SPARSE,
                    LEFTPAD, False, BN, BD, BDV, DOT_PREC, SINK)
        ta = t0 + (nt * pid_s) // n_splits  # balanced: the splits' shares differ by at most one tile
        tb = t0 + (nt * (pid_s + 1)) // n_splits
        if PREFETCH:  # page-table lookups one tile ahead: a tile's K/V addresses come from the previous iteration
            lim = tl.minimum(seqlen, tb * BN)
            k_row, v_row = _tile_rows(BT, ta * BN, b, lim, sbt_b, skb, skn, svb, svn, PAGE_SIZE, PAGE_TILE, False, BN)
            for t in range(ta, tb):
                k_nx, v_nx = _tile_rows(BT, (t + 1) * BN, b, lim, sbt_b, skb, skn, svb, svn, PAGE_SIZE, PAGE_TILE,
                                        False, BN)
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, q, K, V, BT, LAY, k_row, v_row, t * BN, b, g, seqlen, kfirst, pos, row_ok, 0,
                    skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, qk_scale, window_left, window_right,
                    sparse_bs, D, DV, PAGED, PAGE_SIZE, PAGE_TILE, MULTI_PAGE, CAUSAL, HAS_LEFT, HAS_RIGHT, SPARSE,
                    LEFTPAD, True, BN, BD, BDV, DOT_PREC, SINK)
                k_row = k_nx
                v_row = v_nx
        else:
            for t in range(ta, tb):
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, q, K, V, BT, LAY, 0, 0, t * BN, b, g, seqlen, kfirst, pos, row_ok, 0,
                    skb, skh, skn, svb, svh, svn, sbt_b, slay_b, slay_q, qk_scale, window_left, window_right,
                    sparse_bs, D, DV, PAGED, PAGE_SIZE, PAGE_TILE, MULTI_PAGE, CAUSAL, HAS_LEFT, HAS_RIGHT, SPARSE,
                    LEFTPAD, False, BN, BD, BDV, DOT_PREC, SINK)

    has = l_i > 0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    o = acc * inv[:, None]
    lse2 = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    row = ((b * Hq + h) * Nq + qi).to(tl.int64)  # row of the (B, Hq, Nq) output
    if SPLIT:
        prow = pid_s.to(tl.int64) * R + row
        tl.store(OP + prow[:, None] * DV + offs_dv[None, :], o, mask=omask)
        tl.store(LP + prow, lse2, mask=row_ok)
        if FUSED_MERGE:  # the last split of this (sequence, K/V head, row block) to finish merges all of them
            tl.debug_barrier()  # every thread's partial stores precede the release below
            cid = pid_bh * tl.num_programs(2) + pid_m
            arrived = tl.atomic_add(CNT + cid, 1, sem="acq_rel")  # release our partials, acquire the others'
            if arrived == n_splits - 1:
                dvm = offs_dv < DV
                if MERGE_ROWS:
                    # the whole row block at once, its padding reused: slot j of a (BM, BDV) block holds row
                    # j % MERGE_RP of one split; slot group u = j // MERGE_RP merges splits u, u + NU, u + 2 NU, ...
                    # (NU = MERGE_NU = BM / MERGE_RP groups; MERGE_SC blocks per round, unrolled so that their
                    # loads -- .cg: past this SM's L1, where other SMs wrote -- are in flight together), each slot
                    # with the online max / rescale in log2 units of the single-row path below; then the NU groups
                    # are combined per row. The cost does not grow with G * Nq (below one block of rows).
                    jj = tl.arange(0, BM)
                    ju = jj // MERGE_RP
                    rj = pid_m * BM + jj % MERGE_RP
                    rj_ok = rj < G * Nq
                    row0 = ((b * Hq + g * G) * Nq).to(tl.int64)  # output row of the K/V head's first query row
                    srow = row0 + ju.to(tl.int64) * R + rj  # (BM,) the slot's row of the partials, first round
                    lp_ptr = LP + srow
                    op_ptr = OP + srow[:, None] * DV + offs_dv[None, :]
                    step = (row0 * 0 + R * MERGE_NU) * DV  # int64: MERGE_NU splits further
                    mm = tl.full([BM], float("-inf"), dtype=tl.float32)
                    ll = tl.zeros([BM], dtype=tl.float32)
                    oo = tl.zeros([BM, BDV], dtype=tl.float32)
                    for s0 in range(0, n_splits, MERGE_NU * MERGE_SC):
                        for u2 in tl.static_range(MERGE_SC):
                            sm = rj_ok & ((ju + (s0 + u2 * MERGE_NU)) < n_splits)  # (BM,)
                            ls = tl.load(lp_ptr, mask=sm, other=float("-inf"), cache_modifier=".cg")
                            os_ = tl.load(op_ptr, mask=sm[:, None] & dvm[None, :], other=0.0,
                                          cache_modifier=".cg")  # (BM, BDV)
                            lp_ptr += R * MERGE_NU
                            op_ptr += step
                            m_new = tl.maximum(mm, ls)
                            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                            a = tl.math.exp2(mm - m_use)
                            w = tl.math.exp2(ls - m_use)  # 0 for empty splits and padding slots
                            ll = ll * a + w
                            oo = oo * a[:, None] + w[:, None] * os_
                            mm = m_new
                    offs_r = tl.arange(0, MERGE_RP)
                    if MERGE_NU == 1:
                        mt = mm
                        lt = ll
                        ot = oo
                    else:  # combine the MERGE_NU slot groups of each row
                        mm3 = tl.reshape(mm, [MERGE_NU, MERGE_RP])
                        mt = tl.max(mm3, 0)  # (RP,)
                        f = tl.math.exp2(mm3 - tl.where(mt == float("-inf"), 0.0, mt)[None, :])  # (MERGE_NU, RP)
                        lt = tl.sum(tl.reshape(ll, [MERGE_NU, MERGE_RP]) * f, 0)
                        ot = tl.sum(tl.reshape(oo, [MERGE_NU, MERGE_RP, BDV]) * f[:, :, None], 0)  # (RP, BDV)
                    rr_ok = (pid_m * BM + offs_r) < G * Nq
                    orow = row0 + pid_m * BM + offs_r
                    ok_l = lt > 0
                    tl.store(O + orow[:, None] * DV + offs_dv[None, :],
                             (ot / tl.where(ok_l, lt, 1.0)[:, None]).to(O.dtype.element_ty),
                             mask=rr_ok[:, None] & dvm[None, :])
                    if STORE_LSE:
                        tl.store(LSE + orow, tl.where(ok_l, (mt + tl.math.log2(tl.where(ok_l, lt, 1.0)))
                                                      * 0.6931471805599453, float("-inf")), mask=rr_ok)
                else:
                    # one output row at a time (one-row programs: MHA with one new token), up to MERGE_SC splits'
                    # partials per round trip to L2 (.cg: past this SM's L1, where other SMs wrote)
                    offs_c = tl.arange(0, MERGE_SC)
                    r_lo = pid_m * BM
                    r_hi = tl.minimum(r_lo + BM, G * Nq)
                    for rr in range(r_lo, r_hi):
                        orow = ((b * Hq + g * G + rr // Nq) * Nq + rr % Nq).to(tl.int64)
                        mm = tl.max(tl.full([MERGE_SC], float("-inf"), dtype=tl.float32), 0)
                        ll = tl.sum(tl.zeros([MERGE_SC], dtype=tl.float32), 0)
                        oo = tl.zeros([BDV], dtype=tl.float32)
                        for s0 in range(0, n_splits, MERGE_SC):
                            sidx = s0 + offs_c
                            sm = sidx < n_splits
                            mrow = sidx.to(tl.int64) * R + orow
                            ls = tl.load(LP + mrow, mask=sm, other=float("-inf"), cache_modifier=".cg")
                            os_ = tl.load(OP + mrow[:, None] * DV + offs_dv[None, :], mask=sm[:, None] & dvm[None, :],
                                          other=0.0, cache_modifier=".cg")  # (SC, BDV)
                            m_new = tl.maximum(mm, tl.max(ls, 0))
                            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                            a = tl.math.exp2(mm - m_use)
                            w = tl.math.exp2(ls - m_use)  # 0 for empty splits
                            ll = ll * a + tl.sum(w, 0)
                            oo = oo * a + tl.sum(w[:, None] * os_, 0)
                            mm = m_new
                        ok_l = ll > 0
                        tl.store(O + orow * DV + offs_dv, (oo / tl.where(ok_l, ll, 1.0)).to(O.dtype.element_ty),
                                 mask=dvm)
                        if STORE_LSE:
                            tl.store(LSE + orow, tl.where(ok_l, (mm + tl.math.log2(tl.where(ok_l, ll, 1.0)))
                                                          * 0.6931471805599453, float("-inf")))
                tl.store(CNT + cid, 0)  # reset for the next launch (CUDA-graph replays): every split has arrived
    else:
        tl.store(O + row[:, None] * DV + offs_dv[None, :], o.to(O.dtype.element_ty), mask=omask)
        if STORE_LSE:
            tl.store(LSE + row, lse2 * 0.6931471805599453, mask=row_ok)


@triton.jit
def _decode_merge(OP, LP, O, LSE, R, S, D, BS: tl.constexpr, BD: tl.constexpr, STORE_LSE: tl.constexpr,
                  PDL: tl.constexpr = False):
    """One output row: ``out = sum_s w_s o_s / sum_s w_s`` with ``w_s = exp2(lse_s - max lse)``. ``PDL``: launched
    with programmatic dependent launch, so its programs start while the split kernel runs and wait here until its
    partials are written and visible."""
    if PDL:
        gdc_wait()
    r = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BS)
    offs_d = tl.arange(0, BD)
    sm = offs_s < S
    lse = tl.load(LP + offs_s.to(tl.int64) * R + r, mask=sm, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.math.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))
    tot = tl.sum(w, 0)
    om = sm[:, None] & (offs_d[None, :] < D)
    o = tl.load(OP + (offs_s.to(tl.int64) * R + r)[:, None] * D + offs_d[None, :], mask=om, other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(tot > 0, tot, 1.0)
    tl.store(O + r * D + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D)
    if STORE_LSE:
        tl.store(LSE + r, tl.where(tot > 0, (mx + tl.math.log2(tl.where(tot > 0, tot, 1.0))) * 0.6931471805599453, float("-inf")))


# --------------------------------------------------------------------------------------------- host side
class DecodeSparse(NamedTuple):
    """Block-sparse description for :func:`decode_attn`.

    layout: ``(nb, nb)`` (one layout for every sequence; causal layouts are prefix-consistent) or
        ``(B, nb, nb)`` (one per sequence), bool / int8, over absolute-position blocks of ``block_size``
        tokens; ``nb * block_size`` must cover the cache capacity.
    block_size: tokens per layout block.
    tables: ``(tile_idx, tile_cnt)`` from :func:`decode_sparse_tables` at the kernel's ``block_n`` (built when
        ``None``).
    """

    layout: torch.Tensor
    block_size: int
    tables: Optional[Tuple[torch.Tensor, torch.Tensor]] = None


def decode_block_n(head_dim: int, page_size: Optional[int] = None) -> int:
    """Key-tile size of the decode kernel: 64 (32 for ``head_dim > 128``), whatever the page size: pages that are a
    multiple of the tile take one page-table lookup per tile, pages that divide it one lookup per page (a tile
    gathers ``block_n / page_size`` whole pages), other page sizes one lookup per key. (Shrinking the tile to 16-token pages halved the bandwidth: 0.37 of copy bandwidth against 0.69 with
    64-key tiles over 16-token pages, H200, GQA 32:8, batch 4, 32k context, ``results/h200/2026-12-03/decode_probe.csv``.)
    ``page_size`` is kept for callers; it no longer changes the tile. Head dims above 256 (MLA's latent, 576):
    16 (untuned)."""
    del page_size
    return 64 if head_dim <= 128 else 32 if head_dim <= 256 else 16


def decode_sparse_tables(layout: torch.Tensor, block_size: int, block_n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Visited key tiles of every layout row, at the kernel's tile size ``block_n`` (plain PyTorch).

    Args:
        layout: bool / int ``(..., nb, nb)``; ``layout[a, c]``: query block ``a`` may attend key block ``c``.
        block_size: tokens per layout block; block_n: keys per kernel tile.

    Returns:
        ``tile_idx`` int32 ``(..., nb, max_visits)``: for layout row ``a`` the tiles ``t`` (keys
        ``[t * block_n, (t + 1) * block_n)``) that overlap an allowed key block, increasing, padded with 0;
        ``tile_cnt`` int32 ``(..., nb)``: number of valid entries. Computed from a prefix sum over key blocks
        (``O(nb * n_tiles)``), never at token granularity.
    """
    lay = layout.to(torch.bool)
    nb = lay.shape[-1]
    nt = cdiv(nb * block_size, block_n)
    t = torch.arange(nt, device=lay.device)
    kb0 = (t * block_n) // block_size
    kb1 = torch.clamp((t * block_n + block_n - 1) // block_size, max=nb - 1)
    cs = torch.nn.functional.pad(lay.to(torch.int32).cumsum(-1), (1, 0))  # (..., nb, nb + 1)
    vis = (cs[..., kb1 + 1] - cs[..., kb0]) > 0  # (..., nb, nt)
    cnt = vis.sum(-1)
    maxv = max(int(cnt.max()) if cnt.numel() else 0, 1)
    order = torch.sort((~vis).to(torch.int8), dim=-1, stable=True).indices[..., :maxv]
    valid = torch.arange(maxv, device=lay.device) < cnt.unsqueeze(-1)
    idx = torch.where(valid, order, torch.zeros_like(order))
    return idx.to(torch.int32).contiguous(), cnt.to(torch.int32).contiguous()


_SMS = {}
_DUMMY = {}


def _sm_count(device: torch.device) -> int:
    key = str(device)
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return _SMS[key]


def _dummy(device: torch.device) -> torch.Tensor:
    """A one-element int32 tensor for unused pointer arguments (allocated once per device)."""
    key = str(device)
    if key not in _DUMMY:
        _DUMMY[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _DUMMY[key]


def decode_num_splits(n_programs: int, max_tiles: int, sm_count: int, min_tiles_per_split: int = 4,
                      max_splits: int = 64, rule: str = "waves", programs_per_sm: int = 3,
                      program_cost_tiles: float = 2.0) -> int:
    """FlashDecoding split count ``S`` for ``n_programs`` (sequence, K/V head, row block) work items of at most
    ``max_tiles`` key tiles each, ``1 <= S <= max_splits``, at least ``min_tiles_per_split`` tiles per split.

    ``rule="waves"`` (the default): the ``S`` that minimises the modelled time of a memory-bound grid, ``waves(S) *
    (cdiv(max_tiles, S) + program_cost_tiles)``, with ``waves(S) = cdiv(n_programs * S, sm_count * programs_per_sm)``
    (``programs_per_sm``: programs resident per SM, 3 for 64-key tiles of D 128 in 3 stages: 72 KB of shared memory
    each; ``program_cost_tiles``: a program's fixed cost -- start, pipeline ramp, partial store and merge -- in
    tiles); ties go to fewer splits. It fills the resident slots a whole number of times (wave quantization: 36 splits
    x 32 heads = 1152 programs are 2.9 waves of 396 slots) with splits as long as that allows; the kernel spreads the
    tiles evenly over the splits (shares differ by at most one tile). Grids of ``n_programs >= 2 * sm_count`` keep
    ``S = 1`` as the legacy rule does (measured at 0.95-1.05 of copy bandwidth, batch >= 16). ``rule="legacy"``: enough programs for two
    waves of ``sm_count`` (the rule before 2026-12-04). ``ValueError`` for another ``rule``."""
    if rule not in ("waves", "legacy"):
        raise ValueError(f"split_rule={rule!r} is not supported; allowed values: 'waves', 'legacy'")
    n = max(n_programs, 1)
    tiles = max(max_tiles, 1)
    cap = max(1, min(cdiv(tiles, max(min_tiles_per_split, 1)), max_splits))
    if rule == "legacy":
        return int(max(1, min(cdiv(2 * sm_count, n), cap)))
    if n >= 2 * sm_count:  # large grids keep one split: 0.95-1.05 of copy bandwidth at batch >= 16 (H200)
        return 1
    slots = max(sm_count * max(programs_per_sm, 1), 1)
    best, best_cost = 1, None
    for s in range(1, cap + 1):
        cost = cdiv(n * s, slots) * (cdiv(tiles, s) + program_cost_tiles)
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return int(best)


def _programs_per_sm(block_n: int, bd: int, bdv: int, num_stages: int, itemsize: int, num_warps: int) -> int:
    """Programs of :func:`_decode_fwd` resident per SM (H100 / H200: 227 KB of shared memory, 64 warps): the K/V
    tiles buffered ``max(num_stages - 1, 1)`` deep plus ~8 KB of other shared memory."""
    smem = max(num_stages - 1, 1) * block_n * (bd + bdv) * itemsize + 8192
    return int(max(1, min(227 * 1024 // smem, 64 // max(num_warps, 1))))


def _check(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad=None):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head) dim, got strides {t.stride()}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must agree in every dim "
                         f"but the last (the value head dim Dv may differ from D)")
    B, Hq, Nq, D = q.shape
    if k_cache.shape[3] != D:
        raise ValueError(f"head dims differ: q D={D}, k_cache D={k_cache.shape[3]}")
    if max(D, v_cache.shape[3]) > MAX_HEAD_DIM_QK:
        raise ValueError(f"head dims D={D}, Dv={v_cache.shape[3]}: at most {MAX_HEAD_DIM_QK} are supported")
    Hkv = k_cache.shape[1]
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (k_cache.shape[1])")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens must be int32 of shape ({B},), got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if cache_leftpad is not None and (not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32
                                      or cache_leftpad.shape != (B,)):
        raise ValueError(f"cache_leftpad must be int32 of shape ({B},), got {getattr(cache_leftpad, 'dtype', None)} "
                         f"{tuple(getattr(cache_leftpad, 'shape', ()))}")
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"contiguous k_cache batch {k_cache.shape[0]} != q batch {B}")
    elif block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must be int32 of shape ({B}, max_pages), got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")


class DecodePlan:
    """Everything :func:`decode_run` needs that does not change from one decode step to the next (FlashInfer's
    ``plan`` / ``run`` split): launch grid, split-K count ``S`` (sized to fill ``sm_count`` SMs), tile sizes, the
    mask's constants, the sparse tables on the device, and the buffers (output, lse, fp32 split-K partials),
    allocated once here. Made by :func:`decode_plan`; attributes are read-only by convention.

    ``out (B, Hq, Nq, Dv)`` / ``lse (B, Hq, Nq)`` are the plan's own output buffers: :func:`decode_run` writes into
    them (or into the ``out`` / ``lse`` it is given) and returns them, so two runs of one plan share storage (copy a
    result you keep). ``scratch`` is ``(op (S, R, Dv) fp32, lp (S, R) fp32)`` or ``None`` when ``S == 1``.
    ``merge_rows`` / ``merge_rp`` / ``merge_sc``: how the fused merge reads the partials (one row at a time, or the
    row block with ``merge_rp`` row slots per split and ``merge_sc`` blocks per round trip; see :func:`decode_plan`).
    ``owner``: ``None``, or what the caller planned for (``attn_zoo``'s ``make_decode_plan`` sets the spec, and
    refuses a step with another one: the plan's mask constants would be used for it in silence).
    """

    __slots__ = ("B", "Hq", "Hkv", "Nq", "D", "Dv", "dtype", "device", "paged", "page_size", "capacity", "max_pages",
                 "block_n", "block_m", "BD", "BDV", "n_m", "num_splits", "causal", "left", "right", "scale", "has_leftpad",
                 "return_lse", "is_sparse", "sparse_bs", "lay", "tidx", "tcnt", "out", "lse", "scratch", "num_warps", "num_stages",
                 "sm_count", "page_gather", "merge", "split_rule", "counter", "max_registers", "merge_rows", "merge_rp", "pdl",
                 "merge_sc", "owner", "sink")

    def __repr__(self):
        return (f"DecodePlan(B={self.B}, Hq={self.Hq}, Hkv={self.Hkv}, Nq={self.Nq}, D={self.D}, Dv={self.Dv}, "
                f"paged={self.paged}, page_size={self.page_size}, block_n={self.block_n}, block_m={self.block_m}, "
                f"num_splits={self.num_splits}, grid={self.grid}, sm_count={self.sm_count}, merge={self.merge!r}, "
                f"split_rule={self.split_rule!r}, page_gather={self.page_gather!r})")

    @property
    def grid(self) -> Tuple[int, int, int]:
        return (self.num_splits, self.B * self.Hkv, self.n_m)


def decode_plan(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: Optional[torch.Tensor] = None, *,
    causal: bool = True, window_size: Optional[Tuple[Optional[int], Optional[int]]] = None,
    softmax_scale: Optional[float] = None, sparse: Optional["DecodeSparse"] = None, num_splits: Optional[int] = None,
    block_n: Optional[int] = None, return_lse: bool = False, has_leftpad: bool = False,
    sm_count: Optional[int] = None, num_warps: int = 4, num_stages: int = 3, page_gather: str = "prefetch",
    merge: str = "auto", split_rule: str = "auto", max_registers="auto", pdl=False, sink_size: int = 0,
) -> DecodePlan:
    """Host-side plan of :func:`decode_run`, made once per batch shape / cache layout / mask (no device sync).

    ``q``, ``k_cache``, ``v_cache``, ``block_table`` give shapes, dtype, device and the cache layout only (their
    values are not read; ``q`` may be any tensor of the step's shape). ``sm_count``: SMs to fill with the split-K
    programs (default: read from the CUDA device, 132 on an H200; 4 on CPU). ``has_leftpad``: the runs pass a
    ``cache_leftpad``. ``page_gather``: how a key tile over pages smaller than it finds its rows: ``"prefetch"`` (the
    default since 2026-12-04: one page-table lookup per key, made one tile ahead -- tile ``t + 1``'s row offsets are
    loaded in iteration ``t`` and carried -- so a tile's K/V loads never wait on a page-table load of their own
    iteration: compiled for sm_90a on triton 3.6 and 3.9 its K/V tiles are multi-buffered by cp.async exactly as the
    contiguous kernel's, 72 KB of shared memory, ``python -m lab.decode_pipeline_check``), ``"key"`` (the per-key
    lookups in the tile's own iteration: one K/V buffer, 39 KB; the default before, 0.61-0.90 of copy bandwidth on 16-
    and 32-token pages, H200, 2026-12-04) or ``"page"`` (one lookup per page, the tile gathered as ``block_n /
    page_size`` whole pages: triton 3.6 does not pipeline it, 0.32-0.48); block-sparse plans look up per key in the
    tile's iteration. ``merge`` and ``split_rule`` default to ``"auto"``: ``split_rule="waves"`` for every plan,
    ``merge="fused"`` where a program holds one query row (``G * Nq == 1``: MHA, one new token) and ``"kernel"``
    where it holds several (GQA, several new tokens). Measured on the H200 (``python -m lab.decode_probe --compare
    --set gqa2 --calls-per-graph 10``, 2026-12-04, docs/results.md; fractions of copy bandwidth, 10 calls per CUDA
    graph): the merge kernel with the waves split count took GQA 32:8 at batch 4 and 16k from 0.83 (merge kernel,
    legacy split) to 0.91, on pages of 16 / 32 from 0.76 / 0.79 to 0.87 / 0.88, at batch 1 and 64k on pages of 16
    from 0.83 to 0.87, and kept batch 1 contiguous at 0.91 (32:8, 64k; 0.93 before), 0.98 (64:8, 128k; 1.00) and 4
    new queries at 0.88 (0.91); the fused merge, even merging its row block at once (below), was 3-8 % slower than
    the merge kernel at the same split count for multi-row programs (23 % with 4 new queries): its last program
    merges while the other SMs idle. The multi-row plan of the morning of 2026-12-04 is ``merge="kernel",
    split_rule="legacy"`` (with ``max_registers="auto"`` that is also its register setting). ``merge``: ``"fused"`` (the last split of
    each (sequence, K/V head, row block) to finish -- an int32 arrival counter in the plan, ``atomic_add`` with
    acquire-release order after the split's partial stores -- merges the partials and writes the output, then resets
    its counter to 0, so one launch per step and CUDA-graph replays start from a clean counter; two runs of one plan
    must not overlap in time, e.g. on two streams; a program of one query row merges it with all ``S`` partials per
    round trip to L2, a program of several merges its whole ``(block_m, Dv)`` row block at once with the online max /
    rescale in log2 units: ``merge_rp`` row slots per split -- the next power of two of ``G * Nq``, at most
    ``block_m``, so the padding rows of a small group hold further splits (GQA 32:8: 4 splits per 16-row block) --
    and ``merge_sc`` blocks per round trip, their loads unrolled -- 2, or 1 for blocks of 8192 fp32 or more) or
    ``"kernel"`` (a second launch, :func:`_decode_merge`). ``split_rule``: ``"waves"`` or ``"legacy"`` (:func:`decode_num_splits`;
    resident programs per SM estimated from the K/V buffers in shared memory).
    ``max_registers``: ``"auto"`` (default: none where a program holds several query rows -- compiled for sm_90a on
    triton 3.6 its GQA kernels with the row-block merge take 158-168 registers without a cap, so 3 programs stay
    resident anyway, and at a cap of 168 the contiguous GQA 32:8 kernel spills 16 bytes outside its key loop,
    ``lab/decode_pipeline_check.py``; else at most ``65536 / (programs per SM x num_warps x 32)`` registers per
    thread, rounded down to 8, where that is >= 160 and the tile at most 16 rows x 64 keys x 128 dims: 168 for
    64-key tiles of D 128 in 3 stages, so 3 programs stay resident; the per-key paged kernels take 182-220 without it
    on triton 3.6 and none spills at 168, where 128-key or 32-row tiles would), ``None`` (the compiler's choice) or
    an int (Triton's ``maxnreg``).
    ``pdl``: launch the merge kernel (``merge="kernel"``, ``S > 1``) with programmatic dependent launch (CUDA's
    PDL, Hopper and later): its programs are scheduled while the split kernel runs and wait in-kernel
    (``griddepcontrol.wait``) until the partials are written, so the second launch's latency overlaps the first
    kernel's tail. ``False`` (default), ``True`` or ``"auto"`` (on a CUDA device of compute capability >= 9.0, not
    under the interpreter). Measured on the H200 (2026-12-04, ``lab.decode_probe --compare --set pdl``, 10 calls
    per CUDA graph): no gain -- within +-0.01 of copy bandwidth on contiguous caches, and 0.80-0.82 against
    0.86 on GQA pages at batch 4 -- so it is off by default.
    ``sink_size``: attention sinks (as :func:`decode_attn`); the plan's ``sink`` (0 without a left window edge).
    Other arguments as :func:`decode_attn`. Allocates the output, lse and split-K buffers (and the counter).

    Raises ``ValueError`` / ``TypeError`` as :func:`decode_attn`; ``ValueError`` for bf16 under the CPU interpreter
    (``TRITON_INTERPRET=1``, whose bf16 ``tl.dot`` is wrong); ``ValueError`` naming ``page_gather``, ``merge``,
    ``split_rule``, ``max_registers`` or ``pdl`` for a value other than those above, ``num_warps`` other than 1, 2,
    4, 8, 16, 32, ``num_stages`` other than an integer >= 1, ``causal`` / ``return_lse`` / ``has_leftpad`` other
    than a bool, ``window_size`` other than ``None`` or a pair of ints >= 0 / ``None``, ``softmax_scale`` other
    than ``None`` or a finite float > 0, ``num_splits`` / ``block_n`` / ``sm_count`` other than ``None`` or an
    integer >= 1; ``sink_size`` other than an integer >= 0, or > 0 with ``sparse``.
    """
    if q.dtype == torch.bfloat16 and _interpreting():  # (decode_attn and every plan come here)
        raise ValueError("q.dtype=torch.bfloat16 is not supported under the CPU interpreter (TRITON_INTERPRET=1: its "
                         "bf16 tl.dot is wrong); allowed values there: float16, float32")
    if page_gather not in ("key", "page", "prefetch"):
        raise ValueError(f"page_gather={page_gather!r} is not supported; allowed values: 'key', 'page', 'prefetch'")
    if merge not in ("auto", "fused", "kernel"):
        raise ValueError(f"merge={merge!r} is not supported; allowed values: 'auto', 'fused', 'kernel'")
    if split_rule not in ("auto", "waves", "legacy"):
        raise ValueError(f"split_rule={split_rule!r} is not supported; allowed values: 'auto', 'waves', 'legacy'")
    if not (pdl == "auto" or isinstance(pdl, bool)):
        raise ValueError(f"pdl={pdl!r} is not supported; allowed values: 'auto', True, False")
    if isinstance(num_warps, bool) or not isinstance(num_warps, numbers.Integral) or num_warps not in NUM_WARPS:
        raise ValueError(f"num_warps={num_warps!r} is not supported; allowed values: {', '.join(map(str, NUM_WARPS))}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, numbers.Integral) or num_stages < 1:
        raise ValueError(f"num_stages={num_stages!r} must be an integer >= 1")
    num_warps, num_stages = int(num_warps), int(num_stages)
    check_bool("causal", causal)
    left, right = check_window_size(window_size)
    check_scale("softmax_scale", softmax_scale)
    check_bool("return_lse", return_lse)
    check_bool("has_leftpad", has_leftpad)
    sink = check_sink_size(sink_size)
    if sink and sparse is not None:
        raise ValueError(f"sink_size={sink} cannot be combined with sparse (a block layout): attention sinks run with "
                         f"causal and sliding-window masks only; allowed: sink_size=0 with sparse")
    if left is None:  # no left window edge: the sinks change nothing
        sink = 0
    for name, val in (("num_splits", num_splits), ("block_n", block_n), ("sm_count", sm_count)):
        if val is not None and (not is_int(val) or val < 1):
            raise ValueError(f"{name}={val!r} is not supported; allowed values: None (chosen here) or an integer >= 1")
    _check(q, k_cache, v_cache, torch.zeros(q.shape[0], dtype=torch.int32), block_table)
    p = DecodePlan()
    p.owner = None
    B, Hq, Nq, D = q.shape
    Dv = v_cache.shape[3]
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    paged = block_table is not None
    page_size = k_cache.shape[2] if paged else 1
    BN = int(block_n) if block_n is not None else decode_block_n(max(D, Dv), page_size if paged else None)
    if BN < 16 or BN & (BN - 1):
        raise ValueError(f"block_n={BN} must be a power of two >= 16")
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[2]
    if causal:
        right = None  # causal bounds the right side at 0 (a window's right is clipped to min(right, 0) = 0)
    one_row = G * Nq == 1  # one query row per program: the fused merge walks it alone (else the row block at once)
    merge = ("fused" if one_row else "kernel") if merge == "auto" else merge  # H200, 2026-12-04: see the docstring
    split_rule = "waves" if split_rule == "auto" else split_rule
    BM = min(max(16, next_pow2(G * Nq)), 64)
    n_m = cdiv(G * Nq, BM)
    dev = q.device
    dummy_i = _dummy(dev)
    p.lay = p.tidx = p.tcnt = dummy_i
    p.sparse_bs = 1
    p.is_sparse = sparse is not None
    if sparse is not None:
        bs = int(sparse.block_size)
        lay = sparse.layout.to(device=dev, dtype=torch.int8)
        if lay.shape[-1] * bs < capacity:
            raise ValueError(f"sparse layout covers {lay.shape[-1]} blocks of {bs} tokens < cache capacity {capacity}")
        tables = sparse.tables if sparse.tables is not None else decode_sparse_tables(lay, bs, BN)
        p.tidx, p.tcnt = (t.to(device=dev, dtype=torch.int32) for t in tables)
        p.lay, p.sparse_bs = lay, bs
        max_tiles = p.tidx.shape[-1]
    else:
        max_tiles = cdiv(capacity, BN)
        if left is not None:
            max_tiles = min(max_tiles, cdiv(left + Nq + (right or 0), BN) + 1 + cdiv(sink, BN))
    sms = int(sm_count) if sm_count is not None else _sm_count(dev)
    if sms < 1:
        raise ValueError(f"sm_count={sm_count} must be >= 1")
    if max(D, Dv) > 256:  # MLA-size latents: (BN, 1024) tiles; fewer stages to fit shared memory (untuned)
        num_stages = min(num_stages, 2)
    per_sm = _programs_per_sm(BN, max(16, next_pow2(D)), max(16, next_pow2(Dv)), num_stages, q.element_size(),
                              num_warps)
    if BM >= 32:  # tiles of 32+ query rows hold more registers: 2 programs per SM (H200, 8 new GQA queries: the
        per_sm = min(per_sm, 2)  # waves split at 3 per SM, 49 splits, read 0.62 of copy bandwidth; 33 splits 0.82)
    S = int(num_splits) if num_splits is not None else decode_num_splits(
        B * Hkv * n_m, max_tiles, sms, rule=split_rule, programs_per_sm=per_sm, program_cost_tiles=128 / BN)
    if S < 1:
        raise ValueError(f"num_splits={num_splits} must be >= 1")
    R = B * Hq * Nq
    p.B, p.Hq, p.Hkv, p.Nq, p.D, p.Dv, p.dtype, p.device = B, Hq, Hkv, Nq, D, Dv, q.dtype, dev
    p.paged, p.page_size, p.capacity = paged, page_size, capacity
    p.max_pages = block_table.shape[1] if paged else 0
    p.block_n, p.block_m, p.BD, p.BDV, p.n_m, p.num_splits = BN, BM, max(16, next_pow2(D)), max(16, next_pow2(Dv)), n_m, S
    p.causal, p.left, p.right, p.sink = bool(causal), left, right, sink
    p.scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    p.has_leftpad, p.return_lse, p.sm_count = bool(has_leftpad), bool(return_lse), sms
    p.num_warps, p.num_stages, p.page_gather = num_warps, num_stages, page_gather
    p.merge, p.split_rule = merge, split_rule
    # the fused merge: one row at a time, all S splits per round trip, where a program holds one query row; else the
    # whole (BM, BDV) block at once, merge_rp row slots per split (BM / merge_rp splits per block: the padding rows of
    # a small group hold more splits), merge_sc blocks per round trip (their loads unrolled; 2 blocks of 16 x 128
    # keep GQA kernels at 158-168 registers without spills on triton 3.6, lab/decode_pipeline_check.py)
    p.merge_rows = not one_row
    p.merge_rp = min(BM, next_pow2(G * Nq)) if not one_row else 1
    p.merge_sc = (min(max(next_pow2(S), 2), 64) if one_row
                  else max(1, min(2, next_pow2(cdiv(S, BM // p.merge_rp)), 8192 // (BM * p.BDV))))
    if max_registers == "auto":  # hold the register count to what `per_sm` resident programs can have (see docstring)
        cap = 65536 // (per_sm * num_warps * 32) // 8 * 8
        max_registers = (cap if one_row and per_sm >= 2 and cap >= 160 and BM <= 16 and BN <= 64
                         and max(D, Dv) <= 128 else None)
    elif max_registers is not None and (not isinstance(max_registers, int) or not 24 <= max_registers <= 255):
        raise ValueError(f"max_registers={max_registers!r} must be 'auto', None or an int in [24, 255]")
    p.max_registers = max_registers
    pdl_ok = dev.type == "cuda" and not _interpreting() and torch.cuda.get_device_capability(dev) >= (9, 0)
    if pdl is True and not pdl_ok:
        raise ValueError("pdl=True needs compiled kernels on a CUDA device of compute capability >= 9.0 (Hopper); "
                         "allowed values here: 'auto', False")
    pdl = pdl_ok if pdl == "auto" else pdl  # programmatic dependent launch of the merge kernel
    p.pdl = bool(pdl) and S > 1 and merge == "kernel"
    p.out = torch.empty(B, Hq, Nq, Dv, device=dev, dtype=q.dtype)
    p.lse = torch.empty(B, Hq, Nq, device=dev, dtype=torch.float32) if return_lse else None
    p.scratch = None
    p.counter = dummy_i
    if S > 1:
        p.scratch = (torch.empty(S, R, Dv, device=dev, dtype=torch.float32),
                     torch.empty(S, R, device=dev, dtype=torch.float32))
        if merge == "fused":  # arrivals per (sequence, K/V head, row block); the merging program resets it to 0
            p.counter = torch.zeros(B * Hkv * n_m, device=dev, dtype=torch.int32)
    return p


def decode_run(
    plan: DecodePlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None, *,
    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
):
    """One decode step with a :func:`decode_plan`: at most two kernel launches, no device sync, no allocation
    (CUDA-graph safe: capture it with static ``q`` / cache / ``cache_seqlens`` / ``block_table`` tensors).

    Args: as :func:`decode_attn`, shapes / dtype / layout equal to the plan's (checked on the host from shapes
    only); ``cache_leftpad`` int32 ``(B,)`` exactly when the plan has ``has_leftpad``. ``out`` / ``lse``:
    contiguous ``(B, Hq, Nq, Dv)`` / fp32 ``(B, Hq, Nq)`` to write into (default: the plan's buffers).

    Returns ``out`` (and ``lse`` when the plan has ``return_lse``).
    """
    p = plan
    if tuple(q.shape) != (p.B, p.Hq, p.Nq, p.D) or q.dtype != p.dtype or q.device != p.device:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype} on {q.device} does not match the plan's "
                         f"{(p.B, p.Hq, p.Nq, p.D)} {p.dtype} on {p.device}; make a new decode_plan")
    if (block_table is not None) != p.paged or (p.paged and (k_cache.shape[2] != p.page_size
                                                            or block_table.shape[1] != p.max_pages)):
        raise ValueError("the cache layout (contiguous / paged, page size, block_table width) differs from the "
                         "plan's; make a new decode_plan")
    if v_cache.shape[3] != p.Dv or (not p.paged and k_cache.shape[2] != p.capacity):
        raise ValueError(f"v_cache Dv={v_cache.shape[3]} / capacity differ from the plan's Dv={p.Dv} / "
                         f"{p.capacity}; make a new decode_plan")
    if (cache_leftpad is not None) != p.has_leftpad:
        raise ValueError(f"cache_leftpad is {'given' if cache_leftpad is not None else 'None'} but the plan was made "
                         f"with has_leftpad={p.has_leftpad}")
    _check(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad)
    out = p.out if out is None else out
    if tuple(out.shape) != (p.B, p.Hq, p.Nq, p.Dv) or out.dtype != p.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {(p.B, p.Hq, p.Nq, p.Dv)} {p.dtype}, got {tuple(out.shape)} {out.dtype}")
    if p.return_lse:
        lse = p.lse if lse is None else lse
        if tuple(lse.shape) != (p.B, p.Hq, p.Nq) or lse.dtype != torch.float32 or not lse.is_contiguous():
            raise ValueError(f"lse must be contiguous float32 {(p.B, p.Hq, p.Nq)}, got {tuple(lse.shape)} {lse.dtype}")
    else:
        lse = out
    S = p.num_splits
    op, lp = p.scratch if S > 1 else (out, out)
    dummy_i = _dummy(p.device)
    bt = block_table if p.paged else dummy_i
    kf = cache_leftpad if cache_leftpad is not None else dummy_i
    R = p.B * p.Hq * p.Nq
    if cache_seqlens.stride(0) != 1 or kf.stride(0) != 1:
        raise ValueError("cache_seqlens / cache_leftpad must be contiguous")
    dot_prec = "ieee" if p.dtype == torch.float32 else "tf32"
    slay_b = p.lay.stride(0) if p.lay.dim() == 3 else 0
    slay_q = p.lay.stride(-2) if p.lay.dim() >= 2 else 0
    stab_b = p.tidx.stride(0) if p.tidx.dim() == 3 else 0
    stab_q = p.tidx.stride(-2) if p.tidx.dim() >= 2 else 0
    scnt_b = p.tcnt.stride(0) if p.tcnt.dim() == 2 else 0
    _decode_fwd[p.grid](
        q, k_cache, v_cache, cache_seqlens, kf, bt, p.lay, p.tidx, p.tcnt, out, lse, op, lp, p.counter,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        bt.stride(0) if p.paged else 0, slay_b, slay_q, stab_b, stab_q, scnt_b,
        p.Hq, p.Hkv, p.Nq, p.D, p.Dv, p.Hq // p.Hkv, R, S, p.scale * LOG2E,
        p.left if p.left is not None else 0, p.right if p.right is not None else 0, p.sparse_bs,
        PAGED=p.paged, PAGE_SIZE=p.page_size, PAGE_TILE=p.paged and p.page_size % p.block_n == 0,
        MULTI_PAGE=p.page_gather == "page" and p.paged and p.page_size < p.block_n and p.block_n % p.page_size == 0,
        CAUSAL=p.causal,
        HAS_LEFT=p.left is not None, HAS_RIGHT=p.right is not None, SPARSE=p.is_sparse,
        LEFTPAD=p.has_leftpad, PREFETCH=p.page_gather == "prefetch" and p.paged and not p.is_sparse, SPLIT=S > 1,
        FUSED_MERGE=S > 1 and p.merge == "fused", MERGE_ROWS=p.merge_rows, MERGE_RP=p.merge_rp,
        MERGE_NU=p.block_m // p.merge_rp,
        MERGE_SC=p.merge_sc,
        STORE_LSE=p.return_lse, BM=p.block_m, BN=p.block_n, BD=p.BD, BDV=p.BDV,
        DOT_PREC=dot_prec, PDL=p.pdl, SINK=p.sink, num_warps=p.num_warps, num_stages=p.num_stages,
        **({"maxnreg": p.max_registers} if p.max_registers and not _interpreting() else {}),
    )
    if S > 1 and p.merge == "kernel":
        _decode_merge[(R,)](op, lp, out, lse, R, S, p.Dv, BS=max(2, next_pow2(S)), BD=p.BDV,
                            STORE_LSE=p.return_lse, PDL=p.pdl, num_warps=4 if p.BDV >= 128 else 2,
                            **({"launch_pdl": True} if p.pdl else {}))
    return (out, lse) if p.return_lse else out


def decode_attn(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor] = None, *, causal: bool = True,
    window_size: Optional[Tuple[Optional[int], Optional[int]]] = None, softmax_scale: Optional[float] = None,
    sparse: Optional[DecodeSparse] = None, num_splits: Optional[int] = None, block_n: Optional[int] = None,
    return_lse: bool = False, num_warps: int = 4, num_stages: int = 3, cache_leftpad: Optional[torch.Tensor] = None,
    plan: Optional[DecodePlan] = None, page_gather: str = "prefetch", merge: str = "auto", split_rule: str = "auto",
    max_registers="auto", pdl=False, sink_size: int = 0,
):
    """Decode attention of ``Nq`` new queries against a KV cache (FlashDecoding split-K + lse merge).

    Args:
        q: ``(B, Hq, Nq, D)`` float16 / bfloat16 / float32.
        k_cache, v_cache: contiguous ``(B, Hkv, N_max, D)`` / ``(B, Hkv, N_max, Dv)`` or paged
            ``(num_pages, Hkv, page_size, D)`` / ``(..., Dv)``; ``q``'s dtype; ``Hkv`` divides ``Hq``; the value
            head dim ``Dv`` may differ from ``D`` (MLA's absorbed decode: q.k over the latent and its RoPE part,
            ``D = 576``, values the latent, ``Dv = 512``); ``D, Dv <= MAX_HEAD_DIM_QK`` (1024).
        cache_seqlens: int32 ``(B,)``, valid tokens per sequence (new tokens included); not checked against
            the cache here (``attn_zoo.decode_attention`` validates values).
        block_table: int32 ``(B, max_pages)`` for a paged cache, else ``None``.
        causal: ``j <= i'``. window_size: ``(left, right)``, ``None`` = unbounded side (causal clips ``right``
            to 0). softmax_scale: default ``D ** -0.5``.
        sparse: :class:`DecodeSparse` block layout (and its tile tables) or ``None``.
        num_splits: split-K factor ``S`` (default :func:`decode_num_splits`); block_n: key tile (default
            :func:`decode_block_n`; any page size: one page-table lookup per tile when ``page_size % block_n == 0``,
            else one per key, so a tile gathers ``block_n / page_size`` pages).
        return_lse: also return fp32 ``(B, Hq, Nq)`` natural-log lse (``-inf`` on rows that see no key).
        num_warps, num_stages: Triton launch settings. Default 3 stages (was 2): on the H200 probe of 2026-12-03
            (``lab/decode_probe.py``, batch 1, D 128) the fraction of copy bandwidth went 0.66 -> 0.79 (GQA 32:8, 64k
            context), 0.73 -> 0.92 (GQA 64:8, 128k), 0.81 -> 0.88 (MHA, 64k).
        cache_leftpad: int32 ``(B,)`` or ``None``: the first visible key of each sequence (FlashAttention's name;
            decode on a packed prefix: keys ``j < cache_leftpad[b]`` are not seen; positions stay absolute).
        plan: a :func:`decode_plan` to run (then the mask / tile arguments above are the plan's and must be
            left at their defaults); default: a fresh plan per call (fresh output buffers).
        page_gather, merge, split_rule, max_registers, pdl: as :func:`decode_plan`.
        sink_size: attention sinks (StreamingLLM, Xiao et al. 2023), an int ``>= 0`` (default 0: none): keys at
            absolute positions ``j < sink_size`` stay visible left of the window's left edge (``j >= i' - left or
            j < sink_size``; causal, the right edge, ``seqlen`` and ``cache_leftpad`` still hold); the splits visit
            the ``cdiv(sink_size, block_n)`` sink tiles left of each window. A no-op without a left edge; not with
            ``sparse``. One compile per value (the kernel's ``SINK`` constexpr).

    Returns:
        ``out (B, Hq, Nq, Dv)`` in ``q.dtype`` (and ``lse``).

    Raises:
        ValueError / TypeError: shapes, dtypes, strides, ``Hq % Hkv``, head dims too large, bad tile / page sizes,
        the scalar arguments as :func:`decode_plan` says.
    """
    if plan is None:
        _check(q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad)
        plan = decode_plan(q, k_cache, v_cache, block_table, causal=causal, window_size=window_size,
                           softmax_scale=softmax_scale, sparse=sparse, num_splits=num_splits, block_n=block_n,
                           return_lse=return_lse, has_leftpad=cache_leftpad is not None, num_warps=num_warps,
                           num_stages=num_stages, page_gather=page_gather, merge=merge, split_rule=split_rule,
                           max_registers=max_registers, pdl=pdl, sink_size=sink_size)
    return decode_run(plan, q, k_cache, v_cache, cache_seqlens.contiguous(), block_table,
                      None if cache_leftpad is None else cache_leftpad.contiguous())


# --------------------------------------------------------------------------------------------- references
def merge_partials_reference(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch log-sum-exp merge of split-K partials (the reference of :func:`_decode_merge`).

    ``o_parts (S, ..., D)`` each normalised by its own softmax sum, ``lse_parts (S, ...)`` natural log (``-inf``
    for empty splits). Returns ``(out (..., D), lse (...))`` in fp32; rows with every split empty give 0 / -inf.
    """
    lse = torch.logsumexp(lse_parts.float(), dim=0)
    w = torch.exp(lse_parts.float() - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
    w = torch.where(torch.isfinite(lse_parts), w, torch.zeros_like(w))
    return (w.unsqueeze(-1) * o_parts.float()).sum(0), lse


def decode_attn_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor] = None, *, causal: bool = True,
    window_size: Optional[Tuple[Optional[int], Optional[int]]] = None, softmax_scale: Optional[float] = None,
    sparse: Optional[DecodeSparse] = None, return_lse: bool = False, sink_size: int = 0,
):
    """Plain-PyTorch fp32 reference of :func:`decode_attn` (same arguments; dense mask per sequence).

    Gathers each sequence's keys (through the page table when paged), materialises the ``(Nq, seqlen)`` mask
    of the rule in the module docstring and runs softmax attention. O(B * Hq * Nq * N) memory: tests only.
    """
    B, Hq, Nq, D = q.shape
    Hkv = k_cache.shape[1]
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    left = right = None
    if window_size is not None:
        left, right = window_size
    outs, lses = [], []
    for b in range(B):
        L = int(cache_seqlens[b])
        if block_table is not None:
            ps = k_cache.shape[2]
            pages = block_table[b, : cdiv(L, ps)].long()
            kb = k_cache[pages].transpose(0, 1).reshape(Hkv, -1, D)[:, :L]
            vb = v_cache[pages].transpose(0, 1).reshape(Hkv, -1, v_cache.shape[3])[:, :L]
        else:
            kb, vb = k_cache[b, :, :L], v_cache[b, :, :L]
        kb = kb.float().repeat_interleave(Hq // Hkv, 0)
        vb = vb.float().repeat_interleave(Hq // Hkv, 0)
        s = (q[b].float() @ kb.transpose(-1, -2)) * scale  # (Hq, Nq, L)
        i = (torch.arange(Nq, device=q.device) + L - Nq).view(-1, 1)
        j = torch.arange(L, device=q.device).view(1, -1)
        ok = torch.ones(Nq, L, dtype=torch.bool, device=q.device)
        if causal:
            ok &= j <= i
        if left is not None:
            ok &= (j >= i - left) | (j < sink_size)
        if right is not None:
            ok &= j <= i + (min(right, 0) if causal else right)
        if sparse is not None:
            lay = sparse.layout[b] if sparse.layout.dim() == 3 else sparse.layout
            ok &= lay.to(device=q.device, dtype=torch.bool)[i // sparse.block_size, j // sparse.block_size]
        s = s.masked_fill(~ok, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
        outs.append(p @ vb)
        lses.append(lse)
    out = torch.stack(outs).to(q.dtype)
    return (out, torch.stack(lses)) if return_lse else out
