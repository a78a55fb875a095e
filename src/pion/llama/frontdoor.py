"""The proxy's front door: a thread that owns the listening socket and answers
``GET /pion/status`` itself, off the event loop.

Why: the proxy's one event loop takes every request through its steps (accept, parse,
fingerprint, lease), and a burst of hundreds of requests makes single loop turns of
100 ms and more: the whole backlog accepted in one callback (libuv accepts until it is
empty), then turns made of hundreds of the requests' steps, none of them long. An answer
on the loop waited behind a whole turn (bench/llama_status.py). The front door does not
wait on the loop: while the loop runs Python code, another thread takes the GIL within
``sys.getswitchinterval()`` (5 ms).

What it does, and nothing more (everything else stays uvicorn's):

- accept each connection and wait (:data:`FIRST_BYTES_WAIT`) for its first bytes;
- peek at them (``MSG_PEEK``: nothing consumed). A complete head of ``GET
  /pion/status`` without a body (:func:`fast_request`) is read, answered with the JSON
  of its handler, and the connection kept for the next request (keep-alive, closed when
  idle for ``keep_alive`` seconds);
- anything else (another path, a head not complete yet, a body, a connection that sent
  nothing yet) is handed to the event loop unread (``hand_over``): uvicorn reads it from
  its first byte, with its own limits (:class:`~pion.llama.httpserver.TimedH11Protocol`).

:func:`fast_request` is sans-IO (bytes in, a decision out) and strict: anything it does
not recognise at once goes to uvicorn, which answers it as before (400s included).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["FIRST_BYTES_WAIT", "MAX_HEAD", "FastRequest", "FrontDoor", "fast_request"]

# Bytes peeked for a request head: a status request's head is a few hundred bytes; a
# longer one goes to uvicorn (h11 allows heads of up to 64 KiB).
MAX_HEAD = 8192
# Seconds a new connection may stay silent before it is handed to uvicorn, whose header
# timeout then runs (a client sends its request as soon as it is connected).
FIRST_BYTES_WAIT = 0.25
# Seconds a status answer may wait for room in the socket's send buffer (a client that
# does not read is closed).
SEND_TIMEOUT = 5.0

# Request headers that make a request more than a head: uvicorn reads those.
_BODY_HEADERS = frozenset({b"content-length", b"transfer-encoding", b"expect", b"upgrade"})

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FastRequest:
    """A head the front door answers: ``size`` bytes long, for ``path``."""

    path: str
    size: int
    keep_alive: bool


def fast_request(data: bytes, paths: frozenset[str]) -> FastRequest | None:
    """The request at the start of ``data`` when it is a complete ``GET`` of one of
    ``paths`` (a query string allowed) without a body; None for anything else."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    try:
        path = parts[1].split(b"?", 1)[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    if path not in paths:
        return None
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or name[:1].isspace():
            return None  # malformed or folded: uvicorn's 400
        headers[name.lower()] = value.strip().lower()
    if _BODY_HEADERS & headers.keys() or (parts[2] == b"HTTP/1.1" and b"host" not in headers):
        return None
    connection = headers.get(b"connection", b"")
    keep_alive = connection == b"keep-alive" if parts[2] == b"HTTP/1.0" else connection != b"close"
    return FastRequest(path, end + 4, keep_alive)


def _response(body: bytes, keep_alive: bool) -> bytes:
    # What uvicorn sends for a JSONResponse with the proxy's options (no Server, no Date).
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\ncontent-type: application/json\r\n" % len(
        body
    )
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


class FrontDoor:
    """Accepts on ``listener``, answers the requests of ``answers`` (path → a function
    that returns the JSON body, called in this thread) and hands every other connection
    to ``hand_over`` (called in this thread: it must only schedule work on the loop)."""

    def __init__(
        self,
        listener: socket.socket,
        answers: Mapping[str, Callable[[], bytes]],
        hand_over: Callable[[socket.socket], None],
        *,
        keep_alive: float,
    ) -> None:
        self.listener = listener
        self._answers = dict(answers)
        self._paths = frozenset(answers)
        self._hand_over = hand_over
        self._keep_alive = keep_alive
        self._selector = selectors.DefaultSelector()
        # Connections held here → (when they go, whether they are new: handed to uvicorn
        # then; else idle after an answer: closed then).
        self._held: dict[socket.socket, tuple[float, bool]] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pion-llama-front", daemon=True)

    def start(self) -> None:
        self.listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop accepting; close the listener and the connections held here. Waits for
        the thread (an answer being written is finished first)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(SEND_TIMEOUT + 5.0)

    def _run(self) -> None:
        try:
            while not self._stopping:
                deadlines = (deadline for deadline, _new in self._held.values())
                timeout = min(deadlines, default=time.monotonic() + 1.0)
                ready = self._selector.select(max(0.0, timeout - time.monotonic()))
                for key, _events in ready:
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        self._serve(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        except Exception:
            # Never expected. Nobody would accept on the port any more: logged, and the
            # server stops (:attr:`running`), rather than hang every client.
            _log.exception("the front door failed: the proxy stops")
            raise
        finally:
            for conn in list(self._held):
                self._drop(conn)
            self._selector.close()
            self.listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the backlog keeps them meanwhile
                _log.warning("accept failed: %s", exc)
                time.sleep(0.05)
                return
            conn.setblocking(False)
            self._hold(conn, FIRST_BYTES_WAIT, new=True)

    def _hold(self, conn: socket.socket, seconds: float, *, new: bool) -> None:
        self._held[conn] = (time.monotonic() + seconds, new)
        self._selector.register(conn, selectors.EVENT_READ)

    def _release(self, conn: socket.socket) -> None:
        del self._held[conn]
        self._selector.unregister(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._release(conn)
        conn.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, (deadline, new) in list(self._held.items()):
            if deadline > now:
                continue
            if new:
                self._release(conn)
                self._give(conn)
            else:
                self._drop(conn)  # an idle keep-alive connection, as uvicorn closes one

    def _give(self, conn: socket.socket) -> None:
        try:
            self._hand_over(conn)
        except Exception:  # the loop is gone (shutting down)
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(MAX_HEAD, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)  # the client closed it
            return
        request = fast_request(data, self._paths)
        self._release(conn)
        body = self._answer(request) if request is not None else None
        if request is None or body is None:
            self._give(conn)  # unread: uvicorn answers it from its first byte
            return
        try:
            conn.recv(request.size)  # peeked: all there
            conn.settimeout(SEND_TIMEOUT)
            conn.sendall(_response(body, request.keep_alive))
            conn.setblocking(False)
        except OSError:  # the client is gone, or does not read
            conn.close()
            return
        if request.keep_alive:
            self._hold(conn, self._keep_alive, new=False)
        else:
            conn.close()

    def _answer(self, request: FastRequest) -> bytes | None:
        """The handler's body; None when it failed (logged): the request then goes to
        uvicorn, whose app answers it (a 500 if it fails there too)."""
        try:
            return self._answers[request.path]()
        except Exception:
            _log.exception("the front door's answer to %s failed", request.path)
            return None
