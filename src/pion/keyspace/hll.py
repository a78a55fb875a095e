"""HyperLogLog in Redis's own encoding (``hyperloglog.c`` of Redis 7.0), so that a
value PFADD built here is byte for byte the one redis-server builds after the same
PFADDs, and a value copied from redis-server counts the same here.

The value is a string (no new key type, as in Redis)::

    offset  size  field
    0       4     magic "HYLL"
    4       1     encoding: 0 dense, 1 sparse
    5       3     unused, kept as found
    8       8     cached cardinality, little endian; bit 7 of byte 15 set: stale

Dense: 16384 registers of 6 bits, packed from each byte's least significant bit
(register 0 is bits 0-5 of byte 16), 12288 bytes: 12304 in all. Sparse: run-length
opcodes, ``00xxxxxx`` ZERO (1-64 zero registers), ``01xxxxxx yyyyyyyy`` XZERO (1-16384
zero registers), ``1vvvvvxx`` VAL (1-4 registers of value 1-32). A sparse value whose
next write would pass ``hll-sparse-max-bytes`` (or needs a register above 32) is
promoted to dense.

An element goes to register ``h & 16383`` with the count of the trailing zero bits of
``h >> 14`` plus one (at most 51), ``h`` its MurmurHash64A with seed 0xadc83b19.
The estimate is Ertl's improved estimator (``hllTau``/``hllSigma``) on the register
histogram, in IEEE doubles as Redis computes it, so the counts are Redis's exactly.

Sparse updates follow ``hllSparseSet`` step by step (the split of a run, the 5-opcode
merge scan from the previous opcode): the bytes depend on the order of the updates,
not only on the registers. The opcodes are held as a list beside the first register
each covers (a split or merge never moves a later opcode's first register), so an
update finds its opcode by bisection instead of a scan. The dense registers are a
numpy array (one byte each) between unpacking and packing.

Not here: PFDEBUG and PFSELFTEST (not served).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

import numpy as np

from pion.errors import PionError, WrongTypeError

__all__ = [
    "DEFAULT_SPARSE_MAX_BYTES",
    "HEADER",
    "REGISTERS",
    "Hll",
    "InvalidHllError",
    "cached_count",
    "estimate",
    "murmurhash64a",
    "pattern",
]

REGISTERS = 1 << 14  # HLL_P 14
_MASK = REGISTERS - 1
_Q = 64 - 14  # bits of the hash left after the register index
HEADER = 16
DENSE_SIZE = HEADER + REGISTERS * 6 // 8
DENSE, SPARSE = 0, 1
# Redis's default for hll-sparse-max-bytes (redis.conf): past it, sparse goes dense.
DEFAULT_SPARSE_MAX_BYTES = 3000
_SEED = 0xADC83B19
_M64 = (1 << 64) - 1
_ALPHA_INF = 0.721347520444481703680  # 0.5 / ln(2)

# Opcode kinds of the sparse encoding.
ZERO, XZERO, VAL = 0, 1, 2
_VAL_MAX = 32
_NOT_HLL = "Key is not a valid HyperLogLog string value."


class InvalidHllError(PionError):
    """A value with a valid header whose registers do not decode (Redis's
    ``-INVALIDOBJ Corrupted HLL object detected``)."""

    code = "INVALIDOBJ"

    def __init__(self) -> None:
        super().__init__("Corrupted HLL object detected")


def murmurhash64a(data: bytes, seed: int = _SEED) -> int:
    """MurmurHash64A as Redis has it (little-endian words, whatever the host)."""
    m, r = 0xC6A4A7935BD1E995, 47
    n = len(data)
    h = (seed ^ (n * m)) & _M64
    whole = n - (n & 7)
    for i in range(0, whole, 8):
        k = (int.from_bytes(data[i : i + 8], "little") * m) & _M64
        k = ((k ^ (k >> r)) * m) & _M64
        h = ((h ^ k) * m) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(data[whole:], "little")) * m) & _M64
    h = ((h ^ (h >> r)) * m) & _M64
    return h ^ (h >> r)


def pattern(element: bytes) -> tuple[int, int]:
    """The element's register and its count (``hllPatLen``)."""
    h = murmurhash64a(element)
    rest = (h >> 14) | (1 << _Q)  # the bit past the end makes the count at most 51
    return h & _MASK, (rest & -rest).bit_length()


def _tau(x: float) -> float:
    if x in (0.0, 1.0):
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        before = z
        y *= 0.5
        z -= math.pow(1.0 - x, 2) * y
        if before == z:
            return z / 3


def _sigma(x: float) -> float:
    if x == 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        before = z
        z += x * y
        y += y
        if before == z:
            return z


