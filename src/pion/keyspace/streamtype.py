"""The stream value (Redis's ``t_stream.c`` data): entries in id order, the counters
XINFO shows, consumer groups with their pending entries lists, and how each
:mod:`~pion.keyspace.streamops` effect changes them.

Entries. ``ids`` holds the live ids in increasing order (XADD only ever appends, so a
plain list with ``bisect`` serves ranges), ``entries`` maps an id to its flat
field/value tuple. Redis stores entries in listpack *nodes* of at most
``stream-node-max-entries`` (100) entries and ``stream-node-max-bytes`` (4096) bytes;
a deleted entry stays in its node (a tombstone) until the node empties. Approximate
trimming (``~``) removes whole nodes only, so the nodes are modelled
(``streamnodes.py``: the ids each holds, deleted ones included, its live count and
its listpack's bytes) for ``~`` to trim exactly what Redis trims.

Sizes: :meth:`Stream.apply` returns how many bytes an effect added (negative: freed),
counted with the overheads below (CPython 3.11, 64-bit, ``sys.getsizeof``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Final

from pion.keyspace.streamnodes import Node, starts_node
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

__all__ = [
    "ENTRY_OVERHEAD",
    "MAX_ID",
    "Consumer",
    "Group",
    "Pending",
    "Stream",
    "format_id",
]

MAX_U64: Final = (1 << 64) - 1
MAX_ID: Final = (MAX_U64, MAX_U64)
# An entry: its id tuple and two ints (~110), the fields tuple (~56), a dict slot
# (~50) and a list slot (8); each field or value adds a bytes header and a slot (41).
ENTRY_OVERHEAD: Final = 224
FIELD_OVERHEAD: Final = 41
# A pending entry (its object and slots in two dicts), a consumer, a group.
PENDING_OVERHEAD: Final = 200
CONSUMER_OVERHEAD: Final = 250
GROUP_OVERHEAD: Final = 400
# SCG_INVALID_ENTRIES_READ: a group's read counter that is not known.
UNKNOWN: Final = -1


def format_id(i: StreamId) -> bytes:
    return b"%d-%d" % i


class Pending:
    """One entry of a group's PEL: its owner, last delivery (Unix ms), deliveries."""

    __slots__ = ("consumer", "count", "time")

    def __init__(self, consumer: bytes, time: int, count: int) -> None:
        self.consumer = consumer
        self.time = time
        self.count = count


class Consumer:
    __slots__ = ("pending", "seen")

    def __init__(self, seen: int) -> None:
        self.seen = seen
        self.pending: set[StreamId] = set()


class Group:
    __slots__ = ("consumers", "entries_read", "last_id", "pel")

    def __init__(self, last_id: StreamId, entries_read: int) -> None:
        self.last_id = last_id
        self.entries_read = entries_read
        self.pel: dict[StreamId, Pending] = {}
        self.consumers: dict[bytes, Consumer] = {}

    def consumer(self, name: bytes, seen: int) -> tuple[Consumer, int]:
        """The consumer ``name`` (created with ``seen`` if new) and the bytes added."""
        c = self.consumers.get(name)
        if c is not None:
            return c, 0
        c = self.consumers[name] = Consumer(seen)
        return c, len(name) + CONSUMER_OVERHEAD

    def unpend(self, i: StreamId) -> int:
        p = self.pel.pop(i, None)
        if p is None:
            return 0
        owner = self.consumers.get(p.consumer)
        if owner is not None:
            owner.pending.discard(i)
        return -PENDING_OVERHEAD

    def pend(self, i: StreamId, consumer: bytes, time: int, count: int) -> int:
        freed = self.unpend(i)
        self.pel[i] = Pending(consumer, time, count)
        self.consumers[consumer].pending.add(i)
        return freed + PENDING_OVERHEAD


def _entry_cost(fields: tuple[bytes, ...]) -> int:
    return ENTRY_OVERHEAD + sum(len(f) + FIELD_OVERHEAD for f in fields)


