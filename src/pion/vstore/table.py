"""The V-store's table of sessions: what every operation on it shares.

The sessions by id, their LRU order (``lru.py``), the byte and token counters, the
journal and the watchers; lookups that read or touch one session; and the primitives
every write, read and eviction goes through (``_get``, ``_touch``, ``_journal``, the
range checks, ``_apply_drop``, the change notices). ``store.py`` says what each
counter means.

WATCH: every mutation of a session (client writes, drops, evictions, rollback) passes
through ``_journal``, which tells ``watchers`` (:mod:`pion.watch`) the session id once
the journal accepted it.

"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from pion.codecs import Codec, get_codec
from pion.config import VStoreLimits
from pion.errors import PionError, SessionNotFoundError
from pion.vstore.journal import Journal
from pion.vstore.lru import GroupLRU
from pion.vstore.mutations import Mutation, SnapshotIds
from pion.vstore.session import Session
from pion.vstore.views import BlockTable, SessionInfo
from pion.watch import Watchers

__all__ = ["SessionTable"]


def _nothing() -> int:
    return 0


def _none_freed(nbytes: int) -> int:
    return 0


class SessionTable:
    """Sessions of K/V rows, without the operations on their rows."""

    def __init__(
        self,
        limits: VStoreLimits,
        max_sessions: int = 256,
        maxmemory: int = 0,
        journal: Journal | None = None,
    ) -> None:
        self.limits = limits
        self.max_sessions = max_sessions
        self.maxmemory = maxmemory  # bytes of vstore_bytes + external_bytes(); 0 = none
        # The rest of used_memory under the same --maxmemory (set by the server:
        # pion.commands.budget), the part of it no eviction frees (the server's
        # startup memory), and whether maxmemory-policy lets namespaces be evicted.
        self.external_bytes: Callable[[], int] = _nothing
        self.fixed_bytes: Callable[[], int] = _nothing
        # Asked to evict other stores' data (keys) for this many bytes when
        # namespaces are not enough; returns the bytes it freed.
        self.evict_others: Callable[[int], int] = _none_freed
        self.evict_for_bytes = True
        # Attached after recovery: replay goes through apply(), which never journals.
        self.journal = journal
        self._sessions: dict[bytes, Session] = {}
        self._lru = GroupLRU()
        self._free_slots: list[int] = []  # heap: the lowest free slot is reused first
        self._next_slot = 0
        self._clock = 0
        self.vstore_bytes = 0
        self.total_tokens = 0
        self.total_fetches = 0
        self.evictions = 0
        # The last rollback snapshot id issued (V.SNAPSHOT); ids only ever grow.
        self.last_snap_id = 0
        # Counts every change of any session's rows (see generation()); never reused.
        self._generation = 0
        # Called with a sid after its rows changed or it was dropped (the V.EXPORT
        # file cache removes stale files at once). A listener must not raise, nor call
        # back into the store.
        self.change_listeners: list[Callable[[bytes], None]] = []
        # Clients watching sessions (WATCH): told by _journal of every mutation.
        self.watchers = Watchers()

    def set_limits(self, *, max_sessions: int | None = None, maxmemory: int | None = None) -> None:
        """Change the limits (CONFIG SET); they are enforced at the next create/write."""
        if max_sessions is not None:
            self.max_sessions = max_sessions
        if maxmemory is not None:
            self.maxmemory = maxmemory

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, sid: object) -> bool:
        return sid in self._sessions

    @property
    def bytes_allocated(self) -> int:
        return sum(lay.allocated for s in self._sessions.values() for lay in s.layers.values())

    def sids(self) -> list[bytes]:
        """Every sid, least recently used first."""
        return [s.sid for s in sorted(self._sessions.values(), key=lambda s: s.clock)]

    def touch(self, sid: bytes) -> bool:
        s = self._sessions.get(sid)
        if s is not None:
            self._touch(s)
        return s is not None

    def describe(self, sid: bytes, *, touch: bool = True) -> SessionInfo:
        s = self._get(sid)
        if touch:
            self._touch(s)
        return s.info()

    def usage(self, sid: bytes, *, touch: bool = True) -> tuple[int, int]:
        """``(layer-0 tpl, stored bytes)`` of a session: what a registry hit credits,
        without building a full :class:`SessionInfo` (LOOKUP's hot path)."""
        s = self._get(sid)
        if touch:
            self._touch(s)
        layer0 = s.layers.get(0)
        return (layer0.tpl if layer0 is not None else 0), s.nbytes

    def hit(self, sid: bytes) -> int:
        """Touch ``sid`` and return its layer-0 ``tpl``: what a registry hit credits,
        with nothing allocated (LOOKUP's hot path; :meth:`usage` also sums bytes)."""
        s = self._get(sid)
        self._touch(s)
        layer0 = s.layers.get(0)
        return layer0.tpl if layer0 is not None else 0

    def hit_pair(self, k: bytes, v: bytes) -> int | None:
        """:meth:`hit` of ``k`` then :meth:`touch` of ``v`` when both are held (a
        namespace's halves: LOOKUP's hot path, in one call); None, nothing touched,
        when either is not."""
        sessions = self._sessions
        sk, sv = sessions.get(k), sessions.get(v)
        if sk is None or sv is None:
            return None
        # _touch() of each, the group's LRU move made once when they share it (a
        # namespace's halves always do).
        clock = self._clock = self._clock + 2
        sk.clock, sv.clock = clock - 1, clock
        self._lru.touch(sk.group)
        if sv.group != sk.group:
            self._lru.touch(sv.group)
        layer0 = sk.layers.get(0)
        return layer0.tpl if layer0 is not None else 0

    def generation(self, sid: bytes) -> int:
        """A number that changes whenever ``sid``'s rows may have changed (a store, a
        restore, a re-create after a drop or an eviction): equal numbers mean the rows
        are the same. Numbers are unique over the store's lifetime, across sessions."""
        return self._get(sid).generation

    def layer_layout(self, sid: bytes, layer: int) -> tuple[int, Codec]:
        """The (dim, codec) a store into ``layer`` uses; raises if it cannot take rows."""
        return self._layout(self._get(sid), layer)

    def blocks(self, sid: bytes, *, touch: bool = True) -> BlockTable | None:
        s = self._get(sid)
        if touch:
            self._touch(s)
        return s.blocks

    def _get(self, sid: bytes) -> Session:
        s = self._sessions.get(sid)
        if s is None:
            raise SessionNotFoundError()
        return s

    def _touch(self, s: Session) -> None:
        self._clock += 1
        s.clock = self._clock
        self._lru.touch(s.group)

    def _journal(self, m: Mutation) -> None:
        if self.journal is not None:
            self.journal.append(m)
        if self.watchers.names and not isinstance(m, SnapshotIds):
            self.watchers.touch(m.sid)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.limits.max_layers:
            raise PionError(f"layer_id out of range (0..{self.limits.max_layers - 1})")

    def _check_rows(self, start: int, end: int) -> None:
        if start < 0 or end <= start:
            raise PionError("invalid range: end must exceed start (>=0)")
        if end > self.limits.max_rows:
            raise PionError(f"rows out of range (end must be <= {self.limits.max_rows})")

    def _layout(self, s: Session, layer: int) -> tuple[int, Codec]:
        self._check_layer(layer)
        lay = s.layers.get(layer)
        if lay is not None:
            return lay.dim, lay.codec
        if s.schema is not None:
            raise PionError(f"layer {layer} is beyond this session's SCHEMA of {len(s.schema)}")
        return s.default_dim, get_codec(s.default_fmt)

    def _apply_drop(self, sid: bytes) -> None:
        s = self._sessions.pop(sid)
        nbytes = s.nbytes
        self.vstore_bytes -= nbytes
        self.total_tokens -= s.rows
        self._lru.remove(s.group, nbytes)
        heapq.heappush(self._free_slots, s.slot)
        self._notify(sid)

    def _changed(self, s: Session) -> None:
        self._generation += 1
        s.generation = self._generation
        self._notify(s.sid)

    def _notify(self, sid: bytes) -> None:
        for listener in self.change_listeners:
            listener(sid)
