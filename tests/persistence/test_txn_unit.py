"""An EXEC's writes as one log record (TXN, ``txn_format.py``): the framing, the log's
unit, recovery of a whole unit, a log cut at every byte inside one (the partial
transaction is dropped, everything before it kept), a failed unit write, ``pion
check-wal``, and under ``appendfsync always`` an EXEC acknowledged only after the
fsync of its record."""

from __future__ import annotations

import dataclasses
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from pion.config import ServerConfig
from pion.errors import MisconfError
from pion.keyspace import Keyspace, SetString
from pion.persistence import Persistence, keyspace_format, wal_path
from pion.persistence import wal as wal_mod
from pion.persistence.cli import check_wal_command
from pion.persistence.format import FormatError
from pion.persistence.keyspace_durable import KeyspaceDurable
from pion.persistence.reader import Record
from pion.persistence.recovery import RecoveryResult, _apply_record
from pion.persistence.txn_format import OP_TXN, decode_txn, encode_txn
from pion.persistence.vstore_durable import VStoreDurable, vstore_frame
from pion.vstore import CreateSession, VStore
from support import no_retry, rows
from support.keyspace import RawClient


def open_both(data: Path, **overrides: Any) -> tuple[VStore, Keyspace, Persistence]:
    config = dataclasses.replace(ServerConfig(), dir=data, appendfsync="no", **overrides)
    vs = VStore(config.vstore)
    ks = Keyspace()
    p = Persistence(config, vs, KeyspaceDurable(ks))
    p.open()
    p.recover_now()
    return vs, ks, p


def state(vs: VStore, ks: Keyspace) -> tuple[Any, ...]:
    keys = {k: ks.lookup(k, read=False) for k in sorted(ks.keys(b"*"))}
    shown = {k: dict(v) if isinstance(v, dict) else v for k, v in keys.items()}
    sessions = {}
    for sid in vs.sids():
        got = vs.fetch_range(sid, 0, 0, 4, native=True)
        sessions[sid] = None if got is None else got.tobytes()
    return shown, sessions


def the_unit(vs: VStore, ks: Keyspace) -> None:
    """Writes of two stores, one of them a view the next write changes."""
    ks.set_string(b"a", b"1")
    ks.hash_set(b"h", [(b"f", b"v"), (b"g", b"\x00\r\n")])
    vs.create(b"s", 8, "fp16")
    vs.store(b"s", 0, 0, rows(4, 8))
    ks.delete([b"before"])
    ks.set_string(b"a", b"2")


# -- the framing ---------------------------------------------------------------------------


def test_txn_payload_round_trips_and_refuses_malformed_ones() -> None:
    records = [(16, [b"abc"]), (3, [b"", memoryview(b"xyz")]), (20, [b"q" * 300])]
    payload = b"".join(bytes(p) for p in encode_txn(records))
    assert payload[:5] == struct.pack("<BI", 1, 3)
    got = [(op, bytes(body)) for op, body in decode_txn(payload)]
    assert got == [(16, b"abc"), (3, b"xyz"), (20, b"q" * 300)]
    bad = {
        "layout 2": b"\x02" + payload[1:],
        "of 1 records": payload[:1] + struct.pack("<I", 1) + payload[5:],
        "runs past": payload[:-1],
        "after its records": payload + b"\x00",
        "op code 48": payload[:5] + bytes([OP_TXN]) + payload[6:],
        "shorter than its header": payload[:3],
    }
    for why, raw in bad.items():
        with pytest.raises(FormatError, match=why):
            list(decode_txn(raw))
    with pytest.raises(ValueError):
        encode_txn([(16, [b"x"])])


# -- the log's unit ---------------------------------------------------------------------------


