"""``LitLM``: the Lightning module that trains :class:`attn_zoo.model.GPT`.

Optimiser: any ``torch.optim`` class built from the ``optim`` config with ``hydra.utils.instantiate``
(``_partial_: true``: a callable that :meth:`LitLM.configure_optimizers` calls with the parameter groups), by
default AdamW (Loshchilov & Hutter 2019); weight decay on matrices only (``p.dim() >= 2``); linear warmup then
cosine decay to ``min_lr_ratio * lr``. Gradient clipping and precision (bf16-mixed on GPU) are Trainer settings;
on CUDA the optimiser is the fused one when its class offers it, and clipping works with it
(:func:`adamw_impl`, :meth:`LitLM.configure_gradient_clipping`).

Logged metrics
    train/loss, perf/tokens_per_s, perf/step_time_s, perf/peak_mem_mb (CUDA max allocated, else process RSS): on the
    steps Lightning writes (every ``trainer.log_every_n_steps``), computed on those steps only;
    model/n_params (once, also in hparams);
    val/loss, val/ppl, val/acc (next-token accuracy on scored positions; MQAR: accuracy on query positions),
    val/bpb (text: ``loss / ln 2 / bytes_per_token``);
    train/lr, train/lr_no_decay: not logged here but by Lightning's ``LearningRateMonitor`` (``callbacks.lr_monitor``
    in ``conf/train.yaml``), which names each learning rate ``<scheduler name>/<param group name>``: the scheduler
    is named ``train`` and the groups :data:`PARAM_GROUP_NAMES`.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import asdict, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import lightning as L
import torch

from attn_zoo.model import GPT, GPTConfig, ModelConfig, layer_from_dict
from attn_zoo.spec import AttentionSpec, make_spec

DEFAULT_OPTIMIZER: Dict[str, Any] = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3,
                                     "weight_decay": 0.1, "betas": [0.9, 0.95]}
"""The optimiser config :class:`LitLM` uses when it is given none (``conf/train.yaml``'s ``optim`` sets its own)."""
SCHEDULE_KEYS = ("warmup_steps", "min_lr_ratio")
"""Keys of ``cfg.optim`` that configure the LR schedule, not the optimiser (:func:`split_optim_config`)."""
PARAM_GROUP_NAMES = ("lr", "lr_no_decay")
"""Names of LitLM's parameter groups: matrices (weight decay) and vectors (none). ``LearningRateMonitor`` logs a group's
learning rate as ``<scheduler name>/<group name>``; the scheduler is named ``train``, hence ``train/lr``."""


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:  # pragma: no cover - psutil missing
        return float("nan")


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: Optional[int], min_lr_ratio: float) -> float:
    """LR multiplier of optimizer step ``step`` (0-based) of a schedule of ``total_steps`` steps.

    Linear warmup ``(step + 1) / warmup`` over the first ``warmup`` steps, then a cosine from 1 down to
    ``min_lr_ratio``, which it reaches at ``step == total_steps``; every step ``>= total_steps`` (a resumed run
    extended past the schedule's end) runs at ``min_lr_ratio``. ``warmup`` is ``warmup_steps`` capped at
    ``total_steps``: a schedule shorter than its warmup ramps up to 1 over its own length (its last step runs at the
    full LR) and continues at ``min_lr_ratio`` past it, never at the full LR. ``total_steps`` None or ``<= 0`` (no
    known length): warmup, then 1.
    """
    if not total_steps or total_steps <= 0:
        return (step + 1) / warmup_steps if 0 < warmup_steps and step < warmup_steps else 1.0
    if step >= total_steps:
        return min_lr_ratio
    warm = min(max(int(warmup_steps), 0), int(total_steps))
    if step < warm:
        return (step + 1) / warm
    t = (step - warm) / (total_steps - warm)  # step < total_steps, so total_steps > warm here
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def adamw_impl(device_type: str, precision_plugin=None) -> str:
    """The AdamW implementation a run uses: ``"fused"`` (one kernel for every parameter) on CUDA, ``"foreach"`` on
    CUDA when the precision plugin keeps a gradient scaler (``16-mixed``: Lightning must unscale the gradients
    before it clips them, and a fused AdamW unscales inside its own step), ``"default"`` (PyTorch's choice)
    elsewhere."""
    if device_type != "cuda":
        return "default"
    return "foreach" if getattr(precision_plugin, "scaler", None) is not None else "fused"


