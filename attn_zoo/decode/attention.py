"""Decode attention: :func:`decode_attention`, the decode-phase counterpart of :func:`attn_zoo.attention`.

``decode_attention(q, k_cache, v_cache, spec, cache_seqlens, block_table=None, backend="auto")`` follows
FlashAttention's ``flash_attn_with_kvcache`` (Dao 2023, FlashAttention 2.x API) in the ``(B, H, N, D)`` layout:
the ``Nq`` new tokens are already in the cache (:func:`attn_zoo.decode.append_kv`), and query ``i`` of sequence
``b`` sits at absolute position ``cache_seqlens[b] - Nq + i``. The mask of sequence ``b`` is exactly
``attn_zoo.masks.mask_info(spec, Nq, cache_seqlens[b])`` (bottom-right alignment: positions counted from the
end of each sequence's cache), so a decode step sees what the last rows of a full forward see.

Backends (``"auto"``: ``triton`` on CUDA where it supports the input, else ``torch``, else ``reference``):

* ``reference``: plain PyTorch, fp32, per sequence, the mask of :func:`attn_zoo.masks.mask_info` materialised
  and :func:`attn_zoo.softmax_attention_reference` (the ground truth of the kernel tests).
* ``torch``: the cache gathered to ``(B, Hkv, L, D)`` (``L = max seqlen``) and one
  ``F.scaled_dot_product_attention`` call with a ``(B, 1, Nq, L)`` boolean mask built from the same rule (no mask
  at all for a single query of a causal spec with equal lengths). What a user would write; the SDPA anchor.
* ``triton``: the fused split-K kernel :func:`kernels.decode.decode_attn` (FlashDecoding + PagedAttention), with
  the window terms of the mask and, when the mask has a block layout, the layout of each sequence (or one layout
  for the whole capacity when the variant's ``decode_mask`` gives one: :func:`decode_mask_terms`). No kind is
  named here: a plugin variant's mask reaches the kernel exactly as a built-in's does.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backends.torch_softmax import sdpa
from ..masks import mask_info
from ..registry import derived_cache
from ..reference import softmax_attention_reference
from ..spec import AttentionSpec
from .cache import _check_seqlens, cache_capacity, cdiv, check_cache_layout, check_cache_values, gather_kv

DECODE_BACKENDS = ("triton", "torch", "reference")
KERNEL_OPTIONS = ("block_n", "max_registers", "merge", "num_splits", "num_stages", "num_warps", "page_gather",
                  "pdl", "split_rule")  # kernels.decode.decode_plan's tile / launch options


def _check_kernel_options(kernel_options, allowed=KERNEL_OPTIONS):
    """``ValueError`` naming an unknown kernel option and the allowed ones (not a ``TypeError`` from the kernel)."""
    bad = sorted(set(kernel_options) - set(allowed))
    if bad:
        raise ValueError(f"kernel options {bad} are not supported; allowed values: {', '.join(allowed)}")


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_decode_inputs(q, k_cache, v_cache, spec, cache_seqlens, block_table=None, check_values: bool = True,
                        cache_leftpad=None) -> None:
    """Validate the arguments of :func:`decode_attention`; raises ``ValueError`` / ``TypeError`` naming the argument.

    ``check_values`` also checks ``Nq <= cache_seqlens[b] <= capacity``, the page indices in use and
    ``0 <= cache_leftpad[b] <= cache_seqlens[b] - Nq`` (one host sync).
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec must be an attn_zoo.AttentionSpec, got {type(spec).__name__}")
    if not spec.is_softmax:
        from ..variants import kinds_of

        raise ValueError(f"decode_attention needs a softmax kind ({', '.join(kinds_of('softmax'))}), got "
                         f"kind={spec.kind!r}; linear attention decodes from an O(1) state: "
                         f"attn_zoo.decode.linear_prefill / linear_decode")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (B, Hq, Nq, D), got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q.dtype={q.dtype} is not supported; allowed values: float16, bfloat16, float32, float64")
    B, Hq, Nq, D = q.shape
    if min(B, Hq, Nq, D) < 1:
        raise ValueError(f"q must have B, Hq, Nq, D >= 1, got shape {tuple(q.shape)}")
    check_cache_layout(k_cache, v_cache, block_table, B, head_dim=D, dtype=q.dtype, allow_dv=True)
    if k_cache.device != q.device:
        raise ValueError(f"q is on {q.device}, k_cache on {k_cache.device}")
    Hkv = k_cache.shape[1]
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (k_cache.shape[1]) for grouped-query attention")
    _check_seqlens(cache_seqlens, B, q.device)
    cap = cache_capacity(k_cache, block_table)
    if Nq > cap:
        raise ValueError(f"Nq={Nq} new tokens exceed the cache capacity of {cap} tokens")
    if cache_leftpad is not None:
        if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32 \
                or cache_leftpad.shape != (B,):
            raise TypeError(f"cache_leftpad must be an int32 tensor of shape (B={B},), got "
                            f"{getattr(cache_leftpad, 'dtype', type(cache_leftpad).__name__)} "
                            f"{tuple(getattr(cache_leftpad, 'shape', ()))}")
        if cache_leftpad.device != q.device:
            raise ValueError(f"cache_leftpad is on {cache_leftpad.device}, q on {q.device}")
        sink = mask_info(spec, 1, 1).sink_size
        if sink:
            raise ValueError(f"cache_leftpad with kind={spec.kind!r} (sink_size={sink}) is not supported: the sinks "
                             f"are the first {sink} cache slots, which left padding fills; keep the prompts "
                             f"unpadded (cache_seqlens per sequence)")
    if check_values:
        check_cache_values(cache_seqlens, cap, block_table, k_cache.shape[0], k_cache.shape[2], min_len=Nq)
        if cache_leftpad is not None:
            for b, (lp, n) in enumerate(zip(cache_leftpad.tolist(), cache_seqlens.tolist())):
                if lp < 0 or lp > n - Nq:
                    raise ValueError(f"cache_leftpad[{b}]={lp} must be in [0, cache_seqlens[{b}] - Nq = {n - Nq}]: "
                                     f"the first visible key, at or before the first new query")


