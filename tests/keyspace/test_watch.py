"""WATCH's hooks in the stores (``pion.watch``): every way the keyspace and the V-store
change a name marks the tokens watching it, and nothing else does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pion.config import ServerConfig
from pion.keyspace import Keyspace
from pion.vstore import VStore
from pion.watch import Watchers, WatchToken
from support import rows

NOW = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def _watched(ks: Keyspace, key: bytes = b"k") -> WatchToken:
    token = WatchToken()
    token.keys[ks.db, key] = ks.past_deadline(key)
    ks.watchers.add(key, token)
    return token


def _fresh() -> tuple[Keyspace, Clock]:
    clock = Clock()
    ks = Keyspace(clock)
    ks.set_string(b"k", b"v")
    ks.hash_set(b"h", [(b"f", b"v")])
    ks.zset_set(b"z", [(1.0, b"m")])
    return ks, clock


CHANGES: dict[str, tuple[bytes, Callable[[Keyspace], object]]] = {
    "set": (b"k", lambda ks: ks.set_string(b"k", b"v")),
    "set-new": (b"n", lambda ks: ks.set_string(b"n", b"v")),
    "mset": (b"k", lambda ks: ks.set_strings([(b"x", b"1"), (b"k", b"2")])),
    "del": (b"k", lambda ks: ks.delete([b"k"])),
    "expire": (b"k", lambda ks: ks.set_deadline(b"k", NOW + 10)),
    "expire-past": (b"k", lambda ks: ks.set_deadline(b"k", NOW - 1)),
    "hset": (b"h", lambda ks: ks.hash_set(b"h", [(b"g", b"w")])),
    "hdel": (b"h", lambda ks: ks.hash_delete(b"h", [b"f"])),
    "zadd": (b"z", lambda ks: ks.zset_set(b"z", [(2.0, b"m")])),
    "zrem": (b"z", lambda ks: ks.zset_delete(b"z", [b"m"])),
    "flush": (b"k", lambda ks: ks.flush()),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_every_keyspace_change_marks_its_watchers(name: str) -> None:
    ks, _ = _fresh()
    key, change = CHANGES[name]
    token, other = _watched(ks, key), _watched(ks, b"other")
    change(ks)
    assert token.dirty
    assert not other.dirty


NO_CHANGE: dict[str, Callable[[Keyspace], object]] = {
    "read": lambda ks: (ks.string(b"k"), ks.hash(b"h"), ks.zset(b"z"), ks.exists(b"k")),
    "del-absent": lambda ks: ks.delete([b"absent"]),
    "persist-without-deadline": lambda ks: ks.persist(b"k"),
    "hdel-absent-field": lambda ks: ks.hash_delete(b"h", [b"nope"]),
    "zrem-absent-member": lambda ks: ks.zset_delete(b"z", [b"nope"]),
    "other-key": lambda ks: ks.set_string(b"x", b"1"),
}


@pytest.mark.parametrize("name", sorted(NO_CHANGE))
def test_what_changes_nothing_marks_nothing(name: str) -> None:
    ks, _ = _fresh()
    tokens = [_watched(ks, k) for k in (b"k", b"h", b"z")]
    NO_CHANGE[name](ks)
    assert not any(t.dirty for t in tokens)


def test_a_flush_marks_only_the_keys_it_held() -> None:
    ks, _ = _fresh()
    held, absent = _watched(ks, b"k"), _watched(ks, b"absent")
    ks.flush()
    assert held.dirty and not absent.dirty


def test_expiry_follows_redis_7() -> None:
    ks, clock = _fresh()
    ks.set_deadline(b"k", NOW + 10)
    live = _watched(ks, b"k")
    clock.now = NOW + 11
    assert ks.past_deadline(b"k")  # EXEC's check: live at WATCH, past its deadline now
    already = _watched(ks, b"k")
    assert already.keys[0, b"k"] is True
    assert ks.sweep(10) == 1  # removed by its expiry
    assert live.dirty
    assert not already.dirty  # it was already gone when watched
    ks.set_string(b"k", b"again")
    assert already.dirty  # a later write is a change


def test_unwatched_names_cost_nothing_and_tokens_leave() -> None:
    w = Watchers()
    t = WatchToken()
    w.add(b"a", t)
    w.add(b"a", t)
    assert w.names == {b"a": [t]}
    w.remove(b"a", t)
    assert w.names == {}
    w.touch(b"a")
    assert not t.dirty


def test_every_vstore_mutation_marks_its_session() -> None:
    vs = VStore(ServerConfig().vstore, max_sessions=2)
    token, other = WatchToken(), WatchToken()
    vs.watchers.add(b"s", token)
    vs.watchers.add(b"u", other)
    steps: list[Callable[[], object]] = [
        lambda: vs.create(b"s", 8, "int8"),
        lambda: vs.store(b"s", 0, 0, rows(4, 8)),
        lambda: vs.snapshot(b"s"),
        lambda: vs.drop(b"s"),
    ]
    for step in steps:
        token.dirty = False
        step()
        assert token.dirty
    vs.create(b"s", 8, "int8")
    token.dirty = False
    vs.fetch_range(b"s", 0, 0, 4)  # a read
    assert not token.dirty
    vs.create(b"t", 8, "int8")
    vs.create(b"v", 8, "int8")  # max_sessions 2: the LRU evicts s
    assert b"s" not in vs and token.dirty
    assert not other.dirty
