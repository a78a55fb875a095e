"""Real redis-server processes for the cluster-tier tests and benchmark: one standalone
server (optionally with a password or TLS), or an N-node Redis Cluster on loopback made
with Debian's ``redis-server --cluster-enabled yes`` and ``redis-cli --cluster create``.

Each node lives in its own temporary directory with an append-only file fsynced on
every write, so a node killed with SIGKILL comes back with its data (what the "kill a
cluster node, bring it back, the data is consistent" test needs); ``durable=False``
drops it (benchmarks: Redis's own fsync would be what they measure). Nodes can be
killed and restarted on the same port, with the same ``nodes.conf``.

Not shipped with the package (see ``pion_testing``).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

__all__ = ["RedisCluster3", "RedisNode", "free_cluster_port", "redis_binaries"]

# Cluster bus ports are the data port + 10000 (Redis's fixed offset).
_BUS_OFFSET = 10000
# util-linux's setpriv (Debian) makes the node die with the process that started it,
# so a test run killed by a timeout leaves no cluster behind; without it, nothing.
_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []


def redis_binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise RuntimeError("redis-server / redis-cli missing: run scripts/ensure-system-deps")
    return server, cli


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A port free now whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + _BUS_OFFSET <= 65535 and _free(port + _BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisNode:
    """One redis-server on 127.0.0.1, in its own directory."""

    def __init__(
        self,
        *,
        cluster: bool = False,
        password: str | None = None,
        tls: tuple[Path, Path] | None = None,
        durable: bool = True,
        extra: Sequence[str] = (),
    ) -> None:
        self.server, self.cli = redis_binaries()
        self.dir = Path(tempfile.mkdtemp(prefix="pion-redis-"))
        self.port = free_cluster_port() if cluster else _any_port()
        self.cluster = cluster
        self.password = password
        self.tls = tls
        self.durable = durable
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def _argv(self) -> list[str]:
        argv = [self.server, "--bind", "127.0.0.1", "--dir", str(self.dir)]
        argv += ["--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else []
        argv += ["--protected-mode", "no", "--logfile", str(self.dir / "redis.log")]
        if self.tls is None:
            argv += ["--port", str(self.port)]
        else:
            cert, key = self.tls
            argv += ["--port", "0", "--tls-port", str(self.port)]
            argv += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
            argv += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        if self.cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            argv += ["--cluster-node-timeout", "2000"]
        return argv + self.extra

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*_DIE_WITH_PARENT, *self._argv()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL (the append-only file, fsynced per write, keeps the data)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self) -> redis.Redis:
        ssl_opts: dict[str, object] = {}
        if self.tls is not None:
            ssl_opts = {"ssl": True, "ssl_ca_certs": str(self.tls[0])}
        return redis.Redis(port=self.port, password=self.password, **ssl_opts)  # type: ignore[arg-type]

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "redis.log").read_text()[-2000:]
        return ""

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"


def _any_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisCluster3:
    """A Redis Cluster of ``n`` primaries (no replicas) on loopback."""

    def __init__(self, n: int = 3, *, durable: bool = True) -> None:
        self.nodes = [RedisNode(cluster=True, durable=durable) for _ in range(n)]
        self._slots: list[tuple[int, int, int]] = []
        try:
            _, cli = redis_binaries()
            addrs = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node reports ``cluster_state:ok`` and agrees on slots."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                if node.proc is None:
                    continue
                try:
                    info = node.client().execute_command("CLUSTER", "INFO")
                except redis.RedisError:
                    states.append(False)
                    continue
                text = info.decode() if isinstance(info, bytes) else str(info)
                states.append("cluster_state:ok" in text)
            if states and all(states):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def owner_of(self, key: str | bytes) -> RedisNode:
        """The node serving ``key``'s slot (the slot map is read once: nodes come back
        on their own ports with their own slots)."""
        if not self._slots:
            live = next(node for node in self.nodes if node.proc is not None)
            for start, end, primary, *_ in live.client().execute_command("CLUSTER", "SLOTS"):
                self._slots.append((int(start), int(end), int(primary[1])))
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        port = next(p for lo, hi, p in self._slots if lo <= slot <= hi)
        return next(node for node in self.nodes if node.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
