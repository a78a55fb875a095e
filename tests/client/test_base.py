"""BasePromptCache: both clients are one set of methods over two I/O shells.

Parity is checked by introspection (same names, signatures and docstrings; the async
methods are coroutine functions; nothing public is defined in a shell but closing).
The shared driver and redirect rule are checked the same way through both shells,
with scripted replies in place of the socket (``_execute`` is the shells' only I/O);
the redirect over real TCP is in ``test_cache_units.py``."""

from __future__ import annotations

import asyncio
import inspect
import pydoc
from types import MethodType
from typing import Any

import numpy as np
import pytest
import redis.asyncio
import redis.retry

from pion.client import AsyncPionPromptCache, PionPromptCache, PionWrongWorker, plans, wire
from pion.client.base import BasePromptCache, PlanFactory, operation
from pion.client.errors import response_error

CLOSERS: dict[type[BasePromptCache[Any]], str] = {
    PionPromptCache: "close",
    AsyncPionPromptCache: "aclose",
}
MOVED = response_error("ERR", "session lives on worker 2 (this is worker 0)")


def _operations() -> list[str]:
    return sorted(n for n, v in vars(BasePromptCache).items() if isinstance(v, operation))


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


# -- the same methods, written once --------------------------------------------------


def test_both_shells_expose_the_same_public_methods() -> None:
    sync, aio = _public(PionPromptCache), _public(AsyncPionPromptCache)
    assert sync - {"close"} == aio - {"aclose"}
    assert set(_operations()) == sync - {"close", "make_namespace"}
    assert len(_operations()) == 20


@pytest.mark.parametrize("name", _operations())
def test_signatures_and_docstrings_are_shared(name: str) -> None:
    sync, aio = getattr(PionPromptCache, name), getattr(AsyncPionPromptCache, name)
    assert inspect.signature(sync) == inspect.signature(aio)
    pc, apc = PionPromptCache(), AsyncPionPromptCache()
    bound = inspect.signature(getattr(pc, name))
    assert bound == inspect.signature(getattr(apc, name))
    assert list(bound.parameters) == list(inspect.signature(sync).parameters)[1:]
    # The source says -> PlanFactory[T]; a caller gets (or awaits) a T.
    assert "PlanFactory" not in str(bound.return_annotation)
    assert sync.__doc__ and sync.__doc__ == aio.__doc__ == getattr(BasePromptCache, name).__doc__


@pytest.mark.parametrize("name", _operations())
def test_async_methods_are_coroutine_functions(name: str) -> None:
    apc = AsyncPionPromptCache()
    assert inspect.iscoroutinefunction(getattr(AsyncPionPromptCache, name))
    assert asyncio.iscoroutinefunction(getattr(apc, name))
    assert not inspect.iscoroutinefunction(getattr(PionPromptCache(), name))


@pytest.mark.parametrize("shell", [PionPromptCache, AsyncPionPromptCache])
def test_shells_define_only_io(shell: type[BasePromptCache[Any]]) -> None:
    """Every public method a shell has comes from the base, except closing."""
    own = {n for n in vars(shell) if not n.startswith("_")}
    assert own == {CLOSERS[shell]}
    assert getattr(shell, CLOSERS[shell]).__doc__
    assert inspect.signature(shell) == inspect.signature(BasePromptCache.__init__).replace(
        parameters=list(inspect.signature(BasePromptCache.__init__).parameters.values())[1:]
    )


def test_methods_behave_like_def_methods() -> None:
    pc = PionPromptCache()
    assert AsyncPionPromptCache.fetch is AsyncPionPromptCache.fetch
    bound = pc.fetch
    assert isinstance(bound, MethodType)
    assert bound.__func__ is PionPromptCache.fetch and bound.__self__ is pc
    assert PionPromptCache.fetch.__qualname__ == "PionPromptCache.fetch"
    assert inspect.signature(pc.fetch).return_annotation == "tuple[Arrays, Arrays]"
    base: Any = BasePromptCache  # (untyped: the base itself runs nothing)
    assert isinstance(base.fetch, operation)
    assert PionPromptCache.make_namespace is AsyncPionPromptCache.make_namespace


