"""Recovery at start: load the snapshot, then replay the write-ahead log over it.

Order and rules:

1. Leftover ``*.tmp`` files of an interrupted save or log reset are removed (the real
   files were never touched before their rename).
2. Each store's snapshot, if any, is loaded (``stores.py``: one file per store). It was
   renamed into place complete, so any damage is corruption and stops startup. Its
   header gives that store's ``covered``. A store whose file is missing starts empty.
   If the log starts at record 1 it was never reset, so it holds that store's whole
   history (the first SAVE crashed between two renames, or never ran): the store
   replays all of it. If the log starts later, a SAVE completed and wrote every
   store's file; so when the V-store's file (which every Pion data directory has) is
   there and another store's is not, that store did not exist then (a directory
   written before it): it counts as covered like the V-store's, with a warning.
3. The log is replayed from its header's ``start``, each record into the store that
   owns its op code. A record with ``seq <=`` its store's ``covered`` is already in
   that store's snapshot (a crash hit between the renames of SAVE and the log's reset)
   and is skipped, never applied twice. A log starting after the oldest ``covered + 1``
   has lost records and stops startup, with one exception: a snapshot file is missing
   and the log holds no records. That is the reset recipe (delete the snapshot after a
   SAVE emptied the log): nothing acknowledged depends on the missing file, so that
   store starts empty, with a warning naming it (``started_empty``). A log whose
   records do need the missing snapshot still stops startup, naming both files and the
   fix. Whatever state recovery ends in, ``Persistence`` then makes it one the next
   start recovers from before it acknowledges anything (``durability.py``,
   "A state the server starts from").
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pion.errors import PionError
from pion.persistence import faults
from pion.persistence.format import WAL_HEADER, FormatError, SnapshotHeader, WalHeader
from pion.persistence.reader import LogDamage, Record, read_records
from pion.persistence.snapshot import SNAPSHOT_HEADER_SIZE, iter_frames
from pion.persistence.stores import DurableStore, FollowsLog, SizesSnapshots
from pion.persistence.txn_format import OP_TXN, decode_txn
from pion.persistence.vstore_durable import VStoreDurable
from pion.vstore import VStore

__all__ = [
    "RecoveryAborted",
    "RecoveryError",
    "RecoveryResult",
    "StoreFile",
    "recover_async",
    "recover_stores_async",
    "recover_stores_sync",
    "recover_sync",
]

log = logging.getLogger("pion.persistence")

WAL_HEADER_SIZE = WAL_HEADER.size + 4
# The store whose snapshot every Pion data directory has had since the first release.
ANCHOR_STORE = "vstore"
_SLICE_S = 0.02
_READ_BUFFER = 1 << 20

# A store and the path of its snapshot file.
StoreFile = tuple[DurableStore, Path]


class RecoveryError(PionError):
    """The data directory cannot be loaded safely; startup stops."""


class RecoveryAborted(Exception):
    """The server was shut down while recovery was running."""


@dataclass
class RecoveryResult:
    covered: int = 0  # the newest log sequence number a snapshot covers
    last_seq: int = 0  # the last sequence number in the recovered state
    snapshot_bytes: int = 0  # all stores' snapshot files together
    snapshot_sessions: int = 0  # V-store sessions loaded from its snapshot
    snapshot_records: int = 0
    # Per store name: the sequence number its snapshot covers, and its units (sessions,
    # keys) after loading it.
    covered_by: dict[str, int] = field(default_factory=dict)
    snapshot_units: dict[str, int] = field(default_factory=dict)
    replayed: int = 0  # log records applied
    skipped: int = 0  # log records already in a snapshot
    foreign: int = 0  # log records of stores not being recovered (V-store-only tools)
    wal_bytes: int = 0  # the log's size after recovery (a torn tail cut off)
    truncated: int = 0  # bytes of torn tail removed
    # What to do with the log now: "continue" appending to it, or "reset" it (missing,
    # shorter than a header, or holding only records every snapshot covers).
    wal_action: str = "reset"
    wal_start: int = 1  # the first record of the log found (its header's start)
    seconds: float = 0.0
    # The snapshot path when there was no snapshot file (the log must then not need one).
    snapshot_missing: Path | None = None
    # Stores started empty by the reset recipe (their file missing, the log empty): the
    # caller writes their empty snapshots before the new log, so the next start finds
    # every file covering the sequence the log continues from.
    started_empty: list[str] = field(default_factory=list)


def _repair_hint(path: Path, offset: int) -> str:
    return (
        f"Startup stopped so that no acknowledged write is dropped silently. Inspect it "
        f"with `pion check-wal {path}`; `pion check-wal --fix {path}` repairs it by "
        f"cutting the log at offset {offset} (everything after is lost)."
    )


def _remove_leftovers(paths: Sequence[Path]) -> None:
    for path in paths:
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            log.warning("removing %s left by an interrupted save", tmp)
            tmp.unlink()


def _load_snapshot(
    store: DurableStore, path: Path, worker: int, res: RecoveryResult
) -> Iterator[None]:
    size = path.stat().st_size
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        try:
            header = SnapshotHeader.decode(f.read(SNAPSHOT_HEADER_SIZE))
        except FormatError as exc:
            raise RecoveryError(f"{path}: {exc.message} (offset 0)") from None
        if header.worker != worker:
            raise RecoveryError(f"{path} belongs to worker {header.worker}, not {worker}")
        # A store that sizes its buffers from the snapshot first (the V-store's sparse
        # runs) loads through its own applier.
        apply = (
            store.snapshot_applier(f, size)
            if isinstance(store, SizesSnapshots)
            else store.apply_frame
        )
        try:
            for rec in iter_frames(f, size, store.unit_ops):
                if rec.op not in store.ops:
                    raise RecoveryError(
                        f"{path}: record at offset {rec.offset} has op code {rec.op}, "
                        f"which is not a {store.name} record: is this file another "
                        "store's snapshot?"
                    )
                try:
                    apply(rec.op, rec.payload)
                except PionError as exc:
                    raise RecoveryError(
                        f"{path}: record at offset {rec.offset} cannot be applied: {exc.message}"
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
    res.covered_by[store.name] = header.covered
    res.snapshot_bytes += size
    res.snapshot_units[store.name] = store.units()


def _cover_missing(missing: list[tuple[str, Path]], log_start: int, res: RecoveryResult) -> None:
    """Step 2's rule for stores without a snapshot file (see the module docstring)."""
    anchor = res.covered_by.get(ANCHOR_STORE)
    for name, _ in missing:
        if log_start > 1 and anchor is not None and name != ANCHOR_STORE:
            log.warning(
                "no snapshot of the %s beside the V-store's (covering record %d) and the "
                "log was reset since: starting it empty, as in a data directory written "
                "before it existed",
                name,
                anchor,
            )
            res.covered_by[name] = anchor
        else:
            res.covered_by[name] = 0


