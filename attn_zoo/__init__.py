"""attn-zoo: attention variants behind one interface.

>>> import torch, attn_zoo
>>> q = k = v = torch.randn(1, 2, 16, 8)
>>> out = attn_zoo.attention(q, k, v, attn_zoo.AttentionSpec(kind="flash", causal=True))

Plugins: a variant (:func:`register_variant`, :mod:`attn_zoo.variants`), a backend (:func:`register_backend`,
:mod:`attn_zoo.registry`) or a sequence mixer (:func:`register_mixer`, :mod:`attn_zoo.mixers`) registers itself when
its module is imported; :func:`load_plugins` imports modules by name (what ``--plugins`` / ``plugins=[...]`` do).
"""

from .decode import KVCache, LinearState, append_kv, decode_attention, linear_decode, linear_prefill
from .functional import attention, attention_varlen, check_inputs, resolve_backend
from .masks import BlockTable, MaskInfo, mask_info, sparse_layout
from .mixers import MixerSpec, make_layer_spec, register_mixer
from .reference import attention_reference, linear_attention_reference, softmax_attention_reference
from .registry import (available_backends, backend_names, document_backends, family, get_backends, load_plugins,
                       register_backend, unregister_backend)
from .spec import FEATURE_MAPS, AttentionSpec, make_spec
from .variants import CachePolicy, get_variant, register_variant, unregister_variant, variant_kinds

__all__ = [
    "attention", "attention_varlen", "document_backends", "check_inputs", "resolve_backend", "AttentionSpec", "make_spec", "KINDS", "FEATURE_MAPS",
    "MaskInfo", "BlockTable", "mask_info", "sparse_layout",
    "attention_reference", "softmax_attention_reference", "linear_attention_reference",
    "register_backend", "unregister_backend", "get_backends", "available_backends", "backend_names", "family",
    "register_variant", "unregister_variant", "get_variant", "variant_kinds", "CachePolicy", "register_mixer", "MixerSpec", "make_layer_spec",
    "load_plugins",
    "decode_attention", "append_kv", "KVCache", "LinearState", "linear_prefill", "linear_decode",
]


def __getattr__(name):  # KINDS: every registered kind (built-ins and plugins), read when asked
    if name == "KINDS":
        return variant_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
from . import families  # noqa: F401,E402  (registers the mamba2, linformer, deltanet, gated_deltanet mixers)