class Stream:
    """One stream key's value; see the module docstring."""

    __slots__ = ("entries", "entries_added", "groups", "ids", "last_id", "max_deleted", "nodes")

    def __init__(self) -> None:
        self.ids: list[StreamId] = []
        self.entries: dict[StreamId, tuple[bytes, ...]] = {}
        self.nodes: list[Node] = []
        self.last_id: StreamId = (0, 0)
        self.entries_added = 0
        self.max_deleted: StreamId = (0, 0)
        self.groups: dict[bytes, Group] = {}

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def first_id(self) -> StreamId:
        return self.ids[0] if self.ids else (0, 0)

    def size(self) -> int:
        """What the whole value counts (a snapshot load, COPY)."""
        total = sum(_entry_cost(f) for f in self.entries.values())
        for name, g in self.groups.items():
            total += len(name) + GROUP_OVERHEAD + len(g.pel) * PENDING_OVERHEAD
            total += sum(len(c) + CONSUMER_OVERHEAD for c in g.consumers)
        return total

    def copy(self) -> Stream:
        s = Stream()
        s.apply(StreamEntries(tuple((i, self.entries[i]) for i in self.ids)))
        s.nodes = [n.clone() for n in self.nodes]
        s.last_id, s.entries_added, s.max_deleted = (
            self.last_id,
            self.entries_added,
            self.max_deleted,
        )
        for name, g in self.groups.items():
            h = s.groups[name] = Group(g.last_id, g.entries_read)
            for cname, c in g.consumers.items():
                h.consumer(cname, c.seen)
            for i, p in g.pel.items():
                h.pend(i, p.consumer, p.time, p.count)
        return s

    # -- reads -----------------------------------------------------------------------

    def range(self, lo: StreamId, hi: StreamId, count: int, rev: bool) -> list[StreamId]:
        """The ids in ``lo..hi`` (inclusive), up to ``count`` (0: all), in order or
        reversed."""
        a, b = bisect_left(self.ids, lo), bisect_right(self.ids, hi)
        if a >= b:
            return []
        if not rev:
            return self.ids[a : a + count if count else b][: b - a]
        start = max(a, b - count) if count else a
        return self.ids[start:b][::-1]

    def after(self, i: StreamId, count: int) -> list[StreamId]:
        """Up to ``count`` (0: all) ids greater than ``i``."""
        a = bisect_right(self.ids, i)
        return self.ids[a : a + count] if count else self.ids[a:]

    def has_tombstones_after(self, start: StreamId) -> bool:
        """Redis's ``streamRangeHasTombstones(s, start, NULL)``."""
        if not self.ids or self.max_deleted == (0, 0) or self.first_id > self.max_deleted:
            return False
        return start <= self.max_deleted

    def distance(self, i: StreamId) -> int:
        """Redis's ``streamEstimateDistanceFromFirstEverEntry``: the read counter of
        ``i``, or UNKNOWN."""
        if not self.entries_added:
            return 0
        if not self.ids and i <= self.last_id:
            return self.entries_added
        if i == self.last_id:
            return self.entries_added
        if i > self.last_id:
            return UNKNOWN
        first = self.first_id
        if self.max_deleted == (0, 0) or self.max_deleted < first:
            if i < first:
                return self.entries_added - len(self.ids)
            if i == first:
                return self.entries_added - len(self.ids) + 1
        return UNKNOWN

    def lag(self, g: Group) -> int | None:
        """XINFO GROUPS' ``lag`` (``streamReplyWithCGLag``); None: not known."""
        if not self.entries_added:
            return 0
        if g.entries_read != UNKNOWN and not self.has_tombstones_after(g.last_id):
            return self.entries_added - g.entries_read
        read = self.distance(g.last_id)
        return None if read == UNKNOWN else self.entries_added - read

    def trim_point(
        self,
        maxlen: int | None,
        minid: StreamId | None,
        approx: bool,
        limit: int,
        adding: tuple[StreamId, tuple[bytes, ...]] | None = None,
    ) -> StreamId | None:
        """Where a trim stops: the first id kept (the entries before it go), or None
        when nothing goes; ``adding`` is XADD's new entry, counted as appended (Redis
        trims after appending). Redis's ``streamTrim``: exact trimming removes entries
        one by one; ``~`` removes whole nodes only, at most ``limit`` entries (0: no
        limit)."""
        ids = self.ids
        n = len(ids) + (adding is not None)

        def at(k: int) -> StreamId:
            if k < len(ids):
                return ids[k]
            return adding[0] if adding is not None and k == len(ids) else MAX_ID

        if maxlen is not None:
            if n <= maxlen:
                return None
            if not approx:
                return at(n - maxlen) if maxlen else MAX_ID
        elif minid is None or not n or at(0) >= minid:
            return None
        if not approx:
            assert minid is not None
            k = bisect_left(ids, minid)
            if k == len(ids) and adding is not None and adding[0] < minid:
                k += 1  # the new entry goes too
            return at(k)
        left, gone = n, 0
        stop: StreamId | None = None
        for last, live in self._node_edges(adding):
            if maxlen is not None and (left <= maxlen or left - live < maxlen):
                break
            if minid is not None and last >= minid:
                break
            if limit and gone + live > limit:
                break
            left -= live
            gone += live
            stop = last
        if stop is None:
            return None
        k = bisect_right(ids, stop)
        if k == len(ids) and adding is not None and adding[0] <= stop:
            k += 1  # the new entry's node goes too
        return at(k)

    def _node_edges(
        self, adding: tuple[StreamId, tuple[bytes, ...]] | None
    ) -> list[tuple[StreamId, int]]:
        """Each node's last id (deleted entries included) and live count, with the
        entry being added where XADD would put it."""
        edges = [(node.ids[-1], node.live) for node in self.nodes]
        if adding is not None:
            i, fields = adding
            if starts_node(self.nodes[-1] if self.nodes else None, fields):
                edges.append((i, 1))
            else:
                edges[-1] = (i, edges[-1][1] + 1)
        return edges

    # -- changes ---------------------------------------------------------------------

    def apply(self, e: StreamEffect) -> int:
        """Apply one effect; the bytes it added (negative: freed)."""
        if isinstance(e, StreamAdd):
            grow = self._append(e.id, e.fields)
            self.last_id = e.id
            self.entries_added += 1
            return grow + (self._trim(e.trim) if e.trim is not None else 0)
        if isinstance(e, StreamTrim):
            return self._trim(e.first)
        if isinstance(e, StreamDelete):
            return self._delete(e.ids)
        if isinstance(e, StreamSetId):
            self.last_id, self.entries_added, self.max_deleted = (
                e.last_id,
                e.entries_added,
                e.max_deleted,
            )
            return 0
        if isinstance(e, StreamEntries):
            return sum(self._append(i, f) for i, f in e.entries)
        if isinstance(e, StreamCreate):
            return 0
        return self._apply_group(e)

    def _append(self, i: StreamId, fields: tuple[bytes, ...]) -> int:
        last = self.nodes[-1] if self.nodes else None
        if last is None or starts_node(last, fields):
            last = Node(i, fields)
            self.nodes.append(last)
        last.append(i, fields)
        self.ids.append(i)
        self.entries[i] = fields
        return _entry_cost(fields)

    def _node_of(self, i: StreamId) -> int:
        lo, hi = 0, len(self.nodes)
        while lo < hi:  # the last node whose first id is <= i
            mid = (lo + hi) // 2
            if self.nodes[mid].ids[0] <= i:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def _trim(self, first: StreamId) -> int:
        k = bisect_left(self.ids, first)
        gone = self.ids[:k]
        del self.ids[:k]
        freed = sum(_entry_cost(self.entries.pop(i)) for i in gone)
        while self.nodes and self.nodes[0].ids[-1] < first:
            self.nodes.pop(0)
        if self.nodes and gone:
            head = self.nodes[0]
            head.live -= sum(1 for i in gone if i >= head.ids[0])
            if not head.live:  # only tombstones were left past ``first``
                self.nodes.pop(0)
        return -freed

    def _delete(self, ids: tuple[StreamId, ...]) -> int:
        freed = 0
        for i in ids:
            fields = self.entries.pop(i, None)
            if fields is None:
                continue
            freed += _entry_cost(fields)
            del self.ids[bisect_left(self.ids, i)]
            at = self._node_of(i)
            node = self.nodes[at]
            node.live -= 1
            if not node.live:
                del self.nodes[at]
            self.max_deleted = max(self.max_deleted, i)
        return -freed

    def _apply_group(self, e: StreamEffect) -> int:
        if isinstance(e, GroupCreate):
            self.groups[e.group] = Group(e.last_id, e.entries_read)
            return len(e.group) + GROUP_OVERHEAD
        if isinstance(e, GroupDestroy):
            g = self.groups.pop(e.group)
            return -(
                len(e.group)
                + GROUP_OVERHEAD
                + len(g.pel) * PENDING_OVERHEAD
                + sum(len(c) + CONSUMER_OVERHEAD for c in g.consumers)
            )
        if not isinstance(e, (GroupSetId, ConsumerCreate, ConsumerDelete, Deliver, Ack, Claim)):
            raise TypeError(f"unhandled stream change {type(e).__name__}")
        g = self.groups[e.group]
        if isinstance(e, GroupSetId):
            g.last_id, g.entries_read = e.last_id, e.entries_read
            return 0
        if isinstance(e, ConsumerCreate):
            return g.consumer(e.consumer, e.seen)[1]
        if isinstance(e, ConsumerDelete):
            c = g.consumers.pop(e.consumer)
            for i in c.pending:
                g.pel.pop(i, None)
            return -(len(e.consumer) + CONSUMER_OVERHEAD + len(c.pending) * PENDING_OVERHEAD)
        if isinstance(e, Deliver):
            c, grow = g.consumer(e.consumer, e.time)
            c.seen = e.time
            if e.ids:
                g.last_id, g.entries_read = e.last_id, e.entries_read
            if not e.noack:
                for i in e.ids:
                    grow += g.pend(i, e.consumer, e.time, 1)
            return grow
        if isinstance(e, Ack):
            return sum(g.unpend(i) for i in e.ids)
        grow = g.consumer(e.consumer, 0)[1] if e.claimed else 0
        for i, time, count in e.claimed:
            grow += g.pend(i, e.consumer, time, count)
        for i in e.dropped:
            grow += g.unpend(i)
        if e.last_id is not None and e.last_id > g.last_id:
            g.last_id = e.last_id
        return grow
