"""``streaming``: a sliding window plus attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks", StreamingLLM, sec. 3.2).

Softmax over a window puts its excess mass on the first tokens of the sequence, whatever their content; a window
that drops them degrades (the paper's fig. 1 b, 3). StreamingLLM keeps those few "sink" tokens visible to every
query beside the rolling window, so a decoder streams with a cache of ``sink_size + W`` tokens.

Fields
    window_size: ``(left, right)``, inclusive, in tokens, as for ``sliding_window``: a causal window of ``W`` tokens
        is ``(W - 1, 0)``.
    sink_size: ``S >= 0`` tokens (the paper keeps 4): keys ``j < S`` (absolute positions) are visible to every
        query the other terms allow (causal, the window's right edge), however far back. ``0`` is the plain window.

Rule (absolute positions, bottom-right aligned, ``i' = i + Nk - Nq``): key ``j`` is visible from query ``i'`` iff
``j <= i' + right`` (causal: ``j <= i'``) and (``j >= i' - left`` or ``j < S``). As :class:`attn_zoo.MaskInfo`
terms: ``window_left``, ``window_right`` and ``sink_size``. Every softmax backend runs it through the mask:
``reference`` / ``torch`` / ``naive`` (dense rule), ``flex`` / ``flex_fa4`` (``mask_mod``), ``triton``
(``kernels.flash_attn(window_size=..., sink_size=S)``: the sink tiles, then the window's band). FA2 / FA4's
``window_size`` cannot say it: those anchors refuse the kind.

Decode: the default cache policy of a causal window with sinks, ``CachePolicy("window", left + 1, sink=S)``: a
:class:`attn_zoo.decode.KVCache` that keeps the first ``S`` tokens in place and the last ``left + 1`` behind them.
Positions are those the tokens were given at prefill (rotary embedding before the cache), so decoding equals the
last rows of the full forward; the paper's re-indexing of positions inside the cache is not done.

Packed documents: not taken (``documents=False``): the sinks are the first tokens of the row, and a per-document
form (the first tokens of each document) is in no kernel; :func:`attn_zoo.attention` refuses ``doc_ids`` with it.

Cost: the window's pairs plus at most ``S`` per query: ``~(W + S) / N`` of the pairs (:func:`_element_fraction`),
subquadratic.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import register_variant, window_element_fraction
from ...spec import AttentionSpec, _nonneg_int


@dataclass(frozen=True)
class StreamingSpec(AttentionSpec):
    """:class:`attn_zoo.AttentionSpec` of ``kind="streaming"`` with ``sink_size`` (built by
    ``AttentionSpec(kind="streaming", window_size=(W - 1, 0), sink_size=4)`` or ``make_spec``)."""

    sink_size: int = 4


def _validate(spec: StreamingSpec) -> None:
    if spec.window_size is None or spec.window_size[0] is None:
        raise ValueError("kind='streaming' needs window_size=(left, right) with a left edge (an integer >= 0), e.g. "
                         "(W - 1, 0) for a causal window of W tokens: the sinks are what it keeps beyond that edge")
    _nonneg_int("sink_size", spec.sink_size)


def _mask(spec: StreamingSpec, Nq: int, Nk: int) -> dict:
    left, right = spec.window_size
    return {"window_left": left, "window_right": right, "sink_size": spec.sink_size}


def _sink_pairs(N: int, left: int, sink: int) -> int:
    """Pairs ``(i, j)`` of ``N`` tokens with ``j < sink`` left of the window (``j < i - left``): ``sum_i min(sink,
    i - left)`` over the rows where that is positive, in closed form."""
    t, s = max(N - 1 - left, 0), min(sink, N)  # t: rows with a key left of the window; the row i has i - left
    if t <= s:
        return t * (t + 1) // 2
    return s * (s + 1) // 2 + (t - s) * s


def _element_fraction(spec: StreamingSpec, N: int) -> float:
    left, right = spec.window_size
    return (window_element_fraction(N, left, right, spec.causal)
            + _sink_pairs(N, left, spec.sink_size) / float(N) ** 2)


register_variant("streaming", "softmax", spec_class=StreamingSpec, fields=("window_size", "sink_size"),
                 validate=_validate, mask=_mask, element_fraction=_element_fraction, subquadratic=True,
                 documents=False, doc="sliding window plus attention sinks (StreamingLLM)")
