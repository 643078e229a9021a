"""Opt-in Gluon forward (``FlashConfig(fwd_impl="gluon" | "gluon_ws" | ... | "gluon_ws3")``, kernels/flash/gluon.py).

CPU: the setting's checks and refusals (they come before any kernel, so they run without a GPU). GPU (``-m gpu``,
Hopper, triton 3.6): out and lse of both Gluon kernels against the fp32 reference (causal / full, GQA 4:1, D 64 /
128, lengths that are not multiples of the tile, ``Nq != Nk``, both input layouts), and fwd + bwd through
``flash_attn`` against the Triton forward (the backward is the Triton one either way).

Accuracy rule (as tests/test_kernel_flash.py): max |kernel - ref| <= 2x the max error of plain PyTorch attention in
the inputs' dtype (gradients 3x), the fp32 reference as truth.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, softmax_attention_reference  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402
from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ("gluon", "gluon_ws", "gluon_ws2", "gluon_ws3a", "gluon_ws3b", "gluon_ws3")


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = [pytest.mark.gpu, pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]


def _qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.bfloat16, device=DEV, seed=0, bnhd=False):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def mk(h, n):
        if bnhd:  # the model's layout: (B, N, H, D) storage seen as (B, H, N, D)
            return torch.randn(B, n, h, D, generator=g).to(device=device, dtype=dtype).transpose(1, 2)
        return torch.randn(B, h, n, D, generator=g).to(device=device, dtype=dtype)

    return mk(Hq, Nq), mk(Hkv, Nk), mk(Hkv, Nk), mk(Hq, Nq)


# ----------------------------------------------------------------------------------------------- CPU: the setting


def test_default_forward_is_triton():
    cfg = FlashConfig()
    assert cfg.fwd_impl == "triton" and cfg.key == "{}"  # default configs (and their custom-op keys) unchanged
    assert FlashConfig.from_key(FlashConfig(fwd_impl="gluon_ws").key).fwd_impl == "gluon_ws"


def test_unknown_fwd_impl_refused():
    with pytest.raises(ValueError, match=r"fwd_impl='cuda' is not supported; allowed values: 'triton', 'gluon', "
                                         r"'gluon_ws', 'gluon_ws2', 'gluon_ws3a', 'gluon_ws3b', 'gluon_ws3'"):
        FlashConfig(fwd_impl="cuda")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["window", "window_right", "sparse", "dilation", "documents", "D32", "Dv", "fp32"])
def test_unsupported_calls_refused(impl, case):
    """Masks other than dense / causal, head dims outside {64, 128}, Dv != D and fp32 raise a ValueError naming
    fwd_impl and what it supports (before any kernel, on any device)."""
    D = 32 if case == "D32" else 64
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, D, dtype=dtype, device="cpu")
    if case == "Dv":
        v = v[..., :32]
    kw = dict(causal=True)
    if case == "window":
        kw["window_size"] = (7, 0)
    elif case == "window_right":
        kw = dict(causal=False, window_size=(None, 3))
    elif case == "dilation":
        kw.update(window_size=(8, 0), dilation=2)
    elif case == "documents":
        kw["doc_ids"] = torch.tensor([[0] * 8 + [1] * 8])
    expect = {"window": r"window \(left=7, right=0\)", "window_right": r"window \(left=-1, right=3\)",
              "sparse": "block-sparse", "dilation": "dilation=2", "documents": "doc_ids", "D32": "D=32, Dv=32",
              "Dv": "D=64, Dv=32", "fp32": "dtype torch.float32"}[case]
    if case == "sparse":  # flash_attn builds the block table first; the forward refuses the layout
        from kernels.flash.fwd import flash_attn_fwd

        with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' supports only dense or causal.*{expect}"):
            flash_attn_fwd(q, k, v, 0.125, -1, 0, layout=torch.ones(1, 1, dtype=torch.int8), layout_bs=16,
                           config=FlashConfig(fwd_impl=impl))
        return
    with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' supports only dense or causal.*got {expect}"):
        flash_attn(q, k, v, config=FlashConfig(fwd_impl=impl), **kw)


@pytest.mark.skipif(_hopper(), reason="the device refusal needs a device that is not Hopper")
def test_non_hopper_device_refused():
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 64, device=DEV)
    with pytest.raises(ValueError, match=r"fwd_impl='gluon' supports only .*Hopper.*got device"):
        flash_attn(q, k, v, causal=True, config=FlashConfig(fwd_impl="gluon"))


def test_missing_gluon_refused(monkeypatch):
    """A triton without Gluon's Hopper API (CI's version may differ): a ValueError telling to use 'triton'."""
    G._gluon_modules.cache_clear()
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon.nvidia.hopper", None)  # import raises
    try:
        with pytest.raises(ValueError, match=r"fwd_impl='gluon' / 'gluon_ws\*' needs "
                                             r"triton.experimental.gluon.*use fwd_impl='triton'"):
            G._gluon_modules()
    finally:
        G._gluon_modules.cache_clear()


def test_tile_choice_fits_shared_memory():
    """Q tile + STAGES K and V tiles (bf16) stay under the H200's 227 KiB of shared memory per block."""
    for impl in IMPLS:
        for D in G.GLUON_HEAD_DIMS:
            bm, bn, stages, warps = G.gluon_tiles(impl, D)
            assert bm == 16 * warps * (2 if impl in G.TWO_CONSUMERS else 1)
            assert (bm * D + 2 * stages * bn * D) * 2 <= 227 * 1024
            assert stages >= 2 and (stages == 3 if impl in G.WS3_FLAGS else True)


