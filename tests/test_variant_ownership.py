"""Each variant answers for itself (issue 26, item 1): the registry's one cache-invalidation rule, unused spec fields
refused, the cache policy asked of the variant (a plugin window gets a bounded cache), and multi-token chunks after a
prefill in generation. Each test here failed on a hand-written bug that the rest of the suite let through."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import AttentionSpec, attention, make_spec  # noqa: E402
from attn_zoo.decode import KVCache, LinearState, layer_cache_bytes  # noqa: E402
from attn_zoo.model import GPT, GPTConfig  # noqa: E402
from attn_zoo.registry import register_backend, unregister_backend  # noqa: E402
from attn_zoo.variants import CachePolicy, get_variant, register_variant, unregister_variant  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _qkv(N=12, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, N, D, generator=g) for _ in range(3))


def _window_mask(left):
    return lambda spec, Nq, Nk: {"window_left": left}


def test_re_registering_a_variant_drops_every_cached_mask():
    """The torch backend, the naive anchor and mask_info cache per spec: re-registering the kind with another mask
    must change every backend's answer (the registry's forget_derived)."""
    q, k, v = _qkv()
    register_variant("own_toy", "softmax", mask=_window_mask(1))
    try:
        spec = AttentionSpec(kind="own_toy")
        old = {b: attention(q, k, v, spec, backend=b) for b in ("torch", "naive", "reference")}
        register_variant("own_toy", "softmax", mask=_window_mask(4))
        for b, o in old.items():
            new = attention(q, k, v, spec, backend=b)
            want = attention(q, k, v, AttentionSpec(kind="sliding_window", window_size=(4, 0)), backend="reference")
            torch.testing.assert_close(new, want, atol=1e-5, rtol=1e-5, msg=f"{b} kept the old mask")
            assert not torch.allclose(new, o), b
        assert attn_zoo.mask_info(spec, 3, 3).window_left == 4
    finally:
        unregister_variant("own_toy")


def test_unregister_backend_drops_the_dispatch_decision():
    q, k, v = _qkv()
    spec = AttentionSpec(kind="flash")
    calls = []

    def eager(q, k, v, spec, return_lse=False):
        calls.append(1)
        return attention(q, k, v, spec, backend="reference")

    register_backend("flash", "own_first", priority=999, fn=eager)
    try:
        attention(q, k, v, spec)
        attention(q, k, v, spec)
        assert len(calls) == 2  # auto picked it (and remembered the decision)
    finally:
        unregister_backend("flash", "own_first")
    attention(q, k, v, spec)
    assert len(calls) == 2, "auto still ran the unregistered backend (a stale dispatch decision)"
    assert "own_first" not in attn_zoo.get_backends("flash")


@pytest.mark.parametrize("kwargs, field, readers", [
    (dict(kind="flash", block_size=16), "block_size", "'sparse'"),
    (dict(kind="flash", feature_map="relu"), "feature_map", "'linear'"),
    (dict(kind="sliding_window", window_size=(3, 0), sparse_pattern="strided"), "sparse_pattern", "'sparse'"),
    (dict(kind="linear", window_size=(3, 0)), "window_size", "'sliding_window' / 'dilated_window'"),
    (dict(kind="sparse", num_features=8), "num_features", "'linear'"),
    (dict(kind="flash", chunk_size=16), "chunk_size", "'linear'"),
    # the linear family has no softmax: a scale there was accepted and ignored (outputs equal to the default's)
    (dict(kind="linear", softmax_scale=0.5), "softmax_scale",
     "'flash' / 'sliding_window' / 'sparse' / 'dilated_window'"),
])
def test_unused_spec_fields_are_refused_naming_the_kinds_that_read_them(kwargs, field, readers):
    with pytest.raises(ValueError, match=rf"{field}=.* is not read by kind='{kwargs['kind']}'; {field} is only used "
                                         rf"by kind={readers}"):
        make_spec(**kwargs)
    # at its default it is accepted (a yaml may spell the default out)
    default = AttentionSpec.__dataclass_fields__[field].default
    make_spec(**{**kwargs, field: default})


def test_cache_policy_is_the_variants():
    assert get_variant("flash").cache_policy(AttentionSpec(kind="flash")) == CachePolicy("full")
    assert get_variant("sparse").cache_policy(AttentionSpec(kind="sparse")) == CachePolicy("full")
    win = AttentionSpec(kind="sliding_window", window_size=(7, 0))
    assert get_variant("sliding_window").cache_policy(win) == CachePolicy("window", 8)
    noncausal = AttentionSpec(kind="sliding_window", window_size=(7, 0), causal=False)
    assert get_variant("sliding_window").cache_policy(noncausal) == CachePolicy("full")
    dil = make_spec("dilated_window", window_size=(3, 0), dilation=2)
    assert get_variant("dilated_window").cache_policy(dil) == CachePolicy("window", 7)
    assert get_variant("linear").cache_policy(AttentionSpec(kind="linear")).kind == "state"
    with pytest.raises(ValueError, match="CachePolicy kind='rolling' is not supported; allowed values: full, window"):
        CachePolicy("rolling")
    with pytest.raises(ValueError, match="window= is set for kind='window' only"):
        CachePolicy("full", 3)


def test_the_cache_policy_builds_the_cache():
    """The policy object builds the layer's decode state (the model asks it, never the policy's name)."""
    spec, lin = AttentionSpec(kind="flash"), AttentionSpec(kind="linear")
    args = dict(batch_size=2, n_kv_heads=3, head_dim=8, capacity=40, dtype=torch.float32, device="cpu")
    full = CachePolicy("full").new_cache(spec, **args, page_size=16)
    assert isinstance(full, KVCache) and full.capacity == 48 and full.keep_last is None  # whole pages
    win = CachePolicy("window", 6).new_cache(spec, **args)
    assert isinstance(win, KVCache) and (win.capacity, win.keep_last) == (12, 6)
    big = CachePolicy("window", 100).new_cache(spec, **args)  # a window past the capacity: the capacity bounds it
    assert (big.capacity, big.keep_last) == (40, 40)
    state = CachePolicy("state").new_cache(lin, **args)
    assert isinstance(state, LinearState) and state.S.shape[:2] == (2, 3)
    with pytest.raises(ValueError, match="keeps a latent cache"):
        CachePolicy("latent").new_cache(spec, **args)
    assert CachePolicy("full").full_kv and not CachePolicy("window", 4).full_kv


def test_a_plugin_window_variant_gets_a_bounded_cache():
    """A plugin whose mask is a causal window (no kind name anywhere outside its registration) keeps only its window
    in the model's decode cache and in the memory table, and generates as without a cache."""
    register_variant("own_window", "softmax", mask=_window_mask(3), subquadratic=True)
    try:
        spec = AttentionSpec(kind="own_window")
        assert layer_cache_bytes(spec, 4, 8, 10_000) == layer_cache_bytes(spec, 4, 8, 4) == 2 * 4 * 8 * 2 * 4
        cfg = GPTConfig(vocab_size=37, n_layer=2, n_head=4, d_model=32, max_seq_len=40)
        torch.manual_seed(0)
        model = GPT(cfg, spec, backend="reference").eval()
        caches = model.init_cache(2, capacity=30)
        assert all(isinstance(c, KVCache) and c.keep_last == 4 and c.capacity == 8 for c in caches)
        idx = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(1))
        assert torch.equal(model.generate(idx, 20, greedy=True, use_cache=True),
                           model.generate(idx, 20, greedy=True, use_cache=False))
        with pytest.raises(ValueError, match="keeps only the last 4 tokens; kind='flash'"):
            c = KVCache(1, 2, 8, 8, keep_last=4)
            for _ in range(3):
                c.append(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
            c.attend(torch.randn(1, 2, 1, 8), AttentionSpec(kind="flash"))
    finally:
        unregister_variant("own_window")


LAYERS = {
    "linear": [dict(kind="linear", feature_map="elu1", chunk_size=4)],
    "linear_favor": [dict(kind="linear", feature_map="favor", num_features=16, chunk_size=4)],
    "sliding_window": [dict(kind="sliding_window", window_size=(4, 0))],
    "dilated_window": [dict(kind="dilated_window", window_size=(2, 0), dilation=2)],  # a window cache of 5 tokens
    "hybrid": [dict(kind="linear", chunk_size=4), dict(kind="flash", kv_group_size=2),
               dict(kind="sparse", block_size=4)],
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_multi_token_chunks_after_a_prefill_continue_the_state(name):
    """Prefill 5 tokens, then chunks of 3, 1, 4, 2, 3 tokens: each chunk's logits equal the full forward's rows (a
    chunk that restarted the linear state, or read a truncated window, would differ)."""
    layers = LAYERS[name]
    cfg = GPTConfig(vocab_size=37, n_layer=max(len(layers), 2), n_head=4, d_model=32, max_seq_len=24)
    torch.manual_seed(0)
    specs = [make_spec(**d) for d in layers]
    model = GPT(cfg, specs if len(specs) > 1 else specs[0], backend="reference").eval()
    idx = torch.randint(0, 37, (2, 18), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        caches = model.init_cache(2, capacity=18)
        outs, t = [model(idx[:, :5], caches=caches, pos=0)], 5
        for n in (3, 1, 4, 2, 3):
            outs.append(model(idx[:, t: t + n], caches=caches, pos=t))
            t += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=2e-5, rtol=1e-5)
    if name.endswith("window"):  # the policy's rolling cache, not the whole context
        assert all(isinstance(c, KVCache) and c.keep_last == 5 for c in caches)
    if name.startswith("linear"):
        assert all(isinstance(c, LinearState) and c.n == 18 for c in caches)


def test_the_cost_entry_is_the_variants():
    """cost_model.spec_cost asks the variant's cost entry; without one, its family's default over its own mask."""
    from attn_zoo import cost_model as cm
    from attn_zoo.variants import element_fraction

    win = AttentionSpec(kind="sliding_window", window_size=(63, 0))
    want = cm.flash_attention_cost(1, 2, 1024, 64, mode="fwd", visited_fraction=element_fraction(win, 1024))
    assert cm.spec_cost(win, 1, 2, 1024, 64, mode="fwd") == want
    assert cm.spec_cost(win, 1, 2, 1024, 64).flops < cm.spec_cost(AttentionSpec(kind="flash"), 1, 2, 1024, 64).flops
    lin = cm.spec_cost(AttentionSpec(kind="linear"), 1, 2, 1024, 64)
    assert lin == cm.linear_attention_cost(1, 2, 1024, 64, F=64)
    seen = []
    register_variant("own_costed", "softmax", mask=_window_mask(2),
                     cost=lambda spec, B, H, N, D, **kw: seen.append(kw["mode"]) or want)
    try:
        assert cm.spec_cost(AttentionSpec(kind="own_costed"), 1, 2, 1024, 64, mode="fwd") is want
        assert seen == ["fwd"]
    finally:
        unregister_variant("own_costed")
