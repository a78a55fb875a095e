"""``AsyncPionPromptCache``: the asyncio client of a Pion server, on ``redis.asyncio``.

This module only does I/O: it makes and closes the connections, awaits each batch of a
plan as one pipelined round trip, and maps redis-py's exceptions to
:mod:`pion.client.errors`. The constructor, the methods (signatures and docstrings),
the plan driver and the redirect rule are :class:`pion.client.base.BasePromptCache`'s,
shared with :class:`pion.client.PionPromptCache`; argument building, reply parsing and
the ``-COLDMISS`` retry are the plans' (:mod:`pion.client.plans`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pion.client.base import BasePromptCache, PlanFactory, map_results, operation
from pion.client.errors import error_from_redis
from pion.client.wire import Command

__all__ = ["AsyncPionPromptCache"]

P = ParamSpec("P")
T = TypeVar("T")


class AsyncPionPromptCache(BasePromptCache[redis.asyncio.Redis]):
    """A Pion server's prompt-prefix K/V cache, over ``redis.asyncio``: the constructor
    and methods of :class:`~pion.client.base.BasePromptCache` (the same as
    ``PionPromptCache``'s), each method a coroutine function to be awaited
    (``await apc.fetch(ns)``); the docstring of each says what the await returns.
    Close with :meth:`aclose` or ``async with``.
    """

    @staticmethod
    def _no_retry() -> Retry:
        return Retry(NoBackoff(), 0)

    def _connect(self, port: int) -> redis.asyncio.Redis:
        return redis.asyncio.Redis(host=self.host, port=port, **self._options)

    @staticmethod
    def _shell_method(
        op: operation[P, T],
    ) -> Callable[Concatenate[AsyncPionPromptCache, P], Coroutine[Any, Any, T]]:
        async def method(self: AsyncPionPromptCache, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await self._run(op.build(self, *args, **kwargs))

        return method

    async def _run(self, make: PlanFactory[T]) -> T:
        """Send the driver's batches, each one awaited round trip, until the plan
        returns."""
        route = self._route(make)
        try:
            port, batch = next(route)
            while True:
                port, batch = route.send(await self._execute(self._connection(port), batch))
        except StopIteration as done:
            result: T = done.value
            return result

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
            # NOAUTH, LOADING, a lost connection: they concern the whole batch.
            raise error_from_redis(exc) from exc
        return map_results(results)

    async def aclose(self) -> None:
        """Close every connection (the object must not be used afterwards)."""
        for conn in self._connections.values():
            await conn.aclose()
        self._connections.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
