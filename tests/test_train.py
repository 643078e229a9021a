"""Training end to end: Hydra configs, every variant learns a little, CSV metrics, multirun + W&B offline, resume."""

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
import train as train_mod  # noqa: E402  (the repo root is on sys.path: conftest.py there)

VARIANTS = ["flash", "sliding_window", "sparse", "linear", "gqa", "mqa"]
# tiny and fast: 2 layers, d_model 32, seq_len 32, 4 kv pairs
MQAR = ["data.vocab_size=32", "data.num_kv_pairs=4", "data.num_train=512", "data.num_val=64"]
COMMON = [
    "logger=csv", "model.d_model=32", "model.n_layer=2", "model.n_head=4", "data.seq_len=32", "data.batch_size=16", "trainer.max_steps=30", "trainer.val_check_interval=15", "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "optim.lr=1e-2", "optim.warmup_steps=5",
    "+trainer.enable_checkpointing=true",
]
FAST = COMMON + MQAR


def make_cfg(tmp_path, overrides, return_hydra_config=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=return_hydra_config)
    if not return_hydra_config:
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg


def read_csv(run_dir):
    with open(Path(run_dir) / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def column(rows, key):
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_train_smoke_every_variant(tmp_path, variant):
    extra = ["attention.block_size=8"] if variant == "sparse" else []
    if variant == "sliding_window":
        extra = ["attention.window_size=[7,0]"]
    cfg = make_cfg(tmp_path, FAST + [f"attention={variant}"] + extra)
    metrics = train_mod.train(cfg)
    rows = read_csv(tmp_path)
    loss = [v for _, v in column(rows, "train/loss")]
    assert len(loss) == 30
    first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
    assert last < first - 0.2, f"{variant}: train loss did not decrease ({first:.3f} -> {last:.3f})"
    assert math.isfinite(metrics["val/loss"]) and metrics["val/loss"] < math.log(32)
    assert 0.0 <= metrics["val/acc"] <= 1.0
    for key in ("val/loss", "val/ppl", "val/acc", "perf/tokens_per_s", "perf/step_time_s", "perf/peak_mem_mb",
                "model/n_params", "train/lr"):
        assert column(rows, key), f"{key} missing from metrics.csv"
    assert column(rows, "perf/tokens_per_s")[0][1] > 0
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    hp = OmegaConf.load(tmp_path / "csv" / "hparams.yaml")
    assert hp.config.attention.name == variant and hp.n_params == metrics.get("n_params", hp.n_params)
    # the run's label carries the fields overridden on the yaml (eval.recall's line label: sliding_window (w=7))
    label = {"sliding_window": "sliding_window (w=7)", "sparse": "sparse (block_size=8)"}.get(variant, variant)
    assert json.loads((tmp_path / "final_metrics.json").read_text())["variant"] == f"{label}+{label}" == hp.variant


def test_text_training_logs_bpb(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"To be or not to be, line {i}.\n" for i in range(400)))
    cfg = make_cfg(tmp_path, COMMON + ["data=text", f"data.path={corpus}", "model=small",
                                     "model.d_model=32", "model.n_layer=1", "trainer.max_steps=20"])
    metrics = train_mod.train(cfg)
    assert math.isclose(metrics["val/bpb"], metrics["val/loss"] / math.log(2), rel_tol=1e-5)
    assert column(read_csv(tmp_path), "val/bpb")


