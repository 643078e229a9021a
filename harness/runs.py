"""Run directories of ``train.py``: where a run writes, how a checkpoint resumes it, how a multirun names and
summarises its jobs.

A new single run writes to ``outputs/<date>/<time>/``, a folder of its own: the run dir resolver claims it with an
atomic ``mkdir`` (:func:`claim_run_dir`), so a launch started in the same second as another gets ``<time>-1/``
(``-2``, ...). A launch refused before training removes it (:class:`harness.callbacks.RemoveUnusedRunDir`).

Resume semantics (``ckpt_path=<run dir>/checkpoints/last.ckpt`` or ``ckpt_path=last``)
    * the run continues in the checkpoint's run directory (the folder above ``checkpoints/``): Hydra's run dir
      is that folder (resolver ``attn_zoo.run_dir`` in ``conf/train.yaml``), the resumed run's composed config
      goes to ``.hydra/resume-<time>/`` (the original ``.hydra/`` stays), ``csv/metrics.csv`` is continued
      (:class:`ContinuedCSVLogger`: rows of steps the checkpoint had not reached are dropped, new rows appended),
      checkpoints are written next to the old ones and the W&B run id stored in the run dir is reused;
    * ``trainer.max_steps`` is the total step count, not the number of further steps; it must be larger than the
      checkpoint's step, else ``ValueError`` (``pass trainer.max_steps > N to extend``);
    * the LR schedule is the original run's (``LitLM`` keeps ``total_steps`` in the checkpoint hparams): steps past
      its end run at ``lr * min_lr_ratio``, the cosine is not stretched again;
    * the optimizer is the checkpoint's (state and hyperparameters): an ``optim.*`` value (``lr``, ``betas``,
      ``weight_decay``, ``_target_``, ``warmup_steps``, ``min_lr_ratio``, ...) that differs from the checkpoint's
      hparams is refused (``ValueError: ckpt_path: ...``, :meth:`harness.lit.LitLM.check_checkpoint_hparams`), so
      ``final_metrics.json``'s ``result_config`` records what ran;
    * ``ckpt_path=last``: the most recently written ``outputs/*/*/checkpoints/last.ckpt`` under the launch
      directory whose run was trained on this launch's data settings and model (:func:`find_last_checkpoint`; none:
      an error naming the newest run, its ``data`` group and its data overrides, or, runs on these data settings but
      of another model, the newest of them, how it differs and its model overrides). A checkpoint outside a ``checkpoints/``
      folder starts a new run directory.

Resumable multiruns (``skip_finished=true``, a fixed ``hydra.sweep.dir``): re-running the command skips each job
whose folder holds a finished run of the same config (:func:`finished_run`) and resumes each unfinished one from its
``checkpoints/last.ckpt`` when that checkpoint was written under the same config (:func:`resumable_checkpoint`,
which reads ``run_config.json``; a checkpoint whose training had ended is only validated and finalised); other jobs
start over (the earlier run's checkpoints, ``csv/`` and final table kept aside as ``*.replaced-<time>``).
``stop_at`` (a wall-clock deadline) stops the running jobs with a checkpoint and starts no new ones, so a sweep can
be cut into time-limited calls. ``final_metrics.json``'s ``wall_s`` of a resumed run is the total over its launches
(the checkpoints carry the time so far, :class:`harness.callbacks.RunState`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

__all__ = ["RUNS_ROOT", "CKPT_DIR", "FINAL_METRICS", "find_last_checkpoint", "resolve_ckpt_path", "run_dir_of",
           "CheckpointInfo", "checkpoint_info", "job_dirname", "swept_keys", "sweep_swept_keys", "MULTIRUN_CONFIG", "write_final_metrics", "read_sweep",
           "ContinuedCSVLogger", "register_resolvers", "finished_run", "result_config", "RUN_CONFIG",
           "write_run_config", "resumable_checkpoint", "RUN_STATE_KEY", "NOT_STARTED", "mark_not_started",
           "FAILED", "mark_failed", "model_fits", "claim_run_dir", "claimed_run_dir", "single_run_notes", "resume_hint", "RERUN_SUBDIR", "RESUME_FREE_DATA_KEYS", "resume_data_config", "check_resume_data"]

RUNS_ROOT = "outputs"          # hydra.run.dir is outputs/<date>/<time>
CKPT_DIR = "checkpoints"
FINAL_METRICS = "final_metrics.json"
RUN_CONFIG = "run_config.json"   # the result_config a run trains under, written when it starts (auto-resume checks it)
RUN_STATE_KEY = "attn_zoo_run"   # checkpoint key of train.py's own resume state (harness.callbacks.RunState)
NOT_STARTED = "not_started.json"  # a job folder whose job stop_at kept from starting in the latest launch
FAILED = "failed.json"            # a job folder whose job raised in the latest launch (the error, for the summary)


# ---------------------------------------------------------------------------------------------- resume
def find_last_checkpoint(root=RUNS_ROOT, data: Optional[Dict] = None, links: Optional[Dict[str, str]] = None,
                         fits: Optional[Callable[["CheckpointInfo"], Optional[str]]] = None) -> Optional[Path]:
    """The most recently written ``<root>/*/*/checkpoints/last.ckpt`` (None: there is none).

    ``data`` (this launch's :func:`resume_data_config`): the most recent one whose checkpoint was trained on these
    data settings (:func:`check_resume_data` accepts it; a checkpoint that did not record them, or cannot be read,
    counts: the resume says what is wrong with it), so ``ckpt_path=last`` does not pick a run of another task.
    ``fits`` (with ``data``): of those, the most recent one for which ``fits(checkpoint_info(ckpt))`` is None (the
    launch's model: :func:`harness.lit.architecture_diff`), so a launch with ``attention=linear`` resumes the latest
    linear run, not a newer one of another attention. ``links``: :func:`data_links` of the launch (the error names
    ``seed=1``, not ``data.seed=1``).

    Raises:
        ValueError: ``data`` given, runs found, none of them on these data settings: names the newest run, the data
            it was trained with (its ``data`` group, or the differing keys) and how to resume it or pick a run.
            With ``fits``: runs on these data settings, none that fits: names the newest of them, how it differs
            (``fits``'s message) and the overrides it was launched with.
    """
    found = sorted((p for p in Path(root).glob(f"*/*/{CKPT_DIR}/last.ckpt") if p.is_file()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if data is None or not found:
        return found[0] if found else None
    on_data: List[Tuple[Path, str]] = []  # runs on these data settings that do not fit: (checkpoint, why)
    for ckpt in found:
        try:
            info = checkpoint_info(ckpt)
        except ValueError:
            return ckpt
        if info.data is not None and _data_diff(info.data, data):
            continue
        why = fits(info) if fits is not None else None
        if why is None:
            return ckpt
        on_data.append((ckpt, why))
    if on_data:
        raise ValueError(_no_fitting_run(on_data, len(found)))
    raise ValueError(_no_compatible_run(found, data, links))


def _no_fitting_run(on_data: List[Tuple[Path, str]], n_found: int) -> str:
    ckpt, why = on_data[0]
    run = ckpt.parent.parent
    overrides = _overrides_of(run, lambda k: k.split(".")[0] in ("attention", "model", "experiment"))
    how = (f"launch with its model overrides ({' '.join(overrides)})" if overrides else
           "launch without model / attention overrides (it had none)")
    return (f"ckpt_path=last: {len(on_data)} of the {n_found} run(s) under {run.parent.parent} were trained on this "
            f"launch's data settings, and none with this launch's model; the newest of them, {run}: {why}. To resume "
            f"it, {how}; to resume another run, pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt")


def _at(c, key: str):
    """The value at dotted ``key`` of nested dicts ``c`` (None: missing)."""
    for part in key.split("."):
        c = c.get(part) if isinstance(c, dict) else None
    return c


def _data_diff(stored: Dict, current: Dict) -> List[str]:
    """The ``data.*`` keys (without the prefix) in which two :func:`resume_data_config` differ."""
    return _diff_keys(_normalised_paths(stored), _normalised_paths(current))


def _data_group_of(data: Dict) -> str:
    """``data=<name>`` of the ``conf/data/<name>.yaml`` whose ``_target_`` is ``data``'s, else its ``_target_``."""
    import yaml

    target = data.get("_target_")
    for f in sorted((Path(__file__).resolve().parents[1] / "conf" / "data").glob("*.yaml")):
        try:
            if (yaml.safe_load(f.read_text()) or {}).get("_target_") == target:
                return f"data={f.stem}"
        except (OSError, yaml.YAMLError):
            continue
    return f"data._target_={target}"


def _overrides_of(run_dir: Path, only=None) -> List[str]:
    """The command-line overrides of a run's first launch (``.hydra/overrides.yaml``), those for which
    ``only(key)`` holds when given (key: the override's left-hand side without ``+`` / ``~``); [] when unreadable."""
    import yaml

    try:
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        return []
    keys = lambda o: str(o).lstrip("+~").split("=", 1)[0]  # noqa: E731
    return [str(o) for o in overrides if only is None or only(keys(o))]


def _data_overrides_of(run_dir: Path) -> List[str]:
    """The overrides of a run's first launch that set its data: ``data=``, ``data.*`` and ``experiment=`` (an
    experiment picks its data)."""
    return _overrides_of(run_dir, lambda k: k in ("data", "experiment") or k.startswith("data."))


def _no_compatible_run(found: List[Path], data: Dict, links: Optional[Dict[str, str]] = None) -> str:
    newest = found[0]
    run = newest.parent.parent
    stored = checkpoint_info(newest).data or {}
    if stored.get("_target_") != data.get("_target_"):
        what = f"was trained with {_data_group_of(stored)}, this launch has {_data_group_of(data)}"
        overrides = _data_overrides_of(run) or [_data_group_of(stored)]
        how = f"add its data overrides ({' '.join(overrides)})"
    else:
        diff = _data_diff(stored, data)
        what = f"was trained on other data settings (differs in {_shown(['data.' + k for k in diff])})"
        values = _resume_overrides(stored, diff, links)
        how = f"pass its values ({_shown(values, 4).replace(', ', ' ')})"
    return (f"ckpt_path=last: the newest run, {run}, {what}, and none of the {len(found)} run(s) under "
            f"{run.parent.parent} was trained on this launch's data settings. To resume it, {how}; to resume "
            f"another run, pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt")


def resolve_ckpt_path(ckpt_path, base_dir=None, data: Optional[Dict] = None,
                      links: Optional[Dict[str, str]] = None,
                      fits: Optional[Callable[["CheckpointInfo"], Optional[str]]] = None) -> Optional[str]:
    """``ckpt_path`` as an absolute path (relative paths and ``last`` against ``base_dir``, default the cwd).
    ``last``: :func:`find_last_checkpoint` under ``<base_dir>/outputs``, with ``data`` (this launch's
    :func:`resume_data_config`) the newest run on the same data settings, with ``fits`` as well the newest of those
    that fits the launch's model.

    Raises:
        FileNotFoundError: naming ``ckpt_path``: the file does not exist, or ``last`` finds no run.
        ValueError: ``last`` with ``data``: no run on these data settings, or (``fits``) none of them fits
            (:func:`find_last_checkpoint`).
    """
    if ckpt_path is None or str(ckpt_path) == "":
        return None
    base = Path(base_dir or os.getcwd())
    if str(ckpt_path) == "last":
        found = find_last_checkpoint(base / RUNS_ROOT, data, links, fits)
        if found is None:
            raise FileNotFoundError(
                f"ckpt_path=last: no run under {base / RUNS_ROOT} has {CKPT_DIR}/last.ckpt; "
                f"pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt")
        return os.path.abspath(found)
    path = Path(str(ckpt_path))
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise FileNotFoundError(
            f"ckpt_path={str(ckpt_path)!r} does not exist or is not a file (absolute: {os.path.abspath(path)}); "
            f"pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt or ckpt_path=last")
    return os.path.abspath(path)


def run_dir_of(ckpt_path) -> Optional[str]:
    """The run directory a checkpoint belongs to (the folder above ``checkpoints/``), else None."""
    if not ckpt_path:
        return None
    p = Path(os.path.abspath(str(ckpt_path)))
    return str(p.parent.parent) if p.parent.name == CKPT_DIR else None


@dataclass
class CheckpointInfo:
    path: str
    step: int                       # optimizer steps the checkpoint has trained (trainer.global_step)
    total_steps: Optional[int]      # length of its LR schedule (LitLM hparams), None for old checkpoints
    hparams: Dict = field(default_factory=dict)
    # train.py's resume state (harness.callbacks.RunState; checkpoints written before it: 0.0 / False / {})
    wall_s: float = 0.0             # seconds of wall time the run had taken when it was written, over all launches
    stopped: bool = False           # a callback had ended training (trainer.should_stop: EarlyStopping, ...)
    train_metrics: Dict = field(default_factory=dict)   # the last logged train/* values
    epochs: Optional[int] = None    # epochs whose every batch had trained (None: written before RunState kept it)
    data: Optional[Dict] = None     # the data settings it trained on (:func:`resume_data_config`; None: written before)


def checkpoint_info(path) -> CheckpointInfo:
    """Step, schedule length, hparams and resume state (:data:`RUN_STATE_KEY`) of a Lightning checkpoint
    (memory-mapped, weights not read).

    Raises:
        ValueError: naming ``ckpt_path``: the file is not a checkpoint ``torch.load`` can read, or not a Lightning
            checkpoint (no ``state_dict`` / ``global_step``).
    """
    import torch

    hint = f"pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt or ckpt_path=last"
    try:
        ck = torch.load(str(path), map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file (JSON, text, truncated, old format)
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        raise ValueError(f"ckpt_path={str(path)!r} is not a checkpoint torch.load can read ({type(e).__name__}: "
                         f"{msg}); {hint}") from e
    if not isinstance(ck, dict) or "state_dict" not in ck or "global_step" not in ck:
        raise ValueError(f"ckpt_path={str(path)!r} is not a Lightning checkpoint of train.py (no state_dict / "
                         f"global_step); {hint}")
    hp = dict(ck.get("hyper_parameters") or {})
    total = hp.get("total_steps")
    state = ck.get(RUN_STATE_KEY) or {}
    return CheckpointInfo(str(path), int(ck.get("global_step", 0)), int(total) if total else None, hp,
                          wall_s=float(state.get("wall_s", 0.0)), stopped=bool(state.get("stopped", False)),
                          train_metrics={k: float(v) for k, v in (state.get("train_metrics") or {}).items()},
                          epochs=int(state["epochs"]) if state.get("epochs") is not None else None,
                          data=dict(state["data"]) if isinstance(state.get("data"), dict) else None)


def _launch_data(root) -> Optional[Dict]:
    """The launch's :func:`resume_data_config` from the whole config ``root`` (a resolver's ``_root_``), paths made
    absolute against the launch directory (the cwd while Hydra composes); None when it cannot be read."""
    try:
        return resume_data_config(root.data, abs_path=os.path.abspath) if root is not None and "data" in root else None
    except Exception:  # noqa: BLE001 - a config error: train.py reports it; here only the run dir is chosen
        return None


def model_fits(cfg) -> Optional[Callable[[CheckpointInfo], Optional[str]]]:
    """``fits`` of :func:`find_last_checkpoint` for the train config ``cfg``: how a checkpoint's architecture differs
    from the model ``cfg`` builds (:func:`harness.lit.architecture_diff`; None: it fits). None when ``cfg`` builds no
    model (a config error: ``train.py`` reports it)."""
    from .config import model_config
    from .lit import architecture_diff

    try:
        built = model_config(cfg)
    except Exception:  # noqa: BLE001 - a config error: train.py reports it; here only a run is chosen
        return None
    return lambda info: architecture_diff(info.hparams, built)


_CLAIMED: Dict[str, Tuple[str, str]] = {}
"""The run folders this process claimed (:func:`claim_run_dir`): absolute ``default`` -> (the folder as returned,
the topmost folder the claim created: the run folder itself, or ``outputs/<date>/`` when that was new)."""


def claim_run_dir(default: str) -> str:
    """A new run folder for ``default`` (``outputs/<date>/<time>``) that no other launch uses: ``default`` when this
    call creates it, else the first of ``<default>-1``, ``<default>-2``, ... that it creates. ``os.mkdir`` is atomic,
    so two launches started in the same second get a folder each (the folders above are made as needed).

    Memoised per process and ``default``: Hydra resolves ``hydra.run.dir`` more than once in a launch (its ``now``
    is fixed for the launch) and each time gets the folder of the first call. Returned as ``default`` is spelled
    (relative to the cwd when ``default`` is). :func:`claimed_run_dir` says whether a folder was claimed here.

    Raises:
        OSError: the folder cannot be created (no permission, a file in the way, ...).
    """
    default = str(default).rstrip("/\\") or str(default)
    key = os.path.abspath(default)
    if key in _CLAIMED:
        return _CLAIMED[key][0]
    top, p = None, Path(key).parent
    while not p.exists():  # the topmost missing folder above the run folder (outputs/<date>/ of a new day)
        top, p = p, p.parent
    Path(key).parent.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        name = default if n == 0 else f"{default}-{n}"
        try:
            os.mkdir(name)
            break
        except FileExistsError:  # another launch (or an earlier run) has it
            n += 1
    _CLAIMED[key] = (name, str(top) if top is not None else os.path.abspath(name))
    return name


def claimed_run_dir(run_dir) -> Optional[str]:
    """The topmost folder that :func:`claim_run_dir` created for ``run_dir`` in this process (the run folder, or a
    folder above it that was new), None when ``run_dir`` was not claimed here."""
    path = os.path.abspath(str(run_dir))
    for name, top in _CLAIMED.values():
        if os.path.abspath(name) == path:
            return top
    return None


def _run_dir_resolver(ckpt_path, default, *, _root_=None):
    """``hydra.run.dir``: the run folder of ``ckpt_path`` (``last``: of the newest run on this launch's data
    settings that fits its model, as ``train.py`` resolves it), else ``default``.

    A single run that Hydra is running (``hydra.mode`` RUN in ``_root_``) gets a new folder of its own for
    ``default``, :func:`claim_run_dir` (``outputs/<date>/<time>``, ``<time>-1``, ...: launches started in the same
    second do not share one); otherwise (a resume, no ``_root_``, a config only composed) the name is returned and
    nothing is created."""
    try:
        fits = model_fits(_root_) if str(ckpt_path) == "last" and _root_ is not None else None
        ckpt = resolve_ckpt_path(ckpt_path, data=_launch_data(_root_), fits=fits)
    except (FileNotFoundError, ValueError):  # train.py raises the error naming ckpt_path; Hydra only needs a dir
        ckpt = None
    run_dir = run_dir_of(ckpt)
    if run_dir is not None or default is None:
        return run_dir or default
    return claim_run_dir(default) if _single_run(_root_) else default


def _single_run(root) -> bool:
    """Whether ``root`` (a resolver's ``_root_``) is the config of a single run Hydra is running (``hydra.mode``
    RUN; a config composed by ``hydra.compose`` has none)."""
    from omegaconf import OmegaConf

    try:
        mode = OmegaConf.select(root, "hydra.mode", default=None) if root is not None else None
    except Exception:  # noqa: BLE001 - a config without a readable hydra node
        return False
    return getattr(mode, "name", str(mode)) == "RUN"


def single_run_notes(cfg, hydra_cfg) -> List[str]:
    """Warnings for a single run (``hydra_cfg.mode`` RUN, no ``-m``) of settings that act only in a multirun; []
    otherwise. ``hydra_cfg``: the ``hydra`` node of the launch (``HydraConfig.get()``), ``cfg``: the job's config.

    * a config that defines a sweep (``hydra.sweeper.params``, e.g. ``experiment=shakespeare_all``): Hydra runs
      one job with the config's own values (not one of the sweep's jobs); the note names the sweep, the values this
      job has and says to add ``-m``;
    * ``skip_finished=true`` in a new run folder (:func:`claim_run_dir`): it makes a multirun resumable (finished
      jobs skipped, unfinished ones resumed, in the same ``hydra.sweep.dir``); a new folder holds nothing to skip or
      resume, so the run starts from step 0; the note says so and how a single run is resumed (``ckpt_path``). Not
      repeated when the sweep note is given (an experiment's ``skip_finished``)."""
    from omegaconf import OmegaConf

    if hydra_cfg is None or getattr(hydra_cfg.mode, "name", str(hydra_cfg.mode)) != "RUN":
        return []
    notes = []
    params = OmegaConf.select(hydra_cfg, "sweeper.params", default=None)
    params = {str(k): str(v) for k, v in (params.items() if params else [])}
    if params:
        choices = OmegaConf.select(hydra_cfg, "runtime.choices", default=None) or {}
        experiment = choices.get("experiment")
        where = f"experiment={experiment}" if experiment else "the config"
        values = " ".join(f"{k}={choices[k] if k in choices else OmegaConf.select(cfg, k, default=None)}"
                          for k in params)
        jobs = _sweep_jobs(params)
        notes.append(f"{where} defines a sweep (hydra.sweeper.params: {'; '.join(f'{k}={v}' for k, v in params.items())}"
                     f"{f'; {jobs} jobs' if jobs else ''}) that only a multirun runs: without -m this launch runs one "
                     f"job with the config's own values ({values}). Add -m to run the sweep: python train.py -m "
                     f"{' '.join(_shell_overrides(hydra_cfg))}".rstrip())
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None)
    if cfg.get("skip_finished") is True and cfg.get("ckpt_path") is None and not params and output_dir \
            and claimed_run_dir(output_dir) is not None:
        notes.append(f"skip_finished=true does nothing in a single run (no -m) in a new folder: it makes a multirun "
                     f"resumable (re-running python train.py -m ... with the same hydra.sweep.dir skips its finished "
                     f"jobs and resumes the unfinished ones). This run starts from step 0 in {output_dir}; to continue "
                     f"a run, pass ckpt_path=<run dir>/{CKPT_DIR}/last.ckpt (or ckpt_path=last) instead")
    return notes


def _sweep_jobs(params: Dict[str, str]) -> Optional[int]:
    """The number of jobs of a ``hydra.sweeper.params`` sweep (the product of each key's values), None when a value
    cannot be counted here (``glob(...)``, a parse error)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    n = 1
    try:
        for o in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()]):
            n *= len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
    except Exception:  # noqa: BLE001 - only a count for a message
        return None
    return n


def _shell_overrides(hydra_cfg) -> List[str]:
    """The launch's command-line overrides (``hydra.overrides.task``), each quoted for a shell."""
    import shlex

    return [shlex.quote(str(o)) for o in (hydra_cfg.overrides.task or [])]


def resume_hint(ckpt, max_steps: int, hydra_cfg=None) -> str:
    """How to continue a run that ``stop_at`` stopped with checkpoint ``ckpt`` (``hydra_cfg``: the launch's ``hydra``
    node, None outside Hydra).

    A single run: ``python train.py <its overrides> ckpt_path=<ckpt>`` (``stop_at`` left out: a deadline that has
    passed starts nothing), which continues it in its run folder; re-running the same command would start a new run
    from step 0 in a new folder. A multirun job: the same command with ``skip_finished=true`` and the same
    ``hydra.sweep.dir`` (named), which skips the finished jobs and resumes this one, or ``ckpt_path=<ckpt>``."""
    import shlex

    steps = f"trainer.max_steps={max_steps} counts all steps"
    if hydra_cfg is None:
        return f"{ckpt} resumes it: pass ckpt_path={ckpt} with the same config ({steps})"
    if getattr(hydra_cfg.mode, "name", str(hydra_cfg.mode)) == "MULTIRUN":
        return (f"{ckpt} resumes it: run the same command again with skip_finished=true and "
                f"hydra.sweep.dir={hydra_cfg.sweep.dir} (a later stop_at or none; finished jobs are skipped, unfinished "
                f"ones resume), or pass ckpt_path={ckpt} with this job's overrides")
    keep = [o for o in _shell_overrides(hydra_cfg)
            if o.lstrip("'+~").split("=", 1)[0] not in ("stop_at", "ckpt_path", "skip_finished")]
    return (f"{ckpt} resumes it in its run folder: python train.py {' '.join(keep + [shlex.quote(f'ckpt_path={ckpt}')])} (the "
            f"same overrides; stop_at left out or set later; {steps}). The same command again would start a new run "
            f"from step 0")


RERUN_SUBDIR = ".hydra/rerun-"
"""Prefix of the folder (``.hydra/rerun-<time>/``) that takes the composed config of a ``skip_finished=true`` job
whose folder already holds a finished run (``final_metrics.json``): the job is skipped (same config) or refused
(another one), and that run's ``.hydra/config.yaml`` must stay the config its final table was measured under. A job
that does replace the run (an older final table without ``result_config``) copies it to ``.hydra/``
(``train.py``)."""


def _hydra_subdir_resolver(ckpt_path, stamp, output_dir=None, skip_finished=False, *, _root_=None):
    """``hydra.output_subdir``: ``.hydra/resume-<time>`` for a resume (``ckpt_path`` in a run folder),
    ``.hydra/rerun-<time>`` (:data:`RERUN_SUBDIR`) for a ``skip_finished`` job in a folder holding a finished run,
    else ``.hydra``."""
    if _run_dir_resolver(ckpt_path, None, _root_=_root_):
        return f".hydra/resume-{stamp}"
    if skip_finished is True and output_dir and (Path(str(output_dir)) / FINAL_METRICS).is_file():
        return f"{RERUN_SUBDIR}{stamp}"
    return ".hydra"


# ---------------------------------------------------------------------------------------------- multirun
_UNSAFE = re.compile(r"[^A-Za-z0-9=,._+\-\[\]@%]")
MULTIRUN_CONFIG = "multirun.yaml"
"""``<sweep dir>/multirun.yaml``: the multirun's config, written by Hydra's sweeper before the first job starts; its
``hydra.overrides.task`` (the command line) and ``hydra.sweeper.params`` give the swept keys
(:func:`sweep_swept_keys`)."""


def swept_keys(overrides, sweeper_params=None) -> List[str]:
    """The keys a multirun sweeps: the keys of ``hydra.sweeper.params`` (sweeps defined in a config) in config
    order, then the other command-line sweep overrides (``a=1,2``, ``range(...)``, ``choice(...)``) in the order
    given. A command line that narrows a config's sweep (``data.seq_len=128`` or ``attention=flash,mqa``) therefore
    names its job folders as the full sweep does, so ``skip_finished`` finds the jobs of either."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [str(k) for k in (sweeper_params or {}).keys()]
    keys += [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides or []))
             if o.is_sweep_override()]
    return list(dict.fromkeys(keys))


def sweep_swept_keys(sweep_dir) -> List[str]:
    """The swept keys (:func:`swept_keys`) of the multirun whose sweep folder is ``sweep_dir``, read from its
    :data:`MULTIRUN_CONFIG` (written by Hydra's sweeper before any job starts); ``[]`` when there is none (no sweep
    folder, or a folder Hydra did not write)."""
    import yaml

    f = Path(str(sweep_dir)) / MULTIRUN_CONFIG if sweep_dir else None
    if f is None or not f.is_file():
        return []
    try:
        hydra = (yaml.safe_load(f.read_text()) or {}).get("hydra") or {}
    except (OSError, yaml.YAMLError):
        return []
    return swept_keys((hydra.get("overrides") or {}).get("task") or [], (hydra.get("sweeper") or {}).get("params"))


def repeated_sweep_value(sweep_dir) -> Optional[str]:
    """Why the multirun whose sweep folder is ``sweep_dir`` lists one value of a command-line sweep twice
    (``attention=flash,flash``, ``optim.lr=1e-3,0.001``), read from its :data:`MULTIRUN_CONFIG`, or ``None``. Hydra
    runs such jobs as asked: one config twice, and when written alike in one job folder, where the later job moved
    the earlier one's results aside and the summary listed one job. Choice sweeps only (a range has distinct values;
    a glob needs the config loader)."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    f = Path(str(sweep_dir)) / MULTIRUN_CONFIG if sweep_dir else None
    if f is None or not f.is_file():
        return None
    try:
        task = (((yaml.safe_load(f.read_text()) or {}).get("hydra") or {}).get("overrides") or {}).get("task") or []
        parsed = OverridesParser.create().parse_overrides([str(t) for t in task])
    except Exception:  # noqa: BLE001 - unreadable, or an override Hydra reports itself
        return None
    for o in parsed:
        try:
            if not (o.is_sweep_override() and o.is_choice_sweep()):
                continue
            values = [o._convert_value(x) for x in o.sweep_iterator()]  # 'a' / "a": QuotedString, the string a
        except Exception:  # noqa: BLE001 - values Hydra resolves later (glob): not compared
            continue
        for i, a in enumerate(values):
            if any(type(a) is type(b) and a == b for b in values[:i]):
                return (f"{o.input_line}: the sweep lists {a!r} more than once, so two of its jobs would run one "
                        f"config (written alike, they share a job folder and the later one moves the earlier one's "
                        f"results aside); give each value once (repeats of a config: seed=0,1,2)")
    return None


def job_dirname(overrides, exclude_keys=(), num=0, sweep_dir=None, max_len: int = 96) -> str:
    """A multirun job's folder name from its overrides (``hydra.overrides.task``), e.g. ``attention=flash,optim.lr=0.001``.

    When the swept keys are known (``sweep_dir``: the multirun's ``hydra.sweep.dir``, whose :data:`MULTIRUN_CONFIG`
    names them, :func:`sweep_swept_keys`) only the swept overrides name the folder, in the order they were given;
    otherwise every override (sorted) but ``exclude_keys``. Characters that are not safe in a file name (``/``,
    spaces, quotes, ...) become ``_``; a name longer than ``max_len`` is cut and ends in ``-`` and 8 hex digits of its
    hash (distinct names stay distinct); no overrides: the job number.
    """
    if isinstance(overrides, str):  # an override_dirname
        overrides = [overrides] if overrides else []
    items = []
    for line in overrides or []:
        line = str(line).lstrip("+~")
        key = line.split("=", 1)[0]
        if key not in set(exclude_keys or ()):
            items.append((key, line))
    swept = sweep_swept_keys(sweep_dir)
    chosen = sorted((swept.index(k), line) for k, line in items if k in swept)
    lines = [line for _, line in chosen] if chosen else sorted(line for _, line in items)
    name = _UNSAFE.sub("_", ",".join(lines)).strip("._") or str(num)
    if len(name) > max_len:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: max_len - 9].rstrip('._')}-{digest}"
    return name


