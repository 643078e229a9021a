"""Linear attention at decode time: an O(1) state per sequence instead of a KV cache.

Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 16-20) is an RNN with state

    S_t = S_{t-1} + phi(k_t)^T v_t    (F x Dv)        z_t = z_{t-1} + phi(k_t)    (F)
    out_t = phi(q_t) S_t / (phi(q_t) . z_t + eps)

per sequence and K/V head (GQA: the ``Hq / Hkv`` query heads of a group read their K/V head's state). The
state is ``Hkv * (F * Dv + F)`` fp32 numbers per sequence and layer, whatever the context length.

* :func:`linear_prefill` runs the chunked causal form (Yang et al. 2024, "Gated Linear Attention", sec. 2.2)
  over ``N`` tokens, optionally from an initial state, and returns the outputs *and* the final state (the
  Triton kernel :func:`kernels.linear.linear_attention` with ``initial_state`` / ``output_final_state`` on CUDA;
  the same math in PyTorch elsewhere).
* :func:`linear_decode` advances the state token by token with the recurrence above (O(F * Dv) per token).

The state is always in the feature space of the spec's map (``F = feature_dim(...)``, :class:`LinearState`): for
the Taylor map that is the full ``1 + D + D^2``, also when the Triton prefill runs the kernel on the symmetric
features (``1 + D + D (D + 1) / 2``, :func:`attn_zoo.feature_maps.taylor_symmetric_features`): it converts the
initial state to them and the final state back (:func:`attn_zoo.feature_maps.taylor_state_to_symmetric` /
``taylor_state_from_symmetric``, exact: the same outputs for every query), so states from any backend mix.

Prefill ``N`` tokens then decode ``M`` equals causal linear attention over ``N + M`` tokens (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..feature_maps import (apply_feature_map, feature_dim, taylor_state_from_symmetric, taylor_state_to_symmetric,
                            taylor_symmetric_features)
from ..functional import check_inputs
from ..reference import repeat_kv, upcast
from ..spec import AttentionSpec

LINEAR_DECODE_BACKENDS = ("triton", "torch", "reference")


@dataclass
class LinearState:
    """Running sums of one linear-attention layer: ``S (B, Hkv, F, Dv)`` and ``z (B, Hkv, F)``, fp32 (fp64 for
    fp64 inputs); ``n`` tokens summed so far (host int)."""

    S: torch.Tensor
    z: torch.Tensor
    n: int = 0

    def tokens_seen(self) -> List[int]:
        """Tokens seen so far, per row (all ``n``)."""
        return [self.n] * self.S.shape[0]

    @classmethod
    def zeros(cls, batch: int, n_kv_heads: int, feature_dim: int, value_dim: int, device=None,
              dtype: torch.dtype = torch.float32) -> "LinearState":
        return cls(torch.zeros(batch, n_kv_heads, feature_dim, value_dim, device=device, dtype=dtype),
                   torch.zeros(batch, n_kv_heads, feature_dim, device=device, dtype=dtype), 0)

    @classmethod
    def for_spec(cls, spec: AttentionSpec, batch: int, n_kv_heads: int, head_dim: int, device=None) -> "LinearState":
        """An empty state for ``spec`` (``F = feature_dim(spec.feature_map, head_dim, spec.num_features)``)."""
        return cls.zeros(batch, n_kv_heads, feature_dim(spec.feature_map, head_dim, spec.num_features), head_dim, device)

    @property
    def nbytes(self) -> int:
        return self.S.numel() * self.S.element_size() + self.z.numel() * self.z.element_size()


def _features(x: torch.Tensor, spec: AttentionSpec, is_query: bool) -> torch.Tensor:
    return apply_feature_map(upcast(x), spec.feature_map, is_query=is_query, num_features=spec.num_features,
                             seed=spec.seed)


def _check(q, k, v, spec, state, what: str) -> None:
    if not isinstance(spec, AttentionSpec) or spec.family != "linear":
        from ..variants import kinds_of

        raise ValueError(f"{what} needs a spec of the linear family (kind={' / '.join(map(repr, kinds_of('linear')))}), "
                         f"got {getattr(spec, 'kind', type(spec).__name__)!r}")
    if not spec.causal:
        raise ValueError(f"{what}: decoding needs a causal spec (causal=False attends future tokens)")
    check_inputs(q, k, v, spec)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{what}: q and k must hold the same new tokens, got Nq={q.shape[2]}, Nk={k.shape[2]}")
    if state is not None:
        if not isinstance(state, LinearState):
            raise TypeError(f"state must be a LinearState, got {type(state).__name__}")
        B, Hkv = k.shape[:2]
        Fd = feature_dim(spec.feature_map, q.shape[-1], spec.num_features)
        if tuple(state.S.shape) != (B, Hkv, Fd, v.shape[-1]) or tuple(state.z.shape) != (B, Hkv, Fd):
            raise ValueError(f"state shapes S {tuple(state.S.shape)}, z {tuple(state.z.shape)} must be "
                             f"{(B, Hkv, Fd, v.shape[-1])} and {(B, Hkv, Fd)}")


def _chunked_with_state(fq, fk, v, S0, z0, eps: float, C: int):
    """Chunked causal form from an initial state: ``fq (B, Hq, N, F)``, ``fk (B, Hkv, N, F)``, ``v (B, Hkv, N, Dv)``,
    ``S0 (B, Hkv, F, Dv)``, ``z0 (B, Hkv, F)``; returns ``out (B, Hq, N, Dv)`` (fp32) and the final ``(S, z)``."""
    B, Hq, N, Fd = fq.shape
    G = Hq // fk.shape[1]
    Dv = v.shape[-1]
    S_fin = S0 + fk.transpose(-1, -2) @ v  # (B, Hkv, F, Dv)
    z_fin = z0 + fk.sum(2)
    fkg, vg = repeat_kv(fk, G), repeat_kv(v, G)
    S0g, z0g = repeat_kv(S0, G), z0.repeat_interleave(G, dim=1)
    pad = (-N) % C
    if pad:
        fq, fkg, vg = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fkg, vg))
    nc = (N + pad) // C
    qc, kc, vc = fq.view(B, Hq, nc, C, Fd), fkg.view(B, Hq, nc, C, Fd), vg.view(B, Hq, nc, C, Dv)
    tril = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()
    a = (qc @ kc.transpose(-1, -2)).masked_fill(~tril, 0.0)  # (B, Hq, nc, C, C)
    s_prev = torch.cat([S0g.unsqueeze(2), (kc.transpose(-1, -2) @ vc)[:, :, :-1]], dim=2).cumsum(2)
    z_prev = torch.cat([z0g.unsqueeze(2), kc.sum(3)[:, :, :-1]], dim=2).cumsum(2)
    num = a @ vc + qc @ s_prev
    den = a.sum(-1) + (qc * z_prev.unsqueeze(3)).sum(-1) + eps
    out = (num / den.unsqueeze(-1)).reshape(B, Hq, nc * C, Dv)[:, :, :N]
    return out, S_fin, z_fin


def _quadratic_with_state(fq, fk, v, S0, z0, eps: float):
    """Reference: masked quadratic form plus the initial state's contribution (fp32, ``(N, N)`` materialised)."""
    G = fq.shape[1] // fk.shape[1]
    N = fq.shape[2]
    fkg, vg = repeat_kv(fk, G), repeat_kv(v, G)
    a = (fq @ fkg.transpose(-1, -2)).masked_fill(~torch.ones(N, N, dtype=torch.bool, device=fq.device).tril(), 0.0)
    num = a @ vg + fq @ repeat_kv(S0, G)
    den = a.sum(-1, keepdim=True) + (fq * z0.repeat_interleave(G, dim=1).unsqueeze(2)).sum(-1, keepdim=True) + eps
    return num / den, S0 + fk.transpose(-1, -2) @ v, z0 + fk.sum(2)


