"""Which llama-server of a fleet a request goes to: a pure function over a snapshot.

Owns :class:`ServerView` (what the fleet knows about one server at the moment a request
arrives), :class:`Route` (the decision and its reason) and :func:`route`. No I/O, no
clock: :mod:`pion.llama.fleet` takes the snapshot and acts on the decision, so the
routing order is tested here on plain values and a later registry of several proxies
(``KV.PREFIX``) can feed the same function.

The order (docs/llama.md, "Several llama-servers"), among the servers that are up and
serve the request's (build, model) (a view is only built for those):

1. **hit**: a server whose slot holds the request's prefix, or a longer one that starts
   with it, and is not serving another request; the most tokens win (ties: the least
   loaded).
2. When every slot holding it is serving another request (sessions of one agent share
   its prefix), a server with a slot to spare that can **restore** it (its slot dir has
   the file) or **pull** it (the store has it) takes it: a hot prefix spreads over the
   fleet instead of queueing on one slot. With none, the request waits for the busiest
   holder's slot (a **hit**) rather than warming the prefix cold elsewhere.
3. **restore**: a server whose own slot dir has the prefix's file; the server the prefix
   was last placed on first (its session's affinity), then the least loaded.
4. **pull**: the store has the file: the least loaded server pulls it.
5. **cold**: the least loaded server warms it.

*Least loaded*: the fewest slots held and requests waiting per slot; then the fewest
slots that hold a prefix per slot (a server with an empty slot evicts nothing); then the
fewest held and waiting in all; then the order the servers were given in (the first
``--upstream`` first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Reason", "Route", "ServerView", "route"]

Reason = Literal["hit", "restore", "pull", "cold"]


@dataclass(frozen=True)
class ServerView:
    """One server as the routing sees it when a request arrives."""

    name: str  # the server's URL: what the decision names
    order: int  # its place among the --upstream flags
    slots: int  # the slots its warmer uses (at least 1)
    busy: int = 0  # slots leased to requests now
    queued: int = 0  # requests waiting for one of its slots
    claimed: int = 0  # slots that hold (or are routed) a prefix
    held_tokens: int = 0  # tokens of the request's prefix a slot of it holds (0: none)
    held_busy: bool = False  # that slot is leased to another request now
    has_file: bool = False  # its slot dir has the prefix's file
    last_placed: bool = False  # the prefix was last placed here (affinity)

    @property
    def spare(self) -> bool:
        """A slot free now, no request waiting."""
        return self.busy + self.queued < self.slots

    def load(self) -> tuple[float, float, int, int]:
        """The least-loaded order's key: lower is less loaded."""
        waiting = self.busy + self.queued
        slots = max(1, self.slots)
        return (waiting / slots, self.claimed / slots, waiting, self.order)


@dataclass(frozen=True)
class Route:
    """The server a request goes to, and why."""

    server: str
    reason: Reason


def route(views: Sequence[ServerView], *, in_store: bool) -> Route | None:
    """The server for a request among ``views`` (None when there is none): see the
    module docstring for the order. ``in_store``: the shared store holds the prefix."""
    if not views:
        return None
    holders = [v for v in views if v.held_tokens > 0]
    idle = [v for v in holders if not v.held_busy]
    if idle:
        best = min(idle, key=lambda v: (-v.held_tokens, v.load()))
        return Route(best.name, "hit")
    if holders:
        spare = [v for v in views if v.held_tokens == 0 and v.spare and (v.has_file or in_store)]
        if spare:
            best = min(spare, key=lambda v: (not v.has_file, not v.last_placed, v.load()))
            return Route(best.name, "restore" if best.has_file else "pull")
        best = min(holders, key=lambda v: (-v.held_tokens, v.load()))
        return Route(best.name, "hit")
    with_file = [v for v in views if v.has_file]
    if with_file:
        best = min(with_file, key=lambda v: (not v.last_placed, v.load()))
        return Route(best.name, "restore")
    least = min(views, key=ServerView.load)
    return Route(least.name, "pull" if in_store else "cold")
