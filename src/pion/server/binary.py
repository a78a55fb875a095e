"""The binary lane on port+1 (docs/attention.md): Stage-2 queries without RESP framing.

Pion's client opens it lazily for ``attend_query_fused``, checks it with a PING and
falls back to RESP for good on any failure, so the lane is narrow on purpose: PING,
ATTEND.PREFIX.QUERY_FUSED and AUTH. The frame format and the request parser are
``binary_wire.py``; this module is the asyncio side.

A lane connection is a client like a RESP one (``clients.py``): it has an id from the
same counter and a ClientState (CLIENT LIST, INFO clients, metrics), counts against
``maxclients`` (refused past it with an ERROR frame) and reports what it holds to
the ``maxmemory-clients`` accounting, which may evict it. Its frames pass the RESP
lane's own code:

- An AUTH frame is run as the command ``AUTH <password>`` through the dispatcher,
  and every other frame but PING (the lane's liveness check, answered before AUTH
  too) first passes the dispatcher's :func:`admit` (authentication, loading, ...):
  one implementation of each rule for both lanes.
  The query runs the same code as ``ATTEND.PREFIX.QUERY_FUSED``
  (:func:`pion.attend.queries.query_fused`) inside the same error boundary
  (:func:`pion.commands.execution.timed`): timed and counted as that command (INFO
  commandstats and errorstats, SLOWLOG); errors come back as ERROR frames whose
  body is the RESP error line, ``-COLDMISS`` as status COLDMISS.
- Before AUTH (with ``--requirepass``), frames are held to Redis's pre-auth bulk
  limit of 16 KB, as RESP bulks are.
- A bad magic, a body length over the limit (``max_binary_body``, the RESP bulk
  limit) and a truncated frame at end of input are answered with an ERROR frame and
  the connection is closed (:class:`~pion.errors.FrameError`). An unknown opcode or a
  body that does not hold its declared fields is answered MISS and the connection
  goes on (:class:`~pion.errors.BodyError`).
- Frames are served in slices of the loop (``slices.py``, the RESP lane's
  :class:`~pion.server.slices.Share`); replies are gathered and
  coalesced into one write per slice; when the peer stops reading we stop reading
  (the RESP connection's high-water mark).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from pion.attend import queries
from pion.attend.queries import FusedQuery
from pion.commands.execution import timed
from pion.commands.state import ClientState, Context, ServerState
from pion.errors import BodyError, ColdMissError, FrameError, PionError
from pion.resp.encoder import Chunks
from pion.resp.reply import ErrorReply
from pion.server.binary_wire import (
    HEADER,
    MAGIC,
    OP_AUTH,
    OP_PING,
    OP_QUERY_FUSED,
    STATUS_COLDMISS,
    STATUS_ERROR,
    STATUS_MISS,
    STATUS_OK,
    Frame,
    FrameParser,
    encode_frame,
    parse_query_fused,
)
from pion.server.clients import io_error, join, leave
from pion.server.dispatch import admit, dispatch
from pion.server.replies import coalesce
from pion.server.slices import Share
from pion.server.tls import HANDSHAKE_TIMEOUT_S, server_context
from pion.wire import bytes_of

if TYPE_CHECKING:
    from pion.server.app import PionServer

__all__ = ["MAX_PREAUTH_BODY", "BinaryConnection", "BinaryLane"]

log = logging.getLogger("pion.server")

# Redis refuses bulks over 16 KB from a client that has not authenticated; an AUTH or
# PING body never needs more.
MAX_PREAUTH_BODY = 16 * 1024
_COMMAND = "ATTEND.PREFIX.QUERY_FUSED"
# Past maxclients: Redis's error line in an ERROR frame.
_BODY = b"ERR max number of clients reached"
_MAX_CLIENTS_FRAME = HEADER.pack(MAGIC, STATUS_ERROR, len(_BODY)) + _BODY


class BinaryConnection(asyncio.Protocol):
    """One binary-lane connection: a client of the server (module docstring)."""

    def __init__(self, server: PionServer) -> None:
        self._server = server
        self._state = state = server.state
        self.client = ClientState(id=next(server.ids), created=time.time())
        self.client.authenticated = not state.config.auth_required
        self._ctx = Context(state=state, client=self.client, table=server.table)
        limit = state.config.protocol.max_binary_body
        self._parser = FrameParser(limit if self.client.authenticated else MAX_PREAUTH_BODY)
        self._transport: asyncio.Transport | None = None
        self._writing_paused = False
        self._reading_paused = False
        self._share = Share(server.turns)  # its slice of the loop, as a RESP client's
        self._closed = False
        self._registered = False

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._registered = join(
            self._state, self._server.connections, self, transport, _MAX_CLIENTS_FRAME
        )
        self._closed = not self._registered

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._closed:
            io_error(self._state, self.client, "binary lane: the connection failed", exc)
        self._closed = True
        self._unregister()

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            self._server.client_memory.forget(self)
            leave(self._state, self._server.connections, self.client)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._parser.feed(data)
        self._process()

    def eof_received(self) -> bool:
        # The peer will send nothing more: a partial frame can never complete.
        missing = self._parser.truncated()
        if missing is not None and not self._closed:
            self._fail(FrameError(missing), [])
        return False

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if not self._closed:
            self._process()

    # -- what the server needs of a client (clients.py) ---------------------------

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    def buffer_usage(self) -> tuple[int, int]:
        transport = self._transport
        unsent = transport.get_write_buffer_size() if transport is not None else 0
        return self._parser.buffered, unsent

    def evict(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()
        self._unregister()

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # -- processing -------------------------------------------------------------

    def _process(self) -> None:
        transport = self._transport
        share = self._share
        if transport is None or share.yielded:
            return
        share.begin()
        out: Chunks = []
        ran = 0
        while not (self._closed or self._writing_paused):
            if self._parser.buffered and share.spent(ran):
                # The slice is used: the rest waits a turn.
                self._state.counters.slices_yielded += 1
                share.pause(self._next_slice)
                break
            try:
                frame = self._parser.next()
            except FrameError as exc:
                self._fail(exc, out)
                return
            if frame is None:
                break
            ran += 1
            self._state.counters.total_commands_processed += 1
            status, body = self._answer(frame)
            out += encode_frame(status, body)
        share.end()
        self._write(out)
        self._update_reading()
        self._report()

    def _next_slice(self) -> None:
        if not self._closed:
            self._process()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing() or self._closed:
            return
        stop = self._writing_paused or self._share.yielded
        if stop and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not stop and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _report(self) -> None:
        if self._registered and not self._closed:
            self._server.client_memory.update(self, sum(self.buffer_usage()))

    def _fail(self, exc: FrameError, out: Chunks) -> None:
        self._state.counters.protocol_errors += 1
        log.info("binary lane protocol error from %s: %s", self.client.addr, exc.message)
        self._write([*out, *encode_frame(STATUS_ERROR, exc.resp_line().encode())])
        self.close()

    def _write(self, out: Chunks) -> None:
        transport = self._transport
        if not out or transport is None or transport.is_closing():
            return
        try:
            transport.writelines(coalesce(out))
        except (OSError, RuntimeError) as exc:
            self._state.counters.io_errors += 1
            log.warning("binary lane client id=%d: writing a reply failed: %r", self.client.id, exc)
            self.evict()

    def _answer(self, frame: Frame) -> tuple[int, bytes | memoryview]:
        """The reply to one frame; never raises (this is the lane's error boundary)."""
        try:
            if frame.opcode == OP_PING:
                # The lane's liveness check, answered before AUTH too (the client
                # probes the lane with it before it authenticates).
                return STATUS_OK, b""
            if frame.opcode == OP_AUTH:
                status, body = self._run(b"AUTH", bytes(frame.body))
                if self.client.authenticated:
                    self._parser.max_body = self._state.config.protocol.max_binary_body
                return status, body
            admit(self._ctx, self._server.table[_COMMAND], None)  # NOAUTH, LOADING, ...
            if frame.opcode != OP_QUERY_FUSED:
                return STATUS_MISS, f"ERR unknown opcode 0x{frame.opcode:02X}".encode()
            try:
                req = parse_query_fused(frame.body)
            except BodyError as exc:
                return STATUS_MISS, exc.resp_line().encode()
            return self._query(req)
        except PionError as exc:
            return STATUS_ERROR, exc.resp_line().encode()
        except Exception:
            self._state.counters.internal_errors += 1
            log.exception("internal error on the binary lane (opcode 0x%02X)", frame.opcode)
            return STATUS_ERROR, b"ERR internal error"

    def _query(self, req: FusedQuery) -> tuple[int, bytes | memoryview]:
        """The query, timed and counted as the RESP command (commandstats, errorstats,
        SLOWLOG) through the one boundary of ``pion.commands.execution``."""
        state = self._state
        argv = (_COMMAND.encode(), req.sid, b"<binary lane>")
        out = timed(
            self._ctx,
            _COMMAND,
            argv,
            lambda: queries.query_fused(state.attention, _COMMAND, req, state.config.fa_window),
        )
        if isinstance(out, ErrorReply):
            code = STATUS_COLDMISS if out.startswith(ColdMissError.code + " ") else STATUS_ERROR
            return code, str(out).encode()
        return STATUS_OK, bytes_of(out)

    def _run(self, *argv: bytes) -> tuple[int, bytes]:
        """A frame run as the RESP command ``argv`` through the dispatcher."""
        reply = dispatch(self._ctx, argv)
        if isinstance(reply, ErrorReply):
            return STATUS_ERROR, str(reply).encode()
        return STATUS_OK, b""


class BinaryLane:
    """The binary listeners of one worker and their connections."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._servers: list[asyncio.Server] = []
        self._server: PionServer | None = None

    async def start(self, sockets: Iterable[socket.socket], server: PionServer) -> None:
        """Serve the lane on ``sockets``, its clients those of ``server``."""
        self._server = server
        loop = asyncio.get_running_loop()
        # TLS as on the RESP port (--tls-cert/--tls-key/--tls-ca), else plain TCP.
        context = server_context(self.state.config)
        for sock in sockets:
            sock.setblocking(False)
            listener = await loop.create_server(
                lambda: BinaryConnection(server),
                sock=sock,
                backlog=1024,
                ssl=context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
            )
            self._servers.append(listener)

    def close(self) -> None:
        """Stop accepting and close every connection (shutdown)."""
        for listener in self._servers:
            listener.close()
        if self._server is not None:
            for conn in list(self._server.connections.values()):
                if isinstance(conn, BinaryConnection):
                    conn.close()
