"""Hash commands of the plain keyspace: HSET, HMSET, HSETNX, HGET, HMGET, HDEL, HGETALL,
HKEYS, HVALS, HLEN, HSTRLEN, HEXISTS, HINCRBY, HINCRBYFLOAT, HRANDFIELD, HSCAN, with
Redis 7.0's replies (HGETALL is a map in RESP3, a flat array in RESP2; HRANDFIELD
WITHVALUES pairs in RESP3) and errors (WRONGTYPE, arity). Fields and values are
binary-safe. The semantics beyond plain reads and writes are ``pion.keyspace.hashes``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.chunked import pairs_reply
from pion.commands.deferred import Steps
from pion.commands.scan_args import scan_cursor, scan_options
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.hashes import hincrby, hincrbyfloat, hrandfield, hscan, hsetnx
from pion.keyspace.numbers import parse_int64
from pion.notify import GENERIC, HASH, notify
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]


def _pairs(name: str, args: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """``field value ...`` after the key; an odd count is Redis's arity error."""
    if len(args) % 2 == 0:
        raise PionError(f"wrong number of arguments for '{name}' command")
    return [(args[i], args[i + 1]) for i in range(1, len(args), 2)]


def _hset(ctx: Context, args: Sequence[bytes]) -> Reply:
    added = ctx.state.keyspace.hash_set(args[0], _pairs("hset", args))
    notify(ctx.state, HASH, "hset", args[0])
    return added


def _hmset(ctx: Context, args: Sequence[bytes]) -> Reply:
    ctx.state.keyspace.hash_set(args[0], _pairs("hmset", args))
    notify(ctx.state, HASH, "hset", args[0])
    return Simple("OK")


def _hget(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0])
    return None if h is None else h.get(args[1])


def _hmget(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0]) or {}
    return [h.get(f) for f in args[1:]]


def _hdel(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    deleted = ks.hash_delete(args[0], args[1:])
    if deleted:
        notify(ctx.state, HASH, "hdel", args[0])
        if not ks.exists(args[0]):  # the last field went: the key with it
            notify(ctx.state, GENERIC, "del", args[0])
    return deleted


def _hgetall(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    # The items are taken in one step; a long reply is encoded in steps.
    h = ctx.state.keyspace.hash(args[0])
    items: list[tuple[Reply, Reply]] = list((h or {}).items())
    return pairs_reply(items, ctx.client.proto, "map")


def _hlen(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0])
    return 0 if h is None else len(h)


def _hexists(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0])
    return int(h is not None and args[1] in h)


def _hkeys(ctx: Context, args: Sequence[bytes]) -> Reply:
    return list((ctx.state.keyspace.hash(args[0]) or {}).keys())


def _hvals(ctx: Context, args: Sequence[bytes]) -> Reply:
    return list((ctx.state.keyspace.hash(args[0]) or {}).values())


def _hstrlen(ctx: Context, args: Sequence[bytes]) -> Reply:
    value = (ctx.state.keyspace.hash(args[0]) or {}).get(args[1])
    return 0 if value is None else len(value)


def _hsetnx(ctx: Context, args: Sequence[bytes]) -> Reply:
    stored = hsetnx(ctx.state.keyspace, args[0], args[1], args[2])
    if stored:
        notify(ctx.state, HASH, "hset", args[0])
    return int(stored)


def _hincrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    delta = parse_int64(args[2])
    if delta is None:
        raise PionError("value is not an integer or out of range")
    reply = hincrby(ctx.state.keyspace, args[0], args[1], delta)
    notify(ctx.state, HASH, "hincrby", args[0])
    return reply


def _hincrbyfloat(ctx: Context, args: Sequence[bytes]) -> Reply:
    reply = hincrbyfloat(ctx.state.keyspace, args[0], args[1], args[2])
    notify(ctx.state, HASH, "hincrbyfloat", args[0])
    return reply


