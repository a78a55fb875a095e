"""Slot routing: ``--slots`` parsing and the LRU claim table (pure units)."""

from __future__ import annotations

import threading

import pytest

from pion.llama.slots import MAX_SLOT_ID, SlotTable, parse_slots


def test_parse_slots() -> None:
    assert parse_slots("0,1,2") == (0, 1, 2)
    assert parse_slots(" 3 , 1 ") == (3, 1)
    assert parse_slots("ALL") is None
    for bad in ("", "a", "0,,1", "-1", "1,1", "0;1", f"{MAX_SLOT_ID + 1}", "1.5"):
        with pytest.raises(ValueError):
            parse_slots(bad)


def test_claims_fill_free_slots_then_evict_the_least_recently_used() -> None:
    table = SlotTable((0, 1, 2))
    assert table.claim("a") == (0, None)
    assert table.claim("b") == (1, None)
    assert table.claim("c") == (2, None)
    assert table.claim("a") == (0, None)  # a is now the most recent
    assert table.lru_order() == [1, 2, 0]
    assert table.claim("d") == (1, "b")  # b was least recently used
    assert table.claim("b") == (2, "c")
    assert table.lru_order() == [0, 1, 2]
    claim = table.holder(1)
    assert claim is not None and claim.fingerprint == "d"


def test_pin_moves_a_prefix_and_reports_what_it_replaced() -> None:
    table = SlotTable((0, 1))
    table.claim("a", "label a")
    assert table.pin(1, "a") is None  # moved from 0 to 1
    assert table.holder(0) is None
    holder = table.holder(1)
    assert holder is not None and holder.fingerprint == "a"
    assert table.pin(1, "b") == "a"
    assert table.pin(1, "b") is None


def test_concurrent_new_prefixes_get_distinct_slots() -> None:
    table = SlotTable(tuple(range(8)))
    got: list[int] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        slot, evicted = table.claim(f"fp{i}")
        assert evicted is None
        with lock:
            got.append(slot)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(8))


def test_a_table_needs_a_slot() -> None:
    with pytest.raises(ValueError):
        SlotTable(())
