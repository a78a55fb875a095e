"""Slot leases: a request owns its llama-server slot until its answer has been observed.

Owns :class:`SlotLeases` and :class:`Lease`, asyncio primitives on the proxy's event loop
(docs/llama.md, "One request per slot"). A lease is taken before a request's prefix is
warmed into a slot and released only after the real request's answer has been relayed and
observed (and, with persistence, the slot saved): the warm-up, the real request and the
save form one critical section per slot, so no other prefix can evict, save, restore or
warm that slot in between.

Waiting is first come, first served: a waiter is granted a slot only when no earlier
waiter can take it, and a waiter whose wanted slot is leased waits for it. A chooser
(given the free slots, the one this request takes, or None to keep waiting) decides; the
warmer's routing lives there. An *exclusive* lease holds every slot at once: a request
that cannot be pinned to one slot (llama-server b11434 drops ``id_slot`` from
``/v1/messages``) must not land in a slot another request owns. A waiter that waited
longer than its bound gets no lease (its request passes through unwarmed).

Release is idempotent and always safe: a cancelled client, a failed upstream and a proxy
shutdown release the lease in ``finally`` blocks (:meth:`SlotLeases.release_all` at
shutdown). Not thread-safe: everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Chooser", "Lease", "SlotLeases"]

# Given the free slots, the slot to take (or None: keep waiting).
Chooser = Callable[[frozenset[int]], int | None]


@dataclass
class Lease:
    """One request's hold on a slot (``slots``: every slot, for an exclusive lease)."""

    id: int
    slot: int
    slots: frozenset[int]
    label: str
    since: float
    waited_s: float = 0.0
    released: bool = False

    @property
    def exclusive(self) -> bool:
        return len(self.slots) > 1


@dataclass
class _Waiter:
    choose: Chooser | None  # None: exclusive
    label: str
    future: asyncio.Future[Lease]
    since: float = field(default_factory=time.monotonic)


class SlotLeases:
    """Leases over a fixed set of slots."""

    def __init__(self, slots: tuple[int, ...]) -> None:
        if not slots:
            raise ValueError("leases need at least one slot")
        self.slots = slots
        self._held: dict[int, Lease] = {}
        self._released_at: dict[int, float] = {}  # time.monotonic() of each slot's last release
        self._waiters: deque[_Waiter] = deque()
        self._ids = itertools.count(1)
        self.granted = 0
        self.timeouts = 0

    def free(self) -> frozenset[int]:
        return frozenset(s for s in self.slots if s not in self._held)

    def load(self) -> tuple[int, int]:
        """(slots held, requests waiting): how busy this server is, for a fleet's routing."""
        return len(self._held), len(self._waiters)

    def holder(self, slot: int) -> Lease | None:
        return self._held.get(slot)

    def quiet_since(self, slots: frozenset[int], since: float) -> bool:
        """Whether no lease on any of ``slots`` ended after ``since`` (``time.monotonic()``):
        then nobody else used them since, as a held slot is released before it is granted
        again."""
        return all(self._released_at.get(s, float("-inf")) < since for s in slots)

    async def acquire(
        self, choose: Chooser | None, label: str = "", *, wait: float
    ) -> Lease | None:
        """A lease on the slot ``choose`` picks (``None``: every slot), waiting in order
        for at most ``wait`` seconds; None when the wait ran out."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(choose, label, loop.create_future())
        self._waiters.append(waiter)
        self._dispatch()
        taken = False
        try:
            lease = await asyncio.wait_for(asyncio.shield(waiter.future), timeout=wait)
            taken = True
            return lease
        except TimeoutError:
            self.timeouts += 1
            return None
        finally:
            if not taken:
                if waiter.future.done() and not waiter.future.cancelled():
                    # Granted as the wait ran out or the caller was cancelled: give it back.
                    self.release(waiter.future.result())
                else:
                    waiter.future.cancel()
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    def release(self, lease: Lease) -> None:
        """End ``lease`` (a second call does nothing) and grant the slots to waiters."""
        if lease.released:
            return
        lease.released = True
        now = time.monotonic()
        for slot in lease.slots:
            if self._held.get(slot) is lease:
                del self._held[slot]
                self._released_at[slot] = now
        self._dispatch()

    def release_all(self) -> None:
        """Shutdown: end every lease; waiters get nothing (their requests pass through)."""
        for lease in list(self._held.values()):
            lease.released = True
        self._held.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.cancel()

    def status(self) -> dict[str, object]:
        now = time.monotonic()
        return {
            "held": {
                str(slot): {"label": lease.label, "held_s": round(time.time() - lease.since, 3)}
                for slot, lease in sorted(self._held.items())
            },
            "waiting": len(self._waiters),
            "longest_wait_s": round(max((now - w.since for w in self._waiters), default=0.0), 3),
            "granted": self.granted,
            "timeouts": self.timeouts,
        }

    def _dispatch(self) -> None:
        free = set(self.free())
        for waiter in list(self._waiters):
            if not free:
                return
            if waiter.future.done():
                self._waiters.remove(waiter)
                continue
            if waiter.choose is None:
                if len(free) < len(self.slots):
                    return  # an exclusive waiter at the head: later ones wait behind it
                slots = frozenset(self.slots)
                slot = self.slots[0]
            else:
                chosen = waiter.choose(frozenset(free))
                if chosen is None or chosen not in free:
                    continue
                slot, slots = chosen, frozenset({chosen})
            lease = Lease(next(self._ids), slot, slots, waiter.label, time.time())
            lease.waited_s = time.monotonic() - waiter.since
            for s in slots:
                self._held[s] = lease
            free -= slots
            self.granted += 1
            self._waiters.remove(waiter)
            waiter.future.set_result(lease)
