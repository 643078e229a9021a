"""Packed documents (issue 27): ``attention(..., doc_ids=)`` and ``attention_varlen`` against their definition.

The definition: a packed batch with ``doc_ids`` equals each document run on its own (for masks that do not depend on
absolute positions), and the document-masked reference is the reference with the dense rule AND the document rule.
Every backend that claims documents is checked against the reference here and in tests/test_conformance.py.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import AttentionSpec, attention, attention_varlen, make_spec  # noqa: E402
from attn_zoo.documents import doc_ids_from_cu_seqlens, document_spans  # noqa: E402
from attn_zoo.registry import document_backends, get_backends  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# boundaries inside 16-row tiles, an empty document (id 2 skipped), a length-1 document, ids not starting at 0
DOCS = [[5] * 5 + [6] + [8] * 10 + [9] * 9 + [11] * 7 + [12] * 3, [0] * 17 + [1] * 18]
N = 35


def _qkv(B=2, Hq=2, Hkv=1, Nq=N, Nk=N, D=8, Dv=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Nk, Dv or D, generator=g, dtype=dtype)
    return q, k, v


def _doc_ids(Nk=N, dtype=torch.int64):
    return torch.tensor([d[:Nk] for d in DOCS], dtype=dtype)


def _runs(row):
    """``[(start, end)]`` of each document run of one row of doc_ids."""
    out, s = [], 0
    for t in range(1, len(row) + 1):
        if t == len(row) or row[t] != row[s]:
            out.append((s, t))
            s = t
    return out


@pytest.mark.parametrize("spec", [AttentionSpec(kind="flash"), AttentionSpec(kind="flash", causal=False),
                                  make_spec("sliding_window", window_size=(3, 0)),
                                  make_spec("sliding_window", window_size=(2, 3), causal=False)],
                         ids=["causal", "full", "window", "window2sided"])
def test_reference_equals_each_document_on_its_own(spec):
    q, k, v = _qkv()
    doc = _doc_ids()
    out, lse = attention(q, k, v, spec, backend="reference", return_lse=True, doc_ids=doc)
    for b in range(2):
        for s, e in _runs(DOCS[b]):
            o, l = attention(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], spec, backend="reference",
                             return_lse=True)
            torch.testing.assert_close(out[b:b + 1, :, s:e], o)
            torch.testing.assert_close(lse[b:b + 1, :, s:e], l)


def test_doc_ids_change_the_output_and_one_document_does_not():
    spec = AttentionSpec(kind="flash")
    q, k, v = _qkv()
    plain = attention(q, k, v, spec, backend="reference")
    one = attention(q, k, v, spec, backend="reference", doc_ids=torch.full((2, N), 7))
    torch.testing.assert_close(one, plain)
    assert (attention(q, k, v, spec, backend="reference", doc_ids=_doc_ids()) - plain).abs().max() > 0.1


def test_nq_other_than_nk_is_bottom_right_with_documents():
    spec = AttentionSpec(kind="flash", causal=False)
    doc = _doc_ids()
    q, k, v = _qkv(Nq=N + 4)
    out = attention(q, k, v, spec, backend="reference", doc_ids=doc)
    assert out[:, :, :4].abs().max() == 0  # rows before the first key: no document, no key
    torch.testing.assert_close(out[:, :, 4:], attention(q[:, :, 4:], k, v, spec, backend="reference", doc_ids=doc))
    q, k, v = _qkv(Nq=6)
    want = attention(torch.cat([torch.zeros(2, 2, N - 6, 8), q], 2), k, v, spec, backend="reference", doc_ids=doc)
    torch.testing.assert_close(attention(q, k, v, spec, backend="reference", doc_ids=doc), want[:, :, -6:])


def test_the_registry_names_the_backends_that_take_documents():
    names = document_backends("flash")
    assert "reference" in names and "torch" in names
    assert all(get_backends("flash")[n].documents for n in names)
    without = [n for n in get_backends("flash") if n not in names]
    assert without, "some backend should not take documents"
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=f"backend='{without[0]}' does not take doc_ids.*backends that do: .*reference"):
        attention(q, k, v, AttentionSpec(kind="flash"), backend=without[0], doc_ids=_doc_ids())
    # auto skips the backends without documents; a call without doc_ids is not changed by an earlier one with them
    attention(q, k, v, AttentionSpec(kind="flash"), doc_ids=_doc_ids())
    torch.testing.assert_close(attention(q, k, v, AttentionSpec(kind="flash")),
                               attention(q, k, v, AttentionSpec(kind="flash"), backend="reference"))


@pytest.mark.parametrize("bad, match", [
    (lambda d: d.float(), r"doc_ids.dtype=torch.float32 is not supported; allowed values: int32, int64"),
    (lambda d: d[:, :-1], r"doc_ids must have shape \(B, Nk\) = \(2, 35\)"),
    (lambda d: d[:1], r"doc_ids must have shape \(B, Nk\)"),
    (lambda d: d.flip(1), r"doc_ids must be nondecreasing"),
    (lambda d: d.to("meta"), r"doc_ids must be on q's device"),
    (lambda d: d.tolist(), r"doc_ids must be a torch.Tensor"),
])
def test_bad_doc_ids_are_refused_naming_them(bad, match):
    q, k, v = _qkv()
    with pytest.raises((ValueError, TypeError), match=match):
        attention(q, k, v, AttentionSpec(kind="flash"), backend="reference", doc_ids=bad(_doc_ids()))


def test_document_spans():
    start, end = document_spans(_doc_ids())
    for b in range(2):
        for s, e in _runs(DOCS[b]):
            assert start[b, s:e].eq(s).all() and end[b, s:e].eq(e).all()


# ------------------------------------------------------------------------------------------------ varlen
CU = torch.tensor([0, 5, 6, 6, 16, 25, 32, 35], dtype=torch.int32)  # an empty document, a length-1 document


def test_doc_ids_from_cu_seqlens():
    assert doc_ids_from_cu_seqlens(CU, 35).tolist() == [0] * 5 + [1] + [3] * 10 + [4] * 9 + [5] * 7 + [6] * 3


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_varlen_equals_the_padded_form(backend):
    spec = make_spec("sliding_window", window_size=(4, 0))
    q, k, v = _qkv(B=1, Hq=4, Hkv=2)
    ids = doc_ids_from_cu_seqlens(CU, N)[None]
    want = attention(q, k, v, spec, backend="reference", doc_ids=ids)[0].transpose(0, 1)
    got = attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), CU, CU, 10, 10, spec,
                           backend=backend)
    assert got.shape == (N, 4, 8)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("spec", [AttentionSpec(kind="flash"), AttentionSpec(kind="flash", causal=False),
                                  AttentionSpec(kind="linear", feature_map="elu1")], ids=["causal", "full", "linear"])
@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_varlen_with_other_query_lengths_is_bottom_right_in_each_document(spec, backend):
    cu_q = torch.tensor([0, 2, 3, 3, 3, 12, 14, 18], dtype=torch.int32)  # doc 3: 0 queries, doc 6: 4 queries / 3 keys
    q, k, v = _qkv(B=1, Hq=2, Hkv=2, Nq=18)
    qp, kp, vp = (t[0].transpose(0, 1) for t in (q, k, v))
    got = attention_varlen(qp, kp, vp, cu_q, CU, 9, 10, spec, backend=backend)
    hq, hk = cu_q.tolist(), CU.tolist()
    for d in range(len(hq) - 1):
        if hq[d + 1] == hq[d]:
            continue
        o = attention(q[:, :, hq[d]:hq[d + 1]], k[:, :, hk[d]:hk[d + 1]], v[:, :, hk[d]:hk[d + 1]], spec,
                      backend="reference")
        torch.testing.assert_close(got[hq[d]:hq[d + 1]], o[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_varlen_errors():
    q, k, v = (t[0].transpose(0, 1) for t in _qkv(B=1))
    spec = AttentionSpec(kind="flash")
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        attention_varlen(q, k, v, CU.long(), CU, 10, 10, spec)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must start at 0, be nondecreasing and end at .*\(35\)"):
        attention_varlen(q, k, v, CU, CU.flip(0), 10, 10, spec)
    with pytest.raises(ValueError, match="max_seqlen_k must be an int >= the longest document"):
        attention_varlen(q, k, v, CU, CU, 10, 3, spec)
    with pytest.raises(ValueError, match="must be 3-D"):
        attention_varlen(q[None], k, v, CU, CU, 10, 10, spec)
    with pytest.raises(TypeError, match="q, k, v must share one dtype"):  # the empty path too (it returns early)
        attention_varlen(q[:0], k.half(), v, torch.tensor([0, 0], dtype=torch.int32), CU, 10, 10, spec)
    with pytest.raises(ValueError, match="return_lse='yes' is not supported; allowed values: True, False"):
        attention_varlen(q, k, v, CU, CU, 10, 10, spec, return_lse="yes")
    cu_q = torch.tensor([0, 2, 3, 3, 3, 12, 14, 35], dtype=torch.int32)
    with pytest.raises(ValueError, match="runs softmax kinds on backend='reference' or 'torch' only"):
        attention_varlen(q, k, v, cu_q, CU, 21, 10, spec, backend="triton")


# ------------------------------------------------------------------------------------------------ anchors
@pytest.mark.parametrize("nq", [N, 12])
def test_fa4_varlen_glue_matches_the_reference_through_a_stub(monkeypatch, nq):
    """The code path of ``fa4`` with ``doc_ids`` (flatten, cu_seqlens cut at rows and documents, reshape back) on the
    CPU, with FA4's ``flash_attn_varlen_func`` replaced by our varlen reference (the real kernel: the gpu test)."""
    import sys
    import types

    from attn_zoo.backends.torch_anchors import _fa4_varlen

    def stub(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size):
        assert q.dim() == 3 and cu_seqlens_q.dtype == torch.int32
        spec = AttentionSpec(kind="sliding_window" if window_size != (None, None) else "flash", causal=causal,
                             **({"window_size": window_size} if window_size != (None, None) else {}))
        return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec,
                                backend="reference"), None

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = stub
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    q, k, v = _qkv(Nq=nq)
    for spec in (AttentionSpec(kind="flash"), make_spec("sliding_window", window_size=(4, 0))):
        torch.testing.assert_close(_fa4_varlen(q, k, v, spec, _doc_ids()),
                                   attention(q, k, v, spec, backend="reference", doc_ids=_doc_ids()))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["fa4", "flex_fa4", "flex", "torch", "triton"])
