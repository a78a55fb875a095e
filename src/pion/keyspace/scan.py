"""SCAN cursors over the keyspace: a slot table that keeps its promises without state
per cursor.

Redis walks its hash table in reverse-binary bucket order so a cursor survives
rehashing. A Python dict offers no stable position, so the keyspace keeps its own
order: every key gets a slot at the end of a list when it is created, and a deleted
key leaves a hole. A cursor is a position in that list, so SCAN's guarantees hold as
in Redis: a key present from the first call to the last is returned at least once, a
key added meanwhile may or may not be, nothing is remembered per client, and a full
iteration ends with cursor 0.

Holes are squeezed out once they outnumber the live slots (and are at least
``COMPACT_MIN_HOLES``), which would move live keys under a cursor in flight. So the
cursor carries the table's generation in its top bits, and each compaction keeps the
positions of the holes it removed: an older cursor is translated through them
(position minus the holes before it), and one older than the last ``KEEP_GENERATIONS``
compactions restarts at 0, which may repeat keys (SCAN allows that) but never skips
one.

Cursor layout (unsigned 64-bit, as Redis's)::

    bits 63..40  generation modulo 2**23 (never all ones: the top bit stays clear)
    bits 39..0   position in that generation's slot list
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from random import Random

import numpy as np
import numpy.typing as npt

__all__ = ["COMPACT_MIN_HOLES", "KEEP_GENERATIONS", "MAX_CURSOR", "SlotTable"]

_POS_BITS = 40
_POS_MASK = (1 << _POS_BITS) - 1
_GEN_MOD = 1 << 23
# The largest cursor Redis accepts (an unsigned long long).
MAX_CURSOR = (1 << 64) - 1
# Compaction waits for this many holes, so small keyspaces never pay for it.
COMPACT_MIN_HOLES = 1024
# Compactions whose hole maps are kept to translate older cursors.
KEEP_GENERATIONS = 16


class SlotTable:
    """Positions of keys for SCAN. The keyspace owns the key -> slot mapping (it stores
    each key's slot beside its value) and reports moves through ``relocate``."""

    __slots__ = ("_gen", "_holes", "_maps", "_slots", "relocate")

    def __init__(self, relocate: Callable[[bytes, int], None]) -> None:
        # Called with (key, new slot) for every live key a compaction moves.
        self.relocate = relocate
        self._slots: list[bytes | None] = []
        self._holes = 0
        self._gen = 0
        # (generation, positions of the holes removed when it ended), oldest first.
        self._maps: deque[tuple[int, npt.NDArray[np.int64]]] = deque(maxlen=KEEP_GENERATIONS)

    def __len__(self) -> int:
        return len(self._slots) - self._holes

    @property
    def holes(self) -> int:
        return self._holes

    def sample(self, rng: Random) -> bytes:
        """A live key chosen uniformly (the table must hold one). Random slots until
        one is live: holes are at most half the slots once there are many of them
        (compaction), so this takes two tries on average; a small table full of holes
        is walked from a random slot instead."""
        slots = self._slots
        for _ in range(32):
            key = slots[rng.randrange(len(slots))]
            if key is not None:
                return key
        start = rng.randrange(len(slots))
        for key in slots[start:] + slots[:start]:
            if key is not None:
                return key
        raise LookupError("the slot table is empty")

    def snapshot(self) -> list[bytes | None]:
        """Every live key now, with None for holes: a C-speed copy of the table (KEYS
        takes it in one step and filters it in the next ones)."""
        return self._slots[:]

    def add(self, key: bytes) -> int:
        self._slots.append(key)
        return len(self._slots) - 1

    def remove(self, slot: int) -> None:
        self._slots[slot] = None
        self._holes += 1

    def clear(self) -> None:
        """Forget every slot (FLUSHDB); cursors in flight restart at 0."""
        self._slots = []
        self._holes = 0
        self._gen = (self._gen + 1) % _GEN_MOD
        self._maps.clear()

    def maybe_compact(self) -> bool:
        """Squeeze out the holes when they outnumber the live keys; True if it did."""
        holes = self._holes
        if holes < COMPACT_MIN_HOLES or holes <= len(self._slots) - holes:
            return False
        old = self._slots
        removed = np.fromiter(
            (i for i, k in enumerate(old) if k is None), dtype=np.int64, count=holes
        )
        live: list[bytes | None] = [k for k in old if k is not None]
        for i, key in enumerate(live):
            if key is not None:
                self.relocate(key, i)
        self._maps.append((self._gen, removed))
        self._slots = live
        self._holes = 0
        self._gen = (self._gen + 1) % _GEN_MOD
        return True

    def _position(self, cursor: int) -> int:
        """The current position a cursor stands for (0 when it is too old)."""
        gen, pos = cursor >> _POS_BITS, cursor & _POS_MASK
        if gen == self._gen:
            return pos
        maps = list(self._maps)
        for i, (old_gen, _) in enumerate(maps):
            if old_gen == gen:
                for _, removed in maps[i:]:
                    pos -= int(np.searchsorted(removed, pos, side="left"))
                return pos
        return 0

    def cursor_at(self, pos: int) -> int:
        return 0 if pos >= len(self._slots) else (self._gen << _POS_BITS) | pos

    def walk(self, cursor: int, budget: int) -> tuple[int, list[bytes]]:
        """Keys from ``cursor`` on, visiting at most ``budget`` slots (holes included):
        (next cursor, keys in slot order)."""
        pos = self._position(cursor)
        end = min(len(self._slots), pos + budget)
        keys = [k for k in self._slots[pos:end] if k is not None]
        return self.cursor_at(end), keys