def _replay_log(
    owners: dict[int, DurableStore],
    path: Path,
    worker: int,
    res: RecoveryResult,
    missing: list[tuple[str, Path]],
) -> Iterator[None]:
    size = path.stat().st_size if path.exists() else 0
    header = _read_header(path, size)
    _cover_missing(missing, header.start if header is not None else 1, res)
    covered = {name: res.covered_by.get(name, 0) for name in {s.name for s in owners.values()}}
    oldest = min(covered.values(), default=0)
    newest = max(covered.values(), default=0)
    res.covered = newest
    res.last_seq = newest
    if header is None:
        return
    res.wal_start = header.start
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        if header.worker != worker:
            raise RecoveryError(f"{path} belongs to worker {header.worker}, not {worker}")
        if not _log_follows_snapshots(
            f, path, size, header, oldest=oldest, covered=covered, missing=missing, res=res
        ):
            return
        seq = header.start - 1
        try:
            for rec in read_records(f, WAL_HEADER_SIZE, size, header.start):
                seq = rec.seq
                try:
                    if not _apply_record(owners, covered, rec, res):
                        continue
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
            size = _cut_torn_tail(path, size, exc, res)
    res.wal_bytes = size
    res.last_seq = max(newest, seq)
    # Keep appending to the log unless every snapshot covers all it holds (an
    # interrupted save: finish its reset) or it fell behind them (its tail was lost).
    # After a save interrupted between two stores' renames, the older snapshot still
    # needs the log, so it continues.
    continues = seq > oldest or (seq == oldest and res.skipped == 0)
    res.wal_action = "continue" if continues else "reset"


def _read_header(path: Path, size: int) -> WalHeader | None:
    """The log's header, or None when there is no log to replay."""
    if path.exists() and size < WAL_HEADER_SIZE:
        # The header is written to a temp file, fsynced and renamed into place, so a
        # short one was never a log we appended to.
        log.warning("%s: %d bytes, shorter than a log header; starting a new log", path, size)
    if size < WAL_HEADER_SIZE:
        return None
    with open(path, "rb") as f:
        try:
            return WalHeader.decode(f.read(WAL_HEADER_SIZE))
        except FormatError as exc:
            raise RecoveryError(
                f"{path}: {exc.message} at offset 0. Startup stopped. The header "
                f"cannot be repaired (`pion check-wal {path}` shows what follows it): "
                "restore the log from a backup, or move it away to start from the "
                "snapshot alone (losing the writes logged since)."
            ) from None


