"""Disk full, for real: the data directory on a small tmpfs (the tests run as root)
fills up. Writes are refused with -MISCONF, reads are still served, nothing
acknowledged is lost (across a kill -9 too), and writes resume by themselves once
space is freed: appending to the same log once it has room (no snapshot of the whole
store is needed), with drops let through meanwhile."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from support import f16_rows, no_retry

DIM = 256  # 512-byte fp16 rows


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    size = getattr(request, "param", "2m")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Take every free byte of the file system."""
    with open(path, "wb", buffering=0) as f:
        chunk = b"\xff" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]


def _store(r: redis.Redis, row: int, count: int, seed: int) -> tuple[int, bytes]:
    blob = f16_rows(count, DIM, seed)
    r.execute_command("V.STOREBATCH", "s", 0, row, count, blob, "FMT", "F16")
    return row, blob


def _check(r: redis.Redis, acked: list[tuple[int, bytes]]) -> None:
    for row, blob in acked:
        count = len(blob) // (DIM * 2)
        got = r.execute_command("V.FETCH", "s", 0, "RANGE", row, row + count, "FMT", "NATIVE")
        assert got == blob, f"rows {row}.. lost"


def test_disk_full(spawn_server: Callable[..., Any], small_disk: Path) -> None:
    data = small_disk / "data"
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    r.execute_command("V.CREATE", "s", DIM, "VQUANT", "fp16")
    acked = [_store(r, 0, 64, 1)]  # 32 KB
    filler = small_disk / "filler"
    _fill(filler)

    # Full: the write is refused and nothing of it is applied; reads still work.
    refused = (
        r"^MISCONF Errors writing to the write-ahead log "
        r"\(write of pion\.vstore\.wal\.0 failed: No space left on device\)"
    )
    with pytest.raises(redis.ResponseError, match=refused):
        _store(r, 100, 64, 2)
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        _store(r, 200, 1, 3)
    assert b"layer_0_tokens:64" in r.execute_command("V.INFO", "s")
    _check(r, acked)
    info = r.info("persistence")
    assert info["wal_status"] == "err" and info["aof_last_write_status"] == "err"

    # A crash while failing loses nothing acknowledged.
    srv.kill()
    filler.unlink()
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    _check(r, acked)
    assert b"layer_0_tokens:64" in r.execute_command("V.INFO", "s")

    # Full again; then space comes back and writes resume without a restart.
    _fill(filler)
    with pytest.raises(redis.ResponseError):
        _store(r, 100, 64, 4)
    _check(r, acked)
    filler.unlink()
    deadline = time.monotonic() + 15
    while True:
        try:
            acked.append(_store(r, 100, 64, 5))
            break
        except redis.ResponseError as exc:
            assert "write-ahead log" in str(exc)
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(0.1)
    acked.append(_store(r, 300, 8, 6))
    assert r.info("persistence")["wal_status"] == "ok"
    srv.kill()
    srv = spawn_server("--dir", str(data))
    r = srv.client()
    _check(r, acked)
    srv.kill()