def clip_gradients_(parameters, clip_val: float, algorithm: str = "norm") -> None:
    """Clip gradients in place: total 2-norm to ``clip_val`` (``algorithm="norm"``) or each value to
    ``[-clip_val, clip_val]`` (``"value"``). Raises ``ValueError`` naming ``gradient_clip_val`` (negative: the
    gradients would be flipped) or ``gradient_clip_algorithm``."""
    if not clip_val >= 0:
        raise ValueError(f"trainer.gradient_clip_val={clip_val!r}: must be a number >= 0 (a negative value would flip "
                         f"the gradients)")
    params = [p for p in parameters if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, clip_val)
    elif algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, clip_val)
    else:
        raise ValueError(f"trainer.gradient_clip_algorithm={algorithm!r} is not supported; allowed values: norm, value")


def split_optim_config(optim: Mapping) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Split ``cfg.optim`` into ``(optimizer config, schedule kwargs)``.

    ``cfg.optim`` keeps every user-facing path in one node (``optim.lr``, ``optim.weight_decay``, ``optim.betas``,
    ``optim.warmup_steps``, ``optim.min_lr_ratio``, ``optim._target_``); the schedule keys (:data:`SCHEDULE_KEYS`)
    are not optimiser arguments, so they go to :class:`LitLM` separately and the rest to ``hydra.utils.instantiate``.
    """
    optim = dict(optim)
    return {k: v for k, v in optim.items() if k not in SCHEDULE_KEYS}, {k: optim[k] for k in SCHEDULE_KEYS if k in optim}


RESUME_FREE_OPTIM_KEYS = ("_partial_", "fused", "foreach")
"""``optim.*`` keys that may differ between a checkpoint and the run that resumes it (how the optimiser is called or
implemented, not its hyperparameters); every other ``optim.*`` key must match (:meth:`LitLM.check_checkpoint_hparams`)."""


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate_optim_config(optim: Mapping) -> None:
    """Check the values of ``cfg.optim`` (optimiser arguments and schedule keys) that every run uses, before anything
    is built: ``optim.lr`` a positive number, ``optim.weight_decay`` a number ``>= 0``, ``optim.betas`` two numbers in
    ``[0, 1)``, ``optim.warmup_steps`` an integer ``>= 0``, ``optim.min_lr_ratio`` a number in ``[0, 1]``. Keys the
    config does not have are not checked (e.g. ``'~optim.betas'`` for SGD).

    Raises:
        ValueError: naming the key, its value and what it must be (``optim.lr='abc': must be a positive number``).
    """
    optim = dict(optim or {})

    def bad(key, what):
        raise ValueError(f"optim.{key}={optim[key]!r}: must be {what} (e.g. optim.{key}="
                         f"{ {'lr': '3e-3', 'weight_decay': '0.1', 'betas': '[0.9,0.95]', 'warmup_steps': '50', 'min_lr_ratio': '0.1'}[key] })")

    if "lr" in optim and not (_is_number(optim["lr"]) and math.isfinite(optim["lr"]) and optim["lr"] > 0):
        bad("lr", "a positive number")
    if "weight_decay" in optim and optim["weight_decay"] is not None and not (
            _is_number(optim["weight_decay"]) and math.isfinite(optim["weight_decay"]) and optim["weight_decay"] >= 0):
        bad("weight_decay", "a number >= 0")
    if "betas" in optim and optim["betas"] is not None:
        b = optim["betas"]
        if isinstance(b, str) or not hasattr(b, "__len__") or len(b) != 2 or \
                not all(_is_number(x) and 0 <= x < 1 for x in b):
            bad("betas", "two numbers in [0, 1)")
    if "warmup_steps" in optim and not (isinstance(optim["warmup_steps"], int) and
                                        not isinstance(optim["warmup_steps"], bool) and optim["warmup_steps"] >= 0):
        bad("warmup_steps", "an integer >= 0, the optimizer steps of linear warmup")
    if "min_lr_ratio" in optim and not (_is_number(optim["min_lr_ratio"]) and 0 <= optim["min_lr_ratio"] <= 1):
        bad("min_lr_ratio", "a number in [0, 1], the LR at the end of the cosine as a fraction of optim.lr")


def _plain(v):
    """Lists / tuples / ListConfigs as lists (recursively), so ``[0.9, 0.95]`` equals ``(0.9, 0.95)``."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__") or isinstance(v, Mapping):
        return v
    return [_plain(x) for x in v]


