"""The RESP lane's boundary: where a request becomes reply bytes and exceptions RESP errors.

Checks run in Redis's order: unknown command, authentication, arity, loading, then
whether persistence still accepts writes (the commands that only free space always
pass: ``pion.persistence.stores.FREEING_COMMANDS``). A :class:`PionError` from a handler is the
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
from pion.persistence.stores import FREEING_COMMANDS
from pion.resp.encoder import Chunks, encode_error, encode_reply
from pion.resp.reply import ErrorReply, Reply

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
        # Commands that only free space pass a failing log (it writes their records
        # when it can): removing data is how an operator makes room.
        if (
            "write" in cmd.flags
            and state.persistence is not None
            and cmd.name not in FREEING_COMMANDS
        ):
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
