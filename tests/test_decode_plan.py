"""Decode kernel paths of issue 29 item 3 and issue 26 item 4, against the reference, tiny shapes (interpreter):

* the plan / run split (``decode_plan`` / ``decode_run`` / ``make_decode_plan``): equal outputs on repeated runs,
  no allocation in ``run`` (``torch.empty`` / ``zeros`` patched to fail), the plan's buffers / the given ``out``
  written, split-K count from ``sm_count``;
* several new queries (Nq 2..8) x GQA heads packed into one tile, windows, paged caches of 16 / 32 tokens read
  with tiles of 64 keys (several pages per tile);
* ``cache_leftpad`` (the first visible key of each row) on every backend, contiguous and paged;
* ``Dv != D`` (MLA's absorbed decode reads a latent of ``D`` for q.k and ``Dv`` for the values).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec  # noqa: E402
from attn_zoo.decode import decode_attention, make_decode_plan  # noqa: E402
from kernels.decode import decode_attn, decode_attn_reference, decode_plan, decode_run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FLASH = AttentionSpec(kind="flash")
WIN = AttentionSpec(kind="sliding_window", window_size=(20, 0))

pytestmark = pytest.mark.usefixtures("one_thread")


def _randn(g, *shape):
    return torch.randn(*shape, generator=g).to(DEV)


def _cache(g, B, Hkv, D, cap, page_size=None, Dv=None):
    Dv = Dv or D
    if page_size is None:
        return _randn(g, B, Hkv, cap, D), _randn(g, B, Hkv, cap, Dv), None
    n = -(-cap // page_size)
    bt = torch.randperm(B * n, generator=g).view(B, n).to(torch.int32).to(DEV)
    return _randn(g, B * n, Hkv, page_size, D), _randn(g, B * n, Hkv, page_size, Dv), bt


@pytest.mark.parametrize("merge", ["fused", "kernel"])
def test_plan_run_reuses_its_buffers_and_allocates_nothing(monkeypatch, merge):
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, Nq, D = 2, 4, 2, 3, 16
    k, v, bt = _cache(g, B, Hkv, D, 96, 16)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([70, 41], dtype=torch.int32, device=DEV)
    plan = decode_plan(q, k, v, bt, window_size=(30, 0), block_n=16, num_splits=3, return_lse=True, merge=merge)
    assert plan.num_splits > 1 and plan.scratch is not None  # the split-K path is exercised
    assert plan.merge == merge
    want, want_lse = decode_attn_reference(q, k, v, lens, bt, window_size=(30, 0), return_lse=True)
    ptrs = (plan.out.data_ptr(), plan.scratch[0].data_ptr(), plan.scratch[1].data_ptr())

    def no_alloc(*a, **kw):
        raise AssertionError("decode_run allocated a tensor")

    for name in ("empty", "zeros", "empty_like", "zeros_like", "full", "tensor"):
        monkeypatch.setattr(torch, name, no_alloc)
    plan.out.fill_(float("nan"))
    o1, l1 = decode_run(plan, q, k, v, lens, bt)
    o1c, l1c = o1.clone(), l1.clone()
    o2, l2 = decode_run(plan, q, k, v, lens, bt)
    monkeypatch.undo()
    assert o1.data_ptr() == o2.data_ptr() == ptrs[0]  # the plan's output buffer, written in place
    assert (plan.out.data_ptr(), plan.scratch[0].data_ptr(), plan.scratch[1].data_ptr()) == ptrs
    assert torch.equal(o1c, o2) and torch.equal(l1c, l2)
    torch.testing.assert_close(o2, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(l2, want_lse, atol=2e-5, rtol=2e-5)
    out = torch.full_like(plan.out, float("nan"))
    lse = torch.full_like(plan.lse, float("nan"))
    r, rl = decode_run(plan, q, k, v, lens, bt, out=out, lse=lse)
    assert r is out and rl is lse and torch.equal(out, o2) and torch.equal(lse, l2)


def test_plan_split_count_follows_the_sm_count_and_refuses_another_shape():
    g = torch.Generator().manual_seed(1)
    k, v, _ = _cache(g, 1, 2, 16, 4096)
    q = _randn(g, 1, 4, 1, 16)
    few = decode_plan(q, k, v, sm_count=1, block_n=16)
    many = decode_plan(q, k, v, sm_count=132, block_n=16)
    assert many.num_splits > few.num_splits and many.grid[0] == many.num_splits
    assert decode_plan(q, k, v, sm_count=1, block_n=16, split_rule="legacy").num_splits == 1  # two waves of 1 SM
    with pytest.raises(ValueError, match="does not match the plan"):
        decode_run(many, _randn(g, 1, 4, 2, 16), k, v, torch.tensor([9], dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="has_leftpad=False"):
        decode_run(many, q, k, v, torch.tensor([9], dtype=torch.int32, device=DEV),
                   cache_leftpad=torch.tensor([2], dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("kw, msg", [
    (dict(causal="no"), r"causal='no' is not supported; allowed values: True, False"),
    (dict(causal=0), r"causal=0 is not supported; allowed values: True, False"),
    (dict(window_size=(-1, 0)), r"window_size left=-1 must be an integer >= 0 or None"),
    (dict(window_size=(4, True)), r"window_size right=True must be an integer >= 0 or None"),
    (dict(window_size=4), r"window_size must be a pair \(left, right\), got 4"),
    (dict(softmax_scale=-1.0), r"softmax_scale=-1.0 is not supported; allowed values: None .* or a finite float > 0"),
    (dict(softmax_scale=float("nan")), r"softmax_scale=nan is not supported"),
    (dict(return_lse="yes"), r"return_lse='yes' is not supported; allowed values: True, False"),
    (dict(num_splits="x"), r"num_splits='x' is not supported; allowed values: None .* or an integer >= 1"),
    (dict(num_splits=0), r"num_splits=0 is not supported"), (dict(num_splits=2.0), r"num_splits=2.0 is not"),
    (dict(block_n=32.0), r"block_n=32.0 is not supported; allowed values: None .* or an integer >= 1"),
    (dict(block_n="32"), r"block_n='32' is not supported"), (dict(block_n=24), r"block_n=24 must be a power of two"),
    (dict(num_warps=3), r"num_warps=3 is not supported; allowed values: 1, 2, 4, 8, 16, 32"),
    (dict(merge="yes"), r"merge='yes' is not supported; allowed values: 'auto', 'fused', 'kernel'"),
])
def test_decode_attn_refuses_bad_scalar_arguments_before_any_launch(kw, msg, monkeypatch):
    """decode_plan used to take causal / window_size / softmax_scale / return_lse / num_splits / block_n as
    given (a negative window side or a string causal ran; num_splits='x' failed inside int()). Every scalar argument
    is checked on the host before the plan allocates or anything launches (num_warps, merge: checks that existed)."""
    import kernels.decode as kd

    def no_launch(*a, **k):
        raise AssertionError("reached the kernels")

    monkeypatch.setattr(kd, "decode_run", no_launch)
    g = torch.Generator().manual_seed(0)
    k, v, _ = _cache(g, 1, 1, 16, 32)
    with pytest.raises(ValueError, match=msg):
        decode_attn(_randn(g, 1, 1, 1, 16), k, v, torch.tensor([9], dtype=torch.int32, device=DEV), **kw)


def test_decode_plan_refuses_bad_has_leftpad_and_sm_count():
    g = torch.Generator().manual_seed(0)
    k, v, _ = _cache(g, 1, 1, 16, 32)
    q = _randn(g, 1, 1, 1, 16)
    for kw, msg in ((dict(has_leftpad=1), r"has_leftpad=1 is not supported; allowed values: True, False"),
                    (dict(sm_count=0), r"sm_count=0 is not supported; allowed values: None .* or an integer >= 1"),
                    (dict(sm_count=2.5), r"sm_count=2.5 is not supported")):
        with pytest.raises(ValueError, match=msg):
            decode_plan(q, k, v, **kw)
    np = pytest.importorskip("numpy")  # config values: NumPy integers still plan as the ints they equal
    a, b = decode_plan(q, k, v, num_splits=2, sm_count=8), decode_plan(q, k, v, num_splits=np.int64(2), sm_count=8)
    assert (a.num_splits, a.grid) == (b.num_splits, b.grid) == (2, b.grid)


def test_make_decode_plan_through_decode_attention():
    g = torch.Generator().manual_seed(2)
    k, v, bt = _cache(g, 2, 1, 16, 64, 16)
    q = _randn(g, 2, 4, 2, 16)
    lens = torch.tensor([33, 64], dtype=torch.int32, device=DEV)
    plan = make_decode_plan(q, k, v, WIN, bt, sm_count=4)
    a = decode_attention(q, k, v, WIN, lens, bt, backend="triton", plan=plan)
    assert a.data_ptr() == plan.out.data_ptr()
    torch.testing.assert_close(a, decode_attention(q, k, v, WIN, lens, bt, backend="reference"), atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="plan"):
        decode_attention(q, k, v, WIN, lens, bt, backend="triton", plan=plan, num_splits=2)


def test_a_plan_refuses_a_step_with_another_spec_or_a_non_plan():
    """The plan's mask constants are fixed at planning: a step with another spec (here causal flash against the
    plan's window) would run the plan's mask in silence (off by ~1 against the reference), so it is refused; the
    same spec rebuilt equal is accepted; a plan that is not a DecodePlan is named."""
    g = torch.Generator().manual_seed(5)
    k, v, bt = _cache(g, 2, 1, 16, 64, 16)
    q = _randn(g, 2, 4, 2, 16)
    lens = torch.tensor([40, 64], dtype=torch.int32, device=DEV)
    plan = make_decode_plan(q, k, v, WIN, bt, sm_count=4)
    other = AttentionSpec(kind="flash", causal=True)
    with pytest.raises(ValueError, match=r"plan= was made for spec .* make a plan per spec"):
        decode_attention(q, k, v, other, lens, bt, backend="triton", plan=plan)
    same = AttentionSpec(**{f: getattr(WIN, f) for f in WIN.__dataclass_fields__})
    torch.testing.assert_close(decode_attention(q, k, v, same, lens, bt, backend="triton", plan=plan),
                               decode_attention(q, k, v, WIN, lens, bt, backend="reference"), atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="plan must be a kernels.decode.DecodePlan"):
        decode_attention(q, k, v, WIN, lens, bt, backend="triton", plan="x")


def test_a_planned_step_through_decode_attention_never_syncs_with_the_host(monkeypatch):
    """``decode_attention(..., plan=)`` is a CUDA-graph step: no value read back to the host (``tolist`` /
    ``item`` / ``bool`` patched to fail), by default; ``check_values=True`` still checks (and so syncs), and the
    unplanned call checks by default (a length past the capacity is refused)."""
    g = torch.Generator().manual_seed(3)
    k, v, bt = _cache(g, 2, 1, 16, 64, 16)
    q = _randn(g, 2, 4, 2, 16)
    lens = torch.tensor([33, 64], dtype=torch.int32, device=DEV)
    plan = make_decode_plan(q, k, v, WIN, bt, sm_count=4)
    want = decode_attention(q, k, v, WIN, lens, bt, backend="reference")

    def sync(*a, **kw):
        raise AssertionError("a host sync in a planned decode step")

    for name in ("tolist", "item", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    got = decode_attention(q, k, v, WIN, lens, bt, backend="triton", plan=plan)
    with pytest.raises(AssertionError, match="host sync"):
        decode_attention(q, k, v, WIN, lens, bt, backend="triton", plan=plan, check_values=True)
    monkeypatch.undo()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=65 is past the cache capacity"):
        decode_attention(q, k, v, WIN, lens + 1, bt, backend="triton")


@pytest.mark.parametrize("page_size,Nq", [(None, 2), (None, 5), (None, 8), (16, 5), (16, 8), (32, 2), (32, 8)],
                         ids=["2-contiguous", "5-contiguous", "8-contiguous", "5-page16", "8-page16", "2-page32",
                              "8-page32"])
def test_several_queries_gqa_packed_several_pages_per_tile(page_size, Nq):
    """Nq queries x G = 4 heads per K/V head in one tile's M dim; tiles of 64 keys over pages of 16 / 32 (4 / 2
    pages per tile); a window whose first and last queries start in different tiles; ragged lengths. Every Nq
    contiguous; each page size with Nq 8 (32 packed rows) and a partial block (5 or 2: the query packing is the M
    side, the page gather the K side)."""
    g = torch.Generator().manual_seed(10 + Nq)
    B, Hq, Hkv, D = 3, 8, 2, 16
    k, v, bt = _cache(g, B, Hkv, D, 192, page_size)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([Nq, 101, 192], dtype=torch.int32, device=DEV)
    for spec in (FLASH, AttentionSpec(kind="sliding_window", window_size=(61, 0))):
        want = decode_attention(q, k, v, spec, lens, bt, backend="reference")
        for splits in (1, 3):
            got = decode_attention(q, k, v, spec, lens, bt, backend="triton", block_n=64, num_splits=splits)
            torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "page16"])
def test_cache_leftpad_every_backend(page_size):
    """Row b sees keys [cache_leftpad[b], cache_seqlens[b]); keys before it are NaN and must not leak; the
    reference differs from the unpadded result (the argument is not ignored)."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D, Nq = 3, 4, 2, 16, 3
    k, v, bt = _cache(g, B, Hkv, D, 96, page_size)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([90, 40, 17], dtype=torch.int32, device=DEV)
    pad = torch.tensor([37, 0, 14], dtype=torch.int32, device=DEV)  # row 2: the first key is the first query's
    want0 = decode_attention(q, k, v, FLASH, lens, bt, backend="reference")
    for b, p in enumerate(pad.tolist()):  # poison the hidden keys
        for j in range(p):
            if bt is None:
                k[b, :, j] = v[b, :, j] = float("nan")
            else:
                pg = int(bt[b, j // page_size])
                k[pg, :, j % page_size] = v[pg, :, j % page_size] = float("nan")
    for spec in (FLASH, AttentionSpec(kind="sliding_window", window_size=(45, 0))):
        want = decode_attention(q, k, v, spec, lens, bt, backend="reference", cache_leftpad=pad)
        assert torch.isfinite(want).all()
        for backend, opts in (("torch", {}), ("triton", {"block_n": 16}), ("triton", {"num_splits": 3})):
            got = decode_attention(q, k, v, spec, lens, bt, backend=backend, cache_leftpad=pad, **opts)
            torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5, msg=f"{spec.kind} {backend} {opts}")
    assert not torch.allclose(want[0], want0[0])
    torch.testing.assert_close(want[1], want0[1])  # pad 0 on row 1: unchanged
    with pytest.raises(ValueError, match=r"cache_leftpad\[2\]=15"):
        decode_attention(q, k, v, FLASH, lens, bt, backend="reference",
                         cache_leftpad=torch.tensor([0, 0, 15], dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "page16"])
def test_value_head_dim_differs_from_the_key_head_dim(page_size):
    """D = 48 for q.k (not a power of two), Dv = 32 for the values, GQA, Nq = 2, split-K."""
    g = torch.Generator().manual_seed(4)
    B, Hq, Hkv, D, Dv = 2, 4, 1, 48, 32
    k, v, bt = _cache(g, B, Hkv, D, 80, page_size, Dv=Dv)
    q = _randn(g, B, Hq, 2, D)
    lens = torch.tensor([80, 23], dtype=torch.int32, device=DEV)
    want = decode_attention(q, k, v, FLASH, lens, bt, backend="reference")
    assert want.shape == (B, Hq, 2, Dv)
    torch.testing.assert_close(decode_attention(q, k, v, FLASH, lens, bt, backend="torch"), want, atol=3e-5, rtol=3e-5)
    for splits in (1, 2):
        got = decode_attention(q, k, v, FLASH, lens, bt, backend="triton", num_splits=splits)
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
    ref = decode_attn_reference(q, k, v, lens, bt)
    torch.testing.assert_close(decode_attn(q, k, v, lens, bt), ref, atol=3e-5, rtol=3e-5)


def test_page_sizes_that_divide_the_tile_or_not():
    """Pages of 1 / 8 tokens (64 / 8 whole pages per 64-key tile) and 24 (neither divides nor is a multiple of
    the tile: one lookup per key), a length that ends mid-page, GQA, Nq = 2."""
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D = 2, 4, 2, 16
    q = _randn(g, B, Hq, 2, D)
    lens = torch.tensor([45, 130], dtype=torch.int32, device=DEV)
    for ps in (1, 8, 24):
        k, v, bt = _cache(g, B, Hkv, D, 144, ps)
        want = decode_attention(q, k, v, FLASH, lens, bt, backend="reference")
        got = decode_attention(q, k, v, FLASH, lens, bt, backend="triton", block_n=64, num_splits=2)
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5, msg=f"page_size={ps}")
        # every way of finding a tile's rows over small pages: per key (default), per page, one tile ahead
        for gather in ("key", "page", "prefetch"):
            plan = decode_plan(q, k, v, bt, block_n=64, num_splits=2, page_gather=gather)
            got = decode_run(plan, q, k, v, lens, bt)
            torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5, msg=f"page_size={ps}, page_gather={gather}")
    with pytest.raises(ValueError, match="page_gather='tile'.*allowed values: 'key', 'page', 'prefetch'"):
        decode_plan(q, k, v, bt, page_gather="tile")


