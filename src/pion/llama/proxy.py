"""`pion llama proxy`: an OpenAI-compatible reverse proxy that warms the prefix first.

Owns the HTTP side of `pion llama` (docs/llama.md; a starlette app, run by uvicorn,
:mod:`pion.llama.httpserver`), on one event loop with the warmer:

- ``POST`` to a generation endpoint (:data:`pion.llama.endpoints.ENDPOINTS`: chat
  completions, ``/v1/messages``, ``/v1/responses``, the raw completions): find the stable
  prefix, lease a slot and warm it there (:meth:`PrefixWarmer.claim`), forward the
  request pinned to that slot, relay the answer, and only then end the lease
  (:meth:`PrefixWarmer.finish`, in a task no answer waits for: the observation and any
  save run while the slot is still the request's). A body over
  :data:`~pion.llama.prompt.MAX_WARM_BODY` is streamed to llama-server as it arrives,
  never buffered whole, never parsed; a body that is not JSON, not an object or nested
  too deep is forwarded as sent, unwarmed.
- every other method and path (``/v1/models``, ``/health``, ``/slots``, ``HEAD /``,
  ``/v1/messages/count_tokens``, ...) is forwarded untouched.
- ``GET /pion/status``: the warmer's state as JSON (``pion llama status --proxy URL``);
  it never waits on a lease or on llama-server, nor on the event loop: the front door's
  thread answers it (:meth:`PrefixProxy.status_json`, :mod:`pion.llama.frontdoor`).
  ``GET /pion/metrics``: the routing decisions, each server's health, load and tokens
  reused, for Prometheus (:mod:`pion.llama.metrics`).
- several upstreams: :class:`~pion.llama.fleet.Fleet` picks the server for each request
  (the others go to the least loaded); a server that refuses the connection is taken
  out and a request read whole is routed again, one that is taken out while a request
  awaits its answer's head gets that request a 502.

Invariants: the request body is forwarded byte for byte (the bytes read, not a re-encoded
parse), with two exceptions: Claude Code's billing-header block is removed from a
``/v1/messages`` body (re-encoded, same values otherwise; ``--keep-billing-header`` keeps
it), and a warmed request is pinned to its slot by inserting ``"id_slot":N,`` right after
the body's opening brace (:func:`pin_slot`; everything else stays as sent; a request that
names its own ``id_slot`` is left alone and not warmed). llama-server b11434 drops
``id_slot`` from ``/v1/messages`` (its Anthropic conversion copies only the fields it
knows), so such a request is not pinned; with ``--slots`` it leases every slot instead,
so wherever llama-server places it, it takes no slot another request owns. The response
body is streamed back chunk by chunk as it arrives, unchanged, while a sans-IO scanner
reads ``timings`` from it (the JSON body or the final SSE event). Hop-by-hop headers are
not forwarded (RFC 9110 section 7.6.1). When the upstream is unreachable the client gets
a 502, when it sends nothing for ``--upstream-timeout`` seconds a 504, both in
llama-server's error shape; the proxy itself never fails a request because of the warmer
(fail-open).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pion.llama import httpserver, metrics
from pion.llama.config import WarmerConfig
from pion.llama.endpoints import ENDPOINTS, EndpointKind, strip_billing_header
from pion.llama.fleet import CONNECT_TIMEOUT, Fleet
from pion.llama.httpserver import read_body, serve_in_thread
from pion.llama.prompt import MAX_WARM_BODY
from pion.llama.status import redact_url
from pion.llama.timings import TimingsScanner
from pion.llama.upstream import Upstream, unless_down
from pion.llama.warmer import PrefixWarmer, Ticket

__all__ = [
    "CHAT_PATHS",
    "STATUS_PATH",
    "PrefixProxy",
    "pin_slot",
    "running_proxy",
    "serve",
    "serve_in_thread",
]

T = TypeVar("T")

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
STATUS_PATH = "/pion/status"
METRICS_PATH = "/pion/metrics"

# Seconds the front door waits for the event loop to run what it has queued before it
# reads the status in its own thread (:meth:`PrefixProxy.status_json`). A loop that is
# not busy does so within a millisecond: the answer then holds all that the loop did
# before the request came, as when the loop answered (tests read the status right after
# an action). A loop busy for longer (a burst) is not waited for.
STATUS_CATCH_UP = 0.005
# Reads of the status in the front door: one that met a table the loop was changing
# ("changed size during iteration") is read again.
_STATUS_READS = 5

# The endpoints whose id_slot llama-server b11434 honours (its Anthropic conversion builds
# a new body from the fields it knows and drops id_slot; the Responses conversion copies
# the body).
_PINNABLE: frozenset[EndpointKind] = frozenset({"chat", "responses", "completion"})

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


async def _aclose(resp: httpx.Response) -> None:
    await resp.aclose()


def _end_to_end(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _HOP_BY_HOP]


def _json_body(data: Any) -> bytes:
    """``data`` as the loop's route sends it (starlette's own rendering, so the front
    door's answer has the same bytes)."""
    return bytes(JSONResponse(data).body)


