"""Linear attention with the 2nd-order Taylor feature map (Based) in its parallel (quadratic) form, fused in Triton.

The Taylor map of :mod:`attn_zoo.feature_maps` has ``phi(q) . phi(k) = 1 + s + s^2 / 2`` with
``s = q . k / sqrt(D)`` (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff", eq. 2), so the linear attention of Katharopoulos et al. 2020 (eq. 4) needs no feature vectors::

    out_i = sum_j w_ij v_j / (sum_j w_ij + eps),    w_ij = 1 + s_ij + s_ij^2 / 2   (j <= i + Nk - Nq when causal)

This module computes that sum as FlashAttention computes softmax attention: query tiles of ``BLOCK_M`` rows, key /
value tiles of ``BLOCK_N`` rows streamed through SRAM, the ``(N, N)`` weights never written. ``w >= 1/2`` needs no
running maximum. With 16-bit inputs ``w`` is rounded to the input dtype for the ``w V`` product, and the row sums
add the same rounded weights, so each output row stays a convex combination of ``v`` rows (bf16 output error against
fp32: 1.1-1.3x that of plain PyTorch in bf16 on the CPU interpreter, 1.7-1.9x when the sums took the unrounded
weights). The row sums ``den_i = sum_j w_ij + eps`` are kept (fp32, ``(B, H, Nq)``) for the backward, which
recomputes ``w`` (FlashAttention-2 Alg. 2 with these weights):

    dp_ij = do_i . v_j,  g_ij = (dp_ij - do_i . out_i) / den_i * (1 + s_ij)
    dq_i = sum_j g_ij k_j / sqrt(D),  dk_j = sum_i g_ij q_i / sqrt(D),  dv_j = sum_i w_ij / den_i do_i

Cost: ``O(Nq Nk D)`` time like exact attention (the chunked forms take ``O(N F Dv)`` with ``F = 1 + D + D^2``
features: 273 at ``D = 16``, past the chunked kernel's limit of 256 in :mod:`kernels.linear`), ``O(N)`` memory.
Based trains with this form; fla calls it ``parallel_based``. Inputs ``(B, H, N, D)`` float16 / bfloat16 /
float32 with ``D, Dv <= 256``; float16 runs in float32 (``w`` grows like ``s^2`` past the float16 range, as in the
``triton`` backend of ``linear``). GQA: ``Hq`` a multiple of ``Hkv``; ``dk`` / ``dv`` are summed over each group.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._host import _interpreting, cdiv, check_bool, launch, next_pow2

__all__ = ["taylor_parallel", "eps_reason", "check_qkv", "MAX_DIM"]

MAX_DIM = 256
"""Largest head dimension ``D`` and value dimension ``Dv`` (padded to a power of two in the kernels)."""
MAX_GRID_Y = 65535
"""Largest ``B * Hq`` (one program per (batch, query head) on grid axis 1, whose size CUDA caps at 65,535)."""


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UP: tl.constexpr):
    """tl.dot with fp32 accumulation. UP: upcast the operands first (the CPU interpreter's bfloat16 dot is wrong in
    some Triton versions; bfloat16 values are exact in float32, so the product is the same)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _keep(offs_m, offs_n, Nq, Nk, offset, CAUSAL: tl.constexpr, DOCb, DOCS: tl.constexpr):
    """(BLOCK_M, BLOCK_N) mask of the pairs that count: both in range and, causal, key j <= query i + offset;
    with DOCS, also query and key in one document (``DOCb``: this row's ``(Nk,)`` int32 document ids; query ``i``
    is in the document of key ``i + offset``, none when that is < 0)."""
    ok = (offs_m[:, None] < Nq) & (offs_n[None, :] < Nk)
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + offset)
    if DOCS:
        pq = offs_m + offset
        dq = tl.load(DOCb + tl.minimum(tl.maximum(pq, 0), Nk - 1), mask=(offs_m < Nq) & (offs_m < offs_m + Nk),
                     other=-1)
        dk = tl.load(DOCb + offs_n, mask=offs_n < Nk, other=-2)
        ok = ok & (dq[:, None] == dk[None, :]) & (pq[:, None] >= 0)
    return ok


