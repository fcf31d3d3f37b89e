"""The record of one compiler pass (no MLIR needed to read one)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PassRecord:
    """One pass: its name, the IR after it, how long it took and whether it changed the IR."""

    name: str
    ir: str
    seconds: float
    changed: bool
    pipeline: str = ""     # the textual pipeline that ran it (``builtin.module(...)``)
    #: the lines of ``ir`` each recurrence term ("line:col") became (the pipeline prints the
    #: IR after every pass with its locations and takes them off again)
    locations: dict[str, list[int]] = field(default_factory=dict)
