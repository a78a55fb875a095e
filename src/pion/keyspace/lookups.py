"""The keyspace's reads and the journaling every write goes through: the base of
:class:`~pion.keyspace.store.Keyspace` (``store.py`` has the writes, the sweep and
the snapshot; its docstring the model: values, the write order, expiry, ``used_bytes``).

A read removes a key it finds past its deadline (lazy expiry) and reclaims a hash's
fields past theirs, both journaled here, so every command sees the keyspace without
them. Each key remembers when a command last looked it up (``Entry.touched``, in
seconds of ``lru_clock``), for OBJECT IDLETIME.

``db`` is the database index this keyspace serves (``databases.py`` holds the 16):
fixed for the object's life, so its journal, notifications, watchers and blocked
clients stay with the index when SWAPDB exchanges two databases' contents.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from random import Random
from typing import Protocol, TypeAlias

from pion.errors import PionError, WrongTypeError
from pion.keyspace.entries import (
    Entry,
    Kind,
    Value,
    kind_of,
)
from pion.keyspace.expiry import now_ms
from pion.keyspace.glob import matches_all, stringmatch
from pion.keyspace.mutations import (
    CopyKey,
    DeleteFields,
    DeleteKeys,
    KeyMutation,
    ListMove,
    ListPush,
    ListReplace,
    NewKey,
    RenameKey,
    ReplaceScores,
    SetAdd,
    SetFields,
    SetRange,
    SetReplace,
    SetScores,
    SetString,
    StreamChange,
)
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.streamtable import StreamTable

__all__ = ["Budget", "KeyJournal", "KeyLookups"]

# The records that create their key when it is absent (keyspace notifications' new).
_CREATING = (
    SetString,
    SetRange,
    SetFields,
    SetScores,
    NewKey,
    ReplaceScores,
    ListPush,
    ListReplace,
    SetAdd,
    SetReplace,
    StreamChange,
)

log = logging.getLogger("pion.keyspace")


class KeyJournal(Protocol):
    """Where the keyspace's mutations go before they are applied (the WAL). Same
    contract as :class:`pion.vstore.Journal`: return = accepted, raise = refused."""

    def append(self, mutation: KeyMutation) -> None: ...


Budget: TypeAlias = Callable[[int], None]
"""Asked for the bytes a write adds before it is journaled; raises ``OOMError`` when
they cannot be had: the server sets it to ``pion.vstore.VStore.make_room``, which
evicts V-store namespaces (``pion.commands.state.ServerState``)."""


class KeyLookups(StreamTable):
    """Reads and journaling; see the module docstring."""

    def __init__(self, clock: Callable[[], int] = now_ms, db: int = 0) -> None:
        super().__init__(clock)
        self.db = db
        self.watchers.db = db
        # Attached after recovery (replay goes through apply, which never journals).
        self.journal: KeyJournal | None = None
        # Without a log (``--no-wal``) there is no journal and no record is built: this
        # counts each change instead (INFO ``rdb_changes_since_last_save``).
        self.changed: Callable[[int], None] | None = None
        self.budget: Budget | None = None
        # Keyspace notifications this store raises itself, called (event, key) with
        # ``new`` or ``expired``; installed only while notify-keyspace-events enables
        # some (``pion.notify.configure``), so a write otherwise pays one test.
        self.events: Callable[[str, bytes], None] | None = None
        # HRANDFIELD, ZRANDMEMBER, RANDOMKEY (tests may seed it).
        self.rng = Random()
        # INFO Stats counters, from process start.
        self.expired_keys = 0
        self.expired_fields = 0
        self.hits = 0
        self.misses = 0

    # -- enumeration -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT: zero the INFO counters (as Redis does for these three)."""
        self.expired_keys = self.hits = self.misses = 0
        self.expired_fields = 0

    @property
    def volatile(self) -> int:
        """How many keys have a deadline."""
        return self.deadlines.count

    def avg_ttl(self) -> int:
        """Mean remaining time to live of the keys with a deadline, in ms."""
        d = self.deadlines
        return max(0, d.total // d.count - self.clock()) if d.count else 0

    # -- reads -----------------------------------------------------------------------

    def peek(self, key: bytes) -> Entry | None:
        """The key's entry, removing it first if its deadline has passed (Redis expires
        a key once ``now > deadline``); not touched (OBJECT, MEMORY USAGE)."""
        e = self._data.get(key)
        if e is not None:
            if e.deadline and e.deadline < self.clock():
                self._expire((key,))
                return None
            if self.field_ttls.earliest and self._fields_due(key):
                return None
        return e

    def _fields_due(self, key: bytes) -> bool:
        """Reclaim the hash's fields past their deadline, if its bound says some may
        be (so every command sees a hash without them); True when the key went."""
        bound = self.field_ttls.earliest.get(key)
        if bound is None:
            return False
        now = self.clock()
        return bound < now and self.reclaim_fields(key, now)

    def _entry(self, key: bytes) -> Entry | None:
        """:meth:`peek`, marking the key as used now."""
        e = self.peek(key)
        if e is not None:
            e.touched = self.lru_clock
        return e

    def lookup(self, key: bytes, *, read: bool = True) -> Value | None:
        """The key's value. ``read`` counts a hit or a miss (INFO keyspace_hits and
        keyspace_misses count the lookups of reading commands, as in Redis)."""
        e = self._entry(key)
        if read:
            if e is None:
                self.misses += 1
            else:
                self.hits += 1
        return None if e is None else e.value

    def string(self, key: bytes, *, read: bool = True) -> bytes | None:
        """:meth:`lookup` of a string (GET's, the hottest read: a key with no deadline
        and no hash field deadlines anywhere skips :meth:`peek`'s calls)."""
        e = self._data.get(key)
        if e is not None and (e.deadline or self.field_ttls.earliest):
            e = self.peek(key)
        if e is None:
            if read:
                self.misses += 1
            return None
        e.touched = self.lru_clock
        if read:
            self.hits += 1
        value = e.value
        if isinstance(value, bytes):
            return value
        raise WrongTypeError()

    def hash(self, key: bytes, *, read: bool = True) -> dict[bytes, bytes] | None:
        value = self.lookup(key, read=read)
        if value is None or isinstance(value, dict):
            return value
        raise WrongTypeError()

    def zset(self, key: bytes, *, read: bool = True) -> SortedSet | None:
        value = self.lookup(key, read=read)
        if value is None or isinstance(value, SortedSet):
            return value
        raise WrongTypeError()

    def list_at(self, key: bytes, *, read: bool = True) -> deque[bytes] | None:
        value = self.lookup(key, read=read)
        if value is None or isinstance(value, deque):
            return value
        raise WrongTypeError()

    def set_at(self, key: bytes, *, read: bool = True) -> set[bytes] | None:
        value = self.lookup(key, read=read)
        if value is None or isinstance(value, set):
            return value
        raise WrongTypeError()

    def kind(self, key: bytes) -> Kind | None:
        e = self._entry(key)
        return None if e is None else kind_of(e.value)

    def deadline(self, key: bytes) -> int | None:
        """None: no such key; 0: no deadline; else the absolute deadline in ms."""
        e = self._entry(key)
        return None if e is None else e.deadline

    def exists(self, key: bytes) -> bool:
        return self._entry(key) is not None

    def past_deadline(self, key: bytes) -> bool:
        """True when ``key`` is held but its deadline has passed (not removed yet):
        logically gone. Changes nothing (WATCH and EXEC ask)."""
        e = self._data.get(key)
        return e is not None and bool(e.deadline) and e.deadline < self.clock()

    def keys(self, pattern: bytes) -> list[bytes]:
        """Live keys matching ``pattern`` (expired ones are skipped, not removed)."""
        now = self.clock()
        every = matches_all(pattern)
        return [
            k
            for k, e in self._data.items()
            if not (e.deadline and e.deadline < now) and (every or stringmatch(pattern, k))
        ]

    def names(self) -> list[bytes | None] | None:
        """Every key's name now (None for holes), if no key can have expired: a copy
        of the slot table, C-speed, for KEYS to filter in steps; None when some keys
        have a deadline (their liveness is of this instant: use :meth:`keys`)."""
        return None if self.deadlines.count else self._slots.snapshot()

    def scan(
        self, cursor: int, count: int, pattern: bytes | None, kind: str | None
    ) -> tuple[int, list[bytes]]:
        """One SCAN step: about ``count`` slots from ``cursor`` (``scan.py``)."""
        nxt, keys = self._slots.walk(cursor, count)
        now = self.clock()
        out: list[bytes] = []
        expired: list[bytes] = []
        for k in keys:
            e = self._data[k]
            if e.deadline and e.deadline < now:
                expired.append(k)
            elif (pattern is None or stringmatch(pattern, k)) and (
                kind is None or kind_of(e.value) == kind
            ):
                out.append(k)
        if expired:
            self._expire(tuple(expired))
        return nxt, out

    # -- writes ----------------------------------------------------------------------

    def _journal(self, m: KeyMutation) -> None:
        if self.journal is not None:
            self.journal.append(m)
        elif self.changed is not None:
            self.changed(1)
        if self.events is not None:
            self._announce_new(m)

    def _announce_new(self, m: KeyMutation) -> None:
        """Keyspace notifications' ``new``: a write is about to create these keys
        (journaled: it will apply), before the command announces its own event."""
        events = self.events
        assert events is not None
        # (MSET's SetStrings: the command announces each key's new before its set;
        # SMOVE's SetMove too, as Redis announces it after the source's srem.)
        if isinstance(m, (RenameKey, CopyKey)):
            # Redis deletes a destination that exists and adds it again: always new.
            events("new", m.destination)
        elif isinstance(m, ListMove) and m.destination not in self._data:
            events("new", m.destination)
        elif isinstance(m, _CREATING) and m.key not in self._data:
            events("new", m.key)

    def _reserve(self, grow: int, transient: int = 0) -> None:
        # ``transient``: bytes that exist only while the write runs (APPEND's copy of
        # the old value): the budget must have room for them too.
        if grow + transient > 0 and self.budget is not None:
            self.budget(grow + transient)

    def reclaim_fields(self, key: bytes, now: int) -> bool:
        """Remove the hash's fields past their deadline at ``now``, journaled as an
        HDEL so a restart never revives them (a refused record is tolerated, as
        for keys); notifies ``hexpired`` (and ``del`` if the hash went, as Redis
        7.4 does). True when the key went with its last field."""
        fields = self.field_ttls.due(key, now)
        if not fields:
            return False
        try:
            self._journal(DeleteFields(key, tuple(fields)))
        except PionError as exc:
            log.debug("expiring %d hash fields without a log record: %s", len(fields), exc.message)
        self._apply_delete_fields(key, fields)
        self.expired_fields += len(fields)
        gone = key not in self._data
        if self.events is not None:
            self.events("hexpired", key)
            if gone:
                self.events("del", key)
        return gone

    # -- expiry ----------------------------------------------------------------------

    def _expire(self, keys: tuple[bytes, ...]) -> None:
        try:
            self._journal(DeleteKeys(keys, "expire"))
        except PionError as exc:
            # Persistence is failing; the deadlines are durable already, and the way
            # back is a snapshot from memory, which must not hold these keys.
            log.debug("expiring %d keys without a log record: %s", len(keys), exc.message)
        for k in keys:
            self._drop(k, expiring=True)
        self.expired_keys += len(keys)
        if self.events is not None:
            for k in keys:
                self.events("expired", k)
