"""``kernels.flash.resolve_fwd_tma`` / ``resolve_bwd_tma``: whether the kernels of a ``flash_attn`` call stream their
operands by TMA descriptors, as their launches decide (``FlashConfig.tma``; ``"auto"``: Hopper and
``tma_min_pairs`` visited pairs; the Gluon kernels always), and ``eval.bench_flash``'s rows that record it
(``fwd_tma``, ``bwd_dkdv_tma``, ``bwd_dq_tma``).

CPU: the interpreter's launches (``FlashConfig(tma=True)`` forces TMA there) against the launch plans they leave, and
the ``"auto"`` rule on a faked Hopper device (stand-in tensors: the rule reads device, shape, dtype, strides)."""

import itertools
import os
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels.flash as kf  # noqa: E402
from attn_zoo import AttentionSpec, mask_info  # noqa: E402
from kernels import FlashConfig, flash_attn  # noqa: E402
from kernels.flash import gluon as G  # noqa: E402
from kernels.flash import launch as L  # noqa: E402

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's launches (CPU session)")


def _plan_tma():
    """``(fwd, dkdv, dq)`` TMA of the launch plans made since :func:`kernels.flash.clear_plans` (dq: ``False`` with
    the atomic dQ, which launches no dQ kernel)."""
    fwd = [p.meta["fwd"]["TMA"] for key, p in kf.launch_plans().items() if key[0] == "fwd"]
    bwd = [p.meta for key, p in kf.launch_plans().items() if key[0] == "bwd"]
    assert len(fwd) == 1 and len(bwd) == 1, list(kf.launch_plans())
    return fwd[0], bwd[0]["dkdv"]["TMA"], bwd[0]["dq"]["TMA"] and not bwd[0]["atomic"]


def _qkv(Nq, Nk, D=32, H=2, odd_kv=False):
    g = torch.Generator().manual_seed(Nq * 7 + Nk)
    q = torch.randn(1, H, Nq, D, generator=g)
    if odd_kv:  # rows of D + 1 floats: strides that are not 16-byte multiples (pointer loads only)
        k, v = (torch.randn(1, H, Nk, D + 1, generator=g)[..., :D] for _ in range(2))
    else:
        k, v = (torch.randn(1, H, Nk, D, generator=g) for _ in range(2))
    return q, k, v


MASKS = {"dense": dict(causal=False), "causal": dict(causal=True), "window": dict(causal=True, window_size=(5, 0)),
         "sparse": None}
CONFIGS = {"default": FlashConfig(), "tma": FlashConfig(tma=True), "no_tma": FlashConfig(tma=False),
           "tma_atomic_dq": FlashConfig(tma=True, dq_mode="atomic")}


@cpu_only
@pytest.mark.parametrize("mask, cfg, shape", [
    *itertools.product(MASKS, CONFIGS, ["square"]),
    *itertools.product(["causal", "window"], ["tma"], ["more_queries", "odd_kv", "d24"]),
])
def test_resolved_tma_is_what_the_launches_use(mask, cfg, shape):
    """The resolved flags equal the ``TMA`` constexprs of the forward / dK/dV / dQ launch plans a forward and backward
    through ``flash_attn`` leave, for dense / causal / window / block-sparse masks, ``tma`` "auto" (off the GPU:
    never), ``True``, ``False`` and the atomic dQ, more queries than keys, K / V whose strides TMA cannot take (the
    dK/dV pass streams Q / dO and keeps it) and a head dim that is not a power of two."""
    Nq, Nk = {"more_queries": (40, 24)}.get(shape, (32, 32))
    D = 24 if shape == "d24" else 32
    q, k, v = _qkv(Nq, Nk, D, odd_kv=shape == "odd_kv")
    config = CONFIGS[cfg]
    if mask == "sparse":
        mi = mask_info(AttentionSpec(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=16), Nq, Nk)
        kw = dict(causal=True, block_layout=mi.layout, block_size=mi.block_size)
        call = dict(kw, block_table_fn=mi.block_table)
    else:
        kw = call = MASKS[mask]
    kf.clear_plans()
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out = flash_attn(*leaves, config=config, **call)
    out.backward(torch.randn_like(out))
    want = _plan_tma()
    got = (kf.resolve_fwd_tma(config, q, k, v, **kw), *kf.resolve_bwd_tma(config, q, k, v, **kw))
    assert got == want
    if cfg == "tma" and shape == "square":
        assert got == (True, True, True)  # forced: also the block-sparse mask ("auto" never takes it)
    if cfg in ("default", "no_tma"):
        assert got == (False, False, False)
    if shape == "odd_kv":
        assert got == (False, True, False)  # the forward and dQ stream K / V, the dK/dV pass Q / dO
    if cfg == "tma_atomic_dq":
        assert got == (True, True, False)


