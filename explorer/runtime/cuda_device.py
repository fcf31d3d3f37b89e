"""The CUDA device and the arrays of a launch: whether CuPy and a GPU are there (and why not),
the kinds of arrays a caller gives (NumPy, CuPy, torch) and their way to and from CuPy, and
the streams a launch runs on (CuPy's, or one another library owns). Used by
:mod:`explorer.runtime.cuda`; CuPy is imported only when asked for.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from explorer.errors import LaunchError, RecurrenceError
from explorer.runtime.shapes import as_array, check_dtype, check_float32_range

#: how to get CuPy, for the messages below
_INSTALL_CUPY = "pip install cupy-cuda13x, or cupy-cuda12x for CUDA 12"


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as err:
        raise LaunchError(f"cannot run on the GPU: {_import_reason(err)}") from None
    return cupy


def _import_reason(err: BaseException) -> str:
    if isinstance(err, ModuleNotFoundError) and err.name == "cupy":
        return f"CuPy is not installed ({_INSTALL_CUPY})"
    return f"CuPy does not import ({type(err).__name__}: {_one_line(err)})"


def gpu_unavailable_reason() -> str | None:
    """None when CuPy imports and sees a CUDA device; otherwise one line saying why not."""
    try:
        import cupy
    except Exception as err:  # noqa: BLE001 - a broken install is a reason, not a crash
        return _import_reason(err)
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # noqa: BLE001 - no driver, no device, a driver too old
        return f"no CUDA device: CuPy cannot reach one ({_one_line(err)})"
    if count < 1:
        return "no CUDA device: CuPy sees none"
    return None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return gpu_unavailable_reason() is None


def require_gpu() -> None:
    """Raise :class:`LaunchError` saying why (no CuPy, no CUDA device) when the GPU cannot be
    used; return quietly when it can."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise LaunchError(f"cannot run on the GPU: {reason}")


# --- array kinds -----------------------------------------------------------------------------

def array_kind(x: Any) -> str:
    """'torch', 'cupy' or 'numpy' (anything else is treated as NumPy-convertible)."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return "numpy"


def _result_kind(arrays: Mapping[str, Any]) -> tuple[str, Any]:
    """The kind of array to return and, for torch, a template tensor (device)."""
    kinds = {name: array_kind(v) for name, v in arrays.items()}
    for name, k in kinds.items():
        if k == "torch":
            return "torch", arrays[name]
    if "cupy" in kinds.values():
        return "cupy", None
    return "numpy", None


def check_array_dtype(name: str, x: Any, cast: bool) -> None:
    """Refuse, before anything is copied or launched, an array the kernel cannot take."""
    if (isinstance(x, np.generic) or not hasattr(x, "dtype")
            or (isinstance(x, np.ndarray) and x.ndim == 0)):
        # a number (Python, NumPy, a 0-d array) becomes a float32 parameter whatever its
        # precision; the shared rule of the shapes refuses bools, complex numbers, text, None
        # and what is neither number nor array
        check_dtype(name, as_array(name, x))
        return
    dtype = x.dtype
    text = str(dtype).replace("torch.", "")
    if text == "float32":
        return
    if cast and text in ("float64", "float16", "bfloat16", "int32", "int64", "int16", "int8",
                         "uint8"):
        return
    raise RecurrenceError(f"{name} has dtype {text}; the kernel takes float32 "
                          f"(convert with .astype(np.float32) / .float(), or pass cast=True)")


def _to_cupy(name: str, x: Any, cast: bool) -> Any:
    cp = _cupy()
    kind = array_kind(x)
    # a float64 value beyond float32's range is refused before the cast (it would become inf)
    if kind == "torch":
        if x.requires_grad:
            x = x.detach()
        if not x.is_cuda:
            x = x.numpy()
            check_float32_range(name, x)
        else:
            with cp.cuda.Device(x.device.index):
                if cast and x.dtype != _torch_float32():
                    if str(x.dtype) == "torch.float64":
                        check_float32_range(name, cp.from_dlpack(x), cp)
                    x = x.float()
                return cp.from_dlpack(x)
    if kind == "cupy":
        if not cast:
            return x
        check_float32_range(name, x, cp)
        return x.astype(cp.float32, copy=False)
    arr = np.asarray(as_array(name, x))   # a Python or NumPy number: a 0-d array
    if cast:
        arr = arr.astype(np.float32, copy=False)
    return cp.asarray(arr, dtype=cp.float32)


def _input_device(arrays: Mapping[str, Any]) -> int:
    """The CUDA device of the first device array among the inputs, else the current one."""
    cp = _cupy()
    for value in arrays.values():
        kind = array_kind(value)
        if kind == "torch" and value.is_cuda:
            return int(value.device.index)
        if kind == "cupy":
            return int(value.device.id)
    return int(cp.cuda.Device().id)


def _torch_float32() -> Any:
    import torch

    return torch.float32


def _from_cupy(x: Any, kind: str, template: Any) -> Any:
    if kind == "cupy":
        return x
    if kind == "numpy":
        return _cupy().asnumpy(x)
    import torch

    if template is not None and not template.is_cuda:
        return torch.from_numpy(_cupy().asnumpy(x))
    return torch.from_dlpack(x)


class _StreamHandle:
    """A raw CUDA stream pointer behind the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = int(ptr)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _external_stream(ptr: int) -> Any:
    """A CuPy stream for a stream another library owns (PyTorch's current stream)."""
    cp = _cupy()
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            return from_external(_StreamHandle(ptr))
        except Exception:
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(ptr)


class _stream_ctx:
    """``with stream:`` when a stream is given, nothing otherwise."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __enter__(self) -> None:
        if self.stream is not None:
            self.stream.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


class _ShapeOnly:
    """A stand-in with an array's shape and dtype: lets the shape rules run with no copy."""

    def __init__(self, x: Any) -> None:
        if isinstance(x, (int, float, np.integer, np.floating)):
            self.shape: tuple[int, ...] = ()
            self.dtype = np.dtype(np.float32)
        else:
            self.shape = tuple(int(s) for s in x.shape)
            text = str(x.dtype).replace("torch.", "")
            # the dtype was checked already; bfloat16 has no NumPy name
            self.dtype = np.dtype(np.float32) if text == "bfloat16" else np.dtype(text)
