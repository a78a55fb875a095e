"""Every client operation as a sans-IO plan, shared by the sync and asyncio clients.

A plan is a generator: it yields a *batch* (a list of commands to send pipelined, in
one round trip) and is sent back the replies, in order, each a reply value or the
:class:`~pion.client.errors.PionResponseError` the server answered for that command.
It returns the operation's result or raises. The driver in :mod:`.base` addresses
each batch to a port (following a worker redirect by running a fresh plan on the
owner's port) and the shells :mod:`.cache` and :mod:`.aio` only move batches over a
connection, so the logic here, the ``-COLDMISS`` retry included, exists once and is
testable without a socket.

Round trips per operation: one each, except ``fetch`` without ``n_tokens`` or through
the export lane and ``store`` of fp16 arrays (two: V.INFO first, then the data or
V.EXPORT), and ``attend_query`` after a ``-COLDMISS`` (three: query, WARM, query).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from pion.client.errors import PionColdMiss, PionProtocolError, PionWrongWorker
from pion.client.export import ExportLane, read_export
from pion.client.wire import (
    Command,
    Rows,
    SessionLayout,
    as_rows,
    attend_sid,
    decode_rows,
    hash_array,
    int_arg,
    parse_attend_reply,
    parse_blocks,
    parse_fields,
    parse_hit,
    parse_membership,
    parse_session_layout,
    parse_stats,
    parse_warm,
    query_shape,
    session_ids,
    text,
)
from pion.export.format import FormatError
from pion.wire import bytes_of

__all__ = ["Arrays", "Plan", "PlanFactory", "Warmed"]

T = TypeVar("T")
Plan: TypeAlias = Generator[list[Command], list[object], T]
# What a client method's build returns: a plan made afresh on each call (a worker
# redirect runs a fresh one), see pion.client.base.
PlanFactory: TypeAlias = Callable[[], Plan[T]]
Arrays: TypeAlias = list[npt.NDArray[np.float32]]


class Warmed(NamedTuple):
    """KV.PREFIX.WARM's reply: layers rehydrated, and layers skipped for their dim."""

    layers: int
    skipped_dim: int


