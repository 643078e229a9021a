"""Gluon backward (``FlashConfig(bwd_impl="gluon")``, kernels/flash/gluon.py ``gluon_flash_bwd``, kernel
``_gl_bwd_kernel`` in kernels/flash/_gluon_kernels.py; issue 30).

CPU: the settings' validation and refusals (``bwd_impl``, ``gluon_bwd_dq``, deterministic mode, masks / head dims /
dtypes / devices it does not cover, refused at the forward when a backward will be needed), the dispatch of
``flash_attn_bwd`` with the kernel mocked, ``gluon_flash_bwd``'s two dQ paths with the Gluon kernel mocked (the
Triton dQ kernel runs in the interpreter), the tiles, and bench_flash's ``ours_gluon_bwd`` / ``ours_gluon_bwd_tdq``.
GPU (``-m gpu``, Hopper, triton 3.6), for both dQ paths (``gluon_bwd_dq`` "atomic" / "triton") and both ways of
reading lse2 / delta (``GLUON_BWD_LSE_TMA``): dq / dk / dv against the fp32 reference (within 3x plain PyTorch's
error, as tests/test_kernel_flash.py) and against the Triton backward on the same forward, causal and full,
Nq == Nk and Nq != Nk (incl. causal rows that see no key), N not a multiple of the tiles, GQA / MQA, D 64 / 128,
bf16 / fp16, both input layouts, the lse gradient path; bitwise repeatable gradients with ``gluon_bwd_dq="triton"``
(which ``deterministic=True`` allows). The same for ``gluon_bwd_consumers=2`` (``_gl_bwd_dkdv2_kernel``, with and
without ``GLUON_BWD_PINGPONG``; CPU: its validation and dispatch). The same again for ``gluon_bwd_dq="gluon"`` (the
Gluon dQ kernel ``_gl_bwd_dq_kernel``, after either dK / dV kernel; a spy proves it ran and the Triton dQ did not).
"""

import os
import re
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, softmax_attention_reference  # noqa: E402
from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import BWD_IMPLS, GLUON_BWD_CONSUMERS, GLUON_BWD_DQ  # noqa: E402
from kernels.flash import bwd as BW  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402
from tests.test_kernel_flash_gluon import _plain_torch  # noqa: E402  (the one plain-PyTorch attention)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


# the dQ paths of the GPU tests: "tma" only where this triton's Gluon has the TMA reduce-add (3.7+; the GPU image's
# 3.6 has none: gluon_flash_bwd would raise the ValueError test_gluon_bwd_dq_tma_validation checks)
GPU_DQ = [pytest.param(d, marks=pytest.mark.skipif(d == "tma" and not G.gluon_tma_reduce_ok(),
                                                   reason="gluon_bwd_dq='tma' needs triton >= 3.7's Gluon TMA "
                                                          "reduce-add")) for d in GLUON_BWD_DQ]


def _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.bfloat16, device=DEV, seed=0, bnhd=False, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def mk(h, n):
        if bnhd:  # the model's layout: (B, N, H, D) storage seen as (B, H, N, D)
            t = torch.randn(B, n, h, D, generator=g).to(device=device, dtype=dtype).transpose(1, 2)
        else:
            t = torch.randn(B, h, n, D, generator=g).to(device=device, dtype=dtype)
        return t

    q, k, v, do = mk(Hq, Nq), mk(Hkv, Nk), mk(Hkv, Nk), mk(Hq, Nq)
    if requires_grad:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    return q, k, v, do


# ----------------------------------------------------------------------------------------------- CPU: the setting


def test_bwd_impl_default_validation_and_key():
    assert BWD_IMPLS == ("auto", "triton", "gluon")
    cfg = FlashConfig()
    assert cfg.bwd_impl == "auto" and cfg.key == "{}"  # the default config's custom-op key is unchanged
    t = FlashConfig(bwd_impl="triton")
    assert t != cfg and FlashConfig.from_key(t.key) == t and t.key == '{"bwd_impl": "triton"}'
    g = FlashConfig(bwd_impl="gluon")
    assert g != cfg and FlashConfig.from_key(g.key) == g and hash(FlashConfig.from_key(g.key)) == hash(g)
    assert cfg.replace(bwd_impl="gluon") == g
    for bad in ("Gluon", "gluon_ws3a", "", None, 1):
        with pytest.raises(ValueError, match=r"bwd_impl=.* is not supported; allowed values: 'auto', 'triton', 'gluon'$"):
            FlashConfig(bwd_impl=bad)


def test_auto_bwd_rule(monkeypatch):
    """bwd_impl="auto" takes the Gluon backward (two consumers; Gluon dQ at D 128) only for dense / causal fp16 / bf16 calls of
    D 64 / 128 with Dv == D and Hq == Hkv (GQA where gqa_bwd_measured holds), the Triton backward's settings at their defaults, >= GLUON_BWD_AUTO_MIN_PAIRS visited
    pairs per head, on Hopper with Gluon importable and outside the interpreter; everything else is "triton", and an
    explicit bwd_impl is returned as is."""
    from tests.test_kernel_flash_gluon import _all_hold, _fake_qkv

    _all_hold(monkeypatch)
    auto = FlashConfig()
    big = _fake_qkv(B=1, Hq=16, Hkv=16, Nq=4096, Nk=4096)
    assert G.choose_bwd_impl(auto, *big, -1, 0) == "gluon"  # causal 4k: 8.4M pairs per head
    assert G.choose_bwd_impl(auto, *_fake_qkv(Hkv=8, Nq=4096, Nk=4096), -1, 0) == "gluon"  # the stand-ins below
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=64, Hq=16, Hkv=16, Nq=2048, Nk=2048, D=64), -1, -1) == "gluon"
    # GQA: the Gluon backward only where it was measured (gqa_bwd_measured): D 128, dense / causal, group <= 4,
    # >= 512 dK / dV programs; MQA, D 64, small grids and GQA band masks keep the Triton backward
    gqa = _fake_qkv(B=4, Hq=16, Hkv=4, Nq=4096, Nk=4096)  # 4:1, 32 key tiles x 4 x 4 = 512 programs
    assert G.choose_bwd_impl(auto, *gqa, -1, 0) == "gluon"
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=64, Hq=16, Hkv=4, Nq=2048, Nk=2048), -1, -1) == "gluon"
    for why, args in (("D 64", _fake_qkv(B=64, Hq=16, Hkv=4, Nq=2048, Nk=2048, D=64)),
                      ("MQA", _fake_qkv(B=4, Hq=16, Hkv=1, Nq=16384, Nk=16384)),  # group 16
                      ("group 8", _fake_qkv(B=8, Hq=32, Hkv=4, Nq=4096, Nk=4096)),
                      ("256 programs", _fake_qkv(B=2, Hq=16, Hkv=4, Nq=4096, Nk=4096))):
        assert G.choose_bwd_impl(auto, *args, -1, 0) == "triton", why
    for band in (dict(win_left=1023, win_right=0), dict(win_left=-1, win_right=0, documents=object())):
        assert G.choose_bwd_impl(auto, *gqa, **band) == "triton", band
    assert G.gqa_bwd_measured(4, 16, 4, 4096, 128, False) and not G.gqa_bwd_measured(4, 16, 4, 4096, 128, True)
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_GQA_HEAD_DIMS", ())
    assert G.choose_bwd_impl(auto, *gqa, -1, 0) == "triton"
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_GQA_HEAD_DIMS", (128,))
    # GLUON_BWD_AUTO_MIN_PAIRS by head dim: D 128 from 2^19 pairs per head (causal 1k: 524,800; causal 1023 and
    # dense 724 below; N 512 either way), D 64 from 2^22 (causal 2k: 2.1M below, dense 2k: exactly 2^22)
    assert G.GLUON_BWD_AUTO_MIN_PAIRS == {64: 1 << 22, 128: 1 << 19}
    mha = lambda N, D=128: _fake_qkv(B=16, Hq=16, Hkv=16, Nq=N, Nk=N, D=D)  # noqa: E731
    for (N, D, wr), want in (((1024, 128, 0), "gluon"), ((1023, 128, 0), "triton"), ((725, 128, -1), "gluon"),
                             ((724, 128, -1), "triton"), ((512, 128, 0), "triton"), ((512, 128, -1), "triton"),
                             ((2048, 64, 0), "triton"), ((2048, 64, -1), "gluon"), ((1024, 64, -1), "triton")):
        assert G.choose_bwd_impl(auto, *mha(N, D), -1, wr) == want, (N, D, wr)
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=16, Hkv=16, Nq=1, Nk=1 << 22), -1, -1) == "gluon"  # decode-like
    bands = [dict(win_left=1023, win_right=0), dict(documents=object()), dict(win_right=5),
             dict(win_left=2047, win_right=-1), dict(win_left=1023, win_right=0, documents=object())]
    for kw in [dict(layout=object()), dict(dilation=2), dict(win_left=1023, win_right=0, dilation=2)] + bands:
        args = dict(win_left=-1, win_right=0, layout=None, dilation=1, documents=None) | kw
        band = kw in bands  # sliding windows and documents: the Gluon backward (GLUON_AUTO_BWD_BANDS); never
        assert G.choose_bwd_impl(auto, *big, **args) == ("gluon" if band else "triton"), kw  # layout / dilation
        monkeypatch.setattr(G, "GLUON_AUTO_BWD_BANDS", False)
        assert G.choose_bwd_impl(auto, *big, **args) == "triton", kw
        assert G.choose_bwd_impl(auto, *big, -1, 0) == "gluon"  # (the flag leaves dense / causal alone)
        monkeypatch.setattr(G, "GLUON_AUTO_BWD_BANDS", True)
    # the pairs threshold counts a window's band (visited_pairs): 4096 rows x 128 keys = 2^19 pairs per head at
    # D 128, 4096 rows x 1024 keys = 2^22 at D 64
    assert G.choose_bwd_impl(auto, *big, 127, 0) == "gluon" and G.choose_bwd_impl(auto, *big, 126, 0) == "triton"
    big64 = _fake_qkv(B=1, Hq=16, Hkv=16, Nq=4096, Nk=4096, D=64)
    assert G.choose_bwd_impl(auto, *big64, 1023, 0) == "gluon" and G.choose_bwd_impl(auto, *big64, 1022, 0) == "triton"
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=16, Hkv=4, Nq=4096, Nk=4096), 1023, 0) == "triton"  # GQA
    for bad in (_fake_qkv(Hkv=8, Nq=4096, Nk=4096, D=96), _fake_qkv(Hkv=8, Nq=4096, Nk=4096, Dv=64),
                _fake_qkv(Hkv=8, Nq=4096, Nk=4096, dtype=torch.float32)):
        assert G.choose_bwd_impl(auto, *bad, -1, 0) == "triton"
    for cfg in (FlashConfig(dq_mode="atomic"), FlashConfig(dkdv_split=1), FlashConfig(autotune=True),
                FlashConfig(bwd_impl="triton")):
        assert G.choose_bwd_impl(cfg, *big, -1, 0) == "triton", cfg
    assert G.choose_bwd_impl(FlashConfig(deterministic=True), *big, -1, 0) == "gluon"  # its dQ has no atomics
    assert G.choose_bwd_impl(FlashConfig(bwd_impl="gluon"), *_fake_qkv(Nq=8, Nk=8), -1, 0) == "gluon"  # as asked
    for hold in (dict(hopper=False), dict(gluon=False), dict(interpret=True)):
        _all_hold(monkeypatch, **hold)
        assert G.choose_bwd_impl(auto, *big, -1, 0) == "triton", hold
    _all_hold(monkeypatch)


