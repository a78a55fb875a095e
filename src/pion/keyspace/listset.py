"""The primitives that change lists and sets, and the replay of their records.

:class:`ListSetTable` extends :class:`~pion.keyspace.primitives.KeyTable` with the
list (``collections.deque``) and set (``set``) primitives: each keeps ``used_bytes``
and the key's size, tells WATCH (``watchers``) and the blocked clients' readiness
(``ready``: a key someone blocks on that gained elements, for BLPOP and friends) and
removes a key its change leaves empty, as Redis does. The store's writes
(``lists.py``, ``sets.py``) validate, budget and journal, then call these;
:meth:`ListSetTable.apply` replays a record through them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import cast

from pion.errors import PionError
from pion.keyspace.entries import LIST_ITEM_OVERHEAD, SET_MEMBER_OVERHEAD, Entry, Value, own
from pion.keyspace.mutations import (
    KeyMutation,
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListReplace,
    ListSet,
    ListTrim,
    NewKey,
    SetAdd,
    SetMove,
    SetRemove,
    SetReplace,
)
from pion.keyspace.primitives import KeyTable
from pion.keyspace.sortedset import SortedSet

__all__ = ["ListSetTable", "lrem_positions"]

_LIST_RECORDS = (
    ListPush,
    ListPop,
    ListSet,
    ListInsert,
    ListTrim,
    ListRemove,
    ListMove,
    ListReplace,
)
_SET_RECORDS = (SetAdd, SetRemove, SetReplace, SetMove)


def lrem_positions(d: deque[bytes], count: int, element: bytes) -> list[int]:
    """The indexes LREM removes, in increasing order."""
    if count >= 0:
        found = [i for i, v in enumerate(d) if v == element]
        return found[:count] if count else found
    found = [len(d) - 1 - i for i, v in enumerate(reversed(d)) if v == element]
    return sorted(found[:-count])


class ListSetTable(KeyTable):
    """The key table with list and set primitives; see the module docstring."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__(clock)
        # Blocked clients per key, in arrival order (``pion.commands.blocking`` keeps
        # them), and the keys among those that gained a list or sorted set since they
        # were last served; cleared by whoever serves them.
        self.waiting: dict[bytes, deque[object]] = {}
        self.ready: set[bytes] = set()
        # The tables with ready keys; one set shared by the numbered databases
        # (``databases.py``), so one test after each command finds them all.
        self.alarm: set[ListSetTable] = set()

    def _signal(self, key: bytes) -> None:
        if key in self.waiting:
            self.ready.add(key)
            self.alarm.add(self)

    def _put(self, key: bytes, value: Value, deadline: int, size: int = -1) -> None:
        super()._put(key, value, deadline, size)
        if self.waiting and isinstance(value, (deque, SortedSet)):
            self._signal(key)  # RENAME, COPY, a new list or sorted set

    def _apply_scores(self, key: bytes, items: Iterable[tuple[float, bytes]]) -> None:
        super()._apply_scores(key, items)
        if self.waiting:
            self._signal(key)

    def apply(self, m: KeyMutation) -> None:
        if isinstance(m, _LIST_RECORDS):
            self._apply_list(m)
        elif isinstance(m, _SET_RECORDS):
            self._apply_set(m)
        elif isinstance(m, NewKey) and m.kind in ("list", "set"):
            value: deque[bytes] | set[bytes] = deque() if m.kind == "list" else set()
            self._put(m.key, value, m.deadline)
        else:
            super().apply(m)

    def _apply_list(self, m: KeyMutation) -> None:
        if isinstance(m, ListPush):
            self._typed(m.key, deque)
            self._apply_push(m.key, m.left, [own(v) for v in m.items])
        elif isinstance(m, ListMove):
            self._typed(m.source, deque)
            self._typed(m.destination, deque)
            if m.source in self._data:
                self._apply_move(m.source, m.destination, m.from_left, m.to_left)
        elif isinstance(m, ListPop):
            if self._typed(m.key, deque):
                self._apply_pop(m.key, m.left, m.count)
        elif isinstance(m, ListSet):
            if self._typed(m.key, deque):
                self._apply_lset(m.key, m.index, own(m.value))
        elif isinstance(m, ListInsert):
            if self._typed(m.key, deque):
                self._apply_linsert(m.key, m.index, own(m.value))
        elif isinstance(m, ListTrim):
            if self._typed(m.key, deque):
                self._apply_ltrim(m.key, m.start, m.stop)
        elif isinstance(m, ListReplace):
            if m.key in self._data:
                self._drop(m.key)
            self._apply_push(m.key, False, [own(v) for v in m.items])
        elif isinstance(m, ListRemove) and self._typed(m.key, deque):
            d = cast(deque[bytes], self._data[m.key].value)
            self._apply_lrem(m.key, lrem_positions(d, m.count, m.element))

    def _apply_set(self, m: KeyMutation) -> None:
        if isinstance(m, SetAdd):
            self._typed(m.key, set)
            self._apply_sadd(m.key, m.members)
        elif isinstance(m, SetRemove):
            if self._typed(m.key, set):
                self._apply_srem(m.key, m.members)
        elif isinstance(m, SetReplace):
            if m.key in self._data:
                self._drop(m.key)
            self._apply_sadd(m.key, m.members)
        elif isinstance(m, SetMove):
            self._typed(m.source, set)
            self._typed(m.destination, set)
            if m.source in self._data:
                self._apply_smove(m.source, m.destination, m.member)

    # -- lists -----------------------------------------------------------------------

    def _grown(self, e: Entry, grow: int) -> None:
        e.size += grow
        self.used_bytes += grow

    def _touch(self, key: bytes) -> None:
        if self.watchers.names:
            self.watchers.touch(key)

    def _list_entry(self, key: bytes) -> Entry:
        e = self._data.get(key)
        if e is None:
            self._put(key, deque(), 0)
            e = self._data[key]
        return e

    def _apply_push(self, key: bytes, left: bool, items: list[bytes]) -> None:
        self._touch(key)
        e = self._list_entry(key)
        d = cast(deque[bytes], e.value)
        if left:
            d.extendleft(items)
        else:
            d.extend(items)
        self._grown(e, sum(len(v) for v in items) + len(items) * LIST_ITEM_OVERHEAD)
        if self.waiting:
            self._signal(key)

    def _shrunk(self, key: bytes, e: Entry, gone: Iterable[bytes], overhead: int) -> None:
        shrink = 0
        n = 0
        for v in gone:
            shrink += len(v)
            n += 1
        self._grown(e, -(shrink + n * overhead))
        if not e.value:
            self._drop(key)

    def _apply_pop(self, key: bytes, left: bool, count: int) -> list[bytes]:
        self._touch(key)
        e = self._data[key]
        d = cast(deque[bytes], e.value)
        take = d.popleft if left else d.pop
        out = [take() for _ in range(min(count, len(d)))]
        self._shrunk(key, e, out, LIST_ITEM_OVERHEAD)
        return out

    def _apply_lset(self, key: bytes, index: int, value: bytes) -> None:
        e = self._data[key]
        d = cast(deque[bytes], e.value)
        if not 0 <= index < len(d):
            raise PionError("an LSET record's index is outside its list")
        self._touch(key)
        old = d[index]
        d[index] = value
        self._grown(e, len(value) - len(old))

    def _apply_linsert(self, key: bytes, index: int, value: bytes) -> None:
        e = self._data[key]
        d = cast(deque[bytes], e.value)
        if not 0 <= index <= len(d):
            raise PionError("an LINSERT record's index is outside its list")
        self._touch(key)
        d.insert(index, value)
        self._grown(e, len(value) + LIST_ITEM_OVERHEAD)

    def _apply_ltrim(self, key: bytes, start: int, stop: int) -> None:
        self._touch(key)
        e = self._data[key]
        d = cast(deque[bytes], e.value)
        gone: list[bytes] = []
        for _ in range(min(start, len(d))):
            gone.append(d.popleft())
        while len(d) > stop - start + 1:
            gone.append(d.pop())
        self._shrunk(key, e, gone, LIST_ITEM_OVERHEAD)

    def _apply_lrem(self, key: bytes, positions: list[int]) -> None:
        if not positions:
            return
        self._touch(key)
        e = self._data[key]
        d = cast(deque[bytes], e.value)
        drop = set(positions)
        gone = [d[i] for i in positions]
        kept = [v for i, v in enumerate(d) if i not in drop]
        d.clear()
        d.extend(kept)
        self._shrunk(key, e, gone, LIST_ITEM_OVERHEAD)

    def _apply_move(
        self, source: bytes, destination: bytes, from_left: bool, to_left: bool
    ) -> bytes:
        if source == destination:  # a rotation: the key never empties, its TTL stays
            self._touch(source)
            d = cast(deque[bytes], self._data[source].value)
            value = d.popleft() if from_left else d.pop()
            if to_left:
                d.appendleft(value)
            else:
                d.append(value)
            return value
        (value,) = self._apply_pop(source, from_left, 1)
        self._apply_push(destination, to_left, [value])
        return value

    # -- sets ------------------------------------------------------------------------

    def _apply_sadd(self, key: bytes, members: Iterable[bytes]) -> int:
        self._touch(key)
        e = self._data.get(key)
        if e is None:
            self._put(key, set(), 0)
            e = self._data[key]
        s = cast(set[bytes], e.value)
        grow = added = 0
        for m in members:
            if m not in s:
                s.add(m)
                grow += len(m) + SET_MEMBER_OVERHEAD
                added += 1
        self._grown(e, grow)
        return added

    def _apply_srem(self, key: bytes, members: Iterable[bytes]) -> None:
        self._touch(key)
        e = self._data[key]
        s = cast(set[bytes], e.value)
        gone = []
        for m in members:
            if m in s:
                s.discard(m)
                gone.append(m)
        self._shrunk(key, e, gone, SET_MEMBER_OVERHEAD)

    def _apply_smove(self, source: bytes, destination: bytes, member: bytes) -> None:
        self._apply_srem(source, (member,))
        self._apply_sadd(destination, (member,))
