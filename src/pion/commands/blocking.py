"""The blocking commands: BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP, BZPOPMIN,
BZPOPMAX and BZMPOP, on the execution model's :class:`~pion.commands.deferred.Wait`.

A blocking command first tries as its non-blocking form would; with nothing to pop
it returns a ``Wait`` and its client waits (``pion.server.running``: its later
commands behind it, every other client going on). The waiter is queued on each of
its keys (``Keyspace.waiting``, arrival order). A change that gives one of those
keys a list or sorted set (a push, LMOVE/BLMOVE onto it, ZADD, a *STORE, RENAME or
COPY onto it) marks the key ready; after the command that did it (after EXEC, for
one inside a transaction) :func:`serve` pops for the waiters of each ready key, first
come first served, as Redis's ``handleClientsBlockedOnKeys`` does: the pop is made,
journaled and its reply kept then, so a later command sees it done, and the waiter is
woken to send it. A waiter whose key holds the wrong type, or nothing left, stays.

Timeouts are Redis's: seconds as a float, in milliseconds (a timeout under 1 ms is
0: forever), negative or malformed ones errors. Timed out, the reply is the null
array (the null bulk for BLMOVE/BRPOPLPUSH). Inside EXEC (and a script) nothing
waits: a command that finds nothing answers as if timed out at once. A client that
disconnects while blocked is forgotten (the wait's ``cancel``). ``CLIENT UNBLOCK``
(``clientctl.py``) ends a wait early, as a timeout or with ``-UNBLOCKED``.

A pop announces what its non-blocking form does (keyspace notifications: ``lpop``,
``rpop``, LMOVE's push and pop, ``zpopmin``/``zpopmax``, then ``del`` when the key
went), when it is made: at once, or after the command that made the key ready.

XREAD and XREADGROUP with BLOCK (``pion.commands.streams``) wait here too: an XADD
marks a stream's key ready; XGROUP DESTROY and deleting the key do as well, which end
an XREADGROUP's wait with Redis's error.

A client blocks on keys of its selected database, and is woken by changes there, a
SWAPDB that brings it a value included (``pion.keyspace.databases``).

Under ``-w N`` each worker has its own keyspace (``docs/deployment.md``): a client
blocks on, and is woken by pushes to, its worker's keys.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from pion.commands.deferred import Wait
from pion.commands.lists import end_of, move_announced, mpop_args, pop_announced, pop_reply
from pion.commands.state import Command, Context, ServerState
from pion.errors import PionError, WrongTypeError
from pion.keyspace.numbers import parse_long_double
from pion.keyspace.store import Keyspace
from pion.keyspace.zsets_more import zpop
from pion.notify import GENERIC, ZSET, notify
from pion.resp.reply import ErrorReply, NullArray, Reply

__all__ = [
    "COMMANDS",
    "Waiter",
    "block",
    "blocked_count",
    "parse_timeout",
    "serve",
    "unblock",
]

_LLONG_LIMIT = 1 << 63

# An attempt: the reply when it could pop (popping), else None (nothing changed).
Attempt = Callable[[], Reply | None]


class Waiter:
    """One blocked command: its keys, how it pops, and its reply once served."""

    __slots__ = ("attempt", "client_id", "empty", "go", "keys", "reply", "sees_deletion", "served")

    def __init__(
        self,
        keys: Sequence[bytes],
        attempt: Attempt,
        client_id: int,
        empty: Reply,
        sees_deletion: bool = False,
    ) -> None:
        self.keys = tuple(dict.fromkeys(keys))
        # XREADGROUP: a deleted key ends the wait with an error (its attempt says which).
        self.sees_deletion = sees_deletion
        self.attempt = attempt
        self.client_id = client_id
        self.empty = empty  # the reply when it times out
        self.go: Callable[[], None] | None = None
        self.reply: Reply = None
        self.served = False


def blocked_count(databases: Iterable[Keyspace]) -> int:
    """How many clients wait on keys now (INFO clients ``blocked_clients``)."""
    return len({id(w) for ks in databases for queue in ks.waiting.values() for w in queue})


def _enqueue(ks: Keyspace, waiter: Waiter) -> None:
    for key in waiter.keys:
        ks.waiting.setdefault(key, deque()).append(waiter)


def _forget(ks: Keyspace, waiter: Waiter) -> None:
    for key in waiter.keys:
        queue = ks.waiting.get(key)
        if queue is None:
            continue
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del ks.waiting[key]


def serve(state: ServerState) -> None:
    """Serve the waiters of every database with ready keys, each with
    ``state.keyspace`` pointing at the waiters' database (a pop acts on, and
    announces in, the database its client blocked in), then back at the current one."""
    current = state.keyspace
    alarm = state.databases.alarm
    try:
        while alarm:
            ks = cast(Keyspace, alarm.pop())
            state.keyspace = ks
            _serve(ks)
    finally:
        state.keyspace = current


def _serve(ks: Keyspace) -> None:
    """Pop for the waiters of every ready key, in arrival order (module docstring).
    A waiter that cannot take what the key holds (BZPOPMIN on a list) is passed over
    and keeps waiting. A pop for one (BLMOVE) may make another key ready: served in
    the same call."""
    while ks.ready:
        key = ks.ready.pop()
        for queued in list(ks.waiting.get(key, ())):
            waiter = cast(Waiter, queued)
            if key not in ks and not waiter.sees_deletion:
                continue  # emptied by the waiters before
            if waiter.served:
                continue
            try:
                got = waiter.attempt()
            except WrongTypeError:
                continue
            except PionError as exc:  # BLMOVE onto a key of another type: its error
                got = ErrorReply(exc.resp_line())
            if got is None:
                continue
            waiter.reply, waiter.served = got, True
            _forget(ks, waiter)
            if waiter.go is not None:
                waiter.go()


def unblock(databases: Iterable[Keyspace], client_id: int, error: bool) -> bool:
    """CLIENT UNBLOCK: end client ``client_id``'s wait now, as if timed out or with
    Redis's ``-UNBLOCKED`` error; False when it is not waiting on keys."""
    for ks in databases:
        for queue in ks.waiting.values():
            for queued in queue:
                waiter = cast(Waiter, queued)
                if waiter.client_id == client_id and not waiter.served:
                    waiter.reply = (
                        ErrorReply("UNBLOCKED client unblocked via CLIENT UNBLOCK")
                        if error
                        else waiter.empty
                    )
                    waiter.served = True
                    _forget(ks, waiter)
                    if waiter.go is not None:
                        waiter.go()
                    return True
    return False


