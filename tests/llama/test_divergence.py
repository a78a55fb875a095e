"""pion.llama.divergence: where a request left a harness's learned prefix, and why, on
Pi-, Claude Code- and Codex-shaped prompts (tokens from the fake llama-server's
tokenizer, which splits words as BPE does at whitespace)."""

from __future__ import annotations

import json

import pytest
from pion_testing.llama_samples import pi_system_prompt, pi_tools

from pion.llama.divergence import Cause, Divergence, DivergenceLog, find_divergence
from support.fake_llama_model import render_chat, tokenize


def pi_prompt(date: str, tools: list[dict[str, object]] | None = None) -> str:
    # Pi's stable part ends at "\nCurrent working directory:"; the date sits before it.
    system = pi_system_prompt().split("\n\n<project_context>")[0]
    system += f"\nCurrent date: {date}\nCurrent working directory: /home/user/project"
    body = {"messages": [{"role": "system", "content": system}], "tools": tools or pi_tools()}
    return render_chat({**body, "add_generation_prompt": False})


def diverge(learned: str, sent: str, **kwargs: bool) -> Divergence:
    found = find_divergence(tokenize(learned, True), tokenize(sent, True), learned, sent, **kwargs)
    assert found is not None
    return found


CLAUDE_SYSTEM = (
    "You are Claude Code, Anthropic's official CLI for Claude.\n"
    "You are an interactive CLI tool that helps users with software engineering tasks.\n"
    "IMPORTANT: Assist with defensive security tasks only.\n"
    "# Tone and style\n"
    "You should be concise, direct, and to the point.\n"
    "# Following conventions\n"
    "When making changes to files, first understand the file's code conventions.\n"
)
REMINDER = (
    "<system-reminder>\n"
    "As you answer the user's questions, you can use the following context:\n"
    "</system-reminder>\n"
)
CODEX_DEVELOPER = (
    "<permissions instructions>\n"
    "Filesystem sandboxing defines which files can be read or written. "
    "sandbox_mode is read-only: The sandbox only permits reading files.\n"
    "</permissions instructions>\n"
    "<environment_context>\n  <shell>bash</shell>\n</environment_context>\n"
)


def test_a_changed_date_is_found_with_its_excerpt() -> None:
    learned, sent = pi_prompt("2026-12-04"), pi_prompt("2026-12-05")
    found = diverge(learned, sent)
    assert found.cause is Cause.DATE_CHANGED
    assert found.char == learned.index("2026-12-04") + len("2026-12-0")
    assert found.token == len(tokenize(learned[: learned.index(" 2026-12-04")], True))
    assert found.shared is not None and found.shared.endswith("Current date: 2026-12-0")
    assert (found.learned, found.sent) == ("4", "5")
    assert found.learned_tokens == len(tokenize(learned, True))
    line = found.summary()
    assert "date or time changed" in line and "2026-12-0" in line and "'5'" in line


def test_a_reordered_tool_list() -> None:
    tools = pi_tools()
    found = diverge(pi_prompt("2026-12-04", tools), pi_prompt("2026-12-04", tools[::-1]))
    assert found.cause is Cause.TOOLS_REORDERED
    assert found.learned is not None and found.learned.startswith("read")
    assert found.sent is not None and found.sent.startswith("write")


def test_an_inserted_a_removed_and_a_moved_block() -> None:
    head, tail = CLAUDE_SYSTEM.split("# Tone and style\n")
    with_reminder = head + REMINDER + "# Tone and style\n" + tail
    assert diverge(CLAUDE_SYSTEM, with_reminder).cause is Cause.BLOCK_INSERTED
    assert diverge(with_reminder, CLAUDE_SYSTEM).cause is Cause.BLOCK_REMOVED
    lines = CLAUDE_SYSTEM.splitlines(keepends=True)
    moved = "".join([lines[0], lines[2], lines[1], *lines[3:]])
    found = diverge(CLAUDE_SYSTEM, moved)
    assert found.cause is Cause.BLOCK_MOVED
    assert found.char == len(lines[0])


def test_changed_text_and_a_shorter_request() -> None:
    edited = CODEX_DEVELOPER.replace("read-only", "workspace-write")
    found = diverge(CODEX_DEVELOPER, edited)
    assert found.cause is Cause.TEXT_CHANGED
    assert found.learned is not None and found.learned.startswith("read-only")
    short = CODEX_DEVELOPER[: CODEX_DEVELOPER.index("<environment_context>")]
    assert diverge(CODEX_DEVELOPER, short).cause is Cause.SHORTER


def test_no_divergence_when_the_request_holds_the_prefix() -> None:
    learned = pi_prompt("2026-12-04")
    sent = learned + "<|user|>\nList the files.\n<|end|>\n"
    assert find_divergence(tokenize(learned, True), tokenize(sent, True), learned, sent) is None


def test_without_texts_only_positions() -> None:
    found = find_divergence([1, 2, 3, 4], [1, 2, 9, 9, 9])
    assert found == Divergence(2, 4, 5, Cause.TEXT_CHANGED)
    assert find_divergence([1, 2, 3, 4], [1, 2]) == Divergence(2, 4, 2, Cause.SHORTER)


def test_excerpts_off_keeps_no_text() -> None:
    learned, sent = pi_prompt("2026-12-04"), pi_prompt("2026-12-05")
    found = diverge(learned, sent, excerpts=False)
    assert found.cause is Cause.DATE_CHANGED and found.char is not None
    assert found.shared is None and found.learned is None and found.sent is None
    log = DivergenceLog(excerpts=False)
    log.record("pi/0.87", diverge(learned, sent))  # the log strips them too
    dumped = json.dumps(log.to_json())
    assert "Current" not in dumped and "2026" not in dumped


def test_the_log_is_bounded_per_harness_and_over_harnesses() -> None:
    log = DivergenceLog(max_harnesses=3, per_harness=2)
    a = Divergence(5, 10, 12, Cause.DATE_CHANGED, 40, "date: 2026-12-0", "4", "5")
    b = Divergence(7, 10, 12, Cause.TEXT_CHANGED)
    for d in (a, a, b):
        log.record("pi", d)
    entry = log.get("pi")
    assert entry is not None
    assert list(entry.recent) == [a, b]  # the last two
    assert entry.counts == {Cause.DATE_CHANGED: 2, Cause.TEXT_CHANGED: 1}  # every one counted
    for harness in ("claude-cli", "codex", "opencode"):
        log.record(harness, b)
    assert log.harnesses() == ["claude-cli", "codex", "opencode"]  # pi least recent: gone
    log.record("claude-cli", a)
    log.record("x" * 10_000, b)
    assert log.harnesses() == ["opencode", "claude-cli", "x" * 200]
    out = log.to_json()
    assert out["counts"] == {"date-changed": 3, "text-changed": 5}
    assert out["harnesses"]["claude-cli"]["recent"][-1] == a.to_json()
    assert a.to_json()["learned"] == "4" and "learned" not in b.to_json()


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        DivergenceLog(max_harnesses=0)
