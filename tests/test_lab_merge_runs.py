"""lab/merge_runs.py: which job folders of a GPU call replace the committed ones."""
import json

import pytest

from lab.merge_runs import merge


def _job(root, exp, name, steps=(), finished=False, ckpt=False):
    d = root / exp / name
    (d / "csv").mkdir(parents=True)
    rows = "".join(f",{s},0.5\n" for s in steps)
    (d / "csv" / "metrics.csv").write_text("epoch,step,val/acc\n" + rows)
    if finished:
        (d / "final_metrics.json").write_text(json.dumps({"steps": max(steps)}))
    if ckpt:
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "last.ckpt").write_text("weights")
    return d


def test_merge_rules(tmp_path):
    src, dst = tmp_path / "multirun", tmp_path / "runs"
    _job(src, "e", "new_done", [249, 1499], finished=True, ckpt=True)
    _job(src, "e", "never_trained")
    _job(src, "e", "longer", [249, 749])
    _job(dst, "e", "longer", [249])
    _job(src, "e", "shorter", [249])
    _job(dst, "e", "shorter", [249, 999])
    _job(src, "e", "now_done", [249, 1499], finished=True)
    _job(dst, "e", "now_done", [249, 999])
    _job(src, "e", "kept", [249, 499])
    _job(dst, "e", "kept", [249, 1499], finished=True)
    (src / "e" / "launch-1.log").write_text("log")

    assert merge(src, dst) == 3
    assert (dst / "e" / "new_done" / "final_metrics.json").exists()
    assert not (dst / "e" / "new_done" / "checkpoints").exists()  # checkpoints are never committed
    assert not (dst / "e" / "never_trained").exists()
    assert "749" in (dst / "e" / "longer" / "csv" / "metrics.csv").read_text()
    assert "999" in (dst / "e" / "shorter" / "csv" / "metrics.csv").read_text()
    assert (dst / "e" / "now_done" / "final_metrics.json").exists()
    assert "1499" in (dst / "e" / "kept" / "csv" / "metrics.csv").read_text()
    assert (dst / "e" / "launch-1.log").read_text() == "log"
    assert merge(src, dst) == 0  # idempotent


def test_merge_unknown_experiment(tmp_path):
    (tmp_path / "multirun").mkdir()
    with pytest.raises(SystemExit, match="no_such"):
        merge(tmp_path / "multirun", tmp_path / "runs", ["no_such"])
