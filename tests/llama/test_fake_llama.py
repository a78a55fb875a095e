"""The fake llama-server (``support.fake_llama``): its slot rules are llama-server's, its
controls make interleavings deterministic, and its answers have the real server's shapes
(the last test compares them with a real llama-server b11434)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import wait_until
from support.fake_llama import FakeLlamaServer, fake_llama_server, running_fake_llama
from support.fake_llama_model import tokenize, tokenize_pieces

PROMPT = ("You are a careful assistant. Follow the rules below. " * 4).rstrip()


def complete(client: httpx.Client, prompt: str, **extra: Any) -> dict[str, Any]:
    resp = client.post("/completion", json={"prompt": prompt, "n_predict": 3, **extra})
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def sse_events(text: str) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def until(predicate: Any, tries: int = 1000) -> None:
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never met")


def test_tokenizer_is_prefix_stable_and_gives_pieces_back() -> None:
    text = "<|system|>\nYou are Pi.\nCurrent date: 2026-12-04<|end|>\n"
    pieces = tokenize_pieces(text)
    assert "".join(p for _, p in pieces) == text
    # Appending after a special token keeps the tokens; after whitespace, the whitespace
    # joins the next word (as BPE merges it).
    head = text.rstrip("\n")
    assert tokenize(head + "more words")[: len(tokenize(head))] == tokenize(head)
    assert tokenize(text + "more")[: len(pieces)] != tokenize(text)
    assert tokenize("a b", add_special=True)[0] == 1
    # Special tokens are split as text when parse_special is off.
    assert len(tokenize("<|end|>", parse_special=False)) > 1


def test_cache_n_is_the_longest_common_prefix_and_the_slot_keeps_the_answer(
    tmp_path: Path,
) -> None:
    with fake_llama_server(tmp_path) as fake, httpx.Client(base_url=fake.url) as client:
        first = complete(client, PROMPT + " question one")
        n_prompt = len(tokenize(PROMPT + " question one", add_special=True))
        assert first["timings"]["cache_n"] == 0
        assert first["timings"]["prompt_n"] == n_prompt
        # The slot holds the prompt and the generated tokens but the last.
        slot = client.get("/slots").json()[0]
        assert slot["n_prompt_tokens"] == n_prompt + 2 == first["tokens_cached"]
        second = complete(client, PROMPT + " question two")
        shared = len(tokenize(PROMPT + " question", add_special=True))
        assert second["timings"]["cache_n"] == shared
        # The same prompt again: one token is always evaluated.
        again = complete(client, PROMPT + " question two")
        assert (again["timings"]["cache_n"], again["timings"]["prompt_n"]) == (
            len(tokenize(PROMPT + " question two", add_special=True)) - 1,
            1,
        )
        assert complete(client, PROMPT, cache_prompt=False)["timings"]["cache_n"] == 0
        assert [r.cache_n for r in fake.records_for("completion")] == [
            0,
            shared,
            again["timings"]["cache_n"],
            0,
        ]


def test_pinning_per_endpoint_and_the_unpinned_slot_choice(tmp_path: Path) -> None:
    with (
        fake_llama_server(tmp_path, n_slots=3) as fake,
        httpx.Client(base_url=fake.url) as client,
    ):
        # A fresh server: the least recently used idle slot, ties to the last one.
        assert complete(client, PROMPT + " alpha")["id_slot"] == 2
        assert complete(client, "unrelated words here", id_slot=0)["id_slot"] == 0
        # Unpinned: the slot sharing the longest prefix (over 10% of the prompt) wins...
        assert complete(client, PROMPT + " beta")["id_slot"] == 2
        # ...else the least recently used idle slot.
        other = "something else entirely, with many more words than that one had"
        assert complete(client, other)["id_slot"] == 1
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "id_slot": 0}
        client.post("/v1/chat/completions", json=chat).raise_for_status()
        client.post("/v1/responses", json={"input": "hi", "id_slot": 1}).raise_for_status()
        # The Anthropic conversion drops id_slot: llama-server chooses.
        msgs = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "id_slot": 2}
        client.post("/v1/messages", json=msgs).raise_for_status()
        by_kind = {r.endpoint: r for r in fake.records}
        assert (by_kind["chat"].id_slot, by_kind["chat"].slot) == (0, 0)
        assert (by_kind["responses"].id_slot, by_kind["responses"].slot) == (1, 1)
        assert by_kind["messages"].id_slot is None
        # The chat prompt on slot 0 shares the most with the messages prompt.
        assert by_kind["messages"].slot == 0


def test_save_restore_round_trip_and_failed_restores(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path, n_slots=2) as fake, httpx.Client(base_url=fake.url) as client:
        complete(client, PROMPT, id_slot=0, n_predict=0)
        held = fake.slot_tokens(0)
        saved = client.post("/slots/0?action=save", json={"filename": "p.bin"}).json()
        assert (
            saved["n_saved"] == len(held)
            and saved["n_written"] == (tmp_path / "p.bin").stat().st_size
        )
        assert client.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": len(held)}
        restored = client.post("/slots/1?action=restore", json={"filename": "p.bin"}).json()
        assert restored["n_restored"] == len(held)
        assert fake.slot_tokens(1) == held
        # A restore is no task: /slots shows no n_prompt_tokens for it.
        assert "n_prompt_tokens" not in client.get("/slots").json()[1]
        reuse = complete(client, PROMPT + " and a question", id_slot=1)["timings"]["cache_n"]
        assert reuse == len(held)

        (tmp_path / "bad.bin").write_bytes(b"garbage" * 10)
        for name in ("bad.bin", "missing.bin"):
            resp = client.post("/slots/1?action=restore", json={"filename": name})
            assert resp.status_code == 400
            assert "invalid slot save file" in resp.json()["error"]["message"]
            assert fake.slot_tokens(1) == []  # a failed restore empties the slot
        resp = client.post("/slots/0?action=save", json={"filename": "../escape.bin"})
        assert (resp.status_code, resp.json()["error"]["message"]) == (400, "Invalid filename")
        resp = client.post("/slots/0?action=frob", json={})
        assert (resp.status_code, resp.json()["error"]["message"]) == (400, "Invalid action")


def test_a_gate_holds_a_slot_busy_and_a_pinned_request_waits_for_it(tmp_path: Path) -> None:
    async def scenario(fake: FakeLlamaServer) -> None:
        gate = fake.hold("completion")
        async with httpx.AsyncClient(base_url=fake.url) as client:
            first = asyncio.ensure_future(
                client.post("/completion", json={"prompt": PROMPT, "id_slot": 0})
            )
            await gate.arrival(1)
            slots = (await client.get("/slots")).json()
            assert slots[0]["is_processing"] is True
            # Pinned to the busy slot: deferred until it is free, never run beside it.
            second = asyncio.ensure_future(
                client.post("/completion", json={"prompt": PROMPT + " more", "id_slot": 0})
            )
            save = asyncio.ensure_future(
                client.post("/slots/0?action=save", json={"filename": "x.bin"})
            )
            await until(lambda: len(fake.records) == 4)  # both reached the server...
            assert gate.arrived == 1 and not second.done() and not save.done()
            gate.release(1)
            assert (await first).status_code == 200
            await gate.arrival(2)
            assert not save.done()
            gate.release()
            assert (await second).json()["timings"]["cache_n"] > 0
            assert (await save).status_code == 200
        served = [(r.endpoint, r.slot) for r in fake.records if r.endpoint != "slots"]
        assert served == [("completion", 0), ("completion", 0), ("save", 0)]

    async def main() -> None:
        async with running_fake_llama(tmp_path) as fake:
            await scenario(fake)

    asyncio.run(main())


def test_unpinned_requests_wait_for_an_idle_slot_first_come_first_served(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path, n_slots=1) as fake:
        gate = fake.hold("chat", at="answer")

        async def main() -> list[int]:
            async with httpx.AsyncClient(base_url=fake.url) as client:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                tasks = [
                    asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
                    for _ in range(3)
                ]
                await gate.arrival(1)
                gate.release()
                return [(await t).status_code for t in tasks]

        assert asyncio.run(main()) == [200, 200, 200]
        assert gate.arrived == 3
        assert [r.slot for r in fake.records_for("chat")] == [0, 0, 0]


def test_a_client_that_hangs_up_frees_its_slot(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path) as fake:
        gate = fake.hold("completion")

        async def hang_up() -> None:
            async with httpx.AsyncClient(base_url=fake.url) as client:
                req = asyncio.ensure_future(client.post("/completion", json={"prompt": PROMPT}))
                await gate.arrival(1)
                req.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await req

        asyncio.run(hang_up())
        # The server sees the hang-up on its own time: only then may the gate open.
        wait_until(lambda: fake.records_for("completion")[0].cancelled, 30, "the cancel")
        fake.unhold(gate)
        with httpx.Client(base_url=fake.url) as client:
            assert complete(client, PROMPT, id_slot=0)["timings"]["cache_n"] == 0
        assert fake.records_for("completion")[0].cancelled
        assert fake.records_for("completion")[0].status is None


def test_restart_cuts_requests_and_empties_slots_but_keeps_files(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path) as fake, httpx.Client(base_url=fake.url) as client:
        complete(client, PROMPT, id_slot=0)
        client.post("/slots/0?action=save", json={"filename": "keep.bin"}).raise_for_status()
        gate = fake.hold("completion", at="answer")

        async def cut() -> None:
            async with httpx.AsyncClient(base_url=fake.url) as aclient:
                req = asyncio.ensure_future(aclient.post("/completion", json={"prompt": PROMPT}))
                await gate.arrival(1)
                fake.restart()
                with pytest.raises(httpx.TransportError):
                    await req

        asyncio.run(cut())
        fake.unhold(gate)
        slot = client.get("/slots").json()[0]
        assert "n_prompt_tokens" not in slot and fake.slot_tokens(0) == []
        assert fake.starts == 2
        assert client.post("/slots/0?action=restore", json={"filename": "keep.bin"}).is_success
        assert complete(client, PROMPT + " next", id_slot=0)["timings"]["cache_n"] > 0


def test_injected_failures(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path) as fake, httpx.Client(base_url=fake.url) as client:
        fake.fail("tokenize", 503, "Loading model")
        resp = client.post("/tokenize", json={"content": "x"})
        assert resp.status_code == 503 and resp.json()["error"]["message"] == "Loading model"
        assert client.post("/tokenize", json={"content": "x"}).status_code == 200  # once
        fake.fail("props", drop=True, times=None)
        for _ in range(2):
            with pytest.raises(httpx.TransportError):
                client.get("/props")
        fake.clear_failures()
        assert client.get("/props").status_code == 200
        fake.fail("chat", drop=True, after_events=2)
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=body).read()
        assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_streams_carry_timings_and_usage(tmp_path: Path) -> None:
    with fake_llama_server(tmp_path) as fake, httpx.Client(base_url=fake.url) as client:
        base = {"max_tokens": 2, "stream": True}
        msgs = [{"role": "user", "content": "hi"}]
        chat = sse_events(client.post("/v1/chat/completions", json={"messages": msgs, **base}).text)
        assert chat[-1]["timings"]["cache_n"] == 0
        anth = client.post("/v1/messages", json={"system": "S", "messages": msgs, **base}).text
        start = sse_events(anth)[0]["message"]["usage"]
        assert start["cache_read_input_tokens"] > 0  # shares <s><|... with the chat
        resp = client.post("/v1/responses", json={"input": "hi", "stream": True}).text
        done = sse_events(resp)[-1]
        assert done["type"] == "response.completed" and "timings" in done
        comp = sse_events(client.post("/completion", json={"prompt": "a", "stream": True}).text)
        assert comp[-1]["stop"] is True and "timings" in comp[-1]
        assert [r.stream for r in fake.records] == [True] * 4


def _shapes(url: str) -> dict[str, Any]:
    """Key sets of what the proxy reads, from one server (real or fake)."""
    msgs = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}]
    out: dict[str, Any] = {}
    # No keep-alive: llama-server may close a connection after a stream.
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=url, timeout=120, limits=limits) as c:
        out["props"] = set(c.get("/props").json())
        out["slot_fresh"] = set(c.get("/slots").json()[0])
        comp = complete(c, PROMPT, id_slot=0)
        out["completion"], out["timings"] = set(comp), set(comp["timings"])
        out["slot_used"] = set(c.get("/slots").json()[0])
        chat = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}).json()
        out["chat"], out["chat_usage"] = set(chat), set(chat["usage"])
        out["chat_timings"] = set(chat["timings"])
        anth = c.post("/v1/messages", json={"messages": msgs[1:], "max_tokens": 2}).json()
        out["messages"], out["messages_usage"] = set(anth), set(anth["usage"])
        resp = c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json()
        out["responses_usage"] = set(resp["usage"])
        stream = {"messages": msgs, "max_tokens": 2, "stream": True}
        last = sse_events(c.post("/v1/chat/completions", json=stream).text)[-1]
        out["chat_stream_last"] = set(last)
        stream = {"messages": msgs[1:], "max_tokens": 2, "stream": True}
        first = sse_events(c.post("/v1/messages", json=stream).text)[0]
        out["messages_start_usage"] = set(first["message"]["usage"])
        stream = {"input": "hi", "max_output_tokens": 2, "stream": True}
        done = sse_events(c.post("/v1/responses", json=stream).text)[-1]
        out["responses_done"] = (set(done), set(done["response"]["usage"]))
        tok = c.post("/tokenize", json={"content": "a b", "with_pieces": True}).json()
        out["tokenize"] = (set(tok), set(tok["tokens"][0]))
        out["template"] = set(c.post("/apply-template", json={"messages": msgs}).json())
        out["save"] = set(c.post("/slots/0?action=save", json={"filename": "s.bin"}).json())
        out["erase"] = set(c.post("/slots/0?action=erase").json())
        out["restore"] = set(c.post("/slots/0?action=restore", json={"filename": "s.bin"}).json())
        bad = c.post("/slots/0?action=restore", json={"filename": "missing.bin"})
        out["restore_missing"] = (bad.status_code, bad.json()["error"]["message"])
        out["error"] = set(bad.json()["error"])
    return out


@pytest.mark.llama
def test_the_fake_answers_in_the_real_servers_shapes(
    start_server: Any, tiny_model: Path, tmp_path: Path
) -> None:
    real = _shapes(start_server(tiny_model, parallel=2).url)
    with fake_llama_server(tmp_path / "fake", n_slots=2) as fake:
        mine = _shapes(fake.url)
    # /props: the fake gives a subset of the real keys (UI settings and media left out).
    assert mine.pop("props") <= real.pop("props")
    assert mine == real
