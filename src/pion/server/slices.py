"""Fair shares of the event loop: every connection is served in bounded slices.

One event loop serves every client, so whatever one connection's commands cost, every
other client waits for. Two things make that wait long unless it is bounded:

- libuv reads a socket whose data keeps coming up to 32 times in one turn of the loop
  before it looks at any other socket, and we ran every command of every read at once:
  a client pipelining PINGs in megabyte writes held the loop for seconds;
- one command can be long (KEYS over a big keyspace, a 100k-member ZADD).

So a connection gets :data:`SLICE_S` seconds of the loop per turn (measured, not
estimated: commands differ in cost by orders of magnitude; in wall time, which is what
the other clients wait). When it has used them,
it stops: its socket is no longer read, and a callback scheduled for the next turn
picks up where it stopped (``Connection._process``). Every other connection with
something to do gets its own slice in between. A client whose replies are not being
taken is not read at all (the high-water mark in ``connection.py``). Long commands
are cut into steps of the same size (``pion.commands.deferred.Steps``).

Both lanes (``connection.py``, ``binary.py``) keep their slice with one
:class:`Share`.

A "turn" is one pass of the loop over its ready callbacks and I/O; :class:`Turns`
numbers them lazily, so a quiet server schedules nothing.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

__all__ = ["CHECK_EVERY", "SLICE_S", "Share", "Turns"]

# The loop time one connection may use per turn. Small enough that a client waiting
# behind a flood waits about this long per flooding client; large enough that the cost
# of stopping (pausing the socket, a callback, resuming) stays near 1% of the work.
SLICE_S = 0.001
# Commands between two reads of the clock (perf_counter, well under a microsecond):
# cheap per command, and a slice overshoots by at most this many commands.
CHECK_EVERY = 4


class Turns:
    """Counts turns of the event loop: :meth:`current` is the same number for every
    call made before the loop runs its next batch of ready callbacks."""

    def __init__(self) -> None:
        self.number = 0
        self._pending = False

    def current(self) -> int:
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_soon(self._advance)
        return self.number

    def _advance(self) -> None:
        self._pending = False
        self.number += 1


class Share:
    """One connection's slice of the loop: :meth:`begin` before a run of commands,
    :meth:`spent` before each, :meth:`end` after; :meth:`pause` when it is used. The
    clock is first read when a second command is at hand, so a request of one command
    pays nothing for the slices (a slice overshoots by at most one command, plus
    CHECK_EVERY). Without ``turns`` (a connection driven alone, in unit tests) there
    is nobody to share with: no slices."""

    __slots__ = ("_deadline", "_started", "_turn", "_turns", "left", "yielded")

    def __init__(self, turns: Turns | None) -> None:
        self._turns = turns
        self._turn = -1
        self.left = 0.0
        self._started = 0.0
        self._deadline = math.inf
        self.yielded = False  # stopped for this turn: a callback of the next goes on

    def begin(self) -> None:
        turns = self._turns
        if turns is not None:
            turn = turns.current()
            if turn != self._turn:
                self._turn = turn
                self.left = SLICE_S
        self._started = 0.0
        self._deadline = math.inf

    def spent(self, ran: int) -> bool:
        """Whether the slice is used, before the next command (``ran`` ran already in
        this run)."""
        if self._turns is None:
            return False
        if ran == 0:
            return self.left <= 0
        if ran == 1 or ran % CHECK_EVERY == 0:
            return self._over()
        return False

    def due(self, ran: int) -> bool:
        """:meth:`spent` before many commands served in one call (a run of plain GET
        and SET, ``batch.py``): after the first command the clock is read each time."""
        if self._turns is None:
            return False
        return self.left <= 0 if ran == 0 else self._over()

    def _over(self) -> bool:
        now = time.perf_counter()
        if not self._started:
            self._started, self._deadline = now, now + self.left
        return now >= self._deadline

    def end(self) -> None:
        if self._started:
            self.left -= time.perf_counter() - self._started
            self._started = 0.0

    def pause(self, go_on: Callable[[], None]) -> None:
        """The slice is used: ``go_on()`` in the next turn."""
        self.yielded = True
        asyncio.get_running_loop().call_soon(self._next_turn, go_on)

    def _next_turn(self, go_on: Callable[[], None]) -> None:
        self.yielded = False
        go_on()
