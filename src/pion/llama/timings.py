"""Reading llama-server's ``timings`` out of a response, JSON or SSE, without touching it.

llama-server resets a slot's counters after every request (docs/llama.md), so polling
``/slots`` afterwards reads zeros; the only reliable record of how much of a request came
from cache is the ``timings`` object in the response itself: ``cache_n`` (tokens reused),
``prompt_n`` (tokens processed), ``prompt_ms``. In a non-streamed answer it is a top-level
key; in a stream it rides on the final ``data:`` event. Anthropic Messages answers carry
no ``timings``: their ``usage`` (``cache_read_input_tokens``, ``input_tokens``) says the
same, as does a Responses answer's ``usage.input_tokens_details.cached_tokens``.

:class:`TimingsScanner` is sans-IO: it is fed the response bytes as they pass through the
proxy and never changes or delays them. Memory is bounded: a streamed line or a JSON body
larger than :data:`MAX_BUFFER` is not scanned (the observation is then simply missing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_BUFFER", "Timings", "TimingsScanner"]

# A non-streamed chat answer is small; a bigger body is not worth buffering for a log line.
MAX_BUFFER = 16 * 1024 * 1024


@dataclass(frozen=True)
class Timings:
    """The prompt side of llama-server's ``timings``."""

    cache_n: int
    prompt_n: int
    prompt_ms: float | None = None

    @property
    def total(self) -> int:
        return self.cache_n + self.prompt_n

    @property
    def reuse(self) -> float:
        """``cache_n / (cache_n + prompt_n)``, 0.0 for an empty prompt."""
        return self.cache_n / self.total if self.total else 0.0

    @classmethod
    def from_json(cls, obj: Any) -> Timings | None:
        """The ``timings`` of a parsed response object, if it has usable ones."""
        if not isinstance(obj, Mapping):
            return None
        t = obj.get("timings")
        if not isinstance(t, Mapping):
            return cls._from_usage(obj)
        cache_n, prompt_n = t.get("cache_n"), t.get("prompt_n")
        if not isinstance(cache_n, int) or not isinstance(prompt_n, int):
            return None
        ms = t.get("prompt_ms")
        return cls(cache_n, prompt_n, float(ms) if isinstance(ms, int | float) else None)

    @classmethod
    def _from_usage(cls, obj: Mapping[str, Any]) -> Timings | None:
        """The reuse from a ``usage`` object, where llama-server reports it without
        ``timings``: Anthropic Messages (``cache_read_input_tokens`` + ``input_tokens``, the
        latter without the cached part; at the top level or in ``message_start``'s
        ``message``) and OpenAI Responses (``input_tokens`` with
        ``input_tokens_details.cached_tokens``; in ``response.completed``'s ``response``)."""
        for holder in (obj, obj.get("message"), obj.get("response")):
            usage = holder.get("usage") if isinstance(holder, Mapping) else None
            if not isinstance(usage, Mapping):
                continue
            inputs = usage.get("input_tokens")
            if not isinstance(inputs, int):
                continue
            read = usage.get("cache_read_input_tokens")
            if isinstance(read, int):
                return cls(read, inputs)
            details = usage.get("input_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
            if isinstance(cached, int) and cached <= inputs:
                return cls(cached, inputs - cached)
        return None


class TimingsScanner:
    """Feed response bytes; read :attr:`timings` (the last one seen) at the end."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.timings: Timings | None = None
        self._buf = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._overflow:
            if not self.streaming or b"\n" not in chunk:
                return
            # Drop the rest of the oversized line, resynchronise on the next line.
            self._overflow = False
            chunk = chunk[chunk.index(b"\n") + 1 :]
        self._buf += chunk
        if self.streaming:
            self._scan_lines()
        if len(self._buf) > MAX_BUFFER:
            self._overflow = True
            self._buf = bytearray()

    def close(self) -> Timings | None:
        """End of the body: parse what is left and return the timings found."""
        if not self._overflow:
            if self.streaming:
                self._buf += b"\n"
                self._scan_lines()
            else:
                self._parse(bytes(self._buf))
        self._buf = bytearray()
        return self.timings

    def _scan_lines(self) -> None:
        end = self._buf.rfind(b"\n")
        if end < 0:
            return
        lines = bytes(self._buf[:end]).split(b"\n")
        del self._buf[: end + 1]
        for raw in lines:
            line = raw.rstrip(b"\r")
            # Only the final event carries timings: skip the JSON parse of every token.
            if line.startswith(b"data:") and (b'"timings"' in line or b'"usage"' in line):
                self._parse(line[5:])

    def _parse(self, payload: bytes) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        found = Timings.from_json(obj)
        if found is not None:
            self.timings = found
