"""Rollback snapshots in the store (src/pion/vstore/rollback.py and VStore.snapshot /
restore / release): lengths, exact rows below them, zeroed rows above, accounting,
copy-on-write, the per-session limit, ids, journal records and replay."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pion.codecs import FORMAT_NAMES, get_codec
from pion.errors import MisconfError, PionError, SessionNotFoundError
from pion.vstore import (
    GROWTH,
    MAX_SNAPSHOTS_PER_SESSION,
    CreateSession,
    ReleaseSnapshot,
    RestoreSnapshot,
    SnapshotIds,
    TakeSnapshot,
    VStore,
)
from pion.vstore.layer import Layer
from support import FailingJournal, RecordingJournal, check_layers, make_store, rows
from support import durable_state as state_of


def tokens(vs: VStore, sid: bytes) -> dict[int, int]:
    return {layer.index: layer.tpl for layer in vs.describe(sid, touch=False).layers}


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_restore_keeps_rows_below_exactly_and_zeroes_rows_above(fmt: str) -> None:
    vs = make_store()
    vs.create(b"s", 96, fmt)
    accepted = rows(50, 96, seed=1)
    vs.store(b"s", 0, 0, accepted)
    before = vs.fetch_range(b"s", 0, 0, 50)
    assert before is not None
    before = before.copy()
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 50, rows(30, 96, seed=2) * 40)  # a rejected branch, larger values
    vs.restore(b"s", snap)
    assert tokens(vs, b"s") == {0: 50}
    after = vs.fetch_range(b"s", 0, 0, 50)
    assert after is not None
    assert np.array_equal(after, before)  # bit for bit: rows carry their own scales
    # Everything above the recorded length is zero bytes again (the layer invariant).
    lay = vs._sessions[b"s"].layers[0]
    assert lay.runs and all(not r.buf[max(0, 50 - r.base) :].any() for r in lay.runs)
    check_layers(vs)
    assert vs.fetch_range(b"s", 0, 50, 80) is None  # past tpl: absent
    # A later store at those positions writes fresh rows; nothing of the branch leaks.
    fresh = rows(20, 96, seed=3)
    vs.store(b"s", 0, 50, fresh)
    got = vs.fetch_range(b"s", 0, 50, 70)
    codec = get_codec(fmt)
    assert got is not None
    assert np.array_equal(got, codec.decode(codec.encode(fresh), 96))


def test_restore_accounting() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    vs.store(b"s", 0, 0, rows(10, 8))
    vs.store(b"s", 1, 0, rows(4, 8))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 10, rows(5, 8))
    vs.store(b"s", 1, 0, rows(9, 8))
    vs.store(b"s", 3, 0, rows(2, 8))  # a layer that did not exist at the snapshot
    assert vs.total_tokens == 15 + 9 + 2
    vs.restore(b"s", snap)
    row = get_codec("int8").row_bytes(8)
    assert tokens(vs, b"s") == {0: 10, 1: 4}
    assert vs.describe(b"s").num_layers == 2  # the new uniform layer is gone
    assert vs.total_tokens == 14
    assert vs.vstore_bytes == 14 * row
    assert vs.vstore_bytes == vs.describe(b"s").nbytes


def test_restore_never_grows_and_nested_snapshots_work() -> None:
    vs = make_store()
    vs.create(b"s", 8, "fp16")
    vs.store(b"s", 0, 0, rows(20, 8))
    outer = vs.snapshot(b"s")
    vs.store(b"s", 0, 20, rows(30, 8))
    inner = vs.snapshot(b"s")
    vs.store(b"s", 0, 50, rows(15, 8))
    vs.restore(b"s", inner)
    assert tokens(vs, b"s") == {0: 50}
    vs.restore(b"s", outer)
    assert tokens(vs, b"s") == {0: 20}
    vs.restore(b"s", inner)  # recorded 50 > current 20: nothing grows
    assert tokens(vs, b"s") == {0: 20}
    vs.restore(b"s", outer)  # a snapshot stays live after a restore
    assert vs.snapshot_ids(b"s") == [outer, inner]


def test_schema_session_keeps_its_layers_on_restore() -> None:
    vs = make_store()
    vs.create_schema(b"s", 0, [("bf16_rope_fp8_body", 64), ("turbo4", 128)], [16, 0])
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 0, rows(5, 64))
    vs.store(b"s", 1, 0, rows(5, 128))
    vs.restore(b"s", snap)
    assert tokens(vs, b"s") == {0: 0, 1: 0}
    assert vs.describe(b"s").num_layers == 2
    assert vs.vstore_bytes == 0 and vs.total_tokens == 0


def test_ids_are_positive_increasing_and_never_reused() -> None:
    vs = make_store()
    vs.create(b"a", 8, "int8")
    vs.create(b"b", 8, "int8")
    ids = [vs.snapshot(b"a"), vs.snapshot(b"b"), vs.snapshot(b"a")]
    assert ids == [1, 2, 3]
    assert vs.release(b"a", 3) is True
    assert vs.release(b"a", 3) is False
    vs.drop(b"b")
    vs.create(b"b", 8, "int8")
    assert vs.snapshot(b"b") == 4  # not 2 or 3 again
    assert vs.snapshot_ids(b"b") == [4]  # a new session does not inherit old ids


def test_per_session_limit() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    vs.create(b"t", 8, "int8")
    ids = [vs.snapshot(b"s") for _ in range(MAX_SNAPSHOTS_PER_SESSION)]
    with pytest.raises(PionError, match="no free snapshot slot"):
        vs.snapshot(b"s")
    assert vs.snapshot(b"t") > ids[-1]  # per session: another session still has room
    assert vs.release(b"s", ids[0])
    assert vs.snapshot(b"s") > ids[-1]


def test_unknown_session_and_id() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    for call in (
        lambda: vs.snapshot(b"nope"),
        lambda: vs.restore(b"nope", 1),
        lambda: vs.release(b"nope", 1),
    ):
        with pytest.raises(SessionNotFoundError):
            call()
    snap = vs.snapshot(b"s")
    vs.create(b"t", 8, "int8")
    with pytest.raises(PionError, match="unknown snap_id"):
        vs.restore(b"t", snap)  # another session's id
    with pytest.raises(PionError, match="unknown snap_id"):
        vs.restore(b"s", 0)


def test_a_rollback_of_at_most_half_keeps_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    vs = make_store()
    vs.create(b"s", 8, "fp16")
    vs.store(b"s", 0, 0, rows(1000, 8))
    vs.store(b"s", 0, 1000, rows(5, 8))  # grows the run: 1005 live rows + 25% slack
    lay = vs._sessions[b"s"].layers[0]
    capacity = 1005 + int(1005 * (GROWTH - 1))
    assert len(lay.runs) == 1 and lay.allocated == capacity * lay.row_bytes
    copies: list[str] = []
    # Every way layer.py copies rows to a new buffer: merging/growing, and reallocating.
    for name in ("_merge", "_reallocate"):
        original = getattr(Layer, name)

        def counting(self: Layer, *args: Any, _name: str = name, _f: Any = original) -> Any:
            copies.append(_name)
            return _f(self, *args)

        monkeypatch.setattr(Layer, name, counting)
    run = lay.runs[0]
    snap = vs.snapshot(b"s")
    for step in range(20):  # a drafter's append / reject cycle never copies the layer
        vs.store(b"s", 0, 1005, rows(4, 8, seed=step))
        vs.restore(b"s", snap)
    assert copies == []
    assert lay.runs == [run] and lay.tpl == 1005
    assert lay.allocated == capacity * lay.row_bytes and not run.buf[1005:].any()
    check_layers(vs)


def test_a_large_rollback_releases_memory() -> None:
    vs = make_store()
    vs.create(b"s", 64, "fp16")
    vs.store(b"s", 0, 0, rows(10, 64))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 10, rows(990, 64))
    vs.restore(b"s", snap)
    assert vs.bytes_allocated <= GROWTH * vs.vstore_bytes


def test_restore_does_not_change_a_reply_still_queued() -> None:
    vs = make_store()
    vs.create(b"s", 8, "fp16")
    data = rows(10, 8).astype("<f2")
    vs.store(b"s", 0, 0, data)
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 10, data)
    view = vs.fetch_range(b"s", 0, 0, 20, native=True)  # a view of the layer buffer
    assert view is not None
    held = view.tobytes()
    vs.restore(b"s", snap)
    assert view.tobytes() == held  # copy-on-write: the reader keeps the old bytes
    assert vs.fetch_range(b"s", 0, 10, 20, native=True) is None


def test_journal_records_and_replay() -> None:
    journal = RecordingJournal()
    vs = make_store(journal=journal)
    vs.create(b"s", 8, "int8")
    vs.store(b"s", 0, 0, rows(10, 8))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 10, rows(10, 8))
    vs.store(b"s", 2, 0, rows(3, 8))
    vs.restore(b"s", snap)
    assert vs.release(b"s", snap)
    assert not vs.release(b"s", snap)  # not live: nothing logged
    assert journal.records[2] == TakeSnapshot(b"s", 1, ((0, 10),))
    assert journal.records[5:] == [RestoreSnapshot(b"s", 1), ReleaseSnapshot(b"s", 1)]
    replayed = make_store()
    for m in journal.records:
        replayed.apply(m)
    assert state_of(replayed) == state_of(vs)
    assert replayed.last_snap_id == vs.last_snap_id == 1
    assert tokens(replayed, b"s") == {0: 10}


def test_dump_carries_live_snapshots_and_the_id_counter() -> None:
    vs = make_store()
    vs.create(b"a", 8, "int8")
    vs.store(b"a", 0, 0, rows(10, 8))
    keep = vs.snapshot(b"a")
    gone = vs.snapshot(b"a")
    vs.release(b"a", gone)
    vs.store(b"a", 0, 10, rows(10, 8))
    dumped = list(vs.dump())
    assert dumped[0] == SnapshotIds(gone)
    assert TakeSnapshot(b"a", keep, ((0, 10),)) in dumped
    loaded = make_store()
    for m in dumped:
        loaded.apply(m)
    assert state_of(loaded) == state_of(vs)
    assert loaded.snapshot(b"a") == gone + 1  # the counter survived, not the live max
    loaded.restore(b"a", keep)
    assert tokens(loaded, b"a") == {0: 10}


def test_a_failing_journal_changes_nothing() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    vs.store(b"s", 0, 0, rows(10, 8))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 10, rows(10, 8))
    before = state_of(vs)
    vs.journal = FailingJournal()
    for call in (
        lambda: vs.snapshot(b"s"),
        lambda: vs.restore(b"s", snap),
        lambda: vs.release(b"s", snap),
    ):
        with pytest.raises(MisconfError):
            call()
    assert state_of(vs) == before
    assert vs.last_snap_id == snap


def test_create_with_ropes_is_validated() -> None:
    vs = make_store()
    bad = [
        CreateSession(b"x", 64, "bf16_rope_fp8_body", None),  # uniform
        CreateSession(b"x", 0, "int8", (("int8", 8),), (4,)),  # rope on int8
        CreateSession(b"x", 0, "bf16_rope_fp8_body", (("bf16_rope_fp8_body", 8),), (8,)),
        CreateSession(b"x", 0, "bf16_rope_fp8_body", (("bf16_rope_fp8_body", 8),), None),
        CreateSession(b"x", 0, "int8", (("int8", 8),), (0, 0)),  # wrong count
        CreateSession(b"x", 8, "int8", None, (0,)),
    ]
    for m in bad:
        with pytest.raises(PionError):
            vs.apply(m)
        assert b"x" not in vs
    vs.apply(CreateSession(b"x", 0, "bf16_rope_fp8_body", (("bf16_rope_fp8_body", 8),), (7,)))
    assert vs.describe(b"x").layers[0].rope == 7


def test_rope_layer_stores_and_dumps_with_its_rope() -> None:
    vs = make_store()
    vs.create_schema(b"m", 0, [("bf16_rope_fp8_body", 576), ("fp8", 512)], [64, 0])
    x = rows(7, 576)
    vs.store(b"m", 0, 0, x)
    codec = get_codec("bf16_rope_fp8_body", 64)
    got = vs.fetch_range(b"m", 0, 0, 7)
    assert got is not None
    assert np.array_equal(got, codec.decode(codec.encode(x), 576))
    assert vs.vstore_bytes == 7 * codec.row_bytes(576)
    created = next(m for m in vs.dump() if isinstance(m, CreateSession))
    assert created.ropes == (64, 0)
    loaded = make_store()
    for m in vs.dump():
        loaded.apply(m)
    assert state_of(loaded) == state_of(vs)


def test_restore_over_sparse_runs() -> None:
    """A layer holding separate runs (holes between them): a restore drops the runs
    above the recorded length and cuts the one across it; holes stay free, the rows
    below keep their contents (overwrites and holes filled since included), and the
    accounting (held bytes, tpl tokens, the LRU's bytes) follows."""
    vs = make_store()
    vs.create(b"s", 8, "int8")
    row = get_codec("int8").row_bytes(8)
    vs.store(b"s", 0, 0, rows(10, 8, seed=1))
    outer = vs.snapshot(b"s")  # length 10
    vs.store(b"s", 0, 50, rows(10, 8, seed=2))  # a hole 10..50
    inner = vs.snapshot(b"s")  # length 60
    vs.store(b"s", 0, 55, rows(3, 8, seed=3))  # an overwrite below the length
    vs.store(b"s", 0, 20, rows(5, 8, seed=4))  # a hole below the length, filled
    vs.store(b"s", 0, 60, rows(10, 8, seed=5))  # the draft: appended to the run
    vs.store(b"s", 0, 100, rows(10, 8, seed=6))  # and a run of its own
    lay = vs._sessions[b"s"].layers[0]
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10), (20, 25), (50, 70), (100, 110)]
    kept = vs.fetch_range(b"s", 0, 0, 60)
    assert kept is not None
    kept = kept.copy()

    vs.restore(b"s", inner)
    check_layers(vs)
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10), (20, 25), (50, 60)]
    assert (lay.tpl, lay.held) == (60, 25)
    assert vs.total_tokens == 60 and vs.vstore_bytes == 25 * row
    assert vs._lru.bytes_of((b"s",)) == vs.vstore_bytes
    got = vs.fetch_range(b"s", 0, 0, 60)
    assert got is not None and np.array_equal(got, kept)
    assert vs.fetch_range(b"s", 0, 60, 110) is None  # past tpl

    vs.restore(b"s", outer)
    check_layers(vs)
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10)]
    assert vs.total_tokens == 10 and vs.vstore_bytes == 10 * row
    assert vs._lru.bytes_of((b"s",)) == vs.vstore_bytes
    vs.restore(b"s", inner)  # recorded 60 > current 10: nothing grows back
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10)] and lay.tpl == 10


