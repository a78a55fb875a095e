"""The connection to the tier: redis-py's ``RedisCluster`` for a cluster (Redis Cluster
or Valkey), a plain ``Redis`` for one standalone server, chosen by asking the first
seed that answers (``INFO cluster``: ``cluster_enabled``).

A :class:`TierClient` connects lazily and again after a failure, so a tier that is
down at start-up (or restarts) costs nothing but failed attempts, paced by
:class:`~pion.tier.health.Health`. Each thread that talks to the tier owns its own
client (redis-py connections are not shared across threads here).

Every call goes through :meth:`TierClient.call`, which times it for INFO, records
success or failure in the shared health state, and turns redis-py's exceptions into
two of ours: :class:`TierIOError` (the tier is unreachable, slow, failing over:
try again later) and :class:`TierRejected` (the tier answered with an error, e.g.
``OOM`` under ``maxmemory-policy noeviction`` or a foreign key of the wrong type:
retrying the same write will not help).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from pion.config import TierConfig
from pion.tier.health import Health, Kind
from pion.tier.url import TierEndpoint, parse_tier_url

__all__ = ["TierClient", "TierIOError", "TierRejected"]

log = logging.getLogger("pion.tier")

T = TypeVar("T")

# Connecting is bounded on its own: an unreachable host must not cost a full
# round-trip timeout per seed.
_MAX_CONNECT_TIMEOUT_S = 1.0

_RETRYABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.RedisClusterException,
    redis.exceptions.InvalidResponse,
    OSError,
)


class TierIOError(Exception):
    """The tier could not be reached (or answered too slowly); retry later."""


class TierRejected(Exception):
    """The tier answered with an error; retrying the same operation will not help."""


class TierClient:
    def __init__(self, config: TierConfig, health: Health) -> None:
        self.config = config
        self.health = health
        url = parse_tier_url(config.url)
        self.endpoint = TierEndpoint(
            url.nodes,
            url.tls or config.tls,
            config.username or url.username,
            config.password or url.password,
        )
        self.mode = "unknown"  # "cluster" or "standalone" once connected
        self._redis: redis.Redis | RedisCluster | None = None

    # -- connecting ------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        cfg = self.config
        opts: dict[str, Any] = {
            "socket_timeout": cfg.timeout,
            "socket_connect_timeout": min(cfg.timeout, _MAX_CONNECT_TIMEOUT_S),
            "username": self.endpoint.username,
            "password": self.endpoint.password,
            "client_name": "pion-tier",
        }
        if self.endpoint.tls:
            opts.update(
                ssl=True,
                ssl_cert_reqs=ssl.CERT_REQUIRED,
                ssl_ca_certs=str(cfg.tls_ca_file) if cfg.tls_ca_file else None,
                ssl_certfile=str(cfg.tls_cert_file) if cfg.tls_cert_file else None,
                ssl_keyfile=str(cfg.tls_key_file) if cfg.tls_key_file else None,
            )
        return opts

    def _connect(self) -> redis.Redis | RedisCluster:
        opts = self._options()
        errors: list[str] = []
        for host, port in self.endpoint.nodes:
            probe = redis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **opts)
            try:
                enabled = int(probe.info("cluster").get("cluster_enabled", 0))
            except _RETRYABLE as exc:
                errors.append(f"{host}:{port}: {exc}")
                probe.close()
                continue
            if not enabled:
                if len(self.endpoint.nodes) > 1:
                    probe.close()
                    raise TierIOError(
                        f"{host}:{port} is a standalone redis-server, but --tier names "
                        f"{len(self.endpoint.nodes)} nodes (list one, or enable cluster mode)"
                    )
                self.mode = "standalone"
                return probe
            probe.close()
            self.mode = "cluster"
            return RedisCluster(
                startup_nodes=[
                    ClusterNode(h, p)  # type: ignore[no-untyped-call]
                    for h, p in self.endpoint.nodes
                ],
                # One retry after a topology refresh: a moved slot is followed at once;
                # anything longer is the tier's outage, paced by Health instead.
                retry=Retry(NoBackoff(), 1),
                require_full_coverage=False,
                **opts,
            )
        raise TierIOError("no seed node answered (" + "; ".join(errors)[:400] + ")")

    @property
    def connection(self) -> redis.Redis | RedisCluster:
        """The connected client (connecting now if needed); raises redis-py errors."""
        if self._redis is None:
            self._redis = self._connect()
        return self._redis

    def close(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection must never raise further
                log.debug("closing the tier client failed", exc_info=True)

    # -- calling ---------------------------------------------------------------------

    def call(self, kind: Kind, fn: Callable[[redis.Redis | RedisCluster], T]) -> T:
        """Run ``fn(client)``: time it, record the outcome in :attr:`health`, and raise
        TierIOError / TierRejected instead of redis-py's exceptions."""
        start = time.perf_counter()
        try:
            result = fn(self.connection)
        except TierIOError as exc:
            self.close()
            self.health.failure(kind, str(exc))
            raise
        except _RETRYABLE as exc:
            # Before RedisError: CLUSTERDOWN, TRYAGAIN, MOVED and READONLY are replies
            # too, but they mean "not now", not "never".
            self._failed(kind, exc)
        except redis.exceptions.RedisError as exc:
            raise TierRejected(str(exc)[:300]) from None
        self.health.success(kind, time.perf_counter() - start)
        return result

    def _failed(self, kind: Kind, exc: BaseException) -> None:
        # A fresh client next time: it re-reads the cluster's topology from the seed nodes.
        self.close()
        text = f"{type(exc).__name__}: {exc}"
        self.health.failure(kind, text)
        raise TierIOError(text[:300]) from None
