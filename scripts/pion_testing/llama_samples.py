"""Pi-shaped sample requests for tests, the benchmarks and the fidelity worker.

Owns :func:`pi_system_prompt` and :func:`pi_tools`, which build a system prompt shaped like
Pi's (>= 0.87): an untagged preamble, then ``<tools>``, ``<rules>``, ``<project_context>`` and
``<cwd>`` sections joined by blank lines, so the markers ``\\n<project_context>`` and
``\\n<cwd>`` occur exactly as in a real session; and an OpenAI ``tools`` list. The text is
deterministic for given arguments; its size scales with ``n_rules``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pi_chat_body", "pi_system_prompt", "pi_tools"]

_TOOL_SPECS = (
    ("read", "Read the contents of a file. Supports text files and images.", ("path",)),
    ("bash", "Execute a bash command in the current working directory.", ("command",)),
    ("edit", "Edit a file by replacing exact text. The old text must match exactly.", ("path",)),
    ("write", "Write content to a file. Creates the file if it does not exist.", ("path",)),
)

_TOPICS = (
    "reading files before editing them",
    "keeping edits small and reviewable",
    "running the test suite after each change",
    "explaining the plan before large refactors",
    "never deleting files the user did not mention",
    "quoting paths that contain spaces",
    "preferring the project's existing helpers",
    "reporting commands that failed and why",
)


def pi_tools() -> list[dict[str, Any]]:
    """An OpenAI ``tools`` list like Pi's built-in tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        p: {"type": "string", "description": f"The {p}"} for p in params
                    },
                    "required": list(params),
                },
            },
        }
        for name, description, params in _TOOL_SPECS
    ]


def pi_system_prompt(
    n_rules: int = 24,
    project: str = "AGENTS.md: run `make test` before committing.",
    cwd: str = "/home/user/project",
    variant: str = "",
) -> str:
    """A Pi-shaped system prompt; everything before ``\\n<project_context>`` is stable.

    ``variant`` changes the stable preamble (a different harness setup, so a different
    fingerprint); ``project`` and ``cwd`` change only the variable tail.
    """
    preamble = (
        "You are an expert coding assistant operating inside pi, a coding agent harness. "
        f"You help users by reading files, executing commands, editing code and writing "
        f"new files.{(' ' + variant) if variant else ''}"
    )
    tools = "\n".join(f"- {name}: {desc}" for name, desc, _ in _TOOL_SPECS)
    rules = "\n".join(
        f"{i + 1}. Guideline {i + 1} is about {_TOPICS[i % len(_TOPICS)]}; "
        f"apply it to step {i + 1} of every task, and mention rule {i + 1} when it matters."
        for i in range(n_rules)
    )
    sections = [
        preamble,
        f"<tools>\nAvailable tools:\n{tools}\n</tools>",
        f"<rules>\n{rules}\n</rules>",
        f"<project_context>\n{project}\n</project_context>",
        f"<cwd>\n{cwd}\n</cwd>",
    ]
    return "\n\n".join(sections)


def pi_chat_body(
    user: str = "List the files in this project.",
    *,
    n_rules: int = 24,
    project: str = "AGENTS.md: run `make test` before committing.",
    variant: str = "",
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat-completions body as Pi sends it (system prompt, tools, one user turn)."""
    system = pi_system_prompt(n_rules, project=project, variant=variant)
    return {
        "model": "pion-test",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": pi_tools() if tools is None else tools,
        **extra,
    }
