"""The Triton forward's longest-processing-time-first tile order (``kernels.flash.fwd.FWD_LPT``,
``kernels.flash.common._tile_schedule``): the grid map is a bijection in the order it claims, and a forward launched
in that order gives bitwise the outputs of the default order (each program computes the same tile; only which
program does it changes). CPU: the interpreter; GPU: the compiled kernels (the plan's kept launch included)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernels.flash as kf  # noqa: E402
from attn_zoo.reference import repeat_kv  # noqa: E402
from kernels import flash_attn  # noqa: E402
from kernels.flash import fwd as F  # noqa: E402
from kernels.flash.common import _tile_schedule  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _schedule_probe(Out, SECTION, LPT: tl.constexpr):
    rank, bh = _tile_schedule(SECTION, LPT)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(Out + pid * 2, rank)
    tl.store(Out + pid * 2 + 1, bh)


def _schedule(n_tiles, n_bh, section, lpt):
    out = torch.full((n_tiles * n_bh, 2), -1, dtype=torch.int32, device=DEVICE)
    _schedule_probe[(n_tiles, n_bh)](out, section, LPT=lpt)
    return [tuple(r) for r in out.cpu().tolist()]  # (rank, bh) by launch order


@pytest.mark.parametrize("n_tiles,n_bh,section", [(4, 5, 2), (3, 6, 3), (5, 4, 9), (1, 3, 1), (6, 1, 4)])
def test_lpt_schedule_is_a_bijection_heaviest_first_within_sections(n_tiles, n_bh, section):
    """Every (rank, bh) once; within each section of ``section`` heads (the last one narrower), all heads' rank r
    come before any rank r + 1; sections in order. LPT off: one head after another, rank 0 first."""
    got = _schedule(n_tiles, n_bh, section, True)
    assert sorted(got) == [(r, b) for r in range(n_tiles) for b in range(n_bh)]
    want = []
    for s0 in range(0, n_bh, section):
        heads = range(s0, min(s0 + section, n_bh))
        want += [(r, b) for r in range(n_tiles) for b in heads]
    assert got == want
    assert _schedule(n_tiles, n_bh, section, False) == [(r, b) for b in range(n_bh) for r in range(n_tiles)]


def test_lpt_section_sizes():
    """Heads per section from the K / V bytes: capped by the heads there are, at least one, GQA heads share."""
    assert F.LPT_SECTION_BYTES == 4 << 20
    assert F.lpt_section(256, 1024, 128, 128, 2, 1) == 8  # 512 KiB of K / V per head
    assert F.lpt_section(16, 4096, 128, 128, 2, 1) == 2
    assert F.lpt_section(16, 4096, 128, 128, 2, 4) == 8  # four query heads read one KV head
    assert F.lpt_section(4, 1 << 20, 256, 256, 4, 1) == 1
    assert F.lpt_section(3, 64, 16, 16, 4, 1) == 3


@pytest.mark.parametrize("causal,window,Hkv", [(True, None, 3), (False, None, 1), (True, (24, 0), 3)])
def test_lpt_forward_is_bitwise_the_default_order(monkeypatch, causal, window, Hkv):
    """B 2 x H 3 = 6 (batch, head) pairs in sections of 4 (the last one 2 wide), 3 query tiles of a causal / full /
    window problem (GQA in one): outputs and lse equal bitwise with and without LPT, and close to the reference;
    the plan records the order it launched."""
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    g = torch.Generator().manual_seed(3)
    B, H, N, D = 2, 3, 40 if DEVICE == "cpu" else 300, 32
    q = torch.randn(B, H, N, D, generator=g).to(DEVICE, dtype)
    k = torch.randn(B, Hkv, N, D, generator=g).to(DEVICE, dtype)
    v = torch.randn(B, Hkv, N, D, generator=g).to(DEVICE, dtype)
    cfg = kf.FlashConfig(fwd=(16, 16, 4, 1), fwd_impl="triton") if DEVICE == "cpu" else kf.FlashConfig(
        fwd_impl="triton")
    kw = dict(causal=causal, window_size=window, return_lse=True, config=cfg)
    base, base_lse = flash_attn(q, k, v, **kw)
    per_head = N * 2 * D * q.element_size() // (H // Hkv)
    monkeypatch.setattr(F, "FWD_LPT", True)
    monkeypatch.setattr(F, "LPT_SECTION_BYTES", 4 * per_head)
    assert F.lpt_section(B * H, N, D, D, q.element_size(), H // Hkv) == 4
    kf.clear_plans()
    out, lse = flash_attn(q, k, v, **kw)
    assert torch.equal(out, base) and torch.equal(lse, base_lse)
    assert [p.meta["fwd"]["LPT"] for key, p in kf.launch_plans().items() if key[0] == "fwd"] == [True]
    if cfg.fwd is None:  # the plan's kept launch, a second call
        out2, _ = flash_attn(q, k, v, **kw)
        assert torch.equal(out2, base)
    i, j = torch.arange(N, device=DEVICE)[:, None], torch.arange(N, device=DEVICE)[None, :]
    ok = (j <= i) if causal else torch.ones(N, N, dtype=torch.bool, device=DEVICE)
    if window:
        ok = ok & (j >= i - window[0])
    kr, vr = repeat_kv(k.float(), H // Hkv), repeat_kv(v.float(), H // Hkv)
    s = (q.float() @ kr.transpose(-1, -2) / D ** 0.5).masked_fill(~ok, float("-inf"))
    ref = torch.softmax(s, -1) @ vr
    assert (out.float() - ref).abs().max().item() < (2e-2 if dtype == torch.float16 else 1e-4)


def test_lpt_section_is_part_of_the_plan_key(monkeypatch):
    """The section is an int argument Triton may specialise on (== 1): a plan's kept launch fixes it, so another
    section for the same shapes builds another plan (else a section-1 launch would run for every later section)."""
    q, k, v = (torch.randn(1, 4, 32, 16).to(DEVICE) for _ in range(3))
    cfg = kf.FlashConfig(fwd=(16, 16, 4, 1), fwd_impl="triton")
    monkeypatch.setattr(F, "FWD_LPT", True)
    kf.clear_plans()
    keys = []
    for n_heads in (1, 2, 4, 2):
        monkeypatch.setattr(F, "LPT_SECTION_BYTES", n_heads * 32 * 2 * 16 * q.element_size())
        flash_attn(q, k, v, causal=True, config=cfg)
        keys.append(sorted(key for key in kf.launch_plans() if key[0] == "fwd"))
    assert [len(x) for x in keys] == [1, 2, 3, 3]
    assert [key[-1] for key in keys[-1]] == [1, 2, 4]
    monkeypatch.setattr(F, "FWD_LPT", False)  # without LPT the kernel ignores it: 1, one plan for every section
    flash_attn(q, k, v, causal=True, config=cfg)
    assert [key[-2:] for key in kf.launch_plans() if key[0] == "fwd" and key[-2] is False] == [(False, 1)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_lpt_forward_at_a_benchmark_shape(monkeypatch):
    """Causal, B 4 x H 16, N 1024, D 128, bf16 (TMA streaming, the tuned tile; two sections, 48 and 16 wide): bitwise the default
    order."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 16, 1024, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    cfg = kf.FlashConfig(fwd_impl="triton", tma=True)
    base = flash_attn(q, k, v, causal=True, config=cfg)
    monkeypatch.setattr(F, "FWD_LPT", True)
    monkeypatch.setattr(F, "LPT_SECTION_BYTES", 24 << 20)
    out = flash_attn(q, k, v, causal=True, config=cfg)
    out2 = flash_attn(q, k, v, causal=True, config=cfg)
    monkeypatch.setattr(F, "LPT_SECTION_BYTES", 512 << 10)  # section 1 (specialised), then 64 again: kept launches
    out3 = flash_attn(q, k, v, causal=True, config=cfg)
    monkeypatch.setattr(F, "LPT_SECTION_BYTES", 1 << 40)
    out4 = flash_attn(q, k, v, causal=True, config=cfg)
    assert all(torch.equal(o, base) for o in (out, out2, out3, out4))


@pytest.mark.parametrize("argv,flag", [(["--cases", ","], "--cases"), (["--cases", "causal1k,causal1k"], "--cases"),
                                       (["--cases", "bogus"], "--cases"), (["--rounds", "0"], "--rounds")])
def test_lpt_ab_refuses_bad_arguments_before_the_gpu(argv, flag, tmp_path):
    """``lab.lpt_ab``: an empty, repeated or unknown case, or no rounds, is refused by name before any GPU work."""
    from lab import lpt_ab

    with pytest.raises(SystemExit, match=f"^{flag} "):
        lpt_ab.main(["--out", str(tmp_path), *argv])