def estimate(histogram: np.ndarray[Any, Any]) -> int:
    """``hllCount``'s estimate from the histogram of register values (64 bins)."""
    m = float(REGISTERS)
    reg = [int(c) for c in histogram]
    z = m * _tau((m - reg[_Q + 1]) / m)
    for j in range(_Q, 0, -1):
        z += reg[j]
        z *= 0.5
    z += m * _sigma(reg[0] / m)
    e = _ALPHA_INF * m * m / z
    # llroundl: halves away from zero (e - floor(e) is exact in a double).
    whole = math.floor(e)
    return int(whole) + (1 if e - whole >= 0.5 else 0)


def _unpack(body: bytes | bytearray) -> np.ndarray[Any, Any]:
    """Dense bytes -> one uint8 per register (four registers in each 3 bytes)."""
    b = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3).astype(np.uint32)
    word = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    out = np.empty((len(word), 4), dtype=np.uint8)
    for i in range(4):
        out[:, i] = (word >> (6 * i)) & 63
    return out.reshape(-1)


def _pack(registers: np.ndarray[Any, Any]) -> bytes:
    r = registers.reshape(-1, 4).astype(np.uint32)
    word = r[:, 0] | (r[:, 1] << 6) | (r[:, 2] << 12) | (r[:, 3] << 18)
    out = np.empty((len(word), 3), dtype=np.uint8)
    for i in range(3):
        out[:, i] = (word >> (8 * i)) & 0xFF
    return out.tobytes()


