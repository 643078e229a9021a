#!/usr/bin/env bash
# FlashAttention-4 for the GPU machine in fewer bytes (lab: not installed):
#
#   bash lab/fa4_pack.sh pack [WHEELS] [OUT] [PARTS]    here, no GPU (~3 min on 2 cores); defaults: .fa4 .fa4x 3
#   bash lab/fa4_pack.sh unpack PARTS_DIR SITE          there (lab/gpu_env.sh): every fa4site.part_* into SITE
#
# WHEELS is what `bash ../shared/tools/fa4-wheels.sh WHEELS` leaves (WHEELS/1..K/: the CUDA-13 library wheel cut
# into part_* files, the other wheels in the last folder; ~102 MB in all, zip-deflated). `pack` installs them here
# into one site folder (pip --target for CPython 3.12 / manylinux; nothing is imported), packs that folder as one
# tar.xz (68 MB on 2026-12-05: xz -9 against the wheels' deflate) and cuts it into PARTS equal parts,
# OUT/1..PARTS/fa4site.part_NN. Each call back to back on a warm machine carries one of them (`carry: [".fa4x/K"]`);
# lab/gpu_env.sh copies the part to /tmp/fa4x and, once FA4X_PARTS (default 3) are there, runs `unpack`.
#
# Why: one call may send 64 MiB, tracked tree included (~25 MB on 2026-12-05, mostly results/). The wheels' 34 MB
# parts left about 1 MB of room in the first call (seventeenth session); these ~23 MB parts leave about 10.
# Exits 2 with a message for a bad mode, a WHEELS without part_* files or a flash_attn_4 wheel, a PARTS that is not a
# positive integer, or a PARTS_DIR without parts.
set -euo pipefail
mode=${1:-}
case $mode in
  pack) src=${2:-.fa4}; out=${3:-.fa4x}; parts=${4:-3} ;;
  unpack)
    pdir=${2:-}; site=${3:-}
    [ -n "$pdir" ] && [ -n "$site" ] || { echo "fa4_pack: usage: bash lab/fa4_pack.sh unpack PARTS_DIR SITE"; exit 2; }
    ls "$pdir"/fa4site.part_* >/dev/null 2>&1 || { echo "fa4_pack: no $pdir/fa4site.part_*"; exit 2; }
    mkdir -p "$site"
    # the parts in name order (split -d numbers them), one stream, unpacked with the 'tar' filter (no absolute paths)
    cat "$pdir"/fa4site.part_* | python3 -c \
      "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], filter='tar')" \
      "$site"
    exit ;;
  *) echo "fa4_pack: mode must be pack or unpack, got '$mode'"; exit 2 ;;
esac
case $parts in ''|*[!0-9]*|0) echo "fa4_pack: PARTS must be a positive integer, got '$parts'"; exit 2 ;; esac
shopt -s nullglob
pieces=("$src"/*/part_*); wheels=("$src"/*/*.whl)
[ ${#pieces[@]} -gt 0 ] || { echo "fa4_pack: no $src/*/part_* (run: bash ../shared/tools/fa4-wheels.sh $src)"; exit 2; }
ls "$src"/*/flash_attn_4-*.whl >/dev/null 2>&1 || { echo "fa4_pack: no flash_attn_4 wheel under $src/*/"; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the library wheel, whole again: its parts in name order (split's aa, ab, ...), whatever folder each sits in
for p in "${pieces[@]}"; do printf '%s %s\n' "$(basename "$p")" "$p"; done | sort | cut -d' ' -f2- | xargs -d '\n' cat \
  > "$tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --target "$tmp/site" "$tmp"/*.whl "${wheels[@]}"
tar -C "$tmp/site" -cf - . | xz -9 -T"${XZ_THREADS:-2}" > "$tmp/fa4site.tar.xz"
size=$(stat -c %s "$tmp/fa4site.tar.xz")
rm -rf "$out" && mkdir -p "$out"
split -b $(( (size + parts - 1) / parts )) -d -a 2 "$tmp/fa4site.tar.xz" "$tmp/fa4site.part_"
k=0
for p in "$tmp"/fa4site.part_*; do k=$((k + 1)); mkdir -p "$out/$k"; mv "$p" "$out/$k/"; done
echo "fa4_pack: $(( size / 1000000 )) MB in $k parts"; du -sh "$out"/*
