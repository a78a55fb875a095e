"""The tier's key layout (format version 1) and the split of row ranges into chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from pion.errors import PionError
from pion.tier.keys import BLOCKS_PER_LAYER, CHUNK_ROWS, MAX_ROWS, KeyLayout, chunks_of


def test_names_carry_prefix_version_and_hex_sids() -> None:
    k = KeyLayout("pion")
    assert k.meta(b"ns_pk") == "pion:v1:{6e73}:m:6e735f706b"
    assert k.written(b"ns_pv") == "pion:v1:{6e73}:w:6e735f7076"
    assert k.blocks(b"ns_pk") == "pion:v1:{6e73}:b:6e735f706b"
    assert k.tombstone(b"lone") == "pion:v1:{6c6f6e65}:x:6c6f6e65"
    assert k.chunk(b"ns_pk", "00ff" * 4, 3, 7) == "pion:v1:r:6e735f706b:00ff00ff00ff00ff:3:7"
    assert k.bit(2, 5) == 2 * BLOCKS_PER_LAYER + 5


def test_both_halves_share_a_slot_and_odd_sids_stay_unambiguous() -> None:
    k = KeyLayout("p")
    ns = b"a{b}c:d\x00\xff"
    pk, pv = ns + b"_pk", ns + b"_pv"
    assert key_slot(k.meta(pk).encode()) == key_slot(k.meta(pv).encode())
    assert key_slot(k.meta(pk).encode()) == key_slot(k.tombstone(pv).encode())
    assert len({k.meta(pk), k.meta(pv), k.meta(b"a{b}c:d"), k.written(pk)}) == 4
    assert "{" not in k.chunk(pk, "0" * 16, 0, 0)  # rows spread over the cluster


@pytest.mark.parametrize("bad", ["", "a:b", "a{b", "x}", "has space", "é", "p" * 65])
def test_prefixes_that_would_break_the_layout_are_refused(bad: str) -> None:
    with pytest.raises(PionError, match="tier prefix"):
        KeyLayout(bad)


def test_chunks_split_at_block_boundaries() -> None:
    assert [(c.block, c.start, c.count, c.lo, c.hi) for c in chunks_of(250, 300)] == [
        (0, 250, 6, 0, 6),
        (1, 256, 256, 6, 262),
        (2, 512, 38, 262, 300),
    ]
    assert len(chunks_of(0, CHUNK_ROWS)) == 1
    assert MAX_ROWS == BLOCKS_PER_LAYER * CHUNK_ROWS


@given(st.integers(0, 10_000), st.integers(1, 5_000))
def test_chunks_cover_the_range_exactly(start: int, count: int) -> None:
    pieces = chunks_of(start, count)
    assert pieces[0].lo == 0 and pieces[-1].hi == count
    for prev, nxt in itertools.pairwise(pieces):
        assert prev.hi == nxt.lo and prev.start + prev.count == nxt.start
    for c in pieces:
        assert c.block * CHUNK_ROWS <= c.start < (c.block + 1) * CHUNK_ROWS
        assert c.start + c.count <= (c.block + 1) * CHUNK_ROWS
