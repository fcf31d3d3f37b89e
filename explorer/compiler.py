"""The driver: runs the stages in order and keeps every one of them on the result.

    text ──parse──▶ Recurrence ──decompose──▶ AffineForm ──plan──▶ ScanPlan ──codegen──▶ MLIR
         ──passes (IR after each)──▶ LLVM IR ──▶ PTX            (target="cuda")
         ──passes (IR after each)──▶ LLVM IR for the host         (target="cpu")

`compile` returns a :class:`Compiled`; its ``stages`` is an ordered dict name -> :class:`Stage`
(recurrence, affine, plan, mlir, one entry per pass, llvm, and ptx for CUDA), ``passes`` the pass
records.  The widget reads these records and never recomputes them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from explorer import __version__
from explorer.codegen.records import PassRecord
from explorer.errors import OptionError
from explorer.frontend.recurrence import Recurrence, check_state_size
from explorer.groundtruth import arg_specs, h0_specs
from explorer.passes.affine import AffineForm, decompose
from explorer.passes.plans import ScanPlan

#: a value not computed yet
_PENDING: Any = object()

#: the picture of the plan is drawn for this many positions (the kernel's tile is larger)
PLAN_PICTURE_N = 16


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

    # -- views ---------------------------------------------------------------------------------
    def term_lines(self) -> dict[str, dict[str, list[int]]]:
        """For each recurrence term (``"line:col"``), the lines it became: of the IR after
        each pass that recorded them (ours, and the kernels' final LLVM dialect), and of the
        PTX (``"ptx"``, from its ``.loc`` lines). Line numbers count from 0."""
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

        return parse_kernels([dict(k, ptx=DEFAULT_PTX) for k in self.kernels])

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
            "outputs": list(self.form.outputs),
            "vector": self.form.vector,
            "lane_outputs": [o for o in self.form.outputs if self.form.output_is_lane(o)],
            "versions": {"explorer": __version__, **tool_versions()},
            "key": self.key,
        }

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write every recorded stage, pass and kernel to one JSON file (gzip-compressed when
        the name ends with ``.gz``: the IR of every pass compresses about tenfold).

        :func:`load_compiled` reads it back without MLIR: compile on one machine, explore and
        run on another.
        """
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_bytes(out, _encode(self), compress=out.suffix == ".gz")
        return out

    def torch(self) -> Any:
        """This compile as a differentiable torch operator (see :mod:`explorer.torch_op`)."""
        from explorer.torch_op import torch_op

        return torch_op(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the artifact (PTX + manifest.json) to the directory ``path``."""
        from explorer.runtime.artifact import write_artifact

        return write_artifact(Path(path), self.ptx or "", self.manifest())


class _CpuRunner:
    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled

    def __call__(self, /, L: int | None = None, **arrays: Any) -> Any:
        from explorer.runtime.cpu import run_cpu
        from explorer.runtime.shapes import marshal

        c = self.compiled
        assert c.trusted and c.target == "cpu", "host code runs only from a compile made here"
        rec = c.recurrence
        # initial states that were given broadcast like parameters; run_cpu zero-fills the rest
        given_h0 = [s for s in h0_specs(rec)
                    if s.name in arrays and s.name not in rec.inputs + rec.params]
        m = marshal(arg_specs(rec) + given_h0, arrays, L=L, vector=rec.vector)
        raw = run_cpu(c.final_module, c.contract, m.arrays, m.C, m.N, m.L)
        out = {name: m.unflatten(raw[name], c.form.output_is_lane(name))
               for name in c.form.outputs}
        return next(iter(out.values())) if len(out) == 1 else out


def _gpu_available() -> bool:
    try:
        from explorer.runtime.cuda import gpu_available
    except ImportError:
        return False
    return gpu_available()


# ------------------------------------------------------------------------------------------------
# compile
# ------------------------------------------------------------------------------------------------
_MEMORY: OrderedDict[str, Compiled] = OrderedDict()
_MEMORY_LIMIT = 64
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where compiled results are kept: $SCANWEAVER_CACHE, else ~/.cache/scanweaver."""
    root = os.environ.get("SCANWEAVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "scanweaver")
    return Path(root)


def compile(rec: Recurrence | str, target: str = "cuda", strategy: str = "blelloch",
            cache: bool = True, **options: Any) -> Compiled:
    """Compile a recurrence (or its text) for ``target`` with the scan ``strategy``.

    Options: ``block_size`` (power of two), ``elements_per_thread`` (power of two), ``chip``
    (``sm_80``, ``sm_90``, ...), ``dtype`` ('float32').  Raises :class:`RecurrenceError` for bad
    text, :class:`OptionError` for bad options (before any compile), :class:`CompileError` when a
    pass fails.
    """
    from explorer.codegen.options import validate

    opts = validate(strategy, target, **options)
    t0 = time.perf_counter()
    if isinstance(rec, str):
        rec = Recurrence.parse(rec)
    elif not isinstance(rec, Recurrence):
        raise TypeError(f"compile() takes a Recurrence or its text, not {type(rec).__name__}")
    check_state_size(rec, opts.strategy)   # a dimension the strategy cannot compile in seconds
    t_parse = time.perf_counter() - t0
    opt_dict = asdict(opts)
    key = _key(rec.text, opt_dict)
    if cache:
        hit = _from_memory(key) or _from_disk(key, rec)
        if hit is not None:
            return hit
    compiled = _compile(rec, opts, opt_dict, key, t_parse)
    if cache:
        _remember(compiled)
        _to_disk(compiled)
    return compiled


def _key(text: str, options: dict[str, Any]) -> str:
    from explorer.codegen import source_digest, tool_versions

    blob = json.dumps({"text": text, "options": options, "explorer": __version__,
                       "source": source_digest(), "tools": tool_versions()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _compile(rec: Recurrence, opts: Any, opt_dict: dict[str, Any], key: str,
             t_parse: float) -> Compiled:
    from explorer.codegen.locations import split_locations
    from explorer.codegen.pipeline import cpu_steps, cuda_steps, lower, scan_steps
    from explorer.dialect.build import build_scan
    from explorer.passes.state import ScanState

    stages: OrderedDict[str, Stage] = OrderedDict()
    stages["recurrence"] = Stage("recurrence", rec.summary(), t_parse, rec.dependence_dot())

    t0 = time.perf_counter()
    text = build_scan(rec)
    t_build = time.perf_counter() - t0
    state = ScanState(rec, opts)
    upstream = cuda_steps(opts) if opts.target == "cuda" else cpu_steps(opts)
    lowered = lower(text, opts, scan_steps(state) + upstream)
    passes = list(lowered.passes)
    ours = {p.name: p for p in passes[:3]}
    form, plan = state.form, state.plan
    decomposed, planned = ours["scan-decompose"], ours["scan-plan"]
    stages["affine"] = Stage("affine", form.as_text() + "\n\n" + _scan_ops(decomposed.ir),
                             decomposed.seconds)
    stages["plan"] = Stage("plan", _plan_text(plan) + "\n\n" + _scan_ops(planned.ir),
                           planned.seconds, plan.picture(PLAN_PICTURE_N).to_dot())
    stages["mlir"] = Stage("mlir", split_locations(text)[0], t_build, kind="mlir")
    back = [Stage("llvm", lowered.llvm_ir, lowered.llvm_seconds, kind="llvm")]
    if opts.target == "cuda" and lowered.ptx is not None:
        # PTX is emitted by the gpu-module-to-binary pass: its time is the PTX stage's
        to_binary = [p.seconds for p in passes if p.name.startswith("gpu-module-to-binary")]
        back.append(Stage("ptx", lowered.ptx, sum(to_binary), kind="ptx"))
    stages = _assemble(list(stages.values()), passes, back)
    built = state.built
    kernels = [dict(k.manifest(), args=built.args) for k in built.kernels]
    return Compiled(rec, form, plan.picture(plan.threads), opts.strategy, opts.target, opt_dict,
                    stages, passes, kernels, lowered.final_module, lowered.ptx, lowered.llvm_ir,
                    _PENDING, key, scan_plan=plan)


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


def _scan_ops(ir: str) -> str:
    """The ``scan`` ops of a module's text (what our passes wrote), one a line."""
    return "\n".join(line.strip() for line in ir.splitlines() if '"scan.' in line)


def _plan_text(plan: Any) -> str:
    B, E = plan.threads, plan.elements
    if plan.tree == "none":
        return (f"each warp stages 32 sequences x {plan.tile_steps} time steps through shared "
                "memory, coalesced along time; one thread per sequence walks its row with the "
                f"state in registers ({B} threads, {B} sequences a block)")
    tree = {"blelloch": "Blelloch (up-sweep, then down-sweep: exclusive prefixes)",
            "kogge_stone": "Kogge-Stone (log2 B levels: inclusive prefixes)"}[plan.tree]
    prefix = {"blelloch": "its exclusive prefix from the down-sweep",
              "kogge_stone": "the inclusive prefix of thread i - 1"}[plan.tree]
    return (
        f"each block scans one chunk of a sequence in tiles of {B * E} steps ({B} threads x "
        f"{E} elements):\n"
        f"  1. scan.thread: each thread composes its {E} consecutive elements sequentially in "
        f"registers ({E - 1} combines)\n"
        f"  2. scan.block: the {tree} tree over the {B} thread aggregates in shared memory, "
        f"{len(plan.sweeps)} sweeps, a barrier after each\n"
        f"  3. each thread applies the prefix of the threads before it ({prefix}) to its {E} "
        "elements\n"
        + _grid_text(plan))


def _grid_text(plan: Any) -> str:
    g = plan.grid
    whole = (f"  4. scan.grid ({g.scheme}): a whole sequence per block when there are at least "
             f"{g.unchunked_from} x the GPU's block slots of sequences, else ")
    if plan.lookback is not None:
        window = plan.lookback.lanes * plan.lookback.tiles_per_lane
        return (whole + "one tile per block, in one pass: the block publishes its tile's "
                "aggregate, warp 0 looks back over the tiles before it (scan.lookback: "
                f"{window} tiles a round trip, waiting on tiles not yet published) for the "
                "state before its tile, publishes the state after it, and the block applies "
                "it as the carry; the choice is made per call")
    return (whole + f"chunks of at least {g.min_tiles} tiles giving {g.fill} x the slots in "
            "blocks: reduce (one aggregate per chunk) -> carry (one block per sequence scans "
            "the aggregates) -> scan each chunk from its carry; the chunk length is chosen per "
            "call")


# -- the cache ----------------------------------------------------------------------------------
def _from_memory(key: str) -> Compiled | None:
    with _LOCK:
        hit = _MEMORY.get(key)
        if hit is not None:
            _MEMORY.move_to_end(key)
        return hit


def _remember(c: Compiled) -> None:
    with _LOCK:
        _MEMORY[c.key] = c
        while len(_MEMORY) > _MEMORY_LIMIT:
            _MEMORY.popitem(last=False)


# A compiled record on disk: one line of JSON header (format, key, the sha256 of the payload's
# bytes), a newline, then the payload as JSON.  The checksum is over the bytes as written, so
# checking it costs one hash, not a second serialisation.  It detects damage, not intent: anyone
# can write a record with a valid checksum, so a decoded record is untrusted (``trusted=False``):
# its text is shown and its PTX runs on the GPU like any artifact, but its host code is rebuilt
# from the recurrence text and options (the lowered host module is not even stored).
_FORMAT = "scanweaver-compiled/4"
#: largest record read (uncompressed): a compile of the selective scan is a few MB
RECORD_LIMIT = 256 * 1024 * 1024
_KEY = re.compile(r"[0-9a-f]{32}")


def _encode(c: Compiled) -> bytes:
    """Everything a compile recorded, with a checksum over it."""
    payload = json.dumps({
        "recurrence": c.recurrence.text,
        "strategy": c.strategy, "target": c.target, "options": c.options,
        # each thing once: the passes' IR in the passes, the PTX and LLVM IR in their stages
        "stages": [asdict(s) for s in c.stages.values()
                   if s.name not in {p.name for p in c.passes}],
        # a pass that changed nothing keeps no copy of the IR (null: as the pass before)
        "passes": [dict(asdict(p), ir=p.ir if p.changed else None) for p in c.passes],
        "kernels": c.kernels, "plan": asdict(c.scan_plan), "ptx_info": c.ptx_info,
    }).encode()
    header = json.dumps({"format": _FORMAT, "key": c.key,
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    return header + b"\n" + payload


def _decode(raw: bytes, rec: Recurrence | None = None, key: str | None = None) -> Compiled:
    """Rebuild a :class:`Compiled` from :func:`_encode`'s bytes (untrusted); ValueError when
    damaged or malformed, whatever is wrong with it."""
    from explorer.errors import RecurrenceError
    from explorer.files import gunzip_limited

    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_limited(raw, RECORD_LIMIT, "the compiled record")
    head, sep, body = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        header = None
    if not sep or not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise ValueError(f"not a compiled record (format {_FORMAT})")
    if not isinstance(header.get("key"), str) or not _KEY.fullmatch(header["key"]):
        raise ValueError("the record's key is malformed")
    if key is not None and header.get("key") != key:
        raise ValueError("the record belongs to another compile")
    if header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise ValueError("the compiled record is damaged (checksum mismatch)")
    try:
        return _rebuild(json.loads(body), header["key"], rec)
    except RecurrenceError as err:
        raise ValueError(f"the record's recurrence does not parse: {err}") from None
    except OptionError as err:
        raise ValueError(f"the record's options are invalid: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError,
            AttributeError) as err:
        raise ValueError(f"the compiled record is malformed ({type(err).__name__}: {err})"
                         ) from None


def _rebuild(payload: Any, key: str, rec: Recurrence | None) -> Compiled:
    from explorer.codegen.options import validate

    def typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"{what} has the wrong type")
        return value

    typed(payload, dict, "the payload")
    text = typed(payload["recurrence"], str, "recurrence")
    if rec is None:
        rec = Recurrence.parse(text)
    elif rec.text != text:
        raise ValueError("the compiled record is of another recurrence")
    strategy = typed(payload["strategy"], str, "strategy")
    target = typed(payload["target"], str, "target")
    opts = typed(payload["options"], dict, "options")
    checked = asdict(validate(strategy, target, **{k: v for k, v in opts.items()
                                                   if k not in ("strategy", "target")}))
    kept: list[Stage] = []
    for s in typed(payload["stages"], list, "stages"):
        stage = Stage(**typed(s, dict, "a stage"))
        for f in ("name", "text", "kind"):
            typed(getattr(stage, f), str, f"stage {f}")
        typed(stage.dot, (str, type(None)), "stage dot")
        typed(stage.seconds, (int, float), "stage seconds")
        kept.append(stage)
    passes: list[PassRecord] = []
    previous = next((s.text for s in kept if s.name == "mlir"), "")
    for p in typed(payload["passes"], list, "passes"):
        record = PassRecord(**typed(p, dict, "a pass"))
        if record.ir is None and not record.changed:
            record.ir = previous
        previous = record.ir
        for f in ("name", "ir", "pipeline"):
            typed(getattr(record, f), str, f"pass {f}")
        for term, lines in typed(record.locations, dict, "pass locations").items():
            typed(term, str, "a location's term")
            if not all(isinstance(i, int) and not isinstance(i, bool)
                       for i in typed(lines, list, "a location's lines")):
                raise TypeError("a location's lines are integers")
        passes.append(record)
    kernels = typed(payload["kernels"], list, "kernels")
    for k in kernels:
        typed(k, dict, "a kernel")
    stages = _assemble([s for s in kept if s.name not in _BACK], passes,
                       [s for s in kept if s.name in _BACK])
    ptx = stages["ptx"].text if "ptx" in stages else None
    llvm_ir = stages["llvm"].text
    ptx_info = typed(payload["ptx_info"], (dict, type(None)), "ptx_info")
    from explorer.passes.plan import plan_from_dict

    plan = plan_from_dict(payload["plan"])
    return Compiled(rec, decompose(rec), plan.picture(plan.threads), strategy, target, checked,
                    stages, passes, kernels, "", ptx, llvm_ir, ptx_info, key, from_cache=True,
                    trusted=False, scan_plan=plan)


def load_compiled(path: str | os.PathLike[str]) -> Compiled:
    """Read a file written by :meth:`Compiled.dump`: every stage, without MLIR.

    The result runs (on the GPU through CuPy, or on the CPU when MLIR is present) and the
    explorer widget shows it: ``explorer.Explorer(load_compiled(path))``.
    """
    from explorer.files import read_regular

    try:
        return _decode(read_regular(path, RECORD_LIMIT))
    except (OSError, EOFError) as err:
        raise ValueError(f"{path} is not a compiled record: {err}") from None
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _write_bytes(path: Path, data: bytes, compress: bool = False) -> None:
    """Write atomically: a reader never sees half a file."""
    if compress:
        data = gzip.compress(data, compresslevel=6)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# The disk cache holds one gzip-compressed record per compile (``<key>.json.gz``, a few hundred
# KB) and the artifacts that CUDA runs saved (``artifacts/<key>/``).  It is kept under
# $SCANWEAVER_CACHE_MB megabytes (default 256): after each write the least recently used entries
# go.  Only files with these names are ever read or deleted: the folder may hold other things.
_ENTRY = re.compile(r"([0-9a-f]{32})\.json(?:\.gz)?")   # .json: format 1
_ARTIFACT_FILES = re.compile(r"manifest\.json|[A-Za-z0-9_.-]+\.ptx|[^/]*\.tmp")


def cache_limit_bytes() -> int:
    """The disk cache's bound: $SCANWEAVER_CACHE_MB megabytes, 256 unless set."""
    raw = os.environ.get("SCANWEAVER_CACHE_MB", "256")
    try:
        mb = float(raw)
    except ValueError:
        mb = 256.0
    return max(0, int(mb * 1024 * 1024))


def _cache_entries(folder: Path) -> list[tuple[float, int, list[Path]]]:
    """(last use, bytes, files) of every entry of ours under ``folder``."""
    from explorer.files import is_own_file

    entries: dict[str, list[Path]] = {}
    try:
        for p in folder.iterdir():
            m = _ENTRY.fullmatch(p.name)
            if m and is_own_file(p):
                entries.setdefault(m.group(1), []).append(p)
        art = folder / "artifacts"
        if art.is_dir() and not art.is_symlink():
            for d in art.iterdir():
                if _KEY.fullmatch(d.name) and d.is_dir() and not d.is_symlink():
                    files = [f for f in d.iterdir()
                             if _ARTIFACT_FILES.fullmatch(f.name) and is_own_file(f)]
                    entries.setdefault(d.name, []).extend([*files, d])
    except OSError:
        return []
    out = []
    for files in entries.values():
        used, size = 0.0, 0
        for f in files:
            try:
                st = os.lstat(f)
            except OSError:
                continue
            used = max(used, st.st_mtime)
            size += st.st_size if f.is_file() else 0
        out.append((used, size, files))
    return out


def _remove(files: list[Path]) -> None:
    for f in sorted(files, key=lambda p: p.is_dir()):   # files first, then their folder
        try:
            if f.is_dir() and not f.is_symlink():
                f.rmdir()
            else:
                f.unlink()
        except OSError:
            pass


def _evict(folder: Path, keep: str | None = None) -> None:
    """Drop the least recently used entries until the cache fits its bound."""
    entries = sorted(_cache_entries(folder), key=lambda e: e[0])
    total = sum(size for _, size, _ in entries)
    limit = cache_limit_bytes()
    for _, size, files in entries:
        if total <= limit:
            break
        if keep is not None and any(keep in f.name for f in files):
            continue
        _remove(files)
        total -= size


# Entries are written by one background thread (encoding, the ptxas report and gzip cost a few
# hundred ms that a compile need not wait for); a read of the same key, clear_cache and the end
# of the process wait for the writes in flight.
_WRITER: Any = None
_WRITES: dict[str, Any] = {}


def _to_disk(c: Compiled) -> None:
    global _WRITER
    from concurrent.futures import ThreadPoolExecutor

    def write() -> None:
        folder = cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_bytes(folder / f"{c.key}.json.gz", _encode(c), compress=True)
            _evict(folder, keep=c.key)
        except OSError:
            pass  # a read-only home is no reason to fail a compile
        finally:
            with _LOCK:
                if _WRITES.get(c.key) is future:
                    del _WRITES[c.key]

    with _LOCK:
        if _WRITER is None:
            _WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scanweaver-cache")
        future = _WRITER.submit(write)
        _WRITES[c.key] = future


def wait_for_cache_writes(key: str | None = None) -> None:
    """Wait until the disk cache holds what was compiled (one key, or every write)."""
    with _LOCK:
        pending = [f for k, f in _WRITES.items() if key is None or k == key]
    for f in pending:
        f.result()


def _from_disk(key: str, rec: Recurrence) -> Compiled | None:
    from explorer.files import UnsafeFile, read_regular

    wait_for_cache_writes(key)
    path = cache_dir() / f"{key}.json.gz"
    try:
        raw = read_regular(path, RECORD_LIMIT, follow_links=False)
    except FileNotFoundError:
        return None
    except (OSError, UnsafeFile):
        return None   # not ours to read (a link, a FIFO, ...): compile again
    try:
        c = _decode(raw, rec, key)
    except ValueError:
        # a damaged entry is never trusted: drop it and compile again
        try:
            path.unlink()
        except OSError:
            pass
        return None
    try:
        os.utime(path)   # last use, for eviction
    except OSError:
        pass
    _remember(c)
    return c


def clear_cache() -> None:
    """Forget every compiled result, in memory and on disk (only the cache's own files)."""
    wait_for_cache_writes()
    with _LOCK:
        _MEMORY.clear()
    folder = cache_dir()
    for _, _, files in _cache_entries(folder):
        _remove(files)
    for empty in (folder / "artifacts", folder):
        try:
            empty.rmdir()   # only when nothing else is left in it
        except OSError:
            pass
