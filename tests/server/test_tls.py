"""TLS on the RESP port and the affinity ports (``--tls-cert``, ``--tls-key``,
``--tls-ca``), with certificates made by ``openssl`` for each test session: redis-py
(``ssl=True``), ``redis-cli --tls``, our PionPromptCache, AUTH over TLS, client
certificates, and a plain-text client refused cleanly."""

from __future__ import annotations

import dataclasses
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from pion.client import PionPromptCache
from pion.config import ServerConfig
from pion.errors import PionError
from pion.server.binary_wire import HEADER, MAGIC, OP_AUTH, OP_PING, STATUS_OK
from pion.server.run import ServerThread
from pion.server.tls import server_context
from pion.wire import affinity_port
from support import ServerProcess
from support.workers import Certs, make_certs, scrape, stats


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_server(
    server_factory: Callable[..., ServerThread], certs: Certs
) -> Callable[..., ServerThread]:
    def make(**overrides: object) -> ServerThread:
        return server_factory(tls_cert=certs.cert, tls_key=certs.key, **overrides)

    return make


def _tls_client(srv: ServerThread, certs: Certs, **kw: object) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=srv.port,
        ssl=True,
        ssl_ca_certs=str(certs.ca),
        socket_timeout=30,
        **kw,  # type: ignore[arg-type]
    )


def test_redis_py_over_tls(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server()
    r = _tls_client(srv, certs)
    assert r.ping() is True
    assert r.execute_command("KV.PREFIX.REGISTER", "tls-ns", 8, "fp16") == b"OK"
    rows = np.linspace(-1, 1, 32, dtype=np.float32)
    assert r.execute_command("V.STOREBATCH", "tls-ns_pk", 0, 0, 4, rows.tobytes()) == b"OK"
    got = r.execute_command("V.FETCH", "tls-ns_pk", 0, "RANGE", 0, 4)
    assert np.allclose(np.frombuffer(got, np.float32), rows, atol=1e-3)
    # A large reply goes through the TLS transport whole.
    big = np.ones((4000, 8), np.float32)
    r.execute_command("V.STOREBATCH", "tls-ns_pv", 0, 0, 4000, big.tobytes())
    assert len(r.execute_command("V.FETCH", "tls-ns_pv", 0, "RANGE", 0, 4000)) == big.nbytes
    # The certificate is checked: a client trusting another CA is refused.
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        _tls_client(srv, dataclasses.replace(certs, ca=certs.other_ca)).ping()


def test_plain_text_client_is_refused_cleanly(
    tls_server: Callable[..., ServerThread], certs: Certs
) -> None:
    srv = tls_server()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=srv.port, socket_timeout=10).ping()
    # Raw RESP bytes: the connection is closed and nothing is answered in plain text.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw:
        raw.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert raw.recv(1024) == b""
    # The server is unharmed, and the refused clients never became connections: the
    # only one counted is this TLS client's.
    r = _tls_client(srv, certs)
    assert r.ping() is True
    counters = r.info("stats")
    assert counters["total_connections_received"] == 1
    assert counters["total_protocol_errors"] == 0


