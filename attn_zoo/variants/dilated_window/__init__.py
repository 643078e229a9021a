"""``dilated_window``: dilated sliding-window attention (Beltagy et al. 2020, "Longformer", sec. 3.1).

A sliding window whose keys are ``dilation`` tokens apart: it reaches ``dilation`` times further back with the
same number of keys (Longformer gives some heads of the upper layers a dilation of 2-3).

Fields
    window_size: ``(left, right)``, inclusive, counted in *keys* on each side (as for ``sliding_window`` when
        ``dilation = 1``; ``None`` = unbounded): a causal window of ``W`` keys is ``(W - 1, 0)``.
    dilation: ``d >= 1``, the key spacing in tokens.

Rule (absolute positions, bottom-right aligned, ``i' = i + Nk - Nq``): key ``j`` is visible from query ``i'`` iff
``i' - left * d <= j <= i' + right * d`` (causal: ``j <= i'``) and ``(i' - j) % d == 0``. As
:class:`attn_zoo.MaskInfo` terms: ``window_left = left * d``, ``window_right = right * d`` (token bounds, which
also enumerate the visited tiles) and ``dilation = d`` (the element rule). So every backend runs it through the mask:
``reference`` (dense mask), ``torch`` (SDPA with the boolean mask on CPU, FlexAttention ``mask_mod`` on CUDA), the
anchors ``flex`` and ``naive``, and ``triton`` (``kernels.flash_attn(window_size=..., dilation=d)``: the window
bounds enumerate the tiles, the element rule masks inside them).

Cost: ``~(left + right + 1) / N`` of the pairs (:func:`_element_fraction`), subquadratic. The visited tiles are
those of the undilated token window (``d`` times the kept elements' work on a tiled kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import register_variant, window_element_fraction
from ...spec import AttentionSpec, _nonneg_int


@dataclass(frozen=True)
class DilatedWindowSpec(AttentionSpec):
    """:class:`attn_zoo.AttentionSpec` of ``kind="dilated_window"`` with ``dilation`` (built by
    ``AttentionSpec(kind="dilated_window", window_size=(W - 1, 0), dilation=d)`` or ``make_spec``)."""

    dilation: int = 1


def _validate(spec: DilatedWindowSpec) -> None:
    if spec.window_size is None:
        raise ValueError("kind='dilated_window' needs window_size=(left, right) in keys, e.g. (W - 1, 0) for a causal "
                         "window of W keys")
    _nonneg_int("dilation", spec.dilation, 1)


def _tokens(n, d):
    return None if n is None else n * d


def _mask(spec: DilatedWindowSpec, Nq: int, Nk: int) -> dict:
    left, right = spec.window_size
    return {"window_left": _tokens(left, spec.dilation), "window_right": _tokens(right, spec.dilation),
            "dilation": spec.dilation}


def _element_fraction(spec: DilatedWindowSpec, N: int) -> float:
    left, right = spec.window_size
    return window_element_fraction(N, _tokens(left, spec.dilation), _tokens(right, spec.dilation), spec.causal,
                                   spec.dilation)


register_variant("dilated_window", "softmax", spec_class=DilatedWindowSpec, fields=("window_size", "dilation"),
                 validate=_validate, mask=_mask, element_fraction=_element_fraction, subquadratic=True,
                 doc="sliding window with keys every `dilation` tokens (Longformer)")
