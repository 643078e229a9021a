"""Benchmark: ONE sequence-mixer layer of every family (attention kinds and the registered mixers), as the model
builds it, forward and forward+backward vs sequence length, with peak memory, in one process.

Plain Python (no Hydra), from the repo root. On the H200 (bf16-mixed, every default family, N = 1k, 4k, 16k)::

    python -m eval.bench_mixers --out results/h200/<date>/mixers --time-budget-s 240

CPU smoke run (wall clock, no peak memory): ``python -m eval.bench_mixers --device cpu --out /tmp/mixers
--d-model 32 --heads 2 --seq-lens 32,64 --tokens 64``.

What one case is. ``--layers`` (default ``flash,sliding_window,linear,mamba2,deltanet,gated_deltanet,mla,linformer``)
are resolved exactly as ``train.py model.layers=[...]`` resolves them (:func:`harness.config.layer_specs`: the
spec of ``conf/attention/<name>.yaml`` unchanged, e.g. ``sliding_window`` = a 32-token window, or a registered mixer
with its default options); an unknown name raises ``ValueError`` naming ``--layers`` and the allowed values. For
every (layer, ``N`` in ``--seq-lens``) the mixer is built by :func:`attn_zoo.mixers.build_mixer`, the factory
:class:`attn_zoo.model.GPT` builds each block's mixer with, from a :class:`~attn_zoo.model.GPTConfig` of one layer
(``d_model = --d-model``, ``n_head = --heads``, ``max_seq_len = N``; the other fields at their defaults), the
model's :class:`~attn_zoo.model.Rotary` and attention backend ``--backend``, then initialised as ``GPT`` initialises
its weights (linear weights N(0, 0.02)), seed 0. The input ``x (B, N, d_model)`` is fp32 (what the block's norm
gives under mixed precision), ``B = max(1, --tokens // N)``; the mixer runs under ``torch.autocast`` in ``--dtype``
with fp32 parameters (``train.py trainer=gpu``: ``bf16-mixed``); ``--dtype fp32``: no autocast (CPU default).

* ``fwd_ms``: ``mixer(x)`` under ``torch.no_grad()``;
* ``fwd_bwd_ms``: ``mixer(x).backward(dy)``, ``dy`` a fixed random cotangent: the gradients of ``x`` and of every
  parameter (set to ``None`` before each call);
* on CUDA the median of CUDA events (:func:`eval.bench_common.time_cuda`); on CPU (``--device cpu``, a smoke run)
  the wall-clock median of 3 calls after one warm-up.

Nothing is asked of a layer by its name: whether it is causal comes from its spec (``spec.causal``; the mixer
registration's ``causal`` and a ``causal`` option). Linformer, non-causal by construction and so refused by the
causal ``GPT`` (no model numbers), runs here as a layer on its own: its row has ``causal`` False.

Columns: ``layer``, ``causal``, ``backend`` (the attention backend given; a mixer with a ``kernel`` option of its
own ignores it), ``kernel`` (the mixer's ``kernel`` attribute where it has one), ``dtype``, ``B``, ``N``,
``d_model``, ``heads``, ``params`` (the mixer's parameter count), ``fwd_ms``, ``fwd_bwd_ms``, ``fwd_ns_per_token``,
``fwd_bwd_ns_per_token`` (time / (B * N)), ``fwd_peak_mib`` / ``fwd_bwd_peak_mib`` (CUDA only: peak extra memory
above what was allocated before one forward / forward+backward, :func:`eval.bench_common.peak_memory`; the latter
counts saved activations and the gradients' allocation), ``error`` (a failing case: the exception's text, or
``OutOfMemoryError``; the sweep goes on).

Cases run by ``N`` (every layer at the first ``N``, then the next), so a budget cut drops the longest ``N``, not a
family. ``--time-budget-s`` (default 240): no new case starts after it (those rows get ``error = skipped (time
budget)``).
Rows are written to ``mixers_bench.csv`` / ``mixers_bench.json`` under ``--out`` after every case (a killed run keeps
what it measured) and at the end, where the table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import types
from typing import Dict, List, Sequence

import torch

from eval.bench_common import (add_time_budget, budget_spent, env_info, format_table, int_list, name_list, peak_memory,
                               time_cpu, time_cuda, try_call, write_csv, write_json)

DEFAULT_LAYERS = "flash,sliding_window,linear,mamba2,deltanet,gated_deltanet,mla,linformer"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
STEM = "mixers_bench"
COLUMNS = ["layer", "causal", "backend", "kernel", "dtype", "B", "N", "d_model", "heads", "params", "fwd_ms",
           "fwd_bwd_ms", "fwd_ns_per_token", "fwd_bwd_ns_per_token", "fwd_peak_mib", "fwd_bwd_peak_mib", "error"]
TABLE = ["layer", "causal", "B", "N", "params", "fwd_ms", "fwd_bwd_ms", "fwd_bwd_ns_per_token", "fwd_bwd_peak_mib",
         "error"]


def layer_specs(names: Sequence[str]) -> List:
    """The layer spec of each name, resolved as ``train.py model.layers=[...]`` is (:func:`harness.config.layer_specs`,
    the ``attention`` group at its default, flash). Raises ``ValueError`` naming ``--layers`` for an empty list or an
    unknown name (the message lists the allowed values)."""
    names = list(names)
    if not names:
        raise ValueError("--layers: give at least one layer name (a conf/attention/<name>.yaml or a registered mixer)")
    from omegaconf import OmegaConf

    from harness.config import CONF_DIR, layer_specs as conf_layer_specs

    cfg = OmegaConf.create({"attention": OmegaConf.load(CONF_DIR / "attention" / "flash.yaml"),
                            "model": {"n_layer": len(names), "layers": names}})
    try:
        return conf_layer_specs(cfg)
    except ValueError as e:  # "model.layers[i]='x' is not an attention config ...; allowed values: ..."
        raise ValueError(f"--layers {','.join(names)!r}: {e}") from None


def build_layer(spec, d_model: int, heads: int, seq_len: int, backend: str, device: str) -> torch.nn.Module:
    """One mixer as :class:`~attn_zoo.model.GPT` builds a block's: :func:`attn_zoo.mixers.build_mixer` with a one-layer
    :class:`GPTConfig` (``max_seq_len = seq_len``), the model's :class:`Rotary` and ``backend``, GPT's weight init,
    seed 0, fp32 parameters on ``device``. Raises what the config / the mixer raise for bad values."""
    from attn_zoo.mixers import build_mixer
    from attn_zoo.model import GPT, GPTConfig, Rotary

    config = GPTConfig(n_layer=1, n_head=heads, d_model=d_model, max_seq_len=seq_len)
    torch.manual_seed(0)
    rotary = Rotary(config.head_dim, config.max_seq_len, config.rope_base)
    mixer = build_mixer(spec, config, layer_idx=0, backend=backend, rotary=rotary)
    mixer.apply(lambda m: GPT._init_weights(types.SimpleNamespace(config=config), m))  # GPT's init, not a GPT
    return mixer.to(device)


def bench_case(spec, N: int, args, dev: str) -> Dict[str, object]:
    """Time one (layer, N) case; returns the measured fields (``error`` set for a failure)."""
    B = max(1, args.tokens // N)
    out: Dict[str, object] = {"B": B}
    mixer = try_call(lambda: build_layer(spec, args.d_model, args.heads, N, args.backend, dev), short_oom=dev == "cuda")
    if isinstance(mixer, str):
        return dict(out, error=mixer)
    kernel = getattr(mixer, "kernel", None)
    out["kernel"] = kernel if isinstance(kernel, str) else None
    params = [p for p in mixer.parameters() if p.requires_grad]
    out["params"] = sum(p.numel() for p in mixer.parameters())
    g = torch.Generator(device=dev).manual_seed(N)
    x = torch.randn(B, N, args.d_model, device=dev, generator=g).requires_grad_()
    amp = (torch.autocast(dev, dtype=DTYPES[args.dtype]) if args.dtype != "fp32" else contextlib.nullcontext())
    leaves = [x] + params

    def fwd():
        with amp:
            return mixer(x)

    def fwd_nograd():
        with torch.no_grad():
            return fwd()

    timer = time_cuda if dev == "cuda" else time_cpu
    so = dev == "cuda"
    y = try_call(fwd_nograd, short_oom=so)
    if isinstance(y, str):
        return dict(out, error=y)
    dy = torch.randn(y.shape, device=dev, generator=g).to(y.dtype)
    del y

    def fb():
        fwd().backward(dy)

    ms_f = try_call(lambda: timer(fwd_nograd), short_oom=so)
    if isinstance(ms_f, str):
        return dict(out, error=ms_f)
    out.update(fwd_ms=ms_f, fwd_ns_per_token=ms_f * 1e6 / (B * N))
    ms_fb = try_call(lambda: timer(fb, grad_to_none=leaves), short_oom=so)
    if isinstance(ms_fb, str):
        return dict(out, error=ms_fb)
    out.update(fwd_bwd_ms=ms_fb, fwd_bwd_ns_per_token=ms_fb * 1e6 / (B * N))
    if dev == "cuda":
        mem = try_call(lambda: peak_memory(fwd_nograd), short_oom=True)
        if isinstance(mem, int):
            out["fwd_peak_mib"] = mem / 2 ** 20
        for t in leaves:  # the peak counts the gradients' allocation too
            t.grad = None
        mem = try_call(lambda: peak_memory(fb), short_oom=True)
        if isinstance(mem, int):
            out["fwd_bwd_peak_mib"] = mem / 2 ** 20
        else:
            out["error"] = f"peak memory: {mem}"
    for t in leaves:
        t.grad = None
    return out


def save(rows: List[Dict[str, object]], out: str, env: Dict[str, object]) -> str:
    """``<out>/mixers_bench.csv`` (columns :data:`COLUMNS`) and ``.json`` of ``rows``; returns the CSV's path."""
    path = write_csv(rows, os.path.join(out, f"{STEM}.csv"), COLUMNS)
    write_json(rows, os.path.join(out, f"{STEM}.json"), env)
    return path


