"""Launch policy of the exact-attention kernels: tile tables, the config each launch uses, launch plans, TMA.

Which config a launch uses follows from its :class:`~kernels.flash.FlashConfig` and its signature only: a forced
tile of the config, else (``config.autotune``) Triton's autotuner, else the first heuristic candidate that
compiles. The module-level dicts below are caches keyed by everything that decides their values (signature and
config): launch plans, remembered candidates, autotuners, per-device dummies; :func:`clear_caches` empties them.
"""

from __future__ import annotations

import types
import warnings

import torch
import triton

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older triton: pointer loads only
    TensorDescriptor = None

from .._host import CompiledLaunch, cdiv, check_sink_size, next_pow2
from .common import INTERPRET, MAX_HEAD_DIM, _cfg
from .config import FlashConfig
from .sparse import _sparse_configs, sparse_tiles

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# kind ("fwd", "dq", "dkdv", "pre") -> @triton.jit kernel; filled by fwd.py / bwd.py when they are imported
KERNELS = {}


# ============================================================================================ configs
if INTERPRET:
    # the interpreter runs every program in numpy: one small config, BLOCK_M != BLOCK_N to exercise both paths
    _FWD_CONFIGS = [_cfg(32, 16, 4, 1)]
    _DQ_CONFIGS = [_cfg(32, 16, 4, 1)]
    _DKDV_CONFIGS = [_cfg(16, 32, 4, 1)]
else:
    _FWD_CONFIGS = [
        _cfg(128, 128, 8, 2), _cfg(128, 64, 8, 3), _cfg(128, 64, 4, 3), _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 2),
    ]
    _DQ_CONFIGS = [_cfg(128, 64, 8, 2), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 3), _cfg(64, 32, 4, 2)]
    _DKDV_CONFIGS = [_cfg(64, 128, 8, 2), _cfg(32, 128, 4, 3), _cfg(64, 64, 4, 3), _cfg(32, 64, 4, 2)]

_SMEM_BUDGET = 220 * 1024


def _smem_bytes(cfg, block_d, elt, kind):
    bm, bn, s = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], max(cfg.num_stages, 1)
    if kind == "fwd":  # q resident, k and v pipelined
        return elt * block_d * (bm + 2 * bn * s)
    if kind == "dq":  # q, do resident; k, v pipelined
        return elt * block_d * (2 * bm + 2 * bn * s)
    return elt * block_d * (2 * bn + 2 * bm * s)  # dkdv: k, v resident; q, do pipelined


def _make_prune(kind: str, config: FlashConfig):
    def prune(configs, named_args, **kwargs):
        args = dict(named_args)
        args.update(kwargs)
        block_d = int(args.get("BLOCK_D", 64))
        sparse = bool(args.get("SPARSE", False))
        elt = 4 if args.get("DOT_PREC", "tf32") == "ieee" else 2
        out = []
        for c in configs:
            if sparse:
                f, b = sparse_tiles(block_d, config)
                want = b if kind == "dkdv" else f
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) != want:
                    continue
            if not INTERPRET and _smem_bytes(c, block_d, elt, kind) > _SMEM_BUDGET:
                continue
            out.append(c)
        if not out:  # never empty: smallest tile, fewest stages
            if sparse:
                f, b = sparse_tiles(block_d, config)
                bm, bn = b if kind == "dkdv" else f
                out = [_cfg(bm, bn, 4, 1)]
            else:
                out = [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages))]
                out = [_cfg(out[0].kwargs["BLOCK_M"], out[0].kwargs["BLOCK_N"], 4, 1)]
        return out

    return prune


_KEY = ["N_BUCKET", "BLOCK_D", "BLOCK_DV", "HAS_LEFT", "HAS_RIGHT", "SPARSE", "DOT_PREC", "DILATED", "DOCS", "SINK"]
_KEY_DKDV = _KEY + ["ATOMIC_DQ"]

