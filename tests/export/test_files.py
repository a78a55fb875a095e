"""The export directory: private modes, refusals, files made whole or not at all, the
sweep of files left by dead processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pion.errors import PionError
from pion.export.files import SUFFIX, ExportDir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _publish(d: ExportDir, payload: bytes) -> tuple[str, str]:
    name = d.new_name()
    fd, temp = d.create(name)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    return name, d.publish(temp, name)


def test_directory_and_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0)  # the modes must not depend on the umask
    try:
        d = ExportDir(tmp_path / "a" / "b" / "exports")
        name, path = _publish(d, b"hello")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a" / "b" / "exports") == 0o700
    assert _mode(Path(path)) == 0o600
    assert Path(path).read_bytes() == b"hello"
    assert os.path.isabs(path) and path == str(tmp_path / "a" / "b" / "exports" / name)
    assert d.holds(name, 5) and not d.holds(name, 6) and not d.holds("nope" + SUFFIX, 5)
    d.remove(name)
    assert not os.path.exists(path)
    d.remove(name)  # already gone: no error
    d.close()


def test_names_are_never_reused(tmp_path: Path) -> None:
    d = ExportDir(tmp_path / "x")
    names = {d.new_name() for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith(f"pion-{os.getpid()}-") and n.endswith(SUFFIX) for n in names)


def test_a_loose_directory_is_refused_not_changed(tmp_path: Path) -> None:
    target = tmp_path / "loose"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o777)
    d = ExportDir(target)
    with pytest.raises(PionError, match="has mode 777, open to other users"):
        _publish(d, b"x")
    assert _mode(target) == 0o777 and list(target.iterdir()) == []
    os.chmod(target, 0o700)  # made private by its owner: used from then on
    _publish(d, b"x")
    assert _mode(target) == 0o700 and len(list(target.iterdir())) == 1


def test_a_symlink_or_a_file_in_its_place_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(PionError, match="not a directory"):
        _publish(ExportDir(link), b"x")
    assert list(real.iterdir()) == []
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    with pytest.raises(PionError, match="export directory"):
        _publish(ExportDir(plain), b"x")


def test_a_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    owner = os.lstat(target).st_uid
    # As another user would see it (chown to a stranger needs root; this does not).
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(PionError, match=f"belongs to uid {owner}"):
        _publish(ExportDir(target), b"x")
    assert list(target.iterdir()) == []


def test_created_exclusively_and_never_through_a_link(tmp_path: Path) -> None:
    d = ExportDir(tmp_path / "e")
    name = d.new_name()
    _, temp = d.create(name)
    with pytest.raises(PionError, match="cannot create"):
        d.create(name)  # the same temporary name: O_EXCL
    d.discard(temp)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    name2 = d.new_name()
    (tmp_path / "e" / f".{name2[: -len(SUFFIX)]}.tmp").symlink_to(victim)
    with pytest.raises(PionError, match="cannot create"):
        d.create(name2)
    assert victim.read_bytes() == b"keep"


def test_a_removed_directory_is_made_again(tmp_path: Path) -> None:
    target = tmp_path / "gone"
    d = ExportDir(target)
    name, _ = _publish(d, b"1")
    for entry in target.iterdir():
        entry.unlink()
    target.rmdir()
    _, again = _publish(d, b"2")
    assert Path(again).read_bytes() == b"2" and _mode(target) == 0o700
    assert not d.holds(name, 1)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_files_of_dead_processes_are_swept_live_ones_kept(tmp_path: Path) -> None:
    target = tmp_path / "sweep"
    target.mkdir(mode=0o700)
    dead = _dead_pid()
    live = os.getppid()  # alive while we run
    stale = [f"pion-{dead}-1{SUFFIX}", f".pion-{dead}-2.tmp", f"pion-{os.getpid()}-9{SUFFIX}"]
    kept = [f"pion-{live}-1{SUFFIX}", "other.safetensors", "pion-x-1.safetensors", "notes.txt"]
    for name in stale + kept:
        (target / name).write_bytes(b"x")
    d = ExportDir(target)
    d.free_bytes()  # first use opens (and sweeps) the directory
    assert sorted(p.name for p in target.iterdir()) == sorted(kept)


def test_free_bytes_is_the_file_systems(tmp_path: Path) -> None:
    d = ExportDir(tmp_path / "f")
    st = os.statvfs(tmp_path)
    assert abs(d.free_bytes() - st.f_bavail * st.f_frsize) < 64 << 20
