"""Redis's DUMP payload, so that ``DUMP`` and ``RESTORE`` move values between
redis-server and pion-server: one value in Redis's RDB encoding, then the RDB version
(2 bytes, little-endian) and a CRC-64 (Redis's Jones polynomial, 8 bytes,
little-endian) over everything before it.

Writing uses the plain encodings every Redis since 2.x reads (a string, with Redis's
integer form for short integers; a list, set or hash as a count then its elements; a
sorted set as ``ZSET_2``, binary scores) and version 10, so redis-server 7.0 accepts
what we dump. The bytes differ from redis-server's own DUMP of the same value, which
picks a compact encoding (listpack, intset) and LZF-compresses strings over 20 bytes:
reproducing liblzf's compressor byte for byte buys nothing a RESTORE needs.

Streams (``rdb_stream``) are written as RDB type 19, Redis 7.0's, with their consumer
groups, and read from types 15, 19 and 21. A hash with field deadlines
(``rdb_hashttl``) is written as Redis 7.4's type 24 under version 12 (so only Redis 7.4
and later restore it) and read from types 22 to 25.

Reading takes every encoding Redis 2.8 to 7.4 writes for strings, lists, sets, hashes,
sorted sets and streams (``rdb_compact`` holds the compact ones) and versions up to 12.
Module values are refused ("Bad data format"), as is anything a correct DUMP never
holds: an empty container (but a stream, which may be empty), a repeated member or
field, a NaN score, bytes after the value.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial

import anycrc

from pion.keyspace.entries import Value
from pion.keyspace.numbers import parse_int64
from pion.keyspace.rdb_compact import (
    BadFormat,
    Reader,
    intset,
    listpack,
    put_length,
    ziplist,
)
from pion.keyspace.rdb_hashttl import HASH_TTL_TYPES, HASH_TTL_VERSION, load_hash_ttl, put_hash_ttl
from pion.keyspace.rdb_stream import STREAM_TYPES, load_stream, put_stream
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.streamtype import Stream

__all__ = [
    "RDB_VERSION",
    "BadFormat",
    "Reader",
    "crc64",
    "dump_payload",
    "load_payload",
    "payload_ok",
    "put_length",
]

# What Redis 7.0 writes and the newest it reads.
RDB_VERSION = 10
# The newest version whose encodings of our types we read (Redis 7.4).
_NEWEST_READ = 12

_STRING, _LIST, _SET, _ZSET, _HASH, _ZSET_2 = 0, 1, 2, 3, 4, 5
_LIST_ZIPLIST, _SET_INTSET, _ZSET_ZIPLIST, _HASH_ZIPLIST, _LIST_QUICKLIST = 10, 11, 12, 13, 14
_HASH_LISTPACK, _ZSET_LISTPACK, _LIST_QUICKLIST_2, _SET_LISTPACK = 16, 17, 18, 20
_QUICKLIST_PLAIN = 1

_CRC64 = anycrc.Model("CRC64-REDIS")
_DOUBLE = struct.Struct("<d")


def payload_ok(payload: bytes) -> bool:
    """``verifyDumpPayload``: a footer, a version we read, and a matching checksum."""
    if len(payload) < 10:
        return False
    version = int.from_bytes(payload[-10:-8], "little")
    crc = int.from_bytes(payload[-8:], "little")
    return version <= _NEWEST_READ and crc64(payload[:-8]) == crc


def crc64(data: bytes) -> int:
    return int(_CRC64.calc(data))


# -- writing -------------------------------------------------------------------------


def dump_payload(value: Value, field_ttls: Mapping[bytes, int] | None = None) -> bytes:
    """``value`` as DUMP answers it; ``field_ttls``: a hash's field deadlines (Unix
    ms), which make it Redis 7.4's type 24 under version 12."""
    out = bytearray()
    version = RDB_VERSION
    if isinstance(value, dict) and field_ttls:
        put_hash_ttl(out, value, field_ttls)
        version = HASH_TTL_VERSION
    elif isinstance(value, bytes):
        out.append(_STRING)
        _put_string(out, value)
    elif isinstance(value, deque):
        out.append(_LIST)
        _put_strings(out, value, len(value))
    elif isinstance(value, set):
        out.append(_SET)
        _put_strings(out, value, len(value))
    elif isinstance(value, dict):
        out.append(_HASH)
        put_length(out, len(value))
        for field, item in value.items():
            _put_string(out, field)
            _put_string(out, item)
    elif isinstance(value, SortedSet):
        out.append(_ZSET_2)
        put_length(out, len(value))
        for score, member in value:
            _put_string(out, member)
            out += _DOUBLE.pack(score)
    else:
        put_stream(out, value)
    out += version.to_bytes(2, "little")
    out += crc64(bytes(out)).to_bytes(8, "little")
    return bytes(out)