def test_auth_over_tls(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server(requirepass="s3cret")
    anonymous = _tls_client(srv, certs)
    with pytest.raises(redis.AuthenticationError):
        anonymous.execute_command("KV.PREFIX.INFO")
    with pytest.raises(redis.AuthenticationError):
        _tls_client(srv, certs, password="wrong").ping()
    r = _tls_client(srv, certs, password="s3cret")
    assert r.ping() is True
    assert b"registered_prefixes" in r.execute_command("KV.PREFIX.INFO")


def _redis_cli(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=30,
    )


def test_redis_cli_tls(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server(requirepass="pw")
    tls = ["--tls", "--cacert", str(certs.ca), "--no-auth-warning", "-a", "pw"]
    done = _redis_cli(srv.port, *tls, "PING")
    assert done.returncode == 0 and done.stdout.strip() == "PONG"
    done = _redis_cli(srv.port, *tls, "KV.PREFIX.REGISTER", "cli-ns", "16", "int8")
    assert done.stdout.strip() == "OK"
    done = _redis_cli(srv.port, *tls, "KV.PREFIX.LOOKUP", "cli-ns")
    assert done.stdout.strip() == "HIT"
    # Without --tls redis-cli gets nothing back from a TLS port.
    plain = _redis_cli(srv.port, "PING")
    assert "PONG" not in plain.stdout


def test_client_certificates(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server(tls_ca=certs.ca)
    mutual = {"ssl_certfile": str(certs.client_cert), "ssl_keyfile": str(certs.client_key)}
    assert _tls_client(srv, certs, **mutual).ping() is True
    with pytest.raises(redis.ConnectionError):
        _tls_client(srv, certs).ping()
    tls = ["--tls", "--cacert", str(certs.ca)]
    done = _redis_cli(
        srv.port, *tls, "--cert", str(certs.client_cert), "--key", str(certs.client_key), "PING"
    )
    assert done.stdout.strip() == "PONG"
    assert "PONG" not in _redis_cli(srv.port, *tls, "PING").stdout


def test_pion_prompt_cache_over_tls(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server(tls_ca=certs.ca)
    options = {
        "ca_certs": str(certs.ca),
        "certfile": str(certs.client_cert),
        "keyfile": str(certs.client_key),
    }
    keys = [np.full((3, 8), 0.5, np.float32)] * 2
    with PionPromptCache(port=srv.port, ssl=options) as pc:
        pc.register("cache-tls", 8, "fp16")
        pc.store("cache-tls", keys, keys)
        got_k, _ = pc.fetch("cache-tls")
        assert np.array_equal(got_k[1], keys[1])
        assert pc.lookup("cache-tls") is True


def _binary_call(sock: socket.socket, opcode: int, body: bytes = b"") -> tuple[int, int, int]:
    """One binary-lane frame out, the reply's header back (magic, status, size)."""
    sock.sendall(HEADER.pack(MAGIC, opcode, len(body)) + body)
    head = b""
    while len(head) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    magic, status, size = HEADER.unpack(head)
    return magic, status, size


def test_binary_lane_over_tls(tls_server: Callable[..., ServerThread], certs: Certs) -> None:
    srv = tls_server(requirepass="pw")
    assert srv.binary_port
    context = ssl.create_default_context(cafile=str(certs.ca))
    raw = socket.create_connection(("127.0.0.1", srv.binary_port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as lane:
        # AUTH frame, then PING, over TLS.
        assert _binary_call(lane, OP_AUTH, b"pw") == (MAGIC, STATUS_OK, 0)
        assert _binary_call(lane, OP_PING) == (MAGIC, STATUS_OK, 0)
    # A plain-text frame on the TLS lane is refused like a plain RESP client.
    with socket.create_connection(("127.0.0.1", srv.binary_port), timeout=10) as plain:
        plain.sendall(HEADER.pack(MAGIC, OP_PING, 0))
        assert plain.recv(64) == b""


def test_bad_tls_configuration_is_refused(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(PionError, match="both --tls-cert and --tls-key"):
        server_context(ServerConfig(tls_cert=certs.cert))
    with pytest.raises(PionError, match="--tls-ca"):
        server_context(ServerConfig(tls_ca=certs.ca))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(PionError, match="cannot load --tls-cert"):
        server_context(ServerConfig(tls_cert=garbage, tls_key=certs.key))
    with pytest.raises(PionError, match="cannot load --tls-cert"):
        server_context(ServerConfig(tls_cert=certs.cert, tls_key=certs.client_key))
    with pytest.raises(PionError, match="cannot load --tls-ca"):
        server_context(ServerConfig(tls_cert=certs.cert, tls_key=certs.key, tls_ca=garbage))
    ctx = server_context(ServerConfig(tls_cert=certs.cert, tls_key=certs.key))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.num_tickets == 0  # see pion.server.tls
    done = subprocess.run(
        [sys.executable, "-m", "pion", "server", "--port", "0", "--dir", str(tmp_path),
         "--tls-cert", str(certs.cert)],
        capture_output=True,
        check=False,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and b"both --tls-cert and --tls-key" in done.stderr


@pytest.fixture
def tls_cluster(tmp_path: Path, certs: Certs) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path.parent,
        [
            "-w", "2", "--independent-workers", "--dir", str(tmp_path),
            "--tls-cert", str(certs.cert), "--tls-key", str(certs.key),
            "--requirepass", "pw", "--metrics-port", "0",
        ]
    )  # fmt: skip
    yield srv
    srv.close()


def test_workers_over_tls(tls_cluster: ServerProcess, certs: Certs) -> None:
    srv = tls_cluster
    options = {"ssl": True, "ssl_ca_certs": str(certs.ca), "password": "pw"}
    # The main port and every affinity port speak TLS, and require AUTH.
    for port in (srv.port, affinity_port(srv.port, 0), affinity_port(srv.port, 1)):
        assert srv.client(port, **options).ping() is True
        with pytest.raises(redis.ConnectionError):
            srv.client(port, socket_timeout=10).ping()
    assert srv.worker(0, **options).execute_command("KV.PREFIX.REGISTER", "w-tls", 8, "fp16")
    rows = [np.full((2, 8), 3.0, np.float32)]
    with PionPromptCache(port=srv.port, password="pw", ssl={"ca_certs": str(certs.ca)}) as first:
        first.store("w-tls", rows, rows)
    # A client whose connection lands on worker 1 follows the redirect over TLS.
    followed = 0
    for _ in range(40):
        with PionPromptCache(port=srv.port, password="pw", ssl={"ca_certs": str(certs.ca)}) as pc:
            on = pc.stats()["worker_id"]
            got_k, _ = pc.fetch("w-tls")
            assert np.array_equal(got_k[0], rows[0])
            followed += pc.redirects_followed
            assert pc.redirects_followed == int(on == 1)
        if followed:
            break
    assert followed == 1
    # The metrics endpoint is served over TLS too.
    context = ssl.create_default_context(cafile=str(certs.ca))
    assert srv.metrics_port is not None
    families = scrape(srv.metrics_port, context)
    assert {s.labels["worker"] for s in families["pion_worker_up"].samples} == {"0", "1"}
    assert stats(srv.worker(0, **options))["worker_id"] == 0