# --------------------------------------------------------------------------------------------- reference
def _leftpad_reference(q, k, v, spec, first: int):
    """fp32 softmax attention with the mask of ``mask_info(spec, Nq, Nk)`` and keys ``j < first`` hidden."""
    from ..reference import repeat_kv, upcast

    Nq, Nk = q.shape[2], k.shape[2]
    n_rep = q.shape[1] // k.shape[1]
    qf, kf, vf = upcast(q), repeat_kv(upcast(k), n_rep), repeat_kv(upcast(v), n_rep)
    hidden = (torch.arange(Nk, device=q.device) < first).view(1, 1, -1, 1)  # never read: NaN there stays out
    kf, vf = kf.masked_fill(hidden, 0.0), vf.masked_fill(hidden, 0.0)
    allowed = mask_info(spec, Nq, Nk).dense(q.device) & (torch.arange(Nk, device=q.device) >= first).view(1, -1)
    s = (qf @ kf.transpose(-1, -2) * spec.scale(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), 0.0, m)
    e = torch.where(allowed, torch.exp(s - m), 0.0)
    l = e.sum(-1, keepdim=True)
    out = ((e / torch.where(l == 0, 1.0, l)) @ vf).to(q.dtype)
    return out, (m + torch.log(l)).squeeze(-1)


def decode_attention_reference(q, k_cache, v_cache, spec, cache_seqlens, block_table=None, return_lse=False,
                               cache_leftpad=None):
    """Ground truth: per sequence, keys ``0 .. cache_seqlens[b] - 1`` gathered and
    :func:`attn_zoo.softmax_attention_reference` run with ``Nk = cache_seqlens[b]`` (fp32, dense mask of
    :func:`attn_zoo.masks.mask_info`; with ``cache_leftpad`` also ``j >= cache_leftpad[b]``). Output
    ``(B, Hq, Nq, Dv)`` in ``q.dtype``; lse fp32 ``(B, Hq, Nq)``."""
    outs, lses = [], []
    lens = cache_seqlens.tolist()
    firsts = cache_leftpad.tolist() if cache_leftpad is not None else [0] * len(lens)
    for b, L in enumerate(lens):
        if block_table is None:
            kb, vb = k_cache[b: b + 1, :, :L], v_cache[b: b + 1, :, :L]
        else:
            kb, vb = gather_kv(k_cache, v_cache, block_table[b: b + 1], L, cache_seqlens[b: b + 1])
        if firsts[b] > 0:
            o, lse = _leftpad_reference(q[b: b + 1], kb, vb, spec, firsts[b])
        else:
            o, lse = softmax_attention_reference(q[b: b + 1], kb, vb, spec, return_lse=True)
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_lse else out


