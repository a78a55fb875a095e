"""A fake llama-server (b11434) for the `pion llama` tests: an asyncio HTTP/1.1 server
(h11 over asyncio streams) on 127.0.0.1, port 0, that makes interleavings deterministic.

Owns the server side: routing, ``-np N`` slots with llama-server's rules, slot files
in a real ``--slot-save-path`` dir, and the test controls. What the model computes
(tokens, rendering, answer shapes) is :mod:`support.fake_llama_model`; the HTTP
connection, the gates and the records are :mod:`support.fake_llama_http`.

llama-server's rules it follows (``tools/server/server-context.cpp``):

- a request with ``id_slot`` >= 0 runs in that slot (modulo the slot count), waiting
  while it is busy; ``/v1/messages`` loses ``id_slot`` in the Anthropic conversion, a
  Responses body keeps it; an unpinned request takes the idle slot whose tokens share
  the longest common prefix with its prompt when that is over ``similarity`` (0.1) of
  the prompt, else the least recently used idle slot (ties: the last one); with no idle
  slot it waits (deferred, first come first served);
- ``cache_n`` is the longest common token prefix of the slot's tokens and the prompt,
  at most ``len(prompt) - 1`` (one token is always evaluated), 0 with
  ``cache_prompt: false``; the slot then holds the prompt plus the generated tokens but
  the last;
- ``/slots`` shows ``n_prompt_tokens`` (the slot's tokens) once a task ran in it since
  the start; a restore does not count as one; a failed restore empties the slot.

Test controls: :meth:`FakeLlamaServer.hold` (a :class:`Gate` that stops requests of an
endpoint at a point until released), :meth:`~FakeLlamaServer.fail` (an error answer or
a dropped connection, once or always), :meth:`~FakeLlamaServer.delay`,
:meth:`~FakeLlamaServer.restart` (slots cleared, open connections cut, slot dir kept),
:meth:`~FakeLlamaServer.kill` and :meth:`~FakeLlamaServer.revive` (the port refuses
connections, then answers again, restarted),
and :attr:`~FakeLlamaServer.records` (one :class:`Record` per request). Start it with
:func:`fake_llama_server` (a thread with its own loop, for sync tests) or
:func:`running_fake_llama` (in the test's own loop). Every control is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
from pion_testing.testmodel import CHAT_TEMPLATE

from support.fake_llama_http import (
    Conn,
    Dropped,
    Failure,
    FakeSlot,
    Gate,
    Record,
    Responder,
    common_prefix,
)
from support.fake_llama_model import (
    RESTORE_ERROR,
    Answer,
    answer_body,
    decode_slot_file,
    encode_slot_file,
    error_body,
    generate,
    n_predict,
    prompt_tokens,
    render_chat,
    stream_events,
    tokenize,
    tokenize_pieces,
    valid_filename,
)

__all__ = [
    "FakeLlamaServer",
    "FakeSlot",
    "Gate",
    "Record",
    "fake_llama_server",
    "running_fake_llama",
]

GENERATION = {
    "/completion": "completion",
    "/completions": "completion",
    "/v1/completions": "completion",
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/responses": "responses",
}
SIMPLE = {"/health": "health", "/props": "props", "/slots": "slots"}
POSTS = {"/tokenize": "tokenize", "/apply-template": "apply-template"}


class FakeLlamaServer:
    """The fake server's state and controls; see the module docstring."""

    def __init__(
        self,
        slot_dir: Path,
        *,
        n_slots: int = 1,
        n_ctx: int = 4096,
        model_path: str = "/models/fake-tiny.gguf",
        model_alias: str | None = None,
        build_info: str = "b11434-fake",
        similarity: float = 0.1,
        bytes_per_token: int = 64,
        default_n_predict: int = 4,
        prompt_ms_per_token: float = 0.25,
    ) -> None:
        if n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        self.slot_dir = Path(slot_dir)
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.model_path, self.model_alias = model_path, model_alias or model_path
        self.build_info, self.similarity = build_info, similarity
        self.bytes_per_token, self.default_n_predict = bytes_per_token, default_n_predict
        self.prompt_ms_per_token = prompt_ms_per_token
        self.records: list[Record] = []
        self.counts: Counter[str] = Counter()
        self.starts = 1
        self.port = 0
        self._lock = threading.Lock()
        self._gates: list[Gate] = []
        self._failures: dict[str, list[Failure]] = {}
        self._delays: dict[str, float] = {}
        self.slots = self._new_slots()
        self._deferred: list[tuple[int | None, list[int] | None, asyncio.Future[FakeSlot]]] = []
        self._clock = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[asyncio.StreamWriter, asyncio.Task[Any] | None] = {}

    # --- lifecycle ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on port 0 the first time, on the same port again after :meth:`kill`."""
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve_conn, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._cut_connections()
            await self._server.wait_closed()
            self._server = None

    def _new_slots(self) -> list[FakeSlot]:
        return [FakeSlot(i, self.n_ctx) for i in range(self.n_slots)]

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the server's loop and wait for it (directly when already there)."""
        loop = self._loop
        if loop is None:
            fn()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn()
            return

        async def call() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(call(), loop).result(30)

    def restart(self) -> None:
        """Like a restarted llama-server process: every open connection is cut, every
        waiting request gone, slots empty (no ``n_prompt_tokens``); the slot dir stays."""
        self._on_loop(self._restart)

    def _restart(self) -> None:
        self.starts += 1
        self._cut_connections()
        deferred, self._deferred = self._deferred, []
        for _, _, fut in deferred:
            fut.cancel()
        self.slots = self._new_slots()

    def kill(self) -> None:
        """Like a killed llama-server process: the port refuses connections, open ones
        are cut. :meth:`revive` starts it again."""
        self._run(self.stop())

    def revive(self) -> None:
        """A killed server started again on its port: slots empty, the slot dir kept."""
        self._on_loop(self._restart)
        self._run(self.start())

    def _run(self, coro: Any) -> None:
        if self._loop is None:
            raise RuntimeError("the fake llama-server was never started")
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def _cut_connections(self) -> None:
        for writer, task in list(self._conns.items()):
            writer.transport.abort()
            if task is not None:
                task.cancel()
        self._conns.clear()

    # --- controls ------------------------------------------------------------------

    def hold(self, endpoint: str, at: str = "start", skip: int = 0) -> Gate:
        """A gate for ``endpoint`` (``completion``, ``chat``, ``messages``, ``responses``,
        ``save``, ``restore``, ``erase``, ``tokenize``, ``apply-template``, ``props``,
        ``slots``, ``health``); the first ``skip`` requests pass."""
        if at not in ("start", "answer", "end"):
            raise ValueError("at must be 'start', 'answer' or 'end'")
        gate = Gate(endpoint, at, skip)
        with self._lock:
            self._gates.append(gate)
        return gate

    def unhold(self, gate: Gate) -> None:
        gate.release()
        with self._lock:
            self._gates = [g for g in self._gates if g is not gate]

    def fail(
        self,
        endpoint: str,
        status: int = 500,
        message: str = "injected failure",
        *,
        drop: bool = False,
        after_events: int | None = None,
        times: int | None = 1,
    ) -> None:
        """The next ``times`` requests of ``endpoint`` (every one: None) fail: an error
        answer in llama-server's shape, or a cut connection (``drop``; with
        ``after_events``, a stream cut after that many events)."""
        with self._lock:
            failure = Failure(status, message, drop, after_events, times)
            self._failures.setdefault(endpoint, []).append(failure)

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def delay(self, endpoint: str, seconds: float) -> None:
        """Every request of ``endpoint`` waits ``seconds`` before it is handled (0: none)."""
        with self._lock:
            self._delays[endpoint] = seconds

    def slot_tokens(self, slot: int) -> list[int]:
        return list(self.slots[slot].tokens)

    def records_for(self, endpoint: str) -> list[Record]:
        return [r for r in list(self.records) if r.endpoint == endpoint]

    def _take_failure(self, endpoint: str) -> Failure | None:
        with self._lock:
            pending = self._failures.get(endpoint)
            if not pending:
                return None
            failure = pending[0]
            if failure.times is not None:
                failure.times -= 1
                if failure.times <= 0:
                    pending.pop(0)
            return failure

    async def _gate(self, endpoint: str, at: str) -> None:
        with self._lock:
            gates = [g for g in self._gates if g.endpoint == endpoint and g.at == at]
        for gate in gates:
            await gate.passage()

    # --- slots ---------------------------------------------------------------------

    def _choose(self, pinned: int | None, tokens: list[int] | None) -> FakeSlot | None:
        if pinned is not None:
            slot = self.slots[pinned % len(self.slots)]
            return None if slot.busy else slot
        idle = [s for s in self.slots if not s.busy]
        best, best_sim = None, 0.0
        for slot in idle:
            if tokens and slot.tokens:
                sim = common_prefix(slot.tokens, tokens) / len(tokens)
                if sim > best_sim and sim > self.similarity:
                    best, best_sim = slot, sim
        if best is not None:
            return best
        for slot in idle:
            if best is None or slot.t_last_used <= best.t_last_used:
                best = slot
        return best

    def _dispatch_slots(self) -> None:
        for entry in list(self._deferred):
            pinned, tokens, fut = entry
            if fut.done():
                self._deferred.remove(entry)
                continue
            slot = self._choose(pinned, tokens)
            if slot is not None:
                slot.busy = True
                self._deferred.remove(entry)
                fut.set_result(slot)

    async def _claim(self, pinned: int | None, tokens: list[int] | None) -> FakeSlot:
        fut: asyncio.Future[FakeSlot] = asyncio.get_running_loop().create_future()
        self._deferred.append((pinned, tokens, fut))
        self._dispatch_slots()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release(fut.result())
            raise

    def _release(self, slot: FakeSlot) -> None:
        if slot not in self.slots:  # a slot of the process before a restart
            return
        slot.busy = False
        self._clock += 1
        slot.t_last_used = self._clock
        self._dispatch_slots()

    # --- HTTP ------------------------------------------------------------------------

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(h11.Connection(h11.SERVER), reader, writer)
        self._conns[writer] = None
        try:
            while True:
                request = await conn.read_request()
                if request is None:
                    return
                await self._handle(conn, *request)
                if conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
                    return
                conn.h11.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, Dropped, asyncio.CancelledError):
            pass
        finally:
            self._conns.pop(writer, None)
            if conn.pending is not None:
                conn.pending.cancel()
            writer.transport.abort()

    async def _handle(self, conn: Conn, method: str, target: str, raw: bytes) -> None:
        resp = Responder(conn.h11, conn.writer)
        task = asyncio.ensure_future(self._route(resp, method, target, raw))
        self._conns[conn.writer] = task
        # A client that hangs up cancels its request, as llama-server does; the read stays
        # pending into the next request on this connection when the client says nothing.
        watcher = conn.next_read()
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and not conn.take_read():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Dropped):
                    await task
                raise ConnectionResetError("client went away")
            await task
        finally:
            self._conns[conn.writer] = None

    async def _route(self, resp: Responder, method: str, target: str, raw: bytes) -> None:
        url = urlsplit(target)
        path = url.path.rstrip("/") or "/"
        if method == "GET" and path in SIMPLE:
            endpoint, kind = SIMPLE[path], None
        elif method == "POST" and path in POSTS:
            endpoint, kind = POSTS[path], None
        elif method == "POST" and path in GENERATION:
            kind = GENERATION[path]
            endpoint = kind
        elif method == "POST" and path.startswith("/slots/"):
            action = parse_qs(url.query).get("action", [""])[0]
            endpoint, kind = action or "slot-action", None
        else:
            await resp.json(404, error_body(404, "File Not Found"))
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        record = Record(endpoint, path, body, start=self.starts)
        resp.record = record
        self.records.append(record)
        self.counts[endpoint] += 1
        try:
            await self._answer(resp, record, endpoint, kind, path)
        except asyncio.CancelledError:
            record.cancelled = True
            raise

    async def _answer(
        self, resp: Responder, record: Record, endpoint: str, kind: str | None, path: str
    ) -> None:
        seconds = self._delays.get(endpoint, 0.0)
        if seconds:
            await asyncio.sleep(seconds)
        failure = self._take_failure(endpoint)
        if failure is not None and failure.after_events is None:
            if failure.drop:
                resp.drop()
            await resp.json(failure.status, error_body(failure.status, failure.message))
            return
        if failure is not None:
            resp.cut_after = failure.after_events
        body = record.body
        if body is None or (endpoint not in SIMPLE.values() and not isinstance(body, dict)):
            await resp.json(400, error_body(400, "Invalid JSON body"))
            return
        if kind is not None:
            await self._generate(resp, record, kind, body)
        elif path.startswith("/slots/"):
            await self._slot_action(resp, record, path, endpoint, body)
        else:
            await self._gate(endpoint, "start")
            status, obj = self._simple(endpoint, body)
            await self._gate(endpoint, "answer")
            await resp.json(status, obj)

    def _simple(self, endpoint: str, body: Any) -> tuple[int, Any]:
        if endpoint == "health":
            return 200, {"status": "ok"}
        if endpoint == "props":
            return 200, self.props()
        if endpoint == "slots":
            return 200, [self._slot_json(s) for s in self.slots]
        if endpoint == "tokenize":
            content = body.get("content")
            if not isinstance(content, str):
                return 400, error_body(400, '"content" must be a string')
            pieces = tokenize_pieces(content, bool(body.get("parse_special", True)))
            if body.get("with_pieces"):
                toks: list[Any] = [{"id": t, "piece": p} for t, p in pieces]
            else:
                toks = [t for t, _ in pieces]
            if body.get("add_special"):
                toks.insert(0, {"id": 1, "piece": "<s>"} if body.get("with_pieces") else 1)
            return 200, {"tokens": toks}
        try:
            return 200, {"prompt": render_chat(body)}
        except ValueError as exc:
            return 400, error_body(400, str(exc))

    def props(self) -> dict[str, Any]:
        """``GET /props`` in b11434's shape (the keys the proxy and CLI read, and more)."""
        return {
            "default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": self.n_ctx},
            "total_slots": self.n_slots,
            "model_alias": self.model_alias,
            "model_ftype": "all F32",
            "model_path": self.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": False,
            "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": {"supports_tools": True, "supports_system_role": True},
            "bos_token": "<s>",
            "eos_token": "</s>",
            "build_info": self.build_info,
            "is_sleeping": False,
        }

    def _slot_json(self, slot: FakeSlot) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": slot.id,
            "n_ctx": slot.n_ctx,
            "speculative": False,
            "is_processing": slot.busy,
        }
        if slot.has_task:
            out.update(
                id_task=0,
                n_prompt_tokens=len(slot.tokens),
                n_prompt_tokens_processed=0,
                n_prompt_tokens_cache=0,
                params=dict(slot.last_params),
                next_token=[
                    {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
                ],
            )
        return out

    # --- generation and slot actions ------------------------------------------------

    async def _generate(self, resp: Responder, record: Record, kind: str, body: Any) -> None:
        try:
            tokens = prompt_tokens(kind, body)
        except (ValueError, TypeError) as exc:
            await resp.json(400, error_body(400, str(exc)))
            return
        record.n_prompt = len(tokens)
        record.stream = body.get("stream") is True
        if len(tokens) > self.n_ctx:
            msg = "the request exceeds the available context size, try increasing it"
            await resp.json(400, error_body(400, msg))
            return
        pin = body.get("id_slot")
        pinned = pin if kind != "messages" and isinstance(pin, int) and pin >= 0 else None
        record.id_slot = pinned
        slot = await self._claim(pinned, tokens)
        try:
            record.slot = slot.id
            await self._gate(kind, "start")
            lcp = common_prefix(slot.tokens, tokens) if body.get("cache_prompt", True) else 0
            cache_n = min(lcp, len(tokens) - 1)
            record.cache_n, record.prompt_n = cache_n, len(tokens) - cache_n
            output = generate(tokens, n_predict(kind, body, self.default_n_predict))
            slot.tokens = tokens + [t for t, _ in output][:-1]
            slot.has_task = True
            slot.last_params = {"n_predict": len(output), "stream": record.stream}
            answer = Answer(
                kind=kind,
                model=self.model_path,
                slot=slot.id,
                prompt_text=body.get("prompt") if isinstance(body.get("prompt"), str) else "",
                n_prompt=len(tokens),
                cache_n=cache_n,
                output=output,
                prompt_ms=round(record.prompt_n * self.prompt_ms_per_token, 3),
                build=self.build_info,
            )
            await self._send_answer(resp, kind, answer, record.stream)
        finally:
            self._release(slot)

    async def _send_answer(self, resp: Responder, kind: str, answer: Answer, stream: bool) -> None:
        if not stream:
            await self._gate(kind, "answer")
            await resp.json(200, answer_body(answer))
            return
        await resp.start_stream()
        for i, event in enumerate(stream_events(answer)):
            await resp.event(event)
            if i == 0:
                await self._gate(kind, "answer")
        await self._gate(kind, "end")
        await resp.end_stream()

    async def _slot_action(
        self, resp: Responder, record: Record, path: str, action: str, body: dict[str, Any]
    ) -> None:
        try:
            slot_id = int(path.rsplit("/", 1)[1])
        except ValueError:
            await resp.json(400, error_body(400, "Invalid slot ID"))
            return
        if action not in ("save", "restore", "erase"):
            await resp.json(400, error_body(400, "Invalid action"))
            return
        filename = body.get("filename")
        if action != "erase" and not valid_filename(filename):
            await resp.json(400, error_body(400, "Invalid filename"))
            return
        record.id_slot = slot_id
        record.filename = filename if isinstance(filename, str) else None
        slot = await self._claim(slot_id, None)
        try:
            record.slot = slot.id
            await self._gate(action, "start")
            status, obj = self._do_slot_action(slot, action, str(filename))
            await self._gate(action, "answer")
            await resp.json(status, obj)
        finally:
            self._release(slot)

    def _do_slot_action(self, slot: FakeSlot, action: str, filename: str) -> tuple[int, Any]:
        path = self.slot_dir / filename
        if action == "erase":
            n, slot.tokens = len(slot.tokens), []
            return 200, {"id_slot": slot.id, "n_erased": n}
        if action == "save":
            data = encode_slot_file(slot.tokens, self.bytes_per_token)
            path.write_bytes(data)
            return 200, {
                "id_slot": slot.id,
                "filename": filename,
                "n_saved": len(slot.tokens),
                "n_written": len(data),
                "timings": {"save_ms": 0.1},
            }
        try:
            data = path.read_bytes()
            tokens = decode_slot_file(data, self.bytes_per_token)
            if len(tokens) > slot.n_ctx:
                raise ValueError("does not fit")
        except (OSError, ValueError):
            slot.tokens = []
            return 400, error_body(400, RESTORE_ERROR)
        slot.tokens = tokens
        return 200, {
            "id_slot": slot.id,
            "filename": filename,
            "n_restored": len(tokens),
            "n_read": len(data),
            "timings": {"restore_ms": 0.1},
        }

    def tokens_of(self, text: str, add_special: bool = True) -> list[int]:
        """The fake's tokenization, as ``/tokenize`` gives it (for tests' expectations)."""
        return tokenize(text, add_special)


@contextlib.contextmanager
def fake_llama_server(slot_dir: Path, **kwargs: Any) -> Iterator[FakeLlamaServer]:
    """A fake llama-server on its own loop in a thread (for sync tests)."""
    fake = FakeLlamaServer(slot_dir, **kwargs)
    loop = asyncio.new_event_loop()
    started: asyncio.Future[None] | Any = None

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    thread = threading.Thread(target=run, name="fake-llama-server", daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(fake.start(), loop)
        started.result(30)
        yield fake
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@contextlib.asynccontextmanager
async def running_fake_llama(slot_dir: Path, **kwargs: Any) -> AsyncIterator[FakeLlamaServer]:
    """A fake llama-server in the running loop (for async tests)."""
    fake = FakeLlamaServer(slot_dir, **kwargs)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()
