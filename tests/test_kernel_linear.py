"""Triton linear attention (kernels/linear.py, backend ``triton`` of ``linear``) against the fp32 references.

CPU: run under ``TRITON_INTERPRET=1`` (set by tests/conftest.py before triton is imported), small shapes.
Two ground truths: the masked quadratic form :func:`attn_zoo.reference.linear_attention_reference` and the
step-by-step recurrence :func:`attn_zoo.reference.linear_attention_recurrent`, both fp32. Metric: relative RMS
error ``||x - ref|| / ||ref||``. 16-bit inputs follow the FlashAttention rule: our error against the fp32
reference is at most 2x (gradients 3x) the error of a plain PyTorch implementation run in that dtype.
"""

import os

import pytest
import torch
import torch.nn.functional as Fn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attn_zoo import AttentionSpec, attention  # noqa: E402
from attn_zoo.feature_maps import apply_feature_map  # noqa: E402
from attn_zoo.reference import linear_attention_reference  # noqa: E402
from attn_zoo.reference import linear_attention_recurrent  # noqa: E402
from kernels.linear import LinearConfig, linear_attention  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _inputs(B, Hq, Hkv, Nq, Nk, D, Dv, dtype=torch.float32, seed=0, kscale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g) * kscale
    v = torch.randn(B, Hkv, Nk, Dv, generator=g)
    do = torch.randn(B, Hq, Nq, Dv, generator=g)
    return [t.to(DEV, dtype) for t in (q, k, v, do)]


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    return out, dq, dk, dv


def _plain_torch(q, k, v, spec):
    """What a user would write, entirely in the input dtype (the FlashAttention-rule baseline)."""
    fq = apply_feature_map(q, spec.feature_map, is_query=True, num_features=spec.num_features, seed=spec.seed)
    fk = apply_feature_map(k, spec.feature_map, is_query=False, num_features=spec.num_features, seed=spec.seed)
    n_rep = q.shape[1] // k.shape[1]
    fk, v = fk.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    a = fq @ fk.transpose(-1, -2)
    if spec.causal:
        Nq, Nk = q.shape[2], k.shape[2]
        i = torch.arange(Nq, device=q.device).view(-1, 1) + (Nk - Nq)
        a = a.masked_fill(torch.arange(Nk, device=q.device).view(1, -1) > i, 0.0)
    return (a @ v) / (a.sum(-1, keepdim=True) + spec.eps)


# ------------------------------------------------------------------------------------- fp32 vs both references
@pytest.mark.parametrize(
    "N,Hq,Hkv,D,Dv,fmap,chunk",
    [
        (1, 2, 1, 16, 32, "elu1", 64),
        (63, 2, 2, 16, 32, "elu1", 64),
        (64, 4, 2, 32, 16, "relu", 64),
        (65, 4, 1, 16, 32, "elu1", 64),
        (200, 4, 2, 16, 24, "elu1", 16),
    ],
)
def test_causal_fp32_vs_references(N, Hq, Hkv, D, Dv, fmap, chunk):
    spec = AttentionSpec(kind="linear", causal=True, feature_map=fmap, chunk_size=chunk)
    q, k, v, do = _inputs(2, Hq, Hkv, N, N, D, Dv, seed=N)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)

    def rec(a, b, c):
        fq = apply_feature_map(a, fmap, is_query=True)
        fk = apply_feature_map(b, fmap, is_query=False)
        return linear_attention_recurrent(fq, fk, c, eps=spec.eps)[0]

    rcr = _grads(rec, q, k, v, do)
    scale = ref[3].norm()  # dv is never degenerate; with N = 1, dq = dk = 0 exactly (out = v)
    for name, x, r, s in zip(("out", "dq", "dk", "dv"), got, ref, rcr):
        assert torch.isfinite(x).all(), name
        if N == 1 and name in ("dq", "dk"):
            assert (x - r).norm() <= 1e-4 * scale, name
            continue
        assert rel(x, r) <= 1e-3, (name, rel(x, r))
        assert rel(x, s) <= 1e-3, (name, rel(x, s))


