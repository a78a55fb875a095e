"""Test-only fault injection at each step of a snapshot and of a log reset.

Production code calls :func:`fault` with a step name before each step; it does nothing
unless a hook is installed. Tests install one in-process (:data:`hook`) or, for real
server processes, through the environment: ``PION_TEST_FAULT=<step>:<action>`` where
action is ``error`` (raise EIO there: a failing disk), ``exit`` (``os._exit``: a crash
at exactly that point, page cache intact as after kill -9) or ``delay`` (sleep 20 ms
each time: slows recovery down so a test can watch ``-LOADING``).

Steps: ``snapshot_open``, ``snapshot_write`` (after the header is on disk),
``snapshot_fsync``, ``snapshot_rename``, ``snapshot_fsync_dir``, then the log reset
``wal_write``, ``wal_rename``, ``wal_fsync_dir``; and ``replay`` (each record loaded).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

__all__ = ["EXIT_CODE", "STEPS", "fault", "hook", "install_from_env"]

STEPS = (
    "snapshot_open",
    "snapshot_write",
    "snapshot_fsync",
    "snapshot_rename",
    "snapshot_fsync_dir",
    "wal_write",
    "wal_rename",
    "wal_fsync_dir",
)
# The exit status of a process stopped by an ``exit`` fault (tests check it).
EXIT_CODE = 86

hook: Callable[[str], None] | None = None


def fault(step: str) -> None:
    if hook is not None:
        hook(step)


def install_from_env() -> None:
    """Install the hook described by ``PION_TEST_FAULT``, if set."""
    global hook
    spec = os.environ.get("PION_TEST_FAULT")
    if not spec:
        return
    target, _, action = spec.partition(":")
    action = action or "error"

    def inject(step: str) -> None:
        if step != target:
            return
        if action == "exit":
            os._exit(EXIT_CODE)
        if action == "delay":
            time.sleep(0.02)
            return
        raise OSError(errno.EIO, f"injected fault at {step}")

    hook = inject
