"""SSM.PREFIX.STORE / FETCH / DROP over TCP: opaque blobs, empty versus absent, errors,
the byte budget, and durability: a restart replays the log, SAVE writes pion.ssm.<w>
beside the V-store's snapshot, and kill -9 under --appendfsync always loses no
acknowledged write (the blob in flight is wholly there or wholly absent)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.persistence import faults, wal_path
from pion.persistence.check import check_file
from pion.server.run import ServerThread


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def test_store_fetch_drop(client: redis.Redis) -> None:
    blob = bytes(range(256)) * 40
    assert client.execute_command("SSM.PREFIX.STORE", "ns", 3, blob) == b"OK"
    assert client.execute_command("SSM.PREFIX.STORE", "ns", 4, b"") == b"OK"
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 3) == blob
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 4) == b""  # $0: stored empty
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 5) is None  # $-1: absent
    assert client.execute_command("SSM.PREFIX.FETCH", "other", 3) is None
    assert client.execute_command("SSM.PREFIX.DROP", "ns", 3) == b"OK"
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 3) is None
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 4) == b""
    assert client.execute_command("SSM.PREFIX.DROP", "ns") == b"OK"
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 4) is None
    assert client.execute_command("SSM.PREFIX.DROP", "never") == b"OK"
    info = client.info("memory")
    assert info["ssm_bytes"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["SSM.PREFIX.STORE", "ns", -1, b"x"], "layer_id out of range (0..65535)"),
        (["SSM.PREFIX.STORE", "ns", 65536, b"x"], "layer_id out of range"),
        (["SSM.PREFIX.STORE", "", 0, b"x"], "session_id length must be 1..512"),
        (["SSM.PREFIX.STORE", "ns", "one", b"x"], "not an integer"),
        (["SSM.PREFIX.FETCH", "ns", "1x"], "not an integer"),
        (["SSM.PREFIX.DROP", "ns", -3], "layer_id out of range"),
        (["SSM.PREFIX.DROP", "ns", 1, 2], "syntax error"),
        (["SSM.PREFIX.STORE", "ns", 0], "wrong number of arguments"),
    ],
)
def test_bad_input(client: redis.Redis, args: list[Any], message: str) -> None:
    client.execute_command("SSM.PREFIX.STORE", "ns", 1, b"kept")
    assert message in err(client, *args)
    assert client.execute_command("SSM.PREFIX.FETCH", "ns", 1) == b"kept"


def test_budget(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(ssm_maxmemory=1000)
    c = redis.Redis(port=server.port)
    c.execute_command("SSM.PREFIX.STORE", "a", 0, b"x" * 900)
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="ssm-maxmemory"):
        c.execute_command("SSM.PREFIX.STORE", "a", 1, b"x" * 200)
    assert c.execute_command("SSM.PREFIX.FETCH", "a", 1) is None


def test_restart_replays_and_save_writes_its_own_snapshot(
    spawn_server: Callable[..., Any], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    s = spawn_server()
    c = s.client()
    c.execute_command("KV.PREFIX.REGISTER", "ns", 8, "fp16")
    c.execute_command("SSM.PREFIX.STORE", "ns", 0, b"state-zero")
    c.execute_command("SSM.PREFIX.STORE", "ns", 1, b"")
    c.execute_command("SSM.PREFIX.STORE", "gone", 0, b"x")
    c.execute_command("SSM.PREFIX.DROP", "gone")
    s.kill()  # the log alone
    s = spawn_server()
    c = s.client()
    assert c.execute_command("SSM.PREFIX.FETCH", "ns", 0) == b"state-zero"
    assert c.execute_command("SSM.PREFIX.FETCH", "ns", 1) == b""
    assert c.execute_command("SSM.PREFIX.FETCH", "gone", 0) is None
    assert c.execute_command("KV.PREFIX.SAVE") == b"OK"
    assert (data / "pion.ssm.0").exists() and (data / "pion.vstore.0").exists()
    c.execute_command("SSM.PREFIX.STORE", "ns", 2, b"after-save")
    c.execute_command("SSM.PREFIX.DROP", "ns", 1)
    assert s.stop() == 0
    s = spawn_server()  # the snapshot, then the log since
    c = s.client()
    assert c.execute_command("SSM.PREFIX.FETCH", "ns", 0) == b"state-zero"
    assert c.execute_command("SSM.PREFIX.FETCH", "ns", 1) is None
    assert c.execute_command("SSM.PREFIX.FETCH", "ns", 2) == b"after-save"
    assert c.execute_command("KV.PREFIX.LOOKUP", "ns") == b"HIT"
    info = c.info("persistence")
    assert info["wal_replayed"] == 2


def test_kill9_loses_no_acknowledged_blob(spawn_server: Callable[..., Any]) -> None:
    rng = random.Random(1234)
    acked: dict[tuple[str, int], bytes | None] = {}
    for round_no in range(4):
        s = spawn_server("--appendfsync", "always")
        c = s.client()
        for key, blob in acked.items():
            assert c.execute_command("SSM.PREFIX.FETCH", *key) == blob, key
        in_flight: list[tuple[tuple[str, int], bytes | None, bytes | None]] = []
        stop = threading.Event()

        def write(
            c: redis.Redis = c,
            stop: threading.Event = stop,
            in_flight: list[tuple[tuple[str, int], bytes | None, bytes | None]] = in_flight,
        ) -> None:
            while not stop.is_set():
                key = (f"s{rng.randrange(5)}", rng.randrange(4))
                drop = rng.random() < 0.2
                blob = None if drop else rng.randbytes(rng.randrange(0, 5000))
                in_flight[:] = [(key, acked.get(key), blob)]
                try:
                    if drop:
                        c.execute_command("SSM.PREFIX.DROP", *key)
                    else:
                        c.execute_command("SSM.PREFIX.STORE", *key, blob)
                except (redis.ConnectionError, redis.TimeoutError):
                    return
                acked[key] = blob
                in_flight.clear()

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.3 + 0.2 * round_no)
        s.kill()
        stop.set()
        writer.join(timeout=30)
        if in_flight:  # either outcome is allowed for the unanswered write
            key, before, after = in_flight[0]
            r = spawn_server("--appendfsync", "always")
            got = r.client().execute_command("SSM.PREFIX.FETCH", *key)
            assert got in (before, after)
            acked[key] = got
            r.kill()
    assert len(acked) > 3


def test_check_wal_names_ssm_records(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(appendfsync="always")
    c = redis.Redis(port=server.port)
    c.execute_command("SSM.PREFIX.STORE", "a", 0, b"abc")
    c.execute_command("SSM.PREFIX.STORE", "a", 1, b"")
    c.execute_command("SSM.PREFIX.DROP", "a", 0)
    report = check_file(wal_path(server.config.dir, 0))
    assert report.ok and report.counts == {"SSM_STORE": 2, "SSM_DROP": 1}


def test_a_crash_at_each_save_step_loses_neither_store(
    spawn_server: Callable[..., Any], tmp_path: Path
) -> None:
    """SAVE writes pion.ssm.<w> first and the V-store's file last: a crash at any step
    (the first SAVE included, between the two renames) loses nothing of either."""
    blobs: dict[int, bytes] = {}
    for n, step in enumerate(faults.STEPS):
        srv = spawn_server("--appendfsync", "always", env={"PION_TEST_FAULT": f"{step}:exit"})
        r = srv.client(retry=Retry(NoBackoff(), 0))
        r.execute_command("V.CREATE", "v", 4, "VQUANT", "fp16")
        r.execute_command("V.STOREBATCH", "v", 0, n, 1, bytes([n]) * 8, "FMT", "F16")
        blobs[n] = bytes([n]) * (n + 1)
        r.execute_command("SSM.PREFIX.STORE", "s", n, blobs[n])
        with pytest.raises(redis.ConnectionError):
            r.execute_command("KV.PREFIX.SAVE")
        assert srv.proc.wait(30) == faults.EXIT_CODE
        srv2 = spawn_server("--appendfsync", "always")
        r2 = srv2.client()
        for layer, blob in blobs.items():
            assert r2.execute_command("SSM.PREFIX.FETCH", "s", layer) == blob, (step, layer)
            row = r2.execute_command("V.FETCH", "v", 0, "RANGE", layer, layer + 1, "FMT", "NATIVE")
            assert row == bytes([layer]) * 8, (step, layer)
        assert srv2.stop() == 0
    assert not list((tmp_path / "data").glob("*.tmp"))
