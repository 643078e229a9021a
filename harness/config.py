"""Config resolution of a training run: the checks and the layer specs ``train.py`` derives from its Hydra config
before anything is built or written (:func:`validate_config`, :func:`layer_specs`, :func:`check_attention_backend`,
:func:`check_model_config`), and the one :class:`attn_zoo.model.ModelConfig` of the run (:func:`model_config`). Used by ``train.py`` and ``eval/bench_model.py`` (``--specs conf``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from attn_zoo.model import (GPTConfig, ModelConfig, config_from_dict, doc_ids_refusal, noncausal_layer_reason,
                            redraw_interval_reason)
from attn_zoo.spec import AttentionSpec

from .callbacks import StopAt
from .lit import validate_optim_config

from .errors import ConfigError, ConfigFileError, ConfigImportError, config_errors  # noqa: F401


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
"""The repository's Hydra configs (``conf/``, beside ``train.py``): ``conf/attention/<name>.yaml`` names the layers
of ``model.layers=[...]``."""


def _spec_from_cfg(node) -> AttentionSpec:
    node = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    from attn_zoo.mixers import make_layer_spec  # an attention spec, or a mixer (`mixer:` / another `_target_`)

    return make_layer_spec(**node)


def layer_specs(cfg: DictConfig) -> List[AttentionSpec]:
    """The attention spec of every layer.

    ``model.layers`` null: every layer uses the ``attention`` group's spec. Otherwise a list of ``n_layer``
    entries, each the name of a ``conf/attention/<name>.yaml`` (the selected ``attention`` group, including
    command-line overrides, when the name matches ``attention.name``) or an inline dict of spec fields.

    Raises:
        ValueError: an unknown layer name, a bad spec field (naming the node), a count other than ``model.n_layer``.
        ConfigImportError: a module of ``plugins`` that cannot be imported (an ``ImportError``).
    """
    from attn_zoo import load_plugins

    try:  # modules that register variants / mixers / backends (+plugins=[...])
        load_plugins(cfg.get("plugins"))
    except ImportError as e:  # the module's name and why: printed alone, not after a traceback
        raise ConfigImportError(str(e)) from None
    base = _qualified("attention", _spec_from_cfg, cfg.attention)
    layers = cfg.model.get("layers")
    n_layer = int(cfg.model.n_layer)
    if layers is None:
        return [base] * n_layer
    layers = list(layers)
    specs = []  # every entry resolved first: an unknown name is named before a count that does not match
    for i, entry in enumerate(layers):
        if isinstance(entry, str):
            if entry == base.label:
                specs.append(base)
                continue
            f = CONF_DIR / "attention" / f"{entry}.yaml"
            if not f.exists():
                from attn_zoo.mixers import MixerSpec, mixer_names

                if entry in mixer_names() and entry != "attention":  # a registered sequence mixer, default options
                    specs.append(MixerSpec(entry))
                    continue
                raise ValueError(f"model.layers[{i}]={entry!r} is not an attention config or a registered mixer; "
                                 f"allowed values: {', '.join(_layer_names())}")
            where = f"model.layers[{i}] (conf/attention/{entry}.yaml)"
            specs.append(_qualified(where, _spec_from_cfg, OmegaConf.load(f)))
        elif isinstance(entry, (dict, DictConfig)):
            specs.append(_qualified(f"model.layers[{i}]", _spec_from_cfg, entry))
        else:  # a number, null, a list, ...: neither a config name nor an inline dict of spec fields
            shown = "null" if entry is None else repr(_plain(entry))
            raise ValueError(f"model.layers[{i}]={shown} is not an attention config or a registered mixer; allowed "
                             f"values: {', '.join(_layer_names())} (or an inline dict of spec fields, "
                             f"{{kind: linear, ...}})")
    if len(layers) != n_layer:
        raise ValueError(f"model.layers has {len(layers)} entries but model.n_layer={n_layer}; give one per layer")
    return specs


def _layer_names() -> List[str]:
    """What a string entry of ``model.layers`` may name: ``conf/attention/<name>.yaml``, then the registered mixers."""
    from attn_zoo.mixers import mixer_names

    names = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
    return names + [m for m in mixer_names() if m != "attention" and m not in names]  # once each


def _plain(v):
    """``v`` as plain Python (an OmegaConf list / dict as a list / dict) for messages."""
    return OmegaConf.to_container(v, resolve=False) if isinstance(v, (DictConfig, ListConfig)) else v


def check_attention_backend(backend, specs, model: Optional[GPTConfig] = None, seq_len: Optional[int] = None,
                            device: Optional[str] = None, dtype: torch.dtype = torch.float32,
                            documents: bool = False) -> None:
    """``attention_backend``: ``auto`` or a backend registered for the kind of every attention layer in ``specs``
    (plugins loaded: :func:`layer_specs`) and available here (the registry's availability: a missing optional package
    such as ``fa4`` (flash-attn-4) or ``fla`` (fla-core), no CUDA device for ``sdpa_flash``, ...).

    With ``model`` (its ``n_head`` / ``head_dim``), ``seq_len`` and ``device`` (the device type training runs on;
    ``None``: not known here, e.g. on a CUDA machine, where the dtype and shapes only show at the first forward) the
    backend is also asked whether it runs an input of the training's shapes, ``dtype`` and device
    (:meth:`attn_zoo.registry.Backend.why_not`), and, with ``documents`` (packed documents), whether it takes
    ``doc_ids``: ``triton`` on a machine without CUDA (and without ``TRITON_INTERPRET=1``) is refused here, not at the
    first training step. Raises ``ValueError`` naming ``attention_backend``, the layer and the backends available
    here (or the package to install)."""
    from attn_zoo.registry import backend_names, get_backends

    if backend == "auto":
        return
    if not isinstance(backend, str) or backend not in backend_names():
        raise ValueError(f"attention_backend={backend!r} is not a registered backend; allowed values: auto, "
                         f"{', '.join(backend_names())}")
    probe = model is not None and seq_len is not None and device is not None
    for i, spec in enumerate(specs):
        kind = getattr(spec, "kind", None)
        if not isinstance(spec, AttentionSpec) or kind is None:
            continue  # a sequence mixer: no attention backend
        where = "attention" if len(set(specs)) == 1 else f"model.layers[{i}]"
        if backend not in backend_names(kind):
            raise ValueError(f"attention_backend={backend!r} has no implementation of kind={kind!r} ({where}: "
                             f"{spec.label}; the backend applies to every layer); allowed values for it: auto, "
                             f"{', '.join(backend_names(kind))}")
        backends = get_backends(kind)
        why = backends[backend].unavailable()
        if why is not None and "cannot be imported" in why:  # an optional package (fa4, fla, ...) is missing
            raise ValueError(f"attention_backend={backend!r} is not installed here: {why}")
        if why is None and probe:
            why = _backend_refusal(backends[backend], spec, model, seq_len, device, dtype, documents)
        if why is not None:
            here = [n for n in backend_names(kind) if backends[n].unavailable() is None and not (
                probe and _backend_refusal(backends[n], spec, model, seq_len, device, dtype, documents))]
            raise ValueError(f"attention_backend={backend!r} cannot run {where}: {spec.label} here ({why}); "
                             f"available here for it: auto, {', '.join(here)}")


def _backend_refusal(b, spec: AttentionSpec, model: GPTConfig, seq_len: int, device: str, dtype: torch.dtype,
                     documents: bool) -> Optional[str]:
    """Why backend ``b`` cannot run ``spec`` on the training's inputs (``(1, n_head, seq_len, head_dim)`` queries,
    the layer's K/V heads, ``dtype`` on ``device``, requiring grad), asked of the backend; ``None`` when it can."""
    if documents and not b.documents:
        return "it does not take doc_ids (packed documents, data.pack=true with data.doc_mask=true)"
    hkv = spec.resolve_kv_heads(model.n_head)
    # requiring grad, as in training (FlexAttention off CUDA has no backward)
    q = torch.empty(1, model.n_head, seq_len, model.head_dim, dtype=dtype, device=device, requires_grad=True)
    kv = torch.empty(1, hkv, seq_len, model.head_dim, dtype=dtype, device=device, requires_grad=True)
    try:
        return b.why_not(q, kv, kv, spec)
    except Exception:  # noqa: BLE001 - a check that fails on the probe proves nothing: the first forward decides
        return None


