"""Where each prefix lives, shared by every proxy of a fleet through pion-server.

Owns :class:`PrefixRegistry` and :class:`Place`. Several ``pion llama proxy`` processes
in front of the same llama-servers know nothing of each other's slots; the store they
share is the only shared state, so each publishes there where it placed a prefix, and
reads there where a prefix it does not hold itself already is: a proxy that starts fresh
sends a prefix to the server and slot that hold it instead of warming it cold elsewhere
(:meth:`pion.llama.fleet.Fleet` feeds the place into :func:`pion.llama.route.route`).

The layout (docs/llama.md, "Several proxies: the registry"), ``<p>`` the store's key
prefix (``pion:llama:``), ``fp`` the prefix's fingerprint:

- ``<p>at:<fp>``: a string ``<server URL>\\n<slot>``, the place of the prefix, with a TTL;
- ``<p>slot:<server URL>\\n<slot>``: a string, the fingerprint that slot holds, same TTL;
- ``KV.PREFIX.REGISTER llama-at:<fp> 1 fp16 BLOCKS 16 n <hashes>``: the prefix's block
  hashes (``pion`` scheme, :func:`pion.client.hashing.block_hashes`), so a router can ask
  ``KV.PREFIX.MEMBERSHIP`` / ``BLOCKS`` how much of a request a placed prefix covers;
  dropped (``KV.PREFIX.DROP``) with the place when its slot is taken over.

KV.PREFIX namespaces carry no TTL, so the claim is the pair of plain keys: they expire
unless the proxy that placed the prefix (or one that hit it since) refreshes them every
``ttl / 3`` s, so a dead proxy's claims are gone within ``ttl``. The slot key is what
makes a take-over visible: placing a prefix in a slot swaps the slot key (``SET ... GET``)
and drops the place of the prefix it held, whichever proxy put it there.

Fail-open: any error of the registry is counted and logged, and the routing goes on with
what the proxy knows itself; after a transport error the registry is left alone for
:data:`RETRY_AFTER_S` s, so a down store costs a request nothing. The calls are
synchronous (redis-py) and run in worker threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from pion.client.hashing import block_hashes, hashes_to_blob
from pion.llama.store import StoreConfig

__all__ = ["BLOCK_SIZE", "RETRY_AFTER_S", "Place", "PrefixRegistry", "blocks_namespace"]

# Tokens per block of the published hashes (the pion scheme's usual block).
BLOCK_SIZE = 16
# After a transport error the registry is skipped this long (fail-open, as the store).
RETRY_AFTER_S = 5.0
_NS_PREFIX = "llama-at:"
_MAX_HASHES = 1_048_576


def blocks_namespace(fingerprint: str) -> str:
    """The KV.PREFIX namespace holding a placed prefix's block hashes."""
    return _NS_PREFIX + fingerprint


@dataclass(frozen=True)
class Place:
    """A llama-server and one of its slots."""

    server: str
    slot: int

    def encode(self) -> str:
        return f"{self.server}\n{self.slot}"

    @classmethod
    def decode(cls, raw: object) -> Place | None:
        """The place a key holds; None for anything else (never trusted blindly)."""
        if not isinstance(raw, bytes):
            return None
        server, sep, slot = raw.decode("utf-8", "replace").rpartition("\n")
        if not sep or not server or not slot.isdigit():
            return None
        return cls(server, int(slot))