def _log_follows_snapshots(
    f: BinaryIO,
    path: Path,
    size: int,
    header: WalHeader,
    *,
    oldest: int,
    covered: dict[str, int],
    missing: list[tuple[str, Path]],
    res: RecoveryResult,
) -> bool:
    """Whether the log's first record follows what the snapshots cover. False: a
    snapshot is missing and the log holds no records, so those stores start empty (a
    warning); a gap that would drop acknowledged writes stops startup."""
    if header.start <= oldest + 1:
        return True
    lost = [p for name, p in missing if covered.get(name, 0) == 0]
    if not lost:
        raise RecoveryError(
            f"{path} starts at record {header.start} but the snapshot covers only up "
            f"to {oldest}: records {oldest + 1}..{header.start - 1} are missing "
            "(was the snapshot replaced by an older one?)"
        )
    files = ", ".join(str(p) for p in lost)
    if _holds_records(f, size, header.start):
        names = " and ".join(p.name for p in lost)
        move = "both" if len(lost) == 1 else "all of"
        raise RecoveryError(
            f"{path} starts at record {header.start}: its records need the snapshot "
            f"{files} (which held records 1..{header.start - 1}), and that file is "
            f"missing. Startup stopped so that no acknowledged write is dropped "
            f"silently. Put {names} back from a backup; or, to start empty on "
            f"purpose, move {move} {names} and {path.name} out of {path.parent}."
        )
    stores = " and ".join(f"an empty {n}" for n, p in missing if p in lost)
    log.warning(
        "%s %s missing and %s holds no records (it starts at record %d): "
        "starting with %s and a new log. If the snapshot was not removed on "
        "purpose, stop the server and put it back before any write.",
        files,
        "is" if len(lost) == 1 else "are",
        path,
        header.start,
        stores.replace("vstore", "V-store"),
    )
    res.started_empty = [n for n, p in missing if p in lost]
    return False


def _cut_torn_tail(path: Path, size: int, exc: LogDamage, res: RecoveryResult) -> int:
    """A damaged record: a torn last write is cut off (returns the log's new size);
    damage anywhere else stops startup."""
    d = exc.damage
    if not d.torn:
        if d.next_valid >= 0:
            where = f"before the end of the log (a valid record follows at offset {d.next_valid})"
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
    return d.offset


def _apply_record(
    owners: dict[int, DurableStore],
    covered: dict[str, int],
    rec: Record,
    res: RecoveryResult,
) -> bool:
    """Apply one log record (a TXN: each of its records in order, txn_format.py);
    False when nothing of it was for this worker's stores or all was covered."""
    seq = rec.seq
    records = decode_txn(rec.payload) if rec.op == OP_TXN else ((rec.op, rec.payload),)
    applied = False
    for inner_op, body in records:
        store = owners.get(inner_op)
        if store is None:
            res.foreign += 1
            continue
        if seq <= covered[store.name]:
            res.skipped += 1
            if isinstance(store, FollowsLog):
                store.skip_frame(inner_op, body)
            continue
        store.apply_frame(inner_op, body)
        applied = True
    return applied


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


def _owners(stores: Sequence[StoreFile]) -> dict[int, DurableStore]:
    owners: dict[int, DurableStore] = {}
    for store, _ in stores:
        for op in store.ops:
            if op in owners:
                raise RecoveryError(f"op code {op} claimed by {owners[op].name} and {store.name}")
            owners[op] = store
    return owners


def _steps(
    stores: Sequence[StoreFile], wal: Path, worker: int, res: RecoveryResult
) -> Iterator[None]:
    _remove_leftovers([*(path for _, path in stores), wal])
    missing: list[tuple[str, Path]] = []
    for store, path in stores:
        if path.exists():
            yield from _load_snapshot(store, path, worker, res)
        else:
            missing.append((store.name, path))
    if missing:
        res.snapshot_missing = missing[0][1]
    for store, _ in stores:
        if isinstance(store, VStoreDurable):
            res.snapshot_sessions = res.snapshot_units.get(store.name, 0)
    yield from _replay_log(_owners(stores), wal, worker, res, missing)


def _vstore_only(store: VStore, snapshot: Path) -> list[StoreFile]:
    return [(VStoreDurable(store), snapshot)]


def recover_stores_sync(stores: Sequence[StoreFile], wal: Path, worker: int = 0) -> RecoveryResult:
    """Recover every store in ``stores`` from its snapshot and the shared log in one go
    (tools, tests, benchmarks). Log records of stores not listed are counted in
    ``foreign`` and not applied."""
    res = RecoveryResult()
    started = time.perf_counter()
    for _ in _steps(stores, wal, worker, res):
        pass
    res.seconds = time.perf_counter() - started
    return res


def recover_sync(store: VStore, snapshot: Path, wal: Path, worker: int = 0) -> RecoveryResult:
    """Recover the V-store alone in one go (tools, tests, benchmarks)."""
    return recover_stores_sync(_vstore_only(store, snapshot), wal, worker)


async def recover_stores_async(
    stores: Sequence[StoreFile],
    wal: Path,
    worker: int,
    stopped: Callable[[], bool],
) -> RecoveryResult:
    """Recover on the running loop, yielding to it every ~20 ms; raises
    RecoveryAborted once ``stopped()`` turns true."""
    res = RecoveryResult()
    started = last = time.perf_counter()
    for _ in _steps(stores, wal, worker, res):
        now = time.perf_counter()
        if now - last >= _SLICE_S:
            await asyncio.sleep(0)
            if stopped():
                raise RecoveryAborted()
            last = time.perf_counter()
    res.seconds = time.perf_counter() - started
    return res


async def recover_async(
    store: VStore,
    snapshot: Path,
    wal: Path,
    worker: int,
    stopped: Callable[[], bool],
) -> RecoveryResult:
    """:func:`recover_stores_async` for the V-store alone."""
    return await recover_stores_async(_vstore_only(store, snapshot), wal, worker, stopped)
