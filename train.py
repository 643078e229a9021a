"""Train a small GPT with any attention variant (Hydra + Lightning).

    python train.py                                   # embedded default: MQAR, tiny model, flash attention
    python train.py attention=linear                  # any of conf/attention/*.yaml
    python train.py data=text data.path=../shared/data/tinyshakespeare/input.txt model=small
    python train.py data=text data.pack=true data.doc_mask=true   # packed documents (docs/documents.md)
    python train.py model.layers=[linear,flash]       # per-layer hybrid (one entry per layer)
    python train.py -m attention=flash,linear         # sweep: one output dir (and W&B run) per job, then a table
    python train.py trainer=ddp                       # Lightning DDP (2 CPU processes with gloo)
    python train.py ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt trainer.max_steps=2000   # resume / extend
    python train.py ckpt_path=last trainer.max_steps=2000                                          # the latest run

Outputs: ``outputs/<date>/<time>/``, one folder per launch (``<time>-1/`` for a second launch in the same second;
``multirun/<date>/<time>/<overrides>/`` for sweeps, e.g.
``attention=flash``) with ``.hydra/`` (the composed config), ``csv/`` (metrics.csv, hparams.yaml), ``checkpoints/``
(``last.ckpt``: written at validation, at the end of training and on Ctrl-C), ``wandb/`` (the run and its id,
``run_id.txt``) and ``final_metrics.json`` (the final table; a multirun prints all jobs' in one table).

Resume (:mod:`harness.runs`): ``ckpt_path=<run>/checkpoints/last.ckpt`` continues that run in its own directory
(CSV continued, same W&B run id, the resumed config in ``.hydra/resume-<time>/``) up to ``trainer.max_steps`` total
steps, which must exceed the checkpoint's step; the optimizer and LR schedule stay the original run's (past its end:
``lr * min_lr_ratio``): an ``optim.*`` value that differs from the checkpoint's is refused (``ckpt_path: ...``), and so
is a ``data.*`` value (but ``cache_dir``, ``num_workers``, ``max_memory_gb``: :data:`harness.runs.RESUME_FREE_DATA_KEYS`).

Resumable multiruns (``skip_finished=true``, the experiment configs): re-running a sweep skips the finished jobs and
resumes the unfinished ones from their ``checkpoints/last.ckpt`` (same config only; one whose training had ended is
only validated and finalised); ``stop_at=<unix time>`` stops the running jobs there with a checkpoint and starts no
new ones (:mod:`harness.runs`, :class:`StopAt`). ``wall_s`` of a resumed run: the total over its launches.

Bad values (``trainer.max_steps`` not a positive integer, ``optim.lr`` not a positive number, ...) and unknown keys
(``+trainer.foo=1``, ``+foo=1``) fail before anything is written (:func:`validate_config`); settings that do not act
as written (a causal window's right side, ``model.redraw_interval`` without a FAVOR+ layer) are logged as warnings
before training (:func:`harness.config.layer_notes`). ``trainer.enable_progress_bar: auto``: the bar only on a terminal.

W&B is optional: not installed, ``WANDB_MODE=disabled``, or a run that cannot start: CSV only, said in one line.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import hydra
import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from harness.callbacks import RunState, StepProgressBar, StopAt, StopTraining
from harness.config import (CONF_DIR, _is_int, dense_mask_notes, _qualified, _spec_from_cfg, check_attention_backend,  # noqa: F401
                            check_batch_limits, check_model_config, config_errors, layer_notes, layer_specs,
                            model_config, run_label, validate_config)
from harness.data import missing_file_error
from harness.lit import LitLM, architecture_diff, split_optim_config
from harness.runs import (CKPT_DIR, FINAL_METRICS, ContinuedCSVLogger, check_resume_data, checkpoint_info,
                           data_links, finished_run, job_dirname, repeated_sweep_value, resume_data_config,
                           mark_not_started, register_resolvers, resolve_ckpt_path, result_config,
                           resumable_checkpoint, resume_hint, run_dir_of, single_run_notes, write_final_metrics,
                           write_run_config)
from harness.tracking import import_wandb, resolve_wandb_mode, wandb_disabled_by_env, wandb_run_id

log = logging.getLogger("attn_zoo.train")
# the final table, the curve and the verdict: conf/hydra/job_logging/attn_zoo.yaml prints them as plain lines and
# writes them to <run dir>/train.log
summary_log = logging.getLogger("attn_zoo.summary")


def _say(text: str) -> None:
    """One summary block through :data:`summary_log`; printed when logging does not show it (``train()`` called
    outside Hydra: no handler, or INFO below the level)."""
    if summary_log.hasHandlers() and summary_log.isEnabledFor(logging.INFO):
        summary_log.info(text)
    else:
        print(text, flush=True)


class _DropLightningNoise(logging.Filter):
    """Lightning's advertisement for its cloud logger, printed on every run whatever the loggers are."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropLightningNoise())
# torch deprecated `isinstance(x, LeafSpec)`, which Lightning's pytree helper still uses on every batch it moves
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
register_resolvers()  # conf/train.yaml's hydra node (run dir of a resumed checkpoint, job folder names)


# ---------------------------------------------------------------------------------------------- helpers
def _abs(path: str) -> str:
    """A path relative to the directory ``train.py`` was launched from (Hydra's original cwd)."""
    from hydra.utils import to_absolute_path

    return to_absolute_path(str(path))


def busy_cpu_note(on_gpu: bool) -> Optional[str]:
    """A hint for a CPU run that starts on a busy machine (1-minute load average >= the cores), else None: torch's
    threads then wait on each other while other processes hold the cores. One run of 100 MQAR steps on 2 shared cores
    took 37.9 s with torch's 2 threads, 4.3 s with ``OMP_NUM_THREADS=1`` (2026-12-05). None on a GPU, with one
    thread, or when ``OMP_NUM_THREADS`` is set."""
    if on_gpu or "OMP_NUM_THREADS" in os.environ or torch.get_num_threads() <= 1:
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return None
    cores = os.cpu_count() or 1
    if load < cores:
        return None
    return (f"a CPU run on a busy machine (load {load:.1f} on {cores} cores): torch's {torch.get_num_threads()} "
            f"threads wait on each other while other processes hold the cores; with OMP_NUM_THREADS=1 (e.g. "
            f"OMP_NUM_THREADS=1 python train.py ...) 100 MQAR steps took 4.3 s instead of 37.9 s on 2 shared cores")


