"""`pion llama serve`: llama-server (or several) and the proxy in front, as one command.

Owns finding the llama-server binary (an explicit path, ``PATH``, the build cache of
``scripts/build-llama-server``, or building it with that script when this is a source
checkout), the :class:`LlamaSupervisor` that runs it with ``--slot-save-path`` and the
slots and starts it again when it dies, and :func:`run`, which puts the proxy
(:class:`~pion.llama.proxy.PrefixProxy`, persisting) in front, prints the base URL and
each harness's configuration (:mod:`pion.llama.agents`) and stops both on SIGINT or
SIGTERM. With ``--servers N``, N llama-servers of the same model (a port, a slot dir and a
supervisor each) behind one proxy, which routes among them (:mod:`pion.llama.fleet`).

After a restart the slots are empty; the next request of each prefix restores it from
the slot dir (the proxy's usual restore, verified by that request), so only the restore
is paid, not the cold prefill.

Does not own the proxy's behaviour nor the configuration texts.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx

from pion.llama.agents import AgentConfig, configuration_text
from pion.llama.config import WarmerConfig
from pion.llama.fleet import Fleet
from pion.llama.modelkind import ModelKind, classify_metadata, read_gguf_metadata
from pion.llama.paths import cache_dir, default_log_path
from pion.llama.proxy import PrefixProxy, running_proxy

__all__ = [
    "LlamaServerNotFoundError",
    "LlamaSupervisor",
    "ServeOptions",
    "find_llama_server",
    "llama_server_args",
    "run",
    "swa_full_reason",
]

# A llama-server that dies this soon after a (re)start, this many times in a row, is
# not coming back (a bad flag, a model it cannot load): stop instead of looping.
_CRASH_WINDOW_S = 10.0
_MAX_QUICK_CRASHES = 3
_HEALTH_TIMEOUT_S = 300.0  # loading a large model from a cold disk takes a while
_CTX_FLAGS = frozenset({"-c", "--ctx-size"})
_OWN_FLAGS = frozenset(
    {"-m", "--model", "--port", "--host", "-np", "--parallel", "--slot-save-path"}
)


class LlamaServerNotFoundError(RuntimeError):
    """No llama-server binary, and no build script to make one."""


def _build_script() -> Path | None:
    """``scripts/build-llama-server`` when running from a source checkout."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "build-llama-server"
    return script if script.is_file() and os.access(script, os.X_OK) else None


def _cached_binaries() -> list[Path]:
    """Binaries the build script left in the cache, newest build first."""
    found = cache_dir().glob("llama-b*/build/bin/llama-server")
    usable = [p for p in found if os.access(p, os.X_OK)]
    return sorted(usable, key=lambda p: p.stat().st_mtime, reverse=True)


def find_llama_server(
    explicit: Path | None = None, *, build: bool = True, echo: Callable[[str], None] = print
) -> Path:
    """The llama-server to run: ``explicit``, else ``llama-server`` on ``PATH``, else the
    build cache, else built now by the project's script (``build``: minutes, once)."""
    if explicit is not None:
        if not (explicit.is_file() and os.access(explicit, os.X_OK)):
            raise LlamaServerNotFoundError(f"{explicit} is not an executable file")
        return explicit
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    cached = _cached_binaries()
    if cached:
        return cached[0]
    script = _build_script()
    if script is None or not build:
        raise LlamaServerNotFoundError(
            "llama-server is not on PATH nor in the build cache "
            f"({cache_dir()}/llama-b*/build/bin); install llama.cpp or pass --llama-server"
        )
    echo(f"building llama-server with {script} (about 10 minutes, once)")
    proc = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LlamaServerNotFoundError(f"{script} failed (rc={proc.returncode}):\n{proc.stderr}")
    return Path(lines[-1])


