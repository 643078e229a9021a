#!/usr/bin/env bash
# One-command install for attn-zoo.
#  - CPU machine without torch: installs the CPU build torch==2.13.0 first (a plain `torch`
#    requirement would pull a multi-GB CUDA build).
#  - GPU machine with a CUDA torch already installed: keeps that torch.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install "torch==2.13.0"
fi
"$PY" -m pip install -e ".[dev]"
