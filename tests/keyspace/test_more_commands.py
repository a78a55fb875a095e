"""The commands issue 23 added to the keyspace, beyond what the hypothesis oracle
compares: OBJECT ENCODING against redis-server for values built by SET/HSET/ZADD,
Redis 7.2's ZRANK WITHSCORE, HSCAN/ZSCAN walks of large values in bounded steps, the
random picks, MEMORY USAGE and --maxmemory, SLOWLOG with its CONFIG settings, INFO
commandstats and errorstats, and the keyspace's own RENAME/COPY/RANDOMKEY records."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from pion.errors import OOMError
from pion.keyspace import CopyKey, KeyMutation, Keyspace, RenameKey, SetRange
from pion.keyspace.entries import value_size
from pion.keyspace.strings import append, setrange
from pion.persistence import keyspace_format as kf
from pion.server.run import ServerThread
from support import data_budget
from support.keyspace import Err, RawClient, RedisServer


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


def _both(oracle: RedisServer, server: ServerThread, proto: int = 2) -> tuple[RawClient, RawClient]:
    pair = RawClient(oracle.port), RawClient(server.port)
    for c in pair:
        c.call("FLUSHALL")
        if proto == 3:
            c.call("HELLO", 3)
    return pair


def test_object_encoding_matches_redis_for_values_as_built(
    oracle: RedisServer, server: ServerThread
) -> None:
    r, p = _both(oracle, server)
    big = b"v" * 65
    setup: list[list[bytes | str | int]] = [
        ["SET", "int", "123"],
        ["SET", "neg", "-9223372036854775808"],
        ["SET", "zero", "-0"],
        ["SET", "lead", "007"],
        ["SET", "long", "12345678901234567890"],
        ["SET", "emb", b"e" * 44],
        ["SET", "raw", b"r" * 45],
        ["HSET", "h", "f", "v"],
        ["HSET", "hbig", "f", big],
        ["ZADD", "z", 1, "m"],
        ["ZADD", "zbig", 1, big],
    ]
    setup += [["HSET", "hmany", f"f{i}", "v"] for i in range(513)]
    setup += [["ZADD", "zmany", i, f"m{i}"] for i in range(129)]
    for cmd in setup:
        assert r.call(*cmd).raw == p.call(*cmd).raw
    for k in ["int", "neg", "zero", "lead", "long", "emb", "raw", "h", "hbig", "hmany"]:
        want, got = r.call("OBJECT", "ENCODING", k), p.call("OBJECT", "ENCODING", k)
        assert want.raw == got.raw, k
    for k in ["z", "zbig", "zmany", "missing"]:
        assert r.call("OBJECT", "ENCODING", k).raw == p.call("OBJECT", "ENCODING", k).raw, k


@pytest.mark.parametrize(
    ("proto", "found", "top", "missing"),
    [
        (2, b"*2\r\n:1\r\n$3\r\n2.5\r\n", b"*2\r\n:0\r\n$1\r\n7\r\n", b"*-1\r\n"),
        (3, b"*2\r\n:1\r\n,2.5\r\n", b"*2\r\n:0\r\n,7\r\n", b"_\r\n"),
    ],
)
def test_zrank_withscore_is_redis_72s(
    server: ServerThread, proto: int, found: bytes, top: bytes, missing: bytes
) -> None:
    c = RawClient(server.port)
    if proto == 3:
        c.call("HELLO", 3)
    c.call("ZADD", "z", 1, "a", 2.5, "b", 7, "c")
    assert c.call("ZRANK", "z", "b", "WITHSCORE").raw == found
    assert c.call("ZREVRANK", "z", "c", "withscore").raw == top
    assert c.call("ZREVRANK", "z", "c").raw == b":0\r\n"
    assert c.call("ZRANK", "z", "nope", "WITHSCORE").raw == missing
    assert c.call("ZRANK", "nokey", "a", "WITHSCORE").raw == missing
    assert c.call("ZRANK", "z", "a", "bogus").raw == b"-ERR syntax error\r\n"
    assert c.call("ZRANK", "z", "a", "WITHSCORE", "x").raw == b"-ERR syntax error\r\n"
    c.close()


def _walk(c: RawClient, command: str, key: str, count: int) -> list[list[bytes]]:
    cursor: bytes = b"0"
    steps = []
    while True:
        reply = c.call(command, key, cursor, "COUNT", count).value
        assert not isinstance(reply, Err), reply
        cursor, items = reply
        steps.append(items)
        if cursor == b"0":
            return steps


def test_hscan_and_zscan_walk_a_large_value_in_bounded_steps(server: ServerThread) -> None:
    c = RawClient(server.port)
    fields = [b"f%04d" % i for i in range(1000)]
    for i in range(0, 1000, 100):
        c.call("HSET", "h", *[x for f in fields[i : i + 100] for x in (f, b"v" + f)])
        c.call("ZADD", "z", *[x for j, f in enumerate(fields[i : i + 100]) for x in (i + j, f)])
    steps = _walk(c, "HSCAN", "h", 64)
    assert len(steps) > 1 and all(len(s) <= 2 * 64 for s in steps)
    seen = [x for s in steps for x in s]
    assert sorted(seen[::2]) == fields and seen[1::2] == [b"v" + f for f in seen[::2]]
    steps = _walk(c, "ZSCAN", "z", 100)
    assert len(steps) == 10 and all(len(s) == 200 for s in steps)
    seen = [x for s in steps for x in s]
    assert seen[::2] == fields and seen[1::2] == [str(i).encode() for i in range(1000)]
    # MATCH filters a bounded step, it does not make it longer.
    first = c.call("HSCAN", "h", 0, "COUNT", 100, "MATCH", "f00*").value
    assert first[1][::2] == [b"f%04d" % i for i in range(100)]
    c.close()


def test_random_picks_cover_the_value_and_respect_the_count(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.hset("h", mapping={f"f{i}": str(i) for i in range(10)})
    r.zadd("z", {f"m{i}": i for i in range(10)})
    r.set("s", "v")
    seen_fields: set[bytes] = set()
    for _ in range(300):
        picked = r.hrandfield("h", 3)
        assert len(picked) == len(set(picked)) == 3  # a positive count: distinct
        seen_fields.update(picked)
    assert len(seen_fields) == 10
    repeats = r.hrandfield("h", -50)
    assert len(repeats) == 50 and len(set(repeats)) < 50  # a negative one may repeat
    pairs = r.zrandmember("z", 4, withscores=True)
    assert len(pairs) == 8 and all(float(pairs[i + 1]) == int(pairs[i][1:]) for i in (0, 2))
    assert {r.randomkey() for _ in range(200)} == {b"h", b"z", b"s"}
    r.close()


def test_object_idletime_counts_seconds_since_the_last_lookup() -> None:
    now = [1_700_000_000_000]
    ks = Keyspace(clock=lambda: now[0])
    ks.set_string(b"a", b"1")
    ks.set_string(b"b", b"2")
    now[0] += 5_000
    ks.sweep(10)  # the server's tick advances the one-second LRU clock
    assert ks.string(b"b") == b"2"
    a, b = ks.peek(b"a"), ks.peek(b"b")
    assert a is not None and b is not None
    assert now[0] // 1000 - a.touched == 5 and now[0] // 1000 - b.touched == 0


def test_object_idletime_on_the_wire(server: ServerThread) -> None:
    c = RawClient(server.port)
    c.call("SET", "k", "v")
    assert c.call("OBJECT", "IDLETIME", "k").raw == b":0\r\n"
    assert c.call("OBJECT", "IDLETIME", "missing").raw == b"$-1\r\n"
    assert c.call("OBJECT", "REFCOUNT", "k").raw == b":1\r\n"
    c.close()


def test_random_key_finds_the_one_live_key_among_holes() -> None:
    ks = Keyspace()
    for i in range(900):
        ks.set_string(b"k%d" % i, b"v")
    ks.delete([b"k%d" % i for i in range(900) if i != 417])
    assert all(ks.random_key() == b"k417" for _ in range(20))
    ks.delete([b"k417"])
    assert ks.random_key() is None


def test_rename_and_copy_are_one_record_each_and_replay_to_the_same_state() -> None:
    log: list[KeyMutation] = []

    class Journal:
        def append(self, m: KeyMutation) -> None:
            # Through the log's own encoding, as a restart would read it.
            op, parts = kf.encode(m)
            log.append(kf.decode(op, b"".join(bytes(p) for p in parts)))

    ks = Keyspace()
    ks.journal = Journal()
    ks.hash_set(b"h", [(b"f", b"v"), (b"g", b"w")])
    ks.set_deadline(b"h", ks.clock() + 100_000)
    ks.set_string(b"s", b"x" * 100)
    assert ks.copy(b"h", b"h2", replace=False)
    assert not ks.copy(b"h", b"s", replace=False)
    assert ks.copy(b"h", b"s", replace=True)  # a hash replaces the string
    assert ks.rename(b"h2", b"renamed")
    ks.hash_set(b"renamed", [(b"new", b"1")])  # the copy is independent
    assert ks.hash(b"h") == {b"f": b"v", b"g": b"w"}
    assert [type(m) for m in log[-3:]] == [CopyKey, RenameKey, type(log[0])]
    replayed = Keyspace()
    for m in log:
        replayed.apply(m)
    for k in (b"h", b"s", b"renamed"):
        assert replayed.hash(k) == ks.hash(k) and replayed.deadline(k) == ks.deadline(k)
    assert b"h2" not in replayed and len(replayed) == len(ks) == 3
    total = sum(value_size(k, ks.lookup(k, read=False) or b"") for k in (b"h", b"s", b"renamed"))
    assert ks.used_bytes == replayed.used_bytes == total


def test_append_and_setrange_log_only_the_bytes_written() -> None:
    log: list[KeyMutation] = []

    class Journal:
        def append(self, m: KeyMutation) -> None:
            op, parts = kf.encode(m)
            log.append(kf.decode(op, b"".join(bytes(p) for p in parts)))

    ks = Keyspace()
    ks.journal = Journal()
    ks.set_string(b"s", b"x" * 100_000, ks.clock() + 100_000)
    assert append(ks, b"s", b"tail") == 100_004
    assert setrange(ks, b"s", 100_010, b"end") == 100_013
    assert setrange(ks, b"new", 3, b"abc") == 6
    assert [type(m) for m in log[1:]] == [SetRange, SetRange, SetRange]
    assert sum(len(bytes(m.data)) for m in log[1:] if isinstance(m, SetRange)) == 10
    replayed = Keyspace()
    for m in log:
        replayed.apply(m)
    assert replayed.string(b"s") == b"x" * 100_000 + b"tail" + bytes(6) + b"end"
    assert replayed.string(b"new") == bytes(3) + b"abc" == ks.string(b"new")
    assert replayed.deadline(b"s") == ks.deadline(b"s") > 0
    assert replayed.deadline(b"new") == 0
    assert replayed.used_bytes == ks.used_bytes


def test_writes_that_grow_a_key_ask_the_maxmemory_budget_first() -> None:
    ks = Keyspace()
    ks.set_string(b"s", b"x" * 1000)
    ks.hash_set(b"h", [(b"f", b"v" * 1000)])
    limit = ks.used_bytes + 500

    def budget(grow: int) -> None:
        if ks.used_bytes + grow > limit:
            raise OOMError("over the test's budget")

    ks.budget = budget
    before = ks.used_bytes
    with pytest.raises(OOMError):
        ks.copy(b"s", b"s2", replace=False)
    with pytest.raises(OOMError):
        append(ks, b"s", b"y" * 600)
    with pytest.raises(OOMError):
        ks.hash_set(b"h", [(b"f", b"v" * 1600)])  # what HINCRBYFLOAT's result would
    assert ks.used_bytes == before and b"s2" not in ks
    assert ks.rename(b"s", b"t")  # same size: nothing asked
    assert ks.used_bytes == before


def test_append_copy_and_setrange_answer_oom_past_maxmemory(
    server_factory: Callable[..., ServerThread],
) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    r.set("s", b"x" * 150_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.append("s", b"y" * 100_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.copy("s", "s2")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.setrange("s", 200_000, "z")
    assert r.strlen("s") == 150_000 and r.exists("s2") == 0
    usage = r.memory_usage("s")
    assert usage is not None and 150_000 < usage < 151_000
    assert r.memory_usage("missing") is None
    r.close()


def test_slowlog_records_commands_past_its_threshold(server: ServerThread) -> None:
    r = redis.Redis(port=server.port, decode_responses=False)
    assert r.config_get("slowlog*") == {
        "slowlog-log-slower-than": "10000",
        "slowlog-max-len": "128",
    }
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    r.set("k", b"x" * 200)
    r.execute_command("MSET", *[f"k{i}" for i in range(40)])
    entries = r.slowlog_get(-1)
    commands = [e["command"] for e in entries]
    # 41 arguments: the first 31 and a count of the rest.
    mset = next(c for c in commands if c.startswith(b"MSET"))
    shown = " ".join(f"k{i}" for i in range(30))
    assert mset == f"MSET {shown} ... (10 more arguments)".encode()
    setcmd = next(c for c in commands if c.startswith(b"SET"))
    assert setcmd == b"SET k " + b"x" * 128 + b"... (72 more bytes)"
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, reverse=True)
    r.config_set("slowlog-max-len", 2)
    for i in range(5):
        r.get(f"k{i}")
    assert r.slowlog_len() == 2
    r.config_set("slowlog-log-slower-than", -1)
    r.slowlog_reset()
    r.get("k")
    assert r.slowlog_len() == 0
    with pytest.raises(redis.exceptions.ResponseError, match="between -1 and"):
        r.config_set("slowlog-log-slower-than", -2)
    r.close()


def test_slowlog_never_shows_a_password(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory(requirepass="secret")
    r = redis.Redis(port=srv.port, password="secret")
    r.config_set("slowlog-log-slower-than", 0)
    r.execute_command("AUTH", "secret")
    r.execute_command("HELLO", 2, "AUTH", "default", "secret")
    assert all(b"secret" not in e["command"] for e in r.slowlog_get(-1))
    r.close()


def test_info_commandstats_and_errorstats(server: ServerThread) -> None:
    c = RawClient(server.port)
    c.call("CONFIG", "RESETSTAT")
    c.call("SET", "s", "v")
    c.call("GET", "s")
    c.call("HGET", "s", "f")  # WRONGTYPE: a failed call
    c.call("GET")  # arity: a rejected call
    c.call("NOSUCHCOMMAND")
    info = c.call("INFO", "commandstats", "errorstats").value.decode()
    lines = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    assert lines["cmdstat_get"].startswith("calls=1,usec=")
    assert lines["cmdstat_get"].endswith(",rejected_calls=1,failed_calls=0")
    assert lines["cmdstat_hget"].endswith(",rejected_calls=0,failed_calls=1")
    assert lines["errorstat_WRONGTYPE"] == "count=1"
    assert lines["errorstat_ERR"] == "count=2"
    default = c.call("INFO").value.decode()
    assert "# Keyspace" in default and "# Commandstats" not in default
    assert "total_error_replies:3" in default
    everything = c.call("INFO", "all").value.decode()
    assert "# Commandstats" in everything and "# Errorstats" in everything
    c.call("CONFIG", "RESETSTAT")
    after = c.call("INFO", "commandstats").value.decode()
    assert "cmdstat_get" not in after and "cmdstat_config" in after
    c.close()


def test_copy_to_another_database(server: ServerThread) -> None:
    c = RawClient(server.port)
    c.call("SET", "k", "v")
    assert c.call("COPY", "k", "k2", "DB", "16").raw == b"-ERR DB index is out of range\r\n"
    assert c.call("COPY", "k", "k2", "DB", "1").raw == b":1\r\n"
    assert c.call("COPY", "k", "k2", "DB", "0").raw == b":1\r\n"
    assert c.call("SELECT", "1").raw == b"+OK\r\n"
    assert c.call("GET", "k2").raw == b"$1\r\nv\r\n"
    assert c.call("EXISTS", "k").raw == b":0\r\n"
    c.close()


def test_wait_answers_zero_at_once(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    assert r.wait(1, 0) == 0  # Redis would block forever: there are no replicas
    with pytest.raises(redis.exceptions.ResponseError, match="timeout is negative"):
        r.wait(0, -1)
    r.close()


def test_memory_stats_reports_the_stores(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.set("k", "v")
    stats = r.memory_stats()
    assert stats["keys.count"] == 1
    assert stats["keyspace.bytes"] == r.memory_usage("k")
    assert stats["total.allocated"] > 0
    r.close()
