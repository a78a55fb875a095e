"""One client connection: bytes in through the sans-IO decoder, commands through the
dispatcher, reply chunks out through the server's :class:`ReplySink`.

Replies leave strictly in request order: every command of a read is dispatched in turn
on the event loop thread, and their chunks are handed to the sink (which writes them or
queues them behind a group commit). Small replies are gathered into one write; a reply
that makes the batch large is handed over at once.

What a connection may make the server hold is bounded, and checked after every
command, not once per read:

- its unsent reply bytes (the socket's write buffer plus replies the sink is holding
  for a group commit): above the high-water mark its further commands wait, and its
  socket is not read, until they drain. A client that pipelines large fetches and
  never reads costs one high-water mark plus one reply, not its pipeline's depth;
- once its socket is closing (the peer hung up, or we closed it), no further command
  of its is run: nobody would read the reply;
- before it authenticates to a server with a password, the decoder's unauthenticated
  limits apply (10 arguments, 16 KB bulks);
- all connections together report to :class:`ClientMemory` (``maxmemory-clients``);
- past ``maxclients`` a new connection is answered
  ``-ERR max number of clients reached`` and closed.

A connection's collaborators are explicit: the worker's state, the command table, the
reply sink, the registry of live connections (for CLIENT KILL and shutdown) and the
client-memory accounting.
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
from pion.server.clientmem import ClientMemory
from pion.server.dispatch import execute
from pion.server.replies import ReplySink

__all__ = ["Connection"]

log = logging.getLogger("pion.server")

# Gather small replies into one write up to this many bytes or chunks; a deep pipeline
# of PINGs then costs one writelines per 64 KiB, not one per command.
_FLUSH_BYTES = 64 * 1024
_FLUSH_CHUNKS = 4096
# Redis's reply to a connection past maxclients.
_MAX_CLIENTS_REPLY = b"-ERR max number of clients reached\r\n"
# A flood of refused connections logs one line per this many seconds, not one each.
_REFUSAL_LOG_EVERY_S = 10.0
_last_refusal_log = 0.0


class Connection(asyncio.Protocol):
    def __init__(
        self,
        state: ServerState,
        table: CommandTable,
        sink: ReplySink,
        client_id: int,
        registry: dict[int, Connection],
        *,
        memory: ClientMemory,
    ) -> None:
        self._state = state
        self._sink = sink
        self._registry = registry
        self._memory = memory
        self._decoder = RequestDecoder(state.config.protocol)
        self._decoder.authenticated = not state.config.auth_required
        self._high_water = state.config.protocol.reply_high_water
        self._transport: asyncio.Transport | None = None
        # The transport asked us to stop writing (its buffer passed the mark).
        self._writing_paused = False
        # We stopped ourselves: unsent bytes over the mark, mostly held by the sink.
        self._backlogged = False
        self._reading_paused = False
        self._closed = False
        self._registered = False
        # Reply bytes handed to the sink and not yet written to the transport.
        self._held = 0
        self.client = ClientState(id=client_id, created=time.time())
        self._ctx = Context(state=state, client=self.client, table=table)

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if len(self._registry) >= self._state.config.maxclients:
            self._refuse(transport)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.addr = _fmt_addr(transport.get_extra_info("peername"))
        self.client.laddr = _fmt_addr(transport.get_extra_info("sockname"))
        transport.set_write_buffer_limits(high=self._high_water)
        self._state.counters.total_connections_received += 1
        self._state.clients[self.client.id] = self.client
        self._registry[self.client.id] = self
        self._registered = True

    def _refuse(self, transport: asyncio.Transport) -> None:
        global _last_refusal_log
        self._closed = True
        self._state.counters.rejected_connections += 1
        now = time.monotonic()
        if now - _last_refusal_log >= _REFUSAL_LOG_EVERY_S:
            _last_refusal_log = now
            log.warning(
                "refusing connections: max number of clients reached (maxclients %d)",
                self._state.config.maxclients,
            )
        transport.write(_MAX_CLIENTS_REPLY)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._decoder.clear()
        if self._registered:
            self._registered = False
            self._memory.forget(self)
            self._state.clients.pop(self.client.id, None)
            self._registry.pop(self.client.id, None)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._decoder.feed(data)
        self._process()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._resume()

    # -- processing -------------------------------------------------------------

    def _process(self) -> None:
        transport = self._transport
        if transport is None:
            return
        decoder = self._decoder
        client = self.client
        out: Chunks = []
        out_bytes = 0
        close_after = False
        proto_error: ProtocolError | None = None
        while not (self._closed or self._writing_paused or self._backlogged):
            if transport.is_closing():
                # The peer hung up (a write failed) or we are closing: whatever it
                # still had pipelined would build replies nobody reads.
                out = []
                break
            try:
                argv = decoder.get()
            except ProtocolError as exc:
                proto_error = exc
                break
            if argv is None:
                break
            out_bytes += execute(self._ctx, argv, out)
            if not decoder.authenticated and client.authenticated:
                decoder.authenticated = True  # AUTH/HELLO succeeded: full limits
            if client.closing:
                close_after = True
                break
            if (
                out_bytes >= _FLUSH_BYTES
                or len(out) >= _FLUSH_CHUNKS
                or out_bytes + self._unsent() > self._high_water
            ):
                self._send(out, out_bytes)
                out, out_bytes = [], 0
                if self._unsent() > self._high_water and not self._writing_paused:
                    # The sink holds them (group commit): wait for it to write them.
                    self._backlogged = True
                    self._pause_reading()
        if proto_error is not None:
            self._state.counters.protocol_errors += 1
            log.info("protocol error from %s: %s", client.addr, proto_error.message)
            err = encode_error(proto_error.resp_line())
            out.append(err)
            out_bytes += len(err)
            close_after = True
        if out:
            self._send(out, out_bytes)
        if close_after:
            self._sink.close_after_send(self)
        self._report()

    def _send(self, out: Chunks, nbytes: int) -> None:
        self._held += nbytes
        self._sink.send(self, out, nbytes)

    def _unsent(self) -> int:
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return buffered + self._held

    def _pause_reading(self) -> None:
        transport = self._transport
        if not self._reading_paused and transport is not None and not transport.is_closing():
            self._reading_paused = True
            transport.pause_reading()

    def _resume(self) -> None:
        if self._closed or self._writing_paused or self._backlogged:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._process()

    def _report(self) -> None:
        if self._registered and not self._closed:
            self._memory.update(self, self._decoder.held + self._unsent())

    # -- used by the sink, the accounting and the server ---------------------------

    def write(self, chunks: Chunks, nbytes: int) -> None:
        self._held -= nbytes
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(chunks)
        if self._backlogged and (self._writing_paused or self._unsent() <= self._high_water):
            # Released by the sink. If the transport is now over the mark itself, its
            # resume_writing() takes over; else run the commands that waited, after
            # this callback (never inside the sink's loop over its queue).
            self._backlogged = False
            if not self._writing_paused:
                asyncio.get_running_loop().call_soon(self._resume)
        self._report()

    def buffer_usage(self) -> tuple[int, int]:
        return self._decoder.held, self._unsent()

    def evict(self) -> None:
        self.abort()

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
