"""Run GPU tests one per process, so that a CUDA fault names the test that raised it (lab: not installed).

A CUDA fault (``illegal instruction``, ``illegal memory access``, ``misaligned address``...) is sticky: every later
CUDA call of the process fails, so under ``pytest -n 8`` one faulting test turns every later test of its xdist worker
into a failure and the log cannot say which test faulted first. Here every collected test id runs in a fresh
``python -m pytest`` process (no xdist) under ``timeout``::

    python -m lab.gpu_tests_isolated tests/test_kernel_flash_gluon_bwd.py [-k EXPR] [--jobs 4] [--timeout 300]
        [--stop-at-fault] [--blocking] [--out outputs/gpu_tests]

* the ids: ``pytest --collect-only -q -m gpu FILES [-k EXPR]`` (``--marker ''`` for every test);
* ``--jobs``: processes at a time (one GPU is shared; the Triton cache on disk is shared, so a kernel compiles
  once);
* ``--stop-at-fault``: no new test starts once one has faulted (those running finish);
* ``--blocking``: ``CUDA_LAUNCH_BLOCKING=1`` in each process, so the traceback points at the faulting launch (slower);
* ``--deadline``: no new test starts after this many seconds (the summary still comes: for a command time limit);
* one line per test as it ends (``PASS`` / ``FAIL`` / ``SKIP`` / ``FAULT <kind>`` / ``TIMEOUT`` / ``ERROR``), then
  a summary: counts, the faulting ids in collection order, the failing ones; each test's output in
  ``OUT/NNN.txt`` and one row per test in ``OUT/summary.csv`` (index, id, status, detail, rc, seconds).

Exit status: 0 when every test passed or was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import List, Optional, Tuple

# what a CUDA fault prints (torch.AcceleratorError / RuntimeError from triton's launcher) -> short kind
FAULTS = (("illegal instruction", "illegal_instruction"), ("illegal memory access", "illegal_address"),
          ("misaligned address", "misaligned_address"), ("unspecified launch failure", "launch_failure"),
          ("device-side assert", "device_assert"), ("CUDA error", "cuda_error"), ("Triton Error [CUDA]", "cuda_error"))


def parse_collected(text: str) -> List[str]:
    """The test ids of ``pytest --collect-only -q`` output (lines ``path::name[params]``), in order, no repeats."""
    ids = []
    for line in text.splitlines():
        line = line.strip()
        if "::" in line and not line.startswith(("=", "<", " ")) and line not in ids:
            ids.append(line)
    return ids


def classify(rc: int, text: str) -> Tuple[str, str]:
    """``(status, detail)`` of one test process from its exit code and output: ``TIMEOUT`` (rc 124 / 137: a hang
    or a kill), ``FAULT`` (a CUDA fault message anywhere in the output; detail: its kind), ``PASS`` (rc 0, passed),
    ``SKIP`` (rc 0, skipped only), ``FAIL`` (rc 1), ``ERROR`` (anything else: collection error, crash)."""
    if rc in (124, 137):
        return "TIMEOUT", f"rc={rc}"
    for needle, kind in FAULTS:
        if needle in text:
            return "FAULT", kind
    tail = text.strip().splitlines()[-1] if text.strip() else ""
    if rc == 0:
        return ("SKIP" if "skipped" in tail and "passed" not in tail else "PASS"), tail
    if rc == 1:
        first = next((ln.strip() for ln in text.splitlines() if ln.startswith("E ")), tail)
        return "FAIL", first[:200]
    return "ERROR", f"rc={rc} {tail[:160]}"


def collect(files: List[str], marker: str, kexpr: Optional[str]) -> List[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *files]
    if marker:
        cmd += ["-m", marker]
    if kexpr:
        cmd += ["-k", kexpr]
    r = subprocess.run(cmd, capture_output=True, text=True)
    ids = parse_collected(r.stdout)
    if not ids:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
    return ids


def run_one(idx: int, test_id: str, out_dir: str, timeout: int, blocking: bool) -> dict:
    env = dict(os.environ)
    if blocking:
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    cmd = ["timeout", "-k", "10", str(timeout), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist", "-x", test_id]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = r.stdout + r.stderr
    with open(os.path.join(out_dir, f"{idx:03d}.txt"), "w") as f:
        f.write(f"$ {' '.join(cmd)}\n{text}")
    status, detail = classify(r.returncode, text)
    return dict(index=idx, id=test_id, status=status, detail=detail, rc=r.returncode,
                seconds=round(time.time() - t0, 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="test files (or ids) to collect from")
    ap.add_argument("-k", dest="kexpr", default=None, help="pytest -k expression")
    ap.add_argument("--marker", default="gpu", help="pytest -m expression ('' for none); default gpu")
    ap.add_argument("--jobs", type=int, default=1, help="test processes at a time (default 1)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test process (default 300)")
    ap.add_argument("--stop-at-fault", action="store_true", help="start no new test once one has faulted")
    ap.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 in every test process")
    ap.add_argument("--deadline", type=float, default=0, help="start no test after this many seconds (0: none)")
    ap.add_argument("--out", default="outputs/gpu_tests", help="folder for per-test logs and summary.csv")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.timeout < 1:
        ap.error("--jobs and --timeout must be >= 1")
    os.makedirs(args.out, exist_ok=True)
    ids = collect(args.files, args.marker, args.kexpr)
    print(f"{len(ids)} tests collected; one process each, {args.jobs} at a time, timeout {args.timeout} s; "
          f"logs in {args.out}", flush=True)
    if not ids:
        return 1
    results, faulted, t0 = [], False, time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        pending = list(enumerate(ids))
        running = {}
        while pending or running:
            late = args.deadline > 0 and time.time() - t0 > args.deadline
            while pending and len(running) < args.jobs and not (faulted and args.stop_at_fault) and not late:
                idx, tid = pending.pop(0)
                running[pool.submit(run_one, idx, tid, args.out, args.timeout, args.blocking)] = idx
            if not running:
                break
            done = next(as_completed(running))
            del running[done]
            res = done.result()
            results.append(res)
            faulted = faulted or res["status"] in ("FAULT", "TIMEOUT")
            print(f"[{res['index']:3d}] {res['status']:7s} {res['seconds']:6.1f}s {res['id']}"
                  f"{'  (' + res['detail'] + ')' if res['status'] not in ('PASS', 'SKIP') else ''}", flush=True)
    results.sort(key=lambda r: r["index"])
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["index", "id", "status", "detail", "rc", "seconds"])
        w.writeheader()
        w.writerows(results)
    counts = {s: sum(r["status"] == s for r in results) for s in ("PASS", "SKIP", "FAIL", "FAULT", "TIMEOUT", "ERROR")}
    not_run = len(ids) - len(results)
    print("== " + ", ".join(f"{k.lower()} {v}" for k, v in counts.items() if v) + (f", not run {not_run}" if not_run
                                                                                      else ""))
    for status in ("FAULT", "TIMEOUT", "ERROR", "FAIL"):
        for r in results:
            if r["status"] == status:
                print(f"{status} {r['id']}  ({r['detail']}; log {os.path.join(args.out, '%03d.txt' % r['index'])})")
    ok = counts["PASS"] + counts["SKIP"] == len(ids)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
