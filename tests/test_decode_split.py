"""The split-K paths of the decode kernel (issue 29 item 3, "decode at the limit") against the reference, tiny shapes
(interpreter):

* the merge fused into the last-arriving split (``merge="fused"``, the default: an arrival counter per (sequence,
  K/V head, row block) that the merging program resets) and the separate merge kernel (``merge="kernel"``) give the
  reference's output and lse; two runs in a row give the same result and leave the counter at 0 (CUDA-graph
  replays start from a clean counter);
* the balanced partition of key tiles over splits (shares differ by at most one tile; more splits than tiles leaves
  some empty);
* the fused merge of a multi-row program (GQA, several new tokens: the row block merged at once, several splits
  per block where the group leaves padding rows) against the reference and the merge kernel;
* ``"auto"``: the waves split for every plan, the fused merge for one-row programs and the merge kernel for
  multi-row ones; ``merge="kernel", split_rule="legacy"`` the multi-row plan before;
* the ``waves`` split rule (``decode_num_splits``) against the ``legacy`` one, and bad option values;
* ragged lengths that end mid-tile and mid-page, pages of 16 / 32 tokens with every ``page_gather``, GQA heads
  packed with Nq 2-8 new queries (speculative decoding), a window and ``cache_leftpad``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.decode import decode_attn_reference, decode_num_splits, decode_plan, decode_run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("one_thread")


def _randn(g, *shape):
    return torch.randn(*shape, generator=g).to(DEV)


def _cache(g, B, Hkv, D, cap, page_size=None):
    if page_size is None:
        return _randn(g, B, Hkv, cap, D), _randn(g, B, Hkv, cap, D), None
    n = -(-cap // page_size)
    bt = torch.randperm(B * n, generator=g).view(B, n).to(torch.int32).to(DEV)
    return _randn(g, B * n, Hkv, page_size, D), _randn(g, B * n, Hkv, page_size, D), bt


@pytest.mark.parametrize("page_size", [None, 16, 32], ids=["contiguous", "page16", "page32"])
def test_fused_and_kernel_merge_match_the_reference(page_size):
    """GQA 4:2 with Nq 3 (12 packed rows), ragged lengths ending mid-tile / mid-page (one inside the first tile),
    5 splits over 16-key tiles (unequal shares, an empty split for the shortest row), output and lse."""
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, Nq, D = 3, 4, 2, 3, 16
    k, v, bt = _cache(g, B, Hkv, D, 96, page_size)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([77, 9, 96], dtype=torch.int32, device=DEV)
    want, want_lse = decode_attn_reference(q, k, v, lens, bt, return_lse=True)
    gathers = ("key", "page", "prefetch") if page_size else ("prefetch",)
    for merge in ("fused", "kernel"):
        for gather in gathers:
            plan = decode_plan(q, k, v, bt, block_n=16, num_splits=5, return_lse=True, merge=merge,
                               page_gather=gather)
            assert plan.num_splits == 5
            assert (plan.counter.numel() == B * Hkv * plan.n_m) == (merge == "fused")
            o, lse = decode_run(plan, q, k, v, lens, bt)
            msg = f"merge={merge}, page_gather={gather}"
            torch.testing.assert_close(o, want, atol=3e-5, rtol=3e-5, msg=msg)
            torch.testing.assert_close(lse, want_lse, atol=3e-5, rtol=3e-5, msg=msg)


@pytest.mark.parametrize("Nq", [2, 8])
def test_fused_merge_several_queries_window_leftpad_paged(Nq):
    """Speculative decoding (Nq 2 / 8) x GQA 8:2 (16 / 64 packed rows: one or several row blocks per K/V head),
    a left window whose first and last queries start in different tiles, ``cache_leftpad``, pages of 16 in
    shuffled order, 4 splits: the fused merge against the reference."""
    g = torch.Generator().manual_seed(1 + Nq)
    B, Hq, Hkv, D = 2, 8, 2, 16
    k, v, bt = _cache(g, B, Hkv, D, 128, 16)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([101, 128], dtype=torch.int32, device=DEV)
    pad = torch.tensor([3, 40], dtype=torch.int32, device=DEV)
    for window, leftpad in (((30, 0), None), (None, pad)):
        want = decode_attn_reference(q, k, v, lens, bt, window_size=window) if leftpad is None else None
        if leftpad is not None:  # keys before cache_leftpad[b] hidden: the reference over each row's visible keys
            from attn_zoo import AttentionSpec
            from attn_zoo.decode import decode_attention

            want = decode_attention(q, k, v, AttentionSpec(kind="flash"), lens, bt, backend="reference",
                                    cache_leftpad=leftpad)
        plan = decode_plan(q, k, v, bt, block_n=16, num_splits=4, window_size=window, has_leftpad=leftpad is not None,
                           merge="fused")
        assert plan.merge == "fused" and plan.num_splits == 4
        got = decode_run(plan, q, k, v, lens, bt, leftpad)
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5, msg=f"Nq={Nq}, window={window}, leftpad={leftpad}")


def test_fused_merge_is_replay_safe():
    """Two runs in a row of one plan (what CUDA-graph replays do) give the same output and each leaves the arrival
    counter at 0; a counter left non-zero (as a broken reset would) breaks the next run."""
    g = torch.Generator().manual_seed(2)
    B, Hq, Hkv, Nq, D = 2, 4, 1, 2, 16
    k, v, bt = _cache(g, B, Hkv, D, 80, 32)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([80, 45], dtype=torch.int32, device=DEV)
    want = decode_attn_reference(q, k, v, lens, bt)
    plan = decode_plan(q, k, v, bt, block_n=16, num_splits=3, merge="fused")
    assert plan.counter.shape == (B * Hkv * plan.n_m,) and int(plan.counter.abs().sum()) == 0
    o1 = decode_run(plan, q, k, v, lens, bt).clone()
    assert int(plan.counter.abs().sum()) == 0
    o2 = decode_run(plan, q, k, v, lens, bt).clone()
    assert int(plan.counter.abs().sum()) == 0
    assert torch.equal(o1, o2)
    torch.testing.assert_close(o2, want, atol=3e-5, rtol=3e-5)
    # the test can fail: a counter left at S (a reset that never ran) means no split sees itself last, so nothing
    # merges and the output keeps what was there (deterministic on a GPU too, whatever the arrival order)
    plan.counter.fill_(plan.num_splits)
    plan.out.fill_(float("nan"))
    bad = decode_run(plan, q, k, v, lens, bt)
    assert torch.isnan(bad).all()
    assert bool((plan.counter == 2 * plan.num_splits).all())


def test_balanced_splits_more_splits_than_tiles():
    """7 splits over 3-5 visited tiles (empty splits write lse = -inf and are merged away), and 6 splits over 13
    tiles (shares of 2 and 3 tiles), MHA and MQA, against the reference."""
    g = torch.Generator().manual_seed(3)
    B, D = 2, 16
    for Hq, Hkv, cap, lens_, S in ((2, 2, 80, (70, 33), 7), (4, 1, 208, (208, 150), 6)):
        k, v, _ = _cache(g, B, Hkv, D, cap)
        q = _randn(g, B, Hq, 1, D)
        lens = torch.tensor(lens_, dtype=torch.int32, device=DEV)
        want = decode_attn_reference(q, k, v, lens)
        for merge in ("fused", "kernel"):
            plan = decode_plan(q, k, v, block_n=16, num_splits=S, merge=merge)
            torch.testing.assert_close(decode_run(plan, q, k, v, lens), want, atol=3e-5, rtol=3e-5,
                                       msg=f"S={S}, merge={merge}, Hq:Hkv={Hq}:{Hkv}")


def test_split_rules():
    """``waves`` fills the resident slots a whole number of times with at least 4 tiles per split and is never
    worse than ``legacy`` under its own model; ``legacy`` is the two-waves rule; bad values raise."""
    sms, per_sm = 132, 3
    slots = sms * per_sm

    def cost(n, t, s):
        return -(-n * s // slots) * (-(-t // s) + 2.0)

    for n, tiles in ((32, 256), (32, 1024), (8, 1024), (8, 2048), (128, 256), (32, 512), (1, 64)):
        s = decode_num_splits(n, tiles, sms, programs_per_sm=per_sm)
        legacy = decode_num_splits(n, tiles, sms, rule="legacy")
        assert 1 <= s <= min(64, -(-tiles // 4)), (n, tiles, s)
        assert cost(n, tiles, s) <= cost(n, tiles, legacy) + 1e-9, (n, tiles, s, legacy)
        assert legacy == max(1, min(-(-2 * sms // n), -(-tiles // 4), 64))
    # batch 1, MHA 32 heads, 16k keys in 64-key tiles: one full set of resident slots (384 of 396), not 2.9 waves
    assert decode_num_splits(32, 256, sms, programs_per_sm=per_sm) == 12
    assert decode_num_splits(1, 2, sms) == 1  # fewer tiles than the minimum share: no split
    assert decode_num_splits(2 * sms, 4096, sms) == 1  # a grid of two waves already: no split, as legacy
    g = torch.Generator().manual_seed(4)
    k, v, _ = _cache(g, 1, 1, 16, 64)
    q = _randn(g, 1, 1, 1, 16)
    with pytest.raises(ValueError, match="split_rule='even'.*allowed values: 'auto', 'waves', 'legacy'"):
        decode_plan(q, k, v, split_rule="even")
    with pytest.raises(ValueError, match="merge='atomic'.*allowed values: 'auto', 'fused', 'kernel'"):
        decode_plan(q, k, v, merge="atomic")
    with pytest.raises(ValueError, match="split_rule='x'"):
        decode_num_splits(1, 64, sms, rule="x")


def test_kernel_options_are_named_and_max_registers_reaches_every_entry_point():
    """``max_registers`` (a plan option) is taken by ``decode_attn`` and ``decode_attention`` as by
    ``decode_plan``; an unknown kernel option (a typo) is a ValueError naming it and the allowed options, not a
    TypeError from deep inside; ``num_splits`` must be an integer."""
    from attn_zoo import AttentionSpec
    from attn_zoo.decode import decode_attention, make_decode_plan
    from kernels.decode import decode_attn

    g = torch.Generator().manual_seed(5)
    k, v, _ = _cache(g, 1, 1, 16, 32)
    q = _randn(g, 1, 2, 1, 16)
    lens = torch.tensor([20], dtype=torch.int32, device=DEV)
    want = decode_attn_reference(q, k, v, lens)
    torch.testing.assert_close(decode_attn(q, k, v, lens, max_registers=168), want, atol=3e-5, rtol=3e-5)
    spec = AttentionSpec(kind="flash")
    got = decode_attention(q, k, v, spec, lens, backend="triton", max_registers=None)
    torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
    with pytest.raises(ValueError, match="max_registers=7"):
        decode_attn(q, k, v, lens, max_registers=7)
    for call in (lambda: decode_attention(q, k, v, spec, lens, backend="triton", merg="fused"),
                 lambda: make_decode_plan(q, k, v, spec, merg="fused")):
        with pytest.raises(ValueError, match=r"merg.*allowed.*max_registers.*merge.*split_rule"):
            call()
    with pytest.raises(ValueError, match="num_splits=2.5"):
        decode_plan(q, k, v, num_splits=2.5)


@pytest.mark.parametrize("merge", ["fused", "kernel"])
def test_empty_and_one_token_sequences_with_splits(merge):
    """cache_seqlens 0 (a padded batch slot: every split empty, output 0, lse -inf) and 1 (one key, in one split)
    beside full rows, pages of 16, 3 splits, run twice (the counter back to 0 after each run)."""
    g = torch.Generator().manual_seed(6)
    B, Hq, Hkv, D = 4, 4, 2, 16
    k, v, bt = _cache(g, B, Hkv, D, 40, 16)
    q = _randn(g, B, Hq, 1, D)
    lens = torch.tensor([0, 1, 40, 17], dtype=torch.int32, device=DEV)
    want, want_lse = decode_attn_reference(q, k, v, lens, bt, return_lse=True)
    plan = decode_plan(q, k, v, bt, block_n=16, num_splits=3, merge=merge, return_lse=True)
    for _ in range(2):
        o, lse = decode_run(plan, q, k, v, lens, bt)
        assert bool((o[0] == 0).all()) and bool(torch.isneginf(lse[0]).all())
        torch.testing.assert_close(o, want, atol=3e-5, rtol=3e-5)
        torch.testing.assert_close(lse, want_lse, atol=3e-5, rtol=3e-5)
        assert int(plan.counter.abs().sum()) == 0


def test_auto_merge_and_split_rule_and_the_old_multi_row_plan():
    """merge / split_rule "auto": the waves split for every plan, the fused merge for one-row programs (MHA, one new
    token) and the merge kernel for multi-row ones (GQA, several new tokens; H200 2026-12-04), the register cap for
    one-row programs only; the multi-row default before stays reachable as merge="kernel",
    split_rule="legacy"; the fused merge walks one-row programs row by row and merges multi-row ones as a block
    (``merge_rows``, ``merge_rp`` row slots per split)."""
    # shapes only (the plan reads no values): batch 4, 8 K/V heads, 16k keys of D 128 in 16 bits (3 programs per SM)
    k = v = torch.empty(4, 8, 16384, 128, device="meta", dtype=torch.float16)
    for Hq, Nq, rows, rp in ((8, 1, False, 1), (32, 1, True, 4), (8, 4, True, 4), (64, 2, True, 16)):
        q = torch.empty(4, Hq, Nq, 128, device="meta", dtype=torch.float16)
        plan = decode_plan(q, k, v, None, sm_count=132)
        assert (plan.merge, plan.split_rule) == ("kernel" if rows else "fused", "waves"), (Hq, Nq)
        assert plan.max_registers == (None if rows else 168), (Hq, Nq)
        assert (plan.merge_rows, plan.merge_rp) == (rows, rp), (Hq, Nq)
        waves = decode_num_splits(32 * plan.n_m, 256, 132, programs_per_sm=3)
        assert plan.num_splits == waves
        assert plan.counter.numel() == (1 if rows else 32 * plan.n_m)  # the merge kernel needs no arrival counter
        fused = decode_plan(q, k, v, None, sm_count=132, merge="fused")
        assert fused.num_splits == waves and fused.counter.numel() == 32 * fused.n_m
        old = decode_plan(q, k, v, None, sm_count=132, merge="kernel", split_rule="legacy")
        assert old.num_splits == decode_num_splits(32 * old.n_m, 256, 132, rule="legacy") != waves
        assert old.counter.numel() == 1  # no arrival counter: the merge kernel runs
        assert old.max_registers == (168 if Hq * Nq == 8 else None)  # one-row programs keep the cap
    with pytest.raises(ValueError, match="merge='last'.*allowed values: 'auto', 'fused', 'kernel'"):
        decode_plan(q, k, v, None, merge="last")


@pytest.mark.parametrize("page_size", [None, 32], ids=["contiguous", "page32"])
@pytest.mark.parametrize("Nq", [1, 2, 4])
def test_fused_merge_of_a_row_block_matches_the_reference(page_size, Nq):
    """The fused merge of a multi-row program (GQA G = 4 x Nq 1 / 2 / 4: 4 / 8 / 16 rows, so 4 / 2 / 1 splits per
    16-row block), 3-5 splits, with and without a left window, contiguous and pages of 32 read in 16-key tiles (a
    tile starts mid-page), ragged lengths (one with a split left empty), output and lse against the reference and
    the merge kernel; every run leaves the arrival counter at 0, and a second run (5 splits, each window: the counter
    every earlier run also left at 0) gives the identical result."""
    g = torch.Generator().manual_seed(20 + Nq)
    B, Hq, Hkv, D = 3, 8, 2, 16
    k, v, bt = _cache(g, B, Hkv, D, 96, page_size)
    q = _randn(g, B, Hq, Nq, D)
    lens = torch.tensor([Nq + 5, 61, 96], dtype=torch.int32, device=DEV)
    for window in (None, (27, 0)):
        want, want_lse = decode_attn_reference(q, k, v, lens, bt, window_size=window, return_lse=True)
        for S in (3, 4, 5):
            msg = f"Nq={Nq}, S={S}, window={window}"
            plan = decode_plan(q, k, v, bt, block_n=16, num_splits=S, window_size=window, return_lse=True,
                               merge="fused")  # (multi-row "auto" takes the merge kernel)
            assert (plan.merge, plan.num_splits, plan.merge_rows) == ("fused", S, True)
            assert plan.merge_rp == min(16, 4 * Nq)
            o, lse = decode_run(plan, q, k, v, lens, bt)
            o1, l1 = o.clone(), lse.clone()
            torch.testing.assert_close(o1, want, atol=3e-5, rtol=3e-5, msg=msg)
            torch.testing.assert_close(l1, want_lse, atol=3e-5, rtol=3e-5, msg=msg)
            assert int(plan.counter.abs().sum()) == 0
            if S == 5:
                plan.out.fill_(float("nan"))
                o, lse = decode_run(plan, q, k, v, lens, bt)
                assert torch.equal(o, o1) and torch.equal(lse, l1), msg  # the counter reset: the second run merges too
                assert int(plan.counter.abs().sum()) == 0
            if S == 4:
                ok, lk = decode_run(decode_plan(q, k, v, bt, block_n=16, num_splits=S, window_size=window,
                                                return_lse=True, merge="kernel"), q, k, v, lens, bt)
                torch.testing.assert_close(o1, ok, atol=2e-6, rtol=2e-6, msg=msg)
                torch.testing.assert_close(l1, lk, atol=2e-6, rtol=2e-6, msg=msg)


def test_bad_num_warps_and_num_stages_are_value_errors_naming_them():
    """``num_warps`` / ``num_stages`` (kernel options of every entry point) outside what Triton launches: a
    ``ValueError`` naming the option and the allowed values, not a ``ZeroDivisionError`` / ``TypeError`` from the
    plan's arithmetic, nor a value passed on silently (the interpreter ignores both; a GPU launch would not)."""
    from attn_zoo import AttentionSpec
    from attn_zoo.decode import decode_attention
    from kernels.decode import decode_attn

    g = torch.Generator().manual_seed(9)
    k, v, _ = _cache(g, 1, 1, 16, 32)
    q = _randn(g, 1, 2, 1, 16)
    lens = torch.tensor([20], dtype=torch.int32, device=DEV)
    for bad in (0, 3, 64, True, "4", 4.0):
        with pytest.raises(ValueError, match=r"num_warps=.*allowed values: 1, 2, 4, 8, 16, 32"):
            decode_plan(q, k, v, num_warps=bad)
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"num_stages=.*integer >= 1"):
            decode_plan(q, k, v, num_stages=bad)
    with pytest.raises(ValueError, match="num_warps=0"):
        decode_attn(q, k, v, lens, num_warps=0)
    with pytest.raises(ValueError, match="num_stages=0"):
        decode_attention(q, k, v, AttentionSpec(kind="flash"), lens, backend="triton", num_stages=0)
    want = decode_attn_reference(q, k, v, lens)
    for nw, ns in ((1, 1), (2, 4)):  # legal values still run
        torch.testing.assert_close(decode_attn(q, k, v, lens, num_warps=nw, num_stages=ns), want, atol=3e-5, rtol=3e-5)
