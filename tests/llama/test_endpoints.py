"""Units of the endpoint conversions (llama-server's own, mirrored) and the billing header.

Against the real server, tests/llama/test_endpoints_real.py checks that the conversions
render exactly the prompts llama-server computes (its token counts agree)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pion.llama.endpoints import (
    ENDPOINTS,
    completion_prompt,
    strip_billing_header,
    to_chat,
)

HEADER = "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"


def text(kind: str, value: str) -> dict[str, str]:
    return {"type": kind, "text": value}


def test_every_generation_path_has_a_kind() -> None:
    assert ENDPOINTS["/v1/messages"] == "messages"
    assert ENDPOINTS["/v1/responses"] == ENDPOINTS["/responses"] == "responses"
    assert {p for p, k in ENDPOINTS.items() if k == "completion"} == {
        "/completion",
        "/completions",
        "/v1/completions",
    }
    assert {p for p, k in ENDPOINTS.items() if k == "chat"} == {
        "/v1/chat/completions",
        "/chat/completions",
    }


def test_anthropic_system_blocks_are_joined_and_cache_control_ignored() -> None:
    body = {
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}},
            {"type": "image", "source": {}},
            {"type": "text", "text": " Be brief."},
        ],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "tools": [{"name": "Read", "description": "read a file", "input_schema": {"a": 1}}],
        "tool_choice": {"type": "any"},
    }
    chat = to_chat("messages", body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code. Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "Read", "description": "read a file", "parameters": {"a": 1}},
        }
    ]
    assert chat["tool_choice"] == "required"
    assert to_chat("messages", {**body, "system": "plain"})["messages"][0] == {
        "role": "system",
        "content": "plain",
    }


def test_anthropic_cch_stamp_is_normalised_as_llama_server_does() -> None:
    text = "x-anthropic-billing-header: cc_version=2.1.101.e51; cch=a5145;You are Claude"
    chat = to_chat("messages", {"system": text, "messages": []})
    assert chat["messages"][0]["content"] == (
        "x-anthropic-billing-header: cc_version=2.1.101.e51; cch=fffff;You are Claude"
    )
    other = "no header cch=a5145;"
    assert to_chat("messages", {"system": other, "messages": []})["messages"][0]["content"] == other


def test_anthropic_tool_use_and_results() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "read it"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "é"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
            },
            {"role": "assistant"},
        ]
    }
    messages = to_chat("messages", body)["messages"]
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "read it"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"p":"é"}'},
                }
            ],
            "reasoning_content": "hmm",
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ab"},
    ]


def test_anthropic_without_messages_is_refused() -> None:
    with pytest.raises(ValueError, match="messages"):
        to_chat("messages", {"system": "x"})


def test_responses_instructions_developer_items_and_tools() -> None:
    body = {
        "model": "m",
        "instructions": "Be Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "d"}],
            },
            {"role": "system", "content": "s"},
            {"type": "message", "role": "user", "content": [text("input_text", "u")]},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
        "max_output_tokens": 5,
        "reasoning": {"effort": "low"},
        "prompt_cache_key": "abc",
    }
    chat = to_chat("responses", body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be Codex."},
        {"role": "developer", "content": [{"text": "d", "type": "text"}]},
        {"role": "system", "content": [{"text": "s", "type": "text"}]},
        {"role": "user", "content": [{"text": "u", "type": "text"}]},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "shell", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert chat["max_tokens"] == 5 and chat["reasoning_effort"] == "low"
    assert "input" not in chat and "instructions" not in chat and "reasoning" not in chat
    assert chat["prompt_cache_key"] == "abc" and chat["model"] == "m"


def test_responses_function_calls_merge_into_the_assistant_turn() -> None:
    body = {
        "input": [
            {"role": "user", "content": "go"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
            {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "done"},
        ]
    }
    messages = to_chat("responses", body)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": [{"text": "ok", "type": "text"}],
        "tool_calls": [
            {"function": {"arguments": "{}", "name": "shell"}, "id": "c", "type": "function"}
        ],
    }
    assert messages[2] == {"content": "done", "role": "tool", "tool_call_id": "c"}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": 5},
        {"input": [{"what": 1}]},
        {"input": "x", "previous_response_id": "r1"},
        {"input": "x", "tools": {}},
    ],
)
def test_responses_llama_server_refuses_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        to_chat("responses", body)


def test_completion_prompt_shapes() -> None:
    assert completion_prompt({"prompt": "abc"}) == "abc"
    assert completion_prompt({"prompt": ["abc"]}) == "abc"
    assert completion_prompt({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert completion_prompt({"prompt": [1, "x"]}) is None
    assert completion_prompt({"prompt": ["a", "b"]}) is None
    assert completion_prompt({"prompt": [True]}) is None
    assert completion_prompt({}) is None


def test_billing_header_block_is_removed_and_nothing_else() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "system": [
            {"type": "text", "text": HEADER},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    before = json.loads(json.dumps(body))
    assert strip_billing_header(body) == HEADER
    assert body["system"] == before["system"][1:]
    assert {k: v for k, v in body.items() if k != "system"} == {
        k: v for k, v in before.items() if k != "system"
    }


@pytest.mark.parametrize(
    "system",
    [
        "x-anthropic-billing-header: a string is left alone",
        [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": HEADER}],
        [],
        None,
    ],
)
def test_billing_header_elsewhere_is_left_alone(system: Any) -> None:
    body = {"system": system, "messages": []}
    assert strip_billing_header(body) is None
    assert body["system"] == system
