"""Settings of the exact-attention kernel, passed explicitly: :class:`FlashConfig` and :func:`flash_settings`.

A :class:`FlashConfig` is frozen and hashable; :func:`~kernels.flash.flash_attn` takes one as ``config=`` (its
``dq_mode=`` / ``dkdv_split=`` / ``deterministic=`` arguments override the matching fields for that call, as in
FlashAttention's interface). A call without ``config=`` uses the current settings: :class:`FlashConfig()` (the
defaults), or the config of the innermost :func:`flash_settings` block (a context variable, so threads and
tasks do not see each other's settings). The backward runs with the config its forward was given: nothing is read
at backward time.

Tile overrides (``fwd`` / ``dq`` / ``dkdv`` for the dense, causal and window modes, ``sparse_*`` for the
block-sparse mode) are for tuning scripts: no shared-memory or register check. They take a :class:`TileConfig`,
a dict ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` or a tuple ``(BLOCK_M, BLOCK_N, num_warps,
num_stages)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch

DQ_MODES = ("separate", "atomic")
# the forward kernels (FlashConfig.fwd_impl): "auto" picks one per call (kernels.flash.gluon.resolve_fwd_impl),
# "triton" is the Triton kernel of fwd.py, the Gluon ones run in kernels.flash.gluon (which imports Gluon lazily)
GLUON_FWD_IMPLS = ("gluon_ws3a", "gluon_ws3b", "gluon_ws3p")
FWD_IMPLS = ("auto", "triton") + GLUON_FWD_IMPLS
# the backward kernels (FlashConfig.bwd_impl): "auto" picks one per call (kernels.flash.gluon.choose_bwd_impl),
# "triton" (bwd.py) or "gluon" (Hopper, kernels.flash.gluon; with the atomic dQ, deterministic=True refuses it)
BWD_IMPLS = ("auto", "triton", "gluon")
# the Gluon backward's dQ (FlashConfig.gluon_bwd_dq): "atomic" (fp32 atomics from the Gluon kernel) or "triton" (the
# Gluon kernel computes dK / dV only, the Triton dQ kernel of bwd.py computes dQ: no atomics, deterministic) or "gluon"
# (dK / dV likewise, then the Gluon dQ kernel of kernels.flash._gluon_kernels: no atomics, deterministic) or "tma"
# (as "atomic", each tile's dQ added by one TMA bulk reduce-add from shared memory, with one or two consumers:
# triton 3.7+ Gluon)
GLUON_BWD_DQ = ("atomic", "triton", "gluon", "tma")
# the dQ paths whose partial sums are added in an arbitrary order (deterministic=True refuses them)
GLUON_BWD_DQ_ATOMIC = ("atomic", "tma")
# the Gluon backward's consumer partitions (FlashConfig.gluon_bwd_consumers): 1 (one 8-warp partition) or 2 (two
# 1-warpgroup partitions of 64 key rows each; dK / dV only, so gluon_bwd_dq="triton" or "gluon" only)
GLUON_BWD_CONSUMERS = (1, 2)
KINDS = ("fwd", "dq", "dkdv")


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class TileConfig:
    """One kernel launch's tile and schedule: ``BLOCK_M`` query rows x ``BLOCK_N`` key rows, warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        for name in ("block_m", "block_n", "num_warps", "num_stages"):
            val = getattr(self, name)
            if not _positive_int(val):
                raise ValueError(f"TileConfig {name}={val!r} must be a positive integer")
        if self.num_warps & (self.num_warps - 1):  # Triton launches powers of two only
            raise ValueError(f"TileConfig num_warps={self.num_warps} must be a power of two (1, 2, 4, 8, 16)")

    @classmethod
    def of(cls, value, what: str = "tile") -> Optional["TileConfig"]:
        """``None``, a :class:`TileConfig`, a dict with ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages`` or a
        tuple ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``."""
        if value is None or isinstance(value, TileConfig):
            return value
        if isinstance(value, dict):
            missing = [key for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages") if key not in value]
            if missing:
                raise ValueError(f"{what}: {value!r} lacks {', '.join(missing)} (a tile needs BLOCK_M, BLOCK_N, "
                                 "num_warps, num_stages)")
            value = (value["BLOCK_M"], value["BLOCK_N"], value["num_warps"], value["num_stages"])
        if isinstance(value, (tuple, list)) and len(value) == 4:
            try:
                return cls(*value)
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
        raise ValueError(f"{what}={value!r} must be a TileConfig, a dict (BLOCK_M, BLOCK_N, num_warps, num_stages) "
                         "or a 4-tuple")

    def meta(self) -> dict:
        """The launch keywords ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}``."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "num_warps": self.num_warps,
                "num_stages": self.num_stages}


_TILE_FIELDS = ("fwd", "dq", "dkdv", "sparse_fwd", "sparse_dq", "sparse_dkdv")


@dataclass(frozen=True)
class FlashConfig:
    """Settings of one :func:`~kernels.flash.flash_attn` call (frozen, hashable; the defaults are the tuned ones).

    Attributes:
        dq_mode: backward dQ algorithm: ``"separate"`` (its own kernel per query tile; deterministic, 7 matmuls
            per tile pair) or ``"atomic"`` (fused into the dK/dV kernel with fp32 atomics, FA2: 5 matmuls, not
            bitwise deterministic).
        dkdv_split: programs per GQA group in the dK/dV pass (must divide ``Hq // Hkv``; partial fp32 dK/dV summed
            after); ``None``: :func:`~kernels.flash.choose_dkdv_split` with a target of 2 programs per SM (8 for
            groups of >= 8 heads).
        deterministic: refuse settings whose backward is not bitwise reproducible (``dq_mode="atomic"``).
        tma: TMA descriptors for the streamed operands: ``"auto"`` (Hopper, dense / causal / window problems of at
            least ``tma_min_pairs`` visited pairs), ``True`` (always where the layout allows, also in the
            interpreter: tests), ``False`` (pointer loads).
        tma_min_pairs: the ``"auto"`` threshold (descriptors cost ~0.1 ms of host time per launch). 2^26 since
            2026-12-06 (2^28 before; 2^26 is the smallest size measured): on an H100, TMA in the Triton forward and backward ran causal D 128 512 / 1k
            (16k tokens per call, 6.7e7-1.3e8 pairs) 1.07x / 1.08x forward+backward, full 512 1.03x
            (``results/h100/2026-12-06i/t1k/``). The Gluon forward reads by TMA, so ``fwd_impl="auto"`` gives it
            at least this many pairs and its own threshold, ``kernels.flash.gluon.GLUON_AUTO_HEAD_DIMS``.
        sparse_aligned_no_gather: block-sparse partial tiles that lie inside one layout block skip the per-element
            layout gather (trusts the block table: a visited tile must lie in a layout block that is on, true for
            tables from ``MaskInfo.block_table``).
        autotune: ``triton.autotune`` over the whole config list instead of the heuristic tables (a tuning aid;
            ignored under the interpreter; TMA off).
        fwd, dq, dkdv: forced tiles of each kernel in the dense / causal / window modes (tuning; no shared-memory
            or register check). ``BLOCK_M`` / ``BLOCK_N`` powers of two >= 16, ``num_warps`` a power of two.
        fwd_impl: the forward kernel: ``"auto"`` (default: per call, :func:`~kernels.flash.resolve_fwd_impl`:
            the persistent ``"gluon_ws3p"`` on Hopper for large dense / causal / window fp16 / bf16 problems,
            ``"gluon_ws3a"`` for documents and whole-tile block-sparse layouts (``kernels.flash.gluon.AUTO_PERSISTENT``),
            at the head dims of ``kernels.flash.gluon.GLUON_AUTO_HEAD_DIMS`` when Gluon is importable on a
            triton of ``kernels.flash.gluon.GLUON_AUTO_TRITON`` (3.6, 3.9), else ``"triton"``; never raises),
            ``"triton"`` (the Triton kernel: every mask), or a Gluon kernel for Hopper (:mod:`kernels.flash.gluon`,
            ``triton.experimental.gluon`` of triton 3.6 or 3.9): ``"gluon_ws3a"`` (FA3's
            layout: a TMA producer warp and two 1-warpgroup consumers, with FA3's intra-warpgroup overlap) or
            ``"gluon_ws3b"`` (plus ping-pong of the consumers): band masks (dense, causal, sliding windows,
            documents) and block-sparse layouts of whole 128 x 128 tiles (no dilation), D in {64, 128}, fp16 /
            bf16, sm_90 only; or ``"gluon_ws3p"``, ws3a's schedule in a persistent grid (one program per SM; band
            masks only, no block-sparse layout); anything else raises ``ValueError`` at the call. The backward is the Triton one
            either way unless ``bwd_impl`` says otherwise.
        bwd_impl: the backward kernel: ``"auto"`` (default: per call, :func:`kernels.flash.gluon.choose_bwd_impl`: on
            Hopper, for dense / causal / sliding-window / document fp16 / bf16 problems of D 64 / 128 without GQA, or
            with GQA where ``kernels.flash.gluon.gqa_bwd_measured`` holds (D 128, dense / causal, groups <= 4, >= 512
            dK / dV programs) (band masks while ``kernels.flash.gluon.GLUON_AUTO_BWD_BANDS``), with at least
            ``kernels.flash.gluon.GLUON_BWD_AUTO_MIN_PAIRS`` visited pairs per head (2^22 at D 64, 2^19 at D 128: causal
            N >= 1k) and the Triton backward's settings
            at their defaults, the Gluon dK / dV kernel with two consumers and the Gluon dQ kernel at D 128, the
            Triton one at D 64 (``bwd_impl="gluon", gluon_bwd_dq="gluon" / "triton", gluon_bwd_consumers=2``: with the
            Triton dQ 1.01-1.05x the Triton backward at N 4k / 16k on the H200, 2026-12-04; the Gluon dQ 1.04-1.09x
            more at D 128, 2026-12-05; docs/kernels.md) on a triton of ``kernels.flash.gluon.GLUON_AUTO_BWD_TRITON``
            at the head dims listed there (3.6: D 64 / 128; 3.9: D 128, 1.03-1.05x the Triton backward at 16k and
            full 4k on an H100, 2026-12-06; its D 64 build had no lead), else ``"triton"``;
            never raises),
            ``"triton"`` (bwd.py, every mask, ``dq_mode`` / ``dkdv_split`` apply) or ``"gluon"`` (:func:`kernels.flash.gluon.gluon_flash_bwd`, FA3's backward layout on Hopper:
            one program per key tile holding K, V, dK, dV on chip, Q / dO streamed by TMA, dQ as ``gluon_bwd_dq``
            says; dense or causal masks (with ``gluon_bwd_consumers=2`` also sliding windows and ``doc_ids``; never
            a block-sparse layout or dilation), D in {64, 128} with Dv == D, fp16 / bf16, GQA, sm_90 only; anything else
            raises ``ValueError`` when the call needs a backward). ``dq_mode`` and ``dkdv_split`` do not apply to it;
            ``deterministic=True`` refuses it with ``gluon_bwd_dq="atomic"`` (the atomics add in an arbitrary
            order). With the atomic dQ it is slower than the Triton backward on the H200 (0.78-0.91x, 2026-12-04,
            docs/kernels.md).
        gluon_bwd_dq: the dQ of ``bwd_impl="gluon"`` (ignored by ``"triton"``): ``"atomic"`` (default: the Gluon
            kernel adds ``dS K`` into an fp32 buffer with atomics; not bitwise deterministic) or ``"triton"`` (the
            Gluon kernel computes dK / dV only, then the Triton dQ kernel of bwd.py runs as the Triton backward
            launches it: two kernels, no atomics, deterministic, so ``deterministic=True`` allows it) or ``"gluon"``
            (dK / dV likewise, then the Gluon dQ kernel ``_gl_bwd_dq_kernel``, FA3's forward layout: a TMA producer
            warp streaming K / V, two 1-warpgroup consumers of 64 query rows, dQ in registers; deterministic too;
            :func:`kernels.flash.gluon.gluon_dq`). ``bwd_impl="auto"``, where it picks the Gluon backward, runs its
            dK / dV with the Gluon dQ at D 128 and the Triton dQ at D 64 (:data:`kernels.flash.gluon.AUTO_GLUON_BWD`,
            :data:`~kernels.flash.gluon.AUTO_GLUON_DQ_HEAD_DIMS`). ``"tma"``: as ``"atomic"`` (one kernel, 5 GEMMs
            per tile pair), each query tile's ``dS K`` written to shared memory and added into the fp32 buffer by one
            TMA bulk reduce-add (FA3's dQ; Gluon's ``tma.async_atomic_add``, triton 3.7+: on an older triton the call
            raises ``ValueError``); with ``gluon_bwd_consumers=2`` each consumer adds its keys' part (and band masks
            / ``doc_ids`` are taken); not deterministic; on an H100 (triton 3.9, 2026-12-06) 0.93-1.00x the two
            kernels of ``"gluon"`` at causal 4k / 16k and full 4k (full 16k 1.06-1.13x against a slow reading of
            the two kernels), so ``"auto"`` does not take it (docs/kernels.md).
        gluon_bwd_consumers: the consumer partitions of the Gluon dK / dV kernel (ignored by ``bwd_impl="triton"``):
            1 (default: one 8-warp partition, ``_gl_bwd_kernel``) or 2 (``_gl_bwd_dkdv2_kernel``: two 1-warpgroup
            partitions of 64 key rows each sharing the Q / dO ring, dS^T kept in registers; dK / dV only, so it
            needs ``gluon_bwd_dq="triton"`` or ``"gluon"``; what ``"auto"`` runs; the only one taking sliding windows
            and ``doc_ids``). Anything else raises ``ValueError``.
        sparse_fwd, sparse_dq, sparse_dkdv: forced tiles of the block-sparse mode; block tables are built at them
            (:func:`~kernels.flash.sparse_tiles`). ``fwd`` and ``dq`` share one table, so their tiles must agree;
            ``sparse_dq`` alone also sets ``sparse_fwd``. ``BLOCK_M`` / ``BLOCK_N`` powers of two >= 16.
    """

    dq_mode: str = "separate"
    dkdv_split: Optional[int] = None
    deterministic: bool = False
    tma: Union[str, bool] = "auto"
    tma_min_pairs: int = 1 << 26
    sparse_aligned_no_gather: bool = True
    autotune: bool = False
    fwd_impl: str = "auto"
    fwd: Optional[TileConfig] = None
    dq: Optional[TileConfig] = None
    dkdv: Optional[TileConfig] = None
    sparse_fwd: Optional[TileConfig] = None
    sparse_dq: Optional[TileConfig] = None
    sparse_dkdv: Optional[TileConfig] = None
    bwd_impl: str = "auto"  # (last ones: positional construction of the fields above is unchanged)
    gluon_bwd_dq: str = "atomic"
    gluon_bwd_consumers: int = 1

    def __post_init__(self):
        if self.dq_mode not in DQ_MODES:
            raise ValueError(f"dq_mode={self.dq_mode!r} is not supported; allowed values: {', '.join(DQ_MODES)}")
        if self.dkdv_split is not None and not _positive_int(self.dkdv_split):
            raise ValueError(f"dkdv_split={self.dkdv_split!r} must be an integer >= 1 dividing the GQA group size "
                             "Hq // Hkv, or None (heuristic)")
        for name in ("deterministic", "sparse_aligned_no_gather", "autotune"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.deterministic and self.dq_mode == "atomic":
            raise ValueError("deterministic=True needs dq_mode='separate' (the atomic dQ adds fp32 partial sums in "
                             "an arbitrary order)")
        if self.fwd_impl not in FWD_IMPLS:
            raise ValueError(f"fwd_impl={self.fwd_impl!r} is not supported; allowed values: "
                             f"{', '.join(map(repr, FWD_IMPLS))}")
        if self.bwd_impl not in BWD_IMPLS:
            raise ValueError(f"bwd_impl={self.bwd_impl!r} is not supported; allowed values: "
                             f"{', '.join(map(repr, BWD_IMPLS))}")
        if self.gluon_bwd_dq not in GLUON_BWD_DQ:
            raise ValueError(f"gluon_bwd_dq={self.gluon_bwd_dq!r} is not supported; allowed values: "
                             f"{', '.join(map(repr, GLUON_BWD_DQ))}")
        c = self.gluon_bwd_consumers
        if (not isinstance(c, int) or isinstance(c, bool) or c not in GLUON_BWD_CONSUMERS
                or (c != 1 and self.gluon_bwd_dq == "atomic")):
            raise ValueError(f"gluon_bwd_consumers={self.gluon_bwd_consumers!r} is not supported with gluon_bwd_dq="
                             f"{self.gluon_bwd_dq!r}; allowed values: 1, 2 (2 only with gluon_bwd_dq='triton', "
                             "'gluon' or 'tma': the two-consumer kernel computes dK / dV, and dQ only by TMA)")
        if self.deterministic and self.bwd_impl == "gluon" and self.gluon_bwd_dq in GLUON_BWD_DQ_ATOMIC:
            raise ValueError("deterministic=True needs bwd_impl='triton', or bwd_impl='gluon' with "
                             f"gluon_bwd_dq='triton' or 'gluon' (bwd_impl='gluon' with gluon_bwd_dq="
                             f"{self.gluon_bwd_dq!r} adds its fp32 dQ partial sums with atomics, in an arbitrary "
                             "order)")
        if not (self.tma is True or self.tma is False or self.tma == "auto"):
            raise ValueError(f"tma={self.tma!r} is not supported; allowed values: 'auto', True, False")
        if not isinstance(self.tma_min_pairs, int) or isinstance(self.tma_min_pairs, bool) or self.tma_min_pairs < 0:
            raise ValueError(f"tma_min_pairs={self.tma_min_pairs!r} must be an integer >= 0")
        for name in _TILE_FIELDS:
            object.__setattr__(self, name, TileConfig.of(getattr(self, name), name))
        for name in _TILE_FIELDS:  # tl.arange and tl.dot take powers of two >= 16, dense and sparse modes alike
            t = getattr(self, name)
            for side in ("block_m", "block_n"):
                if t is not None and (getattr(t, side) < 16 or getattr(t, side) & (getattr(t, side) - 1)):
                    raise ValueError(f"{name}: {side.upper()}={getattr(t, side)} must be a power of two >= 16")
        if self.sparse_dq is not None:
            if self.sparse_fwd is None:  # the table is keyed by the forward's tiles
                object.__setattr__(self, "sparse_fwd", self.sparse_dq)
            elif (self.sparse_fwd.block_m, self.sparse_fwd.block_n) != (self.sparse_dq.block_m, self.sparse_dq.block_n):
                raise ValueError(f"sparse_dq tiles {self.sparse_dq.block_m}x{self.sparse_dq.block_n} must equal the "
                                 f"sparse_fwd tiles {self.sparse_fwd.block_m}x{self.sparse_fwd.block_n} (one table)")
        # hashed once: the launch plans' keys hold the config, and a hash per call would cost host time
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self))))
        d = {}
        for f in dataclasses.fields(self):  # the key (custom-op argument) once too: an attribute read per call
            v = getattr(self, f.name)
            if v != f.default:
                d[f.name] = dataclasses.astuple(v) if isinstance(v, TileConfig) else v
        object.__setattr__(self, "_key", json.dumps(d, sort_keys=True))

    def __hash__(self) -> int:
        return self._hash

    def replace(self, **changes) -> "FlashConfig":
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes) if changes else self

    def tile(self, kind: str, sparse: bool) -> Optional[TileConfig]:
        """The forced tile of kernel ``kind`` ("fwd", "dq", "dkdv") in the sparse or the dense modes, if any."""
        return getattr(self, ("sparse_" if sparse else "") + kind)

    @property
    def key(self) -> str:
        """A string that :meth:`from_key` turns back into this config (the custom op's argument)."""
        return self._key

    @staticmethod
    def from_key(key: str) -> "FlashConfig":
        return _from_key(key)


@functools.lru_cache(maxsize=256)
def _from_key(key: str) -> FlashConfig:
    return FlashConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(key).items()})


