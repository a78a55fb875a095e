"""A stream's changes (:mod:`pion.keyspace.streamops`) in the log and in snapshots,
byte by byte.

They travel in the keyspace's op 31 (``keyspace_format.py``): ``blob key``, then a
change byte from 16 up (1..15 are the set family's), then the body below. The
keyspace's sixteen op codes were all taken when streams came, and a change byte is
how ops 30 and 31 already hold several records each; a build without streams meets
one as a named ``unknown SET_OF change`` error, never as a misread. Integers are
little-endian::

    id        u64 ms, u64 seq
    blob      [u32 n][n bytes]
    n x ...   u32 n, then n items

    16 CREATE          i64 deadline (>= 0)
    17 XADD            id, u8 trimmed (0|1), [id first kept], n x blob (fields)
    18 TRIM            id first kept
    19 XDEL            n x id
    20 SETID           id last, u64 entries added, id max deleted
    21 ENTRIES         n x (id, n x blob)
    22 GROUP_CREATE    blob group, id last delivered, i64 entries read (-1 unknown)
    23 GROUP_SETID     as GROUP_CREATE
    24 GROUP_DESTROY   blob group
    25 CONSUMER_NEW    blob group, blob consumer, i64 seen (Unix ms)
    26 CONSUMER_DEL    blob group, blob consumer
    27 DELIVER         blob group, blob consumer, i64 time, id last delivered,
                       i64 entries read, u8 noack, n x id
    28 ACK             blob group, n x id
    29 CLAIM           blob group, blob consumer, u8 has last (0|1), [id last],
                       n x (id, i64 delivery time, u64 deliveries), n x id (dropped)

Counts are checked against the bytes left before anything is built.
"""

from __future__ import annotations

import struct
from typing import Final

from pion.keyspace.streamops import (
    Ack,
    Claim,
    ConsumerCreate,
    ConsumerDelete,
    Deliver,
    GroupCreate,
    GroupDestroy,
    GroupSetId,
    StreamAdd,
    StreamCreate,
    StreamDelete,
    StreamEffect,
    StreamEntries,
    StreamId,
    StreamSetId,
    StreamTrim,
)
from pion.persistence.format import Buffer, FormatError

__all__ = ["FIRST_CHANGE", "decode_stream", "encode_stream"]

FIRST_CHANGE: Final = 16
_CHANGES: Final[dict[type, int]] = {
    StreamCreate: 16,
    StreamAdd: 17,
    StreamTrim: 18,
    StreamDelete: 19,
    StreamSetId: 20,
    StreamEntries: 21,
    GroupCreate: 22,
    GroupSetId: 23,
    GroupDestroy: 24,
    ConsumerCreate: 25,
    ConsumerDelete: 26,
    Deliver: 27,
    Ack: 28,
    Claim: 29,
}
_ID: Final = struct.Struct("<QQ")
_U8: Final = struct.Struct("<B")
_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")
_U64: Final = struct.Struct("<Q")


class _Out:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def id(self, i: StreamId) -> None:
        self.buf += _ID.pack(*i)

    def ids(self, ids: tuple[StreamId, ...]) -> None:
        self.buf += _U32.pack(len(ids))
        for i in ids:
            self.buf += _ID.pack(*i)

    def blob(self, data: bytes) -> None:
        self.buf += _U32.pack(len(data))
        self.buf += data

    def blobs(self, items: tuple[bytes, ...]) -> None:
        self.buf += _U32.pack(len(items))
        for item in items:
            self.blob(item)

    def pack(self, st: struct.Struct, value: int) -> None:
        self.buf += st.pack(value)


def encode_stream(e: StreamEffect) -> tuple[int, bytes]:
    """The change byte and body of one effect."""
    o = _Out()
    if isinstance(e, StreamCreate):
        o.pack(_I64, e.deadline)
    elif isinstance(e, StreamAdd):
        o.id(e.id)
        o.pack(_U8, e.trim is not None)
        if e.trim is not None:
            o.id(e.trim)
        o.blobs(e.fields)
    elif isinstance(e, StreamTrim):
        o.id(e.first)
    elif isinstance(e, StreamDelete):
        o.ids(e.ids)
    elif isinstance(e, StreamSetId):
        o.id(e.last_id)
        o.pack(_U64, e.entries_added)
        o.id(e.max_deleted)
    elif isinstance(e, StreamEntries):
        o.pack(_U32, len(e.entries))
        for i, fields in e.entries:
            o.id(i)
            o.blobs(fields)
    else:
        _encode_group(e, o)
    return _CHANGES[type(e)], bytes(o.buf)


