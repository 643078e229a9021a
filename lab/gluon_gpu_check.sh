#!/usr/bin/env bash
# GPU check of the opt-in Gluon forwards (FlashConfig(fwd_impl="gluon" | "gluon_ws" | "gluon_ws2"), issue 30) on the
# H200, each variant in its own process under a timeout (a hang or a crash of one cannot take the others down).
#
#   bash lab/gluon_gpu_check.sh tests   # -m gpu tests of tests/test_kernel_flash_gluon.py, per variant (<= ~6 min)
#   bash lab/gluon_gpu_check.sh bench   # forward-only timings, causal / noncausal / gqa4, N 4k / 16k, D 128 (<= ~8 min)
#
# Logs and results go under ${OUT:-outputs/gluon_check}; a summary is printed at the end of each step.
set -u
OUT_DIR="${OUT:-outputs/gluon_check}"
mkdir -p "$OUT_DIR"
what="${1:-tests}"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if [ "$what" = tests ]; then
  for sel in "gluon:not gluon_ws" "gluon_ws:gluon_ws and not gluon_ws2" "gluon_ws2:gluon_ws2"; do
    name="${sel%%:*}"; expr="${sel#*:}"
    t=130; [ "$name" = gluon ] && t=200  # the first run compiles the Triton fwd / bwd kernels it compares with
    timeout -k 10 $t python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_flash_gluon.py \
      -k "$expr" > "$OUT_DIR/test_$name.txt" 2>&1
    echo "== tests $name: rc=$? (124 = timeout: a hang)"
    grep -E "passed|failed|error|skipped" "$OUT_DIR/test_$name.txt" | tail -3
    grep -E "^FAILED|^E  " "$OUT_DIR/test_$name.txt" | head -8
  done
elif [ "$what" = bench ]; then
  common="--variants causal,noncausal,gqa4 --N 4096,16384 --D 128 --check --fwd-only --out $OUT_DIR/bench"
  timeout -k 10 150 python -m eval.bench_flash $common --tag fwd_anchors --impls ours,sdpa_cudnn,fa4 \
    > "$OUT_DIR/bench_anchors.txt" 2>&1
  echo "== bench anchors: rc=$?"; tail -n 12 "$OUT_DIR/bench_anchors.txt"
  for impl in ours_gluon ours_gluon_ws ours_gluon_ws2; do
    timeout -k 10 100 python -m eval.bench_flash $common --tag "fwd_$impl" --impls "$impl" \
      > "$OUT_DIR/bench_$impl.txt" 2>&1
    echo "== bench $impl: rc=$? (124 = timeout: a hang)"; tail -n 9 "$OUT_DIR/bench_$impl.txt"
  done
else
  echo "usage: bash lab/gluon_gpu_check.sh tests|bench" >&2; exit 2
fi