def _fake(B, H, N, D, dtype=torch.bfloat16):
    """A stand-in of a ``(B, H, N, D)`` CUDA tensor (device, shape, dtype, strides; no memory)."""
    t = torch.empty(B, H, N, D, dtype=dtype, device="meta")
    return SimpleNamespace(shape=t.shape, dtype=dtype, device=torch.device("cuda", 0), is_cuda=True, stride=t.stride,
                           element_size=t.element_size, data_ptr=lambda: 0)


@pytest.fixture
def hopper(monkeypatch):
    """A faked Hopper device for the TMA rule (compute capability 9, no interpreter) and for the Gluon choices
    (``hopper.gluon(True)``: Hopper and Gluon's API there; off at first)."""
    monkeypatch.setattr(L, "INTERPRET", False)
    monkeypatch.setitem(L._CAPABILITY, torch.device("cuda", 0), 9)
    monkeypatch.setattr(G, "INTERPRET", False)

    def gluon(on):
        monkeypatch.setattr(G, "_hopper", lambda device: on)
        monkeypatch.setattr(G, "gluon_available", lambda: on)
        monkeypatch.setattr(G, "gluon_bwd_available", lambda D=None: on)

    gluon(False)
    return SimpleNamespace(gluon=gluon)


def test_auto_follows_tma_min_pairs_on_hopper(hopper):
    """``"auto"`` on Hopper: TMA from ``tma_min_pairs`` visited pairs, counted as the launches count them
    (``visited_pairs``): a causal call with more queries than keys counts the triangle its last rows see (before,
    about one pair per row: 128 heads x 4096 rows stayed far below 2^26)."""
    q, k, v = _fake(1, 128, 4096, 128), _fake(1, 128, 1024, 128), _fake(1, 128, 1024, 128)
    pairs = kf.visited_pairs(1, 128, 4096, 1024, -1, 0)
    assert pairs == 128 * 1024 * 1025 // 2 >= FlashConfig().tma_min_pairs
    for cfg, want in ((FlashConfig(), True), (FlashConfig(tma_min_pairs=pairs), True),
                      (FlashConfig(tma_min_pairs=pairs + 1), False), (FlashConfig(tma=False), False),
                      (FlashConfig(dq_mode="atomic"), True)):
        assert kf.resolve_fwd_impl(cfg, q, k, v, causal=True) == "triton"
        assert kf.resolve_fwd_tma(cfg, q, k, v, causal=True) is want, cfg
        dq = want and cfg.dq_mode != "atomic"
        assert kf.resolve_bwd_tma(cfg, q, k, v, causal=True) == (want, dq), cfg
    small = _fake(1, 2, 64, 128)
    assert kf.resolve_fwd_tma(None, small, small, small, causal=True) is False  # the current settings: "auto"
    assert kf.resolve_bwd_tma(None, small, small, small, causal=True) == (False, False)


