"""Eviction: LRU over max_sessions by namespace, and the byte budget."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import numpy as np
import pytest

from pion.errors import OOMError, PionError
from pion.vstore import DropSession, StoreRows, VStore, namespace_of
from support import RecordingJournal, make_store, rows


def test_namespace_of() -> None:
    assert namespace_of(b"abc_pk") == (b"abc_pk", b"abc_pv")
    assert namespace_of(b"abc_pv") == (b"abc_pk", b"abc_pv")
    assert namespace_of(b"abc") == (b"abc",)
    assert namespace_of(b"abc_px") == (b"abc_px",)


def test_lru_evicts_the_least_recently_used_session() -> None:
    vs = make_store(max_sessions=3)
    for sid in (b"a", b"b", b"c"):
        vs.create(sid, 4, "fp16")
        vs.store(sid, 0, 0, rows(2, 4))
    vs.fetch_range(b"a", 0, 0, 1)  # a read refreshes a
    vs.create(b"d", 4, "fp16")
    assert sorted(vs.sids()) == [b"a", b"c", b"d"]
    assert vs.evictions == 1
    assert vs.vstore_bytes == 2 * 2 * 8  # a and c keep their rows


def test_lru_evicts_both_halves_of_a_namespace() -> None:
    vs = make_store(max_sessions=4)
    vs.create(b"old_pk", 4, "fp16")
    vs.create(b"old_pv", 4, "fp16")
    vs.create(b"x", 4, "fp16")
    vs.create(b"new_pk", 4, "fp16")
    # The namespace's age is its most recent half: touching old_pv protects old_pk too.
    vs.touch(b"old_pv")
    vs.create(b"y", 4, "fp16")
    assert b"x" not in vs and b"old_pk" in vs
    vs.create(b"z", 4, "fp16")  # now new_pk is the oldest: it goes (alone, no pv)
    assert b"new_pk" not in vs
    vs.touch(b"y")
    vs.touch(b"z")
    vs.create(b"w", 4, "fp16")  # the old namespace goes, both halves, one create
    assert b"old_pk" not in vs and b"old_pv" not in vs
    assert sorted(vs.sids()) == [b"w", b"y", b"z"]
    assert vs.evictions == 4


def test_creating_the_second_half_never_evicts_the_first() -> None:
    vs = make_store(max_sessions=2)
    vs.create(b"other", 4, "fp16")
    vs.create(b"ns_pk", 4, "fp16")
    vs.touch(b"other")  # ns_pk is now the LRU session
    vs.create(b"ns_pv", 4, "fp16")
    assert sorted(vs.sids()) == [b"ns_pk", b"ns_pv"]
    # Full, and the only evictable group is the namespace being created: refuse.
    tiny = make_store(max_sessions=1)
    tiny.create(b"q_pk", 4, "fp16")
    with pytest.raises(PionError, match="V-store full"):
        tiny.create(b"q_pv", 4, "fp16")
    assert tiny.sids() == [b"q_pk"]


def test_lowering_max_sessions_evicts_down_at_the_next_create() -> None:
    vs = make_store(max_sessions=10)
    for i in range(6):
        vs.create(b"s%d" % i, 4, "fp16")
    vs.set_limits(max_sessions=3)
    vs.create(b"new", 4, "fp16")
    assert vs.sids() == [b"s4", b"s5", b"new"]


def test_budget_evicts_lru_namespaces_until_the_write_fits() -> None:
    row = 4 * 2  # fp16, dim 4
    vs = make_store(maxmemory=30 * row)
    journal = RecordingJournal()
    vs.journal = journal
    for ns in (b"a", b"b", b"c"):
        for half in (b"_pk", b"_pv"):
            vs.create(ns + half, 4, "fp16")
            vs.store(ns + half, 0, 0, rows(5, 4))
    assert vs.vstore_bytes == 30 * row
    vs.touch(b"a_pk")  # b is now the LRU namespace
    journal.records.clear()
    vs.store(b"c_pv", 0, 5, rows(4, 4))  # needs 4 rows: b (10 rows) goes
    assert sorted(vs.sids()) == [b"a_pk", b"a_pv", b"c_pk", b"c_pv"]
    assert vs.vstore_bytes == 24 * row
    assert journal.records[:2] == [DropSession(b"b_pk", "evict"), DropSession(b"b_pv", "evict")]
    assert isinstance(journal.records[2], StoreRows) and len(journal.records) == 3


def test_overwrites_within_tpl_need_no_room() -> None:
    vs = make_store(maxmemory=10 * 8)
    vs.create(b"a", 4, "fp16")
    vs.create(b"b", 4, "fp16")
    vs.store(b"a", 0, 0, rows(5, 4))
    vs.store(b"b", 0, 0, rows(5, 4))
    vs.store(b"a", 0, 0, rows(5, 4, seed=1))
    assert len(vs) == 2 and vs.evictions == 0


def test_a_write_larger_than_the_budget_is_refused() -> None:
    vs = make_store(maxmemory=100)
    vs.create(b"a", 4, "fp16")
    vs.create(b"b", 4, "fp16")
    vs.store(b"a", 0, 0, rows(5, 4))
    with pytest.raises(OOMError, match=r"a write of 104 bytes is larger than maxmemory \(100"):
        vs.store(b"b", 0, 0, rows(13, 4))
    assert sorted(vs.sids()) == [b"a", b"b"] and vs.vstore_bytes == 40
    assert OOMError("x").resp_line().startswith("OOM ")


def test_a_write_that_cannot_fit_beside_its_own_namespace_evicts_nothing() -> None:
    vs = make_store(maxmemory=20 * 8)
    vs.create(b"n_pk", 4, "fp16")
    vs.create(b"n_pv", 4, "fp16")
    vs.create(b"other", 4, "fp16")
    vs.store(b"n_pv", 0, 0, rows(12, 4))
    vs.store(b"other", 0, 0, rows(4, 4))
    # n_pk needs 9 rows: evicting `other` frees 4 of the 5 needed; n_pv is protected.
    with pytest.raises(OOMError, match="only 32 are evictable"):
        vs.store(b"n_pk", 0, 0, rows(9, 4))
    assert sorted(vs.sids()) == [b"n_pk", b"n_pv", b"other"]
    assert vs.evictions == 0


def test_empty_sessions_are_not_evicted_for_bytes() -> None:
    vs = make_store(maxmemory=10 * 8)
    vs.create(b"empty", 4, "fp16")
    vs.create(b"full", 4, "fp16")
    vs.create(b"w", 4, "fp16")
    vs.store(b"full", 0, 0, rows(10, 4))
    vs.store(b"w", 0, 0, rows(3, 4))
    assert sorted(vs.sids()) == [b"empty", b"w"]
    got = vs.fetch_range(b"w", 0, 0, 3)
    assert got is not None and np.abs(got - rows(3, 4)).max() < 1e-2


def _calls(action: Callable[[], object]) -> int:
    """Python and builtin function calls made while ``action`` runs: a count of the work
    done that does not depend on the machine's speed."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    # A garbage collection during the action would count the finalizers it runs
    # (objects of earlier tests): collect first, and not while counting.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


