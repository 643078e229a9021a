"""Masked pairs contribute nothing: a NaN / inf at a position a row may not see never reaches that row.

* ``reference`` is exact for every pair, in the forward and in every gradient: a non-finite key / value ``p``
  reaches exactly the rows that see ``p`` (and the gradients of the keys those rows see), a non-finite query
  row ``i`` exactly row ``i`` (and the gradients of the keys row ``i`` sees). Everything else equals a run in
  which the bad row holds finite values.
* ``torch`` (softmax kinds): keys that *no* query may see are zeroed before SDPA / Flex, so non-finite values
  there change no output and no gradient, bit for bit. (Keys seen by some rows may still leak into rows that
  do not see them through SDPA's additive mask; see attn_zoo/backends/torch_softmax.py.)
"""

import pytest
import torch

from attn_zoo import AttentionSpec, attention, mask_info

SPECS = [
    AttentionSpec(kind="flash", causal=True),
    AttentionSpec(kind="flash", causal=False),  # no masked pair: plain matmuls
    AttentionSpec(kind="sliding_window", window_size=(3, 0)),
    AttentionSpec(kind="sliding_window", window_size=(2, 1), causal=False),
    AttentionSpec(kind="sparse", block_size=4, num_random_blocks=1, num_global_blocks=0),
    AttentionSpec(kind="linear", feature_map="elu1"),
    AttentionSpec(kind="linear", feature_map="relu"),
]


def _allowed(spec, Nq, Nk):
    if spec.is_softmax:
        return mask_info(spec, Nq, Nk).dense()
    if not spec.causal:
        return torch.ones(Nq, Nk, dtype=torch.bool)
    return torch.arange(Nk).view(1, -1) <= torch.arange(Nq).view(-1, 1) + (Nk - Nq)


def _run(q, k, v, do, spec, backend):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, spec, backend=backend)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.causal}-{s.feature_map if s.kind == 'linear' else ''}")
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("Nq,Nk,p,bad", [(16, 16, 9, float("nan")), (10, 18, 12, float("nan")), (18, 10, 4, float("inf"))])
def test_reference_bad_row_reaches_exactly_who_sees_it(spec, where, bad, Nq, Nk, p):
    g = torch.Generator().manual_seed(Nq * 31 + p)
    q = torch.randn(1, 2, Nq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, Nk, 8, generator=g, dtype=torch.float64)  # GQA 2/1: K/V grads are group sums
    v = torch.randn(1, 1, Nk, 8, generator=g, dtype=torch.float64)
    do = torch.randn(1, 2, Nq, 8, generator=g, dtype=torch.float64)
    clean = _run(q, k, v, do, spec, "reference")
    if where == "q":
        p = p % Nq
    x = {"q": q, "k": k, "v": v}[where].clone()
    x[..., p, :] = bad
    args = dict(q=q, k=k, v=v)
    args[where] = x
    got = _run(args["q"], args["k"], args["v"], do, spec, "reference")

    allowed = _allowed(spec, Nq, Nk)
    if where == "q":
        rows = torch.zeros(Nq, dtype=torch.bool)
        rows[p] = True
        keys = allowed[p]
    else:
        rows = allowed[:, p]  # rows that see the bad key / value
        keys = allowed[rows].any(0)  # keys those rows see (their gradients may depend on the bad row)
        keys[p] = True
    if bad != bad and rows.any() and not (where == "q" and not allowed[p].any()):
        assert torch.isnan(got[0][0, :, rows]).any(), "a row that sees the NaN came out finite"
    name = ("out", "dq", "dk", "dv")
    masks = (rows, rows, keys, keys)
    for n, a, c, m in zip(name, got, clean, masks):
        assert torch.isfinite(a[..., ~m, :]).all(), f"{n}: the bad {where} row {p} reached a position that cannot see it"
        torch.testing.assert_close(a[..., ~m, :], c[..., ~m, :], rtol=1e-10, atol=1e-12, msg=n)


def _unseen_cases():
    return [
        (AttentionSpec(kind="sliding_window", window_size=(3, 0)), 8, 20),  # decoding-style window, Nq < Nk
        (AttentionSpec(kind="sliding_window", window_size=(2, 2), causal=False), 6, 16),
        (AttentionSpec(kind="sparse", block_size=4, num_local_blocks=0, num_global_blocks=0, num_random_blocks=0), 8, 24),
    ]


@pytest.mark.parametrize("spec,Nq,Nk", _unseen_cases(), ids=lambda x: x.kind if isinstance(x, AttentionSpec) else str(x))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("backend", ["reference", "torch", "triton", "naive"])
def test_keys_no_query_sees_change_nothing(spec, Nq, Nk, bad, backend):
    """NaN / inf in every K and V row that no query may see: outputs and all gradients finite and equal to a
    run with other (finite) values there; the gradients of those rows are exactly 0."""
    unseen = ~mask_info(spec, Nq, Nk).dense().any(0)
    assert unseen.any() and (~unseen).any()
    g = torch.Generator().manual_seed(Nk)
    q = torch.randn(2, 4, Nq, 16, generator=g)
    k = torch.randn(2, 2, Nk, 16, generator=g)
    v = torch.randn(2, 2, Nk, 16, generator=g)
    do = torch.randn(2, 4, Nq, 16, generator=g)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, unseen] = torch.randn(k2[:, :, unseen].shape, generator=g) * 100
    v2[:, :, unseen] = torch.randn(v2[:, :, unseen].shape, generator=g) * 100
    kb, vb = k.clone(), v.clone()
    kb[:, :, unseen] = bad
    vb[:, :, unseen] = bad
    a = _run(q, k2, v2, do, spec, backend)
    b = _run(q, kb, vb, do, spec, backend)
    for n, x, y in zip(("out", "dq", "dk", "dv"), b, a):
        assert torch.isfinite(x).all(), f"{backend}: {n} not finite"
        if backend in ("torch", "triton", "naive"):  # zeroed before SDPA / the kernel / the matmuls: bit-identical
            assert torch.equal(x, y), n
        else:
            torch.testing.assert_close(x, y, msg=n)
    for n, x in zip(("dk", "dv"), b[2:]):
        assert (x[:, :, unseen] == 0).all(), f"{backend}: {n} of an unseen key is not 0"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.causal}-{s.feature_map if s.kind == 'linear' else ''}")
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_reference_with_documents_keeps_a_bad_key_in_its_document(spec, where, bad):
    """Packed documents (doc_ids): a NaN / inf key or value of document 0 reaches no row of document 1 -- the
    reference is exact for every pair with documents as without (a masked pair of another document included)."""
    Nq = Nk = 12
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, Nq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 1, Nk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 1, Nk, 8, generator=g, dtype=torch.float64)
    do = torch.randn(2, 2, Nq, 8, generator=g, dtype=torch.float64)
    doc_ids = torch.tensor([[0] * 5 + [1] * 7] * 2)

    def run(q, k, v):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = attention(q, k, v, spec, backend="reference", doc_ids=doc_ids)
        return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)

    clean = run(q, k, v)
    x = {"k": k, "v": v}[where].clone()
    x[..., 2, :] = bad  # a key / value of document 0
    got = run(*(x if n == where else t for n, t in (("q", q), ("k", k), ("v", v))))
    for n, a, c in zip(("out", "dq", "dk", "dv"), got, clean):  # document 1: rows / keys 5..11
        assert torch.isfinite(a[..., 5:, :]).all(), f"{n}: the bad {where} of document 0 reached document 1"
        torch.testing.assert_close(a[..., 5:, :], c[..., 5:, :], rtol=1e-10, atol=1e-12, msg=n)
