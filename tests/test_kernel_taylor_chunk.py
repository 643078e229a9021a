"""The fused chunked Taylor kernel (kernels/taylor_chunk.py, backend ``taylor_chunk`` of ``linear``).

Ground truth: the fp32 masked quadratic form on explicit features, :func:`attn_zoo.reference.linear_attention_reference`.
CPU: the Triton interpreter (tests/conftest.py), small shapes that still cross the kernel's edges: several chunks
with a partial last one, a sequence shorter than one chunk, more than one (batch, head) program and value block
(the ``dq`` / ``dk`` partial sums), ``D`` and ``Dv`` below the padded tile widths. 16-bit inputs follow the
FlashAttention rule of tests/test_kernel_linear.py (error at most 2x, gradients 3x, that of plain PyTorch).
"""

import pytest
import torch

from attn_zoo import AttentionSpec, attention
from attn_zoo.functional import resolve_backend
from attn_zoo.reference import linear_attention_reference
from kernels.taylor_chunk import TaylorChunkConfig, taylor_chunk, taylor_chunk_torch
from tests.test_kernel_linear import DEV, _grads, _inputs, _plain_torch, rel

TAYLOR = dict(kind="linear", feature_map="taylor")
SPEC = AttentionSpec(causal=True, **TAYLOR)
NAMES = ("out", "dq", "dk", "dv")


def _ref(q, k, v, do):
    return _grads(lambda a, b, c: linear_attention_reference(a, b, c, SPEC), q, k, v, do)


@pytest.mark.parametrize(
    "B,Hq,Hkv,N,D,Dv,chunk,block_v,fused",
    [
        (2, 2, 2, 1, 16, 16, 64, None, True),     # one token: out = v, dq = dk = 0
        (1, 2, 2, 40, 16, 16, 64, None, True),    # N < C: the own-chunk form only
        (2, 2, 1, 70, 16, 32, 32, 16, True),      # 3 chunks (last partial), GQA, 2 value blocks (partial sums)
        (1, 2, 2, 100, 8, 16, 16, None, False),   # smaller D (padded to 16), 7 chunks, two backward launches
        (1, 3, 3, 50, 12, 24, 16, 16, True),      # D, Dv not powers of two; Dv = 24 over 2 blocks of 16
        (1, 1, 1, 129, 16, 64, 64, 32, False),    # Based's Dv = 64, 3 chunks (the last one row)
    ],
)
def test_fp32_outputs_and_every_gradient_vs_reference(B, Hq, Hkv, N, D, Dv, chunk, block_v, fused):
    q, k, v, do = _inputs(B, Hq, Hkv, N, N, D, Dv, seed=N + D)
    cfg = TaylorChunkConfig(chunk=chunk, block_v=block_v, bwd_fused=fused)
    got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), q, k, v, do)
    ref = _ref(q, k, v, do)
    for name, x, r in zip(NAMES, got, ref):
        assert x.shape == r.shape and x.dtype == torch.float32, name
        if N == 1 and name in ("dq", "dk"):
            assert x.abs().max() <= 1e-5, name
            continue
        assert rel(x, r) <= 1e-5, (name, rel(x, r))


@pytest.mark.parametrize("fused", [True, False])
def test_segments_every_gradient_vs_reference_and_unsegmented(fused):
    """Forced segments 2 and 3 of N = 70 (chunk 16: segments of 48 / 32 tokens, a partial last chunk and segment),
    B 2, GQA, Dv = 24 over two value blocks of 16: output and every gradient against the fp32 reference, and within
    1e-5 of the unsegmented run (segments=1)."""
    q, k, v, do = _inputs(2, 2, 1, 70, 70, 16, 24, seed=21)
    ref = _ref(q, k, v, do)
    runs = {}
    for ns, want in ((1, (1, 80)), (2, (2, 48)), (3, (3, 32))):
        cfg = TaylorChunkConfig(chunk=16, block_v=16, bwd_fused=fused, segments=ns)
        assert cfg.resolve_segments(4, 24, 70) == want
        runs[ns] = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), q, k, v, do)
        for name, x, r in zip(NAMES, runs[ns], ref):
            assert x.shape == r.shape and rel(x, r) <= 1e-5, (ns, name, rel(x, r))
    for ns in (2, 3):
        for name, x, r in zip(NAMES, runs[ns], runs[1]):
            assert rel(x, r) <= 1e-5, (ns, name, rel(x, r))