def optim_settings(hparams: Mapping) -> Dict[str, Any]:
    """The optimiser and LR-schedule settings of LitLM hparams (a module's or a checkpoint's) as ``{"optim.<key>":
    value}``, without :data:`RESUME_FREE_OPTIM_KEYS`. Hparams of checkpoints from before the optimiser was a config
    (flat ``lr`` / ``weight_decay`` / ``betas``) fold into :data:`DEFAULT_OPTIMIZER` as :class:`LitLM` does; hparams
    without any optimiser key give only their schedule keys."""
    out: Dict[str, Any] = {}
    opt = hparams.get("optimizer")
    flat = {k: hparams[k] for k in ("lr", "weight_decay", "betas") if hparams.get(k) is not None}
    if opt is not None or flat:
        opt = dict(DEFAULT_OPTIMIZER if opt is None else opt)
        opt.update(flat)
        out.update({f"optim.{k}": _plain(v) for k, v in opt.items() if k not in RESUME_FREE_OPTIM_KEYS})
    out.update({f"optim.{k}": _plain(hparams[k]) for k in SCHEDULE_KEYS if hparams.get(k) is not None})
    return out


def optimizer_factory(config: Mapping) -> Callable[..., torch.optim.Optimizer]:
    """``hydra.utils.instantiate(config)`` of an optimiser config with ``_partial_: true``: a callable that takes the
    parameter groups (and keyword overrides) and returns the optimiser.

    Raises:
        ValueError: naming ``optim._partial_`` (not true), ``optim._target_`` (not importable) or ``optim.<key>``
            (not an argument of the optimiser class; the message lists the allowed ones).
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    config = dict(config)
    if config.get("_partial_") is not True:
        raise ValueError(f"optim._partial_={config.get('_partial_')!r}: must be true (LitLM calls the optimizer with "
                         "its parameter groups)")
    target = config.get("_target_")
    try:
        make = instantiate(config, _convert_="all")
    except InstantiationException as e:
        raise ValueError(f"optim._target_={target!r} is not an optimizer class that can be imported (e.g. "
                         f"torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD): {str(e).splitlines()[0]}") from e
    params = _parameters(make.func)
    if params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in make.keywords if k not in params]
        if unknown:
            allowed = ", ".join(k for k in params if k != "params")
            raise ValueError(f"optim.{unknown[0]} is not an argument of {target}; allowed: {allowed} (plus the "
                             f"schedule keys {', '.join(SCHEDULE_KEYS)})")
    return make


def _parameters(fn) -> Dict[str, inspect.Parameter]:
    """``fn``'s signature parameters; empty when Python cannot tell (some builtins)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def build_optimizer(config: Mapping, param_groups: List[dict], impl: str = "default") -> torch.optim.Optimizer:
    """The optimiser of ``config`` (:func:`optimizer_factory`) over ``param_groups``.

    ``impl`` (:func:`adamw_impl`): ``"fused"`` / ``"foreach"`` is passed as ``fused=True`` / ``foreach=True`` when the
    class takes that argument and the config sets neither; ``"default"`` leaves PyTorch's choice.
    """
    make = optimizer_factory(config)
    chosen = {"fused", "foreach"} & set(make.keywords)
    extra = {}
    if impl != "default" and not chosen and impl in _parameters(make.func):
        extra[impl] = True
    return make(param_groups, **extra)


def _override(v) -> str:
    """``v`` as a Hydra command-line value (``[0.9,0.95]``, ``0.003``, ``torch.optim.AdamW``)."""
    if isinstance(v, list):
        return "[" + ",".join(_override(x) for x in v) + "]"
    return str(v)


