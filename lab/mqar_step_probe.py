"""Time one MQAR training step of the fig-2 model with the head on every row (dense) and on the query rows only
(``GPT.forward(sparse_targets=True)``, what ``train.py`` runs for MQAR), alone on the GPU, in one process.

The model is ``experiment=mqar_fig2``'s: 2 layers, 4 heads, vocabulary 8,192, batch 256, bf16 autocast, fused
AdamW, key-value pairs = seq_len / 16 (the scored rows are 1/16 of the positions). For each (d_model, seq_len) and
head mode: the GPU time of a step (CUDA events around ``reps`` steps, after ``warmup`` steps) and its host time
(wall time of the same steps without synchronising inside). Lab code, not installed::

    python -m lab.mqar_step_probe --out results/h200/<date>/mqar_step_probe.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from harness.data import generate_mqar
from attn_zoo.model import GPT, GPTConfig
from attn_zoo.spec import AttentionSpec


def time_steps(d_model: int, seq_len: int, sparse: bool, warmup: int = 10, reps: int = 40, batch: int = 256,
               vocab: int = 8192, device: str = "cuda") -> dict:
    """GPU and host milliseconds per training step (forward, backward, clipping-free fused AdamW step)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, n_layer=2, n_head=4, d_model=d_model, max_seq_len=seq_len, mlp="swiglu",
                    norm="rmsnorm")
    model = GPT(cfg, AttentionSpec(kind="flash", causal=True)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
    x, y = generate_mqar(batch, seq_len, vocab, seq_len // 16, seed=0)  # (B, N) int64 each
    x, y = x.to(device), y.to(device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            _, loss = model(x, y, sparse_targets=sparse)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        step()
    end.record()
    host = (time.perf_counter() - t0) / reps * 1e3
    torch.cuda.synchronize()
    return {"d_model": d_model, "seq_len": seq_len, "head": "scored rows" if sparse else "all rows",
            "gpu_ms": start.elapsed_time(end) / reps, "host_ms": host,
            "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for the rows")
    ap.add_argument("--shapes", default="64x64,128x128,128x256,256x256,512x512",
                    help="d_model x seq_len pairs, comma-separated (default: %(default)s)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("lab.mqar_step_probe needs a CUDA GPU")
    rows = []
    for shape in args.shapes.split(","):
        d, n = (int(v) for v in shape.split("x"))
        for sparse in (False, True):
            torch.cuda.reset_peak_memory_stats()
            rows.append(time_steps(d, n, sparse))
            print(json.dumps(rows[-1]), flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
