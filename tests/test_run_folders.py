"""Run folders and single runs (a newcomer's findings); each test failed before its fix.

1. Two runs started in the same second shared ``outputs/<date>/<time>``: the second overwrote the first's
   checkpoints and final table. Each launch now claims its own folder (``<time>``, ``<time>-1``, ...).
2. A run stopped at ``stop_at`` told a single run to "run the same command again (skip_finished=true)", which starts
   over in a new folder: a single run's hint is now its ``ckpt_path=`` command.
3. ``skip_finished=true`` on a single run in a new folder did nothing, silently: a warning says what it is for. Its
   refusal (a finished run of another config in the folder) was a ValueError with a traceback: a ConfigError.
4. A sweep experiment without ``-m`` ran one job silently: a warning names the sweep and says to add ``-m``.
5. A refused resume left ``.hydra/resume-<time>/`` in the run it refused.
"""

import json
import shutil
import time

import pytest
from omegaconf import OmegaConf, open_dict, read_write

import train as train_mod
from harness import callbacks as cb_mod
from harness import runs as runs_mod
from harness.config import ConfigError
from test_train import COMMON, FAST, make_cfg

main = train_mod.main.__wrapped__  # the job function under @hydra.main
SHORT = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
# hydra.run.dir as conf/train.yaml has it, with a fixed default: a second launch meets the first's folder, as two
# launches in the same second do
SAME_DEFAULT = "hydra.run.dir='${attn_zoo.run_dir:${ckpt_path},runs/same}'"


def _in_process(train_py_in_process, cwd, *args, base=FAST):
    """``python train.py <base> <args>`` from ``cwd``, in this interpreter (``train_py_in_process``: each launch claims
    its folders as a new process does)."""
    return train_py_in_process(cwd, *base, *args)


def _output_dir(stdout):
    return [line.split("output_dir: ", 1)[1] for line in stdout.splitlines() if line.startswith("output_dir: ")]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, train_py_in_process_module):
    """One single run launched as ``train.py <FAST> <SHORT> hydra.run.dir=run`` (no skip_finished), finished: its
    folder and its CompletedProcess. Each test that resumes it or is refused by it works on its own copy
    (:func:`_copy_of`): one launch instead of one per test. (In this interpreter; train.py's single runs as a process:
    test_train.py, test_train_edges.py.)"""
    cwd = tmp_path_factory.mktemp("finished")
    r = train_py_in_process_module(cwd, *FAST, *SHORT, "hydra.run.dir=run")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _output_dir(r.stdout) == [str(cwd / "run")] and (cwd / "run" / "final_metrics.json").is_file()
    return cwd / "run", r


def _copy_of(finished_run, tmp_path):
    """A copy of the finished run in ``tmp_path / "run"`` (what ``hydra.run.dir=run`` names from ``tmp_path``)."""
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    return run


# ------------------------------------------------------------------------------------------ 1: one folder per launch
def test_claim_run_dir_takes_the_next_free_name_once_per_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs_mod, "_CLAIMED", {})
    first = runs_mod.claim_run_dir("outputs/d/12-00-00")
    assert first == "outputs/d/12-00-00" and (tmp_path / first).is_dir()
    assert runs_mod.claim_run_dir("outputs/d/12-00-00") == first, "resolved again in the same launch: the same folder"
    assert runs_mod.claimed_run_dir(tmp_path / first) == str(tmp_path / "outputs"), "outputs/ was new: the claim made it"
    monkeypatch.setattr(runs_mod, "_CLAIMED", {})  # another process, the same second
    assert runs_mod.claim_run_dir("outputs/d/12-00-00") == "outputs/d/12-00-00-1"
    assert runs_mod.claimed_run_dir(tmp_path / "outputs/d/12-00-00-1") == str(tmp_path / "outputs/d/12-00-00-1")
    assert runs_mod.claimed_run_dir(tmp_path / first) is None, "not this process's folder"
    # the resolver claims only for a single run Hydra runs; a composed config (no hydra.mode) creates nothing
    root = OmegaConf.create({"hydra": {"mode": "RUN"}})
    assert runs_mod._run_dir_resolver(None, "outputs/d/13-00-00", _root_=root) == "outputs/d/13-00-00"
    assert (tmp_path / "outputs/d/13-00-00").is_dir()
    assert runs_mod._run_dir_resolver(None, "outputs/d/14-00-00") == "outputs/d/14-00-00"
    assert not (tmp_path / "outputs/d/14-00-00").exists()


