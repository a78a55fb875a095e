"""One client connection: bytes in through the sans-IO decoder, commands through the
dispatcher, reply chunks out through the server's :class:`ReplySink`.

Replies leave strictly in request order: every command of a read is dispatched in turn
on the event loop thread, and their chunks are handed to the sink (which writes them or
queues them behind a group commit) as one batch. When the peer stops reading and the
transport's buffer passes its high water mark, we stop reading too, so a deep pipeline
of large replies cannot make the server buffer without bound.

A connection's collaborators are explicit: the worker's state, the command table, the
reply sink and the registry of live connections (for CLIENT KILL and shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import cast

from pion.commands.state import ClientState, CommandTable, Context, ServerState
from pion.errors import ProtocolError
from pion.resp.decoder import RequestDecoder
from pion.resp.encoder import Chunks, encode_error
from pion.server.dispatch import execute
from pion.server.replies import ReplySink

__all__ = ["Connection"]

log = logging.getLogger("pion.server")

# Let the write buffer hold a few large replies before we stop reading.
_WRITE_HIGH_WATER = 64 * 1024 * 1024
# Inside a deep pipeline, hand replies to the sink every so many chunks so writes start
# early and back-pressure (pause_writing) can kick in.
_FLUSH_CHUNKS = 4096


class Connection(asyncio.Protocol):
    def __init__(
        self,
        state: ServerState,
        table: CommandTable,
        sink: ReplySink,
        client_id: int,
        registry: dict[int, Connection],
    ) -> None:
        self._state = state
        self._sink = sink
        self._registry = registry
        self._decoder = RequestDecoder(state.config.protocol)
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._closed = False
        self.client = ClientState(id=client_id, created=time.time())
        self._ctx = Context(state=state, client=self.client, table=table)

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.addr = _fmt_addr(transport.get_extra_info("peername"))
        self.client.laddr = _fmt_addr(transport.get_extra_info("sockname"))
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        self._state.counters.total_connections_received += 1
        self._state.clients[self.client.id] = self.client
        self._registry[self.client.id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._state.clients.pop(self.client.id, None)
        self._registry.pop(self.client.id, None)

    def data_received(self, data: bytes) -> None:
        self._decoder.feed(data)
        self._process()

    def pause_writing(self) -> None:
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()
            self._process()

    # -- processing -------------------------------------------------------------

    def _process(self) -> None:
        out: Chunks = []
        close_after = False
        proto_error: ProtocolError | None = None
        while not self._paused and not self._closed:
            try:
                argv = self._decoder.get()
            except ProtocolError as exc:
                proto_error = exc
                break
            if argv is None:
                break
            if not argv:
                continue
            execute(self._ctx, argv, out)
            if self.client.closing:
                close_after = True
                break
            if len(out) >= _FLUSH_CHUNKS:
                self._sink.send(self, out)
                out = []
        if proto_error is not None:
            self._state.counters.protocol_errors += 1
            log.info("protocol error from %s: %s", self.client.addr, proto_error.message)
            out.append(encode_error(proto_error.resp_line()))
            close_after = True
        if out:
            self._sink.send(self, out)
        if close_after:
            self._sink.close_after_send(self)

    # -- used by the sink and the server ----------------------------------------

    def write(self, chunks: Chunks) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(chunks)

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport


def _fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr or "")
