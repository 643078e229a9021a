#!/usr/bin/env bash
# The quality experiments of docs/results.md on one H200, in device calls of limited time (lab: not installed).
#
#   bash lab/h200_quality.sh BUDGET_S SEED_DIR EXPERIMENT:N_JOBS[:OVERRIDES] ...
#
# Every experiment is a resumable multirun of train.py (skip_finished: true) in multirun/<experiment>, all of them
# at once, each through its own joblib pool of N_JOBS processes on the one GPU. A folder multirun/<experiment> that
# does not exist yet (a fresh machine) is first seeded from SEED_DIR/<experiment> (the committed runs), so finished
# jobs are skipped. All jobs stop at stop_at = now + BUDGET_S with checkpoints/last.ckpt, and jobs not started by
# then are skipped: the next call on the same machine (multirun/ is kept while it stays warm) resumes them.
# OVERRIDES: extra train.py arguments, space-separated (e.g. "optim.lr=1e-3 attention=linear"). An experiment may
# come twice with disjoint OVERRIDES: two pools over parts of one sweep (each writes its own launch log).
# At the end: $OUT/runs.tgz (every multirun/<experiment> without checkpoints, with the launch logs) and one line per
# experiment: jobs finished / job folders.
set -u
budget=$1; seed=$2; shift 2
out=${OUT:-.}
if ! python3 -c "import hydra, omegaconf" 2>/dev/null && [ -d .whl ]; then  # the GPU image has no Hydra
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export WANDB_MODE=disabled OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
stop_at=$(( $(date +%s) + budget ))
stamp=$(date +%Y%m%d-%H%M%S)
names=(); logs=(); i=0
for spec in "$@"; do
  i=$((i + 1))
  IFS=: read -r name jobs extra <<< "$spec"
  names+=("$name"); logs+=("multirun/$name/launch-$stamp-$i.log")  # one experiment may come twice (two pools)
  mkdir -p multirun
  if [ ! -d "multirun/$name" ] && [ -d "$seed/$name" ]; then cp -r "$seed/$name" "multirun/$name"; fi
  mkdir -p "multirun/$name"
  # shellcheck disable=SC2086  # $extra: several arguments
  python3 train.py -m "experiment=$name" hydra/launcher=joblib "hydra.launcher.n_jobs=$jobs" "stop_at=$stop_at" $extra \
    > "${logs[-1]}" 2>&1 &
done
wait
for j in "${!names[@]}"; do
  name=${names[$j]}
  n_dirs=$(find "multirun/$name" -mindepth 2 -maxdepth 2 -name .hydra | wc -l)
  n_done=$(find "multirun/$name" -mindepth 2 -maxdepth 2 -name final_metrics.json | wc -l)
  echo "$name: $n_done finished of $n_dirs job folders; log tail:"
  tail -n 3 "${logs[$j]}"
done
mapfile -t dirs < <(printf 'multirun/%s\n' "${names[@]}" | sort -u)
tar czf "$out/runs.tgz" --exclude='*.ckpt' "${dirs[@]}"
ls -la "$out/runs.tgz"
