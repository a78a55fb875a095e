"""The RESP lane's boundary: where a request becomes reply bytes and exceptions RESP errors.

Checks run in Redis's order: unknown command, authentication, arity, loading, then
whether persistence still accepts writes (the commands that only free space always
pass: ``pion.persistence.stores.FREEING_COMMANDS``). A :class:`PionError` from a handler is the
client's error, answered with its own RESP code. Any other exception, raised by the
handler *or by encoding what it returned*, is a Pion bug: logged once with its
traceback, counted in ``internal_errors`` and answered ``-ERR internal error``, so the
connection, the replies before it in the pipeline and its neighbours live on.

Each command that runs is timed and counted (``pion.commands.stats``: INFO
commandstats and errorstats, SLOWLOG); one refused before running is counted as
rejected.

A handler may return a :data:`~pion.commands.deferred.Deferred` (its number
conversion runs off the event loop); :func:`execute` hands that back to the
connection, and the ``finish`` of an :class:`~pion.commands.deferred.Offload` runs
through :func:`complete`, inside this same boundary.

Inside MULTI a command that passed those checks is queued instead of run
(``pion.commands.transactions``); one refused by them fails the transaction. While
``CLIENT REPLY OFF|SKIP`` silences a client, :func:`execute` runs its commands to the
end here (deferred parts too) and appends nothing (``pion.commands.clientctl``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from pion.commands.clientctl import begin_silent, silenced
from pion.commands.deferred import Deferred, Offload, Steps, Stream
from pion.commands.state import Command, Context
from pion.commands.transactions import IMMEDIATE, queue_command, refused_in_multi, settle
from pion.errors import LoadingError, MisconfError, NoAuthError, PionError
from pion.persistence.stores import FREEING_COMMANDS
from pion.resp.encoder import (
    NULL_BULK,
    SMALL_BULK,
    Chunks,
    encode_error,
    encode_reply,
    encode_simple,
)
from pion.resp.reply import ErrorReply, Reply, Simple

__all__ = ["admit", "complete", "dispatch", "error_reply", "execute"]

log = logging.getLogger("pion.server")

_INTERNAL_ERROR = "ERR internal error"

# Command names as sent (any case) -> upper-case. Bounded, so a client sending random
# names cannot grow it without limit; past the bound names are just decoded each time.
_NAMES: dict[bytes, str] = {}
_NAME_CACHE_SIZE = 1024


def _unknown(ctx: Context, argv: Sequence[bytes]) -> ErrorReply:
    if ctx.client.queued is not None:
        ctx.client.queue_failed = True  # EXEC will answer -EXECABORT
    name = argv[0].decode("utf-8", "replace")[:128]
    # Redis's text: each argument quoted and followed by a space, while under 128
    # characters.
    shown = ""
    for arg in argv[1:]:
        if len(shown) >= 128:
            break
        shown += f"'{arg[: 128 - len(shown)].decode('utf-8', 'replace')}' "
    return ErrorReply(f"ERR unknown command '{name}', with args beginning with: {shown}")


def _internal_error(ctx: Context, name: str, what: str) -> ErrorReply:
    ctx.state.counters.internal_errors += 1
    log.exception("internal error %s %s", what, name)
    return ErrorReply(_INTERNAL_ERROR)


def admit(ctx: Context, cmd: Command, nargs: int | None) -> None:
    """The checks every command passes before its handler runs, whichever lane it
    came by (RESP, or the binary lane's frames): authentication, arity (``nargs``
    arguments after the name; None when the lane's framing fixed them), loading, then
    whether persistence still accepts writes. Raises the error to answer."""
    state = ctx.state
    if state.config.auth_required and not ctx.client.authenticated and "noauth" not in cmd.flags:
        raise NoAuthError()
    if nargs is not None and not cmd.arity_ok(nargs):
        raise PionError(f"wrong number of arguments for '{cmd.name.lower()}' command")
    if state.loading and "loading" not in cmd.flags:
        raise LoadingError()
    # Commands that only free space pass a failing log (it writes their records when
    # it can): removing data is how an operator makes room.
    if "write" in cmd.flags and state.persistence is not None and cmd.name not in FREEING_COMMANDS:
        failure = state.persistence.write_refusal()
        if failure is not None:
            raise MisconfError(failure)


def dispatch(ctx: Context, argv: Sequence[bytes]) -> Reply | Deferred:
    """Run one command; returns a reply value (errors as :class:`ErrorReply`), or the
    handler's :data:`Deferred`."""
    state = ctx.state
    state.counters.total_commands_processed += 1
    raw = argv[0]
    name = _NAMES.get(raw)
    if name is None:
        try:
            name = raw.decode("ascii").upper()
        except UnicodeDecodeError:
            return _unknown(ctx, argv)
        if len(_NAMES) < _NAME_CACHE_SIZE:
            _NAMES[raw] = name
    cmd = ctx.table.get(name)
    if cmd is None:
        return state.stats.unknown(_unknown(ctx, argv))
    return _run(ctx, cmd, argv)


def _run(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> Reply | Deferred:
    """A known command: its checks, then queued (inside MULTI) or run, timed."""
    state = ctx.state
    client = ctx.client
    client.last_command = cmd.name
    try:
        admit(ctx, cmd, len(argv) - 1)
        if client.queued is not None and cmd.name not in IMMEDIATE:
            return queue_command(ctx, cmd, argv)
    except PionError as exc:
        if client.queued is not None:
            return state.stats.rejected(cmd.name, refused_in_multi(ctx, cmd.name, exc))
        return state.stats.rejected(cmd.name, ErrorReply(exc.resp_line()))
    # INFO commandstats and SLOWLOG (pion.commands.stats) time the handler alone.
    started = perf_counter_ns()
    reply: Reply | Deferred
    try:
        reply = cmd.handler(ctx, argv[1:])
    except PionError as exc:
        reply = ErrorReply(exc.resp_line())
    except Exception:
        reply = _internal_error(ctx, cmd.name, "in")
    state.stats.record(cmd.name, argv, reply, started, client)
    return reply


def execute(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int | Deferred:
    """Dispatch one command, append its encoded reply to ``out`` and return the
    reply's size in bytes (what the connection weighs against its high-water mark);
    a :data:`Deferred` is returned as it is, nothing appended.

    Encoding is inside the boundary too: if the reply cannot be encoded, whatever it
    had appended is taken back and ``-ERR internal error`` goes out in its place, so
    the replies before it in ``out`` are kept and the framing stays intact."""
    client = ctx.client
    if client.reply_mode != "on":
        return _silent(ctx, argv, out)
    name = _LANE.get(argv[0])
    if name is not None:
        taken = _fast_lane(ctx, name, argv, out)
        if taken != -1:
            return taken
    reply = dispatch(ctx, argv)
    if isinstance(reply, Offload | Stream | Steps):
        return reply
    return _encode(ctx, argv, reply, out)


def _silent(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int:
    """CLIENT REPLY OFF or SKIP: run the command (its deferred part too), send nothing,
    unless the command switched replies back on."""
    begin_silent(ctx.client)
    reply = dispatch(ctx, argv)
    try:
        value = settle(reply, ctx.client.proto)
    except PionError:
        return 0
    except Exception:
        _internal_error(ctx, argv[0].decode("utf-8", "replace")[:64], "finishing")
        return 0
    if silenced(ctx.client):
        return 0
    return _encode(ctx, argv, value, out)


def complete(
    ctx: Context, argv: Sequence[bytes], offload: Offload[Any], result: object, out: Chunks
) -> int:
    """Run an offloaded command's ``finish`` with its work's ``result`` (or the
    exception the work raised) inside the boundary; append the encoded reply to
    ``out`` and return its size."""
    name = argv[0].decode("utf-8", "replace")[:64]
    try:
        reply = offload.finish(result)
    except PionError as exc:
        reply = ErrorReply(exc.resp_line())
    except Exception:
        reply = _internal_error(ctx, name, "finishing")
    return _encode(ctx, argv, reply, out)


def error_reply(ctx: Context, argv: Sequence[bytes], exc: BaseException) -> ErrorReply:
    """The reply to an exception a command raised after its handler returned (a step
    of a :class:`~pion.commands.deferred.Steps`): the same boundary as above."""
    if isinstance(exc, PionError):
        return ErrorReply(exc.resp_line())
    name = argv[0].decode("utf-8", "replace")[:64] if argv else "?"
    ctx.state.counters.internal_errors += 1
    log.error("internal error in a step of %s", name, exc_info=exc)
    return ErrorReply(_INTERNAL_ERROR)


def _encode(ctx: Context, argv: Sequence[bytes], reply: Reply, out: Chunks) -> int:
    mark = len(out)
    try:
        encode_reply(reply, ctx.client.proto, out)
    except Exception:
        del out[mark:]
        name = argv[0].decode("utf-8", "replace")[:64]
        out.append(encode_error(str(_internal_error(ctx, name, "encoding the reply of"))))
    if len(out) == mark + 1 and type(out[mark]) is bytes:  # one small chunk, usually
        return len(out[mark])
    return sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in out[mark:])


# -- the fast lane -----------------------------------------------------------------
#
# The small commands that dominate a cache's traffic (GET, SET key value, a plain
# KV.PREFIX.LOOKUP, PING) and the brackets of a transaction (MULTI, EXEC: redis-py's
# default pipeline sends them), as the batch scanner hands them over complete, skip
# the name decoding: the table spells them as they arrive, and their reply is encoded
# as one chunk from its type. What they do is unchanged: the same checks, queueing
# inside MULTI and timing (:func:`_run`). Spellings outside the table (mixed case) and
# replies switched off take the generic path.

_LANE_COMMANDS = ("GET", "SET", "KV.PREFIX.LOOKUP", "PING", "MULTI", "EXEC")
_LANE: dict[bytes, str] = {
    spelling: name for name in _LANE_COMMANDS for spelling in (name.encode(), name.lower().encode())
}


def _fast_lane(ctx: Context, name: str, argv: Sequence[bytes], out: Chunks) -> int | Deferred:
    """Run ``argv`` (command ``name``) as :func:`execute` does, its reply encoded as one
    chunk from its type where it can be; -1, nothing done, for an unknown name."""
    cmd = ctx.table.get(name)
    if cmd is None:
        return -1
    ctx.state.counters.total_commands_processed += 1
    reply = _run(ctx, cmd, argv)
    client = ctx.client
    if type(reply) is Simple:
        chunk = encode_simple(reply)
    elif type(reply) is bytes and len(reply) <= SMALL_BULK:
        chunk = b"$%d\r\n%b\r\n" % (len(reply), reply)
    elif reply is None:
        chunk = NULL_BULK[client.proto]
    elif isinstance(reply, Offload | Stream | Steps):  # none of the lane's handlers defers
        return reply
    else:
        return _encode(ctx, argv, reply, out)
    out.append(chunk)
    return len(chunk)
