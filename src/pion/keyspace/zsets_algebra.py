"""Sorted-set algebra over several keys (Redis 7.0's ``zunionInterDiffGenericCommand``):
ZUNION, ZINTER, ZDIFF, their STORE forms and ZINTERCARD, as operations on a
:class:`~pion.keyspace.Keyspace`.

Scores are combined in Redis's order so that even float rounding matches: the inputs
are sorted by size, smallest first (a stable sort; a missing key is an empty set),
and each is walked from its highest member down, as Redis's iterator walks it. A
weight times a score that is NaN (``inf * 0``) counts as 0, and so does a SUM that
comes out NaN (``inf + -inf``). The STORE forms replace the destination with one log
record (:meth:`Keyspace.zset_replace`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace

__all__ = ["Aggregate", "SetOp", "ZSources", "zcombine", "zintercard"]

Aggregate = Literal["SUM", "MIN", "MAX"]
SetOp = Literal["UNION", "INTER", "DIFF"]


@dataclass(frozen=True, slots=True)
class ZSources:
    """The input sets, in the order given (None: a missing key), with their weights."""

    sets: list[SortedSet | None]
    weights: list[float]


def load_sources(ks: Keyspace, keys: list[bytes]) -> ZSources:
    """Every input, typed as Redis checks them (WRONGTYPE before any option)."""
    return ZSources([ks.zset(k) for k in keys], [1.0] * len(keys))


def _aggregate(how: Aggregate) -> Callable[[float, float], float]:
    if how == "MIN":
        return min
    if how == "MAX":
        return max

    def total(a: float, b: float) -> float:
        s = a + b
        return 0.0 if math.isnan(s) else s

    return total


def _weighted(weight: float, score: float) -> float:
    s = weight * score
    return 0.0 if math.isnan(s) else s


def _ordered(src: ZSources) -> list[tuple[SortedSet | None, float]]:
    pairs = list(zip(src.sets, src.weights, strict=True))
    pairs.sort(key=lambda p: 0 if p[0] is None else len(p[0]))
    return pairs


def _descending(z: SortedSet) -> list[tuple[float, bytes]]:
    entries = z.at(0, len(z))
    entries.reverse()
    return entries


def zcombine(src: ZSources, op: SetOp, how: Aggregate) -> list[tuple[float, bytes]]:
    """The result set's entries (member order is left to the caller: a sorted set)."""
    if op == "DIFF":
        first, *rest = src.sets
        if first is None:
            return []
        others = [z for z in rest if z is not None]
        return [(s, m) for s, m in first if not any(m in z.scores for z in others)]
    combine = _aggregate(how)
    ordered = _ordered(src)
    if op == "UNION":
        acc: dict[bytes, float] = {}
        for z, weight in ordered:
            if z is None:
                continue
            for score, member in _descending(z):
                value = _weighted(weight, score)
                old = acc.get(member)
                acc[member] = value if old is None else combine(old, value)
        return [(s, m) for m, s in acc.items()]
    z0, w0 = ordered[0]
    if z0 is None or not len(z0):
        return []
    out: list[tuple[float, bytes]] = []
    for score, member in _descending(z0):
        value = _weighted(w0, score)
        for z, weight in ordered[1:]:
            other = None if z is None else z.scores.get(member)
            if other is None:
                break
            value = combine(value, weight * other)
        else:
            out.append((value, member))
    return out


def zintercard(src: ZSources, limit: int) -> int:
    """ZINTERCARD: members in every input, counting stops at ``limit`` (0: none)."""
    ordered = _ordered(src)
    z0 = ordered[0][0]
    if z0 is None:
        return 0
    count = 0
    for _, member in _descending(z0):
        if all(z is not None and member in z.scores for z, _ in ordered[1:]):
            count += 1
            if limit and count >= limit:
                break
    return count