def check(reply: object) -> object:
    """The reply, or raise the error the server answered instead."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


def check_all(replies: Sequence[object]) -> list[object]:
    """All replies of a batch, or raise: a worker redirect first (the driver follows
    it by rerunning the plan), else the first error."""
    errors = [r for r in replies if isinstance(r, BaseException)]
    for error in errors:
        if isinstance(error, PionWrongWorker):
            raise error
    if errors:
        raise errors[0]
    return list(replies)


def _expect_ok(reply: object, what: str) -> None:
    if text(check(reply)) != "OK":
        raise PionProtocolError(f"{what}: expected +OK, got {text(reply)[:40]!r}")


def _one(command: Command) -> Plan[object]:
    replies = yield [command]
    return check(replies[0])


# -- registry ------------------------------------------------------------------------


def _ms(value: float, what: str) -> int:
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return round(value)


def register(
    ns: str,
    kv_dim: int,
    vquant: str,
    *,
    blocks: Sequence[int] | npt.NDArray[Any] | None,
    block_size: int,
    prefill_ms: float | None,
) -> Plan[None]:
    command: list[Any] = ["KV.PREFIX.REGISTER", ns, int_arg(kv_dim, "kv_dim"), vquant]
    if blocks is not None:
        hashes = hash_array(blocks)
        command += ["BLOCKS", int_arg(block_size, "block_size"), len(hashes), bytes_of(hashes)]
    if prefill_ms is not None:
        command += ["PREFILL_MS", _ms(prefill_ms, "prefill_ms")]
    _expect_ok((yield from _one(tuple(command))), "KV.PREFIX.REGISTER")


def lookup(ns: str, tokens: int | None, prefill_ms: float | None, stage2: bool) -> Plan[bool]:
    command: list[Any] = ["KV.PREFIX.LOOKUP", ns]
    if tokens is not None:
        command += ["TOKENS", int_arg(tokens, "tokens")]
    if prefill_ms is not None:
        command += ["PREFILL_MS", _ms(prefill_ms, "prefill_ms")]
    batch: list[Command] = [tuple(command)]
    if stage2:
        # Pion's rule: a Stage-2 hit needs the attention tier too (layer 0 probed).
        batch.append(("ATTEND.PREFIX.LOOKUP", attend_sid(ns), 0))
    replies = yield batch
    if not parse_hit(check(replies[0]), "KV.PREFIX.LOOKUP"):
        return False
    return not stage2 or parse_hit(check(replies[1]), "ATTEND.PREFIX.LOOKUP")


def drop(namespaces: Sequence[str]) -> Plan[int]:
    if not namespaces:
        raise ValueError("drop needs at least one namespace")
    reply = yield from _one(("KV.PREFIX.DROP", *namespaces))
    if not isinstance(reply, int):
        raise PionProtocolError("KV.PREFIX.DROP: expected an integer")
    return int(reply)


def owner(ns: str) -> Plan[int]:
    reply = yield from _one(("KV.PREFIX.OWNER", ns))
    try:
        return int(text(reply))
    except ValueError:
        raise PionProtocolError(f"KV.PREFIX.OWNER: unexpected {text(reply)[:40]!r}") from None


def blocks(ns: str) -> Plan[tuple[int, npt.NDArray[np.uint64]] | None]:
    return parse_blocks((yield from _one(("KV.PREFIX.BLOCKS", ns))))


def membership(
    ns: str, hashes: Sequence[int] | npt.NDArray[Any]
) -> Plan[npt.NDArray[np.bool_] | None]:
    probes = hash_array(hashes)
    count = len(probes)
    reply = yield from _one(("KV.PREFIX.MEMBERSHIP", ns, count, bytes_of(probes.astype("<u8"))))
    # A 7-byte bitmap can spell UNKNOWN; BLOCKS (never 7 bytes) tells them apart.
    ambiguous = reply == b"UNKNOWN" and (count + 7) // 8 == len(reply)
    if ambiguous and parse_blocks((yield from _one(("KV.PREFIX.BLOCKS", ns)))) is None:
        return None
    return parse_membership(reply, count)


def info() -> Plan[dict[str, int | float | str]]:
    return parse_fields((yield from _one(("KV.PREFIX.INFO",))))


def save(path: str | None) -> Plan[None]:
    command: Command = ("KV.PREFIX.SAVE",) if path is None else ("KV.PREFIX.SAVE", path)
    _expect_ok((yield from _one(command)), "KV.PREFIX.SAVE")


def commit() -> Plan[None]:
    _expect_ok((yield from _one(("KV.PREFIX.COMMIT",))), "KV.PREFIX.COMMIT")


def stats(reset: bool) -> Plan[dict[str, int | float]]:
    if reset:
        _expect_ok((yield from _one(("PION.STATS", "RESET"))), "PION.STATS RESET")
        return {}
    return parse_stats((yield from _one(("PION.STATS",))))


# -- K/V rows ------------------------------------------------------------------------


def _side_rows(arrays: Sequence[npt.ArrayLike], what: str) -> list[Rows]:
    return [as_rows(a, f"{what}[{i}]") for i, a in enumerate(arrays)]


def store(ns: str, keys: Sequence[npt.ArrayLike], values: Sequence[npt.ArrayLike]) -> Plan[int]:
    """Every layer's K and V rows ``0 .. N-1`` in one pipeline; returns N."""
    sides = (_side_rows(keys, "keys"), _side_rows(values, "values"))
    if not sides[0] or len(sides[0]) != len(sides[1]):
        raise ValueError(
            f"keys and values need the same number (>= 1) of layers, got "
            f"{len(sides[0])} and {len(sides[1])}"
        )
    n = int(sides[0][0].shape[0])
    for rows in (*sides[0], *sides[1]):
        if rows.shape[0] != n:
            raise ValueError(f"every layer must hold the same {n} tokens, got {rows.shape[0]}")
    sids = session_ids(ns)
    layouts: tuple[SessionLayout, ...] | None = None
    if any(rows.dtype == np.float16 for side in sides for rows in side):
        # fp16 may travel as fp16 (half the bytes, stored verbatim) only into an fp16
        # layer; V.INFO says which layers are.
        replies = check_all((yield [("V.INFO", sid) for sid in sids]))
        layouts = tuple(parse_session_layout(r) for r in replies)
    batch: list[Command] = []
    for side, (sid, side_rows) in enumerate(zip(sids, sides, strict=True)):
        for layer, given in enumerate(side_rows):
            half = given.dtype == np.float16
            fp16_layer = layouts is not None and layouts[side].fmt(layer) == "fp16"
            rows = given if fp16_layer or not half else given.astype("<f4")
            tail: Command = ("FMT", "F16") if half and fp16_layer else ()
            batch.append(("V.STOREBATCH", sid, layer, 0, n, bytes_of(rows), *tail))
    for reply in check_all((yield batch)):
        _expect_ok(reply, "V.STOREBATCH")
    return n


