"""Snapshots in-process: what they preserve, how they are laid out, and a failure
injected at each step of SAVE leaving the previous snapshot and log usable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pion.errors import MisconfError, PionError
from pion.persistence import faults, snapshot_path, wal_path
from pion.persistence import format as fmt
from pion.persistence import snapshot as snapshot_mod
from pion.persistence import vstore_format as vfmt
from pion.persistence.recovery import WAL_HEADER_SIZE, recover_sync
from pion.vstore import StoreRows
from support import (
    durable_state,
    make_store,
    open_store,
    open_stores_with_ssm,
    rows,
    small_workload,
)


@pytest.fixture
def fault_at() -> Iterator[list[str]]:
    """Steps listed here raise EIO when reached (the list can change mid-test)."""
    armed: list[str] = []

    def hook(step: str) -> None:
        if step in armed:
            raise OSError(5, f"injected fault at {step}")

    faults.hook = hook
    yield armed
    faults.hook = None


def _recovered(data: Path) -> list[object]:
    vs = make_store()
    recover_sync(vs, snapshot_path(data, 0), wal_path(data, 0))
    return durable_state(vs)


def test_snapshot_round_trip_and_log_reset(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path, vstore_max_sessions=4)
    small_workload(vs)
    expected = durable_state(vs)
    p.save(None)
    assert wal_path(tmp_path, 0).stat().st_size == WAL_HEADER_SIZE
    assert p.info()["wal_bytes"] == WAL_HEADER_SIZE
    assert p.info()["snapshot_bytes"] == snapshot_path(tmp_path, 0).stat().st_size
    vs.store(b"a_pk", 0, 10, rows(2, 16, 9))  # logged after the snapshot
    expected_after = durable_state(vs)
    p.close()
    assert expected_after != expected
    assert _recovered(tmp_path) == expected_after


def test_empty_snapshot(tmp_path: Path) -> None:
    _, p = open_store(tmp_path)
    p.save(None)
    p.close()
    assert snapshot_path(tmp_path, 0).stat().st_size == 40 + 21 + 16  # header + END
    assert _recovered(tmp_path) == durable_state(make_store())


def test_large_layers_are_written_in_pieces_highest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_mod, "SNAPSHOT_CHUNK", 1000)
    vs, p = open_store(tmp_path)
    vs.create(b"big", 100, "fp16")  # 200-byte rows: 5 rows per piece
    vs.store(b"big", 0, 0, rows(23, 100))
    vs.set_blocks(b"big", 16, np.arange(2, dtype=np.uint64))
    p.save(None)
    p.close()
    with open(snapshot_path(tmp_path, 0), "rb") as f:
        size = snapshot_path(tmp_path, 0).stat().st_size
        f.seek(40)
        starts = [m.start for _, m in snapshot_mod.iter_snapshot(f, size) if hasattr(m, "start")]
    assert starts == [20, 15, 10, 5, 0]
    loaded = make_store()
    recover_sync(loaded, snapshot_path(tmp_path, 0), wal_path(tmp_path, 0))
    assert durable_state(loaded) == durable_state(vs)
    # The first piece sized the buffer exactly: nothing was reallocated or over-grown.
    assert loaded.bytes_allocated == loaded.vstore_bytes


def test_holes_stay_out_of_snapshots_and_runs_load_without_reallocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer of three runs, one of them larger than a piece: the snapshot holds the
    runs only, and loading allocates each run once (the sizing pass), copying nothing."""
    from pion.vstore import layer as layer_module

    monkeypatch.setattr(snapshot_mod, "SNAPSHOT_CHUNK", 1000)
    vs, p = open_store(tmp_path)
    vs.create(b"h", 100, "fp16")  # 200-byte rows: 5 rows per piece
    vs.store(b"h", 0, 3, rows(2, 100, 1))
    vs.store(b"h", 0, 40, rows(12, 100, 2))  # 3 pieces
    vs.store(b"h", 0, 150_000, rows(1, 100, 3))
    vs.store(b"h", 2, 7, rows(6, 100, 4))  # 2 pieces
    p.save(None)
    p.close()
    path = snapshot_path(tmp_path, 0)
    with open(path, "rb") as f:
        size = path.stat().st_size
        f.seek(40)
        spans = [
            (m.layer, m.start, m.count)
            for _, m in snapshot_mod.iter_snapshot(f, size)
            if isinstance(m, StoreRows)
        ]
        hints = snapshot_mod.run_hints(f, size)
    layer0 = [(0, 3, 2), (0, 50, 2), (0, 45, 5), (0, 40, 5), (0, 150_000, 1)]
    assert spans == [*layer0, (2, 12, 1), (2, 7, 5)]
    assert hints == {(b"h", 0, 52): 40, (b"h", 2, 13): 7}
    assert size < 5000  # 21 rows of 200 bytes, and no hole
    merges = 0
    real = layer_module.Layer._merge

    def counting(self: layer_module.Layer, *args: object) -> layer_module.Run:
        nonlocal merges
        merges += 1
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(layer_module.Layer, "_merge", counting)
    loaded = make_store()
    recover_sync(loaded, path, wal_path(tmp_path, 0))
    assert durable_state(loaded) == durable_state(vs)
    assert merges == 0
    assert loaded.bytes_allocated == loaded.vstore_bytes == 21 * 200


