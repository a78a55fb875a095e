"""The few file operations durability rests on, each checked: write everything or
raise, fsync a file's data, fsync a directory, atomically put a file in place.

Nothing here retries a failed write or fsync. After an fsync error the kernel may
already have dropped the dirty pages and cleared the error (the "fsyncgate" lesson from
PostgreSQL), so a second fsync that succeeds proves nothing; callers treat the file as
untrusted instead (see ``durability.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pion.persistence import faults
from pion.persistence.format import Buffer

__all__ = ["UncertainRename", "create_atomically", "fdatasync", "fsync_dir", "write_all"]


class UncertainRename(OSError):
    """A file was renamed into place but the directory fsync failed: after a power cut
    either the old or the new file may be found at the path."""


def write_all(fd: int, parts: Sequence[Buffer], total: int | None = None) -> int:
    """Write every byte of ``parts`` (os.writev, no copy of large buffers), continuing
    after short writes; raises OSError on the first failure. Returns the bytes written."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        # The common small record: one write, no views.
        n = os.write(fd, parts[0])
        if n == len(parts[0]):
            return n
        return n + write_all(fd, [memoryview(parts[0])[n:]])
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if len(v)]
    remaining = sum(len(v) for v in views) if total is None else total
    written = 0
    while views:
        n = os.writev(fd, views)
        written += n
        remaining -= n
        # Drop what the kernel took; a short write leaves a partial first view.
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    if remaining:
        raise OSError(f"wrote {written} bytes, {remaining} short")
    return written


def fdatasync(fd: int) -> None:
    """Flush a file's data (and the size it needs to be read back) to stable storage."""
    sync = getattr(os, "fdatasync", None)
    if sync is None:  # macOS has no fdatasync; its fsync is the closest it offers
        os.fsync(fd)
    else:
        sync(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, making the renames and creations inside it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_atomically(path: Path, content: bytes, step: str) -> int:
    """Put a file holding ``content`` at ``path`` atomically (temp file, fsync, rename,
    directory fsync) and return an fd open on it for appending. ``step`` prefixes the
    fault-injection points (``<step>_write``, ``_rename``, ``_fsync_dir``).

    If anything fails before the rename, the temp file is removed and ``path`` is
    untouched. A failure of the final directory fsync raises too: the rename then may
    or may not survive a power cut, and the caller must not trust the new file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        faults.fault(f"{step}_write")
        write_all(fd, [content])
        fdatasync(fd)
        faults.fault(f"{step}_rename")
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        faults.fault(f"{step}_fsync_dir")
        fsync_dir(path.parent)
    except OSError as exc:
        os.close(fd)
        raise UncertainRename(
            exc.errno, f"directory fsync after renaming {path.name}: {exc}"
        ) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd
