"""Edges of ``train.py`` found by a new-user test: optimizer overrides on resume, a schedule shorter than its warmup,
``trainer.max_steps`` of 0 / -1 / a string, ``optim.*`` values that are not numbers, the progress bar in a log file,
the final table's title in a multirun."""

import json
import re
import math
import os
import subprocess
import sys

import pytest
import torch

import train as train_mod
from harness.lit import LitLM, cosine_with_warmup
from test_train import FAST, ROOT, column, make_cfg, read_csv

TINY = dict(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8)
FLASH = [dict(kind="flash", causal=True)]


# ------------------------------------------------------------------------------------------ 2: LR multiplier edges
def test_cosine_with_warmup_edges():
    f = cosine_with_warmup
    # the usual schedule: warmup 5, cosine from 1 to min_lr_ratio at total_steps, floor after
    assert [f(s, 5, 20, 0.1) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert f(5, 5, 20, 0.1) == pytest.approx(1.0)
    assert f(19, 5, 20, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 14 / 15)))
    assert f(20, 5, 20, 0.1) == pytest.approx(0.1) and f(10_000, 5, 20, 0.1) == pytest.approx(0.1)
    # a schedule shorter than (or as long as) its warmup: the warmup is capped at total_steps, the floor after it;
    # never the full LR past the end (was 1.0 for every step >= warmup_steps)
    assert [f(s, 50, 10, 0.1) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert all(f(s, 50, 10, 0.1) == pytest.approx(0.1) for s in (10, 49, 50, 59, 999))
    assert f(9, 10, 10, 0.1) == pytest.approx(1.0) and f(10, 10, 10, 0.1) == pytest.approx(0.1)
    # no warmup
    assert f(0, 0, 10, 0.1) == pytest.approx(1.0) and f(10, 0, 10, 0.1) == pytest.approx(0.1)
    assert f(0, 0, 1, 0.0) == pytest.approx(1.0) and f(1, 0, 1, 0.0) == 0.0
    # no known length: warmup then 1
    assert f(2, 4, None, 0.1) == pytest.approx(0.75) and f(100, 4, None, 0.1) == 1.0
    for total in (1, 2, 3, 10, 60):  # in (0, 1] everywhere, continuous ramp, floor from total on
        vals = [f(s, 50, total, 0.1) for s in range(total + 5)]
        assert all(0 < v <= 1 for v in vals) and vals[total:] == pytest.approx([0.1] * 5)


# ------------------------------------------------------------------------------------------ 1 + 2: resume
def test_resume_refuses_other_optimizer_settings_and_a_short_run_extends_at_the_floor(tmp_path):
    """A 4-step run (shorter than its 5 warmup steps) extended to 8: steps 4-7 run at lr * min_lr_ratio (they ran at
    the full LR); an override of optim.lr / warmup_steps / min_lr_ratio / betas / weight_decay / _target_ that
    differs from the checkpoint is refused naming the key and both values (the checkpoint's value was used and the
    override recorded); final_metrics.json records the optimizer and schedule that ran."""
    run = tmp_path / "run"
    train_mod.train(make_cfg(run, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4"]))
    ckpt = run / "checkpoints" / "last.ckpt"
    hp_before = (run / "csv" / "hparams.yaml").read_text()
    refused = [
        (["optim.lr=1e-3"], r"optim.lr: checkpoint 0.01, this run 0.001"),
        (["optim.warmup_steps=0"], r"optim.warmup_steps: checkpoint 5, this run 0"),
        (["optim.min_lr_ratio=0.5"], r"optim.min_lr_ratio: checkpoint 0.1, this run 0.5"),
        (["optim.betas=[0.8,0.9]"], r"optim.betas: checkpoint \[0.9, 0.95\], this run \[0.8, 0.9\]"),
        (["optim.weight_decay=0.0"], r"optim.weight_decay: checkpoint 0.1, this run 0.0"),
        (["optim._target_=torch.optim.Adam"], r"optim._target_: checkpoint 'torch.optim.AdamW', this run 'torch.optim.Adam'"),
    ]
    for extra, match in refused:
        with pytest.raises(ValueError, match=r"^ckpt_path: the optimizer / LR schedule differs") as e:
            train_mod.train(make_cfg(tmp_path / "x", FAST + ["trainer.max_steps=8", f"ckpt_path={ckpt}"] + extra))
        assert __import__("re").search(match, str(e.value)), (extra, str(e.value))
    with pytest.raises(ValueError, match=r"optim.lr: checkpoint 0.01, this run 0.001; optim.warmup_steps: "
                                         r"checkpoint 5, this run 0\).*\(optim.lr=0.01 optim.warmup_steps=5\)"):
        train_mod.train(make_cfg(tmp_path / "x", FAST + ["trainer.max_steps=8", f"ckpt_path={ckpt}", "optim.lr=1e-3",
                                                         "optim.warmup_steps=0"]))
    assert (run / "csv" / "hparams.yaml").read_text() == hp_before, "a refused resume must not touch the run"
    assert not (run / "final_metrics.json").read_text().count("0.001")

    # the same settings (and implementation-only keys such as foreach) resume; the extension runs at the floor
    train_mod.train(make_cfg(tmp_path / "x", FAST + ["trainer.max_steps=8", "trainer.val_check_interval=4",
                                                     f"ckpt_path={ckpt}", "+optim.foreach=false"]))
    lr = dict(column(read_csv(run), "train/lr"))
    assert sorted(lr) == list(range(8))
    assert [lr[s] for s in range(4)] == pytest.approx([1e-2 * (s + 1) / 4 for s in range(4)], rel=1e-5)
    assert [lr[s] for s in range(4, 8)] == pytest.approx([1e-2 * 0.1] * 4, rel=1e-5), \
        "past the first run's 4 steps the LR is lr * min_lr_ratio, not the full LR"
    final = json.loads((run / "final_metrics.json").read_text())
    assert final["steps"] == 8 and final["result_config"]["optim"]["lr"] == 1e-2
    # the warmup that ran: 5 steps asked, capped at the schedule's 4 (result_config keeps the setting)
    assert final["lr_schedule"] == {"total_steps": 4, "warmup_steps": 4, "min_lr_ratio": 0.1}
    assert final["result_config"]["optim"]["warmup_steps"] == 5


def test_checkpoint_hparams_of_an_older_run_compare_folded():
    """Checkpoints from before the optimizer was a config keep flat lr / weight_decay / betas: compared as LitLM folds
    them; a checkpoint without optimizer hparams compares only the architecture."""
    lit = LitLM(TINY, FLASH, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=50)
    saved = {"model_config": dict(TINY), "layer_specs": FLASH, "lr": 3e-3, "weight_decay": 0.1, "betas": (0.9, 0.95),
             "warmup_steps": 50, "min_lr_ratio": 0.1}
    lit.check_checkpoint_hparams(saved)
    lit.check_checkpoint_hparams({"model_config": dict(TINY)})
    with pytest.raises(ValueError, match=r"^ckpt_path: .*optim.lr: checkpoint 0.001, this run 0.003"):
        lit.check_checkpoint_hparams(dict(saved, lr=1e-3))


# ------------------------------------------------------------------------------------------ 3 + 4: bad values
@pytest.mark.parametrize("override, match", [
    ("trainer.max_steps=0", r"trainer.max_steps=0: must be a positive integer.*trainer.max_steps=1000"),
    ("trainer.max_steps=-5", r"trainer.max_steps=-5: must be a positive integer"),
    ("trainer.max_steps=abc", r"trainer.max_steps='abc': must be a positive integer"),
    ("trainer.max_steps=2.5", r"trainer.max_steps=2.5: must be a positive integer"),
    ("trainer.max_steps=-1", r"trainer.max_steps=-1 sets no step limit.*set trainer.max_steps=<N>.*trainer.max_epochs=<N>"),
    ("trainer.max_steps=null", r"trainer.max_steps=None sets no step limit"),
    ("trainer.max_epochs=0", r"trainer.max_epochs=0: must be null, a positive integer"),
    ("optim.lr=abc", r"optim.lr='abc': must be a positive number"),
    ("optim.lr=-1", r"optim.lr=-1: must be a positive number"),
    ("optim.lr=0", r"optim.lr=0: must be a positive number"),
    ("optim.weight_decay=-0.1", r"optim.weight_decay=-0.1: must be a number >= 0"),
    ("optim.weight_decay=abc", r"optim.weight_decay='abc': must be a number >= 0"),
    ("optim.warmup_steps=-1", r"optim.warmup_steps=-1: must be an integer >= 0"),
    ("optim.warmup_steps=2.5", r"optim.warmup_steps=2.5: must be an integer >= 0"),
    ("optim.min_lr_ratio=1.5", r"optim.min_lr_ratio=1.5: must be a number in \[0, 1\]"),
    ("optim.min_lr_ratio=abc", r"optim.min_lr_ratio='abc': must be a number in \[0, 1\]"),
    ("optim.betas=[0.9]", r"optim.betas=\[0.9\]: must be two numbers in \[0, 1\)"),
    ("trainer.enable_progress_bar=maybe", r"trainer.enable_progress_bar='maybe': must be true, false or auto"),
    ("trainer.accumulate_grad_batches=0", r"trainer.accumulate_grad_batches=0: must be a positive integer"),
    ("trainer.accumulate_grad_batches=2", r"trainer.accumulate_grad_batches=2 with trainer.val_check_interval=15: "
                                          r"Lightning counts val_check_interval in training batches.*set "
                                          r"trainer.accumulate_grad_batches=1 \(the only value allowed"),
    ("trainer.val_check_interval=0.5", r"trainer.val_check_interval=0.5: with trainer.check_val_every_n_epoch=null.*"
                                       r"must be a positive integer.*trainer.check_val_every_n_epoch=<N>"),
    ("trainer.val_check_interval=20.0", r"trainer.val_check_interval=20.0: with trainer.check_val_every_n_epoch=null"),
    ("trainer.val_check_interval=0", r"trainer.val_check_interval=0: with trainer.check_val_every_n_epoch=null"),
    # a seed that is not an integer failed inside int() / numpy naming no key; a string compile / skip_finished
    # counted as true
    ("seed=abc", r"seed='abc': must be an integer in \[0, 2\*\*32 - 1\]"),
    ("seed=-1", r"seed=-1: must be an integer in \[0, 2\*\*32 - 1\]"),
    ("seed=1.5", r"seed=1.5: must be an integer"),
    ("compile=maybe", r"compile='maybe': must be true or false"),
    pytest.param("trainer=gpu", r"trainer.accelerator=gpu \(trainer=gpu.*no CUDA GPU is visible; on a CPU pass "
                                r"trainer=default", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CPU only")),
    ("skip_finished=maybe", r"skip_finished='maybe': must be true or false"),
])
def test_bad_values_fail_before_anything_is_written(tmp_path, override, match):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        train_mod.train(make_cfg(out, FAST + [override]))
    assert not out.exists(), "the error must come before the output dir, loggers or data caches are created"


def test_accumulation_is_refused_with_a_step_validation_interval_because_lightning_counts_batches(tmp_path,
                                                                                                   monkeypatch):
    """Why trainer.accumulate_grad_batches > 1 is refused with an integer trainer.val_check_interval: Lightning
    validates (and ModelCheckpoint writes last.ckpt) every val_check_interval batches, here every 2 optimizer steps
    instead of every 4, off the step schedule of trainer.max_steps that stop_at / resume keep. If Lightning ever
    counts optimizer steps this fails and the refusal can go. Accumulation alone stays allowed."""
    train_mod.validate_config(make_cfg(tmp_path, FAST + ["trainer.accumulate_grad_batches=2", "trainer.max_epochs=1",
                                                         "trainer.check_val_every_n_epoch=1",
                                                         "trainer.val_check_interval=1.0"]))
    monkeypatch.setattr(train_mod, "validate_config", lambda cfg: None)
    train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4",
                                               "trainer.accumulate_grad_batches=2"]))
    rows = read_csv(tmp_path)
    assert [s for s, _ in column(rows, "train/loss")] == [0, 1, 2, 3], "4 optimizer steps of 2 batches each"
    # in-fit validations after optimizer steps 2 and 4 (logged at 1 and 3); the final one, of the model validated at
    # step 4 already, is not logged again
    assert [s for s, _ in column(rows, "val/loss")] == [1, 3]


def test_max_steps_minus_one_with_max_epochs_trains_epochs(tmp_path):
    """-1 (no step limit) is allowed with trainer.max_epochs: one epoch of 512 / 16 = 32 steps."""
    metrics = train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=-1", "trainer.max_epochs=1",
                                                         "trainer.val_check_interval=32"]))
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(32))
    assert math.isfinite(metrics["val/loss"])
    assert json.loads((tmp_path / "final_metrics.json").read_text())["lr_schedule"]["total_steps"] == 32


