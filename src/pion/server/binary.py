"""The binary lane on port+1 (docs/attention.md): Stage-2 queries without RESP framing.

Pion's client opens it lazily for ``attend_query_fused``, checks it with a PING and
falls back to RESP for good on any failure, so the lane is narrow on purpose: PING,
ATTEND.PREFIX.QUERY_FUSED and AUTH. The frame format and the request parser are
``binary_wire.py``; this module is the asyncio side.

Rules, each the same as on the RESP port:

- One request at a time per frame, replies in order. The query runs the same code as
  ``ATTEND.PREFIX.QUERY_FUSED`` (:func:`pion.attend.queries.query_fused`); its errors
  come back as ERROR frames whose body is the RESP error line, ``-COLDMISS`` as status
  COLDMISS.
- With ``--requirepass``, a connection gets nothing but PING and AUTH until an AUTH
  frame carries the password (then it may send frames up to the body limit; before,
  Redis's pre-auth bulk limit of 16 KB applies).
- While the server loads its data directory, queries answer ERROR ``LOADING``.
- A bad magic, a body length over the limit (``max_binary_body``, the RESP bulk
  limit) and a truncated frame at end of input are answered with an ERROR frame and
  the connection is closed; a stalled or desynchronised peer never keeps a half-read
  stream. An unknown opcode or a body that does not hold its declared fields is
  answered MISS and the connection goes on (the frame boundary is known).
- Replies leave through the transport as views of the result arrays; when the peer
  stops reading we stop reading too (the RESP connection's back-pressure rule).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
from collections.abc import Iterable
from typing import cast

import numpy as np

from pion.attend import queries
from pion.commands.state import ServerState
from pion.errors import ColdMissError, LoadingError, NoAuthError, PionError, WrongPassError
from pion.server.binary_wire import (
    OP_AUTH,
    OP_PING,
    OP_QUERY_FUSED,
    STATUS_COLDMISS,
    STATUS_ERROR,
    STATUS_MISS,
    STATUS_OK,
    BodyError,
    Frame,
    FrameError,
    FrameParser,
    encode_frame,
    parse_query_fused,
)
from pion.server.tls import HANDSHAKE_TIMEOUT_S, server_context

__all__ = ["MAX_PREAUTH_BODY", "BinaryConnection", "BinaryLane"]

log = logging.getLogger("pion.server")

# Redis refuses bulks over 16 KB from a client that has not authenticated; an AUTH or
# PING body never needs more.
MAX_PREAUTH_BODY = 16 * 1024
# As the RESP connection: let a few large replies queue before we stop reading.
_WRITE_HIGH_WATER = 64 * 1024 * 1024
_NO_PASSWORD = (
    "AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?"
)
_COMMAND = "ATTEND.PREFIX.QUERY_FUSED"


class BinaryConnection(asyncio.Protocol):
    """One binary-lane connection."""

    def __init__(self, state: ServerState, registry: set[BinaryConnection]) -> None:
        self._state = state
        self._registry = registry
        self._authenticated = state.config.requirepass is None
        limit = state.config.protocol.max_binary_body
        self._parser = FrameParser(limit if self._authenticated else MAX_PREAUTH_BODY)
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._closed = False

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._registry.discard(self)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        self._process()

    def eof_received(self) -> bool:
        # The peer will send nothing more: a partial frame can never complete.
        missing = self._parser.truncated()
        if missing is not None and not self._closed:
            self._fail(missing)
        return False

    def pause_writing(self) -> None:
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()
            self._process()

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # -- processing -------------------------------------------------------------

    def _process(self) -> None:
        while not self._paused and not self._closed:
            try:
                frame = self._parser.next()
            except FrameError as exc:
                self._fail(exc.message)
                return
            if frame is None:
                return
            self._state.counters.total_commands_processed += 1
            status, body = self._answer(frame)
            self._send(status, body)

    def _fail(self, message: str) -> None:
        self._state.counters.protocol_errors += 1
        log.info("binary lane protocol error: %s", message)
        self._send(STATUS_ERROR, f"ERR Protocol error: {message}".encode())
        self.close()

    def _send(self, status: int, body: bytes | memoryview) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(encode_frame(status, body))

    def _answer(self, frame: Frame) -> tuple[int, bytes | memoryview]:
        """The reply to one frame; never raises (this is the lane's error boundary)."""
        try:
            if frame.opcode == OP_PING:
                return STATUS_OK, b""
            if frame.opcode == OP_AUTH:
                self._auth(bytes(frame.body))
                return STATUS_OK, b""
            if not self._authenticated:
                raise NoAuthError()
            if frame.opcode != OP_QUERY_FUSED:
                return STATUS_MISS, f"ERR unknown opcode 0x{frame.opcode:02X}".encode()
            if self._state.loading:
                raise LoadingError()
            try:
                req = parse_query_fused(frame.body)
            except BodyError as exc:
                return STATUS_MISS, f"ERR {exc.message}".encode()
            state = self._state
            out = queries.query_fused(state.attention, _COMMAND, req, state.config.fa_window)
            return STATUS_OK, np.ascontiguousarray(out).data.cast("B")
        except ColdMissError as exc:
            return STATUS_COLDMISS, exc.resp_line().encode()
        except PionError as exc:
            return STATUS_ERROR, exc.resp_line().encode()
        except Exception:
            self._state.counters.internal_errors += 1
            log.exception("internal error on the binary lane (opcode 0x%02X)", frame.opcode)
            return STATUS_ERROR, b"ERR internal error"

    def _auth(self, password: bytes) -> None:
        expected = self._state.config.requirepass
        if expected is None:
            raise PionError(_NO_PASSWORD)
        if not hmac.compare_digest(password, expected.encode("utf-8")):
            raise WrongPassError()
        self._authenticated = True
        self._parser.max_body = self._state.config.protocol.max_binary_body


class BinaryLane:
    """The binary listeners of one worker and their connections."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.connections: set[BinaryConnection] = set()
        self._servers: list[asyncio.Server] = []

    async def start(self, sockets: Iterable[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        # TLS as on the RESP port (--tls-cert/--tls-key/--tls-ca), else plain TCP.
        context = server_context(self.state.config)
        for sock in sockets:
            sock.setblocking(False)
            server = await loop.create_server(
                lambda: BinaryConnection(self.state, self.connections),
                sock=sock,
                backlog=1024,
                ssl=context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
            )
            self._servers.append(server)

    def close(self) -> None:
        """Stop accepting and close every connection (shutdown)."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
