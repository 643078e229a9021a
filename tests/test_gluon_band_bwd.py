"""Band masks on the Gluon backward with two consumers (issues 27 / 30): ``FlashConfig(bwd_impl="gluon",
gluon_bwd_consumers=2)`` runs ``_gl_bwd_dkdv2_kernel`` (kernels/flash/_gluon_kernels.py) for sliding windows (left
edge, left + causal, right edge without causal) and packed documents (``doc_ids``; with and without causal, with
skipped ids and length-1 documents, boundaries inside tiles), alone and together, then the Triton dQ kernel
(``gluon_bwd_dq="triton"``, :func:`kernels.flash.bwd.triton_dq`) or the Gluon one (``"gluon"``).

GPU only (``-m gpu``, Hopper, triton 3.6): dq / dk / dv of ``flash_attn`` (Triton forward) against torch autograd of
an fp32 masked reference (within twice the Triton backward's own error plus ``5e-3 * max|grad|``), ``Nq != Nk`` both
ways, ragged N, GQA groups of 2 and 4, D 64 / 128, bf16 / fp16; keys no row sees get dk = dv = 0 exactly; a spy
checks that the Gluon dK / dV kernel with two consumers ran with the band constexprs. The CPU side (refusals with one
consumer, dispatch) is in tests/test_kernel_flash_gluon_bwd.py.
"""

import inspect

import pytest
import torch

from kernels import FlashConfig, flash_attn
from kernels.flash import gluon as G


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]


def _doc_ids(B: int, Nk: int, lengths, seed: int) -> torch.Tensor:
    """int64 ``(B, Nk)`` nondecreasing document ids: runs of the given lengths (cycled, rotated per batch row), ids
    stepping by 1 or 2 (a skipped id is an empty document)."""
    rows = []
    for b in range(B):
        ids, d, i = [], 0, (seed + b) % len(lengths)
        while len(ids) < Nk:
            ids += [d] * lengths[i % len(lengths)]
            d += 1 + (i % 3 == 0)
            i += 1
        rows.append(ids[:Nk])
    return torch.tensor(rows, dtype=torch.long)


def _allowed(Nq: int, Nk: int, wl: int, wr: int, doc_ids, device) -> torch.Tensor:
    """bool ``(B or 1, Nq, Nk)``: the band mask, bottom-right aligned (query row i at key position i + Nk - Nq)."""
    i = torch.arange(Nq, device=device)[:, None] + (Nk - Nq)
    j = torch.arange(Nk, device=device)[None, :]
    ok = torch.ones(Nq, Nk, dtype=torch.bool, device=device)
    if wr >= 0:
        ok &= j <= i + wr
    if wl >= 0:
        ok &= j >= i - wl
    ok = ok[None]
    if doc_ids is not None:
        d = doc_ids.to(device)
        pos = i[:, 0]
        dq = torch.where(pos[None] >= 0, d[:, pos.clamp(min=0)], torch.full_like(d[:, :1], -1).expand(-1, Nq))
        ok = ok & (dq[:, :, None] == d[:, None, :])
    return ok


