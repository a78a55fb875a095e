"""Streams in Redis's DUMP payload (``rdbSaveObject``/``rdbLoadObject`` of
``t_stream.c``'s data): RDB types 15 (Redis 5 and 6), 19 (Redis 7.0) and 21 (7.2 on)
are read; 19 is written, the newest type redis-server 7.0 reads, under the payload
version 7.0 accepts (10).

The body after the type byte, byte by byte ("len" is the payload's length encoding,
``put_length``; "string" is a len then the bytes; "id" is a len for its milliseconds
then a len for its sequence number; "raw id" is 16 bytes, both halves big-endian;
"time" is Unix milliseconds, 8 bytes, little-endian, signed)::

    len N                      listpack nodes, in id order, then N times:
      string (16 bytes)          the node's master id, a raw id
      string                     the node's listpack (below)
    len                        live entries
    id                         last id
    id, id, len                types 19 and 21: first id, max deleted id, entries added
    len G                      consumer groups, then G times:
      string, id                 name, last delivered id
      len                        types 19 and 21: entries read (2**64 - 1: not known)
      len P, P times:            the group's PEL, in id order:
        raw id, time, len          id, last delivery, delivery count
      len C, C times:            consumers:
        string, time               name, seen time
        time                       type 21: active time (read, not kept: 7.0's model)
        len Q, Q times raw id      the PEL entries it owns (each in the group's PEL)

A node's listpack (``streamAppendItem``) holds the master entry, then each entry::

    live count, deleted count, F, F field names, 0        the master entry
    flags, ms - master ms, seq - master seq                one entry: flags 1 deleted,
    (flags & 2, same fields as the master: F values           2 same fields; the id
     | else: n, then n field, value pairs),                   differences as int64
    element count (F + 3 | 2n + 4)

Reading checks what Redis's deep sanitization checks and what this build's stream
relies on: ids strictly increasing across nodes (deleted ones included) and not past
the last id, each node's counts and element counts exact, the live count equal to the
total, no repeated group, consumer or PEL entry, each PEL entry owned by exactly one
consumer. Anything else is :class:`BadFormat` ("Bad data format"). Every count is read
one element at a time from bytes that are there, so a false count allocates nothing.

Writing puts each modelled node (``streamnodes``) with its live entries only (deleted
ones' fields are not kept here), so redis-server's later XADDs and ``~`` trims see the
node boundaries this server had.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Final

from pion.keyspace.numbers import parse_int64
from pion.keyspace.rdb_compact import BadFormat, Reader, listpack, put_length
from pion.keyspace.streamops import (
    Claim,
    ConsumerCreate,
    GroupCreate,
    StreamEntries,
    StreamId,
    StreamSetId,
)
from pion.keyspace.streamtype import UNKNOWN, Stream

__all__ = ["STREAM_TYPES", "STREAM_WRITTEN", "load_stream", "put_stream"]

STREAM_LISTPACKS: Final = 15
STREAM_LISTPACKS_2: Final = 19
STREAM_LISTPACKS_3: Final = 21
STREAM_TYPES: Final = (STREAM_LISTPACKS, STREAM_LISTPACKS_2, STREAM_LISTPACKS_3)
STREAM_WRITTEN: Final = STREAM_LISTPACKS_2

_DELETED: Final = 1  # STREAM_ITEM_FLAG_DELETED
_SAMEFIELDS: Final = 2  # STREAM_ITEM_FLAG_SAMEFIELDS
_MASK: Final = (1 << 64) - 1

_Entry = tuple[StreamId, tuple[bytes, ...]]


# -- writing -------------------------------------------------------------------------


def put_stream(out: bytearray, s: Stream) -> None:
    """Append ``s`` as RDB type 19 (type byte included)."""
    out.append(STREAM_WRITTEN)
    nodes = []
    for node in s.nodes:
        a, b = bisect_left(s.ids, node.ids[0]), bisect_right(s.ids, node.ids[-1])
        if a < b:
            nodes.append((node.master, node.fields, s.ids[a:b]))
    put_length(out, len(nodes))
    for master, names, ids in nodes:
        _put_string(out, _raw_id(master))
        _put_string(out, _node_listpack(s, master, names, ids))
    put_length(out, len(s))
    for i in (s.last_id, s.first_id, s.max_deleted):
        _put_id(out, i)
    put_length(out, s.entries_added)
    put_length(out, len(s.groups))
    for name, g in s.groups.items():
        _put_string(out, name)
        _put_id(out, g.last_id)
        put_length(out, g.entries_read & _MASK)  # UNKNOWN (-1) as 2**64 - 1, as Redis
        put_length(out, len(g.pel))
        for i in sorted(g.pel):
            p = g.pel[i]
            out += _raw_id(i) + p.time.to_bytes(8, "little", signed=True)
            put_length(out, p.count)
        put_length(out, len(g.consumers))
        for cname, c in g.consumers.items():
            _put_string(out, cname)
            out += c.seen.to_bytes(8, "little", signed=True)
            put_length(out, len(c.pending))
            for i in sorted(c.pending):
                out += _raw_id(i)


def _put_string(out: bytearray, s: bytes) -> None:
    put_length(out, len(s))
    out += s


def _put_id(out: bytearray, i: StreamId) -> None:
    put_length(out, i[0])
    put_length(out, i[1])


def _raw_id(i: StreamId) -> bytes:
    return i[0].to_bytes(8, "big") + i[1].to_bytes(8, "big")


def _node_listpack(
    s: Stream, master: StreamId, names: tuple[bytes, ...], ids: list[StreamId]
) -> bytes:
    items: list[int | bytes] = [len(ids), 0, len(names), *names, 0]
    for i in ids:
        fields = s.entries[i]
        same = fields[0::2] == names
        head: list[int | bytes] = [
            _SAMEFIELDS if same else 0,
            _delta(i[0], master[0]),
            _delta(i[1], master[1]),
        ]
        body: list[int | bytes] = [*fields[1::2]] if same else [len(fields) // 2, *fields]
        items += head
        items += body
        items.append(len(head) + len(body))
    return _listpack(items)


def _delta(a: int, b: int) -> int:
    """``a - b`` of two uint64s as the int64 Redis stores."""
    d = (a - b) & _MASK
    return d - (1 << 64) if d >= 1 << 63 else d


def _listpack(items: list[int | bytes]) -> bytes:
    body = bytearray()
    for item in items:
        if isinstance(item, int):
            element = _lp_int(item)
        else:  # lpAppend stores an integer-looking string as an integer
            n = parse_int64(item)
            element = _lp_string(item) if n is None else _lp_int(n)
        body += element
        body += _backlen(len(element))
    total = 6 + len(body) + 1
    count = min(len(items), 0xFFFF)  # 65535: "unknown, walk the entries"
    return total.to_bytes(4, "little") + count.to_bytes(2, "little") + body + b"\xff"


def _lp_int(v: int) -> bytes:
    """``lpEncodeIntegerGetType``: the smallest of listpack's integer encodings."""
    if 0 <= v <= 127:
        return bytes((v,))
    if -4096 <= v <= 4095:
        v &= 0x1FFF
        return bytes((0xC0 | v >> 8, v & 0xFF))
    for tag, width in ((0xF1, 2), (0xF2, 3), (0xF3, 4)):
        if -(1 << (8 * width - 1)) <= v < 1 << (8 * width - 1):
            return bytes((tag,)) + v.to_bytes(width, "little", signed=True)
    return b"\xf4" + v.to_bytes(8, "little", signed=True)


