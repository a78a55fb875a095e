"""``PionPromptCache``: the synchronous client of a Pion server (numpy in, numpy out).

This module only does I/O, over redis-py: it makes and closes the connections, sends
each batch of a plan as one pipelined round trip, and maps redis-py's exceptions to
:mod:`pion.client.errors`. The constructor, the methods (signatures and docstrings),
the plan driver and the redirect rule are :class:`pion.client.base.BasePromptCache`'s,
shared with :class:`pion.client.aio.AsyncPionPromptCache`; argument building, reply
parsing and the ``-COLDMISS`` retry are the plans' (:mod:`pion.client.plans`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Concatenate, ParamSpec, Self, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.client.base import (
    DEFAULT_PORT,
    BasePromptCache,
    PlanFactory,
    connection_options,
    map_results,
    operation,
)
from pion.client.errors import error_from_redis
from pion.client.wire import Command

# DEFAULT_PORT, connection_options and map_results moved to pion.client.base; they stay
# importable from here, where they were first published.
__all__ = ["DEFAULT_PORT", "PionPromptCache", "connection_options", "map_results"]

P = ParamSpec("P")
T = TypeVar("T")


class PionPromptCache(BasePromptCache[redis.Redis]):
    """A Pion server's prompt-prefix K/V cache, over blocking redis-py connections:
    each method sends its command(s) and returns the result.

    Constructor, methods and counters: :class:`~pion.client.base.BasePromptCache`
    (``PionPromptCache(host, port, password, vquant, *, username, timeout,
    follow_redirects, redis_options)``). Close with :meth:`close` or ``with``.
    """

    @staticmethod
    def _no_retry() -> Retry:
        return Retry(NoBackoff(), 0)

    def _connect(self, port: int) -> redis.Redis:
        return redis.Redis(host=self.host, port=port, **self._options)

    @staticmethod
    def _shell_method(op: operation[P, T]) -> Callable[Concatenate[PionPromptCache, P], T]:
        def method(self: PionPromptCache, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return self._run(op.build(self, *args, **kwargs))

        return method

    def _run(self, make: PlanFactory[T]) -> T:
        """Send the driver's batches, each one round trip, until the plan returns."""
        route = self._route(make)
        try:
            port, batch = next(route)
            while True:
                port, batch = route.send(self._execute(self._connection(port), batch))
        except StopIteration as done:
            result: T = done.value
            return result

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

    def close(self) -> None:
        """Close every connection (the object must not be used afterwards)."""
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
