"""Backward pass of the exact-attention kernel (FlashAttention-2 Alg. 2): preprocess (``delta``, ``lse2``), dK/dV per
key tile (the GQA group's query heads summed in registers, optionally split over programs), dQ per query tile or
fused into dK/dV with fp32 atomics (``dq_mode="atomic"``); and their launch (:func:`flash_attn_bwd`)."""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .._host import cdiv, next_pow2
from .common import INTERPRET, LOG2E, _allowed, _doc_kv_range, _doc_ok, _doc_ptrs, _doc_q_range, _kv_range, _q_range, \
    _table_row
from .config import FlashConfig, current_flash_config
from .launch import KERNELS, _PLANS, _aligned, _block_n_dkdv, _bnhd_empty, _bucket, _get_plan, _mode_args, \
    _plan_launch, sink_tokens, streams_by_tma
from .sparse import sparse_mode, sparse_tiles


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
               DOT_PREC: tl.constexpr, Qd, DOd, b, h, TMA: tl.constexpr, dilation, DILATED: tl.constexpr,
               offs_dv, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr, DocQb, DocKb, DOCS: tl.constexpr,
               SINK: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_ptrs = Qb + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    do_ptrs = DOb + offs_m[:, None] * stride_dn + offs_dv[None, :] * stride_dd  # (BLOCK_M, BLOCK_DV)
    if TMA:  # rows past Nq arrive as zeros (only when Dv == D)
        q = Qd.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        do = DOd.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_DV)
    elif MASKED:
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D), other=0.0)
        do = tl.load(do_ptrs, mask=(offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DV), other=0.0)
    else:
        if BLOCK_D != HEAD_D:
            q = tl.load(q_ptrs, mask=offs_d[None, :] < HEAD_D, other=0.0)
        else:
            q = tl.load(q_ptrs)
        if BLOCK_DV != HEAD_DV:
            do = tl.load(do_ptrs, mask=offs_dv[None, :] < HEAD_DV, other=0.0)
        else:
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
                      dilation, HAS_LEFT, HAS_RIGHT, SPARSE, DILATED, SINK)
        if DOCS:
            ok = _doc_ok(ok, DocQb, DocKb, offs_m[None, :], offs_n[:, None], Nq, Nk)
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
                     Hq, Hkv, Nq, Nk, offset, group, n_split, qk_scale, sm_scale, win_left, win_right, dilation,
                     Q_IDX, Q_CNT, Q_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, DOC, N_BUCKET, Qd, DOd,
                     HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                     DOT_PREC: tl.constexpr, TMA: tl.constexpr,
                     DILATED: tl.constexpr, DOCS: tl.constexpr, SINK: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
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
    offs_dv = tl.arange(0, BLOCK_DV)  # v's head dim (Dv may differ from D: MLA)
    mk = (offs_n[:, None] < Nk) & (offs_d[None, :] < HEAD_D)
    mv = (offs_n[:, None] < Nk) & (offs_dv[None, :] < HEAD_DV)
    k = tl.load(K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=mk, other=0.0)
    v = tl.load(V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn
                + offs_dv[None, :] * stride_vd, mask=mv, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_ptrs(DOC, b, Nq, Nk)  # (DOCS only; never read otherwise)
    if SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(Q_IDX, Q_CNT, Q_NFULL, stride_tbl)
        if DOCS:  # the documents' query span and its full sub-range, for the table's tiles
            n_qb = tl.cdiv(Nq, BLOCK_M)
            dlo, dhi, dflo, dfhi = _doc_q_range(n_qb * 0, n_qb, n_qb * 0, n_qb, start_n, Nk, DocKb, KLob, KHib,
                                                BLOCK_M, BLOCK_N)
    else:
        lo, hi, flo, fhi = _q_range(start_n, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                    HAS_LEFT, HAS_RIGHT, SINK)
        if DOCS:  # only the query tiles of this key tile's documents
            lo, hi, flo, fhi = _doc_q_range(lo, hi, flo, fhi, start_n, Nk, DocKb, KLob, KHib, BLOCK_M, BLOCK_N)
    for g in range(0, heads):  # query heads sharing this K/V head: dK/dV summed in registers
        h = hk * group + s * heads + g
        Qb = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        DOb = DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
        row0 = (b * Hq + h).to(tl.int64) * Nq
        DQAb = DQA + row0 * HEAD_D
        if SPARSE and DOCS:
            for t in range(0, cnt):
                mblk = tl.load(tbl + t)
                if (t < nfull) & (mblk >= dflo) & (mblk < dfhi):
                    dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn,
                                        stride_qd, stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale,
                                        sm_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                                        DILATED, HAS_LEFT, HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D,
                                        DOT_PREC, Qd, DOd, b, h, TMA, dilation, DILATED,
                                        offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
                elif (mblk >= dlo) & (mblk < dhi):
                    dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn,
                                        stride_qd, stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale,
                                        sm_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                                        True, HAS_LEFT, HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D,
                                        DOT_PREC, Qd, DOd, b, h, TMA, dilation, DILATED,
                                        offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        elif SPARSE:
            for t in range(0, nfull):
                mblk = tl.load(tbl + t)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA, dilation, DILATED,
                                    offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
            for t in range(nfull, cnt):
                mblk = tl.load(tbl + t)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA, dilation, DILATED,
                                    offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        else:
            for mblk in range(lo, flo):  # (empty without a right window edge or documents)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA, dilation, DILATED,
                                    offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
            for mblk in range(flo, fhi):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA, dilation, DILATED,
                                    offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
            for mblk in range(fhi, hi):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qb, DOb, Lse2 + row0, Delta + row0, DQAb, stride_qn, stride_qd,
                                    stride_dn, stride_dd, mblk * BLOCK_M, offs_n, offs_d, qk_scale, sm_scale, Nq, Nk,
                                    offset, win_left, win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT,
                                    HAS_RIGHT, SPARSE, ATOMIC_DQ, BLOCK_M, HEAD_D, BLOCK_D, DOT_PREC,
                                    Qd, DOd, b, h, TMA, dilation, DILATED,
                                    offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
    dk = dk * sm_scale
    tl.store(DK + s.to(tl.int64) * stride_dks + b.to(tl.int64) * stride_dkb + hk.to(tl.int64) * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), mask=mk)
    tl.store(DV + s.to(tl.int64) * stride_dvs + b.to(tl.int64) * stride_dvb + hk.to(tl.int64) * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), mask=mv)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd, start_n,
             offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
             MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
             BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
             Kd, Vd, b, hk, TMA: tl.constexpr, dilation, DILATED: tl.constexpr,
             offs_dv, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr, DocQb, DocKb, DOCS: tl.constexpr,
             SINK: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kT_ptrs = Kb + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    vT_ptrs = Vb + offs_n[None, :] * stride_vn + offs_dv[:, None] * stride_vd  # (BLOCK_DV, BLOCK_N)
    if TMA:  # rows past Nk arrive as zeros (only when Dv == D)
        kT = tl.trans(Kd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        vT = tl.trans(Vd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV))
    elif MASKED:
        kT = tl.load(kT_ptrs, mask=(offs_n[None, :] < Nk) & (offs_d[:, None] < HEAD_D), other=0.0)
        vT = tl.load(vT_ptrs, mask=(offs_n[None, :] < Nk) & (offs_dv[:, None] < HEAD_DV), other=0.0)
    else:
        if BLOCK_D != HEAD_D:
            kT = tl.load(kT_ptrs, mask=offs_d[:, None] < HEAD_D, other=0.0)
        else:
            kT = tl.load(kT_ptrs)
        if BLOCK_DV != HEAD_DV:
            vT = tl.load(vT_ptrs, mask=offs_dv[:, None] < HEAD_DV, other=0.0)
        else:
            vT = tl.load(vT_ptrs)
    qk = tl.dot(q, kT, input_precision=DOT_PREC)
    p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    if MASKED:
        ok = _allowed(offs_m[:, None], offs_n[None, :], Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                      dilation, HAS_LEFT, HAS_RIGHT, SPARSE, DILATED, SINK)
        if DOCS:
            ok = _doc_ok(ok, DocQb, DocKb, offs_m[:, None], offs_n[None, :], Nq, Nk)
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
                   Hq, Nq, Nk, offset, group, qk_scale, sm_scale, win_left, win_right, dilation,
                   KV_IDX, KV_CNT, KV_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, DOC, N_BUCKET, Kd, Vd,
                   HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, DOT_PREC: tl.constexpr,
                   TMA: tl.constexpr, DILATED: tl.constexpr, DOCS: tl.constexpr, SINK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    offs_dv = tl.arange(0, BLOCK_DV)  # v's head dim (Dv may differ from D: MLA)
    mq = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qn
                + offs_d[None, :] * stride_qd, mask=mq, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh + offs_m[:, None] * stride_dn
                 + offs_dv[None, :] * stride_dd, mask=(offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DV), other=0.0)
    row = bh.to(tl.int64) * Nq + offs_m
    lse2 = tl.load(Lse2 + row, mask=offs_m < Nq, other=float("inf"))
    delta = tl.load(Delta + row, mask=offs_m < Nq, other=0.0)
    Kb = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    Vb = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_ptrs(DOC, b, Nq, Nk)  # (DOCS only; never read otherwise)
    if SPARSE and DOCS:  # the table's tiles inside the documents' key span; full only if full for both
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        n_kb = tl.cdiv(Nk, BLOCK_N)
        dlo, dhi, dflo, dfhi = _doc_kv_range(n_kb * 0, n_kb, n_kb * 0, n_kb, start_m, Nq, DocQb, QLob, QHib,
                                             BLOCK_M, BLOCK_N)
        for t in range(0, cnt):
            nblk = tl.load(tbl + t)
            if (t < nfull) & (nblk >= dflo) & (nblk < dfhi):
                dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                              nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                              LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                              DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                              DocQb, DocKb, DOCS, SINK)
            elif (nblk >= dlo) & (nblk < dhi):
                dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                              nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                              LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                              DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                              DocQb, DocKb, DOCS, SINK)
    elif SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        for t in range(0, nfull):
            nblk = tl.load(tbl + t)
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                          DocQb, DocKb, DOCS, SINK)
        for t in range(nfull, cnt):
            nblk = tl.load(tbl + t)
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                          DocQb, DocKb, DOCS, SINK)
    else:
        lo, hi, flo, fhi = _kv_range(start_m, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                     HAS_LEFT, HAS_RIGHT)
        if DOCS:  # only the key tiles of this query tile's documents
            lo, hi, flo, fhi = _doc_kv_range(lo, hi, flo, fhi, start_m, Nq, DocQb, QLob, QHib, BLOCK_M, BLOCK_N)
        if SINK > 0:  # attention sinks: the tiles of keys j < SINK left of the band, masked (as the forward)
            for nblk in range(0, tl.minimum((SINK + BLOCK_N - 1) // BLOCK_N, lo)):
                dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                              nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                              LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                              DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                              DocQb, DocKb, DOCS, SINK)
        if HAS_LEFT or DOCS:  # partial tiles left of the full band (none without a left window edge / documents)
            for nblk in range(lo, flo):
                dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                              nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                              LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                              DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                              DocQb, DocKb, DOCS, SINK)
        for nblk in range(flo, fhi):
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                          DocQb, DocKb, DOCS, SINK)
        for nblk in range(fhi, hi):
            dq = _dq_tile(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                          LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE, BLOCK_N, HEAD_D, BLOCK_D,
                          DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED, offs_dv, HEAD_DV, BLOCK_DV,
                          DocQb, DocKb, DOCS, SINK)
    dq = dq * sm_scale
    tl.store(DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh + offs_m[:, None] * stride_dqn
             + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty), mask=mq)