def _layers_diff(old: List[AttentionSpec], new: List[AttentionSpec]) -> str:
    """The fields in which two layer lists differ, one entry per run of layers with the same difference:
    ``layers 0-3: kind 'flash' -> 'linear'``; a different layer count says so."""
    if len(old) != len(new):
        return f"{len(old)} layers -> {len(new)}"
    parts: List[Tuple[int, int, str]] = []  # (first layer, last layer, difference)
    for i, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        if isinstance(a, AttentionSpec) != isinstance(b, AttentionSpec):  # an attention layer against a mixer
            what = f"{a.label!r} -> {b.label!r}"
        else:  # the fields of both (a variant's spec class may add some: dilated_window's dilation)
            names = dict.fromkeys(f.name for s in (a, b) for f in fields(s))
            what = ", ".join(f"{n} {getattr(a, n, None)!r} -> {getattr(b, n, None)!r}" for n in names
                             if getattr(a, n, None) != getattr(b, n, None))
        if parts and parts[-1][1] == i - 1 and parts[-1][2] == what:
            parts[-1] = (parts[-1][0], i, what)
        else:
            parts.append((i, i, what))
    return "; ".join(f"layer {lo}: {w}" if lo == hi else f"layers {lo}-{hi}: {w}" for lo, hi, w in parts)


def architecture_diff(saved: Mapping, model_config: ModelConfig) -> Optional[str]:
    """How the architecture recorded in checkpoint hparams ``saved`` differs from ``model_config`` (None: it does
    not): the attention layers (``layer_specs``: the layers that differ and their fields, checkpoint -> this run) or
    the model config (``model_config``: each ``model.<key>`` with both values). A key the checkpoint lacks has
    :class:`GPTConfig`'s default; hparams without either entry are not compared."""
    if "layer_specs" in saved:
        old = [layer_from_dict(d) for d in saved["layer_specs"]]
        new = list(model_config.layers)
        if old != new:
            return (f"the checkpoint was trained with attention {[s.label for s in old]} but this run builds "
                    f"{[s.label for s in new]} ({_layers_diff(old, new)}); resume with the same attention / "
                    f"model.layers overrides")
    old_cfg = {**asdict(GPTConfig()), **dict(saved["model_config"])} if "model_config" in saved else None
    new_cfg = asdict(model_config.config)
    if old_cfg is not None and old_cfg != new_cfg:
        diff = ", ".join(f"model.{k}: checkpoint {old_cfg.get(k)!r}, this run {new_cfg.get(k)!r}"
                         for k in sorted(set(old_cfg) | set(new_cfg)) if old_cfg.get(k) != new_cfg.get(k))
        return (f"model config differs from the checkpoint's ({diff}); resume with the same model / data overrides "
                f"as the run that wrote it (vocab_size and max_seq_len follow data.*)")
    return None


