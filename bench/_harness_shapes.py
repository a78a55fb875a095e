"""Request bodies shaped like the real agent harnesses' sessions, for ``bench/llama_sessions.py``.

Owns :class:`Shape` (a harness's endpoint, User-Agent and sizes) and :func:`session`,
which builds one session's requests turn by turn: turn ``k`` is turn ``k-1``'s request
plus a fixed assistant answer and a new user message (a replayed conversation: the same
bytes in every run, so runs compare request for request), and the first turn comes with
a side request (a title generator) that a harness sends at the same time as its main
request. What each shape copies from the real harnesses (Pi 0.73.1, Claude Code 2.1.197,
Codex 0.171.0, measured against llama-server b11434):

- **Pi** (``POST /v1/chat/completions``): one system message (a preamble, the tool list,
  guidelines, the project's AGENTS.md) that ends with a ``Current date:`` line right
  before ``\\nCurrent working directory:``; OpenAI ``tools``; streamed.
- **Claude Code** (``POST /v1/messages?beta=true``): ``system`` as text blocks, the first
  the per-prompt ``x-anthropic-billing-header`` (which the proxy removes by default), then
  the identity line and the long system prompt (``cache_control`` on both); Anthropic
  ``tools`` with ``input_schema``; the first user message holds a date reminder and the
  prompt *before* a long listing of agents and skills; streamed.
- **Codex** (``POST /v1/responses``): long base ``instructions``, a developer message
  (permissions), an ``<environment_context>`` user message, then the prompt; function
  ``tools``; ``store: false``, streamed.

The text is deterministic filler (words drawn by a seeded generator): what the benchmark
measures is token reuse, which depends on which bytes repeat, not on what they say.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["SHAPES", "Request", "Shape", "prose", "session"]

_VOCAB = (
    "file function module test build cache slot token prefix request answer server "
    "proxy client session harness project folder path commit branch review change error "
    "result value config option default flag command shell output input buffer stream "
    "parse render template model prompt system user assistant tool schema object array "
    "string number boolean field method class type check verify restore save load read "
    "write edit delete create update list search find replace run stop start wait retry "
    "log trace debug warn info level budget limit bound queue lock lease thread loop task "
    "always never only first last next before after while until unless because so then "
    "the a an of to in on for with by from into over under about between through and or"
)
_WORDS = _VOCAB.split()


def prose(seed: str, words: int) -> str:
    """``words`` words of deterministic filler in sentences, the same for the same seed."""
    rng = random.Random(seed)
    out: list[str] = []
    sentence: list[str] = []
    for _ in range(words):
        sentence.append(rng.choice(_WORDS))
        if len(sentence) >= rng.randint(8, 16):
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out)


@dataclass(frozen=True)
class Request:
    """One request of a session: where it goes, as whom, and its JSON body."""

    harness: str
    session: str
    turn: int
    kind: str  # "main" or "side"
    path: str
    user_agent: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """A harness and the sizes (in filler words) of the parts of its requests."""

    name: str
    path: str
    user_agent: str
    system_words: int
    tools: int
    tool_words: int
    turn_words: int  # each new user message; the assistant answers are a third of it
    listing_words: int = 0  # Claude Code's agents-and-skills listing

    def scaled(self, factor: float) -> Shape:
        """The same shape with every size multiplied by ``factor`` (at least 1 word)."""

        def s(n: int) -> int:
            return max(1, round(n * factor)) if n else 0

        return Shape(
            self.name, self.path, self.user_agent, s(self.system_words), max(1, self.tools),
            s(self.tool_words), s(self.turn_words), s(self.listing_words),
        )  # fmt: skip


SHAPES: dict[str, Shape] = {
    "pi": Shape("pi", "/v1/chat/completions", "OpenAI/JS 5.20.0", 900, 4, 60, 60),
    "claude": Shape(
        "claude", "/v1/messages?beta=true", "claude-cli/2.1.197 (external, sdk-cli)",
        1500, 12, 220, 80, listing_words=600,
    ),
    "codex": Shape(
        "codex", "/v1/responses", "codex_exec/0.171.0 (Linux; x86_64) xterm", 2400, 5, 80, 60,
    ),
}  # fmt: skip


def _schema(seed: str) -> dict[str, Any]:
    props = {
        f"arg_{i}": {"type": "string", "description": prose(f"{seed}{i}", 6)} for i in range(3)
    }
    return {"type": "object", "properties": props, "required": ["arg_0"]}


def _text(text: str, kind: str = "text", cached: bool = False) -> dict[str, Any]:
    """A text content block (``cached``: with Claude Code's ``cache_control`` mark)."""
    block: dict[str, Any] = {"type": kind, "text": text}
    if cached:
        block["cache_control"] = {"type": "ephemeral"}
    return block


def _item(role: str, text: str) -> dict[str, Any]:
    """A Responses input message."""
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [_text(text, kind)]}


def _pi_system(shape: Shape, sid: str, date: str) -> str:
    tools = "\n".join(f"- tool_{i}: {prose(f'pi-tooldoc{i}', 12)}" for i in range(shape.tools))
    rules = prose("pi-rules", shape.system_words)
    return (
        "You are an expert coding assistant operating inside pi, a coding agent harness. "
        "You help users by reading files, executing commands, editing code, and writing new "
        f"files.\n\nAvailable tools:\n{tools}\n\nGuidelines:\n{rules}"
        f"\n\n# Project Context\n\n## AGENTS.md\n\n{prose('pi-agents-md', 40)}"
        f"\nCurrent date: {date}\nCurrent working directory: /home/user/{sid}"
    )


