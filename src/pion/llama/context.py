"""The state one :class:`~pion.llama.warmer.PrefixWarmer` shares with its restore and
cold-build steps (:mod:`pion.llama.restore`, :mod:`pion.llama.coldbuild`).

Owns :class:`WarmerContext` (configuration, the llama-server client, the log, the two tiers
of slot files, and the mutable state: what each slot holds, which (build, model) pairs are
suspected of not restoring, what cache layout the running server writes) and
:class:`SlotState`. Mutations of one slot's state happen under that slot's lease
(:mod:`pion.llama.lease`), held by the request that warms it; the shared sets and counters
are guarded by :attr:`WarmerContext.guard` (a thread lock: file work runs in worker
threads, never held across an ``await``).

The running server's cache layout (its K/V types and streams, :mod:`pion.llama.slotfile`)
is not in ``/props``: it is read from a slot file the server wrote, either one the warmer
saved anyway or, when none is known yet and a restore needs the check, a probe: a
one-token prompt in the slot about to be restored into, saved and read back
(:meth:`WarmerContext.server_layout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pion.llama.background import Background
from pion.llama.client import AsyncLlamaClient, LlamaServerError
from pion.llama.compat import ServerFacts
from pion.llama.config import WarmerConfig
from pion.llama.eventlog import EventLog
from pion.llama.identity import ServerProcess
from pion.llama.index import SlotIndex
from pion.llama.prefix import WarmRequest
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import SlotLayout, read_layout, read_tokens
from pion.llama.store import SlotStore, StoreError

__all__ = ["PROBE_FILE", "Pending", "SlotState", "Target", "WarmerContext"]

_logger = logging.getLogger("pion.llama")

# The probe's slot file; not a pi-prefix-*.bin name, so the index never lists it.
PROBE_FILE = "pion-layout-probe-slot{slot}.bin"
_PROBE_PROMPT = "probe"


@dataclass(frozen=True)
class Target:
    """One ensure call: the prefix, the slot it goes to, its fingerprint, the server, and
    when the call started (outcomes report the time spent)."""

    request: WarmRequest
    slot: int
    fingerprint: str
    info: ServerInfo
    t0: float


@dataclass
class Pending:
    """A restore the real request has yet to verify (fast path)."""

    file: str
    own_file: bool
    restore_key: str
    n_restored: int
    restore_ms: float


@dataclass
class SlotState:
    """What one slot was last seen to hold."""

    fingerprint: str
    tokens: int  # the prefix's tokens
    source: str  # hit, restore, warm-up
    since: float
    label: str = ""
    prefill_ms: float = 0.0  # the prefix's measured cold prefill
    saved: bool = False  # a file of this prefix is on the local disk
    file: str | None = None
    model: str = ""  # for the index entry of a save on eviction
    harness: str = ""
    pending: Pending | None = None
    # Token mode: the prefix's own tokens. A shorter prefix these start with is already
    # in the slot (a learned boundary moved back): a hit, not a rebuild.
    prompt: tuple[int, ...] | None = None
    # Whether ``prompt`` is the prefix exactly (token mode), or a text-mode warm-up's
    # rendering (the real requests share it up to the gate ratio, not its empty user turn).
    prompt_exact: bool = True
    # The warmer's count of unpinned requests when the slot was last known to hold this
    # (see PrefixWarmer._trusted): equal, and no other request can have run in the slot.
    epoch: int = 0
    # When (``time.monotonic()``) llama-server or a real request last confirmed the slot
    # holds it: within ``slot_trust`` of it, a proxied hit asks no ``GET /slots``.
    checked: float = field(default_factory=time.monotonic)
    # The llama-server process that confirmed it then (None: not known): while it still
    # serves and no unpinned request ran, a proxied hit asks no ``GET /slots``.
    server: ServerProcess | None = None
    # A prefix found in the slot with no file of its own yet: saved once a real request
    # has confirmed the slot serves it (in the background, see PrefixWarmer.observe).
    save_later: bool = False

    def taken_over(self, fingerprint: str, request: WarmRequest, *, save: bool) -> SlotState:
        """The state of the slot once the shorter prefix ``request`` (which this one starts
        with) takes it over as it is: its cold prefill is scaled to its share."""
        tokens = len(request.tokens or ())
        scale = min(1.0, tokens / self.tokens) if self.tokens > 0 else 1.0
        return SlotState(
            fingerprint,
            tokens,
            "hit",
            time.time(),
            label=request.label(),
            prefill_ms=self.prefill_ms * scale,
            model=request.model or self.model,
            harness=self.harness or request.harness,
            prompt=request.tokens,
            save_later=save,
        )

    def holds_start_of(self, tokens: tuple[int, ...] | None) -> bool:
        """Whether this slot's prefix begins with ``tokens`` (token mode only)."""
        held = self.prompt
        return (
            held is not None
            and self.prompt_exact
            and tokens is not None
            and 0 < len(tokens) <= len(held)
            and held[: len(tokens)] == tokens
        )