@pytest.mark.parametrize("fmap", ["favor", "taylor"])
def test_pytorch_feature_maps_noncausal_gqa(fmap):
    """favor / taylor go through PyTorch features; non-causal with Nq != Nk; GQA grads summed over the group."""
    spec = AttentionSpec(kind="linear", causal=False, feature_map=fmap, num_features=32)
    q, k, v, do = _inputs(1, 4, 2, 37, 70, 8, 12, seed=3)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel(x, r) <= 1e-3, (name, rel(x, r))


@pytest.mark.parametrize("Nq,Nk", [(20, 90), (90, 20)])
def test_causal_bottom_right_nq_ne_nk(Nq, Nk):
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=16)
    q, k, v, do = _inputs(1, 2, 1, Nq, Nk, 16, 16, seed=Nq)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel(x, r) <= 1e-3, (name, rel(x, r))
    if Nq > Nk:
        assert (got[0][:, :, : Nq - Nk] == 0).all()


def test_initial_and_final_state_chain_and_grads():
    """Two calls chained through the state equal one call; gradients flow through (S0, z0) and (S, z)."""
    q, k, v, do = _inputs(1, 4, 2, 50, 50, 16, 8, seed=7)
    fq, fk = Fn.elu(q) + 1, Fn.elu(k) + 1
    s0 = torch.rand(1, 2, 16, 8, device=DEV)
    z0 = torch.rand(1, 2, 16, device=DEV) + 1.0
    ws = torch.randn(1, 2, 16, 8, device=DEV)
    wz = torch.randn(1, 2, 16, device=DEV)

    def loss(fn, a, b, c, s, z):
        out, (st, zt) = fn(a, b, c, s, z)
        return (out * do).sum() + (st * ws).sum() + (zt * wz).sum(), out

    def ker(a, b, c, s, z):
        return linear_attention(a, b, c, causal=True, initial_state=(s, z), output_final_state=True, chunk_size=16)

    def rec(a, b, c, s, z):
        return linear_attention_recurrent(a, b, c, initial_state=(s, z))

    leaves = [t.detach().clone().requires_grad_() for t in (fq, fk, v, s0, z0)]
    lk, ok = loss(ker, *leaves)
    gk = torch.autograd.grad(lk, leaves)
    leaves2 = [t.detach().clone().requires_grad_() for t in (fq, fk, v, s0, z0)]
    lr, orr = loss(rec, *leaves2)
    gr = torch.autograd.grad(lr, leaves2)
    assert rel(ok, orr) <= 1e-3
    for name, a, b in zip(("dq", "dk", "dv", "dS0", "dz0"), gk, gr):
        assert rel(a, b) <= 1e-3, (name, rel(a, b))
    # chaining: [0:30) then [30:50) from its final state == one call
    o1, st1 = linear_attention(fq[:, :, :30], fk[:, :, :30], v[:, :, :30], output_final_state=True, chunk_size=16)
    o2 = linear_attention(fq[:, :, 30:], fk[:, :, 30:], v[:, :, 30:], initial_state=st1, chunk_size=16)
    full = linear_attention(fq, fk, v, chunk_size=16)
    assert rel(torch.cat([o1, o2], 2), full) <= 1e-5


