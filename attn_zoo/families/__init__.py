"""Sequence-mixer families beside attention: Mamba-2 / SSD (:mod:`.ssd`), Linformer (:mod:`.linformer`),
DeltaNet / Gated DeltaNet (:mod:`.deltanet`). Importing this package registers the mixers ``mamba2``,
``linformer``, ``deltanet`` and ``gated_deltanet`` (:mod:`attn_zoo.mixers`)."""

from . import ssd  # noqa: F401
from . import deltanet  # noqa: F401,E402
from . import linformer  # noqa: F401,E402
