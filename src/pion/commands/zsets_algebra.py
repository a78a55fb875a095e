"""Sorted-set algebra: ZUNION, ZINTER, ZDIFF, ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE,
ZINTERCARD, with Redis 7.0's argument order, replies and error texts (the semantics
are ``pion.keyspace.zsets_algebra``'s). As in Redis, the keys' types are checked
before the options are read.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.commands.zsets import keyword, with_scores
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64, parse_score
from pion.keyspace.zsets_algebra import Aggregate, SetOp, load_sources, zcombine, zintercard
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]

_SYNTAX = "syntax error"


def _numkeys(args: Sequence[bytes], at: int, name: str) -> int:
    n = parse_int64(args[at])
    if n is None:
        raise PionError("value is not an integer or out of range")
    if n < 1:
        raise PionError(f"at least 1 input key is needed for '{name}' command")
    if n > len(args) - at - 1:
        raise PionError(_SYNTAX)
    return n


def _generic(
    ctx: Context, args: Sequence[bytes], name: str, op: SetOp, store: bool
) -> Reply | Steps:
    """Redis's ``zunionInterDiffGenericCommand``: numkeys, the keys (typed now), then
    WEIGHTS/AGGREGATE (not for DIFF) and WITHSCORES (not for STORE)."""
    ks = ctx.state.keyspace
    at = 1 if store else 0
    n = _numkeys(args, at, name)
    keys = list(args[at + 1 : at + 1 + n])
    src = load_sources(ks, keys)
    how: Aggregate = "SUM"
    withscores = False
    i = at + 1 + n
    while i < len(args):
        word = keyword(args[i])
        left = len(args) - i
        if op != "DIFF" and word == "WEIGHTS" and left >= n + 1:
            for j in range(n):
                w = parse_score(args[i + 1 + j])
                if w is None:
                    raise PionError("weight value is not a float")
                src.weights[j] = w
            i += n + 1
        elif op != "DIFF" and word == "AGGREGATE" and left >= 2:
            choice = keyword(args[i + 1])
            if choice not in ("SUM", "MIN", "MAX"):
                raise PionError(_SYNTAX)
            how = "SUM" if choice == "SUM" else "MIN" if choice == "MIN" else "MAX"
            i += 2
        elif not store and word == "WITHSCORES":
            withscores = True
            i += 1
        else:
            raise PionError(_SYNTAX)
    entries = zcombine(src, op, how)
    if store:
        ks.zset_replace(args[0], entries)
        return len(entries)
    entries.sort()
    return with_scores(ctx, entries, withscores)


def _zunion(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zunion", "UNION", store=False)


def _zinter(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zinter", "INTER", store=False)


def _zdiff(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zdiff", "DIFF", store=False)


def _zunionstore(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zunionstore", "UNION", store=True)


def _zinterstore(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zinterstore", "INTER", store=True)


def _zdiffstore(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _generic(ctx, args, "zdiffstore", "DIFF", store=True)


def _zintercard(ctx: Context, args: Sequence[bytes]) -> Reply:
    n = _numkeys(args, 0, "zintercard")
    src = load_sources(ctx.state.keyspace, list(args[1 : 1 + n]))
    limit = 0
    i = 1 + n
    while i < len(args):
        if keyword(args[i]) == "LIMIT" and len(args) - i >= 2:
            value = parse_int64(args[i + 1])
            if value is None or value < 0:
                raise PionError("LIMIT can't be negative")
            limit = value
            i += 2
        else:
            raise PionError(_SYNTAX)
    return zintercard(src, limit)


_READ = frozenset({"readonly"})
_WRITE = frozenset({"write"})

COMMANDS: list[Command] = [
    Command("ZUNION", _zunion, -3, _READ, "Union of sorted sets"),
    Command("ZINTER", _zinter, -3, _READ, "Intersection of sorted sets"),
    Command("ZDIFF", _zdiff, -3, _READ, "Members of the first set not in the others"),
    Command("ZUNIONSTORE", _zunionstore, -4, _WRITE, "ZUNION into a key"),
    Command("ZINTERSTORE", _zinterstore, -4, _WRITE, "ZINTER into a key"),
    Command("ZDIFFSTORE", _zdiffstore, -4, _WRITE, "ZDIFF into a key"),
    Command("ZINTERCARD", _zintercard, -3, _READ, "Size of an intersection"),
]
