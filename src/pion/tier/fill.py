"""Read-through: copy sessions the tier holds into the local V-store, bit-exact.

The tier holds stored-format bytes, so a fill never quantizes: each chunk becomes a
``VStore.store_encoded`` of the same bytes, and what the local V-store then serves is
byte for byte what the writing node served. The filled sessions go neither back to the
tier (``TierJournal.local_only``) nor into the WAL (``FillGate``: they are a cache of
the tier until a local write makes them the node's own).

Order, so a bad or incomplete copy changes nothing: read the metas, bitmaps and block
tables and check them all (every block a layer needs must be marked written, the
block holding its last row included); refuse a copy larger than ``--maxmemory``; only
then create the local sessions and read the row chunks in batches of whole layers, at
most :data:`FILL_BATCH_BYTES` (bounding the bytes held twice, as received and as
stored), every node at once, each chunk received straight into its rows of a buffer
preallocated per layer (``rowread.py``), checking every chunk of a batch before any is
stored. Adjacent chunks of a layer are stored as one run, a view of that buffer.
Should a chunk be missing (evicted by the cluster) or the tier fail half-way, the
sessions created by this fill are dropped again.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pion.errors import OOMError, PionError
from pion.tier.journal import FillGate, TierJournal
from pion.tier.keys import CHUNK_ROWS, KeyLayout
from pion.tier.meta import TierFormatError, TierMeta
from pion.tier.remote import Remote, RemoteBlocks, decode_blocks
from pion.tier.rowread import ABSENT, Want
from pion.vstore import VStore

__all__ = [
    "FILL_BATCH_BYTES",
    "Fill",
    "LayerRows",
    "TierIncomplete",
    "batches",
    "check_room",
    "commit_fill",
    "fill_sessions",
    "held_rows",
    "plan_fill",
]

log = logging.getLogger("pion.tier")

# Row bytes requested from the tier per pipeline: big enough to keep every node busy
# (a 256 MiB prefix is one batch: each batch waits for its slowest node), small enough
# to bound what a batch holds before it is stored (runs are adopted by the V-store as
# received, so a fill holds its rows once; only rows that extend an existing run are
# copied).
FILL_BATCH_BYTES = 256 << 20


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


def batches(refs: Sequence[ChunkRef]) -> Iterator[list[ChunkRef]]:
    """Whole layers (their chunks in block order) per batch, up to FILL_BATCH_BYTES
    (a layer larger than that is a batch of its own)."""
    batch: list[ChunkRef] = []
    size = 0
    for (_, _), group in itertools.groupby(refs, key=lambda r: (r.sid, r.layer)):
        layer = list(group)
        nbytes = sum(ref.rows * ref.row_bytes for ref in layer)
        if batch and size + nbytes > FILL_BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch += layer
        size += nbytes
    if batch:
        yield batch


class LayerRows:
    """Rows of one layer of a batch, received in place: a buffer covering its blocks
    ``first .. last`` (CHUNK_ROWS rows each, holes included: never touched, never
    resident), each chunk read straight into its block's rows (``rowread``)."""

    def __init__(self, refs: Sequence[ChunkRef]) -> None:
        self.refs = refs
        self.first = refs[0].block
        blocks = refs[-1].block - self.first + 1
        self.rows = np.empty((blocks * CHUNK_ROWS, refs[0].row_bytes), dtype=np.uint8)

    def wants(self) -> list[Want]:
        flat = self.rows.data.cast("B")
        size = CHUNK_ROWS * self.refs[0].row_bytes
        out = []
        for ref in self.refs:
            at = (ref.block - self.first) * size
            out.append(Want(ref.name, flat[at : at + size]))
        return out

    def runs(self, held: Sequence[int]) -> Iterator[tuple[int, npt.NDArray[np.uint8]]]:
        """``(first row, rows)`` of each run of adjacent chunks (``held`` rows each):
        one store and one log record per run, views of the rows received. A hole (a
        block not marked written, or a block not written to its end) ends a run."""
        start: int | None = None
        end = 0
        for ref, n in zip(self.refs, held, strict=True):
            row = ref.block * CHUNK_ROWS
            if start is not None and row != end:
                yield start, self._slice(start, end)
                start = None
            if n:
                start = row if start is None else start
                end = row + n
        if start is not None:
            yield start, self._slice(start, end)

    def _slice(self, start: int, end: int) -> npt.NDArray[np.uint8]:
        base = self.first * CHUNK_ROWS
        if start == base and end - base == self.rows.shape[0]:
            return self.rows  # the whole buffer, which owns its memory: adopted as it is
        return self.rows[start - base : end - base]


