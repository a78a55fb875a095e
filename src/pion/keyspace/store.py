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

Every change of a key reaches one of the primitives of its base classes,
:class:`~pion.keyspace.primitives.KeyTable` (``primitives.py``) and
:class:`~pion.keyspace.listset.ListSetTable` (``listset.py``) and
:class:`~pion.keyspace.streamtable.StreamTable` (``streamtable.py``), which also tell
WATCH.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from random import Random
from typing import Protocol, TypeAlias, cast

from pion.errors import PionError, WrongTypeError
from pion.keyspace.entries import (
    FIELD_OVERHEAD,
    KEY_OVERHEAD,
    MEMBER_OVERHEAD,
    Entry,
    Kind,
    Value,
    chunks,
    kind_of,
    records,
    value_size,
)
from pion.keyspace.expiry import now_ms
from pion.keyspace.fieldttl import FIELD_TTL_OVERHEAD
from pion.keyspace.glob import matches_all, stringmatch
from pion.keyspace.mutations import (
    CopyKey,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    ListMove,
    ListPush,
    ListReplace,
    NewKey,
    RenameKey,
    ReplaceScores,
    SetAdd,
    SetDeadline,
    SetFields,
    SetFieldTTLs,
    SetRange,
    SetReplace,
    SetScores,
    SetString,
    SetStrings,
    StreamChange,
)
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.streamtable import StreamTable, stream_records
from pion.keyspace.streamtype import Stream

__all__ = ["Budget", "KeyJournal", "Keyspace"]

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


class Keyspace(StreamTable):
    """Plain keys; see the module docstring."""

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        super().__init__(clock)
        # Attached after recovery (replay goes through apply, which never journals).
        self.journal: KeyJournal | None = None
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
        value = self.lookup(key, read=read)
        if value is None or isinstance(value, bytes):
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

    def set_string(self, key: bytes, value: bytes, deadline: int = 0) -> None:
        """SET: ``value`` replaces whatever ``key`` held, with ``deadline`` (0 none)."""
        e = self._data.get(key)
        size = len(key) + len(value) + KEY_OVERHEAD  # value_size() of a string
        self._reserve(size - (e.size if e is not None else 0))
        self._journal(SetString(key, value, deadline))
        self._put(key, value, deadline, size)

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

    def restore(self, key: bytes, value: Value, deadline: int) -> None:
        """RESTORE: ``key`` holds ``value`` (new objects, parsed from a DUMP payload)
        with ``deadline``, replacing whatever it held (the caller checked REPLACE)."""
        e = self._data.get(key)
        self._reserve(value_size(key, value) - (e.size if e is not None else 0))
        batch = list(records(key, value, deadline))
        if e is not None:
            batch.insert(0, DeleteKeys((key,), "del"))
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
