"""Built-in backends; importing this package registers them (see :mod:`attn_zoo.registry`)."""

from . import reference, torch_linear, torch_softmax  # noqa: F401
