"""Conformance suite (issue 26, item 2): every kind in the registry, plugins included, on every backend that claims
it -- forward, lse, every gradient and decode (contiguous and paged cache) -- against the reference, on the CPU under
the Triton interpreter, at small shapes.

A new variant gets these tests for free: its specs come from its yaml under ``conf/attention/`` (one folder + one
yaml), else ``AttentionSpec(kind=<kind>)``; the backends from the registry (``get_backends(kind)``, each run where its
``why_not`` is ``None``). The chunked-local variant below is written here as a new user would write a plugin (a spec
class with its field, a mask rule, one registration): nothing else in the suite knows it, and it must decode
correctly on every decode backend, the Triton kernel included (its block layout used to be ignored there).

The expected values are the reference's full forward: decoding ``Nq`` new tokens of a sequence of ``L`` tokens must
equal the last ``Nq`` rows of ``attention(q, k, v, spec, backend="reference")`` over those ``L`` tokens.
"""

import glob
import os
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import yaml  # noqa: E402

import attn_zoo  # noqa: E402
from attn_zoo import AttentionSpec, attention, make_spec  # noqa: E402
from attn_zoo.decode import LinearState, decode_attention, linear_decode, linear_prefill  # noqa: E402
from attn_zoo.decode.linear import LINEAR_DECODE_BACKENDS  # noqa: E402
from attn_zoo.decode.attention import DECODE_BACKENDS  # noqa: E402
from attn_zoo.registry import get_backends  # noqa: E402
from attn_zoo.variants import get_variant, register_variant, variant_kinds  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------ a plugin, as a user writes it
@dataclass(frozen=True)
class ChunkedLocalSpec(AttentionSpec):
    """Chunked local attention (e.g. Llama 4's local layers): a query sees the keys of its own chunk of
    ``chunk`` tokens (causal inside the chunk)."""

    chunk: int = 8


