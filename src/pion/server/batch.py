"""A connection's run of the commands a cache pipelines, served from what its decoder
parsed ahead, without the per-command loop of ``connection.py``.

Before it takes the next command, the connection hands the commands its decoder
parsed ahead (:attr:`pion.resp.decoder.RequestDecoder.ready`, next last) to
:func:`serve`, when the next is one of these (:data:`HEADS`):

- plain ``GET`` and ``SET``: a run of them in one call (``pion.commands.plain``), or,
  inside MULTI, queued as the dispatcher queues them;
- a plain ``KV.PREFIX.LOOKUP ns`` (no tier to ask first): a run of them
  (``pion.commands.prefix.serve_lookups``);
- a transaction of plain GET and SET that arrived whole (MULTI to EXEC parsed
  already): answered as a whole (``pion.commands.transactions.serve_whole``);
- otherwise ``MULTI`` and ``EXEC`` (of a transaction that holds only plain GET and
  SET, whose reply is small), each through the one boundary,
  :func:`pion.commands.execution.call`, as the lane runs them.

What the lane checks before a command (``dispatch.checked``) holds for a whole run
here, asked once per call (:func:`pion.commands.plain.allowed`); anything else, and
any of these commands in another state (a MULTI inside MULTI, an EXEC without one, a
LOOKUP with options), is left where it is, for the connection to run as before. A call
serves about :data:`BATCH` commands (a whole transaction may take it past by its
own): the connection reads the clock between calls (its slice of the loop), and this
many take well under a slice.
"""

from __future__ import annotations

from typing import cast

from pion.commands.blocking import serve as serve_blocked
from pion.commands.execution import DEFERRED, call, settle
from pion.commands.plain import GETS, KINDS, PLAIN, allowed, plain_argv, queue
from pion.commands.plain import serve as serve_plain
from pion.commands.prefix import LOOKUPS, serve_lookups
from pion.commands.state import Context
from pion.commands.transactions import MAX_QUEUED, MAX_QUEUED_BYTES, serve_whole
from pion.resp.encoder import Chunks
from pion.server.lane import append_reply

__all__ = ["BATCH", "HEADS", "NO_RUNS", "NO_WRITES", "READS", "serve"]

BATCH = 64
# The most commands an EXEC served here may run (its reply then stays one chunk).
_EXEC_MAX = 1024

_MULTI = (b"MULTI", b"multi")
_EXEC = (b"EXEC", b"exec")
_QUEUED = b"+QUEUED\r\n"


# What may start a run, by name: every head, and once writes were declined (below).
HEADS = PLAIN | frozenset(_MULTI + _EXEC + LOOKUPS)
READS = frozenset(GETS + LOOKUPS)
# What serve() answers when no run may take the next command, nor any like it until a
# command outside the lane runs (the states plain.allowed reads change only by such
# commands, or between turns of the loop): a write (a log record to build, say, and
# so MULTI and EXEC of writes), or anything at all (the client owes AUTH, say).
NO_WRITES = (0, -1)
NO_RUNS = (0, -2)


def serve(ctx: Context, ready: list[list[bytes]], out: Chunks, max_bytes: int) -> tuple[int, int]:
    """Serve commands from the end of ``ready`` for ``ctx``'s client, their replies
    appended to ``out``, until one is left to the connection, :data:`BATCH` ran, or
    the replies passed ``max_bytes``: ``(commands served, reply bytes)``."""
    if ready[-1][0] not in READS and ctx.state.databases.all[ctx.client.db].journal:
        return NO_WRITES  # a write to log: at once, without asking the rest
    gets, sets = allowed(ctx)
    if not gets:
        return NO_RUNS
    client = ctx.client
    ran = nbytes = 0
    while ready and ran < BATCH and nbytes <= max_bytes:
        head = ready[-1][0]
        if not sets and head not in READS:
            # A SET no run may take (a log record to build, say), and so MULTI and
            # EXEC of them: the lane runs them for less than a run's checks.
            return (ran, nbytes) if ran else NO_WRITES
        if head in LOOKUPS and client.queued is None:
            done, size = serve_lookups(ctx, ready, out, BATCH - ran)
        elif head in _MULTI and client.queued is None:
            done, size = serve_whole(ctx, ready, out, sets)  # the transaction, if all here
            if not done:
                size = _called(ctx, ready, out)
                done = 1 if size else 0
        elif head not in PLAIN:
            size = _called(ctx, ready, out)
            done = 1 if size else 0
        elif client.queued is None:
            done, size = serve_plain(
                ctx, ready, out, may_set=sets, max_cmds=BATCH - ran, max_bytes=max_bytes - nbytes
            )
        elif plain_argv(ready[-1], sets):
            done, size = _queue(ctx, ready, sets, BATCH - ran)
            out += [_QUEUED] * done
        else:
            done = 0
        if not done:
            break
        ran += done
        nbytes += size
    return ran, nbytes


def _queue(ctx: Context, ready: list[list[bytes]], sets: bool, limit: int) -> tuple[int, int]:
    """Inside MULTI: queue plain GET and SET as ``dispatch.checked`` queues them
    (``plain.queue``), within the bounds of ``transactions.queue_command`` (past them,
    the lane answers its error)."""
    client = ctx.client
    queued = client.queued
    assert queued is not None
    table = ctx.table
    done, nbytes, last = queue(
        ready,
        queued,
        table["GET"],
        table["SET"],
        sets,
        min(limit, MAX_QUEUED - len(queued)),
        MAX_QUEUED_BYTES - client.queued_bytes,
    )
    if done:
        client.queued_bytes += nbytes
        client.last_command = KINDS[last]
        ctx.state.counters.total_commands_processed += done
    return done, done * len(_QUEUED)


def _called(ctx: Context, ready: list[list[bytes]], out: Chunks) -> int:
    """MULTI, or a small EXEC of plain commands, through the boundary: its reply's
    size, or 0 when the next command is not one of them."""
    argv = ready[-1]
    state = ctx.state
    queued = ctx.client.queued
    name, n = argv[0], len(argv)
    table = ctx.table
    if n == 1 and name in _MULTI and queued is None:
        cmd = table["MULTI"]
    elif n == 1 and name in _EXEC and queued is not None and _plain_only(ctx):
        cmd = table["EXEC"]
    else:
        return 0
    ready.pop()
    state.counters.total_commands_processed += 1
    reply = call(ctx, cmd, argv)
    if isinstance(reply, DEFERRED):  # none of them defers (_plain_only); if one did,
        reply = settle(ctx, argv, reply)  # it runs to its end here, as inside EXEC
    size = cast(int, append_reply(ctx, argv, reply, out))
    if state.databases.alarm:
        serve_blocked(state)  # clients blocked on keys it filled (dispatch.execute)
    return size


def _plain_only(ctx: Context) -> bool:
    """The open transaction holds only plain GET and SET, few enough that EXEC's
    reply is one chunk (``chunked.encoded_array``): nothing it runs defers."""
    queued = ctx.client.queued
    if queued is None or len(queued) > _EXEC_MAX:
        return False
    get, set_ = ctx.table["GET"], ctx.table["SET"]
    for cmd, _ in queued:  # noqa: SIM110 - faster than all() over a generator
        if cmd is not get and cmd is not set_:
            return False
    return True