class LitLM(L.LightningModule):
    """Language-model training around a :class:`GPT`; the module builds the model from one
    :class:`attn_zoo.model.ModelConfig` (kept as :attr:`model_config`, the object ``self.gpt.model_config`` is) and
    the optimiser from a plain dict. The hparams hold the model config as :meth:`ModelConfig.to_dict` writes it
    (``model_config``, ``layer_specs``, ``redraw_interval``), so a checkpoint is self-contained
    (``LitLM.load_from_checkpoint(path)`` rebuilds the same :class:`ModelConfig`).

    Args:
        model_config: a :class:`attn_zoo.model.ModelConfig`, or its plain form (checkpoints, tests): a dict of
            :class:`attn_zoo.model.GPTConfig` fields with ``layer_specs`` and ``redraw_interval`` beside it.
        layer_specs: plain form only: one spec dict per layer (``attn_zoo.make_spec`` keyword arguments).
        backend: attention backend for every layer.
        redraw_interval: plain form only: FAVOR feature redraw period in steps (None / 0 = never).
        optimizer: the optimiser config, ``cfg.optim`` without the schedule keys (:func:`split_optim_config`):
            ``_target_`` (a ``torch.optim`` class), ``_partial_: true`` and its keyword arguments, e.g. ``lr``,
            ``weight_decay`` (applied to matrices only), ``betas``. Kept as a dict in the hparams (checkpoints stay
            loadable); :meth:`configure_optimizers` instantiates it. None: :data:`DEFAULT_OPTIMIZER`.
        lr, weight_decay, betas: shorthands that override ``optimizer``'s keys (calls and checkpoints from before the
            optimiser was configurable); folded into ``hparams.optimizer``, not kept on their own.
        warmup_steps, min_lr_ratio: LR schedule (:func:`cosine_with_warmup`).
        total_steps: schedule length (``train.py``: ``trainer.max_steps`` of the run that started it); None = the
            Trainer's ``estimated_stepping_batches``. Saved in the hparams; a resumed checkpoint's value wins
            (:meth:`on_load_checkpoint`), steps past it run at ``lr * min_lr_ratio``.
        bytes_per_token: text data; enables ``val/bpb``. None for synthetic tasks.
        task: free-form label (``"text"`` / ``"mqar"``) kept in hparams.
        doc_mask: packed text (``data.pack=true``, ``data.doc_mask=true``): batches are ``(x, y, doc_ids,
            positions)`` and the model is given ``doc_ids`` / ``positions`` (:meth:`GPT.forward`), so every layer
            stays inside each document. False: only ``x, y`` are used (a packed batch is the plain packed baseline).
            Loss and ``val/bpb`` are per scored token either way. The data module's ``pack_stats`` (tokens and
            documents kept / dropped) are logged at the start of training.

    Raises:
        ValueError: an optimiser config that cannot build an optimiser (:func:`optimizer_factory`), at construction.

    Throughput (``perf/*``) is measured here rather than by Lightning's ``ThroughputMonitor``, which does not fit:
    it reports rates only once its window (default 100 steps) is full, so short runs and every run's first window
    log none; its names (``train|items_per_sec``, ...) and units (window averages of wall time between batch ends,
    which include data loading, logging and checkpointing) are not ``perf/tokens_per_s`` / ``perf/step_time_s``,
    whose per-step compute time (``on_train_batch_start`` to ``on_train_batch_end``, CUDA synchronised at both) the
    committed results and ``eval/quality.py`` medians compare; it logs at ``total_batch_idx + 1``, not at the
    optimizer step the other metrics use; and it has no peak memory. Learning rate: ``LearningRateMonitor``
    (``train/lr``); validation means: ``torchmetrics`` (:meth:`validation_step`).
    """

    def __init__(self, model_config: Union[ModelConfig, dict], layer_specs: Optional[List[dict]] = None,
                 backend: str = "auto", redraw_interval: Optional[int] = None,
                 optimizer: Optional[dict] = None, lr: Optional[float] = None, weight_decay: Optional[float] = None,
                 betas=None, warmup_steps: int = 100, min_lr_ratio: float = 0.1, total_steps: Optional[int] = None,
                 bytes_per_token: Optional[float] = None, task: str = "lm", compile: bool = False,
                 doc_mask: bool = False):
        super().__init__()
        from torchmetrics.aggregation import MeanMetric

        if isinstance(model_config, ModelConfig):
            if layer_specs is not None or redraw_interval is not None:
                raise ValueError("layer_specs / redraw_interval: give them inside the ModelConfig, not beside it")
        else:
            if layer_specs is None:
                raise ValueError("layer_specs: required with a plain-dict model_config (or pass a ModelConfig)")
            model_config = ModelConfig.from_dict(dict(model_config=model_config, layer_specs=layer_specs,
                                                      redraw_interval=redraw_interval))
        self.model_config: ModelConfig = model_config
        # the hparams (checkpoints, loggers) hold its plain form: save_hyperparameters reads these local names
        plain = model_config.to_dict()
        model_config, layer_specs, redraw_interval = (plain[k] for k in ("model_config", "layer_specs",
                                                                         "redraw_interval"))
        self.save_hyperparameters(ignore=["lr", "weight_decay", "betas"])
        opt = dict(DEFAULT_OPTIMIZER if optimizer is None else optimizer)
        for key, value in (("lr", lr), ("weight_decay", weight_decay), ("betas", betas)):
            if value is not None:
                opt[key] = list(value) if key == "betas" else value
        validate_optim_config(dict(opt, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio))
        optimizer_factory(opt)  # a bad optim.* fails now, not at the first step
        self.hparams["optimizer"] = opt
        if not isinstance(doc_mask, bool):
            raise ValueError(f"doc_mask must be true or false, got {doc_mask!r}")
        self.doc_mask = doc_mask
        self._sparse_targets = "mqar" in str(task).lower()  # loss on the query positions only (GPT.forward)
        # False: a validation's metrics reach trainer.callback_metrics (and validate()'s result) but not the loggers
        # (train.py's final validation of a model the fit already validated at that step: logged once)
        self.log_val_to_loggers = True
        self.model = GPT.from_config(self.model_config, backend=backend)
        self.hparams["n_params"] = self.model.num_params()
        self.hparams["n_params_non_embedding"] = self.model.num_params(non_embedding=True)
        self._t0: Optional[float] = None  # timer start of a logged step (on_train_batch_start)
        self._log_step = True  # whether this step's metrics are written (on_train_batch_start)
        self.schedule_total_steps: Optional[int] = None  # the LR schedule's length, set by configure_optimizers
        # token-weighted means over the scored positions; summed over DDP ranks by torchmetrics at compute();
        # float64 sums as before; "disable": no NaN check (a host sync per batch), a NaN loss stays NaN
        self.val_loss = MeanMetric(nan_strategy="disable").set_dtype(torch.float64)
        self.val_acc = MeanMetric(nan_strategy="disable").set_dtype(torch.float64)
        if compile:
            self.model = torch.compile(self.model)

    @property
    def gpt(self) -> GPT:
        return getattr(self.model, "_orig_mod", self.model)

    def forward(self, idx, targets=None, doc_ids=None, positions=None):
        return self.model(idx, targets, doc_ids=doc_ids, positions=positions)

    def _documents(self, batch) -> dict:
        """``{doc_ids, positions}`` of a packed batch ``(x, y, doc_ids, positions)`` when ``doc_mask`` is on (the
        model keeps every document apart), else ``{}`` (a packed batch without doc_mask: the plain packed baseline)."""
        if not self.doc_mask:
            return {}
        if len(batch) < 4:
            raise ValueError("doc_mask=True needs packed batches (x, y, doc_ids, positions): set data.pack=true")
        return {"doc_ids": batch[2], "positions": batch[3]}

    def check_checkpoint_hparams(self, saved: dict) -> None:
        """Raise ``ValueError`` (starting ``ckpt_path:``) when checkpoint hparams ``saved`` are of another
        architecture (attention specs or model config) than this module, or of other optimiser / LR-schedule settings
        (:func:`optim_settings`: ``optim.lr``, ``optim.betas``, ``optim.weight_decay``, ``optim._target_``, any other
        optimiser argument, ``optim.warmup_steps``, ``optim.min_lr_ratio``).

        A resumed run continues the checkpoint's optimiser state (its parameter groups keep their ``lr``, ``betas``,
        ``weight_decay``) and LR schedule, so another value in this run's config would not be used, only recorded;
        it is refused instead, naming each key with the checkpoint's and this run's value. The schedule length
        (``total_steps``) is not compared: the checkpoint's is kept (:meth:`on_load_checkpoint`)."""
        why = architecture_diff(saved, self.model_config)
        if why is not None:
            raise ValueError(f"ckpt_path: {why}")
        if bool(saved.get("doc_mask", False)) != self.doc_mask:  # checkpoints from before it: trained without
            raise ValueError(
                f"ckpt_path: the checkpoint was trained with data.doc_mask={str(bool(saved.get('doc_mask'))).lower()} "
                f"(packed documents {'kept apart' if saved.get('doc_mask') else 'not kept apart'}) but this run has "
                f"data.pack={'true' if self.doc_mask else 'false or'} data.doc_mask={str(self.doc_mask).lower()}; "
                f"resume with the same data.pack / data.doc_mask")
        old_opt, new_opt = optim_settings(saved), optim_settings(self.hparams)
        has_opt = any(k[len("optim."):] not in SCHEDULE_KEYS for k in old_opt)
        keys = sorted(k for k in set(old_opt) | set(new_opt)
                      if k in old_opt or (has_opt and k[len("optim."):] not in SCHEDULE_KEYS))
        diff = [k for k in keys if old_opt.get(k) != new_opt.get(k)]
        if diff:
            what = "; ".join(f"{k}: checkpoint {old_opt.get(k)!r}, this run {new_opt.get(k)!r}" for k in diff)
            fix = " ".join(f"{k}={_override(old_opt[k])}" if k in old_opt else f"'~{k}'" for k in diff)
            raise ValueError(
                f"ckpt_path: the optimizer / LR schedule differs from the checkpoint's ({what}); a resumed run keeps "
                f"the checkpoint's optimizer state and LR schedule, so these values would not be used. Resume with "
                f"the checkpoint's values ({fix}), or start a new run to train with other ones"
            )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse to resume a checkpoint of another architecture; keep the checkpoint's LR schedule; name the weights
        as this module does (a checkpoint of a ``compile=true`` run resumes without it, and the other way round).

        A resumed run keeps the schedule length it was started with (``total_steps`` in the checkpoint's hparams),
        so extending a run with a larger ``trainer.max_steps`` continues at ``lr * min_lr_ratio`` past the original
        end instead of stretching the cosine again (which would raise the LR). Lightning restores the module before
        it calls :meth:`configure_optimizers` (strategies without ``restore_checkpoint_after_setup``).
        """
        saved = checkpoint.get("hyper_parameters") or {}
        self.check_checkpoint_hparams(saved)
        if "state_dict" in checkpoint:
            checkpoint["state_dict"] = self._state_dict_for_this_module(checkpoint["state_dict"])
        if saved.get("total_steps"):
            self.hparams.total_steps = int(saved["total_steps"])
        for state in checkpoint.get("optimizer_states") or []:  # groups saved before they had names: keep train/lr
            for group, name in zip(state.get("param_groups") or [], PARAM_GROUP_NAMES):
                group.setdefault("name", name)

    def _state_dict_for_this_module(self, state: dict) -> dict:
        """``state`` (a checkpoint's ``state_dict``) with the GPT's keys named as in this module: ``model.<name>``, or
        ``model._orig_mod.<name>`` when this module's model is compiled (``compile=true`` wraps it), so a checkpoint of a
        compiled run resumes without compiling and the other way round. Other keys are left as they are."""
        compiled, wrapped = self.model is not self.gpt, "model._orig_mod."

        def rename(key: str) -> str:
            if compiled and key.startswith("model.") and not key.startswith(wrapped):
                return wrapped + key[len("model."):]
            if not compiled and key.startswith(wrapped):
                return "model." + key[len(wrapped):]
            return key

        return {rename(k): v for k, v in state.items()}

    # ------------------------------------------------------------------ training
    def on_train_start(self):
        n = self.gpt.num_params()
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        stats = dict(getattr(dm, "pack_stats", None) or {})  # packed documents: tokens / documents kept and dropped
        for lg in self.loggers:
            lg.log_metrics({"model/n_params": float(n), **stats}, step=self.global_step)

    def _writes_step_logs(self) -> bool:
        """Whether Lightning writes this optimizer step's ``on_step`` metrics (every ``trainer.log_every_n_steps``-th
        step, and the step training is asked to stop at; a run shorter than that logs none): Lightning's own test (``should_update_logs``, the same in ``on_train_batch_start``
        and ``on_train_batch_end``). Without a Trainer (a direct ``training_step`` call): True."""
        trainer = self._trainer
        connector = getattr(trainer, "_logger_connector", None) if trainer is not None else None
        return bool(getattr(connector, "should_update_logs", True))

    def on_train_batch_start(self, batch, batch_idx):
        """Redraw FAVOR features when due; on a step whose metrics are written, start its timer (CUDA synchronised).

        The step metrics (``train/loss``, ``perf/*``) are computed and logged only on the steps Lightning writes
        (:meth:`_writes_step_logs`): a ``self.log`` call costs about 1 ms of host time and the CUDA synchronisations
        of the timer stop the host from queueing the next step, which is most of a small model's step time (many
        MQAR jobs share one GPU). Every other step runs without a synchronisation."""
        self.gpt.redraw_features(self.global_step)
        self._log_step = self._writes_step_logs()
        self._t0 = None
        if not self._log_step:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._t0 = time.perf_counter()

    def training_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]  # (B, N), (B, N); packed text: doc_ids, positions (B, N) after them
        _, loss = self.model(x, y, sparse_targets=self._sparse_targets, **self._documents(batch))
        if self._log_step:
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._t0 is None:  # not a logged step
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - self._t0
        x = batch[0]
        world = self.trainer.world_size if self.trainer is not None else 1
        self.log_dict({
            "perf/step_time_s": dt,
            "perf/tokens_per_s": x.numel() * world / max(dt, 1e-9),
            "perf/peak_mem_mb": _peak_mem_mb(self.device),
        }, on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ validation
    def on_validation_epoch_start(self):
        self.val_loss.reset()
        self.val_acc.reset()

    def validation_step(self, batch, batch_idx):
        """Accumulate the cross-entropy and correctness of every scored position (targets ``!= -100``) of ``batch``
        (``x``, ``y``: ``(B, N)`` int64) into :attr:`val_loss` / :attr:`val_acc` (torchmetrics ``MeanMetric``), so
        the epoch's ``val/loss`` and ``val/acc`` are means over scored tokens, not over batches."""
        x, y = batch[0], batch[1]
        docs = self._documents(batch)
        mask = y != -100
        tgt = y[mask]  # (M,), M scored positions
        if self._sparse_targets and self.model is self.gpt:  # the head on the scored rows only (GPT.forward)
            lf = self.model(x, y, sparse_targets=True, **docs)[0].float()  # (M, V)
        else:
            lf = self.model(x, **docs).float()[mask]  # (B, N, V) -> (M, V)
        self.val_loss.update(torch.nn.functional.cross_entropy(lf, tgt, reduction="none"))
        self.val_acc.update((lf.argmax(-1) == tgt).to(lf.dtype))

    def on_validation_epoch_end(self):
        """Log ``val/loss`` (nats per scored token), ``val/ppl``, ``val/acc`` and, for text, ``val/bpb``.

        ``compute()`` sums the metric states (sums of losses / correct tokens and token counts) over DDP ranks (the
        library's reduction); the values are then the same on every rank, so ``sync_dist`` only silences Lightning's
        warning about epoch-level values in DDP. The data modules' validation sampler gives every example to one rank
        once (:func:`harness.data.val_sampler`), so they equal the single-process values. A validation without scored
        positions logs NaN. :attr:`log_val_to_loggers` false: not sent to the loggers (CSV, W&B)."""
        loss = self.val_loss.compute().float()
        acc = self.val_acc.compute().float()
        self.val_loss.reset()
        self.val_acc.reset()
        metrics = {"val/loss": loss, "val/ppl": torch.exp(loss.clamp(max=50)), "val/acc": acc}
        if self.hparams.bytes_per_token:
            metrics["val/bpb"] = loss / math.log(2) / float(self.hparams.bytes_per_token)
        self.log_dict(metrics, prog_bar=True, logger=self.log_val_to_loggers,
                      sync_dist=self.trainer is not None and self.trainer.world_size > 1)

    # ------------------------------------------------------------------ optimiser
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """Clip with ``trainer.gradient_clip_val`` also for the fused AdamW. Lightning's mixed-precision plugin
        refuses to clip for any optimiser that unscales inside its step (the fused AdamW), even under
        ``bf16-mixed``, which keeps no loss scale. With no scaler the gradients are the true gradients, so they
        are clipped here directly; a run with a scaler (``16-mixed``) gets the foreach AdamW (:func:`adamw_impl`)
        and Lightning's own clipping, which unscales first."""
        if not gradient_clip_val:
            return
        if getattr(optimizer, "_step_supports_amp_scaling", False) and \
                getattr(self.trainer.precision_plugin, "scaler", None) is None:
            clip_gradients_(self.parameters(), float(gradient_clip_val), str(gradient_clip_algorithm or "norm"))
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def configure_optimizers(self):
        """The optimiser of ``hparams.optimizer`` (:func:`build_optimizer`: fused / foreach on CUDA, see
        :func:`adamw_impl`) over two parameter groups, matrices (``p.dim() >= 2``: the config's ``weight_decay``) and
        vectors (no weight decay), named :data:`PARAM_GROUP_NAMES`; a per-step LambdaLR named ``train``
        (:func:`cosine_with_warmup` over ``total_steps``), so ``LearningRateMonitor`` logs ``train/lr``."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"name": PARAM_GROUP_NAMES[0], "params": [p for p in params if p.dim() >= 2]},
                  {"name": PARAM_GROUP_NAMES[1], "params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        impl = adamw_impl(self.device.type, self.trainer.precision_plugin if self.trainer is not None else None)
        opt = build_optimizer(self.hparams.optimizer, groups, impl)
        total = self.hparams.total_steps
        if not total:
            total = int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 1
        warm, mlr = int(self.hparams.warmup_steps), float(self.hparams.min_lr_ratio)
        if 0 < total <= warm:  # cosine_with_warmup caps the warmup: say so, the run is not as written
            logging.getLogger(__name__).warning(
                f"optim.warmup_steps={warm} is not shorter than the LR schedule ({total} steps: trainer.max_steps, "
                f"or the epochs' batches, or a resumed run's first max_steps): the warmup ramps to the full LR over "
                f"those {total} steps and the cosine decay never runs; pass optim.warmup_steps < {total} "
                f"(final_metrics.json records lr_schedule.warmup_steps={total}, the warmup that ran)")
        self.schedule_total_steps = int(total)  # recorded in final_metrics.json (lr_schedule)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_with_warmup(s, warm, total, mlr))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "train"}}