def _qualified(where: str, fn, *args):
    """``fn(*args)``, with a ``ValueError`` re-raised naming the config node it came from (``attention: window_size
    must be ...``): the spec and model classes name their own fields, not the key a user overrides."""
    try:
        return fn(*args)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None  # the message carries e's: a chain would print it twice


def _attention_yaml(cfg: DictConfig) -> Optional[Path]:
    """The ``conf/attention/<choice>.yaml`` the run's ``attention`` group was composed from: Hydra's choice of the
    group when Hydra runs (``attention=flash``, an experiment's ``override /attention: ...``), else (a config composed
    without Hydra's runtime, e.g. by the tests) the file named after ``attention.name``; ``None`` when there is none."""
    choice = None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            choice = HydraConfig.get().runtime.choices.get("attention")
    except Exception:  # noqa: BLE001 (no Hydra runtime: the name decides)
        choice = None
    if choice is None:
        choice = cfg.attention.get("name") if isinstance(cfg.get("attention"), DictConfig) else None
    if not isinstance(choice, str) or not choice:
        return None
    f = CONF_DIR / "attention" / f"{choice}.yaml"
    return f if f.is_file() else None


def _label_value(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join("null" if x is None else str(x) for x in v) + "]"
    return "null" if v is None else str(v)


def attention_label(cfg: DictConfig) -> Optional[str]:
    """The label of the ``attention`` group's layers as trained: ``attention.name``, with the fields that differ from
    the group's yaml (``conf/attention/<choice>.yaml``, :func:`_attention_yaml`) while ``attention.name`` is the yaml's
    own, so that two runs of a sweep over a field (``-m attention.window_size=[15,0],[31,0]``) stay apart in the final
    table and ``final_metrics.json``. The suffixes follow ``eval.recall.variant_label``: ``(w=<left>)`` for
    ``window_size``, ``(<feature map>)`` for ``feature_map``, ``(<field>=<value>)`` for any other field:
    ``sliding_window (w=15)``, ``linear (relu)``, ``dilated_window (dilation=4)``.

    ``None`` when the group has no yaml here (a plugin's config, an inline node). Raises ``ValueError`` when a label
    would name something the run does not train: ``attention.kind`` (or ``mixer``) changed from the yaml's without
    ``attention.name`` (``attention=flash attention.kind=linear`` trains linear attention), or a field whose yaml value
    the name spells (``attention=linear_taylor attention.feature_map=elu1``): the message names the overridden fields
    and asks for ``attention.name=<label>``."""
    from attn_zoo.mixers import layer_to_dict

    node = cfg.get("attention")
    f = _attention_yaml(cfg) if isinstance(node, DictConfig) else None
    if f is None:
        return None
    try:
        base = _spec_from_cfg(OmegaConf.load(f))
        spec = _spec_from_cfg(node)
    except Exception:  # noqa: BLE001 (a bad field: layer_specs names it; a yaml this check cannot read: no check)
        return None
    label = spec.label
    if spec.name != base.name or spec.name is None:
        return label  # the user's own label (attention.name=...): theirs to choose
    a, b = layer_to_dict(base), layer_to_dict(spec)
    changed = [k for k in sorted(set(a) | set(b)) if k != "name" and a.get(k) != b.get(k)]
    if not changed:
        return label
    what = ", ".join(f"attention.{k}={_label_value(b.get(k))} (the yaml's: {_label_value(a.get(k))})" for k in changed)
    words = set(str(spec.name).split("_"))
    spelled = [k for k in changed if k in ("kind", "mixer")
               or (isinstance(a.get(k), str) and (a[k] == spec.name or a[k] in words))]
    if spelled:
        raise ValueError(
            f"attention.name={spec.name!r} (conf/attention/{f.name}) would label a run that does not train it: "
            f"{what} overrides what the name says, while attention.name stays; the final table, final_metrics.json "
            f"and the eval reports would call this run {spec.name!r}. Pass attention.name=<label> saying what it "
            f"trains (e.g. attention.name={_suggest_name(b)}), or pick the config of that variant "
            f"(attention=<name>; allowed values: {', '.join(sorted(p.stem for p in f.parent.glob('*.yaml')))})")
    first = [k for k in ("feature_map", "window_size") if k in changed]
    parts = []
    for k in first + [k for k in changed if k not in first]:
        v = b.get(k)
        if k == "feature_map" and v is not None:
            parts.append(str(v))
        elif k == "window_size" and isinstance(v, (list, tuple)) and v:
            right = "" if spec.causal or len(v) < 2 or v[1] == 0 else f",{_label_value(v[1])}"  # causal: right is 0
            parts.append(f"w={_label_value(v[0])}{right}")
        else:
            parts.append(f"{k}={_label_value(v)}")
    return label + "".join(f" ({p})" for p in parts)


def _suggest_name(d: dict) -> str:
    """A label for a spec's fields (the ``attention.name`` suggested when the yaml's would be wrong)."""
    kind = str(d.get("kind") or d.get("mixer") or "attention")
    fm = d.get("feature_map")
    return f"{kind}_{fm}" if isinstance(fm, str) and fm and fm not in kind and kind != "linear" else \
        (f"linear_{fm}" if kind == "linear" and fm not in (None, "elu1") else kind)


def run_label(cfg: DictConfig, model: ModelConfig) -> str:
    """The run's ``variant`` in the final table, ``final_metrics.json``, the logged hyperparameters and the W&B run
    name: the layers' labels joined by ``+`` (``flash+flash``), each :func:`attention_label` when every layer is the
    ``attention`` group's (``model.layers`` null: ``sliding_window (w=15)+sliding_window (w=15)``), else the
    ``model.layers`` entries' labels (as ``eval.recall`` labels a hybrid). Raises
    ``ValueError`` (:func:`attention_label`) for a label that would name another variant than the one trained, also
    when only some layers (``model.layers`` entries naming the group) are the group's."""
    layers = cfg.model.get("layers")
    name = cfg.attention.get("name") if isinstance(cfg.get("attention"), DictConfig) else None
    if layers is None:
        label = attention_label(cfg)
        return "+".join(label or s.label for s in model.layers)
    if any(isinstance(e, str) and e == name for e in layers):
        attention_label(cfg)  # the group serves those entries: refused when its name would be wrong
    return "+".join(s.label for s in model.layers)


def check_model_config(model_cfg: Dict) -> None:
    """``model.*`` as :class:`attn_zoo.model.GPTConfig` checks it (plus ``model.redraw_interval``), the errors naming
    ``model.<key>``. Raises ``ValueError``."""
    fields = dict(model_cfg)
    redraw = fields.pop("redraw_interval", 0)
    redraw = 0 if redraw is None else redraw
    why = redraw_interval_reason(redraw)
    if why is not None:
        raise ValueError(f"model.redraw_interval={redraw!r}: {why}")
    fields.pop("layers", None)
    try:
        config_from_dict(fields)
    except ValueError as e:
        msg = str(e)
        known = sorted(GPTConfig.__dataclass_fields__, key=len, reverse=True)
        lead = next((k for k in known if msg.startswith(k) and msg[len(k):len(k) + 1] in (" ", "=")), None)
        raise ValueError(f"model.{msg}" if lead else f"model: {msg}") from None


def model_config(cfg: DictConfig) -> ModelConfig:
    """The run's :class:`~attn_zoo.model.ModelConfig`, built once from ``cfg.model`` (the :class:`GPTConfig` fields
    and ``model.redraw_interval``) and :func:`layer_specs` (``attention`` / ``model.layers``, plugins loaded). Raises
    ``ValueError`` naming ``model.<key>`` (:func:`check_model_config`) or the layer."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    check_model_config(fields)
    fields.pop("layers", None)
    redraw = fields.pop("redraw_interval", 0) or 0
    return ModelConfig(config_from_dict(fields), tuple(layer_specs(cfg)), redraw)


def layer_notes(cfg: DictConfig, model: ModelConfig) -> List[str]:
    """Settings of the run's layers that do not act as written, one note each (``train.py`` logs them as warnings
    before training), so that nothing is dropped silently:

    * a causal window with a right side (``attention=sliding_window attention.window_size=[15,15]``): ``causal=True``
      clips ``right`` to 0 (:class:`attn_zoo.AttentionSpec`), the run trains ``window_size=(15, 0)``;
    * ``model.redraw_interval > 0`` with no FAVOR+ layer (``feature_map: favor``, e.g. ``attention=linear_favor``):
      the redraw applies to those layers only, here to none.
    """
    from attn_zoo.spec import _reads
    from attn_zoo.variants import get_variant

    notes, seen = [], set()
    nodes = _layer_nodes(cfg, len(model.layers)) if cfg.get("model") is not None else ["attention"] * len(model.layers)
    for spec, node in zip(model.layers, nodes):
        if not isinstance(spec, AttentionSpec) or spec in seen:
            continue
        seen.add(spec)
        ws = spec.window_size if _reads(get_variant(spec.kind), "window_size") else None
        if spec.causal and ws is not None and ws[1] != 0:
            left, right = ("null" if w is None else str(w) for w in ws)
            notes.append(f"{node}.window_size=[{left},{right}] with causal=true ({spec.label}): causal clips the right "
                         f"side ({right}{': unbounded' if ws[1] is None else ''}) to 0, so this run trains "
                         f"window_size=[{left},0] (each query sees "
                         f"{'every key' if ws[0] is None else 'the ' + left + ' keys'} before it and itself); pass "
                         f"{node}.window_size=[{left},0] to say so")
    if model.redraw_interval > 0:
        favor = [i for i, s in enumerate(model.layers)
                 if isinstance(s, AttentionSpec) and s.family == "linear" and getattr(s, "feature_map", None) == "favor"]
        if not favor:
            labels = sorted({s.label for s in model.layers})
            notes.append(f"model.redraw_interval={model.redraw_interval} has no effect: it redraws the random "
                         f"features of FAVOR+ layers (feature_map: favor, e.g. attention=linear_favor), and none of "
                         f"this model's layers ({', '.join(labels)}) is one; set model.redraw_interval=0")
    return notes


def dense_mask_notes(layers, seq_len: int, max_len: int = 4096) -> List[str]:
    """One note per distinct layer spec whose mask (window, block layout, dilation) allows every pair that plain
    (causal) attention allows at ``seq_len`` tokens: such a "lossy" variant is exact attention at that length, and a
    comparison there measures nothing of its sparsity (e.g. ``attention=sparse``, block_size 16 with 1 local + 1
    global + 1 random block, covers all 4 blocks of a 64-token sequence); and, the other way, one whose mask lets no
    query see more than one key (itself): ``attention=dilated_window attention.dilation=100`` at 64 tokens, a layer
    that mixes no tokens. Checked exactly up to ``max_len`` tokens;
    longer lengths are skipped (a pattern that is dense there is not a plausible config)."""
    from attn_zoo import mask_info
    from attn_zoo.variants import get_variant

    notes, seen = [], set()
    if seq_len > max_len:
        return notes
    for spec in layers:
        if not isinstance(spec, AttentionSpec) or spec in seen:
            continue
        seen.add(spec)
        if get_variant(spec.kind).family != "softmax":
            continue
        mi = mask_info(spec, seq_len, seq_len)
        if mi.is_full or mi.is_plain_causal:
            continue  # exact by design (flash, gqa, ...)
        dense = mi.dense()
        allowed = int(dense.sum())
        plain = seq_len * (seq_len + 1) // 2 if spec.causal else seq_len * seq_len
        per_query = int(dense.sum(-1).max()) if seq_len > 1 else 2
        if per_query <= 1:
            notes.append(f"attention {spec.label} lets every query see at most {per_query} key (its own token) at "
                         f"seq_len={seq_len}: its mask{_mask_fields(spec)} reaches no earlier key; the layer mixes no "
                         f"tokens, it trains as a per-token MLP and a comparison there measures nothing of attention; "
                         f"take a smaller dilation / a larger window or block pattern, or a longer data.seq_len")
        elif allowed >= plain:
            notes.append(f"attention {spec.label} attends to every pair at seq_len={seq_len} (its mask covers the "
                         f"whole {'causal ' if spec.causal else ''}square): it runs as exact attention here; take a "
                         f"longer data.seq_len or a smaller window / block pattern to measure the variant")
    return notes


def _mask_fields(spec: AttentionSpec) -> str:
    """`` (window_size=[15,0], dilation=100)``: the mask fields of ``spec`` its variant reads, for a note."""
    from attn_zoo.spec import _reads
    from attn_zoo.variants import get_variant

    v = get_variant(spec.kind)
    got = [f"{k}={_label_value(getattr(spec, k))}" for k in ("window_size", "dilation", "block_size", "sink_size")
           if hasattr(spec, k) and _reads(v, k) and getattr(spec, k) is not None]
    return f" ({', '.join(got)})" if got else ""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_config(cfg: DictConfig) -> None:
    """Check the values every run needs before anything is built or written (output dir, loggers, data caches):
    ``optim.*`` (:func:`harness.lit.validate_optim_config`), ``trainer.max_steps`` (a positive integer, the total
    number of optimizer steps; ``-1``, no step limit, only with a positive ``trainer.max_epochs``),
    ``trainer.max_epochs`` (null, a positive integer, or ``-1`` with a positive ``trainer.max_steps``),
    ``trainer.val_check_interval`` (a positive integer while ``trainer.check_val_every_n_epoch`` is null),
    ``trainer.accumulate_grad_batches`` (a positive integer; only 1 with an integer ``trainer.val_check_interval``:
    Lightning counts that in training batches, not in optimizer steps as ``trainer.max_steps``, so validations and
    the checkpoints written at them, which resumed runs continue from, would fall between optimizer steps),
    ``trainer.limit_val_batches`` / ``trainer.limit_train_batches`` (an integer >= 1 or a fraction in (0, 1]: 0
    would validate / train nothing; a fraction too small for the data is refused after the data is set up,
    :func:`check_batch_limits`), the other ``trainer.*`` keys (:func:`check_trainer_options`: an argument of the
    Trainer, ``trainer.precision`` / ``trainer.accelerator`` / ``trainer.strategy`` values Lightning takes here), the
    top-level keys (:func:`check_top_level_keys`),
    ``trainer.enable_progress_bar`` (true, false or auto), ``trainer.gradient_clip_val`` (null or a number >= 0) and
    ``trainer.gradient_clip_algorithm`` (null, norm or value), ``stop_at`` (null or a number, :class:`StopAt`), ``seed``
    (an integer in [0, 2**32 - 1]), ``compile`` / ``skip_finished`` (true or false), ``data.*`` keys the data module
    takes (:func:`check_data_options`), ``model.*`` (:func:`check_model_config`; ``model.max_seq_len >=
    data.seq_len``) and the layers (:func:`check_layers`: causal, ``doc_ids`` with packed documents, an
    ``attention_backend`` that runs them here), so none of these fails inside training after the data work.

    Raises:
        ValueError: naming the key, its value and what to set.
    """
    check_top_level_keys(cfg)
    validate_optim_config(OmegaConf.to_container(cfg.optim, resolve=True) if cfg.get("optim") is not None else {})
    steps = cfg.trainer.get("max_steps")
    epochs = cfg.trainer.get("max_epochs")
    steps_rule = ("must be a positive integer, the total number of optimizer steps (e.g. trainer.max_steps=1000); "
                  "-1 (no step limit) only together with trainer.max_epochs=<a positive integer>")
    if epochs is not None and not (_is_int(epochs) and (epochs > 0 or epochs == -1)):
        raise ValueError(f"trainer.max_epochs={epochs!r}: must be null, a positive integer, or -1 (no epoch limit, "
                         f"with a positive trainer.max_steps)")
    if steps is None or (_is_int(steps) and steps == -1):
        if not (_is_int(epochs) and epochs > 0):
            raise ValueError(f"trainer.max_steps={steps!r} sets no step limit and trainer.max_epochs={epochs!r} no "
                             f"epoch limit (Lightning would train 1000 epochs): set trainer.max_steps=<N> (a positive "
                             f"integer, the total number of optimizer steps, e.g. trainer.max_steps=1000), or "
                             f"trainer.max_epochs=<N> to train N epochs")
    elif not (_is_int(steps) and steps > 0):
        raise ValueError(f"trainer.max_steps={steps!r}: {steps_rule}")
    accumulate = cfg.trainer.get("accumulate_grad_batches", 1)
    if not (_is_int(accumulate) and accumulate > 0):
        raise ValueError(f"trainer.accumulate_grad_batches={accumulate!r}: must be a positive integer (1: one batch "
                         f"per optimizer step)")
    val_every = cfg.trainer.get("val_check_interval")
    if cfg.trainer.get("check_val_every_n_epoch") is None and val_every is not None \
            and not (_is_int(val_every) and val_every > 0):
        raise ValueError(
            f"trainer.val_check_interval={val_every!r}: with trainer.check_val_every_n_epoch=null (validation counted "
            f"in steps across epochs) it must be a positive integer, the steps between validations (e.g. 250); a "
            f"fraction of an epoch (0.5, 1.0) needs trainer.check_val_every_n_epoch=<N>")
    if accumulate > 1 and _is_int(val_every):
        raise ValueError(
            f"trainer.accumulate_grad_batches={accumulate} with trainer.val_check_interval={val_every}: Lightning "
            f"counts val_check_interval in training batches, not in optimizer steps as trainer.max_steps, so "
            f"validations and the checkpoints written at them (which resumed runs continue from) would fall between "
            f"optimizer steps; set trainer.accumulate_grad_batches=1 (the only value allowed with an integer "
            f"trainer.val_check_interval) and a larger data.batch_size instead")
    for key, what, zero in (
            ("limit_val_batches", "validation", "0 would leave the run with no validation metric: its final table and "
                                                "final_metrics.json would hold no val/* value"),
            ("limit_train_batches", "training", "0 would train no step")):
        limit = cfg.trainer.get(key, 1.0)
        if limit is not None and not ((_is_int(limit) and limit > 0) or (
                isinstance(limit, float) and 0.0 < limit <= 1.0)):
            # Lightning skips validation at 0 (and the final validation too): the run would exit 0 measuring nothing
            raise ValueError(f"trainer.{key}={limit!r}: must be an integer >= 1 (the batches of each {what}"
                             f"{' epoch' if what == 'training' else ''}) or a fraction in (0, 1] of the {what} set "
                             f"(1.0: all of it){' (' + zero + ')' if limit in (0, 0.0) else ''}")
    clip = cfg.trainer.get("gradient_clip_val")
    if clip is not None and not (isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip >= 0):
        # clip_grad_norm_ scales by clip / norm (< 0: every gradient flipped), clip_grad_value_ clamps to [-c, c]
        raise ValueError(f"trainer.gradient_clip_val={clip!r}: must be null or a number >= 0 (0 / null: no clipping; "
                         f"a negative value would flip the gradients)")
    algorithm = cfg.trainer.get("gradient_clip_algorithm")
    if algorithm is not None and algorithm not in ("norm", "value"):
        raise ValueError(f"trainer.gradient_clip_algorithm={algorithm!r} is not supported; allowed values: norm, value")
    stop_at = cfg.get("stop_at")
    if stop_at is not None:
        StopAt(stop_at)  # raises ValueError naming stop_at
    if str(cfg.trainer.get("accelerator", "")).lower() in ("gpu", "cuda") and not torch.cuda.is_available():
        # Lightning's own error ("No supported gpu backend found!") names no setting
        raise ValueError(f"trainer.accelerator={cfg.trainer.accelerator} (trainer=gpu, which the mqar_* / lm_* "
                         f"experiments set) but no CUDA GPU is visible; on a CPU pass trainer=default (trainer=ddp "
                         f"without trainer.accelerator=gpu for DDP)")
    check_trainer_options(cfg.trainer)
    seed = cfg.get("seed", 0)
    if not (_is_int(seed) and 0 <= seed < 2 ** 32):
        raise ValueError(f"seed={seed!r}: must be an integer in [0, 2**32 - 1] (e.g. seed=0)")
    for key in ("compile", "skip_finished"):
        if not isinstance(cfg.get(key, False), bool):
            raise ValueError(f"{key}={cfg.get(key)!r}: must be true or false")
    bar = cfg.trainer.get("enable_progress_bar", "auto")
    if bar not in (True, False, "auto", None):
        raise ValueError(f"trainer.enable_progress_bar={bar!r}: must be true, false or auto (on when stdout is a "
                         f"terminal)")
    seq_len = cfg.data.get("seq_len") if cfg.get("data") is not None else None
    if seq_len is not None and not (_is_int(seq_len) and seq_len >= 1):  # before model.max_seq_len (${data.seq_len})
        raise ValueError(f"data.seq_len={seq_len!r}: must be a positive integer, the tokens of one training example "
                         f"(e.g. data.seq_len=256)")
    if cfg.get("data") is not None:
        check_data_options(cfg.data)
    if cfg.get("model") is not None:
        model = OmegaConf.to_container(cfg.model, resolve=True)
        check_model_config(model)
        max_len = model.get("max_seq_len")
        if seq_len is not None and _is_int(max_len) and max_len < seq_len:
            raise ValueError(f"model.max_seq_len={max_len} is smaller than data.seq_len={seq_len}: the model's "
                             f"positions (its RoPE table) end at model.max_seq_len, so a training example of "
                             f"data.seq_len tokens exceeds it; raise model.max_seq_len to >= {seq_len} (its default "
                             f"is ${{data.seq_len}}) or lower data.seq_len")
        if cfg.get("attention") is not None:
            check_layers(cfg, layer_specs(cfg))


def top_level_keys() -> List[str]:
    """The top-level keys ``train.py`` reads: ``conf/train.yaml``'s own keys, the groups of its defaults list that
    become a key (``data``, ``model``, ``attention``, ``trainer``, ``logger``; not ``experiment``, whose options are
    ``@package _global_``), ``plugins`` (``+plugins=[...]``) and ``hydra``."""
    conf = OmegaConf.load(CONF_DIR / "train.yaml")
    keys = [str(k) for k in conf.keys() if k not in ("defaults", "hydra")]
    for entry in conf.get("defaults") or []:
        for group in (entry.keys() if isinstance(entry, DictConfig) else ()):
            group = str(group)
            options = sorted((CONF_DIR / group).glob("*.yaml")) if (CONF_DIR / group).is_dir() else []
            if options and not options[0].read_text().lstrip().startswith("# @package _global_"):
                keys.append(group)
    return keys + ["plugins", "hydra"]


def check_known_keys(cfg, known, what: str, listed: str = "allowed keys", hint: str = "") -> None:
    """Each key of the mapping ``cfg`` is one of ``known``, else ``ValueError``: ``<key>=<value> is not a key <what>
    reads (did you mean <closest>?); <listed>: <known but hydra><hint>``. A key no code reads was ignored silently
    (``+sed=1``, a typo of ``seed``). Shared by ``train.py``'s top-level keys and the ``eval`` CLIs' and sweeps'."""
    import difflib

    for key in cfg.keys():
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), list(known), 1)
        raise ValueError(f"{key}={cfg.get(key)!r} is not a key {what} reads"
                         f"{' (did you mean ' + close[0] + '?)' if close else ''}; {listed}: "
                         f"{', '.join(k for k in known if k != 'hydra')}{hint}")


