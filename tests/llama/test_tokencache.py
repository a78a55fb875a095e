"""The token cache (``pion.llama.tokencache``): a rendering that starts with a prefix
tokenized before is not tokenized again. Units on the cache and on finding where a
prefix's tokens end in its text (the fake's tokenizer, :mod:`support.fake_llama_model`),
then the proxy in front of the fake llama-server, asserted on the fake's records."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.client import AsyncLlamaClient
from pion.llama.learn import BoundaryLearner
from pion.llama.proxy import PrefixProxy, running_proxy
from pion.llama.tokencache import (
    ENTRY_OVERHEAD,
    MAX_PREFIXES,
    LazyConversation,
    TokenCache,
    prefix_chars,
)
from support.fake_llama import FakeLlamaServer, fake_llama_server
from support.fake_llama_model import tokenize_pieces
from support.fake_llama_proxy import (
    BYTES_PER_TOKEN,
    config_for,
    read_fake_slot_files,
    status,
    until,
)

# -- the cache --------------------------------------------------------------------------


def test_the_longest_cached_prefix_is_found_per_identity_and_key() -> None:
    cache = TokenCache()
    cache.put("b1|model", "h|chat|m", "<|system|>\nrules", (1, 2, 3))
    cache.put("b1|model", "h|chat|m", "<|system|>\nrules and more", (1, 2, 3, 4, 5))
    found = cache.find("b1|model", "h|chat|m", "<|system|>\nrules and more, then a question")
    assert found is not None and found.tokens == (1, 2, 3, 4, 5)
    assert found.chars == len("<|system|>\nrules and more")
    shorter = cache.find("b1|model", "h|chat|m", "<|system|>\nrules, then another")
    assert shorter is not None and shorter.tokens == (1, 2, 3)
    # Another build or model, another harness key, another text: nothing.
    assert cache.find("b2|model", "h|chat|m", "<|system|>\nrules and more") is None
    assert cache.find("b1|model", "other|chat|m", "<|system|>\nrules and more") is None
    assert cache.find("b1|model", "h|chat|m", "<|system|>\nRULES") is None
    cache.forget("b1|model", "h|chat|m", "<|system|>\nrules and more")
    again = cache.find("b1|model", "h|chat|m", "<|system|>\nrules and more")
    assert again is not None and again.tokens == (1, 2, 3)


def test_the_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    per_entry = 100 * 4 + ENTRY_OVERHEAD
    cache = TokenCache(max_bytes=3 * per_entry)
    for i in range(3):
        cache.put("id", f"k{i}", f"text {i}", range(100))
    assert cache.find("id", "k0", "text 0 and more") is not None  # k0 is now the most recent
    cache.put("id", "k3", "text 3", range(100))
    assert cache.bytes_used == 3 * per_entry and len(cache) == 3
    assert cache.find("id", "k1", "text 1") is None  # the least recently used went
    assert all(cache.find("id", k, f"text {k[1]}") is not None for k in ("k0", "k2", "k3"))
    cache.put("id", "huge", "big", range(4 * per_entry))  # larger than the budget: not kept
    assert cache.find("id", "huge", "big") is None and len(cache) == 3


def test_a_key_keeps_at_most_max_prefixes() -> None:
    cache = TokenCache()
    for i in range(MAX_PREFIXES + 3):
        cache.put("id", "k", "x" * (i + 1), [i])
    assert len(cache) == MAX_PREFIXES
    assert cache.find("id", "k", "x") is None  # the first ones went
    found = cache.find("id", "k", "x" * 100)
    assert found is not None and found.tokens == (MAX_PREFIXES + 2,)


def test_prefix_chars_from_the_pieces() -> None:
    text = "<|system|>\nYou are a coding agent. Today is 2026-12-05.\n<|end|>\n"
    pieces = [p.encode() for _, p in tokenize_pieces(text)]
    tokens = len(pieces)
    for n in range(tokens + 1):
        chars = prefix_chars(text, pieces, n)
        assert chars is not None
        assert [p for _, p in tokenize_pieces(text[:chars])] == [p.decode() for p in pieces[:n]]
    # With a BOS piece first (add_special), which the text does not hold.
    assert prefix_chars(text, [b"<s>", *pieces], 3) == prefix_chars(text, pieces, 2)
    # A SentencePiece tokenizer puts a space before its first piece (llama-server's real
    # test model does: " <", "|", "im"...): not in the text.
    spaced = [b"<s>", b" " + pieces[0], *pieces[1:]]
    assert prefix_chars(text, spaced, 3) == prefix_chars(text, pieces, 2)
    # Pieces that do not spell the text: None.
    assert prefix_chars(text, [b"x" + pieces[0], *pieces[1:]], 2) is None
    # A token ending inside a character: None.
    assert prefix_chars("é", [b"\xc3", b"\xa9"], 1) is None
    assert prefix_chars("é", [b"\xc3", b"\xa9"], 2) == 1


def test_the_learner_reuses_a_family_only_when_no_other_extends_it() -> None:
    learner = BoundaryLearner(min_tokens=4)
    a = list(range(100, 140))
    learner.boundary("k", [*a, 1, 2, 3])
    learned = learner.boundary("k", [*a, 7, 8, 9])
    assert learned.tokens == len(a)
    assert learner.reuse("k", a)
    assert not learner.reuse("k", a[:-1])  # not a family
    assert not learner.reuse("other", a)
    learner.boundary("k", list(range(500, 560)))
    assert learner.families("k")[0] == 60
    assert learner.reuse("k", a) and learner.families("k")[0] == len(a)  # most recent again
    # A longer family that starts with it: the whole tokens could share more with it.
    learner = BoundaryLearner(min_tokens=4)
    learner.boundary("k", a + [5] * 100)  # too long for a request sharing only ``a`` to join
    learner.boundary("k", a + [1] * 10)
    assert learner.boundary("k", a + [2] * 10).tokens == len(a)
    assert learner.families("k") == [len(a), len(a) + 100]
    assert not learner.reuse("k", a)


class _Tokenizer:
    """A stand-in for the client's ``/tokenize`` (a unit of LazyConversation)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.calls = tokens, 0

    async def tokenize(self, content: str, add_special: bool = False) -> list[int]:
        self.calls += 1
        return self.tokens


