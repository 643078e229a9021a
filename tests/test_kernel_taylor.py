"""Taylor-map linear attention in the fused parallel form (kernels/taylor.py, backend ``parallel`` of ``linear``).

Ground truth: the fp32 masked quadratic form on explicit features, :func:`attn_zoo.reference.linear_attention_reference`
(the kernel never builds ``phi``: ``phi(q).phi(k) = 1 + s + s^2/2`` is what these tests check). CPU: the Triton
interpreter (tests/conftest.py), small shapes. 16-bit inputs follow the FlashAttention rule of
tests/test_kernel_linear.py: error against the fp32 reference at most 2x (gradients 3x) that of plain PyTorch in
that dtype.
"""

import pytest
import torch

from attn_zoo import AttentionSpec, attention
from attn_zoo.functional import resolve_backend
from attn_zoo.reference import linear_attention_reference
from kernels.taylor import taylor_parallel
from tests.test_kernel_linear import DEV, _grads, _inputs, _plain_torch, rel

TAYLOR = dict(kind="linear", feature_map="taylor")


@pytest.mark.parametrize(
    "Hq,Hkv,Nq,Nk,D,Dv,causal",
    [
        (2, 1, 1, 1, 16, 16, True),     # one token: out = v, dq = dk = 0
        (2, 1, 70, 70, 16, 16, True),   # GQA, N past one 64-row tile
        (4, 2, 65, 65, 16, 24, True),   # Dv != D (padded to 32)
        (2, 2, 33, 50, 8, 16, True),    # Nk > Nq: bottom-right, the first 17 keys seen by every row
        (2, 1, 50, 33, 16, 16, True),   # Nq > Nk: the top 17 rows see nothing and are 0
        (4, 1, 40, 65, 16, 12, False),  # non-causal, MQA
    ],
)
def test_fp32_outputs_and_every_gradient_vs_reference(Hq, Hkv, Nq, Nk, D, Dv, causal):
    spec = AttentionSpec(causal=causal, **TAYLOR)
    q, k, v, do = _inputs(2, Hq, Hkv, Nq, Nk, D, Dv, seed=Nq + Nk)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="parallel"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.shape == r.shape and x.dtype == torch.float32, name
        if Nq == 1 and name in ("dq", "dk"):
            assert x.abs().max() <= 1e-5, name
            continue
        assert rel(x, r) <= 1e-5, (name, rel(x, r))
    if causal and Nq > Nk:
        assert (got[0][:, :, : Nq - Nk] == 0).all()


def test_bf16_flash_attention_rule():
    """FlashAttention rule (out 2x, grads 3x plain bf16 PyTorch's error); the output is held to 1.5x with no slack:
    the row sums add the same bf16-rounded weights as the numerator (1.7-1.9x when they did not)."""
    spec = AttentionSpec(causal=True, **TAYLOR)
    q, k, v, do = _inputs(1, 2, 1, 80, 80, 16, 16, seed=5)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    lo = [t.bfloat16() for t in (q, k, v, do)]
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="parallel"), *lo)
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, spec), *lo)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref, plain)):
        assert x.dtype == torch.bfloat16, name
        assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (name, rel(x, r), rel(p, r))
    assert rel(got[0], ref[0]) <= 1.5 * rel(plain[0], ref[0]), (rel(got[0], ref[0]), rel(plain[0], ref[0]))


def test_fp16_large_inputs_stay_finite():
    """``w = 1 + s + s^2/2`` passes 65504 from ``|s| ~ 360``: float16 inputs run in float32 and come back float16."""
    spec = AttentionSpec(causal=True, **TAYLOR)
    q, k, v, do = _inputs(1, 2, 1, 24, 24, 16, 16, seed=9)
    q, k = q * 40, k * 40  # |s| up to ~ 40 * 40 * 4 / 4 = 1600
    lo = [t.half() for t in (q, k, v, do)]
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), *(t.float() for t in lo[:3]), lo[3].float())
    got = _grads(lambda a, b, c: taylor_parallel(a, b, c, causal=True, eps=spec.eps), *lo)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.dtype == torch.float16 and torch.isfinite(x).all(), name
        assert rel(x, r) <= 2e-3, (name, rel(x, r))


