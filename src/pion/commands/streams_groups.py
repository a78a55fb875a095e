"""Consumer groups' commands: XGROUP (CREATE, SETID, DESTROY, CREATECONSUMER,
DELCONSUMER, HELP), XREADGROUP (BLOCK included), XACK, XPENDING, XCLAIM and
XAUTOCLAIM, with Redis 7.0's replies and errors in its order of checks. The changes
are ``pion.keyspace.streams``'s: each is journaled as its effect (the ids delivered or
claimed, with their times and counts), so a restart rebuilds every PEL.

A blocked XREADGROUP ``>`` is served as XREAD is (``streams.py``): by an XADD to its
key, after that command, delivering then (the PEL and the group's last id move when
it is served, as in Redis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pion.commands.blocking import block
from pion.commands.deferred import Wait
from pion.commands.state import Command, Context
from pion.commands.streams import read_streams_args, streams_reply
from pion.commands.streams_args import entries_reply, parse_id, parse_interval, parse_strict_id
from pion.commands.zsets import keyword, long_arg
from pion.errors import NoGroupError, PionError
from pion.keyspace.numbers import parse_int64
from pion.keyspace.streamops import StreamId
from pion.keyspace.streams import (
    ack,
    claim,
    create_consumer,
    create_group,
    delete_consumer,
    deliver,
    destroy_group,
    group_at,
    set_group_id,
    stream_at,
)
from pion.keyspace.streamtype import MAX_ID, MAX_U64, UNKNOWN, Group, Stream, format_id
from pion.notify import STREAM, notify
from pion.resp.reply import ErrorReply, NullArray, Reply, Simple

__all__ = ["COMMANDS"]

_SYNTAX = "syntax error"
_XGROUP_HELP = [
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
    "HELP",
    "    Prints this help.",
]
# Each subcommand's arity as Redis's table has it (negative: at least).
_XGROUP_ARITY = {
    "CREATE": -5,
    "SETID": -5,
    "DESTROY": 4,
    "CREATECONSUMER": 5,
    "DELCONSUMER": 5,
    "HELP": 2,
}
_NEEDS_KEY = (
    "The XGROUP subcommand requires the key to exist. Note that for CREATE you may want "
    "to use the MKSTREAM option to create an empty stream automatically."
)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _subcommand_error(sub: bytes, family: str) -> PionError:
    return PionError(
        f"unknown subcommand or wrong number of arguments for '{_text(sub)[:128]}'. "
        f"Try {family} HELP."
    )


def _xgroup(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = keyword(args[0])
    arity = _XGROUP_ARITY.get(sub)
    if arity is None:
        raise PionError(f"unknown subcommand '{_text(args[0])[:128]}'. Try XGROUP HELP.")
    n = len(args) + 1
    if (arity > 0 and n != arity) or (arity < 0 and n < -arity):
        raise PionError(f"wrong number of arguments for 'xgroup|{sub.lower()}' command")
    if sub == "HELP":
        return [Simple(line) for line in _XGROUP_HELP]
    mkstream = False
    read = UNKNOWN
    if sub in ("CREATE", "SETID"):
        i = 4
        while i < len(args):
            word = keyword(args[i])
            if sub == "CREATE" and word == "MKSTREAM":
                mkstream = True
                i += 1
            elif word == "ENTRIESREAD" and i + 1 < len(args):
                read = long_arg(args[i + 1])
                if read < 0 and read != UNKNOWN:
                    raise PionError("value for ENTRIESREAD must be positive or -1")
                i += 2
            else:
                raise _subcommand_error(args[0], "XGROUP")
    ks = ctx.state.keyspace
    key, name = args[1], args[2]
    s = stream_at(ks, key, read=False)
    if s is None and not (sub == "CREATE" and mkstream):
        raise PionError(_NEEDS_KEY)
    if s is not None and sub in ("SETID", "CREATECONSUMER", "DELCONSUMER") and name not in s.groups:
        raise NoGroupError(f"No such consumer group '{_text(name)}' for key name '{_text(key)}'")
    return _xgroup_run(ctx, sub, args, mkstream, read)


def _xgroup_run(ctx: Context, sub: str, args: Sequence[bytes], mkstream: bool, read: int) -> Reply:
    ks = ctx.state.keyspace
    key, name = args[1], args[2]
    if sub == "CREATE":
        if len(args) > 7:
            raise _subcommand_error(args[0], "XGROUP")
        last = None if args[3] == b"$" else parse_strict_id(args[3])
        create_group(ks, key, name, last=last, read=read, mkstream=mkstream)
        notify(ctx.state, STREAM, "xgroup-create", key)
        return Simple("OK")
    if sub == "SETID":
        if len(args) not in (4, 6):
            raise _subcommand_error(args[0], "XGROUP")
        last = None if args[3] == b"$" else parse_id(args[3])
        set_group_id(ks, key, name, last, read)
        notify(ctx.state, STREAM, "xgroup-setid", key)
        return Simple("OK")
    if sub == "DESTROY":
        if not destroy_group(ks, key, name):
            return 0
        notify(ctx.state, STREAM, "xgroup-destroy", key)
        return 1
    if sub == "CREATECONSUMER":
        created = create_consumer(ks, key, name, args[3])
        if created:
            notify(ctx.state, STREAM, "xgroup-createconsumer", key)
        return int(created)
    _, g = group_at(ks, key, name)
    if args[3] not in g.consumers:
        return 0
    pending = delete_consumer(ks, key, name, args[3])
    notify(ctx.state, STREAM, "xgroup-delconsumer", key)
    return pending


def _history(s: Stream, g: Group, consumer: bytes, after: StreamId, count: int) -> list[Reply]:
    """A consumer's own pending entries past ``after`` (a deleted one as ``[id, nil]``)."""
    c = g.consumers.get(consumer)
    if c is None:
        return []
    ids = sorted(i for i in c.pending if i > after)
    if count:
        ids = ids[:count]
    return [
        [format_id(i), list(s.entries[i])] if i in s.entries else [format_id(i), None] for i in ids
    ]


