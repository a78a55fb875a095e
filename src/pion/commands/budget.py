"""The one memory budget: what ``used_memory`` reports, what ``--maxmemory`` bounds
(the same number), and what ``maxmemory-policy`` evicts to stay under it.

``used_memory`` = ``used_memory_startup`` + the dataset + the clients' buffers:

- ``used_memory_startup``: the process's anonymous resident memory (``RssAnon``) when
  the server's state was built, before recovery loaded anything: the interpreter, the
  imported modules, numpy. Redis's field of the same name is its own startup usage.
- the dataset: what every store accounts for the data it holds, ``vstore_bytes`` (the
  V-store's rows in stored form), ``keyspace_bytes`` (every key of every type with the
  per-object overheads of ``pion.keyspace.entries``), the attention tier's WARM slots
  (``sdpa_warm_bytes``) and the SSM state blobs (``ssm_bytes``);
- the clients' query buffers and unsent replies (``mem_clients_normal``, as last
  reported by the connections: ``pion.server.clientmem``).

It is computed, not measured, so the limit can be checked *before* a write allocates:
every store asks for the bytes a write adds (``pion.vstore.eviction``, which the
keyspace's writes ask too), and a write that builds a new value beside the old one
(APPEND and SETRANGE on a string: Python's bytes are immutable) also for the copy that
exists until the old value is freed. A write that would take ``used_memory`` past
``maxmemory`` evicts, or is refused with ``-OOM`` before anything changes. Redis checks
after the fact (a write is refused once ``used_memory`` already passed the limit, so
one write may overshoot by its own size); checking the growth first keeps
``used_memory`` at or under the limit. A write's own arguments count once, as the data
it adds: while it runs, the check leaves them out of the clients' share, which may
still hold them as read. ``tests/server/test_used_memory.py`` holds the number to the
kernel's ``RssAnon``: the growth of one tracks the other's within 1.5x for every type.

Eviction, by ``maxmemory-policy`` (Redis's names and sampling; default
``volatile-lru``):

- ``noeviction``: nothing is evicted for bytes (``--vstore-max-sessions`` still
  evicts for the session count); a write that does not fit answers ``-OOM``.
- every other policy first evicts V-store namespaces, least recently used first (the
  V-store is a cache of recomputable tensors: ``pion.vstore.eviction``), then keys:
  ``volatile-lru``, ``volatile-ttl``, ``volatile-random`` among keys with a deadline,
  ``allkeys-lru``, ``allkeys-random`` among all keys, of every database. As in Redis,
  the victim is the best of :data:`SAMPLES` keys drawn at random from each database
  (the least recently used, or the nearest deadline), not the best of all keys.

Two moments evict. Before a write command (``pion.server.dispatch.admit``), as Redis's
``performEvictions``: while ``used_memory`` is over ``maxmemory`` (a lower limit set
at runtime, client buffers that grew), evict; still over, refuse the command with
Redis's text. During a write, when its growth does not fit: namespaces first (never
the writer's own), keys when they are not enough. Neither ever evicts a key or
namespace the running command names (:meth:`MemoryBudget.begin`): the write may have
read it already.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Sequence
from functools import partial
from random import Random

from pion.attend import AttentionTables
from pion.errors import OOMError, PionError
from pion.keyspace import Keyspace
from pion.keyspace.databases import Databases
from pion.ssm import SsmStore
from pion.vstore import VStore

__all__ = [
    "DEFAULT_POLICY",
    "LFU_POLICIES",
    "NO_GROWTH",
    "OOM_TEXT",
    "POLICIES",
    "SAMPLES",
    "MemoryBudget",
    "anon_bytes",
    "parse_policy",
]

log = logging.getLogger("pion.server")

# Redis's maxmemory-policy values that Pion runs. The LFU pair needs a frequency
# counter per key that Pion does not keep: CONFIG SET refuses them (LFU_POLICIES).
POLICIES = (
    "noeviction",
    "volatile-lru",
    "allkeys-lru",
    "volatile-ttl",
    "volatile-random",
    "allkeys-random",
)
LFU_POLICIES = ("volatile-lfu", "allkeys-lfu")
# V-store namespaces are evicted, and so are keys that were given a deadline (they
# are meant to go); a key without one (an index's lineage) never is.
DEFAULT_POLICY = "volatile-lru"
# Redis's maxmemory-samples default: keys drawn per eviction.
SAMPLES = 5
# A sample of keys with a deadline may meet stale heap pairs: draws per victim.
_TRIES = 4 * SAMPLES
# Write commands that never grow memory, beside the ones that only free space
# (``pion.persistence.stores.FREEING_COMMANDS``): Redis gives them no ``denyoom``
# flag, so they run while used_memory is over maxmemory (a client can make room).
NO_GROWTH = frozenset(
    {
        "LPOP", "RPOP", "LMPOP", "BLPOP", "BRPOP", "BLMPOP", "SPOP", "SREM", "LREM",
        "LTRIM", "ZPOPMIN", "ZPOPMAX", "ZMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP",
        "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK", "ZREMRANGEBYLEX", "XDEL", "XTRIM",
        "GETDEL", "PERSIST", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "HPERSIST",
    }
)  # fmt: skip
# Redis's reply while used_memory is over maxmemory (server.c, shared.oomerr).
OOM_TEXT = "command not allowed when used memory > 'maxmemory'."


def anon_bytes() -> int:
    """This process's anonymous resident memory (Linux ``RssAnon``); the peak resident
    set where the kernel does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_policy(value: str) -> str:
    """A ``maxmemory-policy`` value (case-insensitive), or PionError."""
    policy = value.lower()
    if policy in POLICIES:
        return policy
    if policy in LFU_POLICIES:
        raise PionError(
            f"maxmemory-policy {policy} is not supported: Pion keeps no access frequency "
            f"per key (use {policy.replace('lfu', 'lru')})"
        )
    raise PionError(f"argument must be one of the following: {', '.join(POLICIES)}")


