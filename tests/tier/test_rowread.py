"""``tier/rowread.py`` against real redis-servers: values received into their rows from
every node of a 3-node cluster at once, equal to redis-py's ``GET``; nil, empty,
oversized and wrong-type values; a connection that saw an error is not reused."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis
from pion_testing.redis_nodes import RedisCluster3, RedisNode

from pion.tier.rowread import ABSENT, Want, read_into


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def test_a_cluster_pipeline_lands_in_place(
    cluster: RedisCluster3, threads: ThreadPoolExecutor, prefix: str
) -> None:
    rc = cluster.client()
    rng = np.random.default_rng(3)
    names = [f"{prefix}:row:{i}" for i in range(60)]
    values = [rng.bytes(int(rng.integers(0, 300_000))) for _ in names]
    for name, value in zip(names, values, strict=True):
        rc.set(name, value)
    owners = {cluster.owner_of(name).port for name in names}
    assert len(owners) == 3  # every node holds some: they are read at once
    width = 300_000
    dest = np.zeros((len(names) + 1, width), dtype=np.uint8)
    wants = [Want(name, dest[i].data.cast("B")) for i, name in enumerate(names)]
    wants.append(Want(f"{prefix}:absent", dest[-1].data.cast("B")))
    sizes = read_into(rc, wants, threads)
    assert sizes == [len(v) for v in values] + [ABSENT]
    for i, value in enumerate(values):
        assert dest[i, : len(value)].tobytes() == value == rc.get(names[i])
    # Twice on the same pooled connections: nothing left half-read.
    again = np.zeros_like(dest)
    wants = [Want(w.name, again[i].data.cast("B")) for i, w in enumerate(wants)]
    assert read_into(rc, wants, threads) == sizes
    np.testing.assert_array_equal(again, dest)
    rc.close()


def test_oversized_values_are_drained_not_stored(
    redis_node: RedisNode, threads: ThreadPoolExecutor
) -> None:
    r = redis_node.client()
    big = bytes(range(256)) * 1000
    r.set("big", big)
    r.set("small", b"xyz")
    r.set("empty", b"")
    dest = np.zeros((3, 100), dtype=np.uint8)
    wants = [Want(n, dest[i].data.cast("B")) for i, n in enumerate(["big", "small", "empty"])]
    assert read_into(r, wants, threads) == [len(big), 3, 0]
    assert not dest[0].any()  # nothing of the value that did not fit
    assert dest[1, :3].tobytes() == b"xyz"
    assert r.get("small") == b"xyz"  # the connection went back to the pool in step


def test_an_error_reply_raises_and_the_connection_is_dropped(
    redis_node: RedisNode, threads: ThreadPoolExecutor
) -> None:
    r = redis_node.client()
    r.hset("hash", "f", "v")
    r.set("ok", b"fine")
    dest = np.zeros((2, 16), dtype=np.uint8)
    wants = [Want("hash", dest[0].data.cast("B")), Want("ok", dest[1].data.cast("B"))]
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        read_into(r, wants, threads)
    # The next read gets a clean connection and the right answers.
    assert read_into(r, wants[1:], threads) == [4]
    assert dest[1, :4].tobytes() == b"fine"
    assert r.ping()


def test_a_redirection_is_a_retryable_cluster_error(
    cluster: RedisCluster3, threads: ThreadPoolExecutor, prefix: str
) -> None:
    # A plain client of a node that does not own the key: MOVED (redis-py's
    # MovedError, a ResponseError) is the ClusterError TierClient retries.
    name = f"{prefix}:moved"
    cluster.client().set(name, b"v")
    owner = cluster.owner_of(name)
    other = next(node for node in cluster.nodes if node is not owner)
    r = other.client()
    dest = np.zeros(8, dtype=np.uint8)
    with pytest.raises(redis.exceptions.ClusterError) as raised:
        read_into(r, [Want(name, dest.data.cast("B"))], threads)
    assert isinstance(raised.value.__cause__, redis.exceptions.ResponseError)
    assert r.ping()  # the connection that saw the error was dropped, not reused