@dataclass
class WarmerContext:
    """Everything the warmer's steps share."""

    config: WarmerConfig
    client: AsyncLlamaClient
    log: EventLog
    index: SlotIndex | None
    store: SlotStore | None
    background: Background | None
    guard: threading.Lock = field(default_factory=threading.Lock)
    slots: dict[int, SlotState] = field(default_factory=dict)
    # (build, model) pairs whose own file failed verification: the next cold build checks
    # a round trip (hybrid detection).
    suspect: set[str] = field(default_factory=set)
    said_no_restore: set[str] = field(default_factory=set)
    # The model kind (pion.llama.modelkind) per (build, model), detected once.
    model_kinds: dict[str, str] = field(default_factory=dict)
    # Fingerprints whose stored copy failed to verify here: a rebuild replaces it.
    refused_store: set[str] = field(default_factory=set)
    layouts: dict[ServerInfo, SlotLayout] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    # Failures swallowed to stay fail-open, by where they happened.
    failures: Counter[str] = field(default_factory=Counter)
    # Unexpected exceptions (a bug, not llama-server or the disk failing), by type.
    errors: Counter[str] = field(default_factory=Counter)
    # The tokens each slot file holds, by (path, size, mtime): read once per file.
    token_cache: dict[tuple[str, int, int], tuple[int, ...] | None] = field(default_factory=dict)

    def file_tokens(self, path: Path) -> tuple[int, ...] | None:
        """The prompt tokens of a slot file (cached), None when unreadable."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.guard:
            if key in self.token_cache:
                return self.token_cache[key]
        tokens = read_tokens(path)
        with self.guard:
            if len(self.token_cache) > 256:
                self.token_cache.clear()
            self.token_cache[key] = tokens
        return tokens

    async def tokens_of(self, path: Path) -> tuple[int, ...] | None:
        """:meth:`file_tokens` off the event loop (it reads the slot dir)."""
        return await asyncio.to_thread(self.file_tokens, path)

    def failure(self, where: str, exc: BaseException) -> None:
        """A failure swallowed to stay fail-open, counted (``failures`` in
        ``/pion/status``). An expected one (llama-server down or refusing, the store or
        the disk failing) is logged at debug level; any other type is a bug: logged as an
        error with its traceback and counted by type (``errors``)."""
        expected = isinstance(exc, LlamaServerError | StoreError | OSError)
        if expected:
            _logger.debug("%s failed (fail-open): %r", where, exc, exc_info=exc)
        else:
            _logger.error("%s failed unexpectedly (fail-open): %r", where, exc, exc_info=exc)
            self.log(f"ERROR in {where}: {type(exc).__name__}: {exc} (fail-open; see the logger)")
        with self.guard:
            self.failures[where] += 1
            if not expected:
                self.errors[type(exc).__name__] += 1

    def count(self, name: str, n: int = 1) -> None:
        with self.guard:
            self.counts[name] += n

    def learn_layout(self, info: ServerInfo, layout: SlotLayout | None) -> None:
        """Record the layout of a file this server just wrote."""
        if layout is not None:
            with self.guard:
                self.layouts[info] = layout

    async def server_layout(self, info: ServerInfo, slot: int, *, probe: bool) -> SlotLayout | None:
        """The running server's cache layout: known, or (``probe``) learned by saving a
        one-token prompt from ``slot``. That erases the slot: call it only right before
        the slot is restored into or rebuilt. None when it cannot be learned."""
        with self.guard:
            known = self.layouts.get(info)
        if known is not None or not probe or self.index is None:
            return known
        name = PROBE_FILE.format(slot=slot)
        path = self.index.slot_dir / name
        try:
            await self.client.slot_erase(slot)
            await self.client.complete(
                {"prompt": _PROBE_PROMPT, "n_predict": 0, "id_slot": slot, "cache_prompt": True}
            )
            await self.client.slot_save(slot, name)
            layout = await asyncio.to_thread(read_layout, path)
        except LlamaServerError as exc:
            self.failure("layout probe", exc)
            self.log(f"cache layout probe failed ({exc.short()}): cache type not compared")
            return None
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
            try:
                await self.client.slot_erase(slot)
            except Exception as exc:
                # The slot is about to be restored into or rebuilt anyway.
                self.failure("layout probe erase", exc)
        self.log(
            f"cache layout of this llama-server: {layout.cache_types()}, "
            f"{layout.n_stream} stream(s), {layout.n_layer} layers"
            if layout
            else "cache layout of this llama-server: not a plain K/V cache (not compared)"
        )
        self.learn_layout(info, layout)
        return layout

    def facts(self, info: ServerInfo, layout: SlotLayout | None) -> ServerFacts:
        return ServerFacts(info.build, info.model_identity(), info.n_ctx, layout)
