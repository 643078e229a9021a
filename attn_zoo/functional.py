"""The one interface: :func:`attention`."""

from __future__ import annotations

from typing import Optional

import torch

from .documents import check_doc_ids, refuse_documents
from .registry import auto_order, backend_names, derived_dict, document_backends, get_backends
from .spec import AttentionSpec

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_tensors(q, k, v, ndim: int, layout: str) -> None:
    """q, k, v are tensors of ``ndim`` dimensions (``layout``), one supported dtype, one device; raises
    ``TypeError`` / ``ValueError`` naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32, float64")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q={q.device}, k={k.device}, v={v.device}")


def _check_return_lse(return_lse) -> None:
    """Refuse a ``return_lse`` that is not ``True`` / ``False`` (a truthy stand-in changes what comes back)."""
    if return_lse is not True and return_lse is not False:
        raise ValueError(f"return_lse={return_lse!r} is not supported; allowed values: True, False")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> None:
    """Validate shapes, dtypes and devices; raises ``ValueError`` / ``TypeError`` naming the argument."""
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec must be an attn_zoo.AttentionSpec, got {type(spec).__name__}")
    _check_tensors(q, k, v, 4, "(B, H, N, D)")
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
    return_lse: bool = False, *, doc_ids: Optional[torch.Tensor] = None,
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
        doc_ids: packed documents (issue 27, :mod:`attn_zoo.documents`): int32 / int64 ``(B, Nk)`` on q's device,
            nondecreasing along the sequence (each document one contiguous run; ids need not start at 0 and may
            skip). Query ``i`` is in the document of key ``Nk - Nq + i``. Softmax kinds: ``(i, j)`` allowed iff the
            variant's mask allows it (window / layout in absolute positions) and both are in one document; linear /
            recurrent kinds: the state restarts at each document start. Only backends registered with
            ``documents=True`` take it (:func:`attn_zoo.registry.document_backends`): ``auto`` skips the others.
            Tables and checks derived from ``doc_ids`` are kept per tensor and its autograd version: change the ids
            in place through PyTorch ops (``ids[:] = ...``, ``copy_``), not through ``.numpy()`` or ``.data``,
            whose writes PyTorch's version counter does not see (the old table would be reused).

    Returns:
        ``(B, Hq, Nq, Dv)`` in ``q.dtype`` (and ``lse`` if asked). Rows that see no key are 0.

    Raises:
        ValueError / TypeError: bad shapes (any of ``B, Hq, Hkv, Nq, Nk, D, Dv`` zero), dtypes, devices,
        ``Hq % Hkv != 0``, unknown backend, or a backend that cannot run this input (the message says why);
        ``return_lse`` not ``True`` / ``False``, or ``True`` for a kind outside the softmax family (before any
        backend is asked: the message names ``return_lse`` and the kind);
        bad ``doc_ids`` (dtype, shape, device, decreasing ids: the message names ``doc_ids``), or a backend asked
        for by name that does not take documents (the message names those that do).
    """
    _check_return_lse(return_lse)
    if return_lse and isinstance(spec, AttentionSpec) and not spec.is_softmax:  # the kind's answer, not a backend's
        raise ValueError(f"return_lse=True is only defined for softmax kinds, got kind={spec.kind!r}")
    docs = doc_ids is not None
    try:
        key = (spec, backend, return_lse, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
               v.device, docs)
        b = _DISPATCH.get(key)
    except (TypeError, AttributeError):  # an unhashable spec, or q / k / v not tensors: check_inputs names it
        key, b = None, None
    if b is None:  # (spec and shapes are in the key: what is checked here holds for every call that finds it)
        if docs and isinstance(spec, AttentionSpec) and all(isinstance(t, torch.Tensor) and t.dim() == 4
                                                            and t.shape[2] for t in (q, k)):
            refuse_documents(spec, q.shape[2], k.shape[2])  # the kind's own answer, before any backend's
        b = resolve_backend(q, k, v, spec, backend, return_lse, documents=docs)
        if key is not None:
            if len(_DISPATCH) >= 1024:
                _DISPATCH.clear()
            _DISPATCH[key] = b
    if docs:  # data, not part of the key: checked per call (once per tensor, attn_zoo.documents.check_doc_ids)
        check_doc_ids(doc_ids, q, k)
        return b.fn(q, k, v, spec, return_lse=return_lse, doc_ids=doc_ids)
    return b.fn(q, k, v, spec, return_lse=return_lse)


