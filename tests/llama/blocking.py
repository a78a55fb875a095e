"""The asynchronous warmer driven from synchronous tests: one event loop on a thread.

:class:`BlockingWarmer` wraps a :class:`~pion.llama.warmer.PrefixWarmer` built and run on
an anyio blocking portal's loop: its coroutine methods become blocking calls, everything
else (``ctx``, ``index``, ``learner``, ``config``, ``log``) is the warmer's own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from anyio.from_thread import start_blocking_portal

from pion.llama.config import WarmerConfig
from pion.llama.warmer import PrefixWarmer


class BlockingWarmer:
    """A PrefixWarmer whose async methods block; close it (or use ``with``)."""

    def __init__(
        self,
        config: WarmerConfig,
        factory: Callable[[WarmerConfig], PrefixWarmer] = PrefixWarmer,
    ) -> None:
        self._stack = ExitStack()
        self.portal = self._stack.enter_context(start_blocking_portal())
        self.warmer: PrefixWarmer = self.portal.call(_build, factory, config)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.warmer, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self.portal.call(lambda: attr(*args, **kwargs))

            return call
        return attr

    def close(self) -> None:
        try:
            self.portal.call(self.warmer.aclose)
        finally:
            self._stack.close()

    def __enter__(self) -> BlockingWarmer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _build(
    factory: Callable[[WarmerConfig], PrefixWarmer], config: WarmerConfig
) -> PrefixWarmer:
    return factory(config)
