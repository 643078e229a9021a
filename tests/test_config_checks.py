"""What a newcomer's ``python train.py ...`` got wrong before: a Lightning traceback instead of a message naming the
key (``+trainer.foo=1``, ``trainer.precision=fp8``, ``trainer.accelerator=tpu``, a ``limit_val_batches`` fraction
that gives no batch, ``+plugins=[no_such_module]``), messages that explained the wrong thing, and settings accepted
and ignored (``+foo=1``, a causal window's right side, ``model.redraw_interval`` without a FAVOR+ layer)."""

import logging

import pytest
import torch

import train as train_mod
from harness.config import (ConfigError, ConfigImportError, check_top_level_keys, check_trainer_options, layer_notes,
                            model_config, top_level_keys)
from test_train import CONF, FAST, make_cfg


@pytest.mark.parametrize("override, want", [
    ("+trainer.foo=1", r"^trainer\.foo=1 is not an argument of Trainer \(lightning\.pytorch\.Trainer\); its "
                       r"arguments: accelerator, strategy, devices, .*max_steps"),
    ("+trainer.max_step=5", r"^trainer\.max_step=5 is not an argument of Trainer \(lightning\.pytorch\.Trainer; did "
                            r"you mean trainer\.max_steps\?\)"),
    ("trainer.precision=fp8", r"^trainer\.precision='fp8' is not supported; allowed values: auto \(bf16-mixed on "
                              r"CUDA, else 32-true\), .*bf16-mixed, 32-true"),
    ("trainer.precision=true", r"^trainer\.precision=True is not supported"),
    # on the CPU Lightning trained bf16-mixed, the saved config saying 16-mixed
    pytest.param("trainer.precision=16-mixed", r"^trainer\.precision='16-mixed': fp16 mixed precision runs on CUDA "
                                               r"only .*allowed values here: auto \(32-true on the CPU\), 32-true, "
                                               r"bf16-mixed", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                                      reason="CPU only")),
    pytest.param("trainer.accelerator=tpu", r"^trainer\.accelerator='tpu' is not available on this machine; available "
                                            r"here: auto, cpu", marks=pytest.mark.skipif(
                                                torch.cuda.is_available(), reason="CPU only")),
    ("trainer.accelerator=foo", r"^trainer\.accelerator='foo' is not supported; allowed values: auto, cpu, cuda, .*gpu "
                                r"\(available here: auto, cpu"),
    ("+trainer.strategy=dpp", r"^trainer\.strategy='dpp' is not supported \(did you mean ddp\?\); allowed values: "
                              r"auto, ddp, "),
    # was "(0 would leave the run with no validation metric...)": about the wrong value
    ("trainer.limit_val_batches=2.5", r"^trainer\.limit_val_batches=2\.5: must be an integer >= 1 \(the batches of "
                                      r"each validation\) or a fraction in \(0, 1\] of the validation set \(1\.0: all "
                                      r"of it\)$"),
    # was "RuntimeError: training ran 0 optimizer steps (..., inf training batches per epoch)" after the run started
    ("+trainer.limit_train_batches=0", r"^trainer\.limit_train_batches=0: must be an integer >= 1 .*\(0 would train "
                                       r"no step\)$"),
    # were Lightning's MisconfigurationException / TypeError with a traceback, not naming trainer.devices
    pytest.param("trainer.devices=0", r"^trainer\.devices=0 is not supported on the CPU; allowed values: auto or a "
                                      r"positive integer", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                                     reason="CPU only")),
    ("trainer.devices=abc", r"^trainer\.devices='abc' is not supported.*; allowed values: auto"),
    ("trainer.devices=[]", r"^trainer\.devices=\[\] is not supported.*; allowed values: auto"),
    ("+foo=1", r"^foo=1 is not a key train\.py reads; top-level keys: seed, .*trainer, logger, plugins"),
    ("+sed=1", r"^sed=1 is not a key train\.py reads \(did you mean seed\?\)"),
])
def test_bad_trainer_and_top_level_keys_are_config_errors_before_anything_is_written(tmp_path, override, want):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=want):
        train_mod.train(make_cfg(out, FAST + [override]))
    assert not out.exists()


