"""The one W&B mode rule (attn_zoo.tracking.wandb_mode) used by train.py and eval/wandb_log.py."""

import socket

import pytest

from attn_zoo.tracking import wandb_mode
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
