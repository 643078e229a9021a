"""One mask description for every softmax backend.

A :class:`MaskInfo` answers the two questions every backend asks:

* "is element (i, j) allowed?"  -> :meth:`MaskInfo.allowed` / :meth:`MaskInfo.dense` (reference, SDPA mask,
  FlexAttention ``mask_mod``, and the element rule the Triton kernel applies on partial blocks);
* "which key blocks does query block m visit, and is the block full or partial?" ->
  :meth:`MaskInfo.block_table` (the Triton kernel loops over visited blocks only; FlexAttention's
  ``BlockMask`` is built from the same rule).

Positions are absolute: query row ``i`` is at ``i' = i + offset`` with ``offset = Nk - Nq`` (bottom-right
alignment, the FlashAttention convention). The element rule is the conjunction of
``causal: j <= i'``, ``window: i' - left <= j <= i' + right``, ``dilation: (i' - j) % dilation == 0`` (dilated
window, Beltagy et al. 2020) and ``layout[i' // bs, j // bs]`` (block-sparse); rows with ``i' < 0`` see nothing
under a block layout. One term relaxes another: ``sink_size = S`` exempts the keys ``j < S`` from the window's
left edge (attention sinks, Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"), so the
window term reads ``j >= i' - left or j < S``; every other term still applies to them.

Which terms a kind uses is its variant's mask rule (:mod:`attn_zoo.variants`, ``mask(spec, Nq, Nk)``);
:func:`mask_info` asks the registry and adds the causal clip.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from .registry import derived_cache
from .spec import AttentionSpec


def sparse_layout(spec: AttentionSpec, n_blocks: int) -> torch.Tensor:
    """Block layout ``(n_blocks, n_blocks)`` bool of a ``sparse`` spec, over absolute-position blocks of
    ``spec.block_size`` (the rule lives with the variant: :func:`attn_zoo.variants.sparse.sparse_layout`).

    ``layout[a, b]`` is True when query positions in block ``a`` may attend keys in block ``b``.
    BigBird (Zaheer et al. 2020): ``|a - b| <= num_local_blocks`` or ``a < g`` or ``b < g`` or one of
    ``num_random_blocks`` random blocks of row ``a`` (among blocks ``<= a`` when causal). Strided (Child et
    al. 2019, fixed): ``a // s == b // s`` or ``b % s == s - 1``. Causal layouts are lower-triangular.
    """
    from .variants.sparse import sparse_layout as _layout

    return _layout(spec, n_blocks)


class BlockTable(NamedTuple):
    """Key blocks visited by each query block, for kernels that skip fully-masked blocks.

    kv_idx: int32 ``(n_q_blocks, max_visits)``, key-block indices in increasing order, padded with 0.
    kv_count: int32 ``(n_q_blocks,)``, number of valid entries per row.
    kv_full: int8 ``(n_q_blocks, max_visits)``, 1 where every element of the block is allowed (no element
        mask needed), 0 for partial blocks (apply :meth:`MaskInfo.allowed`).
    visited: bool ``(n_q_blocks, n_k_blocks)``; full: bool ``(n_q_blocks, n_k_blocks)``.
    """

    kv_idx: torch.Tensor
    kv_count: torch.Tensor
    kv_full: torch.Tensor
    visited: torch.Tensor
    full: torch.Tensor


@dataclass(frozen=True)
class MaskInfo:
    """Mask of a softmax variant for ``Nq`` queries and ``Nk`` keys (see module docstring).

    window_left / window_right: ``None`` = unbounded, in tokens. layout: bool ``(nb, nb)`` at ``block_size`` or
    None. dilation: keys every ``dilation`` tokens from the query (``(i' - j) % dilation == 0``); 1 = every key.
    sink_size: the first ``sink_size`` keys (absolute positions ``j < sink_size``) are exempt from ``window_left``
    (attention sinks); 0 = none. ``ValueError`` unless an integer >= 0, and with a ``layout`` or ``dilation != 1``
    (not combined: no kernel walks both). With no left edge it changes nothing and :func:`mask_info` sets it to 0.
    """

    Nq: int
    Nk: int
    causal: bool
    window_left: Optional[int] = None
    window_right: Optional[int] = None
    layout: Optional[torch.Tensor] = None
    block_size: int = 0
    dilation: int = 1
    sink_size: int = 0

    def __post_init__(self):
        if not isinstance(self.dilation, int) or isinstance(self.dilation, bool) or self.dilation < 1:
            raise ValueError(f"dilation must be an integer >= 1, got {self.dilation!r}")
        if not isinstance(self.sink_size, int) or isinstance(self.sink_size, bool) or self.sink_size < 0:
            raise ValueError(f"sink_size must be an integer >= 0 (tokens), got {self.sink_size!r}")
        if self.sink_size and (self.layout is not None or self.dilation != 1):
            raise ValueError(f"sink_size={self.sink_size} does not combine with a block layout or dilation "
                             f"(dilation={self.dilation}, layout {'set' if self.layout is not None else 'None'})")

    @property
    def offset(self) -> int:
        return self.Nk - self.Nq

    @property
    def is_full(self) -> bool:
        """True when every (i, j) is allowed (plain non-causal attention)."""
        return (not self.causal and self.window_left is None and self.window_right is None and self.layout is None
                and self.dilation == 1)

    @property
    def is_plain_causal(self) -> bool:
        """True for the plain causal mask (no window on the left, no layout, no dilation): SDPA's ``is_causal``."""
        return (self.causal and self.layout is None and self.window_left is None and self.window_right in (None, 0)
                and self.dilation == 1)

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Element rule: bool tensor, broadcast of query row indices ``i`` and key indices ``j``."""
        ia = i + self.offset
        ok = (j >= 0) & (j < self.Nk) & (i >= 0) & (i < self.Nq)
        if self.causal:
            ok = ok & (j <= ia)
        if self.window_left is not None:
            in_window = j >= ia - self.window_left
            ok = ok & ((in_window | (j < self.sink_size)) if self.sink_size else in_window)
        if self.window_right is not None:
            ok = ok & (j <= ia + self.window_right)
        if self.dilation != 1:
            ok = ok & ((ia - j) % self.dilation == 0)
        if self.layout is not None:
            lay = self.layout.to(i.device)
            nb = lay.shape[0]
            qb = (ia // self.block_size).clamp(0, nb - 1)
            kb = (j // self.block_size).clamp(0, nb - 1)
            ok = ok & (ia >= 0) & lay[qb, kb]
        return ok

    def dense(self, device=None) -> torch.Tensor:
        """Materialised mask, bool ``(Nq, Nk)``, True = attend."""
        i = torch.arange(self.Nq, device=device).view(-1, 1)
        j = torch.arange(self.Nk, device=device).view(1, -1)
        return self.allowed(i, j)

    def block_table(self, block_m: int, block_n: int, device=None) -> BlockTable:
        """Visited / full key blocks per query block at the kernel's tile sizes ``(block_m, block_n)``.

        Computed in block coordinates (never materialises ``Nq x Nk``), conservatively: a block marked
        visited may still contain no allowed element (the element rule then masks it), but a block not
        visited never contains one, and a block marked full contains no masked element.
        """
        nqb = -(-self.Nq // block_m)
        nkb = -(-self.Nk // block_n)
        r0 = torch.arange(nqb).view(-1, 1) * block_m  # first row of each query block
        r1 = torch.minimum(r0 + block_m, torch.tensor(self.Nq)) - 1  # last row
        c0 = torch.arange(nkb).view(1, -1) * block_n
        c1 = torch.minimum(c0 + block_n, torch.tensor(self.Nk)) - 1
        a0, a1 = r0 + self.offset, r1 + self.offset  # absolute positions
        visited = torch.ones(nqb, nkb, dtype=torch.bool)
        full = (r1 - r0 + 1 == block_m) & (c1 - c0 + 1 == block_n)  # ragged tails are partial
        if self.causal:
            visited &= c0 <= a1
            full &= c1 <= a0
        if self.window_left is not None:  # sinks: a tile with a key j < sink_size is visited, one of them only full
            visited &= (c1 >= a0 - self.window_left) | (c0 < self.sink_size)
            full &= (c0 >= a1 - self.window_left) | (c1 < self.sink_size)
        if self.window_right is not None:
            visited &= c0 <= a1 + self.window_right
            full &= c1 <= a0 + self.window_right
        if self.layout is not None:
            bs, nb = self.block_size, self.layout.shape[0]
            # integral image of the layout: count of True cells in any rectangle in O(1)
            ii = torch.zeros(nb + 1, nb + 1, dtype=torch.int64)
            ii[1:, 1:] = self.layout.to(torch.int64).cumsum(0).cumsum(1)
            qa = (a0.clamp(min=0) // bs).clamp(max=nb - 1)
            qz = (a1.clamp(min=0) // bs).clamp(max=nb - 1)
            ka, kz = (c0 // bs).clamp(max=nb - 1), (c1 // bs).clamp(max=nb - 1)  # keys past the layout: last block
            cnt = ii[qz + 1, kz + 1] - ii[qa, kz + 1] - ii[qz + 1, ka] + ii[qa, ka]
            area = (qz - qa + 1) * (kz - ka + 1)
            visited &= (cnt > 0) & (a1 >= 0)
            full &= (cnt == area) & (a0 >= 0)
        if self.dilation != 1:  # every tile of the window bounds is visited (conservative), none is full
            full &= False
        full &= visited
        kv_count = visited.sum(1).to(torch.int32)
        max_visits = max(int(kv_count.max()) if nqb else 0, 1)
        # stable sort puts visited blocks first, in increasing key-block order
        order = torch.sort((~visited).to(torch.int8), dim=1, stable=True).indices[:, :max_visits]
        valid = torch.arange(max_visits).view(1, -1) < kv_count.view(-1, 1)
        kv_idx = torch.where(valid, order, 0).to(torch.int32)
        kv_full = (torch.gather(full, 1, order) & valid).to(torch.int8)
        return BlockTable(kv_idx.to(device), kv_count.to(device), kv_full.to(device), visited.to(device), full.to(device))


def mask_info(spec: AttentionSpec, Nq: int, Nk: int, cached: bool = True) -> MaskInfo:
    """The :class:`MaskInfo` of a softmax spec for ``Nq`` queries and ``Nk`` keys: the terms of its variant's mask
    rule (:mod:`attn_zoo.variants`), with ``causal`` clipping a window's right side to 0. Cached per
    (spec, Nq, Nk): treat the result (and its ``layout``) as read-only. ``ValueError`` for a kind outside the softmax
    family or ``Nq`` / ``Nk`` not integers >= 1 (checked before the cache, which takes ``True`` for ``1``).
    ``cached=False`` builds it without reading or filling the cache (a probe over many lengths, which would evict
    the masks in use and hold every layout it made)."""
    for name, n in (("Nq", Nq), ("Nk", Nk)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"mask_info: {name}={n!r} must be an integer >= 1 (the number of queries / keys)")
    return (_mask_info if cached else _build_mask_info)(spec, int(Nq), int(Nk))


def _build_mask_info(spec: AttentionSpec, Nq: int, Nk: int) -> MaskInfo:
    """:func:`mask_info`, uncached, its counts checked."""
    from .variants import get_variant, kinds_of

    v = get_variant(spec.kind)
    if v.family != "softmax":
        raise ValueError(f"mask_info needs a softmax kind {kinds_of('softmax')}, got kind={spec.kind!r}")
    # on the CPU, whatever the default device: the result is cached for every later call, and a layout made under
    # ``with torch.device("meta")`` (a model traced for its shapes) had no values for the calls after it
    with torch.device("cpu"):
        terms = dict(v.mask(spec, Nq, Nk))
    right = terms.get("window_right")
    if spec.causal and right is not None:
        terms["window_right"] = min(right, 0)  # (None stays None: the causal rule bounds the right side)
    if terms.get("layout") is None:
        terms["block_size"] = 0
    if terms.get("window_left") is None and terms.get("sink_size"):
        terms["sink_size"] = 0  # no left edge to be exempt from: the same mask
    return MaskInfo(Nq, Nk, spec.causal, **terms)


_mask_info = derived_cache(256)(_build_mask_info)


def meta_via_cpu(fn):
    """``fn(spec, Nq, Nk, device)``, a mask built from the spec and the shape only, for ``device="meta"`` (a model
    traced for its shapes, FLOP counts): built on the CPU (the ``.item()`` calls it makes need values) and returned
    on the meta device (tensors, also inside a tuple; other values as they are)."""

    @functools.wraps(fn)
    def wrapped(spec, Nq: int, Nk: int, device: str = "cpu"):
        if torch.device(device).type != "meta":
            return fn(spec, Nq, Nk, device)
        with torch.device("cpu"):  # under ``with torch.device("meta")`` the tensors fn makes without a device too
            out = fn(spec, Nq, Nk, "cpu")
        to_meta = (lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t)
        return tuple(map(to_meta, out)) if isinstance(out, tuple) else to_meta(out)

    return wrapped


@derived_cache(64)
@meta_via_cpu
def unseen_keys(spec: AttentionSpec, Nq: int, Nk: int, device: str = "cpu") -> Optional[torch.Tensor]:
    """``(Nk, 1)`` bool on ``device``, True at the keys that no query row may see under ``spec``'s mask, or ``None``
    when every key is seen by some row (no causal training shape has any; decoding-like ``Nq < Nk`` windows and
    layouts with empty block columns do). The backends zero those K / V rows, so a NaN / inf there contributes
    nothing, not even ``0 * NaN``. Computed once per (spec, shape, device), in row chunks of at most ~16M
    elements (no ``Nq x Nk`` mask)."""
    mi = mask_info(spec, Nq, Nk)
    j = torch.arange(Nk, device=device).view(1, -1)
    seen = torch.zeros(Nk, dtype=torch.bool, device=device)
    step = max(1, (1 << 24) // max(Nk, 1))
    for r in range(0, Nq, step):
        i = torch.arange(r, min(Nq, r + step), device=device).view(-1, 1)
        seen |= mi.allowed(i, j).any(0)
    return None if bool(seen.all()) else (~seen).view(Nk, 1)
