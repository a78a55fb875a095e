"""``AsyncPionPromptCache``: the asyncio twin of :class:`pion.client.PionPromptCache`,
on ``redis.asyncio``.

Only the I/O differs: the same plans (:mod:`pion.client.plans`) run here, awaiting each
pipelined batch, so argument building, reply parsing, the ``-COLDMISS`` retry and the
error mapping are shared with the sync client. Methods, arguments and results are the
sync client's; see its docstrings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import redis
import redis.asyncio

from pion.client import plans
from pion.client.cache import DEFAULT_PORT, connection_options, map_results
from pion.client.errors import PionWrongWorker, error_from_redis
from pion.client.plans import Arrays, Plan, Warmed
from pion.client.wire import Command, make_namespace

__all__ = ["AsyncPionPromptCache"]

T = TypeVar("T")


class AsyncPionPromptCache:
    """Asyncio client; same constructor and methods as ``PionPromptCache``, awaited."""

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
        # redis.asyncio takes its own Retry class.
        self._options["retry"] = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
        self._redis = redis.asyncio.Redis(host=host, port=port, **self._options)
        self._workers: dict[int, redis.asyncio.Redis] = {}

    make_namespace = staticmethod(make_namespace)

    async def _execute(self, conn: redis.asyncio.Redis, batch: list[Command]) -> list[object]:
        try:
            if len(batch) == 1:
                try:
                    return [await conn.execute_command(*batch[0])]  # type: ignore[no-untyped-call]
                except redis.ResponseError as exc:
                    return [error_from_redis(exc)]
            async with conn.pipeline(transaction=False) as pipe:
                for command in batch:
                    pipe.execute_command(*command)
                results = await pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            raise error_from_redis(exc) from exc
        return map_results(results)

    async def _drive(self, conn: redis.asyncio.Redis, plan: Plan[T]) -> T:
        try:
            batch = next(plan)
            while True:
                batch = plan.send(await self._execute(conn, batch))
        except StopIteration as done:
            result: T = done.value
            return result

    async def _run(self, make: Callable[[], Plan[T]]) -> T:
        try:
            return await self._drive(self._redis, make())
        except PionWrongWorker as moved:
            if not self.follow_redirects:
                raise
            self.redirects_followed += 1
            if moved.worker not in self._workers:
                self._workers[moved.worker] = redis.asyncio.Redis(
                    host=self.host, port=self.port + 2 + moved.worker, **self._options
                )
            return await self._drive(self._workers[moved.worker], make())

    async def aclose(self) -> None:
        for conn in (self._redis, *self._workers.values()):
            await conn.aclose()
        self._workers.clear()

    async def __aenter__(self) -> AsyncPionPromptCache:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _count_rehydrate(self) -> None:
        self.cold_rehydrates_observed += 1

    async def register(
        self,
        ns: str,
        kv_dim: int,
        vquant: str | None = None,
        *,
        blocks: Sequence[int] | npt.NDArray[Any] | None = None,
        block_size: int = 64,
        prefill_ms: float | None = None,
    ) -> None:
        vq = self.vquant if vquant is None else vquant
        await self._run(
            lambda: plans.register(
                ns, kv_dim, vq, blocks=blocks, block_size=block_size, prefill_ms=prefill_ms
            )
        )

    async def lookup(
        self,
        ns: str,
        *,
        tokens: int | None = None,
        prefill_ms: float | None = None,
        stage2: bool = False,
    ) -> bool:
        return await self._run(lambda: plans.lookup(ns, tokens, prefill_ms, stage2))

    async def drop(self, *namespaces: str) -> int:
        return await self._run(lambda: plans.drop(namespaces))

    async def owner(self, ns: str) -> int:
        return await self._run(lambda: plans.owner(ns))

    async def blocks(self, ns: str) -> tuple[int, npt.NDArray[np.uint64]] | None:
        return await self._run(lambda: plans.blocks(ns))

    async def membership(
        self, ns: str, hashes: Sequence[int] | npt.NDArray[Any]
    ) -> npt.NDArray[np.bool_] | None:
        return await self._run(lambda: plans.membership(ns, hashes))

    async def info(self) -> dict[str, int | float | str]:
        return await self._run(plans.info)

    async def save(self, path: str | None = None) -> None:
        await self._run(lambda: plans.save(path))

    async def commit(self) -> None:
        await self._run(plans.commit)

    async def stats(self) -> dict[str, int | float]:
        return await self._run(lambda: plans.stats(False))

    async def reset_stats(self) -> None:
        await self._run(lambda: plans.stats(True))

    async def store(
        self, ns: str, keys: Sequence[npt.ArrayLike], values: Sequence[npt.ArrayLike]
    ) -> int:
        return await self._run(lambda: plans.store(ns, keys, values))

    async def fetch(
        self, ns: str, n_tokens: int | None = None, layers: Iterable[int] | None = None
    ) -> tuple[Arrays, Arrays]:
        picked = None if layers is None else list(layers)
        return await self._run(lambda: plans.fetch(ns, n_tokens, picked))

    async def warm(
        self, ns: str, n_heads: int, head_dim: int, attend_sid: str | None = None
    ) -> Warmed:
        return await self._run(lambda: plans.warm(ns, n_heads, head_dim, attend_sid))

    async def attend_store(
        self, ns: str, layer: int, keys: npt.ArrayLike, values: npt.ArrayLike
    ) -> None:
        await self._run(lambda: plans.attend_store(ns, layer, keys, values))

    async def attend_query(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> npt.NDArray[np.float32]:
        out, _ = await self.attend_query_lse(ns, layer, q, top_k=top_k, fa_window=fa_window)
        return out

    async def attend_query_lse(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]:
        return await self._run(
            lambda: plans.attend_query(
                ns, layer, q, top_k=top_k, fa_window=fa_window, on_rehydrate=self._count_rehydrate
            )
        )
