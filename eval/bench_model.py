"""Model-level training speed: the GPT trained for a fixed number of steps in one process, per variant x backend x
seq_len, after warm-up.

What one step is (the same as ``train.py trainer=gpu``): bf16 autocast forward of :class:`attn_zoo.model.GPT` on
random tokens (ids ``< --vocab``), cross-entropy, backward, gradient-norm clipping at 1.0, the AdamW ``LitLM`` uses
on CUDA (:func:`harness.lit.adamw_impl`: fused) with weight decay on matrices, ``zero_grad(set_to_none=True)``. The
number of tokens per step is constant (``B = tokens // seq_len``; inputs ``(B, seq_len)`` int64).

Backends, timed in the same process:
  * ``triton``: our kernels (every variant);
  * ``torch``: what a user picks instead: SDPA with PyTorch's default choice (flash / GQA / MQA), compiled
    FlexAttention (window, BigBird), the chunked PyTorch form (linear);
  * ``sdpa_flash`` / ``sdpa_cudnn``: the registry's SDPA anchors, SDPA forced to FlashAttention-2 / cuDNN (exact
    kinds only). The SDPA backend PyTorch picks by default is recorded in the ``sdpa_default`` column.
  * any other registered backend by name (``--backends``: e.g. the anchors ``fa4``, ``flex_fa4``, ``fla``; one
    whose package is missing is refused before any GPU work, naming the package and the pyproject extra:
    :func:`not_installed`), and every backend a ``--plugins``
    module registers; a
    backend whose ``supports()`` refuses a layer of a variant is skipped for it (a hybrid runs on a backend only
    when it supports every layer: no SDPA anchor for a hybrid with a window or linear layer).

Model sizes: ``large`` = d_model 1024, 8 layers, 8 heads (D = 128), SwiGLU, RMSNorm; ``small`` = ``conf/model/small``
(d_model 128, 4 layers, 4 heads, D = 32). Vocabulary ``--vocab`` (default 256, bytes; the MQAR experiments use
8192, where the tied embedding / LM head ``(vocab, d_model)`` is a large part of a small model's step).

Variants (``--variants``):
  * a plain name: the same layer in every layer, ``conf/attention/<name>.yaml`` except the window (1024 tokens,
    causal) and BigBird (block 128, 2 local / 1 global / 2 random blocks), sized as in ``eval/bench_flash.py``
    (:data:`VARIANTS`); with ``--specs conf`` exactly ``conf/attention/<name>.yaml`` (what ``train.py
    attention=<name>`` trains: a speed to join with those runs in ``eval.quality speed=<csv>``);
  * a hybrid ``a+b+...``: one layer name per layer (as many as the size's ``n_layer``), each resolved as
    ``train.py model.layers=[a,b,...]`` resolves it (:func:`harness.config.layer_specs`: ``conf/attention/<name>.yaml``
    unchanged, e.g. ``sliding_window`` = a 32-token window, or a registered mixer), i.e. the model the hybrid
    runs of ``conf/experiment/mqar_hybrid.yaml`` trained. The row's ``variant`` is the spec as given, also when
    every layer is the same (``linear+linear+linear+linear``): what ``eval.recall hybrid speed=<csv>`` joins on.

Columns: ``size``, ``variant``, ``seq_len``, ``backend``, ``batch``, ``tokens_per_step``, ``vocab``, ``specs``,
``tokens_per_s`` (median step), ``step_ms`` (median), ``step_ms_min``, ``peak_mem_mib`` (MiB,
``max_memory_allocated`` over the timed steps: weights, AdamW state, activations), ``n_params``,
``ratio_vs_<backend>`` (tokens/s of the row over that backend's at the same size / variant / seq_len),
``step_ms_reps`` (every timed step's ms, ';'-joined in the order run: what :mod:`eval.best` resamples for the n*
intervals of ``eval.quality``), ``rounds`` / ``step_ms_spread`` (below), ``check_ok`` / ``check_err`` (the
correctness check below; ``check_error`` when it raised).

Rounds (``--rounds``, default 3): every backend of a case is timed once per round, each time on a fresh model
(``--warmup`` then ``--steps`` steps), the backends in rotating order from round to round, and the row is the median
step over all rounds (:func:`merge_rounds`; ``step_ms_spread`` = (max - min) / median of the rounds' medians). The
GPU is shared and its speed drifts: one back-to-back pass charges the drift to whichever backend ran last.

Correctness check (default on; ``--no-check`` leaves the cells empty = "unchecked"), once per (size, variant,
backend, seq_len), before and outside the timed steps (:func:`check_case`): each distinct attention layer of the
variant called through ``attention(q, k, v, spec, backend=...)`` on one random bf16 sequence ``(1, H, seq_len, D)``
and compared with the fp32 reference by the speed sweep's own check (:func:`eval.sweep.check_point`: ``check_err``
= max |out - ref| / max(1, max |ref|) at 128 query rows, ``check_ok`` when ``<= --check-tol``, default the sweep's
:data:`eval.sweep.CHECK_TOL` of the dtype, 5e-2 for bf16). ``eval.quality compare=best`` never takes a backend
whose check failed. Mixer layers (not attention) do not go through the backend and are not checked; with
``--compile`` the uncompiled backend is checked.

Usage (GPU): ``python -m eval.bench_model --out results/h200/model_speed [--sizes large,small]
[--seq-lens 512,1024,2048,4096,8192,16384] [--variants flash,sliding_window,sparse,linear,gqa,mqa]
[--backends triton,torch,sdpa_flash,sdpa_cudnn] [--plugins my_module] [--tokens 16384] [--steps 10] [--warmup 3]
[--rounds 3]
[--vocab 256] [--specs bench|conf] [--profile] [--no-check] [--check-tol 0.05]``

The hybrids of ``conf/experiment/mqar_hybrid.yaml`` (small model, vocab 8192, batch 256 at seq_len 256), for
``python -m eval.recall hybrid ... speed=results/h200/<date>/hybrid_speed/model_speed.csv``::

    L=linear; W=sliding_window; F=flash
    V=$L+$L+$L+$L,$L+$L+$L+$F,$L+$L+$F+$F,$L+$F+$F+$F,$W+$W+$W+$W,$W+$W+$W+$F,$W+$W+$F+$F,$W+$F+$F+$F,$F+$F+$F+$F
    python -m eval.bench_model --out results/h200/<date>/hybrid_speed --sizes small --vocab 8192 --tokens 65536 \\
        --seq-lens 256,2048 --backends triton --variants $V
"""

