"""Row chunks read from every node of the tier at once, into preallocated rows.

A fill reads hundreds of 512 KiB chunks. redis-py's cluster pipeline asks the nodes one
after another, and hands the values over only once every node has answered. Here each
node's ``GET``\\s go out as one pipelined write on a connection of that node's pool,
each node is read on a thread of its own, and every value is copied into the caller's
destination as soon as its reply has been read, so a waiting reader can use it before
the rest arrive (``landed``).

Only redis-py's public interface is used: the pool's ``get_connection()``,
``pack_commands``, ``send_packed_command`` and ``read_response`` (its own parser, so
authentication, TLS and the cluster's slot map are redis-py's). An error reply raises
redis-py's exception for it; ``MOVED``, ``ASK``, ``TRYAGAIN`` and ``CLUSTERDOWN``
become ``ClusterError`` (retryable: :class:`~pion.tier.client.TierClient` refreshes
the topology and the fill is retried by the next request) whichever parser the
connection has; a reply that is not a bulk string or a nil raises ``InvalidResponse``.
A connection that saw an error is closed, never returned to the pool half-read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

__all__ = ["ABSENT", "Landed", "Want", "read_into"]

Client = redis.Redis | RedisCluster

ABSENT = -1  # what read_into reports for a key the tier does not hold
# Cluster redirections (with or without the cluster parser's own exception classes).
_REDIRECTED = (
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)
_RETRYABLE = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


@dataclass(frozen=True, slots=True)
class Want:
    """Read key ``name`` into ``dest`` (writable, as many bytes as the value may hold)."""

    name: str
    dest: memoryview


def _land(reply: object, dest: memoryview) -> int:
    """A GET's reply into ``dest``: its length (a value longer than ``dest`` is not
    stored; the caller refuses it), or ABSENT for a nil."""
    if reply is None:
        return ABSENT
    if not isinstance(reply, bytes):
        raise redis.exceptions.InvalidResponse(f"expected a bulk string, got {reply!r:.40}")
    if len(reply) <= len(dest):
        dest[: len(reply)] = reply
    return len(reply)


def _retryable(exc: redis.exceptions.ResponseError) -> redis.exceptions.RedisError:
    if isinstance(exc, _REDIRECTED) or str(exc).startswith(_RETRYABLE):
        return redis.exceptions.ClusterError(str(exc))
    return exc


def _node_pools(r: Client, names: Sequence[str]) -> dict[Any, list[int]]:
    """Indices of ``names`` per connection pool (one per node holding them)."""
    groups: dict[Any, list[int]] = {}
    if isinstance(r, RedisCluster):
        for i, name in enumerate(names):
            node = r.get_node_from_key(name)  # type: ignore[no-untyped-call]
            conn = node.redis_connection or r.get_redis_connection(node)
            groups.setdefault(conn.connection_pool, []).append(i)
    else:
        groups[r.connection_pool] = list(range(len(names)))
    return groups


# Told, on the reading thread, each value's index and length as soon as it is received.
Landed = Callable[[int, int], None]


def _read_node(
    pool: Any, wants: Sequence[Want], sizes: list[int], idx: Sequence[int], landed: Landed | None
) -> None:
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands([("GET", wants[i].name) for i in idx]))
        for i in idx:
            try:
                reply = conn.read_response()
            except redis.exceptions.ResponseError as exc:
                raise _retryable(exc) from exc
            sizes[i] = _land(reply, wants[i].dest)
            if landed is not None:
                landed(i, sizes[i])
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    pool.release(conn)


def read_into(
    r: Client, wants: Sequence[Want], threads: ThreadPoolExecutor, landed: Landed | None = None
) -> list[int]:
    """``GET`` every ``want.name`` into its ``dest``, every node at once (one node's
    share on the calling thread, the others on ``threads``), each node's in the order
    of ``wants``. Returns each value's length (larger than its ``dest``: not stored) or
    :data:`ABSENT`; ``landed(i, length)`` is called as each one arrives (on the thread
    that read it). Raises redis-py's exceptions; ``dest`` contents are then undefined."""
    sizes = [ABSENT] * len(wants)
    groups = list(_node_pools(r, [w.name for w in wants]).items())
    if not groups:
        return sizes
    futures = [
        threads.submit(_read_node, pool, wants, sizes, idx, landed) for pool, idx in groups[1:]
    ]
    try:
        _read_node(groups[0][0], wants, sizes, groups[0][1], landed)
    finally:
        errors = [f.exception() for f in futures]  # waits for every node
    for exc in errors:
        if exc is not None:
            raise exc
    return sizes
