"""Mamba-2 / SSD: the chunked Triton kernel (interpreter on CPU) and the chunked PyTorch form against the
step-by-step recurrence, outputs and every gradient (x, dt, A, B, C, D, initial state); the mixer's O(1) decode
step and GPT.generate with a state cache against generation without one. GPU tests are marked ``gpu``."""

import pytest
import torch

from attn_zoo.families.ssd import Mamba2, ssd, ssd_scan_naive, ssd_step
from attn_zoo.mixers import MixerSpec
from attn_zoo.model import GPT, GPTConfig

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _inputs(Bz, T, H, P, G, N, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = r(Bz, T, H, P)
    dt = torch.nn.functional.softplus(r(Bz, T, H) - 1)
    A = -torch.rand(H, generator=g) * 2 - 0.1
    Bm, Cm = r(Bz, T, G, N) / N ** 0.5, r(Bz, T, G, N)
    D = r(H)
    s0 = r(Bz, H, N, P) * 0.5
    ts = [x.to(dtype), dt, A, Bm.to(dtype), Cm.to(dtype), D, s0]
    return [t.to(device).requires_grad_() for t in ts]


def _run(backend, ins, chunk, use_s0):
    x, dt, A, Bm, Cm, D, s0 = ins
    y, S = ssd(x, dt, A, Bm, Cm, D, s0 if use_s0 else None, chunk_size=chunk, backend=backend)
    g = torch.Generator().manual_seed(1)
    dy = torch.randn(y.shape, generator=g).to(y.device, y.dtype)
    dS = torch.randn(S.shape, generator=g).to(S.device)
    wrt = [x, dt, A, Bm, Cm, D] + ([s0] if use_s0 else [])
    grads = torch.autograd.grad((y.float() * dy.float()).sum() + (S * dS).sum(), wrt)
    return [y, S, *grads]


NAMES = ["y", "final_state", "dx", "ddt", "dA", "dB", "dC", "dD", "dinitial_state"]
# (B, T, H, P, G, N, chunk): T not a multiple of the chunk, one chunk, P above one 64-wide block (two programs
# per head, partial gradients summed), groups shared by two heads
SHAPES = [(2, 40, 2, 32, 1, 16, 16), (1, 16, 1, 16, 1, 16, 16), (1, 35, 4, 80, 2, 24, 32)]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("use_s0", [False, True], ids=["s0=None", "s0"])
def test_ssd_outputs_and_every_gradient_match_the_recurrence(backend, shape, use_s0):
    Bz, T, H, P, G, N, chunk = shape
    ins = _inputs(Bz, T, H, P, G, N)
    ref = _run("naive", ins, chunk, use_s0)
    out = _run(backend, ins, chunk, use_s0)
    assert len(out) == len(ref) == (9 if use_s0 else 8)
    for name, o, r in zip(NAMES, out, ref):
        assert o.shape == r.shape, name
        err = (o.float() - r.float()).abs().max().item()
        assert err <= 2e-4 * (1 + r.abs().max().item()), f"{backend} {name}: max error {err}"


def test_ssd_triton_in_bf16_matches_the_recurrence():
    """bf16 x / B / C through the Triton backend, outputs and every gradient against the fp32 recurrence, at bf16's
    accuracy (the torch backend in bf16 sets the bar). On the CPU Triton's interpreter computes a bf16 ``tl.dot``
    wrongly (triton 3.9: ~1e10 off, silently), so ``ssd_scan`` runs there in fp32 and returns bf16."""
    shape = SHAPES[0]
    ins = _inputs(*shape[:6], dtype=torch.bfloat16)
    ref = _run("naive", [t.detach().float().requires_grad_() for t in ins], shape[6], True)
    bar = _run("torch", ins, shape[6], True)
    out = _run("triton", ins, shape[6], True)
    assert out[0].dtype == torch.bfloat16 and out[2].dtype == torch.bfloat16
    for name, o, b, r in zip(NAMES, out, bar, ref):
        err, err_bar = ((t.float() - r.float()).abs().max().item() for t in (o, b))
        assert err <= 2 * err_bar + 1e-3 * (1 + r.abs().max().item()), f"{name}: {err} (torch bf16: {err_bar})"


@pytest.mark.parametrize("target", [1, 10], ids=["group-per-program", "group-split-in-2"])
def test_ssd_triton_chunk_parallel_multi_chunk_documents_and_groups(monkeypatch, target):
    """kernels.ssd's chunk-parallel path on a multi-chunk case: T = 70 (not a multiple of the 16-chunk, 5 chunks),
    the state pass 2 chunks per step (3 steps, the carry between them), G = 1 < H = 4 heads with the backward's
    group taken by one program (dB / dC summed in registers) or split in two (fp32 partials summed), documents
    starting at a chunk edge (16, 48), inside chunks (37, 61) and one of length 1 (48), an initial state and the
    final state's gradient: outputs and every gradient against the step-by-step recurrence."""
    import kernels.ssd as ks
    from kernels.ssd import ssd_scan

    monkeypatch.setattr(ks, "_PASS_UNROLL", 2)
    monkeypatch.setattr(ks, "_BWD_TARGET_PROGRAMS", target)
    assert ks._heads_per_program(5, 4) == (4 if target == 1 else 2)
    g = torch.Generator().manual_seed(5)
    Bz, T, H, P, G, N = 1, 70, 4, 16, 1, 16
    docs = torch.tensor([[0] * 16 + [1] * 21 + [2] * 11 + [3] + [4] * 12 + [7] * 9])
    assert docs.shape == (1, T)
    ins = [torch.randn(Bz, T, H, P, generator=g), -torch.rand(Bz, T, H, generator=g) * 0.5,
           torch.randn(Bz, T, G, N, generator=g) / 4, torch.randn(Bz, T, G, N, generator=g),
           torch.randn(Bz, H, N, P, generator=g)]
    ins = [t.requires_grad_() for t in ins]
    yk, Sk = ssd_scan(*ins, chunk_size=16, doc_ids=docs)
    yn, Sn = ssd_scan_naive(*ins, doc_ids=docs)
    gy, gS = torch.randn(yn.shape, generator=g), torch.randn(Sn.shape, generator=g)
    gk = torch.autograd.grad((yk * gy).sum() + (Sk * gS).sum(), ins)
    gn = torch.autograd.grad((yn * gy).sum() + (Sn * gS).sum(), ins)
    for name, o, r in zip(["y", "final_state", "dx", "da", "dB", "dC", "dinitial_state"], [yk, Sk, *gk],
                          [yn, Sn, *gn]):
        err = (o - r).abs().max().item()
        assert err <= 2e-4 * (1 + r.abs().max().item()), f"{name}: max error {err}"
    assert gn[4].abs().max() > 0  # the initial state reaches the first document


@pytest.mark.parametrize("with_docs", [False, True], ids=["no-docs", "docs"])
def test_ssd_triton_sequential_state_pass_equals_parallel_and_the_recurrence(with_docs):
    """``state_pass="sequential"`` (chunk states and the pass fused, chunks walked in order / reversed in the
    backward) against ``"parallel"`` and the step-by-step recurrence: T = 70 (5 chunks of 16, the last partial),
    G = 2 < H = 4, N = 32 and P = 32 (the default blocks and 16 x 16 blocks: two N-blocks and two P-blocks per
    head), an initial state, the final state's gradient, with or without documents starting at a chunk edge (16,
    48), inside chunks (37, 61) and one of length 1 (48): output, final state and every gradient."""
    from kernels.ssd import ssd_scan

    g = torch.Generator().manual_seed(7)
    Bz, T, H, P, G, N = 1, 70, 4, 32, 2, 32
    docs = torch.tensor([[0] * 16 + [1] * 21 + [2] * 11 + [3] + [4] * 12 + [7] * 9]) if with_docs else None
    ins = [torch.randn(Bz, T, H, P, generator=g), -torch.rand(Bz, T, H, generator=g) * 0.5,
           torch.randn(Bz, T, G, N, generator=g) / 4, torch.randn(Bz, T, G, N, generator=g),
           torch.randn(Bz, H, N, P, generator=g)]
    ins = [t.requires_grad_() for t in ins]
    gy, gS = torch.randn(Bz, T, H, P, generator=g), torch.randn(Bz, H, N, P, generator=g)

    def run(fn):
        y, S = fn()
        return [y, S, *torch.autograd.grad((y * gy).sum() + (S * gS).sum(), ins)]

    ref = run(lambda: ssd_scan_naive(*ins, doc_ids=docs))
    par = run(lambda: ssd_scan(*ins, chunk_size=16, doc_ids=docs, state_pass="parallel"))
    names = ["y", "final_state", "dx", "da", "dB", "dC", "dinitial_state"]
    for blk in [None, (16, 16)]:
        seq = run(lambda: ssd_scan(*ins, chunk_size=16, doc_ids=docs, state_pass="sequential", seq_block=blk))
        for name, o, p, r in zip(names, seq, par, ref):
            scale = 1 + r.abs().max().item()
            assert (o - r).abs().max().item() <= 2e-4 * scale, f"sequential {blk} vs recurrence: {name}"
            assert (o - p).abs().max().item() <= 2e-5 * scale, f"sequential {blk} vs parallel: {name}"
    for name, p, r in zip(names, par, ref):
        assert (p - r).abs().max().item() <= 2e-4 * (1 + r.abs().max().item()), f"parallel vs recurrence: {name}"
    assert ref[-1].abs().max() > 0 and ref[1].abs().max() > 0


@pytest.mark.parametrize("state_pass, out_mode, out_target", [("parallel", "head", None), ("sequential", "head", None),
                                                              ("parallel", "group", 1), ("sequential", "group", None)],
                         ids=["parallel-head", "sequential-head", "parallel-group-2-heads", "sequential-group-split"])
def test_ssd_triton_low_precision_snapshots_and_output_loop(monkeypatch, state_pass, out_mode, out_target):
    """``state_dtype=torch.bfloat16`` (the snapshots of the state entering every chunk, and of its gradient, stored
    in bf16; the carry between chunks, the final state and the initial state's gradient fp32) with fp32 inputs
    (the interpreter has no bf16 products), and the output kernel per head with its d_state loop in 16-wide steps
    (d_state 24: two steps, the second partial) or per group (both heads of a group in one program, or split over
    two programs), head dim 32 in two 16-wide blocks: T = 70 (5 chunks of 16), G = 2 < H = 4, documents, an
    initial state, the final state's gradient. Everything within bf16 rounding of the recurrence, and the
    fp32-snapshot run (same kernels) within fp32 rounding; the sequential pass's final state and initial-state
    gradient never pass through a snapshot (fp32 rounding)."""
    import kernels.ssd as ks
    from kernels.ssd import ssd_scan

    if out_target is not None:
        monkeypatch.setattr(ks, "_OUT_TARGET_PROGRAMS", out_target)
    assert ks._heads_per_program(5 * 2, 2, ks._OUT_TARGET_PROGRAMS) == (2 if out_target == 1 else 1)
    g = torch.Generator().manual_seed(3)
    Bz, T, H, P, G, N = 1, 70, 4, 32, 2, 24
    docs = torch.tensor([[0] * 16 + [1] * 21 + [2] * 11 + [3] + [4] * 12 + [7] * 9])
    ins = [torch.randn(Bz, T, H, P, generator=g), -torch.rand(Bz, T, H, generator=g) * 0.5,
           torch.randn(Bz, T, G, N, generator=g) / 4, torch.randn(Bz, T, G, N, generator=g),
           torch.randn(Bz, H, N, P, generator=g)]
    ins = [t.requires_grad_() for t in ins]
    gy, gS = torch.randn(Bz, T, H, P, generator=g), torch.randn(Bz, H, N, P, generator=g)

    def run(fn):
        y, S = fn()
        assert S.dtype == torch.float32
        return [y, S, *torch.autograd.grad((y * gy).sum() + (S * gS).sum(), ins)]

    ref = run(lambda: ssd_scan_naive(*ins, doc_ids=docs))
    kw = dict(chunk_size=16, doc_ids=docs, state_pass=state_pass, out_block_n=16, out_mode=out_mode, block_p=16)
    lo = run(lambda: ssd_scan(*ins, state_dtype=torch.bfloat16, **kw))
    hi = run(lambda: ssd_scan(*ins, state_dtype=torch.float32, **kw))
    exact = {"final_state", "dinitial_state"} if state_pass == "sequential" else set()
    worst = 0.0
    for name, o, h, r in zip(["y", "final_state", "dx", "da", "dB", "dC", "dinitial_state"], lo, hi, ref):
        scale = 1 + r.abs().max().item()
        err = (o - r).abs().max().item() / scale
        assert err <= (2e-4 if name in exact else 2e-2), f"bf16 snapshots: {name}: {err}"
        assert (h - r).abs().max().item() <= 2e-4 * scale, f"fp32 snapshots: {name}"
        worst = max(worst, err if name not in exact else 0.0)
    assert worst > 1e-5  # the snapshots were rounded (the bf16 path ran)
    with pytest.raises(ValueError, match="state_dtype"):
        ssd_scan(*ins, state_dtype=torch.int8)
    with pytest.raises(ValueError, match="out_block_n"):
        ssd_scan(*ins, out_block_n=48)
    with pytest.raises(ValueError, match="out_mode"):
        ssd_scan(*ins, out_mode="heads")


def test_naive_recurrence_is_the_definition():
    """The reference itself against the formula written out for T=2 (state after 2 steps, output at step 2)."""
    x, dt, A, Bm, Cm, D, s0 = [t.detach() for t in _inputs(1, 2, 1, 3, 1, 2)]
    a = dt * A
    y, S = ssd_scan_naive(x, a, Bm, Cm, s0)
    S1 = torch.exp(a[0, 0, 0]) * s0[0, 0] + torch.outer(Bm[0, 0, 0], x[0, 0, 0])
    S2 = torch.exp(a[0, 1, 0]) * S1 + torch.outer(Bm[0, 1, 0], x[0, 1, 0])
    torch.testing.assert_close(S[0, 0], S2)
    torch.testing.assert_close(y[0, 1, 0], Cm[0, 1, 0] @ S2)


def test_decode_step_continues_the_scan():
    x, dt, A, Bm, Cm, D, _ = [t.detach() for t in _inputs(2, 9, 2, 8, 1, 4)]
    y_all, S_all = ssd(x, dt, A, Bm, Cm, D, backend="naive")
    _, S = ssd(x[:, :8], dt[:, :8], A, Bm[:, :8], Cm[:, :8], D, backend="torch", chunk_size=16)
    y, S = ssd_step(x[:, 8], dt[:, 8], A, Bm[:, 8], Cm[:, 8], D, S)
    torch.testing.assert_close(y, y_all[:, 8], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_all, atol=1e-5, rtol=1e-5)


def test_errors_name_the_argument():
    from kernels.ssd import ssd_scan

    x = torch.randn(1, 16, 2, 16)
    with pytest.raises(ValueError, match="backend='cuda'.*allowed values: auto, triton, torch, naive"):
        ssd(x, torch.ones(1, 16, 2), -torch.ones(2), torch.randn(1, 16, 1, 16), torch.randn(1, 16, 1, 16),
            backend="cuda")
    with pytest.raises(ValueError, match="chunk_size=24"):
        ssd_scan(x, torch.zeros(1, 16, 2), torch.randn(1, 16, 1, 16), torch.randn(1, 16, 1, 16), chunk_size=24)
    a, Bm = torch.zeros(1, 16, 2), torch.randn(1, 16, 1, 16)
    with pytest.raises(ValueError, match="state_pass='scan'.*allowed values: auto, parallel, sequential"):
        ssd_scan(x, a, Bm, Bm, chunk_size=16, state_pass="scan")
    with pytest.raises(ValueError, match="seq_block=.48, 64."):
        ssd_scan(x, a, Bm, Bm, chunk_size=16, state_pass="sequential", seq_block=(48, 64))
    with pytest.raises(ValueError, match="G=3"):
        ssd_scan(x, torch.zeros(1, 16, 2), torch.randn(1, 16, 3, 16), torch.randn(1, 16, 3, 16), chunk_size=16)
    with pytest.raises(ValueError, match="headdim=24"):
        Mamba2(32, headdim=24)
    with pytest.raises(ValueError, match="mamba2 kernel=.fla."):
        Mamba2(32, kernel="fla")


@pytest.mark.parametrize("option, bad", [("d_state", 0), ("d_state", -3), ("expand", 0), ("expand", 1.5),
                                         ("headdim", 0), ("d_conv", 0), ("ngroups", 0), ("d_state", True)])
def test_mamba2_sizes_are_checked_at_construction(option, bad):
    """Before: d_state=0 built a mixer with no state that trained (exit 0); d_state=-3 and expand=0 failed in the
    forward with a raw RuntimeError (split sizes, reshape)."""
    with pytest.raises(ValueError, match=rf"mamba2 {option}={bad!r} must be an integer >= 1"):
        Mamba2(32, **{"headdim": 16, option: bad})


@pytest.mark.parametrize("kw, msg", [(dict(dt_min=0.0), r"mamba2 dt_min=0.0 must be a number > 0"),
                                     (dict(dt_max=float("inf")), r"mamba2 dt_max=inf must be a number > 0"),
                                     (dict(dt_min=0.5, dt_max=0.1), r"mamba2 dt_min=0.5 must be <= dt_max=0.1")])
def test_mamba2_dt_range_is_checked_at_construction(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Mamba2(32, headdim=16, **kw)


def test_mamba2_chunk_size_is_checked_at_construction():
    """Before: chunk_size=48 with kernel=auto ran on CPU (the torch form) and failed only on a GPU (the Triton
    kernel takes 16 / 32 / 64 / 128); chunk_size=0 divided by zero, 2.5 was truncated."""
    for kernel in ("auto", "triton"):
        with pytest.raises(ValueError, match=r"mamba2 chunk_size=48 .*allowed values: 16, 32, 64, 128"):
            Mamba2(32, headdim=16, chunk_size=48, kernel=kernel)
    Mamba2(32, headdim=16, chunk_size=48, kernel="torch")  # any positive int for the PyTorch form
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match=r"chunk_size must be a positive int"):
            Mamba2(32, headdim=16, chunk_size=bad, kernel="torch")
    from attn_zoo.families.ssd import ssd_scan_chunked

    x = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match=r"ssd_scan_chunked: chunk_size must be a positive int"):
        ssd_scan_chunked(x, -torch.rand(1, 8, 2), torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4), chunk_size=0)


