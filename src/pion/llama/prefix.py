"""Stable-prefix extraction: which part of a chat request can be reused across sessions.

Owns :class:`WarmRequest` (everything the warmer needs to rebuild the prefix exactly as the
real request renders it) and :func:`warm_request_from_chat`, which cuts the first
system/developer message at the earliest boundary marker (Pi's ``\\n<project_context>``,
``\\n<cwd>``, ``\\nCurrent working directory:``; configurable). Everything before the marker is
the same for every session of one harness setup; everything after it (project context, cwd,
the conversation) varies.

Does not own HTTP or hashing. Pure functions over parsed JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pion.llama.tokencache import LazyConversation

__all__ = [
    "LABEL_CHARS",
    "RENDER_KEYS",
    "PrefixSkip",
    "WarmRequest",
    "split_prefix",
    "warm_request_from_chat",
]

# Request fields that change how the chat template renders the prompt: the warm-up must
# carry them verbatim so its tokens equal the real request's up to the prefix's end.
RENDER_KEYS: tuple[str, ...] = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
)

_PREFIX_ROLES = ("system", "developer")
# Characters of a prefix shown in status output (which prefix is in which slot).
LABEL_CHARS = 80


@dataclass(frozen=True)
class WarmRequest:
    """A stable prefix plus the rendering context it must be warmed with.

    ``render`` holds the :data:`RENDER_KEYS` present in the request (tools,
    chat_template_kwargs, ...). ``parts`` is True when the system content was sent as a list
    of content parts, so the warm-up sends the same shape. ``model`` and ``harness`` feed
    the fingerprint only.
    """

    prefix: str
    role: str = "system"
    render: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    harness: str = ""
    parts: bool = False
    # Token mode: the prefix as llama-server's own tokens (any endpoint, a learned
    # boundary). It is warmed as a raw ``/completion`` of these tokens; ``prefix`` is then
    # only the text shown in status output and ``render`` is empty (the tokens carry it).
    tokens: tuple[int, ...] | None = None
    # Token mode: the whole request's tokens (the prefix, then the conversation after it):
    # what a checkpoint of the conversation is looked up by and checked against
    # (:mod:`pion.llama.checkpoint`). Not part of the prefix's identity.
    conversation: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    # Token mode, the prefix found in the token cache: the rendering, tokenized into
    # ``conversation`` only when something needs it (a restore, a checkpoint).
    lazy: LazyConversation | None = field(default=None, compare=False, repr=False)

    def label(self) -> str:
        """A human name for the prefix in status output: its first non-empty line, or its
        beginning and end when longer than :data:`LABEL_CHARS` (prefixes of one harness
        often share their first words and differ further on)."""
        line = next((ln.strip() for ln in self.prefix.splitlines() if ln.strip()), "")
        if len(line) <= LABEL_CHARS:
            return line
        half = (LABEL_CHARS - 1) // 2
        return line[:half].rstrip() + "…" + line[-half:].lstrip()

    def system_message(self) -> dict[str, Any]:
        """The system/developer message holding only the prefix."""
        content: Any = [{"type": "text", "text": self.prefix}] if self.parts else self.prefix
        return {"role": self.role, "content": content}

    def completion_body(self, user: str, **extra: Any) -> dict[str, Any]:
        """A raw ``/completion`` body (token mode): the prefix's tokens, then ``user`` as
        text when not empty (llama-server tokenizes the string part of a mixed prompt)."""
        prompt: list[Any] = list(self.tokens or ())
        if user:
            prompt.append(user)
        return {"prompt": prompt, **extra}

    def body(self, user: str, **extra: Any) -> dict[str, Any]:
        """A chat-completions body: the prefix, one user message, the rendering keys."""
        body: dict[str, Any] = {
            "messages": [self.system_message(), {"role": "user", "content": user}],
            **self.render,
        }
        if self.model is not None:
            body["model"] = self.model
        body.update(extra)
        return body


@dataclass(frozen=True)
class PrefixSkip:
    """Why a request has no warmable prefix (logged; the request proceeds untouched)."""

    reason: str


def split_prefix(text: str, markers: Sequence[str]) -> str | None:
    """Everything before the earliest marker, or None when no marker occurs."""
    cuts = [i for m in markers if m and (i := text.find(m)) >= 0]
    return text[: min(cuts)] if cuts else None


def _system_text(content: Any) -> tuple[str, bool] | None:
    if isinstance(content, str):
        return content, False
    # A list of content parts is accepted when it is one text part: the warm-up can then
    # send the same shape, which renders the same way.
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], Mapping)
        and content[0].get("type") == "text"
        and isinstance(content[0].get("text"), str)
    ):
        return content[0]["text"], True
    return None


def warm_request_from_chat(
    body: Mapping[str, Any],
    markers: Sequence[str],
    harness: str = "",
) -> WarmRequest | PrefixSkip:
    """Extract the warmable prefix of an OpenAI chat-completions body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return PrefixSkip("no messages")
    first = messages[0]
    role = first.get("role")
    if role not in _PREFIX_ROLES:
        return PrefixSkip("first message is not system/developer")
    text = _system_text(first.get("content"))
    if text is None:
        return PrefixSkip("system content is not one text")
    prefix = split_prefix(text[0], markers)
    if prefix is None:
        return PrefixSkip("no boundary marker in the system prompt")
    if not prefix.strip():
        return PrefixSkip("empty prefix before the boundary marker")
    model = body.get("model")
    return WarmRequest(
        prefix=prefix,
        role=str(role),
        render={k: body[k] for k in RENDER_KEYS if k in body},
        model=model if isinstance(model, str) else None,
        harness=harness,
        parts=text[1],
    )