def test_document_anchors_on_the_gpu(backend):
    q, k, v = (t.cuda().to(torch.bfloat16) for t in _qkv(Hq=4, Hkv=2, D=64))
    doc = _doc_ids().cuda()
    spec = AttentionSpec(kind="flash")
    b = get_backends("flash")[backend]
    why = b.why_not(q, k, v, spec)
    if why is not None:
        pytest.skip(why)
    got = attention(q, k, v, spec, backend=backend, doc_ids=doc)
    torch.testing.assert_close(got.float(), attention(q, k, v, spec, backend="reference", doc_ids=doc).float(),
                               atol=2e-2, rtol=2e-2)


def test_benchmark_document_distributions_are_fixed_and_seeded():
    from eval.bench_flash import document_fraction, document_lengths, packed_doc_ids

    assert document_lengths(100, "fixed:30") == [30, 30, 30, 10]
    geo = document_lengths(4096, "geometric:64")
    assert sum(geo) == 4096 and min(geo) >= 1 and geo == document_lengths(4096, "geometric:64")
    assert 30 < 4096 / len(geo) < 130  # mean length near 64 (the last document is cut)
    d = packed_doc_ids(2, 64, "fixed:16", device="cpu")
    assert d.dtype == torch.int32 and d.shape == (2, 64) and document_fraction(d, causal=True) == 0.125
    with pytest.raises(ValueError, match="allowed values: fixed:<L>, geometric:<L>, wikitext:<L>"):
        document_lengths(10, "poisson:3")


