"""The dilated sliding window (Longformer) as one plugin folder: spec, MaskInfo rule and tiles, every backend that
runs it (reference, torch = SDPA mask / FlexAttention mask_mod, the flex / naive anchors, our Triton kernel), cost
entries, the model and decoding."""

import itertools
import pickle
from pathlib import Path

import pytest
import torch

import attn_zoo
from attn_zoo import AttentionSpec, attention, make_spec, mask_info
from attn_zoo.variants import element_fraction, get_variant, is_subquadratic

ROOT = Path(__file__).resolve().parents[1]


def rule(i, j, Nq, Nk, causal, left, right, d):
    """The definition, element by element (``left`` / ``right`` in keys, ``None`` unbounded)."""
    ia = i + Nk - Nq
    if causal and j > ia:
        return False
    if left is not None and j < ia - left * d:
        return False
    if right is not None and j > ia + right * d:
        return False
    return (ia - j) % d == 0


def spec_of(left=3, right=0, d=2, causal=True):
    return AttentionSpec(kind="dilated_window", window_size=(left, right), dilation=d, causal=causal)


# --------------------------------------------------------------------------------------------- spec
def test_spec_construction_validation_and_round_trips():
    s = AttentionSpec(kind="dilated_window", window_size=(7, 0), dilation=3)
    assert type(s).__name__ == "DilatedWindowSpec" and isinstance(s, AttentionSpec) and s.is_softmax
    assert s == make_spec("dilated_window", window_size=[7, 0], dilation=3) and hash(s) == hash(make_spec(
        "dilated_window", window_size=(7, 0), dilation=3))
    assert s != s.replace(dilation=2) and s.replace(causal=False).dilation == 3
    assert pickle.loads(pickle.dumps(s)) == s
    from attn_zoo.model import layer_from_dict, spec_to_dict

    assert layer_from_dict(spec_to_dict(s)) == s
    with pytest.raises(ValueError, match="dilation must be an integer >= 1, got 0"):
        make_spec("dilated_window", window_size=(3, 0), dilation=0)
    with pytest.raises(ValueError, match="dilation must be an integer >= 1"):
        make_spec("dilated_window", window_size=(3, 0), dilation=True)
    with pytest.raises(ValueError, match=r"kind='dilated_window' needs window_size=\(left, right\)"):
        make_spec("dilated_window", dilation=2)
    with pytest.raises(ValueError, match=r"unknown fields \['dilation'\] for kind='flash'"):
        make_spec("flash", dilation=2)
    with pytest.raises(ValueError, match="window_size is only used by kind='sliding_window' / 'dilated_window'"):
        make_spec("flash", window_size=(3, 0))
    assert "dilated_window" in attn_zoo.KINDS


def test_yaml_instantiates_the_spec():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    s = instantiate(OmegaConf.load(ROOT / "conf" / "attention" / "dilated_window.yaml"))
    assert s.kind == "dilated_window" and s.window_size == (15, 0) and s.dilation == 2 and s.label == "dilated_window"


# --------------------------------------------------------------------------------------------- mask
CASES = [(12, 12, True, 3, 0, 2), (12, 12, True, None, 0, 3), (9, 16, True, 2, 0, 2), (16, 9, True, 4, 0, 2),
         (13, 13, False, 2, 3, 2), (10, 14, False, None, 1, 3), (12, 12, True, 5, 0, 1)]