def test_explicit_features_past_128_are_zero_padded_exactly(monkeypatch):
    """F = 153 (the symmetric Taylor width at D 16, which read out of range on the H200) runs padded to 160: the
    launch sees 160 features, and outputs, the final state (153 rows) and every gradient, dS0 / dz0 included, equal
    the unpadded recurrence."""
    import kernels.linear as KL

    assert [KL.feature_pad(F) for F in (100, 128, 129, 153, 160, 192, 250, 256)] == [0, 0, 31, 7, 0, 0, 6, 0]
    assert KL.feature_pad(153, "elu1") == 0  # elu1(0) = 1: padding an in-kernel map's input would change it
    B, H, N, F, Dv = 1, 2, 40, 153, 8
    g = torch.Generator().manual_seed(3)
    fq, fk = (torch.rand(B, H, N, F, generator=g) * 0.2 for _ in range(2))
    v, do = torch.randn(B, H, N, Dv, generator=g), torch.randn(B, H, N, Dv, generator=g)
    s0, z0 = torch.rand(B, H, F, Dv, generator=g), torch.rand(B, H, F, generator=g) + 1.0
    ws, wz = torch.randn(B, H, F, Dv, generator=g), torch.randn(B, H, F, generator=g)
    seen = []
    apply = KL._LinearAttention.apply
    monkeypatch.setattr(KL._LinearAttention, "apply", lambda q, *a: (seen.append(q.shape[-1]), apply(q, *a))[1])

    def run(fn):
        leaves = [t.clone().to(DEV).requires_grad_() for t in (fq, fk, v, s0, z0)]
        out, (st, zt) = fn(*leaves)
        loss = (out * do.to(DEV)).sum() + (st * ws.to(DEV)).sum() + (zt * wz.to(DEV)).sum()
        return out, st, torch.autograd.grad(loss, leaves)

    ok, sk, gk = run(lambda a, b, c, s, z: linear_attention(a, b, c, causal=True, initial_state=(s, z),
                                                            output_final_state=True, chunk_size=16))
    orr, sr, gr = run(lambda a, b, c, s, z: linear_attention_recurrent(a, b, c, initial_state=(s, z)))
    assert seen == [160] and sk.shape == (B, H, F, Dv)
    assert rel(ok, orr) <= 1e-3 and rel(sk, sr) <= 1e-3
    for name, a, b in zip(("dq", "dk", "dv", "dS0", "dz0"), gk, gr):
        assert a.shape == b.shape and rel(a, b) <= 1e-3, (name, rel(a, b))


def test_padded_widths_errors_name_the_callers_shapes():
    """Errors of a call whose F would be padded (129-255) name the shapes the caller passed, not the padded ones;
    F > 256 is refused as F (was padded to 288 and named so), and a non-pair initial_state is named."""
    import kernels.linear as KL

    assert [KL.feature_pad(F) for F in (255, 257, 300, 1000)] == [1, 0, 0, 0]
    B, H, N, Dv = 1, 2, 16, 8
    q, k, v = torch.rand(B, H, N, 153), torch.rand(B, H, N, 153), torch.randn(B, H, N, Dv)
    with pytest.raises(ValueError, match=r"feature dim F=257 and value dim Dv=8 must be <= 256"):
        linear_attention(torch.rand(B, H, N, 257), torch.rand(B, H, N, 257), v)
    with pytest.raises(ValueError, match=r"q and k feature dims differ: 153 vs 150"):
        linear_attention(q, k[..., :150], v)
    with pytest.raises(ValueError, match=r"initial_state shapes must be S0 \(1, 2, 153, 8\) and z0 \(1, 2, 153\), "
                                         r"got \(1, 2, 153, 4\) and \(1, 2, 153\)"):
        linear_attention(q, k, v, initial_state=(torch.zeros(B, H, 153, 4), torch.zeros(B, H, 153)))
    with pytest.raises(ValueError, match=r"got \(1, 2, 150, 8\) and \(1, 2, 150\)"):
        linear_attention(q, k, v, initial_state=(torch.zeros(B, H, 150, Dv), torch.zeros(B, H, 150)))
    with pytest.raises(ValueError, match=r"initial_state must be a pair \(S0 .*, got Tensor"):
        linear_attention(q, k, v, initial_state=torch.zeros(B, H, 153, Dv))


