"""Kernel settings passed explicitly: ``kernels.FlashConfig`` / ``flash_settings`` and ``kernels.LinearConfig`` /
``linear_settings`` (frozen, hashable configs; a context variable for a block of calls; nothing read from the
environment or from module globals). CPU: TRITON_INTERPRET=1, small shapes."""

import os
import pathlib
import re
import threading

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "kernels"


def _inputs(B=1, Hq=4, Hkv=2, N=32, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEV)  # noqa: E731
    return mk(B, Hq, N, D), mk(B, Hkv, N, D), mk(B, Hkv, N, D), mk(B, Hq, N, D)


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)


def test_flash_config_values_hash_and_key():
    from kernels import FlashConfig, TileConfig

    a, b = FlashConfig(), FlashConfig()
    assert a == b and hash(a) == hash(b) and a.key == "{}" and a.fwd_impl == "auto"
    t = FlashConfig(fwd_impl="triton")  # not the default any more: in the key, and back
    assert t != a and FlashConfig.from_key(t.key) == t and t.replace(fwd_impl="auto") == a
    c = FlashConfig(dq_mode="atomic", dkdv_split=2, tma=True, fwd=(64, 32, 4, 2),
                    sparse_dkdv=dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1))
    assert c.fwd == TileConfig(64, 32, 4, 2) and c.sparse_dkdv == TileConfig(32, 16, 4, 1)
    assert FlashConfig.from_key(c.key) == c and hash(FlashConfig.from_key(c.key)) == hash(c)
    assert c != a and c.replace(dq_mode="separate", dkdv_split=None, tma="auto", fwd=None, sparse_dkdv=None) == a
    assert c.tile("fwd", False) == c.fwd and c.tile("fwd", True) is None and c.tile("dkdv", True) == c.sparse_dkdv
    assert {a: 1}[b] == 1  # usable as a cache key
    with pytest.raises(dataclass_error()):
        a.dq_mode = "atomic"  # frozen
    for bad in (dict(dq_mode="fused"), dict(dkdv_split=0), dict(dkdv_split=True), dict(tma="yes"), dict(tma=1),
                dict(deterministic=True, dq_mode="atomic"), dict(fwd=(64, 32)), dict(tma_min_pairs=-1),
                dict(autotune="no"), dict(sparse_fwd=(24, 16, 4, 1)), dict(fwd_impl="gluon_ws2"),
                dict(fwd_impl="gluon_ws3"), dict(fwd_impl=None)):
        with pytest.raises(ValueError):
            FlashConfig(**bad)
    # forced dense tiles: refused at construction naming the field (tl.arange / tl.dot need powers of two >= 16),
    # not deep inside the launch
    for name in ("fwd", "dq", "dkdv"):
        for tile, msg in (((24, 16, 4, 1), "BLOCK_M=24"), ((16, 8, 4, 1), "BLOCK_N=8"), ((16, 16, 3, 1), "num_warps=3")):
            with pytest.raises(ValueError, match=rf"{name}.*{msg}.*power of two"):
                FlashConfig(**{name: tile})


def dataclass_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_flash_settings_nest_restore_and_stay_in_their_thread():
    from kernels import FlashConfig, current_flash_config, flash_settings

    assert current_flash_config() == FlashConfig()
    with flash_settings(dq_mode="atomic") as outer:
        assert current_flash_config() is outer and outer.dq_mode == "atomic"
        with flash_settings(tma=False) as inner:  # changes apply on top of the current settings
            assert inner == FlashConfig(dq_mode="atomic", tma=False) and current_flash_config() is inner
            seen = []
            t = threading.Thread(target=lambda: seen.append(current_flash_config()))
            t.start()
            t.join()
            assert seen == [FlashConfig()]  # another thread does not see this block's settings
        assert current_flash_config() is outer
        with flash_settings(FlashConfig(dkdv_split=1)) as fresh:  # an explicit config replaces them
            assert fresh == FlashConfig(dkdv_split=1)
        with pytest.raises(ValueError):
            with flash_settings(dq_mode="nope"):
                pass
        assert current_flash_config() is outer
    assert current_flash_config() == FlashConfig()