def test_benchmark_wikitext_lengths_come_from_the_articles(tmp_path, monkeypatch):
    """``wikitext:real`` draws the file's article lengths (bytes) as they are; ``wikitext:L`` rescales them to mean
    L; rows are seeded; a missing file is named."""
    from eval import bench_flash as bf

    arts = [" = A = \n" + "x" * 91 + "\n", " = B = \n" + "y" * 391 + "\n"]  # 100 and 400 bytes
    f = tmp_path / "wiki.txt"
    f.write_text("".join(arts))
    monkeypatch.setattr(bf, "WIKITEXT", str(f))
    real = bf.document_lengths(5000, "wikitext:real", seed=3)
    assert sum(real) == 5000 and set(real[1:-1]) <= {100, 400} and {100, 400} <= set(real[1:-1])
    assert 1 <= real[0] <= 400  # the tail of the article the row starts in
    assert real == bf.document_lengths(5000, "wikitext:real", seed=3) != bf.document_lengths(5000, "wikitext:real", seed=4)
    scaled = bf.document_lengths(5000, "wikitext:50", seed=3)
    assert set(scaled[1:-1]) <= {20, 80}  # 100 and 400 scaled by 50 / 250
    monkeypatch.setattr(bf, "WIKITEXT", str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="ATTN_ZOO_WIKITEXT"):
        bf.document_lengths(10, "wikitext:real")
    (tmp_path / "plain.txt").write_text("no title line here\n" * 5)  # a text that is not WikiText: named
    monkeypatch.setattr(bf, "WIKITEXT", str(tmp_path / "plain.txt"))
    with pytest.raises(ValueError, match="holds no article.*ATTN_ZOO_WIKITEXT"):
        bf.document_lengths(10, "wikitext:512")


