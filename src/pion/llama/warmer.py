"""The prefix warmer: a llama-server slot holds a request's stable prefix, and the request
owns that slot until its answer is done.

Owns :class:`PrefixWarmer` (the public API, its state); routing, leases and
:class:`~pion.llama.leasing.Ticket` are :mod:`pion.llama.leasing`, the steps in a slot
:mod:`pion.llama.steps`. Asynchronous: everything runs on one event loop (the
proxy's) with one ``httpx.AsyncClient`` per llama-server; file work runs in worker
threads. For one prefix in one slot or, with ``slots``/``all_slots``, one prefix per slot:

0. **Lease** (:mod:`pion.llama.lease`). The request's fingerprint picks its slot among
   the slots no other request holds: the slot that has it, else one whose prefix starts
   with it, else a free one, else the least recently used (whose prefix is *evicted*,
   saved first when persisting and not on disk yet). Waiting is in order and bounded
   (``lease_wait``), then the request passes through unwarmed. The lease covers the
   warm-up, the real request (the proxy pins it with ``id_slot``) and the observation and
   save after its answer (:meth:`PrefixWarmer.finish`).
1. **Hit.** The slot holds the fingerprint: trusted as it is while no unpinned request
   ran since it was confirmed and the local llama-server process that confirmed it still
   serves (:mod:`pion.llama.identity`; or within ``slot_trust`` seconds); otherwise the
   ``GET /slots`` a proxied request asks beside its rendering must still show its prompt.
   A library call's slot is trusted under the lease on the same terms. Also a hit: a slot
   whose prefix starts with the request's (a learned boundary moved back), taken over as
   it is and, with ``persist``, saved once the real request confirmed the reuse.
2. **Restore** (``persist``): from disk, else from the store, after checking size, hash and
   compatibility; verified by the real request (``verify="fast"``: ``cache_n`` reaches 90%
   of the prefix) or by two probes first (``"probe"``) (:mod:`pion.llama.restore`).
3. **Cold warm-up**, then with ``persist`` a checked save, the index and the store
   (:mod:`pion.llama.coldbuild`).

The receipt: a confirmed hit or restore is reported to the store (``KV.PREFIX.LOOKUP
llama:<fingerprint> TOKENS n PREFILL_MS ms``) in the background.

Fail-open: :meth:`PrefixWarmer.claim`, :meth:`~PrefixWarmer.ensure` and
:meth:`~PrefixWarmer.finish` never raise; a failure is a ``disabled`` outcome (counted; an
unexpected exception type is logged as an error with its traceback) and the caller's
request proceeds. Does not own HTTP forwarding (:mod:`pion.llama.proxy`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from typing import Any

from pion.llama.background import Background
from pion.llama.client import AsyncLlamaClient, LlamaServerError
from pion.llama.config import WarmerConfig
from pion.llama.context import WarmerContext
from pion.llama.endpoints import EndpointKind
from pion.llama.eventlog import EventLog
from pion.llama.identity import ServerProcess
from pion.llama.index import SlotIndex
from pion.llama.learn import BoundaryLearner
from pion.llama.lease import SlotLeases
from pion.llama.leasing import Ticket, WarmerLeasing
from pion.llama.outcome import Outcome
from pion.llama.prefix import PrefixSkip, WarmRequest
from pion.llama.prompt import warm_request_for
from pion.llama.restore import (
    HYBRID_ADVICE,
)
from pion.llama.serverinfo import ServerInfo
from pion.llama.slots import SlotTable
from pion.llama.status import FilesView, warmer_status
from pion.llama.steps import SLOTS_SNAPSHOT, SlotsSnapshot
from pion.llama.store import SlotStore, StoreError
from pion.llama.timings import Timings
from pion.llama.tokencache import TokenCache
from pion.llama.watch import DivergenceWatch

__all__ = ["HYBRID_ADVICE", "PrefixWarmer", "Ticket"]


class PrefixWarmer(WarmerLeasing):
    """Keeps stable prefixes warm in llama-server slots, on one asyncio event loop. Never
    raises from :meth:`claim`, :meth:`ensure`, :meth:`ensure_for`, :meth:`finish` or
    :meth:`observe`."""

    def __init__(
        self,
        config: WarmerConfig,
        client: AsyncLlamaClient | None = None,
        log: EventLog | None = None,
    ) -> None:
        self.config = config
        self.client = client or AsyncLlamaClient(
            config.base_url, timeout=config.timeout, api_key=config.api_key
        )
        self.log = log or EventLog(config.log_path)
        index: SlotIndex | None = None
        if config.persist and config.slot_dir is None:
            self.log("persistence needs a slot dir (llama-server's --slot-save-path) → disk off")
        elif config.persist and config.slot_dir is not None:
            index = SlotIndex(config.slot_dir, self.log)
        store, background = self._open_store(index)
        self.ctx = WarmerContext(config, self.client, self.log, index, store, background)
        self._files = FilesView(self.ctx)
        if background is not None:
            background.on_failure = self.ctx.failure
        self._table: SlotTable | None = None
        self.leases: SlotLeases | None = None
        self._info: ServerInfo | None = None
        self._props: asyncio.Task[ServerInfo] | None = None
        self._server: ServerProcess | None = None
        self._snapshot: SlotsSnapshot | None = None
        self._outcomes: deque[Outcome] = deque(maxlen=50)
        self._counts: Counter[str] = Counter()
        # Post-answer work (observation, saves) and receipts: tasks no answer waits for.
        self._tasks: set[asyncio.Task[None]] = set()
        # Generation requests forwarded without a pin right now, and since start: such a
        # request may run in any slot, so a slot's state is trusted without asking
        # llama-server only while none has run since it was warmed (``SlotState.epoch``).
        self.unpinned_inflight = 0
        self.unpinned_epoch = 0
        self.learner = BoundaryLearner()
        self.token_cache = TokenCache()
        self.divergence = DivergenceWatch(self.log, excerpts=config.divergence_excerpts)

    def _open_store(self, index: SlotIndex | None) -> tuple[SlotStore | None, Background | None]:
        store_config = self.config.store_config()
        if store_config is None:
            return None, None
        if index is None:
            self.log("the store shares slot files: it needs --persist and --slot-dir → off")
            return None, None
        try:
            store = SlotStore(store_config, self.log)
        except StoreError as exc:
            self.log(f"store disabled: {exc}")
            return None, None
        return store, Background(self.log)

    @property
    def index(self) -> SlotIndex | None:
        return self.ctx.index

    @property
    def table(self) -> SlotTable | None:
        """Which prefix each slot is routed (None until ``/props`` first answered)."""
        return self._table

    @property
    def store(self) -> SlotStore | None:
        return self.ctx.store

    async def aclose(self) -> None:
        """Finish post-answer work, release every lease, close the store and client."""
        await self.flush(timeout=30.0)
        for task in list(self._tasks):
            task.cancel()
        if self.leases is not None:
            self.leases.release_all()
        if self.ctx.background is not None:
            await asyncio.to_thread(self.ctx.background.close)
        if self.ctx.store is not None:
            await asyncio.to_thread(self.ctx.store.close)
        await self.client.aclose()
        self._files.close()
        await asyncio.to_thread(self.log.flush)

    async def flush(self, timeout: float = 60.0) -> bool:
        """Wait for post-answer work (observations, saves), then store pushes and
        receipts, submitted so far."""
        deadline = time.monotonic() + timeout
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending:
                return False
        background = self.ctx.background
        ok = True
        if background is not None:
            left = max(0.0, deadline - time.monotonic())
            ok = await asyncio.to_thread(background.flush, left)
        await asyncio.to_thread(self.log.flush, max(0.0, deadline - time.monotonic()))
        return ok

    # -- public API -----------------------------------------------------------------------

    async def claim(
        self, kind: EndpointKind, body: Mapping[str, Any], harness: str, *, pinnable: bool
    ) -> Ticket:
        """Find the warmable prefix of a request, lease a slot for it and warm it there.
        The ticket holds the lease until :meth:`finish`: the caller forwards the request
        (pinned to ``ticket.pin``) in between. ``pinnable``: the endpoint honours
        ``id_slot`` (llama-server drops it from ``/v1/messages``: such a request leases
        every slot of a multi-slot warmer, as llama-server places it itself)."""
        t0 = time.monotonic()
        # Beside the rendering, not after it: whether the slots still hold their prompts
        # (a restarted llama-server shows none) costs no round trip of its own.
        token = SLOTS_SNAPSHOT.set(self._snapshot_if_needed())
        try:
            return await self._claim_found(kind, body, harness, t0, pinnable=pinnable)
        finally:
            SLOTS_SNAPSHOT.reset(token)

    def _snapshot_if_needed(self) -> SlotsSnapshot | None:
        """:meth:`_shared_snapshot`, unless every slot we know of is trusted as it is (then
        a hit costs no ``GET /slots``; with no slot known there is no hit to check): no
        unpinned request run since it was confirmed, and either the llama-server process
        that confirmed it still serves (:mod:`pion.llama.identity`: a restart is still
        noticed first) or it was confirmed within ``slot_trust`` seconds."""
        trust = self.config.slot_trust
        server = self._server if self._server is not None and self._server.serves() else None
        now = time.monotonic()
        if all(
            s.epoch == self.unpinned_epoch
            and ((server is not None and s.server is server) or now - s.checked <= trust)
            for s in self.ctx.slots.values()
        ):
            return None
        return self._shared_snapshot()

    def _shared_snapshot(self) -> SlotsSnapshot:
        """The ``GET /slots`` in flight, else a new one: requests that arrive together
        share one (a burst of N asks once); its start time goes with it, so the lease
        check (:meth:`_claim`) judges it by when it was asked, not when it was joined."""
        current = self._snapshot
        if current is None or current.entries.done():
            self.ctx.count("slot_snapshots")
            entries = asyncio.get_running_loop().create_task(self._slots_snapshot())
            current = self._snapshot = SlotsSnapshot(time.monotonic(), entries)
        return current

    async def _slots_snapshot(self) -> list[dict[str, Any]] | None:
        try:
            return await self.client.slots()
        except LlamaServerError:
            return None

    async def _claim_found(
        self,
        kind: EndpointKind,
        body: Mapping[str, Any],
        harness: str,
        t0: float,
        *,
        pinnable: bool,
    ) -> Ticket:
        found = await self.find(kind, body, harness, t0)
        if isinstance(found, Ticket):
            return found
        return await self.claim_found(found, t0, pinnable=pinnable)

    async def find(
        self, kind: EndpointKind, body: Mapping[str, Any], harness: str, t0: float
    ) -> WarmRequest | Ticket:
        """The warmable prefix of a request, rendered and learned by this warmer's server;
        a ticket without a lease when there is none (skipped, or rendering failed)."""

        async def identity() -> str:
            # The token cache's entries hold for one (build, model): known after the first
            # request, asked again only off the hit path.
            return (await self._server_info(refresh=False)).restore_key()

        try:
            found = await warm_request_for(
                kind,
                body,
                self.client,
                self.learner,
                markers=self.config.markers,
                harness=harness,
                seeds=lambda: self._seeds(harness),
                log=self.log,
                watch=self.divergence,
                cache=self.token_cache,
                identity=identity,
            )
        except Exception as exc:
            self.ctx.failure("prefix", exc)
            return Ticket(self._record(self._failed(exc, self.config.slot, t0)))
        if isinstance(found, PrefixSkip):
            return Ticket(self.skipped(found.reason))
        return found

    async def claim_found(
        self, found: WarmRequest, t0: float, *, pinnable: bool, slot: int | None = None
    ) -> Ticket:
        """:meth:`claim` for a prefix already found (:meth:`find`, by this warmer or by
        another of the same (build, model), as a fleet routes it); ``slot``: the slot it
        must take (the fleet's registry says the prefix is there), waiting for it."""
        exclusive = not pinnable and self.config.multi_slot
        # A fleet routes before it claims: the slots are checked as in claim(), here.
        token = SLOTS_SNAPSHOT.set(SLOTS_SNAPSHOT.get() or self._snapshot_if_needed())
        try:
            return await self._claim(found, slot, t0, exclusive=exclusive, pinnable=pinnable)
        finally:
            SLOTS_SNAPSHOT.reset(token)

    async def finish(
        self,
        ticket: Ticket,
        timings: Timings | None,
        *,
        failed: bool = False,
        hung_up: bool = False,
    ) -> None:
        """The real request's answer is relayed (``failed``: the upstream failed;
        ``hung_up``: the client went away first): observe it, save what it confirmed, then
        release the lease. Never raises; always releases."""
        try:
            if failed:
                self._upstream_failed()
            elif hung_up:
                self.ctx.count("hung_up")
                if ticket.lease is not None:
                    # llama-server may still be busy with the abandoned request; the next
                    # request pinned to a busy slot would wedge it.
                    await self._until_idle(ticket.lease.slot)
            else:
                await self._observe(ticket.outcome, timings)
                conversation = ticket.conversation
                exclusive = ticket.lease is not None and ticket.lease.exclusive
                if exclusive and not await self._placed(ticket.outcome):
                    conversation = None  # the warmed slot does not hold it
                elif conversation is None and ticket.lazy is not None:
                    conversation = await self._checkpoint_tokens(
                        ticket.outcome, ticket.lazy, timings
                    )
                await self._after_answer(ticket.outcome, timings, conversation)
        except Exception as exc:
            self.ctx.failure("observe", exc)
            self.log(f"observation failed (fail-open): {exc!r}")
        finally:
            self.release(ticket)

    def release(self, ticket: Ticket) -> None:
        """End the ticket's lease (idempotent)."""
        if ticket.lease is not None and self.leases is not None:
            self.leases.release(ticket.lease)

    async def ensure(self, request: WarmRequest, slot: int | None = None) -> Outcome:
        """Make a slot hold ``request``'s prefix now (``pion llama warm``, a library): the
        lease ends when it is warm. ``slot`` when given, else the routing's choice."""
        ticket = await self._claim(request, slot, time.monotonic(), exclusive=False, pinnable=True)
        self._released_early(ticket)
        return ticket.outcome

    async def ensure_for(
        self, kind: EndpointKind, body: Mapping[str, Any], harness: str
    ) -> Outcome:
        """:meth:`claim` for a request that is not forwarded by this process: the lease
        ends when the prefix is warm."""
        ticket = await self.claim(kind, body, harness, pinnable=True)
        self._released_early(ticket)
        return ticket.outcome

    def _released_early(self, ticket: Ticket) -> None:
        """The lease ends before the caller's own request: that request runs outside any
        lease, like an unpinned one (no slot is trusted unchecked after it)."""
        self.release(ticket)
        if ticket.lease is not None:
            self.unpinned_epoch += 1

    async def observe(self, outcome: Outcome, timings: Timings | None) -> None:
        """A request sent outside a ticket (a library caller): log its reuse, accept or
        reject a pending restore, report the receipt, save what it confirmed."""
        try:
            await self._observe(outcome, timings)
            await self._after_answer(outcome, timings, None)
        except Exception as exc:
            self.ctx.failure("observe", exc)
            self.log(f"observation failed (fail-open): {exc!r}")

    def _seeds(self, harness: str) -> Iterator[tuple[int, ...]]:
        """The tokens of the saved prefixes of ``harness`` (what earlier runs learned).
        Reads the slot dir: the learner calls it off the event loop."""
        index = self.ctx.index
        if index is None:
            return
        owner = self.config.harness if self.config.harness is not None else harness
        for name, entry in sorted(index.load().files.items()):
            # A checkpoint holds a whole conversation: as a seed it would make the learner
            # take that conversation for the stable prefix.
            if entry.harness == owner and not entry.checkpoint:
                tokens = self.ctx.file_tokens(index.slot_dir / name)
                if tokens:
                    yield tokens

    def billing_header_removed(self, text: str) -> None:
        """Log and count a removed Claude Code billing-header block (the proxy removes it)."""
        self.ctx.count("billing_headers_removed")
        shown = text if len(text) <= 120 else text[:117] + "..."
        self.log(f"removed Claude Code's billing-header system block: {shown!r}")

    async def status(self) -> dict[str, Any]:
        """Slots and their prefixes, leases, last outcomes, counters, files, the log tail.
        Never waits on a lease or llama-server; ``index.json`` is read off the loop."""
        return self._status(await self._files.get())

    def status_now(self) -> dict[str, Any]:
        """:meth:`status` from another thread (the proxy's front door), while the loop
        runs: may raise RuntimeError when the loop changed a table as it was read."""
        return self._status(self._files.get_now())

    def _status(self, files: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        with self.ctx.guard:
            outcomes = [o.to_json() for o in self._outcomes]
            counts = dict(self._counts)
        data = warmer_status(self.ctx, self._table, outcomes, counts, files)
        data["leases"] = self.leases.status() if self.leases is not None else None
        data["unpinned_inflight"] = self.unpinned_inflight
        data["divergence"] = self.divergence.to_json()
        server = self._server
        # The local llama-server process whose slots a hit trusts unasked (identity.py).
        data["upstream_process"] = (
            {"pid": server.pid, "serves": server.serves()} if server is not None else None
        )
        return data
