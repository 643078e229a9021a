"""The one interface: :func:`attention`."""

from __future__ import annotations

import torch

from .registry import auto_order, backend_names, derived_dict, get_backends
from .spec import AttentionSpec

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> None:
    """Validate shapes, dtypes and devices; raises ``ValueError`` / ``TypeError`` naming the argument."""
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec must be an attn_zoo.AttentionSpec, got {type(spec).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32, float64")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}")
    B, Hq, Nq, D = q.shape
    if B < 1:
        raise ValueError(f"batch size must be >= 1, got B={B} (q.shape[0])")
    if Hq < 1:
        raise ValueError(f"number of query heads must be >= 1, got Hq={Hq} (q.shape[1])")
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q={B}, k={k.shape[0]}, v={v.shape[0]}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in (B, Hkv, Nk)")
    if k.shape[3] != D:
        raise ValueError(f"q and k head dims differ: q D={D}, k D={k.shape[3]}")
    Hkv = k.shape[1]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (k.shape[1]) for grouped-query attention")
    if min(Nq, k.shape[2]) < 1 or D < 1 or v.shape[3] < 1:
        raise ValueError(f"sequence lengths and head dims must be >= 1, got Nq={Nq}, Nk={k.shape[2]}, D={D}, "
                         f"Dv={v.shape[3]} (v.shape[3])")


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, backend: str = "auto",
    return_lse: bool = False,
):
    """Attention of any registered variant through one call.

    Args:
        q: ``(B, Hq, Nq, D)`` float16 / bfloat16 / float32 (float64 on ``reference``).
        k: ``(B, Hkv, Nk, D)``; ``Hkv`` must divide ``Hq`` (GQA: query head ``h`` uses K/V head
           ``h // (Hq // Hkv)``; MQA is ``Hkv = 1``).
        v: ``(B, Hkv, Nk, Dv)``.
        spec: :class:`attn_zoo.AttentionSpec` (kind, causal, window_size, block layout, feature map, ...).
        backend: ``"auto"`` (our Triton kernel on CUDA where it supports the input, else ``"torch"``, else
            ``"reference"``: the registered backends by priority), or any registered name
            (:func:`attn_zoo.registry.backend_names`): ``"triton"``, ``"torch"``, ``"reference"``, the anchors
            ``"sdpa_flash"``, ``"sdpa_cudnn"``, ``"sdpa_efficient"``, ``"sdpa_math"``, ``"flex"``, ``"naive"``,
            ``"fa2"``, ``"fa3"``, ``"fa4"``, ``"flex_fa4"``, ``"fla"``, and any plugin's (an anchor whose package is
            missing refuses with the package and the pyproject extra to install, e.g. ``pip install -e .[fa4]``).
        return_lse: also return the log-sum-exp ``(B, Hq, Nq)`` (softmax kinds; natural log; fp32, fp64 for
            fp64 inputs on ``reference``).

    Returns:
        ``(B, Hq, Nq, Dv)`` in ``q.dtype`` (and ``lse`` if asked). Rows that see no key are 0.

    Raises:
        ValueError / TypeError: bad shapes (any of ``B, Hq, Hkv, Nq, Nk, D, Dv`` zero), dtypes, devices,
        ``Hq % Hkv != 0``, unknown backend, or a backend that cannot run this input (the message says why).
    """
    try:
        key = (spec, backend, return_lse, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
               v.device)
        b = _DISPATCH.get(key)
    except (TypeError, AttributeError):  # an unhashable spec, or q / k / v not tensors: check_inputs names it
        key, b = None, None
    if b is None:
        b = resolve_backend(q, k, v, spec, backend, return_lse)
        if key is not None:
            if len(_DISPATCH) >= 1024:
                _DISPATCH.clear()
            _DISPATCH[key] = b
    return b.fn(q, k, v, spec, return_lse=return_lse)


# A call signature (spec, backend, shapes, dtypes, devices) whose inputs passed check_inputs and whose backend's
# supports() accepted them: every check reads nothing else, so a repeated call (each layer of each training step)
# goes straight to the implementation. Every (un)registration of a backend or variant clears it
# (attn_zoo.registry.forget_derived).
_DISPATCH = derived_dict()


def resolve_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, backend: str = "auto",
                    return_lse: bool = False):
    """The registered :class:`~attn_zoo.registry.Backend` that :func:`attention` runs for these inputs.

    ``backend="auto"`` tries the registered backends that have a priority, highest first -- ``triton`` (CUDA
    tensors only: our kernels; under ``TRITON_INTERPRET=1`` on the CPU only when asked for by name), then ``torch``,
    then ``reference`` -- and takes the first that is available and whose ``supports()`` accepts the input. On CUDA that is ``triton`` for every kind -- ``flash`` / ``sliding_window`` / ``sparse`` with
    fp16 / bf16 / fp32, ``D <= 256`` and ``Dv <= 256``; ``linear`` with ``chunk_size`` in (16, 32, 64, 128), feature
    dim <= 256 and no FAVOR in fp16; the Taylor map with ``D >= 16`` (273+ features) goes to ``parallel``, its fused
    quadratic form -- else ``torch`` (SDPA / FlexAttention / chunked PyTorch); the reasons of the
    backends it passed over are in the error when none fits. Raises ``ValueError`` / ``TypeError`` as
    :func:`attention`.
    """
    check_inputs(q, k, v, spec)
    regs = get_backends(spec.kind)
    if backend == "auto":
        reasons = []
        for b in auto_order(regs):
            if b.devices is not None and q.device.type not in b.devices:
                where = " / ".join("CUDA" if d == "cuda" else d for d in b.devices)
                reasons.append(f"{b.name}: auto uses it on {where} only")
                continue
            why = b.why_not(q, k, v, spec, return_lse)
            if why is None:
                return b
            reasons.append(f"{b.name}: {why}")
        raise ValueError(f"no backend supports this input for kind={spec.kind!r}: " + "; ".join(reasons))
    b = regs.get(backend) if isinstance(backend, str) else None
    if b is None:
        names = backend_names()
        if backend not in names:
            raise ValueError(f"backend={backend!r} is not supported; allowed values: auto, {', '.join(names)}")
        raise ValueError(f"backend={backend!r} is not registered for kind={spec.kind!r}; available: "
                         f"{', '.join(backend_names(spec.kind))}")
    why = b.why_not(q, k, v, spec, return_lse)
    if why is not None:
        raise ValueError(f"backend={backend!r} cannot run this input for kind={spec.kind!r}: {why}")
    return b