# Launch policy. Default: one heuristic config per (kernel, head dim, mode, dtype) -- the first of a preference
# list that fits shared memory (ordered by the H200 autotune results in docs/kernels.md), so a new shape costs one
# compile. FlashConfig(autotune=True) autotunes over the whole list instead (the sparse mode fixes the tile and
# tunes warps / stages only, because its block table depends on the tile).
_CONFIGS = {"fwd": _FWD_CONFIGS, "dq": _DQ_CONFIGS, "dkdv": _DKDV_CONFIGS}
_TUNED = {}  # cache: (kind, sparse, sparse tiles) -> triton.autotune wrapper of the kernel


def _autotuning(config: FlashConfig) -> bool:
    return config.autotune and not INTERPRET


def _tuned(kind: str, sparse: bool, config: FlashConfig):
    key = (kind, sparse, (sparse_tiles(64, config), sparse_tiles(256, config)) if sparse else None)
    if key not in _TUNED:
        configs = list(_sparse_configs(kind, config, _CONFIGS[kind]) if sparse else _CONFIGS[kind])
        # dK/dV with the atomic dQ accumulates into DQA: restore it after every benchmarked run
        extra = dict(key=_KEY_DKDV, restore_value=["DQA"]) if kind == "dkdv" else dict(key=_KEY)
        _TUNED[key] = triton.autotune(configs, prune_configs_by={"early_config_prune": _make_prune(kind, config)},
                                      **extra)(KERNELS[kind])
    return _TUNED[key]


def autotune_results() -> dict:
    """What the autotuner chose so far (``FlashConfig(autotune=True)``): ``{(kind, sparse, sparse tiles): {tuning
    key: triton.Config}}``."""
    return {key: dict(getattr(tuner, "cache", {})) for key, tuner in _TUNED.items()}


#: the smallest padded head dim (BLOCK_D) whose TMA builds take ``_HEURISTIC_TMA``'s tiles; below it they take the
#: pointer loads' (``_HEURISTIC``). Only the dense forward differs: at D 64 its TMA tile (128 x 64, 4 warps, 2 stages)
#: ran 0.83-0.86x the pointer build (8 warps, 3 stages) at N 512 / 1k / 2k / 4k, H 16, and TMA with the 8-warp tile
#: 0.99-1.00x it (H100, 2026-12-07, forward TFLOP/s: 300 / 370 / 409 / 420 against 304 / 373 / 408 / 425;
#: results/h100/2026-12-07b/6-7, 2026-12-07c/short/tile_d64.csv): the tile, not the descriptors, cost it.
_TMA_TILES_MIN_D = 128


def _candidates(kind: str, block_d: int, sparse: bool, dot_prec: str, masked: bool, tma: bool,
                config: FlashConfig):
    """Heuristic configs in preference order, pruned to those that fit shared memory (first is used)."""
    if sparse:
        prefs = _sparse_configs(kind, config, _DKDV_CONFIGS if kind == "dkdv" else _FWD_CONFIGS)
    elif block_d <= 64 and kind in _HEURISTIC_SMALL_D:
        prefs = _HEURISTIC_SMALL_D[kind]
    else:
        # the TMA tiles were tuned at D 128; at D <= 64 a TMA build takes the pointer tiles (_TMA_TILES_MIN_D)
        table = _HEURISTIC_TMA if tma and block_d >= _TMA_TILES_MIN_D else _HEURISTIC
        prefs = table.get((kind, masked), table.get((kind, False)))
    return _make_prune(kind, config)(prefs, {"BLOCK_D": block_d, "SPARSE": sparse, "DOT_PREC": dot_prec})


def pick_config(kind: str, block_d: int, sparse: bool, dot_prec: str, masked: bool = False, tma: bool = False,
                config: FlashConfig = None):
    """The heuristic config ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` used without autotuning or a
    forced tile (``config``: its sparse tiles; default ``FlashConfig()``)."""
    c = _candidates(kind, block_d, sparse, dot_prec, masked, tma, config or FlashConfig())[0]
    return dict(BLOCK_M=c.kwargs["BLOCK_M"], BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps,
                num_stages=c.num_stages)


if INTERPRET:
    _HEURISTIC = {(k, False): _CONFIGS[k] for k in _CONFIGS}
    _HEURISTIC_TMA = _HEURISTIC