@pytest.mark.parametrize("small_disk", ["4m"], indirect=True)
def test_the_log_that_filled_the_disk_resumes_without_a_snapshot(
    spawn_server: Callable[..., Any], small_disk: Path
) -> None:
    """Issue 10: when the log itself filled the disk, writes came back only once the
    free space exceeded all stored data (a snapshot of everything), DROP was refused and
    nothing said how much room was needed. Now: the partial record is cut, drops go
    through, the refusal names the bytes needed, and appending resumes once there is
    room for the next records, with far less free than the store holds."""
    big, small = small_disk / "reserve-big", small_disk / "reserve-small"
    big.write_bytes(b"\xff" * (1536 << 10))
    small.write_bytes(b"\xff" * (300 << 10))
    data = small_disk / "data"
    wal = data / "pion.vstore.wal.0"
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    r.execute_command("KV.PREFIX.REGISTER", "ns", DIM, "fp16")
    r.execute_command("V.STOREBATCH", "ns_pk", 0, 0, 8, f16_rows(8, DIM, 7), "FMT", "F16")
    r.execute_command("V.CREATE", "s", DIM, "VQUANT", "fp16")
    acked: list[tuple[int, bytes]] = []
    refusal = ""
    for i in range(1000):  # 32 KB records until the log fills the disk
        try:
            acked.append(_store(r, 64 * i, 64, 100 + i))
        except redis.ResponseError as exc:
            refusal = str(exc)
            break
    assert len(acked) > 40, "the disk filled too early"
    assert re.search(r"the refused record needs \d+ bytes; \d+ are free", refusal), refusal
    assert "only free space" in refusal and "KV.PREFIX.DROP" in refusal
    info = r.info("persistence")
    assert info["wal_status"] == "err" and info["wal_blocked_bytes"] > 32 << 10
    # The partial record the failed write left was cut: the file ends at its last record.
    assert wal.stat().st_size == info["wal_bytes"]
    _check(r, acked)

    # A little room (less than the next record plus the margin): still blocked, but a
    # drop goes through, and it is logged (it survives the restart below).
    small.unlink()
    assert r.execute_command("KV.PREFIX.DROP", "ns") == 1
    time.sleep(2.5)  # two probes: neither may resume with this little room
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        _store(r, 64 * len(acked), 64, 1)

    # Room for more records, though far less than the store holds: appending resumes.
    big.unlink()
    stored = r.info("memory")["vstore_bytes"]
    free = shutil.disk_usage(small_disk).free
    # The old way back (a snapshot of everything) needed the store plus 1 MiB free.
    assert free < stored + (1 << 20), (free, stored)
    deadline = time.monotonic() + 15
    while True:
        try:
            acked.append(_store(r, 64 * len(acked), 64, 2))
            break
        except redis.ResponseError as exc:
            assert "write-ahead log" in str(exc)
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(0.1)
    acked.append(_store(r, 64 * len(acked), 64, 3))
    info = r.info("persistence")
    assert info["wal_status"] == "ok" and info["wal_blocked_bytes"] == 0
    assert not (data / "pion.vstore.0").exists()  # no snapshot was needed
    srv.kill()
    err = srv.log()
    assert re.search(r"no room for a record of \d+ bytes \(\d+ bytes free", err), err
    assert "has room again" in err

    srv = spawn_server("--dir", str(data))
    r = srv.client()
    _check(r, acked)
    assert r.execute_command("KV.PREFIX.LOOKUP", "ns") == b"MISS"
    with pytest.raises(redis.ResponseError, match="session not found"):
        r.execute_command("V.INFO", "ns_pk")
    srv.kill()


def test_ssm_writes_are_refused_drops_go_through_and_writes_resume(
    spawn_server: Callable[..., Any], small_disk: Path
) -> None:
    """The SSM store's records share the blocked log: SSM.PREFIX.STORE is refused and
    applies nothing, SSM.PREFIX.DROP goes through (and is logged), and writes resume
    once the file system has room again; nothing acknowledged is lost across a restart."""
    data = small_disk / "data"
    reserve = small_disk / "reserve"
    reserve.write_bytes(b"\xff" * (64 << 10))
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    keep = b"k" * 3000
    r.execute_command("SSM.PREFIX.STORE", "keep", 0, keep)
    r.execute_command("SSM.PREFIX.STORE", "gone", 0, b"g" * 3000)
    r.execute_command("SSM.PREFIX.STORE", "gone", 1, b"")
    filler = small_disk / "filler"
    _fill(filler)

    # Full: the write is refused, nothing of it is applied; reads still work.
    refused = (
        r"^MISCONF Errors writing to the write-ahead log "
        r"\(write of pion\.vstore\.wal\.0 failed: No space left on device\)"
    )
    with pytest.raises(redis.ResponseError, match=refused) as info:
        r.execute_command("SSM.PREFIX.STORE", "keep", 1, b"x" * 8192)
    assert "SSM.PREFIX.DROP" in str(info.value)
    assert r.execute_command("SSM.PREFIX.FETCH", "keep", 1) is None
    assert r.execute_command("SSM.PREFIX.FETCH", "keep", 0) == keep
    persistence = r.info("persistence")
    assert persistence["wal_status"] == "err"
    assert persistence["wal_blocked_bytes"] > 8192
    held = r.info("memory")["ssm_bytes"]
    assert held == 6000

    # A little room (far less than the probe needs to resume): the log stays blocked,
    # but a drop goes through, and replacing a blob is still refused.
    reserve.unlink()
    assert r.execute_command("SSM.PREFIX.DROP", "gone") == b"OK"
    assert r.execute_command("SSM.PREFIX.FETCH", "gone", 0) is None
    assert r.execute_command("SSM.PREFIX.FETCH", "gone", 1) is None
    assert r.info("memory")["ssm_bytes"] == 3000
    time.sleep(1.5)  # a probe: it may not resume with this little room
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        r.execute_command("SSM.PREFIX.STORE", "keep", 0, b"y" * 8192)
    assert r.execute_command("SSM.PREFIX.FETCH", "keep", 0) == keep
    assert r.info("persistence")["wal_status"] == "err"

    # Space comes back: writes resume on the same log, without a restart or a snapshot.
    filler.unlink()
    later = b"l" * 8192
    deadline = time.monotonic() + 15
    while True:
        try:
            r.execute_command("SSM.PREFIX.STORE", "keep", 1, later)
            break
        except redis.ResponseError as exc:
            assert "write-ahead log" in str(exc)
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(0.1)
    r.execute_command("SSM.PREFIX.STORE", "new", 3, b"n" * 100)
    persistence = r.info("persistence")
    assert persistence["wal_status"] == "ok" and persistence["wal_blocked_bytes"] == 0
    assert not (data / "pion.ssm.0").exists()  # no snapshot was needed
    srv.kill()

    srv = spawn_server("--dir", str(data))
    r = srv.client()
    assert r.execute_command("SSM.PREFIX.FETCH", "keep", 0) == keep
    assert r.execute_command("SSM.PREFIX.FETCH", "keep", 1) == later
    assert r.execute_command("SSM.PREFIX.FETCH", "new", 3) == b"n" * 100
    assert r.execute_command("SSM.PREFIX.FETCH", "gone", 0) is None
    assert r.execute_command("SSM.PREFIX.FETCH", "gone", 1) is None
    srv.kill()


