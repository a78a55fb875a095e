"""The pieces every keyspace record is built of (``keyspace_format.py`` specifies the
records): little-endian integers, a payload builder that keeps big values as views,
and a bounds-checked reader that turns every overrun into a ``FormatError``.
"""

from __future__ import annotations

import struct
from typing import Final

from pion.keyspace.mutations import Payload
from pion.persistence.format import Buffer, FormatError

__all__ = ["F64", "I64", "U8", "U32", "U64", "Parts", "Reader", "names"]

U8: Final = struct.Struct("<B")
U32: Final = struct.Struct("<I")
I64: Final = struct.Struct("<q")
U64: Final = struct.Struct("<Q")
F64: Final = struct.Struct("<d")
# Buffers at least this big travel as their own writev part instead of being joined.
BIG: Final = 64 << 10


class Parts:
    """A payload under construction: small pieces joined, big values kept as views."""

    __slots__ = ("out", "small")

    def __init__(self) -> None:
        self.out: list[Buffer] = []
        self.small = bytearray()

    def raw(self, data: bytes) -> None:
        self.small += data

    def blob(self, data: Payload) -> None:
        n = memoryview(data).nbytes
        self.small += U32.pack(n)
        self.tail(data, n)

    def tail(self, data: Payload, n: int) -> None:
        if n >= BIG:
            if self.small:
                self.out.append(bytes(self.small))
                self.small = bytearray()
            self.out.append(data)
        else:
            self.small += data

    def done(self) -> list[Buffer]:
        if self.small:
            self.out.append(bytes(self.small))
        return self.out


class Reader:
    """Bounds-checked reads over one payload; every overrun is a FormatError."""

    __slots__ = ("buf", "pos")

    def __init__(self, payload: Buffer) -> None:
        self.buf = memoryview(payload).cast("B")
        self.pos = 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def unpack(self, st: struct.Struct) -> int | float:
        if self.pos + st.size > len(self.buf):
            raise FormatError("payload is shorter than its fields")
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        out: int | float = value
        return out

    def u32(self) -> int:
        return int(self.unpack(U32))

    def blob(self) -> memoryview:
        n = self.u32()
        if n > self.left():
            raise FormatError(f"a {n}-byte field runs past the payload")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def key(self) -> bytes:
        return bytes(self.blob())

    def deadline(self) -> int:
        value = int(self.unpack(I64))
        if value < 0:
            raise FormatError(f"negative deadline {value}")
        return value

    def count(self, min_item: int) -> int:
        n = self.u32()
        if n < 1 or n * min_item > self.left():
            raise FormatError(f"count {n} does not fit the {self.left()} bytes left")
        return n

    def rest(self) -> memoryview:
        out = self.buf[self.pos :]
        self.pos = len(self.buf)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise FormatError(f"{len(self.buf) - self.pos} trailing payload bytes")


def names(r: Reader) -> tuple[bytes, ...]:
    return tuple(r.key() for _ in range(r.count(4)))
