"""MLA (DeepSeek-V2 Multi-head Latent Attention, attn_zoo/mla.py): forward vs a plain PyTorch reference, absorbed
decode == non-absorbed decode == the full forward, GPT.generate with the latent cache == without, cache bytes per
token, Dv != D dispatch, and errors naming the option."""

import pytest
import torch

import attn_zoo
from attn_zoo.decode.memory import memory_table
from attn_zoo.mixers import MixerSpec, build_mixer
from attn_zoo.mla import MLA, MLACache, mla_cache_bytes_per_token, mla_reference
from attn_zoo.model import GPT, GPTConfig


def _mla(seed=0, dtype=torch.float64, std=0.2, **kw):
    torch.manual_seed(seed)
    opts = dict(d_model=64, n_head=4, head_dim=16, max_seq_len=32)
    opts.update(kw)
    m = MLA(**opts).to(dtype)
    with torch.no_grad():  # larger weights than the GPT init: sharp attention, so a wrong piece shows
        for name, p in m.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
    return m


@pytest.mark.parametrize("kw", [dict(), dict(q_lora_rank=24, kv_lora_rank=20, qk_rope_dim=6, v_head_dim=8),
                                dict(qk_rope_dim=0, causal=False, bias=True)])
def test_forward_matches_plain_reference(kw):
    m = _mla(**kw)
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, 11, 64)
    # the module's RMSNorm runs in fp32 (attn_zoo.model.RMSNorm): fp32-level agreement with the fp64 reference
    torch.testing.assert_close(y, mla_reference(m, x), atol=1e-5, rtol=1e-5)
    assert m.qk_head_dim == m.qk_nope_dim + m.qk_rope_dim


def test_default_dims_differ_between_qk_and_v():
    m = MLA(d_model=128, n_head=4, head_dim=32)
    assert (m.qk_nope_dim, m.qk_rope_dim, m.v_head_dim, m.kv_lora_rank, m.q_lora_rank) == (32, 16, 32, 128, 0)
    assert m.qk_head_dim == 48 and m.scale == 48 ** -0.5
    x = torch.randn(1, 5, 128)
    q_nope, q_rope = m.queries(x)
    c, k_rope = m.latent(x)
    k, v = m.expand(c, k_rope)
    assert torch.cat([q_nope, q_rope], -1).shape == k.shape == (1, 4, 5, 48) and v.shape == (1, 4, 5, 32)
    assert c.shape == (1, 5, 128) and k_rope.shape == (1, 1, 5, 16)


@pytest.mark.parametrize("absorb", [True, False])
def test_cached_decode_equals_full_forward(absorb):
    m = _mla(q_lora_rank=24, absorb=absorb)
    x = torch.randn(2, 12, 64, dtype=torch.float64)
    full = m(x)
    cache = m.new_cache(2, 16, torch.float64, "cpu")
    parts = [m(x[:, :5], cache, 0), m(x[:, 5:6], cache, 5), m(x[:, 6:7], cache, 6), m(x[:, 7:12], cache, 7)]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-10, rtol=1e-10)


def test_absorbed_decode_reads_only_the_latent():
    m = _mla()
    x = torch.randn(1, 9, 64, dtype=torch.float64)
    want = m(x)[:, 8]
    cache = m.new_cache(1, 9, torch.float64, "cpu")
    m(x[:, :8], cache, 0)
    # the cache holds c_kv and k_rope only: r + D_rope = 64 + 8 numbers per token, one "head"
    assert cache.lat.shape == (1, 1, 9, 64 + 8) and cache.nbytes == 9 * 72 * 8
    calls = []

    def no_expand(*a):  # absorbed decode must never rebuild per-head K / V of the cached tokens
        calls.append(1)
        raise AssertionError("expanded K/V at decode")

    m.expand = no_expand
    got = m(x[:, 8:9], cache, 8)
    assert not calls
    torch.testing.assert_close(got[:, 0], want, atol=1e-10, rtol=1e-10)


