"""``pion check-wal``: what it reports for sound, torn, corrupt and foreign files, and
what ``--fix`` cuts."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from pion.persistence import snapshot_path, wal_path
from pion.persistence.cli import check_wal_command
from support import durable_state, open_store, small_workload


def _log(tmp_path: Path) -> tuple[Path, bytes]:
    vs, p = open_store(tmp_path / "d", vstore_max_sessions=4)
    small_workload(vs)
    p.close()
    path = wal_path(tmp_path / "d", 0)
    return path, path.read_bytes()


def test_sound_log(tmp_path: Path) -> None:
    path, _ = _log(tmp_path)
    out = CliRunner().invoke(check_wal_command, [str(path)])
    assert out.exit_code == 0, out.output
    assert "write-ahead log" in out.output and "no problems found" in out.output
    assert "DROP(evict) 1" in out.output and "DROP(drop) 1" in out.output


def test_torn_tail_is_reported_and_fixed(tmp_path: Path) -> None:
    path, raw = _log(tmp_path)
    path.write_bytes(raw[:-5])
    out = CliRunner().invoke(check_wal_command, [str(path)])
    assert out.exit_code == 1
    assert "problem: torn write (an incomplete last record" in out.output
    assert f"pion check-wal --fix {path}" in out.output
    fixed = CliRunner().invoke(check_wal_command, ["--fix", str(path)])
    assert fixed.exit_code == 0 and "fixed: cut" in fixed.output
    again = CliRunner().invoke(check_wal_command, [str(path)])
    assert again.exit_code == 0 and "no problems found" in again.output


def test_a_damaged_complete_last_record_is_corruption(tmp_path: Path) -> None:
    path, raw = _log(tmp_path)
    damaged = bytearray(raw)
    damaged[-2] ^= 0x40  # the last record's payload checksum
    path.write_bytes(bytes(damaged))
    out = CliRunner().invoke(check_wal_command, [str(path)])
    assert out.exit_code == 1
    assert "problem: corruption (a complete last record that fails its checksum)" in out.output
    assert "payload checksum mismatch in the last record, complete" in out.output
    fixed = CliRunner().invoke(check_wal_command, ["--fix", str(path)])
    assert fixed.exit_code == 0 and "fixed: cut" in fixed.output


def test_corruption_reports_what_fix_discards(tmp_path: Path) -> None:
    path, raw = _log(tmp_path)
    damaged = bytearray(raw)
    damaged[40] ^= 1  # the first record's header
    path.write_bytes(bytes(damaged))
    out = CliRunner().invoke(check_wal_command, [str(path)])
    assert out.exit_code == 1
    assert "corruption before the end of the log at offset 32" in out.output
    assert "valid records follow the damage" in out.output
    fixed = CliRunner().invoke(check_wal_command, ["--fix", str(path)])
    assert fixed.exit_code == 0
    assert path.stat().st_size == 32
    vs, p = open_store(tmp_path / "d")  # starts, empty
    assert durable_state(vs)[-1] == ("totals", 0, 0, 0)
    p.close()


def test_snapshot_and_foreign_files(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path / "d", vstore_max_sessions=4)
    small_workload(vs)
    p.save(None)
    p.close()
    snap = snapshot_path(tmp_path / "d", 0)
    out = CliRunner().invoke(check_wal_command, [str(snap)])
    assert out.exit_code == 0 and "snapshot" in out.output
    raw = bytearray(snap.read_bytes())
    raw[-30] ^= 4
    snap.write_bytes(bytes(raw))
    bad = CliRunner().invoke(check_wal_command, ["--fix", str(snap)])
    assert bad.exit_code == 2 and "not repairable" in bad.output
    other = tmp_path / "x"
    other.write_bytes(b"hello")
    foreign = CliRunner().invoke(check_wal_command, [str(other)])
    assert foreign.exit_code == 2 and "not a Pion log or snapshot" in foreign.output


def test_rollback_and_rope_records_are_named(tmp_path: Path) -> None:
    vs, p = open_store(tmp_path / "d")
    vs.create_schema(b"m", 0, [("bf16_rope_fp8_body", 64)], [16])
    snap = vs.snapshot(b"m")
    vs.restore(b"m", snap)
    vs.release(b"m", snap)
    vs.snapshot(b"m")
    log = CliRunner().invoke(check_wal_command, [str(wal_path(tmp_path / "d", 0))])
    assert log.exit_code == 0, log.output
    for name in ("CREATE_ROPES 1", "VSNAP 2", "VRESTORE 1", "VCOMMIT 1"):
        assert name in log.output, log.output
    p.save(None)
    p.close()
    snap_file = CliRunner().invoke(check_wal_command, [str(snapshot_path(tmp_path / "d", 0))])
    assert snap_file.exit_code == 0, snap_file.output
    for name in ("SNAPIDS 1", "CREATE_ROPES 1", "VSNAP 1"):
        assert name in snap_file.output, snap_file.output