def _full_store(n: int, namespaces: bool = True) -> VStore:
    """``n`` sessions (namespace halves when ``namespaces``) with a row each, at the limit."""
    vs = make_store(max_sessions=n)
    for i in range(n):
        sid = b"ns%d_p%s" % (i // 2, b"kv"[i % 2 : i % 2 + 1]) if namespaces else b"s%d" % i
        vs.create(sid, 4, "fp16")
        vs.store(sid, 0, 0, rows(1, 4))
    vs.touch(b"ns0_pk" if namespaces else b"s0")  # the oldest is now the second group
    return vs


def test_a_create_at_the_limit_costs_the_same_at_200_and_20000_sessions() -> None:
    """Issue 10: at 20k sessions a create at the limit cost 20 ms (a sort of every
    session per victim). The work of one create, evicting one namespace, must not grow
    with the number of sessions."""
    small, big = _full_store(200), _full_store(20_000)
    work = [_calls(lambda vs=vs: vs.create(b"new", 4, "fp16")) for vs in (small, big)]
    assert work[0] == work[1], work
    assert b"ns1_pk" not in big and b"ns1_pv" not in big and b"ns0_pk" in big
    assert len(big) == 20_000 - 1 and big.evictions == 2


def test_lowering_the_limit_costs_o1_per_victim() -> None:
    """Issue 10: lowering the limit to 1 with 4,000 sessions froze the server for 8 s
    (quadratic). Evicting 4,000 sessions must cost 100x evicting 40, not 10,000x."""
    work = []
    for n in (40, 4000):
        vs = _full_store(n, namespaces=False)
        vs.set_limits(max_sessions=1)
        work.append(_calls(lambda vs=vs: vs.create(b"new", 4, "fp16")))
        assert vs.sids() == [b"new"] and vs.evictions == n
    assert work[1] <= 101 * work[0], work


def test_the_byte_budget_walks_only_its_victims() -> None:
    """A budget eviction examines the groups it evicts, not the empty sessions (nor the
    held ones) it does not: the same work at 200 and at 20,000 sessions."""
    work, refused = [], []
    for n in (200, 20_000):
        vs = make_store(max_sessions=n + 10)
        for i in range(n):
            vs.create(b"e%d" % i, 4, "fp16")  # empty: nothing to free there
        for sid in (b"a", b"b", b"c"):
            vs.create(sid, 4, "fp16")
            vs.store(sid, 0, 0, rows(10, 4))
        vs.set_limits(maxmemory=vs.vstore_bytes)
        work.append(_calls(lambda vs=vs: vs.store(b"c", 0, 10, rows(10, 4))))
        assert b"a" not in vs and b"b" in vs and vs.evictions == 1
        # Not enough to evict: refused at once, nothing evicted, no walk either (the first
        # refusal warms pytest's and re's caches).
        _expect_oom(vs)
        refused.append(_calls(lambda vs=vs: _expect_oom(vs)))
        assert b"b" in vs and vs.evictions == 1
    assert work[0] == work[1], work
    assert refused[0] == refused[1], refused


def _expect_oom(vs: VStore) -> None:
    with pytest.raises(OOMError, match="only 80 are evictable"):
        vs.store(b"c", 0, 20, rows(30, 4))
