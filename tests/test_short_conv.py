"""The short convolution before every mixer (``model.short_conv``, :class:`attn_zoo.model.ShortConv`): causal, the
sum it says, decoded with a cache like without, checked with errors naming it; on in the embedded default (tiny
model) and off in every published experiment (issue 28, item 1)."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from attn_zoo import AttentionSpec
from attn_zoo.model import GPT, GPTConfig, ShortConv
from harness.config import check_model_config
from harness.runs import result_config

ROOT = Path(__file__).resolve().parents[1]


def test_short_conv_is_the_causal_sum_it_says():
    torch.manual_seed(0)
    conv = ShortConv(d_model=6, kernel_size=3)
    x = torch.randn(2, 7, 6)  # (B, N, d_model)
    y, tail = conv(x)
    w = conv.conv.weight[:, 0, :]  # (d_model, K): tap K-1 is the current position
    want = x.clone()
    for t in range(7):
        for s in range(3):
            if t - s >= 0:
                want[:, t] += w[:, 2 - s] * x[:, t - s]
    assert torch.allclose(y, want, atol=1e-6)
    assert torch.equal(tail, x[:, -2:])
    # in two pieces, the second given the first's tail: the same output
    y1, t1 = conv(x[:, :4])
    y2, _ = conv(x[:, 4:], t1)
    assert torch.allclose(torch.cat([y1, y2], 1), y, atol=1e-6)


@pytest.mark.parametrize("kind", [dict(kind="flash"), dict(kind="linear", feature_map="elu1"),
                                  dict(kind="sliding_window", window_size=(3, 0))])
def test_gpt_with_short_conv_is_causal_and_decodes_like_without_the_cache(kind):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=40, n_layer=2, n_head=2, d_model=16, max_seq_len=24, short_conv=3)
    m = GPT(cfg, AttentionSpec(causal=True, **kind), backend="reference").eval()
    assert all(b.short_conv is not None for b in m.blocks)
    idx = torch.randint(0, 40, (2, 12))
    a = m(idx)
    idx2 = idx.clone()
    idx2[:, 6] = (idx2[:, 6] + 1) % 40
    b = m(idx2)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-5) and not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-3)
    # decoding: a prefill of 5 tokens, then one token at a time through the layer caches, gives the full logits
    caches = m.init_cache(2, 12)
    steps = [m(idx[:, :5], caches=caches, pos=0)]
    steps += [m(idx[:, t:t + 1], caches=caches, pos=t) for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, 1), a, atol=1e-5)
    prompt = idx[:, :5]
    assert torch.equal(m.generate(prompt, 8, greedy=True, use_cache=True),
                       m.generate(prompt, 8, greedy=True, use_cache=False))


def test_short_conv_off_builds_no_module_and_bad_values_name_it():
    m = GPT(GPTConfig(vocab_size=20, d_model=16, n_head=2, max_seq_len=8), AttentionSpec(kind="flash", causal=True))
    assert all(b.short_conv is None for b in m.blocks)
    for bad in (1, -1, True, 2.5, "4"):
        with pytest.raises(ValueError, match=r"short_conv must be 0 \(none\) or an integer kernel width >= 2"):
            GPTConfig(short_conv=bad)
    fields = dict(vocab_size=20, max_seq_len=8, n_layer=2, n_head=2, d_model=16)
    with pytest.raises(ValueError, match=r"model\.short_conv"):
        check_model_config({**fields, "short_conv": 1})


def _compose(overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_the_default_has_the_conv_and_no_published_experiment_inherits_it():
    cfg = _compose([])
    assert cfg.model.short_conv == 4 and cfg.data.seq_len == 64 and cfg.data.num_kv_pairs == 8
    names = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    assert "mqar_fig2" in names and "crossover_quality" in names
    for name in names:
        assert _compose([f"experiment={name}"]).model.get("short_conv", 0) == 0, name
    # a result config stored before the option (no model.short_conv) is the same run as short_conv 0, not as 4
    stored = {"model": {"d_model": 64}, "seed": 0}
    assert result_config(stored) == result_config({"model": {"d_model": 64, "short_conv": 0}, "seed": 0})
    assert result_config(stored) != result_config({"model": {"d_model": 64, "short_conv": 4}, "seed": 0})