def _chunked_local_mask(spec, Nq, Nk):
    nb = max(-(-Nk // spec.chunk), 1)
    return {"layout": torch.eye(nb, dtype=torch.bool), "block_size": spec.chunk}


def _chunked_local_validate(spec):
    if not isinstance(spec.chunk, int) or spec.chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {spec.chunk!r}")


register_variant("chunked_local", "softmax", spec_class=ChunkedLocalSpec, fields=("chunk",),
                 validate=_chunked_local_validate, mask=_chunked_local_mask, subquadratic=True,
                 doc="chunked local attention (plugin written in tests/test_conformance.py)")
PLUGIN_SPECS = [make_spec("chunked_local", chunk=8), make_spec("chunked_local", chunk=8, causal=False)]

# ------------------------------------------------------------------------------------ the specs of every kind
CONF = os.path.join(os.path.dirname(__file__), os.pardir, "conf", "attention")
N, D, HQ, HKV = 40, 16, 2, 1  # GQA (group 2); masks of the yamls below 40 tokens bite


def _yaml_specs():
    out = {}
    for path in sorted(glob.glob(os.path.join(CONF, "*.yaml"))):
        with open(path) as f:
            cfg = {k: v for k, v in (yaml.safe_load(f) or {}).items() if not k.startswith("_")}
        if "kind" in cfg:
            cfg.pop("n_kv_heads", None), cfg.pop("kv_group_size", None)  # the functional interface reads Hkv from k
            spec = make_spec(**cfg)
            out.setdefault(spec.kind, {}).setdefault(spec, os.path.basename(path))
    return out


# Small layouts for the sparse kind, whose yaml's block of 16 tokens leaves nothing masked at 40 tokens.
EXTRA = [make_spec("sparse", block_size=8, num_local_blocks=1, num_global_blocks=1, num_random_blocks=1),
         make_spec("sparse", sparse_pattern="strided", block_size=4, stride_blocks=3, causal=False),
         make_spec("sliding_window", window_size=(5, 2), causal=False)]


def _all_specs():
    """``[(spec, id)]``: every kind's yaml specs, the extras, the plugin's, a default spec for the other kinds."""
    by_kind = _yaml_specs()
    for s in EXTRA + PLUGIN_SPECS:
        by_kind.setdefault(s.kind, {})[s] = "test"
    for kind in variant_kinds():  # a registered kind with neither: its default spec (needs no field)
        if kind not in by_kind:
            by_kind[kind] = {AttentionSpec(kind=kind): "default"}
    out = []
    for kind in variant_kinds():
        for i, (s, src) in enumerate(by_kind[kind].items()):
            out.append((s, f"{kind}{i}-{src.replace('.yaml', '')}-{'causal' if s.causal else 'full'}"))
    return out


SPECS = _all_specs()


IDS = {s: i for s, i in SPECS}


def test_every_registered_kind_is_covered():
    assert {s.kind for s, _ in SPECS} == set(variant_kinds())
    assert "chunked_local" in variant_kinds()


def _inputs(seed=0, batch=1, n=N, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HQ, n, D, generator=g, dtype=dtype)
    k = torch.randn(batch, HKV, n, D, generator=g, dtype=dtype)
    v = torch.randn(batch, HKV, n, D, generator=g, dtype=dtype)
    return q, k, v


def _tol(spec):
    return dict(atol=2e-3, rtol=2e-3) if spec.is_softmax else dict(atol=5e-3, rtol=5e-3)


def _claims(spec):
    q, k, v = _inputs()
    return [n for n, b in get_backends(spec.kind).items() if n != "reference" and b.why_not(q, k, v, spec) is None]


# ------------------------------------------------------------------------------------ forward, lse, gradients
CASES = [(s, b) for s, _ in SPECS for b in _claims(s)]


@pytest.mark.parametrize("spec, backend", CASES, ids=[f"{IDS[s]}-{b}" for s, b in CASES])
def test_forward_and_every_gradient_match_the_reference(spec, backend):
    q, k, v = _inputs()
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))
    want = []
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = attention(qq, kk, vv, spec, backend="reference")
    o.backward(do)
    want = [o.detach(), qq.grad, kk.grad, vv.grad]
    assert torch.isfinite(want[0]).all()
    torch.testing.assert_close(attention(q, k, v, spec, backend=backend), want[0], **_tol(spec),
                               msg=lambda m: f"{backend} out: {m}")
    b = get_backends(spec.kind)[backend]
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    try:
        o = attention(qq, kk, vv, spec, backend=backend)
        o.backward(do)
    except (NotImplementedError, ValueError) as e:  # FlexAttention has no backward on the CPU: forward checked above
        if "no backward" not in str(e):
            raise
        pytest.skip(f"{backend} has no backward here: {e}")
    for what, g, w in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad), want[1:]):
        torch.testing.assert_close(g, w, **_tol(spec), msg=lambda m: f"{backend} {what}: {m}")
    if spec.is_softmax and b.why_not(q, k, v, spec, True) is None:  # the lse, where the backend returns one
        lse = attention(q, k, v, spec, backend=backend, return_lse=True)[1]
        ref = attention(q, k, v, spec, backend="reference", return_lse=True)[1]
        fin = torch.isfinite(ref)
        assert torch.equal(fin, torch.isfinite(lse))
        torch.testing.assert_close(lse[fin], ref[fin], atol=2e-3, rtol=2e-3)


# ------------------------------------------------------------------------------------ the model's own caches
CAUSAL_SPECS = [(s, i) for s, i in SPECS if s.causal]


@pytest.mark.parametrize("spec", [s for s, _ in CAUSAL_SPECS], ids=[i for _, i in CAUSAL_SPECS])
def test_decoding_through_the_variants_own_cache_equals_the_full_forward(spec):
    """The decode tests above hand every kind a full cache; the model builds the cache the variant's policy asks for
    (a rolling window cache, a linear state). A 2-layer GPT of every causal kind, 80 tokens (past twice the yamls'
    windows, so a window cache rolls), paged and shuffled: a prefill of 7 tokens, then one token at a time, gives
    the rows of the full forward."""
    from attn_zoo.model import GPT, GPTConfig

    N = 80
    cfg = GPTConfig(vocab_size=37, n_layer=2, n_head=HQ, d_model=HQ * D, max_seq_len=N)
    torch.manual_seed(0)
    model = GPT(cfg, spec, backend="reference").eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the 0.02 init, so that the attention pattern matters
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    idx = torch.randint(0, 37, (2, N), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)  # (B, N, vocab)
        caches = model.init_cache(2, capacity=N, page_size=4, shuffle_pages=True)
        steps = [model(idx[:, :7], caches=caches, pos=0)] + [model(idx[:, t:t + 1], caches=caches, pos=t)
                                                            for t in range(7, N)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=5e-5, rtol=1e-5)
    policy = get_variant(spec.kind).cache_policy(spec)
    if policy.kind == "window":  # the rolling cache was exercised: it holds fewer slots than the sequence
        assert all(c.capacity < N for c in caches), [c.capacity for c in caches]