def _gpt(layers, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=37, n_layer=len(layers), n_head=4, d_model=32, max_seq_len=12)
    model = GPT(cfg, layers, backend="auto").eval()
    with torch.no_grad():  # the GPT init repeats the last token under greedy decoding: sharper weights
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("layers", [[MixerSpec("mla"), MixerSpec("mla", {"q_lora_rank": 16, "v_head_dim": 4})],
                                    [MixerSpec("mla"), attn_zoo.make_spec("flash")]])
def test_generate_with_cache_equals_without(layers):
    model = _gpt(layers)
    idx = torch.randint(0, 37, (2, 4))
    # 12 new tokens: 8 decode steps on the cache, then the context slides past max_seq_len (re-prefill)
    a = model.generate(idx, 12, greedy=True, use_cache=True)
    b = model.generate(idx, 12, greedy=True, use_cache=False)
    assert torch.equal(a, b) and len(set(a[:, 4:].flatten().tolist())) > 1
    # logits of a prefill + single-token + multi-token decode == one full forward
    seq = torch.randint(0, 37, (2, 11))
    caches = model.init_cache(2, 11)
    with torch.no_grad():
        got = torch.cat([model(seq[:, :5], caches=caches, pos=0), model(seq[:, 5:6], caches=caches, pos=5),
                         model(seq[:, 6:11], caches=caches, pos=6)], 1)
        torch.testing.assert_close(got, model(seq), atol=1e-4, rtol=1e-4)
    caches = model.init_cache(2, 10)
    assert isinstance(caches[0], MLACache) and caches[0].nbytes == 2 * 10 * (4 * 8 + 4) * 4


def test_cache_bytes_per_token_formula_and_memory_table():
    # DeepSeek-V2: d_h = 128, 128 heads, d_c = 4 d_h = 512, d_h^R = 64: 576 elements per token and layer
    assert mla_cache_bytes_per_token(512, 64, n_layer=60, dtype_bytes=2) == 60 * 576 * 2
    mha = 2 * 128 * 128 * 2
    assert mha / mla_cache_bytes_per_token(512, 64) == pytest.approx(56.9, abs=0.1)
    rows = memory_table(4, 8, 64, 3e8, contexts=(1024,), gqa_groups=(4,), mla_dims=(256, 32))
    per = {r["variant"]: r for r in rows}
    assert per["mla"]["bytes_per_token"] == 4 * (256 + 32) * 2
    assert per["mla"]["bytes_at_1024"] == 1024 * per["mla"]["bytes_per_token"]
    assert per["mha"]["bytes_per_token"] == 4 * 2 * 8 * 64 * 2 and per["mqa"]["bytes_per_token"] == 4 * 2 * 64 * 2
    n = per["mla"]["max_context"]
    assert n * per["mla"]["bytes_per_token"] <= 3e8 < (n + 1) * per["mla"]["bytes_per_token"]
    assert "mla" not in [r["variant"] for r in memory_table(4, 8, 64, 3e8, contexts=(1024,))]  # opt-in row


def test_dv_differs_from_d_dispatch():
    q, k = torch.randn(1, 2, 6, 12), torch.randn(1, 1, 6, 12)
    v = torch.randn(1, 1, 6, 4)
    spec = attn_zoo.make_spec("flash", causal=True)
    out = attn_zoo.attention(q, k, v, spec)  # auto: torch (SDPA) on CPU
    torch.testing.assert_close(out, attn_zoo.attention(q, k, v, spec, backend="reference"), atol=1e-5, rtol=1e-5)
    assert out.shape == (1, 2, 6, 4)
    # our Triton kernel takes Dv != D too (under the interpreter here; tests/test_kernel_flash_dv.py for gradients)
    torch.testing.assert_close(attn_zoo.attention(q, k, v, spec, backend="triton"), out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw, msg", [
    (dict(kv_lora_rank=0), r"MLA kv_lora_rank must be an integer >= 1, got 0"),
    (dict(qk_rope_dim=5), r"MLA qk_rope_dim must be an even integer >= 0, got 5"),
    (dict(v_head_dim=2.5), r"MLA v_head_dim must be an integer >= 1, got 2.5"),
    (dict(q_lora_rank=-3), r"MLA q_lora_rank must be an integer >= 0, got -3"),
    (dict(qk_nope_dim=0), r"MLA qk_nope_dim must be an integer >= 1"),
    (dict(causal="yes"), r"MLA causal must be true or false"),
    (dict(softmax_scale=-1.0), r"MLA softmax_scale must be a number > 0 or null"),
])
def test_bad_options_name_the_argument(kw, msg):
    with pytest.raises(ValueError, match=msg):
        MLA(d_model=32, n_head=4, head_dim=8, **kw)


