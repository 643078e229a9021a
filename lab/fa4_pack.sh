#!/usr/bin/env bash
# FlashAttention-4 for the GPU machine in fewer bytes (lab: not installed):
#
#   bash lab/fa4_pack.sh pack [WHEELS] [OUT] [PARTS]    here, no GPU (~3 min on 2 cores); defaults: .fa4 .fa4x 3
#   bash lab/fa4_pack.sh unpack PARTS_DIR SITE [NAME]   there (lab/gpu_env.sh): the parts into SITE, once all are in
#                                                       (NAME: the parts' prefix, fa4site; tritonsite for lab/triton_pack.sh)
#
# WHEELS is what `bash ../shared/tools/fa4-wheels.sh WHEELS` leaves (WHEELS/1..K/: the CUDA-13 library wheel cut
# into part_* files, the other wheels in the last folder; ~102 MB in all, zip-deflated). `pack` installs them here
# into one site folder (pip --target for CPython 3.12 / manylinux; nothing is imported), packs that folder as one
# tar.xz (68 MB on 2026-12-05: xz -9 against the wheels' deflate) and cuts it into PARTS (1-100) equal parts,
# OUT/1..PARTS/fa4site.ofPARTS.part_NN: each name carries the count. Each call back to back on a warm machine
# carries one of them (`carry: [".fa4x/K"]`); lab/gpu_env.sh copies the part to /tmp/fa4x and runs `unpack`, which
# waits (exit 3, "k of N parts") until all N are there, unpacks them into a folder beside SITE, merges that into
# SITE only when the whole archive read cleanly, and then writes SITE/.fa4x_ok (gpu_env's "installed" mark).
#
# Why: one call may send 64 MiB, tracked tree included (~25 MB on 2026-12-05, mostly results/). The wheels' 34 MB
# parts left about 1 MB of room in the first call (seventeenth session); these ~23 MB parts leave about 10.
# Exit 2, with a message, for a bad mode or argument: WHEELS without part_* files, a flash_attn_4 wheel or one
# nvidia_cutlass_dsl wheel (whose version names the cut library wheel), PARTS not
# an integer in 1-100, OUT equal to or inside WHEELS, parts of different packs or a count that disagrees, an archive
# that does not read (a truncated or corrupt part: SITE is left as it was).
set -euo pipefail
die() { echo "fa4_pack: $*"; exit 2; }
mode=${1:-}
case $mode in
  pack) src=${2:-.fa4}; out=${3:-.fa4x}; parts=${4:-3} ;;
  unpack)
    pdir=${2:-}; site=${3:-}; name=${4:-fa4site}
    [ -n "$pdir" ] && [ -n "$site" ] || die "usage: bash lab/fa4_pack.sh unpack PARTS_DIR SITE [NAME]"
    case $name in *[!a-z0-9]*|'') die "NAME must be lower-case letters and digits, got '$name'" ;; esac
    ok=.fa4x_ok; [ "$name" = fa4site ] || ok=.${name}_ok   # the mark lab/gpu_env.sh reads
    shopt -s nullglob
    have=("$pdir"/"$name".of*.part_*)
    [ ${#have[@]} -gt 0 ] || die "no $pdir/$name.of*.part_* (made by: bash lab/fa4_pack.sh pack, lab/triton_pack.sh)"
    counts=$(printf '%s\n' "${have[@]##*/}" | sed -E "s/^$name\\.of([0-9]+)\\.part_.*/\\1/" | sort -u)
    [ "$(echo "$counts" | wc -l)" -eq 1 ] || die "$pdir holds parts of different packs (of $(echo $counts)): keep one"
    if [ "${#have[@]}" -lt "$((10#$counts))" ]; then
      echo "fa4_pack: ${#have[@]} of $((10#$counts)) parts in $pdir; unpacking once all are there"; exit 3
    fi
    [ "${#have[@]}" -eq "$((10#$counts))" ] || die "$pdir holds ${#have[@]} parts of a pack of $((10#$counts))"
    mkdir -p "$site"
    stage=$(mktemp -d "${site%/}.fa4x.XXXXXX"); trap 'rm -rf "$stage"' EXIT
    # the parts in name order (split -d numbers them), one stream; the 'tar' filter refuses absolute / outside paths
    if ! cat "${have[@]}" | python3 -c \
      "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], filter='tar')" \
      "$stage" 2> "$stage.err"; then
      tail -n 1 "$stage.err"; rm -f "$stage.err"
      die "the parts in $pdir do not read as one archive (a truncated or corrupt part?); $site left as it was"
    fi
    rm -f "$stage.err"
    cp -a "$stage"/. "$site"/ && touch "$site/$ok"
    echo "fa4_pack: unpacked ${#have[@]} parts into $site"
    exit ;;
  *) die "mode must be pack or unpack, got '$mode'" ;;
esac
case $parts in ''|*[!0-9]*) die "PARTS must be an integer in 1-100, got '$parts'" ;; esac
n=$((10#$parts))
[ "$n" -ge 1 ] && [ "$n" -le 100 ] || die "PARTS must be an integer in 1-100, got '$parts'"
shopt -s nullglob
pieces=("$src"/*/part_*); wheels=("$src"/*/*.whl); fa=("$src"/*/flash_attn_4-*.whl)
[ ${#pieces[@]} -gt 0 ] || die "no $src/*/part_* (run: bash ../shared/tools/fa4-wheels.sh $src)"
[ ${#fa[@]} -gt 0 ] || die "no flash_attn_4 wheel under $src/*/"
# the parts' wheel lost its name in the cut; pip needs it back, version included: the CUDA library wheel is pinned to
# nvidia-cutlass-dsl's version (fa4-wheels.sh), so that wheel's name gives it
dsl=("$src"/*/nvidia_cutlass_dsl-*.whl)
[ ${#dsl[@]} -eq 1 ] || die "need one nvidia_cutlass_dsl-<version>-*.whl under $src/*/ (its version names the library wheel), found ${#dsl[@]}"
ver=$(basename "${dsl[0]}"); ver=${ver#nvidia_cutlass_dsl-}; ver=${ver%%-*}
case $ver in ''|*[!0-9.]*) die "cannot read a version from ${dsl[0]} (got '$ver')" ;; esac
src_abs=$(realpath -m "$src"); out_abs=$(realpath -m "$out")
case "$out_abs/" in "$src_abs"/*) die "OUT ($out) must not be WHEELS ($src) or inside it" ;; esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the library wheel, whole again: its parts in name order (split's aa, ab, ...), whatever folder each sits in
for p in "${pieces[@]}"; do printf '%s %s\n' "$(basename "$p")" "$p"; done | sort | cut -d' ' -f2- | xargs -d '\n' cat \
  > "$tmp/nvidia_cutlass_dsl_libs_cu13-$ver-cp312-cp312-manylinux_2_28_x86_64.whl"
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  --target "$tmp/site" "$tmp"/*.whl "${wheels[@]}"
tar -C "$tmp/site" -cf - . | xz -9 -T"${XZ_THREADS:-2}" > "$tmp/fa4site.tar.xz"
size=$(stat -c %s "$tmp/fa4site.tar.xz")
[ "$size" -ge "$n" ] || die "PARTS ($n) is more than the archive's $size bytes"
mkdir "$tmp/parts"
split -b $(( (size + n - 1) / n )) -d -a 2 "$tmp/fa4site.tar.xz" "$tmp/parts/fa4site.of$n.part_"
made=("$tmp"/parts/fa4site.of*.part_*)
# a size that does not divide evenly can leave fewer pieces than asked: the count in the names must be the real one
if [ ${#made[@]} -ne "$n" ]; then
  for p in "${made[@]}"; do mv "$p" "$tmp/parts/fa4site.of${#made[@]}.part_${p##*.part_}"; done
  made=("$tmp"/parts/fa4site.of*.part_*)
fi
rm -rf "$out" && mkdir -p "$out"
k=0
for p in "${made[@]}"; do k=$((k + 1)); mkdir -p "$out/$k"; mv "$p" "$out/$k/"; done
echo "fa4_pack: $(( size / 1000000 )) MB in $k parts"; du -sh "$out"/*