# ------------------------------------------------------------------------------------ shapes only (meta tensors)
META_BACKENDS = ("reference", "torch", "naive")  # the PyTorch backends (Triton kernels need values on a device)
META_CASES = [(s, b) for s, _ in SPECS for b in META_BACKENDS if b == "reference" or b in _claims(s)]


@pytest.mark.parametrize("spec, backend", META_CASES, ids=[f"{IDS[s]}-{b}" for s, b in META_CASES])
def test_meta_tensors_give_the_output_shape_and_every_gradient(spec, backend):
    """A model traced on the meta device (shapes, FLOP counts) crashed on masked kinds: the masks' ``.item()`` calls
    (``unseen_keys``, the dense masks, the reference's NaN check) need values. They are built on the CPU."""
    q, k, v = (t.to("meta").requires_grad_(True) for t in _inputs())
    o = attention(q, k, v, spec, backend=backend)
    assert o.device.type == "meta" and o.shape == q.shape and o.dtype == q.dtype
    o.sum().backward()
    assert [tuple(t.grad.shape) for t in (q, k, v)] == [tuple(t.shape) for t in (q, k, v)]


@pytest.mark.parametrize("backend", META_BACKENDS)
def test_a_meta_device_context_leaves_the_cached_masks_on_the_cpu(backend):
    """Under ``with torch.device("meta")`` (a model built and run on the meta device) the sparse kinds' layout was
    made on the meta device and cached by ``mask_info``: the torch backend failed there ("Cannot copy out of meta
    tensor"), and every later call with the same spec and shape failed on the CPU too."""
    spec = make_spec("sparse", block_size=8, num_local_blocks=1, num_global_blocks=1, num_random_blocks=1,
                     seed=1234 + META_BACKENDS.index(backend))  # a layout no other test made (the variant caches it)
    with torch.device("meta"):
        q, k, v = (t.to("meta").requires_grad_(True) for t in _inputs())
        o = attention(q, k, v, spec, backend=backend)
        o.sum().backward()
    assert o.device.type == "meta" and q.grad.shape == q.shape
    assert attn_zoo.mask_info(spec, N, N).layout.device.type == "cpu"
    q, k, v = _inputs()
    torch.testing.assert_close(attention(q, k, v, spec, backend=backend), attention(q, k, v, spec, backend="reference"),
                               **_tol(spec))


# ------------------------------------------------------------------------------------ packed documents (issue 27)
# Two rows: a length-1 document, skipped ids (empty documents), boundaries inside the kernels' tiles; one document.
DOC_IDS = torch.tensor([[3] * 7 + [5] + [6] * 17 + [9] * 15, [0] * 40])


def _doc_claims(spec):
    if not get_variant(spec.kind).documents:  # the variant takes no packed documents: refused, tested below
        return []
    q, k, v = _inputs(batch=2)
    return [n for n, b in get_backends(spec.kind).items()
            if n != "reference" and b.documents and b.why_not(q, k, v, spec) is None]


DOC_CASES = [(s, b) for s, _ in SPECS for b in _doc_claims(s)]


@pytest.mark.parametrize("spec, backend", DOC_CASES, ids=[f"{IDS[s]}-{b}" for s, b in DOC_CASES])
def test_documents_forward_and_every_gradient_match_the_reference(spec, backend):
    """Every kind on every backend that claims documents (``documents=True`` in the registry), with ``doc_ids``."""
    q, k, v = _inputs(batch=2)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = attention(qq, kk, vv, spec, backend="reference", doc_ids=DOC_IDS)
    o.backward(do)
    want = [o.detach(), qq.grad, kk.grad, vv.grad]
    torch.testing.assert_close(attention(q, k, v, spec, backend=backend, doc_ids=DOC_IDS), want[0], **_tol(spec),
                               msg=lambda m: f"{backend} out: {m}")
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    try:
        attention(qq, kk, vv, spec, backend=backend, doc_ids=DOC_IDS).backward(do)
    except (NotImplementedError, ValueError) as e:  # FlexAttention has no backward on the CPU: forward checked above
        if "no backward" not in str(e):
            raise
        pytest.skip(f"{backend} has no backward here: {e}")
    for what, g, w in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad), want[1:]):
        torch.testing.assert_close(g, w, **_tol(spec), msg=lambda m: f"{backend} {what}: {m}")
    b = get_backends(spec.kind)[backend]
    if spec.is_softmax and b.why_not(q, k, v, spec, True) is None:
        lse = attention(q, k, v, spec, backend=backend, return_lse=True, doc_ids=DOC_IDS)[1]
        ref = attention(q, k, v, spec, backend="reference", return_lse=True, doc_ids=DOC_IDS)[1]
        fin = torch.isfinite(ref)
        assert torch.equal(fin, torch.isfinite(lse))
        torch.testing.assert_close(lse[fin], ref[fin], atol=2e-3, rtol=2e-3)


