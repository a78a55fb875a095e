"""More sorted-set semantics (Redis's ``t_zset.c``): counts, ranks, pops, range
removals, random members and ZSCAN, as operations on a
:class:`~pion.keyspace.Keyspace`. ``zsets.py`` has ZADD and the range walks these
reuse.

Removals (ZPOPMIN/ZPOPMAX, ZREMRANGEBY*) work out which members go and remove them
with :meth:`Keyspace.zset_delete`, one ZREM record of exactly those members, so replay
never depends on what the set held. ZSCAN answers a compact set (at most 128 members of
at most 64 bytes: Redis's listpack) whole with cursor 0, as Redis does, and walks a
larger one ``COUNT`` members per call by rank; members removed before the cursor during
a walk shift later ones back, so such a walk may miss members (Redis's table walk
would not).
"""

from __future__ import annotations

import math

from pion.keyspace.glob import stringmatch
from pion.keyspace.hashes import COMPACT_VALUE, COMPACT_ZSET_ENTRIES, random_picks
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace
from pion.keyspace.zsets import (
    LexBound,
    ScoreRange,
    zrange_by_lex,
    zrange_by_rank,
    zrange_by_score,
)

__all__ = [
    "compact",
    "score_text",
    "zcount",
    "zlexcount",
    "zpop",
    "zrandmember",
    "zremrange_by_lex",
    "zremrange_by_rank",
    "zremrange_by_score",
    "zscan",
]


def compact(z: SortedSet) -> bool:
    """Whether Redis would hold a sorted set built to this shape in a listpack."""
    return len(z) <= COMPACT_ZSET_ENTRIES and all(len(m) <= COMPACT_VALUE for m in z.scores)


def score_text(score: float) -> bytes:
    """A score as Redis writes it into a listpack or a ZSCAN reply (``d2string``)."""
    if math.isinf(score):
        return b"inf" if score > 0 else b"-inf"
    return f"{score:.17g}".encode()


def zcount(z: SortedSet, rng: ScoreRange) -> int:
    if rng.empty():
        return 0
    first, last = z.rank_bounds(rng.low, rng.low_open, rng.high, rng.high_open)
    return last - first


def zlexcount(z: SortedSet, low: LexBound, high: LexBound) -> int:
    return len(zrange_by_lex(z, low, high, False, offset=0, count=-1))


def _remove(ks: Keyspace, key: bytes, picked: list[tuple[float, bytes]]) -> int:
    if not picked:
        return 0
    return ks.zset_delete(key, [m for _, m in picked])


def zremrange_by_rank(ks: Keyspace, key: bytes, start: int, stop: int) -> int:
    z = ks.zset(key, read=False)
    return 0 if z is None else _remove(ks, key, zrange_by_rank(z, start, stop, False))


def zremrange_by_score(ks: Keyspace, key: bytes, rng: ScoreRange) -> int:
    z = ks.zset(key, read=False)
    return 0 if z is None else _remove(ks, key, zrange_by_score(z, rng, False, 0, -1))


def zremrange_by_lex(ks: Keyspace, key: bytes, low: LexBound, high: LexBound) -> int:
    z = ks.zset(key, read=False)
    if z is None:
        return 0
    return _remove(ks, key, zrange_by_lex(z, low, high, False, offset=0, count=-1))


def zpop(ks: Keyspace, key: bytes, count: int, highest: bool) -> list[tuple[float, bytes]]:
    """ZPOPMIN/ZPOPMAX: up to ``count`` entries, lowest (highest) first, removed."""
    z = ks.zset(key, read=False)
    if z is None or count <= 0:
        return []
    picked = zrange_by_rank(z, 0, count - 1, highest)
    _remove(ks, key, picked)
    return picked


def zrandmember(ks: Keyspace, key: bytes, count: int | None) -> list[tuple[float, bytes]] | None:
    """ZRANDMEMBER: None for no key (without count); else the picked entries."""
    z = ks.zset(key)
    if z is None:
        return None if count is None else []
    entries = z.at(0, len(z))
    if count is None:
        return [entries[ks.rng.randrange(len(entries))]]
    if count == 0:
        return []
    if count >= len(entries):
        # The whole set, walked from the highest member down as Redis's does.
        entries.reverse()
        return entries
    return [entries[i] for i in random_picks(ks.rng, len(entries), count)]


def zscan(
    ks: Keyspace, key: bytes, cursor: int, count: int, pattern: bytes | None
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """One ZSCAN step (see the module docstring): (next cursor, member-score pairs)."""
    z = ks.zset(key, read=False)
    if z is None:
        return 0, []
    if compact(z):
        entries = z.at(0, len(z))
        nxt = 0
    else:
        entries = z.at(cursor, cursor + count) if cursor < len(z) else []
        nxt = cursor + len(entries) if cursor + len(entries) < len(z) else 0
    return nxt, [
        (m, score_text(s)) for s, m in entries if pattern is None or stringmatch(pattern, m)
    ]
