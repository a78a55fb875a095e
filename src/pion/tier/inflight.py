"""A fill whose rows are still arriving, and fetch replies streamed from it.

A fetch of a prefix only the tier holds used to read the whole namespace, store it,
and only then reply: the tier read and the client's read of the reply, each about as
long as the other, ran one after the other. Here the read runs on a thread of its own
(:meth:`InFlightFill.start`: every node at once, ``rowread``), each chunk is checked
as it lands (``held_rows``), and a layer becomes readable once all its chunks have
landed; a ``V.FETCH`` reply is a :class:`~pion.commands.deferred.Stream` whose pieces
wait for their layer, so the first layers go out while the last are still being read.

What the V-store sees does not change: the sessions appear there only once every
chunk has landed and passed its checks, all at once (:meth:`InFlightFill.commit`, on
the event loop, ``fill.commit_fill``); until then the V-store does not hold them. A
fill that fails (the tier goes away, a chunk is missing or malformed) stores nothing.

Reading the rows before the commit: each layer gets a private
:class:`~pion.vstore.layer.Layer` over the receive buffer, built once its chunks have
landed, so a reply holds exactly what the V-store would serve after the commit (runs,
holes as zeros, the codec's decode). The commit hands the receive buffers to the
V-store as they are (adopted, no copy); a layer some reply reads is also leased to it
(``VStore.lease``, the copy-on-write lease its own fetches use), so a later write into
those rows copies the run first and never changes bytes a reply is still sending.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from pion.codecs import Codec
from pion.errors import NotYet, PionError, TierError
from pion.tier.fill import Fill, LayerRows, batches, commit_fill, held_rows
from pion.tier.journal import FillGate, TierJournal
from pion.tier.keys import CHUNK_ROWS
from pion.tier.remote import Remote
from pion.vstore import VStore
from pion.vstore.layer import Layer, Run
from pion.vstore.reads import check_reply_bytes

__all__ = ["InFlightFill", "Ready", "streamable"]

# ``ready(go)``: call ``go()`` once a layer has landed (see InFlightFill.reply).
Ready = Callable[[Callable[[], None]], None]


def streamable(plans: Sequence[Fill]) -> bool:
    """A fill small enough to be one read (``fill.batches``): rows held once, as
    received."""
    refs = [ref for p in plans for ref in p.chunks]
    return len(list(itertools.islice(batches(refs), 2))) <= 1


class _LayerState:
    """One layer of the fill: its receive buffer, chunks still to land, and the
    private Layer readers use once they have."""

    __slots__ = (
        "at",
        "built",
        "codec",
        "dim",
        "held",
        "holder",
        "landed",
        "left",
        "rows",
        "shared",
        "waiters",
    )

    def __init__(self, rows: LayerRows, at: int, codec: Codec, dim: int) -> None:
        self.rows = rows
        self.codec = codec
        self.dim = dim
        self.at = at  # index of its first chunk in the fill's wants
        self.held = [0] * len(rows.refs)
        self.left = len(rows.refs)
        self.landed = threading.Event()
        self.waiters: list[Callable[[], None]] = []  # told once it has landed (or failed)
        self.built: Layer | None = None
        # Set when a reply reads the layer: ``shared`` is the receive buffer as replies
        # see it, an array whose every view keeps ``holder`` alive, and ``holder`` is
        # what the V-store is told its adopted run is lent to (see the module docstring).
        self.holder: npt.NDArray[np.uint8] | None = None
        self.shared: npt.NDArray[np.uint8] | None = None

    def share(self) -> npt.NDArray[np.uint8]:
        if self.shared is None:
            buf = self.rows.rows
            self.holder = buf.reshape(-1)  # a view (numpy bases views on the owner)
            # An array over a memoryview of ``holder``: views of it are based on it, and
            # it holds the memoryview, which holds ``holder``.
            flat = np.frombuffer(self.holder.data, dtype=np.uint8)
            self.shared = flat.reshape(buf.shape)
        return self.shared


class InFlightFill:
    """The rows of ``plans`` being read from the tier (see the module docstring)."""

    def __init__(self, plans: Sequence[Fill], max_rows: int) -> None:
        self.plans = tuple(plans)
        self.sids = frozenset(p.meta.sid for p in plans)
        self.max_rows = max_rows
        self.error: BaseException | None = None
        self.read = threading.Event()  # every chunk landed, or the read failed
        self._read_waiters: list[Callable[[], None]] = []  # told once it is
        self.committed = False  # settled: committed, refused or failed (loop thread)
        self._lock = threading.Lock()
        self._layers: dict[tuple[bytes, int], _LayerState] = {}
        self._owner: list[_LayerState] = []  # each want's layer
        metas = {p.meta.sid: p.meta for p in plans}
        refs = [ref for p in plans for ref in p.chunks]
        for (sid, layer), group in itertools.groupby(refs, key=lambda r: (r.sid, r.layer)):
            layout = metas[sid].layout
            spec = layout.layer(layer)
            assert spec is not None  # plan_fill read row_bytes of this layer already
            rows = LayerRows(list(group))
            state = _LayerState(rows, len(self._owner), layout.codec(layer), spec[1])
            self._layers[sid, layer] = state
            self._owner += [state] * len(state.rows.refs)

    # -- reading (a thread of its own) --------------------------------------------------

    def start(self, remote: Remote, on_read: Callable[[InFlightFill], None]) -> None:
        """Read every chunk on a new thread; ``on_read(self)`` when done (on that
        thread: it must hand over to the event loop)."""
        wants = [w for state in self._layers.values() for w in state.rows.wants()]

        def run() -> None:
            try:
                remote.read_into(wants, self._landed)
            except BaseException as exc:
                self._fail(exc)
            else:
                if any(state.left for state in self._layers.values()):
                    self._fail(TierError("the tier's reply lacks chunks"))
            with self._lock:
                self.read.set()
                waiters, self._read_waiters = self._read_waiters, []
            on_read(self)
            for go in waiters:
                go()

        threading.Thread(target=run, name="pion-tier-fill", daemon=True).start()

    def _landed(self, index: int, size: int) -> None:
        state = self._owner[index]
        ref = state.rows.refs[index - state.at]
        try:
            held = held_rows(ref, size)
        except Exception as exc:
            self._fail(exc)
            return
        with self._lock:
            state.held[index - state.at] = held
            state.left -= 1
            if state.left:
                return
            state.landed.set()
            waiters, state.waiters = state.waiters, []
        for go in waiters:
            go()

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        for state in self._layers.values():  # wake every reader: they raise
            with self._lock:
                state.landed.set()
                waiters, state.waiters = state.waiters, []
            for go in waiters:
                go()

    def when_read(self, go: Callable[[], None]) -> None:
        """``go()`` once every chunk has landed or the read failed (at once if so;
        else on the reading thread, after the commit was handed to the loop)."""
        with self._lock:
            if not self.read.is_set():
                self._read_waiters.append(go)
                return
        go()

    def _when_landed(self, state: _LayerState, go: Callable[[], None]) -> None:
        """``go()`` once the layer has landed or the read failed (at once if so)."""
        with self._lock:
            if not state.landed.is_set():
                state.waiters.append(go)
                return
        go()

    # -- replies (handlers on the loop, pieces on worker threads) -----------------------

    def layers_of(self, sid: bytes) -> dict[int, int]:
        """``layer -> rows`` (high-water mark) of ``sid`` in the tier's copy."""
        for p in self.plans:
            if p.meta.sid == sid:
                return dict(p.meta.tpl)
        return {}

    def num_layers(self, sid: bytes) -> int:
        """What ``Session.num_layers`` will be once committed."""
        for p in self.plans:
            if p.meta.sid == sid:
                if p.meta.layout.schema is not None:
                    return len(p.meta.layout.schema)
                return max(p.meta.tpl) + 1 if p.meta.tpl else 0
        return 0

    def reply(
        self, sid: bytes, layers: Sequence[int], start: int, end: int, native: bool
    ) -> list[tuple[int, Ready, Callable[[], npt.NDArray[np.generic]]] | None]:
        """The bulks of ``fetch_range``/``fetch_batch`` of rows ``start .. end`` of
        ``layers`` as ``(nbytes, ready, piece)`` (None for a layer holding no row from
        ``start``), checked now against the bounds the V-store checks with the rows the
        tier's bitmap promises. ``ready(go)`` calls ``go()`` once the layer has landed
        (or the read failed); ``piece()`` then computes its bytes (any thread; it
        waits for the layer itself if called before) and checks them again with the
        rows that landed. Raises PionError."""
        tpl = self.layers_of(sid)
        out: list[tuple[int, Ready, Callable[[], npt.NDArray[np.generic]]] | None] = []
        size = held = 0
        for layer in layers:
            if tpl.get(layer, 0) <= start:
                out.append(None)
                continue
            state = self._layers[sid, layer]
            width = state.dim * (2 if native and state.codec.name == "fp16" else 4)
            size += (end - start) * width
            held += _promised(state.rows, start, end) * width
            state.share()
            piece = partial(self._piece, state, width, start, end, native)
            out.append(((end - start) * width, partial(self._when_landed, state), piece))
        check_reply_bytes(size, held, start, end)
        return out

    def wait_first(
        self, sid: bytes, layers: Sequence[int], start: int, *, may_wait: bool = False
    ) -> None:
        """Wait for the first of ``layers`` a reply carries (raising the read's
        failure): a tier that fails before any payload goes out is an error reply, not
        a cut connection. ``may_wait``: raise :class:`NotYet` rather than block."""
        tpl = self.layers_of(sid)
        for layer in layers:
            if tpl.get(layer, 0) > start:
                state = self._layers[sid, layer]
                if may_wait and not state.landed.is_set():
                    raise NotYet(partial(self._when_landed, state))
                self._built(state)
                return

    def _built(self, state: _LayerState) -> Layer:
        """The layer's rows once landed (each read is bounded by --tier-timeout)."""
        state.landed.wait()
        if state.left:  # woken by a failure before its own chunks all landed
            assert self.error is not None
            raise _as_tier_error(self.error)
        with self._lock:
            if state.built is None:
                # Runs over the receive buffer itself, as the V-store's would be after an
                # adopting store (no copy): each run a live range of the one buffer.
                lay = Layer(state.codec, state.dim)
                buf, base = state.share(), state.rows.first * CHUNK_ROWS
                for first, rows in state.rows.runs(state.held):
                    top = first + int(rows.shape[0])
                    lay.runs.append(Run(base, buf, first, top))
                    lay.held += top - first
                    lay.tpl = top
                state.built = lay
            return state.built

    def _piece(
        self, state: _LayerState, width: int, start: int, end: int, native: bool
    ) -> npt.NDArray[np.generic]:
        """One layer's reply bytes (a worker thread): waits for the layer to land."""
        lay = self._built(state)
        check_reply_bytes((end - start) * width, lay.held_in(start, end) * width, start, end)
        with self._lock:  # leases are lists on the shared runs
            parts = lay.read_pieces(start, end, native).parts
        computed = [part() for part in parts]
        return computed[0] if len(computed) == 1 else np.concatenate(computed)

    # -- the commit (the event loop) -------------------------------------------------

    def commit(self, vstore: VStore, journal: TierJournal, gate: FillGate) -> int:
        """Store the rows read (after :attr:`read`), all or nothing; returns the row
        bytes stored. Raises the read's failure, or what the V-store refused."""
        if self.error is not None:
            raise self.error
        layers = [(state.rows, state.held) for state in self._layers.values()]
        filled = commit_fill(vstore, journal, gate, self.plans, layers)
        for (sid, layer), state in self._layers.items():
            if state.holder is not None:  # replies may still be sending these rows
                vstore.lease(sid, layer, state.holder)
        return filled


def _promised(rows: LayerRows, start: int, end: int) -> int:
    """Rows among ``start .. end`` the chunks to read hold, as the bitmap promises."""
    held = 0
    for ref in rows.refs:
        lo = ref.block * CHUNK_ROWS
        held += max(0, min(end, lo + ref.rows) - max(start, lo))
    return held


def _as_tier_error(exc: BaseException) -> PionError:
    if isinstance(exc, PionError):
        return exc
    return TierError(f"the tier failed while the session was being read ({exc})")
