"""Defects of a newcomer trial (nc10): each test failed before its fix.

* ``attention.kv_group_size`` that does not divide ``model.n_head`` is refused by ``validate_config`` naming
  ``attention.kv_group_size`` (it failed as the model was built, after the data work, as ``kv_group_size=3 ...``);
* the non-causal mixer refusal lists the causal mixers of the registry.
"""

import pytest

import train as train_mod
from test_train import make_cfg


def test_kv_group_size_not_dividing_n_head_is_refused_naming_the_attention_key(tmp_path):
    cfg = make_cfg(tmp_path, ["attention=gqa", "attention.kv_group_size=3", "model.n_head=4"])
    with pytest.raises(ValueError, match=r"^attention\.kv_group_size=3 must divide n_heads=4 \(model\.n_head=4\)"):
        train_mod.validate_config(cfg)
    cfg = make_cfg(tmp_path, ["model.n_layer=2", "model.n_head=4", "model.layers=[flash,{kind:flash,n_kv_heads:3}]"])
    with pytest.raises(ValueError, match=r"^model\.layers\[1\]\.n_kv_heads=3 must divide n_heads=4"):
        train_mod.validate_config(cfg)
    train_mod.validate_config(make_cfg(tmp_path, ["attention=gqa", "attention.kv_group_size=2", "model.n_head=4"]))


def test_non_causal_mixer_refusal_lists_the_registered_causal_mixers(tmp_path):
    from attn_zoo.mixers import _MIXERS, causal_mixer_names, register_mixer
    from attn_zoo.variants import variant_kinds

    with pytest.raises(ValueError, match="use a causal mixer") as e:
        train_mod.validate_config(make_cfg(tmp_path, ["attention=linformer"]))
    msg = str(e.value)
    causal = [n for n in causal_mixer_names() if n != "attention"]
    assert causal and "linformer" not in causal_mixer_names()
    assert f"use a causal mixer: {', '.join(causal)} (registered causal mixers)" in msg
    assert all(k in msg for k in variant_kinds())
    try:  # read from the registry: a newly registered causal mixer is listed
        register_mixer("zz_causal_probe", lambda d_model: None, causal=True)
        with pytest.raises(ValueError, match=r"zz_causal_probe \(registered causal mixers\)"):
            train_mod.validate_config(make_cfg(tmp_path, ["attention=linformer"]))
    finally:
        _MIXERS.pop("zz_causal_probe", None)


# ------------------------------------------------------------------------------ the final validation, the curve
def _fast(*extra):
    from test_train import FAST

    return FAST + ["trainer.limit_val_batches=1"] + list(extra)


def test_the_final_validation_is_logged_once(tmp_path):
    """max_steps a multiple of val_check_interval: the fit validates at the last step, and train()'s own final
    validation of the same model was logged a second time (metrics.csv rows at steps N-1 and N); now once. Otherwise
    the final validation is the only one at the last step and is logged."""
    from test_train import column, read_csv

    metrics = train_mod.train(make_cfg(tmp_path / "a", _fast("trainer.max_steps=4", "trainer.val_check_interval=2")))
    rows = column(read_csv(tmp_path / "a"), "val/loss")
    assert [s for s, _ in rows] == [1, 3]
    assert rows[-1][1] == pytest.approx(metrics["val/loss"], rel=1e-6), "the table's value is the logged one"
    train_mod.train(make_cfg(tmp_path / "b", _fast("trainer.max_steps=5", "trainer.val_check_interval=2")))
    assert [s for s, _ in column(read_csv(tmp_path / "b"), "val/loss")] == [1, 3, 5]