# --------------------------------------------------------------------------------------------- torch (SDPA)
@derived_cache(256)
def _rows_mask(spec: AttentionSpec, Nq: int, L: int, width: int, device: str) -> torch.Tensor:
    """``(Nq, width)`` bool: the ``mask_info(spec, Nq, L)`` rule, False past ``L``."""
    m = torch.zeros(Nq, width, dtype=torch.bool, device=device)
    if L > 0:  # an empty slot (cache_seqlens 0, a padded batch row) sees nothing
        m[:, :L] = mask_info(spec, Nq, L).dense(device)
    return m


@derived_cache(256)
def _sees_all(spec: AttentionSpec, Nq: int, L: int, width: int) -> bool:
    """Whether the ``Nq`` queries of a sequence of ``L`` tokens see every one of ``width`` cache slots."""
    return L == width and L > 0 and bool(mask_info(spec, Nq, L).dense("cpu").any(0).all())


def decode_attention_torch(q, k_cache, v_cache, spec, cache_seqlens, block_table=None, cache_leftpad=None):
    """SDPA over the gathered cache with the per-sequence mask (see the module docstring); ``cache_leftpad``
    hides keys ``j < cache_leftpad[b]`` of row ``b``."""
    B, Hq, Nq, D = q.shape
    lens = cache_seqlens.tolist()
    firsts = cache_leftpad.tolist() if cache_leftpad is not None else [0] * B
    padded = any(f > 0 for f in firsts)
    L = max(lens)
    k, v = gather_kv(k_cache, v_cache, block_table, L, cache_seqlens)
    scale = spec.scale(D)
    mi = mask_info(spec, Nq, L)
    plain = mi.is_plain_causal
    if plain and Nq == 1 and not padded and all(n == L for n in lens):  # one query at the end sees every key
        return sdpa(q, k, v, scale)
    dev = str(q.device)
    mask = torch.stack([_rows_mask(spec, Nq, n, L, dev) for n in lens]).unsqueeze(1)  # (B, 1, Nq, L)
    if padded:
        lp = torch.tensor(firsts, device=q.device).view(B, 1, 1, 1)
        mask = mask & (torch.arange(L, device=q.device).view(1, 1, 1, L) >= lp)
    # keys no query of a sequence sees (outside its window / layout, slots past a shorter sequence's end: stale,
    # NaN or another sequence's page) are zeroed, as the prefill backends do (attn_zoo.masks.unseen_keys): SDPA's
    # additive mask would turn a NaN there into NaN rows
    if padded or not all(_sees_all(spec, Nq, n, L) for n in lens):  # host-side rule (cached): no device sync
        seen = mask.any(2).unsqueeze(-1)  # (B, 1, L, 1)
        k, v = k.masked_fill(~seen, 0.0), v.masked_fill(~seen, 0.0)
    empty = ~mask.any(-1, keepdim=True)
    out = sdpa(q, k, v, scale, attn_mask=mask | empty)
    return out.masked_fill(empty, 0.0) if bool(empty.any()) else out


# --------------------------------------------------------------------------------------------- triton
def _triton_reason(q, k_cache, spec, v_cache=None) -> Optional[str]:
    from ..backends._triton import triton_input_reason

    why = triton_input_reason(q)
    if why is not None:
        return why
    if q.dtype == torch.bfloat16 and q.device.type != "cuda":
        return "bfloat16 is not supported by the CPU interpreter (its bf16 tl.dot is wrong); use float16 / float32"
    dv = q.shape[-1] if v_cache is None else v_cache.shape[-1]
    if max(q.shape[-1], dv) > 1024:
        return f"head dims D={q.shape[-1]}, Dv={dv}: at most 1024 are supported"
    if k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        return "the head dim of q and the cache must be contiguous"
    if mask_info(spec, 1, 1).dilation != 1:
        return "the decode kernel has no dilation rule (dilated window); use backend='torch' or 'reference'"
    return None


