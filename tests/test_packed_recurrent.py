"""Packed documents (issue 27) for the linear and recurrent families: the state restarts at each document start.

Every packed result is checked against running each document on its own (the definition), and the chunked /
mixer paths against the references, forward and every gradient. Small shapes, fp64 on CPU.
"""
import pytest
import torch

from attn_zoo.backends.torch_linear import chunked_linear_attention
from attn_zoo.families.deltanet import DeltaNet, GatedDeltaNet, _flatten_docs, delta_rule_naive
from attn_zoo.families.ssd import Mamba2, ssd_scan_chunked, ssd_scan_naive
from attn_zoo.feature_maps import apply_feature_map
from attn_zoo.reference import linear_attention_recurrent, linear_attention_reference
from attn_zoo.spec import AttentionSpec

# row 0: lengths 3, 5, 1 (length-1), 4, a gap in the ids (an empty document); row 1: one document
DOCS = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4], [7] * 13])
RUNS0 = [(0, 3), (3, 8), (8, 9), (9, 13)]
f64 = torch.float64


def _runs(doc_row):
    d = doc_row.tolist()
    out, s = [], 0
    for t in range(1, len(d) + 1):
        if t == len(d) or d[t] != d[t - 1]:
            out.append((s, t))
            s = t
    return out


def test_runs_helper_sees_every_document():
    assert _runs(DOCS[0]) == RUNS0 and _runs(DOCS[1]) == [(0, 13)]


@pytest.mark.parametrize("fm", ["elu1", "relu"])
def test_causal_linear_reset_equals_document_mask(fm):
    torch.manual_seed(0)
    B, H, N, D = 2, 2, 13, 4
    q, k, v = (torch.randn(B, H, N, D, dtype=f64) for _ in range(3))
    spec = AttentionSpec(kind="linear", causal=True, feature_map=fm)
    masked = linear_attention_reference(q, k, v, spec, doc_ids=DOCS)
    fq = apply_feature_map(q, fm, is_query=True)
    fk = apply_feature_map(k, fm, is_query=False)
    reset, _ = linear_attention_recurrent(fq, fk, v, spec.eps, doc_ids=DOCS)
    torch.testing.assert_close(reset.double(), masked, atol=1e-5, rtol=1e-5)
    for s, e in RUNS0:  # and each document alone
        alone = linear_attention_reference(q[:1, :, s:e], k[:1, :, s:e], v[:1, :, s:e], spec)
        torch.testing.assert_close(masked[:1, :, s:e], alone)
    assert not torch.allclose(masked, linear_attention_reference(q, k, v, spec))  # the documents matter


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Nq", [13, 6, 16])
def test_chunked_torch_linear_matches_reference_with_grads(causal, Nq):
    torch.manual_seed(1)
    B, H, N, D = 2, 2, 13, 4
    q = torch.randn(B, H, Nq, D, dtype=f64, requires_grad=True)
    k, v = (torch.randn(B, H, N, D, dtype=f64, requires_grad=True) for _ in range(2))
    spec = AttentionSpec(kind="linear", causal=causal, feature_map="elu1")
    ref = linear_attention_reference(q, k, v, spec, doc_ids=DOCS)
    fq = apply_feature_map(q, "elu1", is_query=True)
    fk = apply_feature_map(k, "elu1", is_query=False)
    out = chunked_linear_attention(fq, fk, v, causal, spec.eps, 4, DOCS)  # chunks of 4: boundaries inside
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    gr = torch.autograd.grad(ref, (q, k, v), g)
    go = torch.autograd.grad(out, (q, k, v), g)
    for a, b in zip(go, gr):
        torch.testing.assert_close(a, b)
    if Nq > N:
        assert out[:, :, : Nq - N].abs().max() == 0  # rows that see no key give 0


def _ssd_inputs(B=2, T=13, H=4, P=3, G=2, N=5, grad=False):
    torch.manual_seed(2)
    x = torch.randn(B, T, H, P, dtype=f64)
    a = -torch.rand(B, T, H, dtype=f64)
    Bm, Cm = torch.randn(B, T, G, N, dtype=f64), torch.randn(B, T, G, N, dtype=f64)
    s0 = torch.randn(B, H, N, P, dtype=f64)
    return [t.requires_grad_(grad) for t in (x, a, Bm, Cm, s0)]


