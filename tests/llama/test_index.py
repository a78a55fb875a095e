"""index.json: missing = empty, corrupt = no deletion, cleanup by count and bytes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from pion.llama.cli import llama_group
from pion.llama.index import IndexEntry, SlotIndex


def add_file(slot_dir: Path, name: str, size: int, last_used: float) -> None:
    (slot_dir / name).write_bytes(b"\0" * size)
    SlotIndex(slot_dir).put(
        name, IndexEntry(fingerprint=name, tokens=size, bytes=size, created=0, last_used=last_used)
    )


def names(slot_dir: Path) -> set[str]:
    return {p.name for p in slot_dir.glob("pi-prefix-*.bin")}


def test_missing_index_is_empty(tmp_path: Path) -> None:
    index = SlotIndex(tmp_path).load()
    assert index.files == {} and index.no_restore == {} and index.trusted


def test_round_trip_is_atomic_json(tmp_path: Path) -> None:
    add_file(tmp_path, "pi-prefix-a.bin", 10, 1.0)
    SlotIndex(tmp_path).set_no_restore("b1|m", "hybrid")
    doc = json.loads((tmp_path / "index.json").read_text())
    assert doc["version"] == 1
    assert doc["files"]["pi-prefix-a.bin"]["bytes"] == 10
    assert doc["no_restore"]["b1|m"]["reason"] == "hybrid"
    assert not list(tmp_path.glob("*.tmp"))


def test_cleanup_by_count_keeps_most_recent(tmp_path: Path) -> None:
    for i in range(5):
        add_file(tmp_path, f"pi-prefix-{i}.bin", 100, last_used=float(i))
    removed = SlotIndex(tmp_path).cleanup(max_files=2, max_bytes=10**9)
    assert sorted(removed) == ["pi-prefix-0.bin", "pi-prefix-1.bin", "pi-prefix-2.bin"]
    assert names(tmp_path) == {"pi-prefix-3.bin", "pi-prefix-4.bin"}
    assert set(SlotIndex(tmp_path).load().files) == names(tmp_path)


def test_cleanup_by_bytes_and_keep(tmp_path: Path) -> None:
    add_file(tmp_path, "pi-prefix-old.bin", 600, 1.0)
    add_file(tmp_path, "pi-prefix-mid.bin", 300, 2.0)
    add_file(tmp_path, "pi-prefix-new.bin", 300, 3.0)
    removed = SlotIndex(tmp_path).cleanup(max_files=10, max_bytes=700)
    assert removed == ["pi-prefix-old.bin"]
    # `keep` survives even beyond the budget (the file just saved).
    removed = SlotIndex(tmp_path).cleanup(0, 0, keep=frozenset({"pi-prefix-mid.bin"}))
    assert removed == ["pi-prefix-new.bin"]
    assert names(tmp_path) == {"pi-prefix-mid.bin"}


def test_vanished_files_are_forgotten_and_orphans_listed(tmp_path: Path) -> None:
    add_file(tmp_path, "pi-prefix-gone.bin", 10, 1.0)
    (tmp_path / "pi-prefix-gone.bin").unlink()
    (tmp_path / "pi-prefix-orphan.bin").write_bytes(b"x")
    assert SlotIndex(tmp_path).cleanup(10, 10**6) == []
    index = SlotIndex(tmp_path).load()
    assert index.files == {}
    assert index.orphans() == ["pi-prefix-orphan.bin"]
    # Files the index does not list are never deleted, whatever the budget.
    assert SlotIndex(tmp_path).cleanup(0, 0) == []
    assert names(tmp_path) == {"pi-prefix-orphan.bin"}


def test_corrupt_index_deletes_nothing(tmp_path: Path) -> None:
    for i in range(3):
        add_file(tmp_path, f"pi-prefix-{i}.bin", 100, float(i))
    (tmp_path / "index.json").write_text('{"version": 1, "files": {"pi-prefix-0.bin": [')
    logged: list[str] = []
    index = SlotIndex(tmp_path, log=logged.append)
    assert index.cleanup(max_files=0, max_bytes=0) == []
    assert names(tmp_path) == {f"pi-prefix-{i}.bin" for i in range(3)}
    assert not index.trusted
    assert any("index.json corrupt" in m and "cleanup disabled" in m for m in logged)
    assert (tmp_path / "index.json.corrupt").exists()
    # Still off for the rest of this run, even after new files are indexed.
    add_file(tmp_path, "pi-prefix-new.bin", 100, time.time())
    index.put("pi-prefix-new.bin", SlotIndex(tmp_path).load().files["pi-prefix-new.bin"])
    assert index.cleanup(0, 0) == []
    assert len(names(tmp_path)) == 4


def test_wrong_shapes_are_corrupt(tmp_path: Path) -> None:
    bad = [
        "[]",
        '{"version": 2, "files": {}}',
        '{"version": 1, "files": []}',
        '{"version": 1, "files": {"x": {"fingerprint": 1}}}',
    ]
    for text in bad:
        (tmp_path / "index.json").write_text(text)
        index = SlotIndex(tmp_path).load()
        assert not index.trusted and index.files == {}, text


def test_gc_command(tmp_path: Path) -> None:
    for i in range(4):
        add_file(tmp_path, f"pi-prefix-{i}.bin", 100, float(i))
    result = CliRunner().invoke(
        llama_group, ["gc", "--slot-dir", str(tmp_path), "--max-files", "1"], env={}
    )
    assert result.exit_code == 0, result.output
    assert "removed 3 file(s); 1 kept" in result.output
    assert names(tmp_path) == {"pi-prefix-3.bin"}


def test_a_checkpoint_entry_names_its_prefix(tmp_path: Path) -> None:
    """A conversation checkpoint's entry carries its prefix's fingerprint; entries written
    before the field existed read as a prefix's own file."""
    entry = IndexEntry(fingerprint="c" * 64, tokens=9, bytes=1, created=0, last_used=0)
    entry.prefix = "p" * 64
    (tmp_path / "pi-prefix-c.bin").write_bytes(b"\0")
    SlotIndex(tmp_path).put("pi-prefix-c.bin", entry)
    loaded = SlotIndex(tmp_path).load().files["pi-prefix-c.bin"]
    assert loaded.checkpoint and loaded.prefix == "p" * 64
    doc = json.loads((tmp_path / "index.json").read_text())
    del doc["files"]["pi-prefix-c.bin"]["prefix"]
    (tmp_path / "index.json").write_text(json.dumps(doc))
    old = SlotIndex(tmp_path).load().files["pi-prefix-c.bin"]
    assert not old.checkpoint and old.prefix == ""
