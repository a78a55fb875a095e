"""The parts of the fake llama-server (:mod:`support.fake_llama`) that are not its
llama-server rules: the HTTP/1.1 connection (h11 over asyncio streams, one answer at a
time, a read kept pending to notice a client that hangs up), and the records and gates
the tests control it with (:class:`Gate` is thread-safe: a sync test releases it from its
own thread, an async one from its loop).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import h11

MAX_BODY = 64 * 1024 * 1024


class Dropped(Exception):
    """The connection was cut on purpose (an injected failure)."""


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Gate:
    """Stops requests of one endpoint at one point (``start``: the slot claimed, nothing
    computed; ``answer``: computed, the answer (or its first event) not yet sent; ``end``:
    a stream's every event sent, its end not yet) until
    released. Thread-safe: release or wait from the test's thread or loop."""

    def __init__(self, endpoint: str, at: str, skip: int) -> None:
        self.endpoint = endpoint
        self.at = at
        self._skip = skip
        self._lock = threading.Condition()
        self.arrived = 0
        self._open = False
        self._permits = 0
        self._held: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._watchers: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def passage(self) -> None:
        """Called by the server: counts the arrival, waits while the gate is shut."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self.arrived += 1
            self._lock.notify_all()
            for _, wloop, fut in [w for w in self._watchers if w[0] <= self.arrived]:
                wloop.call_soon_threadsafe(_wake, fut)
            self._watchers = [w for w in self._watchers if w[0] > self.arrived]
            if self._skip > 0:
                self._skip -= 1
                return
            if self._open:
                return
            if self._permits > 0:
                self._permits -= 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._held.append((loop, fut))
        await fut

    def release(self, count: int | None = None) -> None:
        """Let ``count`` held (or later) requests through, first come first; all of them
        and every later one when ``count`` is None."""
        with self._lock:
            if count is None:
                self._open = True
                held, self._held = self._held, []
            else:
                live = [h for h in self._held if not h[1].done()]
                held, self._held = live[:count], live[count:]
                self._permits += count - len(held)
        for loop, fut in held:
            loop.call_soon_threadsafe(_wake, fut)

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(1 for _, fut in self._held if not fut.done())

    def wait_arrived(self, n: int = 1, timeout: float = 30.0) -> None:
        """Block until ``n`` requests reached the gate (a safety timeout, not a timing)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.arrived >= n, timeout):
                raise TimeoutError(f"{self.endpoint}: {self.arrived} of {n} arrived")

    async def arrival(self, n: int = 1, timeout: float = 30.0) -> None:
        """Wait in a loop until ``n`` requests reached the gate."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self.arrived >= n:
                return
            self._watchers.append((n, loop, fut))
        await asyncio.wait_for(fut, timeout)


@dataclass
class Failure:
    status: int = 500
    message: str = "injected failure"
    drop: bool = False
    # Streams: cut the connection after this many events (None: fail before answering).
    after_events: int | None = None
    times: int | None = 1


@dataclass
class Record:
    """One request as the fake saw it."""

    endpoint: str
    path: str
    body: Any
    id_slot: int | None = None  # as pinned by the request (None: not pinned)
    slot: int | None = None  # the slot that served it
    n_prompt: int = 0
    cache_n: int = 0
    prompt_n: int = 0
    status: int | None = None  # None: no answer (dropped, cancelled, cut by a restart)
    stream: bool = False
    filename: str | None = None
    cancelled: bool = False
    start: int = 0  # which start of the server (restart() adds one) answered it


@dataclass
class FakeSlot:
    id: int
    n_ctx: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    has_task: bool = False
    t_last_used: int = -1
    last_params: dict[str, Any] = field(default_factory=dict)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Conn:
    """One client connection: its h11 state and the one read that may be in flight."""

    def __init__(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.h11 = conn
        self.reader = reader
        self.writer = writer
        self.pending: asyncio.Task[bytes] | None = None

    def next_read(self) -> asyncio.Task[bytes]:
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.reader.read(65536))
        return self.pending

    def take_read(self) -> bool:
        """Feed a finished read to h11; False when it was the end of the stream."""
        task, self.pending = self.pending, None
        assert task is not None and task.done()
        data = task.result()
        self.h11.receive_data(data)
        return bool(data)

    async def read_request(self) -> tuple[str, str, bytes] | None:
        method = target = ""
        body = bytearray()
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                await self.next_read()
                self.take_read()
            elif isinstance(event, h11.Request):
                method, target = event.method.decode(), event.target.decode()
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise h11.LocalProtocolError("body too large")
            elif isinstance(event, h11.EndOfMessage):
                return method, target, bytes(body)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None


class Responder:
    """Writes one answer on an h11 connection."""

    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        self.conn = conn
        self.writer = writer
        self.record: Record | None = None
        self.cut_after: int | None = None
        self.events = 0

    async def _send(self, *events: Any) -> None:
        for ev in events:
            data = self.conn.send(ev)
            if data:
                self.writer.write(data)
        await self.writer.drain()

    async def json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj, ensure_ascii=False).encode()
        headers = [("content-type", "application/json; charset=utf-8")]
        headers.append(("content-length", str(len(body))))
        self._set_status(status)
        await self._send(h11.Response(status_code=status, headers=headers), h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def start_stream(self) -> None:
        self._set_status(200)
        headers = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
        await self._send(h11.Response(status_code=200, headers=headers))

    async def event(self, data: bytes) -> None:
        if self.cut_after is not None and self.events >= self.cut_after:
            self.drop()
        self.events += 1
        await self._send(h11.Data(data=data))

    async def end_stream(self) -> None:
        await self._send(h11.EndOfMessage())

    def _set_status(self, status: int | None) -> None:
        # Before the bytes go out: a test reads the record as soon as its answer arrives.
        if self.record is not None:
            self.record.status = status

    def drop(self) -> None:
        self._set_status(None)
        self.writer.transport.abort()
        raise Dropped
