"""Variant registry: every attention variant (a spec ``kind``) is a plugin that registers itself.

A variant is one folder, ``attn_zoo/variants/<kind>/__init__.py``, that calls :func:`register_variant` with

* ``family``: ``"softmax"`` (exact softmax over a mask: the mask is a :class:`attn_zoo.masks.MaskInfo`, so the
  generic ``reference`` / ``torch`` (SDPA, FlexAttention) / ``triton`` backends and the anchors run it) or
  ``"linear"`` (kernelized attention);
* its spec fields: ``fields`` names the :class:`~attn_zoo.spec.AttentionSpec` fields it reads (a field it does not
  read, e.g. ``window_size``, is refused), and ``spec_class`` a frozen subclass of ``AttentionSpec`` when it adds
  fields of its own (``AttentionSpec(kind=<kind>, ...)`` and :func:`attn_zoo.make_spec` build that subclass);
* ``validate(spec)``: raises ``ValueError`` naming the field and the allowed values;
* ``mask(spec, Nq, Nk) -> dict``: the :class:`~attn_zoo.masks.MaskInfo` terms of the variant (``window_left``,
  ``window_right``, ``layout``, ``block_size``, ``dilation``); :func:`attn_zoo.masks.mask_info` adds ``Nq``,
  ``Nk``, ``causal`` and the causal clip. Softmax family only;
* cost entries: ``element_fraction(spec, N)`` (kept (query, key) pairs over ``N^2``; default: counted from the
  mask) and ``subquadratic`` (about constant time per token at fixed tokens: the crossover analysis fits
  ``c_lin`` for it);
* decode: ``cache_policy(spec) -> CachePolicy``: what a layer keeps while decoding (``"full"``: every token;
  ``"window"``: the last ``window`` tokens suffice; ``"state"``: a fixed-size recurrent state; ``"latent"``: a
  compressed per-token latent). Default: a softmax mask whose terms are a causal window bounded on the left keeps
  the last ``window_left + 1`` tokens, any other softmax mask keeps every token (a block layout or a rule in
  absolute positions needs them), the linear family a state. The decode mask is the prefill rule itself
  (``mask(spec, Nq, Nk)`` is bottom-right aligned, so a decoding step sees the last rows of the full forward);
  every decode backend, the Triton kernel included, reads it through :func:`attn_zoo.masks.mask_info`. A mask
  with a block layout may add ``decode_mask(spec, Nq, capacity) -> dict | None``: terms of one layout, over the
  capacity's blocks, that serve every cache length up to ``capacity`` (a causal, prefix-consistent layout), so
  the decode kernel builds its tile tables once instead of once per step and sequence;
* ``cache_bytes(spec, n_kv_heads, head_dim, context, dtype_bytes, state_bytes) -> int``: bytes one sequence of
  one layer keeps at ``context`` tokens (default from the policy: ``2 * Hkv * D * dtype_bytes`` per kept token;
  a ``"state"`` or ``"latent"`` policy must give its own);
* ``cost(spec, B, H, N, D, mode, dtype_bytes, block_m, block_n, n_kv_heads) -> attn_zoo.cost_model.Cost``
  (keywords after ``D``; ``n_kv_heads``: the K/V heads of GQA / MQA, ``H`` for MHA; an entry without that keyword
  is refused for ``n_kv_heads < H``. Default: the exact kernel's cost over the mask's visited tiles for softmax
  kinds, the chunked linear cost for linear ones, with K/V terms per K/V head);
* ``documents``: whether it takes packed documents (``doc_ids`` / ``cu_seqlens``, default ``True``): ``False``
  for a rule with no per-document form (attention sinks: the first tokens of the row), which :func:`attn_zoo.attention`
  then refuses with documents, naming the kind;
* optionally its own backends (``attn_zoo.register_backend(<kind>, name, ...)`` in the same folder: a torch form
  or a Triton adapter that the family's generic ones do not cover; a kind-specific backend overrides the
  family's of the same name).

The built-in folders (``flash``, ``sliding_window``, ``sparse``, ``linear``, then every other folder in
alphabetical order) are imported on first use; a variant outside this package registers by being imported
(:func:`attn_zoo.load_plugins`). Lookups: :func:`get_variant`, :func:`variant_kinds`, :func:`element_fraction`,
:func:`is_subquadratic`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..registry import derived_cache, forget_derived

FAMILIES = ("softmax", "linear")
CACHE_POLICIES = ("full", "window", "state", "latent")


@dataclass(frozen=True)
class CachePolicy:
    """What one layer of a variant keeps while decoding (:meth:`Variant.cache_policy`).

    kind: ``"full"`` (every token's K / V), ``"window"`` (only the last ``window`` tokens are ever read: a rolling
        buffer, plus the first ``sink`` tokens), ``"state"`` (a fixed-size recurrent state, e.g. linear attention's
        ``S, z``) or ``"latent"`` (a compressed per-token latent, e.g. MLA).
    window: tokens kept by a ``"window"`` policy (``>= 1``), else ``None``.
    sink: the first tokens a ``"window"`` policy keeps as well (attention sinks, Xiao et al. 2023: StreamingLLM
        keeps 4), ``>= 0``; 0 for the other kinds.
    """

    kind: str = "full"
    window: Optional[int] = None
    sink: int = 0

    def __post_init__(self):
        if self.kind not in CACHE_POLICIES:
            raise ValueError(f"CachePolicy kind={self.kind!r} is not supported; allowed values: "
                             f"{', '.join(CACHE_POLICIES)}")
        if (self.kind == "window") != (self.window is not None):
            raise ValueError(f"CachePolicy window= is set for kind='window' only (>= 1), got kind={self.kind!r}, "
                             f"window={self.window!r}")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"CachePolicy window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.sink, int) or isinstance(self.sink, bool) or self.sink < 0:
            raise ValueError(f"CachePolicy sink must be an integer >= 0, got {self.sink!r}")
        if self.sink and self.kind != "window":
            raise ValueError(f"CachePolicy sink= is set for kind='window' only, got kind={self.kind!r}, "
                             f"sink={self.sink!r}")

    def kept_tokens(self, context: int) -> Optional[int]:
        """Tokens kept at ``context`` (``None`` for a ``"state"``: no per-token storage)."""
        if self.kind == "state":
            return None
        if self.kind == "window":
            return min(int(context), self.window + self.sink)
        return int(context)

    @property
    def full_kv(self) -> bool:
        """Whether every token's K / V is kept (a ``"full"`` policy): its size follows the K/V head count."""
        return self.kind == "full"

    def new_cache(self, spec, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int, dtype, device,
                  page_size: Optional[int] = None, shuffle_pages: bool = False):
        """An empty decode cache of one attention layer for ``batch_size`` sequences of up to ``capacity`` tokens:
        ``"full"`` -> a :class:`attn_zoo.decode.KVCache` of ``capacity`` tokens (``(B, Hkv, capacity, D)`` of
        ``dtype``, paged when ``page_size`` is set, pages shuffled when ``shuffle_pages``); ``"window"`` of ``W``
        tokens -> a ``KVCache`` keeping the first ``sink`` and the last ``min(W, capacity)`` tokens (``min(capacity,
        2 W + sink)`` slots, compacted when full); ``"state"`` -> a :class:`attn_zoo.decode.LinearState` for
        ``spec`` (fp32, its size independent of ``capacity``). Raises ``ValueError`` for ``"latent"``: the
        attention layer holds full / window / state caches only, a latent cache belongs to a mixer of its own
        (:func:`attn_zoo.register_mixer`)."""
        return _NEW_CACHE[self.kind](self, spec, batch_size, n_kv_heads, head_dim, capacity, dtype, device,
                                     page_size, shuffle_pages)


