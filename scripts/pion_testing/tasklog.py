"""What llama-server itself says it reused, per request: its log at ``-lv 4``.

Owns :func:`read_tasks`, which reads a llama-server log (from a byte offset, so a caller
takes only the tasks of one session) into :class:`Task` records: the request's prompt
tokens (``new prompt, ... task.n_tokens = N``), the tokens the slot already held
(the first ``cached n_tokens = C`` of the task), the prompt time (``prompt eval time
= X ms``) and what the slot held when the task stopped (``stop processing: n_tokens``:
more than the prompt when it generated). :func:`main_task` picks a session's main
request out of them. This is the oracle of the real-harness tests and
``bench/agents.py``: it does not depend on what the harness's API reports
(``/v1/messages`` replies carry no ``timings``) nor on the proxy. Test and benchmark
scaffolding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["TRACE_FLAGS", "Task", "main_task", "main_tasks", "read_tasks"]

# The log level that prints the two trace lines read here.
TRACE_FLAGS = ("-lv", "4")

_NEW = re.compile(r"\| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
_CACHED = re.compile(r"\| task (\d+) \| cached n_tokens = (\d+),")
_EVAL = re.compile(r"\| task (\d+) \| prompt eval time = +([\d.]+) ms / +(\d+) tokens")
_STOP = re.compile(r"\| task (\d+) \| stop processing: n_tokens = (\d+)")


@dataclass(frozen=True)
class Task:
    """One request llama-server processed."""

    id: int
    n_tokens: int
    cached: int = 0
    prompt_ms: float | None = None
    processed: int | None = None
    final: int | None = None  # tokens in the slot when llama-server stopped the task

    @property
    def reuse(self) -> float:
        return self.cached / self.n_tokens if self.n_tokens else 0.0

    @property
    def answered(self) -> bool:
        """Whether it generated: a proxy's warm-up (``n_predict: 0``) stops with the
        prompt alone, a request the harness gave up on stops inside it."""
        return self.final is not None and self.final > self.n_tokens


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
        elif (found := _STOP.search(line)) and int(found[1]) in tasks:
            tasks[int(found[1])] = replace(tasks[int(found[1])], final=int(found[2]))
    return list(tasks.values())


def main_tasks(tasks: list[Task], share: float = 0.9) -> list[Task]:
    """The tasks of the session's main size, in order: at least ``share`` as long as the
    longest. Side requests (a title) are much shorter; what is left is the proxy's
    warm-up of the prefix, the main request (again, when the harness gave up on it) and
    the follow-ups that extend it after a capped answer."""
    if not tasks:
        raise ValueError("llama-server processed no request")
    longest = max(t.n_tokens for t in tasks)
    return [t for t in tasks if t.n_tokens >= share * longest]


def main_task(tasks: list[Task], share: float = 0.9) -> Task:
    """The session's main request: the first task of the main size that answered (see
    :func:`main_tasks`); the first of that size when none did (a killed session)."""
    mains = main_tasks(tasks, share)
    return next((t for t in mains if t.answered), mains[0])
