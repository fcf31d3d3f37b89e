"""Launches every artifact of the GPU tests at shapes that end tiles, chunks and look-back
windows part way, with each array in an allocation of its own (CuPy's pool off; torch's caching
allocator off through PYTORCH_NO_CUDA_MEMORY_CACHING=1, set by the caller), so that a read or
write past an array is past an allocation, which compute-sanitizer's memcheck reports.
Run by ``test_memcheck_gpu.py`` under ``compute-sanitizer --tool memcheck``; prints how many
launches it made.

    compute-sanitizer --tool memcheck python3 tests/gpu/memcheck_driver.py [NAME_SUBSTRING]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy as cp  # noqa: E402

from explorer.bench.inputs import mamba_shape, random_inputs  # noqa: E402
from explorer.runtime.cuda import CudaKernel  # noqa: E402

ART = Path(__file__).resolve().parent / "artifacts"
#: (channels, steps) of scalar recurrences: one step, a tile and a bit, a partial last tile,
#: and few long sequences (chunked or look-back grids, a partial last tile)
SCALAR_SHAPES = [(1, 1), (7, 33), (3, 1000), (2, 70001)]
#: (channels, lanes, steps) of vector recurrences
VECTOR_SHAPES = [(1, 16, 1), (3, 16, 300), (2, 16, 5001), (5, 3, 77)]


def main(argv: list[str]) -> int:
    cp.cuda.set_allocator(None)   # every array its own cudaMalloc
    pick = argv[0] if argv else ""
    index = json.loads((ART / "index.json").read_text())["artifacts"]
    launches = 0
    for name, info in sorted(index.items()):
        if pick not in name:
            continue
        kernel = CudaKernel.from_artifact(ART / name)
        shapes = VECTOR_SHAPES if info["vector"] else [(C, 1, L) for C, L in SCALAR_SHAPES]
        for i, (C, N, L) in enumerate(shapes):
            arrays = {k: cp.asarray(v) for k, v in random_inputs(kernel, C, L, N, i).items()}
            out = kernel(**arrays)
            outs = out if isinstance(out, dict) else {"out": out}
            for v in outs.values():
                if not bool(cp.isfinite(v).all()):
                    print(f"{name} at {C} x {N} x {L}: non-finite output")
                    return 1
            launches += 1
        cp.cuda.Device().synchronize()
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():   # the launch plans, Mamba's layout
        for name in sorted(index):
            if pick not in name or not name.startswith("mamba-selective-scan"):
                continue
            kernel = CudaKernel.from_artifact(ART / name)
            B, D, N, L = 2, 3, 16, 333
            # Mamba's layout (B, C per batch row, A, D per channel), its values: dt and the
            # rest in [0, 0.2), A in [-1, -0.8)
            t = {s.name: torch.rand(mamba_shape(s, B, D, N, L), device="cuda") * 0.2
                 - float(s.name == "A") for s in kernel.specs}
            out = kernel.launch_torch(**t)
            torch.cuda.synchronize()
            assert all(bool(torch.isfinite(v).all()) for v in out.values()), name
            launches += 1
    print(f"launched {launches} times")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