def _full_cache(policy, spec, batch_size, n_kv_heads, head_dim, capacity, dtype, device, page_size, shuffle_pages):
    from ..decode import KVCache

    return KVCache(batch_size, n_kv_heads, head_dim, capacity, dtype=dtype, device=device, page_size=page_size,
                   shuffle_pages=shuffle_pages)


def _window_cache(policy, spec, batch_size, n_kv_heads, head_dim, capacity, dtype, device, page_size, shuffle_pages):
    from ..decode import KVCache

    sink = policy.sink
    if sink >= capacity:  # the sinks fill the capacity: nothing is ever dropped
        return KVCache(batch_size, n_kv_heads, head_dim, capacity, dtype=dtype, device=device)
    keep = min(policy.window, capacity - sink)
    return KVCache(batch_size, n_kv_heads, head_dim, min(capacity, 2 * keep + sink), dtype=dtype, device=device,
                   keep_last=keep, keep_first=sink or None)


def _state_cache(policy, spec, batch_size, n_kv_heads, head_dim, capacity, dtype, device, page_size, shuffle_pages):
    from ..decode import LinearState

    return LinearState.for_spec(spec, batch_size, n_kv_heads, head_dim, device)


def _latent_cache(policy, spec, *args):
    raise ValueError(f"kind={spec.kind!r} keeps a latent cache: the attention layer holds full / window / "
                     f"state caches only; build it as a mixer with its own cache (attn_zoo.register_mixer)")


