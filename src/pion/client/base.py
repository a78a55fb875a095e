"""``BasePromptCache``: what the sync and asyncio clients share, written once (the
pattern of httpx's ``BaseClient``); :mod:`.cache` and :mod:`.aio` add only the I/O.

Here, once: the constructor and its redis-py options, the counters, the plan driver
and the redirect rule (``-ERR session lives on worker N``: rerun a fresh plan on the
worker's affinity port ``port + 2 + N``, once), the per-port connection bookkeeping,
``make_namespace``, and every public method with its signature and docstring.
A shell adds: how a connection is made and closed, how one batch is sent (blocking or
awaited), the context-manager methods, and the form its methods take (``def`` or
``async def``, three lines in ``_shell_method``). Argument building and reply parsing
stay in the sans-IO plans of :mod:`pion.client.plans`.

How a method is written once
----------------------------
A public method here is decorated with :class:`operation` and returns a
``PlanFactory[T]``: a callable that makes a fresh plan, so that a redirect can rerun the
operation from its first batch. Arguments are checked and normalised when the method is
called (``fetch`` turns ``layers`` into a list once, so a rerun sees the same layers).

``operation`` is a descriptor. Read from a ``PionPromptCache`` it gives a method
returning ``T``; read from an ``AsyncPionPromptCache``, a coroutine function whose
awaited result is ``T``. Python's types have no higher kinds, so a ``Generic[R]`` base
whose methods return ``R[T]`` cannot be written. Instead ``operation.__get__`` is
overloaded on the shell's connection type (``BasePromptCache[redis.Redis]`` or
``BasePromptCache[redis.asyncio.Redis]``). mypy --strict therefore sees ``pc.fetch`` as
``(ns, n_tokens=..., layers=...) -> tuple[Arrays, Arrays]``, sees ``apc.fetch`` as the
same parameters returning a ``Coroutine`` of that tuple, and reports a missing
``await``. At run time each shell's methods are ordinary functions, one per class, with
the base's ``__doc__``, a ``__signature__`` showing ``T`` where the source says
``PlanFactory[T]`` and, on the async shell, the coroutine flag. ``inspect``, ``help()``
and ``asyncio.iscoroutinefunction`` see what a hand-written class would show. The
alternative, thin typed overrides in each shell, would repeat every signature and
docstring in both shells: the duplication this module exists to remove.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import redis
import redis.asyncio

from pion.client import attend, plans
from pion.client.errors import PionWrongWorker, error_from_redis
from pion.client.export import ExportLane, is_loopback_host
from pion.client.operation import operation
from pion.client.options import connection_options, tls_options
from pion.client.plans import Arrays, Plan, PlanFactory, Warmed
from pion.client.wire import Command, make_namespace
from pion.wire import affinity_port

__all__ = [
    "DEFAULT_PORT",
    "BasePromptCache",
    "PlanFactory",
    "Route",
    "connection_options",
    "map_results",
    "operation",
    "tls_options",
]

P = ParamSpec("P")
T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")  # a shell's connection class: redis.Redis or redis.asyncio.Redis

DEFAULT_PORT = 1974  # Pion's default port

# The driver's batches, each addressed to a port; it is sent each batch's replies.
Route: TypeAlias = Generator[tuple[int, list[Command]], list[object], T]


def map_results(results: Sequence[object]) -> list[object]:
    """Pipeline results with redis-py's error objects replaced by ours."""
    return [error_from_redis(r) if isinstance(r, redis.RedisError) else r for r in results]


def _addressed(port: int, plan: Plan[T]) -> Route[T]:
    """``plan``, each of its batches addressed to ``port``."""
    replies: list[object] | None = None
    while True:
        try:
            batch = next(plan) if replies is None else plan.send(replies)
        except StopIteration as done:
            result: T = done.value
            return result
        replies = yield port, batch


def _output_only(plan: Plan[tuple[A, B]]) -> Plan[A]:
    """The first of an ``(output, lse)`` plan's results."""
    out, _ = yield from plan
    return out


def _discarded(plan: Plan[object]) -> Plan[None]:
    """``plan`` run for its effect, its result dropped."""
    yield from plan


