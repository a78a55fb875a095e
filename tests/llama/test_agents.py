"""The real agent harnesses through the proxy: Pi, Claude Code and Codex (pinned npm
versions, scripts/install-agents), each configured with exactly the blocks of
docs/llama.md, run non-interactively and offline against `pion llama proxy --persist`,
the real llama-server and SmolLM2-135M-Instruct with a chat template that renders the
tools first (tests/llama/templates/chatml-tools.jinja: SmolLM2's own drops them), so the
prefix carries the tool schemas as on real models.

Per harness, three sessions in one project folder with different prompts; the proxy's
outcome for each session's main request (the longest prefix it warmed, from
``/pion/status``) must be:

1. cold, and saved (a slot file, listed in index.json);
2. a hit: the prefix still in the slot;
3. after a llama-server restart: restored from the slot file (in full, or >= 90% of it
   from a saved prefix it extends), and llama-server's own log shows the session's main
   request reusing >= 90% of the prefix.

What the model answers is not checked: a recorder between the proxy and llama-server caps
every answer at 16 tokens (:func:`pion_testing.recorder.cap_answer`; the prompt is not
touched), and a harness may then exit non-zero. Each session is bounded by a timeout.
Reuse is read from llama-server's log (:mod:`pion_testing.tasklog`), not from the proxy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.agents import (
    ANSWER_CAP,
    HARNESSES,
    SessionRun,
    doc_blocks,
    ensure_agents,
    llama_server_args,
    run_session,
)
from pion_testing.launcher import LlamaServerProcess
from pion_testing.recorder import recording
from pion_testing.tasklog import Task, main_task, read_tasks

from pion.llama.agents import DEFAULT_CONTEXT
from pion.llama.config import WarmerConfig
from pion.llama.outcome import WARM_KINDS
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy

from .conftest import REAL_MODEL_BATCH_THREADS, StartServer

pytestmark = [pytest.mark.llama, pytest.mark.real]

# Claude Code's full set of built-in tools makes a ~20k-token prompt whose cold prefill
# takes ~11 minutes at one llama-server thread (attention grows with the square of the
# length). The test keeps five of them (~6.5k tokens): the system prompt is the full
# one, the agents and skills listing still comes after the first user message, the
# prefix still carries tool schemas; bench/agents.py measures the full set.
HARNESS_ARGS = {"claude": ["--tools=Agent,Bash,Edit,Read,Skill"]}
# A bound, not an expectation: a cold session here takes under a minute on two idle cores,
# many times that on two cores shared by a dozen processes.
SESSION_TIMEOUT_S = 3600.0
PROMPTS = ("say hi", "say bye", "say hello again")


@pytest.fixture(scope="session")
def agents_bin() -> Path:
    return ensure_agents()


@pytest.fixture
def agent_server(start_server: StartServer, smollm2_gguf: Path) -> LlamaServerProcess:
    """SmolLM2 on llama-server for the harnesses: one slot of the context the
    configurations announce, the tool-rendering template, the trace log."""
    return start_server(
        smollm2_gguf,
        ctx=DEFAULT_CONTEXT,
        threads_batch=REAL_MODEL_BATCH_THREADS,
        extra_args=llama_server_args(DEFAULT_CONTEXT),
    )


def status(url: str) -> dict[str, Any]:
    data = httpx.get(url + STATUS_PATH, timeout=30).json()
    assert isinstance(data, dict)
    return data


class Sessions:
    """Runs one harness's sessions; for each, llama-server's main task and the proxy's
    outcome for the main request's prefix."""

    def __init__(
        self, name: str, bin_dir: Path, url: str, server: LlamaServerProcess, proxy: PrefixProxy
    ) -> None:
        self.proxy = proxy
        self.harness = HARNESSES[name]
        self.bin_dir = bin_dir
        self.url = url
        self.server = server
        self.blocks = doc_blocks()
        self.runs: list[SessionRun] = []
        self.outcomes: list[dict[str, Any]] = []

    def run(self, prompt: str, home: Path, cwd: Path) -> tuple[Task, dict[str, Any]]:
        """One session: its main request as llama-server saw it
        (:func:`~pion_testing.tasklog.main_task`) and the proxy's outcome for its prefix
        (the longest prefix it warmed)."""
        offset = self.server.log_path.stat().st_size
        started = time.time()
        run = run_session(
            self.harness,
            self.bin_dir,
            self.url,
            prompt,
            home=home,
            cwd=cwd,
            timeout=SESSION_TIMEOUT_S,
            blocks=self.blocks,
            args=HARNESS_ARGS.get(self.harness.name, ()),
        )
        self.runs.append(run)
        assert not run.timed_out, self.explain()
        tasks = read_tasks(self.server.log_path, offset)
        assert tasks, self.explain()
        self.outcomes = [o for o in status(self.url)["outcomes"] if o["at"] >= started]
        warmed = [o for o in self.outcomes if o["kind"] in WARM_KINDS]
        assert warmed, self.explain()
        return main_task(tasks), max(warmed, key=lambda o: o["tokens"])

    def explain(self) -> str:
        """What the harnesses printed, the proxy's outcomes and llama-server's log tail,
        for a failing assertion."""
        parts = [
            f"--- {r.harness} session {i} rc={r.returncode} {r.seconds:.1f}s\n{r.output[-3000:]}"
            for i, r in enumerate(self.runs, 1)
        ]
        outcomes = "\n".join(o.get("summary", str(o)) for o in self.outcomes)
        tail = self.server.tail(30)
        return "\n".join([*parts, "--- outcomes", outcomes, "--- llama-server", tail])


