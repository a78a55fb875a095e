"""Read-through: copy sessions the tier holds into the local V-store, bit-exact.

The tier holds stored-format bytes, so a fill never quantizes: each chunk becomes a
``VStore.store_encoded`` of the same bytes, and what the local V-store then serves is
byte for byte what the writing node served. The local changes go through the WAL (so a
restart keeps them and later writes replay on top) but not back to the tier
(``TierJournal.local_only``).

Order, so a bad or incomplete copy changes nothing: read the metas, bitmaps and block
tables and check them all (every block a layer needs must be marked written, the
block holding its last row included); refuse a copy larger than ``--maxmemory``; only
then create the local sessions and stream the row chunks in batches of at most
:data:`FILL_BATCH_BYTES` (bounding the bytes held twice, as reply and as rows), checking
each chunk before it is stored. Should a chunk be missing (evicted by the cluster)
or the tier fail half-way, the sessions created by this fill are dropped again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pion.errors import OOMError, PionError
from pion.tier.journal import TierJournal
from pion.tier.keys import CHUNK_ROWS, KeyLayout
from pion.tier.meta import TierFormatError, TierMeta
from pion.tier.remote import Remote, RemoteBlocks, decode_blocks
from pion.vstore import VStore

__all__ = ["FILL_BATCH_BYTES", "Fill", "TierIncomplete", "fill_sessions", "plan_fill"]

log = logging.getLogger("pion.tier")

# Row bytes requested from the tier per pipeline: big enough to keep every node busy
# (a 64 MiB prefix is one batch), small enough to bound the transient copy.
FILL_BATCH_BYTES = 64 << 20


class TierIncomplete(Exception):
    """The tier's copy lacks rows its metadata promises (the cluster evicted a key)."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    sid: bytes
    name: str
    layer: int
    block: int
    rows: int  # rows of the block below the layer's high-water mark
    last: bool  # the block holding the layer's last row: it must hold all of them
    row_bytes: int


@dataclass(frozen=True, slots=True)
class Fill:
    """Everything checked about one session before the local store is touched."""

    meta: TierMeta
    blocks: RemoteBlocks | None
    chunks: tuple[ChunkRef, ...]


def plan_fill(keys: KeyLayout, meta: TierMeta, bitmap: bytes, blocks: bytes | None) -> Fill:
    """The chunks to read for ``meta``, given its written-blocks bitmap."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8))
    refs: list[ChunkRef] = []
    for layer, tpl in sorted(meta.tpl.items()):
        row_bytes = meta.layout.row_bytes(layer)
        last = (tpl - 1) // CHUNK_ROWS
        for block in range(last + 1):
            bit = keys.bit(layer, block)
            if bit < bits.size and bits[bit]:
                name = keys.chunk(meta.sid, meta.gen, layer, block)
                rows = min(CHUNK_ROWS, tpl - block * CHUNK_ROWS)
                refs.append(ChunkRef(meta.sid, name, layer, block, rows, block == last, row_bytes))
            elif block == last:
                raise TierIncomplete(
                    f"layer {layer} holds {tpl} rows but the block of its last row is "
                    "not marked written"
                )
    table = decode_blocks(blocks) if blocks is not None else None
    return Fill(meta, table, tuple(refs))


def _batches(refs: Sequence[ChunkRef]) -> Iterator[list[ChunkRef]]:
    batch: list[ChunkRef] = []
    size = 0
    for ref in refs:
        if batch and size + ref.rows * ref.row_bytes > FILL_BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(ref)
        size += ref.rows * ref.row_bytes
    if batch:
        yield batch


def _rows(ref: ChunkRef, data: bytes | None) -> np.ndarray | None:
    """The chunk's rows below the high-water mark as ``[n, row_bytes]`` uint8."""
    if data is None:
        raise TierIncomplete(f"layer {ref.layer} block {ref.block} is marked written but gone")
    if len(data) % ref.row_bytes or len(data) > CHUNK_ROWS * ref.row_bytes:
        raise TierFormatError(
            f"layer {ref.layer} block {ref.block}: {len(data)} bytes is not a whole number "
            f"of {ref.row_bytes}-byte rows (at most {CHUNK_ROWS})"
        )
    held = len(data) // ref.row_bytes
    if ref.last and held < ref.rows:
        raise TierIncomplete(f"layer {ref.layer} block {ref.block} ends before its last row")
    # Rows past the mark arrived after we read it (a concurrent append): not ours yet.
    take = min(held, ref.rows)
    if take == 0:
        return None
    rows = np.frombuffer(data, dtype=np.uint8, count=take * ref.row_bytes)
    return rows.reshape(take, ref.row_bytes)


def fill_sessions(
    remote: Remote, vstore: VStore, journal: TierJournal, plans: Sequence[Fill]
) -> int:
    """Create and fill the planned sessions locally; returns the row bytes filled.
    Raises (TierIOError, TierIncomplete, TierFormatError, PionError) with the local
    store as it was, apart from evictions made to fit."""
    total = sum(p.meta.nbytes for p in plans)
    if vstore.maxmemory and total > vstore.maxmemory:
        raise OOMError(
            f"the tier's copy ({total} bytes) is larger than maxmemory ({vstore.maxmemory})"
        )
    created: list[bytes] = []
    filled = 0
    with journal.local_only():
        try:
            for p in plans:
                layout = p.meta.layout
                if layout.schema is None:
                    vstore.create(p.meta.sid, layout.default_dim, layout.default_fmt)
                else:
                    vstore.create_schema(p.meta.sid, layout.default_dim, layout.schema)
                created.append(p.meta.sid)
            refs = [ref for p in plans for ref in p.chunks]
            for batch in _batches(refs):
                replies = remote.read_chunks([ref.name for ref in batch])
                pieces = [(ref, _rows(ref, data)) for ref, data in zip(batch, replies, strict=True)]
                for ref, rows in pieces:
                    if rows is not None:
                        start = ref.block * CHUNK_ROWS
                        vstore.store_encoded(ref.sid, ref.layer, start, rows)
                        filled += rows.nbytes
            for p in plans:
                if p.blocks is not None:
                    hashes = np.frombuffer(p.blocks.hashes, dtype="<u8")
                    vstore.set_blocks(p.meta.sid, p.blocks.block_size, hashes)
        except BaseException:
            for sid in created:
                try:
                    vstore.drop(sid)
                except PionError as exc:  # the WAL failing too: report the first error
                    log.error("could not undo the partial fill of %r: %s", sid, exc.message)
            raise
    return filled