DEFAULT = FlashConfig()
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("attn_zoo_flash_config", default=DEFAULT)


def current_flash_config() -> FlashConfig:
    """The settings a call without ``config=`` uses: the innermost :func:`flash_settings`, else ``FlashConfig()``.
    Under ``torch.compile`` they are read when the graph is traced (a compiled graph keeps them: pass ``config=``
    to compiled code that must switch settings)."""
    if torch.compiler.is_compiling():
        return _current_at_trace()
    return _CURRENT.get()


@torch.compiler.assume_constant_result
def _current_at_trace() -> FlashConfig:
    return _CURRENT.get()  # dynamo cannot trace ContextVar.get: called once while tracing, a constant of the graph


def resolve_config(config: Optional[FlashConfig]) -> FlashConfig:
    """``config``, or the current settings when ``None``."""
    if config is None:
        return current_flash_config()
    if not isinstance(config, FlashConfig):
        raise TypeError(f"config must be a kernels.FlashConfig, got {type(config).__name__}")
    return config


@contextlib.contextmanager
def flash_settings(config: Optional[FlashConfig] = None, **changes) -> Iterator[FlashConfig]:
    """Run the block with ``config`` (default: the current settings) with ``changes`` as the settings of every
    :func:`~kernels.flash.flash_attn` call that passes no ``config=`` (benchmarks, a training run)::

        with kernels.flash_settings(dq_mode="atomic", tma=False):
            out = model(x)

    The settings live in a context variable (per thread / task), restored when the block ends. Yields the config.
    """
    cfg = resolve_config(config).replace(**changes)
    token = _CURRENT.set(cfg)
    try:
        yield cfg
    finally:
        _CURRENT.reset(token)

