"""Resumable multiruns: ``stop_at`` stops a job with a checkpoint, ``skip_finished=true`` resumes it from there (same
config only) or starts over (another config, an unreadable checkpoint); step metrics only on the logged steps."""

import csv
import json
import math
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

import train as train_mod
from harness import callbacks as cb_mod
from harness.runs import RUN_CONFIG, checkpoint_info, finished_run, result_config, resumable_checkpoint
from test_train import FAST, column, make_cfg, read_csv

# 30 steps, validation every 15, checkpoints/last.ckpt at each validation (the experiment configs' setting)
JOB = FAST + ["trainer.max_steps=30", "trainer.val_check_interval=15", "skip_finished=true",
              "callbacks.checkpoint.monitor=null", "callbacks.checkpoint.save_top_k=0"]
main = train_mod.main.__wrapped__  # the job function under @hydra.main


def _stop_now(monkeypatch, at_start=False):
    """StopAt's clock says the deadline has passed once training runs: the run stops at its first check in training
    (optimizer step 10). ``at_start``: already when training starts (on_train_start's check)."""
    calls = []

    def clock():
        calls.append(1)
        return float("inf") if at_start or len(calls) > 1 else 0.0

    monkeypatch.setattr(cb_mod, "_clock", clock)


def _later():
    return f"stop_at={time.time() + 3600:.0f}"  # the job starts (main() reads the real clock)


def test_stop_at_leaves_a_checkpoint_and_skip_finished_resumes_it(tmp_path, monkeypatch):
    _stop_now(monkeypatch)
    assert main(make_cfg(tmp_path, JOB + [_later()])) is None, "a stopped job reports no result"
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert not (tmp_path / "final_metrics.json").exists(), "a run stopped at stop_at is not finished"
    assert checkpoint_info(ckpt).step == 10
    assert json.loads((tmp_path / RUN_CONFIG).read_text())["trainer"]["max_steps"] == 30
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(10))

    monkeypatch.setattr(cb_mod, "_clock", time.time)
    cfg = make_cfg(tmp_path, JOB)  # the same command without the deadline (stop_at changes no result)
    value = main(cfg)
    done = json.loads((tmp_path / "final_metrics.json").read_text())
    assert done["steps"] == 30 and done["resumed_from"] == str(ckpt)
    assert math.isfinite(done["metrics"]["train/loss"]), "the last logged train loss reaches the final table"
    assert math.isclose(value, done["metrics"]["val/loss"], rel_tol=1e-6)
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(30)), "each step logged once"
    assert checkpoint_info(ckpt).total_steps == 30, "the LR schedule is the first launch's"
    assert finished_run(tmp_path, make_cfg(tmp_path, JOB)) is not None
    assert main(make_cfg(tmp_path, JOB)) == value, "a third launch skips the finished job"


def test_another_config_or_a_broken_checkpoint_starts_over(tmp_path, monkeypatch, caplog):
    _stop_now(monkeypatch)
    main(make_cfg(tmp_path, JOB + [_later()]))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    other = make_cfg(tmp_path, JOB + ["optim.lr=3e-3"])
    path, why = resumable_checkpoint(tmp_path, other)
    assert path is None and "optim.lr" in why
    assert resumable_checkpoint(tmp_path, make_cfg(tmp_path, JOB))[0] == str(ckpt)
    short = make_cfg(tmp_path, JOB + ["trainer.max_steps=10"])
    assert resumable_checkpoint(tmp_path, short)[0] is None  # another max_steps is another config

    monkeypatch.setattr(cb_mod, "_clock", time.time)
    with caplog.at_level("WARNING", logger="attn_zoo.train"):
        main(other)
    assert "starts over" in caplog.text and "optim.lr" in caplog.text
    done = json.loads((tmp_path / "final_metrics.json").read_text())
    assert done["resumed_from"] is None and done["steps"] == 30
    moved = list(tmp_path.glob("checkpoints.replaced-*/last.ckpt"))
    assert len(moved) == 1 and checkpoint_info(moved[0]).step == 10, "the other config's checkpoint is kept aside"

    ckpt.write_bytes(b"cut off while it was written")
    (tmp_path / "final_metrics.json").unlink()
    path, why = resumable_checkpoint(tmp_path, other)
    assert path is None and "cannot be read" in why
    (tmp_path / RUN_CONFIG).unlink()
    assert "run_config.json" in resumable_checkpoint(tmp_path, other)[1]
    ckpt.unlink()
    assert resumable_checkpoint(tmp_path, other) == (None, None)


