"""What the keyspace stores per key, what each key counts against ``--maxmemory``, and
the small helpers its snapshot and replay paths share.

``used_bytes`` counts every key, field, member and value's bytes plus a fixed
per-object overhead: the constants below, measured for CPython 3.11 on 64-bit with
``sys.getsizeof`` of the objects involved (a test checks the estimate against
``tracemalloc``). Large values dominate, so for LMCache's megabyte chunks the count is
within a fraction of a percent of the memory really held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, TypeAlias, TypeVar

from pion.keyspace.mutations import (
    KeyMutation,
    ListPush,
    NewKey,
    Payload,
    SetAdd,
    SetFields,
    SetScores,
    SetString,
    StreamChange,
)
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.streamops import (
    Claim,
    ConsumerCreate,
    GroupCreate,
    StreamCreate,
    StreamEntries,
    StreamId,
    StreamSetId,
)
from pion.keyspace.streamtype import Stream

__all__ = [
    "DUMP_CHUNK",
    "FIELD_OVERHEAD",
    "KEY_OVERHEAD",
    "LIST_ITEM_OVERHEAD",
    "MEMBER_OVERHEAD",
    "SET_MEMBER_OVERHEAD",
    "Entry",
    "Kind",
    "Value",
    "chunks",
    "copy_value",
    "kind_of",
    "own",
    "records",
    "stream_records",
    "value_size",
]

_T = TypeVar("_T")

Value: TypeAlias = bytes | dict[bytes, bytes] | SortedSet | deque[bytes] | set[bytes] | Stream
Kind = Literal["string", "hash", "zset", "list", "set", "stream"]

# One key beyond its own and its value's bytes: the dict slot and index (~50), the
# key's bytes header (33), the Entry object (80), the SCAN slot (8) and an expiry heap
# pair's share.
KEY_OVERHEAD = 184
# A hash field: its dict slot (~50) and two bytes headers (2 x 33).
FIELD_OVERHEAD = 120
# A sorted-set member: its dict slot, bytes header, float object (24), order tuple
# (56) and list slot (8).
MEMBER_OVERHEAD = 180
# A list element: its bytes header (33) and deque slot (8, and a share of its block).
LIST_ITEM_OVERHEAD = 48
# A set member: its bytes header (33) and hash-table slot (16 at a load of 2/5 or
# more: ~40).
SET_MEMBER_OVERHEAD = 80


class Entry:
    """One key: its value, SCAN slot, deadline (absolute Unix ms, 0 none), size, and
    when a command last touched it (Unix seconds, for OBJECT IDLETIME)."""

    __slots__ = ("deadline", "size", "slot", "touched", "value")

    def __init__(self, value: Value, slot: int, deadline: int, size: int, touched: int) -> None:
        self.value = value
        self.slot = slot
        self.deadline = deadline
        self.size = size
        self.touched = touched


def kind_of(value: Value) -> Kind:
    if isinstance(value, bytes):
        return "string"
    if isinstance(value, dict):
        return "hash"
    if isinstance(value, deque):
        return "list"
    if isinstance(value, Stream):
        return "stream"
    return "set" if isinstance(value, set) else "zset"


def copy_value(value: Value) -> Value:
    """An independent copy (COPY): strings are immutable and shared."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, deque):
        return deque(value)
    return value.copy()  # a set, sorted set or stream


def value_size(key: bytes, value: Value) -> int:
    """What ``key`` holding ``value`` counts in ``used_bytes``."""
    size = len(key) + KEY_OVERHEAD
    if isinstance(value, bytes):
        return size + len(value)
    if isinstance(value, dict):
        return size + sum(len(f) + len(v) + FIELD_OVERHEAD for f, v in value.items())
    if isinstance(value, deque):
        return size + sum(len(v) for v in value) + len(value) * LIST_ITEM_OVERHEAD
    if isinstance(value, set):
        return size + sum(len(m) for m in value) + len(value) * SET_MEMBER_OVERHEAD
    if isinstance(value, Stream):
        return size + value.size()
    return size + sum(len(m) + MEMBER_OVERHEAD for m in value.scores)


# A hash, sorted set, list or set is written to a snapshot in records of about this many bytes.
DUMP_CHUNK = 16 << 20


def own(data: Payload) -> bytes:
    """A payload as bytes we may keep (replayed payloads are views of a read buffer)."""
    return data if isinstance(data, bytes) else bytes(data)


def chunks(items: Iterable[_T], size_of: Callable[[_T], int]) -> Iterator[tuple[_T, ...]]:
    """``items`` in tuples of about DUMP_CHUNK bytes (as ``size_of`` counts them)."""
    batch: list[_T] = []
    held = 0
    for item in items:
        batch.append(item)
        held += size_of(item)
        if held >= DUMP_CHUNK:
            yield tuple(batch)
            batch, held = [], 0
    if batch:
        yield tuple(batch)


def records(key: bytes, v: Value, deadline: int) -> Iterator[KeyMutation]:
    """The records that create ``key`` holding ``v`` from nothing: what a snapshot
    writes per key and what RESTORE journals. A large container comes in chunks."""
    if isinstance(v, bytes):
        yield SetString(key, v, deadline)
    elif isinstance(v, dict):
        yield NewKey(key, "hash", deadline)
        for fields in chunks(v.items(), lambda i: len(i[0]) + len(i[1])):
            yield SetFields(key, fields)
    elif isinstance(v, deque):
        yield NewKey(key, "list", deadline)
        for items in chunks(v, lambda i: len(i) + 4):
            yield ListPush(key, False, items)
    elif isinstance(v, set):
        yield NewKey(key, "set", deadline)
        for batch in chunks(v, lambda i: len(i) + 4):
            yield SetAdd(key, batch)
    elif isinstance(v, SortedSet):
        yield NewKey(key, "zset", deadline)
        for members in chunks(iter(v), lambda i: len(i[1]) + 8):
            yield SetScores(key, members)
    else:
        yield from stream_records(key, v, deadline)


def _item_size(item: tuple[StreamId, tuple[bytes, ...]]) -> int:
    return 24 + sum(len(f) + 4 for f in item[1])


def stream_records(key: bytes, s: Stream, deadline: int) -> Iterator[KeyMutation]:
    """The records that rebuild ``s`` at ``key`` from nothing (a snapshot): its
    entries in chunks, its counters, then each group with its consumers and PEL."""
    yield StreamChange(key, StreamCreate(deadline))
    for batch in chunks(((i, s.entries[i]) for i in s.ids), _item_size):
        yield StreamChange(key, StreamEntries(batch))
    yield StreamChange(key, StreamSetId(s.last_id, s.entries_added, s.max_deleted))
    for name, g in s.groups.items():
        yield StreamChange(key, GroupCreate(name, g.last_id, g.entries_read))
        for cname, c in g.consumers.items():
            yield StreamChange(key, ConsumerCreate(name, cname, c.seen))
            owned = sorted(c.pending)
            for batch_ids in chunks(owned, lambda _: 24):
                claimed = tuple((i, g.pel[i].time, g.pel[i].count) for i in batch_ids)
                yield StreamChange(key, Claim(name, cname, claimed))
