"""What the writer thread is asked to do: one operation per V-store mutation, plus a
start-up check per recovered session.

A mutation's payload is only valid during ``Journal.append`` (``vstore.mutations``), so
:func:`op_of` copies it: the queue owns its bytes. ``nbytes`` is what the queue's byte
bound counts.

Local evictions have no operation: the tier is the second tier, and what the V-store
evicts for room is exactly what it should keep. Neither have rollback snapshots taken
or released (``V.SNAPSHOT``, ``V.COMMIT``: bookkeeping of one node's drafter); a
``V.RESTORE`` becomes a :class:`TruncateOp` (see ``journal.py``), since it cuts rows
other nodes would otherwise still read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pion.tier.meta import Layout
from pion.vstore import CreateSession, DropSession, Mutation, SetBlocks, StoreRows

__all__ = [
    "CheckOp",
    "CreateOp",
    "DropOp",
    "Op",
    "SetBlocksOp",
    "StoreOp",
    "TruncateOp",
    "op_of",
]

# Bookkeeping bytes an operation costs besides its payload (the sid, the objects).
_OVERHEAD = 256


@dataclass(frozen=True, slots=True)
class CreateOp:
    sid: bytes
    layout: Layout

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid)


@dataclass(frozen=True, slots=True)
class StoreOp:
    sid: bytes
    layer: int
    start: int
    count: int
    format_id: int
    dim: int
    data: bytes

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid) + len(self.data)


@dataclass(frozen=True, slots=True)
class SetBlocksOp:
    sid: bytes
    block_size: int
    hashes: bytes

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid) + len(self.hashes)


@dataclass(frozen=True, slots=True)
class DropOp:
    """Drop the tier's copy: any generation (``gen`` None: a client's DROP, a resync)
    or only ``gen`` (a repair of a copy found incomplete)."""

    sid: bytes
    gen: str | None = None

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid)


@dataclass(frozen=True, slots=True)
class TruncateOp:
    """``V.RESTORE``: cut each layer back to ``lengths`` (``(layer, rows)``; a layer not
    named is removed), never growing one."""

    sid: bytes
    lengths: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid) + 16 * len(self.lengths)


@dataclass(frozen=True, slots=True)
class CheckOp:
    """After recovery: does the tier hold this local session as we do? ``tpl`` is the
    local row high-water mark per layer."""

    sid: bytes
    layout: Layout
    tpl: dict[int, int] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return _OVERHEAD + len(self.sid) + 16 * len(self.tpl)


Op = CreateOp | StoreOp | SetBlocksOp | DropOp | TruncateOp | CheckOp


def op_of(m: Mutation) -> Op | None:
    """The operation a journaled mutation becomes (payload copied), or None (a
    ``RestoreSnapshot`` needs the snapshot's lengths: ``journal.py`` builds it)."""
    if isinstance(m, StoreRows):
        return StoreOp(m.sid, m.layer, m.start, m.count, m.format_id, m.dim, bytes(m.data))
    if isinstance(m, CreateSession):
        return CreateOp(m.sid, Layout.of(m))
    if isinstance(m, SetBlocks):
        return SetBlocksOp(m.sid, m.block_size, bytes(m.hashes))
    if isinstance(m, DropSession) and m.reason == "drop":
        return DropOp(m.sid)
    return None
