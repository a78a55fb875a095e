"""The keyspace's databases as a :class:`~pion.persistence.stores.DurableStore`: their
mutations become records of op codes 16..31 (``keyspace_format.py``), their snapshot
is ``pion.keyspace.<w>``.

Records name no database. As Redis's AOF writes SELECT, a SELECT record (op 31,
change 6) goes before a record whose database differs from the last record's
(:class:`KeyspaceJournal`, one :class:`_Cursor` shared by the databases' journals);
the records after it are of that database, and a file (log or snapshot) starts in
database 0, so logs and snapshots written before there were databases load into
database 0. When the journals are attached after recovery the cursor is where the
replay of the log left it (the log goes on), or 0 when the log was reset; every later
log reset puts it back to 0 (:meth:`KeyspaceDurable.log_reset`). A snapshot writes
each non-empty database after a SELECT and ends back in database 0.

Replay keeps the log's cursor even through the records a snapshot already covers
(:meth:`KeyspaceDurable.skip_frame`: their SELECTs still say which database the
records after them are of).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pion.keyspace import (
    CopyToDb,
    Databases,
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    FlushAll,
    KeyMutation,
    Keyspace,
    MoveKey,
    SelectDb,
    SwapDbs,
)
from pion.persistence import keyspace_format
from pion.persistence.format import Buffer, FormatError
from pion.persistence.stores import Frame, FrameSink

__all__ = ["KeyspaceDurable", "KeyspaceJournal"]

# Mutations that only remove data (DEL, UNLINK, an expiry, HDEL, ZREM, FLUSHDB/FLUSHALL):
# their records are drops, which a log refusing writes still takes (``stores.Frame``).
_REMOVES_ONLY = (DeleteKeys, DeleteFields, DeleteMembers, Flush, FlushAll)
# Records of no one database: written without a SELECT before them.
_EVERY_DB = (SwapDbs, FlushAll)


class _Cursor:
    """The database of the last keyspace record written (a new log file: 0)."""

    __slots__ = ("db",)

    def __init__(self) -> None:
        self.db = 0


class KeyspaceJournal:
    """One database's journal: each mutation as a record to a sink, after a SELECT
    record when the last one written was of another database. Attached only while a
    log is written: without one (``--no-wal``) the keyspace has no journal and builds
    no record (building a SET's record cost about as much as the SET itself), it only
    counts the change (:meth:`KeyspaceDurable.attach`)."""

    __slots__ = ("cursor", "db", "sink")

    def __init__(self, sink: FrameSink, db: int = 0, cursor: _Cursor | None = None) -> None:
        self.sink = sink
        self.db = db
        self.cursor = cursor if cursor is not None else _Cursor()

    def append(self, mutation: KeyMutation) -> None:
        drop = isinstance(mutation, _REMOVES_ONLY)
        if self.cursor.db != self.db and not isinstance(mutation, _EVERY_DB):
            # As much a drop as the record it precedes: a drop passes a log that
            # refuses writes, and so must the SELECT that says where it applies.
            op, parts = keyspace_format.encode(SelectDb(self.db))
            self.sink.append_frame(Frame(op, parts, drop))
            self.cursor.db = self.db
        op, parts = keyspace_format.encode(mutation)
        self.sink.append_frame(Frame(op, parts, drop))


class KeyspaceDurable:
    """Adapter from :class:`~pion.keyspace.Databases` to the durable-store protocol."""

    name = "keyspace"

    def __init__(self, databases: Databases | Keyspace) -> None:
        # A lone keyspace (a tool, a test) is database 0 of one.
        if isinstance(databases, Keyspace):
            databases = Databases(1, first=databases)
        self.databases = databases
        self._replay_db = 0

    @property
    def ops(self) -> Mapping[int, str]:
        return keyspace_format.OPS

    @property
    def unit_ops(self) -> frozenset[int]:
        return keyspace_format.UNIT_OPS

    def frames(self) -> Iterator[Frame]:
        last = 0
        for ks in self.databases:
            if not len(ks):
                continue
            if ks.db != last:
                yield Frame(*keyspace_format.encode(SelectDb(ks.db)))
                last = ks.db
            for m in ks.dump():
                op, parts = keyspace_format.encode(m)
                yield Frame(op, parts)
        if last:
            yield Frame(*keyspace_format.encode(SelectDb(0)))

    def apply_frame(self, op: int, payload: Buffer) -> None:
        m = keyspace_format.decode(op, payload)
        if isinstance(m, SelectDb):
            self._select(m.db)
            return
        if isinstance(m, (CopyToDb, MoveKey)):
            self._check(m.db)
        elif isinstance(m, SwapDbs):
            self._check(m.a)
            self._check(m.b)
        self.databases.apply(self._replay_db, m)

    def skip_frame(self, op: int, payload: Buffer) -> None:
        """A record a snapshot covers: nothing of it is applied, but a SELECT still
        moves the log's cursor."""
        if op == keyspace_format.OP_SET_OF:
            m = keyspace_format.decode(op, payload)
            if isinstance(m, SelectDb):
                self._select(m.db)

    def log_reset(self) -> None:
        self._replay_db = 0
        for ks in self.databases:
            if isinstance(ks.journal, KeyspaceJournal):
                ks.journal.cursor.db = 0

    def _select(self, db: int) -> None:
        self._replay_db = self._check(db)

    def _check(self, db: int) -> int:
        if db >= len(self.databases):
            raise FormatError(
                f"a record of database {db}, but this server has {len(self.databases)} "
                "databases (start it with a larger --databases)"
            )
        return db

    def attach(self, sink: FrameSink | None) -> None:
        cursor = _Cursor()
        cursor.db = self._replay_db
        for ks in self.databases:
            # Without a log no record is built, the change only counted (KeyspaceJournal).
            if sink is None:
                ks.journal, ks.changed = None, None
            elif sink.logging:
                ks.journal, ks.changed = KeyspaceJournal(sink, ks.db, cursor), None
            else:
                ks.journal, ks.changed = None, sink.note_change

    def held_bytes(self) -> int:
        return self.databases.used_bytes

    def units(self) -> int:
        return self.databases.keys()
