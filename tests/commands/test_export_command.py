"""V.EXPORT end to end: a real server on port 0, redis-py and redis-cli clients, the
files read back with safetensors' own reader."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

from pion.codecs import FORMAT_NAMES
from pion.server.run import ServerThread
from support import non_loopback_address

H, D, N, L = 4, 16, 40, 3
DIM = H * D


def f32(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def prefix(client: redis.Redis, ns: str, fmt: str = "fp16", n: int = N) -> None:
    client.execute_command("KV.PREFIX.REGISTER", ns, DIM, fmt)
    for side, seed in (("_pk", 1), ("_pv", 2)):
        for i in range(L):
            blob = f32(n, DIM, seed * 100 + i).tobytes()
            client.execute_command("V.STOREBATCH", ns + side, i, 0, n, blob)


def export(client: redis.Redis, ns: str, *args: Any) -> str:
    reply = client.execute_command("V.EXPORT", f"{ns}_pk", f"{ns}_pv", *(args or (0, N, L, H, D)))
    assert isinstance(reply, bytes)
    return reply.decode()


def export_files(server: ServerThread) -> list[str]:
    root = server.config.export_directory
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_file_equals_what_v_fetch_answers(client: redis.Redis, fmt: str) -> None:
    prefix(client, "p", fmt)
    path = export(client, "p", 5, N + 3, L, H, D)  # a window past the stored rows too
    tensors = load_file(path)
    assert sorted(tensors) == sorted(f"{s}.{i}" for s in "kv" for i in range(L))
    for side in "kv":
        for i in range(L):
            sid = f"p_p{side}"
            native = client.execute_command("V.FETCH", sid, i, "RANGE", 5, N + 3, "FMT", "NATIVE")
            rows = np.frombuffer(native, "<f2" if fmt == "fp16" else "<f4")
            want = rows.astype(np.float16).reshape(N - 2, H, D).transpose(1, 0, 2)
            got = tensors[f"{side}.{i}"]
            assert got.shape == (1, H, N - 2, D) and got.dtype == np.float16
            np.testing.assert_array_equal(got[0].view("<u2"), want.view("<u2"))


def test_private_file_in_a_private_dir_under_the_data_dir(
    client: redis.Redis, server: ServerThread
) -> None:
    prefix(client, "p")
    path = Path(export(client, "p"))
    assert path.is_absolute() and path.parent == server.config.dir.absolute() / "pion-export"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_export_dir_setting(
    server_factory: Callable[..., ServerThread], tmp_path: Path, where: str
) -> None:
    target = tmp_path / "shm-like" if where == "absolute" else Path("sub/exports")
    srv = server_factory(export_dir=target)
    r = redis.Redis(port=srv.port)
    prefix(r, "p")
    path = Path(export(r, "p"))
    want = target if where == "absolute" else srv.config.dir.absolute() / target
    assert path.parent == want


@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o770])
def test_a_shared_export_dir_is_refused_and_left_as_it_was(
    server_factory: Callable[..., ServerThread], tmp_path: Path, mode: int
) -> None:
    """An existing directory open to other users (a /tmp or /dev/shm) is never
    tightened: V.EXPORT is refused, naming the mode, and the mode stays; a path that
    does not exist yet inside it becomes the server's own 0700 directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    srv = server_factory(export_dir=shared)
    r = redis.Redis(port=srv.port)
    prefix(r, "p")
    message = err(r, "V.EXPORT", "p_pk", "p_pv", 0, N, L, H, D)
    assert f"has mode {mode:o}, open to other users" in message
    assert "must be private" in message
    assert stat.S_IMODE(shared.stat().st_mode) == mode
    assert list(shared.iterdir()) == []
    assert r.ping()

    inside = server_factory(export_dir=shared / "pion-export")
    r2 = redis.Redis(port=inside.port)
    prefix(r2, "p")
    path = Path(export(r2, "p"))
    assert path.parent == shared / "pion-export"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(shared.stat().st_mode) == mode


def test_a_private_existing_export_dir_is_used_as_it_is(
    server_factory: Callable[..., ServerThread], tmp_path: Path
) -> None:
    own = tmp_path / "own"
    own.mkdir()
    os.chmod(own, 0o1700)  # private (the sticky bit gives nobody access)
    srv = server_factory(export_dir=own)
    r = redis.Redis(port=srv.port)
    prefix(r, "p")
    assert Path(export(r, "p")).parent == own
    assert stat.S_IMODE(own.stat().st_mode) == 0o1700


