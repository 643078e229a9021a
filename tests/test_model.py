"""GPT model: shapes, GQA/MQA projections, per-layer hybrids, max_seq_len, causality and gradients of every variant."""

import pytest
import torch

import attn_zoo
from attn_zoo import AttentionSpec
from attn_zoo.model import GPT, GPTConfig

VARIANTS = {
    "flash": dict(kind="flash"),
    "sliding_window": dict(kind="sliding_window", window_size=(5, 0)),
    "sparse_bigbird": dict(kind="sparse", block_size=4, num_local_blocks=1, num_global_blocks=1, num_random_blocks=1),
    "sparse_strided": dict(kind="sparse", sparse_pattern="strided", block_size=4, stride_blocks=2),
    "linear_elu1": dict(kind="linear", feature_map="elu1"),
    "linear_favor": dict(kind="linear", feature_map="favor", num_features=16),
    "linear_taylor": dict(kind="linear", feature_map="taylor"),
    "gqa": dict(kind="flash", kv_group_size=2),
    "mqa": dict(kind="flash", n_kv_heads=1),
}
BACKENDS = ["reference", "auto"]


def tiny(**kw):
    base = dict(vocab_size=50, n_layer=2, n_head=4, d_model=32, max_seq_len=32)
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_forward_backward_and_causal(name, backend):
    torch.manual_seed(0)
    spec = attn_zoo.make_spec(**VARIANTS[name])
    model = GPT(tiny(), spec, backend=backend)
    idx = torch.randint(0, 50, (2, 24))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 24, 50)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert any(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "k_proj" in n)
    # causality: changing token t must not change logits before t
    model.eval()
    with torch.no_grad():
        idx2 = idx.clone()
        idx2[:, 15] = (idx2[:, 15] + 1) % 50
        a, b = model(idx), model(idx2)
    torch.testing.assert_close(a[:, :15], b[:, :15], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 15:], b[:, 15:])


def test_gqa_mqa_projection_shapes_and_param_counts():
    cfg = tiny(n_head=8, d_model=64)
    hd = cfg.head_dim
    mha = GPT(cfg, attn_zoo.make_spec("flash"))
    gqa = GPT(cfg, attn_zoo.make_spec("flash", kv_group_size=4))  # 8 query heads -> 2 K/V heads
    mqa = GPT(cfg, attn_zoo.make_spec("flash", n_kv_heads=1))
    for model, hkv in ((mha, 8), (gqa, 2), (mqa, 1)):
        a = model.blocks[0].attn
        assert a.n_kv_heads == hkv
        assert a.k_proj.weight.shape == (hkv * hd, 64) and a.v_proj.weight.shape == (hkv * hd, 64)
        assert a.q_proj.weight.shape == (8 * hd, 64) and a.o_proj.weight.shape == (64, 8 * hd)
        # each layer saves 2 * d_model * (H - Hkv) * head_dim parameters against MHA
        assert mha.num_params() - model.num_params() == cfg.n_layer * 2 * 64 * (8 - hkv) * hd
    assert mha.num_params(non_embedding=True) == mha.num_params() - 50 * 64


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        GPT(tiny(n_head=4), attn_zoo.make_spec("flash", n_kv_heads=3))
    with pytest.raises(ValueError, match="kv_group_size"):
        GPT(tiny(n_head=4), attn_zoo.make_spec("flash", kv_group_size=3))


def test_per_layer_hybrid():
    lin, fl = attn_zoo.make_spec("linear"), attn_zoo.make_spec("flash", n_kv_heads=2)
    model = GPT(tiny(n_layer=4), [lin, lin, fl, lin], backend="reference")
    assert [b.attn.spec.kind for b in model.blocks] == ["linear", "linear", "flash", "linear"]
    assert [b.attn.n_kv_heads for b in model.blocks] == [4, 4, 2, 4]
    assert model.layer_labels == ["linear", "linear", "flash", "linear"]
    _, loss = model(torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16)))
    loss.backward()
    with pytest.raises(ValueError, match="n_layer=4"):
        GPT(tiny(n_layer=4), [lin, fl])


def test_unknown_backend_refused_at_construction():
    with pytest.raises(ValueError, match=r"backend='nope' is not supported; allowed values: auto, .*reference"):
        GPT(tiny(), attn_zoo.make_spec("flash"), backend="nope")
    with pytest.raises(ValueError, match="backend=None is not supported"):
        GPT(tiny(), attn_zoo.make_spec("flash"), backend=None)


def test_seq_len_above_max_raises():
    model = GPT(tiny(max_seq_len=16), attn_zoo.make_spec("flash"))
    model(torch.zeros(1, 16, dtype=torch.long))  # exactly max is fine
    with pytest.raises(ValueError, match="seq_len=17 exceeds the model's max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("field,value", [("mlp", "relu"), ("norm", "batchnorm"), ("d_model", 30), ("n_layer", 0), ("dropout", 1.5)])
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field if field != "d_model" else "d_model"):
        tiny(**{field: value})


def test_mlp_norm_options_and_tied_embeddings():
    for mlp in ("gelu", "swiglu"):
        for norm in ("layernorm", "rmsnorm"):
            m = GPT(tiny(mlp=mlp, norm=norm, dropout=0.1), attn_zoo.make_spec("flash"))
            assert m.lm_head.weight is m.wte.weight
            assert m(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 50)


