"""The record of one compiler pass (no MLIR needed to read one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PassRecord:
    """One pass: its name, the IR after it, how long it took and whether it changed the IR."""

    name: str
    ir: str
    seconds: float
    changed: bool
    pipeline: str = ""     # the textual pipeline that ran it (``builtin.module(...)``)
