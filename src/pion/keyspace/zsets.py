"""Sorted-set commands' semantics (Redis's ``t_zset.c``): ZADD with NX/XX/GT/LT/CH/INCR
and ZRANGE by rank or by score, as operations on a :class:`~pion.keyspace.Keyspace`.

ZADD works out every member's final score first (pairs are applied in order, so
``ZADD k 1 a 2 a`` adds ``a`` and then updates it) and the keyspace logs only that
outcome, so replaying it never depends on what the set held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pion.errors import PionError
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace

__all__ = ["ScoreRange", "ZAddFlags", "ZAddResult", "zadd", "zrange_by_rank", "zrange_by_score"]


@dataclass(frozen=True, slots=True)
class ZAddFlags:
    nx: bool = False
    xx: bool = False
    gt: bool = False
    lt: bool = False
    ch: bool = False
    incr: bool = False


@dataclass(frozen=True, slots=True)
class ZAddResult:
    added: int
    updated: int
    processed: int
    last_score: float  # INCR's reply when processed


def zadd(
    ks: Keyspace, key: bytes, pairs: list[tuple[float, bytes]], flags: ZAddFlags
) -> ZAddResult:
    """Apply ``pairs`` (scores already parsed) with Redis's ``zsetAdd`` rules."""
    z = ks.zset(key, read=False)
    if z is None and flags.xx:
        return ZAddResult(0, 0, 0, 0.0)
    final: dict[bytes, float] = {}
    added = updated = processed = 0
    score = 0.0
    for given, member in pairs:
        if member in final:
            cur: float | None = final[member]
        elif z is not None:
            cur = z.scores.get(member)
        else:
            cur = None
        if cur is not None:
            if flags.nx:
                continue
            new = given + cur if flags.incr else given
            if math.isnan(new):
                raise PionError("resulting score is not a number (NaN)")
            if (flags.lt and new >= cur) or (flags.gt and new <= cur):
                continue
            processed += 1
            score = new
            if new != cur:
                final[member] = new
                updated += 1
        elif not flags.xx:
            processed += 1
            score = given
            final[member] = given
            added += 1
    if final:
        ks.zset_set(key, [(s, m) for m, s in final.items()])
    return ZAddResult(added, updated, processed, score)


def _rank_slice(length: int, start: int, stop: int) -> tuple[int, int] | None:
    """Redis's rank clamping: inclusive (start, stop) in 0..length-1, or None."""
    if start < 0:
        start += length
    if stop < 0:
        stop += length
    start = max(start, 0)
    if start > stop or start >= length:
        return None
    return start, min(stop, length - 1)


def zrange_by_rank(z: SortedSet, start: int, stop: int, rev: bool) -> list[tuple[float, bytes]]:
    n = len(z)
    span = _rank_slice(n, start, stop)
    if span is None:
        return []
    first, last = span
    if not rev:
        return z.by_rank(first, last)
    picked = z.by_rank(n - 1 - last, n - 1 - first)
    picked.reverse()
    return picked


@dataclass(frozen=True, slots=True)
class ScoreRange:
    low: float
    low_open: bool
    high: float
    high_open: bool

    def empty(self) -> bool:
        return self.low > self.high or (self.low == self.high and (self.low_open or self.high_open))


def zrange_by_score(
    z: SortedSet, rng: ScoreRange, rev: bool, offset: int, count: int
) -> list[tuple[float, bytes]]:
    """BYSCORE with LIMIT (``count`` < 0: all); a negative offset selects nothing."""
    if rng.empty() or offset < 0:
        return []
    first, last = z.rank_bounds(rng.low, rng.low_open, rng.high, rng.high_open)
    picked = z.at(first, last)
    if rev:
        picked.reverse()
    end = None if count < 0 else offset + count
    return picked[offset:end]
