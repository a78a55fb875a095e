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
  stored format. It is what ``--maxmemory`` budgets, together with
  ``external_bytes()`` (what other stores hold under the same budget: the keyspace),
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

Eviction. The unit is the namespace: a ``<ns>_pk``/``<ns>_pv`` sid
takes its other half with it (``views.namespace_of``); a namespace's age is that of its
most recently used half. Creating a session beyond ``max_sessions`` evicts the least
recently used namespace(s); a write that would take ``vstore_bytes`` past
``maxmemory`` evicts LRU namespaces holding bytes until it fits. The namespace being
written is never a victim, so a write that cannot fit even then (or that alone is
larger than the budget) raises ``OOMError`` and evicts nothing. The order lives in
``lru.py``: a touch and each victim cost O(1), whatever the number of sessions.

Reads. A fetch's reply may pad rows never written (past ``tpl`` or in holes) with
zeros, as Pion does, but never more of them than the rows it carries that are held
(or :data:`MAX_ZERO_FILL_BYTES`, whichever is larger): a small request cannot ask for
a huge reply of zeros. Replies are also bounded by :data:`MAX_REPLY_BYTES`.

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
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from pion.codecs import Codec, get_codec
from pion.config import VStoreLimits
from pion.errors import OOMError, PionError, SessionNotFoundError
from pion.vstore.journal import Journal
from pion.vstore.layer import Layer, Pieces
from pion.vstore.lru import Group, GroupLRU
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
from pion.vstore.rollback import MAX_SNAPSHOTS_PER_SESSION, cut_back, lengths_of
from pion.vstore.session import (
    Encoded,
    FloatRows,
    Session,
    encode_rows,
    validate_create,
)
from pion.vstore.views import BlockTable, SessionInfo, namespace_of
from pion.watch import Watchers
from pion.wire import bytes_of

__all__ = ["MAX_REPLY_BYTES", "MAX_RUNS", "MAX_ZERO_FILL_BYTES", "VStore"]

# The largest fetch reply (one RANGE bulk, or a whole BATCH array) built in memory:
# 4 GiB serves 32 layers x 32k tokens x 1024 dims of fp32.
MAX_REPLY_BYTES = 4 << 30
# Zero rows (never written: past tpl or in a hole) a fetch reply may carry beyond as
# many bytes as it carries of held rows. Pion pads a RANGE past tpl with zeros, and
# clients ask for "a few rows more than stored"; 1 MiB covers that for any dim (32
# rows of 8192 fp32), while one RANGE 0 32768 on a 1-row 8192-wide session (1 GiB of
# zeros for 32 KB of data) is refused.
MAX_ZERO_FILL_BYTES = 1 << 20
# Separate runs of rows (stretches between holes) one layer may hold. Known clients
# write a layer as one run; 16 leaves room for chunks written out of order, and bounds
# the per-run bookkeeping (a buffer object each) a hostile writer can make the server
# hold beyond the bytes it is charged for.
MAX_RUNS = 16


def _nothing() -> int:
    return 0


