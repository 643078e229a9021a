"""Edges of the KV cache and of GPT.generate that a new user hit: each test fails on a small hand-written bug
(a negative length wrapping to the last slot, a keep_last cache too small for its new queries, pages taken by a
refused append, new_cache ignoring page_size, temperature applied as a product, bad arguments accepted)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo.decode import KVCache  # noqa: E402
from attn_zoo.decode.cache import append_kv  # noqa: E402
from attn_zoo.model import GPT, GPTConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _kv(B=2, H=2, N=3, D=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, D, generator=g, dtype=dtype), torch.randn(B, H, N, D, generator=g, dtype=dtype))


def test_append_kv_refuses_a_negative_length():
    k_cache, v_cache = torch.zeros(2, 2, 16, 8), torch.zeros(2, 2, 16, 8)
    k, v = _kv()
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=-1 must be >= 0"):
        append_kv(k_cache, v_cache, k, v, torch.tensor([0, -1], dtype=torch.int32))
    assert k_cache.abs().sum() == 0, "nothing written"


def test_keep_last_cache_too_small_for_its_new_queries_refuses():
    """keep_last 4 (window_size (3, 0)), capacity 6 < keep_last + Nq = 8: the compaction keeps 6 - 4 = 2 old tokens,
    and the first new query's window needs 3. The cache refuses instead of answering from the wrong keys."""
    spec = attn_zoo.make_spec("sliding_window", window_size=(3, 0))
    cache = KVCache(1, 2, 8, 6, keep_last=4)
    k, v = _kv(B=1, N=5, seed=1)
    cache.append(k, v)
    k, v = _kv(B=1, N=4, seed=2)
    cache.append(k, v)  # compacts: keeps min(5, 4, 6 - 4) = 2 tokens, then 4 new ones
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="reaches dropped tokens"):
        cache.attend(q, spec, backend="reference")


def test_keep_last_cache_with_room_equals_the_full_cache():
    spec = attn_zoo.make_spec("sliding_window", window_size=(3, 0))
    small, full = KVCache(1, 2, 8, 7, keep_last=4), KVCache(1, 2, 8, 16)
    for i, n in enumerate((5, 3, 3)):
        k, v = _kv(B=1, N=n, seed=10 + i)
        small.append(k, v)
        full.append(k, v)
        q = torch.randn(1, 2, n, 8, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(small.attend(q, spec, backend="reference"), full.attend(q, spec, backend="reference"))
    assert any(small.dropped), "the small cache dropped tokens (the case under test)"


@pytest.mark.parametrize("bad", ["dtype", "pages"])
def test_a_refused_append_takes_no_page(bad):
    cache = KVCache(2, 2, 8, 16, page_size=4, num_pages=5)
    k, v = _kv(N=3)
    cache.append(k, v)  # 1 page each: 3 left
    free, table = cache.num_free_pages, cache.block_table.clone()
    if bad == "dtype":
        k, v = _kv(N=6, dtype=torch.float64)
        with pytest.raises(TypeError, match="must match k_new's dtype"):
            cache.append(k, v)
    else:
        k, v = _kv(N=10)  # 13 tokens: 4 pages each, 6 new pages > 3 free
        with pytest.raises(RuntimeError, match="out of pages"):
            cache.append(k, v)
    assert cache.num_free_pages == free and torch.equal(cache.block_table, table) and cache.lengths == [3, 3]
    k, v = _kv(N=4)  # the pool is intact: 2 more pages fit
    cache.append(k, v)
    assert cache.lengths == [7, 7] and cache.num_free_pages == free - 2


def _model(vocab=37):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layer=2, n_head=4, d_model=32, max_seq_len=32),
               attn_zoo.make_spec("flash"), backend="reference").eval()


def test_init_cache_honours_page_size():
    model = _model()
    caches = model.init_cache(2, page_size=4)
    assert all(c.page_size == 4 and c.block_table is not None and c.k.shape[2] == 4 for c in caches)
    assert all(c.page_size is None and c.block_table is None for c in model.init_cache(2))


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
