"""Durability of the keyspace on a real `pion-server` process: a restart keeps strings,
hashes, sorted sets and deadlines (absolute: a key that expired while the server was
down stays gone), and kill -9 under a SET load with ``--appendfsync always`` loses no
acknowledged write, round after round."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

Spawn = Callable[..., Any]


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def test_restart_keeps_every_type_and_deadline(spawn_server: Spawn) -> None:
    srv = spawn_server()
    r = srv.client()
    r.set("s", b"\x00binary\r\n")
    r.set("ttl", "v", ex=1000)
    r.set("short", "v", px=1500)  # expires while the server is down
    r.hset("h", mapping={"f": "1", "g": b"\xff"})
    r.zadd("z", {"a": 1.5, "b": -3, "c": float("inf")})
    r.incrby("n", 41)
    r.expire("h", 2000)
    r.delete("never")
    before = r.pttl("ttl")
    assert srv.stop() == 0
    time.sleep(1.6)
    r2 = spawn_server().client()
    assert r2.get("s") == b"\x00binary\r\n"
    assert r2.hgetall("h") == {b"f": b"1", b"g": b"\xff"}
    assert r2.zrange("z", 0, -1, withscores=True) == [
        (b"b", -3.0),
        (b"a", 1.5),
        (b"c", float("inf")),
    ]
    assert r2.incr("n") == 42
    assert r2.exists("short") == 0  # its absolute deadline passed while we were down
    assert r2.pttl("ttl") <= before - 1600  # the deadline is absolute, not restarted
    assert 1990 <= r2.ttl("h") <= 2000
    assert r2.dbsize() == 5
    # SAVE, more writes, then kill -9: the snapshot plus the log's tail.
    assert r2.execute_command("KV.PREFIX.SAVE") == b"OK"
    r2.set("after", "snapshot")
    r2.zrem("z", "c")


def test_snapshot_plus_log_after_kill9(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.mset({"a": "1", "b": "2"})
    r.zadd("z", {"m": 1})
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    r.set("after", "snapshot", ex=500)
    r.zrem("z", "m")  # empties the set: the key goes
    r.hset("h", "f", "v")
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert r2.mget("a", "b", "after") == [b"1", b"2", b"snapshot"]
    assert r2.exists("z") == 0 and r2.hget("h", "f") == b"v"
    assert 490 < r2.ttl("after") <= 500


class Writer(threading.Thread):
    """SETs (and some DELs) until the connection dies; records what was acknowledged
    and the write that was in flight when it died."""

    def __init__(self, port: int, name: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis(port=port, socket_timeout=30, retry=_no_retry())
        self.tag = name
        self.rng = random.Random(seed)
        self.acked: dict[bytes, bytes | None] = {}  # None: acknowledged DEL
        self.in_flight: tuple[bytes, bytes | None] | None = None
        self.count = 0

    def run(self) -> None:
        try:
            while True:
                key = b"%s:%d" % (self.tag.encode(), self.rng.randrange(400))
                if self.rng.random() < 0.1:
                    self.in_flight = (key, None)
                    self.r.delete(key)
                else:
                    size = self.rng.choice([1, 100, 4096, 300_000])
                    value = self.rng.randbytes(size)
                    self.in_flight = (key, value)
                    assert self.r.set(key, value) is True
                self.acked[key] = self.in_flight[1]
                self.in_flight = None
                self.count += 1
        except (redis.ConnectionError, OSError):
            return


def test_kill9_under_set_load_loses_no_acknowledged_key(spawn_server: Spawn) -> None:
    acked: dict[bytes, bytes | None] = {}  # what every round acknowledged, latest wins
    rng = random.Random(15)
    for round_no in range(4):
        srv = spawn_server("--appendfsync", "always")
        writers = [Writer(srv.port, f"w{i}", 100 * round_no + i) for i in range(4)]
        for w in writers:
            w.start()
        # Every writer has had a write acknowledged (a loaded machine may take a while
        # to answer the first), then the kill falls at a random moment.
        deadline = time.monotonic() + 60
        while not all(w.count for w in writers) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        srv.kill()
        for w in writers:
            w.join(timeout=60)
            assert not w.is_alive() and w.count > 0
        check = spawn_server("--appendfsync", "always")
        r = check.client(retry=_no_retry())
        for w in writers:
            landed: tuple[bytes, bytes | None] | None = None
            if w.in_flight is not None:
                # The write being answered at the kill: wholly there, or not at all.
                key, want = w.in_flight
                before = w.acked.get(key, acked.get(key))
                got = r.get(key)
                assert got in (want, before), (round_no, key)
                landed = (key, got)
            acked.update(w.acked)
            if landed is not None:
                acked[landed[0]] = landed[1]
        for key, want in acked.items():
            assert r.get(key) == want, (round_no, key)
        r.close()
        assert check.stop() == 0
