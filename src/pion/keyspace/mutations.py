"""The mutations of the keyspace: the only ways its durable state changes.

Every write of :class:`~pion.keyspace.Keyspace` builds one of these records, hands it
to the journal and only then applies it, so replaying the journal through
:meth:`Keyspace.apply` rebuilds the same state. Records carry *results*, never
requests: the final value of an INCR, the final scores of a ZADD with GT/LT/INCR, the
absolute deadline of an EXPIRE, so replay never depends on the clock or on what was
stored before. RENAME, COPY and SETRANGE/APPEND are the exceptions: their records
name the keys and the bytes written, not the whole value (which may be a hash of
millions of fields, or a string of hundreds of MB grown a few bytes at a time); replay
applies them to the state the log rebuilt up to that point, which is the state they
were applied to.

Deadlines are absolute Unix times in milliseconds; 0 means "no expiry". Byte payloads
(values, fields, members) are whatever buffer the command had; a journal that keeps
one beyond ``append`` must copy it.

===================  ===========================================================
record               meaning
===================  ===========================================================
``SetString``        a string value replaces whatever the key held, with deadline
``SetStrings``       MSET: several string values, every deadline cleared
``DeleteKeys``       keys disappear: ``"del"`` (a client) or ``"expire"`` (their
                     deadline passed; logged so a restart never revives them)
``SetDeadline``      an existing key's deadline changes (0: PERSIST)
``SetFields``        HSET: fields of a hash set (the hash is created if absent)
``DeleteFields``     HDEL: fields removed (a hash left empty disappears)
``SetFieldTTLs``     HEXPIRE/HPERSIST: existing fields of a hash get these deadlines
                     (0: none); first, ``values`` are set keeping their deadlines
                     (HINCRBY of a field that has one)
``SetScores``        ZADD: members of a sorted set get these scores (created if
                     absent)
``DeleteMembers``    ZREM: members removed (a sorted set left empty disappears)
``Flush``            FLUSHDB: every key of the database disappears
``FlushAll``         FLUSHALL: every key of every database disappears
``MoveKey``          MOVE: a key moves with its value and deadline to database
                     ``db`` (which lacks it)
``CopyToDb``         COPY ... DB: a copy of a key's value and deadline replaces
                     whatever ``destination`` held in database ``db``
``SwapDbs``          SWAPDB: databases ``a`` and ``b`` exchange their contents
``SelectDb``         the log's records after it, until the next one, are of
                     database ``db`` (never applied to a keyspace: the persistence
                     layer writes it when a record's database differs from the
                     last one's, as Redis's AOF writes SELECT)
``RenameKey``        RENAME: a key moves to a new name with its value and deadline,
                     replacing whatever the new name held
``CopyKey``          COPY: a key's value and deadline are copied to a new name,
                     replacing whatever the new name held
``ReplaceScores``    ZUNIONSTORE and friends: a key becomes a sorted set of exactly
                     these members (whatever it held goes, its deadline too)
``SetRange``         SETRANGE/APPEND: bytes written at an offset of a string (a
                     missing key starts empty; zero bytes pad a gap; the deadline
                     stays)
``NewKey``           snapshots only: an empty hash, sorted set, list or set with a
                     deadline, filled by the SetFields/SetScores/ListPush/SetAdd
                     records after it
``ListPush``         LPUSH/RPUSH: elements pushed at the head (``left``, each in
                     turn, so the last ends first) or the tail (created if absent)
``ListPop``          LPOP/RPOP/LMPOP: ``count`` elements removed from one end (a list
                     left empty disappears)
``ListSet``          LSET: the element at an index (0-based from the head) replaced
``ListInsert``       LINSERT: an element inserted before the index it will hold
``ListTrim``         LTRIM: only the elements ``start..stop`` (inclusive, within the
                     list, ``start <= stop``) stay
``ListRemove``       LREM: as Redis's LREM, the first ``count`` (from the tail when
                     negative, all when 0) elements equal to ``element`` removed
``ListMove``         LMOVE/RPOPLPUSH: one element popped from ``source``'s end and
                     pushed at ``destination``'s (created if absent)
``ListReplace``      SORT ... STORE: a key becomes a list of exactly these elements
                     (whatever it held goes, its deadline too)
``SetAdd``           SADD: members added to a set (created if absent)
``SetRemove``        SREM/SPOP: members removed (a set left empty disappears)
``SetReplace``       SINTERSTORE and friends: a key becomes a set of exactly these
                     members (whatever it held goes, its deadline too)
``SetMove``          SMOVE: a member moves from one set to another (created if absent)
``StreamChange``     a stream's change, as its effect (``streamops.py``)
===================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from pion.keyspace.streamops import StreamEffect

__all__ = [
    "CopyKey",
    "CopyToDb",
    "DeleteFields",
    "DeleteKeys",
    "DeleteMembers",
    "DeleteReason",
    "Flush",
    "FlushAll",
    "KeyMutation",
    "ListInsert",
    "ListMove",
    "ListPop",
    "ListPush",
    "ListRemove",
    "ListReplace",
    "ListSet",
    "ListTrim",
    "MoveKey",
    "NewKey",
    "Payload",
    "RenameKey",
    "ReplaceScores",
    "SelectDb",
    "SetAdd",
    "SetDeadline",
    "SetFieldTTLs",
    "SetFields",
    "SetMove",
    "SetRange",
    "SetRemove",
    "SetReplace",
    "SetScores",
    "SetString",
    "SetStrings",
    "StreamChange",
    "SwapDbs",
]

# A buffer-protocol payload (what the request decoder and the snapshot reader hand us).
Payload: TypeAlias = bytes | bytearray | memoryview
DeleteReason = Literal["del", "expire"]


@dataclass(frozen=True, slots=True)
class SetString:
    key: bytes
    value: Payload
    deadline: int = 0


@dataclass(frozen=True, slots=True)
class SetStrings:
    items: tuple[tuple[bytes, Payload], ...]


@dataclass(frozen=True, slots=True)
class DeleteKeys:
    keys: tuple[bytes, ...]
    reason: DeleteReason = "del"


@dataclass(frozen=True, slots=True)
class SetDeadline:
    key: bytes
    deadline: int


@dataclass(frozen=True, slots=True)
class SetFields:
    key: bytes
    items: tuple[tuple[bytes, Payload], ...]


@dataclass(frozen=True, slots=True)
class DeleteFields:
    key: bytes
    fields: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SetFieldTTLs:
    key: bytes
    items: tuple[tuple[bytes, int], ...]
    values: tuple[tuple[bytes, Payload], ...] = ()


@dataclass(frozen=True, slots=True)
class SetScores:
    key: bytes
    items: tuple[tuple[float, bytes], ...]


@dataclass(frozen=True, slots=True)
class DeleteMembers:
    key: bytes
    members: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class FlushAll:
    pass


@dataclass(frozen=True, slots=True)
class MoveKey:
    key: bytes
    db: int


@dataclass(frozen=True, slots=True)
class CopyToDb:
    source: bytes
    destination: bytes
    db: int


@dataclass(frozen=True, slots=True)
class SwapDbs:
    a: int
    b: int


@dataclass(frozen=True, slots=True)
class SelectDb:
    db: int


@dataclass(frozen=True, slots=True)
class RenameKey:
    source: bytes
    destination: bytes


@dataclass(frozen=True, slots=True)
class CopyKey:
    source: bytes
    destination: bytes


@dataclass(frozen=True, slots=True)
class ReplaceScores:
    key: bytes
    items: tuple[tuple[float, bytes], ...]


@dataclass(frozen=True, slots=True)
class SetRange:
    key: bytes
    offset: int
    data: Payload


@dataclass(frozen=True, slots=True)
class NewKey:
    key: bytes
    kind: Literal["hash", "zset", "list", "set"]
    deadline: int = 0


@dataclass(frozen=True, slots=True)
class ListPush:
    key: bytes
    left: bool
    items: tuple[Payload, ...]


@dataclass(frozen=True, slots=True)
class ListReplace:
    key: bytes
    items: tuple[Payload, ...]


@dataclass(frozen=True, slots=True)
class ListPop:
    key: bytes
    left: bool
    count: int


@dataclass(frozen=True, slots=True)
class ListSet:
    key: bytes
    index: int
    value: Payload


@dataclass(frozen=True, slots=True)
class ListInsert:
    key: bytes
    index: int
    value: Payload


@dataclass(frozen=True, slots=True)
class ListTrim:
    key: bytes
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class ListRemove:
    key: bytes
    count: int
    element: bytes


@dataclass(frozen=True, slots=True)
class ListMove:
    source: bytes
    destination: bytes
    from_left: bool
    to_left: bool


@dataclass(frozen=True, slots=True)
class SetAdd:
    key: bytes
    members: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SetRemove:
    key: bytes
    members: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SetReplace:
    key: bytes
    members: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SetMove:
    source: bytes
    destination: bytes
    member: bytes


@dataclass(frozen=True, slots=True)
class StreamChange:
    key: bytes
    change: StreamEffect


KeyMutation: TypeAlias = (
    SetString
    | SetStrings
    | DeleteKeys
    | SetDeadline
    | SetFields
    | DeleteFields
    | SetFieldTTLs
    | SetScores
    | DeleteMembers
    | Flush
    | NewKey
    | RenameKey
    | CopyKey
    | SetRange
    | ReplaceScores
    | ListPush
    | ListPop
    | ListSet
    | ListInsert
    | ListTrim
    | ListRemove
    | ListMove
    | ListReplace
    | SetAdd
    | SetRemove
    | SetReplace
    | SetMove
    | StreamChange
    | FlushAll
    | MoveKey
    | CopyToDb
    | SwapDbs
    | SelectDb
)
