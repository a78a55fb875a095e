"""`pion-server -w N --independent-workers` end to end: real processes, real clients.

Connections spread over the workers; the directory answers LOOKUP on every worker and
sends V-store commands to the owner with the redirect texts clients match; our client
follows them; a killed worker comes back with its acknowledged data while the others
keep serving; a killed supervisor leaves no worker behind; SIGTERM and SHUTDOWN stop
everything cleanly."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import redis
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionClient

from pion.client import PionPromptCache
from pion.client.errors import PionWrongWorker
from pion.wire import affinity_port
from support import ServerProcess, wait_until
from support.workers import gone, info_fields, stats

ROWS = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) / 7


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two workers, shared by the read-mostly tests of this module (each uses its own
    namespaces)."""
    data = tmp_path_factory.mktemp("workers")
    srv = ServerProcess(data.parent, ["-w", "2", "--independent-workers", "--dir", str(data)])
    yield srv
    srv.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for srv in started:
        if srv.proc.poll() is None:
            srv.stop(signal.SIGKILL)
        srv.close()


def _register_on(srv: ServerProcess, worker: int, ns: str, **kw: object) -> redis.Redis:
    r = srv.worker(worker)
    args: list[object] = ["KV.PREFIX.REGISTER", ns, 8, "fp16"]
    for key, value in kw.items():
        args += [key.upper(), value]
    assert r.execute_command(*args) == b"OK"
    return r


def test_connections_land_on_every_worker(cluster: ServerProcess) -> None:
    seen = set()
    clients = [cluster.client() for _ in range(40)]
    try:
        for c in clients:
            seen.add(stats(c)["worker_id"])
    finally:
        for c in clients:
            c.close()
    assert seen == {0, 1}
    # Each affinity port is exactly its worker.
    for w in (0, 1):
        assert stats(cluster.worker(w))["worker_id"] == w
        server_info = cluster.worker(w).info("server")
        assert server_info["worker_id"] == w and server_info["tcp_port"] == cluster.port


def test_lookup_hits_on_every_worker_and_credits_the_asking_worker(cluster: ServerProcess) -> None:
    w0, w1 = cluster.worker(0), cluster.worker(1)
    _register_on(cluster, 0, "hit-ns", prefill_ms=1500)
    w0.execute_command("V.STOREBATCH", "hit-ns_pk", 0, 0, 6, ROWS.tobytes())
    before = stats(w1)
    assert w1.execute_command("KV.PREFIX.LOOKUP", "hit-ns") == b"HIT"
    assert w1.execute_command("KV.PREFIX.LOOKUP", "hit-ns", "TOKENS", 40) == b"HIT"
    assert w1.execute_command("KV.PREFIX.LOOKUP", "nobody-has-this") == b"MISS"
    after = stats(w1)
    assert after["kvprefix_hits"] - before["kvprefix_hits"] == 2
    assert after["kvprefix_misses"] - before["kvprefix_misses"] == 1
    # 0 tokens for the directory hit, 40 for the one that named them; the registered
    # PREFILL_MS travels with the directory entry.
    assert after["kvprefix_tokens_served"] - before["kvprefix_tokens_served"] == 40
    assert after["kvprefix_prefill_us_measured"] - before["kvprefix_prefill_us_measured"] == (
        1_500_000
    )
    # The owner credits its own rows, as a single worker does.
    owner_before = stats(w0)["kvprefix_tokens_served"]
    assert w0.execute_command("KV.PREFIX.LOOKUP", "hit-ns") == b"HIT"
    assert stats(w0)["kvprefix_tokens_served"] - owner_before == 6
    # Through the main port, whichever worker answers: HIT.
    for _ in range(10):
        c = cluster.client()
        assert c.execute_command("KV.PREFIX.LOOKUP", "hit-ns") == b"HIT"
        c.close()


