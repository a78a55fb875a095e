"""Run the real agent harnesses (Pi, Claude Code, Codex) non-interactively against a
base URL, configured with the exact blocks of docs/llama.md: test and benchmark
scaffolding, not part of the installed package.

Owns installing them (:func:`ensure_agents`, through ``scripts/install-agents``: pinned
npm versions, cached), reading the configuration blocks out of the docs
(:func:`doc_blocks`), one isolated home per harness (a fresh ``HOME`` holding the
configuration files where the docs put them, so nothing of the machine's own setup
leaks in) and :func:`run_session`: one prompt, offline (telemetry and update checks
off), bounded by a timeout that kills the harness's whole process group.

Does not own llama-server (:mod:`pion_testing.launcher`) nor the tool-rendering chat
template (``tests/llama/templates/chatml-tools.jinja``, :data:`TOOLS_TEMPLATE`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pion_testing.tasklog import TRACE_FLAGS

__all__ = [
    "ANSWER_CAP",
    "DOCS_BASE_URL",
    "HARNESSES",
    "TOOLS_TEMPLATE",
    "Harness",
    "SessionRun",
    "doc_blocks",
    "ensure_agents",
    "llama_server_args",
    "pinned_versions",
    "run_session",
]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "llama.md"
TOOLS_TEMPLATE = ROOT / "tests" / "llama" / "templates" / "chatml-tools.jinja"
# The proxy URL the docs' blocks are written with; a run replaces it with its own.
DOCS_BASE_URL = "http://127.0.0.1:8089"
# Telemetry, update and version checks off: the machines running the tests are offline.
OFFLINE_ENV = {
    "PI_OFFLINE": "1",
    "PI_TELEMETRY": "0",
    "PI_SKIP_VERSION_CHECK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "DO_NOT_TRACK": "1",
}

# Every answer is capped (pion_testing.recorder.cap_answer): a session's cost is its
# prompt, and a capped answer cannot complete a tool call the harness would then run.
ANSWER_CAP = 16


def llama_server_args(context: int) -> list[str]:
    """llama-server flags for the harness runs beside the model, port and ``-c``: the
    tool-rendering template, SmolLM2's training context (8192) raised to ``context``
    (llama-server caps a slot at the model's training context; Claude Code's prompt with
    its tools is ~21k tokens: what the model makes of it does not matter here) and the
    trace log that :mod:`pion_testing.tasklog` reads."""
    return [
        "--jinja",
        "--chat-template-file", str(TOOLS_TEMPLATE),
        "--override-kv", f"llama.context_length=int:{context}",
        *TRACE_FLAGS,
    ]  # fmt: skip


_BLOCK = re.compile(r"<!-- agent-config: (?P<name>[\w.-]+) -->\n```\w*\n(?P<body>.*?)```", re.S)


def ensure_agents() -> Path:
    """Install the pinned harnesses if needed (a no-op once done); the folder with the
    ``pi``, ``claude`` and ``codex`` executables. Fails loudly: never a skip."""
    script = ROOT / "scripts" / "install-agents"
    proc = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{script} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(lines[-1])


def pinned_versions() -> dict[str, str]:
    """The npm packages and versions scripts/install-agents pins (its PACKAGES list)."""
    text = (ROOT / "scripts" / "install-agents").read_text()
    pins = re.findall(r'^\s+"(@[\w./-]+)@([\w.-]+)"$', text, re.M)
    if len(pins) != len(HARNESSES):
        raise ValueError(f"scripts/install-agents pins {pins}, expected {len(HARNESSES)}")
    return dict(pins)


def doc_blocks(path: Path = DOCS) -> dict[str, str]:
    """The ``<!-- agent-config: NAME -->`` fenced blocks of docs/llama.md, by name."""
    blocks = {m["name"]: m["body"] for m in _BLOCK.finditer(path.read_text())}
    if not blocks:
        raise ValueError(f"{path} has no agent-config blocks")
    return blocks


def _env_lines(block: str) -> dict[str, str]:
    """``export K=V`` lines (the docs' Claude Code block) as a mapping."""
    env: dict[str, str] = {}
    for line in block.splitlines():
        if line.strip():
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value
    return env


@dataclass(frozen=True)
class Harness:
    """One agent harness: its executable, the endpoint it calls, and how it is set up
    from the docs' blocks and run for one prompt."""

    name: str
    executable: str
    endpoint: str

    def prepare(
        self, home: Path, base_url: str, blocks: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """Write the docs' configuration (URL replaced) under ``home``; the argv tail
        after the prompt is added by :func:`run_session`, and the extra environment."""

        def block(name: str) -> str:
            return blocks[name].replace(DOCS_BASE_URL, base_url)

        if self.name == "pi":
            agent_dir = home / ".pi" / "agent"
            agent_dir.mkdir(parents=True, exist_ok=True)
            (agent_dir / "models.json").write_text(block("pi-models.json"))
            (agent_dir / "settings.json").write_text(block("pi-settings.json"))
            argv = ["-p", "--provider", "pion", "--model", "local", "--no-session"]
            return argv, {"PI_CODING_AGENT_DIR": str(agent_dir)}
        if self.name == "claude":
            config_dir = home / ".claude"
            config_dir.mkdir(parents=True, exist_ok=True)
            env = _env_lines(block("claude-code.env"))
            return ["-p"], {**env, "CLAUDE_CONFIG_DIR": str(config_dir)}
        if self.name == "codex":
            codex_home = home / ".codex"
            codex_home.mkdir(parents=True, exist_ok=True)
            (codex_home / "config.toml").write_text(block("codex-config.toml"))
            argv = ["exec", "--skip-git-repo-check"]
            return argv, {"CODEX_HOME": str(codex_home), "LLAMA_API_KEY": "none"}
        raise ValueError(f"unknown harness {self.name!r}")


HARNESSES: dict[str, Harness] = {
    "pi": Harness("pi", "pi", "/v1/chat/completions"),
    "claude": Harness("claude", "claude", "/v1/messages"),
    "codex": Harness("codex", "codex", "/v1/responses"),
}


@dataclass(frozen=True)
class SessionRun:
    """One harness run: exit status (None: killed at the timeout), seconds, output."""

    harness: str
    returncode: int | None
    seconds: float
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_session(
    harness: Harness,
    bin_dir: Path,
    base_url: str,
    prompt: str,
    *,
    home: Path,
    cwd: Path,
    timeout: float,
    blocks: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> SessionRun:
    """Run ``harness`` once, non-interactively, on ``prompt`` against ``base_url``.

    ``home`` is the harness's whole home (configuration written there); ``cwd`` its
    project folder; ``args`` go before the prompt (the harness's own flags). The
    environment is built from scratch (``PATH``, ``HOME``, the docs' configuration,
    :data:`OFFLINE_ENV`): no key or setting of the machine leaks in. At ``timeout`` the
    harness and its children are killed.
    """
    argv, extra = harness.prepare(home, base_url, blocks or doc_blocks())
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "CI": "1",
        **OFFLINE_ENV,
        **extra,
    }
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(bin_dir / harness.executable), *argv, *args, prompt],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    seconds = time.monotonic() - started
    return SessionRun(harness.name, code, seconds, out.decode(errors="replace"))