_NEW_CACHE = {"full": _full_cache, "window": _window_cache, "state": _state_cache, "latent": _latent_cache}
BUILTIN = ("flash", "sliding_window", "sparse", "linear")  # imported first, in this order (error messages list them)


@dataclass(frozen=True)
class Variant:
    """One registered attention variant (see the module docstring)."""

    kind: str
    family: str
    spec_class: type
    fields: Tuple[str, ...] = ()
    validate: Optional[Callable] = None
    mask: Optional[Callable] = None
    element_fraction: Optional[Callable] = None
    subquadratic: bool = False
    doc: str = ""
    decode_mask: Optional[Callable] = None
    cache_policy_fn: Optional[Callable] = None
    cache_bytes_fn: Optional[Callable] = None
    cost_fn: Optional[Callable] = None
    documents: bool = True

    def cache_policy(self, spec) -> CachePolicy:
        """The :class:`CachePolicy` of ``spec`` (the variant's own rule, else the default of the module docstring)."""
        if self.cache_policy_fn is not None:
            pol = self.cache_policy_fn(spec)
            if not isinstance(pol, CachePolicy):
                raise TypeError(f"cache_policy of variant {self.kind!r} must return a CachePolicy, got {pol!r}")
            if pol.kind == "window" and self.family == "softmax":
                why = _window_policy_mismatch(spec, pol.window, pol.sink)
                if why is not None:
                    kept = f"the first {pol.sink} and " if pol.sink else ""
                    raise ValueError(f"cache_policy of variant {self.kind!r} gives {pol!r} for {spec!r}, but its mask "
                                     f"{why}: a rolling cache of {kept}the last {pol.window} tokens would decode "
                                     f"wrong; return CachePolicy('full') (or a larger window)")
            return pol
        if self.family != "softmax":
            return CachePolicy("state")
        from ..masks import mask_info

        mi = mask_info(spec, 1, 1)  # the terms do not depend on the length for a window rule
        if spec.causal and mi.window_left is not None and mi.layout is None:
            return CachePolicy("window", mi.window_left + 1, sink=mi.sink_size)
        return CachePolicy("full")

    def cache_bytes(self, spec, n_kv_heads: int, head_dim: int, context: int, dtype_bytes: int = 2,
                    state_bytes: int = 4) -> int:
        """Bytes one layer keeps for one sequence at ``context`` tokens (K and V of every kept token unless the
        variant counts its own state). Raises ``ValueError`` for a state / latent policy without ``cache_bytes``."""
        if self.cache_bytes_fn is not None:
            return int(self.cache_bytes_fn(spec, n_kv_heads, head_dim, context, dtype_bytes, state_bytes))
        pol = self.cache_policy(spec)
        if pol.kind in ("state", "latent"):
            raise ValueError(f"variant {self.kind!r} has a {pol.kind!r} cache policy but no cache_bytes(...) entry")
        return 2 * n_kv_heads * head_dim * dtype_bytes * pol.kept_tokens(context)