def test_two_launches_on_the_same_default_folder_get_one_folder_each(tmp_path, train_py_in_process):
    a = _in_process(train_py_in_process, tmp_path, *SHORT, SAME_DEFAULT)
    assert a.returncode == 0, a.stderr[-3000:]
    b = _in_process(train_py_in_process, tmp_path, *SHORT, SAME_DEFAULT, "attention=linear")
    assert b.returncode == 0, b.stderr[-3000:]
    same, other = tmp_path / "runs" / "same", tmp_path / "runs" / "same-1"
    assert _output_dir(a.stdout) == [str(same)] and _output_dir(b.stdout) == [str(other)]
    assert json.loads((same / "final_metrics.json").read_text())["variant"] == "flash+flash", "not overwritten"
    assert json.loads((other / "final_metrics.json").read_text())["variant"] == "linear+linear"
    assert "attention=linear" not in (same / ".hydra" / "overrides.yaml").read_text()
    # a refused launch leaves no folder of its own (a resume claims none either: the resume of
    # test_a_refused_resume_leaves_nothing_in_the_run_it_refused_and_a_resume_continues_it)
    r = _in_process(train_py_in_process, tmp_path, SAME_DEFAULT, "trainer.max_steps=0")
    assert r.returncode != 0 and "trainer.max_steps=0: must be a positive integer" in r.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["same", "same-1"]


# ------------------------------------------------------------------------------------------ hydra's config in a test
class _Hydra:
    """HydraConfig set to the composed ``hydra`` node of ``overrides`` in ``mode`` (RUN or MULTIRUN), as a launch
    has it; restored on exit."""

    def __init__(self, tmp_path, overrides, mode, **hydra_values):
        from hydra.types import RunMode

        self.cfg = make_cfg(tmp_path, overrides, return_hydra_config=True)
        with read_write(self.cfg.hydra), open_dict(self.cfg.hydra):
            self.cfg.hydra.mode = getattr(RunMode, mode)
            for key, value in hydra_values.items():
                OmegaConf.update(self.cfg.hydra, key, value, merge=False)

    def __enter__(self):
        from hydra.core.hydra_config import HydraConfig

        self.saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(self.cfg)
        return self.cfg.hydra

    def __exit__(self, *exc):
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().cfg = self.saved


# ------------------------------------------------------------------------------------------ 2: the stop_at hint
def _stop_at_first_check(monkeypatch):
    calls = []
    monkeypatch.setattr(cb_mod, "_clock", lambda: calls.append(1) or (float("inf") if len(calls) > 1 else 0.0))


def _stopped_hint(tmp_path, monkeypatch, overrides, mode, **hydra_values):
    rows = {}
    monkeypatch.setattr(train_mod, "print_table", lambda title, r: rows.update(r))
    _stop_at_first_check(monkeypatch)
    with _Hydra(tmp_path, overrides, mode, **hydra_values):
        assert main(make_cfg(tmp_path / "run", overrides)) is None
    return rows["resume"]


def test_a_stopped_single_run_is_told_its_ckpt_path_command(tmp_path, monkeypatch):
    overrides = FAST + ["attention=linear", "trainer.max_steps=30", f"stop_at={time.time() + 3600:.0f}"]
    hint = _stopped_hint(tmp_path, monkeypatch, overrides, "RUN")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "run the same command again" not in hint and "skip_finished=true" not in hint
    assert f"python train.py {' '.join(FAST)} attention=linear trainer.max_steps=30 ckpt_path={ckpt}" in hint
    assert "stop_at=" not in hint.split("(")[0], "a passed deadline would start nothing: left out"


def test_a_stopped_multirun_job_is_told_to_rerun_with_skip_finished_and_its_sweep_dir(tmp_path, monkeypatch):
    overrides = FAST + ["trainer.max_steps=30", f"stop_at={time.time() + 3600:.0f}"]
    hint = _stopped_hint(tmp_path, monkeypatch, overrides, "MULTIRUN", **{"sweep.dir": str(tmp_path / "sweep")})
    assert f"run the same command again with skip_finished=true and hydra.sweep.dir={tmp_path / 'sweep'}" in hint


