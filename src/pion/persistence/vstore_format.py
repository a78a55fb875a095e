"""The V-store's records (op codes 1..15) in the log and in ``pion.vstore.<w>``, byte
by byte, and their mutations (:mod:`pion.vstore.mutations`) and back.

Framing, headers and CRCs are ``format.py``'s; every integer is little-endian and op
codes are frozen (never reused, never renumbered).

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
    10..15     reserved for the V-store

A V-store snapshot is SNAPIDS (when an id was ever issued), then per session in LRU
order (least recent first, so loading restores the order): CREATE (or CREATE_ROPES),
one or more STOREs per layer holding the layer's held runs of rows (holes, rows never
written, are not written), each run in pieces of at most SNAPSHOT_CHUNK bytes, highest
rows first; BLOCKS when the session has a table; one VSNAP per live rollback snapshot;
then END and end of file. VSNAP follows the rows, so loading it only records lengths.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from pion.codecs import format_id_of, format_name
from pion.persistence.format import Buffer, FormatError, encode_frame
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
    "OPS",
    "VSTORE_UNIT_OPS",
    "decode_mutation",
    "encode_record",
    "op_of",
    "store_span",
    "vstore_payload",
]

OP_CREATE: Final = 1
OP_STORE: Final = 2
OP_DROP: Final = 3
OP_BLOCKS: Final = 4
OP_VSNAP: Final = 5
OP_VRESTORE: Final = 6
OP_VCOMMIT: Final = 7
OP_SNAPIDS: Final = 8
OP_CREATE_ROPES: Final = 9
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

_SID: Final = struct.Struct("<H")
_CREATE: Final = struct.Struct("<IBH")
_SCHEMA_ENTRY: Final = struct.Struct("<BI")
_STORE: Final = struct.Struct("<HIIBIQ")
_DROP: Final = struct.Struct("<B")
_BLOCKS: Final = struct.Struct("<II")
_SCHEMA_ROPE_ENTRY: Final = struct.Struct("<BII")
_SNAP: Final = struct.Struct("<QH")
_SNAP_LAYER: Final = struct.Struct("<HI")
_SNAP_ID: Final = struct.Struct("<Q")


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


def vstore_payload(m: Mutation) -> list[Buffer]:
    """The payload of a V-store mutation's record as buffers (bulk data as a view)."""
    fixed, bulk = _encode_payload(m)
    return [fixed] if bulk is None or not len(bulk) else [fixed, bulk]


def encode_record(seq: int, m: Mutation) -> tuple[list[Buffer], int]:
    """The buffers of one V-store record, ready for ``os.writev``, and their total
    size. Bulk data (STORE rows, BLOCKS hashes) is passed through as a view, not
    copied."""
    return encode_frame(seq, op_of(m), vstore_payload(m))


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
