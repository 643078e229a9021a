"""Gluon (``triton.experimental.gluon``) forward kernel for Hopper (sm_90a): exact attention under band masks (dense,
causal, sliding windows with a left and / or right edge, packed documents; see "band masks" below) and block-sparse
layouts of whole tiles (``SPARSE``: the tiles of a block-table row) with GQA, D in {64, 128}, fp16 / bf16; and the
backward's dK / dV and dQ kernels under the same masks. Imported lazily by :mod:`kernels.flash.gluon` (only when a
call runs ``fwd_impl="gluon_ws3a"`` / ``"gluon_ws3b"``, explicitly or through ``"auto"``): this module needs Gluon's
Hopper API as triton 3.6 spells it, so importing it elsewhere (CI's triton) is never required.

One kernel, ``_gl_fwd_ws3_kernel`` (FA3's layout and consumer schedule, described above it): per program one query
tile of ``BLOCK_M = 128`` rows of one (batch, query head), split between two 1-warpgroup consumer partitions of 64
rows each, against ``BLOCK_N``-key tiles that a 1-warp producer partition streams by TMA from 4-D descriptors over
the ``(B, H, N, D)`` tensors (rows past ``N`` arrive as zeros) into a ``STAGES``-deep shared-memory ring:

* ``S = Q K^T`` by ``warpgroup_mma`` with both operands in shared memory (K read through a transposed view);
* online softmax in base 2 in the wgmma accumulator layout (``log2(e)`` folded into ``qk_scale``); a program visits
  only the key tiles ``[lo, hi)`` its rows see, and only the tiles outside its full band ``[flo, fhi)`` (window edges,
  the causal diagonal, document boundaries, the ragged key end) run the element mask (a uniform branch per tile);
* ``acc += P V`` by ``warpgroup_mma`` with ``P`` in registers (A operand) and V in shared memory, in flight while
  the next tile's softmax runs (FA3's intra-warpgroup overlap); optional ping-pong of the two consumers.

Outputs: ``Out`` (any strides; the launcher passes the ``(B, N, H, D)``-stored tensor), ``Lse (B, Hq, Nq)`` fp32
natural log, ``-inf`` (and zero output) on rows that see no key (causal or windows with ``Nq > Nk``, rows of no
document).

Removed (issue 30, dominated on the H200, docs/results.md): the one-partition kernel (``"gluon"``), the
warp-specialised one with one or two ``_ws_consumer`` partitions sharing one empty barrier per slot
(``"gluon_ws"`` / ``"gluon_ws2"``) and FA4's conditional rescaling in the ws3 kernel (``"gluon_ws3"``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_init, warpgroup_mma_wait

LN2 = gl.constexpr(0.6931471805599453)
# Gluon's API moves between triton versions; the kernels run on 3.6 (the GPU image) and compile on 3.9 (what
# `pip install torch` brings) through these two names:
# a barrier across the CTA's threads: ``gl.thread_barrier`` in triton 3.6's Gluon, ``gl.barrier`` from 3.7 on
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# a TMA copy global -> shared: ``tma.async_copy_global_to_shared`` in 3.6, ``tma.async_load`` from 3.7 on
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# a TMA bulk reduce-add shared -> global (``tma.async_atomic_add``, triton 3.7+ Gluon; 3.6 has none): the fused dQ
# of the backward (``DQ_TMA``) only, never traced on a triton without it (kernels.flash.gluon.gluon_tma_reduce_ok)
_tma_reduce_add = getattr(tma, "async_atomic_add", None)


@gluon.jit
def _partial_tile(t, flo, fhi, HAS_LEFT: gl.constexpr, DOCS: gl.constexpr):
    """Whether key tile ``t`` of a visited range ``[lo, hi)`` runs the element mask: outside the full band ``[flo,
    fhi)`` (below ``flo`` only with a left window edge or documents: else ``flo == lo``, not tested)."""
    if HAS_LEFT or DOCS:
        part = (t < flo) | (t >= fhi)
    else:
        part = t >= fhi
    return part


@gluon.jit
def _softmax_tile(s, m_i, l_i, t, tp, flo, fhi, start_m, Nk, offset, win_left, win_right, d_first, d_last,
                  qk_scale, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """One tile's online-softmax step on the scores ``s`` (fp32, wgmma layout) of key tile ``t`` against rows
    ``start_m + [0, BLOCK_M)``: returns ``(p, alpha, m_new, l_new)`` with ``p`` unnormalised probabilities and
    ``alpha`` the rescale of the running accumulator. The tile runs the element rule (:func:`_tile_ok`; a row with
    no visible key in the tile gets ``p = 0`` and keeps its running max: no NaN) when ``tp`` lies outside ``[flo,
    fhi)``: ``tp = t`` for band masks (the full band); the round number for a block-sparse table row (its first
    ``fhi`` tiles are the full ones)."""
    if _partial_tile(tp, flo, fhi, HAS_LEFT, DOCS):  # band edge / diagonal / document boundary / ragged end
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = _tile_ok(rows, cols, Nk, offset, win_left, win_right, d_first, d_last, HAS_LEFT, HAS_RIGHT, DOCS)
        s = gl.where(ok, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - gl.expand_dims(m_use, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = m_new
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _epilogue(acc, m_i, l_i, Out, Lse, b, h, bh, start_m, Nq, stride_ob, stride_oh, stride_on,
              BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Normalise and store one tile: ``Out[b, h, rows, :]`` in Out's dtype, ``Lse[b, h, rows]`` natural log."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(Lse + bh.to(gl.int64) * Nq + rows, lse, mask=rows < Nq)
    inv = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))
    out = acc * gl.expand_dims(inv, 1)
    rows_o = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols_o = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
    base = Out + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    ptrs = base + gl.expand_dims(rows_o.to(gl.int64) * stride_on, 1) + gl.expand_dims(cols_o, 0)
    gl.store(ptrs, out.to(Out.dtype.element_ty), mask=gl.expand_dims(rows_o < Nq, 1))


@gluon.jit
def _program_coords(Hq, group, HAS_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr):
    if HAS_RIGHT:  # heaviest (longest) causal tiles first (a right window edge: the last tiles see the most keys)
        mblk = gl.num_programs(0) - 1 - gl.program_id(0)
    else:
        mblk = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    return mblk * BLOCK_M, bh, b, h, h // group


# ------------------------------------------------------------------------------------------------ band masks
# Sliding windows and packed documents on the Gluon kernels (issues 27 / 30): the mask description of the Triton
# kernels (kernels/flash/common.py: ``win_left`` / ``win_right`` with constexprs HAS_LEFT / HAS_RIGHT, causal being
# HAS_RIGHT with win_right = 0; DOCS with the document table of kernels/flash/documents.py), ported to Gluon. Every
# such mask is a band: each query row sees one contiguous key span whose ends never decrease down the rows, so a
# query tile visits the key tiles [lo, hi) (and a key tile the query tiles [lo, hi)); the tiles in [flo, fhi) need
# no element mask, the others run :func:`_band_ok`.


@gluon.jit
def _band_ok(i2, j2, Nq, Nk, offset, win_left, win_right, DocQb, DocKb, HAS_LEFT: gl.constexpr,
             HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr):
    """The element rule on broadcastable query-row ``i2`` / key ``j2`` index tensors (any layout): key ``j`` visible
    to row ``i`` iff ``j < Nk``, ``i < Nq``, ``j <= i + offset + win_right`` (HAS_RIGHT), ``j >= i + offset -
    win_left`` (HAS_LEFT) and, with DOCS, both in one document (``DocQb`` / ``DocKb``: the batch row's ``doc_q`` /
    ``doc_k``; Triton's ``_allowed`` and ``_doc_ok``)."""
    ia = i2 + offset
    ok = (j2 < Nk) & (i2 < Nq)
    if HAS_RIGHT:
        ok = ok & (j2 <= ia + win_right)
    if HAS_LEFT:
        ok = ok & (j2 >= ia - win_left)
    if DOCS:
        dq = gl.load(DocQb + i2, mask=i2 < Nq, other=-2)
        dk = gl.load(DocKb + j2, mask=j2 < Nk, other=-3)
        ok = ok & (dq == dk)
    return ok


@gluon.jit
def _doc_rows(Doc, b, Nq, Nk):
    """Pointers to batch row ``b``'s ``doc_q``, ``q_lo``, ``q_hi``, ``doc_k``, ``k_lo``, ``k_hi`` in the document
    table ``(B, 3 * Nq + 3 * Nk)`` (Triton's ``_doc_ptrs``)."""
    base = Doc + b.to(gl.int64) * (3 * (Nq + Nk))
    return base, base + Nq, base + 2 * Nq, base + 3 * Nq, base + 3 * Nq + Nk, base + 3 * Nq + 2 * Nk


@gluon.jit
def _doc_clip(lo, hi, flo, fhi, DocB, LoB, HiB, first, last, BLOCK: gl.constexpr):
    """The document clamp of :func:`_band_kv_range` and :func:`_band_q_range` (Triton's ``_doc_clip``): the tiles ``[lo,
    hi)`` / full ``[flo, fhi)`` (of ``BLOCK`` indices) visited by one tile whose first / last index is ``first`` /
    ``last``, intersected with its documents. ``DocB``, ``LoB``, ``HiB``: the visiting side's columns of the document
    table (``doc_q``, ``q_lo``, ``q_hi`` for a query tile visiting key tiles of ``BLOCK_N``; ``doc_k``, ``k_lo``,
    ``k_hi`` for a key tile visiting query tiles of ``BLOCK_M``). Only the tiles of ``[LoB[first], HiB[last])`` are
    visited; a tile stays full only when ``first`` and ``last`` are in one document and the tile lies inside that
    document (else the element rule runs)."""
    slo = gl.load(LoB + first)
    shi = gl.load(HiB + last)
    uniform = gl.load(DocB + first) == gl.load(DocB + last)
    lo2 = gl.maximum(lo, slo // BLOCK)
    hi2 = gl.maximum(gl.minimum(hi, (shi + BLOCK - 1) // BLOCK), lo2)
    flo2 = gl.maximum(flo, (slo + BLOCK - 1) // BLOCK)
    fhi2 = gl.where(uniform, gl.minimum(fhi, shi // BLOCK), flo2)
    flo = gl.minimum(gl.maximum(flo2, lo2), hi2)
    fhi = gl.minimum(gl.maximum(fhi2, flo), hi2)
    return lo2, hi2, flo, fhi


@gluon.jit
def _band_kv_range(start_m, Nq, Nk, offset, win_left, win_right, DocQb, QLob, QHib, HAS_LEFT: gl.constexpr,
                   HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """``(lo, hi, flo, fhi)``: query tile ``start_m`` (``BLOCK_M`` rows) visits key tiles ``[lo, hi)``; those in
    ``[flo, fhi)`` need no element mask (Triton's ``_kv_range`` then ``_doc_kv_range``)."""
    r1 = gl.minimum(start_m + BLOCK_M, Nq) - 1
    a0 = start_m + offset
    a1 = r1 + offset
    lo_key = a0 * 0
    hi_key = lo_key + Nk - 1
    flo = lo_key
    fhi = lo_key + Nk // BLOCK_N
    if HAS_LEFT:
        lo_key = gl.maximum(a0 - win_left, 0)
        flo = (gl.maximum(a1 - win_left, 0) + BLOCK_N - 1) // BLOCK_N
    if HAS_RIGHT:
        hi_key = gl.minimum(a1 + win_right, Nk - 1)
        fhi = gl.minimum(fhi, gl.maximum(a0 + win_right + 1, 0) // BLOCK_N)
    lo = lo_key // BLOCK_N
    hi = gl.where(hi_key >= lo_key, gl.maximum(hi_key, 0) // BLOCK_N + 1, lo)
    fhi = gl.where(r1 - start_m + 1 == BLOCK_M, fhi, 0)
    flo = gl.minimum(gl.maximum(flo, lo), hi)
    fhi = gl.minimum(gl.maximum(fhi, flo), hi)
    if DOCS:  # only the key tiles of this query tile's documents; full only inside one document
        lo, hi, flo, fhi = _doc_clip(lo, hi, flo, fhi, DocQb, QLob, QHib, start_m, r1, BLOCK_N)
    return lo, hi, flo, fhi


@gluon.jit
def _band_q_range(start_n, Nq, Nk, offset, win_left, win_right, DocKb, KLob, KHib, HAS_LEFT: gl.constexpr,
                  HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """``(lo, hi, flo, fhi)``: key tile ``start_n`` (``BLOCK_N`` keys) is seen by query tiles ``[lo, hi)``; those
    in ``[flo, fhi)`` need no element mask (Triton's ``_q_range`` then ``_doc_q_range``)."""
    c1 = gl.minimum(start_n + BLOCK_N, Nk) - 1
    lo_row = start_n * 0
    hi_row = lo_row + Nq - 1
    flo = lo_row
    fhi = lo_row + Nq // BLOCK_M
    if HAS_RIGHT:  # j <= i' + right  ->  i >= j - right - offset
        lo_row = gl.maximum(start_n - win_right - offset, 0)
        flo = (gl.maximum(c1 - win_right - offset, 0) + BLOCK_M - 1) // BLOCK_M
    if HAS_LEFT:  # j >= i' - left  ->  i <= j + left - offset
        hi_row = gl.minimum(c1 + win_left - offset, Nq - 1)
        fhi = gl.minimum(fhi, gl.maximum(start_n + win_left - offset + 1, 0) // BLOCK_M)
    lo = lo_row // BLOCK_M
    hi = gl.where(hi_row >= lo_row, gl.maximum(hi_row, 0) // BLOCK_M + 1, lo)
    fhi = gl.where(c1 - start_n + 1 == BLOCK_N, fhi, 0)
    flo = gl.minimum(gl.maximum(flo, lo), hi)
    fhi = gl.minimum(gl.maximum(fhi, flo), hi)
    if DOCS:  # only the query tiles of this key tile's documents; full only inside one document
        lo, hi, flo, fhi = _doc_clip(lo, hi, flo, fhi, DocKb, KLob, KHib, start_n, c1, BLOCK_M)
    return lo, hi, flo, fhi


@gluon.jit
def _doc_span(rows, Nq, QLob, QHib, DOCS: gl.constexpr):
    """DOCS: each query row's document key span ``(first, last)``, inclusive (``doc_q[i] == doc_k[j]`` iff ``q_lo[i]
    <= j < q_hi[i]``; ``QLob`` / ``QHib`` the batch row's ``q_lo`` / ``q_hi``; empty for rows of no document and rows
    past ``Nq``). Loaded once per consumer (``rows`` 1-D, a slice 1 of the tile layout), so the element mask compares
    with it and loads nothing per key (the per-key ``doc_k`` gather of ``_band_ok`` spilled at D = 128). Without
    DOCS: zeros, never read (the table is not touched)."""
    if DOCS:
        in_q = rows < Nq
        first = gl.load(QLob + rows, mask=in_q, other=0)
        last = gl.load(QHib + rows, mask=in_q, other=0) - 1
    else:
        first = rows * 0
        last = rows * 0
    return first, last


@gluon.jit
def _tile_ok(rows, cols, Nk, offset, win_left, win_right, d_first, d_last, HAS_LEFT: gl.constexpr,
             HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr):
    """:func:`_band_ok` on a tile with the query rows on its rows: ``rows`` / ``cols`` 1-D (slices 1 / 0 of the tile
    layout), ``d_first`` / ``d_last`` the rows' document spans (:func:`_doc_span`; read with DOCS only); returns the
    ``(rows, cols)`` bool tile. Unlike ``_band_ok``, rows past ``Nq`` are not masked (without DOCS): the forward
    never stores them and the dQ kernel gives them ``P = 0`` (``lse2 = +inf``). The window edges are written as
    ``cols <= rows + (offset + win_right)`` so that, both being aranges plus scalars, the compiler compares the
    constant ``c - r`` with one scalar per element (as the causal rule before the band masks)."""
    c2 = gl.expand_dims(cols, 0)
    r2 = gl.expand_dims(rows, 1)
    ok = gl.expand_dims(cols < Nk, 0)
    if HAS_RIGHT:
        ok = ok & (c2 <= r2 + (offset + win_right))
    if HAS_LEFT:
        ok = ok & (c2 >= r2 + (offset - win_left))
    if DOCS:
        ok = ok & (c2 >= gl.expand_dims(d_first, 1)) & (c2 <= gl.expand_dims(d_last, 1))
    return ok


@gluon.jit
def _row_span(rows, Nq, Nk, offset, win_left, win_right, QLob, QHib, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr):
    """The dQ kernel's form of :func:`_tile_ok`: each query row's visible key span ``(first, last)``, inclusive (empty
    when ``last < first``; the window edges, ``Nk`` and, with DOCS, the row's document span, :func:`_doc_span`),
    computed once per consumer; :func:`_span_ok` then needs one or two compares per element. ``first`` is only
    meaningful with HAS_LEFT or DOCS (else 0, not read). Rows past ``Nq`` are not masked without DOCS (``P = 0``
    there: ``lse2 = +inf``). (The forward keeps :func:`_tile_ok`, which compiles its causal rule as before the band
    masks; the dQ kernel spilled with it at D 64 with a window and documents, not with this.)"""
    last = rows * 0 + (Nk - 1)
    first = rows * 0
    if HAS_RIGHT:
        last = gl.minimum(last, rows + offset + win_right)
    if HAS_LEFT:
        first = rows + offset - win_left
    if DOCS:
        d_first, d_last = _doc_span(rows, Nq, QLob, QHib, DOCS)
        last = gl.minimum(last, d_last)
        first = gl.maximum(first, d_first)
    return first, last


@gluon.jit
def _span_ok(cols, first, last, HAS_LEFT: gl.constexpr, DOCS: gl.constexpr):
    """The ``(rows, cols)`` bool tile of :func:`_row_span`'s spans: key ``cols[c]`` visible to row ``r`` (``cols``
    a slice 0, ``first`` / ``last`` slices 1 of the tile's layout)."""
    ok = gl.expand_dims(cols, 0) <= gl.expand_dims(last, 1)
    if HAS_LEFT or DOCS:
        ok = ok & (gl.expand_dims(cols, 0) >= gl.expand_dims(first, 1))
    return ok


# ------------------------------------------------------------------------------------------------ gluon_ws3 family
# FA3's layout (one 1-warp TMA producer, two 1-warpgroup consumers of BLOCK_M / 2 rows each) and consumer schedule.
# Per consumer, key tile j (j >= 1) is one "issue round":
#
#   [turn wait]  issue S_j = Q K_j^T  and  O += P_{j-1} V_{j-1}  (both async)  [turn pass]
#   wait S_j (wgmma group 1 of 2)  ->  softmax(S_j) -> P_j, alpha_j   (runs while P_{j-1} V_{j-1} is in flight)
#   wait O   ->  release K_j and V_{j-1}  ->  O *= alpha_j
#
# tile 0 has only S_0, and one last round issues P_{n-1} V_{n-1}: n_tiles + 1 rounds. K and V have their own ready
# and empty barriers, so the producer refills a K slot one softmax earlier than its V slot.
#
# Ping-pong (PINGPONG, FA3 sec. 3.1): the two consumers take turns issuing their rounds' wgmmas, through two
# mbarriers ``turn[w]`` ("consumer w may issue"), so one consumer's softmax runs while the other's GEMMs run.
# Consumer 0 goes first: its round r >= 1 waits for consumer 1's round r - 1; consumer 1's round r waits for consumer
# 0's round r. A consumer passes the turn (one arrive, after a barrier over its 4 warps, so that every warp has
# passed its own wait first) right after issuing. Phases: the r-th arrive on turn[1] comes after every warp of
# consumer 1 has consumed phase r - 1 (it needs consumer 1's arrive of round r - 1, itself after consumer 1's barrier),
# so a waiter is never two phases behind (parity waits stay exact); likewise for turn[0]. Both consumers run the same
# n_tiles + 1 rounds; consumer 1's last arrive on turn[0] is never waited for (the barrier dies with the program).


@gluon.jit
def _pp_wait(my_turn, r, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait for consumer ``WG``'s turn (``my_turn``: its barrier) in issue round ``r`` (consumer 0
    issues round 0 unasked)."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(my_turn, (r + 1) & 1, pred=r > 0)
        else:
            mbarrier.wait(my_turn, r & 1)


@gluon.jit
def _pp_pass(other_turn, PINGPONG: gl.constexpr):
    """Ping-pong: hand the turn to the other consumer, once every warp of this one has passed its wait."""
    if PINGPONG:
        _cta_barrier()
        mbarrier.arrive(other_turn, count=1)


@gluon.jit
def _ws3_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty,
                  b, h, hk, start_m, lo, n_tiles, Row, SPARSE: gl.constexpr, STAGES: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """Producer partition (1 warp): Q once, then per key tile (``lo`` to ``lo + n_tiles - 1``, or the block-sparse
    table row ``Row``'s) its K (slot free once both consumers' S of the tile ``STAGES`` back completed) and its V
    (free once both consumers' PV product of that tile completed)."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [b, h, start_m, 0], q_bar, q_smem)
    _kv_ring_fill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, n_tiles, Row,
                  SPARSE, STAGES, BLOCK_N)


@gluon.jit
def _sparse_row(Idx, Cnt, Nfull, stride_tbl, BLOCK: gl.constexpr):
    """Program ``r = program_id(0)``'s block-table row (:func:`kernels.flash.sparse.layout_tables`): ``(Row, start,
    count, nfull)``, a pointer to the row, the first index of its own tile (column 0, times ``BLOCK``), its count of
    visited tiles and of full ones (listed first)."""
    r = gl.program_id(0)
    Row = Idx + r * stride_tbl
    return Row, gl.load(Row) * BLOCK, gl.load(Cnt + r), gl.load(Nfull + r)


@gluon.jit
def _key_tile(lo, t, Row, SPARSE: gl.constexpr):
    """The key tile of ring position ``t``: ``lo + t`` (band masks), or column ``1 + t`` of the block-sparse table
    row ``Row`` (``SPARSE``)."""
    if SPARSE:
        kt = gl.load(Row + 1 + t)
    else:
        kt = lo + t
    return kt


@gluon.jit
def _full_pos(j, t, SPARSE: gl.constexpr):
    """What :func:`_softmax_tile` tests against the full range ``[flo, fhi)``: round ``j`` of a block-sparse table
    row (full tiles first), else key tile ``t``."""
    if SPARSE:
        r = j
    else:
        r = t
    return r


@gluon.jit
def _kv_ring_fill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, n_tiles, Row,
                  SPARSE: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """The producer's key loop (the forward's and the dQ kernel's): K and V of ``n_tiles`` key tiles of head ``hk``
    into ``STAGES``-deep rings (ring position ``t``, counted from 0, holds tile :func:`_key_tile`: ``lo + t``, or
    the block-sparse table row's ``t``-th); a K (V) slot is refilled once its empty barrier completed the release
    of the tile ``STAGES`` back (both consumers' arrives)."""
    _kv_ring_span(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, 0, n_tiles, 0, Row,
                  SPARSE, STAGES, BLOCK_N)


@gluon.jit
def _kv_ring_span(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, t_begin, t_end, g0,
                  Row, SPARSE: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """:func:`_kv_ring_fill` for key tiles ``t`` in ``[t_begin, t_end)`` of a query tile whose tile 0 sits at ring
    position ``g0`` (the count of key tiles the program streamed before it: 0, except in the persistent forward):
    tile ``t`` goes to position ``g = g0 + t``, slot ``g % STAGES``, refilled once position ``g - STAGES`` was
    released."""
    for t in range(t_begin, t_end):
        kt = _key_tile(lo, t, Row, SPARSE)
        g = g0 + t
        slot = g % STAGES
        phase = ((g // STAGES) & 1) ^ 1  # the release of position g - STAGES: completion g // STAGES - 1 of the slot
        reuse = g >= STAGES
        mbarrier.wait(k_empty.index(slot), phase, pred=reuse)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [b, hk, kt * BLOCK_N, 0], k_bars.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase, pred=reuse)
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [b, hk, kt * BLOCK_N, 0], v_bars.index(slot), v_smem.index(slot))


@gluon.jit
def _ws3_consumer(q2, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, my_turn, other_turn, Out, Lse, Doc,
                  stride_ob, stride_oh, stride_on, b, h, bh, start_m, lo, n_tiles, flo, fhi, Nq, Nk, offset, qk_scale,
                  win_left, win_right, Row, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                  SPARSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                  STAGES: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    """Consumer ``WG`` (0 or 1; one warpgroup): ``BLOCK_M`` rows from ``start_m`` (``q2`` their Q tile in shared
    memory) against the program's key tiles ``lo + [0, n_tiles)`` (ring position ``j`` holds tile ``lo + j``; the
    element mask outside the program's full band ``[flo, fhi)``) or, with ``SPARSE``, the table row ``Row``'s
    (position ``j`` holds its tile ``j``; the element mask from position ``fhi``, its count of full tiles), the
    schedule described above (:func:`_ws3_rounds`), then the epilogue."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)  # (DOCS only; never read otherwise)
    d_first, d_last = _doc_span(start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout)), Nq, QLob,
                                QHib, DOCS)
    mbarrier.wait(q_bar, 0)  # also when no key is visited: the program must not exit with the Q copy in flight
    acc, m_i, l_i = _ws3_rounds(q2, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, my_turn, other_turn, 0, start_m,
                                lo, n_tiles, flo, fhi, Nk, offset, qk_scale, win_left, win_right, d_first, d_last, Row,
                                HAS_LEFT, HAS_RIGHT, DOCS, SPARSE, BLOCK_M, BLOCK_N, HEAD_D, STAGES, WG, PINGPONG,
                                False, num_warps)
    _epilogue(acc, m_i, l_i, Out, Lse, b, h, bh, start_m, Nq, stride_ob, stride_oh, stride_on, BLOCK_M, HEAD_D,
              s_layout, o_layout)


@gluon.jit
def _ws3_rounds(q2, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, my_turn, other_turn, g0, start_m, lo, n_tiles,
                flo, fhi, Nk, offset, qk_scale, win_left, win_right, d_first, d_last, Row, HAS_LEFT: gl.constexpr,
                HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, SPARSE: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                PINGPONG: gl.constexpr, RELEASE_LAST: gl.constexpr, num_warps: gl.constexpr):
    """The ``n_tiles + 1`` issue rounds of one query tile (the schedule above; Q already in shared memory):
    returns ``(acc, m_i, l_i)``, the unnormalised fp32 output ``(BLOCK_M, HEAD_D)`` and the running max / sum.
    Key tile ``j`` sits at ring position ``g0 + j`` (``g0``: key tiles the program consumed before this query
    tile). Releases (K_j and V_{j-1} after round j's PV wait) follow a barrier over the partition's warps: each
    empty barrier expects one arrive per consumer. ``RELEASE_LAST``: also release the last V slot (the persistent
    forward refills it for its next query tile; a one-tile program never does)."""
    dtype: gl.constexpr = q2.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if n_tiles > 0:  # (both consumers agree: no round at all when the rows see no key)
        # round 0: S_0 only
        _pp_wait(my_turn, 0, WG, PINGPONG)
        slot0 = g0 % STAGES
        mbarrier.wait(k_bars.index(slot0), (g0 // STAGES) & 1)
        s_t = warpgroup_mma(q2, k_smem.index(slot0).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                            use_acc=False, is_async=True)
        _pp_pass(other_turn, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_t, ))
        _cta_barrier()
        mbarrier.arrive(k_empty.index(slot0), count=1)
        t0 = _key_tile(lo, 0, Row, SPARSE)
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, t0, _full_pos(0, t0, SPARSE), flo, fhi, start_m, Nk, offset,
                                           win_left, win_right, d_first, d_last, qk_scale, HAS_LEFT, HAS_RIGHT, DOCS,
                                           BLOCK_M, BLOCK_N, s_layout)
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_tiles):
            g = g0 + j
            slot = g % STAGES
            pslot = (g - 1) % STAGES
            tj = _key_tile(lo, j, Row, SPARSE)  # (a table load with SPARSE: issued before the waits)
            _pp_wait(my_turn, j, WG, PINGPONG)
            mbarrier.wait(k_bars.index(slot), (g // STAGES) & 1)
            s_t = warpgroup_mma(q2, k_smem.index(slot).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                                use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(pslot), ((g - 1) // STAGES) & 1)
            acc_t = warpgroup_mma(p_prev, v_smem.index(pslot).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
            _pp_pass(other_turn, PINGPONG)
            s = warpgroup_mma_wait(1, deps=(s_t, ))  # S_j done; P_{j-1} V_{j-1} may still run
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, tj, _full_pos(j, tj, SPARSE), flo, fhi, start_m, Nk,
                                               offset, win_left, win_right, d_first, d_last, qk_scale, HAS_LEFT,
                                               HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N, s_layout)
            p_next = gl.convert_layout(p.to(dtype), p_layout)
            acc, p_prev = warpgroup_mma_wait(0, deps=(acc_t, p_prev))
            _cta_barrier()  # every warp's wgmmas of K_j and V_{j-1} are done: release both slots
            mbarrier.arrive(k_empty.index(slot), count=1)
            mbarrier.arrive(v_empty.index(pslot), count=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            p_prev = p_next
        # last round: P_{n-1} V_{n-1} (a one-tile program never refills its V slot: released only with RELEASE_LAST)
        glast = g0 + n_tiles - 1
        _pp_wait(my_turn, n_tiles, WG, PINGPONG)
        mbarrier.wait(v_bars.index(glast % STAGES), (glast // STAGES) & 1)
        acc_t = warpgroup_mma(p_prev, v_smem.index(glast % STAGES).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
        _pp_pass(other_turn, PINGPONG)
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc_t, p_prev))
        if RELEASE_LAST:
            _cta_barrier()
            mbarrier.arrive(v_empty.index(glast % STAGES), count=1)
    return acc, m_i, l_i


@gluon.jit
def _gl_fwd_ws3_kernel(q_desc, k_desc, v_desc, Out, Lse, stride_ob, stride_oh, stride_on,
                       Hq, Nq, Nk, offset, group, qk_scale, win_left, win_right, Doc, KvIdx, KvCnt, KvNfull,
                       stride_tbl, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                       STAGES: gl.constexpr, num_warps: gl.constexpr, PINGPONG: gl.constexpr = True,
                       SPARSE: gl.constexpr = False):
    """``gluon_ws3a`` (``PINGPONG=False``) / ``gluon_ws3b`` (``PINGPONG=True``): FA3's layout (``num_warps = 4``: the
    default partition is consumer 0, a 4-warp worker consumer 1, a 1-warp worker the producer) with FA3's
    intra-warpgroup overlap, split K / V barriers and optional ping-pong of the consumers. Grid ``(cdiv(Nq,
    BLOCK_M), B * Hq)``. The mask: ``win_left`` / ``win_right`` (>= 0; read only with ``HAS_LEFT`` / ``HAS_RIGHT``;
    causal is ``HAS_RIGHT`` with ``win_right = 0``) and, with ``DOCS``, the int32 document table ``Doc (B, 3 * Nq
    + 3 * Nk)`` of kernels/flash/documents.py (never read otherwise); ``offset = Nk - Nq`` (bottom-right).

    ``SPARSE`` (a block-sparse layout whose blocks are whole ``BLOCK_M x BLOCK_N`` tiles; not with ``DOCS``): program
    ``(r, bh)`` runs row ``r`` of the int32 table ``KvIdx (n_q_tiles, stride_tbl)`` of
    :func:`kernels.flash.sparse.layout_tables` (column 0: its query tile; then ``KvCnt[r]`` visited key tiles, the
    ``KvNfull[r]`` full ones first), the band mask applying inside the partial ones; never read otherwise."""
    dtype: gl.constexpr = q_desc.dtype
    start_m, bh, b, h, hk = _program_coords(Hq, group, HAS_RIGHT, BLOCK_M)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)
    if SPARSE:  # table rows in schedule order (heaviest first)
        Row, start_m, n_tiles, fhi = _sparse_row(KvIdx, KvCnt, KvNfull, stride_tbl, BLOCK_M)
        lo = 0
        flo = 0
    else:
        Row = KvIdx
        lo, hi, flo, fhi = _band_kv_range(start_m, Nq, Nk, offset, win_left, win_right, DocQb, QLob, QHib,
                                          HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
        n_tiles = hi - lo
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # one allocation each: Triton's shared-memory hazard analysis would put a CTA-wide barrier between an arrive on
    # one and a wait on the other if they shared one
    turn0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    turn1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(turn0, count=1)
    mbarrier.init(turn1, count=1)
    fence_async_shared()
    q2 = q_smem.reshape([BLOCK_M, HEAD_D])
    HALF: gl.constexpr = BLOCK_M // 2
    gl.warp_specialize(
        [(_ws3_consumer, (q2.slice(0, HALF), k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, turn0, turn1,
                          Out, Lse, Doc, stride_ob, stride_oh, stride_on, b, h, bh, start_m, lo, n_tiles, flo, fhi, Nq,
                          Nk, offset, qk_scale, win_left, win_right, Row, HAS_LEFT, HAS_RIGHT, DOCS, SPARSE, HALF,
                          BLOCK_N, HEAD_D, STAGES, 0, PINGPONG, num_warps)),
         (_ws3_consumer, (q2.slice(HALF, HALF), k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, turn1,
                          turn0, Out, Lse, Doc, stride_ob, stride_oh, stride_on, b, h, bh, start_m + HALF, lo, n_tiles,
                          flo, fhi, Nq, Nk, offset, qk_scale, win_left, win_right, Row, HAS_LEFT, HAS_RIGHT, DOCS,
                          SPARSE, HALF, BLOCK_N, HEAD_D, STAGES, 1, PINGPONG, 4)),
         (_ws3_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty,
                          b, h, hk, start_m, lo, n_tiles, Row, SPARSE, STAGES, BLOCK_N))],
        [4, 1], [240, 24])


# ------------------------------------------------------------------------------------------------ persistent forward
# ``gluon_ws3p`` (issue 30: "persistent kernels with a causal-aware, longest-first tile order"): the ws3a schedule
# (:func:`_ws3_rounds`, no ping-pong) in a persistent grid of at most one program per SM. The work items (one query
# tile of one (batch, head) each) are listed in sections of ``sec`` heads (the host sizes a section so that its K / V
# fit in a share of L2; the last section may hold fewer heads), and within a section by query tile, longest first
# (causal / a right window edge: the last query tiles see the most keys), the section's heads inner (a GQA group's
# heads side by side). Program ``p`` of ``P`` takes item ``k * P + p`` in even steps ``k`` and ``k * P + P - 1 - p``
# in odd ones (a snake: the longest item of one step goes with the shortest of the next, so every program's items add
# up to about the same work; a plain ``p + k * P`` gave program 0 three times program 64's work at causal 16k). The K
# / V rings, their barriers and phases run on across a program's items (ring position ``g0 + j``), so the producer
# streams the next item's first key tiles (``PREFETCH``) while the consumers finish the current one; Q has one
# buffer, reloaded once both consumers' last ``S`` product of the item is done (``q_empty``); the epilogue of one item
# overlaps the next item's loads. Not for block-sparse tables.


@gluon.jit
def _work_item(k, n_work):
    """``(i, valid)``: the item program ``program_id(0)`` runs in step ``k`` (the snake above) and whether it
    exists (``i < n_work``: the last step may be partial)."""
    P = gl.num_programs(0)
    p = gl.program_id(0)
    i = k * P + p + (k & 1) * (P - 1 - 2 * p)
    return i, i < n_work


@gluon.jit
def _work_coords(i, n_m, n_bh, sec, Hq, group, HAS_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr):
    """``(start_m, bh, b, h, hk)`` of work item ``i`` of the persistent forward: ``n_m`` query tiles of ``BLOCK_M``
    rows per head, ``n_bh = B * Hq`` heads in sections of ``sec``; in a section, query tile rank ``r`` (longest
    first with ``HAS_RIGHT``: tile ``n_m - 1 - r``) of each of its heads, then rank ``r + 1``."""
    per = sec * n_m
    s = i // per
    within = i - s * per
    heads = gl.minimum(sec, n_bh - s * sec)
    r = within // heads
    bh = s * sec + within % heads
    if HAS_RIGHT:
        mblk = n_m - 1 - r
    else:
        mblk = r
    b = bh // Hq
    h = bh % Hq
    return mblk * BLOCK_M, bh, b, h, h // group


@gluon.jit
def _ws3p_produce(i, c, g0, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty,
                  v_empty, Doc, Sched, Hq, group, Nq, Nk, offset, win_left, win_right, n_m, n_work, sec,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PREFETCH: gl.constexpr, DYNAMIC: gl.constexpr):
    """The producer's part of work item ``i``, the program's ``c``-th, its key tile 0 at ring position ``g0``: the
    first ``PREFETCH`` key tiles (as ring slots free up), then (once item ``c - 1`` released the buffer) its Q, with
    ``DYNAMIC`` after writing ``i`` to ``Sched[program]`` for the consumers, then its other key tiles. Returns the
    next item's ring position."""
    start_m, bh, b, h, hk = _work_coords(i, n_m, n_work // n_m, sec, Hq, group, HAS_RIGHT, BLOCK_M)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)
    lo, hi, flo, fhi = _band_kv_range(start_m, Nq, Nk, offset, win_left, win_right, DocQb, QLob, QHib,
                                      HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
    n_tiles = hi - lo
    n_pre = gl.minimum(n_tiles, PREFETCH)
    _kv_ring_span(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, 0, n_pre, g0, Doc,
                  False, STAGES, BLOCK_N)
    mbarrier.wait(q_empty, (c & 1) ^ 1, pred=c > 0)  # completion c of q_empty: item c - 1 released Q
    if DYNAMIC:  # (released by the expect's arrive below, read once the consumers' wait on q_bar returns)
        gl.store(Sched + gl.program_id(0), i)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [b, h, start_m, 0], q_bar, q_smem)
    _kv_ring_span(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, n_pre, n_tiles, g0,
                  Doc, False, STAGES, BLOCK_N)
    return g0 + n_tiles


@gluon.jit
def _ws3p_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty,
                   Doc, Counter, Sched, Hq, group, Nq, Nk, offset, win_left, win_right, n_m, n_work, sec,
                   HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PREFETCH: gl.constexpr, DYNAMIC: gl.constexpr):
    """Producer partition (1 warp) of the persistent forward: the program's work items in turn
    (:func:`_ws3p_produce`). Static: the snake's items (:func:`_work_item`). ``DYNAMIC``: item ``program_id`` first,
    then each next one claimed from the int32 counter ``Counter`` (zeroed by the host before the launch: the
    ``n``-th claim gets item ``P + n``), handed to the consumers through ``Sched[program]``; past the list, the
    index ``n_work`` with a plain arrive on ``q_bar`` tells them to stop."""
    g0 = 0
    c = 0
    if DYNAMIC:
        i = gl.program_id(0)
        while i < n_work:
            g0 = _ws3p_produce(i, c, g0, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars,
                               v_bars, k_empty, v_empty, Doc, Sched, Hq, group, Nq, Nk, offset, win_left, win_right,
                               n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N, STAGES, PREFETCH,
                               DYNAMIC)
            c += 1
            i = gl.atomic_add(Counter, 1) + gl.num_programs(0)
        mbarrier.wait(q_empty, (c & 1) ^ 1, pred=c > 0)
        gl.store(Sched + gl.program_id(0), n_work)
        mbarrier.arrive(q_bar, count=1)
    else:
        for k in range(0, gl.cdiv(n_work, gl.num_programs(0))):
            i, valid = _work_item(k, n_work)
            if valid:
                g0 = _ws3p_produce(i, c, g0, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars,
                                   v_bars, k_empty, v_empty, Doc, Sched, Hq, group, Nq, Nk, offset, win_left,
                                   win_right, n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N, STAGES,
                                   PREFETCH, DYNAMIC)
                c += 1


@gluon.jit
def _ws3p_consume(i, c, g0, q2, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty, Out, Lse, Doc,
                  stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset, qk_scale, win_left, win_right, n_m,
                  n_work, sec, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                  TILE_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                  STAGES: gl.constexpr, WG: gl.constexpr, num_warps: gl.constexpr, WAIT_Q: gl.constexpr):
    """Consumer ``WG``'s part of work item ``i``, the program's ``c``-th: rows ``WG * BLOCK_M + [0, BLOCK_M)`` of
    the item's query tile of ``TILE_M`` rows (:func:`_ws3_rounds` from ring position ``g0``), Q released before the
    epilogue. ``WAIT_Q``: wait for the item's Q here (after the item's ranges); else the caller has. Returns the next
    item's ring position."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    tile_m, bh, b, h, hk = _work_coords(i, n_m, n_work // n_m, sec, Hq, group, HAS_RIGHT, TILE_M)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)
    lo, hi, flo, fhi = _band_kv_range(tile_m, Nq, Nk, offset, win_left, win_right, DocQb, QLob, QHib,
                                      HAS_LEFT, HAS_RIGHT, DOCS, TILE_M, BLOCK_N)
    n_tiles = hi - lo
    start_m = tile_m + WG * BLOCK_M
    d_first, d_last = _doc_span(start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout)), Nq,
                                QLob, QHib, DOCS)
    if WAIT_Q:
        mbarrier.wait(q_bar, c & 1)
    acc, m_i, l_i = _ws3_rounds(q2, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, q_bar, q_bar, g0,
                                start_m, lo, n_tiles, flo, fhi, Nk, offset, qk_scale, win_left, win_right,
                                d_first, d_last, Doc, HAS_LEFT, HAS_RIGHT, DOCS, False, BLOCK_M, BLOCK_N,
                                HEAD_D, STAGES, WG, False, True, num_warps)
    _cta_barrier()  # every warp's S products are done: Q may be reloaded
    mbarrier.arrive(q_empty, count=1)
    _epilogue(acc, m_i, l_i, Out, Lse, b, h, bh, start_m, Nq, stride_ob, stride_oh, stride_on, BLOCK_M,
              HEAD_D, s_layout, o_layout)
    return g0 + n_tiles


@gluon.jit
def _ws3p_consumer(q2, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty, Out, Lse, Doc, Sched,
                   stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset, qk_scale, win_left, win_right, n_m,
                   n_work, sec, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                   TILE_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                   STAGES: gl.constexpr, WG: gl.constexpr, num_warps: gl.constexpr, DYNAMIC: gl.constexpr):
    """Consumer ``WG`` of the persistent forward: the program's work items in turn (:func:`_ws3p_consume`), the
    same ones as the producer's (static: the snake; ``DYNAMIC``: the index the producer wrote to
    ``Sched[program]`` before its Q load, read once ``q_bar`` says that load (or the stop) arrived)."""
    g0 = 0
    c = 0
    if DYNAMIC:
        mbarrier.wait(q_bar, 0)
        i = gl.load(Sched + gl.program_id(0), volatile=True)
        while i < n_work:
            g0 = _ws3p_consume(i, c, g0, q2, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty,
                               Out, Lse, Doc, stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset, qk_scale,
                               win_left, win_right, n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS, TILE_M, BLOCK_M,
                               BLOCK_N, HEAD_D, STAGES, WG, num_warps, False)
            c += 1
            mbarrier.wait(q_bar, c & 1)
            i = gl.load(Sched + gl.program_id(0), volatile=True)
    else:
        for k in range(0, gl.cdiv(n_work, gl.num_programs(0))):
            i, valid = _work_item(k, n_work)
            if valid:
                g0 = _ws3p_consume(i, c, g0, q2, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty,
                                   Out, Lse, Doc, stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset,
                                   qk_scale, win_left, win_right, n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS,
                                   TILE_M, BLOCK_M, BLOCK_N, HEAD_D, STAGES, WG, num_warps, True)
                c += 1


@gluon.jit
def _gl_fwd_ws3p_kernel(q_desc, k_desc, v_desc, Out, Lse, stride_ob, stride_oh, stride_on,
                        Hq, Nq, Nk, offset, group, qk_scale, win_left, win_right, Doc, n_m, n_work, sec,
                        Counter, Sched, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                        STAGES: gl.constexpr, num_warps: gl.constexpr, PREFETCH: gl.constexpr = 2,
                        DYNAMIC: gl.constexpr = False):
    """``gluon_ws3p``: the persistent forward described above. Grid ``(P,)`` with ``P <= n_work = n_m * B * Hq``
    (``n_m = cdiv(Nq, BLOCK_M)``), one program per SM; ``sec``: heads per section (>= 1); ``DYNAMIC``: items claimed
    from the int32 counter ``Counter`` (zero at the launch) and handed over through the int32 ``Sched (P,)``
    (neither read otherwise); the other arguments as :func:`_gl_fwd_ws3_kernel`'s (band masks and documents; no
    block-sparse table)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    q2 = q_smem.reshape([BLOCK_M, HEAD_D])
    HALF: gl.constexpr = BLOCK_M // 2
    gl.warp_specialize(
        [(_ws3p_consumer, (q2.slice(0, HALF), k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty, Out,
                           Lse, Doc, Sched, stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset, qk_scale,
                           win_left, win_right, n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, HALF, BLOCK_N,
                           HEAD_D, STAGES, 0, num_warps, DYNAMIC)),
         (_ws3p_consumer, (q2.slice(HALF, HALF), k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty, v_empty,
                           Out, Lse, Doc, Sched, stride_ob, stride_oh, stride_on, Hq, group, Nq, Nk, offset,
                           qk_scale, win_left, win_right, n_m, n_work, sec, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, HALF,
                           BLOCK_N, HEAD_D, STAGES, 1, 4, DYNAMIC)),
         (_ws3p_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_bars, v_bars, k_empty,
                           v_empty, Doc, Counter, Sched, Hq, group, Nq, Nk, offset, win_left, win_right, n_m, n_work,
                           sec, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N, STAGES, PREFETCH, DYNAMIC))],
        [4, 1], [240, 24])


# ------------------------------------------------------------------------------------------------ gluon backward
# FA3's backward layout (issue 30; FlashAttention-3 Alg. 2 / sec. 3), one program per (batch, K/V head, key tile of
# BLOCK_N rows): K and V stay in shared memory, dK and dV in registers for the whole program; a 1-warp producer
# partition streams the (Q, dO) tiles of BLOCK_M query rows of every query head of the GQA group through a
# STAGES-deep mbarrier ring (one "ready" barrier per slot, TMA byte count; one "empty" barrier per slot, one arrive
# by the consumer); the default partition (num_warps = 8: two warpgroups, 64 key rows each in the M = BLOCK_N wgmmas)
# runs, per query tile (transposed products, keys on the rows):
#
#   S^T = K Q^T,  P^T = exp2(S^T * scale * log2(e) - lse2)      (lse2 = lse * log2(e), +inf on empty rows: P = 0)
#   dP^T = V dO^T,  dV += P^T dO  (P^T from registers)
#   dS^T = P^T * (dP^T - delta)  -> shared memory (bf16 / fp16)
#   dK += dS^T Q  (dS^T from shared memory),  dQ_partial = dS K  (the transposed view of the same buffer; M = 64
#   query rows split over the two warpgroups along D)  -> fp32 atomics into DQA (B, Hq, Nq, D)   [WRITE_DQ only]
#
# The wgmmas of a tile are issued asynchronously in two groups (S^T with dP^T, then dV, dK, dQ) so the
# exponentials run while dP^T is in flight. Causal (bottom-right): query tiles entirely above the key tile are never
# loaded; only the tiles crossing the diagonal run the element mask (a uniform branch per tile). Rows past Nq arrive
# as zeros with lse2 = +inf (P = 0, no dQ store); key rows past Nk are zero (no dQ contribution) and not stored.
#
# Two options (constexprs), each timed on its own (docs/kernels.md):
# * WRITE_DQ: True: dQ as above (fp32 atomics, not deterministic: FlashConfig(deterministic=True) refuses it);
#   False: no dS K product, no atomics, no DQA: the kernel computes dK / dV only and the host runs the Triton dQ
#   kernel of bwd.py (FlashConfig(gluon_bwd_dq="triton")), which is deterministic.
# * LSE_TMA: how the query tile's lse2 / delta rows reach the consumer. False: gl.load from global memory into the
#   replicated column layout (16 registers per thread each, live across the wgmma waits: the D = 128 spills).
#   True: the producer copies them by TMA into the ring with the tile's Q / dO (1-D descriptors over flat fp32
#   buffers with a row stride lse_stride = Nq rounded up to a multiple of 4, a box of BLOCK_M; the tile's coordinate
#   is (b * Hq + h) * lse_stride + start_m) and the consumer reads them from shared memory just before use (FA3
#   does the same). The coordinate must be a multiple of 4 (TMA's innermost coordinate must be 16-byte aligned:
#   an unaligned one raises cudaErrorIllegalInstruction, as the first GPU run did with Nq = 1), hence the stride
#   (the host pads copies of lse2 / delta when Nq % 4 != 0). A ragged last tile's columns past Nq then hold the
#   padding's zeros, the next head's values or zeros past the buffer: lse2 is set to +inf there (P = 0), in a
#   branch only that tile takes.


@gluon.jit
def _bwd_q_range(start_n, Nq, offset, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """``(m_lo, cnt, m_mask_hi)``: the key tile from ``start_n`` is visited by query tiles ``[m_lo, m_lo + cnt)``;
    those below ``m_mask_hi`` cross the causal diagonal and run the element mask (query i sees keys j <= i +
    offset)."""
    n_m = gl.cdiv(Nq, BLOCK_M)
    if CAUSAL:
        m_lo = gl.maximum(start_n - offset, 0) // BLOCK_M  # last row of the tile reaches the first key
        m_mask_hi = gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M)
    else:
        m_lo = n_m * 0
        m_mask_hi = n_m * 0
    cnt = gl.maximum(n_m - m_lo, 0)
    return m_lo, cnt, m_mask_hi


@gluon.jit
def _bwd_producer(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                  delta_smem, kv_bar, ready, empty, b, hk, group, Hq, lse_stride, start_n, m_lo, cnt, Row,
                  SPARSE: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, LSE_TMA: gl.constexpr):
    """Producer partition (1 warp): K and V once, then the (Q, dO) tile (and with ``LSE_TMA`` its lse2 / delta
    rows) of every (query head of the group, visited query tile: ``m_lo + [0, cnt)``, or with ``SPARSE`` the
    block-table row ``Row``'s), in the consumer's order; a slot is refilled once the consumer released the tile
    ``STAGES`` back."""
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [b, hk, start_n, 0], kv_bar, k_smem)
    _tma_load(v_desc, [b, hk, start_n, 0], kv_bar, v_smem)
    nbytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    for i in range(0, group * cnt):
        h = hk * group + i // cnt
        start_m = _key_tile(m_lo, i % cnt, Row, SPARSE) * BLOCK_M  # (the row's query tile with SPARSE)
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1, pred=i >= STAGES)
        if LSE_TMA:
            mbarrier.expect(ready.index(slot), nbytes + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        else:
            mbarrier.expect(ready.index(slot), nbytes)
        _tma_load(q_desc, [b, h, start_m, 0], ready.index(slot), q_smem.index(slot))
        _tma_load(do_desc, [b, h, start_m, 0], ready.index(slot), do_smem.index(slot))
        if LSE_TMA:
            # a multiple of 4 (lse_stride is, and start_m): TMA's innermost coordinate must be 16-byte aligned, else
            # the copy raises an illegal instruction (int32: the buffers hold B * Hq * lse_stride < 2^31 values)
            row = (b * Hq + h) * lse_stride + start_m
            _tma_load(lse_desc, [row], ready.index(slot), lse_smem.index(slot))
            _tma_load(delta_desc, [row], ready.index(slot), delta_smem.index(slot))


@gluon.jit
def _store_dkdv(dk, dv, sm_scale, start, Nk, DK, DV, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                stride_vn, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, kv_layout: gl.constexpr):
    """The backward consumers' epilogue: ``dk * sm_scale`` and ``dv`` (fp32, ``kv_layout``) of key rows
    ``[start, start + BLOCK_N)`` stored in the dtypes of ``DK`` / ``DV`` (rows >= ``Nk`` masked). Casts first (half
    the registers), one output at a time (64-bit addresses cost two registers each)."""
    dk16 = (dk * sm_scale).to(DK.dtype.element_ty)
    dv16 = dv.to(DV.dtype.element_ty)
    rows_o = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    cols_o = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, kv_layout))
    ok_o = gl.expand_dims(rows_o < Nk, 1)
    rows64 = gl.expand_dims(rows_o.to(gl.int64), 1)
    dk_base = DK + b.to(gl.int64) * stride_kb + hk.to(gl.int64) * stride_kh
    gl.store(dk_base + rows64 * stride_kn + gl.expand_dims(cols_o, 0), dk16, mask=ok_o)
    dv_base = DV + b.to(gl.int64) * stride_vb + hk.to(gl.int64) * stride_vh
    gl.store(dv_base + rows64 * stride_vn + gl.expand_dims(cols_o, 0), dv16, mask=ok_o)


@gluon.jit
def _zero_keys_past_nk(pt, keys, start, Nk, BLOCK_N: gl.constexpr):
    """The fused dQ's guard: ``P^T`` (keys on the rows) zero on the key rows past ``Nk`` of a last, ragged key tile
    (TMA's zero rows: S = 0 there, P = 2^-lse2, which overflows for a very negative lse2 and would reach dQ as
    inf * 0 without a causal edge to mask it); other tiles unchanged."""
    if start + BLOCK_N > Nk:
        pt = gl.where(gl.expand_dims(keys < Nk, 1), pt, 0.0)
    return pt


@gluon.jit
def _dq_reduce_add(dq, dq_smem, DQA, b, h, start_m, BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr):
    """The fused dQ's add (``DQ_TMA``): the query tile's dQ (fp32 registers, ``(BLOCK_M, HEAD_D)``) to ``dq_smem``,
    then one TMA reduce-add into the buffer ``DQA`` describes (rows past Nq clipped by the descriptor). The caller
    waits for the previous add (``tma.store_wait(0)`` and a barrier) before calling again."""
    dq_smem.reshape([BLOCK_M, HEAD_D]).store(dq)
    fence_async_shared()
    _cta_barrier()  # every warp's rows are in dq_smem before the copy engine reads it
    _tma_reduce_add(DQA, [b, h, start_m, 0], dq_smem)


@gluon.jit
def _bwd_consumer(k_smem, v_smem, q_smem, do_smem, ds_smem, lse_smem, delta_smem, kv_bar, ready, empty, DQA, Lse2,
                  Delta, DK, DV, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, b, hk, group, Hq,
                  Nq, Nk, offset, start_n, m_lo, cnt, m_mask_hi, qk_scale, sm_scale, dq_smem, CAUSAL: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                  WRITE_DQ: gl.constexpr, LSE_TMA: gl.constexpr, DQ_TMA: gl.constexpr, num_warps: gl.constexpr):
    """Default partition (``num_warps`` = 8, two warpgroups): the per-tile schedule above, then ``dK * sm_scale``
    and ``dV`` stored (rows < Nk) in DK's / DV's dtype at the given strides (unit last stride). ``DQ_TMA``
    (``WRITE_DQ`` only): ``DQA`` is a TMA descriptor over the fp32 ``(B, Hq, Nq, D)`` buffer and each tile's dQ goes
    to ``dq_smem`` then by one bulk reduce-add into the buffer (no per-element atomics; rows past Nq clipped by the
    descriptor)."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])  # (BLOCK_N, BLOCK_M)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])  # (BLOCK_N, HEAD_D)
    WN: gl.constexpr = num_warps // 4
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WN],
                                                        instr_shape=[16, HEAD_D // WN, 16])  # (BLOCK_M, HEAD_D)
    pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query column (replicated over keys)
    dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
    k2 = k_smem.reshape([BLOCK_N, HEAD_D])
    v2 = v_smem.reshape([BLOCK_N, HEAD_D])
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))  # (WRITE_DQ only)
    dq_cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, dq_layout))
    mbarrier.wait(kv_bar, 0)  # also when no tile is visited: the program must not exit with the copy in flight
    for i in range(0, group * cnt):
        h = hk * group + i // cnt
        t = m_lo + i % cnt
        start_m = t * BLOCK_M
        row0 = (b * Hq + h).to(gl.int64) * Nq
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        q2 = q_smem.index(slot).reshape([BLOCK_M, HEAD_D])
        do2 = do_smem.index(slot).reshape([BLOCK_M, HEAD_D])
        s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)  # (made here, not held across tiles)
        st_t = warpgroup_mma(k2, q2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dpt_t = warpgroup_mma(v2, do2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if LSE_TMA:  # lse2 from the slot, read once S^T is done (shared memory: short latency, nothing held)
            st = warpgroup_mma_wait(1, deps=(st_t, ))  # S^T done; dP^T may still run
            lse2 = lse_smem.index(slot).load(col_layout)
            if start_m + BLOCK_M > Nq:  # ragged last tile: the columns past Nq read padding / another head's rows
                cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                lse2 = gl.where(cols < Nq, lse2, float("inf"))
        else:
            # the query columns' rows of lse2 / delta: loaded late (16 registers per thread each; cols recomputed
            # where used rather than held across the wgmmas, which spilled)
            cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
            lse2 = gl.load(Lse2 + row0 + cols, mask=cols < Nq, other=float("inf"))
            st = warpgroup_mma_wait(1, deps=(st_t, ))  # S^T done; dP^T may still run
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
        if CAUSAL:
            if t < m_mask_hi:  # the tile crosses the diagonal: key j visible to query i iff j <= i + offset
                cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                ok = gl.expand_dims(keys, 1) <= gl.expand_dims(cols + offset, 0)
                pt = gl.where(ok, pt, 0.0)
        if WRITE_DQ:
            pt = _zero_keys_past_nk(pt, keys, start_n, Nk, BLOCK_N)
        pt_op = gl.convert_layout(pt.to(dtype), pt_layout)
        dv = warpgroup_mma(pt_op, do2, dv, is_async=True)
        if LSE_TMA:
            dpt, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dv, pt_op))  # (dV too: frees P^T's registers)
            delta = delta_smem.index(slot).load(col_layout)
        else:
            cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
            delta = gl.load(Delta + row0 + cols, mask=cols < Nq, other=0.0)
            dpt, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dv, pt_op))  # (dV too: frees P^T's registers)
        dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
        ds_smem.store(dst)  # (the previous tile's wgmmas that read ds_smem were waited for: see the barrier below)
        fence_async_shared()
        _cta_barrier()  # both warpgroups' halves of dS^T are written before either warpgroup's wgmma reads all
        dk = warpgroup_mma(ds_smem, q2, dk, is_async=True)
        if WRITE_DQ:
            dq_zero = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=dq_layout)
            dq_t = warpgroup_mma(ds_smem.permute((1, 0)), k2, dq_zero, use_acc=False, is_async=True)
            dk, dq = warpgroup_mma_wait(0, deps=(dk, dq_t))
        else:
            dk = warpgroup_mma_wait(0, deps=(dk, ))
        if DQ_TMA:
            tma.store_wait(0)  # the previous tile's reduce-add has read dq_smem (the issuing thread waits; the
            # barrier below makes every thread wait for it)
        _cta_barrier()  # every warp's wgmmas of this slot (and of ds_smem) are done: release the slot
        mbarrier.arrive(empty.index(slot), count=1)
        if WRITE_DQ:
            if DQ_TMA:
                _dq_reduce_add(dq, dq_smem, DQA, b, h, start_m, BLOCK_M, HEAD_D)
            else:
                rows = start_m + dq_rows
                offs = gl.expand_dims(rows, 1) * HEAD_D + gl.expand_dims(dq_cols, 0)  # int32 within one head's rows
                gl.atomic_add(DQA + row0 * HEAD_D + offs, dq, mask=gl.expand_dims(rows < Nq, 1), sem="relaxed")
    if DQ_TMA:
        tma.store_wait(0)  # the last reduce-add has read dq_smem before the program ends
    _store_dkdv(dk, dv, sm_scale, start_n, Nk, DK, DV, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                stride_vn, BLOCK_N, HEAD_D, kv_layout)


@gluon.jit
def _gl_bwd_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, DQA, Lse2, Delta, DK, DV,
                   stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                   Hq, Hkv, Nq, Nk, offset, group, lse_stride, qk_scale, sm_scale,
                   CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                   STAGES: gl.constexpr, WRITE_DQ: gl.constexpr, LSE_TMA: gl.constexpr, DQ_TMA: gl.constexpr,
                   num_warps: gl.constexpr):
    """``bwd_impl="gluon"``: grid ``(cdiv(Nk, BLOCK_N), B * Hkv)``. ``DQA`` fp32 ``(B, Hq, Nq, D)`` zeroed (gets
    ``dS K`` unscaled; ``WRITE_DQ`` only, else never read; with ``DQ_TMA`` a TMA descriptor over it, a block of
    ``[1, 1, BLOCK_M, HEAD_D]`` with a 128-byte swizzle, added to by TMA reduce-add), ``Lse2`` / ``Delta`` fp32
    ``(B, Hq, Nq)`` contiguous
    from the Triton preprocess, and ``lse_desc`` / ``delta_desc`` 1-D TMA descriptors with a box of ``BLOCK_M`` over
    the same values laid out with a row stride of ``lse_stride`` (a multiple of 4, ``>= Nq``: padded copies when
    ``Nq % 4 != 0``, kernels.flash.gluon.lse_tma_rows; read with ``LSE_TMA``, else the pointers are), ``DK`` / ``DV``
    the ``(B, Hkv, Nk, D)`` outputs (strides given, unit last stride). ``qk_scale = sm_scale * log2(e)``."""
    dtype: gl.constexpr = q_desc.dtype
    start_n = gl.program_id(0) * BLOCK_N  # low key tiles have the most query tiles (causal): heaviest first
    bhk = gl.program_id(1)
    b = bhk // Hkv
    hk = bhk % Hkv
    m_lo, cnt, m_mask_hi = _bwd_q_range(start_n, Nq, offset, CAUSAL, BLOCK_M, BLOCK_N)
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    if LSE_TMA:
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                               delta_desc.layout)
    else:  # (placeholders, never touched)
        lse_smem = ds_smem
        delta_smem = ds_smem
    if DQ_TMA:
        dq_smem = gl.allocate_shared_memory(gl.float32, DQA.block_type.shape, DQA.layout)
    else:
        dq_smem = ds_smem  # (placeholder, never touched)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [(_bwd_consumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, lse_smem, delta_smem, kv_bar, ready, empty, DQA,
                          Lse2, Delta, DK, DV, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, b, hk,
                          group, Hq, Nq, Nk, offset, start_n, m_lo, cnt, m_mask_hi, qk_scale, sm_scale, dq_smem,
                          CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, WRITE_DQ, LSE_TMA, DQ_TMA, num_warps)),
         (_bwd_producer, (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                          lse_smem, delta_smem, kv_bar, ready, empty, b, hk, group, Hq, lse_stride, start_n, m_lo,
                          cnt, 0, False, STAGES, BLOCK_M, LSE_TMA))],
        [1], [24])


# ------------------------------------------------------------------------------------ gluon backward, two consumers
# The dK / dV-only variant (WRITE_DQ=False; FlashConfig(gluon_bwd_consumers=2), which needs gluon_bwd_dq="triton" or
# "gluon"): the program's BLOCK_N = 128 keys are split between two 1-warpgroup consumer PARTITIONS (FA3 sec. 3.1's
# layout applied to the backward) instead of one 8-warp partition: consumer w owns key rows [start_n + 64 w, + 64)
# (its slice of the K / V tiles in shared memory) and its own dK / dV accumulators, and both read every (Q, dO) slot
# of the one ring (so Q / dO traffic per key is that of the 8-warp kernel; a slot's empty barrier expects one arrive
# per consumer). What changes against the 8-warp partition:
# * no dS^T buffer in shared memory: without dQ nobody else needs dS^T, so it stays in registers as the A operand of
#   dK += dS^T Q (as P^T is for dV): no store, no fence, and no barrier across the two warpgroups per tile (the
#   8-warp kernel's two warpgroups met at two 256-thread barriers per tile and so ran their exponentials in lockstep,
#   with the tensor cores idle);
# * each warpgroup synchronises with its own 128 threads only, so the two drift apart and one's elementwise work can
#   overlap the other's wgmmas; PINGPONG makes that explicit: the two take turns to issue a tile's S^T / dP^T pair
#   (the turn barriers and their phases as in the forward's ping-pong above: _pp_wait / _pp_pass).
# Masks (issues 27 / 30): dense, causal and the band masks (HAS_LEFT / HAS_RIGHT window edges with runtime win_left /
# win_right, causal being HAS_RIGHT with win_right = 0; DOCS: packed documents, the table Doc): the program's 128 keys
# are seen by the query tiles [lo, hi) of _band_q_range, which the producer streams for every query head of the group;
# each consumer computes its own range [lo_w, hi_w) at its 64 keys (at most one tile narrower at each end: causal,
# the query tile above consumer 1's keys) and releases the tiles outside it without any wgmma (a uniform branch);
# both consumers walk the same tile sequence. The element mask (_band_ok, query rows on the columns of the
# transposed scores) runs only on the tiles outside the consumer's full range [flo_w, fhi_w) (dense: never; rows
# past Nq have lse2 = +inf, so P = 0, and key rows past Nk are never stored). Rows that see no key: lse2 = +inf.


@gluon.jit
def _key_row_span(keys, Nq, Nk, offset, win_left, win_right, KLob, KHib, HAS_LEFT: gl.constexpr,
                  HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr):
    """``(rlo, rhi)``: the query rows ``[rlo, rhi)`` that see each key of ``keys`` (int32, any 1-D layout) under the
    band mask: ``i >= j - win_right - offset`` (HAS_RIGHT), ``i <= j + win_left - offset`` (HAS_LEFT), ``k_lo(j) <=
    i < k_hi(j)`` (DOCS: the rows of ``j``'s document, ``KLob`` / ``KHib`` the batch row's ``k_lo`` / ``k_hi``;
    documents are contiguous runs, so this is ``doc_q(i) == doc_k(j)``); keys past ``Nk``: empty. The element rule of
    :func:`_band_ok` turned around: a key's visible rows are one span, so the transposed scores' mask is two
    compares against values per key row (a few registers per thread) instead of a rule per query column. Rows past
    ``Nq`` are not excluded (the backward's lse2 is ``+inf`` there: P = 0)."""
    rlo = keys * 0
    rhi = rlo + Nq
    if HAS_RIGHT:
        rlo = keys - win_right - offset
    if HAS_LEFT:
        rhi = gl.minimum(rhi, keys + win_left - offset + 1)
    if DOCS:
        rlo = gl.maximum(rlo, gl.load(KLob + keys, mask=keys < Nk, other=0))
        rhi = gl.minimum(rhi, gl.load(KHib + keys, mask=keys < Nk, other=0))
    rhi = gl.where(keys < Nk, rhi, rlo)
    return rlo, rhi


@gluon.jit
def _dkdv_probs(st, lse2, t, start_m, flo_w, fhi_w, keys, rlo, rhi, Nq, Nk, offset, win_left, win_right, qk_scale,
                HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr,
                col_layout: gl.constexpr):
    """``P^T = exp2(S^T * qk_scale - lse2)`` of query tile ``t`` (rows from ``start_m``) against the consumer's
    ``keys``, zero where the band / document rule hides a pair (on a partial tile only: ``t`` outside ``[flo_w,
    fhi_w)``; with ``DOCS``, ``[rlo, rhi)`` the rows each key sees)."""
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if HAS_LEFT or HAS_RIGHT or DOCS:
        if (t < flo_w) | (t >= fhi_w):  # a partial tile of this consumer's band: the element rule
            i2 = gl.expand_dims(start_m + gl.arange(0, BLOCK_M, layout=col_layout), 0)  # query rows
            if DOCS:  # the rows that see each key, one span per key row (held: fewer registers)
                ok = (i2 >= gl.expand_dims(rlo, 1)) & (i2 < gl.expand_dims(rhi, 1))
            else:
                ok = _band_ok(i2, gl.expand_dims(keys, 1), Nq, Nk, offset, win_left, win_right, rlo, rlo,
                              HAS_LEFT, HAS_RIGHT, False)
            pt = gl.where(ok, pt, 0.0)
    return pt


@gluon.jit
def _dkdv_release(empty, i, STAGES: gl.constexpr):
    """This consumer's arrive on ring position ``i``'s empty barrier, after a barrier over its warps (every wgmma
    of theirs that read the slot was waited for)."""
    _cta_barrier()
    mbarrier.arrive(empty.index(i % STAGES), count=1)


@gluon.jit
def _dkdv_overlap_tile(dk, dv, ds_smem, k2, v2, q_smem, do_smem, lse_smem, delta_smem, ready, empty, Lse2, Delta,
                       row0, i, t, start_m, Nq, Nk, offset, win_left, win_right, flo_w, fhi_w, keys, rlo, rhi,
                       qk_scale, PREV: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                       DOCS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                       STAGES: gl.constexpr, LSE_TMA: gl.constexpr, num_warps: gl.constexpr):
    """One visited query tile (ring position ``i``, query tile ``t`` from row ``start_m``) of
    :func:`_dkdv_overlap_head`: issues ``S^T``, ``dP^T`` and, with ``PREV``, the previous visited tile's ``dK +=
    dS^T Q`` (its dS^T in ``ds_smem``, ``Q`` of position ``i - 1``); forms ``P^T`` while ``dP^T`` (and that ``dK``)
    run; issues ``dV += P^T dO``; waits for ``dP^T``, ``dV`` (and that ``dK``: then position ``i - 1`` is released
    and ``ds_smem`` free); writes ``dS^T`` to ``ds_smem``. Returns ``(dk, dv)`` (this tile's dK is issued by the
    next one, with ``PREV``). (Forming dS^T while dV runs as well keeps P^T's registers live: it spilled at D 128,
    and triton 3.6's ptxas crashed on it.)"""
    dtype: gl.constexpr = k2.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])  # (BLOCK_N, BLOCK_M)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])  # (BLOCK_N, HEAD_D)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)  # P^T
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    slot = i % STAGES
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    q2 = q_smem.index(slot).reshape([BLOCK_M, HEAD_D])
    do2 = do_smem.index(slot).reshape([BLOCK_M, HEAD_D])
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
    st_t = warpgroup_mma(k2, q2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dpt_t = warpgroup_mma(v2, do2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if PREV:
        dk_t = warpgroup_mma(ds_smem, q_smem.index((i - 1) % STAGES).reshape([BLOCK_M, HEAD_D]), dk, is_async=True)
    if not LSE_TMA:
        cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
        lse2 = gl.load(Lse2 + row0 + cols, mask=cols < Nq, other=float("inf"))
    if PREV:
        st = warpgroup_mma_wait(2, deps=(st_t, ))  # S^T done; dP^T and the previous dK may still run
    else:
        st = warpgroup_mma_wait(1, deps=(st_t, ))
    if LSE_TMA:
        lse2 = lse_smem.index(slot).load(col_layout)
        if start_m + BLOCK_M > Nq:  # ragged last tile: columns past Nq read padding / another head's rows
            cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
            lse2 = gl.where(cols < Nq, lse2, float("inf"))
    pt = _dkdv_probs(st, lse2, t, start_m, flo_w, fhi_w, keys, rlo, rhi, Nq, Nk, offset, win_left, win_right,
                     qk_scale, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, col_layout)
    pt_op = gl.convert_layout(pt.to(dtype), op_layout)
    dv_t = warpgroup_mma(pt_op, do2, dv, is_async=True)
    if not LSE_TMA:
        cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
        delta = gl.load(Delta + row0 + cols, mask=cols < Nq, other=0.0)
    if PREV:  # dP^T, the previous dK (ds_smem free) and dV done
        dpt, dk, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dk_t, dv_t, pt_op))
        _dkdv_release(empty, i - 1, STAGES)  # Q_{i-1} read by its dK
    else:
        dpt, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dv_t, pt_op))
    if LSE_TMA:  # (read here, once P^T's operand registers are free)
        delta = delta_smem.index(slot).load(col_layout)
    ds_smem.store((pt * (dpt - gl.expand_dims(delta, 0))).to(dtype))
    fence_async_shared()
    _cta_barrier()  # every warp's rows of dS^T are in ds_smem for the next dK
    return dk, dv


@gluon.jit
def _dkdv_overlap_head(dk, dv, ds_smem, k2, v2, q_smem, do_smem, lse_smem, delta_smem, ready, empty, Lse2, Delta, h,
                       base, b, Hq, Nq, Nk, offset, win_left, win_right, m_lo, cnt, Row, lo_w, hi_w, flo_w, fhi_w,
                       keys, rlo, rhi, qk_scale, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                       DOCS: gl.constexpr, SPARSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HEAD_D: gl.constexpr, STAGES: gl.constexpr, LSE_TMA: gl.constexpr, num_warps: gl.constexpr):
    """Query head ``h`` of a two-consumer dK / dV program with FA3's intra-warpgroup overlap
    (``_gl_bwd_dkdv2_kernel``'s ``OVERLAP``; FlashAttention-3, sec. 3.2): the head's ``cnt`` ring positions ``base +
    [0, cnt)`` (query tiles ``m_lo + [0, cnt)``, or the block-table row's with ``SPARSE``). Positions outside the
    consumer's tiles ``[lo_w, hi_w)`` are released unread; each visited one runs :func:`_dkdv_overlap_tile`, whose
    ``dK`` (dS^T through ``ds_smem``, the consumer's own ``(BLOCK_N, BLOCK_M)`` buffer) runs under the next tile's
    exponentials; the last one's ``dK`` alone. The products and their order are the plain loop's: the same ``dk`` /
    ``dv``. Returns them."""
    row0 = (b * Hq + h).to(gl.int64) * Nq
    v_lo = gl.minimum(gl.maximum(lo_w - m_lo, 0), cnt)  # the visited positions [v_lo, v_hi) of the head's cnt
    v_hi = gl.maximum(gl.minimum(hi_w - m_lo, cnt), v_lo)
    for p in range(0, v_lo):  # tiles before any of this consumer's keys is seen: released unread
        mbarrier.wait(ready.index((base + p) % STAGES), ((base + p) // STAGES) & 1)
        _dkdv_release(empty, base + p, STAGES)
    if v_hi > v_lo:
        dk, dv = _dkdv_overlap_tile(dk, dv, ds_smem, k2, v2, q_smem, do_smem, lse_smem, delta_smem, ready, empty,
                                    Lse2, Delta, row0, base + v_lo, m_lo + v_lo,
                                    _key_tile(m_lo, v_lo, Row, SPARSE) * BLOCK_M, Nq, Nk, offset, win_left, win_right,
                                    flo_w, fhi_w, keys, rlo, rhi, qk_scale, False, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M,
                                    BLOCK_N, HEAD_D, STAGES, LSE_TMA, num_warps)
        for p in range(v_lo + 1, v_hi):
            dk, dv = _dkdv_overlap_tile(dk, dv, ds_smem, k2, v2, q_smem, do_smem, lse_smem, delta_smem, ready,
                                        empty, Lse2, Delta, row0, base + p, m_lo + p,
                                        _key_tile(m_lo, p, Row, SPARSE) * BLOCK_M, Nq, Nk, offset, win_left,
                                        win_right, flo_w, fhi_w, keys, rlo, rhi, qk_scale, True, HAS_LEFT, HAS_RIGHT,
                                        DOCS, BLOCK_M, BLOCK_N, HEAD_D, STAGES, LSE_TMA, num_warps)
        last = base + v_hi - 1  # the last visited tile's dK
        dk_t = warpgroup_mma(ds_smem, q_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_D]), dk, is_async=True)
        dk = warpgroup_mma_wait(0, deps=(dk_t, ))
        _dkdv_release(empty, last, STAGES)
    for p in range(v_hi, cnt):  # tiles after the last one seen: released unread
        mbarrier.wait(ready.index((base + p) % STAGES), ((base + p) // STAGES) & 1)
        _dkdv_release(empty, base + p, STAGES)
    return dk, dv


@gluon.jit
def _bwd_consumer2(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, ready, empty, my_turn, other_turn,
                   Lse2, Delta, DK, DV, Doc, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, b, hk,
                   group, Hq, Nq, Nk, offset, win_left, win_right, start_n, m_lo, cnt, nfull, Row, qk_scale,
                   sm_scale, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                   SPARSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                   STAGES: gl.constexpr, LSE_TMA: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr,
                   num_warps: gl.constexpr, DQA, ds_smem, dq_smem, DQ_TMA: gl.constexpr,
                   OVERLAP: gl.constexpr = False):
    """Consumer ``WG`` (0 or 1, one warpgroup) of ``_gl_bwd_dkdv2_kernel``: key rows ``[start_n + WG * BLOCK_N, +
    BLOCK_N)`` (``BLOCK_N``: the consumer's rows, half the program's) against the ring's slots (query tiles ``[m_lo,
    m_lo + cnt)`` of each query head of the group, in the producer's order; with ``SPARSE`` the block-table row
    ``Row``'s ``cnt`` tiles, its first ``nfull`` full), computing those its keys see, then ``dK * sm_scale`` / ``dV``
    stored (rows < Nk). ``DQ_TMA``: also this consumer's part of each tile's dQ, ``dS K`` over its keys: dS^T to
    ``ds_smem`` (its own ``(BLOCK_N, BLOCK_M)``), the product into registers, then to ``dq_smem`` (its own fp32
    ``[1, 1, BLOCK_M, HEAD_D]``) and by one TMA reduce-add into the buffer ``DQA`` describes (both consumers add
    into the same rows); else those three are placeholders, never touched. ``OVERLAP`` (not with ``DQ_TMA`` or
    ``PINGPONG``): each query head's tiles run by :func:`_dkdv_overlap_head` (FA3's intra-warpgroup overlap)."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])  # (BLOCK_N, BLOCK_M)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])  # (BLOCK_N, HEAD_D)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)  # P^T, dS^T
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query column (replicated over keys)
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])  # (BLOCK_M, HEAD_D), DQ_TMA
    start_w = start_n + WG * BLOCK_N
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)  # (read with DOCS only)
    if SPARSE:  # every tile of the row (the band's element rule inside the partial ones: positions >= nfull)
        lo_w = m_lo * 0
        hi_w = lo_w + cnt
        flo_w = lo_w
        fhi_w = nfull
    elif HAS_LEFT or HAS_RIGHT or DOCS:
        # this consumer's query tiles [lo_w, hi_w), full ones [flo_w, fhi_w) (start clamped below Nk so the document
        # spans are read in range; a consumer whose keys all lie past Nk computes nothing)
        lo_w, hi_w, flo_w, fhi_w = _band_q_range(gl.minimum(start_w, Nk - 1), Nq, Nk, offset, win_left, win_right,
                                                 DocKb, KLob, KHib, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
        hi_w = gl.where(start_w < Nk, hi_w, lo_w)
    else:  # dense: every streamed tile, none masked
        lo_w = m_lo
        hi_w = m_lo + cnt
        flo_w = lo_w
        fhi_w = hi_w
    dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=kv_layout)
    k2 = k_smem.reshape([2 * BLOCK_N, HEAD_D]).slice(WG * BLOCK_N, BLOCK_N)
    v2 = v_smem.reshape([2 * BLOCK_N, HEAD_D]).slice(WG * BLOCK_N, BLOCK_N)
    # the query rows [rlo, rhi) that see each of this consumer's keys (the element rule of the partial tiles)
    keys = start_w + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    if DOCS:
        rlo, rhi = _key_row_span(keys, Nq, Nk, offset, win_left, win_right, KLob, KHib, HAS_LEFT, HAS_RIGHT, DOCS)
    else:
        rlo = keys
        rhi = keys
    mbarrier.wait(kv_bar, 0)  # also when no tile is visited: the program must not exit with the copy in flight
    if OVERLAP and not DQ_TMA and not PINGPONG:
        for hh in range(0, group):
            dk, dv = _dkdv_overlap_head(dk, dv, ds_smem, k2, v2, q_smem, do_smem, lse_smem, delta_smem, ready,
                                        empty, Lse2, Delta, hk * group + hh, hh * cnt, b, Hq, Nq, Nk, offset,
                                        win_left, win_right, m_lo, cnt, Row, lo_w, hi_w, flo_w, fhi_w, keys, rlo,
                                        rhi, qk_scale, HAS_LEFT, HAS_RIGHT, DOCS, SPARSE, BLOCK_M, BLOCK_N, HEAD_D,
                                        STAGES, LSE_TMA, num_warps)
    else:
        for i in range(0, group * cnt):
            h = hk * group + i // cnt
            t = m_lo + i % cnt  # (with SPARSE: the position in the table row, tested against [0, nfull))
            start_m = _key_tile(m_lo, i % cnt, Row, SPARSE) * BLOCK_M
            row0 = (b * Hq + h).to(gl.int64) * Nq
            slot = i % STAGES
            _pp_wait(my_turn, i, WG, PINGPONG)
            mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
            if (t >= lo_w) & (t < hi_w):  # (else: none of this consumer's keys is seen by the tile: nothing to add)
                q2 = q_smem.index(slot).reshape([BLOCK_M, HEAD_D])
                do2 = do_smem.index(slot).reshape([BLOCK_M, HEAD_D])
                s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
                st_t = warpgroup_mma(k2, q2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                dpt_t = warpgroup_mma(v2, do2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                _pp_pass(other_turn, PINGPONG)
                if LSE_TMA:
                    st = warpgroup_mma_wait(1, deps=(st_t, ))  # S^T done; dP^T may still run
                    lse2 = lse_smem.index(slot).load(col_layout)
                    if start_m + BLOCK_M > Nq:  # ragged last tile: columns past Nq read padding / another head's rows
                        cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                        lse2 = gl.where(cols < Nq, lse2, float("inf"))
                else:
                    cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                    lse2 = gl.load(Lse2 + row0 + cols, mask=cols < Nq, other=float("inf"))
                    st = warpgroup_mma_wait(1, deps=(st_t, ))
                pt = _dkdv_probs(st, lse2, t, start_m, flo_w, fhi_w, keys, rlo, rhi, Nq, Nk, offset, win_left,
                                 win_right, qk_scale, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, col_layout)
                if DQ_TMA:
                    pt = _zero_keys_past_nk(pt, keys, start_w, Nk, BLOCK_N)
                pt_op = gl.convert_layout(pt.to(dtype), op_layout)
                dv = warpgroup_mma(pt_op, do2, dv, is_async=True)
                if LSE_TMA:
                    dpt, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dv, pt_op))
                    delta = delta_smem.index(slot).load(col_layout)
                else:
                    cols = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                    delta = gl.load(Delta + row0 + cols, mask=cols < Nq, other=0.0)
                    dpt, dv, pt_op = warpgroup_mma_wait(0, deps=(dpt_t, dv, pt_op))
                dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
                ds_op = gl.convert_layout(dst, op_layout)
                dk = warpgroup_mma(ds_op, q2, dk, is_async=True)  # dS^T from registers: no shared memory, no barrier
                if DQ_TMA:
                    # dQ_part = dS K_w: dS^T through shared memory (the transposed A operand), M = BLOCK_M query rows
                    ds_smem.store(dst)  # (the previous tile's dQ wgmma that read it was waited for)
                    fence_async_shared()
                    tma.store_wait(0)  # the previous tile's reduce-add has read dq_smem (its issuing thread waits; the
                    _cta_barrier()  # barrier: every warp of this warpgroup, and every row of dS^T is in ds_smem)
                    dq_zero = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=dq_layout)
                    dq_t = warpgroup_mma(ds_smem.permute((1, 0)), k2, dq_zero, use_acc=False, is_async=True)
                    dk, ds_op, dq = warpgroup_mma_wait(0, deps=(dk, ds_op, dq_t))
                    _dq_reduce_add(dq, dq_smem, DQA, b, h, start_m, BLOCK_M, HEAD_D)
                else:
                    dk, ds_op = warpgroup_mma_wait(0, deps=(dk, ds_op))
            else:
                _pp_pass(other_turn, PINGPONG)
            _dkdv_release(empty, i, STAGES)  # this warpgroup's wgmmas of the slot are done (one of the two arrives)
    if DQ_TMA:
        tma.store_wait(0)  # the last reduce-add has read dq_smem before the partition ends
    _store_dkdv(dk, dv, sm_scale, start_w, Nk, DK, DV, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                stride_vn, BLOCK_N, HEAD_D, kv_layout)


@gluon.jit
def _gl_bwd_dkdv2_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, DQA, Lse2, Delta, DK, DV, Doc,
                         stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                         Hq, Hkv, Nq, Nk, offset, group, lse_stride, qk_scale, sm_scale, win_left, win_right,
                         QIdx, QCnt, QNfull, stride_tbl,
                         HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, LSE_TMA: gl.constexpr,
                         num_warps: gl.constexpr, PINGPONG: gl.constexpr = False, SPARSE: gl.constexpr = False,
                         DQ_TMA: gl.constexpr = False, OVERLAP: gl.constexpr = False):
    """``bwd_impl="gluon"`` with ``gluon_bwd_dq="triton"`` / ``"gluon"`` / ``"tma"`` and ``gluon_bwd_consumers=2``:
    the arguments of ``_gl_bwd_kernel`` (``DQA`` never read but with ``DQ_TMA``: then the TMA descriptor of the fp32
    dQ buffer both consumers reduce-add their parts into), dK / dV (and with ``DQ_TMA`` dQ), plus the mask:
    ``win_left`` / ``win_right`` (>= 0; read with ``HAS_LEFT`` / ``HAS_RIGHT``; causal is ``HAS_RIGHT`` with
    ``win_right = 0``) and ``Doc`` the int32 document table ``(B, 3 * Nq + 3 * Nk)`` of kernels.flash.documents (read
    with ``DOCS`` only, else any pointer). ``BLOCK_N`` the program's key rows (even: two consumers of
    ``BLOCK_N // 2``), ``num_warps = 4`` (the default partition is consumer 0; a 4-warp worker consumer 1 and a 1-warp
    producer follow). Grid ``(cdiv(Nk, BLOCK_N), B * Hkv)``.

    ``SPARSE`` (a block-sparse layout whose blocks are whole ``BLOCK_M x BLOCK_N`` tiles; not with ``DOCS``):
    program ``(r, bhk)`` runs row ``r`` of the key-tile table ``QIdx (n_k_tiles, stride_tbl)`` of
    :func:`kernels.flash.sparse.layout_tables` (``keys=True``: column 0 its key tile, then ``QCnt[r]`` visited query
    tiles, the ``QNfull[r]`` full ones first), the band mask applying inside the partial ones; never read
    otherwise."""
    dtype: gl.constexpr = q_desc.dtype
    HALF: gl.constexpr = BLOCK_N // 2
    bhk = gl.program_id(1)
    b = bhk // Hkv
    hk = bhk % Hkv
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)  # (read with DOCS only)
    if SPARSE:  # table rows in schedule order (heaviest first)
        Row, start_n, cnt, nfull = _sparse_row(QIdx, QCnt, QNfull, stride_tbl, BLOCK_N)
        m_lo = 0
    else:
        Row = QIdx
        start_n = gl.program_id(0) * BLOCK_N  # (causal: low key tiles have the most query tiles: heaviest first)
        lo, hi, flo, fhi = _band_q_range(start_n, Nq, Nk, offset, win_left, win_right, DocKb, KLob, KHib, HAS_LEFT,
                                         HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
        m_lo = lo  # the query tiles [lo, hi) of every query head of the group stream through the ring
        cnt = hi - lo
        nfull = cnt
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    if LSE_TMA:
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                               delta_desc.layout)
    else:  # (placeholders, never touched)
        lse_smem = q_smem
        delta_smem = q_smem
    if DQ_TMA or (OVERLAP and not PINGPONG):  # each consumer's own dS^T tile
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_M], dtype)
        ds0 = gl.allocate_shared_memory(dtype, [HALF, BLOCK_M], ds_layout)
        ds1 = gl.allocate_shared_memory(dtype, [HALF, BLOCK_M], ds_layout)
    else:  # (placeholders, never touched)
        ds0 = q_smem
        ds1 = q_smem
    if DQ_TMA:  # and dQ tile
        dq0 = gl.allocate_shared_memory(gl.float32, DQA.block_type.shape, DQA.layout)
        dq1 = gl.allocate_shared_memory(gl.float32, DQA.block_type.shape, DQA.layout)
    else:  # (placeholders, never touched)
        dq0 = q_smem
        dq1 = q_smem
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # (one allocation each: see ws3)
    turn1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer
    mbarrier.init(turn0, count=1)
    mbarrier.init(turn1, count=1)
    fence_async_shared()
    gl.warp_specialize(
        [(_bwd_consumer2, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, ready, empty, turn0, turn1,
                           Lse2, Delta, DK, DV, Doc, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                           b, hk, group, Hq, Nq, Nk, offset, win_left, win_right, start_n, m_lo, cnt, nfull, Row,
                           qk_scale, sm_scale, HAS_LEFT, HAS_RIGHT, DOCS, SPARSE, BLOCK_M, HALF, HEAD_D, STAGES,
                           LSE_TMA, 0, PINGPONG, num_warps, DQA, ds0, dq0, DQ_TMA, OVERLAP)),
         (_bwd_consumer2, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar, ready, empty, turn1, turn0,
                           Lse2, Delta, DK, DV, Doc, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                           b, hk, group, Hq, Nq, Nk, offset, win_left, win_right, start_n, m_lo, cnt, nfull, Row,
                           qk_scale, sm_scale, HAS_LEFT, HAS_RIGHT, DOCS, SPARSE, BLOCK_M, HALF, HEAD_D, STAGES,
                           LSE_TMA, 1, PINGPONG, 4, DQA, ds1, dq1, DQ_TMA, OVERLAP)),
         (_bwd_producer, (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                          lse_smem, delta_smem, kv_bar, ready, empty, b, hk, group, Hq, lse_stride, start_n, m_lo,
                          cnt, Row, SPARSE, STAGES, BLOCK_M, LSE_TMA))],
        [4, 1], [240, 24])


# ------------------------------------------------------------------------------------------------- gluon backward, dQ
# The dQ pass (FlashConfig(gluon_bwd_dq="gluon"), after either dK / dV kernel) in the shape of the ws3 forward: one
# program per (batch, query head, query tile of BLOCK_M = 128 rows), split between two 1-warpgroup consumer
# partitions of BLOCK_M / 2 rows each, against the BLOCK_N-key tiles of the query head's K/V head (GQA: h // group)
# that a 1-warp producer partition streams by TMA through STAGES-deep K and V rings (_kv_ring_fill, the forward's:
# split K / V ready and empty barriers, each empty barrier expecting one arrive per consumer). Q and dO of the tile
# arrive once (one barrier); lse2 / delta are per query ROW here (one or two registers per thread in the wgmma row
# layout), loaded once from the preprocess's buffers. Per consumer, key tile j runs
#
#   S_j = Q K_j^T,  P_j = exp2(S_j * scale * log2(e) - lse2)   (element mask on band-edge / ragged-end tiles only)
#   dP_j = dO V_j^T,  dS_j = P_j * (dP_j - delta)  -> registers, the A operand of  dQ += dS_j K_j
#
# as one "issue round" per tile (FA3's intra-warpgroup overlap, as the forward's P V): round j issues dQ += dS_{j-1}
# K_{j-1}, S_j and dP_j (three async groups), waits for the first two (then K_{j-1} is released), computes P_j while
# dP_j runs, waits for dP_j (V_j released) and forms dS_j; one last round issues dQ += dS_{n-1} K_{n-1}. dQ stays in
# fp32 registers and is stored once, times sm_scale (rows < Nq). No atomics: deterministic.
# Band masks (the forward's: windows, causal, documents; bottom-right, offset = Nk - Nq): the program visits the key
# tiles [lo, hi) its 128 rows see (_band_kv_range). A consumer's 64 rows may see fewer (causal: consumer 0's rows reach
# up to 64 keys fewer), so it computes the prefix [lo, hi_w) of the program's range, hi_w from its own rows by the
# same function (its element mask outside its own full band [flo_w, fhi_w); tiles of [lo, hi_w) left of its own
# range are masked entirely, P = 0), and releases the remaining tiles unread (after their ready barrier: an early
# second arrive on a count-2 barrier would be counted in the wrong phase). A consumer whose rows all lie past Nq
# (Nq < 64 in the last tile) computes nothing either. Rows past Nq arrive as zeros with lse2 = +inf (P = 0), rows that
# see no key have lse2 = +inf from the preprocess too; key rows past Nk are masked (the ragged end tile is partial).


@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty,
                 v_empty, b, h, hk, start_m, lo, n_tiles, Row, SPARSE: gl.constexpr, STAGES: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Producer partition (1 warp) of ``_gl_bwd_dq_kernel``: Q and dO once (one barrier), then the K / V rings
    (key tiles ``lo + [0, n_tiles)``, or with ``SPARSE`` the block-table row ``Row``'s)."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    _tma_load(q_desc, [b, h, start_m, 0], q_bar, q_smem)
    _tma_load(do_desc, [b, h, start_m, 0], q_bar, do_smem)
    _kv_ring_fill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty, b, hk, lo, n_tiles, Row, SPARSE,
                  STAGES, BLOCK_N)


@gluon.jit
def _dq_probs(s, lse2, t, tp, flo, fhi, first, last, qk_scale, HAS_LEFT: gl.constexpr, DOCS: gl.constexpr,
              BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """``P = exp2(S * qk_scale - lse2)`` of key tile ``t`` (fp32, wgmma layout) against rows whose visible key spans
    are ``[first, last]`` (:func:`_row_span`), zero where masked (:func:`_span_ok`, only where ``tp`` lies outside
    ``[flo, fhi)``: ``tp`` is ``t`` for band masks, the round for a block-sparse table row, :func:`_full_pos`)."""
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
    if _partial_tile(tp, flo, fhi, HAS_LEFT, DOCS):  # band edge / diagonal / document boundary / ragged end
        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(_span_ok(cols, first, last, HAS_LEFT, DOCS), p, 0.0)
    return p


@gluon.jit
def _dq_consumer(q2, do2, k_smem, v_smem, q_bar, k_bars, v_bars, k_empty, v_empty, Lse2, Delta, DQ, stride_qb,
                 stride_qh, stride_qn, Doc, b, h, bh, start_m, lo, n_tiles, nfull, Row, Nq, Nk, offset, qk_scale,
                 sm_scale, win_left, win_right, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                 SPARSE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                 STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One consumer (one warpgroup) of ``_gl_bwd_dq_kernel``: ``BLOCK_M`` query rows from ``start_m`` (``q2`` /
    ``do2`` their Q / dO rows in shared memory) against key tiles ``lo + [0, n_w)``, the prefix of the program's
    ``lo + [0, n_tiles)`` its rows reach (the schedule above; ring position ``j`` holds tile ``lo + j``), then ``dQ *
    sm_scale`` stored (rows < Nq) at DQ's strides (unit last stride). With ``SPARSE`` the key tiles are the block-table
    row ``Row``'s ``n_tiles`` (its first ``nfull`` full), all of them computed (the band's element rule inside the
    partial ones)."""
    dtype: gl.constexpr = q2.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # (BLOCK_M, BLOCK_N)
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])  # (BLOCK_M, HEAD_D)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)  # (DOCS only; never read otherwise)
    # this consumer's rows' key tiles (from a row < Nq: the range reads the document table at its first row)
    if SPARSE:
        flo = lo * 0
        fhi = nfull
        n_w = n_tiles
    else:
        lo_w, hi_w, flo, fhi = _band_kv_range(gl.minimum(start_m, Nq - 1), Nq, Nk, offset, win_left, win_right,
                                              DocQb, QLob, QHib, HAS_LEFT, HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
        n_w = gl.minimum(gl.maximum(hi_w - lo, 0), n_tiles)  # the prefix [lo, hi_w) of the program's range
    n_w = gl.where(start_m < Nq, n_w, 0)  # (rows all past Nq: nothing to add)
    rows = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    k_first, k_last = _row_span(rows, Nq, Nk, offset, win_left, win_right, QLob, QHib, HAS_LEFT, HAS_RIGHT, DOCS)
    lse2 = gl.load(Lse2 + bh.to(gl.int64) * Nq + rows, mask=rows < Nq, other=float("inf"))
    delta = gl.load(Delta + bh.to(gl.int64) * Nq + rows, mask=rows < Nq, other=0.0)
    dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=dq_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)  # also when no key is visited: the program must not exit with the copy in flight
    if n_w > 0:
        # round 0: S_0 and dP_0
        mbarrier.wait(k_bars.index(0), 0)
        s_t = warpgroup_mma(q2, k_smem.index(0).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero, use_acc=False,
                            is_async=True)
        mbarrier.wait(v_bars.index(0), 0)
        dp_t = warpgroup_mma(do2, v_smem.index(0).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                             use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_t, ))
        t0 = _key_tile(lo, 0, Row, SPARSE)
        p = _dq_probs(s, lse2, t0, _full_pos(0, t0, SPARSE), flo, fhi, k_first, k_last, qk_scale, HAS_LEFT, DOCS,
                      BLOCK_N, s_layout)
        dp = warpgroup_mma_wait(0, deps=(dp_t, ))
        _cta_barrier()  # every warp's wgmmas of V_0 are done: release it
        mbarrier.arrive(v_empty.index(0), count=1)
        ds = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), ds_layout)
        for j in range(1, n_w):
            slot = j % STAGES
            pslot = (j - 1) % STAGES
            tj = _key_tile(lo, j, Row, SPARSE)  # (a table load with SPARSE: issued before the waits)
            dq_t = warpgroup_mma(ds, k_smem.index(pslot).reshape([BLOCK_N, HEAD_D]), dq, is_async=True)
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            s_t = warpgroup_mma(q2, k_smem.index(slot).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                                use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
            dp_t = warpgroup_mma(do2, v_smem.index(slot).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                                 use_acc=False, is_async=True)
            dq, ds, s = warpgroup_mma_wait(1, deps=(dq_t, ds, s_t))  # dQ_{j-1} and S_j done; dP_j may still run
            _cta_barrier()  # every warp's wgmmas of K_{j-1} are done: release it
            mbarrier.arrive(k_empty.index(pslot), count=1)
            p = _dq_probs(s, lse2, tj, _full_pos(j, tj, SPARSE), flo, fhi, k_first, k_last, qk_scale, HAS_LEFT, DOCS,
                          BLOCK_N, s_layout)
            dp = warpgroup_mma_wait(0, deps=(dp_t, ))
            _cta_barrier()
            mbarrier.arrive(v_empty.index(slot), count=1)
            ds = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), ds_layout)
        # last round: dQ += dS_{n-1} K_{n-1}
        lslot = (n_w - 1) % STAGES
        dq_t = warpgroup_mma(ds, k_smem.index(lslot).reshape([BLOCK_N, HEAD_D]), dq, is_async=True)
        dq, ds = warpgroup_mma_wait(0, deps=(dq_t, ds))
        _cta_barrier()
        mbarrier.arrive(k_empty.index(lslot), count=1)
    for t in range(n_w, n_tiles):  # (band / rows past Nq) the program's tiles this consumer's rows do not see
        slot = t % STAGES
        mbarrier.wait(k_bars.index(slot), (t // STAGES) & 1)
        mbarrier.wait(v_bars.index(slot), (t // STAGES) & 1)
        _cta_barrier()
        mbarrier.arrive(k_empty.index(slot), count=1)
        mbarrier.arrive(v_empty.index(slot), count=1)
    out = (dq * sm_scale).to(DQ.dtype.element_ty)
    rows_o = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    cols_o = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, dq_layout))
    base = DQ + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh
    ptrs = base + gl.expand_dims(rows_o.to(gl.int64) * stride_qn, 1) + gl.expand_dims(cols_o, 0)
    gl.store(ptrs, out, mask=gl.expand_dims(rows_o < Nq, 1))


@gluon.jit
def _gl_bwd_dq_kernel(q_desc, k_desc, v_desc, do_desc, Lse2, Delta, DQ, stride_qb, stride_qh, stride_qn,
                      Hq, Nq, Nk, offset, group, qk_scale, sm_scale, win_left, win_right, Doc, KvIdx, KvCnt,
                      KvNfull, stride_tbl, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DOCS: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                      STAGES: gl.constexpr, num_warps: gl.constexpr, SPARSE: gl.constexpr = False):
    """``gluon_bwd_dq="gluon"``: grid ``(cdiv(Nq, BLOCK_M), B * Hq)`` (``HAS_RIGHT``: heaviest query tiles first).
    The mask as the forward's (``_gl_fwd_ws3_kernel``): ``win_left`` / ``win_right`` with ``HAS_LEFT`` /
    ``HAS_RIGHT``, the document table ``Doc`` with ``DOCS``.
    ``q_desc`` / ``do_desc``: 4-D TMA descriptors over ``(B, Hq, Nq, D)`` with a box of ``BLOCK_M`` rows, ``k_desc``
    / ``v_desc`` over ``(B, Hkv, Nk, D)`` with ``BLOCK_N`` rows; ``Lse2`` / ``Delta`` fp32 ``(B, Hq, Nq)``
    contiguous from the Triton preprocess (``lse2 = lse * log2(e)``, ``+inf`` on empty rows); ``DQ`` the
    ``(B, Hq, Nq, D)`` output (strides given, unit last stride). ``qk_scale = sm_scale * log2(e)``, ``offset = Nk -
    Nq``, ``group = Hq // Hkv``. ``num_warps = 4``: the default partition is consumer 0 (rows ``[0, BLOCK_M / 2)``
    of the tile), a 4-warp worker consumer 1, a 1-warp worker the producer. ``SPARSE``: the key tiles of row ``r``
    of the query-tile table ``KvIdx`` (:func:`kernels.flash.sparse.layout_tables` at ``(BLOCK_M, BLOCK_N)``), as the
    forward's (``_gl_fwd_ws3_kernel``)."""
    dtype: gl.constexpr = q_desc.dtype
    HALF: gl.constexpr = BLOCK_M // 2
    start_m, bh, b, h, hk = _program_coords(Hq, group, HAS_RIGHT, BLOCK_M)
    DocQb, QLob, QHib, DocKb, KLob, KHib = _doc_rows(Doc, b, Nq, Nk)
    if SPARSE:  # table rows in schedule order (heaviest first)
        Row, start_m, n_tiles, nfull = _sparse_row(KvIdx, KvCnt, KvNfull, stride_tbl, BLOCK_M)
        lo = 0
    else:
        Row = KvIdx
        lo, hi, flo, fhi = _band_kv_range(start_m, Nq, Nk, offset, win_left, win_right, DocQb, QLob, QHib, HAS_LEFT,
                                          HAS_RIGHT, DOCS, BLOCK_M, BLOCK_N)
        n_tiles = hi - lo
        nfull = n_tiles
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrive per consumer
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    q2 = q_smem.reshape([BLOCK_M, HEAD_D])
    do2 = do_smem.reshape([BLOCK_M, HEAD_D])
    gl.warp_specialize(
        [(_dq_consumer, (q2.slice(0, HALF), do2.slice(0, HALF), k_smem, v_smem, q_bar, k_bars, v_bars, k_empty,
                         v_empty, Lse2, Delta, DQ, stride_qb, stride_qh, stride_qn, Doc, b, h, bh, start_m, lo,
                         n_tiles, nfull, Row, Nq, Nk, offset, qk_scale, sm_scale, win_left, win_right, HAS_LEFT,
                         HAS_RIGHT, DOCS, SPARSE, HALF, BLOCK_N, HEAD_D, STAGES, num_warps)),
         (_dq_consumer, (q2.slice(HALF, HALF), do2.slice(HALF, HALF), k_smem, v_smem, q_bar, k_bars, v_bars, k_empty,
                         v_empty, Lse2, Delta, DQ, stride_qb, stride_qh, stride_qn, Doc, b, h, bh, start_m + HALF, lo,
                         n_tiles, nfull, Row, Nq, Nk, offset, qk_scale, sm_scale, win_left, win_right, HAS_LEFT,
                         HAS_RIGHT, DOCS, SPARSE, HALF, BLOCK_N, HEAD_D, STAGES, 4)),
         (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_bars, v_bars,
                         k_empty, v_empty, b, h, hk, start_m, lo, n_tiles, Row, SPARSE, STAGES, BLOCK_N))],
        [4, 1], [240, 24])
