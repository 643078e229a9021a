"""``parallel`` backend of ``linear`` for the Taylor feature map: the fused quadratic form of :mod:`kernels.taylor`.

``phi(q) . phi(k) = 1 + s + s^2 / 2`` (``s = q . k / sqrt(D)``, :mod:`attn_zoo.feature_maps`), so Taylor linear
attention is computed like exact attention with these weights in place of ``exp(s)``: no feature vectors, ``O(N^2 D)``
time, ``O(N)`` memory (Arora et al. 2024, "Based", train in this form; fla: ``parallel_based``). The chunked forms
take ``O(N F Dv)``: ``torch`` with the full map's ``F = 1 + D + D^2`` features, ``triton`` with the symmetric
``F = 1 + D + D (D + 1) / 2`` (153 at ``D = 16``; its kernel stops at 256 features, ``D <= 21``).

``auto`` for ``linear`` with the Taylor map, on CUDA: ``parallel`` below :data:`TAYLOR_CHUNKED_MIN_N` tokens
(:func:`prefers_parallel`: its ``auto_priority`` is then 350, ahead of ``triton``'s 300), the chunked ``triton``
from there on (``parallel`` keeps its 250), ``torch`` (200) where neither runs the input. The parallel form's time
grows like exact attention's (``Nq Nk D``), the chunked one's like ``(Nq + Nk) F Dv``, so the crossover is a
length.
"""

from __future__ import annotations

from typing import Optional

from ..registry import register_backend
from ._triton import triton_input_reason

TAYLOR_CHUNKED_MIN_N = 16384
"""``auto`` runs the Taylor map on the chunked ``triton`` backend from this many tokens (``Nq = Nk = N``), on
``parallel`` below it. Measured on the H200 (2026-12-04, ``results/h200/2026-12-04g/g1/taylor/``; D 16, Dv 64, H 16,
B * N = 16k, bf16, forward+backward): parallel 0.96 / 1.99 / 6.73 ms and chunked 5.26 / 5.74 / 5.76 ms at N 1k / 4k
/ 16k. The chunked form costs the same per token at every N and the parallel form grows with N; 16k is the first
measured length where the chunked form is ahead (1.17x; a linear interpolation puts the crossover near 13.8k). The
chunked path runs the 153 symmetric features of D 16 zero-padded to 160 (:func:`kernels.linear.feature_pad`); it
ran clean there at N 1k / 4k / 16k (``python -m lab.taylor_fault``)."""

PRIORITY = 250
PRIORITY_SHORT = 350  # ahead of triton's 300 below TAYLOR_CHUNKED_MIN_N


def prefers_parallel(nq: int, nk: int, min_n: int = None) -> bool:
    """True when ``auto`` should take the parallel form for ``nq`` queries and ``nk`` keys: ``2 Nq Nk / (Nq + Nk) <
    min_n`` (default :data:`TAYLOR_CHUNKED_MIN_N`). The parallel form costs ``~ Nq Nk``, the chunked ``~ Nq + Nk``,
    so their ratio is this harmonic mean, which is ``N`` when ``Nq = Nk = N`` (a few queries on a long context:
    parallel)."""
    n = TAYLOR_CHUNKED_MIN_N if min_n is None else min_n
    return 2 * nq * nk < n * (nq + nk)


def _auto_priority(q, k, v, spec):
    if getattr(spec, "feature_map", None) == "taylor" and prefers_parallel(q.shape[2], k.shape[2]):
        return PRIORITY_SHORT
    return None


def taylor_spec_reason(spec, return_lse: bool, form: str) -> Optional[str]:
    """``None`` when a fused Taylor backend (``form``: its name in the message, e.g. ``"parallel form"``) can run
    ``spec`` / ``return_lse``, else why not: no LSE (``return_lse=False``), ``feature_map='taylor'`` only."""
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    if spec.feature_map != "taylor":
        return (f"the {form} is for feature_map='taylor' (phi(q).phi(k) = 1 + s + s^2/2); got "
                f"feature_map={spec.feature_map!r} (backends triton / torch take every map)")
    return None


def taylor_input_reason(q, v, eps, max_d: int, max_dv: int, d_note: str = "") -> Optional[str]:
    """``None`` when a fused Taylor kernel (:mod:`kernels.taylor`, :mod:`kernels.taylor_chunk`) can run ``q (B, Hq,
    Nq, D)``, ``v (B, Hkv, Nk, Dv)`` and ``eps``, else why not: :func:`triton_input_reason`,
    :func:`kernels.taylor.eps_reason`, ``1 <= D <= max_d`` (``d_note`` appended to that reason), ``Dv <= max_dv``,
    ``B * Hq`` within the kernels' grid limit."""
    why = triton_input_reason(q)
    if why is not None:
        return why
    from kernels.taylor import MAX_GRID_Y, eps_reason

    why = eps_reason(eps)
    if why is not None:
        return why
    if not 1 <= q.shape[-1] <= max_d:
        return f"head dim D={q.shape[-1]} outside [1, {max_d}]{d_note}"
    if v.shape[-1] > max_dv:
        return f"value dim Dv={v.shape[-1]} exceeds the kernel's limit of {max_dv}"
    if q.shape[0] * q.shape[1] > MAX_GRID_Y:
        return f"B * Hq = {q.shape[0] * q.shape[1]} exceeds the kernels' grid limit of {MAX_GRID_Y}"
    return None


def _supports(q, k, v, spec, return_lse):
    why = taylor_spec_reason(spec, return_lse, "parallel form")
    if why is not None:
        return why
    from kernels.taylor import MAX_DIM

    return taylor_input_reason(q, v, spec.eps, MAX_DIM, MAX_DIM)


@register_backend("linear", "parallel", supports=_supports, priority=PRIORITY, devices=("cuda",), documents=True,
                  auto_priority=_auto_priority)
def triton_taylor_parallel(q, k, v, spec, return_lse=False, doc_ids=None):
    """Taylor linear attention of ``spec`` in the fused parallel form; ``(B, Hq, Nq, Dv)`` in ``q.dtype``.
    ``doc_ids (B, Nk)``: pairs restricted to one document (the state reset of causal linear attention)."""
    from kernels.taylor import taylor_parallel

    return taylor_parallel(q, k, v, causal=spec.causal, eps=spec.eps, doc_ids=doc_ids)
