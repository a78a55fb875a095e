"""The cross-worker directory: the shared table, its crash safety and process
exclusion, the journal that withdraws evicted namespaces, and the registry's use of it
(claims, redirects, cross-worker hits on the receipt)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from pion.errors import MisconfError, PionError, WrongWorkerError
from pion.prefix import PrefixRegistry, Receipt
from pion.server.directory import (
    MAX_LOAD,
    MIN_SLOTS,
    Directory,
    DirectoryFull,
    DirectoryJournal,
    DirectoryTable,
    Entry,
    slots_for,
)
from pion.vstore import DropSession
from support import FailingJournal, RecordingJournal, make_store


@pytest.fixture
def table() -> Iterator[DirectoryTable]:
    t = DirectoryTable.create(MIN_SLOTS)
    yield t
    t.close()


def test_slots_for_is_a_bounded_power_of_two() -> None:
    assert slots_for(2, 256) == MIN_SLOTS
    assert slots_for(4, 1000) == 8192
    assert slots_for(64, 1_000_000) == 1 << 18


def test_claim_owner_release(table: DirectoryTable) -> None:
    w0, w1 = Directory(table, 0), Directory(table, 1)
    assert w0.owner(b"ns") == -1 and w1.remote(b"ns") is None
    assert w0.claim(b"ns", 120, 64) == (0, True)
    assert w1.owner(b"ns") == 0
    entry = w1.remote(b"ns")
    assert entry is not None and (entry.owner, entry.prefill_ms, entry.kv_dim) == (0, 120, 64)
    assert w0.remote(b"ns") is None  # its own entry is not remote
    # A second claimant is told the owner; the owner re-claiming replaces PREFILL_MS.
    assert w1.claim(b"ns", 999, 64) == (0, False)
    assert w0.claim(b"ns", 7, 64) == (0, False)
    assert table.lookup(b"ns") is not None and table.lookup(b"ns").prefill_ms == 7  # type: ignore[union-attr]
    assert w0.entries() == 1
    # Only the owner removes its entry.
    assert w1.release(b"ns") is False and w0.owner(b"ns") == 0
    assert w0.release(b"ns") is True and w1.owner(b"ns") == -1
    assert w0.entries() == 0


def test_namespaces_are_exact_bytes(table: DirectoryTable) -> None:
    d = Directory(table, 3)
    names = [b"a", b"a\x00", b"A", b"x" * 200, bytes(range(200))]
    for i, ns in enumerate(names):
        d.claim(ns, i, 8)
    assert [table.lookup(ns).prefill_ms for ns in names] == list(range(len(names)))  # type: ignore[union-attr]
    with pytest.raises(PionError, match="length"):
        d.claim(b"x" * 201, 0, 8)
    with pytest.raises(PionError, match="length"):
        d.claim(b"", 0, 8)


def test_full_table_refuses_and_churn_rebuilds(table: DirectoryTable) -> None:
    d = Directory(table, 0)
    limit = int(table.slots * MAX_LOAD)
    for i in range(limit):
        d.claim(b"ns%d" % i, 0, 8)
    with pytest.raises(DirectoryFull, match="full"):
        d.claim(b"one-more", 0, 8)
    assert d.entries() == limit
    # Remove and add far more than the table holds: removed slots are reclaimed by
    # rebuilds, and every live entry stays findable throughout.
    previous = [b"ns%d" % i for i in range(0, limit, 2)]
    for round_ in range(6):
        assert all(d.release(ns) for ns in previous)
        previous = [b"r%d-%d" % (round_, i) for i in range(0, limit, 2)]
        for ns in previous:
            assert d.claim(ns, 0, 8) == (0, True)
    assert all(d.owner(b"ns%d" % i) == 0 for i in range(1, limit, 2))
    assert all(d.owner(b"r5-%d" % i) == 0 for i in range(0, limit, 2))
    assert d.owner(b"r4-0") == -1
    assert d.entries() == len(table.entries()) == limit


def test_resync_withdraws_publishes_and_reports_conflicts(table: DirectoryTable) -> None:
    w0, w1 = Directory(table, 0), Directory(table, 1)
    w0.claim(b"kept", 1, 8)
    w0.claim(b"lost", 1, 8)
    w1.claim(b"theirs", 1, 8)
    conflicts = w0.resync([(b"kept", 0, 8), (b"new", 0, 16), (b"theirs", 0, 8)])
    assert [(c.ns, c.owner) for c in conflicts] == [(b"theirs", 1)]
    assert w1.owner(b"lost") == -1
    assert w1.owner(b"kept") == 0 and w1.owner(b"new") == 0 and w0.owner(b"theirs") == 1
    assert table.lookup(b"kept").prefill_ms == 0  # type: ignore[union-attr]
    assert w0.entries() == 3


def test_readers_see_every_write_and_a_dead_writer_disables_the_cache(
    table: DirectoryTable,
) -> None:
    # Two views of one table, as two workers have: each keeps its own cache.
    other = DirectoryTable.attach(table.fileno())
    try:
        reader = Directory(other, 1)
        assert reader.owner(b"ns") == -1  # cached for this generation
        assert reader.owner(b"ns") == -1
        Directory(table, 0).claim(b"ns", 5, 8)
        assert reader.owner(b"ns") == 0  # the write moved the generation on
        table.claim(b"ns", 0, 9, 8)
        assert other.lookup(b"ns") == Entry(b"ns", 0, 9, 8)
        table.release(b"ns", 0)
        assert reader.remote(b"ns") is None
        # A writer killed holding the lock leaves the generation odd: readers go to
        # the table every time (and keep nothing) until the next write.
        table._mm[32:40] = struct.pack("<Q", table._gen() | 1)
        assert reader.owner(b"late") == -1
        table._claim(b"late", 2, 0, 8)  # the dead writer's insert: no generation bump
        assert reader.owner(b"late") == 2
        Directory(table, 2).release(b"late")  # the next write makes it even again
        assert table._gen() % 2 == 0 and reader.owner(b"late") == -1
    finally:
        other.close()


def test_attach_refuses_what_is_not_a_directory(tmp_path: object) -> None:
    fd = os.memfd_create("not-a-directory")
    try:
        os.ftruncate(fd, 64 + 2 * 1024 * 256)
        with pytest.raises(PionError, match="magic"):
            DirectoryTable.attach(fd)
        os.pwrite(fd, struct.pack("<8sIIIII", b"PIONDIR1", 1, 4096, 0, 0, 0), 0)
        with pytest.raises(PionError, match="size"):
            DirectoryTable.attach(fd)
        os.ftruncate(fd, 10)
        with pytest.raises(PionError, match="too small"):
            DirectoryTable.attach(fd)
    finally:
        os.close(fd)


_CHILD = """
import sys, time
from pion.server.directory import Directory, DirectoryTable
fd, worker, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
table = DirectoryTable.attach(fd)
d = Directory(table, worker)
if mode == "race":
    won = [i for i in range(300) if d.claim(b"race%d" % i, worker, 8)[1]]
    print(",".join(map(str, won)), flush=True)
