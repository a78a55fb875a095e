"""Keyspace notifications against a real redis-server as the oracle: with
``notify-keyspace-events`` set, the commands of each family that Pion serves publish
the same ``__keyspace@0__``/``__keyevent@0__`` messages, in the same order, as
redis-server 7's do; a RESP3 client subscribed to its own events gets them as pushes
before its command's reply; and with the flags off nothing is published."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pion.server.run import ServerThread
from support.keyspace import RawClient, oracle_pair, read_reply


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("notify-oracle")) as ports:
        yield ports


# Commands run before notifications are enabled (their events are not compared).
SETUP = [["ZADD", "z", "1", "a", "2", "b", "3", "c"], ["SET", "gone", "v"]]

COMMANDS = [
    ["SET", "a", "1"],
    ["SET", "a", "2", "EX", "100"],
    ["SET", "a", "3", "KEEPTTL"],
    ["SET", "b", "x", "NX"],
    ["SET", "b", "y", "NX"],
    ["SET", "b", "z", "GET"],
    ["MSET", "c", "1", "d", "2"],
    ["MSETNX", "c", "1", "new", "2"],
    ["MSETNX", "m1", "1", "m2", "2"],
    ["INCR", "c"],
    ["DECRBY", "c", "5"],
    ["INCRBYFLOAT", "c", "1.5"],
    ["INCR", "a2"],
    ["APPEND", "e", "hi"],
    ["APPEND", "e", "there"],
    ["SETRANGE", "e", "1", "X"],
    ["SETRANGE", "f", "0", ""],
    ["SETRANGE", "e", "0", ""],
    ["SETBIT", "bits", "7", "1"],
    ["SETBIT", "bits", "7", "1"],
    ["SETBIT", "bits", "x", "1"],
    ["SETBIT", "bits2", "3", "0"],
    ["SETNX", "g", "1"],
    ["SETNX", "g", "2"],
    ["SETEX", "h", "100", "v"],
    ["PSETEX", "h", "100000", "v"],
    ["GETSET", "h", "w"],
    ["GETDEL", "h"],
    ["GETDEL", "nothing"],
    ["SET", "gx", "v"],
    ["GETEX", "gx"],
    ["GETEX", "gx", "PERSIST"],
    ["GETEX", "gx", "EX", "100"],
    ["GETEX", "gx", "PERSIST"],
    ["GETEX", "gx", "PXAT", "1"],
    ["GETEX", "nothing", "EX", "100"],
    ["DEL", "a", "b", "zz", "a"],
    ["UNLINK", "m1", "m2"],
    ["EXPIRE", "c", "100"],
    ["PEXPIRE", "c", "100000", "NX"],
    ["PERSIST", "c"],
    ["PERSIST", "c"],
    ["EXPIRE", "nothing", "100"],
    ["EXPIRE", "c", "-1"],
    ["RENAME", "d", "d2"],
    ["RENAME", "d2", "d2"],
    ["SET", "d3", "x"],
    ["RENAME", "d2", "d3"],
    ["RENAMENX", "d3", "d4"],
    ["RENAMENX", "d4", "e"],
    ["COPY", "e", "e2"],
    ["COPY", "e", "e2"],
    ["COPY", "e", "e2", "REPLACE"],
    ["HSET", "hh", "f", "v", "g", "w"],
    ["HSET", "hh", "f", "v2"],
    ["HMSET", "hh", "k", "v"],
    ["HINCRBY", "hh", "n", "2"],
    ["HINCRBYFLOAT", "hh", "x", "1.5"],
    ["HSETNX", "hh", "f", "no"],
    ["HSETNX", "hh", "new", "yes"],
    ["HDEL", "hh", "f"],
    ["HDEL", "hh", "none"],
    ["HDEL", "hh", "g", "k", "n", "x", "new"],
    ["INCR", "z"],
    ["ZADD", "z2", "1", "a", "2", "b"],
    ["ZADD", "z2", "1", "a"],
    ["ZADD", "z2", "CH", "5", "a"],
    ["ZADD", "z2", "INCR", "1", "b"],
    ["ZADD", "z2", "NX", "INCR", "1", "b"],
    ["ZINCRBY", "z2", "2", "c"],
    ["ZADD", "z2", "x", "a"],
    ["ZADD", "z3", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e", "6", "f", "7", "g"],
    ["ZPOPMIN", "z3"],
    ["ZPOPMAX", "z3", "0"],
    ["ZPOPMAX", "z3", "1"],
    ["ZMPOP", "2", "nothing", "z3", "MIN"],
    ["ZREMRANGEBYRANK", "z3", "0", "0"],
    ["ZREMRANGEBYSCORE", "z3", "10", "20"],
    ["ZREMRANGEBYSCORE", "z3", "5", "5"],
    ["ZREMRANGEBYLEX", "z3", "-", "+"],
    ["ZPOPMIN", "z3"],
    ["ZREM", "z", "a", "nope"],
    ["ZREM", "z", "b", "c"],
    ["SET", "short", "v", "PX", "1"],
]


def _collect(sub: RawClient, marker: bytes) -> list[bytes]:
    sub.send("PING", marker)
    got = []
    while (reply := read_reply(sub.f)).value != [b"pong", marker]:
        got.append(reply.raw)
    return got


def _transcript(port: int, flags: str) -> list[list[bytes]]:
    actor, sub = RawClient(port), RawClient(port)
    try:
        actor.call("FLUSHALL")
        for cmd in SETUP:
            actor.call(*cmd)
        sub.call("PSUBSCRIBE", "__key*__:*")
        assert actor.call("CONFIG", "SET", "notify-keyspace-events", flags).raw == b"+OK\r\n"
        out = []
        for i, cmd in enumerate(COMMANDS):
            out.append([actor.call(*cmd).raw, *_collect(sub, b"s%d" % i)])
        # Past its deadline: the read expires it (or the sweep did already): one
        # "expired" either way.
        time.sleep(0.05)
        out.append([actor.call("GET", "short").raw, *_collect(sub, b"last")])
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        actor.close()
        sub.close()


@pytest.mark.parametrize("flags", ["KEA", "KEAn", "Kg", "E$", "Eh", "KExz", "K", ""])
def test_events_match_redis(servers: tuple[int, int], flags: str) -> None:
    oracle, pion = servers
    expected = _transcript(oracle, flags)
    assert _transcript(pion, flags) == expected
    if flags in ("K", ""):
        assert all(len(step) == 1 for step in expected)  # nothing published


def _self_subscribed(port: int) -> list[bytes]:
    c = RawClient(port)
    try:
        c.call("HELLO", "3")
        c.call("CONFIG", "SET", "notify-keyspace-events", "KE$g")
        c.call("PSUBSCRIBE", "__key*__:*")
        c.send("SET", "own", "v")
        c.send("DEL", "own")
        c.send("PING", "end")
        got = []
        while (reply := read_reply(c.f)).value != b"end":
            got.append(reply.raw)
        c.call("CONFIG", "SET", "notify-keyspace-events", "")
        return got
    finally:
        c.close()


def test_resp3_own_events_come_before_the_reply(servers: tuple[int, int]) -> None:
    oracle, pion = servers
    expected = _self_subscribed(oracle)
    assert expected[2] == b"+OK\r\n"  # two pushes, then SET's reply
    assert _self_subscribed(pion) == expected


def test_the_expiry_sweep_announces_expired(server: ServerThread) -> None:
    """A key nobody touches again expires through the sweep, which announces it."""
    sub, actor = RawClient(server.port), RawClient(server.port)
    actor.call("CONFIG", "SET", "notify-keyspace-events", "Ex")
    sub.call("SUBSCRIBE", "__keyevent@0__:expired")
    actor.call("SET", "swept", "v", "PX", "20")
    assert read_reply(sub.f).value == [b"message", b"__keyevent@0__:expired", b"swept"]
    assert actor.call("EXISTS", "swept").value == 0
    # Off again: nothing more is announced.
    actor.call("CONFIG", "SET", "notify-keyspace-events", "")
    actor.call("SET", "quiet", "v", "PX", "1")
    time.sleep(0.05)
    assert actor.call("EXISTS", "quiet").value == 0  # expired, by the sweep or now
    actor.call("PUBLISH", "__keyevent@0__:expired", "marker")
    assert read_reply(sub.f).value == [b"message", b"__keyevent@0__:expired", b"marker"]
    sub.close()
    actor.close()
