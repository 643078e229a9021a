"""The anchors: what a user would run instead of our kernels, registered as backends without a priority (``auto``
never picks them; benchmarks and sweeps time them, ``attention(..., backend=<name>)`` runs them).

* ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``: ``F.scaled_dot_product_attention`` pinned
  to one SDPA kernel (FlashAttention-2, cuDNN, memory-efficient, math). Exact full / causal attention only
  (``MaskInfo.is_full`` or plain causal with ``Nq == Nk``: SDPA's ``is_causal`` is top-left aligned); windows,
  layouts and dilation are not expressible.
* ``flex``: FlexAttention (Guessous et al. 2024), compiled on CUDA (:func:`attn_zoo.flex.compiled_flex_attention`,
  eager elsewhere, forward only: inputs that require grad off CUDA are refused with the reason), with the
  ``BlockMask`` of the spec's :class:`attn_zoo.MaskInfo` element rule: every softmax kind. No zeroing of keys no
  query sees (the raw library call).
* ``naive``: standard attention in the input dtype with S and P materialised ([FA1] Algorithm 0: ``S = (scale Q)
  K^T``, masked_fill, softmax, ``P V``); for ``linear`` the masked quadratic form ``(phi(Q) phi(K)^T * M) V``.
* ``fa2`` / ``fa3``: ``flash_attn.flash_attn_func`` (FlashAttention-2, Dao 2023) / ``flash_attn_interface``
  (FlashAttention-3, Shah et al. 2024) where installed: full, causal (bottom-right) and sliding windows, fp16 /
  bf16 on CUDA.
* ``fa4``: ``flash_attn.cute.flash_attn_func`` (FlashAttention-4, CuTe DSL; ``pip install -e .[fa4]``): full, causal
  and sliding windows, GQA / MQA, fp16 / bf16 on sm90+ (Hopper, Blackwell); with ``doc_ids`` its varlen entry
  ``flash_attn_varlen_func`` (``cu_seqlens`` from the documents, :func:`packed_cu_seqlens`).

Packed documents (``doc_ids``): ``flex``, ``flex_fa4`` (document ``BlockMask``), ``fa4`` (varlen) and ``naive``
(dense mask) take them; the SDPA and FA2 / FA3 anchors do not.
* ``flex_fa4``: FlexAttention with ``kernel_options={"BACKEND": "FLASH"}`` (its FA4 kernels; needs flash-attn-4 and a
  torch with the FLASH backend) and the spec's ``BlockMask``: every softmax kind, fp16 / bf16 on sm90+.
* ``fla``: flash-linear-attention (Yang et al.; ``pip install -e .[fla]``) for causal ``linear`` with ``Nq == Nk`` on
  CUDA: ``fla.ops.based.parallel_based`` for the Taylor map (Based), else ``fla.ops.linear_attn.chunk_linear_attn``
  (feature map applied in PyTorch, ``normalize=True``; its own eps).

A missing optional package makes ``available()`` say which package to install and the pyproject extra
(:func:`install_hint`), e.g. ``backend='fa4' cannot run this input ...: not available here (flash_attn.cute.
flash_attn_func cannot be imported (ModuleNotFoundError: ...); install flash-attn-4 (FlashAttention-4, CuTe DSL):
pip install -e .[fa4])``.

Rows that see no key: ``naive`` outputs 0; the SDPA anchors never have such rows (full / causal ``Nq == Nk``).
Keys that no query may see (:func:`attn_zoo.masks.unseen_keys`): ``naive`` zeroes them (as ``torch`` / ``triton``), so a
NaN / inf there changes nothing; ``flex`` does not.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn.functional as F

from ..flex import flex_decoding_refusal
from ..masks import mask_info, meta_via_cpu, unseen_keys
from ..registry import derived_cache, family, register_backend

_HALF = (torch.float16, torch.bfloat16)


def _cuda_available() -> Optional[str]:
    return None if torch.cuda.is_available() else "no CUDA device"


# Optional packages of the anchors: module -> (what to install, the pyproject extra). Named in every refusal.
INSTALL = {
    "flash_attn": ("flash-attn (FlashAttention-2)", "fa2"),
    "flash_attn_interface": ("flash-attn's hopper/ build (FlashAttention-3)", None),
    "flash_attn.cute": ("flash-attn-4 (FlashAttention-4, CuTe DSL)", "fa4"),
    "fla": ("flash-linear-attention (fla-core)", "fla"),
}


def install_hint(module: str) -> str:
    """``"install <package>: pip install -e .[<extra>]"`` for an anchor's optional ``module`` ("" when unknown)."""
    root = next((m for m in sorted(INSTALL, key=len, reverse=True) if module == m or module.startswith(m + ".")), None)
    if root is None:
        return ""
    pkg, extra = INSTALL[root]
    return f"install {pkg}" + (f": pip install -e .[{extra}]" if extra else "")


