"""Several llama-servers behind one proxy: the servers, their health and load, and where
each request goes.

Owns :class:`Fleet`; each server is an :class:`~pion.llama.upstream.Upstream`. Each
``--upstream`` gets its own :class:`~pion.llama.warmer.PrefixWarmer` (its slots, leases,
slot dir, client); the fleet picks one per request (:func:`pion.llama.route.route`, over
a snapshot taken here) and hands it the prefix it already found. One upstream is today's
proxy exactly: no probes, every request to it, the warmer's own
:meth:`~PrefixWarmer.claim`.

- **Prefixes by (build, model).** Servers that report the same build and model file
  (``/props``: :func:`~pion.llama.upstream.fleet_key`) give a request the same
  fingerprint, so it is rendered and learned once per such group, by its first server,
  with one boundary learner shared by the group; a prefix is only ever routed among the
  servers of the group it was rendered for. A request whose ``model`` names some
  servers' model alias goes to those.
- **Affinity** is learned, not a header: the server a prefix was last placed on is
  remembered (bounded, :data:`MAX_PLACED`), and a later request with that prefix, a
  session's next turn, finds it there (a hit, else a restore from its slot dir first).
- **Health.** Every :data:`PROBE_INTERVAL` s each server is asked ``/health`` and
  ``/props`` (:data:`PROBE_TIMEOUT` s each); one that fails is out until it answers
  again. A warm-up that failed on a server that then fails ``/health`` takes it out at
  once and the request is routed again (its session continues elsewhere: a restore from
  the store where the prefix was pushed, else cold). What waits on a server when it is
  taken out stops waiting (:func:`~pion.llama.upstream.unless_down`): a warm-up there is
  given up and routed again, a forwarded request awaiting its answer's head gets a 502
  (the proxy's). A server back in may have restarted with an empty cache: none of its
  slots is trusted without ``GET /slots`` (the warmer's unpinned epoch moves), so its
  prefixes come back lazily, as requests need them.
- **Several proxies** (with a store): where a warm-up left each prefix is published to
  the store's registry (:mod:`pion.llama.registry`), in the background; a prefix none of
  this proxy's slots holds is looked up there, and the server and slot it names count as
  holding it, so every proxy sends it to the same slot.

Runs on the proxy's event loop; nothing here blocks it (slot-dir reads and store
look-ups go to worker threads). The forwarding itself is :mod:`pion.llama.proxy`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pion.llama.client import LlamaServerError
from pion.llama.config import WarmerConfig
from pion.llama.endpoints import EndpointKind
from pion.llama.eventlog import EventLog
from pion.llama.learn import BoundaryLearner
from pion.llama.prefix import WarmRequest
from pion.llama.registry import Place, PrefixRegistry
from pion.llama.route import Reason, Route, ServerView, route
from pion.llama.serverinfo import ServerInfo
from pion.llama.store import StoreError
from pion.llama.upstream import Upstream, fleet_key, unless_down
from pion.llama.warmer import PrefixWarmer, Ticket

__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_PLACED",
    "PROBE_INTERVAL",
    "PROBE_TIMEOUT",
    "Fleet",
]

T = TypeVar("T")

# Seconds between health probes, and for each probe: a dead server is out within about
# PROBE_INTERVAL + PROBE_TIMEOUT (the issue asks for "within seconds").
PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 2.0
# Connecting to a llama-server of a fleet: a host that is gone must not hold a request
# for the proxy's 10 s (a refused connection fails at once anyway).
CONNECT_TIMEOUT = 3.0
# Prefixes whose last server is remembered (a fingerprint and a URL each: ~200 bytes).
MAX_PLACED = 65536
_RANK: dict[Reason, int] = {"hit": 0, "restore": 1, "pull": 2, "cold": 3}
# What a warm-up did, as a routing decision ("restored" from the store: "pull").
_REASONS: dict[str, Reason] = {
    "hit": "hit",
    "restored": "restore",
    "partial": "restore",
    "cold": "cold",
}


@dataclass
class _Choice:
    up: Upstream
    reason: Reason
    request: WarmRequest
    slot: int | None = None  # the registry's slot for the prefix on ``up``


class Fleet:
    """The llama-servers of one proxy (see the module docstring)."""

    def __init__(
        self,
        warmers: Sequence[PrefixWarmer],
        log: EventLog | None = None,
        registry: PrefixRegistry | None = None,
    ) -> None:
        if not warmers:
            raise ValueError("a fleet needs at least one llama-server")
        self.log = log or warmers[0].log
        self.servers = [Upstream(w.config.base_url, i, w) for i, w in enumerate(warmers)]
        if len({u.url for u in self.servers}) != len(self.servers):
            raise ValueError("an --upstream is named twice")
        self.decisions: Counter[str] = Counter()
        self._placed: OrderedDict[str, str] = OrderedDict()
        self._learners: dict[str, BoundaryLearner] = {}
        self._probe: asyncio.Task[None] | None = None
        # Where other proxies placed prefixes (docs/llama.md, "Several proxies").
        self.registry = registry
        self._publishing: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(
        cls, config: WarmerConfig, upstreams: Sequence[str], slot_dirs: Sequence[Path] = ()
    ) -> Fleet:
        """One warmer per upstream URL, each like ``config`` but for its own server;
        ``slot_dirs``: one per upstream (its ``--slot-save-path``). Persisting, several
        servers need a slot dir each: llama-server writes a save under a scratch name per
        slot (``pion-saving-slot0.bin``), which two servers in one dir would share."""
        if slot_dirs and len(slot_dirs) != len(upstreams):
            raise ValueError("give one --slot-dir per --upstream")
        if config.persist and len(upstreams) > 1 and len(set(slot_dirs)) != len(upstreams):
            raise ValueError("several llama-servers that persist need a --slot-dir each")
        log = EventLog(config.log_path)
        warmers = [
            PrefixWarmer(
                dataclasses.replace(
                    config, base_url=url, slot_dir=slot_dirs[i] if slot_dirs else config.slot_dir
                ),
                log=log,
            )
            for i, url in enumerate(upstreams or (config.base_url,))
        ]
        store = config.store_config()
        registry = None
        if store is not None and config.registry_ttl > 0:
            try:
                registry = PrefixRegistry(store, config.registry_ttl, log)
            except ValueError as exc:  # a bad URL: the store says so too
                log(f"registry disabled: {exc}")
        return cls(warmers, log, registry)

    @property
    def single(self) -> bool:
        return len(self.servers) == 1

    def server(self, warmer: PrefixWarmer) -> Upstream:
        """The server ``warmer`` warms."""
        return next(u for u in self.servers if u.warmer is warmer)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the health probes (on the running loop; none for one upstream)."""
        if not self.single and self._probe is None:
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())
        if self.registry is not None:
            self.registry.start()

    async def aclose(self) -> None:
        """Stop the probes; close every warmer (its post-answer work first)."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.cancel()
            await asyncio.wait({probe})
        if self._publishing:
            await asyncio.wait(set(self._publishing))
        if self.registry is not None:
            await self.registry.aclose()
        await asyncio.gather(*(u.warmer.aclose() for u in self.servers))

    async def flush(self, timeout: float = 60.0) -> bool:
        if self._publishing:
            await asyncio.wait(set(self._publishing), timeout=timeout)
        done = await asyncio.gather(*(u.warmer.flush(timeout) for u in self.servers))
        return all(done)

    async def _probe_loop(self) -> None:
        while True:
            try:
                await self.probe()
            except Exception as exc:
                # A bug here must not end the probes: the next round may pass.
                self.servers[0].warmer.ctx.failure("fleet probe", exc)
            await asyncio.sleep(PROBE_INTERVAL)

    async def probe(self) -> None:
        """Ask every server ``/health`` and ``/props`` once; take out or bring back each."""
        await asyncio.gather(*(self._probe_one(u) for u in self.servers))

    async def _probe_one(self, up: Upstream) -> None:
        try:
            await up.warmer.client.health(timeout=PROBE_TIMEOUT)
            props = await up.warmer.client.props(timeout=PROBE_TIMEOUT)
        except LlamaServerError as exc:
            self.down(up, exc.short())
            return
        info = ServerInfo.from_props(props)
        if not up.healthy or (up.info is not None and info != up.info):
            # Back, or replaced: what the warmer knew of its slots may be gone.
            up.warmer.unpinned_epoch += 1
            try:
                info = await up.warmer.server_info(refresh=True)
            except LlamaServerError as exc:
                self.down(up, exc.short())
                return
        self._know(up, info)
        if not up.healthy:
            up.healthy, up.since, up.last_error = True, time.time(), None
            up.went_down = asyncio.Event()
            self.log(f"fleet: {up.url} answers again → back in")

    def down(self, up: Upstream, reason: str) -> None:
        """Take ``up`` out of the routing until a probe finds it answering."""
        up.last_error = reason
        if up.healthy and not self.single:
            up.healthy, up.since = False, time.time()
            up.downs += 1
            up.went_down.set()
            self.log(f"fleet: {up.url} stopped answering ({reason}) → out")

    def _know(self, up: Upstream, info: ServerInfo) -> None:
        up.info = info
        up.key = fleet_key(info)
        # One learner per (build, model): the group's requests are rendered by its first
        # server, and the boundary it learned must survive that server going away.
        up.warmer.learner = self._learners.setdefault(up.key, up.warmer.learner)

    async def _known(self, up: Upstream) -> bool:
        if up.key is not None:
            return True
        try:
            self._know(up, await up.warmer.server_info())
        except LlamaServerError as exc:
            self.down(up, exc.short())
            return False
        return True

    # -- routing --------------------------------------------------------------------------

    def plain(self) -> Upstream:
        """The server for a request that is not warmed: the least loaded that is up."""
        ups = [u for u in self.servers if u.healthy] or self.servers
        return min(ups, key=lambda u: u.load().load())

    async def claim(
        self, kind: EndpointKind, body: Mapping[str, Any], harness: str, *, pinnable: bool
    ) -> tuple[Upstream, Ticket]:
        """Route a generation request and claim a slot on its server (fail-open, as
        :meth:`PrefixWarmer.claim`): the server to forward it to and the ticket."""
        if self.single:
            up = self.servers[0]
            warmed = await up.warmer.claim(kind, body, harness, pinnable=pinnable)
            self._publish(up, warmed, None)
            return up, warmed
        t0 = time.monotonic()
        tried: set[str] = set()
        while len(tried) < len(self.servers):
            try:
                found = await self._choose(kind, body, harness, t0, tried)
            except Exception as exc:
                # Fail-open, as the warmer: the request goes out unwarmed.
                up = self.plain()
                up.warmer.ctx.failure("fleet route", exc)
                return up, Ticket(up.warmer.skipped(f"fleet routing failed: {exc!r}"))
            if found is None:
                break
            up, choice = found
            if isinstance(choice, Ticket):
                return up, choice
            ticket = await self._claim_unless_down(up, choice, t0, pinnable)
            failed = ticket is not None and ticket.outcome.kind == "disabled"
            if ticket is not None and failed and not await self._answers(up):
                up.warmer.release(ticket)
                self.down(up, ticket.outcome.detail)
                ticket = None
            if ticket is None:
                tried.add(up.url)
                continue
            self._publish(up, ticket, choice.request.tokens)
            return up, ticket
        up = self.plain()
        return up, Ticket(up.warmer.skipped("no llama-server of the fleet answers"))

    async def _claim_unless_down(
        self, up: Upstream, choice: _Choice, t0: float, pinnable: bool
    ) -> Ticket | None:
        """The warmer's claim on ``up``, abandoned (None) when ``up`` is taken out
        meanwhile: a wedged server holds a warm-up until its timeout (600 s), the
        probes take it out within seconds."""

        async def release(ticket: Ticket) -> None:
            up.warmer.release(ticket)

        claim = up.warmer.claim_found(choice.request, t0, pinnable=pinnable, slot=choice.slot)
        ticket = await unless_down(up, claim, release)
        if ticket is None:
            self.log(f"fleet: gave up a warm-up on {up.url} (taken out) → routed again")
        return ticket

    async def _answers(self, up: Upstream) -> bool:
        try:
            await up.warmer.client.health(timeout=PROBE_TIMEOUT)
        except LlamaServerError:
            return False
        return True

    async def _candidates(self, body: Mapping[str, Any], tried: set[str]) -> list[Upstream]:
        """The servers a request may go to: up, not tried, /props known; those whose
        model alias the request names when some do."""
        ups = [u for u in self.servers if u.url not in tried]
        ups = [u for u in ups if u.healthy] or ups  # none up: try them all the same
        known = await asyncio.gather(*(self._known(u) for u in ups))
        ups = [u for u, ok in zip(ups, known, strict=True) if ok]
        model = body.get("model")
        named = [u for u in ups if u.info is not None and u.info.model_id == model]
        return named or ups

    async def _choose(
        self,
        kind: EndpointKind,
        body: Mapping[str, Any],
        harness: str,
        t0: float,
        tried: set[str],
    ) -> tuple[Upstream, _Choice | Ticket] | None:
        """The server for a request and its prefix (a ticket: nothing to warm)."""
        ups = await self._candidates(body, tried)
        if not ups:
            return None
        groups: dict[str, list[Upstream]] = {}
        for up in ups:
            groups.setdefault(up.key or "", []).append(up)
        best: _Choice | None = None
        for members in groups.values():
            renderer = members[0]
            found = await renderer.warmer.find(kind, body, harness, t0)
            if isinstance(found, Ticket):
                if found.outcome.kind == "disabled" and not await self._answers(renderer):
                    self.down(renderer, found.outcome.detail)
                    tried.add(renderer.url)
                    return await self._choose(kind, body, harness, t0, tried)
                # Nothing to warm: the least loaded server that may take the request.
                return min(ups, key=lambda u: u.load().load()), found
            if renderer.info is None:  # _known() set it; a server replaced meanwhile
                continue
            choice = await self._route_group(members, found, renderer.info)
            if best is None or _RANK[choice.reason] < _RANK[best.reason]:
                best = choice
        return (best.up, best) if best is not None else None

    async def _route_group(
        self, members: list[Upstream], request: WarmRequest, info: ServerInfo
    ) -> _Choice:
        fp = members[0].warmer.fingerprint_of(request, info)
        files = await asyncio.to_thread(_files, members)
        last = self._placed.get(fp)
        views = [u.view(fp, request, files[u.url], u.url == last) for u in members]
        place = await self._registered(fp, request, members, views)
        decision = route(views, in_store=False)
        if decision is None:  # members is never empty
            raise RuntimeError("no server to route to")
        waits = decision.reason == "hit" and any(
            v.held_busy for v in views if v.name == decision.server
        )
        if decision.reason == "cold" or waits:
            # The store decides: a pull instead of a cold build, or instead of waiting.
            decision = await self._with_store(views, members, fp)
        up = next(u for u in members if u.url == decision.server)
        if last is not None and last != up.url:
            gone = next((u for u in self.servers if u.url == last), None)
            if gone is not None and not gone.healthy:
                self.decisions["failover"] += 1
        slot = None
        if place is not None and place.server == up.url and decision.reason == "hit":
            slot = place.slot
        return _Choice(up, decision.reason, request, slot)

    async def _registered(
        self, fp: str, request: WarmRequest, members: list[Upstream], views: list[ServerView]
    ) -> Place | None:
        """The registry's place for ``fp`` when no server holds it as far as this proxy
        knows: that server's view then holds it (``views`` is updated), so a proxy routes
        a prefix another placed to the same server, and the same slot."""
        if self.registry is None or any(v.held_tokens for v in views):
            return None
        place = await self.registry.locate(fp)
        if place is None:
            return None
        for i, up in enumerate(members):
            leases, config = up.warmer.leases, up.warmer.config
            slots = leases.slots if leases is not None else (config.slots or (config.slot,))
            if up.url != place.server or place.slot not in slots:
                continue
            known = up.warmer.ctx.slots.get(place.slot)
            if known is not None and known.fingerprint != fp:
                return None  # this proxy put another prefix there since: the place is stale
            busy = leases is not None and leases.holder(place.slot) is not None
            held = len(request.tokens or ()) or 1
            views[i] = dataclasses.replace(views[i], held_tokens=held, held_busy=busy)
            return place
        return None

    def _publish(self, up: Upstream, ticket: Ticket, tokens: Sequence[int] | None) -> None:
        """Tell the registry where the ticket's warm-up left its prefix, in the
        background: the request does not wait on it (:meth:`flush` does)."""
        outcome = ticket.outcome
        if self.registry is None or outcome.kind not in _REASONS or not outcome.fingerprint:
            return
        publish = self.registry.publish(outcome.fingerprint, Place(up.url, outcome.slot), tokens)
        task = asyncio.get_running_loop().create_task(publish)
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _with_store(self, views: list[ServerView], members: list[Upstream], fp: str) -> Route:
        store = next((u.warmer.store for u in members if u.warmer.store is not None), None)
        in_store = False
        if store is not None and store.usable():
            try:
                in_store = await asyncio.to_thread(store.manifest, fp) is not None
            except StoreError:
                in_store = False  # the warm-up tries the store itself, or builds cold
        decision = route(views, in_store=in_store)
        if decision is None:
            raise RuntimeError("no server to route to")
        return decision

    def forwarded(self, up: Upstream, ticket: Ticket) -> None:
        """``up`` took the warmed request: count what its warm-up did (the decision as it
        turned out: a planned restore may have become a cold build) and remember where
        the prefix now is."""
        outcome = ticket.outcome
        reason = _REASONS.get(outcome.kind)
        if reason is None:
            return
        if outcome.kind == "restored" and outcome.tier == "store":
            reason = "pull"
        self.decisions[reason] += 1
        up.routed[reason] += 1
        if outcome.kind in ("hit", "restored"):
            up.tokens_reused += outcome.tokens
        elif outcome.kind == "partial":
            up.tokens_reused += outcome.shared
        if outcome.fingerprint:
            self._placed[outcome.fingerprint] = up.url
            self._placed.move_to_end(outcome.fingerprint)
            while len(self._placed) > MAX_PLACED:
                self._placed.popitem(last=False)

    # -- status ---------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """Per server: health, model, load, its slots and their prefixes, routing counts,
        tokens reused; and the fleet's routing decisions."""
        return self._status([up.status(await up.warmer.status()) for up in self.servers])

    def status_now(self) -> dict[str, Any]:
        """:meth:`status` from another thread (the proxy's front door), while the loop
        runs: may raise RuntimeError when the loop changed a table as it was read."""
        return self._status([up.status(up.warmer.status_now()) for up in self.servers])

    def _status(self, servers: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "servers": servers,
            "decisions": dict(self.decisions),
            "placed": len(self._placed),
            "registry": self.registry.status() if self.registry is not None else None,
            "probe_interval_s": PROBE_INTERVAL if not self.single else None,
        }


def _files(members: list[Upstream]) -> dict[str, set[str]]:
    """Each server's slot files (its index); read in a worker thread."""
    out: dict[str, set[str]] = {}
    for up in members:
        index = up.warmer.index
        try:
            out[up.url] = set(index.load().files) if index is not None else set()
        except OSError:
            out[up.url] = set()
    return out
