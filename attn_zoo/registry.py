"""The open backend registry: variant kind -> backend name -> implementation.

A backend is ``fn(q, k, v, spec, return_lse=False)`` returning ``out`` or ``(out, lse)``, registered with
:func:`register_backend` for some kinds (or a whole family: :class:`family`) under a name, with

* ``supports(q, k, v, spec, return_lse) -> Optional[str]``: ``None`` when it can run the input, else a one-line
  reason (shown in the error of an explicit ``backend=`` request, collected by ``auto``);
* ``available() -> Optional[str]``: ``None`` when it can run in this process at all (its package imports, a GPU is
  present), else the reason; asked once per process (:func:`forget_availability` forgets the answers);
* ``priority``: ``auto`` tries the backends with a priority, highest first, and takes the first that is available
  and supports the input; ``None`` = never picked by ``auto`` (the anchors: a benchmark or an explicit
  ``backend=`` runs them). ``devices``: device types ``auto`` uses it for (``None`` = any).
* ``auto_priority(q, k, v, spec) -> Optional[int]``: optional; the priority ``auto`` gives the backend for these
  inputs (``None``: ``priority``), for a backend whose rank depends on the shape (``parallel``: ahead of ``triton``
  for the Taylor map at short sequences, :data:`attn_zoo.backends.triton_taylor.TAYLOR_CHUNKED_MIN_N`). Only for
  backends with a priority; listings (:func:`available_backends`) keep ``priority``'s order.
* ``documents``: ``True`` when ``fn`` takes packed documents, ``fn(q, k, v, spec, return_lse=False, doc_ids=...)``
  (issue 27, :mod:`attn_zoo.documents`); ``fn`` is called with ``doc_ids=`` only when the caller gives them. A call
  with ``doc_ids``: ``auto`` skips the backends without it; one asked for by name is refused naming those with it
  (:func:`document_backends`).

Built in (:mod:`attn_zoo.backends`): the product backends ``triton`` (300, CUDA only under ``auto``), ``parallel``
(250, CUDA, ``linear`` with the Taylor map; 350 below ``TAYLOR_CHUNKED_MIN_N`` tokens), ``taylor_chunk`` (240, CUDA,
causal Taylor; 360 from ``TAYLOR_FUSED_MIN_N`` tokens), ``torch`` (200) and ``reference`` (100), which fix ``auto``'s
order, and the anchors ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``, ``sdpa_math``, ``flex``, ``naive``,
``fa2``, ``fa3``, ``fa4``, ``flex_fa4`` and ``fla`` (no priority; the ones whose package is missing say so through ``available()``, naming the package and the pyproject
extra, e.g. ``pip install -e .[fa4]``). Sweeps and benchmarks iterate this registry
(:func:`backend_names`), so a backend registered by a plugin module (:func:`load_plugins`) is timed with no edit
to ``eval/``::

    import attn_zoo

    @attn_zoo.register_backend("flash", "mine", supports=lambda q, k, v, spec, lse: None if q.is_cuda else "CUDA only")
    def mine(q, k, v, spec, return_lse=False):
        ...

One cache-invalidation rule: every cache whose entries are derived from a registration (a variant's mask, a
backend choice, a mask materialised for SDPA / FlexAttention / a kernel's tile tables) is declared with
:func:`derived_cache` (a memoising decorator) or :func:`derived_dict` (a plain dict), and :func:`forget_derived`
clears all of them together. :func:`register_backend`, :func:`unregister_backend` and
:func:`attn_zoo.register_variant` call it, so nothing is checked per call and nothing stale survives a
(re)registration.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

_DERIVED: List[Callable[[], None]] = []  # the clear() of every cache derived from the registrations


def derived_cache(maxsize: Optional[int] = 128):
    """``functools.lru_cache(maxsize)`` whose entries :func:`forget_derived` clears: for any cache keyed by a spec
    (or a kind) whose value depends on what is registered (a mask, a backend choice, tables built from a mask).
    Use as ``@derived_cache(64)``.

    Under ``torch.compile`` the function is not traced (``torch.compiler.disable``): it runs eagerly, once per key,
    at a graph break, and its tensors (a layout, block tables, a mask) reach the graph as inputs, the same objects
    at every step (a kernel's own cache keyed by such a tensor, :func:`kernels.flash.gluon.gluon_layout_tables`,
    relies on it). Traced, Dynamo drops the cache wrapper and the mask code enters the compiled graph, with a graph
    break at each ``.item()``."""

    def deco(fn):
        import torch

        cached = lru_cache(maxsize=maxsize)(fn)
        _DERIVED.append(cached.cache_clear)
        eager = torch.compiler.disable(cached)
        eager.cache_clear, eager.cache_info = cached.cache_clear, cached.cache_info
        return eager

    return deco


def derived_dict() -> dict:
    """A plain dict that :func:`forget_derived` empties (e.g. the dispatch cache of :func:`attn_zoo.attention`)."""
    d: dict = {}
    _DERIVED.append(d.clear)
    return d


def forget_derived() -> None:
    """Clear every cache declared with :func:`derived_cache` / :func:`derived_dict` (the one invalidation rule:
    called on every registration and unregistration of a variant or a backend)."""
    for clear in _DERIVED:
        clear()

BACKENDS = ("triton", "torch", "reference")  # the product backends, in auto order (their default priorities below)
PRODUCT_DEFAULTS = {"triton": (300, ("cuda",)), "torch": (200, None), "reference": (100, None)}


def _always(*args, **kwargs) -> Optional[str]:
    return None


@dataclass(frozen=True)
class family:
    """Selects every kind of a variant family (``family("softmax")``, ``family("linear")``), present and future, in
    :func:`register_backend`; a backend registered for a kind itself overrides the family's of the same name."""

    name: str

    @property
    def key(self) -> str:
        return f"family:{self.name}"