def test_help_shows_each_async_method_and_its_docstring() -> None:
    text = pydoc.plain(pydoc.render_doc(AsyncPionPromptCache))
    for name in _operations():
        assert f"async {name}(self" in text
    assert "KV.PREFIX.DROP: the number of namespaces" in text
    assert "KV.PREFIX.DROP" in pydoc.plain(pydoc.render_doc(BasePromptCache))


def test_an_operation_must_return_a_plan_factory() -> None:
    def wrong(self: Any) -> int:
        return 0

    with pytest.raises(TypeError, match="PlanFactory"):
        operation(wrong)  # type: ignore[arg-type]

    def right(self: Any, n: int) -> PlanFactory[int]:
        return lambda: plans.owner(str(n))

    assert str(operation(right).__signature__) == "(self: 'Any', n: 'int') -> 'int'"


# -- one constructor ------------------------------------------------------------------


@pytest.mark.parametrize("shell", [PionPromptCache, AsyncPionPromptCache])
def test_constructor_is_shared(shell: type[BasePromptCache[Any]]) -> None:
    cache = shell("10.0.0.1", 7000, "pw", "int8", username="u", timeout=3, follow_redirects=False)
    assert (cache.host, cache.port, cache.vquant, cache.follow_redirects) == (
        "10.0.0.1",
        7000,
        "int8",
        False,
    )
    assert (cache.cold_rehydrates_observed, cache.redirects_followed) == (0, 0)
    kwargs = cache._connection(7000).connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["password"], kwargs["username"], kwargs["socket_timeout"]) == (
        7000,
        "pw",
        "u",
        3,
    )
    # Each shell's Retry class (redis.asyncio has its own), and never a retry.
    retry = kwargs["retry"]
    expected = redis.asyncio.retry.Retry if shell is AsyncPionPromptCache else redis.retry.Retry
    assert type(retry) is expected and retry.get_retries() == 0
    # redis_options reach redis-py (a retry there wins; redis-py keeps a copy), and a
    # bad one fails in the constructor.
    mine = expected(redis.backoff.NoBackoff(), 1)
    custom = shell(redis_options={"retry": mine, "health_check_interval": 9})
    custom_kwargs = custom._connection(custom.port).connection_pool.connection_kwargs
    assert custom_kwargs["retry"].get_retries() == 1
    assert custom_kwargs["health_check_interval"] == 9
    with pytest.raises(TypeError):
        shell(redis_options={"no_such_option": 1})


# -- one driver and redirect rule, through both shells ---------------------------------


class ScriptedSync(PionPromptCache):
    """The blocking shell with its one I/O step, ``_execute``, answered by a script."""

    def __init__(self, script: list[object], **options: Any) -> None:
        super().__init__(port=7000, **options)
        self.script = iter(script)
        self.sent: list[tuple[int, list[wire.Command]]] = []

    def _execute(self, conn: Any, batch: list[wire.Command]) -> list[object]:
        self.sent.append((conn.connection_pool.connection_kwargs["port"], batch))
        return [next(self.script) for _ in batch]


class ScriptedAsync(AsyncPionPromptCache):
    """The asyncio shell, scripted the same way."""

    def __init__(self, script: list[object], **options: Any) -> None:
        super().__init__(port=7000, **options)
        self.script = iter(script)
        self.sent: list[tuple[int, list[wire.Command]]] = []

    async def _execute(self, conn: Any, batch: list[wire.Command]) -> list[object]:
        self.sent.append((conn.connection_pool.connection_kwargs["port"], batch))
        return [next(self.script) for _ in batch]


Scripted = ScriptedSync | ScriptedAsync


def _call(cache: Scripted, name: str, *args: Any, **kwargs: Any) -> Any:
    """``cache.name(...)``, awaited when the shell is asyncio."""
    result = getattr(cache, name)(*args, **kwargs)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


