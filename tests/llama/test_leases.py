"""A request owns its slot until its answer is done: real interleavings through the proxy,
made deterministic by the fake llama-server's gates (``support.fake_llama``).

Every test asserts outcomes, the fake's records and the counters of ``/pion/status``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.proxy import PrefixProxy, running_proxy
from support.fake_llama import FakeLlamaServer, fake_llama_server
from support.fake_llama_model import render_chat, tokenize
from support.fake_llama_proxy import (
    BYTES_PER_TOKEN,
    config_for,
    file_tokens,
    read_fake_slot_files,
    status,
    until,
)

MAIN = ""
SIDE = "You write a short title for the conversation."


def body(variant: str, question: str, **extra: Any) -> dict[str, Any]:
    """A Pi request (text mode: the prefix ends at Pi's marker); ``variant`` tells the
    main agent's system prompt from the title generator's."""
    return pi_chat_body(question, variant=variant, max_tokens=2, **extra)


@pytest.fixture(autouse=True)
def fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fake_slot_files(monkeypatch)


@pytest.fixture
def fake(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FakeLlamaServer]:
    n_slots = getattr(request, "param", 1)
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    with fake_llama_server(slot_dir, n_slots=n_slots, bytes_per_token=BYTES_PER_TOKEN) as server:
        yield server


class Call(threading.Thread):
    """One client request on its own thread."""

    def __init__(self, url: str, payload: dict[str, Any], path: str = "/v1/chat/completions"):
        super().__init__(daemon=True)
        self.url, self.payload, self.path = url, payload, path
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = httpx.post(self.url + self.path, json=self.payload, timeout=60)

    def result(self) -> httpx.Response:
        self.join(60)
        if self.response is None:
            raise AssertionError("no answer")
        return self.response


def test_side_request_waits_for_the_main_answer_on_one_slot(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """The bug of issue 30: a side request must not run, warm or be saved in the slot
    while the main request's answer is running there."""
    config = config_for(fake, tmp_path)
    held = fake.hold("chat", at="answer", skip=1)  # the main warm-up passes, its answer waits
    with running_proxy(PrefixProxy(config)) as url:
        main = Call(url, body(MAIN, "Fix the bug"))
        held.wait_arrived(2)
        side = Call(url, body(SIDE, "Title?"))
        until(lambda: status(url)["leases"]["waiting"] == 1)
        # While the main answer runs, the side request did nothing in the slot.
        assert len(fake.records_for("chat")) == 2
        assert [r.endpoint for r in fake.records if r.endpoint in ("save", "restore")] == ["save"]
        fake.unhold(held)
        assert main.result().status_code == 200
        assert side.result().status_code == 200
        until(lambda: status(url)["leases"]["held"] == {})  # the side's post-answer work
        final = status(url)
    assert final["counts"] == {"cold": 2}
    assert final["events"].get("saves_refused", 0) == 0
    assert final["events"]["lease_waits"] == 1
    assert final["leases"]["held"] == {} and final["leases"]["waiting"] == 0
    # Each file holds its own prefix: the main file the main warm-up, not the side's.
    chats = fake.records_for("chat")
    main_warm, side_warm = chats[0], chats[2]
    files = {name: file_tokens(fake, name) for name in final["files"]}
    assert len(files) == 2
    main_prompt = tokenize(render_chat(main_warm.body), add_special=True)
    side_prompt = tokenize(render_chat(side_warm.body), add_special=True)
    assert sorted(len(t) for t in files.values()) == sorted([len(main_prompt), len(side_prompt)])
    assert {tuple(t) for t in files.values()} == {tuple(main_prompt), tuple(side_prompt)}
    # Every warmed request ran pinned in the slot it leased.
    assert [r.id_slot for r in chats] == [0, 0, 0, 0]


def held_burst(url: str, fake: FakeLlamaServer, endpoint: str) -> dict[str, Any]:
    """Three requests for the same prefix on one slot: the first held at ``endpoint``
    until the other two wait for its lease, then let go. All answer 200; the status
    after them."""
    held = fake.hold(endpoint)
    first = Call(url, body(MAIN, "question 0"))
    held.wait_arrived(1)
    rest = [Call(url, body(MAIN, f"question {i}")) for i in (1, 2)]
    until(lambda: status(url)["leases"]["waiting"] == 2)
    fake.unhold(held)
    assert [c.result().status_code for c in (first, *rest)] == [200, 200, 200]
    return status(url)


def test_requests_queued_on_a_warming_slot_find_it_hot(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """A burst on one slot, while the first warms it: the queued requests found no slot
    known, so they asked no ``GET /slots`` (there is nothing a hit could trust yet);
    each then gets the lease once the one before it answered, and finds the prefix the
    first one warmed (a hit, no rebuild, no restore)."""
    config = config_for(fake, tmp_path)
    with running_proxy(PrefixProxy(config)) as url:
        final = held_burst(url, fake, "chat")  # the first warm-up waits before it runs
    assert final["counts"] == {"cold": 1, "hit": 2}
    assert fake.records_for("slots") == []
    assert fake.records_for("restore") == []
    assert "rebuilding" not in (tmp_path / "pc.log").read_text()


def test_requests_queued_behind_a_restore_find_it_hot(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """After a restart, a burst on one slot shares one ``GET /slots`` asked beside the
    renderings (the slot is known, so a hit must be checked); it shows the slot empty.
    The first request restores the prefix; that answer predates it, so it must not make
    the queued requests rebuild it: they are hits."""
    config = config_for(fake, tmp_path)
    with running_proxy(PrefixProxy(config)) as url:
        assert Call(url, body(MAIN, "before")).result().status_code == 200
        until(lambda: status(url)["leases"]["held"] == {})
        fake.restart()
        final = held_burst(url, fake, "slots")  # the burst's one GET /slots waits
    assert final["counts"] == {"cold": 1, "restored": 1, "hit": 2}
    assert len(fake.records_for("slots")) == 1
    assert len(fake.records_for("restore")) == 1


def responses(text: str) -> dict[str, Any]:
    """A Codex-style /v1/responses request (token mode: the boundary is learned)."""
    return {"model": "m", "instructions": TITLER, "input": text, "max_output_tokens": 2}


TITLER = "You write a short title for the conversation you are given. " * 8


@pytest.mark.parametrize("fake", [2], indirect=True)
def test_two_slots_serve_two_prefixes_at_once(fake: FakeLlamaServer, tmp_path: Path) -> None:
    config = config_for(fake, tmp_path, all_slots=True)
    held = fake.hold("chat", at="answer", skip=1)
    with running_proxy(PrefixProxy(config)) as url:
        main = Call(url, body(MAIN, "Fix the bug"))
        held.wait_arrived(2)
        # The side prefix takes the other slot while the main answer is held.
        side = Call(url, responses("Title this chat"), "/v1/responses").result()
        assert main.response is None  # still held
        fake.unhold(held)
        assert main.result().status_code == 200
        again = Call(url, responses("Title that chat"), "/v1/responses").result()
        final = status(url)
    assert side.status_code == 200 and again.status_code == 200
    assert final["counts"] == {"cold": 2, "hit": 1}
    assert final["events"].get("lease_waits", 0) == 0
    chats, runs = fake.records_for("chat"), fake.records_for("responses")
    warm_side = fake.records_for("completion")
    assert all(r.id_slot == r.slot for r in chats + runs + warm_side)
    main_slot, side_slot = chats[0].slot, warm_side[0].slot
    assert main_slot != side_slot
    # /v1/responses keeps id_slot: both side requests ran pinned in the side slot.
    assert [r.slot for r in runs] == [side_slot, side_slot]
    assert runs[-1].cache_n > 0


def test_lease_wait_is_bounded_then_passes_through_unwarmed(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    config = config_for(fake, tmp_path, lease_wait=0.05)
    held = fake.hold("chat", at="answer", skip=1)
    with running_proxy(PrefixProxy(config)) as url:
        main = Call(url, body(MAIN, "Fix the bug"))
        held.wait_arrived(2)
        side = Call(url, body(SIDE, "Title?"))
        # Forwarded unwarmed, unpinned; llama-server queues it behind the busy slot.
        until(lambda: status(url)["events"].get("lease_timeouts") == 1)
        fake.unhold(held)
        assert main.result().status_code == 200
        assert side.result().status_code == 200
        # The slot was used by an unpinned request since: the next hit checks /slots.
        third = Call(url, body(MAIN, "And now?")).result()
        final = status(url)
    assert third.status_code == 200
    assert final["events"]["lease_timeouts"] == 1
    assert final["leases"]["timeouts"] == 1
    assert final["counts"]["skipped"] == 1
    chats = fake.records_for("chat")
    assert chats[2].id_slot is None  # never pinned
    assert final["events"].get("saves_refused", 0) == 0


def test_restart_mid_answer_releases_the_lease(fake: FakeLlamaServer, tmp_path: Path) -> None:
    config = config_for(fake, tmp_path)
    held = fake.hold("chat", at="answer", skip=1)
    with running_proxy(PrefixProxy(config)) as url:
        first = Call(url, body(MAIN, "Fix the bug"))
        held.wait_arrived(2)
        fake.unhold(held)
        fake.restart()  # cuts the answer's connection if it is still open
        first.result()
        until(lambda: status(url)["leases"]["held"] == {})
        again = Call(url, body(MAIN, "Fix the bug")).result()
        final = status(url)
    assert again.status_code == 200
    # The slot was emptied by the restart: the prefix comes back from its file.
    assert final["outcomes"][-1]["kind"] in ("restored", "cold")
    assert final["leases"]["held"] == {}


def test_upstream_dying_mid_request_gives_502_and_releases(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    config = config_for(fake, tmp_path)
    with running_proxy(PrefixProxy(config)) as url:
        first = Call(url, body(MAIN, "Fix the bug")).result()
        fake.fail("chat", drop=True, times=1)  # the next real request: a hit, no warm-up
        second = Call(url, body(MAIN, "Again")).result()
        until(lambda: status(url)["leases"]["held"] == {})
        third = Call(url, body(MAIN, "Once more")).result()
        final = status(url)
    assert first.status_code == 200 and third.status_code == 200
    assert second.status_code == 502
    assert second.json()["error"]["code"] == 502
    assert final["upstream_errors"]["unreachable"] == 1
    assert final["events"]["upstream_failures"] == 1
    # Nothing is trusted after a failed upstream: the prefix comes back from its file.
    assert [o["kind"] for o in final["outcomes"]] == ["cold", "hit", "restored"]
    assert final["leases"]["held"] == {}


def test_client_that_hangs_up_releases_the_lease(fake: FakeLlamaServer, tmp_path: Path) -> None:
    config = config_for(fake, tmp_path)
    held = fake.hold("chat", at="answer", skip=1)
    with running_proxy(PrefixProxy(config)) as url:
        with (
            httpx.Client(timeout=httpx.Timeout(60, read=0.2)) as client,
            pytest.raises(httpx.ReadTimeout),
        ):
            client.post(url + "/v1/chat/completions", json=body(MAIN, "Fix", stream=True))
        held.wait_arrived(2)
        fake.unhold(held)
        until(lambda: status(url)["leases"]["held"] == {})
        after = Call(url, body(MAIN, "Next")).result()
        final = status(url)
    assert after.status_code == 200
    assert final["outcomes"][-1]["kind"] == "hit"
    assert final["leases"]["waiting"] == 0


def test_client_that_hangs_up_after_its_last_event_is_observed(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """Codex closes the connection once it has ``response.completed``, often before the
    proxy reads the stream's end: the answer (and its timings) was whole, so it is
    observed, not counted as a hang-up."""
    config = config_for(fake, tmp_path)
    held = fake.hold("responses", at="end")
    with running_proxy(PrefixProxy(config)) as url:
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", url + "/v1/responses", json={**responses("Title this"), "stream": True}
            ) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("event: response.completed"):
                    break
        held.wait_arrived(1)
        # The proxy saw the hang-up and closed its upstream request before the stream's end.
        until(lambda: fake.records_for("responses")[-1].cancelled)
        fake.unhold(held)
        until(lambda: status(url)["leases"]["held"] == {})
        final = status(url)
    assert final["events"].get("hung_up", 0) == 0
    assert "observed normal request: prompt_n=" in (tmp_path / "pc.log").read_text()


def test_slow_cold_warm_up_beside_hits(tmp_path: Path) -> None:
    """-np 2: a cold warm-up held in one slot never delays hits in the other."""
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    with fake_llama_server(slot_dir, n_slots=2, bytes_per_token=BYTES_PER_TOKEN) as fake:
        config = config_for(fake, tmp_path, all_slots=True)
        with running_proxy(PrefixProxy(config)) as url:
            assert Call(url, body(MAIN, "one")).result().status_code == 200
            warm = fake.hold("completion", at="start")  # the titler's warm-up stops
            slow = Call(url, responses("Title this chat"), "/v1/responses")
            warm.wait_arrived(1)
            hits = [Call(url, body(MAIN, f"turn {i}")).result() for i in range(2)]
            assert slow.response is None
            fake.unhold(warm)
            assert slow.result().status_code == 200
            final = status(url)
    assert [r.status_code for r in hits] == [200, 200]
    assert final["counts"] == {"cold": 2, "hit": 2}


@pytest.mark.parametrize("fake", [2], indirect=True)
def test_messages_are_not_pinned_and_lease_every_slot(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    config = config_for(fake, tmp_path, all_slots=True)
    messages = {
        "model": "m",
        "system": "You are the main coding agent. Follow the rules. " * 12,
        "messages": [{"role": "user", "content": "Fix the bug"}],
        "max_tokens": 2,
    }
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        first = Call(url, messages, "/v1/messages").result()
        more = {**messages, "messages": [{"role": "user", "content": "More"}]}
        second = Call(url, more, "/v1/messages").result()
        # The lease ends after the answer is relayed (its observation runs first).
        assert proxy.flush()
        final = status(url)
    assert first.status_code == 200 and second.status_code == 200
    runs = fake.records_for("messages")
    assert [r.id_slot for r in runs] == [None, None]  # llama-server drops id_slot there
    warmed = fake.records_for("completion")[0].slot
    assert [r.slot for r in runs] == [warmed, warmed]
    assert runs[1].cache_n > 0
    assert final["counts"]["hit"] == 1
    assert final["leases"]["held"] == {}
