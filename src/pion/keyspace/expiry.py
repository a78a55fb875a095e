"""Expiry: absolute deadlines, the heap the active sweep reads, and the sweep's limits.

Deadlines are absolute Unix times in milliseconds (0: none), taken from the wall clock
when a command sets them (``EXPIRE 10`` = now + 10 s), so they mean the same after a
restart, as Redis's do. A key is expired once ``now > deadline``.

Two ways a key goes (``store.py`` does both, journaling each removal):

* lazily: any command that touches a key past its deadline removes it first;
* actively: :meth:`Keyspace.sweep` every ``SWEEP_INTERVAL_S`` removes the keys whose
  deadlines passed, earliest first, at most ``SWEEP_MAX_KEYS`` per tick, so a mass
  expiry never stalls the event loop (Redis bounds its active cycle the same way, by
  time; keys not reached yet are still invisible to every command).

The heap holds ``(deadline, key)`` pairs and may hold stale ones (a key whose deadline
changed or that is gone): the sweep skips those, and the heap is rebuilt from the keys
once stale pairs outnumber live ones.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from random import Random

__all__ = [
    "MAX_DEADLINE_MS",
    "SWEEP_INTERVAL_S",
    "SWEEP_MAX_KEYS",
    "Deadlines",
    "now_ms",
]

# Redis's hz 10: ten active expiry cycles a second.
SWEEP_INTERVAL_S = 0.1
# Keys removed per tick at most (each one costs a dict pop and a share of one log
# record): about 10k/s, a few ms of every 100 ms at worst.
SWEEP_MAX_KEYS = 1000
# The largest deadline a command may set: Redis refuses what overflows a signed 64-bit
# count of milliseconds ("invalid expire time").
MAX_DEADLINE_MS = (1 << 63) - 1


def now_ms() -> int:
    """The wall clock in Unix milliseconds."""
    return int(time.time() * 1000)


class Deadlines:
    """The deadlines of the volatile keys: a count, a sum (for INFO's avg_ttl) and a
    heap of (deadline, key) for the sweep."""

    __slots__ = ("_heap", "count", "total")

    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes]] = []
        self.count = 0
        self.total = 0

    def add(self, key: bytes, deadline: int) -> None:
        self.count += 1
        self.total += deadline
        heapq.heappush(self._heap, (deadline, key))

    def discard(self, deadline: int) -> None:
        """A key's ``deadline`` no longer holds (its heap pair goes stale)."""
        self.count -= 1
        self.total -= deadline

    def clear(self) -> None:
        self._heap = []
        self.count = self.total = 0

    def due(self, now: int, limit: int, current: Callable[[bytes], int]) -> list[bytes]:
        """Up to ``limit`` keys whose deadline is before ``now``, earliest first;
        ``current(key)`` is the key's deadline now (0 when gone), to skip stale pairs.
        Pops at most ``4 * limit`` pairs."""
        heap = self._heap
        out: list[bytes] = []
        seen: set[bytes] = set()
        work = 0
        while heap and heap[0][0] < now and len(out) < limit and work < 4 * limit:
            deadline, key = heapq.heappop(heap)
            work += 1
            if key not in seen and current(key) == deadline:
                seen.add(key)
                out.append(key)
        return out

    def sample(
        self, rng: Random, n: int, tries: int, current: Callable[[bytes], int]
    ) -> list[bytes]:
        """Up to ``n`` distinct keys with a deadline, drawn at random in at most
        ``tries`` draws (``current`` as for :meth:`due`: stale pairs are skipped):
        the candidates of ``maxmemory-policy``'s volatile policies."""
        heap = self._heap
        out: list[bytes] = []
        for _ in range(tries if heap else 0):
            deadline, key = heap[rng.randrange(len(heap))]
            if key not in out and current(key) == deadline:
                out.append(key)
                if len(out) == n:
                    break
        return out

    def stale(self) -> bool:
        return len(self._heap) > 2 * self.count + 1024

    def rebuild(self, pairs: list[tuple[int, bytes]]) -> None:
        heapq.heapify(pairs)
        self._heap = pairs

    def earliest(self) -> int | None:
        return self._heap[0][0] if self._heap else None
