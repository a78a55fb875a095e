"""Helpers shared by the test packages (on pytest's ``pythonpath``: ``import support``).

- V-store: :func:`make_store`, :func:`rows`, :func:`durable_state` (everything durable
  about a store, comparable with ``==``), recording and failing journals.
- Persistence: :func:`open_store` (a store recovered from a real data directory),
  :func:`small_workload`, :class:`StateRecorder`, wire helpers for real servers.
- `pion llama`: chat requests and ``[prefix-cache]`` log reading.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.config import ServerConfig, VStoreLimits
from pion.errors import MisconfError
from pion.llama.timings import Timings
from pion.persistence import Persistence
from pion.vstore import Mutation, SetBlocks, StoreRows, VStore

# -- V-store ---------------------------------------------------------------------------


class RecordingJournal:
    """Keeps a copy of every record (payloads are only valid during append)."""

    def __init__(self) -> None:
        self.records: list[Mutation] = []

    def append(self, mutation: Mutation) -> None:
        if isinstance(mutation, StoreRows):
            mutation = dataclasses.replace(mutation, data=bytes(mutation.data))
        elif isinstance(mutation, SetBlocks):
            mutation = dataclasses.replace(mutation, hashes=bytes(mutation.hashes))
        self.records.append(mutation)


class FailingJournal:
    """A WAL whose disk is failing: every append raises MISCONF."""

    def __init__(self) -> None:
        self.calls = 0

    def append(self, mutation: Mutation) -> None:
        self.calls += 1
        raise MisconfError("Errors writing to the WAL")


def rows(n: int, dim: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def f16_rows(n: int, dim: int, seed: int) -> bytes:
    """fp16 bit patterns for V.STOREBATCH ... FMT F16 (stored verbatim: bit-exact)."""
    return rows(n, dim, seed).astype("<f2").tobytes()


def make_store(**kw: Any) -> VStore:
    limits = kw.pop("limits", VStoreLimits())
    return VStore(limits, **kw)


def durable_state(vs: VStore) -> list[tuple[Any, ...]]:
    """Everything durable about a store, comparable with ``==``: its records in a
    canonical order (not its LRU order: reads are not logged), then its totals."""
    out: list[tuple[Any, ...]] = []
    for m in vs.dump():
        if isinstance(m, StoreRows):
            out.append(
                ("rows", m.sid, m.layer, m.start, m.count, m.format_id, m.dim, bytes(m.data))
            )
        elif isinstance(m, SetBlocks):
            out.append(("blocks", m.sid, m.block_size, bytes(m.hashes)))
        else:
            out.append((type(m).__name__, *dataclasses.astuple(m)))
    out.sort()
    out.append(("totals", vs.vstore_bytes, vs.total_tokens, len(vs)))
    return out


# -- persistence -----------------------------------------------------------------------


def open_store(data_dir: Path, **overrides: Any) -> tuple[VStore, Persistence]:
    """A store recovered from ``data_dir`` with a live Persistence as its journal."""
    overrides.setdefault("appendfsync", "no")
    config = dataclasses.replace(ServerConfig(), dir=data_dir, **overrides)
    vs = VStore(config.vstore, max_sessions=config.vstore_max_sessions, maxmemory=config.maxmemory)
    p = Persistence(config, vs)
    p.open()
    p.recover_now()
    return vs, p


def fresh_store() -> VStore:
    return VStore(ServerConfig().vstore)


class StateRecorder:
    """A journal wrapper: the canonical state before each record is appended, so
    ``states[k]`` is the state after the first k records."""

    def __init__(self, vs: VStore, inner: Any) -> None:
        self.vs = vs
        self.inner = inner
        self.states: list[list[tuple[Any, ...]]] = []

    def append(self, m: Mutation) -> None:
        self.states.append(durable_state(self.vs))
        self.inner.append(m)

    def finish(self) -> list[list[tuple[Any, ...]]]:
        return [*self.states, durable_state(self.vs)]


def small_workload(vs: VStore) -> None:
    """Every kind of record, a SCHEMA session, a drop and (with ``max_sessions`` 4) an
    LRU eviction of ``s``, in about 3 KB of log."""
    vs.create(b"a_pk", 16, "int8")
    vs.create(b"a_pv", 16, "fp16")
    vs.store(b"a_pk", 0, 0, rows(4, 16, 1))
    vs.store(b"a_pv", 1, 2, rows(3, 16, 2))
    vs.set_blocks(b"a_pk", 4, np.array([7, 3, 9], dtype=np.uint64))
    vs.create_schema(b"s", 0, [("fp8", 8), ("turbo4", 32)])
    vs.store(b"s", 1, 0, rows(2, 32, 3))
    vs.create(b"gone", 8, "mlx4g32")
    vs.store(b"gone", 0, 0, rows(2, 8, 4))
    vs.drop(b"gone")
    vs.store(b"a_pk", 0, 2, rows(3, 16, 5))  # overwrite and extend
    vs.create(b"e1", 8, "fp16")
    vs.store(b"e1", 0, 0, rows(1, 8, 6))
    vs.create(b"e2", 8, "int8")  # the fifth session: evicts s, the least recently used


def no_retry() -> Retry:
    """redis-py retries ConnectionError (and BusyLoadingError, its subclass) with
    backoff by default; tests that expect a dropped connection or -LOADING must see
    the first answer."""
    return Retry(NoBackoff(), 0)


def wait_loaded(r: redis.Redis, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if r.info("persistence").get("loading") == 0:
                return
        except redis.exceptions.BusyLoadingError:
            pass
        time.sleep(0.02)
    raise TimeoutError("server still loading")


# -- pion llama ------------------------------------------------------------------------


def chat(base_url: str, body: dict[str, Any], **headers: str) -> tuple[dict[str, Any], Timings]:
    """Send a non-streamed chat request; return the JSON and its timings."""
    resp = httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    resp.raise_for_status()
    data = resp.json()
    timings = Timings.from_json(data)
    assert timings is not None, data
    return data, timings


def log_lines(path: Path | None) -> list[str]:
    """The ``[prefix-cache]`` messages of a log file, without the timestamps."""
    if path is None or not path.exists():
        return []
    return [line.split("[prefix-cache] ", 1)[1] for line in path.read_text().splitlines()]


def count(lines: list[str], needle: str) -> int:
    return sum(needle in line for line in lines)


def wait_log(path: Path | None, needle: str, n: int = 1, timeout: float = 10.0) -> list[str]:
    """Wait until ``needle`` occurs ``n`` times in the log; return its lines.

    The proxy logs the observed reuse after the last byte went to the client, so a client
    can read its answer a moment before that line is written.
    """
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(path)
        if count(lines, needle) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


# -- cluster tier ----------------------------------------------------------------------


def wait_until(predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``predicate()`` until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def store_prefix(
    r: redis.Redis, ns: str, *, fmt: str = "fp16", dim: int = 64, layers: int = 3,
    rows_per_layer: int = 600, seed: int = 0,
) -> None:  # fmt: skip
    """REGISTER ``ns`` and store every layer of both halves (600 rows: three 256-row
    tier chunks, the last one partial)."""
    assert r.execute_command("KV.PREFIX.REGISTER", ns, dim, fmt) == b"OK"
    for half, sid in enumerate((f"{ns}_pk", f"{ns}_pv")):
        for layer in range(layers):
            blob = rows(rows_per_layer, dim, seed + 100 * half + layer).tobytes()
            r.execute_command("V.STOREBATCH", sid, layer, 0, rows_per_layer, blob)


def fetch_prefix(r: redis.Redis, ns: str, rows_per_layer: int = 600) -> list[Any]:
    """Both halves as V.FETCH BATCH replies, fp32 and FMT NATIVE: what bit-exact means."""
    out = []
    for sid in (f"{ns}_pk", f"{ns}_pv"):
        out.append(r.execute_command("V.FETCH", sid, "BATCH", 0, rows_per_layer))
        out.append(r.execute_command("V.FETCH", sid, "BATCH", 0, rows_per_layer, "FMT", "NATIVE"))
    return out


def tier_info(r: redis.Redis) -> dict[str, Any]:
    return dict(r.info("tier"))