def test_a_lazy_conversation_is_tokenized_once_and_drops_a_wrong_entry() -> None:
    dropped: list[str] = []
    right = LazyConversation("text", (1, 2), "id", lambda: dropped.append("right"))
    wrong = LazyConversation("text", (1, 3), "id", lambda: dropped.append("wrong"))
    client = _Tokenizer([1, 2, 4])

    async def run() -> None:
        assert await right.tokens(client) == (1, 2, 4)
        assert await right.tokens(client) == (1, 2, 4)
        assert await wrong.tokens(client) == (1, 2, 4)

    asyncio.run(run())
    assert client.calls == 2 and dropped == ["wrong"]


# -- through the proxy ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fake_slot_files(monkeypatch)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeLlamaServer]:
    with fake_llama_server(tmp_path / "slots", bytes_per_token=BYTES_PER_TOKEN) as server:
        yield server


SYSTEM = "You are the main coding agent. Follow the rules and use the tools. " * 8


def session(n: int, turns: int) -> dict[str, Any]:
    """A Claude-Code-shaped ``/v1/messages`` body: one system prompt, then ``turns``
    user turns of session ``n`` (each answered)."""
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        if messages:
            messages.append({"role": "assistant", "content": f"answer {t}"})
        messages.append({"role": "user", "content": f"session {n} asks question {t} " * 5})
    return {"model": "m", "system": SYSTEM, "messages": messages, "max_tokens": 2}


def send(url: str, body: dict[str, Any]) -> None:
    response = httpx.post(
        url + "/v1/messages", json=body, headers={"user-agent": "claude-cli/2.0"}, timeout=60
    )
    assert response.status_code == 200


