"""Causal Taylor-map (Based) linear attention, fused and chunked in Triton: no feature vectors in HBM.

The Taylor map of :mod:`attn_zoo.feature_maps` gives ``w_ij = phi(q_i) . phi(k_j) = 1 + s + s^2 / 2``,
``s = sigma q_i . k_j``, ``sigma = 1 / sqrt(D)``, and the output of
:func:`attn_zoo.reference.linear_attention_reference`

    o_i = n_i / d_i,   n_i = sum_{j <= i} w_ij v_j,   d_i = sum_{j <= i} w_ij + eps.

Split the keys into chunks of ``C`` tokens. For the keys of earlier chunks, ``w`` expands by order in ``q``:

    sum_j w_ij v_j = S0 + sigma q_i S1 + sigma^2 / 2 (q_i (x) q_i) S2,
    S0 = sum_j v_j (Dv),  S1 = sum_j k_j^T v_j (D x Dv),  S2 = sum_j (k_j (x) k_j)^T v_j (D^2 x Dv);
    sum_j w_ij = z0 + sigma q_i . z1 + sigma^2 / 2 q_i Z2 q_i^T,
    z0 = #keys,  z1 = sum_j k_j (D),  Z2 = sum_j k_j^T k_j (D x D)

(``(x)``: the outer product flattened, ``D^2`` entries; the full square, not the 136 symmetric ones). The keys of
the query's own chunk take the masked quadratic form of :mod:`kernels.taylor`. One program per (Dv block,
batch x head) walks the chunks in order with the state in registers (like fla's ``fused_chunk`` kernels), so nothing
but ``q, k, v, o`` and the fp32 row normaliser ``d`` (saved for the backward) touches HBM.

Backward (``u_i = do_i / d_i``, ``c_i = -do_i . o_i / d_i``, ``dw_ij = u_i . v_j + c_i``,
``ds_ij = dw_ij (1 + s_ij)``):

    dq_i = sigma sum_{j <= i} ds_ij k_j,   dk_j = sigma sum_{i >= j} ds_ij q_i,   dv_j = sum_{i >= j} w_ij u_i.

``dq`` is a forward scan over the same key state (the earlier chunks' part is
``sigma (u_i S1^T + c_i z1) + sigma^2 (R(u_i S2^T, q_i) + c_i q_i Z2)``, ``R(T, x)_a = sum_b T_(a,b) x_b``);
``dk`` / ``dv`` a reverse scan over the mirror-image query state ``dS0 = sum_i u_i``, ``dS1 = sum_i q_i^T u_i``,
``dS2 = sum_i (q_i (x) q_i)^T u_i``, ``e1 = sum_i c_i q_i``, ``E2 = sum_i c_i q_i^T q_i`` of the later chunks:

    dv_j = dS0 + sigma k_j dS1 + sigma^2 / 2 (k_j (x) k_j) dS2 + (own chunk),
    dk_j = sigma (v_j dS1^T + e1) + sigma^2 (R(v_j dS2^T, k_j) + k_j E2) + (own chunk).

Both scans run in one launch by default (grid axis 2: 0 = ``dq``, 1 = ``dk, dv``). With the value dimension split
into blocks of ``block_v`` columns, ``dq`` and ``dk`` are sums over the blocks: each block writes an fp32 partial
and the host adds them (deterministic; the ``c`` terms, which do not depend on the block, come from block 0 only).

Segments (``TaylorChunkConfig.segments``; automatic while ``B * H * ceil(Dv / block_v)`` programs leave the GPU
short): the sequence splits into ``NS`` segments of ``L`` tokens (a multiple of ``C``) and grid axis 2 runs one scan
per segment. A state-sum kernel (:func:`_taylor_seg_sums`) first writes each segment's key sums ``S0, S1, S2, z1,
Z2`` (segments ``0 .. NS - 2``) into slots ``1 .. NS - 1`` of one fp32 buffer ``(NS, B * H, ...)`` (slot 0 zeros),
one in-place ``cumsum`` over the slots makes the exclusive prefix, and the forward and ``dq`` scans of segment ``s``
start from the sum over segments ``< s`` (the ``z0`` term is the absolute position already). The ``dk, dv`` scan
starts from the exclusive suffix of the query sums ``dS0, dS1, dS2, e1, E2`` of segments ``1 .. NS - 1`` (a second
state-sum launch in the backward, slots in reverse order so that the same forward ``cumsum`` gives the suffix). Four
host operations per side in all (the 2026-12-04 code took five tensors and ~15 / ~30 host operations for the prefix
/ suffix, which at 16k tokens are a large part of the call's host time). Exact in
exact arithmetic; in floating point only the order of the state sums changes. ``NS = 1`` runs none of this (the
scans take their constexpr ``HAS_SS = False`` build, the whole sequence from a zero state).

Sizes at ``D = 16``, ``Dv = 64``, ``C = 64`` (per program, fp32 state, value block ``BV``): ``S2`` is
``256 x BV`` (64 KiB at ``BV = 64``, 16 KiB at ``BV = 16``), ``S1`` ``16 x BV``, ``Z2`` ``16 x 16``; the chunk's
``q (x) q`` tile is ``64 x 256`` (32 KiB in bf16). Per chunk and ``Dv`` column block the forward does two
``64 x 256 x BV`` products (read ``S2``, update ``S2``) plus ``64 x 64 x (16 + BV)`` for the own chunk; the
backward five ``64 x 256 x BV`` products per scan pair (``dq``: read; ``dk, dv``: two reads, one update; plus the
key-state update of the ``dq`` scan). Registers, not FLOPs, bound it: every ``C x 256`` tile costs ``C * 256 /
threads`` registers per thread, and the ``K = 256`` contractions with small ``M`` / ``N`` replicate operands across
warps, so ptxas (sm_90a) reports 230-255 registers for every setting tried (:class:`TaylorChunkConfig`).

Inputs ``(B, H, N, D)`` float16 / bfloat16 / float32, ``D <= 16``, ``Dv <= 256``; float16 runs in float32
(``w`` grows like ``s^2``). Causal only, ``Nq = Nk``, no packed documents; GQA by repeating K/V heads (PyTorch,
gradients summed by autograd).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._host import _interpreting, cdiv, launch
from .taylor import check_qkv

__all__ = ["taylor_chunk", "taylor_chunk_torch", "TaylorChunkConfig", "MAX_D", "MAX_DV", "CHUNK_SIZES"]

MAX_D = 16
"""Largest qk head dimension: the ``D^2 x BV`` second-order state lives in registers."""
MAX_DV = 256
"""Largest value head dimension (split into ``block_v`` columns per program)."""
CHUNK_SIZES = (16, 32, 64, 128)
BLOCK_VS = (16, 32, 64)
MIN_PROGRAMS = 128
"""Programs (``B * H * ceil(Dv / block_v)``) below which the default ``block_v`` halves to 16 and, if still short,
the default ``segments`` splits the sequence: each program scans a whole segment, so the grid is all the
parallelism there is (H200: 132 SMs)."""
MAX_SEGMENTS = 4096
"""Largest ``segments`` (grid axis 2 holds ``2 * segments`` backward programs)."""
MIN_SEG_CHUNKS = 32
"""The automatic split keeps segments of at least this many chunks (each segment costs an extra state-sum pass
over its tokens, a state load and host work)."""
AUTO_SPLIT_MIN_CHUNKS = 128
"""The automatic split leaves sequences of fewer chunks whole (H200, chunk 64: 16k / 8k tokens split 8 / 4 ways ran
1.9x / 1.2x faster than whole; 4k with B 1 ran 1.6-2x slower split 4 or 8 ways)."""


def _max_auto_segments(n_chunks: int) -> int:
    """The most segments the automatic split makes of ``n_chunks`` chunks: one per :data:`MIN_SEG_CHUNKS`, and none
    (1) below :data:`AUTO_SPLIT_MIN_CHUNKS`."""
    return n_chunks // MIN_SEG_CHUNKS if n_chunks >= AUTO_SPLIT_MIN_CHUNKS else 1


def _int(x) -> bool:
    """An int that is not a bool (``True == 1`` and ``64.0 == 64`` would pass a membership test)."""
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class TaylorChunkConfig:
    """Launch settings of :func:`taylor_chunk` (none changes the result beyond rounding).

    chunk: tokens per chunk ``C`` (one of :data:`CHUNK_SIZES`).
    block_v: value columns per program (one of :data:`BLOCK_VS`; ``None``: :meth:`resolve_block_v`, 32 when that
        with the segments the split may use gives :data:`MIN_PROGRAMS` programs, else 16).
    num_warps / num_stages: Triton launch options of every kernel.
    bwd_fused: the ``dq`` scan and the ``dk, dv`` scan in one launch (grid axis 2) instead of two.
    segments: split the sequence into this many segments of ``L`` tokens (a multiple of ``chunk``; fewer segments
        when ``N`` has fewer chunks), one program per (value block, batch x head, segment), each starting from the
        sum of the earlier segments' key states (forward, ``dq``) or the later segments' query states (``dk, dv``),
        which a state-sum pass per segment computes first. An int in ``[1, MAX_SEGMENTS]``; ``None``:
        :meth:`resolve_segments` (1 while ``B * H * ceil(Dv / block_v) >= MIN_PROGRAMS``, else about ``2 * SMs``
        programs).

    The defaults are timed on the H200 (2026-12-04, ``results/h200/2026-12-04h/a8/tc_sweep.json``, D 16, Dv 64,
    H 16, B * N = 16k, bf16, forward+backward; ``python -m lab.taylor_chunk_sweep``): chunk 64 with 4 warps was the
    fastest at every N (8 warps 1.1-1.8x slower, chunk 32 1.3-1.8x slower); block_v 32 was faster while it left
    >= 128 programs (N 1k: 1.32 against 1.75 ms; 4k: 1.56 against 1.75), 16 once there were too few (16k, B 1:
    3.44 against 4.84 ms, 64 against 32 programs on 132 SMs). Segments (``results/h200/2026-12-04i/s1``, ``s2``):
    16k with B 1 runs block_v 32 in 8 segments (256 programs) in 1.73-1.76 ms against 3.38-3.45 ms unsplit at
    block_v 16 and 2.36-2.40 ms at block_v 16 in 4 segments; 8k with B 2: 1.82 ms (4 segments) against 2.17 ms;
    4k with B 4 (128 programs) stays whole (1.54 ms; 2 segments 2.02 ms), and so does 4k with B 1 (64 chunks:
    0.88 ms at block_v 16 whole, 1.44 ms in 4 segments).
    """

    chunk: int = 64
    block_v: Optional[int] = None
    num_warps: int = 4
    num_stages: int = 1
    bwd_fused: bool = True
    segments: Optional[int] = None

    def __post_init__(self):
        if not _int(self.chunk) or self.chunk not in CHUNK_SIZES:  # 64.0 == 64, but no launch takes a float
            raise ValueError(f"chunk={self.chunk!r} must be one of {CHUNK_SIZES}")
        if self.block_v is not None and (not _int(self.block_v) or self.block_v not in BLOCK_VS):
            raise ValueError(f"block_v={self.block_v!r} must be None or one of {BLOCK_VS}")
        if not _int(self.num_warps) or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps={self.num_warps!r} must be one of 1, 2, 4, 8, 16")
        if not _int(self.num_stages) or not 1 <= self.num_stages <= 6:
            raise ValueError(f"num_stages={self.num_stages!r} must be an int in [1, 6]")
        if not isinstance(self.bwd_fused, bool):
            raise ValueError(f"bwd_fused={self.bwd_fused!r} must be a bool")
        if self.segments is not None and (isinstance(self.segments, bool) or not isinstance(self.segments, int)
                                          or not 1 <= self.segments <= MAX_SEGMENTS):
            raise ValueError(f"segments={self.segments!r} must be None (automatic) or an int in [1, {MAX_SEGMENTS}]")

    def resolve_block_v(self, bh: int, dv: int, n: int = 0) -> int:
        """The value block for ``B * H = bh`` sequences of ``n`` tokens and ``dv`` value columns: ``block_v`` if
        set, else 32 when ``bh * ceil(dv / 32)`` programs times the most segments the split may use (``segments``
        if set, else the automatic split's limit of one per :data:`MIN_SEG_CHUNKS` chunks) reach :data:`MIN_PROGRAMS` (the wider block is the
        faster one whenever segments can fill the GPU), else 16 (twice the programs)."""
        if self.block_v is not None:
            return self.block_v
        ns_max = self.segments if self.segments is not None else _max_auto_segments(cdiv(n, self.chunk))
        return 32 if bh * cdiv(dv, 32) * ns_max >= MIN_PROGRAMS else 16

    def resolve_segments(self, bh: int, dv: int, n: int, sms: int = 132) -> "tuple[int, int]":
        """``(NS, L)``: the segment count and length (tokens, a multiple of ``chunk``; ``NS = ceil(n / L)``) for
        ``B * H = bh`` sequences of ``n`` tokens and ``dv`` value columns on ``sms`` SMs. ``segments`` if set
        (``L = chunk * ceil(n / (segments * chunk))``, so ``NS <= segments``); else 1 while the programs of one
        segment, ``P = bh * ceil(dv / block_v)``, reach :data:`MIN_PROGRAMS`, otherwise ``2 * sms // P`` (about two
        programs per SM: one program takes ~255 registers x 4 warps, half an H200 SM), at most one per
        :data:`MIN_SEG_CHUNKS` chunks (none below :data:`AUTO_SPLIT_MIN_CHUNKS`). ``n = 0``: ``(1, chunk)``."""
        C = self.chunk
        n_chunks = max(1, cdiv(n, C))
        if self.segments is not None:
            ns = self.segments
        else:
            progs = bh * cdiv(dv, self.resolve_block_v(bh, dv, n))
            ns = 1 if progs >= MIN_PROGRAMS else max(1, min((2 * sms) // max(progs, 1),
                                                             _max_auto_segments(n_chunks)))
        L = C * cdiv(n_chunks, min(ns, n_chunks))
        return cdiv(n_chunks, L // C), L


# ---------------------------------------------------------------------------------------------------- kernels
@triton.jit
def _dot(a, b, PREC: tl.constexpr, UP: tl.constexpr):
    """tl.dot with fp32 accumulation; UP: upcast first (the CPU interpreter's bfloat16 dot is wrong in some Triton
    versions; bfloat16 values are exact in float32)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _outer(x, BT: tl.constexpr, BD: tl.constexpr):
    """``(BT, BD) -> (BT, BD * BD)`` in ``x.dtype``: each row's outer product with itself, flattened (entry
    ``a * BD + b``); the products in fp32, rounded once (the CPU interpreter's bfloat16 arithmetic is wrong)."""
    xf = x.to(tl.float32)
    return tl.reshape((xf[:, :, None] * xf[:, None, :]).to(x.dtype), (BT, BD * BD))


