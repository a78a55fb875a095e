"""List commands of the plain keyspace: LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP, RPOP (with
count), LLEN, LRANGE, LINDEX, LSET, LINSERT, LREM, LTRIM, LPOS, LMOVE, RPOPLPUSH and
LMPOP, with Redis 7.0's replies and errors, in its order of checks (which argument
is parsed before the key is looked up decides which error a bad call gets). The
semantics are ``pion.keyspace.lists``'s; the blocking forms are ``blocking.py``'s.

An LRANGE of a long list takes the elements in one step (a C-speed slice of the
deque) and encodes them in steps (``chunked.py``).

Keyspace notifications are Redis 7.0's (``t_list.c``): one event per command that
changed the list (``lpush``, ``rpop``, ``ltrim``...), then ``del`` when the change
left it empty (the key goes with its last element). LMOVE announces the push on the
destination, then the pop on the source (and its ``del``); the blocking forms
announce the same through :func:`pop_announced` and :func:`move_announced`. ``new``
comes from the keyspace, when a push creates the key.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.chunked import reply
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context, ServerState
from pion.commands.zsets import keyword, long_arg
from pion.errors import PionError
from pion.keyspace.lists import lindex, linsert, lmove, lpos, lrange, lrem, lset, ltrim, pop, push
from pion.keyspace.numbers import parse_int64
from pion.notify import GENERIC, LIST, notify
from pion.resp.reply import NullArray, Reply, Simple

__all__ = ["COMMANDS", "end_of", "move_announced", "mpop_args", "pop_announced", "pop_reply"]

_SYNTAX = "syntax error"


def end_of(raw: bytes) -> bool:
    """LEFT (True) or RIGHT (False), else Redis's syntax error."""
    word = keyword(raw)
    if word not in ("LEFT", "RIGHT"):
        raise PionError(_SYNTAX)
    return word == "LEFT"


def _emptied(state: ServerState, key: bytes) -> None:
    """Announce ``del`` when the change just announced took ``key``'s last element
    (looked up only when ``g`` is on: with notifications off this costs one test)."""
    if state.notify_flags & GENERIC and not state.keyspace.exists(key):
        notify(state, GENERIC, "del", key)


def pop_announced(state: ServerState, key: bytes, left: bool, count: int) -> list[bytes] | None:
    """:func:`~pion.keyspace.lists.pop`, announced: ``lpop``/``rpop`` when something
    was popped, then ``del`` when the list went (LPOP, LMPOP, BLPOP and friends)."""
    got = pop(state.keyspace, key, left, count)
    if got:
        notify(state, LIST, "lpop" if left else "rpop", key)
        _emptied(state, key)
    return got


def move_announced(
    state: ServerState, source: bytes, destination: bytes, from_left: bool, to_left: bool
) -> bytes | None:
    """:func:`~pion.keyspace.lists.lmove`, announced in Redis's order: the push on
    ``destination``, then the pop on ``source`` and its ``del`` (LMOVE, BLMOVE...)."""
    value = lmove(state.keyspace, source, destination, from_left, to_left)
    if value is not None:
        notify(state, LIST, "lpush" if to_left else "rpush", destination)
        notify(state, LIST, "lpop" if from_left else "rpop", source)
        _emptied(state, source)
    return value


def _push(ctx: Context, args: Sequence[bytes], left: bool, only_existing: bool) -> Reply:
    length = push(ctx.state.keyspace, args[0], list(args[1:]), left, only_existing=only_existing)
    if length:
        notify(ctx.state, LIST, "lpush" if left else "rpush", args[0])
    return length


