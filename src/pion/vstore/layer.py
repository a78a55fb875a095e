"""One layer of a V-store session: rows in their stored format, held as sparse runs.

A layer holds *runs*: each a zero-filled ``uint8`` buffer ``[capacity, row_bytes]``
covering the rows ``base .. top`` (its *extent*), of which ``lo .. hi`` are live. Rows
outside every run (*holes*) are never allocated and read as zeros, so a write far past
the stored rows costs its own rows only, in memory, in the log and in snapshots.

Invariants: extents are disjoint and sorted; every buffer byte outside its live rows
is zero, and an all-zero stored row decodes to zeros in every format, so slack and
holes read back as zeros without bookkeeping. ``tpl`` (the high-water mark) is the
largest ``hi``; ``held`` is the number of live rows, the rows the layer pays for. A
live range may include rows never written when a write landed in its run's slack
(they are zero rows the buffer holds anyway).

Writes. A write that overlaps or touches a run's extent goes into that run (merging
every run it spans); any other write starts a new run of exactly its rows. A write past
a run's extent reallocates it with slack of :data:`GROWTH` - 1 (25%) of its live rows
on that side (never into a neighbour), so rows written in ascending order (appends, the
common case) or descending order cost amortised O(1) copies each, and a run's buffer
holds at most 1.25x its live rows after appends (1.5x when it also grew downward).
Growing copies live rows only: the zero-filled slack (``np.zeros`` is calloc) is never
touched, so it is not resident. :meth:`Layer.reserve` sizes a run exactly before its
rows arrive highest first (snapshot loading), so loading copies nothing.

Truncation (``V.RESTORE``, :meth:`Layer.truncate`) cuts the layer back to a length:
runs entirely at or above it go whole, and the run that straddles it keeps its rows
below, the rows cut becoming zero bytes again (the invariant above). A cut that leaves
the straddling run's buffer at most twice its live rows zeroes them in place and keeps
the extent, so a speculative decoder's append/rollback cycle never copies; a larger one
moves the live rows to a buffer of :data:`GROWTH` times them. Holes below the length
stay holes. Rows are self-contained in every format (each carries its own scales,
biases or norms), so the rows kept decode exactly as before.

Reads hand out numpy views of a buffer (the fp16 ``FMT NATIVE`` path replies without
copying). A view may still be queued on a socket when a later command overwrites the
same rows, so writes are copy-on-write: a run keeps a weak reference to every view it
handed out, and while any of them is alive a write first moves the run to a fresh
copy, so the reader keeps the old bytes. Correctness rests on object lifetime (a weak
reference dies only once nothing holds the view), not on reference-count values, so it
holds on every Python; an interpreter that frees late only costs extra copies. The
lease is on the view object itself (numpy points a derived view's ``base`` at the
buffer, not at the view it came from), so the view a read returns must be what the
reply holds (``V.FETCH`` hands it to the encoder as it is).

Reads can also be split (:meth:`Layer.read_pieces`): the rows are leased now, on the
thread that owns the store, and decoded later, piece by piece, on any thread (a server
sends one piece while it decodes the next). The lease is what makes that safe: a write
meanwhile moves the run to a fresh buffer and the pieces still decode the old one. Each
piece holds the leased view itself (not a view derived from it, whose ``base`` would
be the buffer), so the lease lasts until the last piece has run and been sent.

Not here: sessions, LRU, accounting, the journal and limits (``pion.vstore.store``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from pion.codecs import Codec

__all__ = ["GROWTH", "Layer", "Pieces", "Run"]

# Growth factor of a run's capacity when a write passes its extent. 1.25 keeps the
# worst-case slack (allocated but unused, and never touched) at 25% of what a run
# holds on each side, while appends still copy each byte only ~4 times in total.
GROWTH = 1.25

# fp32 output bytes decoded per slice of a big read (see Layer.read). Smaller slices
# measured 10-20% slower here; 16 MiB still bounds a long read's temporaries.
DECODE_CHUNK_BYTES = 16 << 20

U8Array = npt.NDArray[np.uint8]

View = npt.NDArray[np.generic]
ViewT = TypeVar("ViewT", bound=npt.NDArray[Any])


class Run:
    """Rows ``base .. base + len(buf)`` of a layer in one buffer; ``lo .. hi`` live."""

    __slots__ = ("base", "buf", "hi", "lo", "readers")

    def __init__(self, base: int, buf: U8Array, lo: int, hi: int) -> None:
        self.base = base
        self.buf = buf
        self.lo = lo
        self.hi = hi
        # Views of ``buf`` handed to readers (see the module docstring).
        self.readers: list[weakref.ref[View]] = []

    def lend(self, view: ViewT) -> ViewT:
        """Hand ``view`` (of this run's buffer) to a reader: read-only, and leased."""
        view.flags.writeable = False
        self.readers = [r for r in self.readers if r() is not None]
        self.readers.append(weakref.ref(view))
        return view

    def lent(self) -> bool:
        """True while a view handed out earlier is still alive somewhere."""
        return any(r() is not None for r in self.readers)

    @property
    def top(self) -> int:
        return self.base + int(self.buf.shape[0])

    def rows(self, start: int, end: int) -> U8Array:
        """The buffer rows ``start .. end`` (absolute, inside the extent)."""
        return self.buf[start - self.base : end - self.base]


class Pieces(NamedTuple):
    """A read split in pieces (:meth:`Layer.read_pieces`): its size in bytes, the
    pieces in order (each computes its part of the rows), and whether computing them
    converts numbers (False for stored fp16 handed out as it is)."""

    nbytes: int
    parts: list[Callable[[], npt.NDArray[np.generic]]]
    converts: bool


class Layer:
    """Rows of one (session, layer): ``dim`` values per row, stored by ``codec``."""

    __slots__ = ("codec", "dim", "held", "row_bytes", "runs", "tpl")

    def __init__(self, codec: Codec, dim: int) -> None:
        self.codec = codec
        self.dim = dim
        self.row_bytes = codec.row_bytes(dim)
        self.runs: list[Run] = []
        self.tpl = 0  # the largest live row + 1
        self.held = 0  # live rows, over all runs

    @property
    def nbytes(self) -> int:
        """Stored-format bytes this layer holds: ``held * row_bytes`` (holes are free)."""
        return self.held * self.row_bytes

    @property
    def allocated(self) -> int:
        return sum(r.top - r.base for r in self.runs) * self.row_bytes

    @property
    def is_fp16(self) -> bool:
        return self.codec.name == "fp16"

    # -- planning (pure: what a write would do) -----------------------------------------

    def _span(self, start: int, end: int) -> tuple[int, int]:
        """Indices ``i .. j`` (exclusive) of the runs whose extents overlap or touch
        rows ``start .. end``."""
        runs = self.runs
        i = 0
        while i < len(runs) and runs[i].top < start:
            i += 1
        j = i
        while j < len(runs) and runs[j].base <= end:
            j += 1
        return i, j

    def growth(self, start: int, end: int) -> int:
        """By how many rows ``held`` would grow if rows ``start .. end`` were written."""
        i, j = self._span(start, end)
        if i == j:
            return end - start
        runs = self.runs
        lo, hi = min(start, runs[i].lo), max(end, runs[j - 1].hi)
        return (hi - lo) - sum(r.hi - r.lo for r in runs[i:j])

    def runs_after(self, start: int, end: int) -> int:
        """How many runs the layer would have after writing rows ``start .. end``."""
        i, j = self._span(start, end)
        return len(self.runs) - (j - i) + 1

    def held_in(self, start: int, end: int) -> int:
        """Live rows among ``start .. end``."""
        return sum(max(0, min(end, r.hi) - max(start, r.lo)) for r in self.runs)

    # -- writing ---------------------------------------------------------------------

    def write(
        self, start: int, rows: U8Array, max_rows: int, *, adopt: bool = False
    ) -> tuple[int, int]:
        """Store ``rows`` (``[count, row_bytes]`` stored format) at ``start``; returns by
        how many rows ``held`` and ``tpl`` grew. ``max_rows`` bounds growth slack only
        (replay may carry rows from a run with a larger limit). ``adopt``: ``rows`` is
        the caller's own fresh array, which nothing else will write or keep; a write
        that starts a run of exactly its rows keeps it as the run's buffer, uncopied
        (a store's rows encoded once, in place; the tier's fill received in place)."""
        end = start + int(rows.shape[0])
        runs = self.runs
        old_tpl = self.tpl
        i, j = self._span(start, end)
        if i == j:
            # The caller hands ``rows`` over (a store's freshly encoded rows, or the
            # tier's fill, received in place): a writable contiguous block becomes the
            # run as it is.
            owned = adopt and rows.flags.writeable and rows.flags.c_contiguous
            if owned and rows.dtype == np.uint8:
                fresh = rows
            else:
                fresh = np.zeros((end - start, self.row_bytes), dtype=np.uint8)
                fresh[:] = rows
            runs.insert(i, Run(start, fresh, start, end))
            grown = end - start
        else:
            first, last = runs[i], runs[j - 1]
            lo, hi = min(start, first.lo), max(end, last.hi)
            before = sum(r.hi - r.lo for r in runs[i:j])
            if i + 1 == j and first.base <= start and end <= first.top and not first.lent():
                first.rows(start, end)[:] = rows
                first.lo, first.hi = lo, hi
            else:
                runs[i:j] = [self._merge(i, j, start, rows, max_rows)]
            grown = (hi - lo) - before
        self.held += grown
        self.tpl = max(r.hi for r in runs if r.hi > r.lo)
        return grown, self.tpl - old_tpl

    def _merge(self, i: int, j: int, start: int, rows: U8Array, max_rows: int) -> Run:
        """One run holding runs ``i .. j`` and ``rows`` at ``start``, in a fresh buffer
        whose extent covers theirs, grown geometrically where the write passes it (never
        into a neighbour, nor past ``max_rows`` unless the write itself goes there)."""
        runs = self.runs
        parts = runs[i:j]
        end = start + int(rows.shape[0])
        lo, hi = min(start, parts[0].lo), max(end, parts[-1].hi)
        floor = runs[i - 1].top if i else 0
        ceiling = runs[j].base if j < len(runs) else max_rows
        base, top = parts[0].base, parts[-1].top
        slack = int((hi - lo) * (GROWTH - 1))
        if start < base:
            base = max(floor, start - slack)
        if end > top:
            top = max(end, min(ceiling, end + slack))
        buf = np.zeros((top - base, self.row_bytes), dtype=np.uint8)
        for part in parts:  # live rows only: the zero slack stays untouched
            buf[part.lo - base : part.hi - base] = part.rows(part.lo, part.hi)
        buf[start - base : end - base] = rows
        return Run(base, buf, lo, hi)

    def reserve(self, start: int, end: int) -> bool:
        """Allocate a run for rows ``start .. end`` that will be written highest first
        (a snapshot's pieces), holding nothing yet; False (and nothing done) when a run
        already lies there."""
        i, j = self._span(start, end)
        if i != j or end <= start:
            return False
        buf = np.zeros((end - start, self.row_bytes), dtype=np.uint8)
        self.runs.insert(i, Run(start, buf, end, end))
        return True

    def trim(self) -> int:
        """Shrink every run's buffer to its live rows; returns the bytes released."""
        released = self.allocated - self.nbytes
        if released:
            trimmed = []
            for r in self.runs:
                if r.hi == r.lo:
                    continue  # reserved, never written
                exact = r.base == r.lo and r.top == r.hi
                trimmed.append(r if exact else self._reallocate(r, r.lo, r.hi))
            self.runs = trimmed
        return released

    def truncate(self, length: int) -> int:
        """Cut the layer back to ``length`` rows (V.RESTORE, see the module docstring);
        returns the live rows removed. Never grows it. A buffer a reader may still hold
        is never written: it is replaced, as a write does."""
        if length >= self.tpl:
            return 0
        kept: list[Run] = []
        removed = 0
        for r in self.runs:
            if r.hi <= length:
                kept.append(r)
            elif r.lo >= length:
                removed += r.hi - r.lo  # wholly above the cut: it goes
            else:
                removed += r.hi - length
                kept.append(self._cut(r, length))
        self.runs = kept
        self.held -= removed
        self.tpl = max((r.hi for r in kept), default=0)
        return removed

    def _cut(self, r: Run, length: int) -> Run:
        """Run ``r`` with its live rows from ``length`` up cut (``r.lo < length < r.hi``)."""
        live = length - r.lo
        if r.top - r.base > 2 * live:
            top = min(r.top, r.lo + int(live * GROWTH))
            return self._reallocate(Run(r.base, r.buf, r.lo, length), r.lo, top)
        if r.lent():
            return self._reallocate(Run(r.base, r.buf, r.lo, length), r.base, r.top)
        r.rows(length, r.hi)[:] = 0
        r.hi = length
        return r

    def _reallocate(self, r: Run, base: int, top: int) -> Run:
        """A run with ``r``'s live rows in a fresh buffer over ``base .. top`` (which
        covers them); ``r`` and its buffer are left as they are for their readers."""
        buf = np.zeros((top - base, self.row_bytes), dtype=np.uint8)
        buf[r.lo - base : r.hi - base] = r.rows(r.lo, r.hi)
        return Run(base, buf, r.lo, r.hi)

    # -- reading ---------------------------------------------------------------------

    def extents(self) -> list[tuple[int, U8Array]]:
        """``(first row, read-only view of the live rows)`` of every run, in row order."""
        out = []
        for r in self.runs:
            if r.lo == r.hi:
                continue  # reserved, nothing written yet
            out.append((r.lo, r.lend(r.rows(r.lo, r.hi))))
        return out

    def read(self, start: int, end: int, native: bool) -> npt.NDArray[np.generic]:
        """Rows ``start .. end`` as ``[end - start, dim]``: fp32, or the stored fp16 values
        when ``native`` and this is an fp16 layer. Rows outside every run are zeros."""
        f16 = native and self.is_fp16
        whole = next((r for r in self.runs if r.base <= start and end <= r.top), None)
        if whole is not None:
            if f16:
                # Slack and rows past tpl are zero bytes = +0.0 in fp16: a view is the answer.
                return whole.lend(whole.rows(start, end).view("<f2"))
            if self.is_fp16 or end - start <= self._step():
                return self.codec.decode(whole.rows(start, end), self.dim)
        # Zeros by calloc: the rows no run holds are never touched (not resident).
        out = np.zeros((end - start, self.dim), dtype="<f2" if f16 else np.float32)
        for r in self.runs:
            a, b = max(start, r.lo), min(end, r.hi)
            if a >= b:
                continue
            if f16:
                out[a - start : b - start] = r.rows(a, b).view("<f2")
            else:
                self._decode_into(r, a, b, out[a - start : b - start])
        return out

    def read_pieces(self, start: int, end: int, native: bool) -> Pieces:
        """:meth:`read` split in pieces of at most ``DECODE_CHUNK_BYTES`` of output that
        may be computed later, on any thread (module docstring): the rows of every run
        in the range are leased now, holes become pieces of zeros. The pieces,
        concatenated, are exactly ``read(start, end, native)``."""
        f16 = native and self.is_fp16
        dtype = np.dtype("<f2") if f16 else np.dtype(np.float32)
        dim, codec = self.dim, self.codec
        step = max(1, DECODE_CHUNK_BYTES // (dtype.itemsize * dim))
        parts: list[Callable[[], npt.NDArray[np.generic]]] = []
        pos = start
        for r in self.runs:
            a, b = max(start, r.lo), min(end, r.hi)
            if a >= b:
                continue
            parts += _zeros(a - pos, dim, dtype)  # a hole before this run
            if f16:
                # The stored bits are the reply: one leased view, sent as it is.
                parts.append(partial(_same, r.lend(r.rows(a, b).view("<f2"))))
            else:
                rows = r.lend(r.rows(a, b))
                parts += [
                    partial(_decode, codec, rows, lo, min(b - a, lo + step), dim)
                    for lo in range(0, b - a, step)
                ]
            pos = b
        parts += _zeros(end - pos, dim, dtype)
        return Pieces((end - start) * dim * dtype.itemsize, parts, not f16)

    def _step(self) -> int:
        # Block decoders make full-size temporaries: decode big reads in slices into one
        # output (bounded memory, cache-friendly). fp16 is a single cast.
        return max(1, DECODE_CHUNK_BYTES // (4 * self.dim))

    def _decode_into(self, run: Run, a: int, b: int, out: npt.NDArray[np.float32]) -> None:
        step = b - a if self.is_fp16 else self._step()
        for lo in range(a, b, step):
            hi = min(b, lo + step)
            self.codec.decode(run.rows(lo, hi), self.dim, out=out[lo - a : hi - a])

    def gather(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """fp32 rows in the order of ``ids``; ids outside every run are zeros."""
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        for r in self.runs:
            live = (ids >= r.lo) & (ids < r.hi)
            if live.any():
                out[live] = self.codec.decode(r.buf[ids[live] - r.base], self.dim)
        return out


def _same(view: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    return view


def _decode(codec: Codec, rows: U8Array, lo: int, hi: int, dim: int) -> npt.NDArray[np.float32]:
    """Rows ``lo .. hi`` of a leased view, decoded (a piece: holds ``rows`` itself)."""
    return codec.decode(rows[lo:hi], dim)


def _zeros(
    rows: int, dim: int, dtype: np.dtype[np.generic]
) -> list[Callable[[], npt.NDArray[np.generic]]]:
    """Pieces of ``rows`` zero rows (rows never written), at most DECODE_CHUNK_BYTES each."""
    step = max(1, DECODE_CHUNK_BYTES // (dtype.itemsize * dim))
    return [partial(np.zeros, (min(step, rows - lo), dim), dtype) for lo in range(0, rows, step)]
