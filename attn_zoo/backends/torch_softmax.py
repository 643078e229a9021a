"""``torch`` backend of every softmax kind (any variant whose mask is a ``MaskInfo``): what a user would pick
instead of our kernels.

* Plain causal / full attention (any device): ``F.scaled_dot_product_attention`` with ``enable_gqa``;
  causal with ``Nq < Nk`` uses the bottom-right mask ``causal_lower_right``; with ``Nq > Nk`` the top
  ``Nq - Nk`` rows see nothing and are 0.
* Window and block-sparse on CUDA: FlexAttention (Guessous et al. 2024) with a ``BlockMask`` built from the
  same element rule (:meth:`attn_zoo.masks.MaskInfo.allowed`); compiled once per process.
* Window and block-sparse elsewhere, or where compiling FlexAttention fails (a warning says so): SDPA with
  the dense boolean mask (O(Nq * Nk) memory). Also for fewer than 128 queries on a torch / triton pair whose Flex
  decoding kernel cannot compile (:func:`attn_zoo.flex.flex_decoding_unsupported`; ``return_lse`` is then refused
  with that reason).

Packed documents (``doc_ids``, :mod:`attn_zoo.documents`): on CUDA FlexAttention with the document ``BlockMask``
(:func:`attn_zoo.flex.flex_document_block_mask`: tiles that lie across documents are skipped; built once per
``doc_ids`` tensor, so once per training step), elsewhere (or where compiling fails) SDPA with the dense
``(B, 1, Nq, Nk)`` boolean mask. The lse with documents needs the Flex path.

Rows that see no key output 0 with zero gradient (SDPA alone would give NaN there).

Non-finite inputs: keys / values that no query may see (e.g. keys left of every window when decoding with
``Nq < Nk``, unvisited layout blocks) are zeroed before SDPA / Flex (a cached per-(spec, shape) column mask,
one O(Nk * D) ``masked_fill`` of K and V, only on the masked paths and only when such keys exist), so a NaN or
inf there changes no output and no gradient. A non-finite key / value that *some* row sees may still reach
rows that do not see it, and their gradients: SDPA adds a boolean mask as ``-inf`` to the scores
(``NaN + -inf = NaN``) and multiplies masked weights of 0 by the values (``0 * NaN``), and FlexAttention does
the same inside partially masked 128 x 128 tiles; the same holds for rows that see no key (they attend
everything inside SDPA and are zeroed afterwards). On the CPU with fewer than 16 keys SDPA runs its math kernel
(:func:`sdpa`): the CPU flash kernel would return 0 for a NaN query row there. ``backend="reference"`` is exact
for every pair.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..flex import compiled_flex_attention, flex_block_mask, flex_decoding_refusal, flex_document_block_mask
from ..masks import mask_info, meta_via_cpu, unseen_keys
from ..registry import derived_cache, family, register_backend


def _supports(q, k, v, spec, return_lse):
    if return_lse and not (q.is_cuda and not mask_info(spec, q.shape[2], k.shape[2]).is_full):
        return ("return_lse needs the FlexAttention path (CUDA, masked kinds); use backend='reference' (or 'triton', "
                "where it takes the call)")
    if q.dtype == torch.float64 and q.is_cuda:
        return "float64 is not supported by SDPA / FlexAttention on CUDA"
    if return_lse:  # only Flex gives the lse here: an InductorError from the compiler otherwise
        why = flex_decoding_refusal(q)
        if why is not None:
            return (f"return_lse needs the FlexAttention path, and {why}; use backend='reference' (or 'triton', "
                    f"where it takes the call)")
    return None


# PyTorch's CPU flash SDPA kernel (what SDPA picks on the CPU without a boolean mask) returns 0 for a NaN query row
# with fewer than 16 keys and ignores a NaN key with one key (torch 2.13): below that many keys the math kernel runs
# instead (same numbers, non-finite inputs kept; at that size it costs nothing).
CPU_FLASH_MIN_KEYS = 16


def sdpa(q, k, v, scale, attn_mask=None, is_causal=False):
    """``F.scaled_dot_product_attention`` with ``enable_gqa`` when ``Hq != Hkv``, and the math kernel on the CPU below
    :data:`CPU_FLASH_MIN_KEYS` keys (NaN / inf inputs reach the rows that see them, as on every backend)."""
    math_only = q.device.type == "cpu" and k.shape[2] < CPU_FLASH_MIN_KEYS
    with sdpa_kernel([SDPBackend.MATH]) if math_only else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])


@derived_cache(32)
@meta_via_cpu
def _dense_mask(spec, Nq: int, Nk: int, device: str):
    """``(attn_mask, empty_rows or None)`` for SDPA: empty rows attend everything and are zeroed afterwards."""
    allowed = mask_info(spec, Nq, Nk).dense(device)  # (Nq, Nk)
    empty = ~allowed.any(-1, keepdim=True)  # (Nq, 1)
    return allowed | empty, (empty if bool(empty.any()) else None)


def _sdpa_dense_mask(q, k, v, scale, spec):
    attn_mask, empty = _dense_mask(spec, q.shape[2], k.shape[2], str(q.device))
    out = sdpa(q, k, v, scale, attn_mask=attn_mask)
    return out if empty is None else out.masked_fill(empty, 0.0)


_FLEX_FAILED = set()  # (spec, Nq, Nk, D, dtype) whose compiled FlexAttention failed: SDPA dense mask instead


def _sdpa_documents(q, k, v, scale, spec, doc_ids, q_pos=None, q_doc=None):
    """SDPA with the dense document-masked rule ``(B, 1, Nq, Nk)`` (:func:`attn_zoo.documents.document_allowed`);
    rows that see no key attend everything inside SDPA and are zeroed afterwards."""
    from ..documents import document_allowed

    allowed = document_allowed(spec, q.shape[2], k.shape[2], doc_ids, q_pos, q_doc).unsqueeze(1)  # (B, 1, Nq, Nk)
    empty = ~allowed.any(-1, keepdim=True)
    out = sdpa(q, k, v, scale, attn_mask=allowed | empty)
    return out.masked_fill(empty, 0.0)


@register_backend(family("softmax"), "torch", supports=_supports, documents=True)
def torch_softmax_attention(q, k, v, spec, return_lse=False, doc_ids=None, q_pos=None, q_doc=None):
    """SDPA / FlexAttention with the spec's mask; shapes as :func:`attn_zoo.attention`. ``doc_ids (B, Nk)``: packed
    documents (FlexAttention document mask on CUDA, else SDPA with the dense boolean mask); ``q_pos`` / ``q_doc``:
    explicit query positions / documents (:func:`attn_zoo.attention_varlen` with ``Nq_d != Nk_d``)."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    scale = spec.scale(D)
    if doc_ids is not None:
        fkey = (spec, Nq, Nk, D, q.dtype, "documents")
        if q.is_cuda and fkey not in _FLEX_FAILED and flex_decoding_refusal(q) is None:
            bm = flex_document_block_mask(spec, doc_ids, Nq, Nk, q_pos=q_pos, q_doc=q_doc)
            try:
                return compiled_flex_attention("cuda")(q, k, v, block_mask=bm, scale=scale,
                                                       enable_gqa=q.shape[1] != k.shape[1], return_lse=return_lse)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # compile / lowering failures: SDPA with the dense document mask
                if return_lse:
                    raise
                _FLEX_FAILED.add(fkey)
                warnings.warn(f"compiled FlexAttention with a document mask failed for kind={spec.kind!r}, Nq={Nq}, "
                              f"Nk={Nk} ({type(e).__name__}); using SDPA with a dense mask instead")
        if return_lse:
            raise ValueError("return_lse with doc_ids needs the FlexAttention path (CUDA); use backend='reference' "
                             "or 'triton'")
        return _sdpa_documents(q, k, v, scale, spec, doc_ids, q_pos, q_doc)
    mi = mask_info(spec, Nq, Nk)
    if mi.is_full and not return_lse:
        return sdpa(q, k, v, scale)
    if mi.is_plain_causal and not return_lse:
        if Nq == Nk:
            return sdpa(q, k, v, scale, is_causal=True)
        if Nq < Nk:
            from torch.nn.attention.bias import causal_lower_right

            return sdpa(q, k, v, scale, attn_mask=causal_lower_right(Nq, Nk))
        top = q.new_zeros(q.shape[0], q.shape[1], Nq - Nk, v.shape[-1])  # rows with i' < 0 see nothing
        return torch.cat([top, sdpa(q[:, :, Nq - Nk:], k, v, scale, is_causal=True)], dim=2)
    unseen = unseen_keys(spec, Nq, Nk, str(q.device))
    if unseen is not None:  # keys no row may see contribute nothing, not even 0 * NaN (module docstring)
        k, v = k.masked_fill(unseen, 0.0), v.masked_fill(unseen, 0.0)
    if q.is_cuda and (spec, Nq, Nk, D, q.dtype) not in _FLEX_FAILED and flex_decoding_refusal(q) is None:
        bm = flex_block_mask(spec, Nq, Nk, str(q.device))
        try:
            return compiled_flex_attention("cuda")(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1], return_lse=return_lse)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # compile / lowering failures (seen: ragged Nq != Nk shapes on torch 2.11)
            if return_lse:
                raise
            _FLEX_FAILED.add((spec, Nq, Nk, D, q.dtype))
            warnings.warn(f"compiled FlexAttention failed for kind={spec.kind!r}, Nq={Nq}, Nk={Nk} "
                          f"({type(e).__name__}); using SDPA with a dense mask (O(Nq * Nk) memory) instead")
    return _sdpa_dense_mask(q, k, v, scale, spec)
