"""The chunked (WY / UT-transform) delta rule, ``delta_rule_chunk`` (backend ``chunk``), against the step-by-step
reference ``delta_rule_naive``: outputs, final state and every gradient in fp64 (T < C, T not a multiple of C,
several chunks; gated and not; documents starting inside a chunk, at a chunk edge, length-1 documents), what
``auto`` picks, and the mixers through a train.py-built model with ``kernel=chunk`` equal to ``kernel=naive``."""
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import attn_zoo.families.deltanet as dn
from attn_zoo.families.deltanet import delta_rule, delta_rule_chunk, delta_rule_naive

ROOT = Path(__file__).resolve().parents[1]
f64 = torch.float64


def _inputs(B, T, H, Dk, Dv, gated, seed=0, init=True):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=f64), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=f64)
    beta = torch.rand(B, T, H, generator=g, dtype=f64) * 0.9 + 0.1
    lg = -torch.rand(B, T, H, generator=g, dtype=f64) * 0.7 - 0.05 if gated else None  # strong enough to see
    s0 = torch.randn(B, H, Dk, Dv, generator=g, dtype=f64) if init else None
    return [t.requires_grad_() if t is not None else None for t in (q, k, v, beta, lg, s0)]


def _compare(ins, doc_ids=None, chunk_size=8, scale=None):
    """Outputs, final state and the gradient of every input that is given, chunk against naive."""
    q, k, v, beta, lg, s0 = ins
    leaves = [t for t in ins if t is not None]
    o1, S1 = delta_rule_naive(q, k, v, beta, lg, scale, s0, doc_ids)
    o2, S2 = delta_rule_chunk(q, k, v, beta, lg, scale, s0, doc_ids, chunk_size=chunk_size)
    assert o2.dtype == q.dtype and S2.dtype == f64 and o2.shape == o1.shape and S2.shape == S1.shape
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(S2, S1, atol=1e-10, rtol=1e-10)
    gen = torch.Generator().manual_seed(1)
    do, dS = torch.randn(o1.shape, generator=gen, dtype=f64), torch.randn(S1.shape, generator=gen, dtype=f64)
    g1 = torch.autograd.grad((o1 * do).sum() + (S1 * dS).sum(), leaves)
    g2 = torch.autograd.grad((o2 * do).sum() + (S2 * dS).sum(), leaves)
    for name, a, b in zip(["q", "k", "v", "beta", "g", "initial_state"][:len(leaves)] if lg is not None
                          else ["q", "k", "v", "beta", "initial_state"][:len(leaves)], g2, g1):
        assert b.abs().max() > 1e-6, name  # the gradient is not trivially zero
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T, C", [(5, 8), (16, 8), (29, 8)])  # T < C; T a multiple of C; several chunks + a tail
def test_chunk_equals_naive_with_every_gradient(gated, T, C):
    _compare(_inputs(2, T, 2, 4, 3, gated, seed=T), chunk_size=C, scale=0.7)


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_without_initial_state_and_default_chunk(gated):
    q, k, v, beta, lg, _ = _inputs(1, 70, 2, 8, 8, gated, seed=3, init=False)
    o1, S1 = delta_rule_naive(q, k, v, beta, lg)
    o2, S2 = delta_rule_chunk(q, k, v, beta, lg)  # chunk_size 64: one full chunk + a tail of 6
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(S2, S1, atol=1e-10, rtol=1e-10)


# chunk size 4, T = 22: row 0 has documents starting inside chunks (3, 6, 9), at chunk edges (8, 12, 20) and
# length-1 documents ([8, 9), [20, 21)); row 1 a start at a chunk edge (4), a length-1 document at 5 inside a chunk
# and a last document of length 1 (21), an id gap
_CUTS = [[3, 6, 8, 9, 12, 20, 21], [4, 5, 6, 21]]


