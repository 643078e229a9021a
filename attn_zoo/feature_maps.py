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

The Taylor map's quadratic block is symmetric (entries ``(a, b)`` and ``(b, a)`` are equal), so the same kernel
value comes from :func:`taylor_symmetric_features`, ``F = 1 + D + D (D + 1) / 2`` (153 at ``D = 16``, against
273): ``[1, x', x'_a^2 / sqrt(2), x'_a x'_b (a < b)]``. The chunked ``triton`` backend runs on these (they fit
its 256-feature kernel up to ``D = 21``); every other path, and the recurrent state of
:mod:`attn_zoo.decode.linear`, keeps the full map (:func:`taylor_state_to_symmetric` /
:func:`taylor_state_from_symmetric` convert a state between the two, exactly).
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


# --------------------------------------------------------------------------------------------- symmetric Taylor
def taylor_symmetric_dim(head_dim: int) -> int:
    """Width of :func:`taylor_symmetric_features` for input width ``head_dim``: ``1 + D + D (D + 1) / 2``."""
    return 1 + head_dim + head_dim * (head_dim + 1) // 2


def taylor_symmetric_max_head_dim(max_features: int) -> int:
    """The largest ``D`` whose symmetric Taylor features fit in ``max_features`` (21 for 256; 0 if none)."""
    d = 0
    while taylor_symmetric_dim(d + 1) <= max_features:
        d += 1
    return d


@lru_cache(maxsize=64)
def _sym_pairs(head_dim: int, device: str):
    """``(i, j, w, flat)``: the pairs ``a <= b`` in ``torch.triu_indices`` order (int64 ``(P,)``), their weights
    (``1 / sqrt(2)`` on the diagonal, 1 above it; fp64) and their flat index ``a * D + b`` in a ``(D, D)`` block."""
    ij = torch.triu_indices(head_dim, head_dim)
    i, j = ij[0], ij[1]
    w = torch.where(i == j, torch.tensor(0.5, dtype=torch.float64).sqrt(), torch.tensor(1.0, dtype=torch.float64))
    return i.to(device), j.to(device), w.to(device), (i * head_dim + j).to(device)


class _TaylorSymmetric(torch.autograd.Function):
    """``x (..., D)`` -> ``[1, x', w_p x'_i x'_j]`` in ``out_dtype``, math in ``math_dtype``. The backward saves only
    ``x'`` (no ``(..., P)`` intermediate) and builds ``dx'`` deterministically (no scatter-add): with ``M`` the
    upper-triangular ``(D, D)`` matrix holding ``g_p w_p`` at ``(i_p, j_p)``, ``dx' = g_lin + (M + M^T) x'``."""

    @staticmethod
    def forward(ctx, x, out_dtype, math_dtype):
        d = x.shape[-1]
        xs = x.to(math_dtype) * d ** -0.25
        i, j, w, _ = _sym_pairs(d, str(x.device))
        quad = xs.index_select(-1, i) * xs.index_select(-1, j) * w.to(math_dtype)
        out = torch.cat([torch.ones_like(xs[..., :1]), xs, quad], dim=-1).to(out_dtype)
        ctx.save_for_backward(xs)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (xs,) = ctx.saved_tensors
        d = xs.shape[-1]
        _, _, w, flat = _sym_pairs(d, str(xs.device))
        g = g.to(xs.dtype)
        m = xs.new_zeros(*xs.shape[:-1], d * d)
        m.index_copy_(m.dim() - 1, flat, g[..., 1 + d:] * w.to(xs.dtype))  # each flat slot once: no accumulation
        m = m.view(*xs.shape[:-1], d, d)
        dxs = g[..., 1:1 + d] + ((m + m.transpose(-1, -2)) @ xs.unsqueeze(-1)).squeeze(-1)
        return (dxs * d ** -0.25).to(ctx.x_dtype), None, None


