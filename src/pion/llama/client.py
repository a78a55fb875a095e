"""httpx clients for llama.cpp's llama-server (build b11434): synchronous (CLI, tools) and
asynchronous (the warmer and proxy, :class:`AsyncLlamaClient`).

Owns one method per endpoint the warmer and CLI use, checked against the server source
(``tools/server/server.cpp``, ``server-context.cpp``):

- ``GET /health``, ``GET /props`` (``model_path``, ``build_info``, ``total_slots``...),
- ``GET /slots`` (per slot: ``id``, ``n_ctx``, ``is_processing`` and, once a task ran,
  ``n_prompt_tokens``; a restarted server shows no ``n_prompt_tokens`` at all),
- ``POST /slots/{id}?action=save|restore`` with ``{"filename": ...}`` (needs
  ``--slot-save-path``; answers ``n_saved``/``n_written`` or ``n_restored``/``n_read``; a
  failed restore empties the slot) and ``?action=erase``,
- ``POST /tokenize``, ``POST /apply-template``, ``POST /v1/chat/completions``,
  ``POST /completion`` (raw prompt).

Errors: every non-2xx answer and every transport failure raises :class:`LlamaServerError`
with the HTTP status (None when no answer came) and the server's message. Nothing here
retries or swallows errors; fail-open is the warmer's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from pion.llama.config import normalize_base_url
from pion.llama.timings import Timings

__all__ = [
    "DEFAULT_UPSTREAM_READ_TIMEOUT",
    "AsyncLlamaClient",
    "CompletionResult",
    "LlamaClient",
    "LlamaServerError",
]

# How long an idle connection to llama-server is kept (its server closes one at 5 s).
KEEPALIVE_S = 2.0


class LlamaServerError(Exception):
    """llama-server answered with an error, or could not be reached (``status`` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def short(self) -> str:
        """``HTTP 400: message`` or the transport error, for log lines."""
        return f"HTTP {self.status}: {self.message}" if self.status is not None else self.message


class CompletionResult:
    """A non-streamed completion answer: the JSON body and its ``timings``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.timings = Timings.from_json(body)


def _error_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(data, Mapping):
        err = data.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return resp.text[:500]


class LlamaClient:
    """One llama-server, addressed by its root URL (a trailing ``/v1`` is stripped)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # Connecting must fail fast (a dead server is common and must not stall a request);
        # reading may take as long as a cold prefill of a 20k-token prefix.
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=min(5.0, timeout)),
            headers=headers,
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),  # see AsyncLlamaClient
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        try:
            kwargs: dict[str, Any] = {"json": json, "params": params}
            if timeout is not None:
                kwargs["timeout"] = timeout
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise LlamaServerError(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise LlamaServerError(_error_message(resp), resp.status_code)
        try:
            return resp.status_code, resp.json()
        except ValueError as exc:
            raise LlamaServerError(f"not JSON: {resp.text[:200]!r}", resp.status_code) from exc

    def _json_object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        _, data = self._request(method, path, **kwargs)
        if not isinstance(data, dict):
            raise LlamaServerError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return data

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        """``GET /health``: ``{"status": "ok"}`` once the model is loaded (503 while loading)."""
        return self._json_object("GET", "/health", timeout=timeout)

    def props(self) -> dict[str, Any]:
        """``GET /props``: model path, build info, slot count, chat template."""
        return self._json_object("GET", "/props")

    def slots(self) -> list[dict[str, Any]]:
        """``GET /slots``: one object per slot."""
        _, data = self._request("GET", "/slots")
        if not isinstance(data, list):
            raise LlamaServerError("/slots: expected a JSON array")
        return [s for s in data if isinstance(s, dict)]

    def slot(self, slot_id: int) -> dict[str, Any] | None:
        """The ``/slots`` entry of one slot, or None when the server has no such slot."""
        return next((s for s in self.slots() if s.get("id") == slot_id), None)

    def _slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, Any]:
        body = {"filename": filename} if filename is not None else {}
        return self._json_object("POST", f"/slots/{slot_id}", params={"action": action}, json=body)

    def slot_save(self, slot_id: int, filename: str) -> dict[str, Any]:
        """Save the slot's K/V and tokens to ``<slot-save-path>/filename``."""
        return self._slot_action(slot_id, "save", filename)

    def slot_restore(self, slot_id: int, filename: str) -> dict[str, Any]:
        """Load a saved slot file; on failure the server leaves the slot empty."""
        return self._slot_action(slot_id, "restore", filename)

    def slot_erase(self, slot_id: int) -> dict[str, Any]:
        """Drop the slot's cached prompt."""
        return self._slot_action(slot_id, "erase", None)

    def tokenize(self, content: str, add_special: bool = False) -> list[int]:
        """``POST /tokenize`` with special-token parsing on (as prompts are tokenized)."""
        data = self._json_object(
            "POST",
            "/tokenize",
            json={"content": content, "add_special": add_special, "parse_special": True},
        )
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise LlamaServerError("/tokenize: no tokens")
        return [t if isinstance(t, int) else int(t["id"]) for t in tokens]

    def apply_template(self, body: Mapping[str, Any]) -> str:
        """``POST /apply-template``: the prompt text a chat body renders to."""
        data = self._json_object("POST", "/apply-template", json=dict(body))
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise LlamaServerError("/apply-template: no prompt")
        return prompt

    def chat(self, body: Mapping[str, Any]) -> CompletionResult:
        """``POST /v1/chat/completions`` (non-streamed)."""
        status, data = self._request("POST", "/v1/chat/completions", json=dict(body))
        return CompletionResult(status, data if isinstance(data, dict) else {})

    def complete(self, body: Mapping[str, Any]) -> CompletionResult:
        """``POST /completion`` with a raw ``prompt`` (non-streamed)."""
        status, data = self._request("POST", "/completion", json=dict(body))
        return CompletionResult(status, data if isinstance(data, dict) else {})


