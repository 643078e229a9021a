"""``triton`` backend of ``linear``: the fused chunked kernel of :mod:`kernels.linear`.

Feature maps: ``elu1`` and ``relu`` are applied inside the kernels (no ``phi(q)``/``phi(k)`` tensors are
written, and the backward multiplies by ``phi'`` in-kernel); ``favor`` is computed in PyTorch by
:func:`attn_zoo.feature_maps.apply_feature_map` (autograd through it) and the kernel runs on the features.
``taylor`` runs on the *symmetric* Taylor features (:func:`attn_zoo.feature_maps.taylor_symmetric_features`,
``F = 1 + D + D (D + 1) / 2``: the same kernel value ``1 + s + s^2 / 2`` as the full map's ``1 + D + D^2``
features, 153 instead of 273 at ``D = 16``). ``F`` and ``Dv`` must be <= 256: the Taylor map up to
``D = TAYLOR_MAX_HEAD_DIM = 21`` (253 features; ``D = 22`` needs 276), past it ``supports`` refuses naming the
limit (backends ``parallel`` / ``torch`` take any ``D``).

Range: Taylor features grow like ``x_a x_b / sqrt(D)`` and overflow float16 (65504) from ``|x| ~ 430`` at
``D = 8``, so with float16 inputs the Taylor map runs in float32 end to end (features, ``v``, kernel; output
cast back to float16, which is safe: Taylor weights ``1 + s + s^2 / 2 >= 1/2`` are positive, so every output
row is a convex combination of ``v`` rows). bfloat16 keeps the float32 exponent range and runs as is; elu1 /
relu are unaffected. FAVOR in float16 is refused (``supports``).

Bottom-right causal alignment (``i' = i + Nk - Nq``): with ``Nk > Nq`` the first ``Nk - Nq`` keys are
summed into an initial state ``(S0, z0)`` (fp32, differentiable) and the kernel runs causally on the last
``Nq`` keys; with ``Nq > Nk`` the first ``Nq - Nk`` query rows see no key and output 0.

Packed documents (``doc_ids (B, Nk)``, issue 27): causal runs the kernel's document mode (the state restarts at
every document start, inside chunks too); with ``Nk > Nq`` the initial state sums only the prefix keys of the
document of key ``Nk - Nq`` (the document the first query is in). Non-causal with documents (each query reads its
whole document's sums) is not fused: it runs the chunked PyTorch form of the ``torch`` backend
(:func:`attn_zoo.backends.torch_linear.chunked_linear_attention`), the same numbers, documented here rather than
refused so that ``auto`` keeps working.

Kernel settings (:class:`kernels.LinearConfig`) come from ``config=``, else a ``linear_config`` field of the spec
if it has one, else the current settings (``LinearConfig()`` or the innermost :func:`kernels.linear_settings`).
"""

from __future__ import annotations

import torch

from ..feature_maps import (apply_feature_map, feature_dim, taylor_symmetric_dim, taylor_symmetric_features,
                            taylor_symmetric_max_head_dim)
from ..registry import register_backend
from ._triton import triton_input_reason

_FUSED = ("elu1", "relu")
KERNEL_MAX_DIM = 256  # kernels.linear.MAX_DIM (checked at import of the kernel: _supports)
TAYLOR_MAX_HEAD_DIM = taylor_symmetric_max_head_dim(KERNEL_MAX_DIM)
"""The largest head dim ``D`` the Taylor map runs at on this backend: 21 (``1 + D + D (D + 1) / 2 = 253 <= 256``)."""


def taylor_limit_reason(head_dim: int, max_dim: int = KERNEL_MAX_DIM):
    """``None`` when the symmetric Taylor features of ``head_dim`` fit the chunked kernel, else the reason."""
    fdim = taylor_symmetric_dim(head_dim)
    if fdim <= max_dim:
        return None
    return (f"the Taylor map at D={head_dim} needs 1 + D + D(D+1)/2 = {fdim} symmetric features, past the chunked "
            f"kernel's limit of {max_dim} (the triton backend takes the Taylor map up to "
            f"D={taylor_symmetric_max_head_dim(max_dim)}; backends parallel / torch take any D)")