def write_final_metrics(run_dir, record: Dict) -> Path:
    """``<run_dir>/final_metrics.json``: the final table of one run (read by :func:`read_sweep`); standard JSON: a
    NaN / inf metric (a diverged run, whose record has ``"diverged": true``) is written as null."""
    return _write_json(Path(run_dir) / FINAL_METRICS, record)


def mark_not_started(run_dir, stop_at: Optional[float]) -> None:
    """``stop_at=None``: remove ``<run_dir>/not_started.json`` (:data:`NOT_STARTED`), as ``train.py`` does when a job
    starts. Else write it (the deadline and the time it was found passed), so the multirun summary
    (:class:`harness.callbacks.MultirunJobs`) reports the job as not started, not as stopped or failed."""
    path = Path(run_dir) / NOT_STARTED
    if stop_at is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, {"stop_at": float(stop_at), "checked_at": time.time()})


def mark_failed(run_dir, error: Optional[BaseException]) -> None:
    """``error=None``: remove ``<run_dir>/failed.json`` (:data:`FAILED`: the job ran to its end this launch). Else
    write it with the error's type and message, so the multirun summary (:class:`harness.callbacks.MultirunJobs`)
    names the failed jobs and why, apart from the stopped or interrupted ones."""
    path = Path(run_dir) / FAILED
    if error is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, {"error": f"{type(error).__name__}: {error}", "failed_at": time.time()})


