#!/usr/bin/env bash
# Source this on a GPU machine that cannot reach a package index: installs the peers the
# benchmark compares against from wheels carried in .whl/ (and .whl/*.tar.xz site bundles),
# then prints what is there. Usage: source tests/gpu/device_setup.sh
SITE=/tmp/scanweaver-site
mkdir -p "$SITE"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || echo "wheel install failed"
fi
for t in .whl/*.tar.xz; do [ -e "$t" ] && tar -xJf "$t" -C "$SITE"; done
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY'
from importlib.metadata import version
for d in ("numpy", "cupy-cuda13x", "torch", "jax", "sympy", "cuda-bindings", "cuda-core",
          "cuda-pathfinder", "numba", "llvmlite", "numba-cuda", "cuda-cccl", "accelerated-scan",
          "tqdm", "plotly", "pytest"):
    try:
        print(f"  {d} {version(d)}")
    except Exception:
        print(f"  {d} -")
PY
