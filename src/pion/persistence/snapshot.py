"""Snapshots: a whole store in one file, written atomically, read back fast.

Writing (``KV.PREFIX.SAVE``, ``SHUTDOWN SAVE``, ``--save-interval``)::

    1. open   <path>.tmp                  (O_TRUNC, mode 0600)
    2. write  header, then every record   (each write checked; short writes continued)
    3. fsync  the temp file
    4. rename <path>.tmp -> <path>        (atomic: readers see the old or the new file)
    5. fsync  the directory               (makes the rename durable)

and only then may the caller reset the log (``wal.py``). A failure at steps 1-4 removes
the temp file and leaves the previous snapshot and the log as they were. Records are
the store's own records (its :meth:`~pion.persistence.stores.DurableStore.frames`; for
the V-store, ``VStore.dump``) in the framing of ``format.py``: the same decoder and the
same replay path serve the log and the snapshot, and a layer's rows (a key's value) go
out as views of the live buffers, never copied. Each store has its own file; the
generic writer and reader here serve them all, and the END record counts the store's
units (sessions, keys). The store is read on the event-loop
thread, so the snapshot is a consistent cut at one log sequence number; it blocks the
worker for about the time the disk takes to absorb the bytes (like Redis's ``SAVE``).

Writing only the held runs of each layer (``VStore.dump``) keeps holes out of the
file: a row written at 199,999 of an empty layer is one row in the snapshot.

Reading: payloads go straight from the file into numpy buffers (``reader.py``) and
through the store's ``apply_frame`` (``VStore.apply`` for the V-store). A V-store run
larger than one piece arrives highest rows first; a sizing pass over the record headers
(:func:`run_hints`, through ``VStoreDurable.snapshot_applier``) finds where each such
run starts, so its buffer is allocated exactly once (``VStore.reserve``) and later
pieces never reallocate it.
A snapshot is renamed into place complete, so unlike the log it is never torn: any
damage is corruption and stops startup.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pion.persistence import faults
from pion.persistence.files import fsync_dir, write_all
from pion.persistence.format import (
    END,
    MAX_PAYLOAD,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    SNAPSHOT_CHUNK,
    SNAPSHOT_HEADER,
    Buffer,
    FormatError,
    SnapshotHeader,
    crc32c,
    decode_end,
    encode_end,
    encode_frame,
)
from pion.persistence.reader import LogDamage, Record, read_records
from pion.persistence.stores import Frame
from pion.persistence.vstore_format import (
    OP_STORE,
    STORE_PREFIX,
    VSTORE_UNIT_OPS,
    decode_mutation,
    op_of,
    store_span,
    vstore_payload,
)
from pion.vstore import Mutation, StoreRows, VStore

__all__ = [
    "SNAPSHOT_HEADER_SIZE",
    "VSTORE_UNIT_OPS",
    "SnapshotStats",
    "iter_frames",
    "iter_snapshot",
    "run_hints",
    "vstore_frames",
    "write_frames",
    "write_snapshot",
]

SNAPSHOT_HEADER_SIZE = SNAPSHOT_HEADER.size + 4
# Small records are gathered and written together; large payloads go out on their own.
_FLUSH_BYTES = 1 << 20
_FLUSH_PARTS = 512  # well under IOV_MAX (1024 on Linux)
# A V-store snapshot's unit is a session, opened by its CREATE record.


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    path: Path
    covered: int
    units: int  # sessions, keys: what the END record counts
    records: int
    bytes: int


def _pieces(m: Mutation) -> Iterator[Mutation]:
    """``m``, with a layer's rows split into records of at most SNAPSHOT_CHUNK bytes,
    highest rows first (see the module docstring)."""
    if not isinstance(m, StoreRows) or m.count <= 1:
        yield m
        return
    data = memoryview(m.data).cast("B")
    row_bytes = len(data) // m.count
    per = max(1, SNAPSHOT_CHUNK // max(1, row_bytes))
    for first in reversed(range(0, m.count, per)):
        n = min(per, m.count - first)
        chunk = data[first * row_bytes : (first + n) * row_bytes]
        yield StoreRows(m.sid, m.layer, m.start + first, n, m.format_id, m.dim, chunk)


def vstore_frames(store: VStore) -> Iterator[Frame]:
    """The V-store's snapshot records: ``VStore.dump`` in pieces."""
    for m in store.dump():
        for piece in _pieces(m):
            yield Frame(op_of(piece), vstore_payload(piece))