def main(argv=None) -> List[Dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help=f"output folder ({STEM}.csv / .json)")
    ap.add_argument("--layers", default=DEFAULT_LAYERS,
                    help="comma list of layer names as train.py model.layers=[...] takes them (conf/attention/<name> "
                         "or a registered mixer)")
    ap.add_argument("--seq-lens", default="1024,4096,16384", help="comma list of sequence lengths N")
    ap.add_argument("--tokens", type=int, default=32768, help="B * N per call (B = max(1, tokens // N))")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8, help="n_head (head_dim = d_model / heads)")
    ap.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                    help="autocast dtype with fp32 parameters (bf16 = train.py's bf16-mixed; fp32: no autocast); "
                         "default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--backend", default=None,
                    help="attention backend of the model (train.py attention_backend); default triton on cuda, torch "
                         "on cpu")
    add_time_budget(ap, 240.0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run only (wall-clock median of 3 calls, no peak memory)")
    args = ap.parse_args(argv)
    seq_lens = list(dict.fromkeys(int_list(args.seq_lens, "--seq-lens", "sequence lengths")))  # each N once
    for name in ("tokens", "d_model", "heads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not supported; allowed values: an integer "
                     ">= 1")
    if args.d_model % args.heads or (args.d_model // args.heads) % 2:  # every layer's GPTConfig would refuse it
        ap.error(f"--d-model {args.d_model} with --heads {args.heads} is not supported: head_dim = d_model / heads "
                 "must be an even integer (RoPE)")
    dev = args.device
    args.dtype = args.dtype or ("bf16" if dev == "cuda" else "fp32")
    args.backend = args.backend or ("triton" if dev == "cuda" else "torch")
    from attn_zoo.registry import backend_names

    # names before the CUDA check, as argparse's errors (they were ValueError tracebacks, after it; an empty item of
    # --layers was dropped in silence)
    if args.backend not in backend_names():
        ap.error(f"--backend {args.backend!r} is not supported; allowed values: {', '.join(backend_names())}")
    names = name_list(args.layers, "--layers", "layer names",
                      more="; each a conf/attention/<name> or a registered mixer")
    try:
        specs = layer_specs(names)
    except ValueError as e:
        ap.error(str(e))
    t_start = time.time()
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_mixers needs a CUDA device (or --device cpu for a smoke run)")
    env = env_info()
    rows: List[Dict[str, object]] = []
    for N in seq_lens:  # every layer at one N before the next: a budget cut drops the longest N, not a family
        for name, spec in zip(names, specs):
            row = {"layer": name, "causal": bool(spec.causal), "backend": args.backend, "dtype": args.dtype,
                   "N": N, "d_model": args.d_model, "heads": args.heads}
            if budget_spent(t_start, args.time_budget_s, f"{name} N={N}"):
                rows.append(dict(row, B=max(1, args.tokens // N), error="skipped (time budget)"))
                continue
            row.update(bench_case(spec, N, args, dev))
            rows.append(row)
            print(row, flush=True)
            if dev == "cuda":
                torch.cuda.empty_cache()
            save(rows, args.out, env)
    print(format_table(rows, TABLE))
    print("wrote", save(rows, args.out, env))
    return rows


if __name__ == "__main__":
    main()
