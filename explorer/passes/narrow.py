"""Pass ``scan-narrow``: the 16-bit buffers of a ``bfloat16``/``float16`` compile.

Runs after ``scan-lower`` when the compile's ``dtype`` (or ``out_dtype``) is 16-bit: the kernel
arguments the contract gives a 16-bit dtype become memrefs of ``bf16``/``f16``, their loads
``arith.extf`` to f32 and their stores ``arith.truncf`` from it
(:func:`explorer.codegen.narrow.narrow_buffers`). The arithmetic is untouched: it stays f32.
"""

from __future__ import annotations

from typing import Any

from explorer.passes.state import ScanState

NAME = "scan-narrow"


def wanted(state: ScanState) -> bool:
    """True when the compile stores some array in 16 bits (the pass has work to do)."""
    return state.options.dtype != "float32" or state.options.output_dtype != "float32"


def make(state: ScanState) -> Any:
    def run(module_op: Any, pass_: Any) -> None:
        from explorer.codegen.narrow import narrow_buffers

        if state.built is None:
            raise ValueError(f"{NAME} runs after scan-lower")
        narrow_buffers(module_op, state.built.args)
    return run
