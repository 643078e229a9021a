"""Gluon forward (``FlashConfig(fwd_impl="gluon_ws3a" | "gluon_ws3b")``, kernels/flash/gluon.py) and the default
``fwd_impl="auto"``, which picks gluon_ws3a or the Triton forward per call (``kernels.flash.resolve_fwd_impl``).

CPU: the setting's checks and refusals (they come before any kernel, so they run without a GPU), and the "auto"
choice with the device / Gluon checks mocked. GPU (``-m gpu``, Hopper, triton 3.6): out and lse of both Gluon
variants against the fp32 reference (causal / full, GQA 4:1, D 64 / 128, lengths that are not multiples of the
tile, ``Nq != Nk``, both input layouts), fwd + bwd through ``flash_attn`` against the Triton forward (the backward
is the Triton one either way), and the default config running gluon_ws3a on a large causal D 128 problem.

Accuracy rule (as tests/test_kernel_flash.py): max |kernel - ref| <= 2x the max error of plain PyTorch attention in
the inputs' dtype (gradients 3x), the fp32 reference as truth.
"""

import os
import sys
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, softmax_attention_reference  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402
from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import FWD_IMPLS, resolve_bwd_impl, resolve_fwd_impl, visited_pairs  # noqa: E402
from kernels.flash import fwd as F  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ("gluon_ws3a", "gluon_ws3b", "gluon_ws3p")
WS3 = ("gluon_ws3a", "gluon_ws3b")  # the one-tile-per-program kernel (block-sparse tables too)
REMOVED = ("gluon", "gluon_ws", "gluon_ws2", "gluon_ws3")  # dominated on the H200 (issue 30), refused by name


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


def test_default_forward_is_auto_and_keys_round_trip():
    cfg = FlashConfig()
    assert cfg.fwd_impl == "auto" and cfg.key == "{}"  # default configs (and their custom-op keys) unchanged
    assert FWD_IMPLS == ("auto", "triton") + IMPLS
    for impl in FWD_IMPLS:
        c = FlashConfig(fwd_impl=impl, dq_mode="atomic")
        back = FlashConfig.from_key(c.key)
        assert back == c and back.fwd_impl == impl and hash(back) == hash(c)
        assert (impl in c.key) == (impl != "auto")  # only non-default values are in the key
    assert FlashConfig(fwd_impl="triton") != cfg  # an explicit "triton" is its own config (it forces Triton)


@pytest.mark.parametrize("impl", ("cuda", "Auto") + REMOVED)
def test_unknown_and_removed_fwd_impl_refused(impl):
    with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' is not supported; allowed values: 'auto', 'triton', "
                                         r"'gluon_ws3a', 'gluon_ws3b', 'gluon_ws3p'$"):
        FlashConfig(fwd_impl=impl)


ALLOWED_MASKS = (r"supports only dense, causal, sliding-window and document masks, and block-sparse layouts of whole "
                 r"128 x 128 tiles \(no dilation\)")
PERSISTENT_MASKS = (r"supports only dense, causal, sliding-window and document masks \(no block-sparse layout or "
                    r"dilation\)")


def _allowed(impl: str) -> str:
    """The masks the refusal of ``fwd_impl=impl`` names (the persistent forward takes no block-sparse table)."""
    return PERSISTENT_MASKS if impl == G.PERSISTENT_IMPL else ALLOWED_MASKS


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["sparse", "dilation", "D32", "Dv", "fp32"])
def test_unsupported_calls_refused(impl, case):
    """A block-sparse layout, dilation, head dims outside {64, 128}, Dv != D and fp32 raise a ValueError naming
    fwd_impl and what it supports (before any kernel, on any device)."""
    D = 32 if case == "D32" else 64
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, D, dtype=dtype, device="cpu")
    if case == "Dv":
        v = v[..., :32]
    kw = dict(causal=True)
    if case == "dilation":
        kw.update(window_size=(8, 0), dilation=2)
    expect = {"sparse": "block-sparse", "dilation": "dilation=2", "D32": "D=32, Dv=32", "Dv": "D=64, Dv=32",
              "fp32": "dtype torch.float32"}[case]
    if case == "sparse" and impl == G.PERSISTENT_IMPL:  # no block-sparse table at all
        with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' takes no block-sparse layout \(band masks and "
                                             r"doc_ids only\); use fwd_impl='gluon_ws3a' or 'triton'"):
            F.flash_attn_fwd(q, k, v, 0.125, -1, 0, layout=torch.ones(1, 1, dtype=torch.int8), layout_bs=128,
                             config=FlashConfig(fwd_impl=impl))
        return
    if case == "sparse":  # flash_attn builds the block table first; the forward refuses a layout of 16-token blocks
        with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' takes a block-sparse layout only when every 128 x "
                                             rf"128 tile lies inside one layout block.*got block_size=16"):
            F.flash_attn_fwd(q, k, v, 0.125, -1, 0, layout=torch.ones(1, 1, dtype=torch.int8), layout_bs=16,
                             config=FlashConfig(fwd_impl=impl))
        return
    with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' {_allowed(impl)}.*got {expect}"):
        flash_attn(q, k, v, config=FlashConfig(fwd_impl=impl), **kw)


BAND_CASES = {"window": dict(causal=True, window_size=(7, 0)), "window_right": dict(window_size=(None, 3)),
              "window_both": dict(window_size=(5, 3)), "documents": dict(causal=True, doc_ids="two"),
              "documents_full": dict(doc_ids="two"), "window_documents": dict(window_size=(4, 0), doc_ids="two")}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(BAND_CASES))
def test_band_masks_pass_the_mask_check(monkeypatch, impl, case):
    """Sliding windows and documents pass check_gluon_fwd (the Gluon forward takes band masks): on a CPU tensor the
    only refusal left is the device; with the device and Gluon checks stubbed as on a Hopper GPU, the check passes
    and reports causality (win_right == 0)."""
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 64, device="cpu")
    kw = dict(BAND_CASES[case])
    if kw.get("doc_ids") == "two":
        kw["doc_ids"] = torch.tensor([[0] * 8 + [1] * 8])
    with pytest.raises(ValueError, match=rf"fwd_impl='{impl}' {_allowed(impl)}.*got device cpu"):
        flash_attn(q, k, v, config=FlashConfig(fwd_impl=impl), **kw)
    from kernels.flash.api import _window_bounds
    from kernels.flash.documents import document_table

    wl, wr = _window_bounds(kw.get("causal", False), kw.get("window_size"))
    docs = document_table(kw["doc_ids"], 16) if "doc_ids" in kw else None
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    assert G.check_gluon_fwd(impl, q, k, v, wl, wr, None, 1, docs) is (wr == 0)
    for bad in (dict(layout=torch.ones(1, 1, dtype=torch.int8)), dict(dilation=2)):  # still refused
        with pytest.raises(ValueError, match=rf"{_allowed(impl)}|takes a block-sparse layout only when|takes no "
                                             r"block-sparse layout"):
            G.check_gluon_fwd(impl, q, k, v, wl, wr, bad.get("layout"), bad.get("dilation", 1), docs)


SPARSE_CASES = {  # (spec fields, Nq, Nk): layouts of whole 128 x 128 tiles
    "bigbird_causal": (dict(causal=True, sparse_pattern="bigbird", block_size=128, num_random_blocks=2), 1000, 1000),
    "bigbird_full": (dict(causal=False, sparse_pattern="bigbird", block_size=256, num_random_blocks=1), 1100, 1100),
    "strided_causal_nq_lt_nk": (dict(causal=True, sparse_pattern="strided", block_size=128, stride_blocks=3), 384,
                                1280),
    "strided_full_nq_gt_nk": (dict(causal=False, sparse_pattern="strided", block_size=128, stride_blocks=2), 1280,
                              1024),
}  # (AttentionSpec's causal defaults to True: the "_full" cases say causal=False)


def _sparse_mask(case):
    from attn_zoo.masks import mask_info

    fields, Nq, Nk = SPARSE_CASES[case]
    spec = AttentionSpec(kind="sparse", **fields)
    return spec, mask_info(spec, Nq, Nk), Nq, Nk


