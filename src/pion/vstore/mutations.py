"""The mutations of the V-store: the only ways its durable state changes.

Every mutating :class:`~pion.vstore.VStore` method builds one of these records, hands
it to the journal (the WAL, the cluster tier) and only then applies it, so a log of
these records replayed through :meth:`VStore.apply` rebuilds the same state.

Each record is a frozen value. Byte payloads are whatever buffer the store had at hand
(the request blob, the codec output, a view of a layer buffer): they are valid during
``Journal.append`` only, and a journal that keeps one must copy it.

=================  ==================================================================
record             meaning
=================  ==================================================================
``CreateSession``  a session appears. ``schema`` None: uniform, layers of
                   ``default_dim``/``default_fmt`` created on first store. Otherwise
                   exactly ``len(schema)`` layers, layer i = ``schema[i]``
                   ``(fmt, dim)``; ``default_dim`` 0 means none was given.
                   ``ropes`` (SCHEMA only, None when no layer has one): layer i's
                   format parameter, ``rope`` of ``bf16_rope_fp8_body``, else 0.
``StoreRows``      rows ``start .. start+count`` of one layer are replaced by ``data``:
                   ``count * row_bytes`` bytes already in the stored format
                   ``format_id`` (so replay never quantizes again).
``DropSession``    a session disappears: ``"drop"`` (a client asked) or ``"evict"``
                   (LRU or the byte budget chose it; logged so a restart does not
                   bring it back).
``SetBlocks``      the session's block-hash table is replaced: ``hashes`` is
                   ``count * 8`` bytes of little-endian u64, in token order.
``TakeSnapshot``   V.SNAPSHOT: rollback snapshot ``snap_id`` of the session records
                   ``lengths``, ``(layer, tpl)`` of every layer the session has.
``RestoreSnapshot``  V.RESTORE: every layer is cut back to the length the snapshot
                   recorded (never grown); a uniform session's layers that did not
                   exist then are removed. The snapshot stays.
``ReleaseSnapshot``  V.COMMIT: the snapshot is forgotten.
``SnapshotIds``    the last rollback snapshot id issued (snapshot files: ids are
                   never reused, even once the snapshots that carried them are gone).
=================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "CreateSession",
    "DropReason",
    "DropSession",
    "Mutation",
    "ReleaseSnapshot",
    "RestoreSnapshot",
    "SetBlocks",
    "SnapshotIds",
    "StoreRows",
    "TakeSnapshot",
]

DropReason = Literal["drop", "evict"]

# A buffer-protocol payload. Python 3.11 has no ``collections.abc.Buffer``; these three
# are what the store produces (numpy arrays are handed over as memoryviews).
Payload: TypeAlias = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class CreateSession:
    sid: bytes
    default_dim: int
    default_fmt: str
    schema: tuple[tuple[str, int], ...] | None = None
    ropes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class StoreRows:
    sid: bytes
    layer: int
    start: int
    count: int
    format_id: int
    dim: int
    data: Payload


@dataclass(frozen=True, slots=True)
class DropSession:
    sid: bytes
    reason: DropReason = "drop"


@dataclass(frozen=True, slots=True)
class SetBlocks:
    sid: bytes
    block_size: int
    hashes: Payload


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    sid: bytes
    snap_id: int
    lengths: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class RestoreSnapshot:
    sid: bytes
    snap_id: int


@dataclass(frozen=True, slots=True)
class ReleaseSnapshot:
    sid: bytes
    snap_id: int


@dataclass(frozen=True, slots=True)
class SnapshotIds:
    last: int


Mutation: TypeAlias = (
    CreateSession
    | StoreRows
    | DropSession
    | SetBlocks
    | TakeSnapshot
    | RestoreSnapshot
    | ReleaseSnapshot
    | SnapshotIds
)
