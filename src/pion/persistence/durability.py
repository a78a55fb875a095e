"""The persistence layer as the server sees it: one :class:`Persistence` per worker
implements ``pion.commands.state.Durability`` and is the journal of every durable
store of the worker (the V-store, the keyspace: ``stores.py``).

It owns the data directory of its worker (an exclusive ``flock`` on
``pion.lock.<w>`` keeps a second server off the same files), recovery at start, the
write-ahead log, snapshots, ``--save-interval`` and the way back from a failure.

A state the server starts from is a state it recovers from. Recovery may end with a
store whose snapshot is missing (the reset recipe: a file deleted on purpose; a lost
file) or older than the log that goes on (the log was lost): such a store starts from
what was there. Before the log is opened and anything is acknowledged, each such store
gets its snapshot written from memory at the last sequence number, so a kill -9 at any
later moment finds every file the continuing log needs, and replays every acknowledged
write (``_write_missing_snapshots``). A log starting at record 1 needs none: it holds
every store's whole history, so a server that never saved pays nothing.

Failure and the way back (the two kinds are described in ``wal.py``).

Out of space: the log is blocked, not failed. Writes answer ``-MISCONF`` (naming the
bytes the refused record needs and the bytes free) and reads keep working; a command
that only frees space (``stores.FREEING_COMMANDS``: DEL, FLUSHALL, the drops ...) is
still tried, since it is small and removing data is how an operator makes room. So the
dispatcher is not asked to refuse writes (:meth:`Persistence.write_refusal` is None):
each mutation, of whichever store, reaches the shared log, which refuses all but drops.
A once-a-second probe unblocks the log when ``statvfs`` reports room for the refused
record plus a margin, and appending resumes on the same file: no snapshot, however much
data the stores hold. If writes fail again right away (a quota ``statvfs`` does not
show), the probe backs off (2, 4 ... 30 s).

Anything else (an fsync, an I/O error, a rename that cannot be made durable): writes
are refused with ``-MISCONF`` by the dispatcher and reads keep working; the commands
that only free space are applied without a record (``wal.py``). The log file is
then never trusted again: after a failed fsync the kernel may have dropped the dirty
pages and cleared the error, so a later fsync that succeeds proves nothing. The only
source of truth left is memory, so the way back is a full snapshot written from memory
followed by a brand-new log. The probe tries that when the file system reports room for
it (free space >= what the stores hold plus a margin; the log says how much that is); a
failed attempt backs off likewise. ``KV.PREFIX.SAVE`` tries it at once (and also ends a
block). Under ``--no-wal`` nothing is promised between snapshots, so a failed snapshot
is reported to its caller and in INFO but does not refuse writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path

from pion.config import ServerConfig
from pion.errors import MisconfError, PionError
from pion.persistence import faults, recovery
from pion.persistence.datadir import (
    lock_dir,
    lock_path,
    snapshot_path,
    store_snapshot_path,
    wal_path,
)
from pion.persistence.format import SnapshotHeader
from pion.persistence.snapshot import write_frames
from pion.persistence.stores import DurableStore, FollowsLog, Frame
from pion.persistence.vstore_durable import VStoreDurable, VStoreJournal
from pion.persistence.wal import WriteAheadLog
from pion.vstore import Mutation, VStore

__all__ = ["NO_WAL", "Persistence"]

log = logging.getLogger("pion.persistence")

_TICK_S = 1.0
_MAX_BACKOFF_S = 30.0
# Room a re-established snapshot needs beyond the stored bytes: headers, records and
# the new log's header, with slack for the file system's own blocks.
_SAVE_MARGIN = 1 << 20
# Room beyond the refused record before a blocked log resumes, so that it does not
# resume only to fill the disk again with the next small write.
_ROOM_MARGIN = 1 << 20
# How often the probe repeats "still no room" in the log while the disk stays full.
_SPACE_LOG_S = 60.0
# Why KV.PREFIX.COMMIT cannot be served under --no-wal.
NO_WAL = "the write-ahead log is disabled (--no-wal); use KV.PREFIX.SAVE for a snapshot"


class Persistence:
    """Durability for one worker; see the module docstring."""

    def __init__(self, config: ServerConfig, store: VStore, *others: DurableStore) -> None:
        """Describe the worker's files; nothing is touched until :meth:`open`.

        ``store`` is the V-store; ``others`` are the worker's other durable stores (the
        keyspace), each with its own snapshot file beside the V-store's."""
        self.dir = Path(config.dir)
        self.worker = config.worker_id
        self.policy = config.appendfsync
        self.save_interval = config.save_interval
        self.store = store
        # Save order: the V-store last, so its file (the one every data directory has)
        # is the newest; recovery handles a crash between any two renames.
        self.stores: tuple[DurableStore, ...] = (*others, VStoreDurable(store))
        names = [s.name for s in self.stores]
        if len(set(names)) != len(names):
            raise ValueError(f"two durable stores share a name: {names}")
        self.snapshot_path = snapshot_path(self.dir, self.worker)
        self.wal_path = wal_path(self.dir, self.worker)
        self._lock_fd = -1
        self.wal = (
            WriteAheadLog(self.wal_path, self.worker, self.policy) if config.wal_enabled else None
        )
        self.loading = True
        self.closed = False
        self.recovered = recovery.RecoveryResult()
        self.changes = 0  # mutations since the last snapshot to the default path
        self.last_save_time = 0
        self.last_save_ok = True
        self.snapshot_bytes = 0
        self._base_seq = 0  # under --no-wal: the sequence number recovery ended at
        self._last_save_mono = time.monotonic()
        self._probe_at = 0.0
        self._backoff = _TICK_S
        self._space_logged = -_SPACE_LOG_S  # monotonic time of the last "no room" line
        self._appended_at_unblock = -1  # WAL appends when it was last unblocked
        self._tick_handle: asyncio.TimerHandle | None = None

    # -- start -----------------------------------------------------------------------

    def open(self) -> None:
        """Take the data directory: create it and lock it, so a second server on the
        same files is refused here, before anything is read. The test-only fault hook
        (``PION_TEST_FAULT``, see :mod:`pion.persistence.faults`) is read here too."""
        faults.install_from_env()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_dir(lock_path(self.dir, self.worker))

    async def recover(self) -> None:
        """Load the snapshot and replay the log (yielding to the loop), then open the
        log and become the store's journal. Raises RecoveryError / RecoveryAborted."""
        res = await recovery.recover_stores_async(
            self._files(), self.wal_path, self.worker, lambda: self.closed
        )
        self._finish_recovery(res)

    def recover_now(self) -> None:
        """:meth:`recover` without an event loop (tools, benchmarks)."""
        self._finish_recovery(
            recovery.recover_stores_sync(self._files(), self.wal_path, self.worker)
        )

    def _files(self, base: Path | None = None) -> list[recovery.StoreFile]:
        """Each store with its snapshot file: the default ones, or beside ``base`` (a
        SAVE to a chosen path writes the V-store there and every other store to
        ``<base>.<name>``)."""
        if base is None:
            return [(s, store_snapshot_path(self.dir, s.name, self.worker)) for s in self.stores]
        return [
            (s, base if s.name == "vstore" else base.with_name(f"{base.name}.{s.name}"))
            for s in self.stores
        ]

    def _finish_recovery(self, res: recovery.RecoveryResult) -> None:
        self.recovered = res
        self.snapshot_bytes = res.snapshot_bytes
        self._base_seq = res.last_seq
        if self.wal is not None:
            self._write_missing_snapshots(res)
            if res.wal_action == "continue":
                self.wal.open(res.wal_bytes, res.last_seq)
            else:
                self.wal.reset(res.last_seq + 1)
                self._log_reset()
            self.wal.start_background()
        for store in self.stores:
            store.attach(self)
        self.loading = False
        # Pion's wording, which operators' log greps look for.
        log.info("WAL replayed: %d records", res.replayed)
        units = ", ".join(f"{n} in the {s}" for s, n in res.snapshot_units.items()) or "nothing"
        log.info(
            "recovered %s from the snapshots (%d bytes) and replayed %d log records in %.3f s",
            units,
            res.snapshot_bytes,
            res.replayed,
            res.seconds,
        )

    def _write_missing_snapshots(self, res: recovery.RecoveryResult) -> None:
        """Make the state recovery ended in one the next start recovers from, before
        anything is acknowledged (see the module docstring).

        The log goes on from record ``start`` (the one found, or a new one after
        ``last_seq``). When that is past 1, the next start needs each store's snapshot
        to cover ``start - 1``; a store whose file is missing (the reset recipe, a lost
        snapshot, a directory written before the store existed) or covers less (its
        log was lost) gets one now, written from memory at ``last_seq``: exactly the
        state it was recovered to, so the records that follow never need a file that
        is gone."""
        start = res.wal_start if res.wal_action == "continue" else res.last_seq + 1
        if start <= 1:
            return  # a log from record 1 holds every store's whole history
        for store, path in self._files():
            covered = res.covered_by.get(store.name, 0)
            if path.exists() and covered >= start - 1:
                continue
            why = f"covered only record {covered}" if path.exists() else "was missing"
            try:
                write_frames(
                    store.frames(), store.unit_ops, path, SnapshotHeader(self.worker, res.last_seq)
                )
            except OSError as exc:
                raise recovery.RecoveryError(
                    f"cannot write the {store.name} snapshot {path} that the log continuing "
                    f"from record {start} needs: {exc.strerror or exc}. Startup stopped "
                    "before accepting any write; free space in the data directory and "
                    "start again"
                ) from None
            res.covered_by[store.name] = res.last_seq
            log.warning(
                "wrote a %s snapshot %s covering record %d (%d units) at startup: its file "
                "%s, and the log goes on from record %d",
                store.name,
                path,
                res.last_seq,
                store.units(),
                why,
                start,
            )

    def start(self) -> None:
        """Start the once-a-second tick (save interval, failure probe) on this loop."""
        self._schedule()

    def _schedule(self) -> None:
        if not self.closed:
            loop = asyncio.get_running_loop()
            self._tick_handle = loop.call_later(_TICK_S, self._tick)

    def _tick(self) -> None:
        try:
            now = time.monotonic()
            wal = self.wal
            if wal is not None and wal.failure is not None:
                if now >= self._probe_at:
                    self._probe()
            elif wal is not None and wal.blocked is not None:
                if now >= self._probe_at:
                    self._probe_room(now)
            elif (
                self.save_interval > 0
                and self.changes
                and now - self._last_save_mono >= self.save_interval
            ):
                try:
                    self.save(None)
                except PionError as exc:
                    log.error("automatic snapshot failed: %s", exc.message)
                    self._last_save_mono = now  # try again after a full interval
        finally:
            self._schedule()

    def _probe(self) -> None:
        need = sum(s.held_bytes() for s in self.stores) + _SAVE_MARGIN
        free = shutil.disk_usage(self.dir).free
        if free < need:
            self._log_no_room("a snapshot of every store (the log failed)", need, free)
            return
        try:
            self.save(None)
        except PionError as exc:
            self._probe_at = time.monotonic() + self._backoff
            log.warning("the log is still failing (%s); next try in %.0f s", exc, self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)
            return
        self._backoff = _TICK_S
        log.warning("persistence restored: snapshot and a new log written; accepting writes")

    def _probe_room(self, now: float) -> None:
        """Unblock an out-of-space log once its file system has room again."""
        wal = self.wal
        if wal is None or wal.blocked is None:
            return
        if 0 <= self._appended_at_unblock < wal.appended:
            self._backoff = _TICK_S  # the last unblock held: writes went through
        need = wal.needed + _ROOM_MARGIN
        free = shutil.disk_usage(self.dir).free
        if free < need:
            self._log_no_room("the refused log record", need, free)
            return
        wal.unblock()
        self._appended_at_unblock = wal.appended
        # Should writes fail again at once (a quota statvfs does not show), wait longer.
        self._probe_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)
        log.warning(
            "write-ahead log %s has room again (%d bytes free, %d needed); accepting writes",
            self.wal_path,
            free,
            need,
        )

    def _log_no_room(self, what: str, need: int, free: int) -> None:
        now = time.monotonic()
        if now - self._space_logged >= _SPACE_LOG_S:
            self._space_logged = now
            log.warning(
                "writes stay refused: %s needs %d bytes free in %s, %d are (checked every second)",
                what,
                need,
                self.dir,
                free,
            )

    # -- the journal -----------------------------------------------------------------

    def append(self, m: Mutation) -> None:
        """The V-store's :class:`~pion.vstore.Journal` (callers that wrap the journal
        hand V-store mutations here)."""
        VStoreJournal(self).append(m)

    @property
    def logging(self) -> bool:
        """Whether records are written (a log is open): without one, a store need not
        build them (``stores.FrameSink``)."""
        return self.wal is not None

    def append_frame(self, frame: Frame) -> None:
        """Every store's :class:`~pion.persistence.stores.FrameSink`: log the record."""
        if self.wal is not None:
            self.wal.append_frame(frame)
        self.changes += 1

    def note_change(self, count: int = 1) -> None:
        """``count`` mutations with no record built (no log): counted all the same."""
        self.changes += count

    def begin_unit(self) -> None:
        """EXEC starts: its records become one log record (``wal.py``)."""
        if self.wal is not None:
            self.wal.begin_unit()

    def end_unit(self) -> None:
        """EXEC ends: write its records as one; MisconfError if the log cannot."""
        if self.wal is not None:
            self.wal.end_unit()

    # -- Durability ------------------------------------------------------------------

    def write_refusal(self) -> str | None:
        # A blocked log (out of space) refuses mutations itself, so that drops can
        # still go through; only a failed log makes the dispatcher refuse every write.
        if self.wal is not None and self.wal.failure is not None:
            return self.wal.refusal()
        return None

    def needs_sync(self) -> bool:
        return self.wal is not None and self.wal.needs_sync()

    def sync(self) -> None:
        """fsync the log up to the last record (group commit, KV.PREFIX.COMMIT)."""
        if self.wal is not None:
            self.wal.sync()

    def commit(self) -> None:
        """KV.PREFIX.COMMIT: everything acknowledged so far is on stable storage when
        this returns; raises PionError under --no-wal, MisconfError when failing."""
        if self.wal is None:
            raise PionError(NO_WAL)
        if self.wal.failure is not None:
            raise MisconfError(self.wal.refusal())
        self.wal.sync()

    def save(self, path: str | None = None) -> None:
        """Snapshot to ``path`` (relative to the data directory; default
        ``pion.vstore.<w>``). Saving to the default path then resets the log, and is
        how a failed log is replaced."""
        if self.loading:
            raise PionError("cannot save while the dataset is loading")
        if self.closed:
            raise PionError("persistence is closed")
        target = self.snapshot_path if path is None else self._resolve(path)
        default = target == self.snapshot_path
        files = self._files(None if default else target)
        if not default:
            for _, other in files:
                self._check_owned(other)
        covered = self.wal.last_seq if self.wal is not None else self._base_seq
        written = units = 0
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            for store, file in files:
                header = SnapshotHeader(self.worker, covered)
                stats = write_frames(store.frames(), store.unit_ops, file, header)
                written += stats.bytes
                units += stats.units
            if default and self.wal is not None:
                self.wal.reset(covered + 1)
                self._log_reset()
        except OSError as exc:
            if default:
                self.last_save_ok = False
            log.error("snapshot to %s failed: %s", target, exc)
            raise PionError(f"snapshot to {target.name} failed: {exc.strerror or exc}") from None
        if default:
            self.changes = 0
            self.last_save_ok = True
            self.last_save_time = int(time.time())
            self._last_save_mono = time.monotonic()
            self.snapshot_bytes = written
        log.info("snapshot %s: %d sessions and keys, %d bytes", target, units, written)

    def _log_reset(self) -> None:
        """Tell the stores whose records depend on the file's earlier ones
        (``stores.FollowsLog``) that the log starts anew."""
        for store in self.stores:
            if isinstance(store, FollowsLog):
                store.log_reset()

    def _resolve(self, relative: str) -> Path:
        # The command checked the text; this is the last line of defence against a
        # path (or a symlink inside the directory) leading out of it.
        root = self.dir.resolve()
        target = (root / relative).resolve()
        if root not in target.parents:
            raise PionError("path must stay inside the data directory")
        if target == self.snapshot_path.resolve():
            return self.snapshot_path
        self._check_owned(target)
        return target

    def _check_owned(self, target: Path) -> None:
        """A chosen SAVE path must not overwrite the log, the lock or another store's
        default snapshot (the V-store's own is simply a default SAVE)."""
        owned = {self.wal_path.resolve(), lock_path(self.dir, self.worker).resolve()}
        owned |= {path.resolve() for _, path in self._files()}
        if target.resolve() in owned:
            raise PionError(
                "path names a file the server owns (the log, its lock or a store's snapshot)"
            )

    def close(self) -> None:
        """Stop the tick, flush and fsync the log, release the directory. A log that
        is failing is first replaced from memory if the disk allows it: under everysec
        the writes acknowledged since its last good fsync exist nowhere else."""
        if self.closed:
            return
        if self.wal is not None and self.wal.failure is not None and not self.loading:
            try:
                self.save(None)
            except PionError as exc:
                log.error(
                    "shutting down with a failed log and no snapshot (%s): writes "
                    "acknowledged since its last good fsync may be lost",
                    exc.message,
                )
        self.closed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        try:
            if self.wal is not None:
                self.wal.close()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def info(self) -> dict[str, int | str]:
        wal = self.wal
        ok = "ok" if wal is None or (wal.failure is None and wal.blocked is None) else "err"
        return {
            "wal_enabled": int(wal is not None),
            "wal_bytes": wal.size if wal is not None else 0,
            "wal_appended": wal.appended if wal is not None else 0,
            "wal_replayed": self.recovered.replayed,
            "wal_seq": wal.last_seq if wal is not None else self._base_seq,
            "appendfsync": self.policy,
            "wal_status": ok,
            # Out of space: the size of the refused record (0 when not blocked).
            "wal_blocked_bytes": wal.needed if wal is not None and wal.blocked else 0,
            # Drops applied while the log could not take them (kept by the next snapshot).
            "wal_unlogged_drops": wal.unlogged_drops if wal is not None else 0,
            "snapshot_bytes": self.snapshot_bytes,
            "recovery_ms": int(self.recovered.seconds * 1000),
            # The Redis names monitoring tools already read.
            "aof_enabled": int(wal is not None),
            "aof_last_write_status": ok,
            "rdb_changes_since_last_save": self.changes,
            "rdb_last_save_time": self.last_save_time,
            "rdb_last_bgsave_status": "ok" if self.last_save_ok else "err",
        }
