"""Attention sinks (StreamingLLM, Xiao et al. 2023) in the exact-attention Triton kernels
(``flash_attn(..., sink_size=S)``) and the Triton decode kernel (``decode_attn(..., sink_size=S)``): keys ``j < S``
pass the window's left edge, every other term still holds, so the element rule is
``causal & right_edge & ((j >= i' - left) | (j < S))`` with ``i' = i + Nk - Nq``.

CPU (TRITON_INTERPRET=1, small shapes: forward / dQ tiles of 32 x 16, dK/dV tiles of 16 x 32): output and dq / dk / dv
against a dense-masked fp32 PyTorch reference (softmax over the allowed keys, rows that see none -> 0), for sinks that
are not a multiple of the tile, sinks wider than the window, spanning several key tiles, a band that reaches into the
sink tiles, ``Nq < Nk`` / ``Nq > Nk``, GQA / MQA with a dK/dV group split and the atomic dQ, TMA descriptors, the LPT
order, non-causal windows (both edges, left edge only), bf16; ``sink_size=0`` (and sinks without a left edge) run
the plain kernels; refusals of bad values and of the combinations the kernels do not take; the ``"auto"`` choices never
take a Gluon kernel with sinks and a Gluon kernel asked by name refuses them. Decode: the sink tiles over splits,
GQA, paged caches against :func:`kernels.decode.decode_attn_reference`. GPU (``-m gpu``): the same flash cases in
bf16 / fp16 within 2x / 3x plain PyTorch's error."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo.reference import repeat_kv  # noqa: E402

pytest.importorskip("triton")

from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _allowed(Nq, Nk, causal, left, right, sink):
    """Dense ``(Nq, Nk)`` mask of the rule: ``causal & right_edge & ((j >= i' - left) | (j < sink))``."""
    i = torch.arange(Nq).view(-1, 1) + (Nk - Nq)
    j = torch.arange(Nk).view(1, -1)
    ok = torch.ones(Nq, Nk, dtype=torch.bool)
    if causal:
        right = 0 if right is None else min(right, 0)
    if right is not None:
        ok &= j <= i + right
    if left is not None:
        ok &= (j >= i - left) | (j < sink)
    return ok


def _reference(q, k, v, allowed):
    """Softmax attention over the allowed keys in fp32 (rows that see no key: 0)."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.float(), repeat_kv(k.float(), rep), repeat_kv(v.float(), rep)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed.to(q.device), float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v


def _plain(q, k, v, allowed):
    """The same softmax attention in the inputs' dtype (the error budget of low-precision cases)."""
    rep = q.shape[1] // k.shape[1]
    s = (q @ repeat_kv(k, rep).transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed.to(q.device), float("-inf"))
    return torch.nan_to_num(torch.softmax(s.float(), -1), nan=0.0).to(q.dtype) @ repeat_kv(v, rep)


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)


def _inputs(B, Hq, Hkv, Nq, Nk, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device=DEV, dtype=dtype)  # noqa: E731
    return mk(B, Hq, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, D), mk(B, Hq, Nq, D)


def _check(causal, window, sink, Nq, Nk, Hq=4, Hkv=2, D=16, B=2, seed=0, dtype=torch.float32, **kw):
    """flash_attn with ``sink_size=sink`` against the dense reference: out, dq, dk, dv (fp32: 1e-4 / 2e-5; fp16 /
    bf16: within 2x / 3x the error of plain PyTorch in that dtype); rows that see no key output 0 with dq 0."""
    left, right = window if window is not None else (None, None)
    allowed = _allowed(Nq, Nk, causal, left, right, sink)
    q, k, v, do = _inputs(B, Hq, Hkv, Nq, Nk, D, seed, dtype)
    ours = _grads(lambda a, b, c: flash_attn(a, b, c, causal=causal, window_size=window, sink_size=sink, **kw),
                  q, k, v, do)
    want = _grads(lambda a, b, c: _reference(a, b, c, allowed), *(t.float() for t in (q, k, v)), do.float())
    if dtype == torch.float32:
        for name, x, y in zip(("out", "dq", "dk", "dv"), ours, want):
            assert torch.isfinite(x).all(), name
            torch.testing.assert_close(x, y, rtol=1e-4, atol=2e-5, msg=name)
    else:
        plain = _grads(lambda a, b, c: _plain(a, b, c, allowed), q, k, v, do)
        for name, o, r, p, mult in zip(("out", "dq", "dk", "dv"), ours, want, plain, (2, 3, 3, 3)):
            assert o.dtype == dtype and torch.isfinite(o).all(), name
            err, err_pt = (o.float() - r).abs().max().item(), (p.float() - r).abs().max().item()
            assert err <= mult * err_pt + 1e-4 * max(r.abs().max().item(), 1.0), (name, err, err_pt)
    empty = ~allowed.any(1)  # rows that see no key: zero output and zero dq
    for t in ours[:2]:
        assert torch.equal(t[:, :, empty.to(t.device)], torch.zeros_like(t[:, :, empty.to(t.device)]))
    return ours


# (causal, window, sink, Nq, Nk): forward / dQ key tiles of 16 keys, dK/dV key tiles of 32 under the interpreter
CASES = {
    "causal_sink_not_tile_multiple": (True, (8, 0), 5, 80, 80),
    "sink_wider_than_window": (True, (6, 0), 20, 96, 96),
    "sink_spans_tiles": (True, (10, 0), 40, 128, 128),  # 3 forward tiles, dK/dV: one of sinks only, one straddling
    "band_overlaps_sink_tiles": (True, (24, 0), 20, 100, 100),  # rows 32-63 reach key 8: band from tile 0
    "decode_like_nq_lt_nk": (True, (16, 0), 4, 8, 100),
    "one_query_row": (True, (16, 0), 6, 1, 90),  # causal with one row is no right edge: the left edge alone
    "nq_gt_nk": (True, (10, 0), 7, 100, 60),  # top 40 rows see nothing (sinks still obey causality)
    "non_causal_both_edges": (False, (6, 5), 9, 70, 70),
    "non_causal_nq_lt_nk": (False, (6, 4), 10, 50, 90),
    "non_causal_left_edge_only": (False, (10, None), 3, 60, 60),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sinks_against_dense_reference(case):
    causal, window, sink, Nq, Nk = CASES[case]
    _check(causal, window, sink, Nq, Nk, seed=Nq + sink)


def test_sinks_mqa_with_group_split():
    _check(True, (8, 0), 11, 72, 72, Hq=4, Hkv=1, seed=5, dkdv_split=2)


def test_sinks_atomic_dq():
    _check(True, (12, 0), 18, 64, 80, Hq=2, Hkv=1, seed=6, dq_mode="atomic")


def test_sinks_tma_and_lpt(monkeypatch):
    """TMA descriptors (forced under the interpreter) stream the sink tiles like the band's; the LPT tile order."""
    from kernels.flash import fwd as F

    monkeypatch.setattr(F, "FWD_LPT", True)
    _check(True, (9, 0), 13, 70, 70, seed=7, config=FlashConfig(tma=True))


def test_sinks_bf16():
    """bf16 (on the CPU the interpreter's launches run in fp32 and return bf16, as tests/test_kernel_flash.py)."""
    _check(True, (10, 0), 6, 48, 64, Hq=4, Hkv=2, D=32, seed=8, dtype=torch.bfloat16)


def test_sinks_change_the_result_and_get_plans_of_their_own():
    """Sinks add the first keys to every row (the result differs from the plain window), a plan with sinks is never
    reused without them (``SINK`` is a constexpr of its own), and ``sink_size=0`` is the plain window bit for bit
    with the plain window's plan."""
    import kernels.flash as kf

    q, k, v, _ = _inputs(1, 2, 2, 64, 64, 16, seed=2)
    kf.clear_plans()
    plain = flash_attn(q, k, v, causal=True, window_size=(8, 0))
    sinks = flash_attn(q, k, v, causal=True, window_size=(8, 0), sink_size=4)
    zero = flash_attn(q, k, v, causal=True, window_size=(8, 0), sink_size=0)
    assert torch.equal(zero, plain) and not torch.allclose(sinks, plain)
    assert torch.equal(flash_attn(q, k, v, causal=True, window_size=(8, 0), sink_size=4), sinks)
    fwd = sorted(p.meta["fwd"]["SINK"] for key, p in kf.launch_plans().items() if key[0] == "fwd")
    assert fwd == [0, 4]
    q, k, v, do = _inputs(1, 2, 2, 64, 64, 16, seed=2)
    g0 = _grads(lambda a, b, c: flash_attn(a, b, c, causal=True, window_size=(8, 0)), q, k, v, do)
    g1 = _grads(lambda a, b, c: flash_attn(a, b, c, causal=True, window_size=(8, 0), sink_size=0), q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    bwd = sorted((p.meta["dkdv"]["SINK"], p.meta["dq"]["SINK"]) for key, p in kf.launch_plans().items()
                 if key[0] == "bwd")
    assert bwd == [(0, 0)]


def test_sinks_without_a_left_edge_are_a_no_op():
    """No left edge (causal / dense, or a left edge as wide as the keys), or sinks that reach every row's left edge
    (``S >= Nk - 1 - left``): the plain kernels (``SINK`` 0, ``HAS_LEFT`` off), the same output."""
    import kernels.flash as kf

    q, k, v, _ = _inputs(1, 2, 2, 48, 48, 16, seed=4)
    causal = flash_attn(q, k, v, causal=True)
    kf.clear_plans()
    assert torch.equal(flash_attn(q, k, v, causal=True, sink_size=4), causal)
    assert torch.equal(flash_attn(q, k, v, causal=True, window_size=(47, 0), sink_size=4), causal)
    assert torch.equal(flash_attn(q, k, v, causal=True, window_size=(10, 0), sink_size=37), causal)  # 37 >= 47 - 10
    assert torch.equal(flash_attn(q, k, v, sink_size=3), flash_attn(q, k, v))
    metas = [p.meta["fwd"] for key, p in kf.launch_plans().items() if key[0] == "fwd"]
    assert metas and all(m["SINK"] == 0 and not m["HAS_LEFT"] for m in metas)
    _check(True, (10, 0), 36, 48, 48, seed=9)  # one short of it: the sink kernel, the same rule


def test_sinks_through_the_custom_ops_under_torch_compile():
    """torch.compile traces the custom ops (sink_size travels as their last argument, the backward's too): the same
    output and gradients as the eager autograd.Function."""
    q, k, v, do = _inputs(1, 2, 1, 40, 40, 16, seed=10)
    fn = lambda a, b, c: flash_attn(a, b, c, causal=True, window_size=(6, 0), sink_size=5)  # noqa: E731
    eager = _grads(fn, q, k, v, do)
    compiled = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_bad_sink_size_raises(bad):
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 16, seed=1)
    with pytest.raises(ValueError, match=r"sink_size=.*allowed values: an integer >= 0"):
        flash_attn(q, k, v, causal=True, window_size=(4, 0), sink_size=bad)


def test_sinks_refuse_layouts_dilation_and_documents():
    from attn_zoo import MaskInfo

    q, k, v, _ = _inputs(1, 2, 2, 32, 32, 16, seed=1)
    lay = torch.ones(2, 2, dtype=torch.bool)
    mi = MaskInfo(32, 32, True, None, None, lay, 16)
    for kw, other in ((dict(block_layout=lay, block_size=16, block_table_fn=mi.block_table), "block_layout"),
                      (dict(dilation=2), "dilation=2"),
                      (dict(doc_ids=torch.zeros(1, 32, dtype=torch.int32, device=DEV)), "doc_ids")):
        with pytest.raises(ValueError, match=rf"sink_size=4 cannot be combined with {other}"):
            flash_attn(q, k, v, causal=True, window_size=(8, 0), sink_size=4, **kw)
        flash_attn(q, k, v, causal=True, window_size=(8, 0), sink_size=0, **kw)  # no sinks: fine


# ------------------------------------------------------------------------------------------- Gluon: never with sinks
def test_auto_never_takes_gluon_with_sinks(monkeypatch):
    """The "auto" choices (faked Hopper, Gluon importable) take Gluon for a large windowed bf16 call, and Triton as soon
    as it has sinks; sinks without a left edge are a no-op and leave the choice alone."""
    from kernels.flash import resolve_bwd_impl, resolve_fwd_impl
    from tests.test_kernel_flash_gluon import _all_hold, _fake_qkv

    _all_hold(monkeypatch)
    auto = FlashConfig()
    big = _fake_qkv(B=8, Hq=16, Hkv=16, Nq=4096, Nk=4096)  # 2^29 pairs with the window: past the forward's minimum
    assert G.choose_fwd_impl(auto, *big, 1023, 0) != "triton"
    assert G.choose_bwd_impl(auto, *big, 1023, 0) == "gluon"
    assert G.choose_fwd_impl(auto, *big, 1023, 0, sink_size=4) == "triton"
    assert G.choose_bwd_impl(auto, *big, 1023, 0, sink_size=4) == "triton"
    assert G.auto_bwd_shape_ok(auto, *big, 1023, 0, None, 1, None, sink_size=4) is False
    assert G.choose_fwd_impl(auto, *big, -1, 0, sink_size=4) == "triton"  # the choose functions: any sinks
    win = dict(causal=True, window_size=(1023, 0))
    assert resolve_fwd_impl(auto, *big, **win) != "triton" and resolve_bwd_impl(auto, *big, **win) == "gluon"
    assert resolve_fwd_impl(auto, *big, sink_size=4, **win) == "triton"
    assert resolve_bwd_impl(auto, *big, sink_size=4, **win) == "triton"
    assert resolve_fwd_impl(auto, *big, causal=True, sink_size=4) != "triton"  # no left edge: no sinks to run
    with pytest.raises(ValueError, match="sink_size"):
        resolve_fwd_impl(auto, *big, sink_size=-2, **win)


@pytest.mark.parametrize("impl", ["gluon_ws3a", "gluon_ws3b", "gluon_ws3p"])
def test_gluon_forward_by_name_refuses_sinks(monkeypatch, impl):
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 64, seed=1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' has no attention sinks; got sink_size=4"):
        flash_attn(q, k, v, causal=True, window_size=(4, 0), sink_size=4, config=FlashConfig(fwd_impl=impl))
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))  # as on a Hopper GPU: the sinks alone refused
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    assert G.check_gluon_fwd(impl, q, k, v, 4, 0, None, 1, None) is True
    with pytest.raises(ValueError, match=r"sink_size=4 \(allowed there: sink_size=0\); use fwd_impl='triton'"):
        G.check_gluon_fwd(impl, q, k, v, 4, 0, None, 1, None, sink_size=4)


