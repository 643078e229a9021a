"""The open backend registry: names, availability, supports() reasons, auto priorities, families, anchors, and a
backend registered from this test module timed by a sweep through ``plugins`` (no edit to ``eval/``)."""

import os

import pytest
import torch
import yaml

import attn_zoo
from attn_zoo import AttentionSpec, attention
from attn_zoo.functional import _DISPATCH
from attn_zoo.registry import (BACKENDS, available_backends, backend_names, backends_from, family, get_backends,
                               register_backend, unregister_backend)

CALLS = {"mine": 0}


def _mine_supports(q, k, v, spec, return_lse):
    return "mine returns no lse" if return_lse else None


@register_backend("flash", "mine", supports=_mine_supports, priority=None)
def mine(q, k, v, spec, return_lse=False):
    """A user's backend: counts its calls, computes with the reference."""
    CALLS["mine"] += 1
    return attention(q, k, v, spec, backend="reference")


def _qkv(N=16, D=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 2, N, D, generator=g).to(dtype), torch.randn(1, 1, N, D, generator=g).to(dtype),
            torch.randn(1, 1, N, D, generator=g).to(dtype))


def test_product_backends_keep_autos_order():
    for kind in ("flash", "sliding_window", "sparse", "dilated_window"):
        assert available_backends(kind) == list(BACKENDS), kind
    # linear: the Taylor map's fused parallel form (kernels/taylor.py) and fused chunked form (kernels/taylor_chunk.py)
    # sit between the chunked kernel and torch (auto_priority lifts them by length: tests/test_taylor_chunked.py)
    assert available_backends("linear") == ["triton", "parallel", "taylor_chunk", "torch", "reference"]
    lin = get_backends("linear")
    assert lin["parallel"].priority == 250 and lin["parallel"].devices == ("cuda",)
    assert lin["taylor_chunk"].priority == 240 and lin["taylor_chunk"].devices == ("cuda",)
    b = get_backends("flash")
    assert (b["triton"].priority, b["torch"].priority, b["reference"].priority) == (300, 200, 100)
    assert b["triton"].devices == ("cuda",) and b["torch"].devices is None
    q, k, v = _qkv()
    assert attn_zoo.resolve_backend(q, k, v, AttentionSpec(kind="flash")).name == "torch"  # off CUDA


def test_availability_under_a_faked_cuda(monkeypatch):
    """Runs just before the next test, which checks that this answer did not outlive the fake: the registry asks each
    backend's ``available()`` once per process, and ``tests/conftest.py`` forgets the answers after a test that fakes
    ``torch.cuda.is_available`` (before: ``sdpa_cudnn`` stayed available on a CPU machine for the rest of the
    session, and the anchors test below failed when it ran after ``tests/test_bench_model_check.py``)."""
    from attn_zoo import registry

    real = torch.cuda.is_available()
    b = get_backends("flash")["sdpa_cudnn"]
    # asked afresh, under the fake; popped for good (monkeypatch.delitem would put back an answer cached before this
    # test, and the next test could then pass without the reset)
    registry._AVAILABLE.pop((b.kind, b.name), None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: not real)
    assert (b.unavailable() is None) is (not real)


def test_availability_is_the_real_one_after_a_faked_cuda():
    why = get_backends("flash")["sdpa_cudnn"].unavailable()
    assert (why is None) is torch.cuda.is_available(), why


def test_anchors_are_registered_without_priority_and_degrade_cleanly():
    names = backend_names()
    for n in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "flex", "naive", "fa2", "fa3", "fla", "mine"):
        assert n in names, n
    assert [n for n in names if n in BACKENDS] == list(BACKENDS) and names[:5] == ["triton", "parallel",
                                                                                    "taylor_chunk", "torch",
                                                                                    "reference"]
    regs = get_backends("flash")
    assert all(regs[n].priority is None for n in ("sdpa_flash", "sdpa_cudnn", "flex", "naive", "fa2", "mine"))
    q, k, v = _qkv()
    spec = AttentionSpec(kind="flash")
    for n in ("sdpa_flash", "sdpa_cudnn", "fa2", "fa3"):  # CUDA-only / optional packages: a reason, never an exception
        if not torch.cuda.is_available():
            assert "not available here" in regs[n].why_not(q, k, v, spec)
    ref = attention(q, k, v, spec, backend="reference")
    for n in ("sdpa_math", "flex", "naive"):
        torch.testing.assert_close(attention(q, k, v, spec, backend=n), ref, atol=1e-5, rtol=1e-5)
    assert "fla" in get_backends("linear") and "fla" not in regs
    why = get_backends("linear")["fla"].why_not(q, k, v, AttentionSpec(kind="linear"))
    assert why is None or isinstance(why, str)


