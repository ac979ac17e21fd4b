#!/usr/bin/env bash
# Set up and start the simulated-cluster demo: JupyterLab on a notebook pod holding a vGPU share.
# Extra arguments go to `jupyter-vgpu demo` (e.g. --no-browser --port 8899).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
exec .venv/bin/jupyter-vgpu demo "$@"