# ------------------------------------------------------------------------------------- segments
def _ref_with_state(fq, fk, v, s0, z0, causal, eps):
    """fp32 reference with an initial state: the recurrence (causal) or the totals (non-causal)."""
    if causal:
        return linear_attention_recurrent(fq, fk, v, eps=eps, initial_state=(s0, z0))
    n_rep = fq.shape[1] // fk.shape[1]
    S = s0 + fk.transpose(-1, -2) @ v
    z = z0 + fk.sum(2)
    Sg, zg = S.repeat_interleave(n_rep, 1), z.repeat_interleave(n_rep, 1)
    out = (fq @ Sg) / ((fq * zg[:, :, None, :]).sum(-1, keepdim=True) + eps)
    return out, (S, z)


@pytest.mark.parametrize(
    "causal,Nq,Nk,seg",
    [(True, 65, 65, 32), (True, 100, 100, 48), (False, 65, 100, 32), (False, 100, 37, 32)],
)
def test_multi_segment_vs_reference(causal, Nq, Nk, seg):
    """Several segments (L = 2-3 chunks of 16, N not a multiple of C or L), GQA 4/2, F != Dv, fused elu1,
    initial state and final state: out and the gradients of q, k, v, S0, z0 against the fp32 reference."""
    q, k, v, do = _inputs(1, 4, 2, Nq, Nk, 16, 24, seed=Nq + Nk)
    s0 = torch.rand(1, 2, 16, 24, device=DEV)
    z0 = torch.rand(1, 2, 16, device=DEV) + 1.0
    ws = torch.randn(1, 2, 16, 24, device=DEV)
    wz = torch.randn(1, 2, 16, device=DEV)
    eps = 1e-6

    def ker(a, b, c, s, z):
        return linear_attention(a, b, c, causal=causal, feature_map="elu1", initial_state=(s, z),
                                output_final_state=True, chunk_size=16, segment_size=seg)

    def ref(a, b, c, s, z):
        return _ref_with_state(Fn.elu(a) + 1, Fn.elu(b) + 1, c, s, z, causal, eps)

    res = []
    for fn in (ker, ref):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, s0, z0)]
        out, (st, zt) = fn(*leaves)
        loss = (out * do).sum() + (st * ws).sum() + (zt * wz).sum()
        res.append((out, st, zt) + torch.autograd.grad(loss, leaves))
    for name, x, r in zip(("out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"), *res):
        assert torch.isfinite(x).all(), name
        assert rel(x, r) <= 1e-4, (name, rel(x, r))


@pytest.mark.parametrize("causal", [True, False])
def test_segmentation_does_not_change_results(causal):
    """fp32: forced short segments (4 segments, ragged tail) vs one segment, out and grads within 1e-5."""
    q, k, v, do = _inputs(2, 2, 1, 70, 70, 16, 16, seed=21)
    got = []
    for seg in (16, 1024):
        fn = lambda a, b, c: linear_attention(a, b, c, causal=causal, feature_map="relu", chunk_size=16,  # noqa: E731
                                               segment_size=seg)
        got.append(_grads(fn, q, k, v, do))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *got):
        assert rel(a, b) <= 1e-5, (name, rel(a, b))
    with pytest.raises(ValueError, match="segment_size"):
        linear_attention(q, k, v, segment_size=0)


