"""One rule for Weights & Biases' mode, shared by ``train.py`` (Lightning's ``WandbLogger``) and the
evaluation scripts (``eval/wandb_log.py``), so a run and its sweep never disagree about going online; plus the
small pieces ``train.py`` needs to treat W&B as optional (:func:`import_wandb`) and to keep one W&B run per run
directory across resumes (:func:`wandb_run_id`)."""

from __future__ import annotations

import os
import secrets
import socket
import string
from pathlib import Path
from typing import Optional, Tuple

__all__ = ["wandb_mode", "resolve_wandb_mode", "wandb_disabled_by_env", "import_wandb", "wandb_run_id",
           "new_run_id", "WANDB_MODES", "RUN_ID_FILE"]

WANDB_MODES = ("auto", "online", "offline", "disabled")
RUN_ID_FILE = os.path.join("wandb", "run_id.txt")


def resolve_wandb_mode(mode: str = "auto", probe_timeout: float = 1.0) -> Tuple[str, str]:
    """:func:`wandb_mode` and the reason for it, e.g. ``("offline", "api.wandb.ai unreachable: ...")``."""
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb mode={mode!r} is not supported; allowed values: {', '.join(WANDB_MODES)}")
    if mode != "auto":
        return mode, f"mode={mode}"
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("offline", "dryrun"):
        return "offline", f"WANDB_MODE={env}"
    if env == "disabled":
        return "disabled", "WANDB_MODE=disabled"
    if not os.environ.get("WANDB_API_KEY"):
        return "offline", "no WANDB_API_KEY"
    try:
        socket.create_connection(("api.wandb.ai", 443), timeout=probe_timeout).close()
        return "online", "WANDB_API_KEY set and api.wandb.ai reachable"
    except OSError as e:
        return "offline", f"api.wandb.ai unreachable ({type(e).__name__}: {e})"


def wandb_mode(mode: str = "auto", probe_timeout: float = 1.0) -> str:
    """Resolve ``mode`` to ``"online"``, ``"offline"`` or ``"disabled"``.

    ``auto``: ``WANDB_MODE`` (``offline`` / ``dryrun`` -> offline, ``disabled``) wins; otherwise offline unless
    ``WANDB_API_KEY`` is set **and** api.wandb.ai answers within ``probe_timeout`` seconds (no probe without a
    key, so nothing waits on a machine without network). An offline run uploads later with ``wandb sync``.

    Raises:
        ValueError: ``mode`` is not one of ``auto, online, offline, disabled``.
    """
    return resolve_wandb_mode(mode, probe_timeout)[0]


def wandb_disabled_by_env() -> bool:
    """``WANDB_MODE=disabled``: no W&B run at all, whatever a config says (``train.py`` then logs to CSV only)."""
    return os.environ.get("WANDB_MODE", "").lower() == "disabled"


def import_wandb():
    """The ``wandb`` module, or None when it is not installed (W&B is optional at run time)."""
    try:
        import wandb
    except ImportError:
        return None
    return wandb


def new_run_id(length: int = 8) -> str:
    """A random W&B run id: ``length`` lowercase letters and digits, as W&B makes them."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def wandb_run_id(run_dir, resume: bool, new_id=None, write: bool = True) -> Tuple[str, bool]:
    """The W&B run id of the run in ``run_dir`` and whether it continues an earlier one.

    The id is kept in ``<run_dir>/wandb/run_id.txt``. ``resume`` (a resumed checkpoint) and the file present: its id
    (``WandbLogger(id=..., resume="allow")`` then continues that W&B run). Otherwise a new id (``new_id()``, default
    ``wandb.util.generate_id``), written to the file when ``write`` (rank zero only under DDP).
    """
    path = Path(run_dir) / RUN_ID_FILE
    if resume and path.is_file():
        old: Optional[str] = path.read_text().strip()
        if old:
            return old, True
    run_id = str((new_id or new_run_id)())
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id, False
