"""``linear``: kernelized attention (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 4-6).

Fields: ``feature_map`` (``elu1``, ``relu``, ``favor`` = Performer FAVOR+ with ``num_features`` random features,
Choromanski et al. 2021; ``taylor`` = 2nd-order Taylor of exp, Arora et al. 2024 "Based"), ``eps`` (added to the
normaliser), ``chunk_size`` (of the chunked form). Reference: the masked quadratic form
(:func:`attn_zoo.linear_attention_reference`); ``torch``: the chunked PyTorch form; ``triton``: the fused chunked
kernel (:mod:`kernels.linear`); anchors: ``naive``, ``fla`` (flash-linear-attention, where installed). Cost:
linear in ``N`` (subquadratic).
"""

import math

from .. import CachePolicy, register_variant


def _validate(spec):
    from ...spec import FEATURE_MAPS, _choice, _nonneg_int, _real

    _choice("feature_map", spec.feature_map, FEATURE_MAPS)
    _nonneg_int("num_features", spec.num_features, 1)
    if not (_real(spec.eps) and math.isfinite(spec.eps) and spec.eps > 0):
        raise ValueError(f"eps must be a finite float > 0 (rows whose normaliser is 0 would be NaN), got {spec.eps!r}")


def _cache_bytes(spec, n_kv_heads, head_dim, context, dtype_bytes=2, state_bytes=4):
    """The recurrent state ``S (Hkv, F, D)`` and ``z (Hkv, F)``, whatever the context."""
    from ...feature_maps import feature_dim

    f = feature_dim(spec.feature_map, head_dim, spec.num_features)
    return n_kv_heads * (f * head_dim + f) * state_bytes


register_variant("linear", "linear", fields=("feature_map", "num_features", "eps", "chunk_size", "seed"),
                 validate=_validate, subquadratic=True, doc="kernelized (linear) attention",
                 cache_policy=lambda spec: CachePolicy("state"), cache_bytes=_cache_bytes)
