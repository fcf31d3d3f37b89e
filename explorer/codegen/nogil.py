"""Run an MLIR pass manager with the GIL released, so that Python work can go on beside it.

The bindings' ``PassManager.run`` holds the GIL for the whole run: nothing else of the process
runs meanwhile (measured: a Python loop beside the NVPTX backend waits until it is done). The
same run through MLIR's C API (``mlirPassManagerRunOnOp`` of the library the bindings load),
called with :mod:`ctypes`, releases it, so a thread of ours can run the backend while the
pipeline's thread prints the IR after the earlier passes.

Two things of the bindings must not be met without the GIL: a diagnostic handler written in
Python (the bindings abort the process when it is called from such a run) and a pass written in
Python. :class:`Diagnostics` therefore collects the diagnostics of the run through a handler
of ``ctypes``' own (which takes the GIL itself), attached last, so it comes before the Python
one; and only managers of upstream passes are run here.

:func:`released_run` is None where the library or its C API cannot be found: the pipeline then
runs everything through the bindings, one thing after another.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any


class _Ptr(ctypes.Structure):
    """MlirContext, MlirOperation, MlirPassManager, MlirDiagnostic, MlirLocation: a pointer."""

    _fields_ = [("ptr", ctypes.c_void_p)]


class _StringRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]


class _Result(ctypes.Structure):
    """MlirLogicalResult."""

    _fields_ = [("value", ctypes.c_int8)]


_STRING_CALLBACK = ctypes.CFUNCTYPE(None, _StringRef, ctypes.c_void_p)
# MlirLogicalResult is a struct of one int8, returned in a register as the int8 alone would be
# (ctypes callbacks cannot return structures)
_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int8, _Ptr, ctypes.c_void_p)


def _library() -> Any | None:
    try:
        import mlir._mlir_libs as libs

        lib = ctypes.CDLL(os.path.join(os.path.dirname(libs.__file__), "libMLIRPythonCAPI.so"))
        lib.mlirPassManagerRunOnOp.restype = _Result
        lib.mlirPassManagerRunOnOp.argtypes = [_Ptr, _Ptr]
        lib.mlirContextAttachDiagnosticHandler.restype = ctypes.c_uint64
        lib.mlirContextAttachDiagnosticHandler.argtypes = [_Ptr, _HANDLER, ctypes.c_void_p,
                                                           ctypes.c_void_p]
        lib.mlirContextDetachDiagnosticHandler.restype = None
        lib.mlirContextDetachDiagnosticHandler.argtypes = [_Ptr, ctypes.c_uint64]
        lib.mlirDiagnosticPrint.restype = None
        lib.mlirDiagnosticPrint.argtypes = [_Ptr, _STRING_CALLBACK, ctypes.c_void_p]
        lib.mlirDiagnosticGetLocation.restype = _Ptr
        lib.mlirDiagnosticGetLocation.argtypes = [_Ptr]
        lib.mlirLocationPrint.restype = None
        lib.mlirLocationPrint.argtypes = [_Ptr, _STRING_CALLBACK, ctypes.c_void_p]
        lib.mlirDiagnosticGetNumNotes.restype = ctypes.c_ssize_t
        lib.mlirDiagnosticGetNumNotes.argtypes = [_Ptr]
        lib.mlirDiagnosticGetNote.restype = _Ptr
        lib.mlirDiagnosticGetNote.argtypes = [_Ptr, ctypes.c_ssize_t]
    except (ImportError, OSError, AttributeError):
        return None
    return lib


_LIB: Any = _library()

_API = ctypes.pythonapi
_API.PyCapsule_GetName.restype = ctypes.c_char_p
_API.PyCapsule_GetName.argtypes = [ctypes.py_object]
_API.PyCapsule_GetPointer.restype = ctypes.c_void_p
_API.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _pointer(obj: Any) -> _Ptr:
    """The C API handle of a bindings object (its ``_CAPIPtr`` capsule)."""
    capsule = obj._CAPIPtr
    return _Ptr(_API.PyCapsule_GetPointer(capsule, _API.PyCapsule_GetName(capsule)))


def _text(print_: Callable[..., None], handle: _Ptr) -> str:
    pieces: list[bytes] = []

    def take(ref: _StringRef, _: Any) -> None:
        pieces.append(ctypes.string_at(ref.data, ref.length))

    print_(handle, _STRING_CALLBACK(take), None)
    return b"".join(pieces).decode("utf-8", "replace")


class Diagnostics:
    """The diagnostics a context emits while attached (``with Diagnostics(ctx) as d``): each
    as ``location: message`` in ``d.lines``, its notes after it, as the pipeline writes them."""

    def __init__(self, context: Any) -> None:
        self.lines: list[str] = []
        self._context = context
        self._handler = _HANDLER(self._handle)   # kept alive while attached
        self._id: int | None = None

    def _handle(self, diag: _Ptr, _: Any) -> int:
        lib = _LIB
        try:
            where = _text(lib.mlirLocationPrint, lib.mlirDiagnosticGetLocation(diag))
            self.lines.append(f"{where}: {_text(lib.mlirDiagnosticPrint, diag)}")
            for i in range(lib.mlirDiagnosticGetNumNotes(diag)):
                note = lib.mlirDiagnosticGetNote(diag, i)
                where = _text(lib.mlirLocationPrint, lib.mlirDiagnosticGetLocation(note))
                self.lines.append(f"  note: {where}: {_text(lib.mlirDiagnosticPrint, note)}")
        except Exception as err:   # never let an exception out into MLIR's frames
            self.lines.append(f"(diagnostic not readable: {err})")
        return 1   # handled: the handlers attached before (Python ones) are not called

    def __enter__(self) -> Diagnostics:
        self._id = _LIB.mlirContextAttachDiagnosticHandler(_pointer(self._context),
                                                           self._handler, None, None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._id is not None:
            _LIB.mlirContextDetachDiagnosticHandler(_pointer(self._context), self._id)
            self._id = None


def run_released(pm: Any, op: Any) -> bool:
    """Run ``pm`` (upstream passes only) on ``op`` with the GIL released; whether it
    succeeded. Diagnostics go to the context's handlers: attach a :class:`Diagnostics` first
    (a Python handler of the bindings must not be reached). Python objects of the bindings for
    operations inside ``op`` are not told of what the passes erased: hold none."""
    return bool(_LIB.mlirPassManagerRunOnOp(_pointer(pm), _pointer(op)).value)


def available() -> bool:
    """Whether :func:`run_released` can be used here."""
    return _LIB is not None
