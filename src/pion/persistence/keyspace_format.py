"""The keyspace's records (op codes 16..31) in the log and in ``pion.keyspace.<w>``,
byte by byte.

Framing, headers and CRCs are ``format.py``'s. Every integer is little-endian; op codes
are frozen (never reused, never renumbered). Fields::

    blob      [u32 n][n bytes]          a key, field, member or value
    deadline  i64                       absolute Unix ms, 0 = none; never negative
    score     f64                       IEEE double, never NaN

Op codes and payloads::

    16 SET       blob key, deadline, then the value: every byte left in the payload
    17 MSET      u32 count >= 1, count x (blob key, blob value); deadlines cleared
    18 DEL       u8 reason (1 a client's DEL, 2 the deadline passed), u32 count >= 1,
                 count x blob key
    19 EXPIREAT  blob key, deadline (0: PERSIST)
    20 HSET      blob key, u32 count >= 1, count x (blob field, blob value)
    21 HDEL      blob key, u32 count >= 1, count x blob field
    22 ZADD      blob key, u32 count >= 1, count x (score, blob member)
    23 ZREM      blob key, u32 count >= 1, count x blob member
    24 FLUSH     (empty)
    25 KEY       blob key, u8 kind (1 hash, 2 sorted set, 3 list, 4 set), deadline;
                 snapshot only
    26 RENAME    blob source, blob destination: the source's value and deadline move
                 to the destination, replacing what it held
    27 COPY      blob source, blob destination: a copy of the source's value and
                 deadline replaces what the destination held
    28 SETRANGE  blob key, u64 offset, then the bytes written: every byte left in the
                 payload (SETRANGE and APPEND: a missing key starts empty, zero bytes
                 pad a gap, the deadline stays)
    29 ZSTORE    as ZADD, but the key is first emptied of whatever it held (and its
                 deadline): ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE
    30 LIST      blob key, u8 change, then by change:
                   1 LPUSH / 2 RPUSH   u32 count >= 1, count x blob element (the list
                                       is created if absent)
                   3 LPOP / 4 RPOP     u32 count >= 1 (elements removed from that end)
                   5 LSET              u64 index, blob element
                   6 LINSERT           u64 index (the new element's), blob element
                   7 LTRIM             u64 start, u64 stop (kept, inclusive)
                   8 LREM              i64 count, blob element (Redis's LREM)
                   9..12 LMOVE         blob destination: one element from the key's
                                       head (9, 10) or tail (11, 12) to the
                                       destination's head (9, 11) or tail (10, 12)
                   13 LSTORE           as RPUSH, but the key is first emptied of
                                       whatever it held (and its deadline): SORT
                                       ... STORE
    31 SET       blob key, u8 change, then by change:
                   1 SADD / 2 SREM     u32 count >= 1, count x blob member
                   3 SSTORE            as SADD, but the key is first emptied of
                                       whatever it held (and its deadline)
                   4 SMOVE             blob destination, blob member
                   5 HFIELDTTL         a hash's fields' deadlines (HEXPIRE and its
                                       family, HPERSIST, HINCRBY of a field that
                                       has one): u32 n >= 0, n x (blob field,
                                       deadline: 0 removes it); then u32 m >= 0,
                                       m x (blob field, blob value) written first,
                                       keeping their deadlines; fields the hash
                                       lacks are skipped
                   16..29 a stream's change (``stream_format.py``)

Change 5 of op 31 came with hash-field expiry (Redis 7.4): no op code was left, and a
hash's deadlines are one more keyed change; a build without it meets one as a named
``unknown SET_OF change`` error. Fields reclaimed past their deadline are logged as
an HDEL (op 21), as Redis 7.4 propagates them, so a restart never revives them; a
snapshot writes a hash's deadlines after its HSET records.

Ops 30 and 31 came with lists and sets; each op's first byte after the key names the
change, so the keyspace's last two op codes hold both families. Ops 26 to 29
came with RENAME, COPY, SETRANGE and APPEND, and the *STORE commands of
sorted sets (op 29 makes their replace-the-destination one record). 26 to 28 carry the key names and
the bytes written, not whole values, so appending to a large string costs the log what
was appended. As ``format.py`` rules, ops are only added, so the format stays version
1: a build that predates them meets one as a named ``unknown op code`` error, never as
a misread. Every other command added with them is logged with the older ops
(INCRBYFLOAT as a SET of its result, ZPOPMIN as a ZREM of what it popped, GETEX as an
EXPIREAT or a DEL).

Each record is one command's whole effect (an MSET, a DEL of many keys, an HSET of
many fields), so a command is atomic across a crash. A snapshot holds, per live key,
one SET (a string) or one KEY followed by HSET/ZADD/RPUSH/SADD records of at most ~16 MB each (a
hash, a sorted set); its END record counts the SET and KEY records (the keys).

Counts are checked against the bytes left before anything is allocated (an item is at
least 4 bytes), so a damaged count can never make a reader build a huge list.
"""