def saved_fingerprints(slot_dir: Path) -> set[str]:
    """Fingerprints of index.json's files, each checked present on disk."""
    index = json.loads((slot_dir / "index.json").read_text())
    found = set()
    for name, entry in index["files"].items():
        assert (slot_dir / name).is_file(), name
        found.add(entry["fingerprint"])
    return found


@pytest.mark.parametrize("name", ["pi", "claude", "codex"])
def test_harness_session_saved_hit_restored(
    name: str, agents_bin: Path, agent_server: LlamaServerProcess, slot_dir: Path, tmp_path: Path
) -> None:
    server = agent_server
    with recording(server.url, answer_cap=ANSWER_CAP) as (_, capped):
        config = WarmerConfig(
            base_url=capped,
            persist=True,
            slot_dir=slot_dir,
            log_path=tmp_path / "prefix-cache.log",
            timeout=SESSION_TIMEOUT_S,
        )
        proxy = PrefixProxy(config)
        with running_proxy(proxy) as url:
            sessions = Sessions(name, agents_bin, url, server, proxy)
            run_three_sessions(sessions, slot_dir, tmp_path / "home", tmp_path / "project")


def run_three_sessions(sessions: Sessions, slot_dir: Path, home: Path, project: Path) -> None:
    """The three sessions; every check is collected and reported together, so one (slow)
    run tells all that fails."""
    failed: list[str] = []

    def check(ok: bool, what: str, *context: object) -> None:
        if not ok:
            failed.append(f"{what}: {context}")

    # 1. cold: the prefix is built and saved.
    first, cold = sessions.run(PROMPTS[0], home, project)
    check(cold["kind"] == "cold" and cold["saved"], "session 1 not cold and saved", cold)
    check(cold["fingerprint"] in saved_fingerprints(slot_dir), "session 1 prefix not saved")
    # The template renders the tools first: the prefix carries them, most of the prompt.
    check(cold["tokens"] > 0.5 * first.n_tokens, "prefix under half the prompt", first, cold)

    # 2. another prompt in the same process: a hit.
    second, hit = sessions.run(PROMPTS[1], home, project)
    check(hit["kind"] == "hit", "session 2 not a hit", hit["summary"])
    check(second.cached >= 0.9 * hit["tokens"], "session 2 reused < 90%", second, hit["tokens"])

    # 3. llama-server restarted (its memory gone): restored from the slot file. A restart
    # comes later than a session's end: the proxy's background saves are done by then.
    assert sessions.proxy.flush(SESSION_TIMEOUT_S)
    # A prefix learned in session 2 inside what the slot held has its own file by now.
    check(hit["fingerprint"] in saved_fingerprints(slot_dir), "session 2 prefix not saved")
    sessions.server.restart()
    third, restored = sessions.run(PROMPTS[2], home, project)
    kind = restored["kind"]
    check(kind in ("restored", "partial"), "session 3 not restored", restored["summary"])
    from_disk = restored["shared"] if kind == "partial" else restored["tokens"]
    check(from_disk >= 0.9 * restored["tokens"], "session 3 restored < 90%", restored["summary"])
    check(third.cached >= 0.9 * restored["tokens"], "session 3 reused < 90%", third, restored)
    assert not failed, "\n".join([*failed, sessions.explain()])
