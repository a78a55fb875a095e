"""The prefix registry: a namespace ``ns`` is the V-store session pair ``<ns>_pk``
(keys) and ``<ns>_pv`` (values), plus an optional block-hash table on the K side and a
registered PREFILL_MS.

What lives where, and why:

* layouts, rows and block tables live in the V-store, so the WAL and snapshots cover
  them and eviction/drop remove them with the sessions;
* PREFILL_MS lives here, in memory only: it describes the registering process's cold
  prefill, and is deliberately not persisted (docs/persistence.md);
* crediting a hit goes to the :class:`~pion.prefix.receipt.Receipt`;
* under ``-w N`` the workers' shared directory (:class:`Owners`, served by
  :class:`~pion.server.directory.Directory`) says which worker owns a namespace held
  elsewhere: REGISTER claims it there before creating anything, and LOOKUP answers HIT
  from it (0 tokens unless TOKENS is given). The registry sees it only through that
  protocol, so the prefix layer does not import the server's processes.

The registry never validates wire arguments; ``pion.commands.prefix`` does that before
calling in, so nothing here is half-applied by a bad option.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from pion.errors import WrongWorkerError
from pion.prefix.receipt import Receipt
from pion.vstore import BlockTable, VStore
from pion.wire import namespace_for, namespace_sids

__all__ = ["Owners", "PrefixRegistry", "k_sid", "v_sid"]


class RemoteEntry(Protocol):
    @property
    def owner(self) -> int: ...

    @property
    def prefill_ms(self) -> int: ...


class Owners(Protocol):
    """Which worker owns each namespace, shared by the workers of ``-w N``."""

    @property
    def worker(self) -> int: ...

    def claim(self, ns: bytes, prefill_ms: int, kv_dim: int) -> tuple[int, bool]:
        """(owner, inserted): this worker's claim, or the existing owner."""
        ...

    def release(self, ns: bytes) -> bool: ...

    def owner(self, ns: bytes) -> int:
        """The worker owning ``ns``, or -1."""
        ...

    def entries(self) -> int:
        """Live entries, all workers together."""
        ...

    def remote(self, ns: bytes) -> RemoteEntry | None:
        """The entry of a namespace another worker owns, else None."""
        ...


# Namespaces whose session ids are kept built (LOOKUP's hot path then concatenates
# nothing): a bound, so a client probing random names cannot grow it; past it the
# cache starts over.
_SID_CACHE_SIZE = 4096


def k_sid(ns: bytes) -> bytes:
    return namespace_sids(ns)[0]


def v_sid(ns: bytes) -> bytes:
    return namespace_sids(ns)[1]


