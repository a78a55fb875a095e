"""Hash commands of the plain keyspace: HSET, HMSET, HGET, HMGET, HDEL, HGETALL, HLEN,
HEXISTS, with Redis 7.0's replies (HGETALL is a map in RESP3, a flat array in RESP2)
and errors (WRONGTYPE, arity). Fields and values are binary-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.chunked import pairs_reply
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]


def _pairs(name: str, args: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """``field value ...`` after the key; an odd count is Redis's arity error."""
    if len(args) % 2 == 0:
        raise PionError(f"wrong number of arguments for '{name}' command")
    return [(args[i], args[i + 1]) for i in range(1, len(args), 2)]


def _hset(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.keyspace.hash_set(args[0], _pairs("hset", args))


def _hmset(ctx: Context, args: Sequence[bytes]) -> Reply:
    ctx.state.keyspace.hash_set(args[0], _pairs("hmset", args))
    return Simple("OK")


def _hget(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0])
    return None if h is None else h.get(args[1])


def _hmget(ctx: Context, args: Sequence[bytes]) -> Reply:
    h = ctx.state.keyspace.hash(args[0]) or {}
    return [h.get(f) for f in args[1:]]


def _hdel(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.keyspace.hash_delete(args[0], args[1:])


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
]