def test_gluon_backward_by_name_refuses_sinks(monkeypatch):
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 64, seed=1, dtype=torch.bfloat16)
    q.requires_grad_(True)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="triton")
    with pytest.raises(ValueError, match=r"bwd_impl='gluon' has no attention sinks; got sink_size=4"):
        flash_attn(q, k, v, causal=True, window_size=(4, 0), sink_size=4, config=cfg)
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    assert G.check_gluon_bwd(q, k, v, 4, 0, None, 1, None, cfg) is True
    with pytest.raises(ValueError, match=r"sink_size=4 \(allowed there: sink_size=0\); use bwd_impl='triton'"):
        G.check_gluon_bwd(q, k, v, 4, 0, None, 1, None, cfg, sink_size=4)


# ------------------------------------------------------------------------------------------- decode kernel
def _paged(kc, vc, ps, g):
    """The contiguous caches ``(B, Hkv, N, D)`` as shuffled pages of ``ps`` tokens and their block table."""
    B, Hkv, N, D = kc.shape
    n = B * (N // ps)
    bt = torch.randperm(n, generator=g).view(B, -1).to(torch.int32)
    kp, vp = kc.new_empty(n, Hkv, ps, D), vc.new_empty(n, Hkv, ps, vc.shape[3])
    for b in range(B):
        for p in range(N // ps):
            kp[bt[b, p]], vp[bt[b, p]] = kc[b, :, p * ps:(p + 1) * ps], vc[b, :, p * ps:(p + 1) * ps]
    return kp, vp, bt.to(kc.device)


@pytest.mark.parametrize("paged,splits,sink", [(False, 1, 5), (False, 3, 40), (True, 2, 21)])
def test_decode_sinks_against_reference(paged, splits, sink):
    """GQA 4:2, 3 new queries, ragged lengths, 16-key tiles: the sink tiles (several, or a partial one) over 1-3
    splits, contiguous and paged (tile lookups one ahead for the band, per tile for the sinks)."""
    from kernels.decode import decode_attn, decode_attn_reference

    g = torch.Generator().manual_seed(sink)
    B, Hq, Hkv, Nq, D, N = 2, 4, 2, 3, 16, 208
    q, kc, vc = (torch.randn(*s, generator=g) for s in ((B, Hq, Nq, D), (B, Hkv, N, D), (B, Hkv, N, D)))
    seqlens = torch.tensor([208, 150], dtype=torch.int32)
    want = decode_attn_reference(q, kc, vc, seqlens, window_size=(20, 0), sink_size=sink, return_lse=True)
    plain = decode_attn_reference(q, kc, vc, seqlens, window_size=(20, 0))
    assert not torch.allclose(want[0], plain)
    q, kc, vc, seqlens = (t.to(DEV) for t in (q, kc, vc, seqlens))
    bt = None
    if paged:
        kc, vc, bt = _paged(kc, vc, 8, g)
    out, lse = decode_attn(q, kc, vc, seqlens, bt, window_size=(20, 0), sink_size=sink, num_splits=splits,
                           block_n=16, return_lse=True)
    torch.testing.assert_close(out.cpu(), want[0], rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(lse.cpu(), want[1], rtol=1e-4, atol=2e-5)


def test_decode_sink_checks():
    from kernels.decode import DecodeSparse, decode_attn, decode_plan

    q, kc, vc = torch.randn(1, 2, 1, 16, device=DEV), torch.randn(1, 2, 64, 16, device=DEV), \
        torch.randn(1, 2, 64, 16, device=DEV)
    assert decode_plan(q, kc, vc, window_size=(8, 0), sink_size=4).sink == 4
    assert decode_plan(q, kc, vc, sink_size=4).sink == 0  # no left edge: nothing to do
    assert decode_plan(q, kc, vc, window_size=(8, 0)).sink == 0
    for bad in (-1, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"sink_size=.*allowed values: an integer >= 0"):
            decode_plan(q, kc, vc, window_size=(8, 0), sink_size=bad)
    with pytest.raises(ValueError, match=r"sink_size=4 cannot be combined with sparse"):
        decode_attn(q, kc, vc, torch.tensor([64], dtype=torch.int32, device=DEV), window_size=(8, 0), sink_size=4,
                    sparse=DecodeSparse(torch.ones(4, 4, dtype=torch.bool), 16))


# ------------------------------------------------------------------------------------------- GPU
GPU_CASES = [(c, torch.bfloat16) for c in sorted(CASES)] + [(c, torch.float16) for c in sorted(CASES)[::3]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case,dtype", GPU_CASES)
def test_sinks_on_gpu(case, dtype):
    """The CPU cases compiled, at the GPU's tiles (64-128 keys: sinks inside one tile and the band's first tile)
    and at lengths of several tiles (the positions scaled by 8), D 64."""
    causal, window, sink, Nq, Nk = CASES[case]
    _check(causal, window, sink, Nq, Nk, D=64, seed=1, dtype=dtype)
    w = tuple(None if x is None else 8 * x for x in window)
    _check(causal, w, 8 * sink, 8 * Nq, 8 * Nk, D=64, seed=2, dtype=dtype)
    _check(causal, w, 8 * sink, 8 * Nq, 8 * Nk, D=128, Hq=8, Hkv=2, seed=3, dtype=dtype,
           config=FlashConfig(tma=True))