def test_segmented_call_host_work_is_a_few_operations(monkeypatch):
    """The split's prefix / suffix state sums are one buffer and one in-place ``cumsum`` per side, and ``do . o`` one
    launch: a forced 8-segment call issues a handful of PyTorch operations (the 2026-12-04 code: 28 forward, 51
    backward, host time that showed in the 16k timings), no ``cat`` / ``flip`` and no fp32 copy of ``out`` or
    ``do`` (``_to_copy`` only for the two ``(B, H, N, D)`` gradient casts). Launches are stubbed: host work only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import kernels.taylor_chunk as tc

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    launched = []
    monkeypatch.setattr(tc, "launch", lambda kernel, grid, args, **kw: launched.append((kernel, tuple(grid))))
    bf = dict(device=DEV, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = torch.randn(1, 2, 128, 16, **bf), torch.randn(1, 2, 128, 16, **bf), torch.randn(1, 2, 128, 64, **bf)
    cfg = TaylorChunkConfig(chunk=16, block_v=32, segments=8)
    with Ops() as fwd:
        o = taylor_chunk(q, k, v, config=cfg)
    do = torch.randn_like(o)
    with Ops() as bwd:
        o.backward(do)
    # state sums, forward, delta (64-row blocks), query state sums, fused backward
    assert [g for _, g in launched] == [(2, 2, 7), (2, 2, 8), (2, 2), (2, 2, 7), (2, 2, 16)], launched
    assert fwd.names.count("cumsum_") == 1 and bwd.names.count("cumsum_") == 1, (fwd.names, bwd.names)
    for ops in (fwd.names, bwd.names):
        assert not {"cat", "flip", "cumsum", "mul", "zeros_like"} & set(ops), ops
    assert len(fwd.names) <= 8 and len(bwd.names) <= 18, (fwd.names, bwd.names)
    assert bwd.names.count("_to_copy") == 2, bwd.names


def test_delta_kernel_matches_fp32_on_strided_bf16():
    """``_delta``: ``do_i . o_i`` in fp32 from bfloat16 ``out`` / ``do`` given as ``(B, N, H, Dv)`` transposes (row
    stride ``H * Dv``), ``Dv = 24`` (padded tile), ``N = 70`` (a partial row block), against the fp32 sum."""
    from kernels.taylor_chunk import _delta

    g = torch.Generator().manual_seed(5)
    o, do = (torch.randn(2, 70, 3, 24, generator=g).to(DEV, torch.bfloat16).transpose(1, 2) for _ in range(2))
    assert not o.is_contiguous()
    got = _delta(o, do)
    want = (o.float() * do.float()).sum(-1)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 70)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), (got - want).abs().max()


def test_auto_segments_rule_and_an_auto_split_run():
    """``segments=None``: one segment while ``B * H * ceil(Dv / block_v) >= MIN_PROGRAMS`` (the measured 1k and 4k
    shapes), else about two programs per SM with segments of >= MIN_SEG_CHUNKS chunks (none below AUTO_SPLIT_MIN_CHUNKS chunks;
    block_v 32 wherever the split can reach MIN_PROGRAMS); and a run the rule splits (one head, chunk 16: 4 segments
    of 528 tokens) matches the reference and the unsegmented run."""
    from kernels.taylor_chunk import AUTO_SPLIT_MIN_CHUNKS, MIN_SEG_CHUNKS

    auto = TaylorChunkConfig()
    assert auto.segments is None
    assert auto.resolve_segments(16 * 16, 64, 1024) == (1, 1024)  # 512 programs of block_v 32
    assert auto.resolve_segments(4 * 16, 64, 4096) == (1, 4096)  # 128 programs
    # 16k, B 1: block_v 32 (the split can fill the GPU), 32 programs -> 8 segments, 256 programs
    assert auto.resolve_block_v(16, 64, 16384) == 32
    assert auto.resolve_segments(16, 64, 16384) == (8, 2048)
    assert auto.resolve_segments(16, 64, 16384, sms=66) == (4, 4096)
    # too few chunks to split: 4k with B 1 (64 chunks) and 1k stay whole at block_v 16
    assert auto.resolve_block_v(16, 64, 4096) == 16 and auto.resolve_segments(16, 64, 4096) == (1, 4096)
    assert auto.resolve_block_v(1, 64, 1024) == 16 and auto.resolve_segments(1, 64, 1024) == (1, 1024)
    assert auto.resolve_segments(1, 64, 64 * AUTO_SPLIT_MIN_CHUNKS) == (AUTO_SPLIT_MIN_CHUNKS // MIN_SEG_CHUNKS,
                                                                      64 * MIN_SEG_CHUNKS)  # the shortest split
    assert auto.resolve_segments(16, 64, 8192) == (4, 2048)  # 8k, B 1: block_v 32, 32 programs -> 4 segments
    assert TaylorChunkConfig(segments=1).resolve_block_v(16, 64, 16384) == 16  # no split allowed: the old rule
    assert auto.resolve_segments(1, 16, 64 * (AUTO_SPLIT_MIN_CHUNKS - 1)) == (1, 64 * (AUTO_SPLIT_MIN_CHUNKS - 1))
    assert TaylorChunkConfig(segments=9).resolve_segments(1, 16, 100) == (2, 64)  # 2 chunks: at most 2 segments
    assert TaylorChunkConfig(segments=5).resolve_segments(1, 16, 0) == (1, 64)

    q, k, v, do = _inputs(1, 1, 1, 2100, 2100, 8, 16, seed=4)
    cfg = TaylorChunkConfig(chunk=16)
    assert cfg.resolve_segments(1, 16, 2100) == (4, 528)  # 132 chunks: 33 + 33 + 33 + 33
    got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), q, k, v, do)
    one = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps,
                                              config=TaylorChunkConfig(chunk=16, segments=1)), q, k, v, do)
    for name, x, r, o in zip(NAMES, got, _ref(q, k, v, do), one):
        assert rel(x, r) <= 1e-5 and rel(x, o) <= 1e-5, (name, rel(x, r), rel(x, o))


def test_backend_by_name_matches_reference_and_auto_ranks_it_by_length():
    from attn_zoo.backends.triton_taylor_chunk import PRIORITY_LONG, TAYLOR_FUSED_MIN_N
    from attn_zoo.registry import available_backends, get_backends

    q, k, v, do = _inputs(1, 2, 1, 72, 72, 16, 16, seed=3)
    got = _grads(lambda a, b, c: attention(a, b, c, SPEC, backend="taylor_chunk"), q, k, v, do)
    for name, x, r in zip(NAMES, got, _ref(q, k, v, do)):
        assert rel(x, r) <= 1e-5, (name, rel(x, r))
    b = get_backends("linear")["taylor_chunk"]
    assert b.priority == 240 and "taylor_chunk" in available_backends("linear") and b.devices == ("cuda",)
    assert resolve_backend(q, k, v, SPEC).name != "taylor_chunk"  # CPU tensors: CUDA-only under auto
    n = TAYLOR_FUSED_MIN_N
    long_, short = torch.empty(1, 1, n, 16), torch.empty(1, 1, n - 1, 16)
    assert b.auto_priority(long_, long_, long_, SPEC) == PRIORITY_LONG
    assert b.auto_priority(short, short, short, SPEC) is None
    assert b.auto_priority(long_, long_, long_, SPEC.replace(feature_map="elu1")) is None


def test_pytorch_algorithm_matches_reference_in_fp64():
    """The state split by order (taylor_chunk_torch, the kernel's algorithm in PyTorch) is exact: fp64 agreement
    with the quadratic form, at several chunk sizes, including one that does not divide N."""
    q, k, v, do = (t.double().cpu() for t in _inputs(2, 2, 2, 37, 37, 6, 5, seed=1))
    ref = _grads(lambda a, b, c: linear_attention_reference(a, b, c, SPEC), q, k, v, do)
    for chunk in (1, 8, 37, 64):
        got = _grads(lambda a, b, c: taylor_chunk_torch(a, b, c, SPEC.eps, chunk=chunk), q, k, v, do)
        for name, x, r in zip(NAMES, got, ref):
            assert x.dtype == torch.float64 and rel(x, r) <= 1e-12, (chunk, name, rel(x, r))


def test_bf16_flash_attention_rule():
    q, k, v, do = _inputs(1, 2, 1, 150, 150, 16, 32, seed=5)
    ref = _ref(q, k, v, do)
    lo = [t.bfloat16() for t in (q, k, v, do)]
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, SPEC), *lo)
    for chunk, ns in ((32, 1), (64, 1), (32, 3)):
        cfg = TaylorChunkConfig(chunk=chunk, block_v=16, segments=ns)
        got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), *lo)
        for i, (name, x, r, p) in enumerate(zip(NAMES, got, ref, plain)):
            assert x.dtype == torch.bfloat16 and torch.isfinite(x).all(), name
            assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (chunk, ns, name, rel(x, r), rel(p, r))


def test_fp16_large_inputs_stay_finite():
    """``w`` passes 65504 from ``|s| ~ 360``: float16 inputs run in float32 and come back float16."""
    q, k, v, do = _inputs(1, 2, 1, 40, 40, 16, 16, seed=9)
    q, k = q * 40, k * 40
    lo = [t.half() for t in (q, k, v, do)]
    ref = _ref(*(t.float() for t in lo))
    got = _grads(lambda a, b, c: taylor_chunk(a, b, c, config=TaylorChunkConfig(chunk=16)), *lo)
    for name, x, r in zip(NAMES, got, ref):
        assert x.dtype == torch.float16 and torch.isfinite(x).all(), name
        assert rel(x, r) <= 2e-3, (name, rel(x, r))


def test_causal_never_reads_the_future():
    """Keys / values from token 40 on (inside the third chunk of 16) change no earlier row, and the gradients of
    the earlier keys / values only through the later rows' loss (here: none)."""
    q, k, v, do = _inputs(1, 2, 2, 60, 60, 16, 16, seed=11)
    cfg = TaylorChunkConfig(chunk=16)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 40:] *= 6.0
    v2[:, :, 40:] += 3.0
    a = taylor_chunk(q, k, v, config=cfg)
    b = taylor_chunk(q, k2, v2, config=cfg)
    assert torch.equal(a[:, :, :40], b[:, :, :40])
    assert not torch.allclose(a[:, :, 40:], b[:, :, 40:])
    do = do.clone()
    do[:, :, 40:] = 0
    for kk, vv in ((k, v), (k2, v2)):
        g = _grads(lambda x, y, z: taylor_chunk(x, y, z, config=cfg), q, kk, vv, do)
        assert (g[1][:, :, 40:] == 0).all() and (g[2][:, :, 40:] == 0).all() and (g[3][:, :, 40:] == 0).all()