class Unsupported(ValueError):
    """A backend cannot run an input (:meth:`Backend.bind`); the message is the reason."""


@dataclass(frozen=True)
class Backend:
    """One registered implementation (see the module docstring). ``kind``: the kind or ``family:<name>`` it was
    registered for; ``origin``: the module that registered it (what ``--plugins`` selects)."""

    kind: str
    name: str
    fn: Callable
    supports: Callable[..., Optional[str]] = _always
    priority: Optional[int] = None
    available: Callable[[], Optional[str]] = _always
    devices: Optional[Tuple[str, ...]] = None
    origin: str = ""
    documents: bool = False
    auto_priority: Optional[Callable[..., Optional[int]]] = None

    def priority_for(self, q, k, v, spec) -> Optional[int]:
        """``auto``'s priority for these inputs: ``auto_priority``'s answer, else ``priority`` (``None`` stays
        ``None``: never picked by ``auto``)."""
        if self.priority is None or self.auto_priority is None:
            return self.priority
        p = self.auto_priority(q, k, v, spec)
        return self.priority if p is None else p

    def unavailable(self) -> Optional[str]:
        """``available()``'s reason, asked once per process (``None`` = available)."""
        key = (self.kind, self.name)
        if key not in _AVAILABLE:
            try:
                _AVAILABLE[key] = self.available()
            except Exception as e:  # noqa: BLE001 - a broken optional package must not break dispatch
                _AVAILABLE[key] = f"{type(e).__name__}: {e}"
        return _AVAILABLE[key]

    def why_not(self, q, k, v, spec, return_lse: bool = False) -> Optional[str]:
        """``None`` when this backend can run the input, else the reason (availability, then ``supports``)."""
        why = self.unavailable()
        if why is not None:
            return f"not available here ({why})"
        return self.supports(q, k, v, spec, return_lse)

    def bind(self, spec, q, k, v, return_lse: bool = False, **options) -> Callable:
        """``f(q, k, v)`` running this backend on inputs shaped like these (what benchmarks time: the
        implementation itself, no dispatch); ``options`` go to the implementation (e.g. ``config=`` of ``triton``).
        Raises :class:`Unsupported` with the reason when it cannot run them."""
        why = self.why_not(q, k, v, spec, return_lse)
        if why is not None:
            raise Unsupported(f"{self.name}: {why}")
        fn = self.fn
        if options.get("doc_ids") is not None and not self.documents:
            raise Unsupported(f"{self.name}: does not take doc_ids (packed documents)")
        if "doc_ids" in options and options["doc_ids"] is None:
            options = {k: v for k, v in options.items() if k != "doc_ids"}
        if return_lse:
            return lambda q, k, v: fn(q, k, v, spec, return_lse=True, **options)
        if options:
            return lambda q, k, v: fn(q, k, v, spec, **options)
        return lambda q, k, v: fn(q, k, v, spec)


