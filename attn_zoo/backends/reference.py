"""``reference`` backend of every softmax kind and of ``linear``: :mod:`attn_zoo.reference` (fp32, or fp64 for
fp64 inputs; dense mask)."""

from ..reference import attention_reference
from ..registry import family, register_backend


def _supports(q, k, v, spec, return_lse):
    if return_lse and not spec.is_softmax:
        return "return_lse is only defined for softmax kinds"
    return None


@register_backend((family("softmax"), "linear"), "reference", supports=_supports, documents=True)
def reference_backend(q, k, v, spec, return_lse=False, doc_ids=None, **doc_kw):
    """``doc_ids (B, Nk)``: packed documents (dense mask AND document mask; the linear state restarts at each
    document); ``doc_kw``: ``q_pos`` / ``q_doc`` of :func:`attn_zoo.attention_varlen` (softmax kinds)."""
    return attention_reference(q, k, v, spec, return_lse=return_lse, doc_ids=doc_ids, **doc_kw)
