"""Which llama-server of a fleet a request goes to (``pion.llama.route``): the routing
order on plain snapshots, no server involved."""

from __future__ import annotations

from typing import Any

from pion.llama.route import Route, ServerView, route

A, B, C = "http://a", "http://b", "http://c"


def view(name: str, order: int, slots: int = 2, **kwargs: Any) -> ServerView:
    return ServerView(name, order, slots, **kwargs)


def test_no_server_no_route() -> None:
    assert route([], in_store=True) is None


def test_the_server_holding_the_prefix_wins_even_when_busier() -> None:
    views = [view(A, 0), view(B, 1, held_tokens=900, busy=1, claimed=2)]
    assert route(views, in_store=True) == Route(B, "hit")


def test_the_longest_held_prefix_wins_then_the_least_loaded() -> None:
    views = [
        view(A, 0, held_tokens=500),
        view(B, 1, held_tokens=900, busy=2),
        view(C, 2, held_tokens=900, busy=1),
    ]
    assert route(views, in_store=False) == Route(C, "hit")


def test_a_server_with_the_file_restores_before_a_pull_or_a_cold_build() -> None:
    views = [view(A, 0), view(B, 1, has_file=True, busy=1)]
    assert route(views, in_store=True) == Route(B, "restore")


def test_among_servers_with_the_file_the_last_placement_wins() -> None:
    views = [view(A, 0, has_file=True), view(B, 1, has_file=True, busy=1, last_placed=True)]
    assert route(views, in_store=False) == Route(B, "restore")


def test_in_the_store_the_least_loaded_pulls_it() -> None:
    views = [view(A, 0, busy=2), view(B, 1, busy=1), view(C, 2, busy=1, queued=1)]
    assert route(views, in_store=True) == Route(B, "pull")


def test_nowhere_the_least_loaded_warms_it_cold() -> None:
    views = [view(A, 0, busy=1), view(B, 1)]
    assert route(views, in_store=False) == Route(B, "cold")


def test_load_is_per_slot() -> None:
    """Two busy slots of eight is less loaded than one of two."""
    views = [view(A, 0, busy=1, slots=2), view(B, 1, busy=2, slots=8)]
    assert route(views, in_store=False) == Route(B, "cold")


def test_a_server_with_an_empty_slot_evicts_nothing() -> None:
    views = [view(A, 0, claimed=2), view(B, 1, claimed=1)]
    assert route(views, in_store=False) == Route(B, "cold")


def test_ties_go_to_the_first_upstream() -> None:
    views = [view(B, 1), view(A, 0)]
    assert route(views, in_store=False) == Route(A, "cold")


def test_a_busy_holder_gives_way_to_a_spare_server_that_restores_it() -> None:
    """Two sessions of one agent share its prefix: while the slot holding it serves one,
    the other is restored on a server with a spare slot instead of queueing."""
    views = [view(A, 0, held_tokens=900, held_busy=True, busy=1), view(B, 1, has_file=True)]
    assert route(views, in_store=False) == Route(B, "restore")


def test_a_busy_holder_gives_way_to_a_pull_when_the_store_has_it() -> None:
    views = [view(A, 0, held_tokens=900, held_busy=True, busy=1), view(B, 1)]
    assert route(views, in_store=True) == Route(B, "pull")


def test_a_busy_holder_is_waited_for_rather_than_a_cold_build() -> None:
    views = [view(A, 0, held_tokens=900, held_busy=True, busy=1), view(B, 1)]
    assert route(views, in_store=False) == Route(A, "hit")


def test_a_busy_holder_is_waited_for_when_no_server_has_a_spare_slot() -> None:
    views = [
        view(A, 0, held_tokens=900, held_busy=True, busy=1, slots=1),
        view(B, 1, has_file=True, busy=1, slots=1),
    ]
    assert route(views, in_store=True) == Route(A, "hit")


def test_an_idle_holder_beats_a_busy_one_with_more_tokens() -> None:
    views = [view(A, 0, held_tokens=900, held_busy=True, busy=1), view(B, 1, held_tokens=800)]
    assert route(views, in_store=True) == Route(B, "hit")
