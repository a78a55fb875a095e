"""Pub/sub's registry: who is subscribed to which channel, pattern and shard channel,
and delivery of a published message to them (docs/protocol.md, "Pub/sub").

One :class:`PubSub` per worker, on the worker's state, owned by the event loop thread.
A subscriber is anything with an id, a protocol version and a ``push`` callable: the
server's connection installs ``push`` on its client (``pion.server.connection``),
which appends the bytes to that client's output, never waiting for it to read. A
subscriber too slow to read is the connection's business: it is disconnected past
``client-output-buffer-limit pubsub`` (:class:`OutputLimit`), which the registry
only holds.

Messages are encoded once per protocol version per publish: ``*3`` arrays for RESP2
clients, ``>3`` pushes for RESP3 ones. A client subscribed to a channel and to a
pattern matching it gets the message twice, as from Redis; channel subscribers are
served first, in the order they subscribed, then pattern subscribers.

Channels are this worker's: under ``-w N`` a message reaches the subscribers connected
to the worker it was published on (docs/deployment.md, "Workers").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pion.keyspace.glob import stringmatch

__all__ = [
    "Kind",
    "OutputLimit",
    "PubSub",
    "Subscriber",
    "Subscriptions",
    "bulk",
    "header",
]


class Subscriber(Protocol):
    """What the registry needs of a client (``ClientState`` is one)."""

    @property
    def id(self) -> int: ...

    @property
    def proto(self) -> int: ...

    @property
    def push(self) -> Callable[[bytes], None] | None: ...


class Kind(enum.IntEnum):
    """The three namespaces of subscriptions, each with its own commands' names."""

    CHANNEL = 0
    PATTERN = 1
    SHARD = 2


# Per kind: the confirmation names of subscribe and unsubscribe.
SUBSCRIBE_NAMES = (b"subscribe", b"psubscribe", b"ssubscribe")
UNSUBSCRIBE_NAMES = (b"unsubscribe", b"punsubscribe", b"sunsubscribe")


def header(proto: int, count: int) -> bytes:
    """An array header (RESP2) or a push header (RESP3) of ``count`` elements."""
    return b"%c%d\r\n" % (62 if proto == 3 else 42, count)


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


@dataclass
class OutputLimit:
    """``client-output-buffer-limit`` for one client class: a hard byte limit, and a
    soft one a client may stay over for ``soft_seconds`` (0 bytes: no limit)."""

    hard: int
    soft: int
    soft_seconds: int

    def text(self) -> str:
        return f"{self.hard} {self.soft} {self.soft_seconds}"

    def exceeded(
        self, used: int, since: float | None, clock: Callable[[], float]
    ) -> tuple[bool, float | None]:
        """Redis's check (``checkClientOutputBufferLimits``): whether a client whose
        output holds ``used`` bytes is over the hard limit, or has been over the soft
        one for longer than its seconds; with since when it has been over the soft
        limit (``since``: what the last check returned; None: not over it). The clock
        is read only while over the soft limit."""
        if self.hard and used >= self.hard:
            return True, since
        if not self.soft or used < self.soft:
            return False, None
        now = clock()
        if since is None:
            return False, now
        return now - since > self.soft_seconds, since


@dataclass
class Subscriptions:
    """One client's subscriptions, per kind, in the order it made them."""

    names: tuple[dict[bytes, None], dict[bytes, None], dict[bytes, None]] = field(
        default_factory=lambda: ({}, {}, {})
    )

    def count(self, kind: Kind) -> int:
        """What a (un)subscribe confirmation reports: channels and patterns together,
        shard channels alone (Redis 7)."""
        if kind is Kind.SHARD:
            return len(self.names[Kind.SHARD])
        return len(self.names[Kind.CHANNEL]) + len(self.names[Kind.PATTERN])

    def total(self) -> int:
        return sum(len(n) for n in self.names)


