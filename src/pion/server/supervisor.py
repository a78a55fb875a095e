"""The supervisor of ``pion-server -w N --independent-workers`` (docs/deployment.md,
"Workers").

It owns what the workers share and nothing they serve:

- the main port, reserved by a bound ``SO_REUSEPORT`` socket that never listens (so
  ``--port 0`` resolves to one port that every worker then binds and listens on);
- the directory's shared memory (:class:`~pion.server.directory.DirectoryTable`),
  whose descriptor every worker inherits;
- the workers: ``python -m pion.server.worker``, each given its id, the port and the
  directory on its stdin (:mod:`pion.server.control`);
- the metrics endpoint under ``-w N``: a scrape asks every worker for its families
  over its control pipe and merges them (:func:`pion.server.metrics.merge`).

Start-up: every worker binds its affinity port and its main-port socket and reports
LISTENING; then all are told to serve the main port (connections arriving while a
worker recovers get ``-LOADING``, as on a single-process server); once every worker
reports READY the supervisor prints ``pion-server ready port=P workers=N``. A worker
that dies before that fails the start (exit 1).

Afterwards a worker that dies (a crash, ``kill -9``) is started again after a short
back-off: it replays its own WAL, rejoins the directory, and only then is told to
serve the main port again; the other workers never stop. A worker that exits 0 did
so because a client sent ``SHUTDOWN``: the whole server shuts down. SIGTERM or SIGINT
to the supervisor shut every worker down gracefully (each flushes and fsyncs its WAL)
and then the supervisor exits. If the supervisor itself is killed, each worker gets
SIGTERM from the kernel (``PR_SET_PDEATHSIG``) or sees end of file on its stdin, so no
worker is left holding the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from pion.config import ServerConfig
from pion.errors import PionError
from pion.server import control
from pion.server.directory import DirectoryTable, slots_for
from pion.server.metrics import SCRAPE_TIMEOUT_S, merge
from pion.server.run import check_bind_safety
from pion.server.scrapes import MetricsEndpoint
from pion.server.tls import server_context
from pion.wire import affinity_port

__all__ = ["Supervisor", "reserve_port", "supervise"]

log = logging.getLogger("pion.supervisor")

# A crashed worker is restarted after a delay that doubles while it keeps crashing
# soon after starting (from RESTART_DELAY_S up to RESTART_MAX_DELAY_S); a worker that
# stayed up RESTART_STABLE_S starts the count again.
RESTART_DELAY_S = 0.25
RESTART_MAX_DELAY_S = 10.0
RESTART_STABLE_S = 30.0
# A worker that has not bound its ports by then is broken (recovery comes after).
LISTEN_TIMEOUT_S = 60.0
# Graceful shutdown of a worker: past this, it is killed.
STOP_TIMEOUT_S = 30.0
# Tries at finding a main port whose affinity ports are free too (--port 0).
_PORT_ATTEMPTS = 50


def _port_free(host: str, port: int) -> bool:
    if port > 65535:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _served_by_another(host: str, port: int) -> bool:
    """Whether something already accepts on ``port``: with SO_REUSEPORT a second
    server of the same user could bind it too and split its connections with us."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    try:
        with socket.create_connection((target, port), timeout=1.0):
            return True
    except OSError:
        return False


def reserve_port(config: ServerConfig, workers: int) -> socket.socket:
    """The main port's reservation (bound, never listening). With ``--port 0`` a port
    is chosen whose affinity ports ``port + 2 + i`` are free as well."""
    for _ in range(_PORT_ATTEMPTS if config.port == 0 else 1):
        try:
            sock = control.bind_shared(config.bind, config.port)
        except OSError as exc:
            raise PionError(
                f"cannot bind {config.bind}:{config.port} ({exc.strerror or exc})"
            ) from None
        port = sock.getsockname()[1]
        if config.port != 0 and _served_by_another(config.bind, port):
            sock.close()
            raise PionError(f"port {port} is already served by another process")
        busy = [
            affinity_port(port, i)
            for i in range(workers)
            if not _port_free(config.bind, affinity_port(port, i))
        ]
        if not busy:
            return sock
        sock.close()
        if config.port != 0:
            raise PionError(
                f"affinity port {busy[0]} (port + 2 + worker id) is in use; "
                "choose a --port whose next ports are free"
            )
    raise PionError("no free port whose affinity ports are free too")


