"""String commands of the plain keyspace: GET, SET (EX/PX/EXAT/PXAT/NX/XX/KEEPTTL/GET),
MGET, MSET, INCR, INCRBY, DECR, DECRBY. Replies and error texts are Redis 7.0's (an
oracle test compares them byte for byte with redis-server).

Values are binary-safe and as large as the protocol's bulk limit (512 MB, Redis's
proto-max-bulk-len); the stored value is the request's own buffer, never copied.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import Args
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.strings import (
    INT64_MIN,
    Condition,
    ExpireUnit,
    SetOptions,
    as_int,
    incr_by,
    mget,
    mset,
    set_value,
)
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]

_OK = Simple("OK")
_SYNTAX = "syntax error"


def _get(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.keyspace.string(args[0])


_UNITS: dict[str, ExpireUnit] = {"EX": "EX", "PX": "PX", "EXAT": "EXAT", "PXAT": "PXAT"}


def _parse_set(cur: Args) -> SetOptions:
    """Redis 7.0's ``parseExtendedStringArgumentsOrReply`` for SET: an option that
    conflicts with one already given is a syntax error, EX/PX/EXAT/PXAT need a value."""
    condition: Condition | None = None
    unit: ExpireUnit | None = None
    value = b""
    keep_ttl = get = False
    while not cur.done():
        opt = cur.keyword()
        has_next = not cur.done()
        if opt == "NX" and condition != "XX":
            condition = "NX"
        elif opt == "XX" and condition != "NX":
            condition = "XX"
        elif opt == "GET":
            get = True
        elif opt == "KEEPTTL" and unit is None:
            keep_ttl = True
        elif opt in _UNITS and not keep_ttl and unit in (None, opt) and has_next:
            unit = _UNITS[opt]
            value = cur.arg("expire")
        else:
            raise PionError(_SYNTAX)
    return SetOptions(condition, unit, value, keep_ttl, get)


def _set(ctx: Context, args: Sequence[bytes]) -> Reply:
    if len(args) == 2:  # the common case (LMCache, redis-benchmark): no options
        ctx.state.keyspace.set_string(args[0], args[1])
        return _OK
    cur = Args(args, "SET")
    key, value = cur.arg("key"), cur.arg("value")
    opts = _parse_set(cur)
    stored, old = set_value(ctx.state.keyspace, key, value, opts)
    if opts.get:
        return old
    return _OK if stored else None


def _mget(ctx: Context, args: Sequence[bytes]) -> Reply:
    out: list[Reply] = list(mget(ctx.state.keyspace, list(args)))
    return out


def _mset(ctx: Context, args: Sequence[bytes]) -> Reply:
    if len(args) % 2:
        raise PionError("wrong number of arguments for 'mset' command")
    mset(ctx.state.keyspace, [(args[i], args[i + 1]) for i in range(0, len(args), 2)])
    return _OK


def _incr(ctx: Context, args: Sequence[bytes]) -> Reply:
    return incr_by(ctx.state.keyspace, args[0], 1)


def _decr(ctx: Context, args: Sequence[bytes]) -> Reply:
    return incr_by(ctx.state.keyspace, args[0], -1)


def _incrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    return incr_by(ctx.state.keyspace, args[0], as_int(args[1]))


def _decrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    delta = as_int(args[1])
    if delta == INT64_MIN:
        raise PionError("decrement would overflow")
    return incr_by(ctx.state.keyspace, args[0], -delta)


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write"})
_WRITE_FAST = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("GET", _get, 2, _READ, "Get the value of a key"),
    Command("SET", _set, -3, _WRITE, "Set a string value, with expiry and conditions"),
    Command("MGET", _mget, -2, _READ, "Get the values of several keys"),
    Command("MSET", _mset, -3, _WRITE, "Set several string values atomically"),
    Command("INCR", _incr, 2, _WRITE_FAST, "Increment an integer value by one"),
    Command("INCRBY", _incrby, 3, _WRITE_FAST, "Increment an integer value"),
    Command("DECR", _decr, 2, _WRITE_FAST, "Decrement an integer value by one"),
    Command("DECRBY", _decrby, 3, _WRITE_FAST, "Decrement an integer value"),
]
