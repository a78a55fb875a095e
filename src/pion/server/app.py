"""The asyncio shell around the command table: listeners, the connection registry,
group commit of replies, and graceful shutdown.

Like mini-redis's ``server.rs``, :class:`PionServer` takes already-bound sockets, so
tests bind port 0 and the multi-worker supervisor can hand each worker its own.

Group commit (``--appendfsync always``): a reply to a write may leave only once the
write-ahead log record behind it is on stable storage. Replies produced while records
are unsynced are queued; one callback at the end of the loop iteration fsyncs once for
all of them and then writes them out, in order. If the fsync fails the queued replies
are withheld and their connections dropped: the client never saw an acknowledgement.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Iterable

from pion.commands import COMMAND_TABLE
from pion.commands.base import Command
from pion.commands.state import ServerState
from pion.resp.encoder import Chunks
from pion.server.connection import Connection

__all__ = ["PionServer"]

log = logging.getLogger("pion.server")

# How long shutdown waits for in-flight replies to drain before closing anyway.
_DRAIN_TIMEOUT_S = 5.0


class PionServer:
    def __init__(self, state: ServerState, table: dict[str, Command] | None = None) -> None:
        self.state = state
        self.table = table if table is not None else COMMAND_TABLE
        self.connections: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self._servers: list[asyncio.Server] = []
        self._pending: list[tuple[Connection, Chunks]] = []
        self._close_after: list[Connection] = []
        self._commit_scheduled = False
        self._stopped = asyncio.Event()
        self._save_on_shutdown = False
        state.request_shutdown = self.request_shutdown
        state.kill_client = self.kill_client

    def next_client_id(self) -> int:
        return next(self._ids)

    # -- listening --------------------------------------------------------------

    async def start(self, sockets: Iterable[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            sock.setblocking(False)
            srv = await loop.create_server(lambda: Connection(self), sock=sock, backlog=1024)
            self._servers.append(srv)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- replies ----------------------------------------------------------------

    def send(self, conn: Connection, chunks: Chunks) -> None:
        persistence = self.state.persistence
        if self._pending or (persistence is not None and persistence.needs_sync()):
            self._pending.append((conn, chunks))
            if not self._commit_scheduled:
                self._commit_scheduled = True
                asyncio.get_running_loop().call_soon(self._group_commit)
        else:
            conn.write(chunks)

    def close_after_send(self, conn: Connection) -> None:
        if self._commit_scheduled:
            self._close_after.append(conn)
        else:
            conn.close()

    def _group_commit(self) -> None:
        self._commit_scheduled = False
        pending, self._pending = self._pending, []
        closing, self._close_after = self._close_after, []
        persistence = self.state.persistence
        try:
            if persistence is not None and persistence.needs_sync():
                persistence.sync()
        except Exception:
            log.exception(
                "fsync of the write-ahead log failed; withholding %d replies", len(pending)
            )
            for conn, _ in pending:
                conn.abort()
            return
        for conn, chunks in pending:
            conn.write(chunks)
        for conn in closing:
            conn.close()

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
        if self._commit_scheduled:
            self._group_commit()
        await self._drain()
        for conn in list(self.connections.values()):
            conn.close()
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
