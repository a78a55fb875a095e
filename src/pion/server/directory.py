"""The cross-worker directory of a multi-worker server: which worker owns each
registered namespace (docs/deployment.md, "Workers").

Every worker of ``-w N --independent-workers`` keeps its own V-store. A namespace is
*owned* by the worker that registered it; the directory lets every other worker answer
``KV.PREFIX.LOOKUP`` for it and point clients at the owner (``session lives on worker
N``). It is a hash table in memory shared by all workers: the supervisor creates it
(:meth:`DirectoryTable.create`) and hands each worker its file descriptor; each worker
maps the same pages (:meth:`DirectoryTable.attach`), so an entry written by one worker
is visible to all as soon as the write returns. That is how ``KV.PREFIX.REGISTER``
replies only after its entry is visible everywhere: the entry is written before the
reply, into memory every worker reads.

Concurrency. Writers take an exclusive POSIX record lock (``fcntl.lockf``) on the
table, readers a shared one. Record locks belong to a process, not to a file
description, so workers that inherited the same descriptor still exclude each other;
the kernel drops a dead process's lock. Claiming a namespace is one locked step (find,
else insert), so two workers registering the same namespace at once get one owner and
one redirect. Locking also gives the memory ordering a reader needs on every CPU.

Writes are rare (REGISTER, DROP, eviction); cross-worker LOOKUPs are not. So a writer
also makes the table's *generation* odd while it holds the lock and bumps it to the
next even number as it lets go, and each worker keeps what it read in a small cache
valid for one generation. A lookup first reads the generation (one aligned 8-byte
load, no lock): unchanged and even, the cached answer stands; otherwise it reads the
table under the lock and caches that. A writer killed mid-write leaves the generation
odd, which only sends readers to the locked path until the next write.

Crash safety. A worker may be killed mid-write while holding the lock, so every change
a reader can see is one store: an entry's body is written before its state byte flips
to live, a removal only flips the state byte, and a rebuild fills the other of two
tables and then flips which one is active. A half-done write is therefore invisible.
The counts in the header are hints kept up to date by writers and recounted on every
rebuild and every :meth:`Directory.resync` (a restarted worker's first step).

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic b"PIONDIR1"
    8       4     u32 version (1)
    12      4     u32 slots per table (a power of two)
    16      4     u32 active table (0 or 1)
    20      4     u32 live entries (hint)
    24      4     u32 used slots, live + removed (hint)
    28      4     reserved (zero)
    32      8     u64 generation: odd while a writer holds the lock
    40      24    reserved (zero)
    64            table 0: slots x 256-byte slots, then table 1 (same size)

    slot:
    0       1     u8 state: 0 empty, 1 live, 2 removed
    1       1     reserved
    2       2     u16 namespace length (1..200)
    4       4     i32 owner worker id
    8       8     u64 xxh3-64 of the namespace
    16      4     u32 PREFILL_MS registered with it
    20      4     u32 kv_dim
    24      200   namespace bytes
    224     32    reserved

Open addressing with linear probing from ``hash & (slots - 1)``. The table refuses a
new entry when it would be more than half full (``MAX_LOAD``) and is rebuilt (removed
slots dropped) when live plus removed slots pass three quarters (``REBUILD_LOAD``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import xxhash

from pion.errors import PionError
from pion.vstore import DropSession, Journal, Mutation
from pion.wire import MAX_NS_LEN, namespace_for

__all__ = [
    "MAX_LOAD",
    "MAX_SLOTS",
    "MIN_SLOTS",
    "Directory",
    "DirectoryFull",
    "DirectoryJournal",
    "DirectoryTable",
    "Entry",
    "slots_for",
]

MAGIC = b"PIONDIR1"
VERSION = 1
HEADER = struct.Struct("<8sIIIII")
HEADER_SIZE = 64
SLOT = struct.Struct("<BxHiQII")
SLOT_SIZE = 256
NS_OFFSET = SLOT.size  # 24
# The longest namespace KV.PREFIX.REGISTER accepts: it fits a slot.
# Bounds on the table size: the smallest is 512 KiB of shared memory, the largest
# 2 x 64 MiB (pages are only allocated where entries land).
MIN_SLOTS = 1024
MAX_SLOTS = 1 << 18
# A new entry is refused past half full, so probes stay short; removed slots are
# reclaimed by a rebuild once live + removed pass three quarters.
MAX_LOAD = 0.5
REBUILD_LOAD = 0.75

_EMPTY, _LIVE, _REMOVED = 0, 1, 2
_OFF_ACTIVE, _OFF_LIVE, _OFF_USED, _OFF_GEN = 16, 20, 24, 32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Answers a worker keeps for the current generation; past this the cache starts over
# (LOOKUPs of ever new namespaces must not grow it without bound).
CACHE_ENTRIES = 4096


def slots_for(workers: int, max_sessions: int) -> int:
    """Slots for ``workers`` V-stores of ``max_sessions`` sessions each: a namespace
    takes two sessions, so at most ``workers * max_sessions / 2`` entries, kept at a
    quarter of the table; a power of two within ``MIN_SLOTS..MAX_SLOTS``."""
    want = max(MIN_SLOTS, 2 * workers * max_sessions)
    return min(MAX_SLOTS, 1 << (want - 1).bit_length())


def _hash(ns: bytes) -> int:
    return xxhash.xxh3_64_intdigest(ns)


class Entry(NamedTuple):
    """A live directory entry."""

    ns: bytes
    owner: int
    prefill_ms: int
    kv_dim: int


class DirectoryFull(PionError):
    """No room for another namespace (raised by :meth:`Directory.claim`)."""


class DirectoryTable:
    """The shared table itself; see the module docstring. Workers use it through a
    :class:`Directory` bound to their worker id."""

    def __init__(self, fd: int, owns_fd: bool) -> None:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            raise PionError("worker directory: shared table is too small")
        self._fd = fd
        self._owns_fd = owns_fd
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        magic, version, slots, _, _, _ = HEADER.unpack_from(self._mm, 0)
        if magic != MAGIC or version != VERSION:
            raise PionError("worker directory: not a Pion directory table (bad magic/version)")
        if slots < 1 or slots & (slots - 1) or size != HEADER_SIZE + 2 * slots * SLOT_SIZE:
            raise PionError("worker directory: table size does not match its header")
        self.slots: int = slots
        self._mask = slots - 1
        # Answers read under the lock at generation _cache_gen (None: no entry).
        self._cache: dict[bytes, Entry | None] = {}
        self._cache_gen = -1

    @classmethod
    def create(cls, slots: int) -> DirectoryTable:
        """A new, empty table in anonymous shared memory (``memfd`` on Linux, an
        unlinked temporary file elsewhere), inheritable by worker processes."""
        if slots < 1 or slots & (slots - 1):
            raise ValueError("slots must be a power of two")
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("pion-directory", 0)
        else:  # pragma: no cover - macOS and other systems without memfd
            with tempfile.TemporaryFile() as backing:
                fd = os.dup(backing.fileno())
        os.set_inheritable(fd, False)
        os.ftruncate(fd, HEADER_SIZE + 2 * slots * SLOT_SIZE)
        header = HEADER.pack(MAGIC, VERSION, slots, 0, 0, 0)
        os.pwrite(fd, header, 0)
        return cls(fd, owns_fd=True)

    @classmethod
    def attach(cls, fd: int) -> DirectoryTable:
        """The table behind an inherited descriptor (a worker's view)."""
        return cls(fd, owns_fd=False)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        self._mm.close()
        if self._owns_fd:
            os.close(self._fd)

    # -- locking ------------------------------------------------------------------------

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """The table under a shared (read) or exclusive (write) lock. A writer's
        generation is odd until it lets go, then the next even number."""
        fcntl.lockf(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            if not exclusive:
                yield
                return
            gen = self._gen() | 1
            _U64.pack_into(self._mm, _OFF_GEN, gen)
            try:
                yield
            finally:
                _U64.pack_into(self._mm, _OFF_GEN, gen + 1)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _gen(self) -> int:
        gen: int = _U64.unpack_from(self._mm, _OFF_GEN)[0]
        return gen

    # -- reading (lock held) ------------------------------------------------------------

    def _u32(self, off: int) -> int:
        value: int = _U32.unpack_from(self._mm, off)[0]
        return value

    def _set_u32(self, off: int, value: int) -> None:
        _U32.pack_into(self._mm, off, value)

    def _base(self, table: int) -> int:
        return HEADER_SIZE + table * self.slots * SLOT_SIZE

    def _find(self, base: int, ns: bytes, h: int) -> tuple[int, int]:
        """(offset of ns's live slot or -1, offset of the first reusable slot on its
        probe path or -1)."""
        mm = self._mm
        i = h & self._mask
        free = -1
        for _ in range(self.slots):
            off = base + i * SLOT_SIZE
            state = mm[off]
            if state == _EMPTY:
                return -1, off if free < 0 else free
            if state == _REMOVED:
                if free < 0:
                    free = off
            else:
                _, n, _, slot_hash, _, _ = SLOT.unpack_from(mm, off)
                if (
                    slot_hash == h
                    and n == len(ns)
                    and mm[off + NS_OFFSET : off + NS_OFFSET + n] == ns
                ):
                    return off, free
            i = (i + 1) & self._mask
        return -1, free

    def _entry(self, off: int) -> Entry:
        _, n, owner, _, prefill_ms, kv_dim = SLOT.unpack_from(self._mm, off)
        ns = bytes(self._mm[off + NS_OFFSET : off + NS_OFFSET + n])
        return Entry(ns, owner, prefill_ms, kv_dim)

    def _live(self) -> Iterator[int]:
        """Offsets of the active table's live slots."""
        base = self._base(self._u32(_OFF_ACTIVE))
        mm = self._mm
        for i in range(self.slots):
            off = base + i * SLOT_SIZE
            if mm[off] == _LIVE:
                yield off

    def lookup(self, ns: bytes) -> Entry | None:
        """``ns``'s entry, or None. Without a lock while nothing was written since
        this worker last looked (see the module docstring)."""
        if self._gen() == self._cache_gen and ns in self._cache:
            return self._cache[ns]
        gen, entry = self.read(ns)
        if gen & 1:  # a writer died mid-write: nothing read now may be kept
            return entry
        if gen != self._cache_gen or len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
            self._cache_gen = gen
        self._cache[ns] = entry
        return entry

    def read(self, ns: bytes) -> tuple[int, Entry | None]:
        """``ns``'s entry read under the shared lock, with the generation it was
        read at (the path :meth:`lookup` takes when its cache cannot answer)."""
        with self._locked(exclusive=False):
            gen = self._gen()
            off, _ = self._find(self._base(self._u32(_OFF_ACTIVE)), ns, _hash(ns))
            return gen, None if off < 0 else self._entry(off)

    def live_count(self) -> int:
        with self._locked(exclusive=False):
            return self._u32(_OFF_LIVE)

    def entries(self) -> list[Entry]:
        """Every live entry (a full scan: for tools and tests, not the hot path)."""
        with self._locked(exclusive=False):
            return [self._entry(off) for off in self._live()]

    # -- writing (lock held) ------------------------------------------------------------

    def _write(self, off: int, h: int, entry: Entry) -> None:
        """Fill a slot, body first: the state byte is the last thing written."""
        mm = self._mm
        was = mm[off]
        ns = entry.ns
        SLOT.pack_into(mm, off, was, len(ns), entry.owner, h, entry.prefill_ms, entry.kv_dim)
        mm[off + NS_OFFSET : off + NS_OFFSET + len(ns)] = ns
        mm[off] = _LIVE
        self._set_u32(_OFF_LIVE, self._u32(_OFF_LIVE) + 1)
        if was == _EMPTY:
            self._set_u32(_OFF_USED, self._u32(_OFF_USED) + 1)

    def _remove(self, off: int) -> None:
        self._mm[off] = _REMOVED
        self._set_u32(_OFF_LIVE, max(0, self._u32(_OFF_LIVE) - 1))

    def _rebuild(self) -> None:
        """Copy the live entries into the inactive table, then make it active: one
        u32 store switches tables, so a crash part-way leaves the old table intact."""
        active = self._u32(_OFF_ACTIVE)
        target = 1 - active
        base = self._base(target)
        mm = self._mm
        mm[base : base + self.slots * SLOT_SIZE] = bytes(self.slots * SLOT_SIZE)
        live = 0
        for src in list(self._live()):
            h = SLOT.unpack_from(mm, src)[3]
            i = h & self._mask
            while mm[base + i * SLOT_SIZE] != _EMPTY:
                i = (i + 1) & self._mask
            dst = base + i * SLOT_SIZE
            mm[dst + 1 : dst + SLOT_SIZE] = mm[src + 1 : src + SLOT_SIZE]
            mm[dst] = _LIVE
            live += 1
        self._set_u32(_OFF_ACTIVE, target)
        self._set_u32(_OFF_LIVE, live)
        self._set_u32(_OFF_USED, live)

    def _recount(self) -> None:
        live = sum(1 for _ in self._live())
        base = self._base(self._u32(_OFF_ACTIVE))
        used = sum(1 for i in range(self.slots) if self._mm[base + i * SLOT_SIZE] != _EMPTY)
        self._set_u32(_OFF_LIVE, live)
        self._set_u32(_OFF_USED, used)

    def _claim(self, ns: bytes, owner: int, prefill_ms: int, kv_dim: int) -> tuple[int, bool]:
        h = _hash(ns)
        off, free = self._find(self._base(self._u32(_OFF_ACTIVE)), ns, h)
        if off >= 0:
            entry_owner: int = SLOT.unpack_from(self._mm, off)[2]
            if entry_owner == owner:
                self._set_u32(off + 16, prefill_ms)  # re-registering replaces PREFILL_MS
            return entry_owner, False
        live = self._u32(_OFF_LIVE)
        if live + 1 > self.slots * MAX_LOAD:
            raise DirectoryFull(
                f"the worker directory is full ({live} namespaces in {self.slots} slots); "
                "drop namespaces or restart with a larger --vstore-max-sessions"
            )
        if self._u32(_OFF_USED) + 1 > self.slots * REBUILD_LOAD:
            self._rebuild()
            off, free = self._find(self._base(self._u32(_OFF_ACTIVE)), ns, h)
        if free < 0:  # unreachable while REBUILD_LOAD < 1; never write past the table
            raise DirectoryFull("the worker directory has no free slot")
        self._write(free, h, Entry(ns, owner, prefill_ms, kv_dim))
        return owner, True

    def claim(self, ns: bytes, owner: int, prefill_ms: int, kv_dim: int) -> tuple[int, bool]:
        """Make ``owner`` the owner of ``ns`` unless another worker already is.
        Returns (the owner now, whether this call inserted the entry). An entry
        already owned by ``owner`` gets the new PREFILL_MS. Raises DirectoryFull."""
        if not 1 <= len(ns) <= MAX_NS_LEN:
            raise PionError(f"namespace length must be 1..{MAX_NS_LEN}")
        with self._locked(exclusive=True):
            return self._claim(ns, owner, prefill_ms, kv_dim)

    def release(self, ns: bytes, owner: int) -> bool:
        """Remove ``ns``'s entry if ``owner`` owns it; True when removed."""
        with self._locked(exclusive=True):
            off, _ = self._find(self._base(self._u32(_OFF_ACTIVE)), ns, _hash(ns))
            if off < 0 or SLOT.unpack_from(self._mm, off)[2] != owner:
                return False
            self._remove(off)
            return True

    def resync(self, owner: int, held: Iterable[tuple[bytes, int, int]]) -> list[Entry]:
        """Make ``owner``'s entries exactly ``held`` (ns, prefill_ms, kv_dim): remove
        its entries for namespaces it no longer holds, publish the ones missing. A
        namespace another worker already owns is left to it and returned."""
        wanted = {ns: (ms, dim) for ns, ms, dim in held}
        conflicts: list[Entry] = []
        with self._locked(exclusive=True):
            self._recount()
            for off in list(self._live()):
                entry = self._entry(off)
                if entry.owner == owner and entry.ns not in wanted:
                    self._remove(off)
            for ns, (ms, dim) in wanted.items():
                got, _ = self._claim(ns, owner, ms, dim)
                if got != owner:
                    off, _ = self._find(self._base(self._u32(_OFF_ACTIVE)), ns, _hash(ns))
                    conflicts.append(self._entry(off))
        return conflicts


class Directory:
    """A worker's handle on the shared table: claims and releases are made in this
    worker's name."""

    def __init__(self, table: DirectoryTable, worker: int) -> None:
        self.table = table
        self.worker = worker

    def owner(self, ns: bytes) -> int:
        """The worker owning ``ns``, or -1."""
        entry = self.table.lookup(ns)
        return -1 if entry is None else entry.owner

    def remote(self, ns: bytes) -> Entry | None:
        """``ns``'s entry when another worker owns it."""
        entry = self.table.lookup(ns)
        return entry if entry is not None and entry.owner != self.worker else None

    def claim(self, ns: bytes, prefill_ms: int, kv_dim: int) -> tuple[int, bool]:
        return self.table.claim(ns, self.worker, prefill_ms, kv_dim)

    def release(self, ns: bytes) -> bool:
        return self.table.release(ns, self.worker)

    def resync(self, held: Iterable[tuple[bytes, int, int]]) -> list[Entry]:
        return self.table.resync(self.worker, held)

    def entries(self) -> int:
        """Live entries, all workers together (``directory_entries``)."""
        return self.table.live_count()


class DirectoryJournal:
    """The V-store's journal, seen by the directory too: each mutation goes to the
    journal underneath (the WAL) first; once that accepted a drop or an eviction of
    either half of a namespace, the namespace's entry is withdrawn, so no worker
    answers HIT for a namespace its owner no longer holds."""

    def __init__(self, inner: Journal | None, directory: Directory) -> None:
        self.inner = inner
        self.directory = directory

    def append(self, mutation: Mutation) -> None:
        if self.inner is not None:
            self.inner.append(mutation)
        if isinstance(mutation, DropSession):
            ns = namespace_for(mutation.sid)
            if ns is not None:
                self.directory.release(ns)
