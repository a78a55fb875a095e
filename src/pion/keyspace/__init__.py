"""The plain keyspace: strings, hashes and sorted sets with expiry, for Pion's
PrefixStore (its lineage index) and LMCache (its K/V chunks), beside the V-store and
independent of it (DBSIZE, DEL, SCAN, KEYS, FLUSHDB act on the keyspace only).

Reading order: ``store.py`` (the :class:`Keyspace`: values, writes, expiry, snapshot
and replay), ``mutations.py`` (the records every change is made of), ``entries.py``
(what a key is and costs), ``expiry.py`` (deadlines and the active sweep),
``strings.py``, ``hashes.py`` and ``zsets.py`` (the semantics of the commands that
have some), ``sortedset.py``, ``scan.py`` (SCAN cursors),
``glob.py`` (KEYS/SCAN patterns), ``numbers.py`` (Redis's integer and float parsing).

Synchronous and pure: imports only ``errors``. Persistence is ``pion.persistence``'s
(``keyspace_durable.py``), the commands are ``pion.commands``'s.
"""

from __future__ import annotations

from pion.keyspace.entries import Kind, Value
from pion.keyspace.expiry import SWEEP_INTERVAL_S, SWEEP_MAX_KEYS, now_ms
from pion.keyspace.mutations import (
    CopyKey,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    NewKey,
    RenameKey,
    ReplaceScores,
    SetDeadline,
    SetFields,
    SetRange,
    SetScores,
    SetString,
    SetStrings,
)
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Budget, KeyJournal, Keyspace

__all__ = [
    "SWEEP_INTERVAL_S",
    "SWEEP_MAX_KEYS",
    "Budget",
    "CopyKey",
    "DeleteFields",
    "DeleteKeys",
    "DeleteMembers",
    "Flush",
    "KeyJournal",
    "KeyMutation",
    "Keyspace",
    "Kind",
    "NewKey",
    "RenameKey",
    "ReplaceScores",
    "SetDeadline",
    "SetFields",
    "SetRange",
    "SetScores",
    "SetString",
    "SetStrings",
    "SortedSet",
    "Value",
    "now_ms",
]
