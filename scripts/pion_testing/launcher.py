"""Start and stop a real llama-server process (tests, benchmark, local experiments).

Owns :class:`LlamaServerProcess`: picks a free port, starts the binary with the flags the
warmer needs (``-np``, ``--slot-save-path``, a small ``-c``), waits for ``/health`` and
stops the process (terminate, then kill). The server's output goes to a log file that error
messages quote, so a failed start explains itself.

Does not own building the binary (:func:`pion_testing.paths.ensure_llama_server`).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["LlamaServerProcess", "free_port"]


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServerProcess:
    """A llama-server child process on 127.0.0.1."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        slot_dir: Path | None = None,
        port: int | None = None,
        ctx: int = 4096,
        parallel: int = 1,
        threads: int | None = None,
        threads_batch: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.binary = binary
        self.model = model
        self.slot_dir = slot_dir
        self.port = port or free_port()
        self.ctx = ctx
        self.parallel = parallel
        self.threads = threads
        self.threads_batch = threads_batch
        self.extra_args = list(extra_args)
        self.log_path = log_path or model.with_name(f"llama-server-{self.port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        args = [
            str(self.binary),
            "-m", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-np", str(self.parallel),
            "-c", str(self.ctx),
        ]  # fmt: skip
        if self.slot_dir is not None:
            args += ["--slot-save-path", str(self.slot_dir)]
        if self.threads is not None:
            args += ["-t", str(self.threads)]
        if self.threads_batch is not None:
            # Prefill threads; without polling, idle ones sleep instead of spinning, so
            # they cost nothing between requests on a shared machine.
            args += ["-tb", str(self.threads_batch), "--poll", "0"]
        return args + self.extra_args

    def start(self, timeout: float = 120.0) -> LlamaServerProcess:
        """Start the process and wait until ``/health`` answers 200."""
        if self.slot_dir is not None:
            self.slot_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.proc.returncode}:\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"llama-server not healthy after {timeout:.0f}s:\n{self.tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate (then kill) the process; a no-op when it is not running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def restart(self, timeout: float = 120.0) -> LlamaServerProcess:
        """Stop and start again on the same port (all in-memory K/V is gone)."""
        self.stop()
        return self.start(timeout)

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
