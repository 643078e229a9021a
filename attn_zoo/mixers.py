"""Sequence mixers: the layer of a block that mixes positions, attention being one of them.

A mixer is an ``nn.Module`` mapping ``x (B, N, d_model) -> (B, N, d_model)`` (``forward(x)``). A mixer that can
decode from a state also has ``new_cache(batch_size, capacity, dtype, device, page_size, shuffle_pages)`` and
``forward(x, cache, pos)`` (the attention mixer does); the others run in training and ``generate(use_cache=False)``.

Registry (zoology's ``sequence_mixer``, Arora et al. 2023, in spirit): :func:`register_mixer` names a factory (a class
or a callable); :func:`build_mixer` calls it with the options of a :class:`MixerSpec` as keyword arguments plus the
context arguments its signature names: ``d_model``, ``n_head``, ``head_dim``, ``max_seq_len``, ``dropout``,
``bias``, ``layer_idx``, ``backend``, ``config`` (the :class:`~attn_zoo.model.GPTConfig`), ``rotary``. The built-in
mixers (``attention``, ``mamba2``, ``deltanet``, ``gated_deltanet``, ``linformer``, ``mla``) are registered when the
registry is first queried, whichever modules the caller imported. A mixer need
not be registered: ``MixerSpec("my_pkg.layers.MyMixer", ...)`` (or ``_target_: my_pkg.layers.MyMixer`` in a
config) imports it by path; with no registration and no ``causal`` option, :class:`~attn_zoo.model.GPT` checks that
it is causal by a probe (:func:`causality_probe`) and refuses it if not.

The ``attention`` mixer (:class:`attn_zoo.model.Attention`) is built from an :class:`~attn_zoo.AttentionSpec`; every
other mixer from a :class:`MixerSpec`. In configs (``model.layers`` of ``train.py``) a layer is the name of a
``conf/attention/<name>.yaml``, the name of a registered mixer, or a dict: spec fields (attention), or
``{mixer: <name or path>, <option>: ...}`` / ``{_target_: <path>, <option>: ...}``::

    import torch.nn as nn
    from attn_zoo.mixers import register_mixer

    @register_mixer("conv", causal=True)
    class CausalConv(nn.Module):
        def __init__(self, d_model, kernel_size=4):
            ...
        def forward(self, x):           # (B, N, d_model) -> (B, N, d_model)
            ...

    # python train.py +plugins=[my_module] model.layers=[conv,flash]
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from .spec import AttentionSpec, make_spec

_ATTENTION_TARGETS = (None, "attn_zoo.make_spec", "attn_zoo.spec.make_spec", "attn_zoo.AttentionSpec",
                      "attn_zoo.spec.AttentionSpec")
CONTEXT = ("d_model", "n_head", "head_dim", "max_seq_len", "dropout", "bias", "layer_idx", "backend", "config", "rotary")


@dataclass(frozen=True)
class MixerEntry:
    """A registered mixer: ``factory`` builds the module; ``causal``: position ``t``'s output depends on positions
    ``<= t`` only (``GPT.generate`` needs it)."""

    name: str
    factory: Callable
    causal: bool = True


_MIXERS: Dict[str, MixerEntry] = {}
_BUILTIN_MODULES = ("attn_zoo.model", "attn_zoo.families", "attn_zoo.mla")  # attention; mamba2, deltanet, ...; mla
_builtins_loaded = False


def _load_builtins() -> None:
    """Import the modules of the built-in mixers (``attention``, ``mamba2``, ``deltanet``, ``gated_deltanet``,
    ``linformer``, ``mla``), once, so that every query of the registry sees them whatever the caller imported."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True  # before the imports: a module that queries the registry as it loads does not recurse
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


def register_mixer(name: str, factory: Optional[Callable] = None, *, causal: bool = True):
    """Register ``factory`` (a class or callable) as mixer ``name``; a decorator unless ``factory`` is given.

    Raises ``ValueError`` for a name that is not an identifier (dotted names are import paths)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"mixer name={name!r} must be an identifier (a dotted name is read as an import path)")

    def deco(f):
        _MIXERS[name] = MixerEntry(name, f, bool(causal))
        return f

    return deco(factory) if factory is not None else deco


def mixer_names() -> List[str]:
    """The registered mixer names: the built-in ones (``attention``, ``mamba2``, ``deltanet``, ``gated_deltanet``,
    ``linformer``, ``mla``; registered at the first query of the registry) and the plugins'."""
    _load_builtins()
    return list(_MIXERS)


def causal_mixer_names() -> List[str]:
    """The registered mixers that are causal (:attr:`MixerEntry.causal`), sorted, ``attention`` and the other
    built-in ones included (:func:`mixer_names`): what a causal language model may use."""
    _load_builtins()
    return sorted(n for n, e in _MIXERS.items() if e.causal)


