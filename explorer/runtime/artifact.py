"""Artifacts: the compiled kernel (PTX) and its JSON manifest, as a directory on disk.

This is the hand-off between the compiler (which writes an artifact with :func:`write_artifact`)
and the runtimes (which read it with :func:`load_artifact`).  Both sides use this one module so
the format has one definition.  Only the standard library and NumPy are imported: an artifact
compiled on a machine with MLIR loads on a GPU server that has NumPy and CuPy alone.

Layout of an artifact directory::

    manifest.json   the manifest (format ``scanweaver-artifact/1``)
    kernel.ptx      the PTX of the kernels (one file per distinct ``ptx`` name in the manifest)

Kernels are launched in list order, all with the same arguments.  Beyond the contract's
geometry a kernel may give ``time_chunk`` (one block per chunk of that many steps: grid_x is
multiplied by ``ceil(L / time_chunk)``) and ``launch_when_longer_than`` (launched only when L is
longer), and an argument of role ``workspace`` is a zeroed float32 scratch buffer of
``C * N * ceil(L / time_chunk) * per_chunk`` floats, after the sizes.

Chunk length chosen per call: ``time_chunk`` and ``launch_when_longer_than`` (of a kernel or a
workspace) are either an integer fixed at compile time or the *name* of a size argument whose
value the runtime chooses for each call.  The only such size argument is ``time_chunk`` (int64,
after the workspaces); it carries its rule as
``chunk_rule = {"tile", "min_tiles", "fill", "unchunked_from"}`` (see :func:`choose_time_chunk`):
with ``slots = SMs * resident blocks per SM`` of the machine,

* ``C * N >= unchunked_from * slots``: no chunking, ``time_chunk = tile * ceil(L / tile)``
  (>= L), so the kernels launched only when ``L > time_chunk`` are skipped and one block scans
  a sequence (inputs read once);
* otherwise the fewest chunks per sequence that give ``fill * slots`` blocks:
  ``chunks = ceil(fill * slots / (C * N))`` and
  ``time_chunk = tile * max(min_tiles, ceil(ceil(L / tile) / chunks))``.

The same value is passed to every kernel and sizes the workspaces, so the grid and workspace
formulas above hold with it.  A manifest with integers only (older artifacts) launches as before.

The manifest's ``hash`` is the SHA-256 of its own canonical JSON (sorted keys, without the
``hash`` field) followed by the bytes of every PTX file in kernel order; :func:`load_artifact`
recomputes it and refuses an artifact whose files were changed after it was written.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "scanweaver-artifact/1"
MANIFEST = "manifest.json"
DEFAULT_PTX = "kernel.ptx"

ROLES = ("input", "param", "h0", "output", "size", "workspace")
ARG_DTYPES = ("float32", "int64")
SIZE_NAMES = ("C", "N", "L", "time_chunk")
#: the size argument chosen per call by the chunk rule
TIME_CHUNK = "time_chunk"


@dataclass(frozen=True)
class Machine:
    """What the chunk rule needs to know of a device: SMs and resident blocks per SM."""

    sms: int
    blocks_per_sm: int

    @property
    def slots(self) -> int:
        return self.sms * self.blocks_per_sm


@dataclass(frozen=True)
class ChunkRule:
    """How the runtime picks ``time_chunk`` for a call (see the module docstring)."""

    tile: int           # steps one block scans per tile; chunks are whole tiles
    min_tiles: int = 1  # shortest chunk, in tiles, when chunking
    fill: float = 1.0   # blocks wanted when chunking, in units of the machine's block slots
    #: sequences (in units of block slots) from which each runs whole in one block;
    #: None: the same as ``fill``
    unchunked_from: float | None = None

    @property
    def threshold(self) -> float:
        return self.fill if self.unchunked_from is None else self.unchunked_from

    def as_dict(self) -> dict[str, Any]:
        return {"tile": self.tile, "min_tiles": self.min_tiles, "fill": self.fill,
                "unchunked_from": self.threshold}

    def choose(self, C: int, N: int, L: int, machine: Machine) -> int:
        return choose_time_chunk(self, C, N, L, machine)


def choose_time_chunk(rule: ChunkRule, C: int, N: int, L: int, machine: Machine) -> int:
    """The chunk length for one call: the whole sequence (rounded up to tiles) when there are
    at least ``rule.unchunked_from`` times the machine's block slots of sequences, else the
    fewest chunks per sequence that give ``rule.fill`` times the slots in blocks (never shorter
    than ``rule.min_tiles`` tiles)."""
    tiles = max(1, -(-L // rule.tile))
    sequences = max(1, C * N)
    if sequences >= max(1, math.ceil(rule.threshold * machine.slots)):
        return tiles * rule.tile
    want = max(1, math.ceil(rule.fill * machine.slots))
    chunks = -(-want // sequences)
    return rule.tile * max(rule.min_tiles, -(-tiles // chunks))


def size_values(args: Sequence[ArgInfo], C: int, N: int, L: int, machine: Machine,
                time_chunk: int | None = None) -> dict[str, int]:
    """Values of the size arguments for one call (``time_chunk``: forced instead of chosen)."""
    out = {"C": C, "N": N, "L": L}
    for a in args:
        if a.role == "size" and a.name == TIME_CHUNK:
            assert a.chunk_rule is not None
            out[TIME_CHUNK] = (int(time_chunk) if time_chunk is not None
                               else a.chunk_rule.choose(C, N, L, machine))
    return out


def _resolve(value: int | str | None, sizes: Mapping[str, int] | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    if sizes is None or value not in sizes:
        raise ArtifactError(f"the size {value!r} is chosen per call: pass its value")
    return int(sizes[value])


class ArtifactError(ValueError):
    """An artifact directory or manifest does not follow the format; names the field at fault."""


@dataclass(frozen=True)
class ArgInfo:
    """One kernel parameter as the manifest describes it."""

    name: str
    role: str
    timed: bool = False
    lane: bool = False
    dtype: str = "float32"
    # a workspace holds per_chunk floats for every (sequence, chunk of time_chunk steps);
    # time_chunk is an integer or the name of the size argument that gives it per call
    per_chunk: int | None = None
    time_chunk: int | str | None = None
    chunk_rule: ChunkRule | None = None    # the size argument ``time_chunk`` only

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "role": self.role, "timed": self.timed,
                               "lane": self.lane, "dtype": self.dtype}
        if self.role == "workspace":
            out.update(per_chunk=self.per_chunk, time_chunk=self.time_chunk)
        if self.chunk_rule is not None:
            out["chunk_rule"] = self.chunk_rule.as_dict()
        return out

    def workspace_size(self, C: int, N: int, L: int,
                       sizes: Mapping[str, int] | None = None) -> int:
        """Floats of a workspace: ``C * N * ceil(L / time_chunk) * per_chunk``."""
        chunk = _resolve(self.time_chunk, sizes)
        if self.per_chunk is None or chunk is None:
            raise ArtifactError(f"{self.name} is not a workspace")
        return C * N * -(-L // chunk) * self.per_chunk


@dataclass(frozen=True)
class KernelInfo:
    """One entry point of the PTX and the geometry it is launched with."""

    name: str
    ptx: str
    block: tuple[int, int, int]
    sequences_per_block: int
    shared_bytes: int
    args: tuple[ArgInfo, ...]
    # integers, or the name of the size argument that gives the value per call
    time_chunk: int | str | None = None  # grid_x *= ceil(L / time_chunk): one block per chunk
    launch_when_longer_than: int | str | None = None  # launched only when L > this

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def chunked_per_call(self) -> bool:
        """True when the kernel's chunk length is chosen per call."""
        return isinstance(self.time_chunk, str)

    def launched(self, L: int, sizes: Mapping[str, int] | None = None) -> bool:
        longer = _resolve(self.launch_when_longer_than, sizes)
        return longer is None or L > longer

    def grid(self, C: int, N: int, L: int | None = None,
             sizes: Mapping[str, int] | None = None) -> tuple[int, int, int]:
        """``grid_x = ceil(C * N / sequences_per_block)``, times ``ceil(L / time_chunk)`` for a
        kernel that gives each time chunk its own block."""
        blocks = max(1, -(-(C * N) // self.sequences_per_block))
        if self.time_chunk is not None and L is not None:
            chunk = _resolve(self.time_chunk, sizes)
            assert chunk is not None
            blocks *= max(1, -(-L // chunk))
        return (blocks, 1, 1)

    def args_with_role(self, role: str) -> tuple[ArgInfo, ...]:
        return tuple(a for a in self.args if a.role == role)


@dataclass
class Artifact:
    """A loaded artifact: the parsed manifest plus the PTX text of every kernel."""

    path: Path | None
    manifest: dict[str, Any]
    kernels: tuple[KernelInfo, ...]
    ptx_text: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def recurrence(self) -> str:
        return str(self.manifest.get("recurrence", ""))

    @property
    def strategy(self) -> str:
        return str(self.manifest.get("strategy", ""))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.manifest.get("options") or {})

    @property
    def chip(self) -> str:
        return str(self.manifest.get("chip", ""))

    @property
    def dtype(self) -> str:
        return str(self.manifest.get("dtype", "float32"))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.manifest.get("outputs") or ())

    @property
    def vector(self) -> bool:
        return bool(self.manifest.get("vector", False))

    @property
    def hash(self) -> str:
        return str(self.manifest.get("hash", ""))

    def ptx_path(self, kernel: KernelInfo) -> Path:
        if self.path is None:
            raise ArtifactError("this artifact was not loaded from a directory")
        return self.path / kernel.ptx

    def describe(self) -> str:
        """One line for tables and logs: strategy, options and the short hash."""
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())
                         if k not in ("strategy", "target"))
        return f"{self.strategy} [{opts}] {self.hash[:10]}"


