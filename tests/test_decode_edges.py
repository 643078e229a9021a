"""Edges of the decode path that the broader decode tests (tests/test_decode.py) miss: each test here was checked
against a hand-written bug (issues 28 item 5 and 29 item 5) and fails on it.

KV caches: a negative ``cache_seqlens`` in ``append_kv``, a ``keep_last`` cache too small for ``Nq`` queries, an
``append`` that fails (out of pages, wrong dtype) and must leave the cache untouched, ``page_size`` reaching the
model's caches. Decode attention: a key tile starting part-way into a larger page, several queries whose windows
start in different tiles, the torch backend's unmasked SDPA shortcut with ragged lengths.

Shapes are tiny (D = 16, key tiles of 16): the Triton kernel runs in the interpreter on CPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, make_spec  # noqa: E402
from attn_zoo.decode import KVCache, append_kv, decode_attention, gather_kv  # noqa: E402
from attn_zoo.decode.attention import decode_attention_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FLASH = AttentionSpec(kind="flash")

pytestmark = pytest.mark.usefixtures("one_thread")


def _randn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(device=DEV, dtype=dtype)


# ------------------------------------------------------------------------------------------- KV cache edges
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_kv_refuses_a_negative_length_and_writes_nothing(paged):
    """cache_seqlens = -1 would index the last slot (Python wraps): refused, naming cache_seqlens, cache untouched."""
    g = torch.Generator().manual_seed(0)
    if paged:
        kc, vc = torch.zeros(4, 1, 4, 8, device=DEV), torch.zeros(4, 1, 4, 8, device=DEV)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEV)
    else:
        kc, vc, bt = torch.zeros(2, 1, 8, 8, device=DEV), torch.zeros(2, 1, 8, 8, device=DEV), None
    kn = _randn(g, 2, 1, 2, 8)  # -1 + 2 = 1: the end is in range, only the start is negative
    for lens in ([3, -1], [-2, 0]):
        sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
        b = lens.index(min(lens))
        with pytest.raises(ValueError, match=rf"cache_seqlens\[{b}\]={min(lens)} must be >= 0"):
            append_kv(kc, vc, kn, kn, sl, bt)
        assert not kc.any() and not vc.any()


def test_keep_last_cache_too_small_for_nq_refuses_instead_of_a_wrong_result():
    """keep_last=7 (window left 6): with capacity 8 < keep_last + Nq, compaction keeps 5 old tokens where the
    first of Nq=3 queries needs 6, so attend refuses; with capacity keep_last + Nq - 1 = 9 it is exact."""
    g = torch.Generator().manual_seed(1)
    B, Hkv, Hq, D, Nq, K = 2, 1, 2, 16, 3, 7
    spec = AttentionSpec(kind="sliding_window", window_size=(K - 1, 0))
    full = KVCache(B, Hkv, D, 64, device=DEV)
    small = KVCache(B, Hkv, D, K + Nq - 2, keep_last=K, device=DEV)
    fits = KVCache(B, Hkv, D, K + Nq - 1, keep_last=K, device=DEV)
    refused = 0
    for step in range(6):
        kt, vt = _randn(g, B, Hkv, Nq, D), _randn(g, B, Hkv, Nq, D)
        q = _randn(g, B, Hq, Nq, D)
        for c in (full, small, fits):
            c.append(kt, vt)
        want = full.attend(q, spec, backend="reference")
        torch.testing.assert_close(fits.attend(q, spec, backend="reference"), want, atol=1e-5, rtol=0)
        if any(small.dropped):
            with pytest.raises(ValueError, match=r"keep_last=7 cache \(capacity=8\).*capacity >= keep_last \+ Nq"):
                small.attend(q, spec, backend="reference")
            refused += 1
        else:
            torch.testing.assert_close(small.attend(q, spec, backend="reference"), want, atol=1e-5, rtol=0)
    assert refused >= 3 and any(fits.dropped)


def _state(c: KVCache):
    return (list(c.lengths), list(c.dropped), c.seqlens.clone(), c.k.clone(), c.v.clone(),
            None if c.block_table is None else c.block_table.clone(), c.num_free_pages,
            None if c.page_size is None else list(c._free))


def _same_state(a, b):
    assert a[0] == b[0] and a[1] == b[1] and a[6] == b[6] and a[7] == b[7]
    for x, y in zip(a[2:6], b[2:6]):
        assert (x is None and y is None) or torch.equal(x, y)


def test_failed_append_leaves_the_cache_and_the_page_pool_untouched():
    """Out of pages, a wrong dtype / shape / head count: the append raises before it takes a page or writes a
    token; the cache then still works (attend == reference over the tokens appended successfully)."""
    g = torch.Generator().manual_seed(2)
    B, Hkv, Hq, D = 2, 1, 2, 16
    c = KVCache(B, Hkv, D, 64, page_size=8, num_pages=6, shuffle_pages=True, seed=3, device=DEV)
    k0, v0 = _randn(g, B, Hkv, 8, D), _randn(g, B, Hkv, 8, D)
    c.append(k0, v0)  # one page each, 4 free
    assert c.num_free_pages == 4
    before = _state(c)
    bad = [
        (RuntimeError, "out of pages.*needs 6 more, 4 are free", (_randn(g, B, Hkv, 17, D),) * 2),  # 2 x 3 pages
        (TypeError, "must match k_new's dtype", (_randn(g, B, Hkv, 1, D, dtype=torch.float16),) * 2),
        (TypeError, "k_new.dtype=torch.float32 and v_new.dtype=torch.float16",
         (_randn(g, B, Hkv, 1, D), _randn(g, B, Hkv, 1, D, dtype=torch.float16))),
        (ValueError, "K/V heads", (_randn(g, B, 2, 1, D),) * 2),
        (ValueError, "must have the same shape", (_randn(g, B, Hkv, 1, D), _randn(g, B, Hkv, 2, D))),
    ]
    for exc, msg, (kn, vn) in bad:
        with pytest.raises(exc, match=msg):
            c.append(kn, vn)
        _same_state(_state(c), before)
    k1, v1 = _randn(g, B, Hkv, 9, D), _randn(g, B, Hkv, 9, D)
    c.append(k1, v1)  # 17 tokens: 3 pages each, the 6 of the pool
    assert c.lengths == [17, 17] and c.num_free_pages == 0
    q = _randn(g, B, Hq, 1, D)
    k, v = torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)
    want = decode_attention_reference(q, k, v, FLASH, torch.full((B,), 17, dtype=torch.int32, device=DEV))
    torch.testing.assert_close(c.attend(q, FLASH, backend="reference"), want, atol=1e-5, rtol=0)
    # a sliding-window cache: a failed append does not compact (lengths / dropped / tokens unchanged)
    w = KVCache(B, Hkv, D, 8, keep_last=4, device=DEV)
    w.append(_randn(g, B, Hkv, 7, D), _randn(g, B, Hkv, 7, D))
    before = _state(w)
    with pytest.raises(TypeError, match="must match k_new's dtype"):
        w.append(*(2 * [_randn(g, B, Hkv, 3, D, dtype=torch.float16)]))
    _same_state(_state(w), before)


def test_model_caches_take_the_page_size():
    """GPT.init_cache(page_size=...) gives full-attention layers paged caches of exactly that page size (pool
    layout (num_pages, Hkv, page_size, D), a block table, pages handed out on demand); sliding-window layers keep
    their contiguous last-W cache; paged generation gives the contiguous tokens."""
    from attn_zoo.model import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=23, n_layer=2, n_head=4, d_model=32, max_seq_len=40)
    specs = [make_spec("flash", kv_group_size=2), make_spec("sliding_window", window_size=(3, 0))]
    torch.manual_seed(0)
    model = GPT(cfg, specs, backend="reference").eval()
    for ps in (4, 8):
        full, win = model.init_cache(2, capacity=30, page_size=ps)
        assert full.page_size == ps and full.block_table is not None
        assert full.k.shape == (2 * -(-30 // ps), 2, ps, 8) and full.v.shape == full.k.shape
        assert full.block_table.shape == (2, -(-30 // ps)) and full.capacity == -(-30 // ps) * ps
        assert win.page_size is None and win.block_table is None and win.keep_last == 4
        with torch.no_grad():
            model(torch.randint(0, 23, (2, 2 * ps + 1)), caches=[full, win], pos=0)
        assert full.num_free_pages == full.k.shape[0] - 2 * 3  # 2 ps + 1 tokens: 3 pages per sequence
    contiguous = model.init_cache(2, capacity=30)[0]
    assert contiguous.page_size is None and contiguous.k.shape == (2, 2, 30, 8)
    idx = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(1))
    want = model.generate(idx, 8, greedy=True, use_cache=True)
    assert torch.equal(model.generate(idx, 8, greedy=True, use_cache=True, page_size=4), want)


# ------------------------------------------------------------------------------------------- decode attention edges
def _paged_cache(g, B, Hkv, D, cap, page_size, dtype=torch.float32):
    """A pool of shuffled pages (every page belongs to one sequence) and its block table."""
    n_pages = -(-cap // page_size)
    perm = torch.randperm(B * n_pages, generator=g).view(B, n_pages).to(torch.int32).to(DEV)
    shape = (B * n_pages, Hkv, page_size, D)
    return _randn(g, *shape, dtype=dtype), _randn(g, *shape, dtype=dtype), perm


@pytest.mark.parametrize("name", ["flash", "window"])
def test_key_tiles_inside_a_larger_page(name):
    """Pages of 32 (and 64) tokens, key tiles of 16: the second tile of a page starts 16 tokens into it, and the
    windows start mid-page (keys 34 and 95; lengths not page-aligned either). The kernel
    must read from the tile's offset within the page, not from the page's start."""
    g = torch.Generator().manual_seed(5)
    spec = FLASH if name == "flash" else AttentionSpec(kind="sliding_window", window_size=(21, 0))
    B, Hq, Hkv, D, Nq = 3, 2, 1, 16, 2
    for page_size in (32, 64):
        k, v, bt = _paged_cache(g, B, Hkv, D, 128, page_size)
        seqlens = torch.tensor([23, 57, 118], dtype=torch.int32, device=DEV)  # windows start at 0, 34, 95
        q = _randn(g, B, Hq, Nq, D)
        want = decode_attention_reference(q, k, v, spec, seqlens, bt)
        for splits in (1, 3):
            got = decode_attention(q, k, v, spec, seqlens, bt, backend="triton", block_n=16, num_splits=splits)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
        torch.testing.assert_close(decode_attention(q, k, v, spec, seqlens, bt, backend="torch"), want,
                                   atol=2e-5, rtol=0)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged16"])
def test_windows_of_first_and_last_query_start_in_different_tiles(paged):
    """Nq = 4 new queries, window left 10, key tiles of 16: with seqlen = 16 k + 12 the last query's window starts
    at 16 k + 1 (tile k), the first query's at 16 k - 2 (tile k - 1). The first visited tile must come from the
    first query's window, or its keys 16 k - 2 and 16 k - 1 are lost."""
    g = torch.Generator().manual_seed(6)
    spec = AttentionSpec(kind="sliding_window", window_size=(10, 0))
    B, Hq, Hkv, D, Nq, cap = 3, 4, 2, 16, 4, 64
    seqlens = torch.tensor([28, 44, 60], dtype=torch.int32, device=DEV)
    for L in seqlens.tolist():  # the premise: first and last query's windows start in different tiles
        assert (L - Nq - 10) // 16 != (L - 1 - 10) // 16
    if paged:
        k, v, bt = _paged_cache(g, B, Hkv, D, cap, 16)
    else:
        k, v, bt = _randn(g, B, Hkv, cap, D), _randn(g, B, Hkv, cap, D), None
    q = _randn(g, B, Hq, Nq, D)
    want = decode_attention_reference(q, k, v, spec, seqlens, bt)
    for splits in (1, 2):
        got = decode_attention(q, k, v, spec, seqlens, bt, backend="triton", block_n=16, num_splits=splits)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    torch.testing.assert_close(decode_attention(q, k, v, spec, seqlens, bt, backend="torch"), want, atol=2e-5, rtol=0)
    # the same rows of a full causal-window forward over each sequence
    import attn_zoo

    for b, L in enumerate(seqlens.tolist()):
        kb, vb = gather_kv(k, v, bt[b: b + 1], L) if paged else (k[b: b + 1, :, :L], v[b: b + 1, :, :L])
        qf = torch.cat([_randn(g, 1, Hq, L - Nq, D), q[b: b + 1]], 2)
        full = attn_zoo.attention(qf, kb, vb, spec, backend="reference")
        torch.testing.assert_close(want[b: b + 1], full[:, :, -Nq:], atol=2e-5, rtol=0)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged8"])
