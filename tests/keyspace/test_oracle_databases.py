"""redis-server as the oracle for the numbered databases: SELECT, MOVE, SWAPDB, COPY ...
DB, FLUSHDB/FLUSHALL, DBSIZE, INFO keyspace, CLIENT INFO's ``db=``, SELECT inside
MULTI and inside a script, and the keyspace notifications of each, byte for byte in
RESP2 and RESP3.

Each script runs on a fresh pair of connections after FLUSHALL on both servers; a
reply that holds what only one server can know (INFO's other fields, CLIENT INFO's
addresses) is cut to the part the test is about before it is compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import pytest

from support.keyspace import RawClient, Reply, oracle_pair, read_reply

Script = Sequence[Sequence[bytes | str | int]]

SELECT_ERRORS: Script = [
    ["SELECT", "0"],
    ["SELECT", "15"],
    ["SELECT", "16"],
    ["SELECT", "-1"],
    ["SELECT", "x"],
    ["SELECT", "+1"],
    ["SELECT", "2147483648"],
    ["SELECT", "99999999999999999999"],
    ["SELECT"],
    ["SELECT", "1", "2"],
    ["DBSIZE"],
]

MOVES: Script = [
    ["SET", "a", "1"],
    ["SET", "b", "2", "PX", "100000"],
    ["HSET", "h", "f", "v"],
    ["RPUSH", "l", "x", "y"],
    ["MOVE", "a", "1"],
    ["MOVE", "a", "1"],
    ["MOVE", "missing", "1"],
    ["MOVE", "b", "0"],
    ["MOVE", "b", "16"],
    ["MOVE", "b", "-1"],
    ["MOVE", "b", "x"],
    ["MOVE", "b", "2"],
    ["MOVE", "h", "3"],
    ["MOVE", "l", "3"],
    ["DBSIZE"],
    ["SELECT", "1"],
    ["GET", "a"],
    ["DBSIZE"],
    ["SET", "h", "blocker"],
    ["SELECT", "2"],
    ["PERSIST", "b"],  # its deadline moved with it
    ["PERSIST", "b"],
    ["SELECT", "3"],
    ["HGETALL", "h"],
    ["LRANGE", "l", "0", "-1"],
    ["MOVE", "h", "1"],
    ["DEL", "h"],
    ["KEYS", "*"],
    ["SCAN", "0", "COUNT", "100"],
    ["RANDOMKEY"],
    ["SELECT", "9"],
    ["RANDOMKEY"],
    ["KEYS", "*"],
]

SWAPS: Script = [
    ["SET", "zero", "0"],
    ["SELECT", "1"],
    ["SET", "one", "1"],
    ["SET", "both", "1"],
    ["SELECT", "0"],
    ["SET", "both", "0"],
    ["SWAPDB", "0", "1"],
    ["GET", "zero"],
    ["GET", "one"],
    ["GET", "both"],
    ["DBSIZE"],
    ["SWAPDB", "1", "1"],
    ["SWAPDB", "0", "16"],
    ["SWAPDB", "16", "x"],
    ["SWAPDB", "x", "0"],
    ["SWAPDB", "0", "y"],
    ["SWAPDB", "-1", "0"],
    ["SWAPDB", "0"],
    ["SWAPDB", "0", "5"],
    ["DBSIZE"],
    ["SELECT", "5"],
    ["MGET", "zero", "one", "both"],
]

COPIES: Script = [
    ["SET", "s", "v", "EX", "1000"],
    ["COPY", "s", "s", "DB", "0"],
    ["COPY", "s", "s"],
    ["COPY", "s", "s", "DB", "1"],
    ["COPY", "s", "s", "DB", "1"],
    ["COPY", "s", "s", "DB", "1", "REPLACE"],
    ["COPY", "s", "t", "DB", "16"],
    ["COPY", "s", "t", "DB", "x"],
    ["COPY", "s", "t", "DB"],
    ["COPY", "missing", "t", "DB", "2"],
    ["SELECT", "1"],
    ["TTL", "s"],
    ["GET", "s"],
    ["FLUSHDB"],
    ["DBSIZE"],
    ["SELECT", "0"],
    ["DBSIZE"],
    ["SELECT", "4"],
    ["SET", "k", "v"],
    ["FLUSHALL"],
    ["DBSIZE"],
    ["SELECT", "0"],
    ["DBSIZE"],
]

TRANSACTIONS: Script = [
    ["SET", "k", "zero"],
    ["MULTI"],
    ["SELECT", "2"],
    ["SET", "k", "two"],
    ["SELECT", "99"],
    ["GET", "k"],
    ["EXEC"],
    ["GET", "k"],
    ["SELECT", "0"],
    ["GET", "k"],
    ["EVAL", "redis.call('SELECT', 3); redis.call('SET', 'k', 'three'); return 1", "0"],
    ["GET", "k"],
    ["SELECT", "3"],
    ["GET", "k"],
    ["EVAL", "return redis.call('SELECT', 42)", "0"],
    ["EVAL", "redis.call('SELECT', 0); return redis.call('GET', 'k')", "0"],
    ["GET", "k"],
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-databases")) as ports:
        yield ports


def _open(port: int, proto: int) -> RawClient:
    c = RawClient(port)
    c.call("FLUSHALL")
    if proto == 3:
        c.call("HELLO", "3")
    return c


def _run(servers: tuple[int, int], script: Script, proto: int) -> None:
    clients = [_open(port, proto) for port in servers]
    try:
        for command in script:
            want, got = (c.call(*command) for c in clients)
            assert got.raw == want.raw, f"{command}: pion {got.raw!r}, redis {want.raw!r}"
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("proto", [2, 3])
@pytest.mark.parametrize(
    "script",
    [SELECT_ERRORS, MOVES, SWAPS, COPIES, TRANSACTIONS],
    ids=["select", "move", "swapdb", "copy-flush", "multi-script"],
)
def test_scripts_match_redis(servers: tuple[int, int], script: Script, proto: int) -> None:
    _run(servers, script, proto)


def _keyspace_lines(reply: Reply) -> list[str]:
    # Redis 7.0 writes dbN:keys=..,expires=..,avg_ttl=..; pion adds Redis 7.4's
    # subexpiry. avg_ttl is compared where no key has a deadline (both answer 0).
    text = bytes(reply.value).decode()
    return [
        m.group(1) for m in re.finditer(r"^(db\d+:keys=\d+,expires=\d+,avg_ttl=\d+)", text, re.M)
    ]


def test_info_keyspace_and_client_db_match_redis(servers: tuple[int, int]) -> None:
    clients = [_open(port, 2) for port in servers]
    try:
        for c in clients:
            c.call("SET", "a", "1")
            c.call("SELECT", "7")
            c.call("MSET", "x", "1", "y", "2")
            c.call("SELECT", "12")
        want, got = (_keyspace_lines(c.call("INFO", "keyspace")) for c in clients)
        assert got == want == ["db0:keys=1,expires=0,avg_ttl=0", "db7:keys=2,expires=0,avg_ttl=0"]
        for c in clients:
            assert b" db=12 " in bytes(c.call("CLIENT", "INFO").value)
        want_db, got_db = (c.call("CONFIG", "GET", "databases").raw for c in clients)
        assert got_db == want_db == b"*2\r\n$9\r\ndatabases\r\n$2\r\n16\r\n"
    finally:
        for c in clients:
            c.close()


NOTIFIED: Script = [
    ["SET", "a", "1"],
    ["MOVE", "a", "3"],
    ["SELECT", "3"],
    ["COPY", "a", "b", "DB", "5"],
    ["COPY", "a", "b", "DB", "5", "REPLACE"],
    ["DEL", "a"],
    ["SWAPDB", "5", "6"],
    ["SELECT", "6"],
    ["EXPIRE", "b", "100"],
    ["FLUSHALL"],
]


def _messages(sub: RawClient, marker: bytes) -> list[list[bytes]]:
    """The messages the subscriber got up to the marker's."""
    out: list[list[bytes]] = []
    while True:
        message = [bytes(v) for v in read_reply(sub.f).value]
        if message[-1] == marker:
            return out
        out.append(message)


