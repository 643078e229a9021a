"""attn-zoo: attention variants behind one interface.

>>> import torch, attn_zoo
>>> q = k = v = torch.randn(1, 2, 16, 8)
>>> out = attn_zoo.attention(q, k, v, attn_zoo.AttentionSpec(kind="flash", causal=True))
"""

from .decode import KVCache, LinearState, append_kv, decode_attention, linear_decode, linear_prefill
from .functional import attention, check_inputs, resolve_backend
from .masks import BlockTable, MaskInfo, mask_info, sparse_layout
from .reference import attention_reference, linear_attention_reference, softmax_attention_reference
from .registry import available_backends, get_backends, register_backend
from .spec import FEATURE_MAPS, KINDS, AttentionSpec, make_spec

__all__ = [
    "attention", "check_inputs", "resolve_backend", "AttentionSpec", "make_spec", "KINDS", "FEATURE_MAPS",
    "MaskInfo", "BlockTable", "mask_info", "sparse_layout",
    "attention_reference", "softmax_attention_reference", "linear_attention_reference",
    "register_backend", "get_backends", "available_backends",
    "decode_attention", "append_kv", "KVCache", "LinearState", "linear_prefill", "linear_decode",
]
