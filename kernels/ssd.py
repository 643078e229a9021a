"""Chunked Triton kernel of Mamba-2's state-space duality (SSD, Dao & Gu 2024, "Transformers are SSMs"),
forward and backward.

The scan computed is, per batch ``b`` and head ``h`` (state ``S_t`` of shape ``(N, P)``, fp32)::

    S_t = exp(a_t) * S_{t-1} + B_t x_t^T          y_t = S_t^T C_t

with ``x (B, T, H, P)``, log-decay ``a (B, T, H)`` (``a <= 0``; Mamba-2 passes ``dt * A``, and ``x * dt``),
``B, C (B, T, G, N)`` (``G`` groups shared by ``H / G`` heads each). The sequence is cut into chunks of ``L``
positions. Within a chunk the output is the quadratic (attention-like) form ``(C B^T o decay) x`` with the segsum
decay mask ``decay[t, s] = exp(cum_t - cum_s)`` for ``s <= t`` (``cum`` the in-chunk cumulative sum of ``a``), plus
the state entering the chunk read by ``C`` (``exp(cum_t) C_t S``); the state is then passed to the next chunk
(``S <- exp(cum_L) S + sum_s exp(cum_L - cum_s) B_s x_s^T``). One program owns one ``(b, h)`` and a block of ``P``
and walks the chunks in order, its state in fp32 registers; the backward walks them in reverse, carrying
``dS`` (fp32), and reads the per-chunk states the forward stored. Every exponent is ``<= 0`` (no overflow).

The step-by-step recurrence it is tested against is :func:`attn_zoo.families.ssd.ssd_scan_naive`.
Requires ``N`` (d_state) and ``P`` (head dim) <= 256, chunk size a power of two in [16, 128].
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

__all__ = ["ssd_scan", "CHUNK_SIZES", "MAX_DIM"]

CHUNK_SIZES = (16, 32, 64, 128)
MAX_DIM = 256


def _pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


@triton.jit
def _ssd_fwd_kernel(X, A, BM, CM, Y, S0, ST, SF, SEG, T, H, HPG, NS, PD,
                    sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg, syb, syt, syh,
                    L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, HAS_S0: tl.constexpr,
                    STORE_ST: tl.constexpr, STORE_SF: tl.constexpr, DOCS: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_t = tl.arange(0, L)
    offs_n = tl.arange(0, BN)
    offs_p = pid_p * BP + tl.arange(0, BP)
    nm = offs_n < NS
    pm = offs_p < PD
    sp = offs_n[:, None] * PD + offs_p[None, :]  # (N, P) state offsets
    smask = nm[:, None] & pm[None, :]
    if HAS_S0:
        S = tl.load(S0 + pid_bh * NS * PD + sp, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BN, BP), dtype=tl.float32)
    causal = offs_t[:, None] >= offs_t[None, :]
    nchunks = tl.cdiv(T, L)
    for c in range(nchunks):
        t = c * L + offs_t
        tm = t < T
        x = tl.load(X + b * sxb + t[:, None] * sxt + h * sxh + offs_p[None, :], mask=tm[:, None] & pm[None, :],
                    other=0.0)
        a = tl.load(A + b * sab + t * sat + h * sah, mask=tm, other=0.0).to(tl.float32)
        Bc = tl.load(BM + b * sbb + t[:, None] * sbt + g * sbg + offs_n[None, :], mask=tm[:, None] & nm[None, :],
                     other=0.0)
        Cc = tl.load(CM + b * scb + t[:, None] * sct + g * scg + offs_n[None, :], mask=tm[:, None] & nm[None, :],
                     other=0.0)
        if STORE_ST:
            tl.store(ST + (pid_bh * nchunks + c) * NS * PD + sp, S, mask=smask)
        cum = tl.cumsum(a, 0)
        cum_last = tl.sum(a, 0)
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
        CB = tl.dot(Cc, tl.trans(Bc))  # (L, L) fp32
        M = (CB * decay).to(x.dtype)
        y = tl.dot(M, x) + ec[:, None] * tl.dot(Cc, S.to(Cc.dtype))
        tl.store(Y + b * syb + t[:, None] * syt + h * syh + offs_p[None, :], y.to(Y.dtype.element_ty),
                 mask=tm[:, None] & pm[None, :])
        Bw = (Bc.to(tl.float32) * w[:, None]).to(x.dtype)
        S = el * S + tl.dot(tl.trans(Bw), x)
    if STORE_SF:
        tl.store(SF + pid_bh * NS * PD + sp, S, mask=smask)


@triton.jit
def _ssd_bwd_kernel(X, A, BM, CM, DY, ST, DSF, DX, DB, DC, DA, DS0, SEG, T, H, HPG, NS, PD, NBH,
                    sxb, sxt, sxh, sab, sat, sah, sbb, sbt, sbg, scb, sct, scg,
                    L: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, HAS_DSF: tl.constexpr,
                    DOCS: tl.constexpr):
    # DX, DY: (B, T, H, P) contiguous; DB, DC: (nP, B, T, H, N) fp32 partials; DA: (nP, B, T, H) fp32 partials.
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_t = tl.arange(0, L)
    offs_n = tl.arange(0, BN)
    offs_p = pid_p * BP + tl.arange(0, BP)
    nm = offs_n < NS
    pm = offs_p < PD
    sp = offs_n[:, None] * PD + offs_p[None, :]
    smask = nm[:, None] & pm[None, :]
    if HAS_DSF:
        dS = tl.load(DSF + pid_bh * NS * PD + sp, mask=smask, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros((BN, BP), dtype=tl.float32)
    causal = offs_t[:, None] >= offs_t[None, :]
    nchunks = tl.cdiv(T, L)
    part = pid_p * NBH * T  # offset (in rows of (b, t, h)) of this P-block's partials
    for i in range(nchunks):
        c = nchunks - 1 - i
        t = c * L + offs_t
        tm = t < T
        tpm = tm[:, None] & pm[None, :]
        tnm = tm[:, None] & nm[None, :]
        x = tl.load(X + b * sxb + t[:, None] * sxt + h * sxh + offs_p[None, :], mask=tpm, other=0.0)
        rows = (b * T + t) * H + h  # (L,) row index into the contiguous (B, T, H, .) outputs
        dy = tl.load(DY + rows[:, None] * PD + offs_p[None, :], mask=tpm, other=0.0).to(x.dtype)
        a = tl.load(A + b * sab + t * sat + h * sah, mask=tm, other=0.0).to(tl.float32)
        Bc = tl.load(BM + b * sbb + t[:, None] * sbt + g * sbg + offs_n[None, :], mask=tnm, other=0.0)
        Cc = tl.load(CM + b * scb + t[:, None] * sct + g * scg + offs_n[None, :], mask=tnm, other=0.0)
        S = tl.load(ST + (pid_bh * nchunks + c) * NS * PD + sp, mask=smask, other=0.0)
        cum = tl.cumsum(a, 0)
        cum_last = tl.sum(a, 0)
        decay = tl.where(causal, tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
        ec = tl.exp(cum)
        w = tl.exp(cum_last - cum)
        el = tl.exp(cum_last)
        if DOCS:  # the forward's document masks (constants: the derivatives keep their form)
            sg = tl.load(SEG + b * T + t, mask=tm, other=2147483647)
            sg_last = tl.max(tl.where(tm, sg, -1), 0)
            prev = tl.load(SEG + b * T + tl.maximum(c * L - 1, 0))  # chunk 0: position 0's document
            decay = tl.where(sg[:, None] == sg[None, :], decay, 0.0)
            ec = tl.where(sg == prev, ec, 0.0)
            w = tl.where(sg == sg_last, w, 0.0)
            el = tl.where(sg_last == prev, el, 0.0)
        CB = tl.dot(Cc, tl.trans(Bc))
        M = CB * decay
        Bw = (Bc.to(tl.float32) * w[:, None]).to(x.dtype)
        dSx = dS.to(x.dtype)
        dx = tl.dot(tl.trans(M.to(x.dtype)), dy) + tl.dot(Bw, dSx)
        dyx = tl.dot(dy, tl.trans(x))  # (L, L): dy_t . x_s
        Ld = dyx * decay
        dC = tl.dot(Ld.to(x.dtype), Bc.to(x.dtype)) + ec[:, None] * tl.dot(dy, tl.trans(S.to(x.dtype)))
        dB = tl.dot(tl.trans(Ld.to(x.dtype)), Cc.to(x.dtype)) + w[:, None] * tl.dot(x, tl.trans(dSx))
        G = Ld * CB
        dcum = tl.sum(G, 1) - tl.sum(G, 0)
        yin = tl.dot(Cc, S.to(Cc.dtype))  # (L, P): C_t . S
        dcum += ec * tl.sum(dy.to(tl.float32) * yin, 1)
        bds = tl.dot(Bc, dSx.to(Bc.dtype))  # (L, P): B_s . dS
        r = w * tl.sum(x.to(tl.float32) * bds, 1)
        dcum -= r
        dlast = el * tl.sum(tl.sum(dS * S, 1), 0) + tl.sum(r, 0)
        # a_t enters cum_j for j >= t and cum_last: da_t = sum_{j >= t} dcum_j + dlast
        da = tl.sum(dcum, 0) - tl.cumsum(dcum, 0) + dcum + dlast
        tl.store(DX + rows[:, None] * PD + offs_p[None, :], dx.to(DX.dtype.element_ty), mask=tpm)
        tl.store(DB + (part + rows[:, None]) * NS + offs_n[None, :], dB, mask=tnm)
        tl.store(DC + (part + rows[:, None]) * NS + offs_n[None, :], dC, mask=tnm)
        tl.store(DA + part + rows, da, mask=tm)
        Cw = (Cc.to(tl.float32) * ec[:, None]).to(x.dtype)
        dS = tl.dot(tl.trans(Cw), dy).to(tl.float32) + el * dS
    tl.store(DS0 + pid_bh * NS * PD + sp, dS, mask=smask)


def _blocks(N: int, P: int, BH: int, block_p: Optional[int] = None):
    """``(BN, BP)``: d_state padded to a power of two, and the P-block: ``block_p`` if given, else 64 halved (down to
    16) while fewer than 264 programs (2 per H200 SM) would run: each program walks its chunks in order, so
    parallelism comes from ``B * H * P / BP`` only."""
    BN = _pow2(N)
    if block_p is not None:
        return BN, block_p
    BP = min(_pow2(P), 64)
    while BP > 16 and BH * triton.cdiv(P, BP) < 264:
        BP //= 2
    return BN, BP


class _SSDScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, Bm, Cm, initial_state, chunk_size, block_p, seg):
        Bsz, T, H, P = x.shape
        G, N = Bm.shape[2], Bm.shape[3]
        BN, BP = _blocks(N, P, Bsz * H, block_p)
        ctx.block_p = BP
        nP = triton.cdiv(P, BP)
        nchunks = triton.cdiv(T, chunk_size)
        x = x.contiguous() if x.stride(-1) != 1 else x
        Bm = Bm.contiguous() if Bm.stride(-1) != 1 else Bm
        Cm = Cm.contiguous() if Cm.stride(-1) != 1 else Cm
        y = torch.empty_like(x)
        need_grad = any(ctx.needs_input_grad[:5])
        states = torch.empty(Bsz * H, max(nchunks, 1), N, P, device=x.device, dtype=torch.float32) if need_grad else y
        final = torch.empty(Bsz, H, N, P, device=x.device, dtype=torch.float32)
        s0 = initial_state.float().contiguous() if initial_state is not None else final
        _ssd_fwd_kernel[(Bsz * H, nP)](
            x, a, Bm, Cm, y, s0, states, final, seg if seg is not None else final, T, H, H // G, N, P,
            x.stride(0), x.stride(1), x.stride(2), a.stride(0), a.stride(1), a.stride(2),
            Bm.stride(0), Bm.stride(1), Bm.stride(2), Cm.stride(0), Cm.stride(1), Cm.stride(2),
            y.stride(0), y.stride(1), y.stride(2),
            L=chunk_size, BN=BN, BP=BP, HAS_S0=initial_state is not None, STORE_ST=need_grad, STORE_SF=True,
            DOCS=seg is not None, num_warps=8 if BN * BP >= 8192 else 4)
        if need_grad:
            ctx.save_for_backward(x, a, Bm, Cm, states)
        ctx.chunk_size = chunk_size
        ctx.seg = seg
        ctx.has_s0 = initial_state is not None
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, a, Bm, Cm, states = ctx.saved_tensors
        Bsz, T, H, P = x.shape
        G, N = Bm.shape[2], Bm.shape[3]
        BN, BP = _blocks(N, P, Bsz * H, ctx.block_p)
        nP = triton.cdiv(P, BP)
        dy = dy.contiguous()
        dx = torch.empty(Bsz, T, H, P, device=x.device, dtype=x.dtype)
        dB = torch.empty(nP, Bsz, T, H, N, device=x.device, dtype=torch.float32)
        dC = torch.empty_like(dB)
        da = torch.empty(nP, Bsz, T, H, device=x.device, dtype=torch.float32)
        ds0 = torch.empty(Bsz, H, N, P, device=x.device, dtype=torch.float32)
        dsf = dfinal.float().contiguous() if dfinal is not None else ds0
        _ssd_bwd_kernel[(Bsz * H, nP)](
            x, a, Bm, Cm, dy, states, dsf, dx, dB, dC, da, ds0, ctx.seg if ctx.seg is not None else ds0,
            T, H, H // G, N, P, Bsz * H,
            x.stride(0), x.stride(1), x.stride(2), a.stride(0), a.stride(1), a.stride(2),
            Bm.stride(0), Bm.stride(1), Bm.stride(2), Cm.stride(0), Cm.stride(1), Cm.stride(2),
            L=ctx.chunk_size, BN=BN, BP=BP, HAS_DSF=dfinal is not None, DOCS=ctx.seg is not None, num_warps=8 if BN * BP >= 8192 else 4)
        hpg = H // G
        dB = dB.sum(0).view(Bsz, T, G, hpg, N).sum(3).to(Bm.dtype)
        dC = dC.sum(0).view(Bsz, T, G, hpg, N).sum(3).to(Cm.dtype)
        da = da.sum(0).to(a.dtype)
        return dx, da, dB, dC, (ds0 if ctx.has_s0 else None), None, None, None


def ssd_scan(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             initial_state: Optional[torch.Tensor] = None, chunk_size: int = 64,
             block_p: Optional[int] = None, doc_ids: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan ``S_t = exp(a_t) S_{t-1} + B_t x_t^T``, ``y_t = S_t^T C_t`` in the chunked Triton kernel.

    Args:
        x: ``(B, T, H, P)`` float16 / bfloat16 / float32 (Mamba-2 passes ``x * dt``).
        a: ``(B, T, H)`` float32 log-decay, ``<= 0`` (Mamba-2: ``dt * A``).
        B, C: ``(B, T, G, N)`` in ``x.dtype``; ``G`` divides ``H`` (head ``h`` reads group ``h // (H // G)``).
        initial_state: optional ``(B, H, N, P)`` state before position 0 (fp32; differentiable).
        chunk_size: power of two in [16, 128].
        block_p: columns of ``P`` per program (16, 32 or 64); None: 64, halved while fewer than 264 programs run.
        doc_ids: optional int ``(B, T)``, nondecreasing: the state restarts at each document start after
            position 0 (the decay product across a boundary is zero; ``initial_state`` belongs to the document at
            position 0), boundaries anywhere inside a chunk.

    Returns:
        ``y (B, T, H, P)`` in ``x.dtype`` and the final state ``(B, H, N, P)`` float32.
        Differentiable in ``x, a, B, C`` and ``initial_state`` (the final state's gradient is used if given).

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
    seg = None
    if doc_ids is not None:
        if tuple(doc_ids.shape) != (Bsz, T) or doc_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"doc_ids must be int32 / int64 of shape (B, T)={(Bsz, T)}, got {doc_ids.dtype} "
                             f"{tuple(doc_ids.shape)}")
        d = doc_ids.long()
        st = torch.ones_like(d, dtype=torch.int32)
        st[:, 1:] = (d[:, 1:] != d[:, :-1]).to(torch.int32)
        seg = st.cumsum(1, dtype=torch.int32).contiguous()  # 1-based document index per position
    return _SSDScan.apply(x, a.float(), B, C, initial_state, chunk_size, block_p, seg)
