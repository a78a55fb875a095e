"""The V-store as a :class:`~pion.persistence.stores.DurableStore`: its mutations
become records of op codes 1..15 (``format.py``), its snapshot is
``pion.vstore.<w>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO

from pion.persistence.format import Buffer
from pion.persistence.snapshot import VSTORE_UNIT_OPS, run_hints, vstore_frames
from pion.persistence.stores import Frame, FrameSink
from pion.persistence.vstore_format import OPS, decode_mutation, op_of, vstore_payload
from pion.vstore import DropSession, Mutation, StoreRows, VStore

__all__ = ["VStoreDurable", "VStoreJournal", "vstore_frame"]


def vstore_frame(m: Mutation) -> Frame:
    """The record of one V-store mutation (bulk data as a view). A client's
    ``KV.PREFIX.DROP`` is marked a drop; an eviction is not: a blocked log refuses it
    like the write that needed the room, so a refused ``V.CREATE`` never evicts."""
    drop = isinstance(m, DropSession) and m.reason == "drop"
    return Frame(op_of(m), vstore_payload(m), drop)


class VStoreJournal:
    """The V-store's :class:`~pion.vstore.Journal`: each mutation as a record to a sink."""

    __slots__ = ("sink",)

    def __init__(self, sink: FrameSink) -> None:
        self.sink = sink

    def append(self, mutation: Mutation) -> None:
        self.sink.append_frame(vstore_frame(mutation))


class VStoreDurable:
    """Adapter from :class:`~pion.vstore.VStore` to the durable-store protocol (and
    :class:`~pion.persistence.stores.SizesSnapshots`)."""

    name = "vstore"

    def __init__(self, store: VStore) -> None:
        self.store = store

    @property
    def ops(self) -> Mapping[int, str]:
        return OPS

    @property
    def unit_ops(self) -> frozenset[int]:
        return VSTORE_UNIT_OPS

    def frames(self) -> Iterator[Frame]:
        return vstore_frames(self.store)

    def apply_frame(self, op: int, payload: Buffer) -> None:
        self.store.apply(decode_mutation(op, payload))

    def snapshot_applier(self, f: BinaryIO, size: int) -> Callable[[int, Buffer], None]:
        """Apply a snapshot's records, reserving each run stored in several pieces at
        its full size when its first (highest) piece arrives (``snapshot.run_hints``),
        so a sparse layer's runs are each allocated once and its holes never are."""
        hints = run_hints(f, size)

        def apply(op: int, payload: Buffer) -> None:
            m = decode_mutation(op, payload)
            if isinstance(m, StoreRows):
                end = m.start + m.count
                first = hints.pop((m.sid, m.layer, end), None)
                if first is not None:
                    self.store.reserve(m.sid, m.layer, first, end)
            self.store.apply(m)

        return apply

    def attach(self, sink: FrameSink | None) -> None:
        self.store.journal = None if sink is None else VStoreJournal(sink)

    def held_bytes(self) -> int:
        return self.store.vstore_bytes

    def units(self) -> int:
        return len(self.store)