def test_auto_bwd_sparse_knob(monkeypatch):
    """A block-sparse layout: "auto" takes the Gluon backward while GLUON_AUTO_BWD_SPARSE is on exactly where
    check_gluon_bwd takes it under auto's settings (whole 128 x 128 tiles, D 128 for the Gluon dQ, no documents, MHA)
    from GLUON_AUTO_BWD_SPARSE_MIN_N queries; off (or shorter), the Triton backward."""
    from tests.test_kernel_flash_gluon import _all_hold, _fake_qkv

    _all_hold(monkeypatch)
    auto = FlashConfig()
    assert G.GLUON_AUTO_BWD_SPARSE and G.GLUON_AUTO_BWD_SPARSE_MIN_N == 4096  # the default (H100, 2026-12-07)
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=4, Hkv=4, Nq=2048, Nk=2048), -1, 0, object(), 1, None,
                             128) == "triton"  # BigBird / strided at 1k-2k: the Gluon backward 0.64-1.03x
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=4, Hkv=4, Nq=4096, Nk=4096), -1, 0, object(), 1, None,
                             128) == "gluon"
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_SPARSE_MIN_N", 1024)  # the grid below at the short shapes
    small = _fake_qkv(B=1, Hq=4, Hkv=4, Nq=1024, Nk=1024)
    lay = dict(win_left=-1, win_right=0, layout=object(), layout_bs=128)
    assert G.choose_bwd_impl(auto, *small, **lay) == "gluon"
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_SPARSE", False)
    assert G.choose_bwd_impl(auto, *small, **lay) == "triton"
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_SPARSE", True)
    assert G.choose_bwd_impl(auto, *small, **(lay | dict(layout_bs=256))) == "gluon"
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=4, Hkv=4, Nq=1024, Nk=1280), **lay) == "gluon"  # Nk - Nq 256
    refused = [(small, dict(layout_bs=64)), (small, dict(layout_bs=192)),  # blocks not whole 128 x 128 tiles
               (_fake_qkv(B=1, Hq=4, Hkv=4, Nq=1024, Nk=1088), {}),  # Nk - Nq = 64
               (_fake_qkv(B=1, Hq=4, Hkv=4, Nq=896, Nk=1024), {}),  # below the minimum
               (_fake_qkv(B=1, Hq=4, Hkv=4, Nq=1024, Nk=1024, D=64), {}),  # D 64: no Gluon dQ
               (_fake_qkv(B=4, Hq=16, Hkv=4, Nq=4096, Nk=4096), {}),  # GQA
               (small, dict(documents=object())), (small, dict(dilation=2)),
               (small, dict(layout_bs=0))]
    for args, kw in refused:
        assert G.choose_bwd_impl(auto, *args, **(lay | kw)) == "triton", (args[0].shape, kw)
    # non-causal and windowed layouts too by default; while GLUON_AUTO_SPARSE_CAUSAL_ONLY, only causal ones without a
    # window, forward and backward
    assert not G.GLUON_AUTO_SPARSE_CAUSAL_ONLY
    for mask in (dict(win_right=-1), dict(win_left=511), dict(win_right=5)):
        assert G.choose_bwd_impl(auto, *small, **(lay | mask)) == "gluon", mask
        assert G.choose_fwd_impl(auto, *small, **(lay | mask)) == G.AUTO_GLUON_IMPL, mask
        monkeypatch.setattr(G, "GLUON_AUTO_SPARSE_CAUSAL_ONLY", True)
        assert G.choose_bwd_impl(auto, *small, **(lay | mask)) == "triton", mask
        assert G.choose_fwd_impl(auto, *small, **(lay | mask)) == "triton", mask
        monkeypatch.setattr(G, "GLUON_AUTO_SPARSE_CAUSAL_ONLY", False)
    assert G.choose_fwd_impl(auto, *small, **lay) == G.AUTO_GLUON_IMPL
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_SPARSE_MIN_N", 16384)
    assert G.choose_bwd_impl(auto, *small, **lay) == "triton"
    assert G.choose_bwd_impl(auto, *_fake_qkv(B=1, Hq=16, Hkv=16, Nq=16384, Nk=16384), **lay) == "gluon"
    # where auto takes it, the explicit check passes with auto's settings (and fails without whole tiles)
    cfg = G.auto_gluon_bwd_config(auto, 128)
    q, k, v = small
    assert cfg.gluon_bwd_dq == "gluon" and cfg.gluon_bwd_consumers == 2
    monkeypatch.setattr(G, "_capability", lambda device: (8, 0))
    with pytest.raises(ValueError, match="got device"):  # past every mask / shape check: only the device is wrong
        G.check_gluon_bwd(q, k, v, -1, 0, object(), 1, None, cfg, 128)
    with pytest.raises(ValueError, match="block_size=64"):
        G.check_gluon_bwd(q, k, v, -1, 0, object(), 1, None, cfg, 64)
    assert G.choose_bwd_impl(auto, *_fake_qkv(Hkv=8, Nq=4096, Nk=4096, device="cpu"), -1, 0) == "triton"
    run = G.auto_gluon_bwd_config(FlashConfig(deterministic=True), 64)
    assert (run.bwd_impl, run.gluon_bwd_dq, run.gluon_bwd_consumers, run.deterministic) == ("gluon", "triton", 2, True)
    run = G.auto_gluon_bwd_config(FlashConfig(deterministic=True), 128)  # both dQ kernels are deterministic
    assert (run.bwd_impl, run.gluon_bwd_dq, run.gluon_bwd_consumers, run.deterministic) == ("gluon", "gluon", 2, True)


def test_auto_bwd_gluon_choices_pass_the_check(monkeypatch):
    """Wherever "auto" takes the Gluon backward (layouts at the patched minimum N and beyond, bands, dense; ragged
    N, Nq != Nk, GQA, every head dim / Dv / dtype / setting it may see), check_gluon_bwd accepts the call with auto's
    settings (auto_gluon_bwd_config), so a training step never meets the check's ValueError; the grid does reach
    "gluon" for layouts, windows and GQA."""
    import itertools

    from tests.test_kernel_flash_gluon import _all_hold, _fake_qkv

    _all_hold(monkeypatch)
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    monkeypatch.setattr(G, "GLUON_AUTO_BWD_SPARSE_MIN_N", 4096)
    assert not G.GLUON_AUTO_SPARSE_CAUSAL_ONLY  # the default: every mask on a layout
    cfgs = (FlashConfig(), FlashConfig(deterministic=True), FlashConfig(dq_mode="atomic"), FlashConfig(tma=False),
            FlashConfig(gluon_bwd_dq="triton"), FlashConfig(gluon_bwd_consumers=2, gluon_bwd_dq="triton"))
    took = set()
    for (Hq, Hkv), (Nq, dn), (D, Dv), dt, (lay, bs), (wl, wr), docs, dil, cfg in itertools.product(
            ((8, 8), (8, 2)), ((4096, 0), (4100, 0), (4096, 128), (4224, -128), (4096, 64), (4000, 0)),
            ((128, 128), (64, 64), (128, 64), (256, 256)), (torch.bfloat16, torch.float16, torch.float32),
            ((None, 0), (object(), 128), (object(), 256), (object(), 64), (object(), 0)),
            ((-1, -1), (-1, 0), (1500, 0), (-1, 7)), (None, object()), (1, 2), cfgs):
        q, k, v = _fake_qkv(8, Hq, Hkv, Nq, Nq + dn, D, Dv, dt)
        if G.choose_bwd_impl(cfg, q, k, v, wl, wr, lay, dil, docs, bs) != "gluon":
            continue
        took.add((lay is not None, wl >= 0, Hq != Hkv))
        G.check_gluon_bwd(q, k, v, wl, wr, lay, dil, docs, G.auto_gluon_bwd_config(cfg, D), bs)
    assert {(True, False, False), (True, True, False), (False, False, True), (False, True, False)} <= took


def test_auto_bwd_is_triton_on_cpu():
    """Real CPU tensors: the default config's backward is the Triton one's, bit for bit."""
    q, k, v, do = _qkv(1, 2, 2, 40, 40, 64, device="cpu")
    a = _grads(q, k, v, do, True, FlashConfig())
    b = _grads(q, k, v, do, True, FlashConfig(bwd_impl="triton"))
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_gluon_bwd_dq_validation_and_key():
    assert GLUON_BWD_DQ == ("atomic", "triton", "gluon", "tma")
    assert FlashConfig().gluon_bwd_dq == "atomic" and FlashConfig(bwd_impl="gluon").key == '{"bwd_impl": "gluon"}'
    t = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton")
    assert t != FlashConfig(bwd_impl="gluon") and FlashConfig.from_key(t.key) == t
    assert hash(FlashConfig.from_key(t.key)) == hash(t) and FlashConfig(bwd_impl="gluon").replace(
        gluon_bwd_dq="triton") == t
    assert FlashConfig(bwd_impl="triton", gluon_bwd_dq="triton").bwd_impl == "triton"  # accepted (and ignored)
    for bad in ("Triton", "separate", "", None, 0):
        with pytest.raises(ValueError, match=r"gluon_bwd_dq=.* is not supported; allowed values: 'atomic', "
                                             r"'triton', 'gluon', 'tma'$"):
            FlashConfig(bwd_impl="gluon", gluon_bwd_dq=bad)


def test_gluon_bwd_dq_tma_validation(monkeypatch):
    """gluon_bwd_dq="tma" (the fused dQ by TMA reduce-add): one or two consumers, refused by deterministic=True (its
    partial sums are added in an arbitrary order, as "atomic"'s); on a triton whose Gluon lacks the reduce-add,
    check_gluon_bwd and gluon_flash_bwd raise a ValueError naming gluon_bwd_dq, this triton and the values allowed."""
    t = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="tma")
    assert FlashConfig.from_key(t.key) == t and t.gluon_bwd_consumers == 1
    two = t.replace(gluon_bwd_consumers=2)
    assert FlashConfig.from_key(two.key) == two
    with pytest.raises(ValueError, match=r"gluon_bwd_consumers=3 is not supported with gluon_bwd_dq='tma'"):
        t.replace(gluon_bwd_consumers=3)
    for c in (t, two):
        with pytest.raises(ValueError, match=r"deterministic=True needs .*gluon_bwd_dq='tma' adds its fp32 dQ"):
            c.replace(deterministic=True)
    import triton

    has = hasattr(__import__("triton.experimental.gluon.language.nvidia.hopper", fromlist=["tma"]).tma,
                  "async_atomic_add")
    assert G.gluon_tma_reduce_ok() is has  # (triton 3.9 here: True; the GPU image's 3.6: False)
    monkeypatch.setattr(G, "gluon_tma_reduce_ok", lambda: False)
    q, k, v, do = _qkv(1, 2, 2, 128, 128, 128, device="cpu")
    msg = rf"gluon_bwd_dq='tma' needs the TMA reduce-add .* this triton is {re.escape(triton.__version__)}; " \
          r"allowed values here: 'atomic', 'triton', 'gluon'"
    with pytest.raises(ValueError, match=msg):
        G.gluon_flash_bwd(do, q, k, v, do, torch.zeros(1, 2, 128), 0.1, -1, 0, config=t)
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    with pytest.raises(ValueError, match=msg):  # past the mask / shape / device checks
        G.check_gluon_bwd(q, k, v, -1, 0, None, 1, None, t)
    monkeypatch.setattr(G, "gluon_tma_reduce_ok", lambda: True)
    assert G.check_gluon_bwd(q, k, v, -1, 0, None, 1, None, t) is True  # causal


def test_gluon_bwd_dq_gluon_validation_and_key():
    """gluon_bwd_dq="gluon" (the Gluon dQ kernel): its key round-trips, it composes with gluon_bwd_consumers 1 and 2,
    deterministic=True allows it (no atomics), bwd_impl="auto" picks it at D 128 only (measured faster there)."""
    g = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="gluon")
    assert g.key == '{"bwd_impl": "gluon", "gluon_bwd_dq": "gluon"}'
    assert FlashConfig.from_key(g.key) == g and hash(FlashConfig.from_key(g.key)) == hash(g)
    assert g != FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton") and g.gluon_bwd_consumers == 1
    two = g.replace(gluon_bwd_consumers=2)
    assert FlashConfig.from_key(two.key) == two and '"gluon_bwd_consumers": 2' in two.key
    assert two.replace(deterministic=True).deterministic and g.replace(deterministic=True).deterministic
    assert FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2).replace(
        gluon_bwd_dq="gluon") == two
    with pytest.raises(ValueError, match=r"gluon_bwd_consumers=2 is not supported with gluon_bwd_dq='atomic'"):
        two.replace(gluon_bwd_dq="atomic")
    with pytest.raises(ValueError, match=r"gluon_bwd_consumers=3 is not supported with gluon_bwd_dq='gluon'; "
                                         r"allowed values: 1, 2 \(2 only with gluon_bwd_dq='triton', 'gluon' or "
                                         r"'tma'"):
        g.replace(gluon_bwd_consumers=3)
    assert G.AUTO_GLUON_DQ_HEAD_DIMS == (128,)
    assert G.auto_gluon_bwd_config(FlashConfig(), 128).gluon_bwd_dq == "gluon"
    assert G.auto_gluon_bwd_config(FlashConfig(), 64).gluon_bwd_dq == "triton"