def test_environment_variables_steer_nothing(monkeypatch):
    """The former environment switches are not read (at forward or backward time): the plan of a call follows
    its config only."""
    import kernels.flash as kf
    from kernels import flash_attn

    q, k, v, do = _inputs()

    def plan_metas():
        kf.clear_plans()
        _grads(lambda a, b, c: flash_attn(a, b, c, causal=True), q, k, v, do)
        return {key[0]: p.meta for key, p in kf.launch_plans().items()}

    before = plan_metas()
    for name, val in (("ATTN_ZOO_FLASH_DQ", "atomic"), ("ATTN_ZOO_FLASH_DKDV_SPLIT", "1"),
                      ("ATTN_ZOO_AUTOTUNE", "1")):
        monkeypatch.setenv(name, val)
    after = plan_metas()
    assert after == before and not after["bwd"]["atomic"] and after["bwd"]["n_split"] == 2  # the heuristic's split
    for path in KERNELS_DIR.rglob("*.py"):
        src = path.read_text()
        assert "ATTN_ZOO_" not in src, path
        assert not re.search(r"os\.environ(?!\.get\(\"TRITON_INTERPRET\")", src), path


@pytest.mark.parametrize("compiling", [False, True])
def test_config_reaches_both_autograd_paths(compiling, monkeypatch):
    """The eager ``autograd.Function`` gets the config object, the custom ops (``torch.compile``) its key string:
    both run the backward with it (atomic dQ, split 2 here) and agree with the default settings' gradients."""
    import kernels.flash as kf
    from kernels import FlashConfig, flash_attn

    q, k, v, do = _inputs(Hq=4, Hkv=1, seed=3)
    base = _grads(lambda a, b, c: flash_attn(a, b, c, causal=True), q, k, v, do)
    cfg = FlashConfig(dq_mode="atomic", dkdv_split=2)
    if compiling:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    kf.clear_plans()
    got = _grads(lambda a, b, c: flash_attn(a, b, c, causal=True, config=cfg), q, k, v, do)
    bwd = [p.meta for key, p in kf.launch_plans().items() if key[0] == "bwd"]
    assert len(bwd) == 1 and bwd[0]["atomic"] and bwd[0]["n_split"] == 2
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, base):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)


def test_call_arguments_override_the_config():
    """FlashAttention-style ``dq_mode=`` / ``dkdv_split=`` / ``deterministic=`` override the config's fields for
    one call (the derived config is cached: one plan per distinct setting)."""
    import kernels.flash as kf
    from kernels import FlashConfig, flash_attn

    q, k, v, do = _inputs(Hq=4, Hkv=1, seed=4)
    kf.clear_plans()
    for _ in range(2):
        _grads(lambda a, b, c: flash_attn(a, b, c, causal=True, dkdv_split=4, config=FlashConfig(dq_mode="atomic")),
               q, k, v, do)
    bwd = [p.meta for key, p in kf.launch_plans().items() if key[0] == "bwd"]
    assert len(bwd) == 1 and bwd[0]["atomic"] and bwd[0]["n_split"] == 4
    _grads(lambda a, b, c: flash_attn(a, b, c, causal=True, deterministic=True), q, k, v, do)
    bwd = [p.meta for key, p in kf.launch_plans().items() if key[0] == "bwd"]
    assert len(bwd) == 2 and sum(m["atomic"] for m in bwd) == 1


def test_backend_takes_an_explicit_config():
    """The triton backend function takes ``config=`` (else the current settings); sparse tables follow its tiles."""
    from attn_zoo import AttentionSpec, softmax_attention_reference
    from attn_zoo.backends.triton_flash import sparse_tables, triton_softmax_attention
    from kernels import FlashConfig

    spec = AttentionSpec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=16)
    q, k, v, _ = _inputs(N=64, seed=6)
    cfg = FlashConfig(sparse_fwd=(16, 16, 4, 1), sparse_dkdv=(16, 16, 4, 1), dq_mode="atomic")
    out = triton_softmax_attention(q, k, v, spec, config=cfg)
    torch.testing.assert_close(out, softmax_attention_reference(q, k, v, spec), rtol=1e-5, atol=1e-5)
    small = sparse_tables(spec, 64, 64, 16, q.device, cfg)[1]
    default = sparse_tables(spec, 64, 64, 16, q.device)[1]
    assert small[0].shape[0] == 4 and default[0].shape[0] != small[0].shape[0]  # 64 / 16 query tiles


