"""String commands of the plain keyspace: GET, SET (EX/PX/EXAT/PXAT/NX/XX/KEEPTTL/GET),
SETNX, SETEX, PSETEX, GETSET, GETDEL, GETEX, MGET, MSET, MSETNX, INCR, INCRBY, DECR,
DECRBY, INCRBYFLOAT, STRLEN, APPEND, GETRANGE (and its older name SUBSTR), SETRANGE.
Replies and error texts are Redis 7.0's (an oracle test compares them byte for byte
with redis-server).

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
    GetExOptions,
    SetOptions,
    append,
    as_int,
    getdel,
    getex,
    getrange,
    getset,
    incr_by,
    incr_by_float,
    mget,
    mset,
    msetnx,
    set_deadline_of,
    set_value,
    setrange,
)
from pion.notify import GENERIC, NEW, STRING, notify
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
        if ctx.state.notify_flags:
            notify(ctx.state, STRING, "set", args[0])
        return _OK
    cur = Args(args, "SET")
    key, value = cur.arg("key"), cur.arg("value")
    opts = _parse_set(cur)
    stored, old = set_value(ctx.state.keyspace, key, value, opts)
    if stored:
        notify(ctx.state, STRING, "set", key)
        if opts.expire_unit is not None:
            notify(ctx.state, GENERIC, "expire", key)
    if opts.get:
        return old
    return _OK if stored else None


def _mget(ctx: Context, args: Sequence[bytes]) -> Reply:
    out: list[Reply] = list(mget(ctx.state.keyspace, list(args)))
    return out


def _mset(ctx: Context, args: Sequence[bytes]) -> Reply:
    pairs = _pairs("mset", args)
    fresh = _fresh(ctx, pairs)
    mset(ctx.state.keyspace, pairs)
    _announce_sets(ctx, pairs, fresh)
    return _OK


def _fresh(ctx: Context, pairs: list[tuple[bytes, bytes]]) -> set[bytes]:
    """The keys of an MSET that it creates (only asked while ``new`` notifies)."""
    if not ctx.state.notify_flags & NEW:
        return set()
    ks = ctx.state.keyspace
    return {key for key, _ in pairs if not ks.exists(key)}


def _announce_sets(ctx: Context, pairs: list[tuple[bytes, bytes]], fresh: set[bytes]) -> None:
    """MSET's events as Redis orders them: per key, ``new`` (when created) and then
    ``set``. (The keyspace announces ``new`` itself for every other write.)"""
    for key, _ in pairs:
        if key in fresh:
            fresh.discard(key)
            notify(ctx.state, NEW, "new", key)
        notify(ctx.state, STRING, "set", key)


def _incr(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _counted(ctx, args[0], 1)


def _decr(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _counted(ctx, args[0], -1)


def _incrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _counted(ctx, args[0], as_int(args[1]))


def _decrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    delta = as_int(args[1])
    if delta == INT64_MIN:
        raise PionError("decrement would overflow")
    return _counted(ctx, args[0], -delta)


def _counted(ctx: Context, key: bytes, delta: int) -> Reply:
    """INCR, DECR, INCRBY, DECRBY: Redis names every one's event ``incrby``."""
    reply = incr_by(ctx.state.keyspace, key, delta)
    notify(ctx.state, STRING, "incrby", key)
    return reply