def test_gluon_bwd_consumers_validation_and_key():
    """gluon_bwd_consumers: 1 (default, key unchanged) or 2, and 2 only with gluon_bwd_dq="triton" (the two-consumer
    kernel computes dK / dV only); anything else is a ValueError naming the field and its allowed values."""
    assert GLUON_BWD_CONSUMERS == (1, 2)
    assert FlashConfig().gluon_bwd_consumers == 1 and FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=1).key == \
        '{"bwd_impl": "gluon"}'
    two = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2)
    assert two != FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton") and FlashConfig.from_key(two.key) == two
    assert hash(FlashConfig.from_key(two.key)) == hash(two) and '"gluon_bwd_consumers": 2' in two.key
    assert FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton").replace(gluon_bwd_consumers=2) == two
    assert FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2, deterministic=True).deterministic
    for bad in (0, 3, 4, -1, "2", 2.0, None, True):
        with pytest.raises(ValueError, match=r"gluon_bwd_consumers=.* is not supported with gluon_bwd_dq='triton'; "
                                             r"allowed values: 1, 2"):
            FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=bad)
    for kw in (dict(bwd_impl="gluon"), dict(bwd_impl="gluon", gluon_bwd_dq="atomic"), dict()):
        with pytest.raises(ValueError, match=r"gluon_bwd_consumers=2 is not supported with gluon_bwd_dq='atomic'; "
                                             r"allowed values: 1, 2 \(2 only with gluon_bwd_dq='triton'"):
            FlashConfig(gluon_bwd_consumers=2, **kw)
    with pytest.raises(ValueError, match=r"gluon_bwd_consumers=2 is not supported with gluon_bwd_dq='atomic'"):
        two.replace(gluon_bwd_dq="atomic")


def test_deterministic_refuses_gluon_backward_with_atomic_dq_only():
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton'.*bwd_impl='gluon'.*atomics"):
        FlashConfig(bwd_impl="gluon", deterministic=True)
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton', or bwd_impl='gluon' with "
                                         r"gluon_bwd_dq='triton'"):
        FlashConfig(deterministic=True).replace(bwd_impl="gluon")
    with pytest.raises(ValueError, match=r"deterministic=True needs"):
        FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", deterministic=True).replace(gluon_bwd_dq="atomic")
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 64, device="cpu", requires_grad=True)
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton'"):  # the call's argument
        flash_attn(q, k, v, causal=True, deterministic=True, config=FlashConfig(bwd_impl="gluon"))
    assert FlashConfig(bwd_impl="triton", deterministic=True).deterministic  # the Triton backward stays allowed
    # the Gluon dK / dV kernel with the Triton dQ: no atomics, allowed (the call then fails on the CPU device only)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", deterministic=True)
    assert cfg.deterministic and FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton").replace(deterministic=True) == cfg
    with pytest.raises(ValueError, match=r"bwd_impl='gluon' supports only .*got device cpu"):
        flash_attn(q, k, v, causal=True, deterministic=True,
                   config=FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton"))


@pytest.mark.parametrize("case", ["window", "window_right", "documents", "dilation", "head_dim", "dv", "dtype",
                                  "device"])
def test_unsupported_calls_refused_before_the_forward(case):
    """With an input that requires grad, flash_attn refuses a call the Gluon backward cannot run before any kernel
    (ValueError naming bwd_impl='gluon' and what it supports). Windows and doc_ids with one consumer: the error names
    gluon_bwd_consumers and its allowed values."""
    D, Dv, dtype, kw = 64, 64, torch.bfloat16, dict(causal=True)
    expect = {"window": r"window \(left=7", "window_right": r"window \(left=-1, right=3\)", "documents": "doc_ids",
              "dilation": "dilation=2", "head_dim": "D=96", "dv": "D=64, Dv=128", "dtype": "dtype torch.float32",
              "device": "device cpu"}[case]
    if case == "window":
        kw = dict(causal=True, window_size=(7, 0))
    elif case == "window_right":
        kw = dict(causal=False, window_size=(None, 3))
    elif case == "documents":
        kw = dict(causal=True, doc_ids=torch.tensor([[0] * 8 + [1] * 8]))
    elif case == "dilation":
        kw = dict(causal=True, window_size=(7, 0), dilation=2)
    elif case == "head_dim":
        D = Dv = 96
    elif case == "dv":
        Dv = 128
    elif case == "dtype":
        dtype = torch.float32
    q = torch.randn(1, 2, 16, D, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, 16, D, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, 16, Dv, dtype=dtype, requires_grad=True)
    if case in ("window", "window_right", "documents"):
        with pytest.raises(ValueError, match=rf"bwd_impl='gluon' with gluon_bwd_consumers=1 supports only dense or "
                                             rf"causal masks; got {expect}.*need gluon_bwd_consumers=2 \(allowed "
                                             r"values: 1, 2; .*use bwd_impl='triton'"):
            flash_attn(q, k, v, config=FlashConfig(bwd_impl="gluon"), **kw)
        # two consumers take them: refused for the CPU device only
        with pytest.raises(ValueError, match=r"bwd_impl='gluon' supports only dense, causal, sliding-window and "
                                             r"document masks.*got device cpu"):
            flash_attn(q, k, v, config=FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2),
                       **kw)
        return
    with pytest.raises(ValueError, match=rf"bwd_impl='gluon' supports only dense or causal.*got {expect}.*"
                                         r"use bwd_impl='triton'"):
        flash_attn(q, k, v, config=FlashConfig(bwd_impl="gluon"), **kw)
    if case == "dilation":  # never with two consumers either
        with pytest.raises(ValueError, match=r"supports only dense, causal, sliding-window and document masks \(no "
                                             r"block-sparse layout or dilation\).*got dilation=2"):
            flash_attn(q, k, v, config=FlashConfig(bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2),
                       **kw)


def test_forward_only_call_is_not_refused():
    """No input requires grad (or grad is off): the backward setting is not checked (forward on CPU runs)."""
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 16, dtype=torch.float32, device="cpu")
    ref = flash_attn(q, k, v, causal=True)
    out = flash_attn(q, k, v, causal=True, config=FlashConfig(bwd_impl="gluon"))
    torch.testing.assert_close(out, ref)
    qg = q.clone().requires_grad_(True)
    with torch.no_grad():
        torch.testing.assert_close(flash_attn(qg, k, v, causal=True, config=FlashConfig(bwd_impl="gluon")), ref)


def test_flash_attn_bwd_dispatches_to_gluon(monkeypatch):
    """flash_attn_bwd with bwd_impl="gluon" checks the call (with the config: it says which masks the kernel takes)
    and runs gluon_flash_bwd with the window edges, dlse, the layout flag, the config and the document table; with
    "triton" neither is called."""
    q, k, v, do = _qkv(1, 4, 2, 32, 48, 64, device="cpu")
    seen = []
    monkeypatch.setattr(G, "check_gluon_bwd", lambda q_, k_, v_, wl, wr, lay, dil, docs, cfg, lay_bs=0, **_: seen.append(
        ("check", wl, wr, lay, dil, docs, cfg)) or wr == 0)
    monkeypatch.setattr(G, "gluon_flash_bwd", lambda do_, q_, k_, v_, o_, l_, scale, wl, wr, dlse, like, config,
                        documents, layout=None, layout_bs=0: seen.append(
                            ("run", scale, wl, wr, dlse, like, config, documents)) or ("dq", "dk", "dv"))
    lse = torch.zeros(1, 4, 32)
    dlse = torch.ones(1, 4, 32)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton")
    got = BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, 0, dlse=dlse, grads_like_inputs=False, config=cfg)
    assert got == ("dq", "dk", "dv")
    assert seen[0] == ("check", -1, 0, None, 1, None, cfg) and seen[1][:4] == ("run", 0.125, -1, 0)
    assert seen[1][4] is dlse and seen[1][5] is False and seen[1][6] is cfg  # the config (its dQ choice) travels
    BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, -1, config=FlashConfig(bwd_impl="gluon"))
    assert seen[3][2:4] == (-1, -1)  # dense
    table = torch.zeros(1, 3 * (32 + 48), dtype=torch.int32)
    cfg2 = cfg.replace(gluon_bwd_consumers=2)
    BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, 7, 0, config=cfg2, documents=table)
    assert seen[4][1:3] == (7, 0) and seen[4][5] is table and seen[4][6] is cfg2
    assert seen[5][2:4] == (7, 0) and seen[5][6] is cfg2 and seen[5][7] is table  # window and documents travel
    n = len(seen)
    monkeypatch.setattr(BW, "_get_plan", lambda *a: (_ for _ in ()).throw(RuntimeError("triton path")))
    monkeypatch.setattr(BW, "_PLANS", {})
    with pytest.raises(RuntimeError, match="triton path"):  # the default takes the Triton path
        BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, 0, config=FlashConfig(bwd_impl="triton"))
    assert len(seen) == n


class _FakeKernel:
    """Stands in for ``_gl_bwd_kernel``: records the launch, writes ``fill`` into DQA (when it is a dQ buffer) and
    marks dK / dV."""

    def __init__(self, fill=0.5):
        self.calls, self.fill = [], fill

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, args, kw))
            dqa, dk, dv = args[6], args[9], args[10]
            if kw.get("DQ_TMA"):  # a descriptor over the buffer (_fake_gluon's: ("desc", index))
                dqa = self.descs[dqa[1]][0]
            if kw.get("WRITE_DQ") or kw.get("DQ_TMA"):  # (the two-consumer kernel: no WRITE_DQ, dQ only by TMA)
                dqa.fill_(self.fill)
            dk.fill_(1.0)
            dv.fill_(2.0)
        return launch