# HRANDFIELD's count bounds (Redis's -LONG_MAX..LONG_MAX; half that WITHVALUES).
_LONG_MAX = (1 << 63) - 1


def random_count(raw: bytes, rest: Sequence[bytes], option: str) -> tuple[int, bool]:
    """HRANDFIELD/ZRANDMEMBER's ``count [WITHVALUES|WITHSCORES]``, Redis 7.0's checks."""
    count = parse_int64(raw)
    if count is None:
        raise PionError("value is not an integer or out of range")
    if count < -_LONG_MAX:
        raise PionError(f"value is out of range, value must between {-_LONG_MAX} and {_LONG_MAX}")
    if len(rest) > 1 or (rest and rest[0].upper() != option.encode()):
        raise PionError("syntax error")
    with_values = bool(rest)
    if with_values and not -_LONG_MAX // 2 <= count <= _LONG_MAX // 2:
        raise PionError("value is out of range")
    return count, with_values


def picked_reply(
    ctx: Context, pairs: list[tuple[bytes, Reply]], with_values: bool
) -> Reply | Steps:
    """Picked pairs: names only, flat pairs (RESP2) or [name, value] pairs (RESP3)."""
    proto = ctx.client.proto
    shape = "first" if not with_values else ("nested" if proto == 3 else "flat")
    return pairs_reply(pairs, proto, shape)


def _hrandfield(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    if len(args) == 1:
        picked = hrandfield(ctx.state.keyspace, args[0], None)
        return None if not picked else picked[0][0]
    count, with_values = random_count(args[1], args[2:], "WITHVALUES")
    found = hrandfield(ctx.state.keyspace, args[0], count) or []
    out: list[tuple[bytes, Reply]] = list(found)
    return picked_reply(ctx, out, with_values)


def _hscan(ctx: Context, args: Sequence[bytes]) -> Reply:
    """Redis 7.0's order: the cursor, then the key (missing: an empty scan), then the
    options."""
    ks = ctx.state.keyspace
    cursor = scan_cursor(args[1])
    if ks.hash(args[0]) is None:
        return [b"0", []]
    options = scan_options(args[2:])
    nxt, pairs = hscan(ks, args[0], cursor, options.count, options.pattern)
    flat: list[Reply] = [x for pair in pairs for x in pair]
    return [str(nxt).encode(), flat]


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("HSET", _hset, -4, _WRITE, "Set hash fields; replies how many were new"),
    Command("HMSET", _hmset, -4, _WRITE, "Set hash fields (deprecated form of HSET)"),
    Command("HGET", _hget, 3, _READ, "Get one hash field"),
    Command("HMGET", _hmget, -3, _READ, "Get several hash fields"),
    Command("HDEL", _hdel, -3, _WRITE, "Delete hash fields"),
    Command("HGETALL", _hgetall, 2, frozenset({"readonly"}), "Every field and value"),
    Command("HLEN", _hlen, 2, _READ, "Number of fields in a hash"),
    Command("HEXISTS", _hexists, 3, _READ, "Whether a hash field exists"),
    Command("HKEYS", _hkeys, 2, frozenset({"readonly"}), "Every field of a hash"),
    Command("HVALS", _hvals, 2, frozenset({"readonly"}), "Every value of a hash"),
    Command("HSTRLEN", _hstrlen, 3, _READ, "Length of a hash field's value"),
    Command("HSETNX", _hsetnx, 4, _WRITE, "Set a hash field unless it exists"),
    Command("HINCRBY", _hincrby, 4, _WRITE, "Increment an integer hash field"),
    Command("HINCRBYFLOAT", _hincrbyfloat, 4, _WRITE, "Increment a float hash field"),
    Command("HRANDFIELD", _hrandfield, -2, frozenset({"readonly"}), "Random fields of a hash"),
    Command("HSCAN", _hscan, -3, frozenset({"readonly"}), "Iterate over a hash's fields"),
]