def _incrbyfloat(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = incr_by_float(ctx.state.keyspace, args[0], args[1])
    notify(ctx.state, STRING, "incrbyfloat", args[0])
    return reply


def _pairs(name: str, args: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    if len(args) % 2:
        raise PionError(f"wrong number of arguments for '{name}' command")
    return [(args[i], args[i + 1]) for i in range(0, len(args), 2)]


def _msetnx(ctx: Context, args: Sequence[bytes]) -> Reply:
    pairs = _pairs("msetnx", args)
    fresh = _fresh(ctx, pairs)
    stored = msetnx(ctx.state.keyspace, pairs)
    if stored:
        _announce_sets(ctx, pairs, fresh)
    return int(stored)


def _setnx(ctx: Context, args: Sequence[bytes]) -> Reply:
    stored, _ = set_value(ctx.state.keyspace, args[0], args[1], SetOptions(condition="NX"))
    if stored:
        notify(ctx.state, STRING, "set", args[0])
    return int(stored)


def _setex_generic(ctx: Context, args: Sequence[bytes], name: str, unit: ExpireUnit) -> Reply:
    ks = ctx.state.keyspace
    deadline = set_deadline_of(name, unit, args[1], ks.clock())
    ks.set_string(args[0], args[2], deadline)
    notify(ctx.state, STRING, "set", args[0])
    notify(ctx.state, GENERIC, "expire", args[0])
    return _OK


def _setex(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _setex_generic(ctx, args, "setex", "EX")


def _psetex(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _setex_generic(ctx, args, "psetex", "PX")


def _getset(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = getset(ctx.state.keyspace, args[0], args[1])
    notify(ctx.state, STRING, "set", args[0])
    return reply


def _getdel(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = getdel(ctx.state.keyspace, args[0])
    if reply is not None:
        notify(ctx.state, GENERIC, "del", args[0])
    return reply


def _parse_getex(cur: Args) -> GetExOptions:
    """Redis 7.0's ``parseExtendedStringArgumentsOrReply`` for GETEX: one of EX, PX,
    EXAT, PXAT (repeating the same one is allowed, the last wins) or PERSIST."""
    unit: ExpireUnit | None = None
    value = b""
    persist = False
    while not cur.done():
        opt = cur.keyword()
        has_next = not cur.done()
        if opt == "PERSIST" and unit is None:
            persist = True
        elif opt in _UNITS and not persist and unit in (None, opt) and has_next:
            unit = _UNITS[opt]
            value = cur.arg("expire")
        else:
            raise PionError(_SYNTAX)
    return GetExOptions(unit, value, persist)


def _getex(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "GETEX")
    key = cur.arg("key")
    opts = _parse_getex(cur)
    ks = ctx.state.keyspace
    had_deadline = bool(ks.deadline(key)) if opts.persist else False
    value = getex(ks, key, opts)
    if value is not None and opts.expire_unit is not None:
        # A time already past deletes the key: Redis announces a del.
        notify(ctx.state, GENERIC, "expire" if ks.exists(key) else "del", key)
    elif value is not None and had_deadline:
        notify(ctx.state, GENERIC, "persist", key)
    return value


def _strlen(ctx: Context, args: Sequence[bytes]) -> Reply:
    value = ctx.state.keyspace.string(args[0])
    return 0 if value is None else len(value)


def _append(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = append(ctx.state.keyspace, args[0], args[1])
    notify(ctx.state, STRING, "append", args[0])
    return reply


def _getrange(ctx: Context, args: Sequence[bytes]) -> Reply:
    start, end = as_int(args[1]), as_int(args[2])
    return getrange(ctx.state.keyspace, args[0], start, end)


def _setrange(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = setrange(ctx.state.keyspace, args[0], as_int(args[1]), args[2])
    if args[2]:  # Redis: an empty write changes nothing and notifies nothing
        notify(ctx.state, STRING, "setrange", args[0])
    return reply


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
    Command("INCRBYFLOAT", _incrbyfloat, 3, _WRITE_FAST, "Increment a float value"),
    Command("MSETNX", _msetnx, -3, _WRITE, "Set several values unless any key exists"),
    Command("SETNX", _setnx, 3, _WRITE_FAST, "Set a value unless the key exists"),
    Command("SETEX", _setex, 4, _WRITE, "Set a value with a time to live in seconds"),
    Command("PSETEX", _psetex, 4, _WRITE, "Set a value with a time to live in ms"),
    Command("GETSET", _getset, 3, _WRITE_FAST, "Set a value, returning the old one"),
    Command("GETDEL", _getdel, 2, _WRITE_FAST, "Get a value and delete the key"),
    Command("GETEX", _getex, -2, _WRITE_FAST, "Get a value and change its expiry"),
    Command("STRLEN", _strlen, 2, _READ, "Length of a string value"),
    Command("APPEND", _append, 3, _WRITE_FAST, "Append to a string value"),
    Command("GETRANGE", _getrange, 4, frozenset({"readonly"}), "A substring of a value"),
    Command("SUBSTR", _getrange, 4, frozenset({"readonly"}), "GETRANGE's older name"),
    Command("SETRANGE", _setrange, 4, _WRITE, "Overwrite part of a string value"),
]