@derived_cache(64)
def decode_mask_terms(spec: AttentionSpec, Nq: int, capacity: int):
    """The mask that serves every sequence length up to ``capacity`` in one piece, as a
    :class:`attn_zoo.MaskInfo` for ``Nk = capacity`` (its layout covers the capacity's blocks), or ``None`` when the
    variant gives none (``decode_mask`` of :func:`attn_zoo.register_variant`) and the mask has a block layout:
    then every sequence gets the layout of its own length."""
    from ..masks import MaskInfo
    from ..variants import get_variant

    v = get_variant(spec.kind)
    mi = mask_info(spec, Nq, capacity)
    if mi.layout is None:
        return mi  # window / dilation terms are relative to the query: one rule for every length
    if v.decode_mask is None:
        return None
    terms = v.decode_mask(spec, Nq, capacity)
    if terms is None:
        return None
    terms = dict(terms)
    if spec.causal and terms.get("window_right") is not None:
        terms["window_right"] = min(terms["window_right"], 0)
    return MaskInfo(Nq, capacity, spec.causal, **terms)


@derived_cache(32)
def _shared_layout(spec: AttentionSpec, Nq: int, capacity: int, block_n: int, device: str):
    """Layout (int8 ``(nb, nb)``) and tile tables of :func:`decode_mask_terms` (one for every sequence)."""
    from kernels.decode import decode_sparse_tables

    mi = decode_mask_terms(spec, Nq, capacity)
    lay = mi.layout.to(device=device, dtype=torch.int8)
    return lay, decode_sparse_tables(lay, mi.block_size, block_n)


def _window_of(mi):
    if mi.window_left is None and mi.window_right is None:
        return None
    return (mi.window_left, mi.window_right)


def make_decode_plan(q, k_cache, v_cache, spec, block_table=None, *, return_lse: bool = False,
                     has_leftpad: bool = False, sm_count=None, **kernel_options):
    """A :class:`kernels.decode.DecodePlan` of the triton backend for ``spec``'s mask (plan once, then pass
    ``plan=`` to :func:`decode_attention` at every step: no host work, no allocation, CUDA-graph safe).
    Arguments as :func:`decode_attention` (values of ``q`` / the caches are not read); ``has_leftpad``: the steps
    pass ``cache_leftpad``; ``sm_count``: SMs to fill (default the device's). Masks whose block layout depends
    on each sequence's length (no ``decode_mask`` of the variant) and dilated windows have no plan: ``ValueError``."""
    from kernels.decode import decode_plan

    _check_kernel_options(kernel_options)
    if mask_info(spec, 1, 1).dilation != 1:  # (decode_attention's triton backend refuses it too: _triton_reason)
        raise ValueError(f"make_decode_plan: kind={spec.kind!r} (dilation {mask_info(spec, 1, 1).dilation}): the "
                         f"decode kernel has no dilation rule; call decode_attention with backend='torch' or "
                         f"'reference' for a dilated window")
    window, sparse, opts = _triton_terms(q, k_cache, spec, None, block_table, kernel_options)
    plan = decode_plan(q, k_cache, v_cache, block_table, causal=spec.causal, window_size=window,
                       softmax_scale=spec.scale(q.shape[-1]), sparse=sparse, return_lse=return_lse,
                       has_leftpad=has_leftpad, sm_count=sm_count, **opts)
    plan.owner = spec  # a step with another spec is refused (decode_attention_triton)
    return plan