def _data_commands(
    sids: Sequence[str], n: int, picked: list[int] | None, count: int | None
) -> list[Command]:
    """V.FETCH of rows ``0 .. n-1``: BATCH per half (all layers, ``count`` of them
    when known), or RANGE per picked layer; fp16 layers reply fp16 (half the bytes)."""
    if picked is None:
        layers: Command = () if count is None else (count,)
        return [("V.FETCH", sid, "BATCH", 0, n, *layers, "FMT", "NATIVE") for sid in sids]
    return [("V.FETCH", sid, i, "RANGE", 0, n, "FMT", "NATIVE") for sid in sids for i in picked]


def fetch(
    ns: str,
    n_tokens: int | None,
    layers: Iterable[int] | None,
    lane: ExportLane | None = None,
) -> Plan[tuple[Arrays, Arrays]]:
    """Rows ``0 .. n-1`` of every layer (or of ``layers``) of both halves, fp32.

    With ``n_tokens`` the layouts (V.INFO, for each layer's dim) and the data go in one
    round trip; without it V.INFO first says how many rows are stored. With an enabled
    export ``lane`` (a server on this machine) and all layers, V.INFO goes first and,
    where the file gives exactly the rows the socket would, V.EXPORT follows and the
    file is read (see :mod:`pion.client.export`); else the data come as without it."""
    sids = session_ids(ns)
    infos: list[Command] = [("V.INFO", sid) for sid in sids]
    picked = None if layers is None else [int_arg(i, "layer") for i in layers]
    if n_tokens is not None and int_arg(n_tokens, "n_tokens") < 1:
        raise ValueError("n_tokens must be >= 1 (or None for every stored row)")
    if lane is not None and picked is None and lane.suitable(ns):
        layouts = [parse_session_layout(r) for r in check_all((yield infos))]
        if not any(lay.tokens for lay in layouts):
            return [], []  # nothing stored yet (BATCH would refuse the sessions)
        if n_tokens is None:
            n = max(lay.max_tokens for lay in layouts)
            count = max(lay.num_layers for lay in layouts)
        else:
            # As many layers as BATCH without a count answers (a SCHEMA's N).
            n = int(n_tokens)
            count = max(max(lay.declared_layers, lay.num_layers) for lay in layouts)
        exported = yield from _via_export(ns, n, count, layouts, lane)
        if exported is not None:
            return exported
        tail = count if n_tokens is None else None
        data = check_all((yield _data_commands(sids, n, None, tail)))
        return _decode_batches(data, sids, n, layouts)
    if n_tokens is None:
        layouts = [parse_session_layout(r) for r in check_all((yield infos))]
        n = max(lay.max_tokens for lay in layouts)
        if n == 0:
            return [], []
        count = max(lay.num_layers for lay in layouts)
        data = check_all((yield _data_commands(sids, n, picked, count)))
    else:
        n = int_arg(n_tokens, "n_tokens")
        replies = yield [*infos, *_data_commands(sids, n, picked, None)]
        layouts = [parse_session_layout(r) for r in check_all(replies[:2])]
        if picked is None and not any(lay.tokens for lay in layouts):
            return [], []  # BATCH refuses a session without rows: nothing stored yet
        data = check_all(replies[2:])
    if picked is not None:
        half = len(picked)
        k, v = (
            [
                decode_rows(data[s * half + j], n, layouts[s].dim(i), f"{sids[s]} layer {i}")
                for j, i in enumerate(picked)
            ]
            for s in range(2)
        )
        return k, v
    return _decode_batches(data, sids, n, layouts)


def _decode_batches(
    data: Sequence[object], sids: Sequence[str], n: int, layouts: Sequence[SessionLayout]
) -> tuple[Arrays, Arrays]:
    """The two V.FETCH BATCH replies (keys, values) as fp32 rows per layer."""
    sides = []
    for reply, sid in zip(data, sids, strict=True):
        if not isinstance(reply, list):
            raise PionProtocolError(f"V.FETCH {sid} BATCH: expected an array")
        sides.append(reply)
    # A half with fewer layers reads as zeros there, as rows never written do.
    count = max(len(side) for side in sides)
    k, v = (
        [
            decode_rows(r, n, layouts[s].dim(i), f"{sids[s]} layer {i}")
            for i, r in enumerate(sides[s] + [None] * (count - len(sides[s])))
        ]
        for s in range(2)
    )
    return k, v


def _export_dim(layouts: Sequence[SessionLayout], count: int) -> tuple[int | None, bool]:
    """``(dim, ok)``: the one kv_dim of layers ``0 .. count-1`` of both halves when the
    export file gives exactly what V.FETCH would (every layer fp16 and holding rows);
    ``(None, False)`` when the layout can never be served so (another format, several
    dims), ``(None, True)`` when only rows are missing."""
    layers = [(lay, i) for lay in layouts for i in range(count)]
    dims = {lay.dim(i) for lay, i in layers}
    if len(dims) != 1 or any(lay.fmt(i) != "fp16" for lay, i in layers):
        return None, False
    if any(lay.tokens.get(i, 0) == 0 for lay, i in layers):
        return None, True
    return dims.pop(), True