class BasePromptCache(ABC, Generic[C]):
    """A Pion server's prompt-prefix K/V cache: the methods of both clients.

    Use :class:`~pion.client.PionPromptCache` (each method returns its result) or
    :class:`~pion.client.AsyncPionPromptCache` (each method is awaited).

    Shapes: a K/V *layer* is ``[H, N, D]`` (heads first) or ``[N, H*D]`` (Pion's rows,
    token-major, head-major within a row), any float dtype: fp16 travels as fp16 into
    fp16 layers, everything else (fp32, bf16, ...) as fp32. ``fetch`` returns fp32
    ``[N, H*D]``.

    Counters: ``cold_rehydrates_observed`` (``-COLDMISS`` replies answered with a
    WARM), ``redirects_followed``, ``export_lane.used`` / ``.fallbacks`` (fetches
    served from an export file, or that fell back to the socket).
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
        ssl: bool | Mapping[str, Any] = False,
        export: bool | None = None,
    ) -> None:
        """``host``/``port``: the server (Pion's default port 1974). ``password`` (and
        ``username``): AUTH on every new connection. ``vquant``: the storage format
        ``register`` uses when none is given (``fp16 int8 fp8 mlx4g32 turbo4 turbo3
        turbo2``). ``timeout``: seconds to connect and per reply. ``follow_redirects``:
        on ``session lives on worker N``, retry once on the worker's affinity port
        ``port + 2 + N``. ``redis_options``: passed to redis-py's ``Redis``.
        ``ssl``: connect over TLS (every port, affinity ports too): True verifies the
        server against the system's CAs; a mapping gives redis-py's ``ssl_*`` options
        without the prefix, e.g. ``{"ca_certs": "ca.pem", "certfile": "client.pem",
        "keyfile": "client.key"}``. ``export``: let ``fetch`` map the prefix from a file
        the server writes (``V.EXPORT``) instead of reading it through the socket; None
        (the default) does so when ``host`` is a loopback address or ``localhost``, and
        the lane turns itself off where the server refuses it (see
        :mod:`pion.client.export`)."""
        self.host = host
        self.port = port
        self.vquant = vquant
        self.follow_redirects = follow_redirects
        self.cold_rehydrates_observed = 0
        self.redirects_followed = 0
        # The export lane's state and counters (used, fallbacks, reason it is off).
        self.export_lane = ExportLane(is_loopback_host(host) if export is None else export)
        self._options = connection_options(
            password,
            username,
            timeout,
            {**tls_options(ssl), **(redis_options or {})},
            retry=self._no_retry(),
        )
        # One connection (pool) per port: the given one, then each affinity port a
        # redirect led to. The first is made now so that a bad option fails here;
        # redis-py connects on first use.
        self._connections: dict[int, C] = {}
        self._connection(port)

    make_namespace = staticmethod(make_namespace)

    # -- what a shell supplies ----------------------------------------------------------

    @staticmethod
    @abstractmethod
    def _no_retry() -> object:
        """redis-py's no-retry policy, in the shell's library's ``Retry`` class."""

    @abstractmethod
    def _connect(self, port: int) -> C:
        """A new connection (pool) to ``port`` on ``self.host``; it connects lazily."""

    @staticmethod
    def _shell_method(op: operation[P, T]) -> Callable[Concatenate[Any, P], Any] | None:
        """The function a shell's instances call for ``op``: it runs
        ``op.build(self, ...)``'s plan factory. None here: the base runs nothing."""
        return None

    # -- the plan driver, sans I/O ------------------------------------------------------

    def _connection(self, port: int) -> C:
        """The connection to ``port``, made on first use."""
        conn = self._connections.get(port)
        if conn is None:
            conn = self._connections[port] = self._connect(port)
        return conn

    def _route(self, make: PlanFactory[T]) -> Route[T]:
        """The batches of ``make()``'s plan, each addressed to the port it must go to;
        a shell sends each one (``_connection(port)``) and sends back the replies.

        On a worker redirect, a fresh plan runs whole on the owner's affinity port;
        a second redirect (or the first, with ``follow_redirects=False``) is raised."""
        try:
            return (yield from _addressed(self.port, make()))
        except PionWrongWorker as moved:
            if not self.follow_redirects:
                raise
            self.redirects_followed += 1
            return (yield from _addressed(affinity_port(self.port, moved.worker), make()))

    def _count_rehydrate(self) -> None:
        self.cold_rehydrates_observed += 1

    # -- registry -----------------------------------------------------------------------

    @operation
    def register(
        self,
        ns: str,
        kv_dim: int,
        vquant: str | None = None,
        *,
        blocks: Sequence[int] | npt.NDArray[Any] | None = None,
        block_size: int = 64,
        prefill_ms: float | None = None,
    ) -> PlanFactory[None]:
        """KV.PREFIX.REGISTER: create ``<ns>_pk``/``<ns>_pv`` (rows of ``kv_dim``
        values in ``vquant``, default the client's); returns None. ``blocks``: u64
        block hashes in token order (see :mod:`pion.client.hashing`) for MEMBERSHIP
        probes. ``prefill_ms``: the measured prefill time the receipt credits each hit
        with. Idempotent: an existing namespace keeps its layout."""
        vq = self.vquant if vquant is None else vquant
        return lambda: plans.register(
            ns, kv_dim, vq, blocks=blocks, block_size=block_size, prefill_ms=prefill_ms
        )

    @operation
    def lookup(
        self,
        ns: str,
        *,
        tokens: int | None = None,
        prefill_ms: float | None = None,
        stage2: bool = False,
    ) -> PlanFactory[bool]:
        """KV.PREFIX.LOOKUP: True on a hit (recorded in the server's receipt, credited
        with ``tokens``/``prefill_ms`` when given). ``stage2``: also require the
        attention tier to hold layer 0 (ATTEND.PREFIX.LOOKUP)."""
        return lambda: plans.lookup(ns, tokens, prefill_ms, stage2)

    @operation
    def drop(self, *namespaces: str) -> PlanFactory[int]:
        """KV.PREFIX.DROP: the number of namespaces of which a half was held."""
        return lambda: plans.drop(namespaces)

    @operation
    def owner(self, ns: str) -> PlanFactory[int]:
        """KV.PREFIX.OWNER: the worker holding ``ns``, -1 when none."""
        return lambda: plans.owner(ns)

    @operation
    def blocks(self, ns: str) -> PlanFactory[tuple[int, npt.NDArray[np.uint64]] | None]:
        """KV.PREFIX.BLOCKS: ``(block_size, hashes)``, None when there is no table."""
        return lambda: plans.blocks(ns)

    @operation
    def membership(
        self, ns: str, hashes: Sequence[int] | npt.NDArray[Any]
    ) -> PlanFactory[npt.NDArray[np.bool_] | None]:
        """KV.PREFIX.MEMBERSHIP: per probe, whether ``ns``'s table holds it; None when
        there is no table."""
        return lambda: plans.membership(ns, hashes)

    @operation
    def info(self) -> PlanFactory[dict[str, int | float | str]]:
        """KV.PREFIX.INFO as a dict (numbers converted)."""
        return plans.info

    @operation
    def save(self, path: str | None = None) -> PlanFactory[None]:
        """KV.PREFIX.SAVE: snapshot (``path`` relative to the server's data dir);
        returns None once written."""
        return lambda: plans.save(path)

    @operation
    def commit(self) -> PlanFactory[None]:
        """KV.PREFIX.COMMIT: returns (None) once every acknowledged write is on disk."""
        return plans.commit

    @operation
    def stats(self) -> PlanFactory[dict[str, int | float]]:
        """PION.STATS of the connected worker as a dict (hits, misses, prefill time
        saved...)."""
        return lambda: plans.stats(False)

    @operation
    def reset_stats(self) -> PlanFactory[None]:
        """PION.STATS RESET: zero the connected worker's receipt; returns None."""
        return lambda: _discarded(plans.stats(True))

    # -- K/V ----------------------------------------------------------------------------

    @operation
    def store(
        self, ns: str, keys: Sequence[npt.ArrayLike], values: Sequence[npt.ArrayLike]
    ) -> PlanFactory[int]:
        """Store every layer's K and V (one array per layer, ``[H, N, D]`` or
        ``[N, H*D]``) as rows ``0 .. N-1`` in one pipelined round trip; returns N."""
        return lambda: plans.store(ns, keys, values)

    @operation
    def fetch(
        self, ns: str, n_tokens: int | None = None, layers: Iterable[int] | None = None
    ) -> PlanFactory[tuple[Arrays, Arrays]]:
        """``(keys, values)``: per layer (all, or ``layers``), rows ``0 .. n-1`` as fp32
        ``[n, H*D]``; ``n`` = every stored row when ``n_tokens`` is None. Rows never
        written read as zeros. Arrays may be read-only views of the reply. From a
        server on this machine all layers come through an export file where that gives
        the same values (fp16 layers), see ``export``."""
        picked = None if layers is None else list(layers)
        return lambda: plans.fetch(ns, n_tokens, picked, self.export_lane)

    # -- attention tier (Stage 2) -------------------------------------------------------

    @operation
    def warm(
        self, ns: str, n_heads: int, head_dim: int, attend_sid: str | None = None
    ) -> PlanFactory[Warmed]:
        """KV.PREFIX.WARM: rehydrate the attention tier from the V-store; returns
        ``Warmed(layers, skipped_dim)``."""
        return lambda: plans.warm(ns, n_heads, head_dim, attend_sid)

    @operation
    def attend_store(
        self, ns: str, layer: int, keys: npt.ArrayLike, values: npt.ArrayLike
    ) -> PlanFactory[None]:
        """ATTEND.PREFIX.STORE one layer's K/V ``[H, N, D]`` (fp32 on the wire); returns
        None."""
        return lambda: plans.attend_store(ns, layer, keys, values)

    @operation
    def attend_query(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> PlanFactory[npt.NDArray[np.float32]]:
        """ATTEND.PREFIX.QUERY: attention of ``q`` (``[H, D]`` or ``[H, M, D]``) over
        the cached prefix, shaped like ``q``. After ``-COLDMISS`` it WARMs and retries
        once; a second miss raises :class:`~pion.client.errors.PionColdMiss`."""
        with_lse = self._attend(ns, layer, q, top_k, fa_window)
        return lambda: _output_only(with_lse())

    @operation
    def attend_query_lse(
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        *,
        top_k: int = 1024,
        fa_window: int | None = None,
    ) -> PlanFactory[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]]:
        """``attend_query`` plus the LSE ``[H, M]`` the server sends for M > 1 (None
        for M = 1): ``(output, lse)``, for merging with locally computed suffix
        attention."""
        return self._attend(ns, layer, q, top_k, fa_window)

    @operation
    def attend_query_fused(  # noqa: PLR0917 (Pion's positional signature)
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        k_suf: npt.ArrayLike,
        v_suf: npt.ArrayLike,
        head_map: npt.ArrayLike | None = None,
        fa_window: int | None = None,
    ) -> PlanFactory[npt.NDArray[np.float32]]:
        """ATTEND.PREFIX.QUERY_FUSED: ``q`` ``[H_q, M, D]`` over the cached prefix and
        the suffix ``k_suf``/``v_suf`` ``[H_kv, S_suf, D]`` (causal within it) in one
        softmax; returns ``[H_q, M, D]``. ``head_map[h]`` is query head ``h``'s kv-head
        (None: ``h // (H_q // H_kv)``). Pion's ``attend_query_fused`` arguments, in its
        order. After ``-COLDMISS`` it WARMs and retries once."""
        return lambda: attend.query_fused(
            ns,
            layer,
            q,
            (k_suf, v_suf),
            head_map=head_map,
            fa_window=fa_window,
            on_rehydrate=self._count_rehydrate,
        )

    @operation
    def attend_query_sparse_auto(  # noqa: PLR0917 (Pion's positional signature)
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        block: int,
        k_top: int,
        h_kv: int | None = None,
        head_map: npt.ArrayLike | None = None,
        fa_window: int | None = None,
        selector: str = "block_mean",
    ) -> PlanFactory[npt.NDArray[np.float32]]:
        """ATTEND.PREFIX.QUERY_SPARSE_AUTO: ``q`` ``[H_q, D]`` (M = 1) over the
        ``k_top`` best prefix blocks of ``block`` tokens, picked on the server by
        ``selector`` (``"block_mean"`` or ``"quest"``), plus the last block; returns
        ``[H_q, D]``. ``h_kv`` defaults to ``H_q``. Pion's arguments, in its order."""
        return lambda: attend.query_sparse(
            ns,
            layer,
            q,
            block,
            k_top,
            suffix=None,
            h_kv=h_kv,
            head_map=head_map,
            fa_window=fa_window,
            selector=selector,
            on_rehydrate=self._count_rehydrate,
        )

    @operation
    def attend_query_sparse_auto_fused(  # noqa: PLR0917 (Pion's positional signature)
        self,
        ns: str,
        layer: int,
        q: npt.ArrayLike,
        block: int,
        k_top: int,
        k_suf: npt.ArrayLike,
        v_suf: npt.ArrayLike,
        h_kv: int | None = None,
        head_map: npt.ArrayLike | None = None,
        fa_window: int | None = None,
        selector: str = "block_mean",
    ) -> PlanFactory[npt.NDArray[np.float32]]:
        """ATTEND.PREFIX.QUERY_SPARSE_AUTO_FUSED: ``attend_query_sparse_auto`` plus the
        dense suffix ``k_suf``/``v_suf`` ``[H_kv, S_suf, D]`` in the same softmax;
        returns ``[H_q, D]``. ``h_kv`` defaults to the suffix's head count."""
        return lambda: attend.query_sparse(
            ns,
            layer,
            q,
            block,
            k_top,
            suffix=(k_suf, v_suf),
            h_kv=h_kv,
            head_map=head_map,
            fa_window=fa_window,
            selector=selector,
            on_rehydrate=self._count_rehydrate,
        )

    def _attend(
        self, ns: str, layer: int, q: npt.ArrayLike, top_k: int, fa_window: int | None
    ) -> PlanFactory[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]]:
        return lambda: plans.attend_query(
            ns, layer, q, top_k=top_k, fa_window=fa_window, on_rehydrate=self._count_rehydrate
        )