def test_ssd_naive_restarts_at_each_document():
    x, a, Bm, Cm, s0 = _ssd_inputs()
    y, S = ssd_scan_naive(x, a, Bm, Cm, s0, DOCS)
    for s, e in RUNS0:
        ya, Sa = ssd_scan_naive(x[:1, s:e], a[:1, s:e], Bm[:1, s:e], Cm[:1, s:e], s0[:1] if s == 0 else None)
        torch.testing.assert_close(y[:1, s:e], ya)
    torch.testing.assert_close(S[:1], Sa)  # final state: the last document's
    torch.testing.assert_close(y[1:], ssd_scan_naive(x[1:], a[1:], Bm[1:], Cm[1:], s0[1:])[0])


@pytest.mark.parametrize("chunk", [4, 5])
def test_ssd_chunked_matches_naive_with_grads(chunk):
    ins = _ssd_inputs(grad=True)
    yn, Sn = ssd_scan_naive(*ins, DOCS)
    yc, Sc = ssd_scan_chunked(*ins, chunk, DOCS)
    torch.testing.assert_close(yc, yn)
    torch.testing.assert_close(Sc, Sn)
    gy, gS = torch.randn_like(yn), torch.randn_like(Sn)
    gn = torch.autograd.grad((yn * gy).sum() + (Sn * gS).sum(), ins)
    gc = torch.autograd.grad((yc * gy).sum() + (Sc * gS).sum(), ins)
    for a, b in zip(gc, gn):
        torch.testing.assert_close(a, b)


def _mixer_alone_check(m, doc_row):
    torch.manual_seed(3)
    x = torch.randn(1, doc_row.numel(), m.out_proj.out_features, dtype=f64)
    packed = m(x, doc_ids=doc_row[None])
    for s, e in _runs(doc_row):
        torch.testing.assert_close(packed[:, s:e], m(x[:, s:e]))
    return x


@pytest.mark.parametrize("kernel", ["torch", "naive"])
def test_mamba2_mixer_packed_equals_documents_alone(kernel):
    torch.manual_seed(4)
    m = Mamba2(16, d_state=8, headdim=8, d_conv=4, chunk_size=4, kernel=kernel).double()
    _mixer_alone_check(m, DOCS[0])


def test_mamba2_decode_after_packed_prefix():
    """Prefill a packed prefix into a cache, then step: equals decoding the last document alone (conv taps and
    SSM state of earlier documents never leak into it)."""
    torch.manual_seed(5)
    m = Mamba2(16, d_state=8, headdim=8, d_conv=4, chunk_size=4, kernel="torch").double()
    x = torch.randn(1, 12, 16, dtype=f64)
    docs = torch.tensor([[0] * 9 + [1] * 2 + [1]])  # the last document has 2 prefix tokens (< d_conv - 1)
    c1 = m.new_cache(1, 16, f64, "cpu")
    m(x[:, :11], c1, doc_ids=docs[:, :11])
    y1 = m(x[:, 11:], c1, pos=11)
    c2 = m.new_cache(1, 16, f64, "cpu")
    m(x[:, 9:11], c2)
    y2 = m(x[:, 11:], c2, pos=2)
    torch.testing.assert_close(y1, y2)


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_naive_restarts_and_mixer(gated):
    torch.manual_seed(6)
    B, T, H, D = 2, 13, 2, 4
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, dtype=f64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, D, dtype=f64)
    beta = torch.rand(B, T, H, dtype=f64)
    g = -torch.rand(B, T, H, dtype=f64) if gated else None
    s0 = torch.randn(B, H, D, D, dtype=f64)
    o, S = delta_rule_naive(q, k, v, beta, g, None, s0, DOCS)
    for s, e in RUNS0:
        oa, Sa = delta_rule_naive(q[:1, s:e], k[:1, s:e], v[:1, s:e], beta[:1, s:e],
                                  None if g is None else g[:1, s:e], None, s0[:1] if s == 0 else None)
        torch.testing.assert_close(o[:1, s:e], oa)
    torch.testing.assert_close(S[:1], Sa)
    m = (GatedDeltaNet if gated else DeltaNet)(16, 2, 8, kernel="naive").double()
    _mixer_alone_check(m, DOCS[0])


def test_flatten_docs_for_fla_cu_seqlens():
    cu, first, last, n = _flatten_docs(DOCS)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 8, 9, 13, 26]
    assert first.tolist() == [0, 4] and last.tolist() == [3, 4] and n == 5


def test_mixer_doc_ids_shape_error():
    m = DeltaNet(16, 2, 8, kernel="naive")
    with pytest.raises(ValueError, match="doc_ids"):
        m(torch.randn(1, 5, 16), doc_ids=torch.zeros(1, 4, dtype=torch.long))


