"""Bit operations on string values (Redis's ``bitops.c``): GETBIT, SETBIT, BITCOUNT,
BITPOS, BITOP, as operations on a :class:`~pion.keyspace.Keyspace`.

Bit 0 is the most significant bit of byte 0, as in Redis. SETBIT writes one byte
through :meth:`Keyspace.set_range` (logged as the byte it wrote, like APPEND), so a
bitmap of hundreds of MB costs the log a few bytes per SETBIT. BITOP stores its result
as a SET (or deletes the destination when every source is empty). Counting and the
bitwise operations run on Python integers (``int.from_bytes``), in C.
"""

from __future__ import annotations

from pion.errors import PionError
from pion.keyspace.store import Keyspace

__all__ = ["MAX_BIT_OFFSET", "bitcount", "bitop", "bitpos", "getbit", "setbit"]

# Redis refuses offsets whose byte is at or past proto-max-bulk-len (512 MB).
MAX_BIT_OFFSET = 512 * 1024 * 1024 * 8 - 1


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


def bitcount(value: bytes, start: int, end: int, in_bits: bool) -> int:
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
    if not in_bits:
        return int.from_bytes(value[start : end + 1], "big").bit_count()
    first, last = start >> 3, end >> 3
    span = int.from_bytes(value[first : last + 1], "big")
    nbits = (last - first + 1) * 8
    # Keep bits start..end of the span: drop the leading and trailing ones outside.
    span &= (1 << (nbits - (start & 7))) - 1
    span >>= 7 - (end & 7)
    return span.bit_count()


def bitpos(value: bytes, bit: int, start: int, end: int | None, in_bits: bool) -> int:
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
    first = lo >> 3
    span = int.from_bytes(value[first : (hi >> 3) + 1], "big")
    nbits = ((hi >> 3) - first + 1) * 8
    width = hi - lo + 1
    seg = (span >> (nbits - 1 - (hi - first * 8))) & ((1 << width) - 1)
    if not bit:
        seg ^= (1 << width) - 1
    if seg:
        return lo + width - seg.bit_length()
    if bit or end is not None:
        return -1
    return hi + 1


def bitop(ks: Keyspace, op: str, destination: bytes, sources: list[bytes]) -> int:
    """BITOP AND|OR|XOR|NOT: the result's length (the longest source's); missing
    sources are empty strings, shorter ones are padded with zero bytes."""
    values = [ks.string(k) or b"" for k in sources]
    size = max((len(v) for v in values), default=0)
    if not size:
        ks.delete((destination,))
        return 0
    ints = [int.from_bytes(v.ljust(size, b"\0"), "big") for v in values]
    if op == "NOT":
        acc = ints[0] ^ ((1 << (8 * size)) - 1)
    else:
        acc = ints[0]
        for n in ints[1:]:
            if op == "AND":
                acc &= n
            elif op == "OR":
                acc |= n
            else:
                acc ^= n
    ks.set_string(destination, acc.to_bytes(size, "big"))
    return size


def parse_bit_offset(raw: bytes, parse: int | None) -> int:
    """A bit offset argument (``parse`` is its strict integer reading, or None)."""
    if parse is None or not 0 <= parse <= MAX_BIT_OFFSET:
        raise PionError("bit offset is not an integer or out of range")
    return parse
