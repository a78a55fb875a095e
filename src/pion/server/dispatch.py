"""The one place where a request becomes reply bytes and exceptions become RESP errors.

Checks run in Redis's order: unknown command, authentication, arity, loading, then
whether persistence still accepts writes. A :class:`PionError` from a handler is the
client's error, answered with its own RESP code. Any other exception, raised by the
handler *or by encoding what it returned*, is a Pion bug: logged once with its
traceback, counted in ``internal_errors`` and answered ``-ERR internal error``, so the
connection, the replies before it in the pipeline and its neighbours live on.

A handler may return a :data:`~pion.commands.deferred.Deferred` (its number
conversion runs off the event loop); :func:`execute` hands that back to the
connection, and the ``finish`` of an :class:`~pion.commands.deferred.Offload` runs
through :func:`complete`, inside this same boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pion.commands.deferred import Deferred, Offload, Stream
from pion.commands.state import Context
from pion.errors import LoadingError, MisconfError, NoAuthError, PionError
from pion.resp.encoder import (
    NULL_BULK,
    SMALL_BULK,
    Chunks,
    encode_error,
    encode_reply,
    encode_simple,
)
from pion.resp.reply import ErrorReply, Reply, Simple

__all__ = ["complete", "dispatch", "execute"]

log = logging.getLogger("pion.server")

_INTERNAL_ERROR = "ERR internal error"

# Command names as sent (any case) -> upper-case. Bounded, so a client sending random
# names cannot grow it without limit; past the bound names are just decoded each time.
_NAMES: dict[bytes, str] = {}
_NAME_CACHE_SIZE = 1024


def _unknown(argv: Sequence[bytes]) -> ErrorReply:
    name = argv[0].decode("utf-8", "replace")[:128]
    shown = " ".join(f"'{a.decode('utf-8', 'replace')[:128]}'" for a in argv[1:8])
    return ErrorReply(f"ERR unknown command '{name}', with args beginning with: {shown}")


def _internal_error(ctx: Context, name: str, what: str) -> ErrorReply:
    ctx.state.counters.internal_errors += 1
    log.exception("internal error %s %s", what, name)
    return ErrorReply(_INTERNAL_ERROR)


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
            return _unknown(argv)
        if len(_NAMES) < _NAME_CACHE_SIZE:
            _NAMES[raw] = name
    cmd = ctx.table.get(name)
    if cmd is None:
        return _unknown(argv)
    ctx.client.last_command = cmd.name
    try:
        if (
            state.config.auth_required
            and not ctx.client.authenticated
            and "noauth" not in cmd.flags
        ):
            raise NoAuthError()
        if not cmd.arity_ok(len(argv) - 1):
            raise PionError(f"wrong number of arguments for '{name.lower()}' command")
        if state.loading and "loading" not in cmd.flags:
            raise LoadingError()
        if "write" in cmd.flags and state.persistence is not None:
            failure = state.persistence.write_refusal()
            if failure is not None:
                raise MisconfError(failure)
        return cmd.handler(ctx, argv[1:])
    except PionError as exc:
        return ErrorReply(exc.resp_line())
    except Exception:
        return _internal_error(ctx, name, "in")


def execute(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int | Deferred:
    """Dispatch one command, append its encoded reply to ``out`` and return the
    reply's size in bytes (what the connection weighs against its high-water mark);
    a :data:`Deferred` is returned as it is, nothing appended.

    Encoding is inside the boundary too: if the reply cannot be encoded, whatever it
    had appended is taken back and ``-ERR internal error`` goes out in its place, so
    the replies before it in ``out`` are kept and the framing stays intact."""
    name = _LANE.get(argv[0])
    if name is not None:
        taken = _fast_lane(ctx, name, argv, out)
        if taken != -1:
            return taken
    reply = dispatch(ctx, argv)
    if isinstance(reply, Offload | Stream):
        return reply
    return _encode(ctx, argv, reply, out)


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
# KV.PREFIX.LOOKUP, PING), as the batch scanner hands them over complete, skip the
# generic path: no name decoding, no flag walk, and a reply encoded as one chunk from
# its type. What they do is unchanged: the same handler runs, after the same checks in
# the same order; a command any check would refuse leaves the lane (-1) and goes the
# generic way, which answers it in Redis's words. Spellings outside the table (mixed
# case) simply take the generic path.

_LANE_COMMANDS = ("GET", "SET", "KV.PREFIX.LOOKUP", "PING")
_LANE: dict[bytes, str] = {
    spelling: name for name in _LANE_COMMANDS for spelling in (name.encode(), name.lower().encode())
}


def _fast_lane(ctx: Context, name: str, argv: Sequence[bytes], out: Chunks) -> int | Deferred:
    """Run ``argv`` (command ``name``) on the fast lane: as :func:`execute`; or -1,
    nothing done, when it must take the generic path."""
    state = ctx.state
    client = ctx.client
    cmd = ctx.table.get(name)
    if (
        cmd is None
        or state.loading
        or (not client.authenticated and state.config.requirepass)
        or not cmd.arity_ok(len(argv) - 1)
    ):
        return -1
    persistence = state.persistence
    if "write" in cmd.flags and persistence is not None and persistence.write_refusal():
        return -1
    state.counters.total_commands_processed += 1
    client.last_command = cmd.name
    try:
        reply = cmd.handler(ctx, argv[1:])
    except PionError as exc:
        reply = ErrorReply(exc.resp_line())
    except Exception:
        reply = _internal_error(ctx, name, "in")
    if type(reply) is Simple:
        chunk = encode_simple(reply)
    elif type(reply) is bytes and len(reply) <= SMALL_BULK:
        chunk = b"$%d\r\n%b\r\n" % (len(reply), reply)
    elif reply is None:
        chunk = NULL_BULK[client.proto]
    elif isinstance(reply, Offload | Stream):  # none of the lane's handlers defers
        return reply
    else:
        return _encode(ctx, argv, reply, out)
    out.append(chunk)
    return len(chunk)
