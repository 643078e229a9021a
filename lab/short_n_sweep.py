"""GPU sweep of forced Triton tiles at short N (lab: issue 30's N 1k >= 0.9x cuDNN), against cuDNN in one process.

At causal N 1k, D 128 (16k tokens per call, 16 heads) ours runs 0.82-0.84x cuDNN forward+backward in every session
since the 17th; both halves trail (forward 0.73x, backward 0.86x: docs/results.md, "N 1k"). The heuristic tables
(kernels/flash/launch.py) were ordered by autotune runs at long N. This times, per case, the forward with each
forced Triton tile (``FlashConfig(fwd_impl="triton", fwd=tile)``, TMA on and off), the Gluon forwards, and the
backward with forced dQ / dK-dV tiles (the other kernel at its default), beside SDPA's cuDNN backend, each timed
``--rounds`` times in rotating order (medians). A tile that does not compile or fit is an error row.

Usage (GPU): ``python -m lab.short_n_sweep --out DIR [--N 1024,2048] [--D 128] [--masks causal,full] [--rounds 3]
[--time-budget-s 200]``. Writes ``short_n_sweep.csv`` / ``.json`` and prints the best rows per case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

FWD_TILES = [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 4),
             (64, 128, 4, 2), (64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (128, 32, 8, 3)]
DQ_TILES = [(128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 8, 2), (128, 128, 8, 2),
            (64, 32, 4, 2)]
DKDV_TILES = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 8, 3), (128, 64, 8, 2),
              (32, 64, 4, 2)]


def _cases(args):
    from kernels import FlashConfig

    yield "default", "both", FlashConfig()
    yield "triton_all", "both", FlashConfig(fwd_impl="triton", bwd_impl="triton")
    for impl in ("gluon_ws3a", "gluon_ws3b"):
        yield impl, "fwd", FlashConfig(fwd_impl=impl)
    for t in FWD_TILES:
        for tma in (False, True):
            yield f"fwd{t}{'_tma' if tma else ''}", "fwd", FlashConfig(fwd_impl="triton", fwd=t, tma=tma)
    for t in DQ_TILES:
        yield f"dq{t}", "bwd", FlashConfig(fwd_impl="triton", bwd_impl="triton", dq=t)
    for t in DKDV_TILES:
        yield f"dkdv{t}", "bwd", FlashConfig(fwd_impl="triton", bwd_impl="triton", dkdv=t)


def main(argv=None):
    from eval.bench_common import env_info, error_line, int_list, interleaved_rounds, time_cuda, write_results
    from kernels import flash_attn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", default="1024,2048")
    ap.add_argument("--D", default="128")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-budget-s", type=float, default=200.0)
    a = ap.parse_args(argv)
    for m in a.masks.split(","):
        if m not in ("causal", "full"):
            raise SystemExit(f"--masks: {m!r} is not supported; allowed values: causal, full")
    Ds, Ns = int_list(a.D, "--D", "head dims"), int_list(a.N, "--N", "sequence lengths")  # before any GPU work
    t_end = time.time() + a.time_budget_s
    env = env_info()
    rows = []
    for D in Ds:
        for N in Ns:
            for mask in a.masks.split(","):
                causal = mask == "causal"
                B, H = a.tokens // N, 2048 // D
                g = torch.Generator(device="cuda").manual_seed(N + D)
                mk = lambda: torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                         generator=g).requires_grad_(True)
                q, k, v = mk(), mk(), mk()
                do = torch.randn_like(q)
                flops_f = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                timers, case_rows = {}, {}

                def sdpa():
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

                entries = [("cudnn", "both", None)] + list(_cases(a))
                for name, part, cfg in entries:
                    if time.time() > t_end:
                        print("time budget reached")
                        break
                    row = dict(D=D, N=N, mask=mask, name=name, part=part)
                    f = sdpa if cfg is None else (lambda cfg=cfg: flash_attn(q, k, v, causal=causal, config=cfg))
                    try:
                        ref = f()
                        ref.backward(do)
                        torch.cuda.synchronize()
                        fns = {}
                        if part in ("fwd", "both"):
                            fns["fwd"] = lambda f=f: time_cuda(f)
                        if part in ("bwd", "both"):
                            def bwd(f=f):
                                out = f()
                                return time_cuda(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, v])
                            fns["bwd"] = bwd
                        for key, fn in fns.items():
                            timers[(name, key)] = fn
                            row[f"{key}_ms"] = fn()
                    except Exception as e:  # a tile that cannot compile / fit: a row that says so
                        row["error"] = error_line(e)
                    case_rows[name] = row
                    rows.append(row)
                    q.grad = k.grad = v.grad = None
                if a.rounds > 1 and timers and time.time() < t_end:
                    more = interleaved_rounds({f"{n}|{p}": t for (n, p), t in timers.items()}, a.rounds - 1)
                    for key, ms in more.items():
                        n, p = key.split("|")
                        case_rows[n][f"{p}_ms"] = statistics.median([case_rows[n][f"{p}_ms"]] + ms)
                for r in case_rows.values():
                    for p, fl in (("fwd", flops_f), ("bwd", 2.5 * flops_f)):
                        if f"{p}_ms" in r:
                            r[f"{p}_tflops"] = round(fl / r[f"{p}_ms"] / 1e9, 1)
                            c = case_rows.get("cudnn", {}).get(f"{p}_ms")
                            if c:
                                r[f"{p}_x_cudnn"] = round(c / r[f"{p}_ms"], 3)
                for p in ("fwd", "bwd"):
                    best = sorted((r for r in case_rows.values() if r.get(f"{p}_x_cudnn") and r["name"] != "cudnn"),
                                  key=lambda r: -r[f"{p}_x_cudnn"])[:4]
                    print(f"D {D} N {N} {mask} {p}: " + "; ".join(f"{r['name']} {r[f'{p}_tflops']} TF/s "
                                                             f"({r[f'{p}_x_cudnn']}x cuDNN)" for r in best))
                del q, k, v, do
                torch.cuda.empty_cache()
                write_results(rows, a.out, "short_n_sweep", env=env)  # after every case: a cut run keeps them


if __name__ == "__main__":
    main()
