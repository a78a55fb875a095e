"""Sorted-set commands of the plain keyspace: ZADD (NX/XX/GT/LT/CH/INCR), ZRANGE (by
rank with negative indexes, BYSCORE, BYLEX, REV, LIMIT, WITHSCORES) and its older forms
ZREVRANGE, ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGEBYLEX, ZREVRANGEBYLEX (what redis-py
sends for some calls), ZREM, ZSCORE, ZCARD. The others are in ``zsets_more.py``.

Replies are Redis 7.0's: scores are doubles (``%.17g``; a bulk string in RESP2, a
``,`` double in RESP3), ZRANGE WITHSCORES is flat in RESP2 and ``[member, score]``
pairs in RESP3.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator, Sequence

from pion.commands.chunked import BIG_REPLY, STEP_ITEMS, pairs_reply, work_steps
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.entries import KEY_OVERHEAD, MEMBER_OVERHEAD
from pion.keyspace.numbers import parse_int64, parse_range_bound, parse_score
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.zsets import (
    ScoreRange,
    ZAddFlags,
    ZAddPlan,
    ZAddResult,
    parse_lex_bound,
    zadd,
    zrange_by_lex,
    zrange_by_rank,
    zrange_by_score,
)
from pion.notify import GENERIC, ZSET, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS", "keyword", "long_arg", "with_scores", "zrange_pick"]

_SYNTAX = "syntax error"
_NOT_A_FLOAT = "value is not a valid float"
_ZADD_OPTIONS = frozenset({"NX", "XX", "CH", "INCR", "GT", "LT"})


def keyword(raw: bytes) -> str:
    try:
        return raw.decode("ascii").upper()
    except UnicodeDecodeError:
        return ""


def long_arg(raw: bytes) -> int:
    value = parse_int64(raw)
    if value is None:
        raise PionError("value is not an integer or out of range")
    return value


def _zadd(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    key = args[0]
    opts: set[str] = set()
    i = 1
    while i < len(args) and (word := keyword(args[i])) in _ZADD_OPTIONS:
        opts.add(word)
        i += 1
    rest = args[i:]
    if not rest or len(rest) % 2:
        raise PionError(_SYNTAX)
    flags = ZAddFlags(*(o in opts for o in ("NX", "XX", "GT", "LT", "CH", "INCR")))
    if flags.nx and flags.xx:
        raise PionError("XX and NX options at the same time are not compatible")
    if (flags.gt and flags.nx) or (flags.lt and flags.nx) or (flags.gt and flags.lt):
        raise PionError("GT, LT, and/or NX options at the same time are not compatible")
    if flags.incr and len(rest) > 2:
        raise PionError("INCR option supports a single increment-element pair")
    if len(rest) // 2 > BIG_REPLY:
        return work_steps(_zadd_in_steps(ctx, key, rest, flags))
    pairs: list[tuple[float, bytes]] = []
    for j in range(0, len(rest), 2):
        score = parse_score(rest[j])
        if score is None:
            raise PionError(_NOT_A_FLOAT)
        pairs.append((score, rest[j + 1]))
    return _zadd_reply(ctx, key, zadd(ctx.state.keyspace, key, pairs, flags), flags)


def _zadd_reply(ctx: Context, key: bytes, res: ZAddResult, flags: ZAddFlags) -> Reply:
    if res.added or res.updated:
        notify(ctx.state, ZSET, "zincr" if flags.incr else "zadd", key)
    if flags.incr:
        return res.last_score if res.processed else None
    return res.added + res.updated if flags.ch else res.added


def _zadd_in_steps(
    ctx: Context, key: bytes, rest: Sequence[bytes], flags: ZAddFlags
) -> Generator[None, None, Reply]:
    """A long ZADD (docs/decisions.md, "Fair shares of the loop"). Its scores are
    parsed in steps (nothing shared is touched). To an existing key it is then worked
    out and applied in one step, atomic. To a new key, the set is built aside in
    steps (sorted in runs, the runs merged) and installed in one step, if the key is
    still missing then; if it was created meanwhile, the ZADD is applied to it in one
    step instead. Either way other clients see the ZADD all at once or not at all."""
    ks = ctx.state.keyspace
    pairs: list[tuple[float, bytes]] = []
    for start in range(0, len(rest), 2 * STEP_ITEMS):
        for j in range(start, min(len(rest), start + 2 * STEP_ITEMS), 2):
            score = parse_score(rest[j])
            if score is None:
                raise PionError(_NOT_A_FLOAT)
            pairs.append((score, rest[j + 1]))
        yield
    if flags.xx or ks.zset(key, read=False) is not None:
        return _zadd_reply(ctx, key, zadd(ks, key, pairs, flags), flags)
    plan = ZAddPlan(flags)
    for start in range(0, len(pairs), STEP_ITEMS):
        plan.step(pairs[start : start + STEP_ITEMS], _absent)
        yield
    items = list(plan.final.items())
    size = len(key) + KEY_OVERHEAD
    runs: list[list[tuple[float, bytes]]] = []
    for start in range(0, len(items), STEP_ITEMS):
        chunk = items[start : start + STEP_ITEMS]
        runs.append(sorted([(score, m) for m, score in chunk]))
        size += sum(len(m) for m, _ in chunk) + len(chunk) * MEMBER_OVERHEAD
        yield
    while len(runs) > 1:
        merged = []
        for i in range(0, len(runs), 2):
            if i + 1 == len(runs):
                merged.append(runs[i])
            elif len(runs[i]) + len(runs[i + 1]) <= 8 * STEP_ITEMS:
                merged.append(sorted(runs[i] + runs[i + 1]))  # two runs: a C merge
                yield
            else:  # long runs: merged STEP_ITEMS entries a step
                into: list[tuple[float, bytes]] = []
                both = heapq.merge(runs[i], runs[i + 1])
                while part := list(itertools.islice(both, 4 * STEP_ITEMS)):
                    into += part
                    yield
                merged.append(into)
        runs = merged
    if ks.zset(key, read=False) is not None:  # created meanwhile
        return _zadd_reply(ctx, key, zadd(ks, key, pairs, flags), flags)
    ks.zset_create(SortedSet.adopt(plan.final, runs[0]), key, size)
    return _zadd_reply(ctx, key, plan.result(), flags)


def _absent(member: bytes) -> float | None:
    return None


def with_scores(ctx: Context, entries: list[tuple[float, bytes]], scores: bool) -> Reply | Steps:
    # (score, member) entries, taken from the set in one step; a long reply is
    # encoded in steps (pion.commands.chunked).
    proto = ctx.client.proto
    if not scores:
        return pairs_reply(entries, proto, "first", swap=True)
    return pairs_reply(entries, proto, "nested" if proto == 3 else "flat", swap=True)


def zrange_pick(
    ctx: Context,
    args: Sequence[bytes],
    by: str | None = None,
    rev: bool | None = None,
    *,
    store: bool = False,
) -> tuple[list[tuple[float, bytes]] | None, bool]:
    """Redis 7.0's ``zrangeGenericCommand`` up to the range taken: options first, then
    the range, then the key (so argument errors win over WRONGTYPE). Returns the
    picked (score, member) entries (None: no such key) and whether WITHSCORES was
    given. ZREVRANGE, ZRANGEBYSCORE and ZREVRANGEBYSCORE preset ``by``/``rev``; an
    option naming them again is a syntax error there, as in Redis. ``store``
    (ZRANGESTORE, whose ``args`` start at the source key) refuses WITHSCORES."""
    key, low_raw, high_raw = args[0], args[1], args[2]
    # None: ZRANGE, where REV may be given; the older commands fix the direction.
    may_reverse = rev is None
    rev = bool(rev)
    withscores = False
    offset, count = 0, -1
    i = 3
    while i < len(args):
        word = keyword(args[i])
        left = len(args) - i - 1
        if word == "WITHSCORES" and not store:
            withscores = True
        elif word == "LIMIT" and left >= 2:
            offset, count = long_arg(args[i + 1]), long_arg(args[i + 2])
            i += 2
        elif word == "REV" and not rev and may_reverse:
            rev = True
        elif word in ("BYSCORE", "BYLEX") and by is None:
            by = word
        else:
            raise PionError(_SYNTAX)
        i += 1
    # As in Redis 7.0: a LIMIT whose count is -1 ("all") passes on a rank range.
    if count != -1 and by in (None, "RANK"):
        raise PionError(
            "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
        )
    if withscores and by == "BYLEX":
        raise PionError("syntax error, WITHSCORES not supported in combination with BYLEX")
    if by == "BYLEX":
        if rev:
            low_raw, high_raw = high_raw, low_raw
        low_lex, high_lex = parse_lex_bound(low_raw), parse_lex_bound(high_raw)
        if low_lex is None or high_lex is None:
            raise PionError("min or max not valid string range item")
        z = ctx.state.keyspace.zset(key)
        if z is None:
            return None, False
        return zrange_by_lex(z, low_lex, high_lex, rev, offset=offset, count=count), False
    if by == "BYSCORE":
        if rev:
            low_raw, high_raw = high_raw, low_raw
        low, high = parse_range_bound(low_raw), parse_range_bound(high_raw)
        if low is None or high is None:
            raise PionError("min or max is not a float")
        z = ctx.state.keyspace.zset(key)
        if z is None:
            return None, withscores
        rng = ScoreRange(low[0], low[1], high[0], high[1])
        return zrange_by_score(z, rng, rev, offset, count), withscores
    start, stop = long_arg(low_raw), long_arg(high_raw)
    z = ctx.state.keyspace.zset(key)
    if z is None:
        return None, withscores
    return zrange_by_rank(z, start, stop, rev), withscores


def _zrange_generic(
    ctx: Context, args: Sequence[bytes], by: str | None = None, rev: bool | None = None
) -> Reply | Steps:
    """ZRANGE and its older forms: :func:`zrange_pick`'s entries as the reply (a
    missing key is an empty array)."""
    picked, withscores = zrange_pick(ctx, args, by, rev)
    if picked is None:
        return []
    return with_scores(ctx, picked, withscores)


def _zrange(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args)


def _zrevrange(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args, by="RANK", rev=True)


def _zrangebyscore(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args, by="BYSCORE", rev=False)


def _zrevrangebyscore(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args, by="BYSCORE", rev=True)


def _zrangebylex(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args, by="BYLEX", rev=False)


def _zrevrangebylex(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _zrange_generic(ctx, args, by="BYLEX", rev=True)


def _zrem(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    removed = ks.zset_delete(args[0], args[1:])
    if removed:
        notify(ctx.state, ZSET, "zrem", args[0])
        if not ks.exists(args[0]):  # the last member went: the key with it
            notify(ctx.state, GENERIC, "del", args[0])
    return removed


def _zscore(ctx: Context, args: Sequence[bytes]) -> Reply:
    z = ctx.state.keyspace.zset(args[0])
    return None if z is None else z.scores.get(args[1])


def _zcard(ctx: Context, args: Sequence[bytes]) -> Reply:
    z = ctx.state.keyspace.zset(args[0])
    return 0 if z is None else len(z)


COMMANDS: list[Command] = [
    Command("ZADD", _zadd, -4, frozenset({"write", "fast"}), "Add members or update scores"),
    Command("ZRANGE", _zrange, -4, frozenset({"readonly"}), "Members by rank, score or name"),
    Command("ZREVRANGE", _zrevrange, -4, frozenset({"readonly"}), "ZRANGE ... REV"),
    Command("ZRANGEBYSCORE", _zrangebyscore, -4, frozenset({"readonly"}), "ZRANGE BYSCORE"),
    Command(
        "ZREVRANGEBYSCORE", _zrevrangebyscore, -4, frozenset({"readonly"}), "ZRANGE BYSCORE REV"
    ),
    Command("ZRANGEBYLEX", _zrangebylex, -4, frozenset({"readonly"}), "ZRANGE BYLEX"),
    Command("ZREVRANGEBYLEX", _zrevrangebylex, -4, frozenset({"readonly"}), "ZRANGE BYLEX REV"),
    Command("ZREM", _zrem, -3, frozenset({"write", "fast"}), "Remove members"),
    Command("ZSCORE", _zscore, 3, frozenset({"readonly", "fast"}), "A member's score"),
    Command("ZCARD", _zcard, 2, frozenset({"readonly", "fast"}), "Number of members"),
]
