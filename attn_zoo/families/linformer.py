"""Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity") as a sequence mixer.

Keys and values are projected along the sequence by learned ``E, F (proj_dim, max_seq_len)``:
``K' = E[:, :N] K``, ``V' = F[:, :N] V`` (``(B, H, proj_dim, D)``), and our attention (:func:`attn_zoo.attention`,
kind ``flash``, non-causal) runs ``softmax(Q K'^T / sqrt(D)) V'``: O(N * proj_dim). Every projected key mixes
all positions, future ones included, so the mixer is non-causal by construction: ``causal=True`` is refused,
and :class:`~attn_zoo.model.GPT` (a causal language model) refuses it as a layer.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..mixers import register_mixer
from ..spec import make_spec

__all__ = ["Linformer"]

CAUSAL_REASON = ("Linformer's projections E, F mix keys and values along the whole sequence, so every position "
                 "would see future tokens; it is non-causal by construction")


@register_mixer("linformer", causal=False)
class Linformer(nn.Module):
    """Linformer mixer ``(B, N, d_model) -> (B, N, d_model)`` with ``N <= max_seq_len`` (fixed at config).

    Args: ``d_model``, ``n_head``, ``head_dim``, ``max_seq_len`` (context), ``proj_dim`` (k, the projected
    length), ``share_kv`` (one projection for K and V), ``causal`` (must be False), ``backend`` (the attention
    backend of :func:`attn_zoo.attention`).

    Raises ``ValueError`` naming ``causal`` for ``causal=True`` (with the reason), ``proj_dim`` not an integer >= 1,
    ``causal`` / ``share_kv`` not true or false, and, in forward, ``N > max_seq_len``."""

    causal_reason = CAUSAL_REASON

    def __init__(self, d_model: int, n_head: int, head_dim: int, max_seq_len: int, proj_dim: int = 64,
                 share_kv: bool = False, causal: bool = False, backend: str = "auto", bias: bool = False):
        super().__init__()
        for name, value in (("causal", causal), ("share_kv", share_kv)):
            if not isinstance(value, bool):
                raise ValueError(f"linformer {name}={value!r} must be true or false")
        if causal:
            raise ValueError(f"linformer: causal=True is not supported: {CAUSAL_REASON}; use causal=False on a "
                             f"non-causal (encoder) task")
        if isinstance(proj_dim, bool) or not isinstance(proj_dim, int) or proj_dim < 1:
            raise ValueError(f"linformer proj_dim={proj_dim!r} must be an integer >= 1 (the projected length k)")
        self.n_head, self.head_dim, self.max_seq_len, self.backend = n_head, head_dim, max_seq_len, backend
        inner = n_head * head_dim
        self.qkv = nn.Linear(d_model, 3 * inner, bias=bias)
        self.E = nn.Parameter(torch.randn(proj_dim, max_seq_len) / max_seq_len ** 0.5)
        self.F = self.E if share_kv else nn.Parameter(torch.randn(proj_dim, max_seq_len) / max_seq_len ** 0.5)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.spec = make_spec("flash", causal=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Bsz, N, _ = x.shape
        if N > self.max_seq_len:
            raise ValueError(f"linformer: sequence length N={N} exceeds max_seq_len={self.max_seq_len} (the "
                             f"projections E, F are fixed at config)")
        q, k, v = self.qkv(x).view(Bsz, N, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, N, D)
        k = torch.einsum("kn,bhnd->bhkd", self.E[:, :N].to(k.dtype), k)
        v = torch.einsum("kn,bhnd->bhkd", self.F[:, :N].to(v.dtype), v)
        from ..functional import attention

        y = attention(q.contiguous(), k.contiguous(), v.contiguous(), self.spec, backend=self.backend)
        return self.out_proj(y.transpose(1, 2).reshape(Bsz, N, -1))