def _freeze(key: str, value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(key, x) for x in value)
    if isinstance(value, Mapping) or (value is not None and not isinstance(value, (int, float, str, bool))):
        if not isinstance(value, Mapping):  # a dict / DictConfig would become its keys
            try:  # ListConfig
                return tuple(_freeze(key, x) for x in list(value))
            except TypeError:
                pass
        raise ValueError(f"mixer option {key}={value!r}: options must be numbers, strings, bools, None or lists")
    return value


def _thaw(value):
    return [_thaw(x) for x in value] if isinstance(value, tuple) else value


def _import_path(path: str):
    _load_builtins()
    mod, _, attr = path.rpartition(".")
    if not mod:
        raise ValueError(f"mixer={path!r} is not registered; registered mixers: {', '.join(_MIXERS) or '(none)'} "
                         f"(or give an import path, e.g. my_package.layers.MyMixer)")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"mixer={path!r} cannot be imported ({type(e).__name__}: {e}); registered mixers: "
                         f"{', '.join(_MIXERS) or '(none)'}") from e


@dataclass(frozen=True)
class MixerSpec:
    """One non-attention layer of a model: ``mixer`` (a registered name or an import path of a class / factory),
    its ``options`` (keyword arguments, a tuple of ``(name, value)`` pairs or a dict) and an optional ``name`` for
    logs. Frozen and hashable like :class:`~attn_zoo.AttentionSpec`; raises ``ValueError`` for an unknown name."""

    mixer: str
    options: Tuple[Tuple[str, Any], ...] = ()
    name: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.mixer, str) or not self.mixer:
            raise ValueError(f"mixer must be a mixer name or an import path, got {self.mixer!r}")
        if self.mixer == "attention":
            raise ValueError("the attention mixer is described by an AttentionSpec (attn_zoo.make_spec), not a MixerSpec")
        _load_builtins()
        if "." not in self.mixer and self.mixer not in _MIXERS:
            raise ValueError(f"mixer={self.mixer!r} is not supported; allowed values: "
                             f"{', '.join(n for n in _MIXERS if n != 'attention') or '(none registered)'} "
                             f"(register one with attn_zoo.register_mixer, or give an import path)")
        opts = dict(self.options) if not isinstance(self.options, dict) else dict(self.options)
        object.__setattr__(self, "options", tuple(sorted((str(k), _freeze(str(k), v)) for k, v in opts.items())))

    @property
    def label(self) -> str:
        """Short name for logs: ``name``, else the mixer name (last part of an import path)."""
        return self.name or self.mixer.rsplit(".", 1)[-1]

    @property
    def causal(self) -> bool:
        """Whether position ``t``'s output depends on positions ``<= t`` only: the registration's ``causal`` (also for
        an import path of a registered mixer's class, ``attn_zoo.families.linformer.Linformer``) and a ``causal``
        option of the spec (``MixerSpec("mla", {"causal": False})`` is non-causal although ``mla`` is registered
        causal)."""
        entry = self._entry()
        option = bool(dict(self.options).get("causal", True))
        return (entry.causal and option) if entry is not None else option

    @property
    def causal_declared(self) -> bool:
        """Whether :attr:`causal` is said by a registration or a ``causal`` option; ``False`` for an import path of
        an unregistered class given without ``causal``, whose causality :class:`~attn_zoo.model.GPT` checks by a
        probe (:func:`causality_probe`)."""
        return self._entry() is not None or "causal" in dict(self.options)

    def _entry(self) -> Optional[MixerEntry]:
        """The registration of :attr:`mixer` (a registered name, or an import path of a registered factory)."""
        _load_builtins()
        entry = _MIXERS.get(self.mixer)
        if entry is None and "." in self.mixer:  # an import path of a registered mixer: its registration says
            try:
                factory = _import_path(self.mixer)
            except ValueError:  # not importable: build_mixer names it
                factory = None
            entry = next((e for e in _MIXERS.values() if e.factory is factory), None)
        return entry

    def kwargs(self) -> dict:
        return {k: _thaw(v) for k, v in self.options}

    def to_dict(self) -> dict:
        """Plain dict (checkpoints / hparams); :func:`make_layer_spec` inverts it."""
        d = {"mixer": self.mixer, **self.kwargs()}
        if self.name is not None:
            d["name"] = self.name
        return d

    def factory(self) -> Callable:
        _load_builtins()
        entry = _MIXERS.get(self.mixer)
        return entry.factory if entry is not None else _import_path(self.mixer)


LayerSpec = Union[AttentionSpec, MixerSpec]


