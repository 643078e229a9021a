"""Run folders (a newcomer's findings); each test failed before its fix.

1. Two runs started in the same second shared ``outputs/<date>/<time>``: the second overwrote the first's
   checkpoints and final table. Each launch now claims its own folder (``<time>``, ``<time>-1``, ...).
5. A refused resume left ``.hydra/resume-<time>/`` in the run it refused.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from harness import runs as runs_mod
from test_train import FAST, ROOT

SHORT = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
# hydra.run.dir as conf/train.yaml has it, with a fixed default: a second launch meets the first's folder, as two
# launches in the same second do
SAME_DEFAULT = "hydra.run.dir='${attn_zoo.run_dir:${ckpt_path},runs/same}'"


def _cli(cwd, *args, base=FAST, timeout=240):
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *base, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _output_dir(stdout):
    return [line.split("output_dir: ", 1)[1] for line in stdout.splitlines() if line.startswith("output_dir: ")]


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


def test_two_launches_on_the_same_default_folder_get_one_folder_each(tmp_path):
    a = _cli(tmp_path, *SHORT, SAME_DEFAULT)
    assert a.returncode == 0, a.stderr[-3000:]
    b = _cli(tmp_path, *SHORT, SAME_DEFAULT, "attention=linear")
    assert b.returncode == 0, b.stderr[-3000:]
    same, other = tmp_path / "runs" / "same", tmp_path / "runs" / "same-1"
    assert _output_dir(a.stdout) == [str(same)] and _output_dir(b.stdout) == [str(other)]
    assert json.loads((same / "final_metrics.json").read_text())["variant"] == "flash+flash", "not overwritten"
    assert json.loads((other / "final_metrics.json").read_text())["variant"] == "linear+linear"
    assert "attention=linear" not in (same / ".hydra" / "overrides.yaml").read_text()
    # a refused launch leaves no folder of its own; a resume continues its run's folder and claims none
    r = _cli(tmp_path, SAME_DEFAULT, "trainer.max_steps=0")
    assert r.returncode != 0 and "trainer.max_steps=0: must be a positive integer" in r.stderr
    r = _cli(tmp_path, SAME_DEFAULT, "trainer.max_steps=3", "trainer.val_check_interval=3",
             "trainer.limit_val_batches=1", f"ckpt_path={same / 'checkpoints' / 'last.ckpt'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _output_dir(r.stdout) == [str(same)]
    assert json.loads((same / "final_metrics.json").read_text())["steps"] == 3
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["same", "same-1"]


# ------------------------------------------------------------------------------------------ 5: a refused resume
def test_a_refused_resume_leaves_nothing_in_the_run_it_refused(tmp_path):
    run = tmp_path / "run"
    r = _cli(tmp_path, *SHORT, "hydra.run.dir=run")
    assert r.returncode == 0, r.stderr[-3000:]
    before = {p.relative_to(run): p.stat().st_size for p in run.rglob("*")}
    ckpt = run / "checkpoints" / "last.ckpt"
    for refused in (["attention=linear"], ["optim.lr=1e-3"], ["trainer.max_steps=2"]):
        r = _cli(tmp_path, *SHORT, f"ckpt_path={ckpt}", *refused)
        assert r.returncode != 0 and "ckpt_path" in r.stderr, r.stderr[-3000:]
        after = {p.relative_to(run): p.stat().st_size for p in run.rglob("*")}
        assert after == before, (refused, set(after) ^ set(before))
    # a resume that runs keeps its config folder
    r = _cli(tmp_path, "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.limit_val_batches=1",
             f"ckpt_path={ckpt}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list((run / ".hydra").glob("resume-*"))) == 1
