"""Disk full, for real: the data directory on a small tmpfs (the tests run as root)
fills up. Writes are refused with -MISCONF, reads are still served, nothing
acknowledged is lost (across a kill -9 too), and writes resume by themselves once
space is freed."""

from __future__ import annotations

import errno
import os
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
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
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
