"""Sending one streamed reply (``pion.commands.deferred.Stream``): its framing and its
pieces in wire order, up to :data:`STREAM_DEPTH` pieces being computed at once on
worker threads, and no piece started while the client is behind on reading.

The connection owns the socket, the reply accounting and the decision that the client
is behind; this class only orders the work. A piece that is ready waits in the queue
until every part before it has been sent, so the bytes leave exactly in the order
``stream_parts`` lays them out, whatever order the threads finish in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from functools import partial

from pion.commands.deferred import Awaiting, Piece, Stream
from pion.resp.encoder import Chunks
from pion.server.offload import Offloader, piece_bytes, stream_parts

__all__ = ["STREAM_DEPTH", "StreamSender"]

log = logging.getLogger("pion.server")

# Pieces of one reply computed at once: two lets one be decoded while the previous one
# is, on another core (with one, decoding a layer and the client reading the previous
# one were the only overlap). Each is at most DECODE_CHUNK_BYTES of output.
STREAM_DEPTH = 2


class _Part:
    """A part of the reply in wire order: framing (ready at once) or a piece."""

    __slots__ = ("data", "index", "ready")

    def __init__(self, data: bytes | memoryview | None, index: int = -1) -> None:
        self.data = data
        self.index = index  # the bulk a piece belongs to; -1 for framing
        self.ready = data is not None


class StreamSender:
    """One streamed reply being sent; :meth:`pump` moves it on."""

    def __init__(
        self,
        stream: Stream,
        proto: int,
        offload: Offloader,
        *,
        send: Callable[[Chunks, int], None],
        behind: Callable[[], bool],
        alive: Callable[[], bool],
        done: Callable[[str | None, BaseException | None], None],
    ) -> None:
        self._parts = stream_parts(stream, proto)
        # The bytes each bulk still owes: its pieces must add up to its declared size.
        self._owed = [0 if item is None else item.nbytes for item in stream.items]
        self._offload = offload
        self._send = send
        self._behind = behind
        self._alive = alive
        self._done = done
        self._queue: deque[_Part] = deque()
        self._computing = 0
        self._exhausted = False
        self._finished = False

    def pump(self) -> None:
        """Send what is ready at the head of the queue, start pieces while fewer than
        STREAM_DEPTH are computing and the client keeps up, and report the end."""
        if self._finished:
            return
        if not self._alive():
            self._finish(None)
            return
        self._flush()
        while not self._exhausted and self._computing < STREAM_DEPTH and not self._behind():
            part = next(self._parts, None)
            if part is None:
                self._exhausted = True
            elif isinstance(part, bytes):
                self._queue.append(_Part(part))
            else:
                index, compute = part
                entry = _Part(None, index)
                self._queue.append(entry)
                self._computing += 1
                if isinstance(compute, Awaiting):
                    # Counted as computing (it holds its place in STREAM_DEPTH) but given
                    # to a worker only once what it needs has arrived.
                    compute.ready(
                        partial(self._arrived, asyncio.get_running_loop(), entry, compute)
                    )
                else:
                    self._submit(entry, compute)
        self._flush()
        if self._exhausted and not self._queue and not self._computing:
            owed = [n for n in self._owed if n]
            self._finish(f"pieces short by {owed} bytes" if owed else None)

    def _submit(self, entry: _Part, compute: Callable[[], Piece]) -> None:
        if self._finished:  # the reply ended while the piece waited (client gone)
            self._computing -= 1
            return
        self._offload.submit(partial(piece_bytes, compute), partial(self._computed, entry))

    def _arrived(self, loop: asyncio.AbstractEventLoop, entry: _Part, piece: Awaiting) -> None:
        """An awaiting piece can be computed now (called on any thread)."""
        try:
            loop.call_soon_threadsafe(self._submit, entry, piece.compute)
        except RuntimeError:  # the loop closed (shutdown): nobody is sending any more
            log.debug("a streamed piece became ready after the event loop closed")

    def _flush(self) -> None:
        out: Chunks = []
        nbytes = 0
        queue = self._queue
        while queue and queue[0].ready:
            data = queue.popleft().data
            if data is not None:
                out.append(data)
                nbytes += len(data) if isinstance(data, bytes) else data.nbytes
        if out:
            self._send(out, nbytes)

    def _computed(self, entry: _Part, result: memoryview | BaseException) -> None:
        self._computing -= 1
        if self._finished:
            return
        if isinstance(result, BaseException):
            self._finish(repr(result), result)
            return
        self._owed[entry.index] -= result.nbytes
        if self._owed[entry.index] < 0:
            self._finish(f"bulk {entry.index} over-ran its size")
            return
        entry.data = result
        entry.ready = True
        self.pump()

    def _finish(self, error: str | None, exc: BaseException | None = None) -> None:
        """Report the end once: sent in full (``error`` None), the client gone, or a
        failure after the framing went out (the connection must then be dropped)."""
        if not self._finished:
            self._finished = True
            self._queue.clear()
            self._done(error if self._alive() else None, exc)
