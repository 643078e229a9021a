"""Merge the multirun folders of a GPU call (lab: not installed) into the committed runs.

    python -m lab.merge_runs SRC_MULTIRUN DST_RUNS [EXPERIMENT ...]

SRC_MULTIRUN: an extracted ``runs.tgz`` of ``lab/h200_quality.sh`` (``.../multirun``, the folder holding one
``<experiment>/`` sweep folder per experiment); DST_RUNS: the committed runs (``results/h200/quality/runs``, an
existing folder). For each ``<experiment>/<job>`` folder of SRC:
- a folder with no finished run and no logged step is left out (a job that never trained);
- a job that is not in DST, or whose DST run is unfinished and shorter (fewer logged steps) or unfinished while
  SRC's finished, replaces DST's folder; a finished DST run is kept (a seeded copy is skipped by the sweep anyway).
Launch logs and ``multirun.yaml`` of the sweep folder are copied; ``summary.csv`` is written anew from DST's
merged job folders (SRC's lists SRC's finished jobs only, and DST may keep others). Prints one line per change.
Bad arguments (a missing SRC or DST, SRC one level too deep, an EXPERIMENT not in SRC, an unreadable
``metrics.csv``) stop before anything is written.
"""
from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

from harness.runs import FINAL_METRICS


def _steps(job: Path) -> int:
    """The last logged step of a job (0: none)."""
    f = job / "csv" / "metrics.csv"
    if not f.exists():
        return 0
    with f.open() as fh:
        try:
            steps = [int(float(r["step"])) for r in csv.DictReader(fh) if r.get("step")]
        except (ValueError, TypeError) as e:
            raise SystemExit(f"{f}: cannot read its step column ({e})") from None
    return max(steps, default=0)


def _finished(job: Path) -> bool:
    return (job / FINAL_METRICS).exists()


def _is_job(p: Path) -> bool:
    return p.is_dir() and any((p / n).exists() for n in (".hydra", "csv", FINAL_METRICS, "checkpoints"))


def _check(src_root: Path, dst_root: Path, experiments) -> list:
    """The experiments to merge; raises SystemExit (naming the argument) before anything is written."""
    if not src_root.is_dir():
        raise SystemExit(f"SRC_MULTIRUN {src_root}: no such folder (an extracted runs.tgz: .../multirun)")
    if not dst_root.is_dir():
        raise SystemExit(f"DST_RUNS {dst_root}: no such folder (the committed runs: results/h200/quality/runs); "
                         f"create it first to merge into a new one")
    if _is_job(src_root) or (src_root / "multirun.yaml").exists() or any(_is_job(p) for p in src_root.iterdir()):
        raise SystemExit(f"SRC_MULTIRUN {src_root} is one experiment's sweep folder (it holds job folders); pass "
                         f"its parent ({src_root.parent}) and, to merge only it, the experiment name {src_root.name}")
    exps = list(experiments) or sorted(p.name for p in src_root.iterdir() if p.is_dir())
    missing = [e for e in exps if not (src_root / e).is_dir()]
    if missing:
        have = sorted(p.name for p in src_root.iterdir() if p.is_dir())
        raise SystemExit(f"EXPERIMENT {', '.join(missing)}: no such experiment folder in SRC_MULTIRUN {src_root}; "
                         f"it has: {', '.join(have) or 'none'}")
    if not exps:
        raise SystemExit(f"SRC_MULTIRUN {src_root} holds no experiment folder")
    for exp in exps:
        for job in (src_root / exp).iterdir():
            if job.is_dir():
                _steps(job)  # an unreadable metrics.csv fails here, before anything is copied
    return exps


def merge(src_root: Path, dst_root: Path, experiments=None) -> int:
    changed = 0
    src_root, dst_root = Path(src_root), Path(dst_root)
    exps = _check(src_root, dst_root, experiments or [])
    for exp in exps:
        src_exp, dst_exp = src_root / exp, dst_root / exp
        dst_exp.mkdir(exist_ok=True)
        for item in sorted(src_exp.iterdir()):
            if item.is_file():
                if item.name.startswith("launch-") and not (dst_exp / item.name).exists() or \
                        item.name == "multirun.yaml":
                    shutil.copy2(item, dst_exp / item.name)
                continue
            done, steps = _finished(item), _steps(item)
            if not done and steps == 0:
                continue
            old = dst_exp / item.name
            if old.exists():
                if _finished(old) or (not done and steps <= _steps(old)):
                    continue
                why = f"unfinished at {_steps(old)} -> " + ("finished" if done else f"unfinished at {steps}")
                shutil.rmtree(old)
            else:
                why = "new, " + ("finished" if done else f"unfinished at {steps}")
            shutil.copytree(item, old, ignore=shutil.ignore_patterns("*.ckpt", "checkpoints"))
            print(f"{exp}/{item.name}: {why}")
            changed += 1
        _write_summary(dst_exp)
    return changed


def _write_summary(sweep: Path) -> None:
    """``summary.csv`` of a merged sweep folder: every finished job in it (as ``train.py -m`` writes it)."""
    from harness.callbacks import MultirunJobs

    header, rows = MultirunJobs().table_rows(sweep)
    if not rows:
        return
    with open(sweep / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    n = merge(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
    print(f"{n} job folders changed")
