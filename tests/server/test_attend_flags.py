"""The attention tier's command-line flags reach a real `pion-server` process: table
sizes, byte budgets, --fa-window, and where the binary lane listens."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis


def _ping_lane(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack("<HBI", 0xCA5E, 0xFF, 0))
        return sock.recv(7)


def test_flags(spawn_server: Callable[..., Any]) -> None:
    srv = spawn_server(
        *("--attend-slots", "2", "--attend-cold-slots", "1", "--attend-maxmemory", "1mb"),
        *("--ssm-maxmemory", "1kb", "--fa-window", "4"),
    )
    c: redis.Redis = srv.client()
    memory = c.info("memory")
    assert (memory["attend_slots"], memory["attend_cold_slots"]) == (2, 1)
    assert (memory["attend_maxmemory"], memory["ssm_maxmemory"]) == (1 << 20, 1024)
    k = np.arange(2 * 10 * 4, dtype=np.float32).reshape(2, 10, 4) / 100
    for sid in ("a", "b", "c"):
        c.execute_command("ATTEND.PREFIX.STORE", sid, 0, 2, 10, 4, k.tobytes(), k.tobytes())
    assert [c.execute_command("ATTEND.PREFIX.LOOKUP", s, 0) for s in "abc"] == [
        b"COLD",
        b"HIT",
        b"HIT",
    ]
    # --fa-window 4: a query that sends none sees the last 4 tokens only.
    q = np.ones((2, 1, 4), np.float32)
    default = c.execute_command("ATTEND.PREFIX.QUERY", "b", 0, 2, 4, 1, q.tobytes())
    last4 = c.execute_command("ATTEND.PREFIX.QUERY", "b", 0, 2, 4, 1, q.tobytes(), 4)
    full = c.execute_command("ATTEND.PREFIX.QUERY", "b", 0, 2, 4, 1, q.tobytes(), 0)
    assert default == last4 != full
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        c.execute_command("SSM.PREFIX.STORE", "s", 0, b"x" * 1025)
    assert _ping_lane(srv.port + 1) == struct.pack("<HBI", 0xCA5E, 0, 0)


def test_binary_lane_flags(spawn_server: Callable[..., Any]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    srv = spawn_server("--binary-port", str(free))
    assert _ping_lane(free) == struct.pack("<HBI", 0xCA5E, 0, 0)
    srv.stop()
    off = spawn_server("--no-binary-lane")
    assert off.client().ping()
    with pytest.raises(OSError):
        _ping_lane(off.port + 1)
