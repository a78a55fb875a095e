"""The model side of the fake llama-server (:mod:`support.fake_llama`): what it computes,
without any I/O.

Owns the toy tokenizer (one token per word with its leading whitespace, the chat
template's ``<|role|>`` markers and ``<s>``/``</s>`` as special tokens; ids are stable
across processes), the chat rendering of the tiny test model's template
(:data:`pion_testing.testmodel.CHAT_TEMPLATE`: tools first, every message, then the
generation prompt), the deterministic "generation", the slot file format, and the
response bodies in llama-server b11434's shapes (``timings`` on the final answer or
event, ``usage`` as each API reports it). Shapes were copied from the real server's
answers; ``tests/llama/test_fake_llama.py`` compares the key sets against it.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pion.llama.endpoints import to_chat

BOS, EOS = 1, 2
SPECIALS = {"<s>": BOS, "</s>": EOS}
_SPECIAL_RE = re.compile(r"<\|[a-z_]+\|>|</?s>")
# A word with its leading whitespace, a run of trailing whitespace, or a lone "<".
_PIECE_RE = re.compile(r"\s*[^\s<]+|\s+|<")
_FIRST_SPECIAL_ID = 3
_FIRST_WORD_ID = 1000

SLOT_MAGIC = b"FAKESLOT"
RESTORE_ERROR = "Unable to restore slot: No available space in KV cache or invalid slot save file"


def special_id(piece: str) -> int:
    """The id of a special token (``<|user|>``...): stable, below the word ids."""
    if piece in SPECIALS:
        return SPECIALS[piece]
    return _FIRST_SPECIAL_ID + zlib.crc32(piece.encode()) % (_FIRST_WORD_ID - _FIRST_SPECIAL_ID)


def word_id(piece: str) -> int:
    return _FIRST_WORD_ID + zlib.crc32(piece.encode("utf-8", "surrogatepass")) % (2**31 - 2000)


def tokenize_pieces(text: str, parse_special: bool = True) -> list[tuple[int, str]]:
    """``(id, piece)`` for each token of ``text``; concatenating the pieces gives it back."""
    out: list[tuple[int, str]] = []
    pos = 0
    specials = list(_SPECIAL_RE.finditer(text)) if parse_special else []
    for m in [*specials, None]:
        end = m.start() if m is not None else len(text)
        out.extend((word_id(p), p) for p in _PIECE_RE.findall(text[pos:end]))
        if m is not None:
            out.append((special_id(m.group()), m.group()))
            pos = m.end()
    return out


def tokenize(text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
    ids = [tid for tid, _ in tokenize_pieces(text, parse_special)]
    return [BOS, *ids] if add_special else ids


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def render_chat(body: Mapping[str, Any]) -> str:
    """``/apply-template`` of a chat body: the tiny model's template, in Python."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ValueError("'messages' is required")
    parts: list[str] = []
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        parts.append("<|tools|>")
        parts.extend("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        parts.append("\n<|end|>\n")
    for msg in messages:
        if not isinstance(msg, dict):
            raise ValueError("every message must be an object")
        text = _content_text(msg.get("content"))
        calls = msg.get("tool_calls")
        if isinstance(calls, list) and calls:
            text += "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) for c in calls)
        parts.append(f"<|{msg.get('role', 'user')}|>\n{text}\n<|end|>\n")
    if body.get("add_generation_prompt", True):
        parts.append("<|assistant|>\n")
        kwargs = body.get("chat_template_kwargs")
        if isinstance(kwargs, dict) and kwargs.get("enable_thinking"):
            parts.append("<think>\n")
    return "".join(parts)


def prompt_tokens(kind: str, body: Mapping[str, Any]) -> list[int]:
    """The tokens llama-server evaluates for a generation request of ``kind``; raises
    ValueError (a 400) for a body it would refuse."""
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return tokenize(prompt, add_special=True)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise ValueError('"prompt" must be a string or a list of tokens')
    return tokenize(render_chat(to_chat(kind, body)), add_special=True)  # type: ignore[arg-type]


def n_predict(kind: str, body: Mapping[str, Any], default: int) -> int:
    keys = {
        "completion": ("n_predict", "max_tokens"),
        "chat": ("max_tokens", "max_completion_tokens", "n_predict"),
        "messages": ("max_tokens",),
        "responses": ("max_output_tokens",),
    }[kind]
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


def generate(prompt: Sequence[int], n: int) -> list[tuple[int, str]]:
    """``n`` deterministic output tokens for ``prompt``."""
    seed = zlib.crc32(struct.pack(f"<{min(len(prompt), 64)}i", *prompt[-64:])) if prompt else 0
    pieces = [f" w{(seed + i * 7919) % 1000}" for i in range(n)]
    return [(word_id(p), p) for p in pieces]


# --- slot files ------------------------------------------------------------------


def encode_slot_file(tokens: Sequence[int], bytes_per_token: int) -> bytes:
    """A slot file: magic, token count, the tokens, then ``bytes_per_token - 4`` bytes of
    stand-in K/V per token (so files have a size that grows with the prompt)."""
    pad = max(0, bytes_per_token - 4) * len(tokens)
    return SLOT_MAGIC + struct.pack(f"<I{len(tokens)}i", len(tokens), *tokens) + bytes(pad)


def decode_slot_file(data: bytes, bytes_per_token: int) -> list[int]:
    """The tokens of a slot file; ValueError when it is not one this fake wrote."""
    head = len(SLOT_MAGIC) + 4
    if len(data) < head or not data.startswith(SLOT_MAGIC):
        raise ValueError("not a slot file")
    (count,) = struct.unpack_from("<I", data, len(SLOT_MAGIC))
    if len(data) != head + 4 * count + max(0, bytes_per_token - 4) * count:
        raise ValueError("truncated or padded slot file")
    return list(struct.unpack_from(f"<{count}i", data, head))


def valid_filename(name: Any) -> bool:
    """llama-server's ``fs_validate_filename`` in short: a plain file name."""
    if not isinstance(name, str) or not name or len(name) > 255:
        return False
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith(".."):
        return False
    return all(ord(c) >= 32 for c in name)


# --- answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What one generation request computed, for the body builders."""

    kind: str
    model: str
    slot: int
    prompt_text: str
    n_prompt: int
    cache_n: int
    output: list[tuple[int, str]]
    prompt_ms: float
    build: str

    @property
    def prompt_n(self) -> int:
        return self.n_prompt - self.cache_n

    @property
    def text(self) -> str:
        return "".join(p for _, p in self.output)

    def timings(self) -> dict[str, Any]:
        n_out = len(self.output)
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0,
            "predicted_n": n_out,
            "predicted_ms": 0.5 * n_out,
            "predicted_per_token_ms": 0.5 if n_out else 0.0,
            "predicted_per_second": 2000.0 if n_out else 0.0,
        }


