"""``V.FETCH`` (``BATCH``, ``RANGE``) of a session only the cluster tier holds: the
reply streams while the fill is still reading (``pion.tier.inflight``).

The handler in ``vstore.py`` asks :func:`fill_source` first. Without a fill to stream
from (no ``--tier``, the session held here, absent from the tier, or filled before the
reply because the copy is larger than one read) it answers from the V-store as
always. With one, the reply is a :class:`~pion.commands.deferred.Stream` of one piece
per layer, each handed to a worker once its layer's chunks have landed: checked now with the same
bounds and texts as the V-store's fetch, its bytes exactly what the V-store serves
once the fill is committed.

The reply waits for the first layer it carries before its header goes out, so a tier
that fails (or a copy found incomplete) by then is an ``-ERR``. A failure after that
cannot be retracted from a RESP reply already under way: the connection is closed, the
client sees it drop mid-reply, and the fill stores nothing (docs/tier.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.deferred import Awaiting, LazyBulk, Stream
from pion.commands.state import Context
from pion.errors import PionError
from pion.resp.reply import Reply
from pion.tier.inflight import InFlightFill

__all__ = ["batch_reply", "fill_source", "range_reply"]


def fill_source(ctx: Context, sid: bytes) -> InFlightFill | None:
    """The fill a fetch of ``sid`` streams from, or None to answer from the V-store
    (having filled it first when needed; raises as a required fill does)."""
    tier = ctx.state.tier
    return None if tier is None else tier.streaming_fill(sid, may_wait=ctx.may_wait)


def batch_reply(
    ctx: Context,
    fill: InFlightFill,
    sid: bytes,
    *,
    start: int,
    end: int,
    num_layers: int | None,
    native: bool,
) -> Stream:
    """``V.FETCH sid BATCH start end [num_layers]`` from the fill."""
    ctx.state.vstore.check_read(start, end)
    if not fill.layers_of(sid):
        raise PionError("V.FETCH BATCH: session has no stored layers")
    count = fill.num_layers(sid) if num_layers is None else num_layers
    return _stream(ctx, fill, sid, range(count), start=start, end=end, native=native, array=True)


def range_reply(
    ctx: Context, fill: InFlightFill, sid: bytes, *, layer: int, start: int, end: int, native: bool
) -> Reply | Stream:
    """``V.FETCH sid layer RANGE start end`` from the fill (nil: no row from start)."""
    ctx.state.vstore.check_read(start, end, layer)
    if fill.layers_of(sid).get(layer, 0) <= start:
        return None
    return _stream(ctx, fill, sid, [layer], start=start, end=end, native=native, array=False)


def _stream(
    ctx: Context,
    fill: InFlightFill,
    sid: bytes,
    layers: Sequence[int],
    *,
    start: int,
    end: int,
    native: bool,
    array: bool,
) -> Stream:
    bulks = fill.reply(sid, layers, start, end, native)
    fill.wait_first(sid, layers, start, may_wait=ctx.may_wait)
    ctx.state.receipt.credit_bytes(sum(b[0] for b in bulks if b is not None))
    ctx.state.vstore.total_fetches += len(layers)
    # Each piece goes to a worker only once its layer has landed (no worker waits).
    items = [None if b is None else LazyBulk(b[0], [Awaiting(b[1], b[2])]) for b in bulks]
    return Stream(items, array)
