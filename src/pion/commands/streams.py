"""Stream commands without consumer groups: XADD, XRANGE, XREVRANGE, XLEN, XDEL,
XTRIM, XSETID and XREAD (BLOCK included), with Redis 7.0's replies and errors, in its
order of checks. The semantics are ``pion.keyspace.streams``'s; the consumer groups'
commands are ``streams_groups.py``'s, XINFO ``streams_info.py``'s.

XREAD BLOCK waits as BLPOP does (``blocking.py``): an XADD to one of its keys, from
any client, wakes it after that command (after EXEC, after a script); the ids it
waits past are fixed when it blocks (``$`` is the stream's last id then). Inside
EXEC it does not wait: with nothing to read it answers the null array; inside a script
BLOCK is refused, as Redis refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pion.commands.blocking import block
from pion.commands.deferred import Wait
from pion.commands.state import Command, Context
from pion.commands.streams_args import (
    entries_reply,
    parse_interval,
    parse_strict_id,
    parse_xadd_id,
)
from pion.commands.zsets import keyword, long_arg
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.keyspace.streamops import StreamId
from pion.keyspace.streams import Trim, stream_at, xadd, xdel, xsetid, xtrim
from pion.keyspace.streamtype import MAX_ID, MAX_U64, format_id
from pion.notify import STREAM, notify
from pion.resp.reply import NullArray, Reply, Simple

__all__ = ["COMMANDS", "block_ms", "read_streams_args", "streams_reply"]

_SYNTAX = "syntax error"
_LLONG_MAX = (1 << 63) - 1


def _trim_args(args: Sequence[bytes], xadd_form: bool) -> tuple[int, Trim | None, bool]:
    """``streamParseAddOrTrimArgsOrReply``: where the id (XADD) or the end is, the
    trim asked for and NOMKSTREAM."""
    maxlen: int | None = None
    minid: StreamId | None = None
    approx = nomk = False
    limit = 0
    limit_given = False
    i = 1
    while i < len(args):
        more = len(args) - 1 - i
        word = keyword(args[i])
        if xadd_form and args[i] == b"*":
            break
        if word in ("MAXLEN", "MINID") and more:
            if maxlen is not None or minid is not None:
                raise PionError(
                    "syntax error, MAXLEN and MINID options at the same time are not compatible"
                )
            approx = False
            if more >= 2 and args[i + 1] in (b"~", b"="):
                approx = args[i + 1] == b"~"
                i += 1
            if word == "MAXLEN":
                maxlen = long_arg(args[i + 1])
                if maxlen < 0:
                    raise PionError("The MAXLEN argument must be >= 0.")
            else:
                minid = parse_strict_id(args[i + 1])
            i += 2
        elif word == "LIMIT" and more:
            limit = long_arg(args[i + 1])
            if limit < 0:
                raise PionError("The LIMIT argument must be >= 0.")
            limit_given = True
            i += 2
        elif xadd_form and word == "NOMKSTREAM":
            nomk = True
            i += 1
        elif xadd_form:
            parse_xadd_id(args[i])  # the id: malformed, it is the error (Redis's order)
            break
        else:
            raise PionError(_SYNTAX)
    trimming = maxlen is not None or minid is not None
    if limit and not trimming:
        raise PionError("syntax error, LIMIT cannot be used without specifying a trimming strategy")
    if not xadd_form and not trimming:
        raise PionError("syntax error, XTRIM must be called with a trimming strategy")
    if limit_given and not approx:
        raise PionError("syntax error, LIMIT cannot be used without the special ~ option")
    if not limit_given and approx:
        limit = 100 * 100  # 100 x stream-node-max-entries, as Redis
    return i, (Trim(maxlen, minid, approx, limit) if trimming else None), nomk


def _xadd(ctx: Context, args: Sequence[bytes]) -> Reply:
    at, trim, nomk = _trim_args(args, True)
    given: StreamId | None = None
    seq_given = True
    if at < len(args) and args[at] != b"*":
        given, seq_given = parse_xadd_id(args[at])
    fields = tuple(args[at + 1 :])
    if len(fields) < 2 or len(fields) % 2:
        raise PionError("wrong number of arguments for 'xadd' command")
    if given == (0, 0) and seq_given:
        raise PionError("The ID specified in XADD must be greater than 0-0")
    key = args[0]
    got = xadd(ctx.state.keyspace, key, fields, given, seq_given, nomkstream=nomk, trim=trim)
    if got is None:
        return None
    new, trimmed = got
    notify(ctx.state, STREAM, "xadd", key)
    if trimmed:
        notify(ctx.state, STREAM, "xtrim", key)
    return format_id(new)


def _range(ctx: Context, args: Sequence[bytes], rev: bool) -> Reply:
    start_raw, end_raw = (args[2], args[1]) if rev else (args[1], args[2])
    start, start_ex = parse_interval(start_raw, 0)
    if start_ex:
        if start == MAX_ID:
            raise PionError("invalid start ID for the interval")
        start = (start[0], start[1] + 1) if start[1] < MAX_U64 else (start[0] + 1, 0)
    end, end_ex = parse_interval(end_raw, MAX_U64)
    if end_ex:
        if end == (0, 0):
            raise PionError("invalid end ID for the interval")
        end = (end[0], end[1] - 1) if end[1] else (end[0] - 1, MAX_U64)
    count = -1
    i = 3
    while i < len(args):
        if keyword(args[i]) == "COUNT" and i + 1 < len(args):
            count = max(long_arg(args[i + 1]), 0)
            i += 2
        else:
            raise PionError(_SYNTAX)
    s = stream_at(ctx.state.keyspace, args[0])
    if s is None:
        return []
    if count == 0:
        return NullArray()
    return entries_reply(s, s.range(start, end, max(count, 0), rev))


def _xrange(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _range(ctx, args, False)


def _xrevrange(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _range(ctx, args, True)


def _xlen(ctx: Context, args: Sequence[bytes]) -> Reply:
    s = stream_at(ctx.state.keyspace, args[0])
    return 0 if s is None else len(s)


def _xdel(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if stream_at(ks, args[0], read=False) is None:
        return 0
    ids = [parse_strict_id(raw) for raw in args[1:]]
    gone = xdel(ks, args[0], ids)
    if gone:
        notify(ctx.state, STREAM, "xdel", args[0])
    return gone


def _xtrim(ctx: Context, args: Sequence[bytes]) -> Reply:
    _, trim, _ = _trim_args(args, False)
    assert trim is not None
    gone = xtrim(ctx.state.keyspace, args[0], trim)
    if gone:
        notify(ctx.state, STREAM, "xtrim", args[0])
    return gone


def _xsetid(ctx: Context, args: Sequence[bytes]) -> Reply:
    last = parse_strict_id(args[1])
    added = -1
    max_deleted = (0, 0)
    i = 2
    while i < len(args):
        word = keyword(args[i])
        if word == "ENTRIESADDED" and i + 1 < len(args):
            added = long_arg(args[i + 1])
            if added < 0:
                raise PionError("entries_added must be positive")
        elif word == "MAXDELETEDID" and i + 1 < len(args):
            max_deleted = parse_strict_id(args[i + 1])
            if last < max_deleted:
                raise PionError(
                    "The ID specified in XSETID is smaller than the provided max_deleted_entry_id"
                )
        else:
            raise PionError(_SYNTAX)
        i += 2
    ks = ctx.state.keyspace
    s = stream_at(ks, args[0], read=False)
    if s is None:
        raise PionError("no such key")
    if last < s.max_deleted:
        raise PionError("The ID specified in XSETID is smaller than current max_deleted_entry_id")
    if s.ids and last < s.ids[-1]:
        raise PionError("The ID specified in XSETID is smaller than the target stream top item")
    if s.ids and added != -1 and len(s) > added:
        raise PionError(
            "The entries_added specified in XSETID is smaller than the target stream length"
        )
    xsetid(
        ks,
        args[0],
        last,
        s.entries_added if added == -1 else added,
        s.max_deleted if max_deleted == (0, 0) else max_deleted,
    )
    notify(ctx.state, STREAM, "xsetid", args[0])
    return Simple("OK")


def block_ms(raw: bytes, now_ms: int) -> float | None:
    """BLOCK's milliseconds (an integer): the wait in seconds, None for 0 (forever)."""
    value = parse_int64(raw)
    if value is None:
        raise PionError("timeout is not an integer or out of range")
    if value < 0:
        raise PionError("timeout is negative")
    if value > _LLONG_MAX - now_ms:
        raise PionError("timeout is out of range")
    return value / 1000 if value else None


