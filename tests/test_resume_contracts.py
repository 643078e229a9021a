"""Resume / skip_finished contracts that hand-written bugs survived (issue 28, item 5): each test here failed with
its bug put in by hand (named in the docstring) and passes without it."""

import csv
import json

import pytest

from harness.runs import RUN_CONFIG, ContinuedCSVLogger, finished_run, result_config, resumable_checkpoint


def _stored_run(tmp_path, stored: dict):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")  # the config is compared before the checkpoint is read
    (tmp_path / RUN_CONFIG).write_text(json.dumps(result_config(stored)))


def test_a_key_only_in_the_new_config_is_a_change(tmp_path):
    """Bug: the comparison walks the stored config's keys only, so a key the new config adds (``model.extra``) is
    not a change and the job resumes a checkpoint trained without it."""
    old = {"model": {"d_model": 16}, "trainer": {"max_steps": 5}}
    new = {"model": {"d_model": 16, "extra": 1}, "trainer": {"max_steps": 5}}
    _stored_run(tmp_path, old)
    ckpt, why = resumable_checkpoint(tmp_path, new)
    assert ckpt is None and "model.extra" in why
    # and the other way round: a key only in the stored config
    ckpt, why = resumable_checkpoint(tmp_path, {"model": {}, "trainer": {"max_steps": 5}})
    assert ckpt is None and "model.d_model" in why
    (tmp_path / "final_metrics.json").write_text(json.dumps({"steps": 5, "result_config": result_config(old)}))
    with pytest.raises(ValueError, match=r"model\.extra"):
        finished_run(tmp_path, new)


def test_a_run_without_a_stored_config_does_not_count_as_finished(tmp_path):
    """Bug: ``finished_run`` returns a final table without ``result_config`` (an older run) as finished, so
    ``skip_finished`` skips the job under any config."""
    (tmp_path / "final_metrics.json").write_text(json.dumps({"steps": 5, "metrics": {"val/acc": 0.5}}))
    assert finished_run(tmp_path) is not None  # without a config to compare: it is a finished run
    assert finished_run(tmp_path, {"model": {"d_model": 16}}) is None  # with one: not known to be this job's


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_resumed_csv_has_the_resume_step_once(tmp_path):
    """Bug: a resumed ``metrics.csv`` keeps the rows of steps ``<= resume_step``; the resumed run logs that step
    again, so it appears twice. The rows of steps ``< resume_step`` stay, the later ones go, the resumed run
    appends."""
    logger = ContinuedCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    for step in range(0, 8):
        logger.log_metrics({"train/loss": float(10 - step)}, step=step)
    logger.save()
    f = tmp_path / "csv" / "metrics.csv"
    assert [int(r["step"]) for r in _rows(f)] == list(range(8))
    resumed = ContinuedCSVLogger(save_dir=str(tmp_path), name="csv", version="", resume_step=5)
    for step in range(5, 7):
        resumed.log_metrics({"train/loss": float(-step)}, step=step)
    resumed.save()
    rows = _rows(f)
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert [float(r["train/loss"]) for r in rows][4:] == [6.0, -5.0, -6.0]
