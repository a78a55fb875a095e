"""``PionPromptCache``: the synchronous client of a Pion server (numpy in, numpy out).

This module only does I/O: it runs the plans of :mod:`pion.client.plans` over a
redis-py connection (each batch one pipelined round trip), maps redis-py's exceptions
to :mod:`pion.client.errors`, and follows multi-worker redirects. Argument building,
reply parsing and the ``-COLDMISS`` retry live in the plans, shared with
:class:`pion.client.aio.AsyncPionPromptCache`.

Shapes: a K/V *layer* is ``[H, N, D]`` (heads first) or ``[N, H*D]`` (Pion's rows,
token-major, head-major within a row), any float dtype: fp16 travels as fp16 into fp16
layers, everything else (fp32, bf16, ...) as fp32. ``fetch`` returns fp32 ``[N, H*D]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.client import plans
from pion.client.errors import PionWrongWorker, error_from_redis
from pion.client.plans import Arrays, Plan, Warmed
from pion.client.wire import Command, make_namespace

__all__ = ["DEFAULT_PORT", "PionPromptCache", "connection_options", "map_results"]

T = TypeVar("T")
DEFAULT_PORT = 1974  # Pion's default port

# No CLIENT SETINFO on connect: two round trips saved per connection.
_NO_SETINFO: dict[str, Any]
try:
    from redis.driver_info import DriverInfo

    _NO_SETINFO = {"driver_info": DriverInfo(name=None, lib_version=None)}
except ImportError:  # redis-py before 7.1 has no DriverInfo
    _NO_SETINFO = {"lib_name": None, "lib_version": None}


def connection_options(
    password: str | None, username: str | None, timeout: float, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    """redis-py options shared by the sync and asyncio clients."""
    return {
        "password": password,
        "username": username,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "protocol": 2,
        **_NO_SETINFO,
        # redis-py retries ConnectionError 10 times with backoff by default, and it
        # classes NOAUTH/WRONGPASS/LOADING replies as ConnectionErrors: such a reply
        # would take seconds to surface. A dead pooled socket is still replaced on
        # checkout, so no retry is needed for that.
        "retry": Retry(NoBackoff(), 0),
        **(extra or {}),
    }


def map_results(results: Sequence[object]) -> list[object]:
    """Pipeline results with redis-py's error objects replaced by ours."""
    return [error_from_redis(r) if isinstance(r, redis.RedisError) else r for r in results]