else:
    # (kind, masked-mode) -> preference list; H200 autotune at D=128: fwd at N=8192, dq / dkdv at causal N=16384
    # (lab/probe_flash.py --autotune, 2026-11-29; docs/kernels.md)
    _HEURISTIC = {
        ("fwd", False): [_cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 2),
                         _cfg(32, 32, 4, 1)],
        ("fwd", True): [_cfg(64, 64, 4, 3), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        ("dq", False): [_cfg(128, 64, 8, 4), _cfg(128, 64, 8, 3), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 2),
                        _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        # 64x64 / 4 warps / 2 stages: 3-4% over 64x128 / 8 / 3 in the TMA sweep at N = 8192 (a tie at causal
        # N = 16384 in the autotune before)
        ("dkdv", False): [_cfg(64, 64, 4, 2), _cfg(64, 128, 8, 3), _cfg(64, 128, 8, 2), _cfg(32, 64, 4, 2),
                          _cfg(32, 32, 4, 1)],
    }
    # with TMA-streamed operands (fewer registers per program: the 4-warp 128 x 64 forward no longer spills much);
    # H200 sweep at N = 8192, D = 128 (lab/probe_flash.py --tma-sweep, 2026-11-29; docs/kernels.md)
    _HEURISTIC_TMA = dict(_HEURISTIC)
    _HEURISTIC_TMA.update({
        ("fwd", False): [_cfg(128, 64, 4, 2), _cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(64, 64, 4, 2),
                         _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
        ("dq", False): [_cfg(128, 64, 8, 3), _cfg(128, 64, 8, 2), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 2),
                        _cfg(64, 32, 4, 2), _cfg(32, 32, 4, 1)],
    })

# head dims <= 64 (the small models' D = 32 / 64): dQ on 64 x 64 tiles, 4 warps, 3 stages -- 5-10% faster than the
# D = 128 choice (128 x 64, 8 warps) at causal N = 1024 / 4096, 16k tokens, H = 4 (H200 2026-12-01,
# lab/experiments/tile_sweep.py, results/h200/2026-12-01/tile_sweep.csv); the forward's and dK/dV's D = 128 choices were
# within 2-5% of the best there and stay.
_HEURISTIC_SMALL_D = {} if INTERPRET else {
    "dq": [_cfg(64, 64, 4, 3), _cfg(64, 64, 4, 2), _cfg(64, 32, 4, 3), _cfg(32, 32, 4, 1)],
}
# read-only: other tiles are a FlashConfig's forced tiles (or FlashConfig(autotune=True)), never an edit of these tables
_HEURISTIC, _HEURISTIC_TMA, _HEURISTIC_SMALL_D, _CONFIGS = (
    types.MappingProxyType({k: tuple(v) for k, v in t.items()})
    for t in (_HEURISTIC, _HEURISTIC_TMA, _HEURISTIC_SMALL_D, _CONFIGS))
_CHOSEN = {}  # cache: launch key (kind, dtype, sparse tiles, constexprs) -> the candidate that compiled (None: the
# TMA build failed, pointer loads)


def _launch_key(kind, meta, dtype, config: FlashConfig):
    """Key of a remembered config: the sparse mode's tiles are part of it (a tuning override changes them, and a
    config of other tiles would not match the block table)."""
    tiles = sparse_tiles(meta["BLOCK_D"], config) if meta["SPARSE"] else None
    return (kind, dtype, tiles) + tuple(sorted(meta.items()))


def _block_n_dkdv(meta, dtype, config: FlashConfig) -> int:
    """BLOCK_N the dK/dV launch will use (exact unless autotuning, where 128 is the estimate)."""
    if meta["SPARSE"]:
        return sparse_tiles(meta["BLOCK_D"], config)[1][1]
    if config.dkdv is not None:
        return config.dkdv.block_n
    if _autotuning(config):
        return 128
    key = _launch_key("dkdv", meta, dtype, config)
    if key in _CHOSEN:
        if _CHOSEN[key] is None:  # its TMA build failed: the launch will use pointer loads
            return _block_n_dkdv(dict(meta, TMA=False), dtype, config)
        return _CHOSEN[key]["BLOCK_N"]
    masked = bool(meta["HAS_LEFT"] or meta["HAS_RIGHT"])
    return _candidates("dkdv", meta["BLOCK_D"], False, meta["DOT_PREC"], masked, meta["TMA"],
                       config)[0].kwargs["BLOCK_N"]


