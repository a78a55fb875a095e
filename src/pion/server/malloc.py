"""Tuning of the C allocator for a server process (glibc only; nothing elsewhere).

A large ``V.STOREBATCH`` allocates a few big buffers per command (its blob, the encoded
rows) and frees them once stored. glibc raises its mmap threshold to the size of the
last freed mmap'd chunk (up to 32 MiB), so from the second command on those buffers
come from the heap, where what is freed stays resident: peak RSS then grows by a few
blobs' worth of freed memory beyond what the store and the commands in flight hold.
Fixing the threshold keeps every buffer of :data:`MMAP_THRESHOLD` and up mmap'd, so it
is returned to the system when freed; the trim threshold is raised with it (setting
one turns off the dynamic adjustment of both, and the default 128 KiB would return and
re-fault the heap's top after every slice of an encode).

Measured by ``bench/vstore_throughput.py`` (16 x 2048 x 1024 fp32, every format): with
the defaults, peak RSS beyond idle passed 1.3x the stored bytes plus the documented
in-flight bound for five of seven formats (turbo2: 45 MB against 40.5); with these two
settings every format is within it. A fresh mapping per blob costs page faults; numpy
asks for transparent huge pages on its large arrays, and the decoder does the same
for a large bulk's buffer (``resp/_speedups.c``), which keeps that cost small (an fp16
store's server CPU: 0.14 s per 134 MB with 4 KiB pages, 0.07 s with huge pages, as
with the untuned allocator). Redis avoids the retention by linking jemalloc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

log = logging.getLogger("pion.server")

# Buffers from this size are mmap'd and given back when freed: a command's blob and
# encoded rows are larger, one slice of an encode's temporaries (2 MiB of input) is
# not, so slices reuse heap memory instead of faulting in fresh pages each time.
MMAP_THRESHOLD = 4 << 20
# Free memory at the heap's top kept before it is returned: several slices' worth.
TRIM_THRESHOLD = 64 << 20
# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Apply the settings above to this process; False where the C library is not
    glibc (then nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - every Linux has a C library
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok: bool = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:  # pragma: no cover - glibc accepts both
        log.warning("could not tune the allocator (mallopt refused)")
    return ok