def test_cli_max_steps_zero_fails_naming_the_key(tmp_path, train_py_in_process):
    """(The launch in this interpreter; a refusal as a process: the refused multirun below.)"""
    r = train_py_in_process(ROOT, "logger=csv", "trainer.max_steps=0", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode != 0
    assert "trainer.max_steps=0: must be a positive integer" in r.stderr + r.stdout
    assert not (tmp_path / "run" / "final_metrics.json").exists() and not (tmp_path / "run" / "csv").exists()


def test_two_hydra_modes_are_a_usage_error(tmp_path, train_py_in_process):
    """``-m`` with ``--cfg`` (or two other Hydra modes) is refused with one line naming both, not Hydra's traceback;
    one mode alone passes through."""
    f = train_mod.hydra_mode_conflict
    assert f(["-m", "--cfg", "job"]) == f(["--multirun", "-c", "job", "seed=1"])
    assert "--cfg and --multirun cannot be combined" in f(["-m", "--cfg", "job"])
    assert "--info and --run" in f(["--run", "--info"])
    for one in (["-m", "seed=0,1"], ["--cfg", "job", "seed=1"], ["--cfg=job"], [], ["attention=flash"]):
        assert f(one) is None, one
    r = train_py_in_process(ROOT, "-m", "--cfg", "job")  # train.py's __main__ block, in this interpreter
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--cfg and --multirun cannot be combined" in r.stderr


# ------------------------------------------------------------------------------------------ 5: progress bar
def _bar_callbacks(tmp_path, monkeypatch, tty, extra=()):
    from lightning.pytorch.callbacks import ProgressBar

    monkeypatch.setattr(train_mod, "_stdout_is_tty", lambda: tty)
    args = [a for a in FAST if not a.startswith("trainer.enable_progress_bar")] + list(extra)
    trainer = train_mod.build_trainer(make_cfg(tmp_path, args), [], str(tmp_path))
    return [type(c).__name__ for c in trainer.callbacks if isinstance(c, ProgressBar)]


def test_trainer_quiet_defaults_keep_the_settings(tmp_path, caplog):
    """The default ``trainer.limit_val_batches: 1.0`` reaches Lightning as its default (None: no "100% of the
    batches" notice) and still validates every batch; another value passes through; Lightning's litlogger tip is
    dropped from its rank-zero log, its other lines are kept."""
    import logging

    FAST_NO_LIMIT = [a for a in FAST if not a.startswith("trainer.limit_val_batches")]
    assert train_mod.build_trainer(make_cfg(tmp_path / "a", FAST_NO_LIMIT), [], str(tmp_path)).limit_val_batches == 1.0
    two = train_mod.build_trainer(make_cfg(tmp_path / "b", FAST_NO_LIMIT + ["trainer.limit_val_batches=2"]), [],
                                  str(tmp_path))
    assert two.limit_val_batches == 2
    rz = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=rz.name):
        rz.info("Tip: try installing [litlogger](https://pypi.org/project/litlogger/)")
        rz.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records if r.name == rz.name] == ["GPU available: False, used: False"]


