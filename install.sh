#!/usr/bin/env bash
# One-command install for attn-zoo.
#  - GPU machine with a CUDA torch already installed: keeps that torch.
#  - Machine without torch:
#    - with an NVIDIA driver (nvidia-smi): torch==2.13.0 as pip resolves it (the CUDA build);
#    - without one: the CPU build of torch==2.13.0. If the configured index would serve another build (PyPI's
#      default Linux wheel is the multi-GB CUDA one), it comes from the PyTorch CPU index instead
#      ($TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TORCH_SPEC="torch==2.13.0"
if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install "$TORCH_SPEC"
  else
    # which wheel would pip pick? (metadata only: --dry-run --report)
    url=$("$PY" -m pip install "$TORCH_SPEC" --dry-run --quiet --no-deps --ignore-installed --report - 2>/dev/null \
          | "$PY" -c "import json, sys; print(json.load(sys.stdin)['install'][0]['download_info']['url'])" \
          2>/dev/null || true)
    case "$url" in
      *cpu*|*macosx*|*win_amd64*) "$PY" -m pip install "$TORCH_SPEC" ;;
      *) echo "install.sh: no GPU here and the default index serves '${url:-an unknown build}' of torch;" \
              "installing the CPU build from ${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
         "$PY" -m pip install "$TORCH_SPEC" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" ;;
    esac
  fi
fi
"$PY" -m pip install -e ".[dev]"