class _FakeDqKernel:
    """Stands in for ``_gl_bwd_dq_kernel``: records the launch and writes 3 into DQ."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, args, kw))
            args[6].fill_(3.0)
        return launch


def _fake_gluon(monkeypatch):
    """Mock the Gluon side of gluon_flash_bwd (kernel module, descriptors, layouts); returns (kernel, descriptors)."""
    kern, kern2, descs = _FakeKernel(), _FakeKernel(), []

    def td(base, shape, strides, block, layout):
        descs.append((base, shape, strides, block, layout))
        return ("desc", len(descs) - 1)

    gl = SimpleNamespace(bfloat16="bf16", float16="fp16")
    kdq = _FakeDqKernel()
    monkeypatch.setattr(G, "_gluon_modules", lambda: (SimpleNamespace(_gl_bwd_kernel=kern, _gl_bwd_dkdv2_kernel=kern2,
                                                                      _gl_bwd_dq_kernel=kdq), td, gl))
    kern.two = kern2  # (the two-consumer kernel, gluon_bwd_consumers=2)
    kern.descs = kern2.descs = descs  # (gluon_bwd_dq="tma": DQA is a descriptor)
    kern.dq = kdq  # (the dQ kernel, gluon_bwd_dq="gluon")
    monkeypatch.setattr(G, "nvmma_layout", lambda block, dt: ("nvmma", tuple(block), dt))
    monkeypatch.setattr(G, "lse_layout", lambda: "lse_layout")
    monkeypatch.setattr(G, "dq_tma_layout", lambda: "dq_tma_layout")
    return kern, descs


@pytest.mark.parametrize("causal", [True, False])
def test_gluon_flash_bwd_dq_paths(monkeypatch, causal):
    """gluon_bwd_dq="atomic": the kernel runs with WRITE_DQ=True into a zeroed fp32 (B, Hq, Nq, D) buffer, dq is that
    buffer * scale and the Triton dQ kernel does not run; "triton": WRITE_DQ=False, no dQ buffer (a placeholder),
    and dq comes from the Triton dQ kernel (interpreter) launched as the Triton backward launches it: equal to the
    Triton backward's dq. lse2 / delta reach the kernel as 1-D descriptors over the preprocess's buffers (box of
    BLOCK_M), read by TMA as GLUON_BWD_LSE_TMA says."""
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 40, 56, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=1)
    scale = D ** -0.5
    out, lse = _fwd(q, k, v, scale, causal)
    kern, descs = _fake_gluon(monkeypatch)
    tdq = []
    real_tdq = BW.triton_dq
    monkeypatch.setattr(BW, "triton_dq", lambda *a: tdq.append(a) or real_tdq(*a))
    bm = G.gluon_bwd_tiles(D)[0]
    wr = 0 if causal else -1

    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=FlashConfig(bwd_impl="gluon"))
    grid, args, kw = kern.calls[-1]
    assert kw["WRITE_DQ"] is True and kw["LSE_TMA"] is G.GLUON_BWD_LSE_TMA is True and kw["CAUSAL"] is causal
    assert grid == (-(-Nk // 128), B * Hkv) and tdq == []
    assert args[6].shape == (B, Hq, Nq, D) and args[6].dtype == torch.float32
    torch.testing.assert_close(dq, torch.full_like(q, 0.5 * scale))
    assert (dk == 1).all() and (dv == 2).all()
    lse2, delta = args[7], args[8]
    for i, buf in ((4, lse2), (5, delta)):  # the lse / delta descriptors: 1-D over the flat buffers, box BLOCK_M
        base, shape, strides, block, layout = descs[args[i][1]]
        assert base.data_ptr() == buf.data_ptr() and base.dim() == 1 and buf.is_contiguous()
        assert (shape, strides, block, layout) == ([B * Hq * Nq], [1], [bm], "lse_layout")

    # "tma": the same kernel with DQ_TMA, DQA a descriptor over the zeroed fp32 buffer (box [1, 1, BLOCK_M, D],
    # 128-byte swizzle), dq that buffer * scale
    monkeypatch.setattr(G, "gluon_tma_reduce_ok", lambda: True)
    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr,
                                   config=FlashConfig(bwd_impl="gluon", gluon_bwd_dq="tma"))
    grid, args, kw = kern.calls[-1]
    assert kw["WRITE_DQ"] is True and kw["DQ_TMA"] is True and kw["CAUSAL"] is causal and tdq == []
    base, shape, strides, block, layout = descs[args[6][1]]
    assert base.shape == (B, Hq, Nq, D) and base.dtype == torch.float32 and base.is_contiguous()
    assert (shape, strides, block, layout) == ([B, Hq, Nq, D], list(base.stride()), [1, 1, bm, D], "dq_tma_layout")
    torch.testing.assert_close(dq, torch.full_like(q, 0.5 * scale))
    assert (dk == 1).all() and (dv == 2).all()
    # "tma" with two consumers: the two-consumer kernel with DQ_TMA and the same descriptor
    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=FlashConfig(
        bwd_impl="gluon", gluon_bwd_dq="tma", gluon_bwd_consumers=2))
    grid2, args2, kw2 = kern.two.calls[-1]
    assert kw2["DQ_TMA"] is True and "WRITE_DQ" not in kw2 and grid2 == grid and tdq == []
    base, shape, strides, block, layout = descs[args2[6][1]]
    assert base.shape == (B, Hq, Nq, D) and (shape, block, layout) == ([B, Hq, Nq, D], [1, 1, bm, D], "dq_tma_layout")
    torch.testing.assert_close(dq, torch.full_like(q, 0.5 * scale))

    monkeypatch.setattr(G, "GLUON_BWD_LSE_TMA", False)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton")
    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=cfg)
    grid, args, kw = kern.calls[-1]
    assert kw["WRITE_DQ"] is False and kw["LSE_TMA"] is False
    assert args[6] is args[8]  # no dQ buffer: the placeholder is delta
    assert len(tdq) == 1 and tdq[0][6] is dq and tdq[0][8:10] == (-1, wr) and tdq[0][10] is cfg
    assert tdq[0][11] is None  # no documents
    assert (dk == 1).all() and (dv == 2).all()
    ref = BW.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, 0 if causal else -1, config=FlashConfig(bwd_impl="triton"))
    assert torch.equal(dq, ref[0])  # the same kernel on the same lse2 / delta
    with pytest.raises(ValueError, match=r"gluon_bwd_dq='x' is not supported; allowed values: 'atomic', 'triton'"):
        G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr,
                          config=SimpleNamespace(gluon_bwd_dq="x"))


@pytest.mark.parametrize("pingpong,overlap", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("causal", [True, False])
def test_gluon_flash_bwd_two_consumers_dispatch(monkeypatch, causal, pingpong, overlap):
    """gluon_bwd_consumers=2 (with gluon_bwd_dq="triton"): _gl_bwd_dkdv2_kernel runs instead of _gl_bwd_kernel, on
    the same grid (cdiv(Nk, 128) key tiles of 128 rows: two consumers of 64) and arguments, with num_warps = 4 (the
    default partition: one warpgroup), PINGPONG = GLUON_BWD_PINGPONG, OVERLAP = GLUON_BWD_OVERLAP and no WRITE_DQ; dq
    from the Triton dQ kernel,
    equal to the Triton backward's. The atomic dQ with two consumers is refused (FlashConfig first, then
    gluon_flash_bwd itself for a config object that skipped the check)."""
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 40, 200, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=5)
    scale = D ** -0.5
    out, lse = _fwd(q, k, v, scale, causal)
    kern, descs = _fake_gluon(monkeypatch)
    monkeypatch.setattr(G, "GLUON_BWD_PINGPONG", pingpong)
    monkeypatch.setattr(G, "GLUON_BWD_OVERLAP", overlap)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2)
    wr = 0 if causal else -1
    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=cfg)
    assert kern.calls == [] and len(kern.two.calls) == 1
    grid, args, kw = kern.two.calls[-1]
    bm, bn, stages, warps = G.gluon_bwd_tiles(D, 2)
    assert (bm, bn, warps) == (64, 128, 4) and grid == (-(-Nk // bn), B * Hkv)
    assert "WRITE_DQ" not in kw and kw["PINGPONG"] is pingpong and kw["num_warps"] == 4 and "CAUSAL" not in kw
    assert kw["OVERLAP"] is overlap
    assert (kw["HAS_LEFT"], kw["HAS_RIGHT"], kw["DOCS"]) == (False, causal, False)
    assert args[11].dtype == torch.int32 and tuple(args[-6:-4]) == (0, 0)  # Doc: a placeholder; win_left / win_right
    assert kw["SPARSE"] is False and all(a is args[11] for a in args[-4:-1]) and args[-1] == 0  # (no block table)
    assert (kw["BLOCK_M"], kw["BLOCK_N"], kw["STAGES"], kw["HEAD_D"]) == (bm, bn, stages, D)
    assert args[6] is args[8]  # no dQ buffer
    assert (dk == 1).all() and (dv == 2).all()
    ref = BW.flash_attn_bwd(do, q, k, v, out, lse, scale, -1, 0 if causal else -1, config=FlashConfig(bwd_impl="triton"))
    assert torch.equal(dq, ref[0])
    # the one-consumer launch of the same call differs in kernel, warps, the mask (CAUSAL; no Doc / window edges)
    # and the WRITE_DQ / PINGPONG constexprs
    G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=cfg.replace(gluon_bwd_consumers=1))
    grid1, args1, kw1 = kern.calls[-1]
    assert grid1 == grid and len(args1) == len(args) - 7 and kw1["WRITE_DQ"] is False and kw1["num_warps"] == 8
    assert tuple(args1[11:]) == tuple(args[12:-6]) and kw1["CAUSAL"] is causal  # strides, sizes, scales
    assert [type(a) for a in args1[:11]] == [type(a) for a in args[:11]]  # descriptors, buffers, dK, dV
    assert kw1["DQ_TMA"] is False
    assert kw["DQ_TMA"] is False
    assert {k_: v_ for k_, v_ in kw1.items() if k_ not in ("WRITE_DQ", "num_warps", "CAUSAL")} == \
        {k_: v_ for k_, v_ in kw.items() if k_ not in ("PINGPONG", "OVERLAP", "num_warps", "HAS_LEFT", "HAS_RIGHT",
                                                         "DOCS", "SPARSE")}
    for bad in (SimpleNamespace(gluon_bwd_dq="atomic", gluon_bwd_consumers=2),
                SimpleNamespace(gluon_bwd_dq="triton", gluon_bwd_consumers=3)):
        with pytest.raises(ValueError, match=rf"gluon_bwd_consumers={bad.gluon_bwd_consumers} is not supported with "
                                             rf"gluon_bwd_dq='{bad.gluon_bwd_dq}'; allowed values: \(1, 2\)"):
            G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=bad)
    assert len(kern.two.calls) == 1


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("causal", [True, False])
def test_gluon_flash_bwd_gluon_dq_dispatch(monkeypatch, causal, consumers):
    """gluon_bwd_dq="gluon": the dK / dV kernel of gluon_bwd_consumers runs without dQ (WRITE_DQ=False / the
    two-consumer kernel), then _gl_bwd_dq_kernel once over (cdiv(Nq, BLOCK_M), B * Hq) with 4-D descriptors (Q / dO
    boxes of BLOCK_M rows, K / V of BLOCK_N), the preprocess's lse2 / delta (the buffers the dK / dV kernel got), dq
    and its strides, the sizes, the bottom-right offset Nk - Nq, the GQA group and both scales; the Triton dQ kernel
    does not run."""
    B, Hq, Hkv, Nq, Nk, D = 2, 4, 2, 40, 200, 128
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=6)
    scale = D ** -0.5
    out, lse = _fwd(q, k, v, scale, causal)
    kern, descs = _fake_gluon(monkeypatch)
    monkeypatch.setattr(BW, "triton_dq", lambda *a: (_ for _ in ()).throw(AssertionError("triton_dq ran")))
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=consumers)
    dq, dk, dv = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, 0 if causal else -1, config=cfg)
    dkdv = kern.two if consumers == 2 else kern
    assert len(dkdv.calls) == 1 and len((kern if consumers == 2 else kern.two).calls) == 0
    _, dargs, dkw = dkdv.calls[0]
    assert dkw.get("WRITE_DQ", False) is False and dargs[6] is dargs[8]  # no dQ buffer
    assert (dk == 1).all() and (dv == 2).all()
    assert len(kern.dq.calls) == 1
    grid, args, kw = kern.dq.calls[0]
    bm, bn, stages, warps = G.gluon_bwd_dq_tiles(D)
    assert grid == (-(-Nq // bm), B * Hq) and (bm, warps) == (128, 4)
    assert kw == dict(HAS_LEFT=False, HAS_RIGHT=causal, DOCS=False, BLOCK_M=bm, BLOCK_N=bn, HEAD_D=D, STAGES=stages,
                      num_warps=warps, SPARSE=False)
    assert args[4] is dargs[7] and args[5] is dargs[8]  # lse2, delta: the preprocess's (B, Hq, Nq) buffers
    torch.testing.assert_close(args[4], lse * 1.4426950408889634)
    assert args[6] is dq and tuple(args[7:10]) == dq.stride()[:3]
    assert tuple(args[10:15]) == (Hq, Nq, Nk, Nk - Nq, Hq // Hkv)
    assert args[15] == pytest.approx(scale * 1.4426950408889634) and args[16] == scale
    assert tuple(args[17:19]) == (0, 0) and args[19].dtype == torch.int32  # windows (none), the Doc placeholder
    assert all(a is args[19] for a in args[20:23]) and args[23] == 0 and len(args) == 24  # (no block table)
    for i, t, rows in ((0, q, bm), (1, k, bn), (2, v, bn), (3, do, bm)):
        base, shape, strides, block, _ = descs[args[i][1]]
        assert base.data_ptr() == t.data_ptr() and shape == list(t.shape) and block == [1, 1, rows, D]
    assert (dq == 3).all()


def test_gluon_dq_non_unit_last_stride_and_tiles(monkeypatch):
    """gluon_dq writes a dq whose last stride is not 1 through a (B, N, H, D) buffer (the kernel stores rows with a
    unit last stride), copied back; the tiles: query tiles of 128 rows (two consumers of 64), key tiles of 64 or 128,
    within shared memory; other head dims refused."""
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 70, 90, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=7)
    kern, _ = _fake_gluon(monkeypatch)
    lse2, delta = torch.zeros(B, Hq, Nq), torch.zeros(B, Hq, Nq)
    dq = torch.zeros(B, Hq, D, Nq).transpose(2, 3)
    assert dq.stride(3) != 1
    G.gluon_dq(do, q, k, v, lse2, delta, dq, 0.125, -1, 0)
    _, args, _ = kern.dq.calls[0]
    assert args[6] is not dq and args[6].stride(3) == 1 and (dq == 3).all()
    for D in G.GLUON_BWD_HEAD_DIMS:
        bm, bn, stages, warps = G.gluon_bwd_dq_tiles(D)
        assert bm == 128 and warps == 4 and bn in (64, 128) and stages >= 2
        smem = 2 * (2 * bm * D + stages * 2 * bn * D)  # Q + dO once, STAGES K + V tiles (2-byte elements)
        assert smem <= 227 * 1024 - 1024, (D, smem)
    for D in (32, 96, 256):
        with pytest.raises(ValueError, match=r"D=\d+ is not supported by the Gluon backward; allowed values"):
            G.gluon_bwd_dq_tiles(D)


@pytest.mark.parametrize("Nq", [1, 2, 3, 4, 37, 40, 777])
def test_lse_tma_rows_are_16_byte_aligned(Nq):
    """TMA's innermost coordinate must be 16-byte aligned (else Hopper raises an illegal instruction: the first GPU
    run, Nq = 1): lse_tma_rows gives buffers whose row stride is Nq rounded up to a multiple of 4 fp32, each row the
    input's values then zeros, so every coordinate (b * Hq + h) * stride + start_m the producer issues is aligned;
    no copy when Nq % 4 == 0."""
    B, Hq = 2, 3
    g = torch.Generator().manual_seed(Nq)
    lse2, delta = torch.randn(B, Hq, Nq, generator=g), torch.randn(B, Hq, Nq, generator=g)
    lse_buf, delta_buf, stride = G.lse_tma_rows(lse2, delta)
    assert stride % G.LSE_TMA_ALIGN == 0 and Nq <= stride < Nq + G.LSE_TMA_ALIGN and G.LSE_TMA_ALIGN * 4 == 16
    bm = G.gluon_bwd_tiles(64)[0]
    for bh in range(B * Hq):
        for start_m in range(0, Nq, bm):
            assert ((bh * stride + start_m) * 4) % 16 == 0, (bh, start_m)
    for buf, src in ((lse_buf, lse2), (delta_buf, delta)):
        assert buf.dim() == 1 and buf.numel() == B * Hq * stride and buf.dtype == torch.float32
        rows = buf.view(B * Hq, stride)
        assert torch.equal(rows[:, :Nq], src.reshape(B * Hq, Nq))
        assert (rows[:, Nq:] == 0).all()  # finite padding (the kernel multiplies delta by P = 0 there)
        assert (buf.data_ptr() == src.data_ptr()) == (Nq % 4 == 0)  # a view when aligned, else a copy


@pytest.mark.parametrize("lse_tma", [True, False])
def test_gluon_flash_bwd_passes_aligned_lse_rows(monkeypatch, lse_tma):
    """gluon_flash_bwd with Nq % 4 != 0: with GLUON_BWD_LSE_TMA the lse2 / delta descriptors cover padded copies
    (row stride Nq rounded up to 4, passed to the kernel as lse_stride) holding the preprocess's values; without it,
    the descriptors cover the preprocess's buffers and lse_stride is Nq. The pointer arguments are the unpadded
    buffers either way (the gl.load path and the Triton dQ kernel read them)."""
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 37, 50, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=2)
    out = torch.randn_like(q)
    lse = torch.randn(B, Hq, Nq)
    kern, descs = _fake_gluon(monkeypatch)
    monkeypatch.setattr(G, "GLUON_BWD_LSE_TMA", lse_tma)
    G.gluon_flash_bwd(do, q, k, v, out, lse, D ** -0.5, -1, 0, config=FlashConfig(bwd_impl="gluon"))
    grid, args, kw = kern.calls[-1]
    assert kw["LSE_TMA"] is lse_tma
    lse2, delta, lse_stride = args[7], args[8], args[23]
    assert lse2.shape == delta.shape == (B, Hq, Nq) and lse2.is_contiguous()
    torch.testing.assert_close(lse2, lse * 1.4426950408889634)
    assert lse_stride == (40 if lse_tma else Nq) and args[19] == Nq
    for i, buf in ((4, lse2), (5, delta)):
        base, shape, strides, block, layout = descs[args[i][1]]
        assert (shape, strides, block) == ([B * Hq * lse_stride], [1], [G.gluon_bwd_tiles(D)[0]])
        assert torch.equal(base.view(B * Hq, lse_stride)[:, :Nq], buf.view(B * Hq, Nq))
        assert (base.data_ptr() == buf.data_ptr()) is (not lse_tma)


def _fwd(q, k, v, scale, causal):
    from kernels.flash import flash_attn_fwd

    return flash_attn_fwd(q, k, v, scale, -1, 0 if causal else -1)


def test_triton_dq_refuses_bad_window_edges():
    q, k, v, do = _qkv(1, 2, 2, 16, 16, 64, dtype=torch.float32, device="cpu")
    for wl, wr, name in ((-1, -2, "win_right=-2"), (-5, 0, "win_left=-5"), (1.5, 0, "win_left=1.5"),
                         (True, 0, "win_left=True")):
        with pytest.raises(ValueError, match=rf"{name}: triton_dq takes an integer >= 0, or -1"):
            BW.triton_dq(do, q, k, v, None, None, torch.empty_like(q), 0.125, wl, wr, FlashConfig())


@pytest.mark.parametrize("mask", ["window", "window_right", "documents", "window_documents"])
def test_triton_dq_band_masks_match_the_triton_backward(mask):
    """triton_dq with a window and / or the document table (interpreter): the Triton backward's dq (the same kernel,
    constexprs and launch; lse2 / delta recomputed here, so within fp32 rounding)."""
    from kernels.flash.documents import document_table

    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 40, 56, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=8)
    wl, wr = {"window": (9, 0), "window_right": (-1, 5), "documents": (-1, 0), "window_documents": (9, 0)}[mask]
    docs = None
    if "documents" in mask:
        docs = document_table(torch.tensor([[0] * 20 + [1] * 1 + [2] * 25 + [3] * 10]), Nq)
    from kernels.flash import flash_attn_fwd

    out, lse = flash_attn_fwd(q, k, v, D ** -0.5, wl, wr, documents=docs)
    ref = BW.flash_attn_bwd(do, q, k, v, out, lse, D ** -0.5, wl, wr, config=FlashConfig(bwd_impl="triton"),
                            documents=docs)
    delta = (out.float() * do.float()).sum(-1).contiguous()
    lse2 = torch.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634).contiguous()
    dq = torch.empty_like(q)
    BW.triton_dq(do, q, k, v, lse2, delta, dq, D ** -0.5, wl, wr, FlashConfig(bwd_impl="triton"), docs)
    torch.testing.assert_close(dq, ref[0], atol=1e-5, rtol=1e-5)
    assert dq.abs().max() > 0


def test_bwd_tiles_fit_shared_memory_and_refuse_other_head_dims():
    for D in G.GLUON_BWD_HEAD_DIMS:
        bm, bn, stages, warps = G.gluon_bwd_tiles(D)
        assert warps == 8 and bn == 128 and bm == 64  # the kernel's consumer layout assumes two warpgroups
        # K, V, ring of Q / dO, dS^T (2-byte elements), ring of lse2 / delta (fp32)
        smem = 2 * (2 * bn * D + stages * 2 * bm * D + bn * bm) + stages * 2 * 4 * bm
        assert smem <= 227 * 1024 - 1024, (D, smem)
        bm2, bn2, stages2, warps2 = G.gluon_bwd_tiles(D, 2)
        assert (bm2, bn2, warps2) == (64, 128, 4) and bn2 // 2 == 64  # two 1-warpgroup consumers of 64 key rows
        smem2 = 2 * (2 * bn2 * D + stages2 * 2 * bm2 * D) + stages2 * 2 * 4 * bm2  # no dS^T buffer
        assert smem2 < smem and smem2 <= 227 * 1024 - 1024, (D, smem2)
    for D in (32, 96, 256):
        with pytest.raises(ValueError, match=r"D=\d+ is not supported by the Gluon backward; allowed values"):
            G.gluon_bwd_tiles(D)
    for c in (0, 3, None):
        with pytest.raises(ValueError, match=r"consumers=.* is not supported by the Gluon backward; allowed values: "
                                             r"\(1, 2\)"):
            G.gluon_bwd_tiles(64, c)


def test_bench_flash_ours_gluon_bwd_and_tdq():
    from eval import bench_flash as bf

    assert set(bf.OURS_BWD) == {"ours_gluon_bwd", "ours_gluon_bwd_tdq", "ours_gluon_bwd_2c", "ours_gluon_dq",
                                "ours_gluon_tmadq", "ours_gluon_tmadq2", "ours_triton_bwd", "ours_triton_all"}
    assert set(bf.OURS_BWD) <= set(bf.OURS)
    cfg = bf.ours_config("ours_gluon_bwd")
    assert cfg.fwd_impl == "auto" and cfg.bwd_impl == "gluon" and cfg.gluon_bwd_dq == "atomic"
    cfg = bf.ours_config("ours_gluon_bwd_tdq")
    assert cfg.fwd_impl == "auto" and cfg.bwd_impl == "gluon" and cfg.gluon_bwd_dq == "triton"
    assert bf.ours_config("ours").bwd_impl == "auto" and bf.ours_config("ours_triton").bwd_impl == "auto"
    assert bf.ours_config("ours_triton_bwd").bwd_impl == "triton"
    cfg = bf.ours_config("ours_triton_all")
    assert cfg.fwd_impl == "triton" and cfg.bwd_impl == "triton"
    cfg = bf.ours_config("ours_gluon_dq")
    assert cfg.bwd_impl == "gluon" and cfg.gluon_bwd_dq == "gluon" and cfg.gluon_bwd_consumers == 2
    cfg = bf.ours_config("ours_gluon_tmadq")
    assert cfg.bwd_impl == "gluon" and cfg.gluon_bwd_dq == "tma" and cfg.gluon_bwd_consumers == 1
    assert bf.ours_config("ours_gluon_tmadq2").gluon_bwd_consumers == 2
    assert bf.ours_config("ours_gluon_bwd", FlashConfig(autotune=True)).autotune


# ----------------------------------------------------------------------------------------------- GPU: the kernel


@pytest.fixture(params=[True, False], ids=["lse_tma", "lse_load"])
def lse_tma(request, monkeypatch):
    """Both ways the Gluon backward reads lse2 / delta (kernels.flash.gluon.GLUON_BWD_LSE_TMA)."""
    monkeypatch.setattr(G, "GLUON_BWD_LSE_TMA", request.param)
    return request.param


def _grads(q, k, v, do, causal, cfg, lse_grad=False):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = flash_attn(*leaves, causal=causal, return_lse=True, config=cfg)
    loss = (out.float() * do.float()).sum()
    if lse_grad:
        loss = loss + lse.sin().sum()
    loss.backward()
    return [t.grad for t in leaves]


def _assert_grads_close(ours, ref, finite=False):
    """dq, dk, dv of ``ours`` within ``atol = rtol = 3e-2`` of ``ref`` (and all finite, with ``finite``)."""
    for name, a, b in zip(("dq", "dk", "dv"), ours, ref):
        if finite:
            assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2, msg=name)


def _assert_grads_near(ours, ref):
    """dq, dk, dv of ``ours`` within ``2e-2 * max|ref| + 1e-3`` of ``ref`` (long sums: an error relative to the
    largest gradient, not elementwise)."""
    for name, a, b in zip(("dq", "dk", "dv"), ours, ref):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        assert err <= 2e-2 * scale + 1e-3, (name, err, scale)


def _assert_grads_match_reference_and_triton(ours, q, k, v, do, causal):
    """dq, dk, dv of ``ours`` (the gradients of ``flash_attn(q, k, v, causal)`` against the output gradient ``do``)
    shaped, typed and strided like ``q, k, v``, finite, and within ``3 x`` plain PyTorch's max error (``+ 1e-4``) of
    the fp32 reference, and within the same bound of the Triton backward's."""
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    ref_leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = softmax_attention_reference(*ref_leaves, AttentionSpec(kind="flash", causal=causal))
    rg = torch.autograd.grad(ref, ref_leaves, do.float())
    pl_leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    pg = torch.autograd.grad(_plain_torch(*pl_leaves, causal, q.shape[-1] ** -0.5), pl_leaves, do)
    for name, a, b, r, p, x in zip(("dq", "dk", "dv"), ours, tri, rg, pg, (q, k, v)):
        assert a.shape == x.shape and a.dtype == x.dtype and a.stride() == x.stride(), name  # like the input
        assert torch.isfinite(a).all(), name
        bound = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= bound, (name, (a.float() - r).abs().max().item(), bound)
        assert (a.float() - b.float()).abs().max().item() <= bound, name


