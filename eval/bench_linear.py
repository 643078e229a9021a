"""Benchmark: fused Triton linear attention vs flash-linear-attention, plain PyTorch and exact causal attention.

Plain Python (no Hydra), from the repo root: ``python -m eval.bench_linear --out results/h200``. Needs CUDA.

All timings come from one run: median of CUDA events (:func:`eval.bench_common.time_cuda`), forward and
forward+backward, and the peak extra memory of one forward+backward; with ``--rounds R`` (default 3) every method of
a shape is timed ``R`` times, the methods in rotating order, and the median with its spread is reported
(:func:`more_rounds`): the GPU is shared and drifts, and a back-to-back pass charges that drift to one method. Workload: causal, bf16, ``H = 16``,
``D = Dv = 128``, ``B * N = --tokens`` (16k; ``B = 1`` once ``N`` exceeds it), ``N = 512 .. 64k``.

Methods
* ``ours``: :func:`kernels.linear.linear_attention` on positive features (``elu1`` applied once outside
  the timed region, so every linear method gets the same feature tensors), normalised (``/ (phi(q).z + eps)``).
* ``ours_fused_elu1`` / ``ours_torch_elu1`` (one N): raw q/k with the map fused in-kernel vs PyTorch
  ``elu(x) + 1`` before the kernel (the feature-map fusion decision).
* ``fla_linear``: ``fla.ops.linear_attn.chunk_linear_attn(normalize=True, scale=1)`` (fla-core, carried as
  a wheel; inputs already in its ``(B, T, H, D)`` layout, so no transposes are timed).
* ``fla_simple_gla``: ``fla.ops.simple_gla.chunk_simple_gla`` with a per-head scalar log-decay ``g``
  (unnormalised; the gated relative).
* ``torch``: the project's ``torch`` backend (plain PyTorch chunked form, fp32 states).
* ``sdpa_cudnn``: exact causal attention through ``scaled_dot_product_attention`` with the cuDNN backend;
  ``flash_triton``: the project's Triton flash kernel (:mod:`kernels.flash`) when it imports.

Packed documents (issue 27): ``--docs fixed:<L>,geometric:<L>`` (``--varlen``: its former name) runs only
:func:`bench_docs`: one packed row (B = 1) of each ``--docs-tokens`` length (default 16k and 64k) per
document-length distribution (those of ``eval/bench_flash.py --docs``), ours with ``doc_ids`` vs fla's varlen
``chunk_linear_attn(..., cu_seqlens=)`` (or ``chunk_simple_gla(g=None)`` where fla lacks it) and ours without
documents, forward+backward, a fp32-reference check of every method with documents, ``--time-budget-s``, and
``{prefix}_docs_bench.{csv,json}`` rewritten after every case. E.g. ``python -m eval.bench_linear --out
results/h200/docs --docs fixed:256,fixed:2048,geometric:256,geometric:2048 --time-budget-s 420``.

The Taylor (Based) map (issue 30, item 3): ``--taylor`` runs only :func:`bench_taylor`: causal, bf16, qk dim
``--taylor-dim`` (16), v dim ``--taylor-dv`` (64), ``H = --heads``, ``B * N = --tokens``, ``N`` in ``--taylor-ns``
(1k, 4k, 16k): our ``parallel`` form (:func:`kernels.taylor.taylor_parallel`), our chunked ``triton`` backend (the
symmetric features + :func:`kernels.linear.linear_attention`, the feature build timed), the fused chunked form
(``ours_taylor_chunk``: :func:`kernels.taylor_chunk.taylor_chunk`, backend ``taylor_chunk``), what ``auto`` picks, the
chunked PyTorch form (``torch``, the former long-N fallback), and fla's ``parallel_based`` / ``fused_chunk_based``
(optional imports), each checked against the fp32 chunked PyTorch form (output and ``dq, dk, dv``, 2 heads).
``{prefix}_taylor_bench.{csv,json}`` rewritten after every ``N``. E.g. ``python -m eval.bench_linear --taylor
--out results/h200/taylor --time-budget-s 420``.

Prints the table, the speedup over ``fla_linear``, the flatness ratio ``t(64k) / t(16k)`` at fixed
``B * N = 64k`` and the crossover length where linear attention beats exact causal attention.
Writes ``linear_bench.csv`` and ``linear_bench.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as Fn

from eval.bench_common import (POSITIVE_INT, add_time_budget, budget_spent, env_info, format_table, int_list,
                               interleaved_rounds, linear_flops, median_spread, name_list, peak_memory, require_cuda,
                               tflops, time_cuda, try_call, write_csv, write_results)



METHODS = ("ours", "ours_fused_elu1", "ours_torch_elu1", "ours_C32", "ours_C128", "fla_linear", "fla_simple_gla",
           "torch", "sdpa_cudnn", "flash_triton")
"""The names :func:`make_methods` builds (``--methods``; the ``ours_*`` variants and fla_simple_gla / torch /
exact anchors only at some lengths)."""
TAYLOR_METHODS = ("ours_parallel", "ours_taylor_chunk", "ours_chunked", "ours_auto", "torch", "fla_parallel_based",
                  "fla_fused_chunk_based")
"""The names :func:`_taylor_methods` builds (``--methods`` with ``--taylor``)."""


def make_methods(B, H, N, D, dtype, dev, only=None):
    """Returns {name: (fwd_fn, inputs needing grad)} for one shape."""
    g = torch.Generator(device=dev).manual_seed(N)
    q = torch.randn(B, H, N, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(B, H, N, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(B, H, N, D, device=dev, dtype=dtype, generator=g)
    fq, fk = (Fn.elu(q.float()) + 1).to(dtype), (Fn.elu(k.float()) + 1).to(dtype)
    M = {}

    def leaf(*ts):
        return [t.detach().clone().requires_grad_() for t in ts]

    from kernels.linear import linear_attention

    a = leaf(fq, fk, v)
    M["ours"] = (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True), a)
    if only is None or "fusion" in only:
        a = leaf(q, k, v)
        M["ours_fused_elu1"] = (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True, feature_map="elu1"), a)
        a = leaf(q, k, v)
        M["ours_torch_elu1"] = (lambda a=a: linear_attention(Fn.elu(a[0]) + 1, Fn.elu(a[1]) + 1, a[2], causal=True), a)
        for C in (32, 128):
            a = leaf(fq, fk, v)
            M[f"ours_C{C}"] = (lambda a=a, C=C: linear_attention(a[0], a[1], a[2], causal=True, chunk_size=C), a)
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla

        bt = [t.transpose(1, 2).contiguous() for t in (fq, fk, v)]
        a = leaf(*bt)
        M["fla_linear"] = (lambda a=a: chunk_linear_attn(a[0], a[1], a[2], scale=1.0, normalize=True)[0], a)
        if only is None or "fla_simple_gla" in only:
            gl = Fn.logsigmoid(torch.randn(B, N, H, device=dev, dtype=torch.float32, generator=g)) / 16
            a = leaf(*bt)
            M["fla_simple_gla"] = (lambda a=a: chunk_simple_gla(a[0], a[1], a[2], g=gl, scale=1.0)[0], a)
    except Exception as e:  # noqa: BLE001
        print(f"fla unavailable: {type(e).__name__}: {e}")
    if only is None or "torch" in only:
        import attn_zoo

        spec = attn_zoo.AttentionSpec(kind="linear", causal=True, feature_map="elu1")
        a = leaf(q, k, v)
        M["torch"] = (lambda a=a: attn_zoo.attention(a[0], a[1], a[2], spec, backend="torch"), a)
    if only is None or "exact" in only:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        a = leaf(q, k, v)

        def sdpa(a=a):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return Fn.scaled_dot_product_attention(a[0], a[1], a[2], is_causal=True)

        M["sdpa_cudnn"] = (sdpa, a)
        try:
            from kernels.flash import flash_attn

            a = leaf(q, k, v)
            M["flash_triton"] = (lambda a=a: flash_attn(a[0], a[1], a[2], causal=True), a)
        except Exception as e:  # noqa: BLE001
            print(f"kernels.flash unavailable: {type(e).__name__}: {e}")
    return M, (fq, fk, v)


def bench_one(name, fn, leaves, B, H, N, D):
    row = {"method": name, "B": B, "H": H, "N": N, "D": D, "tokens": B * N}
    do = None

    def fwd():
        with torch.no_grad():
            return fn()

    def fwd_bwd():
        out = fn()
        out.backward(do)
        return out

    r = try_call(lambda: time_cuda(fwd))
    row["fwd_ms"] = r if isinstance(r, float) else float("nan")
    if isinstance(r, str):
        row["error"] = r
        return row
    out = fn()
    do = torch.randn_like(out)
    del out
    r = try_call(lambda: time_cuda(fwd_bwd, grad_to_none=leaves))
    row["fwd_bwd_ms"] = r if isinstance(r, float) else float("nan")
    if isinstance(r, str):
        row["error"] = r
    for t in leaves:
        t.grad = None
    m = try_call(lambda: peak_memory(fwd_bwd))
    row["peak_mib"] = m / 2**20 if isinstance(m, int) else float("nan")
    for t in leaves:
        t.grad = None
    if not name.startswith(("sdpa", "flash")):
        row["fwd_bwd_tflops"] = tflops(linear_flops(B, H, N, D, mode="fwd_bwd"), row["fwd_bwd_ms"])
    return row


def more_rounds(case, methods, rounds):
    """Time every method of ``case`` (rows of :func:`bench_one` for one shape; ``methods``: name -> ``(fn, leaves,
    ...)`` as timed there) that ran without an error ``rounds - 1`` more times, forward then forward+backward, in
    rotating order across the methods (:func:`eval.bench_common.interleaved_rounds`): each row's ``fwd_ms`` /
    ``fwd_bwd_ms`` become the median of its ``rounds`` timings, with ``fwd_spread`` / ``fwd_bwd_spread`` ((max - min)
    / median) and ``rounds``; ``fwd_bwd_tflops`` follows where the row has it. A drift of the shared GPU then reaches
    ours and the anchor alike instead of whichever ran last. ``rounds <= 1``: nothing changes."""
    ok = {r["method"]: r for r in case if "error" not in r and r["method"] in methods
          and math.isfinite(r.get("fwd_ms", math.nan)) and math.isfinite(r.get("fwd_bwd_ms", math.nan))}
    if rounds <= 1 or not ok:
        return
    timers = {}
    for name in ok:
        fn, leaves = methods[name][0], methods[name][1]
        do = torch.randn_like(fn().detach())

        def fwd(fn=fn):
            with torch.no_grad():
                return fn()

        timers[name] = {"fwd": lambda f=fwd: time_cuda(f),
                        "fwd_bwd": lambda fn=fn, do=do, leaves=leaves: time_cuda(lambda: fn().backward(do),
                                                                                  grad_to_none=leaves)}
    for mode in ("fwd", "fwd_bwd"):
        more = interleaved_rounds({n: t[mode] for n, t in timers.items()}, rounds - 1, start=1)
        for name, ms in more.items():
            r = ok[name]
            r[f"{mode}_ms"], r[f"{mode}_spread"] = median_spread([r[f"{mode}_ms"]] + ms)
            r["rounds"] = rounds
    for name, r in ok.items():
        for t in methods[name][1]:
            t.grad = None
        if "fwd_bwd_tflops" in r:
            r["fwd_bwd_tflops"] = tflops(linear_flops(r["B"], r["H"], r["N"], r["D"], mode="fwd_bwd"), r["fwd_bwd_ms"])


def check_correctness(dev):
    """ours vs the fp32 reference (small) and vs fla (large, bf16); returns rows of rel errors."""
    import attn_zoo
    from attn_zoo.reference import linear_attention_reference
    from kernels.linear import linear_attention

    rows = []
    spec = attn_zoo.AttentionSpec(kind="linear", causal=True, feature_map="elu1")
    for N in (1000, 4096):
        q, k, v = (torch.randn(1, 4, N, 128, device=dev) for _ in range(3))
        ref = linear_attention_reference(q, k, v, spec)
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            out = attn_zoo.attention(q.to(dt), k.to(dt), v.to(dt), spec, backend="triton")
            e = ((out.float() - ref).norm() / ref.norm()).item()
            rows.append({"check": f"ours_vs_fp32_ref_N{N}", "dtype": str(dt).split(".")[-1], "rel_err": e})
    try:
        from fla.ops.linear_attn import chunk_linear_attn

        N = 8192
        fq, fk = (Fn.elu(torch.randn(1, 8, N, 128, device=dev)) + 1 for _ in range(2))
        v = torch.randn(1, 8, N, 128, device=dev)
        ref = linear_attention_reference(fq, fk, v, spec, feature_q=fq, feature_k=fk)
        b = torch.bfloat16
        ours = linear_attention(fq.to(b), fk.to(b), v.to(b))
        fla = chunk_linear_attn(*(t.to(b).transpose(1, 2).contiguous() for t in (fq, fk, v)), scale=1.0, normalize=True)[0].transpose(1, 2)
        for name, o in (("ours", ours), ("fla_linear", fla)):
            rows.append({"check": f"{name}_vs_fp32_ref_N{N}", "dtype": "bfloat16",
                         "rel_err": ((o.float() - ref).norm() / ref.norm()).item()})
    except Exception as e:  # noqa: BLE001
        print(f"fla check skipped: {e}")
    return rows


def _fla_varlen(cu):
    """fla's varlen chunked linear attention as ``(name, fn(q, k, v) -> out, normalised)`` in its ``(1, T, H, D)``
    layout: ``chunk_linear_attn(..., normalize=True, cu_seqlens=cu)`` when the installed fla-core takes
    ``cu_seqlens`` there (fla-org/flash-linear-attention since 2026-04; fla-core 0.6.0), else ``chunk_simple_gla``
    with ``g=None`` (the same state recurrence, unnormalised: not checked against the reference)."""
    import inspect

    from fla.ops.linear_attn import chunk_linear_attn

    if "cu_seqlens" in inspect.signature(chunk_linear_attn).parameters:
        return ("fla_linear_varlen",
                lambda a, b, c: chunk_linear_attn(a, b, c, scale=1.0, normalize=True, cu_seqlens=cu)[0], True)
    from fla.ops.simple_gla import chunk_simple_gla

    return "fla_simple_gla_g0_varlen", lambda a, b, c: chunk_simple_gla(a, b, c, g=None, scale=1.0,
                                                                        cu_seqlens=cu)[0], False


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_docs(fq, fk, v, doc, impls, heads=2):
    """Relative errors (``||x - ref|| / ||ref||``) of each impl's output and, where it is differentiable, ``dq,
    dk, dv`` against the fp32 reference with the state restart (:func:`attn_zoo.backends.torch_linear.
    chunked_linear_attention` with ``doc_ids``, the torch backend's form, tested against the dense reference by the
    conformance suite), on the first ``heads`` heads (heads are independent; the impls run all of them)."""
    from attn_zoo.backends.torch_linear import chunked_linear_attention

    return _errors_against(lambda a, b, c: chunked_linear_attention(a, b, c, True, 1e-6, 64, doc), fq, fk, v, impls,
                           heads)


def _errors_against(ref_fn, q, k, v, impls, heads):
    """``{name: {"out", "dq", "dk", "dv": relative error}}`` of each impl (``{name: (fn, leaves, layout_bthd)}``)
    against ``ref_fn(q, k, v)`` run in fp32 on the first ``heads`` heads, one seeded output gradient for all."""
    g = torch.Generator(device=q.device).manual_seed(7)
    do = torch.randn(q.shape[0], q.shape[1], q.shape[2], v.shape[3], device=q.device, generator=g)
    ref_in = [t[:, :heads].float().detach().requires_grad_() for t in (q, k, v)]
    ref = ref_fn(*ref_in)
    ref.backward(do[:, :heads])
    out = {}
    for name, (fn, leaves, layout_bthd) in impls.items():
        for t in leaves:
            t.grad = None
        o = fn()
        o.float().backward(do.transpose(1, 2) if layout_bthd else do)
        oh = o.transpose(1, 2) if layout_bthd else o
        grads = [t.grad.transpose(1, 2) if layout_bthd else t.grad for t in leaves]
        r = {"out": _rel(oh[:, :heads], ref)}
        for gname, gr, rt in zip(("dq", "dk", "dv"), grads, ref_in):
            r[gname] = _rel(gr[:, :heads], rt.grad)
        out[name] = r
        for t in leaves:
            t.grad = None
    return out


def docs_case(N, dist, H, D, dtype, dev):
    """One packed row of :func:`bench_docs` (also ``lab/linear_docs_probe.py``): ``(lens, cu, doc, fq, fk, v)``:
    the document lengths of ``N`` tokens under ``dist`` (:func:`eval.bench_flash.document_lengths`, seed 0), fla's
    ``cu_seqlens`` (int64, ``len(lens) + 1``), the document number of every position (int32 ``(1, N)``, from 0) and
    the elu1 features ``fq, fk`` and values ``v`` (``(1, H, N, D)`` in ``dtype``, seeded by ``N``: the same tensors
    for every ``dist``). Raises ValueError for an unknown ``dist``."""
    from eval.bench_flash import document_lengths

    lens = document_lengths(N, dist, seed=0)
    cu = torch.tensor([0] + lens, device=dev).cumsum(0)  # int64 (fla's LongTensor)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev, dtype=torch.int32),
                                  torch.tensor(lens, device=dev))[None]
    g = torch.Generator(device=dev).manual_seed(N)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=dtype, generator=g) for _ in range(3))
    fq, fk = (Fn.elu(q.float()) + 1).to(dtype), (Fn.elu(k.float()) + 1).to(dtype)
    return lens, cu, doc, fq, fk, v


def bench_docs(args, dev, dtype, H, D, t_start, env):
    """Packed documents (issue 27): one packed row (B = 1) of each ``--docs-tokens`` length per ``--docs``
    distribution (``fixed:<L>`` / ``geometric:<L>``, :func:`eval.bench_flash.document_lengths`, seeded), causal,
    bf16, ``H`` heads, ``F = Dv = D``, ``elu1`` features computed once outside the timed region. Methods (same
    process): ``ours_docs`` (:func:`kernels.linear.linear_attention` with ``doc_ids``; the int32 document index is
    built once per ``doc_ids`` tensor, as for the layers of a step), ``ours_nodocs`` (the same kernel without
    documents: the unpacked cost), fla's varlen kernel (:func:`_fla_varlen`, ``cu_seqlens`` in its ``(1, T, H,
    D)`` layout, no transposes timed; fla prepares its chunk indices from ``cu_seqlens`` in every call, as a user's
    call does) and, with ``--docs-torch``, ``torch_docs`` (the chunked PyTorch form). Correctness: every method
    against the fp32 reference (:func:`check_docs`), forward and ``dq, dk, dv``. ``x_fla_fwd_bwd``: fla's time over
    ours. Rows are rewritten to ``{prefix}_docs_bench.{csv,json}`` after every case; cases after
    ``--time-budget-s`` are skipped. ``args.docs_tokens``: the token counts as a list of ints (:func:`main` parses
    ``--docs-tokens`` with :func:`eval.bench_common.int_list`)."""
    from eval.bench_flash import document_dists
    from kernels.linear import linear_attention

    rows, checks = [], []
    dists = document_dists(args.docs)
    for N in args.docs_tokens:
        for dist in dists:
            if budget_spent(t_start, args.time_budget_s, f"docs={dist} N={N}"):
                continue
            lens, cu, doc, fq, fk, v = docs_case(N, dist, H, D, dtype, dev)

            def leaf(*ts):
                return [t.detach().clone().requires_grad_() for t in ts]

            M = {}  # name -> (fn, leaves, (1, T, H, D) layout)
            a = leaf(fq, fk, v)
            M["ours_docs"] = (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True, doc_ids=doc), a, False)
            if args.docs_variants:  # the forward with 64-wide Dv blocks (no spill in the document build offline)
                from kernels.linear import LinearConfig

                c64 = LinearConfig(tiles={"seg_fwd": [(0, 64, 8, 2, 0)]})
                a = leaf(fq, fk, v)
                M["ours_docs_fwd_bv64"] = (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True, doc_ids=doc,
                                                                        config=c64), a, False)
            a = leaf(fq, fk, v)
            M["ours_nodocs"] = (lambda a=a: linear_attention(a[0], a[1], a[2], causal=True), a, False)
            fla_name, normalised = None, False
            try:
                fla_name, ffn, normalised = _fla_varlen(cu)
                a = [t.transpose(1, 2).contiguous().detach().requires_grad_() for t in (fq, fk, v)]
                M[fla_name] = (lambda a=a, f=ffn: f(a[0], a[1], a[2]), a, True)
            except Exception as e:  # noqa: BLE001
                print(f"fla varlen unavailable: {type(e).__name__}: {e}", flush=True)
            if args.docs_torch:
                from attn_zoo.backends.torch_linear import chunked_linear_attention

                a = leaf(fq, fk, v)
                M["torch_docs"] = (lambda a=a: chunked_linear_attention(a[0], a[1], a[2], True, 1e-6, 64, doc), a,
                                   False)
            errs = {}
            if not args.no_check:  # every method with documents (fla unnormalised: not comparable)
                chk = {n: m for n, m in M.items() if n != "ours_nodocs" and (n != fla_name or normalised)}
                errs = try_call(lambda: check_docs(fq, fk, v, doc, chk))
                if isinstance(errs, str):
                    print(f"check failed: {errs}", flush=True)
                    errs = {}
                for n, e in errs.items():
                    checks.append(dict(docs=dist, N=N, method=n, **{f"rel_err_{k}": x for k, x in e.items()}))
                    print(f"  check docs={dist} N={N} {n:24s} " + "  ".join(f"{k} {x:.2e}" for k, x in e.items()),
                          flush=True)
            case = []
            for name, (fn, leaves, _) in M.items():
                r = bench_one(name, fn, leaves, 1, H, N, D)
                r.update(docs=dist, n_docs=len(lens), mean_doc_len=round(N / len(lens), 1))
                r.update({f"rel_err_{k}": x for k, x in errs.get(name, {}).items()})
                case.append(r)
                print(f"[{time.time() - t_start:6.1f}s] docs={dist:14s} N={N:6d} n_docs={len(lens):5d} {name:24s} "
                      f"fwd {r.get('fwd_ms', float('nan')):8.3f}  fwd+bwd {r.get('fwd_bwd_ms', float('nan')):8.3f} ms "
                      f"{r.get('error', '')}", flush=True)
            more_rounds(case, M, args.rounds)
            ours = next((r for r in case if r["method"] == "ours_docs"), None)
            for r in case:
                if ours and r is not ours and ours.get("fwd_bwd_ms", 0) > 0:
                    ours[f"x_{r['method']}_fwd_bwd"] = r.get("fwd_bwd_ms", float("nan")) / ours["fwd_bwd_ms"]
                    ours[f"x_{r['method']}_fwd"] = r.get("fwd_ms", float("nan")) / ours["fwd_ms"]
            rows += case
            del M
            torch.cuda.empty_cache()
            write_results(rows, args.out, f"{args.prefix}_docs_bench", dict(env, checks=checks))  # a killed run keeps them
    ours = [r for r in rows if r["method"] == "ours_docs"]
    cols = ["docs", "N", "n_docs", "fwd_ms", "fwd_bwd_ms"] + sorted({c for r in ours for c in r if c.startswith("x_")})
    print("\nours_docs (bf16, causal, H=%d, D=%d, B=1 packed): ms and speedups (other / ours)" % (H, D))
    print(format_table(ours, cols, "{:.3f}"))
    return rows


def _taylor_methods(B, H, N, D, Dv, dtype, dev, keep=None):
    """``({name: (fn, leaves, layout_bthd)}, (q, k, v), spec)`` for the Taylor map at one shape: ours in
    ``(B, H, N, D)``, fla in its ``(B, T, H, D)`` layout (contiguous copies made outside the timed region). ``keep``: names to build
    (``None``: all). fla's functions are imported separately: a missing one drops its row, printed."""
    import attn_zoo

    g = torch.Generator(device=dev).manual_seed(N)
    q = torch.randn(B, H, N, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(B, H, N, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(B, H, N, Dv, device=dev, dtype=dtype, generator=g)
    spec = attn_zoo.AttentionSpec(kind="linear", causal=True, feature_map="taylor", chunk_size=64)

    def leaf(*ts):
        return [t.detach().clone().requires_grad_() for t in ts]

    def want(name):
        return keep is None or name in keep

    M = {}
    if want("ours_parallel"):
        from kernels.taylor import taylor_parallel

        a = leaf(q, k, v)
        M["ours_parallel"] = (lambda a=a: taylor_parallel(a[0], a[1], a[2], causal=True, eps=spec.eps), a, False)
    if want("ours_taylor_chunk"):  # the fused chunked form (kernels/taylor_chunk.py), backend taylor_chunk
        from kernels.taylor_chunk import taylor_chunk

        a = leaf(q, k, v)
        M["ours_taylor_chunk"] = (lambda a=a: taylor_chunk(a[0], a[1], a[2], causal=True, eps=spec.eps), a, False)
    for name, backend in (("ours_chunked", "triton"), ("ours_auto", "auto"), ("torch", "torch")):
        if want(name):
            a = leaf(q, k, v)
            M[name] = (lambda a=a, b=backend: attn_zoo.attention(a[0], a[1], a[2], spec, backend=b), a, False)
    bt = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    for name, fn_name in (("fla_parallel_based", "parallel_based"), ("fla_fused_chunk_based", "fused_chunk_based")):
        if not want(name):
            continue
        try:
            import importlib

            f = getattr(importlib.import_module("fla.ops.based"), fn_name)
        except Exception as e:  # noqa: BLE001 - fla is optional (absent on the CPU)
            print(f"{name} unavailable: {type(e).__name__}: {e}", flush=True)
            continue
        a = leaf(*bt)
        M[name] = (lambda a=a, f=f: f(a[0], a[1], a[2], scale=D ** -0.5, use_norm=True), a, True)
    return M, (q, k, v), spec


def check_taylor(q, k, v, spec, impls, heads=2):
    """Relative errors of each impl's output and ``dq, dk, dv`` (first ``heads`` heads) against the fp32 chunked
    PyTorch form on the full Taylor map (``torch`` backend in fp32; the conformance suite ties it to the dense
    reference). ``impls``: ``{name: (fn, leaves, layout_bthd)}`` as :func:`_taylor_methods`."""
    import attn_zoo

    return _errors_against(lambda a, b, c: attn_zoo.attention(a, b, c, spec, backend="torch"), q, k, v, impls, heads)


def bench_taylor(args, dev, dtype, t_start, env):
    """The Taylor map (Based) against fla's Based kernels (module docstring); returns the rows. Per ``N``: every
    method checked (:func:`check_taylor`, unless ``--no-check``), then timed (:func:`bench_one`: forward,
    forward+backward, peak memory); ``auto_backend``: what ``auto`` ran; ``x_best_fla_fwd_bwd`` on our rows: the
    best fla time over ours (> 1: ours faster); ``x_parallel_over_chunked``: on the chunked row. ``args.taylor_ns``:
    the sequence lengths as a list of ints (:func:`main` parses ``--taylor-ns`` with
    :func:`eval.bench_common.int_list`)."""
    from attn_zoo.backends.triton_taylor import TAYLOR_CHUNKED_MIN_N
    from attn_zoo.backends.triton_taylor_chunk import TAYLOR_FUSED_MIN_N
    from attn_zoo.functional import resolve_backend

    H, D, Dv = args.heads, args.taylor_dim, args.taylor_dv
    keep = None if args.methods == "all" else set(args.methods.split(","))
    print(f"Taylor: H={H} D={D} Dv={Dv} {dtype} causal, B*N={args.tokens}, TAYLOR_CHUNKED_MIN_N="
          f"{TAYLOR_CHUNKED_MIN_N}, TAYLOR_FUSED_MIN_N={TAYLOR_FUSED_MIN_N}", flush=True)
    rows, checks = [], []
    env = dict(env, taylor_chunked_min_n=TAYLOR_CHUNKED_MIN_N, taylor_fused_min_n=TAYLOR_FUSED_MIN_N)
    for N in args.taylor_ns:
        if budget_spent(t_start, args.time_budget_s, f"taylor N={N}"):
            continue
        B = max(1, args.tokens // N)
        M, (q, k, v), spec = _taylor_methods(B, H, N, D, Dv, dtype, dev, keep)
        picked = resolve_backend(q, k, v, spec).name
        errs = {}
        if not args.no_check:
            errs = try_call(lambda: check_taylor(q, k, v, spec, M))
            if isinstance(errs, str):
                print(f"check failed: {errs}", flush=True)
                errs = {}
            for n, e in errs.items():
                checks.append(dict(N=N, method=n, **{f"rel_err_{x}": y for x, y in e.items()}))
                print(f"  check N={N} {n:24s} " + "  ".join(f"{x} {y:.2e}" for x, y in e.items()), flush=True)
        case = []
        for name, (fn, leaves, _) in M.items():
            r = bench_one(name, fn, leaves, B, H, N, D)
            r.pop("fwd_bwd_tflops", None)  # the elu1 FLOP convention of bench_one does not apply
            r.update(Dv=Dv, feature_map="taylor", auto_backend=picked if name == "ours_auto" else "")
            r.update({f"rel_err_{x}": y for x, y in errs.get(name, {}).items()})
            case.append(r)
            print(f"[{time.time() - t_start:6.1f}s] taylor N={N:6d} B={B:3d} {name:22s} fwd "
                  f"{r.get('fwd_ms', float('nan')):8.3f}  fwd+bwd {r.get('fwd_bwd_ms', float('nan')):8.3f} ms  peak "
                  f"{r.get('peak_mib', float('nan')):8.1f} MiB {r.get('error', '')}", flush=True)
        more_rounds(case, M, args.rounds)
        by = {r["method"]: r for r in case}
        fla = [by[n] for n in ("fla_parallel_based", "fla_fused_chunk_based") if n in by]
        for mode in ("fwd", "fwd_bwd"):
            best_fla = min((r.get(f"{mode}_ms", math.nan) for r in fla), default=math.nan)
            for n in ("ours_parallel", "ours_chunked", "ours_taylor_chunk", "ours_auto"):
                if n in by and by[n].get(f"{mode}_ms", 0) > 0:
                    by[n][f"x_best_fla_{mode}"] = best_fla / by[n][f"{mode}_ms"]
            if "ours_parallel" in by and "ours_chunked" in by and by["ours_chunked"].get(f"{mode}_ms", 0) > 0:
                by["ours_chunked"][f"x_parallel_over_chunked_{mode}"] = (by["ours_parallel"].get(f"{mode}_ms", math.nan)
                                                                         / by["ours_chunked"][f"{mode}_ms"])
        rows += case
        del M
        if dev == "cuda":
            torch.cuda.empty_cache()
        write_results(rows, args.out, f"{args.prefix}_taylor_bench", dict(env, checks=checks))  # a killed run keeps them
    summ = []
    for N in sorted({r["N"] for r in rows}):
        s = {"N": N}
        for r in rows:
            if r["N"] == N:
                s[r["method"]] = r.get("fwd_bwd_ms")
                if r["method"] == "ours_auto":
                    s["auto"] = r.get("auto_backend")
                for x in ("x_best_fla_fwd_bwd",):
                    if x in r:
                        s[f"{r['method']}_{x}"] = r[x]
        summ.append(s)
    cols = ["N", "ours_parallel", "ours_chunked", "ours_taylor_chunk", "ours_auto", "auto", "torch",
            "fla_parallel_based", "fla_fused_chunk_based", "ours_parallel_x_best_fla_fwd_bwd",
            "ours_chunked_x_best_fla_fwd_bwd", "ours_taylor_chunk_x_best_fla_fwd_bwd", "ours_auto_x_best_fla_fwd_bwd"]
    print(f"\nTaylor fwd+bwd ms (H={H}, D={D}, Dv={Dv}, B*N={args.tokens}, causal) and best fla / ours:")
    print(format_table(summ, [c for c in cols if any(c in s for s in summ)], "{:.3f}"))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/h200")
    p.add_argument("--tokens", type=POSITIVE_INT, default=16384)
    p.add_argument("--heads", type=POSITIVE_INT, default=16)
    p.add_argument("--dim", type=POSITIVE_INT, default=128)
    p.add_argument("--ns", default="512,1024,2048,4096,8192,16384,32768,65536")
    p.add_argument("--flat-tokens", type=POSITIVE_INT, default=65536)
    p.add_argument("--prefix", default="linear")
    p.add_argument("--methods", default="all",
                   help=f"comma list to keep ({','.join(METHODS)}; with --taylor: {','.join(TAYLOR_METHODS)}) "
                        f"or 'all'")
    p.add_argument("--no-flat", action="store_true", help="skip the fixed B*N=64k flatness rows")
    p.add_argument("--docs", "--varlen", dest="docs", default=None,
                   help="packed documents only (bench_docs): comma list of fixed:<L> / geometric:<L>, e.g. "
                        "fixed:512,geometric:1024 (--varlen: the former name)")
    p.add_argument("--docs-tokens", default="16384,65536", help="--docs: tokens of the packed row (B = 1), comma list")
    p.add_argument("--docs-torch", action="store_true", help="--docs: also time the chunked PyTorch form")
    p.add_argument("--docs-variants", action="store_true",
                   help="--docs: also ours with the forward's 64-wide Dv tile (ours_docs_fwd_bv64)")
    p.add_argument("--no-check", action="store_true", help="--docs / --taylor: skip the correctness check")
    p.add_argument("--taylor", action="store_true",
                   help="the Taylor (Based) map only (bench_taylor): ours parallel / chunked / auto / torch vs fla's "
                        "parallel_based and fused_chunk_based")
    p.add_argument("--taylor-ns", default="1024,4096,16384", help="--taylor: sequence lengths, comma list")
    p.add_argument("--taylor-dim", type=POSITIVE_INT, default=16,
                   help="--taylor: qk head dim (fla's Based kernels: <= 16)")
    p.add_argument("--taylor-dv", type=POSITIVE_INT, default=64, help="--taylor: value head dim")
    p.add_argument("--rounds", type=int, default=3,
                   help="time each method's fwd and fwd+bwd this many times per shape, in rotating order across the "
                        "methods, and report the median with its spread (1: once each, back to back)")
    add_time_budget(p, scope="--docs / --taylor: ")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds} is not supported; allowed values: an integer >= 1")
    # the three lists, parsed here only and before any GPU work; bench_docs / bench_taylor take theirs from args
    ns = int_list(args.ns, "--ns", "sequence lengths")
    args.docs_tokens = int_list(args.docs_tokens, "--docs-tokens", "token counts")
    args.taylor_ns = int_list(args.taylor_ns, "--taylor-ns", "sequence lengths")
    if args.docs is not None and args.taylor:  # --docs ran alone, --taylor was ignored
        p.error("--docs and --taylor are separate runs; give one of them")
    if args.docs is not None:  # --docs '' ran the main benchmark instead
        from eval.bench_flash import document_dists

        try:  # a bad entry stopped the run only after the CUDA check
            document_dists(args.docs)
        except ValueError as e:
            p.error(str(e) if str(e).startswith("--docs") else f"--docs {args.docs!r}: {e}")
        if args.methods != "all":
            p.error(f"--methods {args.methods!r} is not used with --docs (it times ours_docs, ours_nodocs, fla's "
                    f"varlen kernel and with --docs-torch torch_docs); leave it out")
    if args.methods != "all":  # a misspelt name kept no method: nothing timed, exit 0
        args.methods = ",".join(name_list(args.methods, "--methods", "method names",
                                          TAYLOR_METHODS if args.taylor else METHODS, ", or all"))
    t_start = time.time()
    keep = None if args.methods == "all" else set(args.methods.split(","))
    require_cuda("bench_linear")
    dev, dtype, H, D = "cuda", torch.bfloat16, args.heads, args.dim
    env = env_info()  # today's date
    try:
        import fla

        env["fla_core"] = getattr(fla, "__version__", "?")
    except Exception:  # noqa: BLE001
        env["fla_core"] = None
    print(env)
    if args.docs:
        bench_docs(args, dev, dtype, H, D, t_start, env)
        return
    if args.taylor:
        bench_taylor(args, dev, dtype, t_start, env)
        return
    checks = check_correctness(dev)
    print(f"[{time.time() - t_start:6.1f}s] checks done", flush=True)
    print(format_table(checks, ["check", "dtype", "rel_err"], "{:.2e}"))
    rows = []
    os.makedirs(args.out, exist_ok=True)
    for N in ns:
        B = max(1, args.tokens // N)
        only = None if N == 4096 else ("exact", "torch", "fla_simple_gla")
        M, _ = make_methods(B, H, N, D, dtype, dev, only=only)
        case = []
        for name, (fn, leaves) in M.items():
            if keep is not None and name not in keep:
                continue
            case.append(bench_one(name, fn, leaves, B, H, N, D))
            r = case[-1]
            print(f"[{time.time() - t_start:6.1f}s] N={N:6d} B={B:3d} {name:18s} fwd {r.get('fwd_ms', float('nan')):8.3f}  fwd+bwd {r.get('fwd_bwd_ms', float('nan')):8.3f} ms"
                  f"  peak {r.get('peak_mib', float('nan')):8.1f} MiB {r.get('error', '')}", flush=True)
        more_rounds(case, M, args.rounds)
        if args.rounds > 1:
            print(f"[{time.time() - t_start:6.1f}s] N={N:6d} medians of {args.rounds} rounds: " + "  ".join(
                f"{r['method']} {r.get('fwd_bwd_ms', float('nan')):.3f}" for r in case), flush=True)
        rows += case
        del M
        torch.cuda.empty_cache()
        write_csv(rows, os.path.join(args.out, f"{args.prefix}_bench_partial.csv"))
    # flatness at fixed B*N
    flat = []
    for N in (() if args.no_flat else (16384, 32768, 65536)):
        B = max(1, args.flat_tokens // N)
        M, _ = make_methods(B, H, N, D, dtype, dev, only=())
        for name in ("ours", "fla_linear"):
            if name in M:
                r = bench_one(name, *M[name], B, H, N, D)
                r["set"] = "flat"
                flat.append(r)
        del M
        torch.cuda.empty_cache()
    for r in rows:
        r["set"] = "sweep"
        r["ms_per_16k_tokens_fwd_bwd"] = r.get("fwd_bwd_ms", float("nan")) * 16384 / r["tokens"]
    write_results(rows + flat, args.out, f"{args.prefix}_bench", dict(env, checks=checks))

    # summary
    by = {(r["method"], r["N"]): r for r in rows}
    summ = []
    for N in ns:
        o, f = by.get(("ours", N)), by.get(("fla_linear", N))
        s = {"N": N}
        for name in ("ours", "fla_linear", "fla_simple_gla", "torch", "sdpa_cudnn", "flash_triton"):
            r = by.get((name, N))
            s[name] = r.get("fwd_bwd_ms") if r else None
        if o and f:
            s["speedup_fwd_bwd"] = f["fwd_bwd_ms"] / o["fwd_bwd_ms"]
            s["speedup_fwd"] = f["fwd_ms"] / o["fwd_ms"]
        summ.append(s)
    print("\nfwd+bwd ms (B*N = %d, H=%d, D=%d, bf16, causal)" % (args.tokens, H, D))
    print(format_table(summ, ["N", "ours", "fla_linear", "fla_simple_gla", "torch", "sdpa_cudnn", "flash_triton",
                              "speedup_fwd", "speedup_fwd_bwd"], "{:.3f}"))
    for name in ("ours", "fla_linear"):
        t = {r["N"]: r["fwd_bwd_ms"] for r in flat if r["method"] == name}
        if 16384 in t and 65536 in t:
            print(f"flatness {name}: t(64k)/t(16k) at B*N={args.flat_tokens}: {t[65536] / t[16384]:.3f}  ({t})")

    def crossover(lin, exact):
        prev = None
        for N in ns:
            a, b = by.get((lin, N)), by.get((exact, N))
            if not a or not b or not (a.get("fwd_bwd_ms", math.nan) > 0) or not (b.get("fwd_bwd_ms", math.nan) > 0):
                continue
            if a["fwd_bwd_ms"] < b["fwd_bwd_ms"]:
                if prev is None:
                    return f"<= {N}"
                # log-log interpolation between prev and N of the time ratio
                (n0, r0), r1 = prev, a["fwd_bwd_ms"] / b["fwd_bwd_ms"]
                x = math.log(n0) + (math.log(N) - math.log(n0)) * math.log(r0) / (math.log(r0) - math.log(r1))
                return f"~{math.exp(x):.0f} (between {n0} and {N})"
            prev = (N, a["fwd_bwd_ms"] / b["fwd_bwd_ms"])
        return "not reached"

    for lin in ("ours", "fla_linear"):
        for ex in ("sdpa_cudnn", "flash_triton"):
            print(f"crossover fwd+bwd {lin} vs {ex}: N {crossover(lin, ex)}")


if __name__ == "__main__":
    main()