class ReadArgs:
    """XREAD's and XREADGROUP's options and their STREAMS keys and ids (raw)."""

    __slots__ = ("block", "count", "group", "ids", "keys", "noack")

    def __init__(self) -> None:
        self.block: float | bool | None = False  # False: no BLOCK
        self.count = 0
        self.group: tuple[bytes, bytes] | None = None
        self.noack = False
        self.keys: list[bytes] = []
        self.ids: list[bytes] = []


def read_streams_args(ctx: Context, args: Sequence[bytes], group_form: bool) -> ReadArgs:
    """Redis's ``xreadCommand`` argument loop."""
    out = ReadArgs()
    name = "XREADGROUP" if group_form else "XREAD"
    streams_at = 0
    i = 0
    while i < len(args):
        more = len(args) - i - 1
        word = keyword(args[i])
        if word == "BLOCK" and more:
            scripts = ctx.state.scripts
            if scripts is not None and scripts.running:
                raise PionError(
                    f"{name.lower()} command is not allowed with BLOCK option from scripts"
                )
            out.block = block_ms(args[i + 1], ctx.state.keyspace.clock())
            i += 2
        elif word == "COUNT" and more:
            out.count = max(long_arg(args[i + 1]), 0)
            i += 2
        elif word == "STREAMS" and more:
            streams_at = i + 1
            n = len(args) - streams_at
            if n % 2:
                symbol = ">" if group_form else "$"
                raise PionError(
                    f"Unbalanced {name} list of streams: for each stream key an ID or "
                    f"'{symbol}' must be specified."
                )
            half = n // 2
            out.keys = list(args[streams_at : streams_at + half])
            out.ids = list(args[streams_at + half :])
            break
        elif word == "GROUP" and more >= 2:
            if not group_form:
                raise PionError(
                    "The GROUP option is only supported by XREADGROUP. You called XREAD instead."
                )
            out.group = (args[i + 1], args[i + 2])
            i += 3
        elif word == "NOACK":
            if not group_form:
                raise PionError(
                    "The NOACK option is only supported by XREADGROUP. You called XREAD instead."
                )
            out.noack = True
            i += 1
        else:
            raise PionError(_SYNTAX)
    if not streams_at:
        raise PionError(_SYNTAX)
    if group_form and out.group is None:
        raise PionError("Missing GROUP option for XREADGROUP")
    return out


