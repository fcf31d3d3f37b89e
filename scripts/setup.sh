#!/usr/bin/env bash
# Installs everything ScanWeaver Explorer needs on a Debian/Ubuntu machine:
# system packages (graphviz's `dot`, Chromium for the browser tests) and the Python package with
# its development extras, into the active environment or the project's `.venv` (see
# scripts/python.sh).  Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${need_apt[*]}"
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null
  else
    echo "warning: please install ${need_apt[*]} with your package manager" >&2
  fi
fi

source scripts/python.sh
echo "installing the package into $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev]"
