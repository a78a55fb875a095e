"""BITFIELD and BITFIELD_RO: integers of 1 to 64 bits (``i1``-``i64``, ``u1``-``u63``)
at any bit offset of a string, with Redis 7.0's replies, errors and overflow rules
(``bitops.c``'s ``bitfieldGeneric``).

Every operation is parsed (and every error found) before any runs, as in Redis. A
command with a SET or INCRBY first grows the string to its farthest written bit (a
missing key is created, even when every write fails under OVERFLOW FAIL), then runs
its operations in order on a copy of the bytes they touch, and writes that span back
once (:meth:`Keyspace.set_range`: the log holds the span, not the string). It then
announces ``setbit``, as Redis does when a SET or INCRBY was not refused by OVERFLOW
FAIL; when every one was, only the growth is written and nothing is announced (WATCH
still sees a growth there, where Redis signals nothing).

The overflow checks are Redis's ``checkSignedBitfieldOverflow`` and
``checkUnsignedBitfieldOverflow`` computed in 64-bit two's complement as C does, so the
corner cases (a SET of a value far outside the type) saturate the way Redis does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pion.commands.args import parse_int
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.bits import MAX_BIT_OFFSET
from pion.keyspace.numbers import parse_int64
from pion.notify import STRING, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]

_TYPE_ERR = (
    "Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
)
_OFFSET_ERR = "bit offset is not an integer or out of range"
_WRAP, _SAT, _FAIL = "WRAP", "SAT", "FAIL"
_U64 = 1 << 64


def _i64(x: int) -> int:
    """``x`` as C's int64_t after unsigned wrap-around."""
    return ((x + (1 << 63)) % _U64) - (1 << 63)


@dataclass(frozen=True, slots=True)
class _Op:
    name: str  # GET, SET or INCRBY
    signed: bool
    bits: int
    offset: int
    value: int
    overflow: str


def _type(raw: bytes) -> tuple[bool, int]:
    if raw[:1] not in (b"i", b"u"):
        raise PionError(_TYPE_ERR)
    signed = raw[:1] == b"i"
    bits = parse_int64(raw[1:])
    if bits is None or bits < 1 or bits > (64 if signed else 63):
        raise PionError(_TYPE_ERR)
    return signed, bits


def _offset(raw: bytes, bits: int) -> int:
    """A bit offset, ``#N`` meaning N times the type's width (wrapping as C's int64)."""
    times = raw[:1] == b"#"
    n = parse_int64(raw[1:] if times else raw)
    if n is None:
        raise PionError(_OFFSET_ERR)
    if times:
        n = _i64(n * bits)
    if n < 0 or n > MAX_BIT_OFFSET:
        raise PionError(_OFFSET_ERR)
    return n


def _parse(args: Sequence[bytes]) -> list[_Op]:
    ops: list[_Op] = []
    overflow = _WRAP
    j = 1
    while j < len(args):
        left = len(args) - j - 1
        sub = args[j].upper()
        if sub == b"OVERFLOW" and left >= 1:
            kind = args[j + 1].upper().decode("latin-1")
            if kind not in (_WRAP, _SAT, _FAIL):
                raise PionError("Invalid OVERFLOW type specified")
            overflow = kind
            j += 2
            continue
        if not ((sub == b"GET" and left >= 2) or (sub in (b"SET", b"INCRBY") and left >= 3)):
            raise PionError("syntax error")
        signed, bits = _type(args[j + 1])
        offset = _offset(args[j + 2], bits)
        value = 0
        if sub != b"GET":
            value = parse_int(args[j + 3])
        ops.append(_Op(sub.decode(), signed, bits, offset, value, overflow))
        j += 3 if sub == b"GET" else 4
    return ops


def _signed_overflow(value: int, incr: int, bits: int, how: str) -> tuple[int, int]:
    """``checkSignedBitfieldOverflow``: (direction 1/-1/0, the value to store)."""
    top = (1 << 63) - 1 if bits == 64 else (1 << (bits - 1)) - 1
    low = -top - 1
    maxincr, minincr = _i64(top - value), _i64(low - value)
    if value > top or (bits != 64 and incr > maxincr) or (value >= 0 and 0 < incr > maxincr):
        return 1, top if how == _SAT else _signed_wrap(value + incr, bits)
    if value < low or (bits != 64 and incr < minincr) or (value < 0 and 0 > incr < minincr):
        return -1, low if how == _SAT else _signed_wrap(value + incr, bits)
    return 0, value + incr