def test_sparse_cases_are_what_they_are_named():
    """The GPU tests' block-sparse cases (test_gpu_block_sparse_forward / _gluon_backward) cover the masks their
    names say: "_causal" ones causal, "_full" ones not (the Gluon kernels' SPARSE paths without HAS_RIGHT: no element
    rule at all in the dK / dV kernel's partial tiles, only the ragged end in the forward and dQ), "nq_lt_nk" /
    "nq_gt_nk" the lengths; and a non-causal layout still skips tiles."""
    for case in SPARSE_CASES:
        spec, mi, Nq, Nk = _sparse_mask(case)
        assert mi.causal is ("_causal" in case) and mi.causal is not ("_full" in case), case
        assert mi.window_left is None and mi.window_right is None, case
        assert (Nq < Nk) is ("nq_lt_nk" in case) and (Nq > Nk) is ("nq_gt_nk" in case), case
        assert not bool(mi.layout.all()), case


@pytest.mark.parametrize("tiles,keys", [((128, 128), False), ((128, 64), False), ((64, 128), True)])
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_layout_tables_match_mask_info(case, tiles, keys):
    """The Gluon kernels' own block tables (kernels.flash.sparse.layout_tables, read from the layout at their tiles:
    the forward's 128 x 128, the dQ kernel's 128 x 64 at D 128, the dK / dV kernel's key-tile table at 64 x 128)
    visit exactly the tiles MaskInfo.block_table visits, with the same full tiles, per row (rows in schedule order:
    heaviest first, column 0 the row's own tile, full tiles first); empty rows have count 0."""
    from kernels.flash.sparse import layout_tables

    spec, mi, Nq, Nk = _sparse_mask(case)
    wr = 0 if mi.causal else -1
    idx, cnt, nfull = layout_tables(mi.layout, mi.block_size, Nq, Nk, -1, wr, *tiles, keys=keys)
    want = mi.block_table(*tiles)
    visited, full = want[3], want[4] & want[3]
    if keys:  # one row per key tile
        visited, full = visited.t(), full.t()
    assert idx.dtype == cnt.dtype == nfull.dtype == torch.int32 and idx.shape[0] == visited.shape[0]
    assert sorted(idx[:, 0].tolist()) == list(range(visited.shape[0]))  # every query tile once
    assert cnt.tolist() == sorted(cnt.tolist(), reverse=True)  # heaviest first
    for r in range(idx.shape[0]):
        qt, c, f = int(idx[r, 0]), int(cnt[r]), int(nfull[r])
        tiles = idx[r, 1:1 + c].tolist()
        assert set(tiles) == set(torch.nonzero(visited[qt]).flatten().tolist()), (case, qt)
        assert set(tiles[:f]) == set(torch.nonzero(full[qt]).flatten().tolist()), (case, qt)
    assert int(cnt.sum()) == int(visited.sum()) > 0 and (cnt < visited.shape[1]).any()  # sparse: some tiles skipped


