"""Worker threads for the number conversions of large commands, and the wire layout of
a streamed reply (``pion.commands.deferred``).

numpy and the compiled codecs (``pion.codecs._quant``) release the GIL while they
convert, so quantizing a stored layer or decoding one to fp32 on a worker thread lets
the event loop go on receiving the client's next command and sending the previous
reply meanwhile, and lets several clients' conversions use several cores. One large
store uses several cores too: its row blocks are the parts of a
:class:`~pion.commands.deferred.Split`, run at once; the command still finishes once,
after its last part, so the client's order is kept. Only the conversion moves: every
change to shared state still happens on the event loop thread (``Offload.finish``), so
the stores stay single-owner.

Not here: which commands offload (their handlers decide, by payload size) and the
ordering of a client's commands (the connection runs one at a time).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import numpy as np

from pion.commands.deferred import Piece, Split, Stream
from pion.wire import bytes_of

__all__ = ["OFFLOAD_THREADS", "Offloader", "piece_bytes", "stream_parts"]

log = logging.getLogger("pion.server")

T = TypeVar("T")

# Worker threads per server process. The conversions are memory-bound numpy loops:
# more threads than cores only adds contention, and past ~8 the memory bus is the
# limit, so the core count, capped at 8.
OFFLOAD_THREADS = min(8, os.cpu_count() or 1)


class Offloader:
    """A pool of worker threads whose results come back on the event loop thread."""

    def __init__(self, threads: int = OFFLOAD_THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pion-offload")
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Work submitted whose ``done`` has not run yet."""
        return self._in_flight

    def submit(self, work: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        """Run ``work()`` on a worker thread, then ``done(result)`` (or ``done(exc)``
        if it raised) on the calling event loop's thread. A :class:`Split` runs its
        parts on as many threads as are free, and is done when the last one is."""
        loop = asyncio.get_running_loop()
        self._in_flight += 1
        if isinstance(work, Split) and len(work.parts) > 1:
            self._submit_parts(loop, work, done)
            return

        def deliver(future: Future[T]) -> None:
            self._in_flight -= 1
            exc = future.exception()
            done(exc if exc is not None else future.result())

        def relay(future: Future[T]) -> None:
            # On the worker thread: hand the outcome to the loop. A loop already
            # closed (shutdown) has nobody left to tell.
            try:
                loop.call_soon_threadsafe(deliver, future)
            except RuntimeError:
                log.debug("offloaded work finished after the event loop closed")

        self._pool.submit(work).add_done_callback(relay)

    def _submit_parts(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Split[T],
        done: Callable[[T | BaseException], None],
    ) -> None:
        # Counted on the loop thread (each part's outcome is relayed there), so no lock.
        # The failure kept is the first part's in order (the lowest rows), whichever
        # thread finished first: the error a store found is the one it would find inline.
        remaining = len(work.parts)
        failure: tuple[int, BaseException] | None = None

        def part_done(index: int, future: Future[object]) -> None:
            nonlocal remaining, failure
            remaining -= 1
            exc = future.exception()
            if exc is not None and (failure is None or index < failure[0]):
                failure = (index, exc)
            if remaining:
                return
            self._in_flight -= 1
            if failure is not None:
                done(failure[1])
                return
            try:
                result = work.result()
            except Exception as exc:
                done(exc)
                return
            done(result)

        def relay(index: int, future: Future[object]) -> None:
            try:
                loop.call_soon_threadsafe(part_done, index, future)
            except RuntimeError:
                log.debug("offloaded work finished after the event loop closed")

        for index, part in enumerate(work.parts):
            self._pool.submit(part).add_done_callback(partial(relay, index))

    async def drain(self, timeout: float) -> None:
        """Wait until no work is in flight (graceful shutdown), at most ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.005)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def piece_bytes(compute: Callable[[], Piece]) -> memoryview:
    """Compute a piece; its bytes as a flat memoryview (no copy of a C-contiguous
    array). Runs on a worker thread."""
    piece = compute()
    if isinstance(piece, np.ndarray):
        return bytes_of(piece)
    return memoryview(piece).cast("B")


def stream_parts(stream: Stream, proto: int) -> Iterator[bytes | tuple[int, Callable[[], Piece]]]:
    """The wire layout of ``stream``: framing as bytes, and each piece of payload as
    ``(bulk_index, compute)`` where the caller runs ``compute`` and sends its bytes."""
    if stream.array:
        yield b"*%d\r\n" % len(stream.items)
    for index, item in enumerate(stream.items):
        if item is None:
            yield b"_\r\n" if proto == 3 else b"$-1\r\n"
            continue
        yield b"$%d\r\n" % item.nbytes
        for piece in item.pieces:
            yield index, piece
        yield b"\r\n"
