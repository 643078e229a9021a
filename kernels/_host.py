"""Host-side integer helpers for the kernel launchers (plain Python: ``triton.cdiv`` / ``triton.next_power_of_2``
are constexpr-function wrappers in recent Triton, ~5 us per call, and a launch path calls them dozens of times), and
the scalar-argument checks the public kernel entries share (a few ``isinstance`` tests each: they run per call)."""

import math
import numbers


def is_int(value) -> bool:
    """An integer that is not a bool (Python ``int`` or a NumPy / other ``numbers.Integral``)."""
    return type(value) is int or (not isinstance(value, bool) and isinstance(value, numbers.Integral))


def check_bool(name: str, value) -> None:
    """Refuse anything but ``True`` / ``False`` for argument ``name`` (a truthy string or 0 / 1 included)."""
    if value is not True and value is not False:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: True, False")


def check_scale(name: str, value) -> None:
    """Refuse a ``softmax_scale``-like argument ``name`` that is not ``None`` or a finite real number > 0 (a bool or
    a tensor included). Symbolic values (``torch.SymFloat`` / ``SymInt`` while ``torch.compile`` traces dynamic
    shapes: ``D ** -0.5``) pass unchecked."""
    if value is None or (type(value) is float and 0.0 < value < math.inf):
        return
    if type(value).__name__ in ("SymFloat", "SymInt"):
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: None (D ** -0.5) or a finite "
                         "float > 0")


def check_window_size(window_size):
    """``(left, right)`` of a ``window_size`` argument (``None``: ``(None, None)``); raises ``ValueError`` unless it is
    ``None`` or a pair whose entries are ints >= 0 (not bools) or ``None``."""
    if window_size is None:
        return None, None
    if not hasattr(window_size, "__len__") or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = window_size
    for side, w in (("left", left), ("right", right)):
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 0):
            raise ValueError(f"window_size {side}={w!r} must be an integer >= 0 or None")
    return left, right


def check_sink_size(value) -> int:
    """``sink_size`` (StreamingLLM attention sinks: keys ``j < sink_size`` stay visible left of a window) as an int;
    raises ``ValueError`` unless it is an integer >= 0 (not a bool)."""
    if not is_int(value) or value < 0:
        raise ValueError(f"sink_size={value!r} is not supported; allowed values: an integer >= 0 (0, the default: no "
                         "attention sinks)")
    return int(value)


