#!/usr/bin/env bash
# GPU check of the Gluon forwards (FlashConfig(fwd_impl="gluon_ws3a" | "gluon_ws3b"), and "auto", the default, which
# picks gluon_ws3a for large dense / causal D 128 problems on Hopper; issue 30) on the H200, each variant in its own
# process under a timeout (a hang or a crash of one cannot take the others down).
#
#   bash lab/gluon_gpu_check.sh tests [IMPLS]  # -m gpu tests of tests/test_kernel_flash_gluon.py, one process per
#                                              # variant, all in parallel (<= ~4 min); IMPLS: comma list, default
#                                              # both (the auto test runs with gluon_ws3a: its name contains it)
#   bash lab/gluon_gpu_check.sh bench [IMPLS]  # forward-only timings, causal / noncausal / gqa4, N 4k / 16k, D 128:
#                                              # anchors (ours = auto, ours_triton), then every variant in IMPLS
#                                              # whose tests passed (if run)
#   bash lab/gluon_gpu_check.sh ab [IMPLS]     # the same cases in ONE process (A/B under equal conditions): ours
#                                              # (auto), ours_triton, sdpa_cudnn and every variant in IMPLS whose
#                                              # tests passed (if run)
#
# Logs and results go under ${OUT:-outputs/gluon_check}; a summary is printed at the end of each step.
set -u
OUT_DIR="${OUT:-outputs/gluon_check}"
mkdir -p "$OUT_DIR"
what="${1:-tests}"
impls="${2:-gluon_ws3a,gluon_ws3b}"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if [ "$what" = tests ]; then
  pids=()
  for name in ${impls//,/ }; do
    # the first compile of the Triton fwd / bwd kernels the tests compare with takes a while in every process
    timeout -k 10 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_flash_gluon.py \
      -k "$name" > "$OUT_DIR/test_$name.txt" 2>&1 &
    pids+=("$name:$!")
  done
  for entry in "${pids[@]}"; do
    name="${entry%%:*}"; wait "${entry#*:}"; rc=$?
    echo "$rc" > "$OUT_DIR/test_$name.rc"
    echo "== tests $name: rc=$rc (124 = timeout: a hang)"
    grep -E "passed|failed|error|skipped" "$OUT_DIR/test_$name.txt" | tail -1
    grep -E "^FAILED|^E  " "$OUT_DIR/test_$name.txt" | head -6
  done
elif [ "$what" = bench ]; then
  common="--variants causal,noncausal,gqa4 --N 4096,16384 --D 128 --check --fwd-only --out $OUT_DIR/bench"
  timeout -k 10 200 python -m eval.bench_flash $common --tag fwd_anchors --impls ours,ours_triton,sdpa_cudnn \
    > "$OUT_DIR/bench_anchors.txt" 2>&1
  echo "== bench anchors: rc=$?"; tail -n 12 "$OUT_DIR/bench_anchors.txt"
  for name in ${impls//,/ }; do
    if [ -f "$OUT_DIR/test_$name.rc" ] && [ "$(cat "$OUT_DIR/test_$name.rc")" != 0 ]; then
      echo "== bench $name: skipped (its tests did not pass)"; continue
    fi
    timeout -k 10 100 python -m eval.bench_flash $common --tag "fwd_ours_$name" --impls "ours_$name" \
      > "$OUT_DIR/bench_$name.txt" 2>&1
    echo "== bench $name: rc=$? (124 = timeout: a hang)"; tail -n 9 "$OUT_DIR/bench_$name.txt"
  done
elif [ "$what" = ab ]; then
  sel="ours,ours_triton,sdpa_cudnn"
  for name in ${impls//,/ }; do
    if [ -f "$OUT_DIR/test_$name.rc" ] && [ "$(cat "$OUT_DIR/test_$name.rc")" != 0 ]; then
      echo "== ab: $name left out (its tests did not pass)"; continue
    fi
    sel="$sel,ours_$name"
  done
  timeout -k 10 330 python -m eval.bench_flash --variants causal,noncausal,gqa4 --N 4096,16384 --D 128 --check \
    --fwd-only --out "$OUT_DIR/bench" --tag fwd_ab --impls "$sel" > "$OUT_DIR/bench_ab.txt" 2>&1
  echo "== ab ($sel): rc=$? (124 = timeout: a hang)"; tail -n 24 "$OUT_DIR/bench_ab.txt"
else
  echo "usage: bash lab/gluon_gpu_check.sh tests|bench|ab [IMPLS]" >&2; exit 2
fi