def test_progress_bar_is_off_by_default_when_stdout_is_not_a_terminal(tmp_path, monkeypatch):
    assert make_cfg(tmp_path, []).trainer.enable_progress_bar == "auto"
    assert _bar_callbacks(tmp_path, monkeypatch, tty=False) == [], "a log file would get one bar update per step"
    assert _bar_callbacks(tmp_path, monkeypatch, tty=True) == ["StepProgressBar"]
    # an explicit setting wins over the terminal check
    assert _bar_callbacks(tmp_path, monkeypatch, tty=False, extra=["trainer.enable_progress_bar=true"]) == \
        ["StepProgressBar"]
    assert _bar_callbacks(tmp_path, monkeypatch, tty=True, extra=["trainer.enable_progress_bar=false"]) == []


def test_cli_output_to_a_file_has_no_progress_bar(tmp_path):
    env = dict(os.environ, WANDB_MODE="disabled")
    args = [a for a in FAST if not a.startswith("trainer.enable_progress_bar")]
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "train.py", *args, "trainer.max_steps=3", "trainer.val_check_interval=3",
                            f"paths.cache_dir={tmp_path / 'c'}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                           env=env, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=240)
    text = log.read_text()
    assert r.returncode == 0, text[-3000:]
    assert "\r" not in text and not re.search(r"step:\s*\d+%", text), text[-2000:]  # the bar's "step: 45%|"
    assert "val/loss" in text  # the final table still prints


