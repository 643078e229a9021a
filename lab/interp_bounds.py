"""Out-of-bounds checks for Triton kernels run under ``TRITON_INTERPRET=1`` (lab: not installed).

The interpreter does not check addresses: ``tl.load`` / ``tl.store`` read and write raw host memory
(``triton._C.libtriton.interpreter.load``), so an index one past a tensor's end silently reads whatever lies next to
it (often another tensor of the same call) and only a far one crashes the process. Two tools:

* :func:`bounds_checked` (a context manager): every masked-on address of every ``tl.load`` / ``tl.store`` of a
  kernel launched in the block must lie inside one of that launch's tensor arguments (its extent from
  ``data_ptr``, sizes and strides, not its storage). Violations are recorded as :class:`Violation` (kernel, source
  line, load / store, how far outside the nearest argument) and optionally raised.
* :func:`guarded` / :func:`guarded_empty`: a tensor allocated in the middle of a larger buffer whose guard regions
  hold a sentinel (NaN for floats, a huge value for ints); :func:`guards_intact` checks the guards afterwards. An
  out-of-bounds read then changes a result (or shows NaN), an out-of-bounds write shows in a guard.

Used by tests/test_kernel_linear_bounds.py (the linear kernel's document path at the bench's structure).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import List, Optional

import numpy as np
import torch

GUARD = 4096  # elements of guard on each side of a guarded tensor


@dataclasses.dataclass
class Violation:
    kernel: str
    line: Optional[int]
    op: str  # "load" / "store"
    n_bad: int  # masked-on lanes outside every argument
    offset_bytes: int  # of the first bad lane relative to the nearest argument's start (negative: before it)
    arg: str  # the nearest argument's name


def _extent(t: torch.Tensor):
    if t.numel() == 0:
        return None
    n = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    lo = t.data_ptr()
    return lo, lo + n * t.element_size()


class _State:
    def __init__(self, raise_on_violation: bool, source_file: Optional[str]):
        self.stack: List[tuple] = []  # (kernel name, [(name, lo, hi)])
        self.violations: List[Violation] = []
        self.raise_on_violation = raise_on_violation
        self.source_file = source_file
        self.n_checked = 0

    def check(self, ptrs, mask, elsize: int, op: str):
        if not self.stack:
            return
        kernel, ranges = self.stack[-1]
        addr = np.asarray(ptrs.data, dtype=np.uint64).reshape(-1)
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.asarray(ptrs.data).shape).reshape(-1)
        a = addr[m].astype(np.int64)
        self.n_checked += 1
        if a.size == 0:
            return
        ok = np.zeros(a.shape, dtype=bool)
        for _, lo, hi in ranges:
            ok |= (a >= lo) & (a + elsize <= hi)
        if ok.all():
            return
        bad = a[~ok]
        first = int(bad[0])
        name, lo, hi = min(ranges, key=lambda r: min(abs(first - r[1]), abs(first - r[2])))
        off = first - lo
        line = None
        f = sys._getframe(1)
        while f is not None:
            if self.source_file and f.f_code.co_filename.endswith(self.source_file):
                line = f.f_lineno
                break
            f = f.f_back
        v = Violation(kernel, line, op, int(bad.size), off, name)
        self.violations.append(v)
        if self.raise_on_violation:
            raise IndexError(f"out-of-bounds {op} in {kernel} (line {line}): {bad.size} lanes, first at byte offset "
                             f"{off} of argument {name} (extent {hi - lo} bytes)")


@contextlib.contextmanager
def bounds_checked(raise_on_violation: bool = False, source_file: Optional[str] = "kernels/linear.py"):
    """Check every interpreted load / store in the block against its launch's tensor arguments (see the module
    docstring). Yields the state: ``.violations`` (list of :class:`Violation`), ``.n_checked`` (memory ops seen).
    Needs ``TRITON_INTERPRET=1`` before the kernels were decorated; raises RuntimeError otherwise."""
    from triton.runtime import interpreter as I

    if not hasattr(I, "GridExecutor"):  # pragma: no cover
        raise RuntimeError("triton.runtime.interpreter.GridExecutor not found (unsupported triton version)")
    st = _State(raise_on_violation, source_file)
    orig_call = I.GridExecutor.__call__
    B = I.InterpreterBuilder
    orig_load, orig_store = B.create_masked_load, B.create_masked_store

    def call(self, *args, **kwargs):
        names = list(self.arg_names)
        ranges = []
        for i, a in enumerate(list(args) + list(kwargs.values())):
            if isinstance(a, torch.Tensor):
                e = _extent(a)
                if e is not None:
                    nm = names[i] if i < len(args) and i < len(names) else list(kwargs)[i - len(args)]
                    ranges.append((nm, *e))
        st.stack.append((getattr(self.fn, "__name__", "?"), ranges))
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            st.stack.pop()

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        st.check(ptrs, mask, np.dtype(I._get_np_dtype(ptrs.get_element_ty())).itemsize, "load")
        return orig_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def store(self, ptrs, value, mask, cache_policy):
        st.check(ptrs, mask, np.dtype(I._get_np_dtype(ptrs.get_element_ty())).itemsize, "store")
        return orig_store(self, ptrs, value, mask, cache_policy)

    I.GridExecutor.__call__, B.create_masked_load, B.create_masked_store = call, load, store
    try:
        yield st
    finally:
        I.GridExecutor.__call__, B.create_masked_load, B.create_masked_store = orig_call, orig_load, orig_store


def sentinel(dtype: torch.dtype):
    """NaN for floating dtypes, the largest value for integer dtypes (a document number no row has)."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).max


def guarded(t: torch.Tensor, guard: int = GUARD) -> torch.Tensor:
    """A contiguous copy of ``t`` in the middle of a buffer of ``guard`` sentinel elements on each side (the
    buffer stays reachable through ``._base``)."""
    buf = torch.full((t.numel() + 2 * guard,), sentinel(t.dtype), dtype=t.dtype, device=t.device)
    out = buf[guard:guard + t.numel()].view(t.shape)
    out.copy_(t)
    return out


def guarded_empty(shape, dtype, device, guard: int = GUARD) -> torch.Tensor:
    """A guarded tensor (see :func:`guarded`) whose own elements are the sentinel too (uninitialised memory that a
    kernel reads before writing shows as NaN / a huge id)."""
    n = 1
    for s in shape:
        n *= int(s)
    buf = torch.full((n + 2 * guard,), sentinel(dtype), dtype=dtype, device=device)
    return buf[guard:guard + n].view(tuple(int(s) for s in shape))


def guards_intact(t: torch.Tensor) -> bool:
    """Whether the guard regions around a :func:`guarded` / :func:`guarded_empty` tensor still hold the sentinel."""
    buf = t._base
    if buf is None:
        raise ValueError("t is not a guarded tensor (no ._base)")
    off, n = t.storage_offset(), t.numel()
    g = torch.cat([buf[:off], buf[off + n:]])
    s = sentinel(t.dtype)
    return bool(torch.isnan(g).all()) if isinstance(s, float) else bool((g == s).all())