def _stdout_is_tty() -> bool:
    import sys

    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def progress_bar_enabled(setting) -> bool:
    """``trainer.enable_progress_bar``: true / false as given; ``auto`` (the default) or null: on only when stdout is
    a terminal, so ``python train.py > log.txt`` (or a SLURM log) does not get one carriage-return update per step."""
    if setting in ("auto", None):
        return _stdout_is_tty()
    return bool(setting)


def build_datamodule(cfg: DictConfig):
    """The ``data`` group's data module: ``hydra.utils.instantiate(cfg.data)`` with ``data.path`` /
    ``data.val_path`` (a path or a list) and ``data.cache_dir`` relative to the launch directory.

    Instantiated as a partial and called here, so the data module's own errors (``FileNotFoundError`` naming
    ``data.path``, ``ValueError`` naming ``data.seq_len``, ...) reach the caller as they are, not wrapped in
    Hydra's ``InstantiationException``.
    """
    from hydra.utils import instantiate

    paths = {}
    for key in ("path", "val_path"):
        path = cfg.data.get(key)
        if path is not None:
            given = list(path) if OmegaConf.is_list(path) else [path]
            for p in given:  # named as typed (the data module sees the absolute path)
                if not os.path.isfile(_abs(p)):
                    raise missing_file_error(f"data.{key}", str(p), os.path.normpath(_abs(p)))
            paths[key] = [_abs(p) for p in path] if OmegaConf.is_list(path) else _abs(path)
    if cfg.data.get("cache_dir"):
        paths["cache_dir"] = _abs(cfg.data.cache_dir)
    return instantiate(cfg.data, _partial_=True, _convert_="all", **paths)()


def build_loggers(cfg: DictConfig, output_dir: str, variant_tags: List[str], resume_step: Optional[int] = None):
    """The ``logger`` group's loggers. W&B is optional: when it is not installed, ``WANDB_MODE=disabled`` or its run
    cannot start, the run goes on with CSV (added if the group has none) and says so in one log line. A resumed run
    (``resume_step``: the checkpoint's step) continues the CSV and the W&B run whose id is kept in the run dir."""
    from hydra.utils import get_class, instantiate

    loggers, note = [], None
    for name, lcfg in (cfg.get("logger") or {}).items():
        if lcfg is None:
            continue
        target = str(lcfg.get("_target_", ""))
        if target.endswith("WandbLogger"):
            lg, note = _wandb_logger(cfg, lcfg, output_dir, variant_tags, resume_step)
            if lg is not None:
                loggers.append(lg)
            continue
        extra = {}
        if isinstance(get_class(target), type) and issubclass(get_class(target), ContinuedCSVLogger):
            extra["resume_step"] = resume_step
        loggers.append(instantiate(lcfg, **extra))
    if note is not None and rank_zero_only.rank == 0:
        csv = [lg for lg in loggers if type(lg).__name__.endswith("CSVLogger")]
        if not csv and not any(type(lg).__name__ == "WandbLogger" for lg in loggers):
            csv = [ContinuedCSVLogger(save_dir=output_dir, name="csv", version="", resume_step=resume_step)]
            loggers += csv
        where = f"metrics go to {os.path.join(csv[0].log_dir, 'metrics.csv')}" if csv else "no CSV logger"
        log.warning(f"{note}; {where}")
    return loggers


def build_trainer(cfg: DictConfig, loggers: list, output_dir: str, extra_callbacks=()) -> L.Trainer:
    """``hydra.utils.instantiate(cfg.trainer)`` with the ``callbacks`` group's callbacks, ``extra_callbacks`` (e.g.
    :class:`RunState`) and ``loggers``.

    ``stop_at`` adds :class:`StopAt`; ``trainer.precision: auto`` becomes ``bf16-mixed`` on CUDA, else ``32-true``;
    ``trainer.enable_progress_bar: auto`` is on only when stdout is a terminal (:func:`progress_bar_enabled`); the step progress bar
    (:class:`StepProgressBar`) is added unless the bar is off or a callback is a progress bar; without a logger the
    ``LearningRateMonitor`` (which raises then) is left out. The Trainer is instantiated as a partial and called
    here, so its own errors (a bad ``trainer.accelerator``, an unknown key) are not wrapped by Hydra.
    """
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks += list(extra_callbacks)
    if cfg.get("stop_at") is not None:
        callbacks.append(StopAt(cfg.stop_at))
    if not loggers:
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    bar = progress_bar_enabled(cfg.trainer.get("enable_progress_bar", "auto"))
    if bar and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks.append(StepProgressBar())
    make = instantiate(cfg.trainer, _partial_=True, _convert_="all")
    extra = {}
    if cfg.trainer.get("limit_val_batches", 1.0) == 1.0:  # Lightning's default: no "100% of the batches" notice
        extra["limit_val_batches"] = None
    return make(precision=resolve_precision(cfg.trainer.get("precision")), logger=loggers or False,
                callbacks=callbacks, default_root_dir=output_dir, enable_progress_bar=bar, **extra)


