"""Gluon backward (``FlashConfig(bwd_impl="gluon")``, kernels/flash/gluon.py ``gluon_flash_bwd``, kernel
``_gl_bwd_kernel`` in kernels/flash/_gluon_kernels.py; issue 30).

CPU: the setting's validation and refusals (deterministic mode, masks / head dims / dtypes / devices it does not
cover, refused at the forward when a backward will be needed), the dispatch of ``flash_attn_bwd`` with the kernel
mocked, the tiles, and bench_flash's ``ours_gluon_bwd``. GPU (``-m gpu``, Hopper, triton 3.6): dq / dk / dv against
the fp32 reference (within 3x plain PyTorch's error, as tests/test_kernel_flash.py) and against the Triton backward
on the same forward, causal and full, Nq == Nk and Nq != Nk (incl. causal rows that see no key), N not a multiple
of the tiles, GQA / MQA, D 64 / 128, bf16 / fp16, both input layouts, the lse gradient path.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, softmax_attention_reference  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402
from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import BWD_IMPLS  # noqa: E402
from kernels.flash import bwd as BW  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


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
    assert BWD_IMPLS == ("triton", "gluon")
    cfg = FlashConfig()
    assert cfg.bwd_impl == "triton" and cfg.key == "{}"  # the default config's custom-op key is unchanged
    g = FlashConfig(bwd_impl="gluon")
    assert g != cfg and FlashConfig.from_key(g.key) == g and hash(FlashConfig.from_key(g.key)) == hash(g)
    assert cfg.replace(bwd_impl="gluon") == g
    for bad in ("Gluon", "gluon_ws3a", "", None, 1):
        with pytest.raises(ValueError, match=r"bwd_impl=.* is not supported; allowed values: 'triton', 'gluon'$"):
            FlashConfig(bwd_impl=bad)


def test_deterministic_refuses_gluon_backward():
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton'.*bwd_impl='gluon'.*atomics"):
        FlashConfig(bwd_impl="gluon", deterministic=True)
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton'"):
        FlashConfig(deterministic=True).replace(bwd_impl="gluon")
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 64, device="cpu", requires_grad=True)
    with pytest.raises(ValueError, match=r"deterministic=True needs bwd_impl='triton'"):  # the call's argument
        flash_attn(q, k, v, causal=True, deterministic=True, config=FlashConfig(bwd_impl="gluon"))
    assert FlashConfig(bwd_impl="triton", deterministic=True).deterministic  # the Triton backward stays allowed


@pytest.mark.parametrize("case", ["window", "dilation", "head_dim", "dv", "dtype", "device"])
def test_unsupported_calls_refused_before_the_forward(case):
    """With an input that requires grad, flash_attn refuses a call the Gluon backward cannot run before any kernel
    (ValueError naming bwd_impl='gluon' and what it supports)."""
    D, Dv, dtype, kw = 64, 64, torch.bfloat16, dict(causal=True)
    expect = {"window": r"window \(left=7", "dilation": "dilation=2", "head_dim": "D=96", "dv": "D=64, Dv=128",
              "dtype": "dtype torch.float32", "device": "device cpu"}[case]
    if case == "window":
        kw = dict(causal=True, window_size=(7, 0))
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
    with pytest.raises(ValueError, match=rf"bwd_impl='gluon' supports only dense or causal.*got {expect}.*"
                                         r"use bwd_impl='triton'"):
        flash_attn(q, k, v, config=FlashConfig(bwd_impl="gluon"), **kw)


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
    """flash_attn_bwd with bwd_impl="gluon" checks the call and runs gluon_flash_bwd with the causal flag, dlse and
    the layout flag; with "triton" neither is called."""
    q, k, v, do = _qkv(1, 4, 2, 32, 48, 64, device="cpu")
    seen = []
    monkeypatch.setattr(G, "check_gluon_bwd", lambda q_, k_, v_, wl, wr, lay, dil, docs: seen.append(
        ("check", wl, wr, lay, dil, docs)) or wr == 0)
    monkeypatch.setattr(G, "gluon_flash_bwd", lambda do_, q_, k_, v_, o_, l_, scale, causal, dlse, like: seen.append(
        ("run", scale, causal, dlse, like)) or ("dq", "dk", "dv"))
    lse = torch.zeros(1, 4, 32)
    dlse = torch.ones(1, 4, 32)
    got = BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, 0, dlse=dlse, grads_like_inputs=False,
                            config=FlashConfig(bwd_impl="gluon"))
    assert got == ("dq", "dk", "dv")
    assert seen[0] == ("check", -1, 0, None, 1, None) and seen[1][:3] == ("run", 0.125, True)
    assert seen[1][3] is dlse and seen[1][4] is False
    BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, -1, config=FlashConfig(bwd_impl="gluon"))
    assert seen[3][2] is False  # dense
    n = len(seen)
    monkeypatch.setattr(BW, "_get_plan", lambda *a: (_ for _ in ()).throw(RuntimeError("triton path")))
    monkeypatch.setattr(BW, "_PLANS", {})
    with pytest.raises(RuntimeError, match="triton path"):  # the default takes the Triton path
        BW.flash_attn_bwd(do, q, k, v, do, lse, 0.125, -1, 0, config=FlashConfig())
    assert len(seen) == n


def test_bwd_tiles_fit_shared_memory_and_refuse_other_head_dims():
    for D in G.GLUON_BWD_HEAD_DIMS:
        bm, bn, stages, warps = G.gluon_bwd_tiles(D)
        assert warps == 8 and bn == 128 and bm == 64  # the kernel's consumer layout assumes two warpgroups
        smem = 2 * (2 * bn * D + stages * 2 * bm * D + bn * bm)  # K, V, ring of Q / dO, dS^T (2-byte elements)
        assert smem <= 227 * 1024 - 1024, (D, smem)
    for D in (32, 96, 256):
        with pytest.raises(ValueError, match=r"D=\d+ is not supported by the Gluon backward; allowed values"):
            G.gluon_bwd_tiles(D)


def test_bench_flash_ours_gluon_bwd():
    from eval import bench_flash as bf

    assert bf.OURS_BWD == {"ours_gluon_bwd": "gluon"}
    cfg = bf.ours_config("ours_gluon_bwd")
    assert cfg.fwd_impl == "auto" and cfg.bwd_impl == "gluon"
    assert bf.ours_config("ours").bwd_impl == "triton" and bf.ours_config("ours_triton").bwd_impl == "triton"
    assert bf.ours_config("ours_gluon_bwd", FlashConfig(autotune=True)).autotune


# ----------------------------------------------------------------------------------------------- GPU: the kernel


def _plain_torch(q, k, v, causal, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    s = (q @ k.transpose(-1, -2)) * scale
    Nq, Nk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None] + Nk - Nq
        s = s.masked_fill(torch.arange(Nk, device=q.device)[None, :] > i, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s.float(), dim=-1).to(q.dtype), nan=0.0)
    return p @ v


def _grads(q, k, v, do, causal, cfg, lse_grad=False):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = flash_attn(*leaves, causal=causal, return_lse=True, config=cfg)
    loss = (out.float() * do.float()).sum()
    if lse_grad:
        loss = loss + lse.sin().sum()
    loss.backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1, N not a multiple of the tiles
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk (bottom-right causal), model layout
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk: causal rows that see no key; MQA
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
    (2, 2, 1, 200, torch.float16, False),  # one query row
])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_grads_match_reference_and_triton(monkeypatch, causal, D, Hq, Hkv, Nq, Nk, dtype, bnhd):
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    ran = []
    real = G.gluon_flash_bwd
    monkeypatch.setattr(G, "gluon_flash_bwd", lambda *a, **kw: ran.append(1) or real(*a, **kw))
    ours = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton", bwd_impl="gluon"))
    assert ran == [1]  # the Gluon backward ran
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton"))
    ref_leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = softmax_attention_reference(*ref_leaves, AttentionSpec(kind="flash", causal=causal))
    rg = torch.autograd.grad(ref, ref_leaves, do.float())
    pl_leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    pg = torch.autograd.grad(_plain_torch(*pl_leaves, causal, D ** -0.5), pl_leaves, do)
    for name, a, b, r, p, x in zip(("dq", "dk", "dv"), ours, tri, rg, pg, (q, k, v)):
        assert a.shape == x.shape and a.dtype == x.dtype and a.stride() == x.stride(), name  # like the input
        assert torch.isfinite(a).all(), name
        bound = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= bound, (name, (a.float() - r).abs().max().item(), bound)
        assert (a.float() - b.float()).abs().max().item() <= bound, name
    if causal and Nq > Nk:  # rows that see no key: dq exactly 0
        assert ours[0][:, :, :Nq - Nk].abs().max().item() == 0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_lse_gradient_and_gluon_forward(causal):
    """The lse gradient path (delta - dlse in the preprocess) with the default forward ("auto": Gluon on Hopper)
    and the Gluon backward, against the Triton backward on the Triton forward."""
    q, k, v, do = _qkv(2, 8, 2, 777, 777, 128, bnhd=True)
    ours = _grads(q, k, v, do, causal, FlashConfig(bwd_impl="gluon", tma_min_pairs=0), lse_grad=True)
    tri = _grads(q, k, v, do, causal, FlashConfig(fwd_impl="triton"), lse_grad=True)
    for name, a, b in zip(("dq", "dk", "dv"), ours, tri):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_large_causal_close_to_triton():
    """A benchmark-sized causal D 128 problem (many query tiles per key tile: the ring wraps many times)."""
    q, k, v, do = _qkv(1, 4, 4, 8192, 8192, 128, bnhd=True)
    ours = _grads(q, k, v, do, True, FlashConfig(bwd_impl="gluon"))
    tri = _grads(q, k, v, do, True, FlashConfig())
    for name, a, b in zip(("dq", "dk", "dv"), ours, tri):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        assert err <= 2e-2 * scale + 1e-3, (name, err, scale)