@dataclasses.dataclass
class _Slot:
    """One worker id and the process currently running it."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    listening: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    restarts: int = 0
    started: float = 0.0
    delay: float = RESTART_DELAY_S
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    pending: asyncio.Future[list[Metric]] | None = None
    reader: asyncio.StreamReader | None = None
    shutdown_requested: bool = False  # it reported a SHUTDOWN command

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    """Runs ``config.workers`` workers until a signal or a SHUTDOWN; see the module
    docstring. ``on_ready(port, metrics_port)`` runs once every worker is ready
    (default: print the ready lines)."""

    def __init__(
        self,
        config: ServerConfig,
        on_ready: Callable[[int, int | None], None] | None = None,
    ) -> None:
        self.config = config
        self.workers = config.workers
        self.slots = [_Slot(i) for i in range(self.workers)]
        self.port = 0
        self.metrics_port: int | None = None
        self._on_ready = on_ready or _print_ready
        self._table: DirectoryTable | None = None
        self._stop = asyncio.Event()
        self._failed: str | None = None
        self._started = False  # every worker was READY once: crashes are restarted
        self._serving = False  # the main port was opened to the workers
        self._stopping = False
        self._exit_code = 0

    # -- running --------------------------------------------------------------------

    async def run(self) -> int:
        """Start, supervise until stopped, stop; the exit code."""
        check_bind_safety(self.config)
        server_context(self.config)  # a bad certificate stops us before any fork
        reservation = reserve_port(self.config, self.workers)
        self.port = reservation.getsockname()[1]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self._table = DirectoryTable.create(
            slots_for(self.workers, self.config.vstore_max_sessions)
        )
        endpoint = None
        watchers: list[asyncio.Task[None]] = []
        try:
            if self.config.metrics_port is not None:
                endpoint = MetricsEndpoint(self.config, self.scrape)
                self.metrics_port = endpoint.port
            table = self._table
            watchers = [asyncio.ensure_future(self._watch(slot, table)) for slot in self.slots]
            if await self._start_up():
                self._started = True
                self._on_ready(self.port, self.metrics_port)
                log.info(
                    "pion-server ready on %s:%d with %d workers",
                    self.config.bind,
                    self.port,
                    self.workers,
                )
                await self._stop.wait()
        finally:
            await self._stop_workers(watchers)
            if endpoint is not None:
                endpoint.close()
            self._table.close()
            reservation.close()
        if self._failed is not None:
            log.critical("%s", self._failed)
            return 1
        return self._exit_code

    async def _start_up(self) -> bool:
        """Every worker listening, then serving, then ready; False if one failed."""
        if not await self._until(lambda s: s.listening.is_set(), LISTEN_TIMEOUT_S):
            return False
        self._serving = True
        for slot in self.slots:
            self._send(slot, control.SERVE)
        return await self._until(lambda s: s.ready.is_set(), None)

    async def _until(self, done: Callable[[_Slot], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(done(s) for s in self.slots):
            if self._failed is not None or self._stop.is_set():
                return False
            if deadline is not None and time.monotonic() > deadline:
                self._failed = "workers did not start listening in time"
                return False
            await asyncio.sleep(0.02)
        return True

    # -- one worker -----------------------------------------------------------------

    async def _watch(self, slot: _Slot, table: DirectoryTable) -> None:
        """Run worker ``slot.index``; restart it whenever it dies, until stopped. A
        bug here must not leave the worker unsupervised: it stops the server."""
        try:
            await self._supervise(slot, table)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("supervising worker %d failed", slot.index)
            self._failed = f"supervising worker {slot.index} failed: {exc!r}"
            self._stop.set()

    async def _supervise(self, slot: _Slot, table: DirectoryTable) -> None:
        while not self._stopping:
            try:
                await self._spawn(slot, table)
            except OSError as exc:
                self._failed = f"cannot start worker {slot.index}: {exc}"
                self._stop.set()
                return
            await self._read(slot)
            proc = slot.proc
            code = await proc.wait() if proc is not None else 1
            slot.listening.clear()
            slot.ready.clear()
            if slot.pending is not None and not slot.pending.done():
                slot.pending.cancel()
            if self._stopping:
                return
            if code == 0 and slot.shutdown_requested:
                log.info("worker %d shut down (SHUTDOWN): stopping the server", slot.index)
                self._stop.set()
                return
            if not self._started:
                self._failed = f"worker {slot.index} exited with {_describe(code)} during start-up"
                self._stop.set()
                return
            lived = time.monotonic() - slot.started
            slot.delay = (
                RESTART_DELAY_S
                if lived >= RESTART_STABLE_S
                else min(RESTART_MAX_DELAY_S, slot.delay * 2)
            )
            slot.restarts += 1
            log.error(
                "worker %d exited with %s; restarting in %.2fs",
                slot.index,
                _describe(code),
                slot.delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), slot.delay)

    async def _spawn(self, slot: _Slot, table: DirectoryTable) -> None:
        read_fd, write_fd = os.pipe()
        slot.shutdown_requested = False
        try:
            spec = control.WorkerSpec(
                config=dataclasses.replace(self.config, worker_id=slot.index, port=self.port),
                directory_fd=table.fileno(),
                control_fd=write_fd,
                supervisor_pid=os.getpid(),
                metrics=self.config.metrics_port is not None,
            )
            slot.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pion.server.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=sys.stderr.fileno(),
                pass_fds=(table.fileno(), write_fd),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        slot.started = time.monotonic()
        slot.reader = await _pipe_reader(read_fd)
        stdin = slot.proc.stdin
        if stdin is not None:
            stdin.write(control.encode_spec(spec))
            with contextlib.suppress(ConnectionError):
                await stdin.drain()

    async def _read(self, slot: _Slot) -> None:
        """The worker's messages until its control pipe closes (it exited)."""
        reader = slot.reader
        while reader is not None:
            try:
                head = await reader.readexactly(control.FRAME.size)
                length, kind = control.FRAME.unpack(head)
                if length > control.MAX_FRAME:
                    log.error("worker %d sent a %d-byte frame; killing it", slot.index, length)
                    if slot.alive() and slot.proc is not None:
                        slot.proc.kill()
                    return
                payload = await reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if kind == control.LISTENING:
                slot.listening.set()
            elif kind == control.READY:
                slot.ready.set()
                if self._serving:
                    self._send(slot, control.SERVE)
                if self._started:
                    log.info("worker %d is back (restart %d)", slot.index, slot.restarts)
            elif kind == control.SHUTDOWN:
                slot.shutdown_requested = True
            elif kind == control.METRICS and slot.pending is not None and not slot.pending.done():
                slot.pending.set_result(pickle.loads(payload))

    def _send(self, slot: _Slot, message: bytes) -> None:
        proc = slot.proc
        if proc is not None and proc.stdin is not None and slot.alive():
            with contextlib.suppress(ConnectionError, RuntimeError):
                proc.stdin.write(message)

    async def _stop_workers(self, watchers: Iterable[asyncio.Task[None]]) -> None:
        self._stopping = True
        live = [s for s in self.slots if s.alive()]
        for slot in live:
            if slot.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGTERM)
        for slot in live:
            if slot.proc is None:
                continue
            try:
                await asyncio.wait_for(slot.proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.error("worker %d did not stop in %.0fs; killing it", slot.index, STOP_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.kill()
                await slot.proc.wait()
            if slot.proc.returncode not in (0, -signal.SIGTERM):
                self._exit_code = self._exit_code or 1
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- metrics --------------------------------------------------------------------

    async def scrape(self) -> list[Metric]:
        """Every worker's families merged, plus the supervisor's own."""
        slots = self.slots
        groups = await asyncio.gather(*(self._scrape_one(s) for s in slots))
        families = merge(g for g in groups if g is not None)
        up = GaugeMetricFamily(
            "pion_worker_up", "1 when the worker answered this scrape", labels=["worker"]
        )
        restarts = CounterMetricFamily(
            "pion_worker_restarts", "Times the worker was restarted", labels=["worker"]
        )
        for slot, group in zip(slots, groups, strict=True):
            up.add_metric([str(slot.index)], int(group is not None))
            restarts.add_metric([str(slot.index)], slot.restarts)
        workers = GaugeMetricFamily("pion_workers", "Configured worker processes", self.workers)
        entries = self._table.live_count() if self._table is not None else 0
        directory = GaugeMetricFamily(
            "pion_directory_entries", "Namespaces in the cross-worker directory", entries
        )
        return [*families, up, restarts, workers, directory]

    async def _scrape_one(self, slot: _Slot) -> list[Metric] | None:
        if not slot.ready.is_set():
            return None
        async with slot.lock:
            future: asyncio.Future[list[Metric]] = asyncio.get_running_loop().create_future()
            slot.pending = future
            self._send(slot, control.REQUEST_METRICS)
            try:
                return await asyncio.wait_for(future, SCRAPE_TIMEOUT_S)
            except (TimeoutError, asyncio.CancelledError):
                return None
            finally:
                slot.pending = None


async def _pipe_reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=control.MAX_FRAME)
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _print_ready(port: int, metrics_port: int | None) -> None:
    # Machine-readable lines for scripts and tests that start us on port 0.
    if metrics_port is not None:
        print(f"pion-server metrics port={metrics_port}", flush=True)
    print(f"pion-server ready port={port}", flush=True)


def supervise(config: ServerConfig) -> int:
    """Run a multi-worker server in the foreground; the process exit code."""
    return asyncio.run(Supervisor(config).run())
