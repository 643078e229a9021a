"""The FA4-generation anchors (``fa4``, ``flex_fa4``) and the ``fla`` anchor of the linear family.

CPU (no flash-attn-4 / fla here): they are registered without a priority, ``auto`` never picks them, and an explicit
request refuses naming the package and the pyproject extra (``attention()``, ``train.py attention_backend=``,
``eval.bench_model --backends``, the sweep's ``unsupported`` row). GPU (marked ``gpu``): each against the reference
on the shapes the H200 run times; skipped where the package is missing, unless ``ATTN_ZOO_REQUIRE_FA4=1`` (then a
missing package fails the test).
"""

import os

import pytest
import torch

import attn_zoo
from attn_zoo import AttentionSpec, attention, make_spec
from attn_zoo.backends import torch_anchors
from attn_zoo.registry import available_backends, backend_names, get_backends

NEW = ("fa4", "flex_fa4")


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAVE_FA4 = _installed("flash_attn.cute")
HAVE_FLA = _installed("fla")


def _qkv(N=32, D=16, H=2, Hkv=2, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, h, N, D, generator=g).to(device=device, dtype=dtype) for h in (H, Hkv, Hkv))


def test_fa4_anchors_are_registered_for_every_softmax_kind_and_never_picked_by_auto():
    names = backend_names()
    for n in NEW:
        assert n in names
        for kind in ("flash", "sliding_window", "sparse", "dilated_window"):
            b = get_backends(kind)[n]
            assert b.priority is None, (n, kind)
            assert n not in available_backends(kind)
    assert "fa4" not in get_backends("linear") and "flex_fa4" not in get_backends("linear")
    assert "fla" in get_backends("linear") and get_backends("linear")["fla"].priority is None
    q, k, v = _qkv()
    for kind in ("flash", "sliding_window"):
        spec = make_spec(kind=kind, causal=True, **({"window_size": (7, 0)} if kind == "sliding_window" else {}))
        assert attn_zoo.resolve_backend(q, k, v, spec).name == "torch"  # auto on the CPU: never an anchor


@pytest.mark.skipif(HAVE_FA4, reason="flash-attn-4 is installed here")
@pytest.mark.parametrize("name", NEW)
def test_missing_fa4_is_refused_naming_the_package_and_the_extra(name):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=rf"backend='{name}' cannot run this input for kind='flash': not available "
                                         r"here \(flash_attn\.cute\.flash_attn_func cannot be imported .*install "
                                         r"flash-attn-4 .*pip install -e \.\[fa4\]"):
        attention(q, k, v, AttentionSpec(kind="flash", causal=True), backend=name)


@pytest.mark.skipif(HAVE_FLA, reason="fla is installed here")
def test_missing_fla_is_refused_naming_the_package_and_the_extra():
    q, k, v = _qkv()
    for fmap in ("elu1", "taylor"):
        with pytest.raises(ValueError, match=r"backend='fla' .*install flash-linear-attention \(fla-core\): "
                                             r"pip install -e \.\[fla\]"):
            attention(q, k, v, make_spec(kind="linear", causal=True, feature_map=fmap), backend="fla")


def test_install_hint_names_each_optional_package():
    assert torch_anchors.install_hint("flash_attn.cute") == ("install flash-attn-4 (FlashAttention-4, CuTe DSL): "
                                                             "pip install -e .[fa4]")
    assert torch_anchors.install_hint("flash_attn") == "install flash-attn (FlashAttention-2): pip install -e .[fa2]"
    assert torch_anchors.install_hint("fla.ops.linear_attn").endswith("pip install -e .[fla]")
    assert torch_anchors.install_hint("numpy") == ""
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for module, (_, extra) in torch_anchors.INSTALL.items():  # every extra a hint names exists
        assert extra is None or extra in extras, module
    assert any(r.startswith("flash-attn-4") for r in extras["fa4"]) and any(r.startswith("fla") for r in extras["fla"])


def test_a_namespace_package_without_the_function_is_not_available(monkeypatch, tmp_path):
    """The FA4 wheel alone makes ``flash_attn`` a namespace package: importable, without ``flash_attn_func`` (the
    FA2 anchor must not claim it)."""
    (tmp_path / "fake_ns_pkg").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    why = torch_anchors._importable("fake_ns_pkg", "flash_attn_func")()
    assert why is not None and "fake_ns_pkg.flash_attn_func cannot be imported (AttributeError" in why
    assert torch_anchors._importable("fake_ns_pkg")() is None


