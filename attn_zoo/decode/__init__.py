"""Inference: KV caches (contiguous and paged), decode attention, linear-attention state and cache memory.

* :func:`decode_attention` -- ``flash_attn_with_kvcache``-style decode over a contiguous or paged cache, any
  softmax variant (backends ``triton`` / ``torch`` / ``reference``); :func:`check_decode_inputs`.
* :func:`append_kv`, :func:`gather_kv`, :class:`KVCache` -- cache writes / reads and a per-layer cache object.
* :class:`LinearState`, :func:`linear_prefill`, :func:`linear_decode` -- linear attention's O(1) state.
* :mod:`attn_zoo.decode.memory` -- cache / state bytes per variant, longest context that fits.
"""

from .attention import (DECODE_BACKENDS, check_decode_inputs, decode_attention, decode_attention_reference,
                        decode_attention_torch, decode_attention_triton, make_decode_plan)
from .cache import KVCache, append_kv, cache_capacity, gather_kv
from .linear import LinearState, linear_decode, linear_prefill
from .memory import cache_bytes, cache_bytes_per_token, layer_cache_bytes, max_context, memory_table, variant_presets

__all__ = [
    "decode_attention", "decode_attention_reference", "decode_attention_torch", "decode_attention_triton",
    "make_decode_plan", "check_decode_inputs", "DECODE_BACKENDS", "append_kv", "gather_kv", "cache_capacity", "KVCache",
    "LinearState", "linear_prefill", "linear_decode",
    "cache_bytes", "cache_bytes_per_token", "layer_cache_bytes", "max_context", "memory_table", "variant_presets",
]