# Launch policy. Default: one heuristic config per (kernel, head dim, mode, dtype) -- the first of a preference
# list that fits shared memory (ordered by the H200 autotune results in docs/kernels.md), so a new shape costs one

KERNELS.update(pre=_bwd_preprocess, dkdv=_bwd_dkdv_kernel, dq=_bwd_dq_kernel)


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


def resolve_dkdv_split(dkdv_split: Optional[int], group: int, n_programs: int, device) -> int:
    """Programs per GQA group of the dK/dV pass: ``dkdv_split`` (checked: it must divide ``group``), or when
    ``None`` the heuristic :func:`choose_dkdv_split` with a target of 2 programs per SM, 8 for groups of >= 8 heads
    (MQA-like: each program's group loop is long, so finer programs even out the waves; H200, MQA N = 4096: split 8
    vs 2 -10% backward, N = 16384 equal; GQA-4 lost 2-4% with more splits, lab/experiments/diag.py)."""
    if dkdv_split is None:
        return choose_dkdv_split(group, n_programs, (8 if group >= 8 else 2) * _sm_count(device))
    if isinstance(dkdv_split, bool) or not isinstance(dkdv_split, int) or dkdv_split < 1 or group % dkdv_split:
        raise ValueError(f"dkdv_split={dkdv_split!r} must be an integer >= 1 dividing the GQA group size "
                         f"Hq // Hkv = {group}")
    return dkdv_split


