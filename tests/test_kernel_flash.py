"""Fused Triton exact-attention kernel (kernels/flash/) against the fp32 reference.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1 is set below, before ``kernels`` is
imported; the interpreter is chosen when the kernels are decorated), so the CPU matrix uses small shapes.
With CUDA the same matrix runs compiled, and the ``gpu`` tests add real sizes in bf16 / fp16.

Accuracy rule (FlashAttention's tests): max |kernel - ref| <= 2x (gradients 3x) the max error of a plain PyTorch
implementation in the same dtype, with the fp32 reference ``softmax_attention_reference`` as truth (plus a
tiny absolute floor for fp32, where both errors are at rounding level).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import AttentionSpec, mask_info, softmax_attention_reference  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402

triton = pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _plain_torch(q, k, v, spec):
    """Plain PyTorch attention in the inputs' dtype (scores, softmax and PV products in q.dtype)."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    allowed = mask_info(spec, Nq, Nk).dense(q.device)
    s = (q @ k.transpose(-1, -2)) * spec.scale(D)
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    p = torch.nan_to_num(p, nan=0.0)
    return p @ v


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, device=DEV, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return mk(B, Hq, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, D), mk(B, Hq, Nq, D)


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    return out.detach(), dq, dk, dv


def check_against_reference(spec, B=1, Hq=2, Hkv=2, Nq=64, Nk=64, D=32, dtype=torch.float32, device=DEV, seed=0):
    q, k, v, do = _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, device, seed)
    ours = _grads(lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton"), q, k, v, do)
    ref = _grads(lambda a, b, c: softmax_attention_reference(a, b, c, spec), q.float(), k.float(), v.float(), do.float())
    pt = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), q, k, v, do)
    floor = 2e-5 if dtype == torch.float32 else 1e-4
    for name, o, r, p, mult in zip(("out", "dq", "dk", "dv"), ours, ref, pt, (2, 3, 3, 3)):
        assert o.dtype == dtype and o.shape == r.shape, name
        assert torch.isfinite(o).all(), f"{name} has non-finite values"
        err = (o.float() - r).abs().max().item()
        err_pt = (p.float() - r).abs().max().item()
        scale = max(r.abs().max().item(), 1.0)
        assert err <= mult * err_pt + floor * scale, f"{name}: err {err:.3g} > {mult} x torch err {err_pt:.3g}"
    return ours, ref


# ------------------------------------------------------------------------------------------- CPU matrix
@pytest.mark.parametrize("D", [40, 64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_head_dims(D, causal):
    check_against_reference(AttentionSpec(kind="flash", causal=causal), Nq=70, Nk=70, D=D, seed=D)


@pytest.mark.parametrize("window", [None, (9, 0)], ids=["causal", "window"])
def test_bf16_kernel_matches_the_reference(window):
    """``kernels.flash_attn`` in bf16 (GQA, every gradient) within 2x / 3x plain PyTorch's bf16 error. On the CPU
    Triton's interpreter computes a bf16 ``tl.dot`` wrongly (triton 3.9: outputs ~1e9 off, silently), so there the
    launches run in fp32 and return bf16 (the ``triton`` backend of ``attn_zoo.attention`` still refuses bf16 off
    the GPU); on a GPU the compiled bf16 kernels run."""
    import kernels

    spec = AttentionSpec(kind="flash" if window is None else "sliding_window", causal=True, window_size=window)
    q, k, v, do = _inputs(1, 4, 2, 40, 48, 32, torch.bfloat16, seed=3)
    ours = _grads(lambda a, b, c: kernels.flash_attn(a, b, c, causal=True, window_size=window), q, k, v, do)
    ref = _grads(lambda a, b, c: softmax_attention_reference(a, b, c, spec), *(t.float() for t in (q, k, v, do)))
    pt = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), q, k, v, do)
    for name, o, r, p, mult in zip(("out", "dq", "dk", "dv"), ours, ref, pt, (2, 3, 3, 3)):
        assert o.dtype == torch.bfloat16, name
        err, err_pt = (o.float() - r).abs().max().item(), (p.float() - r).abs().max().item()
        assert err <= mult * err_pt + 1e-4 * max(r.abs().max().item(), 1.0), (name, err, err_pt)


def test_causal_more_queries_than_keys_top_rows_zero():
    spec = AttentionSpec(kind="flash", causal=True)
    (out, dq, dk, dv), _ = check_against_reference(spec, Nq=96, Nk=48, D=32)
    assert torch.equal(out[:, :, :48], torch.zeros_like(out[:, :, :48]))  # rows i' = i - 48 < 0 see nothing
    assert torch.equal(dq[:, :, :48], torch.zeros_like(dq[:, :, :48]))
    assert out[:, :, 48:].abs().sum() > 0
    for t in (dq, dk, dv):
        assert torch.isfinite(t).all()
    q, k, v, _ = _inputs(1, 2, 2, 96, 48, 32, torch.float32)
    _, lse = attn_zoo.attention(q, k, v, spec, backend="triton", return_lse=True)
    assert torch.isneginf(lse[:, :, :48]).all() and torch.isfinite(lse[:, :, 48:]).all()


def test_causal_more_keys_than_queries():
    check_against_reference(AttentionSpec(kind="flash", causal=True), Nq=48, Nk=96, D=32)


def test_non_causal_ragged_and_scale():
    check_against_reference(AttentionSpec(kind="flash", causal=False, softmax_scale=0.3), Nq=37, Nk=83, D=24, Hq=3,
                            Hkv=3)


@pytest.mark.parametrize("W", [1, 16, 23])
def test_window_row_counts(W):
    """window (W-1, 0): with q = 0 every visible key has the same score, so exp(lse) counts the keys."""
    N = 80
    spec = AttentionSpec(kind="sliding_window", causal=True, window_size=(W - 1, 0))
    q = torch.zeros(1, 1, N, 16, device=DEV)
    k = torch.randn(1, 1, N, 16, device=DEV)
    _, lse = attn_zoo.attention(q, k, k, spec, backend="triton", return_lse=True)
    counts = lse.exp().round().long().view(-1).cpu()
    want = torch.minimum(torch.arange(N) + 1, torch.tensor(W))
    assert torch.equal(counts, want)


def test_window_grads_against_reference():
    check_against_reference(AttentionSpec(kind="sliding_window", causal=True, window_size=(20, 0)), Nq=90, Nk=90, D=32)
    check_against_reference(AttentionSpec(kind="sliding_window", causal=False, window_size=(9, 17)), Nq=50, Nk=77,
                            D=32)