def test_every_softmax_kind_has_a_document_backend_besides_the_reference():
    for s, _ in SPECS:
        if s.is_softmax and get_variant(s.kind).documents:
            assert _doc_claims(s), f"kind={s.kind!r}: no backend but the reference takes doc_ids"


NO_DOC_CASES = [(s, b) for s, _ in SPECS if not get_variant(s.kind).documents for b in get_backends(s.kind)]


@pytest.mark.parametrize("spec, backend", NO_DOC_CASES, ids=[f"{IDS[s]}-{b}" for s, b in NO_DOC_CASES])
def test_a_kind_without_documents_is_refused_with_them_on_every_backend(spec, backend):
    """A variant registered with ``documents=False`` (no per-document rule) is refused with ``doc_ids`` and with
    ``cu_seqlens``, naming the kind and the argument, on every backend (none silently runs the row's rule)."""
    q, k, v = _inputs(batch=2)
    with pytest.raises(ValueError, match=f"kind='{spec.kind}' does not take doc_ids"):
        attention(q, k, v, spec, backend=backend, doc_ids=DOC_IDS)
    cu = torch.tensor([0, 7, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match=f"kind='{spec.kind}' does not take doc_ids"):
        attn_zoo.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 33, 33,
                                  spec, backend=backend)


# ------------------------------------------------------------------------------------ decode
LENS = (23, 40)  # ragged: the mask of each sequence is counted from its own end
DECODE = [(s, b, nq) for s, _ in SPECS if s.causal for b in
          (DECODE_BACKENDS if s.is_softmax else LINEAR_DECODE_BACKENDS) for nq in (1, 3)]