@pytest.fixture(params=[ScriptedSync, ScriptedAsync], ids=["sync", "async"])
def scripted(request: pytest.FixtureRequest) -> type[Scripted]:
    shell: type[Scripted] = request.param
    return shell


def test_redirect_reruns_the_plan_on_the_affinity_port(scripted: type[Scripted]) -> None:
    cache = scripted([MOVED, b"2"])
    assert _call(cache, "owner", "ns") == 2
    owner = [("KV.PREFIX.OWNER", "ns")]
    assert cache.sent == [(7000, owner), (7000 + 2 + 2, owner)]
    assert cache.redirects_followed == 1
    assert sorted(cache._connections) == [7000, 7004]


def test_redirect_not_followed_when_disabled(scripted: type[Scripted]) -> None:
    cache = scripted([MOVED], follow_redirects=False)
    with pytest.raises(PionWrongWorker) as err:
        _call(cache, "owner", "ns")
    assert err.value.worker == 2 and cache.redirects_followed == 0
    assert [port for port, _ in cache.sent] == [7000]


def test_second_redirect_is_raised(scripted: type[Scripted]) -> None:
    cache = scripted([MOVED, MOVED])
    with pytest.raises(PionWrongWorker):
        _call(cache, "info")
    assert cache.redirects_followed == 1
    assert [port for port, _ in cache.sent] == [7000, 7004]


def test_rerun_sees_the_same_arguments(scripted: type[Scripted]) -> None:
    """Arguments are read once per call: a one-shot ``layers`` iterator reaches the
    rerun on the owner's port intact."""
    cache = scripted([MOVED] * 8)
    with pytest.raises(PionWrongWorker):
        _call(cache, "fetch", "ns", 3, layers=iter([1]))
    (first_port, first), (second_port, second) = cache.sent
    assert (first_port, second_port) == (7000, 7004) and first == second
    assert ("V.FETCH", "ns_pk", 1, "RANGE", 0, 3, "FMT", "NATIVE") in first


def test_multi_batch_plan_stays_on_one_port(scripted: type[Scripted]) -> None:
    """After a redirect every batch of the rerun goes to the owner (here a COLDMISS
    retry: query, WARM, query)."""
    cold = response_error("COLDMISS", "session evicted to cold tier")
    out = np.arange(8, dtype="<f4")
    cache = scripted([MOVED, cold, b"1", out.tobytes()])
    got = _call(cache, "attend_query", "ns", 0, np.ones((1, 8)))
    np.testing.assert_array_equal(got, out.reshape(1, 8))
    assert [port for port, _ in cache.sent] == [7000, 7004, 7004, 7004]
    assert (cache.redirects_followed, cache.cold_rehydrates_observed) == (1, 1)


def test_results_are_the_same_through_both_shells() -> None:
    script: list[object] = [b"OK", b"HIT", b"OK", 1, [b"kvprefix_hits", 1]]
    answers = []
    for shell in (ScriptedSync, ScriptedAsync):
        cache = shell(list(script))
        answers.append(
            (
                _call(cache, "register", "ns", 8),
                _call(cache, "lookup", "ns"),
                _call(cache, "reset_stats"),
                _call(cache, "drop", "ns"),
                _call(cache, "stats"),
                cache.sent,
            )
        )
    assert answers[0] == answers[1]
    assert answers[0][:5] == (None, True, None, 1, {"kvprefix_hits": 1})
    assert answers[0][5][0] == (7000, [("KV.PREFIX.REGISTER", "ns", 8, "fp16")])


def test_closing_forgets_every_connection() -> None:
    pc = ScriptedSync([MOVED, b"0"])
    with pc:
        pc.owner("ns")
        assert len(pc._connections) == 2
    assert pc._connections == {}

    async def scenario() -> None:
        async with ScriptedAsync([MOVED, b"0"]) as apc:
            await apc.owner("ns")
            assert len(apc._connections) == 2
        assert apc._connections == {}

    asyncio.run(scenario())