def finite_or_none(obj):
    """``obj`` (dicts, lists, tuples, numbers, ...) with every NaN / inf float replaced by ``None``, so it is standard
    JSON (``json.dumps(..., allow_nan=False)`` passes; JSON has no NaN, and other readers reject Python's ``NaN``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def _write_json(path: Path, obj) -> Path:
    """``obj`` as standard JSON at ``path`` (NaN / inf as null, :func:`finite_or_none`), atomically (a temporary file
    renamed over it: a kill never leaves half a file)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    obj = finite_or_none(json.loads(json.dumps(obj, default=str)))  # default=str first: other objects as text
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, allow_nan=False))
    os.replace(tmp, path)
    return path


def read_sweep(sweep_dir) -> List[Dict]:
    """Every job's ``final_metrics.json`` under ``sweep_dir``, in job order (``job.num``), each with its ``dir``."""
    records = []
    for path in Path(sweep_dir).rglob(FINAL_METRICS):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        rec["dir"] = os.path.relpath(path.parent, sweep_dir)
        records.append(rec)
    return sorted(records, key=lambda r: (r.get("job", {}).get("num", 1 << 30), r["dir"]))


# ---------------------------------------------------------------------------------------------- CSV
class _ContinuedWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_before: Optional[int]):
        self._keep_before = keep_before
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if self._keep_before is None or not self._fs.isfile(self.metrics_file_path):
            return super()._check_log_dir_exists()
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [r for r in reader if _step(r) < self._keep_before]
        with self._fs.open(self.metrics_file_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = header  # later rows are appended under this header (rewritten if keys are added)


def _step(row) -> float:
    try:
        return float(row.get("step") or "nan")
    except ValueError:
        return float("nan")


class ContinuedCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger`` that continues ``metrics.csv`` when a run is resumed.

    ``resume_step`` None (a new run): Lightning's behaviour, an existing ``metrics.csv`` is replaced. An int (the
    checkpoint's step): the rows of steps ``< resume_step`` are kept, later rows (steps the checkpoint had not
    reached, trained again now) are dropped, and the resumed run appends.
    """

    def __init__(self, *args, resume_step: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = _ContinuedWriter(self.log_dir, self.resume_step)
        return self._experiment


# ---------------------------------------------------------------------------------------------- resolvers
def _div_resolver(a, b) -> int:
    """``${attn_zoo.div:a,b}``: integer division, e.g. MQAR key-value pairs ``${attn_zoo.div:${data.seq_len},16}``."""
    a, b = int(a), int(b)
    if b == 0:
        raise ValueError("attn_zoo.div: division by zero")
    return a // b


RESULT_FREE_KEYS = ("paths", "skip_finished", "ckpt_path", "experiment_name", "hydra", "stop_at")
"""Top-level config keys that do not change a run's result (left out of :func:`result_config`)."""
RESULT_FREE_TRAINER_KEYS = ("enable_progress_bar", "enable_model_summary", "log_every_n_steps", "enable_checkpointing")
RESULT_FREE_CALLBACKS = ("lr_monitor", "checkpoint")
"""``callbacks.<name>`` entries that only log or save (left out of :func:`result_config`)."""
IMPLICIT_DEFAULTS = {("optim", "_target_"): "torch.optim.AdamW", ("optim", "_partial_"): True,
                     ("trainer", "_target_"): "lightning.pytorch.Trainer", ("model", "short_conv"): 0,
                     ("data", "pack"): False, ("data", "val_path"): None}