# A call signature (spec, backend, shapes, dtypes, devices) whose inputs passed check_inputs and whose backend's
# supports() accepted them: every check reads nothing else, so a repeated call (each layer of each training step)
# goes straight to the implementation. Every (un)registration of a backend or variant clears it
# (attn_zoo.registry.forget_derived).
_DISPATCH = derived_dict()


def resolve_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, backend: str = "auto",
                    return_lse: bool = False, documents: bool = False):
    """The registered :class:`~attn_zoo.registry.Backend` that :func:`attention` runs for these inputs.

    ``backend="auto"`` tries the registered backends that have a priority, highest first -- ``triton`` (CUDA
    tensors only: our kernels; under ``TRITON_INTERPRET=1`` on the CPU only when asked for by name), then ``torch``,
    then ``reference`` -- and takes the first that is available and whose ``supports()`` accepts the input. On CUDA
    that is ``triton`` for every kind -- ``flash`` / ``sliding_window`` / ``sparse`` with fp16 / bf16 / fp32,
    ``D <= 256`` and ``Dv <= 256``; ``linear`` with ``chunk_size`` in (16, 32, 64, 128), feature dim <= 256 and no
    FAVOR in fp16 (the Taylor map on its symmetric features, up to ``D = 21``) -- else ``torch`` (SDPA /
    FlexAttention / chunked PyTorch). The Taylor map goes to ``parallel``, its fused quadratic form, below
    ``TAYLOR_CHUNKED_MIN_N`` tokens (:mod:`attn_zoo.backends.triton_taylor`; a backend's ``auto_priority`` ranks it
    by shape, :mod:`attn_zoo.registry`) and where ``triton`` refuses it; causal Taylor with ``Nq = Nk`` goes to
    ``taylor_chunk``, its fused chunked form, from ``TAYLOR_FUSED_MIN_N`` tokens
    (:mod:`attn_zoo.backends.triton_taylor_chunk`). The reasons of the backends it passed over
    are in the error when none fits. ``documents=True`` (a call with ``doc_ids``): only backends registered with
    ``documents=True``. Raises ``ValueError`` / ``TypeError`` as :func:`attention`.
    """
    check_inputs(q, k, v, spec)
    regs = get_backends(spec.kind)
    if backend == "auto":
        reasons = []
        for b in auto_order(regs, (q, k, v, spec)):
            if b.devices is not None and q.device.type not in b.devices:
                where = " / ".join("CUDA" if d == "cuda" else d for d in b.devices)
                reasons.append(f"{b.name}: auto uses it on {where} only")
                continue
            if documents and not b.documents:
                reasons.append(f"{b.name}: does not take doc_ids")
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
    if documents and not b.documents:
        raise ValueError(f"backend={backend!r} does not take doc_ids (packed documents) for kind={spec.kind!r}; "
                         f"backends that do: {', '.join(document_backends(spec.kind)) or 'none'}")
    why = b.why_not(q, k, v, spec, return_lse)
    if why is not None:
        raise ValueError(f"backend={backend!r} cannot run this input for kind={spec.kind!r}: {why}")
    return b


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Validate the packed inputs of :func:`attention_varlen`; returns the host copies of both ``cu_seqlens``."""
    _check_tensors(q, k, v, 3, "(total_tokens, H, D) in attention_varlen")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have the same number of tokens, got k={k.shape[0]}, v={v.shape[0]}")
    if q.device.type == "meta":
        raise ValueError("attention_varlen: cu_seqlens' values are the document boundaries, which meta tensors do "
                         "not have; trace on the meta device with the padded attention() instead")
    host = []
    for name, cu, total, mx in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (int32, (n_docs + 1,)), got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be int32 of shape (n_docs + 1,) with n_docs >= 1, got {cu.dtype} "
                             f"{tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {cu.device}")
        h = cu.tolist()
        if h[0] != 0 or h[-1] != total or any(b < a for a, b in zip(h, h[1:])):
            raise ValueError(f"{name} must start at 0, be nondecreasing and end at the number of packed tokens "
                             f"({total}), got {h if len(h) <= 16 else h[:8] + ['...'] + h[-4:]}")
        longest = max(b - a for a, b in zip(h, h[1:]))
        name_max = name.replace("cu_seqlens", "max_seqlen")
        if not isinstance(mx, int) or isinstance(mx, bool) or mx < longest:
            raise ValueError(f"{name_max} must be an int >= the longest document ({longest}), got {mx!r}")
        host.append(h)
    if len(host[0]) != len(host[1]):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one entry per document boundary each, got "
                         f"{len(host[0])} and {len(host[1])}")
    return host


def attention_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, spec: AttentionSpec, backend: str = "auto", *, return_lse: bool = False,
):
    """Attention over packed variable-length documents without padding (the interface of FlashAttention's
    ``flash_attn_varlen_func``; Dao 2023), for every registered kind.

    Args:
        q: ``(total_q, Hq, D)``, the documents' queries back to back; k: ``(total_k, Hkv, D)``; v: ``(total_k, Hkv,
            Dv)`` (dtypes / GQA as :func:`attention`).
        cu_seqlens_q / cu_seqlens_k: int32 ``(n_docs + 1,)`` on q's device: document ``d`` owns queries
            ``cu_seqlens_q[d]:cu_seqlens_q[d+1]`` and keys ``cu_seqlens_k[d]:cu_seqlens_k[d+1]`` (empty documents
            allowed).
        max_seqlen_q / max_seqlen_k: the longest document (ints, checked to be at least that).
        spec, backend: as :func:`attention`.
        return_lse: also return the log-sum-exp, fp32 ``(Hq, total_q)`` (softmax kinds).

    Returns:
        ``(total_q, Hq, Dv)`` in ``q.dtype`` (and ``lse``). With ``total_q = 0`` or ``total_k = 0`` (no key at
        all): zeros (lse ``-inf``), every kind and backend alike, as rows that see no key.

    Semantics: each document is its own sequence; inside document ``d``, query ``i`` sits at key ``Nk_d - Nq_d + i``
    (bottom-right, as ``causal``). With ``cu_seqlens_q == cu_seqlens_k`` this is exactly :func:`attention` with
    ``B = 1`` and ``doc_ids`` from ``cu_seqlens_k`` (views of q / k / v, no copy, no padding: every backend that
    takes documents runs it; a block layout is in positions of the packed sequence). With different query and key
    lengths: softmax kinds run on ``reference`` / ``torch`` (``auto`` picks ``torch``) with each query's absolute
    position in the packed keys (window / layout in packed positions, as above; with ``Nq_d > Nk_d`` the first
    ``Nq_d - Nk_d`` queries of ``d`` sit before its first key and see what the rule gives them there: nothing when
    causal, the whole document when not, as a document run on its own); linear kinds run document by document on
    any backend (one :func:`attention` call per document: the state restarts at each one).

    Raises:
        ValueError / TypeError: bad shapes, ``cu_seqlens`` not int32 ``(n_docs + 1,)`` starting at 0, decreasing or
        not ending at the token count, ``max_seqlen_*`` below the longest document, and as :func:`attention`;
        ``Nq_d != Nk_d`` for a softmax kind on a backend other than ``reference`` / ``torch`` (the message says why).
    """
    hq, hk = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec must be an attn_zoo.AttentionSpec, got {type(spec).__name__}")
    refuse_documents(spec, max(q.shape[0], 1), max(k.shape[0], 1))
    if return_lse and not spec.is_softmax:
        raise ValueError(f"return_lse=True is only defined for softmax kinds, got kind={spec.kind!r}")
    _check_return_lse(return_lse)
    if q.shape[0] == 0 or k.shape[0] == 0:  # no query, or no key at all: every query row sees nothing
        out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])  # (zero output, lse -inf: the kernels' empty rows)
        if return_lse:
            return out, torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device, dtype=torch.float32)
        return out
    qp, kp, vp = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, total, D) views

    def unpack(res):
        if return_lse:
            return res[0][0].transpose(0, 1), res[1][0]
        return res[0].transpose(0, 1)

    if hq == hk:
        from .documents import doc_ids_from_cu_seqlens

        doc_ids = doc_ids_from_cu_seqlens(cu_seqlens_k, k.shape[0]).unsqueeze(0)
        return unpack(attention(qp, kp, vp, spec, backend, return_lse, doc_ids=doc_ids))
    if not spec.is_softmax:  # the state restarts per document: one call per document is the definition
        if return_lse:
            raise ValueError(f"return_lse=True is only defined for softmax kinds, got kind={spec.kind!r}")
        outs = []
        for d in range(len(hq) - 1):
            nq, nk = hq[d + 1] - hq[d], hk[d + 1] - hk[d]
            if nq == 0:
                continue
            if nk == 0:
                outs.append(q.new_zeros(nq, q.shape[1], v.shape[2]))
                continue
            o = attention(qp[:, :, hq[d]:hq[d + 1]], kp[:, :, hk[d]:hk[d + 1]], vp[:, :, hk[d]:hk[d + 1]], spec,
                          backend)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[2])
    if backend not in ("auto", "reference", "torch"):
        raise ValueError(f"attention_varlen with cu_seqlens_q != cu_seqlens_k (queries and keys of different "
                         f"lengths per document) runs softmax kinds on backend='reference' or 'torch' only (per-query "
                         f"positions in the mask rule), got backend={backend!r}")
    from .documents import doc_ids_from_cu_seqlens

    dq = doc_ids_from_cu_seqlens(cu_seqlens_q, q.shape[0]).long()  # (total_q,) document of each query
    ke = cu_seqlens_k.long()[dq + 1]
    i_local = torch.arange(q.shape[0], device=q.device) - cu_seqlens_q.long()[dq]
    nq_d = cu_seqlens_q.long()[dq + 1] - cu_seqlens_q.long()[dq]
    q_pos = ke - nq_d + i_local  # bottom-right inside each document, in packed key positions
    q_doc = dq.unsqueeze(0)  # a query before its document's first key (Nq_d > Nk_d) is still in it
    doc_ids = doc_ids_from_cu_seqlens(cu_seqlens_k, k.shape[0]).unsqueeze(0)
    check_inputs(qp, kp, vp, spec)
    regs = get_backends(spec.kind)
    names = ["torch", "reference"] if backend == "auto" else [backend]
    reasons = []
    for name in names:
        b = regs.get(name)
        if b is None:
            reasons.append(f"{name}: not registered for kind={spec.kind!r}")
            continue
        why = b.why_not(qp, kp, vp, spec, return_lse)
        if why is None:
            return unpack(b.fn(qp, kp, vp, spec, return_lse=return_lse, doc_ids=doc_ids, q_pos=q_pos, q_doc=q_doc))
        reasons.append(f"{name}: {why}")
    raise ValueError(f"attention_varlen (cu_seqlens_q != cu_seqlens_k): no backend can run this input for "
                     f"kind={spec.kind!r}: " + "; ".join(reasons))
