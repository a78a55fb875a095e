"""The write commands of issue 23 are durable: after kill -9 under ``appendfsync
always`` a restarted `pion-server` holds exactly what was acknowledged, whether the
state comes from the log alone or from a snapshot plus the log's tail. Random and
computed writes (ZPOPMIN, INCRBYFLOAT, HINCRBYFLOAT, GETEX) are logged by their
effect, RENAME and COPY by their own records (ops 26 and 27)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

Spawn = Callable[..., Any]


def _state(r: redis.Redis) -> dict[bytes, tuple[Any, ...]]:
    """Every key's type, value and absolute deadline."""
    out: dict[bytes, tuple[Any, ...]] = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        if kind == b"string":
            value: Any = r.get(key)
        elif kind == b"hash":
            value = sorted(r.hgetall(key).items())
        else:
            value = r.zrange(key, 0, -1, withscores=True)
        out[key] = (kind, value, r.pexpiretime(key))
    return out


def _writes(r: redis.Redis, far_s: int) -> None:
    r.set("s", "hello")
    r.append("s", " world")
    r.setrange("s", 20, "tail")
    r.incrbyfloat("f", "0.1")
    r.incrbyfloat("f", "0.2")
    r.execute_command("SETEX", "ex", 1000, "v")
    r.execute_command("PSETEX", "pex", 500_000, "v")
    r.setnx("nx", "first")
    r.setnx("nx", "second")
    r.getset("ex", "reset")  # clears the deadline
    r.set("gone", "x")
    r.getdel("gone")
    r.set("ttl", "v")
    r.getex("ttl", exat=far_s)
    r.set("persist", "v", ex=100)
    r.getex("persist", persist=True)
    r.msetnx({"m1": "1", "m2": "2"})
    r.msetnx({"m2": "x", "m3": "3"})  # refused as a whole
    r.hset("h", mapping={"n": "5", "x": "1.5"})
    r.hincrby("h", "n", 10)
    r.hincrbyfloat("h", "x", "2.25")
    r.hsetnx("h", "new", "v")
    r.zadd("z", {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5})
    r.zincrby("z", 10, "a")
    r.zpopmin("z")
    r.zpopmax("z", 1)
    r.zadd("mp", {"m1": 1, "m2": 2, "m3": 3})
    r.zmpop(2, ["nokey", "mp"], min=True, count=2)
    r.zadd("z2", {"p": 1, "q": 2, "r": 3, "s": 4})
    r.zremrangebyrank("z2", 0, 0)
    r.zremrangebyscore("z2", 4, 4)
    r.zadd("lex", {"a": 0, "b": 0, "c": 0})
    r.zremrangebylex("lex", "[a", "[b")
    r.rename("z2", "z3")
    r.expire("h", 5000)
    r.copy("h", "hcopy")
    r.renamenx("hcopy", "hmoved")
    r.copy("s", "h", replace=True)  # a string replaces the hash
    r.zadd("u1", {"a": 1, "b": 2})
    r.zadd("u2", {"b": 10, "c": 3})
    r.zunionstore("union", {"u1": 2, "u2": 1})
    r.zinterstore("z3", ["u1", "u2"], aggregate="MAX")  # replaces z3 (and its members)
    r.zdiffstore("diff", ["u1", "u2"])
    r.setbit("bits", 100, 1)
    r.setbit("bits", 3, 1)
    r.setbit("bits", 100, 0)
    r.bitop("OR", "bitor", "bits", "s")


def test_new_writes_survive_kill9_from_the_log(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    _writes(r, int(time.time()) + 100_000)
    before = _state(r)
    assert before[b"f"][1] == b"0.3" and before[b"z"][1] == [(b"c", 3.0), (b"d", 4.0), (b"e", 5.0)]
    assert before[b"h"][0] == b"string" and before[b"hmoved"][0] == b"hash"
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert _state(r2) == before


def test_new_writes_survive_a_snapshot_and_the_tail(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.hset("before", "f", "v")
    r.expire("before", 9000)
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    _writes(r, int(time.time()) + 100_000)
    r.rename("before", "after")  # a key from the snapshot, renamed in the tail
    r.copy("after", "after2")
    before = _state(r)
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert _state(r2) == before
    assert r2.exists("before") == 0 and r2.hgetall("after2") == {b"f": b"v"}
