"""Read-only values the V-store hands out: session layouts and block-hash tables.

They are snapshots taken at the call: later writes do not change them (arrays are
read-only copies or views the store will not write through; see ``layer.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pion.wire import namespace_for, namespace_sids

__all__ = ["COMPILED", "BlockTable", "LayerInfo", "SessionInfo", "namespace_of"]

# The membership bitmap's compiled twin (_speedups.c), built when a C compiler was
# present at install. It reads u64s in the host's byte order, so it serves only where
# that is the wire's little-endian order.
_member_bits: Callable[[memoryview, bytes | memoryview, memoryview, int], bytes] | None
if TYPE_CHECKING:
    _member_bits = None
else:
    try:
        from pion.vstore._speedups import member_bits as _member_bits
    except ImportError:  # no compiler at install time: numpy serves
        _member_bits = None
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI host
        _member_bits = None
COMPILED = _member_bits is not None
# The largest block-table index: 2**20 entries, one per hash at MAX_HASH_COUNT.
_INDEX_BITS = 20


def namespace_of(sid: bytes) -> tuple[bytes, ...]:
    """The eviction group of ``sid``: a ``<ns>_pk``/``<ns>_pv`` sid belongs to
    namespace ``ns`` with both halves; any other sid stands alone. Returned as the sids
    of the group, whether or not they exist."""
    ns = namespace_for(sid)
    return (sid,) if ns is None else namespace_sids(ns)


@dataclass(frozen=True, slots=True)
class LayerInfo:
    index: int
    dim: int
    fmt: str
    format_id: int
    row_bytes: int
    tpl: int  # row high-water mark: the largest start+count stored
    held: int  # rows the layer holds (holes below tpl are not held: they cost nothing)
    rope: int = 0  # bf16_rope_fp8_body's bf16 prefix length; 0 for other formats


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The layout and fill of one session.

    ``default_dim``/``default_fmt``: what V.CREATE gave (a SCHEMA session reports its
    ``default_dim``, 0 when none, and the format of layer 0). ``num_layers``: a uniform
    session's highest created layer + 1 (layers appear on first store), a SCHEMA
    session's N. ``layers``: the existing layers in index order.
    """

    sid: bytes
    slot: int
    default_dim: int
    default_fmt: str
    schema: tuple[tuple[str, int], ...] | None
    num_layers: int
    layers: tuple[LayerInfo, ...]

    @property
    def total_tokens(self) -> int:
        """Sum of ``tpl`` over the layers (Pion's definition: rows held, all layers)."""
        return sum(layer.tpl for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Stored-format bytes held (rows in holes are not held)."""
        return sum(layer.held * layer.row_bytes for layer in self.layers)

    @property
    def heterogeneous(self) -> bool:
        """Pion's rule: some layer's dim or format differs from the session default."""
        return any(
            layer.dim != self.default_dim or layer.fmt != self.default_fmt for layer in self.layers
        )

    def layer(self, index: int) -> LayerInfo | None:
        for info in self.layers:
            if info.index == index:
                return info
        return None


@dataclass(frozen=True, slots=True)
class BlockTable:
    """A session's block-hash table: ``hashes`` in token order, a ``sorted`` copy for
    membership tests (``np.searchsorted``), and an ``index`` of the sorted copy by a
    hash's top ``64 - shift`` bits (``index[b]``: how many sorted hashes are below
    ``b << shift``; the last entry is the count), which the compiled membership test
    uses. All are read-only arrays (``<u8``, the index ``<u4``)."""

    block_size: int
    hashes: npt.NDArray[np.uint64]
    sorted: npt.NDArray[np.uint64]
    index: npt.NDArray[np.uint32]
    shift: int

    @classmethod
    def build(cls, block_size: int, hashes: npt.NDArray[np.uint64]) -> BlockTable:
        ordered = np.array(hashes, dtype="<u8", copy=True)
        ordered.flags.writeable = False
        ranked = np.sort(ordered)
        ranked.flags.writeable = False
        # About one hash per index entry (hashes are uniform), at most 2**20 entries
        # (MAX_HASH_COUNT): the index costs 4 bytes per hash, a third of the table.
        bits = min(_INDEX_BITS, max(1, (len(ranked) - 1).bit_length()))
        shift = 64 - bits
        bounds = np.arange(1 << bits, dtype=np.uint64) << np.uint64(shift)
        index = np.empty((1 << bits) + 1, dtype="<u4")
        index[:-1] = ranked.searchsorted(bounds)
        index[-1] = len(ranked)
        index.flags.writeable = False
        return cls(block_size, ordered, ranked, index, shift)

    @property
    def count(self) -> int:
        return int(self.hashes.shape[0])

    def contains(self, probes: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Membership of each probe, O(K log N): binary search in the sorted copy, then
        one gather and compare (clamping with ``minimum`` rather than a masked store:
        this runs on every router probe)."""
        probes = np.asarray(probes, dtype="<u8")
        if self.count == 0:
            return np.zeros(probes.shape, dtype=bool)
        pos = self.sorted.searchsorted(probes)
        np.minimum(pos, self.count - 1, out=pos)
        hit: npt.NDArray[np.bool_] = self.sorted.take(pos) == probes
        return hit

    def member_bits(self, probes: bytes | memoryview) -> bytes:
        """KV.PREFIX.MEMBERSHIP's bitmap of ``probes`` (``8 * K`` bytes of ``<u8``):
        ``ceil(K / 8)`` bytes, bit i (byte ``i >> 3``, bit ``i & 7``, least significant
        first) set iff probe i is in the table. The compiled twin when built (through
        the index: a few times faster at router sizes), else :meth:`contains` and
        ``packbits``; the tests hold the two to the same answers."""
        if _member_bits is not None:
            return _member_bits(self.sorted.data, probes, self.index.data, self.shift)
        hits = self.contains(np.frombuffer(probes, dtype="<u8"))
        return np.packbits(hits, bitorder="little").tobytes()