def test_refusals_name_the_argument_and_the_allowed_values():
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    with pytest.raises(ValueError, match=r"causal=False.*allowed: True"):
        taylor_chunk(q, k, v, causal=False)
    with pytest.raises(ValueError, match=r"doc_ids.*allowed: None"):
        taylor_chunk(q, k, v, doc_ids=torch.zeros(1, 8, dtype=torch.int32, device=q.device))
    with pytest.raises(ValueError, match=r"Nq=4.*Nk=8.*allowed: Nq == Nk"):
        taylor_chunk(q[:, :, :4], k, v)
    with pytest.raises(ValueError, match=r"D=17.*\[1, 16\]"):
        taylor_chunk(q.new_zeros(1, 1, 4, 17), q.new_zeros(1, 1, 4, 17), q.new_zeros(1, 1, 4, 16))
    with pytest.raises(ValueError, match=r"Dv=257"):
        taylor_chunk(q.new_zeros(1, 1, 4, 16), q.new_zeros(1, 1, 4, 16), q.new_zeros(1, 1, 4, 257))
    with pytest.raises(ValueError, match="eps"):
        taylor_chunk(q, k, v, eps=0.0)
    with pytest.raises(ValueError, match="one dtype"):
        taylor_chunk(q, k.double(), v)
    with pytest.raises(ValueError, match="Hq=2 must be a multiple of Hkv=3"):
        taylor_chunk(q, k.expand(1, 3, 8, 16), v.expand(1, 3, 8, 16))
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        taylor_chunk(q, k.tolist(), v)
    with pytest.raises(ValueError, match="config"):
        taylor_chunk(q, k, v, config=dict(chunk=64))
    for kw, arg in [(dict(chunk=48), r"chunk=48.*\(16, 32, 64, 128\)"), (dict(block_v=8), r"block_v=8"),
                    (dict(num_warps=3), "num_warps"), (dict(num_stages=0), "num_stages"),
                    (dict(segments=0), r"segments=0.*None.*\[1, 4096\]"), (dict(segments=4097), "segments=4097"),
                    (dict(segments=True), "segments=True"), (dict(segments=2.0), "segments=2.0"),
                    # floats / bools equal to an allowed int: refused here, not deep in the launch
                    (dict(chunk=64.0), r"chunk=64.0.*\(16, 32, 64, 128\)"), (dict(chunk=True), "chunk=True"),
                    (dict(block_v=32.0), r"block_v=32.0.*None or one of \(16, 32, 64\)"),
                    (dict(num_warps=4.0), r"num_warps=4.0.*1, 2, 4, 8, 16"), (dict(num_warps=True), "num_warps=True"),
                    (dict(num_stages=True), r"num_stages=True.*\[1, 6\]")]:
        with pytest.raises(ValueError, match=arg):
            TaylorChunkConfig(**kw)