def _completion_final(a: Answer, stream: bool) -> dict[str, Any]:
    return {
        "index": 0,
        "content": "" if stream else a.text,
        "tokens": [],
        "id_slot": a.slot,
        "stop": True,
        "model": a.model,
        "tokens_predicted": len(a.output),
        "tokens_evaluated": a.n_prompt,
        "generation_settings": {"n_predict": len(a.output), "stream": stream},
        "prompt": a.prompt_text,
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": a.n_prompt + max(0, len(a.output) - 1),
        "timings": a.timings(),
    }


def _chat_usage(a: Answer) -> dict[str, Any]:
    n_out = len(a.output)
    return {
        "completion_tokens": n_out,
        "prompt_tokens": a.n_prompt,
        "total_tokens": a.n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": a.cache_n},
    }


def _responses_usage(a: Answer) -> dict[str, Any]:
    n_out = len(a.output)
    return {
        "input_tokens": a.n_prompt,
        "output_tokens": n_out,
        "total_tokens": a.n_prompt + n_out,
        "input_tokens_details": {"cached_tokens": a.cache_n},
    }


def answer_body(a: Answer) -> dict[str, Any]:
    """The non-streamed JSON answer."""
    if a.kind == "completion":
        return _completion_final(a, stream=False)
    if a.kind == "chat":
        return {
            "choices": [
                {
                    "finish_reason": "length",
                    "index": 0,
                    "message": {"role": "assistant", "content": a.text},
                }
            ],
            "created": 0,
            "model": a.model,
            "system_fingerprint": a.build,
            "object": "chat.completion",
            "usage": _chat_usage(a),
            "id": "chatcmpl-fake",
            "timings": a.timings(),
        }
    if a.kind == "messages":
        return {
            "id": "chatcmpl-fake",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": a.text}],
            "model": a.model,
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": {
                "cache_read_input_tokens": a.cache_n,
                "input_tokens": a.prompt_n,
                "output_tokens": len(a.output),
            },
        }
    return {
        "completed_at": 0,
        "created_at": 0,
        "id": "resp_fake",
        "model": a.model,
        "object": "response",
        "output": [_responses_message(a)],
        "status": "completed",
        "usage": _responses_usage(a),
    }


