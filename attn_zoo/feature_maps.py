"""Feature maps phi for linear attention: ``softmax(q k^T) ~ phi(q) phi(k)^T``.

All maps take ``x`` of shape ``(..., N, D)`` and return ``(..., N, F)`` in the dtype of ``x`` (computed in
fp32 internally, fp64 for fp64 inputs). ``F`` is given by :func:`feature_dim`.

* ``elu1``: ``elu(x) + 1`` (Katharopoulos et al. 2020, eq. 7), ``F = D``.
* ``relu``: ``relu(x)``, ``F = D`` (rows of zeros are possible: the ``eps`` of the normaliser handles them).
* ``favor``: FAVOR+ positive random features (Choromanski et al. 2021, Lemma 1):
  ``phi(x) = exp(w_r . x' - |x'|^2 / 2 - c) / sqrt(m)``, ``x' = x * D^(-1/4)``, ``w_r`` orthogonal Gaussian
  rows drawn from ``seed``, ``F = m = num_features``; ``c`` is the row max for queries (it cancels between
  numerator and normaliser of that row) and 0 for keys (a max over keys would leak future keys into past
  rows through ``eps``). Key features are bounded by ``exp(|w|^2 / 2)``: keep them in fp32 / bf16, not fp16.
* ``taylor``: 2nd-order Taylor expansion of ``exp(q.k / sqrt(D))`` (Arora et al. 2024, "Based"):
  ``phi(x) = [1, x', vec(x' x'^T) / sqrt(2)]`` with ``x' = x * D^(-1/4)`` so that
  ``phi(q).phi(k) = 1 + s + s^2 / 2 >= 1/2`` with ``s = q.k / sqrt(D)``; ``F = 1 + D + D^2``.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from .spec import FEATURE_MAPS


def feature_dim(feature_map: str, head_dim: int, num_features: int = 64) -> int:
    """Output width ``F`` of a feature map for input width ``head_dim``."""
    if feature_map in ("elu1", "relu"):
        return head_dim
    if feature_map == "favor":
        return num_features
    if feature_map == "taylor":
        return 1 + head_dim + head_dim * head_dim
    raise ValueError(f"feature_map={feature_map!r} is not supported; allowed values: {', '.join(FEATURE_MAPS)}")


@lru_cache(maxsize=32)
def _favor_cpu(head_dim: int, num_features: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    blocks, rows = [], 0
    while rows < num_features:  # stacked orthogonal blocks (Choromanski et al. 2021, section 2.4)
        a = torch.randn(head_dim, head_dim, generator=g, dtype=torch.float64)
        qm, _ = torch.linalg.qr(a)
        blocks.append(qm.T)
        rows += head_dim
    w = torch.cat(blocks, 0)[:num_features]
    norms = torch.randn(num_features, head_dim, generator=g, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (w * norms).to(torch.float32)  # (m, D), rows ~ N(0, I) marginally


@lru_cache(maxsize=64)
def _favor_on(head_dim: int, num_features: int, seed: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return _favor_cpu(head_dim, num_features, seed).to(device=device, dtype=dtype)


def favor_projection(head_dim: int, num_features: int, seed: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """Random feature matrix ``(num_features, head_dim)``, deterministic in ``seed`` (redraw = new seed);
    cached per device and dtype (no host-to-device copy per forward). Do not modify the returned tensor."""
    return _favor_on(int(head_dim), int(num_features), int(seed), str(torch.device(device or "cpu")), dtype)


def apply_feature_map(x: torch.Tensor, feature_map: str, *, is_query: bool, num_features: int = 64, seed: int = 0) -> torch.Tensor:
    """``phi(x)``: ``(..., N, D) -> (..., N, F)``, fp32 math, returned in ``x.dtype``.

    Raises ``ValueError`` for an unknown ``feature_map``.
    """
    xf = x if x.dtype == torch.float64 else x.float()
    d = x.shape[-1]
    if feature_map == "elu1":
        out = F.elu(xf) + 1.0
    elif feature_map == "relu":
        out = F.relu(xf)
    elif feature_map == "favor":
        xs = xf * d ** -0.25
        w = favor_projection(d, num_features, seed, x.device, xf.dtype)
        logits = xs @ w.T - 0.5 * (xs * xs).sum(-1, keepdim=True)  # (..., N, m)
        if is_query:
            # per-row stabiliser: scales phi(q_i) by one constant, which cancels between numerator and
            # normaliser of row i and uses no other position (causality is kept)
            logits = logits - logits.amax(-1, keepdim=True).detach()
        # keys: no data-dependent stabiliser (a max over keys would let future keys rescale past ones through
        # eps); w.k' - |k'|^2 / 2 <= |w|^2 / 2 bounds the exponent, finite in fp32 / bf16 for D <= 128
        out = torch.exp(logits) * num_features ** -0.5
    elif feature_map == "taylor":
        xs = xf * d ** -0.25
        outer = (xs.unsqueeze(-1) * xs.unsqueeze(-2)).flatten(-2) * 0.5 ** 0.5
        out = torch.cat([torch.ones_like(xs[..., :1]), xs, outer], dim=-1)
    else:
        raise ValueError(f"feature_map={feature_map!r} is not supported; allowed values: {', '.join(FEATURE_MAPS)}")
    return out.to(x.dtype)
