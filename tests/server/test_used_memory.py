"""``used_memory`` follows the kernel, and ``--maxmemory`` bounds it (issue 32).

A real ``pion-server`` process per test (its memory is its own): tens of MB of each
family raise ``used_memory`` by what they raise ``RssAnon`` by, within a stated factor;
and the issue's case, 1 MB APPENDs to one key under ``--maxmemory 100mb``, is refused
with Redis's ``-OOM`` before ``used_memory`` or ``RssAnon`` passes the limit, nothing
of the refused write applied. redis-server 7.0.15 answers the same error text (after
the fact: its last accepted APPEND takes it past the limit)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from support import ServerProcess, wait_until

MB = 1 << 20
# How far apart the growth of used_memory and of RssAnon may be, either way. What the
# accounting leaves out (allocator slack, CPython's free lists, the dict tables' spare
# slots) is what this allows; measured 1.02x-1.34x on CPython 3.11 / glibc.
FACTOR = 1.5
# Each family's fill, in bytes of payload (fields, members, values).
FILL = 32 * MB
# The case: --maxmemory and the APPEND chunk.
LIMIT = 100 * MB
# How far the process's anonymous memory may pass --maxmemory, at its peak (APPEND's
# copy of the old value included): what the computed number does not see, the
# allocator's freed heap (up to 64 MiB kept: pion.server.malloc; here the 1 MB
# arguments', a few MB). Measured: 7%.
RSS_MARGIN = 0.15


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in bytes (RssAnon, VmHWM ...)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _anon(pid: int) -> int:
    return _status(pid, "RssAnon")


# Payload bytes one pipelined batch of a container family adds.
_MEMBERS = [b"m%097d" % j for j in range(1000)]  # 1000 distinct members, 98 bytes each
_BATCH = {"hash": 1000 * 198, "list": 1000 * 100, "set": 1000 * 98, "zset": 1000 * 98}
_BATCH["stream"] = 100 * 1000


def _fill(r: redis.Redis, family: str) -> None:
    """About FILL bytes of payload (values, fields, members) in ``family``."""
    p = r.pipeline(transaction=False)
    if family == "string":
        for i in range(FILL // 1000):
            p.set(b"s:%d" % i, b"x" * 1000)
            if i % 1000 == 999:
                p.execute()
    elif family == "append":
        for _ in range(FILL // MB):
            r.append("grown", b"a" * MB)
    for k in range(FILL // _BATCH.get(family, FILL + 1)):
        if family == "hash":
            p.hset(b"h:%d" % k, mapping=dict.fromkeys(_MEMBERS, b"v" * 100))
        elif family == "list":
            p.rpush(b"l:%d" % k, *[b"v" * 100] * 1000)
        elif family == "set":
            p.sadd(b"S:%d" % k, *_MEMBERS)
        elif family == "zset":
            p.zadd(b"z:%d" % k, dict(zip(_MEMBERS, range(1000), strict=True)))
        else:  # a stream: 100 entries of one 1000-byte field
            for _ in range(100):
                p.xadd("st", {"f": b"v" * 1000})
        if k % 10 == 9:
            p.execute()
    p.execute()


@pytest.fixture
def pion(spawn_server: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    yield spawn_server("--no-wal")


@pytest.mark.parametrize("family", ["string", "append", "hash", "list", "set", "zset", "stream"])
def test_used_memory_grows_as_rss_anon_does(pion: ServerProcess, family: str) -> None:
    r = pion.client()
    before, anon_before = r.info("memory"), _anon(pion.pid)
    _fill(r, family)
    after, anon_after = r.info("memory"), _anon(pion.pid)
    grown = after["used_memory"] - before["used_memory"]
    anon_grown = anon_after - anon_before
    assert grown > FILL * 0.9, (family, grown)  # the payload, at least, is counted
    assert anon_grown / FACTOR < grown < anon_grown * FACTOR, (family, grown, anon_grown)
    # And the whole number, startup included, is the kernel's within the same factor.
    used, anon = after["used_memory"], anon_after
    assert anon / FACTOR < used < anon * FACTOR, (family, used, anon)
    assert after["used_memory"] == (
        after["used_memory_startup"] + after["used_memory_dataset"] + after["mem_clients_normal"]
    )
    r.close()


def _append_until_refused(r: redis.Redis, pid: int | None) -> tuple[int, str, int]:
    """APPEND 1 MB chunks to one key until refused: (chunks accepted, the error, the
    highest RssAnon seen after a command; 0 without ``pid``)."""
    chunk = b"a" * MB
    highest = 0
    for n in range(2 * LIMIT // MB):
        try:
            r.append("k", chunk)
        except redis.exceptions.ResponseError as exc:
            return n, str(exc), highest
        if pid is not None:
            highest = max(highest, _anon(pid))
    raise AssertionError("never refused")


def test_append_is_refused_before_used_memory_passes_maxmemory(
    spawn_server: Callable[..., ServerProcess],
) -> None:
    srv = spawn_server("--no-wal", "--maxmemory", "100mb")
    r = srv.client()
    accepted, error, highest = _append_until_refused(r, srv.pid)
    mem = r.info("memory")
    assert error.startswith("command not allowed when used memory > 'maxmemory'")
    assert accepted > 0
    assert r.strlen("k") == accepted * MB  # nothing of the refused write, nothing lost
    # The limit holds for the computed number, and the kernel's stays near it.
    assert mem["maxmemory"] == LIMIT
    assert mem["used_memory_peak"] <= LIMIT
    assert highest <= LIMIT * (1 + RSS_MARGIN), highest
    # Peak resident memory, transient copies included (VmHWM also counts mapped
    # files, the interpreter's and the libraries' code: RssFile, about 20 MB).
    hwm, files = _status(srv.pid, "VmHWM"), _status(srv.pid, "RssFile")
    assert hwm - files <= LIMIT * (1 + RSS_MARGIN), (hwm, files)
    # The refusal lasts (the write still does not fit) and reads keep working.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.append("k", b"a" * MB)
    assert r.strlen("k") == accepted * MB
    r.delete("k")  # freeing makes room again
    assert r.append("k", b"a" * MB) == MB
    r.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[redis.Redis]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed")
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        [exe, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    r = redis.Redis(unix_socket_path=str(sock), socket_timeout=30)
    try:
        wait_until(sock.exists, timeout=30, what="redis-server socket")
        yield r
    finally:
        r.close()
        proc.kill()
        proc.wait()


def test_redis_refuses_the_same_case_with_the_same_text(
    spawn_server: Callable[..., ServerProcess], redis_server: redis.Redis
) -> None:
    redis_server.config_set("maxmemory", LIMIT)  # noeviction, Redis's default
    theirs, their_error, _ = _append_until_refused(redis_server, None)
    their_mem = redis_server.info("memory")
    srv = spawn_server("--no-wal", "--maxmemory", "100mb", "--maxmemory-policy", "noeviction")
    r = srv.client()
    ours, our_error, _ = _append_until_refused(r, None)
    assert their_error == our_error or our_error.startswith(their_error.rstrip("."))
    # Redis checks after the fact: its last APPEND took used_memory past the limit.
    # Pion checks the write's growth (and APPEND's copy of the old value) first.
    assert their_mem["used_memory"] > LIMIT
    assert r.info("memory")["used_memory"] <= LIMIT
    assert 0 < ours <= theirs
    r.close()
