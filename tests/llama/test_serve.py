"""`pion llama serve`: llama-server and the proxy as one command, as a user runs it (a
subprocess, the real llama-server): a request through it, llama-server killed, back on
the same port with the prefix restored from the slot dir, SIGINT stops both."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.proxy import STATUS_PATH
from pion.llama.serve import (
    LlamaServerNotFoundError,
    ServeOptions,
    find_llama_server,
    llama_server_args,
)
from support import chat

pytestmark = pytest.mark.llama

DEADLINE_S = 180.0


class Lines:
    """The command's stdout, read on a thread; :meth:`wait` for a line by pattern."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait(self, pattern: str, timeout: float = DEADLINE_S) -> re.Match[str]:
        regex = re.compile(pattern)
        for line in self.seen:
            if found := regex.search(line):
                return found
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if found := regex.search(line):
                return found
        raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.seen))


def status(url: str) -> dict[str, object]:
    data = httpx.get(url + STATUS_PATH, timeout=10).json()
    assert isinstance(data, dict)
    return data


def test_serve_restarts_llama_server_restores_and_stops_on_sigint(
    llama_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    slot_dir = tmp_path / "slots"
    args = [sys.executable, "-m", "pion", "llama", "serve", "-m", str(tiny_model)]
    args += ["--port", "0", "--llama-server", str(llama_bin), "--slot-dir", str(slot_dir)]
    args += ["--log", str(tmp_path / "prefix-cache.log"), "--ctx", "4096", "--", "-t", "1"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    try:
        lines = Lines(proc)
        first = lines.wait(r"llama-server (\d+) ready on (http://\S+)")
        pid, llama_url = int(first[1]), first[2]
        url = lines.wait(r"^base URL: (http://\S+)")[1]
        # The configuration it prints is the proxy's, for all three harnesses.
        lines.wait(r"wire_api = \"responses\"")
        assert any(f'"baseUrl": "{url}/v1"' in line for line in lines.seen)
        assert f"export ANTHROPIC_BASE_URL={url}" in lines.seen

        body = pi_chat_body("What first?", max_tokens=4, temperature=0)
        chat(url, body)
        assert status(url)["counts"] == {"cold": 1}
        assert list(slot_dir.glob("pi-prefix-*.bin"))

        os.kill(pid, signal.SIGKILL)
        back = lines.wait(r"llama-server (\d+) is back on (http://\S+) \(restart 1\)")
        assert int(back[1]) != pid and back[2] == llama_url
        new_pid = int(back[1])
        _, timings = chat(url, pi_chat_body("And then?", max_tokens=4, temperature=0))
        assert status(url)["counts"] == {"cold": 1, "restored": 1}
        # The restored prefix is what the request reused, not a cold prefill.
        assert timings.cache_n > timings.prompt_n

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        lines.wait(r"^stopped$")
        with pytest.raises(httpx.HTTPError):
            httpx.get(llama_url + "/health", timeout=2)
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + STATUS_PATH, timeout=2)
        assert not _alive(new_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_runs_several_llama_servers_behind_one_proxy(
    llama_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """``--servers 2``: two llama-servers, a port and a slot dir each, the proxy routing
    between them (two sessions, one per server); SIGINT stops all three."""
    slot_dir = tmp_path / "slots"
    args = [sys.executable, "-m", "pion", "llama", "serve", "-m", str(tiny_model)]
    args += ["--servers", "2", "--port", "0", "--llama-server", str(llama_bin)]
    args += ["--slot-dir", str(slot_dir), "--log", str(tmp_path / "prefix-cache.log")]
    args += ["--ctx", "4096", "--", "-t", "1"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    try:
        lines = Lines(proc)
        url = lines.wait(r"^base URL: (http://\S+)")[1]
        ready = [re.search(r"llama-server (\d+) ready on (http://\S+)", x) for x in lines.seen]
        servers = [(int(m[1]), m[2]) for m in ready if m]
        assert len(servers) == 2 and servers[0][1] != servers[1][1]
        for name in ("one", "two"):
            chat(url, pi_chat_body("What first?", variant=f"Session {name}.", max_tokens=4))
        fleet = status(url)["fleet"]
        assert isinstance(fleet, dict)
        assert [s["url"] for s in fleet["servers"]] == [u for _, u in servers]
        assert [s["routed"] for s in fleet["servers"]] == [{"cold": 1}, {"cold": 1}]
        for i in range(2):
            assert len(list((slot_dir / f"server-{i}").glob("pi-prefix-*.bin"))) == 1

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        lines.wait(r"^stopped$")
        assert not any(_alive(pid) for pid, _ in servers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_serve_refuses_flags_it_sets_and_a_bad_binary(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="--slot-save-path"):
        ServeOptions(model=model, llama_args=("--slot-save-path", "/tmp"))
    with pytest.raises(ValueError, match="slots"):
        ServeOptions(model=model, slots=0)
    with pytest.raises(ValueError, match="--servers"):
        ServeOptions(model=model, servers=0)
    with pytest.raises(ValueError, match="one per server"):
        ServeOptions(model=model, servers=2, devices=("CUDA0",))
    with pytest.raises(ValueError, match="pick one"):
        ServeOptions(model=model, devices=("CUDA0",), llama_args=("--device", "CUDA1"))
    with pytest.raises(LlamaServerNotFoundError, match="not an executable"):
        find_llama_server(tmp_path / "nope")
    run = subprocess.run(
        [sys.executable, "-m", "pion", "llama", "serve", "-m", str(model), "--", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2 and "--port" in run.stderr


def test_serve_command_line(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    options = ServeOptions(model=model, slots=3, slot_dir=tmp_path, context=1000)
    args = llama_server_args(Path("/bin/llama-server"), options, 5555)
    assert args[args.index("-np") + 1] == "3"
    assert args[args.index("-c") + 1] == "3000"  # per slot times slots
    assert args[args.index("--slot-save-path") + 1] == str(tmp_path)
    own_ctx = ServeOptions(model=model, slots=2, llama_args=("-c", "8192", "-t", "2"))
    args = llama_server_args(Path("/bin/llama-server"), own_ctx, 5555)
    assert args.count("-c") == 1 and args[-4:] == ["-c", "8192", "-t", "2"]
    assert own_ctx.slot_context() == 4096
    several = ServeOptions(model=model, servers=2, slot_dir=tmp_path, llama_port=9000)
    assert several.slot_dirs() == [tmp_path / "server-0", tmp_path / "server-1"]
    assert several.llama_ports() == [9000, 9001]
    args = llama_server_args(Path("/bin/llama-server"), several, 9001, several.slot_dirs()[1])
    assert args[args.index("--slot-save-path") + 1] == str(tmp_path / "server-1")
    assert "--device" not in args
    gpus = ServeOptions(model=model, servers=2, devices=("CUDA0", "CUDA1"))
    args = llama_server_args(Path("/bin/llama-server"), gpus, 9001, None, gpus.devices[1])
    assert args[args.index("--device") + 1] == "CUDA1"


def test_find_llama_server_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert find_llama_server() == fake
