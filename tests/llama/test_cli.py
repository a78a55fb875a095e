"""`pion llama warm|status|proxy` (click group), against a real llama-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from pion_testing.launcher import LlamaServerProcess, free_port
from pion_testing.llama_samples import pi_chat_body, pi_system_prompt, pi_tools

from pion.llama.cli import llama_group
from support import count, log_lines, wait_log

pytestmark = pytest.mark.llama


def env_for(llama_server: LlamaServerProcess, slot_dir: Path, log: Path) -> dict[str, str]:
    """Configure through pi-prefix-cache's env vars, as a Pi setup would."""
    return {
        "PI_PREFIX_CACHE_BASE_URL": llama_server.url + "/v1",
        "PI_PREFIX_CACHE_PERSIST": "1",
        "PI_PREFIX_CACHE_SLOT_DIR": str(slot_dir),
        "PI_PREFIX_CACHE_LOG": str(log),
        "PI_PREFIX_CACHE_HARNESS": "boot",
    }


def test_warm_then_status(llama_server: LlamaServerProcess, slot_dir: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "system.txt"
    prompt.write_text(pi_system_prompt())
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(pi_tools()))
    log = tmp_path / "pc.log"
    env = env_for(llama_server, slot_dir, log)
    args = ["warm", "--system-prompt-file", str(prompt), "--tools-file", str(tools)]
    runner = CliRunner()
    first = runner.invoke(llama_group, args, env=env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("COLD — warmed")
    llama_server.restart()
    second = runner.invoke(llama_group, [*args, "--verify", "probe"], env=env)
    assert second.exit_code == 0, second.output
    assert second.output.startswith("WARM — restored")
    assert count(log_lines(log), "RESTORE verified: identical") == 1

    status = runner.invoke(llama_group, ["status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    data = json.loads(status.output)
    assert data["slots"][0]["n_prompt_tokens"] > 1000
    (entry,) = data["files"].values()
    assert entry["harness"] == "boot" and data["orphans"] == []
    table = runner.invoke(llama_group, ["status"], env=env)
    assert table.exit_code == 0 and "pi-prefix-" in table.output


def test_warm_fails_with_exit_1_when_server_is_down(tmp_path: Path) -> None:
    prompt = tmp_path / "system.txt"
    prompt.write_text("stable part\n<cwd>\n/x\n</cwd>")
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        llama_group,
        [
            "warm",
            "--system-prompt-file",
            str(prompt),
            "--upstream",
            url,
            "--log",
            str(tmp_path / "l"),
        ],
        env={},
    )
    assert result.exit_code == 1
    assert "disabled this session (fail-open)" in result.output


def test_proxy_command_in_its_own_process(
    llama_server: LlamaServerProcess, slot_dir: Path, tmp_path: Path
) -> None:
    """`python -m pion.llama.cli proxy` as a user runs it; Pi's baseUrl points at it."""
    log = tmp_path / "pc.log"
    port = free_port()
    env = {**os.environ, **env_for(llama_server, slot_dir, log)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pion.llama.cli", "proxy", "--port", str(port), "--verify", "probe"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/pion/status").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.1)
        resp = httpx.post(
            base + "/v1/chat/completions", json=pi_chat_body(max_tokens=2), timeout=60
        )
        assert resp.status_code == 200 and resp.json()["timings"]["cache_n"] > 1000
        status = httpx.get(base + "/pion/status").json()
        assert status["verify"] == "probe" and status["counts"] == {"cold": 1}
    finally:
        proc.terminate()
        proc.wait(10)
    lines = wait_log(log, "observed normal request")
    assert count(lines, "proxy listening on") == 1
    assert count(lines, "COLD — warmed") == 1
