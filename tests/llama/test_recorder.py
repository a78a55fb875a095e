"""The answer cap the real-harness tests put in front of llama-server: only the answer
length of a generation request changes; the proxy's warm-ups (``n_predict: 0``) and
anything that is not a JSON object pass as sent."""

from __future__ import annotations

import json

import pytest
from pion_testing.recorder import Exchange, cap_answer, session_start

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


def exchange(started: float, size: int, first_token_s: float | None) -> Exchange:
    return Exchange("POST", "/v1/messages", size, started, 200, first_token_s)


def test_session_start_spans_a_retry_and_ignores_side_requests_and_follow_ups() -> None:
    title = exchange(0.0, 900, 0.5)
    given_up = exchange(1.0, 76_000, None)  # the harness hung up after 300 s
    retry = exchange(301.0, 76_000, 250.0)
    follow_up = exchange(560.0, 76_400, 6.0)
    seconds, answered = session_start([title, given_up, retry, follow_up])
    assert answered is retry
    assert seconds == pytest.approx(550.0)  # from the first attempt to the retry's token
    assert session_start([title, retry, follow_up]) == (250.0, retry)


def test_session_start_needs_an_answered_main_request() -> None:
    with pytest.raises(ValueError, match="no generation"):
        session_start([Exchange("GET", "/v1/models", 0)])
    with pytest.raises(ValueError, match="got a token"):
        session_start([exchange(0.0, 900, 0.5), exchange(1.0, 76_000, None)])
