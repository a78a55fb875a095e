"""The ``--metrics-port`` HTTP endpoint, served on the event loop (no thread per
connection), bounded against connections that never finish a request.

prometheus_client's own server gave each connection a thread with no read timeout:
389 connections that sent half a request made 386 threads, filled the descriptor
table, and RESP clients and scrapes were refused until they left. Here:

- a connection costs a small protocol object and its socket, nothing else; the
  scrape itself is rendered on the loop (between two commands, as INFO is);
- a request must be complete (request line and headers, at most
  :data:`MAX_REQUEST_BYTES`) within :data:`READ_TIMEOUT_S` of connecting, else
  the connection is closed;
- at most :data:`MAX_CONNECTIONS` are held at once: past that, the oldest one still
  waiting for its request is closed to make room, so idle connections can neither
  use up descriptors the server keeps for its clients nor lock a real scrape out.

Any GET (or HEAD) is answered with the metrics, as prometheus_client does; other
methods get 405, a request that is not HTTP/1.x 400 and one whose head is too long 431.
HTTP is h11's (the requests are parsed and the responses framed by it); each
connection serves one request and is closed. Over TLS when the server has a
certificate (client certificates required when it has a CA), as on the RESP port.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
import ssl as ssl_module
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import cast

import h11
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

from pion.config import ServerConfig
from pion.server.tls import HANDSHAKE_TIMEOUT_S, server_context

__all__ = ["MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "MetricsEndpoint"]

log = logging.getLogger("pion.server")

READ_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8 * 1024
MAX_CONNECTIONS = 64
# How long a scrape waits for its families (a supervisor waits on each worker).
_RENDER_TIMEOUT_S = 15.0

Source = Callable[[], Awaitable[list[Metric]]]


class _Families:
    """What generate_latest needs: something with collect()."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


_TEXT = "text/plain; charset=utf-8"
_PHRASE = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class _Scrape(asyncio.Protocol):
    """One connection: one request, one response, then closed."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self._endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        self._timer: asyncio.TimerHandle | None = None
        self.waiting = True  # no complete request yet
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(READ_TIMEOUT_S, self.close)
        self._endpoint.admit(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._endpoint.forget(self)

    def data_received(self, data: bytes) -> None:
        if not self.waiting:
            return
        self._http.receive_data(data)
        try:
            event = self._http.next_event()
        except h11.RemoteProtocolError as exc:
            self._reply(exc.error_status_hint, b"")
            return
        if not isinstance(event, h11.Request):
            return  # NEED_DATA: the head is not complete yet
        self.waiting = False
        if self._timer is not None:
            self._timer.cancel()
        if event.method not in (b"GET", b"HEAD"):
            self._reply(405, b"")
            return
        self._task = asyncio.ensure_future(self._serve(head=event.method == b"HEAD"))

    async def _serve(self, *, head: bool) -> None:
        try:
            families = await asyncio.wait_for(self._endpoint.source(), _RENDER_TIMEOUT_S)
            body = generate_latest(_Families(families))  # type: ignore[arg-type,unused-ignore]
        except Exception:
            log.exception("rendering the metrics failed")
            self._reply(500, b"")
            return
        self._reply(200, body, CONTENT_TYPE_LATEST, head=head)

    def _reply(
        self, status: int, body: bytes, content_type: str = _TEXT, *, head: bool = False
    ) -> None:
        """The response (its head only for a HEAD request), then close."""
        self.waiting = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        # After a request h11 could not parse, it still frames this (error) response.
        response = h11.Response(status_code=status, headers=headers, reason=_PHRASE[status])
        out = self._http.send(response) or b""
        if body and not head:
            out += self._http.send(h11.Data(data=body)) or b""
        out += self._http.send(h11.EndOfMessage()) or b""
        transport.write(out)
        transport.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class MetricsEndpoint:
    """The endpoint on ``--bind``:``--metrics-port``; ``source()`` gives the families
    of a scrape. Construct it on the running loop."""

    def __init__(self, config: ServerConfig, source: Source) -> None:
        self.source = source
        port = config.metrics_port if config.metrics_port is not None else 0
        family = socket.AF_INET6 if ":" in config.bind else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((config.bind, port))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        # Connections in arrival order: the first still waiting is the one to drop.
        self._held: OrderedDict[_Scrape, None] = OrderedDict()
        self._server: asyncio.Server | None = None
        context = server_context(config)
        loop = asyncio.get_running_loop()
        self._starting = loop.create_task(self._start(context))

    async def _start(self, ssl: ssl_module.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Scrape(self),
            sock=self._sock,
            ssl=ssl,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if ssl is not None else None,
        )

    def admit(self, conn: _Scrape) -> None:
        self._held[conn] = None
        if len(self._held) > MAX_CONNECTIONS:
            oldest = next((c for c in self._held if c.waiting and c is not conn), None)
            if oldest is not None:
                del self._held[oldest]
                oldest.close()

    def forget(self, conn: _Scrape) -> None:
        self._held.pop(conn, None)

    @property
    def connections(self) -> int:
        return len(self._held)

    def close(self) -> None:
        """Stop listening and close every connection (call on the loop, or after it
        stopped: then only the socket is closed)."""
        if self._server is not None:
            self._server.close()
        else:
            self._starting.cancel()
        for conn in list(self._held):
            conn.close()
        self._held.clear()
        self._sock.close()