def test_prefetched_page_lookups_match_per_key_lookups():
    """page_gather="prefetch" (a tile's page ids looked up in the previous iteration) against the reference:
    16-token pages in shuffled physical order, 3 splits of unequal tile counts, lengths that end mid-page and
    mid-tile (one of them inside the first tile), Nq = 4, GQA, a left window and cache_leftpad (tiles before a
    split's first visited tile are never read); pages of 128 (one lookup per 64-key tile) take the same path."""
    g = torch.Generator().manual_seed(11)
    B, Hq, Hkv, Nq, D = 3, 4, 2, 4, 16
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([203, 37, 256], dtype=torch.int32, device=DEV)
    pad = torch.tensor([5, 0, 70], dtype=torch.int32, device=DEV)
    for ps in (16, 128):
        k, v, bt = _cache(g, B, Hkv, D, 256, ps)
        for window, leftpad in ((None, None), ((90, 0), None), (None, pad)):
            spec = FLASH if window is None else AttentionSpec(kind="sliding_window", window_size=window)
            want = decode_attention(q, k, v, spec, lens, bt, backend="reference", cache_leftpad=leftpad)
            for gather in ("key", "prefetch"):
                plan = decode_plan(q, k, v, bt, block_n=64, num_splits=3, page_gather=gather, window_size=window,
                                   has_leftpad=leftpad is not None)
                got = decode_run(plan, q, k, v, lens, bt, leftpad)
                torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5,
                                           msg=f"page_size={ps}, window={window}, leftpad={leftpad}, {gather}")


