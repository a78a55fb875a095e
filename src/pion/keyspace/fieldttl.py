"""Hash-field deadlines (Redis 7.4's hash-field expiry, HEXPIRE and its family): which
fields of which hashes have one, and the heap the active sweep reads.

A field's deadline is an absolute Unix time in ms, like a key's (``expiry.py``), and a
field is expired once ``now > deadline``. The table keeps, per hash, ``{field:
deadline}`` and a lower bound of the earliest one (``earliest``): a lookup of a hash
whose bound is not past costs one dict probe, and one whose bound is past has its due
fields found and its bound made exact again (:meth:`due`). The heap holds
``(bound, key)`` pairs, one pushed whenever a key's bound changes, so stale pairs are
skipped by comparing with ``earliest`` and the heap is rebuilt once they outnumber
live ones (as ``expiry.Deadlines``).

Only the bookkeeping is here: the key table's primitives (``primitives.py``) keep it
in step with the hashes, and ``store.py`` removes the due fields (journaled as HDEL).
"""

from __future__ import annotations

import heapq

__all__ = ["FIELD_TTL_OVERHEAD", "FieldDeadlines"]

# What a field's deadline adds to ``used_bytes``: its slot in the per-hash dict (~50),
# the int (32) and a share of a heap pair (~24 + 8).
FIELD_TTL_OVERHEAD = 112


class FieldDeadlines:
    """The hash fields that have a deadline; see the module docstring."""

    __slots__ = ("_heap", "by_key", "earliest")

    def __init__(self) -> None:
        self.by_key: dict[bytes, dict[bytes, int]] = {}
        self.earliest: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []

    def of(self, key: bytes) -> dict[bytes, int] | None:
        return self.by_key.get(key)

    def get(self, key: bytes, field: bytes) -> int:
        """The field's deadline, 0 when it has none."""
        fields = self.by_key.get(key)
        return 0 if fields is None else fields.get(field, 0)

    def set(self, key: bytes, field: bytes, deadline: int) -> int:
        """Give ``field`` this deadline (0: none); returns its previous one (0: none)."""
        fields = self.by_key.get(key)
        if fields is None:
            if not deadline:
                return 0
            fields = self.by_key[key] = {}
        old = fields.pop(field, 0) if not deadline else fields.get(field, 0)
        if deadline:
            fields[field] = deadline
            bound = self.earliest.get(key)
            if bound is None or deadline < bound:
                self._bound(key, deadline)
        elif not fields:
            self.forget(key)
        return old

    def _bound(self, key: bytes, deadline: int) -> None:
        self.earliest[key] = deadline
        heapq.heappush(self._heap, (deadline, key))

    def forget(self, key: bytes) -> int:
        """The hash went or was replaced: drop its deadlines; returns how many."""
        self.earliest.pop(key, None)
        fields = self.by_key.pop(key, None)
        return 0 if fields is None else len(fields)

    def take(self, key: bytes) -> dict[bytes, int]:
        fields = self.by_key.get(key) or {}
        self.forget(key)
        return fields

    def restore(self, key: bytes, fields: dict[bytes, int]) -> None:
        """``key`` (a hash just put, RENAME or COPY) gets these deadlines."""
        if fields:
            self.by_key[key] = fields
            self._bound(key, min(fields.values()))

    def clear(self) -> None:
        self.by_key = {}
        self.earliest = {}
        self._heap = []

    def count(self) -> int:
        return sum(len(f) for f in self.by_key.values())

    def due(self, key: bytes, now: int) -> list[bytes]:
        """The fields of ``key`` past their deadline at ``now`` (they stay here: their
        removal does that); the bound becomes the earliest deadline of the others."""
        fields = self.by_key.get(key)
        if fields is None:
            self.earliest.pop(key, None)
            return []
        out = [f for f, d in fields.items() if d < now]
        rest = [d for d in fields.values() if d >= now]
        if rest:
            low = min(rest)
            if self.earliest.get(key) != low:
                self._bound(key, low)
        return out

    def due_keys(self, now: int, limit: int) -> list[bytes]:
        """Up to ``limit`` hashes whose bound is before ``now``, earliest first."""
        heap = self._heap
        out: list[bytes] = []
        seen: set[bytes] = set()
        work = 0
        while heap and heap[0][0] < now and len(out) < limit and work < 4 * limit:
            bound, key = heapq.heappop(heap)
            work += 1
            if key not in seen and self.earliest.get(key) == bound:
                seen.add(key)
                out.append(key)
        if len(heap) > 2 * len(self.earliest) + 1024:
            self._heap = [(d, k) for k, d in self.earliest.items()]
            heapq.heapify(self._heap)
        return out