def test_trainer_devices_as_lightning_takes_them_on_the_cpu_and_on_gpus():
    """What Lightning 2 accepts (``_parse_cpu_cores`` on the CPU; ``_parse_gpu_ids`` on GPUs) passes, the rest is
    refused naming trainer.devices; ``null`` too (Lightning: ``TypeError: devices selected with CPUAccelerator should
    be an int > 0``, and a TypeError iterating None on GPUs)."""
    from omegaconf import OmegaConf

    from harness.config import _check_devices

    for on_cpu, good, bad in (
            (True, ["auto", 1, 2, "1", " 2"], [None, 0, "0", -1, "-1", [0], "0,1", "abc", []]),
            (False, ["auto", 1, "1", -1, "-1", [0], [0, 1], OmegaConf.create([1]), "0,1", "1,"],
             [None, 0, "0", "abc", [], [0, 0], "0,0", [-1], "[0,1]", -2])):
        for v in good:
            _check_devices(v, on_cpu)
        for v in bad:
            with pytest.raises(ValueError, match=r"^trainer\.devices="):
                _check_devices(v, on_cpu)


def test_good_trainer_values_and_every_experiment_pass(tmp_path):
    for override in ("trainer.precision=32-true", "trainer.precision=bf16-mixed", "trainer.precision=32",
                     "trainer.accelerator=cpu", "trainer=ddp", "+trainer.strategy=ddp_spawn",
                     "+trainer.fast_dev_run=true", "+plugins=[]", "trainer.devices=1", "trainer.devices=auto",
                     "trainer.devices=2"):
        cfg = make_cfg(tmp_path, FAST + [override])
        check_top_level_keys(cfg)
        check_trainer_options(cfg.trainer)
    assert {"seed", "data", "model", "attention", "trainer", "logger", "plugins", "optim"} <= set(top_level_keys())
    assert "experiment" not in top_level_keys()
    for exp in sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")):
        check_top_level_keys(make_cfg(tmp_path, [f"experiment={exp}"]))
    check_top_level_keys(make_cfg(tmp_path, ["experiment=mqar_old_recipe", "+mqar_change=lr"]))


def test_a_fraction_that_gives_no_batch_is_refused_naming_the_batches(tmp_path):
    """Lightning raised MisconfigurationException (a traceback) after the run folder and loggers were made."""
    out = tmp_path / "out"
    # FAST: 64 validation examples in batches of 16 = 4 batches; 512 training examples = 32 batches
    with pytest.raises(ConfigError, match=r"^trainer\.limit_val_batches=0\.1 gives int\(0\.1 \* 4\) = 0 validation "
                                          r"batches: the validation set has 4 batches of data\.batch_size; pass a "
                                          r"fraction >= 1/4 \(e\.g\. 0\.25\) or a number of batches"):
        train_mod.train(make_cfg(out, FAST + ["trainer.limit_val_batches=0.1"]))
    with pytest.raises(ConfigError, match=r"^trainer\.limit_train_batches=0\.01 gives int\(0\.01 \* 32\) = 0 training"):
        train_mod.train(make_cfg(out, FAST + ["+trainer.limit_train_batches=0.01"]))
    # DDP: each of the 2 processes has 2 validation batches
    with pytest.raises(ConfigError, match=r"limit_val_batches=0\.3 gives int\(0\.3 \* 2\) = 0 validation batches: the "
                                          r"validation set has 2 batches of data\.batch_size per process \(2 processes\)"):
        train_mod.train(make_cfg(out, FAST + ["trainer=ddp", "trainer.limit_val_batches=0.3"]))
    assert not [p for p in out.rglob("*") if p.is_file()]
    train_mod.train(make_cfg(out, FAST + ["trainer.limit_val_batches=0.25", "trainer.max_steps=2",
                                          "trainer.val_check_interval=2"]))  # 1 batch: runs


