"""The V-store: sessions -> layers -> rows, with LRU eviction and exact byte accounting.

A pure, synchronous, single-owner data structure (no asyncio, no server imports): the
event loop calls it between awaits, so nobody ever sees it half-updated.

Definitions (also what ``V.INFO`` and ``KV.PREFIX.INFO`` report):

- ``tpl`` of a layer: the largest ``start + count`` stored; rows below it that were
  never written read as zeros, and so do rows past it.
- ``held`` rows of a layer: the rows of its runs (``layer.py``). A write far past the
  stored rows leaves a hole that is not held: holes cost nothing in memory, in the
  log or in snapshots.
- ``vstore_bytes`` = sum over layers of ``held * row_bytes``: the K/V bytes held, in
  stored format. It is the V-store's share of what ``--maxmemory`` bounds, together
  with ``external_bytes()`` (the rest of ``used_memory``: ``pion.commands.budget``),
  and what a snapshot writes.
- ``bytes_allocated`` = sum of run buffer capacities: at most ``GROWTH`` (1.25) times
  ``vstore_bytes`` for rows written in ascending order (the slack of a run grown by
  appends), at most 1.5 times when runs also grew downward, at most 2 times after a
  ``V.RESTORE`` (a cut of at most half a run keeps its buffer, so a drafter's
  append/reject cycle never copies); the slack is never touched, so it is not
  resident.
- ``total_tokens`` = sum of ``tpl`` over every layer of every session (as Pion counts
  it: the high-water marks, holes included).
- ``total_fetches``: one per layer read requested (a RANGE or id-list fetch counts 1, a
  BATCH fetch counts its layers); ``evictions``: sessions evicted (a namespace counts
  its halves). Both count from process start.
- ``generation(sid)``: a store-wide counter stamped on a session whenever its rows
  change (store, restore, create); a dropped or evicted sid has none, and a re-created
  one gets a new number. Whoever keeps something derived from a session's rows (the
  ``V.EXPORT`` files) compares numbers to know it is still current, and
  ``change_listeners`` hear of each change at once.

The store is three layers of one class: ``table.py`` (the sessions, their LRU order,
the counters and the primitives every operation shares), ``reads.py`` (fetches and
their bounds) and ``eviction.py`` (making room); this module adds the mutations,
rollback snapshots, and dump and replay.

Mutations follow one order: validate everything -> encode -> ``journal.append`` ->
apply (see ``journal.py``); :meth:`VStore.apply` replays a record without journaling.
The surface is kept narrow on purpose (create, store, fetch, drop, enumerate, blocks)
so the WAL and a cluster tier plug in behind it.

WATCH: every mutation of a session (client writes, drops, evictions, rollback) passes
through ``_journal``, which tells ``watchers`` (:mod:`pion.watch`) the session id once
the journal accepted it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from pion.codecs import Codec, get_codec
from pion.errors import PionError
from pion.vstore.eviction import Eviction
from pion.vstore.layer import Layer
from pion.vstore.mutations import (
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
from pion.vstore.reads import MAX_REPLY_BYTES, MAX_ZERO_FILL_BYTES, Reads
from pion.vstore.rollback import MAX_SNAPSHOTS_PER_SESSION, cut_back, lengths_of
from pion.vstore.session import (
    Encoded,
    FloatRows,
    Session,
    encode_rows,
    validate_create,
)
from pion.vstore.views import BlockTable, namespace_of
from pion.wire import bytes_of

__all__ = ["MAX_REPLY_BYTES", "MAX_RUNS", "MAX_ZERO_FILL_BYTES", "VStore"]

# Separate runs of rows (stretches between holes) one layer may hold. Known clients
# write a layer as one run; 16 leaves room for chunks written out of order, and bounds
# the per-run bookkeeping (a buffer object each) a hostile writer can make the server
# hold beyond the bytes it is charged for.
MAX_RUNS = 16


class VStore(Reads, Eviction):
    """Sessions of K/V rows. See the module docstring for the definitions it keeps."""

    def create(self, sid: bytes, dim: int, fmt: str) -> int:
        """A uniform session (idempotent: an existing sid keeps its layout); its slot."""
        return self._create(CreateSession(sid, dim, fmt, None))

    def create_schema(
        self,
        sid: bytes,
        default_dim: int,
        schema: Sequence[tuple[str, int]],
        ropes: Sequence[int] | None = None,
    ) -> int:
        """A session of ``len(schema)`` fixed layers (idempotent); its slot. ``ropes``:
        each layer's rope (``bf16_rope_fp8_body``), 0 for the other formats."""
        kept = tuple(ropes) if ropes is not None and any(ropes) else None
        m = CreateSession(sid, default_dim, schema[0][0] if schema else "", tuple(schema), kept)
        return self._create(m)

    def store(
        self,
        sid: bytes,
        layer: int,
        start: int,
        rows: FloatRows,
        *,
        encoded: Encoded | None = None,
    ) -> None:
        """Store ``rows`` (``[count, dim]``, fp32, or fp16 bit patterns) at ``start``.

        fp16 rows into an fp16 layer are stored verbatim, unvalidated (they may be bf16
        bits); anything else is quantized, refusing values the format cannot hold.
        ``encoded``: ``rows`` already encoded (:func:`encode_for`, off the event loop);
        used only if the layer's codec is still the one they were encoded with, so the
        store means the same as if they were encoded here, now."""
        s = self._get(sid)
        dim, codec = self._layout(s, layer)
        if rows.ndim != 2 or rows.shape[1] != dim or rows.shape[0] < 1:
            raise PionError(f"rows must be [count>=1, {dim}], got {list(rows.shape)}")
        if rows.dtype not in (np.dtype("<f4"), np.dtype("<f2")):
            raise PionError(f"rows must be little-endian float32 or float16, got {rows.dtype}")
        count = int(rows.shape[0])
        self._check_rows(start, start + count)
        if encoded is not None and encoded[0] is codec and len(encoded[1]) == count:
            rows_ = encoded[1]
        else:
            rows_ = encode_rows(codec, rows, layer, start)
        # Rows encoded for this store (not a view of the request) become the layer's
        # buffer when they start a run: encoded once, into their destination rows.
        adopt = rows_.base is None
        self._write(s, rows_, sid=sid, layer=layer, start=start, codec=codec, dim=dim, adopt=adopt)

    def store_encoded(
        self,
        sid: bytes,
        layer: int,
        start: int,
        data: npt.NDArray[np.uint8],
        *,
        adopt: bool = False,
    ) -> None:
        """Store rows already in the layer's stored format (``[count, row_bytes]``
        uint8) at ``start``, bit-exact: the cluster tier's read-through fill
        (``pion.tier.fill``), which must never quantize again. Same order as
        :meth:`store`: check, make room, journal, apply. ``adopt``: ``data`` is handed
        over and may become the layer's buffer as it is (``Layer.write``)."""
        s = self._get(sid)
        dim, codec = self._layout(s, layer)
        row_bytes = codec.row_bytes(dim)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != row_bytes:
            raise PionError(f"encoded rows must be uint8 [count, {row_bytes}]")
        if data.shape[0] < 1:
            raise PionError("encoded rows must hold at least one row")
        self._check_rows(start, start + int(data.shape[0]))
        self._write(s, data, sid=sid, layer=layer, start=start, codec=codec, dim=dim, adopt=adopt)

    def _write(
        self,
        s: Session,
        data: npt.NDArray[np.uint8],
        *,
        sid: bytes,
        layer: int,
        start: int,
        codec: Codec,
        dim: int,
        adopt: bool = False,
    ) -> None:
        """The common tail of :meth:`store` and :meth:`store_encoded`: the run limit,
        room for the bytes the layer grows by, the journal, then the rows (``adopt``:
        ``data`` is the store's own, see ``Layer.write``)."""
        count = int(data.shape[0])
        end = start + count
        lay = s.layers.get(layer)
        if lay is not None and lay.runs_after(start, end) > MAX_RUNS:
            raise PionError(
                f"layer {layer} would hold more than {MAX_RUNS} separate runs of rows "
                "(stretches between rows never written); write the rows between them"
            )
        grow = (lay.growth(start, end) if lay is not None else count) * codec.row_bytes(dim)
        self._make_room_for_bytes(s.group, grow)
        self._journal(StoreRows(sid, layer, start, count, codec.format_id, dim, bytes_of(data)))
        self._apply_store(s, layer, start, data, adopt=adopt)

    def drop(self, sid: bytes) -> bool:
        """Remove a session; False when it does not exist."""
        if sid not in self._sessions:
            return False
        self._journal(DropSession(sid, "drop"))
        self._apply_drop(sid)
        return True

    def set_blocks(self, sid: bytes, block_size: int, hashes: npt.NDArray[np.uint64]) -> None:
        """Replace the session's block-hash table (``hashes`` u64, token order)."""
        s = self._get(sid)
        if block_size < 1:
            raise PionError("block_size must be positive")
        data = np.ascontiguousarray(hashes, dtype="<u8")
        if data.ndim != 1:
            raise PionError("block hashes must be a flat array")
        self._journal(SetBlocks(sid, block_size, bytes_of(data)))
        s.blocks = BlockTable.build(block_size, data)
        self._touch(s)

    def snapshot(self, sid: bytes) -> int:
        """Record every layer's length under a new id; returns the id."""
        s = self._get(sid)
        if len(s.snapshots) >= MAX_SNAPSHOTS_PER_SESSION:
            raise PionError(
                f"no free snapshot slot (max {MAX_SNAPSHOTS_PER_SESSION} per session; "
                "V.COMMIT releases one)"
            )
        m = TakeSnapshot(sid, self.last_snap_id + 1, lengths_of(s))
        self._journal(m)
        self._apply_rollback(s, m)
        return m.snap_id

    def restore(self, sid: bytes, snap_id: int) -> None:
        """Cut every layer back to snapshot ``snap_id`` of ``sid`` (never growing one)."""
        s = self._get(sid)
        if snap_id not in s.snapshots:
            raise PionError(f"unknown snap_id {snap_id} for this session")
        m = RestoreSnapshot(sid, snap_id)
        self._journal(m)
        self._apply_rollback(s, m)

    def release(self, sid: bytes, snap_id: int) -> bool:
        """Forget snapshot ``snap_id`` of ``sid``; False when it is not live."""
        s = self._get(sid)
        if snap_id not in s.snapshots:
            self._touch(s)
            return False
        m = ReleaseSnapshot(sid, snap_id)
        self._journal(m)
        self._apply_rollback(s, m)
        return True

    def snapshot_ids(self, sid: bytes) -> list[int]:
        """The live rollback snapshot ids of ``sid``, oldest first."""
        return sorted(self._get(sid).snapshots)

    def trim(self) -> int:
        """Shrink every run's buffer to its live rows; returns the bytes released."""
        return sum(lay.trim() for s in self._sessions.values() for lay in s.layers.values())

    def dump(self) -> Iterator[Mutation]:
        """The mutations that rebuild the current state from an empty store, least
        recently used session first (so replay restores the LRU order). ``StoreRows``
        payloads are views of live buffers: consume each before the next write."""
        if self.last_snap_id:
            yield SnapshotIds(self.last_snap_id)
        for s in sorted(self._sessions.values(), key=lambda s: s.clock):
            yield s.creation()
            for index, lay in sorted(s.layers.items()):
                for first, rows in lay.extents():  # held runs only: holes cost nothing
                    count = int(rows.shape[0])
                    fmt = lay.codec.format_id
                    yield StoreRows(s.sid, index, first, count, fmt, lay.dim, bytes_of(rows))
            if s.blocks is not None:
                yield SetBlocks(s.sid, s.blocks.block_size, bytes_of(s.blocks.hashes))
            for snap_id, lengths in sorted(s.snapshots.items()):
                yield TakeSnapshot(s.sid, snap_id, lengths)

    def reserve(self, sid: bytes, layer: int, start: int, end: int) -> None:
        """A sizing hint for loading: rows ``start .. end`` of a layer are about to
        arrive highest first (a snapshot's pieces of one run), so allocate their run
        now and the pieces land without reallocation. Stores and journals nothing;
        ignored when the session cannot take those rows there (the records that follow
        are checked as usual) or when the hint is larger than ``max_rows``."""
        s = self._sessions.get(sid)
        if s is None or not 0 <= start < end or end - start > self.limits.max_rows:
            return
        try:
            dim, codec = self._layout(s, layer)
        except PionError:
            return
        lay = s.layers.get(layer)
        if lay is None:
            lay = s.layers[layer] = Layer(codec, dim)
        lay.reserve(start, end)

    def apply(self, m: Mutation) -> None:
        """Apply a journaled record (WAL replay, snapshot load) without journaling it,
        evicting or quantizing; the log is authoritative, so limits that only bound
        new writes (max_sessions, maxmemory, max_rows) are not re-checked."""
        if isinstance(m, CreateSession):
            s = self._sessions.get(m.sid)
            if s is None:
                validate_create(m, self.limits)
                self._apply_create(m)
            else:
                self._touch(s)
        elif isinstance(m, StoreRows):
            s = self._get(m.sid)
            dim, codec = self._layout(s, m.layer)
            if codec.format_id != m.format_id or dim != m.dim:
                raise PionError(
                    f"StoreRows layout (format {m.format_id}, dim {m.dim}) does not match "
                    f"layer {m.layer} (format {codec.format_id}, dim {dim})"
                )
            row_bytes = codec.row_bytes(dim)
            rows = np.frombuffer(m.data, dtype=np.uint8)
            if m.start < 0 or m.count < 1 or rows.size != m.count * row_bytes:
                raise PionError(f"StoreRows payload of {rows.size} bytes for {m.count} rows")
            self._apply_store(s, m.layer, m.start, rows.reshape(m.count, row_bytes))
        elif isinstance(m, DropSession):
            if m.sid in self._sessions:
                self._apply_drop(m.sid)
        elif isinstance(m, SetBlocks):
            s = self._get(m.sid)
            hashes = np.frombuffer(m.hashes, dtype="<u8")
            s.blocks = BlockTable.build(m.block_size, hashes)
            self._touch(s)
        elif isinstance(m, SnapshotIds):
            self.last_snap_id = max(self.last_snap_id, m.last)
        else:
            self._apply_rollback(self._get(m.sid), m)

    def _create(self, m: CreateSession) -> int:
        s = self._sessions.get(m.sid)
        if s is not None:
            self._touch(s)
            return s.slot
        validate_create(m, self.limits)
        spare = namespace_of(m.sid)
        while len(self._sessions) >= self.max_sessions:
            victim = self._lru.oldest(spare)
            if victim is None:
                raise PionError(
                    f"V-store full: {len(self._sessions)} sessions "
                    f"(vstore-max-sessions {self.max_sessions}) and none evictable"
                )
            self._evict(victim)
        self._journal(m)
        return self._apply_create(m).slot

    def _apply_create(self, m: CreateSession) -> Session:
        if self._free_slots:
            slot = heapq.heappop(self._free_slots)
        else:
            slot = self._next_slot
            self._next_slot += 1
        s = Session(m, slot)
        self._sessions[m.sid] = s
        self._lru.add(s.group)
        self._touch(s)
        self._changed(s)
        return s

    def _apply_store(
        self,
        s: Session,
        layer: int,
        start: int,
        data: npt.NDArray[np.uint8],
        *,
        adopt: bool = False,
    ) -> None:
        lay = s.layers.get(layer)
        if lay is None:
            lay = s.layers[layer] = Layer(get_codec(s.default_fmt), s.default_dim)
        held, tpl = lay.write(start, data, self.limits.max_rows, adopt=adopt)
        self.vstore_bytes += held * lay.row_bytes
        self.total_tokens += tpl
        self._lru.grew(s.group, held * lay.row_bytes)
        self._touch(s)
        self._changed(s)

    def _apply_rollback(
        self, s: Session, m: TakeSnapshot | RestoreSnapshot | ReleaseSnapshot
    ) -> None:
        if isinstance(m, TakeSnapshot):
            if m.snap_id < 1:
                raise PionError(f"snapshot id {m.snap_id} is not positive")
            s.snapshots[m.snap_id] = m.lengths
            self.last_snap_id = max(self.last_snap_id, m.snap_id)
        elif isinstance(m, RestoreSnapshot):
            lengths = s.snapshots.get(m.snap_id)
            if lengths is None:
                raise PionError(f"unknown snap_id {m.snap_id} for this session")
            tokens, nbytes = cut_back(s, lengths)
            self.total_tokens -= tokens
            self.vstore_bytes -= nbytes
            self._lru.shrank(s.group, nbytes)
            self._changed(s)
        else:
            s.snapshots.pop(m.snap_id, None)
        self._touch(s)
