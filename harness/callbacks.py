"""Lightning and Hydra callbacks of ``train.py``.

* :class:`ModelCheckpoint`: Lightning's, plus ``last.ckpt`` at every validation, when a run is interrupted (Ctrl-C)
  and at the end of training, so that ``ckpt_path=<run dir>/checkpoints/last.ckpt`` resumes from the latest step.
* :class:`StepProgressBar`: the training bar counts optimizer steps up to ``trainer.max_steps`` (``step 120/1000``),
  not batches of an epoch against ``max_epochs`` (``Epoch 1/-2`` with ``max_epochs: null``).
* :class:`MultirunJobs`: a Hydra callback; job folders named after the swept overrides, and one table of every job's
  final metrics after a multirun.
* :class:`RecallByDistance`: MQAR accuracy of queries whose key lies inside / beyond a sliding window.
* :class:`StopAt`: stop training at a wall-clock time (``stop_at`` of ``train.py``), leaving a checkpoint to resume.
* :class:`RunState`: what a resumed run needs beyond Lightning's state (wall time so far, a callback's stop), kept in
  every checkpoint.
"""

from __future__ import annotations

import atexit
import csv
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import lightning as L
import torch
from hydra.experimental.callback import Callback as HydraCallback
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .runs import (FAILED, FINAL_METRICS, NOT_STARTED, RUN_CONFIG, RUN_STATE_KEY, claimed_run_dir, mark_failed,
                   read_sweep)

__all__ = ["ModelCheckpoint", "StepProgressBar", "MultirunJobs", "RecallByDistance", "mqar_key_distance", "StopAt",
           "StopTraining", "RunState", "epochs_trained"]


