"""Speed / memory sweep: variants x backends x N x D x causal x Hkv, and a layer/model-level sweep.

Every point is one row of a CSV (:data:`COLUMNS`) appended as soon as it is measured, so an interrupted sweep
loses nothing: with ``resume=True`` finished points (any status) are skipped when they were measured with the same
settings (the ``settings`` column, :func:`point_settings`); a CSV holding rows of other settings is refused
(:class:`SweepSettingsChanged`, naming them), never reported as this sweep's. A point that runs out of memory
(``status="oom"``), fails (``"error"``, message in ``error``), is not supported by the backend
(``"unsupported"``) or is skipped because the same series already failed / got too slow at a smaller N
(``"skipped"``) is recorded as a row and the sweep continues.

Timing: forward (under ``no_grad``), backward (``retain_graph`` backward of one forward; where a compiled
backward refuses the repeat, ``fwd_bwd - fwd``, noted in ``error``) and forward+backward
medians, from CUDA events on a GPU (:func:`eval.bench_common.time_cuda`) and ``time.perf_counter`` on a CPU.
Peak memory: extra CUDA memory of one forward (no grad) and of one forward+backward
(:func:`eval.bench_common.peak_memory`); on a CPU it is not measured (NaN) and the model columns
(:mod:`attn_zoo.cost_model`) stand in. Achieved TFLOP/s use the FLOPs of the cost model (the FA2 convention
for softmax kinds: ``4 N^2 D`` forward times the visited fraction; backward ``2.5 x``).

Backends (``backends:`` in the sweep config): names in the backend registry (:mod:`attn_zoo.registry`), timed
through the registered implementation (:meth:`attn_zoo.registry.Backend.bind`: availability and ``supports()``
first; a backend that cannot run a point records ``status="unsupported"`` with the reason). ``all`` (or no
``backends:`` key) = every registered backend. Built in:
    ``triton`` / ``torch`` / ``reference``: the product backends (``triton`` = ours).
    ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``: ``F.scaled_dot_product_attention``
        pinned to one SDPA kernel (exact causal / full attention; windows and layouts are not expressible).
    ``flex``: ``torch.compile(flex_attention)`` with a ``BlockMask`` built from the spec's
        :class:`attn_zoo.MaskInfo` element rule (softmax kinds).
    ``naive``: standard attention in the input dtype that materialises S and P ([FA1] Algorithm 0); for the
        linear kind the masked quadratic form ``(phi(Q) phi(K)^T * M) V``.
    ``fa2`` / ``fa3`` / ``fla``: FlashAttention-2 / -3 and flash-linear-attention where installed.
    ``fa4`` / ``flex_fa4``: FlashAttention-4 (``flash_attn.cute``) and FlexAttention on its FA4 kernels
        (``kernel_options={"BACKEND": "FLASH"}``), ``pip install -e .[fa4]``; missing: ``status="unsupported"``
        with the package and the extra in ``error``.

Repeats and correctness (for ``compare=best``, :mod:`eval.best`): ``repeats: R`` times every mode R times (each a
median as above; the column is their median, ``<mode>_ms_reps`` keeps all R for the bootstrap intervals of n*);
``bench_at_least: false`` keeps do_bench's ``warmup`` / ``rep`` windows as given (a budgeted run); ``check: true``
compares each backend's output on the timed inputs at ``check_rows`` query rows with the fp32 reference
(``check_err``, ``check_ok`` against ``check_tol``, default by dtype: :data:`CHECK_TOL`; :func:`check_point`).

Plugins (``plugins:`` in the sweep config, ``--plugins a,b`` on the command line, ``+sweep.plugins=[a]`` for
:mod:`eval.crossover`): modules imported before the sweep; every backend they register
(``attn_zoo.register_backend``) is added to the backends axis of the kernel and model sweeps, with no edit here.

Plain-Python entry (no Hydra needed): ``python -m eval.sweep --config eval/conf/sweep/cpu_tiny.yaml --out DIR``.
The Hydra entry that also detects crossovers, plots and logs to W&B is :mod:`eval.crossover`.

Why the grid, the ``exclude`` rules, ``run_last``, ``resume`` and ``deadline_s`` are here and not Hydra's sweeper
(``-m a=1,2 b=x,y`` / ``hydra.sweeper.params``): the basic sweeper makes the Cartesian product of its overrides and
cannot leave combinations out (``speed_h200``: 245 combinations, 108 after its seven ``exclude`` rules). Every
combination would be a Hydra job: its own composed config and folder (``.hydra/``, a log), about 0.4 s even with the
in-process basic launcher (a no-op app, 200 jobs: 88 s on 2 CPU cores), and under the joblib / submitit launchers
other processes (each pays torch import, CUDA init, Triton compiles: seconds), against ~1 s of GPU work per point.
And jobs share no state, while the sweep needs it: a series stops growing N after an OOM or a too-slow point,
``deadline_s`` bounds the whole sweep with ``run_last`` backends cut first, ``resume`` skips the points already in
the one CSV. Hydra composes and overrides the sweep config (``sweep=cpu_tiny 'sweep.seq_lens=[32,64]'
'~sweep.variants.gqa'``) and ``-m`` runs whole sweeps (``-m sweep=cpu_tiny,speed_h200``: one job per sweep, each
resumable in its own ``out_dir``). docs/crossover.md has the same reasons.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, replace
from collections import abc
from collections.abc import Mapping
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from attn_zoo import AttentionSpec, make_spec, mask_info
from attn_zoo import cost_model as cm
from attn_zoo.registry import Unsupported as _RegistryUnsupported
from attn_zoo.registry import backend_names, backends_from, get_backends, load_plugins

MODES = ("fwd", "bwd", "fwd_bwd")
POINT_KEYS = ("variant", "backend", "seq_len", "head_dim", "causal", "n_kv_heads")
COLUMNS = (
    "sweep", "variant", "kind", "backend", "seq_len", "head_dim", "causal", "n_kv_heads", "n_heads", "batch",
    "dtype", "device", "status", "error",
    "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_peak_mem_bytes", "peak_mem_bytes",
    "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "flops_fwd", "flops_fwd_bwd",
    "model_hbm_bytes", "model_min_bytes", "model_footprint_bytes", "visited_fraction", "tokens",
    "us_per_token", "timestamp",
    # repeated timings (cfg ``repeats`` > 1: every median of the repeats, ';'-joined) and the correctness check
    # (cfg ``check``: the backend's output at check_rows query rows against the fp32 reference)
    "fwd_ms_reps", "bwd_ms_reps", "fwd_bwd_ms_reps", "check_rows", "check_err", "check_ok",
    # every setting that changes the point's measurement besides its key (JSON; :func:`point_settings`): what
    # ``resume`` compares before it reuses the row
    "settings",
)
MODEL_COLUMNS = (
    "sweep", "variant", "backend", "seq_len", "batch", "d_model", "n_layer", "n_heads", "params", "dtype", "device",
    "status", "error", "train_step_ms", "train_tokens_per_s", "train_peak_mem_bytes",
    "infer_ms", "infer_tokens_per_s", "infer_peak_mem_bytes", "timestamp", "settings",
)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class CudaContextLost(RuntimeError):
    """A point left the CUDA context unusable (illegal address, device-side assert, launch failure): the point is
    recorded as ``error`` and :func:`run_sweep` stops; a new process resumes after it (``python -m eval.sweep`` exits
    with code 3)."""


_STICKY = ("illegal memory access", "device-side assert", "unspecified launch failure", "illegal instruction",
           "misaligned address", "cuda error: an illegal")


def is_sticky_cuda_error(message: str) -> bool:
    """True for the CUDA errors after which every later call in the process fails too."""
    m = message.lower()
    return any(s in m for s in _STICKY)


class Unsupported(Exception):
    """A backend cannot run this point (recorded as ``status="unsupported"``)."""


def is_oom(e: BaseException) -> bool:
    """True for CUDA / CPU out-of-memory errors (``torch.OutOfMemoryError`` or an OOM ``RuntimeError``)."""
    if isinstance(e, getattr(torch, "OutOfMemoryError", ())) or isinstance(e, MemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


# --------------------------------------------------------------------------------------------- bench backends
@dataclass
class BenchBackend:
    """``build(spec, q, k, v) -> fn(q, k, v) -> out``; raises :class:`Unsupported` when it cannot run."""

    name: str
    build: Callable


def registry_build(name: str) -> Callable:
    """``build(spec, q, k, v)`` of registry backend ``name``: its implementation bound to the point
    (:meth:`attn_zoo.registry.Backend.bind`), or :class:`Unsupported` with the reason."""

    def build(spec, q, k, v):
        b = get_backends(spec.kind).get(name)
        if b is None:
            raise Unsupported(f"backend {name!r} is not registered for kind {spec.kind!r}")
        try:
            return b.bind(spec, q, k, v)
        except _RegistryUnsupported as e:
            raise Unsupported(str(e)) from None

    return build


class _BenchBackends(Mapping):
    """``name -> BenchBackend``: every registry backend, plus sweep-only builders (:func:`register_bench_backend`,
    e.g. the test doubles of the pipeline tests), which win on a name clash."""

    def __init__(self):
        self.extra: Dict[str, BenchBackend] = {}

    def __getitem__(self, name: str) -> BenchBackend:
        if name in self.extra:
            return self.extra[name]
        if name in backend_names():
            return BenchBackend(name, registry_build(name))
        raise KeyError(name)

    def __iter__(self):
        return iter(list(dict.fromkeys(backend_names() + list(self.extra))))

    def __len__(self) -> int:
        return len(list(iter(self)))


BENCH_BACKENDS = _BenchBackends()


def register_bench_backend(name: str):
    """Decorator: a sweep-only backend ``build(spec, q, k, v) -> callable(q, k, v)`` (test doubles; a real backend
    is registered with ``attn_zoo.register_backend`` and so runs everywhere: ``attention()``, sweeps, benchmarks)."""

    def deco(fn):
        BENCH_BACKENDS.extra[name] = BenchBackend(name, fn)
        return fn

    return deco


def sweep_backends(cfg: dict) -> List[str]:
    """The backends axis: ``cfg["backends"]`` (``all`` / missing = every registered backend), then every backend
    registered by ``cfg["plugins"]`` (imported here) that is not listed yet."""
    plugins = load_plugins(cfg.get("plugins"))
    listed = cfg.get("backends", "all")
    names = backend_names() if listed in (None, "all") else [str(b) for b in _as_list(listed)]
    return names + [n for n in backends_from(plugins) if n not in names]


# --------------------------------------------------------------------------------------------- config
def variant_specs(variants) -> Dict[str, AttentionSpec]:
    """``{name: spec}`` from the sweep config's ``variants`` mapping (``name: {kind: ..., ...}``) or list of
    names of ``conf/attention/<name>.yaml``-like dicts. ``_target_`` keys are ignored."""
    out = {}
    items = variants.items() if hasattr(variants, "items") else [(v["name"], v) for v in variants]
    for name, kw in items:
        kw = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in dict(kw or {}).items()
              if k != "_target_"}
        kw.setdefault("name", name)
        try:
            out[name] = make_spec(**kw)
        except (ValueError, TypeError) as e:
            raise ValueError(f"variants.{name}: {e}") from None
    return out


def _as_list(x) -> list:
    if x is None:
        return [None]
    if isinstance(x, (list, tuple)):
        return list(x)
    try:  # omegaconf ListConfig
        return list(x)
    except TypeError:
        return [x]


NUMERIC_AXES = ("seq_len", "head_dim", "n_kv_heads")


def exclude_rules(cfg: dict) -> List[dict]:
    """The ``exclude:`` rules of a sweep config as plain dicts. ``ValueError`` naming the rule for a key that is not
    an axis (a misspelt key would otherwise drop nothing, silently)."""
    allowed = set(POINT_KEYS) | {f"{b}_{a}" for b in ("min", "max") for a in NUMERIC_AXES}
    rules = [dict(r) for r in (cfg.get("exclude") or [])]
    for r in rules:
        bad = sorted(set(r) - allowed)
        if bad:
            raise ValueError(f"exclude rule {r}: unknown key(s) {bad}; allowed: {', '.join(POINT_KEYS)}, "
                             f"min_/max_ of {', '.join(NUMERIC_AXES)}")
    return rules


def rule_matches(rule: Mapping, point: dict) -> bool:
    """True when ``point`` matches every key of the ``exclude:`` rule: a list value matches any of its items,
    ``min_<axis>`` / ``max_<axis>`` are inclusive bounds, any other value must be equal. ``{}`` matches all."""
    for k, v in rule.items():
        if k.startswith("min_"):
            ok = point[k[4:]] >= v
        elif k.startswith("max_"):
            ok = point[k[4:]] <= v
        elif isinstance(v, abc.Sequence) and not isinstance(v, str):  # list / tuple / OmegaConf ListConfig
            ok = point[k] in list(v)
        else:
            ok = point[k] == v
        if not ok:
            return False
    return True


def expand_points(cfg: dict) -> List[dict]:
    """All sweep points of a config, in run order (series by series, N increasing).

    Axes: ``variants`` x ``backends`` (:func:`sweep_backends`: the listed ones and the plugins') x ``head_dims`` x
    ``causal`` x ``kv_heads`` x ``seq_lens``. A variant
    whose spec sets ``n_kv_heads`` / ``kv_group_size`` (GQA / MQA) uses that instead of the ``kv_heads`` axis
    (``null`` = ``n_heads``). ``exclude``: list of rules that drop points (:func:`rule_matches`: a point is dropped
    when it matches every key of a rule, e.g. ``{backend: flex, seq_len: [512, 2048]}``; list values mean "any of";
    ``min_seq_len`` / ``max_seq_len`` bounds). ``run_last``: backends whose points run after all others, in that
    order (e.g. ``[naive, flex]``: slow / compile-heavy ones last, so a ``deadline_s`` cuts those first).
    """
    specs = variant_specs(cfg["variants"])
    H = int(cfg.get("n_heads", 1))
    pts, seen = [], set()
    backends = sweep_backends(cfg)
    rules = exclude_rules(cfg)
    for vname, spec in specs.items():
        for backend in backends:
            for D in _as_list(cfg.get("head_dims", [64])):
                for causal in _as_list(cfg.get("causal", [True])):
                    for hkv in _as_list(cfg.get("kv_heads", [None])):
                        if spec.n_kv_heads is not None or spec.kv_group_size is not None:
                            hkv = spec.resolve_kv_heads(H)
                        hkv = H if hkv is None else int(hkv)
                        for N in sorted(int(n) for n in _as_list(cfg["seq_lens"])):
                            p = {"variant": vname, "backend": backend, "seq_len": N, "head_dim": int(D),
                                 "causal": bool(causal), "n_kv_heads": hkv}
                            if any(rule_matches(r, p) for r in rules):
                                continue
                            key = point_key(p)
                            if key not in seen:
                                seen.add(key)
                                pts.append(p)
    last = list(_as_list(cfg.get("run_last") or []))
    if last:  # stable: these backends' points go to the end (compile-heavy / slow ones, for deadlines)
        pts.sort(key=lambda p: last.index(p["backend"]) + 1 if p["backend"] in last else 0)
    return pts


def point_key(row: dict) -> tuple:
    """Identity of a point (what ``resume`` compares)."""
    def norm(k, v):
        if k in ("seq_len", "head_dim", "n_kv_heads"):
            return int(float(v))
        if k == "causal":
            return v if isinstance(v, bool) else str(v).lower() in ("true", "1")
        return str(v)

    return tuple(norm(k, row[k]) for k in POINT_KEYS)


def series_key(row: dict) -> tuple:
    """A point's series: its key without ``seq_len`` (a series stops growing N after a failure)."""
    k = point_key(row)
    return k[:2] + k[3:]


def _now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


def batch_for(cfg: dict, N: int) -> int:
    """``batch`` if set, else ``max(1, tokens // N)`` (constant tokens per step, the FlashAttention setup)."""
    if cfg.get("batch"):
        return int(cfg["batch"])
    return max(1, int(cfg.get("tokens", 16384)) // N)


# --------------------------------------------------------------------------------------------- csv io
from eval.bench_common import check_out_dirs_or_exit, read_rows  # noqa: E402,F401 (read_rows: re-exported)
from eval.bench_common import name_list, number_type  # noqa: E402


# --------------------------------------------------------------------------------------------- resume: same settings
def spec_settings(spec: Optional[AttentionSpec]) -> Optional[dict]:
    """The fields of a variant's spec that differ from their defaults (``causal`` and ``name`` left out: the first is
    a point's key, the second changes no math); ``None`` for no spec."""
    if spec is None:
        return None
    import dataclasses

    out = {}
    for f in dataclasses.fields(spec):
        if f.name in ("causal", "name") or not f.compare:
            continue
        v = getattr(spec, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if v != default or f.name == "kind":
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def _device_settings(device: torch.device) -> dict:
    out = {"device": device.type}
    if device.type == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def point_settings(cfg: dict, p: dict, spec: Optional[AttentionSpec], device: torch.device) -> dict:
    """Every setting of the kernel sweep ``cfg`` that changes the measurement of point ``p`` besides its key
    (:data:`POINT_KEYS`): ``dtype``, ``device`` (and the GPU's name), ``n_heads``, ``batch`` (from ``tokens`` /
    ``batch``), ``modes``, ``warmup``, ``rep``, ``repeats``, ``bench_at_least``, ``seed``, ``check`` (with
    ``check_rows`` / ``check_tol``) and the variant's spec (:func:`spec_settings`). Stored in the ``settings``
    column of each row; ``resume`` reuses a row only when they all match (:func:`check_resume_settings`)."""
    s = {"dtype": str(cfg.get("dtype", "float32")), **_device_settings(device), "n_heads": int(cfg.get("n_heads", 1)),
         "batch": batch_for(cfg, int(p["seq_len"])), "modes": [m for m in MODES if m in _as_list(cfg.get("modes", list(MODES)))],
         "warmup": int(cfg.get("warmup", 2)), "rep": int(cfg.get("rep", 5)),
         "repeats": max(1, int(cfg.get("repeats") or 1)), "bench_at_least": bool(cfg.get("bench_at_least", True)),
         "seed": int(cfg.get("seed", 0)), "check": bool(cfg.get("check"))}
    if s["check"]:
        s["check_rows"] = int(cfg.get("check_rows") or 128)
        s["check_tol"] = None if cfg.get("check_tol") is None else float(cfg["check_tol"])
    if spec is not None:
        s["spec"] = spec_settings(spec)
    return s


def model_point_settings(cfg: dict, N: int, spec: Optional[AttentionSpec], device: torch.device) -> dict:
    """:func:`point_settings` of a model-sweep point: ``dtype``, ``device`` (GPU name), ``batch``, ``d_model``,
    ``n_layer``, ``n_heads``, ``vocab_size``, ``warmup``, ``rep`` and the variant's spec."""
    s = {"dtype": str(cfg.get("dtype", "float32")), **_device_settings(device), "batch": batch_for(cfg, int(N)),
         "d_model": int(cfg.get("d_model", 64)), "n_layer": int(cfg.get("n_layer", 2)),
         "n_heads": int(cfg.get("n_heads", 4)), "vocab_size": int(cfg.get("vocab_size", 256)),
         "warmup": int(cfg.get("warmup", 1)), "rep": int(cfg.get("rep", 3))}
    if spec is not None:
        s["spec"] = spec_settings(spec)
    return s


def settings_cell(settings: dict) -> str:
    """The ``settings`` CSV cell: compact JSON, keys sorted."""
    import json

    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


LEGACY_SETTINGS = ("dtype", "device", "n_heads", "batch", "d_model", "n_layer")
"""Columns compared for a row written before the ``settings`` column existed (the settings it recorded)."""


def stored_settings(row: dict) -> dict:
    """The settings a CSV row was measured with: its ``settings`` cell, else (an older CSV) the setting columns it has
    (:data:`LEGACY_SETTINGS`; the device as its type, ``cuda:0`` -> ``cuda``)."""
    import json

    cell = row.get("settings")
    if cell:
        try:
            return json.loads(cell)
        except ValueError:
            pass
    out = {}
    for k in LEGACY_SETTINGS:
        v = row.get(k)
        if v in (None, ""):
            continue
        if k == "device":
            v = str(v).split(":")[0]
        elif k != "dtype":
            try:
                v = int(float(v))
            except ValueError:
                continue
        out[k] = v
    return out


class SweepSettingsChanged(ValueError):
    """``resume`` found rows in the CSV measured with other settings than the sweep's (:func:`check_resume_settings`)."""


def check_resume_settings(rows: Sequence[dict], expected: Callable[[dict], dict], csv_path: str) -> None:
    """Raise :class:`SweepSettingsChanged` when a row of ``csv_path`` (the last row of each point) was measured with
    other settings than ``expected(row)`` gives, naming each differing setting (stored -> this sweep's, how many
    points) and what to do instead. A setting the row does not record (an older CSV) is not compared. Every row
    counts, not only the points of this sweep's grid: a re-analysis reads them all as one sweep."""
    diffs: Dict[str, Dict[tuple, int]] = {}
    n_bad = 0
    for r in rows:
        have, want = stored_settings(r), expected(r)
        bad = False
        for k in sorted(set(have) & set(want)):
            if k == "spec" and (have[k] is None or want[k] is None):
                continue
            if have[k] != want[k]:
                key = (settings_cell(have[k]) if isinstance(have[k], (dict, list)) else str(have[k]),
                       settings_cell(want[k]) if isinstance(want[k], (dict, list)) else str(want[k]))
                if k == "spec":
                    k = f"variants.{r.get('variant')}"
                elif k == "batch":
                    k = "batch (tokens // seq_len, or batch)"
                d = diffs.setdefault(k, {})
                d[key] = d.get(key, 0) + 1
                bad = True
        n_bad += bad
    if not n_bad:
        return
    lines = []
    for k, d in diffs.items():
        for (a, b), n in list(d.items())[:3]:
            lines.append(f"  {k}: {a} in the CSV, {b} now ({n} point{'s' if n != 1 else ''})")
        if len(d) > 3:
            lines.append(f"  {k}: ... {len(d) - 3} more value pairs")
    raise SweepSettingsChanged(
        f"resume: {n_bad} of the {len(rows)} points in {csv_path} were measured with other settings than this sweep's, "
        f"so they are not reused (nor reported as this sweep's):\n" + "\n".join(lines) + "\n"
        f"write these settings to another output folder (out_dir=... for eval.crossover, --out for eval.sweep), or "
        f"measure every point again in this one (resume=false / --no-resume: the CSV is started over)")


def columns_of(rows: Iterable[dict], columns: Sequence[str] = COLUMNS) -> List[str]:
    """The ``columns`` that some row of ``rows`` has (rows read from a CSV have every column of its header), in
    ``columns``' order; all of ``columns`` when there is no row. A table derived from a results CSV written by an
    older version (no ``settings`` column) keeps that CSV's columns instead of gaining empty ones."""
    have = set()
    for r in rows:
        have.update(r)
    return [c for c in columns if c in have] if have else list(columns)


def latest_rows(rows: Iterable[dict]) -> List[dict]:
    """One row per point (the last one written: ``retry_failed`` appends re-measured points)."""
    out: Dict[tuple, dict] = {}
    for r in rows:
        try:
            out[point_key(r)] = r
        except (KeyError, ValueError):
            continue
    return list(out.values())


def append_row(path: str, row: dict, columns: Sequence[str] = COLUMNS) -> None:
    """Append one row (header written when the file is new); flushed immediately, so an interrupted sweep keeps
    every measured point. Keys outside ``columns`` are dropped; None / NaN are written as empty cells."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if not new:  # resuming a CSV written with fewer columns (an older version): keep its header, cells aligned
        header = pd.read_csv(path, nrows=0).columns.tolist()
        if header and header != list(columns):
            columns = header
    pd.DataFrame([row], columns=list(columns), dtype=object).to_csv(path, mode="a", header=new, index=False,
                                                                    lineterminator="\r\n")


# --------------------------------------------------------------------------------------------- timing
def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_call_s(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one untimed call of ``fn`` (synchronised): the first call of a point pays for compilation and
    autotuning (``torch.compile``, Triton autotune), which :func:`run_sweep` keeps out of ``max_point_s``."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int = 2, rep: int = 5,
            grad_to_none: Optional[Sequence[torch.Tensor]] = None, at_least: bool = True) -> float:
    """Median time of ``fn()`` in ms: CUDA events (``eval.bench_common.time_cuda``; ``at_least=False`` keeps the
    ``warmup`` / ``rep`` windows in ms as given, for budgeted runs) on CUDA, otherwise ``time.perf_counter`` around
    ``rep`` calls after ``warmup`` calls."""
    if device.type == "cuda":
        from eval.bench_common import time_cuda

        return time_cuda(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, at_least=at_least)
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(max(rep, 1)):
        if grad_to_none is not None:
            for t in grad_to_none:
                t.grad = None
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(ts))


def peak_bytes(fn: Callable[[], object], device: torch.device) -> float:
    """Peak extra device memory of one ``fn()`` (CUDA); NaN on a CPU (not measurable cheaply)."""
    if device.type != "cuda":
        fn()
        return float("nan")
    from eval.bench_common import peak_memory

    return float(peak_memory(fn))


def _cleanup(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- correctness check
CHECK_TOL = {"float64": 1e-6, "float32": 5e-3, "float16": 1e-2, "bfloat16": 5e-2}


def reference_rows(spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   rows: torch.Tensor) -> Optional[torch.Tensor]:
    """fp32 reference output of the query ``rows`` of one sequence: ``q (Hq, N, D)``, ``k, v (Hkv, N, D)`` ->
    ``(Hq, len(rows), Dv)``, against every key (no ``N x N`` matrix: ``len(rows) x N`` per head). Softmax kinds: the
    spec's :class:`attn_zoo.MaskInfo` element rule (rows that see no key are 0); ``linear``: the masked quadratic form
    ``(phi(q) phi(k)^T * M) v / (row sum + eps)``. ``None`` for other families (not checked)."""
    N, rep = k.shape[1], q.shape[0] // k.shape[0]
    kk = k.float().repeat_interleave(rep, 0) if rep > 1 else k.float()
    vv = v.float().repeat_interleave(rep, 0) if rep > 1 else v.float()
    qr = q.float()[:, rows]
    i = rows.view(-1, 1).to(q.device)
    j = torch.arange(N, device=q.device).view(1, -1)
    if spec.is_softmax:
        allowed = mask_info(spec, q.shape[1], N).allowed(i, j)
        sc = (qr * spec.scale(q.shape[-1])) @ kk.transpose(-1, -2)
        p = torch.softmax(sc.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        return p @ vv
    if spec.family != "linear":
        return None
    from attn_zoo.feature_maps import apply_feature_map

    fq = apply_feature_map(qr, spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(kk, spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    a = fq @ fk.transpose(-1, -2)
    if spec.causal:
        a = a.masked_fill(j > i, 0.0)
    return (a @ vv) / (a.sum(-1, keepdim=True) + spec.eps)


def check_point(spec: AttentionSpec, fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cfg: dict) -> dict:
    """The correctness check of one point (sweep config ``check: true``), on the timed inputs themselves (no second
    compile): the forward's output of the first sequence at ``check_rows`` (default 128) query rows spread over
    ``0..N-1`` (the first and the last included) against :func:`reference_rows` in fp32, as ``check_err = max |out -
    ref| / max(1, max |ref|)``; ``check_ok`` when ``check_err <= check_tol`` (default by dtype: :data:`CHECK_TOL`).
    Never raises: a failing check is ``check_ok=False`` with the reason in the returned ``error``; a kind without a
    reference form is left unchecked (empty cells). What ``compare=best`` (:mod:`eval.best`) trusts."""
    N = q.shape[2]
    n_rows = min(N, int(cfg.get("check_rows") or 128))
    tol = float(cfg.get("check_tol") or CHECK_TOL[str(q.dtype).replace("torch.", "")])
    rows = torch.linspace(0, N - 1, n_rows, device=q.device).round().long().unique()
    try:
        with torch.no_grad():
            ref = reference_rows(spec, q[0], k[0], v[0], rows)
            if ref is None:
                return {}
            out = fn(q, k, v)
            out = (out[0] if isinstance(out, tuple) else out)[0][:, rows].float()
            err = float((out - ref).abs().max() / max(1.0, float(ref.abs().max())))
        return {"check_rows": len(rows), "check_err": err, "check_ok": bool(err <= tol)}
    except Exception as e:  # noqa: BLE001 - recorded, the timing stands
        first = "out of memory" if is_oom(e) else (str(e).splitlines()[0] if str(e) else "")
        return {"check_rows": len(rows), "check_err": float("nan"), "check_ok": False,
                "error": f"check: {type(e).__name__}: {first}"[:300]}


# --------------------------------------------------------------------------------------------- model columns
def element_fraction(spec: AttentionSpec, N: int) -> float:
    """Fraction of the ``N x N`` (query, key) pairs a softmax spec keeps (Nq = Nk = N): the variant's cost entry
    (:func:`attn_zoo.variants.element_fraction`: a formula for causal / window kinds, counted from the mask's block
    table for layouts, exact for N <= 4096)."""
    from attn_zoo.variants import element_fraction as fraction

    return fraction(spec, N)


def model_costs(spec: AttentionSpec, B: int, H: int, N: int, D: int, dtype_bytes: int, backend: str,
                n_kv_heads: Optional[int] = None) -> dict:
    """FLOPs (fwd / fwd+bwd), modelled HBM bytes, compulsory bytes and footprint of one point with ``H`` query and
    ``n_kv_heads`` K/V heads (default: the spec's, else ``H``): the variant's cost entry, which counts K/V per K/V
    head. The naive / reference / sdpa_math rows use standard attention per query head (those backends repeat K/V
    to every query head)."""
    hkv = cm.resolve_kv_heads(spec, H, n_kv_heads)
    f1 = cm.spec_cost(spec, B, H, N, D, dtype_bytes=dtype_bytes, mode="fwd", n_kv_heads=hkv)  # the variant's entry
    f2 = cm.spec_cost(spec, B, H, N, D, dtype_bytes=dtype_bytes, mode="fwd_bwd", n_kv_heads=hkv)
    if not spec.is_softmax:
        frac = float("nan")
        if backend in ("naive", "reference"):
            f2s = cm.standard_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode="fwd_bwd")
            return {"flops_fwd": f1.flops, "flops_fwd_bwd": f2.flops, "model_hbm_bytes": f2s.hbm_bytes,
                    "model_min_bytes": f2.compulsory_bytes, "model_footprint_bytes": f2s.footprint_bytes,
                    "visited_fraction": frac}
    else:
        frac = element_fraction(spec, N)
        masked = not mask_info(spec, N, N).is_full
        if masked:  # HBM traffic follows the visited tiles, not the kept elements
            bm, bn = int(f2.detail["block_m"]), int(f2.detail["block_n"])
            tiles = cm.mask_fractions(spec, N, bm, bn, elements=False)["visited_fraction"]
            t2 = cm.flash_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode="fwd_bwd", visited_fraction=tiles,
                                         block_m=bm, block_n=bn, Hkv=hkv)
            f2 = replace(f2, hbm_read=t2.hbm_read, hbm_write=t2.hbm_write)
        if backend in ("naive", "reference", "sdpa_math"):
            std = cm.standard_attention_cost(B, H, N, D, dtype_bytes=dtype_bytes, mode="fwd_bwd", mask_pass=masked)
            return {"flops_fwd": f1.flops, "flops_fwd_bwd": f2.flops, "model_hbm_bytes": std.hbm_bytes,
                    "model_min_bytes": f2.compulsory_bytes, "model_footprint_bytes": std.footprint_bytes,
                    "visited_fraction": frac}
    return {"flops_fwd": f1.flops, "flops_fwd_bwd": f2.flops, "model_hbm_bytes": f2.hbm_bytes,
            "model_min_bytes": f2.compulsory_bytes, "model_footprint_bytes": f2.footprint_bytes,
            "visited_fraction": frac}


def convention_flops(spec: AttentionSpec, B: int, H: int, N: int, D: int) -> Dict[str, float]:
    """FLOPs behind the ``*_tflops`` columns, per mode (``fwd``, ``bwd``, ``fwd_bwd``):
    :func:`attn_zoo.cost_model.flash_flops` (FlashAttention formula, kept pairs only) for softmax kinds,
    :func:`attn_zoo.cost_model.linear_flops` for linear -- the same convention as ``eval/bench_flash.py`` /
    ``bench_linear.py``, so their TFLOP/s compare directly."""
    if not spec.is_softmax:
        from attn_zoo.feature_maps import feature_dim

        Fd = feature_dim(spec.feature_map, D, spec.num_features)
        return {m: cm.linear_flops(B, H, N, D, F=Fd, chunk_size=spec.chunk_size, causal=spec.causal, mode=m)
                for m in MODES}
    frac = element_fraction(spec, N)
    return {m: cm.flash_flops(B, H, N, D, visited_fraction=frac, mode=m) for m in MODES}


# --------------------------------------------------------------------------------------------- one point
def measure_point(p: dict, spec: AttentionSpec, cfg: dict, device: torch.device) -> dict:
    """Measure one point; never raises (failures become the row's ``status`` / ``error``)."""
    H, N, D, hkv = int(cfg.get("n_heads", 1)), p["seq_len"], p["head_dim"], p["n_kv_heads"]
    B = batch_for(cfg, N)
    dtype = _DTYPES[str(cfg.get("dtype", "float32"))]
    spec = spec.replace(causal=p["causal"])
    row = dict(p, kind=spec.kind, n_heads=H, batch=B, dtype=str(dtype).replace("torch.", ""), device=str(device),
               tokens=B * N, status="ok", error="", timestamp=_now())
    try:
        row.update(model_costs(spec, B, H, N, D, torch.empty((), dtype=dtype).element_size(), p["backend"], hkv))
    except Exception as e:  # noqa: BLE001 - model columns are optional
        row["error"] = f"cost model: {type(e).__name__}: {e}"[:200]
    modes = [m for m in _as_list(cfg.get("modes", list(MODES))) if m in MODES]
    warmup, rep = int(cfg.get("warmup", 2)), int(cfg.get("rep", 5))
    repeats = max(1, int(cfg.get("repeats") or 1))
    at_least = bool(cfg.get("bench_at_least", True))

    timed_s = [0.0]  # wall seconds inside timed(): what max_point_s bounds (run_sweep)

    def timed(fn_, mode, **kw):  # median of `repeats` timings; every one kept in <mode>_ms_reps
        _sync(device)  # untimed work still queued (the check, a first call) is not counted here
        t0 = time.perf_counter()
        try:
            ts = [time_ms(fn_, device, warmup, rep, at_least=at_least, **kw) for _ in range(repeats)]
        finally:
            _sync(device)
            timed_s[0] += time.perf_counter() - t0
        if repeats > 1:
            row[f"{mode}_ms_reps"] = ";".join(f"{t:.6g}" for t in ts)
        return float(statistics.median(ts))

    q = k = v = dout = out = None
    try:
        g = torch.Generator(device=device).manual_seed(int(cfg.get("seed", 0)) + N)

        def rnd(*shape):  # drawn on the device: fresh random data, no host-to-device copy
            return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

        q, k, v = rnd(B, H, N, D), rnd(B, hkv, N, D), rnd(B, hkv, N, D)
        backend = BENCH_BACKENDS.get(p["backend"])
        if backend is None:
            raise Unsupported(f"unknown sweep backend {p['backend']!r}; known: {', '.join(BENCH_BACKENDS)}")
        fn = backend.build(spec, q, k, v)
        if cfg.get("check"):  # on these inputs, before any timing (a wrong result is named whatever else happens)
            chk = check_point(spec, fn, q, k, v, cfg)
            if chk.get("error"):
                row["error"] = "; ".join(x for x in (row.get("error"), chk.pop("error")) if x)
            row.update(chk)
        if "fwd" in modes:
            with torch.no_grad():
                first_call_s(lambda: fn(q, k, v), device)  # compile / autotune happen here (untimed)
                row["fwd_ms"] = timed(lambda: fn(q, k, v), "fwd")
                row["fwd_peak_mem_bytes"] = peak_bytes(lambda: fn(q, k, v), device)
        if "bwd" in modes or "fwd_bwd" in modes:
            for t in (q, k, v):
                t.requires_grad_(True)
            dout = rnd(B, H, N, D)

            def fwd_bwd():
                o = fn(q, k, v)
                o.backward(dout)
                return o

            if "fwd_bwd" in modes:
                first_call_s(fwd_bwd, device)  # the backward's compile / autotune (untimed)
                row["fwd_bwd_ms"] = timed(fwd_bwd, "fwd_bwd", grad_to_none=(q, k, v))
                for t in (q, k, v):
                    t.grad = None
                row["peak_mem_bytes"] = peak_bytes(fwd_bwd, device)
            if "bwd" in modes:
                try:
                    out = fn(q, k, v)
                    if "fwd_bwd" not in modes:  # the backward's compile / autotune (untimed; fwd_bwd paid it above)
                        first_call_s(lambda: out.backward(dout, retain_graph=True), device)
                        for t in (q, k, v):
                            t.grad = None
                    row["bwd_ms"] = timed(lambda: out.backward(dout, retain_graph=True), "bwd", grad_to_none=(q, k, v))
                except Exception as e:  # noqa: BLE001 - some compiled backwards refuse retain_graph
                    if is_oom(e) or not (row.get("fwd_bwd_ms") and row.get("fwd_ms")):
                        raise
                    row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
                    row["error"] = (f"bwd_ms = fwd_bwd_ms - fwd_ms (repeated backward failed: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
    except Unsupported as e:
        row.update(status="unsupported", error=str(e)[:300])
    except BaseException as e:  # noqa: BLE001 - record, continue
        if isinstance(e, KeyboardInterrupt):
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        row.update(status="oom" if is_oom(e) else "error", error=f"{type(e).__name__}: {first}"[:300])
        if row["status"] == "error" and cfg.get("verbose_errors", False):
            traceback.print_exc(limit=3)
    finally:
        q = k = v = dout = out = None
        row["_timed_s"] = timed_s[0]  # not a CSV column: all run_sweep holds against max_point_s
        _cleanup(device)
    try:  # TFLOP/s by the benchmarks' convention (matmul FLOPs; bwd 2.5x fwd exact, 2x linear)
        conv = convention_flops(spec, B, H, N, D)
    except Exception as e:  # noqa: BLE001 - derived columns are optional; this function never raises
        conv = {}
        row["error"] = (row.get("error") or "") + f" flops: {type(e).__name__}: {e}"[:200]
    for m in ("fwd", "bwd", "fwd_bwd"):
        ms, fl = row.get(f"{m}_ms"), conv.get(m)
        if ms and fl:
            row[f"{m}_tflops"] = fl / (ms * 1e-3) / 1e12
    main = row.get("fwd_bwd_ms") or row.get("fwd_ms")
    if main:
        row["us_per_token"] = main * 1e3 / (B * N)
    return row


# --------------------------------------------------------------------------------------------- the sweep
def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr)
    except ImportError:  # pragma: no cover
        return None


def check_sweep_device(cfg: dict) -> None:
    """``device=cuda`` (or ``cuda:<i>``) where no CUDA GPU is visible (a GPU sweep such as ``speed_h200`` on a CPU):
    ``ValueError`` naming the key and what to pass, before anything is written (it was a ``RuntimeError`` from
    :func:`run_sweep`, with its traceback, after the output folder was made)."""
    dev = cfg.get("device")
    if dev is not None and str(dev).split(":")[0] == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={dev!r}: no CUDA GPU is visible here; allowed values on this machine: cpu, null "
                         f"(cuda when available); a CPU sweep: sweep=cpu_tiny (eval/conf/sweep/cpu_tiny.yaml)")


SWEEP_KEYS = ("name", "variants", "backends", "plugins", "exclude", "seq_lens", "head_dims", "n_heads", "kv_heads",
              "causal", "modes", "dtype", "device", "tokens", "batch", "warmup", "rep", "repeats", "seed", "check",
              "check_rows", "check_tol", "deadline_s", "max_point_s", "bench_at_least", "run_last", "verbose_errors",
              "baseline", "naive", "extra_baselines", "fit_min_seq_len", "ours", "best_metric", "n_boot", "level",
              "model_sweep")
"""The keys a sweep config (``eval/conf/sweep/<name>.yaml``) may hold: those :func:`run_sweep`, :mod:`eval.crossover`
and :mod:`eval.best` read. Any other key (``+sweep.seq_len=[32]``, a typo of ``seq_lens``) would be ignored, the
default sweep run in its place: :func:`check_sweep_config` refuses it."""
MODEL_SWEEP_KEYS = ("enabled", "name", "variants", "backends", "plugins", "seq_lens", "tokens", "batch", "d_model",
                    "n_layer", "n_heads", "vocab_size", "dtype", "device", "warmup", "rep")
"""The keys of a sweep's ``model_sweep`` (:func:`run_model_sweep`, with ``enabled``); :func:`check_model_sweep_config`
refuses any other."""


def check_sweep_config(cfg: dict) -> None:
    """The axes and settings of a kernel sweep, before anything runs or is written: every key one of
    :data:`SWEEP_KEYS`, ``seq_lens`` / ``head_dims``
    non-empty lists of integers >= 1, ``n_heads`` an integer >= 1, ``kv_heads`` null or integers dividing it,
    ``causal`` bools, ``modes`` of :data:`MODES`, ``dtype`` of ``_DTYPES``, ``device`` cpu / cuda[:i], ``warmup``
    >= 0, ``rep`` >= 1, ``tokens`` >= 1, ``batch`` null or >= 1 (integers). Raises ``ValueError`` naming the key
    (bad values failed deep inside the run, or measured nothing and failed in a plot)."""
    def whole(x, lo):
        return isinstance(x, int) and not isinstance(x, bool) and x >= lo

    from harness.config import check_known_keys

    check_known_keys(cfg, SWEEP_KEYS, "a sweep")
    for key in ("seq_lens", "head_dims"):
        vals = _as_list(cfg.get(key, [64] if key == "head_dims" else None))
        if not vals or not all(whole(x, 1) for x in vals):
            raise ValueError(f"{key}={vals!r}: must be a non-empty list of integers >= 1")
    H = cfg.get("n_heads", 1)
    if not whole(H, 1):
        raise ValueError(f"n_heads={H!r}: must be an integer >= 1")
    kv = _as_list(cfg.get("kv_heads", [None]))
    if not kv or not all(x is None or (whole(x, 1) and H % x == 0) for x in kv):
        raise ValueError(f"kv_heads={kv!r}: must be a non-empty list, each entry null (= n_heads) or an integer "
                         f">= 1 that divides n_heads={H}")
    causal = _as_list(cfg.get("causal", [True]))
    if not causal or not all(isinstance(c, bool) for c in causal):  # []: no point, a sweep that measured nothing
        raise ValueError(f"causal={causal!r}: must be a non-empty list of true / false")
    modes = _as_list(cfg.get("modes", list(MODES)))
    if not modes or not all(m in MODES for m in modes):
        raise ValueError(f"modes={modes!r}: allowed values: {', '.join(MODES)}")
    dtype = str(cfg.get("dtype", "float32"))
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed values: {', '.join(_DTYPES)}")
    dev = cfg.get("device")
    if dev is not None and str(dev).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device={dev!r} is not supported; allowed values: cpu, cuda (or cuda:<index>), null (cuda "
                         f"when available)")
    for key, lo in (("warmup", 0), ("rep", 1), ("tokens", 1)):
        if key in cfg and not whole(cfg[key], lo):
            raise ValueError(f"{key}={cfg[key]!r}: must be an integer >= {lo}")
    if cfg.get("batch") is not None and not whole(cfg["batch"], 1):
        raise ValueError(f"batch={cfg['batch']!r}: must be null (tokens // N) or an integer >= 1")
    for key, what in (("max_point_s", "no limit"), ("deadline_s", "no deadline")):  # -1 cut every series / the
        val = cfg.get(key)  # whole sweep at its first point; 0 meant no limit: both silently
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 < val < math.inf):
            raise ValueError(f"{key}={val!r}: must be null ({what}) or a number of seconds > 0")
    known = list(BENCH_BACKENDS)  # after sweep_backends imported the plugins (their backends are registered)
    if not sweep_backends(cfg):  # backends=[]: no point, a sweep that measured nothing and exited 0
        raise ValueError(f"backends=[]: the sweep names no backend; allowed values: all, {', '.join(known)}")
    bad = [b for b in sweep_backends(cfg) if b not in known]
    if bad:  # a misspelt backend recorded every point as unsupported and measured nothing
        raise ValueError(f"backends={[str(b) for b in _as_list(cfg.get('backends'))]!r}: {', '.join(map(repr, bad))} "
                         f"{'is' if len(bad) == 1 else 'are'} not registered; allowed values: all, {', '.join(known)}")
    if not cfg.get("variants"):
        raise ValueError("variants: the sweep names no variant (a mapping name: {kind: ..., ...})")
    variant_specs(cfg["variants"])  # an unknown kind / field, named with its variant
    if not expand_points(cfg):  # every point dropped by the exclude rules: nothing would be measured
        raise ValueError(f"exclude={cfg.get('exclude')!r}: the rules drop every point of the sweep (variants x "
                         f"backends x head_dims x causal x kv_heads x seq_lens), so nothing would be measured")


def run_sweep(cfg: dict, out_csv: str, resume: bool = True, progress: bool = True, retry_failed: bool = False,
              deadline_s: Optional[float] = None) -> List[dict]:
    """Run (or resume) the kernel sweep described by ``cfg`` and append rows to ``out_csv``.

    Returns all rows of the CSV afterwards (as parsed dicts; a re-measured point appears again further down:
    readers keep the last row of a point, see :func:`latest_rows`). Series (same variant / backend / D / causal /
    Hkv) stop growing N after an OOM or error (later points: ``status="skipped"``) and after a point whose
    timed calls took longer than ``max_point_s`` seconds (only the wall time inside the timed calls counts; untimed
    work -- the correctness check, which is the backend's first call on the inputs, the first call of each mode
    where compilation and autotuning happen (:func:`first_call_s`), the peak-memory calls, the backward's setup
    forward -- does not). ``deadline_s`` (or ``cfg.deadline_s``):
    wall-clock budget; points not reached are left for a later ``resume``.

    Crash guard: the point being measured is written to ``<out_csv>.inflight`` first; a resume that finds it (the
    process died there: segfault, hang killed by a time limit) records that point as ``error`` and goes past it. A
    point whose error leaves the CUDA context unusable (:func:`is_sticky_cuda_error`) is recorded and then
    :class:`CudaContextLost` is raised, so that a new process resumes (one failing anchor does not fail the others).
    """
    check_sweep_config(cfg)
    check_sweep_device(cfg)
    device = torch.device(cfg.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(int(cfg.get("seed", 0)))
    try:  # compiled backwards (flex, torch.compile) donate buffers and then refuse the timed repeated backward
        import torch._functorch.config as _fc

        _fc.donated_buffer = False
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        pass
    specs = variant_specs(cfg["variants"])
    points = expand_points(cfg)
    done = {}
    if resume:
        stored = latest_rows(read_rows(out_csv))

        def expected(r: dict) -> dict:  # the settings this sweep would measure the row's point with
            return point_settings(cfg, {"seq_len": int(float(r["seq_len"]))}, specs.get(r.get("variant")), device)

        check_resume_settings(stored, expected, out_csv)  # before anything is written
        for r in stored:
            if retry_failed and r.get("status") in ("error", "oom", "skipped"):
                continue
            done[point_key(r)] = r
    elif os.path.exists(out_csv):
        os.remove(out_csv)
    todo = [p for p in points if point_key(p) not in done]
    if resume and os.path.exists(out_csv):
        print(f"resume: {len(points) - len(todo)} of {len(points)} points reused from {out_csv} (measured with the "
              f"same settings), {len(todo)} to measure", flush=True)
    bar = _progress(len(todo), progress, f"sweep {cfg.get('name', '')}")
    deadline_s = deadline_s if deadline_s is not None else cfg.get("deadline_s")
    t_start = time.time()
    max_point_s = float(cfg.get("max_point_s") or math.inf)
    stopped: Dict[tuple, str] = {}
    for r in done.values():  # a resumed series that already failed stays stopped
        if r.get("status") in ("oom", "error") or r.get("status") == "skipped":
            stopped[series_key(r)] = f"{r.get('status')} at N={r.get('seq_len')}"
    name = cfg.get("name", "sweep")

    def unmeasured(p: dict, status: str, error: str) -> dict:  # the row of a point not measured
        return dict(p, kind=specs[p["variant"]].kind, status=status, error=error, n_heads=cfg.get("n_heads"),
                    batch=batch_for(cfg, p["seq_len"]), dtype=str(cfg.get("dtype", "float32")), device=str(device),
                    sweep=name, timestamp=_now(), settings=settings_cell(point_settings(cfg, p, specs[p["variant"]],
                                                                                        device)))

    inflight = out_csv + ".inflight"  # the point being measured: a process that dies there leaves it behind
    if resume and os.path.exists(inflight):
        with open(inflight) as f:
            dead = dict(zip(POINT_KEYS, f.read().strip().split("\t")))
        os.remove(inflight)
        try:
            dkey = point_key(dead)
        except (KeyError, ValueError):
            dkey = None
        for p in [p for p in todo if point_key(p) == dkey]:  # recorded as failed: the next attempt goes past it
            append_row(out_csv, unmeasured(p, "error", "the process died while measuring this point (crash, hang "
                                                       "or time limit)"))
            stopped[series_key(p)] = f"error at N={p['seq_len']}"
            todo.remove(p)
    for p in todo:
        if deadline_s and time.time() - t_start > float(deadline_s):
            if bar is not None:
                bar.write(f"deadline of {deadline_s}s reached; {name}: resume later to finish")
            break
        series = series_key(p)
        if series in stopped:
            row = unmeasured(p, "skipped", f"series stopped: {stopped[series]}")
        else:
            t0 = time.time()
            with open(inflight, "w") as f:
                f.write("\t".join(str(p[k]) for k in POINT_KEYS))
            row = measure_point(p, specs[p["variant"]], cfg, device)
            row["sweep"] = name
            row["settings"] = settings_cell(point_settings(cfg, p, specs[p["variant"]], device))
            # only the timed calls count: the check, the first calls (compile / autotune), peak_bytes and the
            # bwd-mode setup forward are untimed, one-off work that does not stop a series
            took = float(row.pop("_timed_s", 0.0) or 0.0)
            setup = max(0.0, time.time() - t0 - took)
            if row["status"] in ("oom", "error"):
                stopped[series] = f"{row['status']} at N={p['seq_len']}"
            elif took > max_point_s:
                stopped[series] = (f"point took {took:.1f}s (+{setup:.1f}s first calls / untimed) > max_point_s={max_point_s} "
                                   f"at N={p['seq_len']}")
        append_row(out_csv, row)
        if os.path.exists(inflight):
            os.remove(inflight)
        if bar is not None:
            bar.set_postfix_str(f"{p['variant']}/{p['backend']} N={p['seq_len']} {row['status']}")
            bar.update(1)
        if row["status"] == "error" and device.type == "cuda" and is_sticky_cuda_error(row.get("error") or ""):
            raise CudaContextLost(f"{p['variant']}/{p['backend']} N={p['seq_len']}: {row['error']} -- the CUDA "
                                  f"context is unusable; the point is recorded, resume in a new process")
    if bar is not None:
        bar.close()
    return latest_rows(read_rows(out_csv))


# --------------------------------------------------------------------------------------------- model sweep
def check_model_sweep_config(cfg: dict) -> None:
    """The settings of a model sweep before it runs: ``seq_lens`` integers >= 1, ``dtype`` of ``_DTYPES``,
    ``backends`` ``auto`` or registered (after its ``plugins``), ``variants`` valid specs. ``ValueError`` naming the
    key and the allowed values; a key not in :data:`MODEL_SWEEP_KEYS` too."""
    from harness.config import check_known_keys

    check_known_keys(cfg, MODEL_SWEEP_KEYS, "a model sweep")
    vals = _as_list(cfg.get("seq_lens"))
    if not vals or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in vals):
        raise ValueError(f"seq_lens={vals!r}: must be a non-empty list of integers >= 1")
    dtype = str(cfg.get("dtype", "float32"))
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed values: {', '.join(_DTYPES)}")
    load_plugins(cfg.get("plugins"))
    known = backend_names()
    listed = [str(b) for b in _as_list(cfg.get("backends", ["auto"]))]
    bad = [b for b in listed if b != "auto" and b not in known]
    if not listed:  # backends=[]: the model sweep measured nothing, silently
        raise ValueError(f"backends=[]: the model sweep names no backend; allowed values: auto, {', '.join(known)}")
    if bad:
        raise ValueError(f"backends={listed!r}: {', '.join(map(repr, bad))} {'is' if len(bad) == 1 else 'are'} not "
                         f"registered; allowed values: auto, {', '.join(known)}")
    if not cfg.get("variants"):
        raise ValueError("variants: the model sweep names no variant")
    variant_specs(cfg["variants"])


def run_model_sweep(cfg: dict, out_csv: str, resume: bool = True, progress: bool = True) -> List[dict]:
    """Layer/model-level sweep: tokens/s and peak memory of the GPT (:mod:`attn_zoo.model`) with each variant.

    ``cfg`` keys: ``variants`` (as in the kernel sweep), ``backends`` (``auto`` or registered names; ``plugins``'
    backends are added), ``plugins``, ``seq_lens``, ``tokens`` (batch = tokens // N) or ``batch``, ``d_model``, ``n_layer``,
    ``n_heads``, ``vocab_size``, ``dtype``, ``warmup``, ``rep``. Measures one training step (forward + loss +
    backward, no optimiser) and one inference forward. Rows go to ``out_csv`` (:data:`MODEL_COLUMNS`).
    """
    from attn_zoo.model import GPT, GPTConfig

    check_model_sweep_config(cfg)
    device = torch.device(cfg.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    specs = variant_specs(cfg["variants"])
    dtype = _DTYPES[str(cfg.get("dtype", "float32"))]
    done = set()
    if resume:
        stored = read_rows(out_csv)
        check_resume_settings(stored, lambda r: model_point_settings(cfg, int(float(r["seq_len"])),
                                                                     specs.get(r.get("variant")), device), out_csv)
        done = {(r["variant"], r["backend"], int(float(r["seq_len"]))) for r in stored}
    elif os.path.exists(out_csv):
        os.remove(out_csv)
    plugins = load_plugins(cfg.get("plugins"))
    backends = [str(b) for b in _as_list(cfg.get("backends", ["auto"]))]
    backends += [n for n in backends_from(plugins) if n not in backends]
    pts = [(vn, be, int(N)) for vn in specs for be in backends
           for N in sorted(int(n) for n in _as_list(cfg["seq_lens"]))]
    todo = [p for p in pts if p not in done]
    if resume and done:
        print(f"resume: {len(pts) - len(todo)} of {len(pts)} model points reused from {out_csv} (measured with the "
              f"same settings), {len(todo)} to measure", flush=True)
    bar = _progress(len(todo), progress, f"model sweep {cfg.get('name', '')}")
    stopped = set()
    warmup, rep = int(cfg.get("warmup", 1)), int(cfg.get("rep", 3))
    for vn, be, N in todo:
        B = batch_for(cfg, N)
        row = {"sweep": cfg.get("name", "model"), "variant": vn, "backend": be, "seq_len": N, "batch": B,
               "d_model": cfg.get("d_model"), "n_layer": cfg.get("n_layer"), "n_heads": cfg.get("n_heads"),
               "dtype": str(dtype).replace("torch.", ""), "device": str(device), "status": "ok", "error": "",
               "timestamp": _now(), "settings": settings_cell(model_point_settings(cfg, N, specs[vn], device))}
        if (vn, be) in stopped:
            row.update(status="skipped", error="series stopped after a failure at a smaller N")
        elif be != "auto" and be not in get_backends(specs[vn].kind):
            row.update(status="unsupported", error=f"backend {be!r} is not registered for kind {specs[vn].kind!r}")
        else:
            model = idx = None
            try:
                gc_ = GPTConfig(vocab_size=int(cfg.get("vocab_size", 256)), n_layer=int(cfg.get("n_layer", 2)),
                                n_head=int(cfg.get("n_heads", 4)), d_model=int(cfg.get("d_model", 64)),
                                max_seq_len=N)
                model = GPT(gc_, specs[vn], backend=be).to(device=device, dtype=dtype)
                row["params"] = model.num_params()
                g = torch.Generator().manual_seed(N)
                idx = torch.randint(0, gc_.vocab_size, (B, N), generator=g).to(device)

                def train_step():
                    _, loss = model(idx, idx)
                    loss.backward()
                    return loss

                def infer():
                    with torch.no_grad():
                        return model(idx)

                params = list(model.parameters())
                row["train_step_ms"] = time_ms(train_step, device, warmup, rep, grad_to_none=params)
                row["train_peak_mem_bytes"] = peak_bytes(train_step, device)
                row["infer_ms"] = time_ms(infer, device, warmup, rep)
                row["infer_peak_mem_bytes"] = peak_bytes(infer, device)
                row["train_tokens_per_s"] = B * N / (row["train_step_ms"] * 1e-3)
                row["infer_tokens_per_s"] = B * N / (row["infer_ms"] * 1e-3)
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, KeyboardInterrupt):
                    raise
                row.update(status="oom" if is_oom(e) else "error", error=f"{type(e).__name__}: {e}"[:300])
                stopped.add((vn, be))
            finally:
                model = idx = None
                _cleanup(device)
        append_row(out_csv, row, MODEL_COLUMNS)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return read_rows(out_csv)


# --------------------------------------------------------------------------------------------- plain entry
def load_config(path: str) -> dict:
    """Read a sweep YAML (``eval/conf/sweep/*.yaml``) without Hydra: plain ``yaml.safe_load``; a top-level
    ``# @package`` line and ``defaults`` are ignored."""
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    cfg.pop("defaults", None)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="sweep YAML, e.g. eval/conf/sweep/cpu_tiny.yaml")
    ap.add_argument("--out", required=True, help="output folder (kernel.csv, model.csv)")
    ap.add_argument("--no-resume", action="store_true", help="start over (delete existing CSV rows)")
    ap.add_argument("--retry-failed", action="store_true", help="re-run points recorded as error / oom")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--plugins", default=None, help="comma-separated modules that register backends / variants "
                                                      "(their backends join every sweep)")
    ap.add_argument("--variants", default=None, help="comma-separated subset of the config's variants (e.g. one "
                                                       "family per process)")
    ap.add_argument("--deadline-s", type=number_type(float, 0, True, "a number of seconds > 0"), default=None,
                    help="wall-clock budget of this call in seconds, > 0 (overrides the config's deadline_s; resume "
                         "finishes later)")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.config):
        ap.error(f"--config {a.config}: no such file (a sweep YAML, e.g. eval/conf/sweep/cpu_tiny.yaml)")
    try:
        cfg = load_config(a.config)
    except Exception as e:  # noqa: BLE001 - yaml's parse errors: not a sweep YAML
        ap.error(f"--config {a.config}: not a YAML file ({type(e).__name__}: {e})")
    if not isinstance(cfg, dict):
        ap.error(f"--config {a.config}: not a sweep config (a YAML mapping of seq_lens, variants, backends, ...)")
    if a.variants is not None:  # "" ran every variant; "flash,,linear" dropped the empty item in silence
        variants = cfg.get("variants") or {}
        mapping = hasattr(variants, "items")  # name: {kind: ...}, or a list of {name: ..., kind: ...}
        known = [str(v) for v in variants] if mapping else [str(v.get("name")) for v in variants]
        try:
            names = name_list(a.variants, "--variants", f"variant names of {a.config}", known)
        except SystemExit as e:
            ap.error(str(e))
        cfg["variants"] = ({v: variants[v] for v in names} if mapping
                           else [v for v in variants if str(v.get("name")) in names])
    if a.deadline_s is not None:
        cfg["deadline_s"] = a.deadline_s
    if a.plugins:
        cfg["plugins"] = list(_as_list(cfg.get("plugins") or [])) + [m for m in a.plugins.split(",") if m.strip()]
    try:  # bad values, plugins that do not import, device=cuda without a GPU: the message alone, nothing written
        check_sweep_config(cfg)
        check_sweep_device(cfg)
        if cfg.get("model_sweep") and cfg["model_sweep"].get("enabled", True):
            check_model_sweep_config(dict(cfg["model_sweep"], plugins=cfg["model_sweep"].get("plugins",
                                                                                            cfg.get("plugins"))))
    except (ValueError, ImportError) as e:
        ap.error(f"--config {a.config}: {e}")
    check_out_dirs_or_exit(ap, ("--out", a.out))
    os.makedirs(a.out, exist_ok=True)
    try:
        rows = run_sweep(cfg, os.path.join(a.out, "kernel.csv"), resume=not a.no_resume, progress=not a.no_progress,
                         retry_failed=a.retry_failed)
    except CudaContextLost as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 3
    if cfg.get("model_sweep") and cfg["model_sweep"].get("enabled", True):
        mcfg = dict(cfg["model_sweep"], name=cfg.get("name", "sweep") + "_model")
        mcfg.setdefault("device", cfg.get("device"))
        mcfg.setdefault("plugins", cfg.get("plugins"))
        run_model_sweep(mcfg, os.path.join(a.out, "model.csv"), resume=not a.no_resume, progress=not a.no_progress)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} points ok -> {os.path.join(a.out, 'kernel.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