from __future__ import annotations

import math
import struct
from typing import Final

from pion.keyspace import (
    CopyKey,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListReplace,
    ListSet,
    ListTrim,
    NewKey,
    RenameKey,
    ReplaceScores,
    SetAdd,
    SetDeadline,
    SetFields,
    SetFieldTTLs,
    SetMove,
    SetRange,
    SetRemove,
    SetReplace,
    SetScores,
    SetString,
    SetStrings,
    StreamChange,
)
from pion.keyspace.mutations import Payload
from pion.persistence.format import Buffer, FormatError
from pion.persistence.stream_format import FIRST_CHANGE, decode_stream, encode_stream

__all__ = ["OPS", "UNIT_OPS", "decode", "describe", "encode", "op_of"]

OP_SET: Final = 16
OP_MSET: Final = 17
OP_DEL: Final = 18
OP_EXPIREAT: Final = 19
OP_HSET: Final = 20
OP_HDEL: Final = 21
OP_ZADD: Final = 22
OP_ZREM: Final = 23
OP_FLUSH: Final = 24
OP_KEY: Final = 25
OP_RENAME: Final = 26
OP_COPY: Final = 27
OP_SETRANGE: Final = 28
OP_ZSTORE: Final = 29
OP_LIST: Final = 30
OP_SET_OF: Final = 31

OPS: Final = {
    OP_SET: "SET",
    OP_MSET: "MSET",
    OP_DEL: "DEL",
    OP_EXPIREAT: "EXPIREAT",
    OP_HSET: "HSET",
    OP_HDEL: "HDEL",
    OP_ZADD: "ZADD",
    OP_ZREM: "ZREM",
    OP_FLUSH: "FLUSH",
    OP_KEY: "KEY",
    OP_RENAME: "RENAME",
    OP_COPY: "COPY",
    OP_SETRANGE: "SETRANGE",
    OP_ZSTORE: "ZSTORE",
    OP_LIST: "LIST",
    OP_SET_OF: "SET_OF",
}
UNIT_OPS: Final = frozenset({OP_SET, OP_KEY})

_U8: Final = struct.Struct("<B")
_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")
_U64: Final = struct.Struct("<Q")
# Redis's proto-max-bulk-len: no string, so no offset, reaches past it.
_MAX_OFFSET: Final = 512 * 1024 * 1024
_F64: Final = struct.Struct("<d")
_REASONS: Final = {"del": 1, "expire": 2}
_REASON_NAMES: Final = {1: "del", 2: "expire"}
_KINDS: Final = {"hash": 1, "zset": 2, "list": 3, "set": 4}
_KIND_NAMES: Final = {1: "hash", 2: "zset", 3: "list", 4: "set"}
# Buffers at least this big travel as their own writev part instead of being joined.
_BIG: Final = 64 << 10