def test_redirect_texts(cluster: ServerProcess) -> None:
    w0 = cluster.worker(0)
    blob = np.arange(4, dtype="<u8").tobytes()
    assert (
        w0.execute_command("KV.PREFIX.REGISTER", "moved", 8, "fp16", "BLOCKS", 16, 4, blob) == b"OK"
    )
    w1 = cluster.worker(1)
    cases = {
        ("V.STOREBATCH", "moved_pk", 0, 0, 6, ROWS.tobytes()): (
            "session lives on worker 0 (this is worker 1); reconnect for V.STOREBATCH"
        ),
        ("V.FETCH", "moved_pv", 0, "RANGE", 0, 6): (
            "session lives on worker 0 (this is worker 1); reconnect for V.FETCH"
        ),
        ("V.FETCH", "moved_pk", "BATCH", 0, 6): (
            "session lives on worker 0 (this is worker 1); reconnect for V.FETCH"
        ),
        ("KV.PREFIX.BLOCKS", "moved"): "KV.PREFIX.BLOCKS session lives on worker 0",
        ("KV.PREFIX.MEMBERSHIP", "moved", 4, blob): (
            "KV.PREFIX.MEMBERSHIP session lives on worker 0"
        ),
        ("KV.PREFIX.DROP", "moved"): "KV.PREFIX.DROP session lives on worker 0",
        ("KV.PREFIX.WARM", "moved", 2, 4): "KV.PREFIX.WARM session lives on worker 0",
        ("KV.PREFIX.REGISTER", "moved", 8, "fp16"): (
            "KV.PREFIX.REGISTER session lives on worker 0"
        ),
    }
    for command, text in cases.items():
        with pytest.raises(redis.ResponseError) as err:
            w1.execute_command(*command)
        assert str(err.value) == text, command
    # Nothing was created or dropped on either worker by the refused commands.
    assert w1.execute_command("KV.PREFIX.OWNER", "moved") == b"0"
    assert w0.execute_command("KV.PREFIX.OWNER", "moved") == b"0"
    assert w1.execute_command("KV.PREFIX.OWNER", "nobody") == b"-1"
    assert w0.execute_command("KV.PREFIX.MEMBERSHIP", "moved", 4, blob) == b"\x0f"
    # Unknown everywhere: the single-worker answers, no redirect.
    assert w1.execute_command("KV.PREFIX.BLOCKS", "nobody") == b"UNKNOWN"
    with pytest.raises(redis.ResponseError, match="session not found"):
        w1.execute_command("V.FETCH", "nobody_pk", 0, "RANGE", 0, 1)
    info = info_fields(w1.execute_command("KV.PREFIX.INFO"))
    assert info["directory_enabled"] == "1" and info["my_worker_id"] == "1"
    assert int(info["directory_entries"]) >= 1
    assert (
        info["directory_entries"]
        == info_fields(w0.execute_command("KV.PREFIX.INFO"))["directory_entries"]
    )


def test_register_race_has_one_owner(cluster: ServerProcess) -> None:
    results: list[object] = []

    def register(worker: int) -> None:
        try:
            results.append(cluster.worker(worker).execute_command(
                "KV.PREFIX.REGISTER", "raced", 8, "fp16"))  # fmt: skip
        except redis.ResponseError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=register, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owner = int(cluster.worker(0).execute_command("KV.PREFIX.OWNER", "raced"))
    assert sorted(map(str, results)) == sorted(
        ["b'OK'", f"KV.PREFIX.REGISTER session lives on worker {owner}"]
    )
    held = [_holds(cluster.worker(w), "raced_pk") for w in (0, 1)]
    assert held == [owner == 0, owner == 1]


def _holds(r: redis.Redis, sid: str) -> bool:
    try:
        r.execute_command("V.INFO", sid)
    except redis.ResponseError:
        return False
    return True


