"""Built-in backends; importing this package registers them (see :mod:`attn_zoo.registry`).

Product backends (``auto`` picks them by priority): ``triton`` (:mod:`.triton_flash`, :mod:`.triton_linear`),
``parallel`` (:mod:`.triton_taylor`: the Taylor map of ``linear`` in quadratic form), ``torch``
(:mod:`.torch_softmax`, :mod:`.torch_linear`), ``reference`` (:mod:`.reference`). Opt-in (no priority):
``taylor_chunk`` (:mod:`.triton_taylor_chunk`, the Taylor map fused and chunked). Anchors (no priority):
:mod:`.torch_anchors`.
"""

from . import reference, torch_linear, torch_softmax  # noqa: F401
from . import triton_linear  # noqa: F401
from . import triton_taylor  # noqa: F401
from . import triton_taylor_chunk  # noqa: F401
from . import triton_flash  # noqa: F401
from . import torch_anchors  # noqa: F401
