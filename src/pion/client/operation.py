"""``operation``: the descriptor that writes a client method once for the sync and
asyncio shells. Why it exists and how it types: :mod:`pion.client.base`, "How a method
is written once".

It knows the shells only as :class:`Shell` (what it calls on one), so ``base.py``
imports it and it imports nothing of ``base.py``."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Coroutine
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import redis
import redis.asyncio

from pion.client.plans import PlanFactory

__all__ = ["Shell", "operation"]

P = ParamSpec("P")
T = TypeVar("T")
C_co = TypeVar("C_co", covariant=True)


class Shell(Protocol[C_co]):
    """A client class as ``operation`` sees it (``BasePromptCache`` and its shells):
    its connection class ``C_co`` (``redis.Redis`` or ``redis.asyncio.Redis``) tells
    a blocking method from a coroutine one."""

    def _connection(self, port: int) -> C_co: ...

    @staticmethod
    def _shell_method(op: operation[Any, Any]) -> Callable[..., Any] | None: ...


_RESULT = "PlanFactory["


def _caller_signature(build: Callable[..., Any]) -> inspect.Signature:
    """``build``'s signature as a caller sees it: ``-> PlanFactory[X]`` shown as
    ``-> X``. Annotations are strings here (this module postpones their evaluation)."""
    signature = inspect.signature(build)
    written = signature.return_annotation
    if not (isinstance(written, str) and written.startswith(_RESULT) and written.endswith("]")):
        raise TypeError(f"{build.__qualname__} must be annotated -> PlanFactory[...]")
    return signature.replace(return_annotation=written[len(_RESULT) : -1])


class operation(Generic[P, T]):  # lower case, as property and classmethod are
    """A client method written once (see the module docstring). ``build`` checks the
    call's arguments and returns a plan factory; the shell class the method is read
    from makes the callable (a blocking method, or a coroutine function)."""

    def __init__(self, build: Callable[Concatenate[Any, P], PlanFactory[T]]) -> None:
        self.build = build
        self.__name__ = build.__name__
        self.__qualname__ = build.__qualname__
        self.__doc__ = build.__doc__
        self.__signature__ = _caller_signature(build)
        # One function per shell class, as a def'd method is one function; weak, so a
        # subclass made in a test does not live forever.
        self._functions: weakref.WeakKeyDictionary[type[Any], Callable[..., Any]] = (
            weakref.WeakKeyDictionary()
        )

    @overload
    def __get__(
        self, cache: None, owner: type[Shell[redis.Redis]]
    ) -> Callable[Concatenate[Shell[redis.Redis], P], T]: ...
    @overload
    def __get__(
        self, cache: None, owner: type[Shell[redis.asyncio.Redis]]
    ) -> Callable[Concatenate[Shell[redis.asyncio.Redis], P], Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(
        self, cache: Shell[redis.Redis], owner: type[Any] | None = None
    ) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, cache: Shell[redis.asyncio.Redis], owner: type[Any] | None = None
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, cache: Shell[Any] | None, owner: type[Any] | None = None) -> Any:
        shell = owner if cache is None else type(cache)
        if shell is None:
            raise TypeError("__get__(None, None) is invalid")
        function = self._functions.get(shell)
        if function is None:
            made = shell._shell_method(self)
            if made is None:  # read from BasePromptCache itself, which runs nothing
                return self
            function = self._functions[shell] = self._dress(made, shell)
        return function if cache is None else MethodType(function, cache)

    def _dress(self, function: Callable[..., Any], shell: type[Any]) -> Callable[..., Any]:
        """``function`` named, documented and signed as this method of ``shell``."""
        function.__name__ = self.__name__
        function.__qualname__ = f"{shell.__qualname__}.{self.__name__}"
        function.__module__ = shell.__module__
        function.__doc__ = self.__doc__
        # Read by inspect.signature (and help()); typeshed does not declare it.
        function.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return function
