"""How the proxy's HTTP server is run: uvicorn, with time limits on slow and idle clients.

Owns the uvicorn options of ``pion llama proxy`` and its protocol class
(:class:`TimedH11Protocol`), :func:`run` and :func:`serve_in_thread` (tests, embedding),
and :class:`FrontDoorServer`: uvicorn behind the proxy's front door
(:mod:`pion.llama.frontdoor`), which answers ``/pion/status`` off the loop. uvicorn closes
a keep-alive connection that stays idle after a response (``timeout_keep_alive``), but not
a connection that never completes a request's headers: a client that connects and sends
nothing, or trickles a header byte every few seconds (slowloris), would hold a socket and
a descriptor forever. :class:`TimedH11Protocol` closes a connection whose request headers
are not complete :data:`HEADER_TIMEOUT` seconds after it opened or after its last
response. A body that stalls is timed out as the proxy reads it (:func:`read_body`,
:data:`BODY_IDLE_TIMEOUT`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import partial
from typing import Any, TypeAlias

import uvicorn
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from pion.llama.frontdoor import FrontDoor

__all__ = [
    "BODY_IDLE_TIMEOUT",
    "HEADER_TIMEOUT",
    "KEEP_ALIVE_TIMEOUT",
    "Answers",
    "FrontDoorServer",
    "RequestBody",
    "TimedH11Protocol",
    "read_body",
    "run",
    "serve_in_thread",
    "uvicorn_options",
]

# Seconds a connection may take to send a complete request head (nginx's
# client_header_timeout defaults to 60 s; a harness sends its head at once).
HEADER_TIMEOUT = 30.0
# Seconds a request body may stall between two chunks (nginx's client_body_timeout: 60 s).
BODY_IDLE_TIMEOUT = 60.0
# Seconds an idle keep-alive connection is kept (uvicorn's default is 5).
KEEP_ALIVE_TIMEOUT = 15.0

# Paths answered off the event loop by the front door: path → a function that returns
# the answer's JSON body (called in the front door's thread).
Answers: TypeAlias = Mapping[str, Callable[[], bytes]]


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request head is late."""

    _pion_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._pion_arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._pion_disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._pion_disarm()  # the head is in: the body has its own limit

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._pion_arm()

    def _pion_arm(self) -> None:
        self._pion_disarm()
        self._pion_timer = self.loop.call_later(HEADER_TIMEOUT, self._pion_late)

    def _pion_disarm(self) -> None:
        if self._pion_timer is not None:
            self._pion_timer.cancel()
            self._pion_timer = None

    def _pion_late(self) -> None:
        self._pion_timer = None
        in_request = self.cycle is not None and not self.cycle.response_complete
        if not in_request and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(host: str, port: int) -> dict[str, Any]:
    # No Server/Date headers of our own: the upstream's pass through unchanged.
    return {
        "host": host,
        "port": port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
        "http": TimedH11Protocol,
        "timeout_keep_alive": KEEP_ALIVE_TIMEOUT,
        # A proxy shutting down lets answers in flight finish, for a while.
        "timeout_graceful_shutdown": 10,
    }


class FrontDoorServer(uvicorn.Server):
    """uvicorn's server behind a :class:`~pion.llama.frontdoor.FrontDoor`: the front
    door's thread accepts, answers the paths of ``answers`` itself and hands every other
    connection to uvicorn's protocol on the event loop (``connect_accepted_socket``),
    where it is served, counted and shut down gracefully as any other."""

    def __init__(self, config: uvicorn.Config, answers: Answers) -> None:
        super().__init__(config)
        self._answers = answers
        self.front: FrontDoor | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        listener = self.config.bind_socket()  # a port in use fails before the lifespan
        # The lifespan only: uvicorn makes no listener of its own for an empty list.
        await super().startup(sockets=[])
        listener.listen(self.config.backlog)
        loop = asyncio.get_running_loop()
        # What uvicorn's own listener makes for each connection (typed there as any
        # asyncio.Protocol, hence the ignore, as in uvicorn).
        protocol = partial(
            self.config.http_protocol_class,
            config=self.config,  # type: ignore[call-arg]
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        adopting: set[asyncio.Task[Any]] = set()

        def adopt(conn: socket.socket) -> None:
            task = loop.create_task(loop.connect_accepted_socket(protocol, conn))
            adopting.add(task)  # a reference until it is done
            task.add_done_callback(adopting.discard)

        def hand_over(conn: socket.socket) -> None:
            loop.call_soon_threadsafe(adopt, conn)

        front = FrontDoor(
            listener, self._answers, hand_over, keep_alive=self.config.timeout_keep_alive
        )
        front.start()
        self.front = front

    async def on_tick(self, counter: int) -> bool:
        if self.front is not None and not self.front.running:
            return True  # it failed (logged): nothing accepts any more
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.front is not None:
            self.front.stop()  # no new connection from here on
        await super().shutdown(sockets)


def _server(app: Any, host: str, port: int, answers: Answers | None) -> uvicorn.Server:
    config = uvicorn.Config(app, **uvicorn_options(host, port))
    return FrontDoorServer(config, answers) if answers else uvicorn.Server(config)


def _bound_port(server: uvicorn.Server) -> int | None:
    """The port ``server`` listens on; None until it does."""
    if isinstance(server, FrontDoorServer):
        front = server.front
        return front.listener.getsockname()[1] if front is not None else None
    return server.servers[0].sockets[0].getsockname()[1] if server.started else None


def run(app: Any, host: str, port: int, answers: Answers | None = None) -> None:
    """Serve ``app`` in the foreground until interrupted (``pion llama proxy``);
    ``answers``: paths the front door answers off the event loop (path → JSON body)."""
    _server(app, host, port, answers).run()


@contextlib.contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, answers: Answers | None = None
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a background thread (real TCP); yield its URL.
    ``answers``: as :func:`run`."""
    server = _server(app, host, port, answers)
    thread = threading.Thread(target=server.run, name="pion-llama-http", daemon=True)
    thread.start()
    while (bound := _bound_port(server)) is None:
        if not thread.is_alive():
            raise RuntimeError("server failed to start")
        threading.Event().wait(0.01)
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(15)


class RequestBody:
    """A request body read up to a limit: ``head`` holds what was read; ``rest``,
    when the body is longer, streams the remainder (never buffered)."""

    def __init__(self, head: bytes, rest: AsyncIterator[bytes] | None) -> None:
        self.head = head
        self.rest = rest

    def content(self) -> bytes | AsyncIterator[bytes]:
        if self.rest is None:
            return self.head
        return self._chain(self.head, self.rest)

    @staticmethod
    async def _chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        yield head
        async for chunk in rest:
            yield chunk


async def read_body(request: Request, limit: int) -> RequestBody:
    """Read the body until it passes ``limit`` bytes; a stalled client is cut off
    (:data:`BODY_IDLE_TIMEOUT`)."""
    stream = request.stream().__aiter__()
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), BODY_IDLE_TIMEOUT)
        except StopAsyncIteration:
            return RequestBody(b"".join(parts), None)
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return RequestBody(b"".join(parts), _timed(stream))


async def _timed(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    while True:
        try:
            yield await asyncio.wait_for(stream.__anext__(), BODY_IDLE_TIMEOUT)
        except StopAsyncIteration:
            return