def test_window_at_least_n_equals_causal():
    N = 64
    q, k, v, do = _inputs(1, 2, 2, N, N, 32, torch.float32)
    a = _grads(lambda *x: attn_zoo.attention(*x, AttentionSpec(kind="flash", causal=True), backend="triton"),
               q, k, v, do)
    b = _grads(lambda *x: attn_zoo.attention(*x, AttentionSpec(kind="sliding_window", causal=True,
                                                                window_size=(N + 5, 0)), backend="triton"), q, k, v, do)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_fully_empty_rows_window_and_sparse():
    # window (2, 0) causal with Nq > Nk: the first Nq - Nk rows see nothing
    spec = AttentionSpec(kind="sliding_window", causal=True, window_size=(2, 0))
    (out, dq, dk, dv), _ = check_against_reference(spec, Nq=72, Nk=40, D=16)
    assert torch.equal(out[:, :, :32], torch.zeros_like(out[:, :, :32]))
    # non-causal window that lies entirely right of the keys for the last rows: (0, 0) with Nq > Nk is causal-like
    spec = AttentionSpec(kind="sparse", causal=True, block_size=16, num_random_blocks=0, num_global_blocks=0,
                         num_local_blocks=0)
    (out, *_), _ = check_against_reference(spec, Nq=80, Nk=48, D=16)
    assert torch.equal(out[:, :, :32], torch.zeros_like(out[:, :, :32]))


@pytest.mark.parametrize("pattern,causal,Nq,Nk,Hq,Hkv", [
    ("bigbird", True, 100, 100, 4, 2), ("bigbird", False, 64, 96, 2, 2), ("strided", False, 60, 100, 3, 1),
])
def test_block_sparse(pattern, causal, Nq, Nk, Hq, Hkv):
    spec = AttentionSpec(kind="sparse", causal=causal, sparse_pattern=pattern, block_size=16, stride_blocks=2)
    check_against_reference(spec, Nq=Nq, Nk=Nk, Hq=Hq, Hkv=Hkv, D=32)


@pytest.mark.parametrize("Nq,Nk,bs,mode_fwd,mode_dkdv", [
    (100, 100, 32, 2, 2), (64, 96, 32, 2, 2), (80, 96, 32, 1, 2), (100, 100, 16, 1, 1),
])
def test_sparse_aligned_no_gather(Nq, Nk, bs, mode_fwd, mode_dkdv):
    """The setting ``FlashConfig.sparse_aligned_no_gather`` (on by default): when a kernel's tiles lie inside one
    layout block (block size a multiple of both tiles, ``Nk - Nq`` of the query tile) its partial tiles skip the
    per-element layout gather. Out and grads equal the gathering path (switch off) exactly and pass the
    reference check; layouts or offsets that do not align keep the gather (interpreter tiles: forward 32 x 16,
    dK/dV 16 x 32)."""
    import kernels.flash as kf

    spec = AttentionSpec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=bs)
    q, k, v, do = _inputs(1, 4, 2, Nq, Nk, 32, torch.float32, seed=Nq + bs)
    run = lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton")  # noqa: E731
    gather, default = kf.FlashConfig(sparse_aligned_no_gather=False), kf.FlashConfig()
    assert kf.sparse_mode(torch.ones(1), bs, kf.sparse_tiles(32)[0], Nq, Nk, gather) == 1
    with kf.flash_settings(gather):
        base = _grads(run, q, k, v, do)
    f_tile, b_tile = kf.sparse_tiles(32)
    assert kf.sparse_mode(torch.ones(1), bs, f_tile, Nq, Nk, default) == mode_fwd
    assert kf.sparse_mode(torch.ones(1), bs, b_tile, Nq, Nk, default) == mode_dkdv
    assert kf.sparse_mode(None, bs, f_tile, Nq, Nk, default) == 0
    ours, _ = check_against_reference(spec, Nq=Nq, Nk=Nk, Hq=4, Hkv=2, D=32, seed=Nq + bs)
    for name, x, y in zip(("out", "dq", "dk", "dv"), ours, base):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("kind,kw,Nq,Nk,Hq,Hkv", [
    ("flash", dict(causal=True), 96, 48, 4, 2),           # more queries than keys: empty top rows
    ("flash", dict(causal=True), 40, 72, 2, 2),           # ragged tiles, Nk > Nq
    ("sliding_window", dict(window_size=(20, 3)), 70, 70, 4, 1),
    ("sparse", dict(causal=True, sparse_pattern="bigbird", block_size=32), 100, 100, 4, 2),
])
def test_tma_path_equals_pointer_path(kind, kw, Nq, Nk, Hq, Hkv):
    """TMA descriptors for the streamed operands (``FlashConfig(tma=True)`` forces them, also in the interpreter)
    give the pointer-load results: out and every gradient, with q a transposed ``(B, N, H, D)`` view and k every
    other row of a larger buffer (TMA zero-fills rows past the sequence end)."""
    import kernels.flash as kf

    spec = AttentionSpec(kind=kind, **kw)
    D = 32
    q, k, v, do = _inputs(1, Hq, Hkv, Nq, Nk, D, torch.float32, seed=Nq + Nk)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    big = torch.zeros(1, Hkv, 2 * Nk, D, device=DEV)
    big[:, :, ::2] = k
    k = big[:, :, ::2]
    run = lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton")  # noqa: E731
    with kf.flash_settings(tma=False):
        base = _grads(run, q, k, v, do)
    with kf.flash_settings(tma=True) as cfg:
        assert kf.tma_ok(D, D, 1, kind == "sparse", cfg, q, do) and kf.tma_ok(D, D, 1, kind == "sparse", cfg, k, v)
        got = _grads(run, q, k, v, do)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, base):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
    if Nq > Nk and kw.get("causal"):
        assert torch.equal(got[0][:, :, : Nq - Nk], torch.zeros_like(got[0][:, :, : Nq - Nk]))


def test_tma_rules():
    """``tma_ok``: off for non-power-of-two head dims, a non-unit last stride, strides or bases that are not
    16-byte aligned and ``tma=False``; in ``"auto"`` mode also off for block-sparse masks, below
    ``tma_min_pairs`` and off the GPU."""
    import kernels.flash as kf

    x = torch.randn(1, 2, 8, 32)
    on, off, auto = kf.FlashConfig(tma=True), kf.FlashConfig(tma=False), kf.FlashConfig()
    assert kf.tma_ok(32, 32, 1, False, on, x, x)
    assert not kf.tma_ok(40, 64, 1, False, on, x, x)
    assert not kf.tma_ok(32, 32, 1, False, on, x.transpose(2, 3).contiguous().transpose(2, 3), x)  # last stride != 1
    odd = torch.randn(1, 2, 8, 33)[..., :32]  # row stride 33 floats = 132 bytes
    assert not kf.tma_ok(32, 32, 1, False, on, x, odd)
    shifted = torch.randn(1 * 2 * 8 * 32 + 1)[1:].view(1, 2, 8, 32)  # base 4 bytes past an aligned one
    assert shifted.data_ptr() % 16 and not kf.tma_ok(32, 32, 1, False, on, shifted, x)
    assert not kf.tma_ok(32, 32, 1, False, off, x, x)
    assert auto.tma == "auto"
    if x.device.type != "cuda":
        assert not kf.tma_ok(32, 32, 1 << 40, False, auto, x, x)
    xd = x.to(DEV)
    assert not kf.tma_ok(32, 32, 1 << 40, True, auto, xd, xd)
    assert not kf.tma_ok(32, 32, auto.tma_min_pairs - 1, False, auto, xd, xd)
    assert kf.visited_pairs(2, 4, 100, 100, -1, -1) == 2 * 4 * 100 * 100
    assert kf.visited_pairs(1, 1, 100, 100, 9, 0) == 100 * 10  # a window's band, 10 keys a row
    assert kf.visited_pairs(1, 1, 100, 100, -1, 0) == 100 * 101 // 2  # causal: the triangle, diagonal included
    assert kf.visited_pairs(1, 1, 1, 100, -1, 0) == 100  # causal decoding: the last row sees every key
    assert kf.visited_pairs(1, 1, 100, 100, 20, -1) == 100 * 100 - 79 * 80 // 2


