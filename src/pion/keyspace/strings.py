"""String values: SET with its options, INCR and friends, INCRBYFLOAT, MGET, MSET,
MSETNX, APPEND, SETRANGE, GETRANGE, GETEX, GETDEL, GETSET (Redis's ``t_string.c``), as
operations on a :class:`~pion.keyspace.Keyspace`.

The command layer parses arguments into the typed options here; these functions apply
Redis's semantics and error texts. Values are stored as the request's own ``bytes``;
integers are stored as their decimal text (what GET returns), parsed strictly like
Redis's ``string2ll``.

Every write goes through the keyspace's own methods and logs its result: INCRBYFLOAT
a SET of the new value (with the deadline it kept), GETEX a deadline change, GETDEL a
DEL, as Redis's AOF logs them; APPEND and SETRANGE log the bytes they wrote and where
(``Keyspace.set_range``), as Redis's AOF logs the commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pion.errors import PionError
from pion.keyspace.expiry import MAX_DEADLINE_MS
from pion.keyspace.numbers import format_long_double, parse_int64, parse_long_double
from pion.keyspace.store import Keyspace

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_STRING",
    "NOT_AN_INTEGER",
    "Condition",
    "ExpireUnit",
    "GetExOptions",
    "SetOptions",
    "append",
    "as_int",
    "getdel",
    "getex",
    "getrange",
    "getset",
    "incr_by",
    "incr_by_float",
    "mget",
    "mset",
    "msetnx",
    "set_deadline_of",
    "set_value",
    "setrange",
]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

ExpireUnit = Literal["EX", "PX", "EXAT", "PXAT"]
Condition = Literal["NX", "XX"]
NOT_AN_INTEGER = "value is not an integer or out of range"
NOT_A_FLOAT = "value is not a valid float"
# Redis's proto-max-bulk-len: APPEND and SETRANGE refuse to grow a string past it.
MAX_STRING = 512 * 1024 * 1024
_TOO_LONG = "string exceeds maximum allowed size (proto-max-bulk-len)"


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


def _kept_deadline(ks: Keyspace, key: bytes) -> int:
    return ks.deadline(key) or 0


def append(ks: Keyspace, key: bytes, value: bytes) -> int:
    """APPEND: the new length; the key's deadline is kept."""
    current = ks.string(key, read=False)
    size = 0 if current is None else len(current)
    if size + len(value) > MAX_STRING:
        raise PionError(_TOO_LONG)
    return ks.set_range(key, size, value)


def getrange(ks: Keyspace, key: bytes, start: int, end: int) -> bytes:
    """GETRANGE with Redis's clamping (a missing key is the empty string)."""
    value = ks.string(key)
    if value is None:
        return b""
    n = len(value)
    if start < 0 and end < 0 and start > end:
        return b""
    start = max(start + n if start < 0 else start, 0)
    end = max(end + n if end < 0 else end, 0)
    end = min(end, n - 1)
    if start > end or n == 0:
        return b""
    return value[start : end + 1]


def setrange(ks: Keyspace, key: bytes, offset: int, value: bytes) -> int:
    """SETRANGE: the new length (zero bytes pad a gap); Redis's checks in its order."""
    if offset < 0:
        raise PionError("offset is out of range")
    current = ks.string(key, read=False)
    if not value:
        return 0 if current is None else len(current)
    if offset + len(value) > MAX_STRING:
        raise PionError(_TOO_LONG)
    return ks.set_range(key, offset, value)


def getset(ks: Keyspace, key: bytes, value: bytes) -> bytes | None:
    """GETSET: the old value; the new one has no deadline (as SET)."""
    old = ks.string(key)
    ks.set_string(key, value)
    return old


def getdel(ks: Keyspace, key: bytes) -> bytes | None:
    old = ks.string(key)
    if old is not None:
        ks.delete((key,))
    return old


@dataclass(frozen=True, slots=True)
class GetExOptions:
    """GETEX's options: an expiry (unit, raw value) or PERSIST, or neither."""

    expire_unit: ExpireUnit | None = None
    expire_value: bytes = b""
    persist: bool = False


def getex(ks: Keyspace, key: bytes, opts: GetExOptions) -> bytes | None:
    """GETEX in Redis 7.0's order: the key's type, then the expiry's validity, then the
    change; an EXAT/PXAT already past deletes the key (logged as a DEL)."""
    value = ks.string(key)
    if value is None:
        return None
    if opts.expire_unit is not None:
        now = ks.clock()
        deadline = set_deadline_of("getex", opts.expire_unit, opts.expire_value, now)
        ks.set_deadline(key, deadline)  # a deadline not in the future removes the key
    elif opts.persist:
        ks.persist(key)
    return value


def msetnx(ks: Keyspace, items: list[tuple[bytes, bytes]]) -> bool:
    """MSETNX: every pair, or nothing when any of the keys exists."""
    if any(ks.exists(k) for k, _ in items):
        return False
    ks.set_strings(items)
    return True


def incr_by_float(ks: Keyspace, key: bytes, raw_delta: bytes) -> bytes:
    """INCRBYFLOAT in 80-bit long double, as Redis computes it; the new value's text
    (what is stored, logged and replied). The key's deadline is kept."""
    current = ks.string(key, read=False)
    old = parse_long_double(current) if current is not None else parse_long_double(b"0")
    if old is None:
        raise PionError(NOT_A_FLOAT)
    delta = parse_long_double(raw_delta)
    if delta is None:
        raise PionError(NOT_A_FLOAT)
    new = old + delta
    if not np.isfinite(new):
        raise PionError("increment would produce NaN or Infinity")
    text = format_long_double(new)
    ks.set_string(key, text, _kept_deadline(ks, key) if current is not None else 0)
    return text