def _importable(module: str, attr: Optional[str] = None):
    """``available()`` that imports ``module`` (and reads ``attr`` from it): the reason names the package to install
    and the pyproject extra. ``attr``: a namespace package (``flash_attn`` of the FA4 wheel alone) imports but lacks
    the function."""

    def available() -> Optional[str]:
        what = f"{module}.{attr}" if attr else module
        try:
            mod = importlib.import_module(module)
            if attr is not None:
                getattr(mod, attr)
        except Exception as e:  # noqa: BLE001 - ImportError, or a package broken against this torch / triton
            hint = install_hint(module)
            return (f"{what} cannot be imported ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                    + (f"; {hint}" if hint else ""))
        return None

    return available


def _all(*checks):
    def available() -> Optional[str]:
        for c in checks:
            why = c()
            if why is not None:
                return why
        return None

    return available


# --------------------------------------------------------------------------------------------- SDPA
_SDPA = {  # name -> (SDPBackend member, dtypes or None = any, needs CUDA)
    "sdpa_flash": ("FLASH_ATTENTION", _HALF, True),
    "sdpa_cudnn": ("CUDNN_ATTENTION", _HALF, True),
    "sdpa_efficient": ("EFFICIENT_ATTENTION", None, True),
    "sdpa_math": ("MATH", None, False),
}


def _exact_reason(q, k, spec) -> Optional[str]:
    """``None`` when the spec's mask is full attention or plain causal with ``Nq == Nk`` (SDPA's flags)."""
    mi = mask_info(spec, q.shape[2], k.shape[2])
    if mi.is_full:
        return None
    if not mi.is_plain_causal:
        return f"SDPA runs exact full / causal attention only, not kind={spec.kind!r} (a window, layout or dilation)"
    if q.shape[2] != k.shape[2]:
        return "SDPA's is_causal is top-left aligned: causal needs Nq == Nk"
    return None


def _sdpa_anchor(name: str):
    member, dtypes, needs_cuda = _SDPA[name]

    def supports(q, k, v, spec, return_lse):
        if return_lse:
            return "SDPA does not return the lse"
        if needs_cuda and not q.is_cuda:
            return f"the SDPA {member} kernel needs CUDA tensors"
        if dtypes is not None and q.dtype not in dtypes:
            return f"dtype {q.dtype} is not supported (float16, bfloat16)"
        if q.dtype == torch.float64 and q.is_cuda:
            return "float64 is not supported on CUDA"
        return _exact_reason(q, k, spec)

    def fn(q, k, v, spec, return_lse=False):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        causal = mask_info(spec, q.shape[2], k.shape[2]).causal
        scale = spec.scale(q.shape[-1])
        with sdpa_kernel([getattr(SDPBackend, member)]):
            if q.shape[1] != k.shape[1]:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    fn.__name__ = fn.__qualname__ = f"{name}_attention"
    available = _cuda_available if needs_cuda else None
    register_backend(family("softmax"), name, supports=supports, priority=None, available=available, fn=fn)


for _name in _SDPA:
    _sdpa_anchor(_name)


# --------------------------------------------------------------------------------------------- FlexAttention
def _flex_available() -> Optional[str]:
    return _importable("torch.nn.attention.flex_attention")()


def _flex_grad_reason(q, k, v, spec) -> Optional[str]:
    """FlexAttention runs eagerly off CUDA, forward only (torch raises NotImplementedError at the backward). The
    message names the backends that take these inputs instead (asked of the registry: under the Triton
    interpreter ``triton`` is one)."""
    if q.device.type != "cuda" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        from ..registry import get_backends

        others = [n for n, b in get_backends(spec.kind).items()
                  if not n.startswith("flex") and b.why_not(q, k, v, spec) is None]
        return (f"FlexAttention has no backward off CUDA (got {q.device.type} inputs that require grad); run it "
                f"under torch.no_grad(), or for gradients on the {q.device.type.upper()} pick another backend; "
                f"allowed values: {', '.join(others)}")
    return None


def _flex_supports(q, k, v, spec, return_lse):
    if q.dtype == torch.float64 and q.is_cuda:
        return "float64 is not supported on CUDA"
    why = flex_decoding_refusal(q)
    if why is not None:
        return why
    return _flex_grad_reason(q, k, v, spec)


@register_backend(family("softmax"), "flex", supports=_flex_supports, priority=None, available=_flex_available,
                  documents=True)
def flex_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """Compiled FlexAttention (eager off CUDA) with the spec's ``BlockMask`` (with ``doc_ids``: the document
    ``BlockMask`` of :func:`attn_zoo.flex.flex_document_block_mask`)."""
    from ..flex import compiled_flex_attention, flex_block_mask, flex_document_block_mask

    why = _flex_grad_reason(q, k, v, spec)  # also here: attention()'s dispatch cache does not key on requires_grad
    if why is not None:
        raise ValueError(f"backend='flex' cannot run this input for kind={spec.kind!r}: {why}")
    if doc_ids is not None:
        bm = flex_document_block_mask(spec, doc_ids, q.shape[2], k.shape[2])
    else:
        bm = flex_block_mask(spec, q.shape[2], k.shape[2], str(q.device))
    fa = compiled_flex_attention(q.device.type)
    kw = {"return_lse": True} if return_lse else {}
    return fa(q, k, v, block_mask=bm, scale=spec.scale(q.shape[-1]), enable_gqa=q.shape[1] != k.shape[1], **kw)


# --------------------------------------------------------------------------------------------- naive
@derived_cache(32)
@meta_via_cpu
def _naive_mask(spec, Nq: int, Nk: int, device: str):
    """``(allowed, empty)`` of the spec's mask on ``device``: bool ``(Nq, Nk)`` or ``None`` (full), and bool
    ``(Nq, 1)``, True at the rows that see no key, or ``None`` when every row sees one."""
    mi = mask_info(spec, Nq, Nk)
    if mi.is_full:
        return None, None
    allowed = mi.dense(device)
    empty = ~allowed.any(-1, keepdim=True)
    return allowed, (empty if bool(empty.any()) else None)


def _naive_supports(q, k, v, spec, return_lse):
    return "naive returns no lse" if return_lse else None


@register_backend(family("softmax"), "naive", supports=_naive_supports, priority=None, documents=True)
@register_backend("linear", "naive", supports=_naive_supports, priority=None)
def naive_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """Standard attention in the input dtype (S and P materialised); linear: the masked quadratic form, in fp32
    (output in the input dtype). Softmax kinds take ``doc_ids`` (the dense document-masked rule).

    Shapes: ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)`` -> ``(B, Hq, Nq, Dv)``.
    Non-finite inputs (docs/design.md): a NaN / inf in query row ``i`` makes output row ``i`` NaN, one in key /
    value ``j`` every row that sees ``j``; in the gradients (and, for a bad value, in the outputs) it can also
    reach rows / keys that do not see it (a masked weight of 0 times the bad row; ``reference`` is the exact one).
    Rows that see no key output exactly 0, their queries get gradient 0 and add nothing to the others, whatever
    their query and the keys hold.
    """
    Nq, Nk = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(rep, 1) if rep > 1 else k
    vv = v.repeat_interleave(rep, 1) if rep > 1 else v
    if spec.is_softmax:
        if doc_ids is not None:
            from ..documents import document_allowed

            allowed = document_allowed(spec, Nq, Nk, doc_ids).unsqueeze(1)  # (B, 1, Nq, Nk)
            empty = ~allowed.any(-1, keepdim=True)  # (B, 1, Nq, 1); no host sync to ask whether any is True
        else:
            allowed, empty = _naive_mask(spec, Nq, Nk, str(q.device))  # (Nq, Nk), (Nq, 1) or None
            unseen = unseen_keys(spec, Nq, Nk, str(q.device))
            if unseen is not None:  # keys no row may see contribute nothing, not even 0 * NaN (docs/design.md)
                kk, vv = kk.masked_fill(unseen, 0.0), vv.masked_fill(unseen, 0.0)
        if empty is not None:  # rows that see no key: query 0 (its gradient exactly 0, no 0 * NaN key reaches it)
            q = q.masked_fill(empty, 0.0)
        s = (q * spec.scale(q.shape[-1])) @ kk.transpose(-1, -2)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        if empty is None:
            return torch.softmax(s, dim=-1) @ vv
        # only the empty rows are zeroed (a NaN elsewhere stays NaN): their scores are set to 0 so the softmax
        # stays finite there (no NaN in its backward), their weights and outputs to 0 (not 0 * a NaN value)
        p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        return (p @ vv).masked_fill(empty, 0.0)
    from ..feature_maps import apply_feature_map

    # in fp32 (as the kernels accumulate): a row whose features are all 0 has gradients of size |v| / eps (1e6),
    # past fp16's range, and in half precision they came back NaN
    qf, kf = q.float(), kk.float()
    fq = apply_feature_map(qf, spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(kf, spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    a = fq @ fk.transpose(-1, -2)
    if spec.causal:
        i = torch.arange(Nq, device=q.device).view(-1, 1) + (Nk - Nq)
        j = torch.arange(Nk, device=q.device).view(1, -1)
        a = a.masked_fill(j > i, 0.0)
    return ((a @ vv.float()) / (a.sum(-1, keepdim=True) + spec.eps)).to(q.dtype)


# --------------------------------------------------------------------------------------------- FlashAttention 2 / 3
_FA = {"fa2": "flash_attn", "fa3": "flash_attn_interface"}


def _fa_anchor(name: str):
    module = _FA[name]

    def supports(q, k, v, spec, return_lse):
        if return_lse:
            return f"{name} is registered without the lse"
        if not q.is_cuda:
            return "needs CUDA tensors"
        if q.dtype not in _HALF:
            return f"dtype {q.dtype} is not supported (float16, bfloat16)"
        if q.shape[-1] > 256 or v.shape[-1] != q.shape[-1]:
            return f"head dims D={q.shape[-1]}, Dv={v.shape[-1]}: needs D <= 256 and Dv == D"
        mi = mask_info(spec, q.shape[2], k.shape[2])
        if mi.layout is not None or mi.dilation != 1 or mi.sink_size:
            return (f"kind={spec.kind!r}: a block layout / dilation / attention sinks are not expressible in "
                    f"{name}'s window_size")
        return None

    def fn(q, k, v, spec, return_lse=False):
        mod = importlib.import_module(module)
        mi = mask_info(spec, q.shape[2], k.shape[2])
        window = (-1 if mi.window_left is None else mi.window_left, -1 if mi.window_right is None else mi.window_right)
        out = mod.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  softmax_scale=spec.scale(q.shape[-1]), causal=mi.causal, window_size=window)
        out = out[0] if isinstance(out, tuple) else out  # some versions return (out, lse)
        return out.transpose(1, 2)

    fn.__name__ = fn.__qualname__ = f"{name}_attention"
    register_backend(family("softmax"), name, supports=supports, priority=None,
                     available=_all(_importable(module, "flash_attn_func"), _cuda_available), fn=fn)


for _name in _FA:
    _fa_anchor(_name)


# --------------------------------------------------------------------------------------------- FlashAttention 4
_FA4_MODULE = "flash_attn.cute"


def _min_sm90() -> Optional[str]:
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"FA4 (flash_attn.cute) runs on Hopper / Blackwell (sm90+); this GPU is sm{major}{minor}"
    return None


def _fa4_input_reason(name: str, q, v, return_lse, cuda_why: str) -> Optional[str]:
    """What FA4's kernels (``fa4``, ``flex_fa4``) cannot take: the lse, CPU tensors, fp32, head dims; ``None`` = ok."""
    if return_lse:
        return f"{name} is registered without the lse"
    if not q.is_cuda:
        return cuda_why
    if q.dtype not in _HALF:
        return f"dtype {q.dtype} is not supported (float16, bfloat16)"
    D, Dv = q.shape[-1], v.shape[-1]
    if not (8 <= D <= 256 and D % 8 == 0 and Dv == D):
        return f"head dims D={D}, Dv={Dv}: FA4 needs 8 <= D <= 256, D % 8 == 0 and Dv == D"
    return None


def _fa4_supports(q, k, v, spec, return_lse):
    why = _fa4_input_reason("fa4", q, v, return_lse, "needs CUDA tensors")
    if why is not None:
        return why
    mi = mask_info(spec, q.shape[2], k.shape[2])
    if mi.layout is not None or mi.dilation != 1 or mi.sink_size:
        return (f"kind={spec.kind!r}: a block layout / dilation / attention sinks are not expressible in FA4's "
                f"window_size (use flex_fa4)")
    return _min_sm90()


def packed_cu_seqlens(doc_ids: torch.Tensor, Nq: int):
    """The padded document form flattened to FlashAttention's varlen form: ``(cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k)`` (int32 on doc_ids' device, ints) of the ``B * Nk`` keys cut at every row start and
    every document start, the queries (at key positions ``Nk - Nq + i``, ``Nq <= Nk``) counted per segment (0 for a
    segment left of the first query). Bottom-right alignment inside each segment equals the padded form's: only the
    first segment a row's queries touch is cut on the left, and its queries are its last keys. One host sync."""
    d = doc_ids.long()
    B, Nk = d.shape
    start = torch.ones_like(d, dtype=torch.bool)
    start[:, 1:] = d[:, 1:] != d[:, :-1]
    seg = start.flatten().cumsum(0).view(B, Nk) - 1  # (B, Nk) segment of each key in the flattened batch
    n = int(seg[-1, -1]) + 1
    counts_k = torch.bincount(seg.flatten(), minlength=n)
    counts_q = torch.bincount(seg[:, Nk - Nq:].flatten(), minlength=n)
    zero = counts_k.new_zeros(1)
    cu_k = torch.cat([zero, counts_k.cumsum(0)]).to(torch.int32)
    cu_q = torch.cat([zero, counts_q.cumsum(0)]).to(torch.int32)
    mx = torch.stack([counts_q.max(), counts_k.max()]).tolist()
    return cu_q, cu_k, int(mx[0]), int(mx[1])


def _fa4_varlen(q, k, v, spec, doc_ids):
    """FA4's varlen entry (``flash_attn.cute.flash_attn_varlen_func`` with ``cu_seqlens``) on the padded document
    form: ``(B, H, N, D)`` flattened to ``(B * N, H, D)`` (one copy each; FA4 takes the packed layout only)."""
    from flash_attn.cute import flash_attn_varlen_func

    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    mi = mask_info(spec, Nq, Nk)
    cu_q, cu_k, mq, mk = packed_cu_seqlens(doc_ids, Nq)
    qf = q.transpose(1, 2).reshape(B * Nq, Hq, D)
    kf = k.transpose(1, 2).reshape(B * Nk, k.shape[1], D)
    vf = v.transpose(1, 2).reshape(B * Nk, v.shape[1], v.shape[3])
    out = flash_attn_varlen_func(qf, kf, vf, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk,
                                 softmax_scale=spec.scale(D), causal=mi.causal,
                                 window_size=(mi.window_left, mi.window_right))
    out = out[0] if isinstance(out, tuple) else out
    return out.view(B, Nq, Hq, -1).transpose(1, 2)


@register_backend(family("softmax"), "fa4", supports=_fa4_supports, priority=None,
                  available=_all(_importable(_FA4_MODULE, "flash_attn_func"), _cuda_available), documents=True)
def fa4_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """``flash_attn.cute.flash_attn_func`` (FlashAttention-4, Zadouri et al. 2026; CuTe DSL) in its ``(B, N, H, D)``
    layout: full, causal (bottom-right) and sliding windows (``window_size=(left, right)``, ``None`` = unbounded),
    GQA / MQA through the K / V head count. fp16 / bf16, sm90+. ``doc_ids``: FA4's varlen entry
    (``flash_attn_varlen_func``, ``cu_seqlens`` cut at every row and document start: :func:`packed_cu_seqlens`);
    needs ``Nq <= Nk``."""
    if doc_ids is not None:
        if q.shape[2] > k.shape[2]:
            raise ValueError(f"backend='fa4' with doc_ids needs Nq <= Nk (rows before the first key are in no "
                             f"document), got Nq={q.shape[2]}, Nk={k.shape[2]}; use backend='flex_fa4' or 'triton'")
        return _fa4_varlen(q, k, v, spec, doc_ids)
    from flash_attn.cute import flash_attn_func

    mi = mask_info(spec, q.shape[2], k.shape[2])
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          softmax_scale=spec.scale(q.shape[-1]), causal=mi.causal,
                          window_size=(mi.window_left, mi.window_right))
    out = out[0] if isinstance(out, tuple) else out  # (out, lse)
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------- Flex + FA4
def _flex_fa4_supports(q, k, v, spec, return_lse):
    why = _fa4_input_reason("flex_fa4", q, v, return_lse,
                            "needs CUDA tensors (FlexAttention's FLASH backend is compiled for the GPU)")
    return why if why is not None else _min_sm90()


def _flex_backend_option() -> Optional[str]:
    import typing

    from torch.nn.attention import flex_attention as fa

    options = typing.get_args(getattr(fa, "_Backend", None)) or ()
    if "FLASH" not in options:
        return (f"this torch ({torch.__version__}) has no FlexAttention kernel_options BACKEND='FLASH' (torch >= 2.9 "
                f"has it)")
    return None


@register_backend(family("softmax"), "flex_fa4", supports=_flex_fa4_supports, priority=None,
                  available=_all(_flex_available, _flex_backend_option, _importable(_FA4_MODULE, "flash_attn_func"),
                                 _cuda_available), documents=True)
def flex_fa4_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """Compiled FlexAttention with ``kernel_options={"BACKEND": "FLASH"}`` (its FA4 CuTe DSL kernels) and the spec's
    ``BlockMask`` (:func:`attn_zoo.flex.flex_block_mask`): every softmax kind, fp16 / bf16, sm90+. ``doc_ids``: the
    document ``BlockMask`` (its ``mask_mod`` compares document ids: :func:`attn_zoo.flex.flex_document_block_mask`)."""
    from ..flex import compiled_flex_attention, flex_block_mask, flex_document_block_mask

    if doc_ids is not None:
        bm = flex_document_block_mask(spec, doc_ids, q.shape[2], k.shape[2])
    else:
        bm = flex_block_mask(spec, q.shape[2], k.shape[2], str(q.device))
    fa = compiled_flex_attention(q.device.type, kernel_backend="FLASH")
    return fa(q, k, v, block_mask=bm, scale=spec.scale(q.shape[-1]), enable_gqa=q.shape[1] != k.shape[1],
              kernel_options={"BACKEND": "FLASH"})


# --------------------------------------------------------------------------------------------- fla
def _fla_supports(q, k, v, spec, return_lse):
    if return_lse:
        return "fla returns no lse"
    if not q.is_cuda:
        return "needs CUDA tensors"
    if not spec.causal or q.shape[2] != k.shape[2]:
        return "fla's chunk_linear_attn / parallel_based are causal with Nq == Nk"
    if q.dtype == torch.float64:
        return "float64 is not supported"
    if spec.feature_map == "taylor" and q.shape[-1] > 128:
        return f"fla's parallel_based (the Taylor map) takes head dims up to 128, got D={q.shape[-1]}"
    return None


@register_backend("linear", "fla", supports=_fla_supports, priority=None,
                  available=_all(_importable("fla.ops.linear_attn", "chunk_linear_attn"), _cuda_available),
                  documents=True)
def fla_linear_attention(q, k, v, spec, return_lse=False, doc_ids=None):
    """flash-linear-attention (Yang et al.) in its ``(B, N, H, D)`` layout, K/V heads repeated for GQA:

    * ``feature_map="taylor"``: ``fla.ops.based.parallel_based(q, k, v)`` (Based, Arora et al. 2024: weights
      ``1 + s + s^2 / 2`` with ``s = q.k / sqrt(D)`` in the quadratic form, normaliser ``+ 1e-6``) -- the same function
      as our ``parallel`` backend;
    * any other map: ``fla.ops.linear_attn.chunk_linear_attn(phi(q), phi(k), v, scale=1, normalize=True)`` (the
      feature map applied in PyTorch; fla's own eps).

    ``doc_ids (B, N)`` (non-Taylor maps): the batch is flattened to one row and passed as fla's ``cu_seqlens``
    (each row start and document start a boundary); the Taylor map with ``doc_ids`` raises ``ValueError``.
    """
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if spec.feature_map == "taylor" and doc_ids is not None:
        raise ValueError("backend='fla' with feature_map='taylor' (parallel_based) does not take doc_ids; backends "
                         "that do: parallel, torch, reference")
    if spec.feature_map == "taylor":
        from fla.ops.based import parallel_based

        out = parallel_based(*(t.transpose(1, 2) for t in (q, k, v)), scale=q.shape[-1] ** -0.5, use_norm=True)
        return out.transpose(1, 2).to(q.dtype)
    from fla.ops.linear_attn import chunk_linear_attn

    from ..feature_maps import apply_feature_map

    fq = apply_feature_map(q, spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(k, spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    if doc_ids is not None:
        from ..families.deltanet import _flatten_docs

        B, H, N = q.shape[:3]
        cu = _flatten_docs(doc_ids)[0]
        flat = [t.transpose(1, 2).reshape(1, B * N, H, t.shape[-1]).contiguous() for t in (fq, fk, v)]
        out = chunk_linear_attn(*flat, scale=1.0, normalize=True, cu_seqlens=cu)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(B, N, H, -1).transpose(1, 2).to(q.dtype)
    out = chunk_linear_attn(*(t.transpose(1, 2).contiguous() for t in (fq, fk, v)), scale=1.0, normalize=True)
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2).to(q.dtype)