def test_drop_and_eviction_leave_the_directory(tmp_path: Path, spawn: list[ServerProcess]) -> None:
    srv = ServerProcess(
        tmp_path.parent,
        ["-w", "2", "--independent-workers", "--dir", str(tmp_path), "--vstore-max-sessions", "2"],
    )
    spawn.append(srv)
    w1 = srv.worker(1)
    _register_on(srv, 0, "dropped")
    assert w1.execute_command("KV.PREFIX.LOOKUP", "dropped") == b"HIT"
    assert srv.worker(0).execute_command("KV.PREFIX.DROP", "dropped") == 1
    assert w1.execute_command("KV.PREFIX.LOOKUP", "dropped") == b"MISS"
    _register_on(srv, 0, "old")
    _register_on(srv, 0, "new")  # two sessions max: evicts the namespace "old"
    assert w1.execute_command("KV.PREFIX.LOOKUP", "old") == b"MISS"
    assert w1.execute_command("KV.PREFIX.LOOKUP", "new") == b"HIT"
    assert w1.execute_command("KV.PREFIX.OWNER", "old") == b"-1"
    # Now worker 1 may register "old" itself.
    _register_on(srv, 1, "old")
    assert srv.worker(0).execute_command("KV.PREFIX.OWNER", "old") == b"1"


def _client_on_worker(srv: ServerProcess, worker: int, **kw: object) -> PionPromptCache:
    """A PionPromptCache on the main port whose connection landed on ``worker``."""
    for _ in range(200):
        pc = PionPromptCache(port=srv.port, **kw)  # type: ignore[arg-type]
        if pc.stats()["worker_id"] == worker:
            return pc
        pc.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def test_client_follows_redirects_to_the_affinity_port(cluster: ServerProcess) -> None:
    keys = [np.full((5, 8), k, np.float32) for k in range(3)]
    values = [np.full((5, 8), -k, np.float32) for k in range(3)]
    owner = _client_on_worker(cluster, 0)
    owner.register("followed", 8, "fp16", prefill_ms=900)
    owner.store("followed", keys, values)
    assert owner.redirects_followed == 0
    other = _client_on_worker(cluster, 1)
    assert other.lookup("followed") is True
    got_k, got_v = other.fetch("followed")
    assert other.redirects_followed == 1
    assert all(np.array_equal(a, b) for a, b in zip(got_k, keys, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(got_v, values, strict=True))
    assert other.owner("followed") == 0
    # Registering where the namespace is not owned follows the redirect too.
    other.register("followed", 8, "fp16")
    assert other.redirects_followed == 2
    strict = _client_on_worker(cluster, 1, follow_redirects=False)
    with pytest.raises(PionWrongWorker) as moved:
        strict.fetch("followed")
    assert moved.value.worker == 0
    for pc in (owner, other, strict):
        pc.close()


def test_real_pion_client_looks_up_through_any_worker(cluster: ServerProcess) -> None:
    _register_on(cluster, 1, "real-client-ns")
    model = SimpleNamespace(
        args=SimpleNamespace(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            hidden_size=16,
            num_hidden_layers=2,
        )
    )
    for _ in range(6):
        pc = PionClient(model=model, vquant="fp16", port=cluster.port)
        assert pc.lookup("real-client-ns") is True
        assert pc.lookup("real-client-missing") is False


def test_kill9_worker_restarts_with_its_data(tmp_path: Path, spawn: list[ServerProcess]) -> None:
    srv = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(srv)
    w1 = srv.worker(1)
    _register_on(srv, 1, "durable")
    assert w1.execute_command("V.STOREBATCH", "durable_pk", 0, 0, 6, ROWS.tobytes()) == b"OK"
    victim = int(w1.info("server")["process_id"])
    assert victim in srv.worker_pids()
    w1.close()

    # Worker 0 keeps answering, through the kill and the restart.
    failures: list[BaseException] = []
    answered = 0
    stop = threading.Event()

    def hammer() -> None:
        nonlocal answered
        r = srv.worker(0)
        while not stop.is_set():
            try:
                assert r.execute_command("KV.PREFIX.LOOKUP", "durable") == b"HIT"
                answered += 1
            except BaseException as exc:
                failures.append(exc)
                return

    t = threading.Thread(target=hammer)
    t.start()
    try:
        os.kill(victim, signal.SIGKILL)
        back = wait_until(lambda: int(srv.worker(1).info("server")["process_id"]) != victim)
        assert back
    finally:
        stop.set()
        t.join()
    assert failures == [] and answered > 0
    w1 = srv.worker(1)
    assert wait_until(lambda: w1.info("persistence")["loading"] == 0)
    got = w1.execute_command("V.FETCH", "durable_pk", 0, "RANGE", 0, 6)
    assert (
        np.frombuffer(got, np.float32).tolist()
        == ROWS.astype(np.float16).astype(np.float32).ravel().tolist()
    )
    assert int(info_fields(w1.execute_command("KV.PREFIX.INFO"))["wal_replayed"]) >= 3
    # It rejoined the directory: the others still send clients to it.
    assert srv.worker(0).execute_command("KV.PREFIX.OWNER", "durable") == b"1"
    assert srv.worker(0).execute_command("KV.PREFIX.LOOKUP", "durable") == b"HIT"
    assert victim not in srv.worker_pids() and len(srv.worker_pids()) == 2
    assert srv.stop() == 0


def test_kill9_supervisor_leaves_no_worker(tmp_path: Path, spawn: list[ServerProcess]) -> None:
    srv = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(srv)
    workers = srv.worker_pids()
    assert len(workers) == 2
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=30)
    wait_until(lambda: all(gone(pid) for pid in workers), timeout=30)
    for port in (srv.port, affinity_port(srv.port, 0), affinity_port(srv.port, 1)):
        with pytest.raises(redis.ConnectionError):
            srv.client(port, socket_connect_timeout=2).ping()
    # The data directory is free again: a new server starts on it.
    again = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(again)
    assert again.client().ping()