def _brute_mask(lay, bs, Nq, Nk, wl, wr):
    """The element rule written out (not MaskInfo's code): query ``i`` at absolute position ``i + Nk - Nq`` sees key
    ``j`` iff its position is >= 0, the layout block (query / key positions past the layout in its last block) is on
    and the band holds (``wr`` / ``wl`` < 0: no such edge)."""
    nb = lay.shape[0]
    a = torch.arange(Nq).view(-1, 1) + (Nk - Nq)  # absolute query positions
    j = torch.arange(Nk).view(1, -1)
    on = lay.bool()[torch.clamp(a.clamp(min=0) // bs, max=nb - 1), torch.clamp(j // bs, max=nb - 1)]
    return (a >= 0) & on & ((j <= a + wr) if wr >= 0 else True) & ((j >= a - wl) if wl >= 0 else True)


def _check_layout_tables(lay, bs, Nq, Nk, wl, wr, bm, bn, keys):
    """layout_tables against the element mask: every (query tile, key tile) pair with an allowed element listed
    exactly once in its row (no pair without one), the full ones first and really full (every element of a whole
    tile allowed), and what the kernels compute from the table (full tiles: every element; the others: the band's
    element rule inside the sequence) is the mask itself."""
    from kernels.flash.sparse import layout_tables

    want = _brute_mask(lay, bs, Nq, Nk, wl, wr)
    i = torch.arange(Nq).view(-1, 1)
    j = torch.arange(Nk).view(1, -1)
    band = torch.ones(Nq, Nk, dtype=torch.bool)
    if wr >= 0:
        band &= j <= i + Nk - Nq + wr
    if wl >= 0:
        band &= j >= i + Nk - Nq - wl
    nq, nk = -(-Nq // bm), -(-Nk // bn)
    pad = torch.zeros(nq * bm, nk * bn, dtype=torch.bool)
    pad[:Nq, :Nk] = want
    seen = pad.view(nq, bm, nk, bn).any(3).any(1)  # (query tile, key tile) pairs with an allowed element
    pad[:Nq, :Nk] = ~want
    whole = torch.zeros(nq, nk, dtype=torch.bool)
    whole[:Nq // bm, :Nk // bn] = True
    all_on = whole & ~pad.view(nq, bm, nk, bn).any(3).any(1)  # whole tiles with every element allowed
    idx, cnt, nfull = layout_tables(lay, bs, Nq, Nk, wl, wr, bm, bn, keys=keys)
    rows = nk if keys else nq
    assert idx.dtype == cnt.dtype == nfull.dtype == torch.int32 and cnt.shape == nfull.shape == (rows,)
    assert idx.shape == (rows, 1 + max(int(cnt.max()), 1)) and idx.is_contiguous()
    assert sorted(idx[:, 0].tolist()) == list(range(rows)) and cnt.tolist() == sorted(cnt.tolist(), reverse=True)
    listed = torch.zeros(nq, nk, dtype=torch.int64)  # times each pair is listed
    full = torch.zeros(nq, nk, dtype=torch.bool)
    for r in range(rows):
        own, c, f = int(idx[r, 0]), int(cnt[r]), int(nfull[r])
        assert 0 <= f <= c and (idx[r, 1 + c:] == 0).all()
        row = idx[r, 1:1 + c].tolist()
        assert row[:f] == sorted(row[:f]) and row[f:] == sorted(row[f:])
        for pos, other in enumerate(row):
            qt, kt = (other, own) if keys else (own, other)
            listed[qt, kt] += 1
            full[qt, kt] |= pos < f
    assert torch.equal(listed, seen.long())  # every pair with an allowed element exactly once, no other pair
    assert not (full & ~all_on).any()  # full: a whole tile whose every element is allowed (no element rule)
    # what the kernels compute: every element of a full tile, the band's element rule (inside the sequence) elsewhere
    up = lambda m: m.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:Nq, :Nk]  # noqa: E731
    i = torch.arange(Nq).view(-1, 1) + (Nk - Nq)
    j = torch.arange(Nk).view(1, -1)
    band = ((j <= i + wr) if wr >= 0 else True) & ((j >= i - wl) if wl >= 0 else True)
    assert torch.equal(up(full) | (up(listed > 0) & band), want)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("tiles", [(128, 128), (128, 64), (64, 128)])
def test_layout_tables_brute_force_edges(tiles, keys):
    """Hand-picked edges: rows / columns of the layout with no block on (query / key tiles visiting nothing), a
    last layout block the sequence fills partly, a layout shorter than the sequence (positions past it in its last
    block), ragged Nq / Nk, Nq < Nk and Nq > Nk (rows at negative positions), causal, windows of either edge, 384-token
    blocks."""
    bm, bn = tiles
    lay = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.int8)
    for bs, Nq, Nk in ((128, 512, 512), (128, 448, 448), (128, 300, 300 + bm), (256, 1000 - bm, 1000),
                       (256, 700 + 2 * bm, 700), (384, 1100, 1100), (128, 900, 900), (256, 130, 130 + 3 * bm)):
        for wl, wr in ((-1, -1), (-1, 0), (100, 0), (-1, 200), (bm, -1), (0, 0), (200, 50)):
            _check_layout_tables(lay, bs, Nq, Nk, wl, wr, bm, bn, keys)


@pytest.mark.parametrize("seed", range(3))
def test_layout_tables_brute_force_random(seed):
    """Random layouts (empty to full, lower-triangular or not, shorter / longer than the sequence), block sizes 128 /
    256 / 384, every kernel tile, both tables, Nk - Nq any multiple of the query tile, ragged lengths, windows."""
    from kernels.flash.sparse import tiles_whole

    g = torch.Generator().manual_seed(seed)
    rnd = lambda n: int(torch.randint(n, (1,), generator=g))  # noqa: E731
    done = 0
    while done < 12:
        bs = (128, 256, 384)[rnd(3)]
        bm, bn = ((128, 128), (128, 64), (64, 128))[rnd(3)]
        Nk = 1 + rnd(700) if rnd(2) else 128 * (1 + rnd(5))
        Nq = Nk + bm * (rnd(7) - 3)
        if Nq <= 0 or not tiles_whole(bs, Nq, Nk, bm, bn):
            continue
        nb = max(1, -(-max(Nq, Nk) // bs) + rnd(3) - 1)
        lay = torch.rand(nb, nb, generator=g) < (0.0, 0.3, 0.7, 1.0)[rnd(4)]
        if rnd(2):
            lay = lay.tril()
        wl, wr = (-1, -1, 0, 64, 257)[rnd(5)], (-1, 0, 0, 1, 130)[rnd(5)]
        _check_layout_tables(lay, bs, Nq, Nk, wl, wr, bm, bn, bool(rnd(2)))
        done += 1


def test_layout_tables_refuse_tiles_across_blocks():
    from kernels.flash.sparse import layout_tables, tiles_whole

    lay = torch.ones(8, 8, dtype=torch.bool)
    assert tiles_whole(128, 1024, 1024, 128, 128) and tiles_whole(256, 896, 1024, 128, 128)
    assert not tiles_whole(64, 1024, 1024, 128, 128) and not tiles_whole(128, 1000, 1024, 128, 128)
    with pytest.raises(ValueError, match=r"block_size=64 a multiple of 128 and 128"):
        layout_tables(lay, 64, 512, 512, -1, 0, 128, 128)
    with pytest.raises(ValueError, match=r"Nk - Nq = 24 a multiple of 128"):
        layout_tables(lay, 128, 1000, 1024, -1, 0, 128, 128)


def test_whole_tile_layouts_pass_the_gluon_backward_check(monkeypatch):
    """bwd_impl="gluon" takes a layout of whole 128 x 128 tiles with two consumers and the Gluon or TMA dQ only; one
    consumer, the Triton / atomic dQ, 64-token blocks, an unaligned Nk - Nq and documents are refused by name."""
    q, k, v, _ = _qkv(1, 2, 2, 256, 256, 64, device="cpu")
    lay = torch.ones(2, 2, dtype=torch.int8)
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    ok = FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq="gluon")
    assert G.check_gluon_bwd(q, k, v, -1, 0, lay, 1, None, ok, 128) is True
    monkeypatch.setattr(G, "gluon_tma_reduce_ok", lambda: True)
    assert G.check_gluon_bwd(q, k, v, -1, 0, lay, 1, None, ok.replace(gluon_bwd_dq="tma"), 128) is True
    for cfg, got in ((ok.replace(gluon_bwd_dq="triton"), "gluon_bwd_consumers=2, gluon_bwd_dq='triton'"),
                     (FlashConfig(bwd_impl="gluon", gluon_bwd_dq="tma"), "gluon_bwd_consumers=1, gluon_bwd_dq='tma'"),
                     (FlashConfig(bwd_impl="gluon"), "gluon_bwd_consumers=1, gluon_bwd_dq='atomic'")):
        with pytest.raises(ValueError, match=rf"bwd_impl='gluon' takes a block-sparse layout only with "
                                             rf"gluon_bwd_consumers=2 and gluon_bwd_dq='gluon' or 'tma'.*got {got}"):
            G.check_gluon_bwd(q, k, v, -1, 0, lay, 1, None, cfg, 128)
    with pytest.raises(ValueError, match=r"got block_size=64, Nk - Nq = 0; use bwd_impl='triton'"):
        G.check_gluon_bwd(q, k, v, -1, 0, lay, 1, None, ok, 64)
    with pytest.raises(ValueError, match=r"got a block-sparse layout with doc_ids"):
        G.check_gluon_bwd(q, k, v, -1, 0, lay, 1, torch.zeros(1, 1536, dtype=torch.int32), ok, 128)
    # "auto" (test_auto_bwd_sparse_knob): not at D 64 (no Gluon dQ) nor below GLUON_AUTO_BWD_SPARSE_MIN_N queries
    assert G.auto_bwd_shape_ok(FlashConfig(), q, k, v, -1, 0, lay, 1, None, 128) is False


@pytest.mark.parametrize("impl", WS3)
def test_whole_tile_layouts_pass_the_mask_check(monkeypatch, impl):
    """A layout of whole 128 x 128 tiles passes check_gluon_fwd (device and Gluon checks stubbed as on a Hopper
    GPU); 64-token blocks, an unaligned Nk - Nq, a layout with documents and a layout with dilation are refused,
    each naming what it got."""
    q, k, v, _ = _qkv(1, 2, 2, 256, 256, 64, device="cpu")
    lay = torch.ones(2, 2, dtype=torch.int8)
    monkeypatch.setattr(G, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)
    assert G.check_gluon_fwd(impl, q, k, v, -1, 0, lay, 1, None, 128) is True
    assert G.check_gluon_fwd(impl, q, k, v, -1, -1, lay, 1, None, 256) is False
    with pytest.raises(ValueError, match=r"only when every 128 x 128 tile.*got block_size=64, Nk - Nq = 0; use "
                                         r"fwd_impl='triton'"):
        G.check_gluon_fwd(impl, q, k, v, -1, 0, lay, 1, None, 64)
    with pytest.raises(ValueError, match=r"got block_size=128, Nk - Nq = 64"):
        G.check_gluon_fwd(impl, q[:, :, :192], k, v, -1, 0, lay, 1, None, 128)
    docs = torch.zeros(1, 3 * 512, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"got a block-sparse layout with doc_ids"):
        G.check_gluon_fwd(impl, q, k, v, -1, 0, lay, 1, docs, 128)
    with pytest.raises(ValueError, match=rf"{ALLOWED_MASKS}.*got dilation=2"):
        G.check_gluon_fwd(impl, q, k, v, 7, 0, lay, 2, None, 128)


def test_auto_takes_gluon_for_whole_tile_layouts_behind_the_flag(monkeypatch):
    """fwd_impl="auto" with a block-sparse layout: gluon_ws3a while GLUON_AUTO_SPARSE is on (the default since the
    H100 measured it ahead of the Triton sparse forward), for whole-tile layouts at D 128 only (not 64-token blocks,
    D 64, with documents or dilation); Triton with the flag off."""
    _all_hold(monkeypatch)
    q, k, v = _fake_qkv()
    lay = torch.ones(2, 2, dtype=torch.int8)
    cfg = FlashConfig(tma_min_pairs=0)
    assert G.GLUON_AUTO_SPARSE is True
    assert G.choose_fwd_impl(cfg, q, k, v, -1, 0, lay, 1, None, 128) == "gluon_ws3a"
    monkeypatch.setattr(G, "GLUON_AUTO_SPARSE", False)
    assert G.choose_fwd_impl(cfg, q, k, v, -1, 0, lay, 1, None, 128) == "triton"
    monkeypatch.setattr(G, "GLUON_AUTO_SPARSE", True)
    assert G.choose_fwd_impl(cfg, q, k, v, -1, 0, lay, 1, None, 64) == "triton"
    assert G.choose_fwd_impl(cfg, q, k, v, -1, 0, lay, 1, object(), 128) == "triton"
    assert G.choose_fwd_impl(cfg, q, k, v, -1, 0, lay, 2, None, 128) == "triton"
    assert G.choose_fwd_impl(cfg, *_fake_qkv(D=64), -1, 0, lay, 1, None, 128) == "triton"
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, block_layout=lay, block_size=128) == "gluon_ws3a"
    small = _fake_qkv(B=1, Hq=4, Hkv=4, Nq=1024, Nk=1024)  # far below the pair threshold of a band mask
    assert G.choose_fwd_impl(FlashConfig(), *small, -1, 0) == "triton"
    assert G.choose_fwd_impl(FlashConfig(), *small, -1, 0, lay, 1, None, 128) == "gluon_ws3a"  # layouts: any size


def test_gluon_layout_tables_cached_per_layout():
    """The table is built once per layout object (and in-place version), not per call."""
    from kernels.flash.sparse import layout_tables

    lay = torch.ones(4, 4, dtype=torch.int8).tril()
    a = G.gluon_layout_tables(lay, 128, 512, 512, -1, 0, 128, 128)
    assert G.gluon_layout_tables(lay, 128, 512, 512, -1, 0, 128, 128) is a
    assert G.gluon_layout_tables(lay.clone(), 128, 512, 512, -1, 0, 128, 128) is not a
    lay[3, 0] = 0  # in place: a new version, a new table
    b = G.gluon_layout_tables(lay, 128, 512, 512, -1, 0, 128, 128)
    assert b is not a and int(b[1].sum()) == int(a[1].sum()) - 1
    assert all(torch.equal(x, y) for x, y in zip(b, layout_tables(lay, 128, 512, 512, -1, 0, 128, 128)))


@pytest.mark.skipif(_hopper(), reason="the device refusal needs a device that is not Hopper")
def test_non_hopper_device_refused():
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 64, device=DEV)
    with pytest.raises(ValueError, match=r"fwd_impl='gluon_ws3a' supports only .*Hopper.*got device"):
        flash_attn(q, k, v, causal=True, config=FlashConfig(fwd_impl="gluon_ws3a"))


def test_missing_gluon_refused_by_name_and_auto_falls_back(monkeypatch):
    """A triton without Gluon's Hopper API (CI's version may differ): an explicit name raises a ValueError telling
    to use 'triton'; "auto" resolves to "triton" without raising, and the failure is cached."""
    G._gluon_modules.cache_clear()
    G.gluon_available.cache_clear()
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon.nvidia.hopper", None)  # import raises
    try:
        with pytest.raises(ValueError, match=r"fwd_impl='gluon_ws3a' / 'gluon_ws3b' needs "
                                             r"triton.experimental.gluon.*use fwd_impl='triton'"):
            G._gluon_modules()
        _all_hold(monkeypatch, gluon=None)  # everything else says Gluon
        q, k, v = _fake_qkv()
        assert G.choose_fwd_impl(FlashConfig(tma_min_pairs=0), q, k, v, -1, 0) == "triton"
        assert G.gluon_available() is False
        hits = G.gluon_available.cache_info().hits
        assert G.choose_fwd_impl(FlashConfig(tma_min_pairs=0), q, k, v, -1, -1) == "triton"
        assert G.gluon_available.cache_info().hits == hits + 1  # cached: no second import attempt
    finally:
        G._gluon_modules.cache_clear()
        G.gluon_available.cache_clear()


def test_auto_takes_gluon_only_on_the_triton_versions_it_was_measured_on(monkeypatch):
    """Gluon's API moves between triton versions: "auto" takes the Gluon forward only on GLUON_AUTO_TRITON (3.6,
    3.9) and the Gluon backward only on GLUON_AUTO_BWD_TRITON, at its head dims (3.6: D 64 and 128; 3.9: D 128, where
    it led the Triton backward; at D 64 its lead was within the noise), whatever the import says; the backward's
    versions are a subset of the forward's, and a version change reaches gluon_bwd_available without clearing its
    cache (it has none)."""
    monkeypatch.setattr(G, "_gluon_modules", lambda: None)  # the import "succeeds" on every version
    assert set(G.GLUON_AUTO_BWD_TRITON) <= set(G.GLUON_AUTO_TRITON)
    assert all(set(d) <= set(G.GLUON_BWD_HEAD_DIMS) for d in G.GLUON_AUTO_BWD_TRITON.values())
    try:
        for version, fwd, bwd, d64, d128 in (((3, 6), True, True, True, True), ((3, 9), True, True, False, True),
                                             ((3, 5), False, False, False, False), ((3, 7), False, False, False, False),
                                             ((4, 0), False, False, False, False)):
            G.gluon_available.cache_clear()
            monkeypatch.setattr(G, "_triton_version", lambda v=version: v)
            assert (G.gluon_available(), G.gluon_bwd_available()) == (fwd, bwd), version
            assert (G.gluon_bwd_available(64), G.gluon_bwd_available(128), G.gluon_bwd_available(96)) == \
                (d64, d128, False), version
    finally:
        G.gluon_available.cache_clear()


def test_tile_choice_fits_shared_memory():
    """Q tile + STAGES K and V tiles (bf16) stay under the H200's 227 KiB of shared memory per block."""
    for impl in IMPLS:
        for D in G.GLUON_HEAD_DIMS:
            bm, bn, stages, warps = G.gluon_tiles(impl, D)
            assert bm == 16 * warps * 2  # two 1-warpgroup consumers of BLOCK_M / 2 rows
            assert (bm * D + 2 * stages * bn * D) * 2 <= 227 * 1024
            assert stages == 3
    for bad in REMOVED + ("triton", "auto"):
        with pytest.raises(ValueError, match=rf"impl='{bad}' is not a Gluon forward; allowed values: "
                                             r"'gluon_ws3a', 'gluon_ws3b'"):
            G.gluon_tiles(bad, 128)


def test_ws3_variants_differ_in_ping_pong_only():
    """gluon_ws3a -> gluon_ws3b adds ping-pong only, and each name picks the ws3 kernel with its flags (a copy)."""
    assert G.WS3_FLAGS == {"gluon_ws3a": dict(PINGPONG=False), "gluon_ws3b": dict(PINGPONG=True)}

    class GK:  # the kernels module stand-in: gluon_kernel only picks attributes
        _gl_fwd_ws3_kernel = "ws3"

    for impl in WS3:
        kernel, extra = G.gluon_kernel(impl, GK)
        assert kernel == "ws3" and extra == G.WS3_FLAGS[impl] and extra is not G.WS3_FLAGS[impl]

    class GKP(GK):
        _gl_fwd_ws3p_kernel = "ws3p"

    assert G.gluon_kernel("gluon_ws3p", GKP) == ("ws3p", {})  # the persistent kernel: ws3a's schedule, no flags
    with pytest.raises(ValueError, match="impl='gluon_ws2' is not a Gluon forward"):
        G.gluon_kernel("gluon_ws2", GK)


# ------------------------------------------------------------------------------------ CPU: the "auto" resolution


def _fake_qkv(B=2, Hq=8, Hkv=2, Nq=6000, Nk=6000, D=128, Dv=None, dtype=torch.bfloat16, device="cuda"):
    """Stand-ins of q, k, v on a CUDA device (what the resolver reads: device, shape, dtype; no GPU needed)."""
    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    mk = lambda h, n, d: SimpleNamespace(device=dev, shape=torch.Size((B, h, n, d)), dtype=dtype)  # noqa: E731
    return mk(Hq, Nq, D), mk(Hkv, Nk, D), mk(Hkv, Nk, D if Dv is None else Dv)


def _all_hold(monkeypatch, hopper=True, gluon=True, interpret=False):
    """Mock the cached device / Gluon checks (``None``: leave that one real) and the interpreter flag."""
    monkeypatch.setattr(G, "INTERPRET", interpret)
    if hopper is not None:
        monkeypatch.setattr(G, "_hopper", lambda device: hopper)
    if gluon is not None:
        monkeypatch.setattr(G, "gluon_available", lambda: gluon)
        monkeypatch.setattr(G, "gluon_bwd_available", lambda D=None: gluon)


def test_auto_backward_on_triton_39_takes_gluon_at_d128_only(monkeypatch):
    """GLUON_AUTO_BWD_TRITON by head dim: choose_bwd_impl passes q's head dim, so on 3.9 "auto" runs the Gluon
    backward at D 128 and the Triton one at D 64 (3.6: both); the real gluon_bwd_available, the import faked."""
    _all_hold(monkeypatch, gluon=None)
    monkeypatch.setattr(G, "gluon_available", lambda: True)
    for version, want in (((3, 9), {128: "gluon", 64: "triton"}), ((3, 6), {128: "gluon", 64: "gluon"}),
                          ((3, 7), {128: "triton", 64: "triton"})):
        monkeypatch.setattr(G, "_triton_version", lambda v=version: v)
        for D, impl in want.items():
            q, k, v = _fake_qkv(Hkv=8, D=D)  # MHA, 6000 x 6000: past GLUON_BWD_AUTO_MIN_PAIRS
            assert G.choose_bwd_impl(FlashConfig(), q, k, v, -1, 0) == impl, (version, D)


def test_auto_is_triton_on_cpu_tensors():
    """Real CPU tensors (and the interpreter CI runs): "auto" is "triton" at any size, and the default config's
    forward is the Triton one's, bit for bit."""
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 128, device="cpu")
    assert G.choose_fwd_impl(FlashConfig(tma_min_pairs=0), q, k, v, -1, 0) == "triton"
    assert resolve_fwd_impl(FlashConfig(tma_min_pairs=0), q, k, v, causal=True) == "triton"
    assert resolve_fwd_impl(None, q, k, v) == "triton"  # None: the current settings (default FlashConfig())
    q, k, v, _ = _qkv(1, 2, 1, 24, 40, 16, dtype=torch.float32, device="cpu")
    a, la = F.flash_attn_fwd(q, k, v, 0.25, -1, 0, config=FlashConfig())
    b, lb = F.flash_attn_fwd(q, k, v, 0.25, -1, 0, config=FlashConfig(fwd_impl="triton"))
    assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("causal", [True, False])
