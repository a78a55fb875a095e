"""Set commands of the plain keyspace: SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER,
SCARD, SPOP, SRANDMEMBER, SMOVE, SINTER, SUNION, SDIFF, their STORE forms,
SINTERCARD and SSCAN, with Redis 7.0's replies (a set ``~`` in RESP3 where Redis
answers one: SMEMBERS, SPOP with a count, the algebra) and errors. The semantics
are ``pion.keyspace.sets``'s.

The members of a large reply are taken in one step and encoded in steps
(``chunked.py``); an intersection or union of huge sets is computed in one step at
C speed (Python's set operations), as Redis computes it in one call.

Keyspace notifications are Redis 7.0's (``t_set.c``): ``sadd``, ``srem``, ``spop``
and the STORE forms' ``sinterstore``/``sunionstore``/``sdiffstore`` once per command
that changed the set, then ``del`` when it left the set empty (a STORE of nothing
announces only the ``del`` of the key it removed). SMOVE announces ``srem`` on the
source (and its ``del``), then ``new`` when it creates the destination, then ``sadd``
there unless the member was there already. ``new`` otherwise comes from the keyspace.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pion.commands.chunked import BIG_REPLY, STEP_ITEMS, reply
from pion.commands.deferred import Steps
from pion.commands.scan_args import scan_cursor, scan_options
from pion.commands.state import Command, Context, ServerState
from pion.commands.zsets import keyword, long_arg
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.keyspace.sets import (
    algebra,
    ordered,
    sadd,
    smove,
    spop,
    srandmember,
    srem,
    sscan,
    store,
)
from pion.notify import GENERIC, NEW, SET, notify
from pion.resp.encoder import Chunks, encode_reply
from pion.resp.reply import NoReply, Reply, SetReply

__all__ = ["COMMANDS", "set_reply"]


def set_reply(members: list[bytes], proto: int) -> Reply | Steps:
    """A set reply (``~`` in RESP3), in steps when large."""
    if len(members) <= BIG_REPLY:
        return SetReply(members)
    return Steps(_set_steps(members, proto), taken=True)


def _set_steps(members: list[bytes], proto: int) -> Generator[Chunks, None, Reply]:
    yield [b"%b%d\r\n" % (b"~" if proto == 3 else b"*", len(members))]
    for start in range(0, len(members), STEP_ITEMS):
        out: Chunks = []
        for m in members[start : start + STEP_ITEMS]:
            encode_reply(m, proto, out)
        yield out
    return NoReply()


def _array(members: list[bytes], proto: int) -> Reply | Steps:
    items: list[Reply] = list(members)
    return reply(items, proto)


def _announce(state: ServerState, event: str, key: bytes) -> None:
    """Announce a change that removed members, then ``del`` if it emptied the set
    (looked up only when ``g`` is on)."""
    notify(state, SET, event, key)
    if state.notify_flags & GENERIC and not state.keyspace.exists(key):
        notify(state, GENERIC, "del", key)


def _sadd(ctx: Context, args: Sequence[bytes]) -> Reply:
    added = sadd(ctx.state.keyspace, args[0], list(args[1:]))
    if added:
        notify(ctx.state, SET, "sadd", args[0])
    return added


def _srem(ctx: Context, args: Sequence[bytes]) -> Reply:
    removed = srem(ctx.state.keyspace, args[0], args[1:])
    if removed:
        _announce(ctx.state, "srem", args[0])
    return removed


def _smembers(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    s = ctx.state.keyspace.set_at(args[0])
    return set_reply(ordered(s or ()), ctx.client.proto)


def _sismember(ctx: Context, args: Sequence[bytes]) -> Reply:
    s = ctx.state.keyspace.set_at(args[0])
    return int(s is not None and args[1] in s)


def _smismember(ctx: Context, args: Sequence[bytes]) -> Reply:
    s = ctx.state.keyspace.set_at(args[0]) or set()
    return [int(m in s) for m in args[1:]]


def _scard(ctx: Context, args: Sequence[bytes]) -> Reply:
    s = ctx.state.keyspace.set_at(args[0])
    return 0 if s is None else len(s)


def _spop(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    ks = ctx.state.keyspace
    if len(args) > 2:
        raise PionError("syntax error")
    if len(args) == 1:
        got = spop(ks, args[0], None)
        if got:
            _announce(ctx.state, "spop", args[0])
        return got[0] if got else None
    count = parse_int64(args[1])
    if count is None or count < 0:
        raise PionError("value is out of range, must be positive")
    got = spop(ks, args[0], count)
    if got:
        _announce(ctx.state, "spop", args[0])
    return set_reply(ordered(got or ()), ctx.client.proto)


def _srandmember(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    ks = ctx.state.keyspace
    if len(args) > 2:
        raise PionError("syntax error")
    if len(args) == 1:
        got = srandmember(ks, args[0], 1)
        return got[0] if got else None
    count = long_arg(args[1])
    if count < -((1 << 63) - 1):
        raise PionError(
            "value is out of range, value must between -9223372036854775807 and 9223372036854775807"
        )
    return _array(srandmember(ks, args[0], count), ctx.client.proto)


def _smove(ctx: Context, args: Sequence[bytes]) -> Reply:
    state, (source, destination, member) = ctx.state, args
    ks = state.keyspace
    if source == destination or not state.notify_flags:  # nothing to announce
        return int(smove(ks, source, destination, member))
    # What the destination held before the move (looked up as Redis does, source
    # first; types are smove's to check): the keyspace leaves SMOVE's ``new`` to the
    # command, as Redis announces it after the source's srem.
    ks.peek(source)
    before = ks.peek(destination)
    had = before is not None and isinstance(before.value, set) and member in before.value
    moved = smove(ks, source, destination, member)
    if moved:
        _announce(state, "srem", source)
        if before is None:
            notify(state, NEW, "new", destination)
        if not had:
            notify(state, SET, "sadd", destination)
    return int(moved)


def _sinter(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return set_reply(ordered(algebra(ctx.state.keyspace, "inter", args)), ctx.client.proto)


def _sunion(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return set_reply(ordered(algebra(ctx.state.keyspace, "union", args)), ctx.client.proto)


def _sdiff(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    return set_reply(ordered(algebra(ctx.state.keyspace, "diff", args)), ctx.client.proto)


def _store(ctx: Context, args: Sequence[bytes], op: str) -> Reply:
    ks = ctx.state.keyspace
    members = algebra(ks, op, args[1:])
    existed = ks.exists(args[0])
    size = store(ks, args[0], members)
    if size:
        notify(ctx.state, SET, f"s{op}store", args[0])
    elif existed:
        notify(ctx.state, GENERIC, "del", args[0])
    return size


def _sinterstore(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _store(ctx, args, "inter")


def _sunionstore(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _store(ctx, args, "union")


def _sdiffstore(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _store(ctx, args, "diff")


def _sintercard(ctx: Context, args: Sequence[bytes]) -> Reply:
    numkeys = parse_int64(args[0])
    if numkeys is None or numkeys < 1:
        raise PionError("numkeys should be greater than 0")
    if numkeys > len(args) - 1:
        raise PionError("Number of keys can't be greater than number of args")
    limit = 0
    i = 1 + numkeys
    while i < len(args):
        if keyword(args[i]) == "LIMIT" and i + 1 < len(args):
            value = parse_int64(args[i + 1])
            if value is None or value < 0:
                raise PionError("LIMIT can't be negative")
            limit = value
            i += 2
        else:
            raise PionError("syntax error")
    return len(algebra(ctx.state.keyspace, "inter", args[1 : 1 + numkeys], limit))


def _sscan(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    cursor = scan_cursor(args[1])
    if ks.set_at(args[0]) is None:
        return [b"0", []]
    options = scan_options(args[2:])
    nxt, members = sscan(ks, args[0], cursor, options.count, options.pattern)
    return [str(nxt).encode(), list(members)]


_READ = frozenset({"readonly", "fast"})
_WRITE = frozenset({"write", "fast"})
_SLOW_READ = frozenset({"readonly"})
_SLOW_WRITE = frozenset({"write"})

COMMANDS: list[Command] = [
    Command("SADD", _sadd, -3, _WRITE, "Add members to a set"),
    Command("SREM", _srem, -3, _WRITE, "Remove members from a set"),
    Command("SMEMBERS", _smembers, 2, _SLOW_READ, "Every member of a set"),
    Command("SISMEMBER", _sismember, 3, _READ, "Whether a member is in a set"),
    Command("SMISMEMBER", _smismember, -3, _READ, "Whether each member is in a set"),
    Command("SCARD", _scard, 2, _READ, "Number of members of a set"),
    Command("SPOP", _spop, -2, _WRITE, "Remove and return random members"),
    Command("SRANDMEMBER", _srandmember, -2, _SLOW_READ, "Random members of a set"),
    Command("SMOVE", _smove, 4, _WRITE, "Move a member from one set to another"),
    Command("SINTER", _sinter, -2, _SLOW_READ, "Intersection of sets"),
    Command("SUNION", _sunion, -2, _SLOW_READ, "Union of sets"),
    Command("SDIFF", _sdiff, -2, _SLOW_READ, "Difference of sets"),
    Command("SINTERSTORE", _sinterstore, -3, _SLOW_WRITE, "Store an intersection"),
    Command("SUNIONSTORE", _sunionstore, -3, _SLOW_WRITE, "Store a union"),
    Command("SDIFFSTORE", _sdiffstore, -3, _SLOW_WRITE, "Store a difference"),
    Command("SINTERCARD", _sintercard, -3, _SLOW_READ, "Size of an intersection"),
    Command("SSCAN", _sscan, -3, _SLOW_READ, "Iterate over a set's members"),
]
