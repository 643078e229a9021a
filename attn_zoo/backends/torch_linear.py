"""``torch`` backend of ``linear``: the chunked form in plain PyTorch (what a user would write).

Causal (Katharopoulos et al. 2020, eq. 8-9, chunked as in Yang et al. 2024 "Gated Linear Attention", sec. 2.2):
for chunk ``c`` of ``C`` tokens,

    out_c = [ (phi(Q_c) phi(K_c)^T * M) V_c + phi(Q_c) S_{<c} ] / [ (phi(Q_c) phi(K_c)^T * M) 1 + phi(Q_c) z_{<c} + eps ]

with ``S_{<c} = sum_{j < start(c)} phi(k_j)^T v_j`` (F x Dv) and ``z_{<c} = sum phi(k_j)`` carried in fp32.
Non-causal: ``phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps)``. O(N * C * F + N * F * Dv) time,
O(N / C * F * Dv) memory for the chunk states. Bottom-right alignment when ``Nq != Nk``: the first
``Nk - Nq`` keys form the initial state; with ``Nq > Nk`` the top ``Nq - Nk`` rows see nothing and are 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..feature_maps import apply_feature_map
from ..reference import repeat_kv, upcast
from ..registry import register_backend


def _supports(q, k, v, spec, return_lse):
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    return None


def chunked_linear_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, causal: bool, eps: float, chunk_size: int = 64
) -> torch.Tensor:
    """Linear attention on features: ``fq (B, H, Nq, F)``, ``fk (B, H, Nk, F)``, ``v (B, H, Nk, Dv)`` (same H).

    Returns ``(B, H, Nq, Dv)`` in fp32 (fp64 for fp64 inputs).
    """
    fq, fk, v = upcast(fq), upcast(fk), upcast(v)
    B, H, Nq, Fd = fq.shape
    Nk, Dv = fk.shape[2], v.shape[3]
    if not causal:
        kv = fk.transpose(-1, -2) @ v  # (B, H, F, Dv)
        z = fk.sum(2)  # (B, H, F)
        return (fq @ kv) / ((fq * z.unsqueeze(2)).sum(-1, keepdim=True) + eps)
    off = Nk - Nq
    s0 = fq.new_zeros(B, H, Fd, Dv)
    z0 = fq.new_zeros(B, H, Fd)
    top = None
    if off > 0:  # keys before the first query: initial state
        s0 = fk[:, :, :off].transpose(-1, -2) @ v[:, :, :off]
        z0 = fk[:, :, :off].sum(2)
        fk, v = fk[:, :, off:], v[:, :, off:]
    elif off < 0:  # queries before the first key see nothing
        top = fq.new_zeros(B, H, -off, Dv)
        fq = fq[:, :, -off:]
    n = fq.shape[2]
    C = chunk_size
    pad = (-n) % C
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    nc = (n + pad) // C
    qc = fq.view(B, H, nc, C, Fd)
    kc = fk.view(B, H, nc, C, Fd)
    vc = v.view(B, H, nc, C, Dv)
    tril = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()
    a = (qc @ kc.transpose(-1, -2)).masked_fill(~tril, 0.0)  # (B, H, nc, C, C)
    kv = kc.transpose(-1, -2) @ vc  # (B, H, nc, F, Dv)
    # exclusive prefix sums (state before each chunk), without the cumsum - x subtraction that loses precision
    # and lets a NaN / inf of chunk c reach earlier chunks
    s_prev = torch.cat([s0.unsqueeze(2), kv[:, :, :-1]], dim=2).cumsum(2)  # (B, H, nc, F, Dv)
    zc = kc.sum(3)  # (B, H, nc, F)
    z_prev = torch.cat([z0.unsqueeze(2), zc[:, :, :-1]], dim=2).cumsum(2)
    num = a @ vc + qc @ s_prev
    den = a.sum(-1) + (qc * z_prev.unsqueeze(3)).sum(-1) + eps
    out = (num / den.unsqueeze(-1)).reshape(B, H, nc * C, Dv)[:, :, :n]
    return out if top is None else torch.cat([top, out], dim=2)


@register_backend("linear", "torch", supports=_supports)
def torch_linear_attention(q, k, v, spec, return_lse=False):
    """Chunked PyTorch linear attention; shapes as :func:`attn_zoo.attention`; output in ``q.dtype``."""
    n_rep = q.shape[1] // k.shape[1]
    fq = apply_feature_map(upcast(q), spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(upcast(k), spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    out = chunked_linear_attention(fq, repeat_kv(fk, n_rep), repeat_kv(v, n_rep), spec.causal, spec.eps, spec.chunk_size)
    return out.to(q.dtype)