# A read that takes longer than this on the proxy's forwarded requests is a wedged
# llama-server (a generation that stops producing tokens for this long is not working).
DEFAULT_UPSTREAM_READ_TIMEOUT = 600.0


class AsyncLlamaClient:
    """The asynchronous twin of :class:`LlamaClient`, for the warmer on the proxy's event
    loop. It owns the one ``httpx.AsyncClient`` of its upstream, which the proxy also
    forwards requests through (:attr:`http`): no default headers (the proxy forwards only
    what its client sent), the API key added per warmer request."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.timeout = timeout
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(5.0, timeout)),
            transport=transport,
            # Many concurrent sessions: the pool must never be what a request waits on.
            # llama-server (cpp-httplib) closes a connection idle for 5 s, httpx keeps one
            # 5 s by default: a request sent on it in that instant is lost ("Server
            # disconnected without sending a response"). Idle connections go after 2 s.
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S
            ),
        )
        self.http.headers.clear()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        try:
            kwargs: dict[str, Any] = {"json": json, "params": params, "headers": self._auth}
            if timeout is not None:
                kwargs["timeout"] = timeout
            resp = await self.http.request(method, self.base_url + path, **kwargs)
        except httpx.HTTPError as exc:
            raise LlamaServerError(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise LlamaServerError(_error_message(resp), resp.status_code)
        try:
            return resp.status_code, resp.json()
        except ValueError as exc:
            raise LlamaServerError(f"not JSON: {resp.text[:200]!r}", resp.status_code) from exc

    async def _json_object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        _, data = await self._request(method, path, **kwargs)
        if not isinstance(data, dict):
            raise LlamaServerError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return data

    async def props(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._json_object("GET", "/props", timeout=timeout)

    async def health(self, timeout: float | None = None) -> dict[str, Any]:
        """``GET /health``: raises LlamaServerError unless the server is up and loaded."""
        return await self._json_object("GET", "/health", timeout=timeout)

    async def slots(self) -> list[dict[str, Any]]:
        _, data = await self._request("GET", "/slots")
        if not isinstance(data, list):
            raise LlamaServerError("/slots: expected a JSON array")
        return [s for s in data if isinstance(s, dict)]

    async def slot(self, slot_id: int) -> dict[str, Any] | None:
        return next((s for s in await self.slots() if s.get("id") == slot_id), None)

    async def _slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, Any]:
        body = {"filename": filename} if filename is not None else {}
        return await self._json_object(
            "POST", f"/slots/{slot_id}", params={"action": action}, json=body
        )

    async def slot_save(self, slot_id: int, filename: str) -> dict[str, Any]:
        return await self._slot_action(slot_id, "save", filename)

    async def slot_restore(self, slot_id: int, filename: str) -> dict[str, Any]:
        return await self._slot_action(slot_id, "restore", filename)

    async def slot_erase(self, slot_id: int) -> dict[str, Any]:
        return await self._slot_action(slot_id, "erase", None)

    async def tokenize(self, content: str, add_special: bool = False) -> list[int]:
        data = await self._json_object(
            "POST",
            "/tokenize",
            json={"content": content, "add_special": add_special, "parse_special": True},
        )
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise LlamaServerError("/tokenize: no tokens")
        return [t if isinstance(t, int) else int(t["id"]) for t in tokens]

    async def tokenize_pieces(
        self, content: str, add_special: bool = False
    ) -> list[tuple[int, bytes]]:
        """``POST /tokenize`` with ``with_pieces``: each token with the bytes it stands for
        (llama-server sends a piece that is not whole UTF-8 as a list of byte values)."""
        data = await self._json_object(
            "POST",
            "/tokenize",
            json={
                "content": content,
                "add_special": add_special,
                "parse_special": True,
                "with_pieces": True,
            },
        )
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise LlamaServerError("/tokenize: no tokens")
        out: list[tuple[int, bytes]] = []
        for t in tokens:
            if not isinstance(t, dict) or not isinstance(t.get("id"), int):
                raise LlamaServerError("/tokenize: a token without its piece")
            piece = t.get("piece")
            if isinstance(piece, str):
                out.append((t["id"], piece.encode("utf-8", "surrogatepass")))
            elif isinstance(piece, list) and all(
                isinstance(b, int) and 0 <= b < 256 for b in piece
            ):
                out.append((t["id"], bytes(piece)))
            else:
                raise LlamaServerError("/tokenize: a piece is neither text nor bytes")
        return out

    async def apply_template(self, body: Mapping[str, Any]) -> str:
        data = await self._json_object("POST", "/apply-template", json=dict(body))
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise LlamaServerError("/apply-template: no prompt")
        return prompt

    async def chat(self, body: Mapping[str, Any]) -> CompletionResult:
        status, data = await self._request("POST", "/v1/chat/completions", json=dict(body))
        return CompletionResult(status, data if isinstance(data, dict) else {})

    async def complete(self, body: Mapping[str, Any]) -> CompletionResult:
        status, data = await self._request("POST", "/completion", json=dict(body))
        return CompletionResult(status, data if isinstance(data, dict) else {})
