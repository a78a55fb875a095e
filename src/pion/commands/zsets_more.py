"""More sorted-set commands: ZINCRBY, ZRANK and ZREVRANK (WITHSCORE, Redis 7.2's form),
ZCOUNT, ZLEXCOUNT, ZMSCORE, ZPOPMIN, ZPOPMAX, ZMPOP, ZREMRANGEBYSCORE, ZREMRANGEBYRANK,
ZREMRANGEBYLEX, ZRANDMEMBER, ZSCAN. Replies and error texts are Redis 7.0's; the
semantics are ``pion.keyspace.zsets_more``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.deferred import Steps
from pion.commands.hashes import picked_reply, random_count
from pion.commands.scan_args import scan_cursor, scan_options
from pion.commands.state import Command, Context
from pion.commands.zsets import keyword, long_arg
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64, parse_range_bound, parse_score
from pion.keyspace.zsets import LexBound, ScoreRange, ZAddFlags, parse_lex_bound, zadd
from pion.keyspace.zsets_more import (
    zcount,
    zlexcount,
    zpop,
    zrandmember,
    zremrange_by_lex,
    zremrange_by_rank,
    zremrange_by_score,
    zscan,
)
from pion.notify import GENERIC, ZSET, notify
from pion.resp.reply import NullArray, Reply

__all__ = ["COMMANDS"]


def _score_range(low_raw: bytes, high_raw: bytes) -> ScoreRange:
    low, high = parse_range_bound(low_raw), parse_range_bound(high_raw)
    if low is None or high is None:
        raise PionError("min or max is not a float")
    return ScoreRange(low[0], low[1], high[0], high[1])


def _lex_range(low_raw: bytes, high_raw: bytes) -> tuple[LexBound, LexBound]:
    low, high = parse_lex_bound(low_raw), parse_lex_bound(high_raw)
    if low is None or high is None:
        raise PionError("min or max not valid string range item")
    return low, high


def _zincrby(ctx: Context, args: Sequence[bytes]) -> Reply:
    delta = parse_score(args[1])
    if delta is None:
        raise PionError("value is not a valid float")
    res = zadd(ctx.state.keyspace, args[0], [(delta, args[2])], ZAddFlags(incr=True))
    notify(ctx.state, ZSET, "zincr", args[0])
    return res.last_score


def _rank(ctx: Context, args: Sequence[bytes], rev: bool) -> Reply:
    """Redis 7.2's ZRANK/ZREVRANK: ``WITHSCORE`` adds the score; the key is looked up
    before the option is checked, as there."""
    if len(args) > 3:
        raise PionError("syntax error")
    z = ctx.state.keyspace.zset(args[0])
    withscore = len(args) == 3
    if withscore and keyword(args[2]) != "WITHSCORE":
        raise PionError("syntax error")
    rank = None if z is None else z.rank(args[1])
    if z is None or rank is None:
        return NullArray() if withscore else None
    if rev:
        rank = len(z) - 1 - rank
    return [rank, z.scores[args[1]]] if withscore else rank


def _zrank(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _rank(ctx, args, rev=False)


def _zrevrank(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _rank(ctx, args, rev=True)


def _zcount(ctx: Context, args: Sequence[bytes]) -> Reply:
    rng = _score_range(args[1], args[2])
    z = ctx.state.keyspace.zset(args[0])
    return 0 if z is None else zcount(z, rng)


def _zlexcount(ctx: Context, args: Sequence[bytes]) -> Reply:
    low, high = _lex_range(args[1], args[2])
    z = ctx.state.keyspace.zset(args[0])
    return 0 if z is None else zlexcount(z, low, high)


def _zmscore(ctx: Context, args: Sequence[bytes]) -> Reply:
    z = ctx.state.keyspace.zset(args[0])
    return [None if z is None else z.scores.get(m) for m in args[1:]]


def _zpop(ctx: Context, args: Sequence[bytes], highest: bool) -> Reply:
    """Redis 7.0's ``genericZpopCommand``: the count first (a negative or malformed
    one is an error, 0 an empty reply), then the key. The reply is flat, except in
    RESP3 when a count was given: then [member, score] pairs."""
    if len(args) > 2:
        raise PionError("syntax error")
    count = 1
    if len(args) == 2:
        value = parse_int64(args[1])
        if value is None or value < 0:
            raise PionError("value is out of range, must be positive")
        count = value
    ks = ctx.state.keyspace
    if ks.zset(args[0]) is None:
        return []
    popped = zpop(ks, args[0], count, highest)
    _removed(ctx, args[0], len(popped), "zpopmax" if highest else "zpopmin")
    if len(args) == 2 and ctx.client.proto == 3:
        return [[member, score] for score, member in popped]
    out: list[Reply] = []
    for score, member in popped:
        out += [member, score]
    return out


def _zpopmin(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _zpop(ctx, args, highest=False)


def _zpopmax(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _zpop(ctx, args, highest=True)


def _zmpop(ctx: Context, args: Sequence[bytes]) -> Reply:
    """Redis 7.0's ZMPOP: ``numkeys key ... MIN|MAX [COUNT n]``; pops from the first
    key that holds a sorted set: ``[key, [[member, score], ...]]``, or the null array."""
    n = parse_int64(args[0])
    if n is None or n < 1:
        raise PionError("numkeys should be greater than 0")
    if n + 1 >= len(args):
        raise PionError("syntax error")
    where = keyword(args[n + 1])
    if where not in ("MIN", "MAX"):
        raise PionError("syntax error")
    count = -1
    i = n + 2
    while i < len(args):
        if count == -1 and keyword(args[i]) == "COUNT" and i + 1 < len(args):
            value = parse_int64(args[i + 1])
            if value is None or value < 1:
                raise PionError("count should be greater than 0")
            count = value
            i += 2
        else:
            raise PionError("syntax error")
    ks = ctx.state.keyspace
    for key in args[1 : n + 1]:
        if ks.zset(key) is not None:
            popped = zpop(ks, key, max(count, 1), where == "MAX")
            _removed(ctx, key, len(popped), "zpopmax" if where == "MAX" else "zpopmin")
            return [key, [[member, score] for score, member in popped]]
    return NullArray()


def _zremrangebyrank(ctx: Context, args: Sequence[bytes]) -> Reply:
    start, stop = long_arg(args[1]), long_arg(args[2])
    return _removed(
        ctx, args[0], zremrange_by_rank(ctx.state.keyspace, args[0], start, stop), "zremrangebyrank"
    )


def _zremrangebyscore(ctx: Context, args: Sequence[bytes]) -> Reply:
    rng = _score_range(args[1], args[2])
    return _removed(
        ctx, args[0], zremrange_by_score(ctx.state.keyspace, args[0], rng), "zremrangebyscore"
    )


def _zremrangebylex(ctx: Context, args: Sequence[bytes]) -> Reply:
    low, high = _lex_range(args[1], args[2])
    return _removed(
        ctx, args[0], zremrange_by_lex(ctx.state.keyspace, args[0], low, high), "zremrangebylex"
    )


def _removed(ctx: Context, key: bytes, count: int, event: str) -> int:
    """Announce ``count`` members removed from ``key`` (and the key's own removal
    when it went with them); returns ``count``."""
    if count:
        notify(ctx.state, ZSET, event, key)
        if not ctx.state.keyspace.exists(key):
            notify(ctx.state, GENERIC, "del", key)
    return count


def _zrandmember(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    ks = ctx.state.keyspace
    if len(args) == 1:
        picked = zrandmember(ks, args[0], None)
        return None if not picked else picked[0][1]
    count, with_scores = random_count(args[1], args[2:], "WITHSCORES")
    found = zrandmember(ks, args[0], count) or []
    pairs: list[tuple[bytes, Reply]] = [(m, s) for s, m in found]
    return picked_reply(ctx, pairs, with_scores)


def _zscan(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    cursor = scan_cursor(args[1])
    if ks.zset(args[0]) is None:
        return [b"0", []]
    options = scan_options(args[2:])
    nxt, pairs = zscan(ks, args[0], cursor, options.count, options.pattern)
    flat: list[Reply] = [x for pair in pairs for x in pair]
    return [str(nxt).encode(), flat]


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("ZINCRBY", _zincrby, 4, _WRITE, "Increment a member's score"),
    Command("ZRANK", _zrank, -3, _READ, "A member's rank, lowest score first"),
    Command("ZREVRANK", _zrevrank, -3, _READ, "A member's rank, highest score first"),
    Command("ZCOUNT", _zcount, 4, _READ, "Members within a score range"),
    Command("ZLEXCOUNT", _zlexcount, 4, _READ, "Members within a name range"),
    Command("ZMSCORE", _zmscore, -3, _READ, "Several members' scores"),
    Command("ZPOPMIN", _zpopmin, -2, _WRITE, "Remove and return the lowest members"),
    Command("ZPOPMAX", _zpopmax, -2, _WRITE, "Remove and return the highest members"),
    Command("ZMPOP", _zmpop, -4, frozenset({"write"}), "Pop from the first non-empty set"),
    Command("ZREMRANGEBYRANK", _zremrangebyrank, 4, frozenset({"write"}), "Remove by rank"),
    Command("ZREMRANGEBYSCORE", _zremrangebyscore, 4, frozenset({"write"}), "Remove by score"),
    Command("ZREMRANGEBYLEX", _zremrangebylex, 4, frozenset({"write"}), "Remove by name"),
    Command("ZRANDMEMBER", _zrandmember, -2, frozenset({"readonly"}), "Random members"),
    Command("ZSCAN", _zscan, -3, frozenset({"readonly"}), "Iterate over a sorted set"),
]