def _doc_ids(T=22):
    d = torch.zeros(2, T, dtype=torch.long)
    for r, cuts in enumerate(_CUTS):
        for c in cuts:
            d[r, c:] += 1 + r  # row 1: gaps in the ids
    return d


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_restarts_at_document_starts_with_every_gradient(gated):
    doc = _doc_ids()
    ins = _inputs(2, 22, 2, 4, 3, gated, seed=5)
    _compare(ins, doc_ids=doc, chunk_size=4)
    # and the definition: each document alone (the initial state belongs to the first one)
    q, k, v, beta, lg, s0 = (t.detach() if t is not None else None for t in ins)
    o, S = delta_rule_chunk(q, k, v, beta, lg, None, s0, doc, chunk_size=4)
    bounds = [0, *_CUTS[0], 22]
    for s, e in zip(bounds[:-1], bounds[1:]):
        oa, Sa = delta_rule_naive(q[:1, s:e], k[:1, s:e], v[:1, s:e], beta[:1, s:e],
                                  None if lg is None else lg[:1, s:e], None, s0[:1] if s == 0 else None)
        torch.testing.assert_close(o[:1, s:e], oa, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(S[:1], Sa, atol=1e-10, rtol=1e-10)


def test_chunk_size_must_be_a_positive_int():
    q, k, v, beta, _, _ = _inputs(1, 4, 1, 4, 4, False, init=False)
    for bad in (0, -3, 2.5, True, "64"):
        with pytest.raises(ValueError, match=r"chunk_size must be a positive int"):
            delta_rule_chunk(q, k, v, beta, chunk_size=bad)


def test_backend_chunk_and_auto_on_cpu():
    q, k, v, beta, lg, s0 = (t.detach().float() for t in _inputs(1, 20, 2, 4, 4, True, seed=2))
    ref = delta_rule_naive(q, k, v, beta, lg, None, s0)[0]
    o, S = delta_rule(q, k, v, beta, lg, None, s0, backend="chunk", chunk_size=8)
    assert S.dtype == torch.float32
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    assert dn.pick_backend(q, True) == "chunk"  # T = 20 >= CHUNK_MIN_T
    assert dn.pick_backend(q[:, :dn.CHUNK_MIN_T - 1], False) == "naive"  # decode-sized rows
    with pytest.raises(ValueError, match=r"backend='x'.*allowed values: auto, fla, chunk, naive"):
        delta_rule(q, k, v, beta, backend="x")


def _fake_fla_utils(monkeypatch, **flags):
    mod = ModuleType("fla.utils")
    for name, val in flags.items():
        setattr(mod, name, val)
    monkeypatch.setitem(sys.modules, "fla", ModuleType("fla"))
    monkeypatch.setitem(sys.modules, "fla.utils", mod)


def test_fla_gated_backward_check_reads_fla_flags(monkeypatch):
    _fake_fla_utils(monkeypatch, IS_NVIDIA_HOPPER=True, TRITON_ABOVE_3_4_0=True, TRITON_ABOVE_3_7_1=False)
    assert dn._fla_gated_bwd_broken()
    _fake_fla_utils(monkeypatch, IS_NVIDIA_HOPPER=True, TRITON_ABOVE_3_4_0=True, TRITON_ABOVE_3_7_1=True)
    assert not dn._fla_gated_bwd_broken()
    _fake_fla_utils(monkeypatch, IS_NVIDIA_HOPPER=False, TRITON_ABOVE_3_4_0=True, TRITON_ABOVE_3_7_1=False)
    assert not dn._fla_gated_bwd_broken()
    _fake_fla_utils(monkeypatch, IS_NVIDIA_HOPPER=True, TRITON_ABOVE_3_4_0=False, TRITON_ABOVE_3_7_1=False)
    assert not dn._fla_gated_bwd_broken()


@pytest.mark.parametrize("broken", [False, True])
def test_auto_on_cuda_picks_fla_unless_the_gated_backward_is_broken(monkeypatch, broken):
    monkeypatch.setattr(dn, "_fla", lambda gated: (lambda *a, **kw: None))  # as if fla were installed
    monkeypatch.setattr(dn, "_fla_gated_bwd_broken", lambda: broken)
    cuda_bf16 = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(2, 256, 4, 64))
    cuda_f32 = SimpleNamespace(is_cuda=True, dtype=torch.float32, shape=(2, 256, 4, 64))
    assert dn.pick_backend(cuda_bf16, gated=False) == "fla"
    assert dn.pick_backend(cuda_bf16, gated=True) == ("chunk" if broken else "fla")
    assert dn.pick_backend(cuda_f32, gated=True) == "chunk"

    def missing(gated):
        raise ImportError("no fla")

    monkeypatch.setattr(dn, "_fla", missing)
    assert dn.pick_backend(cuda_bf16, gated=False) == "chunk"


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
def test_train_py_model_with_kernel_chunk_equals_naive(mixer):
    """The model train.py builds (Hydra config -> harness.config.model_config -> GPT.from_config), packed
    documents, logits and every parameter gradient: ``attention.kernel=chunk`` against ``kernel=naive``."""
    from hydra import compose, initialize_config_dir

    from attn_zoo.model import GPT
    from harness.config import model_config

    def build(kernel):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"attention={mixer}", f"attention.kernel={kernel}",
                                                          "model.d_model=16", "model.n_layer=2", "model.n_head=2",
                                                          "data.seq_len=80", "data.vocab_size=32"])
        mc = model_config(cfg)
        assert all(dict(s.options)["kernel"] == kernel for s in mc.layers)
        torch.manual_seed(0)
        return GPT.from_config(mc).double()

    a, b = build("chunk"), build("naive")
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 32, (2, 80), generator=torch.Generator().manual_seed(4))
    doc = torch.zeros(2, 80, dtype=torch.long)  # T = 80: a chunk of 64 and a tail of 16
    doc[0, 13:] = 1  # a start inside the first chunk
    doc[0, 14:] = 2  # a length-1 document
    doc[0, 64:] = 3  # a start at the chunk edge
    doc[1, 70:] = 1  # a start inside the tail chunk
    ya, yb = a(idx, doc_ids=doc), b(idx, doc_ids=doc)
    ya = ya[0] if isinstance(ya, tuple) else ya
    yb = yb[0] if isinstance(yb, tuple) else yb
    torch.testing.assert_close(ya, yb, atol=1e-9, rtol=1e-9)
    ya.square().mean().backward()
    yb.square().mean().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pb.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, atol=1e-9, rtol=1e-9, msg=lambda m, n=n: f"{n}: {m}")


