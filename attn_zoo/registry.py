"""Registry: variant kind -> backend name -> implementation.

A backend implementation is ``fn(q, k, v, spec, return_lse=False)`` returning ``out`` or ``(out, lse)``, plus
a ``supports(q, k, v, spec, return_lse) -> Optional[str]`` predicate that returns ``None`` when it can run the
input and otherwise a one-line reason (shown in the error of an explicit ``backend=`` request and used by
``backend="auto"`` to fall through ``triton -> torch -> reference``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

BACKENDS = ("triton", "torch", "reference")  # "auto" tries them in this order


def _always(*args, **kwargs) -> Optional[str]:
    return None


@dataclass(frozen=True)
class Backend:
    kind: str
    name: str
    fn: Callable
    supports: Callable[..., Optional[str]] = _always


_REGISTRY: Dict[str, Dict[str, Backend]] = {}


def register_backend(kinds, name: str, supports: Optional[Callable[..., Optional[str]]] = None):
    """Decorator: register ``fn`` as backend ``name`` of each kind in ``kinds`` (a str or a tuple)."""
    if name not in BACKENDS:
        raise ValueError(f"backend name={name!r} is not supported; allowed values: {', '.join(BACKENDS)}")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)

    def deco(fn):
        for kind in kinds:
            _REGISTRY.setdefault(kind, {})[name] = Backend(kind, name, fn, supports or _always)
        from .functional import _DISPATCH

        _DISPATCH.clear()  # remembered dispatch decisions may name the replaced backend
        return fn

    return deco


def get_backends(kind: str) -> Dict[str, Backend]:
    from . import backends  # noqa: F401  (importing registers the built-in backends)

    if kind not in _REGISTRY:
        raise ValueError(f"unknown attention kind={kind!r}; registered kinds: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[kind]


def available_backends(kind: str):
    """Names of the backends registered for ``kind``, in ``auto`` order."""
    regs = get_backends(kind)
    return [b for b in BACKENDS if b in regs]
