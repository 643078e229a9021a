"""The public entry :func:`flash_attn`: checks, mask arguments, settings, and the autograd path."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from .._host import check_bool, check_scale, check_window_size, is_int
from .autograd import _flash_fwd_op, _FlashFn
from .bwd import bwd_run_config, bwd_tma
from .config import _CURRENT, FlashConfig
from .documents import cached_document_table
from .fwd import fwd_tma
from .gluon import choose_bwd_impl, choose_fwd_impl
from .launch import _check, sink_tokens
from .sparse import build_sparse_tables, check_tables

_CHECKED = set()  # cache: (shapes, dtypes) that passed _check
_DERIVED = {}  # cache: (config, dq_mode, dkdv_split, deterministic) -> the config with those call arguments


def _call_config(config: Optional[FlashConfig], dq_mode, dkdv_split, deterministic) -> FlashConfig:
    """The config a call runs with: ``config`` or the current settings, with the call's explicit arguments."""
    if config is None:
        config = _CURRENT.get()
    elif not isinstance(config, FlashConfig):
        raise TypeError(f"config must be a kernels.FlashConfig, got {type(config).__name__}")
    if dq_mode is None and dkdv_split is None and deterministic is None:
        return config
    key = (config, dq_mode, dkdv_split, deterministic)
    try:
        got = _DERIVED.get(key)
    except TypeError:  # an unhashable argument: let the config's checks name it
        got, key = None, None
    if got is None:
        changes = {name: val for name, val in (("dq_mode", dq_mode), ("dkdv_split", dkdv_split),
                                                ("deterministic", deterministic)) if val is not None}
        got = config.replace(**changes)
        if key is not None:
            if len(_DERIVED) >= 256:
                _DERIVED.clear()
            _DERIVED[key] = got
    return got


def _window_bounds(causal: bool, window_size, nq: Optional[int] = None, nk: Optional[int] = None) -> Tuple[int, int]:
    """``(win_left, win_right)`` of :func:`flash_attn`'s ``causal`` / ``window_size`` (-1: unbounded; causal clips
    ``right`` to 0). With the call's ``nq`` / ``nk``, an edge that masks nothing there is unbounded too
    (``left >= nk - 1``, ``right >= nq - 1``, bottom-right aligned; causal with one query row is dense), like
    FlashAttention-2 but with exact thresholds: a window as wide as the sequence runs the causal or dense kernel,
    its tiles and its ``"auto"`` choices. Raises ``ValueError`` for a ``causal`` other than ``True`` / ``False`` or a
    malformed ``window_size``."""
    check_bool("causal", causal)
    left, right = check_window_size(window_size)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is not None and nk is not None and left >= nk - 1:
        left = None
    if right is not None and nq is not None and right >= nq - 1:
        right = None
    return -1 if left is None else int(left), -1 if right is None else int(right)


def _check_dilation(dilation) -> None:
    if type(dilation) is not int or dilation < 1:
        raise ValueError(f"dilation={dilation!r} must be an integer >= 1")


def _sink_bounds(sink_size, win_left: int, nk: int, block_layout=None, dilation: int = 1,
                 doc_ids=None) -> Tuple[int, int]:
    """``(win_left, sink)`` that :func:`flash_attn` runs for ``sink_size`` attention sinks: ``sink`` is the
    kernels' ``SINK`` (:func:`~kernels.flash.launch.sink_tokens`: 0 without a left window edge); sinks that reach
    every row's left edge (``sink_size >= nk - 1 - left``: no key is then masked by it) run as no left edge at all
    (the causal / dense kernel, as :func:`_window_bounds` does for a wide window). Raises ``ValueError`` as
    ``sink_tokens``."""
    sink = sink_tokens(sink_size, win_left, block_layout, dilation, doc_ids)
    if sink and sink >= nk - 1 - win_left:
        return -1, 0
    return win_left, sink


