"""Contracts that mutation testing found unchecked.

* Output dtype: ``attention`` returns ``q.dtype`` (and an fp32 ``lse``) for 16-bit inputs, on every backend that
  supports the input here. A backend that computes in fp32 and forgets the cast back failed no test before.
"""

import pytest
import torch

from attn_zoo import AttentionSpec, attention
from attn_zoo.backends._triton import interpreting
from attn_zoo.registry import BACKENDS, get_backends

SPECS = [
    AttentionSpec(kind="flash", causal=True),
    AttentionSpec(kind="flash", causal=False),
    AttentionSpec(kind="sliding_window", window_size=(3, 0)),
    AttentionSpec(kind="sparse", block_size=4),
    AttentionSpec(kind="linear", feature_map="elu1", chunk_size=16),
    AttentionSpec(kind="linear", feature_map="relu", causal=False, chunk_size=16),
    AttentionSpec(kind="linear", feature_map="favor", num_features=16, chunk_size=16),
    AttentionSpec(kind="linear", feature_map="taylor", chunk_size=16),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.causal}-{s.feature_map if s.kind == 'linear' else ''}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("Nq,Nk", [(12, 20), (20, 12)])
def test_output_dtype_is_the_input_dtype(spec, dtype, Nq, Nk):
    D = 8 if spec.feature_map == "taylor" and spec.kind == "linear" else 16  # Taylor: F = 1 + D + D^2 <= 256
    g = torch.Generator().manual_seed(Nq)
    q = torch.randn(1, 2, Nq, D, generator=g).to(dtype)
    k = torch.randn(1, 1, Nk, D, generator=g).to(dtype)
    v = torch.randn(1, 1, Nk, D, generator=g).to(dtype)
    regs = get_backends(spec.kind)
    ran, ran_lse = [], []
    for backend in BACKENDS:
        b = regs.get(backend)
        if b is None or b.supports(q, k, v, spec, False) is not None:
            continue
        out = attention(q, k, v, spec, backend=backend)
        assert out.dtype == dtype and out.shape == (1, 2, Nq, D), (backend, out.dtype)
        assert torch.isfinite(out).all(), backend
        ran.append(backend)
        if spec.is_softmax and b.supports(q, k, v, spec, True) is None:
            out2, lse = attention(q, k, v, spec, backend=backend, return_lse=True)
            assert out2.dtype == dtype, (backend, out2.dtype)
            assert lse.dtype == torch.float32 and lse.shape == (1, 2, Nq), (backend, lse.dtype)
            ran_lse.append(backend)
    assert {"reference", "torch"} <= set(ran), ran  # the CPU-capable backends always run
    if interpreting() and spec.kind == "linear" and not (spec.feature_map == "favor" and dtype == torch.float16):
        assert "triton" in ran, ran  # the interpreter runs the linear kernel in both 16-bit dtypes
    if spec.is_softmax:
        assert "reference" in ran_lse
