"""Hash-field expiry (Redis 7.4) against a real pion-server: every command's replies,
reply codes and error texts (Redis 7.4's, from its ``t_hash.c``: redis-server 7.0 has
none of these commands, so there is no local oracle), expired fields invisible to the
hash commands, reclaimed lazily and by the active cycle, notifications, WATCH, DUMP's
type, and deadlines that survive a restart and kill -9 (with expired fields never
revived)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from pion.server.run import ServerThread
from support.keyspace import Err, RawClient

Spawn = Callable[..., Any]

ERR_FIELDS = b"ERR Mandatory argument FIELDS is missing or not at the right position"
ERR_MATCH = b"ERR The `numfields` parameter must match the number of arguments"
ERR_HEXPIRE_COUNT = b"ERR Parameter `numFields` should be greater than 0"
ERR_COUNT = b"ERR Number of fields must be a positive integer"


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until ``check()`` holds (what is waited for does happen)."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.fixture
def c(server: ServerThread) -> RawClient:
    client = RawClient(server.port)
    client.call("HSET", "h", "a", "1", "b", "2", "c", "3")
    return client


def test_hexpire_family_reply_codes(c: RawClient) -> None:
    now_s = int(time.time())
    assert c.call("HEXPIRE", "h", 100, "FIELDS", 2, "a", "zz").value == [1, -2]
    assert c.call("HPEXPIRE", "h", 200_000, "NX", "FIELDS", 2, "a", "b").value == [0, 1]
    assert c.call("HEXPIREAT", "h", now_s + 300, "XX", "FIELDS", 2, "a", "c").value == [1, 0]
    assert c.call("HPEXPIREAT", "h", (now_s + 50) * 1000, "GT", "FIELDS", 2, "a", "c").value == [
        0,
        0,
    ]
    assert c.call("HEXPIRE", "h", 50, "lt", "FIELDS", 2, "a", "c").value == [1, 1]
    assert c.call("HEXPIRE", "missing", 10, "FIELDS", 3, "a", "b", "c").value == [-2, -2, -2]
    # A time not in the future deletes (after the condition); the last field the key.
    assert c.call("HEXPIRE", "h", 0, "XX", "FIELDS", 3, "a", "a", "zz").value == [2, -2, -2]
    assert c.call("HGETALL", "h").value == [b"b", b"2", b"c", b"3"]
    assert c.call("HPEXPIREAT", "h", 1, "FIELDS", 2, "b", "c").value == [2, 2]
    assert c.call("EXISTS", "h").value == 0


def test_httl_family_and_hpersist(c: RawClient) -> None:
    c.call("HPEXPIRE", "h", 100_500, "FIELDS", 1, "a")
    at = c.call("HPEXPIRETIME", "h", "FIELDS", 3, "a", "b", "zz").value
    assert at[1:] == [-1, -2] and abs(at[0] - (int(time.time() * 1000) + 100_500)) < 5000
    assert c.call("HEXPIRETIME", "h", "FIELDS", 1, "a").value == [(at[0] + 999) // 1000]
    secs, none = c.call("HTTL", "h", "FIELDS", 2, "a", "b").value
    assert 95 <= secs <= 101 and none == -1  # rounded up, as Redis 7.4
    ms = c.call("HPTTL", "h", "FIELDS", 1, "a").value[0]
    assert 95_000 < ms <= 100_500
    assert c.call("HTTL", "missing", "FIELDS", 2, "a", "b").value == [-2, -2]
    assert c.call("HPERSIST", "h", "FIELDS", 3, "a", "b", "zz").value == [1, -1, -2]
    assert c.call("HPERSIST", "missing", "FIELDS", 1, "a").value == [-2]
    assert c.call("HTTL", "h", "FIELDS", 1, "a").value == [-1]


def test_errors_in_redis_74s_order_and_words(c: RawClient) -> None:
    c.call("SET", "s", "v")
    cases: list[tuple[list[Any], bytes]] = [
        (["HEXPIRE", "s", "x", "FIELDS", 1, "a"], b"WRONGTYPE"),  # the type comes first
        (["HTTL", "s", "nope", 1, "a"], b"WRONGTYPE"),
        (["HPERSIST", "s", "FIELDS", 1, "a"], b"WRONGTYPE"),
        (["HEXPIRE", "h", "x", "FIELDS", 1, "a"], b"ERR value is not an integer or out of range"),
        (["HEXPIRE", "h", -1, "FIELDS", 1, "a"], b"ERR invalid expire time, must be >= 0"),
        (
            ["HEXPIRE", "h", 2**48, "FIELDS", 1, "a"],
            b"ERR invalid expire time in 'hexpire' command",
        ),
        (
            ["HPEXPIREAT", "h", 2**48, "FIELDS", 1, "a"],
            b"ERR invalid expire time in 'hpexpireat' command",
        ),
        (["HEXPIRE", "h", 10, "BOGUS", "FIELDS", 1, "a"], ERR_FIELDS),
        (["HEXPIRE", "h", 10, "NX", "XX", "FIELDS", 1, "a"], ERR_FIELDS),
        (["HEXPIRE", "h", 10, "FIELDS", 0, "a"], ERR_HEXPIRE_COUNT),
        (["HEXPIRE", "h", 10, "FIELDS", "x", "a"], ERR_HEXPIRE_COUNT),
        (["HEXPIRE", "h", 10, "FIELDS", 2, "a"], ERR_MATCH),
        (["HEXPIRE", "h", 10, "FIELDS", 1, "a", "b"], ERR_MATCH),
        (["HEXPIRE", "missing", 10, "FIELDS", 2, "a"], ERR_MATCH),
        (["HTTL", "h", "FIELD", 1, "a"], ERR_FIELDS),
        (["HTTL", "h", "FIELDS", -1, "a"], ERR_COUNT),
        (["HPTTL", "h", "FIELDS", 3, "a"], ERR_MATCH),
        (["HPERSIST", "h", "FIELDS", 0, "a"], ERR_COUNT),
        (["HEXPIRE", "h", 10, "FIELDS", 1], b"ERR wrong number of arguments for 'hexpire' command"),
        (["HTTL", "h", "FIELDS", 1], b"ERR wrong number of arguments for 'httl' command"),
        (["HPERSIST", "h", "FIELDS"], b"ERR wrong number of arguments for 'hpersist' command"),
    ]
    for args, want in cases:
        got = c.call(*args).value
        assert isinstance(got, Err) and got.line.startswith(want), (args, got)
    assert c.call("HGETALL", "h").value == [b"a", b"1", b"b", b"2", b"c", b"3"]


def test_expired_fields_are_invisible_and_the_active_cycle_reclaims_them(
    client: redis.Redis,
) -> None:
    client.hset("h", mapping={"a": "1", "b": "2", "keep": "3"})
    client.hset("gone", mapping={"x": "1"})
    client.execute_command("HPEXPIRE", "h", 50, "FIELDS", 2, "a", "b")
    client.execute_command("HPEXPIRE", "gone", 50, "FIELDS", 1, "x")
    # KEYS does not look hashes up: only the active cycle can take "gone" away.
    _until(lambda: client.keys("*") == [b"h"])
    assert client.hgetall("h") == {b"keep": b"3"}
    assert client.hlen("h") == 1 and client.hexists("h", "a") is False
    assert client.hget("h", "a") is None and client.hmget("h", ["a", "keep"]) == [None, b"3"]
    assert client.hscan("h") == (0, {b"keep": b"3"})
    assert client.hrandfield("h", -5) == [b"keep"] * 5
    stats = client.info("stats")
    assert stats["expired_keys"] == 0 and stats["expired_subkeys"] == 3  # fields, not keys
    assert client.info("keyspace")["db0"]["subexpiry"] == 0
    client.execute_command("HEXPIRE", "h", 100, "FIELDS", 1, "keep")
    assert client.info("keyspace")["db0"]["subexpiry"] == 1


def test_hset_clears_a_deadline_hincrby_keeps_it_rename_copy_keep(client: redis.Redis) -> None:
    client.hset("h", mapping={"a": "1", "n": "1"})
    client.execute_command("HEXPIRE", "h", 100, "FIELDS", 2, "a", "n")
    client.hset("h", "a", "2")
    client.hincrby("h", "n", 1)
    assert client.execute_command("HTTL", "h", "FIELDS", 2, "a", "n")[0] == -1
    assert client.object("encoding", "h") == b"listpackex"  # Redis 7.4's
    client.rename("h", "r")
    client.copy("r", "c")
    for key in ("r", "c"):
        assert 0 < client.execute_command("HTTL", key, "FIELDS", 1, "n")[0] <= 100
    payload = client.dump("r")  # Redis 7.4's type 24 (test_dump_hash_ttl.py)
    assert payload is not None and payload[:1] == b"\x18"
    assert client.dump("other") is None


def test_notifications(client: redis.Redis) -> None:
    client.config_set("notify-keyspace-events", "KEghx")
    sub = client.pubsub()
    sub.psubscribe("__keyevent@0__:*")
    assert sub.get_message(timeout=5)["type"] == "psubscribe"
    client.hset("h", mapping={"a": "1", "b": "2"})
    client.execute_command("HEXPIRE", "h", 100, "FIELDS", 1, "a")
    client.execute_command("HPERSIST", "h", "FIELDS", 1, "a")
    client.execute_command("HEXPIRE", "h", 0, "FIELDS", 1, "a")
    client.execute_command("HPEXPIRE", "h", 30, "FIELDS", 1, "b")
    events = []
    while len(events) < 7:
        m = sub.get_message(timeout=5)
        assert m is not None, events
        events.append((m["channel"].split(b":")[-1], m["data"]))
    assert events == [
        (b"hset", b"h"),
        (b"hexpire", b"h"),
        (b"hpersist", b"h"),
        (b"hdel", b"h"),
        (b"hexpire", b"h"),
        (b"hexpired", b"h"),  # b expires: the active cycle takes it and the hash
        (b"del", b"h"),
    ]
    sub.close()


def test_watch_sees_deadline_changes_and_field_expiry(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    other = redis.Redis(port=server.port)
    r.hset("h", mapping={"a": "1", "b": "2"})
    for change in (
        lambda: other.execute_command("HEXPIRE", "h", 100, "FIELDS", 1, "a"),
        lambda: other.execute_command("HPERSIST", "h", "FIELDS", 1, "a"),
    ):
        with r.pipeline() as p:
            p.watch("h")
            change()
            p.multi()
            p.hget("h", "a")
            with pytest.raises(redis.WatchError):
                p.execute()
    other.execute_command("HPEXPIRE", "h", 40, "FIELDS", 1, "b")
    with r.pipeline() as p:
        p.watch("h")
        _until(lambda: other.keys("*") == [b"h"] and other.hlen("h") == 1)
        p.multi()
        p.hget("h", "a")
        with pytest.raises(redis.WatchError):
            p.execute()


def test_deadlines_survive_restart_and_kill9(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.hset("h", mapping={"a": "1", "b": "2", "c": "3", "n": "5"})
    r.execute_command("HPEXPIRE", "h", 400_000, "FIELDS", 2, "a", "n")
    r.execute_command("HPEXPIRE", "h", 30, "FIELDS", 1, "b")
    r.hincrby("h", "n", 1)
    before = r.execute_command("HPEXPIRETIME", "h", "FIELDS", 2, "a", "n")
    _until(lambda: r.hexists("h", "b") is False)  # reclaimed: an HDEL in the log
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    r.hset("snap", mapping={"x": "1", "y": "2"})
    r.execute_command("HEXPIRE", "snap", 500, "FIELDS", 1, "x")
    r.execute_command("HPERSIST", "h", "FIELDS", 1, "n")
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert r2.hgetall("h") == {b"a": b"1", b"c": b"3", b"n": b"6"}
    assert r2.execute_command("HPEXPIRETIME", "h", "FIELDS", 3, "a", "n", "b") == [
        before[0],
        -1,
        -2,
    ]
    assert 450 < r2.execute_command("HTTL", "snap", "FIELDS", 1, "x")[0] <= 500


def test_the_log_alone_replays_deadlines_after_kill9(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.hset("h", mapping={"a": "1", "b": "2", "c": "3", "n": "1"})
    r.execute_command("HEXPIRE", "h", 300, "FIELDS", 3, "a", "b", "n")
    r.execute_command("HPERSIST", "h", "FIELDS", 1, "b")
    r.execute_command("HEXPIRE", "h", 0, "FIELDS", 1, "c")  # deleted: an HDEL
    r.hincrbyfloat("h", "n", "0.5")  # keeps n's deadline
    r.hsetnx("h", "new", "v")
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert r2.hgetall("h") == {b"a": b"1", b"b": b"2", b"n": b"1.5", b"new": b"v"}
    ttls = r2.execute_command("HTTL", "h", "FIELDS", 5, "a", "b", "c", "n", "new")
    assert 250 < ttls[0] <= 300 and ttls[1:3] == [-1, -2] and ttls[3] == ttls[0]
    assert ttls[4] == -1
