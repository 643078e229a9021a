"""lab.merge_runs: the merge rules, and bad arguments that stop before anything is written."""
import json

import pytest

from lab.merge_runs import merge


def _job(root, exp, name, steps=None, finished=False):
    job = root / exp / name
    (job / ".hydra").mkdir(parents=True)
    if steps is not None:
        (job / "csv").mkdir()
        (job / "csv" / "metrics.csv").write_text("step,val/acc\n" + "".join(f"{s},0.5\n" for s in steps))
    if finished:
        (job / "final_metrics.json").write_text(json.dumps({"steps": max(steps or [0])}))
    return job


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_merge_rules(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    ck = _job(src, "e", "new", [10]) / "checkpoints"
    ck.mkdir()
    (ck / "last.ckpt").write_text("weights")           # checkpoints are never merged (not committed)
    _job(src, "e", "never")                      # no csv: never trained, left out
    _job(src, "e", "longer", [10, 20])
    _job(dst, "e", "longer", [10])
    _job(src, "e", "shorter", [10])
    _job(dst, "e", "shorter", [10, 20])
    _job(src, "e", "done_src", [10], finished=True)
    _job(dst, "e", "done_src", [10, 20])
    _job(src, "e", "done_dst", [10, 20, 30], finished=True)
    _job(dst, "e", "done_dst", [10], finished=True)
    (src / "e" / "multirun.yaml").write_text("x: 1\n")
    assert merge(src, dst) == 3
    assert not (dst / "e" / "never").exists()
    assert (dst / "e" / "done_src" / "final_metrics.json").exists()
    assert "20" in (dst / "e" / "longer" / "csv" / "metrics.csv").read_text()
    assert "30" not in (dst / "e" / "done_dst" / "csv" / "metrics.csv").read_text()
    assert (dst / "e" / "multirun.yaml").exists()
    assert (dst / "e" / "new").exists() and not (dst / "e" / "new" / "checkpoints").exists()
    assert merge(src, dst) == 0  # a second merge of the same call changes nothing


@pytest.mark.parametrize("case, match", [
    ("missing_src", "SRC_MULTIRUN .*no such folder"),
    ("missing_dst", "DST_RUNS .*no such folder"),
    ("src_is_experiment", "one experiment's sweep folder.*pass its parent"),
    ("unknown_experiment", "EXPERIMENT nosuch: no such experiment folder.*it has: e"),
    ("bad_csv", "metrics.csv: cannot read its step column"),
])
def test_bad_arguments_write_nothing(tmp_path, case, match):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _job(src, "e", "a=1", [10], finished=True)
    dst.mkdir()
    exps = []
    if case == "missing_src":
        src = tmp_path / "nosuch"
    elif case == "missing_dst":
        dst = tmp_path / "dst_typo"
    elif case == "src_is_experiment":
        src = src / "e"
    elif case == "unknown_experiment":
        exps = ["e", "nosuch"]
    elif case == "bad_csv":
        _job(src, "e", "a=2", ["abc"])
    before = _tree(tmp_path)
    with pytest.raises(SystemExit, match=match):
        merge(src, dst, exps)
    assert _tree(tmp_path) == before   # nothing written (no DST folder made, no junk experiment folders)


def test_summary_is_written_from_the_merged_folders(tmp_path):
    """DST keeps finished jobs that SRC lacks: its summary.csv lists them too (SRC's summary.csv was copied over it,
    listing SRC's finished jobs only)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _job(src, "e", "a=1", [10], finished=True)
    _job(dst, "e", "a=2", [10], finished=True)
    (src / "e" / "summary.csv").write_text("job,overrides\n0,a=1\n")
    merge(src, dst)
    text = (dst / "e" / "summary.csv").read_text()
    assert "a=1" in text and "a=2" in text
