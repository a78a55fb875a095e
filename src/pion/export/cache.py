"""The ``V.EXPORT`` file cache: which prefix is written to which file, whether that
file still holds the rows the V-store holds, and the bounds on what the files may use.

A request names two sessions (keys, values), a row range and a layout. Its file is
reused while both sessions keep the generation they had when it was written
(:meth:`pion.vstore.VStore.generation` changes with every store, restore, drop and
re-create), and removed as soon as either changes: the V-store tells the cache of
every change (:meth:`ExportCache.invalidate` is one of its change listeners), so a
stale or dropped prefix leaves no file behind. A client still reading an old file
keeps reading the old rows (a file is never written again, only removed).

Bounds, each checked before a byte is written:

- one file is at most :data:`MAX_FILE_BYTES` (the largest fetch reply the V-store
  builds), and at most the byte budget;
- the files together stay within ``export_max_bytes`` and :data:`MAX_FILES`: the least
  recently served are removed to make room;
- the file system keeps :data:`MIN_FREE_BYTES` free after the write, so exports can
  never starve the write-ahead log of the data directory beside them.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from pion import __version__
from pion.errors import PionError
from pion.export.files import ExportDir
from pion.export.writer import ExportRequest, check_request, write_tensors
from pion.vstore import MAX_REPLY_BYTES, VStore

__all__ = ["MAX_FILES", "MAX_FILE_BYTES", "MIN_FREE_BYTES", "ExportCache", "Exported"]

log = logging.getLogger("pion.export")

# One file is at most what one fetch reply may be (the V-store's MAX_REPLY_BYTES):
# exporting is fetching by another route, with the same bound.
MAX_FILE_BYTES = MAX_REPLY_BYTES
# Files kept at once: the default vstore-max-sessions (256), i.e. two files for every
# namespace a default server can hold, which leaves room for a few ranges of each.
MAX_FILES = 256
# Left free on the export directory's file system after a write: room for the
# write-ahead log (which sits beside it, under the data directory by default) to keep
# taking writes for minutes at the rates bench/persistence.py measures.
MIN_FREE_BYTES = 256 << 20
# A bound on a file's header (about 60 bytes per tensor, 160 tensors at most).
HEADER_ALLOWANCE = 64 << 10


@dataclass(frozen=True, slots=True)
class Exported:
    """A served export: the file's absolute path, its size, and whether it was reused."""

    path: str
    nbytes: int
    reused: bool


@dataclass(slots=True)
class _Entry:
    name: str
    path: str
    nbytes: int  # tensor data
    size: int  # the whole file, header included: what the budget counts
    generations: tuple[int, int]


class ExportCache:
    """Export files of one worker in one directory (see the module docstring)."""

    def __init__(self, directory: Path, max_bytes: int, *, min_free: int = MIN_FREE_BYTES) -> None:
        self.dir = ExportDir(directory)
        self.max_bytes = max_bytes
        self.min_free = min_free
        # Least recently served first.
        self._entries: OrderedDict[ExportRequest, _Entry] = OrderedDict()
        self._by_sid: dict[bytes, set[ExportRequest]] = {}
        self.bytes = 0
        self.written = 0  # files written since start
        self.reused = 0  # requests answered with an existing file

    @property
    def files(self) -> int:
        return len(self._entries)

    def export(self, vs: VStore, req: ExportRequest) -> Exported:
        """The path of a file holding ``req``'s rows, written now or reused."""
        gens = (vs.generation(req.sid_k), vs.generation(req.sid_v))  # session not found
        nbytes = check_request(vs, req)
        entry = self._entries.get(req)
        if entry is not None:
            if entry.generations == gens and self.dir.holds(entry.name, entry.size):
                self._entries.move_to_end(req)
                self.reused += 1
                for sid in (req.sid_k, req.sid_v):
                    vs.touch(sid)
                vs.total_fetches += 2 * req.n_layers
                return Exported(entry.path, entry.nbytes, True)
            self._forget(req)
        limit = min(self.max_bytes, MAX_FILE_BYTES)
        if nbytes > limit:
            raise PionError(
                f"V.EXPORT: the file would hold {nbytes} bytes, more than the {limit}-byte "
                "limit (export-max-bytes); export fewer rows or layers, or use V.FETCH"
            )
        # The header is a few KB at most: budget and disk checks count a bound on it.
        self._make_room(nbytes + HEADER_ALLOWANCE)
        free = self.dir.free_bytes()
        if free - nbytes < self.min_free:
            raise PionError(
                f"V.EXPORT: the export directory's file system has {free} bytes free; the "
                f"file needs {nbytes} and {self.min_free} must stay free; use V.FETCH"
            )
        name = self.dir.new_name()
        fd, temp = self.dir.create(name)
        try:
            try:
                meta = {
                    "producer": f"pion-server {__version__}",
                    "start": str(req.start),
                    "end": str(req.end),
                }
                size = write_tensors(fd, vs, req, meta)
            finally:
                os.close(fd)
            path = self.dir.publish(temp, name)
        except OSError as exc:
            self.dir.discard(temp)
            raise PionError(f"V.EXPORT: writing the file failed: {exc}") from None
        except BaseException:
            self.dir.discard(temp)
            raise
        entry = _Entry(name, path, nbytes, size, gens)
        self._entries[req] = entry
        for sid in (req.sid_k, req.sid_v):
            self._by_sid.setdefault(sid, set()).add(req)
        self.bytes += size
        self.written += 1
        return Exported(path, nbytes, False)

    def invalidate(self, sid: bytes) -> None:
        """``sid``'s rows changed or it is gone: remove every file made from it. A
        V-store change listener: it never raises."""
        for req in list(self._by_sid.get(sid, ())):
            self._forget(req)

    def close(self) -> None:
        """Remove every file (shutdown) and release the directory."""
        for req in list(self._entries):
            self._forget(req)
        self.dir.close()

    def _make_room(self, nbytes: int) -> None:
        while self._entries and (
            self.bytes + nbytes > self.max_bytes or len(self._entries) >= MAX_FILES
        ):
            oldest = next(iter(self._entries))
            log.debug("removing export file %s to make room", self._entries[oldest].name)
            self._forget(oldest)

    def _forget(self, req: ExportRequest) -> None:
        entry = self._entries.pop(req, None)
        if entry is None:
            return
        self.bytes -= entry.size
        for sid in (req.sid_k, req.sid_v):
            held = self._by_sid.get(sid)
            if held is not None:
                held.discard(req)
                if not held:
                    del self._by_sid[sid]
        self.dir.remove(entry.name)
