"""The numbered databases' commands (docs/protocol.md): SELECT, MOVE and SWAPDB, with
Redis 7.0's replies and error texts; COPY's ``DB`` option (``keys_more.py``) and
FLUSHALL (``keys.py``) use :func:`db_index` and ``Databases.flush_all``.

A connection starts in database 0 (``ClientState.db``); SELECT changes it, and the
dispatcher points ``state.keyspace`` at it before each command
(``pion.commands.execution.call``). Inside MULTI a queued SELECT switches the database
of the queued commands after it; inside a script it switches the script's own client
only, so the caller's database is unchanged after EVAL (Redis 7). The databases
themselves, and what SWAPDB does to watchers and blocked clients, are
``pion.keyspace.databases``'s.

Pion has no cluster mode, so these are always served (Redis Cluster refuses them).
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.notify import GENERIC, notify
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS", "c_int", "db_index", "in_range"]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_OUT_OF_RANGE = "DB index is out of range"


def db_index(ctx: Context, raw: bytes, msg: str | None = None) -> int:
    """A database index as Redis's ``getIntFromObjectOrReply`` then ``selectDb`` take
    it: an integer (``msg``, or Redis's text, when it is not one or not a C int),
    then within ``0..databases-1``."""
    return in_range(ctx, c_int(raw, msg))


def c_int(raw: bytes, msg: str | None = None) -> int:
    """Redis's ``getIntFromObjectOrReply``: a C int, else ``msg`` or Redis's text."""
    value = parse_int64(raw)
    if value is None:
        raise PionError(msg or "value is not an integer or out of range")
    if not _INT_MIN <= value <= _INT_MAX:
        raise PionError(
            msg or f"value is out of range, value must between {_INT_MIN} and {_INT_MAX}"
        )
    return value


def in_range(ctx: Context, db: int) -> int:
    """``db`` when it names a database, else Redis's error."""
    if not 0 <= db < len(ctx.state.databases):
        raise PionError(_OUT_OF_RANGE)
    return db


def _select(ctx: Context, args: Sequence[bytes]) -> Reply:
    db = db_index(ctx, args[0])
    ctx.client.db = db
    ctx.state.keyspace = ctx.state.databases[db]
    return Simple("OK")


def _move(ctx: Context, args: Sequence[bytes]) -> Reply:
    key = bytes(args[0])
    state = ctx.state
    source = state.keyspace
    target = state.databases[db_index(ctx, args[1])]
    if target is source:
        raise PionError("source and destination objects are the same")
    if not source.move_to(key, target):
        return 0
    notify(state, GENERIC, "move_from", key, source.db)
    notify(state, GENERIC, "move_to", key, target.db)
    return 1


def _swapdb(ctx: Context, args: Sequence[bytes]) -> Reply:
    a = c_int(args[0], "invalid first DB index")
    b = c_int(args[1], "invalid second DB index")
    ctx.state.databases.swap(in_range(ctx, a), in_range(ctx, b))
    return Simple("OK")


COMMANDS: list[Command] = [
    Command("SELECT", _select, 2, frozenset({"fast", "loading"}), "Change the selected database"),
    Command("MOVE", _move, 3, frozenset({"write", "fast"}), "Move a key to another database"),
    Command("SWAPDB", _swapdb, 3, frozenset({"write", "fast"}), "Swap two databases"),
]