@pytest.mark.parametrize("fmap", ["elu1", "relu"])
def test_feature_map_prepass_strided_and_in_loop(fmap):
    """The feature-map pre-pass (default) reads strided q / k directly and its chain rule (phi' from phi) gives
    the same out and grads as contiguous inputs, as the in-loop map (``LinearConfig(phi_in_loop=True)``) and as
    the fp32 reference; q has exact zeros (relu'(0) = 0, elu1'(0) = 1) and the GQA group is 2."""
    q, k, v, do = _inputs(1, 4, 2, 40, 40, 16, 8, seed=5)
    q[..., :3] = 0.0
    qs = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) memory, viewed as (B, H, N, D)
    kbig = torch.zeros(1, 2, 80, 16, device=DEV)
    kbig[:, :, ::2] = k
    ks = kbig[:, :, ::2]  # every other row of a larger buffer
    assert not qs.is_contiguous() and not ks.is_contiguous()
    fn = lambda a, b, c: linear_attention(a, b, c, feature_map=fmap, chunk_size=16, segment_size=16)  # noqa: E731
    got = {"contiguous": _grads(fn, q, k, v, do)}
    # the views themselves (clone() would make the every-other-row view of k contiguous)
    qs_, ks_ = qs.detach().requires_grad_(), ks.detach().requires_grad_()
    v_ = v.detach().clone().requires_grad_()
    out = fn(qs_, ks_, v_)
    got["strided"] = (out,) + torch.autograd.grad(out, (qs_, ks_, v_), do)
    got["in_loop"] = _grads(lambda a, b, c: linear_attention(a, b, c, feature_map=fmap, chunk_size=16, segment_size=16,
                                                             config=LinearConfig(phi_in_loop=True)), q, k, v, do)
    phi = (lambda x: Fn.elu(x) + 1) if fmap == "elu1" else torch.relu
    got["reference"] = _grads(lambda a, b, c: _ref_with_state(phi(a), phi(b), c, torch.zeros(1, 2, 16, 8, device=DEV),
                                                              torch.zeros(1, 2, 16, device=DEV), True, 1e-6)[0],
                              q, k, v, do)
    for case in ("strided", "in_loop", "reference"):
        for name, a, b in zip(("out", "dq", "dk", "dv"), got[case], got["contiguous"]):
            assert rel(a, b) <= 1e-5, (case, name, rel(a, b))
    if fmap == "relu":  # the zero inputs get exactly zero gradient
        assert (got["contiguous"][1][..., :3] == 0).all()


# ------------------------------------------------------------------------------------- 16-bit inputs
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_flash_rule(dtype):
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=16)
    q, k, v, do = _inputs(1, 2, 1, 65, 65, 32, 16, seed=11)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.to(dtype) for t in (q, k, v, do)]
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *lo)
    base = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), *lo)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref, base)):
        assert x.dtype == dtype and torch.isfinite(x).all(), name
        factor = 2.0 if i == 0 else 3.0
        assert rel(x, r) <= factor * rel(p, r) + 1e-4, (name, rel(x, r), rel(p, r))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_large_keys_no_overflow(dtype):
    """Keys x30 before elu1 (features up to ~100, sums of ~1e4): finite and close to the fp32 reference."""
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=16)
    q, k, v, do = _inputs(1, 2, 2, 80, 80, 16, 16, seed=5, kscale=30.0)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *(t.to(dtype) for t in (q, k, v, do)))
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert torch.isfinite(x).all(), name
        assert rel(x, r) <= tol, (name, rel(x, r))


@pytest.mark.parametrize("kscale", [1.0, 30.0])
def test_bf16_lowp_products_gqa(kscale):
    """bf16 16-bit-product path (``LinearConfig.lowp_bf16``, states / g / dA rounded to bf16 before each product),
    causal GQA 4/2 over several segments: the 2x / 3x rule against plain bf16 PyTorch and finite with keys x30;
    the switch must change the result (the rounding is exercised, also under the CPU interpreter)."""
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=16)
    q, k, v, do = _inputs(1, 4, 2, 70, 70, 32, 16, seed=3, kscale=kscale)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.to(torch.bfloat16) for t in (q, k, v, do)]
    base = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), *lo)
    res = {}
    for lowp in (True, False):
        res[lowp] = _grads(lambda a, b, c: linear_attention(a, b, c, feature_map="elu1", chunk_size=16,
                                                             segment_size=32, config=LinearConfig(lowp_bf16=lowp)),
                           *lo)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), res[True], ref, base)):
        assert x.dtype == torch.bfloat16 and torch.isfinite(x).all(), name
        factor = 2.0 if i == 0 else 3.0
        assert rel(x, r) <= factor * rel(p, r) + 1e-4, (name, rel(x, r), rel(p, r))
    assert any(not torch.equal(a, b) for a, b in zip(res[True], res[False]))