def test_reused_until_a_write_restore_drop_or_eviction(
    server_factory: Callable[..., ServerThread],
) -> None:
    srv = server_factory(vstore_max_sessions=4)
    r = redis.Redis(port=srv.port)
    r3 = redis.Redis(port=srv.port, protocol=3)
    prefix(r, "p")
    first = export(r, "p")
    assert export(r3, "p") == first == export(r, "p")
    assert len(export_files(srv)) == 1

    r.execute_command("V.STOREBATCH", "p_pv", 2, 0, 1, f32(1, DIM, 9).tobytes())
    assert not os.path.exists(first)
    second = export(r, "p")
    assert second != first and load_file(second)["v.2"].shape == (1, H, N, D)

    snap = r.execute_command("V.SNAPSHOT", "p_pk")
    assert export(r, "p") == second  # a snapshot changes no rows
    r.execute_command("V.STOREBATCH", "p_pk", 0, N, 2, f32(2, DIM, 8).tobytes())
    assert not os.path.exists(second)
    grown = export(r, "p")
    r.execute_command("V.RESTORE", "p_pk", snap)
    assert not os.path.exists(grown)
    third = export(r, "p")
    assert third not in (first, second, grown)

    assert r.execute_command("KV.PREFIX.DROP", "p") == 1
    assert not os.path.exists(third) and export_files(srv) == []
    assert "session not found" in err(r, "V.EXPORT", "p_pk", "p_pv", 0, N, L, H, D)

    prefix(r, "q")
    gone = export(r, "q")
    prefix(r, "x")  # 4 sessions: the limit
    r.execute_command("V.CREATE", "y_pk", DIM)  # evicts q, the least recently used
    assert not os.path.exists(gone) and export_files(srv) == []


def test_errors_name_the_problem_and_write_nothing(
    client: redis.Redis, server: ServerThread
) -> None:
    prefix(client, "p")
    client.execute_command("V.CREATE", "odd_pv", 48)
    client.execute_command("V.STOREBATCH", "odd_pv", 0, 0, N, f32(N, 48, 3).tobytes())
    cases: list[tuple[tuple[Any, ...], str]] = [
        (("p_pk", "p_pv", 0, N, L, H), "wrong number of arguments for 'v.export'"),
        (("p_pk", "p_pv", 0, N, L, H, D, "x"), "wrong number of arguments for 'v.export'"),
        (("p_pk", "p_pv", "0x", N, L, H, D), "not an integer or out of range (start)"),
        (("p_pk", "p_pv", 0, N, L, H, "+16"), "not an integer or out of range (head_dim)"),
        (("p_pk", "p_pv", -1, N, L, H, D), "invalid range"),
        (("p_pk", "p_pv", 5, 5, L, H, D), "invalid range"),
        (("p_pk", "p_pv", 0, 200_001, L, H, D), "rows out of range (end must be <= 200000)"),
        (("p_pk", "p_pv", 0, N, 0, H, D), "n_layers out of range (1..80)"),
        (("p_pk", "p_pv", 0, N, 81, H, D), "n_layers out of range (1..80)"),
        (("p_pk", "p_pv", 0, N, L, 0, D), "n_kv_heads and head_dim must be 1..8192"),
        (("p_pk", "p_pv", 0, N, L, 1, 8193), "n_kv_heads and head_dim must be 1..8192"),
        (("p_pk", "p_pv", 0, N, L, 8192, 2), "exceeds the largest dim 8192"),
        (("p_pk", "nope", 0, N, L, H, D), "session not found"),
        (("p_pk", "p_pv", 0, N, L + 1, H, D), "layer 3 of the k session holds no rows"),
        (("p_pk", "p_pv", N, N + 1, L, H, D), "holds no rows in [40, 41)"),
        (("p_pk", "p_pv", 0, N, L, 2, D), "has dim 64, not n_kv_heads*head_dim = 2*16 = 32"),
        (("p_pk", "odd_pv", 0, N, 1, H, D), "layer 0 of the v session has dim 48"),
    ]
    for args, text in cases:
        assert text in err(client, "V.EXPORT", *args), args
    assert export_files(server) == []


def test_refused_for_a_peer_that_is_not_loopback(
    server_factory: Callable[..., ServerThread],
) -> None:
    addr = non_loopback_address()
    srv = server_factory(bind="0.0.0.0", requirepass="pw")
    local = redis.Redis(host="127.0.0.1", port=srv.port, password="pw")
    remote = redis.Redis(host=addr, port=srv.port, password="pw")
    prefix(local, "p")
    text = err(remote, "V.EXPORT", "p_pk", "p_pv", 0, N, L, H, D)
    assert f"refused for a non-local client (peer {addr})" in text and "V.FETCH" in text
    assert export_files(srv) == []
    # The same command from loopback on the same server is served.
    assert os.path.exists(export(local, "p"))
    # What the refused client does instead works: the rows through the socket.
    assert len(remote.execute_command("V.FETCH", "p_pk", 0, "RANGE", 0, N)) == N * DIM * 4