SPECS_FOR_PAIRS = [dict(kind="flash", causal=False), dict(kind="flash", causal=True),
                   dict(kind="sliding_window", causal=True, window_size=(3, 0)),
                   dict(kind="sliding_window", causal=False, window_size=(3, 2)),
                   dict(kind="sliding_window", causal=False, window_size=(None, 2)),
                   dict(kind="sliding_window", causal=False, window_size=(5, None)),
                   dict(kind="sliding_window", causal=True, window_size=(5, None))]


@pytest.mark.parametrize("Nq, Nk", [(1, 40), (16, 40), (40, 40), (40, 16), (40, 1), (33, 7), (7, 33)])
@pytest.mark.parametrize("kw", SPECS_FOR_PAIRS, ids=lambda kw: f"{kw['kind']}-{kw['causal']}-{kw.get('window_size')}")
def test_visited_pairs_counts_the_dense_mask(kw, Nq, Nk):
    """``visited_pairs`` (what the ``"auto"`` thresholds of TMA and the Gluon kernels compare) against the dense mask
    of the spec (``mask_info``, bottom-right aligned) with the window arguments ``flash_attn`` derives from it. Dense,
    causal and one-edge windows: exactly the pairs the mask keeps; a window with both edges: its band, ``min(left +
    right + 1, Nk)`` keys for every row that sees a key (never fewer than the mask keeps). Before: a causal call with
    ``Nq > Nk`` counted ``max(1, Nk - Nq // 2)`` keys a row, about one pair per row (``Nq = 4096, Nk = 1024``: 4,096
    pairs instead of 524,800), so such calls stayed below every threshold."""
    from kernels.flash import visited_pairs
    from kernels.flash.api import _window_bounds

    mi = mask_info(AttentionSpec(**kw), Nq, Nk)
    window = None if mi.window_left is None and mi.window_right is None else (mi.window_left, mi.window_right)
    wl, wr = _window_bounds(mi.causal, window)
    dense = mi.dense()
    kept, rows = int(dense.sum()), int(dense.any(1).sum())
    got = visited_pairs(1, 1, Nq, Nk, wl, wr)
    if wl >= 0 and wr >= 0:
        assert got == rows * min(Nk, wl + wr + 1) and got >= kept
    else:
        assert got == kept
    assert visited_pairs(3, 2, Nq, Nk, wl, wr) == 6 * got


def test_window_bounds_drop_an_edge_that_masks_nothing():
    """``flash_attn``'s window edges with the call's ``Nq`` / ``Nk``: ``left >= Nk - 1`` and ``right >= Nq - 1``
    (bottom-right aligned) mask nothing and become unbounded (-1); a narrower edge stays, and without the lengths
    nothing changes."""
    from kernels.flash.api import _window_bounds

    assert _window_bounds(True, (39, 0), 40, 40) == (-1, 0)  # causal
    assert _window_bounds(True, (38, 0), 40, 40) == (38, 0)
    assert _window_bounds(True, (39, 0)) == (39, 0)
    assert _window_bounds(False, (39, 39), 40, 40) == (-1, -1)  # dense
    assert _window_bounds(False, (39, 38), 40, 40) == (-1, 38)
    assert _window_bounds(False, (100, 15), 16, 40) == (-1, -1)  # Nq < Nk: the right edge from Nq - 1
    assert _window_bounds(False, (100, 14), 16, 40) == (-1, 14)
    assert _window_bounds(False, (15, None), 40, 16) == (-1, -1)  # Nq > Nk: the left edge from Nk - 1
    assert _window_bounds(True, None, 1, 40) == (-1, -1)  # one query row: causal keeps every key
    assert _window_bounds(True, None, 2, 40) == (-1, 0)


@pytest.mark.parametrize("Nq, Nk, causal, window, same_as", [
    (40, 40, True, (39, 0), dict(causal=True)),
    (16, 40, False, (60, 15), dict(causal=False)),
    (1, 40, True, None, dict(causal=False)),
])
def test_a_window_as_wide_as_the_sequence_runs_the_kernel_without_it(Nq, Nk, causal, window, same_as):
    """A window that masks nothing at this ``Nq`` / ``Nk`` runs the causal / dense kernel (its launch compiles no
    window edge: ``HAS_LEFT`` / ``HAS_RIGHT`` off), with the same output and gradients bit for bit as that call; one
    key narrower keeps its edge and matches the reference."""
    import kernels.flash as kf

    q, k, v, do = _inputs(1, 2, 2, Nq, Nk, 16, torch.float32, seed=Nq)

    def run(**kw):
        kf.clear_plans()
        got = _grads(lambda a, b, c: kf.flash_attn(a, b, c, **kw), q, k, v, do)
        meta = [p.meta["fwd"] for key, p in kf.launch_plans().items() if key[0] == "fwd"]
        assert len(meta) == 1, list(kf.launch_plans())
        return got, (meta[0]["HAS_LEFT"], meta[0]["HAS_RIGHT"])

    wide, edges = run(causal=causal, window_size=window)
    plain, plain_edges = run(**same_as)
    assert edges == plain_edges == (False, same_as["causal"])
    for a, b in zip(wide, plain):
        assert torch.equal(a, b)
    if window is not None:  # one key narrower on the left: the edge stays, still exact
        narrower = (Nk - 2, window[1])
        got, edges = run(causal=causal, window_size=narrower)
        assert edges[0] is True
        spec = AttentionSpec(kind="sliding_window", causal=causal, window_size=narrower)
        ref = _grads(lambda a, b, c: softmax_attention_reference(a, b, c, spec), q, k, v, do)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_visited_pairs_causal_with_more_queries_than_keys():
    """Causal ``Nq > Nk``: the rows before the first key keep nothing, the last ``Nk`` rows the triangle."""
    from kernels.flash import visited_pairs

    assert visited_pairs(1, 1, 4096, 1024, -1, 0) == 1024 * 1025 // 2
    assert visited_pairs(2, 8, 8192, 4096, -1, 0) == 16 * 4096 * 4097 // 2


