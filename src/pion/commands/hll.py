"""HyperLogLog commands: PFADD, PFCOUNT, PFMERGE, with Redis 7.0's replies, errors and
bytes (the encoding and the estimate are ``pion.keyspace.hll``'s).

A changed HLL is written back as the bytes that changed (the cached count's and the
registers' spans, :meth:`Keyspace.set_range`), so a PFADD to a dense 12 KB value costs
the log a few bytes, the key keeps its deadline, and WATCH sees it. A write that
shortens a sparse value (two runs merged) is a SET keeping the deadline.

PFCOUNT of one key whose cached count is stale stores the count it computed, as Redis
does (WATCH sees that change too); PFCOUNT of several keys counts their union and
changes nothing. PFMERGE and PFADD announce ``pfadd``; PFCOUNT announces nothing.
PFDEBUG and PFSELFTEST are not served.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from pion.commands.state import Command, Context
from pion.errors import MisconfError
from pion.keyspace.hll import HEADER, REGISTERS, Hll, cached_count, estimate
from pion.keyspace.store import Keyspace
from pion.notify import STRING, notify
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS", "store_hll"]


def store_hll(ks: Keyspace, key: bytes, old: bytes | None, new: bytes, force: bool) -> None:
    """Write ``new`` over ``old`` (the value ``key`` holds) as the spans that differ:
    the header's and the registers' (one span to the end where the value grew). ``force``
    writes the cached count even when nothing differs, so the change is seen (PFMERGE
    always changes its key in Redis)."""
    if old is None:
        ks.set_string(key, new)
        return
    if len(new) < len(old):
        ks.set_string(key, new, ks.deadline(key) or 0)
        return
    spans = [_differ(old, new, 0, HEADER), _differ(old, new, HEADER, len(old))]
    if len(new) > len(old):
        # One write: the growth is asked of --maxmemory before any byte changes.
        first = next((span[0] for span in spans if span is not None), len(old))
        spans = [(first, len(new)), None]
    if force and spans == [None, None]:
        spans[0] = (8, HEADER)
    for span in spans:
        if span is not None:
            ks.set_range(key, span[0], new[span[0] : span[1]])


def _differ(old: bytes, new: bytes, lo: int, hi: int) -> tuple[int, int] | None:
    """The smallest span of ``lo..hi`` outside which ``old`` and ``new`` agree."""
    a = np.frombuffer(old, dtype=np.uint8, count=hi - lo, offset=lo)
    b = np.frombuffer(new, dtype=np.uint8, count=hi - lo, offset=lo)
    where = np.flatnonzero(a != b)
    return (int(where[0]) + lo, int(where[-1]) + lo + 1) if len(where) else None


def _max_bytes(ctx: Context) -> int:
    return ctx.state.config.hll_sparse_max_bytes


def _pfadd(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    key = args[0]
    old = ks.string(key, read=False)
    hll = Hll(old, _max_bytes(ctx))
    updated = old is None  # creating the key is a change, even with no element
    for element in args[1:]:
        if hll.add(element):
            updated = True
    if not updated:
        return 0
    hll.invalidate()
    store_hll(ks, key, old, hll.encode(), False)
    notify(ctx.state, STRING, "pfadd", key)
    return 1


def _union(ks: Keyspace, keys: Sequence[bytes]) -> tuple[np.ndarray[Any, Any], bool]:
    """The registers' maximum over ``keys`` (missing keys are empty HLLs), checked in
    order; and whether any of them is dense."""
    acc = np.zeros(REGISTERS, dtype=np.uint8)
    dense = False
    for key in keys:
        value = ks.string(key)
        if value is None:
            continue
        hll = Hll(value, 0)
        dense = dense or hll.dense
        hll.max_into(acc)
    return acc, dense


def _pfcount(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if len(args) > 1:
        acc, _ = _union(ks, args)
        return estimate(np.bincount(acc, minlength=64))
    key = args[0]
    value = ks.string(key)
    if value is None:
        return 0
    cached = cached_count(value)
    if cached is not None:
        return cached
    hll = Hll(value, _max_bytes(ctx))
    count = estimate(hll.histogram())
    hll.set_cache(count)
    # A log refusing writes must not turn this read into an error (Redis never refuses
    # PFCOUNT): the count is right whether or not it is stored.
    with contextlib.suppress(MisconfError):
        ks.set_range(key, 8, bytes(hll.header[8:16]))
    return count


def _pfmerge(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    key = args[0]
    acc, dense = _union(ks, args)
    old = ks.string(key, read=False)
    hll = Hll(old, _max_bytes(ctx))
    if dense:
        hll.promote()
    hll.merge_registers(acc)
    hll.invalidate()
    store_hll(ks, key, old, hll.encode(), True)
    notify(ctx.state, STRING, "pfadd", key)
    return Simple("OK")


COMMANDS: list[Command] = [
    Command("PFADD", _pfadd, -2, frozenset({"write", "fast"}), "Add elements to a HyperLogLog"),
    Command("PFCOUNT", _pfcount, -2, frozenset({"readonly"}), "Estimated distinct elements"),
    Command("PFMERGE", _pfmerge, -2, frozenset({"write"}), "Union of HyperLogLogs"),
]