@pytest.mark.parametrize("fn, kw, msg", [
    ("kernel", dict(causal="no"), r"causal='no': taylor_chunk is causal only \(allowed: True"),
    ("kernel", dict(causal=1), r"causal=1: taylor_chunk is causal only \(allowed: True"),
    ("kernel", dict(eps=-1.0), r"eps must be a finite float > 0, got -1.0"),
    ("kernel", dict(eps=float("inf")), r"eps must be a finite float > 0, got inf"),
    ("torch", dict(chunk=True), r"chunk=True must be an int >= 1"),
    ("torch", dict(chunk=0), r"chunk=0 must be an int >= 1"), ("torch", dict(chunk=16.0), r"chunk=16.0 must be"),
])
def test_taylor_chunk_refuses_bad_scalar_arguments_before_any_launch(fn, kw, msg, monkeypatch):
    """The kernel's causal / eps (checks that existed) and the reference's chunk (a bool ran as 1) on the host, before
    the autograd function."""
    import kernels.taylor_chunk as ktc

    def no_launch(*a):
        raise AssertionError("reached the kernels")

    monkeypatch.setattr(ktc._TaylorChunk, "apply", no_launch)
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    with pytest.raises(ValueError, match=msg):
        (taylor_chunk if fn == "kernel" else taylor_chunk_torch)(q, k, v, **kw)


