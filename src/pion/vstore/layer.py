"""One layer of a V-store session: a growable buffer of rows in their stored format.

A layer owns a zero-filled ``uint8`` buffer ``[capacity, row_bytes]`` and a high-water
mark ``tpl`` (the largest ``start + count`` ever stored). Invariant: every byte of a row
at or beyond ``tpl`` is zero, and an all-zero stored row decodes to zeros in every
format, so rows never written read back as zeros without any bookkeeping.

Memory. The first store allocates exactly the rows it needs (a prefix usually arrives
in one batch). Growing past the capacity multiplies it by at most :data:`GROWTH` (never
beyond the configured row limit), so appends cost amortised O(1) copies while a layer
holds at most ``GROWTH`` times its ``tpl`` rows; the slack is calloc'd and untouched,
so resident memory stays near ``tpl * row_bytes`` (DESIGN section 7: within ~1.3x).

Reads hand out numpy views of the buffer (the fp16 ``FMT NATIVE`` path replies without
copying). A view may still be queued on a socket when a later command overwrites the
same rows, so writes are copy-on-write: the layer keeps a weak reference to every view
it handed out, and while any of them is alive a write first moves the layer to a fresh
copy, so the reader keeps the old bytes. Correctness rests on object lifetime (a
weak reference dies only once nothing holds the view), not on reference-count values,
so it holds on every Python; an interpreter that frees late only costs extra copies.
The lease is on the view object itself: numpy points a derived view's ``base`` at the
buffer, not at the view it came from, so the view a read returns must be what the
reply holds (``V.FETCH`` hands it to the encoder as it is).

Reads can also be split (:meth:`Layer.read_pieces`): the rows are leased now, on the
thread that owns the store, and decoded later, piece by piece, on any thread (a server
sends one piece while it decodes the next). The lease is what makes that safe: a write
meanwhile moves the layer to a fresh buffer and the pieces still decode the old one.

Not here: sessions, LRU, accounting and the journal (``pion.vstore.store``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from pion.codecs import Codec

__all__ = ["GROWTH", "Layer", "Pieces"]

# Growth factor of a layer's capacity. 1.25 keeps the worst-case slack (and so the
# allocated-but-unused bytes) at 25% of what a layer holds, below the 1.3x budget,
# while appends still copy each byte only ~4 times in total.
GROWTH = 1.25

# fp32 output bytes decoded per slice of a big read (see Layer.read). Smaller slices
# measured 10-20% slower here; 16 MiB still bounds a long read's temporaries.
DECODE_CHUNK_BYTES = 16 << 20

U8Array = npt.NDArray[np.uint8]


class Pieces(NamedTuple):
    """A read split in pieces (:meth:`Layer.read_pieces`): its size in bytes, the
    pieces in order (each computes its part of the rows), and whether computing them
    converts numbers (False for stored fp16 handed out as it is)."""

    nbytes: int
    parts: list[Callable[[], npt.NDArray[np.generic]]]
    converts: bool


class Layer:
    """Rows of one (session, layer): ``dim`` values per row, stored by ``codec``."""

    __slots__ = ("_readers", "buf", "codec", "dim", "row_bytes", "tpl")

    def __init__(self, codec: Codec, dim: int) -> None:
        self.codec = codec
        self.dim = dim
        self.row_bytes = codec.row_bytes(dim)
        self.buf: U8Array = np.zeros((0, self.row_bytes), dtype=np.uint8)
        self.tpl = 0
        # Views of ``buf`` handed to readers (see the module docstring).
        self._readers: list[weakref.ref[npt.NDArray[np.generic]]] = []

    def _lend(self, view: npt.NDArray[np.generic]) -> None:
        view.flags.writeable = False
        self._readers = [r for r in self._readers if r() is not None]
        self._readers.append(weakref.ref(view))

    def _lent(self) -> bool:
        """True while a view handed out earlier is still alive somewhere."""
        return any(r() is not None for r in self._readers)

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[0])

    @property
    def nbytes(self) -> int:
        """Stored-format bytes this layer holds: ``tpl * row_bytes``."""
        return self.tpl * self.row_bytes

    @property
    def allocated(self) -> int:
        return self.capacity * self.row_bytes

    @property
    def is_fp16(self) -> bool:
        return self.codec.name == "fp16"

    def write(self, start: int, rows: U8Array, max_rows: int) -> int:
        """Store ``rows`` (``[count, row_bytes]`` stored format) at ``start``; returns by
        how many rows ``tpl`` grew. The caller has checked ``start + count <= max_rows``."""
        end = start + int(rows.shape[0])
        if end > self.capacity:
            self._grow(end, max_rows)
        elif self._lent():
            self._reallocate(self.capacity)
        self.buf[start:end] = rows
        grown = max(0, end - self.tpl)
        self.tpl += grown
        return grown

    def _grow(self, end: int, max_rows: int) -> None:
        cap = self.capacity
        # Never past max_rows by growth, but always enough for this write (replay may
        # carry rows from a run with a larger limit).
        cap = max(end, min(max_rows, int(cap * GROWTH))) if cap else end
        self._reallocate(cap)

    def _reallocate(self, capacity: int) -> None:
        # np.zeros is calloc: the slack past tpl stays untouched, so not resident.
        fresh = np.zeros((capacity, self.row_bytes), dtype=np.uint8)
        fresh[: self.tpl] = self.buf[: self.tpl]
        self.buf = fresh
        self._readers = []  # their views point into the old buffer

    def trim(self) -> int:
        """Shrink the capacity to ``tpl``; returns the bytes released."""
        released = self.allocated - self.nbytes
        if released:
            self._reallocate(self.tpl)
        return released

    def truncate(self, length: int) -> int:
        """Cut the layer back to ``length`` rows (V.RESTORE); returns the rows removed.
        Never grows it. Rows are self-contained in every format (each row carries its
        own block scales, biases or norms), so the rows below ``length`` decode exactly
        as before without any saved state.

        The cut rows become zero bytes again (the invariant of the module docstring).
        A cut of at most half the layer zeroes them in place and keeps the capacity, so
        a speculative decoder's append/rollback cycle never copies the layer; a larger
        one moves the rows to a buffer of ``GROWTH`` times what is left. A buffer a
        reader may still hold is never written: it is replaced, like a write does."""
        if length >= self.tpl:
            return 0
        removed = self.tpl - length
        self.tpl = length
        if self.capacity > 2 * length:
            self._reallocate(int(length * GROWTH))
        elif self._lent():
            self._reallocate(self.capacity)
        else:
            self.buf[length : length + removed] = 0
        return removed

    def stored(self) -> U8Array:
        """A read-only view of the stored rows ``[tpl, row_bytes]``."""
        view = self.buf[: self.tpl]
        self._lend(view)
        return view

    def read(self, start: int, end: int, native: bool) -> npt.NDArray[np.generic]:
        """Rows ``start .. end`` as ``[end - start, dim]``: fp32, or the stored fp16 values
        when ``native`` and this is an fp16 layer. The caller ensures ``start < tpl``."""
        live = min(end, self.tpl)
        if native and self.is_fp16:
            if end <= self.capacity:
                # Rows past tpl are zero bytes = +0.0 in fp16: a view is the answer.
                view = self.buf[start:end].view("<f2")
                self._lend(view)
                return view
            out16 = np.zeros((end - start, self.dim), dtype="<f2")
            out16[: live - start] = self.buf[start:live].view("<f2")
            return out16
        # Block decoders make full-size temporaries: decode big reads in slices into
        # one output (bounded memory, cache-friendly). fp16 is a single cast.
        step = live - start if self.is_fp16 else max(1, DECODE_CHUNK_BYTES // (4 * self.dim))
        if end <= self.tpl and end - start <= step:
            return self.codec.decode(self.buf[start:end], self.dim)
        out = np.empty((end - start, self.dim), dtype=np.float32)
        out[live - start :] = 0
        for lo in range(start, live, step):
            hi = min(live, lo + step)
            out[lo - start : hi - start] = self.codec.decode(self.buf[lo:hi], self.dim)
        return out

    def read_pieces(self, start: int, end: int, native: bool) -> Pieces:
        """:meth:`read` split in pieces of at most ``DECODE_CHUNK_BYTES`` that may run
        later on any thread (module docstring): the rows are leased now. The pieces,
        concatenated, are exactly ``read(start, end, native)``; ``start < tpl``."""
        live = min(end, self.tpl)
        if native and self.is_fp16:
            # The stored bits are the reply: one view, past tpl the zeros after it.
            view = self.buf[start:live].view("<f2")
            self._lend(view)
            pieces: list[Callable[[], npt.NDArray[np.generic]]] = [partial(_same, view)]
            pieces += _zeros(end - live, self.dim, np.dtype("<f2"))
            return Pieces((end - start) * self.dim * 2, pieces, False)
        rows = self.buf[start:live]
        self._lend(rows)
        step = max(1, DECODE_CHUNK_BYTES // (4 * self.dim))
        codec, dim = self.codec, self.dim
        pieces = [
            partial(codec.decode, rows[lo : lo + step], dim) for lo in range(0, live - start, step)
        ]
        pieces += _zeros(end - live, dim, np.dtype(np.float32))
        return Pieces((end - start) * dim * 4, pieces, True)

    def gather(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """fp32 rows in the order of ``ids``; ids outside ``0 .. tpl-1`` are zeros."""
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        live = (ids >= 0) & (ids < self.tpl)
        if live.any():
            out[live] = self.codec.decode(self.buf[ids[live]], self.dim)
        return out


def _same(view: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    return view


def _zeros(
    rows: int, dim: int, dtype: np.dtype[np.generic]
) -> list[Callable[[], npt.NDArray[np.generic]]]:
    """Pieces of ``rows`` zero rows (rows never written), at most DECODE_CHUNK_BYTES each."""
    step = max(1, DECODE_CHUNK_BYTES // (dtype.itemsize * dim))
    return [partial(np.zeros, (min(step, rows - lo), dim), dtype) for lo in range(0, rows, step)]