def make_layer_spec(**kwargs) -> LayerSpec:
    """A layer from config fields: ``mixer: <name or path>`` (or a ``_target_`` other than ``attn_zoo.make_spec``)
    gives a :class:`MixerSpec` of the remaining fields, anything else (``mixer: attention`` or none) an
    :class:`~attn_zoo.AttentionSpec` via :func:`attn_zoo.make_spec`."""
    target = kwargs.pop("_target_", None)
    mixer = kwargs.pop("mixer", None)
    if mixer is None and target not in _ATTENTION_TARGETS and target != f"{__name__}.make_layer_spec":
        mixer = target
    if mixer is None or mixer == "attention":
        return make_spec(**kwargs)
    name = kwargs.pop("name", None)
    return MixerSpec(str(mixer), tuple(kwargs.items()), name)


def layer_to_dict(spec: LayerSpec) -> dict:
    """Plain dict of a layer (:func:`make_layer_spec` inverts it)."""
    if isinstance(spec, MixerSpec):
        return spec.to_dict()
    from dataclasses import asdict

    d = asdict(spec)
    if d.get("window_size") is not None:
        d["window_size"] = list(d["window_size"])
    return d


def layer_from_dict(d) -> LayerSpec:
    return make_layer_spec(**dict(d))


def forward_takes(module, name: str) -> bool:
    """Whether ``module.forward`` takes the keyword argument ``name`` (or ``**kwargs``); ``module`` a mixer or its
    class (what :class:`~attn_zoo.model.GPT` asks a layer, e.g. ``doc_ids`` for packed documents)."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError, AttributeError):  # pragma: no cover - a builtin forward
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def mixer_class(spec: LayerSpec) -> Optional[type]:
    """The ``nn.Module`` class a layer spec builds, known without building it: the factory when it is a class, else
    the factory's ``mixer_class`` attribute (a factory function names the class it returns, as the ``attention``
    mixer does); ``None`` when unknown (a plain function factory)."""
    if isinstance(spec, AttentionSpec):
        entry = _MIXERS.get("attention")
        if entry is None:
            from . import model  # noqa: F401  (registers the attention mixer)

            entry = _MIXERS["attention"]
        factory = entry.factory
    else:
        factory = spec.factory()
    return factory if inspect.isclass(factory) else getattr(factory, "mixer_class", None)


def layer_takes(spec: LayerSpec, name: str) -> Optional[bool]:
    """Whether the mixer of ``spec`` takes the keyword argument ``name`` in its ``forward`` (:func:`forward_takes`
    of :func:`mixer_class`), asked before the model is built (config validation); ``None`` when its class is not
    known without building it. ``"doc_ids"`` of an attention layer also asks its variant (``documents=False``:
    ``streaming``, whose sinks have no per-document form, is refused with documents whatever its mixer takes)."""
    if name == "doc_ids" and isinstance(spec, AttentionSpec):
        from .variants import get_variant

        if not get_variant(spec.kind).documents:
            return False
    cls = mixer_class(spec)
    return None if cls is None else forward_takes(cls, name)


def _call(factory: Callable, what: str, context: dict, options: dict):
    """``factory(**options, **<the context arguments its signature names>)``; errors name the mixer."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins / C extensions: options only
        sig, params, var_kw = None, {}, True
    else:
        params = sig.parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kw = {k: v for k, v in context.items() if k in params and k not in options}
    if var_kw and "d_model" not in kw and "d_model" not in options:
        kw["d_model"] = context["d_model"]
    if sig is not None:  # the arguments are checked against the signature: a TypeError raised inside the
        try:             # factory (a bug in it) reaches the user as it is, not as "cannot be built with options"
            sig.bind(**options, **kw)
        except TypeError as e:
            accepted = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            raise ValueError(f"{what} cannot be built with options {sorted(options)} ({e}); its parameters: "
                             f"{', '.join(accepted)} (context arguments given by name: {', '.join(CONTEXT)})") from e
    try:
        return factory(**options, **kw)
    except TypeError as e:  # raised inside the factory: kept as it is (a bug in it, or an option of a wrong type
        # that it passed on), with a note naming the mixer and what it was given (shown under the traceback)
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        e.add_note(f"(raised inside the factory of {what}, built with {given}"
                   f"{' and ' + ', '.join(sorted(kw)) if kw else ''})")
        raise


