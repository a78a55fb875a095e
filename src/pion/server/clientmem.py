"""The server-wide bound on client buffers (``maxmemory-clients``, Redis 7's idea).

Each connection, of either lane, holds a query buffer (bytes received and not yet run:
the decoder's buffer, commands parsed and waiting, a command being read) and reply
bytes not yet sent (the socket's write buffer and replies waiting for a group commit,
each piece counted with the overhead of the object that holds it). Per connection
those are bounded already: the protocol limits bound a query, and the reply high-water
mark stops a connection's commands while its replies back up. Together they are not:
ten thousand clients that stop reading can each hold a high-water mark. This module
keeps the sum.

Accounting is incremental and cheap: a connection reports its usage when it changes
(after it processed what it received, after its replies were handed to the socket)
and the total moves by the difference. Only when the total passes the bound are all
connections measured afresh (a report can be stale: a socket drains without telling
anyone), and if it is still over, the clients holding the most are disconnected,
largest first, until it fits, each with a warning in the log; a disconnected client
leaves the registry at once (``evict``), not when its transport is torn down. This is Redis's client
eviction. We disconnect rather than pause because the memory is held by clients that
do not read: pausing everyone would let a few such clients stop the whole server,
while dropping the largest holder costs only the client that caused it. A client that
sent ``CLIENT NO-EVICT ON`` is never chosen (as in Redis).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from pion.commands.state import ClientState, ServerState

__all__ = ["BufferOwner", "ClientMemory"]

log = logging.getLogger("pion.server")

# When only exempt (NO-EVICT) clients hold the excess, measuring everyone again on
# every report would cost O(clients) per command; look again after this long.
_RECHECK_S = 0.1


class BufferOwner(Protocol):
    """What the accounting needs of a connection."""

    client: ClientState

    def buffer_usage(self) -> tuple[int, int]:
        """(query buffer bytes, unsent reply bytes), measured now."""

    def evict(self) -> None:
        """Disconnect at once, dropping whatever is buffered."""


class ClientMemory:
    """The running total of every connection's buffers, and the bound on it."""

    def __init__(self, state: ServerState, owners: Mapping[int, BufferOwner]) -> None:
        self._state = state
        self._owners = owners
        self._reported: dict[int, int] = {}
        self._total = 0
        self._quiet_until = 0.0

    @property
    def total(self) -> int:
        """Bytes held by all clients, as last reported."""
        return self._total

    def measure(self) -> int:
        """Measure every connection now (INFO, and before any eviction)."""
        self._reported = {cid: sum(o.buffer_usage()) for cid, o in self._owners.items()}
        self._total = sum(self._reported.values())
        return self._total

    def update(self, owner: BufferOwner, usage: int) -> None:
        """``owner`` holds ``usage`` bytes now; enforce the bound if it is passed."""
        cid = owner.client.id
        self._total += usage - self._reported.get(cid, 0)
        self._reported[cid] = usage
        limit = self._state.config.maxmemory_clients
        if limit and self._total > limit:
            self._enforce(limit)

    def forget(self, owner: BufferOwner) -> None:
        """``owner`` is gone; what it held is freed."""
        self._total -= self._reported.pop(owner.client.id, 0)

    def _enforce(self, limit: int) -> None:
        now = time.monotonic()
        if now < self._quiet_until:
            return
        if self.measure() <= limit:
            return
        usage = self._reported
        candidates = sorted(
            (o for o in self._owners.values() if not o.client.no_evict),
            key=lambda o: usage.get(o.client.id, 0),
            reverse=True,
        )
        for owner in candidates:
            if self._total <= limit:
                break
            held = self._reported.pop(owner.client.id, 0)
            if held == 0:
                break
            query, reply = owner.buffer_usage()
            log.warning(
                "maxmemory-clients: client buffers hold %d bytes, over the bound of %d; "
                "disconnecting client id=%d addr=%s, which held %d bytes "
                "(query buffer %d, unsent replies %d)",
                self._total,
                limit,
                owner.client.id,
                owner.client.addr,
                held,
                query,
                reply,
            )
            self._total -= held
            self._state.counters.evicted_clients += 1
            owner.evict()
        if self._total > limit:
            self._quiet_until = now + _RECHECK_S
