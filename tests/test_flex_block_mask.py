"""attn_zoo.flex.flex_block_mask: the BlockMask every Flex backend and anchor runs, against the shared element rule.

On CUDA, block-sparse layouts on Flex's tiles go into the block lists, with a mask_mod that captures no tensor (what
the FA4 / CuTe DSL backend can lower): compiled Flex skips unlisted blocks, runs listed full blocks without the
mask_mod and applies it to the partial ones. That mask is checked here element by element against the dense rule
(:meth:`attn_zoo.masks.MaskInfo.dense`), in those semantics. Elsewhere (eager Flex on CPU evaluates the mask_mod
alone) the mask_mod keeps the layout lookup, and eager Flex's output is checked against dense attention.
"""

import pytest
import torch

from attn_zoo.flex import _layout_block_mask, flex_block_mask
from attn_zoo.masks import mask_info
from attn_zoo.spec import AttentionSpec

BIGBIRD = dict(kind="sparse", sparse_pattern="bigbird", block_size=128, num_local_blocks=1, num_global_blocks=1,
               num_random_blocks=1)
STRIDED = dict(kind="sparse", sparse_pattern="strided", block_size=128, stride_blocks=2)
SHAPES = [(768, 768), (320, 320), (256, 640)]  # Nk - Nq a multiple of 128, ragged tails included


def _captured_tensors(fn):
    """Tensors a mask_mod reaches through its closure (and the fields of captured dataclasses such as MaskInfo)."""
    todo, seen, out = [c.cell_contents for c in (fn.__closure__ or ())], set(), []
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        if isinstance(c, torch.Tensor):
            out.append(c)
        elif hasattr(c, "__dataclass_fields__"):
            todo.extend(getattr(c, f) for f in c.__dataclass_fields__)
        elif callable(c) and getattr(c, "__closure__", None):
            todo.extend(x.cell_contents for x in c.__closure__)
    return out


