"""MLIR's IR printer as the pipeline uses it: the module after a pass, printed into a private
folder (``tree_printing_dir_path``) and read back, half the time of ``str(module)``."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from mlir.passmanager import PassManager


class IRPrinter:
    """The module's text after a pass, printed by MLIR's IR printer into a private folder
    (``tree_printing_dir_path``) and read back: the very text of ``str(module)`` (with
    ``locations``: of ``get_asm(enable_debug_info=True)``), without handing it to Python in
    small pieces."""

    #: what the IR printer writes around the module (``printAfterIfEnabled`` in MLIR's
    #: IRPrinting.cpp): a header line before it, two newlines after it
    HEADER = "// -----// IR Dump After "
    TRAILER = "\n\n"

    #: free space the folder's file system must have: MLIR aborts the process when it cannot
    #: write a file it printed to (a module prints to a few MB, each file is removed once read)
    MIN_FREE_BYTES = 256 * 1024 * 1024

    def __init__(self) -> None:
        """Raises OSError when no folder with room enough can be made."""
        # memory first (/dev/shm: no file system journal), then the temporary folder
        for parent in ("/dev/shm", tempfile.gettempdir()):
            try:
                if (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)
                        and shutil.disk_usage(parent).free >= self.MIN_FREE_BYTES):
                    self.root = tempfile.mkdtemp(prefix="scanweaver-ir-", dir=parent)
                    return
            except OSError:
                continue
        raise OSError("no folder with room for the IR printer")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def attach(self, pm: PassManager, locations: bool, only_change: bool) -> None:
        """Print after the passes of ``pm`` (with ``only_change``: after those that changed
        the module's fingerprint)."""
        pm.enable_ir_printing(print_after_all=True, print_after_change=only_change,
                              enable_debug_info=locations, tree_printing_dir_path=self.root)

    def print(self, op: Any, locations: bool) -> str:
        """The module operation ``op`` as it is now."""
        pm = PassManager()
        pm.add(_leave_alone, "print")
        pm.enable_verifier(False)
        self.attach(pm, locations, only_change=False)
        pm.run(op)
        text = self.take()
        if text is None:
            raise RuntimeError("MLIR's IR printer printed nothing")
        return text

    def take(self) -> str | None:
        """The text printed since the last call, None if nothing was."""
        dumps = [os.path.join(folder, name)
                 for folder, _, names in os.walk(self.root) for name in names]
        if not dumps:
            return None
        if len(dumps) != 1:
            raise RuntimeError(f"MLIR's IR printer wrote {len(dumps)} files for one pass")
        with open(dumps[0], encoding="utf-8", newline="") as f:
            dump = f.read()
        os.unlink(dumps[0])
        header, _, text = dump.partition("\n")
        if not header.startswith(self.HEADER) or not text.endswith(self.TRAILER):
            raise RuntimeError("MLIR's IR printer wrote an unexpected frame around the IR")
        return text[:-len(self.TRAILER)]


#: how a module that fails to verify is printed (MLIR's printer falls back to the generic form)
_GENERIC_MODULE = '"builtin.module"()'


def _leave_alone(op: Any, pass_: Any) -> None:
    """A pass that changes nothing, for the IR printer to print the module after it."""
    del op, pass_


def is_generic(printed: str) -> bool:
    """Whether ``printed`` holds the module in the generic form (after its alias definitions)."""
    start = 0
    while printed.startswith(("#", "!"), start):
        start = printed.find("\n", start) + 1
        if start == 0:
            return False
    return printed.startswith(_GENERIC_MODULE, start)
