# Source this on the GPU machine (lab: not installed):  . lab/gpu_env.sh [PART]
# Installs what the GPU image lacks from folders carried with the call:
#   .whl/    hydra-core, omegaconf, datasets, fla-core, ... (bash ../shared/tools/gpu-wheels.sh .whl)
#   .fa4/K/  the K-th part of FlashAttention-4 (PART_MB=34 bash ../shared/tools/fa4-wheels.sh .fa4): calls back to
#            back on a warm machine each carry one part; PART names the part carried in this call. The part is
#            copied to /tmp/fa4 (kept while the machine stays warm); once every part is there, FA4 is installed.
#   .fa4x/K/ the same packages in ~23 MB parts (bash lab/fa4_pack.sh pack .fa4 .fa4x 3): unpacked into /tmp/site
#            once every part is in /tmp/fa4x (each part's name says how many). Either works; .fa4x leaves more room.
#   .t39/K/  the K-th part of a newer triton (bash lab/triton_pack.sh): unpacked into /tmp/t39 once all parts are in
#            /tmp/t39x; exported as T39_SITE, for commands that opt in (PYTHONPATH=$T39_SITE:$PYTHONPATH)
#   .data/wikitext-2/valid.txt  a copy of ../shared/data/wikitext-2/valid.txt (../shared does not travel): exported as
#            ATTN_ZOO_WIKITEXT for `eval.bench_flash --docs wikitext:...` unless that is set already.
# Exports PYTHONPATH (/tmp/site, the FA4 DSL packages, the repo), WANDB_MODE=disabled, PYTHONUNBUFFERED=1,
# TRITON_CACHE_AUTOTUNING=1.
# Prints one line saying what is installed; never exits the calling shell.
_part=${1:-}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
# autotuning results on disk (the Triton cache): a later process on the same warm machine reuses them. fla's first
# call on each new shape autotunes for 50-150 s (2026-12-04); a restarted sweep or a second bench need not pay again
export TRITON_CACHE_AUTOTUNING=1
if [ -z "${ATTN_ZOO_WIKITEXT:-}" ] && [ -f .data/wikitext-2/valid.txt ]; then
  export ATTN_ZOO_WIKITEXT=$PWD/.data/wikitext-2/valid.txt
fi
if [ -d .whl ] && ! python3 -c "import hydra, omegaconf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "gpu_env: installing .whl failed"
fi
if [ -n "$_part" ] && [ -d ".fa4/$_part" ]; then
  mkdir -p /tmp/fa4 && cp ".fa4/$_part"/* /tmp/fa4/
fi
# the same, packed smaller by lab/fa4_pack.sh (.fa4x/K/fa4site.ofN.part_*: one tar.xz of the installed packages, in N
# parts): unpacked once all N are in /tmp/fa4x (before that, fa4_pack says "k of N parts"); .fa4x_ok marks it done
# (every .fa4x/K carried in this call, whatever the call: a part rides along with any call, one per call, as the
# tree plus one part is what fits the 64 MiB a call may carry)
for _d in .fa4x/*/; do
  [ -d "$_d" ] && mkdir -p /tmp/fa4x && cp "$_d"* /tmp/fa4x/
done
if [ ! -f /tmp/site/.fa4x_ok ] && ls /tmp/fa4x/fa4site.of*.part_* >/dev/null 2>&1; then
  bash lab/fa4_pack.sh unpack /tmp/fa4x /tmp/site
  case $? in 0|3) ;; *) echo "gpu_env: unpacking .fa4x failed" ;; esac
fi
# a newer triton (bash lab/triton_pack.sh: .t39/K/tritonsite.ofN.part_*), unpacked into /tmp/t39 once all N parts are
# in /tmp/t39x; not on PYTHONPATH: a command opts in with PYTHONPATH=$T39_SITE:$PYTHONPATH (T39_SITE is exported once
# it is unpacked)
# (every .t39/K carried in this call: the part's number need not match the call's)
for _d in .t39/*/; do
  [ -d "$_d" ] && mkdir -p /tmp/t39x && cp "$_d"* /tmp/t39x/
done
if [ ! -f /tmp/t39/.tritonsite_ok ] && ls /tmp/t39x/tritonsite.of*.part_* >/dev/null 2>&1; then
  bash lab/fa4_pack.sh unpack /tmp/t39x /tmp/t39 tritonsite
  case $? in 0|3) ;; *) echo "gpu_env: unpacking .t39 failed" ;; esac
fi
[ -f /tmp/t39/.tritonsite_ok ] && export T39_SITE=/tmp/t39
# triton >= 3.7 runs sm_90 through the "ptxas-blackwell" binary too (only the name is Blackwell's), which
# lab/triton_pack.sh drops to fit: point that name at the wheel's other ptxas (CUDA 12.9 for 3.9.0; sm_90a is fine)
if [ -n "${T39_SITE:-}" ] && [ ! -x "$T39_SITE/triton/backends/nvidia/bin/ptxas-blackwell" ]; then
  export TRITON_PTXAS_BLACKWELL_PATH=$T39_SITE/triton/backends/nvidia/bin/ptxas
fi

# the cut library wheel's name, version included, from nvidia_cutlass_dsl's wheel (pinned alike; as lab/fa4_pack.sh)
_dsl=$(ls /tmp/fa4/nvidia_cutlass_dsl-*.whl 2>/dev/null | head -n 1); _ver=${_dsl##*/nvidia_cutlass_dsl-}
_big=/tmp/fa4/nvidia_cutlass_dsl_libs_cu13-${_ver%%-*}-cp312-cp312-manylinux_2_28_x86_64.whl
if [ ! -d /tmp/site/flash_attn ] && [ -n "$_dsl" ] && ls /tmp/fa4/flash_attn_4-*.whl >/dev/null 2>&1; then
  if [ "$(ls /tmp/fa4/part_* 2>/dev/null | wc -l)" -ge "${FA4_PARTS:-3}" ]; then
    cat /tmp/fa4/part_* > "$_big"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/fa4/*.whl \
      || echo "gpu_env: installing FA4 failed"
  fi
fi
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 - <<'EOF'
import importlib.util as u
have = {m: u.find_spec(m) is not None for m in ("hydra", "omegaconf", "datasets", "fla")}
try:
    from flash_attn.cute import flash_attn_func  # noqa: F401
    have["flash_attn.cute"] = True
except Exception as e:  # noqa: BLE001
    have["flash_attn.cute"] = f"no ({type(e).__name__})"
import os
have["triton39"] = bool(os.environ.get("T39_SITE"))
print("gpu_env:", ", ".join(f"{k}={v}" for k, v in have.items()))
EOF