def _very_negative_lse_qkv(D):
    """CUDA bf16 ``q, k, v, do`` of ``B = 1, H = 2, N = 100`` whose head 1's first 28 query rows see only scores near
    ``-20 |u|^2`` (lse ~ -20 sqrt(D) after scaling: 2^-lse2 overflows fp32), for the ragged-tail tests."""
    q, k, v, do = _qkv(1, 2, 2, 100, 100, D, dtype=torch.float32, device="cpu", seed=3)
    u = torch.randn(D, generator=torch.Generator().manual_seed(4))
    k[:, 1, :28] = u
    q[:, 1, :28] = -20 * u
    return tuple(t.to("cuda", torch.bfloat16) for t in (q, k, v, do))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1, N not a multiple of the tiles
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk (bottom-right causal), model layout
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk: causal rows that see no key; MQA
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
    (2, 2, 1, 200, torch.float16, False),  # one query row
])
@pytest.mark.parametrize("dq", GPU_DQ)
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_grads_match_reference_and_triton(monkeypatch, lse_tma, dq, causal, D, Hq, Hkv, Nq, Nk, dtype, bnhd):
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    ran, tdq = [], []
    real, real_tdq = G.gluon_flash_bwd, BW.triton_dq
    monkeypatch.setattr(G, "gluon_flash_bwd", lambda *a, **kw: ran.append(1) or real(*a, **kw))
    monkeypatch.setattr(BW, "triton_dq", lambda *a, **kw: tdq.append(1) or real_tdq(*a, **kw))
    ours = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq=dq))
    assert ran == [1]  # the Gluon backward ran
    assert len(tdq) == (dq == "triton")  # and the Triton dQ kernel only with gluon_bwd_dq="triton"
    _assert_grads_match_reference_and_triton(ours, q, k, v, do, causal)
    if causal and Nq > Nk:  # rows that see no key: dq exactly 0
        assert ours[0][:, :, :Nq - Nk].abs().max().item() == 0


