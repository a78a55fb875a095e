"""`pion llama proxy`: an OpenAI-compatible reverse proxy that warms the prefix first.

Owns the HTTP side of `pion llama` (docs/llama.md; a starlette app, run by uvicorn):

- ``POST`` to a generation endpoint (:data:`pion.llama.endpoints.ENDPOINTS`: chat
  completions, ``/v1/messages``, ``/v1/responses``, the raw completions): find the stable
  prefix and run :meth:`PrefixWarmer.ensure_for` in a worker thread (warm-ups of one slot
  are serialised by the warmer's per-slot lock), then forward the request. A body over
  :data:`~pion.llama.prompt.MAX_WARM_BODY`, not JSON or not an object is forwarded
  without warming.
- every other method and path (``/v1/models``, ``/health``, ``/slots``, ``HEAD /``,
  ``/v1/messages/count_tokens``, ...) is forwarded untouched.
- ``GET /pion/status``: the warmer's state as JSON (``pion llama status --proxy URL``).

Invariants: the request body is forwarded byte for byte (the bytes read, not a re-encoded
parse), with two exceptions: Claude Code's billing-header block is removed from a
``/v1/messages`` body (re-encoded, same values otherwise; ``--keep-billing-header`` keeps
it), and with several slots (``--slots``) a warmed request is
pinned to its prefix's slot by inserting ``"id_slot":N,`` right after the body's opening
brace (:func:`pin_slot`; everything else stays as sent, and a request that names its own
``id_slot`` is left alone and not warmed); the response body is streamed back chunk by
chunk as it arrives, unchanged, while a sans-IO scanner reads ``timings`` from it (the
JSON body or the final SSE event) for the observed-reuse log line, the fast-path
verification and the receipt. Hop-by-hop headers are not
forwarded (RFC 9110 section 7.6.1). When the upstream is unreachable the client gets a 502
in llama-server's error shape; the proxy itself never fails a request because of the
warmer (fail-open).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio.to_thread
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pion.llama.config import WarmerConfig
from pion.llama.endpoints import ENDPOINTS, EndpointKind, strip_billing_header
from pion.llama.outcome import WARM_KINDS, Outcome
from pion.llama.prompt import MAX_WARM_BODY
from pion.llama.status import redact_url
from pion.llama.timings import TimingsScanner
from pion.llama.warmer import PrefixWarmer

__all__ = [
    "CHAT_PATHS",
    "STATUS_PATH",
    "PrefixProxy",
    "pin_slot",
    "running_proxy",
    "serve",
    "serve_in_thread",
]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
STATUS_PATH = "/pion/status"

# RFC 9110 7.6.1 hop-by-hop fields, plus the ones httpx/uvicorn recompute for the new hop.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)


def _end_to_end(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _HOP_BY_HOP]


_JSON_SPACE = b" \t\r\n"


def pin_slot(body: bytes, slot: int) -> bytes:
    """``body`` (a JSON object without ``id_slot``) with ``"id_slot":slot`` as its first
    member; every other byte unchanged. Raises ValueError when ``body`` does not start
    with an object."""
    start = len(body) - len(body.lstrip(_JSON_SPACE))
    if body[start : start + 1] != b"{":
        raise ValueError("body is not a JSON object")
    rest = body[start + 1 :]
    member = b'"id_slot":%d' % slot
    separator = b"" if rest.lstrip(_JSON_SPACE).startswith(b"}") else b","
    return body[: start + 1] + member + separator + rest


class PrefixProxy:
    """The proxy application: one warmer, one upstream llama-server."""

    def __init__(self, config: WarmerConfig, warmer: PrefixWarmer | None = None) -> None:
        self.config = config
        self.warmer = warmer or PrefixWarmer(config)
        self.upstream = config.base_url
        self._http: httpx.AsyncClient | None = None
        self.app = Starlette(
            routes=[
                Route(STATUS_PATH, self._status, methods=["GET"]),
                Route(
                    "/{path:path}",
                    self._forward,
                    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"],
                ),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        # No read timeout: a generation may pause for minutes between tokens.
        timeout = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)
        self._http = httpx.AsyncClient(timeout=timeout)
        # Forward only what the client sent: drop httpx's default request headers.
        self._http.headers.clear()
        try:
            yield
        finally:
            await self._http.aclose()
            self.warmer.close()

    async def _status(self, _request: Request) -> Response:
        data = await anyio.to_thread.run_sync(self.warmer.status)
        return JSONResponse(data)

    def _parse(self, body: bytes) -> dict[str, Any] | None:
        if len(body) > MAX_WARM_BODY:
            self.warmer.skipped(f"body of {len(body)} bytes is over {MAX_WARM_BODY}: not warmed")
            return None
        try:
            parsed = json.loads(body)
        except ValueError:
            self.warmer.skipped("body is not JSON")
            return None
        if not isinstance(parsed, dict):
            self.warmer.skipped("body is not a JSON object")
            return None
        return parsed

    def _strip_billing_header(self, parsed: dict[str, Any]) -> bytes | None:
        """The body without Claude Code's billing-header block (re-encoded: the same JSON
        values, one block fewer), or None when it has none or the flag keeps it."""
        if self.config.keep_billing_header:
            return None
        removed = strip_billing_header(parsed)
        if removed is None:
            return None
        self.warmer.billing_header_removed(removed)
        return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    async def _prepare(
        self, kind: EndpointKind, body: bytes, user_agent: str
    ) -> tuple[bytes, Outcome | None]:
        """The body to forward and the warm outcome of a generation request."""
        parsed = self._parse(body)
        if parsed is None:
            return body, None
        if kind == "messages":
            stripped = self._strip_billing_header(parsed)
            body = stripped if stripped is not None else body
        if self.config.multi_slot and "id_slot" in parsed:
            self.warmer.skipped("the request pins id_slot itself")
            return body, None
        outcome = await anyio.to_thread.run_sync(self.warmer.ensure_for, kind, parsed, user_agent)
        if outcome.kind == "skipped":
            return body, None
        if self.config.multi_slot and outcome.kind in WARM_KINDS:
            if kind == "messages":
                # llama-server's Anthropic conversion keeps no id_slot: the request goes
                # to the slot whose prompt is most similar, which is the warmed one.
                return body, outcome
            try:
                body = pin_slot(body, outcome.slot)
            except ValueError:
                # JSON that does not start with "{" as bytes (a BOM, UTF-16): forward
                # it as sent; llama-server then picks the slot by prompt similarity.
                self.warmer.log(f"request not pinned to slot {outcome.slot}: {body[:4]!r}")
        return body, outcome

    async def _forward(self, request: Request) -> Response:
        http = self._http
        if http is None:
            raise RuntimeError("proxy used outside its lifespan")
        body = await request.body()
        outcome: Outcome | None = None
        kind = ENDPOINTS.get(request.url.path) if request.method == "POST" else None
        if kind is not None:
            body, outcome = await self._prepare(kind, body, request.headers.get("user-agent", ""))
        url = self.upstream + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        upstream_req = http.build_request(
            request.method, url, headers=_end_to_end(request.headers.raw), content=body
        )
        try:
            resp = await http.send(upstream_req, stream=True)
        except httpx.HTTPError as exc:
            self.warmer.log(f"upstream {self.upstream} unreachable: {exc!r}")
            if outcome is not None:
                self.warmer.observe(outcome, None)
            error = {
                "code": 502,
                "message": f"pion llama proxy: upstream {self.upstream} unreachable: {exc}",
                "type": "unavailable_error",
            }
            return JSONResponse({"error": error}, status_code=502)
        scanner = None
        if outcome is not None:
            streaming = "text/event-stream" in resp.headers.get("content-type", "")
            scanner = TimingsScanner(streaming)
        response = StreamingResponse(
            self._relay(resp, scanner, outcome), status_code=resp.status_code
        )
        # Upstream's headers in upstream's order. Content-Length stays: aiter_raw passes
        # the bytes as sent (no decoding), so the length still holds.
        response.raw_headers = [
            (k, v)
            for k, v in resp.headers.raw
            if k.lower() not in _HOP_BY_HOP or k.lower() == b"content-length"
        ]
        return response

    async def _relay(
        self, resp: httpx.Response, scanner: TimingsScanner | None, outcome: Outcome | None
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                if scanner is not None:
                    scanner.feed(chunk)
                yield chunk
        finally:
            await resp.aclose()
            if scanner is not None and outcome is not None:
                timings = scanner.close()
                # Shielded: a client that hangs up as soon as it has its answer (Codex
                # after response.completed) cancels this task, and the observation
                # (verification, receipt, a queued save) must still happen.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.warmer.observe, outcome, timings)


def _uvicorn_options(host: str, port: int) -> dict[str, Any]:
    # No Server/Date headers of our own: the upstream's pass through unchanged.
    return {
        "host": host,
        "port": port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
    }


def serve(config: WarmerConfig, host: str = "127.0.0.1", port: int = 8089) -> None:
    """Run the proxy in the foreground until interrupted."""
    proxy = PrefixProxy(config)
    slots = (
        "slots all"
        if config.all_slots
        else f"slots {','.join(map(str, config.slots))}"
        if config.slots
        else f"slot {config.slot}"
    )
    store = proxy.warmer.store
    proxy.warmer.log(
        f"proxy listening on http://{host}:{port} → {config.base_url} "
        f"({slots}, persist {'on' if proxy.warmer.index else 'off'}, "
        f"store {redact_url(store.config.url) if store else 'off'}, verify {config.verify})"
    )
    uvicorn.run(proxy.app, **_uvicorn_options(host, port))


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a background thread (real TCP); yield its URL."""
    config = uvicorn.Config(app, **_uvicorn_options(host, port))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="pion-llama-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("server failed to start")
        threading.Event().wait(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def running_proxy(proxy: PrefixProxy, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``proxy`` on a background thread (tests, embedding); yield its base URL."""
    with serve_in_thread(proxy.app, host, port) as url:
        yield url
