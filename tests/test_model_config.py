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


# ------------------------------------------------------------ config errors refused before any data work (valfix)
from harness.config import validate_config  # noqa: E402
from attn_zoo.model import doc_ids_refusal  # noqa: E402
from attn_zoo.mixers import layer_takes  # noqa: E402


@pytest.mark.parametrize("overrides", [["attention.causal=false"], ["attention=linear", "attention.causal=false"],
                                       ["attention=sliding_window", "attention.causal=false"]])
def test_a_non_causal_attention_spec_is_refused_by_the_causal_lm(tmp_path, overrides):
    """A non-causal spec in GPT saw later tokens: the run exited 0 with a too-good loss. Refused at validation,
    naming attention.causal and the layer, and by the model built from Python."""
    with pytest.raises(ValueError, match=r"^attention\.causal=False: layer 0 \(\w+\) would attend to later positions"):
        validate_config(make_cfg(tmp_path, overrides))
    validate_config(make_cfg(tmp_path, overrides[:-1]))  # causal (the shipped configs): accepted
    spec = model_config(make_cfg(tmp_path, overrides[:-1])).layers[0].replace(causal=False)
    with pytest.raises(ValueError, match=r"^causal=False: layer 1 \(\w+\) would attend to later positions"):
        GPT(CFG, [LAYERS[0], spec, LAYERS[2]])
    with pytest.raises(ValueError, match=r"^model\.layers\[1\]\.causal=False: layer 1 \(flash\)"):
        validate_config(make_cfg(tmp_path, ["model.layers=[linear,{kind:flash,causal:false}]"]))


def test_non_causal_mixers_are_refused_at_validation(tmp_path):
    """attention=linformer was refused only when the model was built, after the data work."""
    with pytest.raises(ValueError, match=r"^attention: layer 0 \(linformer\) is a non-causal mixer \(causal=False: "
                                         r"Linformer's projections"):
        validate_config(make_cfg(tmp_path, ["attention=linformer"]))
    # a registered causal mixer with a causal: false option is non-causal too
    import attn_zoo.mla  # noqa: F401  (registers "mla")

    assert MixerSpec("mla").causal and not MixerSpec("mla", {"causal": False}).causal
    with pytest.raises(ValueError, match=r"^model\.layers\[0\]: layer 0 \(mla\) is a non-causal mixer"):
        validate_config(make_cfg(tmp_path, ["model.layers=[{mixer:mla,causal:false},flash]"]))


def test_packed_documents_with_a_layer_without_doc_ids_are_refused_before_the_data(tmp_path):
    """MLA takes no doc_ids: the run loaded the data, then failed at the first step. Now validation says it (the
    data path need not exist: nothing of the data is read), in the model's own words."""
    text = ["data=text", "data.pack=true", "data.path=/nonexistent.txt", "attention=mla"]
    want = doc_ids_refusal(["layer 0 (mla)", "layer 1 (mla)"])
    assert "data.doc_mask=false" in want
    with pytest.raises(ValueError) as e:
        validate_config(make_cfg(tmp_path, text))
    assert str(e.value) == want
    validate_config(make_cfg(tmp_path, text + ["data.doc_mask=false"]))  # the plain packed baseline: accepted
    validate_config(make_cfg(tmp_path, text[:-1] + ["model.layers=[mamba2,flash]"]))  # mixers with doc_ids
    # asked of the mixer class, the same answer the built model gives
    import attn_zoo.mla  # noqa: F401

    specs = [attn_zoo.make_spec("flash"), MixerSpec("mla"), MixerSpec("mamba2")]
    model = GPT(dataclasses.replace(CFG, d_model=32), specs, backend="reference")
    assert [layer_takes(s, "doc_ids") for s in specs] == [b.takes_doc_ids for b in model.blocks] == [True, False, True]