def test_cache_errors():
    m = _mla()
    with pytest.raises(ValueError, match=r"page_size=16: the MLA latent cache is contiguous only"):
        m.new_cache(1, 8, torch.float64, "cpu", page_size=16)
    cache = m.new_cache(1, 4, torch.float64, "cpu")
    with pytest.raises(ValueError, match=r"exceeds its capacity=4"):
        m(torch.randn(1, 5, 64, dtype=torch.float64), cache, 0)
    with pytest.raises(ValueError, match=r"mixer 'mla' cannot be built with options \['rank'\]"):
        build_mixer(MixerSpec("mla", {"rank": 3}), GPTConfig())


def test_config_yaml_builds_the_mla_mixer():
    """conf/attention/mla.yaml through the path train.py takes (``make_layer_spec`` of the yaml's fields), for
    ``attention=mla`` and ``model.layers=[mla,flash]`` (the CPU training runs of both commands: docs/mla.md)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from attn_zoo.mixers import make_layer_spec

    node = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "attention" / "mla.yaml")
    spec = make_layer_spec(**OmegaConf.to_container(node, resolve=True))
    assert spec.label == "mla" and spec.mixer == "attn_zoo.mla.MLA" and spec.causal
    model = GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, max_seq_len=16), [spec, attn_zoo.make_spec("flash")],
                backend="reference")
    assert model.layer_labels == ["mla", "flash"]
    assert isinstance(model.blocks[0].attn, MLA) and model.blocks[0].attn.qk_head_dim == 16 + 8
    assert model.generate(torch.zeros(1, 3, dtype=torch.long), 2).shape == (1, 5)


def test_every_builtin_mixer_is_registered_at_the_first_query_of_the_registry():
    """``model.layers=[{mixer:mla},flash]`` was refused ("allowed values: mamba2, deltanet, ...") unless
    ``attn_zoo.mla`` had been imported by then: a fresh process that imports only the registry knows them all."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\n"
            "from attn_zoo.mixers import MixerSpec, mixer_names\n"
            "assert 'attn_zoo.mla' not in sys.modules\n"
            "spec = MixerSpec('mla')\n"
            "print((sorted(mixer_names()), spec.causal))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str((sorted(["attention", "deltanet", "gated_deltanet", "linformer", "mamba2", "mla"]),
                                    True))


def test_absorbed_decode_runs_on_the_decode_kernel():
    """backend='triton': the absorbed step reads the latent cache in place through the decode kernel with
    D = r + D_rope = 84 (not a power of two) for q.k and Dv = r = 64 for the values (issue 26 item 4); the
    decode kernel is called (patched to count) and the chunks equal the full forward."""
    import kernels.decode as kd

    m = _mla(dtype=torch.float32, q_lora_rank=24, kv_lora_rank=64, qk_rope_dim=20)
    m.backend = "triton"
    x = torch.randn(2, 9, 64)
    calls = []
    real = kd.decode_run

    def counting(plan, *a, **kw):
        calls.append((plan.D, plan.Dv))
        return real(plan, *a, **kw)

    kd.decode_run = counting
    try:
        cache = m.new_cache(2, 16, torch.float32, "cpu")
        parts = [m(x[:, :5], cache, 0), m(x[:, 5:6], cache, 5), m(x[:, 6:9], cache, 6)]
    finally:
        kd.decode_run = real
    assert calls == [(84, 64), (84, 64)]
    m.backend = "reference"
    torch.testing.assert_close(torch.cat(parts, 1), m(x), atol=1e-4, rtol=1e-4)
