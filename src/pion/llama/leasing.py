"""Which slot a request takes and the lease it holds there: the routing half of the
warmer.

Owns :class:`Ticket` (a warmed request on its way, with its lease) and
:class:`WarmerLeasing`, the base of :class:`~pion.llama.warmer.PrefixWarmer` between it
and :class:`~pion.llama.steps.WarmerSteps`: the slot table and leases of the server's
slots, the choice of a slot for a prefix (the slot that has it, one whose prefix starts
with it, a free one, the least recently used), the lease taken in arrival order and
bounded by ``lease_wait``, a slot busy with an unpinned request skipped, the warm-up
under the lease (fail-open: any error releases it), and each outcome recorded for the
status. The state is :class:`~pion.llama.warmer.PrefixWarmer`'s; everything runs on its
event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from pion.llama.client import LlamaServerError
from pion.llama.lease import Lease, SlotLeases
from pion.llama.outcome import WARM_KINDS, Outcome
from pion.llama.prefix import WarmRequest
from pion.llama.serverinfo import ServerInfo
from pion.llama.slots import SlotTable
from pion.llama.steps import SLOTS_SNAPSHOT, WarmerSteps
from pion.llama.tokencache import LazyConversation

__all__ = ["Ticket", "WarmerLeasing"]


@dataclass
class Ticket:
    """A warmed request on its way: the outcome, and the lease it holds until
    :meth:`PrefixWarmer.finish <pion.llama.warmer.PrefixWarmer.finish>` (None: nothing
    held, the request passes through as sent).
    ``pin``: the slot to pin the request to with ``id_slot`` (None: leave it unpinned).
    ``conversation``: the request's own tokens (token mode), for a checkpoint after it."""

    outcome: Outcome
    lease: Lease | None = None
    pin: int | None = None
    # The whole request's tokens (token mode): a checkpoint of the conversation after
    # its answer is checked against them (pion.llama.checkpoint). ``lazy``: not asked for
    # yet (the prefix came from the token cache).
    conversation: tuple[int, ...] | None = None
    lazy: LazyConversation | None = None


