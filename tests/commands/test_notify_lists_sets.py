"""Keyspace notifications of the list and set commands, and of the blocking pops,
against a real redis-server as the oracle: with ``notify-keyspace-events`` set, each
command publishes the same ``__keyspace@0__``/``__keyevent@0__`` messages, in the
same order, as redis-server 7's do (``new`` when a push, SADD, SMOVE or a STORE
creates its key; LMOVE's push on the destination before the pop on the source;
SMOVE's srem before the destination's new and sadd; ``del`` when a key's last element
goes). A blocked client served by another's push publishes its pop's events right
after the push's, as Redis does once the pushing command is done."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support import wait_until
from support.keyspace import RawClient, oracle_pair, read_reply


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("notify-lists-oracle")) as ports:
        yield ports


# A command whose reply is random (SPOP of some of a set): only its events compare.
RANDOM_REPLY = "?"

LISTS = [
    ["LPUSH", "l", "a", "b", "c"],
    ["RPUSH", "l", "d"],
    ["LPUSHX", "nol", "x"],
    ["RPUSHX", "l", "e"],
    ["LPOP", "l"],
    ["RPOP", "l", "2"],
    ["LPOP", "l", "0"],
    ["LPOP", "nol"],
    ["RPOP", "nol", "3"],
    ["LSET", "l", "0", "z"],
    ["LSET", "l", "9", "z"],
    ["LSET", "nol", "0", "z"],
    ["LINSERT", "l", "BEFORE", "z", "y"],
    ["LINSERT", "l", "AFTER", "nope", "y"],
    ["LINSERT", "nol", "AFTER", "z", "y"],
    ["RPUSH", "l", "y", "y", "q"],
    ["LREM", "l", "0", "y"],
    ["LREM", "l", "1", "nope"],
    ["LTRIM", "l", "0", "-1"],
    ["LTRIM", "l", "1", "-1"],
    ["LTRIM", "nol", "0", "1"],
    ["RPUSH", "m", "1", "2"],
    ["LMOVE", "m", "n", "LEFT", "RIGHT"],
    ["LMOVE", "m", "n", "RIGHT", "LEFT"],
    ["RPOPLPUSH", "n", "n"],
    ["LMOVE", "nol", "n", "LEFT", "LEFT"],
    ["SET", "str", "v"],
    ["LMOVE", "n", "str", "LEFT", "LEFT"],
    ["LPUSH", "str", "x"],
    ["LMPOP", "2", "nol", "n", "LEFT", "COUNT", "5"],
    ["LMPOP", "1", "nol", "LEFT"],
    ["RPUSH", "t", "1"],
    ["LTRIM", "t", "1", "0"],
    ["RPUSH", "r", "a", "a"],
    ["LREM", "r", "0", "a"],
    ["RPUSH", "p", "a"],
    ["RPOP", "p"],
    ["RPUSH", "p", "a", "b"],
    ["RPOP", "p", "5"],
    ["RPUSH", "one", "a"],
    ["RPOPLPUSH", "one", "one"],
    ["LMOVE", "one", "two", "LEFT", "LEFT"],
    # The blocking forms with something to pop answer at once, announced the same.
    ["RPUSH", "b1", "1", "2"],
    ["BLPOP", "nol", "b1", "0"],
    ["BRPOPLPUSH", "b1", "b2", "0"],
    ["BLMOVE", "b2", "b1", "LEFT", "LEFT", "0"],
    ["BLMPOP", "0", "1", "b1", "RIGHT", "COUNT", "2"],
    ["ZADD", "bz", "1", "a", "2", "b"],
    ["BZPOPMAX", "bz", "0"],
    ["BZPOPMIN", "nol", "bz", "0"],
    ["DEL", "l", "two"],
    # A transaction's and a script's commands announce as they run.
    ["MULTI"],
    ["RPUSH", "tx", "a"],
    ["LMOVE", "tx", "tx2", "LEFT", "LEFT"],
    ["EXEC"],
    [
        "EVAL",
        "redis.call('rpush', KEYS[1], 'a', 'b'); return redis.call('lpop', KEYS[1])",
        "1",
        "ev",
    ],
]

SETS = [
    ["SADD", "s", "a", "b", "c", "1"],
    ["SADD", "s", "a"],
    ["SREM", "s", "a", "zz"],
    ["SREM", "s", "zz"],
    ["SREM", "nos", "zz"],
    ["SMOVE", "s", "d", "b"],
    ["SADD", "d", "c"],
    ["SMOVE", "s", "d", "c"],
    ["SMOVE", "s", "d", "1"],
    ["SMOVE", "d", "d", "b"],
    ["SMOVE", "d", "d", "nope"],
    ["SMOVE", "nos", "d", "x"],
    ["SET", "str", "v"],
    ["SMOVE", "d", "str", "b"],
    ["SMOVE", "nos", "str", "x"],
    ["SADD", "str", "x"],
    ["SADD", "one", "x"],
    ["SPOP", "one"],
    ["SPOP", "one"],
    ["SADD", "ints", "1", "2"],
    ["SPOP", "ints", "5"],
    ["SADD", "three", "1", "2", "3"],
    ["SPOP", "three", "0"],
    [RANDOM_REPLY, "SPOP", "three"],
    [RANDOM_REPLY, "SPOP", "three", "1"],
    ["SPOP", "nos", "2"],
    ["SADD", "x", "1", "2", "3"],
    ["SADD", "y", "2", "3", "4"],
    ["SINTERSTORE", "dst", "x", "y"],
    ["SUNIONSTORE", "dst", "x", "y"],
    ["SDIFFSTORE", "dst", "x", "y"],
    ["SINTERSTORE", "dst", "x", "nos"],
    ["SINTERSTORE", "dst", "x", "nos"],
    ["SINTERSTORE", "dst", "x", "y", "nos"],
    ["SDIFFSTORE", "str", "x", "y"],
    ["SUNIONSTORE", "dst2", "nos"],
    ["SUNIONSTORE", "dst3", "x"],
    ["SDIFFSTORE", "x", "x", "x"],
    ["SINTERCARD", "1", "y"],
    ["SINTER", "y", "dst3"],
    ["DEL", "d", "dst3"],
    ["MULTI"],
    ["SADD", "tx", "a"],
    ["SMOVE", "tx", "tx2", "a"],
    ["EXEC"],
    [
        "EVAL",
        "redis.call('sadd', KEYS[1], 'a'); return redis.call('srem', KEYS[1], 'a')",
        "1",
        "ev",
    ],
]


def _collect(sub: RawClient, marker: bytes) -> list[bytes]:
    sub.send("PING", marker)
    got = []
    while (reply := read_reply(sub.f)).value != [b"pong", marker]:
        got.append(reply.raw)
    return got


def _transcript(port: int, flags: str, commands: list[list[str]]) -> list[list[bytes]]:
    actor, sub = RawClient(port), RawClient(port)
    try:
        actor.call("FLUSHALL")
        sub.call("PSUBSCRIBE", "__key*__:*")
        assert actor.call("CONFIG", "SET", "notify-keyspace-events", flags).raw == b"+OK\r\n"
        out = []
        for i, cmd in enumerate(commands):
            if cmd[0] == RANDOM_REPLY:
                actor.call(*cmd[1:])
                out.append([b"(random)", *_collect(sub, b"s%d" % i)])
            else:
                out.append([actor.call(*cmd).raw, *_collect(sub, b"s%d" % i)])
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        actor.close()
        sub.close()


@pytest.mark.parametrize("flags", ["KEA", "KEAn", "El", "Ks", "Eg", "KEls", "Kz$", ""])
@pytest.mark.parametrize("family", ["lists", "sets"])
def test_events_match_redis(servers: tuple[int, int], flags: str, family: str) -> None:
    oracle, pion = servers
    commands = LISTS if family == "lists" else SETS
    expected = _transcript(oracle, flags, commands)
    assert _transcript(pion, flags, commands) == expected
    if flags == "":
        assert all(len(step) == 1 for step in expected)  # nothing published
    if flags == "KEA":
        assert sum(len(step) - 1 for step in expected) > len(commands)  # it announces


# (blocked command, the push that serves it): the pop announced is the blocked one's.
BLOCKED = [
    (["BLPOP", "bl", "0"], ["RPUSH", "bl", "a"]),
    (["BRPOP", "nol", "bl", "0"], ["RPUSH", "bl", "a", "b"]),
    (["BLMOVE", "src", "dst", "LEFT", "RIGHT", "0"], ["LPUSH", "src", "x", "y"]),
    (["BRPOPLPUSH", "ring", "ring", "0"], ["RPUSH", "ring", "z"]),
    (["BLMPOP", "0", "2", "e1", "e2", "RIGHT", "COUNT", "3"], ["RPUSH", "e2", "1", "2"]),
    (["BZPOPMIN", "z", "0"], ["ZADD", "z", "1", "a"]),
    (["BZMPOP", "0", "1", "z", "MAX", "COUNT", "2"], ["ZADD", "z", "1", "a", "2", "b", "3", "c"]),
]


def _blocked_transcript(port: int) -> list[list[bytes]]:
    actor, sub, blocked = RawClient(port), RawClient(port), RawClient(port)
    try:
        actor.call("FLUSHALL")
        sub.call("PSUBSCRIBE", "__key*__:*")
        actor.call("CONFIG", "SET", "notify-keyspace-events", "EAn")
        out = []
        for i, (waits, push) in enumerate(BLOCKED):
            blocked.send(*waits)
            wait_until(
                lambda: b"blocked_clients:1\r\n" in actor.call("INFO", "clients").value,
                what="the client blocked",
            )
            pushed = actor.call(*push).raw
            served = read_reply(blocked.f).raw
            out.append([pushed, served, *_collect(sub, b"b%d" % i)])
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        for c in (actor, sub, blocked):
            c.close()


def test_served_blocked_pops_announce_as_redis(servers: tuple[int, int]) -> None:
    oracle, pion = servers
    expected = _blocked_transcript(oracle)
    assert _blocked_transcript(pion) == expected
    # BLPOP served by RPUSH: the push's new and rpush, then the pop's lpop and del.
    events = [m.split(b"__keyevent@0__:")[1].split(b"\r\n")[0] for m in expected[0][2:]]
    assert events == [b"new", b"rpush", b"lpop", b"del"]