def test_a_restore_releases_its_bytes_to_the_budget() -> None:
    """--maxmemory sees the bytes a restore released: what the session holds after it
    is what it is charged with when the budget looks for bytes to evict."""
    row = get_codec("int8").row_bytes(8)
    vs = make_store(maxmemory=100 * row)
    vs.create(b"other", 8, "int8")
    vs.store(b"other", 0, 0, rows(40, 8))
    vs.create(b"s", 8, "int8")
    vs.store(b"s", 0, 0, rows(10, 8))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 30, rows(50, 8))  # 100 rows held in all: the budget is full
    vs.restore(b"s", snap)
    assert vs.vstore_bytes == 50 * row
    # 90 more rows of s need exactly other's 40 (s itself is never a victim).
    vs.store(b"s", 0, 10, rows(90, 8))
    assert b"other" not in vs and vs.evictions == 1
    assert vs.vstore_bytes == 100 * row


def test_restore_and_replay_over_sparse_runs_rebuild_the_same_store() -> None:
    journal = RecordingJournal()
    vs = make_store(journal=journal)
    vs.create(b"s", 8, "fp8")
    vs.store(b"s", 0, 0, rows(10, 8, seed=1))
    vs.store(b"s", 0, 40, rows(10, 8, seed=2))
    snap = vs.snapshot(b"s")
    vs.store(b"s", 0, 45, rows(20, 8, seed=3))
    vs.store(b"s", 0, 90, rows(5, 8, seed=4))
    vs.store(b"s", 1, 200, rows(5, 8, seed=5))
    vs.restore(b"s", snap)
    replayed = make_store()
    for m in journal.records:
        replayed.apply(m)
    check_layers(replayed)
    assert state_of(replayed) == state_of(vs)
    loaded = make_store()  # a snapshot file's records: the held runs, then the VSNAP
    for m in vs.dump():
        loaded.apply(m)
    assert state_of(loaded) == state_of(vs)
    loaded.restore(b"s", snap)
    assert state_of(loaded) == state_of(vs)
