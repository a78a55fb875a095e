"""What both lanes' connections share: admission (``maxclients``), the registry of live
clients and what the server needs of each (CLIENT KILL, eviction, shutdown).

A RESP connection (``connection.py``) and a binary-lane connection (``binary.py``)
are clients alike: both get an id from the same counter, a :class:`ClientState` in
``state.clients`` (CLIENT LIST, INFO clients, ``pion_connected_clients``), a place in
the server's registry (CLIENT KILL, shutdown, the ``maxmemory-clients`` accounting)
and are refused past ``maxclients`` with Redis's reply, counted together.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Protocol

from pion.commands.state import ClientState, ServerState

__all__ = [
    "MAX_CLIENTS_REPLY",
    "ClientConnection",
    "admit_connection",
    "io_error",
    "join",
    "leave",
    "peer_addresses",
]

log = logging.getLogger("pion.server")

# Redis's reply to a connection past maxclients.
MAX_CLIENTS_REPLY = b"-ERR max number of clients reached\r\n"
# A flood of refused connections logs one line per this many seconds, not one each.
_REFUSAL_LOG_EVERY_S = 10.0
_last_refusal_log = 0.0


class ClientConnection(Protocol):
    """A live client connection of either lane, as the server sees it."""

    client: ClientState

    def buffer_usage(self) -> tuple[int, int]:
        """(query buffer bytes, unsent reply bytes), measured now."""

    def evict(self) -> None:
        """Disconnect at once and leave the registry (maxmemory-clients)."""

    def close(self) -> None:
        """Close once what was written has left (CLIENT KILL, shutdown)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...


def admit_connection(state: ServerState, transport: asyncio.Transport, refusal: bytes) -> bool:
    """True if a new connection may be served; else it is sent ``refusal`` (its lane's
    form of Redis's ``max number of clients reached``), closed and counted."""
    global _last_refusal_log
    if len(state.clients) < state.config.maxclients:
        return True
    state.counters.rejected_connections += 1
    now = time.monotonic()
    if now - _last_refusal_log >= _REFUSAL_LOG_EVERY_S:
        _last_refusal_log = now
        log.warning(
            "refusing connections: max number of clients reached (maxclients %d)",
            state.config.maxclients,
        )
    transport.write(refusal)
    transport.close()
    return False


def join(
    state: ServerState,
    registry: dict[int, ClientConnection],
    conn: ClientConnection,
    transport: asyncio.Transport,
    refusal: bytes,
) -> bool:
    """A new connection of either lane: admitted (else refused with ``refusal`` and
    False), its addresses read, its write buffer bounded, and registered."""
    if not admit_connection(state, transport, refusal):
        return False
    peer_addresses(transport, conn.client)
    transport.set_write_buffer_limits(high=state.config.protocol.reply_high_water)
    state.counters.total_connections_received += 1
    state.clients[conn.client.id] = conn.client
    registry[conn.client.id] = conn
    return True


def leave(state: ServerState, registry: dict[int, ClientConnection], client: ClientState) -> None:
    """The connection is gone (or evicted): out of the server's tables."""
    state.clients.pop(client.id, None)
    registry.pop(client.id, None)


def io_error(state: ServerState, client: ClientState, what: str, exc: BaseException) -> None:
    """A socket failed under a connection (a read or a write): counted, never silent;
    a peer that hung up is routine (INFO), anything else a warning."""
    state.counters.io_errors += 1
    peer_gone = isinstance(exc, (ConnectionResetError, BrokenPipeError))
    log.log(
        logging.INFO if peer_gone else logging.WARNING,
        "client id=%d addr=%s: %s: %r",
        client.id,
        client.addr,
        what,
        exc,
    )


def peer_addresses(transport: asyncio.Transport, client: ClientState) -> None:
    """TCP_NODELAY on a TCP socket, and the client's ``addr``/``laddr``."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.addr = _fmt_addr(transport.get_extra_info("peername"))
    client.laddr = _fmt_addr(transport.get_extra_info("sockname"))


def _fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr or "")
