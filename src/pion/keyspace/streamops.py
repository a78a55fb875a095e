"""The changes of a stream, as the records that carry them (``StreamChange``).

Each is an *effect*, never a request: an XADD with ``*`` carries the id it got, a
trim the first id it kept, an XREADGROUP the ids it delivered, the time it delivered
them and the group's new last id and read counter, an XCLAIM the owner, time and count
each claimed entry ends with. Replaying them rebuilds the same stream whatever the
clock says. Ids are ``(ms, seq)`` pairs of unsigned 64-bit integers.

=====================  ==========================================================
effect                 meaning
=====================  ==========================================================
``StreamCreate``       an empty stream with a deadline (XGROUP CREATE MKSTREAM,
                       snapshots)
``StreamAdd``          XADD: one entry appended (the stream is created if absent),
                       then, when ``trim`` is set, the entries before it removed
``StreamTrim``         XTRIM: the entries before ``first`` removed
``StreamDelete``       XDEL: these entries removed
``StreamSetId``        XSETID, snapshots: last id, entries added, max deleted id
``StreamEntries``      snapshots only: entries appended as they are, counters kept
``GroupCreate``        XGROUP CREATE (replaces nothing: the name is new)
``GroupSetId``         XGROUP SETID
``GroupDestroy``       XGROUP DESTROY
``ConsumerCreate``     XGROUP CREATECONSUMER, XREADGROUP's new consumer, snapshots
``ConsumerDelete``     XGROUP DELCONSUMER (its pending entries go with it)
``Deliver``            XREADGROUP ``>``: entries delivered (pending unless NOACK)
``Ack``                XACK: entries no longer pending
``Claim``              XCLAIM, XAUTOCLAIM, snapshots: pending entries given an owner,
                       a delivery time and count; ``dropped`` leave the PEL (deleted
                       from the stream); ``last_id`` raises the group's
=====================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "Ack",
    "Claim",
    "ConsumerCreate",
    "ConsumerDelete",
    "Deliver",
    "GroupCreate",
    "GroupDestroy",
    "GroupSetId",
    "StreamAdd",
    "StreamCreate",
    "StreamDelete",
    "StreamEffect",
    "StreamEntries",
    "StreamId",
    "StreamSetId",
    "StreamTrim",
]

StreamId: TypeAlias = tuple[int, int]


@dataclass(frozen=True, slots=True)
class StreamCreate:
    deadline: int = 0


@dataclass(frozen=True, slots=True)
class StreamAdd:
    id: StreamId
    fields: tuple[bytes, ...]
    trim: StreamId | None = None


@dataclass(frozen=True, slots=True)
class StreamTrim:
    first: StreamId


@dataclass(frozen=True, slots=True)
class StreamDelete:
    ids: tuple[StreamId, ...]


@dataclass(frozen=True, slots=True)
class StreamSetId:
    last_id: StreamId
    entries_added: int
    max_deleted: StreamId


@dataclass(frozen=True, slots=True)
class StreamEntries:
    entries: tuple[tuple[StreamId, tuple[bytes, ...]], ...]


@dataclass(frozen=True, slots=True)
class GroupCreate:
    group: bytes
    last_id: StreamId
    entries_read: int


@dataclass(frozen=True, slots=True)
class GroupSetId:
    group: bytes
    last_id: StreamId
    entries_read: int


@dataclass(frozen=True, slots=True)
class GroupDestroy:
    group: bytes


@dataclass(frozen=True, slots=True)
class ConsumerCreate:
    group: bytes
    consumer: bytes
    seen: int


@dataclass(frozen=True, slots=True)
class ConsumerDelete:
    group: bytes
    consumer: bytes


@dataclass(frozen=True, slots=True)
class Deliver:
    group: bytes
    consumer: bytes
    time: int
    ids: tuple[StreamId, ...]
    last_id: StreamId
    entries_read: int
    noack: bool


@dataclass(frozen=True, slots=True)
class Ack:
    group: bytes
    ids: tuple[StreamId, ...]


@dataclass(frozen=True, slots=True)
class Claim:
    group: bytes
    consumer: bytes
    claimed: tuple[tuple[StreamId, int, int], ...]  # (id, delivery time, count)
    dropped: tuple[StreamId, ...] = ()
    last_id: StreamId | None = None


StreamEffect: TypeAlias = (
    StreamCreate
    | StreamAdd
    | StreamTrim
    | StreamDelete
    | StreamSetId
    | StreamEntries
    | GroupCreate
    | GroupSetId
    | GroupDestroy
    | ConsumerCreate
    | ConsumerDelete
    | Deliver
    | Ack
    | Claim
)