def _lp_string(b: bytes) -> bytes:
    n = len(b)
    if n < 64:
        return bytes((0x80 | n,)) + b
    if n < 4096:
        return bytes((0xE0 | n >> 8, n & 0xFF)) + b
    return b"\xf0" + n.to_bytes(4, "little") + b


def _backlen(n: int) -> bytes:
    """``lpEncodeBacklen``: an element's size for walking right to left, 7 bits a
    byte, the low bits last; every byte but the first has bit 8 set. Redis's size
    thresholds are kept (16383 takes three bytes) so the bytes are its own."""
    size = 1 if n <= 127 else 2 if n < 16383 else 3 if n < 2097151 else 4 if n < 268435455 else 5
    return bytes((n >> 7 * (size - 1 - k)) & 127 | (128 if k else 0) for k in range(size))


# -- reading -------------------------------------------------------------------------


def load_stream(r: Reader, kind: int) -> Stream:
    """The stream of RDB type ``kind`` (15, 19 or 21) at ``r``; raises BadFormat."""
    live, last_seen = _load_nodes(r)
    length = r.count()
    last_id = _id(r)
    if kind == STREAM_LISTPACKS:
        max_deleted, added = (0, 0), length  # what Redis 7.0 assumes of an older stream
    else:
        _id(r)  # the first id: this build derives it from the entries
        max_deleted, added = _id(r), r.count()
    if length != len(live) or added < length:
        raise BadFormat("a stream's length does not match its entries")
    if last_seen is not None and last_id < last_seen:
        raise BadFormat("a stream entry is past the stream's last id")
    s = Stream()
    s.apply(StreamEntries(tuple(live)))
    s.apply(StreamSetId(last_id, added, max_deleted))
    for _ in range(r.count()):
        _load_group(r, s, kind)
    return s


def _id(r: Reader) -> StreamId:
    ms = r.count()
    return ms, r.count()


def _raw(r: Reader) -> StreamId:
    raw = r.take(16)
    return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big")