def _lpush(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _push(ctx, args, True, only_existing=False)


def _rpush(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _push(ctx, args, False, only_existing=False)


def _lpushx(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _push(ctx, args, True, only_existing=True)


def _rpushx(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _push(ctx, args, False, only_existing=True)


def _positive(raw: bytes, message: str | None = None) -> int:
    value = parse_int64(raw)
    if value is None or value < 0:
        raise PionError(message or "value is out of range, must be positive")
    return value


def _pop(ctx: Context, args: Sequence[bytes], left: bool, name: str) -> Reply | Steps:
    if len(args) > 2:
        raise PionError(f"wrong number of arguments for '{name}' command")
    if len(args) == 1:
        got = pop_announced(ctx.state, args[0], left, 1)
        return got[0] if got else None
    count = _positive(args[1])
    got = pop_announced(ctx.state, args[0], left, count)
    if got is None:
        return NullArray()
    return reply(list(got), ctx.client.proto)


def _lpop(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _pop(ctx, args, True, "lpop")


def _rpop(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return _pop(ctx, args, False, "rpop")


def _llen(ctx: Context, args: Sequence[bytes]) -> Reply:
    d = ctx.state.keyspace.list_at(args[0])
    return 0 if d is None else len(d)


def _lrange(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    start, stop = long_arg(args[1]), long_arg(args[2])
    items: list[Reply] = list(lrange(ctx.state.keyspace, args[0], start, stop))
    return reply(items, ctx.client.proto)


def _lindex(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if ks.list_at(args[0], read=False) is None:
        ks.misses += 1
        return None
    return lindex(ks, args[0], long_arg(args[1]))


def _lset(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if ks.list_at(args[0], read=False) is None:
        raise PionError("no such key")
    lset(ks, args[0], long_arg(args[1]), args[2])
    notify(ctx.state, LIST, "lset", args[0])
    return Simple("OK")


def _linsert(ctx: Context, args: Sequence[bytes]) -> Reply:
    where = keyword(args[1])
    if where not in ("BEFORE", "AFTER"):
        raise PionError(_SYNTAX)
    length = linsert(ctx.state.keyspace, args[0], where == "BEFORE", args[2], args[3])
    if length > 0:
        notify(ctx.state, LIST, "linsert", args[0])
    return length


def _lrem(ctx: Context, args: Sequence[bytes]) -> Reply:
    removed = lrem(ctx.state.keyspace, args[0], long_arg(args[1]), args[2])
    if removed:
        notify(ctx.state, LIST, "lrem", args[0])
        _emptied(ctx.state, args[0])
    return removed


def _ltrim(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    start, stop = long_arg(args[1]), long_arg(args[2])
    # Redis announces ltrim whenever the list exists, even when nothing was trimmed.
    existed = ks.list_at(args[0], read=False) is not None
    ltrim(ks, args[0], start, stop)
    if existed:
        notify(ctx.state, LIST, "ltrim", args[0])
        _emptied(ctx.state, args[0])
    return Simple("OK")


def _lpos(ctx: Context, args: Sequence[bytes]) -> Reply:
    rank, count, maxlen = 1, -1, 0
    i = 2
    while i < len(args):
        word = keyword(args[i])
        more = i + 1 < len(args)
        if word == "RANK" and more:
            value = long_arg(args[i + 1])  # Redis 7.0 takes LONG_MIN too
            if value == 0:
                raise PionError(
                    "RANK can't be zero: use 1 to start from the first match, 2 from the "
                    "second ... or use negative to start from the end of the list"
                )
            rank = value
        elif word == "COUNT" and more:
            count = _positive(args[i + 1], "COUNT can't be negative")
        elif word == "MAXLEN" and more:
            maxlen = _positive(args[i + 1], "MAXLEN can't be negative")
        else:
            raise PionError(_SYNTAX)
        i += 2
    found = lpos(
        ctx.state.keyspace, args[0], args[1], rank=rank, count=max(count, 0), maxlen=maxlen
    )
    if count >= 0:
        return list(found)
    if count < 0 and found:
        return found[0]
    return None


def _lmove(ctx: Context, args: Sequence[bytes]) -> Reply:
    from_left, to_left = end_of(args[2]), end_of(args[3])
    return move_announced(ctx.state, args[0], args[1], from_left, to_left)


def _rpoplpush(ctx: Context, args: Sequence[bytes]) -> Reply:
    return move_announced(ctx.state, args[0], args[1], False, True)


def mpop_args(args: Sequence[bytes], ends: tuple[str, ...]) -> tuple[list[bytes], str, int]:
    """``numkeys key [key ...] <end> [COUNT count]`` (LMPOP, ZMPOP and their blocking
    forms): the keys, the end's keyword and the count (1 without COUNT)."""
    numkeys = parse_int64(args[0])
    if numkeys is None or numkeys < 1:
        raise PionError("numkeys should be greater than 0")
    at = 1 + numkeys
    if at >= len(args):
        raise PionError(_SYNTAX)
    end = keyword(args[at])
    if end not in ends:
        raise PionError(_SYNTAX)
    count = -1
    i = at + 1
    while i < len(args):
        if count == -1 and keyword(args[i]) == "COUNT" and i + 1 < len(args):
            value = parse_int64(args[i + 1])
            if value is None or value < 1:
                raise PionError("count should be greater than 0")
            count = value
            i += 2
        else:
            raise PionError(_SYNTAX)
    return list(args[1:at]), end, max(count, 1)


def pop_reply(key: bytes, items: list[bytes]) -> Reply:
    """LMPOP's and BLMPOP's answer: the key and what was popped."""
    return [key, list(items)]


def _lmpop(ctx: Context, args: Sequence[bytes]) -> Reply:
    keys, end, count = mpop_args(args, ("LEFT", "RIGHT"))
    for key in keys:
        got = pop_announced(ctx.state, key, end == "LEFT", count)
        if got:
            return pop_reply(key, got)
    return NullArray()


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})
_SLOW_WRITE = frozenset({"write"})

COMMANDS: list[Command] = [
    Command("LPUSH", _lpush, -3, _WRITE, "Prepend elements to a list"),
    Command("RPUSH", _rpush, -3, _WRITE, "Append elements to a list"),
    Command("LPUSHX", _lpushx, -3, _WRITE, "Prepend elements to an existing list"),
    Command("RPUSHX", _rpushx, -3, _WRITE, "Append elements to an existing list"),
    Command("LPOP", _lpop, -2, _WRITE, "Remove and return a list's first elements"),
    Command("RPOP", _rpop, -2, _WRITE, "Remove and return a list's last elements"),
    Command("LLEN", _llen, 2, _READ, "Length of a list"),
    Command("LRANGE", _lrange, 4, frozenset({"readonly"}), "A range of a list's elements"),
    Command("LINDEX", _lindex, 3, frozenset({"readonly"}), "A list's element by index"),
    Command("LSET", _lset, 4, _SLOW_WRITE, "Set a list's element by index"),
    Command("LINSERT", _linsert, 5, _SLOW_WRITE, "Insert before or after an element"),
    Command("LREM", _lrem, 4, _SLOW_WRITE, "Remove elements equal to a value"),
    Command("LTRIM", _ltrim, 4, _SLOW_WRITE, "Keep only a range of a list"),
    Command("LPOS", _lpos, -3, frozenset({"readonly"}), "Indexes of matching elements"),
    Command("LMOVE", _lmove, 5, _SLOW_WRITE, "Pop from one list, push to another"),
    Command("RPOPLPUSH", _rpoplpush, 3, _SLOW_WRITE, "Pop the tail, push to a head"),
    Command("LMPOP", _lmpop, -4, _SLOW_WRITE, "Pop from the first non-empty list"),
]