def test_auto_picks_the_gluon_forward_when_all_hold(monkeypatch, causal):
    """Above the pair threshold "auto" takes the persistent Gluon forward (gluon_ws3p) for dense / causal / window
    masks while AUTO_PERSISTENT; gluon_ws3a with the knob off, for block-sparse layouts (ws3p takes none) and for
    documents (not timed with ws3p)."""
    _all_hold(monkeypatch)
    q, k, v = _fake_qkv()
    wr = 0 if causal else -1
    pairs = visited_pairs(2, 8, 6000, 6000, -1, wr)
    # the default threshold (the D 128 entry, above tma_min_pairs since 2026-12-06): the shape of the GPU test below
    assert pairs >= max(FlashConfig().tma_min_pairs, G.GLUON_AUTO_HEAD_DIMS[128])
    assert G.AUTO_PERSISTENT is True and G.PERSISTENT_IMPL == "gluon_ws3p" and G.AUTO_GLUON_IMPL == "gluon_ws3a"
    assert G.choose_fwd_impl(FlashConfig(), q, k, v, -1, wr) == "gluon_ws3p"
    assert G.choose_fwd_impl(FlashConfig(), q, k, v, 4095, wr) == "gluon_ws3p"  # a sliding window too
    assert resolve_fwd_impl(FlashConfig(), q, k, v, causal=causal) == "gluon_ws3p"
    assert resolve_fwd_impl(None, q, k, v, causal=causal) == "gluon_ws3p"  # the default config
    assert resolve_fwd_impl(FlashConfig(), q, k, v, causal=causal, window_size=(None, None)) == "gluon_ws3p"
    docs = torch.zeros(2, 3 * 12000, dtype=torch.int32)
    assert G.choose_fwd_impl(FlashConfig(), q, k, v, -1, wr, documents=docs) == "gluon_ws3a"
    monkeypatch.setattr(G, "AUTO_PERSISTENT", False)
    assert G.choose_fwd_impl(FlashConfig(), q, k, v, -1, wr) == "gluon_ws3a"
    monkeypatch.setattr(G, "AUTO_PERSISTENT", True)
    # the threshold is inclusive, and the same count as the Triton forward's TMA "auto"
    assert G.choose_fwd_impl(FlashConfig(tma_min_pairs=pairs), q, k, v, -1, wr) == "gluon_ws3p"
    assert G.choose_fwd_impl(FlashConfig(tma_min_pairs=pairs + 1), q, k, v, -1, wr) == "triton"
    for dtype in (torch.float16, torch.bfloat16):
        assert G.choose_fwd_impl(FlashConfig(), *_fake_qkv(dtype=dtype), -1, wr) == "gluon_ws3p"
    # explicit names are returned as they are (an explicit "triton" forces Triton)
    for impl in ("triton",) + IMPLS:
        assert resolve_fwd_impl(FlashConfig(fwd_impl=impl), q, k, v, causal=causal) == impl
        assert G.choose_fwd_impl(FlashConfig(fwd_impl=impl), q, k, v, -1, wr) == impl


