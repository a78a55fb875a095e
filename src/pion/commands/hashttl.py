"""Hash-field expiry, Redis 7.4's commands: HEXPIRE, HPEXPIRE, HEXPIREAT, HPEXPIREAT,
HTTL, HPTTL, HEXPIRETIME, HPEXPIRETIME, HPERSIST, with its argument checks in its
order and its error texts (``t_hash.c`` of 7.4: ``hexpireGenericCommand``,
``httlGenericCommand``, ``hpersistCommand``). The semantics are
``pion.keyspace.hashttl``'s.

The order of the checks, as Redis 7.4: the key's type (WRONGTYPE), then (HEXPIRE) the
time, then the optional NX|XX|GT|LT, then ``FIELDS`` at its place, then ``numfields``
(a positive integer), then that it matches the fields given; a missing key then
answers -2 for every field. Redis 7.4 words ``numfields``'s error differently for
HEXPIRE ("Parameter `numFields` should be greater than 0") and for HTTL and HPERSIST
("Number of fields must be a positive integer"); both are kept.

Notifications, as Redis 7.4: ``hexpire`` when some deadline was set, ``hdel`` instead
when some field was deleted for a past time (then ``del`` if the hash went),
``hpersist`` when some deadline was removed; the keyspace raises ``hexpired`` (and
``del``) itself when it reclaims fields past their deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import parse_int
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.hashttl import MAX_FIELD_DEADLINE_MS, Condition, hexpire, hpersist, httl
from pion.keyspace.numbers import parse_int64
from pion.notify import GENERIC, HASH, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]

_CONDITIONS: dict[bytes, Condition] = {b"NX": "NX", b"XX": "XX", b"GT": "GT", b"LT": "LT"}
_HEXPIRE_COUNT = "Parameter `numFields` should be greater than 0"
_OTHER_COUNT = "Number of fields must be a positive integer"


def _fields(args: Sequence[bytes], at: int, count_error: str) -> list[bytes]:
    """``FIELDS numfields field ...`` from ``args[at]`` to the end."""
    if args[at].upper() != b"FIELDS":
        raise PionError("Mandatory argument FIELDS is missing or not at the right position")
    n = parse_int64(args[at + 1]) if at + 1 < len(args) else None
    if n is None or n < 1:
        raise PionError(count_error)
    fields = args[at + 2 :]
    if n != len(fields):
        raise PionError("The `numfields` parameter must match the number of arguments")
    return list(fields)


def _deadline(name: str, raw: bytes, base: int, seconds: bool) -> int:
    """The absolute deadline in ms, with Redis 7.4's bounds (48-bit ms)."""
    value = parse_int(raw)
    if value < 0:
        raise PionError("invalid expire time, must be >= 0")
    invalid = PionError(f"invalid expire time in '{name}' command")
    if seconds:
        if value > MAX_FIELD_DEADLINE_MS // 1000:
            raise invalid
        value *= 1000
    if value > MAX_FIELD_DEADLINE_MS - base:
        raise invalid
    return value + base


def _expire_handler(name: str, relative: bool, seconds: bool) -> Command:
    def handler(ctx: Context, args: Sequence[bytes]) -> Reply:
        ks = ctx.state.keyspace
        key = args[0]
        ks.hash(key, read=False)  # WRONGTYPE first, as Redis 7.4
        deadline = _deadline(name, args[1], ks.clock() if relative else 0, seconds)
        cond = _CONDITIONS.get(args[2].upper(), "")
        fields = _fields(args, 3 if cond else 2, _HEXPIRE_COUNT)
        codes, went = hexpire(ks, key, deadline, cond, fields)
        if 2 in codes:
            notify(ctx.state, HASH, "hdel", key)
            if went:
                notify(ctx.state, GENERIC, "del", key)
        elif 1 in codes:
            notify(ctx.state, HASH, "hexpire", key)
        reply: list[Reply] = list(codes)
        return reply

    unit = "seconds" if seconds else "milliseconds"
    when = "from now" if relative else "as a Unix time"
    summary = f"Set hash fields' expiry in {unit} {when}"
    return Command(name.upper(), handler, -6, frozenset({"write", "fast"}), summary)


def _ttl_handler(name: str, relative: bool, seconds: bool) -> Command:
    def handler(ctx: Context, args: Sequence[bytes]) -> Reply:
        ks = ctx.state.keyspace
        ks.hash(args[0], read=False)  # WRONGTYPE first
        found = httl(ks, args[0], _fields(args, 1, _OTHER_COUNT))
        base = ks.clock() if relative else 0
        out: list[Reply] = []
        for d in found:
            if d < 0:
                out.append(d)
            else:  # seconds round up, as Redis 7.4's (expire + 999 - base) / 1000
                out.append((d + 999 - base) // 1000 if seconds else d - base)
        return out

    what = "time to live" if relative else "expiry Unix time"
    summary = f"Hash fields' {what} in {'seconds' if seconds else 'milliseconds'}"
    return Command(name.upper(), handler, -5, frozenset({"readonly", "fast"}), summary)


def _hpersist(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    ks.hash(args[0], read=False)  # WRONGTYPE first
    codes = hpersist(ks, args[0], _fields(args, 1, _OTHER_COUNT))
    if 1 in codes:
        notify(ctx.state, HASH, "hpersist", args[0])
    reply: list[Reply] = list(codes)
    return reply


COMMANDS: list[Command] = [
    _expire_handler("hexpire", True, True),
    _expire_handler("hpexpire", True, False),
    _expire_handler("hexpireat", False, True),
    _expire_handler("hpexpireat", False, False),
    _ttl_handler("httl", True, True),
    _ttl_handler("hpttl", True, False),
    _ttl_handler("hexpiretime", False, True),
    _ttl_handler("hpexpiretime", False, False),
    Command("HPERSIST", _hpersist, -5, frozenset({"write", "fast"}), "Remove hash fields' expiry"),
]