def test_causal_never_reads_the_future_and_nan_reaches_its_rows():
    spec = AttentionSpec(causal=True, **TAYLOR)
    q, k, v, _ = _inputs(1, 2, 2, 72, 72, 16, 16, seed=11)
    k2 = k.clone()
    k2[:, :, 60:] *= 6.0
    a = attention(q, k, v, spec, backend="parallel")
    b = attention(q, k2, v, spec, backend="parallel")
    assert torch.equal(a[:, :, :60], b[:, :, :60])
    assert not torch.allclose(a[:, :, 60:], b[:, :, 60:])
    k2[0, :, 30, 3] = float("nan")
    c = attention(q, k2, v, spec, backend="parallel")[0]
    assert torch.isnan(c[:, 30:]).all()  # every row that sees key 30
    assert torch.equal(c[:, :30], a[0, :, :30])  # masked weights are 0 through where(), not 0 * NaN


def test_supports_dispatch_and_bad_inputs():
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    b = resolve_backend(q, k, v, AttentionSpec(**TAYLOR), "parallel")
    for spec, lse, want in [(AttentionSpec(kind="linear", feature_map="elu1"), False, "feature_map='taylor'"),
                            (AttentionSpec(**TAYLOR), True, "return_lse")]:
        assert want in b.why_not(q, k, v, spec, lse)
    with pytest.raises(ValueError, match="backend='parallel' cannot run this input.*feature_map='taylor'"):
        attention(q, k, v, AttentionSpec(kind="linear", feature_map="favor"), backend="parallel")
    # auto's static order: triton (chunked) first, parallel on CUDA only (ahead of triton below
    # TAYLOR_CHUNKED_MIN_N tokens: tests/test_taylor_chunked.py), then torch
    from attn_zoo.registry import available_backends

    order = available_backends("linear")
    assert order.index("triton") < order.index("parallel") < order.index("torch")
    if DEV == "cpu":
        assert resolve_backend(q, k, v, AttentionSpec(**TAYLOR)).name == "torch"
    for kw, arg in [(dict(eps=0.0), "eps"), (dict(eps=float("nan")), "eps")]:
        with pytest.raises(ValueError, match=arg):
            taylor_parallel(q, k, v, **kw)
    with pytest.raises(ValueError, match="Hq=2 must be a multiple of Hkv=3"):
        taylor_parallel(q, k.expand(1, 3, 8, 16), v.expand(1, 3, 8, 16))
    big = [t.new_zeros(65536, 1, 1, 16) for t in (q, k, v)]
    with pytest.raises(ValueError, match=r"B \* Hq = 65536 \* 1 = 65536 exceeds 65535"):
        taylor_parallel(*big)
    assert "grid limit" in b.why_not(*big, AttentionSpec(**TAYLOR), False)
    with pytest.raises(ValueError, match="one dtype"):
        taylor_parallel(q, k.double(), v)
    wide, narrow = q.new_zeros(1, 1, 4, 272), q.new_zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match=r"D=272 \(q.shape\[3\]\) must be in \[1, 256\]"):
        taylor_parallel(wide, wide, narrow)
    with pytest.raises(ValueError, match=r"Dv=272 \(v.shape\[3\]\) must be <= 256"):
        taylor_parallel(narrow, narrow, wide)
    assert "D=272 outside [1, 256]" in b.why_not(wide, wide, narrow, AttentionSpec(**TAYLOR), False)
    assert "Dv=272 exceeds the kernel's limit of 256" in b.why_not(narrow, narrow, wide, AttentionSpec(**TAYLOR), False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_picks_parallel_for_taylor_d16_on_cuda():
    """A Based-sized Taylor layer (D = 16) at a short length (N = 512 < TAYLOR_CHUNKED_MIN_N) runs the fused parallel
    form under ``auto`` on a GPU, and matches the chunked PyTorch form in bf16 training shapes; at long lengths auto
    takes the fused chunked taylor_chunk (causal, Nq = Nk, D <= 16) or else the chunked triton backend (symmetric
    features, from TAYLOR_CHUNKED_MIN_N tokens, D <= 21)."""
    from attn_zoo.backends.triton_taylor import TAYLOR_CHUNKED_MIN_N

    spec = AttentionSpec(causal=True, **TAYLOR)
    q, k, v, do = (t.bfloat16() for t in _inputs(4, 8, 8, 512, 512, 16, 16, seed=2))
    assert resolve_backend(q, k, v, spec).name == "parallel"
    assert resolve_backend(q[..., :8], k[..., :8], v, spec).name == "parallel"  # short: parallel at any D
    long = torch.zeros(1, 1, TAYLOR_CHUNKED_MIN_N, 16, device=q.device, dtype=q.dtype)
    assert resolve_backend(long, long, long, spec).name == "taylor_chunk"
    assert resolve_backend(long[..., :8], long[..., :8], long, spec).name == "taylor_chunk"
    assert resolve_backend(long, long, long, spec.replace(causal=False)).name == "triton"
    got = _grads(lambda a, b, c: attention(a, b, c, spec), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), *(t.float() for t in (q, k, v, do)))
    pt = _grads(lambda a, b, c: attention(a, b, c, spec, backend="torch"), q, k, v, do)
    for i, (name, x, r, p) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref, pt)):
        assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (name, rel(x, r), rel(p, r))


