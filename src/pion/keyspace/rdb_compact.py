"""Reading the compact encodings inside a Redis DUMP payload: listpack (Redis 7),
ziplist (Redis 6 and older), intset, and LZF-compressed strings; and the payload's
length encoding, both ways (:func:`put_length`, :class:`Reader`), which every value
type's reader and writer (``rdb.py``, ``rdb_stream.py``) shares.

Sans-IO and bounds-checked: every length is checked against the bytes that are really
there before anything is allocated, so a hostile payload raises :class:`BadFormat`
(RESTORE's "Bad data format") and never makes the server allocate what it claims.
Integers come back as their decimal bytes, as Redis hands them to its commands.
"""

from __future__ import annotations

import math
import struct

__all__ = [
    "BadFormat",
    "Reader",
    "intset",
    "listpack",
    "lzf_decompress",
    "put_length",
    "ziplist",
]


class BadFormat(ValueError):
    """The payload is not what its type byte says it is."""


_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


def _take(buf: bytes, at: int, n: int) -> bytes:
    if n < 0 or at + n > len(buf):
        raise BadFormat("a length runs past the end of the payload")
    return buf[at : at + n]


def _int24(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def _backlen_size(entry_len: int) -> int:
    """How many bytes a listpack entry's trailing length takes (``lpEncodeBacklen``)."""
    if entry_len <= 127:
        return 1
    if entry_len < 16383:
        return 2
    if entry_len < 2097151:
        return 3
    if entry_len < 268435455:
        return 4
    return 5


def _lp_entry(buf: bytes, at: int) -> tuple[bytes, int]:
    """One listpack entry at ``at``: (its value, the offset after its backlen)."""
    b = _take(buf, at, 1)[0]
    if b < 0x80:  # 0xxxxxxx: a 7-bit unsigned integer
        value, head, size = str(b).encode(), 1, 0
    elif b >> 6 == 0b10:  # 10xxxxxx: a string of up to 63 bytes
        head, size = 1, b & 0x3F
        value = _take(buf, at + head, size)
    elif b >> 5 == 0b110:  # 110xxxxx yyyyyyyy: a 13-bit signed integer
        raw = ((b & 0x1F) << 8) | _take(buf, at + 1, 1)[0]
        value, head, size = str(raw - (1 << 13) if raw >= 1 << 12 else raw).encode(), 2, 0
    elif b >> 4 == 0b1110:  # 1110xxxx yyyyyyyy: a string of up to 4095 bytes
        head, size = 2, ((b & 0x0F) << 8) | _take(buf, at + 1, 1)[0]
        value = _take(buf, at + head, size)
    elif b == 0xF0:  # a string with a 32-bit length
        head, size = 5, _U32.unpack(_take(buf, at + 1, 4))[0]
        value = _take(buf, at + head, size)
    elif b in _LP_INTS:
        width = _LP_INTS[b]
        value = str(int.from_bytes(_take(buf, at + 1, width), "little", signed=True)).encode()
        head, size = 1 + width, 0
    else:
        raise BadFormat(f"unknown listpack entry encoding {b:#x}")
    entry_len = head + size
    return value, at + entry_len + _backlen_size(entry_len)


_LP_INTS = {0xF1: 2, 0xF2: 3, 0xF3: 4, 0xF4: 8}


def listpack(buf: bytes) -> list[bytes]:
    """The entries of a listpack (``lpValidateIntegrity``'s checks: the header's total
    matches, entries end exactly at the 0xFF terminator, the count agrees)."""
    if len(buf) < 7 or _U32.unpack_from(buf, 0)[0] != len(buf) or buf[-1] != 0xFF:
        raise BadFormat("a listpack's header does not match its size")
    count = _U16.unpack_from(buf, 4)[0]
    out: list[bytes] = []
    at = 6
    while at < len(buf) - 1:
        value, at = _lp_entry(buf, at)
        out.append(value)
    if at != len(buf) - 1 or (count != 0xFFFF and count != len(out)):
        raise BadFormat("a listpack's entries do not end at its terminator")
    return out


def _zl_entry(buf: bytes, at: int) -> tuple[bytes, int]:
    """One ziplist entry at ``at`` (after its previous-entry length)."""
    b = _take(buf, at, 1)[0]
    kind = b >> 6
    if kind == 0:
        return _take(buf, at + 1, b & 0x3F), at + 1 + (b & 0x3F)
    if kind == 1:
        n = ((b & 0x3F) << 8) | _take(buf, at + 1, 1)[0]
        return _take(buf, at + 2, n), at + 2 + n
    if kind == 2:
        n = int.from_bytes(_take(buf, at + 1, 4), "big")
        return _take(buf, at + 5, n), at + 5 + n
    if b == 0xC0:
        return str(_I16.unpack(_take(buf, at + 1, 2))[0]).encode(), at + 3
    if b == 0xD0:
        return str(_I32.unpack(_take(buf, at + 1, 4))[0]).encode(), at + 5
    if b == 0xE0:
        return str(_I64.unpack(_take(buf, at + 1, 8))[0]).encode(), at + 9
    if b == 0xF0:
        return str(_int24(_take(buf, at + 1, 3))).encode(), at + 4
    if b == 0xFE:
        return str(int.from_bytes(_take(buf, at + 1, 1), "little", signed=True)).encode(), at + 2
    if 0xF1 <= b <= 0xFD:
        return str((b & 0x0F) - 1).encode(), at + 1
    raise BadFormat(f"unknown ziplist entry encoding {b:#x}")


def ziplist(buf: bytes) -> list[bytes]:
    """The entries of a ziplist (Redis 6's small lists, hashes and sorted sets)."""
    if len(buf) < 11 or _U32.unpack_from(buf, 0)[0] != len(buf) or buf[-1] != 0xFF:
        raise BadFormat("a ziplist's header does not match its size")
    out: list[bytes] = []
    at = 10
    while at < len(buf) - 1:
        at += 5 if _take(buf, at, 1)[0] == 0xFE else 1  # the previous entry's length
        value, at = _zl_entry(buf, at)
        out.append(value)
    if at != len(buf) - 1:
        raise BadFormat("a ziplist's entries do not end at its terminator")
    return out


def intset(buf: bytes) -> list[bytes]:
    """The members of an intset: its width (2, 4 or 8 bytes), count, then the integers."""
    if len(buf) < 8:
        raise BadFormat("an intset is shorter than its header")
    width, count = _U32.unpack_from(buf, 0)[0], _U32.unpack_from(buf, 4)[0]
    fmt = {2: "h", 4: "i", 8: "q"}.get(width)
    if fmt is None or len(buf) != 8 + width * count:
        raise BadFormat("an intset's header does not match its size")
    return [str(v).encode() for v in struct.unpack_from(f"<{count}{fmt}", buf, 8)]


def lzf_decompress(data: bytes, size: int) -> bytes:
    """LZF (liblzf's ``lzf_decompress``), which Redis uses for strings over 20 bytes.
    ``size`` is the length the payload claims; the output grows as the input really
    produces it, so a false claim costs nothing before it is found out."""
    out = bytearray()
    at, end = 0, len(data)
    while at < end:
        ctrl = data[at]
        at += 1
        if ctrl < 32:  # a literal run of ctrl + 1 bytes
            n = ctrl + 1
            if at + n > end or len(out) + n > size:
                raise BadFormat("an LZF literal runs past its bounds")
            out += data[at : at + n]
            at += n
            continue
        n = ctrl >> 5
        if n == 7:
            if at >= end:
                raise BadFormat("an LZF back reference is cut short")
            n += data[at]
            at += 1
        if at >= end:
            raise BadFormat("an LZF back reference is cut short")
        back = len(out) - ((ctrl & 0x1F) << 8) - data[at] - 1
        at += 1
        n += 2
        if back < 0 or len(out) + n > size:
            raise BadFormat("an LZF back reference points outside the output")
        period = len(out) - back
        if n <= period:
            out += out[back : back + n]
        else:  # overlapping: the reference repeats its last ``period`` bytes
            out += (out[back:] * (n // period + 1))[:n]
    if len(out) != size:
        raise BadFormat("LZF output is not the length the payload claims")
    return bytes(out)


def put_length(out: bytearray, n: int) -> None:
    if n < 1 << 6:
        out.append(n)
    elif n < 1 << 14:
        out += bytes((0x40 | n >> 8, n & 0xFF))
    elif n < 1 << 32:
        out.append(0x80)
        out += n.to_bytes(4, "big")
    else:
        out.append(0x81)
        out += n.to_bytes(8, "big")


class Reader:
    """A cursor over the payload's body; every read is bounds-checked."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.body):
            raise BadFormat("a length runs past the end of the payload")
        self.at += n
        return self.body[self.at - n : self.at]

    def byte(self) -> int:
        return self.take(1)[0]

    def length(self) -> tuple[int, bool]:
        """``rdbLoadLenByRef``: (the length, or the special encoding; is it special)."""
        b = self.byte()
        kind = b >> 6
        if kind == 0:
            return b & 0x3F, False
        if kind == 1:
            return (b & 0x3F) << 8 | self.byte(), False
        if kind == 3:
            return b & 0x3F, True
        if b == 0x80:
            return int.from_bytes(self.take(4), "big"), False
        if b == 0x81:
            return int.from_bytes(self.take(8), "big"), False
        raise BadFormat(f"unknown length encoding {b:#x}")

    def count(self) -> int:
        n, special = self.length()
        if special:
            raise BadFormat("a count is encoded as a string")
        return n

    def string(self) -> bytes:
        n, special = self.length()
        if not special:
            return self.take(n)
        if n in (0, 1, 2):
            width = 1 << n
            return str(int.from_bytes(self.take(width), "little", signed=True)).encode()
        if n == 3:
            packed, size = self.count(), self.count()
            return lzf_decompress(self.take(packed), size)
        raise BadFormat(f"unknown string encoding {n}")

    def text_double(self) -> float:
        """``rdbLoadDoubleValue``: the old ``ZSET`` score, a length byte then ASCII."""
        n = self.byte()
        if n in (253, 254, 255):
            return {253: math.nan, 254: math.inf, 255: -math.inf}[n]
        try:
            return float(self.take(n))
        except ValueError:
            raise BadFormat("a score is not a number") from None