@pytest.mark.parametrize("proto", [2, 3])
def test_notifications_name_the_database_as_redis_does(
    servers: tuple[int, int], proto: int
) -> None:
    got: list[list[list[bytes]]] = []
    for port in servers:
        c = _open(port, proto)
        c.call("CONFIG", "SET", "notify-keyspace-events", "KEAn")
        sub = RawClient(port)
        sub.call("PSUBSCRIBE", "__key*__:*")
        sub.call("SUBSCRIBE", "marker")
        try:
            for command in NOTIFIED:
                c.call(*command)
            c.call("PUBLISH", "marker", "end")
            got.append(_messages(sub, b"end"))
        finally:
            c.call("CONFIG", "SET", "notify-keyspace-events", "")
            c.close()
            sub.close()
    want, mine = got
    assert [b"__keyevent@0__:move_from", b"a"] in [m[2:] for m in want]
    assert [b"__keyevent@3__:move_to", b"a"] in [m[2:] for m in want]
    assert mine == want


def test_expiry_is_announced_in_the_keys_database(servers: tuple[int, int]) -> None:
    got: list[list[list[bytes]]] = []
    for port in servers:
        c = _open(port, 2)
        c.call("CONFIG", "SET", "notify-keyspace-events", "Ex")
        sub = RawClient(port)
        sub.call("PSUBSCRIBE", "__keyevent@*__:expired")
        sub.call("SUBSCRIBE", "marker")
        try:
            c.call("SELECT", "3")
            c.call("SET", "k", "v", "PX", "1")
            while c.call("EXISTS", "k").value:  # lazily or actively, it expires
                pass
            c.call("PUBLISH", "marker", "end")
            got.append(_messages(sub, b"end"))
        finally:
            c.call("CONFIG", "SET", "notify-keyspace-events", "")
            c.close()
            sub.close()
    want, mine = got
    assert (
        mine == want == [[b"pmessage", b"__keyevent@*__:expired", b"__keyevent@3__:expired", b"k"]]
    )
