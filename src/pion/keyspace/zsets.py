"""Sorted-set commands' semantics (Redis's ``t_zset.c``): ZADD with NX/XX/GT/LT/CH/INCR
and ZRANGE by rank, by score or by member (BYLEX), as operations on a
:class:`~pion.keyspace.Keyspace`.

BYLEX is meant for sets whose members all share one score; with mixed scores Redis's
answer depends on its encoding. We follow its compact (listpack) walk, which is what
small sets use: start at the first member (in set order) at or past the lower bound,
then take members until one passes the upper bound.

ZADD works out every member's final score first (pairs are applied in order, so
``ZADD k 1 a 2 a`` adds ``a`` and then updates it) and the keyspace logs only that
outcome, so replaying it never depends on what the set held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pion.errors import PionError
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace

__all__ = [
    "LexBound",
    "ScoreRange",
    "ZAddFlags",
    "ZAddPlan",
    "ZAddResult",
    "parse_lex_bound",
    "zadd",
    "zrange_by_lex",
    "zrange_by_rank",
    "zrange_by_score",
]


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


class ZAddPlan:
    """Redis's ``zsetAdd`` rules worked out pair by pair: every member's final score
    and the counts, without changing anything. :meth:`step` may be called on the
    pairs in chunks (a long ZADD in steps); it reads the set only through
    ``current``."""

    def __init__(self, flags: ZAddFlags) -> None:
        self.flags = flags
        self.final: dict[bytes, float] = {}
        self.added = self.updated = self.processed = 0
        self.score = 0.0

    def step(
        self, pairs: Iterable[tuple[float, bytes]], current: Callable[[bytes], float | None]
    ) -> None:
        flags, final = self.flags, self.final
        for given, member in pairs:
            cur = final[member] if member in final else current(member)
            if cur is not None:
                if flags.nx:
                    continue
                new = given + cur if flags.incr else given
                if math.isnan(new):
                    raise PionError("resulting score is not a number (NaN)")
                if (flags.lt and new >= cur) or (flags.gt and new <= cur):
                    continue
                self.processed += 1
                self.score = new
                if new != cur:
                    final[member] = new + 0.0
                    self.updated += 1
            elif not flags.xx:
                self.processed += 1
                self.score = given
                # Redis's compact encoding stores a score of -0 as 0 (ZSCORE answers
                # "0", though ZADD INCR's reply said "-0"); so do we, whatever the size.
                final[member] = given + 0.0
                self.added += 1

    def result(self) -> ZAddResult:
        return ZAddResult(self.added, self.updated, self.processed, self.score)


def _absent(member: bytes) -> float | None:
    return None


def zadd(
    ks: Keyspace, key: bytes, pairs: list[tuple[float, bytes]], flags: ZAddFlags
) -> ZAddResult:
    """Apply ``pairs`` (scores already parsed) with Redis's ``zsetAdd`` rules."""
    z = ks.zset(key, read=False)
    if z is None and flags.xx:
        return ZAddResult(0, 0, 0, 0.0)
    plan = ZAddPlan(flags)
    plan.step(pairs, z.scores.get if z is not None else _absent)
    if plan.final:
        ks.zset_set(key, [(s, m) for m, s in plan.final.items()])
    return plan.result()


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


# A BYLEX bound: (kind, member, exclusive); kind -1 is "-", +1 is "+", 0 a member.
LexBound = tuple[int, bytes, bool]


def parse_lex_bound(raw: bytes) -> LexBound | None:
    """Redis's ``zslParseLexRangeItem``: ``-``, ``+``, ``[member`` or ``(member``."""
    head, rest = raw[:1], raw[1:]
    if head in (b"-", b"+"):
        # Redis compares the next C char to NUL, so "+" followed by a NUL byte passes.
        if rest and rest[0] != 0:
            return None
        return (-1 if head == b"-" else 1), b"", True
    if head in (b"[", b"("):
        return 0, rest, head == b"("
    return None


def _lex_cmp(member: bytes, bound: LexBound) -> int:
    kind, value, _ = bound
    if kind:
        return -kind  # every member is above "-" and below "+"
    return (member > value) - (member < value)


def _gte_min(member: bytes, low: LexBound) -> bool:
    c = _lex_cmp(member, low)
    return c > 0 if low[2] else c >= 0


def _lte_max(member: bytes, high: LexBound) -> bool:
    c = _lex_cmp(member, high)
    return c < 0 if high[2] else c <= 0


def _bound_cmp(a: LexBound, b: LexBound) -> int:
    """Redis's ``sdscmplex`` of two bounds ("-" below all, "+" above all)."""
    if a[0] == b[0] != 0:
        return 0
    if a[0] == -1 or b[0] == 1:
        return -1
    if a[0] == 1 or b[0] == -1:
        return 1
    return (a[1] > b[1]) - (a[1] < b[1])


def _empty_lex(low: LexBound, high: LexBound) -> bool:
    cmp = _bound_cmp(low, high)
    return cmp > 0 or (cmp == 0 and (low[2] or high[2]))


def zrange_by_lex(
    z: SortedSet, low: LexBound, high: LexBound, rev: bool, *, offset: int, count: int
) -> list[tuple[float, bytes]]:
    """BYLEX with LIMIT, walking the set as Redis's compact encoding does."""
    entries = z.at(0, len(z))
    if not entries or _empty_lex(low, high) or offset < 0:
        return []
    if not _gte_min(entries[-1][1], low) or not _lte_max(entries[0][1], high):
        return []
    if rev:
        entries.reverse()
        first = next((i for i, e in enumerate(entries) if _lte_max(e[1], high)), None)
        if first is None or not _gte_min(entries[first][1], low):
            return []
        in_range: Callable[[bytes, LexBound], bool] = _gte_min
        bound = low
    else:
        first = next((i for i, e in enumerate(entries) if _gte_min(e[1], low)), None)
        if first is None or not _lte_max(entries[first][1], high):
            return []
        in_range = _lte_max
        bound = high
    out: list[tuple[float, bytes]] = []
    i = first + offset
    while i < len(entries) and (count < 0 or len(out) < count):
        if not in_range(entries[i][1], bound):
            break
        out.append(entries[i])
        i += 1
    return out
