"""The WARM table and COLD registry as a unit: LRU demotion by last access, the slot
and byte bounds, the cold registry's bound turning entries MISSING, and the counters."""

from __future__ import annotations

import numpy as np
import pytest

from pion.attend.tables import AttentionTables
from pion.errors import OOMError


def _kv(tokens: int = 4, heads: int = 2, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    k = np.ones((heads, tokens, dim), dtype=np.float32)
    return k, k.copy()


def test_store_is_warm_until_demoted_then_cold_then_missing() -> None:
    t = AttentionTables(warm_slots=2, cold_slots=1)
    t.put((b"a", 0), *_kv())
    t.put((b"b", 0), *_kv())
    assert t.state((b"a", 0)) == "warm" and t.warm_count == 2
    t.put((b"c", 0), *_kv())  # a is the least recently used
    assert t.state((b"a", 0)) == "cold"
    assert t.cold_entry((b"a", 0)) is not None and t.get((b"a", 0)) is None
    t.put((b"d", 0), *_kv())  # b demoted; the registry holds 1, so a is forgotten
    assert t.state((b"b", 0)) == "cold" and t.state((b"a", 0)) == "missing"
    assert (t.demotions, t.forgotten, t.cold_count) == (2, 1, 1)


def test_lru_is_by_last_access() -> None:
    t = AttentionTables(warm_slots=3)
    for sid in (b"a", b"b", b"c"):
        t.put((sid, 0), *_kv())
    assert t.get((b"a", 0)) is not None  # a query stamps a most recent
    t.put((b"d", 0), *_kv())
    assert t.state((b"b", 0)) == "cold" and t.state((b"a", 0)) == "warm"
    t.state((b"c", 0), touch=True)  # LOOKUP touches too
    t.put((b"e", 0), *_kv())
    assert t.state((b"a", 0)) == "cold" and t.state((b"c", 0)) == "warm"
    assert t.warm_keys() == [(b"d", 0), (b"c", 0), (b"e", 0)]
    assert t.cold_keys() == [(b"b", 0), (b"a", 0)]


def test_rehydrate_counts_cold_to_warm_and_replaces() -> None:
    t = AttentionTables(warm_slots=1)
    t.put((b"a", 0), *_kv())
    t.put((b"b", 0), *_kv())
    t.put((b"a", 0), *_kv(tokens=6))  # a comes back, b goes cold
    assert (t.rehydrates, t.demotions) == (1, 2)
    slot = t.get((b"a", 0))
    assert slot is not None and slot.tokens == 6
    t.put((b"a", 0), *_kv(tokens=2))  # replacing a WARM slot demotes nothing
    assert (t.rehydrates, t.demotions, t.warm_count) == (1, 2, 1)
    assert t.bytes == 2 * 2 * 2 * 8 * 4


def test_byte_budget_demotes_and_refuses_what_can_never_fit() -> None:
    one = 2 * 2 * 4 * 8 * 4  # K + V of _kv()
    t = AttentionTables(warm_slots=100, max_bytes=3 * one)
    for i in range(3):
        t.put((b"s", i), *_kv())
    assert t.bytes == 3 * one
    t.put((b"s", 3), *_kv())
    assert t.state((b"s", 0)) == "cold" and t.bytes == 3 * one
    t.put((b"big", 0), *_kv(tokens=8))  # two slots' worth: two demotions
    assert t.warm_keys() == [(b"s", 3), (b"big", 0)] and t.bytes == 3 * one
    with pytest.raises(OOMError, match="attend-maxmemory"):
        t.put((b"huge", 0), *_kv(tokens=20))
    assert t.warm_keys() == [(b"s", 3), (b"big", 0)]  # nothing changed


def test_drop_and_limits() -> None:
    t = AttentionTables(warm_slots=2)
    for layer in range(3):
        t.put((b"a", layer), *_kv())
    assert t.drop(b"a", 0) == 1 and t.state((b"a", 0)) == "missing"  # was cold
    assert t.drop(b"a") == 2 and t.warm_count == 0 and t.bytes == 0
    assert t.drop(b"zzz") == 0
    for layer in range(2):
        t.put((b"b", layer), *_kv())
    t.set_limits(warm_slots=1, cold_slots=0)
    assert t.warm_count == 1 and t.cold_count == 0 and t.forgotten == 1


def test_put_checks_shapes() -> None:
    t = AttentionTables()
    k, _ = _kv()
    with pytest.raises(ValueError):
        t.put((b"a", 0), k, k[:, :2])
    with pytest.raises(ValueError):
        t.put((b"a", 0), k.astype(np.float64), k.astype(np.float64))
    assert t.warm_count == 0
