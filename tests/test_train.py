"""Training end to end: Hydra configs, every variant learns a little, CSV metrics, multirun + W&B offline, resume."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
sys.path.insert(0, str(ROOT))
import train as train_mod  # noqa: E402

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
    # the default sparse config is really sparse at the default MQAR and text lengths
    from attn_zoo import mask_info
    cfg = make_cfg(tmp_path, ["attention=sparse"])
    spec = train_mod._spec_from_cfg(cfg.attention)
    for n in (cfg.data.seq_len, 256):
        dense = mask_info(spec, n, n).dense()
        assert dense.sum() < 0.8 * torch.ones(n, n).tril().sum(), f"sparse mask is nearly causal-dense at {n}"


def test_errors_name_the_argument(tmp_path):
    cfg = make_cfg(tmp_path, COMMON + ["data=text", f"data.path={tmp_path / 'missing.txt'}"])
    with pytest.raises(FileNotFoundError, match="data.path"):
        train_mod.train(cfg)
    cfg = make_cfg(tmp_path, FAST + ["model.max_seq_len=16", "trainer.max_steps=1"])
    with pytest.raises(ValueError, match="max_seq_len=16"):
        train_mod.train(cfg)


def test_resume_steps_strictly_increase(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train_mod.train(make_cfg(a, FAST + ["trainer.max_steps=10", "trainer.val_check_interval=5"]))
    ckpt = a / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    from attn_zoo.lit import LitLM

    lit = LitLM.load_from_checkpoint(ckpt)  # self-contained: model config + layer specs in hparams
    assert lit.gpt.config.d_model == 32 and lit.gpt.layer_labels == ["flash", "flash"]
    train_mod.train(make_cfg(b, FAST + ["trainer.max_steps=20", "trainer.val_check_interval=5", f"ckpt_path={ckpt}"]))
    steps_a = [s for s, _ in column(read_csv(a), "train/loss")]
    steps_b = [s for s, _ in column(read_csv(b), "train/loss")]
    assert len(steps_a) == 10 and len(steps_b) == 10, "the resumed run trains only the remaining steps"
    steps = steps_a + steps_b
    assert all(x < y for x, y in zip(steps, steps[1:])), f"logged steps not strictly increasing: {steps}"
    with pytest.raises(ValueError, match="ckpt_path: the checkpoint was trained with attention"):
        train_mod.train(make_cfg(tmp_path / "c", FAST + ["attention=linear", "trainer.max_steps=12", f"ckpt_path={ckpt}"]))


def test_multirun_two_jobs_two_dirs_two_wandb_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_SILENT"] = "true"
    sweep = tmp_path / "sweep"
    args = [a for a in FAST if not a.startswith("logger=")] + [
        "logger=many", "trainer.max_steps=3", "trainer.val_check_interval=3", f"paths.cache_dir={tmp_path / 'c'}",
        f"hydra.sweep.dir={sweep}", "attention=flash,linear",
    ]
    r = subprocess.run([sys.executable, "train.py", "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    run_ids = set()
    for job, variant in zip(jobs, ["flash", "linear"]):
        assert OmegaConf.load(job / ".hydra" / "config.yaml").attention.name == variant
        assert column(read_csv(job), "train/loss")
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, f"expected one offline W&B run in {job}/wandb, found {runs}"
        run_ids.add(runs[0].name.rsplit("-", 1)[-1])
    assert len(run_ids) == 2, "the two jobs share a W&B run id"


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
