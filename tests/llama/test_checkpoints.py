"""Whole conversations kept: a checkpoint of the conversation saved after an answer, and the
longest one restored after a llama-server restart (``pion.llama.checkpoint``), through the
proxy in front of the fake llama-server (``support.fake_llama``).

Assertions are on the fake's records, the slot dir's ``index.json`` and the counters of
``/pion/status``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.proxy import PrefixProxy, running_proxy
from support.fake_llama import FakeLlamaServer, fake_llama_server
from support.fake_llama_http import Record
from support.fake_llama_model import prompt_tokens
from support.fake_llama_proxy import (
    BYTES_PER_TOKEN,
    config_for,
    file_tokens,
    read_fake_slot_files,
    status,
    until,
)


@pytest.fixture(autouse=True)
def fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fake_slot_files(monkeypatch)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeLlamaServer]:
    with fake_llama_server(tmp_path / "slots", bytes_per_token=BYTES_PER_TOKEN) as server:
        yield server


SYSTEM = "You are the main coding agent. Follow the rules and use the tools. " * 8
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def user_turn(turn: int, words: int = 40, tag: str = "") -> str:
    return " ".join(f"{WORDS[(turn + i) % len(WORDS)]}{tag}{turn}" for i in range(words))


class Conversation:
    """One Claude-Code-shaped session on ``/v1/messages``: each turn is the previous
    conversation, its answer, and a new user message."""

    def __init__(self, agent: str = "claude-cli/2.0", words: int = 40, tag: str = "") -> None:
        self.agent, self.words, self.tag = agent, words, tag
        self.messages: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []

    def body(self) -> dict[str, Any]:
        return {"model": "m", "system": SYSTEM, "messages": list(self.messages), "max_tokens": 2}

    def turn(self, url: str) -> dict[str, Any]:
        self.messages.append(
            {"role": "user", "content": user_turn(len(self.sent), self.words, self.tag)}
        )
        body = self.body()
        self.sent.append(body)
        response = httpx.post(
            url + "/v1/messages", json=body, headers={"user-agent": self.agent}, timeout=60
        )
        assert response.status_code == 200
        answer: dict[str, Any] = response.json()
        text = "".join(part["text"] for part in answer["content"] if part["type"] == "text")
        self.messages.append({"role": "assistant", "content": text})
        return answer

    def tokens(self, turn: int) -> list[int]:
        return prompt_tokens("messages", self.sent[turn])


def index_files(fake: FakeLlamaServer) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = json.loads((fake.slot_dir / "index.json").read_text())[
        "files"
    ]
    return files


def checkpoints(fake: FakeLlamaServer) -> dict[str, dict[str, Any]]:
    return {name: e for name, e in index_files(fake).items() if e.get("prefix")}


class Restarted:
    """The turn taken after a llama-server restart: the records it caused, its answer and
    the status after it."""

    def __init__(self, records: list[Record], answer: dict[str, Any], after: dict[str, Any]):
        self.records, self.answer, self.after = records, answer, after

    def only_restored(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Assert the turn restored checkpoint ``name`` and warmed nothing cold; the
        status after it and its answer."""
        restored = [r for r in self.records if r.endpoint in ("restore", "completion")]
        assert [(r.endpoint, r.filename) for r in restored] == [("restore", name)]
        assert self.after["events"]["checkpoint_restores"] == 1
        return self.after, self.answer