def test_torch_backend_one_causal_query_with_ragged_lengths(paged):
    """One causal query per sequence, lengths differing across the batch: the shorter sequences must not see the
    slots past their end (SDPA without a mask would), for the torch backend as for the others."""
    g = torch.Generator().manual_seed(7)
    B, Hq, Hkv, D, cap = 3, 4, 2, 16, 32
    if paged:
        k, v, bt = _paged_cache(g, B, Hkv, D, cap, 8)
    else:
        k, v, bt = _randn(g, B, Hkv, cap, D), _randn(g, B, Hkv, cap, D), None
    q = _randn(g, B, Hq, 1, D)
    for lens in ([5, 32, 17], [32, 31, 32], [9, 9, 8]):
        seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
        want = decode_attention_reference(q, k, v, FLASH, seqlens, bt)
        for backend in ("torch", "triton"):
            got = decode_attention(q, k, v, FLASH, seqlens, bt, backend=backend)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=0, msg=lambda m: f"{backend} {lens}: {m}")


# ---------------------------------------------------------------------- a fresh helper's decode findings (36th)
def _tiny_gpt(spec, **kw):
    from attn_zoo.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=31, n_layer=2, n_head=4, d_model=32, max_seq_len=24, **kw), spec,
            backend="reference").eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("kind,kw", [("sliding_window", dict(window_size=(3, 0))),
                                     ("dilated_window", dict(window_size=(2, 0), dilation=2))])
