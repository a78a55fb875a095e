"""What llama-server itself says it reused, per request: its log at ``-lv 4``.

Owns :func:`read_tasks`, which reads a llama-server log (from a byte offset, so a caller
takes only the tasks of one session) into :class:`Task` records: the request's prompt
tokens (``new prompt, ... task.n_tokens = N``), the tokens the slot already held
(the first ``cached n_tokens = C`` of the task) and the prompt time (``prompt eval time
= X ms``). This is the oracle of the real-harness tests and ``bench/agents.py``: it does
not depend on what the harness's API reports (``/v1/messages`` replies carry no
``timings``) nor on the proxy. Test and benchmark scaffolding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["TRACE_FLAGS", "Task", "main_task", "read_tasks"]

# The log level that prints the two trace lines read here.
TRACE_FLAGS = ("-lv", "4")

_NEW = re.compile(r"\| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
_CACHED = re.compile(r"\| task (\d+) \| cached n_tokens = (\d+),")
_EVAL = re.compile(r"\| task (\d+) \| prompt eval time = +([\d.]+) ms / +(\d+) tokens")


@dataclass(frozen=True)
class Task:
    """One request llama-server processed."""

    id: int
    n_tokens: int
    cached: int = 0
    prompt_ms: float | None = None
    processed: int | None = None

    @property
    def reuse(self) -> float:
        return self.cached / self.n_tokens if self.n_tokens else 0.0


def read_tasks(log: Path, offset: int = 0) -> list[Task]:
    """The tasks whose ``new prompt`` line is in ``log`` after byte ``offset``, in order."""
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    tasks: dict[int, Task] = {}
    seen_cached: set[int] = set()
    for line in text.splitlines():
        if found := _NEW.search(line):
            task = int(found[1])
            tasks[task] = Task(task, int(found[2]))
        elif (found := _CACHED.search(line)) and int(found[1]) in tasks:
            task = int(found[1])
            if task not in seen_cached:  # later lines are the batches of the same prompt
                seen_cached.add(task)
                tasks[task] = replace(tasks[task], cached=int(found[2]))
        elif (found := _EVAL.search(line)) and int(found[1]) in tasks:
            task = int(found[1])
            ms, processed = float(found[2]), int(found[3])
            tasks[task] = replace(tasks[task], prompt_ms=ms, processed=processed)
    return list(tasks.values())


def main_task(tasks: list[Task]) -> Task:
    """The session's main request: the longest prompt (a harness's side requests, e.g.
    a title, and the proxy's warm-ups of the prefix alone are shorter)."""
    if not tasks:
        raise ValueError("llama-server processed no request")
    return max(tasks, key=lambda t: t.n_tokens)