def test_hybrid_layers_from_one_config_line(tmp_path):
    cfg = make_cfg(tmp_path, FAST + ["model.n_layer=3", "model.layers=[linear,flash,mqa]", "attention=linear",
                                     "attention.feature_map=relu", "trainer.max_steps=4"])
    specs = train_mod.layer_specs(cfg)
    assert [s.kind for s in specs] == ["linear", "flash", "flash"]
    assert specs[0].feature_map == "relu", "the selected attention group (with overrides) serves its own name"
    assert specs[2].n_kv_heads == 1
    train_mod.train(cfg)
    hp = OmegaConf.load(tmp_path / "csv" / "hparams.yaml")
    assert hp.variant == "linear+flash+mqa"
    bad = make_cfg(tmp_path, FAST + ["model.layers=[linear,nope]"])
    with pytest.raises(ValueError, match=r"model.layers\[1\]='nope'"):
        train_mod.layer_specs(bad)
    with pytest.raises(ValueError, match="model.layers has 1 entries"):
        train_mod.layer_specs(make_cfg(tmp_path, FAST + ["model.layers=[flash]"]))
    with pytest.raises(ValueError, match=r"model.layers\[0\]='bogus'"):  # the unknown name before the count
        train_mod.layer_specs(make_cfg(tmp_path, FAST + ["model.layers=[bogus]"]))
    # an entry that is no name and no dict of spec fields: the same one-line message as an unknown name (it was
    # "Input cfg is not an OmegaConf config object (int)", or a TypeError traceback of make_layer_spec for a list)
    for entry, shown in (("3", "3"), ("null", "null"), ("[linear]", r"\['linear'\]"), ("2.5", "2.5"), ("true", "True")):
        with pytest.raises(ValueError, match=rf"^model.layers\[1\]={shown} is not an attention config or a registered "
                                             rf"mixer; allowed values: .*flash.*linear"):
            train_mod.layer_specs(make_cfg(tmp_path, FAST + [f"model.layers=[flash,{entry}]"]))
    assert [s.kind for s in train_mod.layer_specs(make_cfg(tmp_path, FAST + ["model.layers=[flash,{kind: linear}]"]))] \
        == ["flash", "linear"], "an inline dict of spec fields stays a layer"


