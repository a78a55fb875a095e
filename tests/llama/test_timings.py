"""Reading `timings` from JSON bodies and SSE streams without changing them (pure units)."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from pion.llama.timings import MAX_BUFFER, Timings, TimingsScanner

TIMINGS = {"cache_n": 1200, "prompt_n": 80, "prompt_ms": 12.5, "predicted_n": 3}


def sse(events: list[dict[str, object]], eol: bytes = b"\n") -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + eol + eol for e in events)
    return out + b"data: [DONE]" + eol + eol


STREAM = sse(
    [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [{"finish_reason": "stop"}], "timings": TIMINGS},
    ]
)


def test_from_json() -> None:
    t = Timings.from_json({"timings": TIMINGS})
    assert t == Timings(cache_n=1200, prompt_n=80, prompt_ms=12.5)
    assert t.total == 1280 and abs(t.reuse - 1200 / 1280) < 1e-12
    assert Timings.from_json({"timings": {"cache_n": "x"}}) is None
    assert Timings.from_json([]) is None
    assert Timings(0, 0).reuse == 0.0


def test_json_body() -> None:
    scanner = TimingsScanner(streaming=False)
    body = json.dumps({"choices": [], "timings": TIMINGS}).encode()
    for i in range(0, len(body), 7):
        scanner.feed(body[i : i + 7])
    assert scanner.close() == Timings(1200, 80, 12.5)


def test_sse_whole_and_crlf() -> None:
    for data in (STREAM, STREAM.replace(b"\n", b"\r\n")):
        scanner = TimingsScanner(streaming=True)
        scanner.feed(data)
        assert scanner.close() == Timings(1200, 80, 12.5)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_sse_any_chunking(cuts: list[int]) -> None:
    scanner = TimingsScanner(streaming=True)
    edges = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(edges):
        scanner.feed(STREAM[a:b])
    assert scanner.close() == Timings(1200, 80, 12.5)


def test_garbage_and_missing_timings() -> None:
    scanner = TimingsScanner(streaming=True)
    scanner.feed(b'data: {"timings": broken\n\ndata: not json\n\n')
    assert scanner.close() is None
    scanner = TimingsScanner(streaming=False)
    scanner.feed(b"<html>502</html>")
    assert scanner.close() is None


def test_oversized_body_is_not_buffered() -> None:
    scanner = TimingsScanner(streaming=False)
    scanner.feed(b" " * (MAX_BUFFER + 1))
    scanner.feed(json.dumps({"timings": TIMINGS}).encode())
    assert scanner.close() is None


def test_oversized_line_then_resync() -> None:
    scanner = TimingsScanner(streaming=True)
    scanner.feed(b"data: " + b"x" * (MAX_BUFFER + 1))
    scanner.feed(b"\n\n" + STREAM)
    assert scanner.close() == Timings(1200, 80, 12.5)


def test_anthropic_usage_stands_for_timings() -> None:
    body = {"type": "message", "usage": {"cache_read_input_tokens": 900, "input_tokens": 30}}
    assert Timings.from_json(body) == Timings(900, 30)
    start = {"type": "message_start", "message": {"usage": {**body["usage"], "output_tokens": 0}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 5}}
    raw = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
        for e in (start, delta)
    )
    scanner = TimingsScanner(streaming=True)
    scanner.feed(raw)
    assert scanner.close() == Timings(900, 30)


def test_responses_usage_stands_for_timings() -> None:
    usage = {"input_tokens": 100, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 96}}
    assert Timings.from_json({"object": "response", "usage": usage}) == Timings(96, 4)
    completed = {"type": "response.completed", "response": {"usage": usage}}
    assert Timings.from_json(completed) == Timings(96, 4)
    # timings, when present, win over usage.
    both = {**completed, "timings": TIMINGS}
    assert Timings.from_json(both) == Timings(1200, 80, 12.5)
    assert Timings.from_json({"usage": {"output_tokens": 1}}) is None
    bad = {"usage": {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 5}}}
    assert Timings.from_json(bad) is None
