"""The model config travels as one object (issue 28 item 4): :class:`attn_zoo.model.ModelConfig` is built once from
the Hydra config, handed to ``LitLM``, kept by the model it builds, and round-trips through a checkpoint."""

import dataclasses

import lightning as L
import pytest
import torch

import attn_zoo
from attn_zoo.mixers import MixerSpec
from attn_zoo.model import GPT, GPTConfig, ModelConfig
from harness.config import model_config
from harness.lit import LitLM
from test_train import make_cfg
import test_mixer_conv  # noqa: F401  (registers the "conv" mixer)

CFG = GPTConfig(vocab_size=32, n_layer=3, n_head=2, d_model=16, max_seq_len=16, mlp="swiglu", norm="rmsnorm")
LAYERS = (attn_zoo.make_spec("linear"), MixerSpec("conv", {"kernel_size": 3}),
          attn_zoo.make_spec("sliding_window", window_size=(4, 0)))


def test_model_config_round_trips_through_plain_data():
    mc = ModelConfig(CFG, LAYERS, redraw_interval=5)
    d = mc.to_dict()
    assert set(d) == {"model_config", "layer_specs", "redraw_interval"}
    back = ModelConfig.from_dict(d)
    assert back == mc and back.layers == LAYERS and back.config == CFG and back.redraw_interval == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        mc.redraw_interval = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.d_model = 8
    assert ModelConfig(CFG, LAYERS[0]).layers == (LAYERS[0],) * 3  # one spec: every layer
    with pytest.raises(ValueError, match="layer specs: got a list of 2 specs for n_layer=3; give a list of 3"):
        ModelConfig(CFG, LAYERS[:2])
    with pytest.raises(ValueError, match="redraw_interval"):
        ModelConfig(CFG, LAYERS, redraw_interval=-1)
    with pytest.raises(ValueError, match=r"unknown model config keys \['d_modle'\]"):
        ModelConfig.from_dict(dict(d, model_config=dict(d["model_config"], d_modle=8)))


def test_the_model_is_built_from_that_object():
    mc = ModelConfig(CFG, LAYERS, redraw_interval=5)
    lit = LitLM(mc, backend="reference")
    assert lit.model_config is mc and lit.gpt.model_config is mc
    assert lit.gpt.config is mc.config and tuple(lit.gpt.specs) == LAYERS and lit.gpt.redraw_interval == 5
    assert [b.mixer.__class__.__name__ for b in lit.gpt.blocks][1] != [b.mixer.__class__.__name__
                                                                      for b in lit.gpt.blocks][0]
    # the plain form is saved (serialisable hparams), the keys checkpoints have always had
    assert lit.hparams["model_config"] == dataclasses.asdict(CFG) and lit.hparams["redraw_interval"] == 5
    assert lit.hparams_initial["layer_specs"] == mc.to_dict()["layer_specs"]  # what the loggers get
    with pytest.raises(ValueError, match="layer_specs / redraw_interval"):
        LitLM(mc, layer_specs=mc.to_dict()["layer_specs"])
    # a GPT built directly describes itself by the same kind of object
    assert GPT(CFG, list(LAYERS), backend="reference", redraw_interval=5).model_config == mc


def test_a_checkpoint_written_then_loaded_gives_the_same_model_config(tmp_path):
    mc = ModelConfig(CFG, LAYERS)
    lit = LitLM(mc, backend="reference")
    trainer = L.Trainer(max_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.strategy.connect(lit)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = LitLM.load_from_checkpoint(path, map_location="cpu")
    assert loaded.model_config == mc and loaded.gpt.model_config is loaded.model_config
    for a, b in zip(lit.state_dict().values(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b)
    # a checkpoint of another architecture is refused, naming what differs
    other = LitLM(ModelConfig(dataclasses.replace(CFG, d_model=32), LAYERS), backend="reference")
    with pytest.raises(ValueError, match=r"^ckpt_path: model config differs .*model.d_model: checkpoint 16, this run 32"):
        other.check_checkpoint_hparams(torch.load(path, weights_only=False)["hyper_parameters"])


def test_train_builds_it_once_from_the_hydra_config(tmp_path):
    cfg = make_cfg(tmp_path, ["model.layers=[linear,flash]", "model.redraw_interval=3"])
    mc = model_config(cfg)
    assert [s.label for s in mc.layers] == ["linear", "flash"] and mc.redraw_interval == 3
    assert mc.config.d_model == cfg.model.d_model and mc.config.vocab_size == cfg.data.vocab_size
    with pytest.raises(ValueError, match=r"^model.d_model"):
        model_config(make_cfg(tmp_path, ["model.d_model=0"]))
