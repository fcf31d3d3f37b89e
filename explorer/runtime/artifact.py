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
``hash`` field) followed by the bytes of every PTX file in kernel order.  It is mandatory:
:func:`load_artifact` refuses a manifest without one, and an artifact whose files were changed
after it was written.  The hash detects damage, not intent (anyone can write a matching one).

An artifact comes from elsewhere, so :func:`load_artifact` trusts nothing in it: the manifest
and the PTX files must be regular files inside the directory (not links, FIFOs or directories),
at most :data:`MANIFEST_LIMIT` / :data:`PTX_LIMIT` bytes, UTF-8, and every field is checked for
its type and range.  Every failure is an :class:`ArtifactError` naming the file or the field.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the argument names are owned by the front end, which refuses them as names of a recurrence;
# TIME_CHUNK is the size argument chosen per call by the chunk rule
from explorer.frontend.names import SIZE_NAMES as FRONTEND_SIZE_NAMES
from explorer.frontend.names import TIME_CHUNK

FORMAT = "scanweaver-artifact/1"
MANIFEST = "manifest.json"
DEFAULT_PTX = "kernel.ptx"

ROLES = ("input", "param", "h0", "output", "size", "workspace")
ARG_DTYPES = ("float32", "int64")
SIZE_NAMES = (*FRONTEND_SIZE_NAMES, TIME_CHUNK)
#: largest manifest read (the selective scan's is about 7 KB)
MANIFEST_LIMIT = 2 * 1024 * 1024
#: largest PTX file read (the selective scan's is about 60 KB)
PTX_LIMIT = 16 * 1024 * 1024
#: most kernels in a manifest, and arguments of a kernel
MAX_KERNELS = 64
MAX_ARGS = 256
#: deepest nesting of JSON values in a manifest (the format itself needs 5)
MAX_DEPTH = 32
#: a PTX file name: a plain name in the artifact directory, no path, no leading dot
PTX_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.ptx")
_HASH = re.compile(r"[0-9a-f]{64}")


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
        raise ArtifactError(f"{where}: an argument must be an object, got {_show(raw)}")
    name = _need(raw, "name", where)
    role = _need(raw, "role", where)
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ArtifactError(f"{where}: argument name must be an identifier, got {_show(name)}")
    if not isinstance(role, str) or role not in ROLES:
        raise ArtifactError(f"{where}: argument {name!r} has role {_show(role)}; "
                            f"expected one of {', '.join(ROLES)}")
    dtype = raw.get("dtype", "int64" if role == "size" else "float32")
    if not isinstance(dtype, str) or dtype not in ARG_DTYPES:
        raise ArtifactError(f"{where}: argument {name!r} has dtype {_show(dtype)}; "
                            f"expected one of {', '.join(ARG_DTYPES)}")
    if role == "size":
        if name not in SIZE_NAMES:
            raise ArtifactError(f"{where}.name: size argument {name!r} must be one of "
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
    timed = _flag(raw.get("timed", False), f"{where}: argument {name!r} timed")
    lane = _flag(raw.get("lane", False), f"{where}: argument {name!r} lane")
    return ArgInfo(name=name, role=role, timed=timed, lane=lane, dtype=dtype,
                   per_chunk=per_chunk, time_chunk=time_chunk, chunk_rule=rule)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ArtifactError(f"{what} must be true or false, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    """A value for a message: its repr, cut short (a hostile manifest may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_rule(raw: Any, where: str) -> ChunkRule:
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: needs chunk_rule {{tile, min_tiles, fill, "
                            "unchunked_from}}, "
                            f"got {_show(raw)}")
    tile = _positive(raw.get("tile"), f"{where}: chunk_rule tile")
    min_tiles = _positive(raw.get("min_tiles", 1), f"{where}: chunk_rule min_tiles")
    fill = raw.get("fill", 1.0)
    unchunked = raw.get("unchunked_from", fill)
    numbers = {}
    for key, v in (("fill", fill), ("unchunked_from", unchunked)):
        numbers[key] = _positive_number(v, f"{where}: chunk_rule {key}")
    return ChunkRule(tile=tile, min_tiles=min_tiles, fill=numbers["fill"],
                     unchunked_from=numbers["unchunked_from"])


def _positive_number(value: Any, what: str) -> float:
    """A finite positive number no larger than 2**20 (a factor of the machine's block slots)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)
        except OverflowError:   # an integer too large for a float
            ok = False
        else:
            ok = math.isfinite(number) and 0 < number <= 2**20
    if not ok:
        raise ArtifactError(f"{what} must be a positive number (at most 2**20), "
                            f"got {_show(value)}")
    return number


def _chunk_value(value: Any, what: str) -> int | str:
    """A positive integer, or the name of the size argument that gives it per call."""
    if value == TIME_CHUNK:
        return TIME_CHUNK
    return _positive(value, what + f" (a positive integer or {TIME_CHUNK!r})")


def _positive(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_INT:
        raise ArtifactError(f"{what} must be a positive integer (at most 2**62), "
                            f"got {_show(value)}")
    return value


#: largest integer of a geometry field: every size is computed in int64 on the device side
MAX_INT = 2**62
#: a PTX entry point or an argument name
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,255}")


def _parse_kernel(raw: Any, index: int) -> KernelInfo:
    where = f"kernels[{index}]"
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{where}: must be an object, got {_show(raw)}")
    name = _need(raw, "name", where)
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ArtifactError(f"{where}: name must be the PTX entry symbol (an identifier), "
                            f"got {_show(name)}")
    ptx = raw.get("ptx", DEFAULT_PTX)
    if not isinstance(ptx, str) or not PTX_NAME.fullmatch(ptx):
        raise ArtifactError(f"{where}: ptx must be the name of a .ptx file in the artifact "
                            f"directory (no path, no '..'), got {_show(ptx)}")
    block_raw = _need(raw, "block", where)
    if (not isinstance(block_raw, Sequence) or not 1 <= len(block_raw) <= 3
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                       for b in block_raw)):
        raise ArtifactError(f"{where}: block must be 1 to 3 positive integers, "
                            f"got {_show(block_raw)}")
    block = tuple(block_raw) + (1,) * (3 - len(block_raw))
    if max(block) > 1024 or math.prod(block) > 1024:
        raise ArtifactError(f"{where}: block {_show(list(block))} has more than 1024 threads")
    spb = _positive(raw.get("sequences_per_block", 1), f"{where}: sequences_per_block")
    shared = raw.get("shared_bytes", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared <= 2**31:
        raise ArtifactError(f"{where}: shared_bytes must be a non-negative integer, "
                            f"got {_show(shared)}")
    args_raw = _need(raw, "args", where)
    if not isinstance(args_raw, list):
        raise ArtifactError(f"{where}: args must be a list, got {_show(args_raw)}")
    if len(args_raw) > MAX_ARGS:
        raise ArtifactError(f"{where}: args has {len(args_raw)} entries, at most {MAX_ARGS}")
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
            not isinstance(longer, int) or isinstance(longer, bool)
            or not 0 <= longer <= MAX_INT):
        raise ArtifactError(f"{where}: launch_when_longer_than must be a non-negative integer "
                            f"or {TIME_CHUNK!r}, got {_show(longer)}")
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
        raise ArtifactError(f"the manifest must be a JSON object, got {_show(manifest)}")
    _check_values(manifest)
    fmt = _need(manifest, "format", "manifest")
    if fmt != FORMAT:
        raise ArtifactError(f"manifest: format {_show(fmt)} is not {FORMAT!r}")
    dtype = manifest.get("dtype", "float32")
    if dtype != "float32":
        raise ArtifactError(f"manifest: dtype {_show(dtype)} is not supported (float32 only)")
    for key, kind, what in _TOP_FIELDS:
        if key in manifest and not isinstance(manifest[key], kind):
            raise ArtifactError(f"manifest: field {key!r} must be {what}, "
                                f"got {_show(manifest[key])}")
    if "hash" in manifest and not _HASH.fullmatch(manifest["hash"]):
        raise ArtifactError(f"manifest: field 'hash' must be 64 hex digits (SHA-256), "
                            f"got {_show(manifest['hash'])}")
    kernels_raw = _need(manifest, "kernels", "manifest")
    if not isinstance(kernels_raw, list) or not kernels_raw:
        raise ArtifactError(f"manifest: kernels must be a non-empty list, "
                            f"got {_show(kernels_raw)}")
    if len(kernels_raw) > MAX_KERNELS:
        raise ArtifactError(f"manifest: kernels has {len(kernels_raw)} entries, "
                            f"at most {MAX_KERNELS}")
    kernels = tuple(_parse_kernel(k, i) for i, k in enumerate(kernels_raw))
    for field_name in ("outputs", "lane_outputs"):
        names = manifest.get(field_name)
        if names is not None and not all(isinstance(o, str) and _IDENT.fullmatch(o)
                                         for o in names):
            raise ArtifactError(f"manifest: {field_name} must be a list of names, "
                                f"got {_show(names)}")
    outputs = manifest.get("outputs")
    if outputs is not None:
        for i, k in enumerate(kernels):
            written = {a.name for a in k.args_with_role("output")}
            unknown = sorted(written - set(outputs))
            if unknown:
                raise ArtifactError(f"manifest: kernels[{i}].args ({k.name!r}) write {unknown}, "
                                    f"which are not in outputs {list(outputs)}")
        produced = set().union(*({a.name for a in k.args_with_role("output")} for k in kernels))
        missing = [o for o in outputs if o not in produced]
        if missing:
            raise ArtifactError(f"manifest: outputs {missing} are written by no kernel (no "
                                "argument of role 'output' in kernels[].args)")
    return kernels


#: optional top-level fields: (name, type, what the message says it must be)
_TOP_FIELDS: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("recurrence", str, "a string"), ("strategy", str, "a string"),
    ("options", dict, "an object"), ("chip", str, "a string"), ("vector", bool, "true or false"),
    ("outputs", list, "a list of names"), ("lane_outputs", list, "a list of names"),
    ("versions", dict, "an object"), ("key", str, "a string"), ("hash", str, "a string"),
)


def _check_values(manifest: Mapping[str, Any]) -> None:
    """Refuse values nested deeper than :data:`MAX_DEPTH` and numbers JSON cannot hold (NaN,
    infinities), anywhere in the manifest (checked without recursion)."""
    stack: list[tuple[Any, int, str]] = [(manifest, 1, "manifest")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise ArtifactError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            raise ArtifactError(f"{where}: {value} is not a JSON number")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))


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

def load_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Read an artifact directory (or its ``manifest.json``) and check it.

    The content hash is mandatory and recomputed.  Raises :class:`ArtifactError` naming the
    file or field for anything wrong: a missing or unreadable file, a FIFO, directory or
    symbolic link in place of a file, a file over its size cap, bytes that are not UTF-8, JSON
    that does not parse or nests too deeply, a field of the wrong type, a missing or wrong hash.
    """
    p = Path(path)
    try:
        if p.name == MANIFEST and not p.is_dir():
            p = p.parent
        if not p.is_dir():
            raise ArtifactError(f"{p}: not an artifact directory (it {_what_is(p)})")
        mpath = p / MANIFEST
        if not os.path.lexists(mpath):
            raise ArtifactError(f"{p}: not an artifact directory (no {MANIFEST})")
        manifest = _parse_json(_read_text(mpath, MANIFEST_LIMIT, MANIFEST), mpath)
        try:
            kernels = validate_manifest(manifest)
        except ArtifactError as err:
            raise ArtifactError(f"{mpath}: {err}") from None
        if "hash" not in manifest:
            raise ArtifactError(f"{mpath}: missing field 'hash': every artifact carries the "
                                "SHA-256 of its manifest and PTX (write it with "
                                "write_artifact or Compiled.save)")
        ptx_text: dict[str, str] = {}
        for i, k in enumerate(kernels):
            if k.ptx not in ptx_text:
                fpath = p / k.ptx
                if not os.path.lexists(fpath):
                    raise ArtifactError(f"{p}: kernels[{i}].ptx names {k.ptx!r} (kernel "
                                        f"{k.name!r}), which is missing")
                ptx_text[k.ptx] = _read_text(fpath, PTX_LIMIT, f"kernels[{i}].ptx {k.ptx!r}")
            if not re.search(rf"\.entry\s+{re.escape(k.name)}(?![A-Za-z0-9_$])",
                             ptx_text[k.ptx]):
                raise ArtifactError(f"{p / k.ptx}: no .entry {k.name!r} in the PTX "
                                    f"(kernels[{i}].name)")
        expect = content_hash(manifest, ptx_text)
        if expect != manifest["hash"]:
            raise ArtifactError(f"{p}: content hash mismatch (manifest {manifest['hash'][:12]}, "
                                f"files {expect[:12]}): the artifact was changed after it was "
                                "written")
        return Artifact(path=p.resolve(), manifest=manifest, kernels=kernels,
                        ptx_text=ptx_text)
    except OSError as err:
        raise ArtifactError(f"{err.filename or p}: cannot read the artifact "
                            f"({err.strerror or err})") from None
    except ValueError as err:   # an embedded NUL in the path, and the like
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(f"{p}: not a usable artifact path ({err})") from None


def _what_is(path: Path) -> str:
    """'does not exist', 'is a file', 'is a FIFO', ... for a message."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "does not exist"
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"is {name}"
    return "is not a directory"


def _read_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of the regular file ``path`` (no link, FIFO, device; at most ``limit``
    bytes); opening never blocks."""
    from explorer.files import UnsafeFile, read_regular

    try:
        raw = read_regular(path, limit, follow_links=False)
    except UnsafeFile as err:
        raise ArtifactError(f"{what}: {err}") from None
    except IsADirectoryError:
        raise ArtifactError(f"{what}: {path} is a directory, not a file") from None
    except OSError as err:
        raise ArtifactError(f"{what}: cannot read {path} ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ArtifactError(f"{what}: {path} is not UTF-8 text (byte {err.start})") from None


def _refuse_constant(name: str) -> Any:
    raise ArtifactError(f"{name} is not a JSON number")


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ArtifactError as err:
        raise ArtifactError(f"{path}: {err}") from None
    except RecursionError:
        raise ArtifactError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:   # JSONDecodeError, an integer of too many digits
        raise ArtifactError(f"{path}: not valid JSON ({err})") from None


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
        extra = sorted(set(files) - set(names))
        if extra:
            raise ArtifactError(f"PTX given for {extra}, which no kernel names")
    for name, text in files.items():
        if not isinstance(text, str):
            raise ArtifactError(f"the PTX of {name!r} must be text, got {type(text).__name__}")
    body["hash"] = content_hash(body, files)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # each file replaces what was there (a FIFO, a link) instead of writing through it
    for name, text in files.items():
        _replace(out / name, text)
    _replace(out / MANIFEST, json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
    return out


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a new file beside ``path`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
