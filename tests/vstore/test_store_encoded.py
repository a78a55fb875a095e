"""VStore.store_encoded: rows already in the stored format (the cluster tier's fill)
are stored bit-exact, journaled like any store, and bounded like any store."""

from __future__ import annotations

import numpy as np
import pytest

from pion.codecs import FORMAT_NAMES, get_codec
from pion.errors import OOMError, PionError, SessionNotFoundError
from pion.vstore import StoreRows
from support import RecordingJournal, make_store, rows


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stored_bytes_go_in_and_come_out_unchanged(fmt: str) -> None:
    codec = get_codec(fmt)
    encoded = codec.encode(rows(40, 96, 5))
    journal = RecordingJournal()
    vs = make_store(journal=journal)
    vs.create(b"s", 96, fmt)
    vs.store_encoded(b"s", 2, 10, encoded)
    (record,) = [m for m in journal.records if isinstance(m, StoreRows)]
    assert (record.layer, record.start, record.count) == (2, 10, 40)
    assert record.format_id == codec.format_id and bytes(record.data) == encoded.tobytes()
    (dumped,) = [m for m in vs.dump() if isinstance(m, StoreRows)]
    skip = (10 - dumped.start) * encoded.shape[1]  # a snapshot may write the hole too
    assert bytes(dumped.data)[skip:] == encoded.tobytes()
    got = vs.fetch_range(b"s", 2, 10, 50)
    np.testing.assert_array_equal(got, codec.decode(encoded, 96))
    assert vs.describe(b"s").layer(2).tpl == 50  # type: ignore[union-attr]


def test_bad_encoded_rows_are_refused_before_anything_changes() -> None:
    journal = RecordingJournal()
    vs = make_store(journal=journal)
    vs.create(b"s", 8, "int8")
    width = get_codec("int8").row_bytes(8)
    with pytest.raises(SessionNotFoundError):
        vs.store_encoded(b"nope", 0, 0, np.zeros((1, width), np.uint8))
    for bad in (
        np.zeros((1, width + 1), np.uint8),
        np.zeros((1, width), np.int8),
        np.zeros((0, width), np.uint8),
        np.zeros(width, np.uint8),
    ):
        with pytest.raises(PionError):
            vs.store_encoded(b"s", 0, 0, bad)  # type: ignore[arg-type]
    with pytest.raises(PionError, match="rows out of range"):
        vs.store_encoded(b"s", 0, 200_000, np.zeros((1, width), np.uint8))
    assert len(journal.records) == 1 and vs.vstore_bytes == 0


def test_the_byte_budget_evicts_or_refuses_as_for_any_store() -> None:
    width = get_codec("fp16").row_bytes(64)
    vs = make_store(maxmemory=100 * width)
    vs.create(b"old", 64, "fp16")
    vs.store_encoded(b"old", 0, 0, np.ones((60, width), np.uint8))
    vs.create(b"new", 64, "fp16")
    vs.store_encoded(b"new", 0, 0, np.ones((60, width), np.uint8))
    assert b"old" not in vs and vs.evictions == 1
    with pytest.raises(OOMError):
        vs.store_encoded(b"new", 0, 60, np.ones((101, width), np.uint8))


def test_adopted_rows_become_the_run_without_a_copy() -> None:
    codec = get_codec("fp16")
    received = np.ascontiguousarray(codec.encode(rows(64, 96, 7)))
    vs = make_store()
    vs.create(b"s", 96, "fp16")
    vs.store_encoded(b"s", 0, 0, received[:40], adopt=True)  # a run of its own: adopted
    native = vs.fetch_range(b"s", 0, 0, 40, native=True)
    assert native is not None and np.shares_memory(native, received)
    copy = received[40:].copy()
    vs.store_encoded(b"s", 0, 40, received[40:], adopt=True)  # extends the run: copied
    np.testing.assert_array_equal(
        vs.fetch_range(b"s", 0, 0, 64), codec.decode(np.concatenate([received[:40], copy]), 96)
    )
    vs.store_encoded(b"s", 1, 0, received[:8])  # not adopted unless asked
    layer1 = vs.fetch_range(b"s", 1, 0, 8, native=True)
    assert layer1 is not None and not np.shares_memory(layer1, received)


def test_hit_pair_touches_both_halves_or_neither() -> None:
    vs = make_store()
    for sid in (b"k", b"v", b"other"):
        vs.create(sid, 96, "fp16")
    vs.store(b"k", 0, 0, rows(12, 96, 1))
    vs.touch(b"other")
    assert vs.hit_pair(b"k", b"missing") is None
    assert vs.sids()[-1] == b"other"  # nothing touched
    assert vs.hit_pair(b"k", b"v") == 12
    assert vs.sids()[-2:] == [b"k", b"v"]  # k, then v: most recent last