@triton.jit
def _tile(base, rows, cols, stride, n_rows, n_cols):
    """The ``(len(rows), len(cols))`` tile of a matrix with row stride ``stride`` (columns contiguous) at ``base``;
    zeros outside ``n_rows x n_cols``."""
    return tl.load(base + rows[:, None] * stride + cols[None, :],
                   mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _heads(H, n_rep):
    """This program's (batch x query head) index ``bh`` (grid axis 1), batch ``b``, query head ``h`` and K/V head
    ``hk``, int64 (``b * stride_b`` passes 2^31 for large tensors)."""
    bh = tl.program_id(1).to(tl.int64)
    h = bh % H
    return bh, bh // H, h, h // n_rep


@triton.jit
def _key_end(pid_m, Nk, offset, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key any row of query tile ``pid_m`` sees (causal: ``j <= i + offset``)."""
    if CAUSAL:
        return tl.minimum(Nk, (pid_m + 1) * BLOCK_M + offset)
    else:
        return Nk


@triton.jit
def _taylor_fwd(Q, K, V, O, DEN, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
                H, n_rep, Nq, Nk, offset, DOC, scale, eps,
                CAUSAL: tl.constexpr, DOCS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                UP: tl.constexpr):
    pid_m = tl.program_id(0)
    bh, b, h, hk = _heads(H, n_rep)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    Qb = Q + b * sq_b + h * sq_h
    Kb = K + b * sk_b + hk * sk_h
    Vb = V + b * sv_b + hk * sv_h
    q = _tile(Qb, offs_m, offs_d, sq_n, Nq, HEAD_D)  # (BLOCK_M, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    den = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for start_n in range(0, _key_end(pid_m, Nk, offset, BLOCK_M, CAUSAL), BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _tile(Kb, offs_n, offs_d, sk_n, Nk, HEAD_D)  # (BLOCK_N, BLOCK_D)
        v = _tile(Vb, offs_n, offs_dv, sv_n, Nk, HEAD_DV)  # (BLOCK_N, BLOCK_DV)
        s = _dot(q, tl.trans(k), PREC, UP) * scale  # (BLOCK_M, BLOCK_N)
        w = tl.where(_keep(offs_m, offs_n, Nq, Nk, offset, CAUSAL, DOC + b * Nk, DOCS), 1.0 + s + 0.5 * s * s, 0.0)
        w = w.to(v.dtype)  # the weights the numerator uses (16-bit inputs: rounded) make the normaliser too
        den += tl.sum(w.to(tl.float32), 1)
        acc += _dot(w, v, PREC, UP)
    den = den + eps
    out = acc * (1.0 / den)[:, None]
    tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_n + offs_dv[None, :], out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DV))
    tl.store(DEN + bh * Nq + offs_m, den, mask=offs_m < Nq)


@triton.jit
def _taylor_bwd_dq(Q, K, V, DO, DEN, DELTA, DQ, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                   sd_b, sd_h, sd_n, H, n_rep, Nq, Nk, offset, DOC, scale,
                   CAUSAL: tl.constexpr, DOCS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                   UP: tl.constexpr):
    pid_m = tl.program_id(0)
    bh, b, h, hk = _heads(H, n_rep)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row = offs_m < Nq
    q = _tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_n, Nq, HEAD_D)  # (BLOCK_M, BLOCK_D)
    do = _tile(DO + b * sd_b + h * sd_h, offs_m, offs_dv, sd_n, Nq, HEAD_DV)  # (BLOCK_M, BLOCK_DV)
    rden = 1.0 / tl.load(DEN + bh * Nq + offs_m, mask=row, other=1.0)  # one division per row, none in the loop
    delta = tl.load(DELTA + bh * Nq + offs_m, mask=row, other=0.0)
    Kb = K + b * sk_b + hk * sk_h
    Vb = V + b * sv_b + hk * sv_h
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for start_n in range(0, _key_end(pid_m, Nk, offset, BLOCK_M, CAUSAL), BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _tile(Kb, offs_n, offs_d, sk_n, Nk, HEAD_D)  # (BLOCK_N, BLOCK_D)
        v = _tile(Vb, offs_n, offs_dv, sv_n, Nk, HEAD_DV)  # (BLOCK_N, BLOCK_DV)
        s = _dot(q, tl.trans(k), PREC, UP) * scale  # (BLOCK_M, BLOCK_N)
        dp = _dot(do, tl.trans(v), PREC, UP)
        g = tl.where(_keep(offs_m, offs_n, Nq, Nk, offset, CAUSAL, DOC + b * Nk, DOCS),
                     (dp - delta[:, None]) * rden[:, None] * (1.0 + s), 0.0)
        dq += _dot(g.to(k.dtype), k, PREC, UP)
    tl.store(DQ + b * sq_b + h * sq_h + offs_m[:, None] * sq_n + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=row[:, None] & (offs_d[None, :] < HEAD_D))


@triton.jit
def _taylor_bwd_dkdv(Q, K, V, DO, DEN, DELTA, DK, DV, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                     sd_b, sd_h, sd_n, sdk_b, sdk_h, sdk_n, sdv_b, sdv_h, sdv_n, H, n_rep, Nq, Nk, offset, DOC, scale,
                     CAUSAL: tl.constexpr, DOCS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                     UP: tl.constexpr):
    """dk / dv of one key tile of K/V head ``hk`` (grid axis 1: ``B * Hkv``), summed over the ``n_rep`` query heads
    that read it (GQA) in registers: DK / DV are ``(B, Hkv, Nk, .)`` fp32."""
    pid_n = tl.program_id(0)
    bkv = tl.program_id(1).to(tl.int64)  # int64: b * stride_b passes 2^31 for large tensors
    Hkv = H // n_rep
    b = bkv // Hkv
    hk = bkv % Hkv
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col = offs_n < Nk
    k = _tile(K + b * sk_b + hk * sk_h, offs_n, offs_d, sk_n, Nk, HEAD_D)  # (BLOCK_N, BLOCK_D)
    v = _tile(V + b * sv_b + hk * sv_h, offs_n, offs_dv, sv_n, Nk, HEAD_DV)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
    lo = 0
    if CAUSAL:  # the first query row that sees this tile's first key: i + offset >= pid_n * BLOCK_N
        lo = tl.maximum(pid_n * BLOCK_N - offset, 0) // BLOCK_M * BLOCK_M
    for r in range(0, n_rep):
        h = hk * n_rep + r
        bh = b * H + h
        Qb = Q + b * sq_b + h * sq_h
        DOb = DO + b * sd_b + h * sd_h
        for start_m in range(lo, Nq, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row = offs_m < Nq
            q = _tile(Qb, offs_m, offs_d, sq_n, Nq, HEAD_D)  # (BLOCK_M, BLOCK_D)
            do = _tile(DOb, offs_m, offs_dv, sd_n, Nq, HEAD_DV)  # (BLOCK_M, BLOCK_DV)
            rden = 1.0 / tl.load(DEN + bh * Nq + offs_m, mask=row, other=1.0)  # BLOCK_M divisions per tile
            delta = tl.load(DELTA + bh * Nq + offs_m, mask=row, other=0.0)
            keep = _keep(offs_m, offs_n, Nq, Nk, offset, CAUSAL, DOC + b * Nk, DOCS)
            s = _dot(q, tl.trans(k), PREC, UP) * scale  # (BLOCK_M, BLOCK_N)
            a = tl.where(keep, (1.0 + s + 0.5 * s * s) * rden[:, None], 0.0)  # normalised weights
            dv += _dot(tl.trans(a).to(do.dtype), do, PREC, UP)
            dp = _dot(do, tl.trans(v), PREC, UP)
            g = tl.where(keep, (dp - delta[:, None]) * rden[:, None] * (1.0 + s), 0.0)
            dk += _dot(tl.trans(g).to(q.dtype), q, PREC, UP)
    tl.store(DK + b * sdk_b + hk * sdk_h + offs_n[:, None] * sdk_n + offs_d[None, :], dk * scale,
             mask=col[:, None] & (offs_d[None, :] < HEAD_D))
    tl.store(DV + b * sdv_b + hk * sdv_h + offs_n[:, None] * sdv_n + offs_dv[None, :], dv,
             mask=col[:, None] & (offs_dv[None, :] < HEAD_DV))


def _meta(q: torch.Tensor, v: torch.Tensor, causal: bool) -> dict:
    bd, bdv = max(16, next_pow2(q.shape[-1])), max(16, next_pow2(v.shape[-1]))
    block = 64 if max(bd, bdv) <= 64 else 32
    return dict(CAUSAL=bool(causal), HEAD_D=q.shape[-1], HEAD_DV=v.shape[-1], BLOCK_D=bd, BLOCK_DV=bdv,
                BLOCK_M=block, BLOCK_N=block, PREC="ieee" if q.dtype == torch.float32 else "tf32",
                UP=q.dtype == torch.bfloat16 and _interpreting())


def _strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2)


def den_dummy(t: torch.Tensor) -> torch.Tensor:
    """A placeholder pointer for the document ids when there are none (never read: ``DOCS=False``)."""
    return torch.zeros(1, device=t.device, dtype=torch.int32)


class _TaylorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, eps: float, doc_ids=None):
        B, Hq, Nq, _ = q.shape
        Nk = k.shape[2]
        n_rep = Hq // k.shape[1]
        meta = _meta(q, v, causal)
        meta["DOCS"] = doc_ids is not None
        doc = doc_ids if doc_ids is not None else den_dummy(q)
        out = q.new_empty(B, Hq, Nq, v.shape[-1])
        den = torch.empty(B, Hq, Nq, device=q.device, dtype=torch.float32)
        scale = q.shape[-1] ** -0.5
        launch(_taylor_fwd, (cdiv(Nq, meta["BLOCK_M"]), B * Hq),
               (q, k, v, out, den, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                Hq, n_rep, Nq, Nk, Nk - Nq, doc, scale, float(eps)), **meta)
        ctx.save_for_backward(q, k, v, out, den)
        ctx.causal = causal
        ctx.doc_ids = doc_ids
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels' backward is not differentiable: refuse double backward
    def backward(ctx, dout):
        q, k, v, out, den = ctx.saved_tensors
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        n_rep = Hq // Hkv
        meta = _meta(q, v, ctx.causal)
        meta["DOCS"] = ctx.doc_ids is not None
        doc = ctx.doc_ids if ctx.doc_ids is not None else den_dummy(q)
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()  # (B, Hq, Nq): do_i . out_i
        scale = D ** -0.5
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq = dk = dv = None
        if need_q:
            dq = torch.empty_like(q)
            launch(_taylor_bwd_dq, (cdiv(Nq, meta["BLOCK_M"]), B * Hq),
                   (q, k, v, dout, den, delta, dq, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
                    Hq, n_rep, Nq, Nk, Nk - Nq, doc, scale), **meta)
        if need_k or need_v:  # one kernel makes both
            dk = torch.empty(B, Hkv, Nk, D, device=q.device, dtype=torch.float32)  # GQA groups summed in-kernel
            dv = torch.empty(B, Hkv, Nk, v.shape[-1], device=q.device, dtype=torch.float32)
            launch(_taylor_bwd_dkdv, (cdiv(Nk, meta["BLOCK_N"]), B * Hkv),
                   (q, k, v, dout, den, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
                    *_strides(dk), *_strides(dv), Hq, n_rep, Nq, Nk, Nk - Nq, doc, scale), **meta)
            dk = dk.to(k.dtype) if need_k else None
            dv = dv.to(v.dtype) if need_v else None
        return dq, dk, dv, None, None, None


_F32 = torch.finfo(torch.float32)


def eps_reason(eps) -> "str | None":
    """``None`` when ``eps`` can be the kernel's normaliser offset, else why not. The kernel adds ``eps`` in float32
    and multiplies by ``1 / den``: below float32's smallest normal number (~1.2e-38) ``1 / eps`` overflows and a
    row that sees no key would be ``0 * inf = NaN`` instead of 0; above its largest (~3.4e38) ``eps`` is ``inf``."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        return f"eps must be a finite float > 0, got {eps!r}"
    if not _F32.tiny <= eps <= _F32.max:
        return f"eps={eps!r} is outside float32's normal range [{_F32.tiny:.3g}, {_F32.max:.3g}] the kernel computes in"
    return None


def check_qkv(q, k, v, eps, max_d: int, max_dv: int, d_note: str = "") -> None:
    """The argument checks that :func:`taylor_parallel` and :func:`kernels.taylor_chunk.taylor_chunk` share: ``q
    (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)`` tensors of one dtype (float16, bfloat16,
    float32) on one CUDA device (or the CPU under ``TRITON_INTERPRET=1``), ``Hq`` a multiple of ``Hkv >= 1``,
    ``1 <= D <= max_d`` (``d_note``: why, appended to that message), ``Dv <= max_dv``, ``B * Hq <= 65535`` and
    :func:`eps_reason`. Returns ``None``; raises ``TypeError`` (a non-tensor) or ``ValueError`` naming the argument
    and its allowed values."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, N, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[-1] != D or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k must be (B, Hkv, Nk, D) and v (B, Hkv, Nk, Dv) for q {tuple(q.shape)}; "
                         f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Hq < 1 or k.shape[1] < 1 or Hq % k.shape[1]:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={k.shape[1]} (q.shape[1], k.shape[1]; both >= 1)")
    if not 1 <= D <= max_d:
        raise ValueError(f"head dim D={D} (q.shape[3]) must be in [1, {max_d}]{d_note}")
    if v.shape[-1] > max_dv:
        raise ValueError(f"value dim Dv={v.shape[-1]} (v.shape[3]) must be <= {max_dv}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype of float16, bfloat16, float32; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"the Triton kernel needs a CUDA device (got {q.device.type}; TRITON_INTERPRET=1 runs the "
                         f"CPU interpreter)")
    if B * Hq > MAX_GRID_Y:
        raise ValueError(f"B * Hq = {B} * {Hq} = {B * Hq} exceeds {MAX_GRID_Y} (the kernels' grid axis 1, CUDA's "
                         f"limit); split the batch")
    why = eps_reason(eps)
    if why is not None:
        raise ValueError(why)


def taylor_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    eps: float = 1e-6, doc_ids: "torch.Tensor | None" = None) -> torch.Tensor:
    """Taylor-map linear attention in the fused parallel form (module docstring), differentiable in q, k, v.

    Args:
        q: ``(B, Hq, Nq, D)``; k: ``(B, Hkv, Nk, D)``; v: ``(B, Hkv, Nk, Dv)``: one dtype (float16, bfloat16,
            float32), one CUDA device (or the CPU under ``TRITON_INTERPRET=1``), ``Hq`` a multiple of ``Hkv``,
            ``D, Dv <= 256``, ``B * Hq <= 65535``.
        causal: query ``i`` sees keys ``j <= i + Nk - Nq`` (bottom-right aligned; rows that see no key are 0).
        eps: added to the normaliser: a float in float32's normal range (``1.2e-38 <= eps <= 3.4e38``).
        doc_ids: optional int ``(B, Nk)``, nondecreasing (packed documents): query ``i`` (in the document of key
            ``i + Nk - Nq``) sees only keys of its own document (for causal, the state restarting at each start).

    Returns:
        ``(B, Hq, Nq, Dv)`` in ``q.dtype``.

    Raises:
        ValueError: shapes, dtypes, devices, ``causal`` (not a bool) or ``eps`` outside the above (the message
            names the argument); zero-size ``B``, ``Nq``, ``Nk`` or ``Dv`` give empty (or, ``Nk = 0``, zero)
            outputs. Double backward raises ``RuntimeError`` (the backward is not differentiable).
        TypeError: ``q``, ``k`` or ``v`` not a tensor.
    """
    check_qkv(q, k, v, eps, MAX_DIM, MAX_DIM)
    B = q.shape[0]
    check_bool("causal", causal)
    if doc_ids is not None:
        if tuple(doc_ids.shape) != (B, k.shape[2]) or doc_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"doc_ids must be int32 / int64 of shape (B, Nk)={(B, k.shape[2])}, got {doc_ids.dtype} "
                             f"{tuple(doc_ids.shape)}")
        if doc_ids.device != q.device:
            raise ValueError(f"doc_ids must be on q's device {q.device}, got {doc_ids.device}")
        doc_ids = doc_ids.to(torch.int32).contiguous()
    if q.dtype == torch.float16:  # w = 1 + s + s^2 / 2 leaves the float16 range from |s| ~ 360: float32 end to end
        return _TaylorParallel.apply(q.float().contiguous(), k.float().contiguous(), v.float().contiguous(),
                                     bool(causal), float(eps), doc_ids).to(torch.float16)
    return _TaylorParallel.apply(q.contiguous(), k.contiguous(), v.contiguous(), bool(causal), float(eps), doc_ids)
