"""Run-lifecycle defects: each test failed before its fix.

1. ``trainer.limit_val_batches=0`` measured nothing and exited 0: refused by :func:`harness.config.validate_config`.
2. A resume on other ``data.*`` settings was accepted: refused naming the keys and both values.
3. A diverged run wrote NaN (not JSON) and no flag into ``final_metrics.json``: null and ``"diverged": true``.
4. The output folder was cut off in the final table: printed whole on its own line.
5. A ``skip_finished`` rerun refused under another config: the summary names the refused jobs, the finished runs'
   folders are not altered.
"""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
import train as train_mod  # noqa: E402  (the repo root is on sys.path: conftest.py there)

TINY = ["logger=csv", "model.d_model=16", "model.n_layer=1", "model.n_head=2", "data.seq_len=32",
        "data.vocab_size=32", "data.num_kv_pairs=4", "data.num_train=64", "data.num_val=32", "data.batch_size=16",
        "trainer.max_steps=5", "trainer.val_check_interval=5", "trainer.enable_progress_bar=false",
        "optim.warmup_steps=1"]


def make_cfg(out, overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.cache_dir = str(Path(out) / "cache")
    return cfg


@pytest.mark.parametrize("value", ["0", "0.0", "-1", "1.5"])
def test_limit_val_batches_that_validates_nothing_is_refused(tmp_path, value):
    zero = float(value) == 0  # 0 says why it is refused; 1.5 / -1 say only what is allowed
    want = r"trainer\.limit_val_batches=.*: must be an integer >= 1 .*or a fraction in \(0, 1\]"
    with pytest.raises(ValueError, match=want) as e:
        train_mod.train(make_cfg(tmp_path / "r", TINY + [f"trainer.limit_val_batches={value}"]))
    assert ("no validation metric" in str(e.value)) == zero, str(e.value)
    assert not (tmp_path / "r").exists(), "refused before anything is written"


def test_limit_val_batches_positive_values_are_allowed(tmp_path):
    from harness.config import validate_config

    for value in ("1", "0.5", "1.0"):
        validate_config(make_cfg(tmp_path, TINY + [f"trainer.limit_val_batches={value}"]))


def test_resume_on_other_data_settings_is_refused(tmp_path):
    a = tmp_path / "a"
    base = [o for o in TINY if not o.startswith("data.num_kv_pairs")]
    train_mod.train(make_cfg(a, base + ["data.num_kv_pairs=8", "trainer.max_steps=5"]))
    ckpt = a / "checkpoints" / "last.ckpt"
    before = (a / "final_metrics.json").read_text()
    with pytest.raises(ValueError, match=r"data\.num_kv_pairs: checkpoint 8, this run 4.*data\.num_kv_pairs=8"):
        train_mod.train(make_cfg(tmp_path / "b", base + ["data.num_kv_pairs=4", "trainer.max_steps=10",
                                                         f"ckpt_path={ckpt}"]))
    with pytest.raises(ValueError, match=r"data\.num_train: checkpoint 64, this run 128"):
        train_mod.train(make_cfg(tmp_path / "b", base + ["data.num_kv_pairs=8", "data.num_train=128",
                                                         "trainer.max_steps=10", f"ckpt_path={ckpt}"]))
    assert (a / "final_metrics.json").read_text() == before, "a refused resume must not touch the run"
    # settings that cannot change what is trained on may differ (RESUME_FREE_DATA_KEYS): max_memory_gb
    train_mod.train(make_cfg(tmp_path / "b", base + ["data.num_kv_pairs=8", "data.max_memory_gb=4",
                                                     "trainer.max_steps=10", f"ckpt_path={ckpt}"]))
    done = json.loads((a / "final_metrics.json").read_text())
    assert done["steps"] == 10 and done["result_config"]["data"]["num_kv_pairs"] == 8


def _strict_json(path):
    def refuse(name):
        raise ValueError(f"{path} holds {name}: not standard JSON")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def test_diverged_run_writes_standard_json_flag_and_full_output_dir(tmp_path, train_py_in_process):
    """A diverged run (optim.lr=1e6) exits 0, its final_metrics.json is standard JSON with null for the non-finite
    metrics and ``"diverged": true``; stdout (not a terminal) ends with the whole output folder on its own line.
    (The launch in this interpreter; train.py's processes: test_train.py, test_run_folders.py.)"""
    run = tmp_path / ("a-long-folder-name-so-that-the-path-exceeds-eighty-columns-" * 2) / "run"
    r = train_py_in_process(ROOT, *TINY, "optim.lr=1e6", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "training diverged" in r.stdout + r.stderr
    # the verdict's next-step hint says "(the warning above)": the warning comes before it
    hint = r.stdout.find("next: the same run with a lower optim.lr")
    assert 0 <= r.stdout.find("training diverged") < hint, r.stdout[-2000:]
    done = _strict_json(run / "final_metrics.json")
    assert done["diverged"] is True
    assert done["metrics"].get("train/loss", 0) is None or done["metrics"].get("val/loss") is None
    lines = r.stdout.strip().splitlines()
    assert f"output_dir: {run}" in lines, r.stdout[-2000:]


def test_a_finished_run_is_not_flagged_diverged(tmp_path):
    train_mod.train(make_cfg(tmp_path, TINY + ["optim.lr=1e-3"]))
    done = _strict_json(tmp_path / "final_metrics.json")
    assert done["diverged"] is False and all(v is not None for v in done["metrics"].values())


def test_the_multirun_summary_marks_diverged_jobs(tmp_path):
    from harness.callbacks import MultirunJobs
    from harness.runs import write_final_metrics

    for num, (lr, loss) in enumerate([("1e-3", 1.5), ("1e6", float("nan"))]):
        (tmp_path / f"optim.lr={lr}").mkdir()
        write_final_metrics(tmp_path / f"optim.lr={lr}", {"job": {"num": num}, "variant": "flash", "steps": 5,
                                                          "metrics": {"val/loss": loss}, "diverged": loss != loss})
    header, rows = MultirunJobs().table_rows(tmp_path)
    assert header[-1] == "diverged" and [r[-1] for r in rows] == ["", "yes"]
    assert rows[1][header.index("val/loss")] == "nan"


def test_a_refused_skip_finished_rerun_names_the_jobs_and_leaves_the_runs_as_they_were(tmp_path,
                                                                                      train_py_in_process):
    sweep = tmp_path / "sweep"
    args = ["-m", "attention=flash,linear", *TINY, "skip_finished=true", f"hydra.sweep.dir={sweep}"]
    # both launches in this interpreter (a multirun's process: test_train.py's W&B multirun)
    r = train_py_in_process(ROOT, *args)
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = [sweep / "attention=flash", sweep / "attention=linear"]
    kept = {p: p.read_bytes() for j in jobs for p in (j / "final_metrics.json", j / ".hydra" / "config.yaml")}
    summary = (sweep / "summary.csv").read_bytes()
    r = train_py_in_process(ROOT, *args, "optim.lr=1e-2")  # the refused rerun
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "2 job(s)" in out and "refused" in out and "attention=flash:" in out and "attention=linear:" in out, out[-3000:]
    assert "optim.lr" in out  # the reason: another config
    for p, data in kept.items():
        assert p.read_bytes() == data, f"{p} of a finished run was changed"
    assert not any((j / "failed.json").exists() for j in jobs), "a finished run marked failed"
    assert (sweep / "summary.csv").read_bytes() == summary


def test_a_skip_finished_job_that_replaces_an_old_run_has_its_config_in_hydra_dir(tmp_path, train_py_in_process):
    """A finished run without result_config (older train.py) is run again: the new run's composed config, written to
    .hydra/rerun-<time>/ while the job could still be skipped or refused, ends in .hydra/config.yaml. (Both launches
    in this interpreter.)"""
    import yaml

    run = tmp_path / "run"
    args = [*TINY, "skip_finished=true", f"hydra.run.dir={run}"]
    assert train_py_in_process(ROOT, *args).returncode == 0
    f = run / "final_metrics.json"
    rec = json.loads(f.read_text())
    rec.pop("result_config")
    f.write_text(json.dumps(rec))
    r = train_py_in_process(ROOT, *args, "optim.lr=1e-2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["optim"]["lr"] == 1e-2
    old = list((run / ".hydra").glob("config.replaced-*.yaml"))
    assert len(old) == 1 and yaml.safe_load(old[0].read_text())["optim"]["lr"] == 3e-3


def test_resume_data_check_compares_files_not_spellings(tmp_path):
    """The same data file named through ``..`` (the default relative path joined to the launch directory) or a
    symlink is the same setting on a resume; another file is not."""
    from harness.runs import check_resume_data

    f = tmp_path / "data" / "input.txt"
    f.parent.mkdir()
    f.write_text("x")
    (tmp_path / "link").symlink_to(f.parent)
    stored = {"path": str(tmp_path / "run" / ".." / "data" / "input.txt"), "seq_len": 64}
    for same in (str(f), str(tmp_path / "link" / "input.txt")):
        check_resume_data("last.ckpt", stored, {"path": same, "seq_len": 64})
    with pytest.raises(ValueError, match="data.path"):
        check_resume_data("last.ckpt", stored, {"path": str(tmp_path / "other.txt"), "seq_len": 64})
    with pytest.raises(ValueError, match="data.seq_len"):
        check_resume_data("last.ckpt", stored, {"path": str(f), "seq_len": 32})


def test_resume_data_message_says_a_key_is_not_set():
    """A key the checkpoint's data config has and this run's has not (e.g. data.pack, added by an override) read
    'this run None'; it now says the key is not set (the data module's default applies)."""
    from harness.runs import check_resume_data

    with pytest.raises(ValueError, match=r"data\.pack: checkpoint True, this run not set \(the data module's "
                                         r"default\)"):
        check_resume_data("last.ckpt", {"path": "a.txt", "pack": True}, {"path": "a.txt"})
    with pytest.raises(ValueError, match=r"data\.max_bytes: checkpoint None, this run 10"):
        check_resume_data("last.ckpt", {"path": "a.txt", "max_bytes": None}, {"path": "a.txt", "max_bytes": 10})
