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
    4    1     u8  op      see OPS below
    5    8     u64 seq     log: consecutive from the header's ``start``;
                           snapshot: the record's ordinal, from 0
    13   4     u32 hcrc    crc32c of bytes 0..13
    17   len   payload
    17+len 4   u32 crc32c  of the payload

The header has its own CRC so that a length is trusted only when it is intact: a bit
flip in a length can never make a reader skip valid records or swallow the tail.

Op codes and payloads. ``sid`` is ``[u16 n][n bytes]``, n in 1..MAX_SID_LEN; ``fmt``
is a u8 id of :mod:`pion.codecs.registry` (frozen there)::

    1  CREATE  sid, u32 default_dim, u8 default_fmt, u16 n (0: uniform session),
               then n x (u8 fmt, u32 dim) for a SCHEMA session of n layers
    2  STORE   sid, u16 layer, u32 start, u32 count, u8 fmt, u32 dim, u64 nbytes,
               then nbytes of rows already in the stored format (replay never
               quantizes again); nbytes must equal the rest of the payload
    3  DROP    sid, u8 reason (1 a client drop, 2 an LRU/budget eviction)
    4  BLOCKS  sid, u32 block_size, u32 count, then count x u64 hashes in token order
    5  VSNAP   sid, u64 snap_id, u16 n, then n x (u16 layer, u32 length): a rollback
               snapshot (V.SNAPSHOT) recording each layer's length
    6  VRESTORE  sid, u64 snap_id: V.RESTORE, every layer cut back to that snapshot
    7  VCOMMIT sid, u64 snap_id: V.COMMIT, the snapshot released
    8  SNAPIDS u64 last: the last rollback snapshot id issued (no sid). Written at the
               start of a snapshot file, so ids stay increasing across a restart even
               when no live snapshot carries the highest one
    9  CREATE_ROPES  as CREATE, but each schema entry is (u8 fmt, u32 dim, u32 rope),
               n >= 1; written instead of CREATE when some layer has a rope (format
               bf16_rope_fp8_body), so logs without such layers are unchanged
    48 TXN     log only: the records of one EXEC as a single record (below)
    127 END    snapshot only, last: u64 records before it, u64 sessions
    10..15     reserved for the V-store; 16..31 the keyspace; 32..47 SSM/attention;
               48..63 log-only framing records (no store owns them)

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

Op-code ranges, one per store, frozen (``stores.py``): 1..15 the V-store (above),
16..31 the plain keyspace (specified in ``keyspace_format.py``), 32..47 SSM and
attention state, 48..63 log-only framing (TXN), 127 END. Every store's records share
this framing and the log's one sequence; each store has its own snapshot file,
``pion.<store>.<w>``, with the header above; END counts the store's units (V-store:
sessions, opened by CREATE or CREATE_ROPES).

A V-store snapshot is SNAPIDS (when an id was ever issued), then per session in LRU
order (least recent first, so loading restores the order): CREATE (or CREATE_ROPES),
one or more STOREs per layer holding the layer's held runs of rows (holes, rows never
written, are not written), each run in pieces of at most SNAPSHOT_CHUNK bytes, highest
rows first; BLOCKS when the session has a table; one VSNAP per live rollback snapshot;
then END and end of file. VSNAP follows the rows, so loading it only records lengths.

Version. Both files are version 1, and version 1 is the V-store's ops 1..9, the other
stores' ops (specified in their own modules, e.g. ``ssm_durable.py``) and END, with
their payloads. Ops are only ever added (never changed or renumbered); a reader meets
an op it does not know as a named error (``unknown op code``), never as a misread.
Holes need no new op: a STORE has always carried its ``start``, so a snapshot of held
runs is read by any version 1 reader. The version changes only when an existing layout
does.

Records hold no Python objects; this module turns them into the store's mutations
(:mod:`pion.vstore.mutations`) and back. Reading them from files is ``reader.py``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, cast

import google_crc32c