"""Keys at the value they had implicitly before the config named them (instantiate keys; ``model.short_conv`` 0, no
short conv, as every model before the option existed) ; the text data's ``pack`` false and ``val_path`` null, as every text run before
packed documents) (left out of
:func:`result_config` at that value, so a run's result config stays what earlier runs stored; another value, e.g.
``optim._target_=torch.optim.Adam``, is kept and differs)."""


PACK_ONLY_DATA_KEYS = ("doc_split", "doc_mask", "eos")
"""Text-data keys read only with ``data.pack=true``: :func:`result_config` leaves them out of an unpacked run."""


RENAMED_TARGETS = {
    "attn_zoo.data.MQARDataModule": "harness.data.MQARDataModule",
    "attn_zoo.data.TextDataModule": "harness.data.TextDataModule",
    "attn_zoo.callbacks.RecallByDistance": "harness.callbacks.RecallByDistance",
    "attn_zoo.callbacks.ModelCheckpoint": "harness.callbacks.ModelCheckpoint",
    "attn_zoo.callbacks.MultirunJobs": "harness.callbacks.MultirunJobs",
    "attn_zoo.runs.ContinuedCSVLogger": "harness.runs.ContinuedCSVLogger",
}
"""Old ``_target_`` -> current one, for configs stored before the harness left the library (``attn_zoo.data`` ->
``harness.data``, ...): :func:`result_config` and :func:`renamed_targets` read stored configs under today's names,
so a run stored under the old name compares equal to the same run today (the stored files are not rewritten)."""


