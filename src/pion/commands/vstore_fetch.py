"""V-store reads: ``V.FETCH`` and ``V.INFO`` (docs/protocol.md, "V-store"; the writes,
``V.CREATE`` and ``V.STOREBATCH``, and the choices both sides share are in
``vstore.py``).

A fetch that decodes a large payload (``vstore.OFFLOAD_MIN_BYTES`` and up) is checked,
counted and leased here, and streamed: decoded piece by piece off the loop while the
previous piece is sent. Replies are memoryviews of numpy arrays: the encoder writes
them out as they are, and every fetch adds the payload bytes it delivers to the value
receipt's ``kvprefix_bytes_served``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pion.commands import vstore
from pion.commands.args import Args, parse_int
from pion.commands.deferred import Deferred, LazyBulk, Stream
from pion.commands.state import Command, Context
from pion.commands.tierfetch import batch_reply, fill_source, range_reply
from pion.commands.workers import redirect_session
from pion.errors import PionError
from pion.resp.reply import Reply
from pion.vstore import Pieces
from pion.wire import bytes_of

__all__ = ["COMMANDS"]

_NATIVE_ERROR = "FMT NATIVE requires the RANGE or BATCH form"


def _bulk(ctx: Context, array: npt.NDArray[np.generic]) -> memoryview:
    """A flat byte view of a fetched array (no copy for a C-contiguous one), counted in
    the receipt's bytes served."""
    view = bytes_of(array)
    ctx.state.receipt.credit_bytes(view.nbytes)
    return view


# -- V.FETCH -------------------------------------------------------------------------


def v_fetch(ctx: Context, argv: Sequence[bytes]) -> Reply | Deferred:
    """``V.FETCH sid layer RANGE start end [FMT NATIVE]`` | ``V.FETCH sid BATCH start end
    [num_layers] [FMT NATIVE]`` | ``V.FETCH sid layer id [id...]``"""
    limits = ctx.state.config.vstore
    vs = ctx.state.vstore
    a = Args(argv, "V.FETCH")
    sid = a.arg("session_id")
    redirect_session(ctx, sid, "V.FETCH")
    if a.peek_keyword() == "BATCH":
        a.arg()
        start = a.integer("start")
        end = a.integer("end")
        num_layers = None
        if not a.done() and a.peek_keyword() != "FMT":
            num_layers = a.integer("num_layers")
        native = _fetch_options(a)
        if start < 0 or end <= start:
            raise PionError("V.FETCH BATCH invalid range: end must exceed start (>=0)")
        if num_layers is not None and not 1 <= num_layers <= limits.max_layers:
            raise PionError(f"V.FETCH BATCH: num_layers out of range (1..{limits.max_layers})")
        fill = fill_source(ctx, sid)
        if fill is not None:  # only the tier holds it: reply while it is read
            return batch_reply(
                ctx, fill, sid, start=start, end=end, num_layers=num_layers, native=native
            )
        layers = vs.fetch_batch_pieces(sid, start, end, num_layers, native=native)
        if layers is None:
            raise PionError("V.FETCH BATCH: session has no stored layers")
        return _rows_reply(ctx, layers, array=True)
    layer = a.integer("layer_id")
    if a.peek_keyword() == "RANGE":
        a.arg()
        start = a.integer("start")
        end = a.integer("end")
        native = _fetch_options(a)
        if start < 0 or end <= start:
            raise PionError("invalid RANGE: end must exceed start (>=0)")
        fill = fill_source(ctx, sid)
        if fill is not None:
            return range_reply(ctx, fill, sid, layer=layer, start=start, end=end, native=native)
        rows = vs.fetch_range_pieces(sid, layer, start, end, native=native)
        return None if rows is None else _rows_reply(ctx, [rows], array=False)
    raw_ids = a.rest()
    if len(raw_ids) > limits.max_fetch_ids:
        raise PionError(f"V.FETCH: too many ids ({len(raw_ids)} > {limits.max_fetch_ids})")
    if any(raw.upper() == b"FMT" for raw in raw_ids):
        raise PionError(_NATIVE_ERROR)
    ids = [parse_int(raw, "id") for raw in raw_ids]
    vstore.from_tier(ctx, sid, required=True)
    found = vs.fetch_ids(sid, layer, ids)
    return None if found is None else _bulk(ctx, found)


def _rows_reply(ctx: Context, items: list[Pieces | None], *, array: bool) -> Reply | Deferred:
    """Fetched rows as a reply: streamed (decoded off the loop, piece by piece) when
    they are large and need decoding, else computed here."""
    total = sum(item.nbytes for item in items if item is not None)
    if total >= vstore.OFFLOAD_MIN_BYTES and any(
        item.converts for item in items if item is not None
    ):
        ctx.state.receipt.credit_bytes(total)
        bulks = [None if item is None else LazyBulk(item.nbytes, item.parts) for item in items]
        return Stream(bulks, array)
    values: list[Reply] = [None if item is None else _bulk(ctx, _join(item)) for item in items]
    return values if array else values[0]


def _join(item: Pieces) -> npt.NDArray[np.generic]:
    """A read's pieces computed here, as one array (the common case is one piece)."""
    parts = [part() for part in item.parts]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _fetch_options(a: Args) -> bool:
    """The trailing ``[FMT NATIVE|F32]``; True for NATIVE."""
    native = False
    while not a.done():
        option = a.arg().upper()
        if option == b"FMT" and not a.done():
            value = a.arg().upper()
            if value in (b"NATIVE", b"F32"):
                native = value == b"NATIVE"
                continue
        raise PionError("V.FETCH: unknown option (expected FMT NATIVE)")
    return native


# -- V.INFO --------------------------------------------------------------------------


def v_info(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.INFO`` -> global counters; ``V.INFO sid`` -> the session's layout and fill."""
    vs = ctx.state.vstore
    a = Args(argv, "V.INFO")
    if a.done():
        lines = [
            "enabled:1",
            f"sessions:{vs.session_count}",
            f"total_tokens:{vs.total_tokens}",
            f"total_fetches:{vs.total_fetches}",
        ]
        return "".join(f"{line}\r\n" for line in lines).encode()
    sid = a.arg("session_id")
    a.expect_done()
    redirect_session(ctx, sid, "V.INFO")
    vstore.from_tier(ctx, sid, required=True)
    info = vs.describe(sid)
    hetero = info.heterogeneous
    lines = [
        f"session_idx:{info.slot}",
        f"value_dim:{info.default_dim}",
        f"v_format:{info.default_fmt}",
        f"num_layers:{info.num_layers}",
        f"schema:{'heterogeneous' if hetero else 'uniform'}",
    ]
    for layer in info.layers:
        if layer.tpl:
            lines.append(f"layer_{layer.index}_tokens:{layer.tpl}")
        if hetero:
            lines.append(f"layer_{layer.index}_dim:{layer.dim}")
            lines.append(f"layer_{layer.index}_fmt:{layer.fmt}")
        if layer.rope:
            lines.append(f"layer_{layer.index}_rope:{layer.rope}")
    lines.append(f"total_tokens:{info.total_tokens}")
    return "".join(f"{line}\r\n" for line in lines).encode()


COMMANDS: list[Command] = [
    Command(
        "V.FETCH",
        v_fetch,
        -4,
        frozenset({"readonly"}),
        "Fetch rows: RANGE of one layer, BATCH of all layers, or an id list",
    ),
    Command(
        "V.INFO",
        v_info,
        -1,
        frozenset({"readonly", "fast"}),
        "V-store counters, or one session's layout and row counts",
    ),
]
