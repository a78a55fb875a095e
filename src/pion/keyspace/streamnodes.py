"""Redis's listpack nodes of a stream, modelled: which entries each node holds and how
many bytes its listpack takes, so approximate trimming (``~``, whole nodes only)
removes exactly what Redis 7.0 removes.

Redis appends an entry to the last node unless that node already holds
``stream-node-max-entries`` (100) entries, deleted ones included, or its listpack's
bytes plus the entry's raw field and value lengths reach ``stream-node-max-bytes``
(4096) (``streamAppendItem``). A node's bytes are computed here as ``listpack.c``
encodes them: a 6-byte header and an end byte; the master entry (live count, deleted
count, the field names, a terminator); per entry its flags, the id's differences from
the node's master id, the field count and names unless they are the master's
(SAMEFIELDS), the values and the entry's element count. An integer-looking string is
stored as an integer; every element carries a back-length. XDEL and exact trimming
only flip flags and counts, which never change a node's bytes (the counts stay under
128), and a node goes when its last live entry does.
"""

from __future__ import annotations

import re
from typing import Final

from pion.keyspace.streamops import StreamId

__all__ = ["NODE_MAX_BYTES", "NODE_MAX_ENTRIES", "Node", "starts_node"]

# Redis 7.0's defaults of stream-node-max-entries and stream-node-max-bytes.
NODE_MAX_ENTRIES: Final = 100
NODE_MAX_BYTES: Final = 4096
_HEADER: Final = 7  # the listpack's total-bytes and count fields, and its end byte
_SAMEFIELDS: Final = 2  # STREAM_ITEM_FLAG_SAMEFIELDS
_INT64: Final = re.compile(rb"(0|-?[1-9][0-9]{0,19})\Z")
_MASK: Final = (1 << 64) - 1


def _backlen(size: int) -> int:
    if size <= 127:
        return 1
    if size < 16383:
        return 2
    if size < 2097151:
        return 3
    return 4 if size < 268435455 else 5


def _int(v: int) -> int:
    if 0 <= v <= 127:
        size = 1
    elif -4096 <= v <= 4095:
        size = 2
    elif -32768 <= v <= 32767:
        size = 3
    elif -8388608 <= v <= 8388607:
        size = 4
    elif -(1 << 31) <= v < 1 << 31:
        size = 5
    else:
        size = 9
    return size + _backlen(size)


def _str(b: bytes) -> int:
    if len(b) <= 20 and _INT64.match(b) and -(1 << 63) <= int(b) < 1 << 63:
        return _int(int(b))  # lpAppend stores an integer-looking string as an integer
    n = len(b)
    size = (1 if n < 64 else 2 if n < 4096 else 5) + n
    return size + _backlen(size)


def _diff(a: int, b: int) -> int:
    """``a - b`` of two uint64s as the int64 Redis appends."""
    d = (a - b) & _MASK
    return d - (1 << 64) if d >= 1 << 63 else d


class Node:
    """One listpack node: its ids (deleted ones included), live count and bytes."""

    __slots__ = ("bytes", "fields", "ids", "live", "master")

    def __init__(self, master: StreamId, fields: tuple[bytes, ...]) -> None:
        self.ids: list[StreamId] = []
        self.live = 0
        self.master = master
        self.fields = fields[0::2]  # the master entry's field names
        self.bytes = _HEADER + _int(1) + _int(0) + _int(len(self.fields)) + _int(0)
        self.bytes += sum(_str(f) for f in self.fields)

    def clone(self) -> Node:
        n = Node.__new__(Node)
        n.ids, n.live, n.bytes = list(self.ids), self.live, self.bytes
        n.master, n.fields = self.master, self.fields
        return n

    def entry_bytes(self, i: StreamId, fields: tuple[bytes, ...]) -> int:
        """The bytes appending entry ``i`` with ``fields`` adds to this listpack."""
        names = fields[0::2]
        same = names == self.fields
        size = _int(_SAMEFIELDS if same else 0)
        size += _int(_diff(i[0], self.master[0])) + _int(_diff(i[1], self.master[1]))
        count = len(names) + 3
        if not same:
            size += _int(len(names)) + sum(_str(f) for f in names)
            count += len(names) + 1
        size += sum(_str(v) for v in fields[1::2])
        return size + _int(count)

    def append(self, i: StreamId, fields: tuple[bytes, ...]) -> None:
        self.bytes += self.entry_bytes(i, fields)
        self.ids.append(i)
        self.live += 1


def starts_node(last: Node | None, fields: tuple[bytes, ...]) -> bool:
    """Whether Redis puts an entry with ``fields`` in a new node after ``last``."""
    if last is None:
        return True
    if last.bytes + sum(len(f) for f in fields) >= NODE_MAX_BYTES:
        return True
    return len(last.ids) >= NODE_MAX_ENTRIES
