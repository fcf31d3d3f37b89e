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

The outputs have buffers of their own (so that no thread's outputs overwrite inputs another
thread has not read): packed the same way, each thread storing its own consecutive positions
and the block then reading the coalesced vectors for its wide stores, where they are stored in
the inputs' dtype (``out_dtype`` unset); as float32 scalars (the staged tile's) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlir.dialects import arith, vector
from mlir.ir import IntegerAttr, IntegerType, Value, VectorType

from explorer.codegen.emit import add_i, ci, f32, mul_i
from explorer.codegen.narrow import element_type
from explorer.codegen.options import ELEMENT_BYTES
from explorer.errors import CompileError

#: bytes of one vector access of the packed stage
VECTOR_BYTES = 16
#: 16-byte groups of one phase of a warp's shared-memory accesses (128 bytes, 32 banks)
PHASE_VECTORS = 8


def packs_outputs(options: Any) -> bool:
    """Whether a packed tile packs its outputs too: they are stored in the inputs' dtype (no
    ``out_dtype`` of their own); otherwise they leave through float32 scalars."""
    return bool(options.output_dtype == options.dtype)


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


def _aligned() -> IntegerAttr:
    return IntegerAttr.get(IntegerType.get_signless(64), VECTOR_BYTES)
