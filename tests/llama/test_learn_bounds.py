"""pion.llama.learn's memory bounds: harness keys come from a header the client chooses,
so neither many keys nor big prompts may grow the learner without bound."""

from __future__ import annotations

import struct
import tracemalloc
from array import array

import pytest

from pion.llama.learn import MAX_KEYS, BoundaryLearner, common_prefix


def test_thousands_of_user_agents_with_big_prompts_stay_within_budget() -> None:
    budget = 4 * 1024 * 1024
    learner = BoundaryLearner(max_bytes=budget)
    body = array("i", range(1, 32_000)).tobytes()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            # 32k tokens, the first one distinct, built from bytes: tracing 8M int
            # objects would take minutes.
            tokens = array("i", struct.pack("<i", -i) + body)
            learned = learner.boundary(f"agent-{i}/1.0 (fuzz)", tokens)
            assert learned.how == "new"
            assert learner.bytes_used() <= budget
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    keys = learner.keys()
    assert len(keys) <= MAX_KEYS
    assert keys[-1] == "agent-999/1.0 (fuzz)"  # the most recent stay
    # 1000 x 32k tokens were offered (128 MB; the 64 keys kept would hold 8 MB): the
    # learner keeps its budget plus bookkeeping.
    assert held < 2 * budget


def test_one_prompt_bigger_than_the_budget_keeps_its_head() -> None:
    learner = BoundaryLearner(max_bytes=64 * 1024)  # 16k tokens
    huge = list(range(100_000))
    assert learner.boundary("ua", huge).tokens == 100_000
    assert learner.bytes_used() <= 64 * 1024
    assert learner.families("ua") == [4096]  # a quarter of the budget
    # The next session of that harness still learns its shared head.
    again = learner.boundary("ua", [*range(3000), -1, -2])
    assert (again.tokens, again.how) == (3000, "learned")


def test_older_families_of_least_recent_keys_go_first() -> None:
    learner = BoundaryLearner(min_tokens=4, max_bytes=4 * 1000)  # 1000 tokens
    learner.boundary("old", list(range(400)))
    learner.boundary("new", list(range(10_000, 10_400)))
    assert learner.keys() == ["old", "new"]
    learner.boundary("new", list(range(20_000, 20_400)))  # 1200 tokens: over
    assert learner.keys() == ["new"] and learner.families("new") == [400, 400]


def test_common_prefix_across_sequence_kinds() -> None:
    a = array("i", range(1000))
    b = [*range(700), 5, 6]
    assert common_prefix(a, b) == common_prefix(b, a) == common_prefix(list(a), b) == 700
    assert common_prefix(a, array("q", range(600))) == 600


def test_bad_budgets_are_refused() -> None:
    with pytest.raises(ValueError):
        BoundaryLearner(max_keys=0)
    with pytest.raises(ValueError):
        BoundaryLearner(max_bytes=1)
