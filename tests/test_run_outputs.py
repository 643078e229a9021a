"""What a run leaves and tells: refusals that name the config key (``attention.kv_group_size`` not dividing
``model.n_head``; a non-causal mixer, with the registered causal ones listed), the final validation logged once, the
curve of a resumed run, W&B kept quiet, local text cached under ``data.cache_dir``, ``eval.recall --help``,
``ckpt_path=last`` choosing a run on this launch's data, the summary in ``train.log``, no folder left by a refused
run."""

import json
import os

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


def test_extending_a_run_keeps_its_final_validation_in_the_curve(tmp_path):
    """Bug: a run whose max_steps is no multiple of val_check_interval validates its last step after fit, when
    last.ckpt is already written; extending it (ckpt_path=..., a larger max_steps) dropped that point from the curve
    (final_metrics.json, the printed line): [2, 4, 6, 8] instead of [2, 4, 5, 6, 8]. Extending the extension keeps it."""
    import json

    run = tmp_path / "run"
    train_mod.train(make_cfg(run, _fast("trainer.max_steps=5", "trainer.val_check_interval=2")))
    first = json.loads((run / "final_metrics.json").read_text())["curve"]
    assert [s for s, _ in first] == [2, 4, 5]
    ckpt = run / "checkpoints" / "last.ckpt"
    train_mod.train(make_cfg(tmp_path / "o", _fast("trainer.max_steps=8", "trainer.val_check_interval=2",
                                                   f"ckpt_path={ckpt}")))
    done = json.loads((run / "final_metrics.json").read_text())["curve"]
    assert [s for s, _ in done] == [2, 4, 5, 6, 8]
    assert done[:3] == first, "the first launch's points as it measured them"
    train_mod.train(make_cfg(tmp_path / "o", _fast("trainer.max_steps=10", "trainer.val_check_interval=2",
                                                   f"ckpt_path={ckpt}")))
    again = json.loads((run / "final_metrics.json").read_text())["curve"]
    assert [s for s, _ in again] == [2, 4, 5, 6, 8, 10] and again[:5] == done


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
def test_recall_help_names_the_kinds_and_not_the_sweep_group(cli_in_process):
    """`python -m eval.recall --help` listed crossover's sweep: group (eval/conf/sweep, not used by recall) and did
    not say that the first argument is the report kind: it now gives the command line and every kind of the code.
    (The command in this interpreter, 80 columns as a process's piped output; eval.recall as a process:
    test_eval_bad_input's output-folder test.)"""
    import re

    from eval.recall import FILTER_KINDS, KINDS
    from test_train import ROOT

    r = cli_in_process(ROOT, "-m", "eval.recall", "--help", env={"COLUMNS": "80"})
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


