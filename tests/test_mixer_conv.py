"""A sequence mixer that is not attention: a causal depthwise convolution registered from this file trains through
``train.py`` with ``model.layers=[conv, flash]`` (Hydra compose in process, and the CLI with ``+plugins=[...]``)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Callback
from omegaconf import open_dict

import attn_zoo
from attn_zoo.mixers import MixerSpec, build_mixer, make_layer_spec, register_mixer
from attn_zoo.model import GPT, GPTConfig, layer_from_dict, spec_to_dict

ROOT = Path(__file__).resolve().parents[1]
import train as train_mod  # noqa: E402  (the repo root is on sys.path: conftest.py there)


@register_mixer("conv", causal=True)
class CausalDepthwiseConv(nn.Module):
    """``y_t = W_o (sum_{s < kernel_size} w_s * x_{t - s})``: a per-channel causal convolution (H3 / Mamba's short
    conv), ``(B, N, d_model) -> (B, N, d_model)``."""

    def __init__(self, d_model: int, kernel_size: int = 4, bias: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model, bias=True)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x):  # (B, N, d_model)
        h = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))  # left padding only: causal
        return self.out(self.conv(h).transpose(1, 2))


GRADS = []  # per optimizer step: gradient norm of the conv layer's kernel


class ConvGradProbe(Callback):
    def on_after_backward(self, trainer, pl_module):
        g = pl_module.gpt.blocks[0].attn.conv.weight.grad
        GRADS.append(float(g.norm()) if g is not None else 0.0)


MQAR = ["data.vocab_size=32", "data.num_kv_pairs=4", "data.num_train=512", "data.num_val=64"]
FAST = ["logger=csv", "model.d_model=32", "model.n_layer=2", "model.n_head=4", "data.seq_len=32", "data.batch_size=16",
        "trainer.max_steps=30", "trainer.val_check_interval=15", "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "optim.lr=1e-2", "optim.warmup_steps=5"] + MQAR


def test_conv_mixer_in_the_model_is_causal_and_gets_gradients():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_layer=2, n_head=4, d_model=32, max_seq_len=32)
    model = GPT(cfg, [MixerSpec("conv", {"kernel_size": 3}), attn_zoo.make_spec("flash")], backend="reference")
    assert isinstance(model.blocks[0].attn, CausalDepthwiseConv) and model.blocks[0].attn.kernel_size == 3
    assert model.layer_labels == ["conv", "flash"]
    idx = torch.randint(0, 50, (2, 24))
    _, loss = model(idx, idx)
    loss.backward()
    assert model.blocks[0].attn.conv.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        idx2 = idx.clone()
        idx2[:, 15] = (idx2[:, 15] + 1) % 50
        a, b = model(idx), model(idx2)
    torch.testing.assert_close(a[:, :15], b[:, :15], atol=1e-5, rtol=1e-5)
    assert model.generate(idx[:, :4], 2, greedy=True, use_cache=False).shape == (2, 6)
    with pytest.raises(ValueError, match=r"layer 0 \(conv\) is a CausalDepthwiseConv mixer without a decode state"):
        model.generate(idx[:, :4], 2)


def test_layer_specs_round_trip_and_errors():
    conv = make_layer_spec(mixer="conv", kernel_size=5)
    assert conv == MixerSpec("conv", (("kernel_size", 5),)) and hash(conv) == hash(MixerSpec("conv", {"kernel_size": 5}))
    assert layer_from_dict(spec_to_dict(conv)) == conv
    by_path = make_layer_spec(_target_=f"{__name__}.CausalDepthwiseConv", kernel_size=2)
    assert by_path.label == "CausalDepthwiseConv"
    m = build_mixer(by_path, GPTConfig(d_model=16, n_head=2))
    assert isinstance(m, CausalDepthwiseConv) and m.conv.in_channels == 16
    assert isinstance(make_layer_spec(_target_="attn_zoo.make_spec", kind="flash"), attn_zoo.AttentionSpec)
    with pytest.raises(ValueError, match=r"mixer='nope' is not supported; allowed values: .*conv"):
        MixerSpec("nope")
    with pytest.raises(ValueError, match=r"mixer 'conv' cannot be built with options \['width'\].*parameters: d_model, "
                                         r"kernel_size, bias"):
        build_mixer(MixerSpec("conv", {"width": 3}), GPTConfig())
    with pytest.raises(ValueError, match="mixer='no_such_pkg.Mixer' cannot be imported"):
        build_mixer(MixerSpec("no_such_pkg.Mixer"), GPTConfig())


def _cfg(tmp_path, overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg


def test_conv_and_flash_train_through_train_py(tmp_path):
    """Demo: ``model.layers=[conv,flash]`` through Hydra: the loss falls and the conv layer receives gradients."""
    GRADS.clear()
    cfg = _cfg(tmp_path, FAST + ["model.layers=[conv,flash]",
                                 f"+callbacks.probe._target_={__name__}.ConvGradProbe"])
    specs = train_mod.layer_specs(cfg)
    assert specs[0] == MixerSpec("conv") and specs[1].kind == "flash"
    metrics = train_mod.train(cfg)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        import csv

        loss = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(loss) == 30
    first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
    assert last < first - 0.2, f"train loss did not decrease ({first:.3f} -> {last:.3f})"
    assert math.isfinite(metrics["val/loss"]) and metrics["val/loss"] < math.log(32)
    assert len(GRADS) == 30 and all(g > 0 and math.isfinite(g) for g in GRADS)
    from omegaconf import OmegaConf

    hp = OmegaConf.load(tmp_path / "csv" / "hparams.yaml")
    assert hp.variant == "conv+flash"
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert list(ckpt["hyper_parameters"]["layer_specs"][0]) == ["mixer"]
    assert "model.blocks.0.attn.conv.weight" in ckpt["state_dict"]


def test_unknown_layer_name_lists_mixers(tmp_path):
    cfg = _cfg(tmp_path, FAST + ["model.layers=[conv,nope]"])
    with pytest.raises(ValueError, match=r"model.layers\[1\]='nope' is not an attention config or a registered "
                                         r"mixer; allowed values: .*flash.*conv"):
        train_mod.layer_specs(cfg)


def test_cli_plugins_register_the_mixer(tmp_path):
    """``python train.py +plugins=[test_mixer_conv] model.layers=[conv,flash]``: the plugin module registers it."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    args = [a for a in FAST if not a.startswith("trainer.max_steps")] + [
        "trainer.max_steps=3", "trainer.val_check_interval=3", "model.layers=[conv,flash]", "+plugins=[test_mixer_conv]",
        f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={tmp_path / 'c'}"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "conv+flash" in r.stdout


