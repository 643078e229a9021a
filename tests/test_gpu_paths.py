"""The paths a user runs on a GPU: ``train.py`` through Hydra and Lightning with ``trainer=gpu`` for every variant
x {triton, torch}, ``compile=true``, DDP with ``accelerator=gpu`` and every experiment config (marked ``gpu``: the
H200 runs them; CI has no GPU), plus a CPU test of the optimiser / precision / clipping combination that a CUDA run
gets (a fused AdamW under ``bf16-mixed`` with gradient clipping, which Lightning's precision plugin refused).
"""

import math
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
import train as train_mod  # noqa: E402  (the repo root is on sys.path: conftest.py there)
from harness.lit import LitLM, adamw_impl  # noqa: E402

VARIANTS = ["flash", "sliding_window", "sparse", "linear", "gqa", "mqa"]
# a few steps of a small model on MQAR; D = 32 (4 heads of 128)
GPU_FAST = ["trainer=gpu", "logger=csv", "model=small", "data.seq_len=128", "data.num_kv_pairs=8",
            "data.num_train=2048", "data.num_val=128", "data.batch_size=32", "trainer.max_steps=12",
            "trainer.val_check_interval=6", "trainer.limit_val_batches=2", "trainer.enable_progress_bar=false",
            "trainer.log_every_n_steps=1"]


def _cfg(tmp_path, overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg


def _corpus(tmp_path) -> Path:
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"Now is the winter of our discontent, line {i}.\n" for i in range(3000)))
    return f


# ------------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("target", ["torch.optim.AdamW", "torch.optim.Adam"])
def test_fused_adamw_with_clipping_under_bf16_mixed(monkeypatch, target):
    """What a CUDA run gets -- the fused AdamW, ``precision=bf16-mixed``, ``gradient_clip_val=1`` -- trains on the CPU
    (fused AdamW has a CPU kernel too). With Lightning's own clipping this combination raises ("does not allow for
    gradient clipping because it performs unscaling of gradients internally"), at the first optimizer step. The same
    for another optimiser class from the config (``optim._target_=torch.optim.Adam``, also fused)."""
    import harness.lit as lit_mod

    assert adamw_impl("cuda", None) == "fused"
    assert adamw_impl("cpu", None) == "default"
    scaled = L.pytorch.plugins.MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    assert adamw_impl("cuda", scaled) == "foreach", "a loss scaler needs Lightning's unscale-then-clip"
    monkeypatch.setattr(lit_mod, "adamw_impl", lambda device_type, plugin: adamw_impl("cuda", plugin))
    seen = []

    class Spy(L.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            seen.append((type(optimizer).__name__, optimizer.defaults.get("fused")))

    m = LitLM(dict(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=16), [dict(kind="flash", causal=True)],
              backend="torch", optimizer={"_target_": target, "_partial_": True, "lr": 1e-3, "weight_decay": 0.1})
    x = torch.randint(0, 32, (64, 16), generator=torch.Generator().manual_seed(1))
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=8)
    t = L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0, max_steps=3, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, callbacks=[Spy()])
    t.fit(m, dl)
    assert t.global_step == 3 and seen == [(target.rsplit(".", 1)[1], True)] * 3


def test_clipping_bounds_the_gradient_norm():
    """``LitLM.configure_gradient_clipping`` with a fused optimiser and no scaler clips the gradients itself."""
    m = LitLM(dict(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=16), [dict(kind="flash", causal=True)],
              backend="torch")
    x = torch.randint(0, 32, (4, 16))
    _, loss = m.model(x, x)
    (loss * 1000).backward()
    params = [p for p in m.parameters() if p.grad is not None]
    opt = torch.optim.AdamW(params, fused=True)

    class _Plugin:
        scaler = None

    class _Trainer:
        precision_plugin = _Plugin()

    m._trainer = _Trainer()  # noqa: SLF001  (the hook only reads the precision plugin)
    try:
        m.configure_gradient_clipping(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    finally:
        m._trainer = None
    assert float(torch.nn.utils.get_total_norm([p.grad for p in params])) == pytest.approx(0.5, rel=1e-3)
    with pytest.raises(ValueError, match="gradient_clip_algorithm"):
        from harness.lit import clip_gradients_

        clip_gradients_(params, 1.0, "max")


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_train_gpu_every_variant(tmp_path, variant, backend):
    cfg = _cfg(tmp_path, GPU_FAST + [f"attention={variant}", f"attention_backend={backend}"])
    metrics = train_mod.train(cfg)
    assert math.isfinite(metrics["val/loss"]), metrics
    assert metrics["val/loss"] < math.log(cfg.data.vocab_size) + 0.5
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("variant,backend", [("flash", "triton"), ("flash", "torch"), ("sliding_window", "triton"),
                                             ("sparse", "triton"), ("linear", "triton"), ("gqa", "triton")])
def test_train_gpu_compiled(tmp_path, variant, backend):
    cfg = _cfg(tmp_path, GPU_FAST + [f"attention={variant}", f"attention_backend={backend}", "compile=true"])
    metrics = train_mod.train(cfg)
    assert math.isfinite(metrics["val/loss"]), metrics


@pytest.mark.gpu
@pytest.mark.parametrize("experiment", ["shakespeare", "crossover_quality"])
def test_experiment_configs_on_gpu(tmp_path, experiment):
    corpus = _corpus(tmp_path)
    cfg = _cfg(tmp_path, [f"experiment={experiment}", "trainer=gpu", "logger=csv", f"data.path={corpus}",
                          "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
               if experiment == "shakespeare" else
               [f"experiment={experiment}", "trainer=gpu", "data=text", f"data.path={corpus}", "trainer.max_steps=6",
                "trainer.val_check_interval=3"])
    metrics = train_mod.train(cfg)
    assert math.isfinite(metrics["val/loss"]), metrics


@pytest.mark.gpu
def test_ddp_on_gpus(tmp_path):
    """``trainer=ddp trainer.accelerator=gpu`` over every visible GPU (NCCL)."""
    n = torch.cuda.device_count()
    args = [a for a in GPU_FAST if a != "trainer=gpu"] + [
        "trainer=ddp", "trainer.accelerator=gpu", f"trainer.devices={n}", "trainer.precision=bf16-mixed",
        f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={tmp_path / 'c'}"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
