"""Chunked Triton kernels of Mamba-2's state-space duality (SSD, Dao & Gu 2024, "Transformers are SSMs",
section 6: the block decomposition of the semiseparable matrix), forward and backward.

The scan computed is, per batch ``b`` and head ``h`` (state ``S_t`` of shape ``(N, P)``, carried in fp32)::

    S_t = exp(a_t) * S_{t-1} + B_t x_t^T          y_t = S_t^T C_t

with ``x (B, T, H, P)``, log-decay ``a (B, T, H)`` (``a <= 0``; Mamba-2 passes ``dt * A``, and ``x * dt``),
``B, C (B, T, G, N)`` (``G`` groups shared by ``H / G`` heads each). The sequence is cut into chunks of ``L``
positions; ``cum`` is the in-chunk cumulative sum of ``a`` and ``cum_L`` its last value.

Forward, three launches (chunk-parallel except the cheap elementwise pass):

1. ``_chunk_state_kernel`` (grid chunks x (b, h) x P-blocks): the chunk's own contribution to the state after it,
   ``sum_s exp(cum_L - cum_s) B_s x_s^T`` (fp32 product, stored in the snapshot dtype), and the chunk decay
   ``exp(cum_L)``.
2. ``_state_pass_kernel`` (grid (b, h) x state blocks): ``S_{c+1} = exp(cum_L(c)) S_c + contrib_c`` over the chunks,
   ``UNR`` chunks per step as an associative scan, the carry in fp32 registers from the fp32 initial state, in
   place: the buffer ends holding the state entering every chunk, the fp32 final state goes to its own tensor.
3. ``_chunk_out_kernel`` (grid chunks x (b, h) x P-blocks): ``y = (C B^T o decay) x + exp(cum) C S_c`` with the
   segsum decay mask ``decay[t, s] = exp(cum_t - cum_s)`` for ``s <= t``; a software-pipelined loop over d_state
   in 64-wide steps accumulates ``C B^T`` and ``C S_c``. ``out_mode="group"``: ``_chunk_out_group_kernel`` (grid
   chunks x (b, group) x P-blocks x head-splits) loads ``B``, ``C`` and forms ``C B^T`` once for the heads of a
   group, then loops over them.

State snapshots (``state_dtype``, default the input dtype: bf16 for bf16 inputs): every consumer multiplies them in
the input dtype anyway, so storing them there halves the bytes of the largest tensors (``B * H * (T / L + 1) * N *
P``) written and read by every kernel; the carry from chunk to chunk, the final state and the initial state's
gradient stay fp32.

``state_pass="sequential"`` fuses steps 1 and 2 into ``_state_seq_kernel`` (grid (b, h) x N-blocks x P-blocks):
each program walks the chunks in order with its block of the state in fp32 registers, storing the state entering
each chunk and adding the chunk's contribution computed in registers; every state row is written once (the
parallel path writes the contributions, then the pass reads and rewrites them), at the price of ``B * H *
ceil(N / SBN) * ceil(P / SBP)`` programs walking all the chunks. The backward's reverse pass likewise.

Backward, the same three steps reversed: the chunk's contribution ``sum_t exp(cum_t) C_t dy_t^T`` to the gradient
of the state entering it, the reverse pass giving the gradient ``dS`` of the state leaving every chunk, then two
chunk-parallel kernels reading ``S_c`` and ``dS``: ``_chunk_bwd_dx_kernel`` (grid chunks x (b, h)) gives ``dx``,
``da`` (the in-chunk reverse cumulative sum of ``d cum``) and the masked ``(dy x^T) o decay`` tile; and
``_chunk_bwd_dbc_kernel`` (grid chunks x (b, group) x head-splits) gives ``dB``, ``dC``: one program loops over
the heads of one group, summing them in fp32 registers (deterministic, no atomics; partial sums only when the group
is split, while fewer than about 512 programs would run). Both loop over ``P`` in 32-wide steps, software-pipelined
with 16-bit snapshots. Every exponent is ``<= 0``.

Documents (``doc_ids``): the decay product across a boundary is zero; boundaries anywhere inside a chunk (masks on
the decay matrix, the state read, the state write and the chunk decay).

The step-by-step recurrence it is tested against is :func:`attn_zoo.families.ssd.ssd_scan_naive`.
Requires ``N`` (d_state) and ``P`` (head dim) <= 256, chunk size a power of two in [16, 128].
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._host import _interpreting

__all__ = ["ssd_scan", "CHUNK_SIZES", "MAX_DIM", "STATE_PASSES", "SEQ_BLOCKS", "OUT_BLOCKS", "OUT_MODES",
           "SNAPSHOT_DTYPES"]

CHUNK_SIZES = (16, 32, 64, 128)
MAX_DIM = 256
# how the states entering the chunks are computed: "parallel" (chunk states, then a pass over chunks), "sequential"
# (the two fused, one program per (b, h) and state block walking the chunks), "auto" (by the number of programs of
# the sequential pass, see _use_sequential)
STATE_PASSES = ("auto", "parallel", "sequential")
SEQ_BLOCKS = (16, 32, 64, 128, 256)  # allowed sizes of the sequential pass's state blocks (rows of N, columns of P)
_SEQ_BLOCK = (64, 64)  # the sequential pass's default (N-block, P-block), each clipped to the padded N / P
_PASS_UNROLL = 8  # chunks per step of the state pass (one load of UNR x BLK in flight per program)
_PASS_BLOCK = 256  # state elements per program of the state pass
_BWD_TARGET_PROGRAMS = 512  # the backward splits a group's heads over programs until about this many run (about
# 4 waves of one program per SM on the H200; fewer splits: fewer fp32 partial dB / dC to sum after)
# columns of P per step in the two backward kernels (they loop over P): at 64 the dx / da kernel spills registers on
# sm_90 (chunk 64, d_state 128, 8 warps: 255 registers + 264 B of stack, offline ptxas), at 32 it takes 248, none
_BWD_BLOCK_P = 32
# software-pipelining stages of the two backward kernels' loops over P: 2 with 16-bit state snapshots up to
# chunk x d_state = 64 x 128 (the next step's loads in flight; sm_90, 8 warps, triton 3.6: dx 254 registers with
# documents, no stack), else 1 (fp32 snapshots, or chunk 128: 2 stages spill)
_BWD_PIPELINE_MAX = 64 * 128
# state_pass="auto" takes the sequential pass from this many programs (B * H * N-blocks * P-blocks; the H200 has
# 132 SMs): below it, few long walks over the chunks leave the GPU idle and the chunk-parallel pass wins
_SEQ_MIN_PROGRAMS = 64
OUT_BLOCKS = (16, 32, 64, 128, 256)  # allowed d_state steps of the output kernel (out_block_n)
_OUT_BLOCK_N = 64  # the output kernel's default d_state step (clipped to the padded d_state)
OUT_MODES = ("auto", "head", "group")  # one program per head (_chunk_out_kernel) / per group of heads (sharing B, C)
_OUT_TARGET_PROGRAMS = 1024  # out_mode="group" splits a group's heads over programs until about this many run
# software-pipelining stages of the output kernel's d_state loop, by the inputs' element size (fp32 inputs at
# chunk 128: three (128, 64) fp32 tiles per stage, one stage)
_OUT_STAGES = {2: 2, 4: 1}
SNAPSHOT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


@triton.jit
def _chunk_head(pid, NBH, H, HPG):
    """Program ``pid`` of a grid over chunks x ``(b, h)``: chunk ``c``, ``bh = b * H + h``, batch ``b``, head ``h``
    and its group ``g`` (``HPG`` heads per group)."""
    c = pid // NBH
    bh = pid % NBH
    b = bh // H
    h = bh % H
    g = h // HPG
    return c, bh, b, h, g


@triton.jit
def _chunk_group(pid, NB, G):
    """Program ``pid`` of a grid over chunks x ``(b, group)``: chunk ``c``, batch ``b``, group ``g``."""
    c = pid // (NB * G)
    bg = pid % (NB * G)
    b = bg // G
    g = bg % G
    return c, b, g


@triton.jit
def _span(start, BLK: tl.constexpr, n):
    """Indices ``start .. start + BLK - 1`` and their mask ``< n`` (a block of d_state, head dim or positions)."""
    offs = start + tl.arange(0, BLK)
    return offs, offs < n


@triton.jit
def _rows(PTR, b, t, i, sb, st, si, offs):
    """Pointers ``(len(t), len(offs))`` to ``PTR[b, t, i, offs]`` of a ``(B, T, H or G, D)`` tensor (``x``, ``y``,
    ``B``, ``C``; unit last stride): positions ``t`` of batch ``b``, head or group ``i``, columns ``offs``."""
    return PTR + b * sb + t[:, None] * st + i * si + offs[None, :]


@triton.jit
def _snapshot(bh, c, NC, NS, PD):
    """Offset (int64) of snapshot ``c`` of row ``bh = b * H + h`` in a ``(BH, NC + 1, N, P)`` state buffer."""
    return (bh * (NC + 1) + c).to(tl.int64) * NS * PD


@triton.jit
def _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L: tl.constexpr, DOCS: tl.constexpr):
    """In-chunk cumulative log-decay and the four document-masked decays of chunk ``c`` of ``(b, h)``:
    ``decay (L, L)`` (segsum, causal), ``ec = exp(cum)`` (reads the state entering), ``w = exp(cum_L - cum)`` (writes
    the state leaving), ``el = exp(cum_L)`` (carries the state across); also the positions and their mask."""
    offs_t = tl.arange(0, L)
    t = c * L + offs_t
    tm = t < T
    a = tl.load(A + b * sab + t * sat + h * sah, mask=tm, other=0.0).to(tl.float32)
    cum = tl.cumsum(a, 0)
    cum_last = tl.sum(a, 0)
    causal = offs_t[:, None] >= offs_t[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    ec = tl.exp(cum)
    w = tl.exp(cum_last - cum)
    el = tl.exp(cum_last)
    if DOCS:  # document reset: no decay product across a boundary
        sg = tl.load(SEG + b * T + t, mask=tm, other=2147483647)
        sg_last = tl.max(tl.where(tm, sg, -1), 0)
        prev = tl.load(SEG + b * T + tl.maximum(c * L - 1, 0))  # chunk 0: position 0's document
        decay = tl.where(sg[:, None] == sg[None, :], decay, 0.0)
        ec = tl.where(sg == prev, ec, 0.0)
        w = tl.where(sg == sg_last, w, 0.0)
        el = tl.where(sg_last == prev, el, 0.0)
    return t, tm, decay, ec, w, el


@triton.jit
def _chunk_state_kernel(Z, V, A, SEG, OUT, EL, T, H, HPG, NS, PD, NC, NBH,
                        szb, szt, szg, svb, svt, svh, sab, sat, sah,
                        L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, WRITE: tl.constexpr,
                        DOCS: tl.constexpr):
    """``OUT[bh, c + WRITE] = sum_t wt_t Z_t V_t^T`` (fp32 ``(N, P)``): forward (``WRITE``): ``Z = B``, ``V = x``,
    ``wt = exp(cum_L - cum)`` (the chunk's contribution to the state leaving it), and ``EL[bh, c] = exp(cum_L)``;
    backward: ``Z = C``, ``V = dy``, ``wt = exp(cum)`` (its contribution to the gradient of the state entering it)."""
    pid_p = tl.program_id(1)
    c, bh, b, h, g = _chunk_head(tl.program_id(0), NBH, H, HPG)
    t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
    offs_n, nm = _span(0, BN, NS)
    offs_p, pm = _span(pid_p * BP, BP, PD)
    z = tl.load(_rows(Z, b, t, g, szb, szt, szg, offs_n), mask=tm[:, None] & nm[None, :], other=0.0)
    v = tl.load(_rows(V, b, t, h, svb, svt, svh, offs_p), mask=tm[:, None] & pm[None, :], other=0.0)
    if WRITE:
        wt = w
        tl.store(EL + bh * NC + c, el, mask=pid_p == 0)
        row = (bh * (NC + 1) + c + 1).to(tl.int64)
    else:
        wt = ec
        row = (bh * (NC + 1) + c).to(tl.int64)
    zw = (z.to(tl.float32) * wt[:, None]).to(v.dtype)
    st = tl.dot(tl.trans(zw), v)  # (BN, BP) fp32
    tl.store(OUT + row * NS * PD + offs_n[:, None] * PD + offs_p[None, :], st.to(OUT.dtype.element_ty),
             mask=nm[:, None] & pm[None, :])


@triton.jit
def _pass_combine(e1, x1, e2, x2):
    return e1 * e2, e2 * x1 + x2


@triton.jit
def _state_pass_kernel(X, E, INIT, FIN, NC, NE, HAS_INIT: tl.constexpr, REVERSE: tl.constexpr, UNR: tl.constexpr,
                       BLK: tl.constexpr):
    """In place over ``X (BH, NC + 1, NE)`` (the snapshot dtype) with ``E (BH, NC)``, the carried state in fp32
    registers, starting from ``INIT (BH, NE)`` fp32 (zero if not ``HAS_INIT``) and ending in ``FIN (BH, NE)`` fp32.
    Forward: ``X[0] = INIT``, ``X[k] = E[k - 1] X[k - 1] + X[k]`` for ``k = 1 .. NC`` (``X[c + 1]`` on entry: chunk
    ``c``'s contribution; on exit: the state entering chunk ``k``, ``X[NC]`` and ``FIN`` the final one). Reverse:
    ``X[NC] = INIT`` (the final state's gradient), ``X[k] = E[k] X[k + 1] + X[k]`` for ``k = NC - 1 .. 0`` (ends
    as the gradient of the state entering chunk ``k``, ``FIN`` the initial state's). ``UNR`` chunks per step: one
    ``(UNR, BLK)`` load, an associative scan of the pairs ``(decay, contribution)`` in fp32, then the carry; the
    stored rows are rounded to ``X``'s dtype, the carry is not."""
    pid_e = tl.program_id(0)
    bh = tl.program_id(1)
    offs = pid_e * BLK + tl.arange(0, BLK)
    em = offs < NE
    rows = tl.arange(0, UNR)
    base = X + bh.to(tl.int64) * (NC + 1) * NE
    if HAS_INIT:
        carry = tl.load(INIT + bh.to(tl.int64) * NE + offs, mask=em, other=0.0).to(tl.float32)
    else:
        carry = tl.zeros((BLK,), dtype=tl.float32)
    if REVERSE:
        tl.store(base + NC * NE + offs, carry.to(X.dtype.element_ty), mask=em)
    else:
        tl.store(base + offs, carry.to(X.dtype.element_ty), mask=em)
    for k0 in range(0, NC, UNR):
        rm = (k0 + rows) < NC
        if REVERSE:
            k = NC - 1 - k0 - rows
            e = tl.load(E + bh * NC + k, mask=rm, other=1.0)
        else:
            k = k0 + 1 + rows
            e = tl.load(E + bh * NC + k - 1, mask=rm, other=1.0)
        xm = rm[:, None] & em[None, :]
        ptr = base + k[:, None] * NE + offs[None, :]
        x = tl.load(ptr, mask=xm, other=0.0).to(tl.float32)
        es, xs = tl.associative_scan((tl.broadcast_to(e[:, None], (UNR, BLK)), x), 0, _pass_combine)
        out = es * carry[None, :] + xs
        tl.store(ptr, out.to(X.dtype.element_ty), mask=xm)
        carry = tl.sum(tl.where(rows[:, None] == UNR - 1, out, 0.0), 0)  # rows past NC: decay 1, contribution 0
    tl.store(FIN + bh.to(tl.int64) * NE + offs, carry, mask=em)


@triton.jit
def _state_seq_kernel(Z, V, A, SEG, OUT, EL, INIT, FIN, T, H, HPG, NS, PD, NC,
                      szb, szt, szg, svb, svt, svh, sab, sat, sah,
                      L: tl.constexpr, SBN: tl.constexpr, SBP: tl.constexpr, REVERSE: tl.constexpr,
                      HAS_INIT: tl.constexpr, DOCS: tl.constexpr):
    """The chunk states and the pass over chunks fused (``state_pass="sequential"``): one program per ``(b, h)``,
    block of ``SBN`` state rows and block of ``SBP`` columns walks the chunks in order, carrying its ``(SBN, SBP)``
    block of the state in fp32 registers from ``INIT (BH, N, P)`` fp32 (zero if not ``HAS_INIT``) to ``FIN (BH, N,
    P)`` fp32; ``OUT (BH, NC + 1, N, P)`` receives the snapshots, rounded to its dtype. Forward (``Z = B``, ``V =
    x``): for ``c = 0 .. NC - 1`` store the state entering chunk ``c`` at row ``c``, then ``S = exp(cum_L) S +
    sum_s exp(cum_L - cum_s) B_s x_s^T``; ``FIN`` the final state (row ``NC`` is not written); ``EL[bh, c] =
    exp(cum_L)`` as the chunk-parallel path. Reverse (``Z = C``, ``V = dy``): for ``c = NC - 1 .. 0`` store the
    gradient of the state leaving chunk ``c`` at row ``c + 1``, then ``dS = exp(cum_L) dS + sum_t exp(cum_t) C_t
    dy_t^T``; ``FIN`` the gradient of the initial state (row 0 is not written). The in-chunk terms and document
    masks are :func:`_chunk_masks`' (the same values as ``_chunk_state_kernel``), each state row written once."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_p = tl.program_id(2)
    b = bh // H
    h = bh % H
    g = h // HPG
    offs_n = pid_n * SBN + tl.arange(0, SBN)
    offs_p = pid_p * SBP + tl.arange(0, SBP)
    nm = offs_n < NS
    pm = offs_p < PD
    smask = nm[:, None] & pm[None, :]
    sp = offs_n[:, None] * PD + offs_p[None, :]
    bh_row = bh.to(tl.int64) * (NC + 1)
    if HAS_INIT:
        S = tl.load(INIT + bh.to(tl.int64) * NS * PD + sp, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros((SBN, SBP), dtype=tl.float32)
    for i in range(NC):
        if REVERSE:
            c = NC - 1 - i
            row = c + 1
        else:
            c = i
            row = c
        tl.store(OUT + (bh_row + row) * NS * PD + sp, S.to(OUT.dtype.element_ty), mask=smask)
        t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
        z = tl.load(_rows(Z, b, t, g, szb, szt, szg, offs_n), mask=tm[:, None] & nm[None, :], other=0.0)
        # written out: through _rows, triton 3.6 schedules this loop differently (the inlined call's line-info
        # labels reach ptxas)
        v = tl.load(V + b * svb + t[:, None] * svt + h * svh + offs_p[None, :], mask=tm[:, None] & pm[None, :],
                    other=0.0)
        if REVERSE:
            wt = ec
        else:
            wt = w
            tl.store(EL + bh * NC + c, el, mask=(pid_n == 0) & (pid_p == 0))
        zw = (z.to(tl.float32) * wt[:, None]).to(v.dtype)
        S = tl.dot(tl.trans(zw), v, el * S)  # (SBN, SBP) fp32
    tl.store(FIN + bh.to(tl.int64) * NS * PD + sp, S, mask=smask)


@triton.jit
def _chunk_y(CB, decay, x, ec, CS):
    """The SSD output of a chunk, ``y = (C B^T o decay) x + exp(cum) (C S_c)`` (fp32 ``(L, P-block)``), from ``CB =
    C B^T`` and ``CS = C S_c`` (fp32), the masked decays of :func:`_chunk_masks` and ``x``."""
    return tl.dot((CB * decay).to(x.dtype), x, ec[:, None] * CS)


@triton.jit
def _chunk_out_kernel(X, A, BM, CM, ST, SEG, Y, T, H, HPG, NS, PD, NC, NBH,
                      sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg, syb, syt, syh,
                      L: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr, DOCS: tl.constexpr):
    """``y = (C B^T o decay) x + exp(cum) (C S_c)`` for one chunk, one ``(b, h)`` and one block of ``P``: a loop
    over d_state in ``BK``-wide steps accumulates ``C B^T`` and ``C S_c`` in fp32 (the loads of the next step in
    flight while the current one multiplies: ``num_stages``), then the masked intra-chunk product."""
    pid_p = tl.program_id(1)
    c, bh, b, h, g = _chunk_head(tl.program_id(0), NBH, H, HPG)
    t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
    offs_p, pm = _span(pid_p * BP, BP, PD)
    tpm = tm[:, None] & pm[None, :]
    x = tl.load(_rows(X, b, t, h, sxb, sxt, sxh, offs_p), mask=tpm, other=0.0)
    st_base = ST + _snapshot(bh, c, NC, NS, PD)
    CB = tl.zeros((L, L), dtype=tl.float32)
    CS = tl.zeros((L, BP), dtype=tl.float32)
    for n0 in range(0, BN, BK):
        offs_n, nm = _span(n0, BK, NS)
        tnm = tm[:, None] & nm[None, :]
        Bc = tl.load(_rows(BM, b, t, g, sbb, sbt, sbg, offs_n), mask=tnm, other=0.0)
        Cc = tl.load(_rows(CM, b, t, g, scb, sct, scg, offs_n), mask=tnm, other=0.0)
        S = tl.load(st_base + offs_n[:, None] * PD + offs_p[None, :], mask=nm[:, None] & pm[None, :], other=0.0)
        CB = tl.dot(Cc, tl.trans(Bc), CB)  # (L, L) fp32
        CS = tl.dot(Cc, S.to(x.dtype), CS)  # (L, BP) fp32
    y = _chunk_y(CB, decay, x, ec, CS)
    tl.store(_rows(Y, b, t, h, syb, syt, syh, offs_p), y.to(Y.dtype.element_ty), mask=tpm)


@triton.jit
def _chunk_out_group_kernel(X, A, BM, CM, ST, SEG, Y, T, H, HPG, HPP, NS, PD, NC, NB, G,
                            sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg, syb, syt, syh,
                            L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, DOCS: tl.constexpr):
    """``_chunk_out_kernel``'s output for ``HPP`` heads of one group (``out_mode="group"``), one chunk and one block
    of ``P``: ``B``, ``C`` and ``C B^T`` are loaded / computed once for the heads sharing them, then a loop over the
    heads (the next head's ``x`` and ``S_c`` loads in flight: ``num_stages``) gives ``y = (C B^T o decay_h) x_h +
    exp(cum_h) (C S_{h, c})``. Grid: chunks x (b, group), P-blocks, head splits."""
    pid_p = tl.program_id(1)
    hs = tl.program_id(2)
    c, b, g = _chunk_group(tl.program_id(0), NB, G)
    t, tm = _span(c * L, L, T)
    offs_n, nm = _span(0, BN, NS)
    tnm = tm[:, None] & nm[None, :]
    offs_p, pm = _span(pid_p * BP, BP, PD)
    tpm = tm[:, None] & pm[None, :]
    smask = nm[:, None] & pm[None, :]
    Bc = tl.load(_rows(BM, b, t, g, sbb, sbt, sbg, offs_n), mask=tnm, other=0.0)
    Cc = tl.load(_rows(CM, b, t, g, scb, sct, scg, offs_n), mask=tnm, other=0.0)
    CB = tl.dot(Cc, tl.trans(Bc))  # (L, L) fp32, shared by the group's heads
    for j in range(HPP):
        h = g * HPG + hs * HPP + j
        bh = b * H + h
        t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
        x = tl.load(_rows(X, b, t, h, sxb, sxt, sxh, offs_p), mask=tpm, other=0.0)
        S = tl.load(ST + _snapshot(bh, c, NC, NS, PD) + offs_n[:, None] * PD + offs_p[None, :],
                    mask=smask, other=0.0)
        CS = tl.dot(Cc, S.to(x.dtype))  # (L, BP) fp32
        y = _chunk_y(CB, decay, x, ec, CS)
        tl.store(_rows(Y, b, t, h, syb, syt, syh, offs_p), y.to(Y.dtype.element_ty), mask=tpm)


@triton.jit
def _p_block(p0, BP: tl.constexpr, PD, tm, offs_n, nm):
    """Columns ``p0 .. p0 + BP - 1`` of the head dim ``P`` (the backward kernels' loop over ``P``): their indices,
    the masks of the ``(L, BP)`` tiles (``x``, ``dy``) and of the ``(N, BP)`` state tiles, and the offsets of the
    latter in a snapshot."""
    offs_p, pm = _span(p0, BP, PD)
    return offs_p, tm[:, None] & pm[None, :], nm[:, None] & pm[None, :], offs_n[:, None] * PD + offs_p[None, :]


@triton.jit
def _state_tiles(ST, DST, st_row, sp, smask, NS, PD):
    """The ``(N, BP)`` tiles of the state entering the chunk (snapshot ``st_row`` of ``ST``) and of the gradient of
    the state leaving it (the next snapshot of ``DST``), in the snapshot dtype."""
    S = tl.load(ST + st_row + sp, mask=smask, other=0.0)
    dS = tl.load(DST + st_row + NS * PD + sp, mask=smask, other=0.0)
    return S, dS


@triton.jit
def _chunk_bwd_dx_kernel(X, A, BM, CM, DY, ST, DST, SEG, DX, DA, LD, T, H, HPG, NS, PD, NC, NBH,
                         sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg,
                         L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, DOCS: tl.constexpr):
    """``dx`` and ``da`` of one chunk and one ``(b, h)`` (all of ``P``, in blocks of ``BP``), and ``LD[bh, c] =
    (dy x^T) o decay`` ``(L, L)`` for the ``dB`` / ``dC`` kernel. ``ST[bh, c]``: the state entering chunk ``c``;
    ``DST[bh, c + 1]``: the gradient of the state leaving it. ``DX, DY (B, T, H, P)``, ``DA (B, T, H)`` contiguous."""
    c, bh, b, h, g = _chunk_head(tl.program_id(0), NBH, H, HPG)
    t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
    offs_n, nm = _span(0, BN, NS)
    tnm = tm[:, None] & nm[None, :]
    Bc = tl.load(_rows(BM, b, t, g, sbb, sbt, sbg, offs_n), mask=tnm, other=0.0)
    Cc = tl.load(_rows(CM, b, t, g, scb, sct, scg, offs_n), mask=tnm, other=0.0)
    CB = tl.dot(Cc, tl.trans(Bc))  # (L, L) fp32
    M = (CB * decay).to(Cc.dtype)
    rows = (b * T + t) * H + h  # (L,) row of (b, t, h) in the contiguous (B, T, H, .) tensors
    st_row = _snapshot(bh, c, NC, NS, PD)
    dyx = tl.zeros((L, L), dtype=tl.float32)
    rC = tl.zeros((L,), dtype=tl.float32)  # sum_p dy[t, p] (C_t S)[p]
    rB = tl.zeros((L,), dtype=tl.float32)  # sum_p x[t, p] (B_t dS)[p]
    sds = tl.zeros((BN,), dtype=tl.float32)  # sum_p S o dS, per row of the state
    for p0 in range(0, PD, BP):
        offs_p, tpm, smask, sp = _p_block(p0, BP, PD, tm, offs_n, nm)
        S, dS = _state_tiles(ST, DST, st_row, sp, smask, NS, PD)
        sds += tl.sum(S.to(tl.float32) * dS.to(tl.float32), 1)
        x = tl.load(_rows(X, b, t, h, sxb, sxt, sxh, offs_p), mask=tpm, other=0.0)
        dy = tl.load(DY + rows[:, None] * PD + offs_p[None, :], mask=tpm, other=0.0)
        BdS = tl.dot(Bc, dS.to(x.dtype))  # (L, BP): B_t . dS
        dx = tl.dot(tl.trans(M), dy, w[:, None] * BdS)
        tl.store(DX + rows[:, None] * PD + offs_p[None, :], dx.to(DX.dtype.element_ty), mask=tpm)
        rB += tl.sum(x.to(tl.float32) * BdS, 1)
        CS = tl.dot(Cc, S.to(x.dtype))  # (L, BP): C_t . S
        rC += tl.sum(dy.to(tl.float32) * CS, 1)
        dyx = tl.dot(dy, tl.trans(x), dyx)  # dy_t . x_s
    Ld = dyx * decay
    Gm = Ld * CB
    r = w * rB
    dcum = tl.sum(Gm, 1) - tl.sum(Gm, 0) + ec * rC - r
    dlast = el * tl.sum(sds, 0) + tl.sum(r, 0)
    # a_t enters cum_j for j >= t and cum_L: da_t = sum_{j >= t} dcum_j + dlast
    da = tl.sum(dcum, 0) - tl.cumsum(dcum, 0) + dcum + dlast
    tl.store(DA + rows, da, mask=tm)
    offs_s = tl.arange(0, L)
    tl.store(LD + (bh * NC + c).to(tl.int64) * L * L + offs_s[:, None] * L + offs_s[None, :],
             Ld.to(LD.dtype.element_ty))


@triton.jit
def _chunk_bwd_dbc_kernel(X, A, BM, CM, DY, ST, DST, SEG, LD, DB, DC, T, H, HPG, HPP, NS, PD, NC, NB, G,
                          sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg,
                          L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, DOCS: tl.constexpr):
    """``dB, dC`` of one chunk summed over ``HPP`` heads of one group (into split ``pid(1)`` of ``DB, DC (splits,
    B, T, G, N)``): ``dC_t = sum_h exp(cum_t) dy_t S^T + ((sum_h LD_h) B)_t``, ``dB_s = sum_h exp(cum_L - cum_s)
    x_s dS^T + ((sum_h LD_h)^T C)_s``, in fp32 registers (``B``, ``C`` are the group's: the ``LD`` tiles are summed
    over the heads first, two products per program instead of two per head). One flat loop over (head, block of
    ``P``), software-pipelined across heads; the ``LD`` tile is read at each head's first block."""
    hs = tl.program_id(1)
    c, b, g = _chunk_group(tl.program_id(0), NB, G)
    offs_s = tl.arange(0, L)
    t, tm = _span(c * L, L, T)
    offs_n, nm = _span(0, BN, NS)
    tnm = tm[:, None] & nm[None, :]
    Bc = tl.load(_rows(BM, b, t, g, sbb, sbt, sbg, offs_n), mask=tnm, other=0.0)
    Cc = tl.load(_rows(CM, b, t, g, scb, sct, scg, offs_n), mask=tnm, other=0.0)
    dB = tl.zeros((L, BN), dtype=tl.float32)
    dC = tl.zeros((L, BN), dtype=tl.float32)
    Lsum = tl.zeros((L, L), dtype=tl.float32)
    npb = tl.cdiv(PD, BP)
    for it in range(HPP * npb):
        j = it // npb
        p0 = (it % npb) * BP
        h = g * HPG + hs * HPP + j
        bh = b * H + h
        t, tm, decay, ec, w, el = _chunk_masks(A, SEG, b, h, c, T, sab, sat, sah, L, DOCS)
        rows = (b * T + t) * H + h
        st_row = _snapshot(bh, c, NC, NS, PD)
        offs_p, tpm, smask, sp = _p_block(p0, BP, PD, tm, offs_n, nm)
        x = tl.load(_rows(X, b, t, h, sxb, sxt, sxh, offs_p), mask=tpm, other=0.0)
        dy = tl.load(DY + rows[:, None] * PD + offs_p[None, :], mask=tpm, other=0.0)
        S, dS = _state_tiles(ST, DST, st_row, sp, smask, NS, PD)
        dC = tl.dot((dy.to(tl.float32) * ec[:, None]).to(x.dtype), tl.trans(S.to(x.dtype)), dC)
        dB = tl.dot((x.to(tl.float32) * w[:, None]).to(x.dtype), tl.trans(dS.to(x.dtype)), dB)
        Ld = tl.load(LD + (bh * NC + c).to(tl.int64) * L * L + offs_s[:, None] * L + offs_s[None, :],
                     mask=(offs_s[:, None] + p0 * L < L) & (offs_s[None, :] < L), other=0.0)  # p0 == 0
        Lsum += Ld.to(tl.float32)
    Lsum_lp = Lsum.to(Bc.dtype)
    dC = tl.dot(Lsum_lp, Bc, dC)
    dB = tl.dot(tl.trans(Lsum_lp), Cc, dB)
    out = (((hs * NB + b) * T + t[:, None]) * G + g) * NS + offs_n[None, :]
    tl.store(DB + out, dB.to(DB.dtype.element_ty), mask=tnm)
    tl.store(DC + out, dC.to(DC.dtype.element_ty), mask=tnm)


def _blocks(N: int, P: int, block_p: Optional[int] = None) -> Tuple[int, int]:
    """``(BN, BP)``: d_state padded to a power of two (one tile), and the block of ``P`` per tile: ``block_p`` if
    given, else ``P`` padded to a power of two, at most 64."""
    return _pow2(N), (block_p if block_p is not None else min(_pow2(P), 64))


def _warps(L: int, BN: int) -> int:
    """Warps per program of the chunk kernels: 2 at ``L * BN = 4096`` (chunk 64, d_state 64), 8 above, 4 below.
    Triton 3.6 on sm_90 compiles ``_chunk_out_kernel`` at (L, BN, BP) = (64, 64, <= 32) into an out-of-range
    shared-memory read (an illegal address on the H200: d_state 64 with headdim 16 / 32, Mamba-2's model config):
    at 4 warps (2026-12-04, third session) and, on the H200 of 2026-12-04's fifth session, also at 8 and 16 warps
    (compute-sanitizer: the (L, L) broadcast of the chunk's cumulative decay, ``_chunk_masks``); 2 warps ran the
    scan tests and the Mamba-2 mixer tests clean there (``results/h200/2026-12-04e/ssdfix/``)."""
    if L * BN == 4096:
        return 2
    return 8 if L * BN > 4096 else 4


def _bwd_stages(L: int, BN: int, state_bytes: int) -> int:
    """``num_stages`` of the two backward kernels (see :data:`_BWD_PIPELINE_MAX`)."""
    return 2 if state_bytes == 2 and L * BN <= _BWD_PIPELINE_MAX else 1


def _heads_per_program(programs: int, hpg: int, target: Optional[int] = None) -> int:
    """Heads of one group per program of the ``dB``/``dC`` kernel (and of the ``out_mode="group"`` output kernel):
    all ``hpg`` (``dB``/``dC`` summed in registers) unless fewer than ``target`` (default
    :data:`_BWD_TARGET_PROGRAMS`) programs would run; then the group is split into the fewest equal parts that reach
    it (their fp32 partial ``dB``/``dC`` summed after). ``programs``: chunks x batch x groups (x P-blocks)."""
    target = _BWD_TARGET_PROGRAMS if target is None else target
    for split in range(1, hpg + 1):
        if hpg % split == 0 and programs * split >= target:
            return hpg // split
    return 1


def _seq_blocks(N: int, P: int, seq_block: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """``(SBN, SBP)`` of the sequential pass: ``seq_block`` (or :data:`_SEQ_BLOCK`), each clipped to the padded
    ``N`` / ``P``."""
    bn, bp = seq_block if seq_block is not None else _SEQ_BLOCK
    return min(bn, _pow2(N)), min(bp, _pow2(P))


def _strides(*tensors: torch.Tensor) -> Tuple[int, ...]:
    """The batch, time and head (or group) strides of each ``(B, T, H or G, ...)`` tensor in turn: the kernels'
    ``s?b, s?t, s?h`` arguments."""
    return tuple(st for ten in tensors for st in ten.stride()[:3])


def _states(Z, V, a, seg, out, el, init, fin, G, L, BN, BP, sequential: bool, sblk, reverse: bool) -> None:
    """The snapshots ``out (BH, NC + 1, N, P)`` from ``init (BH, N, P)`` fp32 (or None) to ``fin`` fp32. Forward
    (``Z = B``, ``V = x``): the state entering every chunk, the final state, and the chunk decays ``el (BH, NC)``;
    reverse (``Z = C``, ``V = dy``, ``el`` read): the gradient of the state leaving every chunk, the initial
    state's. ``sequential``: :func:`_state_seq_kernel` in ``(SBN, SBP) = sblk`` blocks; else
    :func:`_chunk_state_kernel` then :func:`_state_pass_kernel`. ``seg``: the document index ``(B, T)`` or None."""
    Bsz, T, H = V.shape[0], V.shape[1], V.shape[2]
    BH, NC, N, P = out.shape[0], out.shape[1] - 1, out.shape[2], out.shape[3]
    segp = seg if seg is not None else a  # stands in for the absent document index (never read)
    if sequential:
        SBN, SBP = sblk
        grid = (Bsz * H, triton.cdiv(N, SBN), triton.cdiv(P, SBP))
        _state_seq_kernel[grid](Z, V, a, segp, out, el, init if init is not None else fin, fin, T, H, H // G, N, P,
                                NC, *_strides(Z, V, a), L=L, SBN=SBN, SBP=SBP, REVERSE=reverse,
                                HAS_INIT=init is not None, DOCS=seg is not None,
                                num_warps=4 if SBN * SBP <= 4096 else 8)
        return
    _chunk_state_kernel[(NC * BH, triton.cdiv(P, BP))](Z, V, a, segp, out, el, T, H, H // G, N, P, NC, BH,
                                                       *_strides(Z, V, a), L=L, BN=BN, BP=BP, WRITE=not reverse,
                                                       DOCS=seg is not None, num_warps=_warps(L, BN))
    _state_pass(out, el, init, fin, reverse=reverse)


def _state_pass(buf: torch.Tensor, el: torch.Tensor, init: Optional[torch.Tensor], fin: torch.Tensor,
                reverse: bool) -> None:
    """Launch :func:`_state_pass_kernel` over ``buf (BH, NC + 1, N, P)`` from ``init (BH, N, P)`` fp32 (or None)
    to ``fin (BH, N, P)`` fp32."""
    BH, K, NS, PD = buf.shape
    NE = NS * PD
    _state_pass_kernel[(triton.cdiv(NE, _PASS_BLOCK), BH)](buf, el, init if init is not None else fin, fin, K - 1,
                                                          NE, HAS_INIT=init is not None, REVERSE=reverse,
                                                          UNR=_PASS_UNROLL, BLK=_PASS_BLOCK, num_warps=4)


def _use_sequential(state_pass: str, Bsz: int, H: int, sblk: Tuple[int, int], N: int, P: int) -> bool:
    """``state_pass="auto"``: the sequential pass when it runs at least :data:`_SEQ_MIN_PROGRAMS` programs
    (``B * H * ceil(N / SBN) * ceil(P / SBP)``), else the parallel one (few long walks leave the GPU idle)."""
    if state_pass != "auto":
        return state_pass == "sequential"
    return Bsz * H * triton.cdiv(N, sblk[0]) * triton.cdiv(P, sblk[1]) >= _SEQ_MIN_PROGRAMS


class _SSDScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, Bm, Cm, initial_state, chunk_size, block_p, seg, sequential, sblk, sdt, out_bk,
                out_group):
        Bsz, T, H, P = x.shape
        G, N = Bm.shape[2], Bm.shape[3]
        L = chunk_size
        BN, BP = _blocks(N, P, block_p)
        nP = triton.cdiv(P, BP)
        NC = triton.cdiv(T, L)
        BH = Bsz * H
        x = x.contiguous() if x.stride(-1) != 1 else x
        Bm = Bm.contiguous() if Bm.stride(-1) != 1 else Bm
        Cm = Cm.contiguous() if Cm.stride(-1) != 1 else Cm
        # states[bh, c]: the state entering chunk c, in the snapshot dtype sdt (the carry between chunks is fp32);
        # final: the state after the last chunk, fp32
        states = torch.empty(BH, NC + 1, N, P, device=x.device, dtype=sdt)
        final = torch.empty(Bsz, H, N, P, device=x.device, dtype=torch.float32)
        s0 = initial_state.reshape(BH, N, P).float().contiguous() if initial_state is not None else None
        el = torch.empty(BH, NC, device=x.device, dtype=torch.float32)
        _states(Bm, x, a, seg, states, el, s0, final, G, L, BN, BP, sequential, sblk, reverse=False)
        y = torch.empty_like(x)
        strides = _strides(x, a, Bm, Cm, y)
        common = dict(L=L, BN=BN, BP=BP, DOCS=seg is not None, num_warps=_warps(L, BN),
                      num_stages=_OUT_STAGES[x.element_size()])
        segp = seg if seg is not None else a  # stands in for the absent document index (never read)
        if out_group:
            hpp = _heads_per_program(NC * Bsz * G * nP, H // G, _OUT_TARGET_PROGRAMS)
            _chunk_out_group_kernel[(NC * Bsz * G, nP, (H // G) // hpp)](
                x, a, Bm, Cm, states, segp, y, T, H, H // G, hpp, N, P, NC, Bsz, G, *strides, **common)
        else:
            _chunk_out_kernel[(NC * BH, nP)](x, a, Bm, Cm, states, segp, y, T, H, H // G, N, P, NC, BH, *strides,
                                             BK=min(out_bk, BN), **common)
        if any(ctx.needs_input_grad[:5]):
            ctx.save_for_backward(x, a, Bm, Cm, states, el)
        ctx.chunk_size, ctx.block_p, ctx.seg = chunk_size, block_p, seg
        ctx.sequential, ctx.sblk = sequential, sblk
        ctx.has_s0 = initial_state is not None
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, a, Bm, Cm, states, el = ctx.saved_tensors
        Bsz, T, H, P = x.shape
        G, N = Bm.shape[2], Bm.shape[3]
        L = ctx.chunk_size
        BN, BP = _blocks(N, P, ctx.block_p)
        nP = triton.cdiv(P, BP)
        NC = triton.cdiv(T, L)
        BH = Bsz * H
        segp = ctx.seg if ctx.seg is not None else a  # stands in for the absent document index (never read)
        if dy is None:
            dy = torch.zeros_like(x)
        dy = dy.to(x.dtype).contiguous()
        # dstates[bh, c]: the gradient of the state entering chunk c (snapshot dtype, fp32 carry); ds0: the initial
        # state's (fp32), from the final state's gradient dfinal (fp32)
        dstates = torch.empty_like(states)
        ds0 = torch.empty(Bsz, H, N, P, device=x.device, dtype=torch.float32)
        dS1 = dfinal.reshape(BH, N, P).float().contiguous() if dfinal is not None else None
        _states(Cm, dy, a, ctx.seg, dstates, el, dS1, ds0, G, L, BN, BP, ctx.sequential, ctx.sblk, reverse=True)
        hpg = H // G
        hpp = _heads_per_program(NC * Bsz * G, hpg)
        splits = hpg // hpp
        dx = torch.empty(Bsz, T, H, P, device=x.device, dtype=x.dtype)
        da = torch.empty(Bsz, T, H, device=x.device, dtype=torch.float32)
        pdt = Bm.dtype if splits == 1 else torch.float32
        dB = torch.empty(splits, Bsz, T, G, N, device=x.device, dtype=pdt)
        dC = torch.empty(splits, Bsz, T, G, N, device=x.device, dtype=pdt)
        ld = torch.empty(BH, NC, L, L, device=x.device, dtype=x.dtype)
        strides = _strides(x, a, Bm, Cm)
        common = dict(L=L, BN=BN, BP=min(BP, _BWD_BLOCK_P), DOCS=ctx.seg is not None, num_warps=_warps(L, BN),
                      num_stages=_bwd_stages(L, BN, states.element_size()))
        _chunk_bwd_dx_kernel[(NC * BH,)](x, a, Bm, Cm, dy, states, dstates, segp, dx, da, ld, T, H, hpg, N, P, NC, BH,
                                         *strides, **common)
        _chunk_bwd_dbc_kernel[(NC * Bsz * G, splits)](x, a, Bm, Cm, dy, states, dstates, segp, ld, dB, dC, T, H, hpg,
                                                     hpp, N, P, NC, Bsz, G, *strides, **common)
        dB = dB[0] if splits == 1 else dB.sum(0).to(Bm.dtype)
        dC = dC[0] if splits == 1 else dC.sum(0).to(Cm.dtype)
        return (dx, da.to(a.dtype), dB, dC, ds0 if ctx.has_s0 else None) + (None,) * 8


def ssd_scan(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             initial_state: Optional[torch.Tensor] = None, chunk_size: int = 64,
             block_p: Optional[int] = None, doc_ids: Optional[torch.Tensor] = None, state_pass: str = "auto",
             seq_block: Optional[Tuple[int, int]] = None, state_dtype: Optional[torch.dtype] = None,
             out_block_n: Optional[int] = None, out_mode: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan ``S_t = exp(a_t) S_{t-1} + B_t x_t^T``, ``y_t = S_t^T C_t`` in the chunked Triton kernels
    (chunk-parallel, Dao & Gu 2024 section 6; see the module docstring).

    Args:
        x: ``(B, T, H, P)`` float16 / bfloat16 / float32 (Mamba-2 passes ``x * dt``).
        a: ``(B, T, H)`` float32 log-decay, ``<= 0`` (Mamba-2: ``dt * A``).
        B, C: ``(B, T, G, N)`` in ``x.dtype``; ``G`` divides ``H`` (head ``h`` reads group ``h // (H // G)``).
        initial_state: optional ``(B, H, N, P)`` state before position 0 (fp32; differentiable).
        chunk_size: power of two in [16, 128].
        block_p: columns of ``P`` per tile (16, 32 or 64); None: ``P`` padded to a power of two, at most 64.
        doc_ids: optional int ``(B, T)``, nondecreasing: the state restarts at each document start after
            position 0 (the decay product across a boundary is zero; ``initial_state`` belongs to the document at
            position 0), boundaries anywhere inside a chunk.
        state_pass: how the states entering the chunks (and, in the backward, their gradients) are computed, one of
            :data:`STATE_PASSES`. ``"parallel"``: ``_chunk_state_kernel`` (chunk-parallel) writes every chunk's own
            contribution, then ``_state_pass_kernel`` reads and rewrites them (an associative pass over chunks).
            ``"sequential"``: ``_state_seq_kernel`` fuses the two, one program per ``(b, h)``, block of ``N`` and
            block of ``P`` walking the chunks in order (reversed in the backward) and writing each state once
            (fewer programs: ``B * H * ceil(N / 64) * ceil(P / 64)`` by default). ``"auto"``: ``"sequential"``
            when it runs at least :data:`_SEQ_MIN_PROGRAMS` (64) programs (e.g. ``B * H >= 32`` at d_state 128,
            head dim 64), else ``"parallel"``: on the H200 (H 16, 32k tokens a call) the sequential pass won at
            N 2k / 8k / 16k and lost at 32k (docs/results.md, 2026-12-04 third session). The forward and the backward use the same mode; the results agree to rounding.
        seq_block: ``(N-block, P-block)`` of the sequential pass, each in :data:`SEQ_BLOCKS` (clipped to ``N`` /
            ``P`` padded to a power of two); None: ``(64, 64)``. Ignored by the parallel pass.
        state_dtype: dtype of the stored snapshots of the state entering every chunk (and of its gradient in the
            backward), one of :data:`SNAPSHOT_DTYPES`; None: ``x.dtype``. The matrix products read the snapshots
            in ``x.dtype`` anyway; the state carried from chunk to chunk is fp32 either way, and so are the
            final state and the initial state's gradient. With bf16 / fp16 snapshots the parallel pass also
            stores each chunk's own contribution rounded to that dtype before adding it to the fp32 carry.
            ``torch.float32``: twice the bytes, the rounding only where the products read them.
        out_block_n: d_state columns per step of the output kernel's loop (one of :data:`OUT_BLOCKS`, clipped to
            d_state padded to a power of two); None: 64. Used by ``out_mode="head"``.
        out_mode: how the output kernel is laid out, one of :data:`OUT_MODES`. ``"head"``: one program per chunk,
            ``(b, h)`` and block of ``P`` (a loop over d_state); ``"group"``: one program per chunk, ``(b,
            group)``, block of ``P`` and split of the group's heads (about 1024 programs), ``B``, ``C`` and ``C
            B^T`` read / computed once for the heads sharing them, then a loop over those heads. ``"auto"``:
            ``"head"`` (faster on the H200 at N 2k: 1.98 / 1.24 ms against the group kernel's 2.04 / 1.30 with the
            parallel / sequential pass, ``python -m eval.bench_ssd --out-group``).

    Returns:
        ``y (B, T, H, P)`` in ``x.dtype`` and the final state ``(B, H, N, P)`` float32.
        Differentiable in ``x, a, B, C`` and ``initial_state`` (the final state's gradient is used if given).
        Memory: the states entering every chunk, ``B * H * (T / chunk_size + 1) * N * P`` elements of
        ``state_dtype``, are kept for the backward (and as much again during it).

    Raises:
        ValueError / TypeError naming the argument (shapes, dtypes, devices, sizes above :data:`MAX_DIM`).
    """
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not supported; allowed values: {', '.join(map(str, CHUNK_SIZES))}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (B, T, H, P), got shape {tuple(x.shape)}")
    Bsz, T, H, P = x.shape
    if a.shape != (Bsz, T, H):
        raise ValueError(f"a must have shape (B, T, H)={(Bsz, T, H)}, got {tuple(a.shape)}")
    if B.dim() != 4 or B.shape[:2] != (Bsz, T) or C.shape != B.shape:
        raise ValueError(f"B and C must have one shape (B, T, G, N) with (B, T)={(Bsz, T)}, got B={tuple(B.shape)}, "
                         f"C={tuple(C.shape)}")
    G, N = B.shape[2], B.shape[3]
    if G < 1 or H % G:
        raise ValueError(f"the number of groups G={G} (B.shape[2]) must divide H={H} (x.shape[2])")
    if N > MAX_DIM or P > MAX_DIM or min(N, P, T) < 1:
        raise ValueError(f"d_state N={N} and head dim P={P} must be in [1, {MAX_DIM}], T={T} >= 1")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x.dtype={x.dtype} is not supported; allowed values: float16, bfloat16, float32")
    if B.dtype != x.dtype or C.dtype != x.dtype:
        raise TypeError(f"B and C must have x's dtype {x.dtype}, got B={B.dtype}, C={C.dtype}")
    if initial_state is not None and initial_state.shape != (Bsz, H, N, P):
        raise ValueError(f"initial_state must have shape (B, H, N, P)={(Bsz, H, N, P)}, got {tuple(initial_state.shape)}")
    if block_p is not None and block_p not in (16, 32, 64):
        raise ValueError(f"block_p={block_p!r} is not supported; allowed values: None, 16, 32, 64")
    if state_pass not in STATE_PASSES:
        raise ValueError(f"state_pass={state_pass!r} is not supported; allowed values: {', '.join(STATE_PASSES)}")
    if seq_block is not None and (len(tuple(seq_block)) != 2 or any(s not in SEQ_BLOCKS for s in seq_block)):
        raise ValueError(f"seq_block={seq_block!r} is not supported; allowed values: None or (N-block, P-block), "
                         f"each one of {', '.join(map(str, SEQ_BLOCKS))}")
    if state_dtype is not None and state_dtype not in SNAPSHOT_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is not supported; allowed values: None, "
                         f"{', '.join(map(str, SNAPSHOT_DTYPES))}")
    if out_block_n is not None and out_block_n not in OUT_BLOCKS:
        raise ValueError(f"out_block_n={out_block_n!r} is not supported; allowed values: None, "
                         f"{', '.join(map(str, OUT_BLOCKS))}")
    if out_mode not in OUT_MODES:
        raise ValueError(f"out_mode={out_mode!r} is not supported; allowed values: {', '.join(OUT_MODES)}")
    sblk = _seq_blocks(N, P, tuple(seq_block) if seq_block is not None else None)
    sequential = _use_sequential(state_pass, Bsz, H, sblk, N, P)
    seg = None
    if doc_ids is not None:
        if tuple(doc_ids.shape) != (Bsz, T) or doc_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"doc_ids must be int32 / int64 of shape (B, T)={(Bsz, T)}, got {doc_ids.dtype} "
                             f"{tuple(doc_ids.shape)}")
        d = doc_ids.long()
        st = torch.ones_like(d, dtype=torch.int32)
        st[:, 1:] = (d[:, 1:] != d[:, :-1]).to(torch.int32)
        seg = st.cumsum(1, dtype=torch.int32).contiguous()  # 1-based document index per position
    if x.dtype == torch.bfloat16 and _interpreting():  # the CPU interpreter's bf16 tl.dot is wrong (triton 3.9): the
        # scan in fp32, y back in bf16 (autograd casts the gradients)
        y, state = ssd_scan(x.float(), a, B.float(), C.float(), initial_state, chunk_size, block_p, doc_ids,
                            state_pass, seq_block, state_dtype, out_block_n, out_mode)
        return y.to(x.dtype), state
    return _SSDScan.apply(x, a.float(), B, C, initial_state, chunk_size, block_p, seg, sequential, sblk,
                          state_dtype if state_dtype is not None else x.dtype,
                          out_block_n if out_block_n is not None else _OUT_BLOCK_N, out_mode == "group")