def test_a_deadline_at_the_last_step_leaves_a_finished_run(tmp_path, monkeypatch):
    """The deadline is checked as a batch starts: a run whose last step comes first has finished."""
    _stop_now(monkeypatch)
    main(make_cfg(tmp_path, JOB + ["trainer.max_steps=10", "trainer.val_check_interval=5", _later()]))
    assert json.loads((tmp_path / "final_metrics.json").read_text())["steps"] == 10


def test_stop_at_in_the_past_starts_nothing_and_bad_values_name_the_key(tmp_path):
    assert main(make_cfg(tmp_path, JOB + [f"stop_at={time.time() - 5:.0f}"])) is None
    assert not (tmp_path / "csv").exists() and not (tmp_path / RUN_CONFIG).exists()
    for bad in ("soon", "true", "540", "-5"):  # 540: a duration, not a time
        with pytest.raises(ValueError, match=r"stop_at=.*seconds since the epoch"):
            train_mod.validate_config(make_cfg(tmp_path, JOB + [f"stop_at={bad}"]))
    with pytest.raises(ValueError, match="every"):
        cb_mod.StopAt(time.time(), every=0)


def test_checkpoint_settings_change_no_result_and_stored_configs_still_match(tmp_path):
    """Runs stored before the experiments kept checkpoints (callbacks.checkpoint: null, enable_checkpointing: false)
    are the same result as runs that keep them: skip_finished still skips them."""
    new = make_cfg(tmp_path, JOB)
    stored = result_config(new)
    stored["callbacks"]["checkpoint"] = None
    stored["trainer"]["enable_checkpointing"] = False
    (tmp_path / "final_metrics.json").write_text(json.dumps({"steps": 30, "result_config": stored}))
    assert finished_run(tmp_path, new)["steps"] == 30
    assert result_config(result_config(new)) == result_config(new)
    with open_dict(new):
        new.trainer.max_steps = 31
    with pytest.raises(ValueError, match=r"trainer\.max_steps"):
        finished_run(tmp_path, new)


def test_step_metrics_only_on_the_steps_lightning_writes(tmp_path):
    """train/loss and perf/* are computed (CUDA synchronised, timed) and logged on every log_every_n_steps-th step only."""
    cfg = make_cfg(tmp_path, FAST + ["trainer.max_steps=20", "trainer.log_every_n_steps=5"])
    train_mod.train(cfg)
    rows = read_csv(tmp_path)
    logged = [4, 9, 14, 19]
    for key in ("train/loss", "perf/step_time_s", "perf/tokens_per_s", "perf/peak_mem_mb"):
        assert [s for s, _ in column(rows, key)] == logged, key
    assert all(v > 0 for _, v in column(rows, "perf/step_time_s"))


