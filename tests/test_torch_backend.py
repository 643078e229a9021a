"""The ``torch`` backend (SDPA / FlexAttention / chunked PyTorch) equals ``reference`` where it applies."""

import pytest
import torch

from attn_zoo import AttentionSpec, attention
from attn_zoo.backends.torch_linear import chunked_linear_attention

SPECS = [
    AttentionSpec(kind="flash", causal=True),
    AttentionSpec(kind="flash", causal=False),
    AttentionSpec(kind="sliding_window", window_size=(4, 0)),
    AttentionSpec(kind="sliding_window", window_size=(3, 2), causal=False),
    AttentionSpec(kind="sparse", block_size=4, num_random_blocks=1),
    AttentionSpec(kind="sparse", block_size=4, sparse_pattern="strided", stride_blocks=2, causal=False),
    AttentionSpec(kind="linear", feature_map="elu1", chunk_size=8),
    AttentionSpec(kind="linear", feature_map="relu", chunk_size=5),
    AttentionSpec(kind="linear", feature_map="favor", num_features=16, chunk_size=8),
    AttentionSpec(kind="linear", feature_map="taylor", chunk_size=8),
    AttentionSpec(kind="linear", feature_map="elu1", causal=False),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.causal}-{s.feature_map if s.kind == 'linear' else s.sparse_pattern}")
@pytest.mark.parametrize("Nq,Nk", [(21, 21), (7, 21), (21, 7), (1, 13)])
def test_torch_backend_equals_reference(spec, Nq, Nk):
    g = torch.Generator().manual_seed(Nq * 100 + Nk)
    # float64: relu features make some normalisers tiny, which is ill-conditioned in fp32
    q = torch.randn(2, 4, Nq, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, Nk, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, Nk, 6 if spec.kind == "linear" else 8, generator=g, dtype=torch.float64, requires_grad=True)
    ref = attention(q, k, v, spec, backend="reference")
    out = attention(q, k, v, spec, backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-7)
    do = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, (q, k, v), do)
    g_out = torch.autograd.grad(out, (q, k, v), do)
    for a, b in zip(g_out, g_ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


def test_bf16_torch_backend_close_to_fp32_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=g) for _ in range(3))
    for spec in (AttentionSpec(kind="flash"), AttentionSpec(kind="linear", chunk_size=8)):
        ref = attention(q, k, v, spec, backend="reference")
        out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), spec, backend="torch")
        assert out.dtype == torch.bfloat16
        assert (out.float() - ref).abs().max() < 5e-2


def test_chunked_linear_independent_of_chunk_size():
    g = torch.Generator().manual_seed(1)
    fq, fk = torch.rand(1, 2, 37, 5, generator=g), torch.rand(1, 2, 37, 5, generator=g)
    v = torch.randn(1, 2, 37, 3, generator=g)
    a = chunked_linear_attention(fq, fk, v, causal=True, eps=1e-6, chunk_size=1)  # pure recurrence
    for c in (4, 16, 64):
        torch.testing.assert_close(chunked_linear_attention(fq, fk, v, causal=True, eps=1e-6, chunk_size=c), a)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SPECS[:6], ids=lambda s: f"{s.kind}-{s.causal}-{s.sparse_pattern}")
@pytest.mark.parametrize("Nq,Nk", [(256, 256), (100, 300), (300, 100)])
def test_torch_backend_cuda_bf16(spec, Nq, Nk):
    """SDPA / compiled FlexAttention on CUDA in bf16 vs the fp32 reference (FlashAttention's 2x/3x rule)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, Nq, 64, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, Nk, 64, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 2, Nk, 64, device="cuda", generator=g, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(2, 8, Nq, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = attention(*ref_in, spec, backend="reference")
    g_ref = torch.autograd.grad(ref, ref_in, do.float())
    naive_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]  # plain PyTorch in bf16
    from attn_zoo.masks import mask_info
    from attn_zoo.reference import repeat_kv

    s = (naive_in[0] @ repeat_kv(naive_in[1], 4).transpose(-1, -2)) * 64 ** -0.5
    s = s.masked_fill(~mask_info(spec, Nq, Nk).dense("cuda"), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1))
    naive = p @ repeat_kv(naive_in[2], 4)
    g_naive = torch.autograd.grad(naive, naive_in, do)
    out = attention(q, k, v, spec, backend="torch")
    g_out = torch.autograd.grad(out, (q, k, v), do)
    assert (out.float() - ref).abs().max() <= 2 * (naive.float() - ref).abs().max() + 1e-3
    for a, b, c in zip(g_out, g_naive, g_ref):
        assert torch.isfinite(a).all()
        assert (a.float() - c).abs().max() <= 3 * (b.float() - c).abs().max() + 1e-3


def test_value_dim_larger_than_head_dim_with_empty_rows():
    """Dv != D, causal with Nq > Nk (top rows see nothing): torch equals reference."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 2, 8, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 6, generator=g)
    spec = AttentionSpec(kind="flash", causal=True)
    out = attention(q, k, v, spec, backend="torch")
    assert out.shape == (1, 2, 8, 6)
    torch.testing.assert_close(out, attention(q, k, v, spec, backend="reference"))


def test_naive_linear_in_half_precision_keeps_gradients_of_rows_with_no_features_finite():
    """naive linear attention in fp16: rows whose keys' relu features are all 0 (normaliser 0) have gradients of
    size |v| / eps, past fp16's range, and came back NaN. The quadratic form now runs in fp32 (as the kernels
    accumulate); its gradients match the fp32 reference's."""
    from attn_zoo.reference import linear_attention_reference

    torch.manual_seed(0)
    spec = AttentionSpec(kind="linear", feature_map="relu", causal=True)
    q = torch.randn(1, 2, 16, 8)
    k = torch.randn(1, 2, 16, 8)
    k[:, :, :4] = -k[:, :, :4].abs()  # the first 4 keys have no features: rows 0-3 see only them
    v, do = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    half = [t.half().requires_grad_() for t in (q, k, v)]
    out = attention(*half, spec, backend="naive")
    grads = torch.autograd.grad(out, half, do.half())
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = linear_attention_reference(*ref_in, spec)
    g_ref = torch.autograd.grad(ref, ref_in, do)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    for name, g, r in zip("qkv", grads, g_ref):
        assert torch.isfinite(g).all(), f"d{name} has non-finite values"
        torch.testing.assert_close(g.float(), r, atol=2e-2, rtol=2e-2)