def renamed_targets(c):
    """``c`` (a plain dict / list, e.g. a stored config) with every ``_target_`` named in :data:`RENAMED_TARGETS`
    replaced by its current name, at any depth (``data._target_``, ``callbacks.<name>._target_``, ...). A new
    object; ``c`` is not changed."""
    if isinstance(c, dict):
        return {k: (RENAMED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else renamed_targets(v))
                for k, v in c.items()}
    if isinstance(c, list):
        return [renamed_targets(x) for x in c]
    return c


def result_config(cfg) -> Dict:
    """The resolved config of a run without the keys that do not change its result (:data:`RESULT_FREE_KEYS`, the
    progress bar / logging / checkpoint cadence, the loggers, logging- and saving-only callbacks, instantiate keys at
    their implicit defaults): what ``skip_finished`` compares. ``cfg``: a DictConfig or a plain dict (e.g. a stored
    result config, so configs stored before a key became result-free compare equal: the function is idempotent)."""
    from omegaconf import DictConfig, OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg, default=str))
    c = renamed_targets(c)
    for k in RESULT_FREE_KEYS + ("logger",):
        c.pop(k, None)
    for k in RESULT_FREE_TRAINER_KEYS:
        (c.get("trainer") or {}).pop(k, None)
    for k in ("cache_dir", "num_workers"):
        (c.get("data") or {}).pop(k, None)
    for k in RESULT_FREE_CALLBACKS:
        (c.get("callbacks") or {}).pop(k, None)
    data = c.get("data")
    if isinstance(data, dict) and "pack" in data and not data["pack"]:
        for k in PACK_ONLY_DATA_KEYS:  # read only when documents are packed: no effect on an unpacked run
            data.pop(k, None)
    for (node, key), value in IMPLICIT_DEFAULTS.items():
        sub = c.get(node)
        if isinstance(sub, dict) and key in sub and sub[key] == value:
            del sub[key]
    return json.loads(json.dumps(c, sort_keys=True, default=str))