def _window_offsets(spec, L: int, sink: int = 0) -> frozenset:
    """Distances ``i' - j`` of the keys ``j >= sink`` the last of ``L`` tokens sees under ``spec``'s mask."""
    import torch

    from ..masks import mask_info

    mi = mask_info(spec, 1, L, cached=False)  # ~200 lengths: not through (and not evicting) the masks' cache
    row = mi.allowed(torch.zeros(1, 1, dtype=torch.long), torch.arange(L).view(1, -1))[0]
    row[:sink] = False
    return frozenset((L - 1 - row.nonzero().view(-1)).tolist())


@derived_cache(64)
def _window_policy_mismatch(spec, window: int, sink: int = 0) -> Optional[str]:
    """``None`` when a rolling cache of the first ``sink`` and the last ``window`` tokens decodes ``spec`` exactly
    (checked on the decode row at many lengths: causal, no key past the sinks ``window`` or more tokens back, the
    same distances at every length for those keys, so their rule is translation invariant: a rolling cache
    re-bases their positions while the sinks keep theirs), else why not."""
    if not spec.causal:
        return "is not causal"
    lengths = set(range(1, min(window, 64) + 1)) | set(range(window, window + 130)) | {2 * window, 2 * window + 1,
                                                                                         3 * window + 7}
    lengths |= {sink + d for d in range(-1, 3) if sink + d >= 1} | {sink + window + d for d in range(-1, 3)}
    from ..masks import mask_info

    bs = mask_info(spec, 1, window, cached=False).block_size
    if bs > 1:  # a layout on absolute blocks: the last token at the start of a block, and a window across its edge
        lengths |= {k * bs + r for k in (1, 2, 3) for r in range(min(bs, window + 2, 130))}
    lengths = sorted(lengths)
    seen = {L: _window_offsets(spec, L, sink) for L in lengths}
    ref = seen[lengths[-1]]
    for L, got in seen.items():
        far = [d for d in got if d >= window]
        if far:
            return f"lets the last of {L} tokens see a key {max(far)} tokens back"
    for L, got in seen.items():
        if got != frozenset(d for d in ref if d < L - sink):
            return (f"depends on absolute positions (the last of {L} tokens sees other distances than the last of "
                    f"{lengths[-1]})")
    return None


_VARIANTS: Dict[str, Variant] = {}
_LOADED = False


