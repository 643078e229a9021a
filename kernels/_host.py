"""Host-side integer helpers for the kernel launchers (plain Python: ``triton.cdiv`` / ``triton.next_power_of_2``
are constexpr-function wrappers in recent Triton, ~5 us per call, and a launch path calls them dozens of times)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


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
    (non-constexpr) arguments a call passes; ``values``: every constexpr's value by name. ``capture`` returns
    ``None`` where this is not possible (interpreter, an unexpected kernel object or signature).
    """

    __slots__ = ("run", "function", "packed", "grid", "tail", "device", "stream")

    @classmethod
    def capture(cls, jit_fn, compiled, n_args: int, values: dict, grid, device_index: int):
        params = getattr(jit_fn, "params", None)
        if compiled is None or params is None or not hasattr(compiled, "packed_metadata"):
            return None
        if len(params) < n_args or any(p.is_constexpr for p in params[:n_args]) or \
                not all(p.is_constexpr for p in params[n_args:]):
            return None  # constexprs must follow the positional arguments
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
