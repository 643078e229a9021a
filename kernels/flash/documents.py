"""The document part of the exact kernel's mask description (packed documents, issue 27).

:func:`document_table` turns ``doc_ids (B, Nk)`` (nondecreasing per row; query row ``i`` in the document of key
``Nk - Nq + i``, none when that is negative) into the one int32 tensor the kernels read (layout in
``common.py``): per query row its document and the key span of that document, per key its document and the query
rows of that document. The kernels bound each tile's loop by these spans (tiles across documents are never
visited) and apply the element rule ``doc_q == doc_k`` only on tiles that straddle a boundary. Source:
FlashAttention's varlen kernels (Dao 2023) skip across sequences the same way, by ``cu_seqlens``.
"""

from __future__ import annotations

import weakref

import torch


def document_table(doc_ids: torch.Tensor, Nq: int) -> torch.Tensor:
    """int32 ``(B, 3 * Nq + 3 * Nk)`` on ``doc_ids``' device (no host sync): ``[doc_q | q_lo | q_hi | doc_k | k_lo |
    k_hi]`` per batch row. Documents are renumbered 0, 1, ... per row (any integer ids in; empty ids skipped)."""
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be 2-D (B, Nk), got shape {tuple(doc_ids.shape)}")
    d = doc_ids.long()
    B, Nk = d.shape
    start = torch.ones_like(d, dtype=torch.bool)
    start[:, 1:] = d[:, 1:] != d[:, :-1]
    seg = start.long().cumsum(1) - 1  # (B, Nk) documents renumbered 0, 1, ...
    idx = torch.arange(Nk, device=d.device).expand(B, Nk)
    s = torch.where(start, idx, torch.zeros_like(idx)).cummax(1).values  # first key of each key's document
    last = torch.ones_like(start)
    last[:, :-1] = start[:, 1:]
    e = torch.where(last, idx + 1, torch.full_like(idx, Nk)).flip(1).cummin(1).values.flip(1)  # one past its last key
    off = Nk - Nq
    pos = torch.arange(Nq, device=d.device) + off
    valid = (pos >= 0).view(1, -1)
    pc = pos.clamp(min=0)
    zero = torch.zeros((), dtype=torch.long, device=d.device)
    doc_q = torch.where(valid, seg[:, pc], torch.full_like(zero, -1))
    q_lo = torch.where(valid, s[:, pc], zero)
    q_hi = torch.where(valid, e[:, pc], zero)
    k_lo = (s - off).clamp(0, Nq)
    k_hi = (e - off).clamp(0, Nq)
    return torch.cat([doc_q, q_lo, q_hi, seg, k_lo, k_hi], 1).to(torch.int32).contiguous()


_LAST: list = []  # [(weakref to doc_ids, its _version, Nq, table)], most recent first


def cached_document_table(doc_ids: torch.Tensor, Nq: int) -> torch.Tensor:
    """:func:`document_table`, remembered for the last 4 ``doc_ids`` tensors (by identity and version): the same
    tensor passed to every layer of a training step builds its table once. Not while compiling (then built in the
    graph)."""
    if torch.compiler.is_compiling():
        return document_table(doc_ids, Nq)
    from attn_zoo.documents import tensor_version

    version = tensor_version(doc_ids)  # None: an inference tensor, not cached
    for ref, ver, n, table in _LAST:
        if ref() is doc_ids and version is not None and ver == version and n == Nq:
            return table
    table = document_table(doc_ids, Nq)
    if version is None:
        return table
    try:
        _LAST.insert(0, (weakref.ref(doc_ids), version, Nq, table))
        del _LAST[4:]
    except TypeError:  # pragma: no cover - a tensor type without weak references
        pass
    return table
