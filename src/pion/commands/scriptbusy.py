"""A script that runs long, as Redis 7 defines it: other clients wait while it runs
(it is atomic), until ``busy-reply-threshold`` milliseconds (alias ``lua-time-limit``,
default 5000) have passed since it started; from then on they are answered ``-BUSY``,
except ``SCRIPT KILL`` (which stops a script that has not written) and ``SHUTDOWN``.

How the loop keeps answering (docs/decisions.md, "A script off the loop"): on a live
connection the script runs on its own thread (``Scripts.thread``). Until the threshold
the loop thread stays parked (as Redis, which reads nothing else meanwhile) and the
script's thread runs its calls itself; after it, each ``redis.call`` is handed to the
loop thread (:class:`Channel`), so the stores always have one user at a time. A
script still running at the threshold becomes an
:class:`~pion.commands.deferred.Offload` that waits for it off the loop, and the
dispatcher passes every other client's command through :func:`gate`: a command that
came before the threshold waits (a :class:`~pion.commands.deferred.Wait`) and runs
once the script ends, in arrival order, or is answered BUSY once the threshold has
passed. Where nothing may run in between (inside EXEC) the script runs inline on the
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import cast

from pion.commands.deferred import Deferred, Wait
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.resp.reply import ErrorReply, Reply

__all__ = ["BUSY", "FUNCTION_BUSY", "Channel", "gate"]

BUSY = "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
FUNCTION_BUSY = (
    "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE."
)
# What another client may run while a script is past its threshold.
_ALLOWED = frozenset({"SHUTDOWN"})


def _allowed(cmd: Command, argv: Sequence[bytes]) -> bool:
    if cmd.name in _ALLOWED:
        return True
    if cmd.name == "FUNCTION" and len(argv) == 2:
        return bytes(argv[1]).upper() in (b"KILL", b"STATS")
    return cmd.name == "SCRIPT" and len(argv) == 2 and bytes(argv[1]).upper() == b"KILL"


def gate(
    ctx: Context, cmd: Command, argv: Sequence[bytes], run: Callable[[], Reply | Deferred]
) -> Reply | Deferred | None:
    """None when ``cmd`` may run now; else its wait or its BUSY reply (module
    docstring). ``run`` runs it (checks and all) once it may."""
    scripts = ctx.state.scripts
    busy = scripts.busy if scripts is not None else None
    if busy is None or busy.client_id == ctx.client.id:
        return None
    refusal = ErrorReply(BUSY if busy.function is None else FUNCTION_BUSY)
    if busy.left() <= 0:
        return None if _allowed(cmd, argv) else refusal

    mine: list[Callable[[], None]] = []

    def ready(go: Callable[[], None]) -> None:
        mine.append(go)
        busy.waiters.append(go)

    def cancel() -> None:
        for go in mine:
            if go in busy.waiters:
                busy.waiters.remove(go)

    def expired() -> Reply | Deferred:
        now = ctx.state.scripts
        if now is None or now.busy is not busy or _allowed(cmd, argv):
            return run()
        return refusal

    return Wait(ready, run, expired, busy.left(), cancel)


class Channel:
    """A running script's command calls, and who runs them.

    Until the threshold the loop thread is parked in :meth:`serve_until` (other
    clients could not be served then anyway), so the script's thread runs its calls
    itself: the stores have one user at a time still, and no call waits on a thread
    hand-over. From the threshold on, calls are scheduled onto the loop
    (:meth:`drain`) while the loop serves everyone else."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[list[bytes], int], Reply]):
        self._loop = loop
        self._fn = fn
        self._calls: queue.SimpleQueue[tuple[list[bytes], int] | None] = queue.SimpleQueue()
        # (True, reply) or (False, exception), one per call
        self._replies: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._blocking = True

    def call(self, argv: list[bytes], resp: int) -> Reply:
        """On the script's thread: run ``fn(argv, resp)``, here while the loop thread
        is parked in :meth:`serve_until` (holding the lock, so the loop cannot resume
        mid-call), else on the loop thread (one call at a time: the script waits)."""
        with self._lock:
            if self._blocking:
                return self._fn(argv, resp)
        self._calls.put((argv, resp))
        try:
            self._loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed
            raise PionError("the server is shutting down") from None
        while True:
            try:
                ok, value = self._replies.get(timeout=1.0)
            except queue.Empty:
                if self._loop.is_closed() or not self._loop.is_running():
                    raise PionError("the server is shutting down") from None
                continue
            if ok:
                return cast(Reply, value)
            assert isinstance(value, BaseException)
            raise value

    def drain(self) -> None:
        """On the loop thread: run the calls waiting."""
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._serve(*item)

    def _serve(self, argv: list[bytes], resp: int) -> None:
        try:
            self._replies.put((True, self._fn(argv, resp)))
        except BaseException as exc:  # handed back to the script's thread
            self._replies.put((False, exc))

    def serve_until(self, script: Future[Reply], seconds: float | None) -> bool:
        """On the loop thread: stay parked until the script ends (True) or ``seconds``
        pass (None: no limit); from then on its calls run on the loop."""
        script.add_done_callback(lambda _: self._calls.put(None))
        with contextlib.suppress(queue.Empty):  # only the script's end is put here now
            self._calls.get(timeout=seconds)
        if script.done():
            return True
        with self._lock:  # waits for a call the script's thread is making
            self._blocking = False
        self.drain()
        return script.done()