# ------------------------------------------------------------------------------ ckpt_path=last
def test_ckpt_path_last_resumes_the_newest_run_on_this_launchs_data(tmp_path, monkeypatch):
    """ckpt_path=last took the newest checkpoint whatever its data and failed on a diff of ~30 data keys with a fix
    nobody would type: it now resumes the newest run on this launch's data settings (Hydra's run dir resolver picks
    the same), and with none says which run was newest, its data group and its data overrides."""
    import json
    import os

    from harness.runs import _run_dir_resolver, register_resolvers
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)  # ckpt_path=last looks under <launch dir>/outputs
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"document {i}: " + "some words of text " * 6 for i in range(40)))
    mqar_run, text_run = tmp_path / "outputs" / "d" / "10-00-00", tmp_path / "outputs" / "d" / "11-00-00"
    train_mod.train(make_cfg(mqar_run, _fast("trainer.max_steps=2", "trainer.val_check_interval=2")))
    text_args = ["data=text", f"data.path={text}", "data.pack=true", "data.seq_len=32", "data.batch_size=4",
                 "model.d_model=32", "model.n_layer=1", "model.n_head=2", "logger=csv", "trainer.max_steps=2",
                 "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false"]
    train_mod.train(make_cfg(text_run, text_args))
    (text_run / ".hydra").mkdir(exist_ok=True)  # Hydra writes it for a CLI run
    (text_run / ".hydra" / "overrides.yaml").write_text(
        "- data=text\n" f"- data.path={text}\n" "- data.pack=true\n" "- trainer.max_steps=2\n")
    os.utime(text_run / "checkpoints" / "last.ckpt")  # the newest

    # the MQAR launch resumes the MQAR run, not the newer text run
    cfg = make_cfg(tmp_path / "new", _fast("trainer.max_steps=4", "trainer.val_check_interval=2", "ckpt_path=last"))
    train_mod.train(cfg)
    done = json.loads((mqar_run / "final_metrics.json").read_text())
    assert done["steps"] == 4 and done["resumed_from"] == str(mqar_run / "checkpoints" / "last.ckpt")
    assert not (tmp_path / "new" / "final_metrics.json").exists()
    # Hydra's run dir resolver (hydra.run.dir) picks the same run from the composed config (_root_)
    register_resolvers()
    def with_run_dir(c):
        c = OmegaConf.create(OmegaConf.to_container(c))
        c.d = "${attn_zoo.run_dir:${ckpt_path},default}"
        return c

    root = with_run_dir(cfg)
    assert root.d == str(mqar_run)
    text_cfg = with_run_dir(make_cfg(tmp_path / "x", text_args + ["ckpt_path=last"]))
    assert text_cfg.d == str(text_run)
    assert _run_dir_resolver("last", "default") == str(mqar_run), "without a config: the newest checkpoint"

    # no run on this launch's data: a short message naming the newest run, its data group and overrides
    os.utime(text_run / "checkpoints" / "last.ckpt", (2e9, 2e9))
    other = make_cfg(tmp_path / "y", _fast("trainer.max_steps=8", "data.num_kv_pairs=2", "ckpt_path=last"))
    with pytest.raises(ValueError) as e:
        train_mod.train(other)
    msg = str(e.value)
    assert msg.startswith(f"ckpt_path=last: the newest run, {text_run}, was trained with data=text, this launch has "
                          f"data=mqar, and none of the 2 run(s)")
    assert f"add its data overrides (data=text data.path={text} data.pack=true)" in msg
    assert "ckpt_path=<run dir>/checkpoints/last.ckpt" in msg and "num_kv_pairs" not in msg and len(msg) < 600
    # same data module, other settings: the differing keys
    os.utime(mqar_run / "checkpoints" / "last.ckpt", (3e9, 3e9))
    with pytest.raises(ValueError, match=r"was trained on other data settings \(differs in data\.num_kv_pairs\).*"
                                         r"To resume it, pass its values \(data\.num_kv_pairs=4\)"):
        train_mod.train(other)


# ------------------------------------------------------------------------------ train.log, refused runs
def _in_process(train_py_in_process, tmp_path, *args):
    """``python train.py <FAST> <args>`` from ``tmp_path``, in this interpreter (``train_py_in_process``)."""
    from test_train import FAST

    return train_py_in_process(tmp_path, *FAST, *args)


def test_the_summary_lands_in_train_log_and_still_prints(tmp_path, train_py_in_process):
    """train.log of a run was empty: the final table, the curve, the verdict and the output folder were printed to
    stdout only (and Lightning's lines, the packing summary among them, to stderr only). (The launch in this
    interpreter.)"""
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=3", "trainer.val_check_interval=3",
                    "hydra.run.dir=run")
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    for text in ("attn-zoo: default", "val/loss", "val/acc by step:", "learned", "output_dir: "):
        assert text in r.stdout and text in log, text
    assert "[attn_zoo.summary]" not in r.stdout, "printed as plain lines"
    assert "`Trainer.fit` stopped" in log and "`Trainer.fit` stopped" in r.stderr



@pytest.mark.parametrize("job_logging", ["disabled", "stdout"])
def test_hydras_other_job_logging_configs_still_run(tmp_path, job_logging, train_py_in_process):
    """hydra/job_logging=disabled (or stdout) failed every run with "Unable to configure logger 'attn_zoo.summary'":
    the summary loggers were merged into whichever job_logging was chosen and named its file handler. They are an
    option of the group (conf/hydra/job_logging/attn_zoo.yaml), replaced as a whole by another one. (The launches in
    this interpreter.)"""
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=3", "trainer.val_check_interval=3",
                    "hydra.run.dir=run", f"hydra/job_logging={job_logging}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "output_dir: " in r.stdout and "val/acc by step:" in r.stdout

def test_a_refused_run_leaves_no_run_folder(tmp_path, train_py_in_process):
    """A config refused by validate_config left outputs/<date>/<time>/ holding Hydra's files and an empty train.log:
    the folder is removed (and its empty date folder), the command still fails with the message. (The launches in
    this interpreter; a refusal's process: test_train_edges.py's refused multirun.)"""
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=0")
    assert r.returncode != 0 and "trainer.max_steps=0: must be a positive integer" in r.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")  # a folder holding anything else is left as it is
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=0", "hydra.run.dir=kept")
    assert r.returncode != 0 and (tmp_path / "kept" / "notes.txt").read_text() == "mine"


