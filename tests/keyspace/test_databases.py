"""The numbered databases on a real server: real clients (redis-py's ``Redis(db=3)``,
``redis-cli -n 3``), WATCH and a blocked BLPOP meeting SWAPDB (each as redis-server
7.0 answers), and durability across databases: a restart, a snapshot then the log's
tail, kill -9 under ``appendfsync always``, and a log written before there were
databases, which loads into database 0.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pion.config import ServerConfig
from pion.keyspace import Databases, Keyspace
from pion.persistence import Persistence
from pion.persistence.keyspace_durable import KeyspaceDurable
from pion.vstore import VStore
from support.keyspace import RawClient, oracle_pair, read_reply

Spawn = Callable[..., Any]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-db-clients")) as ports:
        yield ports


def test_redis_py_with_db_3(servers: tuple[int, int]) -> None:
    _, port = servers
    zero = redis.Redis(port=port)
    zero.flushall()
    three = redis.Redis(port=port, db=3)
    three.set("k", "three")
    assert zero.get("k") is None
    assert three.get("k") == b"three"
    assert three.dbsize() == 1 and zero.dbsize() == 0
    assert three.move("k", 0) is True
    assert zero.get("k") == b"three"
    assert three.swapdb(0, 3) is True
    assert three.get("k") == b"three" and zero.get("k") is None
    assert " db=3 " in three.execute_command("CLIENT", "INFO").decode()
    assert redis.Redis(port=port, db=3, protocol=3).get("k") == b"three"
    zero.close()
    three.close()


def test_redis_cli_n_3(servers: tuple[int, int]) -> None:
    _, port = servers

    def run(*args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    run("FLUSHALL")
    assert run("-n", "3", "SET", "k", "v").strip() == "OK"
    assert run("-n", "3", "GET", "k").strip() == "v"
    assert run("GET", "k").strip() == ""
    assert run("-n", "3", "DBSIZE").strip() == "1"
    assert "db3:keys=1" in run("INFO", "keyspace")


def test_databases_flag(spawn_server: Spawn) -> None:
    srv = spawn_server("--databases", "4")
    r = srv.client()
    assert r.config_get("databases") == {"databases": "4"}
    assert r.execute_command("SELECT", "3") is True
    with pytest.raises(redis.ResponseError, match=r"^DB index is out of range$"):
        r.execute_command("SELECT", "4")
    with pytest.raises(redis.ResponseError, match=r"^DB index is out of range$"):
        r.move("k", 4)


def _watch_then_swap(port: int) -> tuple[bytes, ...]:
    watcher, other = RawClient(port), RawClient(port)
    watcher.call("FLUSHALL")
    other.call("SELECT", "1")
    other.call("SET", "k", "in-one")
    watcher.call("WATCH", "k")  # missing in database 0
    other.call("SWAPDB", "0", "1")  # database 0 now holds it: a change
    watcher.call("MULTI")
    watcher.call("SET", "x", "1")
    first = watcher.call("EXEC").raw
    watcher.call("WATCH", "nowhere")  # in neither database: no change
    other.call("SWAPDB", "0", "1")
    watcher.call("MULTI")
    watcher.call("SET", "x", "1")
    second = watcher.call("EXEC").raw
    watcher.call("SET", "mine", "v")  # in database 0 (it came back by the second swap)
    watcher.call("WATCH", "mine")
    other.call("SWAPDB", "1", "2")  # other databases: no change here
    other.call("SELECT", "3")
    other.call("FLUSHDB")
    watcher.call("MULTI")
    watcher.call("PING")
    third = watcher.call("EXEC").raw
    watcher.call("WATCH", "mine")
    other.call("SWAPDB", "0", "7")  # it leaves database 0: a change
    watcher.call("MULTI")
    watcher.call("PING")
    fourth = watcher.call("EXEC").raw
    watcher.close()
    other.close()
    return first, second, third, fourth


def test_watch_meets_swapdb_as_redis(servers: tuple[int, int]) -> None:
    want, got = (_watch_then_swap(port) for port in servers)
    assert got == want == (b"*-1\r\n", b"*1\r\n+OK\r\n", b"*1\r\n+PONG\r\n", b"*-1\r\n")


def _blpop_woken_by_swapdb(port: int) -> bytes:
    blocked, other = RawClient(port), RawClient(port)
    blocked.call("FLUSHALL")
    blocked.call("SELECT", "2")
    blocked.send("BLPOP", "q", "0")
    other.call("SELECT", "5")
    other.call("RPUSH", "q", "a", "b")
    # The BLPOP is surely waiting once CLIENT LIST shows it (no sleep needed).
    while b"cmd=blpop" not in bytes(other.call("CLIENT", "LIST").value):
        time.sleep(0.001)
    other.call("SWAPDB", "2", "5")
    reply = read_reply(blocked.f).raw
    assert other.call("LRANGE", "q", "0", "-1").raw == b"*0\r\n"  # database 5 got 2's
    other.call("SELECT", "2")
    assert other.call("LRANGE", "q", "0", "-1").raw == b"*1\r\n$1\r\nb\r\n"
    blocked.close()
    other.close()
    return reply


def test_blpop_woken_by_swapdb_as_redis(servers: tuple[int, int]) -> None:
    want, got = (_blpop_woken_by_swapdb(port) for port in servers)
    assert got == want == b"*2\r\n$1\r\nq\r\n$1\r\na\r\n"


def _fill(port: int) -> None:
    redis.Redis(port=port).set("k", "zero")
    for db in (1, 5, 15):
        c = redis.Redis(port=port, db=db)
        c.set("k", f"db{db}")
        c.hset("h", "f", str(db))
        c.expire("h", 1000)
        c.close()


def _read(port: int) -> dict[int, Any]:
    out = {}
    for db in range(16):
        c = redis.Redis(port=port, db=db)
        if c.dbsize():
            out[db] = (c.get("k"), c.hgetall("h") if c.exists("h") else None, c.ttl("h") > 900)
        c.close()
    return out


def test_restart_keeps_every_database(spawn_server: Spawn) -> None:
    srv = spawn_server()
    _fill(srv.port)
    five = srv.client(db=5)
    assert five.move("k", 7) is True
    assert five.swapdb(15, 14) is True
    assert five.copy("h", "h2", destination_db=9) is True
    assert srv.client(db=1).flushdb() is True
    want = _read(srv.port)
    assert sorted(want) == [0, 5, 7, 9, 14]
    assert srv.stop() == 0
    srv2 = spawn_server()
    assert _read(srv2.port) == want
    # A snapshot, writes in other databases after it, then kill -9.
    r2 = srv2.client()
    assert r2.execute_command("KV.PREFIX.SAVE") == b"OK"
    srv2.client(db=11).set("after", "save")
    r2.set("zero", "after")
    srv2.client(db=14).delete("k")
    want = _read(srv2.port)
    srv2.kill()
    srv3 = spawn_server()
    assert _read(srv3.port) == want
    assert srv3.client(db=11).get("after") == b"save"
    assert srv3.client().get("zero") == b"after"


def test_kill9_under_writes_to_many_databases(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    acked: dict[tuple[int, str], str] = {}
    stop = threading.Event()

    def write(db: int) -> None:
        c = srv.client(db=db, socket_timeout=30)
        i = 0
        try:
            while not stop.is_set():
                key, value = f"k{i % 50}", f"{db}-{i}"
                c.set(key, value)
                acked[db, key] = value
                i += 1
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    threads = [threading.Thread(target=write, args=(db,), daemon=True) for db in (0, 3, 9)]
    for t in threads:
        t.start()
    while len(acked) < 120:
        time.sleep(0.01)
    srv.kill()
    stop.set()
    for t in threads:
        t.join(30)
    srv2 = spawn_server("--appendfsync", "always")
    for (db, key), value in list(acked.items()):
        got = srv2.client(db=db).get(key)
        # The last write of each key may have been in flight (written, not acked).
        assert got is not None and int(got.decode().split("-")[1]) >= int(value.split("-")[1])


def test_a_log_without_databases_loads_into_database_0(tmp_path: Path) -> None:
    config = ServerConfig(dir=tmp_path, appendfsync="no")
    # An old build's log: a lone keyspace's records, no SELECT among them.
    old = Keyspace()
    p = Persistence(config, VStore(config.vstore), KeyspaceDurable(old))
    p.open()
    p.recover_now()
    old.set_string(b"k", b"v")
    old.hash_set(b"h", [(b"f", b"v")])
    p.close()
    dbs = Databases()
    p2 = Persistence(config, VStore(config.vstore), KeyspaceDurable(dbs))
    p2.open()
    p2.recover_now()
    assert dbs[0].string(b"k") == b"v" and dbs[0].hash(b"h") == {b"f": b"v"}
    assert all(len(ks) == 0 for ks in dbs.all[1:])
    p2.close()


def test_blocked_clients_wait_on_their_own_database(servers: tuple[int, int]) -> None:
    _, port = servers
    blocked, other = RawClient(port), RawClient(port)
    blocked.call("FLUSHALL")
    blocked.call("SELECT", "2")
    blocked.send("XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    while b"cmd=xread" not in bytes(other.call("CLIENT", "LIST").value):
        time.sleep(0.001)
    other.call("XADD", "s", "1-1", "db", "0")  # database 0: not the one it waits in
    other.call("SELECT", "2")
    other.call("XADD", "s", "2-1", "db", "2")
    reply = read_reply(blocked.f).value
    assert reply[0][1][0][0] == b"2-1"
    blocked.send("BLPOP", "l", "0")
    while b"cmd=blpop" not in bytes(other.call("CLIENT", "LIST").value):
        time.sleep(0.001)
    other.call("SELECT", "0")
    other.call("RPUSH", "l", "zero")
    other.call("SELECT", "2")
    other.call("RPUSH", "l", "two")
    assert read_reply(blocked.f).value == [b"l", b"two"]
    blocked.close()
    other.close()


def test_the_sweep_expires_keys_of_every_database(servers: tuple[int, int]) -> None:
    _, port = servers
    c = RawClient(port)
    c.call("FLUSHALL")
    c.call("SELECT", "5")
    c.call("SET", "k", "v", "PX", "1")
    c.call("SELECT", "11")
    c.call("SET", "k", "v", "PX", "1")
    # INFO touches no key: only the active sweep can empty these databases.
    while re.search(rb"^db(5|11):", bytes(c.call("INFO", "keyspace").value), re.M):
        time.sleep(0.01)
    stats = bytes(c.call("INFO", "stats").value)
    assert int(re.search(rb"expired_keys:(\d+)", stats).group(1)) >= 2  # type: ignore[union-attr]
    c.close()
