#!/usr/bin/env bash
# Create the project's virtual environment on a fresh machine.
# torch==2.13.0 goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
# Then the project with every optional backend, the real Triton pieces and the test tools,
# and finally the one system library perf_analyzer 2.51 links against (libb64).
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${2:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import torch" || { echo "bootstrap: torch failed to install ($TORCH_SPEC)" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q -e ".[all,test,docs]" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import optimizer, onnxruntime, tritonclient.grpc" || { echo "bootstrap: project install failed" >&2; exit 1; }
"$(dirname "$0")/install_system_deps.sh"
