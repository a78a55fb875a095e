"""The allocator tuning of a server process: applied on glibc (a no-op elsewhere), and
it does what it is for: big buffers, once freed, leave RSS, where untuned glibc keeps
them resident after its dynamic mmap threshold has grown past their size."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pion
from pion.server.malloc import MMAP_THRESHOLD, tune_allocator

# The child imports this same pion.
_SRC = str(Path(pion.__file__).resolve().parents[1])

_SCRIPT = textwrap.dedent(
    f"""
    import sys
    import numpy as np
    import psutil
    from pion.server.malloc import tune_allocator
    if sys.argv[1] == "tuned":
        assert tune_allocator()
    me = psutil.Process()
    size = {MMAP_THRESHOLD} * 2
    freed = np.ones(2 * size, np.uint8)  # untuned: grows glibc's mmap threshold past size
    del freed
    before = me.memory_info().rss
    blobs = [np.ones(size, np.uint8) for _ in range(8)]  # a pipeline's blobs, say
    above = np.ones(100 << 10, np.uint8)  # heap memory allocated after them
    del blobs
    print((me.memory_info().rss - before) // size)
    """
)


def _resident_blobs(mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_freed_blobs_leave_rss_only_when_tuned() -> None:
    if platform.libc_ver()[0] != "glibc":
        assert not tune_allocator()  # nothing to tune: it says so and changes nothing
        return
    assert _resident_blobs("untuned") >= 7  # the effect the tuning exists for
    assert _resident_blobs("tuned") == 0
