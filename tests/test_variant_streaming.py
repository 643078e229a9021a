"""The ``streaming`` variant (StreamingLLM: a sliding window plus attention sinks): its mask rule and tile table, its
cost, its rolling cache with the sinks kept in place, and what refuses it (packed documents, left padding, a cache
that dropped its sinks, bad fields)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import MaskInfo, attention, make_spec, mask_info  # noqa: E402
from attn_zoo.decode import KVCache, decode_attention  # noqa: E402
from attn_zoo.variants import (CachePolicy, element_fraction, get_variant, register_variant,  # noqa: E402
                               unregister_variant)

pytestmark = pytest.mark.usefixtures("one_thread")


def _rule(Nq, Nk, left, right, sink, causal):
    """The rule written out: ``j <= i' + right`` (causal ``j <= i'``) and (``j >= i' - left`` or ``j < sink``)."""
    i = torch.arange(Nq).view(-1, 1) + (Nk - Nq)
    j = torch.arange(Nk).view(1, -1)
    ok = (j >= i - left) | (j < sink)
    if right is not None:
        ok &= j <= i + right
    if causal:
        ok &= j <= i
    return ok


@pytest.mark.parametrize("Nq, Nk", [(37, 37), (5, 37), (37, 20)])
@pytest.mark.parametrize("left, right, sink, causal", [(3, 0, 2, True), (6, 0, 9, True), (4, 2, 3, False),
                                                       (0, 0, 1, True), (10, 0, 0, True)])
def test_mask_rule_and_tile_table(Nq, Nk, left, right, sink, causal):
    spec = make_spec("streaming", window_size=(left, right), sink_size=sink, causal=causal)
    mi = mask_info(spec, Nq, Nk)
    dense = mi.dense()
    assert torch.equal(dense, _rule(Nq, Nk, left, 0 if causal else right, sink, causal))
    for bm, bn in ((4, 4), (8, 16), (16, 8)):
        tab = mi.block_table(bm, bn)
        for a in range(tab.visited.shape[0]):
            for b in range(tab.visited.shape[1]):
                tile = dense[a * bm:(a + 1) * bm, b * bn:(b + 1) * bn]
                if tile.any():
                    assert tab.visited[a, b], f"tile ({a}, {b}) holds allowed keys but is not visited"
                if tab.full[a, b]:
                    assert tile.all() and tile.shape == (bm, bn), f"tile ({a}, {b}) marked full is not"


def test_element_fraction_is_exact():
    for N in (1, 2, 7, 40, 129):
        for left, sink in ((0, 1), (3, 2), (3, 50), (31, 4), (200, 4)):
            for causal, right in ((True, 0), (False, 2)):
                spec = make_spec("streaming", window_size=(left, right), sink_size=sink, causal=causal)
                want = mask_info(spec, N, N).dense().double().mean().item()
                assert element_fraction(spec, N) == pytest.approx(want, abs=1e-12), (N, left, sink, causal)


def test_fields_are_checked():
    with pytest.raises(ValueError, match="sink_size must be an integer >= 0"):
        make_spec("streaming", window_size=(3, 0), sink_size=-1)
    with pytest.raises(ValueError, match="sink_size must be an integer >= 0"):
        make_spec("streaming", window_size=(3, 0), sink_size=True)
    with pytest.raises(ValueError, match="needs window_size"):
        make_spec("streaming")
    with pytest.raises(ValueError, match="needs window_size"):
        make_spec("streaming", window_size=(None, 0))
    with pytest.raises(ValueError, match="sink_size"):  # a field the sliding window does not read
        make_spec("sliding_window", window_size=(3, 0), sink_size=2)
    with pytest.raises(ValueError, match="sink_size=2 does not combine with a block layout or dilation"):
        MaskInfo(8, 8, True, window_left=3, dilation=2, sink_size=2)
    with pytest.raises(ValueError, match="sink_size must be an integer >= 0"):
        MaskInfo(8, 8, True, window_left=3, sink_size=1.5)


def test_sink_size_zero_is_the_sliding_window():
    q, k, v = (torch.randn(2, 2, 21, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    a = attention(q, k, v, make_spec("streaming", window_size=(4, 0), sink_size=0, causal=True), backend="torch")
    b = attention(q, k, v, make_spec("sliding_window", window_size=(4, 0), causal=True), backend="torch")
    torch.testing.assert_close(a, b)


def test_the_sinks_change_the_output_only_where_they_are_outside_the_window():
    q, k, v = (torch.randn(1, 2, 30, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    a = attention(q, k, v, make_spec("streaming", window_size=(4, 0), sink_size=3, causal=True), backend="reference")
    b = attention(q, k, v, make_spec("sliding_window", window_size=(4, 0), causal=True), backend="reference")
    torch.testing.assert_close(a[:, :, :5], b[:, :, :5])  # rows 0-4 see the three sinks inside their window
    assert (a[:, :, 5:] - b[:, :, 5:]).abs().amax(-1).min() > 1e-4  # every later row reads a sink its window drops


def test_cache_policy_keeps_the_sinks():
    spec = make_spec("streaming", window_size=(7, 0), sink_size=4, causal=True)
    pol = get_variant("streaming").cache_policy(spec)
    assert pol == CachePolicy("window", 8, sink=4)
    assert pol.kept_tokens(3) == 3 and pol.kept_tokens(1000) == 12
    assert get_variant("streaming").cache_bytes(spec, 2, 16, 1000) == 2 * 2 * 16 * 2 * 12
    with pytest.raises(ValueError, match="sink= is set for kind='window' only"):
        CachePolicy("full", sink=2)
    with pytest.raises(ValueError, match="CachePolicy sink must be an integer >= 0"):
        CachePolicy("window", 4, sink=-1)


@pytest.mark.parametrize("chunk", [1, 3])
def test_streaming_decode_through_its_rolling_cache_equals_the_full_forward(chunk):
    """Token by token (and 3 at a time) far past the window: the cache holds the sinks and the tail only, yet every
    step equals the last rows of the reference's full forward over every token so far."""
    left, sink, L, H, Hkv, D = 5, 3, 41, 4, 2, 8
    spec = make_spec("streaming", window_size=(left, 0), sink_size=sink, causal=True)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, L, D, generator=g)
    k, v = torch.randn(2, Hkv, L, D, generator=g), torch.randn(2, Hkv, L, D, generator=g)
    want = attention(q, k, v, spec, backend="reference")
    cache = get_variant("streaming").cache_policy(spec).new_cache(spec, 2, Hkv, D, capacity=1000,
                                                                   dtype=torch.float32, device="cpu")
    assert cache.capacity == 2 * (left + 1) + sink and cache.keep_first == sink
    for s in range(0, L, chunk):
        e = min(s + chunk, L)
        out = cache.append_attend(k[:, :, s:e], v[:, :, s:e], q[:, :, s:e], spec, backend="torch")
        torch.testing.assert_close(out, want[:, :, s:e], atol=1e-5, rtol=1e-5, msg=lambda m: f"step {s}: {m}")
        assert max(cache.lengths) <= cache.capacity
    assert cache.dropped[0] > 0 and torch.equal(cache.k[:, :, :sink], k[:, :, :sink])  # the sinks stayed in place


def test_a_cache_without_the_sinks_is_refused_after_it_dropped_tokens():
    stream = make_spec("streaming", window_size=(3, 0), sink_size=2, causal=True)
    window = make_spec("sliding_window", window_size=(3, 0), causal=True)
    k = torch.randn(1, 1, 30, 8)
    plain = get_variant("sliding_window").cache_policy(window).new_cache(window, 1, 1, 8, 100, torch.float32, "cpu")
    plain.append(k, k)
    with pytest.raises(ValueError, match="its sinks must be the cache's keep_first"):
        plain.attend(torch.randn(1, 1, 1, 8), stream)
    sinks = get_variant("streaming").cache_policy(stream).new_cache(stream, 1, 1, 8, 100, torch.float32, "cpu")
    for t in range(30):
        sinks.append(k[:, :, t:t + 1], k[:, :, t:t + 1])
    with pytest.raises(ValueError, match="its sinks must be the cache's keep_first"):
        sinks.attend(torch.randn(1, 1, 1, 8), window)  # the front slots are the sinks, not the window's keys
    small = get_variant("streaming").cache_policy(stream).new_cache(stream, 1, 1, 8, 5, torch.float32, "cpu")
    for t in range(8):
        small.append(k[:, :, t:t + 1], k[:, :, t:t + 1])
    with pytest.raises(ValueError, match="reads a window of the last 4: size it with keep_last >= 4"):
        small.attend(torch.randn(1, 1, 1, 8), stream)  # 2 sinks + 3 of the window's 4 tokens: the message says so


def test_keep_first_arguments_are_checked():
    with pytest.raises(ValueError, match="keep_first .* needs keep_last"):
        KVCache(1, 1, 8, 16, keep_first=2)
    with pytest.raises(ValueError, match="keep_first=12 must be an integer >= 1 with keep_first \\+ keep_last"):
        KVCache(1, 1, 8, 16, keep_last=8, keep_first=12)


@pytest.mark.parametrize("n", [9, 13, 30])
def test_a_long_append_keeps_the_sinks_and_the_tail(n):
    """A prompt longer than the slots beside the sinks (a prefill) is taken in pieces: the sinks stay the first
    tokens, the tail holds at least the last ``keep_last``, all contiguous, as when appended one by one."""
    k = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 1, n, 8).contiguous()
    whole, one = KVCache(1, 1, 8, 12, keep_last=4, keep_first=2), KVCache(1, 1, 8, 12, keep_last=4, keep_first=2)
    whole.append(k, k)
    for t in range(n):
        one.append(k[:, :, t:t + 1], k[:, :, t:t + 1])
    for c in (whole, one):
        L = c.lengths[0]
        held = c.k[0, 0, :L, 0].tolist()
        assert held[:2] == [0.0, 1.0] and L - 2 >= 4, held
        assert held[2:] == [float(x) for x in range(n - (L - 2), n)], held  # a contiguous tail up to the last token
        assert c.tokens_seen() == [n]


def test_generate_with_a_long_prompt_and_past_max_seq_len():
    """The prefill of a prompt longer than the cache's slots beside the sinks, and the re-prefill of a context
    cropped to ``max_seq_len``, both fill the sink cache; the tokens equal the uncached run's."""
    from attn_zoo.model import GPT, GPTConfig

    spec = make_spec("streaming", window_size=(3, 0), sink_size=2, causal=True)
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, max_seq_len=24), spec,
            backend="reference").eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    idx = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(2))
    want = m.generate(idx, 30, greedy=True, use_cache=False)
    assert torch.equal(m.generate(idx, 30, greedy=True, use_cache=True), want)