def test_taylor_parallel_refuses_bad_arguments_naming_them():
    """Each bad argument gives a ValueError / TypeError that names it (not a ZeroDivisionError or AttributeError from
    inside, and not a silent reading of ``causal="no"`` as causal or of ``eps=True`` as 1)."""
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    for kw, arg in [(dict(eps=True), "eps"), (dict(eps=1e-40), "eps"), (dict(eps=1e39), "eps"),
                    (dict(causal="no"), "causal"), (dict(causal=None), "causal")]:
        with pytest.raises(ValueError, match=arg):
            taylor_parallel(q, k, v, **kw)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        taylor_parallel(q.tolist(), k, v)
    with pytest.raises(ValueError, match="Hkv=0"):
        taylor_parallel(q, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="Hq=0"):
        taylor_parallel(q[:, :0], k, v)
    with pytest.raises(ValueError, match="D=0"):
        taylor_parallel(q[..., :0], k[..., :0], v)
    with pytest.raises(ValueError, match="one device"):
        taylor_parallel(q, k.to("meta"), v)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_taylor_parallel_on_cpu_without_the_interpreter_says_so(monkeypatch):
    """Called directly on CPU tensors without TRITON_INTERPRET=1, Triton failed with '0 active drivers'."""
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device.*TRITON_INTERPRET=1"):
        taylor_parallel(q, k, v)


@pytest.mark.parametrize("kw, msg", [
    (dict(causal="no"), r"causal='no' is not supported; allowed values: True, False"),
    (dict(causal=1), r"causal=1 is not supported; allowed values: True, False"),
    (dict(causal=None), r"causal=None is not supported"),
    (dict(eps=-1e-6), r"eps must be a finite float > 0, got -1e-06"), (dict(eps=float("nan")), r"eps.*got nan"),
    (dict(eps="1e-6"), r"eps must be a finite float > 0, got '1e-6'"), (dict(eps=True), r"eps.*got True"),
])
def test_taylor_parallel_refuses_bad_scalar_arguments_before_any_launch(kw, msg, monkeypatch):
    """causal (the message now in the house style) and eps are checked on the host before the autograd function."""
    import kernels.taylor as kt

    def no_launch(*a):
        raise AssertionError("reached the kernels")

    monkeypatch.setattr(kt._TaylorParallel, "apply", no_launch)
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    with pytest.raises(ValueError, match=msg):
        taylor_parallel(q, k, v, **kw)


def test_eps_below_the_float32_normal_range():
    """eps = 1e-40 is 0 / subnormal in float32: a row that sees no key got 0 * (1 / eps) = NaN (reference and torch
    give 0). The kernel refuses it and so does supports(), so auto takes the next backend."""
    spec = AttentionSpec(causal=True, eps=1e-40, **TAYLOR)
    q, k, v, _ = _inputs(1, 2, 1, 10, 4, 16, 16)
    assert "eps" in resolve_backend(q, k, v, AttentionSpec(**TAYLOR), "parallel").why_not(q, k, v, spec, False)
    with pytest.raises(ValueError, match="eps"):
        attention(q, k, v, spec, backend="parallel")
    ok = AttentionSpec(causal=True, eps=2e-38, **TAYLOR)
    out = attention(q, k, v, ok, backend="parallel")
    assert (out[:, :, :6] == 0).all() and torch.isfinite(out).all()


