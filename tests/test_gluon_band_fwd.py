"""Band masks on the Gluon forward (``_gl_fwd_ws3_kernel``, ``fwd_impl="gluon_ws3a" | "gluon_ws3b"``; the persistent
``_gl_fwd_ws3p_kernel``, ``"gluon_ws3p"``) and the Gluon
dQ kernel (``_gl_bwd_dq_kernel``, ``gluon_bwd_dq="gluon"``): sliding windows (left and / or right edge) and packed
documents (the table of :func:`kernels.flash.documents.document_table`), alone and together, on top of dense / causal.

CPU: the launchers' argument handling (``documents`` table checks) without a kernel. GPU (``-m gpu``, Hopper, triton
3.6): :func:`kernels.flash.gluon.gluon_flash_fwd`'s out and lse against an fp32 softmax over an explicit mask (and
the Triton forward on the same mask), :func:`kernels.flash.gluon.gluon_dq`'s dq against torch autograd's dq of that
reference, given the reference's ``lse2 = lse * log2(e)`` (``+inf`` on rows that see no key, as ``_bwd_preprocess``
makes them) and ``delta = rowsum(dO * O)``. Cases: windows (left only, left + causal, right only, both), documents
(causal and not, length-1 documents, skipped ids, boundaries inside tiles), windows with documents, ``Nq < Nk`` and
``Nq > Nk`` (rows that see no key: out 0, lse -inf, dq 0), ragged N, GQA / MQA, D 64 / 128, bf16 / fp16.

Accuracy rule (as tests/test_kernel_flash_gluon.py): max |kernel - ref| <= 2x the max error of plain PyTorch
attention in the inputs' dtype (dq: 3x), the fp32 reference as truth.
"""

import math

import pytest
import torch

from attn_zoo.reference import repeat_kv
from kernels import FlashConfig
from kernels.flash import gluon as G
from kernels.flash.documents import document_table

