"""Planning a fill from what the tier holds: which chunks to read, and what makes a copy
incomplete (a block the bitmap promises is gone) or malformed."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pion.tier.fill import ChunkRef, TierIncomplete, held_rows, plan_fill
from pion.tier.keys import CHUNK_ROWS, KeyLayout
from pion.tier.meta import Layout, TierFormatError, TierMeta
from pion.tier.remote import MAX_HASH_COUNT, decode_blocks
from pion.tier.rowread import ABSENT

KEYS = KeyLayout("p")
GEN = "0123456789abcdef"


def _bitmap(*bits: int) -> bytes:
    out = bytearray(max(bits) // 8 + 1)
    for bit in bits:
        out[bit // 8] |= 0x80 >> (bit % 8)  # SETBIT order: bit 0 is the MSB
    return bytes(out)


def test_the_chunks_the_bitmap_marks_written_are_read() -> None:
    meta = TierMeta(b"s", GEN, Layout(16, "fp16", None), {0: 600, 1: 10})
    plan = plan_fill(KEYS, meta, _bitmap(0, 2, KEYS.bit(1, 0)), None)
    got = [(c.layer, c.block, c.rows, c.last) for c in plan.chunks]
    assert got == [(0, 0, 256, False), (0, 2, 88, True), (1, 0, 10, True)]  # block 1: a hole
    assert plan.chunks[0].name == KEYS.chunk(b"s", GEN, 0, 0) and plan.blocks is None


def test_a_copy_without_its_last_block_is_incomplete() -> None:
    meta = TierMeta(b"s", GEN, Layout(16, "fp16", None), {0: 600})
    with pytest.raises(TierIncomplete, match="last row"):
        plan_fill(KEYS, meta, _bitmap(0, 1), None)
    with pytest.raises(TierIncomplete):
        plan_fill(KEYS, meta, b"", None)  # the bitmap itself was evicted


def test_chunk_bytes_are_checked_before_they_are_stored() -> None:
    ref = ChunkRef(b"s", "k", 0, 2, 88, True, 32)
    assert held_rows(ref, 32 * 90) == 88  # two rows more: a concurrent append
    with pytest.raises(TierIncomplete, match="gone"):
        held_rows(ref, ABSENT)
    with pytest.raises(TierIncomplete, match="ends before"):
        held_rows(ref, 32 * 87)
    with pytest.raises(TierFormatError, match="whole number"):
        held_rows(ref, 33)
    with pytest.raises(TierFormatError):
        held_rows(ref, 32 * (CHUNK_ROWS + 1))
    inner = ChunkRef(b"s", "k", 0, 0, 256, False, 32)
    assert held_rows(inner, 32 * 3) == 3


def test_block_tables_from_the_tier_are_bounded() -> None:
    table = decode_blocks(struct.pack("<I", 64) + np.arange(3, dtype="<u8").tobytes())
    assert table.block_size == 64 and len(table.hashes) == 24
    for raw in (b"", b"\0" * 3, struct.pack("<I", 64) + b"\0" * 7, struct.pack("<I", 0)):
        with pytest.raises(TierFormatError):
            decode_blocks(raw)
    with pytest.raises(TierFormatError, match="out of range"):
        decode_blocks(struct.pack("<I", 8193))
    with pytest.raises(TierFormatError, match="out of range"):
        decode_blocks(struct.pack("<I", 1) + b"\0" * 8 * (MAX_HASH_COUNT + 1))
