"""String values: SET with its options, INCR and friends, MGET, MSET (Redis's
``t_string.c``), as operations on a :class:`~pion.keyspace.Keyspace`.

The command layer parses arguments into the typed options here; these functions apply
Redis's semantics and error texts. Values are stored as the request's own ``bytes``;
integers are stored as their decimal text (what GET returns), parsed strictly like
Redis's ``string2ll``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pion.errors import PionError
from pion.keyspace.expiry import MAX_DEADLINE_MS
from pion.keyspace.numbers import parse_int64
from pion.keyspace.store import Keyspace

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "NOT_AN_INTEGER",
    "Condition",
    "ExpireUnit",
    "SetOptions",
    "as_int",
    "incr_by",
    "mget",
    "mset",
    "set_deadline_of",
    "set_value",
]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

ExpireUnit = Literal["EX", "PX", "EXAT", "PXAT"]
Condition = Literal["NX", "XX"]
NOT_AN_INTEGER = "value is not an integer or out of range"


@dataclass(frozen=True, slots=True)
class SetOptions:
    """SET's options, as parsed (Redis 7.0 ``parseExtendedStringArgumentsOrReply``)."""

    condition: Condition | None = None
    expire_unit: ExpireUnit | None = None
    expire_value: bytes = b""
    keep_ttl: bool = False
    get: bool = False


def set_deadline_of(command: str, unit: ExpireUnit, raw: bytes, now: int) -> int:
    """The absolute deadline SET's EX/PX/EXAT/PXAT means; Redis's checks and texts."""
    value = as_int(raw)
    invalid = PionError(f"invalid expire time in '{command}' command")
    seconds = unit in ("EX", "EXAT")
    if value <= 0 or (seconds and value > INT64_MAX // 1000):
        raise invalid
    ms = value * 1000 if seconds else value
    if unit in ("EX", "PX"):
        ms += now
    if ms > MAX_DEADLINE_MS:  # Redis detects the signed overflow of the addition
        raise invalid
    return ms


def set_value(
    ks: Keyspace, key: bytes, value: bytes, opts: SetOptions
) -> tuple[bool, bytes | None]:
    """SET: (whether the value was stored, the old value when ``opts.get``).

    Redis's order: the expiry is checked first, then GET reads the old value (a
    non-string answers WRONGTYPE and nothing is stored), then NX/XX decide."""
    deadline = 0
    if opts.expire_unit is not None:
        deadline = set_deadline_of("set", opts.expire_unit, opts.expire_value, ks.clock())
    old = ks.string(key) if opts.get else None
    current = ks.deadline(key)
    found = current is not None
    if (opts.condition == "NX" and found) or (opts.condition == "XX" and not found):
        return False, old
    if opts.keep_ttl and current:
        deadline = current
    ks.set_string(key, value, deadline)
    return True, old


def as_int(raw: bytes) -> int:
    """A strict 64-bit integer argument or value, else Redis's error."""
    value = parse_int64(raw)
    if value is None:
        raise PionError(NOT_AN_INTEGER)
    return value


def incr_by(ks: Keyspace, key: bytes, delta: int) -> int:
    """INCR/INCRBY/DECR/DECRBY: the new value; the key's deadline is kept."""
    current = ks.string(key, read=False)
    old = 0 if current is None else as_int(current)
    new = old + delta
    if not INT64_MIN <= new <= INT64_MAX:
        raise PionError("increment or decrement would overflow")
    ks.set_string(key, str(new).encode(), ks.deadline(key) or 0)
    return new


def mget(ks: Keyspace, keys: list[bytes]) -> list[bytes | None]:
    """MGET: a key holding another type reads as nil (not an error), as in Redis."""
    out: list[bytes | None] = []
    for key in keys:
        value = ks.lookup(key)
        out.append(value if isinstance(value, bytes) else None)
    return out


def mset(ks: Keyspace, items: list[tuple[bytes, bytes]]) -> None:
    ks.set_strings(items)