def test_cli_multirun_past_its_deadline_starts_no_job_and_the_same_command_runs_them(tmp_path, train_py_in_process):
    root = Path(train_mod.__file__).resolve().parent
    sweep = tmp_path / "sweep"
    args = JOB + ["trainer.max_steps=3", "trainer.val_check_interval=3", f"hydra.sweep.dir={sweep}",
                  "attention=flash,linear"]
    # both launches in this interpreter (a multirun's process: test_train.py's W&B multirun)
    first = train_py_in_process(root, "-m", *args, f"stop_at={time.time() - 1:.0f}", env={"COLUMNS": "400"})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "2 job(s)" in first.stdout and "not started (stop_at had passed" in first.stdout, first.stdout[-2000:]
    assert "unfinished" not in first.stdout, "jobs that never started are not called stopped or failed"
    assert not list(sweep.glob("*/final_metrics.json")) and not list(sweep.glob("*/csv"))
    again = train_py_in_process(root, "-m", *args, env={"COLUMNS": "400"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sorted(p.parent.name for p in sweep.glob("*/final_metrics.json")) == ["attention=flash", "attention=linear"]
    assert "attn-zoo multirun: 2 jobs" in again.stdout and "unfinished" not in again.stdout


def test_cli_multirun_with_a_failing_job_still_summarizes_and_exits_1(tmp_path, train_py_in_process):
    """Hydra runs every job, then raises the first failure (status 1) without calling on_multirun_end: the summary
    (table, summary.csv) is still written, the failed job is named with its error (failed.json), and a later launch
    where the job runs to its end removes the mark. (The launch in this interpreter: Hydra's exit status as the
    process's; a multirun's process: the test above.)"""
    root = Path(train_mod.__file__).resolve().parent
    sweep = tmp_path / "sweep"
    # the failing job first: Hydra still runs the next one (the summary must not say the sweep was cut short)
    args = JOB + ["trainer.val_check_interval=3", f"hydra.sweep.dir={sweep}", "trainer.max_steps=0,3"]
    r = train_py_in_process(root, "-m", *args, env={"COLUMNS": "400"})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    ok, bad = sweep / "trainer.max_steps=3", sweep / "trainer.max_steps=0"
    assert (ok / "final_metrics.json").is_file() and not (ok / "failed.json").exists()
    err = json.loads((bad / "failed.json").read_text())["error"]
    assert err.startswith("ConfigError: ") and "trainer.max_steps=0" in err  # a ValueError, printed without traceback
    assert "a job failed, so Hydra ends with its error after the sweep" in r.stdout and "1 job(s)" in r.stdout and "failed" in r.stdout
    assert f"trainer.max_steps=0: ConfigError: " in r.stdout and "attn-zoo multirun: 1 jobs" in r.stdout
    assert (sweep / "summary.csv").read_text().count("trainer.max_steps=3") == 1
    assert "unfinished" not in r.stdout, "a failed job is not called unfinished"
    # the same folder later runs to its end (here: a config that validates, in a single-job sweep)
    from harness.callbacks import MultirunJobs
    from harness.runs import mark_failed

    mark_failed(bad, None)
    assert not (bad / "failed.json").exists()
    MultirunJobs().on_job_end(OmegaConf.create({"hydra": {"mode": "RUN", "runtime": {"output_dir": str(bad)}}}), None)
    assert not (bad / "failed.json").exists()


def test_multirun_table_prints_bracketed_job_names_and_names_unfinished_jobs(tmp_path, capsys):
    """Job folders of list overrides (model.layers=[a,b]) are printed as they are, not read as rich markup; jobs
    without final_metrics.json are named as unfinished."""
    from harness.callbacks import MultirunJobs

    done = tmp_path / "model.layers=[linear,flash]"
    (done / ".hydra").mkdir(parents=True)
    (done / "final_metrics.json").write_text(json.dumps({"job": {"num": 0}, "variant": "linear+flash", "steps": 3,
                                                         "metrics": {"val/acc": 0.5}, "wall_s": 1.0}))
    (tmp_path / "model.layers=[flash,flash]" / ".hydra").mkdir(parents=True)
    MultirunJobs().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    out = capsys.readouterr().out
    assert "model.layers=[linear,flash]" in out
    assert "1 job(s)" in out and "unfinished" in out and "model.layers=[flash,flash]" in out


def test_multirun_summary_tells_jobs_not_started_from_unfinished_ones(tmp_path, capsys):
    """A job that stop_at kept from starting is listed as not started, apart from the unfinished ones (stopped,
    interrupted or failed), each list with its count; a later launch that starts the job (here it fails) removes
    the mark, so a failure is not reported as not started."""
    from harness.callbacks import MultirunJobs

    late, failed = tmp_path / "attention=linear", tmp_path / "attention=flash"
    for job in (late, failed):  # Hydra writes a job's .hydra/ before it calls main()
        (job / ".hydra").mkdir(parents=True)
    assert main(make_cfg(late, JOB + [f"stop_at={time.time() - 5:.0f}"])) is None
    summary = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    MultirunJobs().on_multirun_end(summary)
    lines = capsys.readouterr().out.splitlines()
    [not_started] = [line for line in lines if "not started" in line]
    [unfinished] = [line for line in lines if "unfinished" in line]
    assert "1 job(s)" in not_started and "(stop_at had passed" in not_started
    assert not_started.endswith(": attention=linear")
    assert "1 job(s)" in unfinished and "interrupted or failed" in unfinished
    assert unfinished.endswith(": attention=flash")

    with pytest.raises(ValueError, match="trainer.max_steps=0"):
        main(make_cfg(late, JOB + ["trainer.max_steps=0"]))
    assert not (late / "not_started.json").exists()
    MultirunJobs().on_multirun_end(summary)
    out = capsys.readouterr().out
    assert "not started" not in out and "2 job(s)" in out and "attention=flash, attention=linear" in out


class CrashAt(__import__("lightning").Callback):
    """Raises (a crash or a kill: no Ctrl-C checkpoint) as the batch after optimizer step ``step`` starts."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


def test_last_checkpoint_is_current_after_every_validation(tmp_path):
    """With the experiments' checkpoint settings (save_top_k 0) and with a monitor that stops improving, a run that
    dies after a validation resumes from that validation's step, not from scratch or from the best step."""
    for extra in ([], ["callbacks.checkpoint.monitor=val/acc", "callbacks.checkpoint.mode=max",
                       "callbacks.checkpoint.save_top_k=1"]):
        run = tmp_path / f"run{len(extra)}"
        crash = ["+callbacks.crash._target_=test_resume_unfinished.CrashAt", "+callbacks.crash.step=25"]
        with pytest.raises(RuntimeError, match="killed"):
            train_mod.train(make_cfg(run, JOB + ["trainer.val_check_interval=10"] + extra + crash))
        assert checkpoint_info(run / "checkpoints" / "last.ckpt").step == 20, extra


@pytest.mark.parametrize("val_every", [10, 15])
def test_a_stopped_run_resumes_on_the_uninterrupted_schedule(tmp_path, monkeypatch, val_every):
    """The deadline's check (every 10 steps) lands on a validation step (10) or between two (15): the resumed run
    logs its validations and steps where an uninterrupted run does, and ends at trainer.max_steps."""
    cfg = JOB + [f"trainer.val_check_interval={val_every}"]
    whole = tmp_path / "whole"
    train_mod.train(make_cfg(whole, cfg))
    _stop_now(monkeypatch)
    cut = tmp_path / "cut"
    main(make_cfg(cut, cfg + [_later()]))
    assert checkpoint_info(cut / "checkpoints" / "last.ckpt").step == 10
    monkeypatch.setattr(cb_mod, "_clock", time.time)
    main(make_cfg(cut, cfg))
    for key in ("val/loss", "train/loss"):
        assert [s for s, _ in column(read_csv(cut), key)] == [s for s, _ in column(read_csv(whole), key)], key
    assert json.loads((cut / "final_metrics.json").read_text())["steps"] == 30
    assert checkpoint_info(cut / "checkpoints" / "last.ckpt").step == 30


def test_a_deadline_passed_at_the_start_of_training_trains_no_step(tmp_path, monkeypatch):
    """What a DDP rank started after the deadline does (main() leaves the decision to all ranks): no step, no
    final table, no error."""
    _stop_now(monkeypatch, at_start=True)
    assert train_mod.train(make_cfg(tmp_path, JOB + [_later()])) == {}
    assert not (tmp_path / "final_metrics.json").exists()
    assert not (tmp_path / "csv" / "metrics.csv").exists() or not column(read_csv(tmp_path), "train/loss")


EARLY_STOP = ["+callbacks.early_stop._target_=lightning.pytorch.callbacks.EarlyStopping",
              "+callbacks.early_stop.monitor=val/loss", "+callbacks.early_stop.stopping_threshold=100.0",
              "+callbacks.early_stop.check_on_train_epoch_end=false"]  # stops at the first validation (step 15)
# two epochs of 256 / 16 = 16 steps, no step limit; the last validation (step 32) ends the second epoch, so last.ckpt
# is written there, before Lightning counts that epoch as done
EPOCHS = ["trainer.max_steps=-1", "trainer.max_epochs=2", "data.num_train=256", "trainer.val_check_interval=16"]


@pytest.mark.parametrize("extra, steps", [([], 30), (EARLY_STOP, 15), (EPOCHS, 32)],
                         ids=["max_steps", "early_stop", "max_epochs"])
def test_a_run_killed_in_its_final_validation_is_only_validated_and_finalised(tmp_path, monkeypatch, extra, steps):
    """Training ended (trainer.max_steps reached, trainer.max_epochs trained, or EarlyStopping stopped it) and the
    process died in the final validation, before final_metrics.json: the same command trains no step (it used to
    start over, or to train past the early stop; an epoch run was validated without its train/* metrics and logged
    its validation a step early), validates the checkpoint and writes the final table an uninterrupted run writes."""
    import lightning as L

    from harness.lit import LitLM

    whole = tmp_path / "whole"
    main(make_cfg(whole, JOB + extra))
    cut = tmp_path / "cut"

    def killed(*args, **kwargs):
        raise RuntimeError("killed in the final validation")

    with monkeypatch.context() as m:
        m.setattr(L.Trainer, "validate", killed)
        with pytest.raises(RuntimeError, match="killed"):
            main(make_cfg(cut, JOB + extra))
    ckpt = cut / "checkpoints" / "last.ckpt"
    info = checkpoint_info(ckpt)
    assert info.step == steps and info.stopped == (extra is EARLY_STOP) and not (cut / "final_metrics.json").exists()
    if extra is EPOCHS:
        assert info.epochs == 2, "both epochs trained, though Lightning had not counted the second one yet"
    assert resumable_checkpoint(cut, make_cfg(cut, JOB + extra)) == (str(ckpt), None)
    (cut / "final_metrics.json").write_text('{"steps": ')  # a final table cut off as it was written counts as none

    trained = []
    step = LitLM.training_step
    monkeypatch.setattr(LitLM, "training_step", lambda self, *a, **k: trained.append(1) or step(self, *a, **k))
    value = main(make_cfg(cut, JOB + extra))
    assert trained == [], "a complete checkpoint is not trained further"
    done, ref = (json.loads((d / "final_metrics.json").read_text()) for d in (cut, whole))
    assert done["steps"] == ref["steps"] == steps and done["resumed_from"] == str(ckpt)
    assert done["metrics"] == pytest.approx(ref["metrics"], rel=1e-6), "the final table of the uninterrupted run"
    assert math.isclose(value, done["metrics"]["val/loss"], rel_tol=1e-6)
    assert not list(cut.glob("*.replaced-*")), "nothing was started over"
    for key in ("val/loss", "train/loss"):  # the same rows: the final validation logged at the last step too
        got, want = column(read_csv(cut), key), column(read_csv(whole), key)
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), key

    # a finished run (final_metrics.json) is not finalised again: resuming it still asks for more steps (epochs)
    if extra is EPOCHS:
        with pytest.raises(ValueError, match=r"already trained 2 epoch\(s\) \(step 32\) and trainer.max_epochs=2 "
                                             r"leaves nothing to train.*trainer.max_epochs > 2"):
            train_mod.train(make_cfg(cut, JOB + extra + [f"ckpt_path={ckpt}"]))
        return
    with pytest.raises(ValueError, match=rf"reached step {steps} and trainer.max_steps={steps} leaves nothing to "
                                         rf"train.*trainer.max_steps > {steps}"):
        train_mod.train(make_cfg(cut, JOB + extra + [f"ckpt_path={ckpt}", f"trainer.max_steps={steps}"]))
    if extra:  # an early-stopped run is complete at any trainer.max_steps
        with pytest.raises(ValueError, match=r"stopped at step 15 by a callback .*EarlyStopping.* nothing to train"):
            train_mod.train(make_cfg(cut, JOB + extra + [f"ckpt_path={ckpt}", "trainer.max_steps=60"]))


def test_wall_s_of_a_resumed_run_counts_every_launch(tmp_path, monkeypatch):
    """wall_s in final_metrics.json: the first launch's time up to its checkpoint (stored in it) plus the resumed
    launch's time, not the last launch's alone. Load-independent: the stored total is set to 1000 s before the
    resume, and each launch sleeps 2 s in its data setup, so every bound below holds however busy the machine is."""
    from harness.runs import RUN_STATE_KEY

    build = train_mod.build_datamodule

    def slow(cfg):
        time.sleep(2.0)  # data setup counts: wall_s runs from the start of train()
        return build(cfg)

    monkeypatch.setattr(train_mod, "build_datamodule", slow)
    _stop_now(monkeypatch)
    main(make_cfg(tmp_path, JOB + [_later()]))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert checkpoint_info(ckpt).step == 10 and checkpoint_info(ckpt).wall_s >= 2.0, "the first launch's time is stored"
    ck = torch.load(str(ckpt), map_location="cpu", weights_only=False)
    ck[RUN_STATE_KEY]["wall_s"] = 1000.0
    torch.save(ck, str(ckpt))

    monkeypatch.setattr(cb_mod, "_clock", time.time)
    t0 = time.time()
    main(make_cfg(tmp_path, JOB))
    second = time.time() - t0
    done = json.loads((tmp_path / "final_metrics.json").read_text())
    assert done["resumed_from"] == str(ckpt) and done["steps"] == 30
    assert 1000.0 + 2.0 - 0.05 <= done["wall_s"] <= 1000.0 + second + 0.05, (done["wall_s"], second)
    stored = checkpoint_info(ckpt).wall_s
    assert 1000.0 + 2.0 <= stored <= done["wall_s"] + 0.05, ("the total goes on in the checkpoint", stored)


def test_a_job_that_starts_over_keeps_the_earlier_metrics_aside(tmp_path, monkeypatch):
    """Another config in a stopped job's folder starts over: the earlier csv/ (metrics.csv, hparams.yaml) is kept
    aside with its checkpoints (same replaced-<time> stamp), not overwritten."""
    _stop_now(monkeypatch)
    main(make_cfg(tmp_path, JOB + [_later()]))
    monkeypatch.setattr(cb_mod, "_clock", time.time)
    main(make_cfg(tmp_path, JOB + ["optim.lr=3e-3"]))
    kept = list(tmp_path.glob("csv.replaced-*"))
    assert len(kept) == 1, sorted(p.name for p in tmp_path.iterdir())
    stamp = kept[0].name.split("replaced-")[1]
    assert (tmp_path / f"checkpoints.replaced-{stamp}" / "last.ckpt").is_file()
    with open(kept[0] / "metrics.csv") as f:
        earlier = list(csv.DictReader(f))
    assert [s for s, _ in column(earlier, "train/loss")] == list(range(10)), "the earlier run's rows"
    assert OmegaConf.load(kept[0] / "hparams.yaml").config.optim.lr == 1e-2
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(30))
    assert OmegaConf.load(tmp_path / "csv" / "hparams.yaml").config.optim.lr == 3e-3


