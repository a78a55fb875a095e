"""The journal hook: record order, a failing append leaves no trace, and replay through
apply() (of the journal, or of dump()) rebuilds the same state."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from pion.codecs import get_codec
from pion.errors import MisconfError, PionError, SessionNotFoundError
from pion.vstore import CreateSession, DropSession, SetBlocks, StoreRows, VStore
from support import FailingJournal, RecordingJournal, durable_state, make_store, rows


def test_records_carry_stored_bytes() -> None:
    journal = RecordingJournal()
    vs = make_store(journal=journal)
    vs.create(b"u", 8, "int8")
    vs.create_schema(b"s", 0, [("fp16", 4), ("turbo2", 128)])
    x = rows(3, 8)
    vs.store(b"u", 2, 1, x)
    vs.set_blocks(b"u", 32, np.array([5, 1], dtype=np.uint64))
    vs.create(b"u", 8, "int8")  # idempotent: no record
    vs.drop(b"s")
    vs.drop(b"s")  # absent: no record
    codec = get_codec("int8")
    assert journal.records == [
        CreateSession(b"u", 8, "int8", None),
        CreateSession(b"s", 0, "fp16", (("fp16", 4), ("turbo2", 128))),
        StoreRows(b"u", 2, 1, 3, codec.format_id, 8, codec.encode(x).tobytes()),
        SetBlocks(b"u", 32, np.array([5, 1], dtype="<u8").tobytes()),
        DropSession(b"s", "drop"),
    ]


def _populated() -> VStore:
    vs = make_store(max_sessions=4, maxmemory=10_000)
    vs.create(b"a_pk", 8, "fp16")
    vs.create(b"a_pv", 8, "fp16")
    vs.create(b"b", 8, "int8")
    vs.store(b"a_pk", 0, 0, rows(100, 8))
    vs.store(b"b", 0, 0, rows(100, 8))
    vs.set_blocks(b"a_pk", 4, np.arange(3, dtype=np.uint64))
    return vs


MUTATIONS: dict[str, Callable[[VStore], object]] = {
    "create": lambda vs: vs.create(b"new", 8, "fp16"),
    "create_evicting": lambda vs: (vs.create(b"c", 8, "fp16"), vs.create(b"d", 8, "fp16")),
    "create_schema": lambda vs: vs.create_schema(b"sch", 0, [("fp8", 8)]),
    "store": lambda vs: vs.store(b"a_pv", 1, 0, rows(10, 8)),
    "store_f16": lambda vs: vs.store(b"a_pv", 0, 0, rows(10, 8).astype("<f2")),
    "store_evicting": lambda vs: vs.store(b"a_pv", 0, 0, rows(400, 8)),
    "drop": lambda vs: vs.drop(b"b"),
    "set_blocks": lambda vs: vs.set_blocks(b"a_pk", 8, np.arange(9, dtype=np.uint64)),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_failing_journal_leaves_state_untouched(name: str) -> None:
    vs = _populated()
    if name == "create_evicting":
        vs.create(b"c", 8, "fp16")  # full now: the next create must evict
    before = durable_state(vs)
    evictions = vs.evictions
    journal = FailingJournal()
    vs.journal = journal
    with pytest.raises(MisconfError):
        MUTATIONS[name](vs)
    assert journal.calls == 1
    assert durable_state(vs) == before
    assert vs.evictions == evictions


def test_a_failure_after_evictions_keeps_log_and_memory_in_step() -> None:
    vs = _populated()

    class FailOnStore(RecordingJournal):
        def append(self, mutation: object) -> None:
            if isinstance(mutation, StoreRows):
                raise MisconfError("disk full")
            super().append(mutation)  # type: ignore[arg-type]

    journal = FailOnStore()
    vs.journal = journal
    with pytest.raises(MisconfError):
        vs.store(b"a_pv", 0, 0, rows(400, 8))
    # The eviction of b was logged, so it is applied; the store is not.
    assert journal.records == [DropSession(b"b", "evict")]
    assert b"b" not in vs and vs.describe(b"a_pv").layers == ()


def _workload(vs: VStore) -> None:
    vs.create(b"ns1_pk", 16, "fp16")
    vs.create(b"ns1_pv", 16, "turbo4")
    vs.create_schema(b"sch", 0, [("int8", 16), ("mlx4g32", 64), ("fp8", 16)])
    vs.store(b"ns1_pk", 0, 0, rows(50, 16, seed=1))
    vs.store(b"ns1_pv", 0, 0, rows(50, 16, seed=2))
    vs.store(b"ns1_pk", 3, 10, rows(5, 16, seed=3).astype("<f2"))
    vs.store(b"sch", 1, 4, rows(7, 64, seed=4))
    vs.store(b"sch", 1, 0, rows(2, 64, seed=5))  # overwrite inside tpl
    vs.set_blocks(b"ns1_pk", 16, np.array([7, 7, 1], dtype=np.uint64))
    vs.create(b"tmp", 16, "int8")
    vs.store(b"tmp", 0, 0, rows(3, 16, seed=6))
    vs.drop(b"tmp")
    for i in range(4):  # pushes past max_sessions: LRU evictions are journaled
        vs.create(b"e%d" % i, 16, "fp16")
        vs.store(b"e%d" % i, 0, 0, rows(20, 16, seed=10 + i))
    vs.store(b"e3", 0, 20, rows(100, 16, seed=20))  # past maxmemory: budget evictions


def test_replaying_the_journal_rebuilds_the_same_state() -> None:
    journal = RecordingJournal()
    live = make_store(max_sessions=5, maxmemory=8_000, journal=journal)
    _workload(live)
    assert live.evictions > 0
    assert any(isinstance(m, DropSession) and m.reason == "evict" for m in journal.records)
    replayed = make_store(max_sessions=5, maxmemory=8_000)
    for m in journal.records:
        replayed.apply(m)
    assert durable_state(replayed) == durable_state(live)
    assert replayed.sids() == live.sids()  # LRU order too
    assert replayed.evictions == 0  # counters are per process, not replayed


def test_dump_then_apply_is_a_snapshot_round_trip() -> None:
    live = make_store(max_sessions=5, maxmemory=8_000)
    _workload(live)
    restored = make_store()
    for m in live.dump():
        restored.apply(m)
    assert durable_state(restored) == durable_state(live)
    assert restored.sids() == live.sids()
    for sid in live.sids():
        for layer in live.describe(sid, touch=False).layers:
            a = live.fetch_range(sid, layer.index, 0, layer.tpl)
            b = restored.fetch_range(sid, layer.index, 0, layer.tpl)
            assert a is not None and b is not None
            np.testing.assert_array_equal(a, b)


def test_apply_refuses_records_that_do_not_fit() -> None:
    vs = make_store()
    with pytest.raises(SessionNotFoundError):
        vs.apply(StoreRows(b"x", 0, 0, 1, 5, 4, bytes(8)))
    vs.apply(CreateSession(b"x", 4, "fp16"))
    vs.apply(CreateSession(b"x", 8, "int8"))  # already there: kept as is
    fmt_id = get_codec("fp16").format_id
    with pytest.raises(PionError, match="does not match layer 0"):
        vs.apply(StoreRows(b"x", 0, 0, 1, get_codec("int8").format_id, 4, bytes(8)))
    with pytest.raises(PionError, match="payload of 7 bytes for 1 rows"):
        vs.apply(StoreRows(b"x", 0, 0, 1, fmt_id, 4, bytes(7)))
    with pytest.raises(PionError, match="unknown format"):
        vs.apply(CreateSession(b"y", 4, "bogus"))
    vs.apply(StoreRows(b"x", 0, 2, 1, fmt_id, 4, np.ones(4, "<f2").tobytes()))
    got = vs.fetch_range(b"x", 0, 0, 3)
    assert got is not None and got[2].tolist() == [1.0] * 4 and not got[:2].any()
    vs.apply(DropSession(b"x", "evict"))
    vs.apply(DropSession(b"x", "evict"))  # idempotent
    assert len(vs) == 0 and vs.vstore_bytes == 0