def test_a_single_run_with_a_passed_stop_at_fails_instead_of_doing_nothing(tmp_path, train_py_in_process):
    """A single run (no -m) with stop_at in the past exited 0, trained nothing and left outputs/<date>/<time>/ with a
    not_started.json (what a multirun job records for its summary). It is refused now, the message alone, and leaves
    no folder; a multirun's jobs are still marked not started (test_resume_unfinished.py)."""
    r = _in_process(train_py_in_process, tmp_path, *SHORT, f"stop_at={time.time() - 60:.0f}")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "s ago, so this run would not start; pass a later stop_at" in r.stderr
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------------------------------ 3: skip_finished
def test_skip_finished_on_a_new_single_run_warns_what_it_is_for(tmp_path, finished_run, train_py_in_process):
    r = _in_process(train_py_in_process, tmp_path, *SHORT, "skip_finished=true")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "skip_finished=true does nothing in a single run (no -m) in a new folder: it makes a multirun resumable" in out
    assert "ckpt_path=<run dir>/checkpoints/last.ckpt" in out
    r = finished_run[1]  # the same single run in a new folder without it: no such warning
    assert r.returncode == 0 and "skip_finished=true does nothing" not in r.stdout + r.stderr


def test_a_skip_finished_refusal_is_a_config_error_printed_without_a_traceback(tmp_path, finished_run,
                                                                             train_py_in_process):
    run = _copy_of(finished_run, tmp_path)  # a finished run of train.py <FAST> <SHORT> hydra.run.dir=run
    with pytest.raises(ConfigError, match=r"^skip_finished: .* holds a finished run of another config"):
        main(make_cfg(run, FAST + SHORT + ["skip_finished=true", "optim.lr=1e-3"]))
    hydra_before = sorted(p.name for p in (run / ".hydra").iterdir())
    # the launch through Hydra, in this interpreter (refused before training: no subprocess needed)
    r = train_py_in_process(tmp_path, *FAST, *SHORT, "hydra.run.dir=run", "skip_finished=true", "optim.lr=1e-3")
    assert r.returncode != 0 and "holds a finished run of another config" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == hydra_before, "the refused launch left nothing"