def test_launch_tma_constexpr_is_what_resolve_fwd_tma_reports(hopper):
    """``"auto"`` on Hopper: the Triton forward launch's own ``TMA`` constexpr (what ``flash_attn_fwd`` builds) is what
    :func:`kernels.flash.resolve_fwd_tma` reports, for dense, dilated, document, causal and window masks at D 64 and
    128 (all large: TMA); ``tma=False`` turns both off."""
    from kernels.flash.fwd import _fwd_meta
    big = lambda D: [_fake(2, 16, 4096, D) for _ in range(3)]  # noqa: E731  (5.4e8 pairs >> 2^26)
    docs = torch.zeros(2, 4096, dtype=torch.int32)
    cases = (((-1, -1, 1, False), dict(causal=False)), ((-1, -1, 2, False), dict(dilation=2)),
             ((-1, -1, 1, True), dict(doc_ids=docs)), ((-1, 0, 1, False), dict(causal=True)),
             ((512, 512, 1, False), dict(window_size=(512, 512))))
    for cfg, want in ((FlashConfig(), True), (FlashConfig(tma=False), False)):
        for (wl, wr, dil, has_docs), kw in cases:
            for qkv in (big(64), big(128)):
                assert kf.resolve_fwd_impl(cfg, *qkv, **kw) == "triton", kw
                launch = _fwd_meta(*qkv, wl, wr, None, 0, dil, cfg, has_docs)["TMA"]
                assert launch is kf.resolve_fwd_tma(cfg, *qkv, **kw) is want, (kw, qkv[0].shape)


def test_tma_builds_at_small_head_dims_take_the_pointer_tiles(monkeypatch):
    """The TMA tile tables were tuned at D 128: a TMA build at a padded head dim below ``_TMA_TILES_MIN_D`` (128)
    takes the pointer loads' tiles (the dense D 64 forward ran 0.83-0.86x with the TMA tile on an H100, 0.99-1.00x
    with TMA and the pointer tile), from it the TMA ones. Distinct stand-in tables, since the interpreter's are one."""
    assert L._TMA_TILES_MIN_D == 128
    for d in (16, 32, 64):  # the real tables: a TMA forward at D <= 64 takes the pointer forward's tile
        for masked in (False, True):
            assert (L.pick_config("fwd", d, False, "tf32", masked=masked, tma=True)
                    == L.pick_config("fwd", d, False, "tf32", masked=masked, tma=False)), (d, masked)
    pointer, tma = {("fwd", False): (L._cfg(128, 64, 8, 3),)}, {("fwd", False): (L._cfg(128, 64, 4, 2),)}
    monkeypatch.setattr(L, "_HEURISTIC", pointer)
    monkeypatch.setattr(L, "_HEURISTIC_TMA", tma)
    monkeypatch.setattr(L, "_HEURISTIC_SMALL_D", {})
    warps = lambda d, t: L.pick_config("fwd", d, False, "tf32", tma=t)["num_warps"]  # noqa: E731
    assert [warps(d, True) for d in (16, 32, 64, 128, 256)] == [8, 8, 8, 4, 4]
    assert [warps(d, False) for d in (16, 32, 64, 128, 256)] == [8, 8, 8, 8, 8]