# A file may vanish between V.EXPORT's reply and the open (a write made it stale):
# ask again this many times before concluding this process cannot see the server's
# files (another mount namespace).
_EXPORT_TRIES = 2


def _via_export(
    ns: str, n: int, count: int, layouts: Sequence[SessionLayout], lane: ExportLane
) -> Plan[tuple[Arrays, Arrays] | None]:
    """The rows through an export file, or None to fetch them through the socket."""
    dim, suitable = _export_dim(layouts, count)
    if dim is None:
        if not suitable:
            lane.mark_unsuitable(ns)
        return None
    sids = session_ids(ns)
    for _ in range(_EXPORT_TRIES):
        (reply,) = yield [("V.EXPORT", sids[0], sids[1], 0, n, count, 1, dim)]
        if isinstance(reply, PionWrongWorker):
            raise reply
        if isinstance(reply, BaseException):
            lane.refused(str(reply))
            return None
        try:
            arrays = read_export(os.fsdecode(_path_bytes(reply)), count, n, dim)
        except FileNotFoundError:
            continue
        except (OSError, FormatError) as exc:
            lane.fallbacks += 1
            lane.turn_off(f"cannot read the export file: {exc}")
            return None
        lane.used += 1
        return arrays
    lane.fallbacks += 1
    lane.turn_off("the server's export files are not visible to this process")
    return None


def _path_bytes(reply: object) -> bytes:
    if isinstance(reply, bytes | bytearray | memoryview):
        return bytes(reply)
    raise PionProtocolError(f"V.EXPORT: expected a bulk path, got {type(reply).__name__}")


# -- attention tier ------------------------------------------------------------------


def warm(ns: str, n_heads: int, head_dim: int, sid: str | None) -> Plan[Warmed]:
    command = (
        "KV.PREFIX.WARM",
        ns,
        int_arg(n_heads, "n_heads"),
        int_arg(head_dim, "head_dim"),
        attend_sid(ns) if sid is None else sid,
    )
    return Warmed(*parse_warm((yield from _one(command))))


def _heads_first(array: npt.ArrayLike, what: str) -> npt.NDArray[np.float32]:
    a = np.ascontiguousarray(array, dtype="<f4")
    if a.ndim != 3:
        raise ValueError(f"{what}: expected [H, N, D], got shape {list(a.shape)}")
    return a


def attend_store(ns: str, layer: int, keys: npt.ArrayLike, values: npt.ArrayLike) -> Plan[None]:
    k, v = _heads_first(keys, "keys"), _heads_first(values, "values")
    if k.shape != v.shape:
        raise ValueError(f"keys {list(k.shape)} and values {list(v.shape)} differ")
    h, n, d = k.shape
    command = (
        "ATTEND.PREFIX.STORE",
        attend_sid(ns),
        int_arg(layer, "layer"),
        h,
        n,
        d,
        bytes_of(k),
        bytes_of(v),
    )
    _expect_ok((yield from _one(command)), "ATTEND.PREFIX.STORE")


def attend_query(
    ns: str,
    layer: int,
    q: npt.ArrayLike,
    *,
    top_k: int,
    fa_window: int | None,
    on_rehydrate: Callable[[], None],
) -> Plan[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]]:
    """ATTEND.PREFIX.QUERY; after ``-COLDMISS``: WARM, then retry once (Pion's rule).

    Returns the output (shaped like ``q``) and, for M > 1, the LSE ``[H, M]``."""
    query = np.ascontiguousarray(q, dtype="<f4")
    h, m, d = query_shape(query)
    if top_k < 1:
        raise ValueError("top_k must be > 0 (the server ignores it: attention is dense)")
    command: Command = (
        "ATTEND.PREFIX.QUERY",
        attend_sid(ns),
        int_arg(layer, "layer"),
        h,
        d,
        top_k,
        bytes_of(query),
    )
    if fa_window is not None:
        command = (*command, int(fa_window))
    reply = (yield [command])[0]
    if isinstance(reply, PionColdMiss):
        on_rehydrate()
        (warmed,) = yield [("KV.PREFIX.WARM", ns, h, d, attend_sid(ns))]
        if isinstance(warmed, BaseException):
            raise reply from warmed
        if parse_warm(warmed)[0] == 0:
            raise reply
        reply = (yield [command])[0]
    out, lse = parse_attend_reply(check(reply), h, m, d, squeeze=m == 1)
    return out.reshape(query.shape), lse