def test_a_refused_run_keeps_a_run_folder_that_was_there_before(tmp_path, train_py_in_process):
    """hydra.run.dir naming a folder the user had made (empty, or holding only an earlier launch's train.log) was
    deleted by RemoveUnusedRunDir when the config was refused: only a folder this launch created is removed
    (hydra.output_subdir=null too: it left its new folder behind). (The launches in this interpreter; a refusal's
    process: test_train_edges.py's refused multirun.)"""
    (tmp_path / "mine").mkdir()
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=0", "hydra.run.dir=mine")
    assert r.returncode != 0 and "trainer.max_steps=0: must be a positive integer" in r.stderr
    assert (tmp_path / "mine").is_dir()
    r = _in_process(train_py_in_process, tmp_path, "trainer.max_steps=0", "hydra.run.dir=new/run",
                    "hydra.output_subdir=null")
    assert r.returncode != 0 and not (tmp_path / "new" / "run").exists()


def test_ckpt_path_last_resumes_the_newest_run_of_this_model(tmp_path, monkeypatch):
    """ckpt_path=last picked the newest run on this launch's data whatever its attention, then refused it with both
    whole AttentionSpecs printed: a launch with attention=linear after a newer flash run could not resume the linear
    run by `last`. It now takes the newest run on these data settings that builds this launch's model."""
    from harness.runs import register_resolvers
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)
    lin = tmp_path / "outputs" / "d" / "09-00-00"
    train_mod.train(make_cfg(lin, _fast("trainer.max_steps=2", "trainer.val_check_interval=2", "attention=linear")))
    flash = tmp_path / "outputs" / "d" / "10-00-00"
    train_mod.train(make_cfg(flash, _fast("trainer.max_steps=2", "trainer.val_check_interval=2")))
    t = (flash / "checkpoints" / "last.ckpt").stat().st_mtime
    os.utime(lin / "checkpoints" / "last.ckpt", (t - 60, t - 60))  # the flash run is the newer one
    cfg = make_cfg(tmp_path / "new", _fast("trainer.max_steps=4", "trainer.val_check_interval=2", "attention=linear",
                                           "ckpt_path=last"))
    train_mod.train(cfg)
    done = json.loads((lin / "final_metrics.json").read_text())
    assert done["steps"] == 4 and done["resumed_from"] == str(lin / "checkpoints" / "last.ckpt")
    assert json.loads((flash / "final_metrics.json").read_text())["steps"] == 2
    # Hydra's run dir resolver (hydra.run.dir) picks the same run from the composed config (_root_)
    register_resolvers()
    root = OmegaConf.create(OmegaConf.to_container(cfg))
    root.d = "${attn_zoo.run_dir:${ckpt_path},default}"
    assert root.d == str(lin)
    root.attention = OmegaConf.create(OmegaConf.to_container(make_cfg(tmp_path / "z", _fast()).attention))
    assert root.d == str(flash)


