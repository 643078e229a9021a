"""The Taylor (Based) map on the chunked ``triton`` backend through its symmetric features (issue 30, item 3).

``phi(q) . phi(k) = 1 + s + s^2 / 2`` (``s = q.k / sqrt(D)``) has a symmetric quadratic block, so
:func:`attn_zoo.feature_maps.taylor_symmetric_features` (``1 + D + D (D + 1) / 2`` features: 153 at ``D = 16``) gives
the same kernel value as the full map's ``1 + D + D^2`` and fits :mod:`kernels.linear`'s 256-feature kernel up to
``D = 21``. Checked here: the features' dot products and gradients, the state conversions the decode path uses,
the chunked path's outputs and every gradient against the fp32 reference (causal, non-causal, GQA, ``Nq != Nk``,
documents; fp32 and the bf16 FlashAttention rule of tests/test_kernel_linear.py), the refusal past ``D = 21``,
prefill / decode state consistency, and ``auto``'s choice by length. CPU: the Triton interpreter, small shapes.
"""

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attn_zoo import AttentionSpec, attention  # noqa: E402
from attn_zoo.feature_maps import (  # noqa: E402
    apply_feature_map, taylor_state_from_symmetric, taylor_state_to_symmetric, taylor_symmetric_dim,
    taylor_symmetric_features, taylor_symmetric_max_head_dim)
from attn_zoo.reference import linear_attention_reference  # noqa: E402
from tests.test_kernel_linear import DEV, _grads, _inputs, _plain_torch, rel  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TAYLOR = dict(kind="linear", feature_map="taylor")


