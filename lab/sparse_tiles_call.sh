#!/usr/bin/env bash
# Block-sparse forward / dQ tiles against Flex+FA4 (lab: not installed), one device call after `frontier_calls.sh`
# has put FA4 parts in /tmp/fa4x (this call carries the last one and names it: `bash lab/sparse_tiles_call.sh 3`).
# The masks (BigBird, strided) at N 1k / 16k: ours at the default tiles with Flex+FA4 in the same process, then ours
# alone with each forced config of SPARSE_CONFIGS (name=JSON of kernels.FlashConfig fields, ';'-separated), so each
# config's ratio to Flex+FA4 is its time against the same call's anchor. Writes $OUT/sparse/.
set -u
[ -n "${OUT:-}" ] || { echo "sparse_tiles_call: OUT is not set"; exit 2; }
# shellcheck disable=SC1091
. lab/gpu_env.sh "${1:-}"
W=$OUT/sparse; mkdir -p "$W"
t() { printf '{"BLOCK_M": %s, "BLOCK_N": %s, "num_warps": %s, "num_stages": %s}' "$@"; }
kv="$(t 64 64 4 2)"
SPARSE_CONFIGS=${SPARSE_CONFIGS:-"f128x64w8s3={\"sparse_fwd\": $(t 128 64 8 3), \"sparse_dq\": $(t 128 64 8 3), \"sparse_dkdv\": $kv};f128x128w8s2={\"sparse_fwd\": $(t 128 128 8 2), \"sparse_dq\": $(t 128 128 8 2), \"sparse_dkdv\": $kv}"}
timeout -k 5 "${ANCHOR_S:-170}" python3 -m eval.bench_flash --out "$W" --tag default --variants bigbird,strided \
  --N 1024,16384 --D 128 --impls ours,flex_fa4 --rounds 3 --check --time-budget-s $(( ${ANCHOR_S:-170} - 15 )) \
  > "$W/default.log" 2>&1; echo "== default rc=$?"
grep -E "^ *(bigbird|strided) " "$W/default.log" | cut -c1-170
IFS=';' read -ra cfgs <<< "$SPARSE_CONFIGS"
for c in "${cfgs[@]}"; do
  name=${c%%=*}; json=${c#*=}
  timeout -k 5 "${CONFIG_S:-80}" python3 -m eval.bench_flash --out "$W" --tag "$name" --variants bigbird,strided \
    --N 1024,16384 --D 128 --impls ours --rounds 3 --check --flash-config "$json" \
    --time-budget-s $(( ${CONFIG_S:-80} - 10 )) > "$W/$name.log" 2>&1; echo "== $name rc=$?"
  grep -E "^ *(bigbird|strided) " "$W/$name.log" | cut -c1-170
done
