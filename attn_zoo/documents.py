"""Packed documents (issue 27): the document ids every backend takes, their checks, and the document mask.

Semantics (the contract every backend is tested against, :func:`attn_zoo.attention` with ``doc_ids``):

* ``doc_ids`` int32 / int64 ``(B, Nk)`` on q's device, nondecreasing along the sequence: each document is one
  contiguous run of keys; ids need not start at 0 and may skip (an id that never occurs is an empty document).
* Query ``i`` sits at key position ``p_i = Nk - Nq + i`` (bottom-right, as ``causal``); its document is
  ``doc_ids[b, p_i]``. Rows with ``p_i < 0`` (``Nq > Nk``) belong to no document and see nothing.
* Softmax kinds: ``(i, j)`` is allowed iff the variant's mask allows it (window, dilation and block layout stay
  in absolute positions of the packed sequence) AND ``doc(i) == doc(j)``. Linear / recurrent kinds: the state
  restarts at each document start. Rows that see no key give 0 (zero gradients; ``lse = -inf``).

The varlen form (:func:`attn_zoo.attention_varlen`) with ``Nq_d != Nk_d`` gives each query an explicit absolute
position ``q_pos`` (bottom-right inside its own document) and an explicit document ``q_doc``; the padded form is
the special case ``q_pos = Nk - Nq + i``, ``q_doc = doc_ids[b, q_pos]``. :func:`document_allowed` takes either.

Sources: FlashAttention's varlen interface (``flash_attn_varlen_func``, ``cu_seqlens``; Dao 2023) and
FlexAttention's document masking (``mask_mod`` comparing document ids; Guessous et al. 2024).
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Optional, Tuple

import torch

__all__ = ["tensor_version", "check_doc_ids", "query_documents", "document_allowed", "doc_ids_from_cu_seqlens", "document_spans"]

_INT = (torch.int32, torch.int64)
_CHECKED: list = [None, -1]  # (weakref to the last doc_ids that passed, its _version): one check per step, not per layer


def tensor_version(t: torch.Tensor) -> Optional[int]:
    """``t._version`` (bumped by every in-place change), the key of the per-tensor caches of ``doc_ids`` (the
    check below, the Triton kernel's document table, Flex's block mask); None for an inference tensor
    (``torch.inference_mode``, e.g. Lightning's validation), which tracks no version: never cached, rebuilt per call."""
    return None if t.is_inference() else t._version


def check_doc_ids(doc_ids, q: torch.Tensor, k: torch.Tensor) -> None:
    """Validate ``doc_ids`` for ``q (B, Hq, Nq, D)`` / ``k (B, Hkv, Nk, D)``.

    Raises:
        TypeError: ``doc_ids`` is not a tensor.
        ValueError: (naming ``doc_ids``) a dtype other than int32 / int64, a shape other than ``(B, Nk)``, a device
            other than q's, or ids that decrease along the sequence.

    The (synchronising) monotonicity check runs once per tensor: the same unmodified ``doc_ids`` tensor passed
    to every layer of a step is checked on the first call only (and not while ``torch.compile`` traces).
    """
    if not isinstance(doc_ids, torch.Tensor):
        raise TypeError(f"doc_ids must be a torch.Tensor (int32 / int64, shape (B, Nk)) or None, got "
                        f"{type(doc_ids).__name__}")
    if doc_ids.dtype not in _INT:
        raise ValueError(f"doc_ids.dtype={doc_ids.dtype} is not supported; allowed values: int32, int64")
    B, Nk = q.shape[0], k.shape[2]
    if tuple(doc_ids.shape) != (B, Nk):
        raise ValueError(f"doc_ids must have shape (B, Nk) = ({B}, {Nk}), got {tuple(doc_ids.shape)}")
    if q.device.type == "meta":  # (meta ids beside real q: the device mismatch below names it)
        raise ValueError("doc_ids: packed documents need the document ids' values (their boundaries shape the mask), "
                         "which meta tensors do not have; trace the model on the meta device without doc_ids")
    if doc_ids.device != q.device:
        raise ValueError(f"doc_ids must be on q's device {q.device}, got {doc_ids.device}")
    if torch.compiler.is_compiling():  # a data-dependent check would break the graph: checked in eager runs
        return
    ref, ver = _CHECKED
    if ref is not None and ref() is doc_ids and ver is not None and ver == tensor_version(doc_ids):
        return
    if Nk > 1 and bool((doc_ids[:, 1:] < doc_ids[:, :-1]).any()):
        raise ValueError("doc_ids must be nondecreasing along the sequence (each document one contiguous run of "
                         "keys); sort or renumber them")
    if tensor_version(doc_ids) is None:  # an inference tensor: checked every call
        return
    try:
        _CHECKED[0], _CHECKED[1] = weakref.ref(doc_ids), tensor_version(doc_ids)
    except TypeError:  # pragma: no cover - a tensor subclass without weak references: checked every call
        pass


def query_documents(doc_ids: torch.Tensor, Nq: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(q_pos, q_doc)`` of the padded form: ``q_pos`` int64 ``(Nq,)`` absolute key positions ``Nk - Nq + i``,
    ``q_doc`` int64 ``(B, Nq)`` the document of each query row (where ``q_pos < 0``, an id no key has:
    ``min(doc_ids) - 1``, or ``max(doc_ids) + 1`` when the minimum is ``-2**63``). Raises ``ValueError`` when ``Nq >
    Nk`` and ``doc_ids`` holds both ``-2**63`` and ``2**63 - 1`` (no id is left for those rows: renumber them)."""
    d = doc_ids.long()
    B, Nk = d.shape
    q_pos = torch.arange(Nq, device=d.device) + (Nk - Nq)
    q_doc = d[:, q_pos.clamp(min=0)]
    if Nq > Nk:
        none = -1
        if d.numel():  # (a host sync, on this Nq > Nk path only)
            lo, hi = int(d.min()), int(d.max())
            i64 = torch.iinfo(torch.int64)
            if lo > i64.min:
                none = lo - 1
            elif hi < i64.max:
                none = hi + 1
            else:
                raise ValueError(f"doc_ids holds both {i64.min} and {i64.max}: with Nq = {Nq} > Nk = {Nk} the "
                                 f"query rows before the first key need an id no key has; renumber the documents "
                                 f"(e.g. 0, 1, 2, ...)")
        q_doc = torch.where((q_pos >= 0).view(1, -1), q_doc, torch.tensor(none, device=d.device))
    return q_pos, q_doc


def refuse_documents(spec, Nq: int, Nk: int) -> None:
    """``ValueError`` for packed documents with a kind whose variant does not take them (``documents=False`` in
    :func:`attn_zoo.register_variant`: ``streaming``, whose sinks are the first tokens of the row, not of each
    document) or a softmax mask with attention sinks (``MaskInfo.sink_size``): no backend has a per-document form."""
    from .variants import get_variant

    if not get_variant(spec.kind).documents:
        raise ValueError(f"kind={spec.kind!r} does not take doc_ids / cu_seqlens (packed documents): its variant has "
                         f"no per-document rule ({get_variant(spec.kind).doc}); call it per document (one sequence "
                         f"each) or without documents")
    if spec.is_softmax:
        from .masks import mask_info

        sink = mask_info(spec, Nq, Nk).sink_size
        if sink:
            raise ValueError(f"kind={spec.kind!r} with sink_size={sink} does not take doc_ids / cu_seqlens (packed "
                             f"documents): its sinks are the first tokens of the row, not of each document")


def document_allowed(spec, Nq: int, Nk: int, doc_ids: torch.Tensor, q_pos: Optional[torch.Tensor] = None,
                     q_doc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The full document-masked rule, bool ``(B, Nq, Nk)``: the variant's element rule at absolute query positions
    ``q_pos`` AND ``q_doc == doc_ids``. ``q_pos`` / ``q_doc`` default to the padded form (:func:`query_documents`).
    Softmax kinds: the spec's :class:`~attn_zoo.masks.MaskInfo`; any other kind: causal (``j <= q_pos``) or none."""
    refuse_documents(spec, Nq, Nk)
    if q_pos is None or q_doc is None:
        q_pos, q_doc = query_documents(doc_ids, Nq)
    d = doc_ids.long()
    j = torch.arange(Nk, device=d.device).view(1, -1)
    if spec.is_softmax:
        from .masks import mask_info

        # the rule at absolute positions q_pos >= -Nq: offset -Nq, rows q_pos + Nq (no row bound bites)
        mi0 = replace(mask_info(spec, Nq, Nk), Nq=Nk + Nq)
        rule = mi0.allowed(q_pos.view(-1, 1) + Nq, j)
    else:
        rule = (j <= q_pos.view(-1, 1)) if spec.causal else (q_pos.view(-1, 1) >= 0) & (j >= 0)
    return rule.unsqueeze(0) & (q_doc.long().unsqueeze(-1) == d.unsqueeze(1))


def doc_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """int32 ``(total,)`` document index of each packed token from ``cu_seqlens (n_docs + 1,)`` (no host sync;
    empty documents are skipped ids)."""
    pos = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True).to(torch.int32)


def document_spans(doc_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(start, end)`` int32 ``(B, N)``: the first and one-past-last key position of each position's document
    (what a kernel needs to bound the key tiles a query tile visits)."""
    d = doc_ids.long()
    B, N = d.shape
    newdoc = torch.ones_like(d, dtype=torch.bool)
    newdoc[:, 1:] = d[:, 1:] != d[:, :-1]
    idx = torch.arange(N, device=d.device).expand(B, N)
    start = torch.where(newdoc, idx, torch.zeros_like(idx)).cummax(1).values
    enddoc = torch.ones_like(newdoc)
    enddoc[:, :-1] = newdoc[:, 1:]
    endv = torch.where(enddoc, idx + 1, torch.full_like(idx, N))
    end = endv.flip(1).cummin(1).values.flip(1)
    return start.to(torch.int32), end.to(torch.int32)
