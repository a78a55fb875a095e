"""Where a command runs: the one error boundary, and the one place a deferred result
(``pion.commands.deferred``) is run to its end where nothing else may run meanwhile.

Every command on every path (the RESP lane, the binary lane, EXEC, a silenced
client's, a script's) runs its handler through :func:`call`: timed and counted (INFO
commandstats and errorstats, SLOWLOG: ``pion.commands.stats``), a
:class:`~pion.errors.PionError` answered with its own code, any other exception a
Pion bug, logged once with its traceback, counted in ``internal_errors`` and answered
``-ERR internal error``. A handler that needs data on its way (a tier fill reading,
:class:`~pion.errors.NotYet`) becomes a :class:`~pion.commands.deferred.Wait` that
runs it again once the data has come. An exception raised after the handler returned (an offloaded
``finish``, a step, a wait's ``then``, encoding the reply) goes through
:func:`failed`, the same conversion, and is counted as that command's failure. A
failure is always a reply, so the replies before it and the connection live on; the
one exception is a streamed reply that breaks after its first bytes went out, which
cannot be completed (``pion.server.running``).

How a deferred result runs depends on where: on a live connection,
``pion.server.running`` runs it off the loop, in slices, or after its wait, while
other clients go on; where nothing may run in between (inside EXEC, a connection with
no worker pool) :func:`settle` runs it here, on the calling thread. The result is the
same bytes either way. A :class:`~pion.commands.deferred.Wait` settled here does not
wait: it is answered as if its time ran out unless what it waits for is already
there (Redis answers a blocking command inside MULTI the same way).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter_ns
from typing import TypeVar

from pion.commands.chunked import run_now
from pion.commands.deferred import Deferred, LazyBulk, Offload, Steps, Stream, Wait
from pion.commands.state import Command, Context
from pion.errors import NotYet, PionError
from pion.resp.encoder import Chunks, encode_error, encode_reply
from pion.resp.reply import Encoded, ErrorReply, Reply

__all__ = [
    "DEFERRED",
    "INTERNAL_ERROR",
    "call",
    "command_name",
    "encode",
    "failed",
    "finish",
    "resume",
    "settle",
    "timed",
]

log = logging.getLogger("pion.server")

T = TypeVar("T")

INTERNAL_ERROR = "ERR internal error"

# What a handler returns when part of its work is left to the caller.
DEFERRED = (Offload, Stream, Steps, Wait)


def command_name(argv: Sequence[bytes]) -> str:
    """The command's name as sent, for logs and the stats of a later failure."""
    return argv[0].decode("utf-8", "replace")[:64].upper() if argv else "?"


def failed(ctx: Context, name: str, exc: BaseException, where: str = "in") -> ErrorReply:
    """The reply to an exception of command ``name``: its own error for a PionError,
    else ``-ERR internal error``, the bug logged once and counted."""
    if isinstance(exc, PionError):
        return ErrorReply(exc.resp_line())
    ctx.state.counters.internal_errors += 1
    log.error("internal error %s %s", where, name, exc_info=exc)
    return ErrorReply(INTERNAL_ERROR)


