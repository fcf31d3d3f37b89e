#!/usr/bin/env bash
# Sets everything up, then opens JupyterLab on the quickstart notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
extra=()
if [ "$(id -u)" = "0" ]; then extra+=(--allow-root); fi
exec "$PY" -m jupyterlab "${extra[@]}" notebooks/quickstart.ipynb "$@"