def _error(code: int, message: str) -> JSONResponse:
    """An answer in llama-server's error shape."""
    kind = "unavailable_error"
    return JSONResponse({"error": {"code": code, "message": message, "type": kind}}, code)


class _Relay(StreamingResponse):
    """A streamed answer whose ticket is finished whatever happens to the response
    (relayed, client gone, cancelled): the lease is always released."""

    def __init__(self, body: AsyncIterator[bytes], status_code: int, done: _Done) -> None:
        super().__init__(body, status_code=status_code)
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done.finish(hung_up=True)


class _Done:
    """Finishes one ticket exactly once: the first caller's word counts."""

    def __init__(self, warmer: PrefixWarmer, ticket: Ticket | None) -> None:
        self.warmer = warmer
        self.ticket = ticket
        self.scanner: TimingsScanner | None = None
        self.failed = False

    def finish(self, *, hung_up: bool = False) -> None:
        ticket, self.ticket = self.ticket, None
        if ticket is None:
            return
        timings = self.scanner.close() if self.scanner is not None else None
        # Timings come with the answer's last event: a client that hung up once it had them
        # (Codex after response.completed, often before the stream's end is read) got its
        # whole answer, and the slot holds what the answer confirmed.
        hung_up = hung_up and timings is None
        self.warmer.spawn(
            self.warmer.finish(ticket, timings, failed=self.failed, hung_up=hung_up),
            "finish",
        )


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


class _Unreachable(Exception):
    """A fleet's server refused the connection before the request was sent: it is taken
    out and the request is routed again."""


