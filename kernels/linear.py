"""Fused Triton linear attention (Katharopoulos et al. 2020), chunked causal and non-causal, forward + backward.

Inputs are feature tensors ``phi(q) (B, Hq, Nq, F)``, ``phi(k) (B, Hkv, Nk, F)`` and ``v (B, Hkv, Nk, Dv)``
(``Hkv`` divides ``Hq``; query head ``h`` reads K/V head ``h // (Hq // Hkv)``), or raw ``q``/``k`` with the
cheap feature maps ``elu1`` (``elu(x) + 1``) / ``relu`` applied inside the kernels (``feature_map=``). The
output is

    out_i = sum_{j <= i} (phi_i . phi_j) v_j / (sum_{j <= i} phi_i . phi_j + eps)      (causal, Nq == Nk)
    out_i = phi_i S / (phi_i . z + eps),  S = S0 + sum_j phi_j^T v_j,  z = z0 + sum_j phi_j    (non-causal)

Chunked causal form (Yang et al. 2024, "Gated Linear Attention", sec. 2.2; chunk ``C`` tokens): with
``S_t`` (F x Dv) and ``z_t`` (F) the sums over all keys before chunk ``t`` (plus the initial state),

    num_c = phi(Q_c) S_t + (phi(Q_c) phi(K_c)^T * M) V_c,   den_c = phi(Q_c) z_t + rowsum(phi(Q_c) phi(K_c)^T * M) + eps.

Kernels (``C`` = chunk, ``NT`` = number of chunks):

* ``_state_fwd``: one program per (F block, Dv block, B*Hkv), sequential over chunks; carries ``S`` and
  ``z`` in **fp32** registers, writes the chunk-start states ``S_t, z_t`` (fp32) and optionally the final state.
* ``_out_fwd``: one program per (chunk, B*Hq, Dv block), fully parallel; the intra-chunk quadratic part,
  the inter-chunk read of ``S_t``, the denominator, the division and (fused) the feature map. The
  intra-chunk weights are divided by the denominator *before* they are rounded to the input dtype, so
  they lie in [0, 1] (no fp16 overflow however large the keys are). Stores ``den`` (fp32, one per row).
* backward, with ``g_i = dout_i / den_i`` and ``c_i = -(dout_i . out_i) / den_i``:
  ``dq_i = S_i g_i + c_i z_i`` (inclusive prefix), ``dk_j = dS_j v_j + dz_j`` and ``dv_j = dS_j^T k_j`` with the
  suffix sums ``dS_j = sum_{i >= j} q_i g_i^T``, ``dz_j = sum_{i >= j} c_i q_i`` (summed over the query heads
  of a K/V group, so GQA needs no atomics). Kernels: ``_bwd_pre`` (``1/den`` and ``c``), ``_state_fwd``
  again (recompute), ``_state_bwd`` (reverse recurrence, fp32), ``_dq`` and ``_dkdv`` (chunk-parallel).

Recompute vs store: the backward **recomputes** the chunk-start states with ``_state_fwd`` instead of
saving them from the forward. The states are ``NT * F * Dv`` fp32 numbers per K/V head, i.e.
``4 * F * Dv / (C * 2 * F) = 4x`` (D = 128, C = 64) the bytes of ``phi(k)`` itself: keeping them alive between
forward and backward would more than double the activation memory of the layer, while recomputing costs
one extra read of ``k`` and ``v`` and one write of the states (a small share of the backward's traffic).
Only the saved tensors ``q, k, v, out`` and ``den`` (fp32, ``B*Hq*Nq`` numbers) stay alive.

Precision: inputs fp16 / bf16 / fp32; every accumulator, ``S``, ``z``, ``den`` and the backward states are
fp32. Products with fp32 states use tf32 tensor-core inputs (16-bit inputs; fp16 and bf16 values are exact
in tf32) or full fp32 (``ieee``, fp32 inputs); ``phi(q) phi(k)^T`` and ``phi(k)^T v`` use the input dtype.
Limits: ``F <= 256`` and ``Dv <= 256`` (``ValueError`` above; e.g. the Taylor map with ``D >= 16`` gives
``F = 1 + D + D^2 > 256``: use a PyTorch implementation for it). The chunk size is a power of two in [16, 128].
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

__all__ = ["linear_attention", "linear_attention_recurrent", "MAX_DIM", "FUSED_FEATURE_MAPS"]

MAX_DIM = 256
FUSED_FEATURE_MAPS = {None: 0, "none": 0, "elu1": 1, "relu": 2}


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
def _phi_grad(x, FM: tl.constexpr):
    """d phi / d x (fp32)."""
    xf = x.to(tl.float32)
    if FM == 1:
        return tl.where(xf > 0, 1.0, tl.exp(tl.where(xf > 0, 0.0, xf)))
    else:
        return tl.where(xf < 0, 0.0, tl.where(xf > 0, 1.0, xf * 0.0))  # relu'(0) = 0; NaN stays NaN


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UP: tl.constexpr):
    """tl.dot of two input-dtype tiles (fp32 accumulate). UP: upcast first (the CPU interpreter's bf16 dot is
    wrong in some Triton versions; bf16 values are exact in fp32, so the result is the same product)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    else:
        return tl.dot(a, b, input_precision=PREC)