def test_gluon_kernels_resolve_to_tma(hopper):
    """The Gluon forward and the Gluon backward's dK/dV kernel read by TMA only (at any ``tma_min_pairs`` when asked
    by name); the Gluon backward's dQ by TMA for ``gluon_bwd_dq="gluon"`` / ``"tma"``, by the Triton dQ kernel's rule
    for ``"triton"`` (what ``"auto"`` runs at D 64), never for ``"atomic"``."""
    hopper.gluon(True)
    big = lambda D: (_fake(2, 8, 6000, D), _fake(2, 8, 6000, D), _fake(2, 8, 6000, D))  # noqa: E731
    q, k, v = big(128)
    assert kf.resolve_fwd_impl(FlashConfig(), q, k, v, causal=True) == "gluon_ws3p"
    assert kf.resolve_fwd_tma(FlashConfig(), q, k, v, causal=True) is True
    never = FlashConfig(fwd_impl="gluon_ws3a", tma_min_pairs=1 << 60)
    assert kf.resolve_fwd_tma(never, q, k, v, causal=True) is True
    assert kf.resolve_fwd_tma(never.replace(fwd_impl="triton"), q, k, v, causal=True) is False
    assert kf.resolve_bwd_impl(FlashConfig(), q, k, v, causal=True) == "gluon"
    assert kf.resolve_bwd_tma(FlashConfig(), q, k, v, causal=True) == (True, True)  # D 128: the Gluon dQ
    q64 = big(64)
    assert kf.resolve_bwd_tma(FlashConfig(), *q64, causal=True) == (True, True)  # D 64: the Triton dQ, with TMA
    assert kf.resolve_bwd_tma(FlashConfig(tma_min_pairs=1 << 60), *q64, causal=True) == (True, False)
    for dq, want in (("atomic", False), ("tma", True), ("gluon", True), ("triton", True)):
        cfg = FlashConfig(bwd_impl="gluon", gluon_bwd_dq=dq, gluon_bwd_consumers=1 if dq == "atomic" else 2)
        assert kf.resolve_bwd_tma(cfg, q, k, v, causal=True) == (True, want), dq
    hopper.gluon(False)  # the same calls on a GPU without Gluon's Hopper API: the Triton kernels, by their rule
    assert kf.resolve_fwd_tma(FlashConfig(), q, k, v, causal=True) is True
    assert kf.resolve_bwd_impl(FlashConfig(), q, k, v, causal=True) == "triton"
    assert kf.resolve_bwd_tma(FlashConfig(tma=False), q, k, v, causal=True) == (False, False)


@pytest.mark.parametrize("impls", [{}, dict(fwd_impl="triton", bwd_impl="triton"),
                                   dict(fwd_impl="gluon_ws3a", bwd_impl="gluon")], ids=["auto", "triton", "gluon"])
@pytest.mark.parametrize("bad, match", [(dict(dilation=0), "dilation"), (dict(window_size=(-2, 0)), "window_size"),
                                        (dict(causal="yes"), "causal")])
def test_resolvers_refuse_malformed_mask_arguments_with_any_impl(impls, bad, match):
    """Every resolver refuses the mask arguments ``flash_attn`` refuses, also where the config names its kernels (an
    explicit ``fwd_impl`` / ``bwd_impl`` once returned before the checks: ``resolve_fwd_tma`` answered ``dilation=0``
    where ``resolve_bwd_tma`` refused it)."""
    q, k, v = _qkv(8, 8)
    config = FlashConfig(**impls)
    for resolve in (kf.resolve_fwd_impl, kf.resolve_bwd_impl, kf.resolve_fwd_tma, kf.resolve_bwd_tma):
        with pytest.raises(ValueError, match=match):
            resolve(config, q, k, v, **bad)


def test_resolvers_refuse_what_flash_attn_refuses():
    q, k, v = _qkv(8, 8)
    with pytest.raises(ValueError, match="dilation"):
        kf.resolve_fwd_tma(None, q, k, v, dilation=0)
    with pytest.raises(ValueError, match="dilation"):
        kf.resolve_bwd_tma(None, q, k, v, dilation=0)
    with pytest.raises(ValueError, match="window_size"):
        kf.resolve_bwd_tma(None, q, k, v, window_size=(-2, 0))
    with pytest.raises(TypeError, match="config must be a kernels.FlashConfig"):
        kf.resolve_fwd_tma("tma", q, k, v)


# ----------------------------------------------------------------------------------------------- eval.bench_flash


def _bench_on_cpu(monkeypatch):
    """``eval.bench_flash``'s cases on the CPU: float32 inputs (the interpreter refuses bf16), 2 heads, fake timers."""
    from eval import bench_flash as bf

    monkeypatch.setattr(bf, "DEVICE", "cpu")
    monkeypatch.setattr(bf, "DTYPE", torch.float32)
    monkeypatch.setattr(bf, "heads", lambda name, D, hidden=2048: (2, 2))
    monkeypatch.setattr(bf, "time_cuda", lambda fn, grad_to_none=None, **_: (fn(), 1.0)[1])
    monkeypatch.setattr(bf, "peak_memory", lambda fn: (fn(), 2**20)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)