def test_holes_stay_sparse_through_persistence_with_the_ssm_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the SSM store beside it (its own snapshot file, loaded through the plain
    ``apply_frame``), the V-store still sizes its runs from its snapshot: a sparse layer
    comes back holding exactly the rows written, each run allocated once, no hole."""
    from pion.vstore import layer as layer_module

    monkeypatch.setattr(snapshot_mod, "SNAPSHOT_CHUNK", 1000)
    vs, ssm, p = open_stores_with_ssm(tmp_path)
    vs.create(b"h", 100, "fp16")  # 200-byte rows: 5 rows per piece
    vs.store(b"h", 0, 3, rows(2, 100, 1))
    vs.store(b"h", 0, 40, rows(12, 100, 2))  # 3 pieces
    vs.store(b"h", 0, 150_000, rows(1, 100, 3))
    vs.store(b"h", 2, 7, rows(6, 100, 4))  # 2 pieces
    ssm.store(b"h", 0, b"recurrent state" * 100)
    ssm.store(b"h", 4, b"")
    p.save(None)
    p.close()
    assert (tmp_path / "pion.ssm.0").exists()
    assert snapshot_path(tmp_path, 0).stat().st_size < 5000  # 21 rows, and no hole
    merges = 0
    real = layer_module.Layer._merge

    def counting(self: layer_module.Layer, *args: object) -> layer_module.Run:
        nonlocal merges
        merges += 1
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(layer_module.Layer, "_merge", counting)
    loaded, loaded_ssm, p2 = open_stores_with_ssm(tmp_path)
    res = p2.recovered
    p2.close()
    assert res.snapshot_units == {"ssm": 2, "vstore": 1} and res.replayed == 0
    assert durable_state(loaded) == durable_state(vs)
    assert merges == 0
    assert loaded.bytes_allocated == loaded.vstore_bytes == 21 * 200
    assert loaded_ssm.get(b"h", 0) == b"recurrent state" * 100
    assert loaded_ssm.get(b"h", 4) == b""
    assert loaded_ssm.bytes == ssm.bytes and len(loaded_ssm) == 2


def test_snapshot_keeps_lru_order(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path)
    for sid in (b"a", b"b", b"c"):
        vs.create(sid, 8, "int8")
    vs.touch(b"a")  # a read: not logged, but a snapshot captures the order
    p.save(None)
    p.close()
    loaded = make_store()
    recover_sync(loaded, snapshot_path(tmp_path, 0), wal_path(tmp_path, 0))
    assert loaded.sids() == [b"b", b"c", b"a"]


@pytest.mark.parametrize("step", faults.STEPS)
def test_failure_at_each_save_step_keeps_everything(
    tmp_path: Path, fault_at: list[str], step: str
) -> None:
    vs, p = open_store(tmp_path, vstore_max_sessions=4)
    vs.create(b"first", 8, "fp16")
    p.save(None)  # a previous snapshot to protect
    small_workload(vs)
    before = durable_state(vs)
    fault_at.append(step)
    with pytest.raises(PionError, match="injected fault"):
        p.save(None)
    fault_at.clear()
    assert not list(tmp_path.glob("*.tmp"))
    assert _recovered(tmp_path) == before  # what a crash right now would find
    if step == "wal_fsync_dir":
        # The new log's name may not survive a power cut: writes are refused until
        # a snapshot and a fresh log are made durable again.
        assert p.write_refusal() is not None
        with pytest.raises(MisconfError):
            vs.create(b"later", 8, "int8")
        p.save(None)
        assert p.write_refusal() is None
    vs.create(b"later", 8, "int8")
    after = durable_state(vs)
    p.close()
    assert _recovered(tmp_path) == after


def test_save_to_a_custom_path_leaves_the_log(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path)
    vs.create(b"x", 8, "int8")
    size = wal_path(tmp_path, 0).stat().st_size
    p.save("backups/one.snap")
    assert (tmp_path / "backups" / "one.snap").exists()
    assert wal_path(tmp_path, 0).stat().st_size == size
    assert not snapshot_path(tmp_path, 0).exists()
    for bad in ("pion.vstore.wal.0", "pion.lock.0"):
        with pytest.raises(PionError, match="owns"):
            p.save(bad)
    (tmp_path / "out").symlink_to("/tmp")
    with pytest.raises(PionError, match="inside the data directory"):
        p.save("out/escape.snap")
    p.close()


def test_a_failed_append_refuses_and_applies_nothing(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path)
    vs.create(b"x", 8, "int8")
    assert p.wal is not None
    real_fd = p.wal._fd
    p.wal._fd = 10_000  # a descriptor that is not open: the write fails with EBADF
    with pytest.raises(MisconfError, match="Errors writing to the write-ahead log"):
        vs.store(b"x", 0, 0, rows(1, 8))
    p.wal._fd = real_fd
    assert vs.describe(b"x").total_tokens == 0
    assert p.write_refusal() is not None
    with pytest.raises(MisconfError):
        vs.create(b"y", 8, "int8")
    p.save(None)  # the way back: snapshot from memory, then a fresh log
    assert p.write_refusal() is None
    vs.create(b"y", 8, "int8")
    expected = durable_state(vs)
    p.close()
    assert _recovered(tmp_path) == expected


def test_format_constants_are_frozen() -> None:
    assert (vfmt.OP_CREATE, vfmt.OP_STORE, vfmt.OP_DROP, vfmt.OP_BLOCKS, fmt.END) == (
        1,
        2,
        3,
        4,
        127,
    )
    assert fmt.RECORD_OVERHEAD == 21
