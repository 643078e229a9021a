"""GPT.generate with per-layer caches (KV cache, window cache, linear state): token for token the same as
without the cache, and incremental logits equal to the full forward's."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo.decode import KVCache, LinearState  # noqa: E402
from attn_zoo.model import GPT, GPTConfig  # noqa: E402

VARIANTS = {
    "flash": [dict(kind="flash")],
    "sliding_window": [dict(kind="sliding_window", window_size=(5, 0))],
    "streaming": [dict(kind="streaming", window_size=(4, 0), sink_size=3)],
    "sparse": [dict(kind="sparse", block_size=4, num_local_blocks=1, num_global_blocks=1, num_random_blocks=1)],
    "strided": [dict(kind="sparse", sparse_pattern="strided", block_size=4, stride_blocks=2)],
    "linear": [dict(kind="linear", feature_map="elu1", chunk_size=8)],
    "linear_favor": [dict(kind="linear", feature_map="favor", num_features=16)],
    "gqa": [dict(kind="flash", kv_group_size=2)],
    "mqa": [dict(kind="flash", n_kv_heads=1)],
    "hybrid": [dict(kind="linear"), dict(kind="flash", kv_group_size=2),
               dict(kind="sliding_window", window_size=(3, 0), n_kv_heads=1), dict(kind="sparse", block_size=4)],
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(name, backend="reference", max_seq_len=40, seed=0):
    layers = VARIANTS[name]
    cfg = GPTConfig(vocab_size=37, n_layer=len(layers) if len(layers) > 1 else 2, n_head=4, d_model=32,
                    max_seq_len=max_seq_len)
    specs = [attn_zoo.make_spec(**d) for d in layers]
    torch.manual_seed(seed)
    model = GPT(cfg, specs if len(specs) > 1 else specs[0], backend=backend).eval()
    with torch.no_grad():  # larger weights than the 0.02 init, so that attention decides the argmax
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_greedy_with_cache_equals_without(name, backend):
    model = _model(name, backend)
    idx = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(1))
    want = model.generate(idx, 24, greedy=True, use_cache=False)
    got = model.generate(idx, 24, greedy=True, use_cache=True)
    assert got.shape == (2, 30)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["flash", "sliding_window", "streaming", "sparse", "linear", "hybrid"])
def test_incremental_logits_equal_full_forward(name):
    """Prefill 7 tokens, then feed the rest one at a time (paged KV caches, shuffled pages): every step's logits
    equal the full forward's row for that position."""
    model = _model(name, "reference")
    idx = torch.randint(0, 37, (3, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)  # (B, N, vocab)
        caches = model.init_cache(3, capacity=30, page_size=4, shuffle_pages=True)
        steps = [model(idx[:, :7], caches=caches, pos=0)]
        for t in range(7, 30):
            steps.append(model(idx[:, t: t + 1], caches=caches, pos=t))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)
    kinds = {type(c) for c in caches}
    assert kinds <= {KVCache, LinearState}
    for blk, c in zip(model.blocks, caches):
        if blk.attn.spec.kind == "sliding_window":  # keeps the window (2 W slots), not the whole context
            assert c.capacity == 2 * (blk.attn.spec.window_size[0] + 1) < 30
        if blk.attn.spec.kind == "linear":
            assert c.n == 30


def test_paged_generation_and_sliding_past_max_seq_len():
    model = _model("gqa", "reference", max_seq_len=16)
    idx = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(3))
    want = model.generate(idx, 20, greedy=True, use_cache=False)  # 25 tokens > max_seq_len: context slides
    assert torch.equal(model.generate(idx, 20, greedy=True, use_cache=True, page_size=4), want)
    assert torch.equal(model.generate(idx, 20, greedy=True, use_cache=True), want)


def test_triton_backend_generation_matches_reference():
    """The fused decode kernel (interpreter on CPU) inside generation, with a window and a GQA layer."""
    layers = [dict(kind="flash", kv_group_size=2), dict(kind="sliding_window", window_size=(4, 0))]
    cfg = GPTConfig(vocab_size=37, n_layer=2, n_head=4, d_model=64, max_seq_len=32)
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT(cfg, [attn_zoo.make_spec(**d) for d in layers], backend="triton").eval().to(dev)
    idx = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(4)).to(dev)
    got = model.generate(idx, 5, greedy=True, use_cache=True)
    for blk in model.blocks:
        blk.attn.backend = "reference"
    assert torch.equal(got, model.generate(idx, 5, greedy=True, use_cache=False))


def test_sampling_and_errors():
    model = _model("flash", "reference")
    idx = torch.zeros(1, 3, dtype=torch.long)
    torch.manual_seed(5)
    a = model.generate(idx, 10, temperature=0.8, use_cache=True)
    torch.manual_seed(5)
    b = model.generate(idx, 10, temperature=0.8, use_cache=True)
    assert torch.equal(a, b) and a.shape == (1, 13)
    with pytest.raises(ValueError, match=r"causal=False: layer 0 \(flash\) would attend to later positions"):
        GPT(GPTConfig(vocab_size=37, n_layer=1, n_head=4, d_model=32, max_seq_len=16),
            attn_zoo.make_spec("flash", causal=False))  # a causal LM refuses a non-causal layer when built
    nc = _model("flash", "reference")
    nc.specs[0] = nc.specs[0].replace(causal=False)  # (changed after construction: generate still checks)
    with pytest.raises(ValueError, match="needs causal layers"):
        nc.generate(idx, 2, use_cache=True)
    with pytest.raises(ValueError, match="seq_len=41 exceeds the model's max_seq_len=40"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=model.init_cache(1), pos=40)
    with pytest.raises(ValueError, match="got 1 layer caches for n_layer=2"):
        model(idx, caches=model.init_cache(1)[:1])


def _tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, max_seq_len=16),
               attn_zoo.make_spec("flash"), backend="reference").eval()


def test_generate_refuses_temperature_zero_when_sampling_and_names_it():
    model = _tiny_gpt()
    idx = torch.tensor([[1, 2, 3]])
    for bad in (0, 0.0, -1.0, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match=r"temperature=.*greedy=True"):
            model.generate(idx, 2, temperature=bad, greedy=False)
    assert model.generate(idx, 2, temperature=0, greedy=True).shape == (1, 5)  # greedy ignores temperature


def test_token_ids_outside_the_vocabulary_raise_value_error_naming_idx():
    model = _tiny_gpt()
    for bad in (16, 99, -1):
        with pytest.raises(ValueError, match=r"idx holds token id .*vocab_size"):
            model.generate(torch.tensor([[1, bad]]), 1, greedy=True)
        with pytest.raises(ValueError, match=r"idx holds token id .*vocab_size"):
            model(torch.tensor([[1, bad]]))
    assert model(torch.tensor([[0, 15]])).shape == (1, 2, 16)  # both ends of the range are fine


def test_sampling_divides_the_logits_by_the_temperature(monkeypatch):
    """The sampled distribution is softmax(logits / temperature) (a temperature that multiplies is a bug that the
    token-level tests miss)."""
    seen = []
    real = torch.multinomial

    def spy(probs, n, *a, **k):
        seen.append(probs.clone())
        return real(probs, n, *a, **k)

    monkeypatch.setattr(torch, "multinomial", spy)
    logits = torch.tensor([[0.0, 1.0, 3.0]])
    for t in (0.5, 2.0):
        seen.clear()
        GPT._next_token(logits, t, greedy=False)
        assert torch.allclose(seen[0], torch.softmax(logits / t, dim=-1), atol=1e-6), t