def _encode_group(e: StreamEffect, o: _Out) -> None:
    if isinstance(e, (GroupCreate, GroupSetId)):
        o.blob(e.group)
        o.id(e.last_id)
        o.pack(_I64, e.entries_read)
    elif isinstance(e, GroupDestroy):
        o.blob(e.group)
    elif isinstance(e, ConsumerCreate):
        o.blob(e.group)
        o.blob(e.consumer)
        o.pack(_I64, e.seen)
    elif isinstance(e, ConsumerDelete):
        o.blob(e.group)
        o.blob(e.consumer)
    elif isinstance(e, Deliver):
        o.blob(e.group)
        o.blob(e.consumer)
        o.pack(_I64, e.time)
        o.id(e.last_id)
        o.pack(_I64, e.entries_read)
        o.pack(_U8, e.noack)
        o.ids(e.ids)
    elif isinstance(e, Ack):
        o.blob(e.group)
        o.ids(e.ids)
    elif isinstance(e, Claim):
        o.blob(e.group)
        o.blob(e.consumer)
        o.pack(_U8, e.last_id is not None)
        if e.last_id is not None:
            o.id(e.last_id)
        o.pack(_U32, len(e.claimed))
        for i, time, count in e.claimed:
            o.id(i)
            o.pack(_I64, time)
            o.pack(_U64, count)
        o.ids(e.dropped)


class _In:
    """Bounds-checked reads; every overrun is a FormatError."""

    __slots__ = ("buf", "pos")

    def __init__(self, payload: Buffer) -> None:
        self.buf = memoryview(payload).cast("B")
        self.pos = 0

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        if self.pos + st.size > len(self.buf):
            raise FormatError("a stream change is shorter than its fields")
        out: tuple[int, ...] = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return out

    def num(self, st: struct.Struct) -> int:
        return self.unpack(st)[0]

    def id(self) -> StreamId:
        ms, seq = self.unpack(_ID)
        return (ms, seq)

    def count(self, min_item: int) -> int:
        n = self.num(_U32)
        if n * min_item > len(self.buf) - self.pos:
            raise FormatError(f"count {n} does not fit the bytes left")
        return n

    def ids(self) -> tuple[StreamId, ...]:
        return tuple(self.id() for _ in range(self.count(_ID.size)))

    def blob(self) -> bytes:
        n = self.num(_U32)
        if n > len(self.buf) - self.pos:
            raise FormatError(f"a {n}-byte field runs past the payload")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def blobs(self) -> tuple[bytes, ...]:
        return tuple(self.blob() for _ in range(self.count(4)))

    def flag(self) -> bool:
        value = self.num(_U8)
        if value > 1:
            raise FormatError(f"a flag of {value}")
        return bool(value)


def decode_stream(change: int, payload: Buffer) -> StreamEffect:
    """The effect of change ``change`` (16..29) whose body is all of ``payload``."""
    r = _In(payload)
    e: StreamEffect
    if change == 16:
        deadline = r.num(_I64)
        if deadline < 0:
            raise FormatError(f"negative deadline {deadline}")
        e = StreamCreate(deadline)
    elif change == 17:
        i = r.id()
        trim = r.id() if r.flag() else None
        e = StreamAdd(i, r.blobs(), trim)
    elif change == 18:
        e = StreamTrim(r.id())
    elif change == 19:
        e = StreamDelete(r.ids())
    elif change == 20:
        last = r.id()
        added = r.num(_U64)
        e = StreamSetId(last, added, r.id())
    elif change == 21:
        e = StreamEntries(tuple((r.id(), r.blobs()) for _ in range(r.count(20))))
    else:
        e = _decode_group(change, r)
    if r.pos != len(r.buf):
        raise FormatError(f"{len(r.buf) - r.pos} trailing bytes in a stream change")
    return e


def _decode_group(change: int, r: _In) -> StreamEffect:
    if change in (22, 23):
        group = r.blob()
        last = r.id()
        read = r.num(_I64)
        return GroupCreate(group, last, read) if change == 22 else GroupSetId(group, last, read)
    if change == 24:
        return GroupDestroy(r.blob())
    if change in (25, 26):
        group = r.blob()
        consumer = r.blob()
        if change == 26:
            return ConsumerDelete(group, consumer)
        return ConsumerCreate(group, consumer, r.num(_I64))
    if change == 27:
        group, consumer = r.blob(), r.blob()
        time = r.num(_I64)
        last = r.id()
        read = r.num(_I64)
        noack = r.flag()
        return Deliver(group, consumer, time, r.ids(), last, read, noack)
    if change == 28:
        group = r.blob()
        return Ack(group, r.ids())
    if change == 29:
        group, consumer = r.blob(), r.blob()
        raised = r.id() if r.flag() else None
        n = r.count(_ID.size + 16)
        claimed = tuple((r.id(), r.num(_I64), r.num(_U64)) for _ in range(n))
        return Claim(group, consumer, claimed, r.ids(), raised)
    raise FormatError(f"unknown SET_OF change {change}")