def flash_attn_bwd(do, q, k, v, out, lse, softmax_scale: float, win_left: int = -1, win_right: int = -1,
                   layout: Optional[torch.Tensor] = None, layout_bs: int = 0,
                   kv_idx=None, kv_cnt=None, kv_nfull=None, q_idx=None, q_cnt=None, q_nfull=None,
                   dlse: Optional[torch.Tensor] = None, grads_like_inputs: bool = True, *, dilation: int = 1,
                   config: Optional[FlashConfig] = None, documents: Optional[torch.Tensor] = None,
                   sink_size: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launches: preprocess (delta, lse2), dK/dV (per key tile, GQA group summed), dQ (per query tile).

    Block-sparse needs the query-tile table (``kv_*`` at ``sparse_tiles(D)[0]``) and the key-tile table
    (``q_*``: for each key tile the visited query tiles, full ones first, at ``sparse_tiles(D)[1]``), both from
    :func:`build_sparse_tables`. ``config`` (default: the current settings): ``dq_mode`` (``"atomic"`` skips the dQ
    kernel) and ``dkdv_split`` (see :func:`resolve_dkdv_split`), tiles, TMA; pass the forward's. ``dilation``: as
    in :func:`flash_attn_fwd`. ``documents``: the forward's document table (:func:`flash_attn_fwd`).
    ``grads_like_inputs``: ``dq`` / ``dk`` / ``dv`` take the layouts of ``q`` / ``k`` / ``v`` (a leaf tensor's
    gradient of another layout would be copied by autograd); ``False``: stored as ``(B, N, H, D)`` (the custom
    op, whose fake kernel cannot see the runtime strides). ``config.bwd_impl == "auto"``: the Gluon backward where
    :func:`kernels.flash.gluon.choose_bwd_impl` picks it, else the Triton one. ``"gluon"``: the Gluon backward
    (:func:`kernels.flash.gluon.gluon_flash_bwd`; ``ValueError`` from :func:`~kernels.flash.gluon.check_gluon_bwd`
    for a call it does not cover). ``sink_size``: the forward's attention sinks (:func:`flash_attn_fwd`; the Gluon
    backward refuses them). Returns ``(dq, dk, dv)``.
    """
    if config is None:
        config = current_flash_config()
    sink = sink_tokens(sink_size, win_left, layout, dilation, documents) if sink_size else 0
    config = bwd_run_config(config, q, k, v, win_left, win_right, layout, dilation, documents, layout_bs,
                            sink_size=sink)
    if config.bwd_impl == "gluon":  # the Gluon backward (Hopper; band masks with two consumers, else ValueError)
        from .gluon import check_gluon_bwd, gluon_flash_bwd

        check_gluon_bwd(q, k, v, win_left, win_right, layout, dilation, documents, config, layout_bs, sink_size=sink)
        return gluon_flash_bwd(do, q, k, v, out, lse, softmax_scale, win_left, win_right, dlse, grads_like_inputs,
                               config=config, documents=documents, layout=layout, layout_bs=layout_bs)
    if INTERPRET and q.dtype == torch.bfloat16:  # as in flash_attn_fwd: fp32 under the CPU interpreter
        grads = flash_attn_bwd(do.float(), q.float(), k.float(), v.float(), out.float(), lse, softmax_scale,
                               win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt,
                               q_nfull, dlse=dlse, grads_like_inputs=grads_like_inputs, dilation=dilation,
                               config=config, documents=documents, sink_size=sink)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    has_dlse = dlse is not None
    sparse_key = None if layout is None else (layout.shape, layout_bs, kv_idx.shape, q_idx.shape)
    key = ("bwd", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), do.stride(), out.stride(), q.dtype,
           q.device,
           softmax_scale, win_left, win_right, sparse_key, _aligned(q, k, v, do, out), has_dlse, grads_like_inputs,
           config, dilation, documents is not None, sink)
    plan = _PLANS.get(key) or _get_plan(key, lambda: _bwd_meta(q, k, v, do, win_left, win_right, layout, layout_bs,
                                                                has_dlse, dilation, config, documents is not None,
                                                                sink))
    pm = plan.meta
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    dl = dlse.contiguous().float() if has_dlse else delta
    _plan_launch(plan, "pre", B * Hq, Nq, (out, do, dl, lse, delta, lse2, Hq, Nq, *out.stride(), *do.stride()),
                 pm["pre"], (), q.device, config)
    if grads_like_inputs:  # eager: the layout of q / k / v (autograd copies a leaf's gradient of another layout)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # dense inputs keep their strides
    else:  # custom op: one fixed layout, whatever strides Inductor hands it (its fake kernel must agree)
        dq, dk, dv = _bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device), \
            _bnhd_empty(B, Hkv, Nk, v.shape[3], v.dtype, v.device)
    mk = _mode_args(q, layout, (kv_idx, kv_cnt, kv_nfull), documents)
    mq = _mode_args(q, layout, (q_idx, q_cnt, q_nfull), documents)
    n_split, atomic = pm["n_split"], pm["atomic"]
    if n_split > 1:  # fp32 partial dK / dV per split, summed below
        dk_t = torch.empty((n_split, B, Hkv, Nk, D), dtype=torch.float32, device=q.device)
        dv_t = torch.empty((n_split, B, Hkv, Nk, v.shape[3]), dtype=torch.float32, device=q.device)
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
        wl, wr, dilation, mq["idx"], mq["cnt"], mq["nfull"], mq["stride_tbl"], mq["lay"], mq["lay_nb"], max(layout_bs, 1),
        mq["doc"], _bucket(Nk)), pm["dkdv"], (q, do), q.device, config)
    if n_split > 1:
        dk.copy_(dk_t.sum(0))
        dv.copy_(dv_t.sum(0))
    if atomic:
        dq.copy_(dqa)
        return dq, dk, dv
    _launch_dq(plan, q, k, v, do, lse2, delta, dq, softmax_scale, win_left, win_right, dilation, mk, layout_bs,
               config)
    return dq, dk, dv


def bwd_run_config(config: FlashConfig, q, k, v, win_left: int, win_right: int, layout, dilation: int, documents,
                   layout_bs: int = 0, *, sink_size: int = 0) -> FlashConfig:
    """The config :func:`flash_attn_bwd` runs with: ``config``, or for ``bwd_impl="auto"`` where
    :func:`kernels.flash.gluon.choose_bwd_impl` takes the Gluon backward (two consumers; the Gluon dQ at the head
    dims of ``AUTO_GLUON_DQ_HEAD_DIMS``), ``config`` with :func:`~kernels.flash.gluon.auto_gluon_bwd_config`'s
    settings (``bwd_impl="gluon"``; never with ``sink_size > 0``). Arguments as :func:`flash_attn_bwd`'s."""
    if config.bwd_impl == "auto" and q.device.type == "cuda":  # Gluon where it is the faster one
        from .gluon import auto_gluon_bwd_config, choose_bwd_impl

        if choose_bwd_impl(config, q, k, v, win_left, win_right, layout, dilation, documents, layout_bs,
                           sink_size=sink_size) == "gluon":
            return auto_gluon_bwd_config(config, q.shape[3])
    return config


