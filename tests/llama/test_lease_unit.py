"""SlotLeases on their own: first come first served, exclusive leases, bounded waits,
release on cancel (one event loop, no server)."""

from __future__ import annotations

import asyncio

import pytest

from pion.llama.lease import SlotLeases


def test_waiters_are_served_in_order_and_exclusive_holds_every_slot() -> None:
    async def run() -> None:
        leases = SlotLeases((0, 1))
        first = await leases.acquire(lambda free: 0 if 0 in free else None, "a", wait=5)
        assert first is not None and first.slot == 0
        # Two waiters for slot 0, then one that takes any slot: the last is not held up.
        want0 = [
            asyncio.create_task(leases.acquire(lambda f: 0 if 0 in f else None, n, wait=5))
            for n in ("b", "c")
        ]
        anyslot = await leases.acquire(lambda f: min(f) if f else None, "d", wait=5)
        assert anyslot is not None and anyslot.slot == 1
        await asyncio.sleep(0)
        assert leases.status()["waiting"] == 2
        leases.release(first)
        b = await want0[0]
        assert b is not None and b.label == "b" and not want0[1].done()
        leases.release(b)
        c = await want0[1]
        assert c is not None and c.label == "c"
        exclusive = asyncio.create_task(leases.acquire(None, "all", wait=5))
        later = asyncio.create_task(leases.acquire(lambda f: 1 if 1 in f else None, "e", wait=5))
        leases.release(anyslot)
        await asyncio.sleep(0)
        assert not later.done()  # behind the exclusive waiter, though slot 1 is free
        leases.release(c)
        held = await exclusive
        assert held is not None and held.slots == frozenset({0, 1})
        leases.release(held)
        leases.release(held)  # a second release does nothing
        e = await later
        assert e is not None and e.slot == 1

    asyncio.run(run())


def test_a_wait_is_bounded_and_a_cancelled_waiter_holds_nothing() -> None:
    async def run() -> None:
        leases = SlotLeases((0,))
        held = await leases.acquire(lambda f: 0 if 0 in f else None, wait=1)
        assert held is not None
        assert await leases.acquire(lambda f: 0 if 0 in f else None, wait=0.01) is None
        waiter = asyncio.create_task(leases.acquire(lambda f: 0 if 0 in f else None, wait=5))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        leases.release(held)
        assert leases.free() == frozenset({0})
        assert leases.status()["timeouts"] == 1 and leases.status()["waiting"] == 0
        again = await leases.acquire(lambda f: 0 if 0 in f else None, wait=1)
        assert again is not None
        leases.release_all()
        assert leases.free() == frozenset({0})

    asyncio.run(run())
