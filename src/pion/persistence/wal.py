"""The write-ahead log: every durable store's journal, appended before every reply.

Log before reply. A store hands each mutation's record to :meth:`WriteAheadLog.append_frame`
(:meth:`~WriteAheadLog.append` for a V-store mutation) after validating it and before
applying it; ``append`` writes the whole record to the file with
one ``os.writev`` (the payload buffer is handed to the kernel as it is, never copied)
before returning. So once a reply can leave, its record is at least in the kernel's
page cache and survives a crash of this process whatever the fsync policy. What the
policy decides is power loss:

``always``    group commit: :meth:`needs_sync` is true while records are unsynced; the
              server queues replies and calls :meth:`sync` once per loop iteration
              (one fdatasync for every write of that iteration) before sending them.
``everysec``  a background *thread* fdatasyncs every second when records are pending.
              A thread, not a loop timer, because an fsync can block for a long time
              on a busy disk and must never stall the replies of the event loop; the
              GIL is released while the kernel flushes. Power loss costs at most about
              one second (plus one fsync's duration) of acknowledged writes.
``no``        the kernel writes back when it likes (typically within 30 s).

Transactions. Between :meth:`WriteAheadLog.begin_unit` and
:meth:`~WriteAheadLog.end_unit` (one EXEC) appended records are checked as usual and
kept, their payloads copied, instead of written; ``end_unit`` writes them as one TXN
record (``txn_format.py``), so a crash leaves all of them in the log or none. The
stores apply each mutation when it is appended, as outside a unit: memory runs ahead
of the file only while EXEC runs, and nothing can be acknowledged before
``end_unit``. If that one write fails, memory holds changes the log lacks, so the log
is *failed* (not merely blocked, even for lack of room): writes are refused until a
snapshot from memory replaces it.

Failures come in two kinds.

*Out of space* (a write fails with ``ENOSPC`` or ``EDQUOT``): the kernel refused the
bytes, and everything written before them is intact in the page cache. The partial
record the failed ``writev`` may have left is cut off (``ftruncate`` back to the last
whole record, as Redis does with its AOF), and the log is *blocked*: ``blocked`` holds
the reason and ``needed`` the size of the refused record. Appends raise
``MisconfError``, except a drop (a :class:`~pion.persistence.stores.Frame` marked
``drop``: a record that only removes data, of whichever store: ``DEL``, ``FLUSHALL``,
``KV.PREFIX.DROP``, ``SSM.PREFIX.DROP`` ...), which is tried (a drop is small, and
removing data is how an operator makes room). If even the drop cannot be written, it
is applied all the same and the log *fails* (below): the file no longer holds
everything memory does, so it must never be appended to again, and the way back is
the snapshot from memory, which keeps the drop. The file stays
trusted: fsyncs go on, and :meth:`unblock` (called once the file system has room)
resumes appending to the same file. Nothing needs a snapshot.

*Anything else* (an fsync error, an I/O error, a rename that cannot be made durable, a
truncation that fails): the file is never retried and trusted. After a failed fsync the
kernel may have dropped the dirty pages and cleared the error, so a later fsync that
succeeds proves nothing. The log enters a failed state (``failure`` holds the reason),
every further append raises ``MisconfError`` (so the store applies nothing) but a
drop's, which is accepted without being written (``unlogged_drops`` counts them: the
snapshot that ends the failure holds their effect; a crash before it brings the removed
data back, and loses nothing acknowledged as stored), and only :meth:`reset`, a
brand-new log started right after a full snapshot written from memory, clears it.
Records that were appended but not yet synced when an fsync failed are abandoned: their
replies are withheld by the server, and the next snapshot captures them from memory
anyway.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from pion.config import AppendFsync
from pion.errors import MisconfError, PionError
from pion.persistence.files import UncertainRename, create_atomically, fdatasync, write_all
from pion.persistence.format import MAX_PAYLOAD, Buffer, WalHeader, encode_frame
from pion.persistence.stores import FREEING_COMMANDS, Frame
from pion.persistence.txn_format import OP_TXN, inner_head, inner_overhead, txn_head
from pion.persistence.vstore_durable import vstore_frame
from pion.vstore import Mutation

__all__ = ["WriteAheadLog"]

log = logging.getLogger("pion.persistence")

_EVERYSEC_S = 1.0
# Write errors that mean "no room" (the file system or the user's quota is full), after
# which the bytes already written are intact and appending can resume.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
_FREEING = ", ".join(sorted(FREEING_COMMANDS))
# What a TXN adds around its records' payloads: its own header, and one per record.
_TXN_HEAD_BYTES = len(txn_head(0))
_INNER_BYTES = inner_overhead()


class WriteAheadLog:
    """Appends to ``pion.vstore.wal.<w>``; see the module docstring."""

    def __init__(self, path: Path, worker: int, policy: AppendFsync) -> None:
        self.path = path
        self.worker = worker
        self.policy = policy
        self.failure: str | None = None
        self.blocked: str | None = None  # out of space: writes refused, file trusted
        self.needed = 0  # bytes of the record refused for lack of room
        self.last_seq = 0  # the sequence number of the last record appended
        self.size = 0  # bytes in the file
        self.appended = 0  # records appended by this process
        self.unlogged_drops = 0  # drops applied while the log could not take them
        self._warned_unlogged = False  # said so in the server log, since the last reset
        self._fd = -1
        self._synced = 0  # every record up to this seq is known to be on stable storage
        # Held by the fsync thread while it uses the fd, and by whoever swaps or closes
        # the fd, so the thread never fsyncs a closed (or reused) descriptor.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The open unit (an EXEC), None outside one: the TXN payload built as its
        # records come (slot 0 waits for the TXN header, each record's payload copied
        # behind its inner header), how many records it holds, their bytes, and the
        # first one as a plain record (a unit of one record is written as that).
        self._unit: list[Buffer] | None = None
        self._unit_records = 0
        self._unit_bytes = 0
        self._unit_first: tuple[int, list[Buffer]] = (0, [])

    # -- opening ---------------------------------------------------------------------

    def open(self, size: int, last_seq: int) -> None:
        """Continue the existing, already verified log of ``size`` bytes. One fsync
        first: records a killed predecessor left unsynced in the page cache are now
        part of our state, so they must reach stable storage before anything else."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            fdatasync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._install(fd, size, last_seq)

    def reset(self, start: int) -> None:
        """Replace the log by an empty one whose records start at ``start`` (after a
        snapshot that covers ``start - 1``), atomically; clears a failure.

        If this fails before the rename the old log is still in place and in use. A
        failed directory fsync leaves the file name in doubt, so the log is failed."""
        content = WalHeader(self.worker, start).encode()
        try:
            fd = create_atomically(self.path, content, "wal")
        except UncertainRename as exc:
            self._fail("rename", exc)
            raise
        self._install(fd, len(content), start - 1)
        self._warned_unlogged = False
        self.failure = None
        self.blocked = None
        self.needed = 0

    def _install(self, fd: int, size: int, last_seq: int) -> None:
        with self._lock:
            old, self._fd = self._fd, fd
            self.size = size
            self.last_seq = last_seq
            self._synced = last_seq
        if old >= 0:
            _close_quietly(old)

    def start_background(self) -> None:
        """Start the everysec fsync thread (no-op for the other policies)."""
        if self.policy == "everysec" and self._thread is None:
            self._thread = threading.Thread(
                target=self._fsync_loop, name="pion-wal-fsync", daemon=True
            )
            self._thread.start()

    # -- the journal -----------------------------------------------------------------

    def append(self, m: Mutation) -> None:
        """Write one V-store record; see :meth:`append_frame`."""
        self.append_frame(vstore_frame(m))

    def append_frame(self, frame: Frame) -> None:
        """Write one record of any store; raises MisconfError (and the record is not in
        the log) when the log is failed, blocked (but for a client's drop), or the write
        fails."""
        if self.failure is not None:
            if frame.drop:
                self._unlogged_drop()
                return
            raise MisconfError(self.refusal())
        if self._fd < 0:
            raise MisconfError("the write-ahead log is not open")
        if self.blocked is not None and not frame.drop:
            raise MisconfError(self.refusal())
        if self._unit is not None:
            self._keep(self._unit, frame)
            return
        self._write(frame.op, frame.parts, drop=frame.drop)

    def _write(self, op: int, payload: Sequence[Buffer], *, drop: bool = False) -> None:
        seq = self.last_seq + 1
        parts, size = encode_frame(seq, op, payload)
        try:
            write_all(self._fd, parts, size)
        except OSError as exc:
            self._write_failed(exc, size)
            if not drop:
                raise MisconfError(self.refusal()) from None
            # Applied without its record: from here on the file lacks what memory
            # holds, so it is failed, and only a snapshot from memory brings it back.
            self._fail("write of a drop", exc)
            self._unlogged_drop()
            return
        self.size += size
        self.appended += 1
        # Published last: the fsync thread reads last_seq to know what it has covered.
        self.last_seq = seq

    # -- transactions (module docstring) ----------------------------------------------

    def begin_unit(self) -> None:
        """Keep the records appended from now until :meth:`end_unit` (one EXEC)."""
        self._unit = [b""]
        self._unit_records = 0
        self._unit_bytes = 0

    def _keep(self, unit: list[Buffer], frame: Frame) -> None:
        parts = frame.parts
        size = 0
        for p in parts:
            size += len(p) if type(p) is bytes else memoryview(p).nbytes
        grow = size + _INNER_BYTES
        total = self._unit_bytes + grow + _TXN_HEAD_BYTES
        if total > MAX_PAYLOAD:
            raise PionError(
                f"a transaction's writes of {total} bytes exceed the write-ahead log's "
                f"record limit of {MAX_PAYLOAD} bytes; send them in smaller transactions"
            )
        # Payloads are valid only during append (a view of a request buffer or of a
        # layer the next command may change): the unit keeps copies (bytes are
        # immutable: kept as they are).
        copies: list[Buffer] = [p if type(p) is bytes else bytes(p) for p in parts]
        if not self._unit_records:
            self._unit_first = (frame.op, copies)
        unit.append(inner_head(frame.op, size))
        unit += copies
        self._unit_records += 1
        self._unit_bytes += grow

    def end_unit(self) -> None:
        """Write the unit's records as one TXN record (a single record as itself; none:
        nothing). If that write fails the log is failed and MisconfError raised: the
        stores already hold the unit's changes, which only a snapshot can now keep."""
        unit, self._unit = self._unit, None
        records, self._unit_records = self._unit_records, 0
        first, self._unit_first = self._unit_first, (0, [])
        self._unit_bytes = 0
        if unit is None or not records:
            return
        if self.failure is not None:
            raise MisconfError(self.refusal())
        try:
            if records == 1:
                self._write(*first)
            else:
                unit[0] = txn_head(records)
                self._write(OP_TXN, unit)
        except MisconfError:
            if self.failure is None:
                self.failure = (
                    f"a transaction's record could not be written to {self.path.name} "
                    f"({self.blocked or 'write failed'})"
                )
                log.error("write-ahead log %s: %s; refusing writes", self.path, self.failure)
            raise MisconfError(self.refusal()) from None

    # -- durability ------------------------------------------------------------------

    def dirty(self) -> bool:
        return self.last_seq > self._synced

    def needs_sync(self) -> bool:
        return self.policy == "always" and self.dirty()

    def sync(self) -> None:
        """fdatasync everything appended so far; raises MisconfError on failure. In the
        failed state the unsynced records are abandoned (marked done) and it raises:
        their replies must not be sent, and later replies must not wait for them."""
        target = self.last_seq
        if self.failure is not None:
            self._synced = target
            raise MisconfError(self.refusal())
        if target <= self._synced:
            return
        try:
            fdatasync(self._fd)
        except OSError as exc:
            self._fail("fsync", exc)
            self._synced = target
            raise MisconfError(self.refusal()) from None
        self._synced = max(self._synced, target)

    def _fsync_loop(self) -> None:
        while not self._stop.wait(_EVERYSEC_S):
            with self._lock:
                target = self.last_seq
                if self._fd < 0 or self.failure is not None or target <= self._synced:
                    continue
                try:
                    fdatasync(self._fd)
                except OSError as exc:
                    self._fail("fsync", exc)
                    continue
                self._synced = max(self._synced, target)

    def _write_failed(self, exc: OSError, size: int) -> None:
        """Cut the partial record a failed write may have left, then block (no room) or
        fail (anything else, or if the cut itself fails)."""
        try:
            # Not under the lock: the fd stays, and waiting for an everysec fsync here
            # would stall the event loop.
            os.ftruncate(self._fd, self.size)
        except OSError as cut:
            self._fail("truncation after a failed write", cut)
            return
        if exc.errno not in _NO_ROOM:
            self._fail("write", exc)
            return
        free = _free_bytes(self.path)
        if self.blocked is None:
            log.error(
                "write-ahead log %s: no room for a record of %d bytes (%d bytes free on its "
                "file system: %s); refusing writes until there is room, reads and drops "
                "keep working",
                self.path,
                size,
                free,
                exc.strerror or exc,
            )
        self.blocked = f"write of {self.path.name} failed: {exc.strerror or exc}"
        self.needed = max(self.needed, size)

    def unblock(self) -> None:
        """Resume appending after an out-of-space block (the caller saw room)."""
        self.blocked = None
        self.needed = 0

    def _unlogged_drop(self) -> None:
        if not self._warned_unlogged:
            self._warned_unlogged = True
            log.warning(
                "write-ahead log %s cannot be written: removing data anyway (DEL, FLUSHALL, "
                "drops); the snapshot that ends the failure keeps it, a crash before it "
                "brings the removed data back",
                self.path,
            )
        self.unlogged_drops += 1

    def _fail(self, what: str, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        if self.failure is None:
            log.error("write-ahead log %s failed (%s): %s; refusing writes", what, self.path, exc)
        self.failure = f"{what} of {self.path.name} failed: {reason}"

    def refusal(self) -> str:
        """The MISCONF message (without the code) while failed or blocked."""
        if self.failure is None and self.blocked is not None:
            return (
                f"Errors writing to the write-ahead log ({self.blocked}). Pion refuses "
                f"writes until its file system has room for them (the refused record "
                f"needs {self.needed} bytes; {_free_bytes(self.path)} are free) and then "
                f"resumes by itself; reads and the commands that only free space "
                f"({_FREEING}) keep working"
            )
        return (
            f"Errors writing to the write-ahead log ({self.failure}). Pion refuses "
            "writes until it can persist them again; reads and the commands that only "
            f"free space ({_FREEING}) keep working"
        )

    def close(self) -> None:
        """Stop the fsync thread, flush and fsync (unless failed), close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            if self.failure is None and self.last_seq > self._synced:
                fdatasync(fd)
                self._synced = self.last_seq
        except OSError as exc:
            self._fail("fsync at close", exc)
            raise
        finally:
            _close_quietly(fd)


def _free_bytes(path: Path) -> int:
    """Bytes free to us on the file system holding ``path`` (-1 if unknown)."""
    try:
        return int(shutil.disk_usage(path.parent).free)
    except OSError:
        return -1


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        # close() can report a deferred write error; the data it concerns was either
        # fsynced already or is about to be superseded, so it is logged, not raised.
        log.warning("closing a write-ahead log descriptor: %s", exc)
