"""Inspecting and repairing log and snapshot files (the library behind
``pion check-wal``, in the spirit of ``redis-check-aof``).

:func:`check_file` reads a file end to end (every CRC, every sequence number, every
payload decoded) and reports what it holds and where the first problem is.
:func:`fix_file` cuts a damaged log at the first bad record, which is what recovery
does by itself for a torn write (an incomplete last record) and refuses to do for
corruption (a complete record that fails its checksum, or damage before the end).
Snapshots are checked but never cut: a snapshot without its END record is useless.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pion.persistence.format import SNAP_MAGIC, WAL_MAGIC, FormatError, SnapshotHeader, WalHeader
from pion.persistence.reader import Damage, LogDamage, read_records
from pion.persistence.recovery import WAL_HEADER_SIZE
from pion.persistence.registry import UNIT_OPS, describe
from pion.persistence.snapshot import SNAPSHOT_HEADER_SIZE, iter_frames

__all__ = ["CheckReport", "check_file", "fix_file"]


@dataclass
class CheckReport:
    path: Path
    kind: str  # "log", "snapshot" or "unknown"
    size: int
    worker: int = -1
    first_seq: int = 0  # log: the header's start; snapshot: the covered sequence
    records: int = 0
    last_seq: int = -1
    counts: Counter[str] = field(default_factory=Counter)
    good_end: int = 0  # offset just past the last good record
    damage: Damage | None = None
    # A problem that --fix cannot repair (bad header, damaged snapshot).
    fatal: str | None = None
    after_damage: int = 0  # valid records found after the damage (lost by --fix)

    @property
    def ok(self) -> bool:
        return self.damage is None and self.fatal is None


def check_file(path: Path) -> CheckReport:
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(8)
        f.seek(0)
        if magic == WAL_MAGIC:
            return _check_log(path, f, size)
        if magic == SNAP_MAGIC:
            return _check_snapshot(path, f, size)
    return CheckReport(path, "unknown", size, fatal=f"not a Pion log or snapshot ({magic!r})")


def _check_log(path: Path, f: BinaryIO, size: int) -> CheckReport:
    rep = CheckReport(path, "log", size)
    try:
        header = WalHeader.decode(f.read(WAL_HEADER_SIZE))
    except FormatError as exc:
        rep.fatal = f"{exc.message} (offset 0)"
        return rep
    rep.worker, rep.first_seq = header.worker, header.start
    rep.good_end = WAL_HEADER_SIZE
    try:
        for rec in read_records(f, WAL_HEADER_SIZE, size, header.start):
            try:
                name = describe(rec.op, rec.payload)
            except FormatError as exc:
                rep.damage = Damage(rec.offset, f"undecodable payload: {exc.message}", False)
                break
            rep.records += 1
            rep.last_seq = rec.seq
            rep.counts[name] += 1
            rep.good_end = rec.end
    except LogDamage as exc:
        rep.damage = exc.damage
    if rep.damage is not None and rep.damage.next_valid >= 0:
        rep.after_damage = _count_from(f, rep.damage.next_valid, size)
    return rep


def _count_from(f: BinaryIO, offset: int, size: int) -> int:
    """Valid records from ``offset`` on (what cutting at an earlier offset loses)."""
    f.seek(offset + 5)
    seq = int.from_bytes(f.read(8), "little")
    n = 0
    try:
        for _ in read_records(f, offset, size, seq):
            n += 1
    except LogDamage:
        pass
    return n


def _check_snapshot(path: Path, f: BinaryIO, size: int) -> CheckReport:
    rep = CheckReport(path, "snapshot", size)
    try:
        header = SnapshotHeader.decode(f.read(SNAPSHOT_HEADER_SIZE))
        rep.worker, rep.first_seq = header.worker, header.covered
        for rec in iter_frames(f, size, UNIT_OPS):
            try:
                name = describe(rec.op, rec.payload)
            except FormatError as exc:
                raise FormatError(f"record at offset {rec.offset}: {exc.message}") from None
            rep.records += 1
            rep.counts[name] += 1
        rep.good_end = size
    except FormatError as exc:
        rep.fatal = exc.message
    return rep


def fix_file(rep: CheckReport) -> int:
    """Cut a damaged log at its first bad record; returns the bytes removed."""
    if rep.kind != "log" or rep.fatal is not None:
        raise FormatError(f"{rep.path}: cannot be repaired ({rep.fatal or rep.kind})")
    if rep.damage is None:
        return 0
    cut = rep.size - rep.damage.offset
    fd = os.open(rep.path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, rep.damage.offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return cut