def taylor_symmetric_features(x: torch.Tensor) -> torch.Tensor:
    """Symmetric Taylor features: ``(..., N, D) -> (..., N, 1 + D + D (D + 1) / 2)`` in ``x.dtype``.

    ``[1, x_a / D^(1/4), x_a^2 / (sqrt(2) sqrt(D)), x_a x_b / sqrt(D) (a < b)]`` (pairs in ``torch.triu_indices``
    order), so ``taylor_symmetric_features(q) . taylor_symmetric_features(k) = 1 + s + s^2 / 2`` with
    ``s = q.k / sqrt(D)``: the kernel value of the ``taylor`` map of :func:`apply_feature_map` (to rounding) with
    ``D (D - 1) / 2`` fewer features. Computed like :func:`apply_feature_map`: fp32 math (fp64 for fp64 inputs),
    rounded once to ``x.dtype`` at the end (bfloat16 features carry bfloat16's 8-bit mantissa, as the full map's
    do). Differentiable in ``x`` (first order; the backward is deterministic, see :class:`_TaylorSymmetric`).

    Raises ``ValueError`` for a non-floating ``x`` or ``D < 1``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a last (head) dim D >= 1, got shape {tuple(x.shape)}")
    math_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _TaylorSymmetric.apply(x, x.dtype, math_dtype)


@lru_cache(maxsize=64)
def _sym_state_maps(head_dim: int, device: str):
    """Index / weight vectors of the two state conversions (module docstring), for feature rows ``1 + D + ...``."""
    d = head_dim
    i, j, w, flat = _sym_pairs(d, "cpu")
    # full -> symmetric: row p = (S[i, j] + S[j, i]) / sqrt(2) above the diagonal, S[i, i] on it
    tr = j * d + i  # flat index of the transposed entry
    to_a, to_b = flat, tr
    half, root = torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64).sqrt()
    to_w = torch.where(i == j, half, root)  # diagonal: (S_ii + S_ii) / 2
    # symmetric -> full: entry (a, b) = sym[p(min, max)] / sqrt(2) off the diagonal, sym[p(a, a)] on it
    pair = torch.full((d * d,), -1, dtype=torch.int64)
    pair[flat] = torch.arange(flat.numel())
    pair[tr] = torch.arange(flat.numel())
    a = torch.arange(d * d) // d
    b = torch.arange(d * d) % d
    from_w = torch.where(a == b, torch.tensor(1.0, dtype=torch.float64), root)
    return tuple(t.to(device) for t in (to_a, to_b, to_w, pair, from_w))


def _check_state(S, z, n: int, what: str):
    if S.dim() < 2 or z.dim() < 1 or S.shape[-2] != n or z.shape[-1] != n or S.shape[:-2] != z.shape[:-1]:
        raise ValueError(f"{what}: S must be (..., {n}, Dv) and z (..., {n}) with the same leading dims, got "
                         f"S {tuple(S.shape)}, z {tuple(z.shape)}")


def taylor_state_to_symmetric(S: torch.Tensor, z: torch.Tensor, head_dim: int):
    """A linear-attention state in the full Taylor map's features -> the symmetric features' (same dtype).

    ``S (..., 1 + D + D^2, Dv)``, ``z (..., 1 + D + D^2)`` -> ``S (..., 1 + D + D (D + 1) / 2, Dv)``, ``z (...)``:
    pair row ``(a, b)``, ``a < b``, is ``(S[a, b] + S[b, a]) / sqrt(2)``, the diagonal rows are kept, so
    ``phi_sym(q) . S_sym = phi(q) . S`` for every ``q`` and any ``S`` (not only symmetric ones). Differentiable.
    Raises ``ValueError`` on shapes that do not match ``head_dim``."""
    d = head_dim
    _check_state(S, z, 1 + d + d * d, "taylor_state_to_symmetric")
    ia, ib, w, _, _ = _sym_state_maps(d, str(S.device))

    def conv(t, dim):
        head, quad = t.narrow(dim, 0, 1 + d), t.narrow(dim, 1 + d, d * d)
        shape = [1] * t.dim()
        shape[dim] = -1
        ww = w.to(t.dtype).view(shape)
        return torch.cat([head, (quad.index_select(dim, ia) + quad.index_select(dim, ib)) * ww], dim)

    return conv(S, S.dim() - 2), conv(z, z.dim() - 1)


def taylor_state_from_symmetric(S: torch.Tensor, z: torch.Tensor, head_dim: int):
    """The inverse of :func:`taylor_state_to_symmetric` on states built from keys: ``S (..., 1 + D + D (D + 1) / 2,
    Dv)``, ``z`` -> the full map's ``S (..., 1 + D + D^2, Dv)``, ``z`` (entry ``(a, b)`` = pair row / ``sqrt(2)``
    off the diagonal, the diagonal row on it), so ``phi(q) . S = phi_sym(q) . S_sym``; a state summed from full
    features is recovered exactly (its ``(a, b)`` and ``(b, a)`` rows are equal). Differentiable. Raises
    ``ValueError`` on shapes that do not match ``head_dim``."""
    d = head_dim
    _check_state(S, z, taylor_symmetric_dim(d), "taylor_state_from_symmetric")
    _, _, _, pair, w = _sym_state_maps(d, str(S.device))

    def conv(t, dim):
        head, quad = t.narrow(dim, 0, 1 + d), t.narrow(dim, 1 + d, t.shape[dim] - 1 - d)
        shape = [1] * t.dim()
        shape[dim] = -1
        return torch.cat([head, quad.index_select(dim, pair) * w.to(t.dtype).view(shape)], dim)

    return conv(S, S.dim() - 2), conv(z, z.dim() - 1)