def _wandb_logger(cfg, lcfg, output_dir: str, variant_tags: List[str], resume_step: Optional[int]):
    """``(WandbLogger or None, one-line note or None)``."""
    from hydra.utils import instantiate

    offline = lcfg.get("offline", "auto")
    if wandb_disabled_by_env():
        return None, "W&B off (WANDB_MODE=disabled)"
    wandb = import_wandb()
    if wandb is None:
        return None, "W&B off (wandb is not installed: pip install wandb)"
    note = None
    if offline in ("auto", None):
        mode, reason = resolve_wandb_mode("auto")
        offline = mode != "online"
        if "unreachable" in reason:
            note = f"W&B offline ({reason}): the run is written to {output_dir}/wandb, upload it later with wandb sync"
    rank0 = rank_zero_only.rank == 0
    run_id, _ = wandb_run_id(output_dir, resume=resume_step is not None, write=rank0)
    extra = {"offline": bool(offline), "id": run_id, "resume": "allow",
             "tags": sorted(set(list(lcfg.get("tags") or []) + variant_tags))}
    if lcfg.get("name") is None:
        extra["name"] = f"{cfg.experiment_name}/{'+'.join(variant_tags)}"
    Path(lcfg.save_dir).mkdir(parents=True, exist_ok=True)
    try:
        lg = instantiate(lcfg, **extra, _convert_="all")  # settings: a plain dict for wandb.init
        # Lightning's WandbLogger passes anonymous=None to wandb.init, which warns on every run that "the anonymous
        # setting has no effect" (any value but unset); the key is dropped when it carries nothing
        if getattr(lg, "_wandb_init", {}).get("anonymous", "kept") is None:
            lg._wandb_init.pop("anonymous")
        if rank0:
            _ = lg.experiment  # starts the W&B run now: a failure here leaves the run to CSV
    except Exception as e:  # noqa: BLE001 - any W&B failure (network, auth, service) must not end the run
        try:
            if wandb.run is not None:
                wandb.finish(exit_code=1)
        except Exception:  # noqa: BLE001
            pass
        return None, f"W&B off (the W&B run could not start: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return lg, note


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
    """The table (rich, rendered to text) through :func:`_say`: printed and in ``train.log``."""
    try:
        import io
        import shutil

        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        t = Table(title=escape(title))  # a multirun title holds "[...]" (model.layers=[a,b]): not rich markup
        t.add_column("metric", overflow="fold")
        t.add_column("value", justify="right", overflow="fold")  # long values wrap, not cut to "…"
        for k, v in rows.items():
            t.add_row(escape(k), f"{v:.4f}" if isinstance(v, float) else escape(str(v)))
        # a terminal: its width; a log file: no 80-column wrapping
        width = shutil.get_terminal_size((160, 24)).columns if _stdout_is_tty() else 160
        buf = io.StringIO()
        Console(file=buf, width=width, color_system=None).print(t)
        _say(buf.getvalue().rstrip("\n"))
    except ImportError:  # pragma: no cover
        _say("\n".join([title] + [f"  {k:24s} {v}" for k, v in rows.items()]))


# ---------------------------------------------------------------------------------------------- main
def _job_info() -> Dict[str, object]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    return {"num": int(hc.job.num) if hc.job.get("num") is not None else None,
            "overrides": list(hc.overrides.task), "override_dirname": hc.job.override_dirname}


def table_title(cfg: DictConfig) -> str:
    """The final table's title: ``attn-zoo: <experiment_name>``, and in a multirun `` / <the job's overrides>`` (its
    folder name, :func:`harness.runs.job_dirname`: the swept overrides), so each job's table says which job it is."""
    title = f"attn-zoo: {cfg.experiment_name}"
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            exclude = list(hc.job.config.override_dirname.get("exclude_keys") or [])
            title += f" / {job_dirname(list(hc.overrides.task), exclude, hc.job.get('num') or 0, hc.sweep.dir)}"
    return title


