"""FlexAttention (Guessous et al. 2024, ``torch.nn.attention.flex_attention``) set up once for the project.

Used by the ``torch`` backend (window / block-sparse on CUDA) and by the benchmarks as an anchor, so all of
them run the same compiled function and the same block mask:

* :func:`compiled_flex_attention` -- ``torch.compile(flex_attention, dynamic=False)``, created once per
  process (CUDA) with dynamo's recompile limits raised: every ``(shape, mask)`` compiles once, and without
  the raise dynamo silently falls back to eager FlexAttention, which materialises the ``Nq x Nk`` scores.
  Off CUDA it returns the eager function (what ``create_block_mask`` / tests on CPU can run).
* :func:`flex_block_mask` -- a ``BlockMask`` from :meth:`attn_zoo.masks.MaskInfo.allowed`, the element rule
  every backend shares (bottom-right alignment when ``Nq != Nk``); ``None`` for full attention. Cached.
* :func:`flex_document_block_mask` -- the same rule AND one document (packed documents, ``doc_ids``).
* :func:`flex_decoding_unsupported` -- why this torch's Flex decoding kernel (queries < 128) cannot compile with
  the installed triton, or ``None``; :func:`flex_decoding_refusal` -- the same for one query tensor.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import replace
from typing import Optional

import torch

from .masks import MaskInfo, mask_info
from .registry import _DERIVED, derived_cache

__all__ = ["compiled_flex_attention", "flex_block_mask", "flex_document_block_mask", "allow_retain_graph",
           "flex_decoding_unsupported", "flex_decoding_refusal"]

_COMPILED = {}
_LIMITS = ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit")


def compiled_flex_attention(device_type: str = "cuda", kernel_backend: str = "AUTO"):
    """The process-wide FlexAttention callable for ``device_type`` (compiled on CUDA, eager elsewhere).

    ``kernel_backend``: the ``kernel_options["BACKEND"]`` the caller passes (``"AUTO"``: the Triton kernels;
    ``"FLASH"``: the FA4 CuTe DSL kernels, the ``flex_fa4`` anchor): one compiled callable per value, so the two never
    share dynamo's cache entries. Raises ``ImportError`` when this torch has no FlexAttention.
    """
    key = device_type if kernel_backend == "AUTO" else (device_type, kernel_backend)
    if key not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        if device_type == "cuda":
            import torch._dynamo

            for attr in _LIMITS:
                if hasattr(torch._dynamo.config, attr):
                    setattr(torch._dynamo.config, attr, max(getattr(torch._dynamo.config, attr), 4096))
            _COMPILED[key] = torch.compile(flex_attention, dynamic=False)
        else:
            _COMPILED[key] = flex_attention
    return _COMPILED[key]


FLEX_DECODING_MAX_NQ = 128  # torch's inductor takes its Flex decoding template for fewer queries than this


def _templates_use_block_ptr(root: str) -> bool:
    """Whether a Flex decoding template under ``root`` (torch's ``_inductor/kernel/flex``) calls
    ``tl.make_block_ptr``."""
    import os

    for folder, _, files in os.walk(root):
        for name in files:
            if "decod" in name and name.endswith((".py", ".jinja")):
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    if "make_block_ptr" in f.read():
                        return True
    return False


@functools.lru_cache(maxsize=None)
def flex_decoding_unsupported() -> Optional[str]:
    """Why compiled FlexAttention cannot run fewer than :data:`FLEX_DECODING_MAX_NQ` queries here, or ``None``.

    For short queries torch's inductor compiles its Flex *decoding* template. In torch 2.11 that template builds
    ``tl.make_block_ptr`` block pointers, which triton 3.9 removed (its ``make_block_ptr`` only raises): such a
    pair fails at compile time with ``InductorError: ... Block pointers have been removed``. ``pip install torch``
    brings the triton torch was built with (2.11: 3.6), so only a triton installed over torch's pin meets this.
    Returns a one-line reason naming both versions, else ``None`` (also when torch or triton is missing: the
    caller's own availability check names those).
    """
    import os

    try:
        import triton
        import triton.language as tl
        import torch._inductor.kernel as kernels
    except Exception:  # noqa: BLE001 - no triton / inductor here (ImportError, or a broken install): nothing to name
        return None
    stub = getattr(tl, "make_block_ptr", None)
    if stub is not None and "removed" not in (getattr(stub, "__doc__", None) or ""):
        return None  # this triton still has block pointers
    root = os.path.join(os.path.dirname(kernels.__file__), "flex")
    if not (os.path.isdir(root) and _templates_use_block_ptr(root)):
        return None
    return (f"torch {torch.__version__}'s Flex decoding kernel (fewer than {FLEX_DECODING_MAX_NQ} queries) uses "
            f"tl.make_block_ptr, which triton {triton.__version__} removed: install the triton this torch was built "
            f"with (pip install torch brings it), or pass {FLEX_DECODING_MAX_NQ} or more queries")


def flex_decoding_refusal(q) -> Optional[str]:
    """Why compiled FlexAttention cannot run the queries ``q`` ``(B, H, Nq, D)`` here: on CUDA, fewer than
    :data:`FLEX_DECODING_MAX_NQ` queries on a torch / triton pair whose Flex decoding kernel cannot compile
    (:func:`flex_decoding_unsupported`); else ``None``."""
    if q.is_cuda and q.shape[2] < FLEX_DECODING_MAX_NQ:
        return flex_decoding_unsupported()
    return None


def allow_retain_graph() -> None:
    """Let compiled backwards run twice on one graph (``retain_graph=True``), as benchmarks that time the
    backward alone need: turns off AOTAutograd's donated buffers (a memory optimisation) for this process."""
    try:
        import torch._functorch.config as fconf

        fconf.donated_buffer = False
    except (ImportError, AttributeError):  # pragma: no cover - older / newer torch without the flag
        pass


@derived_cache(64)
def flex_block_mask(spec, Nq: int, Nk: int, device: str, block_size: int = 128):
    """``BlockMask`` of ``spec`` for ``Nq`` queries and ``Nk`` keys on ``device`` (``None`` if nothing is masked).

    Built from :meth:`attn_zoo.masks.MaskInfo.allowed` (compiled ``create_block_mask`` on CUDA), except a block
    layout on Flex's tiles on CUDA, which goes into the block lists (:func:`_layout_block_mask`; eager Flex, the CPU
    path, evaluates the ``mask_mod`` alone, so there the rule keeps the layout); ``block_size`` is
    FlexAttention's tile (128 is its default and the sparse layouts' block).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    mi: MaskInfo = mask_info(spec, Nq, Nk)
    if mi.is_full:
        return None
    if (mi.layout is not None and mi.block_size == block_size and mi.offset >= 0 and mi.offset % block_size == 0
            and torch.device(device).type == "cuda"):  # eager Flex (CPU) applies the mask_mod alone, not the lists
        return _layout_block_mask(mi, device, block_size)
    if mi.layout is not None:
        mi = replace(mi, layout=mi.layout.to(device))

    def mask_mod(b, h, q_idx, kv_idx):
        return mi.allowed(q_idx, kv_idx)

    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=Nq, KV_LEN=Nk, device=device, BLOCK_SIZE=block_size,
                             _compile=torch.device(device).type == "cuda")


def _layout_block_mask(mi: MaskInfo, device: str, block_size: int):
    """``BlockMask`` of a block-sparse rule whose layout blocks are Flex's tiles (``mi.block_size == block_size``,
    offset ``Nk - Nq`` a multiple of it): the layout goes into the block lists (``BlockMask.from_kv_blocks``; blocks
    the layout drops are never listed, blocks the whole rule keeps are listed as full) and the ``mask_mod`` keeps
    only the element terms (causal, window), which capture no tensor. This is how a Flex user writes BigBird; the
    element rule with a captured layout lookup is what the FA4 (CuTe DSL) backend failed to lower (2026-12-04)."""
    from torch.nn.attention.flex_attention import BlockMask

    tab = mi.block_table(block_size, block_size)  # aligned: each tile is one layout cell, so visited / full are exact
    rule = replace(mi, layout=None, block_size=0)  # rows have i' >= 0 (offset >= 0): the layout's i' >= 0 term holds

    def lists(sel: torch.Tensor):  # (nqb, nkb) bool -> counts (1, 1, nqb), indices (1, 1, nqb, nkb), int32
        idx = torch.sort((~sel).to(torch.int8), dim=1, stable=True).indices  # selected blocks first, in key order
        return (sel.sum(1).to(torch.int32)[None, None].to(device), idx.to(torch.int32)[None, None].to(device))

    kv_num, kv_idx = lists(tab.visited & ~tab.full)
    full_num, full_idx = lists(tab.full)

    def mask_mod(b, h, q_idx, kv_idx):
        return rule.allowed(q_idx, kv_idx)

    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(mi.Nq, mi.Nk))


_DOC_MASKS: list = []  # [(weakref to doc_ids, its _version, key, BlockMask)], the most recent first


def flex_document_block_mask(spec, doc_ids: torch.Tensor, Nq: int, Nk: int, block_size: int = 128,
                             q_pos: Optional[torch.Tensor] = None, q_doc: Optional[torch.Tensor] = None):
    """``BlockMask`` of ``spec`` restricted to packed documents (FlexAttention's document masking, Guessous et al.
    2024): ``mask_mod(b, h, i, j) = rule(q_pos[i], j) & (q_doc[b, i] == doc_ids[b, j])`` with the variant's element
    rule at absolute positions (:func:`attn_zoo.documents.document_allowed` is its dense form). ``q_pos`` / ``q_doc``
    default to the padded form (query ``i`` at key ``Nk - Nq + i``).

    Cached by the identity and version of ``doc_ids`` (the same tensor passed to every layer of a step builds one
    mask; a new batch builds a new one): the last 4 masks are kept. ``block_size``: FlexAttention's tile."""
    from torch.nn.attention.flex_attention import create_block_mask

    from .documents import query_documents, tensor_version

    explicit = q_pos is not None
    key = (spec, Nq, Nk, block_size, str(doc_ids.device), explicit)
    if not explicit:
        for ref, ver, k, bm in _DOC_MASKS:
            if k == key and ref() is doc_ids and ver is not None and ver == tensor_version(doc_ids):
                return bm
        q_pos, q_doc = query_documents(doc_ids, Nq)
    d = doc_ids.long()
    qd = q_doc.long()
    mi = mask_info(spec, Nq, Nk)
    mi0 = replace(mi, Nq=Nk + Nq, layout=None if mi.layout is None else mi.layout.to(d.device))
    rows = (q_pos.long() + Nq).to(d.device)  # the rule at absolute positions q_pos >= -Nq (offset -Nq)

    def mask_mod(b, h, q_idx, kv_idx):
        return mi0.allowed(rows[q_idx], kv_idx) & (qd[b, q_idx] == d[b, kv_idx])

    bm = create_block_mask(mask_mod, B=d.shape[0], H=None, Q_LEN=Nq, KV_LEN=Nk, device=str(d.device),
                           BLOCK_SIZE=block_size, _compile=d.device.type == "cuda")
    if not explicit and tensor_version(doc_ids) is not None:  # an inference tensor is not cached
        try:
            _DOC_MASKS.insert(0, (weakref.ref(doc_ids), tensor_version(doc_ids), key, bm))
            del _DOC_MASKS[4:]
        except TypeError:  # pragma: no cover - no weak references to this tensor type: not cached
            pass
    return bm


def _forget_document_masks() -> None:
    _DOC_MASKS.clear()


_DERIVED.append(_forget_document_masks)  # forget_derived() (a (re)registration) drops them with every other cache