# ------------------------------------------------------------------------------------- interface
def test_supports_reasons(monkeypatch):
    from attn_zoo.registry import get_backends

    sup = get_backends("linear")["triton"].supports
    q = torch.zeros(1, 1, 4, 16, device=DEV)
    spec = AttentionSpec(kind="linear")
    assert sup(q, q, q, spec, False) is None  # CUDA, or the interpreter (tests/conftest.py sets it on CPU)
    assert "float64" in sup(q.double(), q.double(), q.double(), spec, False)
    assert sup(q, q, q, spec.replace(feature_map="taylor"), False) is None  # 153 symmetric features (full map: 273)
    q22 = torch.zeros(1, 1, 4, 22, device=DEV)
    assert "256" in sup(q22, q22, q22, spec.replace(feature_map="taylor"), False)  # 1 + 22 + 253 = 276
    assert "lse" in sup(q, q, q, spec, True)
    assert "float16" in sup(q.half(), q.half(), q.half(), spec.replace(feature_map="favor"), False)
    if DEV == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert "CUDA" in sup(q, q, q, spec, False)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        assert "CUDA" in sup(q, q, q, spec, False)
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention(q, q, q, feature_map="taylor")
    with pytest.raises(ValueError, match="Nq == Nk"):
        linear_attention(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="256"):
        big = torch.zeros(1, 1, 2, 300, device=DEV)
        linear_attention(big, big, big)


_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("kw, msg", [
    (dict(causal="no"), r"causal='no' is not supported; allowed values: True, False"),
    (dict(causal=1), r"causal=1 is not supported; allowed values: True, False"),
    (dict(causal=None), r"causal=None is not supported"),
    (dict(eps=-1e-6), r"eps=-1e-06 is not supported; allowed values: a finite float > 0"),
    (dict(eps=0.0), r"eps=0.0 is not supported; allowed values: a finite float > 0"),
    (dict(eps=_NAN), r"eps=nan is not supported"), (dict(eps=_INF), r"eps=inf is not supported"),
    (dict(eps="1e-6"), r"eps='1e-6' is not supported"), (dict(eps=True), r"eps=True is not supported"),
    (dict(output_final_state="yes"), r"output_final_state='yes' is not supported; allowed values: True, False"),
    (dict(output_final_state=1), r"output_final_state=1 is not supported"),
    (dict(segment_size="x"), r"segment_size='x' is not supported; allowed values: None .* or an integer >= 1"),
    (dict(segment_size=0), r"segment_size=0 is not supported"), (dict(segment_size=-16), r"segment_size=-16 is not"),
    (dict(segment_size=2.5), r"segment_size=2.5 is not supported"),
    (dict(segment_size=True), r"segment_size=True is not supported"),
    (dict(feature_map=["elu1"]), r"feature_map=\['elu1'\] is not supported in-kernel; allowed values"),
    (dict(chunk_size=True), r"chunk_size=True is not supported by the Triton kernel; allowed values: 16, 32, 64"),
])
def test_linear_attention_refuses_bad_scalar_arguments_before_any_launch(kw, msg, monkeypatch):
    """eps < 0, causal="no" (any truthy non-bool), segment_size="x" used to run (or fail with a message
    naming nothing). Each scalar argument of the public signature is checked on the host, before the autograd
    function (so before any launch), with a ValueError naming the argument and its allowed values."""
    import kernels.linear as kl

    def no_launch(*a):
        raise AssertionError("reached the kernels")

    monkeypatch.setattr(kl._LinearAttention, "apply", no_launch)
    q = torch.zeros(1, 1, 16, 16, device=DEV)
    with pytest.raises(ValueError, match=msg):
        linear_attention(q, q, q, **kw)