# ------------------------------------------------------------------------------------------ 4: a sweep without -m
def test_a_sweep_experiment_without_m_warns_and_names_the_sweep(tmp_path, train_py_in_process):
    cfg = make_cfg(tmp_path, ["experiment=shakespeare_all", "trainer.max_steps=7"], return_hydra_config=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = "RUN"
    notes = runs_mod.single_run_notes(cfg, cfg.hydra)
    assert len(notes) == 1, notes
    assert notes[0].startswith("experiment=shakespeare_all defines a sweep (hydra.sweeper.params: "
                               "attention=flash,sliding_window,sparse,linear,gqa,mqa; 6 jobs)")
    assert "this launch runs one job with the config's own values (attention=flash)" in notes[0]
    assert notes[0].endswith("python train.py -m experiment=shakespeare_all trainer.max_steps=7")
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = "MULTIRUN"
    assert runs_mod.single_run_notes(cfg, cfg.hydra) == []
    plain = make_cfg(tmp_path, [], return_hydra_config=True)
    with read_write(plain.hydra), open_dict(plain.hydra):
        plain.hydra.mode = "RUN"
    assert runs_mod.single_run_notes(plain, plain.hydra) == []

    text = tmp_path / "tiny.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 400)
    r = _in_process(train_py_in_process, tmp_path, "experiment=shakespeare_all", f"data.path={text}",
                    "model.d_model=32", "model.n_layer=1", "model.n_head=2", "data.seq_len=32", *SHORT, base=COMMON)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "experiment=shakespeare_all defines a sweep" in out and "Add -m to run the sweep" in out
    assert len(_output_dir(r.stdout)) == 1


# ------------------------------------------------------------------------------------------ 5: a refused resume
def test_a_refused_resume_leaves_nothing_in_the_run_it_refused_and_a_resume_continues_it(tmp_path, finished_run,
                                                                                         train_py_in_process):
    run = _copy_of(finished_run, tmp_path)  # a finished run of train.py <FAST> <SHORT> hydra.run.dir=run
    before = {p.relative_to(run): p.stat().st_size for p in run.rglob("*")}
    ckpt = run / "checkpoints" / "last.ckpt"
    for refused in (["attention=linear"], ["optim.lr=1e-3"], ["trainer.max_steps=2"]):
        # the launches through Hydra, in this interpreter (refused before training), as is the resume below
        r = train_py_in_process(tmp_path, *FAST, *SHORT, f"ckpt_path={ckpt}", *refused)
        assert r.returncode != 0 and "ckpt_path" in r.stderr, r.stderr[-3000:]
        after = {p.relative_to(run): p.stat().st_size for p in run.rglob("*")}
        assert after == before, (refused, set(after) ^ set(before))
    # a resume that runs continues its run's folder, keeps its config folder and claims no folder of its own (the
    # default hydra.run.dir, outputs/<date>/<time>, stays unmade)
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=3", "trainer.val_check_interval=3",
                    "trainer.limit_val_batches=1", f"ckpt_path={ckpt}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list((run / ".hydra").glob("resume-*"))) == 1
    assert _output_dir(r.stdout) == [str(run)]
    assert json.loads((run / "final_metrics.json").read_text())["steps"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "the resume made a folder of its own"


def test_a_resume_into_another_named_folder_says_what_goes_where(tmp_path, finished_run, train_py_in_process):
    """``ckpt_path=<run>/checkpoints/last.ckpt hydra.run.dir=<other>`` trained on in <run> while Hydra's config copy
    (.hydra/resume-<time>/) and train.log went to <other>, said only at INFO level ("resuming ... in its run
    directory"): the run's folder silently lacked this launch's config and log."""
    run = _copy_of(finished_run, tmp_path)  # a finished run of train.py <FAST> <SHORT> hydra.run.dir=run
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=3", "trainer.val_check_interval=3",
                    "trainer.limit_val_batches=1", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
                    "hydra.run.dir=other")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "WARNING" in out and f"in its run directory {run}, not in " in out, out[-3000:]
    assert "Hydra's copy of this command's config and train.log stay in" in out
    assert (run / "final_metrics.json").is_file() and (tmp_path / "other" / "train.log").is_file()


def test_a_sweep_listing_one_value_twice_is_refused(tmp_path, train_py_in_process):
    """``-m attention=flash,flash`` ran both jobs in one folder ``attention=flash``: the second moved the first's
    results aside (*.replaced-<time>) and the summary listed one job, exit 0. Each job now refuses, naming the value."""
    import yaml

    def why(task):
        d = tmp_path / f"sweep{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / runs_mod.MULTIRUN_CONFIG).write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
        return runs_mod.repeated_sweep_value(d)

    assert why(["attention=flash,flash", "logger=csv"]).startswith(
        "attention=flash,flash: the sweep lists 'flash' more than once")
    assert "lists 0.001 more than once" in why(["optim.lr=1e-3,0.001"])  # one value, two spellings
    assert "lists ['flash', 'linear'] more" in why(["model.layers=[flash,linear],[flash,linear]"])
    # quoted values: the string itself (was QuotedString(text='flash', quote=...) in the message; "a",'a' unseen)
    assert "lists 'flash' more than once" in why(["attention='flash','flash'"])
    assert "lists 'flash' more than once" in why(["attention=\"flash\",'flash'"])
    assert why(["attention='flash,linear'"]) is None and why(["+x=1,'1'"]) is None  # one value; int and string
    for fine in (["optim.lr=1e-3,2e-3", "attention=flash,linear"], ["seed=range(0,3)"], ["seed=0"], []):
        assert why(fine) is None, fine
    assert runs_mod.repeated_sweep_value(tmp_path / "none") is None  # no multirun.yaml
    # the multirun through Hydra, in this interpreter (each job is refused before training)
    r = train_py_in_process(tmp_path, "-m", *FAST, *SHORT, "attention=flash,flash", "hydra.sweep.dir=sw")
    assert r.returncode != 0
    assert "attention=flash,flash: the sweep lists 'flash' more than once" in r.stderr + r.stdout
    assert not list((tmp_path / "sw").rglob("final_metrics*.json"))
