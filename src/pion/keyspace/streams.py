"""Stream commands' semantics (Redis 7.0's ``t_stream.c``) as operations on a
:class:`~pion.keyspace.Keyspace`: XADD's ids and trimming, XTRIM, XDEL, XSETID, the
consumer groups' changes (XGROUP, XREADGROUP's deliveries, XACK, XCLAIM).

Each write validates, asks the memory budget for what it adds, journals one
:class:`~pion.keyspace.mutations.StreamChange` carrying its effect (an XADD with ``*``
journals the id it got; an XREADGROUP the ids, the time and the group's new counters)
and applies it through ``streamtable.py``'s primitive. Parsing and replies are
``pion.commands.streams``'s.
"""

from __future__ import annotations

from pion.errors import BusyGroupError, NoGroupError, PionError, WrongTypeError
from pion.keyspace.entries import KEY_OVERHEAD
from pion.keyspace.mutations import StreamChange
from pion.keyspace.store import Keyspace
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
    StreamDelete,
    StreamEffect,
    StreamId,
    StreamSetId,
    StreamTrim,
)
from pion.keyspace.streamtype import (
    CONSUMER_OVERHEAD,
    ENTRY_OVERHEAD,
    FIELD_OVERHEAD,
    GROUP_OVERHEAD,
    MAX_ID,
    MAX_U64,
    PENDING_OVERHEAD,
    UNKNOWN,
    Group,
    Stream,
)

__all__ = [
    "Trim",
    "ack",
    "claim",
    "create_consumer",
    "create_group",
    "delete_consumer",
    "deliver",
    "destroy_group",
    "group_at",
    "set_group_id",
    "stream_at",
    "xadd",
    "xdel",
    "xsetid",
    "xtrim",
]

_SMALLER = "The ID specified in XADD is equal or smaller than the target stream top item"


class Trim:
    """A MAXLEN or MINID trimming request (XADD, XTRIM): ``limit`` 0 is unlimited."""

    __slots__ = ("approx", "limit", "maxlen", "minid")

    def __init__(
        self, maxlen: int | None, minid: StreamId | None, approx: bool, limit: int
    ) -> None:
        self.maxlen, self.minid, self.approx, self.limit = maxlen, minid, approx, limit

    def point(
        self, s: Stream, adding: tuple[StreamId, tuple[bytes, ...]] | None = None
    ) -> StreamId | None:
        return s.trim_point(self.maxlen, self.minid, self.approx, self.limit, adding)


def stream_at(ks: Keyspace, key: bytes, *, read: bool = True) -> Stream | None:
    value = ks.lookup(key, read=read)
    if value is None or isinstance(value, Stream):
        return value
    raise WrongTypeError()


def group_at(ks: Keyspace, key: bytes, name: bytes) -> tuple[Stream, Group]:
    """The group ``name`` of the stream at ``key``, else Redis's NOGROUP error."""
    s = stream_at(ks, key, read=False)
    g = s.groups.get(name) if s is not None else None
    if s is None or g is None:
        raise NoGroupError(
            f"No such key '{key.decode('utf-8', 'replace')}' or consumer group "
            f"'{name.decode('utf-8', 'replace')}'"
        )
    return s, g


def _change(ks: Keyspace, key: bytes, effect: StreamEffect, grow: int) -> None:
    ks._reserve(grow)
    ks._journal(StreamChange(key, effect))
    ks._apply_stream(key, effect)


def _next_id(s: Stream, given: StreamId | None, seq_given: bool, now: int) -> StreamId:
    last = s.last_id
    if given is None:
        if now > last[0]:
            return (now, 0)
        if last[1] == MAX_U64:
            return (last[0] + 1, 0)
        return (last[0], last[1] + 1)
    if seq_given:
        new = given
    elif given[0] == last[0]:
        if last[1] == MAX_U64:
            raise PionError(_SMALLER)
        new = (last[0], last[1] + 1)
    else:
        new = given
    if new <= last:
        raise PionError(_SMALLER)
    return new


def xadd(
    ks: Keyspace,
    key: bytes,
    fields: tuple[bytes, ...],
    given: StreamId | None,
    seq_given: bool,
    *,
    nomkstream: bool,
    trim: Trim | None,
) -> tuple[StreamId, bool] | None:
    """XADD: the new entry's id and whether it trimmed; None (NOMKSTREAM) when there is
    no stream."""
    s = stream_at(ks, key, read=False)
    if s is None:
        if nomkstream:
            return None
        s = Stream()
        grow = len(key) + KEY_OVERHEAD
    else:
        grow = 0
    if s.last_id == MAX_ID:
        raise PionError("The stream has exhausted the last possible ID, unable to add more items")
    new = _next_id(s, given, seq_given, ks.clock())
    grow += ENTRY_OVERHEAD + sum(len(f) + FIELD_OVERHEAD for f in fields)
    first = None
    if trim is not None:
        first = trim.point(s, (new, fields))
    _change(ks, key, StreamAdd(new, fields, first), grow)
    return new, first is not None


def xtrim(ks: Keyspace, key: bytes, trim: Trim) -> int:
    """XTRIM: how many entries went."""
    s = stream_at(ks, key, read=False)
    if s is None:
        return 0
    first = trim.point(s)
    if first is None:
        return 0
    before = len(s)
    _change(ks, key, StreamTrim(first), 0)
    return before - len(s)