def test_favor_redraw_is_seeded_and_changes_output():
    spec = attn_zoo.make_spec("linear", feature_map="favor", num_features=16, seed=3)
    torch.manual_seed(0)
    model = GPT(tiny(), spec, backend="reference", redraw_interval=10).eval()
    idx = torch.randint(0, 50, (1, 16))
    assert model.redraw_features(0)
    seeds0 = [b.attn.current_spec().seed for b in model.blocks]
    out0 = model(idx)
    assert not model.redraw_features(9)  # same period: no change
    assert model.redraw_features(10)
    seeds1 = [b.attn.current_spec().seed for b in model.blocks]
    assert seeds0 != seeds1 and len(set(seeds1)) == len(seeds1)
    assert not torch.allclose(out0, model(idx))
    model.redraw_features(0)
    torch.testing.assert_close(out0, model(idx))  # deterministic in the step


def test_generate_extends_sequence():
    model = GPT(tiny(max_seq_len=8), attn_zoo.make_spec("flash"))
    out = model.generate(torch.zeros(1, 3, dtype=torch.long), max_new_tokens=10)
    assert out.shape == (1, 13)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_attention_layer_equals_hand_written(n_kv_heads):
    """One attention layer against a hand-written computation: q / k / v projections, RoPE (rotate-half, base
    10000) on q and k only, causal softmax attention with GQA head sharing, output projection. Applying RoPE to v,
    or to the wrong positions, or sharing K/V heads the wrong way, fails here."""
    import math

    from attn_zoo.model import Attention, GPTConfig, Rotary

    torch.manual_seed(3)
    cfg = GPTConfig(vocab_size=16, n_layer=1, n_head=4, d_model=32, max_seq_len=16)
    spec = AttentionSpec(kind="flash", causal=True, n_kv_heads=n_kv_heads)
    layer = Attention(cfg, spec, Rotary(cfg.head_dim, cfg.max_seq_len), backend="reference")
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    B, N, H, D = 2, 11, 4, 8
    x = torch.randn(B, N, cfg.d_model)
    pos = torch.arange(N, dtype=torch.float64)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]  # (N, D/2)

    def rope(t):  # (B, H, N, D): pairs (i, i + D/2) rotated by the position's angles
        a, b = t[..., : D // 2], t[..., D // 2:]
        return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1)

    xd = x.double()
    W = {n: getattr(layer, n).weight.double() for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    q = (xd @ W["q_proj"].T).view(B, N, H, D).transpose(1, 2)
    k = (xd @ W["k_proj"].T).view(B, N, n_kv_heads, D).transpose(1, 2)
    v = (xd @ W["v_proj"].T).view(B, N, n_kv_heads, D).transpose(1, 2)
    q, k = rope(q), rope(k)
    group = H // n_kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # head h reads K/V head h // group
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, H * D) @ W["o_proj"].T
    torch.testing.assert_close(layer(x).double(), y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("field, value, match", [
    ("rope_base", -5.0, r"rope_base must be a positive number.*got -5.0"),  # trained to NaN
    ("rope_base", 0, r"rope_base must be a positive number"),
    ("rope_base", float("nan"), r"rope_base must be a positive number"),
    ("tie_embeddings", "maybe", r"tie_embeddings must be true or false, got 'maybe'"),  # counted as true
    ("bias", "maybe", r"bias must be true or false, got 'maybe'"),
])
def test_config_values_that_trained_silently_are_refused(field, value, match):
    args = dict(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8)
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**args, field: value})


@pytest.mark.parametrize("value", [-1, 2.5, "abc"])
def test_redraw_interval_must_be_a_non_negative_integer(value):
    cfg = GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=8)
    with pytest.raises(ValueError, match=r"redraw_interval must be an integer >= 0"):
        GPT(cfg, AttentionSpec(kind="linear", feature_map="favor"), redraw_interval=value)


def test_forward_and_layer_spec_errors_name_the_argument():
    """``GPT(config, "flash")`` said "got a list of 5 specs" (the string's letters); float token ids, targets of
    another shape and target ids outside the vocabulary failed inside the embedding / cross-entropy (``Expected input
    batch_size (8) to match target batch_size (6)``, ``IndexError: Target 50 is out of bounds``)."""
    with pytest.raises(TypeError, match=r"layer specs must be an AttentionSpec or a MixerSpec, or a list of them \(one "
                                        r"per layer\), got str \(for 'flash': attn_zoo.make_spec\('flash'\)\)"):
        GPT(tiny(), "flash")
    with pytest.raises(TypeError, match=r"layer specs must be an AttentionSpec or a MixerSpec, or a list of them"):
        GPT(tiny(), None)
    model = GPT(tiny(), AttentionSpec())
    with pytest.raises(ValueError, match=r"idx must be \(B, N\) integer token ids with B, N >= 1, got torch.float32"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"idx must be \(B, N\) integer token ids with B, N >= 1, got torch.int64 "
                                         r"\(2, 0\)"):
        model(torch.zeros(2, 0, dtype=torch.long))
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"targets must have idx's shape \(2, 4\), got \(2, 3\)"):
        model(idx, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets holds token id 50; allowed values: 0 \.\. vocab_size - 1 = 49 or "
                                         r"-100 \(ignored\)"):
        model(idx, torch.full((2, 4), 50, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets holds token id -2"):
        model(idx, torch.full((2, 4), -2, dtype=torch.long), sparse_targets=True)
    _, loss = model(idx, torch.tensor([[1, -100, 2, 3], [-100, -100, 4, 49]]))  # -100: ignored, still taken
    assert torch.isfinite(loss)
