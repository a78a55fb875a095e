"""The Keyspace as a unit: log before apply, records that replay to the same state,
byte accounting, expiry (lazy and swept) and SCAN's promise under churn."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.errors import MisconfError, OOMError, WrongTypeError
from pion.keyspace import DeleteKeys, KeyMutation, Keyspace, SetScores, SetString, SortedSet
from pion.keyspace.entries import KEY_OVERHEAD, value_size
from pion.keyspace.scan import COMPACT_MIN_HOLES
from pion.keyspace.strings import incr_by
from pion.keyspace.zsets import ZAddFlags, zadd

NOW = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.records: list[KeyMutation] = []
        self.refuse = False

    def append(self, m: KeyMutation) -> None:
        if self.refuse:
            raise MisconfError("log failing")
        self.records.append(m)


def make() -> tuple[Keyspace, Clock, Recorder]:
    clock = Clock()
    ks = Keyspace(clock=clock)
    rec = Recorder()
    ks.journal = rec
    return ks, clock, rec


def canonical(ks: Keyspace) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for m in ks.dump():
        if isinstance(m, SetString):
            out[m.key] = ("string", bytes(m.value), m.deadline)
    for key in ks.keys(b"*"):
        v = ks.lookup(key, read=False)
        if isinstance(v, dict):
            out[key] = ("hash", dict(v), ks.deadline(key))
        elif isinstance(v, SortedSet):
            out[key] = ("zset", list(v), ks.deadline(key))
    return out


def check_accounting(ks: Keyspace) -> None:
    total = 0
    for key in ks.keys(b"*"):
        v = ks.lookup(key, read=False)
        assert v is not None
        total += value_size(key, v)
    assert ks.used_bytes == total


WRITES: list[Callable[[Keyspace], object]] = [
    lambda ks: ks.set_string(b"s", b"v", NOW + 5000),
    lambda ks: ks.set_strings([(b"a", b"1"), (b"b", b"2")]),
    lambda ks: ks.delete([b"s2"]),
    lambda ks: ks.set_deadline(b"s2", NOW + 1),
    lambda ks: ks.persist(b"v2"),
    lambda ks: ks.hash_set(b"h", [(b"f", b"x"), (b"g", b"y")]),
    lambda ks: ks.hash_delete(b"h2", [b"f"]),
    lambda ks: ks.zset_set(b"z", [(1.0, b"m")]),
    lambda ks: ks.zset_delete(b"z2", [b"m"]),
    lambda ks: ks.flush(),
]


@pytest.mark.parametrize("write", WRITES)
def test_a_refused_record_changes_nothing(write: Callable[[Keyspace], object]) -> None:
    ks, _, rec = make()
    ks.set_string(b"s2", b"x")
    ks.set_string(b"v2", b"x", NOW + 10_000)
    ks.hash_set(b"h2", [(b"f", b"1"), (b"k", b"2")])
    ks.zset_set(b"z2", [(1.0, b"m"), (2.0, b"n")])
    before, used = canonical(ks), ks.used_bytes
    rec.refuse = True
    with pytest.raises(MisconfError):
        write(ks)
    assert canonical(ks) == before and ks.used_bytes == used


def test_the_budget_is_asked_before_the_log() -> None:
    ks, _, rec = make()
    asked: list[int] = []

    def budget(n: int) -> None:
        asked.append(n)
        if n > 1000:
            raise OOMError("command not allowed when used memory > 'maxmemory'")

    ks.budget = budget
    ks.set_string(b"small", b"x" * 10)
    with pytest.raises(OOMError):
        ks.set_string(b"big", b"x" * 2000)
    assert b"big" not in ks and len(rec.records) == 1
    ks.set_string(b"small", b"y" * 5)  # shrinking asks for nothing
    assert asked == [len(b"small") + 10 + KEY_OVERHEAD, len(b"big") + 2000 + KEY_OVERHEAD]


def test_append_and_setrange_ask_for_the_copy_of_the_old_value() -> None:
    """A new string is built beside the old one: while both exist the write needs
    the whole new length, though the key grows only by what was added."""
    ks, _, rec = make()
    asked: list[int] = []
    ks.budget = asked.append
    ks.set_string(b"k", b"x" * 1000)
    used = ks.used_bytes
    assert ks.set_range(b"k", 1000, b"y" * 10) == 1010  # APPEND
    assert ks.set_range(b"k", 0, b"z" * 10) == 1010  # SETRANGE inside: grows nothing
    assert asked[1:] == [1010, 1010]
    assert ks.used_bytes == used + 10

    def refuse(n: int) -> None:
        raise OOMError("command not allowed when used memory > 'maxmemory'")

    ks.budget = refuse
    before = len(rec.records)
    with pytest.raises(OOMError):
        ks.set_range(b"k", 1010, b"w")
    assert ks.string(b"k") == b"z" * 10 + b"x" * 990 + b"y" * 10
    assert len(rec.records) == before and ks.used_bytes == used + 10


def test_records_carry_results_not_requests() -> None:
    ks, _, rec = make()
    ks.set_string(b"n", b"41", NOW + 9000)
    incr_by(ks, b"n", 1)
    assert rec.records[-1] == SetString(b"n", b"42", NOW + 9000)  # the TTL kept
    zadd(ks, b"z", [(1.5, b"m")], ZAddFlags())
    zadd(ks, b"z", [(2.0, b"m")], ZAddFlags(incr=True))
    assert rec.records[-1] == SetScores(b"z", ((3.5, b"m"),))


ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["set", "mset", "del", "expire", "persist", "hset", "hdel", "zadd", "zrem"]
        ),
        st.sampled_from([b"a", b"b", b"c", b""]),
        st.binary(max_size=6),
        st.integers(-3, 3),
    ),
    max_size=40,
)


def _apply_op(ks: Keyspace, op: str, key: bytes, data: bytes, n: int) -> None:
    try:
        if op == "set":
            ks.set_string(key, data, NOW + 1000 * n if n > 0 else 0)
        elif op == "mset":
            ks.set_strings([(key, data), (data, key)])
        elif op == "del":
            ks.delete([key, data])
        elif op == "expire":
            ks.set_deadline(key, NOW + 1000 * n if n > 0 else 1)
        elif op == "persist":
            ks.persist(key)
        elif op == "hset":
            ks.hash_set(key, [(data, key), (b"f", data)])
        elif op == "hdel":
            ks.hash_delete(key, [data, b"f"])
        elif op == "zadd":
            ks.zset_set(key, [(float(n), data), (n / 2, b"m")])
        else:
            ks.zset_delete(key, [data, b"m"])
    except WrongTypeError:
        pass


@settings(max_examples=300, derandomize=True)
@given(ops)
def test_the_log_and_the_snapshot_rebuild_the_same_state(
    seq: list[tuple[str, bytes, bytes, int]],
) -> None:
    ks, clock, rec = make()
    for op, key, data, n in seq:
        _apply_op(ks, op, key, data, n)
        check_accounting(ks)
    replayed = Keyspace(clock=clock)
    for m in rec.records:
        replayed.apply(m)
    assert canonical(replayed) == canonical(ks)
    assert replayed.used_bytes == ks.used_bytes and replayed.volatile == ks.volatile
    loaded = Keyspace(clock=clock)
    for m in ks.dump():
        loaded.apply(m)
    assert canonical(loaded) == canonical(ks)
    assert loaded.used_bytes == ks.used_bytes


def test_expiry_is_lazy_and_swept_in_bounded_steps() -> None:
    ks, clock, rec = make()
    for i in range(50):
        ks.set_string(b"k%d" % i, b"v", NOW + 100)
    ks.set_string(b"keep", b"v", NOW + 10_000)
    clock.now = NOW + 100
    assert ks.string(b"k0") == b"v"  # a key expires once now > deadline
    clock.now = NOW + 101
    assert ks.string(b"k0") is None  # lazily, on access
    assert rec.records[-1] == DeleteKeys((b"k0",), "expire")
    assert ks.sweep(20) == 20  # at most max_keys per tick, in one record
    last = rec.records[-1]
    assert isinstance(last, DeleteKeys) and last.reason == "expire" and len(last.keys) == 20
    assert ks.sweep(1000) == 29
    assert ks.sweep(1000) == 0
    assert list(ks.keys(b"*")) == [b"keep"] and ks.expired_keys == 50
    check_accounting(ks)


def test_expiry_survives_a_failing_log() -> None:
    ks, clock, rec = make()
    ks.set_string(b"k", b"v", NOW + 1)
    rec.refuse = True
    clock.now = NOW + 2
    assert ks.lookup(b"k") is None  # removed anyway: its deadline is durable already
    assert len(ks) == 0


def test_stale_deadlines_do_not_pile_up() -> None:
    ks, clock, _ = make()
    ks.set_string(b"k", b"v")
    for i in range(5000):  # every EXPIRE leaves the previous heap pair stale
        ks.set_deadline(b"k", NOW + 10_000 + i)
    ks.sweep(10)
    assert len(ks.deadlines._heap) <= 2 * ks.volatile + 1024
    clock.now = NOW + 20_000
    assert ks.sweep(10) == 1


def test_accounting_tracks_real_memory() -> None:
    """used_bytes is an estimate; it must stay within 2x of what tracemalloc sees for
    small keys and within 1% for LMCache-sized values."""
    ks = Keyspace()
    payload = [(b"key:%08d" % i, b"v" * 40) for i in range(20_000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k, v in payload:  # fresh objects, as a request would bring
        ks.set_string(bytes(k), bytes(v))
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.5 < ks.used_bytes / real < 2.0, (ks.used_bytes, real)
    big = Keyspace()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(8):
        big.set_string(b"chunk%d" % i, random.randbytes(4 << 20))
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert abs(big.used_bytes / real - 1) < 0.01


def test_scan_returns_every_key_present_throughout_despite_compaction() -> None:
    ks, _, _ = make()
    rng = random.Random(7)
    stable = [b"stable%d" % i for i in range(300)]
    churn = [b"churn%d" % i for i in range(4 * COMPACT_MIN_HOLES)]
    keys = stable + churn
    rng.shuffle(keys)
    for k in keys:
        ks.set_string(k, b"v")
    gens_before = ks._slots._gen
    seen: list[bytes] = []
    cursor = 0
    deleted = 0
    while True:
        cursor, batch = ks.scan(cursor, 25, None, None)
        seen.extend(batch)
        # Churn between calls: delete a batch of non-stable keys, add some new ones.
        for k in churn[deleted : deleted + 150]:
            ks.delete([k])
        deleted += 150
        for j in range(10):
            ks.set_string(b"new%d-%d" % (deleted, j), b"v")
        if cursor == 0:
            break
    assert ks._slots._gen > gens_before  # compaction happened mid-iteration
    assert set(stable) <= set(seen)


def test_scan_type_and_match_filters() -> None:
    ks, _, _ = make()
    ks.set_string(b"s1", b"v")
    ks.hash_set(b"h1", [(b"f", b"v")])
    ks.zset_set(b"z1", [(1.0, b"m")])
    cursor, keys = ks.scan(0, 100, None, "hash")
    assert (cursor, keys) == (0, [b"h1"])
    assert ks.scan(0, 100, b"?1", None)[1] == [b"s1", b"h1", b"z1"]
    assert ks.scan(0, 100, b"z*", "string")[1] == []
