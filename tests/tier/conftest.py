"""Fixtures for the cluster tier: real redis-server processes (a 3-node Redis Cluster,
a standalone server) and pion-server subprocesses pointed at them, each with its own
data directory."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pion_testing.redis_nodes import RedisCluster3, RedisNode

Spawn = Callable[..., Any]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster3]:
    """A 3-node cluster shared by a module's tests (each uses its own key prefix)."""
    c = RedisCluster3()
    yield c
    c.stop()


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster3]:
    """A 3-node cluster of this test alone (it kills and restarts nodes)."""
    c = RedisCluster3()
    yield c
    c.stop()


@pytest.fixture
def redis_node() -> Iterator[RedisNode]:
    node = RedisNode()
    yield node
    node.stop()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own, so tests sharing a cluster never meet."""
    return "t" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]


@pytest.fixture
def tier_server(spawn_server: Spawn, tmp_path: Path, prefix: str) -> Callable[..., Any]:
    """``tier_server(url, name, *flags)``: a pion-server subprocess on the tier at
    ``url`` with data in ``tmp_path/<name>``."""

    def start(url: str, name: str, *flags: str) -> Any:
        argv = ["--dir", str(tmp_path / name), "--tier", url, "--tier-prefix", prefix]
        argv += ["--log-level", "warning", *flags]
        return spawn_server(*argv)

    return start


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert, key), made with openssl."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
