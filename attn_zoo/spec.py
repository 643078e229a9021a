"""The attention specification: one frozen dataclass that describes a variant.

A spec says *what* is computed (softmax over which keys, or which feature map); it never says how.
Every backend (``reference``, ``torch``, ``triton``, the anchors) reads the same spec, and the softmax variants read
their mask from :mod:`attn_zoo.masks`, so semantics cannot drift between backends.

The ``kind`` is a registered variant (:mod:`attn_zoo.variants`): its folder says which fields it reads, validates
them and gives its mask rule. A variant with fields of its own registers a frozen subclass of
:class:`AttentionSpec`; ``AttentionSpec(kind=<that kind>, ...)`` builds the subclass, so one constructor (and
:func:`make_spec`, the Hydra target) serves every variant.

Position convention (FlashAttention's, "bottom-right alignment"): with ``Nq`` queries and ``Nk`` keys,
query row ``i`` sits at absolute position ``i' = i + Nk - Nq``. Every mask rule (causal, window, block
layout) is written in absolute positions, so a decoding step (``Nq = 1``) sees what the last row of the
full sequence sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Optional, Tuple

# The kinds are the registry's (attn_zoo.variants.variant_kinds() / kinds_of()), not listed here.
SPARSE_PATTERNS = ("bigbird", "strided")
FEATURE_MAPS = ("elu1", "relu", "favor", "taylor")


def __getattr__(name):  # KINDS: every registered kind (built-ins and plugins), read when asked
    if name == "KINDS":
        from .variants import variant_kinds

        return variant_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: {', '.join(map(str, allowed))}")


def _real(value) -> bool:
    """A real number that is not a bool (``True`` would otherwise pass as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _nonneg_int(name: str, value, minimum: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# Fields every kind reads (the others are read only by the variants that list them in ``fields``).
COMMON_FIELDS = ("kind", "causal", "n_kv_heads", "kv_group_size", "name")
# Fields every kind of one family reads (a kind of another family reads one only when it lists it in ``fields``):
# the linear family has no softmax, so ``make_spec("linear", softmax_scale=0.5)`` would be accepted and ignored.
FAMILY_FIELDS = {"softmax_scale": "softmax"}


def _reads(variant, name: str) -> bool:
    return name in COMMON_FIELDS or name in variant.fields or FAMILY_FIELDS.get(name) == variant.family


def _refuse_unread_fields(spec, variant) -> None:
    """A field of :class:`AttentionSpec` that ``variant`` does not read (not common, not its family's, not in its
    ``fields``) must keep its default: ``make_spec("flash", block_size=16)`` would otherwise be accepted and
    ignored. Raises ``ValueError`` naming the field and the kinds that read it."""
    from .variants import get_variant, variant_kinds

    for f in _BASE_FIELDS:
        if _reads(variant, f.name):
            continue
        if getattr(spec, f.name) != f.default:
            users = [k for k in variant_kinds() if _reads(get_variant(k), f.name)]
            readers = " / ".join(map(repr, users)) if users else "no registered kind"
            raise ValueError(f"{f.name}={getattr(spec, f.name)!r} is not read by kind={spec.kind!r}; {f.name} is only "
                             f"used by kind={readers} (leave it at its default {f.default!r})")


@dataclass(frozen=True)
class AttentionSpec:
    """Description of one attention variant (validated on construction; raises ``ValueError``).

    A field the kind does not read (not in its variant's ``fields``, e.g. ``block_size`` on ``flash``) must keep
    its default: anything else raises ``ValueError`` naming the field and the kinds that read it.

    Common fields
        kind: a registered variant (:func:`attn_zoo.variants.variant_kinds`). Built in: ``"flash"`` (exact
            softmax attention, Dao et al. 2022), ``"sliding_window"`` (local attention, Beltagy et al. 2020
            "Longformer"), ``"sparse"`` (block-sparse softmax: BigBird, Zaheer et al. 2020, or the fixed strided
            pattern of Child et al. 2019), ``"linear"`` (kernelized attention, Katharopoulos et al. 2020, eq.
            4-6), ``"dilated_window"`` (Longformer's dilated window; adds the field ``dilation``).
        causal: query at absolute position ``i'`` sees keys ``j <= i'`` (bottom-right alignment when
            ``Nq != Nk``). Rows that see no key output exactly 0.
        softmax_scale: multiplier of ``q @ k^T``; ``None`` means ``D ** -0.5``. Read by the softmax family only
            (a linear-family kind refuses any other value unless it lists the field in its ``fields``).
        n_kv_heads / kv_group_size: K/V head sharing (GQA, Ainslie et al. 2023; MQA, Shazeer 2019) for
            the model layer. At most one may be set; ``resolve_kv_heads(n_heads)`` turns them into a
            count. The functional :func:`attn_zoo.attention` reads ``Hkv`` from ``k.shape`` instead.

    ``sliding_window``
        window_size: ``(left, right)``, inclusive, in tokens: query ``i'`` sees keys in
            ``[i' - left, i' + right]``. ``None`` on one side means unbounded on that side. A causal
            window of ``W`` tokens (the query and ``W - 1`` before it) is ``window_size=(W - 1, 0)``
            (``causal=True`` additionally clips ``right`` to 0).

    ``sparse``
        sparse_pattern: ``"bigbird"`` (local window blocks + global blocks + random blocks) or
            ``"strided"`` (Sparse Transformer "fixed": own stride window + the last block of every
            stride window as a summary column).
        block_size: tokens per block of the block layout.
        num_local_blocks: bigbird, key blocks on each side of the query's own block.
        num_global_blocks: bigbird, the first ``g`` blocks attend to / are attended by everything.
        num_random_blocks: bigbird, extra key blocks per query block drawn with ``seed``.
        stride_blocks: strided, the stride ``l`` in blocks.
        seed: random-block / random-feature seed (deterministic).

    ``linear``
        feature_map: ``"elu1"`` (elu(x)+1), ``"relu"``, ``"favor"`` (Performer FAVOR+ positive random
            features, Choromanski et al. 2021, Lemma 1) with ``num_features``, or ``"taylor"``
            (2nd-order Taylor of exp, Arora et al. 2024 "Based": ``1 + x + x^2/2``).
        eps: added to the normaliser ``phi(q) . z``.
        chunk_size: chunk length of the chunked causal form (kernel / torch backend tuning only).
    """

    kind: str = "flash"
    causal: bool = True
    softmax_scale: Optional[float] = None
    n_kv_heads: Optional[int] = None
    kv_group_size: Optional[int] = None
    # sliding window
    window_size: Optional[Tuple[Optional[int], Optional[int]]] = None
    # block-sparse
    sparse_pattern: str = "bigbird"
    block_size: int = 64
    num_local_blocks: int = 1
    num_global_blocks: int = 1
    num_random_blocks: int = 1
    stride_blocks: int = 4
    seed: int = 0
    # linear
    feature_map: str = "elu1"
    num_features: int = 64
    eps: float = 1e-6
    chunk_size: int = 64
    # free-form name for logs (e.g. "gqa"); does not change the math
    name: Optional[str] = field(default=None, compare=False)

    def __new__(cls, *args, **kwargs):
        # AttentionSpec(kind=k, ...) of a variant with its own fields builds that variant's subclass
        target = cls
        given = "kind" in kwargs or bool(args)
        kind = kwargs["kind"] if "kind" in kwargs else (args[0] if args else "flash")
        if cls is AttentionSpec and isinstance(kind, str):
            from .variants import spec_class_of

            sub = spec_class_of(kind)
            if sub is not None:
                target = sub
        unknown = set(kwargs) - set(target.__dataclass_fields__)
        if unknown:  # a misspelled or another kind's field: make_spec's ValueError, not dataclass's TypeError
            from .variants import get_variant, kind_of_spec_class

            if not given and cls is not AttentionSpec:  # a variant's subclass built without kind: its own kind
                kind = kind_of_spec_class(cls)
                if kind is None:
                    own = sorted(set(cls.__dataclass_fields__) - {"kind"})
                    raise ValueError(f"unknown fields {sorted(unknown)} for {cls.__name__} (no registered kind builds "
                                     f"it); its fields: {', '.join(own)}")
            variant = get_variant(kind)  # a bad kind: get_variant names it
            reads = sorted(n for n in set(variant.spec_class.__dataclass_fields__) - {"kind"} if _reads(variant, n))
            raise ValueError(f"unknown fields {sorted(unknown)} for kind={kind!r}; allowed: {', '.join(reads)}")
        return object.__new__(target)

    def __post_init__(self):
        from .variants import get_variant

        if not isinstance(self.kind, str):
            get_variant(self.kind)  # raises, naming the kind given and the registered kinds
        v = get_variant(self.kind)
        if type(self) is not v.spec_class:
            from .variants import kind_of_spec_class

            own = kind_of_spec_class(type(self))
            stands_for = f" (the spec class of kind={own!r})" if own is not None and own != self.kind else ""
            raise ValueError(f"kind={self.kind!r} is built by {v.spec_class.__name__}, not {type(self).__name__}"
                             f"{stands_for}; use AttentionSpec(kind={self.kind!r}, ...) or attn_zoo.make_spec"
                             + (f", or pass kind={own!r}" if stands_for else ""))
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be a bool, got {self.causal!r}")
        if self.softmax_scale is not None and not (
            _real(self.softmax_scale) and math.isfinite(self.softmax_scale) and self.softmax_scale > 0
        ):
            raise ValueError(f"softmax_scale must be a positive finite float or None, got {self.softmax_scale!r}")
        if self.n_kv_heads is not None and self.kv_group_size is not None:
            raise ValueError("set at most one of n_kv_heads and kv_group_size")
        if self.n_kv_heads is not None:
            _nonneg_int("n_kv_heads", self.n_kv_heads, 1)
        if self.kv_group_size is not None:
            _nonneg_int("kv_group_size", self.kv_group_size, 1)

        if self.window_size is not None:
            if not isinstance(self.window_size, (tuple, list)) or len(self.window_size) != 2:
                raise ValueError(
                    f"window_size must be a pair (left, right), got {self.window_size!r}; "
                    f"a causal window of W tokens is window_size=(W - 1, 0)"
                )
            ws = tuple(self.window_size)
            for side, w in zip(("left", "right"), ws):
                if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 0):
                    raise ValueError(
                        f"window_size {side}={w!r} must be an integer >= 0 or None (unbounded); "
                        f"a causal window of W tokens is window_size=(W - 1, 0)"
                    )
            object.__setattr__(self, "window_size", ws)
        _refuse_unread_fields(self, v)
        _nonneg_int("chunk_size", self.chunk_size, 1)
        _nonneg_int("seed", self.seed)
        if v.validate is not None:
            v.validate(self)

    # ------------------------------------------------------------------ helpers
    @property
    def family(self) -> str:
        """The variant's family: ``"softmax"`` (a mask, :func:`attn_zoo.mask_info`) or ``"linear"``."""
        from .variants import get_variant

        return get_variant(self.kind).family

    @property
    def is_softmax(self) -> bool:
        return self.family == "softmax"

    @property
    def label(self) -> str:
        """Short human-readable name for logs and plots."""
        return self.name or self.kind

    def scale(self, head_dim: int) -> float:
        return float(self.softmax_scale) if self.softmax_scale is not None else head_dim ** -0.5

    def resolve_kv_heads(self, n_heads: int) -> int:
        """Number of K/V heads for a layer with ``n_heads`` query heads; raises ``ValueError``."""
        if self.n_kv_heads is not None:
            hkv = self.n_kv_heads
        elif self.kv_group_size is not None:
            if n_heads % self.kv_group_size:
                raise ValueError(f"kv_group_size={self.kv_group_size} must divide n_heads={n_heads}")
            hkv = n_heads // self.kv_group_size
        else:
            hkv = n_heads
        if n_heads % hkv:
            raise ValueError(f"n_kv_heads={hkv} must divide n_heads={n_heads} (Hq % Hkv == 0)")
        return hkv

    def replace(self, **changes) -> "AttentionSpec":
        return replace(self, **changes)


_BASE_FIELDS = tuple(f for f in fields(AttentionSpec))


def make_spec(kind: str = "flash", **kwargs) -> AttentionSpec:
    """Hydra-friendly constructor (lists from YAML become tuples); the spec class of ``kind``'s variant (fields of
    a plugin variant, e.g. ``dilation``, are accepted). Unknown fields raise ``ValueError`` naming them and the fields
    ``kind`` reads (its variant's ``fields``, its family's, the common ones); a known field that ``kind`` does not
    read, set to a non-default value, raises naming the kinds that read it."""
    for key, val in kwargs.items():
        if val is not None and not isinstance(val, (int, float, str, bool, tuple)):  # ListConfig / list from YAML
            try:
                kwargs[key] = tuple(val)
            except TypeError:
                pass
    return AttentionSpec(kind=kind, **kwargs)  # unknown fields and kinds: refused by AttentionSpec.__new__