def test_metrics_csv_in_the_run_folder_itself_is_kept_aside_as_a_file(tmp_path):
    """A CSV logger writing into the run folder (name and version empty): only its metrics.csv is moved aside."""
    from harness.runs import ContinuedCSVLogger

    (tmp_path / "metrics.csv").write_text("step,train/loss\n0,1.0\n")
    (tmp_path / "run_config.json").write_text("{}")
    train_mod._keep_earlier_run_aside(str(tmp_path), [ContinuedCSVLogger(save_dir=str(tmp_path), name="", version="")])
    kept = list(tmp_path.glob("metrics.replaced-*.csv"))
    assert len(kept) == 1 and kept[0].read_text() == "step,train/loss\n0,1.0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept[0].name, "run_config.json"])


def test_an_extension_that_ends_before_its_next_logged_step_keeps_the_last_train_metrics(tmp_path):
    """trainer.log_every_n_steps=5: 10 steps log train/* at steps 4 and 9; extended to 13 steps the run logs none (the
    next would be step 14). final_metrics.json still holds the last logged train/loss and learning rates (step 9's,
    kept in the checkpoint's RunState), as metrics.csv has them; it had none of them."""
    log5 = FAST + ["trainer.log_every_n_steps=5", "trainer.val_check_interval=5"]
    train_mod.train(make_cfg(tmp_path, log5 + ["trainer.max_steps=10"]))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    train_mod.train(make_cfg(tmp_path, log5 + ["trainer.max_steps=13", f"ckpt_path={ckpt}"]))
    done = json.loads((tmp_path / "final_metrics.json").read_text())
    assert done["steps"] == 13 and done["resumed_from"] == str(ckpt)
    rows = read_csv(tmp_path)
    for key in ("train/loss", "train/lr", "train/lr_no_decay"):
        step, value = column(rows, key)[-1]
        assert step == 9, (key, column(rows, key))
        assert done["metrics"][key] == pytest.approx(value, rel=1e-6), key
    assert checkpoint_info(ckpt).train_metrics == pytest.approx({k: done["metrics"][k] for k in (
        "train/loss", "train/lr", "train/lr_no_decay")}, rel=1e-6), "the next extension carries them on"
