"""One rule for Weights & Biases' mode, shared by ``train.py`` (Lightning's ``WandbLogger``) and the
evaluation scripts (``eval/wandb_log.py``), so a run and its sweep never disagree about going online."""

from __future__ import annotations

import os
import socket

__all__ = ["wandb_mode", "WANDB_MODES"]

WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_mode(mode: str = "auto", probe_timeout: float = 1.0) -> str:
    """Resolve ``mode`` to ``"online"``, ``"offline"`` or ``"disabled"``.

    ``auto``: ``WANDB_MODE`` (``offline`` / ``dryrun`` -> offline, ``disabled``) wins; otherwise offline unless
    ``WANDB_API_KEY`` is set **and** api.wandb.ai answers within ``probe_timeout`` seconds (no probe without a
    key, so nothing waits on a machine without network). An offline run uploads later with ``wandb sync``.

    Raises:
        ValueError: ``mode`` is not one of ``auto, online, offline, disabled``.
    """
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb mode={mode!r} is not supported; allowed values: {', '.join(WANDB_MODES)}")
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("offline", "dryrun"):
        return "offline"
    if env == "disabled":
        return "disabled"
    if not os.environ.get("WANDB_API_KEY"):
        return "offline"
    try:
        socket.create_connection(("api.wandb.ai", 443), timeout=probe_timeout).close()
        return "online"
    except OSError:
        return "offline"