def test_linear_attention_still_takes_integer_like_scalars():
    """What the checks above keep: an int eps, a NumPy integer segment_size (configs), bools: the same output."""
    np = pytest.importorskip("numpy")
    q, k, v, _ = _inputs(1, 1, 1, 32, 32, 16, 16, seed=3)
    q, k = Fn.elu(q) + 1, Fn.elu(k) + 1
    want = linear_attention(q, k, v, causal=True, eps=1.0, chunk_size=16, segment_size=16)
    got = linear_attention(q, k, v, causal=True, eps=1, chunk_size=16, segment_size=np.int64(16))
    assert torch.equal(got, want)
    assert not torch.equal(linear_attention(q, k, v, causal=False, eps=1.0, chunk_size=16), want)


# ------------------------------------------------------------------------------------- GPU, real sizes
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,Hq,Hkv,D,Dv", [(4096, 16, 16, 128, 128), (2000, 8, 2, 64, 128), (1025, 4, 4, 256, 64)])
def test_gpu_real_sizes(N, Hq, Hkv, D, Dv, dtype):
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1")
    q, k, v, do = _inputs(1, Hq, Hkv, N, N, D, Dv, dtype=torch.float32, seed=N)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.to(dtype) for t in (q, k, v, do)]
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *lo)
    base = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), *lo)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref, base)):
        assert torch.isfinite(x).all(), name
        factor = 2.0 if i == 0 else 3.0
        assert rel(x, r) <= factor * max(rel(p, r), 1e-3), (name, rel(x, r), rel(p, r))


@gpu
def test_gpu_fp32_and_large_keys():
    spec = AttentionSpec(kind="linear", causal=True, feature_map="elu1")
    q, k, v, do = _inputs(2, 8, 4, 3000, 3000, 128, 128, seed=1, kscale=30.0)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    got32 = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got32, ref):
        assert rel(x, r) <= 1e-3, (name, rel(x, r))
    for dtype in (torch.float16, torch.bfloat16):
        got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *(t.to(dtype) for t in (q, k, v, do)))
        for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
            assert torch.isfinite(x).all(), (dtype, name)
            assert rel(x, r) <= 3e-2, (dtype, name, rel(x, r))


def test_chunk_size_outside_the_kernel_set_raises_and_auto_falls_back():
    from kernels.linear import CHUNK_SIZES

    q, k, v, _ = _inputs(1, 2, 2, 20, 20, 8, 8)
    for bad in (0, 8, 48, 256, True):
        with pytest.raises(ValueError, match="chunk_size"):
            linear_attention(q, k, v, chunk_size=bad)
    spec = AttentionSpec(kind="linear", feature_map="elu1", chunk_size=8)
    assert 8 not in CHUNK_SIZES
    with pytest.raises(Exception, match="chunk_size=8"):
        attention(q, k, v, spec, backend="triton")
    ref = attention(q, k, v, spec, backend="reference")
    torch.testing.assert_close(attention(q, k, v, spec, backend="auto"), ref.to(q.dtype), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_taylor_fp16_large_inputs_stay_finite(causal):
    """Taylor features grow like x^2 / sqrt(2 D): with |x| ~ 300-1000 at D = 8 they (and their products) exceed
    the float16 range. The triton backend computes the Taylor map in float32 for float16 inputs: output and
    gradients finite, float16, and as close to the fp32 reference as the torch backend (which upcasts)."""
    spec = AttentionSpec(kind="linear", causal=causal, feature_map="taylor", chunk_size=16)
    q, k, v, do = _inputs(1, 2, 1, 24, 24, 8, 8, seed=9)
    q, k = q * 300, k * 300
    assert apply_feature_map(q, "taylor", is_query=True).abs().max() > 65504  # past the float16 range
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.half() for t in (q, k, v, do)]
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="triton"), *lo)
    pt = _grads(lambda a, b, c: attention(a, b, c, spec, backend="torch"), *lo)
    for name, x, r, p in zip(("out", "dq", "dk", "dv"), got, ref, pt):
        assert x.dtype == torch.float16 and torch.isfinite(x).all(), name
        assert rel(x, r) <= 2 * rel(p, r) + 1e-3, (name, rel(x, r), rel(p, r))