class PrefixRegistry:
    """The fleet's shared view of where prefixes are (see the module docstring)."""

    def __init__(self, config: StoreConfig, ttl: float, log: Callable[[str], None]) -> None:
        if ttl <= 0:
            raise ValueError("the registry's TTL must be positive")
        self.ttl = ttl
        self.log = log
        self.prefix = config.prefix
        self.counts: Counter[str] = Counter()
        self._redis = redis.Redis.from_url(config.url, **config.redis_options())
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._held: dict[Place, str] = {}  # the places this proxy keeps alive
        self._refresh: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start refreshing the held claims (on the running loop)."""
        if self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def aclose(self) -> None:
        """Stop refreshing (the claims then expire) and close the connection pool."""
        task, self._refresh = self._refresh, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        self._redis.close()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            await asyncio.to_thread(self._guarded, "refresh", self._refresh_held)

    # -- the calls the fleet makes ----------------------------------------------------------

    async def locate(self, fingerprint: str) -> Place | None:
        """Where the registry says ``fingerprint`` is; None when nowhere (or on error)."""
        found = await asyncio.to_thread(self._guarded, "locate", self._locate, fingerprint)
        if isinstance(found, Place):
            self.counts["found"] += 1
            return found
        return None

    async def publish(self, fingerprint: str, place: Place, tokens: Sequence[int] | None) -> None:
        """``fingerprint`` is now in ``place`` (its ``tokens``, when known, give the block
        hashes); the prefix that slot held before loses its place."""
        await asyncio.to_thread(self._guarded, "publish", self._publish, fingerprint, place, tokens)

    def status(self) -> dict[str, Any]:
        return {"ttl_s": self.ttl, "held": len(self._held), "counts": dict(self.counts)}

    # -- in worker threads ------------------------------------------------------------------

    def _guarded(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None on any registry error (counted, logged): fail-open."""
        with self._lock:
            if time.monotonic() < self._down_until:
                self.counts["skipped_down"] += 1
                return None
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            with self._lock:
                self._down_until = time.monotonic() + RETRY_AFTER_S
                self.counts["errors"] += 1
            self.log(
                f"REGISTRY {what} failed ({type(exc).__name__}: {exc}) → skipped for "
                f"{RETRY_AFTER_S:.0f} s (fail-open)"
            )
        except redis.RedisError as exc:
            with self._lock:
                self.counts["errors"] += 1
            self.log(f"REGISTRY {what} failed ({exc}) (fail-open)")
        return None

    def _at_key(self, fingerprint: str) -> str:
        return f"{self.prefix}at:{fingerprint}"

    def _slot_key(self, place: Place) -> str:
        return f"{self.prefix}slot:{place.encode()}"

    def _locate(self, fingerprint: str) -> Place | None:
        return Place.decode(self._redis.get(self._at_key(fingerprint)))

    def _publish(self, fingerprint: str, place: Place, tokens: Sequence[int] | None) -> None:
        """One round trip for a hit (the claim renewed); a new placement also registers
        the namespace (its log records are written once, not per request) and drops the
        place of the prefix the slot held."""
        ttl_ms = max(1, round(self.ttl * 1000))
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._slot_key(place), fingerprint, px=ttl_ms, get=True)
        pipe.set(self._at_key(fingerprint), place.encode(), px=ttl_ms)
        old = pipe.execute()[0]
        with self._lock:
            self._held[place] = fingerprint
            self.counts["published"] += 1
        if old == fingerprint.encode():
            return
        try:
            self._redis.execute_command(*_register_args(fingerprint, tokens))  # type: ignore[no-untyped-call]
        except redis.ResponseError:
            # A plain Redis store has no KV.PREFIX: the places work all the same.
            with self._lock:
                self.counts["register_errors"] += 1
        if isinstance(old, bytes):
            self._drop(old.decode("ascii", "replace"), place)

    def _drop(self, fingerprint: str, place: Place) -> None:
        """``place`` was taken over: the place of the prefix it held goes, unless that
        prefix was placed elsewhere since."""
        key = self._at_key(fingerprint)
        if Place.decode(self._redis.get(key)) != place:
            return
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(key)
        pipe.execute_command("KV.PREFIX.DROP", blocks_namespace(fingerprint))  # type: ignore[no-untyped-call]
        deleted, dropped = pipe.execute(raise_on_error=False)
        if isinstance(deleted, Exception):
            raise deleted
        with self._lock:
            self.counts["dropped"] += 1
            if isinstance(dropped, Exception):  # a plain Redis store, as in _publish
                self.counts["register_errors"] += 1
        self.log(f"REGISTRY {place.server} slot {place.slot}: {fingerprint[:16]}… taken over")

    def _refresh_held(self) -> None:
        """Extend the claims still ours; forget those another proxy took over."""
        with self._lock:
            held = list(self._held.items())
        ttl_ms = max(1, round(self.ttl * 1000))
        for place, fingerprint in held:
            now = self._redis.get(self._slot_key(place))
            if now is not None and now != fingerprint.encode():
                with self._lock:
                    if self._held.get(place) == fingerprint:
                        del self._held[place]
                continue
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(self._slot_key(place), fingerprint, px=ttl_ms)
            pipe.set(self._at_key(fingerprint), place.encode(), px=ttl_ms)
            pipe.execute()
            with self._lock:
                self.counts["refreshed"] += 1


def _register_args(fingerprint: str, tokens: Sequence[int] | None) -> list[Any]:
    """KV.PREFIX.REGISTER of the prefix's namespace, with its block hashes when known."""
    args: list[Any] = ["KV.PREFIX.REGISTER", blocks_namespace(fingerprint), 1, "fp16"]
    if tokens:
        hashes = block_hashes(tokens, BLOCK_SIZE)[:_MAX_HASHES]
        args += ["BLOCKS", BLOCK_SIZE, len(hashes), hashes_to_blob(hashes)]
    return args
