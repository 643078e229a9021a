"""Linformer (non-causal; refused in a causal LM) and DeltaNet / Gated DeltaNet (fla backend optional, our naive
recurrence): outputs against written-out formulas, decode with a state equal to the full forward, GPT.generate
with a cache equal to generation without, clear errors, and train.py runs (fast_dev_run)."""

import sys
from pathlib import Path

import pytest
import torch

import attn_zoo
from attn_zoo.families.deltanet import DeltaNet, GatedDeltaNet, delta_rule, delta_rule_naive
from attn_zoo.families.linformer import Linformer
from attn_zoo.mixers import MixerSpec, build_mixer
from attn_zoo.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------- Linformer
def test_linformer_is_softmax_over_projected_keys_and_values():
    torch.manual_seed(0)
    m = Linformer(d_model=16, n_head=2, head_dim=8, max_seq_len=12, proj_dim=4, backend="reference")
    x = torch.randn(2, 10, 16)
    q, k, v = m.qkv(x).view(2, 10, 3, 2, 8).permute(2, 0, 3, 1, 4)
    kp = torch.einsum("kn,bhnd->bhkd", m.E[:, :10], k)
    vp = torch.einsum("kn,bhnd->bhkd", m.F[:, :10], v)
    y = torch.softmax(q @ kp.transpose(-1, -2) / 8 ** 0.5, -1) @ vp
    ref = m.out_proj(y.transpose(1, 2).reshape(2, 10, 16))
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)
    # non-causal: the first position's output changes with the last token
    x2 = x.clone()
    x2[:, -1] += 1
    assert (m(x2)[:, 0] - m(x)[:, 0]).abs().max() > 1e-4


def test_linformer_refuses_causal_and_gpt_refuses_linformer():
    with pytest.raises(ValueError, match=r"causal=True is not supported: Linformer's projections E, F mix"):
        Linformer(16, 2, 8, 12, causal=True)
    with pytest.raises(ValueError, match=r"N=13 exceeds max_seq_len=12"):
        Linformer(16, 2, 8, 12)(torch.randn(1, 13, 16))
    cfg = GPTConfig(vocab_size=20, n_layer=2, n_head=2, d_model=16, max_seq_len=12)
    with pytest.raises(ValueError, match=r"layer 1 \(linformer\) is a non-causal mixer.*causal language model"):
        GPT(cfg, [attn_zoo.make_spec("flash"), MixerSpec("linformer")])
    assert isinstance(build_mixer(MixerSpec("linformer", {"proj_dim": 4}), cfg), Linformer)  # usable alone


def test_gpt_refuses_linformer_given_by_its_import_path():
    """``MixerSpec(<import path of a registered non-causal mixer>)`` (``_target_: attn_zoo.families.linformer.Linformer``
    in a config) counted as causal: GPT took Linformer and position 0 read the last token. The path's class is the
    registered mixer: its registration says it is non-causal."""
    spec = MixerSpec("attn_zoo.families.linformer.Linformer", {"proj_dim": 4})
    assert spec.causal is False
    cfg = GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=12)
    with pytest.raises(ValueError, match=r"layer 0 \(Linformer\) is a non-causal mixer \(causal=False: Linformer's "):
        GPT(cfg, spec)
    assert MixerSpec("attn_zoo.families.ssd.Mamba2").causal  # a causal one by path stays causal
    assert MixerSpec("no_such_pkg.Mixer").causal  # not importable: the build names it (build_mixer)