def _compiled_flex_semantics(bm, Nq, Nk, bs):
    """Element mask compiled Flex applies: listed full blocks all kept, listed partial blocks by the mask_mod,
    unlisted blocks dropped."""
    out = torch.zeros(Nq, Nk, dtype=torch.bool)
    i = torch.arange(Nq).view(-1, 1)
    j = torch.arange(Nk).view(1, -1)
    mm = bm.mask_mod(0, 0, i, j)
    for qb in range(-(-Nq // bs)):
        rows = slice(qb * bs, min((qb + 1) * bs, Nq))
        full = bm.full_kv_indices[0, 0, qb, : int(bm.full_kv_num_blocks[0, 0, qb])].tolist()
        partial = bm.kv_indices[0, 0, qb, : int(bm.kv_num_blocks[0, 0, qb])].tolist()
        assert not set(full) & set(partial), f"query block {qb}: key blocks listed both full and partial"
        for kb in full:
            out[rows, kb * bs: (kb + 1) * bs] = True
        for kb in partial:
            out[rows, kb * bs: (kb + 1) * bs] = mm[rows, kb * bs: (kb + 1) * bs]
    return out


@pytest.mark.parametrize("pattern", [BIGBIRD, STRIDED], ids=["bigbird", "strided"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("Nq,Nk", SHAPES)
def test_layout_in_block_lists_is_the_element_rule(pattern, causal, Nq, Nk):
    mi = mask_info(AttentionSpec(causal=causal, **pattern), Nq, Nk)
    bm = _layout_block_mask(mi, "cpu", 128)
    assert _captured_tensors(bm.mask_mod) == []  # nothing for the CuTe DSL backend to lower but index arithmetic
    assert int(bm.full_kv_num_blocks.sum()) > 0  # full blocks are listed as full (no mask_mod work on them)
    expect = mi.dense()
    got = _compiled_flex_semantics(bm, Nq, Nk, 128)
    assert torch.equal(got, expect), f"{int((got != expect).sum())} of {expect.numel()} elements differ"


@pytest.mark.parametrize("pattern", [BIGBIRD, STRIDED], ids=["bigbird", "strided"])
@pytest.mark.parametrize("Nq,Nk", SHAPES + [(200, 520)])
def test_eager_flex_with_the_block_mask_is_dense_attention(pattern, Nq, Nk):
    from torch.nn.attention.flex_attention import flex_attention

    mi = mask_info(AttentionSpec(causal=True, **pattern), Nq, Nk)
    bm = flex_block_mask(AttentionSpec(causal=True, **pattern), Nq, Nk, "cpu")
    g = torch.Generator().manual_seed(Nq + Nk)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (Nq, Nk, Nk))
    s = (q @ k.transpose(-1, -2)) * 16 ** -0.5
    ref = torch.softmax(s.masked_fill(~mi.dense(), float("-inf")), dim=-1).nan_to_num(0.0) @ v  # empty rows: 0
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=bm), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "flex_fa4"])
@pytest.mark.parametrize("pattern", [BIGBIRD, STRIDED], ids=["bigbird", "strided"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("Nq,Nk", [(512, 512), (256, 768)])
def test_gpu_flex_layout_lists_forward_and_grads(backend, pattern, causal, Nq, Nk):
    """Compiled Flex (the ``torch`` backend's path) and Flex+FA4 with the listed layout, bf16, against the fp32
    reference: output and dq / dk / dv within 2x / 3x the error of plain PyTorch in bf16 (FlashAttention's rule)."""
    from attn_zoo import attention
    from attn_zoo.registry import get_backends

    spec = AttentionSpec(causal=causal, **pattern)
    # (not available_backends: that lists what "auto" may pick, and flex_fa4 is an anchor auto never picks)
    why = get_backends(spec.kind)[backend].unavailable()
    if why is not None:
        pytest.skip(f"backend {backend!r} is not available here: {why}")
    g = torch.Generator(device="cuda").manual_seed(Nq + Nk)
    q, k, v = (torch.randn(2, 4, n, 64, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for n in (Nq, Nk, Nk))
    do = torch.randn(2, 4, Nq, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    allowed = mask_info(spec, Nq, Nk).dense("cuda")

    def naive(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 64 ** -0.5
        return torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0) @ v

    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = naive(*ref_in)
    g_ref = torch.autograd.grad(ref, ref_in, do.float())
    low_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    low = naive(*low_in)
    g_low = torch.autograd.grad(low, low_in, do)
    out = attention(q, k, v, spec, backend=backend)
    g_out = torch.autograd.grad(out, (q, k, v), do)
    assert (out.float() - ref).abs().max() <= 2 * (low.float() - ref).abs().max() + 1e-3
    for name, a, b, c in zip(("dq", "dk", "dv"), g_out, g_low, g_ref):
        assert torch.isfinite(a).all(), name
        assert (a.float() - c).abs().max() <= 3 * (b.float() - c).abs().max() + 1e-3, name


def test_flex_decoding_refused_where_its_template_needs_removed_block_pointers(tmp_path, monkeypatch):
    """torch 2.11's Flex decoding template (queries < 128) calls ``tl.make_block_ptr``, which triton 3.9 removed
    (H100, results/h100/2026-12-06h/10: ``InductorError ... Block pointers have been removed``): the ``flex`` backend
    names the pair for short queries instead of failing in the compiler; a triton with block pointers, or templates
    without them, are fine."""
    import types

    import triton.language as tl

    from attn_zoo import flex as F
    from attn_zoo.backends.torch_anchors import _flex_supports

    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "flex_attention.py.jinja").write_text("p = tl.make_block_ptr(base=X)\n")
    assert not F._templates_use_block_ptr(str(tmp_path))  # only a decoding template counts
    (tmp_path / "templates" / "flex_decode.py.jinja").write_text("M_block_ptr = tl.make_block_ptr(base=M)\n")
    assert F._templates_use_block_ptr(str(tmp_path))

    def removed(*a, **kw):
        """Block pointers have been removed. Use a tensor descriptor instead."""
        raise NotImplementedError

    def present(*a, **kw):
        """Returns a pointer to a block in a parent tensor."""

    spec = AttentionSpec(kind="flash")
    cuda = types.SimpleNamespace(type="cuda")
    cuda_q = types.SimpleNamespace(is_cuda=True, device=cuda, dtype=torch.bfloat16, shape=(1, 4, 35, 64))
    long_q = types.SimpleNamespace(is_cuda=True, device=cuda, dtype=torch.bfloat16, shape=(1, 4, 128, 64))
    try:
        for stub, uses, refused in ((removed, True, True), (present, True, False), (removed, False, False)):
            monkeypatch.setattr(tl, "make_block_ptr", stub)
            monkeypatch.setattr(F, "_templates_use_block_ptr", lambda root, uses=uses: uses)
            F.flex_decoding_unsupported.cache_clear()
            why = F.flex_decoding_unsupported()
            assert (why is not None) == refused
            assert _flex_supports(cuda_q, None, None, spec, False) == why
            assert _flex_supports(long_q, None, None, spec, False) is None  # 128 queries: not the decoding kernel
            if refused:
                import triton

                assert f"torch {torch.__version__}" in why and f"triton {triton.__version__}" in why and "128" in why
    finally:  # a faked refusal must not stay cached for later tests
        F.flex_decoding_unsupported.cache_clear()


def test_torch_backend_keeps_short_queries_off_flex_where_its_decoding_kernel_cannot_compile(monkeypatch):
    """backend='flex' names the torch 2.11 + triton 3.9 pair for fewer than 128 queries; the ``torch`` backend's Flex
    path (window / block-sparse / documents on CUDA) met the same InductorError: a warning naming only the
    exception's type before the dense fallback, and with ``return_lse`` the InductorError itself. Now it goes to SDPA
    with the dense mask directly and refuses ``return_lse`` with the reason."""
    import types

    import triton.language as tl

    from attn_zoo import flex as F
    from attn_zoo.backends import torch_softmax as TS

    def removed(*a, **kw):
        """Block pointers have been removed. Use a tensor descriptor instead."""
        raise NotImplementedError

    monkeypatch.setattr(tl, "make_block_ptr", removed)
    monkeypatch.setattr(F, "_templates_use_block_ptr", lambda root: True)
    F.flex_decoding_unsupported.cache_clear()
    try:
        spec = AttentionSpec(kind="sliding_window", window_size=(3, 0))
        cuda = types.SimpleNamespace(type="cuda")

        def mk(n):
            return types.SimpleNamespace(is_cuda=True, device=cuda, dtype=torch.bfloat16, shape=(1, 4, n, 64))

        why = TS._supports(mk(35), mk(300), mk(300), spec, True)
        assert why is not None and why.startswith("return_lse needs the FlexAttention path, and torch ")
        assert "tl.make_block_ptr" in why and "use backend='reference' (or 'triton', where it takes the call)" in why
        assert TS._supports(mk(128), mk(300), mk(300), spec, True) is None  # not the decoding kernel
        assert TS._supports(mk(35), mk(300), mk(300), spec, False) is None  # the forward: SDPA, dense mask
        assert F.flex_decoding_refusal(mk(35)) == F.flex_decoding_unsupported() and F.flex_decoding_refusal(mk(128)) is None
    finally:
        F.flex_decoding_unsupported.cache_clear()