# ------------------------------------------------------------------------------------------- the features
@pytest.mark.parametrize("D", [1, 2, 7, 16, 21])
def test_symmetric_features_give_the_taylor_kernel(D):
    """fp64: ``phi_sym(q) . phi_sym(k) = 1 + s + s^2 / 2`` and equals the full map's dot product; the width is
    ``1 + D + D (D + 1) / 2``; the features are [1, x / D^(1/4), ...] in that order."""
    g = torch.Generator().manual_seed(D)
    q = torch.randn(2, 3, 11, D, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(2, 3, 13, D, generator=g, dtype=torch.float64) * 1.5
    fq, fk = taylor_symmetric_features(q), taylor_symmetric_features(k)
    assert fq.shape == (2, 3, 11, taylor_symmetric_dim(D)) and fq.dtype == torch.float64
    assert taylor_symmetric_dim(D) == 1 + D + D * (D + 1) // 2
    s = q @ k.transpose(-1, -2) / D ** 0.5
    dots = fq @ fk.transpose(-1, -2)
    torch.testing.assert_close(dots, 1 + s + s * s / 2, rtol=1e-12, atol=1e-12)
    pk = apply_feature_map(k, "taylor", is_query=False)
    full = apply_feature_map(q, "taylor", is_query=True) @ pk.transpose(-1, -2)
    torch.testing.assert_close(dots, full, rtol=1e-12, atol=1e-12)
    assert (fq[..., 0] == 1).all()
    torch.testing.assert_close(fq[..., 1:1 + D], q * D ** -0.25, rtol=0, atol=1e-15)


def test_the_largest_head_dim_that_fits_256_features():
    assert [taylor_symmetric_dim(d) for d in (16, 20, 21, 22)] == [153, 231, 253, 276]
    assert [taylor_symmetric_max_head_dim(f) for f in (256, 275, 276)] == [21, 21, 22]
    from attn_zoo.backends.triton_linear import KERNEL_MAX_DIM, TAYLOR_MAX_HEAD_DIM
    from kernels.linear import MAX_DIM

    assert KERNEL_MAX_DIM == MAX_DIM and TAYLOR_MAX_HEAD_DIM == 21


def test_symmetric_features_gradients():
    """The hand-written backward: fp64 gradcheck, and the gradients of a loss on the kernel values equal those
    through the full map (autograd on plain ops)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(taylor_symmetric_features, (x,))
    q = torch.randn(1, 2, 9, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 7, 16, generator=g, dtype=torch.float64)
    w = torch.randn(1, 2, 9, 7, generator=g, dtype=torch.float64)

    def kernel_grads(phi):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        ((phi(qq, True) @ phi(kk, False).transpose(-1, -2)) * w).sum().backward()
        return qq.grad, kk.grad

    sym = kernel_grads(lambda x, is_q: taylor_symmetric_features(x))
    full = kernel_grads(lambda x, is_q: apply_feature_map(x, "taylor", is_query=is_q))
    for a, b in zip(sym, full):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_symmetric_features_are_fp32_math_rounded_once(dtype):
    """16-bit inputs: the features are the fp32 features of the (exact) upcast input, rounded once to the input
    dtype, as :func:`apply_feature_map` does; the gradient comes back in the input dtype."""
    x = torch.randn(2, 3, 10, 16, generator=torch.Generator().manual_seed(2)).to(dtype).requires_grad_()
    f = taylor_symmetric_features(x)
    assert f.dtype == dtype
    assert torch.equal(f, taylor_symmetric_features(x.detach().float()).to(dtype))
    f.float().square().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_symmetric_features_refuse_bad_input():
    with pytest.raises(ValueError, match="floating-point"):
        taylor_symmetric_features(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="D >= 1"):
        taylor_symmetric_features(torch.ones(2, 0))


# ------------------------------------------------------------------------------------------- state conversions
@pytest.mark.parametrize("D", [1, 3, 16])
def test_state_conversions_are_exact(D):
    """A state summed from full features maps to the one summed from symmetric features and back (exactly, to
    rounding); any full-space state keeps its readout ``phi(q) . S`` in symmetric space; the round trip is the
    identity on symmetric states."""
    g = torch.Generator().manual_seed(D)
    k = torch.randn(2, 3, 17, D, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 17, 5, generator=g, dtype=torch.float64)
    q = torch.randn(2, 3, 4, D, generator=g, dtype=torch.float64)
    ff, fs = apply_feature_map(k, "taylor", is_query=False), taylor_symmetric_features(k)
    S_full, z_full = ff.transpose(-1, -2) @ v, ff.sum(2)
    S_sym, z_sym = fs.transpose(-1, -2) @ v, fs.sum(2)
    for got, want in zip(taylor_state_to_symmetric(S_full, z_full, D), (S_sym, z_sym)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for got, want in zip(taylor_state_from_symmetric(S_sym, z_sym, D), (S_full, z_full)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    R, r = torch.randn_like(S_full), torch.randn_like(z_full)  # not symmetric: the readout is what must survive
    Rs, rs = taylor_state_to_symmetric(R, r, D)
    pq_full, pq_sym = apply_feature_map(q, "taylor", is_query=True), taylor_symmetric_features(q)
    torch.testing.assert_close(pq_sym @ Rs, pq_full @ R, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((pq_sym * rs[:, :, None]).sum(-1), (pq_full * r[:, :, None]).sum(-1), rtol=1e-12,
                               atol=1e-12)
    back = taylor_state_to_symmetric(*taylor_state_from_symmetric(Rs, rs, D), D)
    torch.testing.assert_close(back[0], Rs, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="taylor_state_to_symmetric"):
        taylor_state_to_symmetric(S_sym, z_sym, D + 1)
    with pytest.raises(ValueError, match="taylor_state_from_symmetric"):
        taylor_state_from_symmetric(S_sym, z_sym, D + 1)


# ------------------------------------------------------------------------------------------- the chunked path
@pytest.mark.parametrize(
    "Hq,Hkv,Nq,Nk,D,Dv,causal",
    [
        (2, 1, 70, 70, 16, 24, True),   # GQA, several 16-token chunks and a partial one, Dv != D
        (2, 2, 20, 50, 16, 16, True),   # Nk > Nq: the first 30 keys folded into the initial state
        (2, 1, 50, 20, 16, 16, True),   # Nq > Nk: the top 30 rows see nothing and are 0
        (4, 2, 40, 65, 16, 12, False),  # non-causal, Nq != Nk, GQA
        (2, 1, 33, 33, 21, 16, True),   # D = 21: 253 features, the limit
    ],
)
def test_fp32_outputs_and_every_gradient_vs_reference(Hq, Hkv, Nq, Nk, D, Dv, causal):
    spec = AttentionSpec(causal=causal, chunk_size=16, **TAYLOR)
    q, k, v, do = _inputs(1, Hq, Hkv, Nq, Nk, D, Dv, seed=Nq + Nk + D)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.shape == r.shape and x.dtype == torch.float32, name
        assert rel(x, r) <= 2e-5, (name, rel(x, r))
    if causal and Nq > Nk:
        assert (got[0][:, :, : Nq - Nk] == 0).all()


@pytest.mark.parametrize("causal", [True, False])
def test_documents_outputs_and_every_gradient_vs_reference(causal):
    """doc_ids (a length-1 document, a boundary inside a chunk, GQA): the state restarts per document."""
    spec = AttentionSpec(causal=causal, chunk_size=16, **TAYLOR)
    q, k, v, do = _inputs(2, 2, 1, 40, 40, 16, 16, seed=11)
    docs = torch.tensor([[0] * 7 + [1] + [2] * 17 + [5] * 15, [3] * 40], device=DEV)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton", doc_ids=docs), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec, doc_ids=docs), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel(x, r) <= 2e-5, (name, rel(x, r))


@pytest.mark.parametrize("causal", [True, False])
def test_bf16_flash_attention_rule(causal):
    """bf16: error against the fp32 reference at most 2x (gradients 3x) that of plain bf16 PyTorch on the full map."""
    spec = AttentionSpec(causal=causal, chunk_size=16, **TAYLOR)
    q, k, v, do = _inputs(1, 2, 1, 48, 48, 16, 16, seed=5)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.bfloat16() for t in (q, k, v, do)]
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *lo)
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), *lo)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref, plain)):
        assert x.dtype == torch.bfloat16, name
        assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (name, rel(x, r), rel(p, r))


def test_refused_past_d21_with_the_limit_named():
    from attn_zoo.backends.triton_linear import triton_linear
    from attn_zoo.registry import get_backends

    sup = get_backends("linear")["triton"].supports
    spec = AttentionSpec(**TAYLOR)
    ok, big = (torch.zeros(1, 1, 4, d, device=DEV) for d in (21, 22))
    assert sup(ok, ok, ok, spec, False) is None
    why = sup(big, big, big, spec, False)
    assert "276" in why and "256" in why and "D=21" in why, why
    with pytest.raises(ValueError, match=r"backend='triton' cannot run this input.*276.*256.*up to D=21"):
        attention(big, big, big, spec, backend="triton")
    with pytest.raises(ValueError, match=r"q.shape\[-1\].*up to D=21"):  # the implementation called directly
        triton_linear(big, big, big, spec)
    assert sup(big, big, big, AttentionSpec(kind="linear", feature_map="elu1"), False) is None  # F = D for elu1


# ------------------------------------------------------------------------------------------- prefill / decode
def test_triton_prefill_keeps_the_state_in_the_full_maps_features():
    """linear_prefill on triton (symmetric features in the kernel) returns the full map's state (F = 273 at D = 16),
    equal to the torch prefill's; a state from either backend continues on the other; decode after it matches the
    reference's last rows."""
    from attn_zoo.decode import LinearState, linear_decode, linear_prefill

    spec = AttentionSpec(causal=True, chunk_size=16, **TAYLOR)
    q, k, v, _ = _inputs(1, 2, 1, 45, 45, 16, 16, seed=21)
    want = attention(q, k, v, spec, backend="reference")
    o1, st_t = linear_prefill(q[:, :, :30], k[:, :, :30], v[:, :, :30], spec, backend="triton")
    _, st_p = linear_prefill(q[:, :, :30], k[:, :, :30], v[:, :, :30], spec, backend="torch")
    assert st_t.S.shape == (1, 1, 273, 16) and st_t.z.shape == (1, 1, 273) and st_t.n == 30
    assert isinstance(st_t, LinearState) and st_t.S.shape == LinearState.for_spec(spec, 1, 1, 16).S.shape
    assert rel(st_t.S, st_p.S) <= 1e-5 and rel(st_t.z, st_p.z) <= 1e-5
    torch.testing.assert_close(o1, want[:, :, :30], rtol=1e-4, atol=1e-4)
    o2, st2 = linear_prefill(q[:, :, 30:44], k[:, :, 30:44], v[:, :, 30:44], spec, st_p, backend="triton")
    torch.testing.assert_close(o2, want[:, :, 30:44], rtol=1e-4, atol=1e-4)
    o3, _ = linear_decode(q[:, :, 44:], k[:, :, 44:], v[:, :, 44:], st2, spec)
    torch.testing.assert_close(o3, want[:, :, 44:], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- auto
def test_prefers_parallel_by_length():
    from attn_zoo.backends.triton_taylor import TAYLOR_CHUNKED_MIN_N, prefers_parallel

    n = TAYLOR_CHUNKED_MIN_N
    assert prefers_parallel(n - 1, n - 1) and not prefers_parallel(n, n)
    assert prefers_parallel(1, 10 * n)  # a few queries on a long context: the quadratic form is ~Nk
    assert not prefers_parallel(n, 4 * n) and prefers_parallel(n // 2, 4 * n)  # harmonic mean 1.6 n / 0.89 n
    assert prefers_parallel(100, 100, min_n=101) and not prefers_parallel(100, 100, min_n=100)


@pytest.fixture
def cuda_free_auto(monkeypatch):
    """auto as on a GPU, on the CPU: triton, parallel and taylor_chunk not limited to CUDA tensors (the interpreter
    runs them)."""
    from attn_zoo import registry

    registry._ensure_builtin()  # the built-in backends registered (run alone, nothing else has imported them)
    regs = registry._REGISTRY["linear"]
    for name in ("triton", "parallel", "taylor_chunk"):
        monkeypatch.setitem(regs, name, dataclasses.replace(regs[name], devices=None))
    registry.forget_derived()
    yield
    monkeypatch.undo()
    registry.forget_derived()


def _auto_picks(spec, lengths, tol):
    """``{N: the backend auto picks}`` for causal inputs of each length, each run through ``attention`` and checked
    against the reference."""
    from attn_zoo.functional import resolve_backend

    pick = {}
    for N in lengths:
        q, k, v, _ = _inputs(1, 2, 1, N, N, 16, 16, seed=N)
        pick[N] = resolve_backend(q, k, v, spec).name
        out = attention(q, k, v, spec)  # runs what auto picked
        torch.testing.assert_close(out, linear_attention_reference(q, k, v, spec), rtol=tol, atol=tol)
    return pick


def test_auto_picks_parallel_below_the_threshold_and_triton_from_it(cuda_free_auto, monkeypatch):
    import attn_zoo.backends.triton_taylor as tt
    from attn_zoo.functional import resolve_backend
    from attn_zoo.registry import auto_order, get_backends

    monkeypatch.setattr(tt, "TAYLOR_CHUNKED_MIN_N", 32)  # small shapes for the interpreter
    spec = AttentionSpec(causal=True, chunk_size=16, **TAYLOR)
    assert _auto_picks(spec, (31, 32), tol=1e-4) == {31: "parallel", 32: "triton"}
    q31 = torch.zeros(1, 1, 31, 16, device=DEV)
    order = [b.name for b in auto_order(get_backends("linear"), (q31, q31, q31, spec))]
    assert order[:3] == ["parallel", "triton", "taylor_chunk"]
    assert [b.name for b in auto_order(get_backends("linear"))][:3] == ["triton", "parallel", "taylor_chunk"]
    # where the preferred form refuses the input, auto takes the next one: eps below float32's normal range
    q, k, v, _ = _inputs(1, 2, 1, 20, 20, 16, 16)
    assert resolve_backend(q, k, v, spec.replace(eps=1e-40)).name == "triton"
    # D = 22: triton refuses at any length, parallel runs the long sequence too
    q22 = torch.zeros(1, 2, 40, 22, device=DEV)
    assert resolve_backend(q22, q22, q22, spec).name == "parallel"
    # other feature maps are untouched: parallel is Taylor-only
    assert resolve_backend(q, k, v, spec.replace(feature_map="elu1")).name == "triton"


def test_auto_picks_the_fused_chunked_form_from_its_threshold(cuda_free_auto, monkeypatch):
    """causal Taylor with Nq = Nk: parallel below TAYLOR_FUSED_MIN_N, taylor_chunk from it; where taylor_chunk
    refuses (non-causal, Nq != Nk, other maps), the parallel / triton rule stands."""
    import attn_zoo.backends.triton_taylor as tt
    import attn_zoo.backends.triton_taylor_chunk as tc
    from attn_zoo.functional import resolve_backend

    monkeypatch.setattr(tc, "TAYLOR_FUSED_MIN_N", 48)
    monkeypatch.setattr(tt, "TAYLOR_CHUNKED_MIN_N", 1024)
    spec = AttentionSpec(causal=True, chunk_size=16, **TAYLOR)
    assert _auto_picks(spec, (47, 48), tol=2e-4) == {47: "parallel", 48: "taylor_chunk"}
    q, k, v, _ = _inputs(1, 2, 1, 64, 64, 16, 16)
    assert resolve_backend(q, k, v, spec.replace(causal=False)).name == "parallel"
    assert resolve_backend(q[:, :, :60], k, v, spec).name == "parallel"  # Nq != Nk
    assert resolve_backend(q, k, v, spec.replace(feature_map="elu1")).name == "triton"


@pytest.mark.parametrize("argv,msg", [
    (["--points", "parallel:1:1:64:16:16,nope"], r"--points: 'nope' must be path:B:H:N:D:Dv"),
    (["--points", "chunked:0:1:64:16:16"], r"--points: 'chunked:0:1:64:16:16' must be .*integers >= 1"),
    (["--timeout-s", "0"], r"--timeout-s must be > 0"),
])
def test_taylor_fault_cli_refuses_bad_points_before_running_any(monkeypatch, capsys, argv, msg):
    """lab.taylor_fault checked each point just before its subprocess (a bad last point was found after the others
    had run on the GPU) and took a zero B / H / N / D or a timeout <= 0 (every point 'timeout')."""
    import re
    import subprocess

    from lab import taylor_fault as tf

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a point ran despite a bad command line"))
    with pytest.raises(SystemExit) as e:
        tf.main(argv)
    assert e.value.code == 2 and re.search(msg, capsys.readouterr().err)


def test_readme_states_auto_rule_for_the_taylor_map():
    """README's ``backend="auto"`` paragraph said ``parallel`` is taken "for the Taylor map with D >= 16" (the rule
    before the symmetric features); the rule is a length, TAYLOR_CHUNKED_MIN_N, at any head dim."""
    import pathlib

    from attn_zoo.backends import triton_taylor as tt

    spec = AttentionSpec(kind="linear", feature_map="taylor")
    for D in (4, 8, 16, 21):
        x = torch.zeros(1, 1, 512, D)
        assert tt._auto_priority(x, x, x, spec) == tt.PRIORITY_SHORT, D
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    para = text[text.index('`backend="auto"` takes'):][:600]
    assert "TAYLOR_CHUNKED_MIN_N" in para and "D >= 16" not in para
