"""Checks shared by the ``triton`` backends."""

from __future__ import annotations

import os
from typing import Optional

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_input_reason(q: torch.Tensor) -> Optional[str]:
    """``None`` when a Triton kernel can run on ``q``'s device and dtype, else the reason."""
    if q.device.type != "cuda" and not interpreting():
        return f"needs a CUDA device (got {q.device.type}; TRITON_INTERPRET=1 runs the CPU interpreter)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} is not supported (float16, bfloat16, float32)"
    return None
