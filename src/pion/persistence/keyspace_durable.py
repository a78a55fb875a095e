"""The keyspace as a :class:`~pion.persistence.stores.DurableStore`: its mutations
become records of op codes 16..31 (``keyspace_format.py``), its snapshot is
``pion.keyspace.<w>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pion.keyspace import DeleteFields, DeleteKeys, DeleteMembers, Flush, KeyMutation, Keyspace
from pion.persistence import keyspace_format
from pion.persistence.format import Buffer
from pion.persistence.stores import Frame, FrameSink

__all__ = ["KeyspaceDurable", "KeyspaceJournal"]

# Mutations that only remove data (DEL, UNLINK, an expiry, HDEL, ZREM, FLUSHDB/FLUSHALL):
# their records are drops, which a log refusing writes still takes (``stores.Frame``).
_REMOVES_ONLY = (DeleteKeys, DeleteFields, DeleteMembers, Flush)


class KeyspaceJournal:
    """The keyspace's journal: each mutation as a record to a sink. Without a log
    (``--no-wal``) no record is built, only the change counted: encoding a SET's record
    cost about as much as the SET itself."""

    __slots__ = ("logging", "sink")

    def __init__(self, sink: FrameSink) -> None:
        self.sink = sink
        self.logging = sink.logging  # fixed for the sink's life (the log is opened once)

    def append(self, mutation: KeyMutation) -> None:
        if not self.logging:
            self.sink.note_change()
            return
        op, parts = keyspace_format.encode(mutation)
        self.sink.append_frame(Frame(op, parts, isinstance(mutation, _REMOVES_ONLY)))


class KeyspaceDurable:
    """Adapter from :class:`~pion.keyspace.Keyspace` to the durable-store protocol."""

    name = "keyspace"

    def __init__(self, keyspace: Keyspace) -> None:
        self.keyspace = keyspace

    @property
    def ops(self) -> Mapping[int, str]:
        return keyspace_format.OPS

    @property
    def unit_ops(self) -> frozenset[int]:
        return keyspace_format.UNIT_OPS

    def frames(self) -> Iterator[Frame]:
        for m in self.keyspace.dump():
            op, parts = keyspace_format.encode(m)
            yield Frame(op, parts)

    def apply_frame(self, op: int, payload: Buffer) -> None:
        self.keyspace.apply(keyspace_format.decode(op, payload))

    def attach(self, sink: FrameSink | None) -> None:
        self.keyspace.journal = None if sink is None else KeyspaceJournal(sink)

    def held_bytes(self) -> int:
        return self.keyspace.used_bytes

    def units(self) -> int:
        return len(self.keyspace)