def test_a_plugin_that_cannot_be_imported_is_a_config_error(tmp_path, train_py_in_process):
    cfg = make_cfg(tmp_path / "out", FAST + ["+plugins=[no_such_module]"])
    with pytest.raises(ConfigImportError, match=r"^plugins: cannot import 'no_such_module' \(No module named") as e:
        train_mod.train(cfg)
    assert isinstance(e.value, ImportError) and e.value.__cause__ is None
    r = train_py_in_process(tmp_path, "+plugins=[no_such_module]", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "plugins: cannot import 'no_such_module'" in r.stderr, r.stderr[-2000:]


def test_settings_that_do_not_act_as_written_are_said_once(tmp_path, caplog):
    """window_size=[15,15] with causal=true trained [15,0] silently; model.redraw_interval=5 without a FAVOR+ layer
    did nothing silently."""
    def notes(overrides):
        cfg = make_cfg(tmp_path, FAST + overrides)
        return layer_notes(cfg, model_config(cfg))

    (note,) = notes(["attention=sliding_window", "attention.window_size=[15,15]"])
    assert note.startswith("attention.window_size=[15,15] with causal=true (sliding_window): causal clips the right "
                           "side (15) to 0, so this run trains window_size=[15,0]")
    (note,) = notes(["model.layers=[{kind:sliding_window,window_size:[3,null]},flash]"])
    assert note.startswith("model.layers[0].window_size=[3,null] with causal=true (sliding_window): causal clips the "
                           "right side (null: unbounded) to 0")
    assert notes(["attention=sliding_window"]) == notes(["attention=dilated_window"]) == []
    (note,) = notes(["attention=dilated_window", "attention.window_size=[15,2]"])
    assert "dilated_window" in note
    (note,) = notes(["model.redraw_interval=5"])
    assert note == ("model.redraw_interval=5 has no effect: it redraws the random features of FAVOR+ layers "
                    "(feature_map: favor, e.g. attention=linear_favor), and none of this model's layers (flash) is "
                    "one; set model.redraw_interval=0")
    assert notes(["attention=linear_favor", "model.redraw_interval=5"]) == []
    assert notes(["model.layers=[linear_favor,flash]", "model.redraw_interval=5"]) == []
    # train.py logs each once, before training
    with caplog.at_level(logging.WARNING):
        train_mod.train(make_cfg(tmp_path / "run", FAST + ["attention=sliding_window", "attention.window_size=[15,15]",
                                                           "trainer.max_steps=2", "trainer.val_check_interval=2"]))
    assert sum("causal clips the right side" in r.getMessage() for r in caplog.records) == 1
    # a warmup (FAST: 5 steps) longer than the run's 2 steps was capped silently, final_metrics.json saying 5
    (warm,) = [r.getMessage() for r in caplog.records if "optim.warmup_steps" in r.getMessage()]
    assert warm.startswith("optim.warmup_steps=5 is not shorter than the LR schedule (2 steps"), warm
    final = __import__("json").loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["lr_schedule"]["warmup_steps"] == 2 and final["result_config"]["optim"]["warmup_steps"] == 5
    # an epoch-bounded run: the schedule's length (3 batches) is known only when the fit starts
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train_mod.train(make_cfg(tmp_path / "ep", FAST + ["trainer.max_steps=-1", "+trainer.max_epochs=1",
                                                          "+trainer.limit_train_batches=3"]))
    assert any(r.getMessage().startswith("optim.warmup_steps=5 is not shorter than the LR schedule (3 steps")
               for r in caplog.records)
    assert __import__("json").loads((tmp_path / "ep" / "final_metrics.json").read_text())["lr_schedule"][
        "warmup_steps"] == 3


def test_zero_steps_says_how_many_batches_without_inf(tmp_path):
    """The error of a fit that trained nothing said "inf training batches per epoch" (limit_train_batches=0, now
    refused before); a fit stopped before its first step (max_time 0) names the real count."""
    with pytest.raises(RuntimeError, match=r"training ran 0 optimizer steps \(trainer\.max_steps=3, 32 training "
                                           r"batches per epoch\)"):
        train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=3", "+trainer.max_time={seconds:0}"]))


def test_a_run_cut_short_by_max_time_says_so(tmp_path, caplog):
    """``+trainer.max_time`` stopped a run at step 21 of 100,000 and it ended like a finished one: the summary did not
    say it stopped before max_steps (only Lightning's own "Time limit reached" line did)."""
    with caplog.at_level(logging.WARNING, logger="attn_zoo.train"):
        train_mod.train(make_cfg(tmp_path / "run", FAST + ["trainer.max_steps=100000", "+trainer.max_time={seconds:2}"]))
    steps = __import__("json").loads((tmp_path / "run" / "final_metrics.json").read_text())["steps"]
    assert 0 < steps < 100000
    (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training stopped at step")]
    assert said.startswith(f"training stopped at step {steps} of trainer.max_steps=100000 (trainer.max_time=")
    caplog.clear()  # fast_dev_run's one step is what was asked
    with caplog.at_level(logging.WARNING, logger="attn_zoo.train"):
        train_mod.train(make_cfg(tmp_path / "dev", FAST + ["+trainer.fast_dev_run=true"]))
    assert not [r for r in caplog.records if r.getMessage().startswith("training stopped at step")]


def test_the_shared_mqar_recipe_is_not_offered_as_an_experiment(tmp_path, train_py_in_process):
    """experiment=mqar_base appeared in --help although it is not run on its own; it now sits beside train.yaml and
    the mqar_* experiments include it as /mqar_base, composing as before."""
    assert not (CONF / "experiment" / "mqar_base.yaml").exists() and (CONF / "mqar_base.yaml").is_file()
    r = train_py_in_process(tmp_path, "--help")
    line = next(x for x in r.stdout.splitlines() if x.startswith("experiment: "))
    assert "mqar_recall" in line and "mqar_base" not in line
    for exp in ("mqar_recall", "mqar_fig2", "mqar_old_recipe", "mqar_window_cliff", "mqar_hybrid", "mqar_ablation"):
        cfg = make_cfg(tmp_path, [f"experiment={exp}"])
        assert cfg.trainer.accelerator == "gpu" and cfg.data.max_memory_gb == 16, exp  # mqar_base's values


def test_cfg_hydra_resolve_prints_the_hydra_config(tmp_path, train_py_in_process):
    """``python train.py --cfg hydra --resolve`` failed with a traceback (InterpolationKeyError: 'ckpt_path' not
    found): Hydra resolves the hydra node alone, and hydra.run.dir / hydra.output_subdir read the job's ckpt_path and
    skip_finished. They read them through oc.select now, with the defaults of conf/train.yaml."""
    r = train_py_in_process(tmp_path, "--cfg", "hydra", "--resolve")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "  output_subdir: .hydra" in r.stdout and "    dir: outputs/" in r.stdout
    assert not (tmp_path / "outputs").exists(), "printing the config made a run folder"


def test_every_eval_module_run_as_a_command_does_something_or_says_what_to_run(cli_in_process):
    """``python -m eval.<module>`` never exits 0 having done nothing: each module under eval/ is a command (a
    ``__main__`` block) or, for the library modules, refuses with a message naming the command to run instead."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    mods = sorted(p.stem for p in (root / "eval").glob("*.py") if p.stem != "__init__")
    assert {"best", "bench_common", "figspec", "wandb_log"} <= set(mods)
    for m in mods:
        assert 'if __name__ == "__main__":' in (root / "eval" / f"{m}.py").read_text(), m
    for m in ("best", "bench_common", "figspec", "wandb_log"):
        if m == "best":  # as a process
            r = subprocess.run([sys.executable, "-m", f"eval.{m}", "--help"], cwd=root, capture_output=True,
                               text=True, timeout=120)
        else:  # the same __main__ block in this interpreter
            r = cli_in_process(root, "-m", f"eval.{m}", "--help")
        assert r.returncode != 0 and f"eval.{m} is a library module, not a command; run python -m eval." in r.stderr, \
            (m, r.stdout, r.stderr)
