"""The primitive that changes streams, the replay of their records, and their snapshot.

:class:`StreamTable` extends :class:`~pion.keyspace.listset.ListSetTable` with one
primitive, :meth:`StreamTable._apply_stream`: it applies a
:mod:`~pion.keyspace.streamops` effect to a key's :class:`~pion.keyspace.streamtype.Stream`
(creating it for an XADD or MKSTREAM), keeps ``used_bytes`` and the key's size, tells
WATCH and marks the key ready for the clients blocked on it (XREAD and XREADGROUP
with BLOCK) when it gained an entry. A stream never disappears by itself: XDEL and
XTRIM may leave it empty, as in Redis. The store's writes (``streams.py``) validate,
budget and journal, then call it; :meth:`StreamTable.apply` replays a record through
it. :func:`stream_records` (``entries.py``'s) is a stream as the records that rebuild it
(a snapshot).
"""

from __future__ import annotations

from typing import cast

from pion.errors import PionError
from pion.keyspace.entries import Value, stream_records
from pion.keyspace.listset import ListSetTable
from pion.keyspace.mutations import KeyMutation, StreamChange
from pion.keyspace.streamops import (
    GroupCreate,
    GroupDestroy,
    StreamAdd,
    StreamCreate,
    StreamEffect,
)
from pion.keyspace.streamtype import Stream

__all__ = ["StreamTable", "stream_records"]


class StreamTable(ListSetTable):
    """The key table with the stream primitive; see the module docstring."""

    def _put(self, key: bytes, value: Value, deadline: int, size: int = -1) -> None:
        super()._put(key, value, deadline, size)
        if self.waiting and isinstance(value, Stream):
            self._signal(key)  # RENAME or COPY of a stream onto a key someone reads

    def _drop(self, key: bytes, *, expiring: bool = False) -> None:
        if self.waiting and key in self.waiting and isinstance(self._data[key].value, Stream):
            self._signal(key)  # XREADGROUP's waiters end with an error (Redis 7.0)
        super()._drop(key, expiring=expiring)

    def apply(self, m: KeyMutation) -> None:
        if isinstance(m, StreamChange):
            e = self._data.get(m.key)
            if e is not None and not isinstance(e.value, Stream):
                raise PionError("a stream record is applied to a key of another type")
            if e is None and not isinstance(m.change, (StreamCreate, StreamAdd, GroupCreate)):
                return  # the key went (DEL, expiry) before: as the command found it
            self._apply_stream(m.key, m.change)
        else:
            super().apply(m)

    def _apply_stream(self, key: bytes, change: StreamEffect) -> None:
        self._touch(key)
        e = self._data.get(key)
        if e is None:
            deadline = change.deadline if isinstance(change, StreamCreate) else 0
            self._put(key, Stream(), deadline)
            e = self._data[key]
        s = cast(Stream, e.value)
        self._grown(e, s.apply(change))
        if self.waiting and isinstance(change, (StreamAdd, GroupDestroy)):
            self._signal(key)