_REGISTRY: Dict[str, Dict[str, Backend]] = {}
_AVAILABLE: Dict[Tuple[str, str], Optional[str]] = {}


def forget_availability() -> None:
    """Forget every backend's ``available()`` answer (each is asked again at its next use) and the caches derived
    from the registrations (:func:`forget_derived`: remembered dispatch decisions rest on those answers). For a process
    in which an answer changed: a test that fakes ``torch.cuda.is_available`` (``tests/conftest.py`` calls it after
    such a test, so the fake's answers do not outlive it)."""
    _AVAILABLE.clear()
    forget_derived()


def _check_name(name) -> None:
    if not isinstance(name, str) or not name or name == "auto" or any(c in name for c in " ,/="):
        raise ValueError(f"backend name={name!r} must be a non-empty string without spaces, ',', '/' or '=' "
                         f"and not 'auto'")


def register_backend(kinds, name: str, supports: Optional[Callable[..., Optional[str]]] = None, *,
                     priority: Optional[int] = -1, available: Optional[Callable[[], Optional[str]]] = None,
                     devices: Optional[Sequence[str]] = (), fn: Optional[Callable] = None, origin: Optional[str] = None,
                     documents: bool = False, auto_priority: Optional[Callable[..., Optional[int]]] = None):
    """Register ``fn`` as backend ``name`` for ``kinds``; a decorator unless ``fn`` is given.

    Args:
        kinds: a kind (``"flash"``), a :class:`family`, or a tuple of them. Kinds need not be registered yet.
        name: any name but ``"auto"``; registering an existing (kind, name) replaces it.
        supports: ``supports(q, k, v, spec, return_lse) -> Optional[str]`` (default: everything).
        priority: ``auto``'s order (higher first); ``None`` = never picked by ``auto``. Default: 300 / 200 / 100
            for ``triton`` / ``torch`` / ``reference``, ``None`` for any other name.
        available: ``available() -> Optional[str]`` (default: always available).
        devices: device types ``auto`` picks it for; default ``("cuda",)`` for ``triton``, else any.
        origin: the registering module (default ``fn.__module__``), for :func:`backends_from`.
        documents: ``fn`` takes ``doc_ids=`` (packed documents; see the module docstring).
        auto_priority: ``auto_priority(q, k, v, spec) -> Optional[int]``, ``auto``'s priority for those inputs
            (``None``: ``priority``); see the module docstring.

    Raises:
        ValueError: a bad ``name`` or ``kinds``.
    """
    _check_name(name)
    _ensure_builtin()  # the built-in backends first: listings keep their order
    items = (kinds,) if isinstance(kinds, (str, family)) or not isinstance(kinds, (tuple, list)) else tuple(kinds)
    keys = []
    for k in items:
        if isinstance(k, family):
            keys.append(k.key)
        elif isinstance(k, str) and k:
            keys.append(k)
        else:
            raise ValueError(f"kinds must be kind names or attn_zoo.registry.family(...) selectors, got {k!r}")
    default_priority, default_devices = PRODUCT_DEFAULTS.get(name, (None, None))
    prio = default_priority if priority == -1 else priority
    devs = default_devices if devices == () else (tuple(devices) if devices is not None else None)

    def deco(f):
        for key in keys:
            _REGISTRY.setdefault(key, {})[name] = Backend(key, name, f, supports or _always, prio,
                                                          available or _always, devs, origin or f.__module__,
                                                          bool(documents), auto_priority)
            _AVAILABLE.pop((key, name), None)
        forget_derived()  # remembered dispatch decisions may name the replaced backend
        return f

    return deco(fn) if fn is not None else deco


