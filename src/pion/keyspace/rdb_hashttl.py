"""Hashes with field deadlines in Redis's DUMP payload (Redis 7.4's hash-field
expiry): RDB types 22 and 23 (7.4's release candidates), 24 and 25 (7.4.0 on) are
read; 24 is written, under payload version 12 (7.4's; Redis before 7.4 reads neither
the type nor the version).

The body after the type byte ("len" is the payload's length encoding, ``put_length``;
"string" a len then the bytes; "time" 8 bytes, little-endian, Unix ms)::

    24  time min                 the earliest field deadline
        len N, N times:          the fields:
          len ttl                  0: no deadline, else deadline - min + 1
          string, string           field, value
    22  as 24 without ``min``; ``ttl`` is the deadline itself (0: none)
    25  time min                 (ignored on reading, as Redis does)
        string                   a listpack of field, value, deadline (0: none) triples
    23  as 25 without ``min``

A deadline past Redis's ``EB_EXPIRE_TIME_MAX`` (2**48 - 1 ms) is ``BadFormat``, as a
listpack whose entries are not triples, or a deadline that is not an integer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pion.keyspace.numbers import parse_int64
from pion.keyspace.rdb_compact import BadFormat, Reader, listpack, put_length

__all__ = ["HASH_TTL_TYPES", "HASH_TTL_VERSION", "load_hash_ttl", "put_hash_ttl"]

HASH_METADATA_PRE_GA: Final = 22
HASH_LISTPACK_EX_PRE_GA: Final = 23
HASH_METADATA: Final = 24
HASH_LISTPACK_EX: Final = 25
HASH_TTL_TYPES: Final = (
    HASH_METADATA_PRE_GA,
    HASH_LISTPACK_EX_PRE_GA,
    HASH_METADATA,
    HASH_LISTPACK_EX,
)
# Redis 7.4's RDB_VERSION: what a payload holding type 24 carries.
HASH_TTL_VERSION: Final = 12
# EB_EXPIRE_TIME_MAX: a field deadline is kept in 48 bits of ms.
_MAX_DEADLINE: Final = (1 << 48) - 1

Pairs = list[tuple[bytes, bytes]]


def put_hash_ttl(out: bytearray, h: Mapping[bytes, bytes], ttls: Mapping[bytes, int]) -> None:
    """Append ``h`` with its fields' deadlines ``ttls`` (some, not empty) as type 24."""
    low = min(ttls.values())
    out.append(HASH_METADATA)
    out += low.to_bytes(8, "little")
    put_length(out, len(h))
    for field, value in h.items():
        d = ttls.get(field, 0)
        put_length(out, d - low + 1 if d else 0)
        put_length(out, len(field))
        out += field
        put_length(out, len(value))
        out += value


def load_hash_ttl(r: Reader, kind: int) -> tuple[Pairs, dict[bytes, int]]:
    """The field/value pairs and the fields' deadlines of a hash of type ``kind``."""
    if kind in (HASH_LISTPACK_EX, HASH_LISTPACK_EX_PRE_GA):
        if kind == HASH_LISTPACK_EX:
            r.take(8)  # the earliest deadline: the listpack's own say
        return _triples(listpack(r.string()))
    low = 0
    if kind == HASH_METADATA:
        low = int.from_bytes(r.take(8), "little")
        if low > _MAX_DEADLINE:
            raise BadFormat("a hash's earliest field deadline is out of range")
    pairs: Pairs = []
    ttls: dict[bytes, int] = {}
    for _ in range(r.count()):
        ttl = r.count()
        field, value = r.string(), r.string()
        deadline = ttl + low - 1 if ttl and kind == HASH_METADATA else ttl
        pairs.append((field, value))
        if deadline:
            ttls[field] = _checked(deadline)
    return pairs, ttls


def _checked(deadline: int) -> int:
    if not 0 < deadline <= _MAX_DEADLINE:
        raise BadFormat("a field deadline is out of range")
    return deadline


def _triples(items: list[bytes]) -> tuple[Pairs, dict[bytes, int]]:
    if len(items) % 3:
        raise BadFormat("a hash listpack's entries are not field, value, deadline")
    pairs: Pairs = []
    ttls: dict[bytes, int] = {}
    for at in range(0, len(items), 3):
        field, value, raw = items[at : at + 3]
        deadline = parse_int64(raw)
        if deadline is None:
            raise BadFormat("a field deadline is not an integer")
        pairs.append((field, value))
        if deadline:
            ttls[field] = _checked(deadline)
    return pairs, ttls
