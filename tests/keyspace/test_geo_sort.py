"""GEOADD, ZRANGESTORE, GEO*STORE and SORT ... STORE as writes: kill -9 under
``appendfsync always`` loses none of them (from the log alone, and from a snapshot plus
the log's tail); SORT ... STORE is one LSTORE record that replays to the same list
(whatever the destination held); WATCH sees each of them; ``--maxmemory`` is asked
before SORT ... STORE and GEOSEARCHSTORE grow a key. Their replies are compared with
redis-server's in ``test_oracle_geo_sort.py``."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import redis

from pion.keyspace import KeyMutation, Keyspace, ListReplace
from pion.keyspace.sort import partial_sort, store_list
from pion.persistence import keyspace_format as kf
from pion.server.run import ServerThread
from support import data_budget

Spawn = Callable[..., Any]


def _writes(r: redis.Redis) -> None:
    r.geoadd("Sicily", [13.361389, 38.115556, "Palermo", 15.087269, 37.502669, "Catania"])
    r.geoadd("Sicily", [13.583333, 37.316667, "Agrigento"])
    r.execute_command("GEORADIUS", "Sicily", 15, 37, 200, "km", "STORE", "near")
    r.execute_command("GEORADIUS", "Sicily", 15, 37, 300, "km", "STOREDIST", "dist")
    r.geosearchstore("box", "Sicily", member="Palermo", width=400, height=400, unit="km")
    r.zrangestore("top", "Sicily", 0, 1, desc=True)
    r.rpush("l", "3", "1", "2", "10")
    r.mset({"w_1": "9", "w_2": "8", "w_3": "7", "w_10": "6"})
    r.set("sorted", "a string, replaced")
    r.expire("sorted", 1000)
    r.sort("l", store="sorted")
    r.sort("l", by="w_*", get=["#", "w_*"], store="by_weight")
    r.set("emptied", "v")
    r.sort("nokey", store="emptied")  # an empty result deletes the destination


def _state(r: redis.Redis) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        if kind == b"list":
            value: Any = r.lrange(key, 0, -1)
        elif kind == b"zset":
            value = r.zrange(key, 0, -1, withscores=True)
        else:
            value = r.get(key)
        out[key] = (kind, value, r.pttl(key))
    return out


def test_geo_and_store_writes_survive_kill9_from_the_log(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    _writes(r)
    before = _state(r)
    position = r.geopos("Sicily", "Palermo")
    assert before[b"sorted"] == (b"list", [b"1", b"2", b"3", b"10"], -1)
    assert before[b"by_weight"][1] == [b"10", b"6", b"3", b"7", b"2", b"8", b"1", b"9"]
    assert b"emptied" not in before
    assert [m for m, _ in before[b"top"][1]] == [b"Palermo", b"Catania"]
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert _state(r2) == before
    assert r2.geopos("Sicily", "Palermo") == position


def test_geo_and_store_writes_survive_a_snapshot_and_the_tail(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.rpush("sorted", "old")
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    _writes(r)
    before = _state(r)
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert _state(r2) == before


def test_lstore_replays_to_the_same_list_whatever_the_key_held() -> None:
    log: list[KeyMutation] = []

    class Journal:
        def append(self, m: KeyMutation) -> None:
            op, parts = kf.encode(m)
            log.append(kf.decode(op, b"".join(bytes(p) for p in parts)))

    ks = Keyspace()
    ks.journal = Journal()
    ks.hash_set(b"k", [(b"f", b"v")])
    store_list(ks, b"k", [b"b", b"\x00\r\n", b"a"])
    assert log[-1] == ListReplace(b"k", (b"b", b"\x00\r\n", b"a"))
    replayed = Keyspace()
    for m in log:
        replayed.apply(m)
    assert list(replayed.list_at(b"k") or ()) == [b"b", b"\x00\r\n", b"a"]
    assert replayed.used_bytes == ks.used_bytes


@pytest.mark.parametrize(
    "write",
    [
        ["GEOADD", "w", "1", "2", "m"],
        ["ZRANGESTORE", "w", "src", "0", "-1"],
        ["GEOSEARCHSTORE", "w", "src", "FROMLONLAT", "0", "0", "BYRADIUS", "1", "km"],
        ["GEORADIUS", "src", "0", "0", "1", "km", "STORE", "w"],
        ["SORT", "l", "STORE", "w"],
    ],
)
def test_watch_sees_each_store(server: ServerThread, write: list[str]) -> None:
    watcher = redis.Redis(port=server.port)
    other = redis.Redis(port=server.port)
    other.geoadd("src", [0, 0, "here"])
    other.rpush("l", "2", "1")
    pipe = watcher.pipeline()
    pipe.watch("w")
    other.execute_command(*write)
    pipe.multi()
    pipe.set("w", "mine")
    with pytest.raises(redis.exceptions.WatchError):
        pipe.execute()


def test_stores_ask_maxmemory_first(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    r.rpush("l", b"x" * 120_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.sort("l", alpha=True, store="copy")
    assert r.exists("copy") == 0
    member = b"m" * 120_000
    r.delete("l")
    r.geoadd("g", [0, 0, member])
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.geosearchstore("g2", "g", longitude=0, latitude=0, radius=1, unit="km")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.zrangestore("g3", "g", 0, -1)
    assert r.exists("g2", "g3") == 0 and r.zcard("g") == 1


@pytest.mark.parametrize("seed", range(20))
def test_partial_sort_sorts_the_asked_positions(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.randrange(30) for _ in range(rng.randrange(1, 120))]
    first = rng.randrange(len(values))
    last = rng.randrange(first, len(values))
    got = list(values)
    partial_sort(got, lambda a, b: (a > b) - (a < b), first, last)
    assert sorted(got) == sorted(values)
    assert got[first : last + 1] == sorted(values)[first : last + 1]