def test_a_unit_is_one_record_and_recovers_whole(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    ks.set_string(b"before", b"x")
    wal = p.wal
    assert wal is not None
    seq, appended = wal.last_seq, wal.appended
    p.begin_unit()
    the_unit(vs, ks)
    assert wal.last_seq == seq  # nothing written while the unit is open
    p.end_unit()
    assert (wal.last_seq, wal.appended) == (seq + 1, appended + 1)
    want = state(vs, ks)
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert state(vs2, ks2) == want
    p2.close()


def test_a_unit_of_one_record_is_that_record(tmp_path: Path) -> None:
    _, ks, p = open_both(tmp_path)
    p.begin_unit()
    ks.set_string(b"a", b"1")
    p.end_unit()
    p.begin_unit()
    p.end_unit()  # empty: nothing written
    p.begin_unit()
    ks.set_string(b"b", b"1")
    ks.set_string(b"c", b"1")
    p.end_unit()
    p.close()
    out = CliRunner().invoke(check_wal_command, [str(wal_path(tmp_path, 0))])
    assert out.exit_code == 0, out.output
    assert "TXN(2) 1" in out.output and "records: SET 1, TXN(2) 1" in out.output, out.output


def test_a_log_cut_inside_a_unit_drops_the_whole_transaction(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    ks.set_string(b"before", b"x")
    vs.create(b"t", 8, "int8")
    before = state(vs, ks)
    wal = p.wal
    assert wal is not None
    start = wal.size
    p.begin_unit()
    the_unit(vs, ks)
    p.end_unit()
    after = state(vs, ks)
    end = wal.size
    p.close()
    path = wal_path(tmp_path, 0)
    whole = path.read_bytes()
    assert len(whole) == end
    for cut in range(start, end + 1):
        work = tmp_path / f"cut{cut}"
        work.mkdir()
        (work / path.name).write_bytes(whole[:cut])
        vs2, ks2, p2 = open_both(work)
        assert state(vs2, ks2) == (after if cut == end else before), cut
        p2.close()


def test_a_failed_unit_write_fails_the_log_until_a_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vs, ks, p = open_both(tmp_path)
    ks.set_string(b"before", b"x")
    wal = p.wal
    assert wal is not None
    good = wal.size
    real = wal_mod.write_all

    def full_disk(fd: int, parts: Any, total: int | None = None) -> int:
        os.write(fd, bytes(memoryview(parts[0]))[:9])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    p.begin_unit()
    the_unit(vs, ks)
    monkeypatch.setattr(wal_mod, "write_all", full_disk)
    with pytest.raises(MisconfError):
        p.end_unit()
    monkeypatch.setattr(wal_mod, "write_all", real)
    assert wal_path(tmp_path, 0).stat().st_size == good  # the torn bytes were cut
    # Memory holds the unit the log lacks: failed (not merely blocked), writes refused.
    assert wal.failure is not None and p.write_refusal() is not None
    with pytest.raises(MisconfError):
        ks.set_string(b"after", b"1")
    want = state(vs, ks)
    p.save(None)  # the way back: a snapshot from memory and a new log
    ks.set_string(b"after", b"1")
    want[0][b"after"] = b"1"
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert state(vs2, ks2) == want
    p2.close()


def test_a_refused_write_inside_a_unit_applies_nothing_of_it(tmp_path: Path) -> None:
    _, ks, p = open_both(tmp_path)
    wal = p.wal
    assert wal is not None
    p.begin_unit()
    ks.set_string(b"a", b"1")
    wal.blocked = "no room (test)"
    with pytest.raises(MisconfError):
        ks.set_string(b"b", b"1")
    wal.blocked = None
    p.end_unit()
    assert b"b" not in ks
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert state(vs2, ks2) == ({b"a": b"1"}, {})
    p2.close()


# -- through the server --------------------------------------------------------------------


class FsyncSpy:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")


def test_exec_under_always_is_acknowledged_after_the_fsync(
    server_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy()
    monkeypatch.setattr(wal_mod, "fdatasync", spy)
    srv = server_factory(dir=tmp_path / "d", appendfsync="always")
    r = redis.Redis(port=srv.port, retry=no_retry())
    before = spy.calls
    pipe = r.pipeline()
    pipe.set("a", 1).set("b", 2).incr("a")
    assert pipe.execute() == [True, True, 2]
    assert spy.calls == before + 1  # one fsync for the EXEC's one record
    early = RawClient(srv.port)
    assert early.call("MULTI").raw == b"+OK\r\n"
    assert early.call("SET", "d", 1).raw == b"+QUEUED\r\n"  # queued while the log is fine
    spy.fail = True
    pipe = r.pipeline()
    pipe.set("a", 5).set("b", 6)
    with pytest.raises(redis.ConnectionError):  # no fsync, no acknowledgement
        pipe.execute()
    spy.fail = False
    # The log is failed now: EXEC refuses the queued write before running anything.
    assert early.call("EXEC").raw.startswith(
        b"-EXECABORT Transaction discarded because of: MISCONF"
    )
    early.close()
    r2 = redis.Redis(port=srv.port, retry=no_retry())
    pipe = r2.pipeline()
    pipe.get("a").set("c", 1)
    with pytest.raises(redis.ResponseError, match="MISCONF"):  # refused while queuing
        pipe.execute()
    assert r2.get("d") is None  # the aborted EXEC ran nothing


def test_a_snapshot_covers_a_txn_store_by_store() -> None:
    """A crash between two snapshot renames leaves one store's file covering a TXN and
    the other's not: replay applies the TXN's records of the store that lacks them."""
    ks = Keyspace()
    vs = VStore(ServerConfig().vstore)
    kd, vd = KeyspaceDurable(ks), VStoreDurable(vs)
    owners = {op: kd for op in kd.ops} | {op: vd for op in vd.ops}
    key_op, key_parts = keyspace_format.encode(SetString(b"a", b"1"))
    create = vstore_frame(CreateSession(b"s", 8, "int8"))
    payload = b"".join(
        bytes(p) for p in encode_txn([(key_op, key_parts), (create.op, create.parts)])
    )
    res = RecoveryResult()
    rec = Record(offset=0, op=OP_TXN, seq=7, payload=payload)
    assert _apply_record(owners, {"keyspace": 7, "vstore": 6}, rec, res)
    assert b"a" not in ks and b"s" in vs  # the keyspace's snapshot already had it
    assert (res.skipped, res.foreign) == (1, 0)
    assert not _apply_record({}, {}, rec, res)  # no store of it here: foreign
    assert res.foreign == 2
