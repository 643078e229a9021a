"""Fused Triton linear attention (Katharopoulos et al. 2020), chunked causal and non-causal, forward + backward.

:func:`linear_attention` takes feature tensors ``phi(q) (B, Hq, Nq, F)``, ``phi(k) (B, Hkv, Nk, F)`` and
``v (B, Hkv, Nk, Dv)`` (``Hkv`` divides ``Hq``), or raw ``q`` / ``k`` with the feature maps ``elu1`` / ``relu``
applied in-kernel; ``F, Dv <= 256``, chunk size a power of two in [16, 128]. The algorithm (segmented single pass,
fp32 states in registers, precision rules) is described in docs/linear_kernel.md; the step-by-step recurrence it
is tested against is :func:`attn_zoo.reference.linear_attention_recurrent`.

Settings are passed explicitly: :class:`LinearConfig` (``config=``) or :func:`linear_settings` for a block of
calls; :func:`record_launches` reports the tile config, registers and spills of each kernel launched in a block.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from ._host import _interpreting, cdiv, check_bool, check_eps, is_int, launch, next_pow2

__all__ = ["linear_attention", "LinearConfig", "linear_settings", "current_linear_config", "record_launches",
           "tile_configs", "tile_blocks", "query_segment_len", "KERNELS", "MAX_DIM", "FUSED_FEATURE_MAPS",
           "CHUNK_SIZES", "document_index", "document_bounds", "feature_pad"]

MAX_DIM = 256
FUSED_FEATURE_MAPS = {None: 0, "none": 0, "elu1": 1, "relu": 2}
CHUNK_SIZES = (16, 32, 64, 128)


# ----------------------------------------------------------------------------------------------- helpers
@triton.jit
def _phi(x, mask, FM: tl.constexpr):
    """Feature map applied to a loaded tile (fp32 math, result in x.dtype); out-of-range entries -> 0."""
    if FM == 1:
        xf = x.to(tl.float32)
        y = tl.where(xf > 0, xf + 1.0, tl.exp(tl.where(xf > 0, 0.0, xf)))  # NaN stays NaN (tl.minimum drops it)
        return tl.where(mask, y, 0.0).to(x.dtype)
    elif FM == 2:
        xf = x.to(tl.float32)
        return tl.where(mask, tl.where(xf < 0, 0.0, xf), 0.0).to(x.dtype)  # NaN stays NaN
    else:
        return x


@triton.jit
def _phi_grad(x, FM: tl.constexpr, DFM: tl.constexpr):
    """d phi / d x (fp32) of feature map ``FM`` from the raw input ``x``, or (``FM == 0``) of feature map ``DFM``
    from its output ``x = phi(x_raw)``: elu1' = 1 where phi > 1 (x > 0), else phi = exp(x); relu' = [phi > 0]."""
    xf = x.to(tl.float32)
    if FM == 1:
        return tl.where(xf > 0, 1.0, tl.exp(tl.where(xf > 0, 0.0, xf)))
    elif FM == 2:
        return tl.where(xf < 0, 0.0, tl.where(xf > 0, 1.0, xf * 0.0))  # relu'(0) = 0; NaN stays NaN
    elif DFM == 1:
        return tl.where(xf > 1.0, 1.0, xf)  # NaN stays NaN
    else:
        return tl.where(xf > 0, 1.0, xf * 0.0)  # phi = relu(x) >= 0; NaN stays NaN


@triton.jit
def _phi_rows(X, Y, pid, NROWS, H, N, F, sxb, sxh, sxn, sxf, FM: tl.constexpr, BR: tl.constexpr, FP: tl.constexpr):
    """Rows ``pid * BR ...`` of Y = phi(X), X (B, H, N, F) at any strides, Y contiguous (fp32 math, X's dtype)."""
    rows = pid.to(tl.int64) * BR + tl.arange(0, BR)
    of = tl.arange(0, FP)
    mr = rows < NROWS
    m = mr[:, None] & (of < F)[None, :]
    b = rows // (H * N)
    h = (rows // N) % H
    n = rows % N
    src = X + (b * sxb + h * sxh + n * sxn)[:, None] + of[None, :].to(tl.int64) * sxf
    x = tl.load(src, mask=m, other=0.0)
    tl.store(Y + rows[:, None] * F + of[None, :], _phi(x, m, FM), mask=m)


@triton.jit
def _phi_map(X1, Y1, NR1, H1, N1, s1b, s1h, s1n, s1f, X2, Y2, NR2, H2, N2, s2b, s2h, s2n, s2f, F,
             FM: tl.constexpr, BR: tl.constexpr, FP: tl.constexpr):
    """The feature pre-pass: phi of two tensors (q and k) in one launch, programs of X1 first."""
    P1 = tl.cdiv(NR1, BR)
    pid = tl.program_id(0)
    if pid < P1:
        _phi_rows(X1, Y1, pid, NR1, H1, N1, F, s1b, s1h, s1n, s1f, FM, BR, FP)
    else:
        _phi_rows(X2, Y2, pid - P1, NR2, H2, N2, F, s2b, s2h, s2n, s2f, FM, BR, FP)


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UP: tl.constexpr):
    """tl.dot of two input-dtype tiles (fp32 accumulate). UP: upcast first (the CPU interpreter's bf16 dot is
    wrong in some Triton versions; bf16 values are exact in fp32, so the result is the same product)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _mm(a, b, P, LOWP: tl.constexpr, SPREC: tl.constexpr, UP: tl.constexpr):
    """a @ b with fp32 accumulation for operands that may be fp32 (states, g = dout / den, dA). LOWP: both
    operands rounded to P's element type (the input dtype: 16-bit tensor-core product); else fp32 operands at
    SPREC (tf32 / ieee). The rounding happens before any interpreter upcast (UP), so CPU tests see it."""
    if LOWP:
        return _dot(a.to(P.dtype.element_ty), b.to(P.dtype.element_ty), SPREC, UP)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=SPREC)


# ----------------------------------------------------------------------------------------------- segment sums
@triton.jit
def _sum_block(F, DV, L, N, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr):
    """Program -> (K/V head, segment, F block, Dv block) of the segment-sum kernels (grid axis 0: the F x Dv blocks
    of one (segment, head) fastest, so they share their tiles in L2; axis 1: the segment). Returns the head
    ``bkv`` (int64), the segment ``s``, the block's F / Dv offsets and masks, its first row and chunk count."""
    NB = tl.cdiv(F, BK) * tl.cdiv(DV, BV)
    pid = tl.program_id(0) % NB
    bkv = (tl.program_id(0) // NB).to(tl.int64)
    s = tl.program_id(1)
    NVB = tl.cdiv(DV, BV)
    ok = (pid // NVB) * BK + tl.arange(0, BK)
    ov = (pid % NVB) * BV + tl.arange(0, BV)
    start = s * L
    nt = tl.cdiv(tl.minimum(L, N - start), C)
    return bkv, s, ok, ov, ok < F, ov < DV, pid % NVB, start, nt


@triton.jit
def _store_sums(SS, ZS, S, z, bkv, s, NS, F, DV, ok, ov, mk, mv, pv):
    """Store one block of a segment's sums: ``S`` (BK x BV) and, from the first Dv block only, ``z`` (BK)."""
    sidx = bkv * NS + s
    tl.store(SS + sidx * F * DV + ok[:, None] * DV + ov[None, :], S, mask=mk[:, None] & mv[None, :])
    tl.store(ZS + sidx * F + ok, z, mask=mk & ((ok * 0 + pv) == 0))


@triton.jit
def _doc_at(DOC, b, N, pos):
    """The document of position ``pos`` clamped to [0, N - 1] of batch row ``b``, as its first position (int32;
    ``DOC`` (B, 2, N): :func:`document_bounds`): position -1 counts as the first document (start 0: the initial
    state belongs to it). Two positions are in one document iff their starts are equal."""
    return tl.load(DOC + b * 2 * N + tl.minimum(tl.maximum(pos, 0), N - 1))


@triton.jit
def _doc_end(DOC, b, N, pos):
    """The end (one past the last position) of the document of position ``pos`` (in [0, N - 1]) of row ``b``."""
    return tl.load(DOC + b * 2 * N + N + pos)


@triton.jit
def _start_state(S, z, SS, ZS, S0, Z0, bkv, s, NSS, F, DV, soff, msk, offs_f, mf, DOC, b, N, L,
                 HAS_0: tl.constexpr, HAS_SS: tl.constexpr, CAUSAL: tl.constexpr, DOCS: tl.constexpr):
    """A sweep's start state (a block of ``S`` at offsets ``soff`` and ``z`` at ``offs_f``): the initial state
    plus the segment sums before segment ``s`` (causal) or of all key segments (non-causal), added in-kernel.
    DOCS (causal): only the sums of the document running at the segment's start (``dprev``, returned: its first
    position): the initial state if that is the first document, and the sums of the earlier segments that end in it
    (each segment's sum holds its last document only)."""
    dprev = 0
    if DOCS:
        dprev = _doc_at(DOC, b, N, s * L - 1)
    if HAS_0:
        if DOCS:
            S += tl.load(S0 + bkv * F * DV + soff, mask=msk & ((soff * 0 + dprev) == 0), other=0.0)
            z += tl.load(Z0 + bkv * F + offs_f, mask=mf & ((offs_f * 0 + dprev) == 0), other=0.0)
        else:
            S += tl.load(S0 + bkv * F * DV + soff, mask=msk, other=0.0)
            z += tl.load(Z0 + bkv * F + offs_f, mask=mf, other=0.0)
    if HAS_SS:
        if CAUSAL:
            nsum = s
        else:
            nsum = NSS
        for j in range(nsum):
            if DOCS:
                dj = _doc_at(DOC, b, N, (j + 1) * L - 1)
                S += tl.load(SS + (bkv * NSS + j) * F * DV + soff, mask=msk & ((soff * 0 + dj) == dprev), other=0.0)
                z += tl.load(ZS + (bkv * NSS + j) * F + offs_f, mask=mf & ((offs_f * 0 + dj) == dprev), other=0.0)
            else:
                S += tl.load(SS + (bkv * NSS + j) * F * DV + soff, mask=msk, other=0.0)
                z += tl.load(ZS + (bkv * NSS + j) * F + offs_f, mask=mf, other=0.0)
    return S, z, dprev


# ----------------------------------------------------------------------------------------------- forward
@triton.jit
def _chunk_mask(causal_m, oc, dloc, DOCS: tl.constexpr):
    """The (C x C) causal mask of a chunk, ``causal_m`` (query row i, key column j); DOCS: and the same document,
    which under the causal mask is ``j >= dloc_i`` (``dloc``: the start of each row's document, relative to the
    chunk's first row; documents are contiguous), a compare against a row vector only."""
    if DOCS:
        causal_m = causal_m & (oc[None, :] >= dloc[:, None])
    return causal_m


@triton.jit
def _carry_state(S, z, k, v, rows, dl, dprev, DOCS: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr):
    """The state leaving a chunk of keys ``k`` (C x F) and values ``v`` (C x Dv): ``S += k^T v``, ``z += sum_j k_j``.
    DOCS (causal; ``rows`` the chunk's positions, ``dl`` the first position of its last document, ``dprev`` that of
    the one running at its start): carry only into a chunk without a document start and keep the last document's
    keys (``rows >= dl``: a compare with a scalar). Returns ``S, z`` and the document running at the next chunk's
    start (``dprev`` unchanged without documents)."""
    if DOCS:
        k = tl.where((rows >= dl)[:, None], k, 0.0)
        S = tl.where(dl == dprev, S, 0.0) + _dot(tl.trans(k), v, PREC, UP)
        z = tl.where(dl == dprev, z, 0.0) + tl.sum(k.to(tl.float32), 0)
        dprev = dl
    else:
        S += _dot(tl.trans(k), v, PREC, UP)
        z += tl.sum(k.to(tl.float32), 0)
    return S, z, dprev


@triton.jit
def _seg_state(
    K, V, SS, ZS,
    NK, F, DV, L, NS, DOC, HKV,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr,
    STG: tl.constexpr, DOCS: tl.constexpr,
):
    """Per-segment sums phi(K)^T V (BK x BV block) and sum phi(K) over the segment's keys (fp32). DOCS: over the
    keys of the segment's last document only (what the state carries out of the segment): the positions from its
    start ``dlast`` on; the chunks before it are skipped."""
    bkv, s, ok, ov, mk, mv, pv, start, nt = _sum_block(F, DV, L, NK, BK, BV, C)
    oc = tl.arange(0, C)
    i0 = 0
    dlast = 0
    if DOCS:
        dlast = _doc_at(DOC, bkv // HKV, NK, tl.minimum(start + L, NK) - 1)
        i0 = tl.maximum(dlast - start, 0) // C
    S = tl.zeros([BK, BV], dtype=tl.float32)
    z = tl.zeros([BK], dtype=tl.float32)
    kbase = K + bkv * NK * F
    vbase = V + bkv * NK * DV
    for i in tl.range(i0, nt, num_stages=STG):
        rows = start + i * C + oc
        mr = rows < NK
        if DOCS:
            mr = mr & (rows >= dlast)
        mrk = mr[:, None] & mk[None, :]
        k = tl.load(kbase + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
        k = _phi(k, mrk, FM)
        v = tl.load(vbase + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
        S += _dot(tl.trans(k), v, PREC, UP)
        z += tl.sum(k.to(tl.float32), 0)
    _store_sums(SS, ZS, S, z, bkv, s, NS, F, DV, ok, ov, mk, mv, pv)


@triton.jit
def _seg_fwd(
    Q, K, V, SS, ZS, S0, Z0, O, DEN, ST, ZT,
    NQ, NK, F, DV, L, HQ, G, NSS, eps, DOC,
    C: tl.constexpr, FP: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SS: tl.constexpr, HAS_0: tl.constexpr, STORE_T: tl.constexpr, S16: tl.constexpr, PREC: tl.constexpr,
    SPREC: tl.constexpr, UP: tl.constexpr, STG: tl.constexpr, DOCS: tl.constexpr,
):
    """One segment of one query head, one BV block of Dv: start state (S0 plus the segment sums before it) in
    registers, sweep the chunks. DOCS (causal): a row reads the carried state only if it is in the document
    running at the chunk's start (``dprev``); the chunk's scores are masked to one document; the state leaving
    the chunk holds its last document's keys (plus the carried state if no document starts in the chunk)."""
    NB = tl.cdiv(DV, BV)
    pv = tl.program_id(0) % NB  # fastest: the Dv blocks of one (segment, head) share q, k tiles in L2
    bh = (tl.program_id(0) // NB).to(tl.int64)
    s = tl.program_id(1)
    HKV = HQ // G
    bkv = (bh // HQ) * HKV + (bh % HQ) // G
    of = tl.arange(0, FP)
    mf = of < F
    ov = pv * BV + tl.arange(0, BV)
    mv = ov < DV
    oc = tl.arange(0, C)
    causal_m = oc[:, None] >= oc[None, :]
    mfv = mf[:, None] & mv[None, :]
    soff = of[:, None] * DV + ov[None, :]
    S = tl.zeros([FP, BV], dtype=tl.float32)
    z = tl.zeros([FP], dtype=tl.float32)
    b = bh // HQ
    S, z, dprev = _start_state(S, z, SS, ZS, S0, Z0, bkv, s, NSS, F, DV, soff, mfv, of, mf, DOC, b, NQ, L,
                               HAS_0, HAS_SS, CAUSAL, DOCS)
    qbase = Q + bh * NQ * F
    kbase = K + bkv * NK * F
    vbase = V + bkv * NK * DV
    obase = O + bh * NQ * DV
    start = s * L
    nt = tl.cdiv(tl.minimum(L, NQ - start), C)
    for i in tl.range(nt, num_stages=STG):
        rows = start + i * C + oc
        mr = rows < NQ
        mrf = mr[:, None] & mf[None, :]
        mrv = mr[:, None] & mv[None, :]
        q = tl.load(qbase + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
        q = _phi(q, mrf, FM)
        if S16:
            acc = _dot(q, S.to(q.dtype), PREC, UP)
        else:
            acc = tl.dot(q.to(tl.float32), S, input_precision=SPREC)
        den = tl.sum(q.to(tl.float32) * z[None, :], 1)
        if DOCS:  # only the rows of the document running at the chunk's start read the carried state: the other
            # rows' state terms are dropped through row factors (vectors; no select on a tile)
            d = tl.load(DOC + b * 2 * NQ + rows, mask=mr, other=0)  # each row's document start
            dl = _doc_at(DOC, b, NQ, start + i * C + C - 1)  # the chunk's last document
            rs = (d == dprev).to(tl.float32)
            den = den * rs
        else:
            d, dl = dprev, dprev  # d, dl: unread without documents
        if CAUSAL:
            k = tl.load(kbase + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
            k = _phi(k, mrf, FM)
            v = tl.load(vbase + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
            A = _dot(q, tl.trans(k), PREC, UP)
            A = tl.where(_chunk_mask(causal_m, oc, d - (start + i * C), DOCS), A, 0.0)
            den += tl.sum(A, 1)
            den = den + eps
            rden = 1.0 / den
            P = A * rden[:, None]  # in [0, 1]: safe in fp16
            if DOCS:
                acc = acc * (rden * rs)[:, None] + _dot(P.to(v.dtype), v, PREC, UP)
            else:
                acc = acc * rden[:, None] + _dot(P.to(v.dtype), v, PREC, UP)
            S, z, dprev = _carry_state(S, z, k, v, rows, dl, dprev, DOCS, PREC, UP)
        else:
            den = den + eps
            acc = acc / den[:, None]
        tl.store(obase + rows[:, None] * DV + ov[None, :], acc.to(O.dtype.element_ty), mask=mrv)
        tl.store(DEN + bh * NQ + rows, den, mask=mr & ((rows * 0 + pv) == 0))
    if STORE_T:  # final state: written by the last segment's programs of the group's first query head
        if ((bh % HQ) % G == 0) & (s == tl.num_programs(1) - 1):
            tl.store(ST + bkv * F * DV + soff, S, mask=mfv)
            tl.store(ZT + bkv * F + of, z, mask=mf & ((of * 0 + pv) == 0))


# ----------------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_pre(O, DO, DEN, CD, RDEN, NROWS, DV, BM: tl.constexpr, BV: tl.constexpr):
    """c = -(dout . out) / den and 1 / den, per row (fp32): the sweeps multiply by 1 / den (a division per
    element costs ~10 instructions)."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BM + tl.arange(0, BM)
    mr = rows < NROWS
    dot = tl.zeros([BM], dtype=tl.float32)
    for vb in range(0, DV, BV):
        ov = vb + tl.arange(0, BV)
        m = mr[:, None] & (ov < DV)[None, :]
        o = tl.load(O + rows[:, None] * DV + ov[None, :], mask=m, other=0.0).to(tl.float32)
        do = tl.load(DO + rows[:, None] * DV + ov[None, :], mask=m, other=0.0).to(tl.float32)
        dot += tl.sum(o * do, 1)
    den = tl.load(DEN + rows, mask=mr, other=1.0)
    rden = 1.0 / den
    tl.store(CD + rows, -dot * rden, mask=mr)
    tl.store(RDEN + rows, rden, mask=mr)


@triton.jit
def _seg_dstate(
    Q, DO, RDEN, CD, DSS, DZS,
    NQ, F, DV, L, HQ, G: tl.constexpr, NS, DOC,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr, SPREC: tl.constexpr,
    LOWP: tl.constexpr, UP: tl.constexpr, STG: tl.constexpr, DOCS: tl.constexpr,
):
    """Per-segment sums over the K/V group's query heads of phi(Q)^T G and sum c phi(Q) (fp32). DOCS: over the
    queries of the segment's first document only (what the state gradient carries back out of the segment): the
    positions before its end ``dfirst``; the chunks after it are skipped."""
    bkv, s, ok, ov, mk, mv, pv, start, nt = _sum_block(F, DV, L, NQ, BK, BV, C)
    HKV = HQ // G
    b = bkv // HKV
    hk = bkv % HKV
    oc = tl.arange(0, C)
    dfirst = NQ
    if DOCS:
        dfirst = _doc_end(DOC, b, NQ, start)
        nt = tl.cdiv(tl.minimum(dfirst - start, nt * C), C)
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    dz = tl.zeros([BK], dtype=tl.float32)
    for g in range(G):  # outside the chunk loop (the sums commute): the chunk loop stays innermost, prefetched
        bq = b * HQ + hk * G + g
        for i in tl.range(nt, num_stages=STG):
            rows = start + i * C + oc
            mr = rows < NQ
            if DOCS:
                mr = mr & (rows < dfirst)
            mrk = mr[:, None] & mk[None, :]
            q = tl.load(Q + bq * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            q = _phi(q, mrk, FM)
            do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :],
                         other=0.0)
            rden = tl.load(RDEN + bq * NQ + rows, mask=mr, other=1.0)
            cd = tl.load(CD + bq * NQ + rows, mask=mr, other=0.0)
            gm = do.to(tl.float32) * rden[:, None]
            dS += _mm(tl.trans(q), gm, Q, LOWP, SPREC, UP)
            dz += tl.sum(q.to(tl.float32) * cd[:, None], 0)
    _store_sums(DSS, DZS, dS, dz, bkv, s, NS, F, DV, ok, ov, mk, mv, pv)


@triton.jit
def _seg_dq(
    Q, K, V, DO, RDEN, CD, SS, ZS, S0, Z0, DQ,
    NQ, NK, F, DV, L, HQ, G, NSS, DOC,
    C: tl.constexpr, BK: tl.constexpr, DVP: tl.constexpr, FM: tl.constexpr, DFM: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SS: tl.constexpr, HAS_0: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr,
    LOWP: tl.constexpr, UP: tl.constexpr, STG: tl.constexpr, DOCS: tl.constexpr,
):
    """dq of one segment, one query head, one BK block of F: prefix S (BK x Dv), z in registers, forward sweep.
    DOCS (causal): the forward's document rules (carried state read by the chunk's leading document only)."""
    NB = tl.cdiv(F, BK)
    pk = tl.program_id(0) % NB
    bh = (tl.program_id(0) // NB).to(tl.int64)
    s = tl.program_id(1)
    HKV = HQ // G
    bkv = (bh // HQ) * HKV + (bh % HQ) // G
    ok = pk * BK + tl.arange(0, BK)
    mk = ok < F
    od = tl.arange(0, DVP)
    md = od < DV
    oc = tl.arange(0, C)
    causal_m = oc[:, None] >= oc[None, :]
    soff = ok[:, None] * DV + od[None, :]
    msk = mk[:, None] & md[None, :]
    S = tl.zeros([BK, DVP], dtype=tl.float32)
    z = tl.zeros([BK], dtype=tl.float32)
    b = bh // HQ
    S, z, dprev = _start_state(S, z, SS, ZS, S0, Z0, bkv, s, NSS, F, DV, soff, msk, ok, mk, DOC, b, NQ, L,
                               HAS_0, HAS_SS, CAUSAL, DOCS)
    start = s * L
    nt = tl.cdiv(tl.minimum(L, NQ - start), C)
    for i in tl.range(nt, num_stages=STG):
        rows = start + i * C + oc
        mr = rows < NQ
        mrk = mr[:, None] & mk[None, :]
        mrd = mr[:, None] & md[None, :]
        do = tl.load(DO + bh * NQ * DV + rows[:, None] * DV + od[None, :], mask=mrd, other=0.0)
        rden = tl.load(RDEN + bh * NQ + rows, mask=mr, other=1.0)
        cd = tl.load(CD + bh * NQ + rows, mask=mr, other=0.0)
        if DOCS:  # the rows of other documents than the running one drop their state terms through 1 / den and c
            d = tl.load(DOC + b * 2 * NQ + rows, mask=mr, other=0)  # each row's document start
            dl = _doc_at(DOC, b, NQ, start + i * C + C - 1)  # the chunk's last document
            rs = (d == dprev).to(tl.float32)
            rden_s = rden * rs
            cd_s = cd * rs
        else:
            d, dl, rden_s, cd_s = dprev, dprev, rden, cd  # d, dl: unread without documents
        if LOWP:  # (dout S^T) / den: the 16-bit product needs no rounded g
            dq = _mm(do, tl.trans(S), Q, LOWP, SPREC, UP) * rden_s[:, None] + cd_s[:, None] * z[None, :]
        else:
            gm = do.to(tl.float32) * rden_s[:, None]
            dq = tl.dot(gm, tl.trans(S), input_precision=SPREC) + cd_s[:, None] * z[None, :]
        if CAUSAL:
            v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + od[None, :], mask=mrd, other=0.0)
            k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            k = _phi(k, mrk, FM)
            dA = _dot(do, tl.trans(v), PREC, UP) * rden[:, None]  # g . v: exact 16-bit products, fp32 sums
            dA = tl.where(_chunk_mask(causal_m, oc, d - (start + i * C), DOCS), dA + cd[:, None], 0.0)
            dq += _mm(dA, k, Q, LOWP, SPREC, UP)
            S, z, dprev = _carry_state(S, z, k, v, rows, dl, dprev, DOCS, PREC, UP)
        if FM + DFM != 0:  # chain rule: phi'(q) from q (FM) or from phi(q) (DFM: Q holds the features)
            q = tl.load(Q + bh * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            dq = dq * _phi_grad(q, FM, DFM)
        tl.store(DQ + bh * NQ * F + rows[:, None] * F + ok[None, :], dq.to(DQ.dtype.element_ty), mask=mrk)


@triton.jit
def _dkdv_docs(x, dS, dnext, DOC, b, NK, c0, rows, mr):
    """DOCS (causal) at a chunk of :func:`_seg_dkdv` (first position ``c0``, key rows ``rows``; ``x`` its dk or dv
    block so far, from the carried ``dS``): key row j and query i (j <= i) share a document iff i < the end of j's
    document. Returns ``x`` kept on the key rows of ``dnext`` (which read the carried dS), ``dS`` kept if the chunk's
    first document is ``dnext`` (``keep``, also returned), that document (the next ``dnext``), the query rows of it
    (``qf``: what goes on to the previous chunk) and each key row's document end relative to ``c0`` (``de``: the
    chunk's (j, i) mask is ``causal_t & (i < de_j)``)."""
    de = tl.load(DOC + b * 2 * NK + NK + rows, mask=mr, other=0) - c0  # each key row's document end
    df = _doc_at(DOC, b, NK, c0)  # the chunk's first document
    qf = rows < _doc_end(DOC, b, NK, c0)  # the query rows of that document
    x = tl.where((rows >= dnext)[:, None], x, 0.0)  # the key rows of dnext read the carried dS
    keep = df == dnext
    dS = tl.where(keep, dS, 0.0)
    return x, dS, keep, df, qf, de


@triton.jit
def _seg_dkdv(
    Q, K, V, DO, RDEN, CD, DSS, DZS, DT0, DZT0, DK, DV_, DS0, DZ0,
    NQ, NK, F, DV, L, HQ, G: tl.constexpr, NSS, DOC,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FP: tl.constexpr, DVP: tl.constexpr,
    FM: tl.constexpr, DFM: tl.constexpr, CAUSAL: tl.constexpr, HAS_SS: tl.constexpr, HAS_0: tl.constexpr,
    STORE_0: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, LOWP: tl.constexpr, UP: tl.constexpr,
    STG: tl.constexpr, DOCS: tl.constexpr,
):
    """dk / dv of one segment of one K/V head, sweeping its chunks backwards with the suffix dS, dz (strictly
    later positions) in registers. Programs 0..F/BK-1 of axis 2: a BK block of dk (carry dS (BK x Dv), dz);
    the others: a BV block of dv (carry dS (F x BV)). Start: the final-state gradient DT0 plus the query-side
    segment sums DSS of the later segments (causal) / of all query segments (non-causal).
    DOCS (causal), mirrored from the forward: ``dnext`` is the document of the position after the current chunk
    (after the last position: the last document, which the final-state gradient belongs to); a key row reads the
    carried dS only if it is in ``dnext``; the chunk's scores are masked to one document; the dS carried into the
    previous chunk holds the queries of the chunk's first document (plus the carried dS if the chunk lies inside
    ``dnext``). Segment start: DT0 if the last document runs from the next segment's start to the end, and the
    later segments' sums (each over its first document) of the document at the next segment's start."""
    NKB = tl.cdiv(F, BK)
    NB = NKB + tl.cdiv(DV, BV)
    pid = tl.program_id(0) % NB
    bkv = (tl.program_id(0) // NB).to(tl.int64)
    s = tl.program_id(1)
    HKV = HQ // G
    b = bkv // HKV
    hk = bkv % HKV
    oc = tl.arange(0, C)
    causal_t = oc[:, None] <= oc[None, :]  # (j, i): key row j is seen by query row i
    if CAUSAL:
        j0 = s + 1
    else:
        j0 = 0
    start = s * L
    nt = tl.cdiv(tl.minimum(L, NK - start), C)
    dnext = 0
    dend = 0
    if DOCS:  # documents as their first positions (_doc_at)
        dnext = _doc_at(DOC, b, NK, start + L)  # clamped: the last document after the last segment
        dend = _doc_at(DOC, b, NK, NK - 1)  # the final-state gradient's document
    if pid < NKB:
        ok = pid * BK + tl.arange(0, BK)
        mk = ok < F
        od = tl.arange(0, DVP)
        md = od < DV
        soff = ok[:, None] * DV + od[None, :]
        msk = mk[:, None] & md[None, :]
        dSk = tl.zeros([BK, DVP], dtype=tl.float32)
        dz = tl.zeros([BK], dtype=tl.float32)
        if HAS_0:
            if DOCS:
                dSk += tl.load(DT0 + bkv * F * DV + soff, mask=msk & ((soff * 0 + dend) == dnext), other=0.0)
                dz += tl.load(DZT0 + bkv * F + ok, mask=mk & ((ok * 0 + dend) == dnext), other=0.0)
            else:
                dSk += tl.load(DT0 + bkv * F * DV + soff, mask=msk, other=0.0)
                dz += tl.load(DZT0 + bkv * F + ok, mask=mk, other=0.0)
        if HAS_SS:
            for j in range(j0, NSS):
                if DOCS:  # the later segments' first-document sums, of the document at the next segment's start
                    dj = _doc_at(DOC, b, NK, j * L)
                    dSk += tl.load(DSS + (bkv * NSS + j) * F * DV + soff, mask=msk & ((soff * 0 + dj) == dnext),
                                   other=0.0)
                    dz += tl.load(DZS + (bkv * NSS + j) * F + ok, mask=mk & ((ok * 0 + dj) == dnext), other=0.0)
                else:
                    dSk += tl.load(DSS + (bkv * NSS + j) * F * DV + soff, mask=msk, other=0.0)
                    dz += tl.load(DZS + (bkv * NSS + j) * F + ok, mask=mk, other=0.0)
        for i in tl.range(nt, num_stages=STG):
            rows = start + (nt - 1 - i) * C + oc
            mr = rows < NK
            mrk = mr[:, None] & mk[None, :]
            mrd = mr[:, None] & md[None, :]
            v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + od[None, :], mask=mrd, other=0.0)
            dk = _mm(v, tl.trans(dSk), Q, LOWP, SPREC, UP) + dz[None, :]
            if DOCS:
                c0 = start + (nt - 1 - i) * C
                dk, dSk, keep, dnext, qf, de = _dkdv_docs(dk, dSk, dnext, DOC, b, NK, c0, rows, mr)
                dz = tl.where(keep, dz, 0.0)
                tmask = causal_t & (oc[None, :] < de[:, None])
            else:
                tmask = causal_t
            if CAUSAL:
                for g in range(G):
                    q, do, rden, cd = _dkv_tiles(Q, DO, RDEN, CD, b * HQ + hk * G + g, NQ, F, DV, rows, ok, od, mr,
                                                 mrk, mrd, FM)
                    dk = _dkv_dk(dk, v, q, do, rden, cd, tmask, Q, PREC, SPREC, LOWP, UP)
                    if DOCS:  # the chunk's first document goes on to the previous chunk
                        q = tl.where(qf[:, None], q, 0.0)
                    gm = do.to(tl.float32) * rden[:, None]
                    dSk, dz = _dkv_suffix(dSk, dz, q, gm, cd, Q, LOWP, SPREC, UP)
            if FM + DFM != 0:
                k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
                dk = dk * _phi_grad(k, FM, DFM)
            tl.store(DK + bkv * NK * F + rows[:, None] * F + ok[None, :], dk.to(DK.dtype.element_ty), mask=mrk)
        if STORE_0:  # segment 0 ends with the sums over all positions (non-causal: its start): dS0, dz0
            if s == 0:
                tl.store(DS0 + bkv * F * DV + ok[:, None] * DV + od[None, :], dSk, mask=mk[:, None] & md[None, :])
                tl.store(DZ0 + bkv * F + ok, dz, mask=mk)
    else:
        ov = (pid - NKB) * BV + tl.arange(0, BV)
        mv = ov < DV
        of = tl.arange(0, FP)
        mf = of < F
        soffv = of[:, None] * DV + ov[None, :]
        mskv = mf[:, None] & mv[None, :]
        dSv = tl.zeros([FP, BV], dtype=tl.float32)
        if HAS_0:
            if DOCS:
                dSv += tl.load(DT0 + bkv * F * DV + soffv, mask=mskv & ((soffv * 0 + dend) == dnext), other=0.0)
            else:
                dSv += tl.load(DT0 + bkv * F * DV + soffv, mask=mskv, other=0.0)
        if HAS_SS:
            for j in range(j0, NSS):
                if DOCS:
                    dj = _doc_at(DOC, b, NK, j * L)
                    dSv += tl.load(DSS + (bkv * NSS + j) * F * DV + soffv, mask=mskv & ((soffv * 0 + dj) == dnext),
                                   other=0.0)
                else:
                    dSv += tl.load(DSS + (bkv * NSS + j) * F * DV + soffv, mask=mskv, other=0.0)
        for i in tl.range(nt, num_stages=STG):
            rows = start + (nt - 1 - i) * C + oc
            mr = rows < NK
            mrf = mr[:, None] & mf[None, :]
            mrv = mr[:, None] & mv[None, :]
            k = tl.load(K + bkv * NK * F + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
            k = _phi(k, mrf, FM)
            dv = _mm(k, dSv, Q, LOWP, SPREC, UP)
            if DOCS:  # as in the dk programs
                c0 = start + (nt - 1 - i) * C
                dv, dSv, keep, dnext, qf, de = _dkdv_docs(dv, dSv, dnext, DOC, b, NK, c0, rows, mr)
                tmask = causal_t & (oc[None, :] < de[:, None])
            else:
                tmask = causal_t
            if CAUSAL:
                for g in range(G):
                    bq = b * HQ + hk * G + g
                    q = tl.load(Q + bq * NQ * F + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
                    q = _phi(q, mrf, FM)
                    do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
                    rden = tl.load(RDEN + bq * NQ + rows, mask=mr, other=1.0)
                    At = _dot(k, tl.trans(q), PREC, UP)  # (j, i) = phi(k_j) . phi(q_i)
                    rden_s = rden
                    if DOCS:  # the chunk's first document goes on to the previous chunk
                        q = tl.where(qf[:, None], q, 0.0)
                    if LOWP:  # P^T = At / den_i in [0, 1] (as in the forward) times dout: no rounded g
                        Pt = tl.where(tmask, At * rden[None, :], 0.0)
                        dv += _mm(Pt, do, Q, LOWP, SPREC, UP)
                        dSv += _mm(tl.trans(q), do.to(tl.float32) * rden_s[:, None], Q, LOWP, SPREC, UP)
                    else:
                        gm = do.to(tl.float32) * rden[:, None]
                        At = tl.where(tmask, At, 0.0)
                        dv += tl.dot(At, gm, input_precision=SPREC)
                        dSv += tl.dot(tl.trans(q.to(tl.float32)), do.to(tl.float32) * rden_s[:, None],
                                      input_precision=SPREC)
            tl.store(DV_ + bkv * NK * DV + rows[:, None] * DV + ov[None, :], dv.to(DV_.dtype.element_ty), mask=mrv)


@triton.jit
def _dkv_tiles(Q, DO, RDEN, CD, bq, NQ, F, DV, rows, of, od, mr, mrf, mrd, FM: tl.constexpr):
    """One query head's tiles of a chunk for :func:`_seg_dkv` and the dk programs of :func:`_seg_dkdv`: phi(q),
    dout, 1 / den, c."""
    q = tl.load(Q + bq * NQ * F + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
    q = _phi(q, mrf, FM)
    do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + od[None, :], mask=mrd, other=0.0)
    rden = tl.load(RDEN + bq * NQ + rows, mask=mr, other=1.0)
    cd = tl.load(CD + bq * NQ + rows, mask=mr, other=0.0)
    return q, do, rden, cd


@triton.jit
def _dkv_inter(x, dS, Q, TRANS: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, LOWP: tl.constexpr,
               UP: tl.constexpr):
    """The suffix-state part of a chunk in :func:`_seg_dkv`: ``x dS^T`` (TRANS: dk from v) or ``x dS`` (dv from
    phi(k)), the state rounded to the input dtype (LOWP) or fp32 operands at SPREC."""
    if TRANS:
        dSt = tl.trans(dS)
    else:
        dSt = dS
    if LOWP:
        return _dot(x, dSt.to(Q.dtype.element_ty), PREC, UP)
    else:
        return tl.dot(x.to(tl.float32), dSt, input_precision=SPREC)


@triton.jit
def _dkv_dk(dk, v, q, do, rden, cd, causal_t, Q, PREC: tl.constexpr, SPREC: tl.constexpr, LOWP: tl.constexpr,
            UP: tl.constexpr):
    """``dk += (dA^T * M^T) phi(q)`` of one query head, ``dA^T (j, i) = v_j . g_i + c_i`` (``causal_t``: the (j, i)
    mask ``M^T``, in :func:`_seg_dkdv` with documents also the chunk's document mask)."""
    dAt = _dot(v, tl.trans(do), PREC, UP) * rden[None, :]
    dAt = tl.where(causal_t, dAt + cd[None, :], 0.0)
    return dk + _mm(dAt, q, Q, LOWP, SPREC, UP)


@triton.jit
def _dkv_store_dk(DK, dk, k, K, bkv, NK, F, rows, of, mrf, FM: tl.constexpr, DFM: tl.constexpr):
    """Store dk times phi'(k): from the raw k (in-loop map) or from the features already loaded."""
    if FM != 0:
        dk = dk * _phi_grad(tl.load(K + bkv * NK * F + rows[:, None] * F + of[None, :], mask=mrf, other=0.0), FM, DFM)
    elif DFM != 0:
        dk = dk * _phi_grad(k, FM, DFM)
    tl.store(DK + bkv * NK * F + rows[:, None] * F + of[None, :], dk.to(DK.dtype.element_ty), mask=mrf)


@triton.jit
def _dkv_dv(dv, dS, dz, k, q, do, rden, cd, causal_t, Q, PREC: tl.constexpr, SPREC: tl.constexpr,
            LOWP: tl.constexpr, UP: tl.constexpr):
    """``dv += (A^T * M^T / den) dout`` of one query head, then the suffix update ``dS += phi(q)^T g``,
    ``dz += sum c phi(q)``."""
    At = _dot(k, tl.trans(q), PREC, UP)  # (j, i) = phi(k_j) . phi(q_i)
    gm = do.to(tl.float32) * rden[:, None]
    if LOWP:  # P^T = At / den_i in [0, 1] (as in the forward) times dout: no rounded g
        Pt = tl.where(causal_t, At * rden[None, :], 0.0)
        dv += _mm(Pt, do, Q, LOWP, SPREC, UP)
    else:
        dv += tl.dot(tl.where(causal_t, At, 0.0), gm, input_precision=SPREC)
    dS, dz = _dkv_suffix(dS, dz, q, gm, cd, Q, LOWP, SPREC, UP)
    return dv, dS, dz


@triton.jit
def _dkv_suffix(dS, dz, q, gm, cd, Q, LOWP: tl.constexpr, SPREC: tl.constexpr, UP: tl.constexpr):
    """The suffix update of one query head (:func:`_dkv_dv`, the dk programs of :func:`_seg_dkdv`): ``dS += phi(q)^T
    g`` (``gm``: g = dout / den, fp32), ``dz += sum c phi(q)``."""
    dS += _mm(tl.trans(q), gm, Q, LOWP, SPREC, UP)
    dz += tl.sum(q.to(tl.float32) * cd[:, None], 0)
    return dS, dz


@triton.jit
def _seg_dkv(
    Q, K, V, DO, RDEN, CD, DSS, DZS, DT0, DZT0, DK, DV_, DS0, DZ0,
    NQ, NK, F, DV, L, HQ, G: tl.constexpr, NSS,
    C: tl.constexpr, FP: tl.constexpr, DVP: tl.constexpr, FM: tl.constexpr, DFM: tl.constexpr,
    HAS_SS: tl.constexpr, HAS_0: tl.constexpr, STORE_0: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr,
    LOWP: tl.constexpr, UP: tl.constexpr, STG: tl.constexpr,
):
    """dk and dv of one segment of one K/V head in one program (``LinearConfig(one_dkdv=True)``; causal, no
    documents, F, Dv <= 128): :func:`_seg_dkdv`'s backward sweep with the whole suffix ``dS`` (F x Dv, fp32) in
    registers, so that it is accumulated once per chunk (``_seg_dkdv`` splits it by F for dk and by Dv for dv and
    accumulates each half twice) and each chunk's tiles are loaded once. Per chunk, with ``dS``, ``dz`` the sums over
    strictly later queries: ``dk = V dS^T + dz + sum_g (dA_g^T * M^T) phi(Q_g)`` (times ``phi'(k)``), ``dv = phi(K)
    dS + sum_g (A_g^T * M^T / den) dout_g``, then ``dS += phi(Q_g)^T G_g``, ``dz += sum c_g phi(Q_g)``. Start: the
    final-state gradient plus the later segments' query-side sums; segment 0 ends with the initial-state gradients."""
    bkv = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    HKV = HQ // G
    b = bkv // HKV
    hk = bkv % HKV
    oc = tl.arange(0, C)
    causal_t = oc[:, None] <= oc[None, :]  # (j, i): key row j is seen by query row i
    start = s * L
    nt = tl.cdiv(tl.minimum(L, NK - start), C)
    of = tl.arange(0, FP)
    mf = of < F
    od = tl.arange(0, DVP)
    md = od < DV
    soff = of[:, None] * DV + od[None, :]
    msk = mf[:, None] & md[None, :]
    dS = tl.zeros([FP, DVP], dtype=tl.float32)
    dz = tl.zeros([FP], dtype=tl.float32)
    if HAS_0:
        dS += tl.load(DT0 + bkv * F * DV + soff, mask=msk, other=0.0)
        dz += tl.load(DZT0 + bkv * F + of, mask=mf, other=0.0)
    if HAS_SS:
        for j in range(s + 1, NSS):
            dS += tl.load(DSS + (bkv * NSS + j) * F * DV + soff, mask=msk, other=0.0)
            dz += tl.load(DZS + (bkv * NSS + j) * F + of, mask=mf, other=0.0)
    for i in tl.range(nt, num_stages=STG):
        rows = start + (nt - 1 - i) * C + oc
        mr = rows < NK
        mrf = mr[:, None] & mf[None, :]
        mrd = mr[:, None] & md[None, :]
        v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + od[None, :], mask=mrd, other=0.0)
        k = tl.load(K + bkv * NK * F + rows[:, None] * F + of[None, :], mask=mrf, other=0.0)
        k = _phi(k, mrf, FM)
        # dk, then dv, then the suffix update (one accumulator of C x 128 live at a time besides dS)
        dk = _dkv_inter(v, dS, Q, True, PREC, SPREC, LOWP, UP) + dz[None, :]
        for g in range(G):
            q, do, rden, cd = _dkv_tiles(Q, DO, RDEN, CD, b * HQ + hk * G + g, NQ, F, DV, rows, of, od, mr, mrf,
                                         mrd, FM)
            dk = _dkv_dk(dk, v, q, do, rden, cd, causal_t, Q, PREC, SPREC, LOWP, UP)
        _dkv_store_dk(DK, dk, k, K, bkv, NK, F, rows, of, mrf, FM, DFM)
        dv = _dkv_inter(k, dS, Q, False, PREC, SPREC, LOWP, UP)
        for g in range(G):  # the query tiles again (L1 / L2; loading them once for both halves spills more)
            q, do, rden, cd = _dkv_tiles(Q, DO, RDEN, CD, b * HQ + hk * G + g, NQ, F, DV, rows, of, od, mr, mrf,
                                         mrd, FM)
            dv, dS, dz = _dkv_dv(dv, dS, dz, k, q, do, rden, cd, causal_t, Q, PREC, SPREC, LOWP, UP)
        tl.store(DV_ + bkv * NK * DV + rows[:, None] * DV + od[None, :], dv.to(DV_.dtype.element_ty), mask=mrd)
    if STORE_0:  # segment 0 ends with the sums over all positions: dS0, dz0
        if s == 0:
            tl.store(DS0 + bkv * F * DV + soff, dS, mask=msk)
            tl.store(DZ0 + bkv * F + of, dz, mask=mf)


# ----------------------------------------------------------------------------------------------- launcher
def _pow2(n: int, lo: int = 16, hi: int = 128) -> int:
    return max(lo, min(hi, next_pow2(n)))


def _cfg(F: int, Dv: int, chunk_size: int, dtype: torch.dtype):
    C = _pow2(chunk_size, 16, 128)
    # fp32 operands: exact fp32 products for fp32 inputs, tf32 for 16-bit inputs (whose values tf32 holds
    # exactly; only the fp32 side is rounded). Products of two 16-bit tiles run in their own dtype.
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return C, prec, prec


@dataclass(frozen=True)
class LinearConfig:
    """Settings of :func:`linear_attention` (frozen, hashable; the defaults are the tuned ones).

    Attributes:
        state_16bit: round the fp32 state to the input dtype for the forward's ``phi(q) S`` product (16-bit
            tensor-core product instead of tf32; off by default).
        lowp_bf16: for bfloat16 inputs every product takes 16-bit operands (states, ``g``, ``dA`` rounded to bf16
            right before the product; state, ``z``, ``den`` and all accumulators stay fp32). Not used for float16
            (``g = dout / den`` and the states can exceed the fp16 range with large keys: tf32 there) or float32
            (ieee).
        progs_per_sm: the segment length is halved until the forward has this many programs per SM.
        phi_in_loop: apply elu1 / relu inside every chunk loop (recomputed in each kernel) instead of once, in a
            pre-pass whose output the kernels read and the backward chain rule uses (off: in-loop, the map doubled
            the forward's per-chunk instructions, docs/linear_kernel.md).
        one_dkdv: causal backward without ``doc_ids``, ``F, Dv <= 128``: dk and dv of a (segment, K/V head) in one
            program (``_seg_dkv``, the whole F x Dv suffix state in registers, accumulated once per chunk) instead
            of ``_seg_dkdv``'s F / BK dk programs and Dv / BV dv programs (each accumulating its block of the same
            state). Off by default (experimental: it spills on triton 3.6, docs/linear_kernel.md); other calls run
            the default kernels; ``doc_ids`` with it raise ValueError.
        tiles: ``{kind: [(BK, BV, num_warps, num_stages, chunk), ...]}`` replacing a kernel's tile list (tried in
            order, the first that fits the device is used; kinds: seg_state, seg_fwd, seg_dstate, seg_dq,
            seg_dkdv, seg_dkv). For tuning scripts (lab/probe_linear.py).
    """

    state_16bit: bool = False
    lowp_bf16: bool = True
    progs_per_sm: float = 1.0
    phi_in_loop: bool = False
    one_dkdv: bool = False
    tiles: Tuple = ()

    def __post_init__(self):
        for name in ("state_16bit", "lowp_bf16", "phi_in_loop", "one_dkdv"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if isinstance(self.progs_per_sm, bool) or not isinstance(self.progs_per_sm, (int, float)) \
                or not self.progs_per_sm > 0:
            raise ValueError(f"progs_per_sm={self.progs_per_sm!r} must be a number > 0")
        items = self.tiles.items() if isinstance(self.tiles, dict) else self.tiles
        if isinstance(items, str) or not all(isinstance(it, (tuple, list)) and len(it) == 2 for it in items):
            raise ValueError(f"tiles={self.tiles!r} must be a dict {{kind: [(BK, BV, num_warps, num_stages[, chunk]), "
                             f"...]}} (or its items); kinds: {', '.join(KERNELS)}")
        norm = []
        for kind, cfgs in items:
            if kind not in KERNELS:
                raise ValueError(f"tiles: kind={kind!r} is not supported; allowed values: {', '.join(KERNELS)}")
            cfgs = tuple(tuple(c) for c in cfgs)
            if not cfgs or any(len(c) not in (4, 5) for c in cfgs):
                raise ValueError(f"tiles[{kind!r}] must be a non-empty list of (BK, BV, num_warps, num_stages[, "
                                 f"chunk]) tuples, got {cfgs!r}")
            for c in cfgs:
                for name, x in zip(("BK", "BV", "num_warps", "num_stages", "chunk"), c):
                    ok = isinstance(x, int) and not isinstance(x, bool)
                    if name == "num_warps":
                        ok = ok and x >= 1 and not x & (x - 1)
                        allowed = "a power of two (1, 2, 4, 8, 16)"
                    elif name == "num_stages":
                        ok = ok and x >= 1
                        allowed = "an integer >= 1"
                    else:  # tl.arange / tl.dot take powers of two >= 16; 0: the default (64 for BK / BV, C for chunk)
                        ok = ok and (x == 0 or (x >= 16 and not x & (x - 1)))
                        allowed = "0 (the default) or a power of two >= 16"
                    if not ok:
                        raise ValueError(f"tiles[{kind!r}] entry {c!r}: {name}={x!r} is not supported; allowed "
                                         f"values: {allowed}")
            norm.append((kind, cfgs))
        object.__setattr__(self, "tiles", tuple(sorted(norm)))
        object.__setattr__(self, "_hash", hash((self.state_16bit, self.lowp_bf16, self.progs_per_sm,
                                                self.phi_in_loop, self.one_dkdv, self.tiles)))

    def __hash__(self) -> int:
        return self._hash

    def replace(self, **changes) -> "LinearConfig":
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes) if changes else self


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("attn_zoo_linear_config", default=None)


def current_linear_config() -> "LinearConfig":
    """The settings a call without ``config=`` uses: the innermost :func:`linear_settings`, else ``LinearConfig()``
    (under ``torch.compile``: those at trace time)."""
    if torch.compiler.is_compiling():
        return _current_at_trace()
    return _CURRENT.get() or _DEFAULT


@torch.compiler.assume_constant_result
def _current_at_trace() -> "LinearConfig":
    return _CURRENT.get() or _DEFAULT  # dynamo cannot trace ContextVar.get: a constant of the traced graph


@contextlib.contextmanager
def linear_settings(config: Optional[LinearConfig] = None, **changes) -> Iterator[LinearConfig]:
    """Run the block with ``config`` (default: the current settings) with ``changes`` as the settings of every
    :func:`linear_attention` call that passes no ``config=`` (a context variable, restored when the block ends)."""
    cfg = (config if config is not None else current_linear_config()).replace(**changes)
    token = _CURRENT.set(cfg)
    try:
        yield cfg
    finally:
        _CURRENT.reset(token)


@dataclass
class LaunchRecord:
    """What :func:`record_launches` saw: ``kernels[kind] = (tile config, registers, spilled bytes)`` of the latest
    launch of each kernel (registers / spills on the GPU only), ``skipped[kind] = [(tile config, reason)]`` of the
    configs that did not fit the device (``OutOfResources``), in order."""

    kernels: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    skipped: Dict[str, List[tuple]] = dataclasses.field(default_factory=dict)


_RECORD: contextvars.ContextVar = contextvars.ContextVar("attn_zoo_linear_record", default=None)


@contextlib.contextmanager
def record_launches() -> Iterator[LaunchRecord]:
    """Record the tile config, registers and spills of each kernel launched in the block (for probes)."""
    rec = LaunchRecord()
    token = _RECORD.set(rec)
    try:
        yield rec
    finally:
        _RECORD.reset(token)

# Tile configurations (BK, BV, num_warps, num_stages, chunk), tried in order; the first that compiles within the
# device's shared memory / registers is remembered per (kernel, F, Dv, C, dtype). ``seg_fwd`` holds the full
# (padded) F of a chunk and a BV block of Dv (BK unused); ``seg_dq`` a BK block of F and the full Dv (BV
# unused); ``seg_dkdv`` both kinds of programs. With F or Dv > 128 the blocks are capped at 32 (registers).
# ``chunk`` (0: the caller's C) lowers a kernel's own chunk below C (it still divides L): the defaults were
# chosen from offline sm_90 compiles (ptxas register / spill counts, bf16, F = Dv = 128) so that no kernel
# spills; the GPU probe (lab/probe_linear.py) times alternatives. LinearConfig(tiles=...) replaces a kernel's list.
_TILES = {
    "seg_state": [(128, 128, 8, 3, 0), (64, 64, 4, 2, 0), (32, 32, 4, 1, 0)],
    "seg_fwd": [(0, 64, 8, 2, 0), (0, 32, 4, 2, 0), (0, 32, 4, 1, 0)],
    "seg_dstate": [(64, 64, 4, 3, 0), (64, 64, 4, 2, 0), (32, 32, 4, 1, 0)],
    "seg_dq": [(32, 0, 4, 3, 0), (32, 0, 4, 2, 0), (32, 0, 4, 1, 32)],
    "seg_dkdv": [(64, 64, 8, 2, 32), (64, 64, 8, 1, 32), (32, 32, 4, 1, 32)],
    "seg_dkv": [(0, 0, 8, 1, 32), (0, 0, 8, 1, 16)],
}
# bf16 with 16-bit products (LOWP / S16) and F, Dv <= 128, the case measured on the H200 (lab/probe_linear.py,
# 2026-11-29, 16k tokens, fwd+bwd): the forward runs the full Dv in one program (BV = 128: q k^T once instead of
# once per Dv block; forward 0.46 vs 0.57 ms), the dk/dv kernel the caller's 64-token chunk with a 3-deep
# prefetch (no spill with triton 3.6: 255 registers), the query-side segment sums the full F x Dv block (q and
# dout read once). The tf32 path (fp16) keeps 32-token dk/dv chunks (64 spilled ~650 bytes/thread offline) and
# BV = 64 (an fp32 128 x 128 state operand would spill).
_TILES_LOWP = {
    "seg_fwd": [(0, 128, 8, 2, 0), (0, 64, 8, 2, 0), (0, 32, 4, 1, 0)],
    "seg_dstate": [(128, 128, 8, 3, 0), (64, 64, 4, 3, 0), (64, 64, 4, 2, 0), (32, 32, 4, 1, 0)],
    "seg_dkdv": [(64, 64, 8, 3, 0), (64, 64, 8, 2, 0), (64, 64, 8, 2, 32), (32, 32, 4, 1, 32)],
    "seg_dkv": [(0, 0, 8, 2, 0), (0, 0, 8, 1, 0), (0, 0, 8, 2, 32), (0, 0, 8, 1, 16)],
}
# fp32 inputs (exact "ieee" products run on FMA units, not tensor cores): small chunks keep the per-thread
# operand slices, and so the spills, small; correctness path rather than a tuned one.
_TILES_FP32 = {
    "seg_state": [(64, 64, 4, 2, 0), (32, 32, 4, 1, 0)],
    "seg_fwd": [(0, 32, 8, 1, 16)],
    "seg_dstate": [(32, 32, 8, 1, 16)],
    "seg_dq": [(32, 0, 8, 1, 16)],
    "seg_dkdv": [(32, 32, 8, 1, 16)],
    "seg_dkv": [(0, 0, 8, 1, 16)],
}
# read-only: a different tile list is a LinearConfig(tiles=...), never an edit of these tables
_TILES, _TILES_LOWP, _TILES_FP32 = (MappingProxyType({k: tuple(v) for k, v in t.items()})
                                    for t in (_TILES, _TILES_LOWP, _TILES_FP32))
_CHOSEN = {}  # cache: (kind, F, Dv, chunk, dtype, 16-bit products, tile list) -> index of the config that fit


def tile_blocks(cfg, F: int, Dv: int) -> Tuple[int, int]:
    """``(BK, BV)`` of a tile config ``(BK, BV, num_warps, num_stages, chunk)`` at feature dim ``F`` / value dim
    ``Dv`` (0 entries: 64; padded dims; capped at 32 above 128)."""
    bk, bv = cfg[0], cfg[1]
    FP, DVP = _pow2(F, 16, MAX_DIM), _pow2(Dv, 16, MAX_DIM)
    BK, BV = min(bk or 64, FP), min(bv or 64, DVP)
    if max(FP, DVP) > 128:
        BK, BV = min(BK, 32), min(BV, 32)
    return BK, BV


def tile_configs(kind: str, dtype: torch.dtype, lowp: bool, F: int, Dv: int, config: "LinearConfig" = None):
    """The tile configurations tried for one kernel, in order: ``config.tiles``'s list for ``kind`` if it has one,
    else fp32 inputs, 16-bit products with F, Dv <= 128 (the measured case), or the general list."""
    if config is not None and config.tiles:
        forced = dict(config.tiles).get(kind)
        if forced is not None:
            return list(forced)
    if dtype == torch.float32 and kind in _TILES_FP32:
        return _TILES_FP32[kind]
    if lowp and kind in _TILES_LOWP and max(F, Dv) <= 128:
        return _TILES_LOWP[kind]
    return _TILES[kind]


def _chosen_key(kind, F, Dv, chunk, dtype, lowp, config):
    return kind, F, Dv, chunk, dtype, lowp, dict(config.tiles).get(kind) if config.tiles else None


def _tile_in_use(kind: str, F: int, Dv: int, chunk: int, dtype: torch.dtype, lowp: bool, config: "LinearConfig"):
    """The tile config ``_launch`` will use for this kernel and shape: the one remembered after a fallback, else
    the first of its list (the launcher's own key)."""
    cfgs = tile_configs(kind, dtype, lowp, F, Dv, config)
    i = _CHOSEN.get(_chosen_key(kind, F, Dv, chunk, dtype, lowp, config), 0)
    return cfgs[i if i < len(cfgs) else 0]


def _launch(kind, kernel, grid_fn, F, Dv, chunk, dtype, config, args, **const):
    """Launch ``kernel[grid_fn(BK, BV)](*args, BK=/BV=, **const)`` with the first tile config that fits."""
    lowp = bool(const.get("LOWP") or const.get("S16"))
    key = _chosen_key(kind, F, Dv, chunk, dtype, lowp, config)
    cfgs = tile_configs(kind, dtype, lowp, F, Dv, config)
    i0 = _CHOSEN.get(key, 0)
    if i0 >= len(cfgs):
        i0 = 0
    names = kernel.arg_names if hasattr(kernel, "arg_names") else ()
    for i in range(i0, len(cfgs)):
        BK, BV = tile_blocks(cfgs[i], F, Dv)
        w, st = cfgs[i][2], cfgs[i][3]
        if kind == "seg_fwd" and const.get("S16") and BV <= 32 and w > 4 and not _interpreting():
            # triton 3.6 on sm_90 computed wrong outputs (rel. error ~0.5, H200 2026-11-29) for the 16-bit
            # q @ S product with 8 warps and BV = 32; 4 warps and BV = 64 are right (lab/probe_linear.py)
            w = 4
        kw = dict(const)
        if len(cfgs[i]) > 4 and cfgs[i][4]:  # the kernel's own chunk (a power of two <= C: divides L)
            kw["C"] = min(kw["C"], cfgs[i][4])
        if not names or "BK" in names:
            kw["BK"] = BK
        if not names or "BV" in names:
            kw["BV"] = BV
        if not names or "STG" in names:  # the chunk loop's own pipelining depth: every load in it is prefetched
            kw["STG"] = st
        try:
            ck = launch(kernel, grid_fn(BK, BV), args, num_warps=w, num_stages=st, **kw)
            _CHOSEN[key] = i
            rec = _RECORD.get()
            if rec is not None:
                rec.kernels[kind] = (tuple(cfgs[i]), getattr(ck, "n_regs", None), getattr(ck, "n_spills", None))
            return
        except triton.runtime.errors.OutOfResources as e:
            rec = _RECORD.get()
            if rec is not None:
                rec.skipped.setdefault(kind, []).append((tuple(cfgs[i]), str(e)[:120]))
            if i == len(cfgs) - 1:
                raise


def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 132


def _seg_len(N: int, C: int, progs_per_seg: int, segment_size: Optional[int], sms: int,
             progs_per_sm: float = 1.0) -> int:
    """Segment length L (multiple of C): forced by ``segment_size`` (rounded up to a multiple of C), else the
    largest power of two that still gives the kernel >= ``progs_per_sm`` (``LinearConfig``, default 1) programs
    per SM, but not below 4 C (or N)."""
    if segment_size is not None:
        return max(C, cdiv(int(segment_size), C) * C)
    L = max(C, next_pow2(N))
    while L > 4 * C and cdiv(N, L) * progs_per_seg < float(progs_per_sm) * sms:
        L //= 2
    return L


def _check(q, k, v, s0, z0, causal):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    B, Hq, Nq, F = q.shape
    Bk, Hkv, Nk, Fk = k.shape
    if Bk != B or v.shape[0] != B or v.shape[1] != Hkv or v.shape[2] != Nk:
        raise ValueError(f"shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Fk != F:
        raise ValueError(f"q and k feature dims differ: {F} vs {Fk}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    Dv = v.shape[3]
    if F > MAX_DIM or Dv > MAX_DIM:
        raise ValueError(f"feature dim F={F} and value dim Dv={Dv} must be <= {MAX_DIM} for the Triton kernel")
    if min(Nq, Nk, F, Dv) < 1:
        raise ValueError(f"empty input: Nq={Nq}, Nk={Nk}, F={F}, Dv={Dv}")
    if causal and Nq != Nk:
        raise ValueError(f"causal kernel needs Nq == Nk (got {Nq}, {Nk}); pass prefix keys as initial_state")
    if (s0 is None) != (z0 is None):
        raise ValueError("initial_state must be a pair (S0 (B, Hkv, F, Dv), z0 (B, Hkv, F)) or None")
    if s0 is not None and (tuple(s0.shape) != (B, Hkv, F, Dv) or tuple(z0.shape) != (B, Hkv, F)):
        raise ValueError(f"initial_state shapes must be S0 {(B, Hkv, F, Dv)} and z0 {(B, Hkv, F)}, "
                         f"got {tuple(s0.shape)} and {tuple(z0.shape)}")
    return B, Hq, Hkv, Nq, Nk, F, Dv


def _seg_sums(kind, kernel, x, y, extra, N, L, F, Dv, chunk, dt, BHkv, config, heads=(), tail=(), **const):
    """Run a per-segment sum kernel; returns (sums (BHkv, NS, F, Dv), zsums (BHkv, NS, F)) in fp32."""
    NS = cdiv(N, L)
    SS = torch.empty(BHkv, NS, F, Dv, device=x.device, dtype=torch.float32)
    ZS = torch.empty(BHkv, NS, F, device=x.device, dtype=torch.float32)
    _launch(kind, kernel, lambda BK, BV: (cdiv(F, BK) * cdiv(Dv, BV) * BHkv, NS), F, Dv, chunk, dt, config,
            (x, y, *extra, SS, ZS, N, F, Dv, L, *heads, NS, *tail), **const)
    return SS, ZS


def document_index(doc_ids: torch.Tensor) -> torch.Tensor:
    """The document part of the kernel's input: int32 ``(B, N)``, the 1-based number of each position's document
    in its row (the cumulative count of document starts; no host sync). ``doc_ids`` int ``(B, N)``, nondecreasing
    per row (checked by :func:`attn_zoo.attention`, not here)."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() != 2 or doc_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"doc_ids must be an int32 / int64 tensor of shape (B, N), got "
                         f"{getattr(doc_ids, 'dtype', type(doc_ids).__name__)} {tuple(getattr(doc_ids, 'shape', ()))}")
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return start.cumsum(1, dtype=torch.int32).contiguous()


def document_bounds(doc_ids: torch.Tensor) -> torch.Tensor:
    """The document part of the kernels' input: int32 ``(B, 2, N)``, ``[:, 0]`` the first position of each
    position's document and ``[:, 1]`` its end (one past its last position), in its row (no host sync). Two positions
    share a document iff their starts are equal; under the causal mask a key ``j <= i`` is in query ``i``'s document
    iff ``j >= start_i`` (``i < end_j``), so the kernels compare positions with one vector per chunk. ``doc_ids`` int
    ``(B, N)``, nondecreasing per row (checked by :func:`attn_zoo.attention`, not here); raises ValueError for
    another dtype or rank."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() != 2 or doc_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"doc_ids must be an int32 / int64 tensor of shape (B, N), got "
                         f"{getattr(doc_ids, 'dtype', type(doc_ids).__name__)} {tuple(getattr(doc_ids, 'shape', ()))}")
    B, N = doc_ids.shape
    pos = torch.arange(N, device=doc_ids.device, dtype=torch.int32).expand(B, N)
    first = torch.ones_like(doc_ids, dtype=torch.bool)
    first[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    last = torch.ones_like(first)
    last[:, :-1] = first[:, 1:]
    out = torch.empty(B, 2, N, device=doc_ids.device, dtype=torch.int32)
    out[:, 0] = torch.where(first, pos, 0).cummax(1).values
    out[:, 1] = torch.where(last, pos + 1, N).flip(1).cummin(1).values.flip(1)
    return out


_LAST_DOCS: list = []  # [(weakref to doc_ids, its _version, bounds)], most recent first


def _cached_document_bounds(doc_ids: torch.Tensor) -> torch.Tensor:
    """:func:`document_bounds`, remembered for the last 4 ``doc_ids`` tensors (by identity and version): the same
    tensor passed to every layer of a step is converted once. Not while compiling, nor for an inference tensor
    (``torch.inference_mode``: it has no version counter)."""
    if torch.compiler.is_compiling() or doc_ids.is_inference():
        return document_bounds(doc_ids)
    for ref, ver, idx in _LAST_DOCS:
        if ref() is doc_ids and ver == doc_ids._version:
            return idx
    idx = document_bounds(doc_ids)
    try:
        _LAST_DOCS.insert(0, (weakref.ref(doc_ids), doc_ids._version, idx))
        del _LAST_DOCS[4:]
    except TypeError:  # pragma: no cover - a tensor type without weak references
        pass
    return idx


def _features(q: torch.Tensor, k: torch.Tensor, fm: int):
    """(phi(q), phi(k)) for a fused feature map id, contiguous, in one launch."""
    F = q.shape[3]
    fq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    fk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    FP = _pow2(F, 16, MAX_DIM)
    BR = max(1, 4096 // FP)
    nq, nk = q.numel() // F, k.numel() // F
    launch(_phi_map, (cdiv(nq, BR) + cdiv(nk, BR),),
           (q, fq, nq, q.shape[1], q.shape[2], *q.stride(), k, fk, nk, k.shape[1], k.shape[2], *k.stride(), F),
           FM=fm, BR=BR, FP=FP, num_warps=4)
    return fq, fk


KERNELS = {"seg_state": _seg_state, "seg_fwd": _seg_fwd, "seg_dstate": _seg_dstate, "seg_dq": _seg_dq,
           "seg_dkdv": _seg_dkdv, "seg_dkv": _seg_dkv}
_DEFAULT = LinearConfig()


def _query_seg_len(B, Hq, Nq, F, Dv, C, dtype, s16, segment_size, sms, config) -> int:
    fbv = tile_blocks(_tile_in_use("seg_fwd", F, Dv, C, dtype, s16, config), F, Dv)[1]
    return _seg_len(Nq, C, B * Hq * cdiv(Dv, fbv), segment_size, sms, config.progs_per_sm)


def query_segment_len(B: int, Hq: int, Nq: int, F: int, Dv: int, chunk_size: int, dtype: torch.dtype, device,
                      config: Optional[LinearConfig] = None, segment_size: Optional[int] = None) -> int:
    """The query-side segment length ``L`` the forward of these shapes uses (``cdiv(Nq, L)`` segments)."""
    config = config if config is not None else current_linear_config()
    lowp = dtype == torch.bfloat16 and config.lowp_bf16
    C = _pow2(chunk_size, 16, 128)
    return _query_seg_len(B, Hq, Nq, F, Dv, C, dtype, config.state_16bit or lowp, segment_size, _sm_count(device),
                          config)


class _LinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, s0, z0, causal, eps, fmap, chunk_size, segment_size, want_state, config, docs):
        B, Hq, Hkv, Nq, Nk, F, Dv = _check(q, k, v, s0, z0, causal)
        has_docs = docs is not None
        if fmap != 0 and not config.phi_in_loop:  # features once: the kernels read phi(q), phi(k)
            (q, k), fm, dfm = _features(q, k, fmap), 0, fmap
        else:
            fm, dfm = fmap, 0
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        C, SPREC, PREC = _cfg(F, Dv, chunk_size, q.dtype)
        up = q.dtype == torch.bfloat16 and _interpreting()
        lowp = q.dtype == torch.bfloat16 and config.lowp_bf16
        G = Hq // Hkv
        BHkv = B * Hkv
        dev, dt = q.device, q.dtype
        sms = _sm_count(dev)
        has_s0 = s0 is not None
        if has_s0:
            s0 = s0.float().contiguous().view(BHkv, F, Dv)
            z0 = z0.float().contiguous().view(BHkv, F)
        s16 = config.state_16bit or lowp
        Lq = _query_seg_len(B, Hq, Nq, F, Dv, C, q.dtype, s16, segment_size, sms, config)
        NSq = cdiv(Nq, Lq)
        st_const = dict(C=C, FM=fm, PREC=PREC, UP=up)
        SS = ZS = None  # per-segment key sums; the kernels add the ones before their segment to S0 themselves
        if causal:
            Lk = Lq
            if NSq > 1:
                SS, ZS = _seg_sums("seg_state", _seg_state, k, v, (), Nk, Lq, F, Dv, C, dt, BHkv, config,
                                   tail=(docs if has_docs else k, Hkv), DOCS=has_docs, **st_const)
        else:
            sk, sv = tile_blocks(_tile_in_use("seg_state", F, Dv, C, q.dtype, False, config), F, Dv)
            Lk = _seg_len(Nk, C, BHkv * cdiv(F, sk) * cdiv(Dv, sv), segment_size, sms, config.progs_per_sm)
            SS, ZS = _seg_sums("seg_state", _seg_state, k, v, (), Nk, Lk, F, Dv, C, dt, BHkv, config,
                               tail=(k, Hkv), DOCS=False, **st_const)
        has_ss = SS is not None
        ST = ZT = None
        if want_state:  # written by the last segment's programs (non-causal: the unchanged total)
            ST = torch.empty(BHkv, F, Dv, device=dev, dtype=torch.float32)
            ZT = torch.empty(BHkv, F, device=dev, dtype=torch.float32)
        o = torch.empty(B, Hq, Nq, Dv, device=dev, dtype=dt)
        den = torch.empty(B, Hq, Nq, device=dev, dtype=torch.float32)
        _launch("seg_fwd", _seg_fwd, lambda BK, BV: (cdiv(Dv, BV) * B * Hq, NSq), F, Dv, C, dt, config,
                (q, k, v, SS if has_ss else den, ZS if has_ss else den, s0 if has_s0 else den, z0 if has_s0 else den,
                 o, den, ST if want_state else den, ZT if want_state else den,
                 Nq, Nk, F, Dv, Lq, Hq, G, SS.shape[1] if has_ss else 1, float(eps), docs if has_docs else den),
                C=C, FP=_pow2(F, 16, MAX_DIM), FM=fm, CAUSAL=causal, HAS_SS=has_ss, HAS_0=has_s0, STORE_T=want_state,
                S16=s16, PREC=PREC, SPREC=SPREC, UP=up, DOCS=has_docs)
        ctx.save_for_backward(q, k, v, o, den, SS, ZS, s0, z0, docs)
        ctx.cfg = (causal, fm, dfm, C, SPREC, PREC, has_s0, up, Lq, Lk, lowp, config)
        if ST is not None:
            ST, ZT = ST.view(B, Hkv, F, Dv), ZT.view(B, Hkv, F)
        return o, ST, ZT

    @staticmethod
    def backward(ctx, do, dST, dZT):
        q, k, v, o, den, SS, ZS, s0, z0, docs = ctx.saved_tensors
        has_docs = docs is not None
        causal, fm, dfm, C, SPREC, PREC, has_s0, up, Lq, Lk, lowp, config = ctx.cfg
        B, Hq, Nq, F = q.shape
        Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
        G = Hq // Hkv
        BHkv = B * Hkv
        NSq, NSk = cdiv(Nq, Lq), cdiv(Nk, Lk)
        dev, dt = q.device, q.dtype
        FP, DVP = _pow2(F, 16, MAX_DIM), _pow2(Dv, 16, MAX_DIM)
        do = do.contiguous()
        cd = torch.empty_like(den)
        rden = torch.empty_like(den)
        nrows = B * Hq * Nq
        launch(_bwd_pre, (cdiv(nrows, 64),), (o, do, den, cd, rden, nrows, Dv), BM=64, BV=min(64, _pow2(Dv)),
               num_warps=4)
        has_dst = dST is not None or dZT is not None
        if has_dst:
            dST = (dST if dST is not None else torch.zeros(B, Hkv, F, Dv, device=dev)).float().contiguous()
            dZT = (dZT if dZT is not None else torch.zeros(B, Hkv, F, device=dev)).float().contiguous()
        need_s0 = has_s0 and (ctx.needs_input_grad[3] or ctx.needs_input_grad[4])
        ds0 = dz0 = None
        if need_s0:  # written by the segment-0 dk programs
            ds0 = torch.empty(B, Hkv, F, Dv, device=dev, dtype=torch.float32)
            dz0 = torch.empty(B, Hkv, F, device=dev, dtype=torch.float32)
        DSS = DZS = None  # per-segment query-side sums; dk/dv programs add the later ones (causal) themselves
        if not causal or NSq > 1:
            DSS, DZS = _seg_sums("seg_dstate", _seg_dstate, q, do, (rden, cd), Nq, Lq, F, Dv, C, dt, BHkv, config,
                                 heads=(Hq, G), tail=(docs if has_docs else den,), C=C, FM=fm, SPREC=SPREC,
                                 LOWP=lowp, UP=up, DOCS=has_docs)
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        has_ss = SS is not None
        _launch("seg_dq", _seg_dq, lambda BK, BV: (cdiv(F, BK) * B * Hq, NSq), F, Dv, C, dt, config,
                (q, k, v, do, rden, cd, SS if has_ss else den, ZS if has_ss else den, s0 if has_s0 else den,
                 z0 if has_s0 else den, dq, Nq, Nk, F, Dv, Lq, Hq, G, SS.shape[1] if has_ss else 1,
                 docs if has_docs else den),
                C=C, DVP=DVP, FM=fm, DFM=dfm, CAUSAL=causal, HAS_SS=has_ss, HAS_0=has_s0, PREC=PREC, SPREC=SPREC,
                LOWP=lowp, UP=up, DOCS=has_docs)
        has_dss = DSS is not None
        if config.one_dkdv and causal and not has_docs and max(F, Dv) <= 128:  # dk and dv in one program
            _launch("seg_dkv", _seg_dkv, lambda BK, BV: (BHkv, NSk), F, Dv, C, dt, config,
                    (q, k, v, do, rden, cd, DSS if has_dss else den, DZS if has_dss else den, dST if has_dst else den,
                     dZT if has_dst else den, dk, dv, ds0 if need_s0 else den, dz0 if need_s0 else den,
                     Nq, Nk, F, Dv, Lk, Hq, G, DSS.shape[1] if has_dss else 1),
                    C=C, FP=FP, DVP=DVP, FM=fm, DFM=dfm, HAS_SS=has_dss, HAS_0=has_dst, STORE_0=need_s0,
                    PREC=PREC, SPREC=SPREC, LOWP=lowp, UP=up)
            return dq, dk, dv, ds0, dz0, None, None, None, None, None, None, None, None
        _launch("seg_dkdv", _seg_dkdv, lambda BK, BV: ((cdiv(F, BK) + cdiv(Dv, BV)) * BHkv, NSk), F, Dv, C, dt, config,
                (q, k, v, do, rden, cd, DSS if has_dss else den, DZS if has_dss else den, dST if has_dst else den,
                 dZT if has_dst else den, dk, dv, ds0 if need_s0 else den, dz0 if need_s0 else den,
                 Nq, Nk, F, Dv, Lk, Hq, G, DSS.shape[1] if has_dss else 1, docs if has_docs else den),
                C=C, FP=FP, DVP=DVP, FM=fm, DFM=dfm, CAUSAL=causal, HAS_SS=has_dss, HAS_0=has_dst, STORE_0=need_s0,
                PREC=PREC, SPREC=SPREC, LOWP=lowp, UP=up, DOCS=has_docs)
        return dq, dk, dv, ds0, dz0, None, None, None, None, None, None, None, None


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, eps: float = 1e-6,
    feature_map: Optional[str] = None, initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    output_final_state: bool = False, chunk_size: int = 64, segment_size: Optional[int] = None,
    config: Optional["LinearConfig"] = None, doc_ids: Optional[torch.Tensor] = None,
):
    """Linear attention, Triton forward + backward (see the module docstring for the algorithm).

    Args:
        q: ``(B, Hq, Nq, F)`` float16 / bfloat16 / float32: ``phi(q)``, or raw ``q`` when ``feature_map`` is set.
        k: ``(B, Hkv, Nk, F)``, same dtype; ``Hkv`` divides ``Hq`` (GQA / MQA).
        v: ``(B, Hkv, Nk, Dv)``, same dtype. ``F, Dv <= 256``.
        causal: chunked causal form (needs ``Nq == Nk``; prefix keys go into ``initial_state``) or the
            non-causal form (any ``Nq``, ``Nk``).
        eps: added to the normaliser ``phi(q) . z``: a finite float > 0 (a row whose normaliser is 0 would be
            NaN).
        feature_map: ``None`` (inputs are features), ``"elu1"`` or ``"relu"`` (applied by the kernels' pre-pass,
            ``F = D``).
        initial_state: optional ``(S0 (B, Hkv, F, Dv), z0 (B, Hkv, F))`` (cast to fp32), the sums over keys
            before the first one (differentiable).
        output_final_state: also return ``(S, z)`` after the last key (fp32, differentiable).
        chunk_size: power of two in [16, 128] (``CHUNK_SIZES``).
        segment_size: tuning / testing knob: tokens per program sweep (rounded up to a multiple of the
            chunk size). ``None`` (default) picks it from the shape and the GPU's SM count.
        config: a :class:`LinearConfig` (precision / pipelining switches, tile lists); default the current
            settings (``LinearConfig()`` or the innermost :func:`linear_settings`). The backward uses the forward's.
        doc_ids: packed documents (issue 27, causal only): int32 / int64 ``(B, N)`` on q's device, nondecreasing per
            row (not checked here: :func:`attn_zoo.attention` checks them). The state ``(S, z)`` restarts at every
            document start, inside chunks too (= the document mask of the quadratic form). The kernels read one int32
            ``(B, 2, N)`` tensor, each position's document start and end (:func:`document_bounds`, built once per
            ``doc_ids`` tensor): chunk scores are masked to one document, the carried state is read only by the
            document running at the chunk's start and carries on only the chunk's last document (forward and
            backward; docs/linear_kernel.md). ``initial_state`` is read by the first document,
            ``output_final_state`` returns the last document's state.

    Returns:
        ``out (B, Hq, Nq, Dv)`` in ``q.dtype``; with ``output_final_state`` also ``(S (B, Hkv, F, Dv), z (B, Hkv, F))``.

    Raises:
        ValueError / TypeError: bad shapes or dtypes, ``F`` or ``Dv`` > 256, causal with ``Nq != Nk``, ``causal`` or
        ``output_final_state`` not a bool, ``eps`` not a finite float > 0, unknown ``feature_map``,
        ``segment_size`` not ``None`` or an integer >= 1, ``chunk_size`` not in ``CHUNK_SIZES``; ``doc_ids`` with
        ``causal=False`` (not fused: the ``torch`` backend computes per-document sums) or not an int ``(B, N)``
        tensor on q's device.
    """
    check_bool("causal", causal)
    check_eps(eps)
    check_bool("output_final_state", output_final_state)
    if isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not supported by the Triton kernel; allowed values: "
                         f"{', '.join(map(str, CHUNK_SIZES))}")
    if not (feature_map is None or isinstance(feature_map, str)) or feature_map not in FUSED_FEATURE_MAPS:
        raise ValueError(f"feature_map={feature_map!r} is not supported in-kernel; allowed values: None, elu1, relu "
                         "(compute favor / taylor features before the call)")
    if segment_size is not None and (not is_int(segment_size) or segment_size < 1):
        raise ValueError(f"segment_size={segment_size!r} is not supported; allowed values: None (from the shape and "
                         "the SM count) or an integer >= 1 (tokens)")
    if config is None:
        config = current_linear_config()
    elif not isinstance(config, LinearConfig):
        raise TypeError(f"config must be a kernels.LinearConfig, got {type(config).__name__}")
    docs = None
    if doc_ids is not None:
        if config.one_dkdv:
            raise ValueError("doc_ids is not supported with LinearConfig(one_dkdv=True) (its dk/dv kernel has no "
                             "document rules); use one_dkdv=False")
        if not causal:
            raise ValueError("doc_ids with causal=False is not supported by the fused kernel (non-causal linear "
                             "attention per document needs each document's total sums); use the torch backend")
        docs = _cached_document_bounds(doc_ids)
        if tuple(docs.shape) != (q.shape[0], 2, k.shape[2]) or docs.device != q.device:
            raise ValueError(f"doc_ids must have shape (B, N) = ({q.shape[0]}, {k.shape[2]}) on q's device "
                             f"{q.device}, got {tuple(doc_ids.shape)} on {doc_ids.device}")
    if initial_state is not None and (not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2):
        raise ValueError("initial_state must be a pair (S0 (B, Hkv, F, Dv), z0 (B, Hkv, F)) or None, got "
                         f"{type(initial_state).__name__}")
    s0, z0 = initial_state if initial_state is not None else (None, None)
    F = q.shape[-1]
    pad = feature_pad(F, feature_map)
    if pad:  # zero features add nothing to phi(q) . phi(k) or to the state's products: exact
        _check(q, k, v, s0, z0, causal)  # first on the caller's shapes, so that an error names them, not the padded
        q, k = torch.nn.functional.pad(q, (0, pad)), torch.nn.functional.pad(k, (0, pad))
        if s0 is not None:
            s0, z0 = torch.nn.functional.pad(s0, (0, 0, 0, pad)), torch.nn.functional.pad(z0, (0, pad))
    o, st, zt = _LinearAttention.apply(q, k, v, s0, z0, bool(causal), float(eps), FUSED_FEATURE_MAPS[feature_map],
                                       int(chunk_size), None if segment_size is None else int(segment_size),
                                       bool(output_final_state), config, docs)
    if pad and output_final_state:
        st, zt = st[..., :F, :], zt[..., :F]
    return (o, (st, zt)) if output_final_state else o


def feature_pad(F: int, feature_map=None) -> int:
    """Zero feature columns :func:`linear_attention` appends to explicit features (``feature_map=None``) of width
    ``F``: up to the next multiple of 32 when ``128 < F < 256``, else 0 (``F > 256`` is refused by the call, naming
    ``F`` as given). On the H200 (triton 3.6) the kernels read
    out of range at ``F`` = 153, 154 and 155 (the symmetric Taylor features at D 16: 153) and ran clean at 100,
    128, 160, 192 and 256 (``results/h200/2026-12-04f/``); zero columns change no product, so the padded call is
    exact. In-kernel feature maps (``elu1``, ``relu``) map a zero input to a nonzero feature and are not padded."""
    if feature_map not in (None, "none") or F <= 128 or F >= MAX_DIM or F % 32 == 0:
        return 0
    return -F % 32

