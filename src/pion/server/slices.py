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

A "turn" is one pass of the loop over its ready callbacks and I/O; :class:`Turns`
numbers them lazily, so a quiet server schedules nothing.
"""

from __future__ import annotations

import asyncio

__all__ = ["CHECK_EVERY", "SLICE_S", "Turns"]

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