class PrefixRegistry:
    def __init__(self, vstore: VStore, receipt: Receipt) -> None:
        self.vstore = vstore
        self.receipt = receipt
        self._prefill_ms: dict[bytes, int] = {}
        self._sids: dict[bytes, tuple[bytes, bytes]] = {}
        # Set by a worker of a multi-worker server; None on a single-process server.
        self.directory: Owners | None = None

    def sids(self, ns: bytes) -> tuple[bytes, bytes]:
        """``namespace_sids(ns)``, built once per namespace (bounded cache)."""
        pair = self._sids.get(ns)
        if pair is None:
            if len(self._sids) >= _SID_CACHE_SIZE:
                self._sids.clear()
            pair = self._sids[ns] = namespace_sids(ns)
        return pair

    def is_registered(self, ns: bytes) -> bool:
        k, v = self.sids(ns)
        return k in self.vstore and v in self.vstore

    def holds_any(self, ns: bytes) -> bool:
        return k_sid(ns) in self.vstore or v_sid(ns) in self.vstore

    def register(
        self,
        ns: bytes,
        kv_dim: int,
        vquant: str,
        blocks: tuple[int, npt.NDArray[np.uint64]] | None,
        prefill_ms: int,
    ) -> None:
        """Create both halves (idempotent: an existing half keeps its layout), replace
        the block table when given, and record PREFILL_MS (0 when absent).

        With a directory the namespace is claimed first: when another worker owns it
        (and no half is held here) nothing is created and the caller is redirected."""
        claimed = self._claim(ns, kv_dim, prefill_ms)
        try:
            self.vstore.create(k_sid(ns), kv_dim, vquant)
            self.vstore.create(v_sid(ns), kv_dim, vquant)
            if blocks is not None:
                self.vstore.set_blocks(k_sid(ns), blocks[0], blocks[1])
        except BaseException:
            if claimed and self.directory is not None and not self.holds_any(ns):
                self.directory.release(ns)
            raise
        self._prefill_ms[ns] = prefill_ms
        self._prune()

    def lookup(self, ns: bytes, tokens: int | None, prefill_ms: int | None) -> bool:
        """HIT iff both halves exist; credits the receipt (see ``receipt.py``)."""
        pair = self._sids.get(ns) or self.sids(ns)
        own_tokens = self.vstore.hit_pair(*pair)
        if own_tokens is None:  # not registered (both halves held) here
            if self._credit_remote(ns, tokens, prefill_ms):
                return True
            self.receipt.credit_miss()
            return False
        if tokens is not None:
            credit_tokens, credit_ms = tokens, prefill_ms or 0
        else:
            credit_tokens = own_tokens
            credit_ms = prefill_ms if prefill_ms is not None else self._prefill_ms.get(ns, 0)
        # No bytes here: kvprefix_bytes_served counts what V.FETCH delivers.
        self.receipt.credit_hit(credit_tokens, credit_ms)
        return True

    def _claim(self, ns: bytes, kv_dim: int, prefill_ms: int) -> bool:
        """Claim ``ns`` in the directory for this worker; True when this call made the
        entry. A namespace held here stays here, whatever the directory says."""
        if self.directory is None:
            return False
        owner, inserted = self.directory.claim(ns, prefill_ms, kv_dim)
        if owner != self.directory.worker and not self.holds_any(ns):
            raise WrongWorkerError(f"KV.PREFIX.REGISTER session lives on worker {owner}", owner)
        return inserted

    def _credit_remote(self, ns: bytes, tokens: int | None, prefill_ms: int | None) -> bool:
        """A cross-worker hit: the directory names another owner. Its tokens live
        there, so a hit credits 0 tokens unless TOKENS is given; the time is the
        PREFILL_MS registered with it (kept in the directory) or this call's."""
        entry = self.directory.remote(ns) if self.directory is not None else None
        if entry is None:
            return False
        if tokens is not None:
            self.receipt.credit_hit(tokens, prefill_ms or 0)
        else:
            self.receipt.credit_hit(0, entry.prefill_ms if prefill_ms is None else prefill_ms)
        return True

    def drop(self, ns: bytes) -> bool:
        """Drop both halves; True when a half was held."""
        held = False
        for sid in (k_sid(ns), v_sid(ns)):
            held = self.vstore.drop(sid) or held
        self._prefill_ms.pop(ns, None)
        if self.directory is not None:
            self.directory.release(ns)
        return held

    def block_table(self, ns: bytes) -> BlockTable | None:
        sid = self.sids(ns)[0]
        if sid not in self.vstore:
            return None
        return self.vstore.blocks(sid)

    def registered(self) -> list[bytes]:
        """Namespaces with both halves held."""
        out = []
        for sid in self.vstore.sids():
            ns = namespace_for(sid)
            if ns is not None and sid == k_sid(ns) and v_sid(ns) in self.vstore:
                out.append(ns)
        return out

    def total_prefix_tokens(self) -> int:
        return sum(self.vstore.usage(k_sid(ns), touch=False)[0] for ns in self.registered())

    def _prune(self) -> None:
        # PREFILL_MS entries of namespaces the V-store evicted are dropped lazily, so
        # the map stays bounded by the sessions the store can hold.
        if len(self._prefill_ms) > 2 * self.vstore.max_sessions + 16:
            for ns in [n for n in self._prefill_ms if not self.holds_any(n)]:
                del self._prefill_ms[ns]
