#!/usr/bin/env bash
# The GPU checks of a session that changes training code (lab: not installed), logs under $OUT:
#   pytest -m gpu (4 xdist workers) -> $OUT/pytest_gpu.txt; the README's `python train.py trainer=gpu` -> $OUT/train_gpu.log
# Each is cut at $CHECKS_TIMEOUT s (default 500). Run it beside other GPU work (it shares the GPU); the rc of each ends its log.
set -u
out=${OUT:-.}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
( timeout "${CHECKS_TIMEOUT:-500}" python3 train.py trainer=gpu logger=csv hydra.run.dir=outputs/readme_gpu > "$out/train_gpu.log" 2>&1
  echo "rc=$?" >> "$out/train_gpu.log" ) &
( timeout "${CHECKS_TIMEOUT:-500}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 > "$out/pytest_gpu.txt" 2>&1
  echo "rc=$?" >> "$out/pytest_gpu.txt" ) &
wait