@triton.jit
def _contract(t, x, BT: tl.constexpr, BD: tl.constexpr):
    """``R(t, x)_a = sum_b t[:, a * BD + b] x[:, b]`` for ``t (BT, BD * BD)`` and ``x (BT, BD)`` (fp32)."""
    t3 = tl.reshape(t, (BT, BD, BD))
    return tl.sum(t3 * x.to(tl.float32)[:, None, :], 2)


@triton.jit
def _load(base, rows, cols, stride, n_rows, n_cols):
    """``(len(rows), len(cols))`` tile of a row-major matrix (row stride ``stride``); zeros outside."""
    return tl.load(base + rows[:, None] * stride + cols[None, :],
                   mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _load_uc(DOb, DEN, DELTA, bh, rows, ov, sd_n, N, cmul, HEAD_DV: tl.constexpr):
    """A chunk's ``u = do / d`` ``(BT, BV)`` in ``do``'s dtype (the inputs') and ``c = -do . o / d`` ``(BT,)``
    fp32 (times ``cmul``: the ``c`` terms come from value block 0 only); zeros on rows ``>= N``."""
    rm = rows < N
    do = _load(DOb, rows, ov, sd_n, N, HEAD_DV)
    rden = 1.0 / tl.load(DEN + bh * N + rows, mask=rm, other=1.0)
    c = -tl.load(DELTA + bh * N + rows, mask=rm, other=0.0) * rden * cmul
    u = (do.to(tl.float32) * rden[:, None]).to(do.dtype)
    return u, c


@triton.jit
def _bwd_chunk(Qb, Kb, Vb, DOb, DEN, DELTA, bh, rows, od, ov, sq_n, sk_n, sv_n, sd_n, N, cmul,
               HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr):
    """The backward scans' per-chunk inputs: ``q, k (BT, BD)``, ``v, u (BT, BV)`` in the input dtype, ``c (BT,)``
    fp32 (:func:`_load_uc`), the row mask ``rows < N``; padded rows and columns are zeros."""
    q = _load(Qb, rows, od, sq_n, N, HEAD_D)
    k = _load(Kb, rows, od, sk_n, N, HEAD_D)
    v = _load(Vb, rows, ov, sv_n, N, HEAD_DV)
    u, c = _load_uc(DOb, DEN, DELTA, bh, rows, ov, sd_n, N, cmul, HEAD_DV)
    return q, k, v, u, c, rows < N


@triton.jit
def _state_base(P, slot, BD: tl.constexpr, BV: tl.constexpr):
    """``(row base, dvp)`` of entry ``slot`` of a state buffer (:func:`_state_buffer`): fp32, segment-major, one row of
    ``TOT = dvp (1 + BD + BD^2) + BD + BD^2`` floats per (slot, batch x head ``program_id(1)``), ``BH =
    num_programs(1)``, ``dvp = num_programs(0) * BV``; the row holds ``S0 (dvp)``, ``S1 (BD, dvp)``, ``S2 (BD^2, dvp)``,
    ``z1 (BD)``, ``Z2 (BD, BD)`` in that order."""
    dvp = tl.num_programs(0) * BV
    tot = dvp * (1 + BD + BD * BD) + BD + BD * BD
    idx = slot.to(tl.int64) * tl.num_programs(1) + tl.program_id(1).to(tl.int64)
    return P + idx * tot, dvp


@triton.jit
def _load_state(P, slot, ov, BD: tl.constexpr, BV: tl.constexpr):
    """Entry ``slot`` of a state buffer (:func:`_state_base`): this program's value block ``ov`` of ``S0, S1, S2``
    and ``z1, Z2``."""
    base, dvp = _state_base(P, slot, BD, BV)
    od = tl.arange(0, BD)
    o2 = tl.arange(0, BD * BD)
    A0 = tl.load(base + ov)
    A1 = tl.load(base + dvp + od[:, None] * dvp + ov[None, :])
    A2 = tl.load(base + dvp * (1 + BD) + o2[:, None] * dvp + ov[None, :])
    zb = base + dvp * (1 + BD + BD * BD)
    a1 = tl.load(zb + od)
    A3 = tl.load(zb + BD + od[:, None] * BD + od[None, :])
    return A0, A1, A2, a1, A3


@triton.jit
def _seg_start(P, slot, s_id, ov, N, L, BD: tl.constexpr, BV: tl.constexpr, HAS_SS: tl.constexpr):
    """``(lo, hi, A0, A1, A2, a1, A3)``: the tokens ``[lo, hi)`` a scan covers and the state it starts from. HAS_SS:
    segment ``s_id`` of ``L`` tokens and slot ``slot`` of the state buffer ``P`` (:func:`_load_state`); else the
    whole sequence from zero."""
    if HAS_SS:
        lo = s_id * L
        hi = tl.minimum(lo + L, N)
        A0, A1, A2, a1, A3 = _load_state(P, slot, ov, BD, BV)
    else:
        lo = 0
        hi = N
        A0 = tl.zeros([BV], dtype=tl.float32)
        A1 = tl.zeros([BD, BV], dtype=tl.float32)
        A2 = tl.zeros([BD * BD, BV], dtype=tl.float32)
        a1 = tl.zeros([BD], dtype=tl.float32)
        A3 = tl.zeros([BD, BD], dtype=tl.float32)
    return lo, hi, A0, A1, A2, a1, A3


@triton.jit
def _taylor_seg_sums(X, Y, DEN, DELTA, P, sx_b, sx_h, sx_n, sy_b, sy_h, sy_n, H, N, L, NS,
                     HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                     BV: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr, QSIDE: tl.constexpr):
    """One segment's state sums into a slot of the state buffer ``P`` (:func:`_state_base`; ``NS`` segments of ``L``
    tokens, ``program_id(2) = j``). Keys (QSIDE False; ``X = K``, ``Y = V``): segment ``j`` into slot ``j + 1``,
    ``S0, S1, S2, z1, Z2`` as the forward scan accumulates them. Queries (QSIDE; ``X = Q``, ``Y = DO``): segment
    ``j + 1`` into slot ``NS - 1 - j``, the ``dk, dv`` scan's ``dS0, dS1, dS2, e1, E2`` with ``u``, ``c`` of
    :func:`_load_uc`. Slot 0 is the host's (zeros), so one cumulative sum over slots gives the exclusive prefix (keys:
    slot ``s`` = segments ``< s``) or suffix (queries: slot ``NS - 1 - s`` = segments ``> s``). ``z1``, ``Z2`` are
    written by value block 0 only (the same for every block; ``e1``, ``E2`` carry block 0's ``c``)."""
    i_v = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    j = tl.program_id(2)
    b = bh // H
    h = bh % H
    Xb = X + b * sx_b + h * sx_h
    Yb = Y + b * sy_b + h * sy_h
    ot = tl.arange(0, BT)
    od = tl.arange(0, BD)
    ov = i_v * BV + tl.arange(0, BV)
    cmul = (i_v == 0).to(tl.float32)
    A0 = tl.zeros([BV], dtype=tl.float32)
    A1 = tl.zeros([BD, BV], dtype=tl.float32)
    A2 = tl.zeros([BD * BD, BV], dtype=tl.float32)
    a1 = tl.zeros([BD], dtype=tl.float32)
    A3 = tl.zeros([BD, BD], dtype=tl.float32)
    if QSIDE:
        lo = (j + 1) * L
        slot = NS - 1 - j
    else:
        lo = j * L
        slot = j + 1
    hi = tl.minimum(lo + L, N)
    for start in range(lo, hi, BT):
        rows = start + ot
        x = _load(Xb, rows, od, sx_n, N, HEAD_D)  # (BT, BD); rows past N (and so past the segment's end): 0
        xf = x.to(tl.float32)
        if QSIDE:
            y, c = _load_uc(Yb, DEN, DELTA, bh, rows, ov, sy_n, N, cmul, HEAD_DV)
            xw = xf * c[:, None]
        else:
            y = _load(Yb, rows, ov, sy_n, N, HEAD_DV)
            xw = xf
        A0 += tl.sum(y.to(tl.float32), 0)
        A1 += _dot(tl.trans(x), y, PREC, UP)
        A2 += _dot(tl.trans(_outer(x, BT, BD)), y, PREC, UP)
        a1 += tl.sum(xw, 0)
        A3 += tl.dot(tl.trans(xw), xf, input_precision="ieee")
    base, dvp = _state_base(P, slot, BD, BV)
    o2 = tl.arange(0, BD * BD)
    tl.store(base + ov, A0)
    tl.store(base + dvp + od[:, None] * dvp + ov[None, :], A1)
    tl.store(base + dvp * (1 + BD) + o2[:, None] * dvp + ov[None, :], A2)
    if i_v == 0:
        zb = base + dvp * (1 + BD + BD * BD)
        tl.store(zb + od, a1)
        tl.store(zb + BD + od[:, None] * BD + od[None, :], A3)


@triton.jit
def _taylor_chunk_fwd(Q, K, V, O, DEN, P, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                      so_b, so_h, so_n, H, N, L, scale, eps,
                      HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                      BV: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr, HAS_SS: tl.constexpr):
    """One (value block, batch x head, segment) program; HAS_SS: segment ``program_id(2)`` of ``L`` tokens, from
    the earlier segments' key state ``P[s]`` (else the whole sequence from zero)."""
    i_v = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    Qb = Q + b * sq_b + h * sq_h
    Kb = K + b * sk_b + h * sk_h
    Vb = V + b * sv_b + h * sv_h
    Ob = O + b * so_b + h * so_h
    ot = tl.arange(0, BT)
    od = tl.arange(0, BD)
    ov = i_v * BV + tl.arange(0, BV)
    tri = ot[:, None] >= ot[None, :]
    half2 = 0.5 * scale * scale
    lo, hi, S0, S1, S2, z1, Z2 = _seg_start(P, tl.program_id(2), tl.program_id(2), ov, N, L, BD, BV, HAS_SS)
    for start in range(lo, hi, BT):
        rows = start + ot
        q = _load(Qb, rows, od, sq_n, N, HEAD_D)  # (BT, BD)
        k = _load(Kb, rows, od, sk_n, N, HEAD_D)
        v = _load(Vb, rows, ov, sv_n, N, HEAD_DV)  # (BT, BV)
        dt = v.dtype
        qf = q.to(tl.float32)
        kf = k.to(tl.float32)
        # earlier chunks: by order
        q2 = _outer(q, BT, BD)  # (BT, BD * BD)
        num = S0[None, :] + scale * _dot(q, S1.to(dt), PREC, UP) + half2 * _dot(q2, S2.to(dt), PREC, UP)
        den = start + scale * tl.sum(qf * z1[None, :], 1) \
            + half2 * tl.sum(tl.dot(qf, Z2, input_precision="ieee") * qf, 1)
        # own chunk: masked quadratic form
        s = _dot(q, tl.trans(k), PREC, UP) * scale  # (BT, BT)
        w = tl.where(tri & (rows[None, :] < N), 1.0 + s + 0.5 * s * s, 0.0).to(dt)
        num += _dot(w, v, PREC, UP)
        den += tl.sum(w.to(tl.float32), 1) + eps
        tl.store(Ob + rows[:, None] * so_n + ov[None, :], (num / den[:, None]).to(O.dtype.element_ty),
                 mask=(rows[:, None] < N) & (ov[None, :] < HEAD_DV))
        if i_v == 0:
            tl.store(DEN + bh * N + rows, den, mask=rows < N)
        # state update (padded rows of k / v are zeros: they add nothing)
        k2 = _outer(k, BT, BD)
        S0 += tl.sum(v.to(tl.float32), 0)
        S1 += _dot(tl.trans(k), v, PREC, UP)
        S2 += _dot(tl.trans(k2), v, PREC, UP)
        z1 += tl.sum(kf, 0)
        Z2 += tl.dot(tl.trans(kf), kf, input_precision="ieee")


@triton.jit
def _bwd_dq_scan(Q, K, V, DO, DEN, DELTA, DQP, P, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n,
                 sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, H, N, L, scale, i_v, bh, s_id,
                 HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                 BV: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr, HAS_SS: tl.constexpr):
    """This value block's part of ``dq`` (forward scan over the key state), fp32 into ``DQP[i_v]``; HAS_SS: over
    segment ``s_id`` only, from the earlier segments' key state ``P[s_id]``."""
    b = bh // H
    h = bh % H
    Qb = Q + b * sq_b + h * sq_h
    Kb = K + b * sk_b + h * sk_h
    Vb = V + b * sv_b + h * sv_h
    DOb = DO + b * sd_b + h * sd_h
    Pb = DQP + i_v * sp_v + b * sp_b + h * sp_h
    ot = tl.arange(0, BT)
    od = tl.arange(0, BD)
    ov = i_v * BV + tl.arange(0, BV)
    tri = ot[:, None] >= ot[None, :]
    cmul = (i_v == 0).to(tl.float32)  # the c terms once, from block 0
    lo, hi, _, S1, S2, z1, Z2 = _seg_start(P, s_id, s_id, ov, N, L, BD, BV, HAS_SS)
    for start in range(lo, hi, BT):
        rows = start + ot
        q, k, v, u, c, rm = _bwd_chunk(Qb, Kb, Vb, DOb, DEN, DELTA, bh, rows, od, ov, sq_n, sk_n, sv_n, sd_n, N,
                                       cmul, HEAD_D, HEAD_DV)
        dt = v.dtype
        qf = q.to(tl.float32)
        # earlier chunks
        t2 = _dot(u, tl.trans(S2.to(dt)), PREC, UP)  # (BT, BD * BD)
        dq = scale * (_dot(u, tl.trans(S1.to(dt)), PREC, UP) + c[:, None] * z1[None, :]) \
            + (scale * scale) * (_contract(t2, q, BT, BD)
                                 + c[:, None] * tl.dot(qf, Z2, input_precision="ieee"))
        # own chunk
        s = _dot(q, tl.trans(k), PREC, UP) * scale
        dp = _dot(u, tl.trans(v), PREC, UP) + c[:, None]
        ds = tl.where(tri & (rows[None, :] < N), dp * (1.0 + s), 0.0)
        dq += scale * _dot(ds.to(dt), k, PREC, UP)
        tl.store(Pb + rows[:, None] * sp_n + od[None, :], dq, mask=rm[:, None] & (od[None, :] < HEAD_D))
        # key state
        kf = k.to(tl.float32)
        S1 += _dot(tl.trans(k), v, PREC, UP)
        S2 += _dot(tl.trans(_outer(k, BT, BD)), v, PREC, UP)
        z1 += tl.sum(kf, 0)
        Z2 += tl.dot(tl.trans(kf), kf, input_precision="ieee")


@triton.jit
def _bwd_dkdv_scan(Q, K, V, DO, DEN, DELTA, DKP, DV, R, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n,
                   sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, sdv_b, sdv_h, sdv_n, H, N, L, NS,
                   scale, i_v, bh, s_id,
                   HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                   BV: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr, HAS_SS: tl.constexpr):
    """``dv`` of this value block and its part of ``dk`` (fp32 into ``DKP[i_v]``): reverse scan over the query
    state; HAS_SS: over segment ``s_id`` only, from the later segments' query state, slot ``NS - 1 - s_id`` of ``R``."""
    b = bh // H
    h = bh % H
    Qb = Q + b * sq_b + h * sq_h
    Kb = K + b * sk_b + h * sk_h
    Vb = V + b * sv_b + h * sv_h
    DOb = DO + b * sd_b + h * sd_h
    Pb = DKP + i_v * sp_v + b * sp_b + h * sp_h
    DVb = DV + b * sdv_b + h * sdv_h
    ot = tl.arange(0, BT)
    od = tl.arange(0, BD)
    ov = i_v * BV + tl.arange(0, BV)
    tri = ot[:, None] >= ot[None, :]  # (i, j): query i >= key j
    cmul = (i_v == 0).to(tl.float32)
    half2 = 0.5 * scale * scale
    lo, hi, dS0, dS1, dS2, e1, E2 = _seg_start(R, NS - 1 - s_id, s_id, ov, N, L, BD, BV, HAS_SS)
    if HAS_SS:
        e1 = e1 * cmul  # the c terms (stored once) from block 0 only
        E2 = E2 * cmul
    n_chunks = tl.cdiv(hi - lo, BT)
    for it in range(0, n_chunks):
        start = lo + (n_chunks - 1 - it) * BT
        rows = start + ot
        q, k, v, u, c, rm = _bwd_chunk(Qb, Kb, Vb, DOb, DEN, DELTA, bh, rows, od, ov, sq_n, sk_n, sv_n, sd_n, N,
                                       cmul, HEAD_D, HEAD_DV)  # padded rows: q = k = v = u = c = 0
        dt = v.dtype
        kf = k.to(tl.float32)
        k2 = _outer(k, BT, BD)
        # later chunks
        dv = dS0[None, :] + scale * _dot(k, dS1.to(dt), PREC, UP) + half2 * _dot(k2, dS2.to(dt), PREC, UP)
        t2 = _dot(v, tl.trans(dS2.to(dt)), PREC, UP)  # (BT, BD * BD)
        dk = scale * (_dot(v, tl.trans(dS1.to(dt)), PREC, UP) + e1[None, :]) \
            + (scale * scale) * (_contract(t2, k, BT, BD) + tl.dot(kf, E2, input_precision="ieee"))
        # own chunk, (i, j) = (query, key)
        s = _dot(q, tl.trans(k), PREC, UP) * scale
        keep = tri & rm[:, None]
        w = tl.where(keep, 1.0 + s + 0.5 * s * s, 0.0)
        dp = _dot(u, tl.trans(v), PREC, UP) + c[:, None]
        ds = tl.where(keep, dp * (1.0 + s), 0.0)
        dv += _dot(tl.trans(w.to(dt)), u, PREC, UP)
        dk += scale * _dot(tl.trans(ds.to(dt)), q, PREC, UP)
        tl.store(DVb + rows[:, None] * sdv_n + ov[None, :], dv.to(DV.dtype.element_ty),
                 mask=rm[:, None] & (ov[None, :] < HEAD_DV))
        tl.store(Pb + rows[:, None] * sp_n + od[None, :], dk, mask=rm[:, None] & (od[None, :] < HEAD_D))
        # query state
        qf = q.to(tl.float32)
        dS0 += tl.sum(u.to(tl.float32), 0)
        dS1 += _dot(tl.trans(q), u, PREC, UP)
        dS2 += _dot(tl.trans(_outer(q, BT, BD)), u, PREC, UP)
        cq = qf * c[:, None]
        e1 += tl.sum(cq, 0)
        E2 += tl.dot(tl.trans(cq), qf, input_precision="ieee")


@triton.jit
def _taylor_chunk_bwd(Q, K, V, DO, DEN, DELTA, DQP, DKP, DV, P, R,
                      sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n,
                      sdv_b, sdv_h, sdv_n, H, N, L, NS, scale,
                      HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                      BV: tl.constexpr, PREC: tl.constexpr, UP: tl.constexpr, MODE: tl.constexpr,
                      HAS_SS: tl.constexpr):
    """MODE 0: the dq scan; 1: the dk / dv scan; 2: both, chosen by grid axis 2 (``[0, NS)``: dq of segment
    ``program_id(2)``; ``[NS, 2 NS)``: dk / dv of segment ``program_id(2) - NS``). ``P``: key state before each
    segment; ``R``: query state after each segment (reversed slots) (HAS_SS, ``NS > 1`` segments of ``L`` tokens)."""
    i_v = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    if MODE == 0:
        _bwd_dq_scan(Q, K, V, DO, DEN, DELTA, DQP, P, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n,
                     sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, H, N, L, scale, i_v, bh,
                     tl.program_id(2), HEAD_D, HEAD_DV, BT, BD, BV, PREC, UP, HAS_SS)
    elif MODE == 1:
        _bwd_dkdv_scan(Q, K, V, DO, DEN, DELTA, DKP, DV, R, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n,
                       sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, sdv_b, sdv_h, sdv_n, H, N, L,
                       NS, scale, i_v, bh, tl.program_id(2), HEAD_D, HEAD_DV, BT, BD, BV, PREC, UP, HAS_SS)
    else:
        pid = tl.program_id(2)
        if pid < NS:
            _bwd_dq_scan(Q, K, V, DO, DEN, DELTA, DQP, P, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n,
                         sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, H, N, L, scale, i_v, bh,
                         pid, HEAD_D, HEAD_DV, BT, BD, BV, PREC, UP, HAS_SS)
        else:
            _bwd_dkdv_scan(Q, K, V, DO, DEN, DELTA, DKP, DV, R, sq_b, sq_h, sq_n, sk_b, sk_h,
                           sk_n, sv_b, sv_h, sv_n, sd_b, sd_h, sd_n, sp_v, sp_b, sp_h, sp_n, sdv_b, sdv_h, sdv_n, H,
                           N, L, NS, scale, i_v, bh, pid - NS, HEAD_D, HEAD_DV, BT, BD, BV, PREC, UP, HAS_SS)


# ------------------------------------------------------------------------------------------------------- host
def _strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2)


