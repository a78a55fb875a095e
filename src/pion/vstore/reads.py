"""The V-store's reads: ``V.FETCH`` in its forms, checked and bounded before anything
is built.

Reads. A fetch's reply may pad rows never written (past ``tpl`` or in holes) with
zeros, as Pion does, but never more of them than the rows it carries that are held
(or :data:`MAX_ZERO_FILL_BYTES`, whichever is larger): a small request cannot ask for
a huge reply of zeros. Replies are also bounded by :data:`MAX_REPLY_BYTES`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pion.errors import PionError
from pion.vstore.layer import Layer, Pieces
from pion.vstore.table import SessionTable

__all__ = ["MAX_REPLY_BYTES", "MAX_ZERO_FILL_BYTES", "Reads", "check_reply_bytes"]

# The largest fetch reply (one RANGE bulk, or a whole BATCH array) built in memory:
# 4 GiB serves 32 layers x 32k tokens x 1024 dims of fp32.
MAX_REPLY_BYTES = 4 << 30
# Zero rows (never written: past tpl or in a hole) a fetch reply may carry beyond as
# many bytes as it carries of held rows. Pion pads a RANGE past tpl with zeros, and
# clients ask for "a few rows more than stored"; 1 MiB covers that for any dim (32
# rows of 8192 fp32), while one RANGE 0 32768 on a 1-row 8192-wide session (1 GiB of
# zeros for 32 KB of data) is refused.
MAX_ZERO_FILL_BYTES = 1 << 20


def check_reply_bytes(size: int, held: int, start: int, end: int) -> None:
    """The bounds of a fetch reply of ``size`` bytes carrying ``held`` bytes of stored
    rows (rows ``start .. end``), checked before it is built (module docstring)."""
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


class Reads(SessionTable):
    """Fetches of rows, as fp32 (or stored fp16 with ``native``)."""

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
        check_reply_bytes(size, held, start, end)