def _time(r: Reader) -> int:
    return int.from_bytes(r.take(8), "little", signed=True)


def _load_nodes(r: Reader) -> tuple[list[_Entry], StreamId | None]:
    """Every node's live entries, in order, and the greatest id seen (deleted ones
    included; None: no entry at all)."""
    live: list[_Entry] = []
    last: StreamId | None = None
    for _ in range(r.count()):
        key = r.string()
        if len(key) != 16:
            raise BadFormat("a stream node's key is not a stream id")
        master = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
        if last is not None and master <= last:
            raise BadFormat("stream nodes are not in id order")
        for i, fields, deleted in _node_entries(master, listpack(r.string())):
            if (last is not None and i <= last) or i < master:
                raise BadFormat("stream entries are not in id order")
            last = i
            if not deleted:
                live.append((i, fields))
    return live, last


def _int(item: bytes) -> int:
    n = parse_int64(item)
    if n is None:
        raise BadFormat("a stream listpack holds a string where a number belongs")
    return n


def _node_entries(
    master: StreamId, items: list[bytes]
) -> list[tuple[StreamId, tuple[bytes, ...], bool]]:
    """A node's entries: (id, fields, deleted), checked against its master entry."""
    if len(items) < 4:
        raise BadFormat("a stream node has no master entry")
    live, deleted, nf = _int(items[0]), _int(items[1]), _int(items[2])
    if nf < 1 or len(items) < 4 + nf or _int(items[3 + nf]) != 0:
        raise BadFormat("a stream node's master entry is malformed")
    names = items[3 : 3 + nf]
    out: list[tuple[StreamId, tuple[bytes, ...], bool]] = []
    at = 4 + nf
    while at < len(items):
        if at + 4 > len(items):
            raise BadFormat("a stream entry is cut short")
        flags, dms, dseq = _int(items[at]), _int(items[at + 1]), _int(items[at + 2])
        if flags & ~(_DELETED | _SAMEFIELDS):
            raise BadFormat("a stream entry has unknown flags")
        if flags & _SAMEFIELDS:
            used, want = nf + 3, nf
            values = items[at + 3 : at + used]
            fields = tuple(x for pair in zip(names, values, strict=False) for x in pair)
        else:
            want = _int(items[at + 3])
            used = 2 * want + 4
            fields = tuple(items[at + 4 : at + used])
        if want < 1 or len(fields) != 2 * want or at + used >= len(items):
            raise BadFormat("a stream entry is cut short")
        if _int(items[at + used]) != used:
            raise BadFormat("a stream entry's element count is wrong")
        i = (master[0] + dms) & _MASK, (master[1] + dseq) & _MASK
        out.append((i, fields, bool(flags & _DELETED)))
        at += used + 1
    if not out or sum(not d for _, _, d in out) != live or sum(d for _, _, d in out) != deleted:
        raise BadFormat("a stream node's counts do not match its entries")
    return out


def _load_group(r: Reader, s: Stream, kind: int) -> None:
    """One consumer group, its PEL and consumers, applied to ``s``."""
    name = r.string()
    if name in s.groups:
        raise BadFormat("a consumer group is repeated")
    last_id = _id(r)
    if kind == STREAM_LISTPACKS:
        read = s.distance(last_id)  # what Redis 7.0 estimates for an older stream
    else:
        read = r.count()
        read = read - (1 << 64) if read >= 1 << 63 else read  # a long long in Redis
        if read < UNKNOWN:
            raise BadFormat("a consumer group's read counter is negative")
    pel: dict[StreamId, tuple[int, int]] = {}
    for _ in range(r.count()):
        i = _raw(r)
        time = _time(r)
        if i in pel:
            raise BadFormat("a pending entry is repeated")
        pel[i] = time, r.count()
    consumers: dict[bytes, tuple[int, list[StreamId]]] = {}
    owned: set[StreamId] = set()
    for _ in range(r.count()):
        cname = r.string()
        seen = _time(r)
        if kind == STREAM_LISTPACKS_3:
            _time(r)  # active time: Redis 7.2's, not in 7.0's model
        if cname in consumers:
            raise BadFormat("a consumer is repeated")
        ids = consumers[cname] = seen, []
        for _ in range(r.count()):
            i = _raw(r)
            if i not in pel or i in owned:
                raise BadFormat("a consumer's pending entry is not the group's own")
            owned.add(i)
            ids[1].append(i)
    if len(owned) != len(pel):
        raise BadFormat("a pending entry has no consumer")
    s.apply(GroupCreate(name, last_id, read))
    for cname, (seen, mine) in consumers.items():
        s.apply(ConsumerCreate(name, cname, seen))
        if mine:
            s.apply(Claim(name, cname, tuple((i, *pel[i]) for i in mine)))
