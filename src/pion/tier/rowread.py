"""Row chunks read from every node of the tier at once, straight into preallocated rows.

A fill reads hundreds of 512 KiB chunks. redis-py's cluster pipeline asks the nodes one
after another and hands each value over as a fresh ``bytes`` (hiredis copies it out of
its own buffer first), which the fill then joined and copied again. Here each node's
``GET``\\s go out as one pipelined write on a connection of redis-py's own pool (so
authentication, TLS and the cluster's slot map are redis-py's), each node is read on a
thread of its own, and every value's payload is received with ``recv_into`` directly
into the caller's destination: one copy from the kernel, none in user space, the GIL
released while the bytes arrive.

The replies are parsed here, strictly: a bulk string, a nil, or an error. ``MOVED``,
``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN`` and ``LOADING`` become redis-py's
``ClusterError`` (retryable: :class:`~pion.tier.client.TierClient` refreshes the
topology and the fill is retried by the next request), any other error reply a
``ResponseError``, anything else ``InvalidResponse``. A connection that saw an error is
closed, never returned to the pool half-read.
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
_BUFFER = 64 << 10  # headers and small values go through this buffer
_RETRYABLE = (b"MOVED", b"ASK", b"TRYAGAIN", b"CLUSTERDOWN", b"LOADING")


@dataclass(frozen=True, slots=True)
class Want:
    """Read key ``name`` into ``dest`` (writable, as many bytes as the value may hold)."""

    name: str
    dest: memoryview


class _Reader:
    """RESP replies from one socket: lines through a small buffer, bulk payloads
    received into their destination."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.buf = bytearray(_BUFFER)
        self.view = memoryview(self.buf)
        self.start = self.end = 0

    def _more(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):  # a line longer than what is left: compact
            self.buf[: self.end - self.start] = self.buf[self.start : self.end]
            self.end -= self.start
            self.start = 0
            if self.end == len(self.buf):
                raise redis.exceptions.InvalidResponse("reply line longer than 64 KiB")
        got = self.sock.recv_into(self.view[self.end :])
        if not got:
            raise redis.exceptions.ConnectionError("the tier closed the connection")
        self.end += got

    def _line(self) -> bytes:
        while True:
            at = self.buf.find(b"\r\n", self.start, self.end)
            if at >= 0:
                line = bytes(self.buf[self.start : at])
                self.start = at + 2
                return line
            self._more()

    def _exactly(self, dest: memoryview) -> None:
        """Fill ``dest``: first from the buffer, then straight from the socket."""
        have = min(self.end - self.start, len(dest))
        dest[:have] = self.view[self.start : self.start + have]
        self.start += have
        done = have
        while done < len(dest):
            got = self.sock.recv_into(dest[done:])
            if not got:
                raise redis.exceptions.ConnectionError("the tier closed the connection")
            done += got

    def bulk_into(self, dest: memoryview) -> int:
        """One reply: a bulk string's length (its bytes in ``dest`` when they fit, else
        read and dropped), or ABSENT for a nil; error replies raise."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            text = rest.decode("utf-8", "replace")
            if rest.startswith(_RETRYABLE):
                raise redis.exceptions.ClusterError(text)
            raise redis.exceptions.ResponseError(text)
        if kind == b"_" or line == b"$-1":
            return ABSENT
        if kind != b"$" or not rest.isdigit():
            raise redis.exceptions.InvalidResponse(f"expected a bulk string, got {line[:40]!r}")
        size = int(rest)
        if size <= len(dest):
            self._exactly(dest[:size])
        else:  # too long for its rows: drain it; the caller refuses the value
            left = size
            while left:
                step = min(left, _BUFFER)
                self._exactly(memoryview(bytearray(step)))
                left -= step
        self._exactly(memoryview(bytearray(2)))  # the payload's CRLF
        return size


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
        sock = conn._sock  # connected by get_connection
        if sock is None:
            conn.connect()
            sock = conn._sock
        conn.send_packed_command(conn.pack_commands([("GET", wants[i].name) for i in idx]))
        reader = _Reader(sock)
        for i in idx:
            sizes[i] = reader.bulk_into(wants[i].dest)
            if landed is not None:
                landed(i, sizes[i])
        if reader.start != reader.end:
            raise redis.exceptions.InvalidResponse("the tier sent more replies than asked")
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
