"""``maxmemory-policy``: what is evicted to keep ``used_memory`` under ``--maxmemory``
(``pion.commands.budget``). V-store namespaces go first, then keys as the policy
says; ``noeviction`` evicts nothing; a write never evicts what it names; while
``used_memory`` is over the limit a write is refused with Redis's text, and commands
that only free memory still run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import redis

from pion.server.run import ServerThread
from support import data_budget, wait_until

Factory = Callable[..., ServerThread]
KB = 1 << 10
OOM_TEXT = "command not allowed when used memory > 'maxmemory'."


def _client(srv: ServerThread, policy: str) -> redis.Redis:
    r = redis.Redis(port=srv.port, socket_timeout=30)
    r.config_set("maxmemory-policy", policy)
    # Sampling is random: seeded, the victims are the same every run.
    srv.state.keyspace.rng.seed(7)
    srv.state.memory.rng.seed(7)
    return r


def _namespace(r: redis.Redis, sid: str) -> None:
    """A V-store namespace holding about 300 KB."""
    r.execute_command("V.CREATE", sid, 1024, "VQUANT", "fp16")
    rows = np.zeros((150, 1024), dtype=np.float32).tobytes()
    r.execute_command("V.STOREBATCH", sid, 0, 0, 150, rows)


def _stats(r: redis.Redis) -> tuple[int, int]:
    s = r.info("stats")
    return int(s["vstore_evictions"]), int(s["evicted_keys"])


def test_noeviction_evicts_neither_namespaces_nor_keys(server_factory: Factory) -> None:
    r = _client(server_factory(), "noeviction")
    _namespace(r, "ns")
    r.set("t", b"x" * (100 * KB), ex=1000)
    data_budget(r, 200 * KB)
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
        r.set("big", b"y" * (300 * KB))
    assert _stats(r) == (0, 0)
    assert r.exists("t") == 1 and r.exists("big") == 0
    assert r.execute_command("V.INFO", "ns")


def test_volatile_lru_evicts_namespaces_then_keys_with_a_deadline(
    server_factory: Factory,
) -> None:
    srv = server_factory()
    r = _client(srv, "volatile-lru")
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
    r.config_set("notify-keyspace-events", "Ee")
    events = r.pubsub()
    events.subscribe("__keyevent@0__:evicted")
    assert events.get_message(timeout=5) is not None  # the subscribe confirmation
    _namespace(r, "ns")
    r.set("keep", b"k" * (300 * KB))
    r.set("t1", b"1" * (200 * KB), ex=1000)
    r.set("t2", b"2" * (200 * KB), ex=1000)
    data_budget(r, 100 * KB)
    # 250 KB more: the namespace (300 KB) is enough, and it goes first.
    r.set("a", b"a" * (250 * KB))
    assert _stats(r) == (1, 0)
    # 300 KB more: only keys are left; those with a deadline go, "keep" stays.
    r.set("b", b"b" * (300 * KB))
    assert _stats(r)[1] >= 1 and r.exists("t1") + r.exists("t2") < 2
    assert r.exists("keep", "a", "b") == 3
    message = wait_until(lambda: events.get_message(timeout=1), what="evicted event")
    assert message["data"] in (b"t1", b"t2")
    # Nothing with a deadline left: a write that does not fit answers -OOM.
    r.delete("t1", "t2")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.set("c", b"c" * (500 * KB))
    assert r.exists("keep", "a", "b") == 3
    events.close()


def test_allkeys_lru_evicts_the_least_recently_used_key(server_factory: Factory) -> None:
    srv = server_factory()
    r = _client(srv, "allkeys-lru")
    for name in ("a", "b", "c"):
        r.set(name, name.encode() * (200 * KB))
    data_budget(r, 100 * KB)
    # "a" was last used long ago (Redis's LRU clock has one-second resolution).
    entry = srv.state.keyspace.peek(b"a")
    assert entry is not None
    entry.touched -= 100
    r.set("d", b"d" * (200 * KB))
    assert r.exists("a") == 0 and r.exists("b", "c", "d") == 3
    assert _stats(r)[1] == 1


def test_volatile_ttl_evicts_the_nearest_deadline_first(server_factory: Factory) -> None:
    r = _client(server_factory(), "volatile-ttl")
    r.set("late", b"l" * (200 * KB), ex=3000)
    r.set("soon", b"s" * (200 * KB), ex=100)
    r.set("mid", b"m" * (200 * KB), ex=1000)
    data_budget(r, 100 * KB)
    r.set("new", b"n" * (200 * KB))
    assert r.exists("soon") == 0 and r.exists("late", "mid", "new") == 3


@pytest.mark.parametrize("policy", ["allkeys-random", "volatile-random"])
def test_random_policies_evict_what_they_may(server_factory: Factory, policy: str) -> None:
    r = _client(server_factory(), policy)
    r.set("plain", b"p" * (200 * KB))
    r.set("volatile", b"v" * (200 * KB), ex=1000)
    data_budget(r, 100 * KB)
    r.set("new", b"n" * (200 * KB))
    assert _stats(r)[1] == 1 and r.exists("new") == 1
    if policy == "volatile-random":
        assert r.exists("plain") == 1 and r.exists("volatile") == 0


def test_a_write_never_evicts_what_it_names(server_factory: Factory) -> None:
    r = _client(server_factory(), "allkeys-lru")
    r.set("k", b"x" * (300 * KB))
    data_budget(r, 100 * KB)
    # APPEND needs room for the new value beside the old one: only "k" could go.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.append("k", b"y" * (50 * KB))
    assert r.strlen("k") == 300 * KB and _stats(r)[1] == 0


def test_over_the_limit_writes_are_refused_and_freeing_commands_run(
    server_factory: Factory,
) -> None:
    r = _client(server_factory(), "noeviction")
    r.rpush("l", b"x" * (100 * KB), b"y" * (100 * KB))
    r.set("s", b"z" * (100 * KB))
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used - 150 * KB)  # now over it
    with pytest.raises(redis.exceptions.OutOfMemoryError) as refused:
        r.set("new", "v")
    assert str(refused.value) == OOM_TEXT  # Redis's own text
    # In MULTI the command is refused as it is queued, and EXEC aborts (as in Redis;
    # redis-py raises the queued command's error).
    with r.pipeline(transaction=True) as p, pytest.raises(redis.exceptions.OutOfMemoryError):
        p.set("new", "v")
        p.execute()
    assert r.exists("new") == 0
    assert r.get("s") is not None  # reads run
    assert r.lpop("l") == b"x" * (100 * KB)  # and commands that only free memory
    assert r.delete("s") == 1
    r.set("new", "v")  # back under the limit: writes run again
    assert r.get("new") == b"v"


def test_over_the_limit_a_write_first_evicts_by_policy(server_factory: Factory) -> None:
    r = _client(server_factory(), "allkeys-lru")
    for i in range(10):
        r.set(f"k{i}", b"x" * (100 * KB))
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used - 250 * KB)
    r.set("small", "v")  # evicts keys until used_memory is under the limit
    assert _stats(r)[1] >= 3
    assert int(r.info("memory")["used_memory"]) <= used - 250 * KB
    assert r.get("small") == b"v"


def test_lfu_and_unknown_policies_are_refused(client: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="not supported"):
        client.config_set("maxmemory-policy", "allkeys-lfu")
    with pytest.raises(redis.ResponseError, match="argument must be one of"):
        client.config_set("maxmemory-policy", "sometimes")
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
    client.config_set("maxmemory-policy", "ALLKEYS-RANDOM")
    assert client.info("memory")["maxmemory_policy"] == "allkeys-random"


def test_a_vstore_write_evicts_keys_when_namespaces_are_not_enough(
    server_factory: Factory,
) -> None:
    r = _client(server_factory(), "allkeys-lru")
    r.set("k", b"x" * (400 * KB))
    data_budget(r, 100 * KB)
    _namespace(r, "ns")  # 300 KB: no other namespace to evict, so the key goes
    assert r.exists("k") == 0 and _stats(r) == (0, 1)
    r.config_set("maxmemory-policy", "volatile-lru")
    r.set("k2", b"x" * (400 * KB))  # a key write evicts the namespace
    assert r.info("memory")["vstore_bytes"] == 0 and _stats(r) == (1, 1)
    # "k2" has no deadline: under volatile-lru nothing can make room for a namespace.
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="evictable"):
        _namespace(r, "ns2")
    assert r.exists("k2") == 1 and _stats(r) == (1, 1)


def test_keys_of_every_database_are_candidates(server_factory: Factory) -> None:
    """A write in database 0 evicts a key with a deadline from database 3, announced in
    that database's channel, as Redis's eviction pool draws from every database."""
    srv = server_factory()
    r = _client(srv, "volatile-ttl")
    other = redis.Redis(port=srv.port, db=3, socket_timeout=30)
    r.config_set("notify-keyspace-events", "Ee")
    events = r.pubsub()
    events.subscribe("__keyevent@3__:evicted")
    assert events.get_message(timeout=5) is not None  # the subscribe confirmation
    r.set("keep", b"k" * (200 * KB))
    other.set("soon", b"s" * (200 * KB), ex=100)
    other.set("later", b"l" * (200 * KB), ex=10_000)
    data_budget(r, 50 * KB)
    r.set("new", b"n" * (150 * KB))
    assert _stats(r) == (0, 1)
    assert other.exists("soon") == 0 and other.exists("later") == 1
    assert r.exists("keep", "new") == 2
    message = wait_until(lambda: events.get_message(timeout=1), what="evicted event")
    assert message["data"] == b"soon"
