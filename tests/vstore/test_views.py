"""Block tables: the membership bitmap, compiled twin (when built) and numpy, against
``numpy.isin`` and against each other, on random, duplicate-heavy and edge input."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.vstore import views
from pion.vstore.views import BlockTable


def expected_bits(table: list[int], probes: list[int]) -> bytes:
    hits = np.isin(np.array(probes, dtype="<u8"), np.array(table, dtype="<u8"))
    return np.packbits(hits, bitorder="little").tobytes()


@pytest.fixture(params=["numpy"] + (["compiled"] if views.COMPILED else []))
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setattr(views, "_member_bits", None)
    return str(request.param)


u64 = st.integers(0, 2**64 - 1)
# Small values collide often: duplicates in the table, probes equal to its ends.
small = st.integers(0, 12)


@settings(max_examples=300)
@given(st.lists(st.one_of(u64, small), max_size=70), st.lists(st.one_of(u64, small), max_size=70))
def test_member_bits_matches_isin(table: list[int], probes: list[int]) -> None:
    for member_bits in [None] + ([views._member_bits] if views.COMPILED else []):
        saved = views._member_bits
        views._member_bits = member_bits
        try:
            got = BlockTable.build(64, np.array(table, dtype="<u8")).member_bits(
                np.array(probes, dtype="<u8").tobytes()
            )
        finally:
            views._member_bits = saved
        assert got == expected_bits(table, probes)


def test_member_bits_edges(twin: str) -> None:
    top = 2**64 - 1
    table = BlockTable.build(64, np.array([0, 5, 5, top], dtype="<u8"))
    probes = np.array([0, 1, 5, top, top - 1, 4, 6, 0, 5], dtype="<u8")
    # bit i = probe i, least significant first; 9 probes -> 2 bytes
    assert table.member_bits(probes.tobytes()) == bytes([0b10001101, 0b00000001])
    empty = BlockTable.build(64, np.zeros(0, dtype="<u8"))
    assert empty.member_bits(probes.tobytes()) == b"\x00\x00"
    assert table.member_bits(b"") == b""


def test_member_bits_router_sized(twin: str) -> None:
    """K = N = 1,562 (100k tokens at block size 64): half the probes are the table's
    own prefix, half are not in it."""
    rng = np.random.default_rng(7)
    hashes = rng.integers(0, 2**63, size=1562, dtype=np.uint64).astype("<u8")
    probes = np.concatenate([hashes[:781], rng.integers(2**63, 2**64 - 1, 781, dtype=np.uint64)])
    table = BlockTable.build(64, hashes)
    bits = table.member_bits(probes.astype("<u8").tobytes())
    assert bits == expected_bits(hashes.tolist(), probes.tolist())
    unpacked = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")[:1562]
    assert unpacked[:781].all() and not unpacked[781:].any()


def test_index_maps_top_bits_to_the_sorted_copy() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 1000, 1562, 5000):
        table = BlockTable.build(64, rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64))
        entries = len(table.index) - 1
        assert entries == 1 << (64 - table.shift)
        assert entries <= max(2, 2 * n)  # about one hash per entry
        assert table.index[-1] == n
        assert np.all(np.diff(table.index.astype(np.int64)) >= 0)
        top = (table.sorted >> np.uint64(table.shift)).astype(np.int64)
        for b in (0, entries // 2, entries - 1):
            inside = table.sorted[table.index[b] : table.index[b + 1]]
            assert np.all(top[table.index[b] : table.index[b + 1]] == b), inside


def test_crowded_entries_still_answer_exactly(twin: str) -> None:
    """A hostile table whose hashes all share their top bits (one index entry holds
    them all): bisection within the entry keeps it exact (and O(log N))."""
    hashes = np.arange(0, 20_000, 3, dtype="<u8")
    probes = np.arange(0, 20_010, dtype="<u8")
    table = BlockTable.build(64, hashes)
    assert table.member_bits(probes.tobytes()) == expected_bits(hashes.tolist(), probes.tolist())


def test_compiled_member_bits_refuses_inconsistent_input() -> None:
    if not views.COMPILED:
        # Without the compiled twin the numpy path is the one in use; it reads the
        # probes with frombuffer, which refuses the same input.
        with pytest.raises(ValueError):
            BlockTable.build(64, np.zeros(1, dtype="<u8")).member_bits(b"1234567")
        return
    member_bits = views._member_bits
    assert member_bits is not None
    table = BlockTable.build(64, np.array([1, 2, 3], dtype="<u8"))
    good = table.sorted.data, table.index.data, table.shift
    with pytest.raises(ValueError, match="whole"):
        member_bits(good[0], b"1234567", good[1], good[2])
    with pytest.raises(ValueError, match="does not match shift"):
        member_bits(good[0], b"", good[1], good[2] - 1)
    with pytest.raises(ValueError, match="does not match the table"):
        member_bits(memoryview(b"\0" * 16), b"", good[1], good[2])


def test_compiled_twin_is_built_where_required() -> None:
    """`make test` builds the compiled twins and sets PION_REQUIRE_SPEEDUPS."""
    if os.environ.get("PION_REQUIRE_SPEEDUPS") == "1":
        assert views.COMPILED, "pion.vstore._speedups is not built: run scripts/build-speedups"
