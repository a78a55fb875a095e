"""The keyspace's journal: a record for every mutation while a log is open; without one
(``--no-wal``) no record is built, and the mutation is only counted."""

from __future__ import annotations

import pytest

from pion.keyspace import DeleteKeys, Keyspace, SetString, store
from pion.persistence import keyspace_format
from pion.persistence.keyspace_durable import KeyspaceDurable, KeyspaceJournal
from pion.persistence.stores import Frame


class Sink:
    def __init__(self, logging: bool) -> None:
        self.logging = logging
        self.frames: list[Frame] = []
        self.changes = 0

    def append_frame(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.changes += 1

    def note_change(self, count: int = 1) -> None:
        self.changes += count


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
    ks = Keyspace()
    sink = Sink(logging=False)
    KeyspaceDurable(ks).attach(sink)  # type: ignore[arg-type]
    assert ks.journal is None
    ks.set_string(b"k", b"v")
    ks.delete([b"k"])
    assert sink.frames == [] and sink.changes == 2


def test_set_without_a_log_builds_no_record_unless_a_notification_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SET, the hottest write: with no log and no keyspace notification its record is not
    even built (the change is counted); a notification subscriber still gets its ``new``."""
    ks = Keyspace()
    sink = Sink(logging=False)
    KeyspaceDurable(ks).attach(sink)  # type: ignore[arg-type]
    built: list[object] = []
    real = store.SetString

    def spy(*args: object) -> SetString:
        built.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "SetString", spy)
    ks.set_string(b"k", b"v")
    assert built == [] and sink.changes == 1 and ks.string(b"k") == b"v"
    events: list[tuple[str, bytes]] = []
    ks.events = lambda event, key: events.append((event, key))
    ks.set_string(b"new", b"v")
    assert len(built) == 1 and sink.changes == 2 and events == [("new", b"new")]
