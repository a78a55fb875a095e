"""SsmStore as a unit: opaque blobs by (sid, layer), empty versus absent, the byte
budget, and the journal order (logged before applied; a refused record changes nothing)."""

from __future__ import annotations

import pytest

from pion.errors import MisconfError, OOMError
from pion.ssm import SsmDrop, SsmMutation, SsmStore, SsmWrite


class Log:
    def __init__(self) -> None:
        self.records: list[SsmMutation] = []
        self.fail = False

    def append_ssm(self, mutation: SsmMutation) -> None:
        if self.fail:
            raise MisconfError("log failing")
        self.records.append(mutation)


def test_store_fetch_drop_and_accounting() -> None:
    s = SsmStore()
    s.store(b"x", 0, b"abc")
    s.store(b"x", 1, b"")
    s.store(b"y", 3, b"12345")
    assert s.get(b"x", 0) == b"abc" and s.get(b"x", 1) == b"" and s.get(b"x", 2) is None
    assert (len(s), s.bytes) == (3, 8)
    s.store(b"x", 0, b"a")  # replace
    assert (len(s), s.bytes) == (3, 6)
    assert s.drop(b"x", 0) == 1 and s.get(b"x", 0) is None
    assert s.drop(b"x") == 1 and s.drop(b"x") == 0 and s.drop(b"y", 9) == 0
    assert (len(s), s.bytes) == (1, 5)


def test_budget_refuses_without_changing_anything() -> None:
    s = SsmStore(max_bytes=10)
    s.store(b"x", 0, b"12345678")
    with pytest.raises(OOMError, match="ssm-maxmemory"):
        s.store(b"x", 1, b"123")
    s.store(b"x", 0, b"1234567890")  # a replacement is measured by its growth
    assert s.bytes == 10 and s.get(b"x", 1) is None


def test_journal_sees_every_change_first_and_replay_rebuilds() -> None:
    log = Log()
    s = SsmStore(journal=log)
    s.store(b"x", 0, b"a")
    s.store(b"x", 1, b"b")
    s.drop(b"x", 0)
    s.drop(b"nothing")  # nothing held: nothing logged
    assert log.records == [SsmWrite(b"x", 0, b"a"), SsmWrite(b"x", 1, b"b"), SsmDrop(b"x", 0)]
    log.fail = True
    with pytest.raises(MisconfError):
        s.store(b"x", 2, b"c")
    with pytest.raises(MisconfError):
        s.drop(b"x")
    assert s.get(b"x", 2) is None and s.get(b"x", 1) == b"b"
    replayed = SsmStore()
    for m in log.records:
        replayed.apply(m)
    assert list(replayed.dump()) == list(s.dump()) == [SsmWrite(b"x", 1, b"b")]