def _load_builtin() -> None:
    """Import the variant folders of this package once (built-ins first, then the others alphabetically)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True  # set first: a folder that looks a variant up while importing sees the partial registry
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.ispkg]
    for name in list(BUILTIN) + sorted(n for n in names if n not in BUILTIN):
        importlib.import_module(f"{__name__}.{name}")


def register_variant(kind: str, family: str, *, spec_class: Optional[type] = None, fields=(), validate=None,
                     mask=None, element_fraction=None, subquadratic: bool = False, doc: str = "",
                     decode_mask=None, cache_policy=None, cache_bytes=None, cost=None,
                     documents: bool = True) -> Variant:
    """Register (or replace) the variant ``kind``; returns its :class:`Variant`. (Re)registering clears every
    cache derived from registrations (:func:`attn_zoo.registry.forget_derived`).

    Raises:
        ValueError: an empty / non-identifier ``kind``, an unknown ``family``, a softmax variant without ``mask``.
        TypeError: ``spec_class`` that is not a subclass of :class:`attn_zoo.AttentionSpec`.
    """
    from ..spec import AttentionSpec

    _load_builtin()  # the built-ins first (a no-op while they load)
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"variant kind={kind!r} must be a non-empty identifier string")
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not supported; allowed values: {', '.join(FAMILIES)}")
    if family == "softmax" and mask is None:
        raise ValueError(f"softmax variant {kind!r} needs mask(spec, Nq, Nk) -> MaskInfo terms")
    spec_class = spec_class or AttentionSpec
    if not (isinstance(spec_class, type) and issubclass(spec_class, AttentionSpec)):
        raise TypeError(f"spec_class of variant {kind!r} must be a subclass of AttentionSpec, got {spec_class!r}")
    if not isinstance(documents, bool):
        raise ValueError(f"documents={documents!r} of variant {kind!r} must be True or False")
    v = Variant(kind, family, spec_class, tuple(fields), validate, mask, element_fraction, bool(subquadratic), doc,
                decode_mask, cache_policy, cache_bytes, cost, documents)
    _VARIANTS[kind] = v
    forget_derived()  # a (re)registered variant may change the mask or the backends of a kind
    return v


def unregister_variant(kind: str) -> None:
    """Remove the variant ``kind`` (a missing one is ignored) and clear every derived cache."""
    _VARIANTS.pop(kind, None)
    forget_derived()


def variant_kinds() -> Tuple[str, ...]:
    """Every registered kind, in registration order (built-ins first)."""
    _load_builtin()
    return tuple(_VARIANTS)


def _lookup(kind) -> Optional[Variant]:
    try:
        return _VARIANTS.get(kind)
    except TypeError:  # unhashable (e.g. a list): no registered kind
        return None


def get_variant(kind: str) -> Variant:
    """The :class:`Variant` of ``kind``; raises ``ValueError`` naming the registered kinds (also for an unhashable
    ``kind``, e.g. a list: ``AttentionSpec(kind=[...], <unknown field>)`` looks it up before any validation)."""
    v = _lookup(kind)
    if v is None:
        _load_builtin()
        v = _lookup(kind)
        if v is None:
            raise ValueError(f"kind={kind!r} is not supported; allowed values: {', '.join(_VARIANTS)}")
    return v


def kinds_of(family: str) -> Tuple[str, ...]:
    """Registered kinds of one family (``"softmax"`` / ``"linear"``)."""
    _load_builtin()
    return tuple(k for k, v in _VARIANTS.items() if v.family == family)


def spec_class_of(kind) -> Optional[type]:
    """The spec class of ``kind`` (``None`` for an unknown kind: the spec's validation names it)."""
    try:
        return get_variant(kind).spec_class
    except (ValueError, TypeError):
        return None


def kind_of_spec_class(spec_class: type) -> Optional[str]:
    """The first registered kind whose spec class is ``spec_class`` (``None`` when no registered kind builds it):
    the kind a subclass of :class:`attn_zoo.AttentionSpec` stands for when it is built without ``kind``."""
    _load_builtin()
    return next((k for k, v in _VARIANTS.items() if v.spec_class is spec_class), None)


def is_subquadratic(kind: str) -> bool:
    """Whether ``kind`` has ~constant time per token (``False`` for unknown kinds, e.g. an old CSV's)."""
    try:
        return get_variant(kind).subquadratic
    except ValueError:
        return False


def element_fraction(spec, N: int) -> float:
    """Fraction of the ``N x N`` (query, key) pairs a spec keeps (``Nq = Nk = N``; linear kinds: the causal
    fraction). The variant's own formula when it has one, else counted from the mask in row chunks up to ``N = 4096``;
    above: exact for a block layout with any distance rule (causal, window, dilation; per block pair) and for a
    window alone (:func:`window_element_fraction`), else the visited-tile fraction at 64-token tiles."""
    v = get_variant(spec.kind)
    if v.element_fraction is not None:
        return float(v.element_fraction(spec, N))
    if v.family != "softmax":
        return (N + 1) / (2 * N) if spec.causal else 1.0
    from .. import cost_model as cm
    from ..masks import mask_info

    if N <= 4096:
        return cm.mask_fractions(spec, N, 64, 64)["element_fraction"]
    mi = mask_info(spec, N, N)
    if mi.layout is not None:  # a layout (+ causal, window, dilation): exact, per block pair in O(1)
        return _layout_rule_element_fraction(mi, N)
    if (mi.window_left is None or mi.window_left >= 0) and (mi.window_right is None or mi.window_right >= 0):
        # a window (+ dilation) alone, exact in O(N); window_right=0 keeps j <= i, causal whatever the spec says
        return window_element_fraction(N, mi.window_left, mi.window_right, spec.causal or mi.window_right == 0,
                                       mi.dilation)
    return cm.mask_fractions(spec, N, 64, 64, elements=False)["visited_fraction"]


def _layout_rule_element_fraction(mi, N: int) -> float:
    """Exact kept fraction at ``Nq = Nk = N`` of a mask made of a block layout and a rule on the distance
    ``d = i - j`` alone (causal, window, dilation), in O(N + nb^2): with ``P(x)`` the kept distances ``<= x`` and
    ``Q`` its prefix sum, the block pair of queries ``[q0, q1]`` and keys ``[k0, k0 + sk)`` keeps
    ``Q(q1 - k0) - Q(q0 - 1 - k0) - Q(q1 - k0 - sk) + Q(q0 - 1 - k0 - sk)``."""
    import torch

    bs = mi.block_size
    nb = -(-N // bs)
    idx = torch.arange(nb).clamp(max=mi.layout.shape[0] - 1)
    lay = mi.layout.to("cpu")[idx][:, idx].bool()
    lo = -(N + bs + 1)  # x in [lo, N + bs]: every argument of Q below
    d = torch.arange(lo, N + bs + 1, dtype=torch.int64)
    keep = torch.ones_like(d, dtype=torch.bool)
    if mi.causal:
        keep &= d >= 0
    if mi.window_left is not None:
        keep &= d <= mi.window_left
    if mi.window_right is not None:
        keep &= d >= -mi.window_right
    if mi.dilation != 1:
        keep &= d % mi.dilation == 0
    Q = torch.cumsum(torch.cumsum(keep.to(torch.int64), 0), 0)  # Q[x - lo] = sum_{y <= x} P(y)
    qb, kb = lay.nonzero(as_tuple=True)
    start = torch.arange(nb, dtype=torch.int64) * bs
    size = torch.clamp(N - start, max=bs)
    q0, q1, k0, sk = start[qb], start[qb] + size[qb] - 1, start[kb], size[kb]
    at = lambda x: Q[x - lo]  # noqa: E731
    kept = at(q1 - k0) - at(q0 - 1 - k0) - at(q1 - k0 - sk) + at(q0 - 1 - k0 - sk)
    return int(kept.sum()) / (N * N)


def window_element_fraction(N: int, left: Optional[int], right: Optional[int], causal: bool, dilation: int = 1) -> float:
    """Kept fraction of an ``N x N`` window mask (``left`` / ``right`` in tokens, ``None`` unbounded, keys every
    ``dilation`` tokens), in O(N) without a mask."""
    left = N if left is None else left
    right = 0 if causal else (N if right is None else right)
    d = max(int(dilation), 1)
    kept = 0
    for i in range(N):
        kept += min(left, i) // d + min(right, N - 1 - i) // d + 1
    return kept / (N * N)


def describe() -> List[dict]:
    """One row per registered variant (kind, family, fields, subquadratic, spec class): for docs and ``--help``."""
    _load_builtin()
    return [{"kind": v.kind, "family": v.family, "fields": ",".join(v.fields), "subquadratic": v.subquadratic,
             "spec_class": v.spec_class.__name__} for v in _VARIANTS.values()]
