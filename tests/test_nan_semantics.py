"""Non-finite inputs never become finite outputs in the rows that see them (reference, torch, triton).

NaN in ``q`` row ``i`` makes output row ``i`` NaN; NaN in key ``p`` makes every row that sees ``p`` NaN. Here,
rows that do not see a bad position are not required to stay finite (a kernel tile or chunk multiplies masked
weights of 0 by the bad value); ``reference`` keeps them exact and ``torch`` ignores keys that no query sees:
tests/test_semantics.py.
"""

import pytest
import torch

from attn_zoo import AttentionSpec, attention, mask_info

DEV = "cuda" if torch.cuda.is_available() else "cpu"

CASES = [
    (AttentionSpec(kind="flash"), ["reference", "torch", "triton"]),
    (AttentionSpec(kind="sliding_window", window_size=(5, 0)), ["reference", "triton"]),
    (AttentionSpec(kind="linear", feature_map="elu1", chunk_size=16), ["reference", "torch", "triton"]),
    (AttentionSpec(kind="linear", feature_map="relu", chunk_size=16), ["reference", "torch", "triton"]),
]


@pytest.mark.parametrize("spec,backends", CASES, ids=lambda x: x.label if isinstance(x, AttentionSpec) else "")
@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_reaches_every_row_that_sees_it(spec, backends, where):
    N, p = 40, 21
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, N, 16, generator=g).to(DEV) for _ in range(3))
    if where == "q":
        q[0, 0, p, 3] = float("nan")
        must = torch.zeros(N, dtype=torch.bool)
        must[p] = True
    else:
        k[0, :, p, 3] = float("nan")
        must = mask_info(spec, N, N).dense()[:, p] if spec.is_softmax else torch.arange(N) >= p
    must = must.to(DEV)
    for backend in backends:
        out = attention(q, k, v, spec, backend=backend)[0, 0]  # (N, D)
        assert torch.isnan(out[must]).all(), (backend, "a row that sees the NaN came out finite")
        if where == "q":  # other rows never depend on q row p
            assert torch.isfinite(out[~must]).all(), backend


def test_causal_linear_never_reads_the_future():
    """Changing future keys leaves past outputs unchanged, for every feature map and backend on CPU."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 48, 8, generator=g).to(DEV) for _ in range(3))
    k2 = k.clone()
    k2[:, :, 40:] *= 6.0  # large future keys
    for fm in ("elu1", "relu", "favor", "taylor"):
        spec = AttentionSpec(kind="linear", feature_map=fm, num_features=32, chunk_size=16)
        for backend in ("reference", "torch", "triton"):
            if backend == "triton" and fm == "taylor":
                continue  # F = 1 + 8 + 64 = 73 is fine, but keep the interpreter case count small
            a = attention(q, k, v, spec, backend=backend)[:, :, :40]
            b = attention(q, k2, v, spec, backend=backend)[:, :, :40]
            torch.testing.assert_close(a, b, msg=f"{fm}/{backend}: past rows changed with future keys")


@pytest.mark.parametrize("Nq,Nk,where", [(4, 8, "q"), (8, 8, "q"), (1, 15, "q"), (9, 4, "q"), (4, 1, "k"), (1, 1, "k")])
@pytest.mark.parametrize("causal", [True, False])
def test_torch_backend_keeps_nan_with_fewer_than_16_keys(Nq, Nk, where, causal):
    """PyTorch's CPU flash SDPA kernel (what SDPA picks for full / causal attention without a mask) drops a NaN
    query row to 0 when there are fewer than 16 keys, and ignores a NaN key when there is one key: ``torch`` (the
    ``auto`` backend on CPU) returned finite rows where ``reference`` gives NaN. Gradients of those rows too."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, Nq, 16, generator=g)
    k, v = (torch.randn(1, 2, Nk, 16, generator=g) for _ in range(2))
    (q if where == "q" else k)[0, 0, -1 if where == "q" else 0, 3] = float("nan")
    spec = AttentionSpec(causal=causal)
    for backend in ("torch", "auto"):
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        out, want = attention(*ins, spec, backend=backend), attention(*ref, spec, backend="reference")
        assert torch.equal(torch.isnan(out), torch.isnan(want)), (backend, "NaN rows differ from the reference")
        torch.testing.assert_close(out, want, equal_nan=True, atol=1e-5, rtol=1e-4)
        do = torch.randn(out.shape, generator=g)
        for a, b in zip(torch.autograd.grad(out, ins, do), torch.autograd.grad(want, ref, do)):
            assert torch.equal(torch.isnan(a), torch.isnan(b)), (backend, "NaN gradients differ from the reference")


def test_torch_decode_keeps_nan_with_fewer_than_16_keys():
    """The same SDPA kernel behind ``decode_attention(backend="torch")``: one new query over a short cache (the first
    steps of every generation) came out 0 for a NaN query."""
    from attn_zoo import decode_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 1, 16, generator=g)
    q[1, 0, 0, 3] = float("nan")
    kc, vc = (torch.randn(2, 2, 32, 16, generator=g) for _ in range(2))
    lens = torch.tensor([9, 9], dtype=torch.int32)
    out = decode_attention(q, kc, vc, AttentionSpec(), lens, backend="torch")
    want = decode_attention(q, kc, vc, AttentionSpec(), lens, backend="reference")
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    torch.testing.assert_close(out, want, equal_nan=True, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("Nq,Nk,where", [(4, 8, "q"), (1, 15, "q"), (9, 4, "q"), (4, 1, "k"), (1, 1, "k")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_backend_keeps_nan_with_fewer_than_16_keys(Nq, Nk, where, dtype):
    """The CPU's flash SDPA kernel dropped a NaN query row to 0 below 16 keys (fixed on the CPU by the math kernel,
    ``CPU_FLASH_MIN_KEYS``); this asks every softmax backend that takes the shape on CUDA (SDPA's kernels, Flex,
    cuDNN, FA4, ours) the same: the NaN rows are the reference's."""
    from attn_zoo.registry import get_backends

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, Nq, 64, generator=g)
    k, v = (torch.randn(1, 2, Nk, 64, generator=g) for _ in range(2))
    (q if where == "q" else k)[0, 0, -1 if where == "q" else 0, 3] = float("nan")
    q, k, v = (t.to("cuda", dtype) for t in (q, k, v))
    spec = AttentionSpec(causal=Nq <= Nk)
    want = torch.isnan(attention(q.double(), k.double(), v.double(), spec, backend="reference"))
    ran = []
    for name, b in get_backends("flash").items():
        if name == "reference" or b.why_not(q, k, v, spec) is not None:
            continue
        out = attention(q, k, v, spec, backend=name)
        assert torch.equal(torch.isnan(out), want), f"{name}: NaN rows differ from the reference"
        ran.append(name)
    assert "torch" in ran, ran
