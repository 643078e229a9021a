"""The Triton exact kernel with packed documents (issue 27 item 3) against the document-masked reference: forward,
lse and every gradient, on the CPU interpreter (tiles 32 x 16 forward / dQ, 16 x 32 dK/dV), with boundaries inside
tiles, empty and length-1 documents, Nq != Nk, GQA, Dv != D, the split / atomic / deterministic backward and a
block layout; and a check that key tiles of other documents are never visited."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attn_zoo import AttentionSpec, attention, make_spec  # noqa: E402
from kernels.flash.documents import document_table  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _docs(n, cuts, B=2, seed=0):
    """(B, n) int64: row 0 cut at ``cuts`` (ids skip by 2: empty documents), row 1 cut at random points."""
    row0 = torch.zeros(n, dtype=torch.int64)
    for c in cuts:
        row0[c:] += 2
    g = torch.Generator().manual_seed(seed)
    row1 = torch.sort(torch.randint(0, 5, (n,), generator=g)).values
    return torch.stack([row0, row1][:B])


def _run(spec, q, k, v, doc, backend):
    do = torch.randn(q.shape[:3] + (v.shape[3],), generator=torch.Generator().manual_seed(5))
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o, lse = attention(qq, kk, vv, spec, backend=backend, return_lse=True, doc_ids=doc)
    (o * do).sum().backward()
    return o, lse, qq.grad, kk.grad, vv.grad


def _check(spec, q, k, v, doc, **settings):
    from kernels import flash_settings

    want = _run(spec, q, k, v, doc, "reference")
    with flash_settings(**settings):
        got = _run(spec, q, k, v, doc, "triton")
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        if name == "lse":
            fin = torch.isfinite(w)
            assert torch.equal(fin, torch.isfinite(g)), "rows without keys must have lse = -inf"
            g, w = g[fin], w[fin]
        torch.testing.assert_close(g, w, atol=2e-4, rtol=2e-4, msg=lambda m: f"{name}: {m}")


N = 70  # 3 query tiles (32), 5 key tiles (16) with a ragged tail
CUTS = [5, 6, 40, 41, 48]  # a length-1 document (5), boundaries inside tiles and on a tile edge (48)


def _qkv(Nq=N, Nk=N, Hq=2, Hkv=1, D=16, Dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, Hq, Nq, D, generator=g), torch.randn(2, Hkv, Nk, D, generator=g),
            torch.randn(2, Hkv, Nk, Dv or D, generator=g))


@pytest.mark.parametrize("spec", [AttentionSpec(kind="flash"), AttentionSpec(kind="flash", causal=False),
                                  make_spec("sparse", block_size=16, num_local_blocks=1, num_global_blocks=1,
                                            num_random_blocks=1)],
                         ids=["causal", "full", "bigbird"])
def test_forward_lse_and_gradients_match_the_reference(spec):
    """Three query tiles, five key tiles: full tiles inside documents, straddling ones, skipped ones (every kind on
    every backend with documents: tests/test_conformance.py)."""
    q, k, v = _qkv()
    _check(spec, q, k, v, _docs(N, CUTS))


@pytest.mark.parametrize("nq", [23, 90], ids=["nq<nk", "nq>nk"])
def test_nq_other_than_nk(nq):
    q, k, v = _qkv(Nq=nq)
    _check(AttentionSpec(kind="flash", causal=nq < N), q, k, v, _docs(N, CUTS))


def test_gqa_dv_and_the_split_atomic_backward():
    q, k, v = _qkv(Nq=40, Nk=40, Hq=4, Hkv=2, Dv=24)
    doc = _docs(40, [5, 6, 20])
    spec = AttentionSpec(kind="flash")
    _check(spec, q, k, v, doc, dkdv_split=2, deterministic=True)
    _check(spec, q, k, v, doc, dq_mode="atomic")


def test_key_tiles_of_other_documents_are_never_visited():
    """A NaN value of document 0 reaches every row whose tiles load it through ``0 * NaN``; the rows of document 1,
    whose query tile [32, 64) only visits the key tiles [32, 64), stay finite (causal without documents: NaN)."""
    q, k, v = _qkv(Nq=64, Nk=64)
    doc = torch.tensor([[0] * 32 + [1] * 32] * 2)
    v[:, :, 3] = float("nan")
    out = attention(q, k, v, AttentionSpec(kind="flash"), backend="triton", doc_ids=doc)
    assert torch.isfinite(out[:, :, 32:]).all()
    assert not torch.isfinite(out[:, :, 3]).all()
    plain = attention(q, k, v, AttentionSpec(kind="flash"), backend="triton")
    assert not torch.isfinite(plain[:, :, 32:]).all()


def test_document_table():
    doc = torch.tensor([[4, 4, 7, 7, 7, 9]])
    t = document_table(doc, 4)  # queries at key positions 2..5
    nq, nk = 4, 6
    doc_q, q_lo, q_hi = t[0, :nq], t[0, nq:2 * nq], t[0, 2 * nq:3 * nq]
    doc_k, k_lo, k_hi = t[0, 3 * nq:3 * nq + nk], t[0, 3 * nq + nk:3 * nq + 2 * nk], t[0, 3 * nq + 2 * nk:]
    assert doc_q.tolist() == [1, 1, 1, 2] and q_lo.tolist() == [2, 2, 2, 5] and q_hi.tolist() == [5, 5, 5, 6]
    assert doc_k.tolist() == [0, 0, 1, 1, 1, 2]
    assert k_lo.tolist() == [0, 0, 0, 0, 0, 3] and k_hi.tolist() == [0, 0, 3, 3, 3, 4]
    t = document_table(doc, 8)  # two rows before the first key: no document, no keys
    assert t[0, :2].tolist() == [-1, -1] and t[0, 8:10].tolist() == [0, 0] and t[0, 16:18].tolist() == [0, 0]


def test_flash_attn_refuses_doc_ids_that_are_not_int32_or_int64():
    """Float ids were truncated (0.2 and 0.7 both became document 0: one document, silently); int16 too is
    refused, naming the argument and the allowed dtypes."""
    from kernels import flash_attn

    q, k, v = _qkv()
    for dt in (torch.float32, torch.int16, torch.bool):
        bad = torch.zeros(q.shape[0], k.shape[2], dtype=dt)
        with pytest.raises(ValueError, match=r"doc_ids must be int32 or int64 .*allowed dtypes: torch.int32, "
                                             r"torch.int64"):
            flash_attn(q, k, v, causal=True, doc_ids=bad)
