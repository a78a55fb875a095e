"""Durability of the V-store: write-ahead log, atomic snapshots, crash recovery.

Reading order: ``format.py`` (the byte-level specification of both files),
``reader.py`` (reading records back; torn tail versus corruption), ``wal.py``
(appending and fsync policies), ``snapshot.py`` (atomic snapshots), ``recovery.py``
(start-up), ``durability.py`` (the :class:`Persistence` the server holds: failures,
MISCONF and the way back), ``cli.py`` (``pion check-wal``). ``files.py`` and
``faults.py`` are the checked file operations and the test-only fault hook.

Depends on ``vstore`` and ``codecs`` only.
"""

from __future__ import annotations

from pion.persistence.durability import Persistence, lock_path, snapshot_path, wal_path
from pion.persistence.recovery import RecoveryAborted, RecoveryError, RecoveryResult

__all__ = [
    "Persistence",
    "RecoveryAborted",
    "RecoveryError",
    "RecoveryResult",
    "lock_path",
    "snapshot_path",
    "wal_path",
]