def train(cfg: DictConfig) -> Dict[str, float]:
    """Build data, model, loggers and Trainer from ``cfg``, fit, validate; returns the final metrics.

    ``ckpt_path`` resumes a run (see :mod:`harness.runs`): outputs go to the checkpoint's run directory,
    ``trainer.max_steps`` (total steps) must exceed the checkpoint's step and the LR schedule is the checkpoint's.
    A checkpoint whose training is complete (its step at ``trainer.max_steps``, its epochs at a positive
    ``trainer.max_epochs``, :attr:`harness.runs.CheckpointInfo.epochs`, or stopped by a callback such as
    EarlyStopping) in a run directory without ``final_metrics.json`` (the run was killed in its final validation)
    trains no step: it is validated and ``final_metrics.json`` is written with the checkpoint's step.

    ``final_metrics.json``: ``steps`` (optimizer steps trained), ``metrics`` (the final validation and the last
    logged ``train/*`` values: ``train/loss``, ``train/lr``, ``train/lr_no_decay``; a resumed launch that logged none,
    e.g. an extension ending before its first ``trainer.log_every_n_steps`` step, carries the checkpoint's,
    :meth:`RunState.last_train_metrics`), ``wall_s`` (seconds of wall time of the run from the start of this function to its
    final table; a resumed run adds the time stored in the checkpoint it resumed from, :class:`RunState`: the total
    over its launches, each counted up to the checkpoint the next one resumed from), ``resumed_from`` (the
    checkpoint this launch resumed, else null), ``result_config``, ``lr_schedule``, ``baseline`` (what the headline
    metric is compared with, :func:`baseline_of`, or null), ``curve`` (the run's validation metrics by step, earlier
    launches of a resumed run included, :class:`_Curve`) and
    ``diverged`` (a non-finite ``train/loss`` or ``val/loss``: true). Standard JSON: a NaN / inf value is null. The
    full output directory is printed on its own line after the final table (``output_dir: ...``).

    Raises:
        ValueError (:class:`harness.config.ConfigError`; a missing ``data.path`` / checkpoint: ``ConfigFileError``,
            a FileNotFoundError): a bad ``optim.*`` / ``trainer.*`` value (:func:`validate_config`, before anything
            is written), sizes that train nothing (``data.seq_len`` over the data's limit, ...), a checkpoint of another
            architecture or other optimizer / LR-schedule settings (``ckpt_path=last``: no run on these data settings
            and this model, or the one it picked has other optimizer settings: naming it), or a checkpoint of a finished run (or outside a
            ``checkpoints/`` folder) with nothing left to train (``trainer.max_steps`` not past its step,
            ``trainer.max_epochs`` not past its epochs, or stopped by a callback).
        RuntimeError: ``fit`` ended without an optimizer step although ``trainer.max_steps > 0``.
    """
    t_start = time.time()
    note = busy_cpu_note(on_gpu=torch.cuda.is_available() and cfg.trainer.get("accelerator") != "cpu")
    if note:
        log.warning(note)
    # the checks before training: a bad value (config, data path, checkpoint) is a ConfigError, printed without a
    # traceback (harness.config.config_errors)
    with config_errors():
        validate_config(cfg)
        # the one model config; spec errors, plugins, and a backend the layers lack, before anything is written
        model_cfg = model_config(cfg)
        variant = run_label(cfg, model_cfg)  # what the run trains, never only the yaml's name (attention_label)
        check_attention_backend(cfg.get("attention_backend", "auto"), list(model_cfg.layers))
        L.seed_everything(int(cfg.seed), workers=True)
        data_settings = resume_data_config(cfg.data, abs_path=_abs)  # kept in the checkpoints (RunState)
        # ckpt_path=last: the newest run on these data settings and this model (conf/train.yaml's run dir resolver
        # picks the same)
        links = data_links(cfg.data)  # data.seed follows seed: a resume error asks for seed=<v>
        ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), base_dir=_abs("."), data=data_settings, links=links,
                                      fits=lambda info: architecture_diff(info.hparams, model_cfg))
        resume = checkpoint_info(ckpt_path) if ckpt_path else None
        if resume is not None:  # other data.* than the checkpoint's: refused before any data work
            check_resume_data(ckpt_path, resume.data, data_settings, links)
        output_dir = str(cfg.paths.output_dir)
        run_dir = run_dir_of(ckpt_path)
        if run_dir is not None and os.path.abspath(run_dir) != os.path.abspath(output_dir):
            # a folder the command named (hydra.run.dir, a job folder): only Hydra's copy of the config and
            # train.log go there, which a resumed run's folder then lacks (.hydra/resume-<time>/)
            log.warning(f"ckpt_path: resuming {ckpt_path} in its run directory {run_dir}, not in {output_dir} (the "
                        f"folder this command named: hydra.run.dir, paths.output_dir or a multirun job's folder): "
                        f"checkpoints, CSV, W&B and final_metrics.json go to {run_dir}; Hydra's copy of this "
                        f"command's config and train.log stay in {output_dir}. To keep them with the run, resume it "
                        f"as a single run (no -m) naming neither hydra.run.dir nor paths.output_dir")
            cfg.paths.output_dir = output_dir = run_dir  # checkpoints, CSV, W&B of the resumed run go there
        Path(output_dir).mkdir(parents=True, exist_ok=True)

        dm = build_datamodule(cfg)
        dm.setup("fit")  # size errors (data.seq_len, ...) now, before anything is written
        check_batch_limits(cfg.trainer, dm)  # a limit_*_batches fraction that gives no batch of these data
        for note in layer_notes(cfg, model_cfg) + dense_mask_notes(model_cfg.layers, int(cfg.data.seq_len)):
            log.warning(note)
        if model_cfg.config.vocab_size != dm.vocab_size:
            raise ValueError(f"model.vocab_size={model_cfg.config.vocab_size} != data vocab_size={dm.vocab_size}")
        max_steps = int(cfg.trainer.get("max_steps") if cfg.trainer.get("max_steps") is not None else -1)
        max_epochs = int(cfg.trainer.get("max_epochs") if cfg.trainer.get("max_epochs") is not None else -1)
        # the LR schedule's length: this run's max_steps, or the resumed run's (kept across resumes and extensions)
        total_steps = (resume.total_steps if resume is not None and resume.total_steps else None) or \
            (max_steps if max_steps > 0 else None)
        # cfg.optim: the optimizer (hydra.utils.instantiate'd by LitLM, _partial_: true) + the LR schedule's keys
        optimizer, schedule = split_optim_config(OmegaConf.to_container(cfg.optim, resolve=True))
        lit = LitLM(
            model_cfg, backend=cfg.attention_backend, optimizer=optimizer, **schedule,
            bytes_per_token=dm.bytes_per_token, task=type(dm).__name__, compile=bool(cfg.get("compile", False)),
            total_steps=total_steps, doc_mask=bool(getattr(dm, "model_documents", False)),
        )
        start_step, complete, finished = 0, False, None
        if resume is not None:
            try:
                lit.check_checkpoint_hparams(resume.hparams)
            except ValueError as e:
                if str(cfg.get("ckpt_path")) != "last":
                    raise
                # ckpt_path=last chose the run by its data settings and model: say which run it picked and how to
                # pick another (its optimizer settings differ)
                why = str(e).removeprefix("ckpt_path: ")
                raise ValueError(f"ckpt_path=last picked {run_dir_of(ckpt_path) or ckpt_path} (the newest run on this "
                                 f"launch's data settings and model), which does not fit this launch: {why}; to resume another "
                                 f"run, pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt") from None
            start_step = resume.step
            # epochs: a checkpoint written before RunState kept them (None) is not known to have ended by epochs
            epochs_ended = max_epochs > 0 and resume.epochs is not None and resume.epochs >= max_epochs
            steps_ended = max_steps == resume.step
            complete = steps_ended or epochs_ended or resume.stopped  # its training ended: nothing left to train
            # only a run's own checkpoint, of a run without a (readable) final table (killed in its final validation), is
            # finalised
            finished = finished_run(run_dir) if run_dir is not None else None
            unfinished = run_dir is not None and finished is None
            past_epochs = max_epochs > 0 and resume.epochs is not None and resume.epochs > max_epochs
            if (complete and not unfinished) or 0 <= max_steps < resume.step or past_epochs:
                if resume.stopped and not 0 <= max_steps <= resume.step:
                    raise ValueError(
                        f"ckpt_path={ckpt_path}: that run was stopped at step {resume.step} by a callback "
                        f"(trainer.should_stop: EarlyStopping, ...) and leaves nothing to train; start a new run to "
                        f"train further")
                if epochs_ended and not 0 <= max_steps <= resume.step:
                    raise ValueError(
                        f"ckpt_path={ckpt_path}: that run already trained {resume.epochs} epoch(s) (step {resume.step}) "
                        f"and trainer.max_epochs={max_epochs} leaves nothing to train (max_epochs counts all epochs, "
                        f"not further ones); pass trainer.max_epochs > {resume.epochs} to extend it")
                raise ValueError(
                    f"ckpt_path={ckpt_path}: that run already reached step {resume.step} and "
                    f"trainer.max_steps={max_steps} leaves nothing to train (max_steps counts all steps, not further "
                    f"ones); pass trainer.max_steps > {resume.step} to extend it")
            if complete:
                log.info(f"ckpt_path: {ckpt_path} ended training at step {resume.step} but the run has no "
                         f"{FINAL_METRICS} (stopped in its final validation): no step is trained, it is validated and "
                         f"finalised")
    variant_tags = sorted(set(variant.split("+")))  # W&B tags / run name: each label once
    loggers = build_loggers(cfg, output_dir, variant_tags, resume_step=start_step if resume is not None else None)
    run_state = RunState(started_at=t_start, wall_s_before=resume.wall_s if resume is not None else 0.0,
                         train_metrics=resume.train_metrics if resume is not None else None, data=data_settings)
    # the Trainer is built (and its arguments checked by Lightning) before anything of an earlier run is moved or
    # this run's config written: a trainer.* value Lightning refuses leaves the folder as it was
    # extending a finished run whose last step was no in-fit validation step (max_steps not a multiple of
    # val_check_interval): its final validation ran after last.ckpt was written, so the checkpoint's curve lacks
    # that point and this launch does not measure it again; it is taken from the run's final_metrics.json
    extended = finished is not None and not complete and finished.get("steps") == resume.step
    curve = _Curve(earlier=[p for p in finished.get("curve") or [] if int(p[0]) == resume.step] if extended else None)
    trainer = build_trainer(cfg, loggers, output_dir, extra_callbacks=[run_state, curve])
    if resume is None:  # a new run in the folder of an earlier one (a reused run dir, a multirun job started over)
        subdir = _hydra_output_subdir()  # read before the earlier final table (which the subdir depends on) moves
        _keep_earlier_run_aside(output_dir, loggers)
        _rerun_config_to_hydra_dir(output_dir, subdir)
    write_run_config(output_dir, cfg)  # what skip_finished compares before it resumes this run's last.ckpt
    full_cfg = OmegaConf.to_container(cfg, resolve=True)
    for lg in loggers:
        lg.log_hyperparams({"config": full_cfg, "n_params": lit.gpt.num_params(), "variant": variant})

    try:
        try:
            trainer.fit(lit, datamodule=dm, ckpt_path=ckpt_path)
        except StopTraining as stop:  # stop_at: not finished
            return _stopped_unfinished(cfg, trainer, output_dir, max_steps, stop, start_step)
        if max_steps > 0 and trainer.global_step <= start_step and not complete:
            n_batches = trainer.num_training_batches  # inf: Lightning never set up the training loop
            batches = (f"{int(n_batches)} training batches per epoch" if math.isfinite(n_batches) else
                       "the training loop did not start")
            raise RuntimeError(
                f"training ran 0 optimizer steps (trainer.max_steps={max_steps}, {batches}); check data.seq_len, "
                f"data.batch_size and trainer.limit_train_batches")
        if (max_steps > 0 and trainer.global_step < max_steps and not complete and not trainer.fast_dev_run
                and not (max_epochs > 0 and trainer.current_epoch >= max_epochs)):
            # trainer.max_time, or a callback's trainer.should_stop: the run ends like a finished one, shorter
            log.warning(f"training stopped at step {trainer.global_step} of trainer.max_steps={max_steps} "
                        f"(trainer.max_time={cfg.trainer.get('max_time')}, or a callback that set "
                        f"trainer.should_stop, e.g. EarlyStopping): the final table and final_metrics.json are of "
                        f"step {trainer.global_step}")
        # the last logged train/* values, read before validate() resets the callback metrics (a launch that logged
        # none, complete or ended before its first logged step: the checkpoint's)
        last_train = run_state.last_train_metrics(trainer)
        if complete:  # fit trained nothing: the final validation logs at the last step, as after an uninterrupted
            # fit (a checkpoint written at a validation holds the logging step before the one its restore adds when
            # training goes on; the same Lightning loop counter ModelCheckpoint._save_last_as_of_the_last_batch sets)
            trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step
        # the fit validated this very model at its last step (trainer.max_steps a multiple of
        # trainer.val_check_interval; a resumed run: the checkpoint's curve says so): the final validation gives the
        # table its metrics but is not logged a second time (metrics.csv / W&B had it twice, at steps N-1 and N)
        lit.log_val_to_loggers = not (curve.points and curve.points[-1][0] == trainer.global_step)
        val = trainer.validate(lit, datamodule=dm, verbose=False)
    finally:
        _finish_wandb(loggers)
    metrics = {k: float(v) for k, v in (val[0] if val else {}).items()}
    # what the final validation measured without logging it (log_val_to_loggers false) is in the callback metrics
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    for k, v in last_train.items():
        metrics.setdefault(k, v)

    if trainer.is_global_zero:
        rows = {"variant": variant, "n_params": lit.gpt.num_params(),
                "steps": trainer.global_step}
        rows.update({k: metrics[k] for k in sorted(metrics)})
        base = baseline_of(dm, metrics)
        if base is not None:
            rows[f"baseline {base['metric']} ({base['what']})"] = base["value"]
        if getattr(dm, "chance_levels", None) is not None:
            rows["guess over all values val/acc"] = dm.chance_levels()["uniform"]
        rows["wall_s"] = round(run_state.elapsed(), 1)  # all launches of a resumed run
        print_table(table_title(cfg), rows)
        bad = _warn_if_diverged(cfg, metrics)  # before the verdict, whose next-step hint points at this warning
        _print_curve_and_verdict(curve.points, base, metrics, diverged=bad, steps=trainer.global_step)
        diverged = bool(bad)
        write_final_metrics(output_dir, {
            "diverged": diverged,  # a non-finite train/loss or val/loss: its metrics (null there) are of a broken model
            "job": _job_info(), "variant": rows["variant"], "n_params": rows["n_params"], "steps": rows["steps"],
            "metrics": metrics, "baseline": base, "curve": curve.points, "wall_s": rows["wall_s"],
            "output_dir": output_dir, "date": time.strftime("%Y-%m-%d"),  # the day the run ended (figure captions)
            "resumed_from": ckpt_path, "result_config": result_config(cfg),
            # the LR schedule that ran: a resumed run keeps the checkpoint's length (its first run's max_steps)
            # (warmup_steps: as it ran, capped at total_steps by cosine_with_warmup; result_config.optim has the setting)
            "lr_schedule": {"total_steps": lit.schedule_total_steps,
                            "warmup_steps": min(int(lit.hparams.warmup_steps), lit.schedule_total_steps or 1 << 62),
                            "min_lr_ratio": float(lit.hparams.min_lr_ratio)},
        })
        # the full folder on its own line (a plain line: a table or rich's 80-column wrapping of a log would cut it)
        _say(f"output_dir: {os.path.abspath(output_dir)}")
    return metrics