def _tools(shape: Shape) -> list[dict[str, Any]]:
    """The harness's tool list in its endpoint's form."""
    out: list[dict[str, Any]] = []
    for i in range(shape.tools):
        name, desc = f"tool_{i}", prose(f"{shape.name}-tool{i}", shape.tool_words)
        params = _schema(f"{shape.name}-param{i}")
        if shape.name == "pi":
            function = {"name": name, "description": desc, "parameters": params}
            out.append({"type": "function", "function": function})
        elif shape.name == "claude":
            out.append({"name": name, "description": desc, "input_schema": params})
        else:
            out.append(
                {"type": "function", "name": name, "description": desc, "strict": False}
                | {"parameters": params}
            )
    return out


def _claude_first(shape: Shape, sid: str, prompt: str, date: str, cap: int) -> dict[str, Any]:
    suffix = f"{random.Random(prompt).randrange(16**3):03x}"
    system = [
        _text(f"x-anthropic-billing-header: cc_version=2.1.197.{suffix}; cc_entrypoint=sdk-cli;"),
        _text("You are Claude Code, Anthropic's official CLI for Claude.", cached=True),
        _text(prose("claude-system", shape.system_words), cached=True),
    ]
    reminder = f"<system-reminder>\n# currentDate\nToday's date is {date}.\n</system-reminder>"
    listing = prose("claude-listing", shape.listing_words)
    agents = f"<system-reminder>\nAgents and skills:\n{listing}\n</system-reminder>"
    content = [_text(reminder), _text(prompt), _text(agents)]
    return {
        "model": "local",
        "max_tokens": cap,
        "system": system,
        "tools": _tools(shape),
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "metadata": {"user_id": f"user_{sid}"},
    }


def _codex_first(shape: Shape, sid: str, prompt: str, cap: int) -> dict[str, Any]:
    env = (
        f"<environment_context>\n  <cwd>/home/user/{sid}</cwd>\n  <shell>bash</shell>\n"
        "</environment_context>"
    )
    perms = (
        "<permissions instructions>\nApprovals are on request; the sandbox is read-only.\n"
        "</permissions instructions>"
    )
    return {
        "model": "local",
        "instructions": prose("codex-instructions", shape.system_words),
        "input": [_item("developer", perms), _item("user", env), _item("user", prompt)],
        "tools": _tools(shape),
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "prompt_cache_key": sid,
        "max_output_tokens": cap,
    }


def _first(shape: Shape, sid: str, prompt: str, date: str, cap: int) -> dict[str, Any]:
    """The first turn's main request."""
    if shape.name == "claude":
        return _claude_first(shape, sid, prompt, date, cap)
    if shape.name == "codex":
        return _codex_first(shape, sid, prompt, cap)
    messages = [
        {"role": "system", "content": _pi_system(shape, sid, date)},
        {"role": "user", "content": prompt},
    ]
    return {
        "model": "local",
        "messages": messages,
        "tools": _tools(shape),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": cap,
    }


def _extend(shape: Shape, body: dict[str, Any], answer: str, user: str) -> dict[str, Any]:
    """``body`` with an assistant answer and a new user message appended."""
    out = copy.deepcopy(body)
    if shape.name == "pi":
        out["messages"] += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": user},
        ]
    elif shape.name == "claude":
        out["messages"] += [
            {"role": "assistant", "content": [_text(answer)]},
            {"role": "user", "content": [_text(user)]},
        ]
    else:
        out["input"] += [_item("assistant", answer), _item("user", user)]
    return out


_TITLE = (
    "Write a short title (at most six words) for a conversation that starts with the "
    "message below. Answer with the title only."
)


def _side(shape: Shape, prompt: str, cap: int) -> dict[str, Any]:
    """The small request a harness sends beside its first main request (a title)."""
    if shape.name == "claude":
        return {
            "model": "local",
            "max_tokens": cap,
            "stream": True,
            "system": [_text(_TITLE)],
            "messages": [{"role": "user", "content": prompt}],
        }
    if shape.name == "codex":
        return {
            "model": "local",
            "instructions": _TITLE,
            "input": prompt,
            "store": False,
            "stream": True,
            "max_output_tokens": cap,
        }
    messages = [{"role": "system", "content": _TITLE}, {"role": "user", "content": prompt}]
    return {"model": "local", "stream": False, "max_tokens": cap, "messages": messages}


def session(
    shape: Shape, sid: str, turns: int, cap: int, date: str = "2026-12-05"
) -> list[list[Request]]:
    """A session's requests, turn by turn: the first turn is [main, side] (sent together),
    every later one [main]."""

    def request(turn: int, kind: str, body: dict[str, Any]) -> Request:
        return Request(shape.name, sid, turn, kind, shape.path, shape.user_agent, body)

    prompt = f"Session {sid}: {prose(f'{sid}-prompt-0', shape.turn_words)}"
    body = _first(shape, sid, prompt, date, cap)
    out = [[request(1, "main", body), request(1, "side", _side(shape, prompt, cap))]]
    for turn in range(2, turns + 1):
        answer = prose(f"{sid}-answer-{turn}", max(1, shape.turn_words // 3))
        user = prose(f"{sid}-prompt-{turn}", shape.turn_words)
        body = _extend(shape, body, answer, user)
        out.append([request(turn, "main", body)])
    return out