def test_ws3_variants_differ_in_one_step_each():
    """gluon_ws3a -> gluon_ws3b adds ping-pong only, gluon_ws3b -> gluon_ws3 adds conditional rescaling only, and
    each name picks the ws3 kernel with its flags (what the benchmark's A/B relies on)."""
    a, b, full = (G.WS3_FLAGS[n] for n in ("gluon_ws3a", "gluon_ws3b", "gluon_ws3"))
    assert (a["PINGPONG"], b["PINGPONG"], full["PINGPONG"]) == (False, True, True)
    assert a["RESCALE_THR"] == b["RESCALE_THR"] == 0 and full["RESCALE_THR"] > 0

    class GK:  # the kernels module stand-in: gluon_kernel only picks attributes
        _gl_fwd_kernel, _gl_fwd_ws_kernel, _gl_fwd_ws3_kernel = "plain", "ws", "ws3"

    assert G.gluon_kernel("gluon_ws3b", GK) == ("ws3", b) and G.gluon_kernel("gluon_ws3b", GK)[1] is not b
    assert G.gluon_kernel("gluon_ws2", GK) == ("ws", {"N_CONSUMERS": 2})
    assert G.gluon_kernel("gluon_ws", GK) == ("ws", {"N_CONSUMERS": 1})
    assert G.gluon_kernel("gluon", GK) == ("plain", {})


