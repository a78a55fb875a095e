"""The server over real TCP: redis-py (RESP2 and RESP3), redis-cli, redis-benchmark,
and a table of abusive clients. Every abuse must leave the server serving others."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

from pion.commands import build_table
from pion.commands.state import Command
from pion.config import ServerConfig
from pion.server.run import ServerThread
from support import raw_exchange, wait_until


def test_redis_py_resp2(client: redis.Redis) -> None:
    assert client.ping() is True
    assert client.echo(b"\x00bin\r\n") == b"\x00bin\r\n"
    assert client.client_setname("worker-a") is True
    assert client.client_getname() in ("worker-a", b"worker-a")
    assert isinstance(client.client_id(), int)
    assert client.dbsize() == 0
    assert client.execute_command("SELECT", 0) is True
    assert "pion_version" in client.info("server")
    assert client.config_get("port")["port"] != ""


def test_redis_py_resp3(client3: redis.Redis) -> None:
    assert client3.ping() is True
    hello = client3.execute_command("HELLO", 3)
    assert hello[b"proto"] == 3
    assert hello[b"server"] == b"pion"
    stats = client3.execute_command("PION.STATS")
    assert isinstance(stats, dict) and len(stats) == 16
    assert client3.config_get("maxmemory") == {"maxmemory": "0"}


def test_unknown_command_and_arity(client: redis.Redis) -> None:
    with pytest.raises(
        redis.ResponseError, match="unknown command 'NOPE', with args beginning with: 'a'"
    ):
        client.execute_command("NOPE", "a")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'echo' command"):
        client.execute_command("ECHO")
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        client.execute_command("SELECT", 16)
    with pytest.raises(redis.ResponseError, match="not an integer"):
        client.execute_command("SELECT", "+0")


def test_pipeline_10k_in_order(client: redis.Redis) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(10_000):
        pipe.echo(str(i))
    out = pipe.execute()
    assert out == [str(i).encode() for i in range(10_000)]


def test_raw_deep_pipeline_single_write(server: ServerThread) -> None:
    n = 10_000
    wire = b"".join(b"*2\r\n$4\r\nECHO\r\n$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(n))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(wire)
        expected = b"".join(b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(n))
        got = b""
        while len(got) < len(expected):
            chunk = s.recv(1 << 20)
            assert chunk
            got += chunk
    assert got == expected


ABUSE = [
    (
        "bulk header over the limit",
        b"*2\r\n$4\r\nECHO\r\n$999999999999\r\n",
        b"invalid bulk length",
    ),
    ("negative bulk length", b"*2\r\n$4\r\nECHO\r\n$-7\r\n", b"invalid bulk length"),
    ("negative multibulk", b"*-5\r\nPING\r\nQUIT\r\n", b"+PONG"),
    ("huge multibulk", b"*99999999\r\n", b"invalid multibulk length"),
    ("non-numeric multibulk", b"*x\r\n", b"invalid multibulk length"),
    ("wrong type inside array", b"*1\r\n:1\r\n", b"expected '$', got ':'"),
    ("unbalanced quotes", b'ECHO "abc\r\n', b"unbalanced quotes"),
    ("unterminated inline line", b"A" * (70 * 1024), b"too big inline request"),
    ("binary garbage", bytes(range(256)) * 8, b"-ERR"),
]


@pytest.mark.parametrize(("name", "payload", "expect"), ABUSE, ids=[a[0] for a in ABUSE])
def test_abusive_inputs(
    server: ServerThread, client: redis.Redis, name: str, payload: bytes, expect: bytes
) -> None:
    rows = np.arange(64 * 16, dtype="<f4").reshape(64, 16)
    client.execute_command("KV.PREFIX.REGISTER", "kept", 16, "fp16")
    client.execute_command("V.STOREBATCH", "kept_pk", 0, 0, 64, rows.tobytes())
    reply = raw_exchange(server.port, payload)
    assert expect in reply
    if b"Protocol error" in reply:
        assert reply.endswith(b"\r\n")
    # The server still serves everyone else, and lost nothing.
    assert client.ping() is True
    assert client.echo("still here") == b"still here"
    back = client.execute_command("V.FETCH", "kept_pk", 0, "RANGE", 0, 64)
    assert np.array_equal(np.frombuffer(back, "<f4").reshape(64, 16), rows)
    assert client.execute_command("KV.PREFIX.LOOKUP", "kept") == b"HIT"


def test_oversized_bulk_refused_without_buffering(
    server_factory: Callable[..., ServerThread],
) -> None:
    from pion.config import ProtocolLimits

    srv = server_factory(protocol=ProtocolLimits(max_bulk_len=1024))
    reply = raw_exchange(srv.port, b"*2\r\n$4\r\nECHO\r\n$1025\r\n")
    assert b"Protocol error: invalid bulk length" in reply


def test_client_vanishing_mid_bulk(server: ServerThread, client: redis.Redis) -> None:
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"*3\r\n$12\r\nV.STOREBATCH\r\n$100000\r\n" + b"x" * 5000)
        s.close()
    assert client.ping() is True
    # The server sees each close when its loop reads it: wait for that, not a while.
    wait_until(lambda: len(client.client_list()) == 1, timeout=30, what="the closed clients")


def test_200_concurrent_clients(server: ServerThread) -> None:
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            r = redis.Redis(port=server.port, socket_timeout=30)
            for j in range(20):
                assert r.echo(f"{i}-{j}") == f"{i}-{j}".encode()
            r.close()
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_internal_error_is_contained(tmp_path: Path) -> None:
    def boom(ctx: object, args: object) -> None:
        raise ZeroDivisionError("bug")

    table = build_table([Command("TEST.BOOM", boom, 1)])
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path), table=table).start()
    try:
        client = redis.Redis(port=srv.port)
        other = redis.Redis(port=srv.port)
        with pytest.raises(redis.ResponseError, match="internal error"):
            client.execute_command("TEST.BOOM")
        assert client.ping() and other.ping()
        assert client.info("stats")["total_internal_errors"] == 1
    finally:
        srv.stop()


def test_unencodable_reply_is_contained(tmp_path: Path) -> None:
    """A handler returning what the encoder cannot encode: the pipeline's earlier
    replies stay, the bad one is -ERR internal error, the connection lives on."""

    def odd(ctx: object, args: object) -> object:
        return [1, object()]  # half-encodable: the array header goes out first

    table = build_table([Command("TEST.ODD", odd, 1)])  # type: ignore[list-item]
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path), table=table).start()
    try:
        reply = raw_exchange(
            srv.port,
            b"*1\r\n$4\r\nPING\r\n*1\r\n$8\r\nTEST.ODD\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n",
            read_until_close=False,
            expect=b"$2\r\nhi\r\n",
        )
        assert reply == b"+PONG\r\n-ERR internal error\r\n$2\r\nhi\r\n"
        client = redis.Redis(port=srv.port)
        assert client.info("stats")["total_internal_errors"] == 1
    finally:
        srv.stop()


def test_redis_cli(server: ServerThread) -> None:
    base = ["redis-cli", "-p", str(server.port)]
    assert (
        subprocess.run([*base, "PING"], capture_output=True, text=True, check=True).stdout
        == "PONG\n"
    )
    piped = subprocess.run(
        [*base, "-x", "ECHO"], input=b"from stdin", capture_output=True, check=True
    )
    assert piped.stdout == b"from stdin\n"
    interactive = subprocess.run(
        base,
        input="PING\nECHO hello\nKV.PREFIX.LOOKUP nope\nQUIT\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "PONG" in interactive.stdout
        and "hello" in interactive.stdout
        and "MISS" in interactive.stdout
    )
    info = subprocess.run([*base, "INFO", "pion"], capture_output=True, text=True, check=True)
    assert "stats_scope:worker" in info.stdout


def test_redis_benchmark(server: ServerThread) -> None:
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(server.port),
            "-n",
            "2000",
            "-c",
            "10",
            "-q",
            "KV.PREFIX.LOOKUP",
            "bench-ns",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "requests per second" in out.stdout
    ping = subprocess.run(
        ["redis-benchmark", "-p", str(server.port), "-n", "2000", "-t", "ping", "-q", "-P", "16"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "PING" in ping.stdout


def test_sigterm_graceful_shutdown(spawn_server: Callable[..., object]) -> None:
    srv = spawn_server()
    r = srv.client()  # type: ignore[attr-defined]
    assert r.ping()
    assert srv.stop() == 0  # type: ignore[attr-defined]


def test_refuses_public_bind_without_password() -> None:
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pion", "server", "--bind", "0.0.0.0", "--port", "0", "--no-wal"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "requirepass" in out.stderr