def test_benchmark_wikitext_rows_are_windows_of_a_packed_stream(tmp_path, monkeypatch):
    """A row of a packed stream starts inside an article: with articles of 100 and 400 bytes (mean 250), a row of
    50 bytes holds a document boundary with probability 50 / 250 = 0.2. Before, every row started at an article
    start, so such a row never held one (WikiText-2 at N = 4096: 2% of rows instead of 22%)."""
    from eval import bench_flash as bf

    f = tmp_path / "wiki.txt"
    f.write_text(" = A = \n" + "x" * 91 + "\n" + " = B = \n" + "y" * 391 + "\n")
    monkeypatch.setattr(bf, "WIKITEXT", str(f))
    rows = [bf.document_lengths(50, "wikitext:real", seed=s) for s in range(400)]
    assert all(sum(r) == 50 for r in rows)
    frac = sum(len(r) > 1 for r in rows) / len(rows)
    assert 0.13 < frac < 0.27, frac


def test_benchmark_bad_docs_entry_fails_before_the_cuda_check(tmp_path, monkeypatch):
    """A bad --docs entry (or a missing WikiText file) is named on a machine without CUDA too, not hidden behind
    'needs a CUDA device'."""
    from eval import bench_flash as bf

    monkeypatch.setattr(bf, "WIKITEXT", str(tmp_path / "none.txt"))
    for docs, match in [("wikitext:0", "allowed values: fixed:<L>, geometric:<L>, wikitext:<L>, wikitext:real"),
                        ("fixed:64,", "allowed values"), ("wikitext:real", "ATTN_ZOO_WIKITEXT")]:
        with pytest.raises(SystemExit, match=f"--docs.*{match}"):
            bf.main(["--docs", docs, "--variants", "causal", "--N", "256", "--D", "64", "--out", str(tmp_path)])