class _Writer:
    """Batches small buffers into one writev; every write is checked."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.parts: list[Buffer] = []
        self.pending = 0
        self.written = 0

    def add(self, parts: list[Buffer], size: int) -> None:
        self.parts.extend(parts)
        self.pending += size
        if self.pending >= _FLUSH_BYTES or len(self.parts) >= _FLUSH_PARTS:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            self.written += write_all(self.fd, self.parts, self.pending)
            self.parts, self.pending = [], 0


def write_frames(
    frames: Iterable[Frame], unit_ops: frozenset[int], path: Path, header: SnapshotHeader
) -> SnapshotStats:
    """Write a store's records to ``path`` atomically (steps 1-5 of the module
    docstring); ``unit_ops`` are the ops the END record counts."""
    tmp = path.with_name(path.name + ".tmp")
    faults.fault("snapshot_open")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        out = _Writer(fd)
        raw = header.encode()
        out.add([raw], len(raw))
        out.flush()
        faults.fault("snapshot_write")
        records = units = 0
        for frame in frames:
            units += frame.op in unit_ops
            parts, size = encode_frame(records, frame.op, frame.parts)
            out.add(parts, size)
            records += 1
        end = encode_end(records, records, units)
        out.add([end], len(end))
        out.flush()
        faults.fault("snapshot_fsync")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        faults.fault("snapshot_rename")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    faults.fault("snapshot_fsync_dir")
    fsync_dir(path.parent)
    return SnapshotStats(path, header.covered, units, records + 1, out.written)


def write_snapshot(store: VStore, path: Path, header: SnapshotHeader) -> SnapshotStats:
    """Write the V-store to ``path`` atomically."""
    return write_frames(vstore_frames(store), VSTORE_UNIT_OPS, path, header)


def iter_frames(f: BinaryIO, size: int, unit_ops: frozenset[int]) -> Iterator[Record]:
    """The records of an open snapshot positioned after its header, END excluded;
    raises FormatError (with the offset) on any damage, a missing END record, an END
    whose counts (records, and units opened by ``unit_ops``) disagree with the file,
    or bytes after it. Large payloads are views valid until the next record."""
    offset = SNAPSHOT_HEADER_SIZE
    units = 0
    try:
        for rec in read_records(f, offset, size, 0, snapshot=True):
            if rec.op == END:
                records, want_units = decode_end(rec.payload)
                if records != rec.seq or want_units != units:
                    raise FormatError(
                        f"END at offset {rec.offset} counts {records} records and "
                        f"{want_units} units, the file holds {rec.seq} and {units}"
                    )
                if rec.end != size:
                    raise FormatError(f"{size - rec.end} bytes after END at offset {rec.end}")
                return
            units += rec.op in unit_ops
            yield rec
    except LogDamage as exc:
        d = exc.damage
        raise FormatError(f"damaged record at offset {d.offset}: {d.reason}") from None
    raise FormatError(f"no END record: the snapshot is incomplete ({size} bytes)")


def run_hints(f: BinaryIO, size: int) -> dict[tuple[bytes, int, int], int]:
    """For each run of a layer stored in two or more pieces, ``(sid, layer, end) ->
    start``: the rows its pieces (highest first) will fill. Reads only record headers
    and the fixed fields of STOREs; stops quietly at the first header it cannot trust
    (the loading pass then reports it). Hints only size buffers: the rows themselves
    are checked when they are loaded."""
    spans: dict[tuple[bytes, int], list[tuple[int, int]]] = {}
    offset = SNAPSHOT_HEADER_SIZE
    head_size = RECORD_HEAD.size + 4
    while offset + head_size <= size:
        f.seek(offset)
        head = f.read(head_size)
        if len(head) < head_size or crc32c(head[:-4]) != int.from_bytes(head[-4:], "little"):
            break
        length, op, _ = RECORD_HEAD.unpack_from(head)
        if length > MAX_PAYLOAD:
            break
        if op == OP_STORE:
            span = store_span(f.read(min(length, STORE_PREFIX)))
            if span is not None:
                sid, layer, start, count = span
                spans.setdefault((sid, layer), []).append((start, start + count))
        offset += RECORD_OVERHEAD + length
    hints: dict[tuple[bytes, int, int], int] = {}
    for (sid, layer), pieces in spans.items():
        end, start, count = -1, -1, 0
        for lo, hi in [*pieces, (-1, -1)]:
            if count and hi == start:  # the next piece down of the same run
                start, count = lo, count + 1
                continue
            if count > 1:
                hints[(sid, layer, end)] = start
            end, start, count = hi, lo, 1
    return hints


def iter_snapshot(f: BinaryIO, size: int) -> Iterator[tuple[int, Mutation]]:
    """The (offset, mutation) pairs of an open V-store snapshot positioned after its
    header; raises FormatError as :func:`iter_frames` does, and for a record that is
    not a V-store mutation."""
    for rec in iter_frames(f, size, VSTORE_UNIT_OPS):
        try:
            m = decode_mutation(rec.op, rec.payload)
        except FormatError as exc:
            raise FormatError(f"record at offset {rec.offset}: {exc.message}") from None
        yield rec.offset, m
