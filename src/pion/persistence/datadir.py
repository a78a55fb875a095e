"""The files of a worker in the data directory, by name (``pion.<store>.<w>`` for a
store's snapshot, ``pion.vstore.wal.<w>`` for the log, ``pion.lock.<w>``), and the
exclusive lock that keeps a second server off them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pion.errors import PionError

__all__ = ["lock_dir", "lock_path", "snapshot_path", "store_snapshot_path", "wal_path"]


def snapshot_path(data_dir: Path, worker: int) -> Path:
    """The V-store's snapshot."""
    return store_snapshot_path(data_dir, "vstore", worker)


def store_snapshot_path(data_dir: Path, store: str, worker: int) -> Path:
    """The snapshot of the durable store named ``store`` (``pion.<store>.<w>``)."""
    return data_dir / f"pion.{store}.{worker}"


def wal_path(data_dir: Path, worker: int) -> Path:
    return data_dir / f"pion.vstore.wal.{worker}"


def lock_path(data_dir: Path, worker: int) -> Path:
    return data_dir / f"pion.lock.{worker}"


def lock_dir(path: Path) -> int:
    """Hold ``path`` (a worker's lock file) with an exclusive ``flock``; returns the open
    descriptor, kept for the server's life. Refused when another server holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PionError(
            f"data directory {path.parent} is in use by another pion-server ({path.name} "
            "is locked); give each server (and worker) its own --dir"
        ) from None
    return fd