def test_supports_reasons_without_running_a_kernel():
    """The reasons the sweep records as ``unsupported`` (read straight from ``supports``: no package needed)."""
    fa4, ffa4 = get_backends("flash")["fa4"], get_backends("flash")["flex_fa4"]
    q, k, v = _qkv()
    spec = AttentionSpec(kind="flash", causal=True)
    assert fa4.supports(q, k, v, spec, False) == "needs CUDA tensors"
    assert "CUDA" in ffa4.supports(q, k, v, spec, False)
    assert "lse" in fa4.supports(q, k, v, spec, True) and "lse" in ffa4.supports(q, k, v, spec, True)
    sparse = make_spec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=16)
    meta = [t.to("meta") for t in _qkv(dtype=torch.bfloat16)]

    class _Cuda:  # a stand-in with is_cuda=True: supports() reads attributes only
        def __init__(self, t):
            self.t = t
            self.is_cuda, self.dtype, self.shape = True, t.dtype, t.shape

    qc, kc, vc = (_Cuda(t) for t in meta)
    assert "block layout" in get_backends("sparse")["fa4"].supports(qc, kc, vc, sparse, False)
    assert "float32" in fa4.supports(*(_Cuda(t.to(torch.float32)) for t in meta), spec, False)
    odd = [_Cuda(torch.empty(1, 2, 32, 12, dtype=torch.bfloat16, device="meta")) for _ in range(3)]
    assert "D % 8 == 0" in fa4.supports(*odd, spec, False)
    lin = make_spec(kind="linear", causal=False)
    assert "causal" in get_backends("linear")["fla"].supports(qc, kc, vc, lin, False)
    big = [_Cuda(torch.empty(1, 2, 32, 256, dtype=torch.bfloat16, device="meta")) for _ in range(3)]
    assert "up to 128" in get_backends("linear")["fla"].supports(*big, make_spec(kind="linear", causal=True,
                                                                                 feature_map="taylor"), False)


@pytest.mark.skipif(HAVE_FA4, reason="flash-attn-4 is installed here")
def test_train_refuses_a_missing_fa4_before_anything_is_written():
    import train

    with pytest.raises(ValueError, match=r"attention_backend='fa4' is not installed here: .*pip install -e \.\[fa4\]"):
        train.check_attention_backend("fa4", [AttentionSpec(kind="flash", causal=True)])
    train.check_attention_backend("naive", [AttentionSpec(kind="flash", causal=True)])  # installed anchors pass


@pytest.mark.skipif(HAVE_FA4, reason="flash-attn-4 is installed here")
def test_sweep_records_a_missing_anchor_as_unsupported_with_the_install_hint(tmp_path):
    from eval.sweep import run_sweep

    cfg = {"name": "t", "device": "cpu", "dtype": "float32", "n_heads": 2, "tokens": 32, "seq_lens": [16],
           "head_dims": [8], "causal": [True], "modes": ["fwd"], "warmup": 0, "rep": 1,
           "variants": {"flash": {"kind": "flash", "causal": True}}, "backends": ["fa4", "flex_fa4", "naive"]}
    rows = {r["backend"]: r for r in run_sweep(cfg, str(tmp_path / "k.csv"), resume=False, progress=False)}
    for n in NEW:
        assert rows[n]["status"] == "unsupported" and "pip install -e .[fa4]" in rows[n]["error"], rows[n]
    assert rows["naive"]["status"] == "ok"


