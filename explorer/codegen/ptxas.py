"""Views of the PTX computed only when asked: ``ptxas`` resource usage and the SASS listing.

These views are optional, the PTX is not: nothing here raises when the CUDA tools are not found
(on PATH, under ``$CUDA_HOME``, ``/usr/local/cuda/bin``, or in the ``nvidia-cuda-nvcc`` wheel),
when the local ``ptxas`` cannot assemble for the chip (ptxas 13 dropped ``sm_70``/``sm_72``;
``sm_101`` was renamed ``sm_110``), when it fails or times out. :func:`ptxas_info` then returns
a record that says why (``{"unavailable": reason}``), :func:`ptxas_report` and :func:`sass`
return None.
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


class PtxasUnavailable(Exception):
    """ptxas is missing, or could not assemble the PTX for the chip; ``str()`` says which."""


def _ptxas(ptx: str, chip: str, workdir: str) -> tuple[str, str]:
    """Assemble ``ptx`` to a cubin in ``workdir``; return (cubin path, ptxas -v output).

    Raises :class:`PtxasUnavailable` with a one-line reason when it cannot.
    """
    exe = find_tool("ptxas")
    if exe is None:
        raise PtxasUnavailable("ptxas was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin "
                               "or the nvidia-cuda-nvcc wheel)")
    src = os.path.join(workdir, "kernel.ptx")
    out = os.path.join(workdir, "kernel.cubin")
    with open(src, "w") as f:
        f.write(ptx)
    try:
        proc = subprocess.run([exe, f"-arch={chip}", "-v", "-o", out, src], capture_output=True,
                              text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PtxasUnavailable(f"ptxas took longer than {_TIMEOUT_S} s for {chip}") from None
    except OSError as err:
        raise PtxasUnavailable(f"ptxas ({exe}) could not be run: {err.strerror or err}") from None
    if proc.returncode != 0:
        raise PtxasUnavailable(f"the local ptxas cannot assemble this PTX for {chip}: "
                               f"{_first_error(proc.stderr + proc.stdout)}")
    return out, proc.stderr + proc.stdout


def _first_error(text: str) -> str:
    """The line of ptxas's output that says what went wrong, without its ``ptxas fatal :``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "fatal" in line or "error" in line:
            return re.sub(r"^ptxas\s+(fatal|error)\s*:\s*", "", line)
    return lines[0] if lines else "no message"


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
    """Resource counts of every kernel in ``ptx``; None when ptxas is missing or cannot
    assemble for ``chip`` (:func:`ptxas_info` says why)."""
    try:
        return _report(ptx, chip)
    except PtxasUnavailable:
        return None


def _report(ptx: str, chip: str) -> dict[str, dict[str, int]]:
    with tempfile.TemporaryDirectory(prefix="scanweaver-ptxas-") as d:
        return parse_ptxas_output(_ptxas(ptx, chip, d)[1])


def ptxas_info(ptx: str, chip: str) -> dict[str, Any]:
    """Registers, spills and shared memory of the main kernel (a flat dict). Other kernels of
    the module (chunk reduce and carry, a readout) are listed under ``other_kernels``.

    Never raises: when ptxas is missing or cannot assemble for ``chip`` the record is
    ``{"unavailable": "<one line saying why>"}`` (the PTX itself is unaffected).
    """
    try:
        report = _report(ptx, chip)
    except PtxasUnavailable as err:
        return {"unavailable": str(err)}
    if not report:
        return {"unavailable": "ptxas reported no entry function"}
    # the helper kernels extend the main kernel's name (scanweaver_blelloch_reduce beside
    # scanweaver_blelloch), whatever order the module lists them in
    helper = ("_reduce", "_carry", "_readout")
    main = min(report, key=lambda n: (n.endswith(helper), len(n), n))
    info: dict[str, Any] = {"kernel": main, **report[main]}
    others = [n for n in report if n != main]
    if others:
        info["other_kernels"] = ", ".join(
            f"{n} ({report[n]['registers']} registers)" for n in others)
    return info


def sass(ptx: str, chip: str) -> str | None:
    """SASS listing of ``ptx`` (ptxas, then nvdisasm or cuobjdump); None without the tools or
    when they cannot handle ``chip``."""
    disasm = find_tool("nvdisasm")
    objdump = find_tool("cuobjdump")
    if disasm is None and objdump is None:
        return None
    with tempfile.TemporaryDirectory(prefix="scanweaver-sass-") as d:
        try:
            cubin = _ptxas(ptx, chip, d)[0]
        except PtxasUnavailable:
            return None
        cmd = [disasm, "-c", cubin] if disasm else [objdump, "-sass", cubin]
        try:
            proc = subprocess.run([c for c in cmd if c], capture_output=True, text=True,
                                  timeout=_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        return proc.stdout