def test_no_export_refuses(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory(export_enabled=False)
    r = redis.Redis(port=srv.port)
    prefix(r, "p")
    assert "disabled on this server (--no-export)" in err(
        r, "V.EXPORT", "p_pk", "p_pv", 0, N, L, H, D
    )
    assert not srv.config.export_directory.exists()


def test_receipt_counts_the_bytes_and_the_fetches(client: redis.Redis) -> None:
    prefix(client, "p")

    def served() -> int:
        pairs = client.execute_command("PION.STATS")
        return int(dict(zip(pairs[::2], pairs[1::2], strict=True))[b"kvprefix_bytes_served"])

    def fetches() -> int:
        text = client.execute_command("V.INFO").decode()
        return int(text.split("total_fetches:")[1].split()[0])

    before, fetched = served(), fetches()
    export(client, "p")
    export(client, "p")  # reused: still a delivery of every byte
    assert served() - before == 2 * (2 * L * N * DIM * 2)
    assert fetches() - fetched == 2 * 2 * L
    err(client, "V.EXPORT", "p_pk", "p_pv", 0, N, L + 1, H, D)
    assert served() - before == 2 * (2 * L * N * DIM * 2)


def test_path_never_holds_client_bytes(client: redis.Redis, server: ServerThread) -> None:
    paths = []
    for sid in ("../../etc/passwd", "/tmp/x", "a\x00b", "\r\n$", "é" * 50):
        client.execute_command("V.CREATE", sid, DIM, "VQUANT", "fp16")
        client.execute_command("V.STOREBATCH", sid, 0, 0, 2, f32(2, DIM, 0).tobytes())
        reply = client.execute_command("V.EXPORT", sid, sid, 0, 2, 1, H, D)
        paths.append(Path(reply.decode()))
    assert {p.parent for p in paths} == {server.config.export_directory}
    assert all(p.name.startswith(f"pion-{os.getpid()}-") for p in paths)
    assert sorted(p.name for p in paths) == export_files(server)


def test_files_go_with_a_graceful_shutdown(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    prefix(r, "p")
    path = export(r, "p")
    srv.stop()
    assert not os.path.exists(path)


def test_files_of_a_killed_server_are_swept_by_the_next(
    spawn_server: Callable[..., Any], tmp_path: Path
) -> None:
    target = tmp_path / "exports"
    env = {"PION_EXPORT_DIR": str(target)}
    first = spawn_server("--no-wal", env=env)
    r = first.client()
    prefix(r, "p")
    path = Path(export(r, "p"))
    assert path.parent == target  # $PION_EXPORT_DIR, as Pion reads it
    first.kill()  # kill -9: no cleanup
    assert path.exists()
    second = spawn_server("--no-wal", env=env)
    r2 = second.client()
    prefix(r2, "q")
    fresh = Path(export(r2, "q"))
    assert not path.exists() and fresh.exists()
    assert sorted(p.name for p in target.iterdir()) == [fresh.name]


def test_redis_cli_and_command_info(client: redis.Redis, server: ServerThread) -> None:
    prefix(client, "p")
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli is not installed (Debian redis-tools)")
    out = subprocess.run(
        [cli, "-p", str(server.port), "V.EXPORT", "p_pk", "p_pv", "0", str(N), "3", "4", "16"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    path = out.stdout.decode().strip()
    assert load_file(path)["k.1"].shape == (1, H, N, D)
    info = client.execute_command("COMMAND", "INFO", "v.export")["v.export"]
    assert info["arity"] == 8 and "readonly" in info["flags"]


_ARG = st.one_of(
    st.binary(max_size=12),
    st.integers(-(2**64), 2**64).map(lambda i: str(i).encode()),
    st.sampled_from([b"p_pk", b"p_pv", b"0", b"40", b"3", b"4", b"16", b"-1", b""]),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_ARG, max_size=9))
def test_hostile_arguments_never_reach_the_internal_error_path(
    client: redis.Redis, server: ServerThread, args: list[bytes]
) -> None:
    if b"p_pk" not in server.state.vstore:  # hypothesis reuses the fixtures
        prefix(client, "p")
    try:
        client.execute_command("V.EXPORT", *args)
    except redis.ResponseError as exc:
        assert "internal error" not in str(exc)
    assert server.state.counters.internal_errors == 0
    assert client.ping()