def _opcodes(body: bytes) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Sparse bytes -> opcodes ``(kind, value, run)`` and the first register of each.
    Whether they cover exactly the 16384 registers is checked where Redis checks it
    (a register past their end, promotion, counting, merging): :meth:`Hll.covered`."""
    ops: list[tuple[int, int, int]] = []
    starts: list[int] = []
    first = i = 0
    n = len(body)
    while i < n:
        b = body[i]
        if b & 0x80:
            op = (VAL, ((b >> 2) & 0x1F) + 1, (b & 3) + 1)
            i += 1
        elif b & 0x40:
            # A cut XZERO reads the string's terminating zero byte, as in Redis.
            op = (XZERO, 0, (((b & 0x3F) << 8) | (body[i + 1] if i + 1 < n else 0)) + 1)
            i += 2
        else:
            op = (ZERO, 0, (b & 0x3F) + 1)
            i += 1
        ops.append(op)
        starts.append(first)
        first += op[2]
    return ops, starts


def _sparse_bytes(ops: list[tuple[int, int, int]]) -> bytearray:
    out = bytearray()
    for kind, value, run in ops:
        if kind == VAL:
            out.append(0x80 | (value - 1) << 2 | (run - 1))
        elif kind == XZERO:
            out += bytes((0x40 | (run - 1) >> 8, (run - 1) & 0xFF))
        else:
            out.append(run - 1)
    return out


def _zero_run(run: int) -> tuple[int, int, int]:
    return (XZERO if run > 64 else ZERO, 0, run)


def _check_header(value: bytes) -> int:
    """``isHLLObjectOrReply``: the encoding, or WRONGTYPE for a foreign string."""
    if len(value) < HEADER or value[:4] != b"HYLL" or value[4] > SPARSE:
        raise WrongTypeError(_NOT_HLL)
    if value[4] == DENSE and len(value) != DENSE_SIZE:
        raise WrongTypeError(_NOT_HLL)
    return value[4]


def cached_count(value: bytes) -> int | None:
    """The cached cardinality of a valid HLL value, None when stale."""
    _check_header(value)
    return None if value[15] & 0x80 else int.from_bytes(value[8:16], "little")


class Hll:
    """One HLL value being read or changed: its header, and either the sparse opcodes
    or the dense registers. ``encode()`` gives the value's bytes."""

    def __init__(self, value: bytes | None, sparse_max_bytes: int) -> None:
        """``value`` a stored string (WRONGTYPE if not an HLL), None for a new empty
        HLL (``createHLLObject``: sparse, XZERO over all registers, cached 0)."""
        self.max_bytes = sparse_max_bytes
        self.registers: np.ndarray[Any, Any] | None = None
        self.ops: list[tuple[int, int, int]] = []
        self.starts: list[int] = []
        if value is None:
            self.header = bytearray(b"HYLL\x01" + bytes(11))
            self.ops, self.starts = [(XZERO, 0, REGISTERS)], [0]
            self.size = HEADER + 2
            return
        encoding = _check_header(value)
        self.header = bytearray(value[:HEADER])
        if encoding == DENSE:
            self.registers = _unpack(value[HEADER:]).copy()
        else:
            self.ops, self.starts = _opcodes(value[HEADER:])
        self.size = len(value)

    def _check_covered(self) -> None:
        """A sparse value's opcodes must cover the 16384 registers exactly."""
        if self.registers is None and (
            not self.ops or self.starts[-1] + self.ops[-1][2] != REGISTERS
        ):
            raise InvalidHllError()

    @property
    def dense(self) -> bool:
        return self.registers is not None

    def encode(self) -> bytes:
        if self.registers is not None:
            return bytes(self.header) + _pack(self.registers)
        return bytes(self.header + _sparse_bytes(self.ops))

    def invalidate(self) -> None:
        self.header[15] |= 0x80

    def set_cache(self, count: int) -> None:
        self.header[8:16] = count.to_bytes(8, "little")

    def histogram(self) -> np.ndarray[Any, Any]:
        if self.registers is not None:
            return np.bincount(self.registers, minlength=64)
        self._check_covered()
        hist = np.zeros(64, dtype=np.int64)
        for _kind, value, run in self.ops:
            hist[value] += run
        return hist

    def max_into(self, acc: np.ndarray[Any, Any]) -> None:
        """``hllMerge``: ``acc[i] = max(acc[i], register i)``."""
        if self.registers is not None:
            np.maximum(acc, self.registers, out=acc)
            return
        self._check_covered()
        for (kind, value, run), first in zip(self.ops, self.starts, strict=True):
            if kind == VAL:
                part = acc[first : first + run]
                np.maximum(part, value, out=part)

    def add(self, element: bytes) -> bool:
        """PFADD of one element (``hllAdd``): whether a register grew."""
        index, count = pattern(element)
        return self.set(index, count)

    def set(self, index: int, count: int) -> bool:
        """Register ``index`` to ``count`` if that is more than it holds."""
        if self.registers is not None:
            if self.registers[index] >= count:
                return False
            self.registers[index] = count
            return True
        return self._sparse_set(index, count)

    def promote(self) -> None:
        """``hllSparseToDense``: the header is kept (cached count included)."""
        if self.registers is not None:
            return
        self._check_covered()
        registers = np.zeros(REGISTERS, dtype=np.uint8)
        for (kind, value, run), first in zip(self.ops, self.starts, strict=True):
            if kind == VAL:
                registers[first : first + run] = value
        self.registers = registers
        self.header[4] = DENSE
        self.ops, self.starts = [], []
        self.size = DENSE_SIZE

    def _sparse_set(self, index: int, count: int) -> bool:
        """``hllSparseSet``, opcode for opcode."""
        if count > _VAL_MAX:
            return self._promote_set(index, count)
        ops, starts = self.ops, self.starts
        i = bisect_right(starts, index) - 1
        if i < 0 or index >= starts[i] + ops[i][2]:
            raise InvalidHllError()  # past the opcodes' end
        kind, value, run = ops[i]
        first = starts[i]
        if kind == VAL and value >= count:
            return False
        if run == 1 and kind != XZERO:  # cases B and C: the opcode is this register
            ops[i] = (VAL, count, 1)
        else:
            seq: list[tuple[int, int, int]] = []
            last = first + run - 1
            if index != first:
                seq.append(_zero_run(index - first) if kind != VAL else (VAL, value, index - first))
            seq.append((VAL, count, 1))
            if index != last:
                seq.append(_zero_run(last - index) if kind != VAL else (VAL, value, last - index))
            delta = sum(2 if op[0] == XZERO else 1 for op in seq) - (2 if kind == XZERO else 1)
            if delta > 0 and self.size + delta > self.max_bytes:
                return self._promote_set(index, count)
            seq_starts = [first]
            for op in seq[:-1]:
                seq_starts.append(seq_starts[-1] + op[2])
            ops[i : i + 1] = seq
            starts[i : i + 1] = seq_starts
            self.size += delta
        self._merge_from(i - 1 if i > 0 else 0)
        return True

    def _merge_from(self, p: int) -> None:
        """Step 4: up to 5 opcodes from ``p``, adjacent VALs of one value merged."""
        ops, starts = self.ops, self.starts
        scan = 5
        while p < len(ops) and scan > 0:
            scan -= 1
            kind, value, run = ops[p]
            if kind != VAL:
                p += 1
                continue
            if p + 1 < len(ops):
                nkind, nvalue, nrun = ops[p + 1]
                if nkind == VAL and nvalue == value and run + nrun <= 4:
                    ops[p] = (VAL, value, run + nrun)
                    del ops[p + 1]
                    del starts[p + 1]
                    self.size -= 1
                    continue  # the merged run may merge with the next one too
            p += 1

    def _promote_set(self, index: int, count: int) -> bool:
        self.promote()
        registers = self.registers
        if registers is not None:  # (always, once promoted)
            registers[index] = max(int(registers[index]), count)
        return True

    def merge_registers(self, acc: np.ndarray[Any, Any]) -> None:
        """PFMERGE's write of the union ``acc`` into this HLL: register by register in
        index order while sparse (the bytes depend on the order), at once when dense."""
        if self.registers is None:
            for j in np.flatnonzero(acc).tolist():
                self.set(j, int(acc[j]))
                if self.registers is not None:
                    break
        if self.registers is not None:
            np.maximum(self.registers, acc, out=self.registers)
