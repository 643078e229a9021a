"""Decode-time memory of each variant: KV-cache / state bytes per sequence, bytes per token, longest context.

Per layer and sequence (``Hkv = spec.resolve_kv_heads(n_head)``, ``b`` bytes per cache element, ``s`` per state
element):

Each variant answers for itself (:meth:`attn_zoo.variants.Variant.cache_policy` / ``cache_bytes``):

* a ``"full"`` policy (``flash``; ``sparse``: global / random / summary blocks can reach any past key, so every
  key is kept): ``2 * Hkv * D * b`` per token (MHA ``Hkv = H``, GQA ``H / g``, MQA 1; Shazeer 2019,
  Ainslie et al. 2023);
* a ``"window"`` policy of ``W`` tokens (causal ``sliding_window`` with ``window_size=(W - 1, 0)``, a dilated
  window, any plugin whose mask is a causal window): only the last ``W`` tokens, ``2 * Hkv * D * b * min(N, W)``
  (Beltagy et al. 2020; Mistral's rolling buffer cache);
* a ``"state"`` policy (``linear``: ``Hkv * (F * D + F) * s`` whatever ``N``, Katharopoulos et al. 2020).

A model's cache is the sum over its layers (hybrids mix the rules). Pure Python: no GPU needed.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

from ..spec import AttentionSpec
from ..variants import get_variant


def _specs(specs: Union[AttentionSpec, Sequence[AttentionSpec]], n_layer: Optional[int]) -> List[AttentionSpec]:
    if isinstance(specs, AttentionSpec):
        if n_layer is None:
            raise ValueError("n_layer is needed when a single spec is given")
        return [specs] * int(n_layer)
    return list(specs)


def kept_tokens(spec: AttentionSpec, context: int) -> Optional[int]:
    """Tokens a layer keeps at ``context`` (its variant's cache policy; ``None`` for a fixed-size state)."""
    return get_variant(spec.kind).cache_policy(spec).kept_tokens(context)


def layer_cache_bytes(spec: AttentionSpec, n_head: int, head_dim: int, context: int, batch: int = 1,
                      dtype_bytes: int = 2, state_bytes: int = 4) -> int:
    """Cache (softmax) or state (linear) bytes of one layer for ``batch`` sequences of ``context`` tokens.

    Raises ``ValueError`` on negative sizes or a ``Hkv`` that does not divide ``n_head``.
    """
    for name, x in (("n_head", n_head), ("head_dim", head_dim), ("batch", batch), ("dtype_bytes", dtype_bytes),
                    ("state_bytes", state_bytes)):
        if int(x) < 1:
            raise ValueError(f"{name} must be >= 1, got {x}")
    if int(context) < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    hkv = spec.resolve_kv_heads(n_head)
    return batch * get_variant(spec.kind).cache_bytes(spec, hkv, head_dim, int(context), dtype_bytes, state_bytes)


def cache_bytes(specs, n_head: int, head_dim: int, context: int, batch: int = 1, dtype_bytes: int = 2,
                state_bytes: int = 4, n_layer: Optional[int] = None) -> int:
    """Sum of :func:`layer_cache_bytes` over the layers (``specs``: one per layer, or one spec and ``n_layer``)."""
    return sum(layer_cache_bytes(s, n_head, head_dim, context, batch, dtype_bytes, state_bytes)
               for s in _specs(specs, n_layer))


def cache_bytes_per_token(specs, n_head: int, head_dim: int, dtype_bytes: int = 2, n_layer: Optional[int] = None) -> int:
    """Bytes one more token adds per sequence at long context (0 for window and state layers past the window)."""
    big = 1 << 40
    total = 0
    for s in _specs(specs, n_layer):
        v, hkv = get_variant(s.kind), s.resolve_kv_heads(n_head)
        total += v.cache_bytes(s, hkv, head_dim, big + 1, dtype_bytes) - v.cache_bytes(s, hkv, head_dim, big, dtype_bytes)
    return total


def max_context(specs, n_head: int, head_dim: int, budget_bytes: float, batch: int = 1, dtype_bytes: int = 2,
                state_bytes: int = 4, n_layer: Optional[int] = None, limit: int = 1 << 40) -> Optional[int]:
    """Longest context whose cache fits in ``budget_bytes`` for ``batch`` sequences.

    Returns ``None`` when the cache stops growing (window / linear layers only) and fits at any length, 0 when
    not even one token fits; else the exact largest ``N`` (binary search on the monotone :func:`cache_bytes`).
    """
    layers = _specs(specs, n_layer)

    def fits(n):
        return cache_bytes(layers, n_head, head_dim, n, batch, dtype_bytes, state_bytes) <= budget_bytes

    if not fits(1):
        return 0
    if cache_bytes_per_token(layers, n_head, head_dim, dtype_bytes) == 0:
        sat = max([p.window + p.sink for p in (get_variant(s.kind).cache_policy(s) for s in layers) if p.window]
                  + [1])  # (the sinks are kept beside the window)
        return None if fits(sat) else _search(fits, 1, sat)
    return _search(fits, 1, limit)


def _search(fits, lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with fits(n), given fits(lo) and fits monotone decreasing."""
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def variant_presets(n_layer: int, n_head: int, window: int = 4096, gqa_groups: Sequence[int] = (8,),
                    feature_map: str = "elu1", hybrid_every: int = 4) -> Dict[str, List[AttentionSpec]]:
    """Per-layer spec lists of the decode-memory comparison: ``mha``, ``gqa{Hkv}`` for each group size, ``mqa``,
    ``window{W}`` (causal window of ``W`` tokens), ``linear`` and two hybrids with one exact (GQA, the first group
    size) layer every ``hybrid_every`` layers: ``hybrid_linear`` (the others linear) and ``hybrid_window`` (the
    others windowed)."""
    out: Dict[str, List[AttentionSpec]] = {"mha": [AttentionSpec(kind="flash")] * n_layer}
    for g in gqa_groups:
        if n_head % g:
            raise ValueError(f"GQA group size {g} must divide n_head={n_head}")
        out[f"gqa{n_head // g}"] = [AttentionSpec(kind="flash", kv_group_size=g)] * n_layer
    out["mqa"] = [AttentionSpec(kind="flash", n_kv_heads=1)] * n_layer
    win = AttentionSpec(kind="sliding_window", window_size=(window - 1, 0))
    out[f"window{window}"] = [win] * n_layer
    lin = AttentionSpec(kind="linear", feature_map=feature_map)
    out["linear"] = [lin] * n_layer
    exact = AttentionSpec(kind="flash", kv_group_size=gqa_groups[0]) if gqa_groups else AttentionSpec(kind="flash")
    out["hybrid_linear"] = [exact if i % hybrid_every == hybrid_every - 1 else lin for i in range(n_layer)]
    out["hybrid_window"] = [exact if i % hybrid_every == hybrid_every - 1 else win for i in range(n_layer)]
    return out


def memory_table(n_layer: int, n_head: int, head_dim: int, budget_bytes: float, batch: int = 1,
                 dtype_bytes: int = 2, contexts: Sequence[int] = (1024, 32768, 131072), mla_dims=None,
                 **preset_kw) -> List[dict]:
    """One row per preset: bytes per token (long-context growth), cache bytes at each of ``contexts``, and the
    longest context that fits ``budget_bytes`` for ``batch`` sequences (``None`` = unbounded). ``mla_dims``
    ``(kv_lora_rank, qk_rope_dim)`` adds an ``mla`` row (latent cache, :func:`attn_zoo.mla.mla_cache_bytes_per_token`)."""
    rows = []
    for name, layers in variant_presets(n_layer, n_head, **preset_kw).items():
        row = {"variant": name, "n_layer": n_layer, "n_head": n_head, "head_dim": head_dim, "batch": batch,
               "dtype_bytes": dtype_bytes,
               "bytes_per_token": cache_bytes_per_token(layers, n_head, head_dim, dtype_bytes),
               "max_context": max_context(layers, n_head, head_dim, budget_bytes, batch, dtype_bytes)}
        for n in contexts:
            row[f"bytes_at_{n}"] = cache_bytes(layers, n_head, head_dim, n, batch, dtype_bytes)
        rows.append(row)
    if mla_dims is not None:  # a mixer, not an AttentionSpec: its row comes from attn_zoo.mla
        from ..mla import mla_memory_row

        rows.append(mla_memory_row(n_layer, n_head, head_dim, budget_bytes, batch, dtype_bytes, contexts, *mla_dims))
    return rows
