"""Where a V-store session lives in the tier: key names and the row-chunk geometry.

Format version 1. Every key starts with ``<prefix>:v1:``; ``<prefix>`` is
``--tier-prefix`` (default ``pion``) and may not contain ``{``, ``}`` or ``:``.
Session ids are arbitrary bytes, so they appear hex-encoded (``<sidhex>``, lower
case): unambiguous whatever the sid holds, and never an accidental hash tag.

=============================================  ========================================
key                                            value
=============================================  ========================================
``<p>:v1:{<tag>}:m:<sidhex>``                  hash: the session's *meta* (see
                                               ``meta.py``): layout, generation, per-
                                               layer row high-water marks ``t:<i>``
``<p>:v1:{<tag>}:w:<sidhex>``                  string used as a bitmap: bit
                                               ``layer * 4096 + block`` set once that
                                               row block has been written (SETBIT
                                               order: bit 0 is the MSB of byte 0)
``<p>:v1:{<tag>}:b:<sidhex>``                  string: the block-hash table,
                                               ``[u32 block_size LE][u64 LE ...]``
``<p>:v1:{<tag>}:x:<sidhex>``                  string: tombstone, the generation a
                                               DROP removed (expires after a day)
``<p>:v1:r:<sidhex>:<gen>:<layer>:<block>``    string: stored-format bytes of rows
                                               ``block*256 .. block*256+255`` of one
                                               layer, from the block's first row up
                                               to the last row written in it
=============================================  ========================================

``<tag>`` is the hex of the namespace for a ``<ns>_pk``/``<ns>_pv`` sid, else of the
sid: both halves of a namespace keep their metadata in one cluster slot, so one Lua
script can update a meta and its bitmap atomically and one round trip reads a
namespace's layout. Row chunks carry no tag on purpose: they spread over the whole
cluster, so a big prefix is read from every node at once.

A chunk holds at most :data:`CHUNK_ROWS` rows: at the widest row (8192 fp16 values,
16 KiB) that is 4 MiB, far below Redis's 512 MB ``proto-max-bulk-len``, and small
enough that no single value stalls a node. Chunks are written with ``SETRANGE`` at
``(row - block*256) * row_bytes``, so a partial write never reads back first and rows
never written inside a block read as zero bytes (which every format decodes to zeros).
``<gen>`` (16 hex digits, random per creation) keeps the chunks of a dropped and
re-created session apart from the new one's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pion.errors import PionError
from pion.wire import namespace_for

__all__ = [
    "BLOCKS_PER_LAYER",
    "CHUNK_ROWS",
    "FORMAT_VERSION",
    "MAX_LAYERS",
    "MAX_ROWS",
    "Chunk",
    "KeyLayout",
    "chunks_of",
]

FORMAT_VERSION = 1
CHUNK_ROWS = 256
# The written-blocks bitmap gives each layer a fixed span of bits; these bound a
# session the tier can hold (the V-store's defaults are 80 layers and 200000 rows).
BLOCKS_PER_LAYER = 4096
MAX_ROWS = BLOCKS_PER_LAYER * CHUNK_ROWS  # 1,048,576 rows per layer
MAX_LAYERS = 256
_MAX_PREFIX_LEN = 64


@dataclass(frozen=True, slots=True)
class Chunk:
    """The part of a row range that falls in one block: rows ``start .. start+count``
    (absolute), ``offset`` bytes into the block's key, ``lo .. hi`` rows into the
    range's own payload."""

    block: int
    start: int
    count: int
    lo: int
    hi: int


def chunks_of(start: int, count: int) -> list[Chunk]:
    """Split rows ``start .. start+count`` at block boundaries."""
    out: list[Chunk] = []
    row, end = start, start + count
    while row < end:
        block = row // CHUNK_ROWS
        stop = min(end, (block + 1) * CHUNK_ROWS)
        out.append(Chunk(block, row, stop - row, row - start, stop - start))
        row = stop
    return out


class KeyLayout:
    """Key names for one deployment prefix (see the module docstring)."""

    __slots__ = ("_base", "prefix")

    def __init__(self, prefix: str = "pion") -> None:
        if not 1 <= len(prefix) <= _MAX_PREFIX_LEN or not prefix.isascii():
            raise PionError(f"tier prefix must be 1..{_MAX_PREFIX_LEN} ASCII characters")
        if any(c in prefix for c in "{}:") or not prefix.isprintable() or " " in prefix:
            raise PionError("tier prefix may not contain '{', '}', ':' or spaces")
        self.prefix = prefix
        self._base = f"{prefix}:v{FORMAT_VERSION}:"

    def tag(self, sid: bytes) -> str:
        """The hash tag shared by a namespace's two halves (or by a lone sid)."""
        ns = namespace_for(sid)
        return (sid if ns is None else ns).hex()

    def _slot_key(self, sid: bytes, kind: str) -> str:
        return f"{self._base}{{{self.tag(sid)}}}:{kind}:{sid.hex()}"

    def meta(self, sid: bytes) -> str:
        return self._slot_key(sid, "m")

    def written(self, sid: bytes) -> str:
        return self._slot_key(sid, "w")

    def blocks(self, sid: bytes) -> str:
        return self._slot_key(sid, "b")

    def tombstone(self, sid: bytes) -> str:
        return self._slot_key(sid, "x")

    def chunk(self, sid: bytes, gen: str, layer: int, block: int) -> str:
        return f"{self._base}r:{sid.hex()}:{gen}:{layer}:{block}"

    @staticmethod
    def bit(layer: int, block: int) -> int:
        """The bitmap position of ``(layer, block)``."""
        return layer * BLOCKS_PER_LAYER + block