def _resolve_impl(which: str, config: Optional[FlashConfig], q, k, v, causal, window_size, dilation, block_layout,
                  doc_ids, block_size, sink_size=0) -> str:
    """``config.<which>`` (``"fwd_impl"`` / ``"bwd_impl"``) of ``config`` or the current settings, and for ``"auto"``
    the choice of :func:`kernels.flash.gluon.choose_fwd_impl` / ``choose_bwd_impl`` for these mask arguments."""
    config = _call_config(config, None, None, None)
    # checked for an explicit impl too, as flash_attn checks them
    wl, wr = _window_bounds(causal, window_size, q.shape[2], k.shape[2])
    _check_dilation(dilation)
    wl, sink = _sink_bounds(sink_size, wl, k.shape[2], block_layout, dilation, doc_ids)
    impl = getattr(config, which)
    if impl != "auto":
        return impl
    choose = choose_fwd_impl if which == "fwd_impl" else choose_bwd_impl
    return choose(config, q, k, v, wl, wr, block_layout, dilation, doc_ids, block_size, sink_size=sink)


def resolve_fwd_impl(config: Optional[FlashConfig], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False, window_size: Optional[Sequence[Optional[int]]] = None, dilation: int = 1,
                     block_layout: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                     block_size: int = 0, sink_size: int = 0) -> str:
    """The forward kernel (``"triton"``, ``"gluon_ws3a"``, ``"gluon_ws3b"`` or ``"gluon_ws3p"``) that :func:`flash_attn` runs for
    ``q, k, v`` and these mask arguments (as :func:`flash_attn` takes them) with ``config`` (``None``: the current
    settings): ``config.fwd_impl``, or for ``"auto"`` the choice of :func:`kernels.flash.gluon.choose_fwd_impl`
    (Gluon on Hopper for large band-mask fp16 / bf16 problems at ``GLUON_AUTO_HEAD_DIMS`` on a triton of
    ``GLUON_AUTO_TRITON``, else Triton). For benchmarks that record which forward ran. ``q (B, Hq, Nq, D)``,
    ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)``. Raises ``ValueError`` / ``TypeError`` only for a malformed
    ``causal``, ``window_size``, ``dilation`` (not an int >= 1, as :func:`flash_attn`; with an explicit
    ``fwd_impl`` too) or ``config`` (an explicit Gluon name is returned as is: the call checks whether it can
    run). ``sink_size``: as :func:`flash_attn` (``"auto"`` never picks Gluon for attention sinks; ``ValueError`` as
    there for a bad value or combination)."""
    return _resolve_impl("fwd_impl", config, q, k, v, causal, window_size, dilation, block_layout, doc_ids, block_size,
                         sink_size)


def resolve_bwd_impl(config: Optional[FlashConfig], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False, window_size: Optional[Sequence[Optional[int]]] = None, dilation: int = 1,
                     block_layout: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                     block_size: int = 0, sink_size: int = 0) -> str:
    """The backward kernel (``"triton"`` or ``"gluon"``) that :func:`flash_attn`'s backward runs for ``q, k, v`` and
    these mask arguments with ``config`` (``None``: the current settings): ``config.bwd_impl``, or for ``"auto"``
    the choice of :func:`kernels.flash.gluon.choose_bwd_impl` (``"triton"`` off CUDA; on Hopper it depends on the
    shape, the mask and the triton version: ``GLUON_AUTO_BWD_TRITON``). The counterpart of
    :func:`resolve_fwd_impl`, for benchmarks that record which kernels ran; arguments and errors as there."""
    return _resolve_impl("bwd_impl", config, q, k, v, causal, window_size, dilation, block_layout, doc_ids, block_size,
                         sink_size)


def resolve_fwd_tma(config: Optional[FlashConfig], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool = False, window_size: Optional[Sequence[Optional[int]]] = None, dilation: int = 1,
                    block_layout: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                    block_size: int = 0, sink_size: int = 0) -> bool:
    """Whether the forward that :func:`flash_attn` runs for ``q, k, v`` and these mask arguments with ``config``
    (``None``: the current settings) streams K / V by TMA descriptors: the Gluon forward (where
    :func:`resolve_fwd_impl` names it) reads by TMA only; the Triton forward where its launch decides so
    (:func:`kernels.flash.fwd.fwd_tma`: :func:`~kernels.flash.tma_ok` with ``config.tma``, ``"auto"`` on Hopper from
    ``config.tma_min_pairs`` :func:`~kernels.flash.visited_pairs`, the layout rules on ``k`` / ``v``). For benchmark
    rows; a TMA build the compiler rejects still falls back to pointer loads at the launch. Arguments and errors as
    :func:`resolve_fwd_impl`."""
    config = _call_config(config, None, None, None)
    impl = _resolve_impl("fwd_impl", config, q, k, v, causal, window_size, dilation, block_layout, doc_ids, block_size,
                         sink_size)
    if impl != "triton":
        return True
    wl, wr = _window_bounds(causal, window_size, q.shape[2], k.shape[2])
    wl = _sink_bounds(sink_size, wl, k.shape[2], block_layout, dilation, doc_ids)[0]
    return fwd_tma(q, k, v, wl, wr, block_layout, config)


