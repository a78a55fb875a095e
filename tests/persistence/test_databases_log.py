"""The numbered databases in the log and the snapshots (``keyspace_durable.py``): SELECT
records only where the database changes, a new log after a snapshot that starts in
database 0, a log continued after recovery from the database its replay ended in,
SELECTs followed through records a snapshot covers, every record of the databases
(MOVE, SWAPDB, COPY ... DB, FLUSHALL) replayed, an EXEC that changes database in one
TXN record."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pion.config import ServerConfig
from pion.keyspace import Databases, SelectDb, SetString, SortedSet
from pion.persistence import Persistence, keyspace_format, wal_path
from pion.persistence.cli import check_wal_command
from pion.persistence.format import WalHeader
from pion.persistence.keyspace_durable import KeyspaceDurable
from pion.persistence.reader import read_records
from pion.persistence.recovery import WAL_HEADER_SIZE, RecoveryError
from pion.vstore import VStore

Spawn = Any


def _open(data: Path) -> tuple[Databases, Persistence]:
    config = dataclasses.replace(ServerConfig(), dir=data, appendfsync="no")
    dbs = Databases()
    p = Persistence(config, VStore(config.vstore), KeyspaceDurable(dbs))
    p.open()
    p.recover_now()
    return dbs, p


def _contents(dbs: Databases) -> dict[int, dict[bytes, Any]]:
    out: dict[int, dict[bytes, Any]] = {}
    for ks in dbs:
        keys = {k: ks.lookup(k, read=False) for k in ks.keys(b"*")}
        if keys:
            out[ks.db] = {k: _shown(v) for k, v in keys.items()}
    return out


def _shown(value: Any) -> Any:
    if isinstance(value, SortedSet):
        return list(value)
    return dict(value) if isinstance(value, dict) else value


def _selects(data: Path) -> list[int]:
    """The databases the log's SELECT records name, in order."""
    path = wal_path(data, 0)
    out = []
    with open(path, "rb") as f:
        start = WalHeader.decode(f.read(WAL_HEADER_SIZE)).start
        for rec in read_records(f, WAL_HEADER_SIZE, path.stat().st_size, start):
            if rec.op == keyspace_format.OP_SET_OF:
                m = keyspace_format.decode(rec.op, rec.payload)
                if isinstance(m, SelectDb):
                    out.append(m.db)
    return out


def test_selects_only_where_the_database_changes(tmp_path: Path) -> None:
    dbs, p = _open(tmp_path)
    dbs[0].set_string(b"a", b"0")
    dbs[3].set_string(b"a", b"3")
    dbs[3].set_string(b"b", b"3")
    dbs[0].set_string(b"b", b"0")
    dbs[7].hash_set(b"h", [(b"f", b"v")])
    p.close()
    assert _selects(tmp_path) == [3, 0, 7]
    again, p2 = _open(tmp_path)
    assert _contents(again) == _contents(dbs)
    # The log continues: its replay ended in database 7, so another write there needs
    # no SELECT, and one in 0 does.
    again[7].set_string(b"x", b"7")
    again[0].set_string(b"x", b"0")
    p2.close()
    assert _selects(tmp_path) == [3, 0, 7, 0]
    third, p3 = _open(tmp_path)
    assert _contents(third) == _contents(again)
    p3.close()


def test_a_log_after_a_snapshot_starts_in_database_0(tmp_path: Path) -> None:
    dbs, p = _open(tmp_path)
    dbs[3].set_string(b"k", b"before")
    dbs[9].set_string(b"k", b"nine")
    p.save(None)
    dbs[9].set_string(b"after", b"save")  # needs its own SELECT: the log is new
    dbs[0].set_string(b"zero", b"z")
    p.close()
    assert _selects(tmp_path) == [9, 0]
    again, p2 = _open(tmp_path)
    assert _contents(again) == _contents(dbs)
    assert again[9].string(b"after") == b"save" and again[0].string(b"zero") == b"z"
    p2.close()


def test_every_record_of_the_databases_replays(tmp_path: Path) -> None:
    dbs, p = _open(tmp_path)
    dbs[0].set_string(b"m", b"moved", 4_000_000_000_000)
    assert dbs[0].move_to(b"m", dbs[2])
    dbs[1].hash_set(b"h", [(b"f", b"1")])
    assert dbs[1].copy_to(b"h", b"h2", dbs[5], False)
    dbs[6].set_string(b"gone", b"x")
    dbs.swap(1, 6)
    dbs[4].set_string(b"f", b"x")
    dbs[4].flush()
    want = _contents(dbs)
    assert sorted(want) == [1, 2, 5, 6]
    p.close()
    again, p2 = _open(tmp_path)
    assert _contents(again) == want
    assert again[2].deadline(b"m") == 4_000_000_000_000
    again.flush_all()
    p2.close()
    third, p3 = _open(tmp_path)
    assert _contents(third) == {}
    p3.close()


def test_snapshot_holds_every_database(tmp_path: Path) -> None:
    dbs, p = _open(tmp_path)
    for db in (0, 4, 15):
        dbs[db].set_string(b"k", str(db).encode())
        dbs[db].zset_set(b"z", [(1.0, b"m")])
    p.save(None)
    p.close()
    again, p2 = _open(tmp_path)
    assert _contents(again) == _contents(dbs)
    assert p2.recovered.replayed == 0  # all of it from the snapshot
    p2.close()


def test_a_database_past_the_servers_count_stops_recovery(tmp_path: Path) -> None:
    dbs, p = _open(tmp_path)
    dbs[9].set_string(b"k", b"v")
    p.close()
    config = dataclasses.replace(ServerConfig(), dir=tmp_path, appendfsync="no")
    fewer = Persistence(config, VStore(config.vstore), KeyspaceDurable(Databases(4)))
    fewer.open()
    with pytest.raises(RecoveryError, match=r"database 9, but this server has 4 .*--databases"):
        fewer.recover_now()


def test_covered_records_still_move_the_cursor() -> None:
    durable = KeyspaceDurable(dbs := Databases())
    op, parts = keyspace_format.encode(SelectDb(6))
    durable.skip_frame(op, b"".join(bytes(x) for x in parts))  # covered: not applied
    op, parts = keyspace_format.encode(SetString(b"k", b"v"))
    durable.apply_frame(op, b"".join(bytes(x) for x in parts))
    assert dbs[6].string(b"k") == b"v" and not len(dbs[0])


def test_exec_across_databases_is_one_record(spawn_server: Spawn, tmp_path: Path) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    pipe = r.pipeline(transaction=True)
    pipe.set("a", "zero")
    pipe.execute_command("SELECT", "4")
    pipe.set("a", "four")
    pipe.execute_command("SWAPDB", "4", "8")
    assert pipe.execute() == [True, True, True, True]
    srv.kill()
    srv2 = spawn_server("--appendfsync", "always")
    assert srv2.client().get("a") == b"zero"
    assert srv2.client(db=8).get("a") == b"four"
    assert srv2.client(db=4).dbsize() == 0
    out = CliRunner().invoke(check_wal_command, [str(wal_path(tmp_path / "data", 0))]).output
    # One record: SET, then SELECT 4 before the second SET, then SWAPDB.
    assert "1 good records: TXN(4)" in out