def _paged(k, v, lens, page_size=8):
    """A shuffled paged copy of contiguous ``(B, Hkv, L, D)`` k / v: ``(pages, Hkv, page_size, D)`` + block table."""
    B, H, L, Dh = k.shape
    per = -(-L // page_size)
    perm = torch.randperm(B * per, generator=torch.Generator().manual_seed(3))
    kp = torch.zeros(B * per, H, page_size, Dh)
    vp = torch.zeros_like(kp)
    table = perm.view(B, per).to(torch.int32)
    for b in range(B):
        for p in range(per):
            s = slice(p * page_size, min((p + 1) * page_size, L))
            n = s.stop - s.start
            kp[table[b, p], :, :n], vp[table[b, p], :, :n] = k[b, :, s], v[b, :, s]
    return kp, vp, table


def _expected_rows(q, k, v, spec, lens, nq):
    """Last ``nq`` rows of the reference forward over each sequence's ``L`` tokens: ``(B, Hq, nq, D)``."""
    rows = [attention(q[b: b + 1, :, :L], k[b: b + 1, :, :L], v[b: b + 1, :, :L], spec, backend="reference")[:, :, -nq:]
            for b, L in enumerate(lens)]
    return torch.cat(rows)


@pytest.mark.parametrize("spec, backend, nq", DECODE, ids=[f"{IDS[s]}-{b}-nq{n}" for s, b, n in DECODE])
def test_decode_matches_the_reference_forward(spec, backend, nq):
    q, k, v = _inputs(seed=1, batch=len(LENS))
    want = _expected_rows(q, k, v, spec, LENS, nq)
    B = len(LENS)
    if not spec.is_softmax:  # a recurrent state: prefill all but the last nq tokens, then the nq new ones
        if backend == "triton":
            from attn_zoo.decode.linear import _triton_reason

            why = _triton_reason(q, k, v, spec)
            if why is not None:
                pytest.skip(f"triton: {why}")
        outs = []
        for b, L in enumerate(LENS):
            sl = slice(b, b + 1)
            _, st = linear_prefill(q[sl, :, :L - nq], k[sl, :, :L - nq], v[sl, :, :L - nq], spec, backend=backend)
            if nq == 1:
                o, st = linear_decode(q[sl, :, L - 1:L], k[sl, :, L - 1:L], v[sl, :, L - 1:L], st, spec)
            else:  # a chunk after the prefill continues the state
                o, st = linear_prefill(q[sl, :, L - nq:L], k[sl, :, L - nq:L], v[sl, :, L - nq:L], spec, st,
                                       backend=backend)
            assert isinstance(st, LinearState) and st.n == L
            outs.append(o)
        torch.testing.assert_close(torch.cat(outs), want, **_tol(spec))
        return
    seqlens = torch.tensor(LENS, dtype=torch.int32)
    qn = torch.stack([q[b, :, L - nq:L] for b, L in enumerate(LENS)])  # (B, Hq, nq, D): each sequence's new rows
    k_c, v_c = k.clone(), v.clone()
    k_c[0, :, LENS[0]:] = float("nan")  # slots past a sequence's end are never read
    v_c[0, :, LENS[0]:] = float("nan")
    kp, vp, table = _paged(k, v, LENS)
    for kk, vv, bt in ((k_c, v_c, None), (kp, vp, table)):
        try:
            got = decode_attention(qn, kk, vv, spec, seqlens, bt, backend=backend)
        except ValueError as e:
            if backend == "triton" and "cannot run this input" in str(e):
                pytest.skip(str(e))  # e.g. no dilation rule in the decode kernel: refused, never wrong
            raise
        torch.testing.assert_close(got, want, **_tol(spec), msg=lambda m: f"{'paged' if bt is not None else 'contiguous'}: {m}")
    assert got.shape == (B, HQ, nq, D)


def test_the_plugin_decodes_with_its_own_mask_on_the_triton_kernel():
    """The bug this suite was written for: the decode kernel followed a block layout only for kind='sparse', so a
    plugin's chunked-local mask decoded as plain causal attention (errors of ~1). Its rows differ from causal."""
    spec = PLUGIN_SPECS[0]
    q, k, v = _inputs(seed=2, batch=len(LENS))
    seqlens = torch.tensor(LENS, dtype=torch.int32)
    qn = torch.stack([q[b, :, L - 1:L] for b, L in enumerate(LENS)])
    got = decode_attention(qn, k, v, spec, seqlens, backend="triton")
    torch.testing.assert_close(got, _expected_rows(q, k, v, spec, LENS, 1), atol=2e-3, rtol=2e-3)
    causal = _expected_rows(q, k, v, AttentionSpec(kind="flash"), LENS, 1)
    assert (got - causal).abs().max() > 0.1
    assert get_variant("chunked_local").cache_policy(spec).kind == "full"  # a layout in absolute positions
    assert attn_zoo.mask_info(spec, 1, 40).layout.shape == (5, 5)


def test_mask_info_refuses_a_count_that_is_not_a_length():
    """The exported ``attn_zoo.mask_info`` accepted ``Nq=-1`` / ``Nq=0`` and returned a mask of nothing; the check runs
    before the cache (which takes ``True`` for a cached ``1``)."""
    attn_zoo.mask_info(AttentionSpec(kind="flash"), 1, 8)  # cached: (spec, True, 8) must still be refused
    for Nq, Nk, name in ((-1, 8, "Nq=-1"), (0, 8, "Nq=0"), (8, 0, "Nk=0"), (2.5, 8, "Nq=2.5"), (True, 8, "Nq=True")):
        with pytest.raises(ValueError, match=rf"mask_info: {name} must be an integer >= 1"):
            attn_zoo.mask_info(AttentionSpec(kind="flash"), Nq, Nk)
    assert attn_zoo.mask_info(AttentionSpec(kind="flash"), 1, 1).Nq == 1



def test_decode_with_an_empty_slot_sees_nothing_on_every_backend():
    """A padded batch row with cache_seqlens 0: the torch backend raised through mask_info (Nk=0) where the Triton
    kernel returns zeros for it."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 1, 16, generator=g)
    k, v = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(2))
    lens = torch.tensor([0, 5], dtype=torch.int32)
    outs = {b: decode_attention(q, k, v, AttentionSpec(kind="flash"), lens, backend=b, check_values=False)
            for b in ("torch", "triton")}
    for b, out in outs.items():
        assert torch.isfinite(out).all() and out[0].abs().max() == 0, b
    torch.testing.assert_close(outs["torch"], outs["triton"], atol=2e-3, rtol=2e-3)