class VStore:
    """Sessions of K/V rows. See the module docstring for the definitions it keeps."""

    def __init__(
        self,
        limits: VStoreLimits,
        max_sessions: int = 256,
        maxmemory: int = 0,
        journal: Journal | None = None,
    ) -> None:
        self.limits = limits
        self.max_sessions = max_sessions
        self.maxmemory = maxmemory  # bytes of vstore_bytes + external_bytes(); 0 = none
        # Bytes other stores hold under the same --maxmemory (set by the server).
        self.external_bytes: Callable[[], int] = _nothing
        # Attached after recovery: replay goes through apply(), which never journals.
        self.journal = journal
        self._sessions: dict[bytes, Session] = {}
        self._lru = GroupLRU()
        self._free_slots: list[int] = []  # heap: the lowest free slot is reused first
        self._next_slot = 0
        self._clock = 0
        self.vstore_bytes = 0
        self.total_tokens = 0
        self.total_fetches = 0
        self.evictions = 0
        # The last rollback snapshot id issued (V.SNAPSHOT); ids only ever grow.
        self.last_snap_id = 0
        # Counts every change of any session's rows (see generation()); never reused.
        self._generation = 0
        # Called with a sid after its rows changed or it was dropped (the V.EXPORT
        # file cache removes stale files at once). A listener must not raise, nor call
        # back into the store.
        self.change_listeners: list[Callable[[bytes], None]] = []
        # Clients watching sessions (WATCH): told by _journal of every mutation.
        self.watchers = Watchers()

    # -- limits and enumeration ------------------------------------------------------

    def set_limits(self, *, max_sessions: int | None = None, maxmemory: int | None = None) -> None:
        """Change the limits (CONFIG SET); they are enforced at the next create/write."""
        if max_sessions is not None:
            self.max_sessions = max_sessions
        if maxmemory is not None:
            self.maxmemory = maxmemory

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, sid: object) -> bool:
        return sid in self._sessions

    @property
    def bytes_allocated(self) -> int:
        return sum(lay.allocated for s in self._sessions.values() for lay in s.layers.values())

    def sids(self) -> list[bytes]:
        """Every sid, least recently used first."""
        return [s.sid for s in sorted(self._sessions.values(), key=lambda s: s.clock)]

    def touch(self, sid: bytes) -> bool:
        s = self._sessions.get(sid)
        if s is not None:
            self._touch(s)
        return s is not None

    def describe(self, sid: bytes, *, touch: bool = True) -> SessionInfo:
        s = self._get(sid)
        if touch:
            self._touch(s)
        return s.info()

    def usage(self, sid: bytes, *, touch: bool = True) -> tuple[int, int]:
        """``(layer-0 tpl, stored bytes)`` of a session: what a registry hit credits,
        without building a full :class:`SessionInfo` (LOOKUP's hot path)."""
        s = self._get(sid)
        if touch:
            self._touch(s)
        layer0 = s.layers.get(0)
        return (layer0.tpl if layer0 is not None else 0), s.nbytes

    def hit(self, sid: bytes) -> int:
        """Touch ``sid`` and return its layer-0 ``tpl``: what a registry hit credits,
        with nothing allocated (LOOKUP's hot path; :meth:`usage` also sums bytes)."""
        s = self._get(sid)
        self._touch(s)
        layer0 = s.layers.get(0)
        return layer0.tpl if layer0 is not None else 0

    def hit_pair(self, k: bytes, v: bytes) -> int | None:
        """:meth:`hit` of ``k`` then :meth:`touch` of ``v`` when both are held (a
        namespace's halves: LOOKUP's hot path, in one call); None, nothing touched,
        when either is not."""
        sessions = self._sessions
        sk, sv = sessions.get(k), sessions.get(v)
        if sk is None or sv is None:
            return None
        self._touch(sk)
        self._touch(sv)
        layer0 = sk.layers.get(0)
        return layer0.tpl if layer0 is not None else 0

    def generation(self, sid: bytes) -> int:
        """A number that changes whenever ``sid``'s rows may have changed (a store, a
        restore, a re-create after a drop or an eviction): equal numbers mean the rows
        are the same. Numbers are unique over the store's lifetime, across sessions."""
        return self._get(sid).generation

    def layer_layout(self, sid: bytes, layer: int) -> tuple[int, Codec]:
        """The (dim, codec) a store into ``layer`` uses; raises if it cannot take rows."""
        return self._layout(self._get(sid), layer)

    def blocks(self, sid: bytes, *, touch: bool = True) -> BlockTable | None:
        s = self._get(sid)
        if touch:
            self._touch(s)
        return s.blocks

    # -- mutations -------------------------------------------------------------------

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

    def make_room(self, nbytes: int) -> None:
        """Make ``nbytes`` fit under ``maxmemory`` for another store sharing the budget
        (the keyspace): evict LRU namespaces as a V-store write would, or raise
        ``OOMError`` and evict nothing."""
        self._make_room_for_bytes((), nbytes)

    # -- rollback snapshots (V.SNAPSHOT / V.RESTORE / V.COMMIT; see rollback.py) -----

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

    # -- reads -----------------------------------------------------------------------

    def fetch_range(
        self, sid: bytes, layer: int, start: int, end: int, *, native: bool = False
    ) -> npt.NDArray[np.generic] | None:
        """Rows ``start .. end`` of one layer as ``[end-start, dim]`` fp32 (stored fp16
        when ``native`` and the layer is fp16); None when the layer holds no rows or
        ``start >= tpl``. Arrays may be read-only views: do not write to them."""
        live = self._range_layer(sid, layer, start, end, native)
        return None if live is None else live.read(start, end, native)

    def fetch_range_pieces(
        self, sid: bytes, layer: int, start: int, end: int, *, native: bool = False
    ) -> Pieces | None:
        """:meth:`fetch_range` as pieces to compute later, on any thread
        (``Layer.read_pieces``); checked, counted and LRU-touched now."""
        live = self._range_layer(sid, layer, start, end, native)
        return None if live is None else live.read_pieces(start, end, native)

    def _range_layer(
        self, sid: bytes, layer: int, start: int, end: int, native: bool
    ) -> Layer | None:
        s = self._get(sid)
        self._check_layer(layer)
        self._check_rows(start, end)
        lay = s.layers.get(layer)
        live = lay if lay is not None and start < lay.tpl else None
        self._check_reply([live], start, end, native)
        self._touch(s)
        self.total_fetches += 1
        return live

    def fetch_batch(
        self,
        sid: bytes,
        start: int,
        end: int,
        num_layers: int | None = None,
        *,
        native: bool = False,
    ) -> list[npt.NDArray[np.generic] | None] | None:
        """``fetch_range`` over layers ``0 .. L-1`` (L = ``num_layers``, else the
        session's); None when the session holds no rows at all."""
        live = self._batch_layers(sid, start, end, num_layers, native)
        if live is None:
            return None
        return [None if lay is None else lay.read(start, end, native) for lay in live]

    def fetch_batch_pieces(
        self,
        sid: bytes,
        start: int,
        end: int,
        num_layers: int | None = None,
        *,
        native: bool = False,
    ) -> list[Pieces | None] | None:
        """:meth:`fetch_batch` as pieces to compute later (see fetch_range_pieces)."""
        live = self._batch_layers(sid, start, end, num_layers, native)
        if live is None:
            return None
        return [None if lay is None else lay.read_pieces(start, end, native) for lay in live]

    def _batch_layers(
        self, sid: bytes, start: int, end: int, num_layers: int | None, native: bool
    ) -> list[Layer | None] | None:
        s = self._get(sid)
        self._check_rows(start, end)
        if num_layers is not None and not 1 <= num_layers <= self.limits.max_layers:
            raise PionError(f"num_layers out of range (1..{self.limits.max_layers})")
        if s.rows == 0:
            return None
        count = s.num_layers if num_layers is None else num_layers
        picked = [s.layers.get(i) for i in range(count)]
        live = [lay if lay is not None and start < lay.tpl else None for lay in picked]
        self._check_reply(live, start, end, native)
        self._touch(s)
        self.total_fetches += count
        return live

    def fetch_ids(
        self, sid: bytes, layer: int, ids: Sequence[int]
    ) -> npt.NDArray[np.float32] | None:
        """fp32 rows in the order of ``ids`` (ids of rows not held are zeros); None
        when no id names a held row. At most ``max_fetch_ids`` ids: the reply is
        bounded by that, whatever the ids."""
        s = self._get(sid)
        self._check_layer(layer)
        if not 1 <= len(ids) <= self.limits.max_fetch_ids:
            raise PionError(f"between 1 and {self.limits.max_fetch_ids} ids per fetch")
        # Clip before converting: a hostile id beyond int64 must not raise OverflowError.
        bound = self.limits.max_rows + 1
        wanted = np.array([min(max(i, -1), bound) for i in ids], dtype=np.int64)
        self._touch(s)
        self.total_fetches += 1
        lay = s.layers.get(layer)
        if lay is None or not any(((wanted >= r.lo) & (wanted < r.hi)).any() for r in lay.runs):
            return None
        return lay.gather(wanted)

    # -- snapshot and replay ---------------------------------------------------------

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

    # -- internals -------------------------------------------------------------------

    def _get(self, sid: bytes) -> Session:
        s = self._sessions.get(sid)
        if s is None:
            raise SessionNotFoundError()
        return s

    def _touch(self, s: Session) -> None:
        self._clock += 1
        s.clock = self._clock
        self._lru.touch(s.group)

    def _journal(self, m: Mutation) -> None:
        if self.journal is not None:
            self.journal.append(m)
        if self.watchers.names and not isinstance(m, SnapshotIds):
            self.watchers.touch(m.sid)

    def lease(self, sid: bytes, layer: int, holder: npt.NDArray[np.uint8]) -> None:
        """Count ``holder`` as a reader of every run of the layer (``Run.lend``): while
        it lives, a write copies the run first instead of writing into it. For rows
        handed over with ``adopt`` that others still read (a streamed fill's reply)."""
        lay = self._get(sid).layers.get(layer)
        for run in lay.runs if lay is not None else ():
            run.lend(holder)

    def check_read(self, start: int, end: int, layer: int | None = None) -> None:
        """The bounds a fetch of rows ``start .. end`` (of ``layer``) is held to, for a
        reply built outside the store (a fill's rows streamed as they arrive)."""
        if layer is not None:
            self._check_layer(layer)
        self._check_rows(start, end)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.limits.max_layers:
            raise PionError(f"layer_id out of range (0..{self.limits.max_layers - 1})")

    def _check_rows(self, start: int, end: int) -> None:
        if start < 0 or end <= start:
            raise PionError("invalid range: end must exceed start (>=0)")
        if end > self.limits.max_rows:
            raise PionError(f"rows out of range (end must be <= {self.limits.max_rows})")

    def _check_reply(
        self, layers: Sequence[Layer | None], start: int, end: int, native: bool
    ) -> None:
        """Bound a fetch reply before building it: its size, and the zero rows (never
        written) it pads beside the held rows it carries (see the module docstring)."""
        size = held = 0
        for lay in layers:
            if lay is not None:
                width = lay.dim * (2 if native and lay.is_fp16 else 4)
                size += (end - start) * width
                held += lay.held_in(start, end) * width
        if size > MAX_REPLY_BYTES:
            raise PionError(
                f"reply of {size} bytes exceeds the {MAX_REPLY_BYTES}-byte limit; fetch fewer rows"
            )
        zeros = size - held
        if zeros > max(MAX_ZERO_FILL_BYTES, held):
            raise PionError(
                f"rows {start}..{end} would reply {zeros} bytes of zeros for rows never "
                f"written beside {held} bytes of stored rows (zero fill is limited to the "
                f"larger of {MAX_ZERO_FILL_BYTES} bytes and the stored bytes); fetch the "
                "stored rows (V.INFO layer_<i>_tokens)"
            )

    def _layout(self, s: Session, layer: int) -> tuple[int, Codec]:
        self._check_layer(layer)
        lay = s.layers.get(layer)
        if lay is not None:
            return lay.dim, lay.codec
        if s.schema is not None:
            raise PionError(f"layer {layer} is beyond this session's SCHEMA of {len(s.schema)}")
        return s.default_dim, get_codec(s.default_fmt)

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

    def _make_room_for_bytes(self, spare: Group, grow: int) -> None:
        """Evict LRU groups holding bytes (never ``spare``, the writer's own) until a
        write growing ``vstore_bytes`` by ``grow`` fits the budget; evict nothing and
        raise OOMError when it cannot fit. Examines only the groups it evicts."""
        budget = self.maxmemory
        if budget <= 0 or grow <= 0:
            return
        used = self.vstore_bytes + self.external_bytes()
        if used + grow <= budget:
            return
        if grow > budget:
            raise OOMError(
                f"command not allowed: a write of {grow} bytes is larger than "
                f"maxmemory ({budget} bytes)"
            )
        excess = used + grow - budget
        evictable = self.vstore_bytes - self._lru.bytes_of(spare)
        if evictable < excess:
            raise OOMError(
                f"command not allowed when used memory > 'maxmemory': the write needs "
                f"{grow} bytes, {used} of {budget} are held and only "
                f"{evictable} are evictable"
            )
        plan: list[Group] = []
        freed = 0
        for group in self._lru.holding(spare):
            if freed >= excess:
                break
            plan.append(group)
            freed += self._lru.bytes_of(group)
        for group in plan:
            self._evict(group)

    def _evict(self, group: Group) -> None:
        for sid in group:
            if sid in self._sessions:
                self._journal(DropSession(sid, "evict"))
                self._apply_drop(sid)
                self.evictions += 1

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

    def _apply_drop(self, sid: bytes) -> None:
        s = self._sessions.pop(sid)
        nbytes = s.nbytes
        self.vstore_bytes -= nbytes
        self.total_tokens -= s.rows
        self._lru.remove(s.group, nbytes)
        heapq.heappush(self._free_slots, s.slot)
        self._notify(sid)

    def _changed(self, s: Session) -> None:
        self._generation += 1
        s.generation = self._generation
        self._notify(s.sid)

    def _notify(self, sid: bytes) -> None:
        for listener in self.change_listeners:
            listener(sid)