def baseline_of(dm, metrics: Dict[str, float]) -> Optional[Dict[str, object]]:
    """What the run's headline metric is compared with: ``{"metric", "value", "what", "higher_is_better"}``, or None.

    MQAR: ``val/acc`` (on the query positions) against ``1 / num_kv_pairs``, guessing among the example's values
    (every value is in its context; a model that has not learned recall gets there, not further). Text:
    ``val/bpb`` against the unigram model's bits per byte of the validation text (byte frequencies, no context)."""
    if getattr(dm, "chance_levels", None) is not None and "val/acc" in metrics:
        n = getattr(dm, "num_kv_pairs", None)
        return {"metric": "val/acc", "value": float(dm.chance_levels()["context"]), "higher_is_better": True,
                "what": f"guessing one of the example's {n} values" if n else "guessing"}
    if getattr(dm, "unigram_bits_per_byte", None) is not None and "val/bpb" in metrics:
        return {"metric": "val/bpb", "value": float(dm.unigram_bits_per_byte()), "higher_is_better": False,
                "what": "byte frequencies without context (unigram)"}
    return None


class _Curve(L.Callback):
    """The validation metrics by step (``points``: ``[step, {metric: value}]``), for the learning curve printed after
    the final table and stored in ``final_metrics.json``: the whole run's validations. The points are kept in the
    checkpoints (Lightning's callback state, :meth:`state_dict`), so a resumed run's curve starts with the earlier
    launches' points (up to the checkpoint's step; checkpoints written before it was kept: this launch's only)."""

    def __init__(self, earlier: Optional[List[list]] = None):
        self.points: List[list] = []
        # points a resumed run measured after its checkpoint was written (its final validation, from
        # final_metrics.json): merged into the checkpoint's points when Lightning restores them
        self._earlier = [[int(s), dict(v)] for s, v in (earlier or [])]

    def state_dict(self) -> Dict[str, object]:
        return {"points": [[int(s), dict(v)] for s, v in self.points]}

    def load_state_dict(self, state_dict: Dict[str, object]) -> None:
        self.points = [[int(s), dict(v)] for s, v in (state_dict.get("points") or [])]
        steps = {s for s, _ in self.points}
        self.points = sorted(self.points + [p for p in self._earlier if p[0] not in steps], key=lambda p: p[0])

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        vals = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if vals and (not self.points or self.points[-1][0] != trainer.global_step):
            self.points.append([int(trainer.global_step), vals])


