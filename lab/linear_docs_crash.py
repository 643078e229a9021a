"""Find which fused linear-attention kernel faults with packed documents on the GPU (lab: not installed).

The lindocs kernels (kernels/linear.py, per-chunk document tests) raised "an illegal memory access" in
``python -m eval.bench_linear --docs fixed:256,fixed:2048,geometric:2048 --docs-tokens 65536`` on the H200 (triton
3.6), surfacing at a later call. Here each case runs in its own process with ``CUDA_LAUNCH_BLOCKING=1`` at the
bench's shape (B = 1 packed row, N = 65536, Hq = Hkv = 16, F = Dv = 128, bf16, causal, chunk 64, the default
segment length: 4096 on 132 SMs; features precomputed as in the bench: FM = 0) and launches ONE kernel of the
forward + backward (``_launch`` of the other kinds is skipped: their outputs stay uninitialised, which changes no
address: every address depends on the shapes and the document index only), then synchronises. A fault therefore
names its kernel. ``all`` launches every kernel, synchronising after each and printing its name first.

    python3 -m lab.linear_docs_crash                        # 5 kernels x --dists + 'all' (the default tiles)
    python3 -m lab.linear_docs_crash --variants             # + each faulting kernel at other warps / stages
    python3 -m lab.linear_docs_crash --sanitizer            # + the first faulting case under compute-sanitizer
    python3 -m lab.linear_docs_crash --kernel-file lab/_linear_lindocs.py   # another copy of kernels/linear.py
    python3 -m lab.linear_docs_crash one KIND DIST [BK,BV,WARPS,STAGES,CHUNK]

Output: one line per case ``kind dist tile -> ok / FAULT (last error line)``; ``--out FILE`` writes them as JSON.
Bounded: the whole run ends within ``--time-budget-s`` (default 540): a case starts only if its timeout
(``--case-timeout-s``, default 150) still fits; compute-sanitizer gets what is left (at least 60 s).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

KINDS = ("seg_state", "seg_fwd", "seg_dstate", "seg_dq", "seg_dkdv")
# alternatives per kernel (BK, BV, warps, stages, chunk): fewer stages (no prefetch: no async copies of the
# document scalars), the other warp count
VARIANTS = {
    "seg_state": [(128, 128, 8, 1, 0), (64, 64, 4, 2, 0)],
    "seg_fwd": [(0, 128, 8, 1, 0), (0, 64, 8, 2, 0), (0, 64, 4, 2, 0)],
    "seg_dstate": [(128, 128, 8, 1, 0), (64, 64, 4, 3, 0)],
    "seg_dq": [(32, 0, 4, 1, 0), (32, 0, 8, 3, 0), (32, 0, 8, 2, 0)],
    "seg_dkdv": [(64, 64, 8, 1, 0), (64, 64, 8, 2, 32), (32, 32, 4, 1, 32)],
}


def one(kind: str, dist: str, tile: str = "", N: int = 65536, H: int = 16, D: int = 128):
    """One case in this process (``LDC_SMOKE=1``: a small CPU run under the interpreter, to test this script)."""
    if os.environ.get("LDC_SMOKE") == "1":
        os.environ["TRITON_INTERPRET"] = "1"
        N, H, D = 512, 1, 32
    import torch
    import torch.nn.functional as Fn

    if os.environ.get("LDC_KERNEL_FILE"):  # another version of kernels/linear.py (e.g. the branch before a fix)
        import importlib.util

        import kernels

        spec = importlib.util.spec_from_file_location("kernels.linear", os.environ["LDC_KERNEL_FILE"])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["kernels.linear"] = mod
        spec.loader.exec_module(mod)
        kernels.linear = mod
        print("kernel file", os.environ["LDC_KERNEL_FILE"], flush=True)
    import kernels.linear as KL
    from eval.bench_flash import document_lengths

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        torch.cuda.synchronize = lambda *a: None
    lens = document_lengths(N, dist, seed=0)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev, dtype=torch.int32),
                                  torch.tensor(lens, device=dev))[None]
    g = torch.Generator(device=dev).manual_seed(N)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    fq, fk = ((Fn.elu(t.float()) + 1).to(torch.bfloat16).requires_grad_() for t in (q, k))
    v.requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16, generator=g)
    cfg = KL.LinearConfig()
    if tile:
        cfg = KL.LinearConfig(tiles={kind: [tuple(int(x) for x in tile.split(","))]})
    torch.cuda.synchronize()
    orig = KL._launch

    def launch(k_, kernel, grid_fn, *a, **kw):
        if kind != "all" and k_ != kind:
            return None
        print(f"launch {k_}", flush=True)
        r = orig(k_, kernel, grid_fn, *a, **kw)
        torch.cuda.synchronize()
        print(f"done {k_}", flush=True)
        return r

    KL._launch = launch
    with KL.record_launches() as rec:
        o = KL.linear_attention(fq, fk, v, causal=True, doc_ids=doc, config=cfg)
        torch.cuda.synchronize()
        o.backward(do)
        torch.cuda.synchronize()
    L = KL.query_segment_len(1, H, N, D, D, 64, torch.bfloat16, torch.device(dev), cfg)
    print("ok", kind, dist, "L", L, "segments", -(-N // L), {k_: v_ for k_, v_ in rec.kernels.items()}, flush=True)


def _case(kind, dist, tile, timeout, sanitizer=False):
    cmd = [sys.executable, "-m", "lab.linear_docs_crash", "one", kind, dist] + ([tile] if tile else [])
    if sanitizer:
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--show-backtrace", "device", "--print-limit", "5"] + cmd
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")), 124
    except FileNotFoundError as e:
        out, rc = str(e), 127
    lines = out.strip().splitlines()
    launched = [ln.split()[1] for ln in lines if ln.startswith("launch ")]
    done = [ln.split()[1] for ln in lines if ln.startswith("done ")]
    fault = launched[-1] if launched and (not done or done[-1] != launched[-1]) and rc != 0 else None
    err = [ln for ln in lines if "rror" in ln or "Invalid" in ln or "Out-of-range" in ln or "out of bounds" in ln]
    ok = rc == 0 and any(ln.startswith("ok ") for ln in lines)
    return dict(kind=kind, dist=dist, tile=tile or "default", rc=rc, ok=ok, faulting_kernel=fault,
                kernel_file=os.environ.get("LDC_KERNEL_FILE", "kernels/linear.py") if any(
                    ln.startswith("kernel file") for ln in lines) or not os.environ.get("LDC_KERNEL_FILE") else "NOT USED",
                seconds=round(time.time() - t0, 1), error=(err[-6:] if sanitizer else err[-1:]),
                last=[ln for ln in lines if ln.startswith("ok ")][-1:] if ok else lines[-3:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dists", default="fixed:256,geometric:2048", help="comma list of document distributions")
    p.add_argument("--kinds", default=",".join(KINDS) + ",all")
    p.add_argument("--variants", action="store_true", help="then each kernel that faulted at its VARIANTS tiles")
    p.add_argument("--variants-all", action="store_true", help="--variants for every kernel")
    p.add_argument("--sanitizer", action="store_true", help="rerun the first fault under compute-sanitizer memcheck")
    p.add_argument("--time-budget-s", type=float, default=540)
    p.add_argument("--case-timeout-s", type=float, default=150)
    p.add_argument("--kernel-file", default="", help="run this copy of kernels/linear.py instead (e.g. `git show "
                   "lindocs:kernels/linear.py > lab/_linear_lindocs.py`, untracked, before the GPU call)")
    p.add_argument("--out", default="", help="JSON file of the case results")
    args = p.parse_args(argv)
    if args.kernel_file:
        os.environ["LDC_KERNEL_FILE"] = os.path.abspath(args.kernel_file)
    t0 = time.time()
    cases = [(k, d, "") for d in args.dists.split(",") for k in args.kinds.split(",")]
    res = []

    def run(kind, dist, tile):
        if time.time() - t0 + args.case_timeout_s > args.time_budget_s:  # every case ends within the budget
            print(f"budget spent: skipped {kind} {dist} {tile or 'default'}", flush=True)
            return None
        r = _case(kind, dist, tile, args.case_timeout_s)
        res.append(r)
        state = "ok" if r["ok"] else f"FAULT in {r['faulting_kernel']}" if r["faulting_kernel"] else f"rc {r['rc']}"
        print(f"[{time.time() - t0:5.0f}s] {kind:10s} {dist:15s} tile={r['tile']:16s} -> {state} {r['error']} "
              f"{'' if r['ok'] else r['last']}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return r

    for kind, dist, tile in cases:
        run(kind, dist, tile)
    if args.variants:  # the other tiles of each kernel that faulted alone (all kernels: --variants-all)
        faulted = {}
        for r in res:
            if not r["ok"] and r["kind"] in KINDS:
                faulted.setdefault(r["kind"], r["dist"])
        kinds = KINDS if args.variants_all else [k for k in KINDS if k in faulted]
        for kind in kinds:
            for t in VARIANTS[kind]:
                run(kind, faulted.get(kind, args.dists.split(",")[0]), ",".join(map(str, t)))
    if args.sanitizer:
        bad = next((r for r in res if not r["ok"] and r["kind"] != "all"), None)
        left = args.time_budget_s - (time.time() - t0)
        if bad and left > 60:
            r = _case(bad["kind"], bad["dist"], "" if bad["tile"] == "default" else bad["tile"], left, sanitizer=True)
            r["sanitizer"] = True
            res.append(r)
            print("compute-sanitizer:", r["kind"], r["dist"], r["tile"], "\n  " + "\n  ".join(r["error"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        one(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
        sys.exit(0)
    main()
