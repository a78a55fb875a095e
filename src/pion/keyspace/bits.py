"""Bit operations on string values (Redis's ``bitops.c``): GETBIT, SETBIT, BITCOUNT,
BITPOS, BITOP, as operations on a :class:`~pion.keyspace.Keyspace`.

Bit 0 is the most significant bit of byte 0, as in Redis. SETBIT writes one byte
through :meth:`Keyspace.set_range` (logged as the byte it wrote, like APPEND), so a
bitmap of hundreds of MB costs the log a few bytes per SETBIT. BITOP stores its result
as a SET (or deletes the destination when every source is empty).

BITCOUNT, BITPOS and BITOP scan whole strings (up to 512 MB), so they run in numpy on
views of the value, :data:`STEP_BYTES` at a time, and are generators that yield
between pieces (a string of one piece never yields): the command layer runs a large
string's in steps of the event loop (``pion.commands.bits``), other clients' commands
in between.
A string value is an immutable ``bytes`` that every change replaces, so BITCOUNT and
BITPOS read the value of one instant whatever runs between their steps. BITOP stores
its result in its last step, and only if no source changed meanwhile; if one did, it
runs again at once on what the sources hold then, so its result is always that of
one instant's sources.
"""

from __future__ import annotations

import io
from collections.abc import Generator
from typing import Any

import numpy as np

from pion.errors import PionError
from pion.keyspace.store import Keyspace

__all__ = [
    "MAX_BIT_OFFSET",
    "STEP_BYTES",
    "bitcount",
    "bitop",
    "bitpos",
    "getbit",
    "parse_bit_offset",
    "run_at_once",
    "setbit",
]

# Redis refuses offsets whose byte is at or past proto-max-bulk-len (512 MB).
MAX_BIT_OFFSET = 512 * 1024 * 1024 * 8 - 1

# Bytes scanned between two yields: a fraction of a millisecond in numpy.
STEP_BYTES = 1 << 20

# Work that yields between pieces and returns its answer.
Work = Generator[None, None, int]

_u8 = np.uint8


def getbit(ks: Keyspace, key: bytes, offset: int) -> int:
    value = ks.string(key)
    byte = offset >> 3
    if value is None or byte >= len(value):
        return 0
    return (value[byte] >> (7 - (offset & 7))) & 1


def setbit(ks: Keyspace, key: bytes, offset: int, bit: int) -> int:
    """The bit's old value; the string grows (zero bytes) to hold it."""
    value = ks.string(key, read=False)
    byte = offset >> 3
    old_byte = value[byte] if value is not None and byte < len(value) else 0
    mask = 1 << (7 - (offset & 7))
    new_byte = (old_byte | mask) if bit else (old_byte & ~mask)
    grows = value is None or byte >= len(value)
    if grows or new_byte != old_byte:  # as Redis, an unchanged bitmap is not written
        ks.set_range(key, byte, bytes((new_byte,)))
    return 1 if old_byte & mask else 0


def _popcount(a: np.ndarray[Any, Any]) -> int:
    """The set bits of a uint8 array: eight bytes at a time where numpy has
    ``bitwise_count`` (numpy 2), else a lookup table."""
    if _bitwise_count is None:
        return int(_POPCOUNT[a].sum(dtype=np.uint64))
    whole = len(a) & ~7
    n = int(_bitwise_count(a[:whole].view(np.uint64)).sum(dtype=np.uint64))
    return n + int(_bitwise_count(a[whole:]).sum(dtype=np.uint64))


_bitwise_count = getattr(np, "bitwise_count", None)
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=_u8)


def _view(value: bytes, start: int, stop: int) -> np.ndarray[Any, Any]:
    return np.frombuffer(value, dtype=_u8, count=stop - start, offset=start)


def bitcount(value: bytes, start: int, end: int, in_bits: bool) -> Work:
    """BITCOUNT over ``start..end`` (bytes, or bits with ``in_bits``), Redis's
    clamping of negative and out-of-range indexes."""
    total = len(value) * 8 if in_bits else len(value)
    if start < 0 and end < 0 and start > end:
        return 0
    start = max(start + total if start < 0 else start, 0)
    end = max(end + total if end < 0 else end, 0)
    end = min(end, total - 1)
    if start > end:
        return 0
    lo, hi = (start, end) if in_bits else (start * 8, end * 8 + 7)
    first, last = lo >> 3, hi >> 3
    # The edge bytes keep only the bits inside lo..hi; the bytes between count whole.
    head = value[first] & (0xFF >> (lo & 7))
    if first == last:
        return (head & (0xFF << (7 - (hi & 7)))).bit_count()
    count = head.bit_count() + (value[last] & (0xFF << (7 - (hi & 7))) & 0xFF).bit_count()
    for piece in range(first + 1, last, STEP_BYTES):
        if piece > first + 1:
            yield
        count += _popcount(_view(value, piece, min(piece + STEP_BYTES, last)))
    return count


