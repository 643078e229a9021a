"""Where the SSD scan's time goes (lab: not installed): per-kernel CUDA time of ours and fla's chunked simple-GLA
(guard lifted, a time anchor) forward+backward, from torch.profiler, on the workload of ``eval.bench_ssd``.

    python3 -m lab.ssd_profile --lengths 2048,16384 [--state-pass parallel,sequential,auto] [--legacy]
        [--out-group] > ssd_profile.txt
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from eval.bench_common import int_list
from eval.bench_ssd import _FlaNoGuard, make_methods, ours_variants


def profile(fn, steps: int = 5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(ev.name, [0.0, 0])
            r[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            r[1] += 1
    total = sum(v[0] for v in rows.values()) / steps
    print(f"  total {total / 1e3:.3f} ms per step")
    for name, (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:24]:
        print(f"  {us / steps / 1e3:8.3f} ms  x{n // steps:<3d} {name[:110]}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048,16384")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--state-pass", default="parallel")
    ap.add_argument("--legacy", action="store_true", help="also ours_legacy (fp32 snapshots, one-step output kernel)")
    ap.add_argument("--out-group", action="store_true", help="also ours_group / ours_seq_group (out_mode='group')")
    a = ap.parse_args(argv)
    lengths = int_list(a.lengths, "--lengths", "sequence lengths")  # before any GPU work
    dev = torch.device("cuda")
    ours = ours_variants(a.state_pass.split(","), [(64, 64)], a.legacy, a.out_group)
    for N in lengths:
        B = max(1, a.tokens // N)
        notes = set()
        M = make_methods(B, 16, N, 64, 128, torch.bfloat16, dev, notes, fla_noguard=True, ours=ours)
        for name in [*ours, "fla_simple_gla_noguard"]:
            if name not in M:
                print(f"N={N} {name}: not available {notes}")
                continue
            fwd, ins = M[name]
            do = torch.randn_like(fwd())

            def fb():
                for t in ins:
                    t.grad = None
                fwd().backward(do)

            for label, fn in (("fwd", fwd), ("fwd+bwd", fb)):
                print(f"N={N} B={B} {name} {label}:")
                with (_FlaNoGuard() if name.endswith("_noguard") else contextlib.nullcontext()):
                    profile(fn)
        del M
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
