"""Holes (rows never written) cost nothing, and a fetch cannot ask for a huge reply of
them: sparse runs, their accounting and snapshot form, and the zero-fill bound."""

from __future__ import annotations

import numpy as np
import pytest

import pion.vstore.reads as reads_module
from pion.config import VStoreLimits
from pion.errors import OOMError, PionError
from pion.vstore import MAX_RUNS, MAX_ZERO_FILL_BYTES, StoreRows
from support import RecordingJournal, check_layers, make_store, rows


def test_a_row_far_past_the_end_costs_one_row() -> None:
    """The issue's reproduction: one row at 199,999 of a 1024-wide fp16 layer."""
    vs = make_store()
    journal = RecordingJournal()
    vs.journal = journal
    vs.create(b"s", 1024, "fp16")
    x = rows(1, 1024)
    vs.store(b"s", 0, 199_999, x)
    info = vs.describe(b"s").layers[0]
    assert (info.tpl, info.held) == (200_000, 1)
    assert vs.vstore_bytes == vs.bytes_allocated == 2048
    assert vs.total_tokens == 200_000  # Pion's definition: the sum of tpl
    # The log record and the snapshot form hold the one row, nothing of the hole.
    (record,) = [m for m in journal.records if isinstance(m, StoreRows)]
    assert (record.start, record.count, len(record.data)) == (199_999, 1, 2048)
    (dumped,) = [m for m in vs.dump() if isinstance(m, StoreRows)]
    assert (dumped.start, dumped.count, len(dumped.data)) == (199_999, 1, 2048)
    got = vs.fetch_range(b"s", 0, 199_990, 200_000, native=True)
    assert got is not None and not got[:9].any()
    np.testing.assert_array_equal(got[9], x[0].astype("<f2"))


def test_runs_merge_when_the_rows_between_them_are_written() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    vs.store(b"s", 0, 0, rows(10, 8, 1))
    vs.store(b"s", 0, 100, rows(10, 8, 2))
    vs.store(b"s", 0, 50, rows(5, 8, 3))
    lay = vs._sessions[b"s"].layers[0]
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10), (50, 55), (100, 110)]
    assert lay.held == 25 and vs.vstore_bytes == 25 * lay.row_bytes
    whole = vs.fetch_range(b"s", 0, 0, 110)
    assert whole is not None and not whole[10:50].any() and not whole[55:100].any()
    vs.store(b"s", 0, 10, rows(90, 8, 4))  # bridges all three
    check_layers(vs)
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 110)]
    assert lay.held == 110 and vs.vstore_bytes == 110 * lay.row_bytes
    got = vs.fetch_range(b"s", 0, 100, 110)
    want = vs.fetch_range(b"s", 0, 0, 110)
    assert got is not None and want is not None
    np.testing.assert_array_equal(got, want[100:])
    ids = vs.fetch_ids(b"s", 0, [105, 3, 200])
    assert ids is not None
    np.testing.assert_array_equal(ids[:2], want[[105, 3]])
    assert not ids[2].any()


def test_the_budget_counts_held_rows_only() -> None:
    row = 8 * 2  # fp16, dim 8
    vs = make_store(maxmemory=10 * row)
    vs.create(b"a", 8, "fp16")
    vs.store(b"a", 0, 0, rows(4, 8))
    vs.store(b"a", 0, 150_000, rows(4, 8))  # a hole of ~150k rows needs no room
    assert vs.vstore_bytes == 8 * row
    with pytest.raises(OOMError, match="a write of 176 bytes is larger than maxmemory"):
        vs.store(b"a", 0, 1000, rows(11, 8))
    vs.store(b"a", 0, 2, rows(4, 8))  # overlaps 2 held rows: grows by 2
    assert vs.vstore_bytes == 10 * row


def test_too_many_runs_are_refused_before_anything_changes() -> None:
    vs = make_store()
    journal = RecordingJournal()
    vs.journal = journal
    vs.create(b"s", 4, "fp16")
    for i in range(MAX_RUNS):
        vs.store(b"s", 0, 10 * i, rows(1, 4))
    before = (vs.vstore_bytes, vs.total_tokens, len(journal.records))
    with pytest.raises(PionError, match=f"more than {MAX_RUNS} separate runs"):
        vs.store(b"s", 0, 10 * MAX_RUNS, rows(1, 4))
    assert (vs.vstore_bytes, vs.total_tokens, len(journal.records)) == before
    vs.store(b"s", 0, 1, rows(3, 4))  # extends a run: fine
    vs.store(b"s", 1, 500, rows(1, 4))  # another layer has its own runs


def test_zero_fill_is_bounded_by_the_rows_held() -> None:
    """The issue's reproduction: RANGE 0 32768 on a one-row 8192-wide session asked for
    1 GiB of zeros. Zero fill may match the held bytes, or 1 MiB, not more."""
    vs = make_store()
    vs.create(b"s", 8192, "fp16")
    vs.store(b"s", 0, 0, rows(1, 8192))
    with pytest.raises(PionError, match=r"rows 0\.\.32768 would reply 1073709056 bytes of zeros"):
        vs.fetch_range(b"s", 0, 0, 32768)
    with pytest.raises(PionError, match="zero fill is limited"):
        vs.fetch_batch(b"s", 0, 32768)
    with pytest.raises(PionError, match="zero fill is limited"):
        vs.fetch_range(b"s", 0, 0, 32768, native=True)
    # 1 MiB of zeros (32 fp32 rows of 8192) is always allowed.
    row32 = 8192 * 4
    got = vs.fetch_range(b"s", 0, 0, 1 + MAX_ZERO_FILL_BYTES // row32)
    assert got is not None and not got[1:].any()
    with pytest.raises(PionError, match="zero fill is limited"):
        vs.fetch_range(b"s", 0, 0, 2 + MAX_ZERO_FILL_BYTES // row32)
    assert vs.total_fetches == 1  # refused fetches count nothing


def test_zero_fill_may_match_the_held_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads_module, "MAX_ZERO_FILL_BYTES", 0)
    vs = make_store(limits=VStoreLimits(max_rows=1000))
    vs.create(b"s", 4, "fp16")
    vs.store(b"s", 0, 0, rows(5, 4))
    vs.store(b"s", 0, 20, rows(5, 4))
    # Rows 0..20: 5 held, 15 zeros; 0..10: 5 and 5; 15..25: 5 and 5; 0..30: 10 and 20.
    with pytest.raises(PionError, match="zero fill is limited"):
        vs.fetch_range(b"s", 0, 0, 20)
    assert vs.fetch_range(b"s", 0, 0, 10) is not None
    assert vs.fetch_range(b"s", 0, 15, 25) is not None
    with pytest.raises(PionError, match="zero fill is limited"):
        vs.fetch_range(b"s", 0, 0, 30)
    # BATCH sums over its layers; an absent layer is $-1 and pads nothing.
    vs.store(b"s", 1, 0, rows(2, 4))
    out = vs.fetch_batch(b"s", 0, 4, 3)
    assert out is not None and out[2] is None
