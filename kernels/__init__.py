"""Triton kernels of attn-zoo (no nn.Module, no imports from attn_zoo)."""

from .flash import build_sparse_tables, flash_attn, flash_attn_bwd, flash_attn_fwd, sparse_tiles  # noqa: F401
from .linear import linear_attention, linear_attention_recurrent  # noqa: F401
from .decode import decode_attn, decode_attn_reference, decode_sparse_tables  # noqa: F401