def bwd_tma(config: FlashConfig, q, k, v, do, win_left: int, win_right: int, layout) -> Tuple[bool, bool]:
    """``(dK/dV, dQ)``: whether the backward that runs with ``config`` (:func:`bwd_run_config`'s) streams its
    operands by TMA in its dK/dV pass and in its dQ. ``bwd_impl="gluon"``: the Gluon dK/dV kernel reads by TMA only;
    its dQ by TMA for the ``gluon_bwd_dq`` paths of :data:`kernels.flash.gluon.GLUON_BWD_DQ_BY_TMA`, for
    ``"triton"`` where the Triton dQ kernel's rule says so (:func:`dq_tma`, as :func:`triton_dq` launches it), not
    for ``"atomic"`` (atomics into a buffer). The Triton backward: :func:`dkdv_tma` and, unless ``dq_mode="atomic"``
    (dQ by atomics inside the dK/dV kernel), :func:`dq_tma`. A TMA build the compiler rejects still falls back to
    pointer loads at the launch (with a warning)."""
    if config.bwd_impl == "gluon":
        from .gluon import GLUON_BWD_DQ_BY_TMA

        path = config.gluon_bwd_dq
        return True, path in GLUON_BWD_DQ_BY_TMA or (
            path == "triton" and dq_tma(q, k, v, win_left, win_right, None, config))
    return (dkdv_tma(q, k, v, do, win_left, win_right, layout, config),
            config.dq_mode != "atomic" and dq_tma(q, k, v, win_left, win_right, layout, config))