def check_top_level_keys(cfg: DictConfig) -> None:
    """Every top-level key of ``cfg`` is one ``train.py`` reads (:func:`top_level_keys`): ``+sed=1`` (a typo of
    ``seed``) or ``+foo=1`` was accepted and ignored. Raises ``ValueError`` naming the key, the closest known key
    and the keys ``train.py`` reads."""
    check_known_keys(cfg, top_level_keys(), "train.py", "top-level keys",
                     " (a group's key is set under it, e.g. trainer.max_steps=1000, +model.<key>=...)")


def lightning_precisions() -> List:
    """The ``precision`` values Lightning's Trainer takes (its ``_PRECISION_INPUT``: ``32-true``, ``bf16-mixed``, ...
    and the short forms ``32``, ``16``, ``bf16``, ``64``)."""
    import typing

    try:
        from lightning.fabric.connector import _PRECISION_INPUT_INT, _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS
    except ImportError:  # pragma: no cover - another Lightning version: the values of 2.x
        return ["transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
                "32-true", "64-true", "64", "32", "16", "bf16", 64, 32, 16]
    return [*typing.get_args(_PRECISION_INPUT_STR), *typing.get_args(_PRECISION_INPUT_STR_ALIAS),
            *typing.get_args(_PRECISION_INPUT_INT)]


