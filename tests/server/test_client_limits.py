"""Limits over all clients together: ``maxmemory-clients`` (the largest holders are
disconnected, with a log line) and ``maxclients`` (Redis's reply, then close; the
open-files limit is made to fit it, so descriptors are never what refuses a client)."""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from support import (
    MiB,
    encode_command,
    read_reply_line,
    running_server,
    store_fetchable,
    wait_until,
)

ROWS, DIM = 256, 8192
FETCH = encode_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)


def _hog(port: int, fetches: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(FETCH * fetches)
    return s


def _closed_by_server(s: socket.socket, timeout: float = 10) -> bool:
    """True once the server has dropped ``s`` (reads reach EOF or a reset)."""
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not s.recv(1 << 20):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_maxmemory_clients_disconnects_the_largest_holders(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal", "--maxmemory-clients", "100mb") as srv:
        r = srv.client()
        values = store_fetchable(r, "big", ROWS, DIM)
        # The normal client is exempt, so only hogs can be chosen.
        assert r.execute_command("CLIENT", "NO-EVICT", "ON") == b"OK"
        base = srv.rss()
        hogs = [_hog(srv.port, 50) for _ in range(3)]
        peak = base
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, srv.rss())
            assert r.ping()
            time.sleep(0.05)
        stats = r.info("stats")
        assert stats["evicted_clients"] >= 1
        assert peak - base < 250 * MiB, f"server grew {(peak - base) / MiB:.0f} MiB"
        memory = r.info("memory")
        assert memory["maxmemory_clients"] == 100 * MiB
        assert memory["mem_clients_normal"] <= 100 * MiB
        assert "maxmemory-clients: client buffers hold" in srv.log()
        assert "disconnecting client id=" in srv.log()
        assert sum(_closed_by_server(h, timeout=2) for h in hogs) >= 1
        back = r.execute_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)
        assert np.array_equal(np.frombuffer(back, "<f4").reshape(ROWS, DIM), values)
        for h in hogs:
            h.close()
        r.close()


def test_maxmemory_clients_can_be_set_at_runtime(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal") as srv, srv.client() as r:
        assert r.config_get("maxmemory-clients") == {"maxmemory-clients": str(2048 * MiB)}
        store_fetchable(r, "big", ROWS, DIM)
        r.execute_command("CLIENT", "NO-EVICT", "ON")
        hog = _hog(srv.port, 30)
        # The hog holds more than the bound set below, and nobody was evicted for it
        # under the default bound.
        wait_until(
            lambda: r.info("memory")["mem_clients_normal"] > 16 * MiB,
            what="the hog's replies held by the server",
        )
        assert r.info("stats")["evicted_clients"] == 0
        assert r.config_set("maxmemory-clients", "16mb")
        # The next report from any client enforces it; the hog holds the most.
        assert r.ping()
        assert _closed_by_server(hog)
        assert r.info("stats")["evicted_clients"] == 1
        hog.close()


def test_maxclients_refuses_with_redis_text(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal", "--maxclients", "3") as srv:
        kept = [srv.client() for _ in range(3)]
        for c in kept:
            assert c.ping()
        with srv.connect() as extra:
            assert read_reply_line(extra) == b"-ERR max number of clients reached\r\n"
            assert extra.recv(10) == b""
        assert all(c.ping() for c in kept)
        assert kept[0].info("stats")["rejected_connections"] == 1
        assert kept[0].info("clients")["maxclients"] == 3
        kept.pop().close()
        # The slot frees when the server reads the close: wait for that, then use it.
        wait_until(lambda: kept[0].info("clients")["connected_clients"] == 2, what="the slot")
        with srv.client() as again:  # a slot freed is a slot usable
            assert again.ping()
        for c in kept:
            c.close()


def test_descriptor_limit_is_never_what_refuses_a_client(tmp_path: Path) -> None:
    """With ``ulimit -n 64`` and the default maxclients, the server lowers maxclients
    to fit (64 - 32 reserved, as Redis) and says so; client 33 is then answered
    ``max number of clients reached`` instead of hanging in the accept queue."""
    with running_server(tmp_path, "--no-wal", nofile=(64, 64)) as srv:
        assert "maxclients has been reduced to 32" in srv.log()
        clients: list[socket.socket] = []
        try:
            served = refused = 0
            for _ in range(48):
                s = srv.connect(timeout=10)
                clients.append(s)
                s.sendall(b"PING\r\n")
                reply = read_reply_line(s)
                if reply == b"+PONG\r\n":
                    served += 1
                else:
                    assert reply == b"-ERR max number of clients reached\r\n"
                    refused += 1
            assert served == 32
            assert refused == 16
        finally:
            for s in clients:
                s.close()


def test_open_files_limit_is_raised_to_fit(tmp_path: Path) -> None:
    """A soft limit below maxclients + 32 is raised (up to the hard limit)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    args = ("--no-wal", "--maxclients", "100")
    with running_server(tmp_path, *args, nofile=(64, hard)) as srv:
        soft_now = psutil.Process(srv.proc.pid).rlimit(psutil.RLIMIT_NOFILE)[0]
        assert soft_now >= 132
        assert "maxclients has been reduced" not in srv.log()
        with srv.client() as r:
            assert r.info("clients")["maxclients"] == 100


def test_no_redis_py_retry_hides_the_refusal(tmp_path: Path) -> None:
    """redis-py surfaces the refusal as an error, not a hang."""
    with running_server(tmp_path, "--no-wal", "--maxclients", "1") as srv:
        first = srv.client()
        assert first.ping()
        second = srv.client(retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.RedisError, match="max number of clients reached"):
            second.ping()
        second.close()
        first.close()