def test_ckpt_path_last_with_no_run_of_this_model_says_how_each_differs(tmp_path, monkeypatch):
    """Runs on these data settings, none of this model: the error names the newest of them, the layers' fields that
    differ (not whole AttentionSpecs) and how to resume it or another run."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "d" / "10-00-00"
    train_mod.train(make_cfg(run, _fast("trainer.max_steps=2", "trainer.val_check_interval=2")))
    other = make_cfg(tmp_path / "new", _fast("trainer.max_steps=4", "trainer.val_check_interval=2",
                                             "attention=linear", "ckpt_path=last"))
    with pytest.raises(ValueError) as e:
        train_mod.train(other)
    msg = str(e.value)
    assert msg.startswith("ckpt_path=last: 1 of the 1 run(s) under ") and f"the newest of them, {run}: " in msg
    assert "the checkpoint was trained with attention ['flash', 'flash'] but this run builds ['linear', 'linear']" in msg
    assert "layers 0-1: kind 'flash' -> 'linear'" in msg and "AttentionSpec(" not in msg
    assert "ckpt_path=<run dir>/checkpoints/last.ckpt" in msg


def test_architecture_diff_names_fields_of_a_variant_spec_class_and_mixers():
    """A dilated_window run (its spec class adds ``dilation``) or a mamba2 run under ``outputs/`` made
    ``python train.py ckpt_path=last`` (flash) fail with a traceback: ``'AttentionSpec' object has no attribute
    'dilation'`` (``'mixer'`` for a mixer layer) while the error naming how the layers differ was written."""
    from attn_zoo.mixers import layer_to_dict, make_layer_spec
    from attn_zoo.model import GPTConfig, ModelConfig
    from harness.lit import architecture_diff

    flash = ModelConfig(GPTConfig(n_layer=2), make_layer_spec(kind="flash"))
    dilated = [layer_to_dict(make_layer_spec(kind="dilated_window", window_size=[15, 0], dilation=3))] * 2
    msg = architecture_diff({"layer_specs": dilated}, flash)
    assert "layers 0-1: kind 'dilated_window' -> 'flash', window_size (15, 0) -> None, dilation 3 -> None" in msg
    back = architecture_diff({"layer_specs": [layer_to_dict(s) for s in flash.layers]},
                             ModelConfig(GPTConfig(n_layer=2), make_layer_spec(**dilated[0])))
    assert "dilation None -> 3" in back
    mamba = [layer_to_dict(make_layer_spec(mixer="mamba2"))] * 2
    assert "layers 0-1: 'mamba2' -> 'flash'" in architecture_diff({"layer_specs": mamba}, flash)


def test_a_resume_on_another_seed_asks_for_seed_not_data_seed(tmp_path, monkeypatch):
    """data.seed follows the top-level seed (${seed}); a resume of a seed=1 run from a seed=0 launch said "pass its
    values (data.seed=1)", and following it resumed with seed=0 recorded in final_metrics.json's result_config while
    the data kept seed 1. The fix names the key the launch's data.seed follows: seed=1."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "d" / "10-00-00"
    train_mod.train(make_cfg(run, _fast("trainer.max_steps=2", "trainer.val_check_interval=2", "seed=1")))
    for ckpt in ("last", str(run / "checkpoints" / "last.ckpt")):
        with pytest.raises(ValueError) as e:
            train_mod.train(make_cfg(tmp_path / "new", _fast("trainer.max_steps=4", f"ckpt_path={ckpt}")))
        assert "seed=1" in str(e.value) and "data.seed=1" not in str(e.value), str(e.value)


def test_sparkline_keeps_a_flat_curve_flat(capsys):
    """The closing sparkline scales to at least 5 % of the values' size: a curve flat at 0.25 (noise in the 4th
    decimal) prints one bar height, a rising one spans the bars."""
    import train

    base = {"metric": "val/acc", "value": 0.12, "what": "guessing", "higher_is_better": True}
    flat = [[250, {"val/acc": 0.2502}], [500, {"val/acc": 0.25}], [600, {"val/acc": 0.251}]]
    train._print_curve_and_verdict(flat, base, {"val/acc": 0.251})
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "by step:" in ln)
    assert len(set(line.split("by step: ")[1].split()[0])) == 1, line  # one bar height
    rising = [[100, {"val/acc": 0.2}], [200, {"val/acc": 0.6}], [300, {"val/acc": 1.0}]]
    train._print_curve_and_verdict(rising, base, {"val/acc": 1.0})
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "by step:" in ln)
    assert line.split("by step: ")[1].split()[0] == "▂▅█", line  # the scale starts at the baseline, 0.12
    assert "(bars from 0.12 to 1.00, the baseline 0.12 among them)" in line


def test_sparkline_of_a_run_below_its_baseline_stays_low(capsys):
    """A run that stays under its baseline (a 16-token window on MQAR: 0.04 -> 0.06 against 0.12) drew a full rising
    sparkline, scaled to its own values, above "not learned yet"."""
    import train

    base = {"metric": "val/acc", "value": 0.125, "what": "guessing", "higher_is_better": True}
    below = [[250, {"val/acc": 0.04}], [500, {"val/acc": 0.05}], [750, {"val/acc": 0.06}], [1000, {"val/acc": 0.06}]]
    train._print_curve_and_verdict(below, base, {"val/acc": 0.06}, steps=1000)
    out = capsys.readouterr().out
    bars = next(ln for ln in out.splitlines() if "by step:" in ln).split("by step: ")[1].split()[0]
    assert "█" not in bars and max(bars) <= "▄", bars
    assert "not learned yet: val/acc 0.06 vs 0.12" in out
    nxt = next(ln for ln in out.splitlines() if ln.startswith("next:"))
    assert "trainer.max_steps=4000" in nxt and "attention=flash" in nxt and nxt.endswith("trainer=gpu)")
