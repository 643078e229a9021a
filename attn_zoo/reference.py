"""Reference backend: plain PyTorch, fp32, the full mask materialised. Ground truth for every kernel.
(float64 inputs are computed in float64.)

Shapes: ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)``; ``Hkv`` divides ``Hq`` and query
head ``h`` reads K/V head ``h // (Hq // Hkv)``. Output ``(B, Hq, Nq, Dv)`` in ``q.dtype``.
Memory is O(B * Hq * Nq * Nk): use it for tests and small models only.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .feature_maps import apply_feature_map
from .masks import mask_info
from .spec import AttentionSpec


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp32 for half / single precision inputs, fp64 kept as fp64 (the accumulation dtype of the references)."""
    return x if x.dtype == torch.float64 else x.float()


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(B, Hkv, N, D) -> (B, Hkv * n_rep, N, D)``: K/V head ``g`` serves query heads ``g*n_rep .. g*n_rep+n_rep-1``."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


def softmax_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, return_lse: bool = False
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact masked softmax attention (Vaswani et al. 2017, eq. 1) with the spec's mask.

    Rows with no allowed key output 0 and have ``lse = -inf``. ``lse`` is fp32 ``(B, Hq, Nq)``, natural log
    of ``sum_j exp(scale * q_i . k_j)`` over allowed ``j`` (fp64 for fp64 inputs).
    """
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    n_rep = Hq // k.shape[1]
    qf, kf, vf = upcast(q), repeat_kv(upcast(k), n_rep), repeat_kv(upcast(v), n_rep)
    s = (qf @ kf.transpose(-1, -2)) * spec.scale(D)  # (B, Hq, Nq, Nk)
    allowed = mask_info(spec, Nq, Nk).dense(q.device)  # (Nq, Nk)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, Hq, Nq), -inf on empty rows
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
    out = (p @ vf).to(q.dtype)  # empty rows: p == 0 -> out == 0
    return (out, lse) if return_lse else out


def linear_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
    feature_q: Optional[torch.Tensor] = None, feature_k: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Kernelized attention, masked quadratic form (Katharopoulos et al. 2020, eq. 4 and 9):

    ``out_i = sum_j M_ij (phi(q_i).phi(k_j)) v_j / (sum_j M_ij phi(q_i).phi(k_j) + eps)``, with ``M`` the causal
    mask (bottom-right aligned) or all-ones. Computed in fp32 with the ``(Nq, Nk)`` matrix materialised.
    ``feature_q`` / ``feature_k`` may pass precomputed ``phi(q)``, ``phi(k)`` ``(B, H, N, F)``.
    """
    Hq, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
    n_rep = Hq // k.shape[1]
    fq = feature_q if feature_q is not None else apply_feature_map(upcast(q), spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = feature_k if feature_k is not None else apply_feature_map(upcast(k), spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    fq, fk, vf = upcast(fq), repeat_kv(upcast(fk), n_rep), repeat_kv(upcast(v), n_rep)
    a = fq @ fk.transpose(-1, -2)  # (B, Hq, Nq, Nk)
    if spec.causal:
        i = torch.arange(Nq, device=q.device).view(-1, 1) + (Nk - Nq)
        j = torch.arange(Nk, device=q.device).view(1, -1)
        a = a.masked_fill(j > i, 0.0)
    num = a @ vf
    den = a.sum(-1, keepdim=True) + spec.eps
    return (num / den).to(q.dtype)


def attention_reference(q, k, v, spec: AttentionSpec, return_lse: bool = False):
    """Dispatch to the softmax or linear reference by ``spec.kind``."""
    if spec.is_softmax:
        return softmax_attention_reference(q, k, v, spec, return_lse=return_lse)
    if return_lse:
        raise ValueError(f"return_lse=True is only defined for softmax kinds, got kind={spec.kind!r}")
    return linear_attention_reference(q, k, v, spec)
