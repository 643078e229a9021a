#!/usr/bin/env bash
# The committed best-against-best run of issue 29 on one H200 (lab: not installed), budget-aware:
#
#   . lab/gpu_env.sh 3 && BUDGET_S=420 bash lab/h200_anchors.sh RESULTS_DIR
#
# (gpu_env.sh installs the carried wheels -- FA4 in parts over warm calls, fla-core -- and sets PYTHONPATH.)
# One process per family of eval/conf/sweep/anchors_h200.yaml, one after the other (they share the GPU):
#   softmax: causal, full, GQA 4:1, D 64, window 1024, BigBird  x  ours, FA4, Flex+FA4, cuDNN, FA2, Flex
#   linear:  elu1 (D 128), Taylor / Based (D 16)                x  ours (triton / parallel / torch), fla
# each bounded by its share of BUDGET_S (default 420 s: softmax 68 %, linear 22 %, the rest for the tables; the shares
# are SOFTMAX_SHARE / LINEAR_SHARE, in percent; FAMILIES="linear" runs one family alone, e.g. with
# LINEAR_SHARE=90: fla's first autotuning calls can take most of a small share; LINEAR_VARIANTS orders the linear
# family's variants, default linear,linear_taylor: the first runs first, so a deadline cuts the last; SOFTMAX_VARIANTS
# the softmax family's, default window,bigbird,causal,full,gqa,d64: the config's run_last backends (Flex+FA4 first)
# run after every other point in that order, and the window and BigBird are the variants whose target is Flex+FA4 --
# a 250 s share reached Flex+FA4 on causal, full and GQA only, 34th session) through
# eval.sweep --deadline-s and a hard `timeout`. Every point is a CSV row: an anchor that fails, is missing or cannot
# run a case records `error` / `unsupported` with the message and the others go on; a process that dies (segfault,
# hang, a CUDA error that poisons the context: exit 3) is restarted and resumes after the point it died on (that
# point recorded as `error`). Writes RESULTS_DIR/{softmax,linear}/kernel.csv (+ logs), RESULTS_DIR/versions.json
# and RESULTS_DIR/tables.md (eval/anchors_tables.py: the markdown for docs/results.md; best.csv, nstar_compare.csv).
set -u
dir=${1:?usage: bash lab/h200_anchors.sh RESULTS_DIR}
budget=${BUDGET_S:-420}
conf=${ANCHORS_CONF:-eval/conf/sweep/anchors_h200.yaml}   # another config: a CPU dry run of this script
families=${FAMILIES:-softmax linear}
for fam in $families; do
  case $fam in softmax|linear) ;; *) echo "FAMILIES: unknown family '$fam'; allowed: softmax linear"; exit 2 ;; esac
done
mkdir -p "$dir"
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }

python3 - "$dir/versions.json" <<'PY' || echo "versions: failed (not fatal)"
import json, sys
from importlib import metadata
from eval.bench_common import env_info
env = env_info()
for dist in ("flash-attn-4", "nvidia-cutlass-dsl", "fla-core", "flash-attn", "torch", "triton"):
    try:
        env[f"pkg:{dist}"] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        env[f"pkg:{dist}"] = None
from attn_zoo.registry import get_backends
for kind, name in (("flash", "fa4"), ("flash", "flex_fa4"), ("flash", "sdpa_cudnn"), ("flash", "fa2"), ("linear", "fla")):
    env[f"available:{name}"] = get_backends(kind)[name].unavailable() or "yes"
json.dump(env, open(sys.argv[1], "w"), indent=1)
print("versions:", {k: v for k, v in env.items() if k.startswith(("pkg:", "available:", "gpu"))})
PY

run_family() {  # name share_percent variants
  local fam=$1 share=$2 variants=$3 attempt=0 rc=1
  local until=$(( $(date +%s) + budget * share / 100 ))
  mkdir -p "$dir/$fam"
  while [ "$attempt" -lt 4 ]; do
    attempt=$((attempt + 1))
    local t=$(( until - $(date +%s) ))
    if [ "$t" -lt 20 ]; then echo "$fam: out of budget before attempt $attempt"; break; fi
    echo "$fam: attempt $attempt, ${t}s left of its share"
    timeout -k 5 "$t" python3 -m eval.sweep --config "$conf" --out "$dir/$fam" --variants "$variants" \
      --deadline-s $(( t - 15 )) --no-progress >> "$dir/$fam/sweep.log" 2>&1
    rc=$?
    tail -n 2 "$dir/$fam/sweep.log"
    [ "$rc" -eq 0 ] && break
    echo "$fam: exit $rc (3: CUDA context lost; 124/137: time limit; else a crash) -- resuming in a new process"
  done
  echo "$fam: done (rc=$rc) $(python3 -c "import pandas as p; d=p.read_csv('$dir/$fam/kernel.csv'); print(d.status.value_counts().to_dict())" 2>/dev/null)"
}

for fam in $families; do
  case $fam in
    softmax) run_family softmax "${SOFTMAX_SHARE:-68}" "${SOFTMAX_VARIANTS:-window,bigbird,causal,full,gqa,d64}" ;;
    linear) run_family linear "${LINEAR_SHARE:-22}" "${LINEAR_VARIANTS:-linear,linear_taylor}" ;;
  esac
done
timeout -k 5 "$(( $(left) > 30 ? $(left) : 30 ))" python3 -m eval.anchors_tables "$dir" --config "$conf" \
  > "$dir/tables.md" 2> "$dir/tables.log" || echo "tables: failed (see $dir/tables.log); rerun on the CPU: python -m eval.anchors_tables $dir"
head -c 6000 "$dir/tables.md"
echo "total $(( $(date +%s) - start ))s of ${budget}s"