def _diff_keys(a, b, prefix="") -> List[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def data_links(data) -> Dict[str, str]:
    """The ``data.<key>`` of a DictConfig ``data`` node that are a plain interpolation of a key outside it
    (``data.seed: ${seed}``): ``{key: the key it follows}``. A resume error then asks for ``seed=1``: an override
    of ``data.seed`` would leave the launch's ``seed`` (recorded in ``final_metrics.json``) at another value."""
    from omegaconf import DictConfig, OmegaConf

    links: Dict[str, str] = {}
    if not isinstance(data, DictConfig):
        return links
    raw = OmegaConf.to_container(data, resolve=False)
    for k in data.keys():
        if OmegaConf.is_interpolation(data, str(k)):
            m = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", str(raw[k]))
            if m and not m.group(1).startswith("data."):
                links[str(k)] = m.group(1)
    return links


def _resume_overrides(stored: Dict, keys: List[str], links: Optional[Dict[str, str]] = None) -> List[str]:
    """The overrides that give ``keys`` (``data.*`` without the prefix) their values in ``stored``: ``data.<key>=...``,
    or ``<other>=...`` for a key that follows another (:func:`data_links`)."""
    links = links or {}
    return [f"{links.get(k, 'data.' + k)}={json.dumps(_at(stored, k))}" for k in keys]


def _shown(keys: List[str], most: int = 8) -> str:
    """The first ``most`` differing keys, comma-separated, and how many more."""
    return ", ".join(keys[:most]) + (f" (+{len(keys) - most} more)" if len(keys) > most else "")


RESUME_FREE_DATA_KEYS = ("cache_dir", "num_workers", "max_memory_gb")
"""``data.*`` keys a resume may change: where token caches go, the loader processes and the memory size check do not
change what is trained on (:func:`check_resume_data`). Every other ``data.*`` key (``num_kv_pairs``, ``seq_len``,
``num_train``, ``batch_size``, ``seed``, ``path``, ...) must be the checkpoint's."""


def resume_data_config(data, abs_path=None) -> Dict:
    """The ``data.*`` settings a checkpoint records (:class:`harness.callbacks.RunState`) and a resume must repeat:
    ``data`` (a DictConfig or dict) as :func:`result_config` keeps it, without :data:`RESUME_FREE_DATA_KEYS`;
    ``data.path`` / ``data.val_path`` through ``abs_path`` (e.g. relative to the launch directory), so the same file
    named from another directory compares equal."""
    from omegaconf import DictConfig, OmegaConf

    d = OmegaConf.to_container(data, resolve=True) if isinstance(data, DictConfig) else dict(data or {})
    d = dict(result_config({"data": d}).get("data") or {})
    for k in RESUME_FREE_DATA_KEYS:
        d.pop(k, None)
    if abs_path is not None:
        for k in ("path", "val_path"):
            v = d.get(k)
            if isinstance(v, str):
                d[k] = abs_path(v)
            elif isinstance(v, list):
                d[k] = [abs_path(p) if isinstance(p, str) else p for p in v]
    return d


def _normalised_paths(d: Dict) -> Dict:
    """``d`` with its absolute ``path`` / ``val_path`` (a string or a list) spelled one way (``os.path.realpath``: no
    ``..``, no symlink), so the same file named through ``../x`` or a link compares equal."""
    d = dict(d)

    def norm(p):
        return os.path.realpath(p) if isinstance(p, str) and os.path.isabs(p) else p

    for k in ("path", "val_path"):
        if k in d:
            v = d[k]
            d[k] = [norm(p) for p in v] if isinstance(v, list) else norm(v)
    return d


def check_resume_data(ckpt_path, stored: Optional[Dict], current: Dict, links: Optional[Dict[str, str]] = None) -> None:
    """Refuse to resume a checkpoint ``stored`` (its :func:`resume_data_config`, None for checkpoints written before
    it was kept: not compared) on other data settings ``current``: the model would continue on other data and
    ``final_metrics.json`` would record settings it mostly did not train on.

    Raises:
        ValueError: starting ``ckpt_path:``, naming each differing ``data.<key>`` with the checkpoint's and this
            run's value, and the overrides that resume it.
    """
    if stored is None:
        return
    stored, current = _normalised_paths(stored), _normalised_paths(current)
    diff = _diff_keys(stored, current)
    if not diff:
        return

    def at(c, key):  # the value, or a note when the config has no such key (the data module's default applies)
        for part in key.split("."):
            if not (isinstance(c, dict) and part in c):
                return "not set (the data module's default)"
            c = c[part]
        return repr(c)

    what = "; ".join(f"data.{k}: checkpoint {at(stored, k)}, this run {at(current, k)}" for k in diff)
    fix = " ".join(_resume_overrides(stored, diff, links))
    raise ValueError(
        f"ckpt_path={ckpt_path}: the data settings differ from the checkpoint's ({what}); a resumed run continues the "
        f"checkpoint's model, so it would train partly on other data and its final table would record settings it "
        f"mostly did not train on. Resume with the checkpoint's values ({fix}), or start a new run (only "
        f"{', '.join('data.' + k for k in RESUME_FREE_DATA_KEYS)} may change on a resume)")


def finished_run(output_dir, cfg=None) -> Optional[Dict]:
    """The final metrics of a run that finished in ``output_dir`` (its ``final_metrics.json``, written last by
    ``train.py``), or None. ``skip_finished=true`` uses it to make a multirun resumable: re-running the command
    (same ``hydra.sweep.dir``) skips the jobs that finished and runs the others.

    With ``cfg`` (the job's config) the finished run counts only when it ran the same :func:`result_config`; a run
    written without one (older runs) does not count (the job runs again).

    Raises:
        ValueError: the folder holds a finished run of another config (names the differing keys): a job never
            reports another config's numbers as its own.
    """
    f = Path(output_dir) / FINAL_METRICS
    if not f.is_file():
        return None
    try:
        done = json.loads(f.read_text())
    except (OSError, ValueError):
        return None  # a truncated file: run the job again
    if cfg is None:
        return done
    stored = done.get("result_config")
    if stored is None:
        return None
    diff = _diff_keys(result_config(stored), result_config(cfg))
    if diff:
        raise ValueError(
            f"skip_finished: {output_dir} holds a finished run of another config (differs in {_shown(diff)}); pass "
            f"hydra.sweep.dir=<a new folder> (or hydra.run.dir), delete that folder, or skip_finished=false")
    return done


def write_run_config(run_dir, cfg) -> Path:
    """``<run_dir>/run_config.json``: the :func:`result_config` a run trains under, written as it starts (a new run
    or a resume), so that :func:`resumable_checkpoint` can tell whether its ``last.ckpt`` belongs to a job's config."""
    return _write_json(Path(run_dir) / RUN_CONFIG, result_config(cfg))


def resumable_checkpoint(output_dir, cfg):
    """``(path, None)``: the ``<output_dir>/checkpoints/last.ckpt`` that an unfinished run of the same config left
    (a run stopped at ``stop_at``, by Ctrl-C, or killed after a periodic checkpoint), which ``skip_finished=true``
    resumes; ``(None, None)``: there is no checkpoint; ``(None, reason)``: there is one but it cannot continue this
    job, because its :data:`RUN_CONFIG` is missing or holds another :func:`result_config` (the reason names the
    differing keys) or it is not a readable checkpoint (a kill while it was written). The job then starts over.

    A checkpoint whose training is complete (at ``trainer.max_steps``, after ``trainer.max_epochs`` epochs, or stopped
    by a callback such as EarlyStopping) is returned too: its run was killed during its final validation, before
    ``final_metrics.json``, and ``train.py`` resumes it without training (it validates it and writes the final
    table)."""
    ckpt = Path(output_dir) / CKPT_DIR / "last.ckpt"
    if not ckpt.is_file():
        return None, None
    try:
        stored = json.loads((Path(output_dir) / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return None, (f"{ckpt} has no readable {RUN_CONFIG} beside it (missing or damaged; train.py writes it when a "
                      f"run starts), so its config is unknown")
    diff = _diff_keys(result_config(stored), result_config(cfg))
    if diff:
        return None, f"{ckpt} was trained under another config (differs in {_shown(diff)})"
    try:
        checkpoint_info(ckpt)
    except ValueError as e:
        return None, f"{ckpt} cannot be read: {e}"
    return str(ckpt), None


def register_resolvers() -> None:
    """OmegaConf resolvers used by ``conf/train.yaml``'s ``hydra`` node (call before Hydra composes it)."""
    from omegaconf import OmegaConf

    for name, fn in (("attn_zoo.run_dir", _run_dir_resolver), ("attn_zoo.hydra_subdir", _hydra_subdir_resolver),
                     ("attn_zoo.job_dirname", job_dirname), ("attn_zoo.div", _div_resolver)):
        OmegaConf.register_new_resolver(name, fn, replace=True)