def test_explicit_names_and_errors():
    q, k, v = _qkv()
    spec = AttentionSpec(kind="flash")
    n0 = CALLS["mine"]
    torch.testing.assert_close(attention(q, k, v, spec, backend="mine"), attention(q, k, v, spec, backend="reference"))
    assert CALLS["mine"] == n0 + 1
    with pytest.raises(ValueError, match=r"backend='nope' is not supported; allowed values: auto, triton, parallel, taylor_chunk, torch, "
                                         r"reference, .*sdpa_flash.*mine"):
        attention(q, k, v, spec, backend="nope")
    with pytest.raises(ValueError, match="backend='mine' is not registered for kind='linear'; available: triton"):
        attention(q, k, v, AttentionSpec(kind="linear"), backend="mine")
    with pytest.raises(ValueError, match="backend='mine' cannot run this input for kind='flash': mine returns no lse"):
        attention(q, k, v, spec, backend="mine", return_lse=True)
    with pytest.raises(ValueError, match="must be a non-empty string"):
        register_backend("flash", "auto")
    with pytest.raises(ValueError, match="kinds must be kind names"):
        register_backend(None, "x")


def test_priority_availability_and_the_dispatch_cache():
    q, k, v = _qkv()
    spec = AttentionSpec(kind="flash")
    attention(q, k, v, spec)
    assert _DISPATCH
    calls = []
    register_backend("flash", "eager_first", priority=250,
                     fn=lambda q, k, v, spec, return_lse=False: calls.append(1) or attention(q, k, v, spec, "torch"))
    try:
        assert not _DISPATCH, "registering clears the remembered decisions"
        assert attn_zoo.resolve_backend(q, k, v, spec).name == "eager_first"
        attention(q, k, v, spec)
        assert calls == [1]
        assert available_backends("flash") == ["triton", "eager_first", "torch", "reference"]
        register_backend("flash", "eager_first", priority=250, available=lambda: "its package is missing",
                         fn=lambda *a, **kw: None)
        assert attn_zoo.resolve_backend(q, k, v, spec).name == "torch"  # auto skips an unavailable backend
        with pytest.raises(ValueError, match=r"no backend supports .*eager_first: not available here \(its package"):
            _raise_all_refuse(q, k, v)
        with pytest.raises(ValueError, match=r"cannot run this input .*not available here \(its package is missing\)"):
            attention(q, k, v, spec, backend="eager_first")
    finally:
        unregister_backend("flash", "eager_first")
    assert attn_zoo.resolve_backend(q, k, v, spec).name == "torch"


def _raise_all_refuse(q, k, v):
    """auto with every backend refusing: the error lists each one's reason."""
    spec = AttentionSpec(kind="flash")
    saved = {n: get_backends("flash")[n] for n in ("torch", "reference")}
    try:
        for n in saved:
            register_backend("flash", n, supports=lambda *a: "refused in this test", fn=saved[n].fn)
        attn_zoo.resolve_backend(q, k, v, spec)
    finally:
        for n in saved:
            unregister_backend("flash", n)  # the family-level torch / reference serve flash again


@pytest.fixture
def toy_variant():
    """A softmax variant registered by a test: the family's backends serve it with no other registration."""
    from attn_zoo import variants

    variants.register_variant("toy_even", "softmax", mask=lambda spec, Nq, Nk: {"dilation": 2}, subquadratic=False)
    yield "toy_even"
    variants.unregister_variant("toy_even")


def test_a_new_variant_runs_on_the_family_backends(toy_variant):
    spec = AttentionSpec(kind=toy_variant)
    q, k, v = _qkv()
    ref = attention(q, k, v, spec, backend="reference")
    for n in ("torch", "naive", "flex"):
        torch.testing.assert_close(attention(q, k, v, spec, backend=n), ref, atol=1e-5, rtol=1e-5)
    assert attn_zoo.KINDS[-1] == "toy_even" and available_backends(toy_variant)[-2:] == ["torch", "reference"]
    seen = []
    register_backend(family("softmax"), "famwide", fn=lambda q, k, v, spec, return_lse=False: seen.append(spec.kind))
    try:
        attention(q, k, v, spec, backend="famwide")
        attention(q, k, v, AttentionSpec(kind="flash"), backend="famwide")
        assert seen == ["toy_even", "flash"]
    finally:
        unregister_backend(family("softmax"), "famwide")


# --------------------------------------------------------------------------------------------- sweeps
TINY = {
    "name": "reg", "device": "cpu", "dtype": "float32", "n_heads": 2, "tokens": 32, "seq_lens": [16, 32],
    "head_dims": [8], "causal": [True], "kv_heads": [None], "modes": ["fwd", "fwd_bwd"], "warmup": 0, "rep": 1,
    "variants": {"flash": {"kind": "flash"}, "dilated": {"kind": "dilated_window", "window_size": [3, 0], "dilation": 2}},
    "backends": ["torch", "naive"],
}


