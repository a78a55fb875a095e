"""The plain keyspace: strings, hashes, sorted sets, lists, sets and streams with expiry, for Pion's
PrefixStore (its lineage index) and LMCache (its K/V chunks), beside the V-store and
independent of it (DBSIZE, DEL, SCAN, KEYS, FLUSHDB act on the keyspace only), in
16 numbered databases (SELECT); the V-store is in none of them.

Reading order: ``store.py`` (the :class:`Keyspace`: writes, expiry, snapshot) with
``lookups.py`` (its reads and journaling), ``databases.py`` (the numbered databases:
SELECT's choice, MOVE, SWAPDB, FLUSHALL),
``primitives.py`` (the keys' table and the primitives every change goes through, which
replay a record and tell WATCH) with ``listset.py`` (those of lists and sets),
``mutations.py`` (the records every change is made
of), ``entries.py`` (what a key is and costs), ``expiry.py`` (deadlines and the active
sweep), ``fieldttl.py`` (hash fields' deadlines), ``strings.py``, ``hashes.py`` with
``hashttl.py`` (HEXPIRE and its family), ``zsets.py`` with ``zsets_more.py`` and
``zsets_algebra.py``, ``geo.py`` (geohashes and GEO searches), ``bits.py``, ``lists.py``,
``sets.py``, ``sort.py`` (SORT) and ``streams.py`` (the semantics of the commands that have
some), ``streamtype.py`` (the stream value) with
``streamnodes.py`` (Redis's listpack nodes, modelled for approximate trimming),
``streamops.py`` (a stream's changes as records) and ``streamtable.py`` (their
primitive and replay), ``sortedset.py``, ``scan.py`` (SCAN cursors), ``glob.py``
(KEYS/SCAN patterns), ``numbers.py`` (Redis's integer and float parsing), ``hll.py``
(HyperLogLog in Redis's own encoding), ``rdb.py`` with ``rdb_compact.py`` and
``rdb_stream.py`` and ``rdb_hashttl.py`` (Redis's DUMP payload, for DUMP and RESTORE;
streams, and hashes with field deadlines, in the last two).

Synchronous and pure: imports only ``errors`` and ``watch`` (WATCH's bookkeeping) of
Pion's packages.
Persistence is ``pion.persistence``'s (``keyspace_durable.py``), the commands are
``pion.commands``'s.
"""

from __future__ import annotations

from pion.keyspace.databases import DEFAULT_DATABASES, Databases
from pion.keyspace.entries import Kind, Value
from pion.keyspace.expiry import SWEEP_INTERVAL_S, SWEEP_MAX_KEYS, now_ms
from pion.keyspace.mutations import (
    CopyKey,
    CopyToDb,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    FlushAll,
    KeyMutation,
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListReplace,
    ListSet,
    ListTrim,
    MoveKey,
    NewKey,
    RenameKey,
    ReplaceScores,
    SelectDb,
    SetAdd,
    SetDeadline,
    SetFields,
    SetFieldTTLs,
    SetMove,
    SetRange,
    SetRemove,
    SetReplace,
    SetScores,
    SetString,
    SetStrings,
    StreamChange,
    SwapDbs,
)
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Budget, KeyJournal, Keyspace

__all__ = [
    "DEFAULT_DATABASES",
    "SWEEP_INTERVAL_S",
    "SWEEP_MAX_KEYS",
    "Budget",
    "CopyKey",
    "CopyToDb",
    "Databases",
    "DeleteFields",
    "DeleteKeys",
    "DeleteMembers",
    "Flush",
    "FlushAll",
    "KeyJournal",
    "KeyMutation",
    "Keyspace",
    "Kind",
    "ListInsert",
    "ListMove",
    "ListPop",
    "ListPush",
    "ListRemove",
    "ListReplace",
    "ListSet",
    "ListTrim",
    "MoveKey",
    "NewKey",
    "RenameKey",
    "ReplaceScores",
    "SelectDb",
    "SetAdd",
    "SetDeadline",
    "SetFieldTTLs",
    "SetFields",
    "SetMove",
    "SetRange",
    "SetRemove",
    "SetReplace",
    "SetScores",
    "SetString",
    "SetStrings",
    "SortedSet",
    "StreamChange",
    "SwapDbs",
    "Value",
    "now_ms",
]
