"""The sorted set value: members with float scores, ordered by (score, member).

Order is Redis's: ascending score, equal scores by member bytes (memcmp, a shorter
prefix first), which is exactly how Python compares ``(float, bytes)`` tuples. A dict
gives O(1) ZSCORE; a sorted list of ``(score, member)`` gives O(log n) positions and
O(n) insertion (a memmove), which for the sizes this keyspace serves (PrefixStore's
LRU of segments) beats a skip list written in Python.

Scores are never NaN (commands refuse them). ``-0.0`` is kept as given and compares
equal to ``0.0``, as in Redis.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator, Sequence

__all__ = ["SortedSet"]

# Past this many members in one write, one sort of the whole set beats an insertion
# (a memmove of the list) each: a 100,000-member ZADD took seconds one by one.
_BULK = 256


class SortedSet:
    __slots__ = ("_order", "scores")

    def __init__(self) -> None:
        self.scores: dict[bytes, float] = {}
        self._order: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self.scores)

    def __iter__(self) -> Iterator[tuple[float, bytes]]:
        return iter(self._order)

    def copy(self) -> SortedSet:
        out = SortedSet()
        out.scores = dict(self.scores)
        out._order = list(self._order)
        return out

    def add(self, member: bytes, score: float) -> bool:
        """Set ``member``'s score; True when the member is new."""
        old = self.scores.get(member)
        if old is not None:
            if old == score:  # as Redis: -0.0 does not replace 0.0, nor the reverse
                return False
            del self._order[bisect_left(self._order, (old, member))]
        self.scores[member] = score
        insort(self._order, (score, member))
        return old is None

    @classmethod
    def adopt(cls, scores: dict[bytes, float], order: list[tuple[float, bytes]]) -> SortedSet:
        """A set of exactly these members: ``order`` is ``scores`` as ``(score,
        member)``, sorted (built elsewhere, in steps)."""
        z = cls()
        z.scores = scores
        z._order = order
        return z

    def add_many(self, items: Sequence[tuple[float, bytes]]) -> list[bytes]:
        """:meth:`add` each ``(score, member)`` in order; the members that were new."""
        if len(items) < _BULK:
            return [m for score, m in items if self.add(m, score)]
        scores = self.scores
        new: list[bytes] = []
        for score, m in items:
            old = scores.get(m)
            if old is None:
                new.append(m)
            elif old == score:
                continue
            scores[m] = score
        self._order = sorted([(score, m) for m, score in scores.items()])
        return new

    def remove(self, member: bytes) -> bool:
        old = self.scores.pop(member, None)
        if old is None:
            return False
        del self._order[bisect_left(self._order, (old, member))]
        return True

    def rank(self, member: bytes) -> int | None:
        """The member's 0-based rank in ascending order, or None."""
        score = self.scores.get(member)
        return None if score is None else bisect_left(self._order, (score, member))

    def by_rank(self, start: int, stop: int) -> list[tuple[float, bytes]]:
        """Entries at ranks ``start..stop`` inclusive (already clamped, ascending)."""
        return self._order[start : stop + 1]

    def rank_bounds(
        self, low: float, low_open: bool, high: float, high_open: bool
    ) -> tuple[int, int]:
        """Ranks ``[first, last)`` of the entries whose score is within the bounds."""
        order = self._order
        # (x, b"") sorts before every member of score x; bisect on score alone.
        first = (
            bisect_right(order, low, key=lambda e: e[0])
            if low_open
            else bisect_left(order, low, key=lambda e: e[0])
        )
        last = (
            bisect_left(order, high, key=lambda e: e[0])
            if high_open
            else bisect_right(order, high, key=lambda e: e[0])
        )
        return first, max(first, last)

    def at(self, first: int, last: int) -> list[tuple[float, bytes]]:
        return self._order[first:last]