def _first_bit(byte: int, bit: int, mask: int) -> int:
    """The index (0 = most significant) of the first ``bit`` among ``mask``'s bits of
    ``byte``, or -1."""
    wanted = (byte if bit else ~byte) & mask
    return 8 - wanted.bit_length() if wanted else -1


def bitpos(value: bytes, bit: int, start: int, end: int | None, in_bits: bool) -> Work:
    """BITPOS over ``start..end`` (``end`` None: to the string's end), Redis 7.0's
    answers: -1 for an empty range or no such bit, except that a clear bit looked for
    without an ``end`` is found just past the string (it reads as zero padded)."""
    total = len(value) * 8 if in_bits else len(value)
    stop = (total - 1) if end is None else end
    start = max(start + total if start < 0 else start, 0)
    stop = max(stop + total if stop < 0 else stop, 0)
    stop = min(stop, total - 1)
    if start > stop:
        return -1
    lo, hi = (start, stop) if in_bits else (start * 8, stop * 8 + 7)
    first, last = lo >> 3, hi >> 3
    head = 0xFF >> (lo & 7)
    tail = (0xFF << (7 - (hi & 7))) & 0xFF
    found = _first_bit(value[first], bit, head & tail if first == last else head)
    if found >= 0:
        return first * 8 + found
    # The whole bytes between: the first that is not all ``not bit``.
    skip = 0 if bit else 0xFF
    for piece in range(first + 1, last, STEP_BYTES):
        if piece > first + 1:
            yield
        other = _view(value, piece, min(piece + STEP_BYTES, last)) != skip
        i = int(other.argmax())
        if other[i]:
            return (piece + i) * 8 + _first_bit(value[piece + i], bit, 0xFF)
    if last > first:
        found = _first_bit(value[last], bit, tail)
        if found >= 0:
            return last * 8 + found
    if bit or end is not None:
        return -1
    return hi + 1


def _source(value: bytes, start: int, stop: int) -> np.ndarray[Any, Any]:
    """Bytes ``start..stop`` of a source, zero padded past its end."""
    if stop <= len(value):
        return _view(value, start, stop)
    out = np.zeros(stop - start, dtype=_u8)
    if start < len(value):
        out[: len(value) - start] = _view(value, start, len(value))
    return out


_OPS = {"AND": np.bitwise_and, "OR": np.bitwise_or, "XOR": np.bitwise_xor}


def _combine(op: str, values: list[bytes], size: int) -> Generator[None, None, bytes]:
    """The result of ``op`` over ``values`` (zero padded to ``size``), built piece by
    piece in a BytesIO, whose ``getvalue`` hands over its buffer without a copy."""
    out = io.BytesIO()
    acc = np.empty(min(size, STEP_BYTES), dtype=_u8)
    for piece in range(0, size, STEP_BYTES):
        if piece:
            yield
        stop = min(piece + STEP_BYTES, size)
        part = acc[: stop - piece]
        if op == "NOT":
            np.invert(_source(values[0], piece, stop), out=part)
        else:
            part[:] = _source(values[0], piece, stop)
            for v in values[1:]:
                _OPS[op](part, _source(v, piece, stop), out=part)
        out.write(part.data)
    return out.getvalue()


def bitop(ks: Keyspace, op: str, destination: bytes, sources: list[bytes]) -> Work:
    """BITOP AND|OR|XOR|NOT: the result's length (the longest source's); missing
    sources are empty strings, shorter ones are padded with zero bytes."""
    taken = [ks.string(k) for k in sources]
    values = [v or b"" for v in taken]
    size = max((len(v) for v in values), default=0)
    if not size:
        ks.delete((destination,))
        return 0
    result = yield from _combine(op, values, size)
    if any(_held(ks, k) is not v for k, v in zip(sources, taken, strict=True)):
        # A source changed between the steps: the answer is that of its sources now,
        # computed at once (in steps, a busy writer could keep it from ever landing).
        return run_at_once(bitop(ks, op, destination, sources))
    ks.set_string(destination, result)
    return size


def _held(ks: Keyspace, key: bytes) -> object:
    e = ks.peek(key)
    return None if e is None else e.value


def run_at_once(work: Work) -> int:
    """Every piece of ``work`` without yielding; its answer."""
    try:
        while True:
            next(work)
    except StopIteration as stop:
        answer: int = stop.value
        return answer


def parse_bit_offset(raw: bytes, parse: int | None) -> int:
    """A bit offset argument (``parse`` is its strict integer reading, or None)."""
    if parse is None or not 0 <= parse <= MAX_BIT_OFFSET:
        raise PionError("bit offset is not an integer or out of range")
    return parse
