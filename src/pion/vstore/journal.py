"""The hook through which the V-store's mutations reach durable storage.

The V-store calls ``journal.append(mutation)`` after it has validated (and quantized)
everything and *before* it changes any state. The contract:

- ``append`` returns: the record is accepted (written, or queued for the next group
  commit, per the WAL's fsync policy); the store then applies it.
- ``append`` raises (``MisconfError`` when persistence is failing): the store applies
  nothing of that mutation and the exception reaches the client.
- ``append`` must not call back into the store, and must copy any payload it keeps
  beyond the call (see :mod:`pion.vstore.mutations`).

One mutating call may append several records: LRU or budget evictions
(``DropSession(reason="evict")``), each applied right after its own append, then the
write itself. If an append in the middle fails, the evictions already appended stay
applied, so the log and the memory never disagree.

Replay goes the other way: :meth:`pion.vstore.VStore.apply` applies a record without
journaling it.
"""

from __future__ import annotations

from typing import Protocol

from pion.vstore.mutations import Mutation

__all__ = ["Journal"]


class Journal(Protocol):
    def append(self, mutation: Mutation) -> None:
        """Accept ``mutation`` or raise; see the module docstring."""
        ...
