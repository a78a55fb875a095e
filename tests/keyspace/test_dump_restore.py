"""DUMP and RESTORE against a real redis-server: values move both ways (redis-server's
compact encodings, LZF strings and integers read by pion-server; pion-server's payloads
restored by redis-server), hypothesis-generated values of every type, RESTORE's options
and errors compared byte for byte, hostile payloads answered with an error, and restored
keys kept across a restart and counted against ``--maxmemory``."""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.config import ServerConfig
from pion.keyspace.rdb import crc64, dump_payload
from pion.server.run import ServerThread
from support import data_budget
from support.keyspace import RawClient, damaged, oracle_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-dump")) as ports:
        clients = (redis.Redis(port=ports[0]), redis.Redis(port=ports[1]))
        yield clients
        for c in clients:
            c.close()


def _read(r: redis.Redis, key: str) -> Any:
    """A key's type and value, in a form that compares across servers."""
    kind = r.type(key).decode()
    if kind == "string":
        return kind, r.get(key)
    if kind == "list":
        return kind, r.lrange(key, 0, -1)
    if kind == "set":
        return kind, sorted(r.smembers(key))
    if kind == "hash":
        return kind, sorted(r.hgetall(key).items())
    if kind == "zset":
        return kind, r.zrange(key, 0, -1, withscores=True)
    return kind, None


def _write(r: redis.Redis, key: str, kind: str, items: list[bytes]) -> None:
    r.delete(key)
    if kind == "string":
        r.set(key, b"".join(items))
    elif kind == "list":
        r.rpush(key, *items)
    elif kind == "set":
        r.sadd(key, *items)
    elif kind == "hash":
        r.hset(key, mapping={f: f[::-1] + b"v" for f in items})
    else:
        r.zadd(key, {m: (len(m) * 7.25 - 3) if m else float("inf") for m in items})


def _move(src: redis.Redis, dst: redis.Redis, key: str) -> None:
    payload = src.dump(key)
    assert payload is not None
    dst.delete(key)
    assert dst.restore(key, 0, payload) == b"OK"
    assert _read(dst, key) == _read(src, key)


# Shapes that make redis-server pick each of its encodings: integers (intset, integer
# strings), short and long (LZF) strings, listpacks, and hashtables / skiplists / many
# quicklist nodes past the listpack limits.
SHAPES = {
    "small-ints": [b"1", b"-7", b"300", b"70000", b"-2147483648", b"9223372036854775807"],
    "words": [b"alpha", b"", b"\x00\r\n", b"007", b"1.5"],
    "long": [b"x" * 100, b"abc" * 400, bytes(range(256)) * 3],
    "many": [str(i).encode() * (i % 5 + 1) for i in range(700)],
    "many-ints": [str(i * 131 - 5000).encode() for i in range(600)],
    "big": [b"y" * 70_000, b"z" * 9000],
}


