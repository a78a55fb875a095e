"""Shared fixtures: a real server on port 0, in-process (fast) or as a subprocess (for
signals, kill -9 and restarts), and redis-py clients connected to it."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings

from pion.config import ServerConfig
from pion.server.run import ServerThread

# CI replays the same examples every run (a red build is reproducible); a developer's
# run explores new ones each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev")
settings.load_profile("ci" if os.environ.get("CI") else "dev")

_READY = re.compile(rb"pion-server ready port=(\d+)")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Start in-process servers with ServerConfig overrides; all stopped at teardown."""
    started: list[ServerThread] = []

    def make(**overrides: Any) -> ServerThread:
        overrides.setdefault("port", 0)
        overrides.setdefault("dir", tmp_path / f"data{len(started)}")
        config = dataclasses.replace(ServerConfig(), **overrides)
        srv = ServerThread(config).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory: Callable[..., ServerThread]) -> ServerThread:
    return server_factory()


@pytest.fixture
def client(server: ServerThread) -> Iterator[redis.Redis]:
    r = redis.Redis(host=server.host, port=server.port, protocol=2, socket_timeout=30)
    yield r
    r.close()


@pytest.fixture
def client3(server: ServerThread) -> Iterator[redis.Redis]:
    r = redis.Redis(host=server.host, port=server.port, protocol=3, socket_timeout=30)
    yield r
    r.close()


class SpawnedServer:
    """A real `pion-server` process."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        cmd = [sys.executable, "-m", "pion", "server", "--port", "0", *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line)
            if m:
                self.port = int(m.group(1))
                return
        self.proc.kill()
        _, err = self.proc.communicate(timeout=10)
        raise RuntimeError(f"pion-server did not start: {line!r}\n{err.decode(errors='replace')}")

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def stderr_text(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")


@pytest.fixture
def spawn_server(tmp_path: Path) -> Iterator[Callable[..., SpawnedServer]]:
    """Start `pion-server` subprocesses (data in tmp_path/data unless --dir is given)."""
    procs: list[SpawnedServer] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> SpawnedServer:
        argv = list(args)
        if "--dir" not in argv:
            argv += ["--dir", str(tmp_path / "data")]
        s = SpawnedServer(argv, env)
        procs.append(s)
        return s

    yield spawn
    for s in procs:
        if s.proc.poll() is None:
            s.kill()
        for stream in (s.proc.stdout, s.proc.stderr):
            if stream is not None:
                stream.close()
