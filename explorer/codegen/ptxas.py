"""Views of the PTX computed only when asked: ``ptxas`` resource usage and the SASS listing.

Both return ``None`` when the CUDA tools are not found (on PATH, under ``$CUDA_HOME``,
``/usr/local/cuda/bin``, or in the ``nvidia-cuda-nvcc`` wheel), never raise for a missing tool.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

_TIMEOUT_S = 60


def find_tool(name: str) -> str | None:
    """Path of a CUDA tool (``ptxas``, ``nvdisasm``, ``cuobjdump``), or None."""
    found = shutil.which(name)
    if found:
        return found
    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    candidates = [os.path.join(r, "bin", name) for r in roots if r]
    candidates.append(os.path.join("/usr/local/cuda/bin", name))
    for site in sys.path:   # the PyPI wheels: nvidia/cuda_nvcc/bin, nvidia/cu13/bin
        candidates += glob.glob(os.path.join(site, "nvidia", "*", "bin", name))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def find_libdevice() -> str | None:
    """Path of CUDA's ``libdevice.10.bc`` (toolkit or ``nvidia-cuda-nvcc`` wheel), or None."""
    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    candidates = [os.path.join(r, "nvvm", "libdevice", "libdevice.10.bc") for r in roots if r]
    candidates.append("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc")
    ptxas = shutil.which("ptxas")
    if ptxas:  # <toolkit>/bin/ptxas -> <toolkit>/nvvm/libdevice
        root = os.path.dirname(os.path.dirname(os.path.realpath(ptxas)))
        candidates.append(os.path.join(root, "nvvm", "libdevice", "libdevice.10.bc"))
    for site in sys.path:
        candidates += glob.glob(os.path.join(site, "nvidia", "*", "nvvm", "libdevice",
                                             "libdevice.10.bc"))
    for c in candidates:
        if os.path.isfile(c):
            return c
    return None


def _ptxas(ptx: str, chip: str, workdir: str) -> tuple[str, str] | None:
    """Assemble ``ptx`` to a cubin in ``workdir``; return (cubin path, ptxas -v output)."""
    exe = find_tool("ptxas")
    if exe is None:
        return None
    src = os.path.join(workdir, "kernel.ptx")
    out = os.path.join(workdir, "kernel.cubin")
    with open(src, "w") as f:
        f.write(ptx)
    proc = subprocess.run([exe, f"-arch={chip}", "-v", "-o", out, src], capture_output=True,
                          text=True, timeout=_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas rejected the PTX:\n{proc.stderr.strip()}")
    return out, proc.stderr + proc.stdout


_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_NUMS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spills_stores": re.compile(r"(\d+) bytes spill stores"),
    "spills_loads": re.compile(r"(\d+) bytes spill loads"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
}


def parse_ptxas_output(text: str) -> dict[str, dict[str, int]]:
    """``ptxas -v`` output -> entry name -> resource counts."""
    result: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            current = result.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        for key, pattern in _NUMS.items():
            hit = pattern.search(line)
            if hit:
                current[key] = int(hit.group(1))
    for counts in result.values():
        for key in ("registers", "barriers", "shared_bytes", "stack_bytes", "spills_stores",
                    "spills_loads"):
            counts.setdefault(key, 0)
    return result


def ptxas_report(ptx: str, chip: str) -> dict[str, dict[str, int]] | None:
    """Resource counts of every kernel in ``ptx``; None without ptxas."""
    with tempfile.TemporaryDirectory(prefix="scanweaver-ptxas-") as d:
        done = _ptxas(ptx, chip, d)
        if done is None:
            return None
        return parse_ptxas_output(done[1])


def ptxas_info(ptx: str, chip: str) -> dict[str, Any] | None:
    """Registers, spills and shared memory of the main kernel (a flat dict); None without
    ptxas. Other kernels of the module (a readout kernel) are listed under ``other_kernels``."""
    report = ptxas_report(ptx, chip)
    if not report:
        return None
    names = sorted(report, key=lambda n: n.endswith("_readout"))
    main = names[0]
    info: dict[str, Any] = {"kernel": main, **report[main]}
    if len(names) > 1:
        info["other_kernels"] = ", ".join(
            f"{n} ({report[n]['registers']} registers)" for n in names[1:])
    return info


def sass(ptx: str, chip: str) -> str | None:
    """SASS listing of ``ptx`` (ptxas, then nvdisasm or cuobjdump); None without the tools."""
    disasm = find_tool("nvdisasm")
    objdump = find_tool("cuobjdump")
    if disasm is None and objdump is None:
        return None
    with tempfile.TemporaryDirectory(prefix="scanweaver-sass-") as d:
        done = _ptxas(ptx, chip, d)
        if done is None:
            return None
        cubin = done[0]
        cmd = [disasm, "-c", cubin] if disasm else [objdump, "-sass", cubin]
        proc = subprocess.run([c for c in cmd if c], capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            return None
        return proc.stdout
