"""Durability of the worker's stores: write-ahead log, atomic snapshots, crash recovery.

Reading order: ``stores.py`` (what a durable store provides: the V-store, the
keyspace), ``format.py`` (the byte-level specification of both files, with each
store's records in ``vstore_format.py``, ``keyspace_format.py`` (with
``keyspace_fields.py``, the pieces its records are built of, ``collection_format.py``,
the changes of lists, sets and the numbered databases, and ``stream_format.py``: a
stream's changes), ``functions_format.py`` (Redis functions'
libraries, with their store's adapter) and ``txn_format.py``: an EXEC's writes as
one record),
``reader.py`` (reading records back; torn tail versus corruption), ``wal.py``
(appending and fsync policies), ``snapshot.py`` (atomic snapshots), ``recovery.py``
(start-up), ``durability.py`` (the :class:`Persistence` the server holds: failures,
MISCONF and the way back; ``datadir.py``: its files' names and lock), ``check.py`` and
``cli.py`` (``pion check-wal``). ``files.py`` and
``faults.py`` are the checked file operations and the test-only fault hook;
``registry.py`` lists every store's op codes; ``vstore_durable.py``,
``keyspace_durable.py`` (with the SELECT records that say which database a record is
of) and ``ssm_durable.py`` adapt the stores to the durable-store protocol.

Depends on ``vstore``, ``keyspace``, ``ssm`` and ``scripting.functions`` (the stores
it keeps), ``codecs``,
``config`` and ``errors`` only: it never imports ``pion.server``.
"""

from __future__ import annotations

from pion.persistence.datadir import lock_path, snapshot_path, store_snapshot_path, wal_path
from pion.persistence.durability import Persistence
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
