"""The attention tier's slot tables: which ``(sid, layer)`` K/V are WARM, COLD or
MISSING (docs/attention.md).

==========  ===================================  ==================================
state       where it lives                       what a query gets
==========  ===================================  ==================================
WARM        a slot here: K and V [H,N,D]         the attention
COLD        the cold registry: (H, N, D) only;   ``-COLDMISS``; ``KV.PREFIX.WARM``
            the rows are in the V-store          rehydrates it from the V-store
MISSING     nowhere                              ``-ERR ... session not found``
==========  ===================================  ==================================

Two bounds hold the WARM table: a slot count (``--attend-slots``, 256 as in Pion) and,
when set, a byte budget on the K/V bytes held (``--attend-maxmemory``). A store that
would pass either demotes least-recently-used slots (by last access: every store and
query stamps its slot) to COLD until it fits; their arrays are released then. The COLD
registry holds metadata only and is bounded too (``--attend-cold-slots``, 1024 as in
Pion): past it the oldest demotion is forgotten and that slot becomes MISSING.

Counters (KV.PREFIX.INFO and INFO): ``warm``/``cold`` (entries now), ``demotions``
(WARM -> COLD, lifetime) and ``rehydrates`` (COLD -> WARM, lifetime, however the slot
came back: ``KV.PREFIX.WARM`` or a new ``ATTEND.PREFIX.STORE``).

A plain synchronous structure owned by the event loop thread, like the V-store.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from pion.errors import OOMError

__all__ = ["AttentionTables", "ColdEntry", "Key", "Slot", "SlotState"]

Key = tuple[bytes, int]
SlotState = Literal["warm", "cold", "missing"]
F32 = npt.NDArray[np.float32]
# What a slot holds: fp32, or fp16 rows held as the V-store stores them (queries widen
# them a key block at a time).
KV = npt.NDArray[np.float32] | npt.NDArray[np.float16]
SLOT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


@dataclass(slots=True)
class Slot:
    """One WARM ``(sid, layer)``: K and V ``[H, N, D]``, fp32 or fp16 (both the same),
    possibly read-only views (of the request's blobs after a STORE; of token-major
    ``[N, H*D]`` rows seen head-first after a WARM, fp16 ones the V-store's own).
    ``owners`` are the objects the views were derived from, kept alive with the slot
    (the V-store leases its rows on those objects: ``pion.attend.warm``)."""

    k: KV
    v: KV
    owners: tuple[object, ...] = ()

    @property
    def heads(self) -> int:
        return int(self.k.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.k.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.k.shape[2])

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


@dataclass(frozen=True, slots=True)
class ColdEntry:
    """What the cold registry keeps of a demoted slot: its shape, nothing else."""

    heads: int
    tokens: int
    head_dim: int


class AttentionTables:
    """The WARM table and the COLD registry of one worker; see the module docstring."""

    def __init__(self, warm_slots: int = 256, cold_slots: int = 1024, max_bytes: int = 0) -> None:
        self.warm_slots = warm_slots
        self.cold_slots = cold_slots
        self.max_bytes = max_bytes  # 0 = no byte budget
        # Least recently used first: a touch moves a slot to the end.
        self._warm: OrderedDict[Key, Slot] = OrderedDict()
        # Oldest demotion first: overflow forgets from the front.
        self._cold: OrderedDict[Key, ColdEntry] = OrderedDict()
        self.bytes = 0
        self.demotions = 0
        self.rehydrates = 0
        self.forgotten = 0  # cold entries dropped by the registry's bound

    # -- limits and counters ---------------------------------------------------------

    def set_limits(
        self,
        *,
        warm_slots: int | None = None,
        cold_slots: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """Change the bounds; the WARM table is brought within them at once."""
        if warm_slots is not None:
            self.warm_slots = warm_slots
        if cold_slots is not None:
            self.cold_slots = cold_slots
        if max_bytes is not None:
            self.max_bytes = max_bytes
        self._make_room(0, 0)
        while len(self._cold) > self.cold_slots:
            self._forget_oldest()

    @property
    def warm_count(self) -> int:
        return len(self._warm)

    @property
    def cold_count(self) -> int:
        return len(self._cold)

    def warm_keys(self) -> list[Key]:
        """WARM keys, least recently used first."""
        return list(self._warm)

    def cold_keys(self) -> list[Key]:
        """COLD keys, oldest demotion first."""
        return list(self._cold)

    # -- reads -----------------------------------------------------------------------

    def state(self, key: Key, *, touch: bool = False) -> SlotState:
        if key in self._warm:
            if touch:
                self._warm.move_to_end(key)
            return "warm"
        return "cold" if key in self._cold else "missing"

    def get(self, key: Key) -> Slot | None:
        """The WARM slot (stamped most recent), or None when COLD or MISSING."""
        slot = self._warm.get(key)
        if slot is not None:
            self._warm.move_to_end(key)
        return slot

    def cold_entry(self, key: Key) -> ColdEntry | None:
        return self._cold.get(key)

    # -- writes ----------------------------------------------------------------------

    def check_fits(self, nbytes: int) -> None:
        """Raise OOMError when one slot of ``nbytes`` can never fit the byte budget."""
        if self.max_bytes and nbytes > self.max_bytes:
            raise OOMError(
                f"command not allowed: {nbytes} bytes of K/V exceed attend-maxmemory "
                f"({self.max_bytes} bytes)"
            )

    def put(self, key: Key, k: KV, v: KV, owners: tuple[object, ...] = ()) -> None:
        """Make ``key`` WARM with ``k``/``v`` (replacing what it held), stamped most
        recent, demoting LRU slots first if a bound requires it. ``owners`` stay alive
        as long as the slot (see :class:`Slot`)."""
        if k.shape != v.shape or k.ndim != 3 or k.dtype != v.dtype or k.dtype not in SLOT_DTYPES:
            raise ValueError(
                f"k {k.shape} {k.dtype} and v {v.shape} {v.dtype} must agree, fp32 or fp16"
            )
        slot = Slot(k, v, owners)
        self.check_fits(slot.nbytes)
        old = self._warm.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        # Out of the cold registry first, so the demotions below cannot push it out.
        if self._cold.pop(key, None) is not None:
            self.rehydrates += 1
        self._make_room(1, slot.nbytes)
        self._warm[key] = slot
        self.bytes += slot.nbytes

    def drop(self, sid: bytes, layer: int | None = None) -> int:
        """Forget ``sid``'s layer (or every layer), WARM or COLD; how many entries."""
        keys = [
            key
            for table in (self._warm, self._cold)
            for key in table
            if key[0] == sid and (layer is None or key[1] == layer)
        ]
        for key in keys:
            slot = self._warm.pop(key, None)
            if slot is not None:
                self.bytes -= slot.nbytes
            self._cold.pop(key, None)
        return len(keys)

    # -- internals -------------------------------------------------------------------

    def _make_room(self, slots: int, nbytes: int) -> None:
        """Demote LRU slots until ``slots`` more slots of ``nbytes`` fit both bounds."""
        while self._warm and (
            len(self._warm) + slots > self.warm_slots
            or (self.max_bytes and self.bytes + nbytes > self.max_bytes)
        ):
            self._demote(next(iter(self._warm)))

    def _demote(self, key: Key) -> None:
        slot = self._warm.pop(key)
        self.bytes -= slot.nbytes
        self.demotions += 1
        self._cold[key] = ColdEntry(slot.heads, slot.tokens, slot.head_dim)
        self._cold.move_to_end(key)
        while len(self._cold) > self.cold_slots:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        self._cold.popitem(last=False)
        self.forgotten += 1