def _signed_wrap(total: int, bits: int) -> int:
    c = total % (1 << bits)
    return c - (1 << bits) if c >> (bits - 1) else c


def _unsigned_overflow(value: int, incr: int, bits: int, how: str) -> tuple[int, int]:
    """``checkUnsignedBitfieldOverflow`` (``value`` already an unsigned 64-bit)."""
    top = (1 << bits) - 1
    wrapped = (value + incr) & top
    if value > top or (incr > 0 and incr > _i64(top - value)):
        return 1, top if how == _SAT else wrapped
    if incr < 0 and incr < _i64(-value):
        return -1, 0 if how == _SAT else wrapped
    return 0, value + incr


class _Bytes:
    """The string as the operations see it: ``span`` (a copy of bytes lo..hi that the
    writes change) over the stored value, zeros past its end."""

    def __init__(self, value: bytes, lo: int, hi: int) -> None:
        self.value, self.lo = value, lo
        self.span = bytearray(value[lo:hi].ljust(hi - lo, b"\0"))

    def _byte(self, i: int) -> int:
        if self.lo <= i < self.lo + len(self.span):
            return self.span[i - self.lo]
        return self.value[i] if i < len(self.value) else 0

    def get(self, offset: int, bits: int) -> int:
        first, last = offset >> 3, (offset + bits - 1) >> 3
        word = int.from_bytes(bytes(self._byte(i) for i in range(first, last + 1)), "big")
        shift = (last + 1) * 8 - (offset + bits)
        return (word >> shift) & ((1 << bits) - 1)

    def put(self, offset: int, bits: int, value: int) -> None:
        first, last = offset >> 3, (offset + bits - 1) >> 3
        at = first - self.lo
        word = int.from_bytes(self.span[at : at + last - first + 1], "big")
        shift = (last + 1) * 8 - (offset + bits)
        mask = ((1 << bits) - 1) << shift
        word = (word & ~mask) | ((value << shift) & mask)
        self.span[at : at + last - first + 1] = word.to_bytes(last - first + 1, "big")


def _run(op: _Op, data: _Bytes) -> int | None:
    """One SET or INCRBY: its reply (None when OVERFLOW FAIL refused it)."""
    old = data.get(op.offset, op.bits)
    if op.signed:
        if old >> (op.bits - 1):
            old -= 1 << op.bits
        start, incr = (old, op.value) if op.name == "INCRBY" else (op.value, 0)
        over, new = _signed_overflow(start, incr, op.bits, op.overflow)
    else:
        start, incr = (old, op.value) if op.name == "INCRBY" else (op.value % _U64, 0)
        over, new = _unsigned_overflow(start, incr, op.bits, op.overflow)
    if over and op.overflow == _FAIL:
        return None
    data.put(op.offset, op.bits, new)
    return new if op.name == "INCRBY" else old


def _bitfield(ctx: Context, args: Sequence[bytes], readonly: bool = False) -> Reply:
    ops = _parse(args)
    ks = ctx.state.keyspace
    key = args[0]
    writes = [op for op in ops if op.name != "GET"]
    if writes and readonly:
        raise PionError("BITFIELD_RO only supports the GET subcommand")
    value = ks.string(key, read=not writes) or b""
    lo = min((op.offset >> 3 for op in writes), default=0)
    hi = max(((op.offset + op.bits - 1) >> 3) + 1 for op in writes) if writes else 0
    data = _Bytes(value, lo, hi)
    out: list[Reply] = []
    for op in ops:
        if op.name == "GET":
            got = data.get(op.offset, op.bits)
            if op.signed and got >> (op.bits - 1):
                got -= 1 << op.bits
            out.append(got)
        else:
            out.append(_run(op, data))
    if any(reply is not None for op, reply in zip(ops, out, strict=True) if op.name != "GET"):
        ks.set_range(key, lo, bytes(data.span))
        notify(ctx.state, STRING, "setbit", key)
    elif writes and (hi > len(value) or not ks.exists(key)):
        # Every write failed (OVERFLOW FAIL): Redis still grew the string to the
        # farthest written byte (creating the key), and announces nothing.
        start = len(value) if ks.exists(key) else 0
        ks.set_range(key, start, bytes(max(hi - start, 0)))
    return out


def _bitfield_ro(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _bitfield(ctx, args, readonly=True)


COMMANDS: list[Command] = [
    Command("BITFIELD", _bitfield, -2, frozenset({"write"}), "Integers at bit offsets"),
    Command("BITFIELD_RO", _bitfield_ro, -2, frozenset({"readonly", "fast"}), "BITFIELD's GETs"),
]