def test_bench_model_refuses_a_named_backend_whose_package_is_missing(tmp_path):
    """``eval.bench_model --backends X``: X's package missing is refused before any GPU work, naming the package and
    the extra (it used to be skipped in silence: no row, no message); one that only lacks a GPU, or serves none of
    the benched kinds, is not refused for it."""
    from attn_zoo.registry import register_backend, unregister_backend
    from eval import bench_model as bm

    why = "fakepkg.attn cannot be imported (ModuleNotFoundError: No module named 'fakepkg'); install fake: pip install -e .[fake]"
    register_backend("flash", "fake_anchor", fn=lambda q, k, v, spec, return_lse=False: q, priority=None,
                     available=lambda: why)
    register_backend("flash", "gpu_only_anchor", fn=lambda q, k, v, spec, return_lse=False: q, priority=None,
                     available=lambda: "no CUDA device")
    try:
        assert bm.not_installed(["triton", "fake_anchor", "gpu_only_anchor"], {"flash"}) == [f"fake_anchor: {why}"]
        assert bm.not_installed(["fake_anchor"], {"linear"}) == []  # not a backend of the benched kinds
        with pytest.raises(SystemExit, match=r"--backends: not installed here: fake_anchor: .*pip install -e \.\[fake\]"):
            bm.main(["--out", str(tmp_path), "--backends", "triton,fake_anchor", "--variants", "flash,linear",
                     "--sizes", "small", "--seq-lens", "64"])
    finally:
        unregister_backend("flash", "fake_anchor")
        unregister_backend("flash", "gpu_only_anchor")
    if not HAVE_FA4:  # the real anchors on this machine
        assert [m.split(":")[0] for m in bm.not_installed(["fa4", "flex_fa4", "naive"], {"flash"})] == list(NEW)
        with pytest.raises(SystemExit, match=r"fa4: .*install flash-attn-4 .*pip install -e \.\[fa4\]"):
            bm.main(["--out", str(tmp_path), "--backends", "fa4", "--variants", "flash", "--sizes", "small"])
    assert not list(tmp_path.iterdir())  # refused before anything was written


# --------------------------------------------------------------------------------------------- GPU
def _need(have: bool, what: str):
    if have:
        return
    if os.environ.get("ATTN_ZOO_REQUIRE_FA4") == "1":
        pytest.fail(f"ATTN_ZOO_REQUIRE_FA4=1 but {what} is not importable (. lab/gpu_env.sh installs it)")
    pytest.skip(f"{what} is not installed")


GPU_CASES = [  # (kind, spec kwargs, Hkv, D)
    ("causal", dict(kind="flash", causal=True), 4, 128),
    ("full", dict(kind="flash", causal=False), 4, 128),
    ("gqa", dict(kind="flash", causal=True), 1, 128),
    ("d64", dict(kind="flash", causal=True), 4, 64),
    ("window", dict(kind="sliding_window", causal=True, window_size=(255, 0)), 4, 128),
]


def _check(name, spec, Hkv, D, N=1024, backward=True):
    q, k, v = (t.requires_grad_(True) for t in _qkv(N=N, D=D, H=4, Hkv=Hkv, dtype=torch.bfloat16, device="cuda"))
    out = attention(q, k, v, spec, backend=name)
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    ref = attention(q32, k32, v32, spec, backend="reference")
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    if backward:
        g = torch.randn_like(ref)
        gq, gk, gv = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
        rq, rk, rv = torch.autograd.grad(ref, (q32, k32, v32), g)
        for a, b in ((gq, rq), (gk, rk), (gv, rv)):
            assert (a.float() - b).abs().max() <= 5e-2 * max(1.0, b.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_fa4_matches_the_reference_on_gpu(case):
    _need(HAVE_FA4, "flash_attn.cute (flash-attn-4)")
    _, kw, Hkv, D = case
    _check("fa4", make_spec(**kw), Hkv, D)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES + [("bigbird", dict(kind="sparse", causal=True, sparse_pattern="bigbird",
                                                                block_size=128, num_local_blocks=1,
                                                                num_global_blocks=1, num_random_blocks=2), 4, 128)],
                         ids=[c[0] for c in GPU_CASES] + ["bigbird"])
def test_flex_fa4_matches_the_reference_on_gpu(case):
    _need(HAVE_FA4, "flash_attn.cute (flash-attn-4)")
    _, kw, Hkv, D = case
    _check("flex_fa4", make_spec(**kw), Hkv, D)


@pytest.mark.gpu
@pytest.mark.parametrize("fmap", ["elu1", "taylor"])
def test_fla_matches_the_reference_on_gpu(fmap):
    _need(HAVE_FLA, "fla (fla-core)")
    D = 16 if fmap == "taylor" else 64
    _check("fla", make_spec(kind="linear", causal=True, feature_map=fmap, chunk_size=64), 4, D, N=512)
