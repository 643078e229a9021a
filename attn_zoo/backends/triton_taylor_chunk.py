"""``taylor_chunk`` backend of ``linear`` for the Taylor feature map: the fused chunked form of
:mod:`kernels.taylor_chunk` (opt-in).

Causal Taylor linear attention with the ``1 + D + D^2`` features never built: per chunk of 64 tokens the own chunk in
the quadratic form of :mod:`kernels.taylor` and the earlier chunks through a state split by order (``S0 (Dv)``,
``S1 (D, Dv)``, ``S2 (D^2, Dv)`` and the normaliser's ``z1 (D)``, ``Z2 (D, D)``) kept in registers, one program per
(value block, batch x head) scanning the sequence. ``O(N D^2 Dv)`` time like the chunked ``triton`` backend
(which writes the 153 symmetric features of ``D = 16`` to HBM and runs the generic kernel), ``O(N)`` memory.

Runs causal, ``Nq = Nk``, ``D <= 16``, ``Dv <= 256``, no ``doc_ids``, CUDA (or the CPU interpreter). ``priority``
``None``: ``auto`` does not pick it (yet); ask for it by name (``backend="taylor_chunk"``).
"""

from __future__ import annotations

from ..registry import register_backend
from ._triton import triton_input_reason


def _supports(q, k, v, spec, return_lse):
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    if spec.feature_map != "taylor":
        return (f"the fused chunked Taylor form is for feature_map='taylor'; got feature_map={spec.feature_map!r} "
                f"(backends triton / torch take every map)")
    if not spec.causal:
        return "causal only (causal=True); non-causal Taylor: backend parallel or triton"
    if q.shape[2] != k.shape[2]:
        return f"needs as many queries as keys (Nq == Nk), got Nq={q.shape[2]}, Nk={k.shape[2]}"
    why = triton_input_reason(q)
    if why is not None:
        return why
    from kernels.taylor import MAX_GRID_Y, eps_reason
    from kernels.taylor_chunk import MAX_D, MAX_DV

    why = eps_reason(spec.eps)
    if why is not None:
        return why
    if not 1 <= q.shape[-1] <= MAX_D:
        return f"head dim D={q.shape[-1]} outside [1, {MAX_D}] (the D^2 x Dv state lives in registers)"
    if v.shape[-1] > MAX_DV:
        return f"value dim Dv={v.shape[-1]} exceeds {MAX_DV}"
    if q.shape[0] * q.shape[1] > MAX_GRID_Y:
        return f"B * Hq = {q.shape[0] * q.shape[1]} exceeds the kernels' grid limit of {MAX_GRID_Y}"
    return None


@register_backend("linear", "taylor_chunk", supports=_supports, priority=None, devices=("cuda",))
def triton_taylor_chunk(q, k, v, spec, return_lse=False):
    """Causal Taylor linear attention of ``spec`` in the fused chunked form; ``(B, Hq, N, Dv)`` in ``q.dtype``."""
    from kernels.taylor_chunk import taylor_chunk

    return taylor_chunk(q, k, v, causal=True, eps=spec.eps)