_BARS = "▁▂▃▄▅▆▇█"


LEARNED_MARGIN = 0.1
"""How far past its baseline a run's headline metric must be to read "learned": a tenth of the baseline's value."""


def _print_curve_and_verdict(points: List[list], base: Optional[Dict[str, object]], metrics: Dict[str, float],
                             diverged: Sequence[str] = (), steps: Optional[int] = None) -> None:
    """A few lines after the final table: the headline metric by step (a sparkline scaled from the lowest to the
    highest of the values and the baseline, and the values), the result beside its baseline in words (``diverged``:
    the non-finite losses of a run that diverged, said first, whatever the metric; past the baseline by less than
    :data:`LEARNED_MARGIN` is "not learned yet" and says so), and what to try next, by verdict: after a divergence a
    lower learning rate; a run that did not learn a longer run (``steps``: this run's) or variants beside it; one
    that learned, the comparisons; commands this machine can run first, a GPU run last."""
    if base is None:
        return
    key = str(base["metric"])
    pts = [(s, v[key]) for s, v in points if key in v and math.isfinite(v[key])]
    if pts:
        # the scale takes in the baseline: a run that stays below it (0.04 -> 0.06 against 0.12) does not fill the
        # bars as if it learned; at least 5 % of the values' size as the full height: a flat curve stays flat
        b = float(base["value"])
        lo, hi = min([v for _, v in pts] + [b]), max([v for _, v in pts] + [b])
        span = max(hi - lo, 0.05 * max(abs(hi), abs(lo)))
        spark = "".join(_BARS[round((v - lo) / span * (len(_BARS) - 1)) if span > 0 else 0] for _, v in pts)
        shown = pts if len(pts) <= 8 else [pts[round(i * (len(pts) - 1) / 7)] for i in range(8)]
        _say(f"{key} by step: {spark}  " + "  ".join(f"{s}: {v:.2f}" for s, v in shown)
             + f"  (bars from {lo:.2f} to {lo + span:.2f}, the baseline {b:.2f} among them)")
    value = metrics.get(key)
    if diverged:  # a broken model: its metric (NaN or not) beside the baseline says nothing of learning
        shown = f"{value:.2f}" if value is not None and math.isfinite(value) else str(value)
        _say(f"diverged ({', '.join(f'{k}={metrics[k]}' for k in diverged)}): {key} {shown} vs "
             f"{base['value']:.2f} by {base['what']}")
        _say("next: the same run with a lower optim.lr or a longer optim.warmup_steps (the warning above)")
        return
    elif value is None or not math.isfinite(value):
        return
    else:
        better = value > base["value"] if base["higher_is_better"] else value < base["value"]
        margin = (value - base["value"]) if base["higher_is_better"] else (base["value"] - value)
        clearly = better and margin >= LEARNED_MARGIN * abs(float(base["value"]))
        verdict = "learned" if clearly else "not learned yet"
        why = ""
        if better and not clearly:
            why = (f" (past the baseline by {margin:.2f}, under the {LEARNED_MARGIN:.0%} of it "
                   f"({LEARNED_MARGIN * abs(float(base['value'])):.2f}) that 'learned' needs)")
        _say(f"{verdict}: {key} {value:.2f} vs {base['value']:.2f} by {base['what']}{why}")
    import importlib.util

    try:  # the interactive report where this checkout has it, else the committed tables and figures
        report = "eval.report" if importlib.util.find_spec("eval.report") is not None else "eval.figures"
    except (ImportError, ValueError):
        report = "eval.figures"
    recipe = ("the recall recipe (experiment=mqar_recall, README)" if key == "val/acc" else
              "a language-model recipe (experiment=lm_shakespeare or lm_wikitext, README)")
    if clearly:
        hints = ["variants compared (python train.py -m attention=flash,linear,sliding_window)", recipe,
                 f"the report (python -m {report})"]
    else:
        longer = f"trainer.max_steps={4 * steps}" if steps else "a larger trainer.max_steps"
        hints = [f"a longer run ({longer}; a resumed run continues: README)",
                 "variants compared beside it (python train.py -m attention=flash,linear,sliding_window)",
                 "why some variants cannot learn this task (README: More runs)"]
    if torch.cuda.is_available():  # what this machine can run first
        hints.insert(0, "a GPU run (python train.py trainer=gpu)")
    else:
        hints.append("on a CUDA machine, a GPU run (python train.py trainer=gpu)")
    _say("next: " + ", ".join(hints))