def _reference_grads(q, k, v, do, allowed, scale):
    """fp32 autograd of masked softmax attention; rows that see no key give 0 (as the kernels do)."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    qf, kf, vf = leaves
    rep = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    m = allowed[:, None]
    any_row = m.any(-1, keepdim=True)
    s = torch.where(m, s, float("-inf"))
    s = torch.where(any_row, s, 0.0)
    p = torch.where(any_row, torch.softmax(s, -1), 0.0)
    out = p @ vf
    return torch.autograd.grad(out, leaves, do.float())


def _grads(q, k, v, do, cfg, mask_kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attn(*leaves, config=cfg, **mask_kw)
    out.backward(do)
    return [t.grad for t in leaves]


def _spy(monkeypatch):
    """Record the constexprs of every _gl_bwd_dkdv2_kernel launch (the real kernel still runs)."""
    GK = G._gluon_modules()[0]
    real, seen = GK._gl_bwd_dkdv2_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append({k_: kw[k_] for k_ in ("HAS_LEFT", "HAS_RIGHT", "DOCS")})
                return real[grid](*a, **kw)
            return launch

    monkeypatch.setattr(GK, "_gl_bwd_dkdv2_kernel", Spy())
    return seen


# name: (B, Hq, Hkv, Nq, Nk, causal, window_size, doc lengths or None)
CASES = {
    "left": (2, 4, 4, 1000, 1000, False, (200, None), None),
    "left_causal": (2, 4, 2, 1000, 1000, True, (200, 0), None),
    "left_causal_small": (1, 4, 4, 777, 777, True, (5, 0), None),
    "left_causal_tile": (1, 2, 2, 1024, 1024, True, (128, 0), None),
    "right_only": (2, 4, 4, 700, 700, False, (None, 100), None),
    "left_right": (1, 4, 1, 900, 900, False, (64, 31), None),
    "left_causal_nq_lt_nk": (2, 4, 2, 300, 1000, True, (150, 0), None),
    "left_causal_nq_gt_nk": (2, 4, 4, 1000, 333, True, (100, 0), None),
    "right_only_nq_gt_nk": (1, 4, 4, 600, 250, False, (None, 40), None),
    "docs_causal": (2, 4, 4, 1000, 1000, True, None, [1, 70, 3, 200, 1, 64, 129, 300]),
    "docs_full": (2, 4, 2, 1000, 1000, False, None, [1, 70, 3, 200, 1, 64, 129, 300]),
    "docs_long": (1, 2, 2, 2048, 2048, True, None, [1024, 512, 1, 511]),
    "docs_causal_nq_lt_nk": (2, 4, 4, 300, 1000, True, None, [90, 1, 250, 17]),
    "docs_full_nq_gt_nk": (2, 4, 4, 1000, 333, False, None, [90, 1, 50, 17]),
    "docs_window": (2, 4, 2, 1000, 1000, True, (100, 0), [1, 70, 3, 200, 1, 64, 129, 300]),
    "docs_window_full": (1, 4, 4, 1000, 1000, False, (100, 50), [1, 300, 1, 2, 400]),
    "docs_gqa4": (1, 8, 2, 900, 900, True, None, [128, 64, 1, 200]),
}


def _mask_kw(B, Nk, causal, window, lengths, seed):
    kw = dict(causal=causal)
    if window is not None:
        kw["window_size"] = window
    if lengths is not None:
        kw["doc_ids"] = _doc_ids(B, Nk, lengths, seed).cuda()
    return kw


def _check(monkeypatch, name, D, dtype, dq="triton"):
    B, Hq, Hkv, Nq, Nk, causal, window, lengths = CASES[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)) * 7 + D)
    q, k, v, do = (torch.randn(B, h, n, D, generator=g).to("cuda", dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    kw = _mask_kw(B, Nk, causal, window, lengths, D)
    seen = _spy(monkeypatch)
    cfg = FlashConfig(fwd_impl="triton", bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq=dq)
    ours = _grads(q, k, v, do, cfg, kw)
    wl, wr = (-1 if window is None or window[0] is None else window[0],
              0 if causal else (-1 if window is None or window[1] is None else window[1]))
    assert seen == [dict(HAS_LEFT=wl >= 0, HAS_RIGHT=wr >= 0, DOCS=lengths is not None)]
    tri = _grads(q, k, v, do, FlashConfig(fwd_impl="triton", bwd_impl="triton"), kw)
    allowed = _allowed(Nq, Nk, wl, wr, kw.get("doc_ids"), "cuda")
    ref = _reference_grads(q, k, v, do, allowed, D ** -0.5)
    for gname, a, t, r, x in zip(("dq", "dk", "dv"), ours, tri, ref, (q, k, v)):
        assert a.shape == x.shape and a.dtype == x.dtype and torch.isfinite(a).all(), gname
        scale = r.abs().max().item()
        err, err_tri = (a.float() - r).abs().max().item(), (t.float() - r).abs().max().item()
        assert err <= 2 * err_tri + 5e-3 * scale + 1e-4, (gname, err, err_tri, scale)
    seen_keys = allowed.any(1)  # (B or 1, Nk): keys some query row sees
    unseen = ~seen_keys.expand(B, Nk)
    if unseen.any():  # nobody's keys: exactly zero gradients
        for a in ours[1:]:
            assert a.permute(0, 2, 1, 3)[unseen].abs().max().item() == 0
    return ours


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["left_causal", "right_only", "docs_causal", "docs_window"])
def test_gpu_band_grads_dtypes_and_head_dims(monkeypatch, name, D, dtype):
    _check(monkeypatch, name, D, dtype)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", [n for n in CASES if n not in ("left_causal", "right_only", "docs_causal",
                                                                   "docs_window")])
def test_gpu_band_grads_shapes(monkeypatch, name, D):
    _check(monkeypatch, name, D, torch.bfloat16)


def _gluon_dq_takes_bands() -> bool:
    return "win_left" in inspect.signature(G.gluon_dq).parameters


@pytest.mark.parametrize("name", ["left_causal", "docs_full", "docs_window", "left_causal_nq_gt_nk"])
@pytest.mark.skipif(not _gluon_dq_takes_bands(), reason="gluon_dq without band masks (the other half of issue 27)")
def test_gpu_band_grads_with_gluon_dq(monkeypatch, name):
    _check(monkeypatch, name, 128, torch.bfloat16, dq="gluon")


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["left_causal", "right_only", "docs_full", "docs_window", "left_causal_nq_gt_nk"])
@pytest.mark.skipif(not G.gluon_tma_reduce_ok(), reason="gluon_bwd_dq='tma' needs triton >= 3.7's Gluon TMA reduce-add")
def test_gpu_band_grads_with_tma_dq(monkeypatch, name, D):
    """The two-consumer kernel's dQ by TMA reduce-add (gluon_bwd_dq="tma") on windows and documents."""
    _check(monkeypatch, name, D, torch.bfloat16, dq="tma")


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["left_causal", "right_only", "docs_full", "docs_window", "left_causal_nq_gt_nk"])
def test_gpu_band_grads_with_overlap(monkeypatch, name, D):
    """The two-consumer kernel with FA3's intra-warpgroup overlap (GLUON_BWD_OVERLAP) on windows and documents:
    consumers that skip tiles before / after their band, and tiles of several heads (GQA)."""
    monkeypatch.setattr(G, "GLUON_BWD_OVERLAP", True)
    _check(monkeypatch, name, D, torch.bfloat16)


