"""Helpers for the persistence tests: in-process stores with a real data directory, a
canonical view of a store's durable state, a small deterministic workload, and
real-server plumbing (wire helpers, waiting for recovery)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.config import ServerConfig
from pion.persistence import Persistence
from pion.vstore import Mutation, SetBlocks, StoreRows, VStore


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


def canonical(vs: VStore) -> list[tuple[Any, ...]]:
    """Everything durable about a store (not its LRU order: reads are not logged)."""
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


class StateRecorder:
    """A journal wrapper: the canonical state before each record is appended, so
    ``states[k]`` is the state after the first k records."""

    def __init__(self, vs: VStore, inner: Any) -> None:
        self.vs = vs
        self.inner = inner
        self.states: list[list[tuple[Any, ...]]] = []

    def append(self, m: Mutation) -> None:
        self.states.append(canonical(self.vs))
        self.inner.append(m)

    def finish(self) -> list[list[tuple[Any, ...]]]:
        return [*self.states, canonical(self.vs)]


def rows(n: int, dim: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


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


def f16_rows(n: int, dim: int, seed: int) -> bytes:
    """fp16 bit patterns for V.STOREBATCH ... FMT F16 (stored verbatim: bit-exact)."""
    return rows(n, dim, seed).astype("<f2").tobytes()
