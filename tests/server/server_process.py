"""A real ``pion-server`` process for the hardening tests: memory is judged by the
server's own resident set size (read with psutil), and its log goes to a file the test
can read (a pipe nobody drains would stall a server that logs a lot).

Also the raw-socket helpers the hostile clients of those tests share.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import redis

__all__ = [
    "MiB",
    "ServerProcess",
    "command",
    "read_reply_line",
    "running_server",
    "store_fetchable",
]

MiB = 1024 * 1024
_READY = re.compile(rb"pion-server ready port=(\d+)")
_WITH_NOFILE = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
    "sys.argv[0] = 'pion'; runpy.run_module('pion', run_name='__main__', alter_sys=True)"
)


class ServerProcess:
    """``python -m pion server --port 0 <args>``; stderr goes to ``log_path``."""

    def __init__(
        self,
        tmp_path: Path,
        args: Sequence[str],
        *,
        password: str | None = None,
        env: dict[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
    ) -> None:
        self.password = password
        self.log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
        argv = list(args)
        if "--dir" not in argv:
            argv += ["--dir", str(tmp_path / "data")]
        if password is not None:
            argv += ["--requirepass", password]
        cmd = [sys.executable, "-m", "pion", "server", "--port", "0", *argv]
        if nofile is not None:
            # Start the server under this open-files limit (soft, hard), as `ulimit -n`.
            cmd[1:3] = ["-c", _WITH_NOFILE % nofile]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line)
            if m:
                self.port = int(m.group(1))
                self._ps = psutil.Process(self.proc.pid)
                return
        self.stop()
        raise RuntimeError(f"pion-server did not start:\n{self.log()}")

    def rss(self) -> int:
        """The server's resident set size in bytes, now."""
        return int(self._ps.memory_info().rss)

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kw)

    def connect(self, timeout: float = 10) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as r:
            return dict(r.info(section))

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@contextmanager
def running_server(tmp_path: Path, *args: str, **kw: Any) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path, args, **kw)
    try:
        yield srv
    finally:
        srv.stop()


def command(*parts: bytes | str | int) -> bytes:
    """One request encoded as a RESP multibulk."""
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def read_reply_line(sock: socket.socket, timeout: float = 10) -> bytes:
    """Bytes up to the first CRLF (or what came before the peer closed)."""
    sock.settimeout(timeout)
    got = b""
    while b"\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def store_fetchable(r: redis.Redis, sid: str, rows: int, dim: int) -> np.ndarray:
    """A one-layer fp16 session whose ``V.FETCH sid 0 RANGE 0 rows`` reply is
    ``rows * dim * 4`` bytes of fp32; returns what it holds."""
    r.execute_command("V.CREATE", sid, dim, "VQUANT", "fp16")
    values = (np.arange(rows * dim, dtype=np.float32) % 1024).reshape(rows, dim)
    r.execute_command("V.STOREBATCH", sid, 0, 0, rows, values.tobytes())
    return values