@pytest.mark.parametrize("name", ["left_causal", "docs_window"])
def test_gpu_gluon_flash_bwd_direct_matches_triton_bwd(name):
    """gluon_flash_bwd called directly (win_left / win_right / documents) against flash_attn_bwd's Triton path on
    the same forward: dk / dv / dq close, and bitwise repeatable (no atomics)."""
    from kernels.flash import flash_attn_bwd, flash_attn_fwd
    from kernels.flash.documents import document_table

    B, Hq, Hkv, Nq, Nk, causal, window, lengths = CASES[name]
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(B, h, n, 128, generator=g).to("cuda", torch.bfloat16)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    wl, wr = window[0], 0
    docs = document_table(_doc_ids(B, Nk, lengths, 0).cuda(), Nq) if lengths else None
    scale = 128 ** -0.5
    out, lse = flash_attn_fwd(q, k, v, scale, wl, wr, documents=docs, config=FlashConfig(fwd_impl="triton"))
    cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="triton")
    a = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, wl, wr, config=cfg, documents=docs)
    b = G.gluon_flash_bwd(do, q, k, v, out, lse, scale, wl, wr, config=cfg, documents=docs)
    t = flash_attn_bwd(do, q, k, v, out, lse, scale, wl, wr, config=FlashConfig(bwd_impl="triton"), documents=docs)
    for x, y, z in zip(a, b, t):
        assert torch.equal(x, y)
        err = (x.float() - z.float()).abs().max().item()
        assert err <= 2e-2 * z.float().abs().max().item() + 1e-3, err