def check_eps(value) -> None:
    """Refuse an ``eps`` (normaliser offset) that is not a finite real number > 0 (a bool included): a row whose
    normaliser is 0 would be NaN."""
    if type(value) is float and 0.0 < value < math.inf:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"eps={value!r} is not supported; allowed values: a finite float > 0 (a row whose "
                         "normaliser is 0 would be NaN)")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def heads_per_section(budget: int, n_bh: int, Nk: int, D: int, Dv: int, elt: int, group: int) -> int:
    """(batch, query head) pairs per section of a longest-first tile order (the Triton forward's LPT order, the
    persistent Gluon forward's work list): as many query heads as keep their K / V (``Nk x (D + Dv)`` elements of
    ``elt`` bytes per K / V head, shared by ``group`` query heads) within ``budget`` bytes of L2; at least 1, at most
    ``n_bh``."""
    per_head = max(1, Nk * (D + Dv) * elt // max(group, 1))
    return max(1, min(n_bh, budget // per_head))


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


class CompiledLaunch:
    """A compiled Triton kernel with its grid and constexpr values, launched without Triton's per-call work.

    ``kernel[grid](*args, **meta)`` binds and specialises every argument (alignment, ``== 1`` and divisibility of
    each integer), builds a cache key and looks the kernel up on every call: ~50-100 us of host time per launch
    for our ~50-argument kernels on the H200 machine, more than the GPU time of a short attention call. A launch
    plan (one per call signature: shapes, strides, dtypes, pointer alignment and options, see ``kernels/flash/launch.py``)
    keeps the compiled kernel that the first call produced and calls its launcher directly, which is valid because
    every argument that Triton specialises on is fixed by that signature. Launch hooks (profilers such as proton)
    see nothing on this path, so :meth:`ready` sends calls back to the normal path while a hook is installed.

    ``compiled``: what ``kernel[grid](...)`` returned (a ``CompiledKernel``); ``n_args``: the number of positional
    arguments a call passes (a constexpr among them is passed in place, as Triton's launcher takes every parameter
    in order); ``values``: the value by name of every constexpr after them. ``capture`` returns
    ``None`` where this is not possible (interpreter, an unexpected kernel object or signature).
    """

    __slots__ = ("run", "function", "packed", "grid", "tail", "device", "stream")

    @classmethod
    def capture(cls, jit_fn, compiled, n_args: int, values: dict, grid, device_index: int):
        params = getattr(jit_fn, "params", None)
        if compiled is None or params is None or not hasattr(compiled, "packed_metadata"):
            return None
        if len(params) < n_args or not all(p.is_constexpr for p in params[n_args:]):
            return None  # the arguments after the positional ones must be constexprs (a call passes them by name)
        try:
            tail = tuple(values[p.name] for p in params[n_args:])
        except KeyError:
            return None
        self = cls()
        self.run = compiled.run
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        g = tuple(grid) + (1, 1)
        self.grid = g[:3]
        self.tail = tail
        self.device = device_index
        from triton.runtime.driver import driver

        self.stream = driver.active.get_current_stream
        return self

    @staticmethod
    def ready() -> bool:
        """False while a Triton launch hook is installed (the normal launch path reports to it). Triton 3.6+ keeps
        the hooks as ``HookChain`` objects (never ``None``): installed means a non-empty chain."""
        rt = _runtime_knobs()
        if rt is None:
            return False
        return not (_hook_set(rt.launch_enter_hook) or _hook_set(rt.launch_exit_hook))

    def __call__(self, *args) -> None:
        g0, g1, g2 = self.grid
        self.run(g0, g1, g2, self.stream(self.device), self.function, self.packed, None, None, None, *args, *self.tail)


_KNOBS = []


def _runtime_knobs():
    if not _KNOBS:
        try:
            from triton import knobs

            _KNOBS.append(knobs.runtime)
        except (ImportError, AttributeError):  # pragma: no cover - a Triton without knobs
            _KNOBS.append(None)
    return _KNOBS[0]


def _hook_set(hook) -> bool:
    """Whether a launch hook is installed: a callable, or a Triton ``HookChain`` with calls in it."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


# ------------------------------------------------------------------------------------ cached launches by argument
FAST_LAUNCH = True
""":func:`launch` reuses the compiled kernel of an earlier call with the same argument key (``False``: every call
through Triton's launcher, e.g. to compare the two)."""
_MAX_FAST = 4096
_FAST = {}  # (kernel, grid, options, constexprs, argument keys) -> (CompiledLaunch, CompiledKernel)


def _interpreting() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``), read per call as the kernels' tests set it."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _compiling() -> bool:
    """True while ``torch.compile`` traces: it captures ``kernel[grid](...)`` itself (a user-defined Triton kernel in
    the graph), and a direct launcher call or a fake tensor's ``data_ptr`` would break the graph."""
    import torch

    return torch.compiler.is_compiling()


def _arg_key(a):
    """What Triton may specialise a compiled kernel on, for one positional argument: a tensor's dtype, 16-byte
    alignment of its pointer and device; a host TMA descriptor's base tensor so, with its shape, strides, block
    shape, layout and padding (a dataclass, not hashable itself); any other value as itself (ints exactly: their
    ``== 1`` / divisibility / width specialisations, and the values of constexprs passed by position)."""
    if hasattr(a, "data_ptr"):
        return a.dtype, a.data_ptr() % 16 == 0, a.get_device()
    base = getattr(a, "base", None)
    if hasattr(base, "data_ptr") and hasattr(a, "block_shape"):  # a host TMA descriptor (Gluon's / triton.tools')
        layout = getattr(a, "layout", None)  # Gluon's layouts are frozen dataclasses: hashed by value (repr: 4x dearer)
        try:
            hash(layout)
        except TypeError:
            layout = repr(layout)
        return (type(a), base.dtype, base.data_ptr() % 16 == 0, base.get_device(), tuple(a.shape), tuple(a.strides),
                tuple(a.block_shape), layout, getattr(a, "padding", None))
    return type(a), a


def launch(kernel, grid, args, num_warps: int = 4, num_stages=None, **constexprs):
    """``kernel[grid](*args, num_warps=, num_stages=, **constexprs)``, with Triton's per-call work skipped on a
    repeated call: the first call with a given key (kernel, grid, options, constexprs and :func:`_arg_key` of every
    positional argument) launches through Triton and keeps its compiled kernel as a :class:`CompiledLaunch`; a later
    call with the same key calls that launcher directly (H200 machine, triton 3.6: Triton's launcher costs ~100 us
    of host time per launch for these ~30-argument kernels, the direct call ~10 us). Every argument Triton specialises
    on is in the key, so the direct call runs the kernel Triton would have chosen. Through Triton's own path always:
    the interpreter, ``torch.compile`` tracing, a launch hook installed (profilers), ``FAST_LAUNCH = False``.
    Returns the ``CompiledKernel`` (``None`` under the interpreter); raises what ``kernel[grid](...)`` raises (e.g.
    ``OutOfResources`` on the first call)."""
    opts = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    if not FAST_LAUNCH or _interpreting() or _compiling() or not CompiledLaunch.ready():
        return kernel[grid](*args, **opts, **constexprs)
    key = (kernel, tuple(grid), num_warps, num_stages, tuple(constexprs.items()), tuple(map(_arg_key, args)))
    hit = _FAST.get(key)
    if hit is not None:
        hit[0](*args)
        return hit[1]
    compiled = kernel[grid](*args, **opts, **constexprs)
    dev = next((a.get_device() for a in args if hasattr(a, "data_ptr")), 0)
    # a Gluon kernel also declares num_warps as a constexpr parameter: its value is part of the call's tail
    fast = CompiledLaunch.capture(kernel, compiled, len(args), dict(constexprs, num_warps=num_warps), grid,
                                  max(dev, 0))
    if fast is not None:
        if len(_FAST) >= _MAX_FAST:
            _FAST.clear()
        _FAST[key] = (fast, compiled)
    return compiled


def clear_launches() -> None:
    """Forget the kernels :func:`launch` keeps (the next call of each key goes through Triton again)."""
    _FAST.clear()
