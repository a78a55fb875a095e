"""Hash commands' semantics (Redis's ``t_hash.c``) beyond plain field reads and writes:
HINCRBY, HINCRBYFLOAT, HSETNX, HRANDFIELD, HSCAN, as operations on a
:class:`~pion.keyspace.Keyspace`.

Writes go through :meth:`Keyspace.hash_set`, so each logs the field's final value (an
HINCRBYFLOAT's result, not its increment), as Redis's AOF does.

Compact hashes. Redis keeps a hash of at most 512 fields whose fields and values are
at most 64 bytes each in one flat list (``listpack``, ``hash-max-listpack-entries`` and
``-value``) and answers HSCAN over it with every field at once and cursor 0, in
insertion order. Python's dict keeps insertion order too, so for such hashes HSCAN
answers exactly as Redis does. A larger hash is walked ``COUNT`` fields per call by
position in that order; fields deleted during a walk shift the later ones back, so
unlike Redis's table walk such a walk may miss fields that come after a deleted one
(fields added meanwhile come last and are returned).
"""

from __future__ import annotations

from itertools import islice
from random import Random

import numpy as np

from pion.errors import PionError
from pion.keyspace.glob import stringmatch
from pion.keyspace.numbers import format_long_double, parse_int64, parse_long_double
from pion.keyspace.store import Keyspace

__all__ = [
    "COMPACT_ENTRIES",
    "COMPACT_VALUE",
    "COMPACT_ZSET_ENTRIES",
    "compact",
    "hincrby",
    "hincrbyfloat",
    "hrandfield",
    "hscan",
    "hsetnx",
    "random_picks",
]

# Redis 7.0's defaults: hash-max-listpack-entries and -value, zset-max-listpack-entries
# (its -value is 64 too).
COMPACT_ENTRIES = 512
COMPACT_VALUE = 64
COMPACT_ZSET_ENTRIES = 128

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def compact(h: dict[bytes, bytes]) -> bool:
    """Whether Redis would hold a hash built to this shape in a listpack."""
    return len(h) <= COMPACT_ENTRIES and all(
        len(f) <= COMPACT_VALUE and len(v) <= COMPACT_VALUE for f, v in h.items()
    )


def hincrby(ks: Keyspace, key: bytes, field: bytes, delta: int) -> int:
    h = ks.hash(key, read=False)
    current = None if h is None else h.get(field)
    old = 0
    if current is not None:
        parsed = parse_int64(current)
        if parsed is None:
            raise PionError("hash value is not an integer")
        old = parsed
    new = old + delta
    if not _INT64_MIN <= new <= _INT64_MAX:
        raise PionError("increment or decrement would overflow")
    ks.hash_set(key, [(field, str(new).encode())], keep_ttl=True)
    return new


def hincrbyfloat(ks: Keyspace, key: bytes, field: bytes, raw_delta: bytes) -> bytes:
    """In 80-bit long double, as Redis; the new value's text."""
    delta = parse_long_double(raw_delta)
    if delta is None:
        raise PionError("value is not a valid float")
    if not np.isfinite(delta):
        raise PionError("value is NaN or Infinity")
    h = ks.hash(key, read=False)
    current = None if h is None else h.get(field)
    old = np.longdouble(0)
    if current is not None:
        parsed = parse_long_double(current)
        if parsed is None:
            raise PionError("hash value is not a float")
        old = parsed
    new = old + delta
    if not np.isfinite(new):
        raise PionError("increment would produce NaN or Infinity")
    text = format_long_double(new)
    ks.hash_set(key, [(field, text)], keep_ttl=True)
    return text


def hsetnx(ks: Keyspace, key: bytes, field: bytes, value: bytes) -> bool:
    h = ks.hash(key, read=False)
    if h is not None and field in h:
        return False
    ks.hash_set(key, [(field, value)])
    return True


def random_picks(rng: Random, size: int, count: int) -> list[int]:
    """Positions for HRANDFIELD/ZRANDMEMBER's count: ``count`` >= 0 distinct ones (all,
    in order, when it covers the whole), a negative count ``-count`` with repeats."""
    if count < 0:
        return [rng.randrange(size) for _ in range(-count)]
    if count >= size:
        return list(range(size))
    return rng.sample(range(size), count)


def hrandfield(ks: Keyspace, key: bytes, count: int | None) -> list[tuple[bytes, bytes]] | None:
    """HRANDFIELD: None for no key (without count); else the picked (field, value)."""
    h = ks.hash(key)
    if h is None:
        return None if count is None else []
    items = list(h.items())
    if count is None:
        return [items[ks.rng.randrange(len(items))]]
    if count == 0:
        return []
    return [items[i] for i in random_picks(ks.rng, len(items), count)]


def hscan(
    ks: Keyspace, key: bytes, cursor: int, count: int, pattern: bytes | None
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """One HSCAN step (see the module docstring): (next cursor, field-value pairs)."""
    h = ks.hash(key, read=False)
    if h is None:
        return 0, []
    if compact(h):
        items = list(h.items())
        nxt = 0
    else:
        items = list(islice(h.items(), cursor, cursor + count))
        nxt = cursor + len(items) if cursor + len(items) < len(h) else 0
    if pattern is not None:
        items = [(f, v) for f, v in items if stringmatch(pattern, f)]
    return nxt, items