from __future__ import annotations

import argparse
import math
import os
import time
import traceback
from typing import Dict, List, Optional

import torch

from attn_zoo import make_spec
from harness.lit import adamw_impl, clip_gradients_
from attn_zoo.mixers import LayerSpec
from attn_zoo.model import GPT, GPTConfig, ModelConfig
from attn_zoo.spec import AttentionSpec
from eval.bench_common import add_time_budget, budget_spent, int_list

SIZES = {
    "large": dict(d_model=1024, n_layer=8, n_head=8, mlp="swiglu", norm="rmsnorm"),
    "small": dict(d_model=128, n_layer=4, n_head=4, mlp="swiglu", norm="rmsnorm"),
}
VARIANTS = {
    "flash": dict(kind="flash", causal=True),
    "sliding_window": dict(kind="sliding_window", causal=True, window_size=(1023, 0)),
    "sparse": dict(kind="sparse", causal=True, sparse_pattern="bigbird", block_size=128, num_local_blocks=2,
                   num_global_blocks=1, num_random_blocks=2),
    "linear": dict(kind="linear", causal=True, feature_map="elu1", chunk_size=64),
    "gqa": dict(kind="flash", causal=True, kv_group_size=2),
    "mqa": dict(kind="flash", causal=True, n_kv_heads=1),
}
EXACT = ("flash", "gqa", "mqa")
HYBRID_SEP = "+"  # a hybrid variant: one layer name per layer, "linear+linear+linear+flash"


SPEC_SOURCES = ("bench", "conf")