def _launch_dq(plan, q, k, v, do, lse2, delta, dq, softmax_scale, win_left, win_right, dilation, mk, layout_bs,
               config):
    """Launch the dQ kernel (``plan.meta["dq"]``) over ``(cdiv(Nq, BLOCK_M), B * Hq)``: ``dq`` (any strides) from
    ``lse2`` / ``delta`` fp32 ``(B, Hq, Nq)`` contiguous (the preprocess's); ``mk``: :func:`_mode_args` of the
    query-tile table."""
    B, Hq, Nq = q.shape[:3]
    Nk = k.shape[2]
    _plan_launch(plan, "dq", B * Hq, Nq, (
        q, k, v, do, lse2, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        Hq, Nq, Nk, Nk - Nq, Hq // k.shape[1], softmax_scale * LOG2E, softmax_scale, max(win_left, 0),
        max(win_right, 0), dilation, mk["idx"], mk["cnt"], mk["nfull"], mk["stride_tbl"], mk["lay"], mk["lay_nb"],
        max(layout_bs, 1), mk["doc"], _bucket(Nq)), plan.meta["dq"], (k, v), q.device, config)


def triton_dq(do, q, k, v, lse2, delta, dq, softmax_scale: float, win_left: int, win_right: int,
              config: FlashConfig, documents: Optional[torch.Tensor] = None) -> None:
    """dQ by the Triton dQ kernel, launched as :func:`flash_attn_bwd` launches it for this mask (same constexprs,
    tiles, TMA rule and launch plans): the Gluon backward's ``gluon_bwd_dq="triton"``. The mask: ``win_left`` /
    ``win_right`` (-1: no such edge; dense ``(-1, -1)``, causal ``(-1, 0)``) and ``documents`` (the int32 document
    table of :func:`kernels.flash.documents.document_table`, or ``None``); no block-sparse layout or dilation.
    ``do, q (B, Hq, Nq, D)``, ``k, v (B, Hkv, Nk, D)``, ``lse2`` / ``delta`` fp32 ``(B, Hq, Nq)`` contiguous from
    ``_bwd_preprocess``; writes ``dq (B, Hq, Nq, D)`` (any strides) in place. Raises ``ValueError`` for a
    ``win_left`` / ``win_right`` that is not an integer >= -1."""
    for name, w in (("win_left", win_left), ("win_right", win_right)):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"{name}={w!r}: triton_dq takes an integer >= 0, or -1 (no such window edge)")
    docs = documents is not None
    key = ("bwd_dq", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), do.stride(), dq.stride(), q.dtype,
           q.device, softmax_scale, win_left, win_right, docs, _aligned(q, k, v, do, dq), config)
    plan = _PLANS.get(key) or _get_plan(key, lambda: {"dq": _dq_meta(q, k, v, win_left, win_right, None, 0, 1, config,
                                                                     docs)})
    _launch_dq(plan, q, k, v, do, lse2, delta, dq, softmax_scale, win_left, win_right, 1,
               _mode_args(q, None, (None,) * 3, documents), 0, config)