def resolve_bwd_tma(config: Optional[FlashConfig], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool = False, window_size: Optional[Sequence[Optional[int]]] = None, dilation: int = 1,
                    block_layout: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                    block_size: int = 0, do: Optional[torch.Tensor] = None, sink_size: int = 0) -> Tuple[bool, bool]:
    """``(dkdv, dq)``: whether the backward of that :func:`flash_attn` call streams its operands by TMA in its
    dK/dV pass and in its dQ, as the backward decides (:func:`kernels.flash.bwd.bwd_run_config`, the config it runs
    with, then :func:`kernels.flash.bwd.bwd_tma`): the Gluon backward's dK/dV kernel reads by TMA only, its dQ by
    ``gluon_bwd_dq``; the Triton backward's kernels by the rule of their launches (``config.tma``, ``"auto"`` from
    ``config.tma_min_pairs`` visited pairs on Hopper; dK/dV streams Q / dO, dQ K / V; no dQ kernel with
    ``dq_mode="atomic"``). ``do``: the output's gradient (``None``: laid out as ``q``, whose layout rules it then
    meets). The counterpart of :func:`resolve_fwd_tma`; arguments and errors as :func:`resolve_bwd_impl`."""
    config = _call_config(config, None, None, None)
    wl, wr = _window_bounds(causal, window_size, q.shape[2], k.shape[2])
    _check_dilation(dilation)
    wl, sink = _sink_bounds(sink_size, wl, k.shape[2], block_layout, dilation, doc_ids)
    run = bwd_run_config(config, q, k, v, wl, wr, block_layout, dilation, doc_ids, block_size, sink_size=sink)
    return bwd_tma(run, q, k, v, q if do is None else do, wl, wr, block_layout)