def causality_probe(mixer: nn.Module, d_model: int, seq_len: int = 8, every_position: bool = False) -> Optional[float]:
    """How much ``mixer``'s output at earlier positions moves when the input at one later position changes: the max
    abs difference over the max abs output (0 for a causal mixer, ~1e-7 for one that is causal in exact arithmetic
    only, an FFT convolution; a few units of the dtype's eps in bf16). The changed position is the last one, or,
    with ``every_position``, each position ``j >= 1`` in turn (one batched forward of ``seq_len`` rows: row ``j``
    has position ``j`` changed, its outputs before ``j`` are compared), which also finds a mixer that leaks from a
    position other than the last. On random ``(B, seq_len, d_model)`` inputs in eval mode and without gradients,
    on the device and dtype of its first floating-point parameter (:func:`probe_device_dtype`). Each forward starts
    from the same seeded RNG state inside :func:`torch.random.fork_rng` (a mixer that draws random numbers as it
    runs draws the same ones each time), and every submodule gets its own training mode back: the probe leaves the
    global RNG and the modes as they were. ``None`` when the probe cannot say: meta parameters (no values), the
    forward raised (a length it does not take, a GPU it needs), returned no tensor of the input's shape, or is not
    deterministic (two calls on the same input differ). Used for mixers whose causality no registration or option
    declares (:attr:`MixerSpec.causal_declared`)."""
    device, dtype = probe_device_dtype(mixer)
    if device.type == "meta" or seq_len < 2:  # shapes only, or no earlier position: nothing to compare
        return None
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, seq_len, d_model, generator=g, device="cpu")  # (1, N, d_model); not the default device
    changed = torch.randn(1, seq_len, d_model, generator=g, device="cpu")
    rows = range(1, seq_len) if every_position else [seq_len - 1]
    x = base.repeat(1 + len(rows), 1, 1)  # row 0: the base input; row r: one position changed
    for r, j in enumerate(rows, start=1):
        x[r, j] = changed[0, j]
    modes = [(m, m.training) for m in mixer.modules()]
    cuda = [device] if device.type == "cuda" else []

    def run(t):
        with torch.random.fork_rng(devices=cuda):
            torch.default_generator.manual_seed(0)
            if cuda:
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(0)
            return mixer(t.to(device, dtype))

    mixer.eval()
    try:
        with torch.no_grad():
            y, y_again = run(x), run(x)
    except Exception:  # noqa: BLE001 - a mixer that needs a GPU, a cache, other arguments: the probe cannot say
        return None
    finally:
        for m, training in modes:
            m.training = training
    if not all(isinstance(t, torch.Tensor) and t.shape == x.shape for t in (y, y_again)) or not torch.equal(y, y_again):
        return None
    y = y.float()
    scale = float(y.abs().max()) or 1.0
    moved = max(float((y[r, :j] - y[0, :j]).abs().max()) for r, j in enumerate(rows, start=1))
    return moved / scale


def probe_device_dtype(mixer: nn.Module) -> Tuple[torch.device, torch.dtype]:
    """The device and dtype :func:`causality_probe` runs ``mixer`` in: its first floating-point parameter's, else
    the CPU in float32."""
    p = next((p for p in mixer.parameters() if p.is_floating_point()), None)
    return (p.device, p.dtype) if p is not None else (torch.device("cpu"), torch.float32)


def build_mixer(spec: LayerSpec, config, layer_idx: int = 0, backend: str = "auto", rotary=None):
    """The ``nn.Module`` of one layer: the ``attention`` mixer for an :class:`~attn_zoo.AttentionSpec`, else the
    :class:`MixerSpec`'s factory. Raises ``ValueError`` / ``TypeError`` naming the mixer (``ValueError`` too when
    the factory returns something that is not an ``nn.Module``)."""
    context = {"d_model": config.d_model, "n_head": config.n_head, "head_dim": config.head_dim,
               "max_seq_len": config.max_seq_len, "dropout": config.dropout, "bias": config.bias,
               "layer_idx": layer_idx, "backend": backend, "config": config, "rotary": rotary}
    if isinstance(spec, AttentionSpec):
        entry = _MIXERS.get("attention")
        if entry is None:
            from . import model  # noqa: F401  (registers the attention mixer)

            entry = _MIXERS["attention"]
        return _call(entry.factory, "mixer 'attention'", dict(context, spec=spec), {})
    if not isinstance(spec, MixerSpec):
        raise TypeError(f"a layer must be an AttentionSpec or a MixerSpec, got {type(spec).__name__}")
    mixer = _call(spec.factory(), f"mixer {spec.mixer!r}", context, spec.kwargs())
    if not isinstance(mixer, nn.Module):  # a plain attribute of the block: no parameters, not callable as a layer
        raise ValueError(f"mixer {spec.mixer!r} built a {type(mixer).__name__}, not an nn.Module; a sequence mixer is "
                         f"an nn.Module mapping (B, N, d_model) to (B, N, d_model)")
    return mixer