@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq"])
def test_tma_build_failure_falls_back_to_pointer_loads(kind, monkeypatch):
    """A TMA build the compiler rejects (ptxas crashed on some loop structures with triton 3.6) is not fatal: the
    launcher warns once per key and uses pointer loads, with the same results, also on later calls (the dK/dV
    launch reads the remembered tile before launching). Errors that are not compiler failures still raise."""
    import kernels.flash as kf

    class Failing:  # stands in for one kernel: TMA builds fail, pointer builds run the real kernel
        def __init__(self, fn, msg):
            self.fn, self.msg, self.calls = fn, msg, []

        def __getitem__(self, grid):
            def launch(*args, **kw):
                self.calls.append(kw["TMA"])
                if kw["TMA"]:
                    raise RuntimeError(self.msg)
                return self.fn[grid](*args, **kw)
            return launch

    q, k, v, do = _inputs(1, 2, 2, 40, 40, 32, torch.float32, seed=3)
    spec = AttentionSpec(kind="flash", causal=True)
    run = lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton")  # noqa: E731
    with kf.flash_settings(tma=False):
        base = _grads(run, q, k, v, do)
    real = kf.KERNELS[kind]
    fake = Failing(real, "PTXAS error: ptxas failed with error code -11")
    monkeypatch.setitem(kf.KERNELS, kind, fake)
    kf.clear_caches()  # remembered candidates and plans of earlier tests
    try:
        with kf.flash_settings(tma=True):
            with pytest.warns(RuntimeWarning, match=f"TMA build of the '{kind}' kernel failed"):
                got = _grads(run, q, k, v, do)
            assert fake.calls == [True, False]
            got2 = _grads(run, q, k, v, do)  # remembered: straight to pointer loads, no second warning
            assert fake.calls == [True, False, False]
            for x, y, z in zip(got, got2, base):
                torch.testing.assert_close(x, z, rtol=1e-5, atol=1e-5)
                assert torch.equal(x, y)
            kf.clear_caches()
            monkeypatch.setitem(kf.KERNELS, kind, Failing(real, "CUDA error: an illegal memory access"))
            with pytest.raises(RuntimeError, match="illegal memory access"):
                _grads(run, q, k, v, do)
    finally:
        kf.clear_caches()  # nothing the fake kernels compiled or failed may outlive the test


def test_strided_views_equal_contiguous():
    B, H, N, D = 1, 2, 50, 40
    q, k, v, do = _inputs(B, H, H, N, N, D, torch.float32)
    spec = AttentionSpec(kind="flash", causal=True)
    q_bnhd = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) storage viewed as (B, H, N, D)
    big = torch.randn(B, H, 2 * N, D, device=DEV)
    big[:, :, ::2] = k
    k_strided = big[:, :, ::2]  # every other row of a larger buffer
    assert not q_bnhd.is_contiguous() and not k_strided.is_contiguous()
    a = _grads(lambda *x: attn_zoo.attention(*x, spec, backend="triton"), q, k, v, do)
    b = _grads(lambda *x: attn_zoo.attention(*x, spec, backend="triton"), q_bnhd, k_strided, v, do.transpose(2, 3)
               .contiguous().transpose(2, 3))
    for x, y in zip(a, b):  # same tiles, same accumulation order: equal up to (at most) last-bit rounding
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        assert x.shape == y.shape


