"""A variant's own ``cache_policy`` is trusted by the model's decode cache: a ``"window"`` policy becomes a rolling
``KVCache(keep_last=W)`` whose ``attend`` re-bases positions. A policy that does not match the mask decoded silently
wrong (and the conformance suite, which decodes from full caches, passed): e.g. StreamingLLM's sinks + window
declared as ``CachePolicy("window", W + n_sink)`` (the sinks are dropped: logits off by ~4e-2), or a chunked-local
layout (absolute positions) declared as ``CachePolicy("window", chunk)``. The policy is now checked against the mask."""

from dataclasses import dataclass

import pytest
import torch

from attn_zoo import AttentionSpec, make_spec
from attn_zoo.model import GPT, GPTConfig
from attn_zoo.variants import CachePolicy, get_variant, register_variant, unregister_variant


@dataclass(frozen=True)
class _SinkSpec(AttentionSpec):
    n_sink: int = 2


def _sink_mask(spec, Nq, Nk):
    left = spec.window_size[0]
    a, b = torch.arange(Nk).view(-1, 1), torch.arange(Nk).view(1, -1)
    return {"layout": ((b >= a - left) | (b < spec.n_sink)) & (b <= a), "block_size": 1}


@dataclass(frozen=True)
class _ChunkSpec(AttentionSpec):
    chunk: int = 4


def _chunk_mask(spec, Nq, Nk):
    nb = max(-(-Nk // spec.chunk), 1)
    return {"layout": torch.eye(nb, dtype=torch.bool), "block_size": spec.chunk}


@pytest.fixture
def kinds():
    register_variant("sink_policy_probe", "softmax", spec_class=_SinkSpec, fields=("window_size", "n_sink"),
                     mask=_sink_mask, cache_policy=lambda s: CachePolicy("window", s.window_size[0] + 1 + s.n_sink))
    register_variant("chunk_policy_probe", "softmax", spec_class=_ChunkSpec, fields=("chunk",), mask=_chunk_mask,
                     cache_policy=lambda s: CachePolicy("window", s.chunk))
    register_variant("window_policy_probe", "softmax", fields=("window_size",),
                     mask=lambda s, Nq, Nk: {"window_left": s.window_size[0], "window_right": s.window_size[1]},
                     cache_policy=lambda s: CachePolicy("window", s.window_size[0] + 1))
    yield
    for k in ("sink_policy_probe", "chunk_policy_probe", "window_policy_probe"):
        unregister_variant(k)


def test_a_window_policy_that_drops_the_sinks_is_refused(kinds):
    spec = make_spec("sink_policy_probe", window_size=(5, 0), n_sink=2)
    with pytest.raises(ValueError, match="sink_policy_probe.*tokens back"):
        get_variant("sink_policy_probe").cache_policy(spec)
    model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=48), [spec]).eval()
    with pytest.raises(ValueError, match="tokens back"):  # before: a 8-token rolling cache, wrong logits
        model.init_cache(1, 48)


def test_a_window_policy_on_absolute_positions_is_refused(kinds):
    spec = make_spec("chunk_policy_probe", chunk=4)
    with pytest.raises(ValueError, match="absolute positions"):
        get_variant("chunk_policy_probe").cache_policy(spec)


def test_a_true_window_policy_is_kept(kinds):
    spec = make_spec("window_policy_probe", window_size=(6, 0))
    assert get_variant("window_policy_probe").cache_policy(spec) == CachePolicy("window", 7)
    cfg = GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=48)
    torch.manual_seed(0)
    model = GPT(cfg, [spec], backend="reference").eval()
    idx = torch.randint(0, 32, (2, 40))
    with torch.no_grad():
        full = model(idx)
        full = full[0] if isinstance(full, tuple) else full
        caches = model.init_cache(2, 48)
        outs = [model(idx[:, :9], caches=caches, pos=0)]
        outs += [model(idx[:, t:t + 1], caches=caches, pos=t) for t in range(9, 40)]
    inc = torch.cat([o[0] if isinstance(o, tuple) else o for o in outs], 1)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


def test_a_window_within_long_chunks_is_refused():
    """Chunks of 1000 tokens intersected with a window of 8 declared as CachePolicy("window", 8): translation
    invariant at every length the check probed (at most 3 W + 7 and W + 129), but the first token of the second
    chunk (position 1000) sees only itself, where a rolling cache re-based to 8 tokens sees all 8."""
    def mask(s, Nq, Nk):
        nb = max(-(-Nk // s.chunk), 1)
        return {"layout": torch.eye(nb, dtype=torch.bool), "block_size": s.chunk, "window_left": 7}

    register_variant("chunk_window_policy_probe", "softmax", spec_class=_ChunkSpec, fields=("chunk",), mask=mask,
                     cache_policy=lambda s: CachePolicy("window", 8))
    try:
        with pytest.raises(ValueError, match="depends on absolute positions"):
            get_variant("chunk_window_policy_probe").cache_policy(make_spec("chunk_window_policy_probe", chunk=1000))
    finally:
        unregister_variant("chunk_window_policy_probe")


def test_the_check_leaves_the_mask_cache_alone(kinds):
    """The check builds ~200 masks (one per probed length): through mask_info's cache of 256 it evicted the masks in
    use and held every layout it made (2.6 GB after a token-level layout's check at W = 4096)."""
    from attn_zoo.masks import _mask_info, mask_info

    spec = make_spec("window_policy_probe", window_size=(63, 0))
    mask_info(spec, 16, 16)
    before = _mask_info.cache_info().currsize
    get_variant("window_policy_probe").cache_policy(spec)
    assert _mask_info.cache_info().currsize == before
