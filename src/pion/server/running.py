"""Running a connection's deferred command (``pion.commands.deferred``) while the
loop goes on serving everyone else: the one place each kind of result is run on a
live connection.

- an :class:`~pion.commands.deferred.Offload` goes to the worker pool
  (``offload.py``), its ``finish`` back on the loop;
- a :class:`~pion.commands.deferred.Stream` is sent piece by piece
  (``streaming.py``);
- :class:`~pion.commands.deferred.Steps` run a slice of the loop per turn
  (``steps.py``);
- a :class:`~pion.commands.deferred.Wait` waits, its ``then`` run once what it waits
  for has come (or ``expired`` once its time is out), and whatever that returns is
  run the same way in turn.

Every failure goes through the boundary of ``pion.commands.execution`` and becomes
the command's reply; only a reply broken after its first bytes went out (a streamed
piece that fails, a step after others were sent) cannot be completed, and then the
connection is dropped, the failure logged and counted. A silenced client's command
(``CLIENT REPLY OFF``) runs exactly the same way, its bytes dropped here.

The connection runs one deferred command at a time and owns the socket and the
accounting; it hands this class ``send``, ``behind`` and ``alive``, and hears back
through ``finished`` (the reply is handed on: the next command may start) and
``broken``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pion.commands.deferred import Deferred, Offload, Steps, Stream, Wait
from pion.commands.execution import (
    DEFERRED,
    command_name,
    encode,
    finish,
    resume,
    settle,
    step_failed,
)
from pion.commands.state import Context
from pion.errors import PionError
from pion.resp.encoder import Chunks, encode_reply
from pion.resp.reply import ErrorReply, Reply
from pion.server.offload import Offloader
from pion.server.steps import StepRunner
from pion.server.streaming import StreamSender

__all__ = ["Running"]

log = logging.getLogger("pion.server")


@dataclass(slots=True)
class _Waiting:
    """A wait in progress: over once woken, timed out or dropped."""

    wait: Wait
    over: bool = False
    timer: asyncio.TimerHandle | None = field(default=None)


class Running:
    """The deferred command of one connection, while there is one (:attr:`busy`)."""

    def __init__(
        self,
        ctx: Context,
        offload: Offloader | None,
        *,
        send: Callable[[Chunks, int], None],
        behind: Callable[[], bool],
        alive: Callable[[], bool],
        finished: Callable[[], None],
        broken: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        self._offload = offload
        self._send = send
        self._behind = behind
        self._alive = alive
        self._finished = finished
        self._broken = broken
        self.busy = False
        self.argv: Sequence[bytes] = ()
        self.nbytes = 0  # its arguments' size, counted as the client's query buffer
        self._silent = False
        self._active: StreamSender | StepRunner | None = None
        self._waiting: _Waiting | None = None

    def start(self, argv: Sequence[bytes], result: Deferred, *, silent: bool) -> None:
        """Run ``result``, the deferred reply of command ``argv``."""
        self.busy = True
        self.argv = argv
        self.nbytes = sum(len(arg) for arg in argv)
        self._silent = silent
        self._run(result)

    def pump(self) -> None:
        """The client caught up on reading: a stream or steps go on."""
        if self._active is not None:
            self._active.pump()

    def drop(self) -> None:
        """The client is gone: a wait ends here (work under way ends by itself)."""
        waiting = self._waiting
        if waiting is not None and not waiting.over:
            self._end_wait(waiting)
            waiting.wait.cancel()
            self._end()

    # -- each kind of result ----------------------------------------------------------

    def _run(self, result: Reply | Deferred) -> None:
        ctx, argv = self._ctx, self.argv
        if not isinstance(result, DEFERRED):
            self._reply(result)
        elif isinstance(result, Steps):
            self._active = StepRunner(
                result,
                send=self._emit,
                encode=self._encode,
                fail=lambda exc: self._encode(step_failed(ctx, argv, exc)),
                behind=self._behind,
                alive=self._alive,
                done=self._streamed,
            )
            self._active.pump()
        elif isinstance(result, Wait):
            self._wait(result)
        elif self._offload is None:
            self._reply(settle(ctx, argv, result))  # no worker pool (unit tests)
        elif isinstance(result, Offload):
            ctx.state.counters.offloaded_commands += 1
            self._offload.submit(result.work, partial(self._worked, result))
        else:
            self._stream(result, self._offload)

    def _stream(self, stream: Stream, offload: Offloader) -> None:
        self._ctx.state.counters.offloaded_commands += 1
        self._active = StreamSender(
            stream,
            self._ctx.client.proto,
            offload,
            send=self._emit,
            behind=self._behind,
            alive=self._alive,
            done=self._streamed,
        )
        self._active.pump()

    def _worked(self, offload: Offload[Any], result: object) -> None:
        """The work is done: finish it (its state change happens now, whether or not
        its client is still there) and reply."""
        self._run(finish(self._ctx, self.argv, offload, result))

    def _wait(self, wait: Wait) -> None:
        loop = asyncio.get_running_loop()
        waiting = self._waiting = _Waiting(wait)

        def go() -> None:  # any thread
            try:
                loop.call_soon_threadsafe(self._woke, waiting, True)
            except RuntimeError:  # the loop closed (shutdown): nobody waits any more
                log.debug("a wait ended after the event loop closed")

        if wait.timeout is not None:
            waiting.timer = loop.call_later(wait.timeout, self._woke, waiting, False)
        try:
            wait.ready(go)
        except Exception as exc:
            self._end_wait(waiting)
            self._reply(step_failed(self._ctx, self.argv, exc))

    def _woke(self, waiting: _Waiting, came: bool) -> None:
        if waiting.over:
            return  # already woken, timed out, or its client gone
        self._end_wait(waiting)
        if not came:
            waiting.wait.cancel()
        self._run(resume(self._ctx, self.argv, waiting.wait, came))

    def _end_wait(self, waiting: _Waiting) -> None:
        waiting.over = True
        if waiting.timer is not None:
            waiting.timer.cancel()
        self._waiting = None

    # -- the reply ----------------------------------------------------------------------

    def _encode(self, reply: Reply) -> Chunks:
        out: Chunks = []
        encode_reply(reply, self._ctx.client.proto, out)
        return out

    def _emit(self, chunks: Chunks, nbytes: int) -> None:
        if not self._silent and self._alive():
            self._send(chunks, nbytes)

    def _reply(self, reply: Reply) -> None:
        out: Chunks = []
        nbytes = encode(self._ctx, self.argv, reply, out)
        self._emit(out, nbytes)
        self._end()

    def _streamed(self, error: str | None, exc: BaseException | None) -> None:
        """A stream or steps ended: sent in full, or the client gone, or (``error``)
        broken after its first bytes went out: the reply cannot be completed, so the
        connection is dropped. A :class:`PionError` (the tier failing under a streamed
        fill) is the command's own failure, logged as such; anything else is a Pion
        bug, logged once with its traceback and counted."""
        if error is not None:
            ctx, name = self._ctx, command_name(self.argv)
            if isinstance(exc, PionError):
                log.warning("%s failed after its reply began (%s): connection closed", name, error)
                ctx.state.stats.failed_later(name, ErrorReply(exc.resp_line()))
            else:
                ctx.state.counters.internal_errors += 1
                ctx.state.stats.failed_later(name, ErrorReply("ERR internal error"))
                log.error("internal error streaming the reply of %s: %s", name, error, exc_info=exc)
            self._broken()
        self._end()

    def _end(self) -> None:
        self.busy = False
        self.argv = ()
        self.nbytes = 0
        self._active = None
        self._finished()