def _triton_reason(q, k, v, spec) -> Optional[str]:
    from ..registry import get_backends

    b = get_backends(spec.kind).get("triton")
    if b is None:
        return f"no triton backend registered for kind={spec.kind!r}"
    return b.supports(q, k, v, spec, False)


STATELESS_FORMS = ("parallel", "taylor_chunk")
"""Backends of :func:`attn_zoo.attention` for ``linear`` that return no state; :func:`linear_prefill` runs them as
``"auto"``."""


def linear_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, state: Optional[LinearState] = None,
    backend: str = "auto",
) -> Tuple[torch.Tensor, LinearState]:
    """Causal linear attention over ``N`` new tokens, continuing from ``state``; returns the outputs and the state.

    Args:
        q: ``(B, Hq, N, D)``; k: ``(B, Hkv, N, D)``; v: ``(B, Hkv, N, Dv)`` (the same ``N`` new tokens).
        spec: causal ``linear`` spec (feature map, eps, chunk size).
        state: :class:`LinearState` of the tokens before (``None``: empty).
        backend: ``"auto"`` (Triton kernel on CUDA when it supports the input, else ``"torch"``), ``"triton"``
            (:func:`kernels.linear.linear_attention` with ``initial_state`` / ``output_final_state``), ``"torch"``
            (chunked PyTorch form), ``"reference"`` (masked quadratic form, fp32); :data:`STATELESS_FORMS`
            (``"parallel"``, ``"taylor_chunk"``: the Taylor map's fused forms in :func:`attn_zoo.attention`, which
            return no state) run as ``"auto"``.

    Returns:
        ``out (B, Hq, N, Dv)`` in ``q.dtype`` (equal to :func:`attn_zoo.attention` of the whole sequence's last
        ``N`` rows) and the new :class:`LinearState` (fp32; ``n`` advanced by ``N``).

    Raises:
        ValueError / TypeError: non-linear or non-causal spec, bad shapes / dtypes, ``Nq != Nk``, state shapes,
        unknown backend or one that cannot run the input.
    """
    _check(q, k, v, spec, state, "linear_prefill")
    B, Hkv, N = k.shape[0], k.shape[1], k.shape[2]
    if backend in STATELESS_FORMS:  # attention()'s fused Taylor forms keep no state: the prefill, which must return
        backend = "auto"            # one, takes a chunked form (a model built with backend='parallel' generates)
    if backend == "auto":
        backend = "triton" if q.is_cuda and _triton_reason(q, k, v, spec) is None else "torch"
    if backend not in LINEAR_DECODE_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: auto, {', '.join(LINEAR_DECODE_BACKENDS)}")
    n0 = state.n if state is not None else 0
    if backend == "triton":
        why = _triton_reason(q, k, v, spec)
        if why is not None:
            raise ValueError(f"backend='triton' cannot run this input for kind={spec.kind!r}: {why}")
        from kernels.linear import linear_attention

        fused = spec.feature_map in ("elu1", "relu")
        taylor = spec.feature_map == "taylor"
        init = None if state is None else (state.S.float(), state.z.float())
        if taylor:  # the kernel runs on the symmetric features; the state stays in the full map's (module docstring)
            vv = v.float() if q.dtype == torch.float16 else v  # fp16: Taylor features overflow it (triton backend)
            qq, kk = (taylor_symmetric_features(t.float() if q.dtype == torch.float16 else t) for t in (q, k))
            if init is not None:
                init = taylor_state_to_symmetric(*init, q.shape[-1])
        else:
            vv = v
            qq, kk = (q, k) if fused else (_features(q, spec, True).to(q.dtype), _features(k, spec, False).to(k.dtype))
        out, (S, z) = linear_attention(qq, kk, vv, causal=True, eps=spec.eps,
                                       feature_map=spec.feature_map if fused else None, initial_state=init,
                                       output_final_state=True, chunk_size=spec.chunk_size)
        if taylor:
            S, z = taylor_state_from_symmetric(S, z, q.shape[-1])
        return out.to(q.dtype), LinearState(S, z, n0 + N)
    fq, fk, vf = _features(q, spec, True), _features(k, spec, False), upcast(v)
    if state is None:
        state = LinearState.zeros(B, Hkv, fq.shape[-1], v.shape[-1], q.device, fq.dtype)
    S0, z0 = state.S.to(fq.dtype), state.z.to(fq.dtype)
    if backend == "torch":
        out, S, z = _chunked_with_state(fq, fk, vf, S0, z0, spec.eps, spec.chunk_size)
    else:
        out, S, z = _quadratic_with_state(fq, fk, vf, S0, z0, spec.eps)
    return out.to(q.dtype), LinearState(S, z, n0 + N)