from pion.codecs import format_id_of, format_name
from pion.errors import PionError
from pion.vstore import (
    MAX_SID_LEN,
    CreateSession,
    DropSession,
    Mutation,
    ReleaseSnapshot,
    RestoreSnapshot,
    SetBlocks,
    SnapshotIds,
    StoreRows,
    TakeSnapshot,
)
from pion.vstore.mutations import DropReason

__all__ = [
    "END",
    "MAX_PAYLOAD",
    "OPS",
    "RECORD_HEAD",
    "RECORD_OVERHEAD",
    "SNAPSHOT_CHUNK",
    "SNAPSHOT_HEADER",
    "SNAP_MAGIC",
    "VERSION",
    "VSTORE_UNIT_OPS",
    "WAL_HEADER",
    "WAL_MAGIC",
    "Buffer",
    "FormatError",
    "SnapshotHeader",
    "WalHeader",
    "crc32c",
    "decode_mutation",
    "encode_end",
    "encode_frame",
    "encode_record",
    "op_of",
    "store_span",
    "vstore_payload",
]

Buffer: TypeAlias = bytes | bytearray | memoryview

WAL_MAGIC: Final = b"\x93PIONWAL"
SNAP_MAGIC: Final = b"\x93PIONSNP"
VERSION: Final = 1

OP_CREATE: Final = 1
OP_STORE: Final = 2
OP_DROP: Final = 3
OP_BLOCKS: Final = 4
OP_VSNAP: Final = 5
OP_VRESTORE: Final = 6
OP_VCOMMIT: Final = 7
OP_SNAPIDS: Final = 8
OP_CREATE_ROPES: Final = 9
END: Final = 127
# The V-store records that open a unit (a session) in its snapshot.
VSTORE_UNIT_OPS: Final = frozenset({OP_CREATE, OP_CREATE_ROPES})
OPS: Final = {
    OP_CREATE: "CREATE",
    OP_STORE: "STORE",
    OP_DROP: "DROP",
    OP_BLOCKS: "BLOCKS",
    OP_VSNAP: "VSNAP",
    OP_VRESTORE: "VRESTORE",
    OP_VCOMMIT: "VCOMMIT",
    OP_SNAPIDS: "SNAPIDS",
    OP_CREATE_ROPES: "CREATE_ROPES",
}

_REASONS: Final[dict[DropReason, int]] = {"drop": 1, "evict": 2}
_REASON_NAMES: Final[dict[int, DropReason]] = {v: k for k, v in _REASONS.items()}

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

_SID: Final = struct.Struct("<H")
_CREATE: Final = struct.Struct("<IBH")
_SCHEMA_ENTRY: Final = struct.Struct("<BI")
_STORE: Final = struct.Struct("<HIIBIQ")
_DROP: Final = struct.Struct("<B")
_BLOCKS: Final = struct.Struct("<II")
_END: Final = struct.Struct("<QQ")
_SCHEMA_ROPE_ENTRY: Final = struct.Struct("<BII")
_SNAP: Final = struct.Struct("<QH")
_SNAP_LAYER: Final = struct.Struct("<HI")
_SNAP_ID: Final = struct.Struct("<Q")

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


def _sid(sid: bytes) -> bytes:
    if not 1 <= len(sid) <= MAX_SID_LEN:
        raise FormatError(f"session id of {len(sid)} bytes (want 1..{MAX_SID_LEN})")
    return _SID.pack(len(sid)) + sid


def _fmt_id(name: str) -> int:
    try:
        return format_id_of(name)
    except KeyError:
        raise FormatError(f"unknown format {name!r}") from None


def op_of(m: Mutation) -> int:
    if isinstance(m, CreateSession):
        return OP_CREATE if m.ropes is None else OP_CREATE_ROPES
    if isinstance(m, StoreRows):
        return OP_STORE
    if isinstance(m, DropSession):
        return OP_DROP
    if isinstance(m, SetBlocks):
        return OP_BLOCKS
    if isinstance(m, TakeSnapshot):
        return OP_VSNAP
    if isinstance(m, RestoreSnapshot):
        return OP_VRESTORE
    if isinstance(m, ReleaseSnapshot):
        return OP_VCOMMIT
    return OP_SNAPIDS


