"""Which stable prefix goes to which llama-server slot: one prefix per slot, LRU.

Owns :class:`SlotTable` and :func:`parse_slots`. With ``-np N`` a llama-server has N
slots, each holding its own K/V; ``--slots 0,1,2`` (or ``all``) lets the warmer keep one
stable prefix warm in each. A request whose prefix already has a slot goes there; a new
prefix takes a slot nobody claimed yet, else the least recently used one (its previous
prefix is *evicted*: the warmer saves it first when it is not on disk yet). Requests are
then pinned to their slot with ``id_slot``, so llama-server's own slot choice (by prompt
similarity) cannot move a prefix.

The table records claims, not K/V: a request picks among the slots no other request holds
a lease on (:meth:`SlotTable.pick`, :mod:`pion.llama.lease`) and records its claim once
its lease is granted, while the warmer's own state records what a slot was verified to
hold. Thread-safe.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

__all__ = ["MAX_SLOT_ID", "Claim", "SlotTable", "parse_slots"]

# llama-server's slot ids are small (one per -np); a larger id is a typo.
MAX_SLOT_ID = 4095


def parse_slots(spec: str) -> tuple[int, ...] | None:
    """``"0,1,2"`` → (0, 1, 2); ``"all"`` → None (every slot the server has).

    Raises ValueError for anything else (empty, negative, repeated, non-numeric)."""
    text = spec.strip().lower()
    if text == "all":
        return None
    parts = [p.strip() for p in text.split(",")]
    if not text or any(not p.isdigit() for p in parts):
        raise ValueError(f"--slots wants 'all' or slot ids like 0,1,2, not {spec!r}")
    ids = tuple(int(p) for p in parts)
    if len(set(ids)) != len(ids):
        raise ValueError(f"--slots names a slot twice: {spec!r}")
    if max(ids) > MAX_SLOT_ID:
        raise ValueError(f"--slots: slot ids are 0..{MAX_SLOT_ID}")
    return ids


@dataclass
class Claim:
    """A slot routed to one prefix."""

    fingerprint: str
    label: str
    last_used: float
    order: int  # a logical clock: wall time can tie or step back


class SlotTable:
    """Claims of a fixed set of slots."""

    def __init__(self, slots: tuple[int, ...]) -> None:
        if not slots:
            raise ValueError("a slot table needs at least one slot")
        self.slots = slots
        self._claims: dict[int, Claim] = {}
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def claim(self, fingerprint: str, label: str = "") -> tuple[int, str | None]:
        """The slot for ``fingerprint`` and the fingerprint it evicts (None if none)."""
        with self._lock:
            order, now = next(self._clock), time.time()
            for slot, c in self._claims.items():
                if c.fingerprint == fingerprint:
                    c.last_used, c.order = now, order
                    return slot, None
            free = [s for s in self.slots if s not in self._claims]
            evicted: str | None = None
            if free:
                slot = free[0]
            else:
                slot = min(self._claims, key=lambda s: self._claims[s].order)
                evicted = self._claims[slot].fingerprint
            self._claims[slot] = Claim(fingerprint, label, now, order)
            return slot, evicted

    def pick(self, fingerprint: str, free: frozenset[int]) -> int | None:
        """The slot a request for ``fingerprint`` takes among the ``free`` ones (not
        leased): its own when it is free, None when its own is leased (it waits for it);
        else a free slot nobody claimed, else the least recently used free one. Records
        nothing (:meth:`pin` does, once the slot is leased)."""
        with self._lock:
            own = next((s for s, c in self._claims.items() if c.fingerprint == fingerprint), None)
            if own is not None:
                return own if own in free else None
            unclaimed = [s for s in self.slots if s in free and s not in self._claims]
            if unclaimed:
                return unclaimed[0]
            claimed = [s for s in self._claims if s in free]
            return min(claimed, key=lambda s: self._claims[s].order) if claimed else None

    def pin(self, slot: int, fingerprint: str, label: str = "") -> str | None:
        """Record that ``slot`` now serves ``fingerprint`` (an explicit choice); return the
        fingerprint it replaced, if another. A prefix claimed elsewhere moves here."""
        with self._lock:
            for other in [s for s, c in self._claims.items() if c.fingerprint == fingerprint]:
                if other != slot:
                    del self._claims[other]
            previous = self._claims.get(slot)
            self._claims[slot] = Claim(fingerprint, label, time.time(), next(self._clock))
            if previous is None or previous.fingerprint == fingerprint:
                return None
            return previous.fingerprint

    def slot_of(self, fingerprint: str) -> int | None:
        """The slot claimed for ``fingerprint``, if any."""
        with self._lock:
            return next((s for s, c in self._claims.items() if c.fingerprint == fingerprint), None)

    def holder(self, slot: int) -> Claim | None:
        with self._lock:
            return self._claims.get(slot)

    def lru_order(self) -> list[int]:
        """Claimed slots, least recently used first."""
        with self._lock:
            return sorted(self._claims, key=lambda s: self._claims[s].order)
