"""Train a small GPT with any attention variant (Hydra + Lightning).

    python train.py                                   # embedded default: MQAR, tiny model, flash attention
    python train.py attention=linear                  # any of conf/attention/*.yaml
    python train.py data=text data.path=../shared/data/tinyshakespeare/input.txt model=small
    python train.py model.layers=[linear,flash]       # per-layer hybrid (one entry per layer)
    python train.py -m attention=flash,linear         # sweep: one output dir (and W&B run) per job
    python train.py trainer=ddp                       # Lightning DDP (2 CPU processes with gloo)
    python train.py ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt trainer.max_steps=2000   # resume

Outputs: ``outputs/<date>/<time>/`` (``multirun/<date>/<time>/<job>/`` for sweeps) with ``.hydra/`` (the
composed config), ``csv/`` (metrics.csv, hparams.yaml), ``checkpoints/`` (``last.ckpt``) and ``wandb/``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Dict, List, Optional

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from attn_zoo.lit import LitLM
from attn_zoo.model import spec_to_dict
from attn_zoo.spec import AttentionSpec
from attn_zoo.tracking import wandb_mode

CONF_DIR = Path(__file__).resolve().parent / "conf"


# ---------------------------------------------------------------------------------------------- helpers
def _abs(path: str) -> str:
    """A path relative to the directory ``train.py`` was launched from (Hydra's original cwd)."""
    from hydra.utils import to_absolute_path

    return to_absolute_path(str(path))


def _spec_from_cfg(node) -> AttentionSpec:
    node = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    node.pop("_target_", None)
    from attn_zoo import make_spec

    return make_spec(**node)


def layer_specs(cfg: DictConfig) -> List[AttentionSpec]:
    """The attention spec of every layer.

    ``model.layers`` null: every layer uses the ``attention`` group's spec. Otherwise a list of ``n_layer``
    entries, each the name of a ``conf/attention/<name>.yaml`` (the selected ``attention`` group, including
    command-line overrides, when the name matches ``attention.name``) or an inline dict of spec fields.
    """
    base = _spec_from_cfg(cfg.attention)
    layers = cfg.model.get("layers")
    n_layer = int(cfg.model.n_layer)
    if layers is None:
        return [base] * n_layer
    layers = list(layers)
    if len(layers) != n_layer:
        raise ValueError(f"model.layers has {len(layers)} entries but model.n_layer={n_layer}; give one per layer")
    specs = []
    for i, entry in enumerate(layers):
        if isinstance(entry, str):
            if entry == base.label:
                specs.append(base)
                continue
            f = CONF_DIR / "attention" / f"{entry}.yaml"
            if not f.exists():
                names = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
                raise ValueError(f"model.layers[{i}]={entry!r} is not an attention config; allowed values: {', '.join(names)}")
            specs.append(_spec_from_cfg(OmegaConf.load(f)))
        else:
            specs.append(_spec_from_cfg(entry))
    return specs


def build_datamodule(cfg: DictConfig):
    from hydra.utils import get_class

    kw = OmegaConf.to_container(cfg.data, resolve=True)
    target = kw.pop("_target_")
    path = kw.get("path")
    if "path" in kw and path is not None:
        # relative to the launch directory; TextDataModule raises FileNotFoundError naming data.path
        absolute = [_abs(p) for p in (path if isinstance(path, list) else [path])]
        kw["path"] = absolute if isinstance(path, list) else absolute[0]
    if kw.get("cache_dir"):
        kw["cache_dir"] = _abs(kw["cache_dir"])
    return get_class(target)(**kw)


def build_loggers(cfg: DictConfig, output_dir: str, variant_tags: List[str]):
    from hydra.utils import instantiate

    loggers = []
    for name, lcfg in (cfg.get("logger") or {}).items():
        if lcfg is None:
            continue
        extra = {}
        if str(lcfg.get("_target_", "")).endswith("WandbLogger"):
            offline = lcfg.get("offline", "auto")
            extra["offline"] = wandb_mode("auto") != "online" if offline in ("auto", None) else bool(offline)
            extra["tags"] = sorted(set(list(lcfg.get("tags") or []) + variant_tags))
            if lcfg.get("name") is None:
                extra["name"] = f"{cfg.experiment_name}/{'+'.join(variant_tags)}"
            Path(lcfg.save_dir).mkdir(parents=True, exist_ok=True)
        loggers.append(instantiate(lcfg, **extra))
    return loggers


def _finish_wandb(loggers) -> None:
    """Close the W&B run so that the next job of a multirun starts its own run (own id and directory)."""
    if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
        import wandb

        if wandb.run is not None:
            wandb.finish()


def resolve_precision(p):
    if p in ("auto", None):
        return "bf16-mixed" if torch.cuda.is_available() else "32-true"
    return p


def print_table(title: str, rows: Dict[str, object]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in rows.items():
            t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
        Console().print(t)
    except ImportError:  # pragma: no cover
        print(title)
        for k, v in rows.items():
            print(f"  {k:24s} {v}")


# ---------------------------------------------------------------------------------------------- main
def train(cfg: DictConfig) -> Dict[str, float]:
    """Build data, model, loggers and Trainer from ``cfg``, fit, validate; returns the final metrics."""
    t_start = time.time()
    L.seed_everything(int(cfg.seed), workers=True)
    output_dir = str(cfg.paths.output_dir)
    Path(output_dir).mkdir(parents=True, exist_ok=True)

    dm = build_datamodule(cfg)
    specs = layer_specs(cfg)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg.pop("layers", None)
    redraw = int(model_cfg.pop("redraw_interval", 0) or 0)
    if model_cfg.get("vocab_size") != dm.vocab_size:
        raise ValueError(f"model.vocab_size={model_cfg.get('vocab_size')} != data vocab_size={dm.vocab_size}")
    o = cfg.optim
    lit = LitLM(
        model_config=model_cfg, layer_specs=[spec_to_dict(s) for s in specs], backend=cfg.attention_backend,
        redraw_interval=redraw, lr=o.lr, weight_decay=o.weight_decay, betas=list(o.betas),
        warmup_steps=o.warmup_steps, min_lr_ratio=o.min_lr_ratio, bytes_per_token=dm.bytes_per_token,
        task=type(dm).__name__, compile=bool(cfg.get("compile", False)),
    )
    variant_tags = sorted({s.label for s in specs})
    loggers = build_loggers(cfg, output_dir, variant_tags)
    full_cfg = OmegaConf.to_container(cfg, resolve=True)
    for lg in loggers:
        lg.log_hyperparams({"config": full_cfg, "n_params": lit.gpt.num_params(), "variant": "+".join(lit.gpt.layer_labels)})

    from hydra.utils import instantiate

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    tcfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    tcfg.pop("_target_", None)
    tcfg["precision"] = resolve_precision(tcfg.get("precision"))
    trainer = L.Trainer(**tcfg, logger=loggers or False, callbacks=callbacks, default_root_dir=output_dir)

    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:
        ckpt_path = _abs(ckpt_path) if ckpt_path != "last" else ckpt_path
    try:
        trainer.fit(lit, datamodule=dm, ckpt_path=ckpt_path)
        val = trainer.validate(lit, datamodule=dm, verbose=False)
    finally:
        _finish_wandb(loggers)
    metrics = {k: float(v) for k, v in (val[0] if val else {}).items()}
    for k, v in trainer.callback_metrics.items():
        if k.startswith("train/") and k not in metrics:
            metrics[k] = float(v)

    if trainer.is_global_zero:
        rows = {"variant": "+".join(lit.gpt.layer_labels), "n_params": lit.gpt.num_params(),
                "steps": trainer.global_step}
        rows.update({k: metrics[k] for k in sorted(metrics)})
        if getattr(dm, "unigram_bits_per_byte", None) is not None:
            rows["unigram_baseline_bpb"] = dm.unigram_bits_per_byte()
        rows["wall_s"] = round(time.time() - t_start, 1)
        rows["output_dir"] = output_dir
        print_table(f"attn-zoo: {cfg.experiment_name}", rows)
    return metrics


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> Optional[float]:
    metrics = train(cfg)
    value = metrics.get(cfg.get("optimized_metric", "val/loss"))
    return None if value is None or math.isnan(value) else float(value)


if __name__ == "__main__":
    main()
