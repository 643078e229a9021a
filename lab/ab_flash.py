"""GPU: before / after timing of the exact-attention kernel, the same script on two checkouts.

Times ``kernels.flash_attn`` called directly (no backend adapter, default settings) and, in the same process,
SDPA-cuDNN as the anchor that cancels clock / machine drift between runs, for causal / non-causal / window /
BigBird / GQA / MQA cases (bf16, D = 128, H = 16, 16k tokens): forward, backward and forward + backward ms
(median of ``triton.testing.do_bench``), the fwd+bwd GPU time alone (CUDA-graph replay) and the host time to
enqueue one fwd+bwd (``host_us``). It only uses names both layouts of ``kernels`` have (``flash_attn``, the
backend's ``_sparse_tables``), so it runs unchanged against a checkout from before the kernel split::

    python -m lab.ab_flash --out /tmp/ab --tag after                        # this checkout
    PYTHONPATH=/path/to/old/checkout python lab/ab_flash.py --out /tmp/ab --tag before   # the old kernels
    python -m lab.ab_flash --compare /tmp/ab/before.json /tmp/ab/after.json

Run them alternately (before, after, before, after) and compare ``x_cudnn`` (cuDNN ms / ours ms) and
``graph_ms``; ``--compare`` prints after / before per case and column.
"""

from __future__ import annotations

import argparse
import json
import os
import time

CASES = [  # (name, N, Hkv)
    ("causal", 512, 16), ("causal", 4096, 16), ("causal", 16384, 16), ("noncausal", 4096, 16),
    ("win1024", 16384, 16), ("bigbird", 4096, 16), ("bigbird", 16384, 16), ("gqa4", 4096, 4), ("mqa", 16384, 1),
]
SPECS = {
    "causal": dict(kind="flash", causal=True),
    "noncausal": dict(kind="flash", causal=False),
    "win1024": dict(kind="sliding_window", causal=True, window_size=(1023, 0)),
    "bigbird": dict(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=128, num_local_blocks=2,
                    num_global_blocks=1, num_random_blocks=2),
    "gqa4": dict(kind="flash", causal=True),
    "mqa": dict(kind="flash", causal=True),
}
H, D, TOKENS = 16, 128, 16384
COLS = ("fwd_ms", "bwd_ms", "fwd_bwd_ms", "graph_ms", "host_us", "x_cudnn")


def ours(name: str, N: int):
    import torch

    from attn_zoo import AttentionSpec, mask_info
    from attn_zoo.backends.triton_flash import _sparse_tables
    from kernels import flash_attn

    spec = AttentionSpec(**SPECS[name])
    mi = mask_info(spec, N, N)
    window = (mi.window_left, mi.window_right) if (mi.window_left is not None or mi.window_right is not None) else None
    kw = {}
    if mi.layout is not None:
        layout, tables = _sparse_tables(spec, N, N, D, torch.device("cuda"))
        kw = dict(block_layout=layout, block_size=mi.block_size, block_tables=tables)
    return lambda q, k, v: flash_attn(q, k, v, causal=mi.causal, window_size=window, **kw)


def cudnn(causal: bool):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return f


def measure(f, q, k, v, do, graph=True):
    from eval.bench_common import host_us, time_cuda, time_cuda_graph

    f(q, k, v).backward(do)
    r = {"fwd_ms": time_cuda(lambda: f(q, k, v))}
    out = f(q, k, v)
    r["bwd_ms"] = time_cuda(lambda: out.backward(do, retain_graph=True), grad_to_none=[q, k, v])
    out = None  # noqa: F841  (the fwd+bwd timing runs without the retained graph)
    fb = lambda: f(q, k, v).backward(do)  # noqa: E731
    r["fwd_bwd_ms"] = time_cuda(fb, grad_to_none=[q, k, v])
    if graph:
        try:
            r["graph_ms"] = time_cuda_graph(fb)
        except Exception as e:  # noqa: BLE001 - a capture that fails is reported, not fatal
            r["graph_error"] = f"{type(e).__name__}: {str(e)[:80]}"
        r["host_us"] = host_us(fb, 50)
    q.grad = k.grad = v.grad = None
    return r


def run(out_dir: str, tag: str):
    import torch

    import kernels

    layout = "split (kernels/flash/)" if hasattr(kernels, "FlashConfig") else "single file (kernels/flash.py)"
    rows = []
    t0 = time.time()
    for name, N, hkv in CASES:
        B = max(TOKENS // N, 1)
        g = torch.Generator(device="cuda").manual_seed(N)
        mk = lambda h: torch.randn(B, h, N, D, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        q, k, v, do = mk(H).requires_grad_(True), mk(hkv).requires_grad_(True), mk(hkv).requires_grad_(True), mk(H)
        row = dict(case=f"{name}_{N}", B=B, Hkv=hkv, **measure(ours(name, N), q, k, v, do))
        anchor = measure(cudnn(SPECS[name]["causal"]), q, k, v, do, graph=False)
        row["cudnn_fwd_bwd_ms"] = anchor["fwd_bwd_ms"]
        row["x_cudnn"] = anchor["fwd_bwd_ms"] / row["fwd_bwd_ms"]
        rows.append(row)
        print(f"[{time.time() - t0:5.0f}s] " + "  ".join(f"{c}={row[c]:.4g}" if isinstance(row.get(c), float) else
                                                        f"{c}={row.get(c)}" for c in ("case",) + COLS), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{tag}.json")
    with open(path, "w") as f:
        json.dump({"tag": tag, "kernels": layout, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"wrote {path} ({layout})")


def compare(a_path: str, b_path: str):
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    rb = {r["case"]: r for r in b["rows"]}
    print(f"{b['tag']} / {a['tag']} ({b['kernels']} / {a['kernels']}): ms / us columns > 1 mean {b['tag']} is slower, "
          f"x_cudnn > 1 means {b['tag']} is faster")
    print(f"{'case':14s} " + " ".join(f"{c:>10s}" for c in COLS))
    for r in a["rows"]:
        s = rb.get(r["case"])
        if s is None:
            continue
        print(f"{r['case']:14s} " + " ".join(f"{s[c] / r[c]:10.3f}" if r.get(c) and s.get(c) else f"{'-':>10s}"
                                             for c in COLS))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/ab_flash")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"))
    a = ap.parse_args(argv)
    if a.compare:
        compare(*a.compare)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("ab_flash needs a CUDA device")
    run(a.out, a.tag)


if __name__ == "__main__":
    main()