def _auto_gluon_forward_at_any_size(monkeypatch):
    """``fwd_impl="auto"`` takes the Gluon forward at these tests' small shapes (with ``tma_min_pairs=0``): its
    pair thresholds (``GLUON_AUTO_HEAD_DIMS``) at 0."""
    monkeypatch.setattr(G, "GLUON_AUTO_HEAD_DIMS", {d: 0 for d in G.GLUON_AUTO_HEAD_DIMS})


@pytest.mark.parametrize("causal", [True, False])
def test_auto_gluon_forward_at_any_size_reaches_choose_fwd_impl(monkeypatch, causal):
    """The configs of the three GPU tests that take the Gluon forward by ``fwd_impl="auto"`` at 2 x 8 heads, 777 x
    777, D 128 (``test_gpu_lse_gradient_and_gluon_forward``, ``test_gpu_two_consumers_lse_gradient_and_outputs``,
    ``test_gpu_gluon_dq_lse_gradient``): ``tma_min_pairs=0`` alone keeps the Triton forward (the D 128 entry of
    ``GLUON_AUTO_HEAD_DIMS``, 2^28, decides), and :func:`_auto_gluon_forward_at_any_size`'s table, read by
    ``choose_fwd_impl`` at call time, gives the Gluon one. Those GPU tests do not check which forward ran (a
    silent Triton forward passes them), so this is their guard; no GPU: the device checks mocked."""
    from tests.test_kernel_flash_gluon import _all_hold, _fake_qkv

    _all_hold(monkeypatch)
    qkv = _fake_qkv(B=2, Hq=8, Hkv=2, Nq=777, Nk=777, D=128)
    wr = 0 if causal else -1
    cfgs = (FlashConfig(bwd_impl="gluon", tma_min_pairs=0), _TWO.replace(fwd_impl="auto", tma_min_pairs=0),
            _GDQ.replace(fwd_impl="auto", tma_min_pairs=0))
    assert [G.choose_fwd_impl(c, *qkv, -1, wr) for c in cfgs] == ["triton"] * 3
    _auto_gluon_forward_at_any_size(monkeypatch)
    assert [G.choose_fwd_impl(c, *qkv, -1, wr) for c in cfgs] == [G.PERSISTENT_IMPL] * 3  # (AUTO_PERSISTENT)


@pytest.mark.parametrize("dq", GPU_DQ)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_lse_gradient_and_gluon_forward(monkeypatch, lse_tma, causal, dq):
    """The lse gradient path (delta - dlse in the preprocess) with the default forward ("auto": Gluon on Hopper)
    and the Gluon backward, against the Triton backward on the Triton forward."""
    _auto_gluon_forward_at_any_size(monkeypatch)
    q, k, v, do = _qkv(2, 8, 2, 777, 777, 128, bnhd=True)
    ours = _grads(q, k, v, do, causal, FlashConfig(bwd_impl="gluon", gluon_bwd_dq=dq, tma_min_pairs=0),
                  lse_grad=True)
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"), lse_grad=True)
    _assert_grads_close(ours, tri)


@pytest.mark.parametrize("dq", GPU_DQ)
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_large_causal_close_to_triton(lse_tma, dq):
    """A benchmark-sized causal D 128 problem (many query tiles per key tile: the ring wraps many times)."""
    q, k, v, do = _qkv(1, 4, 4, 8192, 8192, 128, bnhd=True)
    ours = _grads(q, k, v, do, True, FlashConfig(bwd_impl="gluon", gluon_bwd_dq=dq))
    tri = _grads(q, k, v, do, True, FlashConfig(bwd_impl="triton"))
    _assert_grads_near(ours, tri)


@pytest.mark.parametrize("dq", GPU_DQ)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_ragged_tail_next_head_with_very_negative_lse(lse_tma, dq, D):
    """Nq = 100: head 0's last query tile (rows 64..127) reads, with LSE_TMA, the next head's lse2 / delta for its
    columns past Nq. Head 1's first 28 rows are built to have lse ~ -20 sqrt(D) (every score they see is very
    negative), so 2^-lse2 would overflow fp32: the kernel must treat those columns as empty (P = 0). Gradients
    finite and close to the Triton backward's."""
    q, k, v, do = _very_negative_lse_qkv(D)
    _, lse = flash_attn(q, k, v, causal=True, return_lse=True, config=FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    assert lse[0, 1, :28].max().item() * 1.4426950408889634 < -128  # 2^-lse2 is past fp32's range
    ours = _grads(q, k, v, do, True, FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq=dq))
    tri = _grads(q, k, v, do, True, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    _assert_grads_close(ours, tri, finite=True)


@pytest.mark.parametrize("dq,consumers", [
    pytest.param(p.values[0], c, marks=p.marks, id=f"{p.values[0]}-{c}") for p in GPU_DQ for c in (1, 2)
    if not (p.values[0] == "atomic" and c == 2)])  # (the atomic dQ has one consumer only)
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_keys_past_nk_with_very_negative_lse_non_causal(dq, consumers):
    """Non-causal, Nk = 100 (the key tile's rows 100..127 are TMA's zeros: S = 0 there, P = 2^-lse2): head 1's rows
    see only scores near -20 |u|^2 (every key of head 1 is u), so 2^-lse2 overflows fp32 and, unmasked, reaches the
    fused dQ as inf * 0 = NaN. Gradients finite and close to the Triton backward's."""
    q, k, v, do = _qkv(1, 2, 2, 100, 100, 128, dtype=torch.float32, device="cpu", seed=3)
    u = torch.randn(128, generator=torch.Generator().manual_seed(4))
    k[:, 1] = u
    q[:, 1] = -20 * u
    q, k, v, do = (t.to("cuda", torch.bfloat16) for t in (q, k, v, do))
    _, lse = flash_attn(q, k, v, causal=False, return_lse=True,
                        config=FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    assert lse[0, 1].max().item() * 1.4426950408889634 < -128  # 2^-lse2 is past fp32's range
    cfg = FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq=dq, gluon_bwd_consumers=consumers)
    ours = _grads(q, k, v, do, False, cfg)
    tri = _grads(q, k, v, do, False, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    _assert_grads_close(ours, tri, finite=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Nq,Nk", [(130, 130), (257, 200)])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_rows_not_multiple_of_4(lse_tma, Nq, Nk, causal):
    """Nq % 4 != 0 with B * Hq = 9 (b, h) rows: with LSE_TMA the lse2 / delta rows reach TMA padded to a multiple of
    4 values (an unaligned innermost coordinate raised an illegal instruction on the H200); gradients close to the
    Triton backward's."""
    q, k, v, do = _qkv(3, 3, 3, Nq, Nk, 128, bnhd=True)
    ours = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="gluon"))
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    _assert_grads_close(ours, tri, finite=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_triton_dq_is_deterministic(lse_tma, causal):
    """gluon_bwd_dq="triton" (which deterministic=True allows): two backward passes give bitwise equal dq, dk, dv
    (GQA, a ragged N, many query tiles per key tile)."""
    q, k, v, do = _qkv(2, 8, 2, 3000, 3000, 128, bnhd=True)
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="triton", deterministic=True)
    first = _grads(q, k, v, do, causal, cfg)
    for _ in range(2):
        again = _grads(q, k, v, do, causal, cfg)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), name


# ------------------------------------------------------------- GPU: the two-consumer dK / dV kernel (consumers=2)


@pytest.fixture(params=[(True, False, False), (True, True, False), (False, False, False), (True, False, True),
                        (False, False, True)], ids=["tma-nopp", "tma-pp", "load-nopp", "tma-overlap", "load-overlap"])
def two_mode(request, monkeypatch):
    """The two-consumer kernel's schedules (kernels.flash.gluon.GLUON_BWD_PINGPONG off / on, GLUON_BWD_OVERLAP on
    without ping-pong) with lse2 / delta by TMA (the default), and without ping-pong by gl.load
    (GLUON_BWD_LSE_TMA=False); ``(lse_tma, pingpong)``."""
    lse_tma, pp, overlap = request.param
    monkeypatch.setattr(G, "GLUON_BWD_LSE_TMA", lse_tma)
    monkeypatch.setattr(G, "GLUON_BWD_PINGPONG", pp)
    monkeypatch.setattr(G, "GLUON_BWD_OVERLAP", overlap)
    return lse_tma, pp


_TWO = FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq="triton", gluon_bwd_consumers=2)


