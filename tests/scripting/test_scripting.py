"""Scripting behaviour the oracle test cannot show: the sandbox holds against a hostile
script (nothing of Python or the OS is reachable, nothing leaks between scripts), what
Redis 7.2 changed (``os.clock``, ``REDIS_VERSION``), commandstats, and that a
script's acknowledged writes survive kill -9 (logged by their effects, as one unit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from pion.server.run import ServerThread
from support import wait_loaded

HOSTILE = [
    "return python",
    "return python.eval('1')",
    "return loadstring('return python')()",
    "return loadstring('return os.execute')()('true')",
    "return os.execute('true')",
    "return io.open('/etc/passwd')",
    "return require('os')",
    "return debug.getregistry()",
    "return getfenv(0)",
    "return setfenv(1, {})",
    "return string.dump(redis.pcall)",
    "return loadstring(string.dump(redis.pcall))('ping')",
    "return getmetatable('').__index.rep == nil",
    "getmetatable('').__index = nil",
    "return package.loaded",
    "return dofile('/etc/passwd')",
    "return loadfile('/etc/passwd')",
    "return newproxy(true)",
    "_G.x = 1",
    "setmetatable(_G, nil)",
    "rawset(string, 'x', 1)",
    "rawset(redis, 'call', print)",
    "cjson.encode = nil",
    "return collectgarbage('count') >= 0 and redis.sha1hex(redis.call)",
]


@pytest.mark.parametrize("body", HOSTILE)
def test_hostile_script_reaches_nothing(client: redis.Redis, body: str) -> None:
    """Each either fails with a script error or returns a plain Lua value: never a
    Python object, a file, or a command run."""
    try:
        value = client.eval(body, 0)
    except redis.ResponseError as exc:
        assert "script:" in str(exc) or "Error" in str(exc), exc
    else:
        assert value is None or isinstance(value, (int, bytes, list)), value
    # and the state is as before for the next script
    assert client.eval("return {type(string.rep), type(redis.call), type(cjson.encode)}", 0) == [
        b"function",
        b"function",
        b"function",
    ]
    with pytest.raises(redis.ResponseError, match="nonexistent global variable 'x'"):
        client.eval("return x", 0)


def test_os_clock_and_version_as_redis_7_2(client: redis.Redis) -> None:
    assert client.eval("return type(os.clock())", 0) == b"number"
    assert client.eval("return os.getenv", 0) is None
    version = client.info("server")["redis_version"]
    assert client.eval("return redis.REDIS_VERSION", 0) == version.encode()
    major, minor, patch = (int(x) for x in version.split("."))
    assert client.eval("return redis.REDIS_VERSION_NUM", 0) == (major << 16) | (minor << 8) | patch


def test_math_random_in_range_and_seedable(client: redis.Redis) -> None:
    draws = client.eval("return {math.random(10), math.random(5, 6), math.random() * 1000}", 0)
    assert 1 <= draws[0] <= 10 and 5 <= draws[1] <= 6 and 0 <= draws[2] < 1000
    body = "math.randomseed(7); return {math.random(1000), math.random(1000)}"
    assert client.eval(body, 0) == client.eval(body, 0)


def test_commandstats_count_the_script_and_its_calls(client: redis.Redis) -> None:
    client.config_resetstat()
    client.eval("redis.call('set', KEYS[1], 'v'); return redis.call('get', KEYS[1])", 1, "k")
    with pytest.raises(redis.ResponseError, match="not an integer"):  # pcall's error returned
        client.evalsha(client.script_load("return redis.pcall('incr', 'k')"), 0)
    stats = client.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert stats["cmdstat_set"]["calls"] == 1
    assert stats["cmdstat_get"]["calls"] == 1
    assert stats["cmdstat_incr"]["failed_calls"] == 1


def test_log_and_script_errors_leave_the_server_serving(client: redis.Redis) -> None:
    assert client.eval("redis.log(redis.LOG_WARNING, 'from a script'); return 1", 0) == 1
    with pytest.raises(redis.ResponseError):
        client.eval("return cjson.decode('{')", 0)
    with pytest.raises(redis.ResponseError):
        client.eval("return struct.pack('>Q', 1)", 0)
    assert client.eval("return redis.call('ping')", 0) == b"PONG"


def test_scripts_are_atomic_in_a_transaction(client: redis.Redis) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.eval("return redis.call('incrby', KEYS[1], ARGV[1])", 1, "n", 5)
    pipe.eval("return redis.call('incrby', KEYS[1], ARGV[1])", 1, "n", 2)
    pipe.get("n")
    assert pipe.execute() == [5, 7, b"7"]


def test_script_effects_survive_kill9(spawn_server: Callable[..., Any]) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    body = """
        for i = 1, tonumber(ARGV[1]) do
          redis.call('hset', KEYS[1], 'f' .. i, i)
        end
        redis.call('set', KEYS[2], ARGV[2])
        redis.call('zadd', KEYS[3], 1.5, 'm')
        return redis.call('hlen', KEYS[1])
    """
    assert r.eval(body, 3, "h", "s", "z", 50, "done") == 50
    sha = r.script_load("return redis.call('incrby', KEYS[1], ARGV[1])")
    assert r.evalsha(sha, 1, "counter", 7) == 7
    r.close()
    srv.kill()
    again = spawn_server("--appendfsync", "always")  # the same data directory
    r = again.client()
    wait_loaded(r)
    assert r.hlen("h") == 50 and r.hget("h", "f50") == b"50"
    assert r.get("s") == b"done"
    assert r.zscore("z", "m") == 1.5
    assert r.get("counter") == b"7"
    # the script cache is not part of the dataset (as Redis)
    assert r.script_exists(sha) == [False]
    r.close()


def test_scripts_isolated_per_server(server_factory: Callable[..., ServerThread]) -> None:
    a = redis.Redis(port=server_factory().port)
    b = redis.Redis(port=server_factory().port)
    sha = a.script_load("return 1")
    assert a.script_exists(sha) == [True]
    assert b.script_exists(sha) == [False]
    a.script_flush()
    assert a.script_exists(sha) == [False]
    a.close()
    b.close()