def test_run_label_says_what_the_run_trains(tmp_path, train_py_in_process):
    """attention=flash attention.kind=linear trained linear attention labelled flash (final table, final_metrics.json,
    eval.recall); attention=linear_taylor attention.feature_map=elu1 stayed linear_taylor. A label that would name
    another variant is refused, asking for attention.name; other overridden fields join the label, so a sweep's runs
    stay apart (-m attention.window_size=[15,0],[31,0])."""
    from harness.config import run_label

    def label(*over, base=FAST):  # the label of one layer (FAST: 2 layers, joined by +)
        cfg = make_cfg(tmp_path, list(base) + list(over))
        got = run_label(cfg, train_mod.model_config(cfg))
        if cfg.model.get("layers") is None:
            parts = got.split("+")
            assert parts == [parts[0]] * int(cfg.model.n_layer), got
            return parts[0]
        return got

    for over, changed in ((["attention=flash", "attention.kind=linear"], r"attention.kind=linear \(the yaml's: flash\)"),
                          (["attention=linear_taylor", "attention.feature_map=elu1"],
                           r"attention.feature_map=elu1 \(the yaml's: taylor\)"),
                          (["attention=linear_favor", "attention.feature_map=relu"], "attention.feature_map=relu"),
                          (["attention=flash", "attention.kind=linear", "model.layers=[flash,linear]"],
                           "attention.kind=linear")):
        with pytest.raises(ValueError, match=rf"^attention.name='\w+' .*{changed}.*Pass attention.name=<label>"):
            label(*over)
        with pytest.raises(ValueError, match="attention.name=<label>"):
            train_mod.train(make_cfg(tmp_path / "refused", FAST + over))
        assert not (tmp_path / "refused" / "final_metrics.json").exists()
    assert label("attention=flash", "attention.kind=linear", "attention.name=linear") == "linear"  # named: the user's
    assert label("attention=linear_taylor", "attention.feature_map=elu1", "attention.name=lin_elu") == "lin_elu"
    assert label("attention=sliding_window", "attention.window_size=[15,0]") == "sliding_window (w=15)"
    assert label("attention=sliding_window", "attention.window_size=[31,0]") == "sliding_window"  # the yaml's own
    assert label("attention=linear", "attention.feature_map=relu") == "linear (relu)"
    assert label("attention=dilated_window", "attention.dilation=4") == "dilated_window (dilation=4)"
    assert label("attention=mamba2", "attention.d_state=32") == "mamba2 (d_state=32)"
    assert label("attention=gqa") == "gqa" and label("attention=linear_taylor") == "linear_taylor"
    # a hybrid keeps its entries' names (as eval.recall labels it), the group's overrides included
    assert label("attention=linear", "attention.feature_map=relu", "model.n_layer=3",
                 "model.layers=[linear,flash,mqa]") == "linear+flash+mqa"
    # every experiment composes to a label (their sweeps of attention fields: mqar_window_cliff's window_size)
    for exp in sorted(f.stem for f in (CONF / "experiment").glob("*.yaml")):
        assert label(f"experiment={exp}", base=[])
    assert label("experiment=mqar_window_cliff", "attention.window_size=[8,0]", base=[]) == "sliding_window (w=8)"
    # through Hydra (the attention group's choice names the yaml): the message alone, no traceback
    r = train_py_in_process(tmp_path, "attention=flash", "attention.kind=linear", f"hydra.run.dir={tmp_path / 'run'}",
                            env={"WANDB_MODE": "offline"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "attention.kind=linear" in r.stderr and "attention.name=<label>" in r.stderr, r.stderr[-2000:]


def test_mask_that_sees_only_itself_is_noted(tmp_path):
    """attention=dilated_window attention.dilation=100 at seq_len 64: every query sees itself only (no token mixing)
    and trained without a word, while a mask covering every pair got a note (dense_mask_notes)."""
    def spec(*over):
        return train_mod._spec_from_cfg(make_cfg(tmp_path, list(over)).attention)

    lone = spec("attention=dilated_window", "attention.dilation=100")
    (note,) = train_mod.dense_mask_notes([lone, lone], 64)
    assert "dilated_window" in note and "at most 1 key" in note and "seq_len=64" in note and "dilation=100" in note
    assert train_mod.dense_mask_notes([lone], 256) == []  # 100 back is in reach at 256 tokens
    (note,) = train_mod.dense_mask_notes([spec("attention=sliding_window", "attention.window_size=[0,0]")], 64)
    assert "at most 1 key" in note and "window_size=[0,0]" in note
    assert train_mod.dense_mask_notes([spec("attention=sliding_window", "attention.window_size=[1,0]")], 64) == []
    assert train_mod.dense_mask_notes([spec("attention=dilated_window")], 64) == []


def test_every_config_composes(tmp_path):
    groups = {g: sorted(f.stem for f in (CONF / g).glob("*.yaml"))
              for g in ("attention", "model", "data", "trainer", "logger", "experiment")}
    assert set(groups["attention"]) >= set(VARIANTS)
    for group, options in groups.items():
        for opt in options:
            cfg = make_cfg(tmp_path, [f"{group}={opt}"])
            OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
            if group == "attention":
                spec = train_mod._spec_from_cfg(cfg.attention)
                assert spec.label == opt
    # the SLURM launcher config needs the hydra node
    cfg = make_cfg(tmp_path, ["hydra/launcher=slurm"], return_hydra_config=True)
    assert "submitit" in cfg.hydra.launcher._target_.lower()
    # gqa / mqa resolve to the expected head counts on the tiny model (4 heads)
    for opt, hkv in (("gqa", 2), ("mqa", 1), ("flash", 4)):
        cfg = make_cfg(tmp_path, [f"attention={opt}"])
        assert train_mod._spec_from_cfg(cfg.attention).resolve_kv_heads(cfg.model.n_head) == hkv
    # the default sparse config is really sparse from 128 tokens (MQAR experiments, text); at the first run's 64
    # tokens it covers all 4 blocks, and train.py says so (dense_mask_notes) rather than report it as sparse
    from attn_zoo import mask_info
    cfg = make_cfg(tmp_path, ["attention=sparse"])
    spec = train_mod._spec_from_cfg(cfg.attention)
    for n in (128, 256):
        dense = mask_info(spec, n, n).dense()
        assert dense.sum() < 0.8 * torch.ones(n, n).tril().sum(), f"sparse mask is nearly causal-dense at {n}"
        assert train_mod.dense_mask_notes([spec], n) == []
    (note,) = train_mod.dense_mask_notes([spec, spec], 64)
    assert "sparse" in note and "seq_len=64" in note and "exact attention" in note
    flash = train_mod._spec_from_cfg(make_cfg(tmp_path, ["attention=flash"]).attention)
    assert train_mod.dense_mask_notes([flash], 64) == []  # exact by design: no note


def test_errors_name_the_argument(tmp_path):
    cfg = make_cfg(tmp_path, COMMON + ["data=text", f"data.path={tmp_path / 'missing.txt'}"])
    with pytest.raises(FileNotFoundError, match="data.path"):
        train_mod.train(cfg)
    cfg = make_cfg(tmp_path, FAST + ["model.max_seq_len=16", "trainer.max_steps=1"])
    with pytest.raises(ValueError, match="max_seq_len=16"):
        train_mod.train(cfg)


def test_resume_steps_strictly_increase(tmp_path):
    """Resuming continues the checkpoint's run dir (not the new output dir), logs every step once, keeps the
    original LR schedule, refuses a finished run and a checkpoint of another architecture."""
    a, b = tmp_path / "a", tmp_path / "b"
    train_mod.train(make_cfg(a, FAST + ["trainer.max_steps=10", "trainer.val_check_interval=5"]))
    ckpt = a / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    from harness.lit import LitLM
    from harness.runs import checkpoint_info

    lit = LitLM.load_from_checkpoint(ckpt)  # self-contained: model config + layer specs in hparams
    assert lit.gpt.config.d_model == 32 and lit.gpt.layer_labels == ["flash", "flash"]
    assert checkpoint_info(ckpt).step == 10 and checkpoint_info(ckpt).total_steps == 10
    train_mod.train(make_cfg(b, FAST + ["trainer.max_steps=20", "trainer.val_check_interval=5", f"ckpt_path={ckpt}"]))
    assert not (b / "csv").exists() and not (b / "checkpoints").exists(), "the resumed run wrote to a new directory"
    steps = [s for s, _ in column(read_csv(a), "train/loss")]
    assert steps == list(range(20)), f"each step logged once, strictly increasing: {steps}"
    info = checkpoint_info(ckpt)
    assert info.step == 20 and info.total_steps == 10, "the schedule length stays the original run's"
    lr = dict(column(read_csv(a), "train/lr"))
    floor = 1e-2 * 0.1  # optim.lr * optim.min_lr_ratio
    assert all(math.isclose(lr[s], floor, rel_tol=1e-5) for s in range(10, 20)), \
        f"past the original 10 steps the LR stays at lr*min_lr_ratio: {[lr[s] for s in range(10, 20)]}"
    with pytest.raises(ValueError, match=r"reached step 20.*trainer.max_steps > 20"):
        train_mod.train(make_cfg(b, FAST + ["trainer.max_steps=20", f"ckpt_path={ckpt}"]))
    hp_before = (a / "csv" / "hparams.yaml").read_text()
    with pytest.raises(ValueError, match="ckpt_path: the checkpoint was trained with attention"):
        train_mod.train(make_cfg(tmp_path / "c", FAST + ["attention=linear", "trainer.max_steps=30", f"ckpt_path={ckpt}"]))
    assert (a / "csv" / "hparams.yaml").read_text() == hp_before, "a refused resume must not touch the run"
    with pytest.raises(FileNotFoundError, match="ckpt_path="):
        train_mod.train(make_cfg(b, FAST + [f"ckpt_path={a / 'checkpoints' / 'nope.ckpt'}"]))


class InterruptAt(L.Callback):
    """Raises KeyboardInterrupt (what Ctrl-C raises) as the batch after optimizer step ``step`` starts."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def test_ctrl_c_saves_last_checkpoint_that_resumes(tmp_path):
    import signal

    from harness.runs import checkpoint_info

    handler = signal.getsignal(signal.SIGINT)
    try:  # Lightning exits with status 1 after an interrupt (and ignores further Ctrl-C): restore the handler
        with pytest.raises(SystemExit) as exc:
            train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=12", "trainer.val_check_interval=10",
                                                       "+callbacks.interrupt._target_=test_train.InterruptAt",
                                                       "+callbacks.interrupt.step=7"]))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert exc.value.code == 1
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.exists(), "no checkpoint after Ctrl-C (the first periodic one would come at step 10)"
    assert checkpoint_info(ckpt).step == 7
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(7))
    metrics = train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=12", "trainer.val_check_interval=10",
                                                         f"ckpt_path={ckpt}"]))
    assert [s for s, _ in column(read_csv(tmp_path), "train/loss")] == list(range(12))
    assert checkpoint_info(ckpt).step == 12 and math.isfinite(metrics["val/loss"])


def test_runs_that_train_nothing_fail_early(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"To be or not to be, line {i}.\n" for i in range(400)))
    n = corpus.stat().st_size
    n_val = round(n * 0.1)
    limit = min((n - n_val - 1) // 16, n_val - 1)  # one batch of 16 windows of seq_len + 1 tokens; one val window
    text = COMMON + ["data=text", f"data.path={corpus}"]
    with pytest.raises(ValueError, match=rf"data.seq_len={limit + 1} .*longest data.seq_len it can train is {limit}\b"):
        train_mod.train(make_cfg(tmp_path, text + [f"data.seq_len={limit + 1}"]))
    assert not (tmp_path / "csv").exists(), "the size error must come before anything is written"
    with pytest.raises(ValueError, match=r"data.seq_len=100000 .*data.max_memory_gb=8.*longest data.seq_len that fits is \d+"):
        train_mod.train(make_cfg(tmp_path, FAST + ["data.seq_len=100000", "data.num_train=20000"]))
    with pytest.raises(ValueError, match=r"data.num_train=8 .*data.batch_size=16"):
        train_mod.train(make_cfg(tmp_path, FAST + ["data.num_train=8"]))
    # no training batches allowed: refused before anything is written (it said "inf training batches per epoch")
    with pytest.raises(ValueError, match=r"trainer.limit_train_batches=0: must be an integer >= 1"):
        train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=3", "+trainer.limit_train_batches=0"]))
    # whatever else makes fit end without a step (here: no time allowed) is an error, not exit 0
    with pytest.raises(RuntimeError, match=r"0 optimizer steps \(trainer.max_steps=3"):
        train_mod.train(make_cfg(tmp_path, FAST + ["trainer.max_steps=3", "+trainer.max_time={seconds:0}"]))


def _wandb_lines(caplog):
    return [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]


def test_wandb_optional_falls_back_to_csv(tmp_path, monkeypatch, caplog):
    many = [a for a in FAST if not a.startswith("logger=")] + ["logger=many", "trainer.max_steps=2"]
    # not installed: `import wandb` fails
    monkeypatch.setitem(sys.modules, "wandb", None)
    with caplog.at_level("WARNING"):
        train_mod.train(make_cfg(tmp_path / "a", many))
    assert len(_wandb_lines(caplog)) == 1 and "not installed" in _wandb_lines(caplog)[0]
    assert column(read_csv(tmp_path / "a"), "train/loss") and not (tmp_path / "a" / "wandb").exists()
    monkeypatch.delitem(sys.modules, "wandb")
    caplog.clear()
    # WANDB_MODE=disabled: no W&B run written, offline or not (even with logger.wandb.offline=true)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with caplog.at_level("WARNING"):
        train_mod.train(make_cfg(tmp_path / "b", many + ["logger.wandb.offline=true"]))
    assert len(_wandb_lines(caplog)) == 1 and "WANDB_MODE=disabled" in _wandb_lines(caplog)[0]
    assert not list((tmp_path / "b").rglob("offline-run-*")) and column(read_csv(tmp_path / "b"), "train/loss")
    caplog.clear()
    # the W&B run cannot start (server unreachable, bad key, ...): CSV only (added for logger=wandb), one line
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    def unreachable(*a, **kw):
        raise wandb.errors.CommError("api.wandb.ai is unreachable")

    monkeypatch.setattr(wandb, "init", unreachable)
    with caplog.at_level("WARNING"):
        metrics = train_mod.train(make_cfg(tmp_path / "c", many + ["logger=wandb"]))
    lines = _wandb_lines(caplog)
    assert len(lines) == 1 and "could not start" in lines[0] and "metrics.csv" in lines[0], lines
    assert column(read_csv(tmp_path / "c"), "train/loss") and math.isfinite(metrics["val/loss"])


def _bar_counts(out):
    return [(int(x), int(y)) for x, y in re.findall(r"step:[^|]*\|[^|]*\| (\d+)/(\d+)", out)]


def test_cli_resume_same_dir_same_wandb_run_and_step_progress_bar(tmp_path, train_py_in_process):
    """Through Hydra: the resumed run's directory is the checkpoint's, its W&B run id is reused, the bar counts steps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    run = tmp_path / "run"
    base = [a for a in FAST if not a.startswith(("logger=", "trainer.enable_progress_bar"))] + [
        "logger=many", "trainer.val_check_interval=3", f"paths.cache_dir={tmp_path / 'c'}",
        "trainer.enable_progress_bar=true"]  # captured stdout is not a terminal: the default (auto) would be off
    r1 = subprocess.run([sys.executable, "train.py", *base, "trainer.max_steps=4", f"hydra.run.dir={run}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=240)
    assert r1.returncode == 0, r1.stdout[-3000:] + r1.stderr[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    r2 = subprocess.run([sys.executable, "train.py", *base, "trainer.max_steps=6", f"ckpt_path={ckpt}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=240)
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert len(list((run / ".hydra").glob("resume-*/config.yaml"))) == 1, "Hydra's run dir was not the checkpoint's"
    assert OmegaConf.load(run / ".hydra" / "config.yaml").trainer.max_steps == 4, "the original config was replaced"
    assert [s for s, _ in column(read_csv(run), "train/loss")] == list(range(6))
    runs = sorted((run / "wandb").glob("offline-run-*"))
    ids = {p.name.rsplit("-", 1)[-1] for p in runs}
    assert len(runs) == 2 and ids == {(run / "wandb" / "run_id.txt").read_text().strip()}, runs
    # progress bar: optimizer steps against trainer.max_steps; a resumed run starts at its step
    for out, start, total in ((r1.stdout, 0, 4), (r2.stdout, 4, 6)):
        counts = _bar_counts(out)
        assert counts and counts[-1] == (total, total), counts[-3:]
        assert all(y == total and start <= x <= y for x, y in counts), counts
        assert not re.search(r"Epoch \d+/-", out)
    # a third launch to the same step: refused (before training: run in this interpreter)
    r3 = train_py_in_process(ROOT, *base, "trainer.max_steps=6", f"ckpt_path={ckpt}", env={"WANDB_MODE": "offline"})
    assert r3.returncode != 0 and "trainer.max_steps > 6" in r3.stderr + r3.stdout


def test_multirun_two_jobs_two_dirs_two_wandb_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_SILENT"] = "true"
    env["COLUMNS"] = "400"  # rich: the summary table on one line per job
    sweep = tmp_path / "sweep"
    args = [a for a in FAST if not a.startswith("logger=")] + [
        "logger=many", "trainer.max_steps=3", "trainer.val_check_interval=3", f"paths.cache_dir={tmp_path / 'c'}",
        f"hydra.sweep.dir={sweep}", "attention=flash,linear",
    ]
    r = subprocess.run([sys.executable, "train.py", "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    # folders named after the job's swept overrides (not the 0, 1 of Hydra's default)
    assert [p.name for p in jobs] == ["attention=flash", "attention=linear"], [p.name for p in jobs]
    run_ids = set()
    for job, variant in zip(jobs, ["flash", "linear"]):
        assert OmegaConf.load(job / ".hydra" / "config.yaml").attention.name == variant
        assert column(read_csv(job), "train/loss")
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, f"expected one offline W&B run in {job}/wandb, found {runs}"
        run_ids.add(runs[0].name.rsplit("-", 1)[-1])
    assert len(run_ids) == 2, "the two jobs share a W&B run id"
    # one table of every job's final metrics at the end (also written as summary.csv)
    with open(sweep / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [row["overrides"] for row in summary] == [p.name for p in jobs]
    for row, job in zip(summary, jobs):
        final = json.loads((job / "final_metrics.json").read_text())
        assert row["variant"] == final["variant"] and int(row["steps"]) == final["steps"] == 3
        assert math.isclose(float(row["val/loss"]), final["metrics"]["val/loss"], rel_tol=1e-3)
    table = r.stdout[r.stdout.index("attn-zoo multirun: 2 jobs"):]
    assert all(p.name in table for p in jobs) and "val/loss" in table
    for p in jobs:  # each job's own final table is titled with its overrides, not only "attn-zoo: default"
        assert f"attn-zoo: default / {p.name}" in r.stdout, r.stdout[-3000:]


def test_job_dirname_and_ckpt_path_last(tmp_path, monkeypatch):
    from harness.runs import _run_dir_resolver, job_dirname, resolve_ckpt_path, swept_keys

    assert swept_keys(["attention=flash,linear", "model.n_layer=2", "optim.lr=range(1,3)"], {"seed": "0,1"}) == \
        ["seed", "attention", "optim.lr"]
    # a command line narrowing a config's sweep keeps the config's key order (the same job folder names)
    params = {"attention": "flash,mqa,linear", "model.d_model": "64,128", "data.seq_len": "64,128"}
    assert swept_keys(["data.seq_len=128", "model.d_model=64,128", "attention=flash,mqa"], params) == \
        ["attention", "model.d_model", "data.seq_len"]
    job = ["model.n_layer=2", "+trainer.enable_checkpointing=true", "optim.lr=0.001", "attention=flash",
           "paths.cache_dir=/tmp/x"]
    sweep = tmp_path / "sweep"  # the swept keys come from the multirun's own config (no environment variable)
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: [model.n_layer=2, 'attention=flash,linear']\n"
        "  sweeper:\n    params:\n      optim.lr: 0.001,0.01\n")
    assert job_dirname(job, [], 3, str(sweep)) == "optim.lr=0.001,attention=flash", \
        "only the swept keys, in sweep order (the config's params first)"
    assert job_dirname(job, ["paths.cache_dir", "trainer.enable_checkpointing"], 3, str(tmp_path / "none")) == \
        "attention=flash,model.n_layer=2,optim.lr=0.001", "no sweep info: every override but the excluded ones"
    assert "SWEPT" not in " ".join(os.environ)
    assert "/" not in job_dirname(["data.path=../shared/x y.txt"]) and job_dirname([], [], 5) == "5"
    na, nb = job_dirname(["a=1", "b=" + "x" * 200]), job_dirname(["a=2", "b=" + "x" * 200])
    assert len(na) <= 96 and na.startswith("a=1,b=xx") and na != nb
    # ckpt_path=last: the most recently written outputs/*/*/checkpoints/last.ckpt under the launch directory
    with pytest.raises(FileNotFoundError, match="ckpt_path=last"):
        resolve_ckpt_path("last", base_dir=tmp_path)
    old, new = (tmp_path / "outputs" / "d" / t / "checkpoints" / "last.ckpt" for t in ("10-00-00", "09-00-00"))
    for i, p in enumerate((old, new)):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
        os.utime(p, (1e9 + i, 1e9 + i))
    assert resolve_ckpt_path("last", base_dir=tmp_path) == str(new)
    assert _run_dir_resolver(str(new), "default") == str(new.parent.parent)
    assert _run_dir_resolver(None, "default") == "default"
    assert _run_dir_resolver(str(tmp_path / "missing.ckpt"), "default") == "default"


def test_ddp_two_cpu_processes(tmp_path):
    """trainer=ddp: Lightning DDP with 2 gloo processes on CPU trains and logs from rank 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    args = FAST + ["trainer=ddp", "trainer.max_steps=4", "trainer.val_check_interval=4",
                   f"paths.cache_dir={tmp_path / 'c'}", f"hydra.run.dir={tmp_path / 'run'}"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "MEMBER: 2/2" in r.stdout + r.stderr, "the second DDP process did not start"
    steps = [s for s, _ in column(read_csv(tmp_path / "run"), "train/loss")]
    assert steps == [0, 1, 2, 3], steps  # one logger (rank 0), every optimizer step once


def test_ddp_validation_counts_every_example_once(tmp_path):
    """data.num_val=33 over 2 DDP processes: Lightning's DistributedSampler padded the second rank's share with example
    0, which was counted twice. One checkpoint, validated by 1 and by 2 gloo processes, has the same val/loss and
    val/acc (the second run resumes the complete checkpoint in a copy of the run without its final table: validated
    only, train.py's own DDP path)."""
    import shutil

    args = FAST + ["data.num_val=33", "trainer.limit_val_batches=1.0", "trainer.max_steps=4",
                   "trainer.val_check_interval=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    train_mod.train(make_cfg(one, args))
    shutil.copytree(one, two)
    (two / "final_metrics.json").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    r = subprocess.run([sys.executable, "train.py", *args, "trainer=ddp", f"paths.cache_dir={tmp_path / 'c'}",
                        f"ckpt_path={two / 'checkpoints' / 'last.ckpt'}"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "MEMBER: 2/2" in r.stdout + r.stderr, "the second DDP process did not start"
    ref, got = (json.loads((d / "final_metrics.json").read_text()) for d in (one, two))
    assert got["resumed_from"] == str(two / "checkpoints" / "last.ckpt") and got["steps"] == ref["steps"] == 4
    for key in ("val/loss", "val/acc"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), key


def test_config_errors_print_without_a_traceback(tmp_path, train_py_in_process):
    """A bad value is a ConfigError (a ValueError Hydra prints alone, no traceback); a missing data file is named as
    typed, and the command exits 1 with the message last (the launch in this interpreter: refused before training;
    a refusal as a process: test_train_edges.py's refused multirun)."""
    from hydra.errors import CompactHydraException

    from harness.config import ConfigError, ConfigFileError

    cfg = make_cfg(tmp_path, FAST + ["trainer.max_steps=-5"])
    with pytest.raises(ConfigError, match=r"trainer.max_steps=-5: must be a positive integer") as e:
        train_mod.train(cfg)
    assert isinstance(e.value, ValueError) and isinstance(e.value, CompactHydraException) and e.value.__cause__ is None
    cfg = make_cfg(tmp_path, COMMON + ["data=text", "data.path=no/such/file.txt"])
    with pytest.raises(ConfigFileError, match=r"data.path='no/such/file.txt' does not exist .*absolute: /"):
        train_mod.train(cfg)
    r = train_py_in_process(tmp_path, "attention=sliding_window", "attention.window_size=[-3,0]",
                            f"hydra.run.dir={tmp_path / 'run'}", env={"WANDB_MODE": "offline"})
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "window_size left=-3 must be an integer >= 0" in r.stderr, r.stderr[-2000:]


def test_busy_cpu_note(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.4, 3.0, 3.0))
    note = train_mod.busy_cpu_note(on_gpu=False)
    assert note is not None and "load 3.4 on 2 cores" in note and "OMP_NUM_THREADS=1" in note
    assert train_mod.busy_cpu_note(on_gpu=True) is None
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert train_mod.busy_cpu_note(on_gpu=False) is None
    monkeypatch.setattr(os, "getloadavg", lambda: (3.4, 3.0, 3.0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert train_mod.busy_cpu_note(on_gpu=False) is None


def test_text_data_logs_its_source(tmp_path):
    from harness.data import TextDataModule

    f = tmp_path / "corpus.txt"
    f.write_text("hello world\n" * 200)
    dm = TextDataModule(path=str(f), seq_len=16, batch_size=2)
    assert dm.source() == f"data.path={f} (2,400 bytes)"