def _triton_terms(q, k_cache, spec, cache_seqlens, block_table, kernel_options):
    """``(window_size, DecodeSparse or None, kernel_options)`` of ``spec``'s mask for the decode kernel."""
    from kernels.decode import DecodeSparse, decode_block_n, decode_sparse_tables

    B, _, Nq, D = q.shape
    cap = cache_capacity(k_cache, block_table)
    shared = decode_mask_terms(spec, Nq, cap)
    sparse = None
    bn = kernel_options.get("block_n") or decode_block_n(D, k_cache.shape[2] if block_table is not None else None)
    if shared is not None:
        window = _window_of(shared)
        if shared.layout is not None:
            lay, tables = _shared_layout(spec, Nq, cap, bn, str(q.device))
            sparse = DecodeSparse(lay, shared.block_size, tables)
    else:  # the layout depends on each sequence's length: one layout per sequence, padded to the capacity
        if cache_seqlens is None:
            raise ValueError(f"kind={spec.kind!r}: the block layout depends on each sequence's length (the variant "
                             f"gives no decode_mask), so the decode kernel has no plan for it; call "
                             f"decode_attention without plan=")
        lens = cache_seqlens.tolist()
        mis = [mask_info(spec, Nq, n) for n in lens]
        window, bs = _window_of(mis[0]), mis[0].block_size
        if any(_window_of(m) != window or m.block_size != bs for m in mis):
            raise ValueError(f"kind={spec.kind!r}: the window / block size of the mask differs between sequence "
                             f"lengths {sorted(set(lens))}; the decode kernel takes one; use backend='torch'")
        nb = max(cdiv(cap, bs), 1)
        lay = torch.zeros(B, nb, nb, dtype=torch.int8)
        for b, m in enumerate(mis):
            nbb = m.layout.shape[-1]
            lay[b, :nbb, :nbb] = m.layout.to(torch.int8)
        lay = lay.to(q.device)
        sparse = DecodeSparse(lay, bs, decode_sparse_tables(lay, bs, bn))
    if sparse is not None:
        kernel_options = dict(kernel_options, block_n=bn)
    sink = mask_info(spec, 1, 1).sink_size  # (a window term: the same for every length; no layout beside it)
    if sink:
        kernel_options = dict(kernel_options, sink_size=sink)
    return window, sparse, kernel_options


def decode_attention_triton(q, k_cache, v_cache, spec, cache_seqlens, block_table=None, return_lse=False,
                            cache_leftpad=None, plan=None, **kernel_options):
    """:func:`kernels.decode.decode_attn` with the spec's mask (window bounds as numbers, block layout + tiles),
    whatever the kind: the terms come from :func:`attn_zoo.masks.mask_info` / :func:`decode_mask_terms`.
    ``plan``: a :func:`make_decode_plan` (its mask and tiles are used; ``kernel_options`` must be empty)."""
    from kernels.decode import decode_attn, decode_run

    if plan is not None:
        from kernels.decode import DecodePlan

        if not isinstance(plan, DecodePlan):
            raise ValueError(f"plan must be a kernels.decode.DecodePlan from make_decode_plan, got "
                             f"{type(plan).__name__}")
        if plan.owner is not None and plan.owner is not spec and plan.owner != spec:
            raise ValueError(f"plan= was made for spec {plan.owner} and this step passes {spec}: the plan's mask "
                             f"(causal, window, scale, block layout) is fixed at planning; make a plan per spec")
        if kernel_options:
            raise ValueError(f"kernel options {sorted(kernel_options)} are the plan's; leave them out with plan=")
        if bool(return_lse) != plan.return_lse:
            raise ValueError(f"return_lse={return_lse} but the plan was made with return_lse={plan.return_lse}")
        return decode_run(plan, q, k_cache, v_cache, cache_seqlens, block_table, cache_leftpad)
    window, sparse, opts = _triton_terms(q, k_cache, spec, cache_seqlens, block_table, kernel_options)
    return decode_attn(q, k_cache, v_cache, cache_seqlens, block_table, causal=spec.causal, window_size=window,
                       softmax_scale=spec.scale(q.shape[-1]), sparse=sparse, return_lse=return_lse,
                       cache_leftpad=cache_leftpad, **opts)


