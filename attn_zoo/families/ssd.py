"""Mamba-2 (SSD, Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality"): the scan's references and the ``mamba2`` sequence mixer.

The scan (per batch and head, state ``S (N, P)`` in fp32)::

    S_t = exp(dt_t * A) * S_{t-1} + dt_t * B_t x_t^T         y_t = S_t^T C_t + D * x_t

* :func:`ssd_scan_naive`: the step-by-step recurrence (the reference every other path is tested against).
* :func:`ssd_scan_chunked`: the chunked form in PyTorch (intra-chunk quadratic form with the segsum decay mask,
  inter-chunk state passing), differentiable by autograd; the CPU path of the mixer.
* :func:`kernels.ssd.ssd_scan`: the same chunked algorithm in chunk-parallel Triton kernels, forward and backward.
* :func:`ssd_step`: the O(1) recurrent decode step.
* :func:`ssd`: ``dt`` / ``A`` / ``D`` around any of them (``backend`` = ``triton`` | ``torch`` | ``naive`` | ``auto``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..mixers import register_mixer

__all__ = ["ssd", "ssd_scan_naive", "ssd_scan_chunked", "ssd_step", "Mamba2", "Mamba2State", "SSD_BACKENDS"]

SSD_BACKENDS = ("auto", "triton", "torch", "naive")


def _expand_groups(M: torch.Tensor, H: int) -> torch.Tensor:
    """``(B, T, G, N) -> (B, T, H, N)``: head ``h`` reads group ``h // (H // G)``."""
    return M.repeat_interleave(H // M.shape[2], dim=2)


def _starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` bool: ``t`` starts a document (``t == 0`` or ``doc_ids[:, t] != doc_ids[:, t - 1]``)."""
    d = doc_ids.long()
    st = torch.ones_like(d, dtype=torch.bool)
    st[:, 1:] = d[:, 1:] != d[:, :-1]
    return st


def ssd_scan_naive(x, a, B, C, initial_state=None, doc_ids=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step recurrence ``S_t = exp(a_t) S_{t-1} + B_t x_t^T``, ``y_t = S_t^T C_t`` (fp32 state).
    ``doc_ids (B, T)`` int or None: the state restarts at each document start after position 0
    (``S_t = B_t x_t^T`` there: the decay product across a boundary is zero).

    ``x (B, T, H, P)``, ``a (B, T, H)``, ``B, C (B, T, G, N)``, ``initial_state (B, H, N, P)`` or None.
    Returns ``y (B, T, H, P)`` in ``x.dtype`` and the final state ``(B, H, N, P)`` fp32 (fp64 for fp64 ``x``)."""
    Bsz, T, H, P = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    Bh, Ch = _expand_groups(B, H).to(acc), _expand_groups(C, H).to(acc)
    S = (initial_state.to(acc) if initial_state is not None
         else x.new_zeros(Bsz, H, B.shape[3], P, dtype=acc))
    st = _starts(doc_ids) if doc_ids is not None else None
    ys = []
    for t in range(T):
        dec = torch.exp(a[:, t].to(acc))
        if st is not None and t > 0:
            dec = torch.where(st[:, t, None], 0.0, dec)
        S = dec[..., None, None] * S + Bh[:, t, :, :, None] * x[:, t, :, None, :].to(acc)
        ys.append(torch.einsum("bhn,bhnp->bhp", Ch[:, t], S))
    return torch.stack(ys, 1).to(x.dtype), S


def _segsum(cum: torch.Tensor) -> torch.Tensor:
    """``cum (..., L) -> (..., L, L)``: ``cum_t - cum_s`` for ``s <= t``, ``-inf`` above the diagonal."""
    L = cum.shape[-1]
    d = cum[..., :, None] - cum[..., None, :]
    mask = torch.ones(L, L, dtype=torch.bool, device=cum.device).tril()
    return d.masked_fill(~mask, float("-inf"))


def _check_chunk_size(fn: str, chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be a positive int (e.g. 64), got {chunk_size!r}")


def _check_docs(doc_ids, x: torch.Tensor) -> None:
    """``doc_ids`` for ``x (B, T, H, P)``: int32 / int64, ``(B, T)``, x's device, nondecreasing (as every attention
    layer asks; :func:`attn_zoo.documents.check_doc_ids`, its sync once per tensor). Raises ValueError naming it."""
    if doc_ids is not None:
        from ..documents import check_doc_ids

        xt = x.transpose(1, 2)  # (B, H, T, P) view
        check_doc_ids(doc_ids, xt, xt)


def ssd_scan_chunked(x, a, B, C, initial_state=None, chunk_size: int = 64, doc_ids=None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD algorithm in PyTorch (same arguments and results as :func:`ssd_scan_naive`).
    With ``doc_ids``, the intra-chunk decay mask is also a document mask, a chunk's state keeps only its last
    document's tokens, and the carried state flows only into the tokens (and the next chunk) of the document
    running at the chunk's start."""
    _check_chunk_size("ssd_scan_chunked", chunk_size)
    Bsz, T, H, P = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    L = chunk_size
    pad = (-T) % L
    Bh, Ch = _expand_groups(B, H).to(acc), _expand_groups(C, H).to(acc)
    xa, aa = x.to(acc), a.to(acc)
    if pad:
        xa, Bh, Ch = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xa, Bh, Ch))
        aa = F.pad(aa, (0, 0, 0, pad))
    nc = (T + pad) // L
    xc = xa.view(Bsz, nc, L, H, P)
    Bc, Cc = Bh.view(Bsz, nc, L, H, -1), Ch.view(Bsz, nc, L, H, -1)
    cum = aa.view(Bsz, nc, L, H).permute(0, 3, 1, 2).cumsum(-1)  # (B, H, c, L)
    decay = torch.exp(_segsum(cum))  # (B, H, c, L, L)
    w = torch.exp(cum[..., -1:] - cum)  # (B, H, c, L)
    carry = reads = None
    if doc_ids is not None:
        seg = _starts(doc_ids).long().cumsum(1)  # (B, T) document index, 1-based
        if pad:
            seg = F.pad(seg, (0, pad), value=0)
            seg[:, T:] = seg[:, T - 1:T]  # padding (x = 0, a = 0) continues the last document
        sc = seg.view(Bsz, nc, L)
        decay = decay * (sc[:, None, :, :, None] == sc[:, None, :, None, :]).to(acc)
        w = w * (sc == sc[..., -1:]).to(acc)[:, None]
        prev = torch.cat([sc.new_ones(Bsz, 1), sc[:, :-1, -1]], 1)  # document entering each chunk
        carry = (sc[..., -1] == prev).to(acc)  # (B, c)
        reads = (sc == prev[..., None]).to(acc)  # (B, c, L)
    y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, decay, xc)  # intra-chunk quadratic form
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchnp", Bc, w, xc)
    S = initial_state.to(acc) if initial_state is not None else x.new_zeros(Bsz, H, Bc.shape[-1], P, dtype=acc)
    entering = []
    for c in range(nc):  # inter-chunk state passing
        entering.append(S)
        dec = torch.exp(cum[:, :, c, -1])
        if carry is not None:
            dec = dec * carry[:, c, None]
        S = dec[..., None, None] * S + chunk_states[:, c]
    Sin = torch.stack(entering, 1)  # (B, c, H, N, P)
    ein = torch.exp(cum)
    if reads is not None:
        ein = ein * reads[:, None]
    y = y + torch.einsum("bclhn,bchnp,bhcl->bclhp", Cc, Sin, ein)
    y = y.reshape(Bsz, nc * L, H, P)[:, :T]
    return y.to(x.dtype), S


def ssd_step(x, dt, A, B, C, D, state) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decode step (O(1) in the position): ``x (B, H, P)``, ``dt (B, H)`` (after softplus), ``A (H,)``,
    ``B, C (B, G, N)``, ``D (H,)``, ``state (B, H, N, P)`` fp32. Returns ``y (B, H, P)`` and the new state."""
    H = x.shape[1]
    Bh = B.repeat_interleave(H // B.shape[1], dim=1).float()
    Ch = C.repeat_interleave(H // C.shape[1], dim=1).float()
    dtf = dt.float()
    S = torch.exp(dtf * A.float())[..., None, None] * state + (dtf[..., None, None] * Bh[..., :, None]
                                                             * x.float()[..., None, :])
    y = torch.einsum("bhn,bhnp->bhp", Ch, S) + D.float()[:, None] * x.float()
    return y.to(x.dtype), S


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_ssd_inputs(x, dt, A, B, C, D, initial_state) -> None:
    """Shapes, dtypes and devices of :func:`ssd`'s arguments, checked before any backend runs (the Triton kernel
    checks its own, the PyTorch forms none: a ``G`` that does not divide ``H`` was reshaped into a wrong ``d_state``
    and returned); raises ``ValueError`` / ``TypeError`` naming the argument and the expected shape."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("initial_state", initial_state)):
        if t is None and name in ("D", "initial_state"):
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ssd: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"ssd: {name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, "
                            f"float32, float64")
        if t.device != x.device:
            raise ValueError(f"ssd: {name} must be on x's device {x.device}, got {t.device}")
    if x.dim() != 4:
        raise ValueError(f"ssd: x must be 4-D (B, T, H, P), got shape {tuple(x.shape)}")
    Bsz, T, H, P = x.shape
    if min(Bsz, T, H, P) < 1:
        raise ValueError(f"ssd: x must have B, T, H, P >= 1, got shape {tuple(x.shape)}")
    if tuple(dt.shape) != (Bsz, T, H):
        raise ValueError(f"ssd: dt must have shape (B, T, H) = {(Bsz, T, H)}, got {tuple(dt.shape)}")
    if tuple(A.shape) != (H,):
        raise ValueError(f"ssd: A must have shape (H,) = ({H},), got {tuple(A.shape)}")
    if B.dim() != 4 or tuple(B.shape[:2]) != (Bsz, T) or C.shape != B.shape:
        raise ValueError(f"ssd: B and C must have one shape (B, T, G, N) with (B, T) = {(Bsz, T)}, got "
                         f"B={tuple(B.shape)}, C={tuple(C.shape)}")
    G, N = B.shape[2], B.shape[3]
    if G < 1 or N < 1 or H % G:
        raise ValueError(f"ssd: the number of groups G={G} (B.shape[2]) must divide H={H} (x.shape[2]), and "
                         f"N={N} (B.shape[3]) must be >= 1")
    if D is not None and tuple(D.shape) != (H,):
        raise ValueError(f"ssd: D must have shape (H,) = ({H},) or be None, got {tuple(D.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (Bsz, H, N, P):
        raise ValueError(f"ssd: initial_state must have shape (B, H, N, P) = {(Bsz, H, N, P)} or be None, got "
                         f"{tuple(initial_state.shape)}")


def ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size: int = 64, backend: str = "auto", doc_ids=None):
    """Mamba-2's SSD: ``x (B, T, H, P)``, ``dt (B, T, H)`` (positive, after softplus), ``A (H,)`` (negative),
    ``B, C (B, T, G, N)``, ``D (H,)`` or None, ``initial_state (B, H, N, P)`` or None.

    ``backend``: ``triton`` (:func:`kernels.ssd.ssd_scan`), ``torch`` (:func:`ssd_scan_chunked`), ``naive``
    (:func:`ssd_scan_naive`) or ``auto`` (triton on CUDA, else torch). Returns ``y (B, T, H, P)`` in ``x.dtype``
    and the final state ``(B, H, N, P)`` fp32. Differentiable in every tensor argument.
    ``doc_ids (B, T)`` int or None: the state restarts at each document start (``initial_state`` belongs to the
    document at position 0), in every backend.
    Raises ``ValueError`` / ``TypeError`` naming the argument for a shape other than the above (``G`` must divide
    ``H``; ``T >= 1``), a non-float dtype or another device than x's; ``backend`` for an unknown one, ``doc_ids``
    for a dtype other than int32 / int64, a shape other than ``(B, T)`` or decreasing ids (as attention does),
    ``chunk_size`` for a non-positive one (``triton``: one of :data:`kernels.ssd.CHUNK_SIZES`). ``a = dt * A`` must be finite: an infinite decay (a full
    reset) gives NaN in the chunked forms (their within-chunk cumulative sums), unchecked (no host sync in the
    hot path); a reset is a document start (``doc_ids``)."""
    if backend not in SSD_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: {', '.join(SSD_BACKENDS)}")
    _check_ssd_inputs(x, dt, A, B, C, D, initial_state)
    _check_docs(doc_ids, x)
    if backend == "auto":
        backend = "triton" if x.is_cuda and x.dtype != torch.float64 else "torch"
    xdt = x * dt[..., None].to(x.dtype)
    a = dt.float() * A.float()
    if backend == "triton":
        from kernels.ssd import ssd_scan

        y, S = ssd_scan(xdt, a, B.to(x.dtype), C.to(x.dtype), initial_state, chunk_size, doc_ids=doc_ids)
    elif backend == "torch":
        y, S = ssd_scan_chunked(xdt, a, B, C, initial_state, chunk_size, doc_ids)
    else:
        y, S = ssd_scan_naive(xdt, a, B, C, initial_state, doc_ids)
    if D is not None:
        y = y + (D[:, None].to(x.dtype) * x)
    return y, S


@dataclass
class Mamba2State:
    """Decode state of one Mamba-2 layer: the last ``d_conv - 1`` inputs of the convolution ``conv (B, C, K-1)``
    and the SSM state ``ssm (B, H, N, P)`` fp32; ``n`` tokens seen (host int). Its size does not grow with N."""

    conv: torch.Tensor
    ssm: torch.Tensor
    n: int = 0

    def tokens_seen(self) -> list:
        """Tokens seen so far, per row (all ``n``)."""
        return [self.n] * self.ssm.shape[0]

    @property
    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.ssm.numel() * self.ssm.element_size()


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: ``rmsnorm(y * silu(z)) * weight``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y, z):
        h = (y * F.silu(z)).float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(y.dtype) * self.weight


@register_mixer("mamba2", causal=True)
class Mamba2(nn.Module):
    """The Mamba-2 block's mixer, ``(B, N, d_model) -> (B, N, d_model)``.

    ``in_proj`` gives ``z`` (gate), ``xBC`` and ``dt``; ``xBC`` passes a short causal depthwise convolution
    (``d_conv`` taps) and SiLU, then splits into ``x (H heads of headdim)``, ``B, C (ngroups, d_state)``;
    ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)`` (a scalar per head); :func:`ssd`; gated RMSNorm with
    ``z``; ``out_proj``. ``d_inner = expand * d_model`` must be a multiple of ``headdim``.

    ``kernel``: ``auto`` | ``triton`` | ``torch`` | ``naive`` (the SSD scan's ``backend``; see :func:`ssd`). The
    model's attention backend does not apply (it is not an attention layer).
    Decoding: :meth:`new_cache` and ``forward(x, cache, pos)``; one token is an O(1) :func:`ssd_step`, a chunk
    runs the scan from the cached state.

    Raises ``ValueError`` naming the option: ``d_state``, ``expand``, ``headdim``, ``d_conv``, ``ngroups`` not an
    integer >= 1, ``headdim`` not dividing ``d_inner``, ``ngroups`` not dividing the heads, ``dt_min`` / ``dt_max`` not
    numbers > 0 with ``dt_min <= dt_max``, a bad ``chunk_size`` or ``kernel``.
    """

    def __init__(self, d_model: int, d_state: int = 64, expand: int = 2, headdim: int = 32, d_conv: int = 4,
                 ngroups: int = 1, chunk_size: int = 64, kernel: str = "auto", dt_min: float = 1e-3,
                 dt_max: float = 1e-1, bias: bool = False):
        super().__init__()
        if kernel not in SSD_BACKENDS:
            raise ValueError(f"mamba2 kernel={kernel!r} is not supported; allowed values: {', '.join(SSD_BACKENDS)}")
        for name, value, what in (("d_state", d_state, "the state size N of each head"),
                                  ("expand", expand, "d_inner = expand * d_model"),
                                  ("headdim", headdim, "the channels P of each head"),
                                  ("d_conv", d_conv, "the taps of the causal convolution"),
                                  ("ngroups", ngroups, "the groups of B and C")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"mamba2 {name}={value!r} must be an integer >= 1 ({what})")
        for name, value in (("dt_min", dt_min), ("dt_max", dt_max)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"mamba2 {name}={value!r} must be a number > 0 (the range of the initial step dt)")
        if dt_min > dt_max:
            raise ValueError(f"mamba2 dt_min={dt_min!r} must be <= dt_max={dt_max!r}")
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"mamba2 headdim={headdim} must divide d_inner = expand * d_model = {d_inner}")
        self.nheads = d_inner // headdim
        if self.nheads % ngroups:
            raise ValueError(f"mamba2 ngroups={ngroups} must divide the number of heads {self.nheads}")
        _check_chunk_size("mamba2", chunk_size)
        if kernel in ("auto", "triton"):  # auto runs the Triton kernel on CUDA: a config that runs on CPU runs there
            from kernels.ssd import CHUNK_SIZES

            if chunk_size not in CHUNK_SIZES:
                raise ValueError(f"mamba2 chunk_size={chunk_size} is not supported with kernel={kernel!r} (the Triton "
                                 f"kernel's; auto runs it on CUDA); allowed values: "
                                 f"{', '.join(map(str, CHUNK_SIZES))}, or any positive int with kernel='torch'")
        self.d_inner, self.d_state, self.headdim, self.ngroups = d_inner, d_state, headdim, ngroups
        self.d_conv, self.chunk_size, self.kernel = d_conv, chunk_size, kernel
        self.conv_dim = d_inner + 2 * ngroups * d_state
        self.in_proj = nn.Linear(d_model, d_inner + self.conv_dim + self.nheads, bias=bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, bias=True)
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nheads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.norm = GatedRMSNorm(d_inner)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)

    def new_cache(self, batch_size: int, capacity: int, dtype: torch.dtype, device, page_size=None,
                  shuffle_pages: bool = False) -> Mamba2State:
        """An empty decode state (``capacity`` / paging do not apply: the state has a fixed size)."""
        return Mamba2State(torch.zeros(batch_size, self.conv_dim, self.d_conv - 1, dtype=dtype, device=device),
                           torch.zeros(batch_size, self.nheads, self.d_state, self.headdim, dtype=torch.float32,
                                       device=device), 0)

    def _conv(self, xBC, cache: Optional[Mamba2State], doc_ids=None):
        """Causal depthwise conv over ``xBC (B, T, C)``; with a cache, continues from its last inputs.
        With ``doc_ids (B, T)`` a tap never reads across a document start (inputs of another document, or the
        cached ones before the first document start after position 0, count as zeros)."""
        h = xBC.transpose(1, 2)  # (B, C, T)
        K = self.d_conv
        prev = cache.conv.to(h.dtype) if cache is not None else h.new_zeros(h.shape[0], h.shape[1], K - 1)
        full = torch.cat([prev, h], dim=2)
        if cache is not None and K > 1:
            keep = full[:, :, -(K - 1):]
            if doc_ids is not None:  # the cached inputs must belong to the last document
                d = torch.cat([doc_ids[:, :1].expand(-1, K - 1), doc_ids], 1).long()
                keep = keep * (d[:, -(K - 1):] == d[:, -1:]).to(keep.dtype)[:, None]
            cache.conv = keep.detach().clone()
        if doc_ids is not None and K > 1:
            d = torch.cat([doc_ids[:, :1].expand(-1, K - 1), doc_ids], 1).long()  # cached inputs: document 0's
            T = h.shape[2]
            out = self.conv1d.bias.to(h.dtype)[None, :, None].expand_as(h)
            w = self.conv1d.weight[:, 0].to(h.dtype)  # (C, K)
            for j in range(K):  # tap j reads position t - (K - 1 - j)
                src = full[:, :, j:j + T]
                same = (d[:, j:j + T] == d[:, K - 1:]).to(h.dtype)[:, None]
                out = out + w[None, :, j, None] * src * same
            return F.silu(out).transpose(1, 2)
        out = F.conv1d(full, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
        return F.silu(out).transpose(1, 2)  # (B, T, C)

    def forward(self, x: torch.Tensor, cache: Optional[Mamba2State] = None, pos: int = 0,
                doc_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x (B, T, d_model)``; ``doc_ids (B, T)`` int or None: packed documents, the convolution and the SSM
        state restart at each document start (with a cache, the cached state belongs to the document at
        position 0 of ``x``); the decode step (``T == 1``) ignores ``doc_ids``."""
        Bsz, T, _ = x.shape
        if doc_ids is not None and tuple(doc_ids.shape) != (Bsz, T):
            raise ValueError(f"mamba2 doc_ids must have shape (B, T) = {(Bsz, T)}, got {tuple(doc_ids.shape)}")
        if doc_ids is not None:
            _check_docs(doc_ids, x.view(Bsz, T, 1, -1))
        if T == 1 and cache is not None and cache.n > 0:
            doc_ids = None
        z, xBC, dt = torch.split(self.in_proj(x), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        xBC = self._conv(xBC, cache, doc_ids)
        xs, Bm, Cm = torch.split(xBC, [self.d_inner, self.ngroups * self.d_state, self.ngroups * self.d_state], -1)
        xs = xs.reshape(Bsz, T, self.nheads, self.headdim)
        Bm = Bm.reshape(Bsz, T, self.ngroups, self.d_state)
        Cm = Cm.reshape(Bsz, T, self.ngroups, self.d_state)
        dt = F.softplus(dt.float() + self.dt_bias.float())  # (B, T, H)
        A = -torch.exp(self.A_log.float())
        if cache is not None and T == 1 and cache.n > 0:  # O(1) decode step
            y, S = ssd_step(xs[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], self.D, cache.ssm)
            y = y[:, None]
        else:
            s0 = cache.ssm if cache is not None and cache.n > 0 else None
            y, S = ssd(xs, dt, A, Bm, Cm, self.D, s0, self.chunk_size, self.kernel, doc_ids)
        if cache is not None:
            cache.ssm, cache.n = S.detach().float(), cache.n + T
        y = self.norm(y.reshape(Bsz, T, self.d_inner), z)
        return self.out_proj(y)
