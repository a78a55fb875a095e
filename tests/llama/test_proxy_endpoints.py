"""Byte-level units of the proxy on every generation endpoint, against a recording stand-in
upstream (not llama-server: warming fails there, fail-open): request bodies arrive as
sent (a billing header aside), plain and streamed answers come back byte for byte, and
the reuse is read from ``usage`` where llama-server reports no ``timings``."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pion.llama.config import WarmerConfig
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy, serve_in_thread
from support import count, wait_log

ANTHROPIC_SSE = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"m","usage":'
    b'{"cache_read_input_tokens":900,"input_tokens":30,"output_tokens":0}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"\xc3\xa9"}}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","usage":{"output_tokens":2}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)
ANTHROPIC_JSON = (
    b'{"type": "message", "content": [], "usage": {"cache_read_input_tokens": 40,'
    b'  "input_tokens": 2, "output_tokens": 1}}'
)
RESPONSES_SSE = (
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"r"}}\n\n'
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"usage":{"input_tokens":100,'
    b'"output_tokens":2,"input_tokens_details":{"cached_tokens":96}}}}\n\n'
)
RESPONSES_JSON = (
    b'{"object":"response","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":45}}}'
)
COMPLETION_JSON = b'{"content":"x","timings":{"cache_n":7,"prompt_n":3}}'

ANSWERS: dict[str, tuple[bytes, bytes]] = {
    "/v1/messages": (ANTHROPIC_JSON, ANTHROPIC_SSE),
    "/v1/responses": (RESPONSES_JSON, RESPONSES_SSE),
    "/completion": (
        COMPLETION_JSON,
        b'data: {"content":"x","timings":{"cache_n":7,"prompt_n":3}}\n\n',
    ),
    "/v1/completions": (COMPLETION_JSON, b"data: " + COMPLETION_JSON + b"\n\ndata: [DONE]\n\n"),
}
HEADER = "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"


class Upstream:
    """Records requests; answers generation paths with fixed bytes, the rest with 404."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []
        methods = ["GET", "POST", "HEAD"]
        self.app = Starlette(routes=[Route("/{p:path}", self.handle, methods=methods)])

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        self.requests.append((request.url.path + "?" + request.url.query, body))
        answer = ANSWERS.get(request.url.path)
        if answer is None:
            return Response(b'{"error":"not llama-server"}', status_code=404)
        if not json.loads(body).get("stream"):
            return Response(answer[0], media_type="application/json")
        raw = answer[1]
        cuts = sorted({0, 7, 60, 61, len(raw) // 2, len(raw)} & set(range(len(raw) + 1)))

        async def chunks() -> AsyncIterator[bytes]:
            for a, b in itertools.pairwise(cuts):
                yield raw[a:b]

        return StreamingResponse(chunks(), media_type="text/event-stream")


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Upstream, str, str, Path]]:
    up = Upstream()
    log = tmp_path / "prefix-cache.log"
    with serve_in_thread(up.app) as up_url:
        proxy = PrefixProxy(WarmerConfig(base_url=up_url, log_path=log, timeout=10))
        with running_proxy(proxy) as url:
            yield up, up_url, url, log


def body_for(path: str, stream: bool) -> dict[str, Any]:
    if path == "/v1/messages":
        return {"system": [{"type": "text", "text": "s"}], "messages": [], "stream": stream}
    if path == "/v1/responses":
        return {"instructions": "Be Codex.", "input": "hi", "stream": stream}
    return {"prompt": "Once upon a time", "stream": stream}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", sorted(ANSWERS))
def test_bodies_pass_byte_for_byte(
    path: str, stream: bool, proxied: tuple[Upstream, str, str, Path]
) -> None:
    up, up_url, url, log = proxied
    sent = (json.dumps(body_for(path, stream), indent=2) + "\n").encode()
    query = "?beta=true" if path == "/v1/messages" else ""

    def fetch(base: str) -> bytes:
        with httpx.stream("POST", base + path + query, content=sent) as resp:
            assert resp.status_code == 200
            return b"".join(resp.iter_raw())

    direct, through = fetch(up_url), fetch(url)
    assert through == direct == ANSWERS[path][int(stream)]
    assert up.requests[-1] == (path + "?" + query.lstrip("?"), sent)
    expected = {
        "/v1/messages": (30, 900) if stream else (2, 40),
        "/v1/responses": (4, 96) if stream else (5, 45),
        "/completion": (3, 7),
        "/v1/completions": (3, 7),
    }[path]
    line = f"observed normal request: prompt_n={expected[0]} cache_n={expected[1]}"
    assert count(wait_log(log, line), line) == 1


def test_billing_header_removed_and_nothing_else(
    proxied: tuple[Upstream, str, str, Path],
) -> None:
    up, _up_url, url, log = proxied
    body = {
        "model": "m",
        "system": [
            {"type": "text", "text": HEADER},
            {"type": "text", "text": "You are Claude Code, é.", "cache_control": {"type": "x"}},
        ],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1.5e3,
    }
    resp = httpx.post(url + "/v1/messages?beta=true", json=body)
    assert resp.status_code == 200
    got = json.loads(up.requests[-1][1])
    assert got == {**body, "system": body["system"][1:]}
    status = httpx.get(url + STATUS_PATH).json()
    assert status["events"]["billing_headers_removed"] == 1
    lines = wait_log(log, "removed Claude Code's billing-header system block")
    assert count(lines, HEADER) == 1


def test_billing_header_kept_with_the_flag(tmp_path: Path) -> None:
    up = Upstream()
    body = {"system": [{"type": "text", "text": HEADER}], "messages": []}
    sent = json.dumps(body).encode()
    with serve_in_thread(up.app) as up_url:
        config = WarmerConfig(base_url=up_url, log_path=None, keep_billing_header=True)
        with running_proxy(PrefixProxy(config)) as url:
            httpx.post(url + "/v1/messages", content=sent)
    assert up.requests[-1][1] == sent


def test_head_root_and_count_tokens_pass_through(
    proxied: tuple[Upstream, str, str, Path],
) -> None:
    up, _up_url, url, _log = proxied
    assert httpx.head(url + "/").status_code == 404
    resp = httpx.post(url + "/v1/messages/count_tokens", content=b'{"messages":[]}')
    assert resp.status_code == 404
    assert up.requests[-2:] == [("/?", b""), ("/v1/messages/count_tokens?", b'{"messages":[]}')]