def held_rows(ref: ChunkRef, size: int) -> int:
    """How many of the chunk's rows below the high-water mark a value of ``size``
    bytes (ABSENT: none) holds; raises when the chunk is gone, short or malformed."""
    if size == ABSENT:
        raise TierIncomplete(f"layer {ref.layer} block {ref.block} is marked written but gone")
    if size % ref.row_bytes or size > CHUNK_ROWS * ref.row_bytes:
        raise TierFormatError(
            f"layer {ref.layer} block {ref.block}: {size} bytes is not a whole number "
            f"of {ref.row_bytes}-byte rows (at most {CHUNK_ROWS})"
        )
    held = size // ref.row_bytes
    if ref.last and held < ref.rows:
        raise TierIncomplete(f"layer {ref.layer} block {ref.block} ends before its last row")
    # Rows past the mark arrived after we read it (a concurrent append): not ours yet.
    return min(held, ref.rows)


def check_room(vstore: VStore, plans: Sequence[Fill]) -> None:
    """Refuse a copy larger than ``--maxmemory`` before reading any of its rows."""
    total = sum(p.meta.nbytes for p in plans)
    if vstore.maxmemory and total > vstore.maxmemory:
        raise OOMError(
            f"the tier's copy ({total} bytes) is larger than maxmemory ({vstore.maxmemory})"
        )


def _create(vstore: VStore, plans: Sequence[Fill], created: list[bytes]) -> None:
    for p in plans:
        layout = p.meta.layout
        if layout.schema is None:
            vstore.create(p.meta.sid, layout.default_dim, layout.default_fmt)
        else:
            vstore.create_schema(p.meta.sid, layout.default_dim, layout.schema, layout.ropes)
        created.append(p.meta.sid)


def _store(vstore: VStore, lay: LayerRows, held: Sequence[int]) -> int:
    sid, layer = lay.refs[0].sid, lay.refs[0].layer
    filled = 0
    for start, rows in lay.runs(held):
        # Handed over: a run of its own keeps these rows as its buffer.
        vstore.store_encoded(sid, layer, start, rows, adopt=True)
        filled += rows.nbytes
    return filled


def _set_blocks(vstore: VStore, plans: Sequence[Fill]) -> None:
    for p in plans:
        if p.blocks is not None:
            hashes = np.frombuffer(p.blocks.hashes, dtype="<u8")
            vstore.set_blocks(p.meta.sid, p.blocks.block_size, hashes)


def _undo(vstore: VStore, created: Sequence[bytes]) -> None:
    for sid in created:
        try:
            vstore.drop(sid)
        except PionError as exc:  # the WAL failing too: report the first error
            log.error("could not undo the partial fill of %r: %s", sid, exc.message)


def commit_fill(
    vstore: VStore,
    journal: TierJournal,
    gate: FillGate,
    plans: Sequence[Fill],
    layers: Sequence[tuple[LayerRows, Sequence[int]]],
) -> int:
    """Create the planned sessions and store rows already received and checked (each
    layer with its chunks' held rows, :func:`held_rows`); returns the row bytes
    stored. All or nothing: on an error the sessions created here are dropped again."""
    created: list[bytes] = []
    filled = 0
    with journal.local_only(), gate.filling([p.meta.sid for p in plans]):
        try:
            _create(vstore, plans, created)
            for lay, held in layers:
                filled += _store(vstore, lay, held)
            _set_blocks(vstore, plans)
        except BaseException:
            _undo(vstore, created)
            raise
    return filled


def fill_sessions(
    remote: Remote, vstore: VStore, journal: TierJournal, gate: FillGate, plans: Sequence[Fill]
) -> int:
    """Create and fill the planned sessions locally; returns the row bytes filled.
    Raises (TierIOError, TierIncomplete, TierFormatError, PionError) with the local
    store as it was, apart from evictions made to fit."""
    check_room(vstore, plans)
    created: list[bytes] = []
    filled = 0
    with journal.local_only(), gate.filling([p.meta.sid for p in plans]):
        try:
            _create(vstore, plans, created)
            refs = [ref for p in plans for ref in p.chunks]
            for batch in batches(refs):
                layers = [
                    LayerRows(list(group))
                    for _, group in itertools.groupby(batch, key=lambda r: (r.sid, r.layer))
                ]
                sizes = remote.read_into([w for lay in layers for w in lay.wants()])
                held = [held_rows(ref, size) for ref, size in zip(batch, sizes, strict=True)]
                at = 0
                for lay in layers:
                    counts, at = held[at : at + len(lay.refs)], at + len(lay.refs)
                    filled += _store(vstore, lay, counts)
                del layers
            _set_blocks(vstore, plans)
        except BaseException:
            _undo(vstore, created)
            raise
    return filled