FAILS = {  # one condition broken each: (choose_fwd_impl kwargs, fake-tensor kwargs, config kwargs, mocks)
    "cpu_device": ({}, dict(device="cpu"), {}, {}),
    "meta_device": ({}, dict(device="meta"), {}, {}),
    "interpreter": ({}, {}, {}, dict(interpret=True)),
    "not_hopper": ({}, {}, {}, dict(hopper=False)),
    "no_gluon": ({}, {}, {}, dict(gluon=False)),
    "layout": (dict(layout=torch.ones(2, 2, dtype=torch.int8)), {}, {}, {}),
    "dilation": (dict(dilation=2), {}, {}, {}),
    "D64": ({}, dict(D=64), {}, {}),
    "D256": ({}, dict(D=256), {}, {}),
    "Dv": ({}, dict(Dv=64), {}, {}),
    "fp32": ({}, dict(dtype=torch.float32), {}, {}),
    "forced_tile": ({}, {}, dict(fwd=(128, 64, 8, 3)), {}),
    "autotune": ({}, {}, dict(autotune=True), {}),
    "tma_off": ({}, {}, dict(tma=False), {}),
    "small": ({}, dict(B=1, Hq=4, Hkv=4, Nq=4096, Nk=4096), {}, {}),
}


@pytest.mark.parametrize("case", sorted(FAILS))
def test_auto_is_triton_when_a_condition_fails(monkeypatch, case):
    """Each condition alone sends "auto" to Triton (the same call with it restored picks Gluon); never raises."""
    call, fake, cfg, mocks = FAILS[case]
    kw = dict(win_left=-1, win_right=0)
    _all_hold(monkeypatch)
    assert G.choose_fwd_impl(FlashConfig(), *_fake_qkv(), **kw) == "gluon_ws3p"  # the baseline holds
    _all_hold(monkeypatch, **mocks)
    assert G.choose_fwd_impl(FlashConfig(**cfg), *_fake_qkv(**fake), **{**kw, **call}) == "triton"


_DOCS = torch.zeros(4, dtype=torch.int32)  # (only tested for None by choose_fwd_impl)
BANDS = {"window_left": dict(win_left=1023), "window_right": dict(win_left=-1, win_right=5),
         "window_both": dict(win_left=700, win_right=300), "documents": dict(documents=_DOCS),
         "window_documents": dict(win_left=2047, documents=_DOCS)}


@pytest.mark.parametrize("case", sorted(BANDS))
def test_auto_takes_gluon_for_band_masks_behind_the_flag(monkeypatch, case):
    """Sliding windows and documents: "auto" picks the Gluon forward like dense / causal (same other conditions, the
    pair count of the window) while GLUON_AUTO_BANDS is on, Triton when it is off; causal stays Gluon either way."""
    _all_hold(monkeypatch)
    qkv = _fake_qkv(B=4, Hq=16, Hkv=16, Nq=8192, Nk=8192)
    kw = {**dict(win_left=-1, win_right=0), **BANDS[case]}
    want = "gluon_ws3a" if "documents" in kw else "gluon_ws3p"  # (AUTO_PERSISTENT: not with documents)
    assert G.GLUON_AUTO_BANDS is True
    assert G.choose_fwd_impl(FlashConfig(), *qkv, **kw) == want
    monkeypatch.setattr(G, "GLUON_AUTO_BANDS", False)
    assert G.choose_fwd_impl(FlashConfig(), *qkv, **kw) == "triton"
    assert G.choose_fwd_impl(FlashConfig(), *qkv, win_left=-1, win_right=0) == "gluon_ws3p"
    monkeypatch.setattr(G, "GLUON_AUTO_BANDS", True)
    for bad in (dict(dilation=2), dict(layout=torch.ones(2, 2, dtype=torch.int8))):  # never Gluon
        assert G.choose_fwd_impl(FlashConfig(), *qkv, **kw, **bad) == "triton"
    small = _fake_qkv(B=1, Hq=1, Hkv=1, Nq=8192, Nk=8192)  # below the pair threshold: Triton as for causal
    assert G.choose_fwd_impl(FlashConfig(), *small, **kw) == "triton"
    d64 = _fake_qkv(B=64, Hq=16, Hkv=16, Nq=8192, Nk=8192, D=64)  # D 64: the Triton forward ran ahead for bands
    assert G.choose_fwd_impl(FlashConfig(), *d64, **kw) == "triton"
    monkeypatch.setattr(G, "GLUON_AUTO_BAND_HEAD_DIMS", (64, 128))
    assert G.choose_fwd_impl(FlashConfig(), *d64, **kw) == want


