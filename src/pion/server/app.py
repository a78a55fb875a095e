"""The asyncio shell around the command table: listeners, the connection registry
and graceful shutdown. Replies go through one :class:`~pion.server.replies.ReplySink`,
which owns group commit; large commands' number conversions run on one
:class:`~pion.server.offload.Offloader`; reads land in one scratch buffer the
connections share (the loop runs one read at a time).

Like mini-redis's ``server.rs``, :class:`PionServer` takes already-bound sockets, so
tests bind port 0 and the multi-worker supervisor can hand each worker its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Iterable

from pion.commands import COMMAND_TABLE
from pion.commands.state import CommandTable, ServerState
from pion.resp.decoder import SCRATCH_BYTES
from pion.server.clientmem import ClientMemory
from pion.server.clients import ClientConnection
from pion.server.connection import Connection
from pion.server.offload import Offloader
from pion.server.replies import ReplySink
from pion.server.slices import Turns
from pion.server.tls import HANDSHAKE_TIMEOUT_S, server_context

__all__ = ["PionServer"]

log = logging.getLogger("pion.server")

# How long shutdown waits for in-flight replies to drain before closing anyway.
_DRAIN_TIMEOUT_S = 5.0


class PionServer:
    def __init__(self, state: ServerState, table: CommandTable = COMMAND_TABLE) -> None:
        self.state = state
        self.table = table
        self.sink = ReplySink(state.persistence)
        self.offload = Offloader()
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        # The loop's turns, by which every connection's slice is measured.
        self.turns = Turns()
        # One TLS context for every listener of this server (None: plain TCP).
        self.ssl = server_context(state.config)
        # Every client of both lanes, by id (clients.py).
        self.connections: dict[int, ClientConnection] = {}
        self.client_memory = ClientMemory(state, self.connections)
        # Client ids, for both lanes.
        self.ids = itertools.count(1)
        self._servers: list[asyncio.Server] = []
        self._stopped = asyncio.Event()
        self._save_on_shutdown = False
        state.request_shutdown = self.request_shutdown
        state.kill_client = self.kill_client
        state.client_memory = self.client_memory.measure
        client_memory = self.client_memory
        state.memory.clients = lambda: client_memory.total  # part of used_memory

    # -- listening --------------------------------------------------------------

    async def start(self, sockets: Iterable[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            sock.setblocking(False)
            srv = await loop.create_server(
                self._connection,
                sock=sock,
                backlog=1024,
                ssl=self.ssl,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl is not None else None,
            )
            self._servers.append(srv)

    def _connection(self) -> Connection:
        return Connection(
            self.state,
            self.table,
            self.sink,
            next(self.ids),
            self.connections,
            memory=self.client_memory,
            offload=self.offload,
            scratch=self._scratch,
            turns=self.turns,
        )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- admin ------------------------------------------------------------------

    def kill_client(self, client_id: int) -> bool:
        conn = self.connections.get(client_id)
        if conn is None:
            return False
        conn.close()
        return True

    def request_shutdown(self, save: bool) -> None:
        self._save_on_shutdown = self._save_on_shutdown or save
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self.shutdown()))

    async def shutdown(self, save: bool | None = None) -> None:
        """Stop accepting, let in-flight replies drain, flush and fsync the log (after
        a snapshot when asked), then report stopped. Idempotent."""
        if self._stopped.is_set():
            return
        save = self._save_on_shutdown if save is None else save
        for srv in self._servers:
            srv.close()
        # Offloaded commands finish (their writes reach the log) before it is closed.
        await self.offload.drain(_DRAIN_TIMEOUT_S)
        self.sink.commit()
        await self._drain()
        for conn in list(self.connections.values()):
            conn.close()
        if self.state.tier is not None:
            self.state.tier.close()  # drains queued tier writes (bounded)
        persistence = self.state.persistence
        if persistence is not None:
            try:
                if save:
                    persistence.save(None)
            except Exception:
                log.exception("snapshot at shutdown failed")
            try:
                persistence.close()
            except Exception:
                log.exception("closing the write-ahead log failed")
        self.offload.close()
        if self.state.exports is not None:
            # The files are a cache of the V-store: none outlives the server.
            self.state.exports.close()
        self._stopped.set()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DRAIN_TIMEOUT_S
        while loop.time() < deadline:
            busy = [
                c
                for c in self.connections.values()
                if c.transport is not None and c.transport.get_write_buffer_size() > 0
            ]
            if not busy:
                return
            await asyncio.sleep(0.01)
