"""Units of the boundary learner: what successive requests of one harness share."""

from __future__ import annotations

import random

from pion.llama.learn import MAX_FAMILIES, BoundaryLearner, common_prefix

SYSTEM = list(range(1000, 1600))  # 600 stable tokens


def request(*tail: int, date: int = 7) -> list[int]:
    return [*SYSTEM[:500], date, *SYSTEM[500:], *tail]


def test_common_prefix() -> None:
    rng = random.Random(1)
    for _ in range(200):
        a = [rng.randrange(4) for _ in range(rng.randrange(600))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(50))]
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix(a, b) == expected


def test_first_request_is_its_whole_prompt_then_shrinks_to_what_sessions_share() -> None:
    learner = BoundaryLearner()
    first = learner.boundary("pi", request(1, 2, 3))
    assert (first.tokens, first.how) == (604, "new")
    second = learner.boundary("pi", request(9, 9))
    assert (second.tokens, second.how) == (601, "learned")
    # A prompt after the boundary no longer moves it; the family stays.
    assert learner.boundary("pi", request(5)).tokens == 601
    assert learner.families("pi") == [601]


def test_the_next_turn_of_a_conversation_keeps_the_boundary() -> None:
    learner = BoundaryLearner()
    learner.boundary("cc", request(1))
    learner.boundary("cc", request(2))
    turn2 = learner.boundary("cc", request(2, 50, 51, 52))
    assert turn2.tokens == 601


def test_a_date_before_the_cut_moves_the_boundary_to_it() -> None:
    learner = BoundaryLearner()
    learner.boundary("pi", request(1, date=7))
    learner.boundary("pi", request(2, date=7))
    assert learner.boundary("pi", request(2, date=8)).tokens == 500
    assert learner.boundary("pi", request(3, date=9)).tokens == 500


def test_unrelated_prompts_start_their_own_family() -> None:
    learner = BoundaryLearner(min_tokens=32)
    learner.boundary("cc", request(1))
    other = [5] * 100
    assert learner.boundary("cc", other).how == "new"
    assert sorted(learner.families("cc")) == [100, 602]
    # Each family keeps learning on its own.
    assert learner.boundary("cc", [5] * 80 + [6] * 20).tokens == 80
    assert learner.boundary("cc", request(2)).tokens == 601
    assert sorted(learner.families("cc")) == [80, 601]


def test_short_or_small_shares_do_not_shrink_a_family() -> None:
    learner = BoundaryLearner(min_tokens=32, min_share=0.5)
    learner.boundary("k", request(1))
    # 20 shared tokens (< min_tokens), and 250 of 601 (< half): new families.
    assert learner.boundary("k", SYSTEM[:20] + [0] * 50).how == "new"
    assert learner.boundary("k", SYSTEM[:250] + [0] * 50).how == "new"
    assert learner.families("k") == [300, 70, 602]


def test_keys_are_separate_and_families_bounded() -> None:
    learner = BoundaryLearner(min_tokens=4)
    learner.boundary("a", request(1))
    assert learner.boundary("b", request(2)).how == "new"
    for i in range(MAX_FAMILIES + 3):
        learner.boundary("c", [i] * 50)
    assert len(learner.families("c")) == MAX_FAMILIES


def test_seeds_from_saved_prefixes_start_a_family() -> None:
    learner = BoundaryLearner()
    saved = [request(1, 2), [3] * 700]
    seeded = learner.boundary("codex", request(9), seeds=lambda: saved)
    assert (seeded.tokens, seeded.how) == (601, "seeded")
    assert learner.families("codex") == [601]
    # No seed shares enough: the whole prompt.
    assert learner.boundary("x", [8] * 90, seeds=lambda: saved).how == "new"
