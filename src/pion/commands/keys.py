"""Generic commands of the plain keyspace: DEL, UNLINK, EXISTS, EXPIRE, PEXPIRE, EXPIREAT,
PEXPIREAT (NX/XX/GT/LT), TTL, PTTL, EXPIRETIME, PEXPIRETIME, PERSIST, TYPE, SCAN, KEYS,
FLUSHDB, FLUSHALL (DBSIZE is with the server commands).

They act on the keyspace only, never on V-store sessions (those are counted by
KV.PREFIX.INFO and removed by KV.PREFIX.DROP and eviction). Replies and error texts
are Redis 7.0's.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pion.commands.chunked import BIG_REPLY, STEP_ITEMS, reply, work_steps
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.entries import Entry
from pion.keyspace.glob import matches_all, stringmatch
from pion.keyspace.numbers import parse_cursor, parse_int64
from pion.notify import GENERIC, notify
from pion.resp.encoder import Chunks
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS", "SCAN_DEFAULT_COUNT"]

_SYNTAX = "syntax error"
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
# Redis's SCAN default COUNT.
SCAN_DEFAULT_COUNT = 10
# COUNT is a hint (Redis returns more or fewer); a step looks at no more slots than
# this, so a SCAN with a huge COUNT is a SCAN of a few milliseconds, not a KEYS.
SCAN_MAX_COUNT = 4096


def _keyword(raw: bytes) -> str:
    try:
        return raw.decode("ascii").upper()
    except UnicodeDecodeError:
        return ""


def _del(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if not ctx.state.notify_flags:
        return ks.delete(args)
    live = [k for k in dict.fromkeys(args) if ks.exists(k)]
    deleted = ks.delete(args)
    for key in live:
        notify(ctx.state, GENERIC, "del", key)
    return deleted


def _exists(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    return sum(ks.exists(k) for k in args)  # a key named twice counts twice, as in Redis


def _expire_generic(
    ctx: Context, args: Sequence[bytes], name: str, unit_ms: int, relative: bool
) -> Reply:
    """Redis 7.0's ``expireGenericCommand``: options, then the time (overflow is an
    error), then the key; a deadline not in the future deletes the key."""
    key, raw = args[0], args[1]
    opts: set[str] = set()
    for opt in args[2:]:
        word = _keyword(opt)
        if word not in ("NX", "XX", "GT", "LT"):
            raise PionError(f"Unsupported option {opt.decode('utf-8', 'replace')}")
        opts.add(word)
    if "NX" in opts and opts & {"XX", "GT", "LT"}:
        raise PionError("NX and XX, GT or LT options at the same time are not compatible")
    if {"GT", "LT"} <= opts:
        raise PionError("GT and LT options at the same time are not compatible")
    when = parse_int64(raw)
    if when is None:
        raise PionError("value is not an integer or out of range")
    invalid = PionError(f"invalid expire time in '{name}' command")
    if unit_ms == 1000:
        if not _INT64_MIN // 1000 <= when <= _INT64_MAX // 1000:
            raise invalid
        when *= 1000
    ks = ctx.state.keyspace
    base = ks.clock() if relative else 0
    if when > _INT64_MAX - base:
        raise invalid
    when += base
    current = ks.deadline(key)
    if current is None:
        return 0
    if opts:
        if ("NX" in opts and current) or ("XX" in opts and not current):
            return 0
        if "GT" in opts and (not current or when <= current):
            return 0
        if "LT" in opts and current and when >= current:
            return 0
    # A deadline of 0 or less is long past (the key goes); clamped to 1 ms because 0
    # means "no deadline" to the keyspace.
    ks.set_deadline(key, max(when, 1))
    # A deadline already past deletes the key: Redis announces that as a del.
    notify(ctx.state, GENERIC, "expire" if when > ks.clock() else "del", key)
    return 1


def _expire(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _expire_generic(ctx, args, "expire", 1000, True)


def _pexpire(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _expire_generic(ctx, args, "pexpire", 1, True)


def _expireat(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _expire_generic(ctx, args, "expireat", 1000, False)


def _pexpireat(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _expire_generic(ctx, args, "pexpireat", 1, False)


def _ttl_generic(ctx: Context, key: bytes, ms: bool, absolute: bool) -> Reply:
    ks = ctx.state.keyspace
    deadline = ks.deadline(key)
    if deadline is None:
        return -2
    if not deadline:
        return -1
    value = deadline if absolute else max(0, deadline - ks.clock())
    return value if ms else (value + 500) // 1000


def _ttl(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _ttl_generic(ctx, args[0], ms=False, absolute=False)


def _pttl(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _ttl_generic(ctx, args[0], ms=True, absolute=False)


def _expiretime(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _ttl_generic(ctx, args[0], ms=False, absolute=True)


def _pexpiretime(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _ttl_generic(ctx, args[0], ms=True, absolute=True)


def _persist(ctx: Context, args: Sequence[bytes]) -> Reply:
    persisted = ctx.state.keyspace.persist(args[0])
    if persisted:
        notify(ctx.state, GENERIC, "persist", args[0])
    return int(persisted)


def _type(ctx: Context, args: Sequence[bytes]) -> Reply:
    return Simple(ctx.state.keyspace.kind(args[0]) or "none")


def _scan(ctx: Context, args: Sequence[bytes]) -> Reply:
    """Redis 7.0's ``scanGenericCommand`` over the keyspace (``pion.keyspace.scan``)."""
    cursor = parse_cursor(args[0])
    if cursor is None:
        raise PionError("invalid cursor")
    count = SCAN_DEFAULT_COUNT
    pattern: bytes | None = None
    kind: str | None = None
    i = 1
    while i < len(args):
        word = _keyword(args[i])
        if word == "COUNT" and i + 1 < len(args):
            value = parse_int64(args[i + 1])
            if value is None:
                raise PionError("value is not an integer or out of range")
            if value < 1:
                raise PionError(_SYNTAX)
            count = min(value, SCAN_MAX_COUNT)
        elif word == "MATCH" and i + 1 < len(args):
            pattern = None if matches_all(args[i + 1]) else args[i + 1]
        elif word == "TYPE" and i + 1 < len(args):
            kind = args[i + 1].decode("utf-8", "replace").lower()
        else:
            raise PionError(_SYNTAX)
        i += 2
    nxt, keys = ctx.state.keyspace.scan(cursor, count, pattern, kind)
    found: list[Reply] = list(keys)
    return [str(nxt).encode(), found]