def test_backend_supports_says_why_not():
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    b = resolve_backend(q, k, v, SPEC, "taylor_chunk")
    assert b.why_not(q, k, v, SPEC) is None
    for spec, args, want in [
        (AttentionSpec(causal=False, **TAYLOR), (q, k, v), "causal only"),
        (AttentionSpec(kind="linear", feature_map="elu1"), (q, k, v), "feature_map='taylor'"),
        (SPEC, (q[:, :, :4], k, v), "Nq == Nk"),
        (SPEC, (q.new_zeros(1, 1, 4, 32), q.new_zeros(1, 1, 4, 32), v[:, :, :4]), "D=32"),
        (AttentionSpec(causal=True, eps=1e-40, **TAYLOR), (q, k, v), "eps"),
    ]:
        assert want in b.why_not(*args, spec), want
    assert "return_lse" in b.why_not(q, k, v, SPEC, True)
    with pytest.raises(ValueError, match="taylor_chunk.*causal only"):
        attention(q, k, v, AttentionSpec(causal=False, **TAYLOR), backend="taylor_chunk")


def test_empty_inputs_and_second_order_gradients():
    q, k, v, _ = _inputs(1, 2, 1, 8, 8, 16, 16)
    out = taylor_chunk(q[:, :, :0], k[:, :, :0], v[:, :, :0])
    assert out.shape == (1, 2, 0, 16)
    q.requires_grad_()
    (gq,) = torch.autograd.grad(taylor_chunk(q, k, v).pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (gq.pow(2).sum() + q.sum()).backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N", [1000, 4096])
def test_gpu_bf16_based_shape_every_config(N):
    """Based's layer shape (D 16, Dv 64) in bf16 on the GPU, every chunk / value block / backward launch mode
    compiled and held to the FlashAttention rule against the fp32 reference; and next to the parallel form."""
    from kernels.taylor import taylor_parallel

    q, k, v, do = _inputs(2, 4, 4, N, N, 16, 64, seed=N)
    ref = _ref(q, k, v, do)
    lo = [t.bfloat16() for t in (q, k, v, do)]
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, SPEC), *lo)
    par = _grads(lambda a, b, c: taylor_parallel(a, b, c, eps=SPEC.eps), *lo)
    for chunk in (32, 64):
        for bv in (16, 32, 64):
            for fused in (True, False):
                cfg = TaylorChunkConfig(chunk=chunk, block_v=bv, bwd_fused=fused)
                got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), *lo)
                for i, (name, x, r, p, pp) in enumerate(zip(NAMES, got, ref, plain, par)):
                    assert torch.isfinite(x).all(), (cfg, name)
                    assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (cfg, name, rel(x, r), rel(p, r))
                    assert rel(x, r) <= 2 * rel(pp, r) + 1e-3, (cfg, name, rel(x, r), rel(pp, r))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_auto_runs_it_in_fp32_and_fp16(dtype):
    """auto takes taylor_chunk for every dtype from TAYLOR_FUSED_MIN_N tokens; the bf16 test above is the only
    other GPU one, so fp32 (ieee dots, twice the tile bytes) and fp16 (run in fp32) compile and match here: fp32
    to 1e-4 of the fp32 reference, fp16 by the FlashAttention rule."""
    from attn_zoo.backends.triton_taylor_chunk import TAYLOR_FUSED_MIN_N

    N = TAYLOR_FUSED_MIN_N + 100  # a partial last chunk
    q, k, v, do = _inputs(1, 4, 2, N, N, 16, 64, seed=7)
    ref = _ref(q, k, v, do)
    lo = [t.to(dtype) for t in (q, k, v, do)]
    assert resolve_backend(*lo[:3], SPEC).name == "taylor_chunk"
    got = _grads(lambda a, b, c: attention(a, b, c, SPEC), *lo)
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, SPEC), *lo) if dtype != torch.float32 else None
    for i, (name, x, r) in enumerate(zip(NAMES, got, ref)):
        assert x.dtype == dtype and torch.isfinite(x).all(), name
        bound = 1e-4 if plain is None else (2 if i == 0 else 3) * rel(plain[i], r) + 1e-3
        assert rel(x, r) <= bound, (name, rel(x, r), bound)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_segments_based_shape():
    """The segmented path compiled on the GPU at Based's layer shape (D 16, Dv 64), N = 4000 (a partial last chunk
    and segment): bf16 by the FlashAttention rule for auto / forced segments, value blocks and both backward launch
    modes; fp32 forced segments within 1e-5 of the unsegmented run."""
    q, k, v, do = _inputs(1, 4, 2, 4000, 4000, 16, 64, seed=40)
    ref = _ref(q, k, v, do)
    lo = [t.bfloat16() for t in (q, k, v, do)]
    plain = _grads(lambda a, b, c: _plain_torch(a, b, c, SPEC), *lo)
    assert TaylorChunkConfig().resolve_segments(4, 64, 4000)[0] == 1  # too short for the automatic split
    for ns, bv, fused in ((None, None, True), (3, 32, True), (7, 16, False), (2, 64, True)):
        cfg = TaylorChunkConfig(block_v=bv, bwd_fused=fused, segments=ns)
        got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=cfg), *lo)
        for i, (name, x, r, p) in enumerate(zip(NAMES, got, ref, plain)):
            assert torch.isfinite(x).all(), (cfg, name)
            assert rel(x, r) <= (2 if i == 0 else 3) * rel(p, r) + 1e-3, (cfg, name, rel(x, r), rel(p, r))
    one = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=TaylorChunkConfig(segments=1)), q, k, v, do)
    for ns in (2, 5):
        got = _grads(lambda a, b, c: taylor_chunk(a, b, c, eps=SPEC.eps, config=TaylorChunkConfig(segments=ns)),
                     q, k, v, do)
        for name, x, o in zip(NAMES, got, one):
            assert rel(x, o) <= 1e-5, (ns, name, rel(x, o))
