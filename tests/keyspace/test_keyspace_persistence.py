"""The keyspace in the log and in its own snapshot: the byte format (round trips,
golden bytes, hostile payloads), one log shared with the V-store, SAVE writing both
snapshots, a crash between their renames, a data directory from before the keyspace,
and ``pion check-wal`` on keyspace files."""

from __future__ import annotations

import dataclasses
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from pion.config import ServerConfig
from pion.errors import PionError
from pion.keyspace import (
    DeleteFields,
    DeleteKeys,
    DeleteMembers,
    Flush,
    KeyMutation,
    Keyspace,
    NewKey,
    SetDeadline,
    SetFields,
    SetScores,
    SetString,
    SetStrings,
    SortedSet,
)
from pion.persistence import (
    Persistence,
    RecoveryError,
    faults,
    snapshot_path,
    store_snapshot_path,
    wal_path,
)
from pion.persistence import keyspace_format as kf
from pion.persistence.cli import check_wal_command
from pion.persistence.format import FormatError
from pion.persistence.keyspace_durable import KeyspaceDurable
from pion.vstore import VStore

FAR = 4_000_000_000_000  # a deadline in 2096


def open_both(
    data: Path, *, keyspace: bool = True, **overrides: Any
) -> tuple[VStore, Keyspace, Persistence]:
    config = dataclasses.replace(ServerConfig(), dir=data, appendfsync="no", **overrides)
    vs = VStore(config.vstore)
    ks = Keyspace()
    p = Persistence(config, vs, *([KeyspaceDurable(ks)] if keyspace else []))
    p.open()
    p.recover_now()
    return vs, ks, p


def state(vs: VStore, ks: Keyspace) -> tuple[Any, ...]:
    keys: dict[bytes, Any] = {}
    for key in ks.keys(b"*"):
        v = ks.lookup(key, read=False)
        shown = list(v) if isinstance(v, SortedSet) else dict(v) if isinstance(v, dict) else v
        keys[key] = (shown, ks.deadline(key))
    sessions = {}
    for sid in vs.sids():
        rows = vs.fetch_range(sid, 0, 0, 4, native=True)
        sessions[sid] = None if rows is None else rows.tobytes()
    return keys, sessions, ks.used_bytes, vs.vstore_bytes


def workload(vs: VStore, ks: Keyspace, tag: int = 0) -> None:
    ks.set_string(b"s%d" % tag, b"\x00\r\nvalue", FAR)
    ks.set_strings([(b"m%d" % tag, b"1"), (b"big%d" % tag, bytes(range(256)) * 300)])
    vs.create(b"sess%d" % tag, 8, "fp16")
    vs.store(b"sess%d" % tag, 0, 0, np.ones((4, 8), dtype=np.float32) * (tag + 1))
    ks.hash_set(b"h%d" % tag, [(b"f", b"v"), (b"\x00", b"")])
    ks.zset_set(b"z%d" % tag, [(1.5, b"a"), (-2.0, b"b")])
    ks.hash_delete(b"h%d" % tag, [b"\x00"])
    ks.zset_delete(b"z%d" % tag, [b"b"])
    ks.set_deadline(b"m%d" % tag, FAR)
    ks.delete([b"gone", b"m%d" % tag])


MUTATIONS: list[KeyMutation] = [
    SetString(b"k", b"v\x00\r\n", 0),
    SetString(b"", b"", FAR),
    SetString(b"big", b"x" * (200 << 10), 5),
    SetStrings(((b"a", b"1"), (b"b", b"x" * (100 << 10)))),
    DeleteKeys((b"a", b"b"), "del"),
    DeleteKeys((b"c",), "expire"),
    SetDeadline(b"k", FAR),
    SetDeadline(b"k", 0),
    SetFields(b"h", ((b"f", b"v"), (b"", b"\x00"))),
    DeleteFields(b"h", (b"f",)),
    SetScores(b"z", ((1.5, b"m"), (float("-inf"), b""))),
    DeleteMembers(b"z", (b"m", b"n")),
    Flush(),
    NewKey(b"h", "hash", FAR),
    NewKey(b"z", "zset", 0),
]


def _payload(m: KeyMutation) -> bytes:
    _, parts = kf.encode(m)
    return b"".join(bytes(p) for p in parts)


def _same(a: KeyMutation, b: KeyMutation) -> bool:
    def norm(x: Any) -> Any:
        if isinstance(x, memoryview):
            return bytes(x)
        if isinstance(x, tuple):
            return tuple(norm(i) for i in x)
        return x

    def fields(x: KeyMutation) -> tuple[Any, ...]:
        return tuple(norm(getattr(x, f.name)) for f in dataclasses.fields(x))

    return type(a) is type(b) and fields(a) == fields(b)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: type(m).__name__)
