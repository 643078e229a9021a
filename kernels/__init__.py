"""Triton kernels of attn-zoo (no nn.Module, no imports from attn_zoo).

Settings are passed explicitly: :class:`FlashConfig` / :func:`flash_settings` for the exact kernel,
:class:`LinearConfig` / :func:`linear_settings` for the linear one.
"""

from .flash import (FlashConfig, TileConfig, build_sparse_tables, current_flash_config, flash_attn,  # noqa: F401
                    flash_attn_bwd, flash_attn_fwd, flash_settings, sparse_tiles)
from .linear import LinearConfig, current_linear_config, linear_attention, linear_settings  # noqa: F401
from .decode import decode_attn, decode_attn_reference, decode_sparse_tables  # noqa: F401