def resume_after_a_restart(
    url: str, fake: FakeLlamaServer, turn: Callable[[str], dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[int], Restarted]:
    """Once the saves after the last answer are done: the status, the checkpoints and the
    saved one's tokens; then llama-server restarts and the conversation takes one turn."""
    until(lambda: status(url)["leases"]["held"] == {})  # the save after the answer
    before = status(url)
    saved = checkpoints(fake)
    held = file_tokens(fake, next(iter(saved)))
    fake.restart()
    n_records = len(fake.records)
    answer = turn(url)
    return before, saved, held, Restarted(fake.records[n_records:], answer, status(url))


def test_resumed_conversation_restores_its_last_checkpoint(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    """Five turns, llama-server restarted, the sixth turn: the fifth turn's checkpoint is
    restored and the sixth request computes only its new turn."""
    config = config_for(fake, tmp_path, checkpoint_tokens=16)
    chat = Conversation()
    with running_proxy(PrefixProxy(config)) as url:
        for _ in range(5):
            chat.turn(url)
        before, saved, held, restarted = resume_after_a_restart(url, fake, chat.turn)
    # Turn 2 took over the prefix and saved it from the slot as it was: that file holds the
    # whole second turn. Turns 3..5 each grew past the threshold; each checkpoint replaced
    # the one before.
    assert before["events"]["checkpoints_saved"] == 3
    assert len(saved) == 1
    (name, entry) = next(iter(saved.items()))
    fifth, sixth = chat.tokens(4), chat.tokens(5)
    assert held[: len(fifth)] == fifth  # the whole fifth request, then its answer
    assert entry["tokens"] >= len(fifth) and entry["file_tokens"] == len(held)
    # After the restart: the checkpoint is restored, nothing is warmed cold.
    after, answer = restarted.only_restored(name)
    assert after["counts"].get("cold", 0) == before["counts"].get("cold", 0)
    cached = answer["usage"]["cache_read_input_tokens"]
    # Every token of the fifth request but its last (the generation prompt, rendered anew
    # once the answer follows it), and the answer: only the new turn is computed.
    assert len(fifth) - 1 <= cached < len(sixth)
    assert fake.records_for("messages")[-1].cache_n == cached


class PiConversation:
    """One Pi session on ``/v1/chat/completions``: its system prompt holds Pi's boundary
    marker (text mode: the proxy renders nothing on the way); each turn is the previous
    conversation, its answer, and a new user message."""

    def __init__(self) -> None:
        self.base = pi_chat_body("", max_tokens=2)
        self.system = self.base["messages"][0]
        self.messages: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []

    def turn(self, url: str) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": user_turn(len(self.sent))})
        body = {**self.base, "messages": [self.system, *self.messages]}
        self.sent.append(body)
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200
        answer: dict[str, Any] = response.json()
        self.messages.append(answer["choices"][0]["message"])
        return answer

    def tokens(self, turn: int) -> list[int]:
        return prompt_tokens("chat", self.sent[turn])


def test_a_pi_conversation_is_checkpointed_and_restored(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    """A Pi-marker prefix (text mode) keeps its conversation too: its tokens are asked for
    after an answer that grew it past the threshold, not on the way, and a restarted
    llama-server gets the last checkpoint back."""
    config = config_for(fake, tmp_path, checkpoint_tokens=16)
    chat = PiConversation()
    with running_proxy(PrefixProxy(config)) as url:
        chat.turn(url)
        until(lambda: status(url)["leases"]["held"] == {})
        seen = len(fake.records)
        chat.turn(url)  # a hit: nothing rendered before the request
        until(lambda: status(url)["leases"]["held"] == {})
        second = [r.endpoint for r in fake.records[seen:]]
        for _ in range(2):
            chat.turn(url)
        before, saved, held, restarted = resume_after_a_restart(url, fake, chat.turn)
    # The hit asked nothing before the request; after its answer, its tokens (rendered,
    # tokenized), then the checkpoint's save.
    assert second[: second.index("chat") + 1] == ["slots", "chat"]
    assert second[second.index("chat") + 1 :] == ["apply-template", "tokenize", "save"]
    # Every turn grew past the threshold (the first too: its user turn follows the
    # prefix); each checkpoint replaced the one before.
    assert before["events"]["checkpoints_saved"] == 4
    assert len(saved) == 1
    (name, entry) = next(iter(saved.items()))
    fourth, fifth = chat.tokens(3), chat.tokens(4)
    assert held[: len(fourth)] == fourth and entry["tokens"] >= len(fourth)
    after, answer = restarted.only_restored(name)
    assert after["outcomes"][-1]["kind"] == "restored"
    cached = answer["timings"]["cache_n"]
    assert len(fourth) - 1 <= cached < len(fifth)


def test_checkpoints_are_rate_limited_by_new_tokens(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    """A checkpoint only once the conversation grew by ``checkpoint_tokens`` past the
    longest file that holds its start: with a threshold between one and two turns' growth,
    every second turn."""
    config = config_for(fake, tmp_path, checkpoint_tokens=60)
    chat = Conversation(words=40)
    saved: list[int] = []
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        for _ in range(5):
            chat.turn(url)
            assert proxy.flush(60)  # the checkpoint is saved after the answer went back
            saved.append(status(url)["events"].get("checkpoints_saved", 0))
        skipped = status(url)["events"].get("checkpoints_skipped", 0)
    growth = [len(chat.tokens(i + 1)) - len(chat.tokens(i)) for i in range(4)]
    assert all(30 < g < 60 for g in growth)  # one turn is under the threshold, two over
    # Turn 1 is the prefix itself; the prefix's file saved after turn 2 holds turn 2; turn
    # 4 grew by two turns past it, turn 5 by one past turn 4's checkpoint.
    assert saved == [0, 0, 0, 1, 1]
    assert skipped == 3
    (name,) = checkpoints(fake)  # turn 4's
    assert file_tokens(fake, name)[: len(chat.tokens(3))] == chat.tokens(3)


def test_no_checkpoints_when_turned_off(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    config = config_for(fake, tmp_path, checkpoint_tokens=0)
    chat = Conversation()
    with running_proxy(PrefixProxy(config)) as url:
        for _ in range(3):
            chat.turn(url)
        events = status(url)["events"]
    assert checkpoints(fake) == {}
    assert "checkpoints_saved" not in events and "checkpoints_skipped" not in events


def test_budget_eviction_keeps_the_newest(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    """Checkpoints share the slot-file budget, least recently used first: three
    conversations of three turns (two prefix files and a checkpoint each), four kept."""
    config = config_for(fake, tmp_path, checkpoint_tokens=16, max_files=4)
    chats = [Conversation(agent=f"agent-{i}/1.0", tag=f"x{i}") for i in range(3)]
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        for chat in chats:
            for _ in range(3):
                chat.turn(url)
        assert proxy.flush(60)  # the last checkpoint is saved after its answer went back
        events = status(url)["events"]
    assert events["checkpoints_saved"] == 3
    files = index_files(fake)
    assert len(files) == 4
    # The most recently used: the last conversation's three files (its checkpoint the
    # newest) and the prefix file of the one before that its partial restore used.
    assert sorted(e["harness"] for e in files.values()) == ["agent-1/1.0"] + ["agent-2/1.0"] * 3
    ((name, entry),) = checkpoints(fake).items()
    assert entry["harness"] == "agent-2/1.0"
    assert entry["created"] == max(e["created"] for e in files.values())
    last = chats[2].tokens(2)
    assert file_tokens(fake, name)[: len(last)] == last
    on_disk = {p.name for p in fake.slot_dir.glob("pi-prefix-*.bin")}
    assert on_disk == set(files)


def test_checkpoint_save_racing_another_request_is_refused(
    fake: FakeLlamaServer,
    tmp_path: Path,
) -> None:
    """Another client of llama-server runs in the slot between the answer and the
    checkpoint's save: the file is refused (deleted, counted), never named or indexed."""
    config = config_for(fake, tmp_path, checkpoint_tokens=16)
    chat = Conversation()
    intruder = {"prompt": "something else entirely " * 20, "id_slot": 0, "n_predict": 1}
    with running_proxy(PrefixProxy(config)) as url:
        chat.turn(url)  # turn 1: the prefix's own file is saved
        chat.turn(url)  # turn 2: a shorter prefix taken over, saved as the slot holds it
        held = fake.hold("save", at="start")
        second = threading.Thread(target=chat.turn, args=(url,), daemon=True)
        second.start()
        held.wait_arrived(1)  # the answer is delivered, the checkpoint's save waits
        assert httpx.post(fake.url + "/completion", json=intruder, timeout=30).status_code == 200
        fake.unhold(held)
        second.join(60)
        until(lambda: status(url)["leases"]["held"] == {})
        events = status(url)["events"]
    assert events["saves_refused"] == 1
    assert "checkpoints_saved" not in events
    assert checkpoints(fake) == {}
    assert not list(fake.slot_dir.glob("pion-saving-*"))
    other = prompt_tokens("completion", intruder)
    for name in index_files(fake):
        assert file_tokens(fake, name)[: len(other)] != other


@pytest.mark.parametrize("words", [40])
def test_checkpoint_is_not_a_learning_seed(
    fake: FakeLlamaServer,
    tmp_path: Path,
    words: int,
) -> None:
    """A restarted proxy seeds its boundary learner from the saved prefixes, never from a
    checkpoint (a whole conversation would become the "stable prefix")."""
    config = config_for(fake, tmp_path, checkpoint_tokens=16)
    chat = Conversation(words=words)
    with running_proxy(PrefixProxy(config)) as url:
        for _ in range(3):
            chat.turn(url)
    assert len(checkpoints(fake)) == 1
    with running_proxy(PrefixProxy(config)) as url:
        chat.turn(url)
        final = status(url)
    # The third turn's prefix is seeded by the prefix files (the second one holds the
    # second turn), never by the checkpoint of the whole third turn.
    outcome = final["outcomes"][-1]
    assert outcome["tokens"] < len(chat.tokens(1)) < len(chat.tokens(2))


def test_checkpoint_pulled_from_the_store_on_another_machine(
    tmp_path: Path, pion_store: Any
) -> None:
    """Machine A saves a checkpoint of a conversation, pushes it and lists it under its
    prefix in the store; machine B (its own llama-server and slot dir, the same harness:
    the same learned prefix) resumes the conversation: it pulls the checkpoint, verified,
    and computes only the new turn."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    chat = Conversation()
    with fake_llama_server(tmp_path / "a", bytes_per_token=BYTES_PER_TOKEN) as fake_a:
        config_a = config_for(fake_a, tmp_path, checkpoint_tokens=16, store=store)
        proxy_a = PrefixProxy(config_a)
        with running_proxy(proxy_a) as url:
            for _ in range(3):
                chat.turn(url)
            until(lambda: status(url)["leases"]["held"] == {})
            assert proxy_a.flush(60)  # pushed and listed
        (saved,) = checkpoints(fake_a)
    with fake_llama_server(tmp_path / "b", bytes_per_token=BYTES_PER_TOKEN) as fake_b:
        config_b = config_for(fake_b, tmp_path / "b", checkpoint_tokens=16, store=store)
        with running_proxy(PrefixProxy(config_b)) as url:
            first = chat.sent[0]
            response = httpx.post(
                url + "/v1/messages", json=first, headers={"user-agent": chat.agent}, timeout=60
            )
            assert response.status_code == 200
            fake_b.restart()  # B's slot no longer holds what it warmed
            n_records = len(fake_b.records)
            answer = chat.turn(url)
            final = status(url)
        events, outcome = final["events"], final["outcomes"][-1]
        resumed = fake_b.records[n_records:]
        assert [r.filename for r in resumed if r.endpoint == "restore"] == [saved]
        assert not [r for r in resumed if r.endpoint == "completion"]  # nothing warmed cold
        # Pulled: the first turn's prefix file (B's first request), then the checkpoint.
        assert events["checkpoint_restores"] == 1 and events["store_pulls"] == 2
        assert (outcome["kind"], outcome["tier"], outcome["file"]) == ("restored", "store", saved)
    third, fourth = chat.tokens(2), chat.tokens(3)
    assert len(third) - 1 <= answer["usage"]["cache_read_input_tokens"] < len(fourth)