# ------------------------------------------------------------------------------------------ 6: multirun title
def test_final_table_title_names_the_multirun_job(tmp_path, monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write


    cfg = make_cfg(tmp_path, ["attention=linear", "optim.lr=1e-3", "trainer.enable_progress_bar=false"],
                   return_hydra_config=True)
    assert train_mod.table_title(cfg) == "attn-zoo: default"  # Hydra not running (train() called directly)
    hc = HydraConfig.instance()
    saved = hc.cfg
    try:
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.job.num = 1
        hc.set_config(cfg)
        assert train_mod.table_title(cfg) == "attn-zoo: default"
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.MULTIRUN
        hc.set_config(cfg)
        sweep = tmp_path / "sweep"
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.sweep.dir = str(sweep)
        hc.set_config(cfg)
        assert train_mod.table_title(cfg) == "attn-zoo: default / attention=linear,optim.lr=1e-3"  # no multirun.yaml
        sweep.mkdir()
        (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: [attention=linear, 'optim.lr=1e-3,1e-2']\n")
        assert train_mod.table_title(cfg) == "attn-zoo: default / optim.lr=1e-3"
    finally:
        hc.cfg = saved


# ------------------------------------------------------------------------------------------ a new run over a finished one
def test_a_new_run_in_a_finished_runs_folder_is_not_marked_finished_before_it_ends(tmp_path):
    """A job re-run in the folder of a finished run (skip_finished found no matching result_config, or a reused
    run dir) rewrites metrics.csv from step 0; the earlier final_metrics.json is moved aside as soon as training
    starts, so a run cut off mid-way is not read as finished with the earlier run's final table."""
    run = tmp_path / "run"
    (run).mkdir()
    (run / "final_metrics.json").write_text(json.dumps({"steps": 999, "metrics": {"val/acc": 0.5}}))

    class Cut(Exception):
        pass

    import lightning as L

    class CutAtStep2(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 2:
                assert not (run / "final_metrics.json").exists(), "the earlier final table is still in place"
                raise Cut

    orig = train_mod.build_trainer

    def with_cut(cfg, loggers, output_dir, **kwargs):
        trainer = orig(cfg, loggers, output_dir, **kwargs)
        trainer.callbacks.append(CutAtStep2())
        return trainer

    train_mod.build_trainer = with_cut
    try:
        with pytest.raises(Cut):
            train_mod.train(make_cfg(run, FAST + ["trainer.max_steps=6"]))
    finally:
        train_mod.build_trainer = orig
    kept = list(run.glob("final_metrics.replaced-*.json"))
    assert not (run / "final_metrics.json").exists() and len(kept) == 1
    assert json.loads(kept[0].read_text())["steps"] == 999
    train_mod.train(make_cfg(run, FAST + ["trainer.max_steps=3", "trainer.val_check_interval=3"]))
    assert json.loads((run / "final_metrics.json").read_text())["steps"] == 3


def test_a_trainer_value_lightning_refuses_leaves_the_earlier_run_in_its_folder(tmp_path):
    """A new run in the folder of a finished one, with a trainer.* value that only Lightning checks (here
    trainer.precision), fails before the earlier run's final table, checkpoints and metrics are moved aside or its
    run_config.json rewritten."""
    run = tmp_path / "run"
    train_mod.train(make_cfg(run, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4"]))
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(Exception, match="precision"):
        train_mod.train(make_cfg(run, FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4",
                                              "trainer.precision=not-a-precision"]))
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert not [p for p in after if "replaced" in str(p)]
    changed = [p for p in before if p.suffix != ".ckpt" and after.get(p) != before[p]]
    assert not changed, changed


def test_a_checkpoint_of_a_compiled_run_loads_without_compile_and_the_other_way_round():
    """compile=true wraps the GPT (its weights are saved as model._orig_mod.*): LitLM.on_load_checkpoint names a
    checkpoint's weights as the resuming module does, so either resumes the other's checkpoint, strictly."""
    import torch

    kw = dict(model_config=TINY, layer_specs=FLASH, backend="torch")
    torch.manual_seed(0)
    plain, compiled = LitLM(**kw), LitLM(**kw, compile=True)
    assert compiled.model is not compiled.gpt and any(k.startswith("model._orig_mod.") for k in compiled.state_dict())
    for src, dst in ((compiled, plain), (plain, compiled)):
        with torch.no_grad():
            for p in src.parameters():
                p.add_(torch.randn_like(p))
        ckpt = {"hyper_parameters": dict(src.hparams), "state_dict": src.state_dict()}
        dst.on_load_checkpoint(ckpt)
        dst.load_state_dict(ckpt["state_dict"], strict=True)
        for (_, a), (_, b) in zip(sorted(src.gpt.state_dict().items()), sorted(dst.gpt.state_dict().items())):
            assert torch.equal(a, b)


def test_a_diverged_run_says_so_naming_the_learning_rate(tmp_path, caplog):
    """optim.lr=1e6 makes the loss NaN within a few steps: the run still writes its table and final_metrics.json
    (a diverged lr is a data point of a sweep), but warns once, naming the non-finite metrics and optim.lr (it
    used to end exactly like a good run)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="attn_zoo.train"):
        metrics = train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=6", "trainer.val_check_interval=6",
                                                             "optim.lr=1e6"]))
    assert math.isnan(metrics["val/loss"])
    msgs = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert len(msgs) == 1 and "val/loss=nan" in msgs[0] and "optim.lr (this run: 1000000.0)" in msgs[0]
    assert (tmp_path / "final_metrics.json").is_file()
    assert train_mod._warn_if_diverged(make_cfg(tmp_path, FAST), {"val/loss": 1.0, "train/loss": 2.0}) == []


def test_skip_finished_says_why_an_old_finished_run_runs_again(tmp_path, caplog):
    """A finished run written before final_metrics.json stored result_config (results/h200/quality/runs/mqar_recall)
    can be neither skipped nor refused: the job ran again, even with another config, and the log only said that the
    earlier files were moved aside. Now it says why."""
    import logging

    main = train_mod.main.__wrapped__
    job = FAST + ["trainer.max_steps=4", "trainer.val_check_interval=4", "skip_finished=true"]
    main(make_cfg(tmp_path, job))
    f = tmp_path / "final_metrics.json"
    rec = json.loads(f.read_text())
    rec.pop("result_config")
    f.write_text(json.dumps(rec))
    import shutil  # as committed: no checkpoints, no run_config.json
    shutil.rmtree(tmp_path / "checkpoints")
    (tmp_path / "run_config.json").unlink()
    with caplog.at_level(logging.WARNING, logger="attn_zoo.train"):
        main(make_cfg(tmp_path, job))
    msgs = [r.getMessage() for r in caplog.records if "cannot be compared" in r.getMessage()]
    assert len(msgs) == 1 and "has no result_config" in msgs[0] and "the job runs again" in msgs[0]
    assert "result_config" in json.loads(f.read_text())  # ran again, now comparable


# ------------------------------------------------------------------------------- errors name the key a user sets
@pytest.mark.parametrize("overrides,want", [
    (["trainer.gradient_clip_val=-1"], r"^trainer\.gradient_clip_val=-1: must be null or a number >= 0"),
    (["trainer.gradient_clip_val=-0.5", "+trainer.gradient_clip_algorithm=value"], r"gradient_clip_val=-0\.5"),
    (["trainer.gradient_clip_val=abc"], r"gradient_clip_val='abc'"),
    (["+trainer.gradient_clip_algorithm=clamp"], r"^trainer\.gradient_clip_algorithm='clamp' is not supported; "
                                                 r"allowed values: norm, value"),
])
def test_bad_gradient_clipping_is_refused(tmp_path, overrides, want):
    """A negative trainer.gradient_clip_val trained silently with flipped gradients (clip_grad_norm_ scales by
    clip_val / norm < 0, clip_grad_value_ sets every entry to clip_val): gradient ascent."""
    with pytest.raises(ValueError, match=want):
        train_mod.validate_config(make_cfg(tmp_path, overrides))
    for ok in (["trainer.gradient_clip_val=0"], ["trainer.gradient_clip_val=null"], ["trainer.gradient_clip_val=0.5"]):
        train_mod.validate_config(make_cfg(tmp_path, ok))
    from harness.lit import clip_gradients_

    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="gradient_clip_val=-1.0"):
        clip_gradients_([p], -1.0)
    assert torch.equal(p.grad, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("overrides,want", [
    (["model.dropout=1.5"], r"^model\.dropout must be in \[0, 1\), got 1\.5"),
    (["model.n_head=3"], r"^model\.d_model=64 must be divisible by n_head=3"),
    (["model.mlp=foo"], r"^model\.mlp='foo' is not supported; allowed values: gelu, swiglu"),
    (["model.redraw_interval=-2"], r"^model\.redraw_interval=-2: must be an integer >= 0"),
])
def test_model_config_errors_name_model_keys(tmp_path, overrides, want):
    """GPTConfig names its own fields (``dropout``); the error a user sees names the key to override."""
    with pytest.raises(ValueError, match=want):
        train_mod.validate_config(make_cfg(tmp_path, overrides))


def test_attention_and_data_errors_name_their_node(tmp_path):
    cfg = make_cfg(tmp_path, ["attention=sliding_window", "attention.window_size=3"])
    with pytest.raises(ValueError, match=r"^attention: window_size must be a pair"):
        train_mod.layer_specs(cfg)
    cfg = make_cfg(tmp_path, ["model.n_layer=2", "model.layers=[flash,{kind:sliding_window,window_size:3}]"])
    with pytest.raises(ValueError, match=r"^model\.layers\[1\]: window_size must be a pair"):
        train_mod.layer_specs(cfg)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"data\.num_workers must be an integer >= 0"):
            train_mod.build_datamodule(make_cfg(tmp_path, [f"data.num_workers={str(bad).lower()}"]))


@pytest.mark.parametrize("overrides,want", [
    (["attention_backend=nope"], r"^attention_backend='nope' is not a registered backend; allowed values: auto, "),
    (["model.layers=[linear_taylor,flash]", "attention_backend=parallel"],
     r"^attention_backend='parallel' has no implementation of kind='flash' \(model\.layers\[1\]: flash; .*"
     r"allowed values for it: auto, triton, torch"),
    (["attention=flash", "attention_backend=parallel"],
     r"^attention_backend='parallel' has no implementation of kind='flash' \(attention: flash"),
])
def test_attention_backend_errors_name_the_key_before_anything_is_written(tmp_path, overrides, want):
    """An attention_backend that is not registered (or not for a layer's kind) failed at the first forward, after
    the CSV / W&B loggers and run_config.json were written, as ``backend='nope' ...``: now train() refuses it
    first, naming attention_backend and the allowed values."""
    with pytest.raises(ValueError, match=want):
        train_mod.train(make_cfg(tmp_path, overrides))
    assert not any((tmp_path / name).exists() for name in ("csv", "wandb", "run_config.json", "checkpoints"))
    specs = train_mod.layer_specs(make_cfg(tmp_path, ["model.layers=[linear,flash]"]))
    for ok in ("auto", "torch", "reference"):  # registered for every kind: accepted
        train_mod.check_attention_backend(ok, specs)


@pytest.mark.parametrize("bad", ["0", "-3", "2.5"])
def test_bad_data_seq_len_is_named_not_model_max_seq_len(tmp_path, bad):
    """model.max_seq_len is ${data.seq_len}: a bad data.seq_len was reported as 'model.max_seq_len must be ...'."""
    with pytest.raises(ValueError, match=rf"^data\.seq_len={bad}: must be a positive integer"):
        train_mod.validate_config(make_cfg(tmp_path, [f"data.seq_len={bad}"]))


def test_multirun_refused_after_a_batch_ran_does_not_say_a_job_failed(tmp_path, train_py_in_process):
    """hydra.sweeper.max_batch_size=1 with a bad option in the sweep list: job 0 trains, then Hydra refuses the next
    batch's config and ends with that error. The summary said "a job failed", though none had."""
    sweep = tmp_path / "sweep"
    r = train_py_in_process(ROOT, "-m", "attention=flash,flsh", "hydra.sweeper.max_batch_size=1", "logger=csv",
                            "trainer.max_steps=2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1 and "a job failed" not in r.stdout, r.stdout
    assert "Hydra ended the sweep with the error above (exit status 1) after jobs had run, and none of them failed" \
        in r.stdout
    assert (sweep / "attention=flash" / "final_metrics.json").is_file()


def test_multirun_refused_before_its_first_job_does_not_say_a_job_failed(tmp_path, train_py_in_process):
    """A bad option in a sweep list (``-m attention=flash,flsh``): Hydra checks every job's config before launching
    any and ends with the error; the summary said "a job failed, so Hydra ends with its error after the sweep ...
    0 jobs (no final_metrics.json found)" although no job ran. The folders the launch made for the sweep (only
    Hydra's multirun.yaml in them) are removed; a folder that existed before the launch is kept."""
    sweep = tmp_path / "new" / "sweep"  # both made by this launch
    r = subprocess.run([sys.executable, "train.py", "-m", "attention=flash,flsh", "logger=csv",
                        f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=dict(os.environ, WANDB_MODE="disabled"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "Could not find 'attention/flsh'" in r.stderr
    assert "a job failed" not in r.stdout and "no final_metrics.json found" not in r.stdout, r.stdout
    assert f"attn-zoo multirun: no job ran in {sweep}: Hydra refused the sweep before its first job" in r.stdout
    assert "the folder it had made (only its multirun.yaml) is removed" in r.stdout
    assert not (tmp_path / "new").exists()
    # the same refusal in a sweep folder that holds an earlier launch's job: still "no job ran", not "a job failed"
    # with the earlier job's table (this launch in this interpreter)
    old = sweep / "attention=flash" / ".hydra"
    old.mkdir(parents=True)
    (old / "config.yaml").write_text("{}\n")
    os.utime(old / "config.yaml", (1e9, 1e9))  # written long before this launch
    r = train_py_in_process(ROOT, "-m", "attention=flash,flsh", "logger=csv", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1 and "a job failed" not in r.stdout, r.stdout
    assert f"attn-zoo multirun: no job ran in {sweep}" in r.stdout
    assert (old / "config.yaml").is_file() and "is removed" not in r.stdout  # an earlier launch's folder: kept
    # an empty folder the user made before the launch: kept (Hydra's multirun.yaml stays in it)
    mine = tmp_path / "mine"
    mine.mkdir()
    r = train_py_in_process(ROOT, "-m", "attention=flash,flsh", "logger=csv", f"hydra.sweep.dir={mine}")
    assert r.returncode == 1 and "is removed" not in r.stdout and mine.is_dir(), r.stdout