def test_window_cache_takes_a_chunk_of_any_length(kind, kw):
    """A window layer's cache (2 W slots, keep_last W) refused a chunk of more than W + 1 tokens after the prefill
    (with a message asking for a capacity init_cache had chosen), having appended to the first layer already; it now
    takes the chunk in pieces it holds: cached logits equal the full forward's for chunks of 1 to 15."""
    from attn_zoo import make_spec

    m = _tiny_gpt(make_spec(kind=kind, **kw))
    idx = torch.randint(0, 31, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(idx)
        for chunk in (1, 5, 7, 13, 15):
            c = m.init_cache(2, capacity=24)
            m(idx[:, :5], caches=c, pos=0)
            torch.testing.assert_close(m(idx[:, 5:5 + chunk], caches=c, pos=5), full[:, 5:5 + chunk], atol=1e-4,
                                       rtol=1e-4)


@pytest.mark.parametrize("kind", ["flash", "linear", "sliding_window"])
def test_pos_and_batch_must_match_the_caches(kind):
    """GPT.forward with caches: a pos other than the tokens the caches hold (e.g. re-prefilling a used cache with
    pos=0), or a batch other than the caches', gave wrong logits (or a bare torch error) silently; now a ValueError
    naming pos / the batch."""
    from attn_zoo import make_spec

    m = _tiny_gpt(make_spec(kind=kind, **(dict(window_size=(3, 0)) if kind == "sliding_window" else {})))
    idx = torch.randint(0, 31, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        c = m.init_cache(2, capacity=24)
        m(idx[:, :5], caches=c, pos=0)
        for bad in (0, 3, 6):
            with pytest.raises(ValueError, match=rf"pos={bad}: layer 0's cache holds \[5\] tokens"):
                m(idx[:, 5:6], caches=c, pos=bad)
        with pytest.raises(ValueError, match=r"made for batch 2, idx has batch 1"):
            m(idx[:1, 5:6], caches=c, pos=5)
        m(idx[:, 5:6], caches=c, pos=5)  # the right pos still runs


def test_decode_plan_refuses_a_dilated_window():
    """make_decode_plan built a plan for a dilated window and kernels.decode.decode_run then ran it without the
    dilation (an undilated window's result); decode_attention(backend='triton') already refused it."""
    from attn_zoo import AttentionSpec
    from attn_zoo.decode import make_decode_plan

    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 32, 8), torch.randn(1, 2, 32, 8)
    spec = AttentionSpec(kind="dilated_window", window_size=(2, 0), dilation=2)
    with pytest.raises(ValueError, match=r"make_decode_plan: kind='dilated_window' \(dilation 2\): the decode kernel "
                                         r"has no dilation rule"):
        make_decode_plan(q, k, v, spec)