def test_memory_saturates_at_the_window_and_the_sinks():
    from attn_zoo.decode.memory import max_context

    spec = make_spec("streaming", window_size=(99, 0), sink_size=50, causal=True)
    per_token = get_variant("streaming").cache_bytes(spec, 4, 16, 1)  # one token of one layer, one sequence
    assert max_context([spec], 4, 16, budget_bytes=120 * per_token) == 120  # 150 kept tokens do not fit
    assert max_context([spec], 4, 16, budget_bytes=150 * per_token) is None  # the whole stream fits


def test_packed_training_is_refused_before_the_run():
    from attn_zoo.mixers import layer_takes

    assert layer_takes(make_spec("streaming", window_size=(3, 0), sink_size=2), "doc_ids") is False
    assert layer_takes(make_spec("sliding_window", window_size=(3, 0)), "doc_ids") is not False


def test_packed_documents_and_left_padding_are_refused():
    spec = make_spec("streaming", window_size=(3, 0), sink_size=2, causal=True)
    q = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match="kind='streaming' does not take doc_ids"):
        attention(q, q, q, spec, doc_ids=torch.zeros(1, 10, dtype=torch.int32))
    cache = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match="cache_leftpad with kind='streaming' \\(sink_size=2\\) is not supported"):
        decode_attention(q[:, :, :1], cache, cache, spec, torch.tensor([10], dtype=torch.int32),
                         cache_leftpad=torch.tensor([2], dtype=torch.int32))