def test_triton_ssd_scan_resets_inside_chunks_with_grads():
    """kernels.ssd (interpreter): boundaries inside 16-chunks, a length-1 document, an id gap, an initial state."""
    from kernels.ssd import ssd_scan

    torch.manual_seed(7)
    B, T, H, P, G, N = 2, 37, 2, 16, 1, 16
    docs = torch.tensor([[0] * 3 + [1] * 14 + [2] + [5] * 19, [3] * 37])
    ins = [torch.randn(B, T, H, P), -torch.rand(B, T, H), torch.randn(B, T, G, N), torch.randn(B, T, G, N),
           torch.randn(B, H, N, P)]
    ins = [t.requires_grad_() for t in ins]
    yk, Sk = ssd_scan(*ins, chunk_size=16, doc_ids=docs)
    yn, Sn = ssd_scan_naive(*ins, doc_ids=docs)
    torch.testing.assert_close(yk, yn, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(Sk, Sn, atol=1e-4, rtol=1e-4)
    gy, gS = torch.randn_like(yn), torch.randn_like(Sn)
    gk = torch.autograd.grad((yk * gy).sum() + (Sk * gS).sum(), ins)
    gn = torch.autograd.grad((yn * gy).sum() + (Sn * gS).sum(), ins)
    for a, b in zip(gk, gn):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("causal,Nq", [(True, 37), (True, 20), (False, 37)])
def test_triton_taylor_parallel_document_mask_with_grads(causal, Nq):
    """kernels.taylor (interpreter): the document mask inside tiles, vs the document-masked reference."""
    from kernels.taylor import taylor_parallel

    torch.manual_seed(8)
    B, H, N, D = 2, 2, 37, 16
    docs = torch.tensor([[0] * 3 + [1] * 14 + [2] + [5] * 19, [3] * 37])
    q = torch.randn(B, H, Nq, D, requires_grad=True)
    k, v = (torch.randn(B, H, N, D, requires_grad=True) for _ in range(2))
    spec = AttentionSpec(kind="linear", causal=causal, feature_map="taylor")
    ref = linear_attention_reference(q, k, v, spec, doc_ids=docs)
    out = taylor_parallel(q, k, v, causal=causal, eps=spec.eps, doc_ids=docs)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("gated", [False, True])
def test_deltanet_decode_after_packed_prefix(gated):
    torch.manual_seed(9)
    m = (GatedDeltaNet if gated else DeltaNet)(16, 2, 8, kernel="naive").double()
    x = torch.randn(1, 10, 16, dtype=f64)
    docs = torch.tensor([[0] * 6 + [1] * 3])
    c1 = m.new_cache(1, 16, f64, "cpu")
    m(x[:, :9], c1, doc_ids=docs)
    y1 = m(x[:, 9:], c1, pos=9)
    c2 = m.new_cache(1, 16, f64, "cpu")
    m(x[:, 6:9], c2)
    torch.testing.assert_close(y1, m(x[:, 9:], c2, pos=3))


@pytest.mark.parametrize("fm", ["elu1", "taylor"])
def test_attention_routes_doc_ids_to_the_linear_backends(fm):
    """attention(..., doc_ids=) on a linear kind: the torch backend (the state reset) equals the reference (the
    document mask), so does the fused triton kernel (elu1 in-kernel; taylor on its 153 symmetric features), and a
    backend that does not take documents is refused by name."""
    import attn_zoo
    from attn_zoo.registry import document_backends, register_backend, unregister_backend

    g = torch.Generator().manual_seed(3)
    B, H, N, D = 2, 2, 40, 16
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    doc_ids = torch.tensor([[0] * 7 + [1] * 20 + [4] * 13, [2] * 40])
    spec = attn_zoo.make_spec("linear", causal=True, feature_map=fm, chunk_size=16)
    ref = attn_zoo.attention(q, k, v, spec, backend="reference", doc_ids=doc_ids)
    out = attn_zoo.attention(q, k, v, spec, backend="torch", doc_ids=doc_ids)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
    alone = attn_zoo.attention(q[:1, :, 7:27], k[:1, :, 7:27], v[:1, :, 7:27], spec, backend="reference")
    torch.testing.assert_close(ref[:1, :, 7:27], alone, atol=2e-4, rtol=2e-4)  # document 1 sees only itself
    assert {"torch", "reference", "triton"} <= set(document_backends("linear"))
    torch.testing.assert_close(attn_zoo.attention(q, k, v, spec, backend="triton", doc_ids=doc_ids), ref,
                               atol=2e-4, rtol=2e-4)
    register_backend("linear", "no_docs_test", fn=lambda q, k, v, spec, return_lse=False: q, priority=None)
    try:
        with pytest.raises(ValueError, match="backend='no_docs_test' does not take doc_ids.*torch"):
            attn_zoo.attention(q, k, v, spec, backend="no_docs_test", doc_ids=doc_ids)
    finally:
        unregister_backend("linear", "no_docs_test")