def test_auto_head_dims_take_their_own_pair_threshold(monkeypatch):
    """D 64 takes Gluon only from GLUON_AUTO_HEAD_DIMS[64] visited pairs (measured: below it the Triton forward is
    as fast or faster), D 128 from GLUON_AUTO_HEAD_DIMS[128]; both above config.tma_min_pairs (the Triton kernels'
    TMA threshold); other head dims never; the table is the one knob."""
    _all_hold(monkeypatch)
    thr = G.GLUON_AUTO_HEAD_DIMS[64]
    assert thr > G.GLUON_AUTO_HEAD_DIMS[128] > FlashConfig().tma_min_pairs
    d128 = _fake_qkv(D=128, Nq=4096, Nk=4096)  # above tma_min_pairs, below the D 128 entry: Triton (with TMA)
    pairs128 = visited_pairs(d128[0].shape[0], d128[0].shape[1], 4096, 4096, -1, 0)
    assert FlashConfig().tma_min_pairs <= pairs128 < G.GLUON_AUTO_HEAD_DIMS[128]
    assert G.choose_fwd_impl(FlashConfig(), *d128, -1, 0) == "triton"
    below = _fake_qkv(D=64, Nq=8192, Nk=8192)  # B * H * N^2 / 2 causal pairs of the fake shape
    pairs = visited_pairs(below[0].shape[0], below[0].shape[1], 8192, 8192, -1, 0)
    assert pairs < thr and G.choose_fwd_impl(FlashConfig(), *below, -1, 0) == "triton"
    assert G.choose_fwd_impl(FlashConfig(), *_fake_qkv(D=128, Nq=8192, Nk=8192), -1, 0) == "gluon_ws3p"
    monkeypatch.setattr(G, "GLUON_AUTO_HEAD_DIMS", {128: 0, 64: pairs})
    assert G.choose_fwd_impl(FlashConfig(), *below, -1, 0) == "gluon_ws3p"
    monkeypatch.setattr(G, "GLUON_AUTO_HEAD_DIMS", {128: 0})
    assert G.choose_fwd_impl(FlashConfig(), *below, -1, 0) == "triton"


def test_resolve_fwd_impl_takes_flash_attn_mask_arguments(monkeypatch):
    """resolve_fwd_impl reads the mask as flash_attn takes it: causal clips a right window edge to 0, windows and
    doc_ids take Gluon (GLUON_AUTO_BANDS) where the window's pair count is large enough; a layout or a dilation
    mean Triton; bad windows raise. resolve_bwd_impl likewise for the backward."""
    _all_hold(monkeypatch)
    q, k, v = _fake_qkv()
    cfg = FlashConfig()
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, window_size=(None, 7)) == "gluon_ws3p"
    assert resolve_fwd_impl(cfg, q, k, v, causal=False, window_size=(None, 7)) == "gluon_ws3p"
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, window_size=(1023, 0)) == "triton"  # 2^26.6 pairs: small
    assert resolve_fwd_impl(cfg, *_fake_qkv(B=8), causal=True, window_size=(4095, 0)) == "gluon_ws3p"
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, dilation=2) == "triton"
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, block_layout=torch.ones(2, 2, dtype=torch.int8)) == "triton"
    assert resolve_fwd_impl(cfg, q, k, v, causal=True, doc_ids=torch.zeros(2, 6000, dtype=torch.int32)) \
        == "gluon_ws3a"
    with pytest.raises(ValueError, match="window_size must be a pair"):
        resolve_fwd_impl(cfg, q, k, v, window_size=(1, 2, 3))
    with pytest.raises(TypeError, match="config must be a kernels.FlashConfig"):
        resolve_fwd_impl("auto", q, k, v)
    # the backward's counterpart: the same arguments, checks and errors, choose_bwd_impl's answer
    mha = _fake_qkv(B=1, Hq=16, Hkv=16, Nq=16384, Nk=16384)  # (the default fakes are GQA outside the measured case)
    assert resolve_bwd_impl(cfg, *mha, causal=True) == "gluon"
    assert resolve_bwd_impl(cfg, *mha, causal=True, dilation=2) == "triton"
    assert resolve_bwd_impl(cfg, q, k, v, causal=True) == "triton"
    assert resolve_bwd_impl(FlashConfig(bwd_impl="triton"), *mha, causal=True) == "triton"
    assert resolve_bwd_impl(None, *_qkv(1, 2, 2, 16, 16, 128, device="cpu")[:3], causal=True) == "triton"
    with pytest.raises(ValueError, match="window_size must be a pair"):
        resolve_bwd_impl(cfg, q, k, v, window_size=(1, 2, 3))
    with pytest.raises(ValueError, match="dilation=0 must be an integer >= 1"):
        resolve_bwd_impl(cfg, q, k, v, dilation=0)
    with pytest.raises(TypeError, match="config must be a kernels.FlashConfig"):
        resolve_bwd_impl("auto", q, k, v)


@pytest.mark.parametrize("dilation", [0, -1, 1.0, True])
def test_resolve_fwd_impl_refuses_what_flash_attn_refuses(monkeypatch, dilation):
    """A dilation flash_attn refuses (not an int >= 1) is refused by resolve_fwd_impl too, with flash_attn's message
    (it answered "triton", or "gluon_ws3a" for 1.0 / True, for a call that raises); so is a window_size that is no
    pair (was a TypeError from len())."""
    _all_hold(monkeypatch)
    q, k, v = _fake_qkv()
    msg = rf"dilation={dilation!r} must be an integer >= 1"
    with pytest.raises(ValueError, match=msg):
        resolve_fwd_impl(FlashConfig(), q, k, v, causal=True, dilation=dilation)
    qc, kc, vc, _ = _qkv(1, 2, 2, 16, 16, 64, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=msg):
        flash_attn(qc, kc, vc, causal=True, dilation=dilation)
    with pytest.raises(ValueError, match=r"window_size must be a pair \(left, right\), got 5"):
        resolve_fwd_impl(FlashConfig(), q, k, v, window_size=5)


def test_flash_attn_fwd_runs_what_auto_picks(monkeypatch):
    """The forward's dispatch: "auto" asks choose_fwd_impl and runs the Gluon launcher when it says so (stubbed
    here: no GPU), an explicit "triton" never asks and runs the Triton kernel."""
    q, k, v, _ = _qkv(1, 2, 2, 16, 16, 16, dtype=torch.float32, device="cpu")
    asked, ran = [], []
    monkeypatch.setattr(F, "choose_fwd_impl", lambda cfg, *a, **_: asked.append((cfg, a[3:5])) or "gluon_ws3a")
    monkeypatch.setattr(F, "check_gluon_fwd", lambda impl, *a, **_: a[4] == 0)
    monkeypatch.setattr(F, "gluon_flash_fwd", lambda q_, k_, v_, scale, wl, wr, impl, documents=None, **_:
                        ran.append((wl, wr, impl, documents)) or ("out", "lse"))
    assert F.flash_attn_fwd(q, k, v, 0.25, -1, 0, config=FlashConfig()) == ("out", "lse")
    assert asked == [(FlashConfig(), (-1, 0))] and ran == [(-1, 0, "gluon_ws3a", None)]
    docs = torch.zeros(1, 6 * 16, dtype=torch.int32)  # the mask arguments reach the Gluon launcher as they came
    assert F.flash_attn_fwd(q, k, v, 0.25, 5, 2, config=FlashConfig(), documents=docs) == ("out", "lse")
    assert ran[-1][:3] == (5, 2, "gluon_ws3a") and ran[-1][3] is docs
    del ran[1:], asked[1:]
    out, lse = F.flash_attn_fwd(q, k, v, 0.25, -1, 0, config=FlashConfig(fwd_impl="triton"))
    assert len(asked) == 1 and len(ran) == 1 and out.shape == q.shape and lse.shape == q.shape[:3]


