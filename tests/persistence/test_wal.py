"""The fsync policies and the failed state of the write-ahead log, with fdatasync
counted or made to fail; and group commit through a real in-process server."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from pion.errors import MisconfError
from pion.persistence import snapshot_path, wal_path
from pion.persistence import wal as wal_mod
from support import no_retry, open_store, rows


class FsyncSpy:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")


def _fsync_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "pion-wal-fsync" and t.is_alive()}


@pytest.fixture
def fsync(monkeypatch: pytest.MonkeyPatch) -> FsyncSpy:
    spy = FsyncSpy()
    monkeypatch.setattr(wal_mod, "fdatasync", spy)
    return spy


def test_always_is_one_fsync_per_group(tmp_path: Path, fsync: FsyncSpy) -> None:
    vs, p = open_store(tmp_path, appendfsync="always")
    base = fsync.calls
    assert not p.needs_sync()
    vs.create(b"a", 8, "int8")
    vs.create(b"b", 8, "int8")
    assert p.needs_sync()
    p.sync()
    assert fsync.calls == base + 1 and not p.needs_sync()
    p.sync()  # nothing new: no fsync
    assert fsync.calls == base + 1
    p.close()


def test_everysec_syncs_in_the_background(tmp_path: Path, fsync: FsyncSpy) -> None:
    others = _fsync_threads()
    vs, p = open_store(tmp_path, appendfsync="everysec")
    assert _fsync_threads() - others  # what syncs each second
    base = fsync.calls
    vs.create(b"a", 8, "int8")
    assert not p.needs_sync()  # replies never wait under everysec
    deadline = time.monotonic() + 5
    while fsync.calls == base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fsync.calls == base + 1
    assert p.wal is not None and not p.wal.dirty()
    p.close()


def test_no_leaves_it_to_the_os_until_close(tmp_path: Path, fsync: FsyncSpy) -> None:
    others = _fsync_threads()
    vs, p = open_store(tmp_path, appendfsync="no")
    base = fsync.calls
    vs.create(b"a", 8, "int8")
    assert fsync.calls == base and not p.needs_sync()
    # Nothing that could fsync later is running: only everysec has a syncing thread.
    assert not _fsync_threads() - others
    p.commit()  # KV.PREFIX.COMMIT is a barrier under every policy
    assert fsync.calls == base + 1
    vs.create(b"b", 8, "int8")
    p.close()
    assert fsync.calls == base + 2


def test_a_failed_fsync_is_never_retried_and_trusted(tmp_path: Path, fsync: FsyncSpy) -> None:
    vs, p = open_store(tmp_path, appendfsync="always")
    vs.create(b"a", 8, "int8")
    fsync.fail = True
    with pytest.raises(MisconfError, match=r"fsync of pion\.vstore\.wal\.0 failed"):
        p.sync()
    fsync.fail = False
    # The unsynced record is abandoned (its reply is withheld by the server), and the
    # log refuses everything until a snapshot and a fresh log are durable.
    assert not p.needs_sync()
    calls = fsync.calls
    with pytest.raises(MisconfError):
        p.sync()
    assert fsync.calls == calls  # no second fsync of the failed file
    with pytest.raises(MisconfError):
        vs.create(b"b", 8, "int8")
    assert p.write_refusal() is not None
    p.save(None)
    assert p.write_refusal() is None
    vs.create(b"b", 8, "int8")
    p.close()


def test_everysec_failure_refuses_writes(tmp_path: Path, fsync: FsyncSpy) -> None:
    vs, p = open_store(tmp_path, appendfsync="everysec")
    fsync.fail = True
    vs.create(b"a", 8, "int8")
    deadline = time.monotonic() + 5
    while p.write_refusal() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.write_refusal() is not None
    with pytest.raises(MisconfError):
        vs.create(b"b", 8, "int8")
    fsync.fail = False
    # "a" was acknowledged but its fsync failed: shutting down rewrites it from memory.
    p.close()
    assert snapshot_path(tmp_path, 0).exists()
    vs2, p2 = open_store(tmp_path)
    assert b"a" in vs2 and b"b" not in vs2
    p2.close()


def test_group_commit_withholds_replies_when_fsync_fails(
    server_factory: Callable[..., Any], tmp_path: Path, fsync: FsyncSpy
) -> None:
    srv = server_factory(dir=tmp_path / "d", appendfsync="always")
    r = redis.Redis(port=srv.port, retry=no_retry())
    r.execute_command("V.CREATE", "a", 8, "VQUANT", "int8")
    assert fsync.calls >= 1  # the reply waited for an fsync
    fsync.fail = True
    with pytest.raises(redis.ConnectionError):
        r.execute_command("V.CREATE", "b", 8, "VQUANT", "int8")
    fsync.fail = False
    r2 = redis.Redis(port=srv.port, retry=no_retry())
    with pytest.raises(redis.ResponseError, match=r"^MISCONF Errors writing"):
        r2.execute_command("V.CREATE", "c", 8, "VQUANT", "int8")
    assert r2.execute_command("V.INFO", "a").startswith(b"session_idx")  # reads work
    with pytest.raises(redis.ResponseError, match=r"^MISCONF"):
        r2.execute_command("KV.PREFIX.COMMIT")
    assert r2.execute_command("KV.PREFIX.SAVE") == b"OK"  # the way back
    r2.execute_command("V.CREATE", "c", 8, "VQUANT", "int8")
    assert r2.execute_command("KV.PREFIX.COMMIT") == b"OK"


class PartialWrite:
    """``write_all`` that writes the first bytes of a record and then fails, as a full
    disk does (``fail_with`` set), else writes normally."""

    def __init__(self) -> None:
        self.fail_with: int | None = None

    def __call__(self, fd: int, parts: Any, total: int | None = None) -> int:
        if self.fail_with is None:
            return real_write_all(fd, parts, total)
        os.write(fd, bytes(memoryview(parts[0]))[:9])  # a torn record's first bytes
        raise OSError(self.fail_with, os.strerror(self.fail_with))


real_write_all = wal_mod.write_all


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> PartialWrite:
    fake = PartialWrite()
    monkeypatch.setattr(wal_mod, "write_all", fake)
    return fake


def test_out_of_space_blocks_cuts_the_partial_record_and_resumes(
    tmp_path: Path, disk: PartialWrite
) -> None:
    vs, p = open_store(tmp_path, appendfsync="always")
    vs.create(b"a", 8, "int8")
    vs.create(b"b", 8, "int8")
    p.sync()
    wal = p.wal
    assert wal is not None
    good = wal.size
    disk.fail_with = errno.ENOSPC
    with pytest.raises(MisconfError, match=r"the refused record needs \d+ bytes") as info:
        vs.store(b"a", 0, 0, rows(4, 8))
    assert "No space left on device" in info.value.message
    assert wal_path(tmp_path, 0).stat().st_size == good  # the 9 bytes were cut
    assert wal.blocked is not None and wal.failure is None and wal.needed > 0
    assert p.write_refusal() is None  # the log refuses by itself, so drops can pass
    assert p.info()["wal_status"] == "err" and p.info()["wal_blocked_bytes"] == wal.needed
    assert vs.vstore_bytes == 0  # nothing of the refused write was applied
    disk.fail_with = None
    with pytest.raises(MisconfError):  # still blocked: only a probe unblocks
        vs.store(b"a", 0, 0, rows(4, 8))
    with pytest.raises(MisconfError):  # an eviction is not a client's drop
        vs.set_limits(max_sessions=2)
        vs.create(b"c", 8, "int8")
    assert vs.drop(b"b")  # a drop is tried, and it fits
    p.sync()  # the file is trusted: group commit goes on
    wal.unblock()
    vs.store(b"a", 0, 0, rows(4, 8))
    p.close()
    vs2, p2 = open_store(tmp_path)
    assert b"b" not in vs2 and vs2.describe(b"a").layers[0].held == 4
    p2.close()


def test_other_write_errors_fail_the_log(tmp_path: Path, disk: PartialWrite) -> None:
    vs, p = open_store(tmp_path)
    vs.create(b"a", 8, "int8")
    disk.fail_with = errno.EIO
    with pytest.raises(MisconfError, match=r"write of pion\.vstore\.wal\.0 failed"):
        vs.create(b"b", 8, "int8")
    assert p.wal is not None and p.wal.failure is not None and p.wal.blocked is None
    assert p.write_refusal() is not None
    disk.fail_with = None
    with pytest.raises(MisconfError):  # a failed log takes no write
        vs.create(b"c", 8, "int8")
    appended = p.wal.appended
    assert vs.drop(b"a")  # but a drop is applied, without a record
    assert b"a" not in vs and p.wal.appended == appended
    assert p.info()["wal_unlogged_drops"] == 1
    p.save(None)  # the way back from a failed log: a snapshot and a fresh log
    vs.create(b"b", 8, "int8")
    p.close()
    vs2, p2 = open_store(tmp_path)  # the snapshot kept the drop
    assert b"a" not in vs2 and b"b" in vs2
    p2.close()


def test_a_drop_that_cannot_be_written_is_applied_and_fails_the_log(
    tmp_path: Path, disk: PartialWrite
) -> None:
    """Blocked for lack of room, and not even the drop's small record fits: the drop is
    applied all the same, and since the log now lacks it, the log fails (its way back
    is the snapshot, which keeps the drop) instead of resuming on that file."""
    vs, p = open_store(tmp_path)
    vs.create(b"a", 8, "int8")
    vs.create(b"b", 8, "int8")
    disk.fail_with = errno.ENOSPC
    with pytest.raises(MisconfError):
        vs.store(b"a", 0, 0, rows(4, 8))
    assert p.wal is not None and p.wal.blocked is not None
    assert vs.drop(b"b")
    assert b"b" not in vs
    assert p.wal.failure is not None and p.write_refusal() is not None
    assert p.info()["wal_unlogged_drops"] == 1
    disk.fail_with = None
    p.save(None)
    p.close()
    vs2, p2 = open_store(tmp_path)
    assert b"a" in vs2 and b"b" not in vs2
    p2.close()


def test_a_cut_that_fails_fails_the_log(
    tmp_path: Path, disk: PartialWrite, monkeypatch: pytest.MonkeyPatch
) -> None:
    vs, p = open_store(tmp_path)

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(wal_mod.os, "ftruncate", no_truncate)
    disk.fail_with = errno.ENOSPC
    with pytest.raises(MisconfError, match="truncation after a failed write"):
        vs.create(b"a", 8, "int8")
    assert p.wal is not None and p.wal.failure is not None
    monkeypatch.undo()
    p.close()


def test_a_failed_log_still_takes_the_commands_that_free_space(
    server_factory: Callable[..., Any], tmp_path: Path, fsync: FsyncSpy
) -> None:
    """Over TCP with the log failed (an fsync error): writes answer -MISCONF, the
    commands that only free space are applied (memory only, counted), and the
    snapshot that ends the failure keeps their effect across a restart."""
    data = tmp_path / "d"
    srv = server_factory(dir=data, appendfsync="always")
    r = redis.Redis(port=srv.port, retry=no_retry())
    r.mset({"a": b"1", "b": b"2", "c": b"3"})
    r.hset("h", mapping={"f": b"1", "g": b"2"})
    r.zadd("z", {"m": 1.0, "n": 2.0})
    r.execute_command("KV.PREFIX.REGISTER", "ns", 8, "int8")
    fsync.fail = True
    with pytest.raises(redis.ConnectionError):  # its fsync failed: no reply
        r.set("d", b"4")
    fsync.fail = False
    r2 = redis.Redis(port=srv.port, retry=no_retry())
    with pytest.raises(redis.ResponseError, match=r"^MISCONF .*only free space"):
        r2.set("e", b"5")
    assert r2.delete("a") == 1
    assert r2.unlink("b") == 1
    assert r2.hdel("h", "f") == 1
    assert r2.zrem("z", "m") == 1
    assert r2.execute_command("KV.PREFIX.DROP", "ns") == 1
    assert r2.info("persistence")["wal_unlogged_drops"] == 6  # the drop is two sessions
    assert r2.execute_command("KV.PREFIX.SAVE") == b"OK"  # the way back
    srv.stop()
    srv = server_factory(dir=data)
    r3 = redis.Redis(port=srv.port)
    assert r3.exists("a", "b") == 0 and r3.get("c") == b"3"
    assert r3.hgetall("h") == {b"g": b"2"} and r3.zrange("z", 0, -1) == [b"n"]
    assert r3.execute_command("KV.PREFIX.LOOKUP", "ns") == b"MISS"
