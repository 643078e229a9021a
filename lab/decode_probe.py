"""Probe (lab: not installed): which decode-kernel settings reach the copy bandwidth at batch 1-4, long contexts
and small pages (issue "Best against best", item 3). One process, bf16, D 128, one new token (and Nq 4), CUDA-graph
replays; every row beside SDPA over the same contiguous cache and the device copy bandwidth of the same run.

    python -m lab.decode_probe --out results/h200/<date>/decode_probe [--budget-s 240]
    python -m lab.decode_probe --matrix --out results/h200/<date>/decode_matrix [--budget-s 150]
    python -m lab.decode_probe --compare --out results/h200/<date>/decode_compare [--budget-s 300]

Grid per case: block_n x num_splits (the default, x2, x4) x num_warps x num_stages. Writes decode_probe.csv (every
row) and prints, per case, the default settings' fraction of copy bandwidth, the best one and SDPA's.

``--matrix`` (issue 29 item 3, at the default settings, through the plan / run split): batch 1 at 16k / 64k / 128k
and batch 4 at 16k / 64k context, MHA 32:32 and GQA 32:8, contiguous and paged (page 16 / 32 / 256, shuffled pages),
Nq 1 / 4 / 8 new queries (causal among them). Per case: ``ours`` = :func:`kernels.decode.decode_run` of one
:func:`kernels.decode.decode_plan` (CUDA-graph replay), ``sdpa`` = ``F.scaled_dot_product_attention`` over the same
keys as one contiguous tensor (paged: gathered once, outside the timing; Nq > 1: a bottom-right causal bool
mask), both as fractions of the copy bandwidth of the same run, and ``err`` the max abs difference of the two
outputs. Writes decode_matrix.csv / .json; stops at ``--budget-s`` (what was measured is written).

``--compare`` (issue 29 item 3, the plan options of 2026-12-04): SDPA, the old defaults and the new ones on the
issue's cases (batch 1 / 4 at 16k-128k, MHA and GQA, contiguous and pages of 16 / 32, Nq 4), then variants of the
new plan; see :func:`compare`. Writes decode_compare.csv / .json and a summary table.

``--compare --set gqa`` (2026-12-04, the fused merge vectorised over a program's rows): on GQA batch 4 at 16k
(contiguous, pages of 16 / 32), GQA batch 1 at 64k (contiguous, Nq 4, pages of 16), GQA 64:8 at 128k and MHA batch
1 at 16k as a control: SDPA, ``old`` (``merge="kernel", split_rule="legacy"``: the multi-row default before), ``new``
(the ``"auto"`` plan: fused merge + waves split), then the fused plan with the legacy split count, twice the new
split count, 128-key tiles and a 168-register cap. One GPU call of about 200 s:

    python -m lab.decode_probe --compare --set gqa --calls-per-graph 10 --budget-s 190 --out DIR

``--compare --set final`` (issue 29's decode targets in one run): the 18 cases of ``--compare`` (the ``pdl`` set's:
batch 1 / 4, 16k-128k, MHA and GQA, contiguous and pages of 16 / 32, Nq 2 / 4 / 8 contiguous, Nq 4 on pages of 16)
plus Nq 8 on pages of 16; per case SDPA, the default plan (``new``) and ``deep`` (half its split count, 4 stages);
the summary ends with ``deep`` against ``new``. 57 timings, the ``pdl`` set's 72 fit 190 s:

    python -m lab.decode_probe --compare --set final --calls-per-graph 10 --budget-s 170 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import torch
import torch.nn.functional as F

from eval.bench_common import env_info, int_list, time_cuda_graph, write_csv, write_json
from eval.bench_decode import copy_bandwidth, kv_bytes_per_step, make_cache
from kernels.decode import _sm_count, decode_attn, decode_block_n, decode_num_splits, decode_plan, decode_run

# --matrix: (B, context) x heads (Hq, Hkv) x page size (None = contiguous) x Nq
MATRIX_SHAPES = [(1, 16384), (1, 65536), (1, 131072), (4, 16384), (4, 65536)]
MATRIX_HEADS = [(32, 32), (32, 8)]
MATRIX_PAGES = [None, 16, 32, 256]
MATRIX_NQ = [1, 4, 8]


def matrix(out: str, budget_s: float, gathers=("prefetch",), quick: bool = False, block_ns=(None,)) -> list:
    """The ``--matrix`` run (module docstring); returns the rows. ``gathers``: the plan's ``page_gather`` values
    (key / page / prefetch) timed on every paged case (one row each, column ``page_gather``); ``block_ns``: key tile
    sizes timed on every paged case (``None``: the plan's default; column ``block_n``); ``quick``: batch 1 at 64k
    and batch 4 at 16k, pages of 16 / 32 and contiguous, Nq 1 only. SDPA is timed once per case and Nq."""
    shapes = [(1, 65536), (4, 16384)] if quick else MATRIX_SHAPES
    pages = [None, 16, 32] if quick else MATRIX_PAGES
    nqs = [1] if quick else MATRIX_NQ
    from attn_zoo.decode import gather_kv

    t_end = time.time() + budget_s
    copy_gbps = copy_bandwidth()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s, {_sm_count(torch.device('cuda'))} SMs", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    D, dt = 128, torch.bfloat16
    done = False
    for B, ctx in shapes:
        for Hq, Hkv in MATRIX_HEADS:
            for ps in pages:
                if done or time.time() > t_end:
                    done = True
                    break
                k, v, bt, seq = make_cache(B, Hkv, ctx, D, dt, ps is not None, ps or 0, gen)
                kc, vc = (k, v) if bt is None else gather_kv(k, v, bt, ctx, seq)
                nbytes = kv_bytes_per_step(B, Hkv, ctx, D)
                sdpa_by_nq = {}
                for Nq, gather, bn in itertools.product(nqs, gathers if ps is not None else gathers[:1],
                                                        block_ns if ps is not None else block_ns[:1]):
                    if time.time() > t_end:
                        done = True
                        break
                    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=dt, generator=gen)
                    base = dict(B=B, Hq=Hq, Hkv=Hkv, context=ctx, page_size=ps or 0, Nq=Nq, page_gather=gather)
                    mask = None
                    if Nq > 1:
                        i = torch.arange(Nq, device="cuda").view(-1, 1) + ctx - Nq
                        mask = torch.arange(ctx, device="cuda").view(1, -1) <= i
                    try:
                        plan = decode_plan(q, k, v, bt, page_gather=gather, block_n=bn)
                        ms = time_cuda_graph(lambda: decode_run(plan, q, k, v, seq, bt))
                        o = decode_run(plan, q, k, v, seq, bt).clone()
                        if Nq not in sdpa_by_nq:
                            sdpa_by_nq[Nq] = time_cuda_graph(lambda: F.scaled_dot_product_attention(
                                q, kc, vc, attn_mask=mask, enable_gqa=Hq != Hkv))
                        sd_ms = sdpa_by_nq[Nq]
                        ref = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=Hq != Hkv)
                        err = float((o.float() - ref.float()).abs().max())
                    except Exception as e:  # noqa: BLE001 - record and go on
                        rows.append(dict(base, error=f"{type(e).__name__}: {str(e)[:100]}"))
                        print(base, "error", e, flush=True)
                        continue
                    fr = nbytes / (ms * 1e-3) / 1e9 / copy_gbps
                    sfr = nbytes / (sd_ms * 1e-3) / 1e9 / copy_gbps
                    rows.append(dict(base, block_n=plan.block_n, block_m=plan.block_m, num_splits=plan.num_splits,
                                     ms=ms, frac=fr, sdpa_ms=sd_ms, sdpa_frac=sfr, err=err))
                    print(f"B{B} {ctx // 1024:>4d}k {Hq}:{Hkv:<2d} page {ps or '-':>4} Nq {Nq} {gather:>8}: ours {fr:.2f} "
                          f"(S {plan.num_splits}, bn {plan.block_n})  sdpa {sfr:.2f}  err {err:.1e}", flush=True)
                del k, v, bt, kc, vc
                torch.cuda.empty_cache()
    if done:
        print("budget spent: stopped early", flush=True)
    write_csv(rows, os.path.join(out, "decode_matrix.csv"))
    write_json(rows, os.path.join(out, "decode_matrix.json"), env=dict(env_info(), copy_gbps=copy_gbps))
    return rows

# --compare: (name, B, Hq, Hkv, context, page_size or None, Nq), the cases of issue 29 item 3
_CONTIGUOUS_CASES = [  # shared by --compare and the probe's grid (CASES)
    ("mha_b1_16k", 1, 32, 32, 16384, None, 1),
    ("mha_b1_64k", 1, 32, 32, 65536, None, 1),
    ("gqa32:8_b1_64k", 1, 32, 8, 65536, None, 1),
    ("gqa64:8_b1_128k", 1, 64, 8, 131072, None, 1),
    ("mha_b4_16k", 4, 32, 32, 16384, None, 1),
]
COMPARE_CASES = _CONTIGUOUS_CASES + [
    ("gqa32:8_b4_16k", 4, 32, 8, 16384, None, 1),
    ("mha_b1_64k_page16", 1, 32, 32, 65536, 16, 1),
    ("gqa32:8_b1_64k_page16", 1, 32, 8, 65536, 16, 1),
    ("mha_b4_16k_page16", 4, 32, 32, 16384, 16, 1),
    ("gqa32:8_b4_16k_page16", 4, 32, 8, 16384, 16, 1),
    ("mha_b1_64k_page32", 1, 32, 32, 65536, 32, 1),
    ("gqa32:8_b1_64k_page32", 1, 32, 8, 65536, 32, 1),
    ("mha_b4_16k_page32", 4, 32, 32, 16384, 32, 1),
    ("gqa32:8_b4_16k_page32", 4, 32, 8, 16384, 32, 1),
    ("gqa32:8_b1_64k_nq4", 1, 32, 8, 65536, None, 4),
    ("gqa32:8_b1_64k_page16_nq4", 1, 32, 8, 65536, 16, 4),
    ("gqa32:8_b1_64k_nq2", 1, 32, 8, 65536, None, 2),  # speculative decoding, issue 29: Nq 2-8
    ("gqa32:8_b1_64k_nq8", 1, 32, 8, 65536, None, 8),
]
# --compare --set gqa (2026-12-04): the multi-row plans after the fused merge was vectorised over a program's rows
# ("auto" = fused merge + waves split for every plan) against the multi-row defaults before it (kernel / legacy)
GQA_CASES = [
    ("gqa32:8_b4_16k", 4, 32, 8, 16384, None, 1),
    ("gqa32:8_b1_64k", 1, 32, 8, 65536, None, 1),
    ("gqa32:8_b4_16k_page16", 4, 32, 8, 16384, 16, 1),
    ("gqa32:8_b4_16k_page32", 4, 32, 8, 16384, 32, 1),
    ("gqa32:8_b1_64k_nq4", 1, 32, 8, 65536, None, 4),
    ("mha_b1_16k", 1, 32, 32, 16384, None, 1),  # control: one row per program (merge path unchanged)
    ("gqa32:8_b1_64k_page16", 1, 32, 8, 65536, 16, 1),
    ("gqa64:8_b1_128k", 1, 64, 8, 131072, None, 1),
]
# "old": the "auto" plan of a multi-row program before 2026-12-04 (a second merge launch, two waves of SMs; with
# max_registers "auto", no register cap, as before); for the MHA control it is not its default
GQA_OLD = dict(merge="kernel", split_rule="legacy")
GQA_VARIANTS = [  # around the new plan; a string num_splits is resolved per case (see compare())
    ("S_legacy", dict(num_splits="legacy")),  # the fused merge with the old split count (2 programs per SM)
    ("S_x2", dict(num_splits="x2")),  # two waves of resident programs, shorter splits
    ("bn128_st2", dict(block_n=128, num_stages=2)),  # 128-key tiles (its own waves split count)
    ("regs_168", dict(max_registers=168)),  # the register cap of one-row plans (multi-row "auto": none)
]

# --compare --set gqa2: the merge and the split count apart (the first gqa run showed the fused merge at the old
# split count slower than the merge kernel at it, so the gain of "new" came from the waves split count)
GQA2_VARIANTS = [
    ("kernel_waves", dict(merge="kernel", split_rule="waves")),
    ("kernel_waves_bn128", dict(merge="kernel", split_rule="waves", block_n=128, num_stages=2)),
    ("kernel_S16", dict(merge="kernel", num_splits=16)),
    ("kernel_S24", dict(merge="kernel", num_splits=24)),
    ("fused_S4_st4", dict(merge="fused", num_splits=4, num_stages=4)),
    ("kernel_S4_st4", dict(merge="kernel", num_splits=4, num_stages=4)),
    ("fused_S6_st4", dict(merge="fused", num_splits=6, num_stages=4)),
    ("kernel_S8_st4", dict(merge="kernel", num_splits=8, num_stages=4)),
]

# --compare --set pdl: every case of --compare, the defaults with the merge kernel launched by programmatic dependent
# launch (multi-row plans) against the same plans without it
PDL_VARIANTS = [("no_pdl", dict(pdl=False))]

# --compare --set final: every decode case of issue 29 in one run -- the cases of --compare / "pdl" (Nq 2 / 4 / 8
# contiguous among them) plus 8 new queries over pages of 16 -- timing per case SDPA, the default plan and "deep":
# half the default split count with 4 pipeline stages (8 splits x 4 stages was the best of ours on GQA batch 4 / 16k
# and MHA batch 1 / 16k in the gqa2 run), so that one run says whether "deep" should become the default. No "old"
# plan; "deep" runs right after "new" in the case's own pass (a budget that runs out leaves whole cases).
FINAL_CASES = COMPARE_CASES + [
    ("gqa32:8_b1_64k_page16_nq8", 1, 32, 8, 65536, 16, 8),
]
FINAL_VARIANTS = [("deep", dict(num_splits="half", num_stages=4))]

# the plan settings timed by --compare: "old" = the defaults before 2026-12-04 (split count for two waves of SMs,
# a second merge launch, per-key page lookups in the tile's iteration, the compiler's register count; the kernel's
# split shares are balanced in both), "new" = the current defaults ("auto": fused merge and waves split for every
# plan since 2026-12-04; before, for one query row per program only); the variants run in a second pass when budget
# is left
COMPARE_OLD = dict(split_rule="legacy", merge="kernel", page_gather="key", max_registers=None)
COMPARE_VARIANTS = [
    ("new_bn128_st2", dict(block_n=128, num_stages=2)),
    ("new_st4", dict(num_stages=4)),
    ("new_kernel_merge", dict(merge="kernel")),
    ("new_legacy_split", dict(split_rule="legacy")),  # the fused merge with the legacy split count
    ("new_regs_free", dict(max_registers=None)),
    ("new_key_gather", dict(page_gather="key")),  # paged cases only
    ("new_splits_x3", "x3"),
    ("new_splits_x2", "x2"),
    ("new_splits_half", "half"),
]


_COMPARE_DEVICE, _COMPARE_DTYPE = "cuda", torch.bfloat16  # (a CPU dry run of the script's logic patches these)


# set name -> (case list, "old" plan options or None: no "old" row, variant list), by their names in this module
COMPARE_SETS = {"all": ("COMPARE_CASES", "COMPARE_OLD", "COMPARE_VARIANTS"),
                "gqa": ("GQA_CASES", "GQA_OLD", "GQA_VARIANTS"),
                "gqa2": ("GQA_CASES", "GQA_OLD", "GQA2_VARIANTS"),
                "pdl": ("COMPARE_CASES", "COMPARE_OLD", "PDL_VARIANTS"),
                "final": ("FINAL_CASES", None, "FINAL_VARIANTS")}
# sets whose variants run in the case's first pass, right after "new" (else: a second pass over the cases)
COMPARE_ONE_PASS = {"final"}
# sets whose summary ends with one variant against the default: (variant, "new")
COMPARE_VERSUS = {"final": ("deep", "new")}

_SPLIT_KEYS = {"x3": 3.0, "x2": 2.0, "half": 0.5}


def variant_opts(opts, base_splits=None, legacy_splits=None) -> dict:
    """The :func:`kernels.decode.decode_plan` options of a ``--compare`` variant: ``opts`` is a dict of plan options
    or a string alone (``num_splits`` with the other settings of the new plan). A string ``num_splits`` is resolved
    against the case: ``"x3"`` / ``"x2"`` / ``"half"`` of ``base_splits`` (the new plan's split count; ``"half"``
    rounds down, at least 1) or ``"legacy"`` (``legacy_splits``: a callable giving the legacy rule's count, called
    only then). ``ValueError`` naming ``num_splits`` for another string or a missing count."""
    if isinstance(opts, str):
        opts = dict(num_splits=opts)
    opts = dict(opts)
    key = opts.get("num_splits")
    if not isinstance(key, str):
        return opts
    if key == "legacy":
        if legacy_splits is None:
            raise ValueError("num_splits='legacy' needs the legacy split count (legacy_splits)")
        ns = legacy_splits()
    elif key in _SPLIT_KEYS:
        if base_splits is None:
            raise ValueError(f"num_splits={key!r} needs the new plan's split count (base_splits)")
        ns = int(base_splits * _SPLIT_KEYS[key])
    else:
        raise ValueError(f"num_splits={key!r} is not supported; allowed values: an int, "
                         f"{', '.join(repr(k) for k in [*_SPLIT_KEYS, 'legacy'])}")
    opts["num_splits"] = max(1, int(ns))
    return opts


def check_cases(cases, case_set: str) -> None:
    """``ValueError`` naming ``cases`` and the allowed names when a name in ``cases`` (``None``: all) is not a case of
    ``COMPARE_SETS[case_set]`` (a misspelt name ran nothing, or less, in silence)."""
    names = [c[0] for c in globals()[COMPARE_SETS[case_set][0]]]
    unknown = sorted(set(cases or ()) - set(names))
    if unknown:
        raise ValueError(f"cases: unknown name(s) {', '.join(unknown)} in the set {case_set!r}; allowed values: "
                         f"{', '.join(names)}")


def compare(out: str, budget_s: float, variants: bool = True, cases=None, calls: int = 1,
            case_set: str = "all") -> list:
    """The ``--compare`` run (issue 29 item 3): per case of ``COMPARE_CASES`` (or the names in ``cases``), SDPA over
    the same keys as one contiguous tensor (paged: gathered once, outside the timing; Nq > 1: a bottom-right causal
    bool mask), ``old`` and ``new`` plans (``COMPARE_OLD`` / the defaults), each a CUDA-graph replay of
    :func:`kernels.decode.decode_run`, as fractions of the copy bandwidth of the same run; then, budget permitting,
    the ``COMPARE_VARIANTS`` of the new plan on every case. Every row checks the output against SDPA (``err``: max
    abs difference), that the plan's output after the replays equals a fresh run (``replay_equal``: the fused
    merge's counter is reset by every replay) and that the arrival counter is back at 0 (``counter_zero``).
    ``calls``: calls captured back to back in each graph (:func:`eval.bench_common.time_cuda_graph`; 1: one call per
    graph, its launch included; more: the steady state of a decode step's layers; column ``calls_per_graph``). Writes
    decode_compare.csv / .json (what was measured when the budget ran out), prints one line per row and a summary:
    per case the fraction of copy bandwidth of every method (and its split count), the best of ours marked ``*``.

    ``case_set``: a key of ``COMPARE_SETS`` -- ``"all"`` (``COMPARE_CASES`` / ``COMPARE_OLD`` /
    ``COMPARE_VARIANTS``), ``"gqa"`` (``GQA_CASES`` / ``GQA_OLD`` / ``GQA_VARIANTS``: the multi-row plans of
    2026-12-04), ``"gqa2"``, ``"pdl"``, ``"final"`` (``FINAL_CASES``: SDPA, ``new`` and ``deep`` only, no ``old``;
    its variants run in the case's first pass, ``COMPARE_ONE_PASS``). A variant's options: :func:`variant_opts`.
    ``ValueError`` naming ``case_set`` for another value."""
    from attn_zoo.decode import gather_kv

    if case_set not in COMPARE_SETS:
        raise ValueError(f"case_set={case_set!r} is not supported; allowed values: {', '.join(COMPARE_SETS)}")
    case_list, old_opts, variant_list = (globals()[n] if n is not None else None for n in COMPARE_SETS[case_set])
    check_cases(cases, case_set)

    t_end = time.time() + budget_s
    copy_gbps = copy_bandwidth()
    sms = _sm_count(torch.device(_COMPARE_DEVICE))
    print(f"copy bandwidth {copy_gbps:.0f} GB/s, {sms} SMs", flush=True)
    todo = [c for c in case_list if cases is None or c[0] in cases]
    rows = []
    D, dt, dev = 128, _COMPARE_DTYPE, _COMPARE_DEVICE

    def one(case, method, opts, k, v, bt, seq, q, kc, vc, ref, nbytes, base_splits=None):
        name, B, Hq, Hkv, ctx, ps, Nq = case
        base = dict(case=name, B=B, Hq=Hq, Hkv=Hkv, context=ctx, page_size=ps or 0, Nq=Nq, method=method,
                    calls_per_graph=calls)
        try:
            opts = variant_opts(opts, base_splits, lambda: decode_plan(q, k, v, bt, split_rule="legacy").num_splits)
            plan = decode_plan(q, k, v, bt, **opts)
            o0 = decode_run(plan, q, k, v, seq, bt).clone()
            ms = time_cuda_graph(lambda: decode_run(plan, q, k, v, seq, bt), calls=calls)
            torch.cuda.synchronize()
            after = plan.out.clone()
            cz = bool((plan.counter == 0).all())
            err = float((o0.float() - ref.float()).abs().max())
        except Exception as e:  # noqa: BLE001 - record and go on
            rows.append(dict(base, error=f"{type(e).__name__}: {str(e)[:120]}"))
            print(name, method, "error", e, flush=True)
            return None
        fr = nbytes / (ms * 1e-3) / 1e9 / copy_gbps
        row = dict(base, block_n=plan.block_n, block_m=plan.block_m, num_splits=plan.num_splits,
                   num_stages=plan.num_stages, merge=plan.merge, split_rule=plan.split_rule,
                   page_gather=plan.page_gather if ps else "", max_registers=plan.max_registers,
                   programs=plan.num_splits * plan.B * plan.Hkv * plan.n_m, ms=ms, frac=fr, err=err,
                   replay_equal=bool(torch.equal(after, o0)), counter_zero=cz)
        rows.append(row)
        print(f"{name:28s} {method:18s} {fr:.3f}  (S {plan.num_splits}, bn {plan.block_n}, st {plan.num_stages}, "
              f"{plan.merge}, regs {plan.max_registers})  err {err:.1e}  replay_equal {row['replay_equal']}  "
              f"counter_zero {cz}", flush=True)
        return plan

    def setup(case):
        name, B, Hq, Hkv, ctx, ps, Nq = case
        gen = torch.Generator(device=dev).manual_seed(0)
        k, v, bt, seq = make_cache(B, Hkv, ctx, D, dt, ps is not None, ps or 0, gen)
        kc, vc = (k, v) if bt is None else gather_kv(k, v, bt, ctx, seq)
        q = torch.randn(B, Hq, Nq, D, device=dev, dtype=dt, generator=gen)
        mask = None
        if Nq > 1:
            i = torch.arange(Nq, device=dev).view(-1, 1) + ctx - Nq
            mask = torch.arange(ctx, device=dev).view(1, -1) <= i
        ref = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=Hq != Hkv)
        return k, v, bt, seq, q, kc, vc, mask, ref, kv_bytes_per_step(B, Hkv, ctx, D)

    def variants_of(case, k, v, bt, seq, q, kc, vc, ref, nbytes):
        for method, opts in variant_list:
            if time.time() > t_end:
                break
            if isinstance(opts, dict) and "page_gather" in opts and case[5] is None:
                continue
            if case_set == "all" and isinstance(opts, dict) and "max_registers" in opts and case[5] is None:
                continue  # contiguous kernels are under the cap already (lab/decode_pipeline_check.py)
            one(case, method, opts, k, v, bt, seq, q, kc, vc, ref, nbytes, new_splits[case[0]])

    one_pass = case_set in COMPARE_ONE_PASS
    new_splits = {}
    for case in todo:  # pass 1: SDPA, old, new (and the variants of a one-pass set)
        if time.time() > t_end:
            print("budget spent: stopped in pass 1", flush=True)
            break
        k, v, bt, seq, q, kc, vc, mask, ref, nbytes = setup(case)
        name, B, Hq, Hkv, ctx, ps, Nq = case
        ms = time_cuda_graph(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=Hq != Hkv),
                             calls=calls)
        fr = nbytes / (ms * 1e-3) / 1e9 / copy_gbps
        rows.append(dict(case=name, B=B, Hq=Hq, Hkv=Hkv, context=ctx, page_size=ps or 0, Nq=Nq, method="sdpa", ms=ms,
                         frac=fr, calls_per_graph=calls))
        print(f"{name:28s} {'sdpa':18s} {fr:.3f}", flush=True)
        if old_opts is not None:
            one(case, "old", old_opts, k, v, bt, seq, q, kc, vc, ref, nbytes)
        plan = one(case, "new", {}, k, v, bt, seq, q, kc, vc, ref, nbytes)
        if plan is not None:
            new_splits[case[0]] = plan.num_splits
            if one_pass and variants:
                variants_of(case, k, v, bt, seq, q, kc, vc, ref, nbytes)
        del k, v, bt, kc, vc, ref
        torch.cuda.empty_cache()
    for case in todo if variants and not one_pass else []:  # pass 2: variants of the new plan
        if time.time() > t_end or case[0] not in new_splits:
            continue
        k, v, bt, seq, q, kc, vc, mask, ref, nbytes = setup(case)
        variants_of(case, k, v, bt, seq, q, kc, vc, ref, nbytes)
        del k, v, bt, kc, vc, ref
        torch.cuda.empty_cache()
    if time.time() > t_end:
        print("budget spent", flush=True)
    write_csv(rows, os.path.join(out, "decode_compare.csv"))
    write_json(rows, os.path.join(out, "decode_compare.json"), env=dict(env_info(), copy_gbps=copy_gbps, sm_count=sms))
    print_compare_summary(rows, COMPARE_VERSUS.get(case_set))
    return rows


def print_compare_summary(rows, versus=None) -> None:
    """Per case, one line: the fraction of copy bandwidth of every method measured (columns in first-seen order,
    ``-`` where not measured) with its split count, the best of ours marked ``*``, and best minus SDPA. ``versus``
    ``(a, b)``: then one line more, ``a`` minus ``b`` over the cases that have both (median, range, how many cases
    ``a`` is ahead) and how many cases each is ahead of SDPA."""
    methods, by = [], {}
    for r in rows:
        if r.get("frac") is None:
            continue
        if r["method"] not in methods:
            methods.append(r["method"])
        by.setdefault(r["case"], {})[r["method"]] = r
    w = max([13] + [len(m) + 2 for m in methods])
    print(f"\nfraction of copy bandwidth (S = split count; * = best of ours)\n{'case':26s}"
          + "".join(f"{m:>{w}s}" for m in methods) + f"{'best-sdpa':>{w}s}  best")
    for name, d in by.items():
        ours = {m: r["frac"] for m, r in d.items() if m != "sdpa"}
        best = max(ours, key=ours.get) if ours else None
        cells = []
        for m in methods:
            r = d.get(m)
            if r is None:
                cells.append(f"{'-':>{w}s}")
                continue
            txt = (f"{r['frac']:.3f}" + ("*" if m == best else " ")
                   + (f" S{r['num_splits']}" if r.get("num_splits") else ""))
            cells.append(f"{txt:>{w}s}")
        gap = (f"{ours[best] - d['sdpa']['frac']:+.3f}" if best and "sdpa" in d else "-")
        print(f"{name:26s}" + "".join(cells) + f"{gap:>{w}s}  {best or '-'}")
    if versus:
        a, b = versus
        diffs = sorted(d[a]["frac"] - d[b]["frac"] for d in by.values() if a in d and b in d)
        if not diffs:
            print(f"\n{a} vs {b}: no case has both")
            return
        ahead = {m: sum(1 for d in by.values() if m in d and "sdpa" in d and d[m]["frac"] > d["sdpa"]["frac"])
                 for m in (a, b)}
        n_sd = sum(1 for d in by.values() if "sdpa" in d)
        print(f"\n{a} - {b}: median {diffs[len(diffs) // 2]:+.3f} (from {diffs[0]:+.3f} to {diffs[-1]:+.3f}); "
              f"{a} ahead in {sum(x > 0 for x in diffs)} of {len(diffs)} cases; ahead of SDPA: {a} in {ahead[a]}, "
              f"{b} in {ahead[b]} of {n_sd}")


# (name, B, Hq, Hkv, context, page_size or None, Nq)
CASES = _CONTIGUOUS_CASES + [
    ("gqa32:8_b4_32k_page16", 4, 32, 8, 32768, 16, 1),
    ("gqa32:8_b4_32k_page32", 4, 32, 8, 32768, 32, 1),
    ("mha_b4_16k_page16", 4, 32, 32, 16384, 16, 1),
    ("gqa32:8_b1_64k_nq4", 1, 32, 8, 65536, None, 4),
]


def default_splits(B, Hkv, G, Nq, context, bn):
    bm = min(max(16, 1 << max(G * Nq - 1, 0).bit_length()), 64)
    n_m = -(-(G * Nq) // bm)
    return decode_num_splits(B * Hkv * n_m, -(-context // bn), _sm_count(torch.device("cuda")))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--matrix", action="store_true", help="the issue-29 decode matrix at the defaults (docstring)")
    p.add_argument("--gathers", default="prefetch",
                   help="--matrix: page_gather values timed on paged cases, comma-separated (key,page,prefetch)")
    p.add_argument("--block-ns", default="",
                   help="--matrix: key tile sizes timed on paged cases, comma-separated (e.g. 64,128; default: the plan's)")
    p.add_argument("--quick", action="store_true", help="--matrix: a small subset (see matrix())")
    p.add_argument("--compare", action="store_true",
                   help="issue 29's decode cases: SDPA, the old and the new defaults, then variants (docstring)")
    p.add_argument("--no-variants", action="store_true", help="--compare: SDPA, old and new only")
    p.add_argument("--cases", default="", help="--compare: case names to run, comma-separated (default: all)")
    p.add_argument("--set", default="all", choices=sorted(COMPARE_SETS),
                   help="--compare: 'all' (COMPARE_CASES, old = the pre-2026-12-04 defaults, COMPARE_VARIANTS), "
                        "'gqa' / 'gqa2' (GQA_CASES: the multi-row plans, old = kernel merge + legacy split), 'pdl' "
                        "or 'final' (FINAL_CASES: every issue-29 decode case; SDPA, new and 'deep' = half the "
                        "splits x 4 stages; no old)")
    p.add_argument("--calls-per-graph", type=int, default=1,
                   help="--compare: calls captured back to back in each timed CUDA graph (1: one call, its launch "
                        "included; e.g. 10: the steady state of a decode step's layers)")
    args = p.parse_args(argv)
    only = [f for f, given in (("--no-variants", args.no_variants), ("--cases", args.cases),
                               ("--set", args.set != "all"), ("--calls-per-graph", args.calls_per_graph != 1))
            if given]
    if only and not args.compare:  # else the default sweep ran, ignoring them
        p.error(f"{', '.join(only)}: options of --compare (add --compare)")
    if args.compare:
        if args.calls_per_graph < 1:
            p.error(f"--calls-per-graph must be >= 1, got {args.calls_per_graph}")
        cases = set(args.cases.split(",")) if args.cases else None
        try:
            check_cases(cases, args.set)
        except ValueError as e:
            p.error(f"--{e}")
        os.makedirs(args.out, exist_ok=True)
        compare(args.out, args.budget_s, not args.no_variants, cases, args.calls_per_graph, args.set)
        return
    os.makedirs(args.out, exist_ok=True)
    if args.matrix:
        bns = tuple(int_list(args.block_ns, "--block-ns", "key tile sizes")) if args.block_ns else (None,)
        matrix(args.out, args.budget_s, tuple(args.gathers.split(",")), args.quick, bns)
        return
    t_end = time.time() + args.budget_s
    copy_gbps = copy_bandwidth()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    D, dt = 128, torch.bfloat16
    for name, B, Hq, Hkv, ctx, ps, Nq in CASES:
        if time.time() > t_end:
            print("budget spent: stopping", flush=True)
            break
        k, v, bt, seq = make_cache(B, Hkv, ctx, D, dt, ps is not None, ps or 0, gen)
        q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=dt, generator=gen)
        nbytes = kv_bytes_per_step(B, Hkv, ctx, D)
        base = dict(case=name, B=B, Hq=Hq, Hkv=Hkv, context=ctx, page_size=ps or 0, Nq=Nq)
        if ps is None:  # SDPA over the same contiguous cache (one query: no mask needed)
            kk, vv = k, v
            if Nq == 1:
                ms = time_cuda_graph(lambda: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=Hq != Hkv))
                rows.append(dict(base, method="sdpa", ms=ms, frac=nbytes / (ms * 1e-3) / 1e9 / copy_gbps))
        bn0 = decode_block_n(D, ps)
        s0 = default_splits(B, Hkv, Hq // Hkv, Nq, ctx, bn0)
        ms = time_cuda_graph(lambda: decode_attn(q, k, v, seq, bt, causal=True))
        rows.append(dict(base, method="ours_default", block_n=bn0, num_splits=s0, num_warps=4, num_stages=2, ms=ms,
                         frac=nbytes / (ms * 1e-3) / 1e9 / copy_gbps))
        for bn, mult, nw, ns in itertools.product((32, 64, 128), (1, 2, 4), (4, 8), (2, 3, 4)):
            if time.time() > t_end:
                break
            s = max(1, min(default_splits(B, Hkv, Hq // Hkv, Nq, ctx, bn) * mult, 256))
            try:
                ms = time_cuda_graph(lambda: decode_attn(q, k, v, seq, bt, causal=True, block_n=bn, num_splits=s,
                                                         num_warps=nw, num_stages=ns))
            except Exception as e:  # noqa: BLE001 - out of shared memory etc.: record and go on
                rows.append(dict(base, method="ours", block_n=bn, num_splits=s, num_warps=nw, num_stages=ns,
                                 error=f"{type(e).__name__}: {str(e)[:80]}"))
                continue
            rows.append(dict(base, method="ours", block_n=bn, num_splits=s, num_warps=nw, num_stages=ns, ms=ms,
                             frac=nbytes / (ms * 1e-3) / 1e9 / copy_gbps))
        mine = [r for r in rows if r["case"] == name and r.get("frac")]
        best = max((r for r in mine if r["method"] == "ours"), key=lambda r: r["frac"], default=None)
        dflt = next(r for r in mine if r["method"] == "ours_default")
        sd = next((r["frac"] for r in mine if r["method"] == "sdpa"), float("nan"))
        print(f"{name:24s} default {dflt['frac']:.2f} (bn {bn0}, S {s0})  best "
              + (f"{best['frac']:.2f} (bn {best['block_n']}, S {best['num_splits']}, w {best['num_warps']}, "
                 f"st {best['num_stages']})" if best else "-") + f"  sdpa {sd:.2f}", flush=True)
        del k, v, bt, q
        torch.cuda.empty_cache()
    write_csv(rows, os.path.join(args.out, "decode_probe.csv"))
    write_json([], os.path.join(args.out, "decode_probe.json"), env=dict(env_info(), copy_gbps=copy_gbps))


if __name__ == "__main__":
    main()
