"""Built-in backends; importing this package registers them (see :mod:`attn_zoo.registry`)."""

from . import reference, torch_linear, torch_softmax  # noqa: F401
from . import triton_linear  # noqa: F401
from . import triton_flash  # noqa: F401
