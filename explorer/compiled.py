"""The compiled result: every stage's text, every pass record and the kernels of one compile.

:class:`Compiled` is what :func:`explorer.compiler.compile` returns and what the widget, the
artifact writer and the runners read; :class:`Stage` is one step of the lowering.  A compile
builds these records once; nothing here compiles (the host runner of a compile read from a
file asks the compiler for one).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer import __version__
from explorer.codegen.records import PassRecord
from explorer.errors import OptionError
from explorer.frontend.recurrence import Recurrence
from explorer.groundtruth import arg_specs, h0_specs
from explorer.passes.affine import AffineForm
from explorer.passes.plans import ScanPlan

#: a value not computed yet
_PENDING: Any = object()


@dataclass
class Stage:
    """One step of the lowering: its text, how long it took, and a graph where one exists."""

    name: str
    text: str
    seconds: float
    dot: str | None = None
    kind: str = "text"  # text | mlir | llvm | ptx

    def as_text(self) -> str:
        return self.text


@dataclass
class Compiled:
    """Everything the compiler produced for one recurrence, strategy, target and options."""

    recurrence: Recurrence
    form: AffineForm
    plan: ScanPlan
    strategy: str
    target: str
    options: dict[str, Any]
    stages: OrderedDict[str, Stage]
    passes: list[PassRecord]
    kernels: list[dict[str, Any]]  # the manifest's kernel entries, in launch order
    final_module: str  # the fully lowered module (llvm dialect): what the CPU path runs
    ptx: str | None
    llvm_ir: str
    #: ptxas's resource report: computed when first asked (off the compile's critical path)
    _ptx_info: Any
    key: str
    from_cache: bool = False
    #: built by this process's compiler; False for anything decoded from bytes (a record file,
    #: the disk cache): its lowered module is never JIT-compiled on the host (see runner)
    trusted: bool = True
    #: the plan as the scan-plan pass wrote it and the lowering read it
    scan_plan: Any = None
    _device: str | None = field(default=None, repr=False)
    _runners: dict[str, Any] = field(default_factory=dict, repr=False)
    #: the typed contract, parsed from ``kernels`` on first use (a call reads it every time)
    _contract: tuple[Any, ...] | None = field(default=None, repr=False)

    # -- views ---------------------------------------------------------------------------------
    def term_lines(self) -> dict[str, dict[str, list[int]]]:
        """For each recurrence term (``"line:col"``), the lines it became: of the IR after
        each pass (ours and upstream; a record read from a file of an older compiler may have
        them for some passes only), and of the PTX (``"ptx"``, from its ``.loc`` lines). Line
        numbers count from 0."""
        out: dict[str, dict[str, list[int]]] = {}
        for p in self.passes:
            for term, lines in p.locations.items():
                out.setdefault(term, {})[p.name] = lines
        if self.ptx:
            from explorer.codegen.locations import ptx_locations

            for term, lines in ptx_locations(self.ptx).items():
                out.setdefault(term, {})["ptx"] = lines
        return out

    @property
    def ptx_info(self) -> dict[str, Any] | None:
        """ptxas's report on the PTX (registers, shared memory, spills), or
        ``{"unavailable": why}``; None without PTX. Computed on first use."""
        if self._ptx_info is _PENDING:
            from explorer.codegen.ptxas import ptxas_info

            self._ptx_info = (ptxas_info(self.ptx, self.options["chip"])
                              if self.ptx is not None else None)
        return self._ptx_info

    @property
    def stage_names(self) -> list[str]:
        return list(self.stages)

    def sass(self) -> str | None:
        """SASS disassembly of the PTX (computed now; None without ptxas/nvdisasm)."""
        if self.ptx is None:
            return None
        from explorer.codegen.ptxas import sass

        return sass(self.ptx, self.options["chip"])

    @property
    def contract(self) -> tuple[Any, ...]:
        """The kernel contract, typed (:class:`explorer.runtime.contract.KernelInfo` per
        kernel, in launch order): what every launcher reads."""
        from explorer.runtime.contract import DEFAULT_PTX, parse_kernels

        if self._contract is None:
            self._contract = parse_kernels([dict(k, ptx=DEFAULT_PTX) for k in self.kernels])
        return self._contract

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs the kernels write (the plan's ``scan.store``, the ``outputs`` option),
        in the recurrence's order, then the last states (``h_last``): what a call returns.
        Read from the kernel contract."""
        out = [a for k in self.kernels for a in k["args"] if a["role"] == "output"]
        if self.options.get("backward"):   # the fused backward: the gradients it writes
            return tuple(dict.fromkeys(a["name"] for a in out))
        written = {a["name"] for a in out}
        lasts = dict.fromkeys(a["name"] for a in out if not a.get("timed", True))
        return tuple(o for o in self.form.outputs if o in written) + tuple(lasts)

    # -- running -------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        """'cuda' when this is a CUDA compile and a GPU is present, else 'cpu'."""
        if self._device is not None:
            return self._device
        if self.target == "cuda" and _gpu_available():
            return "cuda"
        return "cpu"

    @device.setter
    def device(self, value: str | None) -> None:
        if value not in (None, "cuda", "cpu"):
            raise OptionError(f"device must be 'cuda' or 'cpu', got {value!r}")
        if value == "cuda" and self.target != "cuda":
            raise OptionError("this compile targets the CPU; compile with target='cuda'")
        self._device = value

    def __call__(self, /, device: str | None = None, L: int | None = None, **arrays: Any) -> Any:
        """Run on ``device`` (default: :attr:`device`); time is the last axis of every input."""
        dev = device or self.device
        if L is not None:  # only needed when no input is indexed by time
            arrays["L"] = L
        return self.runner(dev)(**arrays)

    def runner(self, device: str) -> Callable[..., Any]:
        if device not in self._runners:
            if device == "cuda":
                if self.target != "cuda":
                    raise OptionError("this compile targets the CPU; compile with target='cuda'")
                from explorer.cache import cache_dir
                from explorer.runtime.artifact import load_artifact
                from explorer.runtime.cuda import CudaKernel, require_gpu

                require_gpu()   # LaunchError saying why: no CuPy, no CUDA device
                folder = cache_dir() / "artifacts" / self.key
                if not (folder / "manifest.json").exists():
                    self.save(folder)
                self._runners[device] = CudaKernel.from_artifact(load_artifact(folder))
            elif device == "cpu":
                self._runners[device] = _CpuRunner(self._host_compile())
            else:
                raise OptionError(f"device must be 'cuda' or 'cpu', got {device!r}")
        return self._runners[device]

    def _host_compile(self) -> Compiled:
        """The compile whose lowered module runs on the host: this one when the compiler of
        this process built it for the CPU; otherwise compiled here from the recurrence text and
        options (the parser never executes anything), so IR read from a file is never
        JIT-compiled and run as host code."""
        from explorer.cache import _remember
        from explorer.compiler import compile

        if self.target == "cpu" and self.trusted:
            return self
        options = {k: v for k, v in self.options.items()
                   if k not in ("chip", "strategy", "target")}
        cpu = compile(self.recurrence, target="cpu", strategy=self.strategy, **options)
        if not cpu.trusted:   # the disk cache's copy: compile it here
            cpu = compile(self.recurrence, target="cpu", strategy=self.strategy, cache=False,
                          **options)
            _remember(cpu)
        return cpu

    # -- artifacts -----------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        if self.target != "cuda" or self.ptx is None:
            raise OptionError("only CUDA compiles make artifacts (compile with target='cuda')")
        from explorer.codegen import tool_versions

        return {
            "format": "scanweaver-artifact/1",
            "recurrence": self.recurrence.text,
            "strategy": self.strategy,
            "options": self.options,
            "chip": self.options["chip"],
            "dtype": self.options.get("dtype", "float32"),
            "kernels": [dict(k, ptx="kernel.ptx") for k in self.kernels],
            "outputs": list(self.outputs),
            "vector": self.form.vector,
            "lane_outputs": self._lane_outputs(),
            "versions": {"explorer": __version__, **tool_versions()},
            "key": self.key,
        }

    def _lane_outputs(self) -> list[str]:
        if self.options.get("backward"):
            return [a["name"] for k in self.kernels for a in k["args"]
                    if a["role"] == "output" and a["lane"] and a["timed"]]
        return [o for o in self.outputs if self.form.output_is_lane(o)]

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write every recorded stage, pass and kernel to one JSON file (gzip-compressed when
        the name ends with ``.gz``: the IR of every pass compresses about tenfold).

        :func:`load_compiled` reads it back without MLIR: compile on one machine, explore and
        run on another.
        """
        from explorer.compiled_record import _encode, _write_bytes

        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_bytes(out, _encode(self), compress=out.suffix == ".gz")
        return out

    def torch(self, fuse_backward: str | bool | None = None,
              lane_gradients: bool = False) -> Any:
        """This compile as a differentiable torch operator (see :mod:`explorer.torch_op`;
        ``fuse_backward``: see :mod:`explorer.fused_backward`; ``lane_gradients``: see
        :func:`explorer.autodiff.grad`)."""
        from explorer.torch_op import torch_op

        return torch_op(self, fuse_backward=fuse_backward, lane_gradients=lane_gradients)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the artifact (PTX + manifest.json) to the directory ``path``."""
        from explorer.runtime.artifact import write_artifact

        return write_artifact(Path(path), self.ptx or "", self.manifest())