def test_a_mixer_that_is_not_a_module_or_changes_the_shape_is_named():
    """A factory that returns no ``nn.Module`` (``_target_: attn_zoo.model.GPTConfig``) was accepted by the build and
    by train.py's config checks, and failed at the first forward (``'GPTConfig' object is not callable``, after
    run_config.json and the CSV logger were written); a mixer whose output is not ``(B, N, d_model)`` (``nn.Linear(
    d_model, 3)``, or a tuple as ``nn.GRU`` returns) failed inside the residual add naming no layer."""
    register_mixer("not_a_module_toy", lambda d_model: GPTConfig(d_model=d_model))
    register_mixer("narrow_toy", lambda d_model: nn.Linear(d_model, 3))
    register_mixer("tuple_toy", lambda d_model: nn.GRU(d_model, d_model, batch_first=True))
    cfg = GPTConfig(vocab_size=11, n_head=2, d_model=16, max_seq_len=8, n_layer=1)
    with pytest.raises(ValueError, match=r"mixer 'not_a_module_toy' built a GPTConfig, not an nn\.Module"):
        build_mixer(MixerSpec("not_a_module_toy"), cfg)
    with pytest.raises(ValueError, match=r"mixer 'not_a_module_toy' built a GPTConfig"):
        GPT(cfg, MixerSpec("not_a_module_toy"))
    idx = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^layer 0 \(narrow_toy\): the mixer returned a tensor of shape \(2, 5, 3\) "
                                         r"for its input \(2, 5, 16\); a sequence mixer maps \(B, N, d_model\) to \(B, "
                                         r"N, d_model\)"):
        GPT(cfg, MixerSpec("narrow_toy"))(idx)
    with pytest.raises(ValueError, match=r"^layer 0 \(tuple_toy\): the mixer returned a tuple for its input"):
        GPT(cfg, MixerSpec("tuple_toy"))(idx)


def test_a_type_error_inside_a_factory_is_not_called_an_option_error():
    """A ``TypeError`` raised inside a mixer's factory (a bug in it) was caught and re-raised as "cannot be built
    with options []", sending the user to their config; it reaches them as it is, while a wrong option still
    names the factory's parameters."""
    def broken(d_model):
        return nn.Linear(d_model, "16")  # the bug: a str size

    register_mixer("broken_factory_toy", broken)
    cfg = GPTConfig(vocab_size=11, n_head=2, d_model=16, max_seq_len=8, n_layer=1)
    with pytest.raises(TypeError) as info:
        build_mixer(MixerSpec("broken_factory_toy"), cfg)
    assert "cannot be built" not in str(info.value)
    assert "raised inside the factory of mixer 'broken_factory_toy', built with no options and d_model" in \
        "".join(getattr(info.value, "__notes__", []))  # the traceback names the mixer
    with pytest.raises(ValueError, match=r"mixer 'broken_factory_toy' cannot be built with options \['width'\].*"
                                         r"its parameters: d_model"):
        build_mixer(MixerSpec("broken_factory_toy", {"width": 3}), cfg)


def test_train_py_refuses_a_mixer_that_is_not_a_module_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    cfg = _cfg(out, FAST + ["model.n_layer=1", "model.layers=[{_target_: attn_zoo.model.GPTConfig}]"])
    with pytest.raises(ValueError, match=r"^model\.layers\[0\]: mixer 'attn_zoo\.model\.GPTConfig' built a GPTConfig, "
                                         r"not an nn\.Module"):
        train_mod.train(cfg)
    assert not out.exists()


def test_a_mapping_option_is_refused_not_turned_into_its_keys():
    """``MixerSpec("conv", {"kernel_size": {"a": 1}})`` (``{mixer: conv, kernel_size: {a: 1}}`` in a config) kept
    the option as ``("a",)``, the mapping's keys, and built the mixer with them."""
    from omegaconf import OmegaConf

    for value in ({"a": 1}, OmegaConf.create({"a": 1})):
        with pytest.raises(ValueError, match=r"mixer option kernel_size=.*: options must be numbers, strings, bools, None "
                                             r"or lists"):
            MixerSpec("conv", {"kernel_size": value})
    assert MixerSpec("conv", {"kernel_size": OmegaConf.create([3])}).kwargs() == {"kernel_size": [3]}  # ListConfig
