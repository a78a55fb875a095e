"""COMMAND's key positions against redis-server's: for every command of our table that
redis-server also has, ``COMMAND INFO`` gives the same first key, last key and step (the
keyspace commands), and a command redis-server does not have reports none, except
the hash-field expiry commands of Redis 7.4 (newer than the local redis-server), which
report Redis 7.4's (1, 1, 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pion.commands import COMMAND_TABLE
from pion.server.run import ServerThread
from support.keyspace import RawClient, RedisServer


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("oracle"))
    yield server
    server.stop()


def _positions(port: int, name: str) -> tuple[int, int, int] | None:
    c = RawClient(port)
    try:
        reply = c.call("COMMAND", "INFO", name.lower()).value
    finally:
        c.close()
    assert isinstance(reply, list) and len(reply) == 1
    entry = reply[0]
    if entry is None:
        return None
    return int(entry[3]), int(entry[4]), int(entry[5])


# Redis 7.4's hash-field expiry: its COMMAND INFO gives each first key 1, last 1, step 1.
REDIS_74 = {
    name: (1, 1, 1)
    for name in [
        "HEXPIRE",
        "HPEXPIRE",
        "HEXPIREAT",
        "HPEXPIREAT",
        "HTTL",
        "HPTTL",
        "HEXPIRETIME",
        "HPEXPIRETIME",
        "HPERSIST",
    ]
}


def test_key_positions_match_redis_server(server: ServerThread, oracle: RedisServer) -> None:
    theirs_only, differ = [], []
    for name in sorted(COMMAND_TABLE):
        ours = _positions(server.port, name)
        assert ours is not None, name
        theirs = _positions(oracle.port, name)
        if theirs is None and name in REDIS_74:
            if ours != REDIS_74[name]:
                differ.append(f"{name}: ours {ours}, Redis 7.4 {REDIS_74[name]}")
        elif theirs is None:
            if ours != (0, 0, 0):
                theirs_only.append(f"{name}: {ours} (redis-server has no such command)")
        elif ours != theirs:
            differ.append(f"{name}: ours {ours}, redis-server {theirs}")
    assert not differ and not theirs_only, "\n".join(differ + theirs_only)
    # Not vacuous: the keyspace commands do take keys.
    assert _positions(server.port, "MSET") == (1, -1, 2)
    assert _positions(server.port, "KV.PREFIX.LOOKUP") == (0, 0, 0)
