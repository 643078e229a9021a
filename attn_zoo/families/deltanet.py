"""DeltaNet (Schlag et al. 2021; Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length") and Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025) as sequence mixers.

The recurrence (per batch and head; state ``S (Dk, Dv)`` fp32; ``q, k`` L2-normalized; ``beta_t`` in (0, 1);
``alpha_t = exp(g_t)`` in (0, 1], 1 for DeltaNet)::

    S_t = alpha_t * S_{t-1} + beta_t * k_t (v_t - alpha_t * S_{t-1}^T k_t)^T        o_t = scale * S_t^T q_t

Fast backend: flash-linear-attention's chunked kernels (``fla.ops.delta_rule.chunk_delta_rule``,
``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; an optional dependency, ``pip install
flash-linear-attention``). Our reference: :func:`delta_rule_naive` (step by step, used on CPU and in tests).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..mixers import register_mixer

__all__ = ["delta_rule_naive", "delta_rule", "DeltaNet", "GatedDeltaNet", "DeltaState", "DELTA_BACKENDS"]

DELTA_BACKENDS = ("auto", "fla", "naive")


def _starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` bool: ``t`` starts a document (``t == 0`` or ``doc_ids[:, t] != doc_ids[:, t - 1]``)."""
    d = doc_ids.long()
    st = torch.ones_like(d, dtype=torch.bool)
    st[:, 1:] = d[:, 1:] != d[:, :-1]
    return st


def delta_rule_naive(q, k, v, beta, g=None, scale: Optional[float] = None, initial_state=None, doc_ids=None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (gated) delta rule step by step.

    ``q, k (B, T, H, Dk)``, ``v (B, T, H, Dv)``, ``beta (B, T, H)``, ``g (B, T, H)`` log-decay (``<= 0``) or None,
    ``scale`` (default ``Dk ** -0.5``), ``initial_state (B, H, Dk, Dv)`` or None. Returns ``o (B, T, H, Dv)`` in
    ``q.dtype`` and the final state ``(B, H, Dk, Dv)`` fp32 (fp64 for fp64 inputs).
    ``doc_ids (B, T)`` int or None: the state restarts from zero at each document start after position 0
    (``initial_state`` belongs to the document at position 0)."""
    Bsz, T, H, Dk = q.shape
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = Dk ** -0.5 if scale is None else scale
    S = initial_state.to(acc) if initial_state is not None else q.new_zeros(Bsz, H, Dk, v.shape[-1], dtype=acc)
    qa, ka, va, ba = q.to(acc), k.to(acc), v.to(acc), beta.to(acc)
    st = _starts(doc_ids) if doc_ids is not None else None
    os_ = []
    for t in range(T):
        if st is not None and t > 0:
            S = S * (~st[:, t]).to(acc)[:, None, None, None]
        if g is not None:
            S = torch.exp(g[:, t].to(acc))[..., None, None] * S
        kt = ka[:, t]
        v_old = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + ba[:, t, :, None, None] * kt[..., :, None] * (va[:, t] - v_old)[..., None, :]
        os_.append(scale * torch.einsum("bhk,bhkv->bhv", qa[:, t], S))
    return torch.stack(os_, 1).to(q.dtype), S


def _fla(gated: bool):
    name = "fla.ops.gated_delta_rule" if gated else "fla.ops.delta_rule"
    fn = "chunk_gated_delta_rule" if gated else "chunk_delta_rule"
    try:
        return getattr(importlib.import_module(name), fn)
    except ImportError as e:
        raise ImportError(f"kernel='fla' of the {'gated_deltanet' if gated else 'deltanet'} mixer needs the "
                          f"flash-linear-attention package ({name}.{fn}): pip install flash-linear-attention "
                          f"(or use kernel='naive')") from e


def _flatten_docs(doc_ids: torch.Tensor):
    """Packed rows -> fla's varlen form: ``cu_seqlens`` int32 over the flattened ``B * T`` tokens (each row's
    start is a boundary), and the indices of each row's first and last sequence."""
    Bsz, T = doc_ids.shape
    st = _starts(doc_ids).reshape(-1)
    starts = st.nonzero().flatten()
    n_seq = starts.numel()
    cu = torch.cat([starts, starts.new_tensor([Bsz * T])]).to(torch.int32)
    seq_of = st.long().cumsum(0).view(Bsz, T) - 1
    return cu, seq_of[:, 0], seq_of[:, -1], n_seq


def delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, backend: str = "auto", doc_ids=None):
    """:func:`delta_rule_naive`'s arguments and results; ``backend``: ``fla`` (fla's chunked kernel, CUDA),
    ``naive`` or ``auto`` (fla for float16 / bfloat16 on CUDA when importable, else naive). Raises ``ImportError``
    naming the package for ``fla`` without it, ``ValueError`` naming ``backend`` for an unknown one or for ``fla``
    with float32 inputs (fla's kernels refuse them). ``doc_ids (B, T)``: the state restarts at each document
    start; ``fla`` receives the batch flattened to one row with ``cu_seqlens`` (fla's varlen form)."""
    if backend not in DELTA_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: {', '.join(DELTA_BACKENDS)}")
    if backend == "fla" and q.dtype not in (torch.float16, torch.bfloat16):
        _fla(g is not None)  # a missing package first (ImportError naming it)
        raise ValueError(f"backend='fla' (fla's chunked delta-rule kernels) needs float16 / bfloat16 q, k, v, got "
                         f"{q.dtype}; use backend='naive' for {q.dtype}, or train with trainer=gpu (bf16-mixed)")
    if backend == "auto":
        backend = "naive"
        if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            try:
                _fla(g is not None)
                backend = "fla"
            except ImportError:
                pass
    if backend == "naive":
        return delta_rule_naive(q, k, v, beta, g, scale, initial_state, doc_ids)
    fn = _fla(g is not None)
    s0 = initial_state.float() if initial_state is not None else None
    if doc_ids is not None:
        Bsz, T, H = q.shape[:3]
        cu, first, last, n_seq = _flatten_docs(doc_ids)
        if s0 is not None:  # each row's initial state goes to its first sequence
            full = s0.new_zeros(n_seq, *s0.shape[1:])
            full[first] = s0
            s0 = full
        flat = lambda t: None if t is None else t.reshape(1, Bsz * T, *t.shape[2:])  # noqa: E731
        gf = flat(g.float()) if g is not None else None
        args = (flat(q), flat(k), flat(v), flat(beta)) if g is None else (flat(q), flat(k), flat(v), gf, flat(beta))
        o, S = fn(*args, scale=scale, initial_state=s0, output_final_state=True, cu_seqlens=cu)
        return o.reshape(Bsz, T, *o.shape[2:]), S[last]
    if g is None:
        o, S = fn(q, k, v, beta, scale=scale, initial_state=s0, output_final_state=True)
    else:
        o, S = fn(q, k, v, g.float(), beta, scale=scale, initial_state=s0, output_final_state=True)
    return o, S


@dataclass
class DeltaState:
    """Decode state of one DeltaNet layer: ``S (B, H, Dk, Dv)`` fp32 and ``n`` tokens seen (host int)."""

    S: torch.Tensor
    n: int = 0

    @property
    def nbytes(self) -> int:
        return self.S.numel() * self.S.element_size()


class _DeltaBase(nn.Module):
    gated = False

    def __init__(self, d_model: int, n_head: int, head_dim: int, kernel: str = "auto", bias: bool = False):
        super().__init__()
        if kernel not in DELTA_BACKENDS:
            raise ValueError(f"{self.mixer_name} kernel={kernel!r} is not supported; allowed values: "
                             f"{', '.join(DELTA_BACKENDS)}")
        self.n_head, self.head_dim, self.kernel = n_head, head_dim, kernel
        inner = n_head * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.b_proj = nn.Linear(d_model, n_head, bias=True)
        self.o_norm_weight = nn.Parameter(torch.ones(head_dim))
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        if self.gated:
            self.a_proj = nn.Linear(d_model, n_head, bias=True)
            self.A_log = nn.Parameter(torch.log(torch.empty(n_head).uniform_(1, 16)))
            self.g_proj = nn.Linear(d_model, inner, bias=bias)  # output gate

    @property
    def mixer_name(self) -> str:
        return "gated_deltanet" if self.gated else "deltanet"

    def new_cache(self, batch_size: int, capacity: int, dtype: torch.dtype, device, page_size=None,
                  shuffle_pages: bool = False) -> DeltaState:
        """An empty decode state (fixed size; ``capacity`` / paging do not apply)."""
        return DeltaState(torch.zeros(batch_size, self.n_head, self.head_dim, self.head_dim, dtype=torch.float32,
                                      device=device), 0)

    def forward(self, x: torch.Tensor, cache: Optional[DeltaState] = None, pos: int = 0,
                doc_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x (B, T, d_model)``; ``doc_ids (B, T)`` int or None: packed documents, the state restarts at each
        document start (with a cache, the cached state belongs to the document at position 0 of ``x``)."""
        Bsz, T, _ = x.shape
        if doc_ids is not None and tuple(doc_ids.shape) != (Bsz, T):
            raise ValueError(f"{self.mixer_name} doc_ids must have shape (B, T) = {(Bsz, T)}, "
                             f"got {tuple(doc_ids.shape)}")
        shp = (Bsz, T, self.n_head, self.head_dim)
        q = F.normalize(F.silu(self.q_proj(x)).view(shp), dim=-1)
        k = F.normalize(F.silu(self.k_proj(x)).view(shp), dim=-1)
        v = F.silu(self.v_proj(x)).view(shp)
        beta = torch.sigmoid(self.b_proj(x).float())
        g = -torch.exp(self.A_log.float()) * F.softplus(self.a_proj(x).float()) if self.gated else None
        s0 = cache.S if cache is not None and cache.n > 0 else None
        o, S = delta_rule(q, k, v, beta.to(q.dtype), g, None, s0, self.kernel, doc_ids)
        if cache is not None:
            cache.S, cache.n = S.detach().float(), cache.n + T
        of = o.float()
        o = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.o_norm_weight
        if self.gated:
            o = o * F.silu(self.g_proj(x)).view(shp)
        return self.out_proj(o.reshape(Bsz, T, -1))


@register_mixer("deltanet", causal=True)
class DeltaNet(_DeltaBase):
    """DeltaNet mixer ``(B, N, d_model) -> (B, N, d_model)``: ``n_head`` heads of ``head_dim`` (the model's);
    SiLU + L2-normalized ``q, k``, ``beta = sigmoid(W_b x)``, per-head RMSNorm of the output; ``kernel``
    ``auto`` | ``fla`` | ``naive`` (:func:`delta_rule`'s ``backend``; the model's attention backend does not
    apply). Decodes from an O(1) :class:`DeltaState`."""


@register_mixer("gated_deltanet", causal=True)
class GatedDeltaNet(_DeltaBase):
    """Gated DeltaNet mixer: DeltaNet plus the decay ``alpha_t = exp(-exp(A_log) * softplus(W_a x))`` per head
    (Mamba-2's gate) and a SiLU output gate."""

    gated = True
