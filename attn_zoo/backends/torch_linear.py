"""``torch`` backend of ``linear``: the chunked form in plain PyTorch (what a user would write).

Causal (Katharopoulos et al. 2020, eq. 8-9, chunked as in Yang et al. 2024 "Gated Linear Attention", sec. 2.2):
for chunk ``c`` of ``C`` tokens,

    out_c = [ (phi(Q_c) phi(K_c)^T * M) V_c + phi(Q_c) S_{<c} ] / [ (phi(Q_c) phi(K_c)^T * M) 1 + phi(Q_c) z_{<c} + eps ]

with ``S_{<c} = sum_{j < start(c)} phi(k_j)^T v_j`` (F x Dv) and ``z_{<c} = sum phi(k_j)`` carried in fp32.
Non-causal: ``phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps)``. O(N * C * F + N * F * Dv) time,
O(N / C * F * Dv) memory for the chunk states. Bottom-right alignment when ``Nq != Nk``: the first
``Nk - Nq`` keys form the initial state; with ``Nq > Nk`` the top ``Nq - Nk`` rows see nothing and are 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..feature_maps import apply_feature_map
from ..reference import document_starts, repeat_kv, upcast
from ..registry import register_backend


def _supports(q, k, v, spec, return_lse):
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    return None


def _doc_index(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` document ids -> local indices 0, 1, ... (one per run), int64."""
    return document_starts(doc_ids).long().cumsum(1) - 1