@pytest.mark.parametrize("Hq,Hkv", [(12, 3), (8, 2), (8, 1)])
def test_gqa_grads_equal_group_sum_of_mha(Hq, Hkv):
    rep = Hq // Hkv
    q, k, v, do = _inputs(1, Hq, Hkv, 40, 40, 16, torch.float32, seed=Hq + Hkv)
    spec = AttentionSpec(kind="flash", causal=True)
    out_g, dq_g, dk_g, dv_g = _grads(lambda *x: attn_zoo.attention(*x, spec, backend="triton"), q, k, v, do)
    out_m, dq_m, dk_m, dv_m = _grads(lambda *x: attn_zoo.attention(*x, spec, backend="triton"), q,
                                     repeat_kv(k, rep), repeat_kv(v, rep), do)
    torch.testing.assert_close(out_g, out_m, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dq_g, dq_m, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dk_g, dk_m.view(1, Hkv, rep, 40, 16).sum(2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dv_g, dv_m.view(1, Hkv, rep, 40, 16).sum(2), rtol=1e-5, atol=1e-5)


def test_gqa_against_reference():
    check_against_reference(AttentionSpec(kind="sliding_window", causal=True, window_size=(15, 0)), Hq=6, Hkv=2,
                            Nq=45, Nk=45, D=16)


def test_bad_inputs_raise():
    from kernels import flash_attn

    q = torch.randn(1, 4, 16, 16, device=DEV)
    k = torch.randn(1, 3, 16, 16, device=DEV)
    with pytest.raises(ValueError, match="Hkv"):
        flash_attn(q, k, k)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        attn_zoo.attention(q, k, k, AttentionSpec(kind="flash"), backend="triton")
    with pytest.raises(ValueError, match="head dim"):
        flash_attn(torch.randn(1, 1, 4, 300, device=DEV), torch.randn(1, 1, 4, 300, device=DEV),
                   torch.randn(1, 1, 4, 300, device=DEV))
    with pytest.raises(TypeError, match="dtype"):
        flash_attn(q.double(), q.double(), q.double())
    from attn_zoo.backends.triton_flash import _supports

    assert "float64" in _supports(q.double(), q.double(), q.double(), AttentionSpec(), False)
    assert _supports(q, q, q[..., :8], AttentionSpec(), False) is None  # Dv != D runs (MLA): test_kernel_flash_dv.py
    assert "Dv=300" in _supports(q, q, torch.randn(1, 4, 16, 300, device=DEV), AttentionSpec(), False)


@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_lse_is_differentiable(dq_mode):
    from kernels import flash_settings

    spec = AttentionSpec(kind="flash", causal=True)
    q, k, v, do = _inputs(1, 2, 2, 40, 40, 16, torch.float32)
    dl = torch.randn(1, 2, 40, device=DEV)

    def run(fn, *x):
        x = [t.detach().clone().requires_grad_(True) for t in x]
        out, lse = fn(*x)
        return torch.autograd.grad((out * do).sum() + (lse * dl).sum(), x)

    with flash_settings(dq_mode=dq_mode):
        a = run(lambda *x: attn_zoo.attention(*x, spec, backend="triton", return_lse=True), q, k, v)
    b = run(lambda *x: softmax_attention_reference(*x, spec, return_lse=True), q, k, v)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- sparse tables
# 6 x 6 blocks of 16 tokens, N = 96. With the interpreter tiles (forward / dQ 32 x 16, dK/dV 16 x 32) the rows
# mix full and partial tiles (a full tile after partial ones in index order), query tile 1 (rows 32..63, block
# rows 2-3) visits nothing, and key tile 2 (keys 64..95, block columns 4-5) is seen by no query.
_LAYOUT = torch.tensor([
    [1, 1, 0, 1, 0, 0],
    [1, 1, 1, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
    [1, 0, 1, 1, 0, 0],
    [1, 1, 0, 1, 0, 0],
], dtype=torch.bool)


def _layout_mask_info(N=96):
    from attn_zoo import MaskInfo

    return MaskInfo(N, N, False, None, None, _LAYOUT.clone(), 16)


def test_sparse_tables_full_tiles_first():
    from kernels import build_sparse_tables, sparse_tiles

    mi = _layout_mask_info()
    D = 32
    kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull = build_sparse_tables(mi.block_table, D, "cpu")
    (fm, fn), (bm, bn) = sparse_tiles(D)
    for (idx, cnt, nfull), tb, transpose in (((kv_idx, kv_cnt, kv_nfull), mi.block_table(fm, fn), False),
                                            ((q_idx, q_cnt, q_nfull), mi.block_table(bm, bn), True)):
        for t in (idx, cnt, nfull):
            assert t.dtype == torch.int32
        visited, full = (tb.visited.t(), tb.full.t()) if transpose else (tb.visited, tb.full)
        assert idx.shape[0] == visited.shape[0] == cnt.shape[0] == nfull.shape[0]
        assert sorted(idx[:, 0].tolist()) == list(range(visited.shape[0])), "every tile scheduled once"
        assert (cnt[:-1] >= cnt[1:]).all(), "heaviest rows first"
        for r in range(visited.shape[0]):
            tile, c, nf = int(idx[r, 0]), int(cnt[r]), int(nfull[r])
            row = idx[r, 1:1 + c].tolist()
            want_full = torch.nonzero(full[tile]).view(-1).tolist()
            want_part = torch.nonzero(visited[tile] & ~full[tile]).view(-1).tolist()
            assert c == len(want_full) + len(want_part) and nf == len(want_full)
            assert row == want_full + want_part, (tile, row)
        assert (cnt == 0).any(), "the layout has an empty row"
        assert ((nfull > 0) & (nfull < cnt)).any(), "some row mixes full and partial tiles"
    # a full tile listed after partial ones in index order is moved to the front
    r2 = int((kv_idx[:, 0] == 2).nonzero())
    assert kv_idx[r2, 1:5].tolist() == [0, 3, 1, 2] and int(kv_nfull[r2]) == 2
    assert int(kv_cnt[kv_idx[:, 0] == 1]) == 0 and int(q_cnt[q_idx[:, 0] == 2]) == 0


@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_sparse_custom_layout_grads(dq_mode):
    """Full-first tables with full, partial and empty rows: grads equal the fp32 dense-mask reference."""
    from kernels import flash_attn

    mi = _layout_mask_info()
    q, k, v, do = _inputs(1, 4, 2, 96, 96, 24, torch.float32, seed=3)

    def ref(a, b, c):
        rep = a.shape[1] // b.shape[1]
        s = (a @ repeat_kv(b, rep).transpose(-1, -2)) * 24 ** -0.5
        s = s.masked_fill(~mi.dense(a.device), float("-inf"))
        return torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ repeat_kv(c, rep)

    ours = _grads(lambda a, b, c: flash_attn(a, b, c, block_layout=mi.layout, block_size=16,
                                             block_table_fn=mi.block_table, dq_mode=dq_mode), q, k, v, do)
    want = _grads(ref, q, k, v, do)
    for name, x, y in zip(("out", "dq", "dk", "dv"), ours, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
    out, dq, dk, dv = ours
    assert torch.equal(out[:, :, 32:64], torch.zeros_like(out[:, :, 32:64]))
    assert torch.equal(dq[:, :, 32:64], torch.zeros_like(dq[:, :, 32:64]))
    assert torch.equal(dk[:, :, 64:], torch.zeros_like(dk[:, :, 64:]))
    assert torch.equal(dv[:, :, 64:], torch.zeros_like(dv[:, :, 64:]))


def test_sparse_override_tiles_give_the_same_grads():
    """Forced sparse tiles (a tuning knob: tables are built at them) change nothing but speed."""
    import kernels.flash as kf
    from kernels import flash_attn

    mi = _layout_mask_info()
    q, k, v, do = _inputs(1, 2, 1, 96, 96, 16, torch.float32, seed=5)
    run = lambda cfg: (lambda a, b, c: flash_attn(a, b, c, block_layout=mi.layout, block_size=16,  # noqa: E731
                                                  block_table_fn=mi.block_table, config=cfg))
    base = _grads(run(None), q, k, v, do)
    tile = lambda bm, bn: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=1)  # noqa: E731
    forced_cfg = kf.FlashConfig(sparse_fwd=tile(16, 16), sparse_dq=tile(16, 16), sparse_dkdv=tile(32, 16))
    assert kf.sparse_tiles(16, forced_cfg) == ((16, 16), (32, 16))
    assert kf.sparse_tiles(16) != ((16, 16), (32, 16))  # the default settings are untouched
    with pytest.raises(ValueError, match="must equal the sparse_fwd tiles"):
        kf.FlashConfig(sparse_fwd=tile(16, 16), sparse_dq=tile(32, 16))
    forced = _grads(run(forced_cfg), q, k, v, do)
    for name, x, y in zip(("out", "dq", "dk", "dv"), forced, base):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)


def test_sparse_override_sequence_remembers_configs_per_tiles():
    """A remembered launch config belongs to the sparse tiles it was chosen at: forcing the forward tiles (dQ
    follows them, from the shared table), running, then forcing other tiles must not reuse the first dQ
    config against the second table. Every run equals the reference."""
    import kernels.flash as kf

    spec = AttentionSpec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=32)
    tile = lambda bm, bn: (bm, bn, 4, 1)  # noqa: E731
    for f, b in (((16, 16), (32, 16)), ((64, 32), (64, 64))):
        with kf.flash_settings(sparse_fwd=tile(*f), sparse_dkdv=tile(*b)) as cfg:
            assert kf.sparse_tiles(16) == (f, b) == kf.sparse_tiles(16, cfg)
            check_against_reference(spec, Nq=100, Nk=100, D=16, seed=f[0])


def test_adapter_tables_follow_the_sparse_tiles():
    """The triton adapter's table cache is keyed by the sparse tiles of the call's settings."""
    import kernels.flash as kf

    spec = AttentionSpec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=16)
    q, k, v, do = _inputs(1, 2, 2, 96, 96, 16, torch.float32, seed=9)
    want = softmax_attention_reference(q, k, v, spec)
    before = attn_zoo.attention(q, k, v, spec, backend="triton")
    dq_only = kf.FlashConfig(sparse_dq=dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1))
    assert dq_only.sparse_fwd == dq_only.sparse_dq  # fwd and dq share one table: dq alone sets both
    with kf.flash_settings(dq_only):
        after = attn_zoo.attention(q, k, v, spec, backend="triton")
    for out in (before, after):
        torch.testing.assert_close(out, want.to(out.dtype), rtol=1e-5, atol=1e-5)