@dataclass
class PubSub:
    """The worker's subscriptions, and the settings pub/sub reads at run time."""

    # Per kind: name -> subscribers by client id (in subscription order).
    table: tuple[
        dict[bytes, dict[int, Subscriber]],
        dict[bytes, dict[int, Subscriber]],
        dict[bytes, dict[int, Subscriber]],
    ] = field(default_factory=lambda: ({}, {}, {}))
    # Client id -> its subscriptions (only clients with at least one).
    clients: dict[int, Subscriptions] = field(default_factory=dict)
    # client-output-buffer-limit: the three classes CONFIG shows, by name. Only
    # "pubsub" is enforced; "normal" and "replica" are kept so CONFIG GET answers
    # what was set (Pion bounds ordinary clients by maxmemory-clients).
    limits: dict[str, OutputLimit] = field(
        default_factory=lambda: {
            "normal": OutputLimit(0, 0, 0),
            "slave": OutputLimit(256 * 1024 * 1024, 64 * 1024 * 1024, 60),
            "pubsub": OutputLimit(32 * 1024 * 1024, 8 * 1024 * 1024, 60),
        }
    )
    # Subscribers disconnected for passing the pubsub output limit (INFO stats).
    limit_disconnects: int = 0

    def of(self, client_id: int) -> Subscriptions | None:
        return self.clients.get(client_id)

    def subscribed(self, client_id: int) -> bool:
        return client_id in self.clients

    def subscribe(self, kind: Kind, client: Subscriber, name: bytes) -> int:
        """Subscribe ``client`` (idempotent); returns its confirmation count."""
        subs = self.clients.get(client.id)
        if subs is None:
            subs = self.clients[client.id] = Subscriptions()
        mine = subs.names[kind]
        if name not in mine:
            mine[name] = None
            self.table[kind].setdefault(name, {})[client.id] = client
        return subs.count(kind)

    def unsubscribe(self, kind: Kind, client_id: int, name: bytes) -> int:
        """Drop one subscription (absent: nothing changes); returns the count left."""
        subs = self.clients.get(client_id)
        if subs is None:
            return 0
        if subs.names[kind].pop(name, 0) is None:
            self._drop(kind, client_id, name)
        left = subs.count(kind)
        if not subs.total():
            del self.clients[client_id]
        return left

    def names(self, kind: Kind, client_id: int) -> list[bytes]:
        subs = self.clients.get(client_id)
        return [] if subs is None else list(subs.names[kind])

    def forget(self, client_id: int) -> None:
        """A client left (disconnect, kill, eviction): all its subscriptions go."""
        subs = self.clients.pop(client_id, None)
        if subs is None:
            return
        for kind in Kind:
            for name in subs.names[kind]:
                self._drop(kind, client_id, name)

    def _drop(self, kind: Kind, client_id: int, name: bytes) -> None:
        table = self.table[kind]
        holders = table.get(name)
        if holders is not None:
            holders.pop(client_id, None)
            if not holders:
                del table[name]

    # -- delivery ---------------------------------------------------------------

    def publish(self, channel: bytes, message: bytes) -> int:
        """Deliver to the channel's subscribers, then to matching patterns';
        returns how many messages were delivered."""
        holders = self.table[Kind.CHANNEL].get(channel)
        patterns = self.table[Kind.PATTERN]
        if not holders and not patterns:
            return 0  # nobody listens (every keyspace notification nobody asked for)
        tail = bulk(channel) + bulk(message)
        count = 0
        if holders:
            count += _deliver(holders.values(), b"$7\r\nmessage\r\n" + tail, 3)
        if patterns:
            for pattern, holders in list(patterns.items()):
                if stringmatch(pattern, channel):
                    body = b"$8\r\npmessage\r\n" + bulk(pattern) + tail
                    count += _deliver(list(holders.values()), body, 4)
        return count

    def spublish(self, channel: bytes, message: bytes) -> int:
        holders = self.table[Kind.SHARD].get(channel)
        if not holders:
            return 0
        body = b"$8\r\nsmessage\r\n" + bulk(channel) + bulk(message)
        return _deliver(holders.values(), body, 3)

    def numsub(self, kind: Kind, name: bytes) -> int:
        return len(self.table[kind].get(name, ()))

    def matching(self, kind: Kind, pattern: bytes | None) -> list[bytes]:
        """The active channels (or shard channels), those matching ``pattern``."""
        return [n for n in self.table[kind] if pattern is None or stringmatch(pattern, n)]


def _deliver(holders: Iterable[Subscriber], body: bytes, count: int) -> int:
    """Push ``body`` (the message's elements) to each holder in its protocol."""
    encoded: dict[int, bytes] = {}
    delivered = 0
    # A copy: a push may disconnect its client (output limit), which unsubscribes it.
    for holder in list(holders):
        push = holder.push
        if push is None:
            continue
        proto = holder.proto
        data = encoded.get(proto)
        if data is None:
            data = encoded[proto] = header(proto, count) + body
        push(data)
        delivered += 1
    return delivered