def test_pdl_option_is_checked_and_off_where_it_cannot_run():
    """``pdl`` (programmatic dependent launch of the merge kernel): "auto" is off on CPU / under the interpreter and
    for plans without a merge kernel; ``pdl=True`` where it cannot run and values other than "auto" / bool are
    refused, naming the option."""
    g = torch.Generator().manual_seed(3)
    k, v, bt = _cache(g, 1, 2, 16, 64)
    q = _randn(g, 1, 4, 1, 16)
    plan = decode_plan(q, k, v, bt, block_n=16, num_splits=3, merge="kernel")
    if DEV == "cpu":
        assert plan.pdl is False
        with pytest.raises(ValueError, match=r"pdl=True needs .*compute capability >= 9\.0"):
            decode_plan(q, k, v, bt, block_n=16, num_splits=3, merge="kernel", pdl=True)
    assert decode_plan(q, k, v, bt, block_n=16, num_splits=3, merge="fused").pdl is False  # no second launch
    assert decode_plan(q, k, v, bt, block_n=16, num_splits=1).pdl is False  # no merge at all
    with pytest.raises(ValueError, match=r"pdl='yes' is not supported; allowed values: 'auto', True, False"):
        decode_plan(q, k, v, bt, pdl="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs a Hopper GPU")