@pytest.mark.parametrize("kernel", ["torch", "naive"])
def test_mamba2_refuses_decreasing_doc_ids(kernel):
    """Before: a model of mamba2 layers took decreasing doc_ids (a return to an earlier id read as a new document)
    that every attention layer refuses."""
    model = GPT(GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, max_seq_len=32),
                MixerSpec("mamba2", {"d_state": 8, "headdim": 8, "chunk_size": 16, "kernel": kernel}),
                backend="reference")
    idx = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"doc_ids must be nondecreasing"):
        model(idx, doc_ids=torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2, 2, 2]]))
    x = torch.randn(1, 10, 2, 4)
    with pytest.raises(ValueError, match=r"doc_ids.dtype=torch.float32 is not supported; allowed values: int32"):
        ssd(x, torch.ones(1, 10, 2), -torch.ones(2), torch.randn(1, 10, 1, 4), torch.randn(1, 10, 1, 4),
            backend=kernel, doc_ids=torch.zeros(1, 10))


@pytest.mark.parametrize("backend", ["torch", "naive"])
def test_mamba2_chunked_decoding_equals_the_full_forward(backend):
    """Prefill, single tokens, then a multi-token chunk after them, each from the cached state."""
    torch.manual_seed(0)
    m = Mamba2(32, d_state=16, headdim=16, chunk_size=16, kernel=backend).eval()
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        full = m(x)
        cache = m.new_cache(2, 20, x.dtype, x.device)
        parts = [m(x[:, :7], cache), m(x[:, 7:8], cache), m(x[:, 8:9], cache), m(x[:, 9:20], cache)]
    assert cache.n == 20
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-4)


