#!/usr/bin/env bash
# A newer triton for the GPU machine, in parts small enough to carry (lab: not installed):
#
#   bash lab/triton_pack.sh [VERSION] [OUT] [PARTS]     here, no GPU (~5 min on 2 cores); defaults: 3.9.0 .t39 4
#
# The GPU image has torch 2.11 with triton 3.6; `pip install torch` today brings triton 3.9, whose Gluon renamed two
# calls the kernels use (kernels/flash/_gluon_kernels.py picks either) and added the TMA reduce-add
# (`tma.async_atomic_add`) that the fused dQ (`gluon_bwd_dq="tma"`) needs. This downloads the CPython 3.12 manylinux
# wheel of triton VERSION, installs it (no dependencies) into a folder, drops what an NVIDIA Hopper run does not
# load (the AMD backend, the Blackwell ptxas, CUPTI: ~400 MB of the ~1 GB), packs the rest as one tar.xz (110.7 MB
# for 3.9.0) and cuts it into PARTS equal parts OUT/1..PARTS/tritonsite.ofPARTS.part_NN. One call carries one part
# (`carry: [".t39/K"]`: 27.7 MB each with PARTS=4; the tracked tree counts ~35 MiB on disk and 64 MiB is all a call
# may send: two parts of 55.3 MB were refused on 2026-12-06, three of 36.9 MB too), calls back to back on a
# warm machine; `. lab/gpu_env.sh` copies each to /tmp/t39x and, once all are there, unpacks them into /tmp/t39
# (lab/fa4_pack.sh unpack /tmp/t39x /tmp/t39 tritonsite; the mark /tmp/t39/.tritonsite_ok). Run with it:
#
#   PYTHONPATH=/tmp/t39:$PYTHONPATH python3 -m pytest -m gpu tests/test_kernel_flash_gluon.py ...
#
# (torch 2.11 itself stays: kernels launched by triton.jit run; torch.compile / Flex, which pin triton 3.6 through
# inductor, are not expected to.) Exit 2, with a message, for a bad argument or a download that fails.
set -euo pipefail
die() { echo "triton_pack: $*"; exit 2; }
ver=${1:-3.9.0}; out=${2:-.t39}; parts=${3:-4}
case $ver in ''|*[!0-9.]*) die "VERSION must look like 3.9.0, got '$ver'" ;; esac
case $parts in ''|*[!0-9]*) die "PARTS must be an integer in 1-100, got '$parts'" ;; esac
n=$((10#$parts))
[ "$n" -ge 1 ] && [ "$n" -le 100 ] || die "PARTS must be an integer in 1-100, got '$parts'"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/dl" "triton==$ver" || die "pip could not download triton==$ver"
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --target "$tmp/site" "$tmp"/dl/triton-*.whl
t=$tmp/site/triton
[ -f "$t/_C/libtriton.so" ] || die "the wheel has no triton/_C/libtriton.so"
rm -rf "$t/backends/amd" "$t/backends/nvidia/bin/ptxas-blackwell" "$t"/backends/nvidia/lib/cupti*
# triton finds its backends by the dist-info's entry points too: drop the one whose folder is gone
for ep in "$tmp"/site/triton-*.dist-info/entry_points.txt; do
  [ -f "$ep" ] && sed -i '/^amd = triton.backends.amd$/d' "$ep"
done
tar -C "$tmp/site" -cf - . | xz -6 -T"${XZ_THREADS:-2}" > "$tmp/tritonsite.tar.xz"
size=$(stat -c %s "$tmp/tritonsite.tar.xz")
mkdir "$tmp/parts"
split -b $(( (size + n - 1) / n )) -d -a 2 "$tmp/tritonsite.tar.xz" "$tmp/parts/tritonsite.of$n.part_"
made=("$tmp"/parts/tritonsite.of*.part_*)
[ ${#made[@]} -eq "$n" ] || die "the archive ($size bytes) split into ${#made[@]} parts, not $n: pick another PARTS"
rm -rf "$out" && mkdir -p "$out"
k=0
for p in "${made[@]}"; do k=$((k + 1)); mkdir -p "$out/$k"; mv "$p" "$out/$k/"; done
echo "triton_pack: triton $ver, $(( size / 1000000 )) MB in $k parts"; du -sh "$out"/*