def variant_specs(size: str, variant: str, specs: str = "bench") -> List[LayerSpec]:
    """The ``n_layer`` layer specs of ``variant`` at model ``size``.

    A plain name: with ``specs="bench"`` its :data:`VARIANTS` spec (the speed sweep's sizes: a 1,024-token window,
    128-token BigBird blocks), with ``specs="conf"`` its ``conf/attention/<name>.yaml`` (what ``train.py
    attention=<name>`` trains, e.g. the 32-token window), in every layer. A hybrid ``a+b+...``: one name per layer, resolved
    by :func:`harness.config.layer_specs` as ``train.py model.layers=[a,b,...]`` is (the ``attention`` group at its default,
    flash, as in the MQAR hybrid runs), so the model is the one those runs trained.

    Raises ``ValueError`` naming ``--variants``: an unknown plain name, a hybrid with another number of layers than
    the size's ``n_layer``, an unknown layer name (the message lists the allowed ones).
    """
    n_layer = SIZES[size]["n_layer"]
    if specs not in SPEC_SOURCES:
        raise ValueError(f"--specs: {specs!r} not supported; allowed values: {', '.join(SPEC_SOURCES)}")
    if HYBRID_SEP not in variant and specs == "conf":
        return _conf_layer_specs(size, variant, [variant] * n_layer)
    if HYBRID_SEP not in variant:
        if variant not in VARIANTS:
            raise ValueError(f"--variants: {variant!r} not supported; allowed values: {', '.join(VARIANTS)}, or a "
                             f"hybrid of one conf/attention name per layer joined by '{HYBRID_SEP}'")
        return [make_spec(**VARIANTS[variant])] * n_layer
    names = variant.split(HYBRID_SEP)
    if len(names) != n_layer:
        raise ValueError(f"--variants: hybrid {variant!r} has {len(names)} layers but --sizes {size} has "
                         f"n_layer={n_layer}; give one layer name per layer")
    return _conf_layer_specs(size, variant, names)


def _conf_layer_specs(size: str, variant: str, names: List[str]) -> List[LayerSpec]:
    """One spec per layer name from ``conf/attention`` (:func:`harness.config.layer_specs`, as
    ``model.layers=[...]``)."""
    n_layer = len(names)
    from omegaconf import OmegaConf

    from harness.config import CONF_DIR, layer_specs

    cfg = OmegaConf.create({"attention": OmegaConf.load(CONF_DIR / "attention" / "flash.yaml"),
                            "model": {"n_layer": n_layer, "layers": names}})
    try:
        return layer_specs(cfg)
    except ValueError as e:  # "model.layers[i]='x' is not an attention config ...; allowed values: ..."
        kind = "hybrid " if HYBRID_SEP in variant else ""
        raise ValueError(f"--variants: {kind}{variant!r}: {e}") from None


def default_backends() -> List[str]:
    """The default ``--backends``: the product backends ``auto`` picks on a GPU (``triton``, ``torch``) and the
    registry's SDPA anchors that run exact attention in a model (``sdpa_flash``, ``sdpa_cudnn``); any registered
    backend (:func:`attn_zoo.registry.backend_names`, plugins' included) can be named."""
    from attn_zoo.registry import backend_names

    names = backend_names()
    return [b for b in ("triton", "torch", "sdpa_flash", "sdpa_cudnn") if b in names]


def not_installed(backends: List[str], kinds) -> List[str]:
    """``"<backend>: <reason>"`` for each of ``backends`` whose optional package cannot be imported here (the
    registry's ``available()`` reason, which names the package and the pyproject extra), asked for the attention
    ``kinds`` of the benched variants; backends that serve none of them, or that lack only a GPU, are not listed."""
    from attn_zoo.registry import get_backends

    out = []
    for name in backends:
        for kind in sorted(kinds):
            b = get_backends(kind).get(name)
            why = b.unavailable() if b is not None else None
            if why is not None and "cannot be imported" in why:
                out.append(f"{name}: {why}")
                break
    return out