@torch.compiler.assume_constant_result
def _call_config_at_trace(key: Optional[str], dq_mode, dkdv_split, deterministic) -> FlashConfig:
    """:func:`_call_config` under ``torch.compile``: run once while tracing, its result a constant of the graph (the
    config travels as its key: dynamo guards constant arguments, not arbitrary objects)."""
    return _call_config(None if key is None else FlashConfig.from_key(key), dq_mode, dkdv_split, deterministic)


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               window_size: Optional[Sequence[Optional[int]]] = None, softmax_scale: Optional[float] = None,
               block_layout: Optional[torch.Tensor] = None, block_size: int = 0,
               block_table_fn: Optional[Callable] = None, return_lse: bool = False,
               block_tables: Optional[Sequence[torch.Tensor]] = None, dq_mode: Optional[str] = None,
               dkdv_split: Optional[int] = None, deterministic: Optional[bool] = None, dilation: int = 1,
               config: Optional[FlashConfig] = None, doc_ids: Optional[torch.Tensor] = None, sink_size: int = 0):
    """Exact attention ``softmax(scale * q k^T + mask) v`` (FlashAttention-2, Dao 2023), differentiable.

    Args:
        q: ``(B, Hq, Nq, D)`` float16 / bfloat16 / float32 (any strides), ``1 <= D <= 256``.
        k, v: ``(B, Hkv, Nk, D)`` and ``(B, Hkv, Nk, Dv)`` (``1 <= Dv <= 256``; MLA has ``Dv != D``),
            ``Hq % Hkv == 0`` (GQA / MQA: query head ``h`` uses K/V head ``h // (Hq // Hkv)``).
        causal: key ``j`` visible to query row ``i`` only if ``j <= i + Nk - Nq`` (bottom-right alignment).
        window_size: ``(left, right)`` inclusive, ``None`` entries unbounded; causal clips ``right`` to 0. In
            positions: with ``dilation`` the window of ``w`` dilated keys is ``left = w * dilation``. An edge that
            masks nothing at these lengths (``left >= Nk - 1``, ``right >= Nq - 1``) runs as unbounded: the same
            mask, on the causal / dense kernel.
        softmax_scale: default ``D ** -0.5``.
        block_layout: bool ``(nb, nb)`` block-sparse layout over absolute positions at ``block_size`` tokens
            (rows with ``i + Nk - Nq < 0`` see nothing); pass it as int8 on ``q``'s device when calling in a loop
            (a CPU layout is copied to the device on every call, a copy that waits for the GPU). Needs
            ``block_table_fn(block_m, block_n)`` returning ``(kv_idx, kv_count, kv_full, visited, full)`` (e.g.
            ``MaskInfo.block_table``) for the visited tiles.
        block_tables: precomputed :func:`build_sparse_tables` output at this call's config (skips
            ``block_table_fn``). With ``config.sparse_aligned_no_gather`` (default on), a tile the table visits
            must lie in a layout block that is on (tables from ``MaskInfo.block_table`` do).
        return_lse: also return ``lse`` fp32 ``(B, Hq, Nq)`` (natural log, ``-inf`` on empty rows); it is
            differentiable.
        dq_mode, dkdv_split, deterministic: override those fields of ``config`` for this call (see
            :class:`FlashConfig`: ``"separate"`` / ``"atomic"`` dQ, GQA group split of the dK/dV pass,
            refuse non-deterministic settings).
        dilation: ``>= 1``; keys with ``(i + Nk - Nq - j) % dilation != 0`` are masked too (a dilated window:
            pass the window in positions). With ``dilation > 1`` every visited tile runs the element mask.
        config: a :class:`FlashConfig` (tiles, dQ mode, split, TMA, ...); default the current settings
            (``FlashConfig()`` or the innermost :func:`flash_settings`; under ``torch.compile`` those at trace
            time). The backward uses the forward's.
        doc_ids: packed documents, int32 / int64 ``(B, Nk)`` on q's device, nondecreasing per row (not checked
            here: :func:`attn_zoo.attention` checks them): query row ``i`` is in the document of key
            ``Nk - Nq + i`` (none when negative) and sees only keys of its document, on top of the mask above. Part
            of the mask description (:func:`kernels.flash.documents.document_table`, built once per ``doc_ids``
            tensor): each query tile visits only the key tiles of its documents, and the element rule compares
            documents only on tiles that straddle a boundary (forward, dQ and dK/dV alike). The table is kept per
            tensor and autograd version: in-place writes through ``.numpy()`` / ``.data`` are not seen (use
            PyTorch ops). int32 / int64 only (``ValueError`` otherwise).
        sink_size: attention sinks (StreamingLLM: Xiao et al. 2023, "Efficient Streaming Language Models with
            Attention Sinks"), in tokens, an int ``>= 0`` (default 0: none): keys at absolute positions ``j <
            sink_size`` stay visible left of the window's left edge (``j >= i' - left or j < sink_size``); every
            other term still holds (causal ``j <= i'``, the right edge, bounds). Without a left edge (``left``
            ``None`` or as wide as the keys) a no-op; sinks reaching every row's left edge (``sink_size >= Nk - 1 -
            left``) run as no left edge. Each query tile visits the ``cdiv(sink_size, block_n)`` sink tiles and its
            band (cost ``O(Nq * (window + sink_size))``); each key tile of sinks is visited by every query tile from
            its causal start in dK/dV. One compile per value. Triton kernels only: ``"auto"`` never picks a Gluon
            kernel for it and a Gluon ``fwd_impl`` / ``bwd_impl`` asked by name refuses it. ``ValueError`` for a
            value other than an int ``>= 0`` (a bool included) and with ``block_layout``, ``dilation != 1`` or
            ``doc_ids``.

    Returns:
        ``out (B, Hq, Nq, Dv)`` in ``q.dtype`` (rows that see no key are 0), and ``lse`` if asked.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, ``Hq % Hkv != 0``, ``D > 256``, ``Dv > 256``, ``causal`` or
        ``return_lse`` not a bool, ``window_size`` not ``None`` or a pair of ints >= 0 / ``None``,
        ``softmax_scale`` not ``None`` or a finite float > 0, ``block_size`` not an int >= 0 (>= 1 with a
        layout), a layout without ``block_table_fn``, malformed ``block_tables``, unknown ``dq_mode``,
        ``dkdv_split`` not dividing the group, ``deterministic`` with the atomic dQ or ``bwd_impl="gluon"`` with
        ``gluon_bwd_dq="atomic"`` / ``"tma"``, ``gluon_bwd_dq="tma"`` on a triton without Gluon's TMA reduce-add,
        ``dilation < 1``, ``sink_size`` (see there); ``config.bwd_impl="gluon"`` on a call it does not cover
        (:func:`kernels.flash.gluon.check_gluon_bwd`) when an input requires grad.
    """
    sig = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype)
    if sig not in _CHECKED:
        _check(q, k, v)
        _CHECKED.add(sig)
    compiling = torch.compiler.is_compiling()
    if compiling:
        if config is not None and not isinstance(config, FlashConfig):
            raise TypeError(f"config must be a kernels.FlashConfig, got {type(config).__name__}")
        cfg = _call_config_at_trace(None if config is None else config.key, dq_mode, dkdv_split, deterministic)
    else:
        cfg = _call_config(config, dq_mode, dkdv_split, deterministic)
    D = q.shape[-1]
    check_scale("softmax_scale", softmax_scale)
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    wl, wr = _window_bounds(causal, window_size, q.shape[2], k.shape[2])
    _check_dilation(dilation)
    wl, sink = _sink_bounds(sink_size, wl, k.shape[2], block_layout, dilation, doc_ids)
    check_bool("return_lse", return_lse)
    if not is_int(block_size) or block_size < 0:
        raise ValueError(f"block_size={block_size!r} is not supported; allowed values: an integer >= 1 with a "
                         "block_layout (0, the default, without one)")
    if cfg.dkdv_split is not None:
        group = q.shape[1] // k.shape[1]
        if group % cfg.dkdv_split:
            raise ValueError(f"dkdv_split={cfg.dkdv_split!r} must be an integer >= 1 dividing the GQA group size "
                             f"Hq // Hkv = {group}")
    tables = (None,) * 6
    layout = None
    if block_layout is not None:
        if block_table_fn is None and block_tables is None:
            raise ValueError("block_layout needs block_table_fn(block_m, block_n) (e.g. MaskInfo.block_table)")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 with a block_layout, got {block_size!r}")
        layout = block_layout.to(device=q.device, dtype=torch.int8).contiguous()
        if block_tables is not None:
            check_tables(block_tables, q.shape[2], k.shape[2], D, cfg)
            tables = tuple(block_tables)
        else:
            tables = build_sparse_tables(block_table_fn, D, q.device, cfg)
    documents = None
    if doc_ids is not None:
        if not isinstance(doc_ids, torch.Tensor) or doc_ids.shape != (q.shape[0], k.shape[2]):
            raise ValueError(f"doc_ids must be a (B, Nk) = ({q.shape[0]}, {k.shape[2]}) integer tensor, got "
                             f"{tuple(getattr(doc_ids, 'shape', ()))}")
        if doc_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"doc_ids must be int32 or int64 (document ids), got {doc_ids.dtype}; allowed dtypes: "
                             f"torch.int32, torch.int64")
        documents = cached_document_table(doc_ids, q.shape[2])
    if cfg.bwd_impl == "gluon" and not compiling and torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad):  # refuse before the forward, not at backward
        from .gluon import check_gluon_bwd

        check_gluon_bwd(q, k, v, wl, wr, layout, dilation, documents, cfg, int(block_size), sink_size=sink)
    if compiling:
        out, lse = _flash_fwd_op(q, k, v, scale, wl, wr, layout, int(block_size), *tables, int(dilation), cfg.key,
                                 documents, sink)
    else:
        out, lse = _FlashFn.apply(q, k, v, (scale, wl, wr, layout, int(block_size), *tables, int(dilation), cfg,
                                            documents, sink))
    return (out, lse) if return_lse else out
