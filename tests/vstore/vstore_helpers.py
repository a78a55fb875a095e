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


def check_layers(vs: VStore) -> None:
    """The layer invariants of ``layer.py``: runs sorted with disjoint extents, live
    rows inside their extent, zero bytes outside them, and held/tpl as the runs say."""
    for s in vs._sessions.values():
        for lay in s.layers.values():
            top = 0
            for r in lay.runs:
                assert top <= r.base <= r.lo < r.hi <= r.top, (r.base, r.lo, r.hi, r.top)
                assert not r.buf[: r.lo - r.base].any() and not r.buf[r.hi - r.base :].any()
                top = r.top
            assert lay.held == sum(r.hi - r.lo for r in lay.runs)
            assert lay.tpl == max((r.hi for r in lay.runs), default=0)


def make_store(**kw: Any) -> VStore:
    limits = kw.pop("limits", VStoreLimits())
    return VStore(limits, **kw)