def test_bad_tables_and_knobs_raise():
    import kernels.flash as kf
    from kernels import build_sparse_tables, flash_attn

    mi32, mi96 = _layout_mask_info(32), _layout_mask_info(96)
    q = torch.randn(1, 2, 96, 16, device=DEV)
    small = build_sparse_tables(mi32.block_table, 16, DEV)  # tables of a 32-token mask for a 96-token call
    with pytest.raises(ValueError, match="do not fit this call"):
        flash_attn(q, q, q, block_layout=mi96.layout, block_size=16, block_tables=small)
    for bad in (2.5, "2", True, 0, 3):
        with pytest.raises(ValueError, match="dkdv_split"):
            flash_attn(q, q[:, :1], q[:, :1], causal=True, dkdv_split=bad)
    with pytest.raises(ValueError, match="BLOCK_N"):
        kf.FlashConfig(sparse_fwd={"BLOCK_M": 16})
    with pytest.raises(ValueError, match="power of two"):
        kf.FlashConfig(sparse_dkdv=dict(BLOCK_M=24, BLOCK_N=16, num_warps=4, num_stages=1))
    with pytest.raises(TypeError, match="FlashConfig"):
        flash_attn(q, q, q, config={"dq_mode": "atomic"})


def test_block_tables_old_format_rejected():
    from kernels import flash_attn

    q = torch.randn(1, 1, 32, 16, device=DEV)
    mi = _layout_mask_info(32)
    bad = list(mi.block_table(32, 16)[:3]) * 2  # int8 per-entry flags instead of per-row counts
    with pytest.raises(ValueError, match="block_tables"):
        flash_attn(q, q, q, block_layout=mi.layout, block_size=16, block_tables=bad)


# ------------------------------------------------------------------------------------------- MQA / GQA split
def test_choose_dkdv_split():
    from kernels.flash import choose_dkdv_split

    assert choose_dkdv_split(16, 128, 264) == 4  # MQA, N = 16k, B = 1: 128 -> 512 programs
    assert choose_dkdv_split(16, 132, 264) == 2
    assert choose_dkdv_split(16, 1024, 264) == 1  # grid already large
    assert choose_dkdv_split(1, 8, 264) == 1  # MHA: nothing to split
    assert choose_dkdv_split(6, 4, 264) == 2  # largest power of two dividing the group
    assert choose_dkdv_split(3, 4, 264) == 1
    # the default target: 2 programs per SM, 8 for groups of >= 8 heads (132 SMs off the GPU)
    from kernels.flash import resolve_dkdv_split
    cpu = torch.device("cpu")
    assert resolve_dkdv_split(None, 16, 256, cpu) == 8  # MQA: 256 -> 2048 >= 8 * 132 programs
    assert resolve_dkdv_split(None, 4, 1024, cpu) == 1  # GQA-4: 1024 >= 2 * 132 already
    assert resolve_dkdv_split(None, 4, 100, cpu) == 4
    assert resolve_dkdv_split(2, 4, 100, cpu) == 2
    with pytest.raises(ValueError, match="dkdv_split=3"):
        resolve_dkdv_split(3, 4, 100, cpu)


