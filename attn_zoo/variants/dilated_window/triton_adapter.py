"""``triton`` backend of ``dilated_window``: :func:`kernels.flash_attn` with the :class:`attn_zoo.MaskInfo` terms.

The window bounds in tokens (``window_left = left * d``, ``window_right``) enumerate the visited tiles, as for a
sliding window; ``dilation=d`` adds the element rule ``(i' - j) % d == 0`` inside them. Keys no query sees are
zeroed first (as for every softmax kind). A kernel without the ``dilation`` argument is refused by ``supports``
(``auto`` then runs ``torch``).
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Optional

from ...masks import mask_info, unseen_keys
from ...registry import register_backend


@lru_cache(maxsize=1)
def _kernel_reason() -> Optional[str]:
    try:
        from kernels import flash_attn
    except Exception as e:  # noqa: BLE001 - triton missing / broken
        return f"kernels.flash_attn cannot be imported ({type(e).__name__}: {e})"
    if "dilation" not in inspect.signature(flash_attn).parameters:
        return "this kernels.flash_attn has no dilation argument"
    return None


def _supports(q, k, v, spec, return_lse):
    from ...backends.triton_flash import _supports as flash_supports

    why = flash_supports(q, k, v, spec, return_lse)
    return why if why is not None else _kernel_reason()


@register_backend("dilated_window", "triton", supports=_supports)
def triton_dilated_window(q, k, v, spec, return_lse=False):
    """Dilated window attention through the fused Triton kernel (forward + backward, autograd)."""
    from kernels import flash_attn

    Nq, Nk = q.shape[2], k.shape[2]
    mi = mask_info(spec, Nq, Nk)
    unseen = unseen_keys(spec, Nq, Nk, str(q.device))
    if unseen is not None:  # keys no row may see: zeroed, so a NaN there cannot reach a tile that loads it
        k, v = k.masked_fill(unseen, 0.0), v.masked_fill(unseen, 0.0)
    window = None
    if mi.window_left is not None or mi.window_right is not None:
        window = (mi.window_left, mi.window_right)
    return flash_attn(q, k, v, causal=mi.causal, window_size=window, dilation=mi.dilation,
                      softmax_scale=spec.scale(q.shape[-1]), return_lse=return_lse)
