#!/usr/bin/env bash
# Sets up .venv and runs `flashscale demo` (GPU if there is one, else the CPU). Extra arguments go to demo.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q -e .
exec .venv/bin/flashscale demo "$@"