elif mode == "hold":
    # Take the writer's lock and die holding it, as a worker killed mid-write would.
    with table._locked(exclusive=True):
        print("locked", flush=True)
        time.sleep(60)
"""


def _child(table: DirectoryTable, worker: int, mode: str) -> subprocess.Popen[bytes]:
    fd = table.fileno()
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(fd), str(worker), mode],
        stdout=subprocess.PIPE,
        pass_fds=(fd,),
    )


def test_processes_racing_for_namespaces_get_one_owner_each(table: DirectoryTable) -> None:
    children = [_child(table, w, "race") for w in range(3)]
    won: dict[int, set[int]] = {}
    for w, child in enumerate(children):
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        won[w] = {int(i) for i in out.decode().strip().split(",") if i}
    # Every namespace was claimed by exactly one process, and the table agrees.
    assert sorted(i for s in won.values() for i in s) == list(range(300))
    for w, mine in won.items():
        assert all(table.lookup(b"race%d" % i).owner == w for i in mine)  # type: ignore[union-attr]


def test_a_writer_killed_holding_the_lock_does_not_block_the_others(
    table: DirectoryTable,
) -> None:
    child = _child(table, 1, "hold")
    assert child.stdout is not None and child.stdout.readline() == b"locked\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    start = time.monotonic()
    assert Directory(table, 0).claim(b"after", 0, 8) == (0, True)
    assert time.monotonic() - start < 10


def test_a_half_written_slot_is_invisible(table: DirectoryTable) -> None:
    # A slot body written without its state byte (a writer killed mid-insert) is not
    # an entry; the next claim reuses it.
    d = Directory(table, 0)
    d.claim(b"probe", 0, 8)
    mm = table._mm
    slot = next(table._live())
    body = bytes(mm[slot : slot + 256])
    d.release(b"probe")
    mm[slot : slot + 256] = b"\x00" + body[1:]
    assert d.owner(b"probe") == -1
    assert d.claim(b"probe", 5, 8) == (0, True) and d.owner(b"probe") == 0


# -- the journal and the registry ------------------------------------------------------


def test_directory_journal_withdraws_after_the_log_accepted(table: DirectoryTable) -> None:
    d = Directory(table, 0)
    d.claim(b"ns", 0, 8)
    inner = RecordingJournal()
    DirectoryJournal(inner, d).append(DropSession(b"ns_pv", "evict"))
    assert inner.records == [DropSession(b"ns_pv", "evict")] and d.owner(b"ns") == -1
    d.claim(b"ns", 0, 8)
    with pytest.raises(MisconfError):
        DirectoryJournal(FailingJournal(), d).append(DropSession(b"ns_pk", "drop"))
    assert d.owner(b"ns") == 0  # the log refused the drop: nothing was dropped
    DirectoryJournal(None, d).append(DropSession(b"other_sid", "drop"))
    assert d.owner(b"ns") == 0


def _registry(table: DirectoryTable, worker: int, **kw: object) -> PrefixRegistry:
    reg = PrefixRegistry(make_store(**kw), Receipt(worker_id=worker))
    reg.directory = Directory(table, worker)
    return reg


def test_register_claims_and_redirects(table: DirectoryTable) -> None:
    r0, r1 = _registry(table, 0), _registry(table, 1)
    r0.register(b"ns", 8, "fp16", None, 250)
    with pytest.raises(WrongWorkerError, match=r"^KV.PREFIX.REGISTER session lives on worker 0$"):
        r1.register(b"ns", 8, "fp16", None, 0)
    assert b"ns_pk" not in r1.vstore  # nothing was created on the non-owner
    r0.register(b"ns", 8, "fp16", None, 40)  # idempotent; replaces PREFILL_MS
    assert table.lookup(b"ns").prefill_ms == 40  # type: ignore[union-attr]
    assert r0.drop(b"ns") and r1.directory is not None and r1.directory.owner(b"ns") == -1


def test_register_that_fails_releases_its_claim(table: DirectoryTable) -> None:
    r0 = _registry(table, 0, journal=FailingJournal())
    with pytest.raises(MisconfError):
        r0.register(b"ns", 8, "fp16", None, 0)
    assert Directory(table, 1).owner(b"ns") == -1


def test_eviction_withdraws_through_the_journal(table: DirectoryTable) -> None:
    r0 = _registry(table, 0, max_sessions=2)
    assert r0.directory is not None
    r0.vstore.journal = DirectoryJournal(None, r0.directory)
    r0.register(b"old", 8, "fp16", None, 0)
    r0.register(b"new", 8, "fp16", None, 0)  # evicts the namespace "old"
    assert not r0.holds_any(b"old")
    assert r0.directory.owner(b"old") == -1 and r0.directory.owner(b"new") == 0


def test_cross_worker_lookup_credits_zero_tokens_unless_told(table: DirectoryTable) -> None:
    r0, r1 = _registry(table, 0), _registry(table, 1)
    r0.register(b"ns", 8, "fp16", None, 300)
    r0.vstore.store(b"ns_pk", 0, 0, np.ones((50, 8), np.float32))
    assert r1.lookup(b"ns", None, None) is True
    rec = r1.receipt
    assert (rec.hits, rec.tokens_served, rec.hits_measured, rec.prefill_us_measured) == (
        1,
        0,
        1,
        300_000,
    )
    assert r1.lookup(b"ns", 120, None) is True  # TOKENS: its tokens, time 0 -> estimate
    assert rec.tokens_served == 120 and rec.prefill_us_saved == 300_000 + 120 * 555
    assert r1.lookup(b"ns", None, 77) is True  # PREFILL_MS alone replaces the time
    assert rec.prefill_us_measured == 377_000
    assert r1.lookup(b"unknown", None, None) is False and rec.misses == 1
    # The owner credits its own tokens, as a single worker does.
    assert r0.lookup(b"ns", None, None) is True and r0.receipt.tokens_served == 50