def test_a_hit_on_a_learned_prefix_is_not_tokenized_again(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """Two sessions teach the boundary (their shared system prompt); every later turn
    whose rendering starts with it is a hit without ``/tokenize``: one upstream call
    beside the forwarded request (the rendering), plus ``GET /slots``."""
    config = config_for(fake, tmp_path, checkpoint_tokens=0)
    with running_proxy(PrefixProxy(config)) as url:
        send(url, session(1, 1))
        send(url, session(2, 1))  # the boundary shrinks to what both share: cached
        until(lambda: status(url)["leases"]["held"] == {})
        seen = len(fake.records)
        send(url, session(2, 2))
        until(lambda: status(url)["leases"]["held"] == {})
        later = [r.endpoint for r in fake.records[seen:]]
        seen = len(fake.records)
        send(url, session(3, 1))  # another session: the same prefix, a hit
        until(lambda: status(url)["leases"]["held"] == {})
        third = [r.endpoint for r in fake.records[seen:]]
        final = status(url)
    assert sorted(later) == ["apply-template", "messages", "slots"]
    assert sorted(third) == ["apply-template", "messages", "slots"]
    assert [o["kind"] for o in final["outcomes"]][-2:] == ["hit", "hit"]
    prompts = [r for r in fake.records if r.endpoint == "messages"]
    assert all(r.cache_n >= prompts[-1].cache_n for r in prompts[-2:])
    assert prompts[-1].cache_n > 0


def test_with_slot_trust_a_hit_costs_one_round_trip_beyond_the_request(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    """``slot_trust``: a slot the last answer confirmed is trusted without ``GET /slots``,
    so a hit of a learned prefix costs its rendering and nothing else."""
    config = config_for(fake, tmp_path, checkpoint_tokens=0, slot_trust=3600.0)
    with running_proxy(PrefixProxy(config)) as url:
        send(url, session(1, 1))
        send(url, session(2, 1))
        until(lambda: status(url)["leases"]["held"] == {})
        seen = len(fake.records)
        for turns in (2, 3, 4):
            send(url, session(2, turns))
        until(lambda: status(url)["leases"]["held"] == {})
        final = status(url)
    later = [r.endpoint for r in fake.records[seen:]]
    assert later == ["apply-template", "messages"] * 3
    assert [o["kind"] for o in final["outcomes"]][-3:] == ["hit"] * 3
    prompts = [r for r in fake.records[seen:] if r.endpoint == "messages"]
    assert all(r.cache_n > 0 for r in prompts)


def test_with_slot_trust_a_pi_marker_hit_asks_llama_server_nothing(
    fake: FakeLlamaServer, tmp_path: Path
) -> None:
    config = config_for(fake, tmp_path, slot_trust=3600.0)
    with running_proxy(PrefixProxy(config)) as url:
        for question in ("first", "second"):
            response = httpx.post(
                url + "/v1/chat/completions",
                json=pi_chat_body(question, max_tokens=2),
                timeout=60,
            )
            assert response.status_code == 200
            if question == "first":
                until(lambda: status(url)["leases"]["held"] == {})
                seen = len(fake.records)
        until(lambda: status(url)["leases"]["held"] == {})
        final = status(url)
    assert [r.endpoint for r in fake.records[seen:]] == ["chat"]
    assert final["outcomes"][-1]["kind"] == "hit"


def test_a_restore_still_gets_the_whole_tokens(fake: FakeLlamaServer, tmp_path: Path) -> None:
    """After a restart the cached prefix is restored: the request's whole tokens are
    asked for then (a restore looks for the checkpoint it continues by them)."""
    config = config_for(fake, tmp_path, checkpoint_tokens=0)
    with running_proxy(PrefixProxy(config)) as url:
        send(url, session(1, 1))
        send(url, session(2, 1))
        until(lambda: status(url)["leases"]["held"] == {})
        fake.restart()
        seen = len(fake.records)
        send(url, session(2, 2))
        final = status(url)
    after = [r.endpoint for r in fake.records[seen:]]
    assert after.count("tokenize") == 1 and "restore" in after
    assert final["outcomes"][-1]["kind"] == "restored"


def test_the_client_reads_pieces_as_bytes(fake: FakeLlamaServer) -> None:
    async def run() -> list[tuple[int, bytes]]:
        client = AsyncLlamaClient(fake.url)
        try:
            return await client.tokenize_pieces("<|user|>\nhé llo", True)
        finally:
            await client.aclose()

    got = asyncio.run(run())
    assert got[0] == (1, b"<s>")
    assert b"".join(p for _, p in got[1:]) == "<|user|>\nhé llo".encode()