class WarmerLeasing(WarmerSteps):
    """Routing, leases and recorded outcomes; the state is :class:`PrefixWarmer`'s."""

    _table: SlotTable | None
    leases: SlotLeases | None
    unpinned_inflight: int
    _outcomes: deque[Outcome]
    _counts: Counter[str]
    # Post-answer work (observation, saves) and receipts: tasks no answer waits for.
    _tasks: set[asyncio.Task[None]]

    def spawn(self, coro: Any, what: str) -> None:
        """Run ``coro`` as a task no request waits for; failures are counted, not raised."""

        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.ctx.failure(what, exc)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _failed(self, exc: Exception, slot: int, t0: float) -> Outcome:
        text = exc.short() if isinstance(exc, LlamaServerError) else repr(exc)
        ms = (time.monotonic() - t0) * 1000.0
        return Outcome("disabled", slot=slot, detail=text, ms=ms, at=time.time())

    def _record(self, outcome: Outcome) -> Outcome:
        self.log(outcome.summary())
        self.log(f"normal request proceeding (source={outcome.source})")
        with self.ctx.guard:
            self._outcomes.append(outcome)
            self._counts[outcome.kind] += 1
        return outcome

    def skipped(self, reason: str) -> Outcome:
        """Record a request without a warmable prefix (the proxy calls this)."""
        outcome = Outcome("skipped", slot=self.config.slot, detail=reason, at=time.time())
        self.log(outcome.summary())
        with self.ctx.guard:
            self._outcomes.append(outcome)
            self._counts["skipped"] += 1
        return outcome

    # -- routing and leases ---------------------------------------------------------------

    def _slot_table(self, info: ServerInfo) -> tuple[SlotTable, SlotLeases]:
        if self._table is None or self.leases is None:
            slots = self._slot_ids(info)
            self._table, self.leases = SlotTable(slots), SlotLeases(slots)
        return self._table, self.leases

    def _slot_ids(self, info: ServerInfo) -> tuple[int, ...]:
        """The slots this warmer uses (``--slots all``: as many as the server has)."""
        cfg = self.config
        slots: tuple[int, ...] = (cfg.slot,)
        if cfg.all_slots:
            slots = tuple(range(max(1, info.total_slots)))
        elif cfg.slots:
            slots = cfg.slots
            if info.total_slots:
                unknown = [s for s in slots if s >= info.total_slots]
                if unknown and len(unknown) < len(slots):
                    self.log(
                        f"slots {unknown} do not exist on this llama-server "
                        f"(-np {info.total_slots}) → not used"
                    )
                    slots = tuple(s for s in slots if s < info.total_slots)
        if cfg.multi_slot:
            self.log(f"one stable prefix per slot: slots {', '.join(map(str, slots))}")
        return slots

    async def _claim(
        self,
        request: WarmRequest,
        slot: int | None,
        t0: float,
        *,
        exclusive: bool,
        pinnable: bool,
    ) -> Ticket:
        """Lease a slot for ``request`` (waiting in order, at most ``lease_wait``), then
        warm it there. Fail-open: any error releases the lease and passes through."""
        try:
            info = await self._server_info(refresh=False)
            fp = self._fingerprint(request, info)
            table, leases = self._slot_table(info)
        except Exception as exc:
            self.ctx.failure("route", exc)
            return Ticket(self._record(self._failed(exc, self.config.slot, t0)))

        def choose(free: frozenset[int]) -> int | None:
            if slot is not None:
                return slot if slot in free else None
            return self._choose(table, fp, request, free)

        label = request.label()
        lease = await leases.acquire(
            None if exclusive else choose, label, wait=self.config.lease_wait
        )
        if lease is None:
            self.ctx.count("lease_timeouts")
            return Ticket(
                self.skipped(
                    f"every slot it could use stayed busy for {self.config.lease_wait:g} s: "
                    "forwarded unwarmed"
                )
            )
        if lease.waited_s > 0.001:
            self.ctx.count("lease_waits")
        snapshot = SLOTS_SNAPSHOT.get()
        if snapshot is not None and not leases.quiet_since(lease.slots, snapshot.started):
            # Another request held the slot after the snapshot was asked for (a burst
            # queued on one slot): it shows the slot as it was before that request.
            SLOTS_SNAPSHOT.set(None)
        try:
            return await self._warm_leased(
                request,
                slot=slot,
                fp=fp,
                table=table,
                leases=leases,
                lease=lease,
                t0=t0,
                pinnable=pinnable,
            )
        except asyncio.CancelledError:
            # The client went away mid-warm-up: llama-server may still be busy in the slot.
            self.ctx.slots.pop(lease.slot, None)
            self.spawn(self._release_when_idle(lease), "release")
            raise

    async def _warm_leased(
        self,
        request: WarmRequest,
        *,
        slot: int | None,
        fp: str,
        table: SlotTable,
        leases: SlotLeases,
        lease: Lease,
        t0: float,
        pinnable: bool,
    ) -> Ticket:
        """Under ``lease``: warm ``request``'s prefix (fail-open)."""
        target = lease.slot
        if lease.exclusive:
            chosen = slot if slot is not None else self._choose(table, fp, request, lease.slots)
            target = chosen if chosen is not None else lease.slot
        try:
            if await self._busy(target):
                leases.release(lease)
                self.ctx.count("busy_slot_skips")
                return Ticket(
                    self.skipped(f"slot {target} is busy with a request the proxy could not pin")
                )
            outcome = await self._ensure_in(request, target, fp, table, t0)
        except Exception as exc:
            # The fail-open boundary: whatever broke, the caller's request proceeds.
            self.ctx.failure("ensure", exc)
            self.ctx.slots.pop(target, None)
            leases.release(lease)
            return Ticket(self._record(self._failed(exc, target, t0)))
        ticket = Ticket(
            self._record(outcome), lease, conversation=request.conversation, lazy=request.lazy
        )
        if outcome.kind in WARM_KINDS and pinnable:
            ticket.pin = outcome.slot
        return ticket

    async def _release_when_idle(self, lease: Lease) -> None:
        try:
            await self._until_idle(lease.slot)
        finally:
            if self.leases is not None:
                self.leases.release(lease)

    def _choose(
        self, table: SlotTable, fp: str, request: WarmRequest, free: frozenset[int]
    ) -> int | None:
        """The slot a request takes among the free ones (None: it waits): the slot of its
        prefix, else a slot whose prefix starts with its own (a learned boundary moved
        back), else a free slot (unclaimed first, then least recently used)."""
        if table.slot_of(fp) is None:
            holder = self._holder(table, request)
            if holder is not None:
                return holder if holder in free else None
        return table.pick(fp, free)

    def _holder(self, table: SlotTable, request: WarmRequest) -> int | None:
        """A slot of ours whose prefix starts with ``request``'s (the longest such)."""
        found: tuple[int, int] | None = None
        for slot in table.slots:
            state = self.ctx.slots.get(slot)
            if state is not None and state.holds_start_of(request.tokens):
                held = len(state.prompt or ())
                if found is None or held > found[1]:
                    found = (slot, held)
        return found[0] if found is not None else None

    async def _busy(self, slot: int) -> bool:
        """Whether llama-server is processing a request in ``slot`` that the proxy did not
        pin there. Pinning a request to a busy slot makes llama-server b11434 load its
        host-memory prompt cache into that slot and spin forever (docs/llama.md): asked
        only while unpinned requests are on their way, the one case it can happen."""
        if self.unpinned_inflight <= 0:
            return False
        entry = await self.client.slot(slot)
        return bool(entry and entry.get("is_processing"))