@dataclass(frozen=True)
class ServeOptions:
    """What ``pion llama serve`` was asked for."""

    model: Path
    slots: int = 1
    servers: int = 1  # llama-servers behind the proxy
    host: str = "127.0.0.1"
    port: int = 8089
    llama_port: int = 0  # 0: a free port
    slot_dir: Path = field(default_factory=lambda: cache_dir() / "slots")
    log_path: Path = field(default_factory=default_log_path)
    context: int = 32768  # per slot, unless the llama-server flags set -c
    llama_args: tuple[str, ...] = ()
    # --swa-full for sliding-window models: None = when the GGUF says so, False = never.
    swa_full: bool | None = None
    # --devices: one llama-server ``--device`` per server (one GPU each); () = as set
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"--slots must be >= 1, got {self.slots}")
        if self.servers < 1:
            raise ValueError(f"--servers must be >= 1, got {self.servers}")
        if self.context < 1:
            raise ValueError(f"--ctx must be >= 1, got {self.context}")
        if self.devices and len(self.devices) != self.servers:
            raise ValueError(
                f"--devices names {len(self.devices)} device(s) for {self.servers} "
                "server(s): one per server"
            )
        if self.devices and "--device" in self.llama_args:
            raise ValueError("--device among the llama-server flags and --devices: pick one")
        own = sorted(_OWN_FLAGS.intersection(self.llama_args))
        if own:
            raise ValueError(
                f"llama-server flags {', '.join(own)} are set by pion llama serve "
                "(use -m, --slots, --slot-dir, --llama-port)"
            )

    def slot_dirs(self) -> list[Path]:
        """One slot dir per llama-server: ``slot_dir`` itself for one, ``server-<i>``
        under it for several (two servers must not share one: llama-server saves under a
        scratch name per slot)."""
        if self.servers == 1:
            return [self.slot_dir]
        return [self.slot_dir / f"server-{i}" for i in range(self.servers)]

    def llama_ports(self) -> list[int]:
        """One port per llama-server: from ``llama_port`` on, else free ones."""
        if self.llama_port:
            return [self.llama_port + i for i in range(self.servers)]
        return [_free_port() for _ in range(self.servers)]

    def slot_context(self) -> int:
        """Tokens per slot: ``-c`` of the llama-server flags divided by the slots, or
        ``context``."""
        args = self.llama_args
        for i, arg in enumerate(args[:-1]):
            if arg in _CTX_FLAGS and args[i + 1].isdigit() and int(args[i + 1]) > 0:
                return int(args[i + 1]) // self.slots
        return self.context


def swa_full_reason(options: ServeOptions) -> str | None:
    """Why llama-server gets ``--swa-full`` (None: it does not). A sliding-window model's
    slot files keep only the window without it, so a restore would reuse nothing; with
    it the K/V cache is kept for the whole context (more memory: the full context
    instead of the window, on the sliding layers)."""
    if options.swa_full is False or "--swa-full" in options.llama_args:
        return None
    if options.swa_full is True:
        return "--swa-full asked for"
    try:
        state = classify_metadata(read_gguf_metadata(options.model))
    except (OSError, ValueError):
        return None  # llama-server will say what is wrong with the file
    if state.kind is not ModelKind.SLIDING_WINDOW:
        return None
    return f"{state.arch} uses sliding-window attention ({state.sliding_window} tokens)"


