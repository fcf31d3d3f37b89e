#!/usr/bin/env bash
# Sets everything up, then opens JupyterLab on the quickstart notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
extra=()
if [ "$(id -u)" = "0" ]; then extra+=(--allow-root); fi
exec "${PYTHON:-python3}" -m jupyterlab "${extra[@]}" notebooks/quickstart.ipynb "$@"