def test_bench_delta_cpu_smoke_run_writes_csv(tmp_path):
    import pandas as pd

    from eval.bench_delta import main

    main(["--device", "cpu", "--out", str(tmp_path), "--lengths", "16,24", "--tokens", "32", "--heads", "1",
          "--head-dim", "8", "--naive-max-t", "16", "--check-max-t", "24", "--time-budget-s", "60"])
    df = pd.read_csv(tmp_path / "delta_bench.csv")
    assert {"kind", "method", "T", "fwd_bwd_ms", "max_rel_err"} <= set(df.columns)
    got = set(zip(df["kind"], df["method"], df["T"]))
    assert ("gated_deltanet", "naive", 16) in got and ("gated_deltanet", "naive", 24) not in got
    chunk = df[df["method"] == "chunk"]
    assert len(chunk) == 4 and (chunk["max_rel_err"] < 2e-2).all() and (chunk["fwd_bwd_ms"] > 0).all()


def test_chunk_keeps_fp32_products_under_autocast():
    """The mixers run under bf16-mixed autocast: the chunked form must not drop to bf16 matmuls there."""
    q, k, v, beta, lg, s0 = (t.detach().float() for t in _inputs(1, 40, 2, 8, 8, True, seed=9))
    o, S = delta_rule_chunk(q, k, v, beta, lg, None, s0, chunk_size=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        oa, Sa = delta_rule_chunk(q, k, v, beta, lg, None, s0, chunk_size=16)
    assert oa.dtype == torch.float32 and Sa.dtype == torch.float32
    torch.testing.assert_close(oa, o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(Sa, S, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------------- bad arguments
def _f32(T=10, B=1, H=2, Dk=4, Dv=3):
    q, k, v, beta, lg, s0 = (t.detach().float() for t in _inputs(B, T, H, Dk, Dv, True, seed=11))
    return dict(q=q, k=k, v=v, beta=beta, g=lg, initial_state=s0)


_BAD = [  # (argument, replacement built from the good inputs, text the message must hold)
    ("k", lambda a: a["k"][:, :8], r"k must have q's shape \(B, T, H, Dk\) = \(1, 10, 2, 4\)"),
    ("k", lambda a: a["k"][:, :, :1], r"k must have q's shape"),  # H = 1: broadcast by the naive loop before
    ("v", lambda a: a["v"][:, :8], r"v must have shape \(B, T, H, Dv\) = \(1, 10, 2, Dv\)"),
    ("v", lambda a: torch.cat([a["v"], a["v"]]), r"v must have shape"),  # B = 2: a (2, ...) output before
    ("beta", lambda a: a["beta"][:, :, :1], r"beta must have shape \(B, T, H\) = \(1, 10, 2\)"),
    ("beta", lambda a: a["beta"][..., None], r"beta must have shape"),
    ("g", lambda a: a["g"][:, :8], r"g must have shape \(B, T, H\) = \(1, 10, 2\)"),
    ("initial_state", lambda a: a["initial_state"].transpose(-1, -2),
     r"initial_state must have shape \(B, H, Dk, Dv\) = \(1, 2, 4, 3\)"),
    ("initial_state", lambda a: torch.cat([a["initial_state"]] * 2), r"initial_state must have shape"),
    ("q", lambda a: a["q"].long(), r"q.dtype=torch.int64 is not supported; allowed values: float16"),
    ("q", lambda a: a["q"][0], r"q must have shape \(B, T, H, Dk\)"),
    ("g", lambda a: a["g"].abs() + 0.1, r"g is a log-decay .* finite and <= 0"),
    ("g", lambda a: a["g"].index_fill(1, torch.tensor([4]), float("-inf")), r"g is a log-decay .*doc_ids"),
    ("g", lambda a: a["g"].index_fill(1, torch.tensor([4]), float("nan")), r"g is a log-decay"),
]


@pytest.mark.parametrize("backend", ["chunk", "naive", "auto"])
@pytest.mark.parametrize("arg, make, match", _BAD)
def test_bad_arguments_raise_naming_them(backend, arg, make, match):
    """Before: the chunked form failed inside a reshape / matmul, the naive loop broadcast a wrong H or B into a
    result of the wrong shape, int inputs gave an int output, ``g = -inf`` gave NaN (chunk) where the loop did not."""
    a = _f32()
    a[arg] = make(a)
    with pytest.raises(ValueError, match=match):
        delta_rule(**a, backend=backend, chunk_size=4)
    fn = delta_rule_chunk if backend == "chunk" else delta_rule_naive
    with pytest.raises(ValueError, match=match):
        fn(**a)


@pytest.mark.parametrize("backend", ["chunk", "naive", "auto"])
def test_bad_doc_ids_raise_naming_them(backend):
    a = _f32()
    for doc, match in [(torch.zeros(1, 9, dtype=torch.long), r"doc_ids must have shape \(B, Nk\) = \(1, 10\)"),
                       (torch.zeros(1, 12, dtype=torch.long), r"doc_ids must have shape"),
                       (torch.zeros(10, dtype=torch.long), r"doc_ids must have shape"),
                       (torch.zeros(1, 10), r"doc_ids.dtype=torch.float32 is not supported; allowed values: int32"),
                       (torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2, 2, 2]]), r"doc_ids must be nondecreasing")]:
        with pytest.raises(ValueError, match=match):
            delta_rule(**a, backend=backend, doc_ids=doc)


