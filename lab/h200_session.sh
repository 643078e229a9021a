#!/usr/bin/env bash
# One device call of a session that changed kernels and training code (lab: not installed):
#   . lab/gpu_env.sh && OUT=... STEP=bench|checks bash lab/h200_session.sh
# STEP=bench (each step alone on the GPU, bounded): the decode compare (issue 29), linear attention on packed
#   documents at 64k (issue 27), the SSD scan (issue 26), model tokens/s of the families (issue 26).
# STEP=checks (side by side): `pytest -m gpu`, the README's `python train.py trainer=gpu`, and the quality cells
#   of lab/h200_quality.sh given in QUALITY (space-separated EXPERIMENT:N_JOBS[:OVERRIDES] specs, '|'-separated).
set -u
out=${OUT:-.}
b() { echo "== $1 rc=$2 ($(date +%T))"; }
if [ "${STEP:-bench}" = bench ]; then
  mkdir -p "$out/decode" "$out/linear_docs" "$out/ssd" "$out/model"
  timeout -k 5 "${DECODE_S:-100}" python3 -m lab.decode_probe --compare --no-variants --budget-s $(( ${DECODE_S:-100} - 30 )) \
    --out "$out/decode" > "$out/decode/log.txt" 2>&1; b decode $?; tail -n 30 "$out/decode/log.txt"
  timeout -k 5 "${LINEAR_S:-100}" python3 -m eval.bench_linear --docs "${LINEAR_DOCS:-fixed:256,fixed:2048,geometric:2048}" \
    --docs-tokens 65536 --time-budget-s $(( ${LINEAR_S:-100} - 40 )) --out "$out/linear_docs" > "$out/linear_docs/log.txt" 2>&1
  b linear_docs $?; tail -n 14 "$out/linear_docs/log.txt"
  # shellcheck disable=SC2086
  timeout -k 5 "${SSD_S:-110}" python3 -m eval.bench_ssd --out "$out/ssd" --lengths 2048,8192,16384,32768 --fla-noguard \
    --time-budget-s $(( ${SSD_S:-110} - 30 )) ${SSD_ARGS:-} > "$out/ssd/log.txt" 2>&1; b ssd $?; grep -E "speedup|flatness" "$out/ssd/log.txt" | tail -n 16
  timeout -k 5 "${MODEL_S:-80}" python3 -m eval.bench_model --out "$out/model" --sizes small --specs conf \
    --variants "${MODEL_V:-flash,mamba2,deltanet,gated_deltanet}" --seq-lens 2048 --tokens 65536 --vocab 8192 \
    --backends triton --steps 10 --warmup 3 > "$out/model/log.txt" 2>&1; b model $?; grep "tokens_per_s" "$out/model/log.txt" | cut -c1-200
else
  export CHECKS_TIMEOUT=${CHECKS_S:-280}
  OUT=$out bash lab/h200_checks.sh &
  if [ -n "${QUALITY:-}" ]; then
    IFS='|' read -r -a specs <<< "$QUALITY"
    OUT=$out bash lab/h200_quality.sh "${QUALITY_S:-240}" results/h200/quality/runs "${specs[@]}"
  fi
  wait
  tail -n 4 "$out/pytest_gpu.txt"; grep -E "FAILED|ERROR" "$out/pytest_gpu.txt" | head -20; tail -n 3 "$out/train_gpu.log"
fi