class MemoryBudget:
    """``used_memory`` of one server and the eviction that keeps it under
    ``maxmemory`` (see the module docstring)."""

    def __init__(
        self,
        vstore: VStore,
        databases: Databases,
        attention: AttentionTables,
        ssm: SsmStore,
        *,
        startup: int,
        policy: str = DEFAULT_POLICY,
    ) -> None:
        self.vstore = vstore
        self.databases = databases
        self.attention = attention
        self.ssm = ssm
        self.startup = startup
        self.policy = policy
        # Installed by the server: the clients' buffers as last reported (cheap).
        self.clients: Callable[[], int] = lambda: 0
        # The write command running now (``begin``; emptied before every command):
        # its arguments are never evicted (keys or namespaces they name), and their
        # bytes are counted once, as the data the write adds, not again in the
        # clients' share, which may still hold them as read.
        self.spare: Sequence[bytes] = ()
        self.arguments = 0
        self.evicted_keys = 0  # INFO stats, from process start
        self.peak = 0
        self.rng = Random()
        # The V-store asks the rest of used_memory, and whether it may evict.
        vstore.external_bytes = self.besides_vstore
        vstore.fixed_bytes = lambda: self.startup
        vstore.evict_others = self.evict_keys
        vstore.evict_for_bytes = policy != "noeviction"
        if 0 < vstore.maxmemory <= startup:
            log.warning(
                "--maxmemory %d is not above the server's startup memory (%d bytes): "
                "every write that adds data will answer -OOM",
                vstore.maxmemory,
                startup,
            )

    # -- the number ------------------------------------------------------------------

    @property
    def maxmemory(self) -> int:
        return self.vstore.maxmemory

    def dataset(self) -> int:
        """The bytes every store accounts for its data."""
        return (
            self.vstore.vstore_bytes
            + self.databases.used_bytes
            + self.attention.bytes
            + self.ssm.bytes
        )

    def used(self) -> int:
        """``used_memory``: startup + dataset + clients' buffers."""
        used = self.startup + self.dataset() + self.clients()
        self.peak = max(self.peak, used)
        return used

    def _checked(self) -> int:
        """:meth:`used` as a write's check sees it: the running write's arguments
        left out of the clients' share (the write's growth counts them)."""
        clients = self.clients()
        return self.startup + self.dataset() + clients - min(self.arguments, clients)

    def besides_vstore(self) -> int:
        """What the V-store's budget adds to ``vstore_bytes``: the rest of it."""
        return self._checked() - self.vstore.vstore_bytes

    def set_policy(self, policy: str) -> None:
        self.policy = policy
        self.vstore.evict_for_bytes = policy != "noeviction"

    # -- around a write command ------------------------------------------------------

    def reset(self) -> None:
        """Before every command (``pion.server.dispatch.admit``)."""
        self.spare = ()
        self.arguments = 0

    def begin(self, argv: Sequence[bytes]) -> None:
        """A write command is about to run (``pion.commands.execution.call``, for
        every lane, EXEC and scripts)."""
        self.spare = argv
        self.arguments = sum(len(a) for a in argv)

    def admit(self, argv: Sequence[bytes]) -> None:
        """Before a write command that may grow memory, as Redis does: while
        ``used_memory`` is over ``maxmemory``, evict by policy (never what the command
        names); still over, refuse it with Redis's ``-OOM``."""
        limit = self.maxmemory
        if limit <= 0:
            return
        self.begin(argv)
        over = self._checked() - limit
        if over > 0 and self.policy != "noeviction":
            over -= self.vstore.evict_lru_bytes(over, argv)
            if over > 0:
                self.evict_keys(over)
        if self._checked() > limit:
            raise OOMError(OOM_TEXT)

    def evict_keys(self, need: int) -> int:
        """Evict keys by policy (never one the running command names) until ``need``
        bytes are freed or none is left; returns the bytes freed. Nothing under
        ``noeviction`` or a volatile policy with no key holding a deadline."""
        if self.policy == "noeviction":
            return 0
        freed = 0
        while freed < need:
            found = self._victim()
            if found is None:
                break
            ks, key = found
            before = ks.used_bytes
            ks.delete((key,))
            freed += before - ks.used_bytes
            self.evicted_keys += 1
            if ks.events is not None:
                ks.events("evicted", key)
        return freed

    def _victim(self) -> tuple[Keyspace, bytes] | None:
        """The key the policy evicts next, with its database: the best of the keys
        drawn (SAMPLES from each database that has candidates), or None."""
        policy = self.policy
        pool = [(ks, key) for ks in self.databases if len(ks) for key in self._drawn(ks)]
        if not pool:
            return None
        if policy.endswith("random"):
            return pool[self.rng.randrange(len(pool))]
        if policy.endswith("ttl"):
            return min(pool, key=lambda found: _deadline_of(*found))
        return min(pool, key=lambda found: _touched(*found))

    def _drawn(self, ks: Keyspace) -> list[bytes]:
        """Up to SAMPLES candidates of ``ks`` the running command does not name."""
        if self.policy.startswith("allkeys"):
            drawn = [k for k in (ks.random_key() for _ in range(_TRIES)) if k is not None]
            return list(dict.fromkeys(k for k in drawn if not self._spared(k)))[:SAMPLES]
        current = partial(_deadline_of, ks)
        return [
            k
            for k in ks.deadlines.sample(self.rng, SAMPLES, _TRIES, current)
            if not self._spared(k)
        ]

    def _spared(self, key: bytes) -> bool:
        # (Unequal lengths compare in O(1): this costs little even for large values.)
        return any(key == a for a in self.spare)


def _deadline_of(ks: Keyspace, key: bytes) -> int:
    e = ks.peek(key)
    return 0 if e is None else e.deadline


def _touched(ks: Keyspace, key: bytes) -> int:
    e = ks.peek(key)
    return 0 if e is None else e.touched
