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
  A rendering that starts with a learned prefix tokenized before is not tokenized again
  (:mod:`pion.llama.tokencache`): its whole tokens are asked for when needed.

Errors of llama-server (down, refuses the body) propagate as
:class:`~pion.llama.client.LlamaServerError`; the caller is fail-open.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pion.llama.client import AsyncLlamaClient, LlamaServerError
from pion.llama.endpoints import EndpointKind, completion_prompt, to_chat
from pion.llama.learn import BoundaryLearner
from pion.llama.prefix import PrefixSkip, WarmRequest, warm_request_from_chat
from pion.llama.tokencache import LazyConversation, TokenCache, prefix_chars
from pion.llama.watch import DivergenceWatch

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


@dataclass(frozen=True)
class Rendering:
    """A request as llama-server will see it: ``text`` (rendered, or a raw prompt) or
    ``listed`` (a raw prompt sent as tokens), and the text naming it in status output."""

    text: str | None
    listed: list[int] | None
    label: str


def _with_chat(found: WarmRequest, body: Mapping[str, Any]) -> WarmRequest:
    """A Pi-marker prefix (text mode), with the body whose whole tokens a checkpoint of
    its conversation needs: rendered and tokenized only then (after an answer that grew
    the conversation enough, or to pick a checkpoint to restore)."""
    try:
        chat = to_chat("chat", body)
    except ValueError:
        return found
    return dataclasses.replace(found, lazy=LazyConversation(None, chat=chat))


async def _render(
    kind: EndpointKind,
    body: Mapping[str, Any],
    client: AsyncLlamaClient,
    markers: Sequence[str],
    harness: str,
) -> Rendering | WarmRequest | PrefixSkip:
    """``body`` rendered as llama-server renders it, or its Pi-marker prefix (text mode),
    or why there is nothing to warm."""
    if kind == "completion":
        prompt = completion_prompt(body)
        if prompt is None:
            return PrefixSkip("prompt is not one string or token list")
        if isinstance(prompt, str):
            return Rendering(prompt, None, prompt)
        return Rendering(None, prompt, "")
    if kind == "chat":
        found = warm_request_from_chat(body, markers, harness=harness)
        if isinstance(found, WarmRequest):
            return _with_chat(found, body)
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
    except LlamaServerError as exc:
        if exc.status != _INVALID_REQUEST:
            raise
        # The real request gets the same answer from llama-server.
        return PrefixSkip(f"llama-server does not render it: {exc.short()}")
    return Rendering(rendered, None, _label_text(chat))


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
    watch: DivergenceWatch | None = None,
    cache: TokenCache | None = None,
    identity: Callable[[], Awaitable[str]] | None = None,
) -> WarmRequest | PrefixSkip:
    """The prefix to warm for ``body`` sent to an endpoint of ``kind``. With ``cache``
    (tokens of prefixes rendered before, on the server ``identity`` names: asked for once
    there is a rendering to look up), a rendering that starts with a cached prefix of its
    harness key is not tokenized."""
    got = await _render(kind, body, client, markers, harness)
    if not isinstance(got, Rendering):
        return got
    model = body.get("model")
    model_id = model if isinstance(model, str) else None
    key = f"{harness}|{kind}|{model_id or ''}"
    rendered, server = got.text, ""
    if rendered is None or identity is None:
        cache = None
    elif cache is not None:
        server = await identity()
    scope = Scope(key, got.label, model_id, harness, cache, server)
    who = f"{kind} request of {harness or 'an unnamed harness'}"
    if rendered is not None:
        cached = scope.cached(rendered, learner, watch)
        if cached is not None:
            if log is not None:
                log(
                    f"boundary cached: {len(cached.tokens or ())} tokens, the rendering "
                    f"starts with a prefix tokenized before ({who})"
                )
            return cached
    pieces: list[bytes] | None = None
    if got.listed is not None:
        tokens = got.listed
    elif rendered is not None and cache is not None:
        pairs = await client.tokenize_pieces(rendered, True)
        tokens, pieces = [t for t, _ in pairs], [p for _, p in pairs]
    else:
        tokens = await client.tokenize(rendered or "", True)
    # Off the loop: seeds read the slot dir.
    learned = await asyncio.to_thread(learner.boundary, key, tokens, seeds)
    if log is not None:
        log(f"boundary {learned.how}: {learned.tokens} of {len(tokens)} tokens ({who})")
    if watch is not None:
        watch(key, tokens, rendered, learned.tokens)
    if learned.tokens < learner.min_tokens:
        return PrefixSkip(f"stable prefix of {learned.tokens} tokens is too short to warm")
    # A whole rendering as the prefix (nothing learned yet) is not cached: the next turn
    # continues right where it ends, and a tokenizer may merge its last piece with what
    # follows. A learned boundary is where two renderings' tokens parted: both tokenized
    # to the prefix's tokens up to it.
    if rendered is not None and pieces is not None and learned.tokens < len(tokens):
        scope.remember(rendered, pieces, tokens[: learned.tokens])
    return scope.request(tuple(tokens[: learned.tokens]), conversation=tuple(tokens))


@dataclass(frozen=True)
class Scope:
    """A request's harness key and naming, and the token cache of its server."""

    key: str
    label: str
    model_id: str | None
    harness: str
    cache: TokenCache | None
    identity: str

    def request(
        self,
        prefix: tuple[int, ...],
        *,
        conversation: tuple[int, ...] | None = None,
        lazy: LazyConversation | None = None,
    ) -> WarmRequest:
        return WarmRequest(
            prefix=self.label,
            model=self.model_id,
            harness=self.harness,
            tokens=prefix,
            conversation=conversation,
            lazy=lazy,
        )

    def cached(
        self, rendered: str, learner: BoundaryLearner, watch: DivergenceWatch | None
    ) -> WarmRequest | None:
        """The request from the token cache: ``rendered`` starts with a cached prefix
        that is still the learner's boundary for it (and the watch's last prefix, so
        that nothing diverged), else None (tokenize it)."""
        if self.cache is None:
            return None
        hit = self.cache.find(self.identity, self.key, rendered)
        if hit is None:
            return None
        if watch is not None and not watch.holds(self.key, hit.tokens):
            return None
        if not learner.reuse(self.key, hit.tokens):
            return None
        text = rendered[: hit.chars]
        cache, identity, key = self.cache, self.identity, self.key
        lazy = LazyConversation(
            rendered, hit.tokens, identity, lambda: cache.forget(identity, key, text)
        )
        return self.request(hit.tokens, lazy=lazy)

    def remember(self, rendered: str, pieces: Sequence[bytes], prefix: Sequence[int]) -> None:
        """Cache the tokens of ``rendered``'s first ``len(prefix)`` tokens' text."""
        chars = prefix_chars(rendered, pieces, len(prefix))
        if self.cache is not None and chars is not None and chars > 0:
            self.cache.put(self.identity, self.key, rendered[:chars], prefix)