@pytest.mark.parametrize("causal", [True, False])
def test_zero_normaliser_rows_are_exact_zeros(causal):
    """relu features: a query row with all-negative entries has phi(q) = 0, and (causal) the first rows see only
    keys with phi(k) = 0, so their normaliser is 0 and only ``eps`` keeps ``0 / (0 + eps)`` from being NaN:
    those rows are exactly 0 on every backend (and the other rows match the reference), gradients finite. A
    large ``eps`` makes a backend that drops the spec's value (kernel default 1e-6) visible on the other rows."""
    spec = AttentionSpec(kind="linear", causal=causal, feature_map="relu", chunk_size=16, eps=0.25)
    q, k, v, do = _inputs(1, 2, 1, 40, 40, 8, 8, seed=13)
    q, k = q.abs(), k.abs()
    zero_q = [0, 17, 33]
    q[:, :, zero_q] = -q[:, :, zero_q] - 0.5  # phi(q_i) = 0
    k[:, :, :5] = -k[:, :, :5] - 0.5  # phi(k_j) = 0 for j < 5: causal rows 0..4 see only zero features
    zero_rows = sorted(set(zero_q) | (set(range(5)) if causal else set()))
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for backend in ("reference", "torch", "triton"):
        got = _grads(lambda a, b, c: attention(a, b, c, spec, backend=backend), q, k, v, do)
        for name, x in zip(("out", "dq", "dk", "dv"), got):
            assert torch.isfinite(x).all(), (backend, name)
        out = got[0]
        assert (out[:, :, zero_rows] == 0).all(), (backend, out[:, :, zero_rows].abs().max())
        others = [i for i in range(40) if i not in zero_rows]
        assert out[:, :, others].abs().amax(-1).min() > 0  # the case is not all zeros
        assert rel(out[:, :, others], ref[0][:, :, others]) <= 1e-4, backend
        for name, x, r in zip(("dq", "dk", "dv"), got[1:], ref[1:]):
            assert rel(x, r) <= 1e-3, (backend, name, rel(x, r))


@gpu
@pytest.mark.parametrize("backend,fm", [("triton", "elu1"), ("triton", "taylor"), ("parallel", "taylor"),
                                        ("taylor_chunk", "taylor")])
def test_gpu_kept_launchers_give_tritons_results(backend, fm, monkeypatch):
    """kernels._host.launch: a repeated call goes through the kept compiled kernels' launchers (no Triton binding);
    forward and every gradient equal those of Triton's own launch path on the same inputs."""
    from kernels import _host

    spec = AttentionSpec(kind="linear", causal=True, feature_map=fm)
    D = 16 if fm == "taylor" else 64
    fn = lambda a, b, c: attention(a, b, c, spec, backend=backend)  # noqa: E731
    got = {}
    for fast in (False, True):
        monkeypatch.setattr(_host, "FAST_LAUNCH", fast)
        _host.clear_launches()
        for seed in (1, 2):  # with fast: the first call keeps the launchers, the second uses them
            q, k, v, do = (t.to(torch.bfloat16) for t in _inputs(2, 4, 2, 300, 300, D, 64, seed=seed))
            got[fast, seed] = _grads(fn, q, k, v, do)
        assert (len(_host._FAST) > 0) == fast
    for name, x, r in zip(("out", "dq", "dk", "dv"), got[True, 2], got[False, 2]):
        assert torch.isfinite(x).all() and rel(x, r) <= 1e-6, (name, rel(x, r))