def test_second_order_gradients_are_refused_not_silently_dropped():
    """The backward is not differentiable: with create_graph=True the gradient through the kernel must not be
    silently treated as a constant (a gradient penalty would lose its kernel term without any error)."""
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    q.requires_grad_()
    out = taylor_parallel(q, k, v)
    (gq,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (gq.pow(2).sum() + q.sum()).backward()


@pytest.mark.parametrize("backend", ["parallel", "taylor_chunk"])
def test_model_on_the_parallel_backend_generates_with_a_cache(backend):
    """train.py attention_backend=parallel builds every layer with backend='parallel'; generate(use_cache=True)
    passed it to linear_prefill, which refused it ("backend='parallel' is not supported"). The fused forms keep
    no state, so the prefill takes the chunked form; the tokens equal those of the no-cache path."""
    from attn_zoo.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, max_seq_len=32, n_layer=1, n_head=2, d_model=32),
                AttentionSpec(causal=True, **TAYLOR), backend=backend).eval().to(DEV)
    idx = torch.randint(0, 32, (2, 9), device=DEV)
    want = model.generate(idx, 4, greedy=True, use_cache=False)
    assert torch.equal(model.generate(idx, 4, greedy=True, use_cache=True), want)


@pytest.mark.parametrize("wants", [(True, False, False), (False, True, False), (False, False, True)])
def test_gradients_of_only_the_inputs_that_need_them(wants, monkeypatch):
    """Only q needs a gradient: the dk/dv kernel is not launched (and vice versa); the gradients that are made equal
    the reference's."""
    import kernels.taylor as kt

    spec = AttentionSpec(causal=True, **TAYLOR)
    q, k, v, do = _inputs(1, 2, 1, 20, 20, 16, 16, seed=4)
    launched = []
    for name in ("_taylor_bwd_dq", "_taylor_bwd_dkdv"):
        kernel = getattr(kt, name)
        monkeypatch.setattr(kt, name, type("K", (), {"__getitem__": lambda self, g, n=name, k=kernel: (
            launched.append(n), k[g])[1]})())
    leaves = [t.clone().requires_grad_(w) for t, w in zip((q, k, v), wants)]
    out = taylor_parallel(*leaves, causal=True, eps=spec.eps)
    got = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)[1:]
    want_ref = [r for r, w in zip(ref, wants) if w]
    for x, r in zip(got, want_ref):
        assert rel(x, r) <= 1e-5
    assert launched == (["_taylor_bwd_dq"] if wants[0] else ["_taylor_bwd_dkdv"])


def test_causal_offset_spanning_several_key_tiles_every_gradient():
    """Nk = 3 tiles + 5 keys, Nq = one tile (causal, offset Nk - Nq past two tiles): every key tile is seen by the
    first query tile, so the dk / dv kernel's first query tile must come from the offset (a tile's first key
    j is seen by rows i >= j - (Nk - Nq)); dropping the offset leaves dk = dv = 0 on the later key tiles."""
    from kernels.taylor import _meta

    spec = AttentionSpec(causal=True, **TAYLOR)
    block = _meta(torch.empty(1, 16), torch.empty(1, 16), True)["BLOCK_N"]  # fp32, D = Dv = 16
    Nq, Nk = block, 3 * block + 5
    q, k, v, do = _inputs(1, 2, 1, Nq, Nk, 16, 16, seed=3)
    got = _grads(lambda a, b, c: attention(a, b, c, spec, backend="parallel"), q, k, v, do)
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, spec), q, k, v, do)
    for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert x.shape == r.shape, name
        assert rel(x, r) <= 1e-5, (name, rel(x, r))
    assert got[3][:, :, block: 3 * block].abs().max() > 0  # key tiles past the first have a gradient