def streams_reply(ctx: Context, got: list[tuple[bytes, Reply]]) -> Reply:
    """XREAD's reply: ``[[key, entries], ...]`` in RESP2, a map in RESP3."""
    if ctx.client.proto == 3:
        return {key: entries for key, entries in got}
    return [[key, entries] for key, entries in got]


def _xread(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    opts = read_streams_args(ctx, args, False)
    ks = ctx.state.keyspace
    after: list[StreamId] = []
    for key, raw in zip(opts.keys, opts.ids, strict=True):
        s = stream_at(ks, key)
        if raw == b"$":
            after.append(s.last_id if s is not None else (0, 0))
        elif raw == b">":
            raise PionError(
                "The > ID can be specified only when calling XREADGROUP using the GROUP "
                "<group> <consumer> option."
            )
        else:
            after.append(parse_strict_id(raw))
    attempt = _reader(ctx, opts.keys, after, opts.count)
    if opts.block is False:
        got = attempt()
        return NullArray() if got is None else got
    return block(ctx, opts.keys, attempt, opts.block, NullArray())


def _reader(
    ctx: Context, keys: list[bytes], after: list[StreamId], count: int
) -> Callable[[], Reply | None]:
    ks = ctx.state.keyspace

    def attempt() -> Reply | None:
        got: list[tuple[bytes, Reply]] = []
        for key, gt in zip(keys, after, strict=True):
            s = stream_at(ks, key, read=False)
            if s is None or not s.ids or s.ids[-1] <= gt:
                continue
            got.append((key, entries_reply(s, s.after(gt, count))))
        return streams_reply(ctx, got) if got else None

    return attempt


_READ = frozenset({"readonly"})
_READ_FAST = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("XADD", _xadd, -5, _WRITE, "Append an entry to a stream"),
    Command("XRANGE", _xrange, -4, _READ, "A range of a stream's entries"),
    Command("XREVRANGE", _xrevrange, -4, _READ, "A range of a stream's entries, reversed"),
    Command("XLEN", _xlen, 2, _READ_FAST, "Number of entries in a stream"),
    Command("XDEL", _xdel, -3, _WRITE, "Delete entries from a stream"),
    Command("XTRIM", _xtrim, -4, frozenset({"write"}), "Trim a stream to a length or id"),
    Command("XSETID", _xsetid, -3, _WRITE, "Set a stream's last id and counters"),
    Command("XREAD", _xread, -4, frozenset({"readonly", "blocking"}), "Read streams, waiting"),
]