def runs_variant(backend: str, variant: str, size: str, seq_len: int, tokens: int, device: str = "cuda",
                 specs: str = "bench") -> bool:
    """Whether registry backend ``backend`` can run every attention layer of ``variant`` at this size (its
    ``supports()`` on bf16 ``(B, H, seq_len, D)`` tensors of the layer's shapes on ``device``): the anchors that
    cannot (SDPA for windows / layouts / linear layers, hybrids holding one) are skipped. Layers that are not
    attention (mixers) do not go through the backend registry."""
    from attn_zoo.registry import get_backends

    H = SIZES[size]["n_head"]
    D = SIZES[size]["d_model"] // H
    B = max(1, tokens // seq_len)
    mk = lambda h: torch.empty(B, h, seq_len, D, device=device, dtype=torch.bfloat16)  # noqa: E731
    for spec in dict.fromkeys(variant_specs(size, variant, specs)):  # each distinct layer once
        if not isinstance(spec, AttentionSpec):
            continue
        b = get_backends(spec.kind).get(backend)
        hkv = spec.resolve_kv_heads(H)
        if b is None or b.why_not(mk(H), mk(hkv), mk(hkv), spec) is not None:
            return False
    return True


def sdpa_default_backend(B: int, H: int, N: int, D: int, Hkv: Optional[int] = None) -> str:
    """The SDPA backend PyTorch picks for causal bf16 ``(B, H, N, D)`` on this GPU, read from the kernel names of
    one profiled forward + backward (``flash``, ``cudnn``, ``efficient``, ``math`` or ``unknown``)."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    Hkv = Hkv or H
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H).sum().backward()
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    for tag, keys in (("cudnn", ("cudnn", "sm90_flash", "fprop", "dprop")), ("flash", ("flash",)),
                      ("efficient", ("fmha", "efficient", "cutlass")), ("math", ("bmm", "softmax"))):
        if any(key in names for key in keys):
            return tag
    return "unknown"


def make_model(size: str, variant: str, seq_len: int, backend: str, vocab: int = 256, device: str = "cuda",
               specs: str = "bench") -> GPT:
    """The GPT of ``size`` with ``variant``'s layers (:func:`variant_specs` from ``specs``), ``vocab`` tokens,
    seed 0, on ``device``."""
    model_cfg = ModelConfig(GPTConfig(vocab_size=vocab, max_seq_len=seq_len, **SIZES[size]),
                            variant_specs(size, variant, specs))
    torch.manual_seed(0)
    return GPT.from_config(model_cfg, backend=backend).to(device)


def make_optimizer(model: torch.nn.Module, lr: float = 1e-3, weight_decay: float = 0.1):
    """AdamW as :meth:`harness.lit.LitLM.configure_optimizers` builds it on CUDA (bf16-mixed: no scaler)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    impl = adamw_impl("cuda", None)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), **({} if impl == "default" else {impl: True}))