def test_chunk_size_is_checked_whatever_the_backend():
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int"):
        delta_rule(**_f32(), backend="naive", chunk_size=0)


@pytest.mark.parametrize("backend", ["chunk", "naive", "auto"])
@pytest.mark.parametrize("init", [False, True])
def test_empty_sequence_returns_an_empty_output_and_the_state(backend, init):
    a = _f32(T=0)
    if not init:
        a["initial_state"] = None
    want = a["initial_state"].clone() if init else torch.zeros(1, 2, 4, 3)
    o, S = delta_rule(**a, backend=backend)
    assert o.shape == (1, 0, 2, 3) and o.dtype == torch.float32 and S.shape == (1, 2, 4, 3)
    torch.testing.assert_close(S, want)


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
def test_model_refuses_decreasing_doc_ids(mixer):
    """A model of delta-rule layers only took decreasing doc_ids (a return to an earlier id read as a new
    document) where every attention layer refuses them."""
    from attn_zoo.mixers import MixerSpec
    from attn_zoo.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, max_seq_len=32),
                MixerSpec(mixer, (("kernel", "chunk"),)), backend="reference")
    idx = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"doc_ids must be nondecreasing"):
        model(idx, doc_ids=torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2, 2, 2]]))


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
@pytest.mark.parametrize("prompt", [1, 10])
def test_generate_with_kernel_chunk_cache_equals_no_cache(mixer, prompt):
    """kernel=chunk everywhere: the prompt (T >= 8 or T = 1) and every one-token decode step through the chunked
    form with a carried state, against the full forward of the growing sequence."""
    from attn_zoo.mixers import MixerSpec
    from attn_zoo.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, n_layer=2, n_head=2, d_model=16, max_seq_len=32),
                MixerSpec(mixer, (("kernel", "chunk"),)), backend="reference").eval()
    idx = torch.randint(0, 40, (2, prompt), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model.generate(idx, 12, greedy=True, use_cache=True)
        b = model.generate(idx, 12, greedy=True, use_cache=False)
    assert a.shape == (2, prompt + 12) and torch.equal(a, b)


@pytest.mark.parametrize("cls", [dn.DeltaNet, dn.GatedDeltaNet])
def test_mixer_passes_one_dtype_when_normalize_runs_in_fp32(monkeypatch, cls):
    """CUDA autocast runs ``F.normalize`` in float32 (torch.amp's float32 list) while the projections give bf16:
    q, k reached the delta rule in fp32 beside a bf16 v, so ``auto`` saw fp32 and never picked fla under
    bf16-mixed, and ``kernel='fla'`` refused to run there. Emulated on CPU: normalize returns float32."""
    real = F.normalize
    monkeypatch.setattr(torch.nn.functional, "normalize", lambda x, *a, **kw: real(x.float(), *a, **kw))
    seen = {}
    inner = dn._delta_rule

    def spy(q, k, v, beta, g, *rest):
        seen.update(q=q.dtype, k=k.dtype, v=v.dtype, beta=beta.dtype)
        return inner(q, k, v, beta, g, *rest)

    monkeypatch.setattr(dn, "_delta_rule", spy)
    m = cls(16, 2, 8, kernel="chunk").to(torch.bfloat16)
    y = m(torch.randn(1, 12, 16, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert seen == dict(q=torch.bfloat16, k=torch.bfloat16, v=torch.bfloat16, beta=torch.bfloat16)


def test_gated_deltanet_gate_starts_with_a_long_memory():
    """Mamba-2's gate init: alpha = exp(-A softplus(W_a x + dt_bias)) starts near 1 for every head. Before
    dt_bias, softplus(W_a x) ~ 0.69 made alpha ~ exp(-0.69 A) (median ~ 3e-3): the state forgot each token at once
    and the H200 MQAR cells learned no recall (0.000)."""
    torch.manual_seed(0)
    m = dn.GatedDeltaNet(64, 4, 16, kernel="chunk")
    x = torch.randn(2, 32, 64)
    with torch.no_grad():
        g = -torch.exp(m.A_log) * F.softplus(m.a_proj(x) + m.dt_bias)  # (B, T, H) log-decay per step
    alpha = g.exp()
    assert alpha.median() > 0.8, f"median decay per step {alpha.median():.3g}: the state forgets too fast at init"
    assert (alpha.mean((0, 1)) > 0.1).all(), "a head forgets its state within a few positions at init"


def test_gated_deltanet_loads_a_checkpoint_from_before_dt_bias():
    """A state dict of the former gate (``a_proj`` with a bias, no ``dt_bias``) loads strictly and computes the same
    function: its bias becomes ``dt_bias``."""
    torch.manual_seed(1)
    m = dn.GatedDeltaNet(32, 2, 16, kernel="chunk")
    old = {k: v.clone() for k, v in m.state_dict().items() if k != "dt_bias"}
    old["a_proj.bias"] = torch.randn(2)
    fresh = dn.GatedDeltaNet(32, 2, 16, kernel="chunk")
    fresh.load_state_dict(old)  # strict
    torch.testing.assert_close(fresh.dt_bias.detach(), old["a_proj.bias"])
    x = torch.randn(1, 8, 32)
    g_old = -torch.exp(old["A_log"]) * F.softplus(x @ old["a_proj.weight"].T + old["a_proj.bias"])
    g_new = -torch.exp(fresh.A_log) * F.softplus(fresh.a_proj(x) + fresh.dt_bias)
    torch.testing.assert_close(g_new, g_old)


@pytest.mark.parametrize("backend", ["chunk", "naive", "auto"])
@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf"), "0.5", True])
def test_bad_scale_raises_naming_it(backend, scale):
    """Before: scale=0 returned an all-zero output, a negative one flipped its sign (AttentionSpec refuses both for
    softmax_scale), and a string failed inside the loop ('only integer tensors of a single element ...')."""
    with pytest.raises(ValueError, match=r"scale must be a positive finite float or None"):
        delta_rule(**_f32(), backend=backend, scale=scale, chunk_size=4)
    fn = delta_rule_chunk if backend == "chunk" else delta_rule_naive
    with pytest.raises(ValueError, match=r"scale must be a positive finite float or None"):
        fn(**_f32(), scale=scale)
    delta_rule(**_f32(), backend=backend, scale=0.7, chunk_size=4)  # a positive one runs (and an int)
    delta_rule(**_f32(), backend=backend, scale=1, chunk_size=4)
