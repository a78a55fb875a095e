"""The keyspace's data and the primitives every change of a key goes through.

:class:`KeyTable` holds the keys (``Entry`` per key, ``entries.py``), their SCAN slots
(``scan.py``), their deadlines (``expiry.py``) and ``used_bytes``; the
:class:`~pion.keyspace.store.Keyspace` built on it validates, budgets and journals a
write, then calls these primitives to apply it; :meth:`KeyTable.apply` replays a
journaled record through them directly (recovery, snapshot load).

WATCH: every change of a key reaches one of them (``_put``, ``_drop``,
``_set_deadline``, the field and member primitives, ``_clear``), and each tells
``watchers`` (:mod:`pion.watch`) which key changed. A command built on the store's
writes is watched without doing anything; replay changes keys through the same
primitives while nobody watches. (The one writer outside them, a connection's run of
plain SETs, ``pion.server.batch``, runs only while nobody watches.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

from pion.errors import PionError
from pion.keyspace.entries import (
    FIELD_OVERHEAD,
    MEMBER_OVERHEAD,
    Entry,
    Value,
    copy_value,
    kind_of,
    own,
    value_size,
)
from pion.keyspace.expiry import Deadlines
from pion.keyspace.fieldttl import FIELD_TTL_OVERHEAD, FieldDeadlines
from pion.keyspace.mutations import (
    CopyKey,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    NewKey,
    Payload,
    RenameKey,
    ReplaceScores,
    SetDeadline,
    SetFields,
    SetFieldTTLs,
    SetRange,
    SetScores,
    SetString,
    SetStrings,
)
from pion.keyspace.scan import SlotTable
from pion.keyspace.sortedset import SortedSet
from pion.watch import Watchers

__all__ = ["KeyTable"]


class KeyTable:
    """The keys and the primitives that change them; see the module docstring."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self._data: dict[bytes, Entry] = {}
        self._slots = SlotTable(self._relocate)
        self.deadlines = Deadlines()
        # Hash fields' deadlines (HEXPIRE); the primitives keep them with their hash.
        self.field_ttls = FieldDeadlines()
        self.used_bytes = 0
        # Seconds; a shared int, so every entry touched in one second holds one object.
        self.lru_clock = clock() // 1000
        # Clients watching keys (WATCH); told of every change by the primitives below.
        self.watchers = Watchers()

    @property
    def entries(self) -> dict[bytes, Entry]:
        """The key table itself, for the connection's runs of plain GET and SET
        (``pion.server.batch``): they read it, and overwrite a string that has no
        deadline in place exactly as :meth:`_store` would, only while nobody watches
        keys."""
        return self._data

    def apply(self, m: KeyMutation) -> None:
        """Apply a journaled record (replay, snapshot load) without journaling it or
        asking the budget; raises PionError for a record that contradicts the state
        (a hash record on a string key: the log and snapshot do not belong together)."""
        if isinstance(m, SetString):
            self._put(m.key, own(m.value), m.deadline)
        elif isinstance(m, SetStrings):
            for key, value in m.items:
                self._put(key, own(value), 0)
        elif isinstance(m, DeleteKeys):
            for key in m.keys:
                if key in self._data:
                    self._drop(key)
        elif isinstance(m, SetDeadline):
            e = self._data.get(m.key)
            if e is not None:
                self._set_deadline(m.key, e, m.deadline)
        elif isinstance(m, SetFields):
            self._typed(m.key, dict)
            self._apply_fields(m.key, ((f, own(v)) for f, v in m.items))
        elif isinstance(m, DeleteFields):
            if self._typed(m.key, dict):
                self._apply_delete_fields(m.key, m.fields)
        elif isinstance(m, SetFieldTTLs):
            if self._typed(m.key, dict):
                self._apply_field_ttls(m.key, m.items, m.values)
        elif isinstance(m, SetScores):
            self._typed(m.key, SortedSet)
            self._apply_scores(m.key, m.items)
        elif isinstance(m, DeleteMembers):
            if self._typed(m.key, SortedSet):
                self._apply_delete_members(m.key, m.members)
        elif isinstance(m, Flush):
            self._clear()
        elif isinstance(m, RenameKey):
            if m.source in self._data and m.source != m.destination:
                self._apply_rename(m.source, m.destination)
        elif isinstance(m, CopyKey):
            if m.source in self._data and m.source != m.destination:
                self._apply_copy(m.source, m.destination)
        elif isinstance(m, ReplaceScores):
            self._apply_replace(m.key, m.items)
        elif isinstance(m, SetRange):
            self._typed(m.key, bytes)
            self._apply_range(m.key, m.offset, own(m.data))
        elif isinstance(m, NewKey):
            self._put(m.key, {} if m.kind == "hash" else SortedSet(), m.deadline)
        else:  # a list or set record reached the base class: a subclass's bug
            raise TypeError(f"unhandled keyspace record {type(m).__name__}")

    def _typed(self, key: bytes, kind: type) -> bool:
        e = self._data.get(key)
        if e is not None and not isinstance(e.value, kind):
            raise PionError(f"a {kind_of(e.value)} record is applied to a key of another type")
        return e is not None

    def _relocate(self, key: bytes, slot: int) -> None:
        self._data[key].slot = slot

    def _put(self, key: bytes, value: Value, deadline: int, size: int = -1) -> None:
        """Store ``value`` under ``key``; subclasses add what a new value of their types
        wakes (blocked readers), around :meth:`_store`."""
        self._store(key, value, deadline, size)

    def _store(self, key: bytes, value: Value, deadline: int, size: int = -1) -> None:
        """Store ``value`` under ``key``, waking nobody: what :meth:`_put` does for a
        string (SET's path calls it directly, one call instead of three)."""
        if self.watchers.names:
            self.watchers.touch(key)
        e = self._data.get(key)
        if size < 0:
            size = value_size(key, value)
        if e is None:
            e = self._data[key] = Entry(value, self._slots.add(key), 0, size, self.lru_clock)
            self.used_bytes += size
        else:
            if e.value is not value and self.field_ttls.by_key:
                self.field_ttls.forget(key)  # a new value: ``size`` counts no deadlines
            self.used_bytes += size - e.size
            e.value, e.size = value, size
        self._set_deadline(key, e, deadline)

    def _set_deadline(self, key: bytes, e: Entry, deadline: int) -> None:
        if not deadline and not e.deadline:
            return
        if self.watchers.names:
            self.watchers.touch(key)
        if e.deadline:
            self.deadlines.discard(e.deadline)
        e.deadline = deadline
        if deadline:
            self.deadlines.add(key, deadline)

    def _drop(self, key: bytes, *, expiring: bool = False) -> None:
        if self.watchers.names:
            self.watchers.touch(key, expiring=expiring)
        e = self._data.pop(key)
        if self.field_ttls.by_key:
            self.field_ttls.forget(key)
        self.used_bytes -= e.size
        if e.deadline:
            self.deadlines.discard(e.deadline)
        self._slots.remove(e.slot)
        self._slots.maybe_compact()

    def _apply_rename(self, source: bytes, destination: bytes) -> None:
        e = self._data[source]
        value, deadline = e.value, e.deadline
        size = e.size + len(destination) - len(source)
        fields = self.field_ttls.take(source)  # they move with the hash, as in Redis 7.4
        self._drop(source)
        self._put(destination, value, deadline, size)
        self.field_ttls.restore(destination, fields)

    def _apply_range(self, key: bytes, offset: int, data: bytes) -> None:
        e = self._data.get(key)
        old = cast(bytes, e.value) if e is not None else b""
        if offset == len(old):
            new = old + data  # APPEND
        else:
            if len(old) < offset:
                old += bytes(offset - len(old))
            new = old[:offset] + data + old[offset + len(data) :]
        self._put(key, new, e.deadline if e is not None else 0)

    def _apply_replace(self, key: bytes, items: Iterable[tuple[float, bytes]]) -> None:
        if key in self._data:
            self._drop(key)
        self._apply_scores(key, items)

    def _apply_copy(self, source: bytes, destination: bytes) -> None:
        e = self._data[source]
        size = e.size + len(destination) - len(source)
        self._put(destination, copy_value(e.value), e.deadline, size)
        self.field_ttls.restore(destination, dict(self.field_ttls.of(source) or {}))

    def _clear(self) -> dict[bytes, Entry]:
        if self.watchers.names:
            self.watchers.touch_held(self._data)
        old, self._data = self._data, {}
        self._slots.clear()
        self.deadlines.clear()
        self.field_ttls.clear()
        self.used_bytes = 0
        return old

    def _container(self, key: bytes, kind: type) -> Entry:
        e = self._data.get(key)
        if e is None:
            self._put(key, {} if kind is dict else SortedSet(), 0)
            e = self._data[key]
        return e

    def _apply_fields(
        self, key: bytes, items: Iterable[tuple[bytes, bytes]], *, keep_ttl: bool = False
    ) -> None:
        """HSET: a written field loses its deadline (Redis 7.4's HSET), unless
        ``keep_ttl`` (its HINCRBY and HINCRBYFLOAT keep it)."""
        if self.watchers.names:
            self.watchers.touch(key)
        e = self._container(key, dict)
        h = cast(dict[bytes, bytes], e.value)  # the caller checked the type
        ttls = None if keep_ttl else self.field_ttls.of(key)
        grow = 0
        for f, v in items:
            old = h.get(f)
            grow += len(v) - len(old) if old is not None else len(f) + len(v) + FIELD_OVERHEAD
            h[f] = v
            if ttls is not None and f in ttls:
                self.field_ttls.set(key, f, 0)
                grow -= FIELD_TTL_OVERHEAD
        e.size += grow
        self.used_bytes += grow

    def _apply_delete_fields(self, key: bytes, fields: Iterable[bytes]) -> None:
        if self.watchers.names:
            self.watchers.touch(key)
        e = self._data[key]
        h = cast(dict[bytes, bytes], e.value)
        shrink = 0
        ttls = self.field_ttls.of(key)
        for f in fields:
            old = h.pop(f, None)
            if old is not None:
                shrink += len(f) + len(old) + FIELD_OVERHEAD
                if ttls is not None and f in ttls:
                    self.field_ttls.set(key, f, 0)
                    shrink += FIELD_TTL_OVERHEAD
        e.size -= shrink
        self.used_bytes -= shrink
        if not h:
            self._drop(key)

    def _apply_field_ttls(
        self,
        key: bytes,
        items: Iterable[tuple[bytes, int]],
        values: Iterable[tuple[bytes, Payload]] = (),
    ) -> None:
        """Existing fields of the hash ``key`` get these deadlines (0: none); fields
        it lacks are skipped. ``values`` are written first, keeping deadlines."""
        self._apply_fields(key, ((f, own(v)) for f, v in values), keep_ttl=True)
        e = self._data[key]
        h = cast(dict[bytes, bytes], e.value)
        grow = 0
        for f, deadline in items:
            if f in h:
                old = self.field_ttls.set(key, f, deadline)
                grow += FIELD_TTL_OVERHEAD * ((deadline != 0) - (old != 0))
        e.size += grow
        self.used_bytes += grow

    def _apply_scores(self, key: bytes, items: Iterable[tuple[float, bytes]]) -> None:
        if self.watchers.names:
            self.watchers.touch(key)
        e = self._container(key, SortedSet)
        z = cast(SortedSet, e.value)
        new = z.add_many([(score, own(m)) for score, m in items])
        grow = sum(len(m) for m in new) + len(new) * MEMBER_OVERHEAD
        e.size += grow
        self.used_bytes += grow

    def _apply_delete_members(self, key: bytes, members: Iterable[bytes]) -> None:
        if self.watchers.names:
            self.watchers.touch(key)
        e = self._data[key]
        z = cast(SortedSet, e.value)
        shrink = 0
        for m in members:
            if z.remove(m):
                shrink += len(m) + MEMBER_OVERHEAD
        e.size -= shrink
        self.used_bytes -= shrink
        if not len(z):
            self._drop(key)