def test_a_plugin_backend_shows_up_in_a_sweep(tmp_path):
    from eval import sweep as sw

    assert backends_from([__name__]) == ["mine"]
    cfg = dict(TINY, plugins=[__name__])
    n0 = CALLS["mine"]
    rows = sw.run_sweep(cfg, str(tmp_path / "k.csv"), resume=False, progress=False)
    got = {(r["variant"], r["backend"], int(r["seq_len"])): r for r in rows}
    assert {b for _, b, _ in got} == {"torch", "naive", "mine"}
    for N in (16, 32):
        assert got[("flash", "mine", N)]["status"] == "ok" and float(got[("flash", "mine", N)]["fwd_ms"]) > 0
        assert got[("dilated", "mine", N)]["status"] == "unsupported"
        assert "not registered for kind 'dilated_window'" in got[("dilated", "mine", N)]["error"]
        assert got[("dilated", "torch", N)]["status"] == "ok" and got[("dilated", "naive", N)]["status"] == "ok"
    assert CALLS["mine"] > n0
    assert float(got[("dilated", "torch", 32)]["visited_fraction"]) < float(got[("flash", "torch", 32)]["visited_fraction"])
    # the plain-Python entry: --plugins, and `backends: all` = every registered backend
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, seq_lens=[16], variants={"flash": {"kind": "flash"}}, backends=["naive"],
                                        model_sweep={"enabled": False})))
    assert sw.main(["--config", str(path), "--out", str(tmp_path / "o"), "--plugins", __name__, "--no-progress"]) == 0
    rows = sw.read_rows(os.path.join(tmp_path, "o", "kernel.csv"))
    assert sorted(r["backend"] for r in rows) == ["mine", "naive"] and all(r["status"] == "ok" for r in rows)
    pts = sw.expand_points(dict(TINY, backends="all", seq_lens=[16]))
    assert {p["backend"] for p in pts} >= set(backend_names()) - {"mine"} | {"sdpa_cudnn", "fla"}


def test_bench_model_lists_backends_from_the_registry():
    from eval import bench_model as bm

    assert set(bm.default_backends()) >= {"triton", "torch", "sdpa_flash", "sdpa_cudnn"}
    assert bm.parse_list("torch,mine", backend_names(), "backends") == ["torch", "mine"]
    with pytest.raises(SystemExit, match=r"--backends: \['nope'\] not supported; allowed values: triton, parallel, taylor_chunk, torch"):
        bm.parse_list("nope", backend_names(), "backends")


def test_bench_flash_binds_registry_backends():
    """eval/bench_flash times registry backends: ours = triton (with its FlashConfig), the anchors, and the dense
    causal fallback of SDPA for masks it cannot express (CPU: interpreter / eager shapes)."""
    from attn_zoo.backends._triton import interpreting
    from eval import bench_flash as bf

    q, k, v = _qkv(N=32, D=16)
    spec = AttentionSpec(**bf.VARIANTS["win1024"])
    causal = attention(q, k, v, AttentionSpec(kind="flash"), backend="reference")
    f = bf.make_impl("sdpa_math", "win1024", 32, 16, spec, inputs=(q, k, v))
    torch.testing.assert_close(f(q, k, v), causal, atol=1e-5, rtol=1e-5)  # dense causal: the window covers N=32
    dil = AttentionSpec(**bf.VARIANTS["dil512x2"])
    ref = attention(q, k, v, dil, backend="reference")
    torch.testing.assert_close(bf.make_impl("naive", "dil512x2", 32, 16, dil, inputs=(q, k, v))(q, k, v), ref,
                               atol=1e-5, rtol=1e-5)
    if interpreting():
        torch.testing.assert_close(bf.make_impl("ours", "dil512x2", 32, 16, dil, inputs=(q, k, v))(q, k, v), ref,
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="impl='nope' is not a backend of kind='flash'; allowed values: ours, triton"):
        bf.make_impl("nope", "causal", 32, 16, AttentionSpec(kind="flash"), inputs=(q, k, v))
    assert bf.visited_fraction("causal", 64) == 0.5 and 0 < bf.visited_fraction("dil512x2", 4096) < 0.11


def test_mask_derivations_are_not_traced_by_torch_compile(monkeypatch):
    """Under torch.compile a block-sparse call through the triton backend is one graph whose layout and block tables
    are inputs (derived_cache runs its function eagerly, once): traced, the BigBird mask code rebuilt them inside
    every compiled step, with a graph break at each .item(). The kernel sees the same layout object at every call
    (the Gluon table cache is keyed by it)."""
    import kernels.flash.autograd as A
    from attn_zoo.backends.triton_flash import triton_softmax_attention

    spec = AttentionSpec(kind="sparse", causal=True, block_size=16)
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    ex = torch._dynamo.explain(lambda a, b, c: triton_softmax_attention(a, b, c, spec))(q, k, v)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [str(r.reason)[:120] for r in ex.break_reasons[:3]]
    seen, fwd = [], A.flash_attn_fwd
    monkeypatch.setattr(A, "flash_attn_fwd", lambda *a, **kw: (seen.append(a[6]), fwd(*a, **kw))[1])
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, c: triton_softmax_attention(a, b, c, spec), backend="aot_eager")
    outs = [f(q, k, v) for _ in range(3)]
    assert len(seen) == 3 and all(t is seen[0] for t in seen) and seen[0].dtype == torch.int8
    torch.testing.assert_close(outs[-1], attention(q, k, v, spec, backend="reference"), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