def test_every_record_round_trips(m: KeyMutation) -> None:
    op, _ = kf.encode(m)
    assert kf.op_of(m) == op and op in kf.OPS and 16 <= op <= 31
    assert _same(kf.decode(op, _payload(m)), m)


def test_golden_set_record() -> None:
    # blob key, i64 deadline, then the value: frozen layout.
    assert (
        _payload(SetString(b"ab", b"xyz", 7))
        == struct.pack("<I", 2) + b"ab" + struct.pack("<q", 7) + b"xyz"
    )
    assert kf.op_of(SetString(b"a", b"b")) == 16
    assert _payload(DeleteKeys((b"k",), "expire")) == b"\x02" + struct.pack("<II", 1, 1) + b"k"


@pytest.mark.parametrize("m", MUTATIONS[1:], ids=lambda m: type(m).__name__)
def test_truncated_payloads_are_refused(m: KeyMutation) -> None:
    op, _ = kf.encode(m)
    raw = _payload(m)
    for cut in range(len(raw)) if len(raw) < 64 else (0, 1, 3, len(raw) // 2, len(raw) - 1):
        if op == 16 and cut >= 4 + len(m.key) + 8:  # type: ignore[union-attr]
            continue  # a SET's value is "the rest": any shorter rest is a valid value
        with pytest.raises(FormatError):
            kf.decode(op, raw[:cut])


@pytest.mark.parametrize(
    ("op", "payload", "why"),
    [
        (17, struct.pack("<I", 0xFFFFFFFF), "count"),  # a huge count: refused, not allocated
        (18, b"\x01" + struct.pack("<I", 0), "count"),  # an empty DEL cannot be logged
        (18, b"\x07" + struct.pack("<II", 1, 1) + b"k", "reason"),
        (19, struct.pack("<I", 1) + b"k" + struct.pack("<q", -5), "negative"),
        (
            22,
            struct.pack("<I", 1)
            + b"z"
            + struct.pack("<Id", 1, float("nan"))
            + struct.pack("<I", 0),
            "NaN",
        ),
        (25, struct.pack("<I", 1) + b"k" + b"\x09" + struct.pack("<q", 0), "kind"),
        (24, b"x", "trailing"),
        (16, struct.pack("<I", 99) + b"k", "runs past"),
        (26, struct.pack("<I", 1) + b"a", "shorter"),
        (27, struct.pack("<I", 1) + b"a" + struct.pack("<I", 5) + b"b", "runs past"),
        (28, struct.pack("<IQ", 1, 1 << 40) + b"kv", "past a string"),
        (28, struct.pack("<I", 1) + b"k", "shorter"),
        (29, struct.pack("<I", 1) + b"k" + struct.pack("<I", 0), "count 0"),
        (32, b"", "unknown op"),
        (30, struct.pack("<I", 1) + b"k" + b"\x63", "unknown LIST change"),
        (31, struct.pack("<I", 1) + b"k" + b"\x0f", "unknown SET_OF change"),
        (30, struct.pack("<I", 1) + b"k" + b"\x01" + struct.pack("<I", 0), "count 0"),
        (30, struct.pack("<I", 1) + b"k" + b"\x05" + struct.pack("<Q", 0), "shorter"),
        (31, struct.pack("<I", 1) + b"k" + b"\x01" + struct.pack("<I", 9), "count 9"),
    ],
)
def test_hostile_payloads_are_refused(op: int, payload: bytes, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        kf.decode(op, payload)


def test_one_log_for_both_stores(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks)
    want = state(vs, ks)
    appended = p.info()["wal_appended"]
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert state(vs2, ks2) == want
    assert p2.recovered.replayed == appended  # one sequence, every record replayed once
    p2.close()


def test_save_writes_both_snapshots_and_resets_the_log(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks, 0)
    p.save(None)
    assert store_snapshot_path(tmp_path, "keyspace", 0).exists()
    assert snapshot_path(tmp_path, 0).exists()
    assert wal_path(tmp_path, 0).stat().st_size == 32
    workload(vs, ks, 1)  # logged after the snapshot
    want = state(vs, ks)
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert state(vs2, ks2) == want
    assert p2.recovered.snapshot_units == {"keyspace": 4, "vstore": 1}
    p2.close()


def test_expired_keys_stay_out_of_snapshots(tmp_path: Path) -> None:
    _, ks, p = open_both(tmp_path)
    ks.set_string(b"old", b"v", 1)  # long past: removed by the next access or sweep
    ks.set_string(b"new", b"v")
    p.save(None)
    p.close()
    _, ks2, p2 = open_both(tmp_path)
    assert ks2.keys(b"*") == [b"new"]
    p2.close()


@pytest.fixture
def fail_at() -> Iterator[dict[str, int]]:
    """{step: n}: raise EIO at the n-th time ``step`` is reached (1-based)."""
    armed: dict[str, int] = {}
    seen: dict[str, int] = {}

    def hook(step: str) -> None:
        seen[step] = seen.get(step, 0) + 1
        if armed.get(step) == seen[step]:
            raise OSError(5, f"injected fault at {step}")

    faults.hook = hook
    yield armed
    faults.hook = None


@pytest.mark.parametrize("first_save", [True, False])
def test_a_crash_between_the_two_renames_loses_nothing(
    tmp_path: Path, fail_at: dict[str, int], first_save: bool
) -> None:
    vs, ks, p = open_both(tmp_path)
    if not first_save:
        workload(vs, ks, 9)
        p.save(None)
        fail_at.clear()
    workload(vs, ks, 0)
    want = state(vs, ks)
    # SAVE writes the keyspace's file first and the V-store's last: fail the V-store's
    # rename, after the keyspace's went through.
    fail_at["snapshot_rename"] = 2 if first_save else 4
    with pytest.raises(PionError, match="injected fault"):
        p.save(None)
    ks_snap = store_snapshot_path(tmp_path, "keyspace", 0)
    assert ks_snap.exists() and (snapshot_path(tmp_path, 0).exists() != first_save)
    # What a crash right now would find: the keyspace's new file, the V-store's old one
    # (or none), and the log that was not reset (a copy: the live directory is locked).
    crashed = tmp_path.parent / f"{tmp_path.name}-crashed"
    shutil.copytree(tmp_path, crashed)
    vs2, ks2, p2 = open_both(crashed)
    p2.close()
    assert state(vs2, ks2) == want
    workload(vs, ks, 1)
    want = state(vs, ks)
    p.close()
    vs3, ks3, p3 = open_both(tmp_path)
    assert state(vs3, ks3) == want
    p3.save(None)
    p3.close()
    vs4, ks4, p4 = open_both(tmp_path)
    assert state(vs4, ks4) == want
    p4.close()


def test_a_directory_from_before_the_keyspace(tmp_path: Path) -> None:
    vs, _, p = open_both(tmp_path, keyspace=False)
    vs.create(b"old", 8, "int8")
    p.save(None)  # the log is reset past record 1, and no keyspace file exists
    vs.create(b"later", 8, "int8")
    p.close()
    vs2, ks2, p2 = open_both(tmp_path)
    assert vs2.sids() == [b"old", b"later"] and len(ks2) == 0
    ks2.set_string(b"k", b"v")
    p2.close()
    vs3, ks3, p3 = open_both(tmp_path)
    assert ks3.string(b"k") == b"v" and len(vs3) == 2
    p3.close()


def test_a_lost_vstore_snapshot_still_stops_startup(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks)
    p.save(None)
    vs.create(b"after", 8, "int8")
    p.close()
    snapshot_path(tmp_path, 0).unlink()  # the keyspace's file must not excuse this
    with pytest.raises(RecoveryError, match="missing"):
        open_both(tmp_path)


def test_one_stores_snapshot_is_not_taken_for_anothers(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks)
    p.save(None)
    p.close()
    ks_file = store_snapshot_path(tmp_path, "keyspace", 0)
    vs_file = snapshot_path(tmp_path, 0)
    raw_ks, raw_vs = ks_file.read_bytes(), vs_file.read_bytes()
    ks_file.write_bytes(raw_vs)
    vs_file.write_bytes(raw_ks)
    with pytest.raises(RecoveryError, match="another store's snapshot"):
        open_both(tmp_path)


def test_save_to_a_chosen_path_writes_the_keyspace_beside_it(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks)
    p.save("backups/one")
    assert (tmp_path / "backups" / "one").exists()
    assert (tmp_path / "backups" / "one.keyspace").exists()
    with pytest.raises(PionError, match="owns"):
        p.save("pion.keyspace.0")
    p.close()


def test_check_wal_names_keyspace_records(tmp_path: Path) -> None:
    vs, ks, p = open_both(tmp_path)
    workload(vs, ks)
    ks.set_string(b"short", b"v", 1)
    ks.lookup(b"short")  # expired on access: a DEL(expire) record
    p.close()
    out = CliRunner().invoke(check_wal_command, [str(wal_path(tmp_path, 0))])
    assert out.exit_code == 0, out.output
    for name in ("SET 2", "MSET 1", "HSET 1", "ZADD 1", "DEL(del) 1", "DEL(expire) 1", "CREATE 1"):
        assert name in out.output, (name, out.output)
    _, _, p2 = open_both(tmp_path)
    p2.save(None)
    p2.close()
    snap = CliRunner().invoke(
        check_wal_command, [str(store_snapshot_path(tmp_path, "keyspace", 0))]
    )
    assert snap.exit_code == 0 and "KEY 2" in snap.output and "no problems found" in snap.output
