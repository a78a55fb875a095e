"""The keyspace: plain Redis keys (strings, hashes, sorted sets, lists, sets) with
expiry, beside the V-store and independent of it.

A synchronous, single-owner structure like the V-store: the event loop calls it
between awaits, nobody sees it half-updated, and it imports nothing of the server.

Values: a string is the ``bytes`` the request carried (never copied), a hash a
``dict[bytes, bytes]``, a sorted set a :class:`~pion.keyspace.sortedset.SortedSet`, a
list a ``deque[bytes]``, a set a ``set[bytes]`` (their writes are ``lists.py``'s and
``sets.py``'s). Empty hashes, sorted sets, lists and sets never exist: removing the
last element removes the key.

Writes follow the V-store's order: validate everything, then ask the memory budget for
the bytes the write adds (``budget``, which may evict V-store sessions or raise
``OOMError``; keys too by ``maxmemory-policy``, never one the command names:
``pion.commands.budget``), then hand the record to the journal
(:mod:`~pion.keyspace.mutations`), then apply. :meth:`Keyspace.apply` replays a record
without journaling or budgeting.

Expiry (``expiry.py`` has the policy): a key past its deadline is removed lazily when a
command touches it and actively by :meth:`Keyspace.sweep`; either way the removal is
journaled (``DeleteKeys(reason="expire")``) so a restart, whatever its clock says,
never revives it. If the journal refuses that record (persistence failing), the key is
removed from memory anyway: its deadline is already durable.

``used_bytes`` is what ``--maxmemory`` counts for the keyspace (``entries.py``).

Each key remembers when a command last looked it up (``Entry.touched``, in seconds of
``lru_clock``, which :meth:`Keyspace.sweep` advances: Redis's LRU clock has the same
one-second resolution), for OBJECT IDLETIME.

The reads and the journaling are the base class's, :class:`~pion.keyspace.lookups.KeyLookups`
(``lookups.py``). Every change of a key reaches one of the primitives of its base classes,
:class:`~pion.keyspace.primitives.KeyTable` (``primitives.py``) and
:class:`~pion.keyspace.listset.ListSetTable` (``listset.py``) and
:class:`~pion.keyspace.streamtable.StreamTable` (``streamtable.py``), which also tell
WATCH.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

from pion.keyspace.entries import (
    FIELD_OVERHEAD,
    KEY_OVERHEAD,
    MEMBER_OVERHEAD,
    Entry,
    Value,
    chunks,
    copy_value,
    records,
    value_size,
)
from pion.keyspace.fieldttl import FIELD_TTL_OVERHEAD
from pion.keyspace.lookups import Budget, KeyJournal, KeyLookups
from pion.keyspace.mutations import (
    CopyKey,
    CopyToDb,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    MoveKey,
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
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.streamtable import stream_records
from pion.keyspace.streamtype import Stream

__all__ = ["Budget", "KeyJournal", "Keyspace"]


class Keyspace(KeyLookups):
    """Plain keys; see the module docstring."""

    def set_string(self, key: bytes, value: bytes, deadline: int = 0) -> None:
        """SET: ``value`` replaces whatever ``key`` held, with ``deadline`` (0 none)."""
        e = self._data.get(key)
        size = len(key) + len(value) + KEY_OVERHEAD  # value_size() of a string
        self._reserve(size - (e.size if e is not None else 0))
        if self.journal is not None or self.events is not None:
            self._journal(SetString(key, value, deadline))
        elif self.changed is not None:
            self.changed(1)  # no log, no notification: no record to build (cache traffic)
        self._store(key, value, deadline, size)  # a string wakes no blocked reader

    def set_range(self, key: bytes, offset: int, data: bytes) -> int:
        """SETRANGE and APPEND (``offset`` = the current length): ``data`` written at
        ``offset`` of the string ``key`` holds (a missing key starts empty with no
        deadline; zero bytes pad a gap; the deadline stays). Returns the new length.
        The caller checked the key's type and the size limit."""
        e = self._entry(key)
        old_len = len(cast(bytes, e.value)) if e is not None else 0
        new_len = max(old_len, offset + len(data))
        # The new value is built beside the old one (bytes are immutable): room for both.
        grow = new_len - old_len if e is not None else len(key) + new_len + KEY_OVERHEAD
        self._reserve(grow, transient=old_len)
        # Logged as the bytes written, not the new value: appending to a large string
        # costs the log what was appended.
        self._journal(SetRange(key, offset, data))
        self._apply_range(key, offset, data)
        return new_len

    def set_strings(self, items: list[tuple[bytes, bytes]]) -> None:
        """MSET: every pair at once (the last value of a repeated key wins)."""
        final = dict(items)
        grow = 0
        for key, value in final.items():
            e = self._data.get(key)
            grow += value_size(key, value) - (e.size if e is not None else 0)
        self._reserve(grow)
        self._journal(SetStrings(tuple(items)))
        for key, value in final.items():
            self._put(key, value, 0)

    def delete(self, keys: Iterable[bytes]) -> int:
        """DEL: how many of ``keys`` existed (and were removed)."""
        live = tuple(dict.fromkeys(k for k in keys if self._entry(k) is not None))
        if live:
            self._journal(DeleteKeys(live, "del"))
            for k in live:
                self._drop(k)
        return len(live)

    def persist(self, key: bytes) -> bool:
        """PERSIST: True when the key existed and had a deadline (now removed)."""
        e = self._entry(key)
        if e is None or not e.deadline:
            return False
        self._journal(SetDeadline(key, 0))
        self._set_deadline(key, e, 0)
        return True

    def set_deadline(self, key: bytes, deadline: int) -> bool:
        """EXPIRE on an existing key (``deadline`` > 0); False if there is none. A
        deadline not in the future removes the key (logged as a DEL, as Redis does)."""
        if deadline <= 0:
            raise ValueError("a deadline is a positive Unix time in ms")
        e = self._entry(key)
        if e is None:
            return False
        if deadline <= self.clock():
            self._journal(DeleteKeys((key,), "del"))
            self._drop(key)
            return True
        self._journal(SetDeadline(key, deadline))
        self._set_deadline(key, e, deadline)
        return True

    def hash_set(
        self, key: bytes, items: list[tuple[bytes, bytes]], *, keep_ttl: bool = False
    ) -> int:
        """HSET: the number of fields that were new. A field written loses its
        deadline unless ``keep_ttl`` (HINCRBY, HINCRBYFLOAT: Redis 7.4's
        ``HASH_SET_KEEP_TTL``), which is then logged as a ``SetFieldTTLs``."""
        h = self.hash(key, read=False)
        final = dict(items)
        grow = 0 if h is not None else len(key) + KEY_OVERHEAD
        added = 0
        for f, v in final.items():
            old = h.get(f) if h is not None else None
            if old is None:
                added += 1
                grow += len(f) + len(v) + FIELD_OVERHEAD
            else:
                grow += len(v) - len(old)
        self._reserve(grow)
        ttls = self.field_ttls.of(key)
        if keep_ttl and ttls is not None and any(f in ttls for f in final):
            self._journal(SetFieldTTLs(key, (), tuple(items)))
            self._apply_fields(key, final.items(), keep_ttl=True)
            return added
        self._journal(SetFields(key, tuple(items)))
        self._apply_fields(key, final.items())
        return added

    def hash_field_ttls(self, key: bytes, items: list[tuple[bytes, int]]) -> None:
        """HEXPIRE (future deadlines), HPERSIST (0): fields of the existing hash
        ``key`` get these deadlines (the caller checked each field exists)."""
        if items:
            grow = sum(FIELD_TTL_OVERHEAD for _, d in items if d)
            self._reserve(grow)
            self._journal(SetFieldTTLs(key, tuple(items)))
            self._apply_field_ttls(key, items)

    def hash_delete(self, key: bytes, fields: Iterable[bytes]) -> int:
        h = self.hash(key, read=False)
        if h is None:
            return 0
        gone = tuple(dict.fromkeys(f for f in fields if f in h))
        if gone:
            self._journal(DeleteFields(key, gone))
            self._apply_delete_fields(key, gone)
        return len(gone)

    def zset_set(self, key: bytes, items: list[tuple[float, bytes]]) -> None:
        """ZADD's outcome: these members get these scores (computed by the caller)."""
        z = self.zset(key, read=False)
        grow = 0 if z is not None else len(key) + KEY_OVERHEAD
        for m in dict.fromkeys(m for _, m in items):
            if z is None or m not in z.scores:
                grow += len(m) + MEMBER_OVERHEAD
        self._reserve(grow)
        self._journal(SetScores(key, tuple(items)))
        self._apply_scores(key, items)

    def zset_create(self, z: SortedSet, key: bytes, size: int) -> None:
        """ZADD to a key that does not exist: ``z``, built elsewhere (in steps), becomes
        its value at once; ``size`` is its ``value_size``. The caller checked that the
        key is still missing."""
        self._reserve(size)
        self._journal(SetScores(key, tuple(z)))
        self._put(key, z, 0, size)

    def zset_delete(self, key: bytes, members: Iterable[bytes]) -> int:
        z = self.zset(key, read=False)
        if z is None:
            return 0
        gone = tuple(dict.fromkeys(m for m in members if m in z.scores))
        if gone:
            self._journal(DeleteMembers(key, gone))
            self._apply_delete_members(key, gone)
        return len(gone)

    def zset_replace(self, key: bytes, items: list[tuple[float, bytes]]) -> None:
        """ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE: ``key`` becomes a sorted set of exactly
        ``items`` (distinct members), with no deadline, whatever it held; no items
        deletes it."""
        d = self._entry(key)
        if not items:
            if d is not None:
                self.delete((key,))
            return
        size = len(key) + KEY_OVERHEAD + sum(len(m) + MEMBER_OVERHEAD for _, m in items)
        self._reserve(size - (d.size if d is not None else 0))
        self._journal(ReplaceScores(key, tuple(items)))
        self._apply_replace(key, items)

    def rename(self, source: bytes, destination: bytes) -> bool:
        """RENAME: ``source`` moves to ``destination`` with its deadline, replacing
        whatever that held; False when ``source`` does not exist."""
        e = self._entry(source)
        if e is None:
            return False
        if source == destination:
            return True
        d = self._entry(destination)
        self._reserve(len(destination) - len(source) - (d.size if d is not None else 0))
        self._journal(RenameKey(source, destination))
        self._apply_rename(source, destination)
        return True

    def copy(self, source: bytes, destination: bytes, replace: bool) -> bool:
        """COPY: ``destination`` gets a copy of ``source``'s value and deadline; False
        when ``source`` is missing or ``destination`` exists and not ``replace``."""
        e = self._entry(source)
        d = self._entry(destination)
        if e is None or (d is not None and not replace):
            return False
        grow = e.size + len(destination) - len(source) - (d.size if d is not None else 0)
        self._reserve(grow)
        self._journal(CopyKey(source, destination))
        self._apply_copy(source, destination)
        return True

    def restore(
        self,
        key: bytes,
        value: Value,
        deadline: int,
        field_ttls: Sequence[tuple[bytes, int]] = (),
    ) -> None:
        """RESTORE: ``key`` holds ``value`` (new objects, parsed from a DUMP payload)
        with ``deadline`` and, for a hash, its fields' ``field_ttls`` (future
        deadlines), replacing whatever it held (the caller checked REPLACE). The
        budget is asked once for all of it, so a refusal leaves the old value."""
        e = self._data.get(key)
        grow = value_size(key, value) + FIELD_TTL_OVERHEAD * len(field_ttls)
        self._reserve(grow - (e.size if e is not None else 0))
        batch = list(records(key, value, deadline))
        if e is not None:
            batch.insert(0, DeleteKeys((key,), "del"))
        if field_ttls:
            batch.append(SetFieldTTLs(key, tuple(field_ttls)))
        for m in batch:  # each record applied as soon as it is logged, as every write
            self._journal(m)
            self.apply(m)

    def random_key(self) -> bytes | None:
        """RANDOMKEY: a live key chosen uniformly (expired ones met are removed)."""
        while self._data:
            key = self._slots.sample(self.rng)
            if self.peek(key) is not None:
                return key
        return None

    def flush(self) -> dict[bytes, Entry]:
        """FLUSHDB/FLUSHALL. Returns what the keyspace held, for the caller to free
        (in steps: freeing 300,000 keys at once holds the loop for tens of ms)."""
        self._journal(Flush())
        return self._clear()

    # -- expiry ----------------------------------------------------------------------

    def sweep(self, max_keys: int) -> int:
        """Remove up to ``max_keys`` keys whose deadline has passed, earliest first;
        returns how many (``expiry.py`` decides how often). Advances ``lru_clock``."""
        second = self.clock() // 1000
        if second != self.lru_clock:  # a new int only once a second: entries share it
            self.lru_clock = second
        now = self.clock()
        due = self.deadlines.due(now, max_keys, self._deadline_of)
        if due:
            self._expire(tuple(due))
        for key in self.field_ttls.due_keys(now, max_keys):
            self.reclaim_fields(key, now)
        if self.deadlines.stale():
            self.deadlines.rebuild([(e.deadline, k) for k, e in self._data.items() if e.deadline])
        return len(due)

    def _deadline_of(self, key: bytes) -> int:
        e = self._data.get(key)
        return 0 if e is None else e.deadline

    # -- snapshot and replay ---------------------------------------------------------

    def dump(self) -> Iterator[KeyMutation]:
        """The records that rebuild the live keys from an empty keyspace (keys already
        past their deadline are left out). Values are the live objects: consume each
        record before the keyspace changes."""
        now = self.clock()
        for key, e in self._data.items():
            if e.deadline and e.deadline < now:
                continue
            if isinstance(e.value, Stream):
                yield from stream_records(key, e.value, e.deadline)
            else:
                yield from records(key, e.value, e.deadline)
            ttls = self.field_ttls.of(key) if self.field_ttls.by_key else None
            if ttls:  # after the fields: the record sets deadlines of existing ones
                for batch in chunks(ttls.items(), lambda i: len(i[0]) + 12):
                    yield SetFieldTTLs(key, batch)

    # -- between databases (``databases.py``) ----------------------------------------

    def move_to(self, key: bytes, target: Keyspace) -> bool:
        """MOVE: ``key`` goes to ``target`` (another database) with its value,
        deadline and fields' deadlines; False when it is missing here or ``target``
        holds it. Nothing is copied and the memory used is unchanged."""
        e = self._entry(key)
        if e is None or target._entry(key) is not None:
            return False
        self._journal(MoveKey(key, target.db))
        if target.events is not None:
            target.events("new", key)
        self.apply_move(key, target)
        return True

    def apply_move(self, key: bytes, target: Keyspace) -> None:
        e = self._data[key]
        fields = self.field_ttls.take(key)
        self._drop(key)
        target._put(key, e.value, e.deadline, e.size)
        target.field_ttls.restore(key, fields)

    def copy_to(self, source: bytes, destination: bytes, target: Keyspace, replace: bool) -> bool:
        """COPY ... DB: ``destination`` in ``target`` gets a copy of ``source``'s value
        and deadline; False when ``source`` is missing or ``destination`` exists and
        not ``replace``."""
        e = self._entry(source)
        d = target._entry(destination)
        if e is None or (d is not None and not replace):
            return False
        grow = e.size + len(destination) - len(source) - (d.size if d is not None else 0)
        self._reserve(grow)
        m = CopyToDb(source, destination, target.db)
        self._journal(m)
        if target.events is not None:  # Redis deletes and adds: always new
            target.events("new", destination)
        self.apply_copy_to(source, destination, target)
        return True

    def apply_copy_to(self, source: bytes, destination: bytes, target: Keyspace) -> None:
        e = self._data[source]
        size = e.size + len(destination) - len(source)
        if destination in target._data:
            target._drop(destination)
        target._put(destination, copy_value(e.value), e.deadline, size)
        target.field_ttls.restore(destination, dict(self.field_ttls.of(source) or {}))

    def swap_contents(self, other: Keyspace) -> None:
        """SWAPDB: this keyspace and ``other`` exchange their keys (with deadlines,
        sizes, SCAN slots and INFO counters' bases); each keeps its ``db``, journal,
        notifications, watchers and blocked clients, which belong to the index, as in
        Redis. The caller tells the watchers and the blocked clients."""
        self._data, other._data = other._data, self._data
        self._slots, other._slots = other._slots, self._slots
        self._slots.relocate, other._slots.relocate = self._relocate, other._relocate
        self.deadlines, other.deadlines = other.deadlines, self.deadlines
        self.field_ttls, other.field_ttls = other.field_ttls, self.field_ttls
        self.used_bytes, other.used_bytes = other.used_bytes, self.used_bytes
