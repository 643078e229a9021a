"""``parallel`` backend of ``linear`` for the Taylor feature map: the fused quadratic form of :mod:`kernels.taylor`.

``phi(q) . phi(k) = 1 + s + s^2 / 2`` (``s = q . k / sqrt(D)``, :mod:`attn_zoo.feature_maps`), so Taylor linear
attention is computed like exact attention with these weights in place of ``exp(s)``: no feature vectors, ``O(N^2 D)``
time, ``O(N)`` memory (Arora et al. 2024, "Based", train in this form; fla: ``parallel_based``). The chunked forms
(``triton``, ``torch``) take ``O(N F Dv)`` with ``F = 1 + D + D^2`` features, and the chunked kernel stops at
``F = 256`` (``D <= 15``).

``auto`` order for ``linear``: ``triton`` (300), ``parallel`` (250, CUDA, Taylor only), ``torch`` (200): a Taylor
layer with ``D >= 16`` on a GPU runs here. Its time grows like exact attention's, so for a sequence-length sweep
of linear attention name a chunked backend (``backend=torch``) to keep the linear-time form.
"""

from __future__ import annotations

from ..registry import register_backend
from ._triton import triton_input_reason


def _supports(q, k, v, spec, return_lse):
    if return_lse:
        return "return_lse is only defined for softmax kinds"
    if spec.feature_map != "taylor":
        return (f"the parallel form is for feature_map='taylor' (phi(q).phi(k) = 1 + s + s^2/2); got "
                f"feature_map={spec.feature_map!r} (backends triton / torch take every map)")
    why = triton_input_reason(q)
    if why is not None:
        return why
    from kernels.taylor import MAX_DIM, MAX_GRID_Y, eps_reason

    why = eps_reason(spec.eps)
    if why is not None:
        return why
    if q.shape[-1] > MAX_DIM or v.shape[-1] > MAX_DIM:
        return f"head dim D={q.shape[-1]} / value dim Dv={v.shape[-1]} exceeds the kernel's limit of {MAX_DIM}"
    if q.shape[0] * q.shape[1] > MAX_GRID_Y:
        return f"B * Hq = {q.shape[0] * q.shape[1]} exceeds the kernels' grid limit of {MAX_GRID_Y}"
    return None


@register_backend("linear", "parallel", supports=_supports, priority=250, devices=("cuda",), documents=True)
def triton_taylor_parallel(q, k, v, spec, return_lse=False, doc_ids=None):
    """Taylor linear attention of ``spec`` in the fused parallel form; ``(B, Hq, Nq, Dv)`` in ``q.dtype``.
    ``doc_ids (B, Nk)``: pairs restricted to one document (the state reset of causal linear attention)."""
    from kernels.taylor import taylor_parallel

    return taylor_parallel(q, k, v, causal=spec.causal, eps=spec.eps, doc_ids=doc_ids)
