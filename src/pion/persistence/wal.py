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

Failures. A failed write or fsync is never retried and trusted: the log enters a
failed state (``failure`` holds the reason), every further append raises
``MisconfError`` (so the store applies nothing), and only :meth:`reset`, a brand-new
log started right after a full snapshot written from memory, clears it. Records that
were appended but not yet synced when an fsync failed are abandoned: their replies are
withheld by the server, and the next snapshot captures them from memory anyway.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from pion.config import AppendFsync
from pion.errors import MisconfError
from pion.persistence.files import UncertainRename, create_atomically, fdatasync, write_all
from pion.persistence.format import WalHeader, encode_frame, op_of, vstore_payload
from pion.persistence.stores import Frame
from pion.vstore import Mutation

__all__ = ["WriteAheadLog"]

log = logging.getLogger("pion.persistence")

_EVERYSEC_S = 1.0


class WriteAheadLog:
    """Appends to ``pion.vstore.wal.<w>``; see the module docstring."""

    def __init__(self, path: Path, worker: int, policy: AppendFsync) -> None:
        self.path = path
        self.worker = worker
        self.policy = policy
        self.failure: str | None = None
        self.last_seq = 0  # the sequence number of the last record appended
        self.size = 0  # bytes in the file
        self.appended = 0  # records appended by this process
        self._fd = -1
        self._synced = 0  # every record up to this seq is known to be on stable storage
        # Held by the fsync thread while it uses the fd, and by whoever swaps or closes
        # the fd, so the thread never fsyncs a closed (or reused) descriptor.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        self.failure = None

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
        self.append_frame(Frame(op_of(m), vstore_payload(m)))

    def append_frame(self, frame: Frame) -> None:
        """Write one record; raises MisconfError (nothing written is trusted) on failure."""
        if self.failure is not None:
            raise MisconfError(self.refusal())
        if self._fd < 0:
            raise MisconfError("the write-ahead log is not open")
        seq = self.last_seq + 1
        parts, size = encode_frame(seq, frame.op, frame.parts)
        try:
            write_all(self._fd, parts, size)
        except OSError as exc:
            self._fail("write", exc)
            raise MisconfError(self.refusal()) from None
        self.size += size
        self.appended += 1
        # Published last: the fsync thread reads last_seq to know what it has covered.
        self.last_seq = seq

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

    def _fail(self, what: str, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        if self.failure is None:
            log.error("write-ahead log %s failed (%s): %s; refusing writes", what, self.path, exc)
        self.failure = f"{what} of {self.path.name} failed: {reason}"

    def refusal(self) -> str:
        """The MISCONF message (without the code) while failed."""
        return (
            f"Errors writing to the write-ahead log ({self.failure}). Pion refuses "
            "writes until it can persist them again; reads keep working"
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


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        # close() can report a deferred write error; the data it concerns was either
        # fsynced already or is about to be superseded, so it is logged, not raised.
        log.warning("closing a write-ahead log descriptor: %s", exc)
