"""``pion.keyspace.hll`` as a unit: the dense packing, the sparse opcodes and their
promotion, the checks of a foreign value; and ``store_hll``'s records, which hold the
bytes that changed, not the 12 KB value. Byte-for-byte agreement with redis-server is
``tests/commands/test_hll_bitfield_lcs.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

from pion.commands.hll import store_hll
from pion.errors import WrongTypeError
from pion.keyspace import Keyspace
from pion.keyspace.hll import (
    DENSE_SIZE,
    REGISTERS,
    Hll,
    InvalidHllError,
    cached_count,
    estimate,
    pattern,
)
from pion.keyspace.mutations import KeyMutation, SetRange, SetString


def _dense(seed: int) -> Hll:
    h = Hll(None, 3000)
    h.promote()
    rng = np.random.default_rng(seed)
    registers = h.registers
    assert registers is not None
    registers[:] = rng.integers(0, 64, REGISTERS, dtype=np.uint8)
    return h


def test_dense_registers_pack_and_unpack_unchanged() -> None:
    h = _dense(1)
    value = h.encode()
    assert len(value) == DENSE_SIZE and value[:5] == b"HYLL\x00"
    again = Hll(value, 3000)
    assert again.registers is not None and h.registers is not None
    assert np.array_equal(again.registers, h.registers)
    assert again.encode() == value


def test_a_new_hll_is_one_xzero_and_grows_sparse_until_the_limit() -> None:
    h = Hll(None, 100)
    assert h.encode() == b"HYLL\x01" + bytes(11) + b"\x7f\xff"
    assert cached_count(h.encode()) == 0
    n = 0
    while not h.dense:
        h.add(b"%d" % n)
        n += 1
        if not h.dense:
            assert len(h.encode()) <= 100
    assert 5 < n < 100 and len(h.encode()) == DENSE_SIZE
    assert abs(estimate(h.histogram()) - n) <= 2


def test_pattern_counts_are_between_one_and_51() -> None:
    counts = [pattern(b"%d" % i)[1] for i in range(2000)]
    assert min(counts) == 1 and max(counts) <= 51
    assert all(0 <= pattern(b"%d" % i)[0] < REGISTERS for i in range(100))


@pytest.mark.parametrize(
    "value",
    [b"", b"hello", b"HYLL\x02" + bytes(13), b"HYLL\x00" + bytes(11) + bytes(10)],
)
def test_foreign_strings_are_not_hlls(value: bytes) -> None:
    with pytest.raises(WrongTypeError, match="not a valid HyperLogLog"):
        Hll(value, 3000)


def test_sparse_opcodes_must_cover_every_register() -> None:
    short = Hll(b"HYLL\x01" + bytes(11) + b"\x7f\xfe", 3000)  # 16383 registers
    with pytest.raises(InvalidHllError):
        short.histogram()
    with pytest.raises(InvalidHllError):
        short.set(REGISTERS - 1, 1)
    assert short.set(0, 3)  # inside the opcodes: served, as by Redis


class _Recorder:
    def __init__(self) -> None:
        self.records: list[KeyMutation] = []

    def append(self, m: KeyMutation) -> None:
        self.records.append(m)


def test_a_dense_change_is_logged_as_the_bytes_that_changed() -> None:
    ks = Keyspace()
    rec = _Recorder()
    ks.journal = rec
    h = _dense(2)
    old = h.encode()
    ks.set_string(b"k", old, 0)
    registers = h.registers
    assert registers is not None
    registers[5000] = 63
    h.invalidate()
    store_hll(ks, b"k", old, h.encode(), False)
    assert ks.string(b"k") == h.encode()
    ranges = [m for m in rec.records if isinstance(m, SetRange)]
    assert sum(len(m.data) for m in ranges) <= 8  # the stale bit and one register
    # Nothing differs: nothing is written, unless forced (PFMERGE), then the count.
    rec.records.clear()
    store_hll(ks, b"k", h.encode(), h.encode(), False)
    assert rec.records == []
    store_hll(ks, b"k", h.encode(), h.encode(), True)
    assert [(m.offset, len(m.data)) for m in rec.records if isinstance(m, SetRange)] == [(8, 8)]


def test_a_shorter_sparse_value_is_set_with_its_deadline() -> None:
    ks = Keyspace()
    rec = _Recorder()
    ks.journal = rec
    ks.set_string(b"k", b"HYLL\x01" + bytes(11) + b"\x80\x80\x7f\xfd", 10**15)
    store_hll(
        ks,
        b"k",
        b"HYLL\x01" + bytes(11) + b"\x80\x80\x7f\xfd",
        b"HYLL\x01" + bytes(11) + b"\x81\x7f\xfd",
        False,
    )
    assert isinstance(rec.records[-1], SetString) and rec.records[-1].deadline == 10**15