def test_fa4_refuses_the_sinks(monkeypatch):
    """FA4 takes a window_size alone: past its input checks (faked here: no CUDA), its rule names the sinks."""
    from attn_zoo.backends import torch_anchors

    monkeypatch.setattr(torch_anchors, "_fa4_input_reason", lambda *a: None)
    monkeypatch.setattr(torch_anchors, "_min_sm90", lambda: None)
    x = torch.zeros(1, 1, 16, 8)
    spec = make_spec("streaming", window_size=(3, 0), sink_size=2, causal=True)
    assert "attention sinks are not expressible in FA4's window_size" in torch_anchors._fa4_supports(x, x, x, spec, False)
    window = make_spec("sliding_window", window_size=(3, 0), causal=True)
    assert torch_anchors._fa4_supports(x, x, x, window, False) is None


def test_a_plugin_window_policy_with_sinks_is_checked_against_its_mask():
    """A plugin's own ``CachePolicy('window', W, sink=S)`` is checked against its mask: the streaming rule with the
    right sinks passes, one that forgets them (sink=0) is refused, as is one that keeps too few."""

    def mask(spec, Nq, Nk):
        return {"window_left": 5, "window_right": 0, "sink_size": 3}

    try:
        for sink, ok in ((3, True), (0, False), (2, False)):
            register_variant("streaming_plugin", "softmax", mask=mask,
                             cache_policy=lambda spec, s=sink: CachePolicy("window", 6, sink=s))
            spec = attn_zoo.AttentionSpec(kind="streaming_plugin", causal=True)
            if ok:
                assert get_variant("streaming_plugin").cache_policy(spec) == CachePolicy("window", 6, sink=3)
            else:
                with pytest.raises(ValueError, match="would decode wrong"):
                    get_variant("streaming_plugin").cache_policy(spec)
    finally:
        unregister_variant("streaming_plugin")