def test_dkdv_split_equals_unsplit():
    """MQA (8 query heads on 1 K/V head): the group split over 2 / 8 programs gives the unsplit gradients."""
    from kernels import FlashConfig, flash_attn, flash_settings

    q, k, v, do = _inputs(1, 8, 1, 40, 56, 16, torch.float32, seed=5)
    f = lambda s: (lambda a, b, c: flash_attn(a, b, c, causal=True, dkdv_split=s))  # noqa: E731
    base = _grads(f(1), q, k, v, do)
    for s in (2, 8):
        got = _grads(f(s), q, k, v, do)
        torch.testing.assert_close(got[0], base[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], base[1], rtol=0, atol=0)  # dQ does not depend on the split
        for x, y in zip(got[2:], base[2:]):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    with flash_settings(dkdv_split=4):  # the split from the settings of a block
        got = _grads(f(None), q, k, v, do)
    for x, y in zip(got[2:], base[2:]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dkdv_split"):
        flash_attn(q, k, v, dkdv_split=3)
    with pytest.raises(ValueError, match="dkdv_split=3 must be an integer >= 1 dividing"):  # at the call
        flash_attn(q, k, v, config=FlashConfig(dkdv_split=3))


# ------------------------------------------------------------------------------------------- atomic dQ
@pytest.mark.parametrize("kind,kw,Nq,Nk,Hq,Hkv,D", [
    ("flash", dict(causal=True), 48, 96, 2, 2, 32),
    ("flash", dict(causal=True), 70, 70, 8, 1, 24),  # MQA: group split over programs, D padded
    ("sliding_window", dict(causal=False, window_size=(9, 17)), 50, 77, 4, 2, 32),
    ("sparse", dict(causal=True, sparse_pattern="bigbird", block_size=16), 100, 100, 4, 2, 32),
])
def test_atomic_dq_against_reference(kind, kw, Nq, Nk, Hq, Hkv, D):
    from kernels import flash_settings

    with flash_settings(dq_mode="atomic"):
        check_against_reference(AttentionSpec(kind=kind, **kw), Nq=Nq, Nk=Nk, Hq=Hq, Hkv=Hkv, D=D)


@pytest.mark.parametrize("kw, msg", [
    (dict(causal="no"), r"causal='no' is not supported; allowed values: True, False"),
    (dict(causal=1), r"causal=1 is not supported; allowed values: True, False"),
    (dict(causal=None), r"causal=None is not supported"),
    (dict(softmax_scale=0.0), r"softmax_scale=0.0 is not supported; allowed values: None .* or a finite float > 0"),
    (dict(softmax_scale=-0.5), r"softmax_scale=-0.5 is not supported"),
    (dict(softmax_scale=float("nan")), r"softmax_scale=nan is not supported"),
    (dict(softmax_scale=float("inf")), r"softmax_scale=inf is not supported"),
    (dict(softmax_scale="0.25"), r"softmax_scale='0.25' is not supported"),
    (dict(softmax_scale=True), r"softmax_scale=True is not supported"),
    (dict(softmax_scale=torch.tensor(0.25)), r"softmax_scale=tensor\(0.2500\) is not supported"),
    (dict(window_size=(True, 0)), r"window_size left=True must be an integer >= 0 or None"),
    (dict(window_size=(4, -1)), r"window_size right=-1 must be an integer >= 0 or None"),
    (dict(window_size=(2.5, 0)), r"window_size left=2.5 must be"),
    (dict(window_size=4), r"window_size must be a pair \(left, right\), got 4"),
    (dict(window_size=(1, 2, 3)), r"window_size must be a pair"),
    (dict(return_lse="yes"), r"return_lse='yes' is not supported; allowed values: True, False"),
    (dict(return_lse=1), r"return_lse=1 is not supported"),
    (dict(block_size="x"), r"block_size='x' is not supported; allowed values: an integer >= 1 with a block_layout"),
    (dict(block_size=-1), r"block_size=-1 is not supported"), (dict(block_size=2.5), r"block_size=2.5 is not"),
    (dict(block_size=True), r"block_size=True is not supported"),
    (dict(dilation=0), r"dilation=0 must be an integer >= 1"), (dict(dilation=True), r"dilation=True must be"),
    (dict(deterministic="yes"), r"deterministic='yes' must be a bool"),
    (dict(dq_mode="fused"), r"dq_mode='fused' is not supported; allowed values: separate, atomic"),
])
def test_flash_attn_refuses_bad_scalar_arguments_before_any_launch(kw, msg, monkeypatch):
    """causal="no" (a truthy string) used to run as causal. Every scalar argument of flash_attn is checked on
    the host before the autograd function (so before any launch): a ValueError naming the argument and its allowed
    values (dilation, deterministic, dq_mode: the checks that existed, kept)."""
    import kernels.flash.api as api
    from kernels import flash_attn

    def no_launch(*a):
        raise AssertionError("reached the kernels")

    monkeypatch.setattr(api._FlashFn, "apply", no_launch)
    q = torch.zeros(1, 1, 16, 16, device=DEV)
    with pytest.raises(ValueError, match=msg):
        flash_attn(q, q, q, **kw)


def test_flash_attn_still_takes_numpy_scales_and_int_windows():
    """What the checks keep: a NumPy float32 scale (a config value) runs as the same float, window ints, None."""
    np = pytest.importorskip("numpy")
    from kernels import flash_attn

    q, k, v, _ = _inputs(1, 1, 1, 16, 16, 16, torch.float32, seed=4)
    want = flash_attn(q, k, v, causal=True, window_size=(4, None), softmax_scale=0.5)
    assert torch.equal(flash_attn(q, k, v, causal=True, window_size=[4, None], softmax_scale=np.float32(0.5)), want)
    assert not torch.equal(flash_attn(q, k, v, causal=True, window_size=(4, None), softmax_scale=0.25), want)


def test_dq_mode_errors_and_the_backward_uses_the_forward_settings():
    """Bad settings raise at the call; the backward runs with the settings its forward was given, whatever the
    settings are when it runs (nothing is read at backward time)."""
    import kernels.flash as kf
    from kernels import FlashConfig, flash_attn, flash_settings

    q = torch.randn(1, 1, 16, 16, device=DEV)
    with pytest.raises(ValueError, match="dq_mode"):
        flash_attn(q, q, q, dq_mode="fused")
    with pytest.raises(ValueError, match="dq_mode"):
        FlashConfig(dq_mode="fused")
    with pytest.raises(ValueError, match="deterministic"):
        flash_attn(q, q, q, dq_mode="atomic", deterministic=True)
    with pytest.raises(ValueError, match="deterministic"):
        flash_attn(q, q, q, config=FlashConfig(dq_mode="atomic"), deterministic=True)
    flash_attn(q, q, q, deterministic=True)
    kf.clear_plans()
    x = q.clone().requires_grad_(True)
    with flash_settings(dq_mode="atomic"):
        out = flash_attn(x, q, q)
    with flash_settings(dq_mode="separate"):
        out.sum().backward()
    bwd = [p for key, p in kf.launch_plans().items() if key[0] == "bwd"]
    assert len(bwd) == 1 and bwd[0].meta["atomic"]
    assert kf.current_flash_config() == FlashConfig()  # every block restored the settings


# ------------------------------------------------------------------------------------------- GPU, real sizes
GPU_CASES = [
    ("flash", dict(causal=False), 1024, 1024, 16, 16, 64),
    ("flash", dict(causal=True), 1024, 1024, 16, 16, 128),
    ("flash", dict(causal=True), 2048, 1000, 8, 8, 128),
    ("flash", dict(causal=True), 1000, 2048, 8, 8, 80),
    ("flash", dict(causal=True), 1000, 1000, 12, 3, 40),
    ("flash", dict(causal=False), 777, 777, 8, 1, 96),
    ("sliding_window", dict(causal=True, window_size=(255, 0)), 2048, 2048, 8, 2, 128),
    ("sliding_window", dict(causal=False, window_size=(100, 37)), 1500, 1300, 8, 8, 64),
    ("sparse", dict(causal=True, block_size=64), 2048, 2048, 8, 8, 128),
    ("sparse", dict(causal=False, block_size=128, sparse_pattern="strided"), 2048, 2048, 8, 4, 64),
    ("flash", dict(causal=True), 512, 512, 4, 4, 256),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind,kw,Nq,Nk,Hq,Hkv,D,dtype", [c + (torch.bfloat16,) for c in GPU_CASES]
                         + [c + (torch.float16,) for c in GPU_CASES[1:11:3]])
def test_gpu_real_sizes(kind, kw, Nq, Nk, Hq, Hkv, D, dtype):
    check_against_reference(AttentionSpec(kind=kind, **kw), B=2, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, dtype=dtype)


@pytest.mark.parametrize("return_lse", [False, True])
def test_custom_op_path_matches_eager_path(return_lse, monkeypatch):
    """flash_attn runs an autograd.Function eagerly and the torch.library custom ops under torch.compile; both
    give the same out, lse and grads (custom ops forced here by faking ``is_compiling``), with a window."""
    from kernels import flash_attn

    q, k, v, do = _inputs(1, 4, 2, 40, 40, 16, torch.float32)

    def run(a, b, c):
        res = flash_attn(a, b, c, causal=True, window_size=(9, None), return_lse=return_lse)
        if return_lse:  # a loss through lse too: its gradient (dlse) reaches the backward
            return res[0] + res[1][..., None].sin()
        return res

    eager = _grads(run, q, k, v, do)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    op = _grads(run, q, k, v, do)
    for name, x, y in zip(("out", "dq", "dk", "dv"), eager, op):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_torch_compile_traces_custom_op():
    from kernels import flash_attn

    q, k, v, do = _inputs(2, 8, 2, 512, 512, 64, torch.bfloat16)
    f = torch.compile(lambda a, b, c: flash_attn(a, b, c, causal=True), fullgraph=True)
    a = _grads(f, q, k, v, do)
    b = _grads(lambda a_, b_, c_: flash_attn(a_, b_, c_, causal=True), q, k, v, do)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_no_quadratic_memory():
    """Causal window at N = 32k: peak extra memory stays O(N * D) (an N x N fp32 tile alone would be 4 GiB)."""
    B, H, N, D = 1, 4, 32768, 128
    q, k, v, do = _inputs(B, H, H, N, N, D, torch.bfloat16)
    spec = AttentionSpec(kind="sliding_window", causal=True, window_size=(1023, 0))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = attn_zoo.attention(q, k, v, spec, backend="triton")
    out.backward(do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 16 * B * H * N * D * 2, extra


def test_host_helpers_match_triton():
    """kernels._host (plain-Python launch arithmetic) agrees with triton.cdiv / triton.next_power_of_2."""
    import triton

    from kernels._host import cdiv, next_pow2

    for n in list(range(1, 300)) + [4095, 4096, 4097, 65535, 65537, 2 ** 31 - 1]:  # sizes are >= 1
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 16, 64, 128):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)


