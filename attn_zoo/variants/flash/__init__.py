"""``flash``: exact softmax attention (Vaswani et al. 2017; FlashAttention, Dao et al. 2022), causal or full.

Mask: the causal rule only (``j <= i'``, bottom-right aligned) or nothing. Backends: every softmax backend
(``reference``, ``torch`` = SDPA, ``triton``) and the anchors (``sdpa_*``, ``flex``, ``naive``, ``fa2`` / ``fa3``
where installed). Cost: ``(N + 1) / 2N`` of the pairs when causal, else all of them; quadratic.
"""

from .. import register_variant


def _mask(spec, Nq, Nk):
    return {}


def _element_fraction(spec, N):
    return (N + 1) / (2 * N) if spec.causal else 1.0


register_variant("flash", "softmax", mask=_mask, element_fraction=_element_fraction, subquadratic=False,
                 doc="exact softmax attention, causal or full")