def _encode_create(m: CreateSession) -> bytes:
    schema = m.schema or ()
    fixed = _sid(m.sid) + _CREATE.pack(m.default_dim, _fmt_id(m.default_fmt), len(schema))
    if m.ropes is None:
        return fixed + b"".join(_SCHEMA_ENTRY.pack(_fmt_id(f), d) for f, d in schema)
    if not schema or len(m.ropes) != len(schema):
        raise FormatError(f"{len(m.ropes)} ropes for a schema of {len(schema)} layers")
    entries = (
        _SCHEMA_ROPE_ENTRY.pack(_fmt_id(f), d, r) for (f, d), r in zip(schema, m.ropes, strict=True)
    )
    return fixed + b"".join(entries)


def _encode_rollback(m: Mutation) -> bytes:
    """The payload of VSNAP, VRESTORE, VCOMMIT and SNAPIDS records."""
    if isinstance(m, TakeSnapshot):
        head = _sid(m.sid) + _SNAP.pack(m.snap_id, len(m.lengths))
        return head + b"".join(_SNAP_LAYER.pack(layer, n) for layer, n in m.lengths)
    if isinstance(m, RestoreSnapshot | ReleaseSnapshot):
        return _sid(m.sid) + _SNAP_ID.pack(m.snap_id)
    if isinstance(m, SnapshotIds):
        return _SNAP_ID.pack(m.last)
    raise FormatError(f"no record for {type(m).__name__}")