def unregister_backend(kinds, name: str) -> None:
    """Remove backend ``name`` of ``kinds`` (kinds / :class:`family` as in :func:`register_backend`; missing ones
    are ignored)."""
    items = (kinds,) if isinstance(kinds, (str, family)) else tuple(kinds)
    for k in items:
        _REGISTRY.get(k.key if isinstance(k, family) else k, {}).pop(name, None)
        _AVAILABLE.pop((k.key if isinstance(k, family) else k, name), None)
    forget_derived()  # remembered dispatch decisions may name the removed backend


def _ensure_builtin() -> None:
    from . import backends  # noqa: F401  (importing registers the built-in backends)


def get_backends(kind: str) -> Dict[str, Backend]:
    """``{name: Backend}`` that can serve ``kind``: its family's backends overridden by the kind's own.

    Raises ``ValueError`` for an unregistered kind (naming the registered ones)."""
    from .variants import get_variant

    _ensure_builtin()
    v = get_variant(kind)
    regs = dict(_REGISTRY.get(family(v.family).key, {}))
    regs.update(_REGISTRY.get(kind, {}))
    return regs


def auto_order(regs: Dict[str, Backend], inputs: Optional[tuple] = None) -> List[Backend]:
    """The backends ``auto`` tries, highest priority first (registration order among equals). ``inputs``: optional
    ``(q, k, v, spec)``, ranking by :meth:`Backend.priority_for` (what :func:`attn_zoo.attention` does) instead of
    the static ``priority``."""
    ranked = [(b, b.priority if inputs is None else b.priority_for(*inputs)) for b in regs.values()]
    return [b for b, _ in sorted(((b, p) for b, p in ranked if p is not None), key=lambda bp: -bp[1])]


def available_backends(kind: str) -> List[str]:
    """Names of the backends ``auto`` may pick for ``kind``, in ``auto`` order."""
    return [b.name for b in auto_order(get_backends(kind))]


def backend_names(kind: Optional[str] = None) -> List[str]:
    """Every registered backend name (for ``kind`` when given): ``auto``'s in its order, then the others in
    registration order. What sweeps and benchmarks iterate."""
    _ensure_builtin()
    if kind is not None:
        regs = get_backends(kind)
    else:
        regs = {}
        for per in _REGISTRY.values():
            for n, b in per.items():
                if n not in regs or (b.priority or -1) > (regs[n].priority or -1):
                    regs[n] = b
    auto = [b.name for b in auto_order(regs)]
    return auto + [n for n in regs if n not in auto]


def document_backends(kind: str) -> List[str]:
    """Names of the backends of ``kind`` that take packed documents (``doc_ids``), in :func:`backend_names` order."""
    regs = get_backends(kind)
    return [n for n in backend_names(kind) if regs[n].documents]


def backends_from(modules: Iterable[str]) -> List[str]:
    """Names of the backends registered by ``modules`` (or their submodules), in registration order."""
    mods = [m for m in modules if m]
    _ensure_builtin()
    out = []
    for per in _REGISTRY.values():
        for n, b in per.items():
            if n not in out and any(b.origin == m or b.origin.startswith(m + ".") for m in mods):
                out.append(n)
    return out


def load_plugins(modules) -> List[str]:
    """Import plugin modules (a name, a comma-separated string or a list; ``None`` = none): importing registers
    their variants, mixers and backends. Returns the module names. Raises ``ImportError`` naming a missing one."""
    if modules is None:
        return []
    if isinstance(modules, str):
        modules = [m for m in (x.strip() for x in modules.split(",")) if m]
    names = []
    for m in modules:
        m = str(m).strip()
        if not m:
            continue
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise ImportError(f"plugins: cannot import {m!r} ({e}); pass importable module names "
                              f"(e.g. plugins=[my_package.my_backends])") from e
        names.append(m)
    return names