def _bench_rows(monkeypatch, config, fwd_only=False):
    """bench_case on the CPU (causal, N 32, D 32, 2 heads, float32, fake timers): ours and the torch backend; returns
    impl -> row."""
    from eval import bench_flash as bf

    _bench_on_cpu(monkeypatch)
    kf.clear_plans()
    rows = []
    res = bf.bench_case("causal", 32, 32, ["ours", "torch"], 32, False, rows, [0], config=config, fwd_only=fwd_only)
    assert len(rows) == 2 and all("error" not in r for r in rows), rows
    return res


@cpu_only
@pytest.mark.parametrize("tma", [True, "auto"])
def test_bench_flash_rows_record_tma(monkeypatch, tma):
    """Ours' rows say whether its forward, dK/dV pass and dQ streamed by TMA (what its launches used: the plans it
    left); the anchors' rows have no such fields; ``--fwd-only`` rows only the forward's."""
    from eval import bench_flash as bf

    res = _bench_rows(monkeypatch, FlashConfig(tma=tma))
    fwd, dkdv, dq = _plan_tma()
    ours = res["ours"]
    assert (ours["fwd_tma"], ours["bwd_dkdv_tma"], ours["bwd_dq_tma"]) == (fwd, dkdv, dq) == (tma is True,) * 3
    assert ours["fwd_impl"] == ours["bwd_impl"] == "triton"
    assert not {"fwd_tma", "bwd_dkdv_tma", "bwd_dq_tma"} & set(res["torch"])
    spec = AttentionSpec(**bf.VARIANTS["causal"])
    q = torch.empty(1, 2, 32, 32)
    assert bf.ours_tma("ours", spec, q, q, q, FlashConfig(tma=tma)) == {
        "fwd_tma": tma is True, "bwd_dkdv_tma": tma is True, "bwd_dq_tma": tma is True}
    res = _bench_rows(monkeypatch, FlashConfig(tma=tma), fwd_only=True)
    assert res["ours"]["fwd_tma"] is (tma is True) and "bwd_dkdv_tma" not in res["ours"]
    assert "bwd_dq_tma" not in res["ours"] and "bwd_impl" not in res["ours"]


@cpu_only
def test_ours_no_tma_is_the_same_call_without_tma(monkeypatch):
    """``ours_no_tma`` (the pair that times ``tma_min_pairs`` in one process) runs the given config with the Triton
    kernels' TMA off, whatever the config says, and its row says so; its output is ours'."""
    from eval import bench_flash as bf

    assert bf.ours_config("ours_no_tma", FlashConfig(tma=True)) == FlashConfig(tma=False)
    assert bf.ours_config("ours_no_tma").replace(tma="auto") == bf.ours_config("ours")
    _bench_on_cpu(monkeypatch)
    rows = []
    res = bf.bench_case("causal", 32, 32, ["ours", "ours_no_tma"], 32, True, rows, [0], config=FlashConfig(tma=True))
    assert all("error" not in r for r in rows), rows
    got = {i: (r["fwd_tma"], r["bwd_dkdv_tma"], r["bwd_dq_tma"]) for i, r in res.items()}
    assert got == {"ours": (True, True, True), "ours_no_tma": (False, False, False)}