def _encode_payload(m: Mutation) -> tuple[bytes, memoryview | None]:
    """The payload as (fixed part, bulk data or None); the bulk is never copied."""
    if isinstance(m, CreateSession):
        return _encode_create(m), None
    if isinstance(m, StoreRows):
        data = memoryview(m.data).cast("B")
        fixed = _STORE.pack(m.layer, m.start, m.count, m.format_id, m.dim, len(data))
        return _sid(m.sid) + fixed, data
    if isinstance(m, DropSession):
        return _sid(m.sid) + _DROP.pack(_REASONS[m.reason]), None
    if not isinstance(m, SetBlocks):
        return _encode_rollback(m), None
    hashes = memoryview(m.hashes).cast("B")
    if len(hashes) % 8:
        raise FormatError(f"block hashes of {len(hashes)} bytes (not a multiple of 8)")
    return _sid(m.sid) + _BLOCKS.pack(m.block_size, len(hashes) // 8), hashes


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


def vstore_payload(m: Mutation) -> list[Buffer]:
    """The payload of a V-store mutation's record as buffers (bulk data as a view)."""
    fixed, bulk = _encode_payload(m)
    return [fixed] if bulk is None or not len(bulk) else [fixed, bulk]


def encode_record(seq: int, m: Mutation) -> tuple[list[Buffer], int]:
    """The buffers of one V-store record, ready for ``os.writev``, and their total
    size. Bulk data (STORE rows, BLOCKS hashes) is passed through as a view, not
    copied."""
    return encode_frame(seq, op_of(m), vstore_payload(m))


def encode_end(seq: int, records: int, sessions: int) -> bytes:
    payload = _END.pack(records, sessions)
    return record_head(len(payload), END, seq) + payload + _U32.pack(crc32c(payload))


def decode_end(payload: Buffer) -> tuple[int, int]:
    if len(payload) != _END.size:
        raise FormatError(f"END payload of {len(payload)} bytes (want {_END.size})")
    records, sessions = _END.unpack(payload)
    return int(records), int(sessions)


class _Cursor:
    """Bounds-checked reads over one payload; every overrun is a FormatError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        if self.pos + st.size > len(self.buf):
            raise FormatError("payload is shorter than its fields")
        out: tuple[int, ...] = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return out

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise FormatError(f"payload is shorter than its {n}-byte field")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def sid(self) -> bytes:
        (n,) = self.unpack(_SID)
        if not 1 <= n <= MAX_SID_LEN:
            raise FormatError(f"session id length {n} (want 1..{MAX_SID_LEN})")
        return bytes(self.take(n))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise FormatError(f"{len(self.buf) - self.pos} trailing payload bytes")


def _fmt_name(format_id: int) -> str:
    try:
        return format_name(format_id)
    except KeyError:
        raise FormatError(f"unknown format id {format_id}") from None


def _decode_create_ropes(sid: bytes, cur: _Cursor) -> CreateSession:
    default_dim, fmt, n = cur.unpack(_CREATE)
    if n == 0:
        raise FormatError("CREATE_ROPES without a schema")
    entries = [cur.unpack(_SCHEMA_ROPE_ENTRY) for _ in range(n)]
    schema = tuple((_fmt_name(f), d) for f, d, _ in entries)
    ropes = tuple(r for _, _, r in entries)
    return CreateSession(sid, default_dim, _fmt_name(fmt), schema, ropes)


def _decode_snapshot(sid: bytes, cur: _Cursor) -> TakeSnapshot:
    snap_id, n = cur.unpack(_SNAP)
    lengths = tuple(
        (layer, length) for layer, length in (cur.unpack(_SNAP_LAYER) for _ in range(n))
    )
    return TakeSnapshot(sid, snap_id, lengths)


def decode_mutation(op: int, payload: Buffer) -> Mutation:
    """The mutation a record holds. STORE rows and BLOCKS hashes are views of
    ``payload`` (no copy): keep ``payload`` alive while the mutation is used."""
    cur = _Cursor(memoryview(payload).cast("B"))
    m: Mutation
    if op == OP_SNAPIDS:
        (last,) = cur.unpack(_SNAP_ID)
        cur.done()
        return SnapshotIds(last)
    sid = cur.sid()
    if op == OP_CREATE:
        default_dim, fmt, n = cur.unpack(_CREATE)
        entries: Sequence[tuple[int, ...]] = [cur.unpack(_SCHEMA_ENTRY) for _ in range(n)]
        schema = tuple((_fmt_name(f), d) for f, d in entries) if n else None
        m = CreateSession(sid, default_dim, _fmt_name(fmt), schema)
    elif op == OP_CREATE_ROPES:
        m = _decode_create_ropes(sid, cur)
    elif op == OP_VSNAP:
        m = _decode_snapshot(sid, cur)
    elif op == OP_VRESTORE:
        m = RestoreSnapshot(sid, cur.unpack(_SNAP_ID)[0])
    elif op == OP_VCOMMIT:
        m = ReleaseSnapshot(sid, cur.unpack(_SNAP_ID)[0])
    elif op == OP_STORE:
        layer, start, count, fmt, dim, nbytes = cur.unpack(_STORE)
        _fmt_name(fmt)
        m = StoreRows(sid, layer, start, count, fmt, dim, cur.take(nbytes))
    elif op == OP_DROP:
        (reason,) = cur.unpack(_DROP)
        if reason not in _REASON_NAMES:
            raise FormatError(f"unknown drop reason {reason}")
        m = DropSession(sid, _REASON_NAMES[reason])
    elif op == OP_BLOCKS:
        block_size, count = cur.unpack(_BLOCKS)
        m = SetBlocks(sid, block_size, cur.take(count * 8))
    else:
        raise FormatError(f"unknown op code {op}")
    cur.done()
    return m


# The most bytes of a STORE payload that hold its fixed fields (sid, layer, rows).
STORE_PREFIX: Final = _SID.size + MAX_SID_LEN + _STORE.size


def store_span(prefix: Buffer) -> tuple[bytes, int, int, int] | None:
    """``(sid, layer, start, count)`` from the first bytes (up to :data:`STORE_PREFIX`)
    of a STORE payload, or None when they do not parse. Reads no rows and checks no
    CRC: for sizing hints only (``snapshot.run_hints``)."""
    try:
        cur = _Cursor(memoryview(prefix).cast("B"))
        sid = cur.sid()
        layer, start, count, _, _, _ = cur.unpack(_STORE)
    except FormatError:
        return None
    return sid, layer, start, count
