"""The write path up to the queue: the fan-out journal (WAL first), and the tier journal
turning mutations into queued operations with their own copies, under the queue's
bounds, never raising. The writer's thread is not started here: only its queue."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pion.config import TierConfig, VStoreLimits
from pion.errors import MisconfError
from pion.tier.client import TierClient
from pion.tier.health import Health
from pion.tier.journal import FanOutJournal, FillGate, TierJournal
from pion.tier.keys import KeyLayout
from pion.tier.ledger import Ledger
from pion.tier.meta import Layout
from pion.tier.ops import CreateOp, DropOp, SetBlocksOp, StoreOp, TruncateOp
from pion.tier.remote import Remote
from pion.tier.writer import Writer
from pion.vstore import StoreRows
from support import FailingJournal, RecordingJournal, durable_state, make_store, rows


def _journal(**config: object) -> tuple[TierJournal, Writer]:
    cfg = TierConfig(url="redis://127.0.0.1:9", **config)  # type: ignore[arg-type]
    health = Health()
    ledger = Ledger(capacity=64)
    writer = Writer(
        Remote(TierClient(cfg, health), KeyLayout(), VStoreLimits()), health, ledger, cfg
    )
    return TierJournal(writer, ledger, health, cfg), writer


def _queued(writer: Writer) -> list[object]:
    return [op for _, op in writer._queue]


def test_every_mutation_becomes_an_operation_with_its_own_bytes() -> None:
    journal, writer = _journal(write="async")
    vs = make_store(journal=journal)
    vs.create(b"n_pk", 8, "fp16")
    vs.create_schema(b"s", 0, [("int8", 32), ("fp8", 8)])
    data = rows(3, 8, 1)
    vs.store(b"n_pk", 0, 5, data)
    vs.set_blocks(b"n_pk", 4, np.array([9, 8], dtype=np.uint64))
    vs.drop(b"s")
    ops = _queued(writer)
    assert ops[0] == CreateOp(b"n_pk", Layout(8, "fp16", None))
    assert ops[1] == CreateOp(b"s", Layout(0, "int8", (("int8", 32), ("fp8", 8))))
    store = ops[2]
    assert isinstance(store, StoreOp) and (store.start, store.count, store.dim) == (5, 3, 8)
    assert store.data == data.astype("<f2").tobytes() and isinstance(store.data, bytes)
    assert ops[3] == SetBlocksOp(b"n_pk", 4, np.array([9, 8], dtype="<u8").tobytes())
    assert ops[4] == DropOp(b"s")
    assert writer.queued_bytes == sum(op.nbytes for op in ops)  # type: ignore[attr-defined]
    assert writer.pending(b"n_pk") and writer.pending(b"s") and not writer.pending(b"x")


def test_evictions_and_local_only_changes_never_reach_the_tier() -> None:
    journal, writer = _journal(write="async")
    vs = make_store(journal=journal, max_sessions=1)
    journal.ledger.set_gen(b"old", "0" * 16)
    with journal.local_only():
        vs.create(b"old", 8, "int8")
    vs.create(b"new", 8, "int8")  # evicts "old": not a tier drop
    assert _queued(writer) == [CreateOp(b"new", Layout(8, "int8", None))]
    assert journal.ledger.gen(b"old") is None  # its local copy is gone, though


def test_the_wal_goes_first_and_a_refusal_stops_the_tier() -> None:
    journal, writer = _journal(write="async")
    wal = RecordingJournal()
    vs = make_store(journal=FanOutJournal(wal, journal))
    vs.create(b"a", 4, "fp16")
    assert len(wal.records) == 1 and writer.depth == 1
    vs.journal = FanOutJournal(FailingJournal(), journal)
    with pytest.raises(MisconfError):
        vs.store(b"a", 0, 0, rows(1, 4))
    assert writer.depth == 1 and vs.describe(b"a").total_tokens == 0


def test_a_full_queue_marks_the_session_for_a_resync() -> None:
    journal, writer = _journal(write="async", queue_max_bytes=4096)
    vs = make_store(journal=journal)
    vs.create(b"big", 64, "fp16")
    vs.create(b"small", 4, "fp16")
    vs.store(b"big", 0, 0, rows(64, 64))  # 8 KiB of rows: over the bound
    assert journal.ledger.is_dirty(b"big") and journal.overflows == 1
    vs.store(b"big", 0, 64, rows(1, 64))  # small, but the resync will carry it
    vs.store(b"small", 0, 0, rows(1, 4))
    assert [op.sid for op in _queued(writer)] == [b"big", b"small", b"small"]  # type: ignore[attr-defined]
    assert writer.queued_bytes <= 4096
    vs.drop(b"big")  # a client's drop: always queued, and no resync needed any more
    assert not journal.ledger.is_dirty(b"big") and _queued(writer)[-1] == DropOp(b"big")


def test_a_sync_write_waits_only_while_the_tier_is_up() -> None:
    journal, writer = _journal(write="sync", sync_timeout=0.05)
    vs = make_store(journal=journal)
    t0 = time.monotonic()
    vs.create(b"a", 4, "fp16")  # nobody drains: the wait times out, the write stands
    assert time.monotonic() - t0 >= 0.05 and journal.sync_timeouts == 1
    journal.health.failure("write", "Connection refused")
    t0 = time.monotonic()
    vs.create(b"b", 4, "fp16")
    assert time.monotonic() - t0 < 0.05 and journal.sync_timeouts == 1
    assert {b"a", b"b"} <= set(vs.sids()) and writer.depth == 2


def test_a_failing_queue_never_fails_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    journal, writer = _journal(write="async")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(writer, "offer", broken)
    vs = make_store(journal=journal)
    vs.create(b"a", 4, "fp16")
    vs.store(b"a", 0, 0, rows(2, 4))
    assert vs.describe(b"a").total_tokens == 2


def test_store_rows_records_are_copied_not_aliased() -> None:
    journal, writer = _journal(write="async")
    buf = bytearray(b"\x01" * 16)
    journal.append(StoreRows(b"x", 0, 0, 2, 5, 4, memoryview(buf)))
    buf[:] = b"\x00" * 16
    (op,) = _queued(writer)
    assert isinstance(op, StoreOp) and op.data == b"\x01" * 16


def test_filled_sessions_stay_out_of_the_log_until_written_locally() -> None:
    wal = RecordingJournal()
    vs = make_store(max_sessions=3)
    gate = FillGate(wal, vs)
    vs.journal = gate
    vs.create(b"own", 4, "fp16")
    with gate.filling([b"f"]):
        vs.create(b"f", 4, "int8")
        vs.store(b"f", 0, 0, rows(3, 4, 1))
        vs.set_blocks(b"f", 2, np.array([1, 2], dtype=np.uint64))
    assert [(type(m).__name__, m.sid) for m in wal.records] == [("CreateSession", b"own")]
    vs.store(b"f", 0, 3, rows(1, 4, 2))  # a local write: the whole session goes first
    assert [(type(m).__name__, m.sid) for m in wal.records[1:]] == [
        ("CreateSession", b"f"),
        ("StoreRows", b"f"),
        ("SetBlocks", b"f"),
        ("StoreRows", b"f"),
    ]
    replayed = make_store()
    for m in wal.records:
        replayed.apply(m)
    assert durable_state(replayed) == durable_state(vs)
    # Volatile sessions leave without a record, dropped or evicted; logged ones do not.
    count = len(wal.records)
    with gate.filling([b"g", b"h"]):
        vs.create(b"g", 4, "int8")
        vs.create(b"h", 4, "int8")  # evicts "own"
    vs.drop(b"g")
    vs.create(b"i", 4, "int8")
    vs.create(b"j", 4, "int8")  # evicts "f", logged since its local write
    vs.create(b"k", 4, "int8")  # evicts "h", never logged
    assert [(type(m).__name__, m.sid) for m in wal.records[count:]] == [
        ("DropSession", b"own"),
        ("CreateSession", b"i"),
        ("DropSession", b"f"),
        ("CreateSession", b"j"),
        ("CreateSession", b"k"),
    ]


def test_a_restore_becomes_a_cut_of_the_tier_copy() -> None:
    journal, writer = _journal(write="async")
    vs = make_store(journal=journal)
    vs.create(b"d", 4, "fp16")
    vs.store(b"d", 0, 0, rows(5, 4))
    snap = vs.snapshot(b"d")
    vs.store(b"d", 0, 5, rows(3, 4))
    vs.restore(b"d", snap)
    assert _queued(writer)[-1] == TruncateOp(b"d", ((0, 5),))
    # A snapshot this journal never saw (taken before it was attached): a full resync.
    later, later_writer = _journal(write="async")
    vs.journal = later
    vs.restore(b"d", snap)
    assert later.ledger.is_dirty(b"d") and later_writer.depth == 0