def test_bench_flash_ours_names_and_recorded_forward(monkeypatch):
    """eval/bench_flash: "ours" is the default ("auto"), "ours_triton" forces Triton, the removed variants are no
    longer impl names; ours_fwd_impl / ours_bwd_impl record what the registry's triton backend would run for each
    mask."""
    from eval import bench_flash as bf

    assert bf.OURS == {"ours": "auto", "ours_triton": "triton", "ours_gluon_ws3a": "gluon_ws3a",
                       "ours_gluon_ws3b": "gluon_ws3b", "ours_gluon_ws3p": "gluon_ws3p", "ours_gluon_bwd": "auto",
                       "ours_gluon_bwd_tdq": "auto", "ours_gluon_bwd_2c": "auto", "ours_gluon_dq": "auto",
                       "ours_gluon_tmadq": "auto", "ours_gluon_tmadq2": "auto", "ours_triton_bwd": "auto",
                       "ours_triton_all": "triton", "ours_no_tma": "auto"}
    assert bf.ours_config("ours_triton_bwd") == FlashConfig(bwd_impl="triton")
    assert bf.ours_config("ours_gluon_bwd_2c").gluon_bwd_consumers == 2
    assert bf.ours_config("ours") == FlashConfig() == bf.ours_config("triton")  # the registry name: as ours
    assert bf.ours_config("ours_triton").fwd_impl == "triton"
    assert bf.ours_config("ours", FlashConfig(autotune=True)) == FlashConfig(autotune=True)
    for removed in REMOVED:
        with pytest.raises(SystemExit, match=r"not supported; allowed values: .*ours_triton, ours_gluon_ws3a, "
                                             r"ours_gluon_ws3b"):
            bf.main(["--impls", f"ours,ours_{removed}", "--variants", "causal", "--N", "256", "--D", "64"])
    _all_hold(monkeypatch)
    q, k, v = _fake_qkv(B=1, Hq=16, Hkv=16, Nq=16384, Nk=16384)
    expect = {"causal": "gluon_ws3p", "noncausal": "gluon_ws3p", "gqa4": "gluon_ws3p", "win1024": "gluon_ws3p",
              "bigbird": "gluon_ws3a", "strided": "gluon_ws3a", "dil512x2": "triton"}  # 128-token blocks: whole tiles
    for name, want in expect.items():
        spec = AttentionSpec(**bf.VARIANTS[name])
        assert bf.ours_fwd_impl("ours", spec, q, k, v) == want, name
        assert bf.ours_fwd_impl("ours_triton", spec, q, k, v) == "triton"
        assert bf.ours_fwd_impl("ours_gluon_ws3b", spec, q, k, v) == "gluon_ws3b"  # forced: the call checks it
    assert bf.ours_fwd_impl("ours", AttentionSpec(**bf.VARIANTS["causal"]), q, k, v,
                            doc_ids=torch.zeros(1, 16384, dtype=torch.int32)) == "gluon_ws3a"  # GLUON_AUTO_BANDS
    assert bf.ours_fwd_impl("ours", AttentionSpec(**bf.VARIANTS["causal"]), *_fake_qkv(Nq=1024, Nk=1024)) == "triton"
    # the backward the row records (bwd_impl): what choose_bwd_impl picks, forced names as they are
    for name, want in {"causal": "gluon", "noncausal": "gluon", "dil512x2": "triton"}.items():
        spec = AttentionSpec(**bf.VARIANTS[name])
        assert bf.ours_bwd_impl("ours", spec, q, k, v) == want, name
        assert bf.ours_bwd_impl("ours_triton_bwd", spec, q, k, v) == "triton"
        assert bf.ours_bwd_impl("ours_gluon_dq", spec, q, k, v) == "gluon"
    causal = AttentionSpec(**bf.VARIANTS["causal"])
    assert bf.ours_bwd_impl("ours", causal, *_fake_qkv(Hkv=8, Nq=512, Nk=512)) == "triton"  # below the pairs threshold
    assert bf.ours_bwd_impl("ours", causal, *_fake_qkv(Hkv=8, Nq=1024, Nk=1024)) == "gluon"  # D 128: from causal 1k
    monkeypatch.setattr(G, "gluon_bwd_available", lambda D=None: False)  # a triton outside GLUON_AUTO_BWD_TRITON
    assert bf.ours_bwd_impl("ours", causal, q, k, v) == "triton"
    assert bf.ours_fwd_impl("ours", causal, q, k, v) == "gluon_ws3p"  # the forward asks gluon_available alone
    cpu = _qkv(1, 2, 2, 16, 16, 128, device="cpu")[:3]
    assert bf.ours_bwd_impl("ours", causal, *cpu) == "triton"


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
    tri, tri_lse = flash_attn_fwd(q, k, v, scale, -1, 0 if causal else -1, config=FlashConfig(fwd_impl="triton"))
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

    ours, tri = grads(FlashConfig(fwd_impl=impl)), grads(FlashConfig(fwd_impl="triton"))
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
    tile mostly under 8, on ~3% of (row, tile) over 8, up to ~22): the running-max rescale against the fp32
    reference."""
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


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_auto_runs_the_gluon_forward(monkeypatch):
    """The default config (fwd_impl="auto") on an H200: a dense causal D 128 problem above the Gluon threshold runs
    the persistent gluon_ws3p (AUTO_PERSISTENT; the resolver says so and the Gluon launcher is called with it; on a triton outside
    ``GLUON_AUTO_TRITON`` the Triton forward), a small one the Triton forward;
    out, lse and the gradients match the fp32 reference within the usual bounds, out and lse the explicit gluon_ws3a
    call's bit for bit (ws3p runs ws3a's per-tile arithmetic), the gradients the Triton-forward path's."""
    q, k, v, do = _qkv(2, 8, 2, 6000, 6000, 128, bnhd=True)  # GQA 4:1, N not a multiple of the tile
    assert visited_pairs(2, 8, 6000, 6000, -1, 0) >= max(FlashConfig().tma_min_pairs, G.GLUON_AUTO_HEAD_DIMS[128])
    if not G.gluon_available():  # a triton outside GLUON_AUTO_TRITON: "auto" keeps the Triton forward, by design
        assert G._triton_version() not in G.GLUON_AUTO_TRITON
        assert resolve_fwd_impl(None, q, k, v, causal=True) == "triton"
        return
    assert resolve_fwd_impl(None, q, k, v, causal=True) == "gluon_ws3p" == G.PERSISTENT_IMPL
    assert resolve_fwd_impl(None, q[:, :, :1000], k[:, :, :1000], v[:, :, :1000], causal=True) == "triton"
    launched = []
    real = F.gluon_flash_fwd
    monkeypatch.setattr(F, "gluon_flash_fwd", lambda *a, **kw: launched.append(a[6]) or real(*a, **kw))

    def grads(cfg):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = flash_attn(*leaves, causal=True, return_lse=True, config=cfg)
        out.backward(do)
        return [out.detach(), lse.detach()] + [t.grad for t in leaves]

    auto = grads(None)  # the current settings: FlashConfig()
    assert launched == ["gluon_ws3p"]
    small = flash_attn(q[:, :, :1000], k[:, :, :1000], v[:, :, :1000], causal=True)
    assert launched == ["gluon_ws3p"] and small.shape == (2, 8, 1000, 128)  # below the threshold: Triton
    explicit, explicit_lse = F.flash_attn_fwd(q, k, v, 128 ** -0.5, -1, 0, config=FlashConfig(fwd_impl="gluon_ws3a"))
    assert torch.equal(auto[0], explicit) and torch.equal(auto[1], explicit_lse)
    tri = grads(FlashConfig(fwd_impl="triton"))
    assert launched == ["gluon_ws3p", "gluon_ws3a"]  # the explicit call only; "triton" never launches Gluon
    ref_leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref, ref_lse = softmax_attention_reference(*ref_leaves, AttentionSpec(kind="flash", causal=True), return_lse=True)
    rg = torch.autograd.grad(ref, ref_leaves, do.float())
    pl_leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    pl = _plain_torch(*pl_leaves, True, 128 ** -0.5)
    pg = torch.autograd.grad(pl, pl_leaves, do)
    bound = 2 * (pl.detach().float() - ref.detach()).abs().max().item() + 1e-5
    assert (auto[0].float() - ref.detach()).abs().max().item() <= bound
    torch.testing.assert_close(auto[1], ref_lse.detach().float(), atol=2e-3, rtol=1e-3)
    for name, a, b, r, p in zip(("dq", "dk", "dv"), auto[2:], tri[2:], rg, pg):
        gb = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= gb, name
        assert (a.float() - b.float()).abs().max().item() <= gb, name


