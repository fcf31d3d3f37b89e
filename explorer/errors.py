"""Errors raised by every stage of the compiler, with enough context to act on them."""

from __future__ import annotations

from dataclasses import dataclass


class RecurrenceError(ValueError):
    """The recurrence text (or the arrays given for it) is not in the language.

    ``str(err)`` names the problem and, where there is a source position, shows the line with a
    caret under the offending column.
    """

    def __init__(self, message: str, source: str | None = None, line: int | None = None,
                 col: int | None = None, length: int = 1) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.col = col
        self.length = max(1, length)
        super().__init__(self._render())

    def _render(self) -> str:
        if self.source is None or self.line is None or self.col is None:
            return self.message
        lines = self.source.splitlines() or [""]
        text = lines[min(self.line, len(lines)) - 1]
        caret = " " * self.col + "^" * min(self.length, max(1, len(text) - self.col))
        where = f"line {self.line}, column {self.col + 1}"
        return f"{self.message}\n  {where}:\n    {text}\n    {caret}"


class OptionError(ValueError):
    """A compile option (strategy, target, block size, chip, ...) has a value we do not support."""


@dataclass
class Reproducer:
    """What a person needs to replay a failing pass outside Python."""

    ir_path: str
    command: str


class CompileError(RuntimeError):
    """A verification or a pass failed; carries the pass, MLIR's diagnostics and a reproducer."""

    def __init__(self, message: str, pass_name: str | None = None, diagnostics: str = "",
                 ir_before: str | None = None, reproducer: Reproducer | None = None) -> None:
        self.pass_name = pass_name
        self.diagnostics = diagnostics
        self.ir_before = ir_before
        self.reproducer = reproducer
        parts = [message]
        if pass_name:
            parts.append(f"failing pass: {pass_name}")
        if diagnostics:
            parts.append(f"diagnostics:\n{diagnostics}")
        if reproducer is not None:
            parts.append(f"reproduce with: {reproducer.command}")
        super().__init__("\n".join(parts))


class LaunchError(RuntimeError):
    """A kernel launch failed on the device; names the kernel and the launch geometry."""
