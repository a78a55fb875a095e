"""The one place where a request becomes a reply and exceptions become RESP errors.

Checks run in Redis's order: unknown command, authentication, arity, loading, then
whether persistence still accepts writes. A :class:`PionError` from a handler is the
client's error; any other exception is a Pion bug, logged once with its traceback and
answered ``-ERR internal error`` so the connection and its neighbours live on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pion.commands.base import Command, Context
from pion.errors import LoadingError, MisconfError, NoAuthError, PionError
from pion.resp.reply import ErrorReply, Reply

__all__ = ["dispatch"]

log = logging.getLogger("pion.server")

# Command names as sent (any case) -> upper-case. Bounded, so a client sending random
# names cannot grow it without limit; past the bound names are just decoded each time.
_NAMES: dict[bytes, str] = {}
_NAME_CACHE_SIZE = 1024


def _unknown(argv: Sequence[bytes]) -> ErrorReply:
    name = argv[0].decode("utf-8", "replace")[:128]
    shown = " ".join(f"'{a.decode('utf-8', 'replace')[:128]}'" for a in argv[1:8])
    return ErrorReply(f"ERR unknown command '{name}', with args beginning with: {shown}")


def dispatch(ctx: Context, argv: Sequence[bytes], table: Mapping[str, Command]) -> Reply:
    """Run one command; always returns a reply value (errors as :class:`ErrorReply`)."""
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
    cmd = table.get(name)
    if cmd is None:
        return _unknown(argv)
    ctx.client.last_command = cmd.name
    try:
        if (
            state.config.requirepass is not None
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
        state.counters.internal_errors += 1
        log.exception("internal error in %s", name)
        return ErrorReply("ERR internal error")
