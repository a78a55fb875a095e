"""The prefix warmer: make sure a llama-server slot holds a stable prefix before a request.

Owns the state machine of pi-prefix-cache (docs/llama.md), for one prefix in one slot or,
with ``slots``/``all_slots``, one prefix per slot:

0. **Routing.** The request's prefix fingerprint picks its slot (:mod:`pion.llama.slots`):
   the slot that has it, else a free one, else the least recently used, whose prefix is
   *evicted* (saved first when persisting and not on disk yet).
1. **In-process hit.** This process warmed the fingerprint into the slot and ``GET /slots``
   still shows the slot's ``n_prompt_tokens`` (a restarted server shows none) → proceed.
   Also a hit: a slot whose prefix (token mode) *starts with* the request's prefix, the
   usual case when a learned boundary moves back (the second session of a harness shares
   all but its prompt with the first, whose whole prompt was warmed). The slot is routed
   to, not evicted; it is taken over by the shorter prefix as it is (no restore, no
   warm-up). With ``persist`` the shorter prefix's file, when it has none, is saved from
   the slot in the background once a real request has confirmed the reuse (``observe``);
   a save can only add a file, never change the slot.
2. **Restore** (``persist``): from the local disk, else from the store (``store``), after
   checking size, hash and compatibility; then verify (:mod:`pion.llama.restore`).
   ``verify="fast"`` (default): the real request is the verification; its ``timings`` are
   handed to :meth:`PrefixWarmer.observe`, and ``cache_n`` must reach 90% of the prefix's
   tokens (the identical-prompt gate) and so be > 0 (the divergent probe, since the real
   request diverges after the prefix). If not, that request simply ran cold; the file is
   dropped and the next session cold-builds. ``verify="probe"``: two requests before the
   real one.
3. **Cold warm-up**, then with ``persist`` save, index and share the file
   (:mod:`pion.llama.coldbuild`).

The receipt: when the real request confirms a hit or a restore (its ``cache_n`` reaches
the gate), the warmer reports ``KV.PREFIX.LOOKUP llama:<fingerprint> TOKENS n PREFILL_MS
ms`` to the store in the background, ``ms`` being the cold prefill measured when the
prefix was built.

Fail-open: :meth:`PrefixWarmer.ensure` never raises. Any error is logged and returned as a
``disabled`` outcome; the caller forwards its request anyway. Work on one slot is
serialised by a per-slot lock, so concurrent callers (proxy threads, harness threads) are
safe, and different slots warm in parallel. Does not own HTTP forwarding
(:mod:`pion.llama.proxy`) or the file format of the index (:mod:`pion.llama.index`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from typing import Any

from pion.llama.background import Background
from pion.llama.client import LlamaClient, LlamaServerError
from pion.llama.coldbuild import cold, save_evicted, save_held
from pion.llama.config import WarmerConfig
from pion.llama.context import SlotState, Target, WarmerContext
from pion.llama.endpoints import EndpointKind
from pion.llama.eventlog import EventLog
from pion.llama.fingerprint import FingerprintInputs, fingerprint, model_file_identity
from pion.llama.index import SlotIndex
from pion.llama.learn import BoundaryLearner
from pion.llama.outcome import WARM_KINDS, Outcome
from pion.llama.prefix import PrefixSkip, WarmRequest
from pion.llama.prompt import warm_request_for
from pion.llama.restore import (
    HYBRID_ADVICE,
    NO_SAVING_ADVICE,
    reject,
    restore,
    restore_partial,
)
from pion.llama.serverinfo import ServerInfo
from pion.llama.slots import SlotTable
from pion.llama.status import warmer_status
from pion.llama.store import SlotStore, StoreError, prefill_ms_arg
from pion.llama.timings import Timings

__all__ = ["HYBRID_ADVICE", "PrefixWarmer"]


class PrefixWarmer:
    """Keeps stable prefixes warm in llama-server slots. Thread-safe; never raises from
    :meth:`ensure` or :meth:`observe`."""

    def __init__(
        self,
        config: WarmerConfig,
        client: LlamaClient | None = None,
        log: EventLog | None = None,
    ) -> None:
        self.config = config
        self.client = client or LlamaClient(
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
        if background is not None:
            background.on_failure = self.ctx.failure
        # Saves of prefixes found in a slot (see _save_later): after the request, off its path.
        self._saves: Background | None = None
        if index is not None:
            self._saves = Background(self.log, name="pion-llama-save", word="SAVE")
            self._saves.on_failure = self.ctx.failure
        self._slot_locks: dict[int, threading.Lock] = {}
        self._table: SlotTable | None = None
        self._info: ServerInfo | None = None
        self._outcomes: deque[Outcome] = deque(maxlen=50)
        self._counts: Counter[str] = Counter()
        self.learner = BoundaryLearner()

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
    def store(self) -> SlotStore | None:
        return self.ctx.store

    def close(self) -> None:
        if self._saves is not None:
            self._saves.close()
        if self.ctx.background is not None:
            self.ctx.background.close()
        if self.ctx.store is not None:
            self.ctx.store.close()
        self.client.close()

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait for background work (slot saves, then store pushes and receipts) submitted
        so far."""
        deadline = time.monotonic() + timeout
        ok = True
        for background in (self._saves, self.ctx.background):
            if background is not None:
                ok = background.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def __enter__(self) -> PrefixWarmer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self, slot: int) -> threading.Lock:
        with self.ctx.guard:
            return self._slot_locks.setdefault(slot, threading.Lock())

    # -- public API -----------------------------------------------------------------------

    def ensure(self, request: WarmRequest, slot: int | None = None) -> Outcome:
        """Make a slot hold ``request``'s prefix: ``slot`` when given, else the slot the
        routing picks (the configured ``slot`` without ``slots``). The outcome names it."""
        t0 = time.monotonic()
        try:
            slot, fp, evicted = self._route(request, slot)
        except Exception as exc:
            self.ctx.failure("route", exc)
            return self._record(self._failed(exc, self.config.slot, t0))
        with self._lock(slot):
            try:
                outcome = self._ensure(request, slot, fp, evicted, t0)
            except Exception as exc:
                # The fail-open boundary: whatever broke, the caller's request proceeds.
                self.ctx.failure("ensure", exc)
                outcome = self._failed(exc, slot, t0)
                self.ctx.slots.pop(slot, None)
        return self._record(outcome)

    def ensure_for(self, kind: EndpointKind, body: Mapping[str, Any], harness: str) -> Outcome:
        """Find the warmable prefix of a request to any generation endpoint (a harness
        marker, else the boundary learned from this harness's requests) and ensure it.
        Never raises: a failure is a ``disabled`` outcome, no prefix a ``skipped`` one."""
        t0 = time.monotonic()
        try:
            found = warm_request_for(
                kind,
                body,
                self.client,
                self.learner,
                markers=self.config.markers,
                harness=harness,
                seeds=lambda: self._seeds(harness),
                log=self.log,
            )
        except Exception as exc:
            self.ctx.failure("prefix", exc)
            return self._record(self._failed(exc, self.config.slot, t0))
        if isinstance(found, PrefixSkip):
            return self.skipped(found.reason)
        return self.ensure(found)

    def _seeds(self, harness: str) -> Iterator[tuple[int, ...]]:
        """The tokens of the saved prefixes of ``harness`` (what earlier runs learned)."""
        index = self.ctx.index
        if index is None:
            return
        owner = self.config.harness if self.config.harness is not None else harness
        for name, entry in sorted(index.load().files.items()):
            if entry.harness == owner:
                tokens = self.ctx.file_tokens(index.slot_dir / name)
                if tokens:
                    yield tokens

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

    def billing_header_removed(self, text: str) -> None:
        """Log and count a removed Claude Code billing-header block (the proxy removes it)."""
        self.ctx.count("billing_headers_removed")
        shown = text if len(text) <= 120 else text[:117] + "..."
        self.log(f"removed Claude Code's billing-header system block: {shown!r}")

    def observe(self, outcome: Outcome, timings: Timings | None) -> None:
        """Log the real request's reuse; accept or reject a pending restore; report a
        confirmed hit or restore to the receipt."""
        try:
            self._observe(outcome, timings)
        except Exception as exc:
            self.ctx.failure("observe", exc)
            self.log(f"observation failed (fail-open): {exc!r}")

    def status(self) -> dict[str, Any]:
        """Slots and their prefixes, last outcomes, counters, files, store, log tail."""
        with self.ctx.guard:
            outcomes = [o.to_json() for o in self._outcomes]
            counts = dict(self._counts)
        return warmer_status(self.ctx, self._table, outcomes, counts)

    # -- routing --------------------------------------------------------------------------

    def _server_info(self, refresh: bool) -> ServerInfo:
        if refresh or self._info is None:
            self._info = ServerInfo.from_props(self.client.props())
        return self._info

    def _fingerprint(self, request: WarmRequest, info: ServerInfo) -> str:
        inputs = FingerprintInputs.of(
            request,
            model_id=info.model_id,
            model_file=model_file_identity(info.model_path),
            server_id=f"{self.config.server_id}|{info.build}",
            harness=self.config.harness,
        )
        return fingerprint(inputs)

    def _slot_table(self, info: ServerInfo) -> SlotTable:
        with self.ctx.guard:
            if self._table is None:
                self._table = SlotTable(self._slot_ids(info))
            return self._table

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

    def _route(self, request: WarmRequest, slot: int | None) -> tuple[int, str, str | None]:
        """(slot, fingerprint, evicted fingerprint) for this request."""
        info = self._server_info(refresh=False)
        fp = self._fingerprint(request, info)
        table = self._slot_table(info)
        if slot is not None:
            return slot, fp, table.pin(slot, fp, request.label())
        if table.slot_of(fp) is None:
            holder = self._holder(table, request)
            if holder is not None:
                # The slot already holds this prefix at its start: route there, evict nothing.
                table.pin(holder, fp, request.label())
                return holder, fp, None
        slot, evicted = table.claim(fp, request.label())
        return slot, fp, evicted

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

    # -- the state machine ----------------------------------------------------------------

    def _ensure(
        self, request: WarmRequest, slot: int, fp: str, evicted: str | None, t0: float
    ) -> Outcome:
        ctx = self.ctx
        state = ctx.slots.get(slot)
        if state is not None and state.fingerprint == fp:
            if self._slot_alive(slot, state.tokens):
                self.log(f"fingerprint={fp[:16]}…")
                self.log(f"cache=HIT (slot {slot} already warmed for this fingerprint)")
                ms = (time.monotonic() - t0) * 1000.0
                return Outcome("hit", fp, slot, state.tokens, ms=ms, at=time.time())
            self.log(
                f"slot {slot} no longer holds the prefix (server restarted or slot "
                "reused) → rebuilding"
            )
            ctx.slots.pop(slot, None)
        elif state is not None and state.holds_start_of(request.tokens):
            hit = self._held_hit(request, slot, fp, state, t0)
            if hit is not None:
                return hit
            ctx.slots.pop(slot, None)
            state = None
        # Off the hit path a /props round trip is cheap next to a warm-up, and it notices a
        # restarted server with another build or model.
        info = self._server_info(refresh=True)
        if state is not None and state.fingerprint != fp:
            save_evicted(ctx, slot, state, info)
            ctx.slots.pop(slot, None)
        elif evicted is not None:
            self.log(f"EVICT slot {slot}: {evicted[:16]}…, least recently used")
        new_fp = self._fingerprint(request, info)
        if new_fp != fp and self._table is not None:
            self._table.pin(slot, new_fp, request.label())
        self.log(f"fingerprint={new_fp[:16]}…")
        target = Target(request, slot, new_fp, info, t0)
        if ctx.index is not None:
            restored = restore(ctx, target)
            if restored is not None:
                return restored
            base = restore_partial(ctx, target)
            if base is not None:
                built = cold(ctx, target)
                return dataclasses.replace(built, kind="partial", file=base[0], shared=base[1])
        return cold(ctx, target)

    def _held_hit(
        self, request: WarmRequest, slot: int, fp: str, state: SlotState, t0: float
    ) -> Outcome | None:
        """The slot's prefix starts with ``request``'s: take the slot over for the shorter
        prefix as it is (a hit), or None when the slot no longer holds it."""
        tokens = len(request.tokens or ())
        if not self._slot_alive(slot, tokens):
            self.log(
                f"slot {slot} no longer holds the prefix (server restarted or slot "
                "reused) → rebuilding"
            )
            return None
        self.ctx.slots[slot] = state.taken_over(fp, request, save=self.ctx.index is not None)
        self.log(f"fingerprint={fp[:16]}…")
        self.log(
            f"cache=HIT (slot {slot} holds this prefix of {tokens} tok at the start of "
            f"{state.fingerprint[:16]}…'s {len(state.prompt or ())}: taken over as it is)"
        )
        self.ctx.count("held_hits")
        ms = (time.monotonic() - t0) * 1000.0
        return Outcome("hit", fp, slot, tokens, ms=ms, at=time.time())

    def _slot_alive(self, slot: int, tokens: int) -> bool:
        try:
            entry = self.client.slot(slot)
        except LlamaServerError as exc:
            self.log(f"slot check failed ({exc.short()}) → treating slot {slot} as cold")
            return False
        n = entry.get("n_prompt_tokens") if entry else None
        return isinstance(n, int) and n > 0 and n >= self.config.gate_ratio * tokens

    def _observe(self, outcome: Outcome, timings: Timings | None) -> None:
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
        with self._lock(outcome.slot):
            state = self.ctx.slots.get(outcome.slot)
            if state is None or state.fingerprint != outcome.fingerprint:
                return
            gate = self.config.gate_ratio * state.tokens
            reused = timings.cache_n > 0 and timings.cache_n >= gate
            if state.pending is not None:
                self._verify_pending(outcome.slot, state, timings, reused)
            elif timings.cache_n == 0:
                # Something else took the slot since (another client, a restart): do not
                # claim a hit next time.
                self.log(f"slot {outcome.slot} did not serve the prefix → re-warming next time")
                self.ctx.slots.pop(outcome.slot, None)
                return
            if reused and outcome.kind in ("hit", "restored"):
                self._receipt(state)
            if reused and state.save_later:
                state.save_later = False
                self._save_later(outcome.slot, state.fingerprint)

    def _verify_pending(self, slot: int, state: SlotState, timings: Timings, ok: bool) -> None:
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
        reject(
            self.ctx,
            slot,
            pending.file,
            key=pending.restore_key,
            own_file=pending.own_file,
            why=f"real request reused {timings.cache_n} of {state.tokens} restored tokens, "
            f"< {self.config.gate_ratio:.0%}; it ran cold",
            erase=False,
        )

    def _save_later(self, slot: int, fp: str) -> None:
        """Save the prefix taken over in ``slot`` (see :meth:`_held_hit`) in the
        background: the request that confirmed it has been answered, so the slot holds the
        prefix and that request. Under the slot's lock, only while the slot still serves
        ``fp``; a save that missed (a restart since, a failure) leaves the prefix to the
        next chance: an eviction saves it, a restart restores it in part from the file it
        started in."""
        saves = self._saves
        if saves is None:
            return

        def job() -> None:
            with self._lock(slot):
                state = self.ctx.slots.get(slot)
                if state is None or state.fingerprint != fp or state.saved:
                    return
                save_held(self.ctx, slot, state, self._server_info(refresh=True))

        if saves.submit(f"save of slot {slot}", job):
            self.log(f"save of slot {slot}'s prefix {fp[:16]}… queued (background)")

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
