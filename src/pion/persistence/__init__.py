"""Durability of the worker's stores: write-ahead log, atomic snapshots, crash recovery.

Reading order: ``stores.py`` (what a durable store provides: the V-store, the
keyspace), ``format.py`` (the byte-level specification of both files),
``reader.py`` (reading records back; torn tail versus corruption), ``wal.py``
(appending and fsync policies), ``snapshot.py`` (atomic snapshots), ``recovery.py``
(start-up), ``durability.py`` (the :class:`Persistence` the server holds: failures,
MISCONF and the way back), ``cli.py`` (``pion check-wal``). ``files.py`` and
``faults.py`` are the checked file operations and the test-only fault hook;
``registry.py`` lists every store's op codes; ``vstore_durable.py`` adapts the V-store
to the durable-store protocol.

Depends on ``vstore`` and ``codecs`` (and on the stores it keeps), never on the server.
"""

from __future__ import annotations

from pion.persistence.durability import (
    Persistence,
    lock_path,
    snapshot_path,
    store_snapshot_path,
    wal_path,
)
from pion.persistence.recovery import RecoveryAborted, RecoveryError, RecoveryResult
from pion.persistence.stores import DurableStore, Frame, FrameSink

__all__ = [
    "DurableStore",
    "Frame",
    "FrameSink",
    "Persistence",
    "RecoveryAborted",
    "RecoveryError",
    "RecoveryResult",
    "lock_path",
    "snapshot_path",
    "store_snapshot_path",
    "wal_path",
]