@cpu_only  # a good width runs on into require_cuda, which stops it only off the GPU
def test_bench_flash_hidden_sets_the_heads_and_refuses_what_does_not_divide(monkeypatch, capsys):
    """``--hidden``: ``H = hidden // D`` query heads (GQA a quarter of them as K / V heads), passed to every case
    (no module state: a direct ``bench_case`` call keeps the default width); a width that is not a multiple of every
    head dim (of 4 head dims with ``gqa4``) is refused before any GPU work, naming the argument, and a head dim < 1
    or a list that is not integers names ``--D``."""
    from eval import bench_flash as bf

    assert bf.heads("causal", 64, 1024) == (16, 16) and bf.heads("gqa4", 64, 1024) == (16, 4)
    assert bf.heads("mqa", 128, 1024) == (8, 1) and bf.heads("causal", 64) == (32, 32)
    assert bf.case_setup("causal", 64, 64, 128, hidden=1024)[1:3] == (16, 16)
    for argv in (["--hidden", "1000", "--D", "64"], ["--hidden", "128", "--D", "64", "--variants", "gqa4"]):
        with pytest.raises(SystemExit, match=r"--hidden .* is not supported with --D \[64\]; allowed values"):
            bf.main(argv)
    with pytest.raises(SystemExit) as e:  # argparse's own error (exit 2), naming the flag
        bf.main(["--hidden", "0", "--D", "64"])
    assert e.value.code == 2 and "argument --hidden: 0: must be an integer >= 1" in capsys.readouterr().err
    for argv in (["--hidden", "1024", "--D", "0"], ["--D", "64,x"]):
        with pytest.raises(SystemExit, match=r"--D .*(>= 1|integers)"):
            bf.main(argv)
    seen = []
    monkeypatch.setattr(bf, "require_cuda", lambda name: None)
    monkeypatch.setattr(bf, "bench_case", lambda *a, **kw: seen.append(a[-1]) or {})
    monkeypatch.setattr(bf, "write_results", lambda *a, **kw: None)
    for argv, want in ((["--hidden", "1024"], 1024), ([], 2048)):  # each main() passes its own width
        seen.clear()
        bf.main(argv + ["--D", "64", "--N", "512", "--variants", "causal", "--impls", "ours"])
        assert seen == [want], (argv, seen)


def test_ours_no_tma_on_hopper_keeps_the_triton_forward(hopper):
    """On Hopper ``ours_no_tma`` is not ``ours`` less TMA alone: ``tma=False`` also keeps ``fwd_impl="auto"`` off the
    Gluon forward (which reads by TMA only), while the backward's choice ignores ``tma`` and its Gluon kernels still
    read by TMA. The rows say so (``fwd_impl``, ``fwd_tma``, ``bwd_impl``, ``bwd_dkdv_tma``)."""
    from eval import bench_flash as bf

    hopper.gluon(True)
    q = k = v = _fake(2, 8, 6000, 128)
    spec = AttentionSpec(**bf.VARIANTS["causal"])
    assert bf.ours_fwd_impl("ours", spec, q, k, v) == "gluon_ws3p"
    assert bf.ours_fwd_impl("ours_no_tma", spec, q, k, v) == "triton"
    assert bf.ours_bwd_impl("ours", spec, q, k, v) == bf.ours_bwd_impl("ours_no_tma", spec, q, k, v) == "gluon"
    assert bf.ours_tma("ours", spec, q, k, v) == dict(fwd_tma=True, bwd_dkdv_tma=True, bwd_dq_tma=True)
    assert bf.ours_tma("ours_no_tma", spec, q, k, v) == dict(fwd_tma=False, bwd_dkdv_tma=True, bwd_dq_tma=True)
    hopper.gluon(False)  # where "auto" runs the Triton kernels, the pair differs in TMA alone
    assert bf.ours_fwd_impl("ours_no_tma", spec, q, k, v) == bf.ours_fwd_impl("ours", spec, q, k, v) == "triton"
    assert bf.ours_tma("ours", spec, q, k, v) == dict(fwd_tma=True, bwd_dkdv_tma=True, bwd_dq_tma=True)
    assert bf.ours_tma("ours_no_tma", spec, q, k, v) == dict(fwd_tma=False, bwd_dkdv_tma=False, bwd_dq_tma=False)