class MeanOverSequence(torch.nn.Module):
    """Not registered, not causal: every position gets the mean over the whole sequence (also the later ones)."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):  # (B, N, d_model)
        return self.proj(x.mean(dim=1, keepdim=True).expand_as(x))


class CumulativeMean(MeanOverSequence):
    """Not registered, causal: position t gets the mean over positions <= t."""

    def forward(self, x):  # (B, N, d_model)
        n = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device)[:, None]
        return self.proj(x.cumsum(dim=1) / n)


def test_an_unregistered_mixer_by_import_path_is_probed_for_causality():
    """An import path of a class that is not registered and has no ``causal`` option counted as causal: GPT took a
    mixer that averages over the whole sequence and position 0 read the last token. Its causality is now asked by
    a probe (change the last input, watch the earlier outputs); a causal one builds, a ``causal`` option or a
    registration is believed."""
    cfg = GPTConfig(vocab_size=20, n_layer=2, n_head=2, d_model=16, max_seq_len=12)
    path = f"{__name__}.MeanOverSequence"
    assert not MixerSpec(path).causal_declared
    with pytest.raises(ValueError, match=r"^layer 1 \(MeanOverSequence\) is not causal: .*MeanOverSequence is not "
                                         r"registered and has no causal option, and changing its input at one "
                                         r"of 8 positions moved its output.*register_mixer\(name, MeanOverSequence, "
                                         r"causal=True\)"):
        GPT(cfg, [attn_zoo.make_spec("flash"), MixerSpec(path)])
    model = GPT(cfg, MixerSpec(f"{__name__}.CumulativeMean"))  # causal: built, and it predicts from the past only
    assert model.blocks[0].attn.training  # the probe (in eval mode) gave the mixer back in training mode
    model.eval()
    idx = torch.randint(0, 20, (1, 10))
    idx2 = idx.clone()
    idx2[0, -1] = (idx[0, -1] + 1) % 20
    torch.testing.assert_close(model(idx)[:, :-1], model(idx2)[:, :-1])
    assert MixerSpec(path, {"causal": True}).causal_declared  # an explicit option is believed (not probed)
    # one position: nothing earlier to watch (the probe's max over no position raised ValueError)
    GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=1), MixerSpec(path))


class ZeroInitOutMean(MeanOverSequence):
    """Not causal, but its output projection starts at zero (a common init): its output is 0 until GPT's init."""

    def __init__(self, d_model):
        super().__init__(d_model)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)


class DilatedSameConv(torch.nn.Module):
    """Not causal: a 'same' convolution of dilation 8 (y_t sees x_{t-8}, x_t, x_{t+8}), no leak at 8 tokens."""

    def __init__(self, d_model):
        super().__init__()
        self.conv = torch.nn.Conv1d(d_model, d_model, 3, padding=8, dilation=8, groups=d_model)

    def forward(self, x):
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class OddPositionsSeeTheNext(MeanOverSequence):
    """Not causal: odd positions read the next position, never the last one of an even length."""

    def forward(self, x):
        y = x.clone()
        y[:, 1:-1:2] = x[:, 2::2]
        return self.proj(y)


class NoisyMean(MeanOverSequence):
    """Not causal, and draws noise from the global RNG in eval mode too (not deterministic)."""

    def forward(self, x):
        return super().forward(x) + 0.01 * torch.randn_like(x)


class NoisyCumulativeMean(CumulativeMean):
    """Causal; draws from the global RNG as it runs (a random feature map) and keeps a submodule in eval mode."""

    def __init__(self, d_model):
        super().__init__(d_model)
        self.frozen = torch.nn.BatchNorm1d(d_model).eval()

    def forward(self, x):
        return super().forward(x) * (1 + 0.01 * torch.randn(()))


class StabilisedCumulativeSoftmax(torch.nn.Module):
    """Causal in exact arithmetic (the sequence max cancels), on bf16 parameters: rounding moves earlier outputs
    by an ulp when the last input changes the max."""

    def __init__(self, d_model):
        super().__init__()
        self.a = torch.nn.Linear(d_model, 1)
        self.v = torch.nn.Linear(d_model, d_model)
        self.to(torch.bfloat16)

    def forward(self, x):
        a = self.a(x)
        w = torch.exp(a - a.amax(1, keepdim=True))
        return (w * self.v(x)).cumsum(1) / w.cumsum(1)


@pytest.mark.parametrize("cls", [ZeroInitOutMean, DilatedSameConv, OddPositionsSeeTheNext, NoisyMean])
def test_the_causality_probe_finds_leaks_that_8_tokens_and_the_last_input_missed(cls):
    """Accepted before: the probe ran on the factory's weights (a zero output projection, re-initialised by GPT
    afterwards, hid the leak), at 8 tokens only (a dilation-8 'same' conv leaks from 9), changed the last input only
    (odd positions reading the next one), and said nothing of a mixer drawing noise (not deterministic)."""
    cfg = GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=64)
    with pytest.raises(ValueError, match=rf"^layer 0 \({cls.__name__}\) is not causal"):
        GPT(cfg, MixerSpec(f"{__name__}.{cls.__name__}"))