def test_benchmark_native_fa4_varlen_needs_docs_and_is_named():
    """``fa4_varlen`` (FA4 in its own packed layout) is accepted by --impls only with --docs; a bad name lists it."""
    from eval import bench_flash as bf

    with pytest.raises(SystemExit, match="run packed documents only; give --docs"):
        bf.main(["--impls", "ours,fa4_varlen", "--variants", "causal", "--N", "256", "--D", "64"])
    with pytest.raises(SystemExit, match="fa4_varlen"):
        bf.main(["--impls", "nope", "--variants", "causal", "--N", "256", "--D", "64"])


@pytest.mark.parametrize("kind", ["flash", "linear"])
@pytest.mark.parametrize("same", [True, False])
def test_varlen_empty_totals_are_zeros_for_every_kind(kind, same):
    """total_q = 0 or total_k = 0: zeros (lse -inf) whether or not cu_seqlens_q == cu_seqlens_k; before, softmax kinds
    raised with a message about the internal 4-D view, linear kinds returned zeros only when the two differed."""
    from attn_zoo import AttentionSpec, attention_varlen

    spec = AttentionSpec(kind=kind, causal=False)
    H, D = 2, 8
    for tq, tk in ((0, 0), (5, 0), (0, 5)):
        if same and tq != tk:
            continue
        q, k, v = torch.randn(tq, H, D), torch.randn(tk, H, D), torch.randn(tk, H, D)
        cq = torch.tensor([0, tq], dtype=torch.int32)
        ck = cq if same else torch.tensor([0, tk], dtype=torch.int32)
        out = attention_varlen(q, k, v, cq, ck, max(tq, 1), max(tk, 1), spec, backend="reference")
        assert out.shape == (tq, H, D) and (out == 0).all()
        if kind == "flash":
            out, lse = attention_varlen(q, k, v, cq, ck, max(tq, 1), max(tk, 1), spec, backend="reference",
                                        return_lse=True)
            assert lse.shape == (H, tq) and torch.isneginf(lse).all()


def test_query_rows_before_the_first_key_see_nothing_at_the_int64_extremes():
    """Nq > Nk: the rows before the first key were given the id min(doc_ids) - 1, which wrapped to 2**63 - 1 for
    an id of -2**63 (those rows then saw that document); now max + 1 there, and a ValueError when both extremes are
    taken."""
    from attn_zoo import AttentionSpec, attention

    spec = AttentionSpec(kind="flash", causal=False)
    q, k, v = torch.randn(1, 1, 12, 8), torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8)
    lo, hi = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    for be in ("reference", "torch"):
        for ids in ([lo] * 4 + [5] * 4, [0] * 4 + [hi] * 4):
            out = attention(q, k, v, spec, be, doc_ids=torch.tensor([ids]))
            assert (out[0, 0, :4] == 0).all() and (out[0, 0, 4:] != 0).any(), (be, ids)
        with pytest.raises(ValueError, match=r"doc_ids holds both .* renumber the documents"):
            attention(q, k, v, spec, be, doc_ids=torch.tensor([[lo] * 4 + [hi] * 4]))


def test_packed_documents_on_the_meta_device_are_refused_naming_the_argument():
    """A model traced on the meta device with ``doc_ids`` failed inside torch ("Cannot copy out of meta tensor",
    ``.item()``) or with "doc_ids must be on q's device meta" for CPU ids: the boundaries are values, which meta
    tensors do not have. Refused by name, for ``attention`` and ``attention_varlen``."""
    q = torch.randn(1, 2, 8, 16, device="meta")
    for ids in (torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long, device="meta")):
        with pytest.raises(ValueError, match=r"^doc_ids: packed documents need the document ids' values"):
            attention(q, q, q, AttentionSpec(), doc_ids=ids, backend="reference")
    qv = torch.randn(8, 2, 16, device="meta")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^attention_varlen: cu_seqlens' values are the document boundaries"):
        attention_varlen(qv, qv, qv, cu, cu, 8, 8, AttentionSpec())