def xdel(ks: Keyspace, key: bytes, ids: list[StreamId]) -> int:
    s = stream_at(ks, key, read=False)
    if s is None:
        return 0
    gone = tuple(dict.fromkeys(i for i in ids if i in s.entries))
    if gone:
        _change(ks, key, StreamDelete(gone), 0)
    return len(gone)


def xsetid(
    ks: Keyspace, key: bytes, last: StreamId, entries_added: int, max_deleted: StreamId
) -> None:
    s = stream_at(ks, key, read=False)
    if s is None:
        raise PionError("no such key")
    _change(ks, key, StreamSetId(last, entries_added, max_deleted), 0)


def create_group(
    ks: Keyspace, key: bytes, name: bytes, *, last: StreamId | None, read: int, mkstream: bool
) -> None:
    """XGROUP CREATE; ``last`` None is ``$``."""
    s = stream_at(ks, key, read=False)
    grow = len(name) + GROUP_OVERHEAD
    if s is None:
        if not mkstream:
            raise PionError(
                "The XGROUP subcommand requires the key to exist. Note that for CREATE "
                "you may want to use the MKSTREAM option to create an empty stream "
                "automatically."
            )
        s = Stream()
        grow += len(key) + KEY_OVERHEAD
    if name in s.groups:
        raise BusyGroupError("Consumer Group name already exists")
    _change(ks, key, GroupCreate(name, s.last_id if last is None else last, read), grow)


def set_group_id(ks: Keyspace, key: bytes, name: bytes, last: StreamId | None, read: int) -> None:
    s, _ = group_at(ks, key, name)
    _change(ks, key, GroupSetId(name, s.last_id if last is None else last, read), 0)


def destroy_group(ks: Keyspace, key: bytes, name: bytes) -> bool:
    s = stream_at(ks, key, read=False)
    if s is None or name not in s.groups:
        return False
    _change(ks, key, GroupDestroy(name), 0)
    return True


def create_consumer(ks: Keyspace, key: bytes, group: bytes, consumer: bytes) -> bool:
    _, g = group_at(ks, key, group)
    if consumer in g.consumers:
        return False
    _change(ks, key, ConsumerCreate(group, consumer, ks.clock()), len(consumer) + CONSUMER_OVERHEAD)
    return True


def delete_consumer(ks: Keyspace, key: bytes, group: bytes, consumer: bytes) -> int:
    """XGROUP DELCONSUMER: how many entries it had pending (0 when it is unknown)."""
    _, g = group_at(ks, key, group)
    c = g.consumers.get(consumer)
    if c is None:
        return 0
    pending = len(c.pending)
    _change(ks, key, ConsumerDelete(group, consumer), 0)
    return pending


def deliver(
    ks: Keyspace, key: bytes, group: bytes, consumer: bytes, *, count: int, noack: bool
) -> list[StreamId]:
    """XREADGROUP ``>``: up to ``count`` (0: all) entries past the group's last id,
    delivered to ``consumer`` (pending unless ``noack``). The group's read counter
    moves as ``streamReplyWithRange`` moves it."""
    s, g = group_at(ks, key, group)
    ids = s.after(g.last_id, count)
    now = ks.clock()
    known = consumer in g.consumers
    if not ids:
        if not known:
            _change(
                ks, key, ConsumerCreate(group, consumer, now), len(consumer) + CONSUMER_OVERHEAD
            )
        else:
            g.consumers[consumer].seen = now
        return []
    read, last = g.entries_read, g.last_id
    for i in ids:
        if read != UNKNOWN and not s.has_tombstones_after(i):
            read += 1
        elif s.entries_added:
            read = s.distance(i)
        last = i
    grow = 0 if known else len(consumer) + CONSUMER_OVERHEAD
    grow += 0 if noack else len(ids) * PENDING_OVERHEAD
    _change(ks, key, Deliver(group, consumer, now, tuple(ids), last, read, noack), grow)
    return ids


def ack(ks: Keyspace, key: bytes, group: bytes, ids: list[StreamId]) -> int:
    s = stream_at(ks, key, read=False)
    g = s.groups.get(group) if s is not None else None
    if g is None:
        return 0
    done = tuple(dict.fromkeys(i for i in ids if i in g.pel))
    if done:
        _change(ks, key, Ack(group, done), 0)
    return len(done)


def claim(
    ks: Keyspace,
    key: bytes,
    group: bytes,
    consumer: bytes,
    *,
    claimed: list[tuple[StreamId, int, int]],
    dropped: list[StreamId],
    last_id: StreamId | None,
) -> None:
    """XCLAIM and XAUTOCLAIM's effect, decided by the caller: each claimed entry's
    delivery time and count, the ids that leave the PEL, the group's new last id."""
    _, g = group_at(ks, key, group)
    if not claimed and not dropped and (last_id is None or last_id <= g.last_id):
        return
    new = claimed and consumer not in g.consumers
    grow = len(consumer) + CONSUMER_OVERHEAD if new else 0
    grow += sum(PENDING_OVERHEAD for i, _, _ in claimed if i not in g.pel)
    _change(ks, key, Claim(group, consumer, tuple(claimed), tuple(dropped), last_id), grow)
