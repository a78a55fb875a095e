"""Shared benchmark plumbing: start the servers under test, read their memory, time
things, print a table and write ``bench/results/<name>.json``.

Every figure a benchmark reports is a ratio against a baseline measured in the same
run on the same machine (README.md, "Benchmarks"), so the helpers here start both sides.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

# Where results go: bench/results, or $PION_BENCH_RESULTS (the quick run in `make test`
# writes there, so a smoke run never overwrites the committed full-size results).
RESULTS = Path(os.environ.get("PION_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
# Development scaffolding (a real llama-server, tiny GGUF models) is not installed with
# the package; it lives in scripts/pion_testing (with the sample requests).
_SCRIPTS = str(Path(__file__).resolve().parents[1] / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
_READY = re.compile(rb"pion-server ready port=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """A server subprocess we started; stopped (and its temp dir removed) by ``stop``."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, workdir: str) -> None:
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.ps = psutil.Process(proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def peak_rss(self) -> int:
        """The kernel's high-water mark of resident memory (VmHWM), else current RSS."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return self.rss()
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        return int(m.group(1)) * 1024 if m else self.rss()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def cpu_seconds(server: Process) -> float:
    """The CPU time (user + system) ``server`` has used so far."""
    times = server.ps.cpu_times()
    return float(times.user + times.system)


def start_pion(*flags: str) -> Process:
    """`pion-server` on a free port with data in a temp dir."""
    workdir = tempfile.mkdtemp(prefix="pion-bench-")
    cmd = [sys.executable, "-m", "pion", "server", "--port", "0", "--dir", workdir, *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = _READY.search(line)
        if m:
            return Process(proc, int(m.group(1)), workdir)
    proc.kill()
    raise RuntimeError("pion-server did not report ready")


def start_redis(binary: str = "redis-server") -> Process:
    """A throwaway redis-server: no persistence, on a free port."""
    path = shutil.which(binary) or "/usr/bin/redis-server"
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="redis-bench-")
    cmd = [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    cmd += ["--dir", workdir, "--protected-mode", "no", "--loglevel", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return Process(proc, port, workdir)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{path} did not start")


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if n else c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _redis_server_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "not installed"
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, text=True, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"v=(\S+)", out.stdout)
    return m.group(1) if m else out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def environment() -> dict[str, str]:
    """What the report's environment table shows for a result: recorded where it was
    measured, so the report never describes the machine that renders it."""
    return {
        "cpu": _cpu_model(),
        "memory": _memory_gib(),
        "pion": _version("pion"),
        "redis-server": _redis_server_version(),
        "libraries": ", ".join(
            f"{p} {_version(p)}"
            for p in ("numpy", "redis", "hiredis", "uvloop", "pion-vllm-mlx", "matplotlib")
        ),
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "environment": environment(),
        **payload,
    }
    # Every script takes --quick for smoke sizes; the report marks such results.
    payload.setdefault("quick", "--quick" in sys.argv)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