@pytest.mark.parametrize("Nq,Nk,causal,left,right,d", CASES)
def test_mask_info_element_rule_and_tiles(Nq, Nk, causal, left, right, d):
    spec = spec_of(left, right, d, causal)
    mi = mask_info(spec, Nq, Nk)
    assert mi.dilation == d and mi.window_left == (None if left is None else left * d)
    want = torch.tensor([[rule(i, j, Nq, Nk, causal, left, right, d) for j in range(Nk)] for i in range(Nq)])
    assert torch.equal(mi.dense(), want)
    for bm, bn in ((4, 4), (4, 8), (8, 2)):  # visited tiles cover every allowed element; full tiles have no masked one
        bt = mi.block_table(bm, bn)
        for qb, kb in itertools.product(range(bt.visited.shape[0]), range(bt.visited.shape[1])):
            tile = want[qb * bm:(qb + 1) * bm, kb * bn:(kb + 1) * bn]
            if tile.any():
                assert bt.visited[qb, kb], (qb, kb)
            if bt.full[qb, kb]:
                assert tile.all() and tile.shape == (bm, bn), (qb, kb)
        if d > 1:
            assert not bt.full.any()
    if d == 1:  # dilation 1 is the sliding window
        sw = AttentionSpec(kind="sliding_window", window_size=(left, right), causal=causal)
        assert torch.equal(mask_info(sw, Nq, Nk).dense(), want)


# --------------------------------------------------------------------------------------------- backends
def _qkv(Nq, Nk, dtype=torch.float32, Hq=4, Hkv=2, D=16, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, Nk, D, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, Nk, D, generator=g).to(dtype).requires_grad_()
    return q, k, v


def _run(q, k, v, spec, backend):
    for t in (q, k, v):
        t.grad = None
    out = attention(q, k, v, spec, backend=backend)
    out.backward(torch.cos(torch.arange(out.numel(), dtype=torch.float32)).view_as(out).to(out.dtype))
    return out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()


@pytest.mark.parametrize("backend", ["torch", "flex", "naive"])
@pytest.mark.parametrize("Nq,Nk,causal,left,right,d", CASES[:5])
def test_torch_forms_match_the_reference(backend, Nq, Nk, causal, left, right, d):
    """``torch`` (SDPA + the boolean MaskInfo mask on CPU), ``flex`` (FlexAttention, BlockMask from
    MaskInfo.allowed as mask_mod) and ``naive``: output and every gradient."""
    spec = spec_of(left, right, d, causal)
    q, k, v = _qkv(Nq, Nk)
    if backend == "flex" and not q.is_cuda:  # FlexAttention has no CPU backward: the forward (eager mask_mod path)
        q, k, v = q.detach(), k.detach(), v.detach()
        with torch.no_grad():
            torch.testing.assert_close(attention(q, k, v, spec, backend="flex"),
                                       attention(q, k, v, spec, backend="reference"), atol=2e-5, rtol=2e-5)
        return
    ref = _run(q, k, v, spec, "reference")
    got = _run(q, k, v, spec, backend)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_auto_is_torch_on_cpu_and_sdpa_anchors_refuse():
    spec = spec_of()
    q, k, v = _qkv(8, 8)
    assert attn_zoo.resolve_backend(q, k, v, spec).name == "torch"
    regs = attn_zoo.get_backends("dilated_window")
    assert {"reference", "torch", "triton", "flex", "naive", "sdpa_math"} <= set(regs)
    with pytest.raises(ValueError, match="SDPA runs exact full / causal attention only"):
        attention(q, k, v, spec, backend="sdpa_math")
    out, lse = attention(q, k, v, spec, backend="reference", return_lse=True)
    assert lse.shape == (2, 4, 8) and out.dtype == q.dtype


@pytest.mark.parametrize("Nq,Nk,causal,left,right,d", [(48, 48, True, 5, 0, 3), (40, 64, True, 7, 0, 2),
                                                       (64, 40, True, 9, 0, 2), (48, 48, False, 3, 4, 2)])
