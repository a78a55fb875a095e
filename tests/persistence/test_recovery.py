"""Recovery from damaged files, exhaustively on a small workload: the log cut at every
byte offset recovers a consistent prefix (an incomplete last record is a torn write,
cut); a single bit flip anywhere, the last record included, is corruption and stops
startup; skipped records are never applied twice."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pion.persistence import RecoveryError, snapshot_path, wal_path
from pion.persistence.reader import read_records
from pion.persistence.recovery import WAL_HEADER_SIZE, recover_sync
from pion.vstore import VStore
from support import (
    StateRecorder,
    durable_state,
    make_store,
    open_store,
    rows,
    small_workload,
)

State = list[tuple[Any, ...]]


@pytest.fixture(scope="module")
def workload_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[State], list[int]]:
    """The log of the small workload, the state after each record prefix, and the
    offset where each record ends."""
    data = tmp_path_factory.mktemp("workload")
    vs, p = open_store(data, vstore_max_sessions=4)
    rec = StateRecorder(vs, p)
    vs.journal = rec
    small_workload(vs)
    p.close()
    raw = wal_path(data, 0).read_bytes()
    with open(wal_path(data, 0), "rb") as f:
        ends = [r.end for r in read_records(f, WAL_HEADER_SIZE, len(raw), 1)]
    states = rec.finish()
    assert len(states) == len(ends) + 1
    return raw, states, ends


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A data directory for thousands of tiny recoveries: on tmpfs when there is one
    (opening files there costs a tenth of what it costs on an overlay file system)."""
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path / "scratch"
    root.mkdir(exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _recover(data: Path, raw: bytes) -> tuple[VStore, Any]:
    wal_path(data, 0).write_bytes(raw)
    vs = make_store()
    res = recover_sync(vs, snapshot_path(data, 0), wal_path(data, 0))
    return vs, res


def test_workload_has_every_record_kind(workload_log: tuple[bytes, list[State], list[int]]) -> None:
    raw, _, ends = workload_log
    ops = {r.op for r in read_records(io.BytesIO(raw), WAL_HEADER_SIZE, len(raw), 1)}
    assert ops == {1, 2, 3, 4}
    assert len(ends) >= 15


def test_truncated_at_every_offset_recovers_a_prefix(
    scratch: Path, workload_log: tuple[bytes, list[State], list[int]]
) -> None:
    raw, states, ends = workload_log
    for cut in range(len(raw) + 1):
        vs, res = _recover(scratch, raw[:cut])
        complete = sum(1 for e in ends if e <= cut)
        assert durable_state(vs) == states[complete], f"cut at {cut}"
        if cut >= WAL_HEADER_SIZE:
            boundary = ends[complete - 1] if complete else WAL_HEADER_SIZE
            assert res.truncated == cut - boundary
            assert wal_path(scratch, 0).stat().st_size == boundary
            assert res.replayed == complete


def test_every_single_bit_flip_is_refused(
    scratch: Path, workload_log: tuple[bytes, list[State], list[int]]
) -> None:
    """A flip leaves every record complete, so none is a torn write: wherever it lands,
    the last record included, startup stops naming the file, the offset of the damaged
    record and the repair command, and nothing of the damaged data is replayed."""
    raw, _, ends = workload_log
    starts = [WAL_HEADER_SIZE, *ends[:-1]]
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        byte = bit // 8
        hit = None if byte < WAL_HEADER_SIZE else next(i for i, e in enumerate(ends) if byte < e)
        with pytest.raises(RecoveryError) as info:
            _recover(scratch, bytes(damaged))
        text = info.value.message
        assert "pion.vstore.wal.0" in text
        if hit is None:
            assert "offset 0" in text
            continue
        assert f"offset {starts[hit]}" in text, text
        assert "check-wal --fix" in text
        if hit == len(ends) - 1:
            assert "the record is complete" in text, text
        # The log is left as it was for the operator (and check-wal) to see.
        assert wal_path(scratch, 0).read_bytes() == bytes(damaged)


def test_skipped_records_are_never_applied_twice(tmp_path: Path) -> None:
    """A crash between the snapshot's rename and the log's reset leaves a log whose
    records the snapshot already holds. Replaying them over it would be wrong: here a
    session is dropped and re-created with another format, so a second replay of its
    old rows would not even fit."""
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"x", 8, "int8")
    vs.store(b"x", 0, 0, rows(2, 8))
    vs.drop(b"x")
    vs.create(b"x", 16, "fp16")
    expected = durable_state(vs)
    log_before = wal_path(data, 0).read_bytes()
    p.save(None)
    p.close()
    wal_path(data, 0).write_bytes(log_before)  # as if the reset never happened
    vs2, res = make_store(), None
    res = recover_sync(vs2, snapshot_path(data, 0), wal_path(data, 0))
    assert durable_state(vs2) == expected
    assert res.replayed == 0 and res.skipped == 4 and res.wal_action == "reset"
    # And the server finishes the interrupted reset when it opens the log.
    vs3, p3 = open_store(data)
    assert durable_state(vs3) == expected
    assert wal_path(data, 0).stat().st_size == WAL_HEADER_SIZE
    p3.close()


def test_a_log_that_starts_after_the_snapshot_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"x", 8, "int8")
    p.save(None)
    vs.create(b"y", 8, "int8")
    p.close()
    older = snapshot_path(data, 0).read_bytes()
    vs2, p2 = open_store(data)
    vs2.create(b"z", 8, "int8")
    p2.save(None)  # a newer snapshot; the log now starts after it
    vs2.create(b"w", 8, "int8")
    p2.close()
    snapshot_path(data, 0).write_bytes(older)  # replaced by an older one
    with pytest.raises(RecoveryError, match=r"records 2\.\.3 are missing"):
        recover_sync(make_store(), snapshot_path(data, 0), wal_path(data, 0))
    snapshot_path(data, 0).unlink()  # gone entirely: named, with the fix
    with pytest.raises(RecoveryError, match=r"its records need the snapshot .*pion\.vstore\.0"):
        recover_sync(make_store(), snapshot_path(data, 0), wal_path(data, 0))


def test_snapshot_bit_flips_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data, vstore_max_sessions=4)
    small_workload(vs)
    p.save(None)
    p.close()
    raw = snapshot_path(data, 0).read_bytes()
    for bit in range(0, len(raw) * 8, 7):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        snapshot_path(data, 0).write_bytes(bytes(damaged))
        with pytest.raises(RecoveryError, match=r"pion\.vstore\.0"):
            recover_sync(make_store(), snapshot_path(data, 0), wal_path(data, 0))
    for cut in range(0, len(raw), 5):
        snapshot_path(data, 0).write_bytes(raw[:cut])
        with pytest.raises(RecoveryError):
            recover_sync(make_store(), snapshot_path(data, 0), wal_path(data, 0))
