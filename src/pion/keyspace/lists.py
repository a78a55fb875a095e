"""List commands' semantics (Redis's ``t_list.c``) as operations on a
:class:`~pion.keyspace.Keyspace`: pushes, pops, LSET, LINSERT, LREM, LTRIM, LMOVE and
the reads (LRANGE, LINDEX, LPOS).

Each write validates, asks the memory budget for what it adds, journals one record
(``mutations.py``: a whole command is one record, LMOVE included) and applies it
through the primitives of ``listset.py``. A list is a ``deque``: both ends are O(1),
an index in the middle costs its distance from the nearer end, as Redis's quicklist.

Encoding. Redis 7.0 (the oracle these commands are tested against) keeps every list
in a ``quicklist``; Redis 7.2 answers ``listpack`` for a list whose elements fit one
8 KB node. OBJECT ENCODING answers as 7.0 does.
"""

from __future__ import annotations

from collections import deque
from itertools import islice

from pion.errors import PionError
from pion.keyspace.entries import KEY_OVERHEAD, LIST_ITEM_OVERHEAD
from pion.keyspace.listset import lrem_positions
from pion.keyspace.mutations import (
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListSet,
    ListTrim,
)
from pion.keyspace.store import Keyspace

__all__ = [
    "lindex",
    "linsert",
    "lmove",
    "lpos",
    "lrange",
    "lrem",
    "lset",
    "ltrim",
    "pop",
    "push",
    "span",
]


def _cost(items: list[bytes]) -> int:
    return sum(len(v) for v in items) + len(items) * LIST_ITEM_OVERHEAD


def push(ks: Keyspace, key: bytes, items: list[bytes], left: bool, *, only_existing: bool) -> int:
    """LPUSH/RPUSH (LPUSHX/RPUSHX with ``only_existing``): the list's new length (0
    when ``only_existing`` and there is no list)."""
    d = ks.list_at(key, read=False)
    if d is None and only_existing:
        return 0
    length = (len(d) if d is not None else 0) + len(items)
    grow = _cost(items) + (0 if d is not None else len(key) + KEY_OVERHEAD)
    ks._reserve(grow)
    ks._journal(ListPush(key, left, tuple(items)))
    ks._apply_push(key, left, items)
    return length


def pop(ks: Keyspace, key: bytes, left: bool, count: int) -> list[bytes] | None:
    """LPOP/RPOP/LMPOP: up to ``count`` elements from one end; None for no list."""
    d = ks.list_at(key, read=False)
    if d is None:
        return None
    if count <= 0:
        return []
    ks._journal(ListPop(key, left, count))
    return ks._apply_pop(key, left, count)


def span(length: int, start: int, stop: int) -> tuple[int, int] | None:
    """Redis's range rules (negative from the end, clamped): the inclusive
    ``(start, stop)`` within ``length``, or None when empty."""
    if start < 0:
        start = max(0, length + start)
    if stop < 0:
        stop += length
    stop = min(stop, length - 1)
    if start > stop or start >= length:
        return None
    return start, stop


def lrange(ks: Keyspace, key: bytes, start: int, stop: int) -> list[bytes]:
    d = ks.list_at(key)
    if d is None:
        return []
    bounds = span(len(d), start, stop)
    if bounds is None:
        return []
    lo, hi = bounds
    if lo > len(d) - 1 - hi:  # nearer the tail: walk from there
        tail = list(islice(reversed(d), len(d) - 1 - hi, len(d) - lo))
        tail.reverse()
        return tail
    return list(islice(d, lo, hi + 1))


def _index(d: deque[bytes], index: int) -> int | None:
    i = index + len(d) if index < 0 else index
    return i if 0 <= i < len(d) else None


def lindex(ks: Keyspace, key: bytes, index: int) -> bytes | None:
    d = ks.list_at(key)
    if d is None:
        return None
    i = _index(d, index)
    return None if i is None else d[i]


def lset(ks: Keyspace, key: bytes, index: int, value: bytes) -> None:
    d = ks.list_at(key, read=False)
    if d is None:
        raise PionError("no such key")
    i = _index(d, index)
    if i is None:
        raise PionError("index out of range")
    ks._reserve(len(value) - len(d[i]))
    ks._journal(ListSet(key, i, value))
    ks._apply_lset(key, i, value)


def linsert(ks: Keyspace, key: bytes, before: bool, pivot: bytes, value: bytes) -> int:
    """LINSERT: the new length, -1 when ``pivot`` is missing, 0 when the list is."""
    d = ks.list_at(key, read=False)
    if d is None:
        return 0
    try:
        i = d.index(pivot)
    except ValueError:
        return -1
    at = i if before else i + 1
    ks._reserve(len(value) + LIST_ITEM_OVERHEAD)
    ks._journal(ListInsert(key, at, value))
    ks._apply_linsert(key, at, value)
    return len(d)


def lrem(ks: Keyspace, key: bytes, count: int, element: bytes) -> int:
    d = ks.list_at(key, read=False)
    if d is None:
        return 0
    positions = lrem_positions(d, count, element)
    if positions:
        ks._journal(ListRemove(key, count, element))
        ks._apply_lrem(key, positions)
    return len(positions)


def ltrim(ks: Keyspace, key: bytes, start: int, stop: int) -> None:
    d = ks.list_at(key, read=False)
    if d is None:
        return
    bounds = span(len(d), start, stop)
    if bounds is None:  # nothing kept: the key goes
        ks.delete((key,))
        return
    lo, hi = bounds
    if lo == 0 and hi == len(d) - 1:
        return
    ks._journal(ListTrim(key, lo, hi))
    ks._apply_ltrim(key, lo, hi)


def lmove(
    ks: Keyspace, source: bytes, destination: bytes, from_left: bool, to_left: bool
) -> bytes | None:
    """LMOVE/RPOPLPUSH: the element moved, None when ``source`` has no list. The
    destination's type is checked first, as Redis does."""
    d = ks.list_at(source, read=False)
    if d is None:
        return None
    dst = ks.list_at(destination, read=False)
    value = d[0] if from_left else d[-1]
    if source != destination:
        grow = (
            len(value)
            + LIST_ITEM_OVERHEAD
            + (0 if dst is not None else len(destination) + KEY_OVERHEAD)
        )
        ks._reserve(grow)
    ks._journal(ListMove(source, destination, from_left, to_left))
    return ks._apply_move(source, destination, from_left, to_left)


def lpos(
    ks: Keyspace, key: bytes, element: bytes, *, rank: int, count: int, maxlen: int
) -> list[int]:
    """LPOS: the indexes of up to ``count`` (0: all) matches, from the ``rank``-th
    (negative: from the tail), looking at most ``maxlen`` elements (0: all)."""
    d = ks.list_at(key)
    if d is None:
        return []
    n = len(d)
    limit = maxlen if maxlen else n
    walk = enumerate(d) if rank > 0 else ((n - 1 - j, v) for j, v in enumerate(reversed(d)))
    skip = abs(rank) - 1
    out: list[int] = []
    for seen, (i, v) in enumerate(walk):
        if seen >= limit:
            break
        if v == element:
            if skip:
                skip -= 1
                continue
            out.append(i)
            if count and len(out) >= count:
                break
    return out
