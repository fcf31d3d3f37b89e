# Sourced by the setup, explore and test scripts: chooses the Python they install into and run.
#
# * An active virtual environment or conda environment is used as it is.
# * Otherwise (a system Python, which Debian 12+ and Ubuntu 23.04+ mark externally managed,
#   PEP 668, or any interpreter outside an environment) the project's own `.venv` is made with
#   `${PYTHON:-python3} -m venv` (installing Debian's python3-venv first when the interpreter
#   lacks venv/ensurepip) and used.
# Afterwards $PY is the interpreter to run.

_base=${PYTHON:-python3}
if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
  PY=$(command -v python || command -v "$_base")
else
  if [ ! -x .venv/bin/python ]; then
    if ! "$_base" -c "import venv, ensurepip" >/dev/null 2>&1; then
      _ver=$("$_base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      if command -v apt-get >/dev/null 2>&1; then
        echo "installing python3-venv (the interpreter $_base cannot make a virtual environment)"
        _sudo=""
        if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then _sudo="sudo"; fi
        $_sudo apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -q python3-venv \
          "python${_ver}-venv" >/dev/null 2>&1 ||
          DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -q python3-venv >/dev/null
      else
        echo "error: $_base cannot make a virtual environment (no venv/ensurepip) and there" \
             "is no apt-get to install it: activate an environment first" >&2
        exit 1
      fi
    fi
    echo "making the project's virtual environment .venv (from $_base)"
    rm -rf .venv
    "$_base" -m venv .venv
  fi
  PY=$PWD/.venv/bin/python
fi
export PATH="$(dirname "$PY"):$PATH"