class _Parts:
    """A payload under construction: small pieces joined, big values kept as views."""

    __slots__ = ("out", "small")

    def __init__(self) -> None:
        self.out: list[Buffer] = []
        self.small = bytearray()

    def raw(self, data: bytes) -> None:
        self.small += data

    def blob(self, data: Payload) -> None:
        n = memoryview(data).nbytes
        self.small += _U32.pack(n)
        self.tail(data, n)

    def tail(self, data: Payload, n: int) -> None:
        if n >= _BIG:
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


def op_of(m: KeyMutation) -> int:
    return _OP_BY_TYPE[type(m)]


def encode(m: KeyMutation) -> tuple[int, list[Buffer]]:
    """A mutation as (op code, payload buffers); values are passed through uncopied."""
    if type(m) is SetString and isinstance(m.value, bytes):
        # The hot path (every SET): one small header, the value as it came.
        head = _U32.pack(len(m.key)) + m.key + _I64.pack(m.deadline)
        return OP_SET, ([head + m.value] if len(m.value) < _BIG else [head, m.value])
    p = _Parts()
    if isinstance(m, SetString):
        p.blob(m.key)
        p.raw(_I64.pack(m.deadline))
        p.tail(m.value, memoryview(m.value).nbytes)
    elif isinstance(m, SetStrings):
        p.raw(_U32.pack(len(m.items)))
        for key, value in m.items:
            p.blob(key)
            p.blob(value)
    elif isinstance(m, DeleteKeys):
        p.raw(_U8.pack(_REASONS[m.reason]) + _U32.pack(len(m.keys)))
        for key in m.keys:
            p.blob(key)
    elif isinstance(m, SetDeadline):
        p.blob(m.key)
        p.raw(_I64.pack(m.deadline))
    elif isinstance(m, SetFields):
        p.blob(m.key)
        p.raw(_U32.pack(len(m.items)))
        for field, value in m.items:
            p.blob(field)
            p.blob(value)
    elif isinstance(m, (DeleteFields, DeleteMembers)):
        names = m.fields if isinstance(m, DeleteFields) else m.members
        p.blob(m.key)
        p.raw(_U32.pack(len(names)))
        for name in names:
            p.blob(name)
    elif isinstance(m, (SetScores, ReplaceScores)):
        p.blob(m.key)
        p.raw(_U32.pack(len(m.items)))
        for score, member in m.items:
            p.raw(_F64.pack(score))
            p.blob(member)
    elif isinstance(m, NewKey):
        p.blob(m.key)
        p.raw(_U8.pack(_KINDS[m.kind]) + _I64.pack(m.deadline))
    elif isinstance(m, (RenameKey, CopyKey)):
        p.blob(m.source)
        p.blob(m.destination)
    elif isinstance(m, SetRange):
        p.blob(m.key)
        p.raw(_U64.pack(m.offset))
        p.tail(m.data, memoryview(m.data).nbytes)
    else:
        encode_collection(m, p)
    return op_of(m), p.done()


class _Reader:
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
        return int(self.unpack(_U32))

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
        value = int(self.unpack(_I64))
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


def _names(r: _Reader) -> tuple[bytes, ...]:
    return tuple(r.key() for _ in range(r.count(4)))


