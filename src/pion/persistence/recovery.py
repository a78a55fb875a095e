"""Recovery at start: load the snapshot, then replay the write-ahead log over it.

Order and rules:

1. Leftover ``*.tmp`` files of an interrupted save or log reset are removed (the real
   files were never touched before their rename).
2. The snapshot, if any, is loaded. It was renamed into place complete, so any damage
   is corruption and stops startup. Its header gives ``covered``.
3. The log is replayed from its header's ``start``. Records with ``seq <= covered`` are
   already in the snapshot (a crash hit between the snapshot's rename and the log's
   reset) and are skipped, never applied twice. A log starting after ``covered + 1``
   has lost records and stops startup, with one exception: the snapshot file is
   missing and the log holds no records. That is the reset recipe (delete the
   snapshot after a SAVE emptied the log): nothing acknowledged depends on the missing
   file, so the server starts empty, with a warning naming it. A log whose records do
   need the missing snapshot still stops startup, naming both files and the fix (a
   complete first record that fails its checksum counts as a record: it may have been
   acknowledged).
4. A torn write (an incomplete last record, see ``reader.py``) is cut off with a
   warning: it was never wholly fsynced, so never acknowledged under ``always``.
   Corruption (a complete record that fails its checksum, last or not, or damage
   followed by a valid record) stops startup with a message naming the file, the
   offset and ``pion check-wal --fix``.

Where it runs: on the event loop, in slices. The server listens while recovery runs and
answers ``-LOADING`` (``ServerState.loading``); :func:`recover_async` hands the loop
back every ~20 ms so those answers, INFO and SHUTDOWN stay responsive. We chose slices
over a worker thread because the store is a single-owner structure that INFO and
KV.PREFIX.INFO read during loading: on one thread nobody ever sees it half-updated,
and the throughput is the same (reading and CRC are the cost, not the scheduling).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pion.errors import PionError
from pion.persistence import faults
from pion.persistence.format import WAL_HEADER, FormatError, SnapshotHeader, WalHeader
from pion.persistence.format import decode_mutation as _decode
from pion.persistence.reader import LogDamage, read_records
from pion.persistence.snapshot import SNAPSHOT_HEADER_SIZE, iter_snapshot, run_hints
from pion.vstore import StoreRows, VStore

__all__ = ["RecoveryAborted", "RecoveryError", "RecoveryResult", "recover_async", "recover_sync"]

log = logging.getLogger("pion.persistence")

WAL_HEADER_SIZE = WAL_HEADER.size + 4
_SLICE_S = 0.02
_READ_BUFFER = 1 << 20


class RecoveryError(PionError):
    """The data directory cannot be loaded safely; startup stops."""


class RecoveryAborted(Exception):
    """The server was shut down while recovery was running."""


@dataclass
class RecoveryResult:
    covered: int = 0  # the log sequence number the snapshot covers
    last_seq: int = 0  # the last sequence number in the recovered state
    snapshot_bytes: int = 0
    snapshot_sessions: int = 0
    snapshot_records: int = 0
    replayed: int = 0  # log records applied
    skipped: int = 0  # log records already in the snapshot
    wal_bytes: int = 0  # the log's size after recovery (a torn tail cut off)
    truncated: int = 0  # bytes of torn tail removed
    # What to do with the log now: "continue" appending to it, or "reset" it (missing,
    # shorter than a header, or holding only records the snapshot covers).
    wal_action: str = "reset"
    seconds: float = 0.0
    # The snapshot path when there was no snapshot file (the log must then not need one).
    snapshot_missing: Path | None = None


def _repair_hint(path: Path, offset: int) -> str:
    return (
        f"Startup stopped so that no acknowledged write is dropped silently. Inspect it "
        f"with `pion check-wal {path}`; `pion check-wal --fix {path}` repairs it by "
        f"cutting the log at offset {offset} (everything after is lost)."
    )


def _remove_leftovers(paths: tuple[Path, ...]) -> None:
    for path in paths:
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            log.warning("removing %s left by an interrupted save", tmp)
            tmp.unlink()


def _load_snapshot(store: VStore, path: Path, worker: int, res: RecoveryResult) -> Iterator[None]:
    size = path.stat().st_size
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        try:
            header = SnapshotHeader.decode(f.read(SNAPSHOT_HEADER_SIZE))
        except FormatError as exc:
            raise RecoveryError(f"{path}: {exc.message} (offset 0)") from None
        if header.worker != worker:
            raise RecoveryError(f"{path} belongs to worker {header.worker}, not {worker}")
        hints = run_hints(f, size)
        try:
            for offset, m in iter_snapshot(f, size):
                try:
                    if isinstance(m, StoreRows):
                        end = m.start + m.count
                        first = hints.pop((m.sid, m.layer, end), None)
                        if first is not None:
                            store.reserve(m.sid, m.layer, first, end)
                    store.apply(m)
                except PionError as exc:
                    raise RecoveryError(
                        f"{path}: record at offset {offset} cannot be applied: {exc.message}"
                    ) from None
                res.snapshot_records += 1
                faults.fault("replay")
                yield
        except FormatError as exc:
            raise RecoveryError(
                f"{path}: the snapshot is corrupt: {exc.message}. Snapshots are renamed "
                "into place complete, so this is damage on disk, not a crash; restore it "
                "from a backup (or move it away to start from the log alone)."
            ) from None
    res.covered = header.covered
    res.snapshot_bytes = size
    res.snapshot_sessions = len(store)


def _replay_log(store: VStore, path: Path, worker: int, res: RecoveryResult) -> Iterator[None]:
    covered = res.covered
    res.last_seq = covered
    if not path.exists():
        return
    size = path.stat().st_size
    if size < WAL_HEADER_SIZE:
        # The header is written to a temp file, fsynced and renamed into place, so a
        # short one was never a log we appended to.
        log.warning("%s: %d bytes, shorter than a log header; starting a new log", path, size)
        return
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        try:
            header = WalHeader.decode(f.read(WAL_HEADER_SIZE))
        except FormatError as exc:
            raise RecoveryError(
                f"{path}: {exc.message} at offset 0. Startup stopped. The header cannot "
                f"be repaired (`pion check-wal {path}` shows what follows it): restore "
                "the log from a backup, or move it away to start from the snapshot alone "
                "(losing the writes logged since)."
            ) from None
        if header.worker != worker:
            raise RecoveryError(f"{path} belongs to worker {header.worker}, not {worker}")
        if header.start > covered + 1 and res.snapshot_missing is not None:
            if not _holds_records(f, size, header.start):
                log.warning(
                    "%s is missing and %s holds no records (it starts at record %d): "
                    "starting with an empty V-store and a new log. If the snapshot was "
                    "not removed on purpose, stop the server and put it back before "
                    "any write.",
                    res.snapshot_missing,
                    path,
                    header.start,
                )
                return
            missing = res.snapshot_missing
            raise RecoveryError(
                f"{path} starts at record {header.start}: its records need the snapshot "
                f"{missing} (which held records 1..{header.start - 1}), and that file is "
                f"missing. Startup stopped so that no acknowledged write is dropped "
                f"silently. Put {missing.name} back from a backup; or, to start empty on "
                f"purpose, move both {missing.name} and {path.name} out of {path.parent}."
            )
        if header.start > covered + 1:
            raise RecoveryError(
                f"{path} starts at record {header.start} but the snapshot covers only up "
                f"to {covered}: records {covered + 1}..{header.start - 1} are missing "
                "(was the snapshot replaced by an older one?)"
            )
        seq = header.start - 1
        try:
            for rec in read_records(f, WAL_HEADER_SIZE, size, header.start):
                seq = rec.seq
                if seq <= covered:
                    res.skipped += 1
                    continue
                try:
                    store.apply(_decode(rec.op, rec.payload))
                except PionError as exc:
                    raise RecoveryError(
                        f"{path}: record {seq} at offset {rec.offset} cannot be replayed: "
                        f"{exc.message}. The record is intact, so the snapshot and this "
                        "log do not belong together (or this is a Pion bug); startup "
                        "stopped. Moving the log away starts from the snapshot alone."
                    ) from None
                res.replayed += 1
                faults.fault("replay")
                yield
        except LogDamage as exc:
            d = exc.damage
            if not d.torn:
                if d.next_valid >= 0:
                    where = (
                        "before the end of the log (a valid record follows at offset "
                        f"{d.next_valid})"
                    )
                else:
                    where = (
                        "at the end of the log; the record is complete, so it was written "
                        "whole and may have been fsynced and acknowledged: this is damage, "
                        "not a write cut short by a crash"
                    )
                raise RecoveryError(
                    f"{path}: corrupt record at offset {d.offset} ({d.reason}), {where}. "
                    f"{_repair_hint(path, d.offset)}"
                ) from None
            log.warning(
                "%s: torn write at offset %d (%s): cutting the %d bytes a crash left of "
                "the last record. It was never wholly fsynced, so under appendfsync "
                "always it was never acknowledged (under everysec or no it may have been, "
                "and is lost as those policies allow)",
                path,
                d.offset,
                d.reason,
                size - d.offset,
            )
            _truncate(path, d.offset)
            res.truncated = size - d.offset
            size = d.offset
    res.wal_bytes = size
    res.last_seq = max(covered, seq)
    # Keep appending to the log unless it holds only what the snapshot covers (an
    # interrupted save: finish its reset) or fell behind it (its tail was lost).
    continues = seq > covered or (seq == covered and res.skipped == 0)
    res.wal_action = "continue" if continues else "reset"


def _holds_records(f: BinaryIO, size: int, start: int) -> bool:
    """Whether the log holds a record. A torn first record is none: a crash cut it, so
    it was never acknowledged."""
    try:
        for _ in read_records(f, WAL_HEADER_SIZE, size, start):
            return True
    except LogDamage as exc:
        return not exc.damage.torn
    return False


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _steps(
    store: VStore, snapshot: Path, wal: Path, worker: int, res: RecoveryResult
) -> Iterator[None]:
    _remove_leftovers((snapshot, wal))
    if snapshot.exists():
        yield from _load_snapshot(store, snapshot, worker, res)
    else:
        res.snapshot_missing = snapshot
    yield from _replay_log(store, wal, worker, res)


def recover_sync(store: VStore, snapshot: Path, wal: Path, worker: int = 0) -> RecoveryResult:
    """Recover in one go (tools, tests, benchmarks)."""
    res = RecoveryResult()
    started = time.perf_counter()
    for _ in _steps(store, snapshot, wal, worker, res):
        pass
    res.seconds = time.perf_counter() - started
    return res


async def recover_async(
    store: VStore,
    snapshot: Path,
    wal: Path,
    worker: int,
    stopped: Callable[[], bool],
) -> RecoveryResult:
    """Recover on the running loop, yielding to it every ~20 ms; raises
    RecoveryAborted once ``stopped()`` turns true."""
    res = RecoveryResult()
    started = last = time.perf_counter()
    for _ in _steps(store, snapshot, wal, worker, res):
        now = time.perf_counter()
        if now - last >= _SLICE_S:
            await asyncio.sleep(0)
            if stopped():
                raise RecoveryAborted()
            last = time.perf_counter()
    res.seconds = time.perf_counter() - started
    return res
