"""The on-disk formats of the write-ahead log and the snapshot, byte by byte.

Both files are a fixed header followed by records in one shared framing. Every integer
is little-endian, whatever the host. Tags (magics, op codes, reasons, format ids) are
frozen: a value is never reused or renumbered, and 0 is never assigned, so a zeroed
region can never read as a valid tag.

Write-ahead log ``pion.vstore.wal.<w>`` (header 32 bytes)::

    off  size  field
    0    8     magic       b"\\x93PIONWAL"
    8    2     u16 version 1
    10   2     u16 flags   0 (a reader refuses any bit it does not know)
    12   4     u32 worker  the worker id that owns the file
    16   8     u64 start   the sequence number of the first record this file holds
    24   4     u32 zero    reserved, 0
    28   4     u32 crc32c  of bytes 0..28

The log is created (and reset after a snapshot) by writing this header to a temp file,
fsyncing it and renaming it into place, so a header is never torn.

Snapshot ``pion.vstore.<w>`` (header 40 bytes)::

    0    8     magic       b"\\x93PIONSNP"
    8    2     u16 version 1
    10   2     u16 flags   0
    12   4     u32 worker
    16   8     u64 covered the last log sequence number whose effect the snapshot holds
                           (0: none). Recovery skips log records with seq <= covered,
                           so a crash between the snapshot's rename and the log's reset
                           never applies a record twice.
    24   8     u64 created unix time in milliseconds (informational)
    32   4     u32 zero    reserved, 0
    36   4     u32 crc32c  of bytes 0..36

Record (both files; 21 + len bytes)::

    0    4     u32 len     payload length, <= MAX_PAYLOAD (checked before allocating,
                           and against the bytes left in the file)
    4    1     u8  op      see the op-code ranges below
    5    8     u64 seq     log: consecutive from the header's ``start``;
                           snapshot: the record's ordinal, from 0
    13   4     u32 hcrc    crc32c of bytes 0..13
    17   len   payload
    17+len 4   u32 crc32c  of the payload

The header has its own CRC so that a length is trusted only when it is intact: a bit
flip in a length can never make a reader skip valid records or swallow the tail.

Op-code ranges, one per store, frozen (``stores.py``): 1..15 the V-store (specified in
``vstore_format.py``), 16..31 the plain keyspace (``keyspace_format.py``), 32..46 SSM
and attention state, 47 Redis functions' libraries (``functions_format.py``, which says
why they took the top of the SSM range: a store of their own, and a TXN's inner ops
stop at 47), 48..63 log-only framing records that no store owns (48 TXN, below),
127 END (a snapshot's last record: u64 records before it, u64 units). Every store's
records share this framing and the log's one sequence; each store has its own snapshot
file, ``pion.<store>.<w>``, with the header above; END counts the store's units
(V-store: sessions, opened by CREATE or CREATE_ROPES).

TXN (op 48; ``txn_format.py``), the writes of one EXEC, so that a crash leaves all of
them or none (one record: one sequence number, one payload CRC; a TXN cut short is a
torn last record, dropped at recovery with the whole transaction)::

    0    1     u8  layout  1
    1    4     u32 count   inner records, >= 2 (a unit of one record is written as it)
    5    ...   count x:  u8 op (1..47: a store's op, never TXN or END), u32 len,
                         len bytes: the payload a plain record of that op holds

Recovery applies the inner records in order, each through its store, all under the
TXN's sequence number. Added in version 1 (ops are only added): a reader without it
stops at ``unknown op code 48``.

Version. Both files are version 1, and version 1 is the V-store's ops 1..9, the other
stores' ops (each specified in its own module: ``vstore_format.py``,
``keyspace_format.py``, ``ssm_durable.py``) and END, with their payloads. Ops are only
ever added (never changed or renumbered); a reader meets an op it does not know as a
named error (``unknown op code``), never as a misread. Holes need no new op: a STORE has
always carried its ``start``, so a snapshot of held runs is read by any version 1
reader. The version changes only when an existing layout does.

This module is the framing every store shares; each store's payloads are specified and
coded in its own module. Reading records from files is ``reader.py``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, cast

import google_crc32c

from pion.errors import PionError

__all__ = [
    "END",
    "MAX_PAYLOAD",
    "RECORD_HEAD",
    "RECORD_OVERHEAD",
    "SNAPSHOT_CHUNK",
    "SNAPSHOT_HEADER",
    "SNAP_MAGIC",
    "VERSION",
    "WAL_HEADER",
    "WAL_MAGIC",
    "Buffer",
    "FormatError",
    "SnapshotHeader",
    "WalHeader",
    "crc32c",
    "encode_end",
    "encode_frame",
    "record_head",
]

Buffer: TypeAlias = bytes | bytearray | memoryview

WAL_MAGIC: Final = b"\x93PIONWAL"
SNAP_MAGIC: Final = b"\x93PIONSNP"
VERSION: Final = 1

END: Final = 127
# One record's payload. A STOREBATCH is one record and is bounded by the protocol's
# bulk limit (512 MB, Redis's proto-max-bulk-len); 1 GiB leaves room for metadata and
# still bounds what a damaged length could make a reader allocate.
MAX_PAYLOAD: Final = 1 << 30
# Snapshot pieces of a layer: big enough that per-record overhead vanishes, small
# enough that a 3 GB layer never needs one 3 GB read buffer.
SNAPSHOT_CHUNK: Final = 64 << 20

WAL_HEADER: Final = struct.Struct("<8sHHIQI")  # + u32 crc = 32 bytes
SNAPSHOT_HEADER: Final = struct.Struct("<8sHHIQQI")  # + u32 crc = 40 bytes
RECORD_HEAD: Final = struct.Struct("<IBQ")  # + u32 hcrc = 17 bytes
_U32: Final = struct.Struct("<I")
RECORD_OVERHEAD: Final = RECORD_HEAD.size + 8  # hcrc and payload crc

_END: Final = struct.Struct("<QQ")

# Records up to this size whose payload is all bytes are joined into one buffer: a
# copy this small costs less than a list of views and a writev.
_JOIN_BELOW = 16 << 10

# google_crc32c's C extension parses its argument with "y#", which refuses anything
# with a buffer-release hook (memoryview, numpy, bytearray): only bytes. Large buffers
# are fed as cache-sized bytes slices, so no payload is ever copied whole.
_CRC_SLICE = 256 << 10


class FormatError(PionError):
    """A header or payload that does not follow this specification."""


def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``."""
    if isinstance(data, bytes):
        return int(google_crc32c.extend(crc, data))
    view = memoryview(data).cast("B")
    for i in range(0, len(view), _CRC_SLICE):
        crc = google_crc32c.extend(crc, bytes(view[i : i + _CRC_SLICE]))
    return crc