# ------------------------------------------------------------------------------------------- batch > 1, GQA loop
@pytest.mark.parametrize("kind,kw", [("flash", dict(causal=True)), ("sliding_window", dict(causal=True, window_size=(9, 0))),
                                     ("sparse", dict(causal=True, block_size=16, sparse_pattern="bigbird"))])
def test_batch_two_gqa_against_reference(kind, kw):
    """B = 2 with GQA 4:1 and the dK/dV group loop over all 4 heads in one program (split 1): a kernel that reads
    batch 0's rows (lse, delta, K/V) for every batch, or drops a head of the group loop, fails here."""
    from kernels import flash_settings

    with flash_settings(dkdv_split=1):
        check_against_reference(AttentionSpec(kind=kind, **kw), B=2, Hq=4, Hkv=1, Nq=48, Nk=48, D=16, seed=7)


def test_dlse_term_of_delta():
    """A loss on lse alone: its gradient is ``dlse * softmax``, which only the ``-dlse`` term of delta carries."""
    from kernels import flash_attn

    q, k, v, _ = _inputs(2, 2, 2, 24, 24, 16, torch.float32, seed=3)
    w = torch.randn(2, 2, 24, generator=torch.Generator().manual_seed(4)).to(DEV)

    def grads(fn):
        a, b = (t.detach().clone().requires_grad_(True) for t in (q, k))
        return torch.autograd.grad((fn(a, b) * w).sum(), (a, b))

    ours = grads(lambda a, b: flash_attn(a, b, v, causal=True, return_lse=True)[1])
    spec = AttentionSpec(kind="flash", causal=True)
    ref = grads(lambda a, b: softmax_attention_reference(a, b, v, spec, return_lse=True)[1])
    for x, y in zip(ours, ref):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- launch plans
def test_launch_plans_cached_per_signature():
    """A repeated call reuses its launch plan; another stride pattern or alignment gets its own; outputs and
    gradients come back stored as (B, N, H, D) (free reshape to (B, N, H * D)) and stay right on every path."""
    import kernels.flash as kf

    kf.clear_plans()
    spec = AttentionSpec(kind="flash", causal=True)
    q, k, v, do = _inputs(1, 2, 2, 32, 32, 16, torch.float32, seed=11)
    ref = _grads(lambda a, b, c: softmax_attention_reference(a, b, c, spec), q, k, v, do)
    f = lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="triton")  # noqa: E731
    first = _grads(f, q, k, v, do)
    n = len(kf.launch_plans())
    assert n == 2  # one forward and one backward plan
    again = _grads(f, q, k, v, do)
    assert len(kf.launch_plans()) == n
    for x, y, r in zip(first, again, ref):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
        torch.testing.assert_close(x, r, rtol=1e-4, atol=2e-5)
    out = first[0]
    assert out.transpose(1, 2).is_contiguous(), "outputs are stored as (B, N, H, D)"
    # (B, N, H, D) views as inputs: new strides, a new plan, same values
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    for x, r in zip(_grads(f, qt, kt, vt, do), ref):
        torch.testing.assert_close(x, r, rtol=1e-4, atol=2e-5)
    assert len(kf.launch_plans()) == n + 2
    # a 4-byte offset: misaligned for Triton's 16-byte pointer specialisation, its own plan
    buf = torch.randn(q.numel() + 1, device=DEV)
    qm = buf[1:].view_as(q).copy_(q)
    assert qm.data_ptr() % 16
    torch.testing.assert_close(f(qm, k, v), ref[0], rtol=1e-4, atol=2e-5)  # _grads would clone (realign) it
    assert len(kf.launch_plans()) == n + 3
    # other settings: a plan of their own (the config is part of the key), the same values
    torch.testing.assert_close(attn_zoo.attention(q, k, v, spec, backend="triton"), ref[0], rtol=1e-4, atol=2e-5)
    assert len(kf.launch_plans()) == n + 3
    with kf.flash_settings(tma=False):
        torch.testing.assert_close(attn_zoo.attention(q, k, v, spec, backend="triton"), ref[0], rtol=1e-4, atol=2e-5)
    assert len(kf.launch_plans()) == n + 4
    kf.clear_plans()
    assert not kf.launch_plans()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind,kw,N,Hq,Hkv", [("flash", dict(causal=True), 1024, 8, 2),
                                              ("flash", dict(causal=True), 4096, 16, 16),  # TMA-sized
                                              ("sliding_window", dict(causal=True, window_size=(255, 0)), 2048, 8, 8),
                                              ("sparse", dict(causal=True, block_size=128, sparse_pattern="bigbird"),
                                               2048, 8, 8)])
def test_gpu_compiled_launches_on_fresh_inputs(kind, kw, N, Hq, Hkv):
    """After the first call a plan launches its compiled kernels directly: three more calls on fresh random inputs
    (same signature) must each match the reference, and the plan's kernels must be the direct launches."""
    import kernels.flash as kf
    from kernels._host import CompiledLaunch

    kf.clear_plans()
    calls = []
    orig = CompiledLaunch.__call__
    CompiledLaunch.__call__ = lambda self, *a: (calls.append(1), orig(self, *a))[1]
    try:
        spec = AttentionSpec(kind=kind, **kw)
        # the Triton plan's four launches: "auto" may take Gluon's forward, and on Hopper at TMA-sized shapes takes the
        # Gluon dK / dV kernel (launched by Gluon, not a CompiledLaunch), which left 6 of the 12 counted
        with kf.flash_settings(fwd_impl="triton", bwd_impl="triton"):
            for seed in range(4):
                check_against_reference(spec, B=2, Hq=Hq, Hkv=Hkv, Nq=N, Nk=N, D=128, dtype=torch.bfloat16,
                                        seed=100 + seed)
    finally:
        CompiledLaunch.__call__ = orig
    fast = [p.fast for p in kf.launch_plans().values()]
    assert fast and all(v is not None for f in fast for v in f.values()), fast
    assert len(calls) >= 3 * 4, f"the plans' compiled launches ran {len(calls)} times"  # 3 calls x 4 kernels


def test_compiled_launch_steps_aside_for_launch_hooks():
    """Launch hooks (profilers) see every launch: while one is installed the plans use Triton's own path.
    Triton keeps hooks in ``HookChain`` objects that are never ``None``: an empty chain means no hook."""
    from kernels._host import CompiledLaunch, _hook_set

    assert not _hook_set(None)
    knobs = pytest.importorskip("triton.knobs")
    chain = knobs.runtime.launch_enter_hook
    if chain is None or not hasattr(chain, "add"):
        pytest.skip("this Triton has no HookChain")
    assert CompiledLaunch.ready()
    hook = lambda *a: None  # noqa: E731
    chain.add(hook)
    try:
        assert not CompiledLaunch.ready()
    finally:
        chain.remove(hook)
    assert CompiledLaunch.ready()
