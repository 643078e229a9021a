"""The one W&B mode rule (harness.tracking.wandb_mode) used by train.py and eval/wandb_log.py."""

import socket

import pytest

from harness.tracking import wandb_mode
from eval.wandb_log import resolve_mode


def test_explicit_modes_pass_through_and_bad_mode_raises():
    for m in ("online", "offline", "disabled"):
        assert wandb_mode(m) == m
    with pytest.raises(ValueError, match="allowed values: auto, online, offline, disabled"):
        wandb_mode("sometimes")


def test_auto_offline_without_key_and_env_wins(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode() == "offline" == resolve_mode()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled" == resolve_mode()
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode() == "offline"


def test_auto_with_key_probes_the_server(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)

    def unreachable(*a, **kw):
        raise OSError("no network")

    class _Conn:
        def close(self):
            pass

    monkeypatch.setattr(socket, "create_connection", unreachable)
    assert wandb_mode() == "offline"
    monkeypatch.setattr(socket, "create_connection", lambda *a, **kw: _Conn())
    assert wandb_mode() == "online" == resolve_mode()


def test_mode_reason_names_the_cause(monkeypatch):
    from harness.tracking import resolve_wandb_mode

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)

    def unreachable(*a, **kw):
        raise OSError("no network")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    mode, reason = resolve_wandb_mode()
    assert mode == "offline" and "unreachable" in reason and "no network" in reason
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode() == ("disabled", "WANDB_MODE=disabled")


def test_import_wandb_optional(monkeypatch):
    import sys

    from harness.tracking import import_wandb

    assert import_wandb() is not None
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees when it is not installed
    assert import_wandb() is None


def test_run_id_kept_in_run_dir_for_resumes(tmp_path):
    import re

    from harness.tracking import RUN_ID_FILE, new_run_id, wandb_run_id

    assert re.fullmatch(r"[a-z0-9]{8}", new_run_id()) and new_run_id() != new_run_id()
    first, resumed = wandb_run_id(tmp_path, resume=False)
    assert not resumed and (tmp_path / RUN_ID_FILE).read_text().strip() == first
    assert wandb_run_id(tmp_path, resume=True) == (first, True), "a resumed run continues the stored W&B run"
    again, resumed = wandb_run_id(tmp_path, resume=False)
    assert not resumed and again != first, "a new run in the same folder starts a new W&B run"
    other, resumed = wandb_run_id(tmp_path / "fresh", resume=True)
    assert not resumed and (tmp_path / "fresh" / RUN_ID_FILE).read_text().strip() == other