# -- headers -----------------------------------------------------------------------


def _check_header(raw: bytes, magic: bytes, size: int, what: str) -> tuple[int, ...]:
    if len(raw) < size:
        raise FormatError(f"{what} header is truncated ({len(raw)} of {size} bytes)")
    if raw[:8] != magic:
        raise FormatError(f"not a Pion {what} (bad magic {raw[:8]!r})")
    (crc,) = _U32.unpack_from(raw, size - 4)
    if crc32c(raw[: size - 4]) != crc:
        raise FormatError(f"{what} header checksum mismatch")
    fields: tuple[int, ...] = struct.unpack_from(
        "<HHIQQI" if magic == SNAP_MAGIC else "<HHIQI", raw, 8
    )
    version, flags = fields[0], fields[1]
    if version != VERSION:
        raise FormatError(f"{what} version {version} is not supported (this build reads 1)")
    if flags != 0:
        raise FormatError(f"{what} header has unknown flags {flags:#x}")
    return fields


@dataclass(frozen=True, slots=True)
class WalHeader:
    worker: int
    start: int

    def encode(self) -> bytes:
        raw = WAL_HEADER.pack(WAL_MAGIC, VERSION, 0, self.worker, self.start, 0)
        return raw + _U32.pack(crc32c(raw))

    @classmethod
    def decode(cls, raw: bytes) -> WalHeader:
        fields = _check_header(raw, WAL_MAGIC, WAL_HEADER.size + 4, "write-ahead log")
        return cls(worker=fields[2], start=fields[3])


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    worker: int
    covered: int
    created_ms: int = 0

    def encode(self) -> bytes:
        created = self.created_ms or int(time.time() * 1000)
        raw = SNAPSHOT_HEADER.pack(SNAP_MAGIC, VERSION, 0, self.worker, self.covered, created, 0)
        return raw + _U32.pack(crc32c(raw))

    @classmethod
    def decode(cls, raw: bytes) -> SnapshotHeader:
        fields = _check_header(raw, SNAP_MAGIC, SNAPSHOT_HEADER.size + 4, "snapshot")
        return cls(worker=fields[2], covered=fields[3], created_ms=fields[4])


# -- records -----------------------------------------------------------------------


def record_head(length: int, op: int, seq: int) -> bytes:
    """The 17-byte record header (length, op, seq, header CRC)."""
    raw = RECORD_HEAD.pack(length, op, seq)
    return raw + _U32.pack(crc32c(raw))


def encode_frame(seq: int, op: int, payload: Sequence[Buffer]) -> tuple[list[Buffer], int]:
    """The buffers of one record whose payload is ``payload`` concatenated, ready for
    ``os.writev``, and their total size. The payload buffers are passed through as
    they are (checksummed in place), never joined or copied; only a small record made
    of ``bytes`` is joined into one buffer (one write, no views)."""
    small = True
    length = 0
    for piece in payload:
        if isinstance(piece, bytes):
            length += len(piece)
        else:
            length += memoryview(piece).nbytes
            small = False
    if length > MAX_PAYLOAD:
        raise PionError(
            f"a single write of {length} bytes exceeds the write-ahead log's record "
            f"limit of {MAX_PAYLOAD} bytes; send it in smaller batches"
        )
    if small and length <= _JOIN_BELOW:
        pieces = cast("Sequence[bytes]", payload)  # all bytes: checked above
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        record = record_head(length, op, seq) + body + _U32.pack(crc32c(body))
        return [record], RECORD_OVERHEAD + length
    crc = 0
    parts: list[Buffer] = [record_head(length, op, seq)]
    for piece in payload:
        if memoryview(piece).nbytes:
            crc = crc32c(piece, crc)
            parts.append(piece)
    parts.append(_U32.pack(crc))
    return parts, RECORD_OVERHEAD + length


def encode_end(seq: int, records: int, sessions: int) -> bytes:
    payload = _END.pack(records, sessions)
    return record_head(len(payload), END, seq) + payload + _U32.pack(crc32c(payload))


def decode_end(payload: Buffer) -> tuple[int, int]:
    if len(payload) != _END.size:
        raise FormatError(f"END payload of {len(payload)} bytes (want {_END.size})")
    records, sessions = _END.unpack(payload)
    return int(records), int(sessions)
