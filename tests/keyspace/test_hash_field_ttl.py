"""Hash-field expiry (Redis 7.4's HEXPIRE family) in the Keyspace as a unit: the reply
codes of ``pion.keyspace.hashttl``, fields past their deadline invisible and reclaimed
lazily and by the sweep (journaled as HDEL), HSET clearing a deadline and HINCRBY
keeping it, RENAME/COPY keeping them, byte accounting, records that replay to the
same state (through the log format's bytes), and WATCH."""

from __future__ import annotations

from pion.keyspace import DeleteFields, KeyMutation, Keyspace, SetFields, SetFieldTTLs
from pion.keyspace.fieldttl import FIELD_TTL_OVERHEAD
from pion.keyspace.hashes import hincrby, hincrbyfloat
from pion.keyspace.hashttl import hexpire, hpersist, httl
from pion.persistence import keyspace_format as kf
from pion.persistence.format import FormatError
from pion.watch import WatchToken

NOW = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.records: list[KeyMutation] = []

    def append(self, m: KeyMutation) -> None:
        self.records.append(m)


def make() -> tuple[Keyspace, Clock, Recorder, list[tuple[str, bytes]]]:
    clock = Clock()
    ks = Keyspace(clock=clock)
    rec = Recorder()
    ks.journal = rec
    events: list[tuple[str, bytes]] = []
    ks.events = lambda event, key: events.append((event, key))
    ks.hash_set(b"h", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    rec.records.clear()
    events.clear()
    return ks, clock, rec, events


def replayed(rec: Recorder, clock: Clock) -> Keyspace:
    """A keyspace rebuilt from the records' encoded bytes."""
    ks = Keyspace(clock=clock)
    for m in rec.records:
        op, parts = kf.encode(m)
        ks.apply(kf.decode(op, b"".join(bytes(p) for p in parts)))
    return ks


def test_hexpire_codes_and_conditions() -> None:
    ks, _, _, _ = make()
    assert hexpire(ks, b"none", NOW + 10, "", [b"a", b"b"]) == ([-2, -2], False)
    assert hexpire(ks, b"h", NOW + 10, "", [b"a", b"zz"]) == ([1, -2], False)
    assert httl(ks, b"h", [b"a", b"b", b"zz"]) == [NOW + 10, -1, -2]
    assert hexpire(ks, b"h", NOW + 20, "NX", [b"a", b"b"])[0] == [0, 1]
    assert hexpire(ks, b"h", NOW + 30, "XX", [b"a", b"c"])[0] == [1, 0]
    # GT: a field without a deadline never expires, so no deadline is greater.
    assert hexpire(ks, b"h", NOW + 25, "GT", [b"a", b"b", b"c"])[0] == [0, 1, 0]
    # LT: succeeds on a field without one.
    assert hexpire(ks, b"h", NOW + 5, "LT", [b"a", b"c"])[0] == [1, 1]
    assert httl(ks, b"h", [b"a", b"b", b"c"]) == [NOW + 5, NOW + 25, NOW + 5]


def test_past_time_deletes_after_the_condition_and_the_last_field_takes_the_key() -> None:
    ks, _, rec, _ = make()
    assert hexpire(ks, b"h", NOW, "XX", [b"a"]) == ([0], False)  # condition first
    assert hexpire(ks, b"h", NOW, "", [b"a", b"a", b"b"]) == ([2, -2, 2], False)
    assert rec.records == [DeleteFields(b"h", (b"a", b"b"))]
    assert hexpire(ks, b"h", NOW - 5, "", [b"c"]) == ([2], True)
    assert b"h" not in ks and ks.used_bytes == 0


def test_hpersist_codes() -> None:
    ks, _, rec, _ = make()
    hexpire(ks, b"h", NOW + 10, "", [b"a"])
    assert hpersist(ks, b"h", [b"a", b"a", b"b", b"zz"]) == [1, -1, -1, -2]
    assert hpersist(ks, b"none", [b"a"]) == [-2]
    assert httl(ks, b"h", [b"a"]) == [-1]
    assert rec.records[-1] == SetFieldTTLs(b"h", ((b"a", 0),))


def test_expired_fields_are_invisible_and_reclaimed_lazily_as_hdel() -> None:
    ks, clock, rec, events = make()
    hexpire(ks, b"h", NOW + 10, "", [b"a", b"b"])
    rec.records.clear()
    clock.now = NOW + 10
    assert ks.hash(b"h") == {b"a": b"1", b"b": b"2", b"c": b"3"}  # not past yet
    clock.now = NOW + 11
    assert ks.hash(b"h") == {b"c": b"3"}
    assert rec.records == [DeleteFields(b"h", (b"a", b"b"))]
    assert events == [("hexpired", b"h")]
    assert ks.expired_fields == 2
    hexpire(ks, b"h", NOW + 20, "", [b"c"])
    clock.now = NOW + 21
    assert ks.exists(b"h") is False
    assert events[-2:] == [("hexpired", b"h"), ("del", b"h")]


def test_the_sweep_reclaims_fields_earliest_first() -> None:
    ks, clock, rec, _ = make()
    for i in range(50):
        ks.hash_set(b"k%d" % i, [(b"f", b"v"), (b"g", b"w")])
        hexpire(ks, b"k%d" % i, NOW + 100 + i, "", [b"f"])
    hexpire(ks, b"h", NOW + 5, "", [b"a", b"b", b"c"])
    hpersist(ks, b"h", [b"a"])
    rec.records.clear()
    clock.now = NOW + 120
    ks.sweep(1000)
    gone = [m for m in rec.records if isinstance(m, DeleteFields)]
    assert gone[0] == DeleteFields(b"h", (b"b", b"c"))
    assert len(gone) == 1 + 20  # k0..k19 are past NOW + 120
    assert ks.field_ttls.of(b"h") is None and ks.hash(b"h") == {b"a": b"1"}
    assert len(ks.field_ttls.by_key) == 30


def test_hset_clears_a_deadline_hincrby_keeps_it() -> None:
    ks, _, rec, _ = make()
    ks.hash_set(b"h", [(b"n", b"1"), (b"x", b"1.5")])
    hexpire(ks, b"h", NOW + 10, "", [b"a", b"n", b"x"])
    rec.records.clear()
    assert hincrby(ks, b"h", b"n", 2) == 3
    assert hincrbyfloat(ks, b"h", b"x", b"1") == b"2.5"
    assert rec.records[0] == SetFieldTTLs(b"h", (), ((b"n", b"3"),))
    ks.hash_set(b"h", [(b"a", b"new")])
    assert rec.records[-1] == SetFields(b"h", ((b"a", b"new"),))
    assert httl(ks, b"h", [b"a", b"n", b"x"]) == [-1, NOW + 10, NOW + 10]


def test_bytes_follow_deadlines() -> None:
    ks, _, _, _ = make()
    base = ks.used_bytes
    hexpire(ks, b"h", NOW + 10, "", [b"a", b"b"])
    assert ks.used_bytes == base + 2 * FIELD_TTL_OVERHEAD
    hpersist(ks, b"h", [b"a"])
    ks.hash_set(b"h", [(b"b", b"2")])
    assert ks.used_bytes == base
    hexpire(ks, b"h", NOW + 10, "", [b"c"])
    ks.hash_delete(b"h", [b"c"])
    ks.rename(b"h", b"h2")
    hexpire(ks, b"h2", NOW + 10, "", [b"a"])
    ks.copy(b"h2", b"h3", False)
    ks.delete([b"h2", b"h3"])
    assert ks.used_bytes == 0


def test_rename_and_copy_keep_deadlines_and_overwrites_drop_them() -> None:
    ks, _, _, _ = make()
    hexpire(ks, b"h", NOW + 10, "", [b"a"])
    ks.rename(b"h", b"r")
    assert httl(ks, b"r", [b"a"]) == [NOW + 10] and ks.field_ttls.of(b"h") is None
    ks.copy(b"r", b"c", False)
    hpersist(ks, b"c", [b"a"])
    assert httl(ks, b"r", [b"a"]) == [NOW + 10]  # the copy's deadlines are its own
    ks.set_string(b"r", b"now a string")
    assert ks.field_ttls.of(b"r") is None


def test_records_replay_to_the_same_state_and_snapshot_keeps_deadlines() -> None:
    ks, clock, rec, _ = make()
    ks.hash_set(b"n", [(b"i", b"1")])
    hexpire(ks, b"h", NOW + 10, "", [b"a", b"b"])
    hexpire(ks, b"n", NOW + 50, "", [b"i"])
    hincrby(ks, b"n", b"i", 5)
    hpersist(ks, b"h", [b"b"])
    hexpire(ks, b"h", NOW - 1, "", [b"c"])
    clock.now = NOW + 11
    ks.hash(b"h")  # reclaims a: an HDEL in the log
    full = Recorder()
    full.records = [
        SetFields(b"h", ((b"a", b"1"), (b"b", b"2"), (b"c", b"3"))),
        *rec.records,
    ]
    again = replayed(full, clock)
    assert again.hash(b"h") == {b"b": b"2"}
    assert httl(again, b"n", [b"i"]) == [NOW + 50]
    assert again.hash(b"n") == {b"i": b"6"}
    snap = Recorder()
    snap.records = list(ks.dump())
    restored = replayed(snap, clock)
    assert httl(restored, b"n", [b"i"]) == [NOW + 50]
    assert restored.used_bytes == ks.used_bytes


def test_the_record_format_checks_its_counts() -> None:
    m = SetFieldTTLs(b"k", ((b"f", NOW),), ((b"g", b"v"),))
    op, parts = kf.encode(m)
    raw = b"".join(bytes(p) for p in parts)
    assert op == 31 and kf.decode(op, raw) == m
    assert kf.describe(op, raw) == "HFIELDTTL"
    for bad in (raw[:-1], raw[:10] + b"\xff\xff\xff\x7f" + raw[14:]):
        try:
            kf.decode(op, bad)
        except FormatError:
            continue
        raise AssertionError("a damaged record was read")


def test_watch_sees_deadline_changes_and_field_expiry() -> None:
    ks, clock, _, _ = make()
    for change in (
        lambda: hexpire(ks, b"h", NOW + 10, "", [b"a"]),
        lambda: hpersist(ks, b"h", [b"a"]),
        lambda: hexpire(ks, b"h", NOW + 10, "", [b"b"]),
    ):
        token = WatchToken()
        ks.watchers.add(b"h", token)
        change()
        assert token.dirty
    token = WatchToken()
    ks.watchers.add(b"h", token)
    assert hpersist(ks, b"h", [b"c"]) == [-1] and not token.dirty  # nothing changed
    clock.now = NOW + 11
    ks.sweep(100)
    assert token.dirty