def train_steps(model: GPT, opt, x: torch.Tensor, y: torch.Tensor, n: int, clip: float = 1.0) -> List[float]:
    """Run ``n`` training steps; returns each step's wall time in ms (synchronised before and after)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        clip_gradients_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(float(loss)):
            raise FloatingPointError(f"loss is {float(loss)}")
    return times


def check_case(size: str, variant: str, seq_len: int, backend: str, specs: str = "bench", device: str = "cuda",
               dtype: torch.dtype = torch.bfloat16, check_tol: Optional[float] = None, check_rows: int = 128,
               seed: int = 0) -> Dict[str, object]:
    """The correctness check of one case (module docstring): every distinct attention layer of ``variant`` at
    ``size`` run through ``attention(..., backend=backend)`` on random ``q (1, H, seq_len, D)``, ``k, v (1, Hkv,
    seq_len, D)`` of ``dtype`` on ``device``, checked by :func:`eval.sweep.check_point` (the sweep's fp32 reference
    rows, error measure and tolerance: ``check_tol``, default :data:`eval.sweep.CHECK_TOL` of ``dtype``).

    Returns ``{"check_ok": bool, "check_err": float}`` (all layers must pass; the largest error), plus
    ``check_error`` (the first failure's message) when a call raised; ``{}`` when no layer has a reference form
    (a variant of mixers only: unchecked). Never raises for a backend's failure: that is ``check_ok=False``."""
    from attn_zoo import attention
    from eval.sweep import check_point

    H = SIZES[size]["n_head"]
    D = SIZES[size]["d_model"] // H
    cfg = {"check_rows": check_rows, "check_tol": check_tol}
    results = []
    for i, spec in enumerate(dict.fromkeys(variant_specs(size, variant, specs))):  # each distinct layer once
        if not isinstance(spec, AttentionSpec):
            continue
        hkv = spec.resolve_kv_heads(H)
        try:
            g = torch.Generator(device=device).manual_seed(seed + i)
            q, k, v = (torch.randn(1, h, seq_len, D, generator=g, device=device, dtype=dtype) for h in (H, hkv, hkv))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded, the timing goes on
            results.append({"check_ok": False, "check_err": float("nan"),
                            "error": f"check: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]})
            continue
        res = check_point(spec, lambda q, k, v, s=spec: attention(q, k, v, s, backend=backend), q, k, v, cfg)
        if res:
            results.append(res)
        del q, k, v
    if not results:
        return {}
    errs = [float(r["check_err"]) for r in results]
    out: Dict[str, object] = {"check_ok": all(bool(r["check_ok"]) for r in results),
                              "check_err": max(errs) if all(math.isfinite(e) for e in errs) else float("nan")}
    fails = [r["error"] for r in results if r.get("error")]
    if fails:
        out["check_error"] = fails[0]
    return out


def bench_one(size: str, variant: str, seq_len: int, backend: str, tokens: int, steps: int, warmup: int,
              profile_dir: Optional[str] = None, compile: bool = False, vocab: int = 256,
              specs: str = "bench") -> Dict[str, object]:
    B = max(1, tokens // seq_len)
    model = make_model(size, variant, seq_len, backend, vocab, specs=specs)
    opt = make_optimizer(model)
    n_params = model.num_params()
    if compile:  # as train.py compile=true: the model, not the optimiser step
        model = torch.compile(model)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, vocab, (B, seq_len), device="cuda", generator=g)
    y = torch.randint(0, vocab, (B, seq_len), device="cuda", generator=g)
    train_steps(model, opt, x, y, warmup)
    torch.cuda.reset_peak_memory_stats()
    times = train_steps(model, opt, x, y, steps)
    peak = torch.cuda.max_memory_allocated() / 2**20
    reps = ";".join(f"{t:.3f}" for t in times)  # every timed step, in order (eval.quality's n* intervals)
    if profile_dir:
        _profile(model, opt, x, y, os.path.join(profile_dir, f"profile_{size}_{variant}_{seq_len}_{backend}.txt"))
    times.sort()
    med = times[len(times) // 2]
    row = dict(size=size, variant=variant, seq_len=seq_len, backend=backend + ("+compile" if compile else ""), batch=B,
               tokens_per_step=B * seq_len, vocab=vocab, specs=specs, step_ms=round(med, 3), step_ms_min=round(times[0], 3),
               tokens_per_s=round(B * seq_len / med * 1e3), peak_mem_mib=round(peak, 1), n_params=n_params,
               step_ms_reps=reps)
    del model, opt
    torch.cuda.empty_cache()
    return row


def merge_rounds(rounds: List[Dict[str, object]]) -> Dict[str, object]:
    """One row from the rows :func:`bench_one` gave for the same case and backend in ``len(rounds)`` rounds (each a
    fresh model timed for ``--steps`` steps, the backends in rotating order): ``step_ms`` the median over every timed
    step of every round, ``step_ms_min`` the fastest, ``tokens_per_s`` from that median, ``peak_mem_mib`` the
    largest, ``step_ms_reps`` all steps in the order run, ``rounds`` and ``step_ms_spread`` ((max - min) / median
    of the rounds' own medians: how far apart the rounds were). A round that failed makes the row that failure
    (its ``error``, with ``rounds`` the rounds done before it); one round is returned as it is."""
    failed = next((r for r in rounds if "error" in r), None)
    if failed is not None:
        return dict(failed, rounds=rounds.index(failed))
    if len(rounds) == 1:
        return dict(rounds[0])
    times = [float(t) for r in rounds for t in str(r["step_ms_reps"]).split(";")]
    med = sorted(times)[len(times) // 2]  # bench_one's convention (the upper median)
    per_round = [float(r["step_ms"]) for r in rounds]
    row = dict(rounds[0])
    row.update(step_ms=round(med, 3), step_ms_min=round(min(times), 3),
               tokens_per_s=round(int(row["tokens_per_step"]) / med * 1e3),
               peak_mem_mib=max(float(r["peak_mem_mib"]) for r in rounds),
               step_ms_reps=";".join(str(r["step_ms_reps"]) for r in rounds), rounds=len(rounds),
               step_ms_spread=round((max(per_round) - min(per_round)) / med, 4))
    return row


def _profile(model, opt, x, y, path: str) -> None:
    """torch.profiler table of 3 steps (CPU and CUDA time per op) to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train_steps(model, opt, x, y, 3)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40))
        f.write("\n\n")
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))


def add_ratios(rows: List[Dict[str, object]], backends) -> None:
    """``ratio_vs_<b>``: tokens/s of each row over backend ``b``'s at the same size, variant and seq_len."""
    index = {(r["size"], r["variant"], r["seq_len"], r["backend"]): r for r in rows if "tokens_per_s" in r}
    for r in rows:
        if "tokens_per_s" not in r:
            continue
        for b in backends:
            o = index.get((r["size"], r["variant"], r["seq_len"], b))
            if o is not None and o is not r:
                r[f"ratio_vs_{b}"] = round(r["tokens_per_s"] / o["tokens_per_s"], 3)


def parse_list(s: str, allowed=None, name: str = "variants") -> List[str]:
    """The names of ``--<name>`` (:func:`eval.bench_common.name_list`): an empty list or item (``large,,small``:
    dropped in silence; ``--sizes ''``: nothing run, exit 0) or, with ``allowed``, a name not in it: ``SystemExit``
    naming the flag and the allowed values."""
    from eval.bench_common import name_list

    return name_list(s, f"--{name}", name, allowed)


def main(argv=None) -> List[Dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (model_speed.csv / .json)")
    ap.add_argument("--sizes", default="large,small")
    ap.add_argument("--seq-lens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"plain names ({', '.join(VARIANTS)}) or hybrids of one conf/attention name per layer "
                         f"joined by '{HYBRID_SEP}' (e.g. linear+linear+linear+flash)")
    ap.add_argument("--backends", default=None, help="registry backend names (default: triton,torch,sdpa_flash,"
                                                       "sdpa_cudnn) plus every backend of --plugins")
    ap.add_argument("--plugins", default=None, help="comma-separated modules that register backends (timed too) "
                                                      "or mixers (hybrid layer names)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch = tokens // seq_len)")
    ap.add_argument("--vocab", type=int, default=256, help="vocabulary size (embedding / LM head rows; MQAR: 8192)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="time each backend this many times per case (a fresh model, --warmup then --steps steps "
                         "each round), the backends in rotating order; rows give the median step over all rounds "
                         "and step_ms_spread (1: once each, back to back)")
    ap.add_argument("--profile", action="store_true", help="also write a torch.profiler table per row")
    ap.add_argument("--name", default="model_speed", help="file stem of the results")
    add_time_budget(ap)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (backend names get +compile)")
    ap.add_argument("--specs", default="bench", choices=SPEC_SOURCES,
                    help="plain variant names: bench = the speed sweep's specs (VARIANTS), conf = "
                         "conf/attention/<name>.yaml, what train.py trains (to join with training runs)")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the correctness check (check_ok / check_err left empty: unchecked)")
    ap.add_argument("--check-tol", type=float, default=None,
                    help="check tolerance on max rel err (default: eval.sweep.CHECK_TOL of bf16, 0.05)")
    a = ap.parse_args(argv)
    seq_lens = int_list(a.seq_lens, "--seq-lens", "sequence lengths")
    if a.steps < 1 or a.warmup < 1 or a.tokens < 1 or a.vocab < 1 or a.rounds < 1:
        raise SystemExit("--steps, --warmup, --tokens, --vocab and --rounds must be >= 1")
    if not a.name.strip() or "/" in a.name or os.sep in a.name:  # '' wrote the hidden files <out>/.csv, .json
        raise SystemExit(f"--name {a.name!r} is not supported; allowed values: a file stem (no folder), e.g. "
                         f"model_speed")
    if a.check_tol is not None and not (math.isfinite(a.check_tol) and a.check_tol > 0):
        raise SystemExit(f"--check-tol must be a finite number > 0 (max rel err allowed; default 0.05 for bf16), got "
                         f"{a.check_tol}")
    from attn_zoo.registry import backend_names, backends_from, load_plugins
    from eval.bench_common import env_info, format_table, require_cuda, write_results

    try:
        plugins = load_plugins(a.plugins)  # before the variants: a hybrid may name a mixer a plugin registers
    except ImportError as e:  # was an ImportError traceback
        raise SystemExit(f"--plugins {a.plugins!r}: {e}") from None
    sizes = parse_list(a.sizes, SIZES, "sizes")
    variants = parse_list(a.variants)
    for size in sizes:  # every variant at every size, before any GPU work
        for variant in variants:
            try:
                variant_specs(size, variant, a.specs)
            except ValueError as e:
                raise SystemExit(str(e)) from None
    backends = parse_list(a.backends, backend_names(), "backends") if a.backends is not None else \
        default_backends()
    backends += [b for b in backends_from(plugins) if b not in backends]
    kinds = {s.kind for size in sizes for variant in variants for s in variant_specs(size, variant, a.specs)
             if isinstance(s, AttentionSpec)}
    missing = not_installed(backends, kinds)
    if missing:  # an anchor asked for by name is never dropped in silence
        raise SystemExit("--backends: not installed here: " + "; ".join(missing))
    require_cuda("bench_model")
    t_start = time.time()
    env = env_info()
    rows: List[Dict[str, object]] = []
    default_backend = {}
    for size in sizes:
        for variant in variants:
            for n in seq_lens:
                case, checks = [], {}
                for backend in backends:
                    if not runs_variant(backend, variant, size, n, a.tokens, specs=a.specs):
                        continue
                    if budget_spent(t_start, a.time_budget_s, f"{size} {variant} N={n} {backend}"):
                        rows.append(dict(size=size, variant=variant, seq_len=n, backend=backend,
                                         error="skipped (time budget)"))
                        continue
                    chk = check_case(size, variant, n, backend, a.specs, check_tol=a.check_tol) if a.check else {}
                    if chk:
                        torch.cuda.empty_cache()
                    case.append(backend)
                    checks[backend] = chk
                timed = {b: [] for b in case}
                for r in range(a.rounds):  # each round: every backend once, a fresh model, in rotating order
                    k = r % len(case) if case else 0
                    for backend in case[k:] + case[:k]:
                        if timed[backend] and "error" in timed[backend][-1]:
                            continue
                        try:
                            timed[backend].append(bench_one(size, variant, n, backend, a.tokens, a.steps, a.warmup,
                                                            a.out if a.profile and r == 0 else None, a.compile,
                                                            a.vocab, a.specs))
                        except Exception as e:  # a failed row is recorded, the sweep goes on
                            traceback.print_exc()
                            timed[backend].append(dict(size=size, variant=variant, seq_len=n, backend=backend,
                                                       error=f"{type(e).__name__}: {str(e)[:200]}"))
                            torch.cuda.empty_cache()
                for backend in case:
                    row = merge_rounds(timed[backend])
                    row.update(checks[backend])
                    if variant in EXACT and backend == "torch":
                        H = SIZES[size]["n_head"]
                        hkv = {"gqa": H // 2, "mqa": 1}.get(variant, H)
                        key = (size, variant, n)
                        default_backend[key] = sdpa_default_backend(max(1, a.tokens // n), H, n,
                                                                    SIZES[size]["d_model"] // H, hkv)
                        row["sdpa_default"] = default_backend[key]
                    rows.append(row)
                    print({k: row.get(k) for k in ("size", "variant", "seq_len", "backend", "tokens_per_s", "step_ms",
                                                   "step_ms_spread", "peak_mem_mib", "check_ok", "check_err",
                                                   "sdpa_default", "error")}, flush=True)
    add_ratios(rows, [b + ("+compile" if a.compile else "") for b in backends])
    write_results(rows, a.out, a.name, env)
    cols = ["size", "variant", "seq_len", "backend", "tokens_per_s", "step_ms", "peak_mem_mib"]
    cols += [f"ratio_vs_{b}" for b in backends if b != "triton"]
    cols = cols[:7] + [c.replace("ratio_vs_", "ratio_vs_") + ("+compile" if a.compile else "") for c in cols[7:]]
    print(format_table([r for r in rows if r["backend"].startswith("triton")], cols, "{:.3f}"))
    print(f"wrote {os.path.join(a.out, a.name)}.csv / .json")
    return rows


if __name__ == "__main__":
    main()
