"""The answer cap the real-harness tests put in front of llama-server: only the answer
length of a generation request changes; the proxy's warm-ups (``n_predict: 0``) and
anything that is not a JSON object pass as sent."""

from __future__ import annotations

import json

import pytest
from pion_testing.recorder import Exchange, cap_answer

BOTH = {"max_tokens": 16, "max_completion_tokens": 16}


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/chat/completions", {"max_completion_tokens": 4096}, BOTH),
        ("/v1/chat/completions", {}, {"max_tokens": 16}),
        ("/v1/messages", {"max_tokens": 32000}, {"max_tokens": 16}),
        ("/v1/messages", {"max_tokens": 4}, {"max_tokens": 4}),
        ("/v1/responses", {}, {"max_output_tokens": 16}),
        ("/v1/completions", {"prompt": "x"}, {"n_predict": 16}),
    ],
)  # fmt: skip
def test_answer_length_capped(path: str, body: dict[str, int], expected: dict[str, int]) -> None:
    capped = json.loads(cap_answer(path, json.dumps({"messages": [], **body}).encode(), 16))
    assert {k: v for k, v in capped.items() if k not in ("messages", "prompt")} == expected
    assert capped.get("messages", []) == []


@pytest.mark.parametrize("body", [b'{"prompt":[1,2],"n_predict":0}', b"not json", b"[1]"])
def test_left_as_sent(body: bytes) -> None:
    assert cap_answer("/completion", body, 16) is body


def test_generation_paths() -> None:
    assert Exchange("POST", "/v1/messages", 1).generation
    assert Exchange("POST", "/v1/responses", 1).generation
    assert not Exchange("GET", "/v1/models", 0).generation
    assert not Exchange("POST", "/slots/0", 0).generation
