"""Shared helpers for the GPU benchmarks (plain Python: runs on a bare GPU image, no Hydra).

* :func:`time_cuda` -- median of CUDA-event timings (``triton.testing.do_bench`` when available);
  :func:`time_cuda_graph` -- the same for a CUDA-graph replay (GPU time without host launch overhead);
  :func:`interleaved_rounds` -- more timings of several implementations in rotating order (drift shared, not
  charged to whichever ran last), :func:`median_spread` their summary.
* :func:`peak_memory` -- peak extra CUDA memory of a callable (bytes above the allocated baseline).
* FLOP formulas: :func:`flash_flops` (FlashAttention convention: forward ``4 * B * H * Nq * Nk * D``
  times the visited fraction of the mask, ``/ 2`` causal; backward ``2.5 x`` forward),
  :func:`linear_flops` (chunked linear attention; both defined in :mod:`attn_zoo.cost_model`), :func:`tflops`.
* :func:`env_info` -- date, GPU name, torch / triton / CUDA versions (every results file records it).
* :func:`write_csv`, :func:`write_json`, :func:`format_table` -- result rows (list of dicts) to disk / stdout
  (the CSV and the text table through pandas); :func:`write_results` -- both files of one benchmark.
* The bench scripts' shared command line: :func:`require_cuda`, :func:`add_time_budget`, :func:`budget_spent`,
  :func:`int_list` (a comma list of integers such as ``--lengths 512,1024``, checked before any GPU work),
  :func:`name_list` (a comma list of names), :func:`number_type` (an argparse ``type=`` for a scalar size:
  :data:`POSITIVE_INT`, :data:`NONNEG_INT`, :data:`POSITIVE`, :data:`NONNEG`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
import traceback
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import pandas as pd
import torch


# --------------------------------------------------------------------------------------------- timing
def time_cuda(fn: Callable[[], object], warmup: int = 5, rep: int = 30, use_do_bench: bool = True,
              grad_to_none: Optional[Sequence[torch.Tensor]] = None, at_least: bool = True) -> float:
    """Median wall time of ``fn()`` in milliseconds, measured with CUDA events.

    Uses ``triton.testing.do_bench(return_mode="median")`` (it flushes the L2 cache between calls) when
    triton is importable and ``use_do_bench``; otherwise times ``rep`` calls with ``torch.cuda.Event`` pairs
    after ``warmup`` calls and returns the median. ``warmup``/``rep`` are counts for the fallback and
    milliseconds for ``do_bench`` (its own convention), where ``at_least`` raises them to 25 / 100 ms (pass
    ``False`` to time for exactly ``warmup`` / ``rep`` ms, e.g. in a probe with a device-time budget).
    ``grad_to_none`` tensors get ``.grad = None`` before every call. Raises ``RuntimeError`` without CUDA.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda needs a CUDA device")
    if use_do_bench:
        try:
            import triton.testing as tt

            wu, rp = (max(warmup, 25), max(rep, 100)) if at_least else (warmup, rep)
            return float(tt.do_bench(fn, warmup=wu, rep=rp, grad_to_none=grad_to_none, return_mode="median"))
        except ImportError:
            pass
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        if grad_to_none is not None:
            for t in grad_to_none:
                t.grad = None
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return float(times[len(times) // 2])


def interleaved_rounds(timers: Dict[str, Callable[[], float]], rounds: int, start: int = 0) -> Dict[str, List[float]]:
    """Call every timer (name -> a function returning one time, e.g. ``lambda: time_cuda(fn)``) once per round,
    ``rounds`` rounds, round ``r`` in the names' order rotated left by ``start + r``: each name runs at each position
    in turn, so a drift of the shared GPU's clock or load over the rounds reaches every name alike instead of
    whichever ran last. Returns name -> its times in round order. Raises ``ValueError`` for ``rounds < 0``."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise ValueError(f"rounds={rounds!r} is not supported; allowed values: an integer >= 0")
    names = list(timers)
    out: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = (start + r) % len(names) if names else 0
        for n in names[k:] + names[:k]:
            out[n].append(float(timers[n]()))
    return out


def median_spread(times: Sequence[float]) -> tuple:
    """``(median, spread)`` of ``times`` (ms, at least one): the median (the mean of the middle two for an even
    count) and ``(max - min) / median``, how far apart the rounds of :func:`interleaved_rounds` were."""
    t = [float(x) for x in times]
    if not t:
        raise ValueError("times must hold at least one value")
    med = statistics.median(t)
    return med, (max(t) - min(t)) / med if med > 0 else float("nan")


def host_us(fn: Callable[[], object], n: int = 100, warmup: int = 5) -> float:
    """Host time (us) to enqueue one ``fn()``: ``n`` calls in a loop with no synchronisation inside (after ``warmup``
    calls and a sync). GPU-bound callables saturate the launch queue and measure GPU time instead."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def time_cpu(fn: Callable[[], object], grad_to_none=None, rep: int = 3) -> float:
    """Median wall time (ms) of ``rep`` calls of ``fn`` after one warm-up, with the ``.grad`` of ``grad_to_none``
    cleared before each (the ``--device cpu`` smoke runs of the benchmarks; not a measurement)."""
    ts = []
    for _ in range(rep + 1):
        for t in grad_to_none or ():
            t.grad = None
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts[1:])[rep // 2]


def time_cuda_graph(fn: Callable[[], object], warmup: int = 2, calls: int = 1) -> float:
    """Median time (ms) of one call of ``fn`` captured in a CUDA graph: the GPU time of ``fn`` without the host's
    launch overhead. ``fn`` runs ``warmup`` times on a side stream first (compiles, allocator pools), then ``calls``
    times under one capture; the replay's time is divided by ``calls``. ``calls = 1`` includes the graph's own launch
    on the GPU (a few microseconds); ``calls > 1`` is the steady state of back-to-back calls inside one graph, as the
    layers of a decode step run. Raises ``ValueError`` for ``calls < 1``, ``RuntimeError`` without CUDA, and
    whatever capture raises for ``fn``."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda_graph needs a CUDA device")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    ms = time_cuda(g.replay) / calls
    del g
    return ms


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak CUDA memory allocated while running ``fn()`` once, minus the memory allocated before (bytes).

    The result of ``fn`` is kept alive until the peak is read, so outputs and saved activations count.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("peak_memory needs a CUDA device")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return int(peak - base)


# --------------------------------------------------------------------------------------------- FLOPs
# The benchmark FLOP conventions live in the cost model (one definition for benchmarks, sweep and model).
from attn_zoo.cost_model import BWD_FACTOR, flash_flops, linear_flops  # noqa: E402,F401


def tflops(flops: float, ms: float) -> float:
    """TFLOP/s from a FLOP count and a time in milliseconds (nan for non-positive / nan times)."""
    if ms is None or not (ms > 0) or math.isnan(ms):
        return float("nan")
    return flops / (ms * 1e-3) / 1e12


# --------------------------------------------------------------------------------------------- env / io
def env_info(date: Optional[str] = None) -> Dict[str, object]:
    """Environment description recorded with every result: date, GPU, torch / triton / CUDA versions."""
    info: Dict[str, object] = {
        "date": date or _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = p.name
        info["gpu_mem_gib"] = round(p.total_memory / 2**30, 1)
        info["sm_count"] = p.multi_processor_count
        info["capability"] = f"{p.major}.{p.minor}"
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # pragma: no cover
            info["cudnn"] = None
    else:
        info["gpu"] = None
    return info


def try_call(fn: Callable[[], object], max_chars: int = 120, short_oom: bool = False):
    """``fn()``, or for a failure the text ``error: <type>: <message, first max_chars>`` (traceback printed, 2
    frames): one failing method must not end a benchmark. ``short_oom``: CUDA out of memory empties the cache and
    gives ``error: OutOfMemoryError`` (no traceback)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        if short_oom and isinstance(e, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
            return "error: OutOfMemoryError"
        traceback.print_exc(limit=2)
        return f"error: {type(e).__name__}: {str(e)[:max_chars]}"


def _is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def read_rows(path: str) -> List[dict]:
    """Rows of a results CSV as dicts of strings (an empty cell is ``""``; empty list when the file does not exist
    or is empty), as ``csv.DictReader`` gives them; the readers parse what they use."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    return pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records")


def checked_rows(path: str, where: str, required: Sequence[str] = (), expected: str = "") -> List[dict]:
    """The rows of the results CSV ``path`` (as :func:`read_rows`) that an eval tool was given, checked first:
    ``ValueError`` starting with ``where`` (the argument and file, e.g. ``results_dir=DIR: kernel.csv``) when the
    file is empty (0 bytes), is not a CSV pandas can read, or lacks a column of ``required``; ``expected`` says what
    it should be (``the columns eval.sweep writes``). A header without rows is no error (``[]``): the caller says
    whether that leaves nothing to do."""
    tail = f"; expected {expected}" if expected else ""
    if os.path.getsize(path) == 0:
        raise ValueError(f"{where} is empty (0 bytes){tail}")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{where} is not a readable CSV ({error_line(e, 100)}){tail}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{where} lacks columns {missing}{tail}")
    return df.to_dict("records")


def checked_json(path: str, where: str, expected: str = "", keys: Sequence[str] = ()) -> dict:
    """The JSON object in ``path``, checked: ``ValueError`` starting with ``where`` when it is not valid JSON (a
    truncated file), not an object, or lacks a key of ``keys``; ``expected`` says what it should be."""
    tail = f"; expected {expected}" if expected else ""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where} is not valid JSON ({error_line(e, 100)}){tail}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{where} holds a JSON {type(d).__name__}, not an object{tail}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{where} lacks keys {missing}{tail}")
    return d


def error_line(e: BaseException, limit: int = 160) -> str:
    """``"<type>: <first line of the message, at most limit characters>"``: an exception as one CSV / table cell."""
    msg = str(e)
    return f"{type(e).__name__}: {msg.splitlines()[0][:limit] if msg else ''}"


def check_out_dir(path, key: str) -> None:
    """An output folder (``out_dir=``, ``--out``) that cannot be one: ``path`` or a folder above it is an existing
    file. Raises ``ValueError`` naming ``key`` (it was a FileExistsError / NotADirectoryError traceback from
    ``os.makedirs``, in ``eval.crossover`` after the sweep had been measured)."""
    if not path:
        return
    p = os.path.abspath(str(path))
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise ValueError(f"{key}{' ' if key.startswith('-') else '='}{path}: {p} is a file, not a folder; pass the "
                         f"folder to write into (missing folders are created)")


def check_out_dirs_or_exit(parser, *pairs) -> None:
    """:func:`check_out_dir` for each ``(option, path)`` of a command line: its ``ValueError`` becomes ``parser``'s
    usage error (exit status 2, the message alone)."""
    for key, path in pairs:
        try:
            check_out_dir(path, key)
        except ValueError as e:
            parser.error(str(e))


def write_csv(rows: Iterable[Dict[str, object]], path: str, columns: Optional[Sequence[str]] = None) -> str:
    """Write dict rows to ``path``; returns the path. Header: ``columns``, else the union of the keys in first-seen
    order. Cells as the results always had them: ``str`` of each value (floats at full precision), an explicit NaN
    as ``nan``, a missing key or ``None`` as an empty cell, CRLF line ends (what ``csv.DictWriter`` wrote)."""
    cells = [{k: "nan" if _is_nan(v) else v for k, v in r.items()} for r in rows]
    df = pd.DataFrame(cells, columns=list(columns) if columns is not None else None, dtype=object)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    df.to_csv(path, index=False, lineterminator="\r\n")
    return path


def json_safe(x):
    """JSON-safe: NaN / inf -> None, dict keys as strings, recursively."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def write_json(rows: Iterable[Dict[str, object]], path: str, env: Optional[Dict[str, object]] = None) -> str:
    """Write ``{"env": env, "rows": rows}`` to ``path`` (nan/inf become null); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(json_safe({"env": env if env is not None else env_info(), "rows": list(rows)}), f, indent=1)
    return path


def format_table(rows: Sequence[Dict[str, object]], cols: Sequence[str], floatfmt: str = "{:.2f}") -> str:
    """Fixed-width text table of ``cols`` from dict rows (floats with ``floatfmt``; missing / None / NaN -> '-')."""
    df = pd.DataFrame(list(rows), columns=list(cols), dtype=object).fillna("-")
    return df.to_string(index=False, float_format=floatfmt.format) if len(df) else "  ".join(cols)


def write_results(rows: Sequence[Dict[str, object]], out: str, stem: str, env: Optional[Dict[str, object]] = None) -> str:
    """``<out>/<stem>.csv`` (:func:`write_csv`) and ``<out>/<stem>.json`` (:func:`write_json` with ``env``) of the
    same rows, the folder made if needed; returns the CSV's path. A bench script calls it after every case, so a
    killed run keeps what it measured."""
    os.makedirs(out, exist_ok=True)
    path = write_csv(rows, os.path.join(out, f"{stem}.csv"))
    write_json(rows, os.path.join(out, f"{stem}.json"), env=env)
    return path


# --------------------------------------------------------------------------------------------- command line
def require_cuda(script: str) -> None:
    """``SystemExit("<script> needs a CUDA device")`` on a machine without one (the GPU benchmarks)."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA device")


def int_list(text: str, flag: str, what: str, minimum: int = 1, maximum: Optional[int] = None) -> List[int]:
    """The integers of a command line's comma list, e.g. ``--lengths 512,1024`` -> ``[512, 1024]``.

    Every bench script parses its integer lists (sequence lengths, head dims, token counts) here, right after
    ``parse_args`` and before any GPU work, so that a bad list stops with one message naming the option on any
    machine (it was a ``ValueError`` traceback, or a 0 / negative length reaching the kernels).

    Args:
        text: the option's value as given, e.g. ``"512, 1024"``; spaces around each item are stripped.
        flag: the option's name for the message, e.g. ``"--lengths"``.
        what: what the integers are, plural, for the message, e.g. ``"sequence lengths"``.
        minimum: the smallest allowed value (default 1).
        maximum: the largest allowed value, or ``None`` for no upper bound.

    Returns:
        The integers in the order given (duplicates kept; a caller that wants them once drops them itself).

    Raises:
        SystemExit: an empty list, an empty item (``"512,,1024"``, ``"512,"``), an item that is not an integer or one
            outside ``[minimum, maximum]``; the message names ``flag``, the text given, the allowed values and the
            first bad item, e.g. ``--lengths '0,64': sequence lengths must be comma-separated integers >= 1 (not
            '0')``.
    """
    allowed = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    vals = []
    for item in (str(text).split(",") if text is not None else [""]):
        item = item.strip()
        try:
            v = int(item)
        except ValueError:
            v = None
        if v is None or v < minimum or (maximum is not None and v > maximum):
            bad = f"not {item!r}" if item else "an empty item" if str(text or "").strip() else "an empty list"
            raise SystemExit(f"{flag} {text!r}: {what} must be comma-separated integers {allowed} ({bad})")
        vals.append(v)
    return vals


def name_list(text: str, flag: str, what: str, allowed: Optional[Sequence[str]] = None, more: str = "") -> List[str]:
    """The names of a command line's comma list, e.g. ``--layers flash,linear`` -> ``["flash", "linear"]`` (spaces
    around each item stripped, order kept, duplicates dropped): :func:`int_list` for names.

    Raises ``SystemExit`` naming ``flag`` and the text for an empty list or an empty item (``"flash,,linear"``, which
    was dropped in silence, or ``""``, which ran nothing and exited 0) and, with ``allowed``, for a name not in it:
    ``--sizes: ['huge'] not supported; allowed values: large, small`` (``more``: appended to the allowed values,
    e.g. ``", or a hybrid ..."``)."""
    choices = f"; allowed values: {', '.join(map(str, allowed))}{more}" if allowed is not None else more
    items = [x.strip() for x in str(text if text is not None else "").split(",")]
    if not any(items) or "" in items:
        bad = "an empty item" if any(items) else "an empty list"
        raise SystemExit(f"{flag} {text!r}: give comma-separated {what} ({bad}){choices}")
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise SystemExit(f"{flag}: {bad} not supported{choices}")
    return list(dict.fromkeys(items))


def number_type(kind, lo: float, strict: bool = False, what: Optional[str] = None, hi: Optional[float] = None):
    """An argparse ``type=`` for a scalar option: ``kind`` (``int`` / ``float``), finite, ``> lo`` (``strict``) or
    ``>= lo``, and ``<= hi`` when given; else argparse's usage error naming the option and the allowed values
    (``argument --heads: 0: must be an integer >= 1``), before any work. :data:`POSITIVE_INT` and its siblings are
    the common ones (a 0 / negative head count, batch or token count reached the cases: a ZeroDivisionError, empty
    tensors timed, or a silent ``max(1, ...)``)."""
    noun = "an integer" if kind is int else "a number"
    if what is None:
        what = f"{noun} {'>' if strict else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")

    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}; allowed values: {what}") from None
        if not math.isfinite(x) or (x <= lo if strict else x < lo) or (hi is not None and x > hi):
            raise argparse.ArgumentTypeError(f"{text}: must be {what}")
        return x

    parse.__name__ = what  # argparse names the type in "invalid <name> value"
    return parse


