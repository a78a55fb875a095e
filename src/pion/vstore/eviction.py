"""Making room in the V-store: the least recently used namespaces go first.

Eviction. The unit is the namespace: a ``<ns>_pk``/``<ns>_pv`` sid
takes its other half with it (``views.namespace_of``); a namespace's age is that of its
most recently used half. Creating a session beyond ``max_sessions`` evicts the least
recently used namespace(s); a write that would take ``vstore_bytes`` past
``maxmemory`` evicts LRU namespaces holding bytes until it fits. The namespace being
written is never a victim, so a write that cannot fit even then (or that alone is
larger than the budget) raises ``OOMError`` and evicts nothing. The order lives in
``lru.py``: a touch and each victim cost O(1), whatever the number of sessions.

The budget is ``used_memory`` (``pion.commands.budget``): ``vstore_bytes`` plus
``external_bytes()``, the rest of it, of which ``fixed_bytes()`` (the server's startup
memory) no eviction frees. Under ``maxmemory-policy noeviction`` (``evict_for_bytes``
False) nothing is evicted for bytes: a write that does not fit answers ``OOMError``.
When the namespaces cannot free enough, ``evict_others`` evicts keys by the policy;
as in Redis, keys it evicted for a write that still does not fit stay evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.errors import OOMError
from pion.vstore.lru import Group
from pion.vstore.mutations import DropSession
from pion.vstore.table import SessionTable

__all__ = ["Eviction"]


class Eviction(SessionTable):
    """Evictions for the session bound (``max_sessions``) and the byte budget
    (``maxmemory``, shared with other stores through ``external_bytes``)."""

    def make_room(self, nbytes: int) -> None:
        """Make ``nbytes`` fit under ``maxmemory`` for another store sharing the budget
        (the keyspace): evict LRU namespaces as a V-store write would, or raise
        ``OOMError`` and evict nothing."""
        self._make_room_for_bytes((), nbytes)

    def evict_lru_bytes(self, nbytes: int, keep: Sequence[bytes] = ()) -> int:
        """Evict LRU namespaces holding bytes, none with a sid in ``keep``, until
        ``nbytes`` are freed or none is left (before a write command:
        ``pion.commands.budget``); returns the bytes freed. Nothing under
        ``noeviction``."""
        freed = 0
        if not self.evict_for_bytes:
            return 0
        plan: list[Group] = []
        for group in self._lru.holding(()):
            if freed >= nbytes:
                break
            if not any(sid == k for sid in group for k in keep):
                plan.append(group)
                freed += self._lru.bytes_of(group)
        for group in plan:
            self._evict(group)
        return freed

    def _make_room_for_bytes(self, spare: Group, grow: int) -> None:
        """Evict LRU groups holding bytes (never ``spare``, the writer's own) until a
        write growing ``vstore_bytes`` by ``grow`` fits the budget; evict nothing and
        raise OOMError when it cannot fit. Examines only the groups it evicts."""
        budget = self.maxmemory
        if budget <= 0 or grow <= 0:
            return
        used = self.vstore_bytes + self.external_bytes()
        if used + grow <= budget:
            return
        fixed = self.fixed_bytes()
        if grow > budget - fixed:
            startup = f" less the {fixed} bytes the server holds from startup" if fixed else ""
            raise OOMError(
                f"command not allowed: a write of {grow} bytes is larger than "
                f"maxmemory ({budget} bytes){startup}"
            )
        excess = used + grow - budget
        evictable = self.vstore_bytes - self._lru.bytes_of(spare) if self.evict_for_bytes else 0
        if evictable < excess:
            # Namespaces are not enough: keys go too, as maxmemory-policy says (like
            # Redis, those evicted stay evicted if even that is not enough).
            excess -= self.evict_others(excess - evictable)
        if evictable < excess:
            raise OOMError(
                f"command not allowed when used memory > 'maxmemory': the write needs "
                f"{grow} bytes, {used} of {budget} are held and only "
                f"{evictable} are evictable"
            )
        plan: list[Group] = []
        freed = 0
        for group in self._lru.holding(spare):
            if freed >= excess:
                break
            plan.append(group)
            freed += self._lru.bytes_of(group)
        for group in plan:
            self._evict(group)

    def _evict(self, group: Group) -> None:
        for sid in group:
            if sid in self._sessions:
                self._journal(DropSession(sid, "evict"))
                self._apply_drop(sid)
                self.evictions += 1
