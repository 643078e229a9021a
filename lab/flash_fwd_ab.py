"""A/B plugin (lab: not installed): registers backend ``triton_tfwd``, our exact kernel with the Triton forward forced.

The ``triton`` backend runs ``FlashConfig(fwd_impl="auto")``, which takes the Gluon forward on Hopper for the dense
and causal masks it covers (:func:`kernels.flash.resolve_fwd_impl`). Timing ``triton`` beside ``triton_tfwd`` in one
process says what that choice is worth end to end::

    python -m eval.bench_model --out DIR --sizes large --variants flash,gqa --seq-lens 4096 \\
        --backends triton,triton_tfwd,sdpa_cudnn --plugins lab.flash_fwd_ab

Both share the Triton backward; ``auto`` never picks ``triton_tfwd`` (no priority).
"""

from __future__ import annotations

from attn_zoo.backends.triton_flash import _supports, triton_softmax_attention
from attn_zoo.registry import family, register_backend
from kernels.flash import current_flash_config


@register_backend(family("softmax"), "triton_tfwd", supports=_supports, priority=None, devices=("cuda",),
                  documents=True)
def triton_tfwd(q, k, v, spec, return_lse=False, config=None, doc_ids=None):
    """The ``triton`` backend with ``fwd_impl="triton"`` (shapes and errors: ``triton_softmax_attention``)."""
    if config is None:
        config = getattr(spec, "flash_config", None) or current_flash_config()
    cfg = config.replace(fwd_impl="triton")
    return triton_softmax_attention(q, k, v, spec, return_lse=return_lse, config=cfg, doc_ids=doc_ids)
