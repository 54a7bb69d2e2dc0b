#!/usr/bin/env bash
# Sets up .venv and runs `flashscale demo` (GPU if there is one, else the CPU). Extra arguments go to demo.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
# Triton: the version the kernels are tested with (here under the interpreter, and on the H200). The CPU
# build of torch pins none, and the newest release changed the interpreter's mask handling (seen with
# 3.9.0, 2026-11): keep 3.6.0 unless a CUDA torch brought its own.
.venv/bin/python -c "import triton" 2>/dev/null || .venv/bin/pip install -q triton==3.6.0
.venv/bin/pip install -q -e .
exec .venv/bin/flashscale demo "$@"
