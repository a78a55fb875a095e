"""The write-behind queue and the thread that drains it into the tier.

One thread per worker applies operations strictly in the order the V-store journaled
them (FIFO), so the tier sees a session's create, stores, block table and drop in
order whatever the write policy. ``--tier-write sync`` only makes the journal wait for
its own operation (:meth:`Writer.wait_done`) while the tier is up.

Failures. An operation that fails because the tier is unreachable stays at the head of
the queue and is retried when :class:`~pion.tier.health.Health` allows (every
operation is idempotent: SETRANGE, "raise to max", SETBIT, create-if-absent, drop). An
operation the tier *refuses* (``TierRejected``: e.g. OOM under ``noeviction``) is not
retried forever: the session is abandoned (no longer written through, its partial copy
dropped) and the queue moves on.

Batches. Stores queued back to back (a pipelined client, or ``--tier-write async``)
are written together: every row chunk of the run in one pipeline, then every
metadata commit in one, each with the generation known when the batch started. A
batch the tier refuses is redone one store at a time, so only the refused session is
given up.

Bounds. The queue holds at most ``queue_max_bytes`` of payload and ``queue_max_ops``
operations (``TierConfig``); :meth:`Writer.offer` refuses beyond them and the caller
marks the session for a resync instead, so memory stays bounded however long the tier
is away. Resync and drop operations are offered with ``force`` (a resync is bounded
by one session; a drop is tiny).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from pion.config import TierConfig
from pion.tier.client import TierIOError, TierRejected
from pion.tier.health import Health
from pion.tier.keys import MAX_LAYERS, MAX_ROWS
from pion.tier.ledger import Ledger
from pion.tier.meta import Layout, TierFormatError
from pion.tier.ops import CheckOp, CreateOp, DropOp, Op, SetBlocksOp, StoreOp, TruncateOp
from pion.tier.remote import Remote

__all__ = ["Writer", "WriterCounters"]

log = logging.getLogger("pion.tier")

# The longest the thread sleeps at once while the tier is down, so stop() is prompt.
_NAP_S = 0.5
# Stores queued back to back are written together: their rows in one pipeline, then
# their metadata in one (two round trips for the run instead of two per store).
_BATCH_OPS = 64
_BATCH_BYTES = 64 << 20


@dataclass
class WriterCounters:
    applied: int = 0  # operations the tier acknowledged
    bytes_out: int = 0  # row bytes written
    rejected: int = 0  # operations the tier refused (the session was abandoned)
    conflicts: int = 0  # sessions the tier holds with another layout
    stale: int = 0  # writes to a session dropped or re-created in the tier meanwhile
    skipped: int = 0  # operations of abandoned or resync-pending sessions
    batched: int = 0  # stores written together with others (Remote.store_many)


class Writer:
    def __init__(self, remote: Remote, health: Health, ledger: Ledger, config: TierConfig):
        self.remote = remote
        self.health = health
        self.ledger = ledger
        self.max_bytes = config.queue_max_bytes
        self.max_ops = config.queue_max_ops
        self.counters = WriterCounters()
        self._cv = threading.Condition()
        self._queue: deque[tuple[int, Op]] = deque()
        self._bytes = 0
        self._next_seq = 1
        self._done_seq = 0
        self._pending: dict[bytes, int] = {}  # sid -> seq of its last queued op
        self._stopping = False
        self._abort = False
        # The tier's (generation, layout) of sessions this thread wrote: thread-local.
        self._known: dict[bytes, tuple[str, Layout]] = {}
        self._known_cap = ledger.capacity
        # Operations to apply one at a time (after a batch the tier refused).
        self._single = 0
        self._thread = threading.Thread(target=self._run, name="pion-tier-writer", daemon=True)

    # -- the loop's side -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def offer(self, op: Op, *, force: bool = False) -> int | None:
        """Queue ``op``; its sequence number, or None when the bound is reached."""
        with self._cv:
            if self._stopping:
                return None
            if not force and (
                self._bytes + op.nbytes > self.max_bytes or len(self._queue) >= self.max_ops
            ):
                return None
            seq = self._next_seq
            self._next_seq += 1
            self._queue.append((seq, op))
            self._bytes += op.nbytes
            self._pending[op.sid] = seq
            self._cv.notify_all()
            return seq

    def wait_done(self, seq: int, timeout: float) -> bool:
        """Wait until operation ``seq`` is applied; False on timeout or when the tier
        goes down meanwhile (the operation stays queued)."""
        with self._cv:
            self._cv.wait_for(lambda: self._done_seq >= seq or not self.health.up, timeout)
            return self._done_seq >= seq

    def wait_sids(self, sids: Iterable[bytes], timeout: float) -> bool:
        """Wait until no operation of ``sids`` is queued; False as for wait_done."""
        wanted = list(sids)
        with self._cv:
            self._cv.wait_for(
                lambda: not any(s in self._pending for s in wanted) or not self.health.up,
                timeout,
            )
            return not any(s in self._pending for s in wanted)

    def pending(self, sid: bytes) -> bool:
        with self._cv:
            return sid in self._pending

    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        with self._cv:
            return self._bytes

    def stop(self, drain_timeout: float) -> int:
        """Drain for up to ``drain_timeout`` seconds, then stop the thread; returns the
        number of operations left undone."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            if self._thread.is_alive():
                self._cv.wait_for(lambda: not self._queue, drain_timeout)
            left = len(self._queue)
            self._abort = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=max(1.0, 2 * self.remote.client.config.timeout))
        self.remote.client.close()
        return left

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._abort and not self._stopping:
                    self._cv.wait()
                if self._abort or not self._queue:
                    return
                batch = self._head()
            if not self.health.available():
                with self._cv:
                    self._cv.wait(min(_NAP_S, max(0.01, self.health.retry_in())))
                continue
            try:
                if len(batch) > 1:
                    self._apply_stores([op for _, op in batch if isinstance(op, StoreOp)])
                else:
                    self._apply(batch[0][1])
            except TierIOError:
                with self._cv:  # wake sync waiters: the tier just went down
                    self._cv.notify_all()
                continue
            except TierRejected as exc:
                if len(batch) > 1:
                    # Which store was refused is not known: redo them one by one, so
                    # only the session refused is given up.
                    self._single = len(batch)
                    continue
                self._give_up(batch[0][1], str(exc))
            except TierFormatError as exc:
                self._give_up(batch[0][1], str(exc))
            except Exception:  # a bug must not stop the queue for good
                log.exception("tier write of %r failed", batch[0][1].sid)
                self._give_up(batch[0][1], "internal error")
            self._single = max(0, self._single - len(batch))
            with self._cv:
                for seq, op in batch:
                    self._queue.popleft()
                    self._bytes -= op.nbytes
                    self._done_seq = seq
                    if self._pending.get(op.sid) == seq:
                        del self._pending[op.sid]
                self._cv.notify_all()

    def _head(self) -> list[tuple[int, Op]]:
        """The operations to apply next (call with the lock held): the head, or the
        run of stores at the head, written together (one pipeline for their rows, one
        for their metadata) up to :data:`_BATCH_OPS` / :data:`_BATCH_BYTES`."""
        first = self._queue[0]
        if self._single or not isinstance(first[1], StoreOp):
            return [first]
        batch = [first]
        size = first[1].nbytes
        for item in itertools.islice(self._queue, 1, _BATCH_OPS):
            if not isinstance(item[1], StoreOp) or size + item[1].nbytes > _BATCH_BYTES:
                break
            batch.append(item)
            size += item[1].nbytes
        return batch

    def _give_up(self, op: Op, why: str) -> None:
        self.counters.rejected += 1
        if isinstance(op, DropOp):
            log.warning("tier refused to drop %r: %s", op.sid, why)
            return
        self._abandon(op.sid, f"the tier refused a write ({why})", drop=True)

    def _abandon(self, sid: bytes, why: str, *, drop: bool) -> None:
        self._known.pop(sid, None)
        if self.ledger.abandon(sid):
            log.warning("session %r is no longer written to the tier: %s", sid, why)
        if drop:
            try:  # a partial copy must not be served to other nodes
                self.remote.drop(sid, None)
            except (TierIOError, TierRejected):
                log.warning("could not drop the tier's partial copy of %r", sid)

    def _apply(self, op: Op) -> None:
        if isinstance(op, DropOp):
            self.remote.drop(op.sid, op.gen)
            self._known.pop(op.sid, None)
        elif isinstance(op, CreateOp):
            self.ledger.readopt(op.sid)
            self._create(op)
        elif isinstance(op, CheckOp):
            self._check(op)
        elif self.ledger.is_abandoned(op.sid) or self.ledger.is_dirty(op.sid):
            self.counters.skipped += 1
            return
        elif isinstance(op, StoreOp):
            self._store(op)
        elif isinstance(op, TruncateOp):
            self._truncate(op)
        else:
            self._set_blocks(op)
        self.counters.applied += 1

    def _create(self, op: CreateOp) -> None:
        gen, layout = self.remote.create(op.sid, op.layout)
        if layout != op.layout:
            self.counters.conflicts += 1
            self._abandon(op.sid, "the tier holds it with another layout", drop=False)
            return
        self._remember(op.sid, gen, layout)

    def _remember(self, sid: bytes, gen: str, layout: Layout) -> None:
        if len(self._known) >= self._known_cap:
            self._known.pop(next(iter(self._known)))
        self._known[sid] = (gen, layout)
        self.ledger.set_gen(sid, gen)

    def _session(self, sid: bytes) -> tuple[str, Layout] | None:
        """The tier's (generation, layout) of ``sid``; None when it is not held there
        (then the session is marked for a resync, or counted stale if dropped)."""
        known = self._known.get(sid)
        if known is not None:
            return known
        meta = self.remote.load(sid)
        if meta is not None:
            self._remember(sid, meta.gen, meta.layout)
            return meta.gen, meta.layout
        if self.remote.tombstone(sid) is not None:
            self.counters.stale += 1  # another node dropped it: do not resurrect it
        elif self.ledger.mark_dirty(sid):
            log.info("the tier lost session %r; it will be pushed again", sid)
        return None

    def _store(self, op: StoreOp) -> None:
        gen = self._store_gen(op)
        if gen is not None:
            self._stored(op, self.remote.store(gen, op))

    def _apply_stores(self, ops: list[StoreOp]) -> None:
        """Several stores at once: each checked as :meth:`_apply` would, in order, then
        all written with the generations known now (:meth:`Remote.store_many`)."""
        ready: list[tuple[str, StoreOp]] = []
        for op in ops:
            if self.ledger.is_abandoned(op.sid) or self.ledger.is_dirty(op.sid):
                self.counters.skipped += 1
                continue
            self.counters.applied += 1
            gen = self._store_gen(op)
            if gen is not None:
                ready.append((gen, op))
        if ready:
            for (_, op), ok in zip(ready, self.remote.store_many(ready), strict=True):
                self._stored(op, ok)
            self.counters.batched += len(ready)

    def _store_gen(self, op: StoreOp) -> str | None:
        """The tier generation ``op`` is written into; None when it must not be (the
        session abandoned or marked for a resync here)."""
        if op.layer >= MAX_LAYERS or op.start + op.count > MAX_ROWS:
            why = f"rows beyond the tier's limits ({MAX_LAYERS} layers, {MAX_ROWS} rows)"
            self._abandon(op.sid, why, drop=True)
            return None
        session = self._session(op.sid)
        if session is None:
            return None
        gen, layout = session
        spec = layout.layer(op.layer)
        if spec is None or layout.codec(op.layer).format_id != op.format_id or spec[1] != op.dim:
            self.counters.conflicts += 1
            self._abandon(op.sid, "the tier holds it with another layout", drop=False)
            return None
        return gen

    def _stored(self, op: StoreOp, ok: bool) -> None:
        if ok:
            self.counters.bytes_out += len(op.data)
        else:
            self._known.pop(op.sid, None)
            self.counters.stale += 1

    def _truncate(self, op: TruncateOp) -> None:
        session = self._session(op.sid)
        if session is None:
            return
        gen, layout = session
        if not self.remote.truncate(op.sid, gen, layout, op.lengths):
            self._known.pop(op.sid, None)
            self.counters.stale += 1

    def _set_blocks(self, op: SetBlocksOp) -> None:
        session = self._session(op.sid)
        if session is None:
            return
        if not self.remote.set_blocks(op.sid, session[0], op.block_size, op.hashes):
            self._known.pop(op.sid, None)
            self.counters.stale += 1

    def _check(self, op: CheckOp) -> None:
        meta = self.remote.load(op.sid)
        if meta is None:
            tomb = self.remote.tombstone(op.sid)
            if tomb is not None:
                # Dropped elsewhere while we were away: LOOKUP will retire our copy.
                self.ledger.set_gen(op.sid, tomb)
            else:
                self.ledger.mark_dirty(op.sid)
            return
        if meta.layout != op.layout:
            self.counters.conflicts += 1
            self._abandon(op.sid, "the tier holds it with another layout", drop=False)
            return
        self._remember(op.sid, meta.gen, meta.layout)
        if any(rows > meta.tpl.get(layer, 0) for layer, rows in op.tpl.items()):
            # We hold rows the tier lacks (writes queued when we stopped): push again.
            self.ledger.mark_dirty(op.sid)