def _gpt(layers, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=40, n_layer=len(layers), n_head=4, d_model=32, max_seq_len=32)
    return GPT(cfg, layers, backend="reference").eval()


@pytest.mark.parametrize("layers", [["mamba2"], ["mamba2", "flash"]], ids=["mamba2", "mamba2+flash"])
def test_generate_with_cache_equals_generate_without(layers):
    import attn_zoo

    specs = [MixerSpec("mamba2", {"d_state": 16, "headdim": 16, "chunk_size": 16}) if l == "mamba2"
             else attn_zoo.make_spec("flash") for l in layers]
    model = _gpt(specs)
    idx = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model.generate(idx, 12, greedy=True, use_cache=True)
        b = model.generate(idx, 12, greedy=True, use_cache=False)
    assert a.shape == (2, 17)
    assert torch.equal(a, b)


def test_mamba2_trains_through_train_py(tmp_path):
    """``attention=mamba2`` and ``model.layers=[mamba2,flash]`` build and run a few steps (fast_dev_run)."""
    import train as train_mod
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for extra in (["attention=mamba2"], ["attention=mamba2", "model.layers=[mamba2,flash]"]):
        with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=["logger=csv", "model.d_model=32", "model.n_layer=2",
                                                          "model.n_head=4", "data.seq_len=32", "data.batch_size=4",
                                                          "data.vocab_size=32", "data.num_kv_pairs=4",
                                                          "data.num_train=16", "data.num_val=8",
                                                          "+trainer.fast_dev_run=true", *extra])
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / extra[-1].replace("/", "_"))
            cfg.paths.cache_dir = str(tmp_path / "cache")
        specs = train_mod.layer_specs(cfg)
        assert specs[0].mixer == "mamba2"
        assert [getattr(s, "kind", getattr(s, "mixer", None)) for s in specs][1] == ("flash" if len(extra) == 2
                                                                                     else "mamba2")
        train_mod.train(cfg)


