"""Edges of GPT.generate that a new user hit: each test fails on a small hand-written bug (temperature 0 sampled
as greedy, an out-of-vocabulary id raising a bare IndexError, the temperature applied as a product)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo.model import GPT, GPTConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(vocab=37):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layer=2, n_head=4, d_model=32, max_seq_len=32),
               attn_zoo.make_spec("flash"), backend="reference").eval()


def test_generate_refuses_a_zero_temperature_and_out_of_vocabulary_ids():
    model = _model()
    idx = torch.zeros(1, 3, dtype=torch.long)
    for t in (0, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            model.generate(idx, 2, temperature=t)
    assert model.generate(idx, 2, temperature=0, greedy=True).shape == (1, 5), "greedy ignores temperature"
    for bad in (37, -1):
        with pytest.raises(ValueError, match=r"idx holds token ids .*allowed: 0 \.\. vocab_size - 1 = 36"):
            model.generate(torch.tensor([[1, bad]]), 1, greedy=True)


def test_sampling_divides_the_logits_by_the_temperature():
    """At temperature 0.01 a sample is the argmax (logits 1 apart: the others have probability < e^-100); at 100
    it is close to uniform over 64 tokens, so 200 samples see many tokens. Multiplying by the temperature instead
    flips both."""
    logits = torch.arange(64, dtype=torch.float32).repeat(200, 1)  # (200, 64)
    torch.manual_seed(0)
    cold = GPT._next_token(logits, 0.01, greedy=False)
    assert (cold == 63).all()
    hot = GPT._next_token(logits, 100.0, greedy=False)
    assert hot.unique().numel() > 30, hot.unique().numel()
