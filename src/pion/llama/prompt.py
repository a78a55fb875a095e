"""The warmable prefix of a request to any generation endpoint.

Owns :func:`warm_request_for`, which turns a parsed request body of one of llama-server's
generation endpoints (:data:`pion.llama.endpoints.ENDPOINTS`) into a
:class:`~pion.llama.prefix.WarmRequest`, or says why there is none:

- a chat request whose first system/developer message holds a harness marker (Pi) keeps
  the text-mode prefix of :func:`~pion.llama.prefix.warm_request_from_chat`, exactly as
  before (same fingerprint, same files, ``pion llama warm`` compatible);
- every other request is rendered the way llama-server renders it, by llama-server
  itself: ``/v1/messages`` and ``/v1/responses`` are converted to a chat body
  (:func:`~pion.llama.endpoints.to_chat`), ``/apply-template`` renders it, ``/tokenize``
  gives the tokens; a raw completion's prompt is tokenized as llama-server tokenizes it
  (specials added and parsed), or taken as sent when it is a token list. The boundary is
  then learned from what the harness's requests share (:mod:`pion.llama.learn`), seeded
  by the saved slot files of the same harness, and the prefix is warmed in token mode.

Errors of llama-server (down, refuses the body) propagate as
:class:`~pion.llama.client.LlamaServerError`; the caller is fail-open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pion.llama.client import AsyncLlamaClient, LlamaServerError
from pion.llama.endpoints import EndpointKind, completion_prompt, to_chat
from pion.llama.learn import BoundaryLearner
from pion.llama.prefix import PrefixSkip, WarmRequest, warm_request_from_chat

__all__ = ["MAX_WARM_BODY", "warm_request_for"]

# A request body larger than this is forwarded without warming: rendering and tokenizing
# it would delay the request more than any prefix saves (a 10 MB tools list overflows
# every context anyway; llama-server answers it as it would directly).
MAX_WARM_BODY = 4 * 1024 * 1024

# llama-server's answer to a request it cannot render (std::invalid_argument).
_INVALID_REQUEST = 400

# Skip reasons of the chat path after which token mode still applies.
_NO_MARKER = (
    "no boundary marker in the system prompt",
    "first message is not system/developer",
    "system content is not one text",
)


def _label_text(chat: Mapping[str, Any]) -> str:
    """Text naming the prefix in status output: the first message's text."""
    messages = chat.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    content = first.get("content") if isinstance(first, Mapping) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


async def warm_request_for(
    kind: EndpointKind,
    body: Mapping[str, Any],
    client: AsyncLlamaClient,
    learner: BoundaryLearner,
    *,
    markers: Sequence[str],
    harness: str,
    seeds: Callable[[], Iterable[Sequence[int]]] | None = None,
    log: Callable[[str], None] | None = None,
    watch: Callable[[str, Sequence[int], str | None, int], None] | None = None,
) -> WarmRequest | PrefixSkip:
    """The prefix to warm for ``body`` sent to an endpoint of ``kind``."""
    model = body.get("model")
    model_id = model if isinstance(model, str) else None
    if kind == "completion":
        prompt = completion_prompt(body)
        if prompt is None:
            return PrefixSkip("prompt is not one string or token list")
        tokens = prompt if isinstance(prompt, list) else await client.tokenize(prompt, True)
        label = prompt if isinstance(prompt, str) else ""
        rendered = prompt if isinstance(prompt, str) else None
    else:
        if kind == "chat":
            found = warm_request_from_chat(body, markers, harness=harness)
            if isinstance(found, WarmRequest):
                return found
            if found.reason not in _NO_MARKER:
                return found
        try:
            chat = to_chat(kind, body)
        except ValueError as exc:
            return PrefixSkip(f"llama-server would refuse it: {exc}")
        messages = chat.get("messages")
        if not isinstance(messages, list) or not messages:
            return PrefixSkip("no messages")
        try:
            rendered = await client.apply_template(chat)
            tokens = await client.tokenize(rendered, True)
        except LlamaServerError as exc:
            if exc.status != _INVALID_REQUEST:
                raise
            # The real request gets the same answer from llama-server.
            return PrefixSkip(f"llama-server does not render it: {exc.short()}")
        label = _label_text(chat)
    key = f"{harness}|{kind}|{model_id or ''}"
    # Off the loop: seeds read the slot dir.
    learned = await asyncio.to_thread(learner.boundary, key, tokens, seeds)
    if log is not None:
        log(
            f"boundary {learned.how}: {learned.tokens} of {len(tokens)} tokens "
            f"({kind} request of {harness or 'an unnamed harness'})"
        )
    if watch is not None:
        watch(key, tokens, rendered, learned.tokens)
    if learned.tokens < learner.min_tokens:
        return PrefixSkip(f"stable prefix of {learned.tokens} tokens is too short to warm")
    return WarmRequest(
        prefix=label,
        model=model_id,
        harness=harness,
        tokens=tuple(tokens[: learned.tokens]),
        conversation=tuple(tokens),
    )