def test_the_causality_probe_leaves_the_rng_and_the_modes_and_takes_bf16_rounding():
    """The probe advanced the global RNG of a mixer that draws random numbers (the rest of the model was
    initialised differently than with the same mixer registered), set every submodule to training mode (one kept
    in eval mode), and refused a causal bf16 mixer for a rounding difference (0.004 of its scale > 1e-3)."""
    cfg = GPTConfig(vocab_size=20, n_layer=2, n_head=2, d_model=64, max_seq_len=64)
    registered = type("RegisteredNoisyCumulativeMean", (NoisyCumulativeMean,), {})
    attn_zoo.register_mixer("registered_noisy_cumulative_mean_toy", registered, causal=True)
    draws = []
    for spec in (MixerSpec("registered_noisy_cumulative_mean_toy"), MixerSpec(f"{__name__}.NoisyCumulativeMean")):
        torch.manual_seed(0)
        model = GPT(cfg, spec)
        draws.append(torch.randn(3))
        assert not model.blocks[0].attn.frozen.training
    torch.testing.assert_close(draws[0], draws[1], atol=0, rtol=0)
    for seed in range(5):
        torch.manual_seed(seed)
        GPT(cfg, MixerSpec(f"{__name__}.StabilisedCumulativeSoftmax"))


def test_a_model_on_the_meta_device_with_an_unregistered_mixer_and_the_delta_mixers():
    """``with torch.device("meta"): GPT(...)`` (shapes, FLOP counts) failed in the probe (``aten::equal`` has no
    meta kernel) and, for deltanet / gated_deltanet, in ``torch.autocast(device_type="meta")`` ("unsupported
    scalarType": meta is no autocast device)."""
    cfg = GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=64)
    for spec in (MixerSpec(f"{__name__}.CumulativeMean"), MixerSpec("deltanet"), MixerSpec("gated_deltanet")):
        with torch.device("meta"):
            model = GPT(cfg, spec, backend="torch")
            idx = torch.zeros(2, 24, dtype=torch.long)
            logits, loss = model(idx, idx)
        assert logits.device.type == "meta" and logits.shape == (2, 24, 20)
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
@pytest.mark.parametrize("kw", [dict(head_dim=8.5), dict(n_head="2"), dict(n_head=0)])
def test_delta_mixer_sizes_are_checked_at_construction(mixer, kw):
    """Before: a float / str size reached torch.empty ("must be tuple of ints"), naming neither mixer nor option."""
    cfg = GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=64)
    (name, value), = kw.items()
    with pytest.raises(ValueError, match=rf"^{mixer} {name}={value!r} must be an integer >= 1"):
        build_mixer(MixerSpec(mixer, kw), cfg)


@pytest.mark.parametrize("kw, msg", [(dict(proj_dim=2.5), r"linformer proj_dim=2.5 must be an integer >= 1"),
                                     (dict(proj_dim="abc"), r"linformer proj_dim='abc' must be an integer >= 1"),
                                     (dict(proj_dim=0), r"linformer proj_dim=0 must be an integer >= 1"),
                                     (dict(share_kv="yes"), r"linformer share_kv='yes' must be true or false"),
                                     (dict(causal="no"), r"linformer causal='no' must be true or false")])
def test_linformer_options_are_checked_at_construction(kw, msg):
    """Before: proj_dim=2.5 passed int() and failed in torch, 'abc' failed in int() naming no option, a string
    share_kv / causal counted as true."""
    with pytest.raises(ValueError, match=msg):
        Linformer(16, 2, 8, 12, **kw)


# -------------------------------------------------------------------------------------------------- DeltaNet
def _qkv(T=7, H=2, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(1, T, H, D, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, D, generator=g), dim=-1)
    v = torch.randn(1, T, H, D, generator=g)
    beta = torch.rand(1, T, H, generator=g)
    g_ = -torch.rand(1, T, H, generator=g)
    return q, k, v, beta, g_


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_naive_matches_the_matrix_form(gated):
    """S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T (state V x K here), o_t = scale * S_t q_t."""
    q, k, v, beta, g = _qkv()
    o, S = delta_rule_naive(q, k, v, beta, g if gated else None, scale=0.5)
    M = torch.zeros(2, 4, 4)
    for t in range(7):
        for h in range(2):
            a = torch.exp(g[0, t, h]) if gated else 1.0
            kt = k[0, t, h]
            M[h] = a * M[h] @ (torch.eye(4) - beta[0, t, h] * torch.outer(kt, kt)) + beta[0, t, h] * torch.outer(v[0, t, h], kt)
            torch.testing.assert_close(o[0, t, h], 0.5 * M[h] @ q[0, t, h], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S[0], M.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_delta_rule_retrieves_a_stored_value_with_beta_one():
    """The delta rule's point (recall): with beta = 1, writing v under an orthonormal key replaces what was stored."""
    q, k, v, beta, _ = _qkv(T=3, H=1, D=4)
    e = torch.eye(4)
    k = torch.stack([e[0], e[1], e[0]])[None, :, None]  # key 0 written twice
    o, _ = delta_rule_naive(e[0].expand(1, 3, 1, 4), k, v, torch.ones(1, 3, 1), scale=1.0)
    torch.testing.assert_close(o[0, 2, 0], v[0, 2, 0])  # the second write replaced the first


def test_fla_backend_without_the_package_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)
    monkeypatch.setitem(sys.modules, "fla.ops", None)
    monkeypatch.setitem(sys.modules, "fla.ops.delta_rule", None)
    q, k, v, beta, g = _qkv()
    with pytest.raises(ImportError, match=r"flash-linear-attention.*pip install flash-linear-attention"):
        delta_rule(q, k, v, beta, backend="fla")
    with pytest.raises(ValueError, match=r"backend='cuda'.*allowed values: auto, fla, chunk, naive"):
        delta_rule(q, k, v, beta, backend="cuda")
    with pytest.raises(ValueError, match=r"gated_deltanet kernel='x'"):
        GatedDeltaNet(16, 2, 8, kernel="x")
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    for cls in (DeltaNet, GatedDeltaNet):  # named when the model is built, not at its first forward
        with pytest.raises(ImportError, match=r"kernel='fla' of the .*deltanet mixer needs .*flash-linear-attention"):
            cls(16, 2, 8, kernel="fla")
    o, _ = delta_rule(q, k, v, beta, backend="auto")  # CPU: our recurrence
    torch.testing.assert_close(o, delta_rule_naive(q, k, v, beta)[0])


