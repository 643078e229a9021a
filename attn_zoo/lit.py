"""``LitLM``: the Lightning module that trains :class:`attn_zoo.model.GPT`.

Optimiser: AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only (``p.dim() >= 2``),
linear warmup then cosine decay to ``min_lr_ratio * lr``. Gradient clipping and precision (bf16-mixed
on GPU) are Trainer settings; on CUDA the AdamW is the fused one and clipping works with it
(:func:`adamw_impl`, :meth:`LitLM.configure_gradient_clipping`).

Logged metrics
    train/loss, train/lr, perf/tokens_per_s, perf/step_time_s, perf/peak_mem_mb (CUDA max allocated, else
    process RSS), model/n_params (once, also in hparams);
    val/loss, val/ppl, val/acc (next-token accuracy on scored positions; MQAR: accuracy on query positions),
    val/bpb (text: ``loss / ln 2 / bytes_per_token``).
"""

from __future__ import annotations

import math
import time
from typing import List, Optional

import lightning as L
import torch

from .model import GPT, config_from_dict, layer_from_dict, spec_to_dict
from .spec import AttentionSpec, make_spec


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:  # pragma: no cover - psutil missing
        return float("nan")


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: ``step / warmup`` during warmup, then cosine from 1 to ``min_lr_ratio`` at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    t = min(max((step - warmup_steps) / (total_steps - warmup_steps), 0.0), 1.0)
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
    ``[-clip_val, clip_val]`` (``"value"``). Raises ``ValueError`` naming ``gradient_clip_algorithm``."""
    params = [p for p in parameters if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, clip_val)
    elif algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, clip_val)
    else:
        raise ValueError(f"trainer.gradient_clip_algorithm={algorithm!r} is not supported; allowed values: norm, value")


class LitLM(L.LightningModule):
    """Language-model training around a :class:`GPT`; the module builds the model from plain dicts so a
    checkpoint is self-contained (``LitLM.load_from_checkpoint(path)``).

    Args:
        model_config: :class:`attn_zoo.model.GPTConfig` fields.
        layer_specs: one spec dict per layer (``attn_zoo.make_spec`` keyword arguments).
        backend: attention backend for every layer.
        redraw_interval: FAVOR feature redraw period in steps (0 = never).
        lr, weight_decay, betas, warmup_steps, min_lr_ratio: optimiser / schedule.
        total_steps: schedule length (``train.py``: ``trainer.max_steps`` of the run that started it); None = the
            Trainer's ``estimated_stepping_batches``. Saved in the hparams; a resumed checkpoint's value wins
            (:meth:`on_load_checkpoint`), steps past it run at ``lr * min_lr_ratio``.
        bytes_per_token: text data; enables ``val/bpb``. None for synthetic tasks.
        task: free-form label (``"text"`` / ``"mqar"``) kept in hparams.
    """

    def __init__(self, model_config: dict, layer_specs: List[dict], backend: str = "auto", redraw_interval: int = 0,
                 lr: float = 1e-3, weight_decay: float = 0.1, betas=(0.9, 0.95), warmup_steps: int = 100,
                 min_lr_ratio: float = 0.1, total_steps: Optional[int] = None,
                 bytes_per_token: Optional[float] = None, task: str = "lm", compile: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self._sparse_targets = "mqar" in str(task).lower()  # loss on the query positions only (GPT.forward)
        specs = [layer_from_dict(s) for s in layer_specs]
        self.model = GPT(config_from_dict(dict(model_config)), specs, backend=backend, redraw_interval=redraw_interval)
        self.hparams["n_params"] = self.model.num_params()
        self.hparams["n_params_non_embedding"] = self.model.num_params(non_embedding=True)
        self._t0: Optional[float] = None
        self._val_sum = self._val_cnt = self._val_correct = 0.0
        if compile:
            self.model = torch.compile(self.model)

    @property
    def gpt(self) -> GPT:
        return getattr(self.model, "_orig_mod", self.model)

    def forward(self, idx, targets=None):
        return self.model(idx, targets)

    def check_checkpoint_hparams(self, saved: dict) -> None:
        """Raise ``ValueError`` (starting ``ckpt_path:``) when checkpoint hparams ``saved`` are of another
        architecture (attention specs or model config) than this module."""
        if "layer_specs" in saved:
            old = [layer_from_dict(d) for d in saved["layer_specs"]]
            new = [layer_from_dict(d) for d in self.hparams.layer_specs]
            if old != new:
                raise ValueError(
                    "ckpt_path: the checkpoint was trained with attention "
                    f"{[s.label for s in old]} ({old}) but this run builds {[s.label for s in new]} ({new}); "
                    "resume with the same attention / model.layers overrides"
                )
        if "model_config" in saved and dict(saved["model_config"]) != dict(self.hparams.model_config):
            old, new = dict(saved["model_config"]), dict(self.hparams.model_config)
            diff = ", ".join(f"model.{k}: checkpoint {old.get(k)!r}, this run {new.get(k)!r}"
                             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            raise ValueError(
                f"ckpt_path: model config differs from the checkpoint's ({diff}); resume with the same model / data "
                f"overrides as the run that wrote it (vocab_size and max_seq_len follow data.*)"
            )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse to resume a checkpoint of another architecture; keep the checkpoint's LR schedule.

        A resumed run keeps the schedule length it was started with (``total_steps`` in the checkpoint's hparams),
        so extending a run with a larger ``trainer.max_steps`` continues at ``lr * min_lr_ratio`` past the original
        end instead of stretching the cosine again (which would raise the LR). Lightning restores the module before
        it calls :meth:`configure_optimizers` (strategies without ``restore_checkpoint_after_setup``).
        """
        saved = checkpoint.get("hyper_parameters") or {}
        self.check_checkpoint_hparams(saved)
        if saved.get("total_steps"):
            self.hparams.total_steps = int(saved["total_steps"])

    # ------------------------------------------------------------------ training
    def on_train_start(self):
        n = self.gpt.num_params()
        for lg in self.loggers:
            lg.log_metrics({"model/n_params": float(n)}, step=self.global_step)

    def on_train_batch_start(self, batch, batch_idx):
        self.gpt.redraw_features(self.global_step)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._t0 = time.perf_counter()

    def training_step(self, batch, batch_idx):
        x, y = batch  # (B, N), (B, N)
        _, loss = self.model(x, y, sparse_targets=self._sparse_targets)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._t0 is None:
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
            "train/lr": self.optimizers().param_groups[0]["lr"],
        }, on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ validation
    def on_validation_epoch_start(self):
        self._val_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        self._val_cnt = torch.zeros((), device=self.device, dtype=torch.float64)
        self._val_correct = torch.zeros((), device=self.device, dtype=torch.float64)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)  # (B, N, V)
        mask = y != -100
        lf = logits.float()[mask]
        tgt = y[mask]
        self._val_sum += torch.nn.functional.cross_entropy(lf, tgt, reduction="sum").double()
        self._val_cnt += mask.sum().double()
        self._val_correct += (lf.argmax(-1) == tgt).sum().double()

    def on_validation_epoch_end(self):
        s, c, ok = self._val_sum, self._val_cnt, self._val_correct
        if self.trainer is not None and self.trainer.world_size > 1:
            s, c, ok = (self.all_gather(t).sum() for t in (s, c, ok))
        loss = (s / c.clamp(min=1)).float()
        metrics = {"val/loss": loss, "val/ppl": torch.exp(loss.clamp(max=50)), "val/acc": (ok / c.clamp(min=1)).float()}
        if self.hparams.bytes_per_token:
            metrics["val/bpb"] = loss / math.log(2) / float(self.hparams.bytes_per_token)
        # already summed over ranks above: identical on every rank, sync_dist only silences Lightning's warning
        self.log_dict(metrics, prog_bar=True, sync_dist=self.trainer is not None and self.trainer.world_size > 1)

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
        decay, no_decay = [], []
        for _, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        impl = adamw_impl(self.device.type, self.trainer.precision_plugin if self.trainer is not None else None)
        opt = torch.optim.AdamW(groups, lr=self.hparams.lr, betas=tuple(self.hparams.betas),
                                **({} if impl == "default" else {impl: True}))
        total = self.hparams.total_steps
        if not total:
            total = int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 1
        warm, mlr = int(self.hparams.warmup_steps), float(self.hparams.min_lr_ratio)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_with_warmup(s, warm, total, mlr))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