def _descs(kind: str, tensors, meta, cfg):
    """The kernel's two streamed operands: TMA descriptors over the whole ``(B, H, N, D)`` tensors with a
    ``(1, 1, rows, D)`` box (rows = the tile streamed by the loop) when ``meta["TMA"]``, else the tensors
    themselves (unused placeholders of the pointer-load build)."""
    if not meta["TMA"]:
        return tuple(tensors)
    rows = cfg["BLOCK_M"] if kind == "dkdv" else cfg["BLOCK_N"]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, meta["BLOCK_D"]]) for t in tensors)


def _is_build_error(e: Exception) -> bool:
    """A compiler failure (Triton front end, an MLIR pass, ptxas), as opposed to a launch / runtime error."""
    msg = str(e).lower()
    return type(e).__name__ in ("CompilationError", "PTXASError") or "ptxas" in msg or "passmanager" in msg


def _tma_build_failed(kind: str, key, e: Exception) -> None:
    """Warn that the TMA build of ``kind`` failed and remember to use pointer loads for ``key``."""
    warnings.warn(f"attn_zoo flash: the TMA build of the {kind!r} kernel failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''}); using pointer loads", RuntimeWarning)
    _CHOSEN[key] = None


def _launch(kind: str, grid_axis1: int, n_rows: int, args, meta, streamed, config: FlashConfig):
    """Launch kernel ``kind`` over ``(cdiv(n_rows, tile), grid_axis1)`` programs (tile = BLOCK_N for dkdv).

    ``streamed``: the two tensors the kernel's loop streams (fwd / dq: k, v; dkdv: q, do), passed after ``args``
    as TMA descriptors when ``meta["TMA"]`` (see :func:`_descs`). Without autotuning the first heuristic
    candidate is used; a candidate the compiler rejects for lack of shared memory / registers
    (``OutOfResources``) is dropped and the next one is tried, once per key.
    """
    tile = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
    grid = lambda m: (cdiv(n_rows, m[tile]), grid_axis1)  # noqa: E731
    forced = config.tile(kind, bool(meta["SPARSE"]))
    if forced is not None:  # a tuning override: Triton's own launch path every time (no plan)
        cfg = forced.meta()
        KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        return None
    if _autotuning(config):  # the launcher makes TMA off under autotuning (descriptor boxes depend on the config)
        _tuned(kind, meta["SPARSE"], config)[grid](*args, *streamed, **meta)
        return None
    masked = bool(meta["HAS_LEFT"] or meta["HAS_RIGHT"])
    key = _launch_key(kind, meta, args[0].dtype, config)
    if key in _CHOSEN:
        cfg = _CHOSEN[key]
        if cfg is None:  # the TMA build of this key failed: pointer loads
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed, config)
        try:  # a new specialisation (alignment / unit-stride properties of the arguments) compiles again
            compiled = KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        except Exception as e:
            if not (meta["TMA"] and _is_build_error(e)):
                raise
            _tma_build_failed(kind, key, e)
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed, config)
        return compiled, cfg, meta
    err = None
    for c in _candidates(kind, meta["BLOCK_D"], meta["SPARSE"], meta["DOT_PREC"], masked, meta["TMA"], config):
        cfg = dict(BLOCK_M=c.kwargs["BLOCK_M"], BLOCK_N=c.kwargs["BLOCK_N"], num_warps=c.num_warps,
                   num_stages=c.num_stages)
        try:
            compiled = KERNELS[kind][grid](*args, *_descs(kind, streamed, meta, cfg), **meta, **cfg)
        except Exception as e:  # OutOfResources (shared memory / registers): try a smaller config
            if "out of resource" in str(e).lower() or type(e).__name__ == "OutOfResources":
                err = e
                continue
            if not (meta["TMA"] and _is_build_error(e)):
                raise
            _tma_build_failed(kind, key, e)
            return _launch(kind, grid_axis1, n_rows, args, dict(meta, TMA=False), streamed, config)
        _CHOSEN[key] = cfg
        return compiled, cfg, meta
    raise err