@pytest.mark.parametrize("cls", [DeltaNet, GatedDeltaNet])
def test_deltanet_chunked_decoding_equals_the_full_forward(cls):
    torch.manual_seed(0)
    m = cls(16, 2, 8).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        full = m(x)
        c = m.new_cache(2, 9, x.dtype, x.device)
        parts = [m(x[:, :4], c), m(x[:, 4:5], c), m(x[:, 5:9], c)]
    assert c.n == 9
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
def test_generate_with_cache_equals_generate_without(mixer):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=40, n_layer=2, n_head=2, d_model=16, max_seq_len=32)
    model = GPT(cfg, [MixerSpec(mixer), attn_zoo.make_spec("flash")], backend="reference").eval()
    idx = torch.randint(0, 40, (2, 4), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model.generate(idx, 8, greedy=True, use_cache=True)
        b = model.generate(idx, 8, greedy=True, use_cache=False)
    assert a.shape == (2, 12) and torch.equal(a, b)


# ------------------------------------------------------------------------------------------------- train.py
def _cfg(tmp_path, extra):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["logger=csv", "model.d_model=16", "model.n_layer=1",
                                                      "model.n_head=2", "data.seq_len=16", "data.batch_size=4",
                                                      "data.vocab_size=32", "data.num_kv_pairs=2",
                                                      "data.num_train=8", "data.num_val=4",
                                                      "+trainer.fast_dev_run=true", *extra])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg


def test_train_py_deltanet_runs_and_linformer_is_refused(tmp_path):
    import train as train_mod

    train_mod.train(_cfg(tmp_path / "d", ["attention=deltanet"]))
    with pytest.raises(ValueError, match=r"linformer.*non-causal mixer.*causal language model"):
        train_mod.train(_cfg(tmp_path / "l", ["attention=linformer"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("gated", [False, True])
def test_fla_delta_rule_matches_our_recurrence_on_gpu(gated):
    pytest.importorskip("fla", reason="flash-linear-attention is not installed")
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 200, 4, 64
    bf = torch.bfloat16  # fla's chunked delta-rule kernels take bf16 / fp16 only
    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1).cuda().to(bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1).cuda().to(bf)
    v = torch.randn(B, T, H, D, generator=g).cuda().to(bf)
    beta = torch.rand(B, T, H, generator=g).cuda().to(bf)
    gl = (-torch.rand(B, T, H, generator=g) * 0.1).cuda() if gated else None
    o, S = delta_rule(q, k, v, beta, gl, backend="fla")
    # the reference in fp32 on the same (bf16-rounded) inputs; fla's output is bf16
    o_ref, S_ref = delta_rule_naive(q.float(), k.float(), v.float(), beta.float(), gl)
    torch.testing.assert_close(o.float(), o_ref.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(S.float(), S_ref.float(), atol=3e-2, rtol=3e-2)


def test_fla_delta_rule_refuses_float32_naming_the_dtype(monkeypatch):
    import attn_zoo.families.deltanet as dn

    monkeypatch.setattr(dn, "_fla", lambda gated: (lambda *a, **k: None))  # as if fla were installed
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="needs float16 / bfloat16 q, k, v, got torch.float32"):
        delta_rule(q, q, q, torch.zeros(1, 4, 2), backend="fla")
