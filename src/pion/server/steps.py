"""Running one :class:`~pion.commands.deferred.Steps` command on the event loop.

Steps run until this connection's slice of the turn is used
(:data:`~pion.server.slices.SLICE_S`), then the next turn goes on, so a long command
costs every other client at most a slice per turn. Chunks a step yields are sent at
once; while the client is behind on reading, no further step runs (the connection
pumps again when it has caught up). The connection owns the socket and the
accounting; this class only orders the work, as :class:`~pion.server.streaming.
StreamSender` does for streamed replies.

Errors: an exception before any chunk was sent, in a step or in encoding the last
part of the reply, is the command's reply (``fail``: the boundary of
``pion.commands.execution``, a ``PionError`` its own error, anything else
``-ERR internal error``); after part of the reply went out the reply cannot be
completed, and the connection is dropped (``done`` with an error).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pion.commands.deferred import Steps
from pion.resp.encoder import Chunks
from pion.resp.reply import Reply
from pion.server.slices import SLICE_S

__all__ = ["StepRunner"]


class StepRunner:
    """One Steps command in progress; :meth:`pump` moves it on."""

    def __init__(
        self,
        steps: Steps,
        *,
        send: Callable[[Chunks, int], None],
        encode: Callable[[Reply], Chunks],
        fail: Callable[[BaseException], Chunks],
        behind: Callable[[], bool],
        alive: Callable[[], bool],
        done: Callable[[str | None, BaseException | None], None],
    ) -> None:
        self._run = steps.run
        self._send = send
        self._encode = encode
        self._fail = fail
        self._behind = behind
        self._alive = alive
        self._done = done
        self._sent = False
        self._scheduled = False
        self._finished = False

    def pump(self) -> None:
        """Run steps for one slice of this turn, then schedule the next turn."""
        if self._finished or self._scheduled:
            return
        if not self._alive():
            self._finish(None)
            return
        deadline = time.perf_counter() + SLICE_S
        while not self._behind():
            last = False
            try:
                try:
                    chunks = next(self._run)
                except StopIteration as stop:
                    chunks, last = self._encode(stop.value), True
            except Exception as exc:  # the command's error boundary, encoding included
                if self._sent:
                    self._finish(repr(exc), exc)
                else:
                    self._emit(self._fail(exc))
                    self._finish(None)
                return
            self._emit(chunks)
            if last:
                self._finish(None)
                return
            if time.perf_counter() >= deadline:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._next_turn)
                return

    def _next_turn(self) -> None:
        self._scheduled = False
        self.pump()

    def _emit(self, chunks: Chunks) -> None:
        if chunks:
            self._sent = True
            self._send(
                chunks, sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in chunks)
            )

    def _finish(self, error: str | None, exc: BaseException | None = None) -> None:
        if not self._finished:
            self._finished = True
            self._run.close()
            self._done(error if self._alive() else None, exc)