def _nonfinite_losses(metrics: Dict[str, float]) -> List[str]:
    """The final losses (``train/loss``, ``val/loss``) that are NaN / inf: a run that diverged."""
    return [k for k in ("train/loss", "val/loss") if k in metrics and not math.isfinite(metrics[k])]


def _warn_if_diverged(cfg: DictConfig, metrics: Dict[str, float]) -> List[str]:
    """A run whose final loss is NaN / inf trained a broken model (its table says nan, ``final_metrics.json`` null and
    ``"diverged": true``): say so in one warning naming the learning rate, instead of ending like a good run (the exit
    status stays 0: a learning-rate sweep records its diverged points). Returns the non-finite keys."""
    bad = _nonfinite_losses(metrics)
    if bad:
        log.warning(f"training diverged: {', '.join(f'{k}={metrics[k]}' for k in bad)} (not finite); the metrics "
                    f"above are of a broken model. Lower optim.lr (this run: {cfg.optim.get('lr')}) or raise "
                    f"optim.warmup_steps (this run: {cfg.optim.get('warmup_steps')})")
    return bad


def _keep_earlier_run_aside(output_dir: str, loggers: list) -> None:
    """A new run in the folder of an earlier one: the earlier run's final table must not mark this run finished, its
    checkpoints must not pass for this run's (``skip_finished`` resumes from ``checkpoints/last.ckpt``) and its
    metrics must not be overwritten, so each is moved aside (:func:`_move_aside`) with the same ``replaced-<time>``
    stamp: ``final_metrics.replaced-<time>.json``, ``checkpoints.replaced-<time>/`` (when it holds ``last.ckpt``)
    and the folder of each CSV logger's ``metrics.csv`` (``csv.replaced-<time>/``, with its ``hparams.yaml``).
    Call it before the loggers write (their first ``log_hyperparams``)."""
    from lightning.pytorch.loggers import CSVLogger

    stamp = time.strftime('%Y%m%d-%H%M%S')
    run = Path(output_dir)
    _move_aside(run / FINAL_METRICS, f"final_metrics.replaced-{stamp}.json")
    if (run / CKPT_DIR / "last.ckpt").is_file():
        _move_aside(run / CKPT_DIR, f"{CKPT_DIR}.replaced-{stamp}")
    for lg in loggers:
        csv_dir = Path(lg.log_dir) if isinstance(lg, CSVLogger) else None
        if csv_dir is not None and (csv_dir / "metrics.csv").is_file():
            if csv_dir.resolve() == run.resolve():  # metrics.csv in the run folder itself: that file only
                _move_aside(csv_dir / "metrics.csv", f"metrics.replaced-{stamp}.csv")
            else:
                _move_aside(csv_dir, f"{csv_dir.name}.replaced-{stamp}")