def _supports(q, k, v, spec, return_lse):
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    why = triton_input_reason(q)
    if why is not None:
        return why
    try:
        from kernels.linear import CHUNK_SIZES, MAX_DIM
    except Exception as e:  # pragma: no cover - triton missing / broken
        return f"kernels.linear cannot be imported ({type(e).__name__}: {e})"
    if spec.chunk_size not in CHUNK_SIZES:
        return f"chunk_size={spec.chunk_size} is not one of the kernel's {CHUNK_SIZES} (the torch backend takes any)"
    if spec.feature_map == "favor" and q.dtype == torch.float16:
        return "favor key features can exceed the float16 range (they have no data-dependent stabiliser); use bfloat16 / float32"
    if spec.feature_map == "taylor":
        why = taylor_limit_reason(q.shape[-1], MAX_DIM)
        if why is not None:
            return why
        fdim = taylor_symmetric_dim(q.shape[-1])
    else:
        fdim = feature_dim(spec.feature_map, q.shape[-1], spec.num_features)
    if fdim > MAX_DIM:
        return f"feature dim F={fdim} ({spec.feature_map}, D={q.shape[-1]}) exceeds the kernel's limit of {MAX_DIM}"
    if v.shape[-1] > MAX_DIM:
        return f"value dim Dv={v.shape[-1]} exceeds the kernel's limit of {MAX_DIM}"
    return None


def _phi(x: torch.Tensor, spec, is_query: bool) -> torch.Tensor:
    """The features the kernel runs on: the symmetric ones for ``taylor`` (module docstring), else the map's."""
    if spec.feature_map == "taylor":
        return taylor_symmetric_features(x)
    return apply_feature_map(x, spec.feature_map, is_query=is_query, num_features=spec.num_features, seed=spec.seed)


@register_backend("linear", "triton", supports=_supports, documents=True)
def triton_linear(q, k, v, spec, return_lse=False, config=None, doc_ids=None):
    """Linear attention of ``spec`` through the Triton kernel; ``(B, Hq, Nq, Dv)`` in ``q.dtype``. ``config``: a
    :class:`kernels.LinearConfig` (default: module docstring). ``doc_ids (B, Nk)``: packed documents (module
    docstring)."""
    from kernels.linear import linear_attention

    if spec.feature_map == "taylor":
        why = taylor_limit_reason(q.shape[-1])
        if why is not None:
            raise ValueError(f"q.shape[-1]: {why}")
    if spec.feature_map == "taylor" and q.dtype == torch.float16:  # fp16 range (module docstring): fp32 run
        return triton_linear(q.float(), k.float(), v.float(), spec, config=config, doc_ids=doc_ids).to(q.dtype)
    if doc_ids is not None and not spec.causal:  # not fused (module docstring): per-document sums in PyTorch
        from .torch_linear import torch_linear_attention

        return torch_linear_attention(q, k, v, spec, doc_ids=doc_ids)
    if config is None:
        config = getattr(spec, "linear_config", None)
    fused = spec.feature_map in _FUSED
    fm = spec.feature_map if fused else None
    if not fused:
        q = _phi(q, spec, True)
        k = _phi(k, spec, False)
    Nq, Nk = q.shape[2], k.shape[2]
    kw = dict(eps=spec.eps, feature_map=fm, chunk_size=spec.chunk_size, config=config)
    if not spec.causal:
        return linear_attention(q, k, v, causal=False, **kw)
    if Nk > Nq:  # keys before the first query position: fold into the initial state (fp32)
        p = Nk - Nq
        kp = k[:, :, :p].float()
        if fused:
            kp = _phi(kp, spec, False)
        vp = v[:, :, :p].float()
        if doc_ids is not None:  # only the prefix keys of the first query's document (read by document 1)
            same = (doc_ids[:, :p] == doc_ids[:, p:p + 1]).view(q.shape[0], 1, p, 1)
            kp, vp = torch.where(same, kp, 0.0), torch.where(same, vp, 0.0)
        s0 = kp.transpose(-1, -2) @ vp  # (B, Hkv, F, Dv)
        z0 = kp.sum(2)
        return linear_attention(q, k[:, :, p:], v[:, :, p:], causal=True, initial_state=(s0, z0),
                                doc_ids=None if doc_ids is None else doc_ids[:, p:], **kw)
    if Nq > Nk:  # the first Nq - Nk query rows see no key: exact zeros
        p = Nq - Nk
        out = linear_attention(q[:, :, p:], k, v, causal=True, doc_ids=doc_ids, **kw)
        top = out.new_zeros(out.shape[0], out.shape[1], p, out.shape[3])
        return torch.cat([top, out], dim=2)
    return linear_attention(q, k, v, causal=True, doc_ids=doc_ids, **kw)