def decode(op: int, payload: Buffer) -> KeyMutation:
    """The mutation a record holds. Values are views of ``payload`` (no copy); keys,
    fields and members are bytes."""
    r = _Reader(payload)
    m: KeyMutation
    if op == OP_SET:
        key = r.key()
        deadline = r.deadline()
        m = SetString(key, r.rest(), deadline)
    elif op == OP_MSET:
        m = SetStrings(tuple((r.key(), r.blob()) for _ in range(r.count(8))))
    elif op == OP_DEL:
        reason = int(r.unpack(_U8))
        if reason not in _REASON_NAMES:
            raise FormatError(f"unknown DEL reason {reason}")
        m = DeleteKeys(_names(r), "del" if reason == 1 else "expire")
    elif op == OP_EXPIREAT:
        key = r.key()
        m = SetDeadline(key, r.deadline())
    elif op == OP_HSET:
        key = r.key()
        m = SetFields(key, tuple((r.key(), r.blob()) for _ in range(r.count(8))))
    elif op == OP_HDEL:
        key = r.key()
        m = DeleteFields(key, _names(r))
    elif op == OP_ZADD:
        key = r.key()
        m = SetScores(key, tuple(_score_member(r) for _ in range(r.count(12))))
    elif op == OP_ZSTORE:
        key = r.key()
        m = ReplaceScores(key, tuple(_score_member(r) for _ in range(r.count(12))))
    elif op == OP_ZREM:
        key = r.key()
        m = DeleteMembers(key, _names(r))
    elif op == OP_FLUSH:
        m = Flush()
    elif op == OP_KEY:
        key = r.key()
        kind = int(r.unpack(_U8))
        if kind not in _KIND_NAMES:
            raise FormatError(f"unknown key kind {kind}")
        m = NewKey(key, _KIND_NAMES[kind], r.deadline())  # type: ignore[arg-type]
    elif op in (OP_RENAME, OP_COPY):
        source = r.key()
        destination = r.key()
        m = RenameKey(source, destination) if op == OP_RENAME else CopyKey(source, destination)
    elif op in (OP_LIST, OP_SET_OF):
        m = decode_collection(op, r)
    elif op == OP_SETRANGE:
        key = r.key()
        offset = int(r.unpack(_U64))
        if offset > _MAX_OFFSET:
            raise FormatError(f"SETRANGE offset {offset} is past a string's limit")
        m = SetRange(key, offset, r.rest())
    else:
        raise FormatError(f"unknown op code {op}")
    r.done()
    return m


def _score_member(r: _Reader) -> tuple[float, bytes]:
    score = float(r.unpack(_F64))
    if math.isnan(score):
        raise FormatError("a NaN score")
    return score, r.key()


def describe(op: int, payload: Buffer) -> str:
    m = decode(op, payload)
    if isinstance(m, DeleteKeys):
        return f"DEL({m.reason})"
    if isinstance(m, StreamChange):
        return "STREAM"
    if isinstance(m, SetFieldTTLs):
        return "HFIELDTTL"
    return OPS[op]


_OP_BY_TYPE: Final[dict[type, int]] = {
    SetString: OP_SET,
    SetStrings: OP_MSET,
    DeleteKeys: OP_DEL,
    SetDeadline: OP_EXPIREAT,
    SetFields: OP_HSET,
    DeleteFields: OP_HDEL,
    SetScores: OP_ZADD,
    DeleteMembers: OP_ZREM,
    Flush: OP_FLUSH,
    NewKey: OP_KEY,
    RenameKey: OP_RENAME,
    CopyKey: OP_COPY,
    SetRange: OP_SETRANGE,
    ReplaceScores: OP_ZSTORE,
    ListPush: OP_LIST,
    ListPop: OP_LIST,
    ListSet: OP_LIST,
    ListInsert: OP_LIST,
    ListTrim: OP_LIST,
    ListRemove: OP_LIST,
    ListMove: OP_LIST,
    ListReplace: OP_LIST,
    SetAdd: OP_SET_OF,
    SetRemove: OP_SET_OF,
    SetReplace: OP_SET_OF,
    SetMove: OP_SET_OF,
    StreamChange: OP_SET_OF,
    SetFieldTTLs: OP_SET_OF,
}
_SET_CHANGES: Final = {SetAdd: 1, SetRemove: 2, SetReplace: 3}
_HFIELDTTL: Final = 5