# --- validation ------------------------------------------------------------------------------

def _need(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ArtifactError(f"{where}: missing field {key!r}")
    return obj[key]


def _parse_arg(raw: Any, where: str) -> ArgInfo:
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: an argument must be an object, got {raw!r}")
    name = _need(raw, "name", where)
    role = _need(raw, "role", where)
    if not isinstance(name, str) or not name:
        raise ArtifactError(f"{where}: argument name must be a non-empty string, got {name!r}")
    if role not in ROLES:
        raise ArtifactError(f"{where}: argument {name!r} has role {role!r}; "
                            f"expected one of {', '.join(ROLES)}")
    dtype = raw.get("dtype", "int64" if role == "size" else "float32")
    if dtype not in ARG_DTYPES:
        raise ArtifactError(f"{where}: argument {name!r} has dtype {dtype!r}; "
                            f"expected one of {', '.join(ARG_DTYPES)}")
    if role == "size":
        if name not in SIZE_NAMES:
            raise ArtifactError(f"{where}: size argument {name!r} must be one of "
                                f"{', '.join(SIZE_NAMES)}")
        if dtype != "int64":
            raise ArtifactError(f"{where}: size argument {name!r} must be int64")
    elif dtype != "float32":
        raise ArtifactError(f"{where}: array argument {name!r} must be float32")
    per_chunk: int | None = None
    time_chunk: int | str | None = None
    rule = None
    if role == "workspace":
        per_chunk = _positive(raw.get("per_chunk"), f"{where}: workspace {name!r} per_chunk")
        time_chunk = _chunk_value(raw.get("time_chunk"), f"{where}: workspace {name!r} "
                                  "time_chunk")
    if role == "size" and name == TIME_CHUNK:
        rule = _parse_rule(raw.get("chunk_rule"), f"{where}: size argument {name!r}")
    return ArgInfo(name=name, role=role, timed=bool(raw.get("timed", False)),
                   lane=bool(raw.get("lane", False)), dtype=dtype, per_chunk=per_chunk,
                   time_chunk=time_chunk, chunk_rule=rule)


def _parse_rule(raw: Any, where: str) -> ChunkRule:
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: needs chunk_rule {{tile, min_tiles, fill, "
                            "unchunked_from}}, "
                            f"got {raw!r}")
    tile = _positive(raw.get("tile"), f"{where}: chunk_rule tile")
    min_tiles = _positive(raw.get("min_tiles", 1), f"{where}: chunk_rule min_tiles")
    fill = raw.get("fill", 1.0)
    unchunked = raw.get("unchunked_from", fill)
    for key, v in (("fill", fill), ("unchunked_from", unchunked)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ArtifactError(f"{where}: chunk_rule {key} must be a positive number, "
                                f"got {v!r}")
    return ChunkRule(tile=tile, min_tiles=min_tiles, fill=float(fill),
                     unchunked_from=float(unchunked))


def _chunk_value(value: Any, what: str) -> int | str:
    """A positive integer, or the name of the size argument that gives it per call."""
    if value == TIME_CHUNK:
        return TIME_CHUNK
    return _positive(value, what + f" (a positive integer or {TIME_CHUNK!r})")


def _positive(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArtifactError(f"{what} must be a positive integer, got {value!r}")
    return value


def _parse_kernel(raw: Any, index: int) -> KernelInfo:
    where = f"kernels[{index}]"
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: must be an object")
    name = _need(raw, "name", where)
    if not isinstance(name, str) or not name:
        raise ArtifactError(f"{where}: name must be the PTX entry symbol")
    ptx = raw.get("ptx", DEFAULT_PTX)
    if not isinstance(ptx, str) or not ptx or os.path.isabs(ptx) or ".." in Path(ptx).parts:
        raise ArtifactError(f"{where}: ptx must be a file name inside the artifact, got {ptx!r}")
    block_raw = _need(raw, "block", where)
    if (not isinstance(block_raw, Sequence) or not 1 <= len(block_raw) <= 3
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                       for b in block_raw)):
        raise ArtifactError(f"{where}: block must be 1 to 3 positive integers, got {block_raw!r}")
    block = tuple(block_raw) + (1,) * (3 - len(block_raw))
    if math.prod(block) > 1024:
        raise ArtifactError(f"{where}: block {list(block)} has more than 1024 threads")
    spb = raw.get("sequences_per_block", 1)
    if not isinstance(spb, int) or isinstance(spb, bool) or spb < 1:
        raise ArtifactError(f"{where}: sequences_per_block must be a positive integer, "
                            f"got {spb!r}")
    shared = raw.get("shared_bytes", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise ArtifactError(f"{where}: shared_bytes must be a non-negative integer, "
                            f"got {shared!r}")
    args_raw = _need(raw, "args", where)
    if not isinstance(args_raw, Sequence) or isinstance(args_raw, str):
        raise ArtifactError(f"{where}: args must be a list")
    args = tuple(_parse_arg(a, f"{where}.args[{i}]") for i, a in enumerate(args_raw))
    # an input may share its name with a state (h0, output) or a size (the selective scan's C)
    names = [(a.name, a.role if a.role in ("h0", "output", "size", "workspace") else "array")
             for a in args]
    dup = sorted({f"{n} ({r})" for n, r in names if names.count((n, r)) > 1})
    if dup:
        raise ArtifactError(f"{where}: duplicate arguments {dup}")
    time_chunk = raw.get("time_chunk")
    if time_chunk is not None:
        time_chunk = _chunk_value(time_chunk, f"{where}: time_chunk")
    longer = raw.get("launch_when_longer_than")
    if longer is not None and longer != TIME_CHUNK and (
            not isinstance(longer, int) or isinstance(longer, bool) or longer < 0):
        raise ArtifactError(f"{where}: launch_when_longer_than must be a non-negative integer "
                            f"or {TIME_CHUNK!r}, got {longer!r}")
    per_call = [v for v in (time_chunk, longer, *(a.time_chunk for a in args)) if v == TIME_CHUNK]
    if per_call and not any(a.role == "size" and a.name == TIME_CHUNK for a in args):
        raise ArtifactError(f"{where}: uses {TIME_CHUNK!r} per call but has no size argument "
                            f"{TIME_CHUNK!r}")
    return KernelInfo(name=name, ptx=ptx, block=(int(block[0]), int(block[1]), int(block[2])),
                      sequences_per_block=spb, shared_bytes=shared, args=args,
                      time_chunk=time_chunk, launch_when_longer_than=longer)


def validate_manifest(manifest: Mapping[str, Any]) -> tuple[KernelInfo, ...]:
    """Check a manifest against the format; return its kernels.  Raises :class:`ArtifactError`."""
    if not isinstance(manifest, Mapping):
        raise ArtifactError("the manifest must be a JSON object")
    fmt = _need(manifest, "format", "manifest")
    if fmt != FORMAT:
        raise ArtifactError(f"manifest: format {fmt!r} is not {FORMAT!r}")
    dtype = manifest.get("dtype", "float32")
    if dtype != "float32":
        raise ArtifactError(f"manifest: dtype {dtype!r} is not supported (float32 only)")
    kernels_raw = _need(manifest, "kernels", "manifest")
    if not isinstance(kernels_raw, Sequence) or isinstance(kernels_raw, str) or not kernels_raw:
        raise ArtifactError("manifest: kernels must be a non-empty list")
    kernels = tuple(_parse_kernel(k, i) for i, k in enumerate(kernels_raw))
    outputs = manifest.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, Sequence) or isinstance(outputs, str) or not all(
                isinstance(o, str) for o in outputs):
            raise ArtifactError("manifest: outputs must be a list of names")
        for k in kernels:
            written = {a.name for a in k.args_with_role("output")}
            unknown = sorted(written - set(outputs))
            if unknown:
                raise ArtifactError(f"manifest: kernel {k.name!r} writes {unknown}, "
                                    f"which are not in outputs {list(outputs)}")
        produced = set().union(*({a.name for a in k.args_with_role("output")} for k in kernels))
        missing = [o for o in outputs if o not in produced]
        if missing:
            raise ArtifactError(f"manifest: outputs {missing} are written by no kernel")
    return kernels


def content_hash(manifest: Mapping[str, Any], ptx_text: Mapping[str, str]) -> str:
    """SHA-256 of the manifest (sorted keys, no ``hash``) and the PTX files in kernel order."""
    body = {k: v for k, v in manifest.items() if k != "hash"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                       default=str).encode())
    seen: list[str] = []
    for k in body.get("kernels", ()):
        ptx = k.get("ptx", DEFAULT_PTX) if isinstance(k, Mapping) else DEFAULT_PTX
        if ptx not in seen:
            seen.append(ptx)
    for name in seen:
        digest.update(b"\0" + name.encode() + b"\0")
        digest.update(ptx_text.get(name, "").encode())
    return digest.hexdigest()


# --- reading and writing -------------------------------------------------------------------

def load_artifact(path: str | os.PathLike[str], verify: bool = True) -> Artifact:
    """Read an artifact directory (or its ``manifest.json``) and check it.

    ``verify`` recomputes the content hash when the manifest has one and raises
    :class:`ArtifactError` if the files do not match it.
    """
    p = Path(path)
    if p.is_file() and p.name == MANIFEST:
        p = p.parent
    mpath = p / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{p}: not an artifact directory (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{mpath}: not valid JSON ({err})") from None
    kernels = validate_manifest(manifest)
    ptx_text: dict[str, str] = {}
    for k in kernels:
        if k.ptx in ptx_text:
            continue
        fpath = p / k.ptx
        if not fpath.is_file():
            raise ArtifactError(f"{p}: kernel {k.name!r} names {k.ptx!r}, which is missing")
        ptx_text[k.ptx] = fpath.read_text()
        if f".entry {k.name}" not in ptx_text[k.ptx] and f".entry {k.name}(" not in \
                ptx_text[k.ptx]:
            raise ArtifactError(f"{fpath}: no .entry {k.name!r} in the PTX")
    if verify and manifest.get("hash"):
        expect = content_hash(manifest, ptx_text)
        if expect != manifest["hash"]:
            raise ArtifactError(f"{p}: content hash mismatch (manifest {manifest['hash'][:12]}, "
                                f"files {expect[:12]}): the artifact was changed after it was "
                                "written")
    return Artifact(path=p.resolve(), manifest=manifest, kernels=kernels, ptx_text=ptx_text)


def write_artifact(path: str | os.PathLike[str], ptx: str | Mapping[str, str],
                   manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` and the PTX file(s) into ``path`` (created if needed).

    ``ptx`` is the PTX text (written to the file every kernel names, ``kernel.ptx`` by default)
    or a mapping file name -> text.  ``format`` and ``dtype`` are filled in when absent, the
    manifest is validated, and ``hash`` is computed; the written manifest is returned by
    :func:`load_artifact` unchanged.  Returns the directory.
    """
    body = copy.deepcopy(dict(manifest))
    body.setdefault("format", FORMAT)
    body.setdefault("dtype", "float32")
    body.pop("hash", None)
    kernels = validate_manifest(body)
    names = []
    for k in kernels:
        if k.ptx not in names:
            names.append(k.ptx)
    if isinstance(ptx, str):
        if len(names) != 1:
            raise ArtifactError(f"the kernels name several PTX files {names}: pass a mapping")
        files = {names[0]: ptx}
    else:
        files = dict(ptx)
        missing = [n for n in names if n not in files]
        if missing:
            raise ArtifactError(f"no PTX given for {missing}")
    body["hash"] = content_hash(body, files)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(out / MANIFEST)
    return out