# ----------------------------------------------------------------------------------------------- forward
@triton.jit
def _state_fwd(
    K, V, S0, Z0, HS, ZS, ST, ZT,
    NK, F, DV, NT,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr,
    HAS_S0: tl.constexpr, STORE_H: tl.constexpr, STORE_T: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr,
):
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    ok = pk * BK + tl.arange(0, BK)
    ov = pv * BV + tl.arange(0, BV)
    oc = tl.arange(0, C)
    mk = ok < F
    mv = ov < DV
    mz = mk & ((ok * 0 + pv) == 0)
    mkv = mk[:, None] & mv[None, :]
    soff = ok[:, None] * DV + ov[None, :]
    if HAS_S0:
        S = tl.load(S0 + bh * F * DV + soff, mask=mkv, other=0.0).to(tl.float32)
        z = tl.load(Z0 + bh * F + ok, mask=mk, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
        z = tl.zeros([BK], dtype=tl.float32)
    kbase = K + bh * NK * F
    vbase = V + bh * NK * DV
    for t in range(NT):
        if STORE_H:
            tl.store(HS + (bh * NT + t) * F * DV + soff, S, mask=mkv)
            tl.store(ZS + (bh * NT + t) * F + ok, z, mask=mz)
        rows = t * C + oc
        mr = rows < NK
        mrk = mr[:, None] & mk[None, :]
        k = tl.load(kbase + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
        k = _phi(k, mrk, FM)
        v = tl.load(vbase + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
        S += _dot(tl.trans(k), v, PREC, UP)
        z += tl.sum(k.to(tl.float32), 0)
    if STORE_T:
        tl.store(ST + bh * F * DV + soff, S, mask=mkv)
        tl.store(ZT + bh * F + ok, z, mask=mz)


@triton.jit
def _out_fwd(
    Q, K, V, HS, ZS, O, DEN,
    NQ, NK, F, DV, NT, HQ, G, eps,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr,
    CAUSAL: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, UP: tl.constexpr,
):
    t = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    pv = tl.program_id(2)
    HKV = HQ // G
    bkv = (bh // HQ) * HKV + (bh % HQ) // G
    oc = tl.arange(0, C)
    ov = pv * BV + tl.arange(0, BV)
    mv = ov < DV
    rows = t * C + oc
    mr = rows < NQ
    qbase = Q + bh * NQ * F
    kbase = K + bkv * NK * F
    if CAUSAL:
        hbase = HS + (bkv * NT + t) * F * DV
        zbase = ZS + (bkv * NT + t) * F
    else:
        hbase = HS + bkv * F * DV
        zbase = ZS + bkv * F
    acc = tl.zeros([C, BV], dtype=tl.float32)
    den = tl.zeros([C], dtype=tl.float32)
    A = tl.zeros([C, C], dtype=tl.float32)
    for kb in range(0, F, BK):
        ok = kb + tl.arange(0, BK)
        mk = ok < F
        mrk = mr[:, None] & mk[None, :]
        q = tl.load(qbase + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
        q = _phi(q, mrk, FM)
        s = tl.load(hbase + ok[:, None] * DV + ov[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
        z = tl.load(zbase + ok, mask=mk, other=0.0)
        qf = q.to(tl.float32)
        acc += tl.dot(qf, s, input_precision=SPREC)
        den += tl.sum(qf * z[None, :], 1)
        if CAUSAL:
            k = tl.load(kbase + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            k = _phi(k, mrk, FM)
            A += _dot(q, tl.trans(k), PREC, UP)
    if CAUSAL:
        A = tl.where(oc[:, None] >= oc[None, :], A, 0.0)
        den += tl.sum(A, 1)
    den = den + eps
    rden = 1.0 / den
    acc = acc * rden[:, None]
    if CAUSAL:
        v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
        P = A * rden[:, None]  # in [0, 1]: safe in fp16
        acc += _dot(P.to(v.dtype), v, PREC, UP)
    tl.store(O + bh * NQ * DV + rows[:, None] * DV + ov[None, :], acc.to(O.dtype.element_ty), mask=mr[:, None] & mv[None, :])
    tl.store(DEN + bh * NQ + rows, den, mask=mr & ((rows * 0 + pv) == 0))


# ----------------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_pre(O, DO, DEN, RINV, CD, NROWS, DV, BM: tl.constexpr, BV: tl.constexpr):
    """rinv = 1 / den, c = -(dout . out) / den, per row (fp32)."""
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
    rinv = 1.0 / den
    tl.store(RINV + rows, rinv, mask=mr)
    tl.store(CD + rows, -dot * rinv, mask=mr)


@triton.jit
def _state_bwd(
    Q, DO, RINV, CD, DST, DZT, DHS, DZS, DS0, DZ0,
    NQ, F, DV, NT, HQ, G,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr,
    HAS_DST: tl.constexpr, STORE_H: tl.constexpr, STORE_0: tl.constexpr, SPREC: tl.constexpr,
):
    """Reverse recurrence: dS_t = dS_T + sum over chunks > t (causal: stored per chunk) of q^T g, dz likewise."""
    pk = tl.program_id(0)
    pv = tl.program_id(1)
    bkv = tl.program_id(2).to(tl.int64)
    HKV = HQ // G
    b = bkv // HKV
    hk = bkv % HKV
    ok = pk * BK + tl.arange(0, BK)
    ov = pv * BV + tl.arange(0, BV)
    oc = tl.arange(0, C)
    mk = ok < F
    mv = ov < DV
    mz = mk & ((ok * 0 + pv) == 0)
    mkv = mk[:, None] & mv[None, :]
    soff = ok[:, None] * DV + ov[None, :]
    if HAS_DST:
        dS = tl.load(DST + bkv * F * DV + soff, mask=mkv, other=0.0).to(tl.float32)
        dz = tl.load(DZT + bkv * F + ok, mask=mk, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros([BK, BV], dtype=tl.float32)
        dz = tl.zeros([BK], dtype=tl.float32)
    for i in range(NT):
        t = NT - 1 - i
        if STORE_H:
            tl.store(DHS + (bkv * NT + t) * F * DV + soff, dS, mask=mkv)
            tl.store(DZS + (bkv * NT + t) * F + ok, dz, mask=mz)
        rows = t * C + oc
        mr = rows < NQ
        mrk = mr[:, None] & mk[None, :]
        for g in range(G):
            bq = b * HQ + hk * G + g
            q = tl.load(Q + bq * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            qf = _phi(q, mrk, FM).to(tl.float32)
            do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
            rinv = tl.load(RINV + bq * NQ + rows, mask=mr, other=0.0)
            cd = tl.load(CD + bq * NQ + rows, mask=mr, other=0.0)
            gm = do.to(tl.float32) * rinv[:, None]
            dS += tl.dot(tl.trans(qf), gm, input_precision=SPREC)
            dz += tl.sum(qf * cd[:, None], 0)
    if STORE_0:
        tl.store(DS0 + bkv * F * DV + soff, dS, mask=mkv)
        tl.store(DZ0 + bkv * F + ok, dz, mask=mz)


@triton.jit
def _dq(
    Q, K, V, DO, RINV, CD, HS, ZS, DQ,
    NQ, NK, F, DV, NT, HQ, G,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr,
    CAUSAL: tl.constexpr, SPREC: tl.constexpr,
):
    t = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    pk = tl.program_id(2)
    HKV = HQ // G
    bkv = (bh // HQ) * HKV + (bh % HQ) // G
    oc = tl.arange(0, C)
    ok = pk * BK + tl.arange(0, BK)
    mk = ok < F
    rows = t * C + oc
    mr = rows < NQ
    mrk = mr[:, None] & mk[None, :]
    if CAUSAL:
        hbase = HS + (bkv * NT + t) * F * DV
        zbase = ZS + (bkv * NT + t) * F
    else:
        hbase = HS + bkv * F * DV
        zbase = ZS + bkv * F
    rinv = tl.load(RINV + bh * NQ + rows, mask=mr, other=0.0)
    cd = tl.load(CD + bh * NQ + rows, mask=mr, other=0.0)
    dq = tl.zeros([C, BK], dtype=tl.float32)
    dA = tl.zeros([C, C], dtype=tl.float32)
    for vb in range(0, DV, BV):
        ov = vb + tl.arange(0, BV)
        mv = ov < DV
        mrv = mr[:, None] & mv[None, :]
        do = tl.load(DO + bh * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
        gm = do.to(tl.float32) * rinv[:, None]
        s = tl.load(hbase + ok[:, None] * DV + ov[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
        dq += tl.dot(gm, tl.trans(s), input_precision=SPREC)
        if CAUSAL:
            v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
            dA += tl.dot(gm, tl.trans(v.to(tl.float32)), input_precision=SPREC)
    z = tl.load(zbase + ok, mask=mk, other=0.0)
    dq += cd[:, None] * z[None, :]
    if CAUSAL:
        dA = tl.where(oc[:, None] >= oc[None, :], dA + cd[:, None], 0.0)
        k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
        k = _phi(k, mrk, FM)
        dq += tl.dot(dA, k.to(tl.float32), input_precision=SPREC)
    if FM != 0:
        q = tl.load(Q + bh * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
        dq = dq * _phi_grad(q, FM)
    tl.store(DQ + bh * NQ * F + rows[:, None] * F + ok[None, :], dq.to(DQ.dtype.element_ty), mask=mrk)


@triton.jit
def _dkdv(
    Q, K, V, DO, RINV, CD, DHS, DZS, DK, DV_,
    NQ, NK, F, DV, NT, HQ, G,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FM: tl.constexpr,
    CAUSAL: tl.constexpr, PREC: tl.constexpr, SPREC: tl.constexpr, UP: tl.constexpr,
):
    """Programs 0..NKB-1 of axis 2 compute a BK column block of dk, the others a BV column block of dv."""
    t = tl.program_id(0)
    bkv = tl.program_id(1).to(tl.int64)
    pid = tl.program_id(2)
    HKV = HQ // G
    NKB = tl.cdiv(F, BK)
    b = bkv // HKV
    hk = bkv % HKV
    oc = tl.arange(0, C)
    rows = t * C + oc
    mr = rows < NK
    causal_m = oc[:, None] >= oc[None, :]  # (i, j): query row i sees key row j
    if CAUSAL:
        hbase = DHS + (bkv * NT + t) * F * DV
        zbase = DZS + (bkv * NT + t) * F
    else:
        hbase = DHS + bkv * F * DV
        zbase = DZS + bkv * F
    if pid < NKB:
        ok = pid * BK + tl.arange(0, BK)
        mk = ok < F
        mrk = mr[:, None] & mk[None, :]
        dk = tl.zeros([C, BK], dtype=tl.float32)
        for vb in range(0, DV, BV):
            ov = vb + tl.arange(0, BV)
            mv = ov < DV
            v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
            s = tl.load(hbase + ok[:, None] * DV + ov[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
            dk += tl.dot(v.to(tl.float32), tl.trans(s), input_precision=SPREC)
        dz = tl.load(zbase + ok, mask=mk, other=0.0)
        dk += tl.where(mr[:, None], dz[None, :], 0.0)
        if CAUSAL:
            for g in range(G):
                bq = b * HQ + hk * G + g
                rinv = tl.load(RINV + bq * NQ + rows, mask=mr, other=0.0)
                cd = tl.load(CD + bq * NQ + rows, mask=mr, other=0.0)
                dA = tl.zeros([C, C], dtype=tl.float32)
                for vb in range(0, DV, BV):
                    ov = vb + tl.arange(0, BV)
                    mrv = mr[:, None] & (ov < DV)[None, :]
                    do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
                    v = tl.load(V + bkv * NK * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
                    gm = do.to(tl.float32) * rinv[:, None]
                    dA += tl.dot(gm, tl.trans(v.to(tl.float32)), input_precision=SPREC)
                dA = tl.where(causal_m, dA + cd[:, None], 0.0)
                q = tl.load(Q + bq * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
                q = _phi(q, mrk, FM)
                dk += tl.dot(tl.trans(dA), q.to(tl.float32), input_precision=SPREC)
        if FM != 0:
            k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            dk = dk * _phi_grad(k, FM)
        tl.store(DK + bkv * NK * F + rows[:, None] * F + ok[None, :], dk.to(DK.dtype.element_ty), mask=mrk)
    else:
        ov = (pid - NKB) * BV + tl.arange(0, BV)
        mv = ov < DV
        mrv = mr[:, None] & mv[None, :]
        dv = tl.zeros([C, BV], dtype=tl.float32)
        for kb in range(0, F, BK):
            ok = kb + tl.arange(0, BK)
            mk = ok < F
            mrk = mr[:, None] & mk[None, :]
            k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
            k = _phi(k, mrk, FM)
            s = tl.load(hbase + ok[:, None] * DV + ov[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
            dv += tl.dot(k.to(tl.float32), s, input_precision=SPREC)
        if CAUSAL:
            for g in range(G):
                bq = b * HQ + hk * G + g
                A = tl.zeros([C, C], dtype=tl.float32)
                for kb in range(0, F, BK):
                    ok = kb + tl.arange(0, BK)
                    mk = ok < F
                    mrk = mr[:, None] & mk[None, :]
                    q = tl.load(Q + bq * NQ * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
                    q = _phi(q, mrk, FM)
                    k = tl.load(K + bkv * NK * F + rows[:, None] * F + ok[None, :], mask=mrk, other=0.0)
                    k = _phi(k, mrk, FM)
                    A += _dot(q, tl.trans(k), PREC, UP)
                A = tl.where(causal_m, A, 0.0)
                rinv = tl.load(RINV + bq * NQ + rows, mask=mr, other=0.0)
                do = tl.load(DO + bq * NQ * DV + rows[:, None] * DV + ov[None, :], mask=mrv, other=0.0)
                gm = do.to(tl.float32) * rinv[:, None]
                dv += tl.dot(tl.trans(A), gm, input_precision=SPREC)
        tl.store(DV_ + bkv * NK * DV + rows[:, None] * DV + ov[None, :], dv.to(DV_.dtype.element_ty), mask=mrv)


# ----------------------------------------------------------------------------------------------- launcher
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(n: int, lo: int = 16, hi: int = 128) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def _cfg(F: int, Dv: int, chunk_size: int, dtype: torch.dtype):
    C = _pow2(chunk_size, 16, 128)
    # fp32 operands: exact fp32 products for fp32 inputs, tf32 for 16-bit inputs (whose values tf32 holds
    # exactly; only the fp32 side is rounded). Products of two 16-bit tiles run in their own dtype.
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return C, prec, prec


# Tile configurations (BK, BV, num_warps, num_stages), tried in order; the first that compiles within the
# device's shared memory is remembered per (kernel, F, Dv, C, dtype). F and Dv blocks are capped at 64: the
# parallel kernels hold fp32 state tiles next to 16-bit tiles, and the sequential state kernels gain
# parallelism (programs per head = (F / BK) * (Dv / BV)).
_TILES = {
    "state": [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1)],
    "out": [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1)],
    "dq": [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1)],
    "dkdv": [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1)],
}
_CHOSEN = {}


def _launch(kind, kernel, grid_fn, F, Dv, chunk, dtype, args, **const):
    """Launch ``kernel[grid_fn(BK, BV)](*args, BK=, BV=, **const)`` with the first tile config that fits."""
    key = (kind, F, Dv, chunk, dtype)
    cfgs = _TILES[kind]
    i0 = _CHOSEN.get(key, 0)
    for i in range(i0, len(cfgs)):
        bk, bv, w, st = cfgs[i]
        BK, BV = min(bk, _pow2(F)), min(bv, _pow2(Dv))
        try:
            kernel[grid_fn(BK, BV)](*args, BK=BK, BV=BV, num_warps=w, num_stages=st, **const)
            _CHOSEN[key] = i
            return
        except triton.runtime.errors.OutOfResources:
            if i == len(cfgs) - 1:
                raise


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


class _LinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, s0, z0, causal, eps, fm, chunk_size):
        B, Hq, Hkv, Nq, Nk, F, Dv = _check(q, k, v, s0, z0, causal)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        C, SPREC, PREC = _cfg(F, Dv, chunk_size, q.dtype)
        up = q.dtype == torch.bfloat16 and _interpreting()
        G = Hq // Hkv
        NTq, NTk = triton.cdiv(Nq, C), triton.cdiv(Nk, C)
        dev, dt = q.device, q.dtype
        has_s0 = s0 is not None
        if has_s0:
            s0 = s0.float().contiguous()
            z0 = z0.float().contiguous()
        ST = torch.empty(B, Hkv, F, Dv, device=dev, dtype=torch.float32)
        ZT = torch.empty(B, Hkv, F, device=dev, dtype=torch.float32)
        if causal:
            HS = torch.empty(B * Hkv, NTk, F, Dv, device=dev, dtype=torch.float32)
            ZS = torch.empty(B * Hkv, NTk, F, device=dev, dtype=torch.float32)
        else:
            HS, ZS = ST, ZT
        _launch("state", _state_fwd, lambda BK, BV: (triton.cdiv(F, BK), triton.cdiv(Dv, BV), B * Hkv), F, Dv, C, dt,
                (k, v, s0 if has_s0 else ST, z0 if has_s0 else ZT, HS, ZS, ST, ZT, Nk, F, Dv, NTk),
                C=C, FM=fm, HAS_S0=has_s0, STORE_H=causal, STORE_T=True, PREC=PREC, UP=up)
        o = torch.empty(B, Hq, Nq, Dv, device=dev, dtype=dt)
        den = torch.empty(B, Hq, Nq, device=dev, dtype=torch.float32)
        _launch("out", _out_fwd, lambda BK, BV: (NTq, B * Hq, triton.cdiv(Dv, BV)), F, Dv, C, dt,
                (q, k, v, HS, ZS, o, den, Nq, Nk, F, Dv, NTk, Hq, G, float(eps)),
                C=C, FM=fm, CAUSAL=causal, PREC=PREC, SPREC=SPREC, UP=up)
        del HS, ZS
        ctx.save_for_backward(q, k, v, o, den, s0 if has_s0 else None, z0 if has_s0 else None,
                              None if causal else ST, None if causal else ZT)
        ctx.cfg = (causal, fm, C, SPREC, PREC, has_s0, up)
        return o, ST, ZT

    @staticmethod
    def backward(ctx, do, dST, dZT):
        q, k, v, o, den, s0, z0, ST, ZT = ctx.saved_tensors
        causal, fm, C, SPREC, PREC, has_s0, up = ctx.cfg
        B, Hq, Nq, F = q.shape
        Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
        G = Hq // Hkv
        NTq, NTk = triton.cdiv(Nq, C), triton.cdiv(Nk, C)
        dev, dt = q.device, q.dtype
        do = do.contiguous()
        rinv = torch.empty_like(den)
        cd = torch.empty_like(den)
        nrows = B * Hq * Nq
        _bwd_pre[(triton.cdiv(nrows, 64),)](o, do, den, rinv, cd, nrows, Dv, BM=64, BV=min(64, _pow2(Dv)), num_warps=4)
        if causal:  # recompute the chunk-start states (see module docstring)
            HS = torch.empty(B * Hkv, NTk, F, Dv, device=dev, dtype=torch.float32)
            ZS = torch.empty(B * Hkv, NTk, F, device=dev, dtype=torch.float32)
            _launch("state", _state_fwd, lambda BK, BV: (triton.cdiv(F, BK), triton.cdiv(Dv, BV), B * Hkv), F, Dv, C, dt,
                    (k, v, s0 if has_s0 else HS, z0 if has_s0 else ZS, HS, ZS, HS, ZS, Nk, F, Dv, NTk),
                    C=C, FM=fm, HAS_S0=has_s0, STORE_H=True, STORE_T=False, PREC=PREC, UP=up)
            DHS = torch.empty_like(HS)
            DZS = torch.empty_like(ZS)
        else:
            HS, ZS = ST, ZT
            DHS = torch.empty(B, Hkv, F, Dv, device=dev, dtype=torch.float32)
            DZS = torch.empty(B, Hkv, F, device=dev, dtype=torch.float32)
        has_dst = dST is not None or dZT is not None
        if has_dst:
            dST = (dST if dST is not None else torch.zeros(B, Hkv, F, Dv, device=dev)).float().contiguous()
            dZT = (dZT if dZT is not None else torch.zeros(B, Hkv, F, device=dev)).float().contiguous()
        need_s0 = has_s0 and (ctx.needs_input_grad[3] or ctx.needs_input_grad[4])
        DS0 = torch.empty(B, Hkv, F, Dv, device=dev, dtype=torch.float32) if need_s0 else None
        DZ0 = torch.empty(B, Hkv, F, device=dev, dtype=torch.float32) if need_s0 else None
        if not causal:
            DS0, DZ0 = DHS, DZS  # the total is both the per-chunk suffix (stride 0) and the initial-state grad
        _launch("state", _state_bwd, lambda BK, BV: (triton.cdiv(F, BK), triton.cdiv(Dv, BV), B * Hkv), F, Dv, C, dt,
                (q, do, rinv, cd, dST if has_dst else DHS, dZT if has_dst else DZS, DHS, DZS,
                 DS0 if DS0 is not None else DHS, DZ0 if DZ0 is not None else DZS, Nq, F, Dv, NTq, Hq, G),
                C=C, FM=fm, HAS_DST=has_dst, STORE_H=causal, STORE_0=(DS0 is not None), SPREC=SPREC)
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        _launch("dq", _dq, lambda BK, BV: (NTq, B * Hq, triton.cdiv(F, BK)), F, Dv, C, dt,
                (q, k, v, do, rinv, cd, HS, ZS, dq, Nq, Nk, F, Dv, NTk, Hq, G),
                C=C, FM=fm, CAUSAL=causal, SPREC=SPREC)
        _launch("dkdv", _dkdv, lambda BK, BV: (NTk, B * Hkv, triton.cdiv(F, BK) + triton.cdiv(Dv, BV)), F, Dv, C, dt,
                (q, k, v, do, rinv, cd, DHS, DZS, dk, dv, Nq, Nk, F, Dv, NTk, Hq, G),
                C=C, FM=fm, CAUSAL=causal, PREC=PREC, SPREC=SPREC, UP=up)
        ds0 = dz0 = None
        if need_s0:
            ds0, dz0 = DS0, DZ0
        return dq, dk, dv, ds0, dz0, None, None, None, None


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, eps: float = 1e-6,
    feature_map: Optional[str] = None, initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    output_final_state: bool = False, chunk_size: int = 64,
):
    """Linear attention, Triton forward + backward (see the module docstring for the algorithm).

    Args:
        q: ``(B, Hq, Nq, F)`` float16 / bfloat16 / float32: ``phi(q)``, or raw ``q`` when ``feature_map`` is set.
        k: ``(B, Hkv, Nk, F)``, same dtype; ``Hkv`` divides ``Hq`` (GQA / MQA).
        v: ``(B, Hkv, Nk, Dv)``, same dtype. ``F, Dv <= 256``.
        causal: chunked causal form (needs ``Nq == Nk``; prefix keys go into ``initial_state``) or the
            non-causal form (any ``Nq``, ``Nk``).
        eps: added to the normaliser ``phi(q) . z``.
        feature_map: ``None`` (inputs are features), ``"elu1"`` or ``"relu"`` (applied in-kernel, ``F = D``).
        initial_state: optional ``(S0 (B, Hkv, F, Dv), z0 (B, Hkv, F))`` (cast to fp32), the sums over keys
            before the first one (differentiable).
        output_final_state: also return ``(S, z)`` after the last key (fp32, differentiable).
        chunk_size: power of two in [16, 128] (clamped).

    Returns:
        ``out (B, Hq, Nq, Dv)`` in ``q.dtype``; with ``output_final_state`` also ``(S (B, Hkv, F, Dv), z (B, Hkv, F))``.

    Raises:
        ValueError / TypeError: bad shapes or dtypes, ``F`` or ``Dv`` > 256, causal with ``Nq != Nk``, unknown
        ``feature_map``.
    """
    if feature_map not in FUSED_FEATURE_MAPS:
        raise ValueError(f"feature_map={feature_map!r} is not supported in-kernel; allowed values: None, elu1, relu "
                         "(compute favor / taylor features before the call)")
    s0, z0 = initial_state if initial_state is not None else (None, None)
    o, st, zt = _LinearAttention.apply(q, k, v, s0, z0, bool(causal), float(eps), FUSED_FEATURE_MAPS[feature_map],
                                       int(chunk_size))
    return (o, (st, zt)) if output_final_state else o


def linear_attention_recurrent(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, eps: float = 1e-6,
    initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
):
    """Step-by-step recurrent causal form in fp32 (Katharopoulos et al. 2020, eq. 18-20), for tests.

    ``S_i = S_{i-1} + phi(k_i)^T v_i``, ``z_i = z_{i-1} + phi(k_i)``, ``out_i = phi(q_i) S_i / (phi(q_i) . z_i + eps)``;
    features ``fq (B, Hq, N, F)``, ``fk (B, Hkv, N, F)``, ``v (B, Hkv, N, Dv)``. Returns fp32 ``out`` and ``(S, z)``.
    Differentiable (plain autograd); O(N) Python steps: small N only.
    """
    B, Hq, N, F = fq.shape
    Hkv, Dv = fk.shape[1], v.shape[3]
    G = Hq // Hkv
    fq, fk, v = fq.float(), fk.float(), v.float()
    if initial_state is None:
        S = fq.new_zeros(B, Hkv, F, Dv)
        z = fq.new_zeros(B, Hkv, F)
    else:
        S, z = initial_state[0].float(), initial_state[1].float()
    outs = []
    for i in range(N):
        S = S + fk[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + fk[:, :, i]
        Sg = S.repeat_interleave(G, dim=1)
        zg = z.repeat_interleave(G, dim=1)
        qi = fq[:, :, i]
        num = torch.einsum("bhf,bhfd->bhd", qi, Sg)
        den = (qi * zg).sum(-1, keepdim=True) + eps
        outs.append(num / den)
    return torch.stack(outs, 2), (S, z)