# ----------------------------------------------------------------------------------------------- GPU: the kernels


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


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv,Nq,Nk,dtype,bnhd", [
    (8, 2, 1000, 1000, torch.bfloat16, False),  # GQA 4:1, N not a multiple of the tile
    (4, 4, 300, 1000, torch.bfloat16, True),  # Nq < Nk (bottom-right causal), model layout
    (4, 1, 1000, 333, torch.float16, False),  # Nq > Nk: causal rows that see no key (out 0, lse -inf); MQA
    (2, 2, 2048, 2048, torch.bfloat16, True),  # whole tiles
])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_out_lse_match_reference(impl, causal, D, Hq, Hkv, Nq, Nk, dtype, bnhd):
    from kernels.flash.fwd import flash_attn_fwd

    q, k, v, _ = _qkv(2, Hq, Hkv, Nq, Nk, D, dtype=dtype, bnhd=bnhd)
    scale = D ** -0.5
    out, lse = flash_attn_fwd(q, k, v, scale, -1, 0 if causal else -1, config=FlashConfig(fwd_impl=impl))
    assert out.shape == (2, Hq, Nq, D) and out.dtype == dtype and lse.shape == (2, Hq, Nq)
    assert lse.dtype == torch.float32 and out.stride(1) == D  # stored (B, Nq, Hq, D), as the Triton forward
    spec = AttentionSpec(kind="flash", causal=causal)
    ref, ref_lse = softmax_attention_reference(q.float(), k.float(), v.float(), spec, return_lse=True)
    plain = _plain_torch(q, k, v, causal, scale).float()
    bound = 2 * (plain - ref).abs().max().item() + 1e-5
    err = (out.float() - ref).abs().max().item()
    assert err <= bound, (err, bound)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)  # -inf exactly on the rows that see no key
    if causal and Nq > Nk:
        assert (~finite).any() and out[~finite[..., None].expand_as(out)].abs().max() == 0
    torch.testing.assert_close(lse[finite], ref_lse[finite].float(), atol=2e-3, rtol=1e-3)
    tri, tri_lse = flash_attn_fwd(q, k, v, scale, -1, 0 if causal else -1, config=FlashConfig())
    assert (out.float() - tri.float()).abs().max().item() <= bound


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_fwd_bwd_through_flash_attn(impl, causal):
    """fwd + bwd through flash_attn with the Gluon forward: gradients (Triton backward on the Gluon out / lse)
    within 3x plain PyTorch's error of the fp32 reference, and close to the Triton-forward path's; lse
    differentiable."""
    q, k, v, do = _qkv(2, 8, 2, 777, 777, 128, bnhd=True)

    def grads(cfg):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = flash_attn(*leaves, causal=causal, return_lse=True, config=cfg)
        (out.float() * do.float()).sum().backward(retain_graph=True)
        g1 = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        lse.sin().sum().backward()
        return [out.detach()] + g1 + [t.grad for t in leaves]

    ours, tri = grads(FlashConfig(fwd_impl=impl)), grads(FlashConfig())
    ref_leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref = softmax_attention_reference(*ref_leaves, AttentionSpec(kind="flash", causal=causal))
    rg = torch.autograd.grad(ref, ref_leaves, do.float())
    pl_leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    pl = _plain_torch(*pl_leaves, causal, 128 ** -0.5)
    pg = torch.autograd.grad(pl, pl_leaves, do)
    for name, a, b, r, p in zip(("dq", "dk", "dv"), ours[1:4], tri[1:4], rg, pg):
        bound = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= bound, name
        assert (a.float() - b.float()).abs().max().item() <= bound, name
    for name, a, b in zip(("dq_lse", "dk_lse", "dv_lse"), ours[4:], tri[4:]):  # lse's gradient path
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2, msg=name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_growing_scores(impl, causal):
    """Row maxima that grow along the keys (keys scaled up with their index: ~20 log2 units over a row, per 128-key
    tile mostly under 8, on ~3% of (row, tile) over 8, up to ~22): the running-max rescale and gluon_ws3's
    conditional rescaling (both of its branches: stale max while no row of the warpgroup grew past 8, P up to
    2^8), against the fp32 reference."""
    from kernels.flash.fwd import flash_attn_fwd

    q, k, v, _ = _qkv(1, 4, 4, 1100, 1100, 128, dtype=torch.bfloat16)
    growth = torch.linspace(0.2, 6.0, 1100, device=DEV).view(1, 1, -1, 1)
    k = (k.float() * growth).to(torch.bfloat16)
    q = q.clone()
    q[:, :, ::3] *= -1
    scale = 128 ** -0.5
    out, lse = flash_attn_fwd(q, k, v, scale, -1, 0 if causal else -1, config=FlashConfig(fwd_impl=impl))
    ref, ref_lse = softmax_attention_reference(q.float(), k.float(), v.float(), AttentionSpec(kind="flash",
                                               causal=causal), return_lse=True)
    plain = _plain_torch(q, k, v, causal, scale).float()
    bound = 2 * (plain - ref).abs().max().item() + 1e-5
    err = (out.float() - ref).abs().max().item()
    assert err <= bound, (err, bound)
    torch.testing.assert_close(lse, ref_lse.float(), atol=2e-3, rtol=1e-3)
