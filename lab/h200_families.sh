#!/usr/bin/env bash
# Issue 26 item 7 on one H200, one device call (lab: not installed):
#   . lab/gpu_env.sh && OUT=... bash lab/h200_families.sh
# 0. lab.ceilings and lab.decode_probe --matrix alone (issue 29);
# 1. eval.bench_ssd alone (ours vs fla's chunked simple-GLA scan vs our exact kernel, fwd and fwd+bwd);
# 2. eval.bench_model alone: model tokens/s of flash / mamba2 / deltanet / gated_deltanet / mla (conf specs) and a
#    Mamba-2 hybrid, small and large sizes;
# 3. then, side by side: MQAR (Zoology fig. 2 cells of the new families, and Mamba-2 hybrids) through
#    lab/h200_quality.sh, Tiny Shakespeare bpb of the new families, `pytest -m gpu` and
#    the README's `python train.py trainer=gpu`.
# Each step is bounded (SSD_S, MODEL_S, QUALITY_S seconds); results under $OUT.
set -u
out=${OUT:-.}
mkdir -p "$out/ssd" "$out/model"
python3 -m lab.ceilings "$out/ceilings.json" || echo "ceilings: failed (not fatal)"
mkdir -p "$out/decode"
timeout -k 5 "${DECODE_S:-130}" python3 -m lab.decode_probe --matrix --budget-s $(( ${DECODE_S:-130} - 25 )) \
  --out "$out/decode" > "$out/decode/log.txt" 2>&1; echo "decode_probe rc=$?"; tail -n 30 "$out/decode/log.txt"
timeout -k 5 "${SSD_S:-150}" python3 -m eval.bench_ssd --out "$out/ssd" --lengths 1024,2048,4096,8192,16384 \
  > "$out/ssd/log.txt" 2>&1; echo "bench_ssd rc=$?"; tail -n 25 "$out/ssd/log.txt"
V=flash,mamba2,deltanet,gated_deltanet,mla,mamba2+mamba2+mamba2+flash
timeout -k 5 "${MODEL_S:-100}" python3 -m eval.bench_model --out "$out/model" --sizes small --specs conf \
  --variants "$V" --seq-lens 2048 --tokens 65536 --vocab 8192 --backends triton --steps 10 --warmup 3 \
  > "$out/model/log.txt" 2>&1; echo "bench_model rc=$?"; tail -n 15 "$out/model/log.txt"
( timeout -k 5 "$(( ${QUALITY_S:-290} + 10 ))" python3 train.py trainer=gpu logger=csv hydra.run.dir=outputs/readme_gpu \
    > "$out/train_gpu.log" 2>&1; echo "rc=$?" >> "$out/train_gpu.log" ) &
( timeout -k 5 "$(( ${QUALITY_S:-290} + 10 ))" python3 -m pytest -m gpu -q -p no:cacheprovider -n 3 \
    > "$out/pytest_gpu.txt" 2>&1; echo "rc=$?" >> "$out/pytest_gpu.txt" ) &
OUT=$out bash lab/h200_quality.sh "${QUALITY_S:-290}" results/h200/quality/runs \
  "lm_shakespeare:4:attention=mamba2,gated_deltanet,mla data.seq_len=512,2048" \
  "mqar_fig2:6:attention=mamba2,deltanet,gated_deltanet,mla model.d_model=128,256 data.seq_len=256 optim.lr=3e-3" \
  "mqar_hybrid:3:model.layers=choice([mamba2,mamba2,mamba2,mamba2],[mamba2,mamba2,mamba2,flash],[mamba2,mamba2,flash,flash])"
wait
tail -n 25 "$out/pytest_gpu.txt"; tail -n 12 "$out/train_gpu.log"
