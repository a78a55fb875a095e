"""The keyspace commands end to end through redis-py (RESP2 and RESP3) and redis-cli on a
real server: each type, binary safety, 8 MB values pipelined, the bulk limit, WRONGTYPE,
separation from the V-store, INFO, active expiry, --maxmemory, MISCONF and hostile
input. Exact reply bytes against redis-server are tests/keyspace/test_oracle.py's job.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable

import numpy as np
import pytest
import redis

from pion.config import ProtocolLimits
from pion.persistence import format as fmt
from pion.server.run import ServerThread
from support import data_budget

Factory = Callable[..., ServerThread]


def test_strings(client: redis.Redis) -> None:
    assert client.set("k", "v") is True
    assert client.get("k") == b"v"
    assert client.set("k", "w", nx=True) is None
    assert client.set("nope", "w", xx=True) is None
    assert client.set("k", "w", get=True) == b"v"
    assert client.set("n", 10, ex=100) is True
    assert 99 <= client.ttl("n") <= 100
    assert client.incr("n") == 11 and client.incrby("n", -20) == -9
    assert client.decr("n") == -10 and client.decrby("n", 5) == -15
    assert 99 <= client.ttl("n") <= 100  # INCR keeps the deadline
    assert client.set("n", "1", keepttl=True) and client.ttl("n") > 0
    assert client.mset({"a": "1", "b": b"\x00"}) is True
    assert client.mget("a", "b", "missing") == [b"1", b"\x00", None]
    with pytest.raises(redis.ResponseError, match="not an integer"):
        client.incr("k")
    client.set("max", 2**63 - 1)
    with pytest.raises(redis.ResponseError, match="overflow"):
        client.incr("max")
    with pytest.raises(redis.ResponseError, match="invalid expire time in 'set'"):
        client.set("k", "v", ex=0)
    with pytest.raises(redis.ResponseError, match="syntax error"):
        client.execute_command("SET", "k", "v", "NX", "XX")


def test_generic_key_commands(client: redis.Redis) -> None:
    client.mset({"a": "1", "b": "2", "c": "3"})
    assert client.exists("a", "a", "zz") == 2
    assert client.delete("a", "zz") == 1 and client.unlink("b") == 1
    assert client.type("c") == b"string" and client.type("a") == b"none"
    assert client.expire("c", 100) and client.ttl("c") in (99, 100)
    assert 99_000 <= client.pttl("c") <= 100_000
    assert client.expire("c", 50, gt=True) is False
    assert client.persist("c") and client.ttl("c") == -1 and client.ttl("a") == -2
    deadline = int(time.time()) + 1000
    assert client.expireat("c", deadline) and client.expiretime("c") == deadline
    assert client.pexpireat("c", deadline * 1000) and client.pexpiretime("c") == deadline * 1000
    assert client.pexpire("c", -1) and client.exists("c") == 0  # a past deadline deletes
    client.mset({"k1": 1, "k2": 2, "x": 3})
    assert sorted(client.keys("k*")) == [b"k1", b"k2"]
    assert sorted(client.scan_iter(match="k?", count=1)) == [b"k1", b"k2"]
    assert client.dbsize() == 3
    assert client.flushdb() is True and client.dbsize() == 0
    client.set("z", 1)
    assert client.flushall() is True and client.dbsize() == 0


def test_hashes(client: redis.Redis, client3: redis.Redis) -> None:
    assert client.hset("h", mapping={"f1": "v1", "f2": b"\x00\r\n"}) == 2
    assert client.hset("h", "f1", "v1b") == 0
    assert client.hget("h", "f1") == b"v1b" and client.hget("h", "nope") is None
    assert client.hmget("h", ["f1", "nope", "f2"]) == [b"v1b", None, b"\x00\r\n"]
    assert client.hlen("h") == 2 and client.hexists("h", "f2") and not client.hexists("h", "x")
    assert client.hgetall("h") == {b"f1": b"v1b", b"f2": b"\x00\r\n"}
    assert client3.hgetall("h") == {b"f1": b"v1b", b"f2": b"\x00\r\n"}  # a RESP3 map
    assert client.execute_command("HMSET", "h", "f3", "v3") is True  # +OK
    assert client.hdel("h", "f1", "f2", "f3", "nope") == 3
    assert client.exists("h") == 0  # the last field removed the key
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'hset'"):
        client.execute_command("HSET", "h", "f")


def test_sorted_sets(client: redis.Redis, client3: redis.Redis) -> None:
    assert client.zadd("z", {"a": 1, "b": 2.5, "c": -1}) == 3
    assert client.zadd("z", {"a": 5}, nx=True) == 0
    assert client.zadd("z", {"a": 3, "d": 0}, xx=True, ch=True) == 1
    assert client.zadd("z", {"a": 2}, gt=True) == 0
    assert client.zadd("z", {"a": 1}, incr=True) == 4.0
    assert client.zscore("z", "b") == 2.5 and client.zscore("z", "nope") is None
    assert client3.zscore("z", "b") == 2.5  # a RESP3 double
    assert client.zcard("z") == 3
    assert client.zrange("z", 0, -1) == [b"c", b"b", b"a"]
    assert client.zrange("z", -2, -1, withscores=True) == [(b"b", 2.5), (b"a", 4.0)]
    assert client3.zrange("z", 0, 0, withscores=True) == [[b"c", -1.0]]
    assert client.zrange("z", 0, -1, desc=True) == [b"a", b"b", b"c"]
    assert client.zrange("z", "(-1", "+inf", byscore=True) == [b"b", b"a"]
    assert client.zrange("z", "+inf", "-inf", byscore=True, desc=True, offset=1, num=1) == [b"b"]
    assert client.zrem("z", "a", "nope") == 1
    with pytest.raises(redis.ResponseError, match="not a valid float"):
        client.zadd("z", {"x": "abc"})
    with pytest.raises(redis.ResponseError, match="NaN"):
        client.zadd("z", {"b": "inf"})
        client.zadd("z", {"b": "-inf"}, incr=True)


def test_wrongtype(client: redis.Redis) -> None:
    client.set("s", "v")
    client.hset("h", "f", "v")
    client.zadd("z", {"m": 1})
    wrong = [
        ("GET", "h"),
        ("INCR", "z"),
        ("SET", "h", "v", "GET"),
        ("HSET", "s", "f", "v"),
        ("HGET", "z", "f"),
        ("HGETALL", "s"),
        ("HMGET", "s", "f"),
        ("HDEL", "z", "f"),
        ("ZADD", "s", "1", "m"),
        ("ZRANGE", "h", "0", "-1"),
        ("ZSCORE", "s", "m"),
        ("ZCARD", "h"),
        ("ZREM", "h", "m"),
    ]
    for cmd in wrong:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE Operation against a key"):
            client.execute_command(*cmd)
    assert client.mget("s", "h") == [b"v", None]  # MGET reads other types as nil
    assert client.set("h", "now a string") is True  # SET replaces any type


def test_binary_safe_keys_and_values(client: redis.Redis) -> None:
    every_byte = bytes(range(256)) * 4
    keys = [b"\x00", b"a\r\nb", b"\xff\xfe", b"model@1@0@abc@bfloat16", b"a/b/c", b""]
    for i, key in enumerate(keys):
        client.set(key, every_byte[i:])
        client.hset(b"h" + key, key, every_byte)
        client.zadd(b"z" + key, {key: i})
    for i, key in enumerate(keys):
        assert client.get(key) == every_byte[i:]
        assert client.hget(b"h" + key, key) == every_byte
        assert client.zscore(b"z" + key, key) == i
    assert set(client.keys("*")) >= set(keys)
    assert set(client.scan_iter(match="model@*")) == {b"model@1@0@abc@bfloat16"}


def test_8mb_values_pipelined(client: redis.Redis) -> None:
    rng = np.random.default_rng(8)
    values = [rng.integers(0, 256, 8 << 20, dtype=np.uint8).tobytes() for _ in range(6)]
    pipe = client.pipeline(transaction=False)
    for i, v in enumerate(values):
        pipe.set(f"chunk{i}", v)
    pipe.mset({"m0": values[0], "m1": values[1]})
    for i in range(len(values)):
        pipe.get(f"chunk{i}")
    pipe.mget("m1", "m0")
    out = pipe.execute()
    assert out[:7] == [True] * 7
    assert out[7:13] == values  # bit-exact
    assert out[13] == [values[1], values[0]]


def test_values_up_to_the_bulk_limit(server_factory: Factory) -> None:
    limit = 1 << 20  # the same check as the 512 MB default, at a size a test can afford
    srv = server_factory(protocol=ProtocolLimits(max_bulk_len=limit))
    r = redis.Redis(port=srv.port, socket_timeout=30)
    r.set("at-limit", b"x" * limit)
    assert r.strlen("at-limit") if False else len(r.get("at-limit") or b"") == limit
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (limit + 1))
        reply = s.recv(4096)
        assert reply.startswith(b"-ERR Protocol error: invalid bulk length")
        assert s.recv(4096) == b""  # closed as soon as the header arrived
    assert r.exists("k") == 0


def test_a_record_over_the_log_limit_changes_nothing(
    server: ServerThread, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fmt, "MAX_PAYLOAD", 64 << 10)
    with pytest.raises(redis.ResponseError, match="record limit"):
        client.mset({"a": b"x" * (40 << 10), "b": b"y" * (40 << 10)})
    assert client.exists("a", "b") == 0 and server.state.keyspace.used_bytes == 0


def test_the_keyspace_and_the_vstore_are_separate(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "sess", 8, "VQUANT", "int8")
    client.execute_command("KV.PREFIX.REGISTER", "ns", 8, "int8")
    assert client.dbsize() == 0 and client.keys("*") == [] and list(client.scan_iter()) == []
    assert client.delete("sess", "ns_pk") == 0 and client.type("sess") == b"none"
    client.set("k", "v")
    assert client.dbsize() == 1
    assert client.flushall() is True
    info = client.execute_command("KV.PREFIX.INFO").decode()
    assert "vstore_sessions:3" in info  # sess, ns_pk, ns_pv survive FLUSHALL
    assert client.execute_command("V.INFO", "sess").startswith(b"session_idx")


def test_info(client: redis.Redis) -> None:
    assert "db0" not in client.info("keyspace")
    client.set("a", "1")
    client.set("b", "2", ex=1000)
    client.get("a")
    client.get("nope")
    ks = client.info("keyspace")["db0"]
    assert ks["keys"] == 2 and ks["expires"] == 1 and 990_000 < ks["avg_ttl"] <= 1_000_000
    stats = client.info("stats")
    assert stats["keyspace_hits"] == 1 and stats["keyspace_misses"] == 1
    assert client.info("memory")["keyspace_bytes"] > 0
    assert client.config_resetstat() is True
    stats = client.info("stats")
    assert stats["keyspace_hits"] == 0 and stats["keyspace_misses"] == 0


def test_active_expiry_removes_keys_nobody_reads(client: redis.Redis) -> None:
    for i in range(200):
        client.set(f"k{i}", "v", px=30)
    client.set("stays", "v")
    deadline = time.monotonic() + 20
    while client.dbsize() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.dbsize() == 1
    assert client.info("stats")["expired_keys"] == 200


def test_maxmemory_counts_keys_and_never_evicts_them(server_factory: Factory) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port, socket_timeout=30)
    data_budget(r, 1 << 20)
    r.set("a", b"x" * (500 << 10))
    r.execute_command("V.CREATE", "old", 1024, "VQUANT", "fp16")
    rows = np.zeros((150, 1024), dtype=np.float32).tobytes()  # 300 KB stored as fp16
    r.execute_command("V.STOREBATCH", "old", 0, 0, 150, rows)
    # The next key does not fit beside both: the V-store's LRU session goes for it.
    r.set("b", b"y" * (300 << 10))
    assert r.info("stats")["vstore_evictions"] == 1
    with pytest.raises(redis.ResponseError, match="session not found"):
        r.execute_command("V.INFO", "old")
    # Keys are never evicted: when nothing evictable is left, a write answers -OOM.
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
        r.set("c", b"z" * (300 << 10))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.execute_command("V.CREATE", "new", 1024, "VQUANT", "fp16")
        r.execute_command("V.STOREBATCH", "new", 0, 0, 150, rows)
    assert r.exists("a", "b") == 2 and r.exists("c") == 0
    r.config_set("maxmemory", 0)  # CONFIG SET reaches the shared budget
    r.set("c", b"z" * (300 << 10))


def test_misconf_refuses_key_writes_but_not_reads(
    server: ServerThread, client: redis.Redis
) -> None:
    client.set("k", "v")
    persistence = server.state.persistence
    wal = getattr(persistence, "wal", None)
    assert wal is not None
    real = wal._fd
    wal._fd = 10_000  # not an open descriptor: the next write fails with EBADF
    try:
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            client.set("k2", "v")
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            client.set("k3", "v")  # refused before reaching the log
        assert client.get("k") == b"v" and client.exists("k2") == 0
    finally:
        wal._fd = real
    assert client.execute_command("KV.PREFIX.SAVE") == b"OK"  # the way back
    assert client.set("k2", "v") is True


def test_hostile_input_gets_errors_not_crashes(client: redis.Redis) -> None:
    cases = [
        ("SCAN", "0", "COUNT", "0"),
        ("SCAN", "x"),
        ("SCAN", "0", "MATCH"),
        ("EXPIRE", "k", "9223372036854775807"),
        ("PEXPIRE", "k", "9223372036854775807"),
        ("SET", "k", "v", "EX", "9223372036854775807"),
        ("SET", "k", "v", "PX"),
        ("INCRBY", "k", "99999999999999999999"),
        ("DECRBY", "k", "-9223372036854775808"),
        ("ZADD", "z", "nan", "m"),
        ("ZADD", "z", "1"),
        ("ZRANGE", "z", "(x", "1", "BYSCORE"),
        ("ZRANGE", "z", "x", "1", "BYLEX"),
        ("ZRANGE", "z", "0", "1", "LIMIT", "1"),
        ("EXPIRE", "k", "10", "NX", "XX"),
        ("FLUSHDB", "LATER"),
        ("MSET", "a"),
        ("GET",),
        ("HGETALL", "a", "b"),
    ]
    client.set("k", "1")
    for cmd in cases:
        with pytest.raises(redis.ResponseError):
            client.execute_command(*cmd)
    # Absurd sizes are bounded by the data, not trusted.
    assert client.execute_command("SCAN", "0", "COUNT", str(2**63 - 1))[0] == 0
    # A cursor this server never issued restarts the iteration (repeats, never skips).
    assert client.execute_command("SCAN", "18446744073709551615") == (0, [b"k"])
    assert client.execute_command("ZRANGE", "nope", "0", str(2**63 - 1)) == []
    assert client.keys(b"a*" * 5000 + b"\xff") == []
    big = {f"f{i}": i for i in range(100_000)}
    assert client.hset("bigh", mapping=big) == 100_000 and client.hlen("bigh") == 100_000
    assert client.zadd("bigz", {f"m{i}": i for i in range(50_000)}) == 50_000
    assert client.zrange("bigz", -1, -1) == [b"m49999"]
    assert client.ping()


def test_command_table_lists_the_keyspace(client: redis.Redis) -> None:
    names = {c.decode() if isinstance(c, bytes) else c for c in client.command_list()}
    want = "get set mget mset incr incrby decr decrby del unlink exists expire pexpire "
    want += "expireat pexpireat ttl pttl persist type scan keys flushdb flushall dbsize "
    want += "hset hmset hget hmget hdel hgetall hlen hexists zadd zrange zrem zscore zcard"
    assert set(want.split()) <= names


def test_redis_cli(server: ServerThread) -> None:
    def cli(*args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(server.port), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, "REDISCLI_HISTFILE": "/dev/null"},
        )
        return out.stdout.strip()

    assert cli("SET", "cli:a", "1") == "OK"
    assert cli("HSET", "cli:h", "f", "v") == "1"
    assert cli("GET", "cli:a") == "1"
    assert sorted(cli("--scan", "--pattern", "cli:*").split()) == ["cli:a", "cli:h"]
    assert cli("--no-raw", "TYPE", "cli:h") == "hash"