@pytest.mark.parametrize("page_size", [None, 16])
def test_gpu_pdl_merge_equals_the_plain_merge_and_replays_in_a_graph(page_size):
    """The merge kernel launched with PDL (``pdl=True``: it starts early and waits in-kernel for the partials)
    gives the bitwise output of the plain launch (``pdl=False``), in eager calls and in CUDA-graph replays of
    several steps whose caches change between replays; GQA 32:8, 4 new queries, bf16, 4k keys, 13 splits."""
    g = torch.Generator().manual_seed(4)
    B, Hq, Hkv, Nq, D, cap = 2, 32, 8, 4, 128, 4096
    k, v, bt = _cache(g, B, Hkv, D, cap, page_size)
    k, v = k.bfloat16(), v.bfloat16()
    q = _randn(g, B, Hq, Nq, D).bfloat16()
    lens = torch.tensor([cap, 2500], dtype=torch.int32, device=DEV)
    plans = {pdl: decode_plan(q, k, v, bt, num_splits=13, merge="kernel", pdl=pdl) for pdl in (True, False)}
    assert plans[True].pdl and not plans[False].pdl
    want = decode_attn_reference(q, k, v, lens, bt)
    outs = {pdl: decode_run(p, q, k, v, lens, bt).clone() for pdl, p in plans.items()}
    assert torch.equal(outs[True], outs[False])
    torch.testing.assert_close(outs[True].float(), want.float(), atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):  # three layers' steps in one graph, as a decode step captures them
            decode_run(plans[True], q, k, v, lens, bt)
    for step in range(3):
        k.mul_(-1.0) if step % 2 else v.add_(0.5)  # new cache contents before each replay
        graph.replay()
        torch.cuda.synchronize()
        plain = decode_run(plans[False], q, k, v, lens, bt)
        assert torch.equal(plans[True].out, plain), step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "page16"])