POSITIVE_INT = number_type(int, 0, True, "an integer >= 1")
NONNEG_INT = number_type(int, 0, False, "an integer >= 0")
POSITIVE = number_type(float, 0, True, "a number > 0")
NONNEG = number_type(float, 0, False, "a number >= 0")


def _budget_seconds(text: str) -> float:
    """``--time-budget-s``'s type: a number of seconds >= 0 (0: start no case), else an argparse error naming it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:  # negative or NaN
        raise argparse.ArgumentTypeError(f"{text!r} is not supported; allowed values: a number of seconds >= 0")
    return value


def add_time_budget(parser, default: float = 1e9, scope: str = "") -> None:
    """The ``--time-budget-s`` option (seconds, a float >= 0, else an argparse error naming the flag; ``scope``: a
    prefix of its help, e.g. ``"--docs: "``): the script starts no case once it has run that long
    (:func:`budget_spent`)."""
    parser.add_argument("--time-budget-s", type=_budget_seconds, default=default,
                        help=f"{scope}start no new case after this many seconds (>= 0)")


def budget_spent(t_start: float, seconds: float, case: str) -> bool:
    """Whether more than ``seconds`` (``--time-budget-s``) passed since ``t_start`` (``time.time()``); if so prints
    ``time budget reached, skipping <case>``."""
    if time.time() - t_start <= seconds:
        return False
    print(f"time budget reached, skipping {case}", flush=True)
    return True


if __name__ == "__main__":  # a library module: running it would do nothing, so say what to run instead
    raise SystemExit("eval.bench_common is a library module, not a command; run python -m eval.bench_flash --help "
                     "(or another eval.bench_* that uses it)")