def _packed_linear(fq, fk, v, causal: bool, eps: float, doc_ids: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Linear attention with the state restarting at each document start (:func:`chunked_linear_attention`)."""
    B, H, Nq, Fd = fq.shape
    Nk, Dv = fk.shape[2], v.shape[3]
    seg = _doc_index(doc_ids)  # (B, Nk)
    if not causal:  # per-document sums, gathered by each query's document
        nd = int(seg.max()) + 1 if Nk else 1
        E = F.one_hot(seg, nd).to(fk.dtype)  # (B, Nk, nd)
        kv = torch.einsum("bnd,bhnf,bhnv->bhdfv", E, fk, v)
        z = torch.einsum("bnd,bhnf->bhdf", E, fk)
        pos = torch.arange(Nq, device=fq.device) + (Nk - Nq)
        sq = seg[:, pos.clamp(min=0)]  # (B, Nq)
        idx = sq[:, None, :].expand(B, H, Nq)
        kvq = torch.gather(kv, 2, idx[..., None, None].expand(B, H, Nq, Fd, Dv))
        zq = torch.gather(z, 2, idx[..., None].expand(B, H, Nq, Fd))
        out = torch.einsum("bhnf,bhnfv->bhnv", fq, kvq) / ((fq * zq).sum(-1, keepdim=True) + eps)
        return out * (pos >= 0).view(1, 1, -1, 1).to(out.dtype)
    off = Nk - Nq
    top = None
    if off > 0:  # queries sit at the last Nq key positions: pad the query rows on top, drop them at the end
        fq = F.pad(fq, (0, 0, off, 0))
    elif off < 0:  # queries before the first key see nothing
        top = fq.new_zeros(B, H, -off, Dv)
        fq = fq[:, :, -off:]
    n, C = Nk, chunk_size
    pad = (-n) % C
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
        seg = F.pad(seg, (0, pad), value=-1)  # padded keys: a document of their own (never read by a real query)
        seg[:, n:] = seg.max() + 1
    nc = (n + pad) // C
    qc, kc, vc = fq.view(B, H, nc, C, Fd), fk.view(B, H, nc, C, Fd), v.view(B, H, nc, C, Dv)
    sc = seg.view(B, nc, C)
    tril = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()
    same = (sc[..., :, None] == sc[..., None, :]) & tril  # (B, nc, C, C)
    a = torch.where(same[:, None], qc @ kc.transpose(-1, -2), 0.0)
    # the state leaving chunk c: the keys of its last document (plus the carried state if that document began
    # before the chunk); a query reads the carried state only if it is in the document running at the chunk start
    last = sc[..., -1:]  # (B, nc, 1)
    tail = (sc == last).to(fk.dtype)  # (B, nc, C)
    kv = (kc * tail[:, None, ..., None]).transpose(-1, -2) @ vc  # (B, H, nc, F, Dv)
    zc = (kc * tail[:, None, ..., None]).sum(3)  # (B, H, nc, F)
    prev = torch.cat([sc.new_full((B, 1), -2), sc[:, :-1, -1]], 1)  # document before each chunk's start
    carry = (sc[..., -1] == prev).to(fk.dtype)  # (B, nc)
    S, z = fq.new_zeros(B, H, Fd, Dv), fq.new_zeros(B, H, Fd)
    s_in, z_in = [], []
    for c in range(nc):
        s_in.append(S)
        z_in.append(z)
        keep = carry[:, c].view(B, 1, 1, 1)
        S, z = S * keep + kv[:, :, c], z * keep[..., 0] + zc[:, :, c]
    s_prev, z_prev = torch.stack(s_in, 2), torch.stack(z_in, 2)  # (B, H, nc, F, Dv), (B, H, nc, F)
    reads = (sc == prev[..., None]).to(fq.dtype)[:, None, ..., None]  # (B, 1, nc, C, 1)
    qr = qc * reads
    num = a @ vc + qr @ s_prev
    den = a.sum(-1) + (qr * z_prev.unsqueeze(3)).sum(-1) + eps
    out = (num / den.unsqueeze(-1)).reshape(B, H, nc * C, Dv)[:, :, :n]
    if off > 0:
        out = out[:, :, off:]
    return out if top is None else torch.cat([top, out], dim=2)


def chunked_linear_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, causal: bool, eps: float, chunk_size: int = 64,
    doc_ids=None,
) -> torch.Tensor:
    """Linear attention on features: ``fq (B, H, Nq, F)``, ``fk (B, H, Nk, F)``, ``v (B, H, Nk, Dv)`` (same H).

    ``doc_ids`` int ``(B, Nk)`` or None: the state restarts at each document start (causal: equal to the
    document mask of :func:`attn_zoo.reference.linear_attention_reference`; non-causal: each query reads the
    sums of its own document). A document boundary inside a chunk masks the intra-chunk scores by document and
    stops the carried state at the boundary. Returns ``(B, H, Nq, Dv)`` in fp32 (fp64 for fp64 inputs).
    """
    fq, fk, v = upcast(fq), upcast(fk), upcast(v)
    if doc_ids is not None:
        return _packed_linear(fq, fk, v, causal, eps, doc_ids, chunk_size)
    B, H, Nq, Fd = fq.shape
    Nk, Dv = fk.shape[2], v.shape[3]
    if not causal:
        kv = fk.transpose(-1, -2) @ v  # (B, H, F, Dv)
        z = fk.sum(2)  # (B, H, F)
        return (fq @ kv) / ((fq * z.unsqueeze(2)).sum(-1, keepdim=True) + eps)
    off = Nk - Nq
    s0 = fq.new_zeros(B, H, Fd, Dv)
    z0 = fq.new_zeros(B, H, Fd)
    top = None
    if off > 0:  # keys before the first query: initial state
        s0 = fk[:, :, :off].transpose(-1, -2) @ v[:, :, :off]
        z0 = fk[:, :, :off].sum(2)
        fk, v = fk[:, :, off:], v[:, :, off:]
    elif off < 0:  # queries before the first key see nothing
        top = fq.new_zeros(B, H, -off, Dv)
        fq = fq[:, :, -off:]
    n = fq.shape[2]
    C = chunk_size
    pad = (-n) % C
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    nc = (n + pad) // C
    qc = fq.view(B, H, nc, C, Fd)
    kc = fk.view(B, H, nc, C, Fd)
    vc = v.view(B, H, nc, C, Dv)
    tril = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()
    a = (qc @ kc.transpose(-1, -2)).masked_fill(~tril, 0.0)  # (B, H, nc, C, C)
    kv = kc.transpose(-1, -2) @ vc  # (B, H, nc, F, Dv)
    # exclusive prefix sums (state before each chunk), without the cumsum - x subtraction that loses precision
    # and lets a NaN / inf of chunk c reach earlier chunks
    s_prev = torch.cat([s0.unsqueeze(2), kv[:, :, :-1]], dim=2).cumsum(2)  # (B, H, nc, F, Dv)
    zc = kc.sum(3)  # (B, H, nc, F)
    z_prev = torch.cat([z0.unsqueeze(2), zc[:, :, :-1]], dim=2).cumsum(2)
    num = a @ vc + qc @ s_prev
    den = a.sum(-1) + (qc * z_prev.unsqueeze(3)).sum(-1) + eps
    out = (num / den.unsqueeze(-1)).reshape(B, H, nc * C, Dv)[:, :, :n]
    return out if top is None else torch.cat([top, out], dim=2)


@register_backend("linear", "torch", supports=_supports, documents=True)
def torch_linear_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """Chunked PyTorch linear attention; shapes as :func:`attn_zoo.attention`; output in ``q.dtype``.
    ``doc_ids (B, Nk)``: the state restarts at each document start."""
    n_rep = q.shape[1] // k.shape[1]
    fq = apply_feature_map(upcast(q), spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(upcast(k), spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    out = chunked_linear_attention(fq, repeat_kv(fk, n_rep), repeat_kv(v, n_rep), spec.causal, spec.eps, spec.chunk_size,
                                   doc_ids)
    return out.to(q.dtype)