LOG2E = 1.4426950408889634


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = [pytest.mark.gpu, pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")]


def _qkv(B, Hq, Hkv, Nq, Nk, D, dtype, seed=0, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda h, n: torch.randn(B, h, n, D, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return mk(Hq, Nq), mk(Hkv, Nk), mk(Hkv, Nk), mk(Hq, Nq)


def _doc_ids(B, Nk, kind, seed=0, device="cuda"):
    """``(B, Nk)`` nondecreasing document ids, one layout per batch row. ``"mixed"``: random lengths 1..300
    (boundaries inside tiles, some length-1 documents) with skipped ids (empty documents); ``"tiny"``: many
    documents of length 1-3; ``"aligned:L"``: documents of L keys."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for b in range(B):
        if kind.startswith("aligned:"):
            L = int(kind.split(":")[1])
            rows.append(torch.arange(Nk) // L)
            continue
        hi = 4 if kind == "tiny" else 300
        ids, cur, n = [], 0, 0
        while n < Nk:
            length = 1 if torch.rand(1, generator=g).item() < 0.15 else int(torch.randint(1, hi, (1,), generator=g))
            length = min(length, Nk - n)
            ids += [cur] * length
            n += length
            cur += 1 + int(torch.randint(0, 3, (1,), generator=g))  # skipped ids: empty documents
        rows.append(torch.tensor(ids))
    return torch.stack(rows).to(device)


def _mask(B, Nq, Nk, wl, wr, doc_ids, device):
    """``(B, 1, Nq, Nk)`` bool: key j visible to query i (bottom-right: position ``a = i + Nk - Nq``) iff ``j <= a +
    wr`` (wr >= 0), ``j >= a - wl`` (wl >= 0), and with ``doc_ids`` both in one document (no document when a < 0)."""
    a = torch.arange(Nq, device=device)[:, None] + Nk - Nq
    j = torch.arange(Nk, device=device)[None, :]
    ok = torch.ones(Nq, Nk, dtype=torch.bool, device=device)
    if wr >= 0:
        ok &= j <= a + wr
    if wl >= 0:
        ok &= j >= a - wl
    ok = ok.expand(B, Nq, Nk)
    if doc_ids is not None:
        pos = a[:, 0]
        dq = doc_ids[:, pos.clamp(min=0)]  # (B, Nq)
        same = (dq[:, :, None] == doc_ids[:, None, :]) & (pos >= 0)[None, :, None]
        ok = ok & same
    return ok[:, None]


def _attn(q, k, v, mask, scale, dtype=None):
    """Softmax attention over ``mask`` in fp32 (``dtype=None``: returns out, lse) or as plain PyTorch computes it in
    ``dtype`` (scores and P @ V in the inputs' dtype, softmax in fp32): rows with no key give 0 (lse -inf)."""
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, rep), repeat_kv(v, rep)
    if dtype is None:
        q, k, v = q.float(), k.float(), v.float()
    s = (q @ k.transpose(-1, -2)) * scale
    empty = ~mask.any(-1, keepdim=True)  # rows that see no key: finite scores, P = 0 (no NaN in autograd either)
    s = torch.where(empty, torch.zeros_like(s), s.masked_fill(~mask, float("-inf"))).float()
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).masked_fill(~mask, 0.0)
    if dtype is not None:
        p = p.to(dtype)
    return p @ v, lse.masked_fill(empty[..., 0], float("-inf"))


# (name, B, Hq, Hkv, Nq, Nk, D, dtype, win_left, win_right, documents kind or None)
FWD_CASES = [
    ("left", 2, 8, 2, 1000, 1000, 64, torch.bfloat16, 100, -1, None),
    ("left_causal", 2, 4, 4, 1000, 1000, 128, torch.bfloat16, 255, 0, None),
    ("left_causal_tiles", 1, 4, 2, 2048, 2048, 128, torch.bfloat16, 1023, 0, None),
    ("right", 2, 4, 4, 777, 777, 64, torch.float16, -1, 200, None),
    ("both", 2, 8, 2, 1000, 1000, 128, torch.float16, 300, 50, None),
    ("both_narrow", 1, 4, 4, 500, 500, 64, torch.bfloat16, 5, 3, None),
    ("left_wide", 1, 4, 4, 1000, 1000, 128, torch.bfloat16, 4000, 0, None),
    ("window_nq_lt_nk", 2, 4, 1, 300, 1000, 128, torch.bfloat16, 128, 0, None),
    ("window_nq_gt_nk", 2, 4, 4, 1000, 333, 64, torch.float16, 64, 0, None),
    ("right_nq_gt_nk", 1, 4, 4, 700, 200, 128, torch.bfloat16, -1, 10, None),
    ("docs_causal", 2, 8, 2, 1000, 1000, 128, torch.bfloat16, -1, 0, "mixed"),
    ("docs_full", 2, 4, 4, 1000, 1000, 64, torch.bfloat16, -1, -1, "mixed"),
    ("docs_tiny", 2, 4, 4, 517, 517, 64, torch.float16, -1, 0, "tiny"),
    ("docs_aligned", 1, 4, 4, 2048, 2048, 128, torch.bfloat16, -1, 0, "aligned:512"),
    ("docs_nq_lt_nk", 2, 4, 2, 300, 1000, 128, torch.bfloat16, -1, 0, "mixed"),
    ("docs_nq_gt_nk", 2, 4, 4, 600, 400, 64, torch.bfloat16, -1, -1, "mixed"),
    ("window_docs", 2, 4, 2, 1000, 1000, 128, torch.bfloat16, 100, 0, "mixed"),
    ("both_docs", 1, 4, 4, 900, 900, 64, torch.float16, 64, 32, "mixed"),
    ("dense", 2, 8, 2, 1000, 1000, 128, torch.bfloat16, -1, -1, None),
    ("causal", 2, 4, 4, 1000, 1000, 64, torch.float16, -1, 0, None),
]
WS3B = {"left_causal", "both", "window_nq_gt_nk", "docs_causal", "docs_nq_gt_nk", "window_docs"}


def _case_args(case, seed=0):
    name, B, Hq, Hkv, Nq, Nk, D, dtype, wl, wr, docs = case
    q, k, v, do = _qkv(B, Hq, Hkv, Nq, Nk, D, dtype, seed=seed)
    doc_ids = None if docs is None else _doc_ids(B, Nk, docs, seed=seed)
    table = None if doc_ids is None else document_table(doc_ids, Nq)
    mask = _mask(B, Nq, Nk, wl, wr, doc_ids, q.device)
    return q, k, v, do, table, mask, D ** -0.5


@pytest.mark.parametrize("impl,case", [("gluon_ws3a", c) for c in FWD_CASES]
                         + [("gluon_ws3b", c) for c in FWD_CASES if c[0] in WS3B]
                         + [("gluon_ws3p", c) for c in FWD_CASES], ids=lambda x: x if isinstance(
                             x, str) else x[0])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_band_forward_matches_reference(impl, case):
    """out within 2x plain PyTorch's error of the fp32 masked softmax; lse close, -inf exactly on the rows that see
    no key (their out 0); no NaN; the Triton forward on the same mask agrees within the same bound."""
    from kernels.flash.fwd import flash_attn_fwd

    name, B, Hq, Hkv, Nq, Nk, D, dtype, wl, wr, docs = case
    q, k, v, _, table, mask, scale = _case_args(case)
    out, lse = G.gluon_flash_fwd(q, k, v, scale, wl, wr, impl, documents=table)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, Hq, Nq) and lse.dtype == torch.float32
    ref, ref_lse = _attn(q, k, v, mask, scale)
    plain, _ = _attn(q, k, v, mask, scale, dtype=dtype)
    bound = 2 * (plain.float() - ref).abs().max().item() + 1e-5
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    err = (out.float() - ref).abs().max().item()
    assert err <= bound, (name, err, bound)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if not finite.all():
        assert out[~finite[..., None].expand_as(out)].abs().max() == 0
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    if name in ("window_nq_gt_nk", "right_nq_gt_nk", "docs_nq_gt_nk"):
        assert not finite.all()  # the case does cover rows that see no key
    tri, tri_lse = flash_attn_fwd(q, k, v, scale, wl, wr, config=FlashConfig(fwd_impl="triton"), documents=table)
    assert (out.float() - tri.float()).abs().max().item() <= bound
    torch.testing.assert_close(lse, tri_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("programs,sec,schedule", [(3, 3, "static"), (None, None, "static"), (None, 3, "static"),
                                                   (3, 3, "dynamic"), (None, None, "dynamic")])
@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: c[0])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_persistent_forward_equals_ws3a(monkeypatch, case, programs, sec, schedule):
    """The persistent forward (``gluon_ws3p``) runs ws3a's per-tile arithmetic: out and lse bit for bit equal to
    ``gluon_ws3a``'s, with 3 programs (each walks dozens of work items: the K / V ring phases and the Q buffer's
    hand-over across items, items that see no key mixed in) and with one program per SM; with the default sections
    (every head of these small cases in one) and with sections of 3 heads (the last one partial); with the static
    snake and the dynamic schedule (items claimed from a counter; two calls in a row: the counter is zeroed per
    launch)."""
    name, B, Hq, Hkv, Nq, Nk, D, dtype, wl, wr, docs = case
    monkeypatch.setattr(G, "PERSISTENT_PROGRAMS", programs)
    monkeypatch.setattr(G, "PERSISTENT_SCHEDULE", schedule)
    if sec is not None:
        monkeypatch.setattr(G, "PERSISTENT_SECTION_BYTES", sec * 2 * Nk * D * 2 * Hkv // Hq)
    assert G.persistent_section(Hq, Hkv, Nk, D, 2, B * Hq) == (B * Hq if sec is None else min(sec, B * Hq))
    q, k, v, _, table, mask, scale = _case_args(case, seed=1)
    out_a, lse_a = G.gluon_flash_fwd(q, k, v, scale, wl, wr, "gluon_ws3a", documents=table)
    out_p, lse_p = G.gluon_flash_fwd(q, k, v, scale, wl, wr, "gluon_ws3p", documents=table)
    items = -(-Nq // 128) * B * Hq
    assert G.persistent_grid(items, q.device) == (min(items, programs) if programs else
                                                  min(items, G.sm_count(q.device)))
    assert torch.equal(out_p, out_a), (name, (out_p.float() - out_a.float()).abs().max().item())
    assert torch.equal(lse_p, lse_a), name
    again, lse_again = G.gluon_flash_fwd(q, k, v, scale, wl, wr, "gluon_ws3p", documents=table)
    assert torch.equal(again, out_a) and torch.equal(lse_again, lse_a), name


def test_persistent_section_sizes():
    """Heads per section: the section's K / V (2 * Nk * D * esz per K / V head, shared by its query heads) within
    PERSISTENT_SECTION_BYTES, at least 1, at most every head."""
    mib = 1 << 20
    assert G.PERSISTENT_SECTION_BYTES == 16 * mib
    assert G.persistent_section(16, 16, 1024, 128, 2, 256) == 32  # 512 KiB per head
    assert G.persistent_section(16, 16, 16384, 128, 2, 16) == 2  # 8 MiB per head
    assert G.persistent_section(16, 4, 16384, 128, 2, 16) == 8  # GQA 4:1: 2 MiB per query head
    assert G.persistent_section(16, 16, 65536, 128, 2, 16) == 1  # 32 MiB per head: one head
    assert G.persistent_section(8, 8, 1024, 128, 2, 8) == 8  # every head


def test_persistent_schedule_buffers_per_stream():
    """The dynamic schedule's counter and hand-over slots: one pair per (device, grid size, stream), reused by
    launches on one stream, never shared by two streams (which may run at once) or two grid sizes."""
    cpu = torch.device("cpu")
    a = G._schedule_buffers(cpu, 3, 11)
    assert a[0] is G._schedule_buffers(cpu, 3, 11)[0]
    assert a[0] is not G._schedule_buffers(cpu, 3, 12)[0] and a[0] is not G._schedule_buffers(cpu, 4, 11)[0]
    assert a[0].shape == (1,) and a[1].shape == (3,) and a[0].dtype == a[1].dtype == torch.int32


def test_persistent_schedule_knob(monkeypatch):
    """PERSISTENT_SCHEDULE: "dynamic" (the default) or "static"; anything else raises naming the knob and the allowed
    values, from gluon_flash_fwd before any GPU work (here on CPU tensors)."""
    assert G.PERSISTENT_SCHEDULE == "dynamic" and G.PERSISTENT_SCHEDULES == ("static", "dynamic")
    assert G.persistent_dynamic() is True
    monkeypatch.setattr(G, "PERSISTENT_SCHEDULE", "static")
    assert G.persistent_dynamic() is False
    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, torch.bfloat16, device="cpu")
    for bad in ("Dynamic", "greedy", None):
        monkeypatch.setattr(G, "PERSISTENT_SCHEDULE", bad)
        with pytest.raises(ValueError, match=r"PERSISTENT_SCHEDULE=.* is not supported; allowed values: 'static', "
                                             r"'dynamic'"):
            G.gluon_flash_fwd(q, k, v, 0.125, -1, 0, "gluon_ws3p")


def test_persistent_grid_knob(monkeypatch):
    """The persistent forward's grid: one program per SM by default, capped by the work items and by
    PERSISTENT_PROGRAMS; anything but None or an int >= 1 raises naming the knob and the allowed values."""
    monkeypatch.setattr(G, "sm_count", lambda device: 132)
    dev = torch.device("cpu")
    assert G.persistent_grid(1000, dev) == 132 and G.persistent_grid(7, dev) == 7 and G.persistent_grid(0, dev) == 1
    monkeypatch.setattr(G, "PERSISTENT_PROGRAMS", 3)
    assert G.persistent_grid(1000, dev) == 3 and G.persistent_grid(2, dev) == 2
    for bad in (0, -1, True, 2.0, "4"):
        monkeypatch.setattr(G, "PERSISTENT_PROGRAMS", bad)
        with pytest.raises(ValueError, match=r"PERSISTENT_PROGRAMS=.* is not supported; allowed values: None \(one "
                                             r"program per SM\) or an int >= 1"):
            G.persistent_grid(10, dev)


DQ_CASES = [c for c in FWD_CASES if c[0] in {
    "left", "left_causal", "right", "both", "window_nq_lt_nk", "window_nq_gt_nk", "docs_causal", "docs_tiny",
    "docs_nq_gt_nk", "window_docs", "both_docs", "causal"}]


@pytest.mark.parametrize("case", DQ_CASES, ids=lambda c: c[0])
@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (sm_90) GPU")
def test_gpu_band_dq_matches_autograd(case):
    """gluon_dq with the reference's lse2 / delta: dq within 3x plain PyTorch's error of autograd's dq of the fp32
    masked softmax; rows that see no key get dq = 0; no NaN."""
    name, B, Hq, Hkv, Nq, Nk, D, dtype, wl, wr, docs = case
    q, k, v, do, table, mask, scale = _case_args(case, seed=1)

    def dq_of(dt):
        qq = q.detach().to(torch.float32 if dt is None else dt).requires_grad_(True)
        out, lse = _attn(qq, k if dt else k.float(), v if dt else v.float(), mask, scale, dtype=dt)
        (out.float() * do.float()).sum().backward()
        return qq.grad.float(), out.detach().float(), lse.detach()

    ref_dq, ref_out, ref_lse = dq_of(None)
    plain_dq, _, _ = dq_of(dtype)
    lse2 = torch.where(torch.isfinite(ref_lse), ref_lse * LOG2E, torch.full_like(ref_lse, math.inf)).contiguous()
    delta = (do.float() * ref_out).sum(-1).contiguous()
    dq = torch.empty_like(q)
    G.gluon_dq(do, q, k, v, lse2, delta, dq, scale, wl, wr, documents=table)
    assert not torch.isnan(dq).any()
    bound = 3 * (plain_dq - ref_dq).abs().max().item() + 1e-4
    err = (dq.float() - ref_dq).abs().max().item()
    assert err <= bound, (name, err, bound)
    empty = ~torch.isfinite(ref_lse)
    if empty.any():
        assert dq[empty[..., None].expand_as(dq)].abs().max() == 0


# ----------------------------------------------------------------------------------------- CPU: the launchers


def test_band_args_pass_the_mask_and_check_the_table():
    """_band_args: windows clipped at 0 with HAS_LEFT / HAS_RIGHT from their sign, DOCS from the table; a cached
    placeholder without documents; a table of the wrong shape / dtype raises a ValueError naming documents."""
    doc, wl, wr, flags = G._band_args(-1, 0, None, 2, 16, 16, torch.device("cpu"))
    assert (wl, wr) == (0, 0) and flags == dict(HAS_LEFT=False, HAS_RIGHT=True, DOCS=False)
    assert doc.dtype == torch.int32 and doc is G._band_args(-1, -1, None, 1, 8, 8, torch.device("cpu"))[0]
    table = document_table(torch.tensor([[0] * 8 + [1] * 8] * 2), 16)
    doc, wl, wr, flags = G._band_args(7, -1, table, 2, 16, 16, torch.device("cpu"))
    assert doc is table and (wl, wr) == (7, 0) and flags == dict(HAS_LEFT=True, HAS_RIGHT=False, DOCS=True)
    for bad in (table[:1], table.long(), table[:, :-1]):
        with pytest.raises(ValueError, match=r"documents must be the contiguous int32 \(B, 3 \* Nq \+ 3 \* Nk\)"):
            G._band_args(-1, 0, bad, 2, 16, 16, torch.device("cpu"))


def test_band_bench_cases_count_the_kept_pairs():
    """lab/gluon_band_bench: case names parse (bad ones raise), and the visited-pair count is the explicit mask's."""
    from lab.gluon_band_bench import case_mask, parse_case

    assert parse_case("win1024@4096") == ("win", 1024, 4096) and parse_case("docs512@300") == ("docs", 512, 300)
    for bad in ("win@4096", "foo12@8", "docs12", "win0@8"):
        with pytest.raises(ValueError, match="allowed forms: winW@N, docsL@N"):
            parse_case(bad)
    for kind, length, N in (("win", 7, 50), ("win", 64, 40), ("docs", 16, 50), ("docs", 100, 50)):
        wl, wr, doc_ids, pairs = case_mask(kind, length, N, 2, "cpu")
        assert wr == 0 and (doc_ids is None) == (kind == "win")
        mask = _mask(2, N, N, wl, wr, doc_ids, "cpu")
        assert pairs == int(mask[0].sum()) == int(mask[1].sum())