def test_triton_kernel_matches_the_reference(Nq, Nk, causal, left, right, d):
    """Our Triton kernel through the backend (TRITON_INTERPRET=1 on the CPU): output, lse and every gradient, GQA,
    B = 2, ``Nq != Nk``."""
    spec = spec_of(left, right, d, causal)
    q, k, v = _qkv(Nq, Nk, dtype=torch.float32)
    why = attn_zoo.get_backends(spec.kind)["triton"].why_not(q, k, v, spec)
    if why is not None:
        pytest.skip(why)  # no triton / not interpreting
    ref = _run(q, k, v, spec, "reference")
    got = _run(q, k, v, spec, "triton")
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
    _, lse_ref = attention(q, k, v, spec, backend="reference", return_lse=True)
    _, lse = attention(q, k, v, spec, backend="triton", return_lse=True)
    torch.testing.assert_close(lse, lse_ref, atol=2e-4, rtol=2e-4)


# --------------------------------------------------------------------------------------------- cost entries
@pytest.mark.parametrize("N", [1, 7, 64, 100])
def test_element_fraction_counts_the_mask(N):
    for spec in (spec_of(3, 0, 2), spec_of(None, 0, 3), spec_of(2, 3, 2, causal=False)):
        want = float(mask_info(spec, N, N).dense().double().mean())
        assert element_fraction(spec, N) == pytest.approx(want, rel=1e-12)
    assert is_subquadratic("dilated_window") and get_variant("dilated_window").family == "softmax"
    from eval.crossover import _is_subquadratic
    from eval.sweep import element_fraction as sweep_fraction

    assert sweep_fraction(spec_of(), N) == element_fraction(spec_of(), N) and _is_subquadratic("dilated_window")


# --------------------------------------------------------------------------------------------- model, decoding
def test_model_trains_and_decodes_with_a_dilated_layer():
    from attn_zoo.model import GPT, GPTConfig

    torch.manual_seed(0)
    spec = spec_of(4, 0, 2)
    model = GPT(GPTConfig(vocab_size=40, n_layer=2, n_head=4, d_model=32, max_seq_len=40), [spec, make_spec("flash")])
    idx = torch.randint(0, 40, (2, 20))
    _, loss = model(idx, idx)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    a = model.generate(idx[:, :6], 10, greedy=True, use_cache=False)
    b = model.generate(idx[:, :6], 10, greedy=True, use_cache=True)
    assert torch.equal(a, b)


def test_decode_attention_uses_the_dilated_rule():
    from attn_zoo.decode import decode_attention

    spec = spec_of(3, 0, 2)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2, 2, 16, 8, generator=g)
    v = torch.randn(2, 2, 16, 8, generator=g)
    q = torch.randn(2, 4, 1, 8, generator=g)
    lens = torch.tensor([16, 11], dtype=torch.int32)
    for backend in ("torch", "reference"):
        out = decode_attention(q, k, v, spec, lens, backend=backend)
        for b, n in enumerate(lens.tolist()):
            want = attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], spec, backend="reference")
            torch.testing.assert_close(out[b:b + 1], want, atol=1e-5, rtol=1e-5)
    from attn_zoo.decode.attention import _triton_reason

    assert "no dilation rule" in (_triton_reason(q.half(), k.half(), spec) or "no dilation rule")


def test_trains_through_train_py_with_the_yaml(tmp_path):
    """``python train.py attention=dilated_window``: the one yaml is all the training path needs."""
    import csv

    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    import train as train_mod  # the repo root is on sys.path: conftest.py there

    over = ["attention=dilated_window", "attention.window_size=[7,0]", "logger=csv", "model.d_model=32",
            "model.n_head=4", "data.seq_len=32", "data.batch_size=16", "data.vocab_size=32", "data.num_kv_pairs=4",
            "data.num_train=512", "data.num_val=64", "trainer.max_steps=20", "trainer.val_check_interval=20",
            "trainer.limit_val_batches=1", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
            "optim.lr=1e-2", "optim.warmup_steps=5"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=over)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tmp_path / "cache")
    specs = train_mod.layer_specs(cfg)
    assert specs[0] == spec_of(7, 0, 2) and specs[0].label == "dilated_window"
    metrics = train_mod.train(cfg)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        loss = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(loss) == 20 and sum(loss[-5:]) / 5 < sum(loss[:5]) / 5
    assert metrics["val/loss"] < 10