def test_gpu_planned_decode_attention_is_captured_and_replayed_in_a_cuda_graph(page_size):
    """The public step, ``decode_attention(..., plan=)``, captured in a CUDA graph (a host sync there raises) and
    replayed with new cache contents and new lengths: each replay equals the reference. GQA 32:8, 1 and 4 new
    queries, bf16, 2k keys."""
    g = torch.Generator().manual_seed(9)
    for Nq in (1, 4):
        B, Hq, Hkv, D, cap = 2, 32, 8, 128, 2048
        k, v, bt = _cache(g, B, Hkv, D, cap, page_size)
        k, v = k.bfloat16(), v.bfloat16()
        q = _randn(g, B, Hq, Nq, D).bfloat16()
        lens = torch.tensor([cap, 1500], dtype=torch.int32, device=DEV)
        plan = make_decode_plan(q, k, v, FLASH, bt)
        decode_attention(q, k, v, FLASH, lens, bt, backend="triton", plan=plan)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode_attention(q, k, v, FLASH, lens, bt, backend="triton", plan=plan)
        for step in range(3):
            v.add_(0.25)
            lens.copy_(torch.tensor([cap - 7 * step, 1500 + 3 * step], dtype=torch.int32))
            graph.replay()
            torch.cuda.synchronize()
            want = decode_attention(q, k, v, FLASH, lens, bt, backend="reference")
            torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{Nq} {step}: {m}")
