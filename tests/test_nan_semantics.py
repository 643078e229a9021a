"""Non-finite inputs never become finite outputs in the rows that see them (reference, torch, triton, naive).

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


# rows that see no key: through doc_ids (Nq > Nk: the rows before the first key), through Nq > Nk causal
_DOCS = [[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]]  # per batch row: key 1 is seen by rows 1-2 / row 1 only
NAIVE_CASES = [  # (Nq, Nk, doc_ids, the bad input, its row)
    (6, 6, _DOCS, "k", 1),  # doc_ids, no empty row: rows 1-2 came out 0
    (9, 6, _DOCS, "k", 1),  # doc_ids, rows 0-2 empty
    (8, 6, None, "k", 1),  # causal Nq > Nk, rows 0-1 empty
    (6, 6, _DOCS, "q", 4),  # a NaN query row with doc_ids came out finite
    (8, 6, None, "q", 4),
    (8, 6, None, "q", 0),  # a NaN query in an empty row: output 0, and no NaN gradient for the keys
    (9, 6, _DOCS, "q", 1),
    (9, 6, _DOCS, "v", 1),  # a NaN value: the empty rows stay 0 (not 0 * NaN)
    (8, 6, None, "v", 1),
]


@pytest.mark.parametrize("Nq,Nk,docs,where,row", NAIVE_CASES, ids=lambda x: "docs" if isinstance(x, list) else str(x))
def test_naive_zeroes_only_the_rows_that_see_no_key(Nq, Nk, docs, where, row):
    """``naive`` applied ``nan_to_num`` to the whole probability matrix whenever some row could see no key (always
    with ``doc_ids``): rows that see a NaN key, and NaN query rows, came out 0. Now: the output's NaN rows are the
    reference's (a NaN value may also reach rows that do not see it, never an empty one), empty rows are exactly 0
    with zero query gradients, and every gradient is NaN wherever the reference's is; where only an empty row's
    query is bad, every gradient is the reference's (finite)."""
    g = torch.Generator().manual_seed(Nq * 10 + row)
    q = torch.randn(2, 2, Nq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 1, Nk, 8, generator=g, dtype=torch.float64) for _ in range(2))  # GQA 2/1
    do = torch.randn(2, 2, Nq, 8, generator=g, dtype=torch.float64)
    {"q": q, "k": k, "v": v}[where][0, :, row, 3] = float("nan")  # batch row 0 only
    spec = AttentionSpec()
    kw = {"doc_ids": torch.tensor(docs)} if docs is not None else {}
    if docs is not None:
        from attn_zoo.documents import document_allowed

        allowed = document_allowed(spec, Nq, Nk, kw["doc_ids"])  # (B, Nq, Nk)
    else:
        allowed = mask_info(spec, Nq, Nk).dense().expand(2, Nq, Nk)
    empty = ~allowed.any(-1)  # (B, Nq)
    assert empty.any() == (Nq > Nk)
    got, want = _outputs_and_grads(q, k, v, do, spec, "naive", kw), _outputs_and_grads(q, k, v, do, spec, "reference", kw)
    out, ref = got[0], want[0]
    assert torch.isnan(ref).any() or (where == "q" and bool(empty[0, row]))  # the case bites
    if where == "v":
        assert (torch.isnan(out) | ~torch.isnan(ref)).all(), "a row that sees the NaN value came out finite"
    else:
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN rows differ from the reference"
        torch.testing.assert_close(out, ref, equal_nan=True, rtol=1e-10, atol=1e-12)
    e = empty[:, None, :, None].expand_as(out)
    assert (out[e] == 0).all(), "a row that sees no key is not 0"
    assert (got[1][e.expand_as(got[1])] == 0).all(), "dq of a row that sees no key is not 0"
    for n, a, b in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        assert (torch.isnan(a) | ~torch.isnan(b)).all(), f"{n}: a NaN gradient of the reference came out finite"
        if where == "q" and bool(empty[0, row]):  # an empty row's query contributes nothing, NaN or not
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=n)


def _outputs_and_grads(q, k, v, do, spec, backend, kw):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, spec, backend=backend, **kw)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)
