"""Per-session tier state shared by the worker's loop and the writer thread.

- ``gen``: the tier generation this worker's local copy of a session corresponds to
  (learned when the writer created or first wrote it, or when a fill read it). LOOKUP
  compares it with the tier's to notice a DROP (or a re-creation) made by another node.
- ``dirty``: sessions whose tier copy is behind the local one because a write could
  not be queued (the bound was reached) or the tier lost the copy; a resync pushes the
  whole local session again (or drops the tier's copy when the session is gone here).
- ``abandoned``: sessions this worker does not write through because the tier holds
  them with another layout (another node created them first) or beyond the tier's
  limits. Cleared when the session is created anew locally.

Sizes are bounded: the maps are pruned oldest first past ``capacity`` entries.
"""

from __future__ import annotations

import threading
from typing import TypeVar

__all__ = ["Ledger"]


class Ledger:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._gens: dict[bytes, str] = {}
        self._dirty: dict[bytes, None] = {}  # insertion-ordered set: oldest resync first
        self._abandoned: dict[bytes, None] = {}

    # -- generations -----------------------------------------------------------------

    def gen(self, sid: bytes) -> str | None:
        with self._lock:
            return self._gens.get(sid)

    def set_gen(self, sid: bytes, gen: str) -> None:
        with self._lock:
            self._gens.pop(sid, None)
            self._gens[sid] = gen
            _prune(self._gens, self.capacity)

    def forget(self, sid: bytes) -> None:
        """The local copy is gone (dropped or evicted)."""
        with self._lock:
            self._gens.pop(sid, None)

    # -- resync ----------------------------------------------------------------------

    def mark_dirty(self, sid: bytes) -> bool:
        """True when the session was not already marked."""
        with self._lock:
            if sid in self._dirty:
                return False
            self._dirty[sid] = None
            _prune(self._dirty, self.capacity)
            return True

    def is_dirty(self, sid: bytes) -> bool:
        with self._lock:
            return sid in self._dirty

    def clear_dirty(self, sid: bytes) -> None:
        with self._lock:
            self._dirty.pop(sid, None)

    def take_dirty(self, limit: int) -> list[bytes]:
        with self._lock:
            taken = list(self._dirty)[:limit]
            for sid in taken:
                del self._dirty[sid]
            return taken

    @property
    def dirty_count(self) -> int:
        with self._lock:
            return len(self._dirty)

    # -- not written through ---------------------------------------------------------

    def abandon(self, sid: bytes) -> bool:
        with self._lock:
            if sid in self._abandoned:
                return False
            self._abandoned[sid] = None
            _prune(self._abandoned, self.capacity)
            return True

    def is_abandoned(self, sid: bytes) -> bool:
        with self._lock:
            return sid in self._abandoned

    def readopt(self, sid: bytes) -> None:
        with self._lock:
            self._abandoned.pop(sid, None)

    @property
    def abandoned_count(self) -> int:
        with self._lock:
            return len(self._abandoned)


V = TypeVar("V")


def _prune(entries: dict[bytes, V], capacity: int) -> None:
    while len(entries) > capacity:
        del entries[next(iter(entries))]