# ------------------------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 1000, 8, 64, 1, 64, 64), (1, 2048, 4, 128, 2, 128, 64),
                                   (2, 300, 8, 32, 1, 64, 64), (1, 256, 4, 16, 1, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
@pytest.mark.parametrize("use_s0", [False, True], ids=["s0=None", "s0"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ssd_triton_on_gpu_matches_the_chunked_fp64_reference(dtype, shape, use_s0):
    Bz, T, H, P, G, N, chunk = shape
    ins = _inputs(Bz, T, H, P, G, N, device="cuda", dtype=dtype)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    out = _run("triton", ins, chunk, use_s0)
    ref = _run("torch", ins64, chunk, use_s0)
    tol = 2e-2 if dtype == torch.float32 else 6e-2  # tf32 / bf16 matmuls
    for name, o, r in zip(NAMES, out, ref):
        err = (o.double() - r).abs().max().item()
        assert err <= tol * (1 + r.abs().max().item()), f"{name}: max error {err}"


def _gpu_scan_case(seed, shape, doc_lens, device="cuda"):
    """Inputs of the GPU scan tests: ``shape = (B, T, H, P, G, N)``, row ``b`` cut into documents of ``doc_lens[b]``
    positions, an initial state, cotangents of y and of the final state. Returns ``(doc_ids, dtypes, run)``:
    ``dtypes`` the bf16 / fp32 mix the model passes, ``run(fn, dtypes)`` the output, final state and every gradient
    of ``fn(x, a, B, C, initial_state)`` with the inputs cast to ``dtypes``."""
    g = torch.Generator().manual_seed(seed)
    Bz, T, H, P, G, N = shape
    docs = (torch.arange(T)[None].expand(Bz, T) // torch.tensor(doc_lens)[:, None]).to(device)
    base = [torch.randn(Bz, T, H, P, generator=g), -torch.rand(Bz, T, H, generator=g) * 0.2,
            torch.randn(Bz, T, G, N, generator=g) / N ** 0.5, torch.randn(Bz, T, G, N, generator=g),
            torch.randn(Bz, H, N, P, generator=g)]
    dts = [torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]
    gy, gS = torch.randn(Bz, T, H, P, generator=g).to(device), torch.randn(Bz, H, N, P, generator=g).to(device)

    def run(fn, dtypes):
        ins = [t.to(device, d).requires_grad_() for t, d in zip(base, dtypes)]
        y, S = fn(ins)
        return [y, S, *torch.autograd.grad((y.float() * gy).sum() + (S * gS).sum(), ins)]

    return docs, dts, run


@pytest.mark.parametrize("seq_block", [None, (32, 32), (128, 64)], ids=["64x64", "32x32", "128x64"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ssd_triton_sequential_state_pass_on_gpu_matches_parallel_and_fp64(seq_block):
    """bf16, T = 2000 (32 chunks of 64, the last partial), G = 2 < H = 4, d_state 128, head dim 64, documents,
    an initial state: the sequential pass against the parallel one and the fp64 chunked reference, output, final
    state and every gradient."""
    from attn_zoo.families.ssd import ssd_scan_chunked
    from kernels.ssd import ssd_scan

    docs, dts, run = _gpu_scan_case(11, (2, 2000, 4, 64, 2, 128), (300, 1000))

    ref = run(lambda i: ssd_scan_chunked(*i, chunk_size=64, doc_ids=docs), [torch.float64] * 5)
    par = run(lambda i: ssd_scan(*i, chunk_size=64, doc_ids=docs, state_pass="parallel"), dts)
    seq = run(lambda i: ssd_scan(*i, chunk_size=64, doc_ids=docs, state_pass="sequential", seq_block=seq_block),
              dts)
    for name, o, p, r in zip(["y", "final_state", "dx", "da", "dB", "dC", "dinitial_state"], seq, par, ref):
        scale = 1 + r.abs().max().item()
        assert (o.double() - r).abs().max().item() <= 6e-2 * scale, f"sequential vs fp64: {name}"
        assert (o.double() - p.double()).abs().max().item() <= 2e-2 * scale, f"sequential vs parallel: {name}"


@pytest.mark.parametrize("out_mode, state_dtype", [("head", None), ("group", None), ("group", torch.float32),
                                                   ("head", torch.float32)],
                         ids=["head-bf16-snapshots", "group-bf16-snapshots", "group-fp32-snapshots",
                              "head-fp32-snapshots"])
@pytest.mark.parametrize("shape", [(2, 2000, 4, 64, 2, 128), (2, 1000, 8, 32, 1, 64)], ids=["p64-n128", "p32-n64"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ssd_triton_output_modes_and_snapshot_dtypes_on_gpu_match_fp64(out_mode, state_dtype, shape):
    """bf16 inputs, documents, an initial state, the final state's gradient, both state passes: the output kernel
    per head (d_state loop) or per group of heads, bf16 (default) or fp32 state snapshots, against the fp64
    chunked reference (output, final state, every gradient) and against the per-head, fp32-snapshot run."""
    from attn_zoo.families.ssd import ssd_scan_chunked
    from kernels.ssd import ssd_scan

    docs, dts, run = _gpu_scan_case(13, shape, (300, 700))

    ref = run(lambda i: ssd_scan_chunked(*i, chunk_size=64, doc_ids=docs), [torch.float64] * 5)
    names = ["y", "final_state", "dx", "da", "dB", "dC", "dinitial_state"]
    for sp in ("parallel", "sequential"):
        base_run = run(lambda i: ssd_scan(*i, chunk_size=64, doc_ids=docs, state_pass=sp, state_dtype=torch.float32,
                                          out_mode="head"), dts)
        out = run(lambda i: ssd_scan(*i, chunk_size=64, doc_ids=docs, state_pass=sp, state_dtype=state_dtype,
                                     out_mode=out_mode), dts)
        for name, o, b0, r in zip(names, out, base_run, ref):
            scale = 1 + r.abs().max().item()
            assert (o.double() - r).abs().max().item() <= 6e-2 * scale, f"{sp} {out_mode} {state_dtype} vs fp64: {name}"
            err = (o.double() - b0.double()).abs().max().item()
            assert err <= 2e-2 * scale, f"{sp} {out_mode} vs fp32 head: {name}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mamba2_mixer_of_the_model_config_trains_under_bf16_autocast_on_gpu():
    """conf/attention/mamba2.yaml's shapes (d_state 64, headdim 32) in bf16 autocast, as ``trainer=gpu`` runs them:
    triton 3.6 once compiled the chunk-output kernel for them into an illegal address (kernels.ssd._warps)."""
    torch.manual_seed(0)
    m = Mamba2(128, d_state=64, headdim=32, kernel="triton").cuda()
    x = torch.randn(4, 512, 128, device="cuda", requires_grad=True)
    outs = []
    for kernel in ("triton", "torch"):
        m.kernel = kernel
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        outs.append([y.float(), *torch.autograd.grad(y.float().square().mean(), [x, *m.parameters()])])
    for name, o, r in zip(["y", "dx"] + [n for n, _ in m.named_parameters()], *outs):
        assert torch.isfinite(o).all(), name
        assert (o - r).abs().max() <= 6e-2 * (1 + r.abs().max()), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mamba2_mixer_triton_matches_torch_on_gpu_and_generates_with_cache():
    torch.manual_seed(0)
    m = Mamba2(256, d_state=64, headdim=64, kernel="triton").cuda()
    x = torch.randn(2, 300, 256, device="cuda", requires_grad=True)
    y = m(x)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *m.parameters()], gy)
    m.kernel = "torch"
    y2 = m(x)
    grads2 = torch.autograd.grad(y2, [x, *m.parameters()], gy)
    torch.testing.assert_close(y, y2, atol=2e-2, rtol=2e-2)
    for g1, g2 in zip(grads, grads2):
        assert (g1 - g2).abs().max() <= 2e-2 * (1 + g2.abs().max())
    specs = [MixerSpec("mamba2", {"d_state": 16, "headdim": 16, "kernel": "triton"}), MixerSpec("mamba2")]
    model = _gpt(specs).cuda()
    idx = torch.randint(0, 40, (2, 5), device="cuda")
    with torch.no_grad():
        assert torch.equal(model.generate(idx, 12, greedy=True, use_cache=True),
                           model.generate(idx, 12, greedy=True, use_cache=False))


def test_auto_state_pass_follows_the_h200_measurements():
    """bench_ssd on the H200 (2026-12-04, H 16, headdim 64, d_state 128, 32k tokens a call): the sequential pass won
    at B = 16 / 4 / 2 (N 2k / 8k / 16k) and lost at B = 1 (N 32k); auto must pick accordingly."""
    from kernels.ssd import _use_sequential

    blk = (64, 64)
    assert [_use_sequential("auto", B, 16, blk, 128, 64) for B in (16, 4, 2, 1)] == [True, True, True, False]
    assert _use_sequential("parallel", 16, 16, blk, 128, 64) is False
    assert _use_sequential("sequential", 1, 1, blk, 128, 64) is True


@pytest.mark.parametrize("backend", ["torch", "naive"])
@pytest.mark.parametrize("change, msg", [
    (dict(G=3), r"ssd: the number of groups G=3 \(B.shape\[2\]\) must divide H=4"),
    (dict(x3d=True), r"ssd: x must be 4-D \(B, T, H, P\)"),
    (dict(dt_T=5), r"ssd: dt must have shape \(B, T, H\) = \(1, 8, 4\), got \(1, 5, 4\)"),
    (dict(A_H=2), r"ssd: A must have shape \(H,\) = \(4,\), got \(2,\)"),
    (dict(s0_P=5), r"ssd: initial_state must have shape \(B, H, N, P\) = \(1, 4, 6, 4\)"),
    (dict(T=0), r"ssd: x must have B, T, H, P >= 1"),
    (dict(int_x=True), r"ssd: x.dtype=torch.int64 is not supported; allowed values"),
])
def test_ssd_checks_its_arguments_on_every_backend(backend, change, msg):
    """Before: the PyTorch forms checked nothing (the Triton kernel does): B / C with G=3 groups for H=4 heads
    were reshaped into d_state 6 instead of 8 and returned a wrong y and state (torch), a 3-D x broadcast against
    dt and returned, int x ran, and the other shapes failed with raw RuntimeErrors (or, T=0, 'stack expects a
    non-empty TensorList')."""
    G, T = change.get("G", 2), change.get("T", 8)
    x = torch.randn(1, T, 4, 4)
    if change.get("int_x"):
        x = x.long()
    if change.get("x3d"):
        x = x[0]
    dt = torch.rand(1, change.get("dt_T", T), 4)
    A = -torch.rand(change.get("A_H", 4))
    Bm, Cm = torch.randn(1, T, G, 6), torch.randn(1, T, G, 6)
    s0 = torch.zeros(1, 4, 6, 5) if "s0_P" in change else None
    with pytest.raises((ValueError, TypeError), match=msg):
        ssd(x, dt, A, Bm, Cm, None, s0, chunk_size=16, backend=backend)
