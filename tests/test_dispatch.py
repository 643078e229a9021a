"""What ``backend="auto"`` picks (``attn_zoo.resolve_backend``), and the dispatch cache of ``attn_zoo.attention``."""

import pytest
import torch

import attn_zoo
from attn_zoo import AttentionSpec
from attn_zoo.functional import _DISPATCH
from attn_zoo.registry import get_backends

SPECS = {
    "flash": AttentionSpec(kind="flash", causal=True),
    "sliding_window": AttentionSpec(kind="sliding_window", causal=True, window_size=(7, 0)),
    "sparse": AttentionSpec(kind="sparse", causal=True, block_size=8, sparse_pattern="bigbird"),
    "linear": AttentionSpec(kind="linear", causal=True, feature_map="elu1", chunk_size=16),
}


def _qkv(device="cpu", dtype=torch.float32, D=16, Hq=4, Hkv=2, N=32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, h, N, D, generator=g).to(device=device, dtype=dtype) for h in (Hq, Hkv, Hkv)]


@pytest.mark.parametrize("kind", list(SPECS))
def test_auto_off_cuda_is_torch(kind):
    q, k, v = _qkv()
    assert attn_zoo.resolve_backend(q, k, v, SPECS[kind]).name == "torch"
    with pytest.raises(ValueError, match="backend='nope' is not supported"):
        attn_zoo.resolve_backend(q, k, v, SPECS[kind], backend="nope")


def test_dispatch_cache_skips_checks_for_a_repeated_signature(monkeypatch):
    """The second call with the same signature neither re-validates nor asks supports() again; another dtype or
    shape does, and registering a backend forgets every decision."""
    spec = SPECS["sliding_window"]
    q, k, v = _qkv()
    torch_backend = get_backends(spec.kind)["torch"]
    import attn_zoo.functional as F

    checked = []
    orig = F.check_inputs
    monkeypatch.setattr(F, "check_inputs", lambda *a: checked.append(1) or orig(*a))
    _DISPATCH.clear()
    out1 = attn_zoo.attention(q, k, v, spec)
    out2 = attn_zoo.attention(q, k, v, spec)
    assert len(checked) == 1
    torch.testing.assert_close(out1, out2, rtol=0, atol=0)
    attn_zoo.attention(q.double(), k.double(), v.double(), spec)
    attn_zoo.attention(q[:, :, :16], k, v, spec)
    assert len(checked) == 3
    with pytest.raises(ValueError, match="Hq=4 must be a multiple of Hkv=3"):  # a bad input is never cached
        attn_zoo.attention(q, k[:, :1].expand(2, 3, 32, 16), v[:, :1].expand(2, 3, 32, 16), spec)
    from attn_zoo.registry import register_backend

    register_backend(spec.kind, "torch", supports=torch_backend.supports, documents=torch_backend.documents)(
        torch_backend.fn)
    assert not _DISPATCH


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", list(SPECS))
def test_auto_on_cuda_is_triton_else_torch_with_reason(kind):
    q, k, v = _qkv("cuda", torch.bfloat16)
    assert attn_zoo.resolve_backend(q, k, v, SPECS[kind]).name == "triton"
    q, k, v = (t.double() for t in (q, k, v))  # no Triton kernel for fp64: torch, and the reason when asked
    assert attn_zoo.resolve_backend(q, k, v, SPECS[kind]).name in ("torch", "reference")
    with pytest.raises(ValueError, match="backend='triton' cannot run this input"):
        attn_zoo.resolve_backend(q, k, v, SPECS[kind], backend="triton")