def _xreadgroup(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    opts = read_streams_args(ctx, args, True)
    assert opts.group is not None
    group, consumer = opts.group
    ks = ctx.state.keyspace
    after: list[StreamId | None] = []  # None: ">"
    for key, raw in zip(opts.keys, opts.ids, strict=True):
        s = stream_at(ks, key)
        if s is None or group not in s.groups:
            raise NoGroupError(
                f"No such key '{_text(key)}' or consumer group '{_text(group)}' in "
                "XREADGROUP with GROUP option"
            )
        if raw == b"$":
            raise PionError(
                "The $ ID is meaningless in the context of XREADGROUP: you want to read the "
                "history of this consumer by specifying a proper ID, or use the > ID to get "
                "new messages. The $ ID would just return an empty result set."
            )
        after.append(None if raw == b">" else parse_strict_id(raw))
    attempt = _group_reader(
        ctx, opts.keys, after, group=group, consumer=consumer, count=opts.count, noack=opts.noack
    )
    got = attempt()
    if got is not None or opts.block is False:
        return NullArray() if got is None else got
    return block(ctx, opts.keys, attempt, opts.block, NullArray(), sees_deletion=True)


def _group_reader(
    ctx: Context,
    keys: list[bytes],
    after: list[StreamId | None],
    *,
    group: bytes,
    consumer: bytes,
    count: int,
    noack: bool,
) -> Callable[[], Reply | None]:
    ks = ctx.state.keyspace

    def attempt() -> Reply | None:
        got: list[tuple[bytes, Reply]] = []
        for key, gt in zip(keys, after, strict=True):
            s = stream_at(ks, key, read=False)
            if s is None:  # deleted while it waited (it existed when it blocked)
                return ErrorReply("UNBLOCKED the stream key no longer exists")
            g = s.groups.get(group)
            if g is None:
                return ErrorReply(
                    "NOGROUP the consumer group this client was blocked on no longer exists"
                )
            if gt is not None:
                if consumer not in g.consumers:
                    create_consumer(ks, key, group, consumer)
                    notify(ctx.state, STREAM, "xgroup-createconsumer", key)
                g.consumers[consumer].seen = ks.clock()
                got.append((key, _history(s, g, consumer, gt, count)))
            elif s.ids and s.ids[-1] > g.last_id:
                new = consumer not in g.consumers
                ids = deliver(ks, key, group, consumer, count=count, noack=noack)
                if new:
                    notify(ctx.state, STREAM, "xgroup-createconsumer", key)
                got.append((key, entries_reply(s, ids)))
        return streams_reply(ctx, got) if got else None

    return attempt


def _xack(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    s = stream_at(ks, args[0])
    if s is None or args[1] not in s.groups:
        return 0
    ids = [parse_strict_id(raw) for raw in args[2:]]
    return ack(ks, args[0], args[1], ids)


def _bounds(start_raw: bytes, end_raw: bytes) -> tuple[StreamId, StreamId]:
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
    return start, end


def _xpending(ctx: Context, args: Sequence[bytes]) -> Reply:
    n = len(args) + 1
    if n != 3 and not 6 <= n <= 9:
        raise PionError(_SYNTAX)
    min_idle = 0
    start, end, count = (0, 0), MAX_ID, 0
    consumer: bytes | None = None
    if n >= 6:
        at = 2
        if keyword(args[2]) == "IDLE":
            min_idle = long_arg(args[3])
            if n < 8:
                raise PionError(_SYNTAX)
            at = 4
        count = max(long_arg(args[at + 2]), 0)
        start, end = _bounds(args[at], args[at + 1])
        if at + 3 < len(args):
            consumer = args[at + 3]
    ks = ctx.state.keyspace
    s = stream_at(ks, args[0])
    if s is None or args[1] not in s.groups:
        raise NoGroupError(f"No such key '{_text(args[0])}' or consumer group '{_text(args[1])}'")
    g = s.groups[args[1]]
    if n == 3:
        return _pending_summary(g)
    if consumer is not None and consumer not in g.consumers:
        return []
    pel = g.consumers[consumer].pending if consumer is not None else g.pel.keys()
    now = ks.clock()
    out: list[Reply] = []
    for i in sorted(i for i in pel if start <= i <= end):
        if len(out) >= count:
            break
        p = g.pel[i]
        if min_idle and now - p.time < min_idle:
            continue
        out.append([format_id(i), p.consumer, max(0, now - p.time), p.count])
    return out


def _pending_summary(g: Group) -> Reply:
    if not g.pel:
        return [0, None, None, NullArray()]
    ids = sorted(g.pel)
    owners: list[Reply] = [
        [name, str(len(c.pending)).encode()] for name, c in sorted(g.consumers.items()) if c.pending
    ]
    return [len(ids), format_id(ids[0]), format_id(ids[-1]), owners]


def _claim_option(raw: bytes, name: str) -> int:
    value = parse_int64(raw)
    if value is None:
        raise PionError(f"Invalid {name} option argument for XCLAIM")
    return value


class _ClaimOptions:
    """XCLAIM's options after its ids (Redis's order and errors); ``delivery`` is the
    time the claimed entries get (now when none, or a bogus one, was given)."""

    __slots__ = ("delivery", "force", "justid", "last", "retry")

    def __init__(self, args: Sequence[bytes], j: int, now: int) -> None:
        self.force = self.justid = False
        self.retry = -1
        self.last: StreamId = (0, 0)
        delivery = -1
        while j < len(args):
            word = keyword(args[j])
            more = j + 1 < len(args)
            if word == "FORCE":
                self.force = True
            elif word == "JUSTID":
                self.justid = True
            elif word in ("IDLE", "TIME", "RETRYCOUNT") and more:
                j += 1
                value = _claim_option(args[j], word)
                if word == "RETRYCOUNT":
                    self.retry = value
                else:
                    delivery = now - value if word == "IDLE" else value
            elif word == "LASTID" and more:
                j += 1
                self.last = parse_strict_id(args[j])
            else:
                raise PionError(f"Unrecognized XCLAIM option '{_text(args[j])}'")
            j += 1
        self.delivery = now if delivery < 0 or delivery > now else delivery


def _xclaim(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    key, group, consumer = args[0], args[1], args[2]
    s, g = group_at(ks, key, group)
    min_idle = parse_int64(args[3])
    if min_idle is None:
        raise PionError("Invalid min-idle-time argument for XCLAIM")
    min_idle = max(min_idle, 0)
    ids: list[StreamId] = []
    j = 4
    while j < len(args):
        try:
            ids.append(parse_strict_id(args[j]))
        except PionError:
            break
        j += 1
    now = ks.clock()
    opts = _ClaimOptions(args, j, now)
    force, justid, retry, delivery, last = (
        opts.force,
        opts.justid,
        opts.retry,
        opts.delivery,
        opts.last,
    )
    # What each id's PEL entry is as the claims so far left it (time, count; None:
    # none), for an id named twice: Redis claims it twice, counting both.
    state: dict[StreamId, tuple[int, int, bool] | None] = {}
    touched: dict[StreamId, tuple[int, int]] = {}
    dropped: list[StreamId] = []
    out: list[Reply] = []
    for i in ids:
        if i not in state:
            p = g.pel.get(i)
            state[i] = None if p is None else (p.time, p.count, True)
        cur = state[i]
        if i not in s.entries:
            if cur is not None:
                dropped.append(i)
                state[i] = None
            continue
        if cur is None:
            if not force:
                continue
            cur = (now, 1, False)  # FORCE: a new entry, whose idle time is not checked
        elif cur[2] and min_idle and now - cur[0] < min_idle:
            continue
        times = retry if retry >= 0 else (cur[1] if justid else cur[1] + 1)
        state[i] = (delivery, times, True)
        touched[i] = (delivery, times)
        out.append(format_id(i) if justid else entries_reply(s, [i])[0])
    claimed = [(i, t, c) for i, (t, c) in touched.items()]
    new = consumer not in g.consumers
    claim(
        ks,
        key,
        group,
        consumer,
        claimed=claimed,
        dropped=dropped,
        last_id=last if last > g.last_id else None,
    )
    if claimed and consumer in g.consumers:
        g.consumers[consumer].seen = now
    if claimed and new:
        notify(ctx.state, STREAM, "xgroup-createconsumer", key)
    return out


def _xautoclaim(ctx: Context, args: Sequence[bytes]) -> Reply:
    key, group, consumer = args[0], args[1], args[2]
    min_idle = parse_int64(args[3])
    if min_idle is None:
        raise PionError("Invalid min-idle-time argument for XAUTOCLAIM")
    min_idle = max(min_idle, 0)
    start, start_ex = parse_interval(args[4], 0)
    if start_ex:
        if start == MAX_ID:
            raise PionError("invalid start ID for the interval")
        start = (start[0], start[1] + 1) if start[1] < MAX_U64 else (start[0] + 1, 0)
    count, justid = 100, False
    j = 5
    while j < len(args):
        word = keyword(args[j])
        if word == "COUNT" and j + 1 < len(args):
            value = parse_int64(args[j + 1])
            if value is None or not 1 <= value <= (1 << 63) // 16:
                raise PionError("COUNT must be > 0")
            count = value
            j += 2
        elif word == "JUSTID":
            justid = True
            j += 1
        else:
            raise PionError(_SYNTAX)
    ks = ctx.state.keyspace
    s, g = group_at(ks, key, group)
    now = ks.clock()
    order = sorted(i for i in g.pel if i >= start)
    attempts = count * 10
    claimed: list[tuple[StreamId, int, int]] = []
    dropped: list[StreamId] = []
    out: list[Reply] = []
    k = 0
    while attempts and count and k < len(order):
        attempts -= 1
        i = order[k]
        k += 1
        p = g.pel[i]
        if i not in s.entries:
            dropped.append(i)
            count -= 1
            continue
        if min_idle and now - p.time < min_idle:
            continue
        claimed.append((i, now, p.count if justid else p.count + 1))
        out.append(format_id(i) if justid else entries_reply(s, [i])[0])
        count -= 1
    cursor = format_id(order[k]) if k < len(order) else b"0-0"
    new = consumer not in g.consumers
    claim(ks, key, group, consumer, claimed=claimed, dropped=dropped, last_id=None)
    if claimed and consumer in g.consumers:
        g.consumers[consumer].seen = now
    if claimed and new:
        notify(ctx.state, STREAM, "xgroup-createconsumer", key)
    return [cursor, out, [format_id(i) for i in dropped]]


_WRITE_FAST = frozenset({"write", "fast"})

COMMANDS: list[Command] = [
    Command("XGROUP", _xgroup, -2, frozenset({"write"}), "Manage a stream's consumer groups"),
    Command(
        "XREADGROUP",
        _xreadgroup,
        -7,
        frozenset({"write", "blocking"}),
        "Read streams as a group's consumer, waiting",
    ),
    Command("XACK", _xack, -4, _WRITE_FAST, "Acknowledge a group's pending entries"),
    Command("XPENDING", _xpending, -3, frozenset({"readonly"}), "A group's pending entries"),
    Command("XCLAIM", _xclaim, -6, _WRITE_FAST, "Take over pending entries"),
    Command("XAUTOCLAIM", _xautoclaim, -6, _WRITE_FAST, "Take over idle pending entries"),
]
