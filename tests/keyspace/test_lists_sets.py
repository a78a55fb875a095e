"""Lists and sets beyond what the hypothesis oracle compares: their records replayed
(every change, through the log's bytes) rebuild the same keys and ``used_bytes``;
kill -9 of a real ``pion-server`` loses no acknowledged push, pop, move or set change
(from the log alone, and from a snapshot plus the log); WATCH sees every change;
``--maxmemory`` is asked before a push or SADD grows a key; SPOP's random picks;
OBJECT ENCODING of sets as built against redis-server; a list emptied loses its TTL;
long LRANGE and SMEMBERS replies; the memory estimate against tracemalloc; redis-cli
--bigkeys."""

from __future__ import annotations

import subprocess
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from pion.errors import OOMError
from pion.keyspace import KeyMutation, Keyspace
from pion.keyspace.entries import value_size
from pion.keyspace.lists import linsert, lmove, lrem, lset, ltrim, pop, push
from pion.keyspace.sets import sadd, smove, spop, srem, store
from pion.persistence import keyspace_format as kf
from pion.server.run import ServerThread
from support import data_budget
from support.keyspace import RawClient, RedisServer

Spawn = Callable[..., Any]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


def _logged() -> tuple[Keyspace, list[KeyMutation]]:
    log: list[KeyMutation] = []

    class Journal:
        def append(self, m: KeyMutation) -> None:
            op, parts = kf.encode(m)
            log.append(kf.decode(op, b"".join(bytes(p) for p in parts)))

    ks = Keyspace()
    ks.journal = Journal()
    return ks, log


def _state(ks: Keyspace) -> dict[bytes, tuple[object, int | None]]:
    out: dict[bytes, tuple[object, int | None]] = {}
    for k in ks.keys(b"*"):
        v = ks.lookup(k, read=False)
        out[k] = (list(v) if not isinstance(v, (bytes, set)) else v, ks.deadline(k))
    return out


def test_every_list_and_set_change_replays_from_its_record() -> None:
    ks, log = _logged()
    push(ks, b"l", [b"a", b"b", b"c", b"b"], False, only_existing=False)
    push(ks, b"l", [b"x", b"y"], True, only_existing=False)
    assert push(ks, b"nope", [b"z"], True, only_existing=True) == 0
    assert pop(ks, b"l", True, 1) == [b"y"]
    assert pop(ks, b"l", False, 2) == [b"b", b"c"]
    lset(ks, b"l", -1, b"B")
    assert linsert(ks, b"l", True, b"B", b"before") == 4
    assert lrem(ks, b"l", -1, b"x") == 1
    ks.set_deadline(b"l", ks.clock() + 100_000)
    assert lmove(ks, b"l", b"l", True, False) == b"a"  # a rotation keeps the TTL
    assert lmove(ks, b"l", b"m", False, True) == b"a"
    push(ks, b"t", [str(i).encode() for i in range(10)], False, only_existing=False)
    ltrim(ks, b"t", 2, -3)
    assert sadd(ks, b"s", [b"1", b"2", b"x", b"2"]) == 3
    assert srem(ks, b"s", [b"x", b"missing"]) == 1
    assert smove(ks, b"s", b"s2", b"1")
    assert store(ks, b"s3", {b"p", b"q"}) == 2
    assert len(spop(ks, b"s3", 1) or []) == 1
    ks.set_string(b"str", b"v")
    assert store(ks, b"str", {b"m"}) == 1  # replaces a string
    replayed = Keyspace()
    for m in log:
        replayed.apply(m)
    assert _state(replayed) == _state(ks)
    assert list(ks.list_at(b"l") or ()) == [b"before", b"B"]
    assert ks.deadline(b"l") == replayed.deadline(b"l") > 0
    total = sum(value_size(k, ks.lookup(k, read=False) or b"") for k in ks.keys(b"*"))
    assert ks.used_bytes == replayed.used_bytes == total
    # A snapshot's records (dump) rebuild the same.
    fresh = Keyspace()
    for m in ks.dump():
        op, parts = kf.encode(m)
        fresh.apply(kf.decode(op, b"".join(bytes(p) for p in parts)))
    assert _state(fresh) == _state(ks) and fresh.used_bytes == ks.used_bytes