class PrefixProxy:
    """The proxy application: a fleet of llama-servers (one, by default), each with its
    warmer and HTTP client; :attr:`warmer` is the first one's."""

    def __init__(
        self, config: WarmerConfig, warmer: PrefixWarmer | None = None, fleet: Fleet | None = None
    ) -> None:
        self.config = config
        self.fleet = fleet or Fleet([warmer or PrefixWarmer(config)])
        self.warmer = self.fleet.servers[0].warmer
        self.app = Starlette(
            routes=[
                Route(STATUS_PATH, self._status, methods=["GET"]),
                Route(METRICS_PATH, self._metrics, methods=["GET"]),
                Route(
                    "/{path:path}",
                    self._forward,
                    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"],
                ),
            ],
            lifespan=self._lifespan,
        )
        # Forwarded requests: no read limit on a connection pool slot, a read timeout
        # that tells a wedged llama-server from a slow one.
        t = config.upstream_timeout
        connect = 10.0 if self.fleet.single else CONNECT_TIMEOUT
        self._timeout = httpx.Timeout(connect=connect, read=t, write=t, pool=None)
        self.upstream_errors: dict[str, Any] = {"timeouts": 0, "unreachable": 0, "last": None}
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """From another thread (tests, benchmarks, embedding): run ``coro`` on the running
        proxy's event loop and wait for its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def flush(self, timeout: float = 60.0) -> bool:
        """From another thread: wait for the post-answer work and background pushes
        submitted so far on the running proxy."""
        if self._loop is None:
            return True
        return self.call(self.fleet.flush(timeout), timeout + 5.0)

    def status(self) -> dict[str, Any]:
        """From another thread: what ``GET /pion/status`` answers."""
        return self.call(self._status_data())

    def status_json(self) -> bytes:
        """``GET /pion/status``'s body, read in the front door's thread while the loop
        runs (:mod:`pion.llama.frontdoor`): never waits on the loop for longer than
        :data:`STATUS_CATCH_UP`."""
        loop = self._loop
        if loop is not None:
            caught_up = threading.Event()
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(caught_up.set)
                caught_up.wait(STATUS_CATCH_UP)
        for _ in range(_STATUS_READS - 1):
            with contextlib.suppress(RuntimeError):
                return _json_body(self._status_now())
        return _json_body(self._status_now())

    def _status_now(self) -> dict[str, Any]:
        data = self.warmer.status_now()
        data["upstream_errors"] = dict(self.upstream_errors)
        data["fleet"] = self.fleet.status_now()
        return data

    @property
    def answers(self) -> httpserver.Answers:
        """What the front door answers off the event loop (:func:`httpserver.run`)."""
        return {STATUS_PATH: self.status_json}

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self.fleet.start()
        try:
            yield
        finally:
            # Shutdown: answers in flight were given uvicorn's grace; every lease ends.
            await self.fleet.aclose()

    async def _status(self, _request: Request) -> Response:
        return JSONResponse(await self._status_data())

    async def _metrics(self, _request: Request) -> Response:
        body = metrics.render(self.fleet, self.upstream_errors)
        return Response(body, media_type=metrics.CONTENT_TYPE_LATEST)

    async def _status_data(self) -> dict[str, Any]:
        data = await self.warmer.status()
        data["upstream_errors"] = dict(self.upstream_errors)
        data["fleet"] = await self.fleet.status()
        return data

    def _parse(self, body: bytes) -> dict[str, Any] | None:
        try:
            parsed = json.loads(body)
        except RecursionError:
            self.warmer.skipped("body nests too deep to parse: forwarded as sent")
            return None
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
    ) -> tuple[bytes, Ticket | None, Upstream]:
        """The body to forward, the ticket of a generation request (None: skipped, not
        observed; a ticket without a lease: forwarded unpinned, observed) and the server
        it goes to."""
        parsed = self._parse(body)
        if parsed is None:
            return body, None, self.fleet.plain()
        if kind == "messages":
            try:
                stripped = self._strip_billing_header(parsed)
            except RecursionError:
                stripped = None
            body = stripped if stripped is not None else body
        if "id_slot" in parsed:
            self.warmer.skipped("the request pins id_slot itself")
            return body, None, self.fleet.plain()
        up, ticket = await self.fleet.claim(kind, parsed, user_agent, pinnable=kind in _PINNABLE)
        if ticket.outcome.kind == "skipped":
            return body, None, up
        if ticket.pin is not None:
            try:
                body = pin_slot(body, ticket.pin)
            except ValueError:
                # JSON that does not start with "{" as bytes (a BOM, UTF-16): forwarded as
                # sent, under the lease all the same.
                self.warmer.log(f"request not pinned to slot {ticket.pin}: {body[:4]!r}")
        return body, ticket, up

    async def _forward(self, request: Request) -> Response:
        try:
            read = await read_body(request, MAX_WARM_BODY)
        except TimeoutError:
            return _error(408, "pion llama proxy: the request body stalled")
        kind = ENDPOINTS.get(request.url.path) if request.method == "POST" else None
        if kind is not None and read.rest is not None:
            self.warmer.skipped(f"body is over {MAX_WARM_BODY} bytes: streamed, not warmed")
        # A body read whole can be sent again: a fleet's server that refuses the
        # connection is taken out and the request routed to another.
        tries = len(self.fleet.servers) if read.rest is None else 1
        for attempt in range(tries):
            ticket: Ticket | None = None
            content: bytes | AsyncIterator[bytes] = read.content()
            up = self.fleet.plain()
            if kind is not None and read.rest is None:
                content, ticket, up = await self._prepare(
                    kind, read.head, request.headers.get("user-agent", "")
                )
            done = _Done(up.warmer, ticket)
            unpinned = kind is not None and (ticket is None or ticket.lease is None)
            try:
                return await self._send(request, content, done, unpinned, attempt + 1 < tries)
            except _Unreachable:
                continue
            except BaseException:
                done.finish(hung_up=True)
                raise
        return _error(502, "pion llama proxy: no llama-server of the fleet answers")

    async def _send(
        self,
        request: Request,
        content: bytes | AsyncIterator[bytes],
        done: _Done,
        unpinned: bool,
        retry: bool = False,
    ) -> Response:
        warmer = done.warmer
        url = warmer.client.base_url + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        http = warmer.client.http
        upstream_req = http.build_request(
            request.method,
            url,
            headers=_end_to_end(request.headers.raw),
            content=content,
            timeout=self._timeout,
        )
        if unpinned:
            # This request may run in any slot: no slot is trusted unchecked from now on,
            # and no request is pinned to a slot it may be running in (see warmer._busy).
            warmer.unpinned_epoch += 1
            warmer.unpinned_inflight += 1
        up = self.fleet.server(warmer)
        try:
            # A fleet's server taken out while the answer's head is awaited: a 502 now,
            # not the upstream timeout (in a fleet of one, nothing is taken out).
            sending = http.send(upstream_req, stream=True)
            sent: httpx.Response | None
            if self.fleet.single:
                sent = await sending
            else:
                sent = await unless_down(up, sending, _aclose)
            if sent is None:
                raise httpx.ReadError("taken out of the fleet while the request waited")
            resp = sent
        except httpx.HTTPError as exc:
            self._unpinned_done(done, unpinned)
            done.failed = True
            done.finish()
            if retry and isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                self.fleet.down(up, f"unreachable: {exc!r}")
                raise _Unreachable from exc
            if isinstance(exc, httpx.TimeoutException):
                detail = f"sent nothing for {self._timeout.read} s ({exc!r})"
                return self._upstream_error(done, 504, "timeout", detail)
            return self._upstream_error(done, 502, "unreachable", f"unreachable: {exc}")
        except BaseException:
            self._unpinned_done(done, unpinned)
            raise
        if done.ticket is not None:
            streaming = "text/event-stream" in resp.headers.get("content-type", "")
            done.scanner = TimingsScanner(streaming)
            self.fleet.forwarded(up, done.ticket)
        response = _Relay(self._relay(resp, done, unpinned), resp.status_code, done)
        # Upstream's headers in upstream's order. Content-Length stays: aiter_raw passes
        # the bytes as sent (no decoding), so the length still holds.
        response.raw_headers = [
            (k, v)
            for k, v in resp.headers.raw
            if k.lower() not in _HOP_BY_HOP or k.lower() == b"content-length"
        ]
        return response

    @staticmethod
    def _unpinned_done(done: _Done, unpinned: bool) -> None:
        if unpinned:
            done.warmer.unpinned_inflight -= 1

    def _upstream_error(self, done: _Done, code: int, what: str, detail: str) -> Response:
        key = "timeouts" if code == 504 else "unreachable"
        self.upstream_errors[key] += 1
        self.upstream_errors["last"] = {
            "code": code,
            "what": what,
            "detail": detail,
            "at": time.time(),
        }
        message = f"pion llama proxy: upstream {done.warmer.client.base_url} {detail}"
        self.warmer.log(message)
        return _error(code, message)

    async def _relay(
        self, resp: httpx.Response, done: _Done, unpinned: bool
    ) -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in resp.aiter_raw():
                if done.scanner is not None:
                    done.scanner.feed(chunk)
                yield chunk
            complete = True
        except httpx.TimeoutException:
            done.failed = True
            self._upstream_error(
                done, 504, "timeout", f"stopped sending for {self._timeout.read} s mid-answer"
            )
            raise
        except httpx.HTTPError as exc:
            # llama-server died or restarted mid-answer: the client's answer is cut short.
            done.failed = True
            self._upstream_error(done, 502, "unreachable", f"failed mid-answer: {exc!r}")
            raise
        finally:
            self._unpinned_done(done, unpinned)
            # Shielded: a client that hangs up as soon as it has its answer (Codex after
            # response.completed) cancels this task; the upstream must still be closed.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            done.finish(hung_up=not complete and not done.failed)


def serve(
    config: WarmerConfig,
    host: str = "127.0.0.1",
    port: int = 8089,
    *,
    upstreams: tuple[str, ...] = (),
    slot_dirs: tuple[Path, ...] = (),
) -> None:
    """Run the proxy in the foreground until interrupted (``upstreams``: several
    llama-servers, :mod:`pion.llama.fleet`; none: ``config.base_url`` alone)."""
    proxy = PrefixProxy(config, fleet=Fleet.from_config(config, upstreams, slot_dirs))
    slots = (
        "slots all"
        if config.all_slots
        else f"slots {','.join(map(str, config.slots))}"
        if config.slots
        else f"slot {config.slot}"
    )
    store = proxy.warmer.store
    targets = ", ".join(u.url for u in proxy.fleet.servers)
    proxy.warmer.log(
        f"proxy listening on http://{host}:{port} → {targets} "
        f"({slots}, persist {'on' if proxy.warmer.index else 'off'}, "
        f"store {redact_url(store.config.url) if store else 'off'}, verify {config.verify})"
    )
    # What was imported and built until now lives as long as the process: out of the
    # collector's reach, a full collection under a burst walks only the requests' objects
    # (it walked every module's too: 100+ ms, the loop and /pion/status held). Here, not
    # in the app: an embedding process (tests) keeps its own collector as it is.
    gc.collect()
    gc.freeze()
    httpserver.run(proxy.app, host, port, proxy.answers)


@contextlib.contextmanager
def running_proxy(proxy: PrefixProxy, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``proxy`` on a background thread (tests, embedding), behind its front door
    (``/pion/status`` off the loop, as ``pion llama proxy``); yield its base URL."""
    with serve_in_thread(proxy.app, host, port, proxy.answers) as url:
        yield url
