"""One llama-server of a fleet (:mod:`pion.llama.fleet`): what the fleet knows about it,
how :func:`pion.llama.route.route` sees it, and giving up on it when it goes down.

Owns :class:`Upstream` (its warmer, health, load and routing counts; its view for a
prefix: how much of it a slot holds, whether its file is on the slot dir), :func:`fleet_key`
(the servers a prefix can move between) and :func:`unless_down` (what waits on a server
stops waiting when it is taken out). Runs on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pion.llama.fingerprint import file_name, model_file_identity
from pion.llama.prefix import WarmRequest
from pion.llama.route import ServerView
from pion.llama.serverinfo import ServerInfo
from pion.llama.warmer import PrefixWarmer

__all__ = ["Upstream", "fleet_key", "unless_down"]

T = TypeVar("T")


def fleet_key(info: ServerInfo) -> str:
    """The servers a prefix can move between: the same build and the same model file
    (alias, size and sampled hash, as the fingerprint takes them)."""
    ident = model_file_identity(info.model_path)
    file_part = f"{ident.size}:{ident.sample_sha256[:16]}" if ident else "?"
    return f"{info.build}|{info.model_id}|{file_part}"


@dataclass
class Upstream:
    """One llama-server of the fleet and what the fleet knows about it."""

    url: str
    order: int
    warmer: PrefixWarmer
    healthy: bool = True
    since: float = field(default_factory=time.time)  # when ``healthy`` last changed
    key: str | None = None  # fleet_key, once /props answered
    info: ServerInfo | None = None
    last_error: str | None = None
    downs: int = 0
    routed: Counter[str] = field(default_factory=Counter)
    tokens_reused: int = 0
    # Set when the server is taken out: a warm-up waiting on it gives up and the request
    # is routed again. A new event once it is back (waiters on the old one still wake).
    went_down: asyncio.Event = field(default_factory=asyncio.Event)

    def load(self) -> ServerView:
        """This server's load, as :func:`route` sees it (no prefix)."""
        leases, table = self.warmer.leases, self.warmer.table
        busy, queued = leases.load() if leases is not None else (0, 0)
        slots = len(leases.slots) if leases is not None else 1
        queued += self.warmer.unpinned_inflight
        claimed = len(table.lru_order()) if table is not None else 0
        return ServerView(self.url, self.order, slots, busy=busy, queued=queued, claimed=claimed)

    def view(self, fp: str, request: WarmRequest, files: set[str], last: bool) -> ServerView:
        """This server as :func:`route` sees it for a request with fingerprint ``fp``."""
        held, busy = 0, True
        leases = self.warmer.leases
        for slot, state in list(self.warmer.ctx.slots.items()):
            tokens = 0
            if state.fingerprint == fp:
                tokens = state.tokens
            elif state.holds_start_of(request.tokens):
                tokens = len(request.tokens or ())
            if tokens:
                held = max(held, tokens)
                busy = busy and leases is not None and leases.holder(slot) is not None
        return dataclasses.replace(
            self.load(),
            held_tokens=held,
            held_busy=held > 0 and busy,
            has_file=file_name(fp) in files,
            last_placed=last,
        )

    def status(self, warmer: dict[str, Any]) -> dict[str, Any]:
        """This server in ``/pion/status``'s fleet (``warmer``: its warmer's status)."""
        leases = self.warmer.leases
        busy, queued = leases.load() if leases is not None else (0, 0)
        return {
            "url": self.url,
            "healthy": self.healthy,
            "since": self.since,
            "last_error": self.last_error,
            "downs": self.downs,
            "model": self.info.model_id if self.info else None,
            "build": self.info.build if self.info else None,
            "key": self.key,
            "busy": busy,
            "queued": queued,
            "unpinned_inflight": self.warmer.unpinned_inflight,
            "slots": warmer["slots"],
            "counts": warmer["counts"],
            "routed": dict(self.routed),
            "tokens_reused": self.tokens_reused,
        }


async def unless_down(
    up: Upstream, coro: Coroutine[Any, Any, T], abandon: Callable[[T], Awaitable[None]]
) -> T | None:
    """``coro``'s result, or None when ``up`` is taken out first (``coro`` is then
    cancelled; a result it produced all the same goes to ``abandon``)."""
    down = up.went_down
    if down.is_set():
        coro.close()
        return None
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(down.wait())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        raise
    finally:
        watch.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.wait({work})
    if not work.cancelled() and work.exception() is None:
        await abandon(work.result())  # it finished as it was cancelled
    return None