def call(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> Reply | Deferred:
    """Run ``cmd``'s handler on ``argv`` (checks already passed), timed and counted;
    its exceptions become its reply."""
    client = ctx.client
    client.last_command = cmd.name
    state = ctx.state
    state.keyspace = state.databases.all[client.db]
    if state.vstore.maxmemory and "write" in cmd.flags:
        state.memory.begin(argv)  # what eviction spares, and counts once (budget.py)
    # INFO commandstats and SLOWLOG (pion.commands.stats) time the handler alone.
    started = perf_counter_ns()
    reply: Reply | Deferred
    try:
        reply = cmd.handler(ctx, argv[1:])
    except PionError as exc:
        reply = ErrorReply(exc.resp_line())
    except NotYet as pending:
        # Data on its way: wait for it off the loop, then run the command again
        # (counted once, when it runs to its reply).
        again = partial(call, ctx, cmd, argv)
        return Wait(pending.ready, again, again)
    except Exception as exc:
        reply = failed(ctx, cmd.name, exc)
    state.stats.record(cmd.name, argv, reply, started, client)
    return reply


def timed(ctx: Context, name: str, argv: Sequence[bytes], run: Callable[[], T]) -> T | ErrorReply:
    """:func:`call` for work that is not a table handler (the binary lane's query,
    framed without RESP arguments): ``run()`` timed and counted as command ``name``."""
    ctx.client.last_command = name
    started = perf_counter_ns()
    result: T | ErrorReply
    try:
        result = run()
    except PionError as exc:
        result = ErrorReply(exc.resp_line())
    except Exception as exc:
        result = failed(ctx, name, exc)
    ctx.state.stats.record(name, argv, result, started, ctx.client)
    return result


def _later(ctx: Context, argv: Sequence[bytes], exc: BaseException, where: str) -> ErrorReply:
    """A failure after the handler returned: the reply, counted as the command's."""
    name = command_name(argv)
    reply = failed(ctx, name, exc, where)
    ctx.state.stats.failed_later(name, reply)
    return reply


def finish(ctx: Context, argv: Sequence[bytes], offload: Offload[object], result: object) -> Reply:
    """An offloaded command's ``finish`` with its work's ``result`` (or the exception
    the work raised), on the loop thread, inside the boundary."""
    try:
        return offload.finish(result)
    except Exception as exc:
        return _later(ctx, argv, exc, "finishing")


def resume(ctx: Context, argv: Sequence[bytes], wait: Wait, came: bool) -> Reply | Deferred:
    """A wait is over: ``then()`` when what it waited for came, else ``expired()``."""
    try:
        return wait.then() if came else wait.expired()
    except Exception as exc:
        return _later(ctx, argv, exc, "resuming")


def step_failed(ctx: Context, argv: Sequence[bytes], exc: BaseException) -> ErrorReply:
    """A step (or a streamed piece) raised before any byte of the reply went out."""
    return _later(ctx, argv, exc, "in a step of")


def encode(ctx: Context, argv: Sequence[bytes], reply: Reply, out: Chunks) -> int:
    """Append ``reply`` encoded for the client to ``out``; its size in bytes. A reply
    that cannot be encoded is taken back and ``-ERR internal error`` goes out in its
    place, so the replies before it in ``out`` are kept and the framing stays intact."""
    mark = len(out)
    try:
        encode_reply(reply, ctx.client.proto, out)
    except Exception as exc:
        del out[mark:]
        out.append(encode_error(str(_later(ctx, argv, exc, "encoding the reply of"))))
    if len(out) == mark + 1 and type(out[mark]) is bytes:  # one small chunk, usually
        return len(out[mark])
    return sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in out[mark:])


def settle(ctx: Context, argv: Sequence[bytes], result: Reply | Deferred) -> Reply:
    """``result`` run to its end here (module docstring); failures are replies."""
    while isinstance(result, DEFERRED):
        try:
            result = _settle_one(ctx, argv, result)
        except Exception as exc:
            return _later(ctx, argv, exc, "in")
    return result


def _settle_one(ctx: Context, argv: Sequence[bytes], result: Deferred) -> Reply | Deferred:
    if isinstance(result, Steps):
        return Encoded(b"".join(run_now(result, ctx.client.proto)))
    if isinstance(result, Offload):
        try:
            done: object = result.work()
        except Exception as exc:
            done = exc
        return finish(ctx, argv, result, done)
    if isinstance(result, Stream):
        items: list[Reply] = [None if b is None else _join(b) for b in result.items]
        return items if result.array else items[0]
    came = threading.Event()
    result.ready(came.set)  # what it waits for may be there already: go() at once
    if not came.is_set():
        result.cancel()
    return resume(ctx, argv, result, came.is_set())


def _join(bulk: LazyBulk) -> bytes:
    return b"".join(memoryview(piece()).cast("B").tobytes() for piece in bulk.pieces)
