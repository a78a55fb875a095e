"""Helpers for the V-store tests: stores, journals, seeded rows, state comparison."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from pion.config import VStoreLimits
from pion.errors import MisconfError
from pion.vstore import Mutation, SetBlocks, StoreRows, VStore


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


def state_of(vs: VStore) -> list[tuple[Any, ...]]:
    """Everything durable about a store, comparable with ==."""
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
    out.append(("totals", vs.vstore_bytes, vs.total_tokens, len(vs)))
    return out


def make_store(**kw: Any) -> VStore:
    limits = kw.pop("limits", VStoreLimits())
    return VStore(limits, **kw)