def _accelerators() -> Dict[str, bool]:
    """Lightning's accelerator names (its ``AcceleratorRegistry``, plus ``gpu``: CUDA or MPS) and whether each is
    available here."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    out = {}
    for name in sorted(AcceleratorRegistry.available_accelerators()):
        try:
            out[name] = bool(AcceleratorRegistry[name]["accelerator"].is_available())
        except Exception:  # noqa: BLE001 - an accelerator whose package is missing is not available
            out[name] = False
    out["gpu"] = out.get("cuda", False) or out.get("mps", False)
    return out


def check_trainer_options(trainer: DictConfig) -> None:
    """``trainer.*`` as Lightning's Trainer (the node's ``_target_``) takes it, checked before anything is written
    (Lightning raised them with a traceback when the Trainer was built):

    * every key an argument of the Trainer's ``__init__`` (``inspect.signature``; ``train.py`` reads no key of the
      node that is not one): ``+trainer.foo=1`` is refused naming the closest argument and all of them;
    * ``trainer.precision``: ``auto`` (``bf16-mixed`` on CUDA, else ``32-true``) or one of Lightning's values
      (:func:`lightning_precisions`); ``transformer-engine*`` needs the ``transformer_engine`` package;
    * ``trainer.accelerator``: ``auto`` or one of Lightning's accelerators (``cpu``, ``cuda`` / ``gpu``, ``mps``,
      ``tpu``) that is available here;
    * ``trainer.strategy``: ``auto`` or a name of Lightning's ``StrategyRegistry`` (``ddp``, ``ddp_spawn``, ...).

    Raises ``ValueError`` naming ``trainer.<key>``, its value and the allowed values."""
    import difflib
    import importlib.util
    import inspect

    from hydra.utils import get_class

    try:
        cls = get_class(str(trainer.get("_target_")))
        params = inspect.signature(cls).parameters
    except Exception:  # noqa: BLE001 - not importable here / not a class: instantiation reports it
        return
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        for key in trainer.keys():
            if str(key).startswith("_") or key in params:
                continue
            close = difflib.get_close_matches(str(key), names, 1)
            raise ValueError(f"trainer.{key}={trainer.get(key)!r} is not an argument of {cls.__name__} "
                             f"({trainer.get('_target_')}{'; did you mean trainer.' + close[0] + '?' if close else ''})"
                             f"; its arguments: {', '.join(names)}")
    import lightning as L

    if not (isinstance(cls, type) and issubclass(cls, L.Trainer)):
        return
    precision = trainer.get("precision", "auto")
    allowed = lightning_precisions()
    if precision not in ("auto", None) and (isinstance(precision, bool) or precision not in allowed):
        full = [p for p in allowed if isinstance(p, str) and "-" in p]
        short = [str(p) for p in allowed if isinstance(p, str) and "-" not in p]
        raise ValueError(f"trainer.precision={precision!r} is not supported; allowed values: auto (bf16-mixed on "
                         f"CUDA, else 32-true), {', '.join(full)} (Lightning's short forms: {', '.join(short)})")
    if isinstance(precision, str) and precision.startswith("transformer-engine") \
            and importlib.util.find_spec("transformer_engine") is None:
        raise ValueError(f"trainer.precision={precision!r} needs NVIDIA's transformer_engine package, which is not "
                         f"installed here; use bf16-mixed (CUDA) or 32-true")
    accelerator = trainer.get("accelerator", "auto")
    if isinstance(accelerator, str) and accelerator != "auto":
        known = _accelerators()
        here = ", ".join(["auto"] + [n for n, ok in known.items() if ok])
        if accelerator not in known:
            raise ValueError(f"trainer.accelerator={accelerator!r} is not supported; allowed values: auto, "
                             f"{', '.join(known)} (available here: {here})")
        if not known[accelerator]:
            raise ValueError(f"trainer.accelerator={accelerator!r} is not available on this machine; available "
                             f"here: {here}")
    on_cpu = accelerator == "cpu" or (accelerator in ("auto", None) and not torch.cuda.is_available())
    _check_devices(trainer.get("devices", "auto"), on_cpu)
    if on_cpu and str(precision) in ("16-mixed", "16"):  # Lightning runs bf16-mixed there, the config saying fp16
        raise ValueError(f"trainer.precision={precision!r}: fp16 mixed precision runs on CUDA only (on the CPU "
                         f"Lightning would train bf16-mixed instead); allowed values here: auto (32-true on the CPU), "
                         f"32-true, bf16-mixed")
    strategy = trainer.get("strategy", "auto")
    if isinstance(strategy, str) and strategy != "auto":
        from lightning.pytorch.strategies import StrategyRegistry

        names = sorted(StrategyRegistry.available_strategies())
        if strategy not in names:
            close = difflib.get_close_matches(strategy, names, 1)
            raise ValueError(f"trainer.strategy={strategy!r} is not supported{' (did you mean ' + close[0] + '?)' if close else ''}; "
                             f"allowed values: auto, {', '.join(names)}")


def _parse_devices(devices):
    """``trainer.devices`` read as Lightning reads it: ``"auto"``; a count (an integer >= 1 or its string); -1 (every
    visible GPU); a list of distinct GPU indices (a non-empty list, or ``"0,1"``); ``None`` for anything else."""
    if devices == "auto":
        return "auto"
    if devices in (-1, "-1"):
        return -1
    if _is_int(devices) and devices >= 1:
        return devices
    if isinstance(devices, str):
        if devices.strip().isdigit() and int(devices) >= 1:
            return int(devices)
        parts = [p.strip() for p in devices.split(",") if p.strip()] if "," in devices else []
        if not parts or not all(p.isdigit() for p in parts):
            return None
        devices = [int(p) for p in parts]
    elif not (OmegaConf.is_list(devices) or isinstance(devices, (list, tuple))):
        return None
    ids = list(devices)
    ok = bool(ids) and all(_is_int(i) and i >= 0 for i in ids) and len(set(ids)) == len(ids)
    return ids if ok else None


def _check_devices(devices, on_cpu: bool) -> None:
    """``trainer.devices`` as Lightning takes it (``devices=0`` / ``abc`` / ``[]`` raised ``MisconfigurationException``
    / ``TypeError`` with a traceback when the Trainer was built): ``auto``, a positive integer (or its string), and
    off the CPU also -1 (every visible GPU) or a non-empty list of distinct GPU indices (a list or ``"0,1"``).
    ``on_cpu``: the run trains on the CPU (Lightning's ``CPUAccelerator`` takes a count only). Raises ``ValueError``
    naming the value and the allowed ones (``null`` included: Lightning raises ``TypeError`` for it)."""
    parsed = _parse_devices(devices)
    if parsed == "auto" or (_is_int(parsed) and parsed >= 1):  # not null: Lightning's TypeError on CPU and GPUs
        return
    if not on_cpu and parsed is not None:  # -1 or GPU indices
        return
    shown = OmegaConf.to_container(devices) if OmegaConf.is_list(devices) else devices
    allowed = ("auto or a positive integer (the processes to run on the CPU)" if on_cpu else
               "auto, a positive integer (the number of GPUs), -1 (every visible GPU) or a non-empty list of "
               "distinct GPU indices (e.g. [0,1])")
    raise ValueError(f"trainer.devices={shown!r} is not supported{' on the CPU' if on_cpu else ''}; allowed values: "
                     f"{allowed}")


def _world_size(trainer: DictConfig) -> int:
    """The processes a run of ``trainer`` starts (``trainer.devices`` x ``trainer.num_nodes``; ``auto`` / -1: the
    visible CUDA GPUs unless ``trainer.accelerator=cpu``, else 1), as far as the config says it."""
    parsed = _parse_devices(trainer.get("devices", "auto"))
    if isinstance(parsed, list):
        n = len(parsed)
    elif _is_int(parsed) and parsed >= 1:
        n = parsed
    elif str(trainer.get("accelerator", "auto")) != "cpu" and torch.cuda.is_available():
        n = torch.cuda.device_count()
    else:
        n = 1
    nodes = trainer.get("num_nodes", 1)
    return n * (nodes if _is_int(nodes) and nodes > 0 else 1)


def check_batch_limits(trainer: DictConfig, datamodule) -> None:
    """A fraction ``trainer.limit_train_batches`` / ``trainer.limit_val_batches`` that gives no batch of this data
    (``int(fraction * batches) == 0``, Lightning's ``MisconfigurationException`` once training had started), asked
    of ``datamodule`` (set up) and its loaders' lengths per process (:func:`_world_size`). Raises ``ValueError``
    naming the key, the number of batches it gives and the smallest fraction that gives one."""
    world = _world_size(trainer)
    for key, loader, what in (("limit_train_batches", "train_dataloader", "training"),
                              ("limit_val_batches", "val_dataloader", "validation")):
        limit = trainer.get(key, 1.0)
        if not isinstance(limit, float) or not 0.0 < limit < 1.0:
            continue
        try:
            dl = getattr(datamodule, loader)()
            n = len(dl)
            if world > 1:  # each process's share (the smallest one)
                share, bs = len(dl.dataset) // world, dl.batch_size
                n = (share // bs if dl.drop_last else -(-share // bs)) if bs else n // world
        except Exception:  # noqa: BLE001 - no loader / no length (an iterable dataset): Lightning decides
            continue
        if n > 0 and int(n * limit) == 0:
            per = f" per process ({world} processes)" if world > 1 else ""
            raise ValueError(f"trainer.{key}={limit!r} gives int({limit!r} * {n}) = 0 {what} batches: the {what} set "
                             f"has {n} batches of data.batch_size{per}; pass a fraction >= 1/{n} (e.g. "
                             f"{math.ceil(10000 / n) / 10000:g}) or a number of batches (an integer, e.g. "
                             f"trainer.{key}=1)")


def _layer_nodes(cfg: DictConfig, n: int) -> List[str]:
    """The config node of each of ``n`` layers: ``attention`` (the selected group) or ``model.layers[i]``."""
    layers = cfg.model.get("layers")
    if layers is None:
        return ["attention"] * n
    name = cfg.attention.get("name")
    return ["attention" if isinstance(e, str) and e == name else f"model.layers[{i}]" for i, e in enumerate(layers)]


def check_layers(cfg: DictConfig, specs: List) -> None:
    """What the model and the data need of the layers ``specs`` (:func:`layer_specs`), asked of each layer's spec /
    mixer, before anything is built (the model raises the same errors later, after the data work):

    * causal: GPT is a causal language model; a layer with ``causal=False`` (an attention spec, or a non-causal
      mixer such as ``linformer``) sees later tokens and the loss reads the answer
      (:func:`attn_zoo.model.noncausal_layer_reason`);
    * packed documents (``data.pack=true`` with ``data.doc_mask=true``): every layer's mixer takes ``doc_ids``
      (:func:`attn_zoo.mixers.layer_takes`; :func:`attn_zoo.model.doc_ids_refusal`);
    * ``attention_backend`` runs every attention layer here (:func:`check_attention_backend`, asked with the
      training's shapes, dtype and device when that is the CPU);
    * a sequence mixer's options: each distinct mixer is built once with the model's sizes on the ``meta`` device,
      so its constructor's checks run (:func:`_check_mixer_options`; ``mamba2 d_state=0``, an unknown option).

    Raises ``ValueError`` naming the config node (``attention`` / ``model.layers[i]``) or the key to change."""
    from attn_zoo.mixers import layer_takes

    nodes = _layer_nodes(cfg, len(specs))
    n_head = (cfg.get("model") or {}).get("n_head")
    for i, (spec, node) in enumerate(zip(specs, nodes)):
        why = noncausal_layer_reason(i, spec, key=f"{node}.causal")
        if why is not None:
            raise ValueError(why if isinstance(spec, AttentionSpec) else f"{node}: {why}")
        if isinstance(spec, AttentionSpec) and _is_int(n_head) and n_head > 0:
            try:  # the model raises it as it is built, after the data work, naming the spec field only
                spec.resolve_kv_heads(n_head)
            except ValueError as e:  # "kv_group_size=3 must divide n_heads=4" -> attention.kv_group_size=...
                raise ValueError(f"{node}.{e} (model.n_head={n_head})") from None
    _check_mixer_options(cfg, specs, nodes)
    data = cfg.get("data") or {}
    documents = bool(data.get("pack", False)) and bool(data.get("doc_mask", True))
    if documents:
        bad = [f"layer {i} ({s.label})" for i, s in enumerate(specs) if layer_takes(s, "doc_ids") is False]
        if bad:
            raise ValueError(doc_ids_refusal(bad))
    backend = cfg.get("attention_backend", "auto")
    if backend == "auto":
        return
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    for key in ("layers", "redraw_interval"):
        fields.pop(key, None)
    accelerator = str(cfg.trainer.get("accelerator", "auto")).lower() if cfg.get("trainer") is not None else "auto"
    device = "cpu" if accelerator == "cpu" or not torch.cuda.is_available() else None  # CUDA: the first forward decides
    precision = str((cfg.get("trainer") or {}).get("precision", "auto"))
    dtype = torch.bfloat16 if "bf16" in precision else torch.float16 if precision.startswith("16") else torch.float32
    if device is not None and precision == "auto":
        dtype = torch.float32  # train.resolve_precision: 32-true without CUDA
    check_attention_backend(backend, specs, config_from_dict(fields), int(data.get("seq_len") or 1), device, dtype,
                            documents)


def _check_mixer_options(cfg: DictConfig, specs: List, nodes: List[str]) -> None:
    """Each distinct non-attention layer (:class:`attn_zoo.mixers.MixerSpec`) built once with the model's sizes, on
    the ``meta`` device (no memory, the global RNG untouched), so that its constructor's checks of its options
    (``mamba2 d_state=0 must be an integer >= 1``, an option it does not take, ...) fail here, before anything is
    written, not when the model is built after the data work. Raises ``ValueError`` naming the config node; an
    error of another type is left to the model's build."""
    from attn_zoo.mixers import MixerSpec, build_mixer

    if cfg.get("model") is None:
        return
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    for key in ("layers", "redraw_interval"):
        fields.pop(key, None)
    config, seen = None, set()
    for spec, node in zip(specs, nodes):
        if not isinstance(spec, MixerSpec) or spec in seen:
            continue
        seen.add(spec)
        config = config or config_from_dict(fields)
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                build_mixer(spec, config)
        except ValueError as e:
            raise ValueError(f"{node}: {e}") from None
        except Exception:  # noqa: BLE001 - a factory that cannot run on the meta device: the model's build decides
            pass


def check_data_options(data: DictConfig) -> None:
    """Every key of ``data`` is an argument of its ``_target_`` data module (a key it lacks failed as a ``TypeError``
    after the output dir was made, e.g. ``+data.pack=true`` with the default MQAR data). Raises ``ValueError`` naming
    ``data.<key>``, the data module's options and which ``conf/data/<name>.yaml`` has that key."""
    import inspect

    from hydra.utils import get_class

    target = data.get("_target_")
    if not isinstance(target, str):
        return
    try:
        params = inspect.signature(get_class(target)).parameters
    except Exception:  # noqa: BLE001 - not importable here / not a class: instantiation reports it
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [k for k in data.keys() if not str(k).startswith("_") and k not in params]
    if not unknown:
        return
    key = unknown[0]
    groups = {p.stem: OmegaConf.load(p) for p in sorted((CONF_DIR / "data").glob("*.yaml"))}
    mine = [n for n, g in groups.items() if g.get("_target_") == target]
    has = [f"data={n}" for n, g in groups.items() if key in g and g.get("_target_") != target]
    allowed = [n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    raise ValueError(f"data.{key}={data.get(key)!r} is not an option of {target.rsplit('.', 1)[-1]}"
                     f"{' (data=' + mine[0] + ')' if mine else ''}; its options: {', '.join(allowed)}"
                     f"{'; ' + key + ' needs ' + ' or '.join(has) if has else ''}")