def parse_timeout(raw: bytes, now_ms: int) -> float | None:
    """Redis's blocking timeout: seconds (a float), kept in whole milliseconds; None
    for 0 (forever). Redis casts the milliseconds to a C ``long long``; a value past
    its range (inf, 1e20) comes out negative there, and so here."""
    value = parse_long_double(raw)
    if value is None:
        raise PionError("timeout is not a float or out of range")
    scaled = value * 1000
    if not math.isfinite(float(scaled)) or abs(scaled) >= _LLONG_LIMIT:
        raise PionError("timeout is negative")
    ms = int(scaled)
    if ms < 0:
        raise PionError("timeout is negative")
    if ms > _LLONG_LIMIT - 1 - now_ms:
        raise PionError("timeout is out of range")
    return ms / 1000 if ms else None


def block(
    ctx: Context,
    keys: Sequence[bytes],
    attempt: Attempt,
    timeout: float | None,
    empty: Reply,
    *,
    sees_deletion: bool = False,
) -> Reply | Wait:
    """Reply with what ``attempt`` gets now, else wait on ``keys`` for it (XREAD and
    XREADGROUP block through this too; ``sees_deletion``: see :class:`Waiter`)."""
    got = attempt()
    if got is not None:
        return got
    ks = ctx.state.keyspace
    waiter = Waiter(keys, attempt, ctx.client.id, empty, sees_deletion)

    def ready(go: Callable[[], None]) -> None:
        waiter.go = go
        _enqueue(ks, waiter)

    def then() -> Reply:
        return waiter.reply

    def expired() -> Reply:
        # Served just as its timer fired: what was popped for it is its reply.
        return waiter.reply if waiter.served else empty

    def cancel() -> None:
        _forget(ks, waiter)

    return Wait(ready, then, expired, timeout, cancel)


def _pop_first(ctx: Context, keys: Sequence[bytes], left: bool, count: int | None) -> Attempt:
    state = ctx.state

    def attempt() -> Reply | None:
        for key in keys:
            if state.keyspace.list_at(key, read=False) is not None:
                got = pop_announced(state, key, left, count or 1) or []
                return [key, got[0]] if count is None else pop_reply(key, got)
        return None

    return attempt


