"""The blocking commands with real concurrent redis-py clients: served in arrival
order, timing out (the null array, or the null bulk for BLMOVE), woken by a push from
any connection, by LMOVE/ZADD/ZUNIONSTORE/RENAME onto the key, after (not inside) the
EXEC that filled the key, forgotten when they disconnect, ended by CLIENT UNBLOCK;
inside EXEC they answer at once. Their replies and errors, where nothing waits, are
compared byte for byte with redis-server's in RESP2 and RESP3. Under ``-w N`` a
waiter is woken by its own worker's keys only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pion.server.run import ServerThread
from pion.wire import affinity_port
from support import ServerProcess
from support.keyspace import RawClient, RedisServer


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


class Blocked(threading.Thread):
    """One client running one blocking command on its own connection."""

    def __init__(self, port: int, *cmd: Any) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis(port=port, socket_timeout=30)
        self.id = self.r.client_id()  # connected before it blocks: arrival order is ours
        self.cmd = cmd
        self.result: Any = "not yet"

    def run(self) -> None:
        try:
            got = self.r.execute_command(*self.cmd)
        except redis.ResponseError as exc:
            self.result = exc
            return
        self.result = list(got) if isinstance(got, tuple) else got


def _blocked_now(port: int) -> int:
    info = redis.Redis(port=port).info("clients")
    return int(info["blocked_clients"])


def _wait_for(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _blocked(port: int, *cmd: Any) -> Blocked:
    """Start ``cmd`` on its own client and return once the server has it waiting."""
    before = _blocked_now(port)
    t = Blocked(port, *cmd)
    t.start()
    _wait_for(lambda: _blocked_now(port) > before)
    return t


def test_waiters_are_served_in_arrival_order(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    waiters = [_blocked(server.port, "BLPOP", "q", "other", 10) for _ in range(3)]
    r.rpush("q", "a", "b")
    waiters[0].join(5)
    waiters[1].join(5)
    assert waiters[0].result == [b"q", b"a"] and waiters[1].result == [b"q", b"b"]
    assert waiters[2].result == "not yet" and r.exists("q") == 0
    r.lpush("other", "c")  # any of its keys
    waiters[2].join(5)
    assert waiters[2].result == [b"other", b"c"]


def test_timeouts_answer_the_null_reply(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    started = time.monotonic()
    assert r.blpop(["q"], 0.2) is None
    assert time.monotonic() - started >= 0.19
    assert r.blmove("q", "d", 0.1, "LEFT", "RIGHT") is None
    assert r.bzpopmin("z", 0.1) is None
    raw = RawClient(server.port)
    assert raw.call("BLMPOP", "0.05", "1", "q", "LEFT").raw == b"*-1\r\n"
    assert raw.call("BRPOPLPUSH", "q", "d", "0.05").raw == b"$-1\r\n"
    raw.close()


def test_a_disconnected_waiter_is_forgotten(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    gone = RawClient(server.port)
    gone.send("BLPOP", "q", "0")
    _wait_for(lambda: _blocked_now(server.port) == 1)
    gone.close()
    _wait_for(lambda: _blocked_now(server.port) == 0)
    later = _blocked(server.port, "BLPOP", "q", 10)
    r.rpush("q", "x")
    later.join(5)
    assert later.result == [b"q", b"x"]
    assert r.exists("q") == 0


def test_woken_after_the_exec_that_fills_the_key(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    waiter = _blocked(server.port, "BLPOP", "q", 10)
    with r.pipeline(transaction=True) as p:
        p.rpush("q", "a")
        p.llen("q")  # inside EXEC the waiter has not taken it yet
        p.rpush("q", "b")
        assert p.execute() == [1, 1, 2]
    waiter.join(5)
    assert waiter.result == [b"q", b"a"]
    assert r.lrange("q", 0, -1) == [b"b"]


def test_inside_exec_blocking_commands_answer_at_once(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    with r.pipeline(transaction=True) as p:
        p.blpop("q", 0)
        p.rpush("q", "a")
        p.blpop("q", 0)
        assert p.execute() == [None, 1, (b"q", b"a")]


def test_moves_stores_and_renames_wake_waiters(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    chained = _blocked(server.port, "BLMOVE", "src", "dst", "LEFT", "RIGHT", 10)
    on_dst = _blocked(server.port, "BRPOP", "dst", 10)
    r.rpush("src", "v")
    chained.join(5)
    on_dst.join(5)
    assert chained.result == b"v" and on_dst.result == [b"dst", b"v"]
    zmax = _blocked(server.port, "BZPOPMAX", "z", 10)
    r.zadd("z", {"a": 1, "b": 2})
    zmax.join(5)
    assert zmax.result == [b"z", b"b", 2.0]
    stored = _blocked(server.port, "BZMPOP", 10, 1, "u", "MIN", "COUNT", 5)
    r.zunionstore("u", ["z"])
    stored.join(5)
    assert stored.result == [b"u", [[b"a", b"1"]]]
    renamed = _blocked(server.port, "BLMPOP", 10, 2, "x", "target", "RIGHT", "COUNT", 2)
    r.rpush("tmp", "1", "2", "3")
    r.rename("tmp", "target")
    renamed.join(5)
    assert renamed.result == [b"target", [b"3", b"2"]]
    assert r.lrange("target", 0, -1) == [b"1"]


def test_a_waiter_on_a_key_of_another_type_keeps_waiting(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    waiter = _blocked(server.port, "BZPOPMIN", "k", 10)
    r.rpush("k", "a")  # a list: not what BZPOPMIN takes
    time.sleep(0.1)
    assert waiter.result == "not yet"
    r.delete("k")
    r.zadd("k", {"m": 3})
    waiter.join(5)
    assert waiter.result == [b"k", b"m", 3.0]


def test_client_unblock_ends_a_wait(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    assert r.client_unblock(r.client_id()) == 0  # not waiting
    waiter = _blocked(server.port, "BLPOP", "q", 0)
    assert r.client_unblock(waiter.id) == 1
    waiter.join(5)
    assert waiter.result is None  # as if timed out
    erred = _blocked(server.port, "BLMOVE", "q", "d", "LEFT", "LEFT", 0)
    assert r.client_unblock(erred.id, error=True) == 1
    erred.join(5)
    assert isinstance(erred.result, redis.ResponseError)
    assert str(erred.result) == "UNBLOCKED client unblocked via CLIENT UNBLOCK"
    assert r.client_unblock(erred.id) == 0
    assert _blocked_now(server.port) == 0


CASES = [
    ["BLPOP", "l", "0"],
    ["BLPOP", "l", "missing", "0.01"],
    ["BRPOP", "l", "2"],
    ["BLPOP", "str", "0.01"],
    ["BLPOP", "l", "-1"],
    ["BLPOP", "l", "x"],
    ["BLPOP", "l", "inf"],
    ["BLPOP", "l", "nan"],
    ["BLPOP", "l", "1e20"],
    ["BLMOVE", "l", "d", "LEFT", "RIGHT", "0"],
    ["BLMOVE", "l", "d", "up", "RIGHT", "0"],
    ["BLMOVE", "l", "str", "LEFT", "RIGHT", "0"],
    ["BRPOPLPUSH", "l", "d", "0"],
    ["BLMPOP", "0", "1", "l", "LEFT", "COUNT", "5"],
    ["BLMPOP", "0", "0", "l", "LEFT"],
    ["BLMPOP", "-1", "1", "l", "LEFT"],
    ["BLMPOP", "0.01", "2", "missing", "l", "RIGHT", "COUNT", "0"],
    ["BZPOPMIN", "z", "0"],
    ["BZPOPMAX", "missing", "z", "0"],
    ["BZPOPMIN", "str", "0"],
    ["BZMPOP", "0", "1", "z", "MAX", "COUNT", "2"],
    ["BZMPOP", "0", "1", "z", "LEFT"],
    ["BZMPOP", "0.01", "1", "missing", "MIN"],
    ["BLPOP", "missing", "0.01"],
    ["CLIENT", "UNBLOCK", "x"],
    ["CLIENT", "UNBLOCK", "99999"],
    ["CLIENT", "UNBLOCK", "99999", "foo"],
    ["CLIENT", "UNBLOCK", "99999", "error"],
    ["CLIENT", "UNBLOCK", "99999", "timeout", "extra"],
]


@pytest.mark.parametrize("proto", [2, 3])
def test_replies_and_errors_match_redis(
    oracle: RedisServer, server: ServerThread, proto: int
) -> None:
    pair = RawClient(oracle.port), RawClient(server.port)
    for c in pair:
        c.call("FLUSHALL")
        if proto == 3:
            c.call("HELLO", "3")
        c.call("RPUSH", "l", *"abcdefghij")
        c.call("ZADD", "z", "1", "a", "2", "b", "3.5", "c", "4", "d")
        c.call("SET", "str", "v")
    for cmd in CASES:
        want, got = pair[0].call(*cmd), pair[1].call(*cmd)
        assert want.raw == got.raw, (cmd, want.raw, got.raw)
    for c in pair:
        c.close()


def test_under_w_n_a_waiter_is_woken_by_its_own_workers_keys(tmp_path: Path) -> None:
    """Each worker has its own keyspace: a push to the same key name on another worker
    does not wake the waiter; one on its own worker does."""
    srv = ServerProcess(
        tmp_path, ["-w", "2", "--independent-workers", "--dir", str(tmp_path / "d")]
    )
    try:
        port0 = affinity_port(srv.port, 0)
        waiter = _blocked(port0, "BLPOP", "q", 0)
        srv.worker(1).rpush("q", "elsewhere")
        assert srv.worker(1).llen("q") == 1
        waiter.join(0.3)
        assert waiter.result == "not yet"
        srv.worker(0).rpush("q", "here")
        waiter.join(5)
        assert waiter.result == [b"q", b"here"]
    finally:
        srv.close()
