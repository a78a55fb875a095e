"""A timing pass-through in front of llama-server or the proxy: what a harness waits for.

Owns :class:`Recorder`, a small ASGI reverse proxy (starlette + httpx, served on a
thread by :func:`pion.llama.proxy.serve_in_thread`) that forwards every request as sent
and streams every answer back unchanged, recording per request the path, the body size,
the seconds to the first generated token (the first streamed event that carries one:
a chat ``delta`` with content, a Responses ``output_text``/function-call delta, a
Messages ``content_block_delta``; the whole answer when it is not streamed) and to the
last byte. ``bench/agents.py`` puts one in front of each side it compares, so direct
and proxied sessions are timed the same way.

With ``answer_cap`` it also caps every answer (:func:`cap_answer`): a harness asks for
thousands of tokens and llama-server's ``-n`` does not bound what a request asks for,
so the tests and the benchmark put a capping recorder right in front of llama-server.
The prompt is not touched: only the answer-length field of a generation request is set
(``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``, ``n_predict``). A
request that already names ``n_predict`` (the proxy's warm-ups: ``n_predict: 0``)
passes as sent. Test and benchmark scaffolding.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pion.llama.proxy import serve_in_thread

__all__ = ["Exchange", "Recorder", "cap_answer", "recording", "session_start"]

GENERATION_PATHS = ("/chat/completions", "/responses", "/messages", "/completion")
_TOKEN_MARKERS = (
    b'"delta":{"content":"',
    b'"delta":{"reasoning_content":"',
    b'"delta":{"tool_calls"',
    b"response.output_text.delta",
    b"response.function_call_arguments.delta",
    b"response.reasoning_text.delta",
    b"content_block_delta",
)
_HOP = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})


@dataclass
class Exchange:
    """One request through the recorder."""

    method: str
    path: str
    body_bytes: int
    started: float = 0.0  # time.perf_counter() when the request arrived
    status: int = 0
    # None until a token arrived, and left None when the client hung up before one did.
    first_token_s: float | None = None
    total_s: float | None = None

    @property
    def generation(self) -> bool:
        return self.method == "POST" and any(p in self.path for p in GENERATION_PATHS)


def cap_answer(path: str, body: bytes, cap: int) -> bytes:
    """``body`` with its answer length set to at most ``cap`` tokens (by endpoint); a
    body that is not a JSON object, or names ``n_predict``, comes back as sent."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or "n_predict" in data:
        return body
    if path.endswith("/responses"):
        fields = ["max_output_tokens"]
    elif path.endswith("/messages") or path.endswith("/chat/completions"):
        fields = ["max_tokens"] + [f for f in ("max_completion_tokens",) if f in data]
    else:  # raw completions
        fields = ["n_predict"]
    for field in fields:
        value = data.get(field)
        data[field] = min(value, cap) if isinstance(value, int) and value > 0 else cap
    return json.dumps(data).encode()


class Recorder:
    """Forwards everything to ``upstream``; :attr:`exchanges` lists what went through."""

    def __init__(self, upstream: str, answer_cap: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.answer_cap = answer_cap
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route(
                    "/{path:path}",
                    self._forward,
                    methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"],
                )
            ]
        )

    def since(self, n: int) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges[n:])

    def count(self) -> int:
        with self._lock:
            return len(self.exchanges)

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        started = time.perf_counter()
        exchange = Exchange(request.method, request.url.path, len(body), started)
        if (
            self.answer_cap is not None
            and exchange.generation
            and not request.url.path.endswith(("/count_tokens", "/input_tokens"))
        ):
            body = cap_answer(request.url.path, body, self.answer_cap)
        with self._lock:
            self.exchanges.append(exchange)
        url = self.upstream + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP]
        client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None))
        try:
            upstream = await client.send(
                client.build_request(request.method, url, headers=headers, content=body),
                stream=True,
            )
        except httpx.HTTPError:
            await client.aclose()
            exchange.status = 502
            return Response(status_code=502)
        exchange.status = upstream.status_code

        async def relay() -> AsyncIterator[bytes]:
            seen = b""
            whole = False
            try:
                async for chunk in upstream.aiter_raw():
                    if exchange.first_token_s is None:
                        seen = (seen + chunk)[-65536:]
                        if any(m in seen for m in _TOKEN_MARKERS):
                            exchange.first_token_s = time.perf_counter() - started
                    yield chunk
                whole = True
            finally:
                await upstream.aclose()
                await client.aclose()
                exchange.total_s = time.perf_counter() - started
                # An answer that is not streamed arrives whole; a client that hung up
                # (a harness giving up on a slow request) got no token at all.
                if exchange.first_token_s is None and whole:
                    exchange.first_token_s = exchange.total_s

        response = StreamingResponse(relay(), status_code=upstream.status_code)
        response.raw_headers = [
            (k, v)
            for k, v in upstream.headers.raw
            if k.lower() not in _HOP or k.lower() == b"content-length"
        ]
        return response


def session_start(exchanges: list[Exchange], share: float = 0.9) -> tuple[float, Exchange]:
    """What a harness's user waits for: from the arrival of the session's main request
    to the first token of the first main request that got one, and that request.

    The main requests are the generation requests at least ``share`` as large as the
    largest: the first one, the same request sent again when the harness gave up on it
    (Claude Code does after 5 minutes), and the follow-ups that extend it (a harness
    continues after a capped answer); side requests such as a title are much smaller.
    """
    generations = [e for e in exchanges if e.generation]
    if not generations:
        raise ValueError("no generation request")
    largest = max(e.body_bytes for e in generations)
    mains = [e for e in generations if e.body_bytes >= share * largest]
    answered = next((e for e in mains if e.first_token_s is not None), None)
    if answered is None or answered.first_token_s is None:
        raise ValueError("no main request got a token")
    return answered.started + answered.first_token_s - mains[0].started, answered


@contextlib.contextmanager
def recording(upstream: str, answer_cap: int | None = None) -> Iterator[tuple[Recorder, str]]:
    """A :class:`Recorder` in front of ``upstream`` on a free port; yields it and its URL."""
    recorder = Recorder(upstream, answer_cap)
    with serve_in_thread(recorder.app) as url:
        yield recorder, url
