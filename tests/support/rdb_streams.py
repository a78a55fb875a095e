"""A stream's DUMP payload built straight from the layout in ``rdb_stream``'s docstring
(RDB types 15, 19 and 21), independently of the server's writer: every integer in a
listpack in its 64-bit form, every length in its widest form, and knobs that break one
rule at a time for the hostile-payload tests."""

from __future__ import annotations

from typing import NamedTuple

from pion.keyspace.rdb import crc64

StreamId = tuple[int, int]

SEEN, ACTIVE = 1234, 5678  # every consumer's seen time, and its type-21 active time


class Node(NamedTuple):
    master: StreamId
    entries: list[tuple[StreamId, bool, dict[bytes, bytes]]]  # id, deleted, fields


class Group(NamedTuple):
    name: bytes
    last: StreamId
    read: int
    pel: dict[StreamId, tuple[int, int]]  # id: (delivery time, count)
    consumers: dict[bytes, list[StreamId]]  # name: the PEL entries it owns


def _len(n: int) -> bytes:
    return b"\x81" + (n & (1 << 64) - 1).to_bytes(8, "big")


def _str(b: bytes) -> bytes:
    return _len(len(b)) + b


def _raw(i: StreamId) -> bytes:
    return i[0].to_bytes(8, "big") + i[1].to_bytes(8, "big")


def _backlen(n: int) -> bytes:
    size = next(k for k, top in enumerate((128, 16383, 2097151, 268435455, 1 << 64), 1) if n < top)
    return bytes((n >> 7 * (size - 1 - k)) & 127 | (128 if k else 0) for k in range(size))


def _lp(items: list[int | bytes]) -> bytes:
    body = b""
    for item in items:
        if isinstance(item, int):
            element = b"\xf4" + item.to_bytes(8, "little", signed=True)
        elif len(item) < 4096:
            element = bytes((0xE0 | len(item) >> 8, len(item) & 0xFF)) + item
        else:
            element = b"\xf0" + len(item).to_bytes(4, "little") + item
        body += element + _backlen(len(element))
    return (7 + len(body)).to_bytes(4, "little") + len(items).to_bytes(2, "little") + body + b"\xff"


def _node(
    node: Node, master_counts: tuple[int, int] | None, element_count: int | None, flags: int
) -> bytes:
    names = list(node.entries[0][2]) if node.entries else [b"a"]
    live = sum(not d for _, d, _ in node.entries)
    counts = master_counts or (live, len(node.entries) - live)
    items: list[int | bytes] = [*counts, len(names), *names, 0]
    for n, (i, deleted, fields) in enumerate(node.entries):
        same = list(fields) == names
        entry: list[int | bytes] = [
            (2 if same else 0) | int(deleted) | (flags if n == 0 else 0),
            i[0] - node.master[0],
            i[1] - node.master[1],
        ]
        if same:
            entry += list(fields.values())
        else:
            entry += [len(fields), *(x for pair in fields.items() for x in pair)]
        items += entry
        items.append(element_count if element_count is not None and n == 0 else len(entry))
    return _lp(items)


def stream_payload(
    kind: int,
    nodes: list[Node],
    *,
    length: int,
    last: StreamId,
    first: StreamId,
    max_deleted: StreamId,
    added: int,
    groups: list[Group],
    key_size: int = 16,
    master_counts: tuple[int, int] | None = None,
    element_count: int | None = None,
    flags: int = 0,
) -> bytes:
    """A sealed payload (version 10, right checksum) of RDB type ``kind``."""
    out = bytes((kind,)) + _len(len(nodes))
    for node in nodes:
        out += _str(_raw(node.master)[:key_size])
        out += _str(_node(node, master_counts, element_count, flags))
    out += _len(length) + _len(last[0]) + _len(last[1])
    if kind != 15:
        out += b"".join(_len(x) for x in (*first, *max_deleted, added))
    out += _len(len(groups))
    for g in groups:
        out += _str(g.name) + _len(g.last[0]) + _len(g.last[1])
        if kind != 15:
            out += _len(g.read)
        out += _len(len(g.pel))
        for i, (time, count) in g.pel.items():
            out += _raw(i) + time.to_bytes(8, "little", signed=True) + _len(count)
        out += _len(len(g.consumers))
        for name, owned in g.consumers.items():
            out += _str(name) + SEEN.to_bytes(8, "little")
            if kind == 21:
                out += ACTIVE.to_bytes(8, "little")
            out += _len(len(owned)) + b"".join(_raw(i) for i in owned)
    out += (10).to_bytes(2, "little")
    return out + crc64(out).to_bytes(8, "little")