@pytest.mark.parametrize("impl", WS3)
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_block_sparse_forward(impl, case):
    """The Gluon forward on block-sparse layouts of whole 128 x 128 tiles (BigBird, strided; causal and not; Nq
    != Nk; ragged N): out and lse against the fp32 reference within 2x plain PyTorch's error, -inf lse exactly on
    the rows that see no key; through the registry's triton backend with FlashConfig(fwd_impl=impl), out and the
    gradients (Triton backward on the Gluon out / lse) close to the Triton-forward path's."""
    from attn_zoo.backends.triton_flash import triton_softmax_attention

    spec, mi, Nq, Nk = _sparse_mask(case)
    q, k, v, do = _qkv(2, 4, 2, Nq, Nk, 128, bnhd=True)
    scale = 128 ** -0.5
    layout = mi.layout.to(device=DEV, dtype=torch.int8).contiguous()
    out, lse = F.flash_attn_fwd(q, k, v, scale, -1, 0 if mi.causal else -1, layout=layout,
                                layout_bs=mi.block_size, config=FlashConfig(fwd_impl=impl))
    ref, ref_lse = softmax_attention_reference(q.float(), k.float(), v.float(), spec, return_lse=True)
    dense = mi.dense(q.device)
    s = (q @ repeat_kv(k, 2).transpose(-1, -2)) * scale
    plain = torch.nan_to_num(torch.softmax(s.float().masked_fill(~dense, float("-inf")), -1).to(q.dtype)) \
        @ repeat_kv(v, 2)
    bound = 2 * (plain.float() - ref).abs().max().item() + 1e-5
    assert (out.float() - ref).abs().max().item() <= bound
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], ref_lse[finite].float(), atol=2e-3, rtol=1e-3)
    if (~finite).any():  # rows that see no key: zero output
        assert out[~finite[..., None].expand_as(out)].abs().max().item() == 0

    def grads(cfg):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = triton_softmax_attention(*leaves, spec, config=cfg)  # the registry's "triton" backend
        o.backward(do)
        return [o.detach()] + [t.grad for t in leaves]

    ours, tri = grads(FlashConfig(fwd_impl=impl)), grads(FlashConfig(fwd_impl="triton"))
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, tri):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2e-2, msg=name)


# the dQ paths that take a block-sparse layout (kernels.flash.gluon.GLUON_BWD_DQ_LAYOUT): "tma" only where this
# triton's Gluon has the TMA reduce-add (3.7+)
LAYOUT_DQ = ["gluon", pytest.param("tma", marks=pytest.mark.skipif(
    not G.gluon_tma_reduce_ok(), reason="gluon_bwd_dq='tma' needs triton >= 3.7's Gluon TMA reduce-add"))]


@pytest.mark.parametrize("dq", LAYOUT_DQ)
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_block_sparse_gluon_backward(case, dq):
    """The Gluon backward on block-sparse layouts of whole tiles (two consumers; the Gluon dQ: both kernels walk the
    layout's own tables; the TMA dQ: the dK / dV kernel adds dQ walking its key-tile table): dq, dk, dv (GQA 2:1,
    D 128) within 3x plain PyTorch's error of the fp32 reference's and close to the Triton backward's, through the
    registry's backend."""
    from attn_zoo.backends.triton_flash import triton_softmax_attention

    spec, mi, Nq, Nk = _sparse_mask(case)
    q, k, v, do = _qkv(2, 4, 2, Nq, Nk, 128, bnhd=True)

    def grads(cfg, dtype=None):
        leaves = [t.detach().clone().to(dtype or t.dtype).requires_grad_(True) for t in (q, k, v)]
        o = triton_softmax_attention(*leaves, spec, config=cfg) if cfg is not None else \
            softmax_attention_reference(*leaves, spec)
        o.backward(do.to(o.dtype))
        return [t.grad for t in leaves]

    ours = grads(FlashConfig(bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq=dq))
    tri = grads(FlashConfig(bwd_impl="triton"))
    ref = grads(None, torch.float32)
    plain = grads(None)  # the reference in bf16: plain PyTorch's rounding
    for name, a, b, r, p in zip(("dq", "dk", "dv"), ours, tri, ref, plain):
        bound = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= bound, name
        assert (a.float() - b.float()).abs().max().item() <= bound, name


# block-sparse layouts with a sliding window, empty layout rows / columns, layouts shorter than the sequence:
# (causal, window_size, block_size, layout blocks, empty layout row / column or None, Nq, Nk, Hq, Hkv)
LAYOUT_BAND_CASES = {
    "causal_window_empty_tiles": (True, (300, 0), 128, 8, (2, 5), 1000, 1000, 4, 4),
    "window_both_nq_lt_nk_gqa": (False, (200, 100), 128, 8, (2, 6), 700, 956, 4, 2),
    "left_window_nq_gt_nk_short_layout": (False, (500, None), 256, 3, None, 1100, 844, 4, 4),
    "full_empty_tiles_gqa": (False, None, 128, 8, (3, 4), 1000, 1000, 8, 2),
}


def _layout_band_case(case):
    """``(mask_kw for flash_attn, MaskInfo, Nq, Nk, Hq, Hkv)`` of a :data:`LAYOUT_BAND_CASES` entry (a fixed random
    layout, seed 5, with the given layout row and column off: query / key tiles that visit nothing)."""
    from attn_zoo.masks import MaskInfo
    from kernels.flash.api import _window_bounds

    causal, window, bs, nb, empty, Nq, Nk, Hq, Hkv = LAYOUT_BAND_CASES[case]
    lay = torch.rand(nb, nb, generator=torch.Generator().manual_seed(5)) < 0.6
    lay |= torch.eye(nb, dtype=torch.bool)
    if empty is not None:
        lay[empty[0], :] = False
        lay[:, empty[1]] = False
    wl, wr = _window_bounds(causal, window)
    mi = MaskInfo(Nq, Nk, causal, None if wl < 0 else wl, None if wr < 0 else wr, lay, bs)
    kw = dict(causal=causal, window_size=window, block_layout=lay, block_size=bs, block_table_fn=mi.block_table)
    return kw, mi, Nq, Nk, Hq, Hkv


def _masked_attention_grads(q, k, v, do, mask, scale, dtype=None):
    """out, dq, dk, dv of ``softmax(scale q k^T)`` under the bool ``(Nq, Nk)`` ``mask`` in plain PyTorch (in
    ``dtype``, default the inputs'; rows that see no key: zero output, no gradient)."""
    leaves = [t.detach().clone().to(dtype or t.dtype).requires_grad_(True) for t in (q, k, v)]
    qq, kk, vv = leaves
    group = qq.shape[1] // kk.shape[1]
    empty = ~mask.any(-1, keepdim=True)
    s = (qq @ repeat_kv(kk, group).transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
    p = torch.softmax(s.float(), -1).masked_fill(empty, 0.0).to(qq.dtype)
    o = p @ repeat_kv(vv, group)
    o.backward(do.to(o.dtype))
    return [o.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("D", [128, 64])  # (D 64: the dQ kernel's 128 x 128 tiles, its table at them; untimed, by name)
@pytest.mark.parametrize("case", sorted(LAYOUT_BAND_CASES))
@pytest.mark.parametrize("dq", LAYOUT_DQ)
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_block_sparse_gluon_with_windows(case, D, dq):
    """The Gluon forward and backward (two consumers, Gluon dQ) on block-sparse layouts of whole tiles together with
    sliding windows (either edge: the element rule inside the tables' partial tiles), layout rows / columns with no
    block on (query tiles and key tiles whose table row is empty: zero output and gradients written), a layout
    shorter than the sequence (positions past it in its last block), GQA, ragged Nq / Nk both ways: out and every
    gradient within 3x plain PyTorch's error of the fp32 reference, and close to the Triton kernels'."""
    kw, mi, Nq, Nk, Hq, Hkv = _layout_band_case(case)
    q, k, v, do = _qkv(2, Hq, Hkv, Nq, Nk, D, bnhd=True)
    scale = D ** -0.5
    mask = mi.dense(q.device)

    def run(cfg):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o = flash_attn(*leaves, config=cfg, **kw)
        o.backward(do)
        return [o.detach()] + [t.grad for t in leaves]

    ours = run(FlashConfig(fwd_impl="gluon_ws3a", bwd_impl="gluon", gluon_bwd_consumers=2, gluon_bwd_dq=dq))
    tri = run(FlashConfig(fwd_impl="triton", bwd_impl="triton"))
    ref = _masked_attention_grads(q, k, v, do, mask, scale, torch.float32)
    plain = _masked_attention_grads(q, k, v, do, mask, scale)
    for name, a, b, r, p in zip(("out", "dq", "dk", "dv"), ours, tri, ref, plain):
        bound = 3 * (p.float() - r).abs().max().item() + 1e-4
        assert (a.float() - r).abs().max().item() <= bound, (case, name)
        assert (a.float() - b.float()).abs().max().item() <= bound, (case, name)
    seen_q, seen_k = mask.any(1), mask.any(0)
    assert (~seen_q).any() and ours[1][:, :, ~seen_q].abs().max().item() == 0  # rows that see nothing: dq = 0
    if (~seen_k).any():  # keys no row sees: dk = dv = 0
        assert ours[2][:, :, ~seen_k].abs().max().item() == 0 and ours[3][:, :, ~seen_k].abs().max().item() == 0
