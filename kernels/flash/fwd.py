"""Forward pass of the exact-attention kernel: the Triton kernel (online softmax, FlashAttention-2 Alg. 1) and its
launch (:func:`flash_attn_fwd`)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .._host import heads_per_section, next_pow2
from .common import INTERPRET, LOG2E, _allowed, _doc_kv_range, _doc_ok, _doc_ptrs, _kv_range, _table_row, \
    _tile_schedule
from .config import FlashConfig, current_flash_config
from .gluon import check_gluon_fwd, choose_fwd_impl, gluon_flash_fwd
from .launch import KERNELS, _PLANS, _aligned, _bnhd_empty, _bucket, _get_plan, _mode_args, _plan_launch, \
    sink_tokens, streams_by_tma
from .sparse import sparse_mode, sparse_tiles


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd, start_n,
              offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
              Kd, Vd, b, hk, TMA: tl.constexpr, dilation, DILATED: tl.constexpr,
              offs_dv, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr, DocQb, DocKb, DOCS: tl.constexpr,
              SINK: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ptrs = Kb + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    v_ptrs = Vb + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd  # (BLOCK_N, BLOCK_DV)
    if TMA:  # tensor-memory-accelerator copies (Hopper); rows past Nk arrive as zeros (only when Dv == D)
        k = tl.trans(Kd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        v = Vd.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
    elif MASKED:
        k = tl.load(k_ptrs, mask=(offs_n[None, :] < Nk) & (offs_d[:, None] < HEAD_D), other=0.0)
        v = tl.load(v_ptrs, mask=(offs_n[:, None] < Nk) & (offs_dv[None, :] < HEAD_DV), other=0.0)
    else:
        if BLOCK_D != HEAD_D:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_D, other=0.0)
        else:
            k = tl.load(k_ptrs)
        if BLOCK_DV != HEAD_DV:
            v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DV, other=0.0)
        else:
            v = tl.load(v_ptrs)
    qk = tl.dot(q, k, input_precision=DOT_PREC)
    if MASKED:
        ok = _allowed(offs_m[:, None], offs_n[None, :], Nq, Nk, offset, win_left, win_right, LAYOUT, lay_nb, lay_bs,
                      dilation, HAS_LEFT, HAS_RIGHT, SPARSE, DILATED, SINK)
        if DOCS:
            ok = _doc_ok(ok, DocQb, DocKb, offs_m[:, None], offs_n[None, :], Nq, Nk)
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
                Hq, Nq, Nk, offset, group, qk_scale, win_left, win_right, dilation,
                KV_IDX, KV_CNT, KV_NFULL, stride_tbl, LAYOUT, lay_nb, lay_bs, DOC, N_BUCKET, SECTION, Kd, Vd,
                HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                SPARSE: tl.constexpr, DOT_PREC: tl.constexpr, TMA: tl.constexpr, DILATED: tl.constexpr,
                DOCS: tl.constexpr, LPT: tl.constexpr, SINK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    n_mblocks = tl.cdiv(Nq, BLOCK_M)
    if SPARSE:  # table rows are in schedule order (heaviest first); column 0 holds the query tile
        mblk = tl.load(KV_IDX + tl.program_id(0) * stride_tbl)
        bh = tl.program_id(1)
    else:
        rank, bh = _tile_schedule(SECTION, LPT)
        mblk = n_mblocks - 1 - rank  # heaviest (causal) tiles first
    b = bh // Hq
    h = bh % Hq
    hk = h // group
    start_m = mblk * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)  # v's head dim (Dv may differ from D: MLA)
    Qb = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    Kb = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    Vb = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    q = tl.load(Qb + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_D), other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_ptrs(DOC, b, Nq, Nk)  # (DOCS only; never read otherwise)
    if SPARSE and DOCS:  # the table's tiles inside the documents' key span; full only if full for both
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        n_kb = tl.cdiv(Nk, BLOCK_N)
        dlo, dhi, dflo, dfhi = _doc_kv_range(n_kb * 0, n_kb, n_kb * 0, n_kb, start_m, Nq, DocQb, QLob, QHib,
                                             BLOCK_M, BLOCK_N)
        for t in range(0, cnt):
            nblk = tl.load(tbl + t)
            if (t < nfull) & (nblk >= dflo) & (nblk < dfhi):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                          win_right, LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE,
                                          BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                          offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
            elif (nblk >= dlo) & (nblk < dhi):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                          win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                          BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                          offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
    elif SPARSE:  # table row ordered full tiles first: two branch-free loops
        cnt, nfull, tbl = _table_row(KV_IDX, KV_CNT, KV_NFULL, stride_tbl)
        for t in range(0, nfull):
            nblk = tl.load(tbl + t)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                      win_right, LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                      offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        for t in range(nfull, cnt):
            nblk = tl.load(tbl + t)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                      win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                      offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
    else:
        lo, hi, flo, fhi = _kv_range(start_m, Nq, Nk, offset, win_left, win_right, BLOCK_M, BLOCK_N,
                                     HAS_LEFT, HAS_RIGHT)
        if DOCS:  # only the key tiles of this query tile's documents
            lo, hi, flo, fhi = _doc_kv_range(lo, hi, flo, fhi, start_m, Nq, DocQb, QLob, QHib, BLOCK_M, BLOCK_N)
        if SINK > 0:  # attention sinks: the tiles of keys j < SINK left of the band, masked (the band's own below)
            for nblk in range(0, tl.minimum((SINK + BLOCK_N - 1) // BLOCK_N, lo)):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                          win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                          BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                          offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        if HAS_LEFT or DOCS:  # partial tiles left of the full band (none without a left window edge / documents)
            for nblk in range(lo, flo):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                          nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left,
                                          win_right, LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                          BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                      offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        for nblk in range(flo, fhi):  # full tiles: no element mask, no bounds checks
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                                      LAYOUT, lay_nb, lay_bs, DILATED, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                      offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
        for nblk in range(fhi, hi):  # partial tiles right of the band (causal diagonal, ragged tail)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, Kb, Vb, stride_kn, stride_kd, stride_vn, stride_vd,
                                      nblk * BLOCK_N, offs_m, offs_d, qk_scale, Nq, Nk, offset, win_left, win_right,
                                      LAYOUT, lay_nb, lay_bs, True, HAS_LEFT, HAS_RIGHT, SPARSE,
                                      BLOCK_N, HEAD_D, BLOCK_D, DOT_PREC, Kd, Vd, b, hk, TMA, dilation, DILATED,
                                      offs_dv, HEAD_DV, BLOCK_DV, DocQb, DocKb, DOCS, SINK)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    Ob = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(Ob + offs_m[:, None] * stride_on + offs_dv[None, :] * stride_od, acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DV))
    tl.store(Lse + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)


KERNELS["fwd"] = _fwd_kernel

FWD_LPT = False
"""Whether the Triton forward launches its dense / causal / window / document tiles longest-first across sections
of (batch, head) pairs (:func:`~kernels.flash.common._tile_schedule`, sections of :func:`lpt_section` heads) instead
of one (batch, head) after another. Block-sparse launches keep their table order. A module-level knob, part of each
launch plan's key. Off: no measurable gain. H100, 2026-12-07 (``python -m lab.lpt_ab``, ``results/h100/2026-12-07d/
lpt*/``; forward alone, bf16, H 16, 16k tokens per call, 5 rotated rounds, outputs bitwise equal in every case):
with 4 MiB sections against the head-major order, causal D 128 1k / 2k / 4k 0.999 / 0.998 / 1.031x, full 1k 1.008x,
GQA 4:1 causal 4k 1.039x, D 64 causal 1k / 4k 1.004 / 1.007x; but causal 16k read 1.051x with one-head sections,
which launch in the head-major order, so about 5 % is noise. 16 MiB sections: causal 1k 0.949x, 4k 1.029x. One
section (no L2 grouping) loses 0.48-0.76x at N 1k-2k: K / V fall out of L2."""
LPT_SECTION_BYTES = 4 << 20
"""The K / V bytes one LPT section may hold (4 MiB: the best of 4 and 16 MiB in the readings of :data:`FWD_LPT`)."""


def lpt_section(n_bh: int, Nk: int, D: int, Dv: int, elt: int, group: int) -> int:
    """(batch, head) pairs per LPT section: as many query heads as keep their K / V (``Nk x (D + Dv)`` elements of
    ``elt`` bytes per KV head, shared by ``group`` query heads) within :data:`LPT_SECTION_BYTES`; at least 1, at
    most ``n_bh``."""
    return heads_per_section(LPT_SECTION_BYTES, n_bh, Nk, D, Dv, elt, group)


def fwd_tma(q, k, v, win_left, win_right, layout, config) -> bool:
    """Whether the Triton forward streams K / V by TMA descriptors (its ``TMA`` constexpr): :func:`streams_by_tma`.
    The mask as :func:`flash_attn_fwd` takes it."""
    return streams_by_tma(q, k, v, win_left, win_right, layout, config, k, v)


def _fwd_meta(q, k, v, win_left, win_right, layout, layout_bs, dilation, config, docs=False, sink=0):
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    Dv = v.shape[3]
    block_d = max(16, next_pow2(D))
    return dict(HEAD_D=D, BLOCK_D=block_d, HEAD_DV=Dv, BLOCK_DV=max(16, next_pow2(Dv)), HAS_LEFT=win_left >= 0,
                HAS_RIGHT=win_right >= 0,
                SPARSE=sparse_mode(layout, layout_bs, sparse_tiles(D, config)[0], Nq, Nk, config),
                DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
                TMA=fwd_tma(q, k, v, win_left, win_right, layout, config), DILATED=dilation > 1,
                DOCS=docs, LPT=FWD_LPT, SINK=sink)


def flash_attn_fwd(q, k, v, softmax_scale: float, win_left: int = -1, win_right: int = -1,
                   layout: Optional[torch.Tensor] = None, layout_bs: int = 0,
                   kv_idx: Optional[torch.Tensor] = None, kv_cnt: Optional[torch.Tensor] = None,
                   kv_nfull: Optional[torch.Tensor] = None, *, dilation: int = 1,
                   config: Optional[FlashConfig] = None,
                   documents: Optional[torch.Tensor] = None, sink_size: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launch. ``win_left`` / ``win_right`` < 0 mean unbounded (causal is ``win_right = 0``); ``dilation``
    > 1 keeps only keys with ``(i + Nk - Nq - j) % dilation == 0`` (every visited tile masked).

    Block-sparse: ``layout`` bool/int ``(nb, nb)`` at ``layout_bs`` tokens and the query-tile block table
    built by :func:`build_sparse_tables` at ``sparse_tiles(D, config)[0]``: ``kv_idx`` int32 ``(n_q_tiles,
    max_visits)`` (each row full tiles first), ``kv_cnt`` int32 ``(n_q_tiles,)`` visited tiles, ``kv_nfull`` int32
    ``(n_q_tiles,)`` full tiles. ``config``: default the current settings. ``v`` may have its own head dim ``Dv``
    (MLA; TMA only when ``Dv == D``). ``config.fwd_impl``: ``"auto"`` picks the kernel per call
    (:func:`~kernels.flash.gluon.choose_fwd_impl`); ``"gluon_ws3a"`` / ``"gluon_ws3b"`` run the Gluon kernel of
    :mod:`kernels.flash.gluon` instead of the Triton one (band masks: dense, causal, windows, documents; a
    block-sparse layout of whole 128 x 128 tiles without documents, from its own cached table; another layout or
    dilation raises ``ValueError``, see
    :func:`~kernels.flash.gluon.check_gluon_fwd`). ``documents``: the document table of :func:`kernels.flash.documents.
    document_table` (packed documents: tiles across documents skipped, ``doc_q == doc_k`` on straddling tiles). Returns ``(out (B, Hq, Nq, Dv) q.dtype, stored as (B, Nq, Hq, Dv), lse (B, Hq,
    Nq) fp32)``.
    ``sink_size``: attention sinks (StreamingLLM), keys ``j < sink_size`` pass the left window edge (a no-op without
    one); Triton only: no layout, dilation or documents with it (:func:`sink_tokens`, ``ValueError``).
    """
    if config is None:
        config = current_flash_config()
    sink = sink_tokens(sink_size, win_left, layout, dilation, documents) if sink_size else 0
    impl = config.fwd_impl
    if impl == "auto":
        impl = choose_fwd_impl(config, q, k, v, win_left, win_right, layout, dilation, documents, layout_bs,
                               sink_size=sink)
    if impl != "triton":  # the Gluon kernel (Hopper; band masks and whole-tile layouts, else ValueError)
        check_gluon_fwd(impl, q, k, v, win_left, win_right, layout, dilation, documents, layout_bs, sink_size=sink)
        return gluon_flash_fwd(q, k, v, softmax_scale, win_left, win_right, impl, documents=documents,
                               layout=layout, layout_bs=layout_bs)
    if INTERPRET and q.dtype == torch.bfloat16:  # the CPU interpreter's bf16 tl.dot is wrong (triton 3.9): fp32
        out, lse = flash_attn_fwd(q.float(), k.float(), v.float(), softmax_scale, win_left, win_right, layout,
                                  layout_bs, kv_idx, kv_cnt, kv_nfull, dilation=dilation, config=config,
                                  documents=documents, sink_size=sink)
        return out.to(q.dtype), lse
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    sparse_key = None if layout is None else (layout.shape, layout_bs, kv_idx.shape)
    # the section is an int argument Triton specialises on (== 1, % 16): a plan's kept launch fixes it, so it is
    # part of the key; 1 without LPT (the kernel ignores it then)
    section = lpt_section(B * Hq, Nk, D, v.shape[3], q.element_size(), Hq // Hkv) if FWD_LPT else 1
    key = ("fwd", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, softmax_scale,
           win_left,
           win_right, sparse_key, _aligned(q, k, v), config, dilation, documents is not None, sink, FWD_LPT, section)
    plan = _PLANS.get(key) or _get_plan(key, lambda: {"fwd": _fwd_meta(q, k, v, win_left, win_right, layout,
                                                                        layout_bs, dilation, config,
                                                                        documents is not None, sink)})
    out = _bnhd_empty(B, Hq, Nq, v.shape[3], q.dtype, q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    m = _mode_args(q, layout, (kv_idx, kv_cnt, kv_nfull), documents)
    _plan_launch(plan, "fwd", B * Hq, Nq, (
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        Hq, Nq, Nk, Nk - Nq, Hq // Hkv, softmax_scale * LOG2E, max(win_left, 0), max(win_right, 0), dilation,
        m["idx"], m["cnt"], m["nfull"], m["stride_tbl"], m["lay"], m["lay_nb"], max(layout_bs, 1), m["doc"],
        _bucket(Nq), section),
        plan.meta["fwd"], (k, v), q.device, config)
    return out, lse
