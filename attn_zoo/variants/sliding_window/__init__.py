"""``sliding_window``: local attention (Beltagy et al. 2020, "Longformer", sec. 3.1).

Field ``window_size=(left, right)``, inclusive, in tokens: query ``i'`` sees keys ``i' - left .. i' + right``
(``None``: unbounded on that side; ``causal`` clips ``right`` to 0). A causal window of ``W`` tokens is
``(W - 1, 0)``. Mask terms: ``window_left`` / ``window_right``. Cost: ``~W / N`` of the pairs, subquadratic.
"""

from .. import register_variant, window_element_fraction


def _validate(spec):
    if spec.window_size is None:
        raise ValueError("kind='sliding_window' needs window_size=(left, right)")


def _mask(spec, Nq, Nk):
    left, right = spec.window_size
    return {"window_left": left, "window_right": right}


def _element_fraction(spec, N):
    left, right = spec.window_size
    return window_element_fraction(N, left, right, spec.causal)


register_variant("sliding_window", "softmax", fields=("window_size",), validate=_validate, mask=_mask,
                 element_fraction=_element_fraction, subquadratic=True, doc="local window of keys around the query")
