#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
exec "$PY" -m pytest "$@"
