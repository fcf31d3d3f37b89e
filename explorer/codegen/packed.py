"""The packed stage of a look-back tile (``scan.lookback {layout = "packed"}``).

A staged tile goes through shared memory as float32 scalars, one slot a position (padded
against bank conflicts), each thread reading its E consecutive positions one by one. A packed
stage holds each input as it is in memory, 16 bits a value for 16-bit inputs, and moves it in
16-byte vectors both ways: thread ``tid`` stores the coalesced vectors it loaded (vector
``g * B + tid`` of the tile, ``tile_slots``' groups), and reads back its own consecutive
positions as the M = ``E * bytes / 16`` vectors ``tid * M .. tid * M + M - 1``, converting them
to float32 in registers. So a value costs half (16-bit) or the same (float32) shared-memory
bytes, and a 16-byte access moves 8 or 4 of them, where the staged tile moves one.

Vector ``v`` of the tile is kept at ``o * M + (m XOR f(o))`` (``o = v / M``, its reader;
``m = v % M``): the XOR with ``f(o) = (o / P) % M`` (P = max(1, 8 / M)) spreads the 8
readers of one phase of a warp's 16-byte reads (128 bytes, the 32 banks) over distinct banks,
and the writers of consecutive vectors stay on distinct banks too (it permutes vectors within
a reader's M only). Measured outside the compiler (README, *That ceiling revisited*): the
look-back of bfloat16 0.681 / 0.703 of a copy packed against 0.568 / 0.613 staged as float32
scalars, 128 x 32 tiles at 1 x 2^26 and 16 x 2^20 on an H200; in the compiler's kernel 0.661 /
0.637 against 0.585 / 0.569 staged at 256 x 16, the default before (README, *A packed stage
for 16-bit look-back tiles*).

The outputs, where they are stored in the inputs' dtype (``out_dtype`` unset), are packed the
same way, each thread storing its own consecutive positions and the block then reading the
coalesced vectors for its wide stores: into the inputs' buffers for float32 where there are no
more outputs than inputs (:func:`shares_stage`), into buffers of their own otherwise; with an
``out_dtype`` of their own they go through buffers of float32 scalars (the staged tile's).

A float32 tile of streams read forwards in time reaches its stage by asynchronous copies
(``cp.async``, :func:`copy_tile`) where it lies whole in the range and is aligned: no register
holds the values on the way, and the kernel asks for more resident blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlir.dialects import arith, nvgpu, vector
from mlir.ir import IndexType, IntegerAttr, IntegerType, UnitAttr, Value, VectorType

from explorer.codegen.emit import add_i, ci, f32, mul_i
from explorer.codegen.narrow import element_type
from explorer.codegen.options import ELEMENT_BYTES
from explorer.codegen.threads import if_else
from explorer.codegen.tiles import streams_aligned
from explorer.errors import CompileError

#: bytes of one vector access of the packed stage
VECTOR_BYTES = 16
#: 16-byte groups of one phase of a warp's shared-memory accesses (128 bytes, 32 banks)
PHASE_VECTORS = 8


def packs_outputs(options: Any) -> bool:
    """Whether a packed tile packs its outputs too: they are stored in the inputs' dtype (no
    ``out_dtype`` of their own); otherwise they leave through float32 scalars."""
    return bool(options.output_dtype == options.dtype)


def shares_stage(options: Any, inputs: int, outputs: int) -> bool:
    """Whether a packed tile's outputs go through its inputs' stage buffers (output ``q``
    through input ``q``'s): float32 outputs of float32 inputs, no more of them. Each thread
    reads all of its own input vectors before it writes its outputs to the same places, and
    no thread reads another's inputs after the tree: the stage takes no more shared memory
    than the inputs', so more blocks fit an SM (6 of 256 x 16 float32 tiles). The 16-bit
    kernels, held to 6 blocks an SM by their registers, keep buffers of their own (sharing
    measured 1% slower in bfloat16 on an H200)."""
    return packs_outputs(options) and options.dtype == "float32" and outputs <= inputs


@dataclass(frozen=True)
class Packing:
    """How thread positions map to the words of a packed stage, for ``dtype`` inputs, E
    positions a thread, loaded V at once (coalesced)."""

    dtype: str
    E: int
    V: int

    def __post_init__(self) -> None:
        es = ELEMENT_BYTES[self.dtype]
        if self.V * es != VECTOR_BYTES or (self.E * es) % VECTOR_BYTES:
            raise CompileError(
                f"a packed look-back tile moves 16-byte vectors: {self.V} {self.dtype} "
                f"elements a load are {self.V * es} bytes and {self.E} a thread "
                f"{self.E * es} (a multiple of 16 needed)")

    @property
    def per_vector(self) -> int:
        """Elements of one 16-byte vector."""
        return VECTOR_BYTES // ELEMENT_BYTES[self.dtype]

    @property
    def M(self) -> int:
        """16-byte vectors of one thread's E positions."""
        return self.E // self.per_vector

    def _swizzle(self, o: Value) -> Value:
        """``f(o)``: the XOR that a reader's vectors take."""
        M = self.M
        if M == 1:
            return ci(0)
        P = max(1, PHASE_VECTORS // M)
        return arith.andi(arith.shrui(o, ci(P.bit_length() - 1)), ci(M - 1))

    def _word(self, o: Value, m: Value) -> Value:
        """The first float32 word of reader ``o``'s vector ``m``."""
        slot = add_i(mul_i(o, ci(self.M)), arith.xori(m, self._swizzle(o)))
        return mul_i(slot, ci(VECTOR_BYTES // 4))

    def _words(self) -> VectorType:
        return VectorType.get([VECTOR_BYTES // 4], f32())

    def _reader(self, v: Value) -> tuple[Value, Value]:
        """The reader ``o`` of the tile's vector ``v`` and its place ``m`` among the reader's."""
        M = self.M
        if M == 1:
            return v, ci(0)
        return arith.shrui(v, ci(M.bit_length() - 1)), arith.andi(v, ci(M - 1))

    def _put(self, buf: Value, o: Value, m: Value, vals: Value) -> None:
        """``vals`` (``vector<16 bytes' elements x f32>``) as reader ``o``'s vector ``m``,
        rounded to the dtype (exact for an input: its values came from a 16-bit load)."""
        if ELEMENT_BYTES[self.dtype] != 4:
            narrow = arith.truncf(VectorType.get([self.per_vector], element_type(self.dtype)),
                                  vals)
            vals = vector.bitcast(self._words(), narrow)
        vector.store(vals, buf, [self._word(o, m)], alignment=_aligned())

    def _get(self, buf: Value, o: Value, m: Value) -> Value:
        """Reader ``o``'s vector ``m`` as ``vector<16 bytes' elements x f32>``."""
        n = self.per_vector
        words = vector.load(self._words(), buf, [self._word(o, m)], alignment=_aligned())
        if ELEMENT_BYTES[self.dtype] == 4:
            return words
        narrow = vector.bitcast(VectorType.get([n], element_type(self.dtype)), words)
        return arith.extf(VectorType.get([n], f32()), narrow)

    def store(self, buf: Value, v: Value, vals: Value) -> None:
        """Store ``vals`` (``vector<V x f32>``, positions ``v * V ..``) as vector ``v``."""
        self._put(buf, *self._reader(v), vals)

    def copies(self, streams: Any) -> bool:
        """Whether the tile of ``streams`` can land in this stage by asynchronous copies
        (:meth:`copy`): float32 values (a 16-bit stage holds its values as 32-bit words) of
        streams read forwards in time at their own positions."""
        return self.dtype == "float32" and all(s.last is None and not s.offset
                                               for s in streams)

    def copy(self, buf: Value, v: Value, s: Any, t: Value) -> Value:
        """Vector ``v`` of the tile (positions ``t ..`` of stream ``s``, aligned) copied from
        memory to its place in ``buf`` by the copy engine of the SM (``nvgpu.device_async_copy``,
        ``cp.async`` of 16 bytes): no register holds it on the way. Returns the copy's token."""
        o, m = self._reader(v)
        return nvgpu.device_async_copy(buf, [self._word(o, m)], s.array, [s.at(t)],
                                       IntegerAttr.get(IndexType.get(), self.V),
                                       bypass_l1=UnitAttr.get())

    def load(self, buf: Value, v: Value) -> list[Value]:
        """The tile's vector ``v`` (positions ``v * V ..``), float32 scalars."""
        vec = self._get(buf, *self._reader(v))
        return [vector.extract(vec, [], [j]) for j in range(self.V)]

    def load_own(self, buf: Value, tid: Value) -> list[Value]:
        """Thread ``tid``'s E consecutive positions, float32 scalars in position order."""
        out: list[Value] = []
        for m in range(self.M):
            vec = self._get(buf, tid, ci(m))
            out += [vector.extract(vec, [], [j]) for j in range(self.per_vector)]
        return out

    def store_own(self, buf: Value, tid: Value, vals: list[Value]) -> None:
        """Thread ``tid``'s E consecutive positions (float32 scalars, position order),
        rounded to the dtype (an output's rounding, as its store would round it)."""
        n = self.per_vector
        for m in range(self.M):
            vec = vector.from_elements(VectorType.get([n], f32()), vals[m * n:(m + 1) * n])
            self._put(buf, tid, ci(m), vec)


def copy_tile(packing: Packing, stage: Sequence[Value], ins: Sequence[Any], tid: Value,
              t0: Value, end: Value, bs: int, E: int, aligned: Value | None,
              loads: Callable[[], None]) -> None:
    """Thread ``tid``'s vectors of the tile at ``t0`` into the packed ``stage``: by
    asynchronous copies (:meth:`Packing.copy`, then a wait for them all) where the tile lies
    whole before ``end`` and every stream of ``ins`` is aligned there (``aligned`` where the
    caller knows it), by ``loads`` (through registers) otherwise."""
    V = packing.V

    def copies() -> list[Value]:
        tokens = [packing.copy(stage[q], v, s, add_i(t0, mul_i(v, ci(V))))
                  for v in (add_i(ci(g * bs), tid) for g in range(E // V))
                  for q, s in enumerate(ins)]
        nvgpu.device_async_wait(nvgpu.device_async_create_group(tokens), num_groups=0)
        return []

    def through_registers() -> list[Value]:
        loads()
        return []
    whole = arith.cmpi(arith.CmpIPredicate.sle, add_i(t0, ci(bs * E)), end)
    ok = arith.andi(whole, streams_aligned(ins, t0, V) if aligned is None else aligned)
    if_else(ok, [], copies, through_registers)


def _aligned() -> IntegerAttr:
    return IntegerAttr.get(IntegerType.get_signless(64), VECTOR_BYTES)