class PionPromptCache:
    """A Pion server's prompt-prefix K/V cache.

    ``host``/``port``: the server (Pion's default port 1974). ``password`` (and
    ``username``): AUTH on every new connection. ``vquant``: the storage format
    ``register`` uses when none is given (``fp16 int8 fp8 mlx4g32 turbo4 turbo3
    turbo2``). ``follow_redirects``: on ``session lives on worker N``, retry once on
    the worker's affinity port ``port + 2 + N``. ``redis_options``: passed to
    ``redis.Redis`` (e.g. ``ssl=True``).

    Counters: ``cold_rehydrates_observed`` (``-COLDMISS`` replies answered with a
    WARM), ``redirects_followed``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        password: str | None = None,
        vquant: str = "fp16",
        *,
        username: str | None = None,
        timeout: float = 60.0,
        follow_redirects: bool = True,
        redis_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.vquant = vquant
        self.follow_redirects = follow_redirects
        self.cold_rehydrates_observed = 0
        self.redirects_followed = 0
        self._options = connection_options(password, username, timeout, redis_options)
        self._redis = redis.Redis(host=host, port=port, **self._options)
        self._workers: dict[int, redis.Redis] = {}

    make_namespace = staticmethod(make_namespace)

    # -- I/O --------------------------------------------------------------------------

    def _execute(self, conn: redis.Redis, batch: list[Command]) -> list[object]:
        try:
            if len(batch) == 1:
                try:
                    return [conn.execute_command(*batch[0])]  # type: ignore[no-untyped-call]
                except redis.ResponseError as exc:
                    return [error_from_redis(exc)]
            with conn.pipeline(transaction=False) as pipe:
                for command in batch:
                    pipe.execute_command(*command)  # type: ignore[no-untyped-call]
                results = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            # NOAUTH, LOADING, a lost connection: they concern the whole batch.
            raise error_from_redis(exc) from exc
        return map_results(results)

    def _drive(self, conn: redis.Redis, plan: Plan[T]) -> T:
        try:
            batch = next(plan)
            while True:
                batch = plan.send(self._execute(conn, batch))
        except StopIteration as done:
            result: T = done.value
            return result

    def _run(self, make: Callable[[], Plan[T]]) -> T:
        try:
            return self._drive(self._redis, make())
        except PionWrongWorker as moved:
            if not self.follow_redirects:
                raise
            self.redirects_followed += 1
            return self._drive(self._worker(moved.worker), make())

    def _worker(self, worker: int) -> redis.Redis:
        """A connection to worker ``worker``'s affinity port (DESIGN section 8)."""
        if worker not in self._workers:
            self._workers[worker] = redis.Redis(
                host=self.host, port=self.port + 2 + worker, **self._options
            )
        return self._workers[worker]

    def close(self) -> None:
        """Close every connection (the object must not be used afterwards)."""
        for conn in (self._redis, *self._workers.values()):
            conn.close()
        self._workers.clear()

    def __enter__(self) -> PionPromptCache:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _count_rehydrate(self) -> None:
        self.cold_rehydrates_observed += 1

    # -- registry ---------------------------------------------------------------------

    def register(
        self,
        ns: str,
        kv_dim: int,
        vquant: str | None = None,
        *,
        blocks: Sequence[int] | npt.NDArray[Any] | None = None,
        block_size: int = 64,
        prefill_ms: float | None = None,
    ) -> None:
        """KV.PREFIX.REGISTER: create ``<ns>_pk``/``<ns>_pv`` (rows of ``kv_dim``
        values in ``vquant``, default the client's). ``blocks``: u64 block hashes in
        token order (see :mod:`pion.client.hashing`) for MEMBERSHIP probes.
        ``prefill_ms``: the measured prefill time the receipt credits each hit with.
        Idempotent: an existing namespace keeps its layout."""
        vq = self.vquant if vquant is None else vquant
        self._run(
            lambda: plans.register(
                ns, kv_dim, vq, blocks=blocks, block_size=block_size, prefill_ms=prefill_ms
            )
        )

    def lookup(
        self,
        ns: str,
        *,
        tokens: int | None = None,
        prefill_ms: float | None = None,
        stage2: bool = False,
    ) -> bool:
        """KV.PREFIX.LOOKUP: True on a hit (recorded in the server's receipt, credited
        with ``tokens``/``prefill_ms`` when given). ``stage2``: also require the
        attention tier to hold layer 0 (ATTEND.PREFIX.LOOKUP)."""
        return self._run(lambda: plans.lookup(ns, tokens, prefill_ms, stage2))

    def drop(self, *namespaces: str) -> int:
        """KV.PREFIX.DROP: the number of namespaces of which a half was held."""
        return self._run(lambda: plans.drop(namespaces))

    def owner(self, ns: str) -> int:
        """KV.PREFIX.OWNER: the worker holding ``ns``, -1 when none."""
        return self._run(lambda: plans.owner(ns))

    def blocks(self, ns: str) -> tuple[int, npt.NDArray[np.uint64]] | None:
        """KV.PREFIX.BLOCKS: ``(block_size, hashes)``, None when there is no table."""
        return self._run(lambda: plans.blocks(ns))

    def membership(
        self, ns: str, hashes: Sequence[int] | npt.NDArray[Any]
    ) -> npt.NDArray[np.bool_] | None:
        """KV.PREFIX.MEMBERSHIP: per probe, whether ``ns``'s table holds it; None when
        there is no table."""
        return self._run(lambda: plans.membership(ns, hashes))

    def info(self) -> dict[str, int | float | str]:
        """KV.PREFIX.INFO as a dict (numbers converted)."""
        return self._run(plans.info)

    def save(self, path: str | None = None) -> None:
        """KV.PREFIX.SAVE: snapshot (``path`` relative to the server's data dir)."""
        self._run(lambda: plans.save(path))

    def commit(self) -> None:
        """KV.PREFIX.COMMIT: returns once every acknowledged write is on disk."""
        self._run(plans.commit)

    def stats(self) -> dict[str, int | float]:
        """PION.STATS of the connected worker (hits, misses, prefill time saved...)."""
        return self._run(lambda: plans.stats(False))

    def reset_stats(self) -> None:
        """PION.STATS RESET."""
        self._run(lambda: plans.stats(True))

    # -- K/V --------------------------------------------------------------------------

    def store(self, ns: str, keys: Sequence[npt.ArrayLike], values: Sequence[npt.ArrayLike]) -> int:
        """Store every layer's K and V (one array per layer, ``[H, N, D]`` or
        ``[N, H*D]``) as rows ``0 .. N-1`` in one pipelined round trip; returns N."""
        return self._run(lambda: plans.store(ns, keys, values))

    def fetch(
        self, ns: str, n_tokens: int | None = None, layers: Iterable[int] | None = None
    ) -> tuple[Arrays, Arrays]:
        """``(keys, values)``: per layer (all, or ``layers``), rows ``0 .. n-1`` as fp32
        ``[n, H*D]``; ``n`` = every stored row when ``n_tokens`` is None. Rows never
        written read as zeros. Arrays may be read-only views of the reply."""
        picked = None if layers is None else list(layers)
        return self._run(lambda: plans.fetch(ns, n_tokens, picked))

    # -- attention tier (Stage 2) -----------------------------------------------------

    def warm(self, ns: str, n_heads: int, head_dim: int, attend_sid: str | None = None) -> Warmed:
        """KV.PREFIX.WARM: rehydrate the attention tier from the V-store."""
        return self._run(lambda: plans.warm(ns, n_heads, head_dim, attend_sid))

    def attend_store(self, ns: str, layer: int, keys: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """ATTEND.PREFIX.STORE one layer's K/V ``[H, N, D]`` (fp32 on the wire)."""
        self._run(lambda: plans.attend_store(ns, layer, keys, values))

    def attend_query(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> npt.NDArray[np.float32]:
        """ATTEND.PREFIX.QUERY: attention of ``q`` (``[H, D]`` or ``[H, M, D]``) over
        the cached prefix, shaped like ``q``. After ``-COLDMISS`` it WARMs and retries
        once; a second miss raises :class:`~pion.client.errors.PionColdMiss`."""
        return self.attend_query_lse(ns, layer, q, top_k=top_k, fa_window=fa_window)[0]

    def attend_query_lse(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]:
        """:meth:`attend_query` plus the LSE ``[H, M]`` the server sends for M > 1
        (None for M = 1), for merging with locally computed suffix attention."""
        return self._run(
            lambda: plans.attend_query(
                ns, layer, q, top_k=top_k, fa_window=fa_window, on_rehydrate=self._count_rehydrate
            )
        )
