"""Shared fixtures: a real server on port 0, in-process (fast) or as a subprocess (for
signals, kill -9 and restarts: :class:`support.ServerProcess`), and redis-py clients
connected to it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings

from pion.config import ServerConfig
from pion.server.run import ServerThread
from support import ServerProcess

# CI replays the same examples every run (a red build is reproducible); a developer's
# run explores new ones each time.
# Examples are generated on a shared 2-core machine: how fast hypothesis draws them is
# not what a test checks, so its speed checks are off (each test still bounds its own
# work).
_SLOW_DRAWS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, print_blob=True, **_SLOW_DRAWS)
settings.register_profile("dev", **_SLOW_DRAWS)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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


@pytest.fixture
def spawn_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start `pion-server` subprocesses (data in tmp_path/data unless --dir is given);
    any still running at teardown is killed."""
    procs: list[ServerProcess] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        s = ServerProcess(tmp_path, args, env=env)
        procs.append(s)
        return s

    yield spawn
    for s in procs:
        if s.alive():
            s.kill()
        s.close()
