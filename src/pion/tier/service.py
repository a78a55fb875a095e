"""The worker's view of the tier: what the command handlers and the server call.

:class:`Tier` owns the two connections (the loop's for reads, the writer thread's for
writes), the shared health state, the ledger, the writer and its journal. It is built
with the worker's state and does nothing until :meth:`Tier.start` (after recovery, on
the event loop): then it joins the V-store's journal, checks every recovered session
against the tier, and runs a twice-a-second tick that schedules resyncs.

Hooks (one line each in the handlers):

- :meth:`ensure_local` before a command that needs a session: when a session (or its
  namespace's other half) is not held locally, fill it from the tier. ``required``:
  the command cannot answer without it, so a tier that cannot be asked is an error
  (``TierError``) rather than a silent "not found".
- :meth:`before_lookup` for ``KV.PREFIX.LOOKUP``: checks that a local copy is still
  the tier's (another node may have dropped or replaced the namespace), then fills.
  Never an error: without the tier, LOOKUP answers from the local store.
- :meth:`before_drop` for ``KV.PREFIX.DROP``: drops what only the tier holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from pion.config import TierConfig, VStoreLimits
from pion.errors import NotYet, PionError, TierError
from pion.tier.client import TierClient, TierIOError, TierRejected
from pion.tier.fill import (
    Fill,
    TierIncomplete,
    check_room,
    fill_sessions,
    held_rows,
    plan_fill,
)
from pion.tier.health import Health
from pion.tier.inflight import InFlightFill, streamable
from pion.tier.journal import FanOutJournal, FillGate, TierJournal
from pion.tier.keys import KeyLayout
from pion.tier.ledger import Ledger
from pion.tier.meta import Layout, TierFormatError, TierMeta
from pion.tier.ops import CheckOp, DropOp, op_of
from pion.tier.remote import Remote
from pion.tier.rowread import ABSENT
from pion.tier.writer import Writer
from pion.vstore import MAX_SID_LEN, Mutation, VStore, namespace_of
from pion.vstore.mutations import CreateSession, SnapshotIds, StoreRows, TakeSnapshot
from pion.wire import namespace_sids

__all__ = ["Tier"]

log = logging.getLogger("pion.tier")

_TICK_S = 0.5
# Sessions resynchronised per tick (each is queued whole, bypassing the byte bound).
_RESYNC_PER_TICK = 4
# Fills whose reply streams while they read (inflight.py), at once per worker; one more
# is filled before its command answers. Each holds up to FILL_BATCH_BYTES of rows.
_MAX_IN_FLIGHT = 2


class _NoLog:
    """The WAL of a worker without one (``--no-wal`` keeps a Persistence; this is for
    a V-store with no journal at all)."""

    def append(self, mutation: Mutation) -> None:
        return None


class Tier:
    def __init__(
        self, config: TierConfig, vstore: VStore, limits: VStoreLimits, max_sessions: int
    ) -> None:
        self.config = config
        self.vstore = vstore
        self.keys = KeyLayout(config.prefix)
        self.health = Health()
        self.ledger = Ledger(capacity=max(4 * max_sessions, 4096))
        self.reader = Remote(TierClient(config, self.health), self.keys, limits)
        writer_remote = Remote(TierClient(config, self.health), self.keys, limits)
        self.writer = Writer(writer_remote, self.health, self.ledger, config)
        self.journal = TierJournal(self.writer, self.ledger, self.health, config)
        self.gate: FillGate | None = None  # in front of the WAL once started
        self.hits = 0  # local misses answered by filling from the tier
        self.misses = 0  # local misses the tier could not answer either
        self.bytes_in = 0  # row bytes filled from the tier
        self.invalidations = 0  # local copies retired: dropped/replaced elsewhere
        self.incomplete = 0  # tier copies found incomplete or unreadable
        self.streamed = 0  # fills a fetch replied from while they read (inflight.py)
        self.resyncs = 0
        self._tick_handle: asyncio.TimerHandle | None = None
        self._started = False
        self._backlog = False  # writes queued during an outage: log when drained
        self._inflight: dict[bytes, InFlightFill] = {}  # sid -> its fill being read

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        """Join the V-store's journal, start the writer, queue a check of every
        recovered session, start the tick. Call on the event loop after recovery."""
        vs = self.vstore
        if vs.journal is None:
            vs.journal = self.journal
        else:
            self.gate = FillGate(vs.journal, vs)
            vs.journal = FanOutJournal(self.gate, self.journal)
        self.writer.start()
        # What recovery rebuilt, as records: each session's layout and row counts for
        # its check, and its rollback snapshots for a later V.RESTORE.
        layouts: dict[bytes, Layout] = {}
        rows: dict[bytes, dict[int, int]] = {}
        for m in vs.dump():
            if isinstance(m, CreateSession):
                layouts[m.sid] = Layout.of(m)
            elif isinstance(m, StoreRows):
                held = rows.setdefault(m.sid, {})
                held[m.layer] = max(held.get(m.layer, 0), m.start + m.count)
            elif isinstance(m, TakeSnapshot):
                self.journal.remember_snapshot(m.sid, m.snap_id, m.lengths)
        for sid, layout in layouts.items():
            self.writer.offer(CheckOp(sid, layout, rows.get(sid, {})), force=True)
        self._started = True
        log.info(
            "tier %s (%s writes, prefix %s): checking %d recovered sessions",
            self.reader.client.endpoint.describe(),
            self.config.write,
            self.keys.prefix,
            len(vs),
        )
        self._schedule()

    def _schedule(self) -> None:
        if self._started:
            self._tick_handle = asyncio.get_running_loop().call_later(_TICK_S, self._tick)

    def _tick(self) -> None:
        try:
            depth = self.writer.depth
            if depth and not self.health.up:
                self._backlog = True
            elif not depth and self._backlog and self.health.up:
                self._backlog = False
                log.warning("tier write queue drained")
            if self.ledger.dirty_count and not depth and self.health.up:
                self._resync(self.ledger.take_dirty(_RESYNC_PER_TICK))
        except Exception:
            log.exception("tier tick failed")
        finally:
            self._schedule()

    def _resync(self, sids: Sequence[bytes]) -> None:
        """Replace the tier's copy of ``sids`` by the local one (or drop it when the
        session is no longer held here)."""
        wanted = set(sids)
        for sid in sids:
            self.writer.offer(DropOp(sid), force=True)
        if any(sid in self.vstore for sid in sids):
            for m in self.vstore.dump():
                if not isinstance(m, SnapshotIds) and m.sid in wanted:
                    op = op_of(m)
                    if op is not None:
                        self.writer.offer(op, force=True)
        self.resyncs += len(sids)
        log.info("resynchronising %d session(s) with the tier", len(sids))

    def close(self) -> None:
        """Stop the tick, drain the queue (``drain_timeout``), stop the writer."""
        self._started = False
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        left = self.writer.stop(self.config.drain_timeout)
        self.reader.close()
        if left:
            log.warning(
                "%d tier writes were not drained at shutdown (the local WAL has them; "
                "the sessions are checked against the tier at the next start)",
                left,
            )

    # -- hooks -----------------------------------------------------------------------

    def ensure_local(
        self, sids: Sequence[bytes], *, required: bool, may_wait: bool = False
    ) -> None:
        """Fill ``sids`` (with their namespaces' other halves) from the tier when the
        local V-store does not hold them; see the module docstring. ``may_wait``: the
        rows are read on a thread of their own and :class:`NotYet` raised (the command
        waits, the loop goes on) instead of reading them here."""
        self._settle(sids, may_wait=may_wait)
        plans = self._plan(sids, required=required)
        if not plans:
            return
        if may_wait and self._may_start(plans):
            check_room(self.vstore, plans)
            raise NotYet(self._start_fill(plans).when_read)
        self._fill_now(plans, required=required)

    def _may_start(self, plans: Sequence[Fill]) -> bool:
        """A fill of ``plans`` may be read on its own thread: one read's worth, and
        fewer than _MAX_IN_FLIGHT in flight."""
        return len(set(self._inflight.values())) < _MAX_IN_FLIGHT and streamable(plans)

    def _fill_now(self, plans: Sequence[Fill], *, required: bool) -> None:
        """Read and store ``plans`` before the command answers."""
        try:
            gate = self.gate if self.gate is not None else FillGate(_NoLog(), self.vstore)
            filled = fill_sessions(self.reader, self.vstore, self.journal, gate, plans)
        except Exception as exc:
            self._failed(plans, exc, required=required)
            return
        self._filled(plans, filled)

    def streaming_fill(self, sid: bytes, *, may_wait: bool = False) -> InFlightFill | None:
        """For a fetch of ``sid``: the fill it can stream its reply from (already in
        flight, or started now: ``inflight.py``), or None once ``sid`` is local or
        known absent (the fetch answers from the V-store). Raises as ``ensure_local``
        with ``required``."""
        fill = self._inflight.get(sid)
        if fill is not None:
            return fill
        if sid in self.vstore or not 1 <= len(sid) <= MAX_SID_LEN:
            self.ensure_local((sid,), required=True, may_wait=may_wait)  # its other half
            return None
        self._settle((sid,), may_wait=may_wait)  # the other half's fill, if in flight
        plans = self._plan((sid,), required=True)
        if not plans:
            return None
        if sid not in {p.meta.sid for p in plans} or not self._may_start(plans):
            # Nothing of it to stream, too many reads in flight, or a copy larger
            # than one read: fill here, then answer from the V-store.
            self._fill_now(plans, required=True)
            return None
        check_room(self.vstore, plans)
        try:
            # Every chunk's length first (one small round trip): a copy the cluster
            # evicted part of is refused before any reply goes out, not half-way.
            refs = [ref for p in plans for ref in p.chunks]
            for ref, size in zip(refs, self.reader.sizes([r.name for r in refs]), strict=True):
                held_rows(ref, size or ABSENT)
        except Exception as exc:
            self._failed(plans, exc, required=True)
            return None
        self.streamed += 1
        return self._start_fill(plans)

    def _start_fill(self, plans: Sequence[Fill]) -> InFlightFill:
        """Read ``plans``' rows on a thread of their own; committed on the loop once
        they have all landed (``_commit``), or by the first command that needs them."""
        fill = InFlightFill(plans, self.vstore.limits.max_rows)
        for sid_ in fill.sids:
            self._inflight[sid_] = fill
        loop = asyncio.get_running_loop()

        def on_read(done: InFlightFill) -> None:
            try:
                loop.call_soon_threadsafe(self._commit, done)
            except RuntimeError:  # the loop closed (shutdown): nothing to commit into
                log.debug("a tier fill finished after the event loop closed")

        fill.start(self.reader, on_read)
        return fill

    def _plan(self, sids: Sequence[bytes], *, required: bool) -> list[Fill]:
        """The fills that would bring ``sids`` (and their namespaces' other halves)
        here, read and checked: metas, bitmaps, block tables. Empty when there is
        nothing to fill (held, dirty, absent, or the tier unavailable and not
        ``required``)."""
        vs = self.vstore
        # A sid the V-store could never hold is not looked for either: a client must
        # not make the server send the tier a key as long as its request.
        sids = [sid for sid in sids if 1 <= len(sid) <= MAX_SID_LEN]
        group: list[bytes] = []
        for sid in sids:
            group += [s for s in namespace_of(sid) if s not in vs and s not in group]
        if not group:
            return []
        # Only the sessions asked for make it an error: the other half of a namespace
        # is filled when it can be, but its absence never fails a command.
        required = required and any(s not in vs for s in sids)
        if any(self.ledger.is_dirty(s) for s in group):
            # Our own writes of it never reached the tier: its copy there is stale
            # and is about to be replaced. Not found, as far as this worker knows.
            return []
        present: list[TierMeta] = []
        try:
            if not self.health.available():
                raise TierIOError(
                    f"{self.health.last_error}; next try in {self.health.retry_in():.1f} s"
                )
            if any(self.writer.pending(s) for s in group) and not self.writer.wait_sids(
                group, self.config.sync_timeout
            ):
                raise TierIOError("this worker's own writes of the session are still queued")
            present = [m for m in self.reader.read_metas(group).values() if m is not None]
            if not present:
                self.misses += 1
                return []
            extras = self.reader.read_extras(present)
            return [
                plan_fill(self.keys, meta, bitmap, table)
                for meta, (bitmap, table) in zip(present, extras, strict=True)
            ]
        except Exception as exc:
            self._failed([], exc, required=required, metas=present)
            return []

    def _failed(
        self,
        plans: Sequence[Fill],
        exc: BaseException,
        *,
        required: bool,
        metas: Sequence[TierMeta] = (),
    ) -> None:
        """A fill that could not be made: counted, logged, the tier's copy dropped if
        it is incomplete; raised as the command's error when ``required``, else None."""
        present = [p.meta for p in plans] or list(metas)
        if isinstance(exc, (TierIOError, TierRejected)):
            if required:
                raise TierError(
                    f"session not held here and the tier is unavailable ({exc})"
                ) from None
            return
        if isinstance(exc, (TierIncomplete, TierFormatError)):
            self.incomplete += 1
            name = present[0].sid if present else b"?"
            log.warning("the tier's copy of %r cannot be used: %s", name, exc)
            if isinstance(exc, TierIncomplete):
                for meta in present:  # let a writer store it afresh
                    self.writer.offer(DropOp(meta.sid, meta.gen), force=True)
            if required:
                what = "is incomplete" if isinstance(exc, TierIncomplete) else "cannot be used"
                raise TierError(f"the tier's copy of the session {what} ({exc})") from None
            return
        if isinstance(exc, PionError):
            if required:
                raise exc
            return
        raise exc

    def _filled(self, plans: Sequence[Fill], filled: int) -> None:
        for p in plans:
            self.ledger.set_gen(p.meta.sid, p.meta.gen)
        self.hits += 1
        self.bytes_in += filled
        log.info("filled %d session(s), %d bytes, from the tier", len(plans), filled)

    def _settle(self, sids: Sequence[bytes], *, may_wait: bool = False) -> None:
        """Finish the fills in flight of ``sids``' namespaces first: commit them once
        their rows are in, so the command sees the V-store a completed fill left. One
        still reading: :class:`NotYet` with ``may_wait`` (the command waits, the loop
        goes on), else waited for here."""
        for sid in sids:
            for s in namespace_of(sid) if 1 <= len(sid) <= MAX_SID_LEN else ():
                fill = self._inflight.get(s)
                if fill is not None:
                    if may_wait and not fill.read.is_set():
                        raise NotYet(fill.when_read)
                    fill.read.wait()  # each read of it is bounded by --tier-timeout
                    self._commit(fill)

    def _commit(self, fill: InFlightFill) -> None:
        """A fill's rows have all landed (or its read failed): put them in the V-store,
        unless the command that settled it first already did. On the event loop."""
        if fill.committed:
            return
        fill.committed = True
        for sid in fill.sids:
            if self._inflight.get(sid) is fill:
                del self._inflight[sid]
        if fill.error is None and any(sid in self.vstore for sid in fill.sids):
            # Created here meanwhile (a command that never asks the tier): ours wins.
            log.info("a tier fill of %r was not kept: the session exists here now", min(fill.sids))
            return
        try:
            gate = self.gate if self.gate is not None else FillGate(_NoLog(), self.vstore)
            filled = fill.commit(self.vstore, self.journal, gate)
        except Exception as exc:
            try:
                self._failed(fill.plans, exc, required=False)
            except Exception:
                log.exception("a tier fill failed")
            return
        self._filled(fill.plans, filled)

    def before_lookup(self, ns: bytes, *, may_wait: bool = False) -> None:
        sids = namespace_sids(ns)
        self._settle(sids, may_wait=may_wait)
        self._validate([s for s in sids if s in self.vstore])
        self.ensure_local(sids, required=False, may_wait=may_wait)

    def _validate(self, local: Sequence[bytes]) -> None:
        """Retire local copies the tier says were dropped or replaced elsewhere."""
        if not local or not self.health.available():
            return
        known = {s: g for s in local if (g := self.ledger.gen(s)) is not None}
        check = [s for s in known if not self.writer.pending(s) and not self.ledger.is_dirty(s)]
        if not check:
            return
        try:
            seen = self.reader.probe(check)
        except (TierIOError, TierRejected):
            return
        retire = False
        for sid in check:
            gen, tomb = seen[sid]
            if gen == known[sid]:
                continue
            if gen is not None or tomb == known[sid]:
                retire = True
            elif self.ledger.mark_dirty(sid):
                log.info("the tier lost session %r (evicted?); it will be pushed again", sid)
        if not retire:
            return
        try:
            with self.journal.local_only():
                for sid in namespace_of(check[0]):
                    self.vstore.drop(sid)
        except PionError as exc:
            log.error("could not retire the stale local copy of %r: %s", check[0], exc.message)
            return
        self.invalidations += 1
        log.info("%r was dropped or replaced in the tier elsewhere: local copy retired", check[0])

    def before_drop(self, ns: bytes, *, may_wait: bool = False) -> bool:
        """Drop the halves of ``ns`` that only the tier holds; True when it held one."""
        self._settle(namespace_sids(ns), may_wait=may_wait)
        remote_only = [s for s in namespace_sids(ns) if s not in self.vstore]
        if not remote_only:
            return False
        # Our own queued writes of a half evicted here will create it in the tier: it
        # is held, whatever the tier says now, and the drop must follow them.
        queued = any(self.writer.pending(s) for s in remote_only)
        held: bool | None = None
        if not queued and self.health.available():
            try:
                held = any(gen is not None for gen, _ in self.reader.probe(remote_only).values())
            except (TierIOError, TierRejected):
                held = None
        if held is False:
            return False
        for sid in remote_only:
            self.ledger.clear_dirty(sid)
            self.journal.submit(DropOp(sid), force=True)
        return queued or bool(held)

    # -- reporting -------------------------------------------------------------------

    def stats_pairs(self) -> dict[str, int]:
        """Fields PION.STATS adds after the receipt's sixteen."""
        return {"tier_hits": self.hits, "tier_bytes_in": self.bytes_in}

    def reset_stats(self) -> None:
        self.hits = self.misses = self.bytes_in = 0

    def info_lines(self) -> list[str]:
        w = self.writer.counters
        fields: dict[str, int | str] = {
            "tier_enabled": 1,
            "tier_mode": self.reader.client.mode,
            "tier_nodes": self.reader.client.endpoint.describe(),
            "tier_tls": int(self.reader.client.endpoint.tls),
            "tier_write": self.config.write,
            "tier_prefix": self.keys.prefix,
        }
        fields.update({f"tier_{k}": v for k, v in self.health.fields().items()})
        fields.update(
            {
                "tier_queue_depth": self.writer.depth,
                "tier_queue_bytes": self.writer.queued_bytes,
                "tier_queue_max_bytes": self.config.queue_max_bytes,
                "tier_queue_max_ops": self.config.queue_max_ops,
                "tier_queue_overflows": self.journal.overflows,
                "tier_sync_timeouts": self.journal.sync_timeouts,
                "tier_resync_pending": self.ledger.dirty_count,
                "tier_resyncs": self.resyncs,
                "tier_writes_applied": w.applied,
                "tier_bytes_out": w.bytes_out,
                "tier_writes_rejected": w.rejected,
                "tier_writes_skipped": w.skipped,
                "tier_stale_writes": w.stale,
                "tier_conflicts": w.conflicts,
                "tier_sessions_not_written": self.ledger.abandoned_count,
                "tier_hits": self.hits,
                "tier_misses": self.misses,
                "tier_bytes_in": self.bytes_in,
                "tier_invalidations": self.invalidations,
                "tier_incomplete": self.incomplete,
                "tier_streamed_fills": self.streamed,
                "tier_fills_in_flight": len(set(self._inflight.values())),
            }
        )
        return [f"{k}:{v}" for k, v in fields.items()]
