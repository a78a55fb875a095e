"""The four mutations of the V-store: the only ways its durable state changes.

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
``StoreRows``      rows ``start .. start+count`` of one layer are replaced by ``data``:
                   ``count * row_bytes`` bytes already in the stored format
                   ``format_id`` (so replay never quantizes again).
``DropSession``    a session disappears: ``"drop"`` (a client asked) or ``"evict"``
                   (LRU or the byte budget chose it; logged so a restart does not
                   bring it back).
``SetBlocks``      the session's block-hash table is replaced: ``hashes`` is
                   ``count * 8`` bytes of little-endian u64, in token order.
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
    "SetBlocks",
    "StoreRows",
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


Mutation: TypeAlias = CreateSession | StoreRows | DropSession | SetBlocks