def _bpop(ctx: Context, args: Sequence[bytes], left: bool) -> Reply | Wait:
    timeout = parse_timeout(args[-1], ctx.state.keyspace.clock())
    keys = args[:-1]
    return block(ctx, keys, _pop_first(ctx, keys, left, None), timeout, NullArray())


def _blpop(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    return _bpop(ctx, args, True)


def _brpop(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    return _bpop(ctx, args, False)


def _move(
    ctx: Context, source: bytes, destination: bytes, ends: tuple[bool, bool], raw: bytes
) -> Reply | Wait:
    timeout = parse_timeout(raw, ctx.state.keyspace.clock())
    ks = ctx.state.keyspace

    def attempt() -> Reply | None:
        if ks.list_at(source, read=False) is None:
            return None
        return move_announced(ctx.state, source, destination, *ends)

    return block(ctx, (source,), attempt, timeout, None)


def _blmove(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    ends = end_of(args[2]), end_of(args[3])
    return _move(ctx, args[0], args[1], ends, args[4])


def _brpoplpush(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    return _move(ctx, args[0], args[1], (False, True), args[2])


def _blmpop(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    timeout = parse_timeout(args[0], ctx.state.keyspace.clock())
    keys, end, count = mpop_args(args[1:], ("LEFT", "RIGHT"))
    attempt = _pop_first(ctx, keys, end == "LEFT", count)
    return block(ctx, keys, attempt, timeout, NullArray())


def _zpop_first(ctx: Context, keys: Sequence[bytes], highest: bool, count: int | None) -> Attempt:
    ks = ctx.state.keyspace

    def attempt() -> Reply | None:
        for key in keys:
            if ks.zset(key, read=False) is not None:
                popped = zpop(ks, key, count or 1, highest)
                notify(ctx.state, ZSET, "zpopmax" if highest else "zpopmin", key)
                if ctx.state.notify_flags & GENERIC and not ks.exists(key):
                    notify(ctx.state, GENERIC, "del", key)
                if count is None:
                    score, member = popped[0]
                    return [key, member, score]
                return [key, [[member, score] for score, member in popped]]
        return None

    return attempt


def _bzpop(ctx: Context, args: Sequence[bytes], highest: bool) -> Reply | Wait:
    timeout = parse_timeout(args[-1], ctx.state.keyspace.clock())
    keys = args[:-1]
    return block(ctx, keys, _zpop_first(ctx, keys, highest, None), timeout, NullArray())


def _bzpopmin(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    return _bzpop(ctx, args, False)


def _bzpopmax(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    return _bzpop(ctx, args, True)


def _bzmpop(ctx: Context, args: Sequence[bytes]) -> Reply | Wait:
    timeout = parse_timeout(args[0], ctx.state.keyspace.clock())
    keys, end, count = mpop_args(args[1:], ("MIN", "MAX"))
    attempt = _zpop_first(ctx, keys, end == "MAX", count)
    return block(ctx, keys, attempt, timeout, NullArray())


_BLOCKING = frozenset({"write", "blocking"})
_BLOCKING_FAST = frozenset({"write", "blocking", "fast"})

COMMANDS: list[Command] = [
    Command("BLPOP", _blpop, -3, _BLOCKING, "Pop a list's head, waiting for one"),
    Command("BRPOP", _brpop, -3, _BLOCKING, "Pop a list's tail, waiting for one"),
    Command("BLMOVE", _blmove, 6, _BLOCKING, "LMOVE, waiting for a source"),
    Command("BRPOPLPUSH", _brpoplpush, 4, _BLOCKING, "RPOPLPUSH, waiting for a source"),
    Command("BLMPOP", _blmpop, -5, _BLOCKING, "LMPOP, waiting for a list"),
    Command("BZPOPMIN", _bzpopmin, -3, _BLOCKING_FAST, "Pop a lowest member, waiting"),
    Command("BZPOPMAX", _bzpopmax, -3, _BLOCKING_FAST, "Pop a highest member, waiting"),
    Command("BZMPOP", _bzmpop, -5, _BLOCKING, "ZMPOP, waiting for a sorted set"),
]
