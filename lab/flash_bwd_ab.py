"""A/B plugin (lab: not installed): registers backends ``triton_gdq`` and ``triton_tbwd``, our exact kernel with a
backward forced.

The ``triton`` backend runs ``FlashConfig(bwd_impl="auto")`` (:func:`kernels.flash.gluon.choose_bwd_impl`: on Hopper
the two-consumer Gluon dK / dV kernel with the Triton dQ kernel where it pays, else the Triton backward).
``triton_gdq`` forces the Gluon dK / dV kernel with the Gluon dQ kernel (``bwd_impl="gluon", gluon_bwd_dq="gluon",
gluon_bwd_consumers=2``; dense / causal MHA, D 64 / 128 only), ``triton_tbwd`` the Triton backward. Timing them
beside ``triton`` in one process says what each backward is worth end to end::

    python -m eval.bench_model --out DIR --sizes large --variants flash --seq-lens 4096 \\
        --backends triton,triton_gdq,triton_tbwd,sdpa_cudnn --plugins lab.flash_bwd_ab

``auto`` never picks either (no priority).
"""

from __future__ import annotations

from attn_zoo.backends.triton_flash import _supports, triton_softmax_attention
from attn_zoo.registry import family, register_backend
from kernels.flash import current_flash_config

BWD = {"triton_gdq": dict(bwd_impl="gluon", gluon_bwd_dq="gluon", gluon_bwd_consumers=2),
       "triton_tbwd": dict(bwd_impl="triton")}


def _forced(name):
    def run(q, k, v, spec, return_lse=False, config=None, doc_ids=None):
        if config is None:
            config = getattr(spec, "flash_config", None) or current_flash_config()
        return triton_softmax_attention(q, k, v, spec, return_lse=return_lse, config=config.replace(**BWD[name]),
                                        doc_ids=doc_ids)

    run.__name__ = name
    run.__doc__ = f"The ``triton`` backend with {BWD[name]} (shapes and errors: ``triton_softmax_attention``)."
    return register_backend(family("softmax"), name, supports=_supports, priority=None, devices=("cuda",),
                            documents=True)(run)


for _name in BWD:
    _forced(_name)
