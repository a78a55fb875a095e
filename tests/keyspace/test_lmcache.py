"""pion-server as LMCache's remote backend.

* An LMCache-shaped client on raw RESP2 sockets, as its native ``resp://`` backend
  talks: 8 connections, ``AUTH [user] pass`` once per connection (with and without a
  user name), then ``SET key <4 MB chunk>`` (the reply must be exactly ``+OK``),
  ``GET`` (``$<n>`` or ``$-1``), ``EXISTS`` and ``DEL`` (exactly ``:0`` or ``:1``), no
  HELLO, no SELECT; keys shaped ``model@world_size@worker_id@chunk_hash@dtype``, with
  ``/`` and ``@`` as ordinary bytes. Chunks come back bit-exact.
* Its Python ``redis://`` connector's shape: redis-py's asyncio client from a URL,
  two keys per chunk (``<key>kv_bytes``, ``<key>metadata``).
* LMCache's own native client (``lmcache_redis.LMCacheRedisClient``, fetched by
  ``scripts/fetch-lmcache-client``: LMCache itself does not install beside our pins,
  see docs/keyspace.md), driven the way its ``RESPClient`` wrapper drives it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import select
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from pion.server.run import ServerThread
from support.keyspace import RawClient

PASSWORD = "lmcache-secret"
CHUNK = 4 << 20
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def chunk_key(i: int, worker: int = 0) -> str:
    return f"{MODEL}@1@{worker}@{i:032x}@bfloat16"


def chunk(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()


@pytest.fixture
def secured(server_factory: Callable[..., ServerThread]) -> ServerThread:
    return server_factory(requirepass=PASSWORD)


def _exact(c: RawClient, want: bytes, *cmd: Any) -> None:
    got = c.call(*cmd).raw
    assert got == want, (cmd[:2], got[:80])


def test_lmcache_shaped_client_8_connections(secured: ServerThread) -> None:
    errors: list[BaseException] = []

    def connection(n: int) -> None:
        try:
            c = RawClient(secured.port)
            _exact(c, b"-NOAUTH Authentication required.\r\n", "EXISTS", chunk_key(0))
            if n % 2:
                _exact(c, b"+OK\r\n", "AUTH", PASSWORD)
            else:
                _exact(c, b"+OK\r\n", "AUTH", "default", PASSWORD)
            for j in range(4):
                i = 10 * n + j
                key, data = chunk_key(i, worker=n), chunk(i)
                _exact(c, b":0\r\n", "EXISTS", key)
                _exact(c, b"$-1\r\n", "GET", key)
                _exact(c, b"+OK\r\n", "SET", key, data)
                _exact(c, b":1\r\n", "EXISTS", key)
                _exact(c, b"$%d\r\n" % CHUNK + data + b"\r\n", "GET", key)
            gone = chunk_key(10 * n, worker=n)
            _exact(c, b":1\r\n", "DEL", gone)
            _exact(c, b":0\r\n", "DEL", gone)
            _exact(c, b":0\r\n", "EXISTS", gone)
            c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=connection, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[0]
    c = RawClient(secured.port)
    _exact(c, b"-WRONGPASS invalid username-password pair or user is disabled.\r\n", "AUTH", "x")
    _exact(c, b"+OK\r\n", "AUTH", PASSWORD)
    _exact(c, b":24\r\n", "DBSIZE")  # 8 connections x 4 chunks, one deleted each


def test_lmcache_redis_url_connector_shape(secured: ServerThread) -> None:
    async def run() -> None:
        pool = aioredis.ConnectionPool.from_url(f"redis://:{PASSWORD}@127.0.0.1:{secured.port}")
        r = aioredis.Redis.from_pool(pool)
        for i in range(3):
            key = chunk_key(i)
            meta = np.array([CHUNK, 2, 32, 16, 256], dtype="<i8").tobytes()
            await r.set(key + "kv_bytes", chunk(i))
            await r.set(key + "metadata", meta)
            assert await r.exists(key + "metadata") == 1
            assert await r.get(key + "metadata") == meta
            assert await r.get(key + "kv_bytes") == chunk(i)
        await r.delete(chunk_key(0) + "metadata")
        assert await r.exists(chunk_key(0) + "metadata") == 0
        await r.aclose()

    asyncio.run(run())


# -- LMCache's own native client -----------------------------------------------------


def _script() -> Path:
    return Path(__file__).resolve().parents[2] / "scripts" / "fetch-lmcache-client"


@pytest.fixture(scope="session")
def lmcache_native() -> ModuleType:
    """``lmcache_redis`` from LMCache's wheel (fetched once per machine; a failure to
    fetch fails the tests loudly rather than skipping them)."""
    import sys

    proc = subprocess.run(
        [str(_script())],
        capture_output=True,
        text=True,
        check=False,
        env={**__import__("os").environ, "PYTHON": sys.executable},
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"fetch-lmcache-client failed:\n{proc.stderr[-4000:]}")
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    spec = importlib.util.spec_from_file_location("lmcache_redis", lines[-1])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Native:
    """LMCache's RESPClient wrapper in miniature: submit, wait on the event fd, drain."""

    def __init__(self, module: ModuleType, port: int, workers: int, user: str) -> None:
        self.client = module.LMCacheRedisClient("127.0.0.1", port, workers, user, PASSWORD)
        self.fd = int(self.client.event_fd())
        self.done: dict[int, tuple[bool, str, Any]] = {}

    def wait(self, future_id: int) -> Any:
        deadline = time.monotonic() + 120
        while future_id not in self.done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"native future {future_id}")
            select.select([self.fd], [], [], 1.0)
            for fid, ok, error, result in self.client.drain_completions():
                self.done[int(fid)] = (bool(ok), str(error), result)
        ok, error, result = self.done.pop(future_id)
        assert ok, error
        return result

    def close(self) -> None:
        self.client.close()


@pytest.mark.lmcache
@pytest.mark.parametrize("user", ["", "default"])
def test_lmcache_native_resp_client(
    lmcache_native: ModuleType, secured: ServerThread, user: str
) -> None:
    c = Native(lmcache_native, secured.port, workers=8, user=user)
    try:
        keys = [chunk_key(i) for i in range(16)]
        data = [np.frombuffer(chunk(i), dtype=np.uint8) for i in range(16)]
        assert c.wait(c.client.submit_batch_set(keys, [memoryview(d) for d in data])) is None
        exists = c.wait(c.client.submit_batch_exists([*keys, chunk_key(99)]))
        assert list(exists) == [True] * 16 + [False]
        bufs = [np.zeros(CHUNK, dtype=np.uint8) for _ in keys]
        c.wait(c.client.submit_batch_get(keys, [memoryview(b) for b in bufs]))
        for got, want in zip(bufs, data, strict=True):
            assert got.tobytes() == want.tobytes()  # bit-exact
        c.wait(c.client.submit_batch_delete(keys[:4]))
        assert list(c.wait(c.client.submit_batch_exists(keys[:6]))) == [False] * 4 + [True] * 2
    finally:
        c.close()