def _keys(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    # The names are taken in one step (the keyspace of one instant, as in Redis): a
    # copy of the slot table when no key can have expired, filtered and matched in
    # steps; else the live matching names at once. The reply is encoded in steps.
    ks = ctx.state.keyspace
    names = ks.names()
    if names is None or len(names) <= BIG_REPLY:
        out: list[Reply] = list(ks.keys(args[0]))
        return reply(out, ctx.client.proto)
    return Steps(_keys_in_steps(names, args[0], ctx.client.proto), taken=True)


def _keys_in_steps(
    names: list[bytes | None], pattern: bytes, proto: int
) -> Generator[Chunks, None, Reply]:
    every = matches_all(pattern)
    found: list[Reply] = []
    for start in range(0, len(names), 4 * STEP_ITEMS):
        chunk = names[start : start + 4 * STEP_ITEMS]
        found += [k for k in chunk if k is not None and (every or stringmatch(pattern, k))]
        yield []
    encoded = reply(found, proto)
    if isinstance(encoded, Steps):
        result = yield from encoded.run
        return result
    return encoded


def _flush(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    # [SYNC|ASYNC], both as Redis's ASYNC: the keyspace is emptied at once (one swap),
    # and what it held is freed in steps before the reply, so neither this client
    # nor any other waits for the whole of it at once.
    if len(args) > 1 or (args and _keyword(args[0]) not in ("SYNC", "ASYNC")):
        raise PionError(_SYNTAX)
    olds = [ctx.state.keyspace.flush()]
    if len(olds[0]) <= BIG_REPLY:
        return Simple("OK")
    return work_steps(_free(olds), taken=True)


def _flushall(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    """FLUSHALL: every database, as FLUSHDB frees them."""
    if len(args) > 1 or (args and _keyword(args[0]) not in ("SYNC", "ASYNC")):
        raise PionError(_SYNTAX)
    olds = ctx.state.databases.flush_all()
    if sum(map(len, olds)) <= BIG_REPLY:
        return Simple("OK")
    return work_steps(_free(olds), taken=True)


def _free(olds: list[dict[bytes, Entry]]) -> Generator[None, None, Reply]:
    for old in olds:
        while old:
            for _ in range(min(len(old), STEP_ITEMS)):
                old.popitem()
            yield
    return Simple("OK")


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("DEL", _del, -2, frozenset({"write"}), "Delete keys"),
    Command("UNLINK", _del, -2, _WRITE, "Delete keys (as DEL)"),
    Command("EXISTS", _exists, -2, _READ, "Count the given keys that exist"),
    Command("EXPIRE", _expire, -3, _WRITE, "Set a time to live in seconds"),
    Command("PEXPIRE", _pexpire, -3, _WRITE, "Set a time to live in milliseconds"),
    Command("EXPIREAT", _expireat, -3, _WRITE, "Set a deadline as a Unix time in seconds"),
    Command("PEXPIREAT", _pexpireat, -3, _WRITE, "Set a deadline as a Unix time in ms"),
    Command("TTL", _ttl, 2, _READ, "Time to live in seconds"),
    Command("PTTL", _pttl, 2, _READ, "Time to live in milliseconds"),
    Command("EXPIRETIME", _expiretime, 2, _READ, "Deadline as a Unix time in seconds"),
    Command("PEXPIRETIME", _pexpiretime, 2, _READ, "Deadline as a Unix time in ms"),
    Command("PERSIST", _persist, 2, _WRITE, "Remove a key's time to live"),
    Command("TYPE", _type, 2, _READ, "The type of a key's value"),
    Command("SCAN", _scan, -2, frozenset({"readonly"}), "Iterate over the keys"),
    Command("KEYS", _keys, 2, frozenset({"readonly"}), "Every key matching a pattern"),
    Command("FLUSHDB", _flush, -1, frozenset({"write"}), "Remove the selected database's keys"),
    Command("FLUSHALL", _flushall, -1, frozenset({"write"}), "Remove every database's keys"),
]