def test_a_resumed_runs_curve_covers_the_whole_run(tmp_path):
    """After a resume, final_metrics.json's curve (and the printed curve) held only this launch's steps while
    metrics.csv had the earlier ones: the curve is kept in the checkpoints and continued."""
    import json

    run = tmp_path / "run"
    train_mod.train(make_cfg(run, _fast("trainer.max_steps=4", "trainer.val_check_interval=2")))
    first = json.loads((run / "final_metrics.json").read_text())["curve"]
    assert [s for s, _ in first] == [2, 4]
    ckpt = run / "checkpoints" / "last.ckpt"
    metrics = train_mod.train(make_cfg(tmp_path / "other", _fast("trainer.max_steps=8", "trainer.val_check_interval=2",
                                                                 f"ckpt_path={ckpt}")))
    done = json.loads((run / "final_metrics.json").read_text())
    assert [s for s, _ in done["curve"]] == [2, 4, 6, 8]
    assert done["curve"][:2] == first, "the earlier launch's points as they were"
    assert done["curve"][-1][1]["val/loss"] == pytest.approx(metrics["val/loss"], abs=1e-4)


def test_wandb_runs_quietly_but_still_log(tmp_path, monkeypatch):
    """The W&B run-history block (about 35 lines at the end of every run) hid the final table, and Lightning's
    WandbLogger made wandb warn that "the anonymous setting has no effect" on every run: the W&B run is started with
    settings.quiet (conf/logger/wandb.yaml) and without the empty anonymous key; it still logs (offline here)."""
    import wandb

    monkeypatch.delenv("WANDB_SILENT", raising=False)
    cfg = make_cfg(tmp_path, ["logger=many"])
    loggers = train_mod.build_loggers(cfg, str(tmp_path), ["flash"])
    try:
        [wb] = [lg for lg in loggers if type(lg).__name__ == "WandbLogger"]
        assert "anonymous" not in wb._wandb_init
        run = wb.experiment
        assert run.settings.quiet is True and run.settings._offline and not run.disabled
        wb.log_metrics({"val/loss": 1.0}, step=1)
    finally:
        train_mod._finish_wandb(loggers)
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")), "the run was written"


# ------------------------------------------------------------------------------ data.cache_dir
def test_local_text_files_are_cached_by_datasets_under_data_cache_dir(tmp_path, monkeypatch):
    """datasets.load_dataset("text", ...) kept its copy of a local file in ~/.cache/huggingface/datasets whatever
    data.cache_dir said: it is given <cache_dir>/datasets."""
    import datasets

    from harness.data import TextDataModule

    home = tmp_path / "hf_home_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home)  # where datasets caches by default
    path = tmp_path / "t.txt"
    path.write_text("one line of text for a tiny corpus\n" * 40)
    dm = TextDataModule(path=str(path), seq_len=16, batch_size=4, val_fraction=0.2, cache_dir=str(tmp_path / "c"))
    dm.setup("fit")
    assert any((tmp_path / "c" / "datasets").rglob("*.arrow")), "datasets' copy under data.cache_dir"
    assert not home.exists() or not any(home.rglob("*.arrow")), "nothing in the default cache"


# ------------------------------------------------------------------------------ eval.recall --help
def test_recall_help_names_the_kinds_and_not_the_sweep_group():
    """`python -m eval.recall --help` listed crossover's sweep: group (eval/conf/sweep, not used by recall) and did
    not say that the first argument is the report kind: it now gives the command line and every kind of the code."""
    import re
    import subprocess
    import sys

    from eval.recall import FILTER_KINDS, KINDS
    from test_train import ROOT

    r = subprocess.run([sys.executable, "-m", "eval.recall", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "sweep:" not in out and "Configuration groups" not in out
    assert "python -m eval.recall <kind> runs=" in out
    listed = re.findall(r"^  (\w+) {2,}", out, flags=re.M)
    assert listed == list(KINDS), listed
    for key, kinds in FILTER_KINDS.items():  # each kind's line names the filters it takes
        for kind in kinds:
            line = next(ln for ln in out.splitlines() if ln.startswith(f"  {kind} "))
            assert f"{key}=" in line, (key, line)
    assert "kind: null" in out and "runs: []" in out, "the config is still shown"
