"""Transactions beyond what redis-server can judge (``test_transactions_oracle.py``
compares the Redis part byte for byte): redis-py's default pipeline and watch(), WATCH
on V-store sessions and registry namespaces (written, dropped, evicted), V-store and
registry commands inside EXEC (offloaded conversions and streamed replies included),
the commands that cannot be queued, the bound on a transaction, and that a client's
watches die with its connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from pion.commands import transactions
from pion.commands.vstore import OFFLOAD_MIN_BYTES
from support.keyspace import RawClient

ROWS = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) / 3


@pytest.fixture
def srv(server_factory: Callable[..., Any]) -> Any:
    return server_factory(appendfsync="no", vstore_max_sessions=4)


def _r(srv: Any) -> redis.Redis:
    return redis.Redis(port=srv.port, socket_timeout=30)


def test_redis_py_pipeline_and_watch(srv: Any) -> None:
    r = _r(srv)
    pipe = r.pipeline()  # transactional by default: MULTI .. EXEC
    for i in range(100):
        pipe.set(f"k{i}", i)
    pipe.incr("k1").get("k1").hset("h", "f", "v").zadd("z", {"m": 1.5})
    assert pipe.execute() == [True] * 100 + [2, b"2", 1, 1]

    def bump(p: redis.client.Pipeline) -> None:
        value = int(p.get("k1") or 0)
        p.multi()
        p.set("k1", value + 1)

    assert r.transaction(bump, "k1") == [True]
    assert r.get("k1") == b"3"
    other = _r(srv)
    with r.pipeline() as p:
        p.watch("k1")
        other.set("k1", 100)
        p.multi()
        p.set("k1", 5)
        with pytest.raises(redis.WatchError):
            p.execute()
    assert r.get("k1") == b"100"
    pipe = r.pipeline()
    pipe.set("x", 1).incr("h").set("y", 2)  # a runtime error fails that command only
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        pipe.execute()
    assert r.get("x") == b"1" and r.get("y") == b"2"


def test_redis_py_pipeline_in_resp3(srv: Any) -> None:
    r = redis.Redis(port=srv.port, protocol=3, socket_timeout=30)
    pipe = r.pipeline()
    pipe.hset("h", mapping={"a": "1", "b": "2"}).hgetall("h").zadd("z", {"m": 2.5})
    pipe.zscore("z", "m").set("k", "v").get("k")
    assert pipe.execute() == [2, {b"a": b"1", b"b": b"2"}, 1, 2.5, True, b"v"]
    with r.pipeline() as p:
        p.watch("k")
        _r(srv).set("k", "w")
        p.multi()
        p.get("k")
        with pytest.raises(redis.WatchError):
            p.execute()


def _exec_after(srv: Any, name: str, change: Callable[[redis.Redis], object]) -> Any:
    """WATCH ``name``, let another client ``change`` something, then MULTI PING EXEC."""
    c = RawClient(srv.port)
    assert c.call("WATCH", name).raw == b"+OK\r\n"
    change(_r(srv))
    c.call("MULTI")
    c.call("PING")
    reply = c.call("EXEC").raw
    c.close()
    return reply


NIL = b"*-1\r\n"
RAN = b"*1\r\n+PONG\r\n"


def test_watch_sees_vstore_sessions(srv: Any) -> None:
    blob = ROWS.tobytes()
    assert _exec_after(srv, "s", lambda r: r.execute_command("V.CREATE", "s", 8)) == NIL
    assert (
        _exec_after(srv, "s", lambda r: r.execute_command("V.FETCH", "s", 0, "RANGE", 0, 1)) == RAN
    )
    assert (
        _exec_after(srv, "s", lambda r: r.execute_command("V.STOREBATCH", "s", 0, 0, 4, blob))
        == NIL
    )
    assert _exec_after(srv, "s", lambda r: r.execute_command("V.SNAPSHOT", "s")) == NIL
    assert _exec_after(srv, "s", lambda r: r.execute_command("V.CREATE", "t", 8)) == RAN
    assert _exec_after(srv, "s", lambda r: r.execute_command("KV.PREFIX.DROP", "s")) == RAN
    assert _exec_after(srv, "s", lambda r: r.set("s", 1)) == NIL  # the key of that name


def test_watch_sees_registry_namespaces_and_evictions(srv: Any) -> None:
    register = ("KV.PREFIX.REGISTER", "ns", 8, "fp16")
    assert _exec_after(srv, "ns", lambda r: r.execute_command(*register)) == NIL
    assert _exec_after(srv, "ns", lambda r: r.execute_command("KV.PREFIX.LOOKUP", "ns")) == RAN
    blob = ROWS.tobytes()
    store = ("V.STOREBATCH", "ns_pv", 0, 0, 4, blob)
    assert _exec_after(srv, "ns", lambda r: r.execute_command(*store)) == NIL
    assert _exec_after(srv, "ns", lambda r: r.execute_command("KV.PREFIX.DROP", "ns")) == NIL

    def crowd(r: redis.Redis) -> None:  # --vstore-max-sessions 4: LRU evicts ns
        for i in range(4):
            r.execute_command("KV.PREFIX.REGISTER", f"other{i}", 8, "fp16")

    _r(srv).execute_command(*register)
    assert _exec_after(srv, "ns", crowd) == NIL
    assert _r(srv).execute_command("KV.PREFIX.LOOKUP", "ns") == b"MISS"


def test_vstore_and_registry_commands_inside_exec(srv: Any) -> None:
    r = _r(srv)
    big = np.ones((OFFLOAD_MIN_BYTES // 32 + 1, 8), dtype=np.float32)  # offloaded alone
    pipe = r.pipeline()
    pipe.execute_command("KV.PREFIX.REGISTER", "p", 8, "fp16")
    pipe.execute_command("V.STOREBATCH", "p_pk", 0, 0, 4, ROWS.tobytes())
    pipe.execute_command("V.STOREBATCH", "p_pv", 0, 0, len(big), big.tobytes())
    pipe.execute_command("V.FETCH", "p_pk", 0, "RANGE", 0, 4)
    pipe.execute_command("V.FETCH", "p_pv", 0, "RANGE", 0, 2)
    pipe.execute_command("V.FETCH", "p_pk", "BATCH", 0, 1)
    pipe.execute_command("KV.PREFIX.LOOKUP", "p")
    pipe.execute_command("V.STOREBATCH", "p_pk", 0, 0, 4, b"short")  # fails alone
    got = pipe.execute(raise_on_error=False)
    assert got[:3] == [b"OK", b"OK", b"OK"]
    want = [r.execute_command("V.FETCH", "p_pk", 0, "RANGE", 0, 4)]
    want.append(r.execute_command("V.FETCH", "p_pv", 0, "RANGE", 0, 2))
    want.append(r.execute_command("V.FETCH", "p_pk", "BATCH", 0, 1))
    assert got[3:6] == want
    assert np.allclose(np.frombuffer(got[3], "<f4").reshape(4, 8), ROWS, atol=1e-2)
    assert got[6] == b"HIT"
    assert isinstance(got[7], redis.ResponseError) and "blob size" in str(got[7])


def test_client_reply_off_runs_deferred_commands_and_sends_nothing(srv: Any) -> None:
    """An offloaded store and a streamed fetch under CLIENT REPLY OFF: both run (the
    store is there afterwards), neither answers, and ON answers again."""
    big = np.ones((OFFLOAD_MIN_BYTES // 32 + 1, 8), dtype=np.float32)
    c = RawClient(srv.port)
    assert c.call("V.CREATE", "s", 8, "VQUANT", "fp16").raw == b":0\r\n"
    c.send("CLIENT", "REPLY", "OFF")
    c.send("V.STOREBATCH", "s", 0, 0, len(big), big.tobytes())
    c.send("V.FETCH", "s", 0, "RANGE", 0, len(big))
    c.send("CLIENT", "REPLY", "SKIP")
    c.send("CLIENT", "REPLY", "ON")
    assert c.call("ECHO", "after").raw == b"+OK\r\n"  # ON's reply, then ECHO's
    assert c.f.read(len(b"$5\r\nafter\r\n")) == b"$5\r\nafter\r\n"
    fetched = c.call("V.FETCH", "s", 0, "RANGE", 0, 2)
    assert fetched.raw.startswith(b"$64\r\n")
    assert np.array_equal(np.frombuffer(fetched.value, "<f4"), np.ones(16, np.float32))
    c.close()


@pytest.mark.parametrize(
    "command",
    [
        ["CLIENT", "ID"],
        ["HELLO", "3"],
        ["AUTH", "x"],
        ["KV.PREFIX.SAVE"],
        ["KV.PREFIX.COMMIT"],
        ["SHUTDOWN", "NOSAVE"],
    ],
)
def test_connection_state_commands_are_not_queued(srv: Any, command: list[str]) -> None:
    c = RawClient(srv.port)
    c.call("MULTI")
    assert c.call("SET", "a", "1").raw == b"+QUEUED\r\n"
    assert c.call(*command).raw == b"-ERR Command not allowed inside a transaction\r\n"
    assert c.call("EXEC").raw == (
        b"-EXECABORT Transaction discarded because of previous errors.\r\n"
    )
    assert c.call("GET", "a").raw == b"$-1\r\n"
    assert c.call("PING").raw == b"+PONG\r\n"  # the server and the connection live on
    c.close()


def test_quit_inside_multi_closes_and_forgets(srv: Any) -> None:
    c = RawClient(srv.port)
    c.call("WATCH", "a")
    c.call("MULTI")
    c.call("SET", "a", "1")
    assert c.call("QUIT").raw == b"+OK\r\n"
    assert c.f.read1(1) == b""
    c.close()
    assert _r(srv).get("a") is None


def test_disconnecting_forgets_watches_and_the_queue(srv: Any) -> None:
    state = srv.state
    for _ in range(3):
        c = RawClient(srv.port)
        c.call("WATCH", "a", "ns")
        c.call("MULTI")
        c.call("SET", "a", "1")
        c.close()
    r = _r(srv)
    deadline_ok = False
    for _ in range(1000):  # the server notices the hang-ups in its own time
        if not state.keyspace.watchers.names and not state.vstore.watchers.names:
            deadline_ok = True
            break
        r.ping()
    assert deadline_ok
    assert r.get("a") is None


def test_a_transaction_is_bounded(srv: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transactions, "MAX_QUEUED", 3)
    c = RawClient(srv.port)
    c.call("MULTI")
    for _ in range(3):
        assert c.call("INCR", "n").raw == b"+QUEUED\r\n"
    reply = c.call("INCR", "n").raw
    assert reply.startswith(b"-ERR a transaction holds at most 3 commands")
    assert c.call("EXEC").raw.startswith(b"-EXECABORT")
    c.call("MULTI")
    c.call("INCR", "n")
    assert c.call("EXEC").raw == b"*1\r\n:1\r\n"
    monkeypatch.setattr(transactions, "MAX_QUEUED_BYTES", 1000)
    c.call("MULTI")
    assert c.call("SET", "a", b"x" * 900).raw == b"+QUEUED\r\n"
    assert c.call("SET", "b", b"x" * 100).raw.startswith(b"-ERR a transaction holds")
    assert c.call("EXEC").raw.startswith(b"-EXECABORT")
    assert c.call("EXISTS", "a", "b").raw == b":0\r\n"
    c.close()


def test_exec_counts_its_commands(srv: Any) -> None:
    r = _r(srv)
    before = int(r.info("stats")["total_commands_processed"])
    pipe = r.pipeline()
    pipe.set("a", 1).set("b", 2).get("a")
    pipe.execute()
    after = int(r.info("stats")["total_commands_processed"])
    assert after - before == 1 + 5 + 3  # INFO, MULTI + 3 queued + EXEC, the 3 run
