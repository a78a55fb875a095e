"""DUMP and RESTORE in Redis's payload format (``pion.keyspace.rdb``), with Redis 7.0's
options, checks in its order, replies and error texts, so a value moves between
redis-server and pion-server in either direction.

RESTORE's ``FREQ`` is accepted and, as in Redis under an LRU policy, has no effect
(the policy here is always LRU); ``IDLETIME`` sets what OBJECT IDLETIME answers.
RESTORE is journaled as the records that build the value, so the log and snapshots
never hold a DUMP payload. A hash with field deadlines is dumped as Redis 7.4 dumps it
(RDB type 24, version 12); restoring one sets the deadlines still ahead, as HPEXPIREAT
would, and leaves out the fields whose deadline has passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import parse_int
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.rdb import BadFormat, dump_payload, load_payload, payload_ok
from pion.notify import GENERIC, notify
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]

_OK = Simple("OK")


class BusyKeyError(PionError):
    code = "BUSYKEY"


def _dump(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    value = ks.lookup(args[0])
    if value is None:
        return None
    return dump_payload(value, ks.field_ttls.of(args[0]))


def _options(args: Sequence[bytes]) -> tuple[bool, bool, int | None]:
    """REPLACE, ABSTTL, IDLETIME (seconds) as ``restoreCommand`` reads them: IDLETIME
    and FREQ exclude each other (the second one is a syntax error)."""
    replace = absttl = False
    idle: int | None = None
    freq: int | None = None
    i = 3
    while i < len(args):
        word = args[i].upper()
        more = i + 1 < len(args)
        if word == b"REPLACE":
            replace = True
        elif word == b"ABSTTL":
            absttl = True
        elif word == b"IDLETIME" and more and freq is None:
            idle = parse_int(args[i + 1])
            if idle < 0:
                raise PionError("Invalid IDLETIME value, must be >= 0")
            i += 1
        elif word == b"FREQ" and more and idle is None:
            freq = parse_int(args[i + 1])
            if not 0 <= freq <= 255:
                raise PionError("Invalid FREQ value, must be >= 0 and <= 255")
            i += 1
        else:
            raise PionError("syntax error")
        i += 1
    return replace, absttl, idle


def _restore(ctx: Context, args: Sequence[bytes]) -> Reply:
    key, payload = args[0], args[2]
    replace, absttl, idle = _options(args)
    ks = ctx.state.keyspace
    if not replace and ks.exists(key):
        raise BusyKeyError("Target key name already exists.")
    ttl = parse_int(args[1])
    if ttl < 0:
        raise PionError("Invalid TTL value, must be >= 0")
    if not payload_ok(payload):
        raise PionError("DUMP payload version or checksum are wrong")
    try:
        value, field_ttls = load_payload(payload)
    except BadFormat:
        raise PionError("Bad data format") from None
    now = ks.clock()
    if isinstance(value, dict):
        # A field already past its deadline is not restored (a hash left with none:
        # nothing is, as for a key already past its own).
        for field in [f for f, d in field_ttls.items() if d <= now]:
            del field_ttls[field], value[field]
    deadline = ttl if absttl or not ttl else now + ttl
    if (deadline and deadline <= now) or (isinstance(value, dict) and not value):
        # Already expired: Redis stores nothing, deleting what REPLACE would replace.
        if replace and ks.delete((key,)):
            notify(ctx.state, GENERIC, "del", key)
        return _OK
    ks.restore(key, value, deadline, list(field_ttls.items()))
    if idle is not None:
        entry = ks.peek(key)
        if entry is not None:
            entry.touched = ks.clock() // 1000 - idle
    notify(ctx.state, GENERIC, "restore", key)
    return _OK


COMMANDS: list[Command] = [
    Command("DUMP", _dump, 2, frozenset({"readonly"}), "A key's value in Redis's DUMP format"),
    Command("RESTORE", _restore, -4, frozenset({"write"}), "Create a key from a DUMP payload"),
]