def _hydra_output_subdir() -> Optional[str]:
    """This job's ``hydra.output_subdir`` (where Hydra wrote its composed config), None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    sub = HydraConfig.get().output_subdir
    return None if sub is None else str(sub)


def _rerun_config_to_hydra_dir(output_dir: str, subdir: Optional[str]) -> None:
    """A ``skip_finished`` job that replaces the finished run in its folder (whose final table had no
    ``result_config``) had its composed config written to ``.hydra/rerun-<time>/`` (:data:`harness.runs.RERUN_SUBDIR`,
    so a skipped or refused job leaves the run's ``.hydra/`` as it was): it becomes this run's ``.hydra/*.yaml``, the
    earlier run's files moved aside (``config.replaced-<time>.yaml``, ...)."""
    from harness.runs import RERUN_SUBDIR

    if not str(subdir or "").startswith(RERUN_SUBDIR):
        return
    import shutil

    src, dst = Path(output_dir) / str(subdir), Path(output_dir) / ".hydra"
    stamp = time.strftime('%Y%m%d-%H%M%S')
    for f in sorted(src.glob("*.yaml")):
        _move_aside(dst / f.name, f"{f.stem}.replaced-{stamp}.yaml")
        shutil.copy2(f, dst / f.name)


def _move_aside(path: Path, new_name: str) -> None:
    """Rename ``path`` (a file or folder of an earlier run) to ``new_name`` beside it, saying so; nothing when it is
    not there (or another DDP rank moved it first)."""
    if not path.exists():
        return
    try:
        path.rename(path.with_name(new_name))
    except FileNotFoundError:  # another DDP rank moved it first
        return
    log.warning(f"{path} of an earlier run in this folder moved to {new_name}: this run starts over")


def _stopped_unfinished(cfg: DictConfig, trainer: L.Trainer, output_dir: str, max_steps: int, stop: StopTraining,
                        start_step: int) -> Dict[str, float]:
    """A run that ``stop_at`` stopped (:class:`StopTraining`) before ``trainer.max_steps``: no final validation and no
    ``final_metrics.json`` (it is not finished); says where its checkpoint is. Returns ``{}``."""
    if trainer.global_step <= start_step:
        log.warning(f"stop_at={cfg.stop_at}: the deadline had passed when training started; no step trained")
        return {}
    ckpt = Path(output_dir) / CKPT_DIR / "last.ckpt"
    if trainer.is_global_zero:
        if ckpt.is_file() and checkpoint_info(ckpt).step == trainer.global_step:
            from hydra.core.hydra_config import HydraConfig

            how = resume_hint(ckpt, max_steps, HydraConfig.get() if HydraConfig.initialized() else None)
        else:
            how = "no checkpoint of this step was written (callbacks.checkpoint is off): a re-run starts it over"
        print_table(f"{table_title(cfg)} (stopped at stop_at, unfinished)",
                    {"steps": f"{trainer.global_step} of {max_steps if max_steps > 0 else '?'}", "resume": how})
    return {}


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> Optional[float]:
    """The Hydra entry point: :func:`train` one job, after the checks of a resumable multirun.

    ``stop_at`` already passed: the job does not start (returns None) and its folder gets ``not_started.json``
    (:func:`harness.runs.mark_not_started`, removed when a later launch starts the job), which the multirun summary
    reports apart from stopped or failed jobs. ``skip_finished=true`` (and no
    ``ckpt_path``): a job whose folder holds a finished run of the same config is skipped (its stored metric is
    returned); an unfinished one resumes from its ``checkpoints/last.ckpt`` when that was written under the same
    config (:func:`harness.runs.resumable_checkpoint`), else it starts over (the log says why); a folder holding a
    finished run of another config is refused (:class:`harness.config.ConfigError`, printed as its message alone).

    A single run (no ``-m``) of a config that defines a sweep (``hydra.sweeper.params``, e.g.
    ``experiment=shakespeare_all``), or with ``skip_finished=true`` in a new run folder, starts with a warning saying
    what it does instead and how to get what was meant (:func:`harness.runs.single_run_notes`).
    """
    from hydra.core.hydra_config import HydraConfig

    mark_not_started(cfg.paths.output_dir, None)  # an earlier launch's mark: this launch starts the job (or fails)
    with config_errors():
        validate_config(cfg)
        if HydraConfig.initialized() and getattr(HydraConfig.get().mode, "name", "") == "MULTIRUN":
            why = repeated_sweep_value(HydraConfig.get().sweep.dir)  # a callback's error would only be a warning
            if why is not None:
                raise ValueError(why)
    # a sweep's config or skip_finished=true without -m: what the single run does instead (once: not in DDP children)
    if "LOCAL_RANK" not in os.environ:
        for note in single_run_notes(cfg, HydraConfig.get() if HydraConfig.initialized() else None):
            log.warning(note)
    stop_at = cfg.get("stop_at")
    # one process decides here (a DDP run's children, started by it, and peers of a launcher that set WORLD_SIZE go
    # on to StopAt.on_train_start, where all ranks decide together: no rank waits for one that left)
    alone = "LOCAL_RANK" not in os.environ and int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1
    if stop_at is not None and alone and time.time() >= float(stop_at):
        mode = HydraConfig.get().mode if HydraConfig.initialized() else None
        if getattr(mode, "name", str(mode)) == "RUN":  # a single run that does nothing must not exit 0
            with config_errors():
                raise ValueError(f"stop_at={stop_at}: that time passed {time.time() - float(stop_at):.0f} s ago, so "
                                 f"this run would not start; pass a later stop_at (e.g. stop_at=$(( $(date +%s) + "
                                 f"540 ))) or none")
        log.warning(f"stop_at={stop_at}: that time passed {time.time() - float(stop_at):.0f} s ago; "
                    f"{cfg.paths.output_dir} not started")
        mark_not_started(cfg.paths.output_dir, stop_at)
        return None
    if cfg.get("skip_finished", False) and cfg.get("ckpt_path") is None:
        with config_errors():  # a finished run of another config in the folder: refused, the message alone
            done = finished_run(cfg.paths.output_dir, cfg)
        if done is None and (Path(cfg.paths.output_dir) / FINAL_METRICS).is_file():
            log.warning(f"skip_finished: {cfg.paths.output_dir} holds a finished run whose config cannot be compared "
                        f"(its {FINAL_METRICS} has no result_config: an older train.py wrote it, or it is unreadable); "
                        f"it is not skipped and not refused: the job runs again, the earlier files kept aside")
        if done is not None:  # a resumable multirun: this job finished in an earlier launch of the same sweep dir
            log.info(f"skip_finished: {cfg.paths.output_dir} already finished ({done.get('steps')} steps); skipped")
            metrics = {k: float("nan") if v is None else float(v) for k, v in (done.get("metrics") or {}).items()}
            value = metrics.get(cfg.get("optimized_metric", "val/loss"))
            return None if value is None or math.isnan(value) else float(value)
        ckpt, why_not = resumable_checkpoint(cfg.paths.output_dir, cfg)
        if ckpt is not None:  # an unfinished run of this job (stopped at stop_at, interrupted): continue it
            log.info(f"skip_finished: resuming the unfinished run in {cfg.paths.output_dir} from {ckpt}")
            from omegaconf import open_dict

            with open_dict(cfg):
                cfg.ckpt_path = ckpt
        elif why_not:
            log.warning(f"skip_finished: {why_not}; the job starts over")
    metrics = train(cfg)
    if not metrics:  # stopped at stop_at, unfinished
        return None
    value = metrics.get(cfg.get("optimized_metric", "val/loss"))
    return None if value is None or math.isnan(value) else float(value)


def hydra_mode_conflict(argv: List[str]) -> Optional[str]:
    """The usage error for a command line that asks Hydra for two modes at once (``-m`` / ``--multirun`` with
    ``--cfg`` / ``-c``, ``--info``, ``--run`` / ``-r``, ...), which Hydra refuses with a traceback; ``None`` otherwise."""
    flags = {"-m": "--multirun", "--multirun": "--multirun", "-r": "--run", "--run": "--run", "-c": "--cfg",
             "--cfg": "--cfg", "-i": "--info", "--info": "--info", "--shell-completion": "--shell-completion",
             "-sc": "--shell-completion"}
    modes = sorted({flags[a.split("=", 1)[0]] for a in argv if a.split("=", 1)[0] in flags})
    if len(modes) < 2:
        return None
    return (f"train.py: {' and '.join(modes)} cannot be combined (Hydra runs one mode at a time); to see one job's "
            f"config: python train.py --cfg job <overrides>; to run a sweep: python train.py -m <overrides>")


if __name__ == "__main__":
    import sys

    if (conflict := hydra_mode_conflict(sys.argv[1:])) is not None:
        sys.exit(conflict)
    main()
