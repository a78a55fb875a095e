"""FUNCTION, FCALL and FCALL_RO against a real redis-server 7.0 as the oracle: every
reply, errors included, must be the same bytes in RESP2 and RESP3; FUNCTION DUMP's
payload moves from redis-server to pion-server and back.

FUNCTION LIST names libraries (and a library's functions) in the order of Redis's
hash table, which is no order a client may rely on: the cases list one library of
one function where the order would show, and ``test_list_of_many_libraries`` compares
the libraries as a set.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.keyspace import RawClient, oracle_pair

Cmd = tuple[str, ...]

LIB = """#!lua name=lib1
redis.register_function('setter', function(keys, args)
  return redis.call('set', keys[1], args[1]) end)
redis.register_function{function_name='getter', callback=function(keys, args)
  return redis.call('get', keys[1]) end, flags={'no-writes'}, description='reads one key'}
redis.register_function{function_name='sneaky', callback=function(keys, args)
  return redis.call('set', keys[1], 'x') end, flags={'no-writes', 'allow-oom'}}
redis.register_function('echo', function(keys, args) return {keys, args, #keys, #args} end)
redis.register_function('fails', function(keys, args) return redis.call('nosuch') end)
redis.register_function('raises', function(keys, args) error('boom') end)
redis.register_function('errs', function(keys, args) return redis.error_reply('MY err') end)
redis.register_function('globals', function(keys, args) return KEYS end)
redis.register_function('counts', function(keys, args) return redis.pcall('incr', keys[1]) end)
redis.register_function('nested', function() redis.register_function('x', function() end) end)
"""
ONE = "#!lua name=one\nredis.register_function('only', function() return 1 end)"
ONE_FLAGS = (
    "#!lua name=one\nredis.register_function{function_name='only', callback=function() "
    "return 1 end, flags={'allow-stale', 'no-writes', 'no-cluster', 'allow-oom'}, "
    "description='the only one'}"
)


def _lib(body: str, name: str = "lib2") -> str:
    return f"#!lua name={name}\n{body}"


def _load(body: str, name: str = "lib2") -> Cmd:
    return ("FUNCTION", "LOAD", _lib(body, name))


CASES: dict[str, list[Cmd]] = {
    "load": [
        ("FUNCTION", "LOAD", LIB),
        ("FUNCTION", "LOAD", LIB),
        ("FUNCTION", "LOAD", "REPLACE", LIB),
        ("FUNCTION", "LOAD", "BOGUS", LIB),
        ("FUNCTION", "LOAD", "redis.register_function('f', function() return 1 end)"),
        ("FUNCTION", "LOAD", "#!lua name=x"),
        ("FUNCTION", "LOAD", "#!lua name=x name=y\n"),
        ("FUNCTION", "LOAD", "#!lua foo=bar\nreturn 1"),
        ("FUNCTION", "LOAD", "#!lua2 name=x\nreturn 1"),
        ("FUNCTION", "LOAD", "#!lua\nreturn 1"),
        ("FUNCTION", "LOAD", "#!LUA name=lib-2\nreturn 1"),
        ("FUNCTION", "LOAD"),
        _load("redis.register_function('setter', function() return 1 end)"),
        _load(
            "redis.register_function('g', function() end)\n"
            "redis.register_function('g', function() end)"
        ),
        _load("redis.register_function('g-1', function() return 1 end)"),
        _load("redis.register_function('', function() return 1 end)"),
        _load("local a = 1"),
        _load("redis.call('set', 'x', 'y')"),
        _load("return 1 +"),
        _load("x = 1"),
        _load("local t = type"),
        _load("local i = 0 while true do i = i + 1 end"),  # stopped after 500 ms
        _load("local m = math.floor"),
        _load("redis.register_function{function_name='g', callback=function() end, flags={'bad'}}"),
        _load("redis.register_function{function_name='g', callback=function() end, foo=1}"),
        _load("redis.register_function{function_name='g', callback=1}"),
        _load("redis.register_function{function_name=2, callback=function() end}"),
        _load("redis.register_function{function_name='g', callback=function() end, flags=1}"),
        _load("redis.register_function{callback=function() end}"),
        _load("redis.register_function{function_name='g'}"),
        _load("redis.register_function('g')"),
        _load("redis.register_function(1, function() end)"),
        _load("redis.register_function('g', 1)"),
        _load("redis.register_function('g', function() end, 3)"),
        _load(
            "redis.log(redis.LOG_WARNING, 'at load')\n"
            "redis.register_function('g', function() return {redis.REDIS_VERSION_NUM > 0} end)"
        ),
        ("FCALL", "g", "0"),
    ],
    "fcall": [
        ("FUNCTION", "LOAD", LIB),
        ("FCALL", "setter", "1", "k", "v"),
        ("FCALL", "getter", "1", "k"),
        ("FCALL_RO", "getter", "1", "k"),
        ("FCALL_RO", "setter", "1", "k", "v"),
        ("FCALL", "sneaky", "1", "k"),
        ("FCALL", "echo", "2", "a", "b", "c"),
        ("FCALL", "echo", "0"),
        ("FCALL", "fails", "0"),
        ("FCALL", "raises", "0"),
        ("FCALL", "errs", "0"),
        ("FCALL", "globals", "0"),
        ("FCALL", "counts", "1", "k"),
        ("FCALL", "nested", "0"),
        ("FCALL", "nosuch", "0"),
        ("FCALL", "echo", "-1"),
        ("FCALL", "echo", "3", "a"),
        ("FCALL", "echo", "x"),
        ("FCALL", "echo"),
        ("FCALL_RO", "nosuch", "0"),
        ("GET", "k"),
    ],
    "list-delete-flush": [
        ("FUNCTION", "LIST"),
        ("FUNCTION", "LOAD", ONE_FLAGS),
        ("FUNCTION", "LIST"),
        ("FUNCTION", "LIST", "WITHCODE"),
        ("FUNCTION", "LIST", "LIBRARYNAME", "o*"),
        ("FUNCTION", "LIST", "libraryname", "x*", "withcode"),
        ("FUNCTION", "LIST", "LIBRARYNAME"),
        ("FUNCTION", "LIST", "WITHCODE", "WITHCODE"),
        ("FUNCTION", "LIST", "LIBRARYNAME", "a", "LIBRARYNAME", "b"),
        ("FUNCTION", "LIST", "foo"),
        ("FUNCTION", "STATS"),
        ("FUNCTION", "STATS", "x"),
        ("FUNCTION", "DELETE", "nosuch"),
        ("FUNCTION", "DELETE"),
        ("FUNCTION", "DELETE", "a", "b"),
        ("FUNCTION", "DELETE", "one"),
        ("FCALL", "only", "0"),
        ("FUNCTION", "LOAD", ONE),
        ("FUNCTION", "LIST"),
        ("FUNCTION", "FLUSH", "bad"),
        ("FUNCTION", "FLUSH", "SYNC", "extra"),
        ("FUNCTION", "FLUSH", "ASYNC"),
        ("FUNCTION", "LIST"),
        ("FUNCTION", "LOAD", ONE),
        ("FUNCTION", "FLUSH"),
        ("FUNCTION", "STATS"),
    ],
    "with-eval": [
        ("FUNCTION", "LOAD", LIB),
        ("EVAL", "return redis.call('function', 'list')", "0"),
        ("EVAL", "return redis.call('fcall', 'echo', '0')", "0"),
        ("SCRIPT", "FLUSH"),  # the script cache only: the functions stay
        ("FCALL", "setter", "1", "k", "after-flush"),
        ("FCALL_RO", "getter", "1", "k"),
        ("EVAL", "return KEYS[1]", "1", "x"),
        ("FCALL", "globals", "0"),
        ("MULTI",),
        ("FCALL", "setter", "1", "k", "in-multi"),
        ("FUNCTION", "DELETE", "lib1"),
        ("FCALL", "getter", "1", "k"),
        ("EXEC",),
    ],
    "help-kill-restore-errors": [
        ("FUNCTION", "HELP"),
        ("FUNCTION", "HELP", "x"),
        ("FUNCTION", "KILL"),
        ("FUNCTION", "NOSUCH"),
        ("FUNCTION",),
        ("FUNCTION", "DUMP"),
        ("FUNCTION", "RESTORE", "bad"),
        ("FUNCTION", "RESTORE", ""),
        ("FUNCTION", "RESTORE", "x", "y", "z"),
        ("FUNCTION", "RESTORE", "x", "nope"),
        ("FUNCTION", "RESTORE"),
        ("FCALL",),
        ("FCALL_RO", "x"),
    ],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle")) as ports:
        yield ports


def _replies(port: int, proto: int, commands: list[Cmd]) -> list[bytes]:
    c = RawClient(port)
    try:
        c.call("FLUSHALL")
        c.call("FUNCTION", "FLUSH")
        c.call("HELLO", proto)
        return [c.call(*cmd).raw for cmd in commands]
    finally:
        c.close()


@pytest.mark.parametrize("proto", [2, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_functions_match_redis(servers: tuple[int, int], case: str, proto: int) -> None:
    commands = CASES[case]
    want = _replies(servers[0], proto, commands)
    got = _replies(servers[1], proto, commands)
    for cmd, w, g in zip(commands, want, got, strict=True):
        assert g == w, cmd


def _dump(port: int) -> bytes:
    c = RawClient(port)
    try:
        payload = c.call("FUNCTION", "DUMP").value
    finally:
        c.close()
    assert isinstance(payload, bytes)
    return payload


def _run(port: int, *cmds: Cmd) -> list[bytes]:
    c = RawClient(port)
    try:
        return [c.call(*cmd).raw for cmd in cmds]
    finally:
        c.close()


def test_dump_moves_between_redis_and_pion(servers: tuple[int, int]) -> None:
    """redis-server's DUMP (LZF-compressed strings) restores into pion-server, and
    pion-server's back into redis-server; the policies and their collisions answer
    alike."""
    redis_port, pion_port = servers
    for port in servers:
        _run(port, ("FUNCTION", "FLUSH"))
    _run(redis_port, ("FUNCTION", "LOAD", LIB), ("FUNCTION", "LOAD", ONE))
    payload = _dump(redis_port)
    assert _run(pion_port, ("FUNCTION", "RESTORE", payload)) == [b"+OK\r\n"]
    assert _run(pion_port, ("FCALL", "echo", "1", "a", "b"), ("FCALL", "only", "0")) == [
        b"*4\r\n*1\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n:1\r\n:1\r\n",
        b":1\r\n",
    ]
    back = _dump(pion_port)
    for port in servers:
        _run(port, ("FUNCTION", "FLUSH"))
    assert _run(redis_port, ("FUNCTION", "RESTORE", back)) == [b"+OK\r\n"]
    assert _run(redis_port, ("FCALL", "only", "0")) == [b":1\r\n"]
    # the same policies and errors on both, from a payload of one library (with more,
    # which collision is met first follows Redis's hash order)
    _run(pion_port, ("FUNCTION", "FLUSH"), ("FUNCTION", "LOAD", ONE))
    back = _dump(pion_port)
    for port in servers:
        _run(port, ("FUNCTION", "FLUSH"), ("FUNCTION", "LOAD", LIB), ("FUNCTION", "LOAD", ONE))
    clash = _lib("redis.register_function('only', function() return 2 end)", "other")
    cmds: list[Cmd] = [
        ("FUNCTION", "RESTORE", back),
        ("FUNCTION", "RESTORE", back, "APPEND"),
        ("FUNCTION", "RESTORE", back, "REPLACE"),
        ("FUNCTION", "DELETE", "one"),
        ("FUNCTION", "LOAD", clash),
        ("FUNCTION", "RESTORE", back, "REPLACE"),
        ("FUNCTION", "RESTORE", back, "FLUSH"),
        ("FCALL", "only", "0"),
        ("FUNCTION", "RESTORE", back[:-1] + bytes([back[-1] ^ 1])),
        ("FUNCTION", "RESTORE", b"\x00\x01a" + back[-10:]),
    ]
    assert _run(pion_port, *cmds) == _run(redis_port, *cmds)


def test_list_of_many_libraries(servers: tuple[int, int]) -> None:
    libs = [
        _lib(f"redis.register_function('f{i}', function() return {i} end)", f"l{i}")
        for i in range(4)
    ]
    got = []
    for port in servers:
        c = RawClient(port)
        c.call("FUNCTION", "FLUSH")
        for lib in libs:
            c.call("FUNCTION", "LOAD", lib)
        listing = c.call("FUNCTION", "LIST", "WITHCODE").value
        stats = c.call("FUNCTION", "STATS").raw
        c.close()
        assert isinstance(listing, list)
        got.append((sorted(repr(entry) for entry in listing), stats))
    assert got[0] == got[1]
