"""``taylor_chunk`` backend of ``linear`` for the Taylor feature map: the fused chunked form of
:mod:`kernels.taylor_chunk`.

Causal Taylor linear attention with the ``1 + D + D^2`` features never built: per chunk of 64 tokens the own chunk in
the quadratic form of :mod:`kernels.taylor` and the earlier chunks through a state split by order (``S0 (Dv)``,
``S1 (D, Dv)``, ``S2 (D^2, Dv)`` and the normaliser's ``z1 (D)``, ``Z2 (D, D)``) kept in registers, one program per
(value block, batch x head) scanning the sequence (with few such programs, one per segment of it:
``TaylorChunkConfig.segments``). ``O(N D^2 Dv)`` time like the chunked ``triton`` backend (which writes the 153
symmetric features of ``D = 16`` to HBM and runs the generic kernel), ``O(N)`` memory.

Runs causal, ``Nq = Nk``, ``D <= 16``, ``Dv <= 256``, no ``doc_ids``, CUDA (or the CPU interpreter). ``auto``
takes it for the Taylor map from :data:`TAYLOR_FUSED_MIN_N` tokens on (``auto_priority`` 360, ahead of
``parallel``'s 350); below that, and where it refuses the input (non-causal, ``Nq != Nk``, packed documents), the
order of :mod:`attn_zoo.backends.triton_taylor` stands.
"""

from __future__ import annotations

from ..registry import register_backend
from .triton_taylor import prefers_parallel, taylor_input_reason, taylor_spec_reason

TAYLOR_FUSED_MIN_N = 4096
"""``auto`` runs causal Taylor attention (``Nq = Nk = N``) on this backend from this many tokens. Measured on the
H200 (2026-12-04, ``results/h200/2026-12-04h/a8/``; D 16, Dv 64, H 16, B * N = 16k, bf16, forward+backward, the
kernel's default launch settings): ``parallel`` 0.84 / 2.01 / 6.76 ms, this form 1.32 / 1.56 / 3.44 ms at N 1k / 4k /
16k, fla's ``parallel_based`` 1.14 / 2.28 / 6.55. 4k is the first measured length where the fused chunked form is
ahead of the quadratic one."""

PRIORITY = 240  # below parallel (250) and triton (300): auto_priority lifts it where it is the fastest
PRIORITY_LONG = 360  # ahead of parallel's 350 from TAYLOR_FUSED_MIN_N tokens


def _auto_priority(q, k, v, spec):
    if getattr(spec, "feature_map", None) == "taylor" and not prefers_parallel(q.shape[2], k.shape[2],
                                                                                TAYLOR_FUSED_MIN_N):
        return PRIORITY_LONG
    return None


def _supports(q, k, v, spec, return_lse):
    why = taylor_spec_reason(spec, return_lse, "fused chunked Taylor form")
    if why is not None:
        return why
    if not spec.causal:
        return "causal only (causal=True); non-causal Taylor: backend parallel or triton"
    if q.shape[2] != k.shape[2]:
        return f"needs as many queries as keys (Nq == Nk), got Nq={q.shape[2]}, Nk={k.shape[2]}"
    from kernels.taylor_chunk import MAX_D, MAX_DV

    return taylor_input_reason(q, v, spec.eps, MAX_D, MAX_DV, d_note=" (the D^2 x Dv state lives in registers)")


@register_backend("linear", "taylor_chunk", supports=_supports, priority=PRIORITY, devices=("cuda",),
                  auto_priority=_auto_priority)
def triton_taylor_chunk(q, k, v, spec, return_lse=False):
    """Causal Taylor linear attention of ``spec`` in the fused chunked form; ``(B, Hq, N, Dv)`` in ``q.dtype``."""
    from kernels.taylor_chunk import taylor_chunk

    return taylor_chunk(q, k, v, causal=True, eps=spec.eps)