def _put_string(out: bytearray, s: bytes) -> None:
    # rdbTryIntegerEncoding: a short canonical integer that fits 32 bits is stored as one.
    n = parse_int64(s) if len(s) <= 11 else None
    if n is not None and -(1 << 31) <= n < 1 << 31:
        width = 1 if -128 <= n < 128 else 2 if -(1 << 15) <= n < 1 << 15 else 4
        out.append(0xC0 | {1: 0, 2: 1, 4: 2}[width])
        out += n.to_bytes(width, "little", signed=True)
        return
    put_length(out, len(s))
    out += s


def _put_strings(out: bytearray, items: deque[bytes] | set[bytes], n: int) -> None:
    put_length(out, n)
    for item in items:
        _put_string(out, item)


# -- reading -------------------------------------------------------------------------


def load_payload(payload: bytes) -> tuple[Value, dict[bytes, int]]:
    """The value a payload holds (which ``payload_ok`` accepted) and, for a hash of
    Redis 7.4's, its fields' deadlines (else empty); raises BadFormat."""
    r = Reader(payload[:-10])
    kind = r.byte()
    loader = _LOADERS.get(kind)
    ttls: dict[bytes, int] = {}
    if kind in HASH_TTL_TYPES:
        pairs, ttls = load_hash_ttl(r, kind)
        value = _hash(pairs)
    elif loader is None:
        raise BadFormat(f"values of RDB type {kind} are not served")
    else:
        value = loader(r)
    if r.at != len(r.body):
        raise BadFormat("bytes follow the value")
    if not value and not isinstance(value, (bytes, Stream)):
        raise BadFormat("an empty container")  # (a stream may be empty, as in Redis)
    return value, ttls


def _list(r: Reader) -> Value:
    return deque(r.string() for _ in range(r.count()))


def _quicklist(r: Reader) -> Value:
    return deque(item for _ in range(r.count()) for item in ziplist(r.string()))


def _quicklist2(r: Reader) -> Value:
    out: deque[bytes] = deque()
    for _ in range(r.count()):
        container = r.count()
        node = r.string()
        if container == _QUICKLIST_PLAIN:
            out.append(node)
        else:
            items = listpack(node)
            if not items:
                raise BadFormat("an empty quicklist node")
            out.extend(items)
    return out


def _members(items: list[bytes]) -> Value:
    members = set(items)
    if len(members) != len(items):
        raise BadFormat("a set member is repeated")
    return members


def _pairs(items: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(items) % 2:
        raise BadFormat("an odd number of entries where pairs are expected")
    return list(zip(items[::2], items[1::2], strict=True))


def _hash(pairs: list[tuple[bytes, bytes]]) -> Value:
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise BadFormat("a hash field is repeated")
    return fields


def _zset(items: list[tuple[bytes, float]]) -> Value:
    scores = dict(items)
    if len(scores) != len(items) or any(math.isnan(s) for s in scores.values()):
        raise BadFormat("a NaN score or a repeated member")
    return SortedSet.adopt(scores, sorted((s, m) for m, s in scores.items()))


def _compact_zset(items: list[bytes]) -> Value:
    try:
        return _zset([(member, float(score)) for member, score in _pairs(items)])
    except ValueError:
        raise BadFormat("a score is not a number") from None


_LOADERS: dict[int, Callable[[Reader], Value]] = {
    _STRING: lambda r: r.string(),
    _LIST: _list,
    _LIST_ZIPLIST: lambda r: deque(ziplist(r.string())),
    _LIST_QUICKLIST: _quicklist,
    _LIST_QUICKLIST_2: _quicklist2,
    _SET: lambda r: _members([r.string() for _ in range(r.count())]),
    _SET_INTSET: lambda r: _members(intset(r.string())),
    _SET_LISTPACK: lambda r: _members(listpack(r.string())),
    _HASH: lambda r: _hash([(r.string(), r.string()) for _ in range(r.count())]),
    _HASH_ZIPLIST: lambda r: _hash(_pairs(ziplist(r.string()))),
    _HASH_LISTPACK: lambda r: _hash(_pairs(listpack(r.string()))),
    _ZSET: lambda r: _zset([(r.string(), r.text_double()) for _ in range(r.count())]),
    _ZSET_2: lambda r: _zset(
        [(r.string(), _DOUBLE.unpack(r.take(8))[0]) for _ in range(r.count())]
    ),
    _ZSET_ZIPLIST: lambda r: _compact_zset(ziplist(r.string())),
    _ZSET_LISTPACK: lambda r: _compact_zset(listpack(r.string())),
}
# Types 15, 19 and 21: Redis 5-6's streams, 7.0's, 7.2's.
_LOADERS.update({t: partial(load_stream, kind=t) for t in STREAM_TYPES})
