"""A slot that already holds a shorter prefix at its start is a hit.

When a learned boundary moves back (a harness's second session shares all but its prompt
with the first, whose whole prompt was warmed), the new, shorter prefix has a fingerprint
of its own, but the slot already holds its tokens. The warmer must route to that slot and
count a hit: no eviction, no restore, no warm-up. The shorter prefix's own file is saved
from the slot in the background once a real request has confirmed the reuse, and checked
to start with the prefix's tokens; after a llama-server restart it restores in full.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.launcher import LlamaServerProcess

from pion.llama.client import LlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.context import SlotState
from pion.llama.fingerprint import file_name
from pion.llama.index import SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import WarmRequest
from pion.llama.slotfile import read_tokens
from pion.llama.timings import Timings
from support import count, log_lines

from .blocking import BlockingWarmer
from .conftest import StartServer

pytestmark = pytest.mark.llama

MakeConfig = Callable[..., WarmerConfig]

STABLE = " ".join(
    f"Rule {i}: keep the change small, explain it, and run the tests." for i in range(30)
)


def test_holds_start_of() -> None:
    state = SlotState("fp", 5, "warm-up", 0.0, prompt=(1, 2, 3, 4, 5))
    assert state.holds_start_of((1, 2, 3))
    assert state.holds_start_of((1, 2, 3, 4, 5))
    assert not state.holds_start_of((1, 2, 3, 4, 5, 6))  # longer than what is held
    assert not state.holds_start_of((1, 2, 9))
    assert not state.holds_start_of(())
    assert not state.holds_start_of(None)  # text mode
    assert not SlotState("fp", 5, "warm-up", 0.0).holds_start_of((1, 2))


def tokens_of(server: LlamaServerProcess, text: str) -> tuple[int, ...]:
    with LlamaClient(server.url) as client:
        return tuple(client.tokenize(text, add_special=True))


def request(tokens: tuple[int, ...]) -> WarmRequest:
    return WarmRequest(prefix=STABLE, harness="test-harness", tokens=tokens)


def real(server: LlamaServerProcess, prompt: list[Any], slot: int | None = None) -> Timings:
    """A real request, as a harness would send it after the warmer's work."""
    body: dict[str, Any] = {"prompt": prompt, "n_predict": 1, "cache_prompt": True}
    if slot is not None:
        body["id_slot"] = slot
    resp = httpx.post(server.url + "/completion", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    found = Timings.from_json(resp.json())
    assert found is not None
    return found


def session(
    warmer: BlockingWarmer, server: LlamaServerProcess, prefix: tuple[int, ...], rest: str
) -> tuple[Outcome, Timings]:
    outcome = warmer.ensure(request(prefix))
    timings = real(server, [*prefix, rest], outcome.slot if warmer.config.multi_slot else None)
    warmer.observe(outcome, timings)
    return outcome, timings


def test_shorter_prefix_in_the_slot_is_a_hit_then_saved_and_restored(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    whole = tokens_of(llama_server, STABLE + "\nQuestion: what is in the README?")
    shared = tokens_of(llama_server, STABLE)
    assert whole[: len(shared)] == shared and len(whole) > len(shared)
    with BlockingWarmer(config) as warmer:
        first, _ = session(warmer, llama_server, whole, "")
        second, timings = session(warmer, llama_server, shared, "\nQuestion: fix the test.")
        assert warmer.flush(60)
        llama_server.restart()
        third, after = session(warmer, llama_server, shared, "\nQuestion: rename it.")
    assert first.kind == "cold" and first.saved
    assert second.kind == "hit" and second.tokens == len(shared)
    assert second.fingerprint != first.fingerprint
    assert timings.cache_n >= 0.9 * len(shared)
    lines = log_lines(config.log_path)
    # The hit did no work on the slot: one warm-up (session 1), no restore, no eviction.
    assert count(lines, "warm-up done") == 1
    assert count(lines, "EVICT") == 0
    assert count(lines, f"cache=HIT (slot 0 holds this prefix of {len(shared)} tok") == 1
    # Its own file, saved after the real request: it starts with the prefix's tokens.
    name = file_name(second.fingerprint)
    entry = SlotIndex(slot_dir).get(name)
    assert entry is not None and entry.tokens == len(shared)
    held = read_tokens(slot_dir / name)
    assert held is not None and held[: len(shared)] == shared
    assert (slot_dir / file_name(first.fingerprint)).is_file()  # the first file stays
    # After the restart: restored from that file, in full, and reused.
    assert third.kind == "restored" and third.file == name
    assert after.cache_n >= 0.9 * len(shared)


def test_a_slot_changed_before_the_save_is_not_saved(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    whole = tokens_of(llama_server, STABLE + "\nQuestion: what is in the README?")
    shared = tokens_of(llama_server, STABLE)
    with BlockingWarmer(config) as warmer:
        session(warmer, llama_server, whole, "")
        second = warmer.ensure(request(shared))
        timings = real(llama_server, [*shared, "\nQuestion: fix the test."])
        # Another client takes the slot before the save runs.
        real(llama_server, list(tokens_of(llama_server, "Something else entirely. " * 20)), 0)
        warmer.observe(second, timings)
        assert warmer.flush(60)
        events = warmer.status()["events"]
    assert second.kind == "hit"
    name = file_name(second.fingerprint)
    assert SlotIndex(slot_dir).get(name) is None and not (slot_dir / name).exists()
    # Checked before it was named: the scratch save was refused and deleted.
    assert events["saves_refused"] == 1
    assert not list(slot_dir.glob("pion-saving-*"))


def test_a_different_prefix_is_no_hit(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    first = tokens_of(llama_server, STABLE + "\nQuestion: what is in the README?")
    other = tokens_of(llama_server, STABLE.replace("Rule 29", "Law 29"))
    with BlockingWarmer(config) as warmer:
        session(warmer, llama_server, first, "")
        outcome, _ = session(warmer, llama_server, other, "\nQuestion: fix the test.")
    # It shares most of the saved prefix: restored in part, then warmed; not a hit.
    assert outcome.kind == "partial"
    assert count(log_lines(config.log_path), "warm-up done") == 2


def test_with_several_slots_the_shorter_prefix_goes_to_the_slot_holding_it(
    start_server: StartServer, tiny_model: Path, make_config: MakeConfig
) -> None:
    server = start_server(tiny_model, parallel=2)
    config = make_config(server, slots=(0, 1))
    whole = tokens_of(server, STABLE + "\nQuestion: what is in the README?")
    other = tokens_of(server, "A different agent. " * 40)
    shared = tokens_of(server, STABLE)
    with BlockingWarmer(config) as warmer:
        a, _ = session(warmer, server, whole, "")
        b, _ = session(warmer, server, other, "")
        c, timings = session(warmer, server, shared, "\nQuestion: fix the test.")
        assert warmer.flush(60)
        d, _ = session(warmer, server, other, "\nAgain.")
    assert (a.kind, b.kind, c.kind, d.kind) == ("cold", "cold", "hit", "hit")
    assert a.slot != b.slot and c.slot == a.slot and d.slot == b.slot
    assert timings.cache_n >= 0.9 * len(shared)
    assert count(log_lines(config.log_path), "EVICT") == 0
