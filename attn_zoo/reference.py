"""Reference backend: plain PyTorch, fp32, the full mask materialised. Ground truth for every kernel.
(float64 inputs are computed in float64.)

Shapes: ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)``; ``Hkv`` divides ``Hq`` and query
head ``h`` reads K/V head ``h // (Hq // Hkv)``. Output ``(B, Hq, Nq, Dv)`` in ``q.dtype``.
Memory is O(B * Hq * Nq * Nk): use it for tests and small models only.

Masked pairs contribute nothing, in the forward and in every gradient: a product of a masked weight (exactly
0) with a non-finite query / key / value row is never formed (:class:`_MaskedMatmul`, :class:`_MaskedScores`),
so a NaN or inf at key ``j`` reaches exactly the rows that see ``j`` (and the gradients of what those rows
see), a NaN in query row ``i`` exactly row ``i`` (and the gradients of the keys it sees). The softmax subtracts
the row maximum (never ``exp(s - lse)``: at large logits that form lost ~1e-2 of relative accuracy in dq / dk).
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


# ----------------------------------------------------------------------------------------- masked products
def _masked_contract(a: torch.Tensor, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``a @ x`` over the index ``j`` for ``a (..., M, K)`` and ``x (..., K, P)``, where the entries of ``a`` at
    ``~allowed`` ``(M, K)`` are treated as exact zeros that never multiply ``x``: rows of ``x`` holding a NaN or
    inf are added only where allowed (per element, in chunks no larger than ``a``), the others by one matmul."""
    a = torch.where(allowed, a, 0.0)
    if x.device.type == "meta":  # shapes only (no values to look at): the product's shape and dtype
        return a @ x
    bad = ~torch.isfinite(x).all(-1)  # (..., K)
    bad = bad.reshape(-1, bad.shape[-1]).any(0)  # (K,): one row set for every batch / head
    if not bool(bad.any()):
        return a @ x
    out = a @ x.masked_fill(bad[:, None], 0.0)
    idx = bad.nonzero().flatten()
    step = max(1, a.shape[-1] // max(1, x.shape[-1]))  # the (..., M, step, P) product stays <= a's size
    for c in range(0, idx.numel(), step):
        j = idx[c:c + step]
        prod = a[..., :, j].unsqueeze(-1) * x[..., j, :].unsqueeze(-3)  # (..., M, c, P)
        out = out + torch.where(allowed[:, j].unsqueeze(-1), prod, 0.0).sum(-2)
    return out


class _MaskedMatmul(torch.autograd.Function):
    """``where(allowed, a, 0) @ x`` whose forward and backward never form ``0 * x_j`` or ``0 * g_i`` at a masked
    pair (``allowed (M, K)`` broadcasts over the batch dims): ``da = where(allowed, g x^T, 0)``, ``dx = a^T g``."""

    @staticmethod
    def forward(ctx, a, x, allowed):
        ctx.save_for_backward(a, x, allowed)
        return _masked_contract(a, x, allowed)

    @staticmethod
    def backward(ctx, g):
        a, x, allowed = ctx.saved_tensors
        da = dx = None
        if ctx.needs_input_grad[0]:
            da = torch.where(allowed, g @ x.transpose(-1, -2), 0.0)  # entries, not sums: masked ones dropped
        if ctx.needs_input_grad[1]:
            dx = _masked_contract(a.transpose(-1, -2), g, allowed.transpose(-1, -2))
        return da, dx, None


class _MaskedScores(torch.autograd.Function):
    """``where(allowed, q @ k^T, fill)``; the backward contracts the (masked-zero) score gradient with ``k`` /
    ``q`` without touching a masked pair, so a non-finite key (query) reaches only the rows (keys) it pairs with."""

    @staticmethod
    def forward(ctx, q, k, allowed, fill):
        ctx.save_for_backward(q, k, allowed)
        return torch.where(allowed, q @ k.transpose(-1, -2), fill)

    @staticmethod
    def backward(ctx, ds):
        q, k, allowed = ctx.saved_tensors
        dq = dk = None
        if ctx.needs_input_grad[0]:
            dq = _masked_contract(ds, k, allowed)
        if ctx.needs_input_grad[1]:
            dk = _masked_contract(ds.transpose(-1, -2), q, allowed.transpose(-1, -2))
        return dq, dk, None, None


def _scores(q, k, allowed, fill):
    if allowed is None:
        return q @ k.transpose(-1, -2)
    return _MaskedScores.apply(q, k, allowed, fill)


def _matmul(a, x, allowed):
    if allowed is None:
        return a @ x
    return _MaskedMatmul.apply(a, x, allowed)


# ----------------------------------------------------------------------------------------- references
def softmax_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, return_lse: bool = False,
    doc_ids: Optional[torch.Tensor] = None, *, q_pos: Optional[torch.Tensor] = None,
    q_doc: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact masked softmax attention (Vaswani et al. 2017, eq. 1) with the spec's mask.

    Rows with no allowed key output 0 (zero gradients) and have ``lse = -inf``. ``lse`` is fp32 ``(B, Hq, Nq)``,
    natural log of ``sum_j exp(scale * q_i . k_j)`` over allowed ``j`` (fp64 for fp64 inputs). The softmax
    subtracts the row maximum of the scores; masked pairs contribute nothing (module docstring).

    ``doc_ids`` int ``(B, Nk)`` (packed documents, :mod:`attn_zoo.documents`): the mask is also restricted to
    pairs of one document (query ``i`` in the document of key ``Nk - Nq + i``). ``q_pos`` int ``(Nq,)`` / ``q_doc``
    int ``(B, Nq)`` (with ``doc_ids``; the varlen form with ``Nq_d != Nk_d``): each query's absolute key position
    and document, given explicitly (:func:`attn_zoo.documents.document_allowed`).
    """
    if doc_ids is not None:  # one 2-D mask per batch row (the non-finite guards take a 2-D mask)
        from .documents import document_allowed

        allowed = document_allowed(spec, q.shape[2], k.shape[2], doc_ids, q_pos, q_doc).to(q.device)
        rows = [_softmax_rows(q[b:b + 1], k[b:b + 1], v[b:b + 1], spec, allowed[b]) for b in range(q.shape[0])]
        out = torch.cat([r[0] for r in rows])
        return (out, torch.cat([r[1] for r in rows])) if return_lse else out
    mi = mask_info(spec, q.shape[2], k.shape[2])
    out, lse = _softmax_rows(q, k, v, spec, None if mi.is_full else mi.dense(q.device))
    return (out, lse) if return_lse else out


def _softmax_rows(q, k, v, spec, allowed):
    """``(out, lse)`` of masked softmax attention with the bool ``(Nq, Nk)`` mask ``allowed`` (``None``: full)."""
    D = q.shape[3]
    n_rep = q.shape[1] // k.shape[1]
    qf, kf, vf = upcast(q), repeat_kv(upcast(k), n_rep), repeat_kv(upcast(v), n_rep)
    s = _scores(qf, kf, allowed, float("-inf")) * spec.scale(D)  # (B, Hq, Nq, Nk), -inf where masked
    m = s.detach().amax(-1, keepdim=True)  # row max: NaN / +inf rows stay so, empty rows (-inf) use 0
    m = torch.where(m == float("-inf"), 0.0, m)
    e = torch.exp(s - m)
    if allowed is not None:
        e = torch.where(allowed, e, 0.0)  # exact zeros (also where m is NaN), no gradient to masked pairs
    l = e.sum(-1, keepdim=True)  # (B, Hq, Nq, 1), >= 1 on rows with an allowed key, 0 on empty rows
    p = e / torch.where(l == 0, 1.0, l)  # empty rows: p == 0 -> out == 0
    out = _matmul(p, vf, allowed).to(q.dtype)
    lse = (m + torch.log(l)).squeeze(-1)  # -inf on empty rows
    return out, lse


def linear_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
    feature_q: Optional[torch.Tensor] = None, feature_k: Optional[torch.Tensor] = None,
    doc_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Kernelized attention, masked quadratic form (Katharopoulos et al. 2020, eq. 4 and 9):

    ``out_i = sum_j M_ij (phi(q_i).phi(k_j)) v_j / (sum_j M_ij phi(q_i).phi(k_j) + eps)``, with ``M`` the causal
    mask (bottom-right aligned) or all-ones. Computed in fp32 with the ``(Nq, Nk)`` matrix materialised; masked
    pairs contribute nothing (module docstring).
    ``feature_q`` / ``feature_k`` may pass precomputed ``phi(q)``, ``phi(k)`` ``(B, H, N, F)``.
    ``doc_ids`` int ``(B, Nk)`` (nondecreasing; query ``i`` in the document of key ``Nk - Nq + i``): ``M`` is also
    restricted to pairs of the same document. For causal linear attention that is exactly the recurrent state
    restarting at each document start (:func:`linear_attention_recurrent` with ``doc_ids``).
    """
    Hq, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
    n_rep = Hq // k.shape[1]
    fq = feature_q if feature_q is not None else apply_feature_map(upcast(q), spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = feature_k if feature_k is not None else apply_feature_map(upcast(k), spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    fq, fk, vf = upcast(fq), repeat_kv(upcast(fk), n_rep), repeat_kv(upcast(v), n_rep)
    allowed = None
    if spec.causal:
        i = torch.arange(Nq, device=q.device).view(-1, 1) + (Nk - Nq)
        allowed = torch.arange(Nk, device=q.device).view(1, -1) <= i  # (Nq, Nk)
    if doc_ids is not None:  # one 2-D mask per batch row (the non-finite guards take a 2-D mask)
        allowed = document_mask(doc_ids, Nq) & (True if allowed is None else allowed)  # (B, Nq, Nk)
        outs = []
        for b in range(fq.shape[0]):
            a = _scores(fq[b:b + 1], fk[b:b + 1], allowed[b], 0.0)  # exact zeros where masked
            outs.append(_matmul(a, vf[b:b + 1], allowed[b]) / (a.sum(-1, keepdim=True) + spec.eps))
        return torch.cat(outs).to(q.dtype)
    a = _scores(fq, fk, allowed, 0.0)  # (B, Hq, Nq, Nk), exact zeros where masked
    num = _matmul(a, vf, allowed)
    den = a.sum(-1, keepdim=True) + spec.eps
    return (num / den).to(q.dtype)


def check_doc_ids(doc_ids: torch.Tensor, B: int, N: int, device) -> torch.Tensor:
    """Validate ``doc_ids`` (int ``(B, N)``, nondecreasing along the sequence, on ``device``); returns it as int64.
    Raises ``ValueError`` naming ``doc_ids``."""
    if doc_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"doc_ids must be int32 or int64, got {doc_ids.dtype}")
    if tuple(doc_ids.shape) != (B, N):
        raise ValueError(f"doc_ids must have shape (B, Nk) = {(B, N)}, got {tuple(doc_ids.shape)}")
    if doc_ids.device != torch.device(device) and not (doc_ids.device.type == torch.device(device).type):
        raise ValueError(f"doc_ids must be on {device}, got {doc_ids.device}")
    d = doc_ids.long()
    if N > 1 and bool((d[:, 1:] < d[:, :-1]).any()):
        raise ValueError("doc_ids must be nondecreasing along the sequence (each document one contiguous run)")
    return d


def document_mask(doc_ids: torch.Tensor, Nq: int) -> torch.Tensor:
    """``(B, Nq, Nk)`` bool: query ``i`` (at key position ``Nk - Nq + i``) and key ``j`` in the same document.
    Queries above the first key (``Nq > Nk``) are in no document (all False)."""
    d = doc_ids.long()
    B, Nk = d.shape
    pos = torch.arange(Nq, device=d.device) + (Nk - Nq)
    dq = d[:, pos.clamp(min=0)]
    same = dq[:, :, None] == d[:, None, :]
    return same & (pos >= 0).view(1, -1, 1)


def document_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` bool: position ``t`` starts a document (``t == 0`` or ``doc_ids[t] != doc_ids[t - 1]``)."""
    d = doc_ids.long()
    st = torch.ones_like(d, dtype=torch.bool)
    st[:, 1:] = d[:, 1:] != d[:, :-1]
    return st


def linear_attention_recurrent(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, eps: float = 1e-6,
    initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, doc_ids: Optional[torch.Tensor] = None,
):
    """Step-by-step recurrent causal form in fp32 (Katharopoulos et al. 2020, eq. 18-20): the naive form the
    Triton linear kernel (:func:`kernels.linear.linear_attention`) is tested against.

    ``S_i = S_{i-1} + phi(k_i)^T v_i``, ``z_i = z_{i-1} + phi(k_i)``, ``out_i = phi(q_i) S_i / (phi(q_i) . z_i + eps)``;
    features ``fq (B, Hq, N, F)``, ``fk (B, Hkv, N, F)``, ``v (B, Hkv, N, Dv)``. Returns fp32 ``out`` and ``(S, z)``.
    Differentiable (plain autograd); O(N) Python steps: small N only.
    ``doc_ids (B, N)``: ``(S, z)`` restart from zero at each document start (the initial state belongs to the
    document running at position 0).
    """
    B, Hq, N, F = fq.shape
    Hkv, Dv = fk.shape[1], v.shape[3]
    G = Hq // Hkv
    fq, fk, v = fq.float(), fk.float(), v.float()
    if initial_state is None:
        S = fq.new_zeros(B, Hkv, F, Dv)
        z = fq.new_zeros(B, Hkv, F)
    else:
        S, z = initial_state[0].float(), initial_state[1].float()
    starts = document_starts(doc_ids) if doc_ids is not None else None
    outs = []
    for i in range(N):
        if starts is not None and i > 0:
            keep = (~starts[:, i]).to(S.dtype).view(B, 1, 1, 1)
            S, z = S * keep, z * keep[..., 0]
        S = S + fk[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + fk[:, :, i]
        Sg = S.repeat_interleave(G, dim=1)
        zg = z.repeat_interleave(G, dim=1)
        qi = fq[:, :, i]
        num = torch.einsum("bhf,bhfd->bhd", qi, Sg)
        den = (qi * zg).sum(-1, keepdim=True) + eps
        outs.append(num / den)
    return torch.stack(outs, 2), (S, z)


def attention_reference(q, k, v, spec: AttentionSpec, return_lse: bool = False, doc_ids=None, **doc_kw):
    """Dispatch to the softmax or linear reference by ``spec.kind``; ``doc_ids`` (B, Nk): packed documents
    (:mod:`attn_zoo.documents`); ``doc_kw``: ``q_pos`` / ``q_doc`` of the varlen form (softmax kinds)."""
    if spec.is_softmax:
        return softmax_attention_reference(q, k, v, spec, return_lse=return_lse, doc_ids=doc_ids, **doc_kw)
    if return_lse:
        raise ValueError(f"return_lse=True is only defined for softmax kinds, got kind={spec.kind!r}")
    if doc_kw:
        raise ValueError(f"kind={spec.kind!r}: per-query document positions (varlen with Nq_d != Nk_d) are only "
                         f"defined for softmax kinds")
    if doc_ids is not None:
        return linear_attention_reference(q, k, v, spec, doc_ids=doc_ids)
    return linear_attention_reference(q, k, v, spec)