def test_the_keyspace_can_free_space_on_a_full_disk(
    spawn_server: Callable[..., Any], small_disk: Path
) -> None:
    """Issue 21: on a full disk DEL, UNLINK and FLUSHALL answered -MISCONF, so the
    keyspace could not be relieved. Commands that only free space are accepted and
    logged (they survive a kill -9); writes stay refused until there is room."""
    data = small_disk / "data"
    reserve = small_disk / "reserve"
    reserve.write_bytes(b"\xff" * (64 << 10))
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    for i in range(12):
        r.set(f"k{i}", bytes([i]) * 4096)
    r.hset("h", mapping={f"f{i}": b"x" * 512 for i in range(6)})
    r.zadd("z", {f"m{i}": i for i in range(6)})
    filler = small_disk / "filler"
    _fill(filler)

    with pytest.raises(redis.ResponseError, match=r"^MISCONF .*No space left") as info:
        r.set("new", b"n" * 8192)
    assert "DEL" in str(info.value) and "FLUSHALL" in str(info.value)
    reserve.unlink()  # a little room: far less than the probe needs to resume writes
    assert r.delete("k0", "k1") == 2
    assert r.unlink("k2") == 1
    assert r.hdel("h", "f0", "f1") == 2
    assert r.zrem("z", "m0") == 1
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        r.set("k3", b"changed")
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        r.hset("h", "f9", b"new")
    persistence = r.info("persistence")
    assert persistence["wal_status"] == "err" and persistence["wal_unlogged_drops"] == 0

    # The frees were logged: a crash keeps them (and everything acknowledged before).
    srv.kill()
    filler.unlink()
    srv = spawn_server("--dir", str(data), "--appendfsync", "always")
    r = srv.client(retry=no_retry())
    assert r.exists("k0", "k1", "k2") == 0
    assert [r.get(f"k{i}") for i in range(3, 12)] == [bytes([i]) * 4096 for i in range(3, 12)]
    assert sorted(r.hgetall("h")) == [f"f{i}".encode() for i in range(2, 6)]
    assert r.zrange("z", 0, -1) == [f"m{i}".encode() for i in range(1, 6)]

    # Full again: FLUSHDB and FLUSHALL are accepted too, and logged.
    reserve.write_bytes(b"\xff" * (64 << 10))
    _fill(filler)
    with pytest.raises(redis.ResponseError, match=r"^MISCONF "):
        r.set("new", b"n" * 8192)
    reserve.unlink()
    assert r.flushdb() is True
    r2 = srv.client(retry=no_retry())
    assert r2.flushall() is True
    assert r.dbsize() == 0
    srv.kill()
    filler.unlink()
    srv = spawn_server("--dir", str(data))
    r = srv.client()
    assert r.dbsize() == 0
    r.set("after", b"1")  # and writes work again
    srv.kill()