def test_sigterm_stops_every_worker_and_data_survives(
    tmp_path: Path, spawn: list[ServerProcess]
) -> None:
    srv = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(srv)
    for w in (0, 1):
        _register_on(srv, w, f"kept-{w}")
    workers = srv.worker_pids()
    assert srv.stop(signal.SIGTERM) == 0
    assert all(gone(pid) for pid in workers)
    assert "stopped" in srv.log()
    again = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(again)
    for w in (0, 1):
        # Each worker recovered its own files, and the directory was rebuilt.
        assert again.worker(w).execute_command("KV.PREFIX.OWNER", f"kept-{w}") == str(w).encode()
        assert again.worker(1 - w).execute_command("KV.PREFIX.LOOKUP", f"kept-{w}") == b"HIT"


def test_shutdown_command_stops_the_server(tmp_path: Path, spawn: list[ServerProcess]) -> None:
    srv = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    spawn.append(srv)
    workers = srv.worker_pids()
    with pytest.raises(redis.ConnectionError):
        srv.worker(1).execute_command("SHUTDOWN")
    assert srv.proc.wait(timeout=60) == 0
    assert all(gone(pid) for pid in workers)


def test_w_without_independent_workers_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pion", "server", "-w", "2", "--port", "0", "--dir", str(tmp_path)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "-w N needs --independent-workers" in err and "session lives on worker N" in err


def test_a_worker_that_cannot_start_fails_the_start(tmp_path: Path) -> None:
    # Worker 1's files are locked by another process: it cannot take them, so the
    # server does not start (and worker 0 is stopped too).
    fd = os.open(tmp_path / "pion.lock.1", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-m", "pion", "server", "-w", "2", "--independent-workers",
             "--port", "0", "--dir", str(tmp_path)],
            capture_output=True,
            check=False,
            timeout=120,
        )  # fmt: skip
    finally:
        os.close(fd)
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "worker 1 exited with exit code 1 during start-up" in err
    assert "in use by another pion-server" in err
    assert b"ready" not in done.stdout