def _responses_message(a: Answer) -> dict[str, Any]:
    return {
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": a.text}],
        "id": "msg_fake",
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"{head}data: {data}\n\n".encode()


def stream_events(a: Answer) -> Iterator[bytes]:
    """The SSE events of a streamed answer, one ``bytes`` per event."""
    if a.kind == "completion":
        for i, (tid, piece) in enumerate(a.output):
            yield _sse(
                {
                    "index": 0,
                    "content": piece,
                    "tokens": [tid],
                    "stop": False,
                    "id_slot": -1,
                    "tokens_predicted": i + 1,
                    "tokens_evaluated": a.n_prompt,
                }
            )
        yield _sse(_completion_final(a, stream=True))
    elif a.kind == "chat":
        yield from _chat_stream(a)
    elif a.kind == "messages":
        yield from _messages_stream(a)
    else:
        yield from _responses_stream(a)


def _chat_stream(a: Answer) -> Iterator[bytes]:
    base = {
        "created": 0,
        "id": "chatcmpl-fake",
        "model": a.model,
        "system_fingerprint": a.build,
        "object": "chat.completion.chunk",
    }
    first = {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
    yield _sse({"choices": [first], **base})
    for _, piece in a.output:
        delta = {"finish_reason": None, "index": 0, "delta": {"content": piece}}
        yield _sse({"choices": [delta], **base})
    last = {"finish_reason": "length", "index": 0, "delta": {}}
    yield _sse({"choices": [last], **base, "timings": a.timings()})
    yield _sse("[DONE]")


def _messages_stream(a: Answer) -> Iterator[bytes]:
    usage = {"cache_read_input_tokens": a.cache_n, "input_tokens": a.prompt_n, "output_tokens": 0}
    start = {
        "id": "chatcmpl-fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": a.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    yield _sse({"type": "message_start", "message": start}, "message_start")
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    yield _sse(block, "content_block_start")
    for _, piece in a.output:
        delta = {"type": "text_delta", "text": piece}
        yield _sse(
            {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
        )
    yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": len(a.output)},
    }
    yield _sse(end, "message_delta")
    yield _sse({"type": "message_stop"}, "message_stop")


def _responses_stream(a: Answer) -> Iterator[bytes]:
    head = {"id": "resp_fake", "object": "response", "status": "in_progress"}
    yield _sse({"type": "response.created", "response": head}, "response.created")
    for _, piece in a.output:
        ev = {"type": "response.output_text.delta", "item_id": "msg_fake", "delta": piece}
        yield _sse(ev, "response.output_text.delta")
    done = {
        "id": "resp_fake",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": a.model,
        "output": [_responses_message(a)],
        "usage": _responses_usage(a),
    }
    final = {"type": "response.completed", "response": done, "timings": a.timings()}
    yield _sse(final, "response.completed")


def error_body(status: int, message: str) -> dict[str, Any]:
    """llama-server's error shape."""
    kind = {
        400: "invalid_request_error",
        404: "not_found_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }.get(status, "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}