def linear_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: LinearState, spec: AttentionSpec,
) -> Tuple[torch.Tensor, LinearState]:
    """Recurrent step(s): append the ``Nq`` new tokens to ``state`` one at a time and read each output.

    ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nq, D)``, ``v (B, Hkv, Nq, Dv)`` (``Nq`` is usually 1); for each token
    ``S += phi(k_t)^T v_t``, ``z += phi(k_t)``, ``out_t = phi(q_t) S / (phi(q_t) . z + eps)`` (fp32). O(Nq * F * Dv)
    per head, independent of the context length. Returns ``out (B, Hq, Nq, Dv)`` in ``q.dtype`` and the new
    state (the input state is not modified). Raises as :func:`linear_prefill`.
    """
    if state is None:
        raise ValueError("linear_decode needs a LinearState (run linear_prefill first, or LinearState.for_spec)")
    _check(q, k, v, spec, state, "linear_decode")
    G = q.shape[1] // k.shape[1]
    fq, fk, vf = _features(q, spec, True), _features(k, spec, False), upcast(v)
    S, z = state.S.to(fq.dtype), state.z.to(fq.dtype)
    outs = []
    for t in range(q.shape[2]):
        S = S + fk[:, :, t, :, None] * vf[:, :, t, None, :]  # (B, Hkv, F, Dv)
        z = z + fk[:, :, t]
        qt = fq[:, :, t].view(q.shape[0], k.shape[1], G, -1)  # (B, Hkv, G, F): heads of a group share S, z
        num = qt @ S  # (B, Hkv, G, Dv)
        den = (qt * z.unsqueeze(2)).sum(-1, keepdim=True) + spec.eps
        outs.append((num / den).reshape(q.shape[0], q.shape[1], -1))
    return torch.stack(outs, 2).to(q.dtype), LinearState(S, z, state.n + q.shape[2])