# Launch plans. A call's plan holds everything that follows from its signature -- shapes, strides, dtype, device,
# scale, window, dilation, sparse table shapes, pointer alignment and the FlashConfig -- namely the kernels' constexpr
# options, the dK/dV split and, once the first call has compiled them, the kernels themselves as
# ``CompiledLaunch`` objects. A repeated call (a training step, a benchmark loop) then allocates its outputs and
# launches, and nothing else: no checks, no config choice, no Triton argument binding (H200 machine, triton 3.6:
# host time of a causal bf16 fwd+bwd at N = 512 went from 702 us through Triton's launcher to 271 us, the
# forward's launch function from 81 to 23 us; results/h200/2026-12-01/host_profile.txt).
class _Plan:
    __slots__ = ("meta", "fast")

    def __init__(self, meta):
        self.meta = meta  # kind -> constexpr options (fwd / dkdv / dq) and the plan's own values
        self.fast = {}  # kind -> CompiledLaunch, or None where the normal path must run (override, interpreter)


_PLANS = {}
_MAX_PLANS = 512


def _aligned(*tensors) -> tuple:
    """Triton specialises pointers on 16-byte alignment: part of a plan's key."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _get_plan(key, build) -> _Plan:
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(build())
    return plan


def clear_plans() -> None:
    """Forget every launch plan (the next call of each signature builds its plan and compiles again)."""
    _PLANS.clear()


def launch_plans():
    """The launch plans, read-only: ``{signature key: plan}`` (``plan.meta``: constexprs per kernel; ``plan.fast``:
    kind -> ``(CompiledLaunch, config, constexprs)`` or ``None`` where Triton's own launch path runs)."""
    return types.MappingProxyType(_PLANS)


def clear_caches() -> None:
    """Empty every cache of this module: launch plans, remembered candidates (also the TMA build failures) and
    autotuners."""
    _PLANS.clear()
    _CHOSEN.clear()
    _TUNED.clear()


def _plan_launch(plan: _Plan, kind: str, grid_axis1: int, n_rows: int, args, meta, streamed, device,
                 config: FlashConfig):
    """Launch ``kind`` through the plan's compiled kernel, or through :func:`_launch` (first call, overrides,
    autotuning, interpreter, launch hooks), keeping what it compiled for the next call."""
    fast = plan.fast.get(kind)
    if fast is not None and fast[0].ready():
        launch, cfg, used = fast
        launch(*args, *(_descs(kind, streamed, used, cfg) if used.get("TMA") else streamed))
        return
    if kind == "pre":  # the backward's preprocess: one fixed config
        res = (KERNELS["pre"][(cdiv(n_rows, meta["BLOCK_M"]), grid_axis1)](*args, **meta), {}, meta)
    else:
        res = _launch(kind, grid_axis1, n_rows, args, meta, streamed, config)
    if kind in plan.fast or INTERPRET or res is None or device.type != "cuda":
        plan.fast.setdefault(kind, None)
        return
    compiled, cfg, used = res
    values = dict(used, **cfg)
    tile = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
    fn = KERNELS[kind]
    launch = CompiledLaunch.capture(fn, compiled, len(args) + len(streamed), values,
                                    (cdiv(n_rows, values[tile]), grid_axis1), device.index or 0)
    plan.fast[kind] = None if launch is None else (launch, cfg, used)


# ============================================================================================ host side
def _bucket(n: int) -> int:
    return 1 << max(int(n - 1).bit_length(), 4)


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed values: float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)} in (B, Hkv, Nk)")
    if k.shape[3] != D:
        raise ValueError(f"q and k head dims must agree (q D={D}, k D={k.shape[3]})")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported; allowed values: 1..{MAX_HEAD_DIM}")
    if not 1 <= v.shape[3] <= MAX_HEAD_DIM:  # v's head dim may differ from D (MLA)
        raise ValueError(f"v head dim Dv={v.shape[3]} (v.shape[3]) is not supported; allowed values: 1..{MAX_HEAD_DIM}")
    Hkv = k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv} (k.shape[1]) for grouped-query attention")
    if Nq < 1 or k.shape[2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Nq={Nq}, Nk={k.shape[2]}")


def sink_tokens(sink_size, win_left: int, layout=None, dilation: int = 1, documents=None) -> int:
    """The kernels' ``SINK`` constexpr for ``sink_size`` attention sinks (StreamingLLM, Xiao et al. 2023: keys
    ``j < sink_size`` pass the window's left edge; every other term of the mask still holds): ``sink_size``, or 0
    where it changes nothing (no left edge, ``win_left < 0``). A compile of its own per value (the tile loops' sink
    range is a constant); 0 runs the kernels as without sinks. Raises ``ValueError`` naming ``sink_size`` for a value
    other than an integer >= 0 (a bool included), and for sinks with a block-sparse ``layout``, ``dilation != 1``
    or ``documents`` (``doc_ids``), which the kernels do not combine with them."""
    sink = check_sink_size(sink_size)
    if sink:
        other = ("block_layout" if layout is not None else f"dilation={dilation!r}" if dilation != 1 else
                 "doc_ids" if documents is not None else None)
        if other is not None:
            raise ValueError(f"sink_size={sink} cannot be combined with {other}: attention sinks run with dense, "
                             f"causal and sliding-window masks only; allowed: sink_size=0 with block_layout, "
                             f"dilation != 1 or doc_ids")
    return sink if win_left >= 0 else 0


_DUMMIES = {}  # cache: device -> placeholder pointers of the dense modes
_CAPABILITY = {}  # cache: device -> compute capability (major)


def tma_ok(D: int, block_d: int, pairs: int, sparse: bool, config: FlashConfig, *tensors) -> bool:
    """Whether the kernels stream ``tensors`` with TMA descriptors (``TMA`` constexpr). ``config.tma``:
    ``"auto"`` (default) on a CUDA device of compute capability >= 9 (Hopper) for dense / causal / window masks
    whose visited query-key ``pairs`` (an estimate) reach ``config.tma_min_pairs``; ``True`` always (also
    under the interpreter, for tests); ``False`` never. Descriptors cost host time at every launch (~0.1 ms per
    kernel on the H200 machine, ``lab/experiments/host_time.py``): below that size and for the short block-sparse
    kernels they cost more than they save. Either way only when the head dim is a power of two >= 16
    (``D == block_d``), not autotuning, and every tensor meets TMA's layout rules: unit last stride, 16-byte
    aligned base and other strides. Otherwise the kernels use pointer loads (same results)."""
    mode = config.tma
    if mode is False or TensorDescriptor is None or _autotuning(config) or D != block_d:
        return False
    dev = tensors[0].device
    if mode == "auto":
        if INTERPRET or dev.type != "cuda" or sparse or pairs < config.tma_min_pairs:
            return False
        if dev not in _CAPABILITY:
            _CAPABILITY[dev] = torch.cuda.get_device_capability(dev)[0]
        if _CAPABILITY[dev] < 9:
            return False
    for t in tensors:
        el = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(st <= 0 or (st * el) % 16 for st in t.stride()[:-1]):
            return False
    return True


def streams_by_tma(q, k, v, win_left: int, win_right: int, layout, config: FlashConfig, *streamed) -> bool:
    """Whether a Triton kernel of the call ``q, k, v`` (mask as :func:`kernels.flash.flash_attn_fwd` takes it) streams
    the tensors ``streamed`` by TMA descriptors (its ``TMA`` constexpr): :func:`tma_ok` over the call's
    :func:`visited_pairs`, only when ``Dv == D``. The one rule of the forward (K / V), dQ (K / V) and dK/dV (Q / dO)
    launches and of :func:`kernels.flash.resolve_fwd_tma` / ``resolve_bwd_tma``."""
    B, Hq, Nq, D = q.shape
    pairs = visited_pairs(B, Hq, Nq, k.shape[2], win_left, win_right)
    return v.shape[3] == D and tma_ok(D, max(16, next_pow2(D)), pairs, layout is not None, config, *streamed)


def _clamped_sum(n: int, cap: int) -> int:
    """``sum(min(x, cap) for x in range(1, n + 1))`` in O(1) (0 for ``n <= 0``)."""
    if n <= 0:
        return 0
    if n <= cap:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def _pairs_up_to(Nq: int, Nk: int, d: int) -> int:
    """``#{(i, j): 0 <= i < Nq, 0 <= j < Nk, j <= i + Nk - Nq + d}``: row ``i`` (absolute position ``i + Nk - Nq``)
    keeps ``clamp(i + Nk - Nq + d + 1, 0, Nk)`` keys, consecutive integers over the rows."""
    return _clamped_sum(Nk + d, Nk) - _clamped_sum(Nk - Nq + d, Nk)


def visited_pairs(B: int, Hq: int, Nq: int, Nk: int, win_left: int, win_right: int) -> int:
    """Visited query-key pairs of a dense / causal / window problem (``win_left`` / ``win_right`` < 0: no such edge;
    causal is ``win_right = 0``), bottom-right aligned (query row ``i`` at position ``i + Nk - Nq``): what the
    ``"auto"`` thresholds compare (:func:`tma_ok`, the Gluon choices). Dense, one window edge (causal) and its
    absence: exactly the pairs the mask keeps (rows before the first key under a causal mask when ``Nq > Nk`` keep
    none). Both edges: ``min(left + right + 1, Nk)`` keys for every row that sees a key, the band the kernels'
    tiles walk away from the sequence ends (the pairs kept, plus the corners the band loses at the ends)."""
    if win_left >= 0 and win_right >= 0:
        rows = min(Nq, Nk + win_right)  # rows at positions >= -right see a key
        per_head = rows * min(Nk, win_left + win_right + 1)
    elif win_right >= 0:
        per_head = _pairs_up_to(Nq, Nk, win_right)
    elif win_left >= 0:
        per_head = Nq * Nk - _pairs_up_to(Nq, Nk, -win_left - 1)
    else:
        per_head = Nq * Nk
    return B * Hq * per_head


def _mode_args(q, layout, tables, documents=None):
    """The table / layout / document part of a launch's mask description (placeholders where absent)."""
    if q.device not in _DUMMIES:  # placeholder pointers of the dense modes (never read), one pair per device
        _DUMMIES[q.device] = (torch.zeros(1, dtype=torch.int32, device=q.device),
                              torch.zeros(1, dtype=torch.int8, device=q.device))
    dummy_i32, dummy_i8 = _DUMMIES[q.device]
    if layout is not None:
        idx, cnt, nfull = tables
        lay = layout.to(device=q.device, dtype=torch.int8).contiguous()
        return dict(sparse=True, idx=idx, cnt=cnt, nfull=nfull, stride_tbl=idx.stride(0), lay=lay,
                    lay_nb=lay.shape[0], doc=dummy_i32 if documents is None else documents)
    return dict(sparse=False, idx=dummy_i32, cnt=dummy_i32, nfull=dummy_i32, stride_tbl=0, lay=dummy_i8, lay_nb=1,
                doc=dummy_i32 if documents is None else documents)


def _bnhd_empty(B: int, H: int, N: int, D: int, dtype, device) -> torch.Tensor:
    """An uninitialised ``(B, H, N, D)`` tensor stored as ``(B, N, H, D)``: the layout of the model's projections,
    so the attention output turns into ``(B, N, H * D)`` without a copy (the layout FlashAttention and SDPA return
    too). The forward's output always uses it, the gradients on the custom-op path too (see ``flash_attn_bwd``)."""
    return torch.empty_strided((B, H, N, D), (N * H * D, D, H * D, 1), dtype=dtype, device=device)
