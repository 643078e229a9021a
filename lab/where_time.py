"""Where the time goes: a kernel-by-kernel profile of one forward+backward step, ours against its anchors
(lab: not installed; needs CUDA). Issue 30 asks, for every target missed, for a profile that says why.

For each case (a ``eval.bench_flash`` variant, ``N``, ``D``, 16k tokens per call, bf16, optionally packed documents)
and each impl (``eval.bench_flash`` names: ``ours``, ``sdpa_cudnn``, ``fa4``, ``flex_fa4``, ``fa4_varlen``, ...),
``--iters`` steps of ``f(q, k, v).backward(do)`` run under ``torch.profiler`` (CUDA activity). Per impl and case:

* every GPU kernel's time per step (us), its share of the step's kernel time, and its launches per step;
* ``kernel_ms``: the sum of the kernels' times per step, ``wall_ms``: the step's median time from CUDA events
  (``eval.bench_common.time_cuda``, outside the profiler), ``busy`` = kernel_ms / wall_ms (below ~0.95 the GPU
  waits on the host: launches, autograd, Python);
* ``graph_ms``: the step captured in one CUDA graph and replayed (``eval.bench_common.time_cuda_graph``: the GPU's
  time for the step with no host work between its kernels), after the profile; ``-`` with ``graph_error`` where
  capture fails. ``wall_ms`` well above ``graph_ms`` is a host gap; ``kernel_ms`` far from ``graph_ms`` says the
  profiler's kernel times disagree with the GPU's own (the 2026-12-05 H100 profiles read FA4 at busy 1.13 and ours at
  0.73-0.93 in one call, where earlier calls read 1.00);
* the step's TFLOP/s (FlashAttention's count over the pairs the mask keeps) by wall and by kernel time.

Reading it: ours against the anchor kernel by kernel (forward kernel vs forward kernel, backward kernels vs
backward kernels) says which phase the gap is in; ``busy`` says whether it is on the GPU at all.

    python -m lab.where_time --out DIR --cases causal:4096:128,gqa4:16384:128 --impls ours,sdpa_cudnn,fa4
    python -m lab.where_time --out DIR --cases causal:16384:128 --docs wikitext:real --impls ours,fa4_varlen

Writes DIR/TAG.csv (one row per impl, case and kernel), DIR/TAG_summary.csv / .json (one row per impl and case)
and DIR/TAG.md (the summary, then the kernels); TAG is ``--tag`` (default ``where_time``). Raises ``ValueError`` for a
malformed ``--cases`` entry (an unknown variant, N or D not a positive integer) or ``--iters`` < 1.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

import torch

from eval.bench_common import (env_info, error_line, flash_flops, tflops, time_cuda, time_cuda_graph, write_csv,
                               write_json)
from eval.bench_flash import (NATIVE, OURS, VARIANTS, case_setup, fa4_varlen_native, make_impl, ours_bwd_impl,
                              ours_fwd_impl)


def parse_cases(text: str):
    """``"causal:4096:128,win1024:16384:128"`` -> ``[("causal", 4096, 128), ...]``; ValueError names the entry."""
    out = []
    for entry in text.split(","):
        parts = entry.split(":")
        if (len(parts) != 3 or parts[0] not in VARIANTS or not parts[1].isdigit() or not parts[2].isdigit()
                or int(parts[1]) < 1 or int(parts[2]) < 1):
            raise ValueError(f"--cases entry {entry!r}: expected VARIANT:N:D with VARIANT one of "
                             f"{', '.join(VARIANTS)} and N, D positive integers")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def kernel_table(events, iters: int):
    """GPU kernels of a profile: name -> (us per step, launches per step), from ``prof.events()``."""
    agg = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.startswith(("Memcpy", "Memset")) and e.time_range.elapsed_us() == 0:
            continue
        a = agg[e.name]
        a[0] += e.time_range.elapsed_us()
        a[1] += 1
    return {k: (v[0] / iters, v[1] / iters) for k, v in agg.items()}


def graph_time(step) -> dict:
    """``{"graph_ms": ...}``: one ``step`` captured in a CUDA graph, replayed and timed (the GPU's time for the step
    without the host's work between kernels), or ``{"graph_error": "<type>: <message>"}`` where capture or replay
    fails (an anchor whose launcher cannot be captured): the rest of the profile stands."""
    try:
        return {"graph_ms": round(time_cuda_graph(step, warmup=2, calls=1), 4)}
    except Exception as e:  # noqa: BLE001 -- reported in the row, never the end of the probe
        if torch.cuda.is_available():
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 -- a context the failed capture poisoned: the next impl reports it
                pass
        return {"graph_error": error_line(e, 120)}


def profile_case(name, N, D, impls, tokens, iters, docs=None):
    B, Hq, Hkv, spec, frac, doc_ids = case_setup(name, N, D, tokens, docs)
    g = torch.Generator(device="cuda").manual_seed(N + D)
    mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = mk(Hq).requires_grad_(True), mk(Hkv).requires_grad_(True), mk(Hkv).requires_grad_(True)
    do = mk(Hq)
    flops = flash_flops(B, Hq, N, D, visited_fraction=frac, mode="fwd_bwd")
    summary, kernels = [], []
    for impl in impls:
        base = dict(variant=name, N=N, D=D, B=B, Hq=Hq, Hkv=Hkv, impl=impl, docs=docs or "")
        try:
            if impl in NATIVE:
                if doc_ids is None:
                    raise ValueError(f"impl {impl!r} runs packed documents only (--docs)")
                f = fa4_varlen_native(q, k, v, spec, doc_ids)
            else:
                f = make_impl(impl, name, N, D, spec, inputs=(q, k, v), doc_ids=doc_ids)
            if impl in OURS:
                base["fwd_impl"] = ours_fwd_impl(impl, spec, q, k, v, doc_ids=doc_ids)
                base["bwd_impl"] = ours_bwd_impl(impl, spec, q, k, v, doc_ids=doc_ids)
            grads = getattr(f, "leaves", [q, k, v])

            def step():
                for t in grads:
                    t.grad = None
                f(q, k, v).backward(do)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            wall = time_cuda(step, warmup=5, rep=30, at_least=False)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    step()
                torch.cuda.synchronize()
            table = kernel_table(prof.events(), iters)
            graph = graph_time(step)
        except Exception as e:  # an anchor that cannot run the case is a row, not the end of the probe
            summary.append(dict(base, error=error_line(e)))
            print(f"{name} N={N} D={D} {impl}: {summary[-1]['error']}", flush=True)
            torch.cuda.empty_cache()
            continue
        kernel_us = sum(t for t, _ in table.values())
        summary.append(dict(base, wall_ms=round(wall, 4), kernel_ms=round(kernel_us / 1e3, 4),
                            busy=round(kernel_us / 1e3 / wall, 3), launches=round(sum(n for _, n in table.values()), 1),
                            tflops_wall=round(tflops(flops, wall), 1),
                            tflops_kernels=round(tflops(flops, kernel_us / 1e3), 1), **graph))
        for kname, (us, n) in sorted(table.items(), key=lambda kv: -kv[1][0]):
            kernels.append(dict(base, kernel=kname[:160], us_per_step=round(us, 1), launches=round(n, 2),
                                share=round(us / kernel_us, 3) if kernel_us else None))
        g_ms = graph.get("graph_ms", graph.get("graph_error"))
        print(f"{name} N={N} D={D} {impl}: wall {wall:.3f} ms, graph {g_ms}, kernels {kernel_us / 1e3:.3f} ms "
              f"(busy {summary[-1]['busy']}), {summary[-1]['tflops_wall']} TFLOP/s", flush=True)
        torch.cuda.empty_cache()
    return summary, kernels


def markdown(summary, kernels, top: int = 6) -> str:
    lines = ["| case | impl | wall ms | graph ms | kernel ms | busy | TFLOP/s (wall) | TFLOP/s (kernels) | launches |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        case = f"{r['variant']} N {r['N']} D {r['D']}" + (f" docs {r['docs']}" if r.get("docs") else "")
        if "error" in r:
            err = r["error"].replace("|", "\\|")  # a '|' in the message would split the row
            lines.append(f"| {case} | {r['impl']} | {err} | | | | | | |")
            continue
        graph = f"{r['graph_ms']:.3f}" if r.get("graph_ms") is not None else ("failed" if r.get("graph_error") else "-")
        kinds = f" ({r['fwd_impl']} / {r.get('bwd_impl', '-')})" if r.get("fwd_impl") else ""  # ours: fwd / bwd kernels
        lines.append(f"| {case} | {r['impl']}{kinds} | "
                     f"{r['wall_ms']:.3f} | {graph} | {r['kernel_ms']:.3f} | {r['busy']:.2f} | {r['tflops_wall']} | "
                     f"{r['tflops_kernels']} | {r['launches']} |")
    lines += ["", "| case | impl | kernel | us / step | share | launches |", "|---|---|---|---|---|---|"]
    seen = defaultdict(int)
    for r in kernels:
        key = (r["variant"], r["N"], r["D"], r.get("docs"), r["impl"])
        seen[key] += 1
        if seen[key] > top:
            continue
        case = f"{r['variant']} N {r['N']} D {r['D']}" + (f" docs {r['docs']}" if r.get("docs") else "")
        lines.append(f"| {case} | {r['impl']} | `{r['kernel'][:90]}` | {r['us_per_step']} | {r['share']} | "
                     f"{r['launches']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--cases", required=True, help="VARIANT:N:D,... (eval.bench_flash variants)")
    p.add_argument("--impls", default="ours,sdpa_cudnn")
    p.add_argument("--docs", default=None, help="one --docs distribution of eval.bench_flash (fixed:L, ...)")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--tag", default="where_time")
    a = p.parse_args(argv)
    if a.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {a.iters}")
    cases = parse_cases(a.cases)
    if not torch.cuda.is_available():
        raise SystemExit("lab.where_time needs a CUDA device")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    summary, kernels = [], []
    for name, N, D in cases:
        s, k = profile_case(name, N, D, a.impls.split(","), a.tokens, a.iters, a.docs)
        summary += s
        kernels += k
        write_csv(summary, os.path.join(a.out, f"{a.tag}_summary.csv"))
        write_csv(kernels, os.path.join(a.out, f"{a.tag}.csv"))
    write_json(summary, os.path.join(a.out, f"{a.tag}_summary.json"), env=env_info())
    md = markdown(summary, kernels)
    with open(os.path.join(a.out, f"{a.tag}.md"), "w") as fh:
        fh.write(md)
    print(md)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