def encode_collection(m: KeyMutation, p: _Parts) -> None:
    """Ops 30 (LIST) and 31 (SET_OF): the key, the change, its fields."""
    if isinstance(m, ListMove):
        p.blob(m.source)
        p.raw(_U8.pack(9 + (0 if m.from_left else 2) + (0 if m.to_left else 1)))
        p.blob(m.destination)
    elif isinstance(m, SetMove):
        p.blob(m.source)
        p.raw(_U8.pack(4))
        p.blob(m.destination)
        p.blob(m.member)
    elif isinstance(m, (ListPush, ListReplace, SetAdd, SetRemove, SetReplace)):
        p.blob(m.key)
        names: tuple[Payload, ...]
        if isinstance(m, ListPush):
            p.raw(_U8.pack(1 if m.left else 2))
            names = m.items
        elif isinstance(m, ListReplace):
            p.raw(_U8.pack(13))
            names = m.items
        else:
            p.raw(_U8.pack(_SET_CHANGES[type(m)]))
            names = m.members
        p.raw(_U32.pack(len(names)))
        for name in names:
            p.blob(name)
    elif isinstance(m, ListPop):
        p.blob(m.key)
        p.raw(_U8.pack(3 if m.left else 4) + _U32.pack(m.count))
    elif isinstance(m, (ListSet, ListInsert)):
        p.blob(m.key)
        p.raw(_U8.pack(5 if isinstance(m, ListSet) else 6) + _U64.pack(m.index))
        p.blob(m.value)
    elif isinstance(m, ListTrim):
        p.blob(m.key)
        p.raw(_U8.pack(7) + _U64.pack(m.start) + _U64.pack(m.stop))
    elif isinstance(m, ListRemove):
        p.blob(m.key)
        p.raw(_U8.pack(8) + _I64.pack(m.count))
        p.blob(m.element)
    elif isinstance(m, SetFieldTTLs):
        p.blob(m.key)
        p.raw(_U8.pack(_HFIELDTTL) + _U32.pack(len(m.items)))
        for field, deadline in m.items:
            p.blob(field)
            p.raw(_I64.pack(deadline))
        p.raw(_U32.pack(len(m.values)))
        for field, value in m.values:
            p.blob(field)
            p.blob(value)
    elif isinstance(m, StreamChange):
        change, body = encode_stream(m.change)
        p.blob(m.key)
        p.raw(_U8.pack(change))
        p.tail(body, len(body))


def _field_ttls(key: bytes, r: _Reader) -> SetFieldTTLs:
    """Change 5 of op 31 (its counts may be 0, each checked against the bytes left)."""
    n = r.u32()
    if n * 12 > r.left():
        raise FormatError(f"count {n} does not fit the {r.left()} bytes left")
    items = tuple((r.key(), r.deadline()) for _ in range(n))
    m = r.u32()
    if m * 8 > r.left():
        raise FormatError(f"count {m} does not fit the {r.left()} bytes left")
    return SetFieldTTLs(key, items, tuple((r.key(), r.blob()) for _ in range(m)))


def decode_collection(op: int, r: _Reader) -> KeyMutation:
    """The record of op 30 or 31 (see the module docstring)."""
    key = r.key()
    change = int(r.unpack(_U8))
    if op == OP_SET_OF:
        if change >= FIRST_CHANGE:
            return StreamChange(key, decode_stream(change, r.rest()))
        if change == 1:
            return SetAdd(key, _names(r))
        if change == 2:
            return SetRemove(key, _names(r))
        if change == 3:
            return SetReplace(key, _names(r))
        if change == 4:
            destination = r.key()
            return SetMove(key, destination, r.key())
        if change == _HFIELDTTL:
            return _field_ttls(key, r)
        raise FormatError(f"unknown SET_OF change {change}")
    if change in (1, 2):
        return ListPush(key, change == 1, tuple(r.blob() for _ in range(r.count(4))))
    if change in (3, 4):
        return ListPop(key, change == 3, r.u32())
    if change in (5, 6):
        index = int(r.unpack(_U64))
        value = r.blob()
        return ListSet(key, index, value) if change == 5 else ListInsert(key, index, value)
    if change == 7:
        start = int(r.unpack(_U64))
        return ListTrim(key, start, int(r.unpack(_U64)))
    if change == 8:
        count = int(r.unpack(_I64))
        return ListRemove(key, count, r.key())
    if 9 <= change <= 12:
        k = change - 9
        return ListMove(key, r.key(), k < 2, k % 2 == 0)
    if change == 13:
        return ListReplace(key, tuple(r.blob() for _ in range(r.count(4))))
    raise FormatError(f"unknown LIST change {change}")
