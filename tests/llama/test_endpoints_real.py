"""Every generation endpoint through the proxy, against a real llama-server.

Per endpoint (chat without a marker, /v1/messages?beta=true, /v1/responses, /completion,
/v1/completions with a string or a token list): session 1 is warmed whole and saved;
session 2 with another prompt learns the boundary (what both share), which the slot
already holds at its start: a hit, and the learned prefix is saved beside the first file
after the request; session 3 hits, its rendering not tokenized again (the token cache);
after a llama-server restart, session 4 restores the
learned prefix and reuses it, as llama-server itself
reports (``timings.cache_n``, ``usage.cache_read_input_tokens``,
``usage.input_tokens_details.cached_tokens``). The rendering of /v1/messages and
/v1/responses is checked against llama-server's own token counts.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.launcher import LlamaServerProcess

from pion.llama.client import LlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.endpoints import to_chat
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from pion.llama.timings import Timings
from support import count, log_lines, wait_log

pytestmark = pytest.mark.llama

MakeConfig = Callable[..., WarmerConfig]

# A stable system prompt with no Pi marker: the boundary has to be learned.
STABLE = " ".join(
    f"Rule {i}: keep the change small, explain it, and run the tests." for i in range(40)
)
TOOLS_ANTHROPIC = [
    {
        "name": "Read",
        "description": "Read a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
TOOLS_RESPONSES = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def chat_body(prompt: str) -> dict[str, Any]:
    return {
        "model": "pion-test",
        "messages": [
            {"role": "system", "content": STABLE},
            {"role": "user", "content": prompt},
        ],
        "max_tokens": 2,
    }


def messages_body(prompt: str) -> dict[str, Any]:
    return {
        "model": "pion-test",
        "max_tokens": 2,
        "system": [{"type": "text", "text": STABLE, "cache_control": {"type": "ephemeral"}}],
        "tools": TOOLS_ANTHROPIC,
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
    }


def responses_body(prompt: str) -> dict[str, Any]:
    return {
        "model": "pion-test",
        "instructions": STABLE,
        "input": [
            {"type": "message", "role": "developer", "content": "Sandbox: workspace-write."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": prompt}],
            },
        ],
        "tools": TOOLS_RESPONSES,
        "max_output_tokens": 2,
        "prompt_cache_key": f"session-{prompt}",
    }


def completion_body(prompt: str) -> dict[str, Any]:
    return {"prompt": STABLE + "\nQuestion: " + prompt, "n_predict": 2}


def oai_completion_body(prompt: str) -> dict[str, Any]:
    return {"model": "pion-test", "prompt": STABLE + "\nQuestion: " + prompt, "max_tokens": 2}


ENDPOINT_CASES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", chat_body),
    "messages": ("/v1/messages?beta=true", messages_body),
    "responses": ("/v1/responses", responses_body),
    "completion": ("/completion", completion_body),
    "v1-completions": ("/v1/completions", oai_completion_body),
}


def reuse(resp: httpx.Response) -> Timings:
    found = Timings.from_json(resp.json())
    assert found is not None, resp.text
    return found


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    resp = httpx.post(url + path, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp


@pytest.mark.parametrize("case", sorted(ENDPOINT_CASES))
def test_endpoint_saved_hit_and_restored_after_restart(
    case: str, llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    path, make = ENDPOINT_CASES[case]
    config = make_config(llama_server)
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        first = post(url, path, make("What is in the README?"))
        second = post(url, path, make("Fix the failing test."))
        third = post(url, path, make("Add a changelog entry."))
        # The learned prefix's file, saved after session 2 (a plain answer may reach the
        # client before the proxy has observed it: wait for the save to be queued).
        wait_log(config.log_path, "queued (background)", 1)
        assert proxy.flush(60)
        llama_server.restart()
        fourth = post(url, path, make("Rename the module."))
        status = httpx.get(url + STATUS_PATH).json()
    kinds = [o["kind"] for o in status["outcomes"]]
    assert kinds == ["cold", "hit", "hit", "restored"], status["log_tail"]
    whole, learned = status["outcomes"][0]["tokens"], status["outcomes"][1]["tokens"]
    assert 0 < learned < whole
    # Session 1 warmed the whole prompt: the real request reused all of it but the last
    # token, so the proxy rendered exactly the tokens llama-server computes.
    t1 = reuse(first)
    assert t1.cache_n >= t1.total - 2, t1
    for resp in (second, third, fourth):
        t = reuse(resp)
        assert t.cache_n >= 0.9 * learned, (t, learned)
    assert len(status["files"]) == 2  # the first session's prompt, and the learned prefix
    lines = wait_log(config.log_path, "observed normal request", 4)
    assert count(lines, "RESTORE verified by the real request") == 1
    # Session 2 learned the boundary; sessions 3 and 4 render a prefix tokenized before:
    # not tokenized again (the token cache: the real tokenizer's pieces spell the
    # rendering), and they reused it all the same (above).
    assert count(lines, "boundary learned") == 1
    assert count(lines, "boundary cached") == 2


def test_raw_completion_with_a_token_list(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    with LlamaClient(llama_server.url) as client:
        stable = client.tokenize(STABLE, add_special=True)
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        post(url, "/completion", {"prompt": [*stable, 5, 6, 7], "n_predict": 1})
        post(url, "/completions", {"prompt": [*stable, 9, 9], "n_predict": 1})
        wait_log(config.log_path, "queued (background)", 1)
        assert proxy.flush(60)
        llama_server.restart()
        last = post(url, "/completion", {"prompt": [*stable, 11], "n_predict": 1})
        status = httpx.get(url + STATUS_PATH).json()
    assert [o["kind"] for o in status["outcomes"]] == ["cold", "hit", "restored"]
    assert status["outcomes"][1]["tokens"] == len(stable)
    assert reuse(last).cache_n >= 0.9 * len(stable)


@pytest.mark.parametrize(
    ("kind", "counter", "body"),
    [
        ("messages", "/v1/messages/count_tokens", messages_body("Which files changed?")),
        ("responses", "/v1/responses/input_tokens", responses_body("Which files changed?")),
    ],
)
def test_rendering_matches_llama_servers_token_count(
    kind: Any, counter: str, body: dict[str, Any], llama_server: LlamaServerProcess
) -> None:
    with LlamaClient(llama_server.url) as client:
        prompt = client.apply_template(to_chat(kind, body))
        ours = len(client.tokenize(prompt, add_special=True))
    resp = httpx.post(llama_server.url + counter, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    theirs = data.get("input_tokens", data.get("usage", {}).get("input_tokens"))
    assert ours == theirs, data


def test_count_tokens_passes_through(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    body = messages_body("hello")
    direct = httpx.post(llama_server.url + "/v1/messages/count_tokens", json=body, timeout=60)
    config = make_config(llama_server)
    with running_proxy(PrefixProxy(config)) as url:
        proxied = httpx.post(url + "/v1/messages/count_tokens", json=body, timeout=60)
        status = httpx.get(url + STATUS_PATH).json()
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)
    assert status["outcomes"] == []


HEADER_1 = "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"
HEADER_2 = "x-anthropic-billing-header: cc_version=2.1.197.9f4; cc_entrypoint=sdk-cli;"


def claude_body(header: str, prompt: str) -> dict[str, Any]:
    body = messages_body(prompt)
    body["system"] = [{"type": "text", "text": header}, *body["system"]]
    return body


@pytest.mark.parametrize("keep", [False, True])
def test_billing_header_is_removed_unless_kept(
    keep: bool, llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server, keep_billing_header=keep)
    path = "/v1/messages?beta=true"
    with running_proxy(PrefixProxy(config)) as url:
        first = post(url, path, claude_body(HEADER_1, "Explain the build."))
        second = post(url, path, claude_body(HEADER_2, "Write a test."))
        status = httpx.get(url + STATUS_PATH).json()
    events = status["events"]
    kinds = [o["kind"] for o in status["outcomes"]]
    warmups = [ln for ln in log_lines(config.log_path) if "warm-up done" in ln]
    if keep:
        cached = int(warmups[-1].rsplit("cache_n=", 1)[1])
        # The version suffix differs within the first line: nothing after it is shared,
        # so the second session is a prefix of its own, built cold.
        assert "billing_headers_removed" not in events
        assert kinds == ["cold", "cold"]
        assert cached < 0.5 * reuse(first).total
        assert count(log_lines(config.log_path), "removed Claude Code") == 0
    else:
        assert events["billing_headers_removed"] == 2
        # The sessions share the whole system prompt and the tools: the slot holds the
        # second's prefix at the start of the first's, a hit with no second warm-up.
        assert kinds == ["cold", "hit"]
        assert len(warmups) == 1
        assert reuse(second).cache_n >= 0.9 * status["outcomes"][1]["tokens"]
        lines = log_lines(config.log_path)
        assert count(lines, "removed Claude Code's billing-header system block") == 2


def pi_dated(date: str, prompt: str) -> dict[str, Any]:
    from pion_testing.llama_samples import pi_chat_body

    body = pi_chat_body(prompt, max_tokens=2)
    system = body["messages"][0]["content"]
    marker = "\n\n<project_context>"
    body["messages"][0]["content"] = system.replace(marker, f"\nCurrent date: {date}{marker}")
    return body


def test_pi_prefix_of_yesterday_is_restored_in_part(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    path = "/v1/chat/completions"
    with running_proxy(PrefixProxy(config)) as url:
        post(url, path, pi_dated("2026-12-01", "List the files."))
        llama_server.restart()
        today = post(url, path, pi_dated("2026-12-02", "List the files."))
        llama_server.restart()
        again = post(url, path, pi_dated("2026-12-02", "Run the tests."))
        status = httpx.get(url + STATUS_PATH).json()
    outcomes = status["outcomes"]
    assert [o["kind"] for o in outcomes] == ["cold", "partial", "restored"]
    shared, tokens = outcomes[1]["shared"], outcomes[1]["tokens"]
    assert max(0.9 * tokens, tokens - 40) < shared < tokens, outcomes[1]
    assert reuse(today).cache_n >= 0.9 * tokens
    assert reuse(again).cache_n >= 0.9 * tokens
    assert len(status["files"]) == 2  # yesterday's and today's, side by side


def test_head_root_through_the_proxy(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    direct = httpx.head(llama_server.url + "/", timeout=30)
    with running_proxy(PrefixProxy(make_config(llama_server))) as url:
        proxied = httpx.head(url + "/", timeout=30)
    assert proxied.status_code == direct.status_code
    assert proxied.content == b""


def test_bad_bodies_answered_as_llama_server_answers(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    huge_tools = [
        {"type": "function", "function": {"name": f"t{i}", "description": "x" * 1000}}
        for i in range(10_000)
    ]
    cases: list[tuple[str, bytes]] = [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/messages", b"[1, 2]"),
        ("/v1/responses", json.dumps({"input": 3}).encode()),
        ("/completion", json.dumps({"prompt": {"a": 1}}).encode()),
        (
            "/v1/chat/completions",
            json.dumps({**chat_body("hi"), "frobnicate": {"x": 1}}).encode(),
        ),
        ("/v1/chat/completions", json.dumps({**chat_body("hi"), "tools": huge_tools}).encode()),
    ]
    assert len(cases[-1][1]) > 10_000_000
    config = make_config(llama_server)
    headers = {"content-type": "application/json"}
    with running_proxy(PrefixProxy(config)) as url:
        for path, raw in cases:
            direct = httpx.post(llama_server.url + path, content=raw, headers=headers, timeout=120)
            proxied = httpx.post(url + path, content=raw, headers=headers, timeout=120)
            assert proxied.status_code == direct.status_code, (path, raw[:60], proxied.text)
            if direct.status_code != 200:
                assert proxied.content == direct.content
        status = httpx.get(url + STATUS_PATH).json()
    reasons = " ".join(o["detail"] for o in status["outcomes"])
    assert "body is not JSON" in reasons and "not warmed" in reasons
    assert status["failures"] == {}


def test_llama_server_dying_mid_stream_never_hangs_the_client(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    body = {**chat_body("Count to a thousand."), "max_tokens": 3000, "stream": True}
    body["ignore_eos"] = True
    config = make_config(llama_server, persist=False)
    got = b""
    with running_proxy(PrefixProxy(config)) as url:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                for chunk in r.iter_raw():
                    got += chunk
                    if got.count(b"data: ") >= 3 and llama_server.pid is not None:
                        # A crash, not a shutdown: the stream just ends.
                        os.kill(llama_server.pid, signal.SIGKILL)
                        llama_server.stop()
        except httpx.TransportError as exc:
            # The connection ends as the upstream's did; never a read timeout.
            assert not isinstance(exc, httpx.TimeoutException), exc
        assert got.count(b"data: ") >= 3
        assert b"data: [DONE]" not in got
        llama_server.start()
        after = post(url, "/v1/chat/completions", chat_body("Still there?"))
    assert after.json()["choices"]


def test_learned_boundary_survives_a_proxy_and_server_restart(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    path = "/v1/messages"
    with running_proxy(PrefixProxy(config)) as url:
        post(url, path, messages_body("What is in the README?"))
        post(url, path, messages_body("Fix the failing test."))
        learned = httpx.get(url + STATUS_PATH).json()["outcomes"][1]["tokens"]
    llama_server.restart()
    with running_proxy(PrefixProxy(config)) as url:
        resp = post(url, path, messages_body("Rename the module."))
        status = httpx.get(url + STATUS_PATH).json()
    assert [o["kind"] for o in status["outcomes"]] == ["restored"]
    assert status["outcomes"][0]["tokens"] == learned
    assert reuse(resp).cache_n >= 0.9 * learned
    assert count(log_lines(config.log_path), f"boundary seeded: {learned} of") == 1
