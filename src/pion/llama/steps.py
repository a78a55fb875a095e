"""The steps the warmer takes in a leased slot: make it hold a prefix (hit, restore,
cold build), then, once the real request's answer is relayed, observe it.

Owns :class:`WarmerSteps`, the base of :class:`~pion.llama.warmer.PrefixWarmer`: the
state machine of one slot (``_ensure_in``: a hit trusted under the lease or checked with
``GET /slots``, a prefix taken over from a longer one, an eviction, a restore or a cold
build) and what follows an answer (``_observe``: the fast-path verification, the
receipt; ``_after_answer``: the save of a taken-over prefix and a checkpoint of the
conversation; ``_placed``: where an
unpinnable request ran; ``_upstream_failed``). Every method runs under the slot's lease,
on the warmer's event loop. Routing and leases are :mod:`pion.llama.leasing`'s, the
public API :mod:`pion.llama.warmer`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextvars import ContextVar
from typing import Any

from pion.llama.checkpoint import save_checkpoint
from pion.llama.client import AsyncLlamaClient, LlamaServerError
from pion.llama.coldbuild import cold, save_evicted, save_held
from pion.llama.config import WarmerConfig
from pion.llama.context import SlotState, Target, WarmerContext
from pion.llama.eventlog import EventLog
from pion.llama.fingerprint import FingerprintInputs, fingerprint, model_file_identity
from pion.llama.identity import ServerProcess
from pion.llama.identity import find as find_server
from pion.llama.modelkind import ModelKind, detect_model_state
from pion.llama.outcome import WARM_KINDS, Outcome
from pion.llama.partial import restore_partial
from pion.llama.prefix import WarmRequest
from pion.llama.restore import (
    HYBRID_ADVICE,
    NO_SAVING_ADVICE,
    reject,
    restore,
)
from pion.llama.serverinfo import ServerInfo
from pion.llama.slots import SlotTable
from pion.llama.store import prefill_ms_arg
from pion.llama.timings import Timings
from pion.llama.tokencache import LazyConversation

__all__ = ["SLOTS_SNAPSHOT", "SlotsSnapshot", "WarmerSteps"]


@dataclasses.dataclass(frozen=True)
class SlotsSnapshot:
    """The ``GET /slots`` a proxied request asked for beside its rendering: ``started``
    (``time.monotonic()``) tells whether another request held a slot since (then the
    answer shows that slot as it was before, and is not used for it)."""

    started: float
    entries: asyncio.Task[list[dict[str, Any]] | None]  # None when it failed


# Set by PrefixWarmer.claim for the request's own task; dropped once its lease shows the
# slot was leased to another request after the snapshot was asked for.
SLOTS_SNAPSHOT: ContextVar[SlotsSnapshot | None] = ContextVar(
    "pion_llama_slots_snapshot", default=None
)


class WarmerSteps:
    """What one slot goes through; the state is :class:`PrefixWarmer`'s."""

    config: WarmerConfig
    client: AsyncLlamaClient
    log: EventLog
    ctx: WarmerContext
    _info: ServerInfo | None
    _props: asyncio.Task[ServerInfo] | None  # the GET /props in flight
    # The local llama-server process that answered /props last (pion.llama.identity);
    # None: not known, every proxied hit asks GET /slots.
    _server: ServerProcess | None
    unpinned_epoch: int

    async def _server_info(self, refresh: bool) -> ServerInfo:
        """What ``/props`` says (``refresh``: asked again). Callers at the same time share
        one request in flight: a burst of N requests on a fresh proxy asks once, not N
        times (each answered on the loop before anything else)."""
        if not refresh and self._info is not None:
            return self._info
        if self._props is None:
            task = asyncio.get_running_loop().create_task(self._fetch_info())
            self._props = task
            task.add_done_callback(self._props_done)
        return await asyncio.shield(self._props)

    async def _fetch_info(self) -> ServerInfo:
        info = ServerInfo.from_props(await self.client.props())
        if not self.config.check_every_hit:
            server = await asyncio.to_thread(find_server, self.client.base_url)
            self._forget_gone(server)
            self._server = server
        self._info = info
        return info

    def _forget_gone(self, server: ServerProcess | None) -> None:
        """Another llama-server process serves now: the slots the one before confirmed
        held what it held, gone with it (else every later request would ask
        ``GET /slots`` for a slot nobody re-confirms)."""
        old = self._server
        if old is None or server is None or server == old:
            return
        gone = sorted(slot for slot, state in self.ctx.slots.items() if state.server is old)
        for slot in gone:
            self.ctx.slots.pop(slot, None)
        if gone:
            self.log(
                f"llama-server restarted (pid {old.pid} → {server.pid}) → what slots "
                f"{', '.join(map(str, gone))} held is gone"
            )

    def _props_done(self, task: asyncio.Task[ServerInfo]) -> None:
        self._props = None
        if not task.cancelled():
            task.exception()  # retrieved: every waiter got it raised already

    async def server_info(self, *, refresh: bool = False) -> ServerInfo:
        """What ``/props`` says (``refresh``: asked again; shared with callers in flight).
        Raises LlamaServerError when the server does not answer."""
        return await self._server_info(refresh)

    def fingerprint_of(self, request: WarmRequest, info: ServerInfo) -> str:
        """``request``'s fingerprint on a server that ``info`` describes."""
        return self._fingerprint(request, info)

    def _fingerprint(self, request: WarmRequest, info: ServerInfo) -> str:
        inputs = FingerprintInputs.of(
            request,
            model_id=info.model_id,
            model_file=model_file_identity(info.model_path),
            server_id=f"{self.config.server_id}|{info.build}",
            harness=self.config.harness,
        )
        return fingerprint(inputs)

    async def _until_idle(self, slot: int) -> None:
        """Wait (bounded by the upstream timeout) until llama-server is done with
        ``slot``."""
        deadline = time.monotonic() + self.config.upstream_timeout
        delay = 0.02
        while time.monotonic() < deadline:
            entry = await self.client.slot(slot)
            if not entry or not entry.get("is_processing"):
                return
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 2)

    # -- the state machine ----------------------------------------------------------------

    async def _ensure_in(
        self, request: WarmRequest, slot: int, fp: str, table: SlotTable, t0: float
    ) -> Outcome:
        """Under ``slot``'s lease: make it hold ``request``'s prefix."""
        ctx = self.ctx
        state = ctx.slots.get(slot)
        claim = table.holder(slot)
        evicted = claim.fingerprint if claim and claim.fingerprint != fp else None
        if state is not None and state.fingerprint == fp:
            table.pin(slot, fp, request.label())
            if await self._trusted(slot, state, state.tokens, request):
                self.log(f"fingerprint={fp[:16]}…")
                self.log(f"cache=HIT (slot {slot} already warmed for this fingerprint)")
                ms = (time.monotonic() - t0) * 1000.0
                return Outcome("hit", fp, slot, state.tokens, ms=ms, at=time.time())
            self.log(
                f"slot {slot} no longer holds the prefix (server restarted or slot "
                "reused) → rebuilding"
            )
            ctx.slots.pop(slot, None)
            state = None
        elif state is not None and state.holds_start_of(request.tokens):
            table.pin(slot, fp, request.label())
            hit = await self._held_hit(request, slot, fp, state, t0)
            if hit is not None:
                return hit
            ctx.slots.pop(slot, None)
            state = None
        # Off the hit path a /props round trip is cheap next to a warm-up, and it notices a
        # restarted server with another build or model.
        info = await self._server_info(refresh=True)
        lazy = request.lazy
        if lazy is not None and lazy.identity not in (None, info.restore_key()):
            # Its prefix's tokens came from the cache of another build or model.
            self.log("llama-server changed since the prefix was tokenized → forwarded unwarmed")
            return Outcome("skipped", slot=slot, detail="llama-server changed", at=time.time())
        if state is not None:
            await save_evicted(ctx, slot, state, info)
            ctx.slots.pop(slot, None)
        elif evicted is not None:
            ctx.count("evictions")
            self.log(f"EVICT slot {slot}: {evicted[:16]}…, least recently used")
        new_fp = self._fingerprint(request, info)
        table.pin(slot, new_fp, request.label())
        self.log(f"fingerprint={new_fp[:16]}…")
        request = await self._with_conversation(request)
        target = Target(request, slot, new_fp, info, t0)
        outcome = await self._build(target)
        built = ctx.slots.get(slot)
        if built is not None:
            built.epoch, built.checked = self.unpinned_epoch, time.monotonic()
            built.server = self._server
        return outcome

    async def _build(self, target: Target) -> Outcome:
        ctx = self.ctx
        if ctx.index is not None:
            await self._check_model_kind(target.info)
            restored = await restore(ctx, target)
            if restored is not None:
                return restored
            base = await restore_partial(ctx, target)
            if base is not None:
                built = await cold(ctx, target)
                return dataclasses.replace(built, kind="partial", file=base[0], shared=base[1])
        return await cold(ctx, target)

    async def _check_model_kind(self, info: ServerInfo) -> None:
        """Once per (build, model): a recurrent or hybrid model (from its GGUF header,
        :mod:`pion.llama.modelkind`) keeps state this build's slot files do not carry, so
        saving and restoring are turned off for it, said once, instead of a cold rebuild
        after every failed restore. A sliding-window model is only warned about: with
        ``--swa-full`` (which ``/props`` does not show) its restores work, and the
        verification of the first restore decides."""
        key = info.restore_key()
        with self.ctx.guard:
            if key in self.ctx.model_kinds:
                return
        props = {"model_path": info.model_path}
        state = await asyncio.to_thread(detect_model_state, props)
        with self.ctx.guard:
            self.ctx.model_kinds[key] = state.kind.value
        index = self.ctx.index
        if state.kind in (ModelKind.RECURRENT, ModelKind.HYBRID) and index is not None:
            reason = f"{state.kind.value} model ({state.arch}): {state.reason}"
            loaded = await asyncio.to_thread(index.load)
            if key not in loaded.no_restore:  # recorded once, for every later run too
                await asyncio.to_thread(index.set_no_restore, key, reason)
                self.ctx.count("model_kind_no_restore")
                self.log(f"no save or restore for this model kind: {reason}; {HYBRID_ADVICE}")
        elif state.kind is ModelKind.SLIDING_WINDOW:
            self.log(
                f"sliding-window model ({state.arch}): a restore reuses nothing unless "
                "llama-server runs with --swa-full (pion llama serve passes it); the first "
                "restore's verification decides"
            )

    async def _held_hit(
        self, request: WarmRequest, slot: int, fp: str, state: SlotState, t0: float
    ) -> Outcome | None:
        """The slot's prefix starts with ``request``'s: take the slot over for the shorter
        prefix as it is (a hit), or None when the slot no longer holds it."""
        tokens = len(request.tokens or ())
        if not await self._trusted(slot, state, tokens, request):
            self.log(
                f"slot {slot} no longer holds the prefix (server restarted or slot "
                "reused) → rebuilding"
            )
            return None
        taken = state.taken_over(fp, request, save=self.ctx.index is not None)
        taken.epoch, taken.checked, taken.server = state.epoch, state.checked, state.server
        self.ctx.slots[slot] = taken
        self.log(f"fingerprint={fp[:16]}…")
        self.log(
            f"cache=HIT (slot {slot} holds this prefix of {tokens} tok at the start of "
            f"{state.fingerprint[:16]}…'s {len(state.prompt or ())}: taken over as it is)"
        )
        self.ctx.count("held_hits")
        ms = (time.monotonic() - t0) * 1000.0
        return Outcome("hit", fp, slot, tokens, ms=ms, at=time.time())

    async def _trusted(
        self, slot: int, state: SlotState, tokens: int, request: WarmRequest
    ) -> bool:
        """Whether the slot still holds its prefix. The ``GET /slots`` a proxied request
        started beside its rendering (:data:`SLOTS_SNAPSHOT`, so it costs no round trip
        of its own) must show the slot's prompt: a restarted llama-server shows none.
        Without one (a library call, or a proxied hit that asked nothing), a slot under the
        lease with no unpinned request run since it was warmed is trusted, as long as the
        llama-server process that confirmed it still serves (when known); otherwise
        ``GET /slots`` is asked now."""
        snapshot = SLOTS_SNAPSHOT.get()
        entries = await snapshot.entries if snapshot is not None else None
        if entries is not None:
            entry = next((e for e in entries if e.get("id") == slot), None)
            return self._alive(state, entry, tokens)
        if state.epoch == self.unpinned_epoch and (state.server is None or state.server.serves()):
            return True
        self.ctx.count("slot_checks")
        try:
            entry = await self.client.slot(slot)
        except LlamaServerError as exc:
            self.log(f"slot check failed ({exc.short()}) → treating slot {slot} as cold")
            return False
        return self._alive(state, entry, tokens)

    def _alive(self, state: SlotState, entry: dict[str, Any] | None, tokens: int) -> bool:
        n = entry.get("n_prompt_tokens") if entry else None
        alive = isinstance(n, int) and n > 0 and n >= self.config.gate_ratio * tokens
        if alive:
            state.epoch, state.checked = self.unpinned_epoch, time.monotonic()
            state.server = self._server
        return alive

    async def _with_conversation(self, request: WarmRequest) -> WarmRequest:
        """``request`` with its whole tokens, asked for now when its prefix came from the
        token cache: a restore looks for the checkpoint it continues by them. Without
        them (llama-server did not answer) the prefix's own file is restored."""
        if request.conversation is not None or request.lazy is None:
            return request
        if request.tokens is None and (
            self.ctx.index is None or self.config.checkpoint_tokens <= 0
        ):
            return request  # text mode: only a checkpoint would need them
        try:
            tokens = await request.lazy.tokens(self.client)
        except LlamaServerError as exc:
            self.log(f"tokenizing the request failed ({exc.short()}) → no checkpoint restore")
            return request
        return dataclasses.replace(request, conversation=tokens)

    # -- after the answer -----------------------------------------------------------------

    async def _observe(self, outcome: Outcome, timings: Timings | None) -> None:
        if outcome.kind in ("disabled", "skipped") and timings is None:
            return
        if timings is None:
            self.log("observed normal request: no timings in the response")
            return
        self.log(
            f"observed normal request: prompt_n={timings.prompt_n} cache_n={timings.cache_n} "
            f"(reuse {timings.reuse:.0%})"
        )
        if outcome.kind not in WARM_KINDS:
            return
        state = self.ctx.slots.get(outcome.slot)
        if state is None or state.fingerprint != outcome.fingerprint:
            return
        gate = self.config.gate_ratio * state.tokens
        reused = timings.cache_n > 0 and timings.cache_n >= gate
        if state.pending is not None:
            await self._verify_pending(outcome.slot, state, timings, reused)
        elif timings.cache_n == 0:
            # Something else took the slot since (a restart, a client of llama-server's
            # own): do not claim a hit next time.
            self.log(f"slot {outcome.slot} did not serve the prefix → re-warming next time")
            self.ctx.count("slot_lost")
            self.ctx.slots.pop(outcome.slot, None)
            return
        if reused:
            state.checked, state.server = time.monotonic(), self._server
        if reused and outcome.kind in ("hit", "restored"):
            self._receipt(state)

    async def _after_answer(
        self,
        outcome: Outcome,
        timings: Timings | None,
        conversation: tuple[int, ...] | None,
    ) -> None:
        """Still under the lease, the answer delivered and the reuse confirmed by the real
        request: save the prefix a hit took over (it has no file of its own yet), then a
        checkpoint of the request's ``conversation`` when it grew enough
        (:mod:`pion.llama.checkpoint`)."""
        if outcome.kind not in WARM_KINDS or timings is None or self.ctx.index is None:
            return
        state = self.ctx.slots.get(outcome.slot)
        if state is None or state.fingerprint != outcome.fingerprint:
            return
        reused = timings.cache_n > 0 and timings.cache_n >= self.config.gate_ratio * state.tokens
        if reused and state.save_later and not state.saved:
            state.save_later = False
            self.log(
                f"saving slot {outcome.slot}'s prefix {state.fingerprint[:16]}… (after the answer)"
            )
            await save_held(self.ctx, outcome.slot, state, await self._server_info(refresh=True))
        if reused and conversation is not None and self.config.checkpoint_tokens > 0:
            info = await self._server_info(refresh=False)
            await save_checkpoint(self.ctx, outcome.slot, state, conversation, info)

    async def _placed(self, outcome: Outcome) -> bool:
        """An exclusive request (not pinnable) ran where llama-server placed it: find the
        slot (the one that ran the latest task) and forget what another slot held.
        Whether it ran in the warmed slot (False: elsewhere, so that slot does not hold
        its conversation)."""
        if outcome.kind not in WARM_KINDS:
            return True
        entries = await self.client.slots()
        ran = max(entries, key=lambda e: int(e.get("id_task") or -1), default=None)
        where = ran.get("id") if ran is not None else None
        if isinstance(where, int) and where != outcome.slot:
            self.ctx.count("placed_elsewhere")
            self.log(
                f"llama-server ran the request in slot {where}, not the warmed slot "
                f"{outcome.slot} → slot {where}'s prefix re-checked next time"
            )
            self.ctx.slots.pop(where, None)
            return False
        return True

    async def _checkpoint_tokens(
        self, outcome: Outcome, lazy: LazyConversation, timings: Timings | None
    ) -> tuple[int, ...] | None:
        """The whole tokens of a request whose prefix came from the token cache, asked
        for only when a checkpoint may be due: its prompt (``timings``) grew by at least
        ``checkpoint_tokens`` past a prefix whose own file is on disk (which a checkpoint
        is counted from), or no such file is there."""
        if timings is None or self.config.checkpoint_tokens <= 0:
            return None
        if self.ctx.index is None or outcome.kind not in WARM_KINDS:
            return None
        state = self.ctx.slots.get(outcome.slot)
        if state is None or state.fingerprint != outcome.fingerprint:
            return None
        grown = timings.total - state.tokens
        if state.saved and grown < self.config.checkpoint_tokens:
            reused = (
                timings.cache_n > 0 and timings.cache_n >= self.config.gate_ratio * state.tokens
            )
            if reused:  # as save_checkpoint counts it
                self.ctx.count("checkpoints_skipped")
            return None
        try:
            tokens: tuple[int, ...] = await lazy.tokens(self.client)
        except LlamaServerError as exc:
            self.log(f"tokenizing the request failed ({exc.short()}) → no checkpoint")
            return None
        return tokens

    def _upstream_failed(self) -> None:
        """The forwarded request failed (llama-server died, restarted or wedged): no slot
        can be trusted to hold anything, and /props may have changed."""
        self.ctx.count("upstream_failures")
        if self.ctx.slots:
            self.log("the upstream failed mid-request → every slot re-checked next time")
        self.ctx.slots.clear()
        self._info = None
        self._server = None

    async def _verify_pending(
        self, slot: int, state: SlotState, timings: Timings, ok: bool
    ) -> None:
        pending = state.pending
        if pending is None:
            return
        state.pending = None
        if ok:
            self.log(
                f"RESTORE verified by the real request: identical "
                f"{timings.cache_n}/{state.tokens}, divergent cache_n={timings.cache_n}"
            )
            if 0 < state.prefill_ms <= pending.restore_ms:
                self.log(
                    f"RESTORE accepted but saved no time: restoring took "
                    f"{pending.restore_ms:.0f} ms, the cold prefill {state.prefill_ms:.0f} ms"
                )
            return
        self.ctx.slots.pop(slot, None)
        self.log(
            f"RESTORE accepted by llama-server (n_restored={pending.n_restored}) but saved no "
            f"time: the request reused {timings.cache_n} of {state.tokens} prefix tokens; "
            f"{NO_SAVING_ADVICE}?"
        )
        await reject(
            self.ctx,
            slot,
            pending.file,
            key=pending.restore_key,
            own_file=pending.own_file,
            why=f"real request reused {timings.cache_n} of {state.tokens} restored tokens, "
            f"< {self.config.gate_ratio:.0%}; it ran cold",
            erase=False,
        )

    def _receipt(self, state: SlotState) -> None:
        store, background = self.ctx.store, self.ctx.background
        if store is None or background is None:
            return
        fp, tokens, ms = state.fingerprint, state.tokens, state.prefill_ms

        def report() -> None:
            hit = store.report(fp, tokens, ms)
            if hit is None:
                return
            self.log(
                f"RECEIPT KV.PREFIX.LOOKUP llama:{fp[:16]}… TOKENS {tokens} "
                f"PREFILL_MS {prefill_ms_arg(ms)} → "
                + ("HIT" if hit else "MISS (not registered there: registered now)")
            )

        background.submit("receipt", report)