def test_a_list_that_empties_is_deleted_with_its_ttl(client: redis.Redis) -> None:
    client.rpush("l", "a")
    client.expire("l", 100)
    assert client.lpop("l") == b"a"
    assert client.exists("l") == 0
    client.rpush("l", "b")
    assert client.ttl("l") == -1
    client.sadd("s", "m")
    client.expire("s", 100)
    client.srem("s", "m")
    client.sadd("s", "n")
    assert client.ttl("s") == -1


def test_kill9_loses_no_acknowledged_list_or_set_change(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.rpush("q", *[f"job{i}" for i in range(5)])
    r.sadd("tags", "a", "b", "c")
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"  # a snapshot, then the log
    assert r.lpop("q") == b"job0"
    assert r.lmove("q", "processing", "LEFT", "RIGHT") == b"job1"
    r.lset("q", 0, "JOB2")
    r.linsert("q", "AFTER", "JOB2", "inserted")
    r.expire("q", 1000)
    r.srem("tags", "b")
    r.smove("tags", "done", "a")
    r.sinterstore("both", ["tags", "tags"])
    acknowledged = r.rpush("q", "last")
    assert acknowledged == 5
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert r2.lrange("q", 0, -1) == [b"JOB2", b"inserted", b"job3", b"job4", b"last"]
    assert r2.lrange("processing", 0, -1) == [b"job1"]
    assert r2.smembers("tags") == {b"c"} and r2.smembers("done") == {b"a"}
    assert r2.smembers("both") == {b"c"}
    assert 990 < r2.ttl("q") <= 1000
    assert r2.type("q") == b"list" and r2.type("tags") == b"set"


def test_watch_sees_pushes_pops_and_set_changes(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    other = redis.Redis(port=server.port)
    r.rpush("l", "a")
    r.sadd("s", "m")
    for change in (
        lambda: other.rpush("l", "b"),
        lambda: other.lpop("l"),
        lambda: other.sadd("s", "n"),
        lambda: other.srem("s", "n"),
        lambda: other.lmove("l", "l2", "LEFT", "LEFT"),
    ):
        with r.pipeline() as p:
            p.watch("l", "s", "l2")
            change()
            p.multi()
            p.llen("l")
            with pytest.raises(redis.WatchError):
                p.execute()
    with r.pipeline() as p:  # a change that changes nothing touches nothing
        p.watch("s")
        other.srem("s", "absent")
        p.multi()
        p.scard("s")
        assert p.execute() == [1]


def test_pushes_and_sadd_ask_the_maxmemory_budget_first() -> None:
    ks = Keyspace()
    push(ks, b"l", [b"x" * 100], False, only_existing=False)
    sadd(ks, b"s", [b"m"])
    limit = ks.used_bytes + 300

    def budget(grow: int) -> None:
        if ks.used_bytes + grow > limit:
            raise OOMError("over the test's budget")

    ks.budget = budget
    before = ks.used_bytes
    with pytest.raises(OOMError):
        push(ks, b"l", [b"y" * 400], True, only_existing=False)
    with pytest.raises(OOMError):
        sadd(ks, b"s", [b"z" * 400])
    with pytest.raises(OOMError):
        lset(ks, b"l", 0, b"w" * 500)
    assert ks.used_bytes == before and len(ks.list_at(b"l") or ()) == 1
    assert pop(ks, b"l", True, 1) == [b"x" * 100]  # shrinking asks nothing


def test_rpush_answers_oom_past_maxmemory(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    r.rpush("l", b"x" * 150_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.rpush("l", b"y" * 100_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.sadd("s", b"y" * 100_000)
    assert r.llen("l") == 1 and r.exists("s") == 0
    usage = r.memory_usage("l")
    assert usage is not None and 150_000 < usage < 151_000


def test_spop_and_srandmember_pick_members_of_the_set(client: redis.Redis) -> None:
    members = {str(i).encode() for i in range(50)} | {b"x"}
    client.sadd("s", *members)
    popped = client.spop("s", 10)
    assert isinstance(popped, list) and len(set(popped)) == 10
    assert set(popped) <= members and client.scard("s") == 41
    assert not set(popped) & client.smembers("s")
    one = client.spop("s")
    assert one in members and client.sismember("s", one) == 0
    picks = client.srandmember("s", -100)
    assert len(picks) == 100 and set(picks) <= client.smembers("s")
    distinct = client.srandmember("s", 20)
    assert len(set(distinct)) == 20
    assert set(client.srandmember("s", 1000)) == client.smembers("s")
    assert client.spop("s", 1000) and client.exists("s") == 0


def test_object_encoding_of_sets_matches_redis(oracle: RedisServer, server: ServerThread) -> None:
    shapes = {
        "ints": [str(i) for i in range(10)],
        "many-ints": [str(i) for i in range(513)],
        "strings": ["a", "b"],
        "padded": ["007"],
        "list": None,
    }
    for proto_client in (RawClient(oracle.port), RawClient(server.port)):
        proto_client.call("FLUSHALL")
        for name, members in shapes.items():
            if members is None:
                proto_client.call("RPUSH", name, "a")
            else:
                proto_client.call("SADD", name, *members)
        proto_client.close()
    want, got = RawClient(oracle.port), RawClient(server.port)
    for name in shapes:
        for cmd in (["OBJECT", "ENCODING", name], ["TYPE", name], ["SSCAN", name, "0"]):
            a, b = want.call(*cmd), got.call(*cmd)
            if cmd[0] == "SSCAN" and name in ("many-ints", "strings"):
                continue  # a hashtable's order is Redis's own
            assert a.raw == b.raw, (cmd, a.raw, b.raw)
    for cmd in (["SCAN", "0", "TYPE", "list"], ["SCAN", "0", "TYPE", "set", "COUNT", "100"]):
        a, b = want.call(*cmd), got.call(*cmd)
        assert sorted(a.value[1]) == sorted(b.value[1])
    want.close()
    got.close()


def test_long_lrange_and_smembers_replies(client: redis.Redis) -> None:
    n = 60_000
    client.rpush("l", *range(n))
    got = client.lrange("l", 0, -1)
    assert len(got) == n and got[0] == b"0" and got[-1] == str(n - 1).encode()
    assert client.lrange("l", -3, -1) == [b"59997", b"59998", b"59999"]
    assert client.lindex("l", n // 2) == str(n // 2).encode()
    client.sadd("s", *range(n))
    assert len(client.smembers("s")) == n
    assert client.sintercard(2, ["s", "s"], limit=10) == 10


def test_list_and_set_accounting_tracks_real_memory() -> None:
    """used_bytes stays within 2x of what tracemalloc sees for lists and sets of small
    elements (the overheads of entries.py), as for hashes."""
    for build in ("list", "set"):
        ks = Keyspace()
        elements = [b"e:%08d" % i for i in range(20_000)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, len(elements), 100):
            fresh = [bytes(bytearray(e)) for e in elements[start : start + 100]]
            if build == "list":
                push(ks, b"k%d" % (start % 7), fresh, False, only_existing=False)
            else:
                sadd(ks, b"k%d" % (start % 7), fresh)
        real = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert 0.5 < ks.used_bytes / real < 2.0, (build, ks.used_bytes, real)


def test_redis_cli_bigkeys_sees_lists_and_sets(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.rpush("l", "a", "b", "c")
    r.rpush("short", "a")
    r.sadd("s", "x", "y")
    done = subprocess.run(
        ["redis-cli", "-p", str(server.port), "--bigkeys"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    out = done.stdout.decode()
    assert "Biggest   list found '\"l\"' has 3 items" in out, out
    assert "Biggest    set found '\"s\"' has 2 members" in out, out
    assert "2 lists with 4 items" in out, out
