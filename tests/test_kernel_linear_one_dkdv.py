"""``LinearConfig(one_dkdv=True)``: dk and dv in one program per (segment, K/V head) (``kernels.linear._seg_dkv``).

CPU: ``TRITON_INTERPRET=1`` (tests/conftest.py), small shapes. Each case runs the flag on and off on the same inputs
and checks out, dq, dk, dv (and the initial / final state and their gradients where used) against the fp32
step-by-step recurrence and against the flag-off path; the launch record shows which dk/dv kernel ran.
"""

import os

import pytest
import torch
import torch.nn.functional as Fn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attn_zoo.reference import linear_attention_recurrent  # noqa: E402
from kernels.linear import LinearConfig, linear_attention, record_launches  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ON, OFF = LinearConfig(one_dkdv=True), LinearConfig()


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _phi(x, fmap):
    return {"elu1": lambda t: Fn.elu(t) + 1, "relu": torch.relu, None: lambda t: t}[fmap](x.float())


def _run(config, q, k, v, do, fmap, chunk, seg, state=None, ws=None):
    """out, dq, dk, dv (+ S, z, dS0, dz0 with ``state``) of one call, and the kernels it launched."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v) + tuple(state or ())]
    with record_launches() as rec:
        res = linear_attention(*leaves[:3], causal=True, feature_map=fmap, chunk_size=chunk, segment_size=seg,
                               config=config, initial_state=tuple(leaves[3:]) if state else None,
                               output_final_state=state is not None)
        if state:
            out, (st, zt) = res
            loss = (out.float() * do.float()).sum() + (st * ws[0]).sum() + (zt * ws[1]).sum()
            grads = torch.autograd.grad(loss, leaves)
            return (out, st, zt) + grads, set(rec.kernels)
        grads = torch.autograd.grad(res, leaves, do)
    return (res,) + grads, set(rec.kernels)


def _reference(q, k, v, do, fmap, state=None, ws=None):
    leaves = [t.detach().float().clone().requires_grad_() for t in (q, k, v) + tuple(state or ())]
    out, (st, zt) = linear_attention_recurrent(_phi(leaves[0], fmap), _phi(leaves[1], fmap), leaves[2],
                                               initial_state=tuple(leaves[3:]) if state else None)
    if state:
        loss = (out * do.float()).sum() + (st * ws[0]).sum() + (zt * ws[1]).sum()
        return (out, st, zt) + torch.autograd.grad(loss, leaves)
    return (out,) + torch.autograd.grad(out, leaves, do.float())


def _inputs(B, Hq, Hkv, N, D, Dv, dtype, seed, kscale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g) * kscale
    v = torch.randn(B, Hkv, N, Dv, generator=g)
    do = torch.randn(B, Hq, N, Dv, generator=g)
    return [t.to(DEV, dtype) for t in (q, k, v, do)]


@pytest.mark.parametrize(
    "N,Hq,Hkv,D,Dv,chunk,seg,fmap,with_state",
    [
        (70, 2, 2, 16, 32, 16, None, "elu1", False),  # automatic segments (several on CPU's 132 "SMs"), ragged tail
        (200, 4, 2, 16, 24, 32, 64, "elu1", True),  # GQA 4/2, 4 segments, initial + final state
        (130, 4, 1, 32, 16, 16, 48, "relu", False),  # MQA, F > Dv, relu
        (100, 2, 1, 16, 16, 16, 1024, None, True),  # one segment, explicit features, state
    ],
)
def test_fp32_vs_recurrence_and_flag_off(N, Hq, Hkv, D, Dv, chunk, seg, fmap, with_state):
    q, k, v, do = _inputs(1, Hq, Hkv, N, D, Dv, torch.float32, seed=N + Hq)
    if fmap is None:  # explicit (positive) features
        q, k = Fn.elu(q) + 1, Fn.elu(k) + 1
    state = ws = None
    if with_state:
        g = torch.Generator().manual_seed(1)
        state = (torch.rand(1, Hkv, D, Dv, generator=g).to(DEV), (torch.rand(1, Hkv, D, generator=g) + 1).to(DEV))
        ws = (torch.randn(1, Hkv, D, Dv, generator=g).to(DEV), torch.randn(1, Hkv, D, generator=g).to(DEV))
    on, kon = _run(ON, q, k, v, do, fmap, chunk, seg, state, ws)
    off, koff = _run(OFF, q, k, v, do, fmap, chunk, seg, state, ws)
    ref = _reference(q, k, v, do, fmap, state, ws)
    assert "seg_dkv" in kon and "seg_dkdv" not in kon, kon
    assert "seg_dkdv" in koff and "seg_dkv" not in koff, koff
    names = ("out", "S", "z", "dq", "dk", "dv", "dS0", "dz0") if with_state else ("out", "dq", "dk", "dv")
    for name, a, b, r in zip(names, on, off, ref):
        assert torch.isfinite(a).all(), name
        assert rel(a, r) <= 1e-4, (name, rel(a, r))
        assert rel(a, b) <= 1e-5, (name, rel(a, b))


@pytest.mark.parametrize("dtype,kscale", [(torch.bfloat16, 1.0), (torch.bfloat16, 30.0), (torch.float16, 1.0)])
def test_half_within_rounding_of_flag_off(dtype, kscale):
    """16-bit inputs (bf16: 16-bit products, the suffix state rounded once for both of its products; fp16: tf32),
    GQA 4/2, 3 segments: each result's error against the fp32 recurrence within 1.25x of the flag-off path's (+ a
    small floor), and the two paths within a few bf16 / fp16 ulps of each other."""
    q, k, v, do = _inputs(1, 4, 2, 96, 32, 32, dtype, seed=5, kscale=kscale)
    on, kon = _run(ON, q, k, v, do, "elu1", 32, 32)
    off, _ = _run(OFF, q, k, v, do, "elu1", 32, 32)
    ref = _reference(q, k, v, do, "elu1")
    assert "seg_dkv" in kon
    tol = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -9
    for name, a, b, r in zip(("out", "dq", "dk", "dv"), on, off, ref):
        assert torch.isfinite(a).all(), name
        assert rel(a, r) <= 1.25 * rel(b, r) + 1e-3, (name, rel(a, r), rel(b, r))
        assert rel(a, b) <= tol, (name, rel(a, b))


def test_in_loop_feature_map_and_noncausal_fallback():
    """With ``phi_in_loop`` (the map applied in the kernel's loop, phi'(k) from the raw k) the fused program gives
    the flag-off results; non-causal calls run the default kernels under the flag (same results)."""
    q, k, v, do = _inputs(2, 2, 1, 80, 16, 16, torch.float32, seed=9)
    on, kon = _run(ON.replace(phi_in_loop=True), q, k, v, do, "elu1", 16, 32)
    off, _ = _run(OFF.replace(phi_in_loop=True), q, k, v, do, "elu1", 16, 32)
    assert "seg_dkv" in kon
    for name, a, b in zip(("out", "dq", "dk", "dv"), on, off):
        assert rel(a, b) <= 1e-5, (name, rel(a, b))
    res = []
    for cfg in (ON, OFF):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with record_launches() as rec:
            out = linear_attention(*leaves, causal=False, feature_map="elu1", chunk_size=16, config=cfg)
            res.append((out,) + torch.autograd.grad(out, leaves, do))
        assert "seg_dkv" not in rec.kernels and "seg_dkdv" in rec.kernels
    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
        assert rel(a, b) == 0.0, name


def test_doc_ids_refused_and_bad_flag():
    q, k, v, _ = _inputs(1, 2, 2, 40, 16, 16, torch.float32, seed=3)
    doc = torch.zeros(1, 40, dtype=torch.int32, device=DEV)
    doc[:, 20:] = 1
    with pytest.raises(ValueError, match="one_dkdv"):
        linear_attention(q, k, v, feature_map="elu1", chunk_size=16, config=ON, doc_ids=doc)
    with pytest.raises(ValueError, match="one_dkdv"):
        LinearConfig(one_dkdv=1)