# --------------------------------------------------------------------------------------------- interface
def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, spec: AttentionSpec, cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor] = None, backend: str = "auto", *, return_lse: bool = False,
    check_values: Optional[bool] = None, cache_leftpad: Optional[torch.Tensor] = None, **kernel_options,
):
    """Attention of ``Nq`` new queries over a KV cache (decode phase), any softmax variant.

    Args:
        q: ``(B, Hq, Nq, D)`` float16 / bfloat16 / float32 (float64: reference / torch), ``Nq >= 1``.
        k_cache, v_cache: contiguous ``(B, Hkv, N_max, D)`` or paged ``(num_pages, Hkv, page_size, D)``, ``q``'s
            dtype; ``Hkv`` divides ``Hq`` (GQA: query head ``h`` reads K/V head ``h // (Hq // Hkv)``; MQA ``Hkv = 1``).
        spec: softmax :class:`attn_zoo.AttentionSpec` (``flash``, ``sliding_window``, ``sparse``; the block layout
            is over absolute positions).
        cache_seqlens: int32 ``(B,)``, valid tokens per sequence *including* the ``Nq`` new ones (ragged).
        block_table: int32 ``(B, max_pages)`` for a paged cache (vLLM PagedAttention), else ``None``.
        backend: ``"auto"``, ``"triton"``, ``"torch"`` or ``"reference"`` (see the module docstring).
        return_lse: also return the fp32 natural-log lse ``(B, Hq, Nq)`` (``triton`` / ``reference``).
        check_values: validate ``Nq <= cache_seqlens[b] <= capacity`` and the page indices in use (one host
            sync; callers that maintain the cache themselves, e.g. :class:`attn_zoo.decode.KVCache`, pass False).
            Default ``None``: True, except with ``plan=`` (a step inside a CUDA graph must not sync: pass True to
            check anyway).
        cache_leftpad: int32 ``(B,)`` or ``None``: the first key of the current document in each row's cache
            (decode on a packed prefix; FlashAttention's name); keys ``j < cache_leftpad[b]`` are not seen,
            positions (causal, window, block layout) stay absolute. Every backend.
        kernel_options: ``triton`` only: ``num_splits``, ``block_n``, ``num_warps``, ``num_stages``, ``page_gather``,
            ``merge``, ``split_rule``, ``max_registers`` (:func:`kernels.decode.decode_plan`), or ``plan``
            (a :func:`make_decode_plan`: no host work and no allocation per step; the output is the plan's buffer).

    Returns:
        ``(B, Hq, Nq, Dv)`` in ``q.dtype`` (and ``lse``); ``Dv = v_cache.shape[-1]`` may differ from ``D``
        (MLA's absorbed decode). Rows that see no key are 0.

    Raises:
        ValueError / TypeError: bad shapes or dtypes, ``Hq % Hkv != 0``, ``cache_seqlens`` past the cache or below
        ``Nq``, a page index out of range, a linear spec, an unknown backend or one that cannot run the input, an
        unknown kernel option.
    """
    if check_values is None:  # a planned step stays free of host syncs (CUDA-graph capture), an unplanned one checks
        check_values = kernel_options.get("plan") is None
    check_decode_inputs(q, k_cache, v_cache, spec, cache_seqlens, block_table, bool(check_values), cache_leftpad)
    why = None
    if backend == "auto":
        why = _triton_reason(q, k_cache, spec, v_cache) if q.device.type == "cuda" else "auto uses it on CUDA only"
        if why is None:
            backend = "triton"
        elif return_lse or (q.dtype == torch.float64 and q.is_cuda):
            backend = "reference"
        else:
            backend = "torch"
    elif backend == "triton":
        why = _triton_reason(q, k_cache, spec, v_cache)
    if backend not in DECODE_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed values: auto, {', '.join(DECODE_BACKENDS)}")
    if kernel_options and backend != "triton":
        raise ValueError(f"kernel options {sorted(kernel_options)} are only used by backend='triton'")
    if backend == "triton":
        _check_kernel_options(kernel_options, KERNEL_OPTIONS + ("plan",))
        if why is not None:
            raise ValueError(f"backend='triton' cannot run this input: {why}")
        return decode_attention_triton(q, k_cache, v_cache, spec, cache_seqlens, block_table, return_lse,
                                       cache_leftpad, **kernel_options)
    if backend == "torch":
        if return_lse:
            raise ValueError("backend='torch' (SDPA) does not return the lse; use 'triton' or 'reference'")
        return decode_attention_torch(q, k_cache, v_cache, spec, cache_seqlens, block_table, cache_leftpad)
    return decode_attention_reference(q, k_cache, v_cache, spec, cache_seqlens, block_table, return_lse, cache_leftpad)
