"""The LRU order of eviction groups, O(1) per touch and per victim.

A group is a namespace's two halves (``<ns>_pk``/``<ns>_pv``) or a lone sid (see
``views.namespace_of``); its age is that of its most recently used member, so touching
any member makes the whole group the most recent. Two orders are kept, each an
``OrderedDict`` whose ``move_to_end`` is O(1):

- every group with a live member: ``--vstore-max-sessions`` evicts from its front;
- every group holding bytes: ``--maxmemory`` evicts from its front, so a budget
  eviction never walks past empty sessions to find bytes.

With the bytes each group holds kept here too, "is there enough to evict?" is one
subtraction, and an eviction examines exactly the groups it evicts (plus at most the
one group it must spare). Owned by :class:`pion.vstore.VStore`; it never journals.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

__all__ = ["Group", "GroupLRU"]

Group = tuple[bytes, ...]


class GroupLRU:
    """Groups in least-recently-used order; see the module docstring."""

    __slots__ = ("_bytes", "_holding", "_members")

    def __init__(self) -> None:
        self._members: OrderedDict[Group, int] = OrderedDict()  # group -> live members
        self._holding: OrderedDict[Group, None] = OrderedDict()  # groups with bytes > 0
        self._bytes: dict[Group, int] = {}  # group -> stored bytes of its members

    def __len__(self) -> int:
        return len(self._members)

    def add(self, group: Group) -> None:
        """A member of ``group`` appeared; the group becomes the most recent."""
        self._members[group] = self._members.get(group, 0) + 1
        self._bytes.setdefault(group, 0)
        self.touch(group)

    def remove(self, group: Group, nbytes: int) -> None:
        """A member holding ``nbytes`` disappeared."""
        left = self._members[group] - 1
        held = self._bytes[group] - nbytes
        if left:
            self._members[group] = left
            self._bytes[group] = held
            if not held:
                self._holding.pop(group, None)
        else:
            del self._members[group]
            del self._bytes[group]
            self._holding.pop(group, None)

    def grew(self, group: Group, nbytes: int) -> None:
        """A member of ``group`` now holds ``nbytes`` more (the caller touches it)."""
        if nbytes:
            self._bytes[group] += nbytes
            self._holding[group] = None

    def shrank(self, group: Group, nbytes: int) -> None:
        """A member of ``group`` now holds ``nbytes`` fewer (V.RESTORE cut its rows)."""
        if nbytes:
            held = self._bytes[group] - nbytes
            self._bytes[group] = held
            if not held:
                self._holding.pop(group, None)

    def touch(self, group: Group) -> None:
        self._members.move_to_end(group)
        if group in self._holding:
            self._holding.move_to_end(group)

    def bytes_of(self, group: Group) -> int:
        return self._bytes.get(group, 0)

    def oldest(self, exclude: Group) -> Group | None:
        """The least recently used group other than ``exclude``."""
        for group in self._members:
            if group != exclude:
                return group
        return None

    def holding(self, exclude: Group) -> Iterator[Group]:
        """Groups that hold bytes, least recently used first, without ``exclude``.
        Do not add, remove or touch groups while iterating."""
        return (group for group in self._holding if group != exclude)
