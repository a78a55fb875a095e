"""The V-store as a :class:`~pion.persistence.stores.DurableStore`: its mutations
become records of op codes 1..15 (``format.py``), its snapshot is
``pion.vstore.<w>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pion.persistence.format import OPS, Buffer, decode_mutation, op_of, vstore_payload
from pion.persistence.snapshot import VSTORE_UNIT_OPS, vstore_frames
from pion.persistence.stores import Frame, FrameSink
from pion.vstore import Mutation, VStore

__all__ = ["VStoreDurable", "VStoreJournal"]


class VStoreJournal:
    """The V-store's :class:`~pion.vstore.Journal`: each mutation as a record to a sink."""

    __slots__ = ("sink",)

    def __init__(self, sink: FrameSink) -> None:
        self.sink = sink

    def append(self, mutation: Mutation) -> None:
        self.sink.append_frame(Frame(op_of(mutation), vstore_payload(mutation)))


class VStoreDurable:
    """Adapter from :class:`~pion.vstore.VStore` to the durable-store protocol."""

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

    def attach(self, sink: FrameSink | None) -> None:
        self.store.journal = None if sink is None else VStoreJournal(sink)

    def held_bytes(self) -> int:
        return self.store.vstore_bytes

    def units(self) -> int:
        return len(self.store)
