"""How V-store mutations reach the tier (a journal, like the WAL), and which reach the
WAL.

:class:`FanOutJournal` hands each mutation to several journals in order (the WAL
first: if it refuses, nothing is applied and the tier never hears of it).

:class:`FillGate` stands in front of the WAL. A session filled from the tier is a
cache of the tier's copy: it is *volatile*, not written to the local log (a restart
forgets it and the next request fills it again; writing it would cost a node's disk
every byte it ever read from the tier). The first local write into a volatile session
(rows, a block table) makes it the node's own: the gate logs the whole session first,
then the write, so replay always finds a session before its rows. Evictions and drops
of volatile sessions are not logged (the log never knew them).
:class:`TierJournal` turns a mutation into a writer operation (``ops.op_of``) and
queues it; under ``--tier-write sync`` it then waits for the tier while the tier is up.
It never raises: a tier that is down or slow never fails a write the local V-store
accepted (the contract of ``vstore.journal``: a journal that returns has accepted).

:meth:`TierJournal.local_only` suppresses the tier for changes that must reach the WAL
but not the tier: filling the local V-store *from* the tier, and retiring a local copy
that the tier says was dropped elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pion.config import TierConfig
from pion.tier.health import Health
from pion.tier.ledger import Ledger
from pion.tier.ops import Op, TruncateOp, op_of
from pion.tier.writer import Writer
from pion.vstore import CreateSession, DropSession, Journal, Mutation, VStore
from pion.vstore.mutations import ReleaseSnapshot, RestoreSnapshot, SnapshotIds, TakeSnapshot

__all__ = ["FanOutJournal", "FillGate", "TierJournal"]

Lengths = tuple[tuple[int, int], ...]

log = logging.getLogger("pion.tier")

# At most one "queue full" / "sync timed out" warning per this many seconds.
_WARN_EVERY_S = 10.0


class FanOutJournal:
    """Append to each journal in turn; the first that raises stops the rest."""

    def __init__(self, *journals: Journal) -> None:
        self.journals = journals

    def append(self, mutation: Mutation) -> None:
        for journal in self.journals:
            journal.append(mutation)


class FillGate:
    """The WAL's side of a fill: see the module docstring."""

    def __init__(self, wal: Journal, vstore: VStore) -> None:
        self.wal = wal
        self.vstore = vstore
        self.volatile: set[bytes] = set()
        self._filling = 0

    @contextmanager
    def filling(self, sids: Iterable[bytes]) -> Iterator[None]:
        """While a fill creates and stores ``sids``: their records stay out of the log
        (evictions the fill causes still go in)."""
        self.volatile.update(sids)
        self._filling += 1
        try:
            yield
        finally:
            self._filling -= 1

    def append(self, mutation: Mutation) -> None:
        if isinstance(mutation, SnapshotIds):  # server-wide, no session
            self.wal.append(mutation)
            return
        sid = mutation.sid
        if sid in self.volatile:
            if isinstance(mutation, DropSession):
                self.volatile.discard(sid)
                return
            if self._filling or isinstance(mutation, CreateSession):
                return
            self._materialize(sid)
        self.wal.append(mutation)

    def _materialize(self, sid: bytes) -> None:
        """Log the session as it is now (it is about to change locally)."""
        for record in self.vstore.dump():
            if not isinstance(record, SnapshotIds) and record.sid == sid:
                self.wal.append(record)
        self.volatile.discard(sid)


class TierJournal:
    def __init__(self, writer: Writer, ledger: Ledger, health: Health, config: TierConfig):
        self.writer = writer
        self.ledger = ledger
        self.health = health
        self.sync = config.write == "sync"
        self.sync_timeout = config.sync_timeout
        self._local_only = 0
        # Rollback snapshots' lengths per session (V.SNAPSHOT), for V.RESTORE.
        self._snapshots: dict[bytes, dict[int, tuple[tuple[int, int], ...]]] = {}
        self.overflows = 0
        self.sync_timeouts = 0
        self._warned_at = -_WARN_EVERY_S

    @contextmanager
    def local_only(self) -> Iterator[None]:
        self._local_only += 1
        try:
            yield
        finally:
            self._local_only -= 1

    def append(self, mutation: Mutation) -> None:
        try:
            self._append(mutation)
        except Exception:  # never fail a write the local tier accepted
            log.exception("queueing a tier write of %r failed", getattr(mutation, "sid", b""))

    def remember_snapshot(self, sid: bytes, snap_id: int, lengths: Lengths) -> None:
        held = self._snapshots.setdefault(sid, {})
        held[snap_id] = lengths
        if len(self._snapshots) > self.ledger.capacity:
            del self._snapshots[next(iter(self._snapshots))]

    def _append(self, m: Mutation) -> None:
        if isinstance(m, SnapshotIds):
            return
        sid = m.sid
        if isinstance(m, DropSession):
            self.ledger.forget(sid)  # the local copy is gone, whatever the reason
            self._snapshots.pop(sid, None)
        elif isinstance(m, TakeSnapshot):
            self.remember_snapshot(sid, m.snap_id, m.lengths)
        elif isinstance(m, ReleaseSnapshot):
            self._snapshots.get(sid, {}).pop(m.snap_id, None)
        if self._local_only:
            return
        op: Op | None
        if isinstance(m, RestoreSnapshot):
            lengths = self._snapshots.get(sid, {}).get(m.snap_id)
            if lengths is None:
                # Taken before this process started and not seen since: the local
                # copy after the restore is pushed whole instead.
                self.ledger.mark_dirty(sid)
                return
            op = TruncateOp(sid, lengths)
        else:
            op = op_of(m)
        if op is None:
            return
        if isinstance(m, DropSession):
            # A client's drop supersedes any pending resync of the session.
            self.ledger.clear_dirty(sid)
            self.submit(op, force=True)
        elif self.ledger.is_dirty(sid):
            return  # the resync will carry the session's state as it is then
        elif self.submit(op) is None:
            self.overflows += 1
            self.ledger.mark_dirty(sid)
            self._warn(
                "tier write queue full (%d operations, %d bytes): session %r will be "
                "resynchronised when the tier catches up",
                self.writer.depth,
                self.writer.queued_bytes,
                sid,
            )

    def submit(self, op: Op, *, force: bool = False) -> int | None:
        """Queue ``op``; under sync, wait for it while the tier is up."""
        seq = self.writer.offer(op, force=force)
        if seq is None or not self.sync or not self.health.up:
            return seq
        # Past the timeout the reply goes out anyway; a tier that went down meanwhile
        # is Health's to report, not a slow sync write.
        if not self.writer.wait_done(seq, self.sync_timeout) and self.health.up:
            self.sync_timeouts += 1
            self._warn(
                "a sync tier write waited %.1f s; replying anyway, it stays queued",
                self.sync_timeout,
            )
        return seq

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(message, *args)
