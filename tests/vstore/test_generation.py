"""VStore.generation: it changes with every change of a session's rows and only then,
and the change listeners hear of each change and drop at once."""

from __future__ import annotations

import numpy as np
import pytest

from pion.errors import SessionNotFoundError
from support import RecordingJournal, make_store, rows


def test_generation_follows_row_changes() -> None:
    vs = make_store()
    heard: list[bytes] = []
    vs.change_listeners.append(heard.append)
    vs.create(b"a", 8, "fp16")
    vs.create(b"b", 8, "int8")
    g, gb = vs.generation(b"a"), vs.generation(b"b")
    assert g != gb
    # Reads, touches, snapshots and block tables leave the rows as they are.
    vs.store(b"a", 0, 0, rows(4, 8))
    g1 = vs.generation(b"a")
    assert g1 > g
    vs.fetch_range(b"a", 0, 0, 4)
    vs.fetch_batch(b"a", 0, 4)
    vs.describe(b"a")
    vs.touch(b"a")
    snap = vs.snapshot(b"a")
    vs.set_blocks(b"a", 4, np.arange(3, dtype="<u8"))
    vs.create(b"a", 8, "fp16")  # idempotent re-create: the same session
    assert vs.generation(b"a") == g1
    # An overwrite with the same values is still a write.
    vs.store(b"a", 0, 0, rows(4, 8))
    g2 = vs.generation(b"a")
    assert g2 > g1
    vs.store(b"a", 0, 4, rows(2, 8, seed=3))
    vs.restore(b"a", snap)
    g3 = vs.generation(b"a")
    assert g3 > g2
    vs.release(b"a", snap)
    assert vs.generation(b"a") == g3
    assert vs.generation(b"b") == gb  # another session's changes are not b's
    assert heard.count(b"b") == 1  # its creation only
    heard.clear()
    assert vs.drop(b"a")
    assert heard == [b"a"]
    with pytest.raises(SessionNotFoundError):
        vs.generation(b"a")
    vs.create(b"a", 8, "fp16")
    assert vs.generation(b"a") > g3  # a re-created sid never repeats a number


def test_eviction_and_replay_notify_too() -> None:
    vs = make_store(max_sessions=2)
    heard: list[bytes] = []
    vs.change_listeners.append(heard.append)
    vs.create(b"x", 4, "fp16")
    vs.create(b"y", 4, "fp16")
    heard.clear()
    vs.create(b"z", 4, "fp16")  # evicts x, the least recently used
    assert heard == [b"x", b"z"]
    journal = RecordingJournal()
    src = make_store(journal=journal)
    src.create(b"s", 4, "int8")
    src.store(b"s", 0, 0, rows(3, 4))
    replica = make_store()
    replica.change_listeners.append(heard.append)
    heard.clear()
    before = None
    for record in journal.records:
        replica.apply(record)
        gen = replica.generation(b"s")
        assert before is None or gen > before
        before = gen
    assert heard == [b"s", b"s"]