def test_every_path_into_the_triton_decode_kernel_keeps_the_sinks():
    """The registry's triton decode backend, the backend called by name and a plan all pass the sinks to the kernel
    (the window alone would decode wrong: the check below fails without them)."""
    from attn_zoo.decode.attention import _triton_reason, decode_attention_triton, make_decode_plan

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton decode kernel needs CUDA or TRITON_INTERPRET=1")
    spec = make_spec("streaming", window_size=(3, 0), sink_size=2, causal=True)
    window = make_spec("sliding_window", window_size=(3, 0), causal=True)
    g = torch.Generator().manual_seed(0)
    q, cache = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g)
    lens = torch.tensor([20], dtype=torch.int32)
    want = decode_attention(q, cache, cache, spec, lens, backend="reference")
    assert not torch.allclose(want, decode_attention(q, cache, cache, window, lens, backend="reference"), atol=1e-3)
    assert _triton_reason(q, cache, spec, cache) is None
    torch.testing.assert_close(decode_attention(q, cache, cache, spec, lens, backend="triton"), want, atol=2e-3,
                               rtol=2e-3)
    torch.testing.assert_close(decode_attention_triton(q, cache, cache, spec, lens), want, atol=2e-3, rtol=2e-3)
    plan = make_decode_plan(q, cache, cache, spec)
    torch.testing.assert_close(decode_attention(q, cache, cache, spec, lens, backend="triton", plan=plan), want,
                               atol=2e-3, rtol=2e-3)


def test_the_triton_prefill_backend_runs_the_sinks():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernel needs CUDA or TRITON_INTERPRET=1")
    spec = make_spec("streaming", window_size=(5, 0), sink_size=3, causal=True)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g, requires_grad=True) for _ in range(3))
    want = attention(q, k, v, spec, backend="reference")
    got = attention(q, k, v, spec, backend="triton")
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
