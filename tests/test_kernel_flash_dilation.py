"""Dilation in the exact-attention kernel (``flash_attn(..., dilation=d)``): the element rule adds
``(i' - j) % d == 0`` (``i' = i + Nk - Nq``) on top of causal / window / block-sparse masks, every visited tile
runs masked, and the tiles are still enumerated by the window bounds (passed in positions). Checked against a
dense-masked fp32 PyTorch reference: output and dq / dk / dv, B = 2, GQA, causal and non-causal (CPU:
TRITON_INTERPRET=1, small shapes)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import MaskInfo  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402

pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _allowed(Nq, Nk, causal, left, right, dilation, layout=None, bs=0):
    """Dense ``(Nq, Nk)`` mask of the kernel's element rule."""
    i = torch.arange(Nq).view(-1, 1) + (Nk - Nq)
    j = torch.arange(Nk).view(1, -1)
    ok = torch.ones(Nq, Nk, dtype=torch.bool)
    if causal:
        right = 0 if right is None else min(right, 0)
    if right is not None:
        ok &= j <= i + right
    if left is not None:
        ok &= j >= i - left
    ok &= (i - j) % dilation == 0
    if layout is not None:
        ok &= (i >= 0) & layout[i.clamp(min=0) // bs, j // bs]
    return ok


def _reference(q, k, v, allowed):
    rep = q.shape[1] // k.shape[1]
    s = (q @ repeat_kv(k, rep).transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed.to(q.device), float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ repeat_kv(v, rep)


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)


def _inputs(B, Hq, Hkv, Nq, Nk, D, seed):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEV)  # noqa: E731
    return mk(B, Hq, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, D), mk(B, Hq, Nq, D)


def _check(causal, window, dilation, Nq, Nk, Hq=4, Hkv=2, D=16, layout=None, bs=0, seed=0, **kw):
    from kernels import flash_attn

    left, right = window if window is not None else (None, None)
    allowed = _allowed(Nq, Nk, causal, left, right, dilation, layout, bs)
    q, k, v, do = _inputs(2, Hq, Hkv, Nq, Nk, D, seed)
    if layout is not None:
        mi = MaskInfo(Nq, Nk, False, None, None, layout, bs)
        kw.update(block_layout=layout, block_size=bs, block_table_fn=mi.block_table)
    ours = _grads(lambda a, b, c: flash_attn(a, b, c, causal=causal, window_size=window, dilation=dilation, **kw),
                  q, k, v, do)
    want = _grads(lambda a, b, c: _reference(a, b, c, allowed), q, k, v, do)
    for name, x, y in zip(("out", "dq", "dk", "dv"), ours, want):
        assert torch.isfinite(x).all(), name
        torch.testing.assert_close(x, y, rtol=1e-4, atol=2e-5, msg=name)
    empty = ~allowed.any(1)  # rows that see no key: zero output and zero dq
    assert torch.equal(ours[0][:, :, empty.to(ours[0].device)], torch.zeros_like(ours[0][:, :, empty.to(DEV)]))
    return ours


@pytest.mark.parametrize("causal,window,dilation,Nq,Nk", [
    (True, None, 2, 96, 96),          # causal, every other key (tiles below the diagonal, full without dilation)
    (True, (4 * 3, 0), 3, 50, 50),    # dilated sliding window: 4 dilated keys back, in positions
    (True, (2 * 2, 0), 2, 56, 40),    # more queries than keys: empty top rows
    (False, (6, 6), 3, 40, 56),       # non-causal dilated window, Nk > Nq (offset 16)
    (False, None, 4, 37, 45),         # non-causal, no window, ragged tiles
])
def test_dilated_against_dense_reference(causal, window, dilation, Nq, Nk):
    _check(causal, window, dilation, Nq, Nk, seed=Nq + dilation)


def test_dilated_with_atomic_dq_and_group_split():
    from kernels import FlashConfig

    _check(True, (3 * 2, 0), 2, 48, 48, Hq=4, Hkv=1, seed=5, config=FlashConfig(dq_mode="atomic", dkdv_split=2))


def test_dilated_block_sparse():
    """A block layout (full, partial and empty rows) and dilation 2: the full-first table's full tiles are masked
    too."""
    layout = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0],
                           [1, 0, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    _check(False, None, 2, 96, 96, layout=layout, bs=16, seed=3)


def test_dilation_one_is_the_plain_kernel_and_bad_values_raise():
    """``dilation=1`` runs the non-dilated compile (``DILATED`` off: the same kernels as without the argument);
    dilation > 1 a plan and compile of its own."""
    import kernels.flash as kf
    from kernels import flash_attn

    q, k, v, _ = _inputs(1, 2, 2, 32, 32, 16, seed=1)
    kf.clear_plans()
    a = flash_attn(q, k, v, causal=True)
    b = flash_attn(q, k, v, causal=True, dilation=1)
    assert torch.equal(a, b)
    assert len(kf.launch_plans()) == 1
    flash_attn(q, k, v, causal=True, dilation=2)
    metas = [p.meta["fwd"]["DILATED"] for key, p in kf.launch_plans().items() if key[0] == "fwd"]
    assert sorted(metas) == [False, True]
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="dilation"):
            flash_attn(q, k, v, dilation=bad)