class _CpuRunner:
    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled

    def __call__(self, /, L: int | None = None, **arrays: Any) -> Any:
        from explorer.frontend.names import SEGMENT_MARKS
        from explorer.runtime import segments as sg
        from explorer.runtime.cpu import run_cpu
        from explorer.runtime.dtypes import from_storage
        from explorer.runtime.shapes import marshal

        c = self.compiled
        assert c.trusted and c.target == "cpu", "host code runs only from a compile made here"
        rec = c.recurrence
        varlen = bool(c.options.get("varlen", False))
        cu = sg.packed_call(varlen, arrays)
        # initial states that were given broadcast like parameters (one per sequence of a
        # packed batch); run_cpu zero-fills the rest
        given_h0 = [s for s in h0_specs(rec)
                    if s.name in arrays and s.name not in rec.inputs + rec.params]
        dtypes = {a.name: a.dtype for a in (c.contract[0].args if c.contract else ())}
        per_seq = {s.name: arrays.pop(s.name) for s in given_h0} if cu is not None else {}
        # parameters given for the trailing batch axes alone are read where they are
        modded = [a.name for a in (c.contract[0].args if c.contract else ())
                  if a.role == "rowmod"]
        m = marshal(arg_specs(rec) + ([] if per_seq else given_h0), arrays, L=L,
                    vector=rec.vector, dtypes=dtypes, modded=modded)
        sequences = None
        if varlen:
            offsets = (sg.check_cu_seqlens(cu, m.L) if cu is not None
                       else sg.check_cu_seqlens([0, m.L], m.L))
            sequences = offsets.shape[0] - 1 if cu is not None else None
            m.arrays[SEGMENT_MARKS] = sg.segment_marks(offsets, m.L)
            for name, value in per_seq.items():
                m.arrays[name] = sg.marshal_initial(name, value, offsets.shape[0] - 1,
                                                    m.batch, m.N, rec.vector)
        raw = run_cpu(c.final_module, c.contract, m.arrays, m.C, m.N, m.L,
                      sequences=sequences or 1, row_mod=m.row_mod)
        out = {}
        for name in c.outputs:
            if name in c.form.outputs:
                out[name] = m.unflatten(from_storage(raw[name], dtypes.get(name, "float32")),
                                        c.form.output_is_lane(name))
            else:   # a last state
                out[name] = raw[name].reshape(sg.last_shape(sequences, m.batch, m.N,
                                                            rec.vector))
        return next(iter(out.values())) if len(out) == 1 else out


def _gpu_available() -> bool:
    try:
        from explorer.runtime.cuda import gpu_available
    except ImportError:
        return False
    return gpu_available()


#: the stages after the passes
_BACK = ("llvm", "ptx")


def _assemble(front: list[Stage], passes: list[PassRecord], back: list[Stage]
              ) -> OrderedDict[str, Stage]:
    """The stages in order: those before the passes, a view of each pass (its record's IR,
    not a copy), those after."""
    stages: OrderedDict[str, Stage] = OrderedDict((s.name, s) for s in front)
    for p in passes:
        if p.name in stages or p.name in _BACK:
            raise ValueError(f"two stages are called {p.name!r}")
        stages[p.name] = Stage(p.name, p.ir, p.seconds, kind="mlir")
    for s in back:
        stages[s.name] = s
    return stages

