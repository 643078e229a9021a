"""``triton`` backend of every softmax kind (any variant whose mask is a ``MaskInfo``): :func:`kernels.flash_attn`.

The mask comes from :func:`attn_zoo.masks.mask_info`: causal / window bounds are passed as numbers (the kernel
enumerates the visited tiles analytically with the same rule as :meth:`MaskInfo.block_table`), a dilation as the
element rule ``(i' - j) % dilation == 0`` applied inside the window's tiles (``dilation=``), the block-sparse
layout and its block tables (:func:`kernels.build_sparse_tables` from :meth:`MaskInfo.block_table` at the kernel's
tiles, rows ordered full tiles first; cached per spec and shape) are passed as tensors. GQA / MQA run natively
(``Hkv = k.shape[1]``). Kernel settings (:class:`kernels.FlashConfig`: dQ mode, dK/dV split, tiles, TMA) come
from ``config=``, else a ``flash_config`` field of the spec if it has one, else the current settings
(``FlashConfig()``, or the innermost :func:`kernels.flash_settings` block, e.g. around a training step). Inputs it
cannot run are reported by :func:`_supports` (``auto`` then falls back to ``torch``).
"""

from __future__ import annotations


import torch

from ..masks import mask_info, unseen_keys
from ..registry import derived_cache, family, register_backend
from ._triton import triton_input_reason


def _supports(q, k, v, spec, return_lse):
    why = triton_input_reason(q)
    if why is not None:
        return why
    if q.dtype == torch.bfloat16 and q.device.type != "cuda":
        return "bfloat16 is not supported by the CPU interpreter (its bf16 tl.dot is wrong); use float16 / float32"
    from kernels.flash import MAX_HEAD_DIM

    D = q.shape[-1]
    if D > MAX_HEAD_DIM:
        return f"head dim D={D} > {MAX_HEAD_DIM} is not supported"
    if v.shape[-1] > MAX_HEAD_DIM:  # Dv != D is supported (MLA)
        return f"v head dim Dv={v.shape[-1]} > {MAX_HEAD_DIM} is not supported"
    return None


def sparse_tables(spec, Nq, Nk, D, device, config=None):
    """``(layout, tables)`` of a sparse spec on ``device`` at the sparse tiles of ``config`` (default: the current
    settings): the int8 block layout and the six int32 block tables of :func:`kernels.build_sparse_tables` (full
    tiles first per row), built once per (spec, Nq, Nk, D, device, tiles) so a training step copies nothing to the
    GPU. Pass the same ``config`` to the :func:`kernels.flash_attn` call that uses them."""
    from kernels.flash import current_flash_config, sparse_tiles

    config = config if config is not None else current_flash_config()
    return _sparse_tables_at(spec, Nq, Nk, D, device, sparse_tiles(D, config))


@derived_cache(32)
def _sparse_tables_at(spec, Nq, Nk, D, device, tiles):
    from kernels import build_sparse_tables

    mi = mask_info(spec, Nq, Nk)
    layout = mi.layout.to(device=device, dtype=torch.int8).contiguous()
    return layout, build_sparse_tables(lambda bm, bn: mi.block_table(bm, bn), D, device, tiles=tiles)


_sparse_tables = sparse_tables  # the name eval/ and the tests used


@register_backend(family("softmax"), "triton", supports=_supports, documents=True)
def triton_softmax_attention(q, k, v, spec, return_lse=False, config=None, doc_ids=None):
    """Exact masked softmax attention through the fused Triton kernel (forward + backward, autograd).

    ``config``: a :class:`kernels.FlashConfig`; default ``spec.flash_config`` if the spec has that field and it is
    set, else the current settings (:func:`kernels.flash_settings`). ``doc_ids (B, Nk)``: packed documents, part of
    the kernel's mask description (tiles across documents skipped; :func:`kernels.flash_attn`)."""
    from kernels import flash_attn

    Nq, Nk = q.shape[2], k.shape[2]
    mi = mask_info(spec, Nq, Nk)
    unseen = unseen_keys(spec, Nq, Nk, str(q.device))
    if unseen is not None:  # keys no row may see: zeroed, so a NaN there cannot reach a tile that loads it
        k, v = k.masked_fill(unseen, 0.0), v.masked_fill(unseen, 0.0)
    window = None
    if mi.window_left is not None or mi.window_right is not None:
        window = (mi.window_left, mi.window_right)
    if config is None:  # None: the current settings (flash_attn and sparse_tables resolve them)
        config = getattr(spec, "flash_config", None)
    kw = {}
    if mi.layout is not None:
        layout, tables = sparse_tables(spec, Nq, Nk, q.shape[-1], q.device, config)
        kw = dict(block_layout=layout, block_size=mi.block_size, block_tables=tables)
    if mi.dilation != 1:
        kw["dilation"] = mi.dilation
    if mi.sink_size:
        kw["sink_size"] = mi.sink_size
    if doc_ids is not None:
        kw["doc_ids"] = doc_ids
    return flash_attn(q, k, v, causal=mi.causal, window_size=window, softmax_scale=spec.scale(q.shape[-1]),
                      return_lse=return_lse, config=config, **kw)