@pytest.mark.parametrize("kind", ["string", "list", "set", "hash", "zset"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_values_move_both_ways(
    pair: tuple[redis.Redis, redis.Redis], kind: str, shape: str
) -> None:
    oracle, pion = pair
    key = f"{kind}:{shape}"
    _write(oracle, key, kind, SHAPES[shape])
    _move(oracle, pion, key)  # redis-server's encodings, read by pion-server
    _move(pion, oracle, key)  # pion-server's payload, restored by redis-server


values = st.one_of(
    st.tuples(st.just("string"), st.lists(st.binary(max_size=40), min_size=1, max_size=3)),
    *(
        st.tuples(
            st.just(kind),
            st.lists(
                st.one_of(
                    st.binary(max_size=30),
                    st.integers(-(2**63), 2**63 - 1).map(lambda n: str(n).encode()),
                ),
                min_size=1,
                max_size=40,
            ),
        )
        for kind in ("list", "set", "hash", "zset")
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=values)
def test_generated_values_move_both_ways(
    pair: tuple[redis.Redis, redis.Redis], value: tuple[str, list[bytes]]
) -> None:
    oracle, pion = pair
    kind, items = value
    _write(oracle, "g", kind, items)
    _move(oracle, pion, "g")
    _move(pion, oracle, "g")


def _payload(r: redis.Redis) -> bytes:
    r.delete("src")
    r.rpush("src", "a", "b", "c")
    payload = r.dump("src")
    assert payload is not None
    return payload


def test_restore_options_and_errors_match_redis(pair: tuple[redis.Redis, redis.Redis]) -> None:
    oracle, _ = pair
    good = _payload(oracle)
    bad_crc = good[:-1] + bytes([good[-1] ^ 1])
    newer = good[:-10] + (13).to_bytes(2, "little") + good[-8:]
    cases: list[list[Any]] = [
        ["RESTORE", "k", 0, good],
        ["RESTORE", "k", 0, good],  # BUSYKEY
        ["RESTORE", "k", 0, good, "REPLACE"],
        ["RESTORE", "k2", -1, good],
        ["RESTORE", "k2", "x", good],
        ["RESTORE", "k2", 0, bad_crc],
        ["RESTORE", "k2", 0, newer],
        ["RESTORE", "k2", 0, b"short"],
        ["RESTORE", "k2", 0, good, "BOGUS"],
        ["RESTORE", "k2", 0, good, "IDLETIME", -1],
        ["RESTORE", "k2", 0, good, "IDLETIME", "x"],
        ["RESTORE", "k2", 0, good, "FREQ", 256],
        ["RESTORE", "k2", 0, good, "FREQ", 5, "IDLETIME", 5],
        ["RESTORE", "k2", 0, good, "IDLETIME"],
        ["RESTORE", "k2", 0, good, "IDLETIME", 100, "REPLACE", "FREQ", 1],
        ["RESTORE", "k6", 0, good, "IDLETIME", 100, "FREQ"],
        ["RESTORE", "k6", 0, good, "REPLACE", "IDLETIME", 100],
        ["RESTORE", "k3", 1, good, "ABSTTL"],  # already expired: OK, nothing stored
        ["EXISTS", "k3"],
        ["RESTORE", "k", 1, good, "ABSTTL", "REPLACE"],  # expired: deletes the old k
        ["EXISTS", "k"],
        ["RESTORE", "k4", 100000, good],
        ["PTTL", "k4"],
        ["DUMP", "nosuchkey"],
        ["DUMP"],
        ["RESTORE", "k5", 0],
    ]
    clients = [RawClient(port) for port in _ports(pair)]
    try:
        for c in clients:
            c.call("FLUSHALL")
        for case in cases:
            want, got = (c.call(*case) for c in clients)
            if case[0] == "PTTL":
                assert isinstance(got.value, int) and 99_000 < got.value <= 100_000
                continue
            assert got.raw == want.raw, case
        idle = clients[1].call("OBJECT", "IDLETIME", "k6").value
        assert isinstance(idle, int) and idle >= 100
    finally:
        for c in clients:
            c.close()


def _ports(pair: tuple[redis.Redis, redis.Redis]) -> list[int]:
    return [int(c.connection_pool.connection_kwargs["port"]) for c in pair]


def test_hostile_payloads_get_an_error_and_the_server_goes_on(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    """Bytes flipped, cut or grown inside payloads of every encoding, the checksum made
    right again so that the decoder itself is what meets them."""
    oracle, pion = pair
    rng = random.Random(7)
    payloads = []
    for kind in ("string", "list", "set", "hash", "zset"):
        for shape in ("small-ints", "words", "long", "many"):
            _write(oracle, "h", kind, SHAPES[shape])
            payload = oracle.dump("h")
            assert payload is not None
            payloads.append(payload)
    for n in range(600):
        body = damaged(rng, payloads, n)
        # Sealed with the same checksum, so the decoder itself meets the damage.
        sealed = body + (10).to_bytes(2, "little")
        sealed += crc64(sealed).to_bytes(8, "little")
        try:
            pion.restore("h", 0, sealed, replace=True)
        except redis.ResponseError as exc:
            assert str(exc) == "Bad data format"
    assert pion.ping() is True


def test_restored_keys_survive_a_restart(tmp_path: Path) -> None:
    config = ServerConfig(port=0, dir=tmp_path / "data", appendfsync="always")
    srv = ServerThread(config).start()
    r = redis.Redis(port=srv.port)
    sources = {
        "s": dump_payload(b"hello" * 10),
        "l": dump_payload(deque([b"a", b"b"])),
        "z": None,
    }
    r.zadd("src", {"m": 1.5, "n": -2})
    sources["z"] = r.dump("src")
    for key, payload in sources.items():
        assert r.restore(key, 60_000 if key == "s" else 0, payload) == b"OK"
    r.close()
    srv.stop()
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path / "data")).start()
    r = redis.Redis(port=srv.port)
    try:
        assert r.get("s") == b"hello" * 10 and 0 < r.pttl("s") <= 60_000
        assert r.lrange("l", 0, -1) == [b"a", b"b"]
        assert r.zrange("z", 0, -1, withscores=True) == [(b"n", -2.0), (b"m", 1.5)]
    finally:
        r.close()
        srv.stop()


def test_restore_answers_oom_past_maxmemory(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    payload = dump_payload(b"x" * 300_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.restore("big", 0, payload)
    assert r.exists("big") == 0
    assert r.restore("small", 0, dump_payload(b"x" * 1000)) == b"OK"
    r.close()


def test_restore_wakes_a_blocked_pop_and_raises_its_event(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.config_set("notify-keyspace-events", "Eg")
    events = r.pubsub()
    events.subscribe("__keyevent@0__:restore")
    assert events.get_message(timeout=5) is not None  # the subscribe confirmation
    blocked = RawClient(server.port)
    blocked.send("BLPOP", "q", 10)
    deadline = time.monotonic() + 10
    while not any(c["cmd"] == "blpop" for c in r.client_list()):  # until the pop blocks
        assert time.monotonic() < deadline, r.client_list()
    assert r.restore("q", 0, dump_payload(deque([b"job"]))) == b"OK"
    assert blocked.call("PING").value == [b"q", b"job"]  # BLPOP's reply comes first
    message = events.get_message(timeout=5)
    assert message is not None and message["data"] == b"q"
    blocked.close()
    events.close()
    r.close()