def _bwd_common(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs, tile, sink=0):
    """The constexprs the dK/dV and dQ kernels share (``SPARSE`` at the block-sparse ``tile``; ``sink``: ``SINK``,
    :func:`~kernels.flash.launch.sink_tokens`)."""
    Nq, D = q.shape[2], q.shape[3]
    Nk, Dv = k.shape[2], v.shape[3]
    return dict(HEAD_D=D, BLOCK_D=max(16, next_pow2(D)), HEAD_DV=Dv, BLOCK_DV=max(16, next_pow2(Dv)),
                HAS_LEFT=win_left >= 0, HAS_RIGHT=win_right >= 0,
                SPARSE=sparse_mode(layout, layout_bs, tile, Nq, Nk, config),
                DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", DILATED=dilation > 1, DOCS=docs, SINK=sink)


def dq_tma(q, k, v, win_left, win_right, layout, config) -> bool:
    """Whether the Triton dQ kernel streams K / V by TMA descriptors (its ``TMA`` constexpr): :func:`streams_by_tma`.
    The mask as :func:`flash_attn_bwd` takes it."""
    return streams_by_tma(q, k, v, win_left, win_right, layout, config, k, v)


def dkdv_tma(q, k, v, do, win_left, win_right, layout, config) -> bool:
    """Whether the Triton dK/dV kernel streams Q / dO by TMA descriptors (its ``TMA`` constexpr):
    :func:`streams_by_tma`. The mask as :func:`flash_attn_bwd` takes it."""
    return streams_by_tma(q, k, v, win_left, win_right, layout, config, q, do)


def _dq_meta(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs=False, sink=0):
    """The dQ kernel's constexprs (a plan's ``meta["dq"]``)."""
    D = q.shape[3]
    f_tile = sparse_tiles(D, config)[0] if layout is not None else (1, 1)
    common = _bwd_common(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs, f_tile, sink)
    return dict(common, TMA=dq_tma(q, k, v, win_left, win_right, layout, config))


def _bwd_meta(q, k, v, do, win_left, win_right, layout, layout_bs, has_dlse, dilation, config, docs=False, sink=0):
    """The backward's launch options (a plan's ``meta``): preprocess, dK/dV and dQ constexprs, the split."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    Dv = v.shape[3]
    block_dv = max(16, next_pow2(Dv))
    f_tile, b_tile = sparse_tiles(D, config) if layout is not None else ((1, 1), (1, 1))
    common = _bwd_common(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs, f_tile, sink)
    atomic = config.dq_mode == "atomic"
    meta_dkdv = dict(common, ATOMIC_DQ=atomic, SPARSE=sparse_mode(layout, layout_bs, b_tile, Nq, Nk, config),
                     TMA=dkdv_tma(q, k, v, do, win_left, win_right, layout, config))
    n_tiles = cdiv(Nk, _block_n_dkdv(meta_dkdv, q.dtype, config))
    n_split = resolve_dkdv_split(config.dkdv_split, group, n_tiles * B * Hkv, q.device)
    # the preprocess reads O and dO: v's head dim
    return {"pre": dict(HAS_DLSE=has_dlse, HEAD_D=Dv, BLOCK_D=block_dv, BLOCK_M=64 if not INTERPRET else 32),
            "dkdv": meta_dkdv,
            "dq": _dq_meta(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs, sink),
            "n_split": n_split, "atomic": atomic}