class ModelCheckpoint(L.pytorch.callbacks.ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` that also keeps ``last.ckpt`` (``save_last``) current at every validation
    (:meth:`on_validation_end`) and when training stops early.

    * Ctrl-C during ``fit`` (Lightning 2.6 catches the ``KeyboardInterrupt`` in ``_call_and_handle_interrupt``, calls
      every callback's ``on_exception``, then exits with status 1): ``last.ckpt`` is written at the step reached
      (nothing when no step was trained), so the run resumes with ``ckpt_path=.../last.ckpt``. Other exceptions
      keep Lightning's behaviour (``save_on_exception``, off by default): a crashed run does not overwrite a good
      ``last.ckpt`` with the state it crashed in.
    * End of training at a step without a checkpoint (``max_steps`` not a multiple of ``val_check_interval``):
      ``last.ckpt`` is written at the final step.

    ``enable_version_counter`` defaults to False: a resumed run writes into the same ``checkpoints/`` folder and
    must overwrite ``last.ckpt`` rather than start ``last-v1.ckpt``.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(*args, **kwargs)

    def on_exception(self, trainer: "L.Trainer", pl_module: "L.LightningModule", exception: BaseException) -> None:
        if not isinstance(exception, (KeyboardInterrupt, StopTraining)):
            return super().on_exception(trainer, pl_module, exception)
        if not self.save_last or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking \
                or trainer.global_step <= 0 or (isinstance(exception, StopTraining) and not exception.save):
            return
        self._save_last_as_of_the_last_batch(trainer)
        if isinstance(exception, StopTraining):
            return
        rank_zero_info(f"Interrupted at step {trainer.global_step}: saved {self.last_model_path}; resume with "
                       f"ckpt_path={self.last_model_path} (and trainer.max_steps > {trainer.global_step})")

    def _save_last_as_of_the_last_batch(self, trainer: "L.Trainer") -> None:
        """``last.ckpt`` of a run interrupted as a batch starts (or runs): saved as Lightning saves at the end of the
        last completed batch, so Lightning 2.6's restore continues on the uninterrupted schedule.

        The batch that was fetched but not trained is left out of the loop's progress (``ready`` / ``started`` back
        to ``completed``): kept, it moved every later validation one step early. The logging step count
        (``_batches_that_stepped``) is what the restore turns into the optimizer step: one less when that last batch
        ended with a scheduled validation (Lightning's restore then adds the step, as for its own checkpoints
        written at a validation), else the step itself."""
        loop = trainer.fit_loop.epoch_loop
        trackers = (loop.batch_progress.total, loop.batch_progress.current)
        kept = [(t.ready, t.started) for t in trackers] + [loop._batches_that_stepped]
        for t in trackers:
            if t.processed == t.completed:  # not inside a batch's end (Lightning restores that stage itself)
                t.ready = t.started = t.completed
        fetcher = trainer.fit_loop._data_fetcher
        after_val = fetcher is not None and loop._should_check_val_fx(fetcher)
        loop._batches_that_stepped = trainer.global_step - int(after_val and not loop._should_accumulate())
        try:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        finally:
            for t, (ready, started) in zip(trackers, kept):
                t.ready, t.started = ready, started
            loop._batches_that_stepped = kept[-1]

    def on_validation_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        """Lightning's, then ``last.ckpt`` at the step reached when Lightning saved nothing at this validation.

        Lightning 2.6 writes ``last.ckpt`` at a validation only when it saved a top-k checkpoint there: never with
        ``save_top_k=0``, and only on an improvement of ``monitor`` otherwise, so a run killed later would resume
        from an old step (or start over). Here it is current after every validation of training."""
        skip = self._should_skip_saving_checkpoint(trainer) or self._should_save_on_train_epoch_end(trainer)
        super().on_validation_end(trainer, pl_module)
        if not skip and self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        if self.save_last and trainer.global_step > 0 and self._last_global_step_saved != trainer.global_step \
                and not trainer.fast_dev_run:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            return
        super().on_train_end(trainer, pl_module)


def _clock() -> float:
    """Seconds since the epoch (:class:`StopAt`'s clock; a function of its own so tests can move time)."""
    return time.time()


class StopTraining(Exception):
    """Raised by :class:`StopAt` to end ``fit`` at a deadline: :class:`ModelCheckpoint` saves ``last.ckpt`` as on
    Ctrl-C (``save``: False when no step was trained in this run), ``train.py`` reports the run as unfinished."""

    def __init__(self, message: str, save: bool = True):
        super().__init__(message)
        self.save = bool(save)


class StopAt(L.Callback):
    """Stop training once the wall clock passes ``at`` (seconds since the epoch, e.g. ``$(date +%s)`` + a budget).

    Checked when training starts and then every ``every`` optimizer steps, as the next batch starts (all DDP ranks
    agree: ``reduce_boolean_decision``); past the deadline it raises :class:`StopTraining`, on every rank at once.
    :class:`ModelCheckpoint` then writes ``checkpoints/last.ckpt`` at the step reached, as on Ctrl-C, and ``fit``
    ends without another validation. ``train.py`` reports the run as unfinished (no ``final_metrics.json``) and
    ``skip_finished=true`` resumes it from that checkpoint. For time-limited machines: cut a sweep into calls that
    each end on time and lose no training.

    Raises ``ValueError`` naming ``stop_at`` when ``at`` is not a time in seconds since the epoch (a number >
    :data:`EPOCH_MIN`: a small number is a duration or a typo) or ``every`` is not a positive integer.
    """

    EPOCH_MIN = 1e9  # 2001-09-09

    def __init__(self, at: float, every: int = 10):
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(float(at)) \
                or float(at) < self.EPOCH_MIN:
            raise ValueError(f"stop_at={at!r}: must be null or a time in seconds since the epoch (> {self.EPOCH_MIN:.0e}"
                             f", e.g. stop_at=$(( $(date +%s) + 540 )): stop 9 minutes from now), not a duration")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"StopAt(every={every!r}): must be a positive integer (optimizer steps between checks)")
        self.at, self.every = float(at), int(every)
        self._start_step = 0

    def _check(self, trainer, save: bool) -> None:
        if trainer.strategy.reduce_boolean_decision(_clock() >= self.at, all=False):
            when = time.strftime('%H:%M:%S', time.localtime(self.at))
            rank_zero_info(f"stop_at: {when} reached at step {trainer.global_step}: training stops here")
            raise StopTraining(f"stop_at {when} reached at step {trainer.global_step}", save)

    def on_train_start(self, trainer, pl_module) -> None:
        """Past the deadline already (a DDP rank that started late, a slow setup): train no step."""
        self._start_step = int(trainer.global_step)
        self._check(trainer, save=False)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = int(trainer.global_step)
        if step > self._start_step and step % self.every == 0:
            self._check(trainer, save=True)


def epochs_trained(trainer) -> int:
    """The epochs of ``trainer``'s fit whose every training batch has trained: Lightning's processed epochs, plus the
    running one when its last batch has trained (a checkpoint written at the validation that ends an epoch, before
    Lightning counts the epoch). A batch that was fetched but not trained (a run stopped as it started) does not
    count; an epoch of unknown length (an iterable without ``len``) counts only once Lightning has processed it."""
    loop = trainer.fit_loop
    epochs = int(loop.epoch_progress.current.processed)
    if loop.epoch_progress.current.started > epochs \
            and loop.epoch_loop.batch_progress.current.completed >= trainer.num_training_batches:
        epochs += 1
    return epochs


class RunState(L.Callback):
    """``train.py``'s own state of a run, written into every checkpoint as ``checkpoint[RUN_STATE_KEY]``
    (:data:`harness.runs.RUN_STATE_KEY`, read back by :func:`harness.runs.checkpoint_info`):

    * ``wall_s``: seconds of wall time the run has taken up to this checkpoint, over all its launches:
      ``wall_s_before`` (what the checkpoint this launch resumed from stored; 0 for a new run) plus the seconds
      since this launch started (``started_at``, seconds since the epoch). Time after the checkpoint a launch
      resumed from (steps trained again after a kill) is not counted;
    * ``stopped``: a callback had ended training (``trainer.should_stop``: EarlyStopping, Lightning's Timer), so the
      run is complete before ``trainer.max_steps``. When such a checkpoint is resumed, ``trainer.should_stop`` is set
      again (:meth:`on_load_checkpoint`) and Lightning trains no further step (``fit`` resets it before restoring);
    * ``train_metrics``: the last logged ``train/*`` values over all launches (:meth:`last_train_metrics`:
      ``train/loss`` and the learning rates ``LearningRateMonitor`` logs as ``train/lr``, ``train/lr_no_decay``), for
      the final table of a resumed launch that logs none (one only validated and finalised, or an extension that
      ends before its first ``trainer.log_every_n_steps`` step);
    * ``epochs``: the epochs whose every training batch has trained (:func:`epochs_trained`), so a run that trained
      by ``trainer.max_epochs`` is recognised as complete when its checkpoint is resumed with the same value.
    * ``data``: the run's data settings (``data``, :func:`harness.runs.resume_data_config`), so a resume on other
      data is refused (:func:`harness.runs.check_resume_data`).
    """

    def __init__(self, started_at: float, wall_s_before: float = 0.0, train_metrics: Optional[Dict] = None,
                 data: Optional[Dict] = None):
        self.started_at, self.wall_s_before = float(started_at), float(wall_s_before)
        self.data = dict(data) if data is not None else None  # the data settings (harness.runs.resume_data_config)
        self.train_metrics_before = {k: float(v) for k, v in (train_metrics or {}).items()}  # the resumed checkpoint's

    def last_train_metrics(self, trainer) -> Dict[str, float]:
        """The last logged ``train/*`` values of the run, over all its launches: this launch's (``train/loss`` from
        ``trainer.callback_metrics``, the last learning rates a ``LearningRateMonitor`` logged under ``train/``),
        else the ones the checkpoint this launch resumed from stored (``train_metrics``). Read it before
        ``trainer.validate``, which resets the callback metrics."""
        from lightning.pytorch.callbacks import LearningRateMonitor

        out = dict(self.train_metrics_before)
        out.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
        for cb in trainer.callbacks:
            if isinstance(cb, LearningRateMonitor):
                out.update({k: float(v[-1]) for k, v in (getattr(cb, "lrs", None) or {}).items()
                            if k.startswith("train/") and v})
        return out

    def elapsed(self) -> float:
        """Seconds of wall time of the run so far, over all its launches."""
        return self.wall_s_before + (time.time() - self.started_at)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        checkpoint[RUN_STATE_KEY] = {
            "wall_s": self.elapsed(), "stopped": bool(trainer.should_stop), "epochs": epochs_trained(trainer),
            "train_metrics": self.last_train_metrics(trainer)}
        if self.data is not None:
            checkpoint[RUN_STATE_KEY]["data"] = self.data

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        if (checkpoint.get(RUN_STATE_KEY) or {}).get("stopped"):
            trainer.should_stop = True


class StepProgressBar(TQDMProgressBar):
    """TQDM bar of optimizer steps: ``epoch 1, step: 45%|...| 450/1000``; a resumed run starts at its step.

    Without ``trainer.max_steps`` (``-1``) the total is unknown and the bar counts up.
    """

    @staticmethod
    def _total(trainer) -> Optional[int]:
        return int(trainer.max_steps) if trainer.max_steps is not None and trainer.max_steps > 0 else None

    @staticmethod
    def _set_n(bar, n: int) -> None:
        if not bar.disable:
            bar.n = n
            bar.refresh()

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        bar, step = self.train_progress_bar, int(trainer.global_step)
        bar.reset(total=self._total(trainer))
        bar.initial = bar.n = bar.last_print_n = step  # the rate counts this run's steps only

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        if self._leave:  # one bar per epoch, as Lightning's with leave=True
            self.on_train_start(trainer, None)
        self.train_progress_bar.set_description(f"epoch {trainer.current_epoch}, step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar, n = self.train_progress_bar, int(trainer.global_step)
        if bar is not None and self._should_update(n, bar.total):
            self._set_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return "" if v is None else str(v)


def _error_of(path: Path, most: int = 300) -> str:
    """The ``error`` of a ``failed.json``, cut to ``most`` characters (one line)."""
    try:
        err = str(json.loads(path.read_text()).get("error", "?"))
    except (OSError, ValueError):
        return "(unreadable)"
    err = " ".join(err.split())
    return err if len(err) <= most else err[: most - 3] + "..."


def _names(names: List[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _new_folders(path: Path) -> List[Path]:
    """The folders of ``path`` and its parents that do not exist yet (a link counts as existing), ``path`` first: what
    a ``mkdir -p`` of it would make."""
    made = []
    for d in (path, *path.parents):
        if d.exists() or d.is_symlink():
            break
        made.append(d)
    return made


def _remove_refused_sweep(made: List[Path]) -> bool:
    """After a sweep Hydra refused before any job: remove the folders this launch made for it (``made``, from
    :func:`_new_folders` before Hydra made them; the sweep folder first) when the sweep folder holds nothing but
    Hydra's ``multirun.yaml``, and its new parents as far as they are empty. A folder that existed before the launch
    is never touched, nor one holding anything else, nor the working directory. Returns whether the sweep folder was
    removed."""
    try:
        if not made or sorted(p.name for p in made[0].iterdir()) != ["multirun.yaml"] \
                or made[0].resolve() == Path.cwd().resolve():
            return False
        (made[0] / "multirun.yaml").unlink()
        for d in made:  # the sweep folder, then the parents this launch made, while empty
            d.rmdir()
    except OSError:  # gone, unreadable, or not empty (written to meanwhile, a parent holding another sweep)
        pass
    return bool(made) and not made[0].exists()


class MultirunJobs(HydraCallback):
    """Hydra callback for ``python train.py -m ...``.

    * Job folders (not this callback's work): ``hydra.sweep.subdir`` (:func:`harness.runs.job_dirname`, given
      ``hydra.sweep.dir``) names each job's folder after its swept overrides only, e.g.
      ``attention=flash,optim.lr=0.001``, reading the swept keys from ``<sweep dir>/multirun.yaml``.
    * End: one table (rich) of every job's final metrics, read from the jobs' ``final_metrics.json`` (written by
      ``train.py``), also saved as ``<sweep dir>/summary.csv``. Jobs without one are listed, with their count, as
      not started (``stop_at`` had passed when the job came: ``not_started.json``,
      :func:`harness.runs.mark_not_started`), failed (the job raised: ``failed.json`` with the error, written at
      the job's end, :func:`harness.runs.mark_failed`) or unfinished (stopped at ``stop_at``, interrupted, or killed
      before Hydra could record a failure).
    * A job that fails in a folder holding a finished run (refused before it replaced that run, e.g.
      ``skip_finished=true`` under another config) is named as refused; that folder gets no ``failed.json``, its
      final table is left out of this launch's table and ``summary.csv`` is then left as it was.
    * A failed job: Hydra runs the other jobs of the sweep, then raises the first failure and exits with status 1
      without calling ``on_multirun_end``; the summary is then written at interpreter exit (the status stays 1).
      A sweep Hydra refuses before its first job (a bad option in a sweep list) gets one line saying no job ran,
      also in a sweep folder that holds an earlier launch's jobs.

    Args:
        columns: metric keys to show (default: ``steps``, every ``val/*`` metric, ``train/loss``, ``wall_s``).
        filename: the CSV written next to the jobs (None: none).
    """

    def __init__(self, columns: Optional[Sequence[str]] = None, filename: Optional[str] = "summary.csv"):
        self.columns = list(columns) if columns else None
        self.filename = filename

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        self._summarized = False
        self._started_at = time.time()  # a reused sweep folder may hold an earlier launch's jobs
        self._jobs_started = 0
        self._refused: List[Tuple[Path, str]] = []  # (job folder, error) of jobs refused in a finished run's folder
        sweep_dir = Path(str(config.hydra.sweep.dir))
        self._made = _new_folders(sweep_dir.absolute())  # before Hydra makes them: a refused sweep removes only these
        atexit.register(self._summary_at_exit, sweep_dir)  # Hydra skips on_multirun_end when a job failed

    def on_job_start(self, config, **kwargs: Any) -> None:
        # in this process: Hydra's basic launcher (joblib runs jobs, and this hook, in workers that saw no
        # on_multirun_start)
        self._jobs_started = getattr(self, "_jobs_started", 0) + 1

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        """Record a failed job's error in its folder (``failed.json``); a job that returned clears an earlier one."""
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        try:
            if config.hydra.mode != RunMode.MULTIRUN:  # the summary is the multirun's; a single run raises as is
                return
            run_dir = Path(str(config.hydra.runtime.output_dir))
        except Exception:  # noqa: BLE001 - a config without the hydra runtime node (direct calls): nothing to mark
            return

        failed = getattr(job_return, "status", None) == JobStatus.FAILED
        error = getattr(job_return, "_return_value", None) if failed else None
        if failed and not isinstance(error, BaseException):
            error = RuntimeError("the job failed (Hydra gave no exception)")
        if failed and (run_dir / FINAL_METRICS).is_file():
            # the folder holds a finished run that this job did not replace (refused before training, e.g.
            # skip_finished under another config): that run stays as it was, no failed.json beside its final table;
            # the summary names the job as refused
            self._refused = getattr(self, "_refused", []) + [(run_dir, f"{type(error).__name__}: {error}")]
            return
        mark_failed(run_dir, error)

    def _summary_at_exit(self, sweep_dir: Path) -> None:
        if getattr(self, "_summarized", True):
            return
        since = getattr(self, "_started_at", 0.0) - 1.0  # a launcher running jobs in other processes (joblib): a
        # job of this launch (re)wrote its folder's files
        started = getattr(self, "_jobs_started", 0) or any(
            p.stat().st_mtime >= since for pattern in ("*/.hydra/*.yaml", f"*/{FAILED}", f"*/{NOT_STARTED}",
                                                       f"*/{FINAL_METRICS}") for p in sweep_dir.glob(pattern))
        if not started:
            # no job of this launch started: Hydra's sweeper composes every job's config before launching any (a bad
            # option in a sweep list, -m attention=flash,flsh), and its error ends the command before the first job
            # (a reused sweep folder's earlier jobs are not this launch's)
            removed = _remove_refused_sweep(getattr(self, "_made", []))
            print(f"attn-zoo multirun: no job ran in {sweep_dir}: Hydra refused the sweep before its first job (the "
                  f"error above; exit status 1)" + ("; the folder it had made (only its multirun.yaml) is removed"
                                                    if removed else ""))
            return
        # this launch's jobs (their .hydra written now, in this process or a joblib worker) all finished now: then
        # Hydra's error is not a job's; anything else (a failed.json, a refused job, one without a fresh final table)
        # is a failed job
        fresh = lambda p: p.is_file() and p.stat().st_mtime >= since  # noqa: E731
        jobs = {p.parent.parent for p in sweep_dir.glob("*/.hydra/config.yaml") if fresh(p)}
        failed = (getattr(self, "_refused", []) or not jobs or any(fresh(p) for p in sweep_dir.glob(f"*/{FAILED}"))
                  or not all(fresh(d / FINAL_METRICS) for d in jobs))
        if failed:
            # Hydra's launchers run every job of the batch, then raise the first failure: the sweep was not cut short
            print(f"attn-zoo multirun: a job failed, so Hydra ends with its error after the sweep (exit status 1); "
                  f"what the jobs in {sweep_dir} wrote:")
        else:  # e.g. hydra.sweeper.max_batch_size: a later batch's config refused after earlier batches ran
            print(f"attn-zoo multirun: Hydra ended the sweep with the error above (exit status 1) after jobs had run, "
                  f"and none of them failed (a later batch it refused, for one); what the jobs in {sweep_dir} wrote:")
        self._summarize(sweep_dir)

    def _columns(self, records: List[Dict]) -> List[str]:
        if self.columns:
            return self.columns
        keys = set().union(*(r.get("metrics", {}) for r in records))
        return (["steps"] + sorted(k for k in keys if k.startswith("val/"))
                + [k for k in ("train/loss",) if k in keys] + ["wall_s"])

    def table_rows(self, sweep_dir, leave_out=()) -> Tuple[List[str], List[List[str]]]:
        """The summary's header and rows, one per ``final_metrics.json`` under ``sweep_dir`` but the job folders in
        ``leave_out`` (refused jobs: their final table is an earlier run's, not this sweep's result)."""
        skip = {Path(d).resolve() for d in leave_out}
        records = [r for r in read_sweep(sweep_dir) if (Path(sweep_dir) / r["dir"]).resolve() not in skip]
        cols = self._columns(records) if records else []
        diverged = any(r.get("diverged") for r in records)  # a column only when a job diverged
        rows = []
        for r in records:
            m = {k: float("nan") if v is None else v for k, v in (r.get("metrics") or {}).items()}  # null: NaN
            m.update({k: r[k] for k in ("steps", "wall_s") if k in r})
            rows.append([str(r.get("job", {}).get("num", "")), r["dir"], r.get("variant", "")]
                        + [_fmt(m.get(c)) for c in cols] + (["yes" if r.get("diverged") else ""] if diverged else []))
        return ["job", "overrides", "variant"] + cols + (["diverged"] if diverged else []), rows

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        self._summarize(Path(str(config.hydra.sweep.dir)))

    def _summarize(self, sweep_dir: Path) -> None:
        self._summarized = True
        refused = list(getattr(self, "_refused", []))
        header, rows = self.table_rows(sweep_dir, leave_out=[d for d, _ in refused])
        if refused:
            print(f"attn-zoo multirun: {len(refused)} job(s) in {sweep_dir} refused (each folder holds a finished run "
                  f"that this launch did not replace; it is left as it was and not shown as this sweep's result):")
            for d, err in refused:
                print(f"  {d.name}: {err if len(err) <= 300 else err[:299] + '…'}")
        title = f"attn-zoo multirun: {len(rows)} jobs in {sweep_dir}"
        jobs = {p.parent for pattern in ("*/.hydra", f"*/{NOT_STARTED}") for p in sweep_dir.glob(pattern)}
        pending = sorted((d for d in jobs if not (d / FINAL_METRICS).is_file()), key=lambda d: d.name)
        not_started = [d.name for d in pending if (d / NOT_STARTED).is_file()]
        failed = [d for d in pending if (d / FAILED).is_file() and not (d / NOT_STARTED).is_file()]
        unfinished = [d.name for d in pending if not (d / NOT_STARTED).is_file() and d not in failed]
        if not_started:
            print(f"attn-zoo multirun: {len(not_started)} job(s) in {sweep_dir} not started (stop_at had passed; the "
                  f"same command with a later stop_at, or none, runs them): {_names(not_started)}")
        if failed:
            print(f"attn-zoo multirun: {len(failed)} job(s) in {sweep_dir} failed (the error is in each folder's "
                  f"{FAILED} and log):")
            for d in failed:
                print(f"  {d.name}: {_error_of(d / FAILED)}")
        if unfinished:
            print(f"attn-zoo multirun: {len(unfinished)} job(s) in {sweep_dir} unfinished (no final_metrics.json: "
                  f"stopped at stop_at, interrupted or failed; with skip_finished=true the same command resumes them): "
                  f"{_names(unfinished)}")
        if not rows:
            print(f"{title} (no final_metrics.json found)" if not refused else
                  f"attn-zoo multirun: no job of this launch in {sweep_dir} has a result"
                  f"{' (' + self.filename + ' left as it was)' if self.filename else ''}")
            return
        if self.filename and refused:
            print(f"attn-zoo multirun: {self.filename} left as it was (job(s) refused; the table below leaves them out)")
        elif self.filename:
            with open(sweep_dir / self.filename, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(rows)
        try:
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            t = Table(title=escape(title))  # folder names hold "[...]" (model.layers=[a,b]): not rich markup
            for i, h in enumerate(header):
                t.add_column(escape(h), justify="right" if i >= 3 else "left", overflow="fold")
            for row in rows:
                t.add_row(*(escape(c) for c in row))
            console = Console()
            if not console.is_terminal:  # a log file: no 80-column wrapping
                console.width = max(console.width, 200)
            console.print(t)
        except ImportError:  # pragma: no cover
            print(title)
            print("\t".join(header))
            for row in rows:
                print("\t".join(row))


# ---------------------------------------------------------------------------------------------- MQAR recall
def mqar_key_distance(x, y, num_kv_pairs: int):
    """Distance from each MQAR query to its key: ``(mask, dist)``, both ``(B, N)``.

    ``x``: int64 ``(B, N)`` inputs, ``y``: int64 ``(B, N)`` targets (``-100`` off the query positions), as made by
    :func:`harness.data.generate_mqar` (keys at the even positions ``0, 2, .., 2 P - 2`` of the context). ``mask``
    is True at the query positions; ``dist[b, i] = i - j`` where ``j`` is the position of the key that the query at
    ``i`` repeats (0 off the query positions), so a sliding window of left size ``w`` shows the key to the query's
    own layer iff ``dist <= w``.
    """
    import torch

    mask = y != -100
    keys = x[:, 0:2 * num_kv_pairs:2]  # (B, P)
    match = x.unsqueeze(-1) == keys.unsqueeze(1)  # (B, N, P)
    key_pos = 2 * match.to(torch.int64).argmax(-1)  # (B, N)
    pos = torch.arange(x.shape[1], device=x.device).view(1, -1)
    dist = torch.where(mask, pos - key_pos, torch.zeros_like(key_pos))
    return mask, dist


class RecallByDistance(L.Callback):
    """MQAR accuracy split by how far each query is from its key (the window recall cliff).

    At every validation it logs ``val/acc_near`` (queries whose key is at most ``window`` positions back: inside
    the sliding window of the query's own layer) and ``val/acc_far`` (keys further back), each only when such
    queries exist, and ``val/frac_far`` (their share). ``window``: left window size in positions; ``None`` takes
    the smallest left window of the model's sliding-window layers (Based, Arora et al. 2024, section 6: a window
    recalls only what it sees).

    Raises ``ValueError`` when ``window`` is None and no layer has a window, or the data module is not MQAR
    (needs ``num_kv_pairs``).
    """

    def __init__(self, window: Optional[int] = None):
        ok = window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= 0)
        if not ok:
            raise ValueError(f"callbacks.recall.window must be an int >= 0 or null (the layers' left window), got "
                             f"{window!r}")
        self.window = window
        self._sums: Optional[list] = None
        self._checked = False

    def _resolve(self, trainer, pl_module) -> Tuple[int, int]:
        pairs = getattr(trainer.datamodule, "num_kv_pairs", None)
        if pairs is None:
            raise ValueError("RecallByDistance needs the MQAR data module (data=mqar: num_kv_pairs); got "
                             f"{type(trainer.datamodule).__name__}")
        specs = list(getattr(getattr(pl_module, "gpt", pl_module.model), "specs", []))
        dilated = [s for s in specs if int(getattr(s, "dilation", 1) or 1) > 1]
        lefts = [s.window_size[0] for s in specs
                 if getattr(s, "window_size", None) is not None and s.window_size[0] is not None]
        if self.window is not None:
            if not self._checked and lefts and self.window != min(lefts) and not dilated:
                rank_zero_info(f"RecallByDistance: callbacks.recall.window={self.window} differs from the layers' "
                               f"smallest left window {min(lefts)}: near / far split at {self.window}")
            self._checked = True
            return int(pairs), self.window
        if dilated:  # window_size counts keys spaced `dilation` apart: no single distance splits seen from unseen
            raise ValueError(f"RecallByDistance: a dilated window (dilation={dilated[0].dilation}) sees keys at a "
                             "stride, so its window_size is not a distance; pass callbacks.recall.window=<positions>")
        if not lefts:
            raise ValueError("RecallByDistance: window=null but no layer has a sliding window; pass "
                             "callbacks.recall.window=<left window size>")
        return int(pairs), int(min(lefts))

    def on_validation_epoch_start(self, trainer, pl_module):
        from torchmetrics.aggregation import SumMetric

        if self._sums is None:  # correct near, count near, correct far, count far; summed over DDP ranks at compute()
            self._sums = [SumMetric(nan_strategy="disable").set_dtype(torch.float64) for _ in range(4)]
        for m in self._sums:
            m.reset()
            m.to(pl_module.device)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        pairs, window = self._resolve(trainer, pl_module)
        x, y = batch[0], batch[1]
        with torch.no_grad():
            pred = pl_module.model(x).argmax(-1)  # (B, N)
        mask, dist = mqar_key_distance(x, y, pairs)
        ok = (pred == y) & mask
        far = mask & (dist > window)
        near = mask & ~far
        for m, v in zip(self._sums, (ok & near, near, ok & far, far)):
            m.update(v.sum())  # stays on the device: no host sync per batch

    def on_validation_epoch_end(self, trainer, pl_module):
        if not self._sums:
            return
        cn, n, cf, f = (float(m.compute()) for m in self._sums)
        metrics = {"val/frac_far": f / max(n + f, 1.0)}
        if n:
            metrics["val/acc_near"] = cn / n
        if f:
            metrics["val/acc_far"] = cf / f
        # train.py's final validation of a model the fit validated at that step: not logged twice
        pl_module.log_dict(metrics, sync_dist=False, logger=bool(getattr(pl_module, "log_val_to_loggers", True)))


class RemoveUnusedRunDir(HydraCallback):
    """Hydra callback for ``python train.py`` (a single run): a job that failed before it wrote anything of its own
    (a config refused by :func:`harness.config.validate_config`, a ``ckpt_path`` that resolves to nothing, a data
    file that is not there, ...) leaves no ``outputs/<date>/<time>/`` folder behind. Hydra makes that folder, its
    ``.hydra/`` and the job's log file before the job starts; the folder is removed when this launch created it
    (it did not exist as the run started, :meth:`on_run_start`) and it holds nothing else, and so are the folders
    above it that this launch created and that are left empty (``outputs/<date>/``). The job's error still ends the
    command, with a non-zero exit status. The folder the run dir resolver claimed for this launch
    (:func:`harness.runs.claim_run_dir`, made before the run starts) counts as created by it. A folder that was there
    before (``hydra.run.dir`` naming one of the user's, a resumed run's) or that holds anything the job wrote
    (``run_config.json``, ``csv/``, checkpoints, ...) is left as it is, and so is every job folder of a multirun (the
    multirun summary reads them, :class:`MultirunJobs`).

    A folder that was there before and that the job refused before it started (a refused resume: ``ckpt_path`` of
    another model, optimizer or data settings, ...; it writes ``run_config.json`` as it starts) gets back what this
    launch added: the config folder Hydra wrote for it (``.hydra/resume-<time>/``, or ``.hydra/``, when it was not
    there), and the lines it appended to the job's log file (``train.log``, cut back to its length at the
    start, removed when it was new)."""

    HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")

    def __init__(self) -> None:
        self._run: Optional[Path] = None      # the run folder hydra.run.dir names, when this launch creates it
        self._created: Optional[Path] = None  # the topmost folder of it that did not exist yet
        # a run folder that was there (a resume): (folder, its .hydra/ entries (None: no .hydra/), run_config.json's
        # mtime, the sizes of its log files)
        self._existing: Optional[Tuple[Path, Optional[set], Optional[int], Dict[str, int]]] = None

    def on_run_start(self, config, **kwargs: Any) -> None:
        self._run = self._created = self._existing = None
        try:
            run = Path(os.path.abspath(str(config.hydra.run.dir)))
        except Exception:  # noqa: BLE001 - an unresolvable run dir: Hydra reports it; nothing is removed
            return
        if run.exists():
            claimed = claimed_run_dir(run)  # made for this launch by the run dir resolver (conf/train.yaml)
            if claimed is not None:
                self._run, self._created = run, Path(claimed)
            elif run.is_dir():
                hydra_dir = run / ".hydra"
                entries = {p.name for p in hydra_dir.iterdir()} if hydra_dir.is_dir() else None
                logs = {p.name: p.stat().st_size for p in run.glob("*.log") if p.is_file()}
                self._existing = (run, entries, _mtime_ns(run / RUN_CONFIG), logs)
            return
        created = run
        while not created.parent.exists():
            created = created.parent
        self._run, self._created = run, created

    def on_job_start(self, config, **kwargs: Any) -> None:
        # in this process: Hydra's basic launcher (joblib runs jobs, and this hook, in workers that saw no
        # on_multirun_start)
        self._jobs_started = getattr(self, "_jobs_started", 0) + 1

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        import shutil

        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        if job_return.status != JobStatus.FAILED or config.hydra.mode != RunMode.RUN:
            return
        if self._existing is not None:
            self._undo_in_existing(config)
            return
        if self._run is None:
            return
        run = Path(os.path.abspath(str(config.hydra.runtime.output_dir)))
        if run != self._run or not run.is_dir():
            return
        log_file = f"{config.hydra.job.name}.log"
        hydra_dir = run / ".hydra"
        if any(p.name not in (".hydra", log_file) or p.is_symlink() for p in run.iterdir()):
            return
        if hydra_dir.exists() and any(p.name not in self.HYDRA_FILES for p in hydra_dir.iterdir()):
            return
        shutil.rmtree(run, ignore_errors=True)
        if self._created == run:
            return
        folder = run.parent  # outputs/<date>/ (and outputs/) that Hydra made for it, when left empty
        while True:
            try:
                folder.rmdir()  # only an empty folder
            except OSError:
                break
            if folder == self._created:
                break
            folder = folder.parent

    def _undo_in_existing(self, config) -> None:
        """A failed job in a run folder that was there: when it did not start (``run_config.json`` as it was), remove
        the ``hydra.output_subdir`` Hydra made for it and cut its log file back (see the class docstring)."""
        import shutil

        run, entries, run_config_mtime, logs = self._existing
        if Path(os.path.abspath(str(config.hydra.runtime.output_dir))) != run:
            return
        if _mtime_ns(run / RUN_CONFIG) != run_config_mtime:  # the job started (a resume that failed later)
            return
        try:
            subdir = config.hydra.output_subdir
        except Exception:  # noqa: BLE001 - an unresolvable subdir: nothing of it to remove
            subdir = None
        if subdir is not None:
            sub = Path(os.path.abspath(run / str(subdir)))
            hydra_dir = run / ".hydra"
            new = entries is None if sub == hydra_dir else (
                sub.parent == hydra_dir and (entries is None or sub.name not in entries))
            if new and sub.is_dir() and all(p.name in self.HYDRA_FILES for p in sub.iterdir()):
                shutil.rmtree(sub, ignore_errors=True)
                if entries is None:  # .hydra/ itself was made for it
                    try:
                        hydra_dir.rmdir()
                    except OSError:
                        pass
        log_file = run / f"{config.hydra.job.name}.log"
        if log_file.is_file() and not log_file.is_symlink():
            before = logs.get(log_file.name)
            if before is None:
                log_file.unlink(missing_ok=True)
            elif log_file.stat().st_size > before:
                os.truncate(log_file, before)


def _mtime_ns(path: Path) -> Optional[int]:
    """``path``'s modification time in ns, None when it is not there."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None
