"""The keyspace's journal: a record for every mutation while a log is open; without one
(``--no-wal``) no record is built, and the mutation is only counted."""

from __future__ import annotations

import pytest

from pion.keyspace import DeleteKeys, SetString
from pion.persistence import keyspace_format
from pion.persistence.keyspace_durable import KeyspaceJournal
from pion.persistence.stores import Frame


class Sink:
    def __init__(self, logging: bool) -> None:
        self.logging = logging
        self.frames: list[Frame] = []
        self.changes = 0

    def append_frame(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.changes += 1

    def note_change(self) -> None:
        self.changes += 1


def test_records_go_to_a_sink_that_logs() -> None:
    sink = Sink(logging=True)
    journal = KeyspaceJournal(sink)
    journal.append(SetString(b"k", b"v", 0))
    journal.append(DeleteKeys((b"k",), "del"))
    assert [f.op for f in sink.frames] == [
        keyspace_format.op_of(SetString(b"k", b"v", 0)),
        keyspace_format.op_of(DeleteKeys((b"k",), "del")),
    ]
    assert [f.drop for f in sink.frames] == [False, True] and sink.changes == 2


def test_without_a_log_nothing_is_encoded_and_changes_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(m: object) -> None:
        raise AssertionError("a record was built with no log to write it")

    monkeypatch.setattr(keyspace_format, "encode", refuse)
    sink = Sink(logging=False)
    journal = KeyspaceJournal(sink)
    journal.append(SetString(b"k", b"v", 0))
    journal.append(DeleteKeys((b"k",), "del"))
    assert sink.frames == [] and sink.changes == 2
