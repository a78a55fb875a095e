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
    24 FLUSH     (empty): FLUSHDB, every key of the current database; or u8 1:
                 FLUSHALL, every key of every database
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
                   6 SELECT            (an empty key) u32 db: the records after
                                       it are of database db (``keyspace_durable``
                                       writes one when a record's database differs
                                       from the last one's; a file starts in 0)
                   7 MOVE              u32 db: the key moves with its value and
                                       deadline to database db
                   8 SWAPDB            (an empty key) u32 a, u32 b: the two
                                       databases exchange their contents
                   9 COPYDB            u32 db, blob destination: a copy of the key's
                                       value and deadline replaces what destination
                                       held in database db
                   16..29 a stream's change (``stream_format.py``)

Changes 6 to 9 of op 31 and FLUSH's byte came with the numbered databases (SELECT):
the records name no database, a SELECT record says which one the records after it are
of, as Redis's AOF does, so a log or snapshot without one (every file written before)
is all database 0. A build without them meets one as ``unknown SET_OF change 6``.

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
from typing import Final

from pion.keyspace import (
    CopyKey,
    CopyToDb,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    FlushAll,
    KeyMutation,
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListReplace,
    ListSet,
    ListTrim,
    MoveKey,
    NewKey,
    RenameKey,
    ReplaceScores,
    SelectDb,
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
    SwapDbs,
)
from pion.persistence.collection_format import decode_collection, encode_collection
from pion.persistence.format import Buffer, FormatError
from pion.persistence.keyspace_fields import BIG, F64, I64, U8, U32, U64, Parts, Reader, names

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

# Redis's proto-max-bulk-len: no string, so no offset, reaches past it.
_MAX_OFFSET: Final = 512 * 1024 * 1024
_REASONS: Final = {"del": 1, "expire": 2}
_REASON_NAMES: Final = {1: "del", 2: "expire"}
_KINDS: Final = {"hash": 1, "zset": 2, "list": 3, "set": 4}
_KIND_NAMES: Final = {1: "hash", 2: "zset", 3: "list", 4: "set"}


def op_of(m: KeyMutation) -> int:
    return _OP_BY_TYPE[type(m)]


def encode(m: KeyMutation) -> tuple[int, list[Buffer]]:
    """A mutation as (op code, payload buffers); values are passed through uncopied."""
    if type(m) is SetString and isinstance(m.value, bytes):
        # The hot path (every SET): one small header, the value as it came.
        head = U32.pack(len(m.key)) + m.key + I64.pack(m.deadline)
        return OP_SET, ([head + m.value] if len(m.value) < BIG else [head, m.value])
    p = Parts()
    if isinstance(m, SetString):
        p.blob(m.key)
        p.raw(I64.pack(m.deadline))
        p.tail(m.value, memoryview(m.value).nbytes)
    elif isinstance(m, SetStrings):
        p.raw(U32.pack(len(m.items)))
        for key, value in m.items:
            p.blob(key)
            p.blob(value)
    elif isinstance(m, DeleteKeys):
        p.raw(U8.pack(_REASONS[m.reason]) + U32.pack(len(m.keys)))
        for key in m.keys:
            p.blob(key)
    elif isinstance(m, SetDeadline):
        p.blob(m.key)
        p.raw(I64.pack(m.deadline))
    elif isinstance(m, SetFields):
        p.blob(m.key)
        p.raw(U32.pack(len(m.items)))
        for field, value in m.items:
            p.blob(field)
            p.blob(value)
    elif isinstance(m, (DeleteFields, DeleteMembers)):
        names = m.fields if isinstance(m, DeleteFields) else m.members
        p.blob(m.key)
        p.raw(U32.pack(len(names)))
        for name in names:
            p.blob(name)
    elif isinstance(m, (SetScores, ReplaceScores)):
        p.blob(m.key)
        p.raw(U32.pack(len(m.items)))
        for score, member in m.items:
            p.raw(F64.pack(score))
            p.blob(member)
    elif isinstance(m, NewKey):
        p.blob(m.key)
        p.raw(U8.pack(_KINDS[m.kind]) + I64.pack(m.deadline))
    elif isinstance(m, (RenameKey, CopyKey)):
        p.blob(m.source)
        p.blob(m.destination)
    elif isinstance(m, FlushAll):
        p.raw(U8.pack(1))
    elif isinstance(m, SetRange):
        p.blob(m.key)
        p.raw(U64.pack(m.offset))
        p.tail(m.data, memoryview(m.data).nbytes)
    else:
        encode_collection(m, p)
    return op_of(m), p.done()


def decode(op: int, payload: Buffer) -> KeyMutation:
    """The mutation a record holds. Values are views of ``payload`` (no copy); keys,
    fields and members are bytes."""
    r = Reader(payload)
    m: KeyMutation
    if op == OP_SET:
        key = r.key()
        deadline = r.deadline()
        m = SetString(key, r.rest(), deadline)
    elif op == OP_MSET:
        m = SetStrings(tuple((r.key(), r.blob()) for _ in range(r.count(8))))
    elif op == OP_DEL:
        reason = int(r.unpack(U8))
        if reason not in _REASON_NAMES:
            raise FormatError(f"unknown DEL reason {reason}")
        m = DeleteKeys(names(r), "del" if reason == 1 else "expire")
    elif op == OP_EXPIREAT:
        key = r.key()
        m = SetDeadline(key, r.deadline())
    elif op == OP_HSET:
        key = r.key()
        m = SetFields(key, tuple((r.key(), r.blob()) for _ in range(r.count(8))))
    elif op == OP_HDEL:
        key = r.key()
        m = DeleteFields(key, names(r))
    elif op == OP_ZADD:
        key = r.key()
        m = SetScores(key, tuple(_score_member(r) for _ in range(r.count(12))))
    elif op == OP_ZSTORE:
        key = r.key()
        m = ReplaceScores(key, tuple(_score_member(r) for _ in range(r.count(12))))
    elif op == OP_ZREM:
        key = r.key()
        m = DeleteMembers(key, names(r))
    elif op == OP_FLUSH:
        # FLUSHALL's one byte 1 (an empty payload: FLUSHDB; anything else trails).
        m = Flush()
        if r.left() == 1 and r.buf[r.pos] == 1:
            r.pos += 1
            m = FlushAll()
    elif op == OP_KEY:
        key = r.key()
        kind = int(r.unpack(U8))
        if kind not in _KIND_NAMES:
            raise FormatError(f"unknown key kind {kind}")
        m = NewKey(key, _KIND_NAMES[kind], r.deadline())  # type: ignore[arg-type]
    elif op in (OP_RENAME, OP_COPY):
        source = r.key()
        destination = r.key()
        m = RenameKey(source, destination) if op == OP_RENAME else CopyKey(source, destination)
    elif op in (OP_LIST, OP_SET_OF):
        m = decode_collection(op == OP_SET_OF, r)
    elif op == OP_SETRANGE:
        key = r.key()
        offset = int(r.unpack(U64))
        if offset > _MAX_OFFSET:
            raise FormatError(f"SETRANGE offset {offset} is past a string's limit")
        m = SetRange(key, offset, r.rest())
    else:
        raise FormatError(f"unknown op code {op}")
    r.done()
    return m


def _score_member(r: Reader) -> tuple[float, bytes]:
    score = float(r.unpack(F64))
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
    if isinstance(m, (SelectDb, MoveKey, SwapDbs, CopyToDb, FlushAll)):
        return {SelectDb: "SELECT", MoveKey: "MOVE", SwapDbs: "SWAPDB", CopyToDb: "COPYDB"}.get(
            type(m), "FLUSHALL"
        )
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
    FlushAll: OP_FLUSH,
    SelectDb: OP_SET_OF,
    MoveKey: OP_SET_OF,
    SwapDbs: OP_SET_OF,
    CopyToDb: OP_SET_OF,
}
