"""The kernel contract: what a launcher needs to run the kernels of a compile, typed.

The compiler writes it (:mod:`explorer.codegen.contract` builds the kernels and arguments of a
plan), the manifest of an artifact carries it, and every launcher reads it from here: the CUDA
runtime (:mod:`explorer.runtime.cuda`), the CPU runtime (:mod:`explorer.runtime.cpu`) and the
benchmark. :class:`ArgInfo` is a kernel parameter (role, shape, workspace size),
:class:`KernelInfo` a kernel and its launch geometry (grid rule, shared memory, when it is
launched), :class:`ChunkRule` how the chunk length of a call is chosen for a :class:`Machine`.
:func:`parse_kernels` checks the manifest form of the contract field by field (it comes from
elsewhere) and raises :class:`ArtifactError` naming the field at fault. Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# the argument names are owned by the front end, which refuses them as names of a recurrence;
# TIME_CHUNK is the size argument chosen per call by the chunk rule
from explorer.frontend.names import SIZE_NAMES as FRONTEND_SIZE_NAMES
from explorer.frontend.names import TIME_CHUNK

#: the PTX file of a kernel that names none
DEFAULT_PTX = "kernel.ptx"
#: ``segments``: a varlen compile's per-step marks of the packed sequences (float32, length L,
#: see :mod:`explorer.runtime.segments`); an ``output`` that is not ``timed`` is a last state
#: (one per sequence and channel)
ROLES = ("input", "param", "h0", "output", "size", "workspace", "rowmap", "rowmod",
         "segments")
#: the int64 arguments: the sizes, a row divisor (``rowmap``) per input that may be laid
#: out with a row per block of channels (channel c reads row ``c // divisor``; 1: a row each),
#: and a row modulus (``rowmod``) per parameter that may be given for the channels of the
#: trailing batch axes alone (channel c reads row ``c % modulus``; C: a row each)
INT_ROLES = ("size", "rowmap", "rowmod")
ARG_DTYPES = ("float32", "bfloat16", "float16", "int64")
#: the roles whose arrays may be 16-bit (the rest, parameters, initial states and workspaces,
#: are float32; see :mod:`explorer.runtime.dtypes`)
NARROW_ROLES = ("input", "output")
SIZE_NAMES = (*FRONTEND_SIZE_NAMES, TIME_CHUNK)
#: most arguments of a kernel
MAX_ARGS = 256
#: how a kernel whose grid counts whole channels spreads them over its blocks (the kernel's
#: ``channels``): ``threads``: a lane a thread, ``floor(threads / N)`` channels a block, so
#: N may not exceed the block's threads; ``block``: one channel a block, its lanes one after
#: another (a lane-summed readout is computed where all the lanes of a channel are)
CHANNEL_RULES = ("threads", "block")
#: a PTX file name: a plain name in the artifact directory, no path, no leading dot
PTX_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.ptx")


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
    """How the runtime picks ``time_chunk`` for a call (see :func:`choose_time_chunk`)."""

    tile: int           # steps one block scans per tile; chunks are whole tiles
    min_tiles: int = 1  # shortest chunk, in tiles, when chunking
    fill: float = 1.0   # blocks wanted when chunking, in units of the machine's block slots
    #: sequences (in units of block slots) from which each runs whole in one block;
    #: None: the same as ``fill``
    unchunked_from: float | None = None
    #: longest chunk, in tiles, when chunking (0: no limit); the look-back scan takes one tile
    #: a block, so its chunks are one tile or the whole sequence
    max_tiles: int = 0

    @property
    def threshold(self) -> float:
        return self.fill if self.unchunked_from is None else self.unchunked_from

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tile": self.tile, "min_tiles": self.min_tiles,
                               "fill": self.fill, "unchunked_from": self.threshold}
        if self.max_tiles:
            out["max_tiles"] = self.max_tiles
        return out

    def choose(self, C: int, N: int, L: int, machine: Machine) -> int:
        return choose_time_chunk(self, C, N, L, machine)

    def check(self, chunk: int, L: int) -> None:
        """Refuse a chunk length forced for a call that the kernels cannot take."""
        if self.max_tiles and self.tile * self.max_tiles < chunk < L:
            raise ValueError(f"time_chunk={chunk}: these kernels take chunks of at most "
                             f"{self.tile * self.max_tiles} steps, or the whole sequence "
                             f"(L={L})")


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
    per_chunk = max(rule.min_tiles, -(-tiles // chunks))
    if rule.max_tiles:
        per_chunk = min(per_chunk, rule.max_tiles)
    return rule.tile * per_chunk


def size_values(args: Sequence[ArgInfo], C: int, N: int, L: int, machine: Machine,
                time_chunk: int | None = None) -> dict[str, int]:
    """Values of the size arguments for one call (``time_chunk``: forced instead of chosen)."""
    out = {"C": C, "N": N, "L": L}
    for a in args:
        if a.role == "size" and a.name == TIME_CHUNK:
            assert a.chunk_rule is not None
            if time_chunk is not None:
                a.chunk_rule.check(int(time_chunk), L)
                out[TIME_CHUNK] = int(time_chunk)
            else:
                out[TIME_CHUNK] = a.chunk_rule.choose(C, N, L, machine)
    return out


def check_lanes(kernels: Sequence[KernelInfo], N: int) -> None:
    """ValueError, saying what fits, when a kernel's grid cannot hold channels of N lanes."""
    for k in kernels:
        if k.channels is not None:
            k.channels_per_block(N)


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
    #: a workspace the launcher zeroes before every launch (the look-back flags), or an
    #: output the kernels add into (a lane readout; a fused backward's parameter gradients),
    #: zeroed when allocated
    reset: bool = False
    #: an input of one step in ``every``: its time axis holds ``L // every`` entries, the steps
    #: ``every - 1``, ``2 * every - 1``, ... (a fused backward's checkpoints: the state at the
    #: last step of each of its tiles); 0: every step
    every: int = 0

    def steps(self, L: int) -> int:
        """The length of its time axis for ``L`` steps."""
        return time_steps(L, self.every)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "role": self.role, "timed": self.timed,
                               "lane": self.lane, "dtype": self.dtype}
        if self.role == "workspace":
            out.update(per_chunk=self.per_chunk, time_chunk=self.time_chunk)
        if self.reset:
            out["reset"] = True
        if self.every:
            out["every"] = self.every
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
    launch_unless_longer_than: int | str | None = None  # launched only when L <= this
    #: the grid counts whole channels (one of CHANNEL_RULES), not sequences
    channels: str | None = None

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def chunked_per_call(self) -> bool:
        """True when the kernel's chunk length is chosen per call."""
        return isinstance(self.time_chunk, str)

    def launched(self, L: int, sizes: Mapping[str, int] | None = None) -> bool:
        longer = _resolve(self.launch_when_longer_than, sizes)
        at_most = _resolve(self.launch_unless_longer_than, sizes)
        return (longer is None or L > longer) and (at_most is None or L <= at_most)

    def channels_per_block(self, N: int) -> int:
        """Whole channels of N lanes a block of a kernel whose grid counts channels runs;
        ValueError when N lanes do not fit its rule."""
        if self.channels == "block":
            return 1
        if N > self.threads:
            raise ValueError(
                f"kernel {self.name} sums the N lanes of a channel in one block of "
                f"{self.threads} threads, a lane a thread: N={N} lanes do not fit; compile with "
                f"block_size >= {N}, a tree strategy (its blocks loop over the lanes), or "
                "outputs='states' (no readout)")
        return self.threads // max(1, N)

    def grid(self, C: int, N: int, L: int | None = None,
             sizes: Mapping[str, int] | None = None) -> tuple[int, int, int]:
        """``grid_x = ceil(C * N / sequences_per_block)``, or ``ceil(C / channels a block)``
        for a kernel whose grid counts channels, times ``ceil(L / time_chunk)`` for a kernel
        that gives each time chunk its own block."""
        if self.channels is not None:
            blocks = max(1, -(-C // self.channels_per_block(N)))
        else:
            blocks = max(1, -(-(C * N) // self.sequences_per_block))
        if self.time_chunk is not None and L is not None:
            chunk = _resolve(self.time_chunk, sizes)
            assert chunk is not None
            blocks *= max(1, -(-L // chunk))
        return (blocks, 1, 1)

    def args_with_role(self, role: str) -> tuple[ArgInfo, ...]:
        return tuple(a for a in self.args if a.role == role)


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
    dtype = raw.get("dtype", "int64" if role in INT_ROLES else "float32")
    if not isinstance(dtype, str) or dtype not in ARG_DTYPES:
        raise ArtifactError(f"{where}: argument {name!r} has dtype {_show(dtype)}; "
                            f"expected one of {', '.join(ARG_DTYPES)}")
    if role == "size":
        if name not in SIZE_NAMES:
            raise ArtifactError(f"{where}.name: size argument {name!r} must be one of "
                                f"{', '.join(SIZE_NAMES)}")
        if dtype != "int64":
            raise ArtifactError(f"{where}: size argument {name!r} must be int64")
    elif role in ("rowmap", "rowmod"):
        if dtype != "int64":
            raise ArtifactError(f"{where}: row {'divisor' if role == 'rowmap' else 'modulus'} "
                                f"{name!r} must be int64")
    elif dtype == "int64" or (dtype != "float32" and role not in NARROW_ROLES):
        raise ArtifactError(f"{where}: array argument {name!r} ({role}) must be float32"
                            + (" or 16-bit" if role in NARROW_ROLES else ""))
    per_chunk: int | None = None
    time_chunk: int | str | None = None
    rule = None
    reset = _flag(raw.get("reset", False), f"{where}: argument {name!r} reset")
    if reset and role not in ("workspace", "output"):
        raise ArtifactError(f"{where}: argument {name!r} is reset but is neither a workspace "
                            "nor an output")
    if reset and role == "output" and dtype != "float32":
        raise ArtifactError(f"{where}: output {name!r} is reset (added into) but is not a "
                            "float32 output")
    if role == "workspace":
        per_chunk = _positive(raw.get("per_chunk"), f"{where}: workspace {name!r} per_chunk")
        time_chunk = _chunk_value(raw.get("time_chunk"), f"{where}: workspace {name!r} "
                                  "time_chunk")
    if role == "size" and name == TIME_CHUNK:
        rule = _parse_rule(raw.get("chunk_rule"), f"{where}: size argument {name!r}")
    timed = _flag(raw.get("timed", False), f"{where}: argument {name!r} timed")
    lane = _flag(raw.get("lane", False), f"{where}: argument {name!r} lane")
    every = 0
    if "every" in raw:
        every = _positive(raw["every"], f"{where}: argument {name!r} every")
        if role != "input" or not timed or dtype != "float32":
            raise ArtifactError(f"{where}: argument {name!r} has every but is not a timed "
                                "float32 input")
    return ArgInfo(name=name, role=role, timed=timed, lane=lane, dtype=dtype,
                   per_chunk=per_chunk, time_chunk=time_chunk, chunk_rule=rule, reset=reset,
                   every=every)


def time_steps(L: int, every: int) -> int:
    """The length of the time axis of an argument of one step in ``every`` (0: every step)
    for ``L`` steps: ``L // every``, the steps ``every - 1``, ``2 * every - 1``, ..."""
    return L // every if every else L


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
    max_tiles = raw.get("max_tiles", 0)
    if not (type(max_tiles) is int and max_tiles == 0):
        max_tiles = _positive(max_tiles, f"{where}: chunk_rule max_tiles")
    return ChunkRule(tile=tile, min_tiles=min_tiles, fill=numbers["fill"],
                     unchunked_from=numbers["unchunked_from"], max_tiles=max_tiles)


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
    names = [(a.name, a.role if a.role in ("h0", "output", "size", "workspace", "rowmap",
                                           "rowmod", "segments")
              else "array") for a in args]
    dup = sorted({f"{n} ({r})" for n, r in names if names.count((n, r)) > 1})
    if dup:
        raise ArtifactError(f"{where}: duplicate arguments {dup}")
    time_chunk = raw.get("time_chunk")
    if time_chunk is not None:
        time_chunk = _chunk_value(time_chunk, f"{where}: time_chunk")
    bounds = {}
    for key in ("launch_when_longer_than", "launch_unless_longer_than"):
        value = raw.get(key)
        if value is not None and value != TIME_CHUNK and (
                not isinstance(value, int) or isinstance(value, bool)
                or not 0 <= value <= MAX_INT):
            raise ArtifactError(f"{where}: {key} must be a non-negative integer "
                                f"or {TIME_CHUNK!r}, got {_show(value)}")
        bounds[key] = value
    longer, at_most = bounds["launch_when_longer_than"], bounds["launch_unless_longer_than"]
    channels = raw.get("channels")
    if channels is not None and channels not in CHANNEL_RULES:
        raise ArtifactError(f"{where}: channels must be one of {', '.join(CHANNEL_RULES)}, "
                            f"got {_show(channels)}")
    per_call = [v for v in (time_chunk, longer, at_most, *(a.time_chunk for a in args))
                if v == TIME_CHUNK]
    timed = {a.name for a in args if a.role == "input" and a.timed}
    timed |= {a.name for a in args if a.role == "output" and a.reset and a.timed}
    params = {a.name for a in args if a.role == "param"}
    for a in args:
        if a.role == "rowmap" and a.name not in timed:
            raise ArtifactError(f"{where}: row divisor {a.name!r} names no timed input and no "
                                "output added into")
        if a.role == "rowmod" and a.name not in params:
            raise ArtifactError(f"{where}: row modulus {a.name!r} names no parameter")
    if per_call and not any(a.role == "size" and a.name == TIME_CHUNK for a in args):
        raise ArtifactError(f"{where}: uses {TIME_CHUNK!r} per call but has no size argument "
                            f"{TIME_CHUNK!r}")
    return KernelInfo(name=name, ptx=ptx, block=(int(block[0]), int(block[1]), int(block[2])),
                      sequences_per_block=spb, shared_bytes=shared, args=args,
                      time_chunk=time_chunk, launch_when_longer_than=longer,
                      launch_unless_longer_than=at_most, channels=channels)


#: most kernels a contract may list
MAX_KERNELS = 64


def parse_kernels(raw: Any, where: str = "kernels") -> tuple[KernelInfo, ...]:
    """The typed kernels of a contract from their manifest form (checked field by field)."""
    if not isinstance(raw, list) or not raw:
        raise ArtifactError(f"{where} must be a non-empty list, got {_show(raw)}")
    if len(raw) > MAX_KERNELS:
        raise ArtifactError(f"{where} has {len(raw)} entries, at most {MAX_KERNELS}")
    return tuple(_parse_kernel(k, i) for i, k in enumerate(raw))