def test_sizes_and_backends_that_fail_inside_training_are_refused_at_validation(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"^model\.max_seq_len=32 is smaller than data\.seq_len=64.*raise "
                                         r"model\.max_seq_len to >= 64"):
        validate_config(make_cfg(tmp_path, ["model.max_seq_len=32"]))
    validate_config(make_cfg(tmp_path, ["model.max_seq_len=128"]))
    if torch.cuda.is_available():
        return  # the rest is about a machine without CUDA
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (tests run Triton's CPU interpreter)
    for backend, why in (("triton", "needs a CUDA device"), ("sdpa_flash", "no CUDA device"),
                         ("flex", "FlexAttention has no backward off CUDA")):  # training needs gradients
        with pytest.raises(ValueError, match=rf"^attention_backend='{backend}' cannot run attention: flash here "
                                             rf"\({why}.*available here for it: auto, torch, reference"):
            validate_config(make_cfg(tmp_path, [f"attention_backend={backend}"]))
    validate_config(make_cfg(tmp_path, ["attention_backend=torch"]))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    validate_config(make_cfg(tmp_path, ["attention_backend=triton"]))  # the interpreter runs it on the CPU


def test_allowed_layer_names_are_listed_once_and_pack_needs_text_data(tmp_path):
    from harness.config import layer_specs

    with pytest.raises(ValueError, match=r"model\.layers\[1\]='nope' is not an attention config") as e:
        layer_specs(make_cfg(tmp_path, ["model.layers=[mamba2,nope]"]))
    names = str(e.value).split("allowed values: ")[1].split(", ")
    assert len(names) == len(set(names)) and {"mamba2", "linformer", "flash"} <= set(names)
    with pytest.raises(ValueError, match=r"model\.layers\[1\]='nope' is not an attention config"):
        validate_config(make_cfg(tmp_path, ["model.layers=[mamba2,nope]"]))
    with pytest.raises(ValueError, match=r"^data\.pack=True is not an option of MQARDataModule \(data=mqar\); its "
                                         r"options: vocab_size, .*; pack needs data=text"):
        validate_config(make_cfg(tmp_path, ["+data.pack=true"]))


@pytest.mark.parametrize("overrides, want", [
    (["attention=mamba2", "attention.d_state=0"], r"^attention: mamba2 d_state=0 must be an integer >= 1"),
    (["attention=mamba2", "attention.expand=0"], r"^attention: mamba2 expand=0 must be an integer >= 1"),
    (["model.layers=[{mixer:mamba2,d_state:-3},flash]"], r"^model\.layers\[0\]: mamba2 d_state=-3 must be an integer"),
    (["attention=mamba2", "+attention.foo=1"], r"^attention: mixer 'mamba2' cannot be built with options .*'foo'"),
    (["model.layers=[{mixer:linformer,proj_dim:2.5,causal:false},flash]"], r"non-causal mixer"),  # causal first
    (["attention=mla", "attention.kv_lora_rank=0"], r"^attention: MLA kv_lora_rank must be an integer >= 1"),
    (["attention=deltanet", "attention.kernel=cuda"], r"^attention: deltanet kernel='cuda' is not supported"),
])
def test_mixer_options_are_checked_before_anything_is_written(tmp_path, overrides, want):
    """A mixer's options were checked only when the model was built (after the run folder, the loggers and the data)
    or not at all: attention=mamba2 attention.d_state=0 trained with no state (exit 0); d_state=-3 and expand=0
    failed in the forward with a raw RuntimeError. Now each mixer is built once at validation (meta device)."""
    from harness.config import ConfigError

    import train as train_mod

    with pytest.raises(ValueError, match=want):
        validate_config(make_cfg(tmp_path, overrides))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=want):
        train_mod.train(make_cfg(out, overrides + ["trainer.max_steps=1"]))
    assert not out.exists()
    rng = torch.random.get_rng_state()
    validate_config(make_cfg(tmp_path, ["attention=mamba2"]))  # a good one passes, the global RNG untouched
    assert torch.equal(rng, torch.random.get_rng_state())