def _only_two_consumer_kernel(monkeypatch):
    """Make the one-consumer kernel raise, so that a passing test proves _gl_bwd_dkdv2_kernel computed dK / dV."""
    from kernels.flash import _gluon_kernels as GK

    class _Refuse:
        def __getitem__(self, grid):
            raise AssertionError("_gl_bwd_kernel ran with gluon_bwd_consumers=2")

    monkeypatch.setattr(GK, "_gl_bwd_kernel", _Refuse())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1, N not a multiple of the tiles
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk (bottom-right causal: consumer 1 skips tiles), model layout
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk: causal rows that see no key; MQA
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
    (2, 2, 1, 200, torch.float16, False),  # one query row
    (2, 2, 200, 70, torch.bfloat16, False),  # Nk in (64, 128): consumer 1's rows partly past Nk
    (2, 2, 200, 50, torch.bfloat16, False),  # Nk < 64: consumer 1's rows all past Nk
])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_two_consumers_grads_match_reference_and_triton(monkeypatch, two_mode, causal, D, Hq, Hkv, Nq,
                                                             Nk, dtype, bnhd):
    """gluon_bwd_consumers=2: dq / dk / dv against the fp32 reference (within 3x plain PyTorch's error) and the
    Triton backward, like test_gpu_grads_match_reference_and_triton."""
    _only_two_consumer_kernel(monkeypatch)
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    ran = []
    real = G.gluon_flash_bwd
    monkeypatch.setattr(G, "gluon_flash_bwd",
                        lambda *a, **kw: ran.append(kw.get("config", a[-1]).gluon_bwd_consumers) or real(*a, **kw))
    ours = _grads(q, k, v, do, causal, _TWO)
    assert ran == [2]
    _assert_grads_match_reference_and_triton(ours, q, k, v, do, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1: four query heads' tiles reduced into dQ per program
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk: a ragged last query tile (rows past Nq clipped by TMA)
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk, MQA
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
    (2, 2, 1, 200, torch.float16, False),  # one query row
    (2, 2, 200, 50, torch.bfloat16, False),  # consumer 1's keys all past Nk: it adds nothing
])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.skipif(not G.gluon_tma_reduce_ok(), reason="gluon_bwd_dq='tma' needs triton >= 3.7's Gluon TMA reduce-add")
def test_gpu_tma_dq_grads_match_reference_and_triton(monkeypatch, causal, D, Hq, Hkv, Nq, Nk, dtype, bnhd):
    """gluon_bwd_dq="tma" with one and with two consumers: dq (both consumers' parts reduce-added into one buffer),
    dk, dv against the fp32 reference and the Triton backward; no Triton or Gluon dQ kernel runs."""
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    from kernels.flash import _gluon_kernels as GK

    class _Refuse:
        def __getitem__(self, grid):
            raise AssertionError("a separate dQ kernel ran with gluon_bwd_dq='tma'")

    monkeypatch.setattr(GK, "_gl_bwd_dq_kernel", _Refuse())
    monkeypatch.setattr(BW, "triton_dq", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("triton_dq ran")))
    for consumers in (1, 2):
        cfg = FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq="tma", gluon_bwd_consumers=consumers)
        ours = _grads(q, k, v, do, causal, cfg)
        _assert_grads_match_reference_and_triton(ours, q, k, v, do, causal)
        if causal and Nq > Nk:  # rows that see no key: dq exactly 0
            assert ours[0][:, :, :Nq - Nk].abs().max().item() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_auto_bwd_runs_two_consumers_where_chosen(monkeypatch):
    """The default config (bwd_impl="auto") runs the two-consumer Gluon kernel at causal N 4096 with the Gluon dQ at
    D 128 and the Triton dQ at D 64 (gradients within 3x plain PyTorch's error of the reference and of the Triton
    backward), and the Triton backward below ``GLUON_BWD_AUTO_MIN_PAIRS``: causal N 512 at D 128 (2^17 pairs per
    head), N 1024 at D 64 (and at every N on a triton outside ``GLUON_AUTO_BWD_TRITON``)."""
    ran, dq_ran = [], []
    real, real_dq = G.gluon_flash_bwd, G.gluon_dq
    monkeypatch.setattr(G, "gluon_flash_bwd",
                        lambda *a, **kw: ran.append(kw.get("config", a[-1]).gluon_bwd_consumers) or real(*a, **kw))
    monkeypatch.setattr(G, "gluon_dq", lambda *a: dq_ran.append(a[1].shape[-1]) or real_dq(*a))
    q, k, v, do = _qkv(1, 2, 2, 4096, 4096, 128)
    ours = _grads(q, k, v, do, True, FlashConfig())
    if not G.gluon_bwd_available(128):  # a triton outside GLUON_AUTO_BWD_TRITON: "auto" keeps the Triton backward
        assert 128 not in G.GLUON_AUTO_BWD_TRITON.get(G._triton_version(), ()) and ran == [] and dq_ran == []
        _assert_grads_match_reference_and_triton(ours, q, k, v, do, True)
        return
    assert ran == [2] and dq_ran == [128]
    _assert_grads_match_reference_and_triton(ours, q, k, v, do, True)
    q, k, v, do = _qkv(1, 2, 2, 4096, 4096, 64)
    ours = _grads(q, k, v, do, True, FlashConfig())
    # D 64: the Triton dQ where this triton takes the Gluon backward at D 64 (3.6), else the Triton backward (3.9)
    assert ran == ([2, 2] if G.gluon_bwd_available(64) else [2]) and dq_ran == [128]
    _assert_grads_match_reference_and_triton(ours, q, k, v, do, True)
    before = list(ran)
    for n, d in ((512, 128), (1024, 64)):
        q, k, v, do = _qkv(1, 2, 2, n, n, d)
        _grads(q, k, v, do, True, FlashConfig())
        assert ran == before and dq_ran == [128], (n, d)  # the Triton backward (no Gluon kernel ran)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_two_consumers_lse_gradient_and_outputs(monkeypatch, two_mode, causal):
    """The lse gradient path and the outputs (out, lse equal to the one-consumer run's: the forward is shared) with
    gluon_bwd_consumers=2, against the Triton backward."""
    _only_two_consumer_kernel(monkeypatch)
    _auto_gluon_forward_at_any_size(monkeypatch)
    q, k, v, do = _qkv(2, 8, 2, 777, 777, 128, bnhd=True)
    ours = _grads(q, k, v, do, causal, _TWO.replace(fwd_impl="auto", tma_min_pairs=0), lse_grad=True)
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"), lse_grad=True)
    _assert_grads_close(ours, tri)
    o2, l2 = flash_attn(q, k, v, causal=causal, return_lse=True, config=_TWO)
    o1, l1 = flash_attn(q, k, v, causal=causal, return_lse=True, config=FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    assert torch.equal(o2, o1) and torch.equal(l2, l1)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_two_consumers_large_causal_close_to_triton(monkeypatch, two_mode):
    """A benchmark-sized causal D 128 problem (the ring wraps many times; both consumers release every slot)."""
    _only_two_consumer_kernel(monkeypatch)
    q, k, v, do = _qkv(1, 4, 4, 8192, 8192, 128, bnhd=True)
    ours = _grads(q, k, v, do, True, _TWO.replace(fwd_impl="auto"))
    tri = _grads(q, k, v, do, True, FlashConfig(bwd_impl="triton"))
    _assert_grads_near(ours, tri)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_two_consumers_ragged_tail_and_rows_not_multiple_of_4(monkeypatch, two_mode, D):
    """Nq = 100 with a next head whose lse2 would overflow 2^-lse2 (see test_gpu_ragged_tail_next_head_with_very_
    negative_lse), then Nq = 257, Nk = 200 with B * Hq = 9: finite gradients close to the Triton backward's."""
    _only_two_consumer_kernel(monkeypatch)
    q, k, v, do = _very_negative_lse_qkv(D)
    cases = [(q, k, v, do, True), (*_qkv(3, 3, 3, 257, 200, D, bnhd=True), False),
             (*_qkv(3, 3, 3, 257, 200, D, bnhd=True), True)]
    for q, k, v, do, causal in cases:
        ours = _grads(q, k, v, do, causal, _TWO)
        tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
        _assert_grads_close(ours, tri, finite=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_two_consumers_deterministic_and_equal_to_one_consumer(monkeypatch, two_mode, causal):
    """gluon_bwd_consumers=2 with deterministic=True: bitwise repeatable dq / dk / dv (GQA, ragged N), and dk / dv
    close to the one-consumer kernel's (the same sums in the same order per key row, bar the dS^T rounding path:
    registers instead of shared memory, both bf16)."""
    q, k, v, do = _qkv(2, 8, 2, 3000, 3000, 128, bnhd=True)
    one = _grads(q, k, v, do, causal, _TWO.replace(gluon_bwd_consumers=1, deterministic=True))
    _only_two_consumer_kernel(monkeypatch)
    cfg = _TWO.replace(deterministic=True)
    first = _grads(q, k, v, do, causal, cfg)
    again = _grads(q, k, v, do, causal, cfg)
    for name, a, b, c in zip(("dq", "dk", "dv"), first, again, one):
        assert torch.equal(a, b), name
        torch.testing.assert_close(a.float(), c.float(), atol=1e-2, rtol=1e-2, msg=name)
    assert torch.equal(first[0], one[0])  # dq: the same Triton dQ kernel on the same inputs


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_overlap_is_bitwise_the_plain_schedule(monkeypatch, causal, D):
    """GLUON_BWD_OVERLAP (FA3's intra-warpgroup overlap: a tile's dK runs under the next tile's exponentials) sums
    the same products in the same order as the plain schedule: dk / dv equal bit for bit (GQA 4:1, ragged N, Nq !=
    Nk), and the kernel got the OVERLAP constexpr it was asked for."""
    from kernels.flash import _gluon_kernels as GK

    real, seen = GK._gl_bwd_dkdv2_kernel, []

    class _Spy:
        def __getitem__(self, grid):
            launch = real[grid]

            def run(*args, **kw):
                seen.append(kw.get("OVERLAP"))
                return launch(*args, **kw)
            return run

    q, k, v, do = _qkv(2, 8, 2, 1000, 1500, D, bnhd=True)
    monkeypatch.setattr(G, "GLUON_BWD_OVERLAP", False)
    plain = _grads(q, k, v, do, causal, _TWO)
    monkeypatch.setattr(GK, "_gl_bwd_dkdv2_kernel", _Spy())
    monkeypatch.setattr(G, "GLUON_BWD_OVERLAP", True)
    over = _grads(q, k, v, do, causal, _TWO)
    assert seen and all(seen), seen
    for name, a, b in zip(("dq", "dk", "dv"), plain, over):
        assert torch.equal(a, b), name


def test_gluon_bwd_sweep_refuses_overlap_where_it_cannot_apply():
    """CPU: lab/gluon_bwd_sweep.py --overlap 1 needs two consumers without ping-pong; values other than 0 / 1 stop
    it before any GPU work."""
    from lab import gluon_bwd_sweep as sw

    with pytest.raises(SystemExit):
        sw.main(["--overlap", "1", "--consumers", "1", "--dq", "triton"])
    with pytest.raises(SystemExit):
        sw.main(["--overlap", "2"])


# ----------------------------------------------------------------- GPU: the Gluon dQ kernel (gluon_bwd_dq="gluon")


def _spy_gluon_dq(monkeypatch):
    """Record every launch grid of ``_gl_bwd_dq_kernel`` (the real kernel still runs) and make the Triton dQ kernel
    raise, so that a passing test proves the Gluon dQ kernel computed dq; returns the list of grids."""
    from kernels.flash import _gluon_kernels as GK

    real, grids = GK._gl_bwd_dq_kernel, []

    class _Spy:
        def __getitem__(self, grid):
            grids.append(tuple(grid))
            return real[grid]

    monkeypatch.setattr(GK, "_gl_bwd_dq_kernel", _Spy())
    monkeypatch.setattr(BW, "triton_dq", lambda *a, **kw: (_ for _ in ()).throw(
        AssertionError("the Triton dQ kernel ran with gluon_bwd_dq='gluon'")))
    return grids


_GDQ = FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2)


@pytest.mark.parametrize("consumers", [2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1, N not a multiple of the tiles
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk (bottom-right causal), model layout
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk: causal rows that see no key (consumer 0 skips); MQA
    (2, 2, 1000, 260, torch.bfloat16, False),  # causal query tile 640: consumer 0 sees no key, consumer 1 does
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
    (2, 2, 1, 200, torch.float16, False),  # one query row (consumer 1's rows all past Nq)
    (2, 2, 129, 129, torch.float16, True),  # one row in the last query tile
    (2, 2, 200, 50, torch.bfloat16, False),  # Nk below one key tile
])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_gluon_dq_grads_match_reference_and_triton(monkeypatch, consumers, causal, D, Hq, Hkv, Nq, Nk, dtype,
                                                       bnhd):
    """gluon_bwd_dq="gluon" with either dK / dV kernel: dq / dk / dv against the fp32 reference (within 3x plain
    PyTorch's error) and the Triton backward; the Gluon dQ kernel ran once over (cdiv(Nq, 128), B * Hq); causal
    rows that see no key get dq exactly 0."""
    grids = _spy_gluon_dq(monkeypatch)
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    ours = _grads(q, k, v, do, causal, _GDQ.replace(gluon_bwd_consumers=consumers))
    assert grids == [(-(-Nq // 128), 2 * Hq)]
    _assert_grads_match_reference_and_triton(ours, q, k, v, do, causal)
    if causal and Nq > Nk:
        assert ours[0][:, :, :Nq - Nk].abs().max().item() == 0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_gluon_dq_lse_gradient(monkeypatch, causal):
    """The lse gradient path (delta - dlse) with the Gluon forward and the Gluon dQ, against the Triton backward."""
    grids = _spy_gluon_dq(monkeypatch)
    _auto_gluon_forward_at_any_size(monkeypatch)
    q, k, v, do = _qkv(2, 8, 2, 777, 777, 128, bnhd=True)
    ours = _grads(q, k, v, do, causal, _GDQ.replace(fwd_impl="auto", tma_min_pairs=0), lse_grad=True)
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"), lse_grad=True)
    assert len(grids) == 1
    _assert_grads_close(ours, tri)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_gluon_dq_large_causal_close_to_triton(monkeypatch, D):
    """A benchmark-sized causal problem (the K / V rings wrap many times; heaviest query tiles first)."""
    grids = _spy_gluon_dq(monkeypatch)
    q, k, v, do = _qkv(1, 4, 4, 8192, 8192, D, bnhd=True)
    ours = _grads(q, k, v, do, True, _GDQ.replace(fwd_impl="auto"))
    tri = _grads(q, k, v, do, True, FlashConfig(bwd_impl="triton"))
    assert len(grids) == 1
    _assert_grads_near(ours, tri)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_gluon_dq_ragged_tail_and_rows_not_multiple_of_4(monkeypatch, D):
    """Nq = 100 with a next head whose lse2 would overflow 2^-lse2, then Nq = 257, Nk = 200 with B * Hq = 9: finite
    gradients close to the Triton backward's."""
    grids = _spy_gluon_dq(monkeypatch)
    q, k, v, do = _very_negative_lse_qkv(D)
    cases = [(q, k, v, do, True), (*_qkv(3, 3, 3, 257, 200, D, bnhd=True), False),
             (*_qkv(3, 3, 3, 257, 200, D, bnhd=True), True)]
    for q, k, v, do, causal in cases:
        ours = _grads(q, k, v, do, causal, _GDQ)
        tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="triton"))
        _assert_grads_close(ours, tri, finite=True)
    assert len(grids) == len(cases)


@pytest.mark.parametrize("consumers", [2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_gluon_dq_deterministic(monkeypatch, consumers, causal):
    """gluon_bwd_dq="gluon" with deterministic=True: bitwise equal dq / dk / dv across runs (GQA, ragged N); dk / dv
    bitwise equal to the Triton-dQ run's (the same dK / dV kernel) and dq close to it."""
    q, k, v, do = _qkv(2, 8, 2, 3000, 3000, 128, bnhd=True)
    cfg = _GDQ.replace(gluon_bwd_consumers=consumers, deterministic=True)
    tdq = _grads(q, k, v, do, causal, cfg.replace(gluon_bwd_dq="triton"))
    grids = _spy_gluon_dq(monkeypatch)
    first = _grads(q, k, v, do, causal, cfg)
    again = _grads(q, k, v, do, causal, cfg)
    assert len(grids) == 2
    for name, a, b in zip(("dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), name
    assert torch.equal(first[1], tdq[1]) and torch.equal(first[2], tdq[2])
    _assert_grads_near(first, tdq)


def test_gluon_bwd_sweep_refuses_unknown_modes(capsys):
    """lab/gluon_bwd_sweep.py times every (--dq, --lse) combination; unknown values stop it before any GPU work."""
    from lab import gluon_bwd_sweep as sw

    assert sw.LSE_MODES == {"tma": True, "load": False}
    for flag, bad, allowed in (("--dq", "atomic,separate", "atomic, triton, gluon"), ("--lse", "smem", "tma, load"),
                               ("--consumers", "1,3", "1, 2"), ("--pingpong", "2", "0, 1")):
        with pytest.raises(SystemExit):
            sw.main([flag, bad])
        assert f"allowed values: {allowed}" in capsys.readouterr().err
    for argv in (["--dq-block-n", "32"], ["--dq-stages", "1"]):
        with pytest.raises(SystemExit):
            sw.main(argv)
        assert "--dq-block-n: allowed values: 0, 64, 128" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^--dq-stages '-1': ring depths must be comma-separated integers >= 0"):
        sw.main(["--dq-stages", "-1"])  # a negative value: refused by eval.bench_common.int_list
    for argv in (["--dq", "atomic", "--consumers", "2"], ["--consumers", "1", "--pingpong", "1"]):
        with pytest.raises(SystemExit):  # nothing to time: refused before any GPU work
            sw.main(argv)
        assert "--consumers 2 needs --dq triton" in capsys.readouterr().err


def test_gpu_tests_isolated_parses_ids_and_classifies_faults(tmp_path):
    """lab/gpu_tests_isolated.py (one GPU test per process, so a sticky CUDA fault names its test): the ids of
    ``--collect-only -q`` output, the status of a test process from its exit code and output."""
    from lab import gpu_tests_isolated as GT

    text = ("tests/t.py::test_a[lse_tma-atomic-2-2-1-200-dtype4-False-128-True]\ntests/t.py::test_b\n"
            "tests/t.py::test_b\n\n2 tests collected in 0.5s\n")
    assert GT.parse_collected(text) == ["tests/t.py::test_a[lse_tma-atomic-2-2-1-200-dtype4-False-128-True]",
                                        "tests/t.py::test_b"]
    assert GT.classify(0, "1 passed in 3.0s") == ("PASS", "1 passed in 3.0s")
    assert GT.classify(0, "1 skipped in 0.1s")[0] == "SKIP"
    assert GT.classify(1, "E  torch.AcceleratorError: CUDA error: an illegal instruction was encountered\n"
                          "1 failed") == ("FAULT", "illegal_instruction")
    assert GT.classify(1, "E   RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered")[1] == \
        "illegal_address"
    assert GT.classify(1, "E   AssertionError: dq\n1 failed") == ("FAIL", "E   AssertionError: dq")
    assert GT.classify(124, "")[0] == "TIMEOUT" and GT.classify(4, "ERROR: not found")[0] == "ERROR"
    with pytest.raises(SystemExit):
        GT.main(["tests/t.py", "--jobs", "0", "--out", str(tmp_path)])


@pytest.mark.parametrize("mask", ["causal", "window", "gqa_documents"])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_kept_gluon_launches_match(monkeypatch, mask):
    """GLUON_KEPT_LAUNCH: the Gluon forward, dK / dV, dQ kernels and the preprocess launched through
    kernels._host.launch (the first call through Triton, the next ones through the kept launcher) give the outputs,
    lse and gradients of Triton's own launch path bit for bit, on new inputs of the same shapes each call."""
    from kernels import _host

    Hq, Hkv = (8, 2) if mask == "gqa_documents" else (4, 4)
    kw = dict(causal=True)
    if mask == "window":
        kw["window_size"] = (255, 0)
    cfg = FlashConfig(fwd_impl="gluon_ws3a", bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2)
    _host.clear_launches()
    kept_calls, real_call = [], _host.CompiledLaunch.__call__
    monkeypatch.setattr(_host.CompiledLaunch, "__call__", lambda self, *a: kept_calls.append(1) or real_call(self, *a))
    runs = {}
    for kept in (False, True):
        monkeypatch.setattr(G, "GLUON_KEPT_LAUNCH", kept)
        for seed in range(3):  # kept: seed 0 compiles and keeps, seeds 1 and 2 take the kept launchers
            q, k, v, do = _qkv(2, Hq, Hkv, 1000, 1000, 128, seed=seed, bnhd=True)
            if mask == "gqa_documents":
                ids = torch.cat([torch.zeros(300), torch.ones(500), torch.full((200,), 2)]).int()
                kw["doc_ids"] = ids.expand(2, -1).to(q.device)
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            out, lse = flash_attn(*leaves, return_lse=True, config=cfg, **kw)
            out.backward(do)
            runs[kept, seed] = [out, lse] + [t.grad for t in leaves]
    assert len(_host._FAST) == 4 and kept_calls == [1] * 8  # 4 kernels kept at seed 0, launched kept at seeds 1, 2
    for seed in range(3):
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), runs[False, seed], runs[True, seed]):
            assert torch.equal(a, b), (mask, seed, name)
    _host.clear_launches()


@pytest.mark.parametrize("causal", [True, False])
def test_gluon_flash_bwd_block_sparse_dispatch(monkeypatch, causal):
    """A block-sparse layout of whole tiles on the Gluon backward (two consumers, Gluon dQ): the dK / dV kernel runs
    with SPARSE=True over one program per key tile, given the layout's key-tile table at its tiles (64 x 128:
    layout_tables(keys=True)) and its row stride; the dQ kernel with SPARSE=True and the query-tile table at its own
    tiles; one consumer or the Triton dQ is refused by name before any launch."""
    from kernels.flash.sparse import layout_tables

    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 128, 384, 64
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device="cpu", seed=7)
    scale = D ** -0.5
    out, lse = _fwd(q, k, v, scale, causal)
    kern, _ = _fake_gluon(monkeypatch)
    lay = torch.ones(3, 3, dtype=torch.int8).tril() if causal else torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0]],
                                                                                 dtype=torch.int8)
    wr = 0 if causal else -1
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2)
    G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=cfg, layout=lay, layout_bs=128)
    (grid, args, kw), = kern.two.calls
    assert grid == (Nk // 128, B * Hkv) and kw["SPARSE"] is True
    want = layout_tables(lay, 128, Nq, Nk, -1, wr, 64, 128, keys=True)
    assert all(torch.equal(a, b) for a, b in zip(args[-4:-1], want)) and args[-1] == want[0].stride(0)
    (grid, args, kw), = kern.dq.calls
    bm, bn = G.gluon_bwd_dq_tiles(D)[:2]
    assert grid == (Nq // bm, B * Hq) and kw["SPARSE"] is True
    want = layout_tables(lay, 128, Nq, Nk, -1, wr, bm, bn)
    assert all(torch.equal(a, b) for a, b in zip(args[-4:-1], want)) and args[-1] == want[0].stride(0)
    for bad in (cfg.replace(gluon_bwd_dq="triton"), cfg.replace(gluon_bwd_consumers=1, gluon_bwd_dq="gluon")):
        with pytest.raises(ValueError, match=r"takes a block-sparse layout only with gluon_bwd_consumers=2 and "
                                             r"gluon_bwd_dq='gluon'"):
            G.gluon_flash_bwd(do, q, k, v, out, lse, scale, -1, wr, config=bad, layout=lay, layout_bs=128)
    assert len(kern.two.calls) == len(kern.dq.calls) == 1 and kern.calls == []


def test_descriptor_templates_copy_the_validated_descriptor(monkeypatch):
    """While GLUON_KEPT_LAUNCH, a repeated descriptor key (dtype, shape, strides, box, layout) copies the fields of the
    descriptor Triton validated at the key's first call with the new base tensor (same fields, same launch key; no
    tensor kept by the cache); a new key, an unaligned base or the knob off runs Triton's constructor and its
    checks."""
    import gc
    import weakref

    from kernels import _host

    try:
        _, TD, gl = G._gluon_modules()
    except ValueError as e:
        pytest.skip(f"no Gluon in this triton: {e}")
    monkeypatch.setattr(G, "_TD_TEMPLATES", {})
    built = []  # ids of the base tensors the constructor ran on
    real_init = TD.__init__
    monkeypatch.setattr(TD, "__init__", lambda self, *a, **kw: built.append(id(a[0])) or real_init(self, *a, **kw))
    t1, t2 = (torch.randn(2, 4, 256, 64, dtype=torch.bfloat16) for _ in range(2))
    d1 = G._descriptor(t1, 128, TD, gl.bfloat16)
    d2 = G._descriptor(t2, 128, TD, gl.bfloat16)
    assert built == [id(t1)] and d1.base is t1 and d2.base is t2 and type(d2) is TD
    assert (d2.shape, d2.strides, d2.block_shape, d2.layout) == (d1.shape, d1.strides, d1.block_shape, d1.layout)
    assert _host._arg_key(d1) == _host._arg_key(d2)
    gone = torch.randn(2, 4, 256, 64, dtype=torch.bfloat16)
    ref = weakref.ref(gone)
    G._descriptor(gone, 64, TD, gl.bfloat16)  # a new key (a 64-row box): validated; its fields kept, not the tensor
    assert len(built) == 2
    del gone
    gc.collect()
    assert ref() is None
    assert all(not isinstance(v, torch.Tensor) for f in G._TD_TEMPLATES.values() for v in f.values())
    half = t2[:, :, :128]
    d3 = G._descriptor(half, 128, TD, gl.bfloat16)  # another shape: a new key, validated
    assert len(built) == 3 and built[2] == id(half) and d3.shape == [2, 4, 128, 64]
    flat = torch.randn(2 * 4 * 256 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 256, 64)  # 2 bytes off: unaligned
    with pytest.raises(Exception):
        G._descriptor(flat, 128, TD, gl.bfloat16)  # Triton's own check runs (never a copy of the template)
    monkeypatch.setattr(G, "GLUON_KEPT_LAUNCH", False)
    n = len(built)
    G._descriptor(t1, 128, TD, gl.bfloat16)
    assert len(built) == n + 1  # the knob off: the constructor every call