def _meta(q: torch.Tensor, v: torch.Tensor, cfg: TaylorChunkConfig) -> dict:
    B, H, N, D = q.shape
    bv = cfg.resolve_block_v(B * H, v.shape[-1], N)
    return dict(HEAD_D=D, HEAD_DV=v.shape[-1], BT=cfg.chunk, BD=16, BV=bv,
                PREC="ieee" if q.dtype == torch.float32 else "tf32",
                UP=q.dtype == torch.bfloat16 and _interpreting(),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 132  # the H200's, so that the interpreter follows the GPU's choice


def _state_buffer(x, y, den, delta, H, N, L, NS, meta, qside):
    """The state buffer of :func:`_state_base`, ``(NS, B * H, TOT)`` fp32, of ``NS > 1`` segments of ``L`` tokens, in
    one launch of :func:`_taylor_seg_sums` and one in-place cumulative sum: keys (``qside`` False; ``x = k``,
    ``y = v``): slot ``s`` holds the key sums of segments ``< s``; queries (``x = q``, ``y = do``): slot
    ``NS - 1 - s`` holds the query sums of segments ``> s``. Slot 0 is zeros before the sum."""
    B = x.shape[0]
    BV, BD = meta["BV"], meta["BD"]
    nv = cdiv(y.shape[-1], BV)
    dvp = nv * BV
    st = torch.empty(NS, B * H, dvp * (1 + BD + BD * BD) + BD + BD * BD, device=x.device, dtype=torch.float32)
    st[0].zero_()
    launch(_taylor_seg_sums, (nv, B * H, NS - 1),
           (x, y, den, delta, st, *_strides(x), *_strides(y), H, N, L, NS), QSIDE=qside, **meta)
    return st.cumsum_(0)


@triton.jit
def _taylor_delta(O, DO, DELTA, so_b, so_h, so_n, sd_b, sd_h, sd_n, H, N, HEAD_DV: tl.constexpr, BR: tl.constexpr,
                  BDV: tl.constexpr):
    """``DELTA[bh, i] = do_i . o_i`` (fp32 products and sum) for rows ``program_id(0) * BR ...`` of batch x head
    ``program_id(1)``; ``DELTA`` contiguous ``(B * H, N)``."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BDV)
    m = (rows[:, None] < N) & (cols[None, :] < HEAD_DV)
    o = tl.load(O + b * so_b + h * so_h + rows[:, None] * so_n + cols[None, :], mask=m, other=0.0)
    do = tl.load(DO + b * sd_b + h * sd_h + rows[:, None] * sd_n + cols[None, :], mask=m, other=0.0)
    tl.store(DELTA + bh * N + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rows < N)


def _delta(out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """``(B, H, N)`` fp32 ``do_i . o_i`` of ``out, dout (B, H, N, Dv)`` (last stride 1) in one launch, reading the
    inputs' dtype (no fp32 copies of ``out`` and ``dout``)."""
    B, H, N, Dv = out.shape
    delta = torch.empty(B, H, N, device=out.device, dtype=torch.float32)
    bdv = max(16, 1 << (Dv - 1).bit_length())
    br = max(1, min(64, 4096 // bdv))
    launch(_taylor_delta, (cdiv(N, br), B * H), (out, dout, delta, *_strides(out), *_strides(dout), H, N),
           HEAD_DV=Dv, BR=br, BDV=bdv, num_warps=4)
    return delta


class _TaylorChunk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, eps: float, cfg: TaylorChunkConfig):
        B, H, N, D = q.shape
        Dv = v.shape[-1]
        meta = _meta(q, v, cfg)
        NS, L = cfg.resolve_segments(B * H, Dv, N, _sm_count(q.device))
        out = torch.empty(B, H, N, Dv, device=q.device, dtype=q.dtype)
        den = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
        scale = D ** -0.5
        pre = _state_buffer(k, v, den, den, H, N, L, NS, meta, False) if NS > 1 else den
        launch(_taylor_chunk_fwd, (cdiv(Dv, meta["BV"]), B * H, NS),
               (q, k, v, out, den, pre, *_strides(q), *_strides(k), *_strides(v), *_strides(out), H, N, L, scale,
                float(eps)), HAS_SS=NS > 1, **meta)
        ctx.save_for_backward(q, k, v, out, den, *((pre,) if NS > 1 else ()))
        ctx.cfg = cfg
        ctx.seg = (NS, L)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels' backward is not differentiable
    def backward(ctx, dout):
        q, k, v, out, den, *pre = ctx.saved_tensors
        cfg = ctx.cfg
        NS, L = ctx.seg
        B, H, N, D = q.shape
        Dv = v.shape[-1]
        meta = _meta(q, v, cfg)
        nv = cdiv(Dv, meta["BV"])
        dout = dout.contiguous()
        delta = _delta(out, dout)  # (B, H, N) fp32: do_i . o_i
        if NS > 1:
            pre, suf = pre[0], _state_buffer(q, dout, den, delta, H, N, L, NS, meta, True)
        else:
            pre = suf = den
        dqp = torch.empty(nv, B, H, N, D, device=q.device, dtype=torch.float32)
        dkp = torch.empty(nv, B, H, N, D, device=q.device, dtype=torch.float32)
        dv = torch.empty(B, H, N, Dv, device=q.device, dtype=v.dtype)
        args = (q, k, v, dout, den, delta, dqp, dkp, dv, pre, suf, *_strides(q), *_strides(k), *_strides(v),
                *_strides(dout), dqp.stride(0), *_strides(dqp[0]), *_strides(dv), H, N, L, NS, D ** -0.5)
        if cfg.bwd_fused:
            launch(_taylor_chunk_bwd, (nv, B * H, 2 * NS), args, MODE=2, HAS_SS=NS > 1, **meta)
        else:
            launch(_taylor_chunk_bwd, (nv, B * H, NS), args, MODE=0, HAS_SS=NS > 1, **meta)
            launch(_taylor_chunk_bwd, (nv, B * H, NS), args, MODE=1, HAS_SS=NS > 1, **meta)
        dq = (dqp[0] if nv == 1 else dqp.sum(0)).to(q.dtype)
        dk = (dkp[0] if nv == 1 else dkp.sum(0)).to(k.dtype)
        return dq, dk, dv, None, None


def taylor_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, eps: float = 1e-6,
                 doc_ids: "torch.Tensor | None" = None, config: Optional[TaylorChunkConfig] = None) -> torch.Tensor:
    """Causal Taylor-map linear attention, fused chunked form (module docstring), differentiable in q, k, v.

    Args:
        q: ``(B, Hq, N, D)``; k: ``(B, Hkv, N, D)``; v: ``(B, Hkv, N, Dv)``: one dtype (float16, bfloat16,
            float32), one CUDA device (or the CPU under ``TRITON_INTERPRET=1``), ``Hq`` a multiple of ``Hkv``,
            ``1 <= D <= 16``, ``Dv <= 256``, ``B * Hq <= 65535``, as many queries as keys.
        causal: must be ``True`` (query ``i`` sees keys ``j <= i``).
        eps: added to the normaliser: a float in float32's normal range.
        doc_ids: must be ``None`` (packed documents: backend ``parallel`` or ``triton``).
        config: :class:`TaylorChunkConfig` (default: ``TaylorChunkConfig()``).

    Returns:
        ``(B, Hq, N, Dv)`` in ``q.dtype``.

    Raises:
        ValueError: shapes, dtypes, devices, ``causal`` (allowed: True), ``Nq != Nk``, ``doc_ids`` (allowed: None),
            ``eps`` or ``config`` outside the above (the message names the argument). Double backward raises
            ``RuntimeError``.
        TypeError: ``q``, ``k`` or ``v`` not a tensor.
    """
    check_qkv(q, k, v, eps, MAX_D, MAX_DV, d_note=" (the D^2 x Dv state is kept in registers)")
    if causal is not True:
        raise ValueError(f"causal={causal!r}: taylor_chunk is causal only (allowed: True; non-causal: backend "
                         f"'parallel' or 'triton')")
    if doc_ids is not None:
        raise ValueError("doc_ids: taylor_chunk takes no packed documents (allowed: None; backends 'parallel' / "
                         "'triton' take them)")
    B, Hq, N, D = q.shape
    if k.shape[2] != N:
        raise ValueError(f"Nq={N} (q.shape[2]) must equal Nk={k.shape[2]} (k.shape[2]): taylor_chunk takes as many "
                         f"queries as keys (allowed: Nq == Nk; other lengths: backend 'parallel')")
    if config is None:
        config = TaylorChunkConfig()
    elif not isinstance(config, TaylorChunkConfig):
        raise ValueError(f"config must be a TaylorChunkConfig or None, got {type(config).__name__}")
    n_rep = Hq // k.shape[1]
    if n_rep > 1:  # GQA: one program per query head; autograd sums dk / dv over the group
        k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    if B == 0 or N == 0 or v.shape[-1] == 0:
        return q.new_zeros(B, Hq, N, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
    if q.dtype == torch.float16:  # w = 1 + s + s^2 / 2 leaves the float16 range from |s| ~ 360: float32 end to end
        return _TaylorChunk.apply(q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), float(eps),
                                  config).to(torch.float16)
    return _TaylorChunk.apply(q.contiguous(), k.contiguous(), v.contiguous(), float(eps), config)


# ------------------------------------------------------------------------------------------ PyTorch reference
def taylor_chunk_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6,
                       chunk: int = 64) -> torch.Tensor:
    """The kernel's algorithm in plain PyTorch (fp32, or fp64 for fp64 inputs; differentiable by autograd): causal,
    ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)``, the state split by order as in the module docstring. For checking
    the math; ``O(N D^2 Dv)`` time, ``O(D^2 Dv)`` state per (batch, head). Returns ``(B, H, N, Dv)`` in
    ``q.dtype``. Raises ``ValueError`` for ``chunk < 1``."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be an int >= 1")
    ft = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(ft), k.to(ft), v.to(ft)
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    sc = D ** -0.5
    S0 = qf.new_zeros(B, H, 1, Dv)
    S1 = qf.new_zeros(B, H, D, Dv)
    S2 = qf.new_zeros(B, H, D * D, Dv)
    z1 = qf.new_zeros(B, H, D, 1)
    Z2 = qf.new_zeros(B, H, D, D)
    outs = []
    for st in range(0, N, chunk):
        qc, kc, vc = qf[:, :, st:st + chunk], kf[:, :, st:st + chunk], vf[:, :, st:st + chunk]
        n = qc.shape[2]
        q2 = (qc[..., :, None] * qc[..., None, :]).flatten(-2)
        num = S0 + sc * qc @ S1 + 0.5 * sc * sc * q2 @ S2
        den = st + sc * (qc @ z1)[..., 0] + 0.5 * sc * sc * ((qc @ Z2) * qc).sum(-1)
        s = sc * qc @ kc.transpose(-1, -2)
        w = torch.where(torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), 1 + s + 0.5 * s * s, 0.0)
        num = num + w @ vc
        den = den + w.sum(-1) + eps
        outs.append(num / den[..., None])
        k2 = (kc[..., :, None] * kc[..., None, :]).flatten(-2)
        S0 = S0 + vc.sum(2, keepdim=True)
        S1 = S1 + kc.transpose(-1, -2) @ vc
        S2 = S2 + k2.transpose(-1, -2) @ vc
        z1 = z1 + kc.sum(2)[..., None]
        Z2 = Z2 + kc.transpose(-1, -2) @ kc
    return torch.cat(outs, 2).to(q.dtype) if outs else q.new_zeros(B, H, N, Dv)