def test_linear_config_settings_and_launch_record():
    from kernels.linear import LinearConfig, current_linear_config, linear_attention, linear_settings, \
        query_segment_len, record_launches

    a = LinearConfig()
    assert a == LinearConfig() and hash(a) == hash(LinearConfig()) and current_linear_config() == a
    t = LinearConfig(tiles={"seg_fwd": [(0, 32, 4, 1, 0)]})
    assert t.tiles == (("seg_fwd", ((0, 32, 4, 1, 0),)),) and hash(t) == hash(LinearConfig(tiles=t.tiles))
    for bad in (dict(tiles={"seg_nope": [(0, 32, 4, 1)]}), dict(tiles={"seg_fwd": []}), dict(progs_per_sm=0),
                dict(lowp_bf16=1), dict(tiles={"seg_fwd": [(0, 32)]})):
        with pytest.raises(ValueError):
            LinearConfig(**bad)
    # tile entries: refused at construction naming the entry and the allowed values (were truncated by int() or
    # failed inside the launch: tl.arange / tl.dot take powers of two >= 16)
    for bad, msg in ((dict(tiles={"seg_fwd": [(0, 24, 4, 1)]}), r"BV=24.*0 .*power of two >= 16"),
                     (dict(tiles={"seg_fwd": [(-32, 32, 4, 1)]}), r"BK=-32"),
                     (dict(tiles={"seg_dq": [(32, 0, 4, 1, 24)]}), r"chunk=24"),
                     (dict(tiles={"seg_fwd": [(16.7, 32, 4, 1)]}), r"BK=16.7"),
                     (dict(tiles={"seg_fwd": [(0, 32, 3, 1)]}), r"num_warps=3"),
                     (dict(tiles={"seg_fwd": [(0, 32, 4, 0)]}), r"num_stages=0"),
                     (dict(tiles=[("seg_fwd",)]), r"tiles.*dict"), (dict(tiles="seg_fwd"), r"tiles.*dict")):
        with pytest.raises(ValueError, match=msg):
            LinearConfig(**bad)
    q, k, v, do = _inputs(Hq=2, Hkv=1, N=48, seed=7)
    base = _grads(lambda x, y, z: linear_attention(x, y, z, feature_map="elu1", chunk_size=16), q, k, v, do)
    with linear_settings(t) as cfg, record_launches() as rec:
        assert current_linear_config() is cfg
        got = _grads(lambda x, y, z: linear_attention(x, y, z, feature_map="elu1", chunk_size=16), q, k, v, do)
    assert current_linear_config() == a
    assert rec.kernels["seg_fwd"][0] == (0, 32, 4, 1, 0) and "seg_dkdv" in rec.kernels
    for x, y in zip(got, base):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert query_segment_len(1, 2, 48, 16, 16, 16, torch.float32, q.device) >= 16
    with pytest.raises(TypeError, match="LinearConfig"):
        linear_attention(q, k, v, config={"phi_in_loop": True})


def test_settings_under_torch_compile_fullgraph():
    """``torch.compile(fullgraph=True)`` traces through ``flash_attn`` with no config, an explicit config, call
    arguments and dilation (dynamo cannot trace ``ContextVar.get``: the settings are read once while tracing), with
    the eager results (``aot_eager``: no Inductor on the CPU)."""
    from kernels import FlashConfig, flash_attn, flash_settings

    q, k, v, do = _inputs(Hq=4, Hkv=2, seed=8)
    cfg = FlashConfig(dq_mode="atomic")
    calls = {
        "default": lambda a, b, c: flash_attn(a, b, c, causal=True),
        "config": lambda a, b, c: flash_attn(a, b, c, causal=True, config=cfg),
        "arguments": lambda a, b, c: flash_attn(a, b, c, causal=True, dkdv_split=2, dilation=2),
    }
    for name, fn in calls.items():
        torch._dynamo.reset()
        want = _grads(fn, q, k, v, do)
        with flash_settings(tma=False):  # read at trace time
            got = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), q, k, v, do)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
    torch._dynamo.reset()