def llama_server_args(
    binary: Path,
    options: ServeOptions,
    port: int,
    slot_dir: Path | None = None,
    device: str | None = None,
) -> list[str]:
    """The llama-server command line: the model, loopback, the slots, the slot dir
    (``slot_dir``, else ``options.slot_dir``), ``--device`` when one is given,
    ``--swa-full`` for a sliding-window model (:func:`swa_full_reason`) and, unless the
    extra flags set it, ``-c`` for ``context`` tokens per slot."""
    args = [
        str(binary),
        "-m", str(options.model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-np", str(options.slots),
        "--slot-save-path", str(slot_dir or options.slot_dir),
    ]  # fmt: skip
    if device is not None:
        args += ["--device", device]
    if not _CTX_FLAGS.intersection(options.llama_args):
        args += ["-c", str(options.context * options.slots)]
    if swa_full_reason(options) is not None:
        args.append("--swa-full")
    return args + list(options.llama_args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaSupervisor:
    """Runs llama-server as a child process and starts it again when it exits on its own.

    The port stays the same across restarts, so the proxy's upstream URL holds. Output
    goes to ``log_path`` (appended), which the error of a failed start quotes.
    """

    def __init__(
        self,
        args: Sequence[str],
        port: int,
        log_path: Path,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.args = list(args)
        self.port = port
        self.log_path = log_path
        self.echo = echo
        self.restarts = 0
        self.failed: str | None = None  # why supervision gave up
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        """Start llama-server, wait until healthy, then watch it on a thread."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="llama-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us, and we stop it in order
            )
        self._wait_healthy(self._proc)

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _HEALTH_TIMEOUT_S
        while time.monotonic() < deadline and not self._stopping.is_set():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {proc.returncode}; its log {self.log_path}:\n"
                    + self._tail()
                )
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        if not self._stopping.is_set():
            raise RuntimeError(f"llama-server not healthy after {_HEALTH_TIMEOUT_S:.0f} s")

    def _tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _watch(self) -> None:
        quick_crashes = 0
        started = time.monotonic()
        while not self._stopping.wait(0.2):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            if self._stopping.is_set():
                return
            lived = time.monotonic() - started
            quick_crashes = quick_crashes + 1 if lived < _CRASH_WINDOW_S else 0
            if quick_crashes >= _MAX_QUICK_CRASHES:
                self.failed = (
                    f"llama-server exited with {proc.returncode} {quick_crashes} times within "
                    f"{_CRASH_WINDOW_S:.0f} s of starting; not restarting it (log {self.log_path})"
                )
                self.echo(self.failed)
                return
            self.echo(f"llama-server exited with {proc.returncode}; restarting it")
            started = time.monotonic()
            try:
                self._spawn()
            except RuntimeError as exc:
                self.echo(f"restart failed: {exc}")
                continue
            self.restarts += 1
            self.echo(
                f"llama-server {self.pid} is back on {self.url} (restart {self.restarts}); "
                "prefixes are restored from the slot dir at their next request"
            )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop watching, then terminate (and if need be kill) llama-server."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def run(
    options: ServeOptions,
    binary: Path,
    echo: Callable[[str], None] = print,
) -> int:
    """Run the llama-server(s) and the proxy until SIGINT/SIGTERM (or a llama-server
    gives up); print the base URL and the harness configurations. The exit status."""
    dirs = options.slot_dirs()
    supervisors = []
    devices: Sequence[str | None] = options.devices or [None] * options.servers
    for port, slot_dir, device in zip(options.llama_ports(), dirs, devices, strict=True):
        slot_dir.mkdir(parents=True, exist_ok=True)
        log = options.slot_dir.parent / f"llama-server-{port}.log"
        args = llama_server_args(binary, options, port, slot_dir, device)
        supervisors.append(LlamaSupervisor(args, port, log, echo))
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if (why := swa_full_reason(options)) is not None:
            echo(f"--swa-full: {why}; slot files keep the whole cache (more memory)")
        for supervisor in supervisors:
            echo(f"starting {binary} on {supervisor.url} (log {supervisor.log_path})")
            supervisor.start()
            echo(f"llama-server {supervisor.pid} ready on {supervisor.url}")
        with running_proxy(_proxy(options, supervisors), options.host, options.port) as url:
            context = options.slot_context()
            agent = AgentConfig(url, context=context, max_tokens=_answer_cap(context))
            upstreams = ", ".join(s.url for s in supervisors)
            echo(f"pion llama proxy on {url} → {upstreams} (log {options.log_path})")
            echo(f"base URL: {url}\n")
            echo(configuration_text(agent))
            echo("Ctrl-C stops the proxy and llama-server.")
            sys.stdout.flush()
            while not stop.wait(0.2):
                if any(s.failed for s in supervisors):
                    return 1
        return 0
    finally:
        for supervisor in supervisors:
            supervisor.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        echo("stopped")


def _proxy(options: ServeOptions, supervisors: Sequence[LlamaSupervisor]) -> PrefixProxy:
    """The persisting proxy in front of the supervised llama-server(s)."""
    config = WarmerConfig(
        base_url=supervisors[0].url,
        persist=True,
        slot_dir=options.slot_dirs()[0],
        slots=tuple(range(options.slots)) if options.slots > 1 else (),
        log_path=options.log_path,
    )
    if len(supervisors) == 1:
        return PrefixProxy(config)
    urls = [s.url for s in supervisors]
    return PrefixProxy(config, fleet=Fleet.from_config(config, urls, options.slot_dirs()))


def _answer_cap(context: int) -> int:
    """The largest answer to announce: a quarter of the context, at most 8192 tokens."""
    return max(1, min(8192, context // 4))
